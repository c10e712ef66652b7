//! Remote atomic operations from the host on one element of a symmetric buffer.
//!
//! Fetch, set and swap work on every [`AtomicElement`] type (`i32`, `i64`, `u32`, `u64`,
//! `f32`, `f64`); compare-and-swap, add, increment and the bitwise fetch operations on the
//! [`AtomicInteger`] types (`i32`, `i64`, `u32`, `u64`). Each call names the element by buffer
//! (or view) and index, and the PE whose copy it updates; the operations that return a value
//! return the element's value just before the update. Atomics on the same element from
//! different PEs are atomic with respect to each other.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! let shmem = nvshmem::Nvshmem::init()?;
//! let ticket = shmem.calloc::<u64>(1)?;
//! // Every PE takes a distinct ticket from the counter on PE 0.
//! let mine = shmem.atomic_fetch_inc(&ticket, 0, 0)?;
//! assert!(mine < shmem.n_pes() as u64);
//! shmem.barrier_all()?;
//! assert_eq!(shmem.atomic_fetch(&ticket, 0, 0)?, shmem.n_pes() as u64);
//! # Ok(()) }
//! ```

use crate::buffer::SymmetricView;
use crate::element::{AtomicElement, AtomicInteger};
use crate::error::Result;
use crate::rma::check_index;
use crate::runtime::Nvshmem;

impl Nvshmem {
    /// The address of element `index` of `view` and the PE, checked.
    fn atomic_target<T: AtomicElement>(
        &self,
        view: SymmetricView<'_, T>,
        index: usize,
        pe: usize,
    ) -> Result<(*mut T, i32)> {
        self.check_same_runtime(view.runtime(), "the atomic's buffer")?;
        let pe = self.check_pe(pe)?;
        check_index(index, view.len())?;
        self.enter()?;
        // SAFETY: index < len.
        Ok((unsafe { view.as_ptr().add(index) }, pe))
    }

    /// Atomically read `buf[index]` on PE `pe`.
    pub fn atomic_fetch<'a, T: AtomicElement>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        Ok(unsafe { T::atomic_fetch(ptr, pe) })
    }

    /// Atomically write `value` to `buf[index]` on PE `pe`.
    pub fn atomic_set<'a, T: AtomicElement>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        unsafe { T::atomic_set(ptr, value, pe) };
        Ok(())
    }

    /// Atomically replace `buf[index]` on PE `pe` with `value`; returns the old value.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let x = shmem.calloc::<f64>(1)?;
    /// let old = shmem.atomic_swap(&x, 0, 2.5, 0)?;
    /// # let _ = old;
    /// # Ok(()) }
    /// ```
    pub fn atomic_swap<'a, T: AtomicElement>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        Ok(unsafe { T::atomic_swap(ptr, value, pe) })
    }

    /// Atomically set `buf[index]` on PE `pe` to `value` if it equals `cond`; returns the old
    /// value (equal to `cond` when the swap happened).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let lock = shmem.calloc::<i64>(1)?;
    /// // Take a lock on PE 0 that holds 0 when free.
    /// let me = shmem.my_pe() as i64 + 1;
    /// while shmem.atomic_compare_swap(&lock, 0, 0, me, 0)? != 0 {}
    /// // ... and release it.
    /// shmem.atomic_set(&lock, 0, 0, 0)?;
    /// # Ok(()) }
    /// ```
    pub fn atomic_compare_swap<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        cond: T,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        Ok(unsafe { T::atomic_compare_swap(ptr, cond, value, pe) })
    }

    /// Atomically add `value` to `buf[index]` on PE `pe`; returns the old value.
    pub fn atomic_fetch_add<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        Ok(unsafe { T::atomic_fetch_add(ptr, value, pe) })
    }

    /// Atomically add `value` to `buf[index]` on PE `pe`.
    pub fn atomic_add<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        unsafe { T::atomic_add(ptr, value, pe) };
        Ok(())
    }

    /// Atomically add one to `buf[index]` on PE `pe`; returns the old value.
    pub fn atomic_fetch_inc<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        Ok(unsafe { T::atomic_fetch_inc(ptr, pe) })
    }

    /// Atomically add one to `buf[index]` on PE `pe`.
    pub fn atomic_inc<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        pe: usize,
    ) -> Result<()> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        unsafe { T::atomic_inc(ptr, pe) };
        Ok(())
    }

    /// Atomically `buf[index] &= value` on PE `pe`; returns the old value.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let mask = shmem.malloc::<u32>(1)?;
    /// mask.copy_from_host(&[u32::MAX])?;
    /// shmem.barrier_all()?;
    /// // Clear our bit on PE 0.
    /// shmem.atomic_fetch_and(&mask, 0, !(1u32 << shmem.my_pe()), 0)?;
    /// # Ok(()) }
    /// ```
    pub fn atomic_fetch_and<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        Ok(unsafe { T::atomic_fetch_and(ptr, value, pe) })
    }

    /// Atomically `buf[index] |= value` on PE `pe`; returns the old value.
    pub fn atomic_fetch_or<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        Ok(unsafe { T::atomic_fetch_or(ptr, value, pe) })
    }

    /// Atomically `buf[index] ^= value` on PE `pe`; returns the old value.
    pub fn atomic_fetch_xor<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        Ok(unsafe { T::atomic_fetch_xor(ptr, value, pe) })
    }
}
