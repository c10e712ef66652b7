//! Compiles `kernels/*.cu` into linked cubins (one per architecture) and embeds them.

use nvshmem_build::{emit_rpath, fail, KernelBuilder};

fn main() {
    // The NVSHMEM that nvshmem-sys found and bound, so host and device libraries match.
    let builder =
        KernelBuilder::from_links_metadata("NVSHMEM", "nvshmem-sys").unwrap_or_else(|e| fail(&e));
    let built = builder
        .clone()
        .rust_path("crate")
        .source_dir("kernels")
        .and_then(|b| b.build())
        .unwrap_or_else(|e| fail(&e));
    built
        .write_rust_module("kernels.rs")
        .unwrap_or_else(|e| fail(&e));
    emit_rpath(&built.nvshmem.lib_dir);
    // For crates that depend on us and build their own kernels (DEP_NVSHMEM_RS_*).
    builder.emit_links_metadata();
    println!("cargo:rerun-if-changed=build.rs");
}
