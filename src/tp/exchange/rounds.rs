//! The row-parallel layer's fused GEMM + reduce-scatter, or + all-reduce, in rounds.
//!
//! Each PE owns `tokens / n_pes` rows of the sum, cut into rounds. In each round, for each
//! peer in turn (the next PE first), the GEMM of that peer's rows into this PE's partial
//! product, and a copy engine takes them into the peer's exchange buffer, at this PE's slab,
//! and raises a flag there while the next GEMM computes; then the GEMM of this PE's own rows
//! into its own slab. On the side stream, once every peer's products of the round are here,
//! a small kernel sums the slabs in PE order into this PE's rows of the output (the numbers
//! the reduce-scatter of our collectives gives), and with a replicated output the copy
//! engines bring those rows to every peer's output, a flag each, while the next round's GEMMs
//! compute.
//!
//! With a replicated output each round's rows are one run of tokens, which the layer's
//! producer (an MLP's gate and up projection) writes just before the round, and which one
//! GEMM computes whole where another round follows; the last round is instead one GEMM and
//! our all-reduce (nothing computes beside it, so the SMs' stores to every peer at once beat
//! the copy engines). The GEMMs store locally: a GEMM storing into a peer's memory is slower
//! than the copy engines moving the same bytes beside the next GEMM.

use super::flags::{peer_bases, ChunkFlags};
use super::FUSED_EXCHANGE_TOKENS;
use crate::collectives::AllReduceAlgo;
use crate::element::ReduceOp;
use crate::error::{CudaResultExt, Result};
use crate::memory::SymmetricView;
use crate::tp::{join, shard_range, ScheduleThresholds, TensorParallel};
use cudarc::driver::{result, CudaStream};
use half::bf16;
use std::ops::Range;
use std::sync::Arc;

const BF16: usize = std::mem::size_of::<bf16>();

/// Enqueues the work that writes these rows of a row-parallel layer's input (an MLP's gate
/// and up projection and activation).
pub(in crate::tp) type Produce<'a> = Option<&'a dyn Fn(Range<usize>) -> Result<()>>;

/// Enqueue `produce`'s work for `rows`, if any.
pub(in crate::tp) fn produce_rows(produce: Produce<'_>, rows: Range<usize>) -> Result<()> {
    produce.map_or(Ok(()), |p| p(rows))
}

/// The rounds over a PE's `rows` rows: `rounds` of them (one at least), fewer where a round
/// would have fewer than [`FUSED_EXCHANGE_TOKENS`] rows (each round's GEMMs read the whole
/// weight), near-equal.
fn rounds_of(rows: usize, rounds: usize) -> Vec<Range<usize>> {
    let count = rounds.min(rows / FUSED_EXCHANGE_TOKENS).max(1);
    (0..count).map(|r| shard_range(rows, r, count)).collect()
}

/// The rounds of an exchange over `n` PEs of `rows` rows each: the thresholds' GEMMs over the
/// PE count, and where the rounds also produce their input, `fused_mlp_rounds` at least.
fn exchange_rounds(
    rows: usize,
    n: usize,
    limits: &ScheduleThresholds,
    produced: bool,
) -> Vec<Range<usize>> {
    let own = limits.fused_exchange_gemms / n.max(1);
    let rounds = match produced {
        true => own.max(limits.fused_mlp_rounds),
        false => own,
    };
    rounds_of(rows, rounds)
}

/// Where rows `part` of the `rows` rows that PE `pe` owns start among the tokens: with a
/// sequence-parallel output a PE owns its own tokens; with a replicated output each round
/// takes a run of `n ×` its rows per PE, PE `pe` owning the `pe`-th part of it.
fn owned_row(pe: usize, part: &Range<usize>, rows: usize, n: usize, replicated: bool) -> usize {
    match replicated {
        false => pe * rows + part.start,
        true => n * part.start + pe * part.len(),
    }
}

/// With a replicated output, the last of `rounds` as the run of tokens that one GEMM and our
/// all-reduce take instead of the exchange, taken off `rounds`: where that run starts on the
/// all-reduce's 16-byte boundary (`cols` bf16 features a row).
fn all_reduced_round(
    rounds: &mut Vec<Range<usize>>,
    n: usize,
    cols: usize,
) -> Option<Range<usize>> {
    let last = rounds.last()?;
    if !(n * last.start * cols).is_multiple_of(8) {
        return None;
    }
    rounds.pop().map(|part| n * part.start..n * part.end)
}

/// One fused exchange call of a row-parallel layer.
pub(in crate::tp) struct RoundsCall<'a> {
    pub tp: &'a TensorParallel,
    pub flags: &'a ChunkFlags,
    /// Where the layer's exchange buffer (one slab of partial products per PE, in PE order)
    /// lies on every PE, as mapped here.
    pub bases: &'a [u64],
    /// This PE's partial products, `tokens × cols`.
    pub partial: SymmetricView<'a, bf16>,
    /// The output: `tokens × cols` (replicated) or this PE's `tokens / n_pes` rows.
    pub y: SymmetricView<'a, bf16>,
    pub cols: usize,
    pub tokens: usize,
    pub replicated: bool,
    pub produce: Produce<'a>,
    /// `gemm(first, m, dst)`: the partial product of `m` tokens from token `first` into
    /// `dst` (rows of `cols`), on the call's stream.
    pub gemm: &'a dyn Fn(usize, usize, u64) -> Result<()>,
    pub pusher: &'a Arc<CudaStream>,
    pub stream: &'a Arc<CudaStream>,
}

/// What [`RoundsCall::run`] works out once: the rounds and the outputs' addresses.
struct Plan {
    rows: usize,
    n: usize,
    me: usize,
    rounds: Vec<Range<usize>>,
    tail: Option<Range<usize>>,
    /// Where the output lies on every PE (replicated output only).
    outputs: Vec<u64>,
}

impl Plan {
    fn first_row(&self, pe: usize, part: &Range<usize>, replicated: bool) -> usize {
        owned_row(pe, part, self.rows, self.n, replicated)
    }
}

impl RoundsCall<'_> {
    /// The whole call. Every peer's flags are raised even after a failure, so that no peer
    /// waits for ever (its output is then wrong, and this call returns the error).
    ///
    /// # Safety
    /// `tokens` is a multiple of the PE count; `gemm` and `produce` enqueue work on buffers
    /// that hold the call's tokens; the exchange buffer holds `tokens × cols` on every PE.
    pub(in crate::tp) unsafe fn run(&self) -> Result<()> {
        let (n, me) = (self.tp.n_pes(), self.tp.my_pe());
        let rows = self.tokens / n;
        let produced = self.replicated && self.produce.is_some();
        let mut rounds = exchange_rounds(rows, n, self.tp.thresholds(), produced);
        let tail = match self.replicated {
            true => all_reduced_round(&mut rounds, n, self.cols),
            false => None,
        };
        let outputs = match self.replicated {
            true => peer_bases(self.y, self.tp.collectives().members())?,
            false => Vec::new(),
        };
        let plan = Plan {
            rows,
            n,
            me,
            rounds,
            tail,
            outputs,
        };
        if !self.replicated {
            produce_rows(self.produce, 0..self.tokens)?;
        }
        let last = plan.rounds.len();
        if last > 0 {
            self.flags.open(self.stream)?;
        }
        let (mut sent, mut ready_cleared) = (Ok(()), false);
        for r in 0..last {
            sent = self.send_round(&plan, r, sent);
            sent = self.sum_round(&plan, r, sent, &mut ready_cleared);
        }
        if let Some(run) = &plan.tail {
            sent = self.all_reduce_tail(run.clone(), sent);
        }
        if last == 0 {
            return sent;
        }
        // The caller's stream waits for this PE's sums and copies (joined even after a
        // failure, so that a capture stays whole), then for every peer's, and clears the
        // flags (even after a failure, so that no late chunk is left raised).
        let side = self.tp.side();
        let joined = join(self.stream, side).and(join(self.stream, self.pusher));
        sent.and(joined)
            .and(
                self.flags
                    .close_rounds(self.stream, last as u64, ready_cleared, self.replicated),
            )
            .and(self.flags.watch(self.stream))
    }

    /// This PE's partial product of PE `pe`'s rows `part`, at their rows among the tokens
    /// (so that a round's whole run of tokens is one GEMM's output).
    fn partial_of(&self, plan: &Plan, pe: usize, part: &Range<usize>) -> u64 {
        let row = plan.first_row(pe, part, self.replicated);
        self.partial.as_ptr() as u64 + (row * self.cols * BF16) as u64
    }

    /// Where PE `pe`'s rows `part` start in this PE's slab on PE `pe`.
    fn slab_at(&self, plan: &Plan, pe: usize, part: &Range<usize>) -> u64 {
        self.bases[pe] + ((plan.me * plan.rows + part.start) * self.cols * BF16) as u64
    }

    /// Whether round `r` is one GEMM of its whole run of tokens: with a replicated output, a
    /// round followed by another (or by the all-reduced one), whose copies start after it; a
    /// last round's GEMMs are each PE's rows, so that its copies start while the next GEMM
    /// computes.
    fn whole(&self, plan: &Plan, r: usize) -> bool {
        self.replicated && (r + 1 < plan.rounds.len() || plan.tail.is_some())
    }

    /// Round `r`'s GEMMs of the peers' rows and their copies, a flag following each.
    fn send_round(&self, plan: &Plan, r: usize, mut sent: Result<()>) -> Result<()> {
        let (part, pusher, stream) = (&plan.rounds[r], self.pusher, self.stream);
        let whole = self.whole(plan, r);
        if self.replicated {
            let run = plan.n * part.start..plan.n * part.end;
            sent = sent.and_then(|()| produce_rows(self.produce, run));
        }
        if whole {
            sent = sent.and_then(|()| {
                let first = plan.first_row(0, part, true);
                (self.gemm)(first, plan.n * part.len(), self.partial_of(plan, 0, part))?;
                join(pusher, stream)
            });
        }
        for peer in self.flags.peers() {
            let local = self.partial_of(plan, peer, part);
            sent = sent.and_then(|()| {
                if !whole {
                    let first = plan.first_row(peer, part, self.replicated);
                    (self.gemm)(first, part.len(), local)?;
                    join(pusher, stream)?;
                }
                if r == 0 {
                    self.flags.take_credit(pusher, peer)?;
                }
                let to = self.slab_at(plan, peer, part);
                let bytes = part.len() * self.cols * BF16;
                // SAFETY: both ranges lie inside the exchange buffers (run's contract).
                unsafe { result::memcpy_dtod_async(to, local, bytes, pusher.cu_stream()) }
                    .during("cuMemcpyDtoDAsync")
            });
            sent = sent.and(self.flags.raise_rounds(pusher, peer, r as u64 + 1));
        }
        sent
    }

    /// Round `r`'s own rows: this PE's product, then on the side stream, beside the next
    /// round's GEMMs, the sum of the slabs (and with a replicated output, the copies of the
    /// sums to every peer, a flag each). The last round clears the `ready` flags on the side
    /// stream, and says so in `ready_cleared`.
    fn sum_round(
        &self,
        plan: &Plan,
        r: usize,
        mut sent: Result<()>,
        ready_cleared: &mut bool,
    ) -> Result<()> {
        let (part, side, me) = (&plan.rounds[r], self.tp.side(), plan.me);
        let (cols, len) = (self.cols, part.len() * self.cols);
        let dst = match self.replicated {
            false => self.y.as_ptr() as u64 + (part.start * cols * BF16) as u64,
            true => plan.outputs[me] + (plan.first_row(me, part, true) * cols * BF16) as u64,
        };
        let whole = self.whole(plan, r);
        let own = match whole {
            true => self.partial_of(plan, me, part),
            false => self.slab_at(plan, me, part),
        };
        let round = r as u64 + 1;
        sent = sent.and_then(|()| {
            if !whole {
                (self.gemm)(plan.first_row(me, part, self.replicated), part.len(), own)?;
            }
            join(side, self.stream)?;
            self.flags.wait_rounds(side, round)?;
            if r + 1 == plan.rounds.len() {
                // Off the caller's stream: no peer sends another chunk in this call.
                self.flags.clear_ready(side)?;
                *ready_cleared = true;
            }
            let src = self.bases[me] + (part.start * cols * BF16) as u64;
            let slabs = (src, (me, own));
            // SAFETY: the slabs and `dst` lie inside the call's buffers (run's contract).
            unsafe {
                self.tp
                    .sum_slabs_raw(dst, slabs, (len, plan.n, plan.rows * cols), side)
            }
        });
        // Every peer has begun this call (its chunks are here), so its output is free.
        if !self.replicated {
            return sent;
        }
        for peer in self.flags.peers() {
            sent = sent.and_then(|()| {
                let to = plan.outputs[peer] + (dst - plan.outputs[me]);
                // SAFETY: `dst`'s rows lie inside every PE's output.
                unsafe { result::memcpy_dtod_async(to, dst, len * BF16, side.cu_stream()) }
                    .during("cuMemcpyDtoDAsync")
            });
            sent = sent.and(self.flags.announce_sums(side, peer, round));
        }
        sent
    }

    /// The last run of tokens of a replicated output: one GEMM and our all-reduce, called
    /// even after a failure, so that no peer waits for ever.
    fn all_reduce_tail(&self, run: Range<usize>, sent: Result<()>) -> Result<()> {
        let span = run.start * self.cols..run.end * self.cols;
        let sent = sent.and_then(|()| {
            produce_rows(self.produce, run.clone())?;
            let dst = self.partial.as_ptr() as u64 + (span.start * BF16) as u64;
            (self.gemm)(run.start, run.len(), dst)
        });
        let reduced = self.tp.collectives().all_reduce(
            self.y.view(span.clone()),
            self.partial.view(span),
            ReduceOp::Sum,
            AllReduceAlgo::Auto,
            self.stream,
        );
        sent.and(reduced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_cover_a_pes_rows_in_near_equal_parts_of_512_rows_at_least() {
        assert_eq!(
            rounds_of(4096, 4),
            [0..1024, 1024..2048, 2048..3072, 3072..4096]
        );
        assert_eq!(
            rounds_of(2048, 4),
            [0..512, 512..1024, 1024..1536, 1536..2048]
        );
        // Rounds of fewer than FUSED_EXCHANGE_TOKENS rows are not made.
        assert_eq!(rounds_of(2047, 4), [0..682, 682..1364, 1364..2047]);
        let one = |rows: usize| {
            vec![Range {
                start: 0,
                end: rows,
            }]
        };
        assert_eq!(rounds_of(1023, 4), one(1023));
        assert_eq!(rounds_of(300, 4), one(300));
        // Zero rounds asked for: one.
        assert_eq!(rounds_of(4096, 0), one(4096));
        assert_eq!(rounds_of(1539, 3), [0..513, 513..1026, 1026..1539]);
    }

    #[test]
    fn an_mlp_takes_more_rounds_than_a_layer_alone() {
        let limits = ScheduleThresholds::default();
        let count = |rows, n, produced| exchange_rounds(rows, n, &limits, produced).len();
        // A layer alone: 8 GEMMs over the PE count.
        assert_eq!(count(4096, 4, false), 2);
        assert_eq!(count(4096, 2, false), 4);
        // An MLP's rounds: 8 at least, 512 rows each at least.
        assert_eq!(count(4096, 4, true), 8);
        assert_eq!(count(8192, 2, true), 8);
        assert_eq!(count(2048, 4, true), 4);
        assert_eq!(count(1024, 4, true), 2);
        assert_eq!(count(16384, 1, true), 8);
    }

    #[test]
    fn every_token_has_one_owner_and_replicated_rounds_are_runs_of_tokens() {
        for (tokens, n, rounds) in [(16384, 4, 4), (4104, 2, 4), (3078, 3, 2), (1026, 2, 1)] {
            let rows = tokens / n;
            for replicated in [false, true] {
                let mut owner = vec![None; tokens];
                for part in rounds_of(rows, rounds) {
                    let mut round = Vec::new();
                    for pe in 0..n {
                        let first = owned_row(pe, &part, rows, n, replicated);
                        for (i, o) in owner[first..first + part.len()].iter_mut().enumerate() {
                            assert_eq!(*o, None, "token {} owned twice", first + i);
                            *o = Some(pe);
                        }
                        round.push(first..first + part.len());
                        if !replicated {
                            // A sequence-parallel output: a PE owns its own tokens.
                            assert!(pe * rows <= first && first + part.len() <= (pe + 1) * rows);
                        }
                    }
                    if replicated {
                        // The round's rows, in PE order, make one run of n × its rows per PE.
                        round.sort_by_key(|r| r.start);
                        assert_eq!(round[0].start, n * part.start);
                        assert!(round.windows(2).all(|w| w[0].end == w[1].start));
                        assert_eq!(round[n - 1].end, n * part.end);
                    }
                }
                assert!(owner.iter().all(Option::is_some), "every token is owned");
            }
        }
    }

    #[test]
    fn the_last_replicated_round_is_all_reduced_where_its_run_is_aligned() {
        // 4 PEs, 1024 rows each in 2 rounds: the second round is tokens 2048..4096.
        let mut rounds = rounds_of(1024, 2);
        assert_eq!(all_reduced_round(&mut rounds, 4, 4096), Some(2048..4096));
        assert_eq!(rounds, vec![0..512]);
        // One round: all of it, and no exchange is left.
        let mut rounds = rounds_of(513, 4);
        assert_eq!(all_reduced_round(&mut rounds, 2, 4096), Some(0..1026));
        assert!(rounds.is_empty());
        // 3 PEs of 1539 rows in 3 rounds of 513: the last run starts at token 3078, and
        // 3078 rows of 12 features are 16-byte aligned, of 11 are not.
        let mut rounds = rounds_of(1539, 3);
        assert_eq!(all_reduced_round(&mut rounds, 3, 12), Some(3078..4617));
        let mut rounds = rounds_of(1539, 3);
        assert_eq!(all_reduced_round(&mut rounds, 3, 11), None);
        assert_eq!(rounds.len(), 3);
        assert_eq!(all_reduced_round(&mut Vec::new(), 4, 4096), None);
    }
}
