//! A tensor-parallel MLP forward: every PE loads the full weights and keeps its shard, the
//! forward runs in whatever schedule `Auto` picks, and every PE checks its output against the
//! same MLP computed on the CPU.
//!
//! ```text
//! nvshmemrun -np 2 target/release/examples/tp_forward      (needs the `tp` feature)
//! ```

use nvshmem::tp::{MlpShape, TensorParallel, TpMlp};
use nvshmem::{bf16, Nvshmem};

#[path = "common/mlp_cpu.rs"]
mod mlp_cpu;

const HIDDEN: usize = 1024;
const FFN: usize = 4096;
const TOKENS: usize = 8;

fn main() {
    if let Err(e) = run() {
        eprintln!("tp_forward: {e}");
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

    // The same full weights and input on every PE (from the same seeds).
    let gate = mlp_cpu::random(FFN * HIDDEN, 1, 1.0 / (HIDDEN as f32).sqrt());
    let up = mlp_cpu::random(FFN * HIDDEN, 2, 1.0 / (HIDDEN as f32).sqrt());
    let down = mlp_cpu::random(HIDDEN * FFN, 3, 1.0 / (FFN as f32).sqrt());
    let x = mlp_cpu::random(TOKENS * HIDDEN, 4, 1.0);
    mlp.load_weights(&gate, &up, &down)?; // each PE keeps its shard

    let x_dev = shmem.alloc_device::<bf16>(TOKENS * HIDDEN)?;
    x_dev.copy_from_host(&x)?;
    let y = shmem.malloc::<bf16>(TOKENS * HIDDEN)?;
    mlp.forward(&y, &x_dev, shmem.stream())?;
    let got = y.to_vec()?;

    let wrong = mlp_cpu::off(&got, &mlp_cpu::mlp(&gate, &up, &down, &x, HIDDEN));
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
