//! Build-time support for NVSHMEM in Rust: the one place that finds NVSHMEM and the CUDA
//! compiler, and the pipeline that turns CUDA C sources calling NVSHMEM device functions into
//! linked cubins.
//!
//! Used by `nvshmem-sys` (bindings), by the `nvshmem` crate (its own kernels) and by downstream
//! crates that ship their own kernels:
//!
//! ```no_run
//! // build.rs of a crate that depends on `nvshmem`
//! fn main() {
//!     let built = nvshmem_build::KernelBuilder::from_nvshmem_dependency()
//!         .and_then(|b| b.source_dir("kernels"))
//!         .and_then(|b| b.build())
//!         .and_then(|k| k.write_rust_module("kernels.rs"));
//!     if let Err(e) = built {
//!         nvshmem_build::fail(&e);
//!     }
//! }
//! ```
//!
//! Discovery order for NVSHMEM: `NVSHMEM_HOME`, then the project's `.venv` made by
//! `make setup`, then the Python package `nvidia.nvshmem`, then system paths. For the CUDA
//! compiler: `NVCC` or `CUDA_HOME`, then the project's `.venv`, then `nvcc` on `PATH`, then
//! `/usr/local/cuda`.

mod discovery;
mod error;
mod kernels;

pub use discovery::{CudaToolkit, NvshmemInstall, Probe, Source, Version};
pub use error::Error;
pub use kernels::{BuiltKernel, BuiltKernels, KernelBuilder};

/// Print a build error the way cargo shows it best, then exit the build script.
///
/// Build scripts have no caller to return an error to; this keeps the message readable
/// instead of a `Debug` dump from `unwrap`.
pub fn fail(err: &Error) -> ! {
    eprintln!("\nerror: {err}\n");
    std::process::exit(1);
}

/// Add an rpath to `lib_dir` for the binaries, tests and examples of the calling package, so
/// that `libnvshmem_host.so.3` is found at run time without `LD_LIBRARY_PATH`.
///
/// Cargo passes link arguments only to the package whose build script prints them, so every
/// package that produces executables calls this itself.
pub fn emit_rpath(lib_dir: &std::path::Path) {
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
}
