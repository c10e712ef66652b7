//! The checks' kernels, built as a user's are (build.rs): linked with NVSHMEM's device
//! library, with exactly the entry points the programs look up.

use nvshmem::module::CubinSet;
use nvshmem_build::Cubin;
use nvshmem_checks::kernels;
use std::collections::BTreeSet;

fn check_set(set: &CubinSet, entries: &[&str]) {
    assert!(!set.images().is_empty(), "{} has no image", set.name());
    let wanted: BTreeSet<&str> = entries.iter().copied().collect();
    for image in set.images() {
        let cubin = Cubin::parse(image.bytes).expect("embedded cubin is an ELF file");
        assert!(
            cubin.is_cuda(),
            "{} sm_{}: not a CUDA ELF",
            set.name(),
            image.capability
        );
        assert!(
            cubin.links_nvshmem(),
            "{} sm_{}: not linked with libnvshmem_device.a",
            set.name(),
            image.capability
        );
        let found: BTreeSet<&str> = cubin.entry_points().collect();
        assert_eq!(found, wanted, "{} sm_{}", set.name(), image.capability);
    }
}

#[test]
fn users_kernels_build_against_the_device_headers() {
    // They include <nvshmem_rs/channel.cuh> and <nvshmem_rs/pool.cuh> from the exported
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
}
