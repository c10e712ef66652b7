//! Helpers shared by the integration tests: unique scratch directories and made-up install
//! trees that look like NVSHMEM and CUDA to discovery.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A directory under the system temp dir, unique to this process and call, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "nvshmem-build-{tag}-{}-{n}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        // Canonical, so paths compare equal to what discovery returns.
        Scratch(dir.canonicalize().expect("canonicalize scratch dir"))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// An NVSHMEM install tree at `root` (include/, lib/) reporting `version`.
pub fn fake_nvshmem(root: &Path, version: (u32, u32, u32)) {
    write(&root.join("include/nvshmem.h"), "/* made up */\n");
    write(
        &root.join("include/non_abi/nvshmem_version.h"),
        &format!(
            "#ifndef V\n#define V\n#define NVSHMEM_VENDOR_MAJOR_VERSION {}\n#define NVSHMEM_VENDOR_MINOR_VERSION {}\n\
             #define NVSHMEM_VENDOR_PATCH_VERSION {}\n#endif\n",
            version.0, version.1, version.2
        ),
    );
    write(
        &root.join("lib/libnvshmem_host.so.3"),
        "not really a library",
    );
    write(&root.join("lib/libnvshmem_device.a"), "!<arch>\n");
}

/// A CUDA toolkit tree at `root`: bin/nvcc and bin/nvlink (plain files) and include/cuda.h.
pub fn fake_cuda(root: &Path, cuda_version: u32) {
    write(&root.join("bin/nvcc"), "#!/bin/sh\nexit 1\n");
    write(&root.join("bin/nvlink"), "#!/bin/sh\nexit 1\n");
    write(
        &root.join("include/cuda.h"),
        &format!("#define CUDA_VERSION {cuda_version}\n"),
    );
}

/// The `site-packages/nvidia` directory of a `.venv` in `project`, as `make setup` makes it.
pub fn venv_nvidia(project: &Path) -> PathBuf {
    project.join(".venv/lib/python3.11/site-packages/nvidia")
}

/// A libclang-looking file (not a real library) at `path`.
pub fn fake_lib(path: &Path) {
    write(path, "not really a library");
}
