//! The order of one end's calls. An end keeps its position in device memory, which its kernel
//! reads and then advances: two of its kernels running at once would claim the same slot (or
//! message). So an end remembers the stream of its last call, and a call on another stream
//! first makes that stream wait, on the device, for what the last one holds (an event). Calls
//! from any threads, on any streams, then run on the GPU in the order they were made.

use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::CudaStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// One end of a channel on this PE: the stream of its last call.
#[derive(Default)]
pub(crate) struct End {
    last: Mutex<Option<Arc<CudaStream>>>,
}

impl End {
    /// Run `call` (which enqueues the end's work on `stream`) after the end's last call, and
    /// alone: no other call on this end starts until it returns. `what` names the call in an
    /// error.
    pub(crate) fn take_turn<R>(
        &self,
        shmem: &Nvshmem,
        stream: &Arc<CudaStream>,
        what: &str,
        call: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let mut last = self.lock();
        if let Some(l) = last
            .as_ref()
            .filter(|l| l.cu_stream() != stream.cu_stream())
        {
            match follow(shmem.capture_id(l)?, shmem.capture_id(stream)?) {
                Follow::Wait => stream.join(l).during("cuStreamWaitEvent")?,
                Follow::Nothing => {}
                Follow::Refuse => {
                    return Err(Error::InvalidArgument(format!(
                        "{what} on another stream while the last call on this end of the \
                         channel is on a stream still being captured into another graph: end \
                         that capture first, or fork this stream from the captured one (an end \
                         runs its calls in order, and a capture cannot be waited for from \
                         outside it)"
                    )))
                }
            }
        }
        let out = call();
        // Whatever was enqueued is this call's, and `stream` now follows the last one: the next
        // call is ordered after it.
        *last = Some(Arc::clone(stream));
        out
    }

    /// Wait until the work of the end's last call is done, until `deadline`: `Ok(false)` when
    /// it is not done by then. Nothing to wait for when the end was never used.
    pub(crate) fn wait_idle(&self, shmem: &Nvshmem, deadline: Instant) -> Result<bool> {
        let last = self.lock();
        let Some(stream) = last.as_ref() else {
            return Ok(true);
        };
        if shmem.capture_id(stream)?.is_some() {
            return Err(Error::InvalidArgument(
                "a channel dropped while a stream of its calls is being captured".into(),
            ));
        }
        let done = stream.record_event(None).during("cuEventRecord")?;
        loop {
            if done.try_is_complete().during("cuEventQuery")? {
                return Ok(true);
            }
            if Instant::now() > deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Arc<CudaStream>>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
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
