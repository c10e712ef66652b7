use std::fmt;
use std::path::PathBuf;

/// What went wrong while finding the toolchain or compiling kernels.
#[derive(Debug)]
pub enum Error {
    /// NVSHMEM was not found anywhere; lists the places looked at.
    NvshmemNotFound { looked_in: Vec<String> },
    /// A directory was named (by `NVSHMEM_HOME` or metadata) but does not hold NVSHMEM.
    NvshmemIncomplete { root: PathBuf, missing: PathBuf },
    /// The CUDA compiler was not found anywhere; lists the places looked at.
    NvccNotFound { looked_in: Vec<String> },
    /// `NVCC`/`CUDA_HOME` named a place without a usable compiler.
    CudaIncomplete { root: PathBuf, missing: PathBuf },
    /// A tool could not be started.
    Spawn { program: PathBuf, source: std::io::Error },
    /// A compile or link step failed; `output` holds the compiler's messages (file:line).
    Compile { command: String, output: String },
    /// An argument was invalid (an arch string, an empty source list...).
    Invalid(String),
    /// Reading or writing a file failed.
    Io { path: PathBuf, source: std::io::Error },
}

const HINT: &str = "Run `make setup` in the nvshmem crate's checkout (it installs the pinned \
CUDA compiler and NVSHMEM from PyPI into .venv), or set NVSHMEM_HOME to an NVSHMEM install \
(with include/nvshmem.h and lib/libnvshmem_host.so.3) and CUDA_HOME to a CUDA toolkit (with bin/nvcc).";

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NvshmemNotFound { looked_in } => write!(
                f,
                "NVSHMEM not found (looked in: {}).\n{HINT}",
                looked_in.join("; ")
            ),
            Error::NvshmemIncomplete { root, missing } => write!(
                f,
                "{} does not look like an NVSHMEM install: {} is missing. Point NVSHMEM_HOME at the \
                 directory holding include/ and lib/, or unset it to use `make setup`'s .venv.",
                root.display(),
                missing.display()
            ),
            Error::NvccNotFound { looked_in } => write!(
                f,
                "the CUDA compiler (nvcc) was not found (looked in: {}).\n{HINT}",
                looked_in.join("; ")
            ),
            Error::CudaIncomplete { root, missing } => write!(
                f,
                "{} does not look like a CUDA toolkit: {} is missing. Point CUDA_HOME at the \
                 directory holding bin/nvcc (or NVCC at the compiler), or unset it to use \
                 `make setup`'s .venv.",
                root.display(),
                missing.display()
            ),
            Error::Spawn { program, source } => {
                write!(f, "could not run {}: {source}. {HINT}", program.display())
            }
            Error::Compile { command, output } => {
                write!(f, "kernel build failed:\n  {command}\n{output}")
            }
            Error::Invalid(msg) => f.write_str(msg),
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Spawn { source, .. } | Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
