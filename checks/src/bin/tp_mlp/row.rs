//! The row-parallel layer's checks: all-reduce and reduce-scatter outputs, and their fused
//! forms.

use nvshmem::tp::{
    take_cols, GemmPath, LinearShape, RowOutput, RowParallelLinear, Schedule, TensorParallel,
    DECODE_MAX_TOKENS, FUSED_DECODE_MAX_TOKENS, FUSED_EXCHANGE_TOKENS,
};
use nvshmem::{bf16, DeviceBuffer, Error, SymmetricBuffer};

use crate::args::small;
use crate::fused_exchange::{fused_exchange, FusedIo};
use crate::harness::{sync, text, Checks, Outcome, SCHEDULES};
use crate::reference::{bits, compare_row, row_parallel, weight, Rng};

/// Two row-parallel layers built alike (`m` tokens at most, `k → n` features, `output`),
/// their full weight, and three random inputs with this PE's columns of each on the device.
struct RowCase {
    w: Vec<bf16>,
    layers: [RowParallelLinear; 2],
    inputs: Vec<Vec<bf16>>,
    xs: Vec<DeviceBuffer<bf16>>,
}

fn row_case(
    c: &Checks,
    tp: &TensorParallel,
    seed: u64,
    (m, k, n): (usize, usize, usize),
    output: RowOutput,
) -> Result<RowCase, String> {
    let mut rng = Rng::new(seed);
    let w = weight(&mut rng, n, k);
    let build = || -> Result<RowParallelLinear, String> {
        let layer = RowParallelLinear::with_output(tp, k, n, output, m).map_err(text)?;
        layer.load_weight(&w).map_err(text)?;
        Ok(layer)
    };
    let layers = [build()?, build()?];
    let inputs: Vec<Vec<bf16>> = (0..3).map(|_| rng.bf16s(m * k, 1.0)).collect();
    let local = layers[0].local_in_features();
    let xs = inputs
        .iter()
        .map(|x| c.device(&take_cols(x, k, local.clone())))
        .collect::<Result<_, _>>()?;
    Ok(RowCase {
        w,
        layers,
        inputs,
        xs,
    })
}

/// What [`row_exchange`] checks each output with: the input, the output, the spare slot.
type RowCheck<'a> = &'a dyn Fn(usize, &[bf16], &SymmetricBuffer<bf16>) -> Outcome;

/// [`fused_exchange`] of a [`RowCase`] (`k` input features), outputs of `len` elements
/// (ten: the exchange's nine and a spare, slot 9, for `check`).
fn row_exchange(c: &Checks, case: &RowCase, k: usize, len: usize, check: RowCheck) -> Outcome {
    let ys: Vec<_> = (0..10)
        .map(|_| c.shmem.malloc::<bf16>(len).map_err(text))
        .collect::<Result<_, _>>()?;
    let local = case.layers[0].local_in_features();
    let (xs, s) = (&case.xs, &c.stream);
    fused_exchange(
        c,
        &FusedIo {
            call: &|l, i, o, schedule| case.layers[l].forward_with(&ys[o], &xs[i], schedule, s),
            read: &|o| ys[o].to_vec().map_err(text),
            poison: &|o| ys[o].copy_from_host(&vec![bf16::NAN; len]).map_err(text),
            reload: &|i| {
                xs[0]
                    .copy_from_host(&take_cols(&case.inputs[i], k, local.clone()))
                    .map_err(text)
            },
            check: &|i, got| check(i, got, &ys[9]),
        },
    )
}

/// `spare` holds what layer 0 of `case` gives input `i` in the sequential schedule, and it
/// must be `got`, bit for bit. Where the call fused, the sequential schedule takes the decode
/// GEMM (the fused kernel's own; `Auto` may have measured cuBLASLt faster); where it did not,
/// `got` came from the sequential schedule already, whose GEMM `Auto` chose, and must come
/// again.
fn same_as_sequential(
    c: &Checks,
    case: &RowCase,
    i: usize,
    got: &[bf16],
    spare: &SymmetricBuffer<bf16>,
) -> Outcome {
    let layer = &case.layers[0];
    let shape = LinearShape {
        m: case.inputs[i].len() / layer.in_features(),
        n: layer.out_features(),
        k: layer.local_in_features().len(),
    };
    if layer.resolved_schedule(Schedule::Fused, shape.m) == Schedule::Fused {
        c.tp.gemm()
            .set_auto_path(shape, GemmPath::Decode)
            .map_err(text)?;
    }
    case.layers[0]
        .forward_with(spare, &case.xs[i], Schedule::Sequential, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    if bits(&spare.to_vec().map_err(text)?) != bits(got) {
        return Err(format!(
            "the fused and sequential schedules differ (Auto's GEMM at m={} n={} k={}: {:?})",
            shape.m,
            shape.n,
            shape.k,
            c.tp.gemm().auto_path(shape)
        ));
    }
    Ok(())
}

/// The checks' layers, with the fused exchanges in `rounds` rounds where given.
fn with_rounds(c: &Checks, rounds: Option<usize>) -> TensorParallel {
    match rounds {
        Some(r) => {
            let mut t = *c.tp.thresholds();
            (t.fused_exchange_gemms, t.fused_mlp_rounds) = (r * c.n(), 0);
            c.tp.clone().with_thresholds(t)
        }
        None => c.tp.clone(),
    }
}

/// The fused forms of the row-parallel layer ([`Schedule::Fused`]: the decode kernel, and
/// from 512 tokens per PE the GEMM + all-reduce, in `rounds` rounds where given), through
/// [`fused_exchange`] (whose all-reduces between calls share the fused kernel's epoch and
/// lines); each output also the same on every PE, and up to `DECODE_MAX_TOKENS` tokens bit for
/// bit what the sequential schedule gives (the same decode GEMM, the same order of the sum
/// over PEs).
fn row_fused(
    c: &Checks,
    seed: u64,
    (m, k, n): (usize, usize, usize),
    rounds: Option<usize>,
) -> Outcome {
    let case = row_case(
        c,
        &with_rounds(c, rounds),
        seed,
        (m, k, n),
        RowOutput::Replicated,
    )?;
    // The fused forms where they take the call, the sequential schedule elsewhere.
    let fuses = (m <= FUSED_DECODE_MAX_TOKENS && n % 4 == 0)
        || (c.n() > 1 && m % c.n() == 0 && m / c.n() >= FUSED_EXCHANGE_TOKENS);
    let want_schedule = if fuses {
        Schedule::Fused
    } else {
        Schedule::Sequential
    };
    let resolved = case.layers[0].resolved_schedule(Schedule::Fused, m);
    if resolved != want_schedule {
        return Err(format!(
            "Fused at m={m} n={n} runs {resolved:?}, not {want_schedule:?}"
        ));
    }
    row_exchange(c, &case, k, m * n, &|i, got, spare| {
        let (want, terms) = row_parallel(&case.inputs[i], &case.w, m, n, k, c.n());
        compare_row("fused row-parallel output", got, (&want, &terms))?;
        c.identical("fused row-parallel output", got)?;
        match m <= DECODE_MAX_TOKENS {
            true => same_as_sequential(c, &case, i, got, spare),
            false => Ok(()),
        }
    })
}

/// The fused GEMM + reduce-scatter (sequence-parallel output), `per_pe` rows per PE, in
/// `rounds` rounds where given, through [`fused_exchange`] (below 512 rows per PE it is the
/// sequential schedule); and bit for bit what the sequential schedule gives where both
/// multiply by the decode kernel.
fn row_reduce_scatter_fused(
    c: &Checks,
    seed: u64,
    (per_pe, k, n): (usize, usize, usize),
    rounds: Option<usize>,
) -> Outcome {
    let m = per_pe * c.n();
    let case = row_case(
        c,
        &with_rounds(c, rounds),
        seed,
        (m, k, n),
        RowOutput::SequenceParallel,
    )?;
    let mine = c.me() * per_pe * n..(c.me() + 1) * per_pe * n;
    row_exchange(c, &case, k, per_pe * n, &|i, got, spare| {
        let (want, terms) = row_parallel(&case.inputs[i], &case.w, m, n, k, c.n());
        let mine = (&want[mine.clone()], &terms[mine.clone()]);
        compare_row("fused reduce-scatter output", got, mine)?;
        match m <= DECODE_MAX_TOKENS {
            true => same_as_sequential(c, &case, i, got, spare),
            false => Ok(()),
        }
    })
}

/// Row-parallel with an all-reduce: the whole product, identical on every PE.
fn row_all_reduce(
    c: &Checks,
    seed: u64,
    (m, k, n): (usize, usize, usize),
    schedule: Schedule,
) -> Outcome {
    let mut rng = Rng::new(seed);
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let layer = RowParallelLinear::new(&c.tp, k, n, m).map_err(text)?;
    layer.load_weight(&w).map_err(text)?;
    let xs = c.device(&take_cols(&x, k, layer.local_in_features()))?;
    let y = c.shmem.malloc::<bf16>(m * n).map_err(text)?;
    layer
        .forward_with(&y, &xs, schedule, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let got = y.to_vec().map_err(text)?;
    let (want, terms) = row_parallel(&x, &w, m, n, k, c.n());
    compare_row("row-parallel output", &got, (&want, &terms))?;
    c.identical("row-parallel output", &got)
}

/// Row-parallel with a reduce-scatter: this PE's `per_pe` rows of the whole product.
fn row_reduce_scatter(c: &Checks, seed: u64, (per_pe, k, n): (usize, usize, usize)) -> Outcome {
    let mut rng = Rng::new(seed);
    let m = per_pe * c.n();
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let layer = RowParallelLinear::with_output(&c.tp, k, n, RowOutput::SequenceParallel, m)
        .map_err(text)?;
    layer.load_weight(&w).map_err(text)?;
    let xs = c.device(&take_cols(&x, k, layer.local_in_features()))?;
    let y = c.shmem.malloc::<bf16>(per_pe * n).map_err(text)?;
    layer.forward(&y, &xs, &c.stream).map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let (all, terms) = row_parallel(&x, &w, m, n, k, c.n());
    let rows = c.me() * per_pe * n..(c.me() + 1) * per_pe * n;
    compare_row(
        "row-parallel reduce-scatter output",
        &y.to_vec().map_err(text)?,
        (&all[rows.clone()], &terms[rows]),
    )?;
    // Tokens that do not share equally are refused on every PE.
    if c.n() > 1 {
        let odd = c.device(&vec![bf16::ZERO; (m - 1) * layer.local_in_features().len()])?;
        match layer.forward(&y, &odd, &c.stream) {
            Err(Error::InvalidArgument(msg)) if msg.contains("equally") => {}
            other => return Err(format!("{} tokens over {} PEs: {other:?}", m - 1, c.n())),
        }
    }
    Ok(())
}

/// The row-parallel checks: the all-reduce in every schedule, the fused decode kernel and
/// GEMM + all-reduce, the reduce-scatter and the fused GEMM + reduce-scatter.
pub fn run(c: &mut Checks) {
    let n = c.n();
    for schedule in SCHEDULES {
        for (m, k, nn) in small(n) {
            // Row-parallel shards the input features: swap the roles of k and n.
            let s = (m, nn, k);
            c.run(
                format!("row all-reduce m={} k={} n={} {schedule:?}", s.0, s.1, s.2),
                |c, seed| row_all_reduce(c, seed, s, schedule),
            );
        }
    }
    // The fused decode kernel: one token (16-byte rows, the vector path), the most tokens
    // it takes with rows of an odd length (the element path), odd token counts and a
    // partial task (36 features: two tasks and a quarter). The widest give a block
    // several tasks (1057 and 1321 of 16 features on a grid of 2 blocks per SM, a
    // partial last one), whose sums it sends and takes back task by task. Where the
    // kernel does not take the call (an output width that is no multiple of 4, more
    // than FUSED_DECODE_MAX_TOKENS tokens) Fused is the sequential schedule.
    for s in [
        (1, 512 * n, 1032),
        (FUSED_DECODE_MAX_TOKENS, 520 * n + 3, 96),
        (5, 136 * n, 36),
        (7, 264 * n + 5, 40),
        (3, 64 * n, 16900),
        (FUSED_DECODE_MAX_TOKENS, 64 * n, 21124),
        (5, 136 * n, 33),
        (11, 512 * n, 72),
        (DECODE_MAX_TOKENS, 256 * n, 1030),
    ] {
        c.run(
            format!(
                "row fused m={} k={} n={}: graph replay, back to back",
                s.0, s.1, s.2
            ),
            |c, seed| row_fused(c, seed, s, None),
        );
    }
    // From 512 tokens per PE, the fused GEMM + all-reduce (odd widths: the sums' element
    // path), in one round and in rounds of 512 rows and odd sizes; tokens that the PEs do
    // not share equally go sequentially.
    for (s, rounds) in [
        ((FUSED_EXCHANGE_TOKENS * n, 64 * n, 520), None),
        ((515 * n, 136 * n, 33), None),
        ((1024 * n, 64 * n, 520), Some(2)),
        ((1539 * n, 72 * n, 33), Some(3)),
        ((FUSED_EXCHANGE_TOKENS * n + 1, 64 * n, 72), Some(4)),
    ] {
        let per_round = rounds.map_or(String::new(), |r| format!(" in {r} rounds"));
        c.run(
            format!(
                "row fused m={} k={} n={}{per_round}: graph replay, back to back",
                s.0, s.1, s.2
            ),
            |c, seed| row_fused(c, seed, s, rounds),
        );
    }
    for s in [(1, 96, 64), (3, 328, 200), (16, 129, 8 * n + 3)] {
        c.run(
            format!("row reduce-scatter {} rows per PE k={} n={}", s.0, s.1, s.2),
            |c, seed| row_reduce_scatter(c, seed, s),
        );
    }
    // The fused GEMM + reduce-scatter, from 512 tokens per PE (odd widths; below, the
    // sequential schedule, bit for bit where both use the decode kernel), in one round
    // and in 3 (the sums' element path).
    for (s, rounds) in [
        ((1, 96 * n, 64), None),
        ((3, 328, 200), None),
        ((512, 64 * n, 520), None),
        ((515, 136 * n, 33), None),
        ((1539, 72 * n, 33), Some(3)),
    ] {
        let per_round = rounds.map_or(String::new(), |r| format!(" in {r} rounds"));
        c.run(
            format!(
                "row reduce-scatter fused {} rows per PE k={} n={}{per_round}: back to back, two layers, graph replay",
                s.0, s.1, s.2
            ),
            |c, seed| row_reduce_scatter_fused(c, seed, s, rounds),
        );
    }
}
