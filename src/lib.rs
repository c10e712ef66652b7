//! Safe Rust for NVIDIA NVSHMEM: a partitioned global address space across GPUs, with
//! one-sided put/get, signals, atomics and collectives from the host, from CUDA streams, and
//! from inside kernels.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! // Launch with: nvshmemrun -np 4 target/release/examples/hello
//! let shmem = nvshmem::Nvshmem::init()?;
//! let buf = shmem.calloc::<f32>(1024)?;        // collective: every PE allocates
//! let next = (shmem.my_pe() + 1) % shmem.n_pes();
//! buf.copy_from_host(&vec![shmem.my_pe() as f32; 1024])?;
//! println!("{}", shmem.info()?);
//! # let _ = next;
//! # Ok(()) }
//! ```
//!
//! Layers (see ARCHITECTURE.md): [`nvshmem_sys`] is the raw FFI; this crate adds the
//! runtime handle ([`Nvshmem`]), typed symmetric memory ([`memory`]), one-sided operations
//! ([`rma`], [`signal`], [`atomic`], [`sync`]), [`team`]s with NVSHMEM's own collectives,
//! kernel modules with the one launch path ([`module`]), our device collectives
//! ([`collectives`]), whose kernels are in [`cubins`], tensor-parallel layers on them
//! (`tp`, with the `tp` feature), and structures in symmetric memory: [`channel`]s between
//! PEs (pipeline hand-off) and the [`pool`] of pages handed out on any PE (KV-cache blocks)
//! with gathers and scatters, and the [`pipeline`] schedule that stages handing micro-batches
//! through channels follow. Every operation takes its destination first, as NVSHMEM does.
//!
//! # Features
//! | feature | what it adds |
//! |---|---|
//! | (none, the default) | everything above but the tensor-parallel layers |
//! | `tp` | `nvshmem::tp`: tensor-parallel linear layers and MLPs, their cuBLASLt and decode GEMMs, and their kernels |
//!
//! # Threads
//! Every type is `Send + Sync` and may be used from any thread. NVSHMEM's host library runs
//! at `NVSHMEM_THREAD_SERIALIZED`, so the crate serialises its own calls into it: each is
//! made holding one process-wide lock, and a blocking call (a blocking get) holds it until
//! it returns. Waits for the GPU (host copies of symmetric memory, frees), for flags
//! ([`Nvshmem::wait_until`]) and for the other PEs (a barrier or sync of any team, a free, a
//! checked call, a constructor's end, a team's drop) hold no lock, so another thread's call that ends them, or that
//! a peer waits for, goes on. A symmetric allocation holds it until the PEs agree, so that
//! no other thread takes the GPU memory its heap check found free. Kernel launches,
//! including our collectives, take no lock.
//!
//! Kernels that wait for other PEs share each GPU: run from several threads at once, each
//! must find room on it. Give a [`Collectives`] used beside channels a
//! [`CollectivesConfig::max_blocks`] (`checks/src/bin/stress_check/`, collective and channel
//! threads on 2 GPUs: passes with 32 or 16 blocks, times out without). Host copies of this
//! crate go through pinned buffers, so that none waits for a kernel inside the driver: stack
//! dumps of a hung stress check showed other threads' calls stopped there beside such a copy.
//!
//! Some driver calls wait for the whole GPU and hold back the other threads' CUDA calls
//! meanwhile: loading and unloading a module, `cuMemFree`, `cuMemFreeHost`, NVSHMEM's
//! zeroing `calloc` and `nvshmem_signal_fetch`; making an event or a stream waits beside
//! them. Beside a kernel that waits for another PE, whose matching work a held-back thread was
//! to launch, both PEs stall until a bound runs out. So while the runtime lives the crate
//! avoids them:
//! - the runtime loads its services' modules (host atomics, channels) when it starts;
//! - a module, once loaded, stays until the runtime ends;
//! - device buffers go back to the device's memory pool in stream order;
//! - pinned records are recycled;
//! - cross-stream joins use one event per thread, and host-side waits (and `calloc`'s
//!   zeroing) take their streams from a pool: both are made once;
//! - [`Nvshmem::signal_fetch`] reads through a pinned word.
//!
//! The first [`Collectives`], [`PagePool`], tensor-parallel group or
//! [`Module`](module::Module) of a runtime loads its module: make them before starting work
//! that waits for other PEs from other threads. `checks/src/bin/stress_check/` runs every
//! kind of call from 9 threads per PE, checked; 60 short runs in a row (40 of 5 s on 2
//! H200s, 20 of 4 s on 4) and 9 minutes on 4 passed.
//!
//! # Lifetimes on the GPU
//! Freeing a symmetric or device buffer, destroying a team, dropping a [`Collectives`], and
//! finalising wait for all work on this PE's GPU (every stream) first, so no kernel still
//! running writes into memory that is reused. Where that wait fails (another thread
//! capturing a stream into a graph, a sticky error), a free is refused on every PE
//! ([`Error::FreeRefused`]) and a team is left in place. Modules are unloaded only when the
//! runtime ends. A CUDA graph holds raw addresses: it must not be launched after the
//! buffers, teams or `Collectives` it was captured with are gone.

#![warn(missing_docs)]

mod abi;
pub mod atomic;
pub mod channel;
pub mod collectives;
pub mod cubins;
mod diag;
pub mod element;
pub mod error;
pub mod grad_sync;
pub mod map;
pub mod memory;
pub mod module;
mod order;
pub mod pipeline;
pub mod pool;
pub mod rma;
pub mod runtime;
pub mod signal;
mod start;
pub mod sync;
pub mod team;
#[cfg(feature = "tp")]
pub mod tp;

pub use channel::{Channel, ChannelConfig};
pub use collectives::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Collectives, CollectivesConfig,
    Compression, Reach, ReduceAlgo, ReduceScatterAlgo, Thresholds, Workspace, GROUP_MAX,
};
pub use cudarc;
pub use cudarc::driver::{CudaStream, LaunchConfig};
pub use element::{AtomicElement, AtomicInteger, DataType, Element, ReduceOp};
pub use error::{ChannelWait, Error, HeapLimit, Result};
pub use grad_sync::{GradSyncConfig, GradientSync};
pub use half::{bf16, f16};
pub use map::{MapConfig, MapStatus, SymmetricMap};
pub use memory::{DeviceBuffer, DeviceMemory, SymmetricBuffer, SymmetricView};
pub use nvshmem_sys as sys;
pub use pool::{PageId, PagePool, PagePoolConfig};
pub use runtime::heap::HeapUsage;
pub use runtime::{InitOptions, Nvshmem, RuntimeInfo, UniqueId};
pub use signal::{Cmp, SignalOp};
pub use team::Team;

/// The Rust snippets of the README and the guide (docs/), compiled as doc tests so that they
/// keep up with the API; with the `tp` feature, which the README's uses
/// (`cargo test --workspace` has it).
#[cfg(all(doctest, feature = "tp"))]
mod doc_snippets {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/memory.md")]
    struct Memory;
    #[doc = include_str!("../docs/signals.md")]
    struct Signals;
    #[doc = include_str!("../docs/collectives.md")]
    struct Collectives;
    #[doc = include_str!("../docs/channels.md")]
    struct Channels;
    #[doc = include_str!("../docs/page-pool.md")]
    struct PagePool;
    #[doc = include_str!("../docs/map.md")]
    struct Map;
    #[doc = include_str!("../docs/launching.md")]
    struct Launching;
    #[doc = include_str!("../docs/errors.md")]
    struct Errors;
    #[doc = include_str!("../docs/tensor-parallel.md")]
    struct TensorParallel;
    #[doc = include_str!("../docs/data-parallel.md")]
    struct DataParallel;
}
