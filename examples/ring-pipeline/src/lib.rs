//! An all-gather by ring pipelining, as a crate of its own on top of `nvshmem`: its kernel
//! (`kernels/ring_allgather.cu`) is compiled by `build.rs` with `nvshmem-build`, embedded
//! here, and driven by the safe wrapper [`RingAllGather`].
//!
//! Every PE contributes `elems_per_pe` elements; afterwards every PE holds all contributions,
//! PE `p`'s in slot `p` of the output. Each slot is cut into chunks that travel round the
//! ring of PEs one hop per step, forwarded with put-with-signal as soon as they arrive, so
//! later chunks are still arriving while earlier ones move on. [`cpu`] has the same
//! algorithm as a CPU model, used by the tests.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use ring_pipeline::RingAllGather;
//! let shmem = nvshmem::Nvshmem::init()?;
//! let mut ag = RingAllGather::<u32>::new(&shmem, 1 << 20, 1 << 14)?; // collective
//! ag.input().copy_from_host(&vec![shmem.my_pe() as u32; 1 << 20])?;
//! ag.run()?; // collective
//! let all = ag.output().to_vec()?; // n_pes << 20 elements, PE p's in slot p
//! # let _ = all;
//! # Ok(()) }
//! ```

use nvshmem::module::{KernelArgs, Module};
use nvshmem::{Element, Error, Nvshmem, Result, SymmetricBuffer, SymmetricView};
use std::ops::Range;

/// The linked cubins of `kernels/*.cu`, one constant per file (`RING_ALLGATHER`).
pub mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// The kernel's entry point in [`kernels::RING_ALLGATHER`].
pub const KERNEL: &str = "ring_allgather";

/// How the all-gather buffer is cut: one slot of `elems_per_pe` elements per PE, each slot in
/// chunks of `chunk_elems` elements (the last chunk of a slot may be shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    n_pes: usize,
    elems_per_pe: usize,
    chunk_elems: usize,
}

impl Layout {
    /// A layout; a chunk larger than a slot is cut down to the slot.
    pub fn new(n_pes: usize, elems_per_pe: usize, chunk_elems: usize) -> Result<Layout> {
        if n_pes == 0 || elems_per_pe == 0 || chunk_elems == 0 {
            return Err(Error::InvalidArgument(format!(
                "ring all-gather needs at least one PE, element and chunk element (got {n_pes} PEs, \
                 {elems_per_pe} elements per PE, chunks of {chunk_elems})"
            )));
        }
        if n_pes.checked_mul(elems_per_pe).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{n_pes} x {elems_per_pe} elements overflow usize"
            )));
        }
        Ok(Layout {
            n_pes,
            elems_per_pe,
            chunk_elems: chunk_elems.min(elems_per_pe),
        })
    }

    /// Number of PEs.
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }

    /// Elements each PE contributes.
    pub fn elems_per_pe(&self) -> usize {
        self.elems_per_pe
    }

    /// Elements per chunk.
    pub fn chunk_elems(&self) -> usize {
        self.chunk_elems
    }

    /// Chunks per slot.
    pub fn chunks_per_slot(&self) -> usize {
        self.elems_per_pe.div_ceil(self.chunk_elems)
    }

    /// Elements of the whole buffer (every PE's slot).
    pub fn total_elems(&self) -> usize {
        self.n_pes * self.elems_per_pe
    }

    /// Number of signal words: one per chunk of every slot.
    pub fn signal_count(&self) -> usize {
        self.n_pes * self.chunks_per_slot()
    }

    /// The elements of PE `pe`'s slot in the buffer.
    pub fn slot(&self, pe: usize) -> Range<usize> {
        pe * self.elems_per_pe..(pe + 1) * self.elems_per_pe
    }

    /// The elements of chunk `c` of `slot` in the buffer.
    pub fn chunk(&self, slot: usize, c: usize) -> Range<usize> {
        let begin = slot * self.elems_per_pe + c * self.chunk_elems;
        begin..(begin + self.chunk_elems).min((slot + 1) * self.elems_per_pe)
    }

    /// The signal word of chunk `c` of `slot`.
    pub fn signal_index(&self, slot: usize, c: usize) -> usize {
        slot * self.chunks_per_slot() + c
    }

    /// The slot PE `me` forwards to the next PE at `step` (0 for its own, up to
    /// `n_pes - 2`): `(me - step) mod n_pes`.
    pub fn slot_sent(&self, me: usize, step: usize) -> usize {
        (me + self.n_pes - step % self.n_pes) % self.n_pes
    }
}

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

/// Deterministic pseudo-random contributions, so any PE can compute any PE's input.
pub fn random_input(seed: u64, trial: u64, pe: usize, len: usize) -> Vec<u32> {
    let mut state = seed
        ^ trial.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (pe as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..len)
        .map(|_| (cpu::splitmix64(&mut state) >> 32) as u32)
        .collect()
}

/// The algorithm on the CPU: the expected result, and a model of the kernel that runs every
/// PE's blocks in an arbitrary interleaving with puts landing late.
pub mod cpu {
    use super::Layout;

    /// What every PE holds after the all-gather: the inputs one after the other.
    pub fn reference<T: Copy>(inputs: &[Vec<T>]) -> Vec<T> {
        inputs.iter().flatten().copied().collect()
    }

    /// One step of the SplitMix64 generator.
    pub fn splitmix64(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// One thing a block of the kernel does.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Op {
        /// `nvshmem_signal_wait_until(signals[slot, c], GE, epoch)`.
        Wait { slot: usize, c: usize },
        /// `nvshmemx_putmem_signal_nbi_block` of chunk `c` of `slot` to the next PE.
        Put { slot: usize, c: usize },
    }

    /// What block `block` of `blocks` on PE `me` does, in order, as `ring_allgather` does it.
    pub fn kernel_program(layout: &Layout, me: usize, block: usize, blocks: usize) -> Vec<Op> {
        let n = layout.n_pes();
        let mut ops = Vec::new();
        if n == 1 {
            return ops;
        }
        let chunks = layout.chunks_per_slot();
        for step in 0..n - 1 {
            let slot = layout.slot_sent(me, step);
            for c in (block..chunks).step_by(blocks) {
                if step > 0 {
                    ops.push(Op::Wait { slot, c });
                }
                ops.push(Op::Put { slot, c });
            }
        }
        let last = (me + 1) % n;
        for c in (block..chunks).step_by(blocks) {
            ops.push(Op::Wait { slot: last, c });
        }
        ops
    }

    /// Run the ring all-gather `calls.len()` times on a model of `layout.n_pes()` PEs, PE
    /// `p` with `blocks[p]` blocks; `calls[k][p]` is PE `p`'s input to call `k`. Returns
    /// every PE's buffer as its kernel returns, for each call.
    ///
    /// Blocks take turns in an order drawn from `seed`; a put's data and signal land at a
    /// later random moment, its source read only then (the worst a non-blocking put may do).
    /// A PE's kernel returns when its blocks are done and its own puts have landed (the
    /// closing quiet). Between calls, as in the kernel's opening barrier, everything in
    /// flight lands. Fails on a deadlock, a chunk written twice in one call, a write into a
    /// PE's own slot, or data reaching a PE after its kernel returned.
    pub fn simulate<T: Copy + Default>(
        layout: &Layout,
        blocks: &[usize],
        calls: &[Vec<Vec<T>>],
        seed: u64,
    ) -> Result<Vec<Vec<Vec<T>>>, String> {
        simulate_with(layout, blocks, calls, seed, kernel_program)
    }

    /// [`simulate`] with another schedule than the kernel's, to see the model catch
    /// mistakes.
    pub fn simulate_with<T: Copy + Default>(
        layout: &Layout,
        blocks: &[usize],
        calls: &[Vec<Vec<T>>],
        seed: u64,
        program: fn(&Layout, usize, usize, usize) -> Vec<Op>,
    ) -> Result<Vec<Vec<Vec<T>>>, String> {
        let n = layout.n_pes();
        if blocks.len() != n || blocks.contains(&0) {
            return Err(format!("need a non-zero block count for each of {n} PEs"));
        }
        let mut rng = seed;
        let mut data = vec![vec![T::default(); layout.total_elems()]; n];
        let mut signals = vec![vec![0u64; layout.signal_count()]; n];
        let mut results = Vec::new();
        for (k, inputs) in calls.iter().enumerate() {
            let epoch = k as u64 + 1;
            if inputs.len() != n {
                return Err(format!("call {k} has inputs for {} PEs", inputs.len()));
            }
            for (pe, input) in inputs.iter().enumerate() {
                if input.len() != layout.elems_per_pe() {
                    return Err(format!("input of PE {pe} has {} elements", input.len()));
                }
                data[pe][layout.slot(pe)].copy_from_slice(input);
            }
            // (pe, program, next op)
            let mut actors: Vec<(usize, Vec<Op>, usize)> = (0..n)
                .flat_map(|pe| (0..blocks[pe]).map(move |b| (pe, b)))
                .map(|(pe, b)| (pe, program(layout, pe, b, blocks[pe]), 0))
                .collect();
            // (sending PE, slot, chunk)
            let mut in_flight: Vec<(usize, usize, usize)> = Vec::new();
            let mut returned: Vec<Option<Vec<T>>> = vec![None; n];
            loop {
                // Kernels that return now: blocks done, own puts landed.
                for pe in 0..n {
                    let busy = actors
                        .iter()
                        .any(|(p, ops, pc)| *p == pe && *pc < ops.len())
                        || in_flight.iter().any(|(from, _, _)| *from == pe);
                    if returned[pe].is_none() && !busy {
                        returned[pe] = Some(data[pe].clone());
                    }
                }
                let runnable: Vec<usize> = (0..actors.len())
                    .filter(|&a| {
                        let (pe, ops, pc) = &actors[a];
                        match ops.get(*pc) {
                            None => false,
                            Some(Op::Put { .. }) => true,
                            Some(&Op::Wait { slot, c }) => {
                                signals[*pe][layout.signal_index(slot, c)] >= epoch
                            }
                        }
                    })
                    .collect();
                if runnable.is_empty() && in_flight.is_empty() {
                    if let Some((pe, ops, pc)) = actors.iter().find(|(_, ops, pc)| *pc < ops.len())
                    {
                        return Err(format!(
                            "call {k}: deadlock, PE {pe} stuck at {:?}",
                            ops[*pc]
                        ));
                    }
                    break;
                }
                // Either deliver a put or let a block take its next step.
                let pick = splitmix64(&mut rng) as usize % (runnable.len() + in_flight.len());
                if pick >= runnable.len() {
                    let (from, slot, c) = in_flight.swap_remove(pick - runnable.len());
                    let to = (from + 1) % n;
                    if slot == to {
                        return Err(format!("call {k}: PE {from} overwrote PE {to}'s own slot"));
                    }
                    if returned[to].is_some() {
                        return Err(format!(
                            "call {k}: chunk {c} of slot {slot} reached PE {to} after its kernel returned"
                        ));
                    }
                    let sig = layout.signal_index(slot, c);
                    if signals[to][sig] >= epoch {
                        return Err(format!(
                            "call {k}: chunk {c} of slot {slot} reached PE {to} twice"
                        ));
                    }
                    let range = layout.chunk(slot, c);
                    let chunk = data[from][range.clone()].to_vec();
                    data[to][range].copy_from_slice(&chunk);
                    signals[to][sig] = epoch;
                } else {
                    let actor = &mut actors[runnable[pick]];
                    if let Op::Put { slot, c } = actor.1[actor.2] {
                        in_flight.push((actor.0, slot, c));
                    }
                    actor.2 += 1;
                }
            }
            results.push(
                returned
                    .into_iter()
                    .map(|d| d.unwrap_or_default())
                    .collect(),
            );
        }
        Ok(results)
    }
}
