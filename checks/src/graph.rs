//! CUDA graph capture for the check programs.

use nvshmem::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use nvshmem::cudarc::driver::{CudaGraph, CudaStream};
use nvshmem::Error;
use std::sync::Arc;

/// What `op` enqueues on `stream`, captured into a graph (this thread's work only). The
/// capture is ended even when `op` fails, so that the stream is usable again.
pub fn capture(
    stream: &Arc<CudaStream>,
    op: impl FnOnce() -> Result<(), Error>,
) -> Result<CudaGraph, Error> {
    let driver = |call| move |source| Error::Cuda { call, source };
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(driver("cuStreamBeginCapture"))?;
    let captured = op();
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .map_err(driver("cuStreamEndCapture"))?;
    captured?;
    graph.ok_or_else(|| Error::InvalidArgument("the capture produced no graph".into()))
}
