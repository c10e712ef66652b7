//! Borrowed windows onto symmetric buffers, and the length and index checks every operation
//! on them shares.

use super::SymmetricBuffer;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::runtime::Nvshmem;
use nvshmem_sys as sys;
use std::marker::PhantomData;
use std::ops::RangeBounds;

/// A borrowed window onto part of a [`SymmetricBuffer`], the same on every PE.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// let shmem = nvshmem::Nvshmem::init()?;
/// let buf = shmem.calloc::<u32>(1024)?;
/// let second_half = buf.view(512..);
/// second_half.copy_from_host(&vec![7; 512])?;
/// assert_eq!(buf.to_vec()?[512], 7);
/// # Ok(()) }
/// ```
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
// SAFETY: a view is an address range and a runtime reference, both shareable.
unsafe impl<T: Element> Send for SymmetricView<'_, T> {}
unsafe impl<T: Element> Sync for SymmetricView<'_, T> {}

impl<'a, T: Element> SymmetricView<'a, T> {
    /// A view of `len` elements at `ptr`, which the caller checked lie inside a buffer of
    /// `shmem` borrowed for `'a`.
    pub(super) fn new(ptr: *mut T, len: usize, shmem: &'a Nvshmem) -> Self {
        SymmetricView {
            ptr,
            len,
            shmem,
            _buf: PhantomData,
        }
    }

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

    /// The device address of the first element on this PE, as a number.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The runtime.
    pub fn runtime(&self) -> &'a Nvshmem {
        self.shmem
    }

    /// The address of element `index` for an operation of `shmem`, after checking that the
    /// view belongs to it and that the index is inside.
    pub(crate) fn element_ptr(
        &self,
        shmem: &Nvshmem,
        what: &'static str,
        index: usize,
    ) -> Result<*mut T> {
        shmem.check_same_runtime(self.shmem, what)?;
        check_index(index, self.len)?;
        // SAFETY: index < len, so the address stays inside the view.
        Ok(unsafe { self.ptr.add(index) })
    }

    /// Copy `src` into this PE's elements; lengths must match.
    pub fn copy_from_host(&self, src: &[T]) -> Result<()> {
        check_len("host source", self.len, src.len())?;
        self.host_copy(super::to_device(src))
    }

    /// Copy this PE's elements into `dst`; lengths must match.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        check_len("host destination", self.len, dst.len())?;
        self.host_copy(super::to_host(dst))
    }

    /// A copy between this PE's elements and as many host elements on the runtime's stream,
    /// after the work before it there; waited for, holding no lock (that work may wait for
    /// another thread of this process to call NVSHMEM). The host library is held while each
    /// chunk is enqueued.
    fn host_copy(&self, host: crate::runtime::HostCopy<'_>) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        // SAFETY: the view's bytes, as many as the host side's (checked by the callers).
        unsafe {
            super::runtime_host_copy(self.shmem, self.ptr as u64, host, || self.shmem.host_call())
        }
    }

    /// This PE's elements as a `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// A window onto elements `range` of this view (on every PE).
    ///
    /// # Panics
    /// If the range is out of bounds; [`try_view`](Self::try_view) returns an error instead.
    pub fn view(&self, range: impl RangeBounds<usize>) -> SymmetricView<'a, T> {
        self.try_view(range).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A window onto elements `range` of this view, or an error if it does not fit.
    pub fn try_view(&self, range: impl RangeBounds<usize>) -> Result<SymmetricView<'a, T>> {
        let (start, end) = super::view_bounds(&range, self.len)?;
        // SAFETY: start <= len, so the address stays inside (or one past) the view.
        let ptr = unsafe { self.ptr.add(start) };
        Ok(SymmetricView::new(ptr, end - start, self.shmem))
    }

    /// See [`SymmetricBuffer::peer_ptr`].
    pub fn peer_ptr(&self, pe: usize) -> Result<Option<*mut T>> {
        let pe = self.shmem.check_pe(pe)?;
        let _host = self.shmem.host_call()?;
        let p = unsafe { sys::nvshmem_ptr(self.ptr as *const std::ffi::c_void, pe) };
        Ok((!p.is_null()).then_some(p as *mut T))
    }
}

impl<'a, T: Element> From<&'a SymmetricBuffer<T>> for SymmetricView<'a, T> {
    fn from(b: &'a SymmetricBuffer<T>) -> Self {
        b.view(..)
    }
}

/// Lengths that must be equal.
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

/// `index` must address an element of a view of `len` elements.
pub(crate) fn check_index(index: usize, len: usize) -> Result<()> {
    if index >= len {
        return Err(Error::IndexOutOfRange { index, len });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_must_fall_inside_the_view() {
        assert!(check_index(0, 1).is_ok());
        assert!(check_index(9, 10).is_ok());
        let e = check_index(10, 10).unwrap_err();
        assert!(matches!(e, Error::IndexOutOfRange { index: 10, len: 10 }));
        assert!(e.to_string().contains("index 10"), "{e}");
        assert!(check_index(0, 0).is_err());
    }

    #[test]
    fn lengths_must_match() {
        assert!(check_len("x", 3, 3).is_ok());
        assert!(matches!(
            check_len("x", 3, 4),
            Err(Error::Length {
                expected: 3,
                got: 4,
                ..
            })
        ));
    }
}
