//! One small kernel's round trip on a stream: its input words to the device, the launch, its
//! output words back, waited for. What the page pool's and the map's host calls that answer
//! at once (allocations, checks, single keys) are made of.

use crate::error::{CudaResultExt, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, CudaStream};
use std::sync::Arc;

/// On `stream`: `input` to device memory, `launch(input, output)` (device addresses; the
/// output follows the input, 16-byte aligned when the input is an even number of words),
/// `out_len` words of output back; waits. The memory is this call's own, so host calls from
/// several threads do not meet.
pub(crate) fn round_trip(
    shmem: &Nvshmem,
    stream: &Arc<CudaStream>,
    input: &[u64],
    out_len: usize,
    launch: impl FnOnce(u64, u64) -> Result<()>,
) -> Result<Vec<u64>> {
    shmem.bind_context()?;
    let s = stream.cu_stream();
    let words = (input.len() + out_len).max(1);
    // SAFETY: memory of this call on `stream`, freed after its last use there.
    let base = unsafe { cu::malloc_async(s, 8 * words) }.during("cuMemAllocAsync")?;
    let out_ptr = base + 8 * input.len() as u64;
    let mut out = vec![0u64; out_len];
    let result = (|| {
        if !input.is_empty() {
            // SAFETY: `input` fits the allocation's first words.
            unsafe { cu::memcpy_htod_async(base, input, s) }.during("cuMemcpyHtoDAsync")?;
        }
        launch(base, out_ptr)?;
        if out_len > 0 {
            // SAFETY: `out` has out_len words, the allocation's last; waited for below.
            unsafe { cu::memcpy_dtoh_async(&mut out, out_ptr, s) }.during("cuMemcpyDtoHAsync")?;
        }
        Ok(())
    })();
    // SAFETY: enqueued after every use above.
    let freed = unsafe { cu::free_async(base, s) }.during("cuMemFreeAsync");
    let synced = stream.synchronize().during("cuStreamSynchronize");
    result.and(freed).and(synced)?;
    Ok(out)
}
