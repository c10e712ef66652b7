//! The shared objects of a run: the `Collectives`, the page pool, the ring of channels and
//! the symmetric buffers, built and freed in one order on every PE.

use crate::args::{skipped, NARROWING};
use crate::common::{
    CHAN_DEPTH, CHAN_MAX, CHURN_MAX, COLL_MAX, COLL_TIMEOUT, MAX_BATCH, PAGE_BYTES, SLOT,
};
use crate::roles::Plan;
use crate::roles::Role;
use crate::tp::TpWorld;
use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::pool::{PagePool, PagePoolConfig};
use nvshmem::{Collectives, CollectivesConfig, Nvshmem, SymmetricBuffer};

/// A collective thread's inputs and outputs (its own, so that calls in flight on two
/// threads never share a buffer).
pub(crate) struct CollBufs {
    pub(crate) src: SymmetricBuffer<i32>,
    pub(crate) dst: SymmetricBuffer<i32>,
    pub(crate) src_f: SymmetricBuffer<f32>,
    pub(crate) dst_f: SymmetricBuffer<f32>,
}

/// A page-pool user's staging: pages to scatter, and pages gathered.
pub(crate) struct PageBufs {
    pub(crate) src: SymmetricBuffer<u8>,
    pub(crate) dst: SymmetricBuffer<u8>,
}

/// Where the flag threads' words sit in `World::flags`, on every PE.
pub(crate) const PING: usize = 0; // set by the previous PE's ping
pub(crate) const PONG: usize = 1; // set by the next PE's pong, the answer
pub(crate) const LOCAL_PING: usize = 2; // set by this PE's ping
pub(crate) const LOCAL_PONG: usize = 3; // set by this PE's pong
pub(crate) const PING_DATA: usize = 4; // the previous PE's ping payload (put with signal)
pub(crate) const PONG_DATA: usize = 5; // the next PE's pong payload
pub(crate) const PING_SRC: usize = 6; // this PE's ping's source word for its puts
pub(crate) const PONG_SRC: usize = 7; // this PE's pong's
const FLAG_WORDS: usize = 8;

/// Everything the threads of one run share. Built before they start and freed after they
/// end, by one thread, in this order on every PE (it is all collective).
pub(crate) struct World {
    pub(crate) coll: Collectives,
    /// The tp thread's layers (none when it is skipped).
    pub(crate) tp: Option<TpWorld>,
    pub(crate) pool: PagePool,
    /// Channel `i` goes from PE `i` to PE `i + 1`.
    pub(crate) ring: Vec<Channel<u32>>,
    pub(crate) coll_bufs: Vec<CollBufs>,
    /// One per pool user: the mixers, then the allocator.
    pub(crate) page_bufs: Vec<PageBufs>,
    pub(crate) chan_src: SymmetricBuffer<u32>,
    pub(crate) chan_dst: SymmetricBuffer<u32>,
    /// Mixer `t` of PE `w` owns words `slot(w, t)..+SLOT` on every PE.
    pub(crate) slots: SymmetricBuffer<u64>,
    /// Mixer `t` of PE `w` owns counter `w * mixers + t` on every PE.
    pub(crate) counters: SymmetricBuffer<u64>,
    /// Each mixer's source and destination words of its puts and gets, on this PE.
    pub(crate) rma: SymmetricBuffer<u64>,
    pub(crate) flags: SymmetricBuffer<u64>,
    /// Set by PE 0's allocator when its time is up.
    pub(crate) stop: SymmetricBuffer<u64>,
    /// The allocator's short-lived channels' message, sent and received.
    pub(crate) churn_src: SymmetricBuffer<u32>,
    pub(crate) churn_dst: SymmetricBuffer<u32>,
}

impl World {
    pub(crate) fn build(shmem: &Nvshmem, plan: &Plan, seed: u64) -> nvshmem::Result<World> {
        let n = shmem.n_pes();
        let mut config = CollectivesConfig::for_pes(n);
        // A checked call is an agreement under the host library's lock (see the module
        // documentation), and the timeout is the run's, not the environment's.
        config.check_calls = false;
        config.timeout = Some(COLL_TIMEOUT);
        config.cooperative_launch = NARROWING.get().is_some_and(|n| n.cooperative);
        if let Some(n) = NARROWING.get() {
            config.programmatic_launch &= n.programmatic;
            config.max_blocks = n.max_blocks;
        }
        let tp = match skipped(Role::Tp) {
            true => None,
            false => Some(TpWorld::build(shmem, seed, config.clone())?),
        };
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
            tp,
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
    pub(crate) fn tear_down(self) -> nvshmem::Result<()> {
        let World {
            coll,
            tp,
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
        let mut freed = tp.map_or(Ok(()), TpWorld::tear_down);
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
