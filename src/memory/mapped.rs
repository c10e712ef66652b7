//! A record in pinned host memory that the GPU maps: kernels write it (a fault, when a wait
//! gave up), and the host reads it at any time without waiting for a stream, which may never
//! finish.

use crate::error::{CudaResultExt, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, sys as cusys};
use std::sync::Mutex;

pub(crate) struct MappedRecord<T> {
    host: *mut T,
    device: u64,
}

/// Records given back, kept for the next record of the same size instead of freed:
/// `cuMemFreeHost` may wait for all of the GPU's work. In a stack dump of a hung
/// `stress_check` (2 H200s) a channel's drop sat in it while other threads' launches and
/// copies were stopped inside the driver, and their peers' kernels waited for those. The one
/// context of the process's runtime maps every record; the few pages left at exit go with
/// the process.
static FREE: Mutex<Vec<(usize, usize, u64)>> = Mutex::new(Vec::new());

/// A mapped block of `bytes` given back earlier: (host address, device address).
fn reuse(bytes: usize) -> Option<(usize, u64)> {
    let mut free = FREE.lock().unwrap_or_else(|p| p.into_inner());
    let i = free.iter().position(|&(b, _, _)| b == bytes)?;
    let (_, host, device) = free.swap_remove(i);
    Some((host, device))
}

// SAFETY: pinned host memory owned by this value; the host only reads it.
unsafe impl<T> Send for MappedRecord<T> {}
unsafe impl<T> Sync for MappedRecord<T> {}

impl<T: Copy + Default> MappedRecord<T> {
    /// A record of `T::default()`, mapped into this PE's context.
    pub(crate) fn new(shmem: &Nvshmem) -> Result<Self> {
        let bytes = std::mem::size_of::<T>();
        if let Some((host, device)) = reuse(bytes) {
            let host = host as *mut T;
            // SAFETY: a block of `bytes` that no kernel writes any more (its last owner
            // waited for them), written before anything reads it.
            unsafe { host.write_volatile(T::default()) };
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            return Ok(MappedRecord { host, device });
        }
        shmem.bind_context()?;
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
        // stranded: then a kernel may still write it, and it is left to the process's exit.
        if crate::runtime::check_not_stranded().is_ok() {
            let block = (std::mem::size_of::<T>(), self.host as usize, self.device);
            FREE.lock().unwrap_or_else(|p| p.into_inner()).push(block);
        }
    }
}
