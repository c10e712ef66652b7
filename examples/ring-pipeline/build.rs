//! Compiles kernels/*.cu against the NVSHMEM the `nvshmem` crate was built with, writes
//! $OUT_DIR/kernels.rs (one `CubinSet` per file) and gives our binaries an rpath to
//! libnvshmem_host.so.3.

fn main() {
    nvshmem_build::build_kernels("kernels").unwrap_or_else(|e| nvshmem_build::fail(&e));
}
