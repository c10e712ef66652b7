//! [`Nvshmem::init`] and its forms: the runtime's start (src/runtime), then the modules of
//! the services that host calls use, which live in the layers above the runtime.

use crate::error::{Error, Result};
use crate::runtime::{InitOptions, Nvshmem, UniqueId};

impl Nvshmem {
    /// Start NVSHMEM from the launcher's environment and bind this process to its GPU.
    pub fn init() -> Result<Self> {
        Self::init_with(InitOptions::default())
    }

    /// [`init`](Self::init) with options.
    pub fn init_with(options: InitOptions) -> Result<Self> {
        Self::start(options, None)
    }

    /// Start NVSHMEM with a unique ID: `rank` is this PE, `n_pes` the number of PEs, and every
    /// PE passes the same `id` (made by one of them with [`UniqueId::new`]).
    pub fn init_with_unique_id(
        rank: usize,
        n_pes: usize,
        id: &UniqueId,
        options: InitOptions,
    ) -> Result<Self> {
        if n_pes == 0 || rank >= n_pes {
            return Err(Error::PeOutOfRange { pe: rank, n_pes });
        }
        Self::start(options, Some((rank, n_pes, id)))
    }

    fn start(options: InitOptions, uid: Option<(usize, usize, &UniqueId)>) -> Result<Self> {
        let shmem = Self::start_runtime(options, uid)?;
        shmem.load_services();
        Ok(shmem)
    }

    /// Load the kernels of the services that host calls use (the host atomics, the channels)
    /// now, before the caller launches anything. Loading a module waits for every kernel
    /// running on the GPU and holds back this process's other CUDA calls meanwhile; loaded
    /// on first use, beside a kernel that waits for another PE (whose matching work this
    /// PE's held-back threads are to launch), it stalls both PEs until a timeout. A failure
    /// here is left to the first call that needs the service, which reports it.
    fn load_services(&self) {
        let loads = [
            ("host atomics", crate::atomic::load_service(self)),
            ("channels", crate::channel::load_service(self)),
        ];
        for (what, loaded) in loads {
            if let Err(e) = loaded {
                crate::diag::warn_pe!(
                    Some(self.my_pe()),
                    "the kernels of the {what} did not load at start ({e}); they load at first use"
                );
            }
        }
    }
}
