//! [`RingAllGather`]: the safe wrapper that owns the buffers and launches the kernel.

use crate::{kernels, Layout, KERNEL};
use nvshmem::module::{KernelArgs, Module};
use nvshmem::{Element, Error, Nvshmem, Result, SymmetricBuffer, SymmetricView};

/// The all-gather on the GPUs: a loaded, registered kernel and the symmetric buffers it
/// works on. Creating it and [`run`](Self::run) are collective: every PE calls them in the
/// same order with the same sizes.
pub struct RingAllGather<T: Element> {
    layout: Layout,
    data: SymmetricBuffer<T>,
    signals: SymmetricBuffer<u64>,
    module: Module,
    epoch: u64,
    last_blocks: u32,
}

impl<T: Element> RingAllGather<T> {
    /// Threads per block.
    pub const THREADS: u32 = 256;
    /// At most this many blocks per PE (one chunk each at a time).
    pub const MAX_BLOCKS: u32 = 32;

    /// Load the kernel on this PE's GPU and allocate the buffers (collective).
    pub fn new(shmem: &Nvshmem, elems_per_pe: usize, chunk_elems: usize) -> Result<Self> {
        let layout = Layout::new(shmem.n_pes(), elems_per_pe, chunk_elems)?;
        // Local first, so that a PE that cannot load the kernel fails before the collective
        // allocations.
        let module = Module::load(shmem, &kernels::RING_ALLGATHER)?;
        module.function(KERNEL)?;
        let data = shmem.calloc::<T>(layout.total_elems())?;
        let signals = shmem.calloc::<u64>(layout.signal_count())?;
        Ok(RingAllGather {
            layout,
            data,
            signals,
            module,
            epoch: 0,
            last_blocks: 0,
        })
    }

    /// The layout of the buffer.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// This PE's slot, to fill with its contribution before [`run`](Self::run).
    pub fn input(&self) -> SymmetricView<'_, T> {
        self.data
            .view(self.layout.slot(self.data.runtime().my_pe()))
    }

    /// The whole buffer: after [`run`](Self::run), every PE's contribution in its slot.
    pub fn output(&self) -> &SymmetricBuffer<T> {
        &self.data
    }

    /// Blocks per PE used by the last run.
    pub fn blocks(&self) -> u32 {
        self.last_blocks
    }

    /// Gather every PE's slot into every PE (collective), and wait for it.
    pub fn run(&mut self) -> Result<()> {
        let shmem = self.data.runtime().clone();
        let kernel = self.module.function(KERNEL)?;
        let wanted = self.layout.chunks_per_slot().min(Self::MAX_BLOCKS as usize) as u32;
        let cfg = kernel.resident_grid(wanted, Self::THREADS, 0)?;
        let size = std::mem::size_of::<T>();
        self.epoch += 1;
        let mut args = KernelArgs::new();
        args.buffer(&self.data)
            .buffer(&self.signals)
            .value(self.layout.elems_per_pe() * size)
            .value(self.layout.chunk_elems() * size)
            .value(self.epoch);
        // SAFETY: the arguments match ring_allgather(char *data, uint64_t *signals,
        // size_t slot_bytes, size_t chunk_bytes, uint64_t epoch); `data` holds n_pes slots of
        // slot_bytes and `signals` one word per chunk of each, on every PE (same layout,
        // symmetric allocations), and both outlive the kernel: we wait for it below. The
        // kernel waits on other PEs, hence the collective launch.
        unsafe { kernel.launch_collective(cfg, shmem.stream(), &mut args)? };
        self.last_blocks = cfg.grid_dim.0;
        shmem.stream().synchronize().map_err(|source| Error::Cuda {
            call: "cuStreamSynchronize",
            source,
        })
    }
}
