//! Typed symmetric memory: allocation (collective), host copies, views and peer pointers.

mod check;
mod device;
mod interop;
mod mapped;
mod round_trip;
mod view;

pub use device::DeviceBuffer;
pub(crate) use view::check_len;
pub use view::SymmetricView;

use crate::element::Element;
use crate::error::{CudaResultExt, Error, HeapLimit, Result};
use crate::runtime::heap;
use crate::runtime::{copy_host, note_alloc, note_free, HostCopy, Nvshmem};
pub(crate) use check::AllocCheck;
pub(crate) use check::SetUp;
use check::{CheckKind, Proposal, Refusal};
use cudarc::driver::CudaStream;
pub(crate) use mapped::MappedRecord;
use nvshmem_sys as sys;
pub(crate) use round_trip::round_trip;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `src`'s elements as the bytes a copy into device memory takes.
pub(crate) fn to_device<T: Element>(src: &[T]) -> HostCopy<'_> {
    // SAFETY: plain elements, seen as their bytes.
    HostCopy::ToDevice(unsafe {
        std::slice::from_raw_parts(src.as_ptr() as *const u8, std::mem::size_of_val(src))
    })
}

/// `dst`'s elements as the bytes a copy from device memory fills.
pub(crate) fn to_host<T: Element>(dst: &mut [T]) -> HostCopy<'_> {
    let len = std::mem::size_of_val(dst);
    // SAFETY: plain elements, seen as their bytes (any bytes are a valid element).
    HostCopy::ToHost(unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut u8, len) })
}

/// A copy between `host` and this PE's device address `dev` on the runtime's stream, through
/// the runtime's pinned buffers ([`copy_host`]), waited for; `guard` is held while each
/// chunk is enqueued.
///
/// # Safety
/// `dev` holds as many bytes as `host`, on this PE's GPU.
unsafe fn runtime_host_copy<G>(
    shmem: &Nvshmem,
    dev: u64,
    host: HostCopy<'_>,
    guard: impl Fn() -> Result<G>,
) -> Result<()> {
    shmem.bind_context()?;
    unsafe { copy_host(&shmem.rt.pinned, shmem.stream(), dev, host, guard) }
}

/// A typed allocation in the symmetric heap: the same size at the same offset on every PE,
/// so any PE can address any other PE's copy.
///
/// Allocation and free are **collective**: every PE must allocate the same sizes in the
/// same order, and free in the same order. Every call checks this (one small exchange) and
/// returns [`Error::CollectiveMismatch`] instead of hanging or corrupting the heap; an
/// allocation that any PE's heap cannot take is [`Error::HeapExhausted`] on every PE.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// let shmem = nvshmem::Nvshmem::init()?;
/// let buf = shmem.malloc::<f32>(1024)?;
/// buf.copy_from_host(&vec![1.0; 1024])?;
/// assert_eq!(buf.to_vec()?[0], 1.0);
/// # Ok(()) }
/// ```
pub struct SymmetricBuffer<T: Element> {
    ptr: *mut T,
    len: usize,
    bytes: usize,
    seq: u64,
    live: bool,
    shmem: Nvshmem,
}

// SAFETY: the pointer is device memory owned by this value.
unsafe impl<T: Element> Send for SymmetricBuffer<T> {}
unsafe impl<T: Element> Sync for SymmetricBuffer<T> {}

/// Device memory of this PE seen as `device_len()` elements: what a kernel or a library call
/// on this PE reads or writes, symmetric or not. Our calls that take ordinary device memory
/// take any `impl DeviceMemory<T>`: our buffers and views, and cudarc's [`CudaSlice`],
/// [`CudaView`] and [`CudaViewMut`] (what candle and burn hold).
///
/// Our calls ask for the address on the stream they will run on, and cudarc's types order
/// that stream after their pending writes (cudarc's event tracking). cudarc's later work does
/// not see ours, so before cudarc reads what we wrote on another stream, order the streams
/// (`their_stream.join(&our_stream)`) or use one stream for both.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::DeviceMemory;
/// let shmem = nvshmem::Nvshmem::init()?;
/// let ours = shmem.malloc::<f32>(256)?;
/// let theirs = shmem.stream().alloc_zeros::<f32>(256)?; // a cudarc CudaSlice<f32>
/// assert_eq!(ours.device_len(), theirs.device_len());
/// # Ok(()) }
/// ```
///
/// # Safety
/// `device_addr()` must return the address of `device_len()` elements of `T` in memory of
/// this PE's GPU that stay allocated while the value is borrowed, ready for work enqueued on
/// `stream` after the call: kernels and cuBLASLt use them as given.
///
/// [`CudaSlice`]: cudarc::driver::CudaSlice
/// [`CudaView`]: cudarc::driver::CudaView
/// [`CudaViewMut`]: cudarc::driver::CudaViewMut
pub unsafe trait DeviceMemory<T: Element> {
    /// The device address of the first element on this PE, for work enqueued on `stream`
    /// after this call.
    fn device_addr(&self, stream: &Arc<CudaStream>) -> u64;
    /// The number of elements.
    fn device_len(&self) -> usize;
}

// SAFETY: the buffer's own allocation.
unsafe impl<T: Element> DeviceMemory<T> for SymmetricBuffer<T> {
    fn device_addr(&self, _: &Arc<CudaStream>) -> u64 {
        self.ptr as u64
    }
    fn device_len(&self) -> usize {
        self.len
    }
}

// SAFETY: a view lies inside a buffer it borrows.
unsafe impl<T: Element> DeviceMemory<T> for SymmetricView<'_, T> {
    fn device_addr(&self, _: &Arc<CudaStream>) -> u64 {
        self.as_ptr() as u64
    }
    fn device_len(&self) -> usize {
        SymmetricView::len(self)
    }
}

// SAFETY: the buffer's own allocation.
unsafe impl<T: Element> DeviceMemory<T> for DeviceBuffer<T> {
    fn device_addr(&self, _: &Arc<CudaStream>) -> u64 {
        DeviceBuffer::addr(self)
    }
    fn device_len(&self) -> usize {
        DeviceBuffer::len(self)
    }
}

impl<T: Element> std::fmt::Debug for SymmetricBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SymmetricBuffer<{}>({} elements at {:p})",
            T::NVSHMEM_NAME,
            self.len,
            self.ptr
        )
    }
}

impl Nvshmem {
    /// Allocate `len` elements in the symmetric heap (collective; contents undefined).
    pub fn malloc<T: Element>(&self, len: usize) -> Result<SymmetricBuffer<T>> {
        self.allocate(len, Alloc::Uninit)
    }

    /// Allocate `len` zeroed elements in the symmetric heap (collective).
    pub fn calloc<T: Element>(&self, len: usize) -> Result<SymmetricBuffer<T>> {
        self.allocate(len, Alloc::Zeroed)
    }

    /// Allocate `len` elements at an address aligned to `alignment` bytes (a power of two;
    /// collective).
    pub fn malloc_aligned<T: Element>(
        &self,
        alignment: usize,
        len: usize,
    ) -> Result<SymmetricBuffer<T>> {
        if !alignment.is_power_of_two() || alignment < std::mem::align_of::<T>() {
            return Err(Error::InvalidArgument(format!(
                "alignment {alignment} must be a power of two and at least {}",
                std::mem::align_of::<T>()
            )));
        }
        self.allocate(len, Alloc::Aligned(alignment))
    }

    fn allocate<T: Element>(&self, len: usize, how: Alloc) -> Result<SymmetricBuffer<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{len} elements of {} overflow usize",
                T::NVSHMEM_NAME
            ))
        })?;
        let _host = self.host_call()?;
        let align = match how {
            Alloc::Aligned(a) => a,
            _ => 0,
        };
        let in_use = self.rt.heap_in_use.load(Ordering::Relaxed);
        let gpu_free = || {
            cudarc::driver::result::mem_get_info()
                .map(|(free, _)| free)
                .during("cuMemGetInfo")
        };
        // The host library's lock keeps other allocations and frees from coming between this
        // check and the placement.
        let need = heap::footprint(bytes, align);
        let refused = match need {
            Some(need) => self.heap_model().refusal(&self.rt.heap, need, gpu_free)?,
            None => Some(HeapLimit::MaxMemoryPerGpu(self.rt.heap.max_memory_per_gpu)),
        };
        let seq = self.agree_collective(Proposal {
            kind: CheckKind::Alloc,
            seq: None,
            bytes,
            align,
            refused: refused.map(Refusal::Heap),
            in_use,
        })?;
        let ptr = if bytes == 0 {
            std::ptr::null_mut()
        } else {
            unsafe {
                match how {
                    // Zeroed below: NVSHMEM's calloc zeroes with a synchronous cudaMemset on
                    // the legacy stream, which has been seen to stall beside kernels that wait
                    // for other PEs until their timeout.
                    Alloc::Uninit | Alloc::Zeroed => sys::nvshmem_malloc(bytes),
                    Alloc::Aligned(a) => sys::nvshmem_align(a, bytes),
                }
            }
        };
        // A fixed heap too fragmented for the request: NVSHMEM returns NULL on every PE alike
        // (same heap, same sequence of calls), so no PE goes on alone.
        if bytes != 0 && ptr.is_null() {
            return Err(Error::HeapExhausted {
                requested: bytes,
                in_use,
                pe: self.my_pe(),
                limit: HeapLimit::SymmetricSize(self.rt.heap.symmetric_size),
            });
        }
        if !ptr.is_null() {
            let offset = self.heap_offset(ptr as u64);
            self.heap_model().place(
                &self.rt.heap,
                offset,
                need.unwrap_or(bytes),
                align,
                self.my_pe(),
            );
            self.with_service(AllocCheck::new, |check| {
                check.note_placed(offset);
                Ok(())
            })?;
            // On a stream of the waits' (behind nothing a caller queued). A peer may write
            // into this PE's copy as soon as its own allocation returns: a barrier after.
            if matches!(how, Alloc::Zeroed) {
                let stream = self.wait_stream()?;
                // SAFETY: `bytes` of this PE's symmetric memory, just allocated, not handed out.
                unsafe { self.zero_and_wait(&stream, ptr as u64, bytes) }?;
                self.set_up_barrier(SetUp::Zeroed)?;
            }
        }
        note_alloc(&self.rt, bytes);
        Ok(SymmetricBuffer {
            ptr: ptr as *mut T,
            len,
            bytes,
            seq,
            live: true,
            shmem: self.clone(),
        })
    }

    /// Exchange what every PE is about to do and fail if they differ or any heap refuses.
    /// Returns the allocation's sequence number.
    fn agree_collective(&self, proposal: Proposal) -> Result<u64> {
        self.with_service(AllocCheck::new, |check| check.agree(self, proposal))
    }

    /// Wait until every PE has reached `what` (the end of a collective constructor, a host
    /// barrier), within the runtime's wait limit (`NVSHMEM_RS_TIMEOUT`): NVSHMEM's barrier
    /// without its unbounded wait, and a PE at another collective point is named. This PE's
    /// writes to its symmetric memory must be complete (they are ordered before the
    /// exchange's puts only through the host).
    pub(crate) fn set_up_barrier(&self, what: SetUp) -> Result<()> {
        self.set_up_gather(what, 0).map(|_| ())
    }

    /// [`set_up_barrier`](Self::set_up_barrier) that also gathers every PE's `value`, in PE
    /// order.
    pub(crate) fn set_up_gather(&self, what: SetUp, value: u64) -> Result<Vec<u64>> {
        let proposal = Proposal {
            kind: CheckKind::SetUp,
            seq: Some(0),
            bytes: what as usize,
            align: 0,
            refused: None,
            in_use: value as usize,
        };
        let (_, all) =
            self.with_service(AllocCheck::new, |check| check.agree_all(self, proposal))?;
        Ok(all
            .chunks(crate::runtime::RECORD_WORDS)
            .map(|r| r[check::GATHERED_WORD])
            .collect())
    }
}

/// `range` of a buffer of `len` elements as `start..end`, checked (without overflow).
pub(crate) fn view_bounds(range: &impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let past = |what| Error::InvalidArgument(format!("a view range {what} usize::MAX"));
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1).ok_or_else(|| past("starting after"))?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1).ok_or_else(|| past("ending at"))?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end {
        return Err(Error::InvalidArgument(format!(
            "view range {start}..{end} starts after its end"
        )));
    }
    if end > len {
        return Err(Error::Length {
            what: "view range end (at most the buffer's length)",
            expected: len,
            got: end,
        });
    }
    Ok((start, end))
}

#[derive(Clone, Copy)]
enum Alloc {
    Uninit,
    Zeroed,
    Aligned(usize),
}

impl<T: Element> SymmetricBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.bytes
    }

    /// The device address of this PE's copy (pass it to kernels).
    pub fn as_ptr(&self) -> *mut T {
        self.ptr
    }

    /// The device address as a `CUdeviceptr`.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// The runtime this buffer belongs to.
    pub fn runtime(&self) -> &Nvshmem {
        &self.shmem
    }

    /// Copy `src` into this PE's copy; `src.len()` must equal `len()`.
    pub fn copy_from_host(&self, src: &[T]) -> Result<()> {
        self.view(..).copy_from_host(src)
    }

    /// Copy this PE's copy into `dst`; `dst.len()` must equal `len()`.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.view(..).copy_to_host(dst)
    }

    /// This PE's copy as a `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// A window onto elements `range` of the buffer (on every PE).
    ///
    /// # Panics
    /// If the range is out of bounds; [`try_view`](Self::try_view) returns an error instead.
    pub fn view(&self, range: impl RangeBounds<usize>) -> SymmetricView<'_, T> {
        self.try_view(range).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A window onto elements `range`, or an error if it does not fit.
    pub fn try_view(&self, range: impl RangeBounds<usize>) -> Result<SymmetricView<'_, T>> {
        let (start, end) = view_bounds(&range, self.len)?;
        // SAFETY: start <= len, so the address stays inside (or one past) the allocation.
        let ptr = unsafe { self.ptr.add(start) };
        Ok(SymmetricView::new(ptr, end - start, &self.shmem))
    }

    /// The address of `pe`'s copy that this GPU can load and store directly (over NVLink or
    /// PCIe peer access), or `None` if `pe` is reachable only through NVSHMEM calls.
    pub fn peer_ptr(&self, pe: usize) -> Result<Option<*mut T>> {
        self.view(..).peer_ptr(pe)
    }

    /// Free now, reporting collective mismatches; dropping does the same but can only log.
    pub fn free(mut self) -> Result<()> {
        let r = self.release();
        // Dropping `self` now releases its runtime handle; it must not free again (after a
        // failed free the other PEs are not freeing: the memory is leaked instead).
        self.live = false;
        r
    }

    fn release(&mut self) -> Result<()> {
        if !self.live {
            return Ok(());
        }
        // Kernels on any stream (not only the runtime's) may still use the buffer; the
        // allocation that reuses its memory must not see their stores. Waited for before the
        // PEs agree, so that a PE whose wait fails (a stream of the context being captured, a
        // sticky error) says so in the agreement and no PE frees: one PE alone leaving the free
        // would hang the others in NVSHMEM's barrier inside it. Not under the host library's
        // lock: a kernel may wait for another thread's call.
        let gpu_wait = match self.shmem.quiesce() {
            Ok(()) => None,
            Err(e @ Error::Stranded(_)) => return Err(e),
            Err(e) => {
                crate::diag::warn_pe!(
                    Some(self.shmem.my_pe()),
                    "a free of {} bytes cannot wait for the GPU: {e}",
                    self.bytes
                );
                Some(Refusal::GpuWait(driver_code(&e)))
            }
        };
        {
            let _host = self.shmem.host_call()?;
            self.shmem.agree_collective(Proposal {
                kind: CheckKind::Free,
                seq: Some(self.seq),
                bytes: self.bytes,
                align: 0,
                refused: gpu_wait,
                in_use: 0,
            })?;
            if !self.ptr.is_null() {
                unsafe { sys::nvshmem_free(self.ptr as *mut std::ffi::c_void) };
                let offset = self.shmem.heap_offset(self.ptr as u64);
                self.shmem.heap_model().remove(offset);
            }
        }
        note_free(&self.shmem.rt, self.bytes);
        self.live = false;
        Ok(())
    }
}

/// The driver's code in a failed CUDA call's error (0 for any other error: the free is still
/// refused).
fn driver_code(e: &Error) -> u32 {
    match e {
        Error::Cuda { source, .. } => source.0 as u32,
        _ => 0,
    }
}

impl<T: Element> Drop for SymmetricBuffer<T> {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            // A mismatched free would corrupt the heap: leak instead, and say why (once: a
            // stranded runtime leaks everything, for the reason it reported already).
            if matches!(e, Error::Stranded(_)) {
                return;
            }
            crate::diag::warn_pe!(
                Some(self.shmem.my_pe()),
                "leaking a SymmetricBuffer<{}>: {e}",
                T::NVSHMEM_NAME
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_ranges_are_checked_without_overflow() {
        assert_eq!(view_bounds(&(..), 10).unwrap(), (0, 10));
        assert_eq!(view_bounds(&(2..=4), 10).unwrap(), (2, 5));
        assert_eq!(view_bounds(&(10..), 10).unwrap(), (10, 10));
        assert!(matches!(
            view_bounds(&std::ops::Range { start: 3, end: 2 }, 10),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            view_bounds(&(0..11), 10),
            Err(Error::Length {
                expected: 10,
                got: 11,
                ..
            })
        ));
        // These overflowed (a panic in debug builds, a wrapped range in release).
        assert!(view_bounds(&(0..=usize::MAX), 10).is_err());
        let after_max = (Bound::Excluded(usize::MAX), Bound::Unbounded);
        assert!(view_bounds(&after_max, 10).is_err());
    }
}
