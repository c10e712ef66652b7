//! Pieces the check programs share: seeded random data, CUDA-graph capture and the kernels
//! the pipeline and page-pool checks launch (built like a user's, from the device headers).

pub mod graph;
#[path = "../../examples/common/splitmix.rs"]
pub mod splitmix;

/// The checks' own cubins (`PIPELINE_STAGE`, `KV_POOL_DEVICE`), from build.rs.
pub mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}
