//! Every PE's few words to every PE, from the host, with a bound: the exchange under the
//! runtime's agreements (allocations and frees, the barrier before finalize, the collectives'
//! call check). Host puts and host reads of symmetric memory: nothing of it runs on the GPU,
//! so a PE that never comes leaves nothing behind. A kernel that waits for it (an fcollect,
//! a barrier on a stream) would stay on the GPU after the host gave up, and hold up the
//! process's exit, where the CUDA runtime's teardown waits for it.

use crate::error::{CudaResultExt, Result};
use cudarc::driver::result::{memcpy_dtoh_async, memcpy_htod_async};
use cudarc::driver::CudaStream;
use nvshmem_sys as sys;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Words of every record exchanged.
pub(crate) const RECORD_WORDS: usize = 8;

/// How an exchange ended.
pub(crate) enum Exchanged {
    /// Every PE's record, in PE order (`RECORD_WORDS` each).
    All(Vec<u64>),
    /// PE `.0` had not published within the bound.
    GaveUp(usize),
}

/// An exchange through symmetric scratch of [`scratch_words`](Self::scratch_words) words,
/// zeroed and allocated alike on every PE by the owner, who keeps it while this lives:
/// `[round][this PE's record][a tag per PE][two halves of every PE's record]`.
///
/// Each exchange is a round, counted from 1 alike on every PE: a PE puts its record into its
/// slot of the round's half on every PE, waits until those puts have landed, puts the round
/// into its tag there, and then reads its own tags until every PE's has reached the round.
/// The halves alternate: a PE that has finished round r knows every PE has begun it, so none
/// can be two rounds ahead and overwrite a half that is still being read.
pub(crate) struct WordExchange {
    scratch: *mut u64,
    /// A stream of its own for the copies between the host and the scratch, so that they
    /// wait for nothing else on the GPU.
    stream: Arc<CudaStream>,
    n_pes: usize,
    my_pe: usize,
    round: u64,
}

// SAFETY: the scratch is symmetric device memory, used only by the holder of this value,
// with the context current and the host library held (NVSHMEM's host calls).
unsafe impl Send for WordExchange {}

impl WordExchange {
    /// Words of scratch for `n_pes`.
    pub(crate) fn scratch_words(n_pes: usize) -> usize {
        1 + RECORD_WORDS + n_pes + 2 * n_pes * RECORD_WORDS
    }

    /// An exchange through `scratch`, copying on `stream` (one that nothing else uses).
    ///
    /// # Safety
    /// `scratch` is symmetric, holds [`scratch_words`](Self::scratch_words) zeroed words on
    /// every PE, and outlives this value.
    pub(crate) unsafe fn new(
        scratch: *mut u64,
        stream: Arc<CudaStream>,
        my_pe: usize,
        n_pes: usize,
    ) -> Self {
        WordExchange {
            scratch,
            stream,
            n_pes,
            my_pe,
            round: 0,
        }
    }

    /// Publish `record` (`RECORD_WORDS` words) and collect every PE's, waiting for the
    /// others at most `limit` (`None`: for ever), with the context current.
    pub(crate) fn exchange(
        &mut self,
        record: &[u64],
        limit: Option<Duration>,
    ) -> Result<Exchanged> {
        assert_eq!(record.len(), RECORD_WORDS, "a record of the exchange");
        let _host = super::host_call();
        let (n, me, w) = (self.n_pes, self.my_pe, RECORD_WORDS);
        self.round += 1;
        let round = self.round;
        // SAFETY: every offset lies inside the scratch (`new`'s contract).
        let (round_at, mine, tags, all) = unsafe {
            let s = self.scratch;
            (s, s.add(1), s.add(1 + w), s.add(1 + w + n))
        };
        let half = unsafe { all.add((round % 2) as usize * n * w) };
        let mut staged = vec![round];
        staged.extend_from_slice(record);
        // SAFETY: this PE's own words of the scratch; then puts of them into the same
        // symmetric words of every PE.
        let cu = self.stream.cu_stream();
        unsafe {
            memcpy_htod_async(round_at as u64, &staged, cu).during("cuMemcpyHtoDAsync")?;
            self.stream.synchronize().during("cuStreamSynchronize")?;
            for pe in 0..n {
                let slot = half.add(me * w) as *mut c_void;
                sys::nvshmem_putmem(slot, mine as *const c_void, w * 8, pe as i32);
            }
            sys::nvshmem_quiet();
            for pe in 0..n {
                let tag = tags.add(me) as *mut c_void;
                sys::nvshmem_putmem(tag, round_at as *const c_void, 8, pe as i32);
            }
            sys::nvshmem_quiet();
        }
        let began = Instant::now();
        let mut seen = vec![0u64; n];
        let mut pause = Duration::from_micros(5);
        loop {
            // SAFETY: this PE's tags.
            unsafe { memcpy_dtoh_async(&mut seen, tags as u64, cu) }.during("cuMemcpyDtoHAsync")?;
            self.stream.synchronize().during("cuStreamSynchronize")?;
            let Some(missing) = seen.iter().position(|&t| t < round) else {
                break;
            };
            if limit.is_some_and(|l| began.elapsed() > l) {
                return Ok(Exchanged::GaveUp(missing));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        let mut out = vec![0u64; n * w];
        // SAFETY: this round's half of this PE's scratch, complete (every tag has reached it).
        unsafe { memcpy_dtoh_async(&mut out, half as u64, cu) }.during("cuMemcpyDtoHAsync")?;
        self.stream.synchronize().during("cuStreamSynchronize")?;
        Ok(Exchanged::All(out))
    }
}

/// Symmetric scratch for a [`WordExchange`] of the runtime's own, allocated with NVSHMEM
/// directly (zeroed; collective); `None` when NVSHMEM refuses it.
pub(crate) fn alloc_scratch(n_pes: usize) -> Option<*mut u64> {
    let words = WordExchange::scratch_words(n_pes);
    let _host = super::host_call();
    // SAFETY: a collective allocation every PE makes at the same point.
    let p = unsafe { sys::nvshmem_calloc(words, 8) } as *mut u64;
    (!p.is_null()).then_some(p)
}

/// The record of the barrier before finalize (its kind word; the allocation check's records
/// are kinds 1 and 2).
pub(crate) const FINALIZE_KIND: u64 = 3;
