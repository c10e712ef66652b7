//! Checking the outputs: the tolerance against the unsharded reference, the poisoned
//! outputs, the reference itself, and a hash of the bits to compare the PEs'.

use super::buffers::Buffers;
use super::mlp::Weights;
use super::{Ctx, TpImpl};
use crate::data;
use crate::error::{CudaExt, Guard, Result};
use half::bf16;
use nvshmem::tp::{LinearShape, TensorParallel};
use nvshmem::DeviceBuffer;

/// Tolerance per element against the unsharded reference, as a fraction of `|ref| +
/// rms(ref)`. The output is bf16 (relative spacing 2^-8), and gate, up, SiLU(gate)·up and
/// each PE's partial product are rounded to bf16 on the way, in a different order and over
/// other splits of the features than in the unsharded reference, so either may land on the
/// neighbouring bf16 at every rounding: a few output spacings of the element itself, plus as
/// much of the output's RMS for small elements that cancellation leaves carrying their
/// inputs' rounding. A wrong shard, a missing PE or swapped gate and up projections miss by
/// the order of the RMS itself.
const TOLERANCE: f64 = 1.0 / 64.0;

/// The tolerance of an implementation on `n` PEs. NCCL (and cuBLASMp, through NCCL) sums bf16
/// partial products in bf16: on more than 2 PEs each of its n - 1 additions rounds a running
/// sum, which cancellation may leave much larger than the result, so its output gets n - 1
/// times the tolerance (on 4 H200s a few elements in 10^7 were off by a bf16 spacing of
/// such a sum, the same elements with every NCCL protocol). Ours adds the partial products
/// in f32 and rounds once.
pub(super) fn tolerance(imp: TpImpl, n: usize) -> f64 {
    match imp {
        TpImpl::CublasNccl | TpImpl::Cublasmp => TOLERANCE * n.saturating_sub(1).max(1) as f64,
        _ => TOLERANCE,
    }
}

/// Fill the outputs of `imps` with 0xFF bytes (bf16 NaN), so that only what runs after
/// counts, then start together.
pub(super) fn poison(ctx: &Ctx, bufs: &Buffers, imps: &[TpImpl]) -> Result<()> {
    ctx.shmem
        .context()
        .bind_to_thread()
        .cuda("cuCtxSetCurrent")?;
    for &imp in imps {
        if let Some((ptr, bytes)) = bufs.output(imp) {
            // SAFETY: the output's own address and size.
            unsafe {
                cudarc::driver::result::memset_d8_async(ptr, 0xff, bytes, ctx.stream.cu_stream())
            }
            .cuda("cuMemsetD8Async")?;
        }
    }
    ctx.stream.synchronize().cuda("cuStreamSynchronize")?;
    ctx.coord.barrier()
}

/// The unsharded MLP of `x` on this GPU: the gate/up GEMM of all `2 ffn` features,
/// SiLU(gate)·up, the down GEMM over all `ffn` features.
pub(super) fn reference(
    ctx: &Ctx,
    tp: &TensorParallel,
    full: &Weights,
    x: &DeviceBuffer<bf16>,
    m: usize,
    hidden: usize,
    ffn: usize,
) -> Result<Vec<bf16>> {
    let stream = ctx.stream;
    let gu = Guard::new(ctx.shmem.alloc_device::<bf16>(m * 2 * ffn)?);
    let act = Guard::new(ctx.shmem.alloc_device::<bf16>(m * ffn)?);
    let y = Guard::new(ctx.shmem.alloc_device::<bf16>(m * hidden)?);
    let gemm = tp.gemm();
    gemm.linear(
        &*gu,
        x,
        &*full.gate_up,
        LinearShape {
            m,
            n: 2 * ffn,
            k: hidden,
        },
        stream,
    )?;
    tp.silu_mul(&*act, &*gu, m, stream)?;
    gemm.linear(
        &*y,
        &*act,
        &*full.down,
        LinearShape {
            m,
            n: hidden,
            k: ffn,
        },
        stream,
    )?;
    stream.synchronize().cuda("cuStreamSynchronize")?;
    Ok(y.to_vec()?)
}

/// FNV-1a over the bits, mixed: equal outputs give equal hashes.
pub(super) fn bits_hash(values: &[bf16]) -> u64 {
    let h = values.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        v.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
    });
    data::mix(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_tell_outputs_apart() {
        let a = [bf16::from_f32(1.0), bf16::from_f32(-2.0)];
        let b = [bf16::from_f32(1.0), bf16::from_f32(-2.015625)];
        assert_eq!(bits_hash(&a), bits_hash(&[a[0], a[1]]));
        assert_ne!(bits_hash(&a), bits_hash(&b));
        assert_ne!(bits_hash(&a), bits_hash(&a[..1]));
    }
}
