//! Calls that share state on the GPU, ordered across streams and threads: a call enqueued on
//! another stream than the last call's waits, on the device, for everything that stream held
//! when the call was made, and no other thread's call is enqueued in between. Our collectives
//! (one epoch, flags and staging per `Collectives`), a tensor-parallel group (one cuBLASLt
//! workspace, intermediate buffers, side streams) and each end of a channel (its position in
//! device memory, which its kernel reads, then advances) take their calls through one.

use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::{CudaEvent, CudaStream};
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

thread_local! {
    /// The orders this thread is inside of (their addresses), innermost last.
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// This thread's event of each context, recorded again for every use (see [`join`]).
    static EVENTS: RefCell<Vec<CudaEvent>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` with this thread's event of `stream`'s context, just recorded on `stream`.
///
/// Not a new event each time, as cudarc's `CudaStream::join` makes: creating (and destroying)
/// an event waits for a lock of the driver that a thread inside a blocking call (a stream or
/// context synchronisation) can hold until the GPU is done. Beside kernels that wait for
/// other PEs, that held back every CUDA call of the process (stress check dumps:
/// `cuEventCreate` under `CallOrder::run`). Reusing one is sound: a wait, or a query, takes
/// the event's state when it is made.
fn with_recorded<R>(stream: &CudaStream, f: impl FnOnce(&CudaEvent) -> Result<R>) -> Result<R> {
    EVENTS.with(|events| {
        let mut events = events.borrow_mut();
        let ctx = stream.context();
        let i = match events.iter().position(|e| e.context() == ctx) {
            Some(i) => i,
            None => {
                events.push(ctx.new_event(None).during("cuEventCreate")?);
                events.len() - 1
            }
        };
        events[i].record(stream).during("cuEventRecord")?;
        f(&events[i])
    })
}

/// `waiter` waits, on the device, for what `on` holds now.
pub(crate) fn join(waiter: &CudaStream, on: &CudaStream) -> Result<()> {
    with_recorded(on, |event| waiter.wait(event).during("cuStreamWaitEvent"))
}

/// What a call on one stream does to follow the last call, made on another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Follow {
    /// Wait, on the device, for what the last call's stream holds now.
    Wait,
    /// Nothing: the call is captured into a graph and the last one ran outside it (a capture
    /// cannot wait for work outside it). A graph runs when it is launched, and its launches
    /// are the caller's to order, as any stream's work.
    Nothing,
    /// Refuse the call: the last call's stream is being captured into another graph, which
    /// nothing outside it can wait for.
    Refuse,
}

/// How a call on a stream in capture `next` (`None`: not capturing) follows the last call,
/// made on another stream, in capture `last`. Two streams of one capture (a fork inside it)
/// are ordered by a graph edge.
pub(crate) fn follow(last: Option<u64>, next: Option<u64>) -> Follow {
    match (last, next) {
        (Some(a), Some(b)) if a == b => Follow::Wait,
        (Some(_), _) => Follow::Refuse,
        (None, Some(_)) => Follow::Nothing,
        (None, None) => Follow::Wait,
    }
}

/// The order of one object's calls; see the module's documentation.
#[derive(Default)]
pub(crate) struct CallOrder {
    /// The stream of the last call.
    last: Mutex<Option<Arc<CudaStream>>>,
}

impl CallOrder {
    pub(crate) fn new() -> Self {
        CallOrder::default()
    }

    /// Run `enqueue`, which enqueues one call on `stream`, after the last call and with no
    /// other thread's call in between; `what` names the call in an error. On a thread
    /// already inside this order (a layer's call inside an MLP's), `enqueue` just runs: the
    /// outer call orders the whole.
    pub(crate) fn run<R>(
        &self,
        shmem: &Nvshmem,
        stream: &Arc<CudaStream>,
        what: &str,
        enqueue: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let me = self as *const CallOrder as usize;
        if HELD.with(|held| held.borrow().contains(&me)) {
            return enqueue();
        }
        let mut last = self.lock();
        if let Some(l) = last
            .as_ref()
            .filter(|l| l.cu_stream() != stream.cu_stream())
        {
            match follow(shmem.capture_id(l)?, shmem.capture_id(stream)?) {
                Follow::Wait => join(stream, l)?,
                Follow::Nothing => {}
                Follow::Refuse => {
                    return Err(Error::InvalidArgument(format!(
                        "{what} on another stream while the last such call's stream is still \
                         being captured into another graph: end that capture first, or fork \
                         this stream from the captured one (these calls run in order, and a \
                         capture cannot be waited for from outside it)"
                    )))
                }
            }
        }
        let _inside = Inside::enter(me);
        let out = enqueue();
        // Whatever was enqueued is this call's: the next one is ordered after it.
        *last = Some(Arc::clone(stream));
        out
    }

    /// Wait until the work of the last call is done, until `deadline`: `Ok(false)` when it
    /// is not done by then. Nothing to wait for when no call was made.
    pub(crate) fn wait_idle(&self, shmem: &Nvshmem, deadline: Instant) -> Result<bool> {
        let last = self.lock();
        let Some(stream) = last.as_ref() else {
            return Ok(true);
        };
        if shmem.capture_id(stream)?.is_some() {
            return Err(Error::InvalidArgument(
                "dropped while the stream of its last call is being captured".into(),
            ));
        }
        with_recorded(stream, |done| loop {
            if done.try_is_complete().during("cuEventQuery")? {
                return Ok(true);
            }
            if Instant::now() > deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(500));
        })
    }

    fn lock(&self) -> MutexGuard<'_, Option<Arc<CudaStream>>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_on_another_stream_waits_for_the_last_one() {
        assert_eq!(follow(None, None), Follow::Wait);
        // Two streams of one capture: an edge of the graph.
        assert_eq!(follow(Some(7), Some(7)), Follow::Wait);
    }

    #[test]
    fn a_capture_does_not_wait_for_work_outside_it() {
        assert_eq!(follow(None, Some(7)), Follow::Nothing);
    }

    #[test]
    fn a_stream_of_another_capture_is_refused() {
        assert_eq!(follow(Some(7), Some(8)), Follow::Refuse);
        assert_eq!(follow(Some(7), None), Follow::Refuse);
    }
}
