//! Ordinary device memory of this PE: not symmetric, so allocating it is not collective and
//! no peer can address it. For what only this PE's kernels touch, such as a tensor-parallel
//! layer's weight shard.

use crate::element::Element;
use crate::error::{CudaResultExt, Error, Result};
use crate::memory::check_len;
use crate::runtime::Nvshmem;
use cudarc::driver::result as cu;
use std::marker::PhantomData;

/// `len` elements of this PE's GPU memory, zeroed when allocated, freed on drop (after every
/// stream of the GPU is idle, as for symmetric buffers).
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// let shmem = nvshmem::Nvshmem::init()?;
/// let w = shmem.alloc_device::<nvshmem::bf16>(4096)?; // only this PE allocates
/// w.copy_from_host(&vec![nvshmem::bf16::ONE; 4096])?;
/// assert_eq!(w.to_vec()?[0], nvshmem::bf16::ONE);
/// # Ok(()) }
/// ```
pub struct DeviceBuffer<T: Element> {
    ptr: u64,
    len: usize,
    shmem: Nvshmem,
    _t: PhantomData<T>,
}

// SAFETY: the address is device memory owned by this value.
unsafe impl<T: Element> Send for DeviceBuffer<T> {}
unsafe impl<T: Element> Sync for DeviceBuffer<T> {}

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>({} elements at {:#x})",
            T::NVSHMEM_NAME,
            self.len,
            self.ptr
        )
    }
}

impl Nvshmem {
    /// `len` zeroed elements of ordinary device memory on this PE's GPU (not collective).
    pub fn alloc_device<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        self.bind_context()?;
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a DeviceBuffer of {len} elements of {} bytes overflows usize",
                std::mem::size_of::<T>()
            ))
        })?;
        let ptr = if bytes == 0 {
            0
        } else {
            // The zeroing on a stream of its own: the runtime's may hold work that waits for
            // another thread of this process.
            let stream = self.wait_stream()?;
            let s = stream.cu_stream();
            // SAFETY: a current context; the zeroing is waited for before the buffer is handed
            // out.
            unsafe {
                let p = {
                    // Under the host library's lock, as symmetric allocations are from their
                    // heap check to NVSHMEM's allocation: the GPU memory that check found free
                    // is not taken by another thread in between. From the device's memory pool,
                    // stream-ordered, as its free (see `Drop`).
                    let _host = self.host_call()?;
                    cu::malloc_async(s, bytes).during("cuMemAllocAsync")?
                };
                let zeroed = self.zero_and_wait(&stream, p, bytes);
                if let Err(e) = zeroed {
                    cu::free_async(p, s).ok();
                    return Err(e);
                }
                p
            }
        };
        Ok(DeviceBuffer {
            ptr,
            len,
            shmem: self.clone(),
            _t: PhantomData,
        })
    }
}

impl<T: Element> DeviceBuffer<T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The device address of the first element.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// The runtime it was allocated with.
    pub fn runtime(&self) -> &Nvshmem {
        &self.shmem
    }

    /// Copy `src` into the buffer; lengths must match. Waits for the copy.
    pub fn copy_from_host(&self, src: &[T]) -> Result<()> {
        check_len("host source", self.len, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the buffer holds as many elements as `src`.
        unsafe { super::runtime_host_copy(&self.shmem, self.ptr, super::to_device(src), || Ok(())) }
    }

    /// Copy the buffer into `dst`; lengths must match. Waits for the copy (and for the work
    /// before it on the runtime's stream).
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        check_len("host destination", self.len, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the buffer holds as many elements as `dst`.
        unsafe { super::runtime_host_copy(&self.shmem, self.ptr, super::to_host(dst), || Ok(())) }
    }

    /// The buffer as a `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // Kernels on any stream may still read or write it: wait for all of them, then hand
        // it back to the pool in stream order. Not cuMemFree, which holds back this process's
        // other launches until the GPU is idle: with another thread's kernel waiting for a PE
        // whose progress needs one of those launches, the PEs deadlock.
        let freed = self.shmem.quiesce().and_then(|()| {
            let stream = self.shmem.wait_stream()?;
            // SAFETY: allocated by cuMemAllocAsync, no longer used.
            unsafe { cu::free_async(self.ptr, stream.cu_stream()) }.during("cuMemFreeAsync")
        });
        match freed {
            // A stranded runtime leaks everything, for the reason it reported already.
            Ok(()) | Err(Error::Stranded(_)) => {}
            Err(e) => crate::diag::warn_pe!(
                Some(self.shmem.my_pe()),
                "leaking a DeviceBuffer<{}>: {e}",
                T::NVSHMEM_NAME
            ),
        }
    }
}
