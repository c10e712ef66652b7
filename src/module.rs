//! Loading cubins that call NVSHMEM device functions, registering them with NVSHMEM, and
//! launching their kernels.

use crate::buffer::SymmetricBuffer;
use crate::element::Element;
use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, sys as cusys, CudaStream, LaunchConfig};
use nvshmem_sys as sys;
use std::ffi::{c_void, CString};
use std::path::Path;

/// One linked cubin for one GPU architecture.
#[derive(Debug, Clone, Copy)]
pub struct CubinImage {
    /// Compute capability times ten (90 for sm_90).
    pub capability: u32,
    pub bytes: &'static [u8],
}

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
                let built: Vec<String> = self.images.iter().map(|i| format!("sm_{}", i.capability)).collect();
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
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::module::{KernelArgs, Module};
/// let shmem = nvshmem::Nvshmem::init()?;
/// let module = Module::from_file(&shmem, "my_kernels.cubin")?;
/// let kernel = module.function("my_kernel")?;
/// let buf = shmem.calloc::<f32>(256)?;
/// let mut args = KernelArgs::new();
/// args.buffer(&buf).value(256u64);
/// unsafe { kernel.launch(nvshmem::LaunchConfig::for_num_elems(256), shmem.stream(), &mut args)? };
/// shmem.stream().synchronize().unwrap();
/// # Ok(()) }
/// ```
pub struct Module {
    handle: Handle,
    name: String,
    shmem: Nvshmem,
}

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
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr() as *mut u8, bytes.len()) };
    words
}

impl Module {
    /// Load the image of `set` that fits this PE's GPU, as a `CUmodule`.
    pub fn load(shmem: &Nvshmem, set: &CubinSet) -> Result<Self> {
        let (major, minor) = shmem.context().compute_capability().during("cuDeviceGetAttribute")?;
        let image = set.image_for(major, minor)?;
        Self::from_bytes_named(shmem, image.bytes, set.name())
    }

    /// Load a linked cubin (or fatbin) from memory as a `CUmodule` and register it.
    pub fn from_bytes(shmem: &Nvshmem, bytes: &[u8]) -> Result<Self> {
        Self::from_bytes_named(shmem, bytes, "<bytes>")
    }

    /// Load a linked cubin from a file as a `CUmodule` and register it.
    pub fn from_file(shmem: &Nvshmem, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::Module(format!("cannot read {}: {e}", path.display())))?;
        Self::from_bytes_named(shmem, &bytes, &path.display().to_string())
    }

    fn from_bytes_named(shmem: &Nvshmem, bytes: &[u8], name: &str) -> Result<Self> {
        check_elf(bytes, name)?;
        shmem.enter()?;
        let image = aligned_copy(bytes);
        let module = unsafe { cu::module::load_data(image.as_ptr() as *const c_void) }.map_err(|e| {
            Error::Module(format!(
                "cuModuleLoadData({name}) failed: {e:?}; was it built for this GPU's architecture \
                 and linked with nvlink against libnvshmem_device.a?"
            ))
        })?;
        let status = unsafe { sys::nvshmemx_cumodule_init(module as sys::CUmodule) };
        if status != 0 {
            unsafe {
                let _ = cu::module::unload(module);
            }
            return Err(Error::Module(format!(
                "nvshmemx_cumodule_init({name}) returned {status}: the cubin must be linked against \
                 the libnvshmem_device.a of the same NVSHMEM release as the host library ({})",
                shmem.version()
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
        check_elf(bytes, "<library>")?;
        shmem.enter()?;
        let image = aligned_copy(bytes);
        let mut lib: cusys::CUlibrary = std::ptr::null_mut();
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
        let status = unsafe { sys::nvshmemx_culibrary_init(lib as sys::CUlibrary) };
        if status != 0 {
            unsafe {
                let _ = cusys::cuLibraryUnload(lib);
            }
            return Err(Error::Module(format!("nvshmemx_culibrary_init returned {status}")));
        }
        Ok(Module {
            handle: Handle::Library(lib),
            name: "<library>".into(),
            shmem: shmem.clone(),
        })
    }

    /// The name the module was loaded under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Look up a kernel by its `extern "C"` name.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let cname = CString::new(name).map_err(|_| Error::InvalidArgument(format!("kernel name {name:?} has a NUL")))?;
        self.shmem.enter()?;
        let not_found = |e| Error::Module(format!("no kernel `{name}` in {}: {e:?}", self.name));
        let func = match self.handle {
            Handle::Module(m) => unsafe { cu::module::get_function(m, cname) }.map_err(not_found)?,
            Handle::Library(l) => unsafe {
                let mut kernel: cusys::CUkernel = std::ptr::null_mut();
                cusys::cuLibraryGetKernel(&mut kernel, l, cname.as_ptr()).result().map_err(not_found)?;
                let mut f: cusys::CUfunction = std::ptr::null_mut();
                cusys::cuKernelGetFunction(&mut f, kernel).result().map_err(not_found)?;
                f
            },
        };
        Ok(Function {
            func,
            name: name.to_string(),
            module: self,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.shmem.enter();
        let _ = self.shmem.stream().synchronize();
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

fn check_elf(bytes: &[u8], name: &str) -> Result<()> {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Err(Error::Module(format!("{name} is not a cubin (no ELF header)")));
    }
    Ok(())
}

/// Kernel arguments, copied in order. Each value is kept until the launch.
#[derive(Default)]
pub struct KernelArgs {
    values: Vec<Box<[u64; 2]>>,
}

impl KernelArgs {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a plain value (integer, float, device pointer, small `#[repr(C)]` struct of at
    /// most 16 bytes).
    pub fn value<T: Copy + 'static>(&mut self, v: T) -> &mut Self {
        assert!(
            std::mem::size_of::<T>() <= 16 && std::mem::align_of::<T>() <= 8,
            "kernel argument of {} bytes (align {}) does not fit; pass a device pointer",
            std::mem::size_of::<T>(),
            std::mem::align_of::<T>()
        );
        let mut slot = Box::new([0u64; 2]);
        unsafe { std::ptr::write(slot.as_mut_ptr() as *mut T, v) };
        self.values.push(slot);
        self
    }

    /// Append the device address of this PE's copy of `buf`.
    pub fn buffer<T: Element>(&mut self, buf: &SymmetricBuffer<T>) -> &mut Self {
        self.value(buf.as_ptr())
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    fn pointers(&mut self) -> Vec<*mut c_void> {
        self.values.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void).collect()
    }
}

/// A kernel of a loaded [`Module`].
pub struct Function<'m> {
    func: cusys::CUfunction,
    name: String,
    module: &'m Module,
}

impl Function<'_> {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Launch on `stream`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type, and every
    /// pointer in them must be valid for what the kernel does with it.
    pub unsafe fn launch(&self, cfg: LaunchConfig, stream: &CudaStream, args: &mut KernelArgs) -> Result<()> {
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

    /// Launch with every block resident at once, for kernels that synchronise across blocks
    /// or PEs inside (NVSHMEM barriers, signals waited on by other blocks). Fails with an
    /// error, instead of deadlocking, when the grid cannot be co-resident.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch).
    pub unsafe fn launch_collective(&self, cfg: LaunchConfig, stream: &CudaStream, args: &mut KernelArgs) -> Result<()> {
        let blocks = cfg.grid_dim.0 as u64 * cfg.grid_dim.1 as u64 * cfg.grid_dim.2 as u64;
        let threads = cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2;
        let max = self.max_resident_blocks(threads, cfg.shared_mem_bytes as usize)?;
        if blocks > max as u64 {
            return Err(Error::InvalidArgument(format!(
                "collective launch of {} with {blocks} blocks of {threads} threads: at most {max} \
                 can be resident on this GPU",
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
        let per_sm = unsafe { cu::occupancy::max_active_block_per_multiprocessor(self.func, threads as i32, shared_mem) }
            .during("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        let sms = self
            .module
            .shmem
            .context()
            .attribute(cusys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("cuDeviceGetAttribute")?;
        Ok((per_sm.max(0) * sms.max(0)) as u32)
    }

    /// The raw `CUfunction`.
    pub fn cu_function(&self) -> cusys::CUfunction {
        self.func
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static IMAGES: [CubinImage; 2] = [
        CubinImage { capability: 80, bytes: b"a" },
        CubinImage { capability: 90, bytes: b"b" },
    ];

    #[test]
    fn picks_the_image_of_the_gpu_major_version() {
        let set = CubinSet::new("k", &IMAGES);
        assert_eq!(set.image_for(9, 0).unwrap().capability, 90);
        assert_eq!(set.image_for(8, 6).unwrap().capability, 80);
        let e = set.image_for(10, 0).unwrap_err().to_string();
        assert!(e.contains("sm_100") && e.contains("NVSHMEM_RS_CUDA_ARCHS"), "{e}");
    }

    #[test]
    fn kernel_args_keep_values_in_order() {
        let mut a = KernelArgs::new();
        a.value(7u32).value(-1i64).value(2.5f32);
        assert_eq!(a.len(), 3);
        let p = a.pointers();
        unsafe {
            assert_eq!(*(p[0] as *const u32), 7);
            assert_eq!(*(p[1] as *const i64), -1);
            assert_eq!(*(p[2] as *const f32), 2.5);
        }
    }

    #[test]
    fn non_elf_images_are_refused() {
        assert!(check_elf(b"not a cubin", "x").is_err());
    }
}
