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
use nvshmem::{bf16, Collectives, DeviceBuffer, GradSyncConfig, GradientSync, Nvshmem, ReduceOp};

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

/// The layers on this GPU: weights, and the activations of one pass.
struct Model {
    gemm: Gemm,
    w: Vec<DeviceBuffer<bf16>>,
    acts: Vec<DeviceBuffer<bf16>>,
    dy: [DeviceBuffer<bf16>; 2],
}

const SHAPE: LinearShape = LinearShape {
    m: TOKENS,
    n: WIDTH,
    k: WIDTH,
};

impl Model {
    /// Forward and backward on batch `(step, pe)` with loss ½‖y − target‖²: each layer's
    /// weight gradient into `sync.grad(layer)`, last layer first, `ready` after each when
    /// `overlap` (the data-parallel step), nothing else (the single-GPU run's passes).
    fn pass(
        &self,
        shmem: &Nvshmem,
        sync: &mut GradientSync<bf16>,
        step: u64,
        pe: usize,
        overlap: bool,
    ) -> nvshmem::Result<()> {
        let s = shmem.stream();
        self.acts[0].copy_from_host(&mlp_cpu::random(
            TOKENS * WIDTH,
            1000 + 64 * step + pe as u64,
            1.0,
        ))?;
        for l in 0..LAYERS {
            self.gemm
                .linear(&self.acts[l + 1], &self.acts[l], &self.w[l], SHAPE, s)?;
        }
        // The loss gradient, y − target, on the host.
        let target = mlp_cpu::random(TOKENS * WIDTH, 5000 + 64 * step + pe as u64, 1.0);
        let y = self.acts[LAYERS].to_vec()?;
        let dy: Vec<bf16> = y
            .iter()
            .zip(&target)
            .map(|(a, b)| bf16::from_f32(a.to_f32() - b.to_f32()))
            .collect();
        self.dy[0].copy_from_host(&dy)?;
        for l in (0..LAYERS).rev() {
            let (d, next) = (&self.dy[(LAYERS - 1 - l) % 2], &self.dy[(LAYERS - l) % 2]);
            self.gemm
                .linear_weight_grad(&sync.grad(l), d, &self.acts[l], SHAPE, s)?;
            if overlap {
                sync.ready(l, s)?;
            }
            if l > 0 {
                self.gemm.linear_input_grad(next, d, &self.w[l], SHAPE, s)?;
            }
        }
        Ok(())
    }
}

/// `w - lr / n · g` for every weight, in f32, rounded to bf16: the same on both runs.
fn update(w: &mut [Vec<bf16>], g: &[Vec<f32>], n: usize) {
    for (wl, gl) in w.iter_mut().zip(g) {
        for (x, d) in wl.iter_mut().zip(gl) {
            *x = bf16::from_f32(x.to_f32() - LR / n as f32 * d);
        }
    }
}

fn run() -> nvshmem::Result<()> {
    let shmem = Nvshmem::init()?;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let coll = Collectives::new(&shmem)?;
    let config = GradSyncConfig {
        bucket_bytes: 4 << 20,
        compression: None,
    };
    let mut sync = GradientSync::<bf16>::new(&shmem, &coll, &[WIDTH * WIDTH; LAYERS], config)?;
    let buf = |len| shmem.alloc_device::<bf16>(len);
    let model = Model {
        gemm: Gemm::new(&shmem)?,
        w: (0..LAYERS)
            .map(|_| buf(WIDTH * WIDTH))
            .collect::<nvshmem::Result<_>>()?,
        acts: (0..=LAYERS)
            .map(|_| buf(TOKENS * WIDTH))
            .collect::<nvshmem::Result<_>>()?,
        dy: [buf(TOKENS * WIDTH)?, buf(TOKENS * WIDTH)?],
    };
    let scale = 1.0 / (WIDTH as f32).sqrt();
    let mut w_dp: Vec<Vec<bf16>> = (0..LAYERS)
        .map(|l| mlp_cpu::random(WIDTH * WIDTH, l as u64, scale))
        .collect();
    let mut w_ref = w_dp.clone();
    let download = |sync: &GradientSync<bf16>| -> nvshmem::Result<Vec<Vec<f32>>> {
        (0..LAYERS)
            .map(|l| Ok(sync.grad(l).to_vec()?.iter().map(|v| v.to_f32()).collect()))
            .collect()
    };
    let result = shmem.malloc::<i64>(4)?;
    for step in 0..STEPS {
        // The data-parallel step: this PE's batch, buckets summed under the backward pass.
        for (d, w) in model.w.iter().zip(&w_dp) {
            d.copy_from_host(w)?;
        }
        model.pass(&shmem, &mut sync, step, me, true)?;
        sync.wait(shmem.stream())?;
        let summed = download(&sync)?;
        update(&mut w_dp, &summed, n);

        // The single-GPU run: every PE's batch here, the gradients summed on the host as
        // our all-reduce sums bf16 (in f32, in PE order, rounded once).
        for (d, w) in model.w.iter().zip(&w_ref) {
            d.copy_from_host(w)?;
        }
        let mut sum = vec![vec![0f32; WIDTH * WIDTH]; LAYERS];
        for pe in 0..n {
            model.pass(&shmem, &mut sync, step, pe, false)?;
            for (s, g) in sum.iter_mut().zip(download(&sync)?) {
                s.iter_mut()
                    .zip(g)
                    .for_each(|(a, b)| *a = if pe == 0 { b } else { *a + b });
            }
        }
        let sum: Vec<Vec<f32>> = sum
            .iter()
            .map(|l| l.iter().map(|&v| bf16::from_f32(v).to_f32()).collect())
            .collect();
        update(&mut w_ref, &sum, n);

        let bits = |w: &[Vec<bf16>]| w.iter().flatten().map(|v| v.to_bits()).collect::<Vec<_>>();
        let same_as_reference = bits(&w_dp) == bits(&w_ref);
        // Every PE's weights the same bits: the largest and smallest hash over PEs agree.
        let hash = bits(&w_dp).iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &v| {
            (h ^ v as u64).wrapping_mul(0x100_0000_01b3)
        });
        let h = hash as i64 >> 1;
        result.view(..2).copy_from_host(&[h, -h])?;
        shmem.team_world().all_reduce(
            result.view(2..),
            result.view(..2),
            ReduceOp::Max,
            shmem.stream(),
        )?;
        let got = result.to_vec()?;
        let same_everywhere = got[2] == -got[3];
        println!(
            "data_parallel: PE {me}/{n}: step {step}: {} parameters in {} buckets; weights equal the single-GPU run: {same_as_reference}; the same on every PE: {same_everywhere}",
            LAYERS * WIDTH * WIDTH,
            sync.buckets().len()
        );
        if !(same_as_reference && same_everywhere) {
            std::process::exit(1);
        }
    }
    Ok(())
}
