//! A record in pinned host memory that the GPU maps: kernels write it (a fault, when a wait
//! gave up), and the host reads it at any time without waiting for a stream, which may never
//! finish.

use crate::error::{CudaResultExt, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, sys as cusys};

pub(crate) struct MappedRecord<T> {
    host: *mut T,
    device: u64,
}

// SAFETY: pinned host memory owned by this value; the host only reads it.
unsafe impl<T> Send for MappedRecord<T> {}
unsafe impl<T> Sync for MappedRecord<T> {}

impl<T: Copy + Default> MappedRecord<T> {
    /// A record of `T::default()`, mapped into this PE's context.
    pub(crate) fn new(shmem: &Nvshmem) -> Result<Self> {
        shmem.bind_context()?;
        let bytes = std::mem::size_of::<T>();
        // SAFETY: a fresh allocation of `bytes`, written before anything reads it.
        let host = unsafe { cu::malloc_host(bytes, cusys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .during("cuMemHostAlloc")? as *mut T;
        unsafe { host.write(T::default()) };
        let mut device = 0;
        // SAFETY: `host` was allocated mapped, above.
        let mapped = unsafe {
            cusys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut std::ffi::c_void, 0)
        }
        .result()
        .during("cuMemHostGetDevicePointer");
        if let Err(e) = mapped {
            unsafe { cu::free_host(host as *mut std::ffi::c_void) }.ok();
            return Err(e);
        }
        Ok(MappedRecord { host, device })
    }

    /// The address kernels write the record at.
    pub(crate) fn device_addr(&self) -> u64 {
        self.device
    }

    /// The record, once the GPU has raised it: `raised` points at the word the GPU writes
    /// last, after a system fence; `None` while it is zero.
    pub(crate) fn raised(&self, raised: fn(*const T) -> *const u32) -> Option<T> {
        // SAFETY: live pinned memory, written by the GPU only.
        if unsafe { raised(self.host).read_volatile() } == 0 {
            return None;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        Some(unsafe { self.host.read_volatile() })
    }
}

impl<T> Drop for MappedRecord<T> {
    fn drop(&mut self) {
        // The owner waited for every kernel that could write here, unless the runtime is
        // stranded: then the GPU may never be idle, and the memory is left to the process's
        // exit.
        if crate::runtime::check_not_stranded().is_ok() {
            unsafe { cu::free_host(self.host as *mut std::ffi::c_void) }.ok();
        }
    }
}
