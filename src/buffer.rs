//! Typed symmetric memory: allocation (collective), host copies, views and peer pointers.

use crate::element::Element;
use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::{note_alloc, note_free, Nvshmem};
use nvshmem_sys as sys;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

/// A typed allocation in the symmetric heap: the same size at the same offset on every PE,
/// so any PE can address any other PE's copy.
///
/// Allocation and free are **collective**: every PE must allocate the same sizes in the
/// same order, and free in the same order. Debug builds check this and return
/// [`Error::CollectiveMismatch`] instead of hanging or corrupting the heap.
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

// SAFETY: the pointer is device memory owned by this value; NVSHMEM calls are thread-safe.
unsafe impl<T: Element> Send for SymmetricBuffer<T> {}
unsafe impl<T: Element> Sync for SymmetricBuffer<T> {}

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
        self.enter()?;
        let align = match how {
            Alloc::Aligned(a) => a,
            _ => 0,
        };
        let seq = self.check_collective(CheckKind::Alloc, None, bytes, align)?;
        let ptr = if bytes == 0 {
            std::ptr::null_mut()
        } else {
            unsafe {
                match how {
                    Alloc::Uninit => sys::nvshmem_malloc(bytes),
                    Alloc::Zeroed => sys::nvshmem_calloc(len, std::mem::size_of::<T>()),
                    Alloc::Aligned(a) => sys::nvshmem_align(a, bytes),
                }
            }
        };
        if bytes != 0 && ptr.is_null() {
            return Err(Error::HeapExhausted {
                requested: bytes,
                in_use: self
                    .rt
                    .heap_in_use
                    .load(std::sync::atomic::Ordering::Relaxed),
                heap_size: self.rt.heap_size,
            });
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

    /// Debug builds: exchange what every PE is about to do and fail if they differ.
    /// Returns the allocation's sequence number.
    fn check_collective(
        &self,
        kind: CheckKind,
        seq: Option<u64>,
        bytes: usize,
        align: usize,
    ) -> Result<u64> {
        let mut guard = self
            .rt
            .alloc_check
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(check) => check.agree(self, kind, seq, bytes, align),
            None => Ok(seq.unwrap_or(0)),
        }
    }
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
    pub fn device_ptr(&self) -> u64 {
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
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e + 1,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        if start > end || end > self.len {
            return Err(Error::InvalidArgument(format!(
                "range {start}..{end} is outside the buffer of {} elements",
                self.len
            )));
        }
        Ok(SymmetricView {
            ptr: unsafe { self.ptr.add(start) },
            len: end - start,
            shmem: &self.shmem,
            _buf: PhantomData,
        })
    }

    /// The address of `pe`'s copy that this GPU can load and store directly (over NVLink or
    /// PCIe peer access), or `None` if `pe` is reachable only through NVSHMEM calls.
    pub fn peer_ptr(&self, pe: usize) -> Result<Option<*mut T>> {
        self.view(..).peer_ptr(pe)
    }

    /// Free now, reporting collective mismatches; dropping does the same but can only log.
    pub fn free(mut self) -> Result<()> {
        let r = self.release();
        std::mem::forget(self);
        r
    }

    fn release(&mut self) -> Result<()> {
        if !self.live {
            return Ok(());
        }
        self.shmem.enter()?;
        self.shmem
            .check_collective(CheckKind::Free, Some(self.seq), self.bytes, 0)?;
        if !self.ptr.is_null() {
            // Work queued on the stream may still use the buffer.
            self.shmem
                .rt
                .stream
                .synchronize()
                .during("cuStreamSynchronize")?;
            unsafe { sys::nvshmem_free(self.ptr as *mut std::ffi::c_void) };
        }
        note_free(&self.shmem.rt, self.bytes);
        self.live = false;
        Ok(())
    }
}

impl<T: Element> Drop for SymmetricBuffer<T> {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            // A mismatched free would corrupt the heap: leak instead, and say why.
            eprintln!(
                "nvshmem: leaking a SymmetricBuffer<{}>: {e}",
                T::NVSHMEM_NAME
            );
        }
    }
}

/// A borrowed window onto part of a [`SymmetricBuffer`], the same on every PE.
pub struct SymmetricView<'a, T: Element> {
    ptr: *mut T,
    len: usize,
    shmem: &'a Nvshmem,
    _buf: PhantomData<&'a SymmetricBuffer<T>>,
}

impl<T: Element> Clone for SymmetricView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Element> Copy for SymmetricView<'_, T> {}
unsafe impl<T: Element> Send for SymmetricView<'_, T> {}
unsafe impl<T: Element> Sync for SymmetricView<'_, T> {}

impl<'a, T: Element> SymmetricView<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the first element on this PE.
    pub fn as_ptr(&self) -> *mut T {
        self.ptr
    }

    /// The runtime.
    pub fn runtime(&self) -> &'a Nvshmem {
        self.shmem
    }

    /// Copy `src` into this PE's elements; lengths must match.
    pub fn copy_from_host(&self, src: &[T]) -> Result<()> {
        check_len("host source", self.len, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.shmem.enter()?;
        let stream = &self.shmem.rt.stream;
        unsafe {
            cudarc::driver::result::memcpy_htod_async(self.ptr as u64, src, stream.cu_stream())
                .during("cuMemcpyHtoDAsync")?;
        }
        stream.synchronize().during("cuStreamSynchronize")
    }

    /// Copy this PE's elements into `dst`; lengths must match.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        check_len("host destination", self.len, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.shmem.enter()?;
        let stream = &self.shmem.rt.stream;
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(dst, self.ptr as u64, stream.cu_stream())
                .during("cuMemcpyDtoHAsync")?;
        }
        stream.synchronize().during("cuStreamSynchronize")
    }

    /// This PE's elements as a `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// See [`SymmetricBuffer::peer_ptr`].
    pub fn peer_ptr(&self, pe: usize) -> Result<Option<*mut T>> {
        let pe = self.shmem.check_pe(pe)?;
        self.shmem.enter()?;
        let p = unsafe { sys::nvshmem_ptr(self.ptr as *const std::ffi::c_void, pe) };
        Ok((!p.is_null()).then_some(p as *mut T))
    }
}

impl<'a, T: Element> From<&'a SymmetricBuffer<T>> for SymmetricView<'a, T> {
    fn from(b: &'a SymmetricBuffer<T>) -> Self {
        b.view(..)
    }
}

pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected != got {
        return Err(Error::Length {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum CheckKind {
    Alloc = 1,
    Free = 2,
}

/// Debug-build agreement check for collective allocation: every PE publishes
/// `[kind, sequence, bytes, alignment]` with one fcollect and compares.
pub(crate) struct AllocCheck {
    /// Symmetric scratch: 4 words of ours, then 4 words per PE.
    scratch: *mut u64,
    n_pes: usize,
    next_seq: u64,
}

unsafe impl Send for AllocCheck {}

const WORDS: usize = 4;

impl AllocCheck {
    pub(crate) fn new(shmem: &Nvshmem) -> Result<Self> {
        shmem.enter()?;
        let n_pes = shmem.n_pes();
        let bytes = (n_pes + 1) * WORDS * 8;
        let scratch = unsafe { sys::nvshmem_malloc(bytes) } as *mut u64;
        if scratch.is_null() {
            return Err(Error::HeapExhausted {
                requested: bytes,
                in_use: 0,
                heap_size: shmem.rt.heap_size,
            });
        }
        Ok(AllocCheck {
            scratch,
            n_pes,
            next_seq: 0,
        })
    }

    pub(crate) fn release(self) {
        unsafe { sys::nvshmem_free(self.scratch as *mut std::ffi::c_void) };
    }

    fn agree(
        &mut self,
        shmem: &Nvshmem,
        kind: CheckKind,
        seq: Option<u64>,
        bytes: usize,
        align: usize,
    ) -> Result<u64> {
        let seq = seq.unwrap_or(self.next_seq);
        let mine = [kind as u64, seq, bytes as u64, align as u64];
        let stream = &shmem.rt.stream;
        let mut all = vec![0u64; self.n_pes * WORDS];
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                self.scratch as u64,
                &mine,
                stream.cu_stream(),
            )
            .during("cuMemcpyHtoDAsync")?;
            crate::error::check(
                "nvshmemx_uint64_fcollect_on_stream",
                sys::nvshmemx_uint64_fcollect_on_stream(
                    sys::NVSHMEM_TEAM_WORLD,
                    self.scratch.add(WORDS),
                    self.scratch,
                    WORDS,
                    stream.cu_stream() as sys::cudaStream_t,
                ),
            )?;
            cudarc::driver::result::memcpy_dtoh_async(
                &mut all,
                self.scratch.add(WORDS) as u64,
                stream.cu_stream(),
            )
            .during("cuMemcpyDtoHAsync")?;
        }
        stream.synchronize().during("cuStreamSynchronize")?;
        if let Some(msg) = describe_mismatch(shmem.my_pe(), &all) {
            return Err(Error::CollectiveMismatch(msg));
        }
        if kind == CheckKind::Alloc {
            self.next_seq += 1;
        }
        Ok(seq)
    }
}

/// Compare what each PE published; `None` when all agree.
pub(crate) fn describe_mismatch(my_pe: usize, all: &[u64]) -> Option<String> {
    let records: Vec<&[u64]> = all.chunks(WORDS).collect();
    let first = records.first()?;
    let pe = records.iter().position(|r| r != first)?;
    let show = |r: &[u64]| {
        let what = if r[0] == CheckKind::Alloc as u64 {
            "allocation"
        } else {
            "free of allocation"
        };
        let align = if r[3] != 0 {
            format!(", aligned to {}", r[3])
        } else {
            String::new()
        };
        format!("{what} #{} of {} bytes{align}", r[1], r[2])
    };
    Some(format!(
        "PE 0 is doing {} while PE {pe} is doing {} (seen from PE {my_pe}); every PE must \
         allocate and free symmetric buffers in the same order with the same sizes",
        show(first),
        show(records[pe])
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreeing_pes_pass_the_allocation_check() {
        let all = [1, 3, 4096, 0, 1, 3, 4096, 0, 1, 3, 4096, 0];
        assert_eq!(describe_mismatch(0, &all), None);
    }

    #[test]
    fn a_pe_allocating_another_size_is_named() {
        let all = [1, 3, 4096, 0, 1, 3, 4096, 0, 1, 3, 8192, 0];
        let msg = describe_mismatch(1, &all).unwrap();
        assert!(
            msg.contains("PE 2 is doing allocation #3 of 8192 bytes"),
            "{msg}"
        );
        assert!(
            msg.contains("PE 0 is doing allocation #3 of 4096 bytes"),
            "{msg}"
        );
    }

    #[test]
    fn a_pe_freeing_out_of_order_is_named() {
        let all = [2, 0, 64, 0, 2, 1, 128, 0];
        let msg = describe_mismatch(0, &all).unwrap();
        assert!(msg.contains("free of allocation #1 of 128 bytes"), "{msg}");
    }

    #[test]
    fn a_pe_allocating_while_another_frees_is_named() {
        let all = [1, 5, 64, 0, 2, 4, 64, 0];
        assert!(describe_mismatch(0, &all)
            .unwrap()
            .contains("PE 1 is doing free of allocation #4"));
    }
}
