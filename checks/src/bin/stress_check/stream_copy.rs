//! Stream-ordered copies between the host and symmetric memory, for the threads that must
//! not wait for the host library's lock.

use crate::outcome::Outcome;
use nvshmem::cudarc::driver::DeviceRepr;
use nvshmem::{CudaStream, Element, SymmetricView};
use std::sync::Arc;

/// Copy `data` into `view` on `stream` (stream-ordered: no host library lock).
pub(crate) fn upload<T: Element + DeviceRepr>(
    stream: &Arc<CudaStream>,
    mut view: SymmetricView<'_, T>,
    data: &[T],
) -> Outcome {
    stream.memcpy_htod(data, &mut view)?;
    Ok(())
}

/// `view` after the work on `stream`, waited for before the copy: a copy into pageable memory
/// that waits inside the driver for a kernel that waits for a peer holds up this process's
/// other copies and launches there, which the peer may be waiting for.
pub(crate) fn download<T: Element + DeviceRepr>(
    stream: &Arc<CudaStream>,
    view: SymmetricView<'_, T>,
) -> Outcome<Vec<T>> {
    let mut out = vec![T::default(); view.len()];
    stream.synchronize()?;
    stream.memcpy_dtoh(&view, &mut out)?;
    stream.synchronize()?;
    Ok(out)
}
