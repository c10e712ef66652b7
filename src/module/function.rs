//! A kernel of a loaded module, and the one path by which every kernel of the crate (ours,
//! the host atomics' helper, users') is launched.

use super::args::{check_args, KernelArgs};
use super::Loaded;
use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::check_device;
use cudarc::driver::{result as cu, sys as cusys, CudaStream, LaunchConfig};
use std::sync::{Arc, OnceLock};

/// How a kernel is launched, besides its grid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaunchOptions {
    /// Every block resident at once (a cooperative launch, as `nvshmemx_collective_launch`
    /// does), for kernels whose blocks wait on each other or on other PEs. The grid is
    /// checked against the occupancy the driver reports: too large a grid is an error, not a
    /// deadlock.
    pub cooperative: bool,
    /// Programmatic stream serialization: the launch may begin while the kernel before it on
    /// the stream runs. The kernel must wait for it (`cudaGridDependencySynchronize`) before
    /// it touches memory that kernel writes.
    pub programmatic: bool,
    /// Thread-block clusters of this many blocks along x, y and z (Hopper and later); the
    /// grid must be a multiple of it. `None`: no clusters (or those the kernel declares).
    pub cluster: Option<[u32; 3]>,
}

impl LaunchOptions {
    /// A plain launch: not cooperative, not programmatic, no clusters.
    ///
    /// ```
    /// let options = nvshmem::module::LaunchOptions::new().cooperative(true).programmatic(true);
    /// assert!(options.cooperative && options.programmatic && options.cluster.is_none());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Set [`cooperative`](Self::cooperative).
    pub fn cooperative(mut self, on: bool) -> Self {
        self.cooperative = on;
        self
    }

    /// Set [`programmatic`](Self::programmatic).
    pub fn programmatic(mut self, on: bool) -> Self {
        self.programmatic = on;
        self
    }

    /// Set [`cluster`](Self::cluster).
    pub fn cluster(mut self, dims: Option<[u32; 3]>) -> Self {
        self.cluster = dims;
        self
    }
}

/// A kernel of a loaded [`Module`](super::Module). Cheap to clone; it keeps the runtime (and
/// so its module) alive for as long as any clone lives.
#[derive(Clone)]
pub struct Function {
    pub(super) loaded: Arc<Loaded>,
    /// As [`Module`](super::Module)'s: `None` for a runtime service's kernels.
    pub(super) _runtime: Option<crate::runtime::Nvshmem>,
    pub(super) func: cusys::CUfunction,
    pub(super) name: Arc<str>,
    pub(super) params: Option<Arc<[usize]>>,
}

// SAFETY: a CUfunction is a driver handle usable from any thread with its context current,
// which every method makes sure of; the module it belongs to lives as long as `loaded`.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Function({} in {})", self.name, self.loaded.name)
    }
}

/// A launch configuration of `blocks` blocks of `threads_per_block` threads, in one dimension,
/// without dynamic shared memory. Set `shared_mem_bytes` with struct update syntax:
/// `LaunchConfig { shared_mem_bytes: 4096, ..grid(8, 256) }`.
pub fn grid(blocks: u32, threads_per_block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads_per_block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn check_config(kernel: &str, cfg: &LaunchConfig) -> Result<()> {
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    if g.0 == 0 || g.1 == 0 || g.2 == 0 || b.0 == 0 || b.1 == 0 || b.2 == 0 {
        return Err(Error::InvalidArgument(format!(
            "launch of {kernel} with an empty grid {g:?} or block {b:?}"
        )));
    }
    let threads = b.0 as u64 * b.1 as u64 * b.2 as u64;
    if threads > 1024 {
        return Err(Error::InvalidArgument(format!(
            "launch of {kernel} with {threads} threads per block; CUDA allows at most 1024"
        )));
    }
    Ok(())
}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The size in bytes of each of the kernel's parameters, as the driver reports them
    /// (`None` when it cannot). Launches check the arguments against these.
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// Launch on `stream`: [`launch_with`](Self::launch_with) with default options.
    ///
    /// # Safety
    /// As for [`launch_with`](Self::launch_with).
    pub unsafe fn launch(
        &self,
        cfg: LaunchConfig,
        stream: &Arc<CudaStream>,
        args: &mut KernelArgs,
    ) -> Result<()> {
        self.launch_with(cfg, LaunchOptions::default(), stream, args)
    }

    /// Launch with every block resident at once: [`launch_with`](Self::launch_with) with
    /// [`LaunchOptions::cooperative`]. For kernels that synchronise across blocks or PEs
    /// inside: NVSHMEM barriers and collectives, signals or flags waited on by other blocks or
    /// PEs, `cooperative_groups::this_grid().sync()`.
    ///
    /// Every PE must make the matching launch, or the kernels wait for each other forever.
    ///
    /// # Safety
    /// As for [`launch_with`](Self::launch_with).
    pub unsafe fn launch_collective(
        &self,
        cfg: LaunchConfig,
        stream: &Arc<CudaStream>,
        args: &mut KernelArgs,
    ) -> Result<()> {
        let options = LaunchOptions {
            cooperative: true,
            ..LaunchOptions::default()
        };
        self.launch_with(cfg, options, stream, args)
    }

    /// Launch on `stream` with `options`. The number and sizes of `args` are checked against
    /// the kernel's parameters when the driver reports them, the configuration against
    /// CUDA's limits, the stream against this PE's GPU and, for a cooperative launch, the
    /// grid against what can be resident. A driver failure is an [`Error::Launch`] with the
    /// driver's error as its source.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type, every pointer in
    /// them must be valid for what the kernel does with it, and the memory must stay
    /// allocated until the kernel has finished. A kernel that waits for other blocks or
    /// other PEs (signals, barriers) needs all its blocks resident at once: launch it
    /// cooperatively, or size its grid so that it always fits (as our collectives do, at most
    /// one block per SM, or the occupancy every PE agreed on).
    pub unsafe fn launch_with(
        &self,
        cfg: LaunchConfig,
        options: LaunchOptions,
        stream: &Arc<CudaStream>,
        args: &mut KernelArgs,
    ) -> Result<()> {
        check_config(&self.name, &cfg)?;
        check_device(
            "the launch stream",
            stream.context().ordinal(),
            self.loaded.device,
        )?;
        check_args(&self.name, self.param_sizes(), args.sizes())?;
        if options.cooperative {
            let blocks = cfg.grid_dim.0 as u64 * cfg.grid_dim.1 as u64 * cfg.grid_dim.2 as u64;
            let threads = cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2;
            let max = self.max_resident_blocks(threads, cfg.shared_mem_bytes as usize)?;
            if blocks > max as u64 {
                return Err(Error::InvalidArgument(format!(
                    "collective launch of {} with {blocks} blocks of {threads} threads: at most \
                     {max} can be resident on this GPU (see Function::resident_grid)",
                    self.name
                )));
            }
        }
        self.loaded.enter()?;
        if let Some(c) = options.cluster {
            let (g, fits) = (cfg.grid_dim, |g: u32, c: u32| c > 0 && g.is_multiple_of(c));
            if !(fits(g.0, c[0]) && fits(g.1, c[1]) && fits(g.2, c[2])) {
                return Err(Error::InvalidArgument(format!(
                    "launch of {} with a grid {g:?} that is not a multiple of its clusters {c:?}",
                    self.name
                )));
            }
        }
        // SAFETY: all zeroes is a valid attribute (an id and a union of plain data); each
        // union member written is the one its id selects.
        let mut attrs: [cusys::CUlaunchAttribute; 3] = unsafe { std::mem::zeroed() };
        let mut n_attrs = 0;
        if options.cooperative {
            attrs[n_attrs].id = cusys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            attrs[n_attrs].value.cooperative = 1;
            n_attrs += 1;
        }
        if options.programmatic {
            attrs[n_attrs].id =
                cusys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
            n_attrs += 1;
        }
        if let Some(cluster) = options.cluster {
            attrs[n_attrs] = cluster_attribute(cluster);
            n_attrs += 1;
        }
        let config = driver_config(&cfg, stream.cu_stream(), &mut attrs[..n_attrs]);
        // SAFETY: the pointers point at the argument values, which live until the call
        // returns (the driver copies them); the caller vouches that they match the kernel.
        args.with_pointers(|params| {
            cusys::cuLaunchKernelEx(
                &config,
                self.func,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
        .result()
        .map_err(|source| Error::Launch {
            kernel: self.name.to_string(),
            source,
        })
    }

    /// Let the kernel use up to `bytes` of dynamic shared memory per block (above the 48 KiB
    /// every kernel may use; up to 227 KiB on Hopper). Launches that ask for more fail.
    pub fn set_max_dynamic_shared_memory(&self, bytes: u32) -> Result<()> {
        self.loaded.enter()?;
        // SAFETY: `self.func` is a live function of a loaded module.
        unsafe {
            cusys::cuFuncSetAttribute(
                self.func,
                cusys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .result()
        .map_err(|source| Error::Launch {
            kernel: format!(
                "{} (setting {bytes} bytes of dynamic shared memory)",
                self.name
            ),
            source,
        })
    }

    /// How many clusters of `cluster` blocks, each of `cfg`'s block size and shared memory,
    /// can be resident on the GPU at once (`cuOccupancyMaxActiveClusters`).
    pub fn max_active_clusters(&self, cfg: LaunchConfig, cluster: [u32; 3]) -> Result<u32> {
        self.loaded.enter()?;
        let mut attrs = [cluster_attribute(cluster)];
        let config = driver_config(&cfg, std::ptr::null_mut(), &mut attrs);
        let mut clusters = 0i32;
        // SAFETY: a live function and a valid configuration.
        unsafe { cusys::cuOccupancyMaxActiveClusters(&mut clusters, self.func, &config) }
            .result()
            .during("cuOccupancyMaxActiveClusters")?;
        Ok(clusters.max(0) as u32)
    }

    /// How many blocks of `threads` threads (and `shared_mem` bytes) fit on the GPU at once.
    pub fn max_resident_blocks(&self, threads: u32, shared_mem: usize) -> Result<u32> {
        self.loaded.enter()?;
        // SAFETY: `self.func` is a live function of a loaded module.
        let per_sm = unsafe {
            cu::occupancy::max_active_block_per_multiprocessor(
                self.func,
                threads as i32,
                shared_mem,
            )
        }
        .during("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        let sms = self
            .loaded
            .ctx
            .attribute(cusys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("cuDeviceGetAttribute")?;
        Ok((per_sm.max(0) * sms.max(0)) as u32)
    }

    /// A one-dimensional grid for a cooperative launch: `wanted` blocks of `threads` threads,
    /// or as many as can be resident at once if fewer.
    ///
    /// PEs whose GPUs differ may get different grids; kernels that pair block `b` of one PE
    /// with block `b` of another must agree on the grid (take the minimum over PEs, or size
    /// it to fit the smallest GPU).
    pub fn resident_grid(
        &self,
        wanted: u32,
        threads: u32,
        shared_mem_bytes: u32,
    ) -> Result<LaunchConfig> {
        let max = self.max_resident_blocks(threads, shared_mem_bytes as usize)?;
        if max == 0 {
            return Err(Error::InvalidArgument(format!(
                "not one block of {threads} threads with {shared_mem_bytes} bytes of shared memory \
                 fits on this GPU for {}",
                self.name
            )));
        }
        Ok(LaunchConfig {
            shared_mem_bytes,
            ..grid(wanted.clamp(1, max), threads)
        })
    }

    /// The raw `CUfunction`, valid while this function (or any clone) lives.
    pub fn cu_function(&self) -> cusys::CUfunction {
        self.func
    }
}

/// The launch attribute for thread-block clusters of `x × y × z` blocks.
fn cluster_attribute([x, y, z]: [u32; 3]) -> cusys::CUlaunchAttribute {
    // SAFETY: all zeroes is a valid attribute (an id and a union of plain data); the union
    // member written is the one the id selects.
    let mut attr: cusys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = cusys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = x;
    attr.value.clusterDim.y = y;
    attr.value.clusterDim.z = z;
    attr
}

/// `cfg` as the driver's launch configuration, with `attrs` (which must outlive its use).
fn driver_config(
    cfg: &LaunchConfig,
    stream: cusys::CUstream,
    attrs: &mut [cusys::CUlaunchAttribute],
) -> cusys::CUlaunchConfig {
    cusys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    }
}

/// Whether the driver has `cuFuncGetParamInfo` (CUDA 12.4 and later); cudarc panics when a
/// missing entry point is called, so ask first.
fn have_param_info() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        // SAFETY: only looks the symbol up; the driver library is already loaded.
        unsafe {
            cusys::culib()
                .get::<unsafe extern "C" fn()>(b"cuFuncGetParamInfo\0")
                .is_ok()
        }
    })
}

/// The size in bytes of each parameter of `func`, when the driver can tell.
pub(super) fn param_sizes(func: cusys::CUfunction) -> Option<Arc<[usize]>> {
    if !have_param_info() {
        return None;
    }
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `func` is a live function; the outputs are valid for writes.
        let r = unsafe { cusys::cuFuncGetParamInfo(func, sizes.len(), &mut offset, &mut size) };
        match r {
            cusys::CUresult::CUDA_SUCCESS => sizes.push(size),
            // Past the last parameter.
            cusys::CUresult::CUDA_ERROR_INVALID_VALUE => break,
            _ => return None,
        }
        if sizes.len() > 4096 {
            return None;
        }
    }
    // Zero may also mean "not known for this function": only trust a real layout.
    (!sizes.is_empty()).then(|| sizes.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_and_configs() {
        let cfg = grid(8, 256);
        assert_eq!(
            (cfg.grid_dim, cfg.block_dim, cfg.shared_mem_bytes),
            ((8, 1, 1), (256, 1, 1), 0)
        );
        let with_smem = LaunchConfig {
            shared_mem_bytes: 4096,
            ..grid(2, 128)
        };
        assert_eq!(with_smem.grid_dim.0, 2);
        assert!(check_config("k", &cfg).is_ok());
        assert!(check_config("k", &grid(0, 256)).is_err());
        assert!(check_config("k", &grid(1, 2048)).is_err());
    }
}
