//! Device-initiated all-reduce and all-gather over NVLink: our kernels in
//! `kernels/collectives.cu`, launched on a stream with no host synchronisation, so they can be
//! captured in CUDA graphs.
//!
//! Every PE must make the same sequence of calls on its [`Collectives`] (same operations,
//! sizes and algorithms), each call stream-ordered after the previous one on that PE, as for
//! any collective. Back-to-back calls on the same buffers are safe: a call returns (on the
//! stream) only when no peer will touch this PE's buffers again for it.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::{AllReduceAlgo, Collectives, ReduceOp};
//! let shmem = nvshmem::Nvshmem::init()?;
//! let coll = Collectives::new(&shmem)?;
//! let x = shmem.malloc::<nvshmem::bf16>(1 << 20)?;
//! x.copy_from_host(&vec![nvshmem::bf16::ONE; 1 << 20])?;
//! coll.all_reduce(ReduceOp::Sum, &x, &x, AllReduceAlgo::Auto, shmem.stream())?; // in place
//! # Ok(()) }
//! ```

use crate::buffer::{SymmetricBuffer, SymmetricView};
use crate::element::{DataType, Element, ReduceOp};
use crate::error::{CudaResultExt, Error, Result};
use crate::kernels::COLLECTIVES;
use crate::module::Module;
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, sys as cusys, CudaStream};
use std::collections::HashMap;
use std::ffi::c_void;

/// All-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllReduceAlgo {
    /// Chosen by size, PE count and element type ([`CollectivesConfig`]).
    Auto,
    /// One-shot of the raw data into receive buffers pre-filled with a sentinel (an all-ones
    /// NaN pattern): readers poll the data itself until no word is the sentinel, then refill.
    /// No flags and no doubled bytes; for `f32`, `f16` and `bf16` only (an `i32` can be any
    /// pattern). A NaN input with all bits set is sent, and reduced, as another NaN.
    Sentinel,
    /// Reduce-scatter, then all-gather, both into sentinel-filled receive buffers: each PE
    /// pushes every part of its input to the part's owner, the owner reduces it and pushes
    /// the result to every PE. For three or more PEs it moves 2 (n - 1) / n times the input
    /// where the sentinel one-shot moves n - 1 times, for one more hop (medium messages);
    /// `f32`, `f16` and `bf16` only.
    SentinelTwoShot,
    /// One-shot with the flags packed into the data (each 16-byte store carries 8 bytes and
    /// the call's epoch), so readers poll the data itself: no fence, no separate flag round.
    /// Moves twice the bytes; for the smallest messages.
    LowLatency,
    /// Reduce-scatter, then all-gather, both in low-latency lines: each PE pushes every part
    /// of its input to the part's owner, the owner reduces it and pushes the result to every
    /// PE. For three or more PEs it moves 2 (n - 1) / n times the input where the one-shot
    /// moves n - 1 times, for one more hop (small to medium messages).
    LowLatencyTwoShot,
    /// Every PE pushes its input to every peer, one flag handshake per block, then every PE
    /// reduces locally (small messages where the low-latency paths do not apply).
    OneShot,
    /// Reduce-scatter, then all-gather, with no staging: each PE reads its part of every
    /// peer's input, reduces it and stores the result into every PE's output (medium
    /// messages).
    TwoShot,
    /// Reduce-scatter, then all-gather, with stores only: each PE pushes every part of its
    /// input to the part's owner through chunked staging, the owner reduces and pushes the
    /// result to every PE, pipelined over rounds of chunks (large messages).
    Bandwidth,
}

/// All-gather algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllGatherAlgo {
    /// Chosen by size and PE count ([`CollectivesConfig`]).
    Auto,
    /// One-shot push with the flags packed into the data (smallest messages).
    LowLatency,
    /// One-shot push with signals into staging buffers (small messages).
    OneShot,
    /// Push straight into every PE's output over all SMs (large messages).
    Bandwidth,
}

impl AllReduceAlgo {
    fn kernel_prefix(self) -> &'static str {
        match self {
            AllReduceAlgo::Sentinel => "sentinel",
            AllReduceAlgo::SentinelTwoShot => "sentinel_twoshot",
            AllReduceAlgo::LowLatency => "ll",
            AllReduceAlgo::LowLatencyTwoShot => "ll_twoshot",
            AllReduceAlgo::OneShot => "oneshot",
            AllReduceAlgo::TwoShot => "twoshot",
            AllReduceAlgo::Bandwidth | AllReduceAlgo::Auto => "bandwidth",
        }
    }
}

/// Size thresholds of the automatic choice (which also size the staging space), and how
/// calls are launched.
#[derive(Debug, Clone)]
pub struct CollectivesConfig {
    /// Floating-point all-reduce inputs above this many bytes, up to `sentinel_max_bytes`,
    /// use the sentinel one-shot; those up to it use the low-latency one-shot, a little
    /// faster for a vector or two.
    pub sentinel_min_bytes: usize,
    /// See `sentinel_min_bytes`.
    pub sentinel_max_bytes: usize,
    /// Floating-point all-reduce inputs above `sentinel_max_bytes`, up to this many bytes,
    /// use the sentinel two-shot. With `sentinel_max_bytes` this sizes the sentinel receive
    /// buffers: one slot per PE and epoch parity holds a one-shot input, or a two-shot's
    /// part twice over, and is at least 1 MiB; explicit calls take whatever fits.
    pub sentinel_twoshot_max_bytes: usize,
    /// All-reduce inputs up to this many bytes (for floating-point types: outside the
    /// sentinel range) use the low-latency one-shot.
    pub ll_max_bytes: usize,
    /// All-reduce inputs up to this many bytes (above low-latency) use the low-latency
    /// two-shot.
    pub ll_twoshot_max_bytes: usize,
    /// All-reduce inputs up to this many bytes (above low-latency two-shot) use one-shot.
    pub oneshot_max_bytes: usize,
    /// All-reduce inputs up to this many bytes (above one-shot) use two-shot.
    pub twoshot_max_bytes: usize,
    /// All-gather inputs (per PE) up to this many bytes use the low-latency one-shot.
    pub allgather_ll_max_bytes: usize,
    /// All-gather inputs (per PE) up to this many bytes (above low-latency) use one-shot.
    pub allgather_oneshot_max_bytes: usize,
    /// Launch with programmatic stream serialization: a call may begin launching while the
    /// kernel before it on the stream runs, and waits on the device for that kernel to
    /// complete before it touches memory. This hides most of the launch latency between
    /// back-to-back kernels; `false` launches plainly.
    pub programmatic_launch: bool,
}

impl CollectivesConfig {
    /// Defaults measured on H200s connected by NVSwitch (see docs/).
    pub fn for_pes(n_pes: usize) -> Self {
        if n_pes <= 2 {
            // 2 PEs (graph replays): floating point takes the low-latency one-shot to 2 KiB
            // and the sentinel one-shot to 2 MiB (1 MiB: 5.7 us against 8.2 for the flag
            // one-shot and 6.5 for the sentinel two-shot); i32 the low-latency one-shot to
            // 512 KiB and the flag one-shot to 1 MiB. A two-shot moves as much as a one-shot
            // on 2 PEs, so the low-latency two-shots are never chosen; the two-shot to
            // 32 MiB, the store-only bandwidth path above. All-gather: low-latency to
            // 512 KiB per PE, bandwidth above.
            CollectivesConfig {
                sentinel_min_bytes: 2 << 10,
                sentinel_max_bytes: 2 << 20,
                sentinel_twoshot_max_bytes: 2 << 20,
                ll_max_bytes: 512 << 10,
                ll_twoshot_max_bytes: 512 << 10,
                oneshot_max_bytes: 1 << 20,
                twoshot_max_bytes: 32 << 20,
                allgather_ll_max_bytes: 512 << 10,
                allgather_oneshot_max_bytes: 512 << 10,
                programmatic_launch: true,
            }
        } else {
            // 4 PEs (graph replays): floating point takes the low-latency one-shot to 2 KiB,
            // the sentinel one-shot to 128 KiB (64 KiB: 4.1 us against 4.5 for the sentinel
            // two-shot) and the sentinel two-shot to 2 MiB (256 KiB: 5.6 us against 6.1 for
            // the sentinel one-shot; 1 MiB: 8.4 against 12.5 for the two-shot; 2 MiB: 15.1
            // against 16.6); i32 the low-latency one-shot to 128 KiB and the low-latency
            // two-shot to 512 KiB. The flag one-shot is never chosen; the two-shot to
            // 32 MiB, the store-only bandwidth path above. All-gather: low-latency to
            // 256 KiB per PE, bandwidth above.
            CollectivesConfig {
                sentinel_min_bytes: 2 << 10,
                sentinel_max_bytes: 128 << 10,
                sentinel_twoshot_max_bytes: 2 << 20,
                ll_max_bytes: 128 << 10,
                ll_twoshot_max_bytes: 512 << 10,
                oneshot_max_bytes: 512 << 10,
                twoshot_max_bytes: 32 << 20,
                allgather_ll_max_bytes: 256 << 10,
                allgather_oneshot_max_bytes: 256 << 10,
                programmatic_launch: true,
            }
        }
    }

    /// Bytes of one staging slot (there is one per PE and epoch parity): one-shot inputs
    /// whole, low-latency inputs twice over, a low-latency two-shot's part twice over in
    /// each half, and the bandwidth all-reduce's chunk ring.
    fn slot_bytes(&self, n_pes: usize) -> usize {
        // Low-latency lines carry 8 bytes of data in 16.
        let ll = (2 * self.ll_max_bytes.max(self.allgather_ll_max_bytes) + 16)
            .max(ll_twoshot_slot_bytes(self.ll_twoshot_max_bytes, n_pes));
        let slot = self
            .oneshot_max_bytes
            .max(self.allgather_oneshot_max_bytes)
            .max(ll)
            .max(BW_STAGING_BYTES)
            // Room for explicitly chosen algorithms up to a few MiB.
            .max(2 << 20);
        slot.div_ceil(256) * 256
    }

    /// Bytes of one sentinel receive slot (one per PE and epoch parity): a one-shot input, or
    /// a two-shot's part in each half.
    fn sentinel_slot_bytes(&self, n_pes: usize) -> usize {
        self.sentinel_max_bytes
            .max(sentinel_twoshot_slot_bytes(
                self.sentinel_twoshot_max_bytes,
                n_pes,
            ))
            .max(1 << 20)
            .div_ceil(256)
            * 256
    }
}

/// Must match `kernels/collectives.cu`.
const MAX_BLOCKS: usize = 512;
const MAX_PES: usize = 64;
const FLAG_SETS: usize = 4;
/// The bandwidth all-reduce's chunk ring per source PE (slots x blocks x chunk) fits in this
/// much of a staging slot.
const BW_STAGING_BYTES: usize = 6 << 20;
/// Threads per block of the bandwidth all-reduce; it runs up to two blocks per SM, so that
/// one block's flag handshake overlaps another's copies.
const BW_THREADS: u32 = 256;
const BW_BLOCKS_PER_SM: usize = 2;
/// Chunk slots per block and source. From three on, a block pushes its next round's chunks
/// before it waits for the current round's (measured on 4 H200s with the same 8 KiB chunks:
/// 1-3% faster than two slots at 64-256 MiB, 2-5% on 2 H200s; four slots no faster).
const BW_SLOTS: usize = 3;
/// Smallest chunk, in 16-byte vectors: below it, fewer blocks are launched.
const BW_MIN_CHUNK_VECS: usize = 256;

/// How a bandwidth all-reduce cuts its parts into chunks (`BandwidthPlan` in the kernels).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BandwidthPlan {
    chunk_vecs: u32,
    slots: u32,
}

/// Blocks and plan of a bandwidth all-reduce over `nvec` vectors: enough blocks for chunks of
/// at least `BW_MIN_CHUNK_VECS`, up to `max_blocks`, and chunks that fill the ring (measured
/// on 4 H200s at 256 MiB: two 256-thread blocks per SM with 8 KiB chunks beat one 512-thread
/// block per SM with 16 to 64 KiB chunks by 2 to 16%, and three or four blocks per SM).
fn bandwidth_plan(nvec: usize, n_pes: usize, max_blocks: usize) -> (u32, BandwidthPlan) {
    let part = nvec.div_ceil(n_pes.max(1));
    let blocks = blocks_for(part, BW_MIN_CHUNK_VECS, max_blocks.clamp(1, MAX_BLOCKS));
    let plan = BandwidthPlan {
        chunk_vecs: (BW_STAGING_BYTES / 16 / (BW_SLOTS * blocks as usize)) as u32,
        slots: BW_SLOTS as u32,
    };
    (blocks, plan)
}
const THREADS: u32 = 512;
const UNROLL: usize = 4;
/// One-shot all-reduce grid: small blocks over many SMs spread the pushes (measured on 4
/// H200s, 128 x 128 beat 64 x 512 by 0.4 to 1.5 us from 64 KiB to 512 KiB).
const ONESHOT_MAX_BLOCKS: usize = 128;
const ONESHOT_THREADS: u32 = 128;
/// Low-latency lines hold 8 bytes of data each; smaller blocks spread them over more SMs.
const LL_THREADS: u32 = 128;
/// Largest low-latency block.
const LL_MAX_THREADS: usize = 512;
/// PEs whose staging addresses fit the low-latency kernels' by-value table (`Peers`).
const LL_MAX_PES: usize = 16;

/// Must match `struct Peers` in kernels/collectives.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct Peers {
    slot: [u64; LL_MAX_PES],
    me: i32,
    npes: i32,
}

/// Our all-reduce and all-gather kernels over the world team, with their symmetric workspace.
pub struct Collectives {
    shmem: Nvshmem,
    config: CollectivesConfig,
    /// The epoch of this PE's calls, one copy per block index.
    ctrl: SymmetricBuffer<u64>,
    flags: SymmetricBuffer<u64>,
    staging: SymmetricBuffer<u8>,
    slot_bytes: usize,
    sm_count: usize,
    /// Blocks of a bandwidth all-reduce that are resident at once (its blocks wait on each
    /// other's peers).
    bandwidth_max_blocks: usize,
    /// Every PE's staging base as mapped here, for the low-latency kernels; `None` above
    /// `LL_MAX_PES` PEs.
    peers: Option<Peers>,
    /// The sentinel all-reduce's receive buffers, their slot size and every PE's base.
    sentinel: SymmetricBuffer<u32>,
    sentinel_slot_bytes: usize,
    sentinel_peers: Option<Peers>,
    functions: HashMap<String, cusys::CUfunction>,
    // Last: unloaded after the functions above are no longer used.
    _module: Module,
}

unsafe impl Send for Collectives {}
unsafe impl Sync for Collectives {}

fn type_name(t: DataType) -> Option<&'static str> {
    match t {
        DataType::F32 => Some("f32"),
        DataType::F16 => Some("f16"),
        DataType::BF16 => Some("bf16"),
        DataType::I32 => Some("i32"),
        _ => None,
    }
}

fn op_name(op: ReduceOp) -> Option<&'static str> {
    match op {
        ReduceOp::Sum => Some("sum"),
        ReduceOp::Max => Some("max"),
        ReduceOp::Min => Some("min"),
        _ => None,
    }
}

/// The kernel entry points of kernels/collectives.cu.
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for algo in ["ll", "ll_twoshot", "oneshot", "twoshot", "bandwidth"] {
        for ty in ["f32", "f16", "bf16", "i32"] {
            for op in ["sum", "max", "min"] {
                names.push(format!("{algo}_allreduce_{ty}_{op}"));
            }
        }
    }
    for algo in ["sentinel", "sentinel_twoshot"] {
        for ty in ["f32", "f16", "bf16"] {
            for op in ["sum", "max", "min"] {
                names.push(format!("{algo}_allreduce_{ty}_{op}"));
            }
        }
    }
    names.push("ll_allgather_bytes".into());
    names.push("oneshot_allgather_bytes".into());
    names.push("bandwidth_allgather_bytes".into());
    names
}

/// Staging slot that a low-latency two-shot of `bytes` needs: one line (16 bytes for 8 of
/// data) per line of a part, in each half.
fn ll_twoshot_slot_bytes(bytes: usize, n_pes: usize) -> usize {
    2 * 16 * bytes.div_ceil(8).div_ceil(n_pes.max(1))
}

/// The largest low-latency two-shot input whose parts fit half of a `slot_bytes` slot.
fn ll_twoshot_max_input(slot_bytes: usize, n_pes: usize) -> usize {
    slot_bytes / 32 * n_pes.max(1) * 8
}

/// Sentinel slot that a sentinel two-shot of `bytes` needs: a part's 16-byte vectors in each
/// half.
fn sentinel_twoshot_slot_bytes(bytes: usize, n_pes: usize) -> usize {
    2 * 16 * bytes.div_ceil(16).div_ceil(n_pes.max(1))
}

/// The largest sentinel two-shot input whose parts fit half of a `slot_bytes` slot.
fn sentinel_twoshot_max_input(slot_bytes: usize, n_pes: usize) -> usize {
    slot_bytes / 32 * n_pes.max(1) * 16
}

/// Low-latency grid for `lines` lines, one per thread where possible: 128-thread blocks, one
/// per SM at most; above 128 lines per SM, larger blocks, so that every line still has its
/// own thread (measured on 2 H200s at 256 KiB: 4.01 us against 4.97 with 128 threads).
fn ll_grid(lines: usize, max_blocks: usize) -> (u32, u32) {
    let max_blocks = max_blocks.clamp(1, MAX_BLOCKS);
    let threads = lines
        .div_ceil(max_blocks)
        .next_multiple_of(32)
        .clamp(LL_THREADS as usize, LL_MAX_THREADS);
    (blocks_for(lines, threads, max_blocks), threads as u32)
}

/// Where `buf` lives on every PE, as mapped here; `None` above `LL_MAX_PES` PEs. Every PE
/// must be reachable (checked before).
fn peer_table<T: Element>(shmem: &Nvshmem, buf: &SymmetricBuffer<T>) -> Result<Option<Peers>> {
    let n = shmem.n_pes();
    if n > LL_MAX_PES {
        return Ok(None);
    }
    let mut table = Peers {
        slot: [0; LL_MAX_PES],
        me: shmem.my_pe() as i32,
        npes: n as i32,
    };
    for pe in 0..n {
        table.slot[pe] = buf.peer_ptr(pe)?.map_or(0, |p| p as u64);
    }
    Ok(Some(table))
}

/// Grid size for `work` units of `per_block` each, between 1 and `max`.
fn blocks_for(work: usize, per_block: usize, max: usize) -> u32 {
    work.div_ceil(per_block).clamp(1, max) as u32
}

impl Collectives {
    /// Load the kernels and allocate the symmetric workspace (collective), with the default
    /// thresholds for this PE count.
    pub fn new(shmem: &Nvshmem) -> Result<Self> {
        Self::with_config(shmem, CollectivesConfig::for_pes(shmem.n_pes()))
    }

    /// [`new`](Self::new) with explicit thresholds; every PE must pass the same.
    pub fn with_config(shmem: &Nvshmem, config: CollectivesConfig) -> Result<Self> {
        let n = shmem.n_pes();
        if n > MAX_PES {
            return Err(Error::InvalidArgument(format!(
                "our collectives support up to {MAX_PES} PEs ({n} running); use Team::all_reduce"
            )));
        }
        let module = Module::load(shmem, &COLLECTIVES)?;
        let mut functions = HashMap::new();
        for name in kernel_names() {
            let f = module.function(&name)?.cu_function();
            functions.insert(name, f);
        }
        let slot_bytes = config.slot_bytes(n);
        // One epoch copy per block index (see `Ctrl` in the kernels).
        let ctrl = shmem.calloc::<u64>(MAX_BLOCKS)?;
        let flags = shmem.calloc::<u64>(FLAG_SETS * MAX_BLOCKS * n)?;
        // Zeroed: a low-latency tag is 0 only once in 2^32 calls, so no line is taken for data
        // before it is sent (a dropped workspace's lines would be).
        let staging = shmem.calloc::<u8>(2 * n * slot_bytes)?;
        // Every peer must be load/store reachable (one node, NVLink or PCIe peer access).
        for pe in 0..n {
            if ctrl.peer_ptr(pe)?.is_none() {
                return Err(Error::InvalidArgument(format!(
                    "PE {pe} is not load/store reachable from PE {} (different node or no peer \
                     access): our collectives need every PE on one node with peer access; use \
                     Team::all_reduce / Team::fcollect instead",
                    shmem.my_pe()
                )));
            }
        }
        // Every word starts as the sentinel (see the kernels).
        let sentinel_slot_bytes = config.sentinel_slot_bytes(n);
        let sentinel = shmem.malloc::<u32>(2 * n * sentinel_slot_bytes / 4)?;
        sentinel.copy_from_host(&vec![u32::MAX; sentinel.len()])?;
        let peers = peer_table(shmem, &staging)?;
        let sentinel_peers = peer_table(shmem, &sentinel)?;
        let sm_count = shmem
            .context()
            .attribute(cusys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("cuDeviceGetAttribute")? as usize;
        let mut per_sm = BW_BLOCKS_PER_SM;
        for (name, &f) in &functions {
            if name.starts_with("bandwidth_allreduce_") {
                // SAFETY: `f` is a function of the loaded module.
                let fit = unsafe {
                    cu::occupancy::max_active_block_per_multiprocessor(f, BW_THREADS as i32, 0)
                }
                .during("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
                per_sm = per_sm.min(fit.max(1) as usize);
            }
        }
        // Blocks pair up with the same block index on every PE, so every PE must launch the
        // same grids: all take the smallest SM count and occupancy (mixed GPU models).
        let agreed = shmem.malloc::<i32>(2)?;
        agreed.copy_from_host(&[sm_count as i32, per_sm as i32])?;
        shmem
            .team_world()
            .all_reduce(ReduceOp::Min, &agreed, &agreed, shmem.stream())?;
        let agreed = agreed.to_vec()?;
        let (sm_count, per_sm) = (agreed[0].max(1) as usize, agreed[1].max(1) as usize);
        let bandwidth_max_blocks = (sm_count * per_sm).min(MAX_BLOCKS);
        // Flags and the epoch must be zero everywhere before anyone signals.
        shmem.enter()?;
        unsafe { nvshmem_sys::nvshmem_barrier_all() };
        Ok(Collectives {
            shmem: shmem.clone(),
            config,
            ctrl,
            flags,
            staging,
            slot_bytes,
            sm_count,
            bandwidth_max_blocks,
            peers,
            sentinel,
            sentinel_slot_bytes,
            sentinel_peers,
            functions,
            _module: module,
        })
    }

    /// The thresholds in use.
    pub fn config(&self) -> &CollectivesConfig {
        &self.config
    }

    /// The algorithm `Auto` picks for an all-reduce of `bytes` of `dtype` per PE.
    pub fn choose_all_reduce(&self, dtype: DataType, bytes: usize) -> AllReduceAlgo {
        let ll = self.peers.is_some();
        let float = matches!(dtype, DataType::F32 | DataType::F16 | DataType::BF16);
        let sentinel = float && ll && bytes > self.config.sentinel_min_bytes;
        if sentinel && bytes <= self.config.sentinel_max_bytes {
            AllReduceAlgo::Sentinel
        } else if sentinel && bytes <= self.config.sentinel_twoshot_max_bytes {
            AllReduceAlgo::SentinelTwoShot
        } else if bytes <= self.config.ll_max_bytes && ll {
            AllReduceAlgo::LowLatency
        } else if bytes <= self.config.ll_twoshot_max_bytes && ll {
            AllReduceAlgo::LowLatencyTwoShot
        } else if bytes <= self.config.oneshot_max_bytes {
            AllReduceAlgo::OneShot
        } else if bytes <= self.config.twoshot_max_bytes {
            AllReduceAlgo::TwoShot
        } else {
            AllReduceAlgo::Bandwidth
        }
    }

    /// The algorithm `Auto` picks for an all-gather of `bytes` per PE.
    pub fn choose_all_gather(&self, bytes: usize) -> AllGatherAlgo {
        if bytes <= self.config.allgather_ll_max_bytes && self.peers.is_some() {
            AllGatherAlgo::LowLatency
        } else if bytes <= self.config.allgather_oneshot_max_bytes {
            AllGatherAlgo::OneShot
        } else {
            AllGatherAlgo::Bandwidth
        }
    }

    fn check_runtime<T: Element>(&self, view: &SymmetricView<'_, T>, what: &str) -> Result<()> {
        if !std::sync::Arc::ptr_eq(&view.runtime().rt, &self.shmem.rt) {
            return Err(Error::InvalidArgument(format!(
                "{what} belongs to another NVSHMEM runtime"
            )));
        }
        if view.as_ptr() as usize % 16 != 0 {
            return Err(Error::InvalidArgument(format!(
                "{what} must start on a 16-byte boundary (views at element offsets that are multiples of {})",
                16 / std::mem::size_of::<T>()
            )));
        }
        Ok(())
    }

    /// `dst[i] = op over PEs of src[i]`, for `f32`, `f16`, `bf16` (accumulated in f32) and
    /// `i32`, with `Sum`, `Max` or `Min`. `src` and `dst` may be the same buffer (in place);
    /// they must not otherwise overlap. The result is bitwise identical on every PE.
    pub fn all_reduce<'a, T: Element>(
        &self,
        op: ReduceOp,
        src: impl Into<SymmetricView<'a, T>>,
        dst: impl Into<SymmetricView<'a, T>>,
        algo: AllReduceAlgo,
        stream: &CudaStream,
    ) -> Result<()> {
        let (src, dst) = (src.into(), dst.into());
        let ty = type_name(T::DTYPE).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "our all-reduce takes f32, f16, bf16 or i32, not {}; use Team::all_reduce",
                T::NVSHMEM_NAME
            ))
        })?;
        let opn = op_name(op).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "our all-reduce does Sum, Max and Min, not {op:?}; use Team::all_reduce"
            ))
        })?;
        self.check_runtime(&src, "all_reduce source")?;
        self.check_runtime(&dst, "all_reduce destination")?;
        crate::buffer::check_len("all_reduce destination", src.len(), dst.len())?;
        let bytes = src.len() * std::mem::size_of::<T>();
        let (s, d) = (src.as_ptr() as usize, dst.as_ptr() as usize);
        if s != d && s < d + bytes && d < s + bytes {
            return Err(Error::InvalidArgument(
                "all_reduce source and destination overlap without being equal".into(),
            ));
        }
        if src.is_empty() {
            return Ok(());
        }
        let algo = match algo {
            AllReduceAlgo::Auto => self.choose_all_reduce(T::DTYPE, bytes),
            a => a,
        };
        let n_pes = self.shmem.n_pes();
        let nvec = bytes / 16;
        let max_blocks = self.sm_count.min(MAX_BLOCKS);
        let (grid, limit, extra) = match algo {
            AllReduceAlgo::Sentinel | AllReduceAlgo::SentinelTwoShot => {
                if T::DTYPE == DataType::I32 {
                    return Err(Error::InvalidArgument(format!(
                        "the {algo:?} all-reduce takes f32, f16 or bf16 (any i32 value could \
                         pass for its sentinel); use Auto for i32"
                    )));
                }
                let limit = if algo == AllReduceAlgo::Sentinel {
                    self.sentinel_slot_bytes
                } else {
                    sentinel_twoshot_max_input(self.sentinel_slot_bytes, n_pes)
                };
                (
                    ll_grid(bytes.div_ceil(16), max_blocks),
                    limit,
                    Extra::Sentinel,
                )
            }
            AllReduceAlgo::LowLatency => (
                ll_grid(bytes.div_ceil(8), max_blocks),
                (self.slot_bytes - 16) / 2,
                Extra::Peers,
            ),
            AllReduceAlgo::LowLatencyTwoShot => (
                ll_grid(bytes.div_ceil(8).div_ceil(n_pes), max_blocks),
                ll_twoshot_max_input(self.slot_bytes, n_pes),
                Extra::Peers,
            ),
            AllReduceAlgo::OneShot => (
                (
                    blocks_for(nvec, ONESHOT_THREADS as usize, ONESHOT_MAX_BLOCKS),
                    ONESHOT_THREADS,
                ),
                self.slot_bytes,
                Extra::None,
            ),
            AllReduceAlgo::TwoShot => (
                (
                    blocks_for(nvec.div_ceil(n_pes), THREADS as usize * UNROLL, max_blocks),
                    THREADS,
                ),
                usize::MAX,
                Extra::None,
            ),
            _ => {
                let (blocks, plan) = bandwidth_plan(nvec, n_pes, self.bandwidth_max_blocks);
                ((blocks, BW_THREADS), usize::MAX, Extra::Plan(plan))
            }
        };
        if bytes > limit {
            return Err(Error::InvalidArgument(format!(
                "{algo:?} all-reduce of {bytes} bytes exceeds its staging space ({limit} bytes); \
                 use Bandwidth or raise CollectivesConfig thresholds"
            )));
        }
        let name = format!("{}_allreduce_{ty}_{opn}", algo.kernel_prefix());
        self.launch(
            &name,
            grid,
            extra,
            src.as_ptr() as u64,
            dst.as_ptr() as u64,
            src.len(),
            stream,
        )
    }

    /// `dst[pe * n .. (pe + 1) * n] = src on PE pe`, `n = src.len()`, for any element type.
    /// `dst.len()` must be `n * n_pes`; `src` and `dst` must not overlap.
    pub fn all_gather<'a, T: Element>(
        &self,
        src: impl Into<SymmetricView<'a, T>>,
        dst: impl Into<SymmetricView<'a, T>>,
        algo: AllGatherAlgo,
        stream: &CudaStream,
    ) -> Result<()> {
        let (src, dst) = (src.into(), dst.into());
        self.check_runtime(&src, "all_gather source")?;
        self.check_runtime(&dst, "all_gather destination")?;
        let n_pes = self.shmem.n_pes();
        crate::buffer::check_len(
            "all_gather destination (n_pes x source)",
            src.len() * n_pes,
            dst.len(),
        )?;
        let bytes = src.len() * std::mem::size_of::<T>();
        let (s, d) = (src.as_ptr() as usize, dst.as_ptr() as usize);
        if s < d + bytes * n_pes && d < s + bytes {
            return Err(Error::InvalidArgument(
                "all_gather source and destination overlap".into(),
            ));
        }
        if bytes == 0 {
            return Ok(());
        }
        let algo = match algo {
            AllGatherAlgo::Auto => self.choose_all_gather(bytes),
            a => a,
        };
        let nvec = bytes.div_ceil(16);
        let (name, grid, extra) = match algo {
            AllGatherAlgo::LowLatency => {
                let limit = (self.slot_bytes - 16) / 2;
                if bytes > limit {
                    return Err(Error::InvalidArgument(format!(
                        "low-latency all-gather of {bytes} bytes per PE exceeds its staging slot ({limit} bytes); use Bandwidth"
                    )));
                }
                let grid = ll_grid(bytes.div_ceil(8), self.sm_count);
                ("ll_allgather_bytes", grid, Extra::Peers)
            }
            AllGatherAlgo::OneShot => {
                if bytes > self.slot_bytes {
                    return Err(Error::InvalidArgument(format!(
                        "one-shot all-gather of {bytes} bytes per PE exceeds its staging slot ({} bytes); use Bandwidth",
                        self.slot_bytes
                    )));
                }
                (
                    "oneshot_allgather_bytes",
                    (
                        blocks_for(nvec, ONESHOT_THREADS as usize, ONESHOT_MAX_BLOCKS),
                        ONESHOT_THREADS,
                    ),
                    Extra::None,
                )
            }
            _ => (
                "bandwidth_allgather_bytes",
                (
                    blocks_for(
                        nvec,
                        THREADS as usize * UNROLL,
                        self.sm_count.min(MAX_BLOCKS),
                    ),
                    THREADS,
                ),
                Extra::None,
            ),
        };
        self.launch(
            name,
            grid,
            extra,
            src.as_ptr() as u64,
            dst.as_ptr() as u64,
            bytes,
            stream,
        )
    }

    /// Launch `name` with `grid = (blocks, threads per block)`: the common parameters, then
    /// the algorithm's `extra` one.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        name: &str,
        grid: (u32, u32),
        extra: Extra,
        src: u64,
        dst: u64,
        n: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let f = *self.functions.get(name).ok_or_else(|| {
            Error::Module(format!("kernel {name} missing from the collectives module"))
        })?;
        let mut ctrl = self.ctrl.as_ptr() as u64;
        let mut flags = self.flags.as_ptr() as u64;
        let (mut staging, mut slot, table) = match extra {
            Extra::Sentinel => (
                self.sentinel.as_ptr() as u64,
                self.sentinel_slot_bytes,
                self.sentinel_peers,
            ),
            _ => (self.staging.as_ptr() as u64, self.slot_bytes, self.peers),
        };
        let (mut src, mut dst, mut n) = (src, dst, n);
        let mut peers = match (extra, table) {
            (Extra::Peers | Extra::Sentinel, None) => {
                return Err(Error::InvalidArgument(format!(
                    "the low-latency algorithms support up to {LL_MAX_PES} PEs"
                )))
            }
            (_, Some(p)) => p,
            (_, None) => Peers {
                slot: [0; LL_MAX_PES],
                me: 0,
                npes: 0,
            },
        };
        let mut plan = match extra {
            Extra::Plan(p) => p,
            _ => BandwidthPlan {
                chunk_vecs: 0,
                slots: 0,
            },
        };
        let mut params: [*mut c_void; 8] = [
            &mut src as *mut u64 as *mut c_void,
            &mut dst as *mut u64 as *mut c_void,
            &mut n as *mut usize as *mut c_void,
            &mut ctrl as *mut u64 as *mut c_void,
            &mut flags as *mut u64 as *mut c_void,
            &mut staging as *mut u64 as *mut c_void,
            &mut slot as *mut usize as *mut c_void,
            match extra {
                Extra::Plan(_) => std::ptr::addr_of_mut!(plan) as *mut c_void,
                _ => std::ptr::addr_of_mut!(peers) as *mut c_void,
            },
        ];
        self.shmem.enter()?;
        // Blocks of a call wait on each other's peers: they must all be resident. At most
        // one block per SM is asked for (a 512-thread block always fits), except by the
        // bandwidth all-reduce, whose limit comes from the occupancy the driver reports.
        debug_assert!(grid.0 as usize <= MAX_BLOCKS);
        // SAFETY: all zeroes is a valid attribute (integers and a union of plain data); the
        // union member written is the one the attribute id selects.
        let mut attr: cusys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = cusys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let launch = cusys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: grid.1,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.config.programmatic_launch),
        };
        // SAFETY: `params` points at locals of the kernel's parameter types and lives until
        // the call returns (the driver copies them); the driver reads as many as the kernel
        // declares (7, or 8 with an extra parameter).
        unsafe { cusys::cuLaunchKernelEx(&launch, f, params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| Error::Module(format!("launch of {name} failed: {e:?}")))
    }
}

/// The parameter after the common ones, by algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extra {
    None,
    /// The low-latency kernels' staging table.
    Peers,
    /// The sentinel all-reduce's receive buffers and their table.
    Sentinel,
    /// The bandwidth all-reduce's chunking.
    Plan(BandwidthPlan),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_thresholds_are_ordered_and_fit_the_staging_slot() {
        for n in [1, 2, 4, 8] {
            let c = CollectivesConfig::for_pes(n);
            assert!(c.sentinel_min_bytes <= c.sentinel_max_bytes);
            assert!(c.sentinel_min_bytes <= c.ll_max_bytes);
            assert!(c.sentinel_max_bytes <= c.sentinel_twoshot_max_bytes);
            let sentinel_slot = c.sentinel_slot_bytes(n);
            assert!(sentinel_slot >= c.sentinel_max_bytes);
            assert!(sentinel_twoshot_max_input(sentinel_slot, n) >= c.sentinel_twoshot_max_bytes);
            assert!(c.ll_max_bytes <= c.ll_twoshot_max_bytes);
            assert!(c.ll_twoshot_max_bytes <= c.oneshot_max_bytes);
            assert!(c.oneshot_max_bytes <= c.twoshot_max_bytes);
            assert!(c.allgather_ll_max_bytes <= c.allgather_oneshot_max_bytes);
            // A slot holds a one-shot input, a low-latency input twice over, the chunk ring.
            let slot = c.slot_bytes(n);
            assert!(slot >= c.oneshot_max_bytes && slot >= 2 * c.ll_max_bytes);
            assert!(slot >= BW_STAGING_BYTES);
            assert!(ll_twoshot_max_input(slot, n) >= c.ll_twoshot_max_bytes);
            assert_eq!(slot % 256, 0);
        }
    }

    #[test]
    fn low_latency_two_shot_limit_matches_its_staging() {
        for n in 1..=16 {
            for bytes in [1, 7, 8, 9, 4096, 4097, 100_001, 1 << 20, 3 << 20] {
                let need = ll_twoshot_slot_bytes(bytes, n);
                let slot = need.div_ceil(256) * 256;
                // Fits exactly when its parts fit half the slot.
                assert!(bytes <= ll_twoshot_max_input(slot, n), "{bytes} {n}");
                let part_lines = bytes.div_ceil(8).div_ceil(n);
                assert!(part_lines * 16 <= slot / 2, "{bytes} {n}");
                // One line of a part more does not fit.
                let over = ll_twoshot_max_input(slot, n) + 1;
                assert!(over.div_ceil(8).div_ceil(n) * 16 > slot / 2, "{bytes} {n}");
            }
        }
    }

    #[test]
    fn sentinel_two_shot_limit_matches_its_buffers() {
        for n in 1..=16 {
            for bytes in [1, 15, 16, 17, 4096, 4097, 100_001, 1 << 20, 3 << 20] {
                let slot = sentinel_twoshot_slot_bytes(bytes, n).div_ceil(256) * 256;
                assert!(bytes <= sentinel_twoshot_max_input(slot, n), "{bytes} {n}");
                assert!(
                    bytes.div_ceil(16).div_ceil(n) * 16 <= slot / 2,
                    "{bytes} {n}"
                );
                let over = sentinel_twoshot_max_input(slot, n) + 1;
                assert!(over.div_ceil(16).div_ceil(n) * 16 > slot / 2, "{bytes} {n}");
            }
        }
    }

    #[test]
    fn bandwidth_rings_fit_the_staging_slot() {
        for n_pes in [1, 2, 4, 8] {
            for nvec in [0, 1, 255, 4096, 1 << 20, 1 << 24] {
                for max_blocks in [1, 64, 132, 256] {
                    let (blocks, plan) = bandwidth_plan(nvec, n_pes, max_blocks);
                    let blocks = blocks as usize;
                    assert!(blocks >= 1 && blocks <= max_blocks.min(MAX_BLOCKS));
                    assert!(plan.slots >= 1 && plan.chunk_vecs >= 1);
                    let ring = plan.slots as usize * blocks * plan.chunk_vecs as usize * 16;
                    assert!(ring <= BW_STAGING_BYTES, "{nvec} {n_pes} {max_blocks}");
                }
            }
        }
        // Small parts use few blocks, large ones all of them.
        assert_eq!(bandwidth_plan(4096, 4, 132).0, 4);
        let (blocks, plan) = bandwidth_plan(1 << 24, 4, 264);
        assert_eq!((blocks, plan.chunk_vecs, plan.slots), (264, 496, 3));
    }

    #[test]
    fn low_latency_grids_give_each_line_a_thread_while_they_can() {
        for max_blocks in [1, 66, 132, 512] {
            for lines in [1, 31, 128, 4096, 16_896, 16_897, 40_000, 67_584, 1 << 20] {
                let (blocks, threads) = ll_grid(lines, max_blocks);
                let (blocks, threads) = (blocks as usize, threads as usize);
                assert!(blocks >= 1 && blocks <= max_blocks, "{lines} {max_blocks}");
                assert!((LL_THREADS as usize..=LL_MAX_THREADS).contains(&threads));
                assert_eq!(threads % 32, 0);
                if lines <= max_blocks * LL_MAX_THREADS {
                    assert!(blocks * threads >= lines, "{lines} {max_blocks}");
                } else {
                    assert_eq!((blocks, threads), (max_blocks, LL_MAX_THREADS));
                }
            }
        }
        // Small inputs keep 128-thread blocks.
        assert_eq!(ll_grid(16_384, 132), (128, 128));
        assert_eq!(ll_grid(32_768, 132), (128, 256));
    }

    #[test]
    fn grids_stay_within_limits() {
        assert_eq!(blocks_for(0, 512, 64), 1);
        assert_eq!(blocks_for(513, 512, 64), 2);
        assert_eq!(blocks_for(1 << 30, 512, 132), 132);
    }

    #[test]
    fn kernel_names_cover_types_ops_and_algorithms() {
        let names = kernel_names();
        assert_eq!(names.len(), 5 * 4 * 3 + 2 * 3 * 3 + 3);
        assert!(names.contains(&"sentinel_twoshot_allreduce_f16_min".to_string()));
        assert!(names.contains(&"sentinel_allreduce_bf16_sum".to_string()));
        assert!(!names
            .iter()
            .any(|n| n.starts_with("sentinel_allreduce_i32")));
        assert!(names.contains(&"ll_twoshot_allreduce_f16_max".to_string()));
        assert!(names.contains(&"oneshot_allreduce_bf16_sum".to_string()));
        assert!(names.contains(&"bandwidth_allreduce_i32_min".to_string()));
    }

    #[test]
    fn unsupported_types_and_ops_are_named() {
        assert_eq!(type_name(DataType::U64), None);
        assert_eq!(op_name(ReduceOp::Xor), None);
        assert_eq!(type_name(DataType::BF16), Some("bf16"));
    }
}
