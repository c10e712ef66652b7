//! One-sided remote memory access from the host: put and get of whole views, `p` and `g` of
//! one element, blocking, non-blocking (`_nbi`) and enqueued on a CUDA stream (`_on_stream`).
//!
//! Every destination and source is a [`SymmetricView`] (a [`&SymmetricBuffer`](crate::SymmetricBuffer)
//! converts into one). The remote side of an operation is the same view on PE `pe`; the local
//! side is this PE's copy. Lengths, indices and PE numbers are checked before anything reaches
//! NVSHMEM.
//!
//! Completion follows OpenSHMEM:
//! * [`put`](Nvshmem::put) and [`p`](Nvshmem::p) return once the source may be reused; the data
//!   is guaranteed to have arrived at `pe` after [`quiet`](Nvshmem::quiet) (or a barrier).
//! * [`get`](Nvshmem::get) and [`g`](Nvshmem::g) return with the data in place.
//! * The `_nbi` forms return at once; [`quiet`](Nvshmem::quiet) completes them.
//! * The `_on_stream` forms run in stream order; `quiet_on_stream` completes the `_nbi` ones.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! let shmem = nvshmem::Nvshmem::init()?;
//! let (me, n) = (shmem.my_pe(), shmem.n_pes());
//! let src = shmem.malloc::<f32>(1024)?;
//! let dst = shmem.calloc::<f32>(1024)?;
//! src.copy_from_host(&vec![me as f32; 1024])?;
//! // Send our block to the next PE, then wait for everyone's to land.
//! shmem.put(&dst, &src, (me + 1) % n)?;
//! shmem.barrier_all()?;
//! assert_eq!(dst.to_vec()?[0], ((me + n - 1) % n) as f32);
//! // Read one element of the previous PE's source.
//! let x: f32 = shmem.g(&src, 7, (me + n - 1) % n)?;
//! # let _ = x;
//! # Ok(()) }
//! ```

use crate::element::Element;
use crate::error::Result;
use crate::memory::{check_len, SymmetricView};
use crate::runtime::Nvshmem;
use cudarc::driver::CudaStream;
use nvshmem_sys as sys;
use std::ffi::c_void;
use std::sync::Arc;

/// One put or get form: its documentation, its name (with `(stream)` for the on-stream
/// forms) and the NVSHMEM function it calls (with `(s)`, the stream, for those) through the
/// one checked path ([`Nvshmem::rma`]).
macro_rules! transfer {
    (@stream $stream:ident) => { Some($stream) };
    (@param) => { _ };
    (@param $s:ident) => { $s };
    ($(#[$doc:meta])* $name:ident $(($stream:ident))? => $call:ident $(($s:ident))?) => {
        $(#[$doc])*
        pub fn $name<'a, T: Element>(
            &self,
            dest: impl Into<SymmetricView<'a, T>>,
            src: impl Into<SymmetricView<'a, T>>,
            pe: usize,
            $($stream: &Arc<CudaStream>,)?
        ) -> Result<()> {
            let stream = None $(.or(transfer!(@stream $stream)))?;
            self.rma(dest.into(), src.into(), pe, stream, |t, transfer!(@param $($s)?)| unsafe {
                sys::$call(t.dest, t.src, t.bytes, t.pe $(, $s)?)
            })
        }
    };
}

/// A destination and source checked for an RMA call: raw pointers, byte count and PE.
pub(crate) struct Transfer {
    pub(crate) dest: *mut c_void,
    pub(crate) src: *const c_void,
    pub(crate) bytes: usize,
    pub(crate) pe: i32,
}

impl Nvshmem {
    /// Check and lower the arguments of a put or get (or a put with signal).
    pub(crate) fn transfer<T: Element>(
        &self,
        dest: SymmetricView<'_, T>,
        src: SymmetricView<'_, T>,
        pe: usize,
    ) -> Result<Transfer> {
        self.check_same_runtime(dest.runtime(), "the destination")?;
        self.check_same_runtime(src.runtime(), "the source")?;
        let pe = self.check_pe(pe)?;
        check_len("source (must match the destination)", dest.len(), src.len())?;
        Ok(Transfer {
            dest: dest.as_ptr() as *mut c_void,
            src: src.as_ptr() as *const c_void,
            bytes: std::mem::size_of::<T>() * dest.len(),
            pe,
        })
    }

    /// The shared path of every put and get: check the arguments (and the stream), skip an
    /// empty transfer, bind the context, then issue `call` (the stream is null for the host
    /// forms).
    fn rma<T: Element>(
        &self,
        dest: SymmetricView<'_, T>,
        src: SymmetricView<'_, T>,
        pe: usize,
        stream: Option<&Arc<CudaStream>>,
        call: impl FnOnce(&Transfer, sys::cudaStream_t),
    ) -> Result<()> {
        let t = self.transfer(dest, src, pe)?;
        let s = match stream {
            Some(stream) => self.raw_stream(stream)?,
            None => std::ptr::null_mut(),
        };
        if t.bytes == 0 {
            return Ok(());
        }
        let _host = self.host_call()?;
        call(&t, s);
        Ok(())
    }

    /// Check and lower the arguments of a `p` or `g`: the element's address and the PE.
    fn element_at<T: Element>(
        &self,
        view: SymmetricView<'_, T>,
        index: usize,
        pe: usize,
    ) -> Result<(*mut T, i32)> {
        self.check_same_runtime(view.runtime(), "the symmetric view")?;
        let pe = self.check_pe(pe)?;
        Ok((view.element_ptr(self, "the symmetric view", index)?, pe))
    }

    transfer! {
        /// Copy `src` (this PE's copy) into `dest` on PE `pe`. Returns once `src` may be
        /// reused; the data has arrived after [`quiet`](Self::quiet) or a barrier.
        ///
        /// ```no_run
        /// # fn main() -> nvshmem::Result<()> {
        /// let shmem = nvshmem::Nvshmem::init()?;
        /// let src = shmem.malloc::<u64>(256)?;
        /// let dst = shmem.calloc::<u64>(512)?;
        /// // Into the second half of PE 0's `dst`.
        /// shmem.put(dst.view(256..), &src, 0)?;
        /// shmem.quiet()?;
        /// # Ok(()) }
        /// ```
        put => nvshmem_putmem
    }

    transfer! {
        /// [`put`](Self::put) without waiting for `src` to be reusable: do not change `src` (or
        /// rely on `dest`) until [`quiet`](Self::quiet).
        put_nbi => nvshmem_putmem_nbi
    }

    transfer! {
        /// [`put`](Self::put) enqueued on `stream`: it runs after the work before it on the
        /// stream.
        ///
        /// ```no_run
        /// # fn main() -> nvshmem::Result<()> {
        /// let shmem = nvshmem::Nvshmem::init()?;
        /// let stream = shmem.new_stream()?;
        /// let (src, dst) = (shmem.malloc::<f32>(64)?, shmem.calloc::<f32>(64)?);
        /// shmem.put_on_stream(&dst, &src, (shmem.my_pe() + 1) % shmem.n_pes(), &stream)?;
        /// shmem.barrier_all_on_stream(&stream)?;
        /// stream.synchronize().unwrap();
        /// # Ok(()) }
        /// ```
        put_on_stream(stream) => nvshmemx_putmem_on_stream(s)
    }

    transfer! {
        /// [`put_nbi`](Self::put_nbi) enqueued on `stream`; `quiet_on_stream` completes it.
        put_nbi_on_stream(stream) => nvshmemx_putmem_nbi_on_stream(s)
    }

    transfer! {
        /// Copy `src` on PE `pe` into `dest` (this PE's copy). Returns with the data in `dest`.
        ///
        /// ```no_run
        /// # fn main() -> nvshmem::Result<()> {
        /// let shmem = nvshmem::Nvshmem::init()?;
        /// let remote = shmem.malloc::<i32>(100)?;
        /// let local = shmem.malloc::<i32>(10)?;
        /// shmem.barrier_all()?;
        /// // Elements 90..100 of PE 0's `remote`.
        /// shmem.get(&local, remote.view(90..), 0)?;
        /// # Ok(()) }
        /// ```
        get => nvshmem_getmem
    }

    transfer! {
        /// [`get`](Self::get) that returns at once; `dest` holds the data after
        /// [`quiet`](Self::quiet).
        get_nbi => nvshmem_getmem_nbi
    }

    transfer! {
        /// [`get`](Self::get) enqueued on `stream`: `dest` holds the data for the work after it.
        get_on_stream(stream) => nvshmemx_getmem_on_stream(s)
    }

    transfer! {
        /// [`get_nbi`](Self::get_nbi) enqueued on `stream`; `quiet_on_stream` completes it.
        get_nbi_on_stream(stream) => nvshmemx_getmem_nbi_on_stream(s)
    }

    /// Write one element: `dest[index] = value` on PE `pe`. Like [`put`](Self::put), the
    /// value has arrived after [`quiet`](Self::quiet).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let slots = shmem.calloc::<u32>(shmem.n_pes())?;
    /// // Tell every PE we are here.
    /// for pe in 0..shmem.n_pes() {
    ///     shmem.p(&slots, shmem.my_pe(), 1, pe)?;
    /// }
    /// shmem.barrier_all()?;
    /// // Read slot 0 on the last PE.
    /// let first = shmem.g(&slots, 0, shmem.n_pes() - 1)?;
    /// assert_eq!(first, 1);
    /// # Ok(()) }
    /// ```
    pub fn p<'a, T: Element>(
        &self,
        dest: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        let (ptr, pe) = self.element_at(dest.into(), index, pe)?;
        let _host = self.host_call()?;
        unsafe { T::p(ptr, value, pe) };
        Ok(())
    }

    /// Read one element: `src[index]` on PE `pe`.
    pub fn g<'a, T: Element>(
        &self,
        src: impl Into<SymmetricView<'a, T>>,
        index: usize,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.element_at(src.into(), index, pe)?;
        let _host = self.host_call()?;
        Ok(unsafe { T::g(ptr, pe) })
    }

    /// [`p`](Self::p) enqueued on `stream`.
    pub fn p_on_stream<'a, T: Element>(
        &self,
        dest: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (ptr, pe) = self.element_at(dest.into(), index, pe)?;
        let s = self.raw_stream(stream)?;
        let _host = self.host_call()?;
        unsafe { T::p_on_stream(ptr, value, pe, s) };
        Ok(())
    }

    /// [`g`](Self::g) ordered after the work on `stream`: NVSHMEM waits for the stream to reach
    /// the read before returning the value.
    pub fn g_on_stream<'a, T: Element>(
        &self,
        src: impl Into<SymmetricView<'a, T>>,
        index: usize,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<T> {
        let (ptr, pe) = self.element_at(src.into(), index, pe)?;
        let s = self.raw_stream(stream)?;
        let _host = self.host_call()?;
        Ok(unsafe { T::g_on_stream(ptr, pe, s) })
    }
}
