//! Loading cubins that call NVSHMEM device functions, registering them with NVSHMEM, and
//! launching their kernels.
//!
//! A cubin that calls NVSHMEM device functions is linked with `libnvshmem_device.a` (the
//! `nvshmem-build` crate does this from a build script) and has to be registered with
//! `nvshmemx_cumodule_init` before any of its kernels run: [`Module`] loads and registers
//! it, and unregisters and unloads it on drop.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::module::{grid, KernelArgs, Module};
//! // In a crate whose build.rs calls nvshmem_build::build_kernels("kernels"):
//! // mod kernels { include!(concat!(env!("OUT_DIR"), "/kernels.rs")); }
//! # mod kernels { pub const MY_KERNELS: nvshmem::module::CubinSet = nvshmem::module::CubinSet::new("my_kernels", &[]); }
//! let shmem = nvshmem::Nvshmem::init()?;
//! let module = Module::load(&shmem, &kernels::MY_KERNELS)?;
//! let scale = module.function("scale")?; // extern "C" __global__ void scale(float*, size_t, float)
//! let buf = shmem.calloc::<f32>(1 << 20)?;
//! let mut args = KernelArgs::new();
//! args.buffer(&buf).value(buf.len()).value(2.0f32);
//! // SAFETY: the arguments match the kernel's parameters, and the kernel stays within `buf`.
//! unsafe { scale.launch(grid(1024, 256), shmem.stream(), &mut args)? };
//! # Ok(()) }
//! ```

use crate::buffer::{SymmetricBuffer, SymmetricView};
use crate::element::Element;
use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, sys as cusys, CudaStream, LaunchConfig};
use nvshmem_sys as sys;
use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::path::Path;
use std::sync::OnceLock;

/// One linked cubin for one GPU architecture.
#[derive(Debug, Clone, Copy)]
pub struct CubinImage {
    /// Compute capability times ten (90 for sm_90).
    pub capability: u32,
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
    /// version, the highest minor not above the device's.
    pub fn image_for(&self, major: i32, minor: i32) -> Result<&'static CubinImage> {
        let cc = (major * 10 + minor) as u32;
        self.images
            .iter()
            .filter(|i| i.capability / 10 == major as u32 && i.capability <= cc)
            .max_by_key(|i| i.capability)
            .ok_or_else(|| {
                let built: Vec<String> = self
                    .images
                    .iter()
                    .map(|i| format!("sm_{}", i.capability))
                    .collect();
                Error::Module(format!(
                    "{} has no cubin for this GPU (sm_{cc}); it was built for [{}]. Rebuild with \
                     NVSHMEM_RS_CUDA_ARCHS=sm_{cc}",
                    self.name,
                    built.join(", ")
                ))
            })
    }
}

enum Handle {
    Module(cusys::CUmodule),
    Library(cusys::CUlibrary),
}

/// A loaded cubin registered with NVSHMEM (its device state initialised), unregistered and
/// unloaded on drop.
///
/// Dropping a module waits for all work on this PE's GPU to finish first, so no kernel of
/// it is still running when its code is unloaded.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::module::{grid, KernelArgs, Module};
/// let shmem = nvshmem::Nvshmem::init()?;
/// let module = Module::from_file(&shmem, "my_kernels.cubin")?;
/// let kernel = module.function("my_kernel")?;
/// let buf = shmem.calloc::<f32>(256)?;
/// let mut args = KernelArgs::new();
/// args.buffer(&buf).value(256u64);
/// unsafe { kernel.launch(grid(1, 256), shmem.stream(), &mut args)? };
/// shmem.stream().synchronize().unwrap();
/// # Ok(()) }
/// ```
pub struct Module {
    handle: Handle,
    name: String,
    shmem: Nvshmem,
}

// SAFETY: the handles are driver objects usable from any thread once the context is current,
// which every method makes sure of (`Nvshmem::enter`).
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Module({})", self.name)
    }
}

/// Copy into 8-byte-aligned storage: the loader reads the ELF image in place.
fn aligned_copy(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8) + 1];
    // SAFETY: `words` holds at least `bytes.len()` bytes and does not overlap `bytes`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr() as *mut u8, bytes.len())
    };
    words
}

impl Module {
    /// Load the image of `set` that fits this PE's GPU, as a `CUmodule`, and register it.
    pub fn load(shmem: &Nvshmem, set: &CubinSet) -> Result<Self> {
        let image = Self::image(shmem, set)?;
        Self::from_bytes_named(shmem, image.bytes, set.name())
    }

    /// Load the image of `set` that fits this PE's GPU as a context-independent `CUlibrary`
    /// and register it with `nvshmemx_culibrary_init`.
    pub fn load_library(shmem: &Nvshmem, set: &CubinSet) -> Result<Self> {
        let image = Self::image(shmem, set)?;
        Self::library_named(shmem, image.bytes, set.name())
    }

    fn image(shmem: &Nvshmem, set: &CubinSet) -> Result<&'static CubinImage> {
        let (major, minor) = shmem
            .context()
            .compute_capability()
            .during("cuDeviceGetAttribute")?;
        set.image_for(major, minor)
    }

    /// Load a linked cubin (or a fatbin of them) from memory as a `CUmodule` and register it.
    pub fn from_bytes(shmem: &Nvshmem, bytes: &[u8]) -> Result<Self> {
        Self::from_bytes_named(shmem, bytes, "<bytes>")
    }

    /// Load a linked cubin from a file as a `CUmodule` and register it.
    pub fn from_file(shmem: &Nvshmem, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Module(format!("cannot read {}: {e}", path.display())))?;
        Self::from_bytes_named(shmem, &bytes, &path.display().to_string())
    }

    fn from_bytes_named(shmem: &Nvshmem, bytes: &[u8], name: &str) -> Result<Self> {
        check_image(bytes, name)?;
        shmem.enter()?;
        let image = aligned_copy(bytes);
        // SAFETY: `image` is a complete, aligned image that outlives the call.
        let module =
            unsafe { cu::module::load_data(image.as_ptr() as *const c_void) }.map_err(|e| {
                Error::Module(format!(
                "cuModuleLoadData({name}) failed: {e:?}; was it built for this GPU's architecture \
                 (NVSHMEM_RS_CUDA_ARCHS) and linked with nvlink against libnvshmem_device.a?"
            ))
            })?;
        // SAFETY: `module` was just loaded in the current context.
        let status = unsafe { sys::nvshmemx_cumodule_init(module as sys::CUmodule) };
        if status != 0 {
            // SAFETY: nothing else refers to the module yet.
            unsafe {
                let _ = cu::module::unload(module);
            }
            return Err(Error::Module(init_failure(
                "nvshmemx_cumodule_init",
                name,
                status,
                shmem,
            )));
        }
        Ok(Module {
            handle: Handle::Module(module),
            name: name.to_string(),
            shmem: shmem.clone(),
        })
    }

    /// Load a linked cubin as a context-independent `CUlibrary` and register it with
    /// `nvshmemx_culibrary_init`.
    pub fn library_from_bytes(shmem: &Nvshmem, bytes: &[u8]) -> Result<Self> {
        Self::library_named(shmem, bytes, "<library>")
    }

    fn library_named(shmem: &Nvshmem, bytes: &[u8], name: &str) -> Result<Self> {
        check_image(bytes, name)?;
        shmem.enter()?;
        let image = aligned_copy(bytes);
        let mut lib: cusys::CUlibrary = std::ptr::null_mut();
        // SAFETY: `image` is a complete, aligned image; no options are passed.
        unsafe {
            cusys::cuLibraryLoadData(
                &mut lib,
                image.as_ptr() as *const c_void,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
            .result()
            .during("cuLibraryLoadData")?;
        }
        // SAFETY: `lib` was just loaded.
        let status = unsafe { sys::nvshmemx_culibrary_init(lib as sys::CUlibrary) };
        if status != 0 {
            // SAFETY: nothing else refers to the library yet.
            unsafe {
                let _ = cusys::cuLibraryUnload(lib);
            }
            return Err(Error::Module(init_failure(
                "nvshmemx_culibrary_init",
                name,
                status,
                shmem,
            )));
        }
        Ok(Module {
            handle: Handle::Library(lib),
            name: name.to_string(),
            shmem: shmem.clone(),
        })
    }

    /// The name the module was loaded under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The runtime the module is registered with.
    pub fn runtime(&self) -> &Nvshmem {
        &self.shmem
    }

    /// Look up a kernel by its `extern "C"` name.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?} has a NUL")))?;
        self.shmem.enter()?;
        let not_found = |e| {
            Error::Module(format!(
                "no kernel `{name}` in {}: {e:?}; kernels must be declared extern \"C\" __global__ \
                 (a C++ name is mangled)",
                self.name
            ))
        };
        // SAFETY: the handle is live for `self`'s lifetime and `cname` is NUL-terminated.
        let func = match self.handle {
            Handle::Module(m) => {
                unsafe { cu::module::get_function(m, cname) }.map_err(not_found)?
            }
            Handle::Library(l) => unsafe {
                let mut kernel: cusys::CUkernel = std::ptr::null_mut();
                cusys::cuLibraryGetKernel(&mut kernel, l, cname.as_ptr())
                    .result()
                    .map_err(not_found)?;
                let mut f: cusys::CUfunction = std::ptr::null_mut();
                cusys::cuKernelGetFunction(&mut f, kernel)
                    .result()
                    .map_err(not_found)?;
                f
            },
        };
        Ok(Function {
            func,
            name: name.to_string(),
            params: param_sizes(func),
            module: self,
        })
    }
}

fn init_failure(call: &str, name: &str, status: i32, shmem: &Nvshmem) -> String {
    format!(
        "{call}({name}) returned {status}: the cubin must be linked (nvlink) against the \
         libnvshmem_device.a of the same NVSHMEM release as the host library running it ({}); \
         rebuild the kernels against it, or point LD_LIBRARY_PATH at the NVSHMEM they were built \
         with. NVSHMEM_DEBUG=WARN shows NVSHMEM's own explanation",
        shmem.version()
    )
}

impl Drop for Module {
    fn drop(&mut self) {
        // Kernels of this module may still run on any stream: wait for all of them.
        let _ = self.shmem.enter();
        let _ = self.shmem.context().synchronize();
        // SAFETY: no kernel of the module is running, and no `Function` outlives `self`.
        unsafe {
            match self.handle {
                Handle::Module(m) => {
                    sys::nvshmemx_cumodule_finalize(m as sys::CUmodule);
                    let _ = cu::module::unload(m);
                }
                Handle::Library(l) => {
                    sys::nvshmemx_culibrary_finalize(l as sys::CUlibrary);
                    let _ = cusys::cuLibraryUnload(l);
                }
            }
        }
    }
}

/// Accept ELF cubins for NVIDIA GPUs and fatbins; refuse anything else with a reason.
fn check_image(bytes: &[u8], name: &str) -> Result<()> {
    const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    const EM_CUDA: u16 = 190;
    if bytes.len() >= 16 && bytes[..4] == FATBIN_MAGIC {
        return Ok(());
    }
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Err(Error::Module(format!(
            "{name} is not a cubin (no ELF header)"
        )));
    }
    let machine = u16::from_le_bytes([bytes[0x12], bytes[0x13]]);
    if bytes[5] != 1 || machine != EM_CUDA {
        return Err(Error::Module(format!(
            "{name} is an ELF file for another machine ({machine}), not a cubin for an NVIDIA GPU"
        )));
    }
    Ok(())
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
fn param_sizes(func: cusys::CUfunction) -> Option<Vec<usize>> {
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
    (!sizes.is_empty()).then_some(sizes)
}

/// Kernel arguments, in order. Each value is copied when added and kept until the launch;
/// buffers and views stay borrowed for as long as the arguments live.
///
/// ```
/// use nvshmem::module::KernelArgs;
/// let mut args = KernelArgs::new();
/// args.value(1024usize).value(0.5f32).value(7u64);
/// assert_eq!(args.sizes(), [8, 4, 8]);
/// ```
#[derive(Default)]
pub struct KernelArgs<'a> {
    values: Vec<Box<[u64]>>,
    sizes: Vec<usize>,
    _borrows: PhantomData<&'a ()>,
}

impl<'a> KernelArgs<'a> {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a plain value: an integer, a float, a device address, or a `#[repr(C)]` struct
    /// laid out as the kernel's parameter type.
    pub fn value<T: Copy + 'static>(&mut self, v: T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        let mut slot = vec![0u64; size.div_ceil(8).max(1)].into_boxed_slice();
        // SAFETY: the slot holds at least `size` bytes; unaligned writes need no alignment.
        unsafe { std::ptr::write_unaligned(slot.as_mut_ptr() as *mut T, v) };
        self.values.push(slot);
        self.sizes.push(size);
        self
    }

    /// Append the device address of this PE's copy of `buf` (a `T*` parameter).
    pub fn buffer<T: Element>(&mut self, buf: &'a SymmetricBuffer<T>) -> &mut Self {
        self.value(buf.as_ptr() as u64)
    }

    /// Append the device address of the first element of `view` (a `T*` parameter).
    pub fn view<T: Element>(&mut self, view: SymmetricView<'a, T>) -> &mut Self {
        self.value(view.as_ptr() as u64)
    }

    /// Append `buf`'s address and its number of elements (`T*, size_t` parameters).
    pub fn buffer_and_len<T: Element>(&mut self, buf: &'a SymmetricBuffer<T>) -> &mut Self {
        self.buffer(buf).value(buf.len())
    }

    /// Append a raw device address.
    pub fn device_ptr(&mut self, address: u64) -> &mut Self {
        self.value(address)
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The size in bytes of each argument.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    fn pointers(&mut self) -> Vec<*mut c_void> {
        self.values
            .iter_mut()
            .map(|b| b.as_mut_ptr() as *mut c_void)
            .collect()
    }
}

/// Check arguments against the kernel's parameter sizes (when the driver reports them): a
/// wrong count or size would make the driver read past an argument.
fn check_args(kernel: &str, params: Option<&[usize]>, args: &[usize]) -> Result<()> {
    let Some(params) = params else { return Ok(()) };
    if params.len() != args.len() {
        return Err(Error::InvalidArgument(format!(
            "kernel {kernel} takes {} parameters, but {} arguments were given",
            params.len(),
            args.len()
        )));
    }
    if let Some(i) = (0..params.len()).find(|&i| params[i] != args[i]) {
        return Err(Error::InvalidArgument(format!(
            "argument {i} of kernel {kernel} is {} bytes, but the parameter is {} bytes (pass u64 or \
             usize for pointers and size_t, i32/u32 for int, f32 for float)",
            args[i], params[i]
        )));
    }
    Ok(())
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

/// The stream must run on this PE's GPU, where the module is loaded.
fn check_stream(kernel: &str, shmem: &Nvshmem, stream: &CudaStream) -> Result<()> {
    let ordinal = stream.context().ordinal();
    if ordinal != shmem.device_ordinal() {
        return Err(Error::InvalidArgument(format!(
            "launch of {kernel} on a stream of GPU {ordinal}, but the module is loaded on this PE's GPU {}",
            shmem.device_ordinal()
        )));
    }
    Ok(())
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

/// A kernel of a loaded [`Module`].
pub struct Function<'m> {
    func: cusys::CUfunction,
    name: String,
    params: Option<Vec<usize>>,
    module: &'m Module,
}

impl std::fmt::Debug for Function<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Function({} in {})", self.name, self.module.name)
    }
}

impl Function<'_> {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The size in bytes of each of the kernel's parameters, as the driver reports them
    /// (`None` when it cannot). Launches check the arguments against these.
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// Launch on `stream`.
    ///
    /// The number and sizes of `args` are checked against the kernel's parameters when the
    /// driver reports them, and the launch configuration against CUDA's limits.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type, every pointer in
    /// them must be valid for what the kernel does with it, and the memory must stay
    /// allocated until the kernel has finished. A kernel that waits for other blocks or
    /// other PEs (signals, barriers) must use [`launch_collective`](Self::launch_collective).
    pub unsafe fn launch(
        &self,
        cfg: LaunchConfig,
        stream: &CudaStream,
        args: &mut KernelArgs,
    ) -> Result<()> {
        check_config(&self.name, &cfg)?;
        check_stream(&self.name, &self.module.shmem, stream)?;
        check_args(&self.name, self.param_sizes(), args.sizes())?;
        self.module.shmem.enter()?;
        let mut params = args.pointers();
        cu::launch_kernel(
            self.func,
            cfg.grid_dim,
            cfg.block_dim,
            cfg.shared_mem_bytes,
            stream.cu_stream(),
            &mut params,
        )
        .map_err(|e| Error::Module(format!("launch of {} failed: {e:?}", self.name)))
    }

    /// Launch with every block resident at once (a cooperative launch, as
    /// `nvshmemx_collective_launch` does), for kernels that synchronise across blocks or PEs
    /// inside: NVSHMEM barriers and collectives, signals or flags waited on by other blocks or
    /// PEs, `cooperative_groups::this_grid().sync()`. Fails with an error, instead of
    /// deadlocking, when the grid cannot be co-resident.
    ///
    /// Every PE must make the matching launch, or the kernels wait for each other forever.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch).
    pub unsafe fn launch_collective(
        &self,
        cfg: LaunchConfig,
        stream: &CudaStream,
        args: &mut KernelArgs,
    ) -> Result<()> {
        check_config(&self.name, &cfg)?;
        check_stream(&self.name, &self.module.shmem, stream)?;
        check_args(&self.name, self.param_sizes(), args.sizes())?;
        let blocks = cfg.grid_dim.0 as u64 * cfg.grid_dim.1 as u64 * cfg.grid_dim.2 as u64;
        let threads = cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2;
        let max = self.max_resident_blocks(threads, cfg.shared_mem_bytes as usize)?;
        if blocks > max as u64 {
            return Err(Error::InvalidArgument(format!(
                "collective launch of {} with {blocks} blocks of {threads} threads: at most {max} \
                 can be resident on this GPU (see Function::resident_grid)",
                self.name
            )));
        }
        self.module.shmem.enter()?;
        let mut params = args.pointers();
        cu::launch_cooperative_kernel(
            self.func,
            cfg.grid_dim,
            cfg.block_dim,
            cfg.shared_mem_bytes,
            stream.cu_stream(),
            &mut params,
        )
        .map_err(|e| Error::Module(format!("cooperative launch of {} failed: {e:?}", self.name)))
    }

    /// How many blocks of `threads` threads (and `shared_mem` bytes) fit on the GPU at once.
    pub fn max_resident_blocks(&self, threads: u32, shared_mem: usize) -> Result<u32> {
        self.module.shmem.enter()?;
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
            .module
            .shmem
            .context()
            .attribute(cusys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("cuDeviceGetAttribute")?;
        Ok((per_sm.max(0) * sms.max(0)) as u32)
    }

    /// A one-dimensional grid for [`launch_collective`](Self::launch_collective): `wanted`
    /// blocks of `threads` threads, or as many as can be resident at once if fewer.
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

    /// The raw `CUfunction`, valid while the module is loaded.
    pub fn cu_function(&self) -> cusys::CUfunction {
        self.func
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static IMAGES: [CubinImage; 2] = [
        CubinImage {
            capability: 80,
            bytes: b"a",
        },
        CubinImage {
            capability: 90,
            bytes: b"b",
        },
    ];

    #[test]
    fn picks_the_image_of_the_gpu_major_version() {
        let set = CubinSet::new("k", &IMAGES);
        assert_eq!(set.image_for(9, 0).unwrap().capability, 90);
        assert_eq!(set.image_for(8, 6).unwrap().capability, 80);
        let e = set.image_for(10, 0).unwrap_err().to_string();
        assert!(
            e.contains("sm_100") && e.contains("NVSHMEM_RS_CUDA_ARCHS"),
            "{e}"
        );
    }

    #[test]
    fn kernel_args_keep_values_in_order() {
        let mut a = KernelArgs::new();
        #[derive(Clone, Copy)]
        #[repr(C)]
        struct Big {
            x: [u32; 5],
        }
        a.value(7u32)
            .value(-1i64)
            .value(2.5f32)
            .value(Big { x: [1, 2, 3, 4, 5] });
        assert_eq!(a.len(), 4);
        assert_eq!(a.sizes(), [4, 8, 4, 20]);
        let p = a.pointers();
        unsafe {
            assert_eq!(*(p[0] as *const u32), 7);
            assert_eq!(*(p[1] as *const i64), -1);
            assert_eq!(*(p[2] as *const f32), 2.5);
            assert_eq!((*(p[3] as *const Big)).x, [1, 2, 3, 4, 5]);
        }
        // Zero-sized values still get a slot to point at.
        a.value(());
        assert_eq!(a.sizes()[4], 0);
        assert!(!a.pointers()[4].is_null());
    }

    #[test]
    fn arguments_are_checked_against_the_parameter_layout() {
        assert!(check_args("k", None, &[4, 8]).is_ok());
        assert!(check_args("k", Some(&[8, 8, 4]), &[8, 8, 4]).is_ok());
        let e = check_args("k", Some(&[8, 8]), &[8])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("takes 2 parameters") && e.contains("1 arguments"),
            "{e}"
        );
        let e = check_args("k", Some(&[8, 8]), &[8, 4])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("argument 1") && e.contains("4 bytes") && e.contains("8 bytes"),
            "{e}"
        );
    }

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
}
