//! What can be checked of the embedded kernel without a GPU: its cubins, their entry point
//! and their link with NVSHMEM's device library.

use nvshmem_build::Cubin;
use ring_pipeline::{kernels, KERNEL};

#[test]
fn the_embedded_cubins_hold_the_kernel_linked_with_nvshmem() {
    let set = kernels::RING_ALLGATHER;
    assert_eq!(set.name(), "ring_allgather");
    assert!(!set.images().is_empty());
    for image in set.images() {
        // Embedded aligned, so ELF readers can parse the image in place.
        assert_eq!(image.bytes.as_ptr() as usize % 16, 0);
        let cubin = Cubin::parse(image.bytes).unwrap();
        assert!(
            cubin.is_cuda(),
            "sm_{} image is not a CUDA ELF file",
            image.capability
        );
        let entries: Vec<&str> = cubin.entry_points().collect();
        assert_eq!(entries, [KERNEL], "sm_{}", image.capability);
        assert!(
            cubin.links_nvshmem(),
            "sm_{} image lacks {}: not linked with libnvshmem_device.a",
            image.capability,
            nvshmem_build::DEVICE_STATE_SYMBOL
        );
    }
}
