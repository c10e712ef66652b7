//! Ordering, completion and synchronisation: quiet, fence, barriers, syncs and point-to-point
//! waits, from the host and enqueued on CUDA streams.
//!
//! * [`quiet`](Nvshmem::quiet) completes every put, get and atomic this PE issued from the host
//!   (including [`put_signal_nbi`](Nvshmem::put_signal_nbi)).
//! * [`fence`](Nvshmem::fence) orders this PE's puts to each PE without waiting for them.
//! * [`barrier_all`](Nvshmem::barrier_all) / [`barrier`](Nvshmem::barrier) are quiet plus a
//!   synchronisation of all PEs (of a team); [`sync_all`](Nvshmem::sync_all) /
//!   [`sync`](Nvshmem::sync) synchronise without the quiet.
//! * [`wait_until`](Nvshmem::wait_until) blocks until a local integer satisfies a [`Cmp`],
//!   within the runtime's wait limit.
//!
//! The `_on_stream` forms enqueue the same operation on a CUDA stream, ordered with the
//! kernels and copies around it, and return at once.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::Cmp;
//! let shmem = nvshmem::Nvshmem::init()?;
//! let (me, n) = (shmem.my_pe(), shmem.n_pes());
//! let flag = shmem.calloc::<i32>(1)?;
//! // A token passed round the ring: PE 0 starts it, every other PE waits for it first.
//! if me != 0 {
//!     shmem.wait_until(&flag, 0, Cmp::Eq, 1)?;
//! }
//! shmem.p(&flag, 0, 1, (me + 1) % n)?;
//! shmem.quiet()?;
//! if me == 0 {
//!     shmem.wait_until(&flag, 0, Cmp::Eq, 1)?;
//! }
//! shmem.barrier_all()?;
//! # Ok(()) }
//! ```

use crate::element::AtomicInteger;
use crate::error::{check, CudaResultExt, Error, Result};
use crate::memory::{SetUp, SymmetricView};
use crate::runtime::Nvshmem;
use crate::signal::{complete_own_stream, Cmp};
use crate::team::Team;
use cudarc::driver::CudaStream;
use nvshmem_sys as sys;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Nvshmem {
    /// The team's handle, after checking that it belongs to this runtime.
    fn team_handle(&self, team: &Team) -> Result<sys::nvshmem_team_t> {
        self.check_same_runtime(team.runtime(), "the team")?;
        Ok(team.handle())
    }

    /// Complete every operation this PE issued from the host: puts have arrived, gets have
    /// landed, atomics are done.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let (src, dst) = (shmem.malloc::<u8>(4096)?, shmem.malloc::<u8>(4096)?);
    /// shmem.put_nbi(&dst, &src, 0)?;
    /// shmem.quiet()?; // now `src` may change and the data is on PE 0
    /// # Ok(()) }
    /// ```
    pub fn quiet(&self) -> Result<()> {
        let _host = self.host_call()?;
        complete_own_stream(self)?;
        unsafe { sys::nvshmem_quiet() };
        Ok(())
    }

    /// Order this PE's puts (and non-fetching atomics) to each PE: those issued before reach
    /// their PE before those issued after. Does not wait.
    pub fn fence(&self) -> Result<()> {
        let _host = self.host_call()?;
        unsafe { sys::nvshmem_fence() };
        Ok(())
    }

    /// Wait until every PE has called it, after completing this PE's operations (a quiet).
    /// Collective over all PEs.
    ///
    /// Bounded by the runtime's wait limit (`NVSHMEM_RS_TIMEOUT`): the PEs meet through the
    /// runtime's own exchange (puts and host reads), not NVSHMEM's barrier, which waits
    /// without a bound and holds the host library meanwhile. A PE doing another collective
    /// call (an allocation, a free) is [`Error::CollectiveMismatch`] naming both; a PE that
    /// never comes is the same after the limit, and the runtime is stranded.
    pub fn barrier_all(&self) -> Result<()> {
        self.quiet()?;
        self.set_up_barrier(SetUp::BarrierAll)
    }

    /// [`barrier_all`](Self::barrier_all) over the PEs of `team` (collective over the team).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// shmem.barrier(&shmem.team_node())?;
    /// # Ok(()) }
    /// ```
    pub fn barrier(&self, team: &Team) -> Result<()> {
        self.team_handle(team)?;
        self.quiet()?;
        team.sync_members("barrier")
    }

    /// Wait until every PE has called it, without completing outstanding operations.
    /// Collective over all PEs; bounded, as [`barrier_all`](Self::barrier_all) is.
    pub fn sync_all(&self) -> Result<()> {
        self.set_up_barrier(SetUp::SyncAll)
    }

    /// [`sync_all`](Self::sync_all) over the PEs of `team` (collective over the team).
    ///
    /// Bounded by the runtime's wait limit, as `sync_all` is: the members meet through the
    /// runtime's own puts and host reads, not NVSHMEM's team sync, and the host library is
    /// let go while they wait. A member that does not come within the limit is
    /// [`Error::CollectiveMismatch`] naming it, and the runtime is stranded.
    pub fn sync(&self, team: &Team) -> Result<()> {
        self.team_handle(team)?;
        team.sync_members("sync")
    }

    /// Block until this PE's `ivar[index]` satisfies `cmp` against `value` (another PE
    /// changes it with a put, `p` or atomic, or another thread of this process with a copy).
    ///
    /// The wait is bounded by the runtime's wait limit (`NVSHMEM_RS_TIMEOUT`, 10 minutes by
    /// default): past it, [`Error::WaitTimeout`]. The host polls
    /// the word with small copies on a stream of its own, backing off to a poll a
    /// millisecond, and holds no lock meanwhile: other threads' calls (the one that ends the
    /// wait included) go on, and a wait that gives up leaves nothing behind on the GPU.
    pub fn wait_until<'a, T: AtomicInteger>(
        &self,
        ivar: impl Into<SymmetricView<'a, T>>,
        index: usize,
        cmp: Cmp,
        value: T,
    ) -> Result<()> {
        let ptr = ivar.into().element_ptr(self, "the wait variable", index)?;
        self.poll_word(ptr, "the wait variable", index, |v| cmp.holds(v, value))
            .map(|_| ())
    }

    /// Read this PE's word at `ptr` from the host until `done` holds for it, within the
    /// runtime's wait limit; returns the value that ended the wait.
    pub(crate) fn poll_word<T: Copy + Default>(
        &self,
        ptr: *const T,
        what: &'static str,
        index: usize,
        done: impl Fn(T) -> bool,
    ) -> Result<T> {
        let stream = self.wait_stream()?;
        let began = Instant::now();
        let mut pause = Duration::from_micros(2);
        let size = std::mem::size_of::<T>();
        assert!(size <= 8, "a wait on a word of at most 8 bytes");
        self.bind_context()?;
        let mut word = self.rt.pinned.take(1)?;
        loop {
            // SAFETY: `ptr` is an element of a live symmetric view of this PE (checked by the
            // caller); the copy ends before `word` is read.
            unsafe { word.read_from(ptr as u64, size, stream.cu_stream()) }?;
            stream.synchronize().during("cuStreamSynchronize")?;
            // SAFETY: the copy above wrote `size` bytes of a `T` at the start of the buffer.
            let value = unsafe { (word.as_mut_slice().as_ptr() as *const T).read_unaligned() };
            if done(value) {
                return Ok(value);
            }
            let waited = began.elapsed();
            if self.wait_limit().is_some_and(|limit| waited > limit) {
                return Err(Error::WaitTimeout {
                    pe: self.my_pe(),
                    what,
                    index,
                    waited,
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Make `stream` wait until this PE's `ivar[index]` satisfies `cmp` against `value`.
    /// The stream waits without a bound (NVSHMEM's stream operation): what follows on it
    /// runs only once some PE makes the comparison true.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::Cmp;
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let stream = shmem.new_stream()?;
    /// let ready = shmem.calloc::<u32>(1)?;
    /// // Kernels queued after this run once some PE has set `ready` to 1 here.
    /// shmem.wait_until_on_stream(&ready, 0, Cmp::Ge, 1, &stream)?;
    /// # Ok(()) }
    /// ```
    pub fn wait_until_on_stream<'a, T: AtomicInteger>(
        &self,
        ivar: impl Into<SymmetricView<'a, T>>,
        index: usize,
        cmp: Cmp,
        value: T,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let ptr = ivar.into().element_ptr(self, "the wait variable", index)?;
        let s = self.raw_stream(stream)?;
        let _host = self.host_call()?;
        unsafe { T::wait_until_on_stream(ptr, cmp.raw(), value, s) };
        Ok(())
    }

    /// [`quiet`](Self::quiet) enqueued on `stream`: completes the operations enqueued on the
    /// stream before it (the `_nbi_on_stream` ones included).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let stream = shmem.new_stream()?;
    /// let (src, dst) = (shmem.malloc::<f32>(1024)?, shmem.malloc::<f32>(1024)?);
    /// shmem.put_nbi_on_stream(&dst, &src, 0, &stream)?;
    /// shmem.quiet_on_stream(&stream)?;
    /// shmem.sync_all_on_stream(&stream)?;
    /// stream.synchronize().unwrap();
    /// # Ok(()) }
    /// ```
    pub fn quiet_on_stream(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.enqueue(stream, |s| unsafe { sys::nvshmemx_quiet_on_stream(s) })
    }

    /// [`barrier_all`](Self::barrier_all) enqueued on `stream`.
    pub fn barrier_all_on_stream(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.enqueue(stream, |s| unsafe {
            sys::nvshmemx_barrier_all_on_stream(s)
        })
    }

    /// [`barrier`](Self::barrier) enqueued on `stream`.
    pub fn barrier_on_stream(&self, team: &Team, stream: &Arc<CudaStream>) -> Result<()> {
        self.enqueue_team(team, stream, "nvshmemx_barrier_on_stream", |t, s| unsafe {
            sys::nvshmemx_barrier_on_stream(t, s)
        })
    }

    /// [`sync_all`](Self::sync_all) enqueued on `stream`.
    pub fn sync_all_on_stream(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.enqueue(stream, |s| unsafe { sys::nvshmemx_sync_all_on_stream(s) })
    }

    /// [`sync`](Self::sync) enqueued on `stream`.
    pub fn sync_on_stream(&self, team: &Team, stream: &Arc<CudaStream>) -> Result<()> {
        self.enqueue_team(
            team,
            stream,
            "nvshmemx_team_sync_on_stream",
            |t, s| unsafe { sys::nvshmemx_team_sync_on_stream(t, s) },
        )
    }

    /// Check `stream`, make the context current and enqueue `call` on it.
    fn enqueue(
        &self,
        stream: &Arc<CudaStream>,
        call: impl FnOnce(sys::cudaStream_t),
    ) -> Result<()> {
        let s = self.raw_stream(stream)?;
        let _host = self.host_call()?;
        call(s);
        Ok(())
    }

    /// [`enqueue`](Self::enqueue) for an operation over `team` that returns a status.
    fn enqueue_team(
        &self,
        team: &Team,
        stream: &Arc<CudaStream>,
        name: &'static str,
        call: impl FnOnce(sys::nvshmem_team_t, sys::cudaStream_t) -> i32,
    ) -> Result<()> {
        let t = self.team_handle(team)?;
        let mut status = 0;
        self.enqueue(stream, |s| status = call(t, s))?;
        check(name, status)
    }
}
