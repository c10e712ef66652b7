//! Raw FFI bindings to the NVSHMEM host library (`libnvshmem_host.so.3`).
//!
//! Generated at build time by bindgen from the headers of the NVSHMEM that `nvshmem-build`
//! finds (`NVSHMEM_HOME`, the project's `.venv`, the `nvidia.nvshmem` Python package, or
//! system paths), and restricted to the functions the host library exports. bindgen's
//! libclang is found the same way (`LIBCLANG_PATH`, `.venv`, the `libclang` wheel, system),
//! so no clang install is needed. Use the `nvshmem` crate for a safe API.
//!
//! NVSHMEM 3.4.5 to 3.8.0 are supported; the headers, the host library and the device
//! library found must be one release (the build checks). Where `DOCS_RS` is set (docs.rs,
//! which has no NVSHMEM), the bindings are the ones this crate ships for NVSHMEM 3.4.5 and
//! nothing is linked.
//!
//! Initialise with [`nvshmemx_hostlib_init_attr`]: the header's `nvshmem_init` and
//! `nvshmemx_init_attr` are static inline functions that exit the process on error, so they
//! are not bound.
//!
//! ```no_run
//! // A minimal program: every status is checked by the caller.
//! unsafe {
//!     let mut attr: nvshmem_sys::nvshmemx_init_attr_t = Default::default();
//!     attr.version = (1 << 16) + std::mem::size_of::<nvshmem_sys::nvshmemx_init_attr_t>() as i32;
//!     assert_eq!(nvshmem_sys::nvshmemx_hostlib_init_attr(0, &mut attr), 0);
//!     println!("PE {} of {}", nvshmem_sys::nvshmem_my_pe(), nvshmem_sys::nvshmem_n_pes());
//!     nvshmem_sys::nvshmemx_hostlib_finalize();
//! }
//! ```
#![warn(missing_docs)]

/// The generated bindings, re-exported at the crate root; their documentation is NVSHMEM's.
#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all
)]
mod bindings {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

pub use bindings::*;

/// The NVSHMEM release these bindings were generated from (`major.minor.patch`).
pub const BUILD_VERSION: &str = env!("NVSHMEM_SYS_VERSION");

/// The host library linked at build time (empty in a docs.rs build, which links none).
pub const BUILD_HOST_LIB: &str = env!("NVSHMEM_SYS_HOST_LIB");
