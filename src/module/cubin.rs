//! Cubin images embedded in a crate (one per GPU architecture) and the checks a loader makes
//! before handing bytes to the driver.

use crate::error::{Error, Result};

/// One linked cubin for one GPU architecture.
#[derive(Debug, Clone, Copy)]
pub struct CubinImage {
    /// Compute capability times ten (90 for sm_90).
    pub capability: u32,
    /// Built for exactly this capability (`sm_90a`: WGMMA, TMA multicast), so it runs on no
    /// other, not even a later one of the same major version.
    pub arch_specific: bool,
    /// The ELF image (16-byte aligned in generated code).
    pub bytes: &'static [u8],
}

/// Bytes at a 16-byte aligned address: generated code embeds cubins in this so that ELF
/// readers (which read the 64-bit headers in place) accept them.
#[repr(C, align(16))]
pub struct Aligned<B: ?Sized>(pub B);

/// The cubins of one kernel source file, one per architecture it was built for. Made by
/// `nvshmem_build::BuiltKernels::write_rust_module`.
#[derive(Debug, Clone, Copy)]
pub struct CubinSet {
    name: &'static str,
    images: &'static [CubinImage],
}

impl CubinSet {
    /// A set named after its source file.
    pub const fn new(name: &'static str, images: &'static [CubinImage]) -> Self {
        CubinSet { name, images }
    }

    /// The source file stem.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// All images.
    pub fn images(&self) -> &'static [CubinImage] {
        self.images
    }

    /// The image that runs on a GPU of compute capability `major.minor`: the same major
    /// version, the highest minor not above the device's; an architecture-specific image
    /// (`sm_90a`) only on exactly its capability.
    pub fn image_for(&self, major: i32, minor: i32) -> Result<&'static CubinImage> {
        let cc = (major * 10 + minor) as u32;
        self.images
            .iter()
            .filter(|i| {
                if i.arch_specific {
                    i.capability == cc
                } else {
                    i.capability / 10 == major as u32 && i.capability <= cc
                }
            })
            .max_by_key(|i| i.capability)
            .ok_or_else(|| {
                let built: Vec<String> = self
                    .images
                    .iter()
                    .map(|i| {
                        format!(
                            "sm_{}{}",
                            i.capability,
                            if i.arch_specific { "a" } else { "" }
                        )
                    })
                    .collect();
                Error::Module {
                    module: self.name.to_string(),
                    message: format!(
                        "no cubin for this GPU (sm_{cc}); it was built for [{}]. Rebuild with \
                         NVSHMEM_RS_CUDA_ARCHS=sm_{cc}",
                        built.join(", ")
                    ),
                    source: None,
                }
            })
    }
}

/// Accept ELF cubins for NVIDIA GPUs and fatbins; refuse anything else with a reason.
pub(super) fn check_image(bytes: &[u8], name: &str) -> Result<()> {
    const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    const EM_CUDA: u16 = 190;
    if bytes.len() >= 16 && bytes[..4] == FATBIN_MAGIC {
        return Ok(());
    }
    let refuse = |message: String| Error::Module {
        module: name.to_string(),
        message,
        source: None,
    };
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Err(refuse("not a cubin (no ELF header)".into()));
    }
    let machine = u16::from_le_bytes([bytes[0x12], bytes[0x13]]);
    if bytes[5] != 1 || machine != EM_CUDA {
        return Err(refuse(format!(
            "an ELF file for another machine ({machine}), not a cubin for an NVIDIA GPU"
        )));
    }
    Ok(())
}

/// Copy into 8-byte-aligned storage: the loader reads the ELF image in place.
pub(super) fn aligned_copy(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8) + 1];
    // SAFETY: `words` holds at least `bytes.len()` bytes and does not overlap `bytes`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr() as *mut u8, bytes.len())
    };
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    static IMAGES: [CubinImage; 2] = [
        CubinImage {
            capability: 80,
            arch_specific: false,
            bytes: b"a",
        },
        CubinImage {
            capability: 90,
            arch_specific: false,
            bytes: b"b",
        },
    ];

    #[test]
    fn arch_specific_images_run_on_their_capability_only() {
        static SM90A: [CubinImage; 1] = [CubinImage {
            capability: 90,
            arch_specific: true,
            bytes: b"c",
        }];
        let set = CubinSet::new("gemm", &SM90A);
        assert_eq!(set.image_for(9, 0).unwrap().bytes, b"c");
        for (major, minor) in [(9, 1), (10, 0), (8, 9)] {
            let e = set.image_for(major, minor).unwrap_err().to_string();
            assert!(e.contains("[sm_90a]"), "{e}");
        }
        let empty = CubinSet::new("gemm", &[]);
        assert!(empty.image_for(9, 0).is_err());
    }

    #[test]
    fn picks_the_image_of_the_gpu_major_version() {
        let set = CubinSet::new("k", &IMAGES);
        assert_eq!(set.image_for(9, 0).unwrap().capability, 90);
        assert_eq!(set.image_for(8, 6).unwrap().capability, 80);
        let e = set.image_for(10, 0).unwrap_err();
        assert!(matches!(&e, Error::Module { module, .. } if module == "k"));
        let e = e.to_string();
        assert!(
            e.contains("sm_100") && e.contains("NVSHMEM_RS_CUDA_ARCHS"),
            "{e}"
        );
    }

    #[test]
    fn only_gpu_images_are_accepted() {
        assert!(check_image(b"not a cubin", "x").is_err());
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x12] = 62; // x86-64
        let e = check_image(&elf, "libfoo.so").unwrap_err().to_string();
        assert!(e.contains("another machine"), "{e}");
        elf[0x12] = 190;
        assert!(check_image(&elf, "k.cubin").is_ok());
        let mut fatbin = vec![0u8; 32];
        fatbin[..4].copy_from_slice(&0xBA55_ED50u32.to_le_bytes());
        assert!(check_image(&fatbin, "k.fatbin").is_ok());
    }

    #[test]
    fn aligned_copies_keep_the_bytes() {
        let bytes: Vec<u8> = (0..21).collect();
        let words = aligned_copy(&bytes);
        assert_eq!(words.as_ptr() as usize % 8, 0);
        let copied =
            unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, bytes.len()) };
        assert_eq!(copied, &bytes[..]);
    }
}
