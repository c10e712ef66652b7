//! How a layer orders its GEMM and its communication: the [`Schedule`] a caller asks for, the
//! [`ScheduleThresholds`] that [`Schedule::Auto`] decides by, and the one decision that turns
//! both, with the call's shape and the facts of the layer, into the path the call takes.
//! The layers only execute the path; everything here is pure and checked on the CPU.

use super::{RowOutput, FUSED_DECODE_MAX_TOKENS, FUSED_EXCHANGE_TOKENS};

/// How a layer orders its GEMM and its communication.
///
/// Every PE must make the same call with the same schedule: the choice depends only on the
/// call's shape, the group's thresholds and what every PE agreed when the weights were
/// loaded, never on anything one PE sees alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Schedule {
    /// Chosen per call by the group's [`ScheduleThresholds`]: [`Fused`](Self::Fused) where
    /// it measured faster, [`Overlapped`](Self::Overlapped) for sequence-parallel layers
    /// just below that, [`Sequential`](Self::Sequential) elsewhere. Where it fuses, the
    /// call has `Fused`'s limits (below).
    #[default]
    Auto,
    /// The GEMM, then the collective, on the caller's stream: what a user writes first. Its
    /// waits are our collectives', bounded and agreed.
    Sequential,
    /// A sequence-parallel [`ColumnParallelLinear`](super::ColumnParallelLinear) multiplies
    /// this PE's own tokens while the all-gather brings the others' on the group's second
    /// stream, then the others'. Every other layer runs it as
    /// [`Sequential`](Self::Sequential). The caller's stream waits for the second stream
    /// before the call returns, so the call can be captured in a CUDA graph. The layers of
    /// one group share that stream: make their overlapped calls one at a time.
    Overlapped,
    /// The GEMM and its communication fused, where the layer has a fused form for the call
    /// ([`Sequential`](Self::Sequential) elsewhere):
    ///
    /// - **Decode** (a [`RowParallelLinear`](super::RowParallelLinear) with a replicated
    ///   output, up to [`FUSED_DECODE_MAX_TOKENS`] tokens): our decode GEMM and the
    ///   all-reduce in one kernel, its sums sent to every peer as our collectives'
    ///   low-latency lines as each task finishes. It needs `out_features` a multiple of 4
    ///   and room in a lines slot; its waits are bounded like our collectives'.
    /// - **Exchanges** (from [`FUSED_EXCHANGE_TOKENS`] tokens per PE, several PEs): the
    ///   sequence-parallel all-gather with its GEMM, and the row-parallel GEMM with its
    ///   reduce-scatter or all-reduce, in rounds. The copy engines move each PE's rows (or
    ///   partial products, then sums) to the peers, raising a flag per chunk by stream
    ///   memory operations, while the next GEMM computes. They need a GPU with 64-bit
    ///   stream memory operations. The PEs do not agree on each call first. A watchdog
    ///   bounds the waits at `NVSHMEM_RS_TIMEOUT`: past it, the call's outputs and those of
    ///   the calls queued after it are wrong, and every later call of the layer returns
    ///   [`Error::ExchangeTimeout`](crate::Error::ExchangeTimeout). Graph replays are not
    ///   watched. PEs that share a GPU
    ///   (CUDA MPS) must each be held to their share of its SMs.
    ///
    /// The output is the same as [`Sequential`](Self::Sequential)'s schedule sums: in f32,
    /// in PE order, and with a replicated output bitwise identical on every PE.
    Fused,
}

/// Where [`Schedule::Auto`] fuses or overlaps. [`for_pes`](Self::for_pes) gives the values
/// measured with `bench --tests tp` on 2 and 4 H200s (docs/tensor-parallel.md); measure on
/// your GPUs and set your own with
/// [`TensorParallel::with_thresholds`](super::TensorParallel::with_thresholds). Every PE
/// must use the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleThresholds {
    /// Elements per PE of the exchanged rows (tokens per PE × the rows' width: a column
    /// layer's input features, a row layer's output features) from which the
    /// sequence-parallel layers fuse. A wider model fuses from fewer tokens, as its GEMMs
    /// grow faster than its exchange.
    pub fused_sequence_min_elements: usize,
    /// Elements per PE from which the sequence-parallel layers, below the fused threshold,
    /// overlap ([`Schedule::Overlapped`]); `usize::MAX`: never.
    pub overlapped_sequence_min_elements: usize,
    /// Tokens up to which a row-parallel layer with a replicated output fuses its decode GEMM
    /// with the all-reduce (at most [`FUSED_DECODE_MAX_TOKENS`]; 0: never). Only where every
    /// PE's GEMM calibration took our decode kernel and the fused kernel then measured
    /// faster on every PE, when the weight was loaded
    /// ([`RowParallelLinear::load_weight`](super::RowParallelLinear::load_weight)).
    pub fused_decode_max_tokens: usize,
    /// Elements per PE of the output (tokens per PE × output features) from which a
    /// row-parallel layer with a replicated output fuses its GEMM with the all-reduce;
    /// `usize::MAX`: never.
    pub fused_replicated_min_elements: usize,
    /// GEMMs of a row-parallel layer's fused exchange: each PE's share of the tokens is cut
    /// into this many over the PE count rounds (fewer where a round would have fewer than
    /// [`FUSED_EXCHANGE_TOKENS`] tokens per PE). More rounds leave less of the exchange after
    /// the last GEMM, and make smaller GEMMs and more copies.
    pub fused_exchange_gemms: usize,
    /// Rounds of a [`TpMlp`](super::TpMlp)'s fused GEMM + all-reduce, whose rounds also
    /// carry the gate and up projection (at least those of
    /// [`fused_exchange_gemms`](Self::fused_exchange_gemms)).
    pub fused_mlp_rounds: usize,
}

/// 1024 tokens per PE of 4096 features.
const MIN_ELEMENTS: usize = 4 << 20;

/// The thresholds of 2 PEs ([`ScheduleThresholds::for_pes`]).
impl Default for ScheduleThresholds {
    fn default() -> Self {
        ScheduleThresholds {
            fused_sequence_min_elements: MIN_ELEMENTS,
            overlapped_sequence_min_elements: MIN_ELEMENTS,
            fused_decode_max_tokens: FUSED_DECODE_MAX_TOKENS,
            fused_replicated_min_elements: MIN_ELEMENTS,
            fused_exchange_gemms: 8,
            fused_mlp_rounds: 8,
        }
    }
}

impl ScheduleThresholds {
    /// The thresholds for a group of `n_pes` PEs, which
    /// [`TensorParallel::new`](super::TensorParallel::new) takes: the [`Default`] ones, but
    /// on more than 2 PEs no fused decode and sequence-parallel exchanges fused from twice
    /// the elements, overlapped below.
    ///
    /// ```
    /// use nvshmem::tp::{Schedule, ScheduleThresholds};
    /// let (two, four) = (ScheduleThresholds::for_pes(2), ScheduleThresholds::for_pes(4));
    /// assert_eq!(two, ScheduleThresholds::default());
    /// // 1024 tokens per PE of the 8B MLP's 4096 features.
    /// assert_eq!(two.sequence(Schedule::Auto, 1024, 4096), Schedule::Fused);
    /// assert_eq!(four.sequence(Schedule::Auto, 1024, 4096), Schedule::Overlapped);
    /// ```
    pub fn for_pes(n_pes: usize) -> Self {
        let two = ScheduleThresholds::default();
        match n_pes {
            0..=2 => two,
            _ => ScheduleThresholds {
                fused_sequence_min_elements: 2 * MIN_ELEMENTS,
                fused_decode_max_tokens: 0,
                ..two
            },
        }
    }

    /// What `schedule` means for a sequence-parallel exchange of `tokens_per_pe` tokens
    /// per PE, rows of `width` elements: [`Schedule::Auto`] resolved, any other as it is.
    pub fn sequence(&self, schedule: Schedule, tokens_per_pe: usize, width: usize) -> Schedule {
        let elements = tokens_per_pe.saturating_mul(width);
        match schedule {
            Schedule::Auto if elements >= self.fused_sequence_min_elements => Schedule::Fused,
            Schedule::Auto if elements >= self.overlapped_sequence_min_elements => {
                Schedule::Overlapped
            }
            Schedule::Auto => Schedule::Sequential,
            other => other,
        }
    }

    /// What `schedule` means for a row-parallel layer with a replicated output of `width`
    /// features, at `tokens` tokens over `n_pes` PEs, where `decode_measured` says whether
    /// the fused decode kernel measured faster at `tokens` (see
    /// [`fused_decode_max_tokens`](Self::fused_decode_max_tokens)).
    pub fn replicated(
        &self,
        schedule: Schedule,
        (tokens, n_pes, width): (usize, usize, usize),
        decode_measured: bool,
    ) -> Schedule {
        let per_pe = (tokens / n_pes.max(1)).saturating_mul(width);
        match schedule {
            Schedule::Auto if tokens <= self.fused_decode_max_tokens && decode_measured => {
                Schedule::Fused
            }
            Schedule::Auto if per_pe >= self.fused_replicated_min_elements => Schedule::Fused,
            Schedule::Auto => Schedule::Sequential,
            other => other,
        }
    }
}

/// What a layer's call depends on besides its schedule, the thresholds and its tokens: the
/// same on every PE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// PEs of the group.
    pub n_pes: usize,
    /// The width of the exchanged rows: a column layer's input features, a row layer's
    /// output features.
    pub width: usize,
    /// The GPU takes the 64-bit stream memory operations the fused exchanges signal with,
    /// and the layer holds the buffers of its fused exchange.
    pub exchange: bool,
    /// The fused decode kernel takes the call (its output in whole lines of 4 features,
    /// room in a lines slot, a grid on this GPU).
    pub decode_fits: bool,
    /// The fused decode kernel measured faster at the call's tokens on every PE.
    pub decode_measured: bool,
}

/// What a [`ColumnParallelLinear`](super::ColumnParallelLinear) call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColumnPath {
    /// The GEMM alone: replicated input.
    Local,
    /// Our all-gather, then the GEMM.
    Sequential,
    /// This PE's rows' GEMM beside the all-gather, then the others'.
    Overlapped,
    /// The copy engines' all-gather with a flag per PE, and a GEMM per PE's rows.
    FusedGather,
}

/// What a [`RowParallelLinear`](super::RowParallelLinear) call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowPath {
    /// The GEMM, then our all-reduce or reduce-scatter.
    Sequential,
    /// The decode GEMM and the all-reduce in one kernel.
    FusedDecode,
    /// The GEMMs in rounds, the exchange of each beside the next.
    Exchange,
}

impl ColumnPath {
    /// The schedule this path is a form of.
    pub(crate) fn schedule(self) -> Schedule {
        match self {
            ColumnPath::Local | ColumnPath::Sequential => Schedule::Sequential,
            ColumnPath::Overlapped => Schedule::Overlapped,
            ColumnPath::FusedGather => Schedule::Fused,
        }
    }
}

impl RowPath {
    /// The schedule this path is a form of.
    pub(crate) fn schedule(self) -> Schedule {
        match self {
            RowPath::Sequential => Schedule::Sequential,
            RowPath::FusedDecode | RowPath::Exchange => Schedule::Fused,
        }
    }
}

/// Whether `tokens` over `n_pes` PEs make a fused exchange: several PEs sharing the tokens
/// equally, [`FUSED_EXCHANGE_TOKENS`] each at least.
fn exchanges(tokens: usize, n_pes: usize) -> bool {
    n_pes > 1 && tokens.is_multiple_of(n_pes) && tokens / n_pes >= FUSED_EXCHANGE_TOKENS
}

/// The path of a column-parallel call of `tokens` tokens (every PE's together) in
/// `schedule`; `sequence` says whether its input is sequence parallel.
pub(crate) fn column_path(
    limits: &ScheduleThresholds,
    schedule: Schedule,
    (sequence, tokens): (bool, usize),
    facts: Facts,
) -> ColumnPath {
    let n = facts.n_pes.max(1);
    if !sequence {
        return ColumnPath::Local;
    }
    match limits.sequence(schedule, tokens / n, facts.width) {
        Schedule::Fused if facts.exchange && exchanges(tokens, n) => ColumnPath::FusedGather,
        Schedule::Overlapped if n > 1 => ColumnPath::Overlapped,
        _ => ColumnPath::Sequential,
    }
}

/// The path of a row-parallel call of `tokens` tokens with `output` in `schedule`.
pub(crate) fn row_path(
    limits: &ScheduleThresholds,
    schedule: Schedule,
    (output, tokens): (RowOutput, usize),
    facts: Facts,
) -> RowPath {
    let n = facts.n_pes.max(1);
    let exchange = facts.exchange && exchanges(tokens, n);
    let resolved = match output {
        RowOutput::SequenceParallel => limits.sequence(schedule, tokens / n, facts.width),
        RowOutput::Replicated => {
            let shape = (tokens, n, facts.width);
            limits.replicated(schedule, shape, facts.decode_measured)
        }
    };
    let decode = output == RowOutput::Replicated
        && (1..=FUSED_DECODE_MAX_TOKENS).contains(&tokens)
        && facts.decode_fits;
    match resolved {
        Schedule::Fused if decode => RowPath::FusedDecode,
        Schedule::Fused if exchange => RowPath::Exchange,
        _ => RowPath::Sequential,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RowOutput::{Replicated as Rep, SequenceParallel as Sp};
    use Schedule::{Auto, Fused, Overlapped, Sequential as Seq};

    /// A layer of the 8B MLP's width on `n_pes` PEs whose facts are all true but `off`
    /// ("exchange", "fits" or "measured").
    fn facts(n_pes: usize, off: &str) -> Facts {
        Facts {
            n_pes,
            width: 4096,
            exchange: off != "exchange",
            decode_fits: off != "fits",
            decode_measured: off != "measured",
        }
    }

    #[test]
    fn auto_resolves_by_the_thresholds_of_the_pe_count() {
        let (two, four) = (
            ScheduleThresholds::for_pes(2),
            ScheduleThresholds::for_pes(4),
        );
        // Sequence parallel, tokens per PE of a width: on 4 PEs fused from 8 Mi elements,
        // overlapped from 4 Mi; on 2 PEs fused from 4 Mi, never overlapped.
        let sequence = [
            (&four, 2048, 4096, Fused),
            (&four, 2047, 4096, Overlapped),
            (&four, 1024, 4096, Overlapped),
            (&four, 1023, 4096, Seq),
            (&four, 1024, 8192, Fused),
            (&four, 511, 8192, Seq),
            (&four, usize::MAX, 2, Fused),
            (&two, 1024, 4096, Fused),
            (&two, 1023, 4096, Seq),
        ];
        for (t, per_pe, width, want) in sequence {
            assert_eq!(t.sequence(Auto, per_pe, width), want, "{per_pe} × {width}");
        }
        // Replicated, (tokens, PEs, width) and whether fused decode measured faster.
        let replicated = [
            (&two, (1, 2, 4096), true, Fused),
            (&two, (8, 2, 4096), true, Fused),
            (&two, (8, 2, 4096), false, Seq),
            (&two, (9, 2, 4096), true, Seq),
            (&four, (1, 4, 4096), true, Seq),
            (&two, (2048, 2, 4096), false, Fused),
            (&two, (2046, 2, 4096), false, Seq),
            (&four, (4096, 4, 4096), false, Fused),
            (&four, (4092, 4, 4096), false, Seq),
            (&two, (4096, 0, 4096), false, Fused),
        ];
        for (t, shape, measured, want) in replicated {
            assert_eq!(t.replicated(Auto, shape, measured), want, "{shape:?}");
        }
        let never = ScheduleThresholds {
            overlapped_sequence_min_elements: usize::MAX,
            ..four
        };
        assert_eq!(never.sequence(Auto, 2047, 4096), Seq);
    }

    #[test]
    fn a_named_schedule_stays_as_it_is() {
        let t = ScheduleThresholds::for_pes(4);
        for s in [Seq, Fused, Overlapped] {
            for tokens in [1, 8192] {
                assert_eq!(t.sequence(s, tokens, 4096), s);
                assert_eq!(t.replicated(s, (tokens, 2, 4096), false), s);
            }
        }
        assert_eq!(Schedule::default(), Auto);
    }

    #[test]
    fn more_than_two_pes_never_fuse_decode_and_fuse_sequence_parallelism_later() {
        let two = ScheduleThresholds::default();
        for n in [0, 1, 2] {
            assert_eq!(ScheduleThresholds::for_pes(n), two);
        }
        let more = ScheduleThresholds {
            fused_decode_max_tokens: 0,
            fused_sequence_min_elements: 2 * two.fused_sequence_min_elements,
            ..two
        };
        for n in [3, 4, 8] {
            assert_eq!(ScheduleThresholds::for_pes(n), more);
        }
    }

    #[test]
    fn every_column_path_auto_distinguishes() {
        use ColumnPath::{FusedGather, Local, Overlapped as Over, Sequential as S};
        let few = 2 * (FUSED_EXCHANGE_TOKENS - 1);
        // (PEs, schedule, sequence-parallel input, tokens, the fact that is off, path)
        let cases = [
            (4, Auto, false, 8192, "", Local),
            (4, Auto, true, 4 * 2048, "", FusedGather),
            (4, Auto, true, 4 * 1024, "", Over),
            (4, Auto, true, 4 * 511, "", S),
            (2, Auto, true, 2 * 1024, "", FusedGather),
            (2, Auto, true, 2 * 1023, "", S),
            (2, Auto, true, 2 * 1024, "exchange", S),
            (2, Fused, true, few, "", S),
            (1, Overlapped, true, 64, "", S),
            (1, Fused, true, 4096, "", S),
        ];
        for (n, s, sequence, tokens, off, want) in cases {
            let t = ScheduleThresholds::for_pes(n);
            let got = column_path(&t, s, (sequence, tokens), facts(n, off));
            assert_eq!(got, want, "{n} PEs {s:?} {tokens} tokens, {off} off");
        }
    }

    #[test]
    fn every_row_path_auto_distinguishes() {
        use RowPath::{Exchange, FusedDecode, Sequential as S};
        let past = FUSED_DECODE_MAX_TOKENS + 1;
        // (PEs, schedule, output, tokens, the fact that is off, path)
        let cases = [
            (2, Auto, Rep, 8, "", FusedDecode),
            (2, Auto, Rep, 8, "measured", S),
            (2, Auto, Rep, 8, "fits", S),
            (2, Fused, Rep, 8, "fits", S),
            (4, Auto, Rep, 1, "", S),
            (4, Fused, Rep, 1, "", FusedDecode),
            (2, Fused, Rep, past, "", S),
            (4, Auto, Rep, 4096, "", Exchange),
            (4, Auto, Rep, 2048, "", S),
            (2, Auto, Rep, 2048, "", Exchange),
            (2, Fused, Rep, 2049, "", S),
            (4, Auto, Sp, 8192, "", Exchange),
            (4, Auto, Sp, 4096, "", S),
            (4, Overlapped, Sp, 8192, "", S),
            (4, Auto, Sp, 8192, "exchange", S),
            (2, Fused, Sp, 2, "", S),
        ];
        for (n, s, output, tokens, off, want) in cases {
            let t = ScheduleThresholds::for_pes(n);
            let got = row_path(&t, s, (output, tokens), facts(n, off));
            assert_eq!(
                got, want,
                "{n} PEs {s:?} {output:?} {tokens} tokens, {off} off"
            );
        }
    }

    #[test]
    fn paths_say_which_schedule_they_are() {
        assert_eq!(ColumnPath::Local.schedule(), Seq);
        assert_eq!(ColumnPath::Overlapped.schedule(), Overlapped);
        assert_eq!(ColumnPath::FusedGather.schedule(), Fused);
        assert_eq!(RowPath::FusedDecode.schedule(), Fused);
        assert_eq!(RowPath::Exchange.schedule(), Fused);
        assert_eq!(RowPath::Sequential.schedule(), Seq);
    }
}
