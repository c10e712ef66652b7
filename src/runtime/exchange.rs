//! Every PE's few words to every PE, from the host, with a bound: the exchange under the
//! runtime's agreements (allocations and frees, the barrier before finalize, the collectives'
//! call check). Puts on a stream of its own (copies between GPUs that NVSHMEM maps to each
//! other, the transport's puts elsewhere) and host reads of symmetric memory: nothing of it
//! waits on the GPU, so a PE that never comes leaves nothing behind. A kernel that waits for
//! it (an fcollect, a barrier on a stream) would stay on the GPU after the host gave up, and
//! hold up the process's exit, where the CUDA runtime's teardown waits for it.
//!
//! One round is not a consensus: a PE that gives up at its deadline may do so just after
//! another saw every record, which then goes on (into NVSHMEM's own unbounded collective
//! allocation, say) while the first is stranded. The bound turns a PE that stops into an
//! error on the PEs that wait for it; it cannot make PEs that time out at different moments
//! agree.

use super::pinned::PinnedWords;
use crate::error::{CudaResultExt, Result};
use cudarc::driver::sys::{self as cusys, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaStream};
use nvshmem_sys as sys;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Words of every record exchanged.
pub(crate) const RECORD_WORDS: usize = 8;

/// What the host library's lock does while an exchange waits for the other PEs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DuringWait {
    /// Held: nothing of this process may call NVSHMEM before the exchange ends (an
    /// allocation's, so that no other thread takes the GPU memory its heap check found free).
    Keep,
    /// Let go, and taken again after: this process's other threads may call NVSHMEM (a peer
    /// may be waiting for them before it can publish).
    LetGo,
}

/// How an exchange ended.
pub(crate) enum Exchanged {
    /// Every member's record, in the members' order (`RECORD_WORDS` each).
    All(Vec<u64>),
    /// Member `.0` (its place among the members) had not published within the bound.
    GaveUp(usize),
}

/// An exchange through symmetric scratch of [`scratch_words`](Self::scratch_words) words,
/// zeroed and allocated alike on every PE by the owner, who keeps it while this lives:
/// `[round][this PE's record][a tag per PE][two halves of every PE's record]`.
///
/// Each exchange is a round, counted from 1 alike on every PE: a PE puts its record into its
/// slot of the round's half on every PE and, once those puts have landed, the round into its
/// tag there, and reads its own tags until every PE's has reached the round. The halves
/// alternate: a PE that has finished round r knows every PE has begun it, so none can be two
/// rounds ahead and overwrite a half that is still being read.
pub(crate) struct WordExchange {
    scratch: *mut u64,
    /// Streams of its own, so that they wait for nothing else on the GPU: the puts (and the
    /// copy of the record before them), and the host's reads of the scratch.
    puts: Arc<CudaStream>,
    reads: Arc<CudaStream>,
    /// Pinned host words (see `PinnedWords`): the round and record the puts stream copies
    /// from, and what the reads copy into.
    staged: PinnedWords,
    seen: PinnedWords,
    /// The PEs that take part, as world PEs (every PE for the runtime's own), and this
    /// PE's place among them: records and tags sit in that order.
    members: Vec<usize>,
    me: usize,
    round: u64,
}

// SAFETY: the scratch is symmetric device memory, used only by the holder of this value,
// with the context current and the host library held (NVSHMEM's host calls).
unsafe impl Send for WordExchange {}

impl WordExchange {
    /// Words of scratch for `n_pes` members.
    pub(crate) fn scratch_words(n_pes: usize) -> usize {
        1 + RECORD_WORDS + n_pes + 2 * n_pes * RECORD_WORDS
    }

    /// An exchange between `members` (world PEs; this PE is `members[me]`) through
    /// `scratch`, putting and reading on two streams of its own in `ctx`.
    ///
    /// # Safety
    /// `scratch` is symmetric, holds [`scratch_words`](Self::scratch_words) zeroed words for
    /// at least `members.len()` on every member, and outlives this value.
    pub(crate) unsafe fn new(
        scratch: *mut u64,
        ctx: &Arc<CudaContext>,
        members: Vec<usize>,
        me: usize,
    ) -> Result<Self> {
        let n_pes = members.len();
        Ok(WordExchange {
            scratch,
            puts: ctx.new_stream().during("cuStreamCreate")?,
            reads: ctx.new_stream().during("cuStreamCreate")?,
            staged: PinnedWords::new(1 + RECORD_WORDS)?,
            seen: PinnedWords::new(n_pes.max(1) * RECORD_WORDS)?,
            members,
            me,
            round: 0,
        })
    }

    /// The world PE of member `member`.
    pub(crate) fn world_pe(&self, member: usize) -> usize {
        self.members[member]
    }

    /// Publish `record` (`RECORD_WORDS` words) and collect every member's, waiting for the
    /// others at most `limit` (`None`: for ever), with the context current. After an error
    /// the exchange cannot go on with the other PEs (its round is spent).
    pub(crate) fn exchange(
        &mut self,
        record: &[u64],
        limit: Option<Duration>,
        during_wait: DuringWait,
    ) -> Result<Exchanged> {
        assert_eq!(record.len(), RECORD_WORDS, "a record of the exchange");
        let _host = super::host_call();
        let _relaxed = RelaxedCapture::new()?;
        let (n, me, w) = (self.members.len(), self.me, RECORD_WORDS);
        self.round += 1;
        let round = self.round;
        // SAFETY: every offset lies inside the scratch (`new`'s contract).
        let (round_at, mine, tags, half) = unsafe {
            let s = self.scratch;
            let all = s.add(1 + w + n);
            (
                s,
                s.add(1),
                s.add(1 + w),
                all.add((round % 2) as usize * n * w),
            )
        };
        // The previous round's copy from here ran before its own tag landed, which that
        // round waited for.
        let staged = self.staged.as_mut_slice();
        staged[0] = round;
        staged[1..].copy_from_slice(record);
        let (put, read) = (self.puts.cu_stream(), self.reads.cu_stream());
        // SAFETY: this PE's own words of the scratch, then puts of them into the same
        // symmetric words of every PE, in stream order: the record, its delivery, the tag.
        unsafe {
            self.staged.write_to(round_at as u64, (1 + w) * 8, put)?;
            let stream = put as sys::cudaStream_t;
            let slot = half.add(me * w) as *mut c_void;
            for &pe in &self.members {
                sys::nvshmemx_putmem_on_stream(
                    slot,
                    mine as *const c_void,
                    w * 8,
                    pe as i32,
                    stream,
                );
            }
            sys::nvshmemx_quiet_on_stream(stream);
            let tag = tags.add(me) as *mut c_void;
            for &pe in &self.members {
                sys::nvshmemx_putmem_on_stream(
                    tag,
                    round_at as *const c_void,
                    8,
                    pe as i32,
                    stream,
                );
            }
        }
        // The wait for the others reads this PE's memory only: no NVSHMEM call.
        let (reads, seen) = (&self.reads, &mut self.seen);
        let mut wait = || {
            poll_tags(reads, seen, tags as u64, n, limit, |seen| {
                seen.iter().position(|&t| t < round)
            })
        };
        let waited = match during_wait {
            DuringWait::Keep => wait()?,
            DuringWait::LetGo => super::without_host_library(wait)?,
        };
        if let Some(missing) = waited {
            return Ok(Exchanged::GaveUp(missing));
        }
        // SAFETY: this round's half of this PE's scratch, complete (every tag has reached it).
        unsafe { self.seen.read_from(half as u64, n * w * 8, read) }?;
        self.reads.synchronize().during("cuStreamSynchronize")?;
        Ok(Exchanged::All(self.seen.as_mut_slice()[..n * w].to_vec()))
    }
}

/// Read the `len` words at `tags` (this PE's memory) into `seen` (pinned, at least `len`
/// words) on `reads` until `missing` finds none
/// that is still short, backing off from a read every 5 µs to one a millisecond, for at most
/// `limit`; then `Some` of the PE `missing` names. No NVSHMEM call: the host library may be
/// let go around it.
pub(crate) fn poll_tags(
    reads: &Arc<CudaStream>,
    seen: &mut PinnedWords,
    tags: u64,
    len: usize,
    limit: Option<Duration>,
    missing: impl Fn(&[u64]) -> Option<usize>,
) -> Result<Option<usize>> {
    let began = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        // SAFETY: `len` words of this PE's memory (the caller's tags).
        unsafe { seen.read_from(tags, len * 8, reads.cu_stream()) }?;
        reads.synchronize().during("cuStreamSynchronize")?;
        let Some(pe) = missing(&seen.as_mut_slice()[..len]) else {
            return Ok(None);
        };
        if limit.is_some_and(|l| began.elapsed() > l) {
            return Ok(Some(pe));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// This thread's stream-capture mode, relaxed while the value lives. The exchange's copies
/// and waits are on streams of its own that are never captured, but while another thread
/// captures a stream in the default (global) mode CUDA refuses them as possibly unsafe: an
/// agreement then failed and stranded the runtime, instead of reaching its verdict.
pub(crate) struct RelaxedCapture(CUstreamCaptureMode);

impl RelaxedCapture {
    pub(crate) fn new() -> Result<Self> {
        let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: swaps this thread's mode; the old one is put back on drop.
        unsafe { cusys::cuThreadExchangeStreamCaptureMode(&mut mode) }
            .result()
            .during("cuThreadExchangeStreamCaptureMode")?;
        Ok(RelaxedCapture(mode))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let mut mode = self.0;
        // SAFETY: as in `new`.
        let _ = unsafe { cusys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
}

/// Symmetric scratch for a [`WordExchange`] of the runtime's own and `extra` words after it,
/// allocated with NVSHMEM directly (zeroed; collective); `None` when NVSHMEM refuses it.
pub(crate) fn alloc_scratch(n_pes: usize, extra: usize) -> Option<*mut u64> {
    let words = WordExchange::scratch_words(n_pes) + extra;
    let _host = super::host_call();
    // SAFETY: a collective allocation every PE makes at the same point.
    let p = unsafe { sys::nvshmem_calloc(words, 8) } as *mut u64;
    (!p.is_null()).then_some(p)
}

/// The record of the barrier before finalize (its kind word; the allocation check's records
/// are kinds 1 and 2).
pub(crate) const FINALIZE_KIND: u64 = 3;
