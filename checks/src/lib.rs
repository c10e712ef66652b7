//! Pieces the check programs share: seeded random data, CUDA-graph capture and the kernels
//! the pipeline, page-pool and map checks launch (built like a user's, from the device headers).

use nvshmem::Nvshmem;

pub mod graph;
#[path = "../../examples/common/splitmix.rs"]
pub mod splitmix;
pub mod tally;

/// The checks' own cubins (`PIPELINE_STAGE`, `KV_POOL_DEVICE`, `MAP_DEVICE`), from build.rs.
pub mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// The runtime, started for the check program `program`; when it cannot start, the error
/// with the program's name and exit status 2 (as for a bad option).
pub fn start(program: &str) -> Nvshmem {
    Nvshmem::init().unwrap_or_else(|e| {
        eprintln!("{program}: {e}");
        std::process::exit(2)
    })
}
