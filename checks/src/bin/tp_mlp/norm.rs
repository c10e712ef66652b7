//! `TensorParallel::all_reduce_rmsnorm`: the new residual bit for bit and the normalised
//! output against the CPU, fused and unfused (our all-reduce, then `rmsnorm`) the same bits,
//! in place, in a CUDA graph, every PE alike; bad arguments refused; and the MLP half of a
//! decoder layer (`TpMlp::forward_rmsnorm`) the same bits as the MLP, then `rmsnorm`.
//!
//! The CPU sums the PEs' inputs in f32 in PE order and rounds to bf16 as our all-reduces do,
//! then adds the residual in f32 and rounds: the new residual must have exactly those bits.
//! The output is `r · w / sqrt(mean(r²) + eps)` in f64 from that residual: the GPU's sum of
//! squares in f32 differs from f64 by far less than one bf16 spacing, so the output may
//! differ by its final rounding, 2^-7 of its magnitude plus 2^-7 of the output's RMS.

use nvshmem::tp::{MlpShape, Schedule, TpMlp};
use nvshmem::{bf16, AllReduceAlgo, DeviceBuffer, ReduceOp};

use crate::harness::{capture, sync, text, Checks, Outcome};
use crate::reference::{bits, compare_with, weight, Rng};

const EPS: f32 = 1e-5;

/// (tokens, hidden): one token, odd token counts, a hidden size that is not a multiple of 8,
/// the largest hidden size, and a call too large for the fused path.
const CASES: [(usize, usize); 7] = [
    (1, 4096),
    (3, 8192),
    (16, 4100),
    (5, 16384),
    (64, 8192),
    (65, 8192),
    (2048, 4096),
];

pub fn run(c: &mut Checks) {
    for (tokens, hidden) in CASES {
        let fused = c.tp.fuses_rmsnorm(tokens, hidden);
        let path = if fused {
            "fused"
        } else {
            "all-reduce then rmsnorm"
        };
        c.run(
            format!("all_reduce_rmsnorm {tokens} x {hidden} ({path}) against the CPU"),
            |c, seed| case(c, seed, tokens, hidden),
        );
    }
    // The default workspace's lines hold 1 MiB of input per PE.
    c.run(
        "all_reduce_rmsnorm: the default workspace fuses 64 x 8192, not 128 x 8192".into(),
        |c, _| match (c.tp.fuses_rmsnorm(64, 8192), c.tp.fuses_rmsnorm(128, 8192)) {
            (true, false) => Ok(()),
            got => Err(format!("fuses (64 x 8192, 128 x 8192): {got:?}")),
        },
    );
    c.run("all_reduce_rmsnorm refuses bad arguments".into(), |c, _| {
        refusals(c)
    });
    for tokens in [1, 5, 64] {
        c.run(
            format!("TpMlp::forward_rmsnorm {tokens} tokens: forward, then rmsnorm, bit for bit"),
            |c, seed| mlp_half(c, seed, tokens),
        );
    }
}

/// The MLP half of a decoder layer, fused, against the MLP's sequential forward (the same
/// GEMMs and all-reduce) followed by `rmsnorm`: the same bits, on every PE.
fn mlp_half(c: &Checks, seed: u64, tokens: usize) -> Outcome {
    let (hidden, ffn) = (1024, 256 * c.n());
    let mut rng = Rng::new(seed);
    let shape = MlpShape {
        hidden,
        ffn,
        max_tokens: 64,
    };
    let mlp = TpMlp::new(&c.tp, shape).map_err(text)?;
    let (gate, up, down) = (
        weight(&mut rng, ffn, hidden),
        weight(&mut rng, ffn, hidden),
        weight(&mut rng, hidden, ffn),
    );
    mlp.load_weights(&gate, &up, &down).map_err(text)?;
    let n = tokens * hidden;
    let x = c.device(&rng.bf16s(n, 1.0))?;
    let start = rng.bf16s(n, 2.0);
    let w: Vec<bf16> = rng
        .bf16s(hidden, 0.5)
        .iter()
        .map(|v| bf16::from_f32(1.0 + v.to_f32()))
        .collect();
    let w = c.device(&w)?;
    let s = &c.stream;
    let (fused, r_fused) = (c.shmem.malloc::<bf16>(n).map_err(text)?, c.device(&start)?);
    mlp.forward_rmsnorm(&fused, &r_fused, &x, &w, EPS, s)
        .map_err(text)?;
    let (y, r_apart) = (c.shmem.malloc::<bf16>(n).map_err(text)?, c.device(&start)?);
    mlp.forward_with(&y, &x, Schedule::Sequential, s)
        .map_err(text)?;
    c.tp.rmsnorm(&y, &r_apart, &y, &w, EPS, s).map_err(text)?;
    sync(s).map_err(text)?;
    let (got, want) = (fused.to_vec().map_err(text)?, y.to_vec().map_err(text)?);
    let (gr, wr) = (
        r_fused.to_vec().map_err(text)?,
        r_apart.to_vec().map_err(text)?,
    );
    if bits(&got) != bits(&want) || bits(&gr) != bits(&wr) {
        return Err("forward_rmsnorm differs from forward then rmsnorm".into());
    }
    if got.iter().any(|v| !v.to_f32().is_finite()) {
        return Err("forward_rmsnorm gave a value that is not finite".into());
    }
    c.identical("forward_rmsnorm", &got)
}

/// The CPU's new residual and output for every PE's input `xs`.
fn reference(xs: &[Vec<bf16>], residual: &[bf16], weight: &[bf16]) -> (Vec<bf16>, Vec<f64>) {
    let hidden = weight.len();
    let r: Vec<bf16> = (0..residual.len())
        .map(|j| {
            let s = xs
                .iter()
                .skip(1)
                .fold(xs[0][j].to_f32(), |a, x| a + x[j].to_f32());
            bf16::from_f32(bf16::from_f32(s).to_f32() + residual[j].to_f32())
        })
        .collect();
    let mut out = vec![0.0; r.len()];
    for (t, row) in r.chunks(hidden).enumerate() {
        let ms = row.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / hidden as f64;
        let scale = 1.0 / (ms + EPS as f64).sqrt();
        for (j, v) in row.iter().enumerate() {
            out[t * hidden + j] = v.to_f64() * scale * weight[j].to_f64();
        }
    }
    (r, out)
}

fn case(c: &Checks, seed: u64, tokens: usize, hidden: usize) -> Outcome {
    let n = tokens * hidden;
    // Every PE draws every PE's input, and the same residual and weight.
    let mut rng = Rng::new(seed);
    let xs: Vec<Vec<bf16>> = (0..c.n()).map(|_| rng.bf16s(n, 1.0)).collect();
    let residual0 = rng.bf16s(n, 2.0);
    let weight: Vec<bf16> = rng
        .bf16s(hidden, 0.5)
        .iter()
        .map(|w| bf16::from_f32(1.0 + w.to_f32()))
        .collect();
    let (want_r, want_out) = reference(&xs, &residual0, &weight);
    let x = c.symmetric(&xs[c.me()])?;
    let w = c.device(&weight)?;
    let fresh = || c.device(&residual0);
    let check = |what: &str, out: &[bf16], r: &DeviceBuffer<bf16>| -> Outcome {
        let r = r.to_vec().map_err(text)?;
        if bits(&r) != bits(&want_r) {
            let i = (0..n)
                .find(|&i| r[i].to_bits() != want_r[i].to_bits())
                .unwrap_or(0);
            return Err(format!(
                "{what}: the new residual's element {i} is {} where {} was expected",
                r[i], want_r[i]
            ));
        }
        compare_with(what, out, &want_out, &[], 1.0 / 128.0)?;
        c.identical(what, out)
    };
    let s = &c.stream;

    // The call.
    let (out, r) = (c.shmem.malloc::<bf16>(n).map_err(text)?, fresh()?);
    c.tp.all_reduce_rmsnorm(&out, &r, &x, &w, EPS, s)
        .map_err(text)?;
    sync(s).map_err(text)?;
    let got = out.to_vec().map_err(text)?;
    check("all_reduce_rmsnorm", &got, &r)?;

    // Unfused: our all-reduce, then rmsnorm; the same bits.
    let (sum, r2) = (c.shmem.malloc::<bf16>(n).map_err(text)?, fresh()?);
    let coll = c.tp.collectives();
    coll.all_reduce(&sum, &x, ReduceOp::Sum, AllReduceAlgo::Auto, s)
        .map_err(text)?;
    c.tp.rmsnorm(&sum, &r2, &sum, &w, EPS, s).map_err(text)?;
    sync(s).map_err(text)?;
    let unfused = sum.to_vec().map_err(text)?;
    if bits(&unfused) != bits(&got) {
        return Err("all_reduce then rmsnorm differs from all_reduce_rmsnorm".into());
    }
    check("all_reduce then rmsnorm", &unfused, &r2)?;

    // In place (out = x), in a CUDA graph that restores the residual first, replayed twice.
    let (inplace, mut r3, start) = (c.symmetric(&xs[c.me()])?, fresh()?, fresh()?);
    let graph = capture(s, || {
        s.memcpy_dtod(&start, &mut r3)
            .map_err(|source| nvshmem::Error::Cuda {
                call: "cuMemcpyDtoDAsync",
                source,
            })?;
        c.tp.all_reduce_rmsnorm(&inplace, &r3, &inplace, &w, EPS, s)
    })?;
    for _ in 0..2 {
        // The input, restored too: in place, each replay leaves the output in it.
        inplace.copy_from_host(&xs[c.me()]).map_err(text)?;
        c.shmem.barrier_all().map_err(text)?;
        graph.launch().map_err(|e| format!("cuGraphLaunch: {e}"))?;
        sync(s).map_err(text)?;
        c.shmem.barrier_all().map_err(text)?;
    }
    let got = inplace.to_vec().map_err(text)?;
    check("all_reduce_rmsnorm in place, in a graph", &got, &r3)
}

fn refusals(c: &Checks) -> Outcome {
    let s = &c.stream;
    let x = c.symmetric(&[bf16::ONE; 64])?;
    let out = c.shmem.malloc::<bf16>(64).map_err(text)?;
    let r = c.device(&[bf16::ONE; 64])?;
    let short = c.device(&[bf16::ONE; 60])?;
    let w = c.device(&[bf16::ONE; 16])?;
    let w6 = c.device(&[bf16::ONE; 6])?;
    let tp = &c.tp;
    let cases: [(&str, nvshmem::Result<()>); 5] = [
        (
            "a hidden size of 6",
            tp.all_reduce_rmsnorm(&out, &r, &x, &w6, EPS, s),
        ),
        (
            "a short residual",
            tp.all_reduce_rmsnorm(&out, &short, &x, &w, EPS, s),
        ),
        (
            "a NaN eps",
            tp.all_reduce_rmsnorm(&out, &r, &x, &w, f32::NAN, s),
        ),
        (
            "a negative eps",
            tp.all_reduce_rmsnorm(&out, &r, &x, &w, -1.0, s),
        ),
        (
            "the residual as the input",
            tp.rmsnorm(&out, &r, &r, &w, EPS, s),
        ),
    ];
    for (what, result) in cases {
        match result {
            Err(nvshmem::Error::InvalidArgument(_)) => {}
            other => return Err(format!("{what}: {other:?}, expected InvalidArgument")),
        }
    }
    Ok(())
}
