//! Signals: `u64` words in symmetric memory that a put can update after its data has landed,
//! and that a PE can wait on.
//!
//! A signal is element `index` of a [`SymmetricBuffer<u64>`](crate::SymmetricBuffer) (or of a
//! view of one). [`put_signal`](Nvshmem::put_signal) delivers data and then updates the
//! signal on the target PE with a [`SignalOp`]; the receiver waits with
//! [`signal_wait_until`](Nvshmem::signal_wait_until) and a [`Cmp`].
//!
//! The NVSHMEM host library exports the signal operations only in their `_on_stream` forms
//! (`nvshmemx_putmem_signal_on_stream`, `nvshmemx_putmem_signal_nbi_on_stream`,
//! `nvshmemx_signal_op_on_stream`, `nvshmemx_signal_wait_until_on_stream`). The host forms
//! here are built on them: they enqueue the operation on the runtime's own stream
//! ([`Nvshmem::stream`]) and, except for [`put_signal_nbi`](Nvshmem::put_signal_nbi), wait
//! for that stream. [`signal_fetch`](Nvshmem::signal_fetch) and `signal_wait_until` read the
//! signal through a pinned word on a stream of their own.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::{Cmp, SignalOp};
//! let shmem = nvshmem::Nvshmem::init()?;
//! let (me, n) = (shmem.my_pe(), shmem.n_pes());
//! let data = shmem.malloc::<f32>(4096)?;
//! let inbox = shmem.calloc::<f32>(4096)?;
//! let flags = shmem.calloc::<u64>(1)?;
//! data.copy_from_host(&vec![me as f32; 4096])?;
//! // Send to the next PE and raise its flag once the data is there...
//! shmem.put_signal(&inbox, &data, &flags, 0, 1, SignalOp::Set, (me + 1) % n)?;
//! // ...and wait for the previous PE to do the same to us.
//! shmem.signal_wait_until(&flags, 0, Cmp::Eq, 1)?;
//! assert_eq!(inbox.to_vec()?[0], ((me + n - 1) % n) as f32);
//! # Ok(()) }
//! ```

use crate::element::Element;
use crate::error::{CudaResultExt, Result};
use crate::memory::SymmetricView;
use crate::runtime::Nvshmem;
use cudarc::driver::CudaStream;
use nvshmem_sys as sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How a signal update combines with the signal's current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignalOp {
    /// `signal = value`.
    Set,
    /// `signal += value` (atomically).
    Add,
}

impl SignalOp {
    /// NVSHMEM's constant (`NVSHMEM_SIGNAL_SET` or `NVSHMEM_SIGNAL_ADD`).
    pub fn raw(self) -> i32 {
        match self {
            SignalOp::Set => sys::NVSHMEM_SIGNAL_SET as i32,
            SignalOp::Add => sys::NVSHMEM_SIGNAL_ADD as i32,
        }
    }
}

/// A comparison for the wait operations: wait until `current <cmp> value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
}

impl Cmp {
    /// All comparisons.
    pub const ALL: [Cmp; 6] = [Cmp::Eq, Cmp::Ne, Cmp::Gt, Cmp::Ge, Cmp::Lt, Cmp::Le];

    /// NVSHMEM's constant (`NVSHMEM_CMP_EQ`...).
    pub fn raw(self) -> i32 {
        (match self {
            Cmp::Eq => sys::NVSHMEM_CMP_EQ,
            Cmp::Ne => sys::NVSHMEM_CMP_NE,
            Cmp::Gt => sys::NVSHMEM_CMP_GT,
            Cmp::Ge => sys::NVSHMEM_CMP_GE,
            Cmp::Lt => sys::NVSHMEM_CMP_LT,
            Cmp::Le => sys::NVSHMEM_CMP_LE,
        }) as i32
    }

    /// Whether `current <cmp> value` holds, as the waits evaluate it.
    pub fn holds<T: PartialOrd>(self, current: T, value: T) -> bool {
        match self {
            Cmp::Eq => current == value,
            Cmp::Ne => current != value,
            Cmp::Gt => current > value,
            Cmp::Ge => current >= value,
            Cmp::Lt => current < value,
            Cmp::Le => current <= value,
        }
    }
}

/// One put-with-signal form: its documentation, its name (with `(stream)` for the on-stream
/// forms), whether it is non-blocking, and what it does after enqueueing (`me` is the
/// runtime).
macro_rules! put_signal {
    (@stream $stream:ident) => { Some($stream) };
    ($(#[$doc:meta])* $name:ident $(($stream:ident))?, nbi: $nbi:expr, then: |$me:ident| $then:expr) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name<'a, T: Element>(
            &self,
            dest: impl Into<SymmetricView<'a, T>>,
            src: impl Into<SymmetricView<'a, T>>,
            sig: impl Into<SymmetricView<'a, u64>>,
            sig_index: usize,
            value: u64,
            op: SignalOp,
            pe: usize,
            $($stream: &Arc<CudaStream>,)?
        ) -> Result<()> {
            let stream = None $(.or(put_signal!(@stream $stream)))?;
            let (dest, src, sig) = (dest.into(), src.into(), sig.into());
            self.put_signal_with(dest, src, sig, sig_index, value, op, pe, stream, $nbi)?;
            let $me = self;
            $then
        }
    };
}

/// Set when [`Nvshmem::put_signal_nbi`] left work on the runtime's stream that a later
/// `quiet` or barrier must complete. One runtime per process, so one flag.
static OWN_STREAM_NBI: AtomicBool = AtomicBool::new(false);

/// Complete what `put_signal_nbi` left on the runtime's stream (part of `quiet` and the
/// barriers).
pub(crate) fn complete_own_stream(shmem: &Nvshmem) -> Result<()> {
    if OWN_STREAM_NBI.swap(false, Ordering::AcqRel) {
        let stream = shmem.stream();
        {
            let _host = shmem.host_call()?;
            unsafe { sys::nvshmemx_quiet_on_stream(stream.cu_stream() as sys::cudaStream_t) };
        }
        // Not under the host library's lock: the stream may hold work that waits for another
        // thread's call.
        stream.synchronize().during("cuStreamSynchronize")?;
    }
    Ok(())
}

impl Nvshmem {
    /// `stream`'s raw handle (checked), or for the host forms (`None`) the runtime's own
    /// stream, which they wait for or leave to `quiet`.
    fn stream_or_own(&self, stream: Option<&Arc<CudaStream>>) -> Result<sys::cudaStream_t> {
        match stream {
            Some(stream) => self.raw_stream(stream),
            None => Ok(self.stream().cu_stream() as sys::cudaStream_t),
        }
    }

    /// The one path of the four put-with-signal forms: check the arguments, then enqueue
    /// `nvshmemx_putmem_signal[_nbi]_on_stream` on `stream` (or the runtime's). An empty
    /// put still delivers its signal.
    #[allow(clippy::too_many_arguments)]
    fn put_signal_with<T: Element>(
        &self,
        dest: SymmetricView<'_, T>,
        src: SymmetricView<'_, T>,
        sig: SymmetricView<'_, u64>,
        sig_index: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: Option<&Arc<CudaStream>>,
        nbi: bool,
    ) -> Result<()> {
        let t = self.transfer(dest, src, pe)?;
        let sig = sig.element_ptr(self, "the signal buffer", sig_index)?;
        let s = self.stream_or_own(stream)?;
        let _host = self.host_call()?;
        let call = if nbi {
            sys::nvshmemx_putmem_signal_nbi_on_stream
        } else {
            sys::nvshmemx_putmem_signal_on_stream
        };
        unsafe { call(t.dest, t.src, t.bytes, sig, value, op.raw(), t.pe, s) };
        Ok(())
    }

    put_signal! {
        /// Put `src` into `dest` on PE `pe`, then update signal `sig[sig_index]` on `pe` with
        /// `op` and `value`; the signal changes only after the data is in place. Returns once
        /// `src` may be reused.
        ///
        /// The host library has no host-initiated put-with-signal: this enqueues
        /// `nvshmemx_putmem_signal_on_stream` on the runtime's stream and waits for the stream.
        ///
        /// ```no_run
        /// # fn main() -> nvshmem::Result<()> {
        /// use nvshmem::SignalOp;
        /// let shmem = nvshmem::Nvshmem::init()?;
        /// let (src, dst) = (shmem.malloc::<u8>(1 << 20)?, shmem.malloc::<u8>(1 << 20)?);
        /// let sig = shmem.calloc::<u64>(8)?;
        /// // Count arrivals in slot 3 of PE 0's signals.
        /// shmem.put_signal(&dst, &src, &sig, 3, 1, SignalOp::Add, 0)?;
        /// # Ok(()) }
        /// ```
        put_signal, nbi: false, then: |me| me.stream().synchronize().during("cuStreamSynchronize")
    }

    put_signal! {
        /// [`put_signal`](Self::put_signal) that returns at once: do not change `src` until
        /// [`quiet`](Self::quiet) (or [`barrier_all`](Self::barrier_all) /
        /// [`barrier`](Self::barrier)), which complete it.
        ///
        /// Built on `nvshmemx_putmem_signal_nbi_on_stream` on the runtime's stream; the host
        /// library has no host-initiated form.
        put_signal_nbi, nbi: true, then: |_me| {
            OWN_STREAM_NBI.store(true, Ordering::Release);
            Ok(())
        }
    }

    put_signal! {
        /// [`put_signal`](Self::put_signal) enqueued on `stream`.
        ///
        /// ```no_run
        /// # fn main() -> nvshmem::Result<()> {
        /// use nvshmem::{Cmp, SignalOp};
        /// let shmem = nvshmem::Nvshmem::init()?;
        /// let stream = shmem.new_stream()?;
        /// let (src, dst) = (shmem.malloc::<f64>(512)?, shmem.malloc::<f64>(512)?);
        /// let sig = shmem.calloc::<u64>(1)?;
        /// let next = (shmem.my_pe() + 1) % shmem.n_pes();
        /// shmem.put_signal_on_stream(&dst, &src, &sig, 0, 7, SignalOp::Set, next, &stream)?;
        /// // Later work on the stream sees the previous PE's data.
        /// shmem.signal_wait_until_on_stream(&sig, 0, Cmp::Eq, 7, &stream)?;
        /// stream.synchronize().unwrap();
        /// # Ok(()) }
        /// ```
        put_signal_on_stream(stream), nbi: false, then: |_me| Ok(())
    }

    put_signal! {
        /// [`put_signal_nbi`](Self::put_signal_nbi) enqueued on `stream`; `quiet_on_stream`
        /// completes it.
        put_signal_nbi_on_stream(stream), nbi: true, then: |_me| Ok(())
    }

    /// Update signal `sig[index]` on PE `pe` atomically with `op` and `value`, without data.
    ///
    /// Built on `nvshmemx_signal_op_on_stream` on the runtime's stream (waited for); the host
    /// library has no host-initiated form.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{Cmp, SignalOp};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let counter = shmem.calloc::<u64>(1)?;
    /// // Every PE checks in with PE 0, which waits for all of them.
    /// shmem.signal_op(&counter, 0, 1, SignalOp::Add, 0)?;
    /// if shmem.my_pe() == 0 {
    ///     shmem.signal_wait_until(&counter, 0, Cmp::Eq, shmem.n_pes() as u64)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn signal_op<'a>(
        &self,
        sig: impl Into<SymmetricView<'a, u64>>,
        index: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        self.signal_op_with(sig.into(), index, value, op, pe, None)?;
        self.stream().synchronize().during("cuStreamSynchronize")
    }

    /// [`signal_op`](Self::signal_op) enqueued on `stream`.
    pub fn signal_op_on_stream<'a>(
        &self,
        sig: impl Into<SymmetricView<'a, u64>>,
        index: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.signal_op_with(sig.into(), index, value, op, pe, Some(stream))
    }

    fn signal_op_with(
        &self,
        sig: SymmetricView<'_, u64>,
        index: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: Option<&Arc<CudaStream>>,
    ) -> Result<()> {
        let ptr = sig.element_ptr(self, "the signal buffer", index)?;
        let pe = self.check_pe(pe)?;
        let s = self.stream_or_own(stream)?;
        let _host = self.host_call()?;
        unsafe { sys::nvshmemx_signal_op_on_stream(ptr, value, op.raw(), pe, s) };
        Ok(())
    }

    /// Block until this PE's signal `sig[index]` satisfies `cmp` against `value`, and return
    /// the value that satisfied it.
    ///
    /// Bounded by the runtime's wait limit (`NVSHMEM_RS_TIMEOUT`), past which it returns
    /// [`Error::WaitTimeout`](crate::Error::WaitTimeout); polls from the host without a lock,
    /// as [`wait_until`](Self::wait_until) does.
    pub fn signal_wait_until<'a>(
        &self,
        sig: impl Into<SymmetricView<'a, u64>>,
        index: usize,
        cmp: Cmp,
        value: u64,
    ) -> Result<u64> {
        let ptr = sig.into().element_ptr(self, "the signal buffer", index)?;
        self.poll_word(ptr as *const u64, "the signal", index, |v| {
            cmp.holds(v, value)
        })
    }

    /// Make `stream` wait until this PE's signal `sig[index]` satisfies `cmp` against
    /// `value`; the host returns at once. The stream waits without a bound (NVSHMEM's stream
    /// operation).
    pub fn signal_wait_until_on_stream<'a>(
        &self,
        sig: impl Into<SymmetricView<'a, u64>>,
        index: usize,
        cmp: Cmp,
        value: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let ptr = sig.into().element_ptr(self, "the signal buffer", index)?;
        let s = self.raw_stream(stream)?;
        let _host = self.host_call()?;
        unsafe { sys::nvshmemx_signal_wait_until_on_stream(ptr, cmp.raw(), value, s) };
        Ok(())
    }

    /// The current value of this PE's signal `sig[index]`.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let sig = shmem.calloc::<u64>(4)?;
    /// assert_eq!(shmem.signal_fetch(&sig, 2)?, 0);
    /// # Ok(()) }
    /// ```
    pub fn signal_fetch<'a>(
        &self,
        sig: impl Into<SymmetricView<'a, u64>>,
        index: usize,
    ) -> Result<u64> {
        let ptr = sig.into().element_ptr(self, "the signal buffer", index)?;
        // One read through a pinned word, as the waits poll, not `nvshmem_signal_fetch`: a
        // synchronous copy from the legacy stream into pageable memory, which waits inside the
        // driver (under this crate's host lock) and holds back the process's other CUDA calls
        // meanwhile (a stress check stall).
        self.poll_word(ptr as *const u64, "the signal", index, |_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_ops_map_to_nvshmem_constants() {
        assert_eq!(SignalOp::Set.raw(), sys::NVSHMEM_SIGNAL_SET as i32);
        assert_eq!(SignalOp::Add.raw(), sys::NVSHMEM_SIGNAL_ADD as i32);
        assert_ne!(SignalOp::Set.raw(), SignalOp::Add.raw());
    }

    #[test]
    fn comparisons_map_to_nvshmem_constants() {
        assert_eq!(Cmp::Eq.raw(), sys::NVSHMEM_CMP_EQ as i32);
        assert_eq!(Cmp::Ne.raw(), sys::NVSHMEM_CMP_NE as i32);
        assert_eq!(Cmp::Gt.raw(), sys::NVSHMEM_CMP_GT as i32);
        assert_eq!(Cmp::Ge.raw(), sys::NVSHMEM_CMP_GE as i32);
        assert_eq!(Cmp::Lt.raw(), sys::NVSHMEM_CMP_LT as i32);
        assert_eq!(Cmp::Le.raw(), sys::NVSHMEM_CMP_LE as i32);
        let mut raw: Vec<i32> = Cmp::ALL.iter().map(|c| c.raw()).collect();
        raw.sort_unstable();
        raw.dedup();
        assert_eq!(raw.len(), 6, "two comparisons share a constant");
    }

    #[test]
    fn comparisons_read_current_against_value() {
        // wait until current > 3: true for 4, false for 3.
        assert!(Cmp::Gt.holds(4u64, 3) && !Cmp::Gt.holds(3u64, 3));
        assert!(Cmp::Ge.holds(3u64, 3) && !Cmp::Ge.holds(2u64, 3));
        assert!(Cmp::Lt.holds(2u64, 3) && !Cmp::Lt.holds(3u64, 3));
        assert!(Cmp::Le.holds(3u64, 3) && !Cmp::Le.holds(4u64, 3));
        assert!(Cmp::Eq.holds(-1i32, -1) && !Cmp::Eq.holds(0i32, -1));
        assert!(Cmp::Ne.holds(0i32, -1) && !Cmp::Ne.holds(-1i32, -1));
    }
}
