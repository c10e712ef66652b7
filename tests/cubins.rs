//! The embedded cubins: linked for the GPU, with our entry points and NVSHMEM's device state.

use nvshmem::module::CubinSet;
use object::{Object, ObjectSymbol};

/// NVSHMEM's device-side state, filled by nvshmemx_cumodule_init: present only if nvlink
/// linked libnvshmem_device.a into the cubin.
const DEVICE_STATE: &str = "nvshmemi_device_state_d";

fn symbols(bytes: &[u8]) -> Vec<String> {
    let file = object::File::parse(bytes).expect("embedded cubin is an ELF file");
    // EM_CUDA: a GPU binary, not a host object.
    assert_eq!(elf_machine(bytes), 190, "not a CUDA ELF");
    assert!(file.is_64());
    file.symbols()
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect()
}

fn elf_machine(bytes: &[u8]) -> u16 {
    u16::from_le_bytes([bytes[18], bytes[19]])
}

fn check_set(set: &CubinSet, entries: &[String]) {
    assert!(!set.images().is_empty(), "{} has no image", set.name());
    for image in set.images() {
        let names = symbols(image.bytes);
        assert!(
            names.iter().any(|n| n == DEVICE_STATE),
            "{} sm_{}: no {DEVICE_STATE}",
            set.name(),
            image.capability
        );
        for e in entries {
            assert!(
                names.iter().any(|n| n == e),
                "{} sm_{}: no entry point {e}",
                set.name(),
                image.capability
            );
        }
    }
}

#[test]
fn ring_cubin_has_its_kernel_and_nvshmem_device_state() {
    check_set(&nvshmem::kernels::RING, &["ring_put_i32".to_string()]);
}

#[test]
fn collectives_cubin_has_every_algorithm_type_and_operator() {
    check_set(
        &nvshmem::kernels::COLLECTIVES,
        &nvshmem::collectives::kernel_names(),
    );
}

#[test]
fn atomics_cubin_has_the_host_atomics_kernel() {
    check_set(&nvshmem::kernels::ATOMICS, &["host_amo".to_string()]);
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
    for set in [
        &nvshmem::kernels::RING,
        &nvshmem::kernels::COLLECTIVES,
        &nvshmem::kernels::ATOMICS,
    ] {
        let caps: Vec<u32> = set.images().iter().map(|i| i.capability).collect();
        assert_eq!(caps, expected, "{}", set.name());
    }
}
