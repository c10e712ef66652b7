//! Channels: bounded single-producer single-consumer queues of messages from one PE to
//! another, in symmetric memory, for handing micro-batches between pipeline stages.
//!
//! A [`Channel<T>`] carries messages of up to [`max_len`](Channel::max_len) elements from PE
//! [`producer`](Channel::producer) to PE [`consumer`](Channel::consumer) through `depth`
//! slots on the consumer. The producer writes a message straight into a free slot (a put over
//! NVLink) and raises the slot's ready word, which carries the message's length; the consumer
//! copies it out and hands the slot back by advancing a credit word on the producer. Messages
//! of up to 4 KiB between GPUs that map each other's memory go as LL lines instead, 8 bytes
//! of data beside a tag in each 16, which need no fence before the ready word. A producer with every slot full waits, so
//! an unread message is never overwritten, and no host is involved at either end.
//!
//! Both ends are stream-ordered and capturable in CUDA graphs: [`send`](Channel::send) and
//! [`recv`](Channel::recv) enqueue one small kernel each, which keeps its position in device
//! memory, so a replayed graph sends the next messages. Kernels of your own push and pop with
//! `nvshmem_rs/channel.cuh` (on the include path of crates that build kernels with
//! `nvshmem_build`), given [`handle`](Channel::handle):
//!
//! ```cuda
//! #include <nvshmem_rs/channel.cuh>
//! extern "C" __global__ void stage(nvshmem_rs_channel in, nvshmem_rs_channel out, float *buf,
//!                                  uint64_t n) {
//!     if (nvshmem_rs::channel_pop_block(in, buf, n * sizeof(float)) == nvshmem_rs::CHANNEL_TIMED_OUT)
//!         return; // the producer never sent: the host's next call on `in` says so
//!     // ... work on buf ...
//!     if (!nvshmem_rs::channel_push_block(out, buf, n * sizeof(float))) return;
//! }
//! ```
//!
//! The header documents its rules: one group pushes (and one pops) at a time, a push waits
//! for a free slot and a pop for a message, and a pop returns once the message's bytes are
//! visible to the popping group.
//!
//! Every wait is bounded ([`ChannelConfig::timeout`]: the runtime's `NVSHMEM_RS_TIMEOUT`
//! unless set). A wait that gives up takes nothing and changes nothing, and records the PE it
//! waited for: from then on every call on the channel on this PE (and
//! [`check`](Channel::check)) returns [`Error::ChannelTimeout`] at once, and the device
//! functions return their failure value (a push `false`, a pop `CHANNEL_TIMED_OUT`). So a
//! receive whose producer never sends is an error on the consumer, not a hang; the message
//! it waited for is garbage, and the call that says so is the next one on the channel (or
//! [`check`](Channel::check) after the stream).
//!
//! Only single-producer channels exist: many PEs into one is one channel per producer, which
//! keeps every slot written by one PE and needs no remote atomics on the fast path.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::channel::{Channel, ChannelConfig};
//! let shmem = nvshmem::Nvshmem::init()?;
//! let (me, n) = (shmem.my_pe(), shmem.n_pes());
//! // A ring: channel i goes from PE i to PE i + 1. Making channels is collective, so every
//! // PE makes all of them, in one order; each PE then uses the two it is an end of.
//! let ring: Vec<Channel<f32>> = (0..n)
//!     .map(|i| Channel::new(&shmem, ChannelConfig::new(i, (i + 1) % n, 4096).depth(4)))
//!     .collect::<nvshmem::Result<_>>()?;
//! let (to_next, from_prev) = (&ring[me], &ring[(me + n - 1) % n]);
//! let mut batch = shmem.calloc::<f32>(4096)?;
//! if me == 0 {
//!     to_next.send(&batch, shmem.stream())?;
//! }
//! from_prev.recv(&mut batch, shmem.stream())?;
//! if me != 0 {
//!     to_next.send(&batch, shmem.stream())?;
//! }
//! # Ok(()) }
//! ```

mod bound;
mod fault;
mod layout;

pub use crate::abi::nvshmem_rs_channel as DeviceChannel;
use layout::{message_tag, ready_tag};
pub use layout::{ChannelLayout, SEND_BLOCK_BYTES};

use crate::abi::{CHANNEL_LAST_BYTES, CHANNEL_RECEIVED};
use crate::cubins::CHANNEL;
use crate::element::Element;
use crate::error::{CudaResultExt, Error, Result};
use crate::memory::{DeviceMemory, SymmetricBuffer};
use crate::module::{grid, Function, KernelArgs, LaunchOptions, Module};
use crate::order::CallOrder;
use crate::runtime::Nvshmem;
use cudarc::driver::CudaStream;
use fault::FaultRecord;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// How the send and receive kernels are launched: each may begin launching while the kernel
/// before it on the stream runs (it waits for that kernel before touching memory), which
/// hides most of a launch in a chain of hand-offs.
const LAUNCH: LaunchOptions = LaunchOptions {
    cooperative: false,
    programmatic: true,
    cluster: None,
};

/// The send and receive kernels, loaded once per runtime.
#[derive(Clone)]
struct Kernels {
    send: Function,
    recv: Function,
}

impl Kernels {
    fn load(shmem: &Nvshmem) -> Result<Self> {
        let module = Module::load_for_service(shmem, &CHANNEL)?;
        Ok(Kernels {
            send: module.function("channel_send")?,
            recv: module.function("channel_recv")?,
        })
    }
}

/// Load the runtime's channel kernels now (at start: see `Nvshmem::load_services`).
pub(crate) fn load_service(shmem: &Nvshmem) -> Result<()> {
    shmem.with_service(Kernels::load, |_| Ok(()))
}

/// A bounded single-producer single-consumer queue of messages of `T` from one PE to
/// another, in symmetric memory (see the [module](self) documentation).
///
/// # Threads and streams
/// A channel may be used from any thread, on any streams. Each end keeps its position in
/// device memory, so the calls at one end run one after the other on the GPU, in the order
/// they were made: a call on another stream than the end's last call first makes its stream
/// wait (on the device, through an event) for the work that stream holds. Two threads that
/// send at once each send their own messages, in some order, none lost or overwritten (and
/// two that receive at once each receive different messages). Calls at one end may still run
/// at once with work the channel does not see: do not push from a kernel of yours while a
/// `send` runs, nor pop while a `recv` runs. As with [`Collectives`](crate::Collectives),
/// a graph's launches are yours to order against other calls, and a call on another stream
/// while the last one's stream is still being captured into another graph is an error.
///
/// # When a peer does not come
/// Every wait is bounded ([`ChannelConfig::timeout`]); one that gives up makes every later
/// call on the channel on this PE return [`Error::ChannelTimeout`]. Dropping a channel waits
/// for its own kernels (which end within the bound) and then frees it, collectively; kernels
/// of the channel still running twice the bound and a second after the drop (a stream that
/// holds other work waiting for ever) are left running, the channel is leaked with a logged
/// message, and the runtime is stranded ([`Error::Stranded`]) instead of the drop hanging.
pub struct Channel<T: Element> {
    shmem: Nvshmem,
    layout: ChannelLayout,
    /// The bound on every wait, as the kernels keep it (`None`: no bound).
    timeout: Option<Duration>,
    /// `depth` slots of `slot_bytes`, then `depth` LL slots (used on the consumer).
    slots: SymmetricBuffer<u8>,
    /// `ready[depth]`, then the words of `NvshmemRsChannelWord`.
    ctrl: SymmetricBuffer<u64>,
    /// Where a wait that gave up says so. Dropped after the buffers, whose frees wait for the
    /// kernels that could write it.
    fault: FaultRecord,
    /// The other end's memory as this PE maps it (see [`PeerMaps`]).
    peer: PeerMaps,
    /// The streams of the last send and the last receive on this PE.
    sender: CallOrder,
    receiver: CallOrder,
    kernels: Kernels,
    _elements: PhantomData<fn() -> T>,
}

impl<T: Element> std::fmt::Debug for Channel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Channel<{:?}>(PE {} -> PE {}, {} slots of {} elements)",
            T::DTYPE,
            self.layout.producer,
            self.layout.consumer,
            self.layout.depth,
            self.layout.max_len
        )
    }
}

/// The other end's memory as this PE maps it, for kernels that store into it directly instead
/// of asking NVSHMEM where it lies at every message (null where only NVSHMEM's transports
/// reach it, and on the PEs that are neither end).
struct PeerMaps {
    /// On the producer: the consumer's slots and `ready`.
    slots: *mut u8,
    ready: *mut u64,
    /// On the consumer: the producer's words (its credit).
    words: *mut u64,
}

// SAFETY: addresses of symmetric memory the channel owns, only handed to kernels.
unsafe impl Send for PeerMaps {}
unsafe impl Sync for PeerMaps {}

impl PeerMaps {
    fn new(
        me: usize,
        layout: &ChannelLayout,
        slots: &SymmetricBuffer<u8>,
        ctrl: &SymmetricBuffer<u64>,
    ) -> Result<Self> {
        let null = std::ptr::null_mut();
        let mut maps = PeerMaps {
            slots: null as *mut u8,
            ready: null,
            words: null,
        };
        let depth = layout.depth;
        if me == layout.producer {
            if let Some(base) = ctrl.peer_ptr(layout.consumer)? {
                maps.slots = slots.peer_ptr(layout.consumer)?.unwrap_or(maps.slots);
                maps.ready = base;
            }
        }
        if me == layout.consumer {
            if let Some(base) = ctrl.peer_ptr(layout.producer)? {
                maps.words = base.wrapping_add(depth);
            }
        }
        Ok(maps)
    }
}

/// What a [`Channel`] is: its two ends, its largest message, its number of slots, and how
/// long its waits may last.
///
/// ```
/// use std::time::Duration;
/// let config = nvshmem::channel::ChannelConfig::new(0, 1, 4096)
///     .depth(4)
///     .timeout(Duration::from_secs(30));
/// assert_eq!((config.producer, config.consumer, config.max_len, config.depth), (0, 1, 4096, 4));
/// assert_eq!(config.timeout, Some(Duration::from_secs(30)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChannelConfig {
    /// The PE that sends.
    pub producer: usize,
    /// The PE that receives (may be the producer).
    pub consumer: usize,
    /// Elements of the largest message.
    pub max_len: usize,
    /// Messages in flight at once (slots); [`DEFAULT_DEPTH`] unless set.
    pub depth: usize,
    /// How long a wait for the other end (a send's for a free slot, a receive's for a
    /// message, and those of kernels of yours through [`Channel::handle`]) may last before it
    /// gives up and the channel fails with [`Error::ChannelTimeout`]. `None` (the default):
    /// the runtime's bound, `NVSHMEM_RS_TIMEOUT` seconds (10 minutes unless set; `0` there: no
    /// bound). A bound of more than 52 days (`Duration::MAX`) is none. Both ends should use the
    /// same.
    ///
    /// A wait starts when the kernel starts on the GPU, so it includes the time the other end
    /// spends before it sends (or receives): keep the bound above the longest such gap.
    pub timeout: Option<Duration>,
}

/// Slots of a channel unless [`ChannelConfig::depth`] says otherwise: double buffering, so
/// the producer fills one slot while the consumer drains the other.
pub const DEFAULT_DEPTH: usize = 2;

impl ChannelConfig {
    /// A channel from PE `producer` to PE `consumer` of messages of up to `max_len`
    /// elements (at most 2^31 - 16 bytes), with [`DEFAULT_DEPTH`] slots.
    pub fn new(producer: usize, consumer: usize, max_len: usize) -> Self {
        ChannelConfig {
            producer,
            consumer,
            max_len,
            depth: DEFAULT_DEPTH,
            timeout: None,
        }
    }

    /// Set the number of slots.
    pub fn depth(mut self, depth: usize) -> Self {
        self.depth = depth;
        self
    }

    /// Set the bound on every wait ([`timeout`](Self::timeout)).
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }
}

impl<T: Element> Channel<T> {
    /// A channel as `config` says: from PE `producer` to PE `consumer` (they may be the
    /// same PE) of `depth` slots, each holding one message of up to `max_len` elements.
    ///
    /// Collective: every PE makes every channel, in the same order and with the same
    /// arguments, as for any symmetric allocation (it takes `depth × max_len` elements, plus
    /// `depth × 2 × min(max_len elements, 4 KiB)` bytes for small messages and `depth + 7`
    /// words, of symmetric memory on every PE, each part rounded up to 16 bytes). Bad arguments are an error on every PE alike.
    pub fn new(shmem: &Nvshmem, config: ChannelConfig) -> Result<Self> {
        let ChannelConfig {
            producer,
            consumer,
            max_len,
            depth,
            timeout,
        } = config;
        let layout = ChannelLayout::new::<T>(producer, consumer, shmem.n_pes(), max_len, depth)?;
        let kernels = shmem.with_service(Kernels::load, |k| Ok(k.clone()))?;
        let fault = FaultRecord::new(shmem)?;
        let slots = shmem.calloc::<u8>(layout.slots_bytes())?;
        let ctrl = shmem.calloc::<u64>(layout.ctrl_words())?;
        let peer = PeerMaps::new(shmem.my_pe(), &layout, &slots, &ctrl)?;
        Ok(Channel {
            shmem: shmem.clone(),
            layout,
            timeout: bound::in_effect(timeout.or(shmem.wait_limit())),
            slots,
            ctrl,
            fault,
            peer,
            sender: CallOrder::new(),
            receiver: CallOrder::new(),
            kernels,
            _elements: PhantomData,
        })
    }

    /// The PE that sends.
    pub fn producer(&self) -> usize {
        self.layout.producer
    }

    /// The PE that receives.
    pub fn consumer(&self) -> usize {
        self.layout.consumer
    }

    /// The most elements a message holds.
    pub fn max_len(&self) -> usize {
        self.layout.max_len
    }

    /// Messages in flight at most: the number of slots.
    pub fn depth(&self) -> usize {
        self.layout.depth
    }

    /// The bound on every wait ([`ChannelConfig::timeout`], or the runtime's); `None`: no
    /// bound.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// `Err(Error::ChannelTimeout)` once a wait on this channel on this PE gave up (a send's,
    /// a receive's, or one of a kernel of yours through the [`handle`](Self::handle)); every
    /// call checks this first. Reads host memory only: it neither waits for a stream nor
    /// blocks, so to learn how the calls on a stream went, synchronise it first.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// # use nvshmem::channel::{Channel, ChannelConfig};
    /// # use std::time::Duration;
    /// # let shmem = nvshmem::Nvshmem::init()?;
    /// let config = ChannelConfig::new(0, 1, 1024).timeout(Duration::from_secs(5));
    /// let ch = Channel::<f32>::new(&shmem, config)?;
    /// if shmem.my_pe() == ch.consumer() {
    ///     let mut buf = shmem.calloc::<f32>(1024)?;
    ///     ch.recv(&mut buf, shmem.stream())?;
    ///     shmem.stream().synchronize()?;
    ///     // Err(Error::ChannelTimeout { waited_for: 0, .. }) if PE 0 sent nothing in 5 s.
    ///     ch.check()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn check(&self) -> Result<()> {
        self.fault.check()
    }

    /// The channel as kernels see it, to pass by value ([`KernelArgs::value`]) to kernels
    /// that push or pop with `nvshmem_rs/channel.cuh`. Valid while the channel lives; the same
    /// on every PE but for the addresses, which are this PE's.
    pub fn handle(&self) -> DeviceChannel {
        let depth = self.layout.depth;
        let base = self.ctrl.as_ptr();
        let ll = self.layout.ll_offset();
        let peer_ll = if self.peer.slots.is_null() {
            std::ptr::null_mut()
        } else {
            self.peer.slots.wrapping_add(ll)
        };
        DeviceChannel {
            slots: self.slots.as_ptr() as *mut std::ffi::c_char,
            ll: self.slots.as_ptr().wrapping_add(ll) as *mut std::ffi::c_char,
            ll_bytes: self.layout.ll_bytes as u64,
            ll_clean_every: self.layout.ll_clean_every(),
            peer_ll: peer_ll as *mut std::ffi::c_char,
            // The control block is `ready`, then the channel's words.
            ready: base,
            words: base.wrapping_add(depth),
            slot_bytes: self.layout.slot_bytes as u64,
            depth: depth as u32,
            producer: self.layout.producer as i32,
            consumer: self.layout.consumer as i32,
            wait_units: bound::wait_units(self.timeout),
            fault: self.fault.device_ptr(),
            peer_slots: self.peer.slots as *mut std::ffi::c_char,
            peer_ready: self.peer.ready,
            peer_words: self.peer.words,
        }
    }

    /// Send `src` (at most [`max_len`](Self::max_len) elements, in this PE's memory) as one
    /// message, on `stream`. Called on the producer. The kernel waits on the GPU while every
    /// slot holds an unread message, at most the channel's [`timeout`](Self::timeout): a send
    /// that gives up sends nothing, and the next call (or [`check`](Self::check)) returns
    /// [`Error::ChannelTimeout`]. `src` may be reused once the kernel has run. Any device
    /// memory of this PE will do for a consumer reached over NVLink; one on another node
    /// needs `src` in symmetric memory (NVSHMEM's network transports read only that).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// # use nvshmem::channel::{Channel, ChannelConfig};
    /// # let shmem = nvshmem::Nvshmem::init()?;
    /// let ch = Channel::<f32>::new(&shmem, ChannelConfig::new(0, shmem.n_pes() - 1, 1024))?;
    /// let mut buf = shmem.calloc::<f32>(1024)?;
    /// if shmem.my_pe() == ch.producer() {
    ///     ch.send(&buf, shmem.stream())?;
    /// }
    /// if shmem.my_pe() == ch.consumer() {
    ///     ch.recv(&mut buf, shmem.stream())?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn send(&self, src: &impl DeviceMemory<T>, stream: &Arc<CudaStream>) -> Result<()> {
        self.layout
            .check_send(self.shmem.my_pe(), src.device_len())?;
        self.check()?;
        let bytes = (src.device_len() * size_of::<T>()) as u64;
        let (blocks, threads) = (layout::blocks_for(bytes), layout::threads_for(bytes));
        self.sender.run(&self.shmem, stream, "Channel::send", || {
            let mut args = KernelArgs::new();
            args.value(self.handle())
                .device_ptr(src.device_addr(stream))
                .value(bytes);
            // SAFETY: the arguments match channel_send(nvshmem_rs_channel, const char *,
            // uint64_t); the handle's buffers live as long as `self`, and `src` holds
            // `bytes` bytes.
            unsafe {
                self.kernels
                    .send
                    .launch_with(grid(blocks, threads), LAUNCH, stream, &mut args)
            }
        })
    }

    /// Receive the next message into `dst` on `stream`, which must hold
    /// [`max_len`](Self::max_len) elements (a message has at most that many; the length of
    /// the one received is [`last_len`](Self::last_len)). Called on the consumer. The kernel
    /// waits on the GPU for a message, at most the channel's [`timeout`](Self::timeout): a
    /// receive that gives up takes nothing (`dst` keeps what it held), and the next call (or
    /// [`check`](Self::check)) returns [`Error::ChannelTimeout`].
    pub fn recv(&self, dst: &mut impl DeviceMemory<T>, stream: &Arc<CudaStream>) -> Result<()> {
        self.layout
            .check_recv(self.shmem.my_pe(), dst.device_len())?;
        self.check()?;
        self.receiver.run(&self.shmem, stream, "Channel::recv", || {
            self.launch_recv(dst, stream)
        })
    }

    /// [`recv`](Self::recv) if a message is waiting now; `Ok(false)` without enqueueing
    /// anything if not. Waits for `stream` first (so the receives already made are counted),
    /// which makes it unusable while `stream` is being captured into a graph (an error); a
    /// receive before it that gave up is [`Error::ChannelTimeout`].
    pub fn try_recv(
        &self,
        dst: &mut impl DeviceMemory<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<bool> {
        self.layout
            .check_recv(self.shmem.my_pe(), dst.device_len())?;
        self.check()?;
        self.refuse_capture(stream)?;
        self.receiver
            .run(&self.shmem, stream, "Channel::try_recv", || {
                let ctrl = self.control_block(stream)?;
                if !self.has_message(&ctrl) {
                    return Ok(false);
                }
                self.launch_recv(dst, stream)?;
                Ok(true)
            })
    }

    /// The number of elements of the message received last on this PE (0 before the first).
    /// Waits for the receives made before it; one that gave up is
    /// [`Error::ChannelTimeout`].
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// # use nvshmem::channel::{Channel, ChannelConfig};
    /// # let shmem = nvshmem::Nvshmem::init()?;
    /// let ch = Channel::<f32>::new(&shmem, ChannelConfig::new(0, shmem.n_pes() - 1, 1024))?;
    /// if shmem.my_pe() == ch.consumer() {
    ///     let mut buf = shmem.calloc::<f32>(1024)?;
    ///     ch.recv(&mut buf, shmem.stream())?;
    ///     let len = ch.last_len(shmem.stream())?; // buf[..len] is the message
    /// #   let _ = len;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn last_len(&self, stream: &Arc<CudaStream>) -> Result<usize> {
        self.layout
            .check_recv(self.shmem.my_pe(), self.layout.max_len)?;
        self.check()?;
        self.refuse_capture(stream)?;
        self.receiver
            .run(&self.shmem, stream, "Channel::last_len", || {
                let ctrl = self.control_block(stream)?;
                Ok(ctrl[self.word(CHANNEL_LAST_BYTES)] as usize / size_of::<T>())
            })
    }

    /// Enqueue the receive kernel (the caller holds the receiving end's turn).
    fn launch_recv(&self, dst: &mut impl DeviceMemory<T>, stream: &Arc<CudaStream>) -> Result<()> {
        let capacity = (dst.device_len() * size_of::<T>()) as u64;
        let mut args = KernelArgs::new();
        args.value(self.handle())
            .device_ptr(dst.device_addr(stream))
            .value(capacity);
        // The message's size is known only on the GPU: size the grid for the largest one.
        let largest = capacity.min(self.layout.slot_bytes as u64);
        let (blocks, threads) = (layout::blocks_for(largest), layout::threads_for(largest));
        // SAFETY: the arguments match channel_recv(nvshmem_rs_channel, char *, uint64_t), and
        // `dst` holds `capacity` bytes, which the kernel writes at most.
        unsafe {
            self.kernels
                .recv
                .launch_with(grid(blocks, threads), LAUNCH, stream, &mut args)
        }
    }

    /// Whether the next message has arrived, by this PE's control block.
    fn has_message(&self, ctrl: &[u64]) -> bool {
        let received = ctrl[self.word(CHANNEL_RECEIVED)];
        let ready = ctrl[(received % self.layout.depth as u64) as usize];
        ready_tag(ready) == message_tag(received)
    }

    /// The index in the control block of one of the channel's words.
    fn word(&self, word: u32) -> usize {
        self.layout.depth + word as usize
    }

    /// The calls that wait for their stream cannot run while it is being captured.
    fn refuse_capture(&self, stream: &Arc<CudaStream>) -> Result<()> {
        if self.shmem.capture_id(stream)?.is_some() {
            return Err(Error::InvalidArgument(
                "Channel::try_recv and last_len wait for their stream, which is being captured \
                 into a graph: call them outside the capture"
                    .into(),
            ));
        }
        Ok(())
    }

    /// This PE's control block, after the work on `stream` (the ready words still move as
    /// the producer sends), or the error of a wait that gave up in that work.
    fn control_block(&self, stream: &Arc<CudaStream>) -> Result<Vec<u64>> {
        self.shmem.bind_context()?;
        stream.synchronize().during("cuStreamSynchronize")?;
        self.check()?;
        self.ctrl.to_vec()
    }

    /// Wait for the channel's own kernels, until `deadline`: `Ok(false)` if they still run.
    fn wait_idle(&self, deadline: std::time::Instant) -> Result<bool> {
        Ok(self.sender.wait_idle(&self.shmem, deadline)?
            && self.receiver.wait_idle(&self.shmem, deadline)?)
    }
}

impl<T: Element> Drop for Channel<T> {
    fn drop(&mut self) {
        // The buffers' frees wait for the whole GPU, for as long as it takes. The channel's own
        // kernels end within the bound (a wait gives up), so wait for them that long first: if
        // they still run then, something else holds their streams (a wait with no bound), and
        // freeing would hang. Leak instead, and strand the runtime: the other PEs' frees of the
        // channel go unanswered.
        let Some(limit) = bound::drain_limit(self.timeout) else {
            return;
        };
        if crate::runtime::check_not_stranded().is_err() {
            return; // the buffers leak without waiting
        }
        if let Ok(false) = self.wait_idle(std::time::Instant::now() + limit) {
            let me = self.shmem.my_pe();
            let why = format!(
                "{self:?} still had kernels running {limit:.1?} after it was dropped, though \
                 its waits give up after {:.1?}: their streams hold work that waits for \
                 something else; leaking the channel",
                self.timeout.unwrap_or_default()
            );
            crate::diag::error_pe!(Some(me), "{why}");
            crate::runtime::strand(format!("PE {me}: {why}"));
        }
    }
}
