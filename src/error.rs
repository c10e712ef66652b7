//! The one error type of the crate.
//!
//! Frequent failures are variants with fields, so a caller can match on them
//! (`Err(Error::PeOutOfRange { pe, .. })`); driver failures keep the driver's error as their
//! [`source`](std::error::Error::source).

#[cfg(feature = "tp")]
use cudarc::cublaslt::result::CublasError;
use cudarc::driver::DriverError;
use std::fmt;

/// What bounds a PE's symmetric heap (see [`Error::HeapExhausted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapLimit {
    /// A fixed heap (`NVSHMEM_DISABLE_CUDA_VMM=1`) of `NVSHMEM_SYMMETRIC_SIZE` bytes.
    SymmetricSize(usize),
    /// A growing heap (the default) may reserve at most `NVSHMEM_MAX_MEMORY_PER_GPU` bytes.
    MaxMemoryPerGpu(usize),
    /// A growing heap maps new memory in steps of `NVSHMEM_CUMEM_GRANULARITY`; the GPU had
    /// this many bytes free, less than the step (and a margin for CUDA) needs.
    GpuMemory(usize),
}

impl fmt::Display for HeapLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeapLimit::SymmetricSize(size) => write!(
                f,
                "its fixed heap of {size} bytes; raise NVSHMEM_SYMMETRIC_SIZE (for example \
                 NVSHMEM_SYMMETRIC_SIZE=4G) on every PE"
            ),
            HeapLimit::MaxMemoryPerGpu(max) => {
                write!(f, "NVSHMEM_MAX_MEMORY_PER_GPU={max}; raise it on every PE")
            }
            HeapLimit::GpuMemory(free) => write!(
                f,
                "the GPU's free memory ({free} bytes); free device memory held outside the \
                 symmetric heap, or allocate less"
            ),
        }
    }
}

/// What a channel's wait that gave up waited for (see [`Error::ChannelTimeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelWait {
    /// A send (a push), for a free slot: for the consumer to receive an earlier message.
    Slot,
    /// A receive (a pop), for the message.
    Message,
}

/// Everything that can go wrong in this crate.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An NVSHMEM call returned a non-zero status.
    Nvshmem {
        /// The NVSHMEM function.
        call: &'static str,
        /// Its status.
        status: i32,
    },
    /// A CUDA driver call failed.
    Cuda {
        /// The driver function.
        call: &'static str,
        /// The driver's error.
        source: DriverError,
    },
    /// No CUDA driver could be loaded, or no GPU is visible; says what to install or set.
    NoGpu(String),
    /// More PEs on a node than GPUs, without the CUDA MPS set-up under which NVSHMEM runs
    /// several PEs on one GPU in full (otherwise it aborts its on-stream collectives).
    SharedGpu {
        /// The PEs on this node.
        pes: usize,
        /// The GPUs they share.
        gpus: usize,
        /// The PEs of the busiest GPU.
        per_gpu: usize,
    },
    /// Some PE is reachable by no transport: neither load/store (NVLink, PCIe peer access,
    /// or `NVSHMEM_DISABLE_P2P` set) nor a network transport (`NVSHMEM_REMOTE_TRANSPORT`).
    /// Found before NVSHMEM's GPU-side start, which would exit the process; the text says
    /// which PEs and which variables.
    NoTransport(String),
    /// NVSHMEM is already running in this process (one runtime per process).
    AlreadyInitialized,
    /// NVSHMEM was finalised and cannot be started again in the same process.
    Finalized,
    /// NVSHMEM did not finish initialising its GPU side (`nvshmemx_init_status`).
    NotInitialized {
        /// The status NVSHMEM reported.
        status: i32,
    },
    /// The host library at run time is not the release the crate was built against.
    LibraryMismatch {
        /// The release of the headers and device library the crate was built with.
        built: String,
        /// The release of the host library loaded now.
        running: String,
    },
    /// A symmetric allocation that some PE's heap cannot take. Checked on every PE before
    /// NVSHMEM is asked (a heap that fails to grow takes the whole job down), and agreed:
    /// every PE returns this error, and the heap stays usable.
    HeapExhausted {
        /// Bytes asked for.
        requested: usize,
        /// Bytes this crate had allocated on the refusing PE.
        in_use: usize,
        /// The PE whose heap refused (the lowest, if several did).
        pe: usize,
        /// The limit it ran into, and so the variable to raise.
        limit: HeapLimit,
    },
    /// A wait of our collectives for a peer lasted longer than
    /// [`CollectivesConfig::timeout`](crate::CollectivesConfig::timeout): the peer skipped
    /// the call, failed before it, passed other arguments, or died. The `Collectives` can no
    /// longer be used: every later call returns this error.
    Timeout {
        /// The PE that waited.
        pe: usize,
        /// The PE it waited for.
        waited_for: usize,
        /// What it waited for.
        site: &'static str,
        /// The block of the call that gave up first.
        block: usize,
        /// The epoch (the call's number on this PE, from 1) of the call.
        epoch: u64,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// A wait of a [`Channel`](crate::channel::Channel)'s kernel (or of a kernel of yours,
    /// through its handle) for the other end lasted longer than the channel's bound
    /// ([`ChannelConfig::timeout`](crate::channel::ChannelConfig::timeout)): the other PE
    /// never sent (or never received), failed before it, or died. The wait took nothing and
    /// changed nothing, and every later call on the channel on this PE returns this error.
    ChannelTimeout {
        /// The PE that waited.
        pe: usize,
        /// The PE it waited for: the consumer for a slot, the producer for a message.
        waited_for: usize,
        /// What it waited for.
        site: ChannelWait,
        /// The message's number on the channel, from 0.
        message: u64,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// A fused exchange of a tensor-parallel layer (`tp::Schedule::Fused`,
    /// or `Auto` where it fuses) waited longer than `NVSHMEM_RS_TIMEOUT` for its peers: a peer
    /// never made the same call, failed in it, or died. The outputs of that call and of the
    /// layer's calls queued after it are wrong, and every later call of the layer on this PE
    /// returns this error: drop it and make a new one on every PE.
    ExchangeTimeout {
        /// The PE that waited.
        pe: usize,
        /// The PEs whose chunks (or sums) had not come.
        waited_for: Vec<usize>,
        /// The call's number among the layer's watched calls on this PE, from 1.
        call: u64,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// A PE number outside `0..n_pes` (of the world, or of a team).
    PeOutOfRange {
        /// The PE asked for.
        pe: usize,
        /// The number of PEs.
        n_pes: usize,
    },
    /// An element index outside a view.
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The view's length.
        len: usize,
    },
    /// A length that does not fit what the call needs.
    Length {
        /// What had the wrong length, and what it must be.
        what: &'static str,
        /// The length needed.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// An element type (or operator) the operation does not take.
    TypeMismatch {
        /// The operation.
        what: String,
        /// What it takes.
        expected: &'static str,
        /// The type (or operator) given.
        got: String,
    },
    /// A view that must start on an `align`-byte boundary does not.
    Misaligned {
        /// The argument.
        what: &'static str,
        /// The alignment in bytes.
        align: usize,
    },
    /// Source and destination overlap where they must not.
    Overlap {
        /// The operation.
        what: &'static str,
    },
    /// A buffer, view or team of another NVSHMEM runtime.
    ForeignRuntime {
        /// The argument.
        what: &'static str,
    },
    /// A stream of another GPU than this PE's.
    WrongDevice {
        /// The argument.
        what: &'static str,
        /// The GPU it runs on.
        device: usize,
        /// This PE's GPU.
        expected: usize,
    },
    /// One end of a point-to-point structure used from a PE that is not that end (a
    /// channel's send on a PE other than its producer).
    WrongPe {
        /// The call, and which end it belongs to.
        what: &'static str,
        /// This PE.
        pe: usize,
        /// The PE that end belongs to.
        expected: usize,
    },
    /// PEs disagreed on a collective call (allocation order and sizes, a collectives
    /// configuration).
    CollectiveMismatch(String),
    /// A host-side wait for a flag ([`Nvshmem::wait_until`](crate::Nvshmem::wait_until),
    /// [`Nvshmem::signal_wait_until`](crate::Nvshmem::signal_wait_until)) lasted longer than
    /// the runtime's wait limit (`NVSHMEM_RS_TIMEOUT`): no PE set the flag. The wait left
    /// nothing behind; the runtime stays usable.
    WaitTimeout {
        /// The PE that waited.
        pe: usize,
        /// What it waited on.
        what: &'static str,
        /// The element of the buffer.
        index: usize,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// A symmetric free that a PE could not make safely: its wait for its GPU failed (a
    /// stream of its context was being captured into a CUDA graph, or the context holds a
    /// sticky error), so a kernel might still use the buffer. Agreed: every PE returns this
    /// error and none frees; the buffer is leaked on every PE and the heap stays consistent.
    FreeRefused {
        /// The PE whose wait failed (the lowest, if several did).
        pe: usize,
        /// The allocation's number (its place in the PEs' common order of allocations).
        seq: u64,
        /// Its size in bytes.
        bytes: usize,
        /// The CUDA driver's error code on that PE (`CUresult`; 0 for another failure).
        driver_error: u32,
    },
    /// An earlier host-side wait for the other PEs gave up (this text says which): the work
    /// it queued on this PE can never finish, so no collective call can follow, and nothing
    /// more is freed (the process's exit takes the memory back). End the process.
    Stranded(String),
    /// A kernel module could not be loaded, registered or looked into.
    Module {
        /// The module (a cubin set's name or a file).
        module: String,
        /// What went wrong and what to do.
        message: String,
        /// The driver's error, where the driver refused.
        source: Option<DriverError>,
    },
    /// The driver refused a kernel launch.
    Launch {
        /// The kernel.
        kernel: String,
        /// The driver's error.
        source: DriverError,
    },
    /// cuBLASLt could not be loaded, or refused a call (the `tp` feature).
    #[cfg(feature = "tp")]
    Cublas {
        /// The cuBLASLt function, or `"load"` when the library was not found.
        call: &'static str,
        /// What to do, where there is something to say.
        message: String,
        /// cuBLASLt's status, when it returned one.
        source: Option<CublasError>,
    },
    /// An argument is invalid for another reason; the message says which and why.
    InvalidArgument(String),
    /// A [`PagePool`](crate::pool::PagePool) PE had fewer free pages than asked for; the call
    /// took none.
    PoolExhausted {
        /// The PE whose pages were asked for.
        pe: usize,
        /// Pages asked for.
        requested: usize,
        /// Pages that were free when the call looked (it gave back those it had taken).
        available: usize,
        /// Pages each PE holds.
        pages_per_pe: usize,
        /// Bytes of a page.
        page_bytes: usize,
    },
    /// A page index outside a [`PagePool`](crate::pool::PagePool)'s pages of a PE.
    PageOutOfRange {
        /// The PE of the page id.
        pe: usize,
        /// The page index asked for.
        index: usize,
        /// Pages each PE holds (valid indices are below it).
        pages_per_pe: usize,
    },
    /// A page that is not allocated in the id's generation (never allocated, freed already, or
    /// freed and allocated again since the id was handed out) where the call needs an
    /// allocated one.
    PageNotAllocated {
        /// The PE of the page.
        pe: usize,
        /// The page's index on that PE.
        index: usize,
        /// The id's generation (see [`PageId`](crate::pool::PageId)).
        generation: u32,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Nvshmem { call, status } => write!(
                f,
                "{call} failed with NVSHMEM status {status}; run with NVSHMEM_DEBUG=WARN (or INFO) \
                 for NVSHMEM's own explanation"
            ),
            Error::Cuda { call, source } => write!(f, "{call} failed: {source:?}"),
            Error::NoGpu(why) => write!(f, "no usable GPU: {why}"),
            Error::NoTransport(why) => write!(f, "no transport to every PE: {why}"),
            Error::SharedGpu { pes, gpus, per_gpu } => write!(
                f,
                "{pes} PEs on this node share {gpus} GPU(s), up to {per_gpu} on one: NVSHMEM runs \
                 that only under CUDA MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at most {} \
                 (scripts/nvshmrun --share-gpus starts MPS and sets it), or start one PE per GPU",
                100 / per_gpu
            ),
            Error::AlreadyInitialized => f.write_str(
                "NVSHMEM is already initialised in this process; clone the existing Nvshmem \
                 handle instead of initialising again",
            ),
            Error::Finalized => f.write_str(
                "NVSHMEM was finalised in this process and cannot be initialised again; keep one \
                 Nvshmem handle alive for the life of the program",
            ),
            Error::NotInitialized { status } => write!(
                f,
                "NVSHMEM did not initialise its GPU side (nvshmemx_init_status {status}); run with \
                 NVSHMEM_DEBUG=WARN for NVSHMEM's own explanation"
            ),
            Error::LibraryMismatch { built, running } => write!(
                f,
                "NVSHMEM host library mismatch: built against {built}, running {running}; make \
                 LD_LIBRARY_PATH point at NVSHMEM {built} (or rebuild against the running one \
                 with NVSHMEM_HOME)"
            ),
            Error::HeapExhausted {
                requested,
                in_use,
                pe,
                limit,
            } => write!(
                f,
                "symmetric heap exhausted: {requested} bytes asked for, and PE {pe} (with \
                 {in_use} bytes in use) is bounded by {limit}"
            ),
            Error::WaitTimeout {
                pe,
                what,
                index,
                waited,
            } => write!(
                f,
                "PE {pe} waited {waited:.1?} for {what} (element {index}) and gave up: no PE \
                 set it (a PE skipped its put or signal, failed or died; look at its output). \
                 If the wait was legitimate, raise NVSHMEM_RS_TIMEOUT (seconds, 0 for no limit)"
            ),
            Error::FreeRefused {
                pe,
                seq,
                bytes,
                driver_error,
            } => write!(
                f,
                "the free of symmetric allocation #{seq} ({bytes} bytes) was refused on every PE: \
                 PE {pe} could not wait for its GPU (CUDA error {driver_error}; look at its \
                 output), so a kernel may still use the buffer. It stays allocated on every PE. \
                 Free symmetric memory while no stream of the context is being captured into a \
                 CUDA graph"
            ),
            Error::Timeout {
                pe,
                waited_for,
                site,
                block,
                epoch,
                waited,
            } => write!(
                f,
                "PE {pe}'s collective call #{epoch} (block {block}) waited {waited:.1?} for {site} \
                 from PE {waited_for} and gave up: PE {waited_for} skipped the call, failed before \
                 it, passed other arguments or died (look at its output). Drop this Collectives \
                 and make a new one on every PE; if the wait was legitimate, raise \
                 CollectivesConfig::timeout or NVSHMEM_RS_TIMEOUT"
            ),
            Error::ChannelTimeout {
                pe,
                waited_for,
                site,
                message,
                waited,
            } => {
                let (call, what, why) = match site {
                    ChannelWait::Slot => (
                        "send",
                        "a free slot",
                        "stopped receiving, failed or died",
                    ),
                    ChannelWait::Message => (
                        "receive",
                        "the message",
                        "never sent it, failed before it or died",
                    ),
                };
                write!(
                    f,
                    "PE {pe}'s channel {call} of message #{message} waited {waited:.1?} for \
                     {what} from PE {waited_for} and gave up: PE {waited_for} {why} (look at \
                     its output). The channel can no longer be used on PE {pe}; if the wait was \
                     legitimate, raise ChannelConfig::timeout or NVSHMEM_RS_TIMEOUT"
                )
            }
            Error::ExchangeTimeout {
                pe,
                waited_for,
                call,
                waited,
            } => {
                let pes: Vec<String> = waited_for.iter().map(|p| p.to_string()).collect();
                let (them, verb) = match pes.len() {
                    1 => (format!("PE {}", pes[0]), "it"),
                    _ => (format!("PEs {}", pes.join(", ")), "they"),
                };
                write!(
                    f,
                    "PE {pe}'s tensor-parallel fused exchange (the layer's call #{call}) waited \
                     {waited:.1?} for {them} and gave up: {verb} never made the same call, \
                     failed in it or died (look at the output). The outputs of that call and \
                     the calls queued after it are wrong. Drop the layer and make a new one on \
                     every PE; if the wait was legitimate, raise NVSHMEM_RS_TIMEOUT"
                )
            }
            Error::PeOutOfRange { pe, n_pes } => write!(
                f,
                "PE {pe} is out of range: there are {n_pes} PEs (0..{n_pes})"
            ),
            Error::IndexOutOfRange { index, len } => {
                write!(f, "index {index} is outside the view of {len} elements")
            }
            Error::Length {
                what,
                expected,
                got,
            } => write!(f, "{what}: expected {expected} elements, got {got}"),
            Error::TypeMismatch {
                what,
                expected,
                got,
            } => write!(f, "{what} takes {expected}, not {got}"),
            Error::Misaligned { what, align } => write!(
                f,
                "{what} must start on a {align}-byte boundary (take views at element offsets \
                 that keep it)"
            ),
            Error::Overlap { what } => write!(
                f,
                "{what}: source and destination overlap; they may be the same view where the \
                 operation works in place, and must not overlap otherwise"
            ),
            Error::ForeignRuntime { what } => {
                write!(f, "{what} belongs to another NVSHMEM runtime")
            }
            Error::WrongDevice {
                what,
                device,
                expected,
            } => write!(
                f,
                "{what} runs on GPU {device}, but this PE's NVSHMEM runs on GPU {expected}"
            ),
            Error::WrongPe { what, pe, expected } => write!(
                f,
                "{what} belongs to PE {expected}, and this is PE {pe}: call it only where \
                 my_pe() is {expected}"
            ),
            Error::CollectiveMismatch(msg) => write!(f, "PEs disagree on a collective call: {msg}"),
            Error::Stranded(why) => write!(
                f,
                "{why}; work queued on this PE can never finish, so this process can make no \
                 more collective calls and frees nothing more: end it"
            ),
            Error::Module {
                module,
                message,
                source,
            } => {
                write!(f, "kernel module {module}: {message}")?;
                match source {
                    Some(e) => write!(f, " ({e:?})"),
                    None => Ok(()),
                }
            }
            Error::Launch { kernel, source } => {
                write!(f, "the launch of kernel {kernel} failed: {source:?}")
            }
            #[cfg(feature = "tp")]
            Error::Cublas {
                call,
                message,
                source,
            } => {
                write!(f, "cuBLASLt {call} failed")?;
                if let Some(e) = source {
                    write!(f, " ({e})")?;
                }
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            Error::InvalidArgument(msg) => f.write_str(msg),
            Error::PoolExhausted {
                pe,
                requested,
                available,
                pages_per_pe,
                page_bytes,
            } => write!(
                f,
                "page pool exhausted: {requested} pages asked for on PE {pe}, which had {available} \
                 free of its {pages_per_pe} pages of {page_bytes} bytes; free pages \
                 (PagePool::free), allocate on another PE, or build the pool with more pages_per_pe"
            ),
            Error::PageOutOfRange {
                pe,
                index,
                pages_per_pe,
            } => write!(
                f,
                "page {index} of PE {pe} is out of range: each PE holds {pages_per_pe} pages \
                 (0..{pages_per_pe}); use ids that PagePool::alloc returned"
            ),
            Error::PageNotAllocated {
                pe,
                index,
                generation,
            } => write!(
                f,
                "page {index} of PE {pe} (generation {generation}) is not allocated in that \
                 generation: never allocated, freed already, or freed and allocated again since \
                 (a stale id); use ids that PagePool::alloc returned, and free each once"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cuda { source, .. } | Error::Launch { source, .. } => Some(source),
            Error::Module {
                source: Some(source),
                ..
            } => Some(source),
            #[cfg(feature = "tp")]
            Error::Cublas {
                source: Some(source),
                ..
            } => Some(source),
            _ => None,
        }
    }
}

/// Map an NVSHMEM status (0 is success) to a `Result`.
pub(crate) fn check(call: &'static str, status: i32) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Nvshmem { call, status })
    }
}

/// cudarc's errors, so `?` works in code that mixes cudarc's calls and ours. The driver
/// does not say which call failed; our own calls name it.
impl From<DriverError> for Error {
    fn from(source: DriverError) -> Self {
        Error::Cuda {
            call: "a cudarc call",
            source,
        }
    }
}

/// Attach the name of the failed call to a CUDA driver error.
pub(crate) trait CudaResultExt<T> {
    fn during(self, call: &'static str) -> Result<T>;
}

impl<T> CudaResultExt<T> for std::result::Result<T, DriverError> {
    fn during(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Cuda { call, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;
    use std::error::Error as _;

    #[test]
    fn cudarc_errors_convert_with_question_mark() {
        fn cudarc_call() -> std::result::Result<(), DriverError> {
            Err(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY))
        }
        fn ours() -> Result<()> {
            cudarc_call()?;
            Ok(())
        }
        // (Printing a driver error asks the driver for its text: not here, with no GPU.)
        let e = ours().unwrap_err();
        assert!(matches!(
            e,
            Error::Cuda {
                call: "a cudarc call",
                source: DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
            }
        ));
    }

    #[test]
    fn statuses_map_to_errors_that_name_the_call() {
        assert!(check("nvshmem_x", 0).is_ok());
        let e = check("nvshmemx_cumodule_init", 7).unwrap_err();
        assert!(matches!(e, Error::Nvshmem { status: 7, .. }));
        let text = e.to_string();
        assert!(text.contains("nvshmemx_cumodule_init") && text.contains("NVSHMEM_DEBUG"));
    }

    #[test]
    fn heap_exhaustion_says_what_to_raise() {
        let exhausted = |limit| {
            Error::HeapExhausted {
                requested: 1 << 30,
                in_use: 3 << 28,
                pe: 1,
                limit,
            }
            .to_string()
        };
        let text = exhausted(HeapLimit::SymmetricSize(1 << 30));
        assert!(text.contains("1073741824 bytes asked for"), "{text}");
        assert!(
            text.contains("PE 1 (with 805306368 bytes in use)"),
            "{text}"
        );
        assert!(text.contains("raise NVSHMEM_SYMMETRIC_SIZE"), "{text}");
        let text = exhausted(HeapLimit::MaxMemoryPerGpu(1 << 37));
        assert!(
            text.contains("NVSHMEM_MAX_MEMORY_PER_GPU=137438953472; raise"),
            "{text}"
        );
        let text = exhausted(HeapLimit::GpuMemory(5 << 20));
        assert!(text.contains("free memory (5242880 bytes)"), "{text}");
    }

    #[test]
    fn pool_errors_give_the_sizes_and_what_to_do() {
        let text = Error::PoolExhausted {
            pe: 3,
            requested: 10,
            available: 4,
            pages_per_pe: 64,
            page_bytes: 16384,
        }
        .to_string();
        for part in [
            "10 pages",
            "PE 3",
            "4 free",
            "64 pages of 16384 bytes",
            "pages_per_pe",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        let text = Error::PageOutOfRange {
            pe: 1,
            index: 70,
            pages_per_pe: 64,
        }
        .to_string();
        assert!(
            text.contains("page 70 of PE 1") && text.contains("(0..64)"),
            "{text}"
        );
        let text = Error::PageNotAllocated {
            pe: 0,
            index: 5,
            generation: 2,
        }
        .to_string();
        assert!(
            text.contains("page 5 of PE 0 (generation 2)")
                && text.contains("stale")
                && text.contains("free each once"),
            "{text}"
        );
    }

    #[test]
    fn a_stranded_runtime_says_why_and_what_to_do() {
        let text =
            Error::Stranded("PE 0: the agreement on allocation #3 waited 4s".into()).to_string();
        assert!(
            text.starts_with("PE 0: the agreement on allocation #3"),
            "{text}"
        );
        assert!(
            text.contains("no more collective calls") && text.ends_with("end it"),
            "{text}"
        );
    }

    #[test]
    fn an_exchange_timeout_names_the_pes_waited_for_and_what_to_do() {
        let text = |waited_for: Vec<usize>| {
            Error::ExchangeTimeout {
                pe: 0,
                waited_for,
                call: 3,
                waited: std::time::Duration::from_millis(4100),
            }
            .to_string()
        };
        let one = text(vec![1]);
        assert!(
            one.starts_with("PE 0's tensor-parallel fused exchange (the layer's call #3)")
                && one.contains("waited 4.1s for PE 1 and gave up: it never made")
                && one.contains("Drop the layer")
                && one.contains("NVSHMEM_RS_TIMEOUT"),
            "{one}"
        );
        assert!(text(vec![1, 3]).contains("for PEs 1, 3 and gave up: they"));
    }

    #[test]
    fn timeouts_name_both_pes_the_call_and_what_to_do() {
        let text = Error::Timeout {
            pe: 0,
            waited_for: 3,
            site: "a low-latency line",
            block: 7,
            epoch: 42,
            waited: std::time::Duration::from_millis(2500),
        }
        .to_string();
        assert!(
            text.contains("PE 0's collective call #42 (block 7)"),
            "{text}"
        );
        assert!(
            text.contains("waited 2.5s for a low-latency line from PE 3"),
            "{text}"
        );
        assert!(text.contains("NVSHMEM_RS_TIMEOUT"), "{text}");
    }

    #[test]
    fn channel_timeouts_name_both_pes_the_message_and_what_to_do() {
        let text = Error::ChannelTimeout {
            pe: 1,
            waited_for: 0,
            site: ChannelWait::Message,
            message: 0,
            waited: std::time::Duration::from_millis(2000),
        }
        .to_string();
        assert!(
            text.starts_with(
                "PE 1's channel receive of message #0 waited 2.0s for the message from PE 0"
            ),
            "{text}"
        );
        assert!(text.contains("PE 0 never sent it"), "{text}");
        assert!(
            text.contains("ChannelConfig::timeout or NVSHMEM_RS_TIMEOUT"),
            "{text}"
        );
        let text = Error::ChannelTimeout {
            pe: 0,
            waited_for: 3,
            site: ChannelWait::Slot,
            message: 7,
            waited: std::time::Duration::from_millis(2500),
        }
        .to_string();
        assert!(
            text.starts_with(
                "PE 0's channel send of message #7 waited 2.5s for a free slot from PE 3"
            ),
            "{text}"
        );
        assert!(text.contains("PE 3 stopped receiving"), "{text}");
    }

    #[test]
    fn pe_errors_give_the_range() {
        let text = Error::PeOutOfRange { pe: 4, n_pes: 4 }.to_string();
        assert!(text.contains("0..4"), "{text}");
    }

    #[test]
    fn driver_failures_keep_the_driver_error_as_their_source() {
        let driver = || DriverError(CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
        let launch = Error::Launch {
            kernel: "k".into(),
            source: driver(),
        };
        let source = launch.source().expect("a source");
        let source = source
            .downcast_ref::<DriverError>()
            .expect("the driver's error");
        assert_eq!(source.0, CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
        // (Formatting a driver error asks the driver for its text: not here, without one.)
        assert!(matches!(&launch, Error::Launch { kernel, .. } if kernel == "k"));
        let module = Error::Module {
            module: "m".into(),
            message: "no kernel".into(),
            source: Some(driver()),
        };
        assert!(module.source().is_some());
        let cuda = Error::Cuda {
            call: "cuMemAlloc",
            source: driver(),
        };
        assert!(cuda.source().is_some());
    }
}
