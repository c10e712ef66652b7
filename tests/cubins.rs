//! The embedded cubins: linked for the GPU, with exactly the entry points the Rust side
//! looks up, and NVSHMEM's device state.

#[path = "support/cubin_set.rs"]
mod cubin_set;

use cubin_set::check_set;
use nvshmem::module::CubinSet;

#[test]
fn collectives_cubin_has_exactly_the_kernels_of_the_algorithm_tables() {
    check_set(
        &nvshmem::cubins::COLLECTIVES,
        &nvshmem::collectives::kernel_names(),
    );
}

#[test]
fn atomics_cubin_has_the_host_atomics_kernel() {
    check_set(&nvshmem::cubins::ATOMICS, &["host_amo".to_string()]);
}

#[cfg(feature = "tp")]
#[test]
fn tp_cubin_has_the_kernels_of_the_layers() {
    let names: Vec<String> = nvshmem::tp::kernel_names()
        .iter()
        .map(|n| n.to_string())
        .collect();
    check_set(&nvshmem::cubins::TP, &names);
}

#[test]
fn channel_cubin_has_the_send_and_receive_kernels() {
    check_set(
        &nvshmem::cubins::CHANNEL,
        &["channel_recv".to_string(), "channel_send".to_string()],
    );
}

/// The examples' kernels, built as a user's are (build.rs).
mod example_kernels {
    include!(concat!(env!("OUT_DIR"), "/examples/kernels.rs"));
}

#[test]
fn the_examples_kernel_builds_against_the_device_headers() {
    check_set(&example_kernels::AFFINE, &["affine".to_string()]);
}

#[test]
fn pool_cubin_has_the_page_pool_kernels() {
    check_set(
        &nvshmem::cubins::POOL,
        &[
            "pool_alloc_pages",
            "pool_free_pages",
            "pool_check_pages",
            "pool_read_words",
            "pool_gather",
            "pool_scatter",
        ]
        .map(String::from),
    );
}

#[test]
fn map_cubin_has_the_map_kernels() {
    check_set(
        &nvshmem::cubins::MAP,
        &[
            "map_insert_warps",
            "map_insert_blocks",
            "map_lookup_warps",
            "map_lookup_blocks",
            "map_remove_warps",
            "map_count_slots",
        ]
        .map(String::from),
    );
}

/// The crate's own cubin sets: the tensor-parallel one with the `tp` feature.
fn library_sets() -> Vec<&'static CubinSet> {
    #[allow(unused_mut)]
    let mut sets = vec![
        &nvshmem::cubins::COLLECTIVES,
        &nvshmem::cubins::ATOMICS,
        &nvshmem::cubins::CHANNEL,
        &nvshmem::cubins::POOL,
        &nvshmem::cubins::MAP,
    ];
    #[cfg(feature = "tp")]
    sets.push(&nvshmem::cubins::TP);
    sets
}

#[test]
fn the_library_ships_only_library_kernels() {
    // Demos and benchmark kernels live in their own crates (bench/).
    let names: Vec<&str> = library_sets().iter().map(|s| s.name()).collect();
    let mut want = vec!["collectives", "atomics", "channel", "pool", "map"];
    if cfg!(feature = "tp") {
        want.push("tp");
    }
    assert_eq!(names, want);
    let kernels = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels")).unwrap();
    let mut sources: Vec<String> = kernels
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    sources.sort();
    assert_eq!(
        sources,
        [
            "atomics.cu",
            "channel.cu",
            "collectives.cu",
            "map.cu",
            "pool.cu",
            "tp.cu"
        ]
    );
}

#[test]
fn cubins_are_built_for_hopper_unless_told_otherwise() {
    // The same variable the build script reads, seen when this test was compiled.
    let expected: Vec<u32> = match option_env!("NVSHMEM_RS_CUDA_ARCHS") {
        None => vec![90],
        Some(list) => list
            .split([',', ';', ' '])
            .filter(|a| !a.is_empty())
            .map(|a| {
                a.trim_start_matches("sm_")
                    .trim_end_matches(['a', 'f'])
                    .parse()
                    .unwrap()
            })
            .collect(),
    };
    for set in library_sets() {
        let caps: Vec<u32> = set.images().iter().map(|i| i.capability).collect();
        assert_eq!(caps, expected, "{}", set.name());
    }
}
