//! A tensor-parallel MLP forward: every PE loads the full weights and keeps its shard, the
//! forward runs in whatever schedule `Auto` picks, and every PE checks its output against the
//! same MLP computed on the CPU.
//!
//! ```text
//! nvshmemrun -np 2 target/release/examples/tp_forward      (needs the `tp` feature)
//! ```

use nvshmem::tp::{MlpShape, TensorParallel, TpMlp};
use nvshmem::{bf16, Nvshmem};

#[path = "common/splitmix.rs"]
mod splitmix;

const HIDDEN: usize = 1024;
const FFN: usize = 4096;
const TOKENS: usize = 8;

fn main() {
    if let Err(e) = run() {
        eprintln!("tp_forward: {e}");
        std::process::exit(1);
    }
}

/// `len` values in [-scale, scale), the same on every PE, rounded to bf16.
fn random(len: usize, seed: u64, scale: f32) -> Vec<bf16> {
    let mut rng = splitmix::SplitMix64(seed);
    (0..len)
        .map(|_| {
            let unit = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
            bf16::from_f32((2.0 * unit - 1.0) * scale)
        })
        .collect()
}

/// `out[r] = Σ_c w[r][c] · v[c]`, in f32, for a row-major `rows × v.len()` matrix.
fn matvec(w: &[bf16], v: &[f32], rows: usize) -> Vec<f32> {
    let cols = v.len();
    (0..rows)
        .map(|r| {
            let row = &w[r * cols..(r + 1) * cols];
            row.iter().zip(v).map(|(a, b)| a.to_f32() * b).sum()
        })
        .collect()
}

/// The MLP on the CPU: y = down(silu(gate x) · up x), the product rounded to bf16 as the
/// GPU's input to the down projection is.
fn reference(gate: &[bf16], up: &[bf16], down: &[bf16], x: &[bf16]) -> Vec<f32> {
    let mut y = Vec::with_capacity(TOKENS * HIDDEN);
    for t in 0..TOKENS {
        let xt: Vec<f32> = x[t * HIDDEN..(t + 1) * HIDDEN]
            .iter()
            .map(|v| v.to_f32())
            .collect();
        let (g, u) = (matvec(gate, &xt, FFN), matvec(up, &xt, FFN));
        let h: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| bf16::from_f32(g / (1.0 + (-g).exp()) * u).to_f32())
            .collect();
        y.extend(matvec(down, &h, HIDDEN));
    }
    y
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

    // The same full weights and input on every PE (from the same seeds).
    let gate = random(FFN * HIDDEN, 1, 1.0 / (HIDDEN as f32).sqrt());
    let up = random(FFN * HIDDEN, 2, 1.0 / (HIDDEN as f32).sqrt());
    let down = random(HIDDEN * FFN, 3, 1.0 / (FFN as f32).sqrt());
    let x = random(TOKENS * HIDDEN, 4, 1.0);
    mlp.load_weights(&gate, &up, &down)?; // each PE keeps its shard

    let x_dev = shmem.alloc_device::<bf16>(TOKENS * HIDDEN)?;
    x_dev.copy_from_host(&x)?;
    let y = shmem.malloc::<bf16>(TOKENS * HIDDEN)?;
    mlp.forward(&y, &x_dev, shmem.stream())?;
    let got = y.to_vec()?;

    // Within (|ref| + RMS) / 64 of the CPU: bf16 output and a different order of sums.
    let want = reference(&gate, &up, &down, &x);
    let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
    let wrong = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| (g.to_f32() - **w).abs() > (w.abs() + rms) / 64.0)
        .count();
    println!(
        "tp_forward: PE {me}/{n}: MLP {HIDDEN} -> {FFN} -> {HIDDEN}, {TOKENS} tokens, schedule \
         {:?}: {wrong} of {} outputs off the CPU reference",
        mlp.auto_schedule(TOKENS),
        got.len()
    );
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
