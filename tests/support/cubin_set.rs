//! The check of an embedded cubin set, shared by the crate's tests and the checks crate's
//! (included with `#[path]`): every image is a CUDA ELF linked with NVSHMEM's device library,
//! with exactly the entry points the Rust side looks up.

use nvshmem::module::CubinSet;
use nvshmem_build::Cubin;
use std::collections::BTreeSet;

pub fn check_set(set: &CubinSet, entries: &[impl AsRef<str>]) {
    assert!(!set.images().is_empty(), "{} has no image", set.name());
    let wanted: BTreeSet<&str> = entries.iter().map(AsRef::as_ref).collect();
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
            "{} sm_{}: no {} (not linked with libnvshmem_device.a)",
            set.name(),
            image.capability,
            nvshmem_build::DEVICE_STATE_SYMBOL
        );
        // Both ways: every kernel the Rust side looks up is there, and nothing else is.
        let found: BTreeSet<&str> = cubin.entry_points().collect();
        assert_eq!(found, wanted, "{} sm_{}", set.name(), image.capability);
    }
}
