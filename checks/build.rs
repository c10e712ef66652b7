//! Compiles the checks' own kernels (kernels/*.cu, built as a user's are: they include
//! <nvshmem_rs/channel.cuh> and <nvshmem_rs/pool.cuh>) into $OUT_DIR/kernels.rs.

fn main() {
    nvshmem_build::build_kernels("kernels").unwrap_or_else(|e| nvshmem_build::fail(&e));
}
