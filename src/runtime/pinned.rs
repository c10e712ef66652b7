//! Pinned host words for the runtime's own small copies between the host and the GPU: the
//! exchanges' records and tags, a host wait's word, an atomic's result; and the copies of the
//! caller's (pageable) host memory, a chunk at a time through them ([`copy_host`]).
//!
//! A copy to or from pageable memory goes through the driver's staging buffers, and a
//! device-to-host one waits inside the driver until the work before it on its stream is done.
//! In stack dumps of a hung `stress_check` (2 H200s), with such a copy waiting for a kernel
//! that waited for a peer, other threads' copies and an event record were stopped inside the
//! driver too. A copy to or from pinned memory is enqueued without staging and returns at
//! once; the wait for it is a stream synchronisation of its own.

use crate::error::{CudaResultExt, Result};
use cudarc::driver::{result as cu, sys as cusys, CudaStream};
use std::sync::{Arc, Mutex};

/// Bytes of a caller's copy that go through one pinned buffer at a time.
const CHUNK_BYTES: usize = 1 << 20;

/// Which way a copy of the caller's host memory goes.
pub(crate) enum HostCopy<'h> {
    /// Into device memory, from these bytes.
    ToDevice(&'h [u8]),
    /// From device memory, into these bytes.
    ToHost(&'h mut [u8]),
}

/// Copy between the caller's (pageable) host bytes and device address `dev` on `stream`,
/// after the work before it there, through pinned buffers of `pool`, a chunk at a time;
/// waited for. Each chunk's copy is enqueued without staging and waited for by a stream
/// synchronisation (see the module documentation). `enqueue_guard` is held while each
/// chunk's copy is enqueued (the host library's lock, for a copy on the runtime's stream).
///
/// # Safety
/// `dev` holds as many bytes as the host side, of the stream's context, current here.
pub(crate) unsafe fn copy_host<G>(
    pool: &PinnedPool,
    stream: &Arc<CudaStream>,
    dev: u64,
    mut host: HostCopy<'_>,
    enqueue_guard: impl Fn() -> Result<G>,
) -> Result<()> {
    let len = match &host {
        HostCopy::ToDevice(src) => src.len(),
        HostCopy::ToHost(dst) => dst.len(),
    };
    let mut pinned = pool.take(CHUNK_BYTES.min(len).div_ceil(8))?;
    let mut done = 0;
    while done < len {
        let n = CHUNK_BYTES.min(len - done);
        let at = dev + done as u64;
        let s = stream.cu_stream();
        match &mut host {
            HostCopy::ToDevice(src) => {
                pinned.bytes_mut()[..n].copy_from_slice(&src[done..done + n]);
                let _guard = enqueue_guard()?;
                unsafe { pinned.write_to(at, n, s) }?;
            }
            HostCopy::ToHost(_) => {
                let _guard = enqueue_guard()?;
                unsafe { pinned.read_from(at, n, s) }?;
            }
        }
        let synced = stream.synchronize().during("cuStreamSynchronize");
        if synced.is_err() {
            // The copy may still be queued: the buffer does not go back to the pool.
            std::mem::forget(pinned);
            return synced;
        }
        if let HostCopy::ToHost(dst) = &mut host {
            dst[done..done + n].copy_from_slice(&pinned.bytes_mut()[..n]);
        }
        done += n;
    }
    Ok(())
}

/// `len` words of pinned host memory, allocated in the current context.
pub(crate) struct PinnedWords {
    ptr: *mut u64,
    len: usize,
    /// Words allocated (`len` at least, 1 at least), recycled whole.
    cap: usize,
}

// SAFETY: host memory owned by this value; `&mut` access only.
unsafe impl Send for PinnedWords {}
unsafe impl Sync for PinnedWords {}

/// Pinned words given back, kept for the next `PinnedWords` that fits instead of freed:
/// `cuMemFreeHost` waits for all of the GPU's work and holds back the other threads' launches
/// meanwhile (a `Collectives` or a layer dropped beside other threads' kernels that wait for
/// peers). The addresses of what is left at exit go with the process. (address, words)
static RECYCLED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

impl PinnedWords {
    /// Zeroed words; the caller has made the context current.
    pub(crate) fn new(len: usize) -> Result<Self> {
        let reused = {
            let mut free = RECYCLED.lock().unwrap_or_else(|p| p.into_inner());
            // The smallest that fits, so that a large chunk is not spent on a few words.
            let best = (0..free.len())
                .filter(|&i| free[i].1 >= len.max(1))
                .min_by_key(|&i| free[i].1);
            best.map(|i| free.swap_remove(i))
        };
        let (ptr, cap) = match reused {
            Some((addr, cap)) => (addr as *mut u64, cap),
            None => {
                let bytes = len.max(1) * std::mem::size_of::<u64>();
                // SAFETY: a fresh allocation of `bytes`.
                let p = unsafe { cu::malloc_host(bytes, 0) }.during("cuMemHostAlloc")?;
                (p as *mut u64, len.max(1))
            }
        };
        // SAFETY: `cap >= len` words of pinned memory owned from now on by this value; only
        // the `len` it hands out need zeroing.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedWords { ptr, len, cap })
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u64] {
        // SAFETY: `len` live words, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the same memory, as bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len * 8) }
    }

    /// Copy `bytes` (at most the buffer's) from device address `src` into the buffer on
    /// `stream`; the caller synchronises the stream before it reads them.
    ///
    /// # Safety
    /// `src` holds `bytes` readable bytes of the stream's context.
    pub(crate) unsafe fn read_from(
        &mut self,
        src: u64,
        bytes: usize,
        stream: cusys::CUstream,
    ) -> Result<()> {
        assert!(bytes <= self.len * 8, "a pinned read beyond the buffer");
        unsafe {
            cusys::cuMemcpyDtoHAsync_v2(self.ptr as *mut std::ffi::c_void, src, bytes, stream)
        }
        .result()
        .during("cuMemcpyDtoHAsync")
    }

    /// Copy the first `bytes` of the buffer to device address `dst` on `stream`; the buffer
    /// must not change until the stream has run the copy.
    ///
    /// # Safety
    /// `dst` holds `bytes` writable bytes of the stream's context.
    pub(crate) unsafe fn write_to(
        &self,
        dst: u64,
        bytes: usize,
        stream: cusys::CUstream,
    ) -> Result<()> {
        assert!(bytes <= self.len * 8, "a pinned write beyond the buffer");
        unsafe {
            cusys::cuMemcpyHtoDAsync_v2(dst, self.ptr as *const std::ffi::c_void, bytes, stream)
        }
        .result()
        .during("cuMemcpyHtoDAsync")
    }
}

impl Drop for PinnedWords {
    fn drop(&mut self) {
        // Dropped after its last copy was waited for, unless the runtime is stranded: then a
        // copy may still be queued, and the memory is left to the process's exit.
        if crate::runtime::check_not_stranded().is_ok() {
            let mut free = RECYCLED.lock().unwrap_or_else(|p| p.into_inner());
            free.push((self.ptr as usize, self.cap));
        }
    }
}

/// Pinned words for callers that may run on several threads at once (host waits, team
/// syncs, atomics): each takes a buffer of its own and gives it back when done, so that no
/// wait holds up another's.
#[derive(Default)]
pub(crate) struct PinnedPool {
    free: Mutex<Vec<PinnedWords>>,
}

/// A buffer taken from a [`PinnedPool`], given back on drop.
pub(crate) struct Pinned<'a> {
    words: Option<PinnedWords>,
    pool: &'a PinnedPool,
}

impl PinnedPool {
    /// A buffer of at least `len` words (one given back earlier, or a new one allocated in
    /// the current context).
    pub(crate) fn take(&self, len: usize) -> Result<Pinned<'_>> {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            free.iter()
                .position(|w| w.len >= len)
                .map(|i| free.swap_remove(i))
        };
        let words = match reused {
            Some(w) => w,
            None => PinnedWords::new(len)?,
        };
        Ok(Pinned {
            words: Some(words),
            pool: self,
        })
    }
}

impl std::ops::Deref for Pinned<'_> {
    type Target = PinnedWords;
    fn deref(&self) -> &PinnedWords {
        self.words.as_ref().expect("a taken buffer")
    }
}

impl std::ops::DerefMut for Pinned<'_> {
    fn deref_mut(&mut self) -> &mut PinnedWords {
        self.words.as_mut().expect("a taken buffer")
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.words.take() {
            self.pool
                .free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(w);
        }
    }
}
