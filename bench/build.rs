//! Compiles the benchmark's own kernels (kernels/bench_p2p.cu) against the NVSHMEM the
//! `nvshmem` crate was built with, into $OUT_DIR/kernels.rs.

fn main() {
    nvshmem_build::build_kernels("kernels").unwrap_or_else(|e| nvshmem_build::fail(&e));
}
