//! The command line (clap): which groups run, the large shape and its token counts, timing;
//! and the small shapes the column and row checks share.

use clap::Parser;

/// What the command line asks for.
pub struct Args {
    pub column: bool,
    pub row: bool,
    pub mlp: bool,
    pub gemm: bool,
    pub norm: bool,
    pub backward: bool,
    pub breakdown: bool,
    pub hidden: usize,
    pub ffn: usize,
    pub shape_name: String,
    pub ms: Vec<usize>,
    pub iters: usize,
    pub timing: bool,
    pub verbose: bool,
    pub rounds: Option<usize>,
    pub group: Option<usize>,
}

/// A group of checks that `--test` names.
#[derive(Clone, Copy)]
enum Test {
    All,
    Column,
    Row,
    Mlp,
    Gemm,
    Norm,
    Backward,
    Breakdown,
}

/// One `--test` value: the groups it names, in order.
#[derive(Clone)]
struct Tests(Vec<Test>);

fn tests(v: &str) -> Result<Tests, String> {
    v.split(',')
        .map(|t| match t {
            "all" => Ok(Test::All),
            "column" => Ok(Test::Column),
            "row" => Ok(Test::Row),
            "mlp" => Ok(Test::Mlp),
            "gemm" => Ok(Test::Gemm),
            "norm" => Ok(Test::Norm),
            "backward" => Ok(Test::Backward),
            "breakdown" => Ok(Test::Breakdown),
            _ => Err(format!(
                "unknown test {t:?}: all, column, row, mlp, gemm, norm, backward or breakdown"
            )),
        })
        .collect::<Result<_, _>>()
        .map(Tests)
}

/// The large shape: `--shape` as given, and its sizes.
#[derive(Clone)]
struct Shape {
    name: String,
    hidden: usize,
    ffn: usize,
}

fn shape(v: &str) -> Result<Shape, String> {
    let (hidden, ffn) = match v {
        "8b" => (4096, 14336),
        "70b" => (8192, 28672),
        _ => {
            let parts: Vec<_> = v.split(',').map(|s| s.trim().parse::<usize>()).collect();
            match parts.as_slice() {
                [Ok(h), Ok(f)] if *h > 0 && *f > 0 => (*h, *f),
                _ => return Err("8b, 70b or HIDDEN,FFN (two positive sizes)".into()),
            }
        }
    };
    Ok(Shape {
        name: v.into(),
        hidden,
        ffn,
    })
}

/// `--m`'s token counts.
#[derive(Clone)]
struct TokenCounts(Vec<usize>);

fn token_counts(v: &str) -> Result<TokenCounts, String> {
    let ms = v
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| "a list of token counts, with commas".to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ms.is_empty() || ms.contains(&0) {
        return Err("token counts are positive".into());
    }
    Ok(TokenCounts(ms))
}

/// GPU checks of the tensor-parallel layers (nvshmem::tp), then a short timing table; run one
/// PE per GPU (scripts/nvshmrun -np 2 target/release/tp_mlp --test all). PE 0 prints
/// `N passed, M failed`; the exit status is non-zero if anything failed.
#[derive(Parser)]
// A repeated option takes its last value (a repeated --test: see `resolve`).
#[command(name = "tp_mlp", args_override_self = true)]
struct Cli {
    /// The groups to run: all, column, row, mlp, gemm, norm, backward, breakdown (timing only, not in all); several with commas; all by default
    #[arg(long, value_name = "LIST", value_parser = tests)]
    test: Vec<Tests>,
    /// The large shape, checked against the unsharded product on one GPU and timed: 8b, 70b or HIDDEN,FFN
    #[arg(long, value_name = "SHAPE", default_value = "8b", value_parser = shape)]
    shape: Shape,
    /// The large shape's token counts, with commas
    #[arg(long, value_name = "LIST", default_value = "1,16,128,512", value_parser = token_counts)]
    m: TokenCounts,
    /// Timed graph replays per row (at least 5)
    #[arg(long, value_name = "N", default_value_t = 50)]
    iters: usize,
    /// Every fused exchange in N rounds (fused_exchange_gemms N × the PE count, fused_mlp_rounds 0)
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Tensor-parallel groups of N PEs (the rows of a 2-D split of the world), all running
    /// the checks at once, each on data of its own; every PE by default
    #[arg(long, value_name = "N")]
    group: Option<usize>,
    /// Checks only, no timing tables
    #[arg(long)]
    no_timing: bool,
    /// Name each check that passes (PE 0)
    #[arg(long)]
    verbose: bool,
}

/// The command line; clap prints the help, or the error and exits non-zero.
pub fn parse() -> Args {
    resolve(Cli::parse())
}

/// `cli` as the checks read it.
fn resolve(cli: Cli) -> Args {
    let mut a = Args {
        column: true,
        row: true,
        mlp: true,
        gemm: true,
        norm: true,
        backward: true,
        breakdown: false,
        hidden: cli.shape.hidden,
        ffn: cli.shape.ffn,
        shape_name: cli.shape.name,
        ms: cli.m.0,
        iters: cli.iters.max(5),
        timing: !cli.no_timing,
        verbose: cli.verbose,
        rounds: cli.rounds,
        group: cli.group,
    };
    // Each --test names the layer groups afresh; breakdown, once named, stays.
    for Tests(list) in cli.test {
        (a.column, a.row, a.mlp, a.gemm, a.norm) = (false, false, false, false, false);
        a.backward = false;
        for t in list {
            match t {
                Test::All => {
                    (a.column, a.row, a.mlp, a.gemm, a.norm) = (true, true, true, true, true);
                    a.backward = true;
                }
                Test::Column => a.column = true,
                Test::Row => a.row = true,
                Test::Mlp => a.mlp = true,
                Test::Gemm => a.gemm = true,
                Test::Norm => a.norm = true,
                Test::Backward => a.backward = true,
                Test::Breakdown => a.breakdown = true,
            }
        }
    }
    a
}

/// (m, k, n): odd token counts, features that are not multiples of 128 (nor of 8, where
/// cuBLASLt takes 2-byte aligned rows), every PE holding at least one feature.
pub fn small(n: usize) -> [(usize, usize, usize); 4] {
    [
        (1, 64, 96),
        (3, 200, 328),
        (127, 136, 40 * n),
        (16, 129, 8 * n + 3),
    ]
}
