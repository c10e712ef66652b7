//! A pool of fixed-size pages in symmetric memory (KV-cache blocks): page ids handed out on
//! any PE, a page table every PE can read, and batched copies of pages between any PE and
//! local memory, from the host (on a stream) and from kernels (`nvshmem_rs/pool.cuh`).
//!
//! Every PE holds `pages_per_pe` pages of `page_bytes` bytes, a bitmap of which are taken,
//! every page's state (its generation, and whether it is allocated), and a page table of
//! `table_len` entries. A page is named by a [`PageId`]: the PE that holds it, its index
//! there, and its generation, which counts the page's frees (one 64-bit word for kernels:
//! see [`PageId`]). Any PE allocates a page of any PE: the allocation claims the page's bit
//! with an NVSHMEM `fetch_or` on the owner's bitmap, then marks its state allocated with
//! another, which returns the generation for the id (from a kernel: `alloc` runs them on
//! the device, as kernels of users do with `nvshmem_rs::pool_alloc`). Freeing swaps the
//! state from allocated in the id's generation to free in the next (`compare_swap`), then
//! clears the bit.
//!
//! # Memory ordering
//! - **Allocation and free are atomic**: a page is handed out once until it is freed, however
//!   many PEs and threads allocate into one PE at once; of the frees of one id, however many
//!   run at once, exactly one succeeds. Freeing a page that is not allocated is
//!   [`Error::PageNotAllocated`], and changes nothing; so is freeing a stale id (its page was
//!   freed since, and maybe allocated again: the new allocation has the next generation and
//!   is left alone, whenever the stale free runs).
//! - **Contents before ids**: a writer makes a page's contents complete before it publishes
//!   the page's id (in the page table, a signal, a message). From the host: synchronise the
//!   stream that wrote the page ([`scatter`](PagePool::scatter) is complete at the owner when
//!   its kernel ends), then [`table_set`](PagePool::table_set). In a kernel:
//!   `pool_scatter_block` or `nvshmem_quiet`, then `pool_table_publish` (which quiets first).
//! - **Ids before contents**: a reader reads the id first ([`table_get`](PagePool::table_get),
//!   `pool_table_read`, a signal it waited for), then the page.
//! - **Free after the last use**: a page may be freed, and so reallocated and rewritten, only
//!   once every reader and writer is done with it. The pool cannot see readers: that is the
//!   program's protocol (a barrier, a signal, a reference count in symmetric memory). Host
//!   calls ([`free`](PagePool::free)) act when they are made, not in stream order: synchronise
//!   the streams that use the page first.
//! - The host checks of [`gather`](PagePool::gather) and [`scatter`](PagePool::scatter) (every
//!   page allocated, in the id's generation) read the pages' states when the call is made;
//!   the copy runs later, in stream order. Pages allocated or freed by kernels still running
//!   are the program's to order.
//!
//! # Stale ids
//! What reads an id's generation: [`free`](PagePool::free),
//! [`is_allocated`](PagePool::is_allocated), the checks of [`gather`](PagePool::gather) and
//! [`scatter`](PagePool::scatter), and the device functions `pool_free` and
//! `pool_is_allocated`. The copies themselves, their device-id forms
//! ([`gather_device`](PagePool::gather_device)) and the device copies copy the page an id's PE
//! and index name, whatever its generation: a check there would cost a remote read per page
//! and still race with a free. The page table stores ids whole, generation included, so a
//! reader can check one it read. A generation repeats after [`PageId::GENERATIONS`] (2^20)
//! frees of one page.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::pool::{PagePool, PagePoolConfig};
//! let shmem = nvshmem::Nvshmem::init()?;
//! // 1024 pages of 16 KiB on every PE, and a page table of 64 entries (collective).
//! let pool = PagePool::new(&shmem, PagePoolConfig::new(1024, 16 << 10).table_len(64))?;
//! let me = shmem.my_pe();
//! let page = pool.alloc(me)?;
//! pool.page_view(page.index as usize)?.copy_from_host(&vec![7u8; 16 << 10])?;
//! pool.table_set(me, 0, Some(page))?; // publish: the page is written
//! shmem.barrier_all()?;
//! // Gather the page PE 0 published into local memory.
//! let theirs = pool.table_get(0, 0)?.expect("PE 0 published a page");
//! let dst = shmem.alloc_device::<u8>(16 << 10)?;
//! pool.gather(&dst, &[theirs], shmem.stream())?;
//! shmem.stream().synchronize().unwrap();
//! assert_eq!(dst.to_vec()?[0], 7);
//! shmem.barrier_all()?; // every reader is done before anyone frees
//! pool.free(page)?;
//! # Ok(()) }
//! ```

mod layout;

pub use crate::abi::nvshmem_rs_pool as PoolHandle;
pub use layout::{PageId, NO_PAGE};

use crate::cubins::POOL;
use crate::element::Element;
use crate::error::{CudaResultExt, Error, Result};
use crate::memory::{round_trip, DeviceMemory, SetUp, SymmetricBuffer, SymmetricView};
use crate::module::{grid, Function, KernelArgs, Module};
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, CudaStream};
use layout::{
    bitmap_words, blocks_for, check_id, check_pages_len, check_sizes, copy_grid, initial_bitmap,
    pages_in_use, THREADS,
};
use std::sync::Arc;

/// Words after the bitmap that hold this PE's sizes, for the PEs to compare at construction.
const SIZE_WORDS: usize = 3;

/// Pages in symmetric memory with an allocator usable from any PE and any kernel, a page
/// table, and batched gathers and scatters. See the [module documentation](self) for the
/// memory-ordering rules.
///
/// Building and dropping a pool are collective (its memory is symmetric); everything else is
/// not. Host calls are `&self` and may be made from any thread.
pub struct PagePool {
    kernels: Kernels,
    /// The stream of the host calls that wait (allocation, free, checks).
    stream: Arc<CudaStream>,
    pages: SymmetricBuffer<u8>,
    /// The bitmap's words, then this PE's sizes (`SIZE_WORDS`).
    bitmap: SymmetricBuffer<u64>,
    /// Every page's state, `(generation << 1) | allocated`.
    states: SymmetricBuffer<u64>,
    table: SymmetricBuffer<u64>,
    pages_per_pe: usize,
    page_bytes: usize,
    table_len: usize,
    shmem: Nvshmem,
}

struct Kernels {
    alloc: Function,
    free: Function,
    check: Function,
    read: Function,
    gather: Function,
    scatter: Function,
}

impl std::fmt::Debug for PagePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PagePool({} pages of {} bytes per PE, {} table entries)",
            self.pages_per_pe, self.page_bytes, self.table_len
        )
    }
}

/// Which way a copy goes.
#[derive(Clone, Copy)]
enum Direction {
    /// Pages into local memory.
    Gather,
    /// Local memory into pages.
    Scatter,
}

impl Direction {
    /// The local side of the copy, for errors.
    fn local_side(self) -> &'static str {
        match self {
            Direction::Gather => "gather destination",
            Direction::Scatter => "scatter source",
        }
    }
}

/// The sizes of a [`PagePool`].
///
/// ```
/// let config = nvshmem::pool::PagePoolConfig::new(1024, 16 << 10).table_len(64);
/// assert_eq!((config.pages_per_pe, config.page_bytes, config.table_len), (1024, 16 << 10, 64));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PagePoolConfig {
    /// Pages on every PE.
    pub pages_per_pe: usize,
    /// Bytes of a page: a positive multiple of 16.
    pub page_bytes: usize,
    /// Entries of every PE's page table; 0 (no table) unless set.
    pub table_len: usize,
}

impl PagePoolConfig {
    /// `pages_per_pe` pages of `page_bytes` bytes on every PE, and no page table.
    pub fn new(pages_per_pe: usize, page_bytes: usize) -> Self {
        PagePoolConfig {
            pages_per_pe,
            page_bytes,
            table_len: 0,
        }
    }

    /// Give every PE a page table of `entries` entries.
    pub fn table_len(mut self, entries: usize) -> Self {
        self.table_len = entries;
        self
    }
}

impl PagePool {
    /// A pool of `pages_per_pe` pages of `page_bytes` bytes (a positive multiple of 16) on
    /// every PE, and a page table of `table_len` entries on every PE, all empty (collective:
    /// every PE passes the same sizes, or every PE gets [`Error::CollectiveMismatch`]).
    pub fn new(shmem: &Nvshmem, config: PagePoolConfig) -> Result<Self> {
        let PagePoolConfig {
            pages_per_pe,
            page_bytes,
            table_len,
        } = config;
        let region = check_sizes(pages_per_pe, page_bytes, table_len, shmem.n_pes())?;
        let module = Module::load(shmem, &POOL)?;
        let kernels = Kernels {
            alloc: module.function("pool_alloc_pages")?,
            free: module.function("pool_free_pages")?,
            check: module.function("pool_check_pages")?,
            read: module.function("pool_read_words")?,
            gather: module.function("pool_gather")?,
            scatter: module.function("pool_scatter")?,
        };
        let stream = shmem.new_stream()?;
        let words = bitmap_words(pages_per_pe);
        let pages = shmem.malloc_aligned::<u8>(256, region)?;
        let bitmap = shmem.malloc::<u64>(words + SIZE_WORDS)?;
        // Every page free, in generation 0.
        let states = shmem.calloc::<u64>(pages_per_pe)?;
        let table = shmem.malloc::<u64>(table_len)?;
        let sizes = [pages_per_pe as u64, page_bytes as u64, table_len as u64];
        let mut init = initial_bitmap(pages_per_pe);
        init.extend_from_slice(&sizes);
        bitmap.copy_from_host(&init)?;
        table.copy_from_host(&vec![NO_PAGE; table_len])?;
        // No PE allocates on a PE that has not cleared its bitmap yet (the copies above are
        // complete).
        shmem.set_up_barrier(SetUp::PagePool)?;
        let pool = PagePool {
            kernels,
            stream,
            pages,
            bitmap,
            states,
            table,
            pages_per_pe,
            page_bytes,
            table_len,
            shmem: shmem.clone(),
        };
        // Equal region sizes do not make equal pools (2 pages of 32 KiB, 4 of 16 KiB): every
        // PE compares every PE's sizes, so all fail alike.
        for pe in 0..shmem.n_pes() {
            let theirs = pool.read_words(pool.bitmap.addr() + 8 * words as u64, pe, 3)?;
            if theirs != sizes {
                return Err(Error::CollectiveMismatch(format!(
                    "PagePool::new on PE {} has (pages_per_pe, page_bytes, table_len) = {:?} and \
                     on PE {pe} {:?}; build the pool with the same sizes on every PE",
                    shmem.my_pe(),
                    sizes,
                    theirs
                )));
            }
        }
        Ok(pool)
    }

    /// Pages each PE holds.
    pub fn pages_per_pe(&self) -> usize {
        self.pages_per_pe
    }

    /// Bytes of a page.
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Entries of each PE's page table.
    pub fn table_len(&self) -> usize {
        self.table_len
    }

    /// The runtime.
    pub fn runtime(&self) -> &Nvshmem {
        &self.shmem
    }

    /// The whole page region (`pages_per_pe × page_bytes` bytes, page `i` at byte
    /// `i × page_bytes` on every PE), for RMA calls and kernels of one's own.
    pub fn pages(&self) -> &SymmetricBuffer<u8> {
        &self.pages
    }

    /// Page `index` (on every PE, as any symmetric view): write this PE's copy with
    /// [`copy_from_host`](SymmetricView::copy_from_host), or another PE's with a put.
    pub fn page_view(&self, index: usize) -> Result<SymmetricView<'_, u8>> {
        if index >= self.pages_per_pe {
            return Err(Error::PageOutOfRange {
                pe: self.shmem.my_pe(),
                index,
                pages_per_pe: self.pages_per_pe,
            });
        }
        self.pages
            .try_view(index * self.page_bytes..(index + 1) * self.page_bytes)
    }

    /// The pool as kernels take it (by value: `KernelArgs::value(pool.handle())`, a
    /// `nvshmem_rs_pool` parameter for the functions of `nvshmem_rs/pool.cuh`).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// # let shmem = nvshmem::Nvshmem::init()?;
    /// # let module = nvshmem::module::Module::from_file(&shmem, "my_kernels.cubin")?;
    /// use nvshmem::module::{grid, KernelArgs};
    /// use nvshmem::pool::{PagePool, PagePoolConfig};
    /// let pool = PagePool::new(&shmem, PagePoolConfig::new(256, 4096).table_len(16))?;
    /// // extern "C" __global__ void my_kernel(nvshmem_rs_pool pool, int pe)
    /// let kernel = module.function("my_kernel")?;
    /// let mut args = KernelArgs::new();
    /// args.value(pool.handle()).value(1i32);
    /// // SAFETY: the arguments match the kernel's parameters.
    /// unsafe { kernel.launch(grid(1, 32), shmem.stream(), &mut args)? };
    /// # Ok(()) }
    /// ```
    pub fn handle(&self) -> PoolHandle {
        PoolHandle {
            pages: self.pages.as_ptr() as *mut std::os::raw::c_char,
            bitmap: self.bitmap.as_ptr(),
            states: self.states.as_ptr(),
            table: self.table.as_ptr(),
            page_bytes: self.page_bytes as u64,
            pages_per_pe: self.pages_per_pe as u32,
            table_len: self.table_len as u32,
            my_pe: self.shmem.my_pe() as i32,
            n_pes: self.shmem.n_pes() as i32,
        }
    }

    /// Allocate a page on PE `pe` (any PE); [`Error::PoolExhausted`] when it has none free.
    pub fn alloc(&self, pe: usize) -> Result<PageId> {
        Ok(self.alloc_n(pe, 1)?[0])
    }

    /// Allocate `n` pages on PE `pe`, all or none: when `pe` has fewer free, the pages taken
    /// are given back and the error is [`Error::PoolExhausted`]. One kernel, `n` threads each
    /// allocating one page as a kernel would; waits for it.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// # let shmem = nvshmem::Nvshmem::init()?;
    /// use nvshmem::pool::{PagePool, PagePoolConfig};
    /// let pool = PagePool::new(&shmem, PagePoolConfig::new(64, 4096))?;
    /// match pool.alloc_n(0, 100) {
    ///     Err(nvshmem::Error::PoolExhausted { available, .. }) => assert!(available <= 64),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn alloc_n(&self, pe: usize, n: usize) -> Result<Vec<PageId>> {
        let pe32 = self.shmem.check_pe(pe)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let exhausted = |available: usize| Error::PoolExhausted {
            pe,
            requested: n,
            available,
            pages_per_pe: self.pages_per_pe,
            page_bytes: self.page_bytes,
        };
        if n > self.pages_per_pe {
            let free = self.pages_per_pe - self.in_use(pe)?;
            return Err(exhausted(free));
        }
        let handle = self.handle();
        let raw = self.round_trip(&[], n, |_, out| {
            let mut args = KernelArgs::new();
            args.value(handle)
                .value(pe32)
                .value(n as u32)
                .device_ptr(out);
            // SAFETY: the parameters of pool_alloc_pages; `out` holds n words.
            unsafe {
                self.kernels
                    .alloc
                    .launch(grid(blocks_for(n), THREADS), &self.stream, &mut args)
            }
        })?;
        let got: Vec<PageId> = raw.iter().filter_map(|&r| PageId::from_raw(r)).collect();
        if got.len() < n {
            self.free_n(&got)?;
            return Err(exhausted(got.len()));
        }
        Ok(got)
    }

    /// Free page `id`: [`Error::PageNotAllocated`] when it is not allocated in the id's
    /// generation (a double free, or a stale id whose page was freed and maybe allocated
    /// again: that allocation is left alone). Any PE may free any page; see the module
    /// documentation for when it may.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// # let shmem = nvshmem::Nvshmem::init()?;
    /// use nvshmem::pool::{PagePool, PagePoolConfig};
    /// let pool = PagePool::new(&shmem, PagePoolConfig::new(1, 4096))?;
    /// let me = shmem.my_pe();
    /// let a = pool.alloc(me)?;
    /// pool.free(a)?;
    /// let b = pool.alloc(me)?; // the same page, in the next generation
    /// assert_eq!((b.index, b.generation), (a.index, a.generation + 1));
    /// assert!(matches!(pool.free(a), Err(nvshmem::Error::PageNotAllocated { .. })));
    /// assert!(pool.is_allocated(b)? && !pool.is_allocated(a)?);
    /// pool.free(b)?;
    /// # Ok(()) }
    /// ```
    pub fn free(&self, id: PageId) -> Result<()> {
        self.free_n(&[id])
    }

    /// Free every page of `ids` (one kernel). Each page that was allocated is freed; if one
    /// was not, the error names the first such.
    pub fn free_n(&self, ids: &[PageId]) -> Result<()> {
        let raw = self.checked_raw(ids)?;
        if raw.is_empty() {
            return Ok(());
        }
        let handle = self.handle();
        let freed = self.round_trip(&raw, raw.len(), |ids_ptr, out| {
            let mut args = KernelArgs::new();
            args.value(handle)
                .device_ptr(ids_ptr)
                .value(raw.len() as u32)
                .device_ptr(out);
            // SAFETY: the parameters of pool_free_pages; both arrays hold len words.
            unsafe {
                self.kernels.free.launch(
                    grid(blocks_for(raw.len()), THREADS),
                    &self.stream,
                    &mut args,
                )
            }
        })?;
        first_not_allocated(ids, &freed)
    }

    /// Whether page `id` is allocated now, in the id's generation (a stale id is not).
    pub fn is_allocated(&self, id: PageId) -> Result<bool> {
        let raw = self.checked_raw(&[id])?;
        Ok(self.allocated_flags(&raw)?[0] != 0)
    }

    /// Pages of PE `pe` allocated now.
    pub fn in_use(&self, pe: usize) -> Result<usize> {
        let words = bitmap_words(self.pages_per_pe);
        let bits = self.read_words(self.bitmap.addr(), pe, words)?;
        Ok(pages_in_use(&bits, self.pages_per_pe))
    }

    /// Write `id` (or no page) into entry `entry` of PE `pe`'s page table, atomically, with
    /// its generation. The page's contents must be complete first (see the module
    /// documentation). The id's PE and index are checked, not whether it is allocated.
    pub fn table_set(&self, pe: usize, entry: usize, id: Option<PageId>) -> Result<()> {
        self.check_entry(entry)?;
        let raw = match id {
            Some(id) => self.checked_raw(&[id])?[0],
            None => NO_PAGE,
        };
        self.shmem.atomic_set(&self.table, entry, raw, pe)
    }

    /// Entry `entry` of PE `pe`'s page table, read atomically: the page published there, or
    /// `None`.
    pub fn table_get(&self, pe: usize, entry: usize) -> Result<Option<PageId>> {
        self.check_entry(entry)?;
        Ok(PageId::from_raw(self.shmem.atomic_fetch(
            &self.table,
            entry,
            pe,
        )?))
    }

    /// The page table of this PE on the device (`table_len` page ids; kernels read and write
    /// it with NVSHMEM atomics, `pool_table_read` and `pool_table_publish`).
    pub fn table(&self) -> &SymmetricBuffer<u64> {
        &self.table
    }

    /// Copy pages `ids` (of any PEs) into `dst`, page `k` at byte `k × page_bytes`, on
    /// `stream`. `dst` holds exactly the pages. Every id is checked first: its PE
    /// ([`Error::PeOutOfRange`]), its index ([`Error::PageOutOfRange`]), and that it is
    /// allocated in its generation ([`Error::PageNotAllocated`], read from the owners' page
    /// states now, waiting for a small kernel). The copy itself is stream-ordered; for CUDA
    /// graphs, and to skip the checks, use [`gather_device`](Self::gather_device).
    pub fn gather<T: Element>(
        &self,
        dst: &impl DeviceMemory<T>,
        ids: &[PageId],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.host_copy(Direction::Gather, dst, ids, stream)
    }

    /// Copy `src` (page `k` at byte `k × page_bytes`) into pages `ids` on `stream`, with the
    /// checks of [`gather`](Self::gather). The pages hold the data at their PEs when the
    /// kernel ends.
    pub fn scatter<T: Element>(
        &self,
        ids: &[PageId],
        src: &impl DeviceMemory<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.host_copy(Direction::Scatter, src, ids, stream)
    }

    /// [`gather`](Self::gather) with the raw ids in device memory (`ids.len()` pages): no host
    /// work but the launch, so it can be captured in a CUDA graph, and the ids can come from a
    /// kernel. Ids that name no page of the pool are skipped (their place in `dst` is left as
    /// it was); whether a page is allocated, and in which generation, is not checked.
    pub fn gather_device<T: Element>(
        &self,
        dst: &impl DeviceMemory<T>,
        ids: &impl DeviceMemory<u64>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.device_copy(Direction::Gather, dst, ids, stream)
    }

    /// [`scatter`](Self::scatter) with the raw ids in device memory, as
    /// [`gather_device`](Self::gather_device).
    pub fn scatter_device<T: Element>(
        &self,
        ids: &impl DeviceMemory<u64>,
        src: &impl DeviceMemory<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.device_copy(Direction::Scatter, src, ids, stream)
    }

    /// The device-id forms: the local side's length, then the copy.
    fn device_copy<T: Element>(
        &self,
        dir: Direction,
        local: &impl DeviceMemory<T>,
        ids: &impl DeviceMemory<u64>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        check_pages_len(
            dir.local_side(),
            std::mem::size_of::<T>(),
            local.device_len(),
            ids.device_len(),
            self.page_bytes,
        )?;
        self.launch_copy(
            dir,
            local.device_addr(stream),
            ids.device_addr(stream),
            ids.device_len(),
            stream,
        )
    }

    /// The checked host forms: lengths, ids, allocation; then the ids to the device in stream
    /// order, the copy, and their memory freed in stream order.
    fn host_copy<T: Element>(
        &self,
        dir: Direction,
        local: &impl DeviceMemory<T>,
        ids: &[PageId],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        check_pages_len(
            dir.local_side(),
            std::mem::size_of::<T>(),
            local.device_len(),
            ids.len(),
            self.page_bytes,
        )?;
        let raw = self.checked_raw(ids)?;
        self.shmem.raw_stream(stream)?;
        if raw.is_empty() {
            return Ok(());
        }
        first_not_allocated(ids, &self.allocated_flags(&raw)?)?;
        let s = stream.cu_stream();
        // SAFETY: memory of this call, used only by the work enqueued here on `stream`, and
        // freed after it in stream order.
        unsafe {
            let dev = cu::malloc_async(s, 8 * raw.len()).during("cuMemAllocAsync")?;
            let copied = cu::memcpy_htod_async(dev, &raw, s)
                .during("cuMemcpyHtoDAsync")
                .and_then(|()| {
                    self.launch_copy(dir, local.device_addr(stream), dev, raw.len(), stream)
                });
            let freed = cu::free_async(dev, s).during("cuMemFreeAsync");
            copied.and(freed)
        }
    }

    /// Launch the gather or scatter kernel over `n` raw ids at `ids` (device memory).
    fn launch_copy(
        &self,
        dir: Direction,
        local: u64,
        ids: u64,
        n: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let n32 = u32::try_from(n).map_err(|_| {
            Error::InvalidArgument(format!("a copy of {n} pages: at most {} at once", u32::MAX))
        })?;
        if n == 0 {
            return Ok(());
        }
        let (chunk, blocks) = copy_grid(n, self.page_bytes);
        let mut args = KernelArgs::new();
        let kernel = match dir {
            Direction::Gather => {
                args.value(self.handle())
                    .device_ptr(local)
                    .device_ptr(ids)
                    .value(n32)
                    .value(chunk);
                &self.kernels.gather
            }
            Direction::Scatter => {
                args.value(self.handle())
                    .device_ptr(ids)
                    .device_ptr(local)
                    .value(n32)
                    .value(chunk);
                &self.kernels.scatter
            }
        };
        // SAFETY: the kernel's parameters; `local` holds n pages (checked by the callers),
        // `ids` n words, and the kernel skips ids that name no page of the pool.
        unsafe { kernel.launch(grid(blocks, THREADS), stream, &mut args) }
    }

    /// The raw ids of `ids`, each checked against the PEs, pages and generations.
    fn checked_raw(&self, ids: &[PageId]) -> Result<Vec<u64>> {
        if u32::try_from(ids.len()).is_err() {
            return Err(Error::InvalidArgument(format!(
                "{} page ids at once: at most {}",
                ids.len(),
                u32::MAX
            )));
        }
        ids.iter()
            .map(|&id| {
                check_id(id, self.shmem.n_pes(), self.pages_per_pe)?;
                Ok(id.to_raw())
            })
            .collect()
    }

    fn check_entry(&self, entry: usize) -> Result<()> {
        if entry >= self.table_len {
            return Err(Error::IndexOutOfRange {
                index: entry,
                len: self.table_len,
            });
        }
        Ok(())
    }

    /// 1 for each raw id whose page is allocated now in the id's generation, 0 for the others.
    fn allocated_flags(&self, raw: &[u64]) -> Result<Vec<u64>> {
        let handle = self.handle();
        self.round_trip(raw, raw.len(), |ids_ptr, out| {
            let mut args = KernelArgs::new();
            args.value(handle)
                .device_ptr(ids_ptr)
                .value(raw.len() as u32)
                .device_ptr(out);
            // SAFETY: the parameters of pool_check_pages; both arrays hold len words.
            unsafe {
                self.kernels.check.launch(
                    grid(blocks_for(raw.len()), THREADS),
                    &self.stream,
                    &mut args,
                )
            }
        })
    }

    /// `n` words at symmetric address `sym` of PE `pe`, read atomically.
    fn read_words(&self, sym: u64, pe: usize, n: usize) -> Result<Vec<u64>> {
        let pe32 = self.shmem.check_pe(pe)?;
        self.round_trip(&[], n, |_, out| {
            let mut args = KernelArgs::new();
            args.device_ptr(sym)
                .value(pe32)
                .value(n as u32)
                .device_ptr(out);
            // SAFETY: the parameters of pool_read_words; `sym` holds n words on every PE
            // (the pool's own buffers), `out` n words.
            unsafe {
                self.kernels
                    .read
                    .launch(grid(blocks_for(n), THREADS), &self.stream, &mut args)
            }
        })
    }

    /// [`round_trip`] on the pool's stream.
    fn round_trip(
        &self,
        input: &[u64],
        out_len: usize,
        launch: impl FnOnce(u64, u64) -> Result<()>,
    ) -> Result<Vec<u64>> {
        round_trip(&self.shmem, &self.stream, input, out_len, launch)
    }
}

/// [`Error::PageNotAllocated`] for the first id whose flag is 0.
fn first_not_allocated(ids: &[PageId], flags: &[u64]) -> Result<()> {
    match ids.iter().zip(flags).find(|(_, &f)| f == 0) {
        Some((id, _)) => Err(Error::PageNotAllocated {
            pe: id.pe as usize,
            index: id.index as usize,
            generation: id.generation,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_page_not_allocated_is_named() {
        let ids = [
            PageId::new(0, 1),
            PageId::new(1, 4).with_generation(3),
            PageId::new(1, 5),
        ];
        assert!(first_not_allocated(&ids, &[1, 1, 1]).is_ok());
        assert!(matches!(
            first_not_allocated(&ids, &[1, 0, 0]),
            Err(Error::PageNotAllocated {
                pe: 1,
                index: 4,
                generation: 3
            })
        ));
        assert!(first_not_allocated(&[], &[]).is_ok());
    }

    #[test]
    fn the_handle_matches_the_header() {
        // The layout kernels take by value: four pointers, then the sizes.
        assert_eq!(std::mem::size_of::<PoolHandle>(), 56);
        assert_eq!(std::mem::align_of::<PoolHandle>(), 8);
        assert_eq!(SIZE_WORDS, 3);
    }
}
