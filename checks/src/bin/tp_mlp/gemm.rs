//! The local GEMM's checks (`GemmPath::Decode`, `CublasLt`, and `Auto` after calibration)
//! and its timing table.

use nvshmem::tp::{shard_range, GemmPath, LinearShape, DECODE_MAX_TOKENS};
use nvshmem::{bf16, Error};

use crate::args::Args;
use crate::harness::{capture, median, sync, text, time_graph, Checks, Outcome};
use crate::reference::{bits, compare, compare_unsharded, matmul, weight, Rng};

/// `y = x · wᵀ` by `path` against f64 sums, with [`compare`]'s tolerance and exactness.
fn gemm_case(c: &Checks, seed: u64, shape: LinearShape, path: GemmPath) -> Outcome {
    let LinearShape { m, n, k } = shape;
    let mut rng = Rng::new(seed);
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let (xd, wd) = (c.device(&x)?, c.device(&w)?);
    let y = c.device(&rng.bf16s(m * n, 1.0))?; // poisoned: every element must be written
    c.tp.gemm()
        .linear_with(&y, &xd, &wd, shape, path, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let got = y.to_vec().map_err(text)?;
    compare("GEMM output", &got, &matmul(&x, &w, m, n, k))?;
    // Twice more, back to back on the stream: the same bits (both paths are deterministic).
    let again = c.device(&rng.bf16s(m * n, 1.0))?;
    for out in [&y, &again] {
        c.tp.gemm()
            .linear_with(out, &xd, &wd, shape, path, &c.stream)
            .map_err(text)?;
    }
    sync(&c.stream).map_err(text)?;
    for out in [&y, &again] {
        if bits(&out.to_vec().map_err(text)?) != bits(&got) {
            return Err("a GEMM called again gave other bits".into());
        }
    }
    Ok(())
}

/// After [`Gemm::calibrate`], `GemmPath::Auto` takes the decode kernel or cuBLASLt by the
/// measurement (the same bits as that path), our decode kernel for sizes not measured and
/// cuBLASLt past 16 tokens, whose measured algorithms agree with its heuristic's first choice
/// within the tolerance and give the same bits call after call; a weight of the wrong length
/// is refused.
fn gemm_calibrated(c: &Checks, seed: u64) -> Outcome {
    let mut rng = Rng::new(seed);
    let gemm = c.tp.gemm();
    for (n, k) in [(1000, 4096), (129, 1000)] {
        let w = c.device(&weight(&mut rng, n, k))?;
        gemm.calibrate(&w, n, k, DECODE_MAX_TOKENS).map_err(text)?;
        for m in [1, 9, DECODE_MAX_TOKENS] {
            let shape = LinearShape { m, n, k };
            let path = gemm.auto_path(shape);
            if !matches!(path, GemmPath::Decode | GemmPath::CublasLt) {
                return Err(format!("m={m} n={n} k={k}: Auto takes {path:?}"));
            }
            let x = c.device(&rng.bf16s(m * k, 1.0))?;
            let mut outs = Vec::new();
            for p in [GemmPath::Auto, path] {
                let y = c.device(&rng.bf16s(m * n, 1.0))?;
                gemm.linear_with(&y, &x, &w, shape, p, &c.stream)
                    .map_err(text)?;
                sync(&c.stream).map_err(text)?;
                outs.push(bits(&y.to_vec().map_err(text)?));
            }
            if outs[0] != outs[1] {
                return Err(format!(
                    "m={m} n={n} k={k}: Auto's output differs from {path:?}'s"
                ));
            }
        }
        let past = LinearShape {
            m: DECODE_MAX_TOKENS + 1,
            n,
            k,
        };
        if gemm.auto_path(past) != GemmPath::CublasLt {
            return Err("past 16 tokens Auto must take cuBLASLt".into());
        }
    }
    // cuBLASLt's measured algorithms (calibrated up to 128 tokens) give the product that its
    // heuristic's first choice gives, within the tolerance, and the same bits call after call.
    let (n, k) = (1000, 4096);
    let w = c.device(&weight(&mut rng, n, k))?;
    gemm.calibrate(&w, n, k, 128).map_err(text)?;
    for m in [17, 100, 128] {
        let shape = LinearShape { m, n, k };
        let x = c.device(&rng.bf16s(m * k, 1.0))?;
        let mut outs = Vec::new();
        for p in [
            GemmPath::CublasLtHeuristic,
            GemmPath::CublasLt,
            GemmPath::CublasLt,
        ] {
            let y = c.device(&rng.bf16s(m * n, 1.0))?;
            gemm.linear_with(&y, &x, &w, shape, p, &c.stream)
                .map_err(text)?;
            sync(&c.stream).map_err(text)?;
            outs.push(y.to_vec().map_err(text)?);
        }
        let reference: Vec<f64> = outs[0].iter().map(|v| v.to_f64()).collect();
        compare_unsharded(
            &format!("m={m} n={n} k={k}: tuned cuBLASLt"),
            &outs[1],
            &reference,
        )?;
        if bits(&outs[1]) != bits(&outs[2]) {
            return Err(format!(
                "m={m} n={n} k={k}: tuned cuBLASLt gave other bits again"
            ));
        }
    }
    let unmeasured = LinearShape { m: 4, n: 77, k: 91 };
    if gemm.auto_path(unmeasured) != GemmPath::Decode {
        return Err("sizes never measured must take the decode kernel".into());
    }
    // A choice set by hand stands, and calibrating again leaves it.
    let pinned = LinearShape {
        m: 3,
        n: 129,
        k: 1000,
    };
    for path in [GemmPath::CublasLt, GemmPath::Decode] {
        gemm.set_auto_path(pinned, path).map_err(text)?;
        let w = c.device(&weight(&mut rng, 129, 1000))?;
        gemm.calibrate(&w, 129, 1000, DECODE_MAX_TOKENS)
            .map_err(text)?;
        if gemm.auto_path(pinned) != path {
            return Err(format!("set_auto_path({path:?}) did not stand"));
        }
    }
    for (m, path) in [
        (DECODE_MAX_TOKENS + 1, GemmPath::CublasLt),
        (0, GemmPath::Decode),
        (4, GemmPath::CublasLtHeuristic),
    ] {
        let shape = LinearShape { m, n: 8, k: 8 };
        match gemm.set_auto_path(shape, path) {
            Err(Error::InvalidArgument(_)) => {}
            other => return Err(format!("set_auto_path(m={m}, {path:?}): {other:?}")),
        }
    }
    let short = c.device(&[bf16::ONE; 10])?;
    match gemm.calibrate(&short, 4, 4, 8) {
        Err(Error::Length { .. }) => Ok(()),
        Err(e) => Err(format!("a short weight: the wrong error: {e}")),
        Ok(()) => Err("a short weight was accepted".into()),
    }
}

/// This PE's GEMMs of the MLP shape (gate/up, then down) for each token count, by cuBLASLt
/// (the algorithm calibration measured fastest), by our decode kernel (up to
/// [`DECODE_MAX_TOKENS`] tokens; larger token counts are skipped) and by cuBLASLt with its
/// heuristic's first choice, in CUDA graphs: time, TFLOP/s and the weight's bytes per second.
/// Each timed output is checked bit for bit against an eager call, and the other paths
/// against cuBLASLt within the tolerance.
fn gemm_timing(c: &Checks, a: &Args) -> Outcome {
    let f = shard_range(a.ffn, c.me(), c.n()).len();
    let shapes = [("gate/up", 2 * f, a.hidden), ("down", a.hidden, f)];
    if c.shmem.my_pe() == 0 {
        println!(
            "\nGEMMs of this PE's MLP shard ({} over {} PEs), bf16, CUDA graphs, {} replays, PE 0; us: median [p10, p90]; TFLOP/s; GB/s of weight read",
            a.shape_name,
            c.n(),
            a.iters
        );
        println!(
            "{:>8} {:>5} {:>6} {:>6} {:>24} {:>7} {:>6} {:>8} {:>24} {:>7} {:>6} {:>8} {:>8} {:>24} {:>8}",
            "GEMM",
            "M",
            "N",
            "K",
            "cuBLASLt",
            "TFLOP/s",
            "GB/s",
            "ours",
            "",
            "TFLOP/s",
            "GB/s",
            "speed-up",
            "Auto",
            "cuBLASLt, heuristic's",
            "tuned"
        );
    }
    let mut rng = Rng::new(0x6e33);
    for (name, n, k) in shapes {
        let w = c.device(&rng.bf16s(n * k, 0.05))?;
        // What GemmPath::Auto takes on this GPU, as the layers measure it.
        let most = a.ms.iter().copied().max().unwrap_or(0);
        let started = std::time::Instant::now();
        c.tp.gemm().calibrate(&w, n, k, most).map_err(text)?;
        if c.shmem.my_pe() == 0 {
            println!(
                "{name}: calibrated up to {most} tokens in {:.0} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        for &m in &a.ms {
            if m > DECODE_MAX_TOKENS {
                continue;
            }
            let ours = GemmPath::Decode;
            let x = c.device(&rng.bf16s(m * k, 1.0))?;
            let ys = [
                c.shmem.alloc_device::<bf16>(m * n).map_err(text)?,
                c.shmem.alloc_device::<bf16>(m * n).map_err(text)?,
                c.shmem.alloc_device::<bf16>(m * n).map_err(text)?,
            ];
            let shape = LinearShape { m, n, k };
            let paths = [GemmPath::CublasLt, ours, GemmPath::CublasLtHeuristic];
            let mut eager = Vec::new();
            for (y, path) in ys.iter().zip(paths) {
                c.tp.gemm()
                    .linear_with(y, &x, &w, shape, path, &c.stream)
                    .map_err(text)?;
                sync(&c.stream).map_err(text)?;
                eager.push(y.to_vec().map_err(text)?);
            }
            let reference: Vec<f64> = eager[0].iter().map(|v| v.to_f64()).collect();
            for (path, got) in paths.iter().zip(&eager).skip(1) {
                compare_unsharded(
                    &format!("{name} m={m}: {path:?} against cuBLASLt"),
                    got,
                    &reference,
                )?;
            }
            let mut cells = Vec::new();
            for ((y, path), want) in ys.iter().zip(paths).zip(&eager) {
                let graph = capture(&c.stream, || {
                    c.tp.gemm().linear_with(y, &x, &w, shape, path, &c.stream)
                })?;
                let (med, p10, p90) = median(time_graph(c, &graph, a.iters)?);
                if bits(&y.to_vec().map_err(text)?) != bits(want) {
                    return Err(format!(
                        "{name} m={m} {path:?}: a timed output differs from the eager one"
                    ));
                }
                let gbs = (n * k * 2) as f64 / (med * 1e3);
                let tflops = shape.flops() / (med * 1e6);
                cells.push((med, format!("{med:.1} [{p10:.1}, {p90:.1}]"), tflops, gbs));
            }
            if c.shmem.my_pe() == 0 {
                println!(
                    "{name:>8} {m:>5} {n:>6} {k:>6} {:>24} {:>7.0} {:>6.0} {:>8} {:>24} {:>7.0} {:>6.0} {:>7.2}x {:>8} {:>24} {:>7.2}x",
                    cells[0].1,
                    cells[0].2,
                    cells[0].3,
                    format!("{ours:?}"),
                    cells[1].1,
                    cells[1].2,
                    cells[1].3,
                    cells[0].0 / cells[1].0,
                    format!("{:?}", c.tp.gemm().auto_path(shape)),
                    cells[2].1,
                    cells[2].0 / cells[0].0
                );
            }
        }
    }
    Ok(())
}

/// The local GEMM's checks: both paths on odd shapes, `Auto` after calibration, then (with
/// timing) the GEMMs of this PE's MLP shard.
pub fn run(c: &mut Checks, args: &Args) {
    // Both paths on odd shapes: k not a multiple of 8 (the decode kernel's scalar path),
    // one row, the most rows the decode kernel takes, and the shard shapes of the 8B MLP.
    for (m, n, k) in [
        (1, 129, 35),
        (3, 64, 200),
        (8, 1000, 4096),
        (5, 33, 4100),
        (2, 7, 9),
        (9, 1000, 4096),
        (13, 33, 4100),
        (DECODE_MAX_TOKENS, 129, 1000),
        (DECODE_MAX_TOKENS, 64, 35),
        // k that ends mid-step (not a multiple of 64, nor of a block's 512 per pass),
        // with rows past n and tokens past 8 in the last tile.
        (12, 30, 4104),
        (3, 17, 520),
    ] {
        for path in [GemmPath::Decode, GemmPath::CublasLt] {
            c.run(format!("gemm {path:?} m={m} n={n} k={k}"), |c, seed| {
                gemm_case(c, seed, LinearShape { m, n, k }, path)
            });
        }
    }
    c.run(
        "gemm Auto takes the path calibrate recorded".into(),
        gemm_calibrated,
    );
    if args.timing {
        c.run("gemm timing (every timed output checked)".into(), |c, _| {
            gemm_timing(c, args)
        });
    }
}
