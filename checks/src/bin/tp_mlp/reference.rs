//! The f64 CPU references the layers are checked against, the random data they run on, and
//! the comparisons within the tolerance the program's documentation justifies.

use nvshmem::bf16;
use nvshmem::tp::{shard_range, take_cols, LinearShape};
use nvshmem_checks::splitmix::{SplitMix64, GOLDEN};

use crate::harness::Outcome;

/// Random values of one check: the same on every PE for the same seed.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64(seed.wrapping_mul(GOLDEN) ^ 0x5EED))
    }
    /// Uniform in [-scale, scale), as bf16.
    pub fn bf16s(&mut self, n: usize, scale: f32) -> Vec<bf16> {
        (0..n)
            .map(|_| {
                let u = (self.0.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                bf16::from_f32(u * scale)
            })
            .collect()
    }
}

/// A weight of `rows × cols` scaled so that products with unit inputs stay near 1.
pub fn weight(rng: &mut Rng, rows: usize, cols: usize) -> Vec<bf16> {
    rng.bf16s(rows * cols, (3.0 / cols as f32).sqrt())
}

fn round_bf16(v: f64) -> f64 {
    bf16::from_f64(v).to_f64()
}

/// `x · wᵀ` in f64: `x` is `m × k`, `w` is `n × k`.
pub fn matmul(x: &[bf16], w: &[bf16], m: usize, n: usize, k: usize) -> Vec<f64> {
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let wf: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] = (0..k).map(|l| xf[i * k + l] * wf[j * k + l]).sum();
        }
    }
    y
}

/// The row-parallel product as the layer computes it: each PE's partial product rounded to
/// bf16, then summed; and for each element its largest partial product (in magnitude).
pub fn row_parallel(
    x: &[bf16],
    w: &[bf16],
    m: usize,
    n: usize,
    k: usize,
    n_pes: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; m * n];
    let mut largest = vec![0.0f64; m * n];
    for pe in 0..n_pes {
        let r = shard_range(k, pe, n_pes);
        let part = matmul(
            &take_cols(x, k, r.clone()),
            &take_cols(w, k, r.clone()),
            m,
            n,
            r.len(),
        );
        for ((acc, big), p) in y.iter_mut().zip(&mut largest).zip(part) {
            *acc += round_bf16(p);
            *big = big.max(p.abs());
        }
    }
    (y, largest)
}

fn silu_times(g: f64, u: f64) -> f64 {
    g / (1.0 + (-g).exp()) * u
}

/// The MLP as the layers compute it, rounding where they round, and for each output its
/// largest term |act_j · down_ij| (see the tolerance).
pub fn mlp_reference(
    x: &[bf16],
    (gate, up, down): (&[bf16], &[bf16], &[bf16]),
    m: usize,
    hidden: usize,
    ffn: usize,
    n_pes: usize,
) -> (Vec<f64>, Vec<f64>) {
    let g = matmul(x, gate, m, ffn, hidden);
    let u = matmul(x, up, m, ffn, hidden);
    let act: Vec<bf16> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| bf16::from_f64(silu_times(round_bf16(g), round_bf16(u))))
        .collect();
    let largest_term = (0..m * hidden)
        .map(|e| {
            let (i, o) = (e / hidden, e % hidden);
            (0..ffn)
                .map(|j| (act[i * ffn + j].to_f64() * down[o * ffn + j].to_f64()).abs())
                .fold(0.0, f64::max)
        })
        .collect();
    (
        row_parallel(&act, down, m, hidden, ffn, n_pes).0,
        largest_term,
    )
}

/// `got` against `want` within the tolerance the program's documentation justifies, for a
/// `want` that rounds where the layer rounds: then nearly every element must also have
/// exactly `want`'s bf16 bits (see the program's documentation).
pub fn compare(what: &str, got: &[bf16], want: &[f64]) -> Outcome {
    compare_row(what, got, (want, &[]))
}

/// [`compare`] for a row-parallel output, whose elements may also differ by 2^-7 of their
/// largest partial product (`terms`, see the program's documentation).
pub fn compare_row(what: &str, got: &[bf16], (want, terms): (&[f64], &[f64])) -> Outcome {
    compare_with(what, got, want, terms, 1.0 / 128.0)?;
    let off = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g.to_bits() != bf16::from_f64(**w).to_bits())
        .count();
    if off > (got.len() / 100).max(1) {
        return Err(format!(
            "{what}: {off} of {} elements are not the bf16 nearest to the reference (at most \
             1% may differ, by f32 against f64 sums)",
            got.len()
        ));
    }
    Ok(())
}

/// `got` against the unsharded product on one GPU, which rounds no partial product: 2^-6
/// (see the program's documentation).
pub fn compare_unsharded(what: &str, got: &[bf16], want: &[f64]) -> Outcome {
    compare_with(what, got, want, &[], 1.0 / 64.0)
}

/// `y = x · wᵀ` from one GPU GEMM (a reference for the layers) against f64 sums on 512
/// elements picked at random: within 2^-7 of each element plus the sampled RMS, as
/// [`compare`] (the large shapes are too large to recompute whole on the CPU).
pub fn sampled(
    what: &str,
    y: &[bf16],
    x: &[bf16],
    w: &[bf16],
    shape: LinearShape,
    seed: u64,
) -> Outcome {
    let LinearShape { m, n, k } = shape;
    let mut pick = SplitMix64(seed ^ 0x5A3F);
    let picked: Vec<usize> = (0..512)
        .map(|_| (pick.next_u64() % (m * n) as u64) as usize)
        .collect();
    let want: Vec<f64> = picked
        .iter()
        .map(|&e| {
            let (i, j) = (e / n, e % n);
            (0..k)
                .map(|l| x[i * k + l].to_f64() * w[j * k + l].to_f64())
                .sum()
        })
        .collect();
    let got: Vec<bf16> = picked.iter().map(|&e| y[e]).collect();
    compare_with(what, &got, &want, &[], 1.0 / 128.0)
        .map_err(|e| format!("{e} (among 512 sampled elements)"))
}

/// [`compare`] with relative tolerance `scale`, each element also allowed `scale` of its
/// `largest_term` (empty: none).
pub fn compare_with(
    what: &str,
    got: &[bf16],
    want: &[f64],
    largest_term: &[f64],
    scale: f64,
) -> Outcome {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    if want.is_empty() {
        return Ok(());
    }
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g.to_f64() - w).abs();
        // A NaN output counts as infinitely wrong.
        let term = largest_term.get(i).copied().unwrap_or(0.0);
        let ratio = match err / (scale * (w.abs() + rms + term)) {
            r if r.is_nan() => f64::INFINITY,
            r => r,
        };
        if ratio > worst.0 {
            worst = (ratio, i);
        }
    }
    if worst.0 > 1.0 {
        let i = worst.1;
        return Err(format!(
            "{what}: element {i} is {} where {} was expected (error {:.1}x the tolerance; \
             output RMS {rms:.3e})",
            got[i], want[i], worst.0
        ));
    }
    Ok(())
}

pub fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}
