//! A threaded stress check: the promise that every type may be used from any thread
//! (src/lib.rs, "Threads") and that nothing deadlocks or passes wrong data on with `Ok`
//! (README, "When something goes wrong"), tested by doing everything at once.
//!
//! ```text
//! scripts/nvshmrun -np 4 target/release/stress_check [--seconds 20] [--threads 8] [--seed N]
//! ```
//!
//! To narrow a failure down, `--skip send,recv` (any of alloc, send, recv, ping, pong, mix)
//! leaves those threads idle, `--cooperative true` launches the collectives cooperatively
//! and `--programmatic false` without programmatic stream serialization.
//!
//! Every PE runs `--threads` threads (8, the default, is one per role; more add mixers and
//! collective threads in turn) sharing one [`Nvshmem`] for `--seconds`, after a warm-up run
//! of a fifth of that (1 to 5 s). Each thread has one role:
//!
//! - **alloc**: symmetric allocations (`malloc`, `calloc`, `malloc_aligned`, 0 to 1 MiB) and
//!   frees, oldest first; every buffer is written, read back from the next PE after a barrier
//!   and checked again before its free. Now and then it builds a `Channel` or a `PagePool`,
//!   uses it once and drops it. Between its collective steps it does page-pool rounds.
//! - **coll-0, coll-1** (and more): one shared [`Collectives`], called in turns (call `k` is
//!   made by collective thread `k % threads`), coll-0 on the runtime's stream and the others
//!   on streams of their own: all-reduce (i32, and f32 holding integers, in place or not),
//!   all-gather, reduce-scatter, reduce, broadcast, all-to-all and all-to-all-v of up to 16 KiB
//!   per PE, every element checked, bit for bit.
//! - **send, recv**: messages of random lengths around the ring of channels (PE `i` to
//!   `i + 1`): the sender on its PE's outgoing channel, the receiver on its incoming one.
//! - **ping, pong**: flags. `ping` sets a word on the next PE (by `p`, `put`, `atomic_set`,
//!   `signal_op`, or `put_signal` with a payload) and waits (`wait_until`, `signal_wait_until`)
//!   for that PE's `pong` to answer the same way; then the same with its own PE's `pong`
//!   through `copy_from_host`.
//! - **mix** (and more): puts and gets (blocking and `_nbi`), `p`/`g` and every atomic into the
//!   thread's own slots on a random PE, read back and checked; and page-pool rounds: pages of a
//!   random PE allocated, written (this PE's own in place, the others by a scatter), checked
//!   to be allocated, gathered back, checked and freed.
//!
//! # How the PEs agree without talking
//! Whatever is collective has one thread per PE driving it, in a sequence every PE draws from
//! the same seed: the allocator's allocations, frees and constructors; the calls of the shared
//! `Collectives` (the turns make their order the same on every PE, whatever the threads'
//! timing). Each protocol ends the same way everywhere: PE 0's clock ends the allocator's
//! rounds (a word it puts on every PE before the round's barrier), the collective threads vote
//! every 8th call (an all-reduce of "my time is up"), and senders mark their last message and
//! last flag, which their partners answer before they stop. Everything shared is built before
//! the threads start and dropped after they end, in one order on every PE.
//!
//! # Why some threads bypass the host library's lock
//! An agreement (allocation, free, barrier) holds the host library's lock while it waits for
//! the other PEs, and a PE's free waits for its whole GPU. So a thread whose GPU work a peer
//! waits for (the collective and channel threads) must never wait for the lock: that would
//! close a cycle through the peer's free. They move their data with cudarc's stream-ordered
//! copies on their own streams; every other thread uses the crate's host calls. For the same
//! reason the collectives do not check their calls (`check_calls`: an agreement per call).
//!
//! # Failures and hangs
//! Every checked operation counts once, as passed or failed, under its kind; a failure is
//! printed with its PE, thread and what was wrong. A watchdog takes an operation that lasts
//! longer than a minute for a hang: it prints what every thread of the PE is doing and exits
//! with status 1 (our collectives give up after 30 s, `NVSHMEM_RS_TIMEOUT` bounds the host's
//! waits). At the end, with everything dropped, the free device memory and the symmetric heap
//! in use must be what they were after the warm-up, as `coll_check --soak` compares them.
//! PE 0 prints the operations of each kind over all PEs and `N passed, M failed`; a PE with a
//! failure exits with status 1.

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::cudarc::driver::{DeviceRepr, DriverError};
use nvshmem::pool::{PageId, PagePool, PagePoolConfig};
use nvshmem::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Cmp, Collectives, CollectivesConfig,
    CudaStream, Element, Nvshmem, ReduceAlgo, ReduceOp, ReduceScatterAlgo, SignalOp,
    SymmetricBuffer, SymmetricView,
};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvshmem_checks::splitmix;

use splitmix::{mix, SplitMix64};

const USAGE: &str = "usage: stress_check [--seconds S] [--threads T (at least 8)] [--seed N] \
                     [--skip alloc,send,recv,ping,pong,mix] [--cooperative true] \
                     [--programmatic false]";

/// An operation that lasts longer than this is taken for a hang.
const OP_LIMIT: Duration = Duration::from_secs(60);
/// How long our collectives wait for a peer before the call fails: shorter than `OP_LIMIT`,
/// so that a collective that cannot finish is the library's error, not the watchdog's.
const COLL_TIMEOUT: Duration = Duration::from_secs(30);
/// Elements of a PE's block in a collective call, at most (16 KiB of i32).
const COLL_MAX: usize = 4096;
/// Every this many calls, the collective threads vote on stopping.
const VOTE_EVERY: u64 = 8;
/// Words of a mixer's slot on every PE.
const SLOT: usize = 512;
/// Pages a pool user holds at once, at most.
const MAX_BATCH: usize = 8;
/// Bytes of a page: not a multiple of the gather's 4 KiB pieces, so every page ends short.
const PAGE_BYTES: usize = 4096 + 48;
/// Bytes of a page of the allocator's short-lived pools.
const CHURN_PAGE: usize = 256;
/// Words of the allocator's short-lived channels' messages, at most.
const CHURN_MAX: usize = 1024;
/// Words of the largest message of the ring, and its slots per channel.
const CHAN_MAX: usize = 3000;
const CHAN_DEPTH: usize = 3;
/// Symmetric buffers the allocator keeps at once, at most.
const MAX_LIVE: usize = 8;
/// The top bit of a flag's value: its sender's last round.
const STOP: u64 = 1 << 63;

/// What a buffer holds before a call that must not touch it (or a message that is shorter).
const FILL_I32: i32 = 0x5EED_F00D;
const FILL_F32: f32 = -1.5e30;
const FILL_U32: u32 = 0xDEAD_BEEF;

/// What a hash is of, so that no two kinds of data look alike.
const TAG_ALLOC: u64 = 1;
const TAG_CHURN: u64 = 2;
const TAG_PAGE: u64 = 3;
const TAG_RMA: u64 = 4;
const TAG_FLAG: u64 = 5;
const TAG_CALL: u64 = 6;
const TAG_COUNTS: u64 = 7;
const TAG_CHAN: u64 = 8;
const TAG_MIX: u64 = 9;

/// A hash of `parts` under `seed`: any PE can rebuild what any other wrote.
fn hash(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(seed, |h, &p| mix(h ^ p))
}

/// A number below `n` from `rng`.
fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---- outcomes -------------------------------------------------------------------------------

/// Why a checked operation failed: an error of a call, or data that is not what it must be.
struct Fail(String);

impl From<nvshmem::Error> for Fail {
    fn from(e: nvshmem::Error) -> Self {
        Fail(e.to_string())
    }
}

impl From<DriverError> for Fail {
    fn from(e: DriverError) -> Self {
        Fail(format!("CUDA: {e}"))
    }
}

type Outcome<T = ()> = Result<T, Fail>;

fn fail<T>(why: String) -> Outcome<T> {
    Err(Fail(why))
}

/// `got` must be `want`; otherwise how many elements differ, and the first.
fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Outcome {
    if got.len() != want.len() {
        return fail(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    let mut bad = (0..got.len()).filter(|&i| got[i] != want[i]);
    match bad.next() {
        None => Ok(()),
        Some(i) => fail(format!(
            "{what}: {} of {} elements wrong; the first, {i}: {:?}, expected {:?}",
            1 + bad.count(),
            got.len(),
            got[i],
            want[i]
        )),
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<String>(), panic.downcast_ref::<&str>()) {
        (Some(s), _) => format!("panicked: {s}"),
        (None, Some(s)) => format!("panicked: {s}"),
        _ => "panicked".into(),
    }
}

// ---- the tally ------------------------------------------------------------------------------

/// What a counted operation was.
#[derive(Clone, Copy)]
enum Kind {
    PutGet,
    PG,
    Atomics,
    FlagRemote,
    FlagLocal,
    Alloc,
    AllocPeer,
    Free,
    Barrier,
    Built,
    Pool,
    AllReduce,
    AllGather,
    ReduceScatter,
    Reduce,
    Broadcast,
    AllToAll,
    AllToAllV,
    Vote,
    Send,
    Recv,
    Setup,
    Memory,
    Panic,
}

const KINDS: usize = Kind::Panic as usize + 1;

impl Kind {
    const ALL: [Kind; KINDS] = [
        Kind::PutGet,
        Kind::PG,
        Kind::Atomics,
        Kind::FlagRemote,
        Kind::FlagLocal,
        Kind::Alloc,
        Kind::AllocPeer,
        Kind::Free,
        Kind::Barrier,
        Kind::Built,
        Kind::Pool,
        Kind::AllReduce,
        Kind::AllGather,
        Kind::ReduceScatter,
        Kind::Reduce,
        Kind::Broadcast,
        Kind::AllToAll,
        Kind::AllToAllV,
        Kind::Vote,
        Kind::Send,
        Kind::Recv,
        Kind::Setup,
        Kind::Memory,
        Kind::Panic,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::PutGet => "put + get",
            Kind::PG => "p + g",
            Kind::Atomics => "atomics",
            Kind::FlagRemote => "flag, another PE",
            Kind::FlagLocal => "flag, another thread",
            Kind::Alloc => "symmetric allocation",
            Kind::AllocPeer => "allocation, peer's copy",
            Kind::Free => "symmetric free",
            Kind::Barrier => "barrier",
            Kind::Built => "Channel/PagePool built",
            Kind::Pool => "page-pool round",
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Reduce => "reduce",
            Kind::Broadcast => "broadcast",
            Kind::AllToAll => "all_to_all",
            Kind::AllToAllV => "all_to_all_v",
            Kind::Vote => "stop vote (all_reduce)",
            Kind::Send => "channel send",
            Kind::Recv => "channel recv",
            Kind::Setup => "set-up and tear-down",
            Kind::Memory => "memory kept",
            Kind::Panic => "thread panicked",
        }
    }
}

/// Operations passed and failed on this PE, by kind.
struct Tally {
    passed: [AtomicU64; KINDS],
    failed: [AtomicU64; KINDS],
}

impl Tally {
    fn new() -> Self {
        Tally {
            passed: std::array::from_fn(|_| AtomicU64::new(0)),
            failed: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Count `outcome` under `kind`; print a failure with who had it. Whether it passed.
    fn record(&self, me: usize, who: &str, kind: Kind, outcome: Outcome) -> bool {
        let counter = match &outcome {
            Ok(()) => &self.passed,
            Err(Fail(why)) => {
                eprintln!("[PE {me}] FAIL {who}, {}: {why}", kind.name());
                &self.failed
            }
        };
        counter[kind as usize].fetch_add(1, Ordering::Relaxed);
        outcome.is_ok()
    }

    /// Passed and failed of every kind, in kind order: `[passed0, failed0, passed1, ...]`.
    fn words(&self) -> Vec<u64> {
        (0..KINDS)
            .flat_map(|k| {
                [
                    self.passed[k].load(Ordering::Relaxed),
                    self.failed[k].load(Ordering::Relaxed),
                ]
            })
            .collect()
    }

    fn sums(&self) -> (u64, u64) {
        let words = self.words();
        let passed = words.iter().step_by(2).sum();
        let failed = words.iter().skip(1).step_by(2).sum();
        (passed, failed)
    }
}

// ---- the watchdog -----------------------------------------------------------------------------

/// What a thread is doing, since when, and how long it may take.
struct Row {
    who: String,
    what: String,
    since: Instant,
    /// `None` while the thread is idle.
    limit: Option<Duration>,
}

/// What every thread of this PE is doing, for the watchdog.
struct Board {
    rows: Vec<Mutex<Row>>,
}

impl Board {
    fn new(rows: usize) -> Self {
        let idle = || {
            Mutex::new(Row {
                who: String::new(),
                what: "idle".into(),
                since: Instant::now(),
                limit: None,
            })
        };
        Board {
            rows: (0..rows).map(|_| idle()).collect(),
        }
    }

    fn claim(&self, row: usize, who: &str) {
        lock(&self.rows[row]).who = who.to_string();
        self.set(row, "starting".into());
    }

    /// Row `row` starts `what`, which may last `OP_LIMIT`.
    fn set(&self, row: usize, what: String) {
        self.set_for(row, what, OP_LIMIT);
    }

    fn set_for(&self, row: usize, what: String, limit: Duration) {
        let mut r = lock(&self.rows[row]);
        r.what = what;
        r.since = Instant::now();
        r.limit = Some(limit);
    }

    fn idle(&self, row: usize) {
        let mut r = lock(&self.rows[row]);
        r.what = "finished".into();
        r.limit = None;
    }

    /// A row past its limit: who, doing what, for how long.
    fn stuck(&self) -> Option<(String, String, Duration)> {
        self.rows.iter().find_map(|r| {
            let r = lock(r);
            let lasted = r.since.elapsed();
            (r.limit.is_some_and(|l| lasted > l)).then(|| (r.who.clone(), r.what.clone(), lasted))
        })
    }

    fn print(&self, me: usize) {
        for r in &self.rows {
            let r = lock(r);
            let state = match r.limit {
                Some(_) => format!("{:.1} s in", r.since.elapsed().as_secs_f64()),
                None => "idle after".into(),
            };
            eprintln!("[PE {me}]   {:<8} {state} `{}`", r.who, r.what);
        }
    }
}

/// Watch `board` on a thread of its own: an operation past its limit ends the process.
fn start_watchdog(board: Arc<Board>, tally: Arc<Tally>, me: usize) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(250));
        let Some((who, what, lasted)) = board.stuck() else {
            continue;
        };
        eprintln!(
            "[PE {me}] {who} has been in `{what}` for {:.0} s: taken for a hang. This PE's threads:",
            lasted.as_secs_f64()
        );
        board.print(me);
        let (passed, failed) = tally.sums();
        eprintln!(
            "[PE {me}] before it: {passed} passed, {failed} failed here; exiting with status 1"
        );
        exit_now(1);
    });
}

/// End the process at once: exit handlers would tear CUDA and NVSHMEM down under threads
/// that still use them.
fn exit_now(status: i32) -> ! {
    extern "C" {
        fn _exit(status: i32) -> !;
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process without running anything of it.
    unsafe { _exit(status) }
}

// ---- roles and the shared objects -----------------------------------------------------------

#[derive(Clone, Copy)]
enum Role {
    Alloc,
    Coll(usize),
    Send,
    Recv,
    Ping,
    Pong,
    Mix(usize),
}

impl Role {
    fn name(self) -> String {
        match self {
            Role::Alloc => "alloc".into(),
            Role::Coll(j) => format!("coll-{j}"),
            Role::Send => "send".into(),
            Role::Recv => "recv".into(),
            Role::Ping => "ping".into(),
            Role::Pong => "pong".into(),
            Role::Mix(j) => format!("mix-{j}"),
        }
    }
}

/// The least number of threads: one per role.
const MIN_THREADS: usize = 8;

/// The roles of `threads` threads, and how many collective threads and mixers they hold.
struct Plan {
    roles: Vec<Role>,
    colls: usize,
    mixers: usize,
}

impl Plan {
    fn new(threads: usize) -> Self {
        let mut roles = vec![
            Role::Alloc,
            Role::Coll(0),
            Role::Coll(1),
            Role::Send,
            Role::Recv,
            Role::Ping,
            Role::Pong,
            Role::Mix(0),
        ];
        let (mut colls, mut mixers) = (2, 1);
        while roles.len() < threads {
            if roles.len().is_multiple_of(2) {
                roles.push(Role::Mix(mixers));
                mixers += 1;
            } else {
                roles.push(Role::Coll(colls));
                colls += 1;
            }
        }
        Plan {
            roles,
            colls,
            mixers,
        }
    }
}

/// A collective thread's inputs and outputs (its own, so that calls in flight on two
/// threads never share a buffer).
struct CollBufs {
    src: SymmetricBuffer<i32>,
    dst: SymmetricBuffer<i32>,
    src_f: SymmetricBuffer<f32>,
    dst_f: SymmetricBuffer<f32>,
}

/// A page-pool user's staging: pages to scatter, and pages gathered.
struct PageBufs {
    src: SymmetricBuffer<u8>,
    dst: SymmetricBuffer<u8>,
}

/// Where the flag threads' words sit in `World::flags`, on every PE.
const PING: usize = 0; // set by the previous PE's ping
const PONG: usize = 1; // set by the next PE's pong, the answer
const LOCAL_PING: usize = 2; // set by this PE's ping
const LOCAL_PONG: usize = 3; // set by this PE's pong
const PING_DATA: usize = 4; // the previous PE's ping payload (put with signal)
const PONG_DATA: usize = 5; // the next PE's pong payload
const PING_SRC: usize = 6; // this PE's ping's source word for its puts
const PONG_SRC: usize = 7; // this PE's pong's
const FLAG_WORDS: usize = 8;

/// Everything the threads of one run share. Built before they start and freed after they
/// end, by one thread, in this order on every PE (it is all collective).
struct World {
    coll: Collectives,
    pool: PagePool,
    /// Channel `i` goes from PE `i` to PE `i + 1`.
    ring: Vec<Channel<u32>>,
    coll_bufs: Vec<CollBufs>,
    /// One per pool user: the mixers, then the allocator.
    page_bufs: Vec<PageBufs>,
    chan_src: SymmetricBuffer<u32>,
    chan_dst: SymmetricBuffer<u32>,
    /// Mixer `t` of PE `w` owns words `slot(w, t)..+SLOT` on every PE.
    slots: SymmetricBuffer<u64>,
    /// Mixer `t` of PE `w` owns counter `w * mixers + t` on every PE.
    counters: SymmetricBuffer<u64>,
    /// Each mixer's source and destination words of its puts and gets, on this PE.
    rma: SymmetricBuffer<u64>,
    flags: SymmetricBuffer<u64>,
    /// Set by PE 0's allocator when its time is up.
    stop: SymmetricBuffer<u64>,
    /// The allocator's short-lived channels' message, sent and received.
    churn_src: SymmetricBuffer<u32>,
    churn_dst: SymmetricBuffer<u32>,
}

impl World {
    fn build(shmem: &Nvshmem, plan: &Plan) -> nvshmem::Result<World> {
        let n = shmem.n_pes();
        let mut config = CollectivesConfig::for_pes(n);
        // A checked call is an agreement under the host library's lock (see the module
        // documentation), and the timeout is the run's, not the environment's.
        config.check_calls = false;
        config.timeout = Some(COLL_TIMEOUT);
        config.cooperative_launch = NARROWING.get().is_some_and(|n| n.cooperative);
        if let Some(n) = NARROWING.get() {
            config.programmatic_launch &= n.programmatic;
        }
        let coll = Collectives::with_config(shmem, config)?;
        let users = plan.mixers + 1;
        // Room for every user of every PE holding its most pages on one PE: running out is
        // a leak or a page handed out twice.
        let pool = PagePool::new(
            shmem,
            PagePoolConfig::new(n * users * MAX_BATCH, PAGE_BYTES),
        )?;
        let ring = (0..n)
            .map(|i| {
                Channel::new(
                    shmem,
                    ChannelConfig::new(i, (i + 1) % n, CHAN_MAX).depth(CHAN_DEPTH),
                )
            })
            .collect::<nvshmem::Result<Vec<_>>>()?;
        let coll_bufs = (0..plan.colls)
            .map(|_| {
                Ok(CollBufs {
                    src: shmem.malloc(n * COLL_MAX)?,
                    dst: shmem.malloc(n * COLL_MAX)?,
                    src_f: shmem.malloc(COLL_MAX)?,
                    dst_f: shmem.malloc(COLL_MAX)?,
                })
            })
            .collect::<nvshmem::Result<Vec<_>>>()?;
        let page_bufs = (0..users)
            .map(|_| {
                Ok(PageBufs {
                    src: shmem.malloc(MAX_BATCH * PAGE_BYTES)?,
                    dst: shmem.malloc(MAX_BATCH * PAGE_BYTES)?,
                })
            })
            .collect::<nvshmem::Result<Vec<_>>>()?;
        Ok(World {
            coll,
            pool,
            ring,
            coll_bufs,
            page_bufs,
            chan_src: shmem.malloc(CHAN_MAX)?,
            chan_dst: shmem.malloc(CHAN_MAX)?,
            slots: shmem.calloc(n * plan.mixers * SLOT)?,
            counters: shmem.calloc(n * plan.mixers)?,
            rma: shmem.malloc(plan.mixers * 2 * SLOT)?,
            flags: shmem.calloc(FLAG_WORDS)?,
            stop: shmem.calloc(1)?,
            churn_src: shmem.malloc(CHURN_MAX)?,
            churn_dst: shmem.malloc(CHURN_MAX)?,
        })
    }

    /// Free everything, in one order on every PE; the first error.
    fn tear_down(self) -> nvshmem::Result<()> {
        let World {
            coll,
            pool,
            ring,
            coll_bufs,
            page_bufs,
            chan_src,
            chan_dst,
            slots,
            counters,
            rma,
            flags,
            stop,
            churn_src,
            churn_dst,
        } = self;
        // Their frees report through the library's log; a refused one shows in the heap.
        drop(coll);
        drop(pool);
        drop(ring);
        let mut freed = Ok(());
        for b in coll_bufs {
            freed = freed
                .and(b.src.free())
                .and(b.dst.free())
                .and(b.src_f.free())
                .and(b.dst_f.free());
        }
        for b in page_bufs {
            freed = freed.and(b.src.free()).and(b.dst.free());
        }
        freed
            .and(chan_src.free())
            .and(chan_dst.free())
            .and(slots.free())
            .and(counters.free())
            .and(rma.free())
            .and(flags.free())
            .and(stop.free())
            .and(churn_src.free())
            .and(churn_dst.free())
    }
}

/// Whose turn it is among the collective threads: call `k` is made by thread `k % threads`,
/// so every PE makes the same calls in the same order.
struct Turns {
    /// The next call, and whether the calls have stopped.
    state: Mutex<(u64, bool)>,
    moved: Condvar,
}

impl Turns {
    fn new() -> Self {
        Turns {
            state: Mutex::new((0, false)),
            moved: Condvar::new(),
        }
    }

    /// Wait until call `k` may be made; `false` once the calls have stopped.
    fn wait_for(&self, k: u64) -> bool {
        let mut s = lock(&self.state);
        while !s.1 && s.0 != k {
            s = self.moved.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        !s.1
    }

    /// Call `k` is launched (or failed): the next may be made, unless `stop`.
    fn pass(&self, k: u64, stop: bool) {
        let mut s = lock(&self.state);
        s.0 = k + 1;
        s.1 |= stop;
        self.moved.notify_all();
    }

    fn stop(&self) {
        lock(&self.state).1 = true;
        self.moved.notify_all();
    }
}

/// What the threads of one run share.
struct Env<'a> {
    shmem: &'a Nvshmem,
    world: &'a World,
    plan: &'a Plan,
    board: &'a Board,
    tally: &'a Tally,
    turns: Turns,
    /// The run's seed, the same on every PE.
    seed: u64,
    deadline: Instant,
    me: usize,
    n: usize,
}

impl Env<'_> {
    fn next(&self) -> usize {
        (self.me + 1) % self.n
    }

    fn prev(&self) -> usize {
        (self.me + self.n - 1) % self.n
    }
}

/// One thread of a run.
struct Worker<'a> {
    env: &'a Env<'a>,
    row: usize,
    name: String,
}

impl Worker<'_> {
    fn doing(&self, what: String) {
        self.env.board.set(self.row, what);
    }

    fn record(&self, kind: Kind, outcome: Outcome) -> bool {
        self.env
            .tally
            .record(self.env.me, &self.name, kind, outcome)
    }

    fn time_up(&self) -> bool {
        Instant::now() >= self.env.deadline
    }

    /// A stream of this thread's own, or `None` (counted as a failure).
    fn new_stream(&self) -> Option<Arc<CudaStream>> {
        match self.env.shmem.new_stream() {
            Ok(s) => Some(s),
            Err(e) => {
                self.record(Kind::Setup, Err(e.into()));
                None
            }
        }
    }
}

fn run_role(env: &Env, row: usize, role: Role) {
    let w = Worker {
        env,
        row,
        name: role.name(),
    };
    env.board.claim(row, &w.name);
    if skipped(role) {
        env.board.idle(row);
        return;
    }
    let ran = catch_unwind(AssertUnwindSafe(|| match role {
        Role::Alloc => allocator(&w),
        Role::Coll(j) => collectives(&w, j),
        Role::Send => sender(&w),
        Role::Recv => receiver(&w),
        Role::Ping => ping(&w),
        Role::Pong => pong(&w),
        Role::Mix(j) => mixer(&w, j),
    }));
    if let Err(panic) = ran {
        w.record(Kind::Panic, fail(panic_text(panic.as_ref())));
        // The other collective threads of this PE must not wait for its turn.
        env.turns.stop();
    }
    env.board.idle(row);
}

// ---- alloc: symmetric allocations, frees and constructors ----------------------------------

/// A buffer the allocator keeps, and the round that wrote it.
struct Live {
    buf: SymmetricBuffer<u32>,
    round: u64,
}

/// The words PE `pe` wrote into the buffer it allocated in round `round`.
fn alloc_words(env: &Env, pe: usize, round: u64, len: usize) -> Vec<u32> {
    let base = hash(env.seed, &[TAG_ALLOC, pe as u64, round]);
    (0..len).map(|i| mix(base ^ i as u64) as u32).collect()
}

fn allocator(w: &Worker) {
    let env = w.env;
    let Some(stream) = w.new_stream() else {
        return;
    };
    // Drawn alike on every PE: what to allocate, free or build, and when.
    let mut shared = SplitMix64(hash(env.seed, &[TAG_ALLOC]));
    // This PE's own: its page-pool rounds.
    let mut own = SplitMix64(hash(env.seed, &[TAG_ALLOC, env.me as u64 + 1]));
    let mut live = VecDeque::new();
    for round in 1u64.. {
        let fresh = collective_step(w, &stream, round, &mut shared, &mut live);
        w.doing(format!("round {round}: barrier"));
        let stop = agree_to_stop(w);
        if let (true, Some(newest)) = (fresh, live.back()) {
            w.record(Kind::AllocPeer, check_peer_copy(w, newest, &mut shared));
        }
        let user = env.plan.mixers;
        w.record(Kind::Pool, pool_round(w, user, &stream, round, &mut own));
        match stop {
            Ok(false) => {}
            Ok(true) => break,
            Err(f) => {
                w.record(Kind::Barrier, Err(f));
                break;
            }
        }
    }
    // What is left, oldest first: the same sequence on every PE.
    while let Some(old) = live.pop_front() {
        w.record(Kind::Free, free_checked(w, old));
    }
}

/// This round's collective step, drawn alike on every PE; whether it allocated a buffer.
fn collective_step(
    w: &Worker,
    stream: &Arc<CudaStream>,
    round: u64,
    shared: &mut SplitMix64,
    live: &mut VecDeque<Live>,
) -> bool {
    let draw = shared.next_u64();
    if round.is_multiple_of(16) {
        w.record(Kind::Built, churn_channel(w, stream, round, shared));
        false
    } else if round % 16 == 8 {
        w.record(Kind::Built, churn_pool(w, stream, round));
        false
    } else if !live.is_empty() && (live.len() == MAX_LIVE || draw.is_multiple_of(3)) {
        let old = live.pop_front().expect("a live buffer");
        w.record(Kind::Free, free_checked(w, old));
        false
    } else {
        match allocate(w, round, shared) {
            Ok((buf, zeroed)) => {
                w.record(Kind::Alloc, write_new(w, &buf, round, zeroed));
                // Kept even if its check failed: every PE frees what every PE allocated.
                live.push_back(Live { buf, round });
                true
            }
            Err(e) => {
                w.record(Kind::Alloc, Err(e.into()));
                false
            }
        }
    }
}

/// A buffer of a drawn size and kind; whether it is zeroed.
fn allocate(
    w: &Worker,
    round: u64,
    shared: &mut SplitMix64,
) -> nvshmem::Result<(SymmetricBuffer<u32>, bool)> {
    let sh = w.env.shmem;
    let (a, b, c) = (shared.next_u64(), shared.next_u64(), shared.next_u64());
    // Up to 1 MiB, sizes spread over every power of two, and now and then none at all.
    let len = if a.is_multiple_of(32) {
        0
    } else {
        1 + (b % (1u64 << (a % 19))) as usize
    };
    match c % 3 {
        0 => {
            w.doing(format!("round {round}: malloc of {len} words"));
            Ok((sh.malloc(len)?, false))
        }
        1 => {
            w.doing(format!("round {round}: calloc of {len} words"));
            Ok((sh.calloc(len)?, true))
        }
        _ => {
            let align = 16usize << (c / 3 % 9);
            w.doing(format!(
                "round {round}: malloc_aligned({align}) of {len} words"
            ));
            Ok((sh.malloc_aligned(align, len)?, false))
        }
    }
}

/// A new buffer: zeroed if it must be; then this PE's words, read back.
fn write_new(w: &Worker, buf: &SymmetricBuffer<u32>, round: u64, zeroed: bool) -> Outcome {
    w.doing(format!("round {round}: writing {} words", buf.len()));
    if zeroed {
        same("a calloc'd buffer", &buf.to_vec()?, &vec![0; buf.len()])?;
    }
    let words = alloc_words(w.env, w.env.me, round, buf.len());
    buf.copy_from_host(&words)?;
    same("a new buffer, read back", &buf.to_vec()?, &words)
}

/// The next PE's copy of the newest buffer (written before the barrier), at four places.
fn check_peer_copy(w: &Worker, newest: &Live, shared: &mut SplitMix64) -> Outcome {
    let env = w.env;
    let picks = [shared.next_u64(), shared.next_u64()];
    let len = newest.buf.len();
    if len == 0 {
        return Ok(());
    }
    let next = env.next();
    w.doing(format!("round {}: reading PE {next}'s copy", newest.round));
    let want = alloc_words(env, next, newest.round, len);
    for i in [0, len - 1, picks[0] as usize % len, picks[1] as usize % len] {
        let got = env.shmem.g(&newest.buf, i, next)?;
        if got != want[i] {
            return fail(format!(
                "word {i} of PE {next}'s copy of round {}'s buffer: {got:#x}, expected {:#x}",
                newest.round, want[i]
            ));
        }
    }
    Ok(())
}

/// A buffer's words still as written, then its free (made whatever the check found).
fn free_checked(w: &Worker, old: Live) -> Outcome {
    let len = old.buf.len();
    w.doing(format!("free of round {}'s {len} words", old.round));
    let want = alloc_words(w.env, w.env.me, old.round, len);
    let intact = match old.buf.to_vec() {
        Ok(got) => same("a buffer before its free", &got, &want),
        Err(e) => Err(e.into()),
    };
    intact.and(old.buf.free().map_err(Fail::from))
}

/// Whether the allocator's rounds end here. PE 0's clock decides: it sets every PE's stop
/// word before the barrier, so every PE reads the same after it.
fn agree_to_stop(w: &Worker) -> Outcome<bool> {
    let env = w.env;
    let (sh, stop) = (env.shmem, &env.world.stop);
    if env.me == 0 && w.time_up() {
        for pe in 0..env.n {
            sh.p(stop, 0, 1u64, pe)?;
        }
    }
    sh.barrier_all()?;
    w.record(Kind::Barrier, Ok(()));
    Ok(sh.g(stop, 0, env.me)? != 0)
}

/// A channel from PE 0 to the last PE, built, used for one message and dropped while the
/// other threads run.
fn churn_channel(
    w: &Worker,
    stream: &Arc<CudaStream>,
    round: u64,
    shared: &mut SplitMix64,
) -> Outcome {
    let env = w.env;
    let len = 1 + below(shared, CHURN_MAX);
    let depth = 1 + below(shared, 3);
    w.doing(format!(
        "round {round}: Channel::new({len} words, depth {depth})"
    ));
    let ch = Channel::<u32>::new(
        env.shmem,
        ChannelConfig::new(0, env.n - 1, len).depth(depth),
    )?;
    let message: Vec<u32> = (0..len)
        .map(|i| hash(env.seed, &[TAG_CHURN, round, i as u64]) as u32)
        .collect();
    if env.me == 0 {
        w.doing(format!("round {round}: a message through the new channel"));
        let src = env.world.churn_src.view(..len);
        src.copy_from_host(&message)?;
        ch.send(&src, stream)?;
        stream.synchronize()?;
    }
    if env.me == env.n - 1 {
        w.doing(format!("round {round}: the message of the new channel"));
        let mut dst = env.world.churn_dst.view(..len);
        dst.copy_from_host(&vec![FILL_U32; len])?;
        ch.recv(&mut dst, stream)?;
        stream.synchronize()?;
        same("a new channel's message", &dst.to_vec()?, &message)?;
    }
    w.doing(format!("round {round}: dropping the channel"));
    drop(ch);
    Ok(())
}

/// A small page pool, built, one page of the next PE written and read back, dropped.
fn churn_pool(w: &Worker, stream: &Arc<CudaStream>, round: u64) -> Outcome {
    let env = w.env;
    let pages = 2 + (round / 16 % 5) as usize;
    w.doing(format!("round {round}: PagePool::new({pages} pages)"));
    let pool = PagePool::new(env.shmem, PagePoolConfig::new(pages, CHURN_PAGE))?;
    let next = env.next();
    let id = pool.alloc(next)?;
    let bytes = page_contents(env, env.me, usize::MAX, round, id, CHURN_PAGE);
    let bufs = &env.world.page_bufs[env.plan.mixers];
    let (src, dst) = (bufs.src.view(..CHURN_PAGE), bufs.dst.view(..CHURN_PAGE));
    src.copy_from_host(&bytes)?;
    pool.scatter(&[id], &src, stream)?;
    pool.gather(&dst, &[id], stream)?;
    stream.synchronize()?;
    let checked = same(&format!("{id} of a new pool"), &dst.to_vec()?, &bytes);
    w.doing(format!("round {round}: dropping the pool"));
    checked.and(pool.free(id).map_err(Fail::from))
}

// ---- the page pool, from the allocator and the mixers ---------------------------------------

/// The bytes pool user `user` of PE `pe` writes into page `id` in its round `round`.
fn page_contents(env: &Env, pe: usize, user: usize, round: u64, id: PageId, len: usize) -> Vec<u8> {
    let base = hash(
        env.seed,
        &[TAG_PAGE, pe as u64, user as u64, round, id.to_raw()],
    );
    (0..len.div_ceil(8) as u64)
        .flat_map(|j| mix(base ^ j).to_le_bytes())
        .take(len)
        .collect()
}

/// Pages of a random PE, allocated, used and freed (whatever the use found).
fn pool_round(
    w: &Worker,
    user: usize,
    stream: &Arc<CudaStream>,
    round: u64,
    rng: &mut SplitMix64,
) -> Outcome {
    let pool = &w.env.world.pool;
    let pe = below(rng, w.env.n);
    let k = 1 + below(rng, MAX_BATCH);
    let in_place = rng.next_u64();
    w.doing(format!(
        "pool round {round}: allocating {k} pages of PE {pe}"
    ));
    let ids = pool.alloc_n(pe, k)?;
    let used = use_pages(w, user, stream, round, &ids, in_place);
    w.doing(format!("pool round {round}: freeing {k} pages of PE {pe}"));
    used.and(pool.free_n(&ids).map_err(Fail::from))
}

/// Write `ids` (this PE's own pages in place where `in_place`'s bit says so, the others by
/// one scatter), check they are still allocated, gather them back and compare.
fn use_pages(
    w: &Worker,
    user: usize,
    stream: &Arc<CudaStream>,
    round: u64,
    ids: &[PageId],
    in_place: u64,
) -> Outcome {
    let env = w.env;
    let (pool, bufs) = (&env.world.pool, &env.world.page_bufs[user]);
    let pages: Vec<Vec<u8>> = ids
        .iter()
        .map(|&id| page_contents(env, env.me, user, round, id, PAGE_BYTES))
        .collect();
    w.doing(format!("pool round {round}: writing {} pages", ids.len()));
    let (mut scattered, mut staged) = (Vec::new(), Vec::new());
    for (j, (&id, page)) in ids.iter().zip(&pages).enumerate() {
        if id.pe as usize == env.me && (in_place >> j) & 1 == 1 {
            pool.page_view(id.index as usize)?.copy_from_host(page)?;
        } else {
            scattered.push(id);
            staged.extend_from_slice(page);
        }
    }
    if !scattered.is_empty() {
        let src = bufs.src.view(..staged.len());
        src.copy_from_host(&staged)?;
        pool.scatter(&scattered, &src, stream)?;
        stream.synchronize()?;
    }
    for &id in ids {
        if !pool.is_allocated(id)? {
            return fail(format!("{id} is not allocated while this thread holds it"));
        }
    }
    w.doing(format!("pool round {round}: gathering {} pages", ids.len()));
    let dst = bufs.dst.view(..ids.len() * PAGE_BYTES);
    pool.gather(&dst, ids, stream)?;
    stream.synchronize()?;
    same(
        &format!("{} pages gathered back", ids.len()),
        &dst.to_vec()?,
        &pages.concat(),
    )
}

// ---- mix: host RMA and atomics into this thread's slots, and the page pool ------------------

/// The first word of mixer `m` of PE `pe`'s slot, on every PE.
fn slot(env: &Env, pe: usize, m: usize) -> usize {
    (pe * env.plan.mixers + m) * SLOT
}

fn mixer(w: &Worker, m: usize) {
    let env = w.env;
    let Some(stream) = w.new_stream() else {
        return;
    };
    let mut rng = SplitMix64(hash(env.seed, &[TAG_MIX, env.me as u64, m as u64]));
    // What this thread's counter holds on every PE (only this thread changes it).
    let mut held = vec![0u64; env.n];
    let mut round = 0u64;
    while !w.time_up() {
        round += 1;
        let pe = below(&mut rng, env.n);
        match below(&mut rng, 4) {
            0 => {
                w.record(Kind::PutGet, put_get(w, m, pe, round, &mut rng));
            }
            1 => {
                w.record(Kind::PG, p_g(w, m, pe, round, &mut rng));
            }
            2 => {
                let r = atomics(w, m, pe, &mut rng, &mut held[pe]);
                if !w.record(Kind::Atomics, r) {
                    // Start again from what the counter holds, so that one failure is one.
                    let at = env.me * env.plan.mixers + m;
                    if let Ok(v) = env.shmem.atomic_fetch(&env.world.counters, at, pe) {
                        held[pe] = v;
                    }
                }
            }
            _ => {
                w.record(Kind::Pool, pool_round(w, m, &stream, round, &mut rng));
            }
        }
    }
}

/// Words put into this thread's slot on `pe` (blocking or `_nbi`), and got back.
fn put_get(w: &Worker, m: usize, pe: usize, round: u64, rng: &mut SplitMix64) -> Outcome {
    let env = w.env;
    let (sh, world) = (env.shmem, env.world);
    let len = 1 + below(rng, SLOT);
    let at = slot(env, env.me, m) + below(rng, SLOT - len + 1);
    let nbi = rng.next_u64() % 2 == 1;
    let words: Vec<u64> = (0..len as u64)
        .map(|i| hash(env.seed, &[TAG_RMA, env.me as u64, m as u64, round, i]))
        .collect();
    let mine = m * 2 * SLOT;
    let src = world.rma.view(mine..mine + len);
    let back = world.rma.view(mine + SLOT..mine + SLOT + len);
    let dest = world.slots.view(at..at + len);
    let how = if nbi { "_nbi" } else { "" };
    w.doing(format!("put{how} of {len} words to PE {pe}"));
    src.copy_from_host(&words)?;
    if nbi {
        sh.put_nbi(dest, src, pe)?;
    } else {
        sh.put(dest, src, pe)?;
    }
    sh.quiet()?;
    w.doing(format!("get{how} of {len} words from PE {pe}"));
    if nbi {
        sh.get_nbi(back, dest, pe)?;
        sh.quiet()?;
    } else {
        sh.get(back, dest, pe)?;
    }
    same(
        &format!("{len} words put to PE {pe} and got back"),
        &back.to_vec()?,
        &words,
    )
}

/// One word `p`'d into this thread's slot on `pe`, and `g`'d back.
fn p_g(w: &Worker, m: usize, pe: usize, round: u64, rng: &mut SplitMix64) -> Outcome {
    let env = w.env;
    let (sh, slots) = (env.shmem, &env.world.slots);
    let at = slot(env, env.me, m) + below(rng, SLOT);
    let v = hash(env.seed, &[TAG_RMA, env.me as u64, m as u64, round]);
    w.doing(format!("p and g of word {at} on PE {pe}"));
    sh.p(slots, at, v, pe)?;
    sh.quiet()?;
    let got = sh.g(slots, at, pe)?;
    if got != v {
        return fail(format!("g read {got:#x} from PE {pe}, p wrote {v:#x}"));
    }
    Ok(())
}

/// Atomics on this thread's counter on `pe`, whose value it knows (`held`): every fetched
/// value must be it.
fn atomics(w: &Worker, m: usize, pe: usize, rng: &mut SplitMix64, held: &mut u64) -> Outcome {
    let env = w.env;
    let (sh, c) = (env.shmem, &env.world.counters);
    let at = env.me * env.plan.mixers + m;
    let v = rng.next_u64() >> 4;
    let is = |what: &str, got: u64, want: u64| {
        if got == want {
            Ok(())
        } else {
            fail(format!("{what} on PE {pe}: {got:#x}, expected {want:#x}"))
        }
    };
    let which = below(rng, 6);
    w.doing(format!("atomics ({which}) on PE {pe}"));
    match which {
        0 => {
            let old = sh.atomic_fetch_add(c, at, v, pe)?;
            let r = is("fetch_add returned", old, *held);
            *held = held.wrapping_add(v);
            r
        }
        1 => {
            let old = sh.atomic_compare_swap(c, at, *held, v, pe)?;
            let r = is("compare_swap (equal) returned", old, *held);
            *held = v;
            // A condition that does not hold leaves the counter as it is.
            let old = sh.atomic_compare_swap(c, at, v ^ 1, 0, pe)?;
            r.and(is("compare_swap (unequal) returned", old, v))
        }
        2 => {
            let old = sh.atomic_swap(c, at, v, pe)?;
            let r = is("swap returned", old, *held);
            *held = v;
            r
        }
        3 => {
            sh.atomic_set(c, at, v, pe)?;
            *held = v;
            is("fetch after set", sh.atomic_fetch(c, at, pe)?, v)
        }
        4 => {
            let old = sh.atomic_fetch_inc(c, at, pe)?;
            let r = is("fetch_inc returned", old, *held);
            sh.atomic_add(c, at, v, pe)?;
            sh.atomic_inc(c, at, pe)?;
            *held = held.wrapping_add(v).wrapping_add(2);
            r.and(is(
                "fetch after inc, add, inc",
                sh.atomic_fetch(c, at, pe)?,
                *held,
            ))
        }
        _ => {
            let old = sh.atomic_fetch_or(c, at, v, pe)?;
            let r = is("fetch_or returned", old, *held);
            *held |= v;
            let old = sh.atomic_fetch_xor(c, at, v >> 3, pe)?;
            let r = r.and(is("fetch_xor returned", old, *held));
            *held ^= v >> 3;
            let old = sh.atomic_fetch_and(c, at, !v, pe)?;
            let r = r.and(is("fetch_and returned", old, *held));
            *held &= !v;
            r
        }
    }
}

// ---- ping and pong: flags set by other threads and other PEs --------------------------------

/// How a flag travels, by round.
#[derive(Clone, Copy, Debug)]
enum Route {
    P,
    Put,
    AtomicSet,
    SignalOp,
    PutSignal,
}

fn route(k: u64) -> Route {
    [
        Route::P,
        Route::Put,
        Route::AtomicSet,
        Route::SignalOp,
        Route::PutSignal,
    ][(k % 5) as usize]
}

/// One side's words: where its flag and its payload land, and its source word.
struct Words {
    flag: usize,
    data: usize,
    src: usize,
}

const PING_WORDS: Words = Words {
    flag: PING,
    data: PING_DATA,
    src: PING_SRC,
};
const PONG_WORDS: Words = Words {
    flag: PONG,
    data: PONG_DATA,
    src: PONG_SRC,
};

/// The payload PE `from` sends with its flag of round `k` when it goes by `put_signal`.
fn payload(env: &Env, from: usize, k: u64) -> u64 {
    hash(env.seed, &[TAG_FLAG, from as u64, k])
}

/// Set `to.flag` on PE `pe` to `v` by `route` (with `put_signal`, `data` into `to.data`
/// first); complete when it returns.
fn send_flag(w: &Worker, to: &Words, v: u64, data: u64, pe: usize, route: Route) -> Outcome {
    let (sh, f) = (w.env.shmem, &w.env.world.flags);
    let src = f.view(to.src..=to.src);
    match route {
        Route::P => {
            sh.p(f, to.flag, v, pe)?;
            sh.quiet()?;
        }
        Route::Put => {
            src.copy_from_host(&[v])?;
            sh.put(f.view(to.flag..=to.flag), src, pe)?;
            sh.quiet()?;
        }
        Route::AtomicSet => sh.atomic_set(f, to.flag, v, pe)?,
        Route::SignalOp => sh.signal_op(f, to.flag, v, SignalOp::Set, pe)?,
        Route::PutSignal => {
            src.copy_from_host(&[data])?;
            let dest = f.view(to.data..=to.data);
            sh.put_signal(dest, src, f, to.flag, v, SignalOp::Set, pe)?;
        }
    }
    Ok(())
}

/// Wait until this PE's flag word `at` reaches round `k` (`wait_until` and `signal_wait_until`
/// by turns); its value, which may carry `STOP`.
fn await_flag(w: &Worker, at: usize, k: u64) -> Outcome<u64> {
    let (sh, f) = (w.env.shmem, &w.env.world.flags);
    if k.is_multiple_of(2) {
        sh.wait_until(f, at, Cmp::Ge, k)?;
        Ok(sh.signal_fetch(f, at)?)
    } else {
        Ok(sh.signal_wait_until(f, at, Cmp::Ge, k)?)
    }
}

/// This PE's word `at`, read from the host: it must be `want`.
fn word_is(w: &Worker, at: usize, want: u64, what: &str) -> Outcome {
    let got = w.env.shmem.g(&w.env.world.flags, at, w.env.me)?;
    if got != want {
        return fail(format!("{what}: {got:#x}, expected {want:#x}"));
    }
    Ok(())
}

fn ping(w: &Worker) {
    let env = w.env;
    let next = env.next();
    for k in 1u64.. {
        let last = w.time_up();
        let v = k | if last { STOP } else { 0 };
        w.doing(format!(
            "round {k}: flag to PE {next} by {:?}, and its answer",
            route(k)
        ));
        let remote = w.record(Kind::FlagRemote, ping_remote(w, k, v, next));
        w.doing(format!("round {k}: flag to this PE's pong, and its answer"));
        let local = w.record(Kind::FlagLocal, ping_local(w, v));
        if last || !remote || !local {
            break;
        }
    }
}

fn ping_remote(w: &Worker, k: u64, v: u64, next: usize) -> Outcome {
    let env = w.env;
    let r = route(k);
    send_flag(w, &PING_WORDS, v, payload(env, env.me, k), next, r)?;
    let answer = await_flag(w, PONG, k)?;
    if answer != v {
        return fail(format!(
            "PE {next} answered round {k} with {answer:#x}, expected {v:#x}"
        ));
    }
    if let Route::PutSignal = r {
        word_is(w, PONG_DATA, payload(env, next, k), "the answer's payload")?;
    }
    Ok(())
}

fn ping_local(w: &Worker, v: u64) -> Outcome {
    let (sh, f) = (w.env.shmem, &w.env.world.flags);
    f.view(LOCAL_PING..=LOCAL_PING).copy_from_host(&[v])?;
    sh.wait_until(f, LOCAL_PONG, Cmp::Eq, v)?;
    Ok(())
}

/// Answers the previous PE's ping and this PE's, each until its last round.
fn pong(w: &Worker) {
    let prev = w.env.prev();
    let (mut remote, mut local) = (true, true);
    let mut k = 0;
    while remote || local {
        k += 1;
        if remote {
            w.doing(format!("round {k}: waiting for PE {prev}'s flag"));
            match pong_remote(w, k, prev) {
                Ok(v) => remote = w.record(Kind::FlagRemote, Ok(())) && (v & STOP) == 0,
                Err(f) => {
                    w.record(Kind::FlagRemote, Err(f));
                    return;
                }
            }
        }
        if local {
            w.doing(format!("round {k}: waiting for this PE's ping"));
            match pong_local(w, k) {
                Ok(v) => local = w.record(Kind::FlagLocal, Ok(())) && (v & STOP) == 0,
                Err(f) => {
                    w.record(Kind::FlagLocal, Err(f));
                    return;
                }
            }
        }
    }
}

fn pong_remote(w: &Worker, k: u64, prev: usize) -> Outcome<u64> {
    let env = w.env;
    let v = await_flag(w, PING, k)?;
    if v & !STOP != k {
        return fail(format!("PE {prev}'s flag of round {k} is {v:#x}"));
    }
    let r = route(k);
    if let Route::PutSignal = r {
        word_is(w, PING_DATA, payload(env, prev, k), "the flag's payload")?;
    }
    w.doing(format!("round {k}: answering PE {prev} by {r:?}"));
    send_flag(w, &PONG_WORDS, v, payload(env, env.me, k), prev, r)?;
    Ok(v)
}

fn pong_local(w: &Worker, k: u64) -> Outcome<u64> {
    let (sh, f) = (w.env.shmem, &w.env.world.flags);
    sh.wait_until(f, LOCAL_PING, Cmp::Ge, k)?;
    let v = f.view(LOCAL_PING..=LOCAL_PING).to_vec()?[0];
    if v & !STOP != k {
        return fail(format!("this PE's flag of round {k} is {v:#x}"));
    }
    f.view(LOCAL_PONG..=LOCAL_PONG).copy_from_host(&[v])?;
    Ok(v)
}

// ---- send and recv: the ring of channels ----------------------------------------------------

/// Message `m` of PE `from`: its number, whether it is the last, its length, then words.
fn message(env: &Env, from: usize, m: u64, last: bool) -> Vec<u32> {
    let base = hash(env.seed, &[TAG_CHAN, from as u64, m]);
    let len = 3 + (base % (CHAN_MAX as u64 - 2)) as usize;
    let mut words = vec![m as u32, u32::from(last), len as u32];
    words.extend((3..len as u64).map(|i| mix(base ^ i) as u32));
    words
}

/// Copy `data` into `view` on `stream` (stream-ordered: no host library lock).
fn upload<T: Element + DeviceRepr>(
    stream: &Arc<CudaStream>,
    mut view: SymmetricView<'_, T>,
    data: &[T],
) -> Outcome {
    stream.memcpy_htod(data, &mut view)?;
    Ok(())
}

/// `view` after the work on `stream`.
fn download<T: Element + DeviceRepr>(
    stream: &Arc<CudaStream>,
    view: SymmetricView<'_, T>,
) -> Outcome<Vec<T>> {
    let mut out = vec![T::default(); view.len()];
    stream.memcpy_dtoh(&view, &mut out)?;
    stream.synchronize()?;
    Ok(out)
}

fn sender(w: &Worker) {
    let env = w.env;
    let Some(stream) = w.new_stream() else {
        return;
    };
    let (ch, next) = (&env.world.ring[env.me], env.next());
    for m in 0u64.. {
        let last = w.time_up();
        let words = message(env, env.me, m, last);
        w.doing(format!("message {m} ({} words) to PE {next}", words.len()));
        let sent = upload(&stream, env.world.chan_src.view(..words.len()), &words).and_then(|()| {
            ch.send(&env.world.chan_src.view(..words.len()), &stream)?;
            // One message in flight from here: the send waits on the GPU for a free slot.
            stream.synchronize().map_err(Fail::from)
        });
        if !w.record(Kind::Send, sent) || last {
            break;
        }
    }
}

fn receiver(w: &Worker) {
    let env = w.env;
    let Some(stream) = w.new_stream() else {
        return;
    };
    let prev = env.prev();
    let ch = &env.world.ring[prev];
    for m in 0u64.. {
        w.doing(format!("message {m} from PE {prev}"));
        let got =
            upload(&stream, env.world.chan_dst.view(..), &[FILL_U32; CHAN_MAX]).and_then(|()| {
                ch.recv(&mut env.world.chan_dst.view(..), &stream)?;
                download(&stream, env.world.chan_dst.view(..))
            });
        let words = match got {
            Ok(words) => words,
            Err(f) => {
                w.record(Kind::Recv, Err(f));
                return;
            }
        };
        // Data errors are counted and the ring goes on; the header says when it ends.
        let last = words[1] == 1;
        let mut want = message(env, prev, m, last);
        want.resize(CHAN_MAX, FILL_U32);
        w.record(
            Kind::Recv,
            same(&format!("message {m} from PE {prev}"), &words, &want),
        );
        if last {
            break;
        }
    }
}

// ---- coll: the shared Collectives, in turns ---------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Op {
    AllReduce {
        op: ReduceOp,
        float: bool,
        in_place: bool,
    },
    AllGather,
    ReduceScatter(ReduceOp),
    Reduce {
        op: ReduceOp,
        root: usize,
    },
    Broadcast {
        root: usize,
        in_place: bool,
    },
    AllToAll,
    AllToAllV,
    /// An all-reduce (max) of whether each PE's time is up.
    Vote,
}

/// Call `k` of a run, the same on every PE: what, with `m` elements per PE block.
#[derive(Debug)]
struct Call {
    k: u64,
    op: Op,
    m: usize,
}

impl Call {
    fn at(env: &Env, k: u64) -> Call {
        if k % VOTE_EVERY == VOTE_EVERY - 1 {
            return Call {
                k,
                op: Op::Vote,
                m: 1,
            };
        }
        let mut rng = SplitMix64(hash(env.seed, &[TAG_CALL, k]));
        let bits = below(&mut rng, 13);
        let m = 1 + below(&mut rng, 1 << bits);
        let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min][below(&mut rng, 3)];
        let root = below(&mut rng, env.n);
        let in_place = below(&mut rng, 2) == 1;
        let op = match below(&mut rng, 9) {
            0 | 1 => Op::AllReduce {
                op,
                float: false,
                in_place,
            },
            2 => Op::AllReduce {
                op,
                float: true,
                in_place,
            },
            3 => Op::AllGather,
            4 => Op::ReduceScatter(op),
            5 => Op::Reduce { op, root },
            6 => Op::Broadcast { root, in_place },
            7 => Op::AllToAll,
            _ => Op::AllToAllV,
        };
        Call { k, op, m }
    }

    fn kind(&self) -> Kind {
        match self.op {
            Op::AllReduce { .. } => Kind::AllReduce,
            Op::AllGather => Kind::AllGather,
            Op::ReduceScatter(_) => Kind::ReduceScatter,
            Op::Reduce { .. } => Kind::Reduce,
            Op::Broadcast { .. } => Kind::Broadcast,
            Op::AllToAll => Kind::AllToAll,
            Op::AllToAllV => Kind::AllToAllV,
            Op::Vote => Kind::Vote,
        }
    }

    /// Elements of the source and the destination on this PE.
    fn lens(&self, n: usize) -> (usize, usize) {
        let m = self.m;
        match self.op {
            Op::AllGather => (m, n * m),
            Op::ReduceScatter(_) => (n * m, m),
            Op::AllToAll | Op::AllToAllV => (n * m, n * m),
            _ => (m, m),
        }
    }

    /// Whether the destination is the source.
    fn in_place(&self) -> bool {
        matches!(
            self.op,
            Op::AllReduce { in_place: true, .. } | Op::Broadcast { in_place: true, .. }
        )
    }
}

/// PE `pe`'s first `len` input elements of call `k`: integers in [-1000, 1000], so that every
/// sum is exact in f32 too.
fn inputs(env: &Env, k: u64, pe: usize, len: usize) -> Vec<i32> {
    let base = hash(env.seed, &[TAG_CALL, k, pe as u64]);
    (0..len as u64)
        .map(|i| (mix(base ^ i) % 2001) as i32 - 1000)
        .collect()
}

/// Elements PE `p` sends PE `q` in all-to-all-v call `k`: 0 to `m`.
fn count(env: &Env, call: &Call, p: usize, q: usize) -> usize {
    (hash(env.seed, &[TAG_COUNTS, call.k, p as u64, q as u64]) % (call.m as u64 + 1)) as usize
}

fn combine(op: ReduceOp, a: i32, b: i32) -> i32 {
    match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
        other => unreachable!("no call draws {other:?}"),
    }
}

/// `op` over PEs of element `i` of `all` (every PE's inputs), in PE order.
fn reduced(op: ReduceOp, all: &[Vec<i32>], i: usize) -> i32 {
    all.iter()
        .map(|x| x[i])
        .reduce(|a, b| combine(op, a, b))
        .expect("at least one PE")
}

/// What this PE's destination holds after `call` (as i32; the float all-reduce's values
/// are these, converted).
fn expected(env: &Env, call: &Call) -> Vec<i32> {
    let (n, me, m, k) = (env.n, env.me, call.m, call.k);
    let all = |len| (0..n).map(|p| inputs(env, k, p, len)).collect::<Vec<_>>();
    match call.op {
        Op::AllReduce { op, .. } => {
            let x = all(m);
            (0..m).map(|i| reduced(op, &x, i)).collect()
        }
        Op::AllGather => all(m).concat(),
        Op::ReduceScatter(op) => {
            let x = all(n * m);
            (0..m).map(|i| reduced(op, &x, me * m + i)).collect()
        }
        Op::Reduce { op, root } if root == me => {
            let x = all(m);
            (0..m).map(|i| reduced(op, &x, i)).collect()
        }
        Op::Reduce { .. } => vec![FILL_I32; m],
        Op::Broadcast { root, .. } => inputs(env, k, root, m),
        Op::AllToAll => all(n * m)
            .iter()
            .flat_map(|x| x[me * m..(me + 1) * m].to_vec())
            .collect(),
        Op::AllToAllV => {
            let mut out = Vec::with_capacity(n * m);
            for (p, x) in all(n * m).iter().enumerate() {
                let from: usize = (0..me).map(|q| count(env, call, p, q)).sum();
                out.extend_from_slice(&x[from..from + count(env, call, p, me)]);
            }
            out.resize(n * m, FILL_I32);
            out
        }
        Op::Vote => unreachable!("a vote is read, not checked"),
    }
}

fn collectives(w: &Worker, j: usize) {
    let env = w.env;
    let own = match j {
        0 => None,
        _ => match w.new_stream() {
            Some(s) => Some(s),
            None => return env.turns.stop(),
        },
    };
    let stream = own.as_ref().unwrap_or(env.shmem.stream());
    let bufs = &env.world.coll_bufs[j];
    let mut k = j as u64;
    loop {
        w.doing(format!("waiting for the turn of call {k}"));
        if !env.turns.wait_for(k) {
            break;
        }
        let call = Call::at(env, k);
        w.doing(format!("call {k}: {:?}, {} per PE", call.op, call.m));
        if !make_call(w, stream, bufs, &call) {
            break;
        }
        k += env.plan.colls as u64;
    }
}

/// Make `call` (this thread's turn), pass the turn on once it is launched, check it. Whether
/// the calls go on.
fn make_call(w: &Worker, stream: &Arc<CudaStream>, bufs: &CollBufs, call: &Call) -> bool {
    let env = w.env;
    let launched = write_inputs(w, stream, bufs, call)
        .and_then(|()| launch(env, stream, bufs, call).map_err(Fail::from));
    if let Op::Vote = call.op {
        // The turn waits for the outcome: every thread of every PE stops after this call.
        let vote = launched.and_then(|()| read_vote(env, stream, bufs));
        let stop = !matches!(vote, Ok(false));
        env.turns.pass(call.k, stop);
        w.record(Kind::Vote, vote.map(|_| ()));
        return !stop;
    }
    let go_on = launched.is_ok();
    env.turns.pass(call.k, !go_on);
    let checked = launched.and_then(|()| check_call(env, stream, bufs, call));
    w.record(call.kind(), checked);
    go_on
}

/// This PE's inputs into the source, and the fill into the destination, on `stream`.
fn write_inputs(w: &Worker, stream: &Arc<CudaStream>, bufs: &CollBufs, call: &Call) -> Outcome {
    let env = w.env;
    let (src_len, dst_len) = call.lens(env.n);
    match call.op {
        Op::Vote => upload(stream, bufs.src.view(..1), &[i32::from(w.time_up())]),
        Op::AllReduce { float: true, .. } => {
            let x: Vec<f32> = inputs(env, call.k, env.me, src_len)
                .into_iter()
                .map(|v| v as f32)
                .collect();
            upload(stream, bufs.src_f.view(..src_len), &x)?;
            if call.in_place() {
                return Ok(());
            }
            upload(stream, bufs.dst_f.view(..dst_len), &vec![FILL_F32; dst_len])
        }
        _ => {
            upload(
                stream,
                bufs.src.view(..src_len),
                &inputs(env, call.k, env.me, src_len),
            )?;
            if call.in_place() {
                return Ok(());
            }
            upload(stream, bufs.dst.view(..dst_len), &vec![FILL_I32; dst_len])
        }
    }
}

fn launch(
    env: &Env,
    stream: &Arc<CudaStream>,
    bufs: &CollBufs,
    call: &Call,
) -> nvshmem::Result<()> {
    let coll = &env.world.coll;
    let (src_len, dst_len) = call.lens(env.n);
    let src = bufs.src.view(..src_len);
    let dst = if call.in_place() {
        src
    } else {
        bufs.dst.view(..dst_len)
    };
    match call.op {
        Op::AllReduce {
            op, float: true, ..
        } => {
            let src = bufs.src_f.view(..src_len);
            let dst = if call.in_place() {
                src
            } else {
                bufs.dst_f.view(..dst_len)
            };
            coll.all_reduce(dst, src, op, AllReduceAlgo::Auto, stream)
        }
        Op::AllReduce { op, .. } => coll.all_reduce(dst, src, op, AllReduceAlgo::Auto, stream),
        Op::AllGather => coll.all_gather(dst, src, AllGatherAlgo::Auto, stream),
        Op::ReduceScatter(op) => coll.reduce_scatter(dst, src, op, ReduceScatterAlgo::Auto, stream),
        Op::Reduce { op, root } => coll.reduce(dst, src, op, root, ReduceAlgo::Auto, stream),
        Op::Broadcast { root, .. } => coll.broadcast(dst, src, root, BroadcastAlgo::Auto, stream),
        Op::AllToAll => coll.all_to_all(dst, src, AllToAllAlgo::Auto, stream),
        Op::AllToAllV => {
            let send: Vec<usize> = (0..env.n).map(|q| count(env, call, env.me, q)).collect();
            let recv: Vec<usize> = (0..env.n).map(|p| count(env, call, p, env.me)).collect();
            coll.all_to_all_v(dst, &recv, src, &send, stream)
        }
        Op::Vote => coll.all_reduce(dst, src, ReduceOp::Max, AllReduceAlgo::Auto, stream),
    }
}

/// Whether any PE's time is up (the vote's all-reduce).
fn read_vote(env: &Env, stream: &Arc<CudaStream>, bufs: &CollBufs) -> Outcome<bool> {
    let vote = download(stream, bufs.dst.view(..1))?[0];
    env.world.coll.check()?;
    match vote {
        0 => Ok(false),
        1 => Ok(true),
        other => fail(format!(
            "the vote's all-reduce (max of 0s and 1s) gave {other}"
        )),
    }
}

/// The destination after `call`, against what it must hold; a wait that gave up first.
fn check_call(env: &Env, stream: &Arc<CudaStream>, bufs: &CollBufs, call: &Call) -> Outcome {
    let (src_len, dst_len) = call.lens(env.n);
    let len = if call.in_place() { src_len } else { dst_len };
    let what = format!("call {} ({:?}, {} per PE)", call.k, call.op, call.m);
    let want = expected(env, call);
    if let Op::AllReduce { float: true, .. } = call.op {
        let view = if call.in_place() {
            bufs.src_f.view(..len)
        } else {
            bufs.dst_f.view(..len)
        };
        let got = download(stream, view)?;
        env.world.coll.check()?;
        // Bit for bit: integers sum exactly in f32.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        return same(&what, &bits(&got), &bits(&want));
    }
    let view = if call.in_place() {
        bufs.src.view(..len)
    } else {
        bufs.dst.view(..len)
    };
    let got = download(stream, view)?;
    env.world.coll.check()?;
    same(&what, &got, &want)
}

// ---- a run, and the program -------------------------------------------------------------------

struct Config {
    seconds: f64,
    threads: usize,
    seed: u64,
}

/// What `--skip`, `--cooperative` and `--programmatic` ask for, to narrow a failure down:
/// roles (by name without the number: alloc, coll, send, recv, ping, pong, mix) whose
/// threads do nothing, and how the shared `Collectives` launches.
struct Narrowing {
    skip: Vec<String>,
    cooperative: bool,
    programmatic: bool,
}

static NARROWING: std::sync::OnceLock<Narrowing> = std::sync::OnceLock::new();

fn skipped(role: Role) -> bool {
    let name = role.name();
    let base = name.split('-').next().unwrap_or(&name);
    NARROWING
        .get()
        .is_some_and(|n| n.skip.iter().any(|s| s == base))
}

fn parse_args(args: &[String]) -> Result<Config, String> {
    let mut config = Config {
        seconds: 20.0,
        threads: MIN_THREADS,
        seed: 0x5EED,
    };
    let mut narrowing = Narrowing {
        skip: Vec::new(),
        cooperative: false,
        programmatic: true,
    };
    let mut it = args.iter().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} takes a value"))?;
        let bad = || format!("{flag} {value}: not a valid value");
        match flag.as_str() {
            "--seconds" => {
                config.seconds = value.parse().map_err(|_| bad())?;
                if !(config.seconds > 0.0 && config.seconds.is_finite()) {
                    return Err(bad());
                }
            }
            "--threads" => {
                config.threads = value.parse().map_err(|_| bad())?;
                if config.threads < MIN_THREADS {
                    return Err(format!(
                        "--threads {value}: at least {MIN_THREADS}, one per role"
                    ));
                }
            }
            "--seed" => config.seed = value.parse().map_err(|_| bad())?,
            "--skip" => narrowing.skip = value.split(',').map(str::to_string).collect(),
            "--cooperative" => narrowing.cooperative = value.parse().map_err(|_| bad())?,
            "--programmatic" => narrowing.programmatic = value.parse().map_err(|_| bad())?,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    let _ = NARROWING.set(narrowing);
    Ok(config)
}

/// Free device memory on this PE's GPU.
fn free_memory(shmem: &Nvshmem) -> Outcome<usize> {
    shmem.context().bind_to_thread()?;
    Ok(nvshmem::cudarc::driver::result::mem_get_info()?.0)
}

/// What the main thread needs to count and report.
struct Main<'a> {
    shmem: &'a Nvshmem,
    board: &'a Board,
    tally: &'a Tally,
    plan: &'a Plan,
    row: usize,
}

impl Main<'_> {
    fn doing(&self, what: String) {
        self.board.set(self.row, what);
    }

    fn record(&self, kind: Kind, outcome: Outcome) -> bool {
        self.tally.record(self.shmem.my_pe(), "main", kind, outcome)
    }

    /// One run of every role for `seconds`: build, run the threads, check and tear down.
    fn run(&self, seed: u64, seconds: f64) {
        let shmem = self.shmem;
        self.doing(format!("building the objects of a {seconds:.0} s run"));
        let world = match World::build(shmem, self.plan) {
            Ok(world) => world,
            Err(e) => {
                self.record(Kind::Setup, Err(e.into()));
                return;
            }
        };
        // Every PE's flags and slots are zeroed before any thread writes into a peer's.
        if self.record(Kind::Setup, shmem.barrier_all().map_err(Fail::from)) {
            let run = Duration::from_secs_f64(seconds);
            let env = Env {
                shmem,
                world: &world,
                plan: self.plan,
                board: self.board,
                tally: self.tally,
                turns: Turns::new(),
                seed,
                deadline: Instant::now() + run,
                me: shmem.my_pe(),
                n: shmem.n_pes(),
            };
            // The threads are watched one by one; this bounds a run that never ends.
            self.board
                .set_for(self.row, "waiting for the threads".into(), run + OP_LIMIT);
            std::thread::scope(|s| {
                for (row, &role) in self.plan.roles.iter().enumerate() {
                    let env = &env;
                    s.spawn(move || run_role(env, row, role));
                }
            });
            self.doing("checking that no page is left allocated".into());
            let empty = shmem.barrier_all().map_err(Fail::from).and_then(|()| {
                match world.pool.in_use(shmem.my_pe())? {
                    0 => Ok(()),
                    left => fail(format!("{left} pages of this PE still allocated")),
                }
            });
            self.record(Kind::Pool, empty);
        }
        self.doing("tearing the objects down".into());
        self.record(Kind::Setup, world.tear_down().map_err(Fail::from));
    }

    /// Free device memory and symmetric heap in use, once every PE is done.
    fn memory(&self) -> (Outcome<usize>, usize) {
        self.doing("measuring memory".into());
        if let Err(e) = self.shmem.barrier_all() {
            self.record(Kind::Setup, Err(e.into()));
        }
        (free_memory(self.shmem), self.shmem.heap_in_use())
    }

    /// Every PE's counts summed on PE 0 (`None` on the others).
    fn sum_over_pes(&self, totals: &SymmetricBuffer<u64>) -> nvshmem::Result<Option<Vec<u64>>> {
        self.doing("summing the counts over PEs".into());
        for (i, v) in self.tally.words().into_iter().enumerate() {
            if v > 0 {
                self.shmem.atomic_add(totals, i, v, 0)?;
            }
        }
        self.shmem.barrier_all()?;
        match self.shmem.my_pe() {
            0 => Ok(Some(totals.to_vec()?)),
            _ => Ok(None),
        }
    }
}

/// PE 0's report: the operations of each kind over all PEs, and the final line.
fn report(totals: &[u64]) -> u64 {
    println!("stress_check: operations over every PE (warm-up included)");
    let mut sums = (0, 0);
    for (kind, counts) in Kind::ALL.iter().zip(totals.chunks(2)) {
        let (passed, failed) = (counts[0], counts[1]);
        if passed + failed > 0 {
            println!(
                "  {:<26} {:>9} ok {:>6} failed",
                kind.name(),
                passed,
                failed
            );
        }
        sums = (sums.0 + passed, sums.1 + failed);
    }
    println!("{} passed, {} failed", sums.0, sums.1);
    sums.1
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let config = parse_args(&args).unwrap_or_else(|e| {
        eprintln!("stress_check: {e}\n{USAGE}");
        std::process::exit(2)
    });
    let shmem = Nvshmem::init().unwrap_or_else(|e| {
        eprintln!("stress_check: {e}");
        std::process::exit(2)
    });
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let plan = Plan::new(config.threads);
    let warm_up = (config.seconds / 5.0).clamp(1.0, 5.0);
    if me == 0 {
        println!(
            "stress_check: {n} PEs, {} threads each, {} s after {warm_up} s of warm-up, seed {}; {}",
            plan.roles.len(),
            config.seconds,
            config.seed,
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    let board = Arc::new(Board::new(plan.roles.len() + 1));
    let tally = Arc::new(Tally::new());
    start_watchdog(board.clone(), tally.clone(), me);
    let main = Main {
        shmem: &shmem,
        board: &board,
        tally: &tally,
        plan: &plan,
        row: plan.roles.len(),
    };
    board.claim(main.row, "main");
    let totals = shmem.calloc::<u64>(2 * KINDS).unwrap_or_else(|e| {
        eprintln!("stress_check: PE {me}: {e}");
        std::process::exit(2)
    });
    // The first run loads every kernel and grows the driver's pools: memory is compared
    // from its end to the end of the second.
    main.run(hash(config.seed, &[0]), warm_up);
    let start = main.memory();
    main.run(hash(config.seed, &[1]), config.seconds);
    let end = main.memory();
    let kept = matches!((&start.0, &end.0), (Ok(a), Ok(b)) if a == b) && start.1 == end.1;
    println!(
        "PE {me}: free device memory {:?} -> {:?} bytes, symmetric heap in use {} -> {} bytes{}",
        start.0.as_ref().ok(),
        end.0.as_ref().ok(),
        start.1,
        end.1,
        if kept { "" } else { " (CHANGED)" }
    );
    let memory = if kept {
        Ok(())
    } else {
        fail("the memory in use changed over the run".into())
    };
    main.record(Kind::Memory, memory);
    let status = match main.sum_over_pes(&totals) {
        Ok(Some(totals)) => u64::from(report(&totals) > 0),
        Ok(None) => u64::from(tally.sums().1 > 0),
        Err(e) => {
            eprintln!("stress_check: PE {me}: summing the counts: {e}");
            2
        }
    };
    board.idle(main.row);
    drop(totals);
    drop(shmem);
    std::process::exit(status as i32);
}
