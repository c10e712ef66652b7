use crate::discovery::{Version, LIBCLANG_WHEEL, PINNED_NVSHMEM};
use std::fmt;
use std::path::PathBuf;

/// What went wrong while finding the toolchain or compiling kernels.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// NVSHMEM was not found anywhere; lists the places looked at.
    NvshmemNotFound {
        /// The places, in order.
        looked_in: Vec<String>,
    },
    /// A directory was named (by `NVSHMEM_HOME` or metadata) but does not hold NVSHMEM.
    NvshmemIncomplete {
        /// The directory named.
        root: PathBuf,
        /// The file it lacks.
        missing: PathBuf,
    },
    /// The NVSHMEM asked for (by `NVSHMEM_HOME`, or headers changed since) is not the release
    /// the `nvshmem` crate was built against, so kernels would link the wrong device library.
    NvshmemMismatch {
        /// What named the other NVSHMEM (`NVSHMEM_HOME`, `the headers`...).
        requested_by: String,
        /// Its release.
        requested: Version,
        /// Its include folder.
        requested_at: PathBuf,
        /// The release in the dependency's `links` metadata.
        built: Version,
        /// Its include folder.
        built_at: PathBuf,
        /// The crate whose metadata was read (`nvshmem`).
        crate_name: String,
    },
    /// The headers, the host library and the device library of one NVSHMEM install are not
    /// all the same release ([`NvshmemInstall::check_release`](crate::NvshmemInstall::check_release)).
    NvshmemReleaseMismatch {
        /// The version header (`non_abi/nvshmem_version.h`).
        version_header: PathBuf,
        /// The release it names.
        headers: Version,
        /// The host library.
        host_lib: PathBuf,
        /// Its release.
        host: Version,
        /// The device library.
        device_lib: PathBuf,
        /// Its release.
        device: Version,
    },
    /// A library of an NVSHMEM install does not say which release it is.
    NvshmemReleaseUnknown {
        /// The library.
        library: PathBuf,
        /// What was looked for in it.
        looked_for: String,
    },
    /// A `links` metadata variable is missing: the builder was called outside the build
    /// script of a crate that depends on `crate_name`.
    MissingMetadata {
        /// The variable (`DEP_NVSHMEM_RS_INCLUDE`).
        var: String,
        /// The crate that sets it.
        crate_name: String,
    },
    /// The CUDA compiler was not found anywhere; lists the places looked at.
    NvccNotFound {
        /// The places, in order.
        looked_in: Vec<String>,
    },
    /// `NVCC`/`CUDA_HOME` named a place without a usable compiler.
    CudaIncomplete {
        /// The directory named.
        root: PathBuf,
        /// The file it lacks.
        missing: PathBuf,
    },
    /// No libclang (clang's C API, which bindgen loads) was found; lists the places looked at.
    LibclangNotFound {
        /// The places, in order.
        looked_in: Vec<String>,
    },
    /// A libclang was found but bindgen could not use it (`reason` says why).
    LibclangUnusable {
        /// The library.
        path: PathBuf,
        /// Why not.
        reason: String,
    },
    /// bindgen could not parse the headers.
    Bindgen {
        /// The header bindgen read.
        header: PathBuf,
        /// clang's diagnostic.
        message: String,
    },
    /// A tool could not be started.
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why it did not start.
        source: std::io::Error,
    },
    /// A compile or link step failed. `what` says which (`compiling ring.cu for
    /// sm_90`), `output` holds the tool's messages (nvcc writes `file(line): error: ...`).
    Compile {
        /// The step.
        what: String,
        /// The command line.
        command: String,
        /// The tool's messages.
        output: String,
    },
    /// An argument was invalid (an arch string, an empty source list...).
    Invalid(String),
    /// Reading or writing a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
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
            Error::NvshmemMismatch {
                requested_by,
                requested,
                requested_at,
                built,
                built_at,
                crate_name,
            } => write!(
                f,
                "wrong NVSHMEM: {requested_by} names NVSHMEM {requested} at {}, but {crate_name} was \
                 built against NVSHMEM {built} at {}. Kernels must link the libnvshmem_device.a of \
                 the same release as the host library that runs them: unset NVSHMEM_HOME, or \
                 rebuild {crate_name} with it (cargo clean -p nvshmem-sys -p {crate_name}).",
                requested_at.display(),
                built_at.display()
            ),
            Error::NvshmemReleaseMismatch {
                version_header,
                headers,
                host_lib,
                host,
                device_lib,
                device,
            } => write!(
                f,
                "this NVSHMEM mixes releases: the headers ({}) are NVSHMEM {headers}, the host \
                 library ({}) is NVSHMEM {host} and the device library ({}) is NVSHMEM {device}. Kernels link the \
                 device library, and the host library that runs them (and the bindings made from \
                 the headers) must be the same release. Install one release whole: `make setup` \
                 (NVSHMEM {PINNED_NVSHMEM}), or `pip install --force-reinstall --no-deps \
                 nvidia-nvshmem-cu13==VERSION` with one pinned VERSION (3.4.5 to 3.8.0), and \
                 point NVSHMEM_HOME at the folder holding that release's include/ and lib/.",
                version_header.display(),
                host_lib.display(),
                device_lib.display()
            ),
            Error::NvshmemReleaseUnknown {
                library,
                looked_for,
            } => write!(
                f,
                "cannot tell which NVSHMEM release {} is (looked for {looked_for}), so it cannot \
                 be checked against the headers and the other library. Point NVSHMEM_HOME at an \
                 NVSHMEM 3 install as NVIDIA ships it (the nvidia-nvshmem-cu13 wheel or NVIDIA's \
                 packages), or unset it to use `make setup`'s .venv.",
                library.display()
            ),
            Error::MissingMetadata { var, crate_name } => write!(
                f,
                "{var} is not set: KernelBuilder::from_nvshmem_dependency() (and \
                 nvshmem_build::build_kernels) read the `links` metadata of `{crate_name}`, which \
                 cargo passes only to the build script of a crate that lists `{crate_name}` under \
                 [dependencies]. Add it there, or use KernelBuilder::from_env()."
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
            Error::LibclangNotFound { looked_in } => write!(
                f,
                "libclang not found: bindgen needs libclang.so (clang's C API; libclang-cpp is \
                 a different library) to read the NVSHMEM headers (looked in: {}). In the \
                 nvshmem checkout run `make setup`, which installs the pinned {LIBCLANG_WHEEL} \
                 wheel into .venv; outside it run `python3 -m pip install {LIBCLANG_WHEEL}` in \
                 the Python environment that PYTHON (or python3) runs, or set LIBCLANG_PATH to \
                 a libclang.so (Debian: `apt-get install libclang-dev`).",
                looked_in.join("; ")
            ),
            Error::LibclangUnusable { path, reason } => write!(
                f,
                "libclang at {} cannot be used by bindgen: {reason}. Run `make setup` (it \
                 installs the pinned {LIBCLANG_WHEEL} wheel into .venv), or point LIBCLANG_PATH \
                 at a working libclang.so.",
                path.display()
            ),
            Error::Bindgen { header, message } => write!(
                f,
                "bindgen could not read {}: {}. The headers must come from the NVSHMEM release \
                 that nvshmem-sys supports (3.x) with a CUDA toolkit's include folder beside \
                 them; check NVSHMEM_HOME and CUDA_HOME, or unset them to use `make setup`'s \
                 .venv.",
                header.display(),
                message.trim()
            ),
            Error::Spawn { program, source } => {
                write!(f, "could not run {}: {source}. {HINT}", program.display())
            }
            Error::Compile {
                what,
                command,
                output,
            } => {
                write!(f, "{what} failed:\n{}\n  command: {command}", output.trim_end())?;
                if output.contains("Undefined reference") || output.contains("undefined reference") {
                    f.write_str(
                        "\n  hint: a device function is neither in the kernel's sources nor in this \
                         NVSHMEM's libnvshmem_device.a; check its name against the NVSHMEM headers \
                         of the release the crate was built with",
                    )?;
                }
                Ok(())
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
