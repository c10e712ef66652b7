//! Build-time support for NVSHMEM in Rust: the one place that finds NVSHMEM and the CUDA
//! compiler, and the pipeline that turns CUDA C sources calling NVSHMEM device functions into
//! linked cubins (`nvcc -rdc=true -cubin`, then `nvlink` with `libnvshmem_device.a`).
//!
//! Used by `nvshmem-sys` (bindings), by the `nvshmem` crate (its own kernels) and by
//! downstream crates that ship their own kernels. For those, the whole build script is:
//!
//! ```no_run
//! // build.rs of a crate with `nvshmem` under [dependencies] and `nvshmem-build` under
//! // [build-dependencies]; its kernels are in kernels/*.cu.
//! fn main() {
//!     nvshmem_build::build_kernels("kernels").unwrap_or_else(|e| nvshmem_build::fail(&e));
//! }
//! ```
//!
//! and the crate embeds the cubins with
//! `include!(concat!(env!("OUT_DIR"), "/kernels.rs"))`: one `nvshmem::module::CubinSet`
//! constant per source file (`RING` for `ring.cu`), for `nvshmem::module::Module::load`.
//!
//! The kernels are built for `sm_90` unless `NVSHMEM_RS_CUDA_ARCHS` (`sm_90,sm_100`) or
//! [`KernelBuilder::archs`] says otherwise:
//!
//! ```no_run
//! fn main() -> Result<(), nvshmem_build::Error> {
//!     nvshmem_build::KernelBuilder::from_nvshmem_dependency()?
//!         .archs(["sm_90", "sm_100"])?
//!         .source_dir("kernels")?
//!         .flag("-DCHUNK=4096")
//!         .build()?
//!         .emit("kernels.rs")?;
//!     Ok(())
//! }
//! ```
//!
//! Kernels that call no NVSHMEM device function and need all of ptxas (a CUTLASS 3 GEMM with
//! WGMMA and TMA, say) build as whole programs, here for `sm_90a` with CUTLASS's headers
//! from wherever your build finds them; host code that prepares such a kernel's parameters
//! builds into a static library linked into the crate:
//!
//! ```no_run
//! fn main() -> Result<(), nvshmem_build::Error> {
//!     let builder = nvshmem_build::KernelBuilder::from_nvshmem_dependency()?
//!         .archs(["sm_90a"])?
//!         .include_dir("third_party/cutlass/include")
//!         .flag("--expt-relaxed-constexpr");
//!     builder.build_host_library("my_gemm_params", &["cuda/gemm_params.cu"])?.emit_link();
//!     builder.whole_program().source("cuda/gemm.cu").build()?.emit("gemm.rs")?;
//!     Ok(())
//! }
//! ```
//!
//! Discovery order for NVSHMEM: `NVSHMEM_HOME`, then the project's `.venv` made by
//! `make setup`, then the Python package `nvidia.nvshmem`, then system paths. For the CUDA
//! compiler: `NVCC` or `CUDA_HOME`, then the project's `.venv`, then `nvidia.cu13`, then
//! `nvcc` on `PATH`, then `/usr/local/cuda`. For libclang (bindgen's parser, used by
//! `nvshmem-sys`): `LIBCLANG_PATH`, then the `.venv`, then the Python package `clang` (the
//! `libclang` wheel), then LLVM's and the system's library folders; only the names bindgen
//! loads count, never `libclang-cpp`. [`SEARCH_VAR`] (`NVSHMEM_BUILD_SEARCH=venv,python,system`)
//! narrows where discovery looks after the variables. Crates that depend on `nvshmem` skip
//! discovery: they read what `nvshmem` found from its `links` metadata, so their kernels
//! link the same NVSHMEM. The NVSHMEM found must be one release throughout: headers, host
//! library and device library ([`NvshmemInstall::check_release`]); the crates build against
//! NVSHMEM 3.4.5 to 3.8.0.
//!
//! # docs.rs
//!
//! docs.rs builds documentation with `DOCS_RS` set and no NVSHMEM, CUDA compiler or libclang.
//! While [`DOCS_RS_VAR`] is set, `nvshmem-sys` binds the NVSHMEM [`PINNED_NVSHMEM`] headers
//! from the file it ships and links nothing, and the kernel pipeline looks for nothing and
//! compiles nothing: [`build_kernels`] (and [`KernelBuilder::build`]) still write
//! `kernels.rs`, with every `CubinSet` constant empty, so a dependent's build script and its
//! `include!` need no change for docs.rs. A build script that does more (its own bindgen, say)
//! can ask [`docs_rs`] and skip it.

// The examples show whole build scripts, `fn main` included.
#![allow(clippy::needless_doctest_main)]
#![warn(missing_docs)]

mod cubin;
mod discovery;
mod error;
mod pipeline;

pub use cubin::{Cubin, Symbol, SymbolKind, DEVICE_STATE_SYMBOL};
pub use discovery::{
    is_libclang_file_name, libclang_in, CudaToolkit, Libclang, NvshmemInstall, Probe, Releases,
    Search, Source, Version, DISCOVERY_VARS, DOCS_RS_VAR, LIBCLANG_WHEEL, PINNED_NVSHMEM,
    SEARCH_VAR,
};
pub use error::Error;
pub use pipeline::{
    Arch, BuiltKernel, BuiltKernels, HostLibrary, KernelBuilder, ARCHS_VAR, DEFAULT_ARCHS,
};

use std::path::Path;

/// The build script of a crate that depends on `nvshmem`, in one call: compile every `.cu`
/// file in `dir` against the NVSHMEM (and nvcc) that `nvshmem` was built with, for the
/// architectures in `NVSHMEM_RS_CUDA_ARCHS` (default `sm_90`), write `$OUT_DIR/kernels.rs`,
/// and give the package's binaries an rpath to the NVSHMEM host library.
///
/// Equivalent to
/// `KernelBuilder::from_nvshmem_dependency()?.source_dir(dir)?.build()?.emit("kernels.rs")`,
/// plus `cargo:rerun-if-changed=build.rs`.
pub fn build_kernels(dir: impl AsRef<Path>) -> Result<BuiltKernels, Error> {
    let built = KernelBuilder::from_nvshmem_dependency()?
        .source_dir(dir)?
        .build()?;
    built.emit("kernels.rs")?;
    // Printing any rerun-if-changed turns off cargo's "rerun on any change in the package":
    // keep the build script itself among the triggers.
    println!("cargo:rerun-if-changed=build.rs");
    Ok(built)
}

/// Whether this is a docs.rs build ([`DOCS_RS_VAR`] set and not empty), which has no NVSHMEM,
/// CUDA compiler or libclang. Inside a build script this also tells cargo to re-run the
/// script when the variable changes.
///
/// ```no_run
/// // build.rs of a crate that also generates bindings of its own
/// fn main() {
///     nvshmem_build::build_kernels("kernels").unwrap_or_else(|e| nvshmem_build::fail(&e));
///     if !nvshmem_build::docs_rs() {
///         // bindgen, a C library... what docs.rs cannot run
///     }
/// }
/// ```
pub fn docs_rs() -> bool {
    if std::env::var_os("OUT_DIR").is_some() {
        println!("cargo:rerun-if-env-changed={DOCS_RS_VAR}");
    }
    std::env::var_os(DOCS_RS_VAR).is_some_and(|v| !v.is_empty())
}

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
/// package that produces executables calls this itself ([`build_kernels`] and
/// [`BuiltKernels::emit`] do). Nothing for an empty path (a docs.rs build's stand-in).
pub fn emit_rpath(lib_dir: &Path) {
    if lib_dir.as_os_str().is_empty() {
        return;
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
}
