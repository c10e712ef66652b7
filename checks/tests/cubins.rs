//! The checks' kernels, built as a user's are (build.rs): linked with NVSHMEM's device
//! library, with exactly the entry points the programs look up.

#[path = "../../tests/support/cubin_set.rs"]
mod cubin_set;

use cubin_set::check_set;
use nvshmem_checks::kernels;

#[test]
fn users_kernels_build_against_the_device_headers() {
    // They include <nvshmem_rs/channel.cuh>, <nvshmem_rs/pool.cuh> and <nvshmem_rs/map.cuh>
    // from the exported
    // header folder.
    check_set(&kernels::PIPELINE_STAGE, &["pipeline_stage"]);
    check_set(
        &kernels::KV_POOL_DEVICE,
        &[
            "kv_device_consume",
            "kv_device_free_race",
            "kv_device_produce",
            "kv_device_stale_free",
        ],
    );
    check_set(
        &kernels::MAP_DEVICE,
        &[
            "map_device_bad",
            "map_device_insert",
            "map_device_lookup",
            "map_device_remove",
        ],
    );
}
