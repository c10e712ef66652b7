//! The hybrid example's weights: the model's full weights (the same on every PE), the SGD
//! update of this PE's shards, and their comparison with the single-GPU run. Included with
//! `#[path]`.

use super::stage::{Sizes, Stage};
use nvshmem::tp::{merged_rows, shard_range, take_cols};
use nvshmem::{bf16, GradientSync, Result};

#[path = "../mlp_cpu.rs"]
mod mlp_cpu;

/// Block `b`'s full gate, up and down weights and its norm's γ.
pub fn block(z: Sizes, b: usize) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>, Vec<bf16>) {
    let (h, f, seed) = (z.hidden, z.ffn, 100 * b as u64);
    let (sh, sf) = (1.0 / (h as f32).sqrt(), 1.0 / (f as f32).sqrt());
    let gamma = mlp_cpu::random(h, seed + 3, 0.25);
    let gamma = gamma
        .iter()
        .map(|g| bf16::from_f32(1.0 + g.to_f32()))
        .collect();
    let (gate, up) = (
        mlp_cpu::random(f * h, seed, sh),
        mlp_cpu::random(f * h, seed + 1, sh),
    );
    (gate, up, mlp_cpu::random(h * f, seed + 2, sf), gamma)
}

/// Micro-batch `j` of replica `d` at `step`: `tokens × hidden` inputs.
pub fn input(z: Sizes, step: u64, d: usize, j: usize) -> Vec<bf16> {
    mlp_cpu::random(
        z.tokens * z.hidden,
        7000 + 1000 * step + 10 * d as u64 + j as u64,
        1.0,
    )
}

/// `w = bf16(w − lr · g)` for every weight of `stage`, with the gradients `sync` holds;
/// returns each parameter's update `lr · g`.
pub fn update(stage: &Stage, sync: &GradientSync<bf16>, lr: f32) -> Result<Vec<Vec<f32>>> {
    let mut moved = Vec::new();
    for (p, w) in of(stage)?.into_iter().enumerate() {
        let u: Vec<f32> = sync
            .grad(p)
            .to_vec()?
            .iter()
            .map(|g| lr * g.to_f32())
            .collect();
        let new: Vec<bf16> = w
            .iter()
            .zip(&u)
            .map(|(w, u)| bf16::from_f32(w.to_f32() - u))
            .collect();
        let mlp = &stage.blocks[p / 2];
        match p % 2 {
            0 => mlp.gate_up().weight().copy_from_host(&new)?,
            _ => mlp.down().weight().copy_from_host(&new)?,
        }
        moved.push(u);
    }
    Ok(moved)
}

/// Every parameter of `stage`: each block's gate/up weight (this PE's rows), then its down
/// projection's (this PE's columns).
pub fn of(stage: &Stage) -> Result<Vec<Vec<bf16>>> {
    let each = |m: &nvshmem::tp::TpMlp| [m.gate_up().weight().to_vec(), m.down().weight().to_vec()];
    stage.blocks.iter().flat_map(each).collect()
}

/// The part of the whole model's parameters `full` (in [`of`]'s order) that group PE `t` of
/// `tp` holds of `blocks` blocks from `first` on.
pub fn shards<T: Copy>(
    full: &[Vec<T>],
    (first, blocks): (usize, usize),
    (t, tp): (usize, usize),
    z: Sizes,
) -> Vec<Vec<T>> {
    let (h, f) = (z.hidden, z.ffn);
    (first..first + blocks)
        .flat_map(|b| {
            [
                merged_rows(&full[2 * b], h, &[f, f], t, tp),
                take_cols(&full[2 * b + 1], f, shard_range(f, t, tp)),
            ]
        })
        .collect()
}

fn rms<T: Copy + Into<f64>>(v: &[T]) -> f64 {
    (v.iter().map(|&x| x.into().powi(2)).sum::<f64>() / v.len().max(1) as f64).sqrt()
}

/// How far each weight may be from the single-GPU run's, summed over the steps so far: per
/// step, a bf16 step of the weight (2^-7 of it at most), (|w| + RMS of w) / 128, and 2^-4 of
/// the RMS of the step's update (the gradients pass through two rounded products and a
/// rounded partial sum per block, 2^-8 each, over up to 4 blocks on their way back).
#[derive(Default)]
pub struct Tolerance(Vec<Vec<f64>>);

impl Tolerance {
    /// Add a step's allowance, from the single-GPU run's weights and updates (this PE's part).
    pub fn add(&mut self, want: &[Vec<bf16>], moved: &[Vec<f32>]) {
        self.0.resize(want.len(), Vec::new());
        for ((b, w), u) in self.0.iter_mut().zip(want).zip(moved) {
            let (rw, ru) = (
                rms(&w.iter().map(|x| x.to_f64()).collect::<Vec<_>>()),
                rms(u),
            );
            b.resize(w.len(), 0.0);
            for (b, w) in b.iter_mut().zip(w) {
                *b += (w.to_f64().abs() + rw) / 128.0 + ru / 16.0;
            }
        }
    }

    /// The worst ratio of a weight's distance from the single-GPU run's to its allowance.
    pub fn worst(&self, got: &[Vec<bf16>], want: &[Vec<bf16>]) -> f64 {
        let mut worst = 0.0f64;
        for ((g, w), b) in got.iter().zip(want).zip(&self.0) {
            for ((g, w), b) in g.iter().zip(w).zip(b) {
                let r = (g.to_f64() - w.to_f64()).abs() / b;
                worst = worst.max(if r.is_nan() { f64::INFINITY } else { r }); // NaN fails
            }
        }
        worst
    }
}

/// A hash of this PE's weights.
pub fn hash(stage: &Stage) -> Result<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in of(stage)?.into_iter().flatten() {
        h = (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3);
    }
    Ok(h)
}
