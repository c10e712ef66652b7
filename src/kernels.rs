//! The kernels this crate ships, compiled by `build.rs` from `kernels/*.cu`.

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

pub use embedded::*;

use crate::buffer::SymmetricBuffer;
use crate::error::{Error, Result};
use crate::module::{KernelArgs, Module};
use crate::runtime::Nvshmem;
use cudarc::driver::{CudaStream, LaunchConfig};

/// The ring demonstration kernel: each PE puts `src` into the next PE's `dst` and sets its
/// `flag`, then waits for its own flag. Collective over all PEs.
pub struct Ring {
    module: Module,
}

impl Ring {
    /// Load and register the kernel on this PE's GPU.
    pub fn new(shmem: &Nvshmem) -> Result<Self> {
        Ok(Ring {
            module: Module::load(shmem, &RING)?,
        })
    }

    /// Enqueue the ring put on `stream`. `flag` must hold 0 on every PE beforehand.
    pub fn put(
        &self,
        dst: &SymmetricBuffer<i32>,
        src: &SymmetricBuffer<i32>,
        flag: &SymmetricBuffer<u64>,
        stream: &CudaStream,
    ) -> Result<()> {
        if dst.len() != src.len() || flag.is_empty() {
            return Err(Error::Length {
                what: "ring put destination",
                expected: src.len(),
                got: dst.len(),
            });
        }
        let f = self.module.function("ring_put_i32")?;
        let mut args = KernelArgs::new();
        args.buffer(dst).buffer(src).value(src.len()).buffer(flag);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match ring_put_i32(int32_t*, const int32_t*, size_t, uint64_t*)
        // and the buffers are symmetric allocations of the sizes checked above.
        unsafe { f.launch_collective(cfg, stream, &mut args) }
    }
}
