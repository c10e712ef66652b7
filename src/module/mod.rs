//! Loading cubins that call NVSHMEM device functions, registering them with NVSHMEM, and
//! launching their kernels.
//!
//! A cubin that calls NVSHMEM device functions is linked with `libnvshmem_device.a` (the
//! `nvshmem-build` crate does this from a build script) and has to be registered with
//! `nvshmemx_cumodule_init` before any of its kernels run: [`Module`] loads and registers
//! it, once per runtime (loading the same image again returns the loaded module), and it
//! stays loaded until the runtime ends. A cubin that links no NVSHMEM device code (a whole
//! program such as a CUTLASS GEMM: no `nvshmemi_device_state_d`) is loaded without
//! registering. Every launch goes through [`Function::launch_with`].
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

mod args;
mod cubin;
mod function;

pub use args::KernelArgs;
pub use cubin::{Aligned, CubinImage, CubinSet};
pub use function::{grid, Function, LaunchOptions};

use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::{library_version, lock_letting_go, Nvshmem};
use cubin::{aligned_copy, check_image};
use cudarc::driver::{result as cu, sys as cusys, CudaContext, DriverError};
use nvshmem_sys as sys;
use std::ffi::{c_void, CString};
use std::path::Path;
use std::sync::Arc;

enum Handle {
    Module(cusys::CUmodule),
    Library(cusys::CUlibrary),
}

/// A registered cubin, held by the runtime's module cache; unregistered and unloaded when the
/// runtime ends (after its services, before NVSHMEM is finalised).
///
/// Never sooner: unloading waits for every kernel on the GPU, on every stream, and the
/// driver holds back this process's other launches meanwhile. When another thread's kernel
/// waits for another PE, and that PE for a launch held back here, the PEs deadlock (a stack
/// dump of a hung stress check showed a page pool's drop in `cuModuleUnload` with every other
/// thread's launch blocked).
pub(crate) struct Loaded {
    handle: Handle,
    /// Registered with NVSHMEM (it links NVSHMEM's device library), so unregistered on drop.
    registered: bool,
    name: String,
    ctx: Arc<CudaContext>,
    device: usize,
}

// SAFETY: the handles are driver objects usable from any thread once the context is current,
// which every use makes sure of (`Loaded::enter`).
unsafe impl Send for Loaded {}
unsafe impl Sync for Loaded {}

impl Loaded {
    fn enter(&self) -> Result<()> {
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // Kernels of this module may still run on any stream: wait for all of them.
        let _ = self.enter();
        if crate::runtime::check_not_stranded().is_err() {
            // The GPU never becomes idle (a wait for the other PEs gave up): leave it loaded.
            return;
        }
        if let Err(e) = self.ctx.synchronize() {
            // A kernel of the module may still run (a stream of the context being captured,
            // a sticky error): unloading it under the kernel would be worse than the leak.
            crate::diag::warn_pe!(
                None,
                "leaving a kernel module loaded: cuCtxSynchronize failed: {e:?}"
            );
            return;
        }
        let _host = crate::runtime::host_call();
        // SAFETY: no kernel of the module is running, and no function refers to it any more.
        unsafe {
            match self.handle {
                Handle::Module(m) if self.registered => {
                    sys::nvshmemx_cumodule_finalize(m as sys::CUmodule);
                }
                Handle::Library(l) if self.registered => {
                    sys::nvshmemx_culibrary_finalize(l as sys::CUlibrary);
                }
                _ => {}
            }
            self.handle.unload();
        }
    }
}

/// NVSHMEM's device state, which a cubin linked with `libnvshmem_device.a` defines
/// (`nvshmem_build::DEVICE_STATE_SYMBOL`).
const DEVICE_STATE: &std::ffi::CStr = c"nvshmemi_device_state_d";

impl Handle {
    /// Whether the image links NVSHMEM's device library: a whole-program cubin that calls no
    /// NVSHMEM device function (a CUTLASS GEMM, say) has no device state to register.
    ///
    /// # Safety
    /// A live handle, its context current.
    unsafe fn links_nvshmem(&self) -> bool {
        let (mut address, mut size) = (0 as cusys::CUdeviceptr, 0usize);
        let r = match *self {
            Handle::Module(m) => {
                cusys::cuModuleGetGlobal_v2(&mut address, &mut size, m, DEVICE_STATE.as_ptr())
            }
            Handle::Library(l) => {
                cusys::cuLibraryGetGlobal(&mut address, &mut size, l, DEVICE_STATE.as_ptr())
            }
        };
        r != cusys::CUresult::CUDA_ERROR_NOT_FOUND
    }

    /// Load every kernel of a module now, not at its first lookup or launch. Under lazy
    /// loading (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA 12.2) a kernel loads when it
    /// is first looked up, and loading may wait for the whole GPU. Beside another thread's
    /// kernel that waits for another PE, that wait can stall both PEs. A driver without
    /// `cuModuleEnumerateFunctions` (before CUDA 12.4) keeps its own way.
    ///
    /// # Safety
    /// A live handle, its context current.
    unsafe fn load_every_kernel(&self) -> std::result::Result<(), DriverError> {
        let Handle::Module(m) = *self else {
            return Ok(());
        };
        let mut count = 0u32;
        if cusys::cuModuleGetFunctionCount(&mut count, m)
            .result()
            .is_err()
        {
            return Ok(());
        }
        let mut functions = vec![std::ptr::null_mut(); count as usize];
        cusys::cuModuleEnumerateFunctions(functions.as_mut_ptr(), count, m).result()?;
        functions
            .into_iter()
            .try_for_each(|f| cusys::cuFuncLoad(f).result())
    }

    /// # Safety
    /// Nothing may use the handle afterwards.
    unsafe fn unload(&self) {
        match *self {
            Handle::Module(m) => {
                let _ = cu::module::unload(m);
            }
            Handle::Library(l) => {
                let _ = cusys::cuLibraryUnload(l);
            }
        }
    }
}

/// A loaded cubin registered with NVSHMEM (its device state initialised). Cheap to clone.
///
/// A runtime loads each image once: loading it again (the same bytes, the same form) returns
/// the module already loaded. It stays loaded until the runtime ends, also after every
/// `Module` and [`Function`] of it are gone: unloading waits for all work on the GPU, which
/// other threads' kernels that wait for other PEs could turn into a deadlock across PEs.
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
#[derive(Clone)]
pub struct Module {
    loaded: Arc<Loaded>,
    /// Keeps NVSHMEM running while the module is used. `None` for a runtime service's
    /// modules, which must not keep the runtime alive.
    runtime: Option<Nvshmem>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Module({})", self.loaded.name)
    }
}

fn module_error(name: &str, message: String, source: Option<DriverError>) -> Error {
    Error::Module {
        module: name.to_string(),
        message,
        source,
    }
}

impl Module {
    /// Load the image of `set` that fits this PE's GPU, as a `CUmodule`, and register it.
    pub fn load(shmem: &Nvshmem, set: &CubinSet) -> Result<Self> {
        let image = image(shmem, set)?;
        Self::register(shmem, image.bytes, set.name(), Kind::Module, true)
    }

    /// [`load`](Self::load) for a runtime service, which must not keep the runtime alive.
    pub(crate) fn load_for_service(shmem: &Nvshmem, set: &CubinSet) -> Result<Self> {
        let image = image(shmem, set)?;
        Self::register(shmem, image.bytes, set.name(), Kind::Module, false)
    }

    /// Load the image of `set` that fits this PE's GPU as a context-independent `CUlibrary`
    /// and register it with `nvshmemx_culibrary_init`.
    pub fn load_library(shmem: &Nvshmem, set: &CubinSet) -> Result<Self> {
        let image = image(shmem, set)?;
        Self::register(shmem, image.bytes, set.name(), Kind::Library, true)
    }

    /// Load a linked cubin (or a fatbin of them) from memory as a `CUmodule` and register it.
    pub fn from_bytes(shmem: &Nvshmem, bytes: &[u8]) -> Result<Self> {
        Self::register(shmem, bytes, "<bytes>", Kind::Module, true)
    }

    /// Load a linked cubin from a file as a `CUmodule` and register it.
    pub fn from_file(shmem: &Nvshmem, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let bytes = std::fs::read(path)
            .map_err(|e| module_error(&name, format!("cannot read it: {e}"), None))?;
        Self::register(shmem, &bytes, &name, Kind::Module, true)
    }

    /// Load a linked cubin as a context-independent `CUlibrary` and register it with
    /// `nvshmemx_culibrary_init`.
    pub fn library_from_bytes(shmem: &Nvshmem, bytes: &[u8]) -> Result<Self> {
        Self::register(shmem, bytes, "<library>", Kind::Library, true)
    }

    /// Load `bytes` and register them with NVSHMEM; undo the load if registration fails.
    fn register(
        shmem: &Nvshmem,
        bytes: &[u8],
        name: &str,
        kind: Kind,
        hold_runtime: bool,
    ) -> Result<Self> {
        check_image(bytes, name)?;
        let runtime = hold_runtime.then(|| shmem.clone());
        let key = image_key(bytes, kind);
        let _host = shmem.host_call()?;
        let mut cache = lock_letting_go(&shmem.rt.modules);
        if let Some(loaded) = cache.get(&key).and_then(|l| Arc::clone(l).downcast().ok()) {
            return Ok(Module { loaded, runtime });
        }
        let image = aligned_copy(bytes);
        let handle = match kind {
            // SAFETY: `image` is a complete, aligned image that outlives the call.
            Kind::Module => unsafe { cu::module::load_data(image.as_ptr() as *const c_void) }
                .map(Handle::Module),
            Kind::Library => {
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
                }
                .map(|()| Handle::Library(lib))
            }
        }
        .map_err(|e| {
            module_error(
                name,
                "the driver refused to load it: was it built for this GPU's architecture \
                 (NVSHMEM_RS_CUDA_ARCHS) and linked with nvlink against libnvshmem_device.a?"
                    .into(),
                Some(e),
            )
        })?;
        // SAFETY: the handle was just loaded in the current context.
        let registered = unsafe { handle.links_nvshmem() };
        // SAFETY: as above.
        let (call, status) = unsafe {
            match handle {
                _ if !registered => ("", 0),
                Handle::Module(m) => (
                    "nvshmemx_cumodule_init",
                    sys::nvshmemx_cumodule_init(m as sys::CUmodule),
                ),
                Handle::Library(l) => (
                    "nvshmemx_culibrary_init",
                    sys::nvshmemx_culibrary_init(l as sys::CUlibrary),
                ),
            }
        };
        if status != 0 {
            // SAFETY: nothing else refers to the handle yet.
            unsafe { handle.unload() };
            let (major, minor, patch) = library_version();
            return Err(module_error(
                name,
                format!(
                    "{call} returned {status}: the cubin must be linked (nvlink) against the \
                     libnvshmem_device.a of the same NVSHMEM release as the host library running \
                     it ({major}.{minor}.{patch}); rebuild the kernels against it, or point \
                     LD_LIBRARY_PATH at the NVSHMEM they were built with. NVSHMEM_DEBUG=WARN shows \
                     NVSHMEM's own explanation"
                ),
                None,
            ));
        }
        // SAFETY: the handle was just loaded in the current context.
        if let Err(e) = unsafe { handle.load_every_kernel() } {
            // SAFETY: nothing else refers to the handle yet.
            unsafe { handle.unload() };
            return Err(module_error(
                name,
                "the driver could not load its kernels".into(),
                Some(e),
            ));
        }
        let loaded = Arc::new(Loaded {
            handle,
            registered,
            name: name.to_string(),
            ctx: shmem.context().clone(),
            device: shmem.device_ordinal(),
        });
        cache.insert(
            key,
            Arc::clone(&loaded) as Arc<dyn std::any::Any + Send + Sync>,
        );
        Ok(Module { loaded, runtime })
    }

    /// The name the module was loaded under.
    pub fn name(&self) -> &str {
        &self.loaded.name
    }

    /// Look up a kernel by its `extern "C"` name. The function keeps the module loaded.
    pub fn function(&self, name: &str) -> Result<Function> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?} has a NUL")))?;
        self.loaded.enter()?;
        let not_found = |e| {
            module_error(
                &self.loaded.name,
                format!(
                    "no kernel `{name}`: kernels must be declared extern \"C\" __global__ (a C++ \
                     name is mangled)"
                ),
                Some(e),
            )
        };
        // SAFETY: the handle is live while `self.loaded` is, and `cname` is NUL-terminated.
        let func = match self.loaded.handle {
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
            loaded: Arc::clone(&self.loaded),
            _runtime: self.runtime.clone(),
            func,
            name: name.into(),
            params: function::param_sizes(func),
        })
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Module,
    Library,
}

/// What the runtime's module cache knows an image by: its form, its length and a 128-bit
/// hash of its bytes (two salted passes of the standard hasher).
fn image_key(bytes: &[u8], kind: Kind) -> [u64; 4] {
    use std::hash::{Hash, Hasher};
    let pass = |salt: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut h);
        bytes.hash(&mut h);
        h.finish()
    };
    [
        kind as u64,
        bytes.len() as u64,
        pass(0x6e76_7368_6d65_6d31),
        pass(0x6375_6269_6e5f_6b32),
    ]
}

/// The image of `set` for this PE's GPU.
fn image(shmem: &Nvshmem, set: &CubinSet) -> Result<&'static CubinImage> {
    let (major, minor) = shmem
        .context()
        .compute_capability()
        .during("cuDeviceGetAttribute")?;
    set.image_for(major, minor)
}

#[cfg(test)]
mod tests {
    use super::{image_key, Kind};

    #[test]
    fn the_cache_key_tells_images_and_forms_apart() {
        let a = b"\x7fELF one image".to_vec();
        let mut b = a.clone();
        *b.last_mut().unwrap() ^= 1;
        assert_eq!(
            image_key(&a, Kind::Module),
            image_key(&a.clone(), Kind::Module)
        );
        assert_ne!(image_key(&a, Kind::Module), image_key(&b, Kind::Module));
        assert_ne!(image_key(&a, Kind::Module), image_key(&a, Kind::Library));
        assert_ne!(
            image_key(&a, Kind::Module),
            image_key(&a[..a.len() - 1], Kind::Module)
        );
    }
}
