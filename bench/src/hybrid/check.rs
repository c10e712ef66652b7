//! The hybrid step's checks: a row's summed gradients against the single-GPU run's on every
//! PE, with every replica's bits the same; the compute row's replays against one more run.

use crate::coord::Coord;
use crate::error::{CudaExt, Result};
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem::{AllGatherAlgo, Collectives, GradientSync, Nvshmem, ReduceOp};

/// A row's check: whether it failed, and what it says.
pub struct Verdict {
    pub failed: bool,
    pub text: String,
}

impl Verdict {
    pub fn ok(text: String) -> Self {
        Verdict {
            failed: false,
            text,
        }
    }
}

/// Every parameter's gradient in `sync`, once the work on `s` is done.
pub fn download(sync: &GradientSync<bf16>, s: &CudaStream) -> Result<Vec<Vec<bf16>>> {
    s.synchronize().cuda("cuStreamSynchronize")?;
    let params = sync.buckets().iter().map(|b| b.end).max().unwrap_or(0);
    Ok((0..params)
        .map(|p| sync.grad(p).to_vec())
        .collect::<nvshmem::Result<_>>()?)
}

/// The worst ratio of a gradient's distance from the single-GPU run's to its allowance:
/// 2^-6 of the RMS of the gradient per block (on its way back a gradient passes, in each
/// block, two products and a norm rounded to bf16, 2^-8 each, which the single-GPU run may
/// round the other way, or sum in another order where the GEMM path differs), plus 2^-5 of
/// itself.
pub fn worst_ratio(got: &[Vec<bf16>], want: &[Vec<bf16>], blocks: usize) -> f64 {
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        let rms =
            (w.iter().map(|x| x.to_f64().powi(2)).sum::<f64>() / w.len().max(1) as f64).sqrt();
        for (g, w) in g.iter().zip(w) {
            let allowed = blocks as f64 * rms / 64.0 + w.to_f64().abs() / 32.0;
            let ratio = (g.to_f64() - w.to_f64()).abs() / allowed.max(f64::MIN_POSITIVE);
            // A NaN would pass every comparison: it counts as the worst there is.
            worst = worst.max(if ratio.is_nan() { f64::INFINITY } else { ratio });
        }
    }
    worst
}

/// This PE's gradients `got` against the single-GPU run's shard `want`, and every replica's
/// bits (their hashes gathered over `replicas`); the verdict of every PE.
pub fn against(
    (coord, shmem): (&Coord, &Nvshmem),
    replicas: &Collectives,
    (got, want): (&[Vec<bf16>], &[Vec<bf16>]),
    blocks: usize,
    s: &std::sync::Arc<CudaStream>,
) -> Result<Verdict> {
    let worst = worst_ratio(got, want, blocks);
    let (hash, hashes) = (
        shmem.malloc::<u64>(1)?,
        shmem.malloc::<u64>(replicas.n_pes())?,
    );
    let h = got.iter().flatten().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
    });
    hash.copy_from_host(&[h])?;
    replicas.all_gather(&hashes, &hash, AllGatherAlgo::Auto, s)?;
    s.synchronize().cuda("cuStreamSynchronize")?;
    let seen = hashes.to_vec()?;
    let bad = u64::from(worst > 1.0 || seen.iter().any(|&x| x != seen[0]));
    let failed = coord.sum(bad)?;
    let milli = (worst * 1000.0).min(u64::MAX as f64 / 2.0) as u64;
    let worst = coord.reduce(ReduceOp::Max, &[milli])?[0] as f64 / 1000.0;
    Ok(match failed {
        0 => Verdict::ok(format!("ok (gradients {worst:.2} of the tolerance)")),
        k => Verdict {
            failed: true,
            text: format!(
                "{k} PE(s): gradients {worst:.2} of the tolerance from the single-GPU run, \
                 or replicas that differ"
            ),
        },
    })
}

/// The compute row's replays (`replayed`, written over zeros) against one more run of it
/// (`again`): the same bits, and not all zero. This PE's verdict.
pub fn replays(replayed: &[Vec<bf16>], again: &[Vec<bf16>]) -> Option<String> {
    let bits = |v: &[Vec<bf16>]| -> Vec<u16> { v.iter().flatten().map(|x| x.to_bits()).collect() };
    let (a, b) = (bits(replayed), bits(again));
    if a != b {
        let at = a
            .iter()
            .zip(&b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len());
        return Some(format!(
            "the replays' gradients differ from a run's at element {at}"
        ));
    }
    if a.iter().all(|&x| x & 0x7fff == 0) {
        return Some("the replays wrote no gradient".into());
    }
    None
}

/// Every PE's verdict from its own (`why` it failed, if it did).
pub fn everywhere(coord: &Coord, why: Option<String>) -> Result<Verdict> {
    let failed = coord.sum(u64::from(why.is_some()))?;
    Ok(match (failed, why) {
        (0, _) => Verdict::ok("ok (its replays equal a run of it)".into()),
        (k, Some(why)) => Verdict {
            failed: true,
            text: format!("{k} PE(s); here: {why}"),
        },
        (k, None) => Verdict {
            failed: true,
            text: format!("{k} PE(s): the replays' gradients differ from a run's"),
        },
    })
}
