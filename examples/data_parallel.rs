//! Data-parallel training of a stack of linear layers: every PE runs the forward and the
//! backward pass (bf16 GEMMs by cuBLASLt) on its own batch, and `GradientSync` sums each
//! bucket of gradients on a side stream while the backward pass goes on. After every step,
//! each PE checks that its weights equal a single-GPU run that sums every PE's gradients
//! itself (in f32, in PE order), bit for bit, and that every PE holds the same bits.
//!
//! ```text
//! nvshmemrun -np 4 target/release/examples/data_parallel      (needs the `tp` feature)
//! ```

use nvshmem::tp::{Gemm, LinearShape};
use nvshmem::{bf16, Collectives, CollectivesConfig, DeviceBuffer, GradSyncConfig, GradientSync};
use nvshmem::{Nvshmem, ReduceOp};
#[path = "common/mlp_cpu.rs"]
mod mlp_cpu;

const WIDTH: usize = 1024;
const LAYERS: usize = 8; // 8 M parameters
const TOKENS: usize = 128; // per PE and step
const STEPS: u64 = 3;
const LR: f32 = 0.05;

fn main() {
    if let Err(e) = run() {
        eprintln!("data_parallel: {e}");
        std::process::exit(1);
    }
}

const SHAPE: LinearShape = LinearShape {
    m: TOKENS,
    n: WIDTH,
    k: WIDTH,
};

/// `w - lr / n · g` for every weight, in f32, rounded to bf16: the same on both runs.
fn update(w: &mut [bf16], g: &[f32], n: usize) {
    for (x, d) in w.iter_mut().zip(g) {
        *x = bf16::from_f32(x.to_f32() - LR / n as f32 * d);
    }
}

/// Whether every PE passed the same `hash`: its largest and smallest over PEs agree.
fn same_on_every_pe(shmem: &Nvshmem, hash: u64) -> nvshmem::Result<bool> {
    let (h, buf) = (hash as i64 >> 1, shmem.malloc::<i64>(2)?);
    buf.copy_from_host(&[h, -h])?;
    shmem
        .team_world()
        .all_reduce(&buf, &buf, ReduceOp::Max, shmem.stream())?;
    Ok(buf.to_vec()? == [h, -h])
}

fn run() -> nvshmem::Result<()> {
    let shmem = Nvshmem::init()?;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let mut config = CollectivesConfig::for_pes(n);
    config.max_blocks = Some(32); // room for the GEMMs beside the sync (see the README)
    let coll = Collectives::with_config(&shmem, config)?;
    let buckets = GradSyncConfig::buckets_of(4 << 20);
    let mut sync = GradientSync::<bf16>::new(&shmem, &coll, &[WIDTH * WIDTH; LAYERS], buckets)?;
    let (gemm, s) = (Gemm::new(&shmem)?, shmem.stream());
    let buf = |_| shmem.alloc_device::<bf16>(TOKENS * WIDTH);
    let w: Vec<DeviceBuffer<bf16>> = (0..LAYERS)
        .map(|_| shmem.alloc_device(WIDTH * WIDTH))
        .collect::<Result<_, _>>()?;
    let acts: Vec<DeviceBuffer<bf16>> = (0..=LAYERS).map(buf).collect::<Result<_, _>>()?;
    let dy = [buf(0)?, buf(0)?];
    // Forward and backward on batch (step, pe) with loss ½‖y − target‖²: each layer's weight
    // gradient into sync.grad(layer), last layer first, `ready` after each when `overlap`
    // (the data-parallel step; not in the single-GPU run's passes).
    let pass = |sync: &mut GradientSync<bf16>,
                step: u64,
                pe: usize,
                overlap: bool|
     -> nvshmem::Result<()> {
        let seed = 64 * step + pe as u64;
        acts[0].copy_from_host(&mlp_cpu::random(TOKENS * WIDTH, 1000 + seed, 1.0))?;
        for l in 0..LAYERS {
            gemm.linear(&acts[l + 1], &acts[l], &w[l], SHAPE, s)?;
        }
        // The loss gradient, y − target, on the host.
        let target = mlp_cpu::random(TOKENS * WIDTH, 5000 + seed, 1.0);
        let y = acts[LAYERS].to_vec()?.into_iter().zip(target);
        let loss: Vec<bf16> = y
            .map(|(a, b)| bf16::from_f32(a.to_f32() - b.to_f32()))
            .collect();
        dy[0].copy_from_host(&loss)?;
        for l in (0..LAYERS).rev() {
            let (d, next) = (&dy[(LAYERS - 1 - l) % 2], &dy[(LAYERS - l) % 2]);
            gemm.linear_weight_grad(&sync.grad(l), d, &acts[l], SHAPE, s)?;
            if overlap {
                sync.ready(l, s)?;
            }
            if l > 0 {
                gemm.linear_input_grad(next, d, &w[l], SHAPE, s)?;
            }
        }
        Ok(())
    };
    // Every layer's weights end to end, as the sync lays out their gradients.
    let mut w_dp = mlp_cpu::random(LAYERS * WIDTH * WIDTH, 7, 1.0 / (WIDTH as f32).sqrt());
    let mut w_ref = w_dp.clone();
    let grads = |sync: &GradientSync<bf16>| -> nvshmem::Result<Vec<f32>> {
        Ok(sync.grads().to_vec()?.iter().map(|v| v.to_f32()).collect())
    };
    let upload = |all: &[bf16]| {
        w.iter()
            .zip(all.chunks(WIDTH * WIDTH))
            .try_for_each(|(d, h)| d.copy_from_host(h))
    };
    for step in 0..STEPS {
        // The data-parallel step: this PE's batch, buckets summed under the backward pass.
        upload(&w_dp)?;
        pass(&mut sync, step, me, true)?;
        sync.wait(s)?;
        update(&mut w_dp, &grads(&sync)?, n);

        // The single-GPU run: every PE's batch here, the gradients summed on the host as
        // our all-reduce sums bf16 (in f32, in PE order, rounded once).
        upload(&w_ref)?;
        let mut sum = vec![0f32; LAYERS * WIDTH * WIDTH];
        for pe in 0..n {
            pass(&mut sync, step, pe, false)?;
            for (a, b) in sum.iter_mut().zip(grads(&sync)?) {
                *a = if pe == 0 { b } else { *a + b };
            }
        }
        let rounded: Vec<f32> = sum.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        update(&mut w_ref, &rounded, n);

        let same_as_reference = w_dp
            .iter()
            .zip(&w_ref)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let hash = w_dp.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
        });
        let same_everywhere = same_on_every_pe(&shmem, hash)?;
        println!(
            "data_parallel: PE {me}/{n}: step {step}, {} buckets: weights equal the single-GPU \
             run: {same_as_reference}; the same on every PE: {same_everywhere}",
            sync.buckets().len()
        );
        if !(same_as_reference && same_everywhere) {
            std::process::exit(1);
        }
    }
    Ok(())
}
