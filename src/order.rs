//! Calls that share scratch on the GPU, ordered across streams and threads: a call enqueued on
//! another stream than the last call's waits, on the device, for everything that stream held
//! when the call was made, and no other thread's call is enqueued in between. Our collectives
//! (one epoch, flags and staging per `Collectives`) and a tensor-parallel group (one cuBLASLt
//! workspace, intermediate buffers, side streams) take their calls through one.

use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::{sys as cusys, CudaStream};
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

thread_local! {
    /// The orders this thread is inside of (their addresses), innermost last.
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// The order of one object's calls; see the module's documentation.
pub(crate) struct CallOrder {
    /// The stream of the last call.
    last: Mutex<Option<Arc<CudaStream>>>,
}

impl CallOrder {
    pub(crate) fn new() -> Self {
        CallOrder {
            last: Mutex::new(None),
        }
    }

    /// Run `enqueue`, which enqueues one call on `stream`, after the last call and with no
    /// other thread's call in between. On a thread already inside this order (a layer's
    /// call inside an MLP's), `enqueue` just runs: the outer call orders the whole.
    pub(crate) fn run<R>(
        &self,
        shmem: &Nvshmem,
        stream: &Arc<CudaStream>,
        enqueue: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let me = self as *const CallOrder as usize;
        if HELD.with(|held| held.borrow().contains(&me)) {
            return enqueue();
        }
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        order_after(shmem, last.as_ref(), stream)?;
        let _inside = Inside::enter(me);
        let out = enqueue();
        // Whatever was enqueued is this call's: the next one is ordered after it.
        *last = Some(Arc::clone(stream));
        out
    }
}

/// This thread inside an order while the value lives (left also when `enqueue` panics).
struct Inside;

impl Inside {
    fn enter(order: usize) -> Self {
        HELD.with(|held| held.borrow_mut().push(order));
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        HELD.with(|held| held.borrow_mut().pop());
    }
}

/// Order a call on `stream` after the last call, made on `last`: nothing when it is the same
/// stream; otherwise `stream` waits, on the device, for what `last` holds now. Two streams of
/// one capture (a fork inside it) are ordered the same way, by a graph edge. A call captured
/// while the last one ran outside the capture is not ordered (a capture cannot wait for work
/// outside it): a graph runs when it is launched, and its launches are the caller's to order
/// against other calls, as any stream's work.
fn order_after(
    shmem: &Nvshmem,
    last: Option<&Arc<CudaStream>>,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    let Some(last) = last.filter(|l| l.cu_stream() != stream.cu_stream()) else {
        return Ok(());
    };
    match (capture_of(shmem, last)?, capture_of(shmem, stream)?) {
        (Some(a), Some(b)) if a == b => stream.join(last).during("cuStreamWaitEvent"),
        (Some(_), _) => Err(Error::InvalidArgument(
            "a call on another stream while the last call's stream is still being captured \
             into another graph: end that capture first, or fork the stream from the captured \
             one (calls that share scratch are ordered, and a capture cannot be waited for from \
             outside)"
                .into(),
        )),
        (None, Some(_)) => Ok(()),
        (None, None) => stream.join(last).during("cuStreamWaitEvent"),
    }
}

/// The id of the capture `stream` takes part in (also one already invalidated), if any.
pub(crate) fn capture_of(shmem: &Nvshmem, stream: &Arc<CudaStream>) -> Result<Option<u64>> {
    use cusys::CUstreamCaptureStatus as Status;
    shmem.bind_context()?;
    let (mut status, mut id) = (Status::CU_STREAM_CAPTURE_STATUS_NONE, 0);
    use std::ptr::null_mut as null;
    // SAFETY: a live stream of this context; the outputs not asked for are null (optional).
    unsafe {
        cusys::cuStreamGetCaptureInfo_v3(
            stream.cu_stream(),
            &mut status,
            &mut id,
            null(),
            null(),
            null(),
            null(),
        )
    }
    .result()
    .during("cuStreamGetCaptureInfo")?;
    Ok((status != Status::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id))
}
