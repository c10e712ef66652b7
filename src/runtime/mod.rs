//! The NVSHMEM runtime: initialisation, the GPU it runs on, and finalisation.
//!
//! Everything else hangs off the [`Nvshmem`] handle. State that other parts of the crate keep
//! per runtime (the host atomics' kernel, the debug allocation check) lives in the runtime's
//! services, which it drops before finalising NVSHMEM without knowing what they are.

mod exchange;
pub(crate) mod heap;
mod pinned;
mod team_sync;
mod transport;

pub(crate) use exchange::{DuringWait, Exchanged, WordExchange, FINALIZE_KIND, RECORD_WORDS};
pub(crate) use pinned::{copy_host, HostCopy};

use crate::diag;
use crate::error::{check, CudaResultExt, Error, Result};
use cudarc::driver::{CudaContext, CudaStream};
use heap::{footprint, HeapModel, HeapUsage};
use nvshmem_sys as sys;
use std::any::{Any, TypeId};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// One runtime per process: NVSHMEM cannot run twice, nor start again after finalize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    NotStarted,
    Running,
    Finalized,
}

static STATE: Mutex<State> = Mutex::new(State::NotStarted);

/// Serialises this process's calls into NVSHMEM's host library, which is initialised at
/// `NVSHMEM_THREAD_SERIALIZED`: any thread may call it, but never two at once. Every host call
/// of this crate is made holding a [`HostCall`] (see [`host_call`]).
static HOST_LIBRARY: Mutex<()> = Mutex::new(());

thread_local! {
    /// How many [`HostCall`]s this thread holds: only the first takes the lock, so a call
    /// made under a guard may take another (the lock is not re-entrant).
    static HOST_CALLS_HELD: Cell<usize> = const { Cell::new(0) };
    /// The lock, while this thread holds it.
    static HOST_LOCK: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// Permission to call NVSHMEM's host library: while it lives, no other thread of this
/// process is inside NVSHMEM through this crate. Not `Send`: a guard stays on its thread.
#[must_use = "NVSHMEM may only be called while the guard is held: bind it (`let _host = ...`)"]
pub(crate) struct HostCall {
    _not_send: PhantomData<*const ()>,
}

impl Drop for HostCall {
    fn drop(&mut self) {
        let last = HOST_CALLS_HELD.with(|held| {
            held.set(held.get() - 1);
            held.get() == 0
        });
        if last {
            HOST_LOCK.with(|l| l.borrow_mut().take());
        }
    }
}

/// Take the host library for this thread (at once when this thread already has it). For the
/// rare call that has no runtime handle; everything else uses [`Nvshmem::host_call`].
pub(crate) fn host_call() -> HostCall {
    let first = HOST_CALLS_HELD.with(|held| {
        held.set(held.get() + 1);
        held.get() == 1
    });
    if first {
        let guard = lock(&HOST_LIBRARY);
        HOST_LOCK.with(|l| *l.borrow_mut() = Some(guard));
    }
    HostCall {
        _not_send: PhantomData,
    }
}

/// Run `wait` with the host library let go, if this thread holds it, and take it again
/// after: for a wait for the other PEs (an agreement's), which calls no NVSHMEM function.
/// Holding the lock there would stop this process's other threads from launching or copying
/// what a peer's GPU waits for, while that peer waits for this one: a deadlock across PEs.
pub(crate) fn without_host_library<R>(wait: impl FnOnce() -> R) -> R {
    let held = HOST_CALLS_HELD.with(|h| h.replace(0));
    if held == 0 {
        return wait();
    }
    HOST_LOCK.with(|l| l.borrow_mut().take());
    struct Retake(usize);
    impl Drop for Retake {
        fn drop(&mut self) {
            let guard = lock(&HOST_LIBRARY);
            HOST_LOCK.with(|l| *l.borrow_mut() = Some(guard));
            HOST_CALLS_HELD.with(|h| h.set(self.0));
        }
    }
    let _retake = Retake(held);
    wait()
}

/// Lock `m`; while another thread holds it, wait with the host library let go. That thread
/// may be in a wait for the other PEs (which lets the library go) and need the library back
/// to finish: waiting for `m` while holding the library would deadlock the two.
pub(crate) fn lock_letting_go<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.try_lock() {
        Ok(guard) => guard,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => without_host_library(|| lock(m)),
    }
}

/// Why a host-side wait for the other PEs gave up, once one did: the work it queued (an
/// exchange, a barrier) stays queued on the runtime's stream for ever, so every later wait
/// for that stream or the whole GPU would hang.
static GAVE_UP: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// [`Error::Stranded`] once a wait for the other PEs gave up.
/// Strand the runtime: a wait for the other PEs gave up (`why` says which), so this process
/// cannot go on with them. The first reason stays.
pub(crate) fn strand(why: String) {
    let _ = GAVE_UP.set(why);
}

pub(crate) fn check_not_stranded() -> Result<()> {
    match GAVE_UP.get() {
        Some(why) => Err(Error::Stranded(why.clone())),
        None => Ok(()),
    }
}

/// Set once this process made a [`UniqueId`]: NVSHMEM then only starts with it.
static UNIQUE_ID_MADE: AtomicBool = AtomicBool::new(false);

/// The symmetric heap as NVSHMEM configures it from its environment at start-up (defaults
/// of NVSHMEM 3, as `NVSHMEM_INFO=1` prints them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeapConfig {
    /// `NVSHMEM_SYMMETRIC_SIZE`: what a fixed heap holds for buffers (NVSHMEM adds its own
    /// blocks on top); a growing heap does not read it.
    pub(crate) symmetric_size: usize,
    /// Whether the heap grows (CUDA VMM, NVSHMEM's default on x86) or is fixed
    /// (`NVSHMEM_DISABLE_CUDA_VMM=1`).
    pub(crate) grows: bool,
    /// `NVSHMEM_MAX_MEMORY_PER_GPU`: what a growing heap may reserve in all.
    pub(crate) max_memory_per_gpu: usize,
    /// `NVSHMEM_CUMEM_GRANULARITY`: the step a growing heap maps memory in.
    pub(crate) granularity: usize,
}

impl HeapConfig {
    pub(crate) fn from_env(var: impl Fn(&str) -> Option<String>) -> Self {
        let size =
            |name: &str, default: usize| var(name).and_then(|v| parse_size(&v)).unwrap_or(default);
        let vmm_disabled = var("NVSHMEM_DISABLE_CUDA_VMM")
            .and_then(|v| parse_bool(&v))
            .unwrap_or(false);
        HeapConfig {
            symmetric_size: size("NVSHMEM_SYMMETRIC_SIZE", 1 << 30),
            grows: !vmm_disabled,
            max_memory_per_gpu: size("NVSHMEM_MAX_MEMORY_PER_GPU", 128 << 30),
            granularity: size("NVSHMEM_CUMEM_GRANULARITY", 512 << 20).max(1),
        }
    }
}

/// A boolean variable as NVSHMEM reads it.
fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "y" | "on" => Some(true),
        "0" | "false" | "no" | "n" | "off" | "" => Some(false),
        _ => None,
    }
}

/// How to start NVSHMEM. The bootstrap itself comes from the launcher's environment:
/// PMI under `nvshmrun`/hydra `mpiexec` (the default), `NVSHMEM_BOOTSTRAP_PMI=PMI-2` or
/// `PMIX` under Slurm's `srun`, `NVSHMEM_BOOTSTRAP=MPI` under Open MPI's `mpirun`.
#[derive(Debug, Clone, Default)]
pub struct InitOptions {
    device: Option<usize>,
    context: Option<Arc<CudaContext>>,
    start_timeout: Option<Option<Duration>>,
}

/// How long a wait for the other PEs (in our collectives, and in the agreements before an
/// allocation or a checked call) may last by default, and the variable that changes it: 10
/// minutes, as PyTorch's NCCL watchdog.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(600);
/// Seconds (a decimal number) a wait for the other PEs may last; `0` for no limit.
pub const WAIT_TIMEOUT_VARIABLE: &str = "NVSHMEM_RS_TIMEOUT";

/// How long a start may wait for the other PEs by default, and the variable that changes it.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(120);
/// Seconds (a decimal number) a start may wait for the other PEs; `0` for no limit.
pub const START_TIMEOUT_VARIABLE: &str = "NVSHMEM_RS_INIT_TIMEOUT";

impl InitOptions {
    /// Defaults: the GPU is picked by node-local PE; the start may wait
    /// [`DEFAULT_START_TIMEOUT`] (or `NVSHMEM_RS_INIT_TIMEOUT` seconds) for the other PEs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Use this CUDA device ordinal instead of the node-local PE's.
    pub fn device(mut self, ordinal: usize) -> Self {
        self.device = Some(ordinal);
        self
    }

    /// Run on a CUDA context this process already has (cudarc's, as candle and burn hold
    /// it) instead of retaining the device's primary context: its device is the PE's GPU,
    /// and its streams and memory work with ours (NVSHMEM sets itself up on the context
    /// current when it starts, which is this one). Giving both this and
    /// [`device`](Self::device) for different GPUs is an error.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{cudarc::driver::CudaContext, InitOptions, Nvshmem};
    /// let ctx = CudaContext::new(0)?; // the context the rest of the program uses
    /// let shmem = Nvshmem::init_with(InitOptions::new().context(ctx.clone()))?;
    /// assert_eq!(shmem.device_ordinal(), ctx.ordinal());
    /// # Ok(()) }
    /// ```
    pub fn context(mut self, ctx: Arc<CudaContext>) -> Self {
        self.context = Some(ctx);
        self
    }

    /// The GPU asked for, by [`device`](Self::device) or [`context`](Self::context).
    fn chosen_device(&self) -> Result<Option<usize>> {
        match (self.device, &self.context) {
            (Some(d), Some(ctx)) if d != ctx.ordinal() => Err(Error::InvalidArgument(format!(
                "InitOptions asks for device {d} and for a context on device {}: give one",
                ctx.ordinal()
            ))),
            (d, ctx) => Ok(d.or(ctx.as_ref().map(|c| c.ordinal()))),
        }
    }

    /// How long NVSHMEM's start may wait for the other PEs (`None`: for ever). A start that
    /// waits longer (a PE that never started, one given another unique ID) cannot be
    /// cancelled inside NVSHMEM: the process prints which rank waited and for what, and
    /// exits with status 1, so the launcher ends the job instead of it hanging.
    pub fn start_timeout(mut self, limit: Option<Duration>) -> Self {
        self.start_timeout = Some(limit);
        self
    }

    fn start_limit(&self) -> Result<Option<Duration>> {
        match self.start_timeout {
            Some(limit) => Ok(limit),
            None => seconds_variable(START_TIMEOUT_VARIABLE, DEFAULT_START_TIMEOUT),
        }
    }
}

/// A duration in seconds from variable `name` (`0`: none), or `default` when it is unset.
fn seconds_variable(name: &str, default: Duration) -> Result<Option<Duration>> {
    parse_seconds(name, std::env::var(name).ok().as_deref(), default)
}

/// `value` of variable `name` as seconds (a decimal number; `0`: no limit), `default` when
/// unset or blank.
pub(crate) fn parse_seconds(
    name: &str,
    value: Option<&str>,
    default: Duration,
) -> Result<Option<Duration>> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(Some(default));
    };
    match v.parse::<f64>().map(Duration::try_from_secs_f64) {
        Ok(Ok(d)) if d.is_zero() => Ok(None),
        Ok(Ok(d)) => Ok(Some(d)),
        _ => Err(Error::InvalidArgument(format!(
            "{name}={v}: give the seconds to wait (for example 30, or 0.5), or 0 for no limit"
        ))),
    }
}

/// End the process at once, with `status`: no exit handlers, which could wait on the locks
/// that the blocked start holds.
fn exit_now(status: i32) -> ! {
    extern "C" {
        fn _exit(status: i32) -> !;
    }
    use std::io::Write;
    let _ = std::io::stderr().flush();
    // SAFETY: _exit is async-signal-safe and never returns.
    unsafe { _exit(status) }
}

/// Runs `on_expiry` on a thread of its own unless dropped within `limit`.
struct Watchdog(Option<std::sync::mpsc::Sender<()>>);

impl Watchdog {
    fn spawn(limit: Option<Duration>, on_expiry: impl FnOnce() + Send + 'static) -> Self {
        let Some(limit) = limit else {
            return Watchdog(None);
        };
        let (done, wait) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
                on_expiry();
            }
        });
        Watchdog(Some(done))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            let _ = done.send(());
        }
    }
}

/// An identifier that lets PEs find each other without a launcher: one PE calls
/// [`UniqueId::new`], the program hands the bytes to every PE by any channel, and each calls
/// [`Nvshmem::init_with_unique_id`].
#[derive(Clone)]
pub struct UniqueId(sys::nvshmemx_uniqueid_t);

impl UniqueId {
    /// Size of the identifier in bytes.
    pub const SIZE: usize = std::mem::size_of::<sys::nvshmemx_uniqueid_t>();

    /// Make a new identifier, on one PE, before initialisation. The process must then start
    /// with [`Nvshmem::init_with_unique_id`]: making an ID selects NVSHMEM's unique-ID
    /// bootstrap, and a launcher start ([`Nvshmem::init`]) afterwards would crash inside
    /// NVSHMEM, so it is refused.
    pub fn new() -> Result<Self> {
        let state = STATE.lock().unwrap_or_else(|p| p.into_inner());
        // The ID must be made before NVSHMEM starts.
        match *state {
            State::Running => return Err(Error::AlreadyInitialized),
            State::Finalized => return Err(Error::Finalized),
            State::NotStarted => {}
        }
        let mut id = sys::nvshmemx_uniqueid_t::default();
        let _host = host_call();
        check("nvshmemx_get_uniqueid", unsafe {
            sys::nvshmemx_get_uniqueid(&mut id)
        })?;
        UNIQUE_ID_MADE.store(true, Ordering::SeqCst);
        Ok(UniqueId(id))
    }

    /// The bytes to send to the other PEs.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        // SAFETY: plain C struct of integers and bytes, no padding-sensitive invariants.
        unsafe { std::mem::transmute_copy(&self.0) }
    }

    /// Rebuild an identifier received from another PE.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() != Self::SIZE {
            return Err(Error::Length {
                what: "unique ID bytes",
                expected: Self::SIZE,
                got: bytes.len(),
            });
        }
        let mut id = sys::nvshmemx_uniqueid_t::default();
        // SAFETY: sizes checked; every bit pattern is a valid value of the C struct.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), &mut id as *mut _ as *mut u8, Self::SIZE)
        };
        Ok(UniqueId(id))
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({} bytes)", Self::SIZE)
    }
}

/// A service: per-runtime state of another module, behind its own lock.
type Service = Arc<Mutex<Box<dyn Any + Send>>>;

/// What the runtime keeps for the module layer: loaded modules by a key of their image.
pub(crate) type LoadedModules = std::collections::HashMap<[u64; 4], Arc<dyn Any + Send + Sync>>;

pub(crate) struct Runtime {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    my_pe: usize,
    n_pes: usize,
    node_pe: usize,
    node_n_pes: usize,
    pub(crate) heap: HeapConfig,
    /// Bytes of symmetric memory this crate holds now.
    pub(crate) heap_in_use: AtomicUsize,
    /// Where NVSHMEM's allocator puts blocks, and how much of the heap is mapped (taken with
    /// the host library's lock held, from the check before an allocation to its placement).
    pub(crate) heap_model: Mutex<HeapModel>,
    /// How long a host-side wait for the other PEs may last (`NVSHMEM_RS_TIMEOUT`).
    pub(crate) wait_limit: Option<Duration>,
    /// The runtime's own bounded exchange (the allocation check, the barrier before
    /// finalize) and its symmetric scratch.
    exchange: Mutex<WordExchange>,
    /// The scratch of `exchange`, then that of `team_syncs` (one allocation).
    exchange_scratch: u64,
    /// Bounded syncs of any team (`barrier(team)`, `sync(team)`, a team's drop).
    pub(crate) team_syncs: team_sync::TeamSyncs,
    /// Pinned host words for the small copies of host waits, team syncs and atomics.
    pub(crate) pinned: pinned::PinnedPool,
    /// Streams of host-side waits not in use ([`Nvshmem::wait_stream`]).
    wait_streams: Mutex<Vec<Arc<CudaStream>>>,
    /// Made on first use, dropped in reverse order before NVSHMEM is finalised (they may free
    /// symmetric memory or unregister kernels). A service must not hold an [`Nvshmem`]: that
    /// would keep the runtime alive for ever.
    services: Mutex<Vec<(TypeId, Service)>>,
    /// Every module loaded on this runtime, by a key of its image (the module layer's, kept
    /// opaque here as the services are): dropped after the services, before NVSHMEM is
    /// finalised, never sooner (see `module::Loaded`).
    pub(crate) modules: Mutex<LoadedModules>,
}

/// A stream of the runtime's for one host-side wait, given back when dropped.
pub(crate) struct WaitStream<'a> {
    stream: Option<Arc<CudaStream>>,
    pool: &'a Mutex<Vec<Arc<CudaStream>>>,
}

impl std::ops::Deref for WaitStream<'_> {
    type Target = Arc<CudaStream>;

    fn deref(&self) -> &Arc<CudaStream> {
        self.stream
            .as_ref()
            .expect("a wait stream is taken only when dropped")
    }
}

impl Drop for WaitStream<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            lock(self.pool).push(s);
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        if let Err(e) = check_not_stranded() {
            // The GPU never becomes idle: leave everything as it is.
            diag::error_pe!(Some(self.my_pe), "leaving without finalizing: {e}");
            self.leave_loaded();
            if let Ok(mut s) = STATE.lock() {
                *s = State::Finalized;
            }
            return;
        }
        // Kernels on any stream may still use symmetric memory or NVSHMEM's device state.
        let _ = self.ctx.synchronize();
        let mut services =
            std::mem::take(self.services.get_mut().unwrap_or_else(|p| p.into_inner()));
        // The services' frees and NVSHMEM's finalize wait for every PE without a bound: a PE
        // that failed or left would hang this one. A bounded barrier first; past it, leave
        // NVSHMEM as it is (the process cannot start it again anyway) and say why.
        if !self.every_pe_arrives() {
            diag::error_pe!(
                Some(self.my_pe),
                "at finalize, not every PE arrived within {:?} (NVSHMEM_RS_TIMEOUT): a PE \
                 failed or exited early; leaving without finalizing",
                self.wait_limit.unwrap_or_default()
            );
            std::mem::forget(services);
            self.leave_loaded();
            if let Ok(mut s) = STATE.lock() {
                *s = State::Finalized;
            }
            return;
        }
        while let Some(service) = services.pop() {
            drop(service);
        }
        // Unloading waits for the GPU; every kernel is done by now.
        drop(std::mem::take(
            self.modules.get_mut().unwrap_or_else(|p| p.into_inner()),
        ));
        {
            let _host = host_call();
            // SAFETY: allocated at init, alike on every PE, every PE past its last exchange.
            unsafe {
                sys::nvshmem_free(self.exchange_scratch as *mut std::ffi::c_void);
                sys::nvshmemx_hostlib_finalize();
            }
        }
        if let Ok(mut s) = STATE.lock() {
            *s = State::Finalized;
        }
    }
}

impl Runtime {
    /// Leave the services and modules as they are (a GPU that never becomes idle, a PE that
    /// did not arrive): dropping them would wait for that GPU or those PEs.
    fn leave_loaded(&mut self) {
        std::mem::forget(std::mem::take(
            self.services.get_mut().unwrap_or_else(|p| p.into_inner()),
        ));
        std::mem::forget(std::mem::take(
            self.modules.get_mut().unwrap_or_else(|p| p.into_inner()),
        ));
    }

    /// Whether every PE reaches the end within the wait limit (always, without one), and
    /// none is doing something else (an allocation, a free): the runtime's exchange, which
    /// leaves nothing on the GPU when a PE has gone (NVSHMEM's barrier would, and hold up
    /// this process's exit). What went wrong is said on stderr.
    fn every_pe_arrives(&self) -> bool {
        if self.wait_limit.is_none() {
            return true;
        }
        let mut record = [0u64; RECORD_WORDS];
        record[0] = FINALIZE_KIND;
        let _host = host_call();
        let mut exchange = lock_letting_go(&self.exchange);
        match exchange.exchange(&record, self.wait_limit, DuringWait::LetGo) {
            Ok(Exchanged::All(all)) => {
                match all.chunks(RECORD_WORDS).position(|r| r[0] != FINALIZE_KIND) {
                    None => true,
                    Some(pe) => {
                        diag::error_pe!(
                            Some(self.my_pe),
                            "at finalize, PE {pe} was still allocating or freeing symmetric memory"
                        );
                        false
                    }
                }
            }
            Ok(Exchanged::GaveUp(pe)) => {
                diag::error_pe!(Some(self.my_pe), "at finalize, PE {pe} did not arrive");
                false
            }
            Err(e) => {
                diag::error_pe!(Some(self.my_pe), "at finalize: {e}");
                false
            }
        }
    }
}

/// A handle on the running NVSHMEM runtime. Cheap to clone; NVSHMEM is finalised when the
/// last handle (and every buffer, team and module, which hold one) is dropped.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// let shmem = nvshmem::Nvshmem::init()?;
/// println!("PE {} of {} on GPU {}", shmem.my_pe(), shmem.n_pes(), shmem.device_ordinal());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Nvshmem {
    pub(crate) rt: Arc<Runtime>,
}

impl fmt::Debug for Nvshmem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvshmem")
            .field("my_pe", &self.rt.my_pe)
            .field("n_pes", &self.rt.n_pes)
            .field("device", &self.rt.ctx.ordinal())
            .finish()
    }
}

/// The NVSHMEM release of the host library loaded in this process.
pub fn library_version() -> (i32, i32, i32) {
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    let _host = host_call();
    unsafe { sys::nvshmemx_vendor_get_version_info(&mut major, &mut minor, &mut patch) };
    (major, minor, patch)
}

/// Why `node_pes` PEs cannot share `gpus` GPUs, if they cannot (as far as this process sees:
/// with `CUDA_VISIBLE_DEVICES` set, the launcher chose each rank's GPUs). NVSHMEM runs several PEs on
/// one GPU in full only under CUDA MPS with each PE's share of the SMs capped at its part
/// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, or NVSHMEM's override of that rule); otherwise it
/// aborts the process at its first on-stream collective, which this crate uses.
fn gpu_sharing_problem(
    node_pes: usize,
    gpus: usize,
    env: impl Fn(&str) -> Option<String>,
) -> Option<Error> {
    let per_gpu = node_pes.div_ceil(gpus.max(1));
    // A launcher that binds each rank to its own GPU (Slurm's --gpus-per-task, say) shows
    // each process fewer GPUs than the node has PEs: sharing cannot be told from here.
    if per_gpu <= 1
        || env("CUDA_VISIBLE_DEVICES").is_some()
        || env("NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").as_deref() == Some("1")
    {
        return None;
    }
    let capped = env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .is_some_and(|pct| pct > 0.0 && pct * per_gpu as f64 <= 100.0);
    (!capped).then_some(Error::SharedGpu {
        pes: node_pes,
        gpus,
        per_gpu,
    })
}

/// Check that a CUDA driver and at least one GPU are there, without panicking.
fn check_gpu() -> Result<i32> {
    // cudarc's loader panics when libcuda is missing; ask first.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::NoGpu(
            "the CUDA driver library (libcuda.so.1) could not be loaded: install the NVIDIA \
             driver (>= 580) or make LD_LIBRARY_PATH include its directory"
                .into(),
        ));
    }
    cudarc::driver::result::init().map_err(|e| {
        Error::NoGpu(format!(
            "cuInit failed ({e:?}): is a GPU visible? check nvidia-smi and CUDA_VISIBLE_DEVICES"
        ))
    })?;
    let count = cudarc::driver::result::device::get_count()
        .map_err(|e| Error::NoGpu(format!("cuDeviceGetCount failed: {e:?}")))?;
    if count == 0 {
        return Err(Error::NoGpu(
            "the CUDA driver sees no GPU (check CUDA_VISIBLE_DEVICES)".into(),
        ));
    }
    Ok(count)
}

fn check_library_version() -> Result<()> {
    let (major, minor, patch) = library_version();
    same_release(sys::BUILD_VERSION, &format!("{major}.{minor}.{patch}"))
}

/// The host library must be the release the bindings and the cubins' device library came
/// from: NVSHMEM's device state layout changes between releases.
fn same_release(built: &str, running: &str) -> Result<()> {
    if running != built {
        return Err(Error::LibraryMismatch {
            built: built.to_string(),
            running: running.to_string(),
        });
    }
    Ok(())
}

/// `NVSHMEM_SYMMETRIC_SIZE` as NVSHMEM reads it: bytes with an optional K/M/G/T suffix.
pub(crate) fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => (&t[..i], t[i..].trim()),
        None => (t, ""),
    };
    let value: f64 = digits.parse().ok()?;
    let scale: f64 = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 1.0,
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((value * scale) as usize)
}

impl Nvshmem {
    /// Start NVSHMEM and build the runtime: the part of [`init`](Self::init) below the
    /// layers whose services it then loads (src/start.rs).
    pub(crate) fn start_runtime(
        options: InitOptions,
        uid: Option<(usize, usize, &UniqueId)>,
    ) -> Result<Self> {
        let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
        match *state {
            State::Running => return Err(Error::AlreadyInitialized),
            State::Finalized => return Err(Error::Finalized),
            State::NotStarted => {}
        }
        if uid.is_none() && UNIQUE_ID_MADE.load(Ordering::SeqCst) {
            return Err(Error::InvalidArgument(
                "this process made a UniqueId, which selects NVSHMEM's unique-ID bootstrap: start \
                 with Nvshmem::init_with_unique_id, not Nvshmem::init"
                    .into(),
            ));
        }
        let _host = host_call();
        let chosen = options.chosen_device()?;
        check_library_version()?;
        let device_count = check_gpu()?;

        // What the header's nvshmemx_init_init_attr_ver_only() does: each struct carries
        // (1 << 16) + its size.
        fn version_of<T>() -> i32 {
            (1 << 16) + std::mem::size_of::<T>() as i32
        }
        let mut attr = sys::nvshmemx_init_attr_t {
            version: version_of::<sys::nvshmemx_init_attr_t>(),
            args: sys::nvshmemx_init_args_t {
                version: version_of::<sys::nvshmemx_init_args_t>(),
                uid_args: sys::nvshmemx_uniqueid_args_t {
                    version: version_of::<sys::nvshmemx_uniqueid_args_t>(),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        };
        // The attributes keep a pointer to the ID: it must live until init returns.
        let id_copy = uid.map(|(_, _, id)| id.0);
        let mut flags = 0;
        if let (Some((rank, n, _)), Some(id)) = (uid, id_copy.as_ref()) {
            check("nvshmemx_set_attr_uniqueid_args", unsafe {
                sys::nvshmemx_set_attr_uniqueid_args(rank as i32, n as i32, id, &mut attr)
            })?;
            flags = sys::NVSHMEMX_INIT_WITH_UNIQUEID;
        }
        // NVSHMEM's start waits for every PE, inside the bootstrap, with no time limit.
        let limit = options.start_limit()?;
        let who = match uid {
            Some((rank, n, _)) => format!("rank {rank} of {n} (unique-ID bootstrap)"),
            None => format!("this PE ({} bootstrap)", bootstrap_name()),
        };
        let watchdog = Watchdog::spawn(limit, move || {
            diag::error_pe!(
                None,
                "the start of NVSHMEM on {who} has waited {:.0?} for the other PEs: one \
                 did not start, failed, or has another unique ID. A blocked start cannot be \
                 cancelled, so this process exits (status 1). Raise {START_TIMEOUT_VARIABLE} \
                 (seconds, 0 for no limit) if the PEs start slowly.",
                limit.unwrap_or_default()
            );
            exit_now(1);
        });
        check("nvshmemx_hostlib_init_attr", unsafe {
            sys::nvshmemx_hostlib_init_attr(flags as u32, &mut attr)
        })?;
        // From here on a failure must finalize again.
        let started = (|| {
            let my_pe = unsafe { sys::nvshmem_my_pe() };
            let n_pes = unsafe { sys::nvshmem_n_pes() };
            let node_pe = unsafe { sys::nvshmem_team_my_pe(sys::NVSHMEMX_TEAM_NODE) };
            let node_n_pes = unsafe { sys::nvshmem_team_n_pes(sys::NVSHMEMX_TEAM_NODE) };
            if my_pe < 0 || n_pes <= 0 || node_pe < 0 {
                return Err(Error::Nvshmem {
                    call: "nvshmem_my_pe",
                    status: my_pe,
                });
            }
            let ordinal = chosen.unwrap_or(node_pe as usize % device_count as usize);
            if ordinal >= device_count as usize {
                return Err(Error::NoGpu(format!(
                    "CUDA device {ordinal} asked for, but only {device_count} are visible (check \
                     CUDA_VISIBLE_DEVICES)"
                )));
            }
            // (A device chosen by the caller is the caller's to share.)
            let sharing = chosen.is_none().then(|| {
                gpu_sharing_problem(node_n_pes.max(1) as usize, device_count as usize, |name| {
                    std::env::var(name).ok()
                })
            });
            if let Some(e) = sharing.flatten() {
                return Err(e);
            }
            // Before NVSHMEM's GPU-side start, which exits the process when it finds no
            // transport to some PE.
            let node_n = node_n_pes.max(1) as usize;
            let mut reach = transport::Reach {
                n_pes: n_pes as usize,
                node_n_pes: node_n,
                p2p_disabled: transport::p2p_disabled(|name| std::env::var(name).ok()),
                // Where the other PEs' GPUs are is known only when each picks by its rank.
                unmapped: match chosen {
                    None => transport::unmapped_peers(ordinal, node_n, device_count as usize),
                    Some(_) => Vec::new(),
                },
                no_network: None,
            };
            if reach.p2p_disabled || !reach.unmapped.is_empty() || reach.n_pes > node_n {
                reach.no_network = transport::network_problem_here();
            }
            if let Some(why) = transport::transport_problem(&reach) {
                return Err(Error::NoTransport(why));
            }
            let ctx = match &options.context {
                Some(ctx) => {
                    ctx.bind_to_thread().during("cuCtxSetCurrent")?;
                    ctx.clone()
                }
                None => CudaContext::new(ordinal).during("cuDevicePrimaryCtxRetain")?,
            };
            let stream = ctx.new_stream().during("cuStreamCreate")?;
            // The host-library init only bootstraps; NVSHMEM sets up the GPU side lazily on the
            // first call that needs it, with a context current. Do it now, for every PE, so
            // that registering a module first (which does not trigger it) works.
            unsafe { sys::nvshmem_barrier_all() };
            drop(watchdog);
            let status = unsafe { sys::nvshmemx_init_status() };
            if status < sys::NVSHMEM_STATUS_IS_INITIALIZED as i32 {
                return Err(Error::NotInitialized { status });
            }
            // The runtime's exchange first: a collective allocation, before anything that
            // can fail on one PE alone (which would leave the others waiting in it).
            let team_words = team_sync::words(n_pes as usize);
            let exchange_scratch = exchange::alloc_scratch(n_pes as usize, team_words);
            let scratch_bytes = 8 * (WordExchange::scratch_words(n_pes as usize) + team_words);
            let heap = HeapConfig::from_env(|name| std::env::var(name).ok());
            let exchange_scratch = exchange_scratch.ok_or(Error::HeapExhausted {
                requested: scratch_bytes,
                in_use: 0,
                pe: my_pe as usize,
                limit: crate::error::HeapLimit::SymmetricSize(heap.symmetric_size),
            })?;
            let heap_model = {
                let first = exchange_scratch as u64;
                let (reserved, fixed_size) = measure_heap(first, my_pe);
                let mut model = HeapModel::new(&heap, reserved, fixed_size);
                let need = footprint(scratch_bytes, 0).unwrap_or(scratch_bytes);
                model.place(&heap, 0, need, 0, my_pe as usize);
                model
            };
            let wait_limit = seconds_variable(WAIT_TIMEOUT_VARIABLE, DEFAULT_WAIT_TIMEOUT)?;
            // SAFETY: just allocated alike on every PE, zeroed; freed at finalize, after the
            // last exchange.
            let exchange = unsafe {
                WordExchange::new(
                    exchange_scratch,
                    &ctx,
                    (0..n_pes as usize).collect(),
                    my_pe as usize,
                )?
            };
            // SAFETY: the words after the exchange's, in the same allocation.
            let team_syncs = unsafe {
                let words = WordExchange::scratch_words(n_pes as usize);
                let base = exchange_scratch.add(words) as u64;
                team_sync::TeamSyncs::new(base, &ctx, my_pe as usize, n_pes as usize)?
            };
            Ok(Runtime {
                ctx,
                stream,
                my_pe: my_pe as usize,
                n_pes: n_pes as usize,
                node_pe: node_pe as usize,
                node_n_pes: node_n_pes.max(1) as usize,
                heap,
                heap_in_use: AtomicUsize::new(0),
                heap_model: Mutex::new(heap_model),
                wait_limit,
                exchange: Mutex::new(exchange),
                exchange_scratch: exchange_scratch as u64,
                team_syncs,
                pinned: Default::default(),
                wait_streams: Mutex::new(Vec::new()),
                services: Mutex::new(Vec::new()),
                modules: Mutex::new(Default::default()),
            })
        })();
        let runtime = match started {
            Ok(r) => r,
            Err(e) => {
                unsafe { sys::nvshmemx_hostlib_finalize() };
                *state = State::Finalized;
                return Err(e);
            }
        };
        *state = State::Running;
        Ok(Nvshmem {
            rt: Arc::new(runtime),
        })
    }

    /// This PE's number in the world team.
    pub fn my_pe(&self) -> usize {
        self.rt.my_pe
    }

    /// The number of PEs in the world team.
    pub fn n_pes(&self) -> usize {
        self.rt.n_pes
    }

    /// This PE's number among the PEs of its node.
    pub fn node_pe(&self) -> usize {
        self.rt.node_pe
    }

    /// The number of PEs on this node.
    pub fn node_n_pes(&self) -> usize {
        self.rt.node_n_pes
    }

    /// The CUDA device this PE runs on.
    pub fn device_ordinal(&self) -> usize {
        self.rt.ctx.ordinal()
    }

    /// The CUDA context (the device's primary context, or the one given to
    /// [`InitOptions::context`]).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.rt.ctx
    }

    /// The multiprocessors this PE's context may use (under MPS with
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, fewer than the GPU has).
    pub(crate) fn sm_count(&self) -> Result<u32> {
        let sms = self
            .rt
            .ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .during("cuDeviceGetAttribute")?;
        Ok(sms.max(0) as u32)
    }

    /// Bytes of this GPU's L2 cache.
    #[cfg(feature = "tp")]
    pub(crate) fn l2_bytes(&self) -> Result<usize> {
        let bytes = self
            .rt
            .ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .during("cuDeviceGetAttribute")?;
        Ok(bytes.max(0) as usize)
    }

    /// The stream the blocking host operations of this crate use.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.rt.stream
    }

    /// A new stream on this PE's GPU.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.rt.ctx.new_stream().during("cuStreamCreate")
    }

    /// Where `addr` (this PE's symmetric memory) sits in its heap: bytes from the runtime's
    /// first allocation, the same on every PE for buffers allocated alike.
    pub(crate) fn heap_offset(&self, addr: u64) -> u64 {
        addr.wrapping_sub(self.rt.exchange_scratch)
    }

    /// Bytes of symmetric heap this crate's buffers (and its own workspaces) hold on this PE.
    pub fn heap_in_use(&self) -> usize {
        self.rt.heap_in_use.load(Ordering::Relaxed)
    }

    /// This PE's symmetric heap as the check before each allocation models it: NVSHMEM's own
    /// blocks, the crate's, and what is mapped.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let heap = shmem.heap_usage();
    /// println!("NVSHMEM holds {} MiB of the heap, buffers {} MiB", heap.nvshmem >> 20, heap.buffers >> 20);
    /// # Ok(())
    /// # }
    /// ```
    pub fn heap_usage(&self) -> HeapUsage {
        self.heap_model().usage()
    }

    pub(crate) fn heap_model(&self) -> MutexGuard<'_, HeapModel> {
        self.rt.heap_model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The NVSHMEM release running (`major.minor.patch`).
    pub fn version(&self) -> String {
        let (a, b, c) = library_version();
        format!("{a}.{b}.{c}")
    }

    /// Make this PE's context current on the calling thread, for CUDA calls.
    pub(crate) fn bind_context(&self) -> Result<()> {
        self.rt.ctx.bind_to_thread().during("cuCtxSetCurrent")
    }

    /// Take the host library for this thread ([`HostCall`]) and make this PE's context
    /// current: what every NVSHMEM host call needs.
    pub(crate) fn host_call(&self) -> Result<HostCall> {
        let host = host_call();
        self.bind_context()?;
        Ok(host)
    }

    /// Publish `record` and collect every PE's through the runtime's own exchange (the
    /// allocation check's), waiting at most `limit`; past it the runtime is stranded, `what`
    /// naming the wait.
    pub(crate) fn exchange(
        &self,
        record: &[u64; RECORD_WORDS],
        limit: Option<Duration>,
        during_wait: DuringWait,
        what: impl FnOnce() -> String,
    ) -> Result<Exchanged> {
        // The host library before the exchange, the order every path takes.
        let _host = self.host_call()?;
        let mut exchange = lock_letting_go(&self.rt.exchange);
        self.exchange_through(&mut exchange, record, limit, during_wait, what)
    }

    /// [`exchange`](Self::exchange) through `exchange`, another layer's own (with scratch of
    /// its own, so that its records never meet the runtime's).
    pub(crate) fn exchange_through(
        &self,
        exchange: &mut WordExchange,
        record: &[u64; RECORD_WORDS],
        limit: Option<Duration>,
        during_wait: DuringWait,
        what: impl FnOnce() -> String,
    ) -> Result<Exchanged> {
        check_not_stranded()?;
        let _host = self.host_call()?;
        let out = match exchange.exchange(record, limit, during_wait) {
            Ok(out) => out,
            Err(e) => {
                // The other PEs may be waiting for this one's record: it cannot go on with them.
                strand(format!("PE {}: {} failed: {e}", self.my_pe(), what()));
                return Err(e);
            }
        };
        if let Exchanged::GaveUp(member) = &out {
            let pe = exchange.world_pe(*member);
            strand(format!(
                "PE {}: {} waited {:?} (NVSHMEM_RS_TIMEOUT) for PE {pe} and gave up",
                self.my_pe(),
                what(),
                limit.unwrap_or_default()
            ));
        }
        Ok(out)
    }

    /// How long a host-side wait for the other PEs may last (`NVSHMEM_RS_TIMEOUT`).
    pub(crate) fn wait_limit(&self) -> Option<Duration> {
        self.rt.wait_limit
    }

    /// Zero `bytes` of this PE's memory at `ptr` on `stream` and wait for it.
    ///
    /// # Safety
    /// `ptr` starts `bytes` of this GPU's memory that nothing else uses meanwhile.
    pub(crate) unsafe fn zero_and_wait(
        &self,
        stream: &CudaStream,
        ptr: u64,
        bytes: usize,
    ) -> Result<()> {
        self.bind_context()?;
        cudarc::driver::result::memset_d8_async(ptr, 0, bytes, stream.cu_stream())
            .during("cuMemsetD8Async")?;
        stream.synchronize().during("cuStreamSynchronize")
    }

    /// A stream of its own for one host-side wait (a flag's polls, a new buffer's zeroing):
    /// on a shared stream (the runtime's) the wait would queue behind other threads' work,
    /// which may itself wait for this thread. Taken from the runtime's streams for waits and
    /// given back when the value drops: not a stream made and destroyed per wait, since
    /// either waits for a lock of the driver that a thread inside a blocking synchronisation
    /// can hold until the GPU is done (see `order::with_recorded`).
    pub(crate) fn wait_stream(&self) -> Result<WaitStream<'_>> {
        let pooled = lock(&self.rt.wait_streams).pop();
        let stream = match pooled {
            Some(s) => s,
            None => {
                self.bind_context()?;
                self.rt.ctx.new_stream().during("cuStreamCreate")?
            }
        };
        Ok(WaitStream {
            stream: Some(stream),
            pool: &self.rt.wait_streams,
        })
    }

    /// The id of the capture `stream` takes part in (also one already invalidated), if any.
    pub(crate) fn capture_id(&self, stream: &Arc<CudaStream>) -> Result<Option<u64>> {
        use cudarc::driver::sys::CUstreamCaptureStatus as Status;
        use std::ptr::null_mut as null;
        self.bind_context()?;
        let (mut status, mut id) = (Status::CU_STREAM_CAPTURE_STATUS_NONE, 0);
        // SAFETY: a live stream of this context; the outputs not asked for are null (optional).
        unsafe {
            cudarc::driver::sys::cuStreamGetCaptureInfo_v3(
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

    /// Wait until nothing runs on this PE's GPU, on any stream: before memory that kernels
    /// may still use is freed or NVSHMEM state they may use is torn down.
    pub(crate) fn quiesce(&self) -> Result<()> {
        check_not_stranded()?;
        self.bind_context()?;
        self.rt.ctx.synchronize().during("cuCtxSynchronize")
    }

    /// Check a PE number against the world team.
    pub(crate) fn check_pe(&self, pe: usize) -> Result<i32> {
        if pe >= self.rt.n_pes {
            return Err(Error::PeOutOfRange {
                pe,
                n_pes: self.rt.n_pes,
            });
        }
        Ok(pe as i32)
    }

    /// Fail unless `other` is this runtime (buffers, teams and views carry their runtime).
    pub(crate) fn check_same_runtime(&self, other: &Nvshmem, what: &'static str) -> Result<()> {
        if Arc::ptr_eq(&self.rt, &other.rt) {
            Ok(())
        } else {
            Err(Error::ForeignRuntime { what })
        }
    }

    /// The raw handle of `stream`, after checking that it runs on this PE's GPU.
    pub(crate) fn raw_stream(&self, stream: &Arc<CudaStream>) -> Result<sys::cudaStream_t> {
        check_device(
            "the stream",
            stream.context().ordinal(),
            self.device_ordinal(),
        )?;
        Ok(stream.cu_stream() as sys::cudaStream_t)
    }

    /// The runtime's service of type `S`, made by `init` on first use, locked.
    ///
    /// `init` runs with the service list locked: it must not ask for another service.
    pub(crate) fn with_service<S: Any + Send, R>(
        &self,
        init: impl FnOnce(&Nvshmem) -> Result<S>,
        use_it: impl FnOnce(&mut S) -> Result<R>,
    ) -> Result<R> {
        // The host library first, then the services: the order every path takes (a service's
        // `init` loads a module and an allocation's agreement is a service), so two threads
        // never hold one each.
        let _host = self.host_call()?;
        let service = {
            let mut services = lock(&self.rt.services);
            match services.iter().find(|(id, _)| *id == TypeId::of::<S>()) {
                Some((_, s)) => Arc::clone(s),
                None => {
                    let s: Service = Arc::new(Mutex::new(Box::new(init(self)?)));
                    services.push((TypeId::of::<S>(), Arc::clone(&s)));
                    s
                }
            }
        };
        let mut guard = lock_letting_go(&service);
        let s = guard
            .downcast_mut::<S>()
            .expect("services are stored under their own TypeId");
        use_it(s)
    }

    /// What this PE runs on and with, for logs.
    pub fn info(&self) -> Result<RuntimeInfo> {
        let ctx = &self.rt.ctx;
        Ok(RuntimeInfo {
            my_pe: self.rt.my_pe,
            n_pes: self.rt.n_pes,
            node_pe: self.rt.node_pe,
            node_n_pes: self.rt.node_n_pes,
            device: ctx.ordinal(),
            device_name: ctx.name().during("cuDeviceGetName")?,
            compute_capability: ctx.compute_capability().during("cuDeviceGetAttribute")?,
            nvshmem_version: self.version(),
            bootstrap: bootstrap_name(),
            heap_size: self.rt.heap.symmetric_size,
        })
    }
}

/// A lock, even if a thread panicked while holding it: the state it guards stays usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A stream, module or context of GPU `device` used where this PE's GPU `expected` is.
pub(crate) fn check_device(what: &'static str, device: usize, expected: usize) -> Result<()> {
    if device != expected {
        return Err(Error::WrongDevice {
            what,
            device,
            expected,
        });
    }
    Ok(())
}

/// The bootstrap NVSHMEM uses, as its environment selects it (PMI-1 unless told otherwise).
fn bootstrap_name() -> String {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match var("NVSHMEM_BOOTSTRAP").map(|b| b.to_ascii_uppercase()) {
        Some(b) if b != "PMI" => b,
        _ => format!(
            "PMI ({})",
            var("NVSHMEM_BOOTSTRAP_PMI").unwrap_or_else(|| "PMI-1".into())
        ),
    }
}

/// A printable summary of a PE's configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RuntimeInfo {
    /// This PE in the world team.
    pub my_pe: usize,
    /// PEs in the world team.
    pub n_pes: usize,
    /// This PE among those of its node.
    pub node_pe: usize,
    /// PEs on this node.
    pub node_n_pes: usize,
    /// The CUDA device ordinal.
    pub device: usize,
    /// The GPU's name.
    pub device_name: String,
    /// The GPU's compute capability `(major, minor)`.
    pub compute_capability: (i32, i32),
    /// The NVSHMEM release running.
    pub nvshmem_version: String,
    /// The bootstrap NVSHMEM was started with.
    pub bootstrap: String,
    /// The symmetric heap's size in bytes.
    pub heap_size: usize,
}

impl fmt::Display for RuntimeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PE {}/{} (node PE {}/{}) on GPU {} {} (sm_{}{}), NVSHMEM {}, bootstrap {}, symmetric heap {} MiB",
            self.my_pe,
            self.n_pes,
            self.node_pe,
            self.node_n_pes,
            self.device,
            self.device_name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.nvshmem_version,
            self.bootstrap,
            self.heap_size >> 20
        )
    }
}

pub(crate) fn note_alloc(rt: &Runtime, bytes: usize) {
    rt.heap_in_use.fetch_add(bytes, Ordering::Relaxed);
}

/// Where this PE's heap begins, as bytes below `first` (the runtime's first allocation, which
/// NVSHMEM's first fit puts just past its own blocks), and a fixed heap's size. The base is the
/// lowest address `nvshmem_ptr` maps to this PE (it tests addresses against the heap's range);
/// the size is the driver's range of the allocation that holds `first` (a fixed heap is one).
/// `(0, None)` where the search cannot tell.
fn measure_heap(first: u64, my_pe: i32) -> (usize, Option<usize>) {
    let _host = host_call();
    // SAFETY: nvshmem_ptr only compares the address with the heap's range.
    let in_heap =
        |a: u64| unsafe { !sys::nvshmem_ptr(a as *const std::ffi::c_void, my_pe).is_null() };
    let (mut below, mut inside) = (first.saturating_sub(1 << 42), first);
    if !in_heap(first) || in_heap(below) {
        return (0, None);
    }
    while inside - below > 1 {
        let mid = below + (inside - below) / 2;
        if in_heap(mid) {
            inside = mid;
        } else {
            below = mid;
        }
    }
    let (mut base, mut size) = (0, 0usize);
    // SAFETY: out-parameters for a query of a device address.
    let ranged =
        unsafe { cudarc::driver::sys::cuMemGetAddressRange_v2(&mut base, &mut size, first) };
    let fixed =
        (ranged == cudarc::driver::sys::CUresult::CUDA_SUCCESS && base == inside).then_some(size);
    ((first - inside) as usize, fixed)
}

pub(crate) fn note_free(rt: &Runtime, bytes: usize) {
    rt.heap_in_use.fetch_sub(bytes, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_wait_without_the_host_library_lets_other_threads_in_and_takes_it_back() {
        use std::sync::mpsc::channel;
        let outer = super::host_call();
        let inner = super::host_call();
        let (entered, entered_rx) = channel();
        let other = std::thread::spawn(move || {
            let _host = super::host_call();
            entered.send(()).unwrap();
        });
        // Held: the other thread cannot come in.
        assert!(entered_rx
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
        super::without_host_library(|| {
            entered_rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("another thread takes the host library during the wait");
        });
        other.join().unwrap();
        // Taken back with this thread's count: another thread is kept out until both
        // guards are gone.
        let (entered, entered_rx) = channel();
        let late = std::thread::spawn(move || {
            let _host = super::host_call();
            entered.send(()).unwrap();
        });
        drop(inner);
        assert!(entered_rx
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
        drop(outer);
        entered_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the lock is let go with the last guard");
        late.join().unwrap();
    }

    #[test]
    fn waiting_for_a_busy_lock_lets_the_host_library_go() {
        use std::sync::mpsc::channel;
        static BUSY: Mutex<u32> = Mutex::new(0);
        let held = BUSY.lock().unwrap();
        let (waiting, waiting_rx) = channel();
        let other = std::thread::spawn(move || {
            let _host = super::host_call();
            waiting.send(()).unwrap();
            *super::lock_letting_go(&BUSY) += 1;
            // The library is this thread's again.
            super::HOST_CALLS_HELD.with(|h| h.get())
        });
        waiting_rx.recv().unwrap();
        // The other thread holds the library and waits for BUSY: it must have let the
        // library go, or this would never return.
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(super::host_call());
        drop(held);
        assert_eq!(other.join().unwrap(), 1);
        assert_eq!(*BUSY.lock().unwrap(), 1);
    }

    #[test]
    fn several_pes_on_a_gpu_need_mps_with_capped_sms() {
        use super::gpu_sharing_problem as problem;
        fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        }
        // One PE per GPU (or fewer): nothing to set up.
        assert!(problem(4, 4, env(&[])).is_none());
        assert!(problem(1, 8, env(&[])).is_none());
        // Four PEs on one GPU: a quarter each, or NVSHMEM's override.
        let e = problem(4, 1, env(&[])).expect("refused").to_string();
        assert!(
            e.contains("4 PEs on this node share 1 GPU(s), up to 4 on one"),
            "{e}"
        );
        assert!(
            e.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at most 25"),
            "{e}"
        );
        assert!(e.contains("--share-gpus"), "{e}");
        let pct = |v: &str| problem(4, 1, env(&[("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", v)]));
        assert!(pct("25").is_none());
        assert!(pct("12.5").is_none());
        assert!(pct("50").is_some());
        assert!(pct("0").is_some());
        assert!(pct("lots").is_some());
        // Each rank bound to its own GPU by the launcher.
        assert!(problem(8, 1, env(&[("CUDA_VISIBLE_DEVICES", "3")])).is_none());
        let ignore = [("NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "1")];
        assert!(problem(4, 1, env(&ignore)).is_none());
        // Three PEs on two GPUs: two share one.
        assert!(matches!(
            problem(3, 2, env(&[])),
            Some(super::Error::SharedGpu { per_gpu: 2, .. })
        ));
    }

    use super::*;

    #[test]
    fn heap_sizes_parse_like_nvshmem() {
        assert_eq!(parse_size("1073741824"), Some(1 << 30));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("1.5g"), Some(3 << 29));
        assert_eq!(parse_size("lots"), None);
    }

    #[test]
    fn the_heap_configuration_follows_nvshmem_defaults_and_variables() {
        let none = HeapConfig::from_env(|_| None);
        assert_eq!(
            none,
            HeapConfig {
                symmetric_size: 1 << 30,
                grows: true,
                max_memory_per_gpu: 128 << 30,
                granularity: 512 << 20,
            }
        );
        let set = HeapConfig::from_env(|name| {
            Some(
                match name {
                    "NVSHMEM_SYMMETRIC_SIZE" => "4G",
                    "NVSHMEM_DISABLE_CUDA_VMM" => "1",
                    "NVSHMEM_MAX_MEMORY_PER_GPU" => "16g",
                    "NVSHMEM_CUMEM_GRANULARITY" => "2M",
                    _ => return None,
                }
                .to_string(),
            )
        });
        assert_eq!(set.symmetric_size, 4 << 30);
        assert!(!set.grows);
        assert_eq!(set.max_memory_per_gpu, 16 << 30);
        assert_eq!(set.granularity, 2 << 20);
        assert_eq!(parse_bool("TRUE"), Some(true));
        assert_eq!(parse_bool("off"), Some(false));
        assert_eq!(parse_bool("maybe"), None);
    }

    #[test]
    fn a_watchdog_fires_only_when_not_dropped_in_time() {
        use std::sync::atomic::AtomicBool;
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        let dog = Watchdog::spawn(Some(Duration::from_millis(50)), move || {
            f.store(true, Ordering::SeqCst)
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(fired.load(Ordering::SeqCst));
        drop(dog);

        let quiet = Arc::new(AtomicBool::new(false));
        let q = quiet.clone();
        let dog = Watchdog::spawn(Some(Duration::from_millis(200)), move || {
            q.store(true, Ordering::SeqCst)
        });
        drop(dog);
        std::thread::sleep(Duration::from_millis(400));
        assert!(!quiet.load(Ordering::SeqCst));
        // No limit: nothing is started.
        assert!(Watchdog::spawn(None, || panic!("no limit")).0.is_none());
    }

    #[test]
    fn start_timeouts_come_from_options_or_the_variable() {
        let set = InitOptions::new().start_timeout(Some(Duration::from_secs(3)));
        assert_eq!(set.start_limit().unwrap(), Some(Duration::from_secs(3)));
        let never = InitOptions::new().start_timeout(None);
        assert_eq!(never.start_limit().unwrap(), None);
    }

    #[test]
    fn another_release_of_the_host_library_is_refused_with_both_versions() {
        assert!(same_release("3.4.5", "3.4.5").is_ok());
        let e = same_release("3.4.5", "3.3.9").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("3.4.5") && text.contains("3.3.9") && text.contains("LD_LIBRARY_PATH"),
            "{text}"
        );
    }

    #[test]
    fn unique_ids_round_trip_and_reject_wrong_lengths() {
        let mut bytes = [0u8; UniqueId::SIZE];
        bytes.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let id = UniqueId::from_bytes(&bytes).unwrap();
        assert_eq!(id.to_bytes(), bytes);
        assert!(matches!(
            UniqueId::from_bytes(&bytes[1..]),
            Err(Error::Length { .. })
        ));
    }

    #[test]
    fn unique_id_ranks_are_checked_before_anything_starts() {
        let id = UniqueId::from_bytes(&[0u8; UniqueId::SIZE]).unwrap();
        let e = Nvshmem::init_with_unique_id(4, 4, &id, InitOptions::new()).unwrap_err();
        assert!(matches!(e, Error::PeOutOfRange { pe: 4, n_pes: 4 }));
    }
}
