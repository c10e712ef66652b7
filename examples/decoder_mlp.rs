//! The MLP half of a Llama decoder layer, tensor-parallel: `residual += mlp(x)`, then
//! `out = rmsnorm(residual) · w`, the input of the next layer's attention. The down
//! projection's all-reduce, the residual add and the RMSNorm run as one kernel
//! (`TpMlp::forward_rmsnorm`). Every PE checks both outputs against the CPU.
//!
//! ```text
//! nvshmemrun -np 2 target/release/examples/decoder_mlp     (needs the `tp` feature)
//! ```

use nvshmem::tp::{MlpShape, TensorParallel, TpMlp};
use nvshmem::{bf16, Nvshmem};

#[path = "common/mlp_cpu.rs"]
mod mlp_cpu;

const HIDDEN: usize = 1024;
const FFN: usize = 4096;
const TOKENS: usize = 4;
const EPS: f32 = 1e-5;

fn main() {
    if let Err(e) = run() {
        eprintln!("decoder_mlp: {e}");
        std::process::exit(1);
    }
}

fn run() -> nvshmem::Result<()> {
    let shmem = Nvshmem::init()?;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let tp = TensorParallel::new(&shmem)?;
    let shape = MlpShape {
        hidden: HIDDEN,
        ffn: FFN,
        max_tokens: TOKENS,
    };
    let mlp = TpMlp::new(&tp, shape)?;
    let scale = |k: usize| 1.0 / (k as f32).sqrt();
    let gate = mlp_cpu::random(FFN * HIDDEN, 1, scale(HIDDEN));
    let up = mlp_cpu::random(FFN * HIDDEN, 2, scale(HIDDEN));
    let down = mlp_cpu::random(HIDDEN * FFN, 3, scale(FFN));
    mlp.load_weights(&gate, &up, &down)?;

    // The layer's input (the attention half's normalised output), its residual stream, and
    // the next RMSNorm's weight: the same on every PE.
    let x = mlp_cpu::random(TOKENS * HIDDEN, 4, 1.0);
    let residual = mlp_cpu::random(TOKENS * HIDDEN, 5, 1.0);
    let norm: Vec<bf16> = mlp_cpu::random(HIDDEN, 6, 0.5)
        .iter()
        .map(|w| bf16::from_f32(1.0 + w.to_f32()))
        .collect();
    let dev = |v: &[bf16]| -> nvshmem::Result<_> {
        let b = shmem.alloc_device::<bf16>(v.len())?;
        b.copy_from_host(v)?;
        Ok(b)
    };
    let (x_dev, r_dev, w_dev) = (dev(&x)?, dev(&residual)?, dev(&norm)?);
    let out = shmem.malloc::<bf16>(TOKENS * HIDDEN)?;
    mlp.forward_rmsnorm(&out, &r_dev, &x_dev, &w_dev, EPS, shmem.stream())?;
    let (got_r, got_out) = (r_dev.to_vec()?, out.to_vec()?);

    // The CPU: the residual plus the MLP, then each token's RMSNorm.
    let y = mlp_cpu::mlp(&gate, &up, &down, &x, HIDDEN);
    let want_r: Vec<f32> = y
        .iter()
        .zip(&residual)
        .map(|(y, r)| y + r.to_f32())
        .collect();
    let mut want_out = Vec::with_capacity(want_r.len());
    for row in want_r.chunks(HIDDEN) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / HIDDEN as f32;
        let s = 1.0 / (ms + EPS).sqrt();
        want_out.extend(row.iter().zip(&norm).map(|(v, w)| v * s * w.to_f32()));
    }
    let wrong = mlp_cpu::off(&got_r, &want_r) + mlp_cpu::off(&got_out, &want_out);
    let passed = usize::from(wrong == 0);
    println!(
        "decoder_mlp: PE {me}/{n}: {TOKENS} tokens, fused: {}: {wrong} of {} values off the \
         CPU: {passed} passed, {} failed",
        tp.fuses_rmsnorm(TOKENS, HIDDEN),
        2 * got_out.len(),
        1 - passed
    );
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
