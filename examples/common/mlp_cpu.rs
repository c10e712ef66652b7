//! The tensor-parallel examples' data and CPU reference: seeded bf16 values (the same on
//! every PE) and a Llama MLP in f32. Included with `#[path]` by the programs that use it.

#![allow(dead_code)]

use nvshmem::bf16;

#[path = "splitmix.rs"]
mod splitmix;

/// `len` values in [-scale, scale), the same on every PE, rounded to bf16.
pub fn random(len: usize, seed: u64, scale: f32) -> Vec<bf16> {
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

/// The MLP on the CPU for `tokens` rows of `x`: y = down(silu(gate x) · up x), the product
/// rounded to bf16 as the GPU's input to the down projection is. `gate` and `up` are
/// ffn × hidden, `down` hidden × ffn.
pub fn mlp(gate: &[bf16], up: &[bf16], down: &[bf16], x: &[bf16], hidden: usize) -> Vec<f32> {
    let ffn = gate.len() / hidden;
    let mut y = Vec::with_capacity(x.len());
    for xt in x.chunks(hidden) {
        let xt: Vec<f32> = xt.iter().map(|v| v.to_f32()).collect();
        let (g, u) = (matvec(gate, &xt, ffn), matvec(up, &xt, ffn));
        let h: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| bf16::from_f32(g / (1.0 + (-g).exp()) * u).to_f32())
            .collect();
        y.extend(matvec(down, &h, hidden));
    }
    y
}

/// How many of `got` are off `want` by more than (|want| + RMS of `want`) / 64: bf16 outputs
/// and sums in another order than the CPU's.
pub fn off(got: &[bf16], want: &[f32]) -> usize {
    let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
    got.iter()
        .zip(want)
        .filter(|(g, w)| (g.to_f32() - **w).abs() > (w.abs() + rms) / 64.0)
        .count()
}
