//! The one error type of the crate.

use std::fmt;

/// Everything that can go wrong in this crate.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An NVSHMEM call returned a non-zero status.
    Nvshmem { call: &'static str, status: i32 },
    /// A CUDA driver call failed.
    Cuda {
        call: &'static str,
        source: cudarc::driver::DriverError,
    },
    /// No CUDA driver could be loaded, or no GPU is visible.
    NoGpu(String),
    /// NVSHMEM is already running in this process (one runtime per process).
    AlreadyInitialized,
    /// NVSHMEM was finalised and cannot be started again in the same process.
    Finalized,
    /// The host library at run time is not the release the crate was built against.
    LibraryMismatch { built: String, running: String },
    /// `nvshmem_malloc` returned NULL.
    HeapExhausted {
        requested: usize,
        in_use: usize,
        heap_size: usize,
    },
    /// A PE number outside `0..n_pes`.
    PeOutOfRange { pe: usize, n_pes: usize },
    /// A slice length or range that does not fit.
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// PEs disagreed on a collective call (debug builds check allocation order and sizes).
    CollectiveMismatch(String),
    /// An argument is invalid for another reason.
    InvalidArgument(String),
    /// A kernel module could not be loaded, registered or used.
    Module(String),
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
            Error::AlreadyInitialized => f.write_str(
                "NVSHMEM is already initialised in this process; clone the existing Nvshmem \
                 handle instead of initialising again",
            ),
            Error::Finalized => f.write_str(
                "NVSHMEM was finalised in this process and cannot be initialised again; keep one \
                 Nvshmem handle alive for the life of the program",
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
                heap_size,
            } => write!(
                f,
                "symmetric heap exhausted: asked for {requested} bytes with {in_use} bytes in use \
                 of a {heap_size}-byte heap (about {} bytes left); raise NVSHMEM_SYMMETRIC_SIZE \
                 (for example NVSHMEM_SYMMETRIC_SIZE=4G) on every PE",
                heap_size.saturating_sub(*in_use)
            ),
            Error::PeOutOfRange { pe, n_pes } => {
                write!(
                    f,
                    "PE {pe} is out of range: there are {n_pes} PEs (0..{n_pes})"
                )
            }
            Error::Length {
                what,
                expected,
                got,
            } => write!(f, "{what}: expected {expected} elements, got {got}"),
            Error::CollectiveMismatch(msg) => write!(f, "PEs disagree on a collective call: {msg}"),
            Error::InvalidArgument(msg) => f.write_str(msg),
            Error::Module(msg) => write!(f, "kernel module: {msg}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cuda { source, .. } => Some(source),
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

/// Attach the name of the failed call to a CUDA driver error.
pub(crate) trait CudaResultExt<T> {
    fn during(self, call: &'static str) -> Result<T>;
}

impl<T> CudaResultExt<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn during(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Cuda { call, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let text = Error::HeapExhausted {
            requested: 1 << 30,
            in_use: 3 << 28,
            heap_size: 1 << 30,
        }
        .to_string();
        assert!(text.contains("1073741824 bytes"), "{text}");
        assert!(text.contains("268435456 bytes left"), "{text}");
        assert!(text.contains("NVSHMEM_SYMMETRIC_SIZE"), "{text}");
    }

    #[test]
    fn pe_errors_give_the_range() {
        let text = Error::PeOutOfRange { pe: 4, n_pes: 4 }.to_string();
        assert!(text.contains("0..4"), "{text}");
    }
}
