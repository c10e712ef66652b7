//! The bound on a fused exchange's waits.
//!
//! The exchange's flags are awaited by stream memory operations (`cuStreamWaitValue64`),
//! which have no timeout. A kernel that polled with a bound instead would hold an SM while it
//! waits, and beside GEMMs that take every SM its place is not assured. So each call ends
//! with an event, and one watchdog thread per process looks at the oldest unfinished call of
//! every exchange. When a call has not finished within `NVSHMEM_RS_TIMEOUT` (counted from its
//! enqueueing, or from the end of the call before it if that is later), the watchdog:
//! - reads this PE's flags, to name the peers whose chunks never came;
//! - releases every wait on them, from a stream of its own, with a value that passes them all,
//!   and again while calls of the exchange are still in flight;
//! - records the fault.
//!
//! The outputs of the calls in flight are then wrong, and every later call of the layer
//! returns [`Error::ExchangeTimeout`]. Calls replayed from a CUDA graph are not watched.

use crate::collectives::Members;
use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::{lock, Nvshmem};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// What the watchdog writes into every flag of an exchange that gave up: at least what any
/// wait of any call asks for (1 for a credit, a count of rounds for the others).
const RELEASE: u64 = 1 << 60;

/// How often the watchdog looks.
const PERIOD: Duration = Duration::from_millis(50);

/// The watch over one exchange's calls on this PE. It holds no runtime handle: the watchdog
/// must never be the one to end the runtime.
pub(in crate::tp) struct Watch {
    ctx: Arc<CudaContext>,
    /// This PE's place in the group, and the group's PEs as world PEs (errors name those).
    me: usize,
    world: Vec<usize>,
    /// This PE's flags (`ready`, `credit`, `done`: `n` each), at their local address.
    flags: u64,
    n: usize,
    limit: Duration,
    /// Held for a whole look of the watchdog, so that no release writes into the flags once
    /// the exchange has closed the watch (and may free them).
    state: Mutex<State>,
    enqueued: AtomicU64,
    fault: OnceLock<Fault>,
}

#[derive(Default)]
struct State {
    /// The calls in flight, oldest first: the event after each, when it was enqueued, and
    /// its number.
    calls: VecDeque<(CudaEvent, Instant, u64)>,
    /// Events of finished calls, for the next ones.
    spare: Vec<CudaEvent>,
    /// When the oldest call in flight became the oldest (the one before it finished): its
    /// wait counts from then or from its enqueueing, whichever is later.
    front_since: Option<Instant>,
    /// The exchange is going: nothing may be written into its flags any more.
    closed: bool,
}

/// What the watchdog found.
#[derive(Clone)]
struct Fault {
    waited_for: Vec<usize>,
    call: u64,
    waited: Duration,
}

/// The exchanges the watchdog looks at.
static WATCHED: Mutex<Vec<Weak<Watch>>> = Mutex::new(Vec::new());

impl Watch {
    /// The watch over the exchange whose flags (`3 n` words) lie at `flags` on this PE, or
    /// `None` when `NVSHMEM_RS_TIMEOUT` sets no bound.
    pub(in crate::tp) fn new(shmem: &Nvshmem, flags: u64, members: &Members) -> Option<Arc<Self>> {
        let limit = shmem.wait_limit()?;
        let watch = Arc::new(Watch {
            ctx: shmem.context().clone(),
            me: members.me().ok()?,
            world: members.world_pes().to_vec(),
            flags,
            n: members.n(),
            limit,
            state: Mutex::new(State::default()),
            enqueued: AtomicU64::new(0),
            fault: OnceLock::new(),
        });
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            std::thread::Builder::new()
                .name("nvshmem-tp-watch".into())
                .spawn(watchdog)
                .map(drop)
                .unwrap_or_else(|e| {
                    crate::diag::warn_pe!(None, "no watchdog for the fused exchanges: {e}")
                });
        });
        lock(&WATCHED).push(Arc::downgrade(&watch));
        Some(watch)
    }

    /// The error of an exchange whose wait gave up, for every call after it.
    pub(in crate::tp) fn refuse(&self) -> Result<()> {
        match self.fault.get() {
            None => Ok(()),
            Some(f) => Err(Error::ExchangeTimeout {
                pe: self.world[self.me],
                waited_for: f.waited_for.clone(),
                call: f.call,
                waited: f.waited,
            }),
        }
    }

    /// Watch the call just enqueued on `stream` (its last step): an event after it. Not
    /// under capture, where the event would be a node of the graph.
    pub(in crate::tp) fn enqueued(&self, stream: &Arc<CudaStream>) -> Result<()> {
        use sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as NONE;
        let mut capture = NONE;
        // SAFETY: a live stream of this context.
        unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut capture) }
            .result()
            .during("cuStreamIsCapturing")?;
        if capture != NONE {
            return Ok(());
        }
        let spare = lock(&self.state).spare.pop();
        let event = match spare {
            Some(e) => e,
            None => self.ctx.new_event(None).during("cuEventCreate")?,
        };
        event.record(stream).during("cuEventRecord")?;
        let call = self.enqueued.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.state)
            .calls
            .push_back((event, Instant::now(), call));
        Ok(())
    }

    /// Wait until no call is in flight (the watchdog releases one that waits past the
    /// bound), then close the watch: before the exchange frees its flags.
    pub(in crate::tp) fn close(&self) {
        loop {
            {
                let mut state = lock(&self.state);
                if self.ctx.bind_to_thread().is_err() || retire(&mut state).is_err() {
                    // Nothing to tell finished calls from: the free after waits for the GPU.
                    state.closed = true;
                    return;
                }
                if state.calls.is_empty() {
                    state.closed = true;
                    return;
                }
            }
            std::thread::sleep(PERIOD / 5);
        }
    }

    /// One look: retire the finished calls; past the bound, give up and release the waits.
    fn look(&self) -> Result<()> {
        let mut state = lock(&self.state);
        if state.closed {
            return Ok(());
        }
        retire(&mut state)?;
        let Some(&(_, at, call)) = state.calls.front() else {
            return Ok(());
        };
        if self.fault.get().is_none() {
            let waited = state.front_since.map_or(at, |f| f.max(at)).elapsed();
            if waited < self.limit {
                return Ok(());
            }
            let waited_for: Vec<usize> = self.missing()?.iter().map(|&c| self.world[c]).collect();
            crate::diag::warn_pe!(
                Some(self.world[self.me]),
                "a tensor-parallel fused exchange waited {waited:.1?} for PEs {waited_for:?}: \
                 releasing its waits (its outputs are wrong)"
            );
            let _ = self.fault.set(Fault {
                waited_for,
                call,
                waited,
            });
        }
        // The calls still in flight clear flags as they go, and wait again: release them
        // until none is left.
        self.release()
    }

    /// A stream of its own, which waits for nothing.
    fn own_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().during("cuStreamCreate")
    }

    /// The peers (by place in the group) whose chunks (then, whose sums) have not come, as
    /// this PE's flags say; every peer where each has come.
    fn missing(&self) -> Result<Vec<usize>> {
        let mut words = vec![0u64; 3 * self.n];
        let stream = self.own_stream()?;
        // SAFETY: the flags are 3n words of this PE's GPU memory, not freed before the watch
        // is closed (the caller holds it open); the copy is waited for.
        unsafe { result::memcpy_dtoh_async(&mut words, self.flags, stream.cu_stream()) }
            .during("cuMemcpyDtoHAsync")?;
        stream.synchronize().during("cuStreamSynchronize")?;
        let me = self.me;
        let peers = || (0..self.n).filter(move |&c| c != me);
        let (ready, done) = (&words[..self.n], &words[2 * self.n..]);
        let unset = |flags: &[u64]| peers().filter(|&c| flags[c] == 0).collect::<Vec<_>>();
        Ok([unset(ready), unset(done)]
            .into_iter()
            .find(|pes| !pes.is_empty())
            .unwrap_or_else(|| peers().collect()))
    }

    /// Write [`RELEASE`] into every flag, from a stream of its own.
    fn release(&self) -> Result<()> {
        let stream = self.own_stream()?;
        let flags = sys::CUstreamWriteValue_flags_enum::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        for i in 0..3 * self.n as u64 {
            let addr = self.flags + i * std::mem::size_of::<u64>() as u64;
            // SAFETY: a flag of this PE's GPU memory, not freed before the watch is closed
            // (the caller holds it open).
            unsafe { sys::cuStreamWriteValue64_v2(stream.cu_stream(), addr, RELEASE, flags) }
                .result()
                .during("cuStreamWriteValue64")?;
        }
        stream.synchronize().during("cuStreamSynchronize")
    }
}

/// Move the finished calls' events to the spares.
fn retire(state: &mut State) -> Result<()> {
    while let Some((event, _, _)) = state.calls.front() {
        if !event.try_is_complete().during("cuEventQuery")? {
            break;
        }
        let (event, _, _) = state.calls.pop_front().expect("a call");
        state.spare.push(event);
        state.front_since = Some(Instant::now());
    }
    Ok(())
}

/// The watchdog thread: every [`PERIOD`], one look at every live exchange.
fn watchdog() {
    loop {
        std::thread::sleep(PERIOD);
        let live: Vec<Arc<Watch>> = {
            let mut watched = lock(&WATCHED);
            watched.retain(|w| w.strong_count() > 0);
            watched.iter().filter_map(Weak::upgrade).collect()
        };
        for watch in live {
            let looked = watch.ctx.bind_to_thread().during("cuCtxSetCurrent");
            if let Err(e) = looked.and_then(|()| watch.look()) {
                crate::diag::warn_pe!(Some(watch.me), "the fused exchanges' watchdog: {e}");
            }
        }
    }
}
