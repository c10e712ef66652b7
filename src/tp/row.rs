//! The row-parallel linear layer: each PE holds some of the input features, and the partial
//! products are summed across the PEs.

use super::exchange::{peer_bases, ChunkFlags};
use super::gemm::Stopwatch;
use super::{check_tokens, check_weight, join, rows_of, shard_range, take_cols, LinearShape};
use super::{GemmPath, Schedule, ScheduleThresholds, TensorParallel, DECODE_MAX_TOKENS};
use crate::abi;
use crate::collectives::{AllReduceAlgo, ReduceScatterAlgo};
use crate::element::ReduceOp;
use crate::error::{CudaResultExt, Error, Result};
use crate::memory::{DeviceBuffer, DeviceSlice, SymmetricBuffer, SymmetricView};
use cudarc::driver::{result, CudaStream};
use half::bf16;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// `y = x · wᵀ` with the weight's input features (its columns) sharded across the PEs: PE
/// `p` holds input features [`shard_range`]`(in, p, n)` of `x` and of `w`, multiplies them
/// into a partial product (rounded to bf16, as a cuBLAS GEMM writes it), and the PEs' partial
/// products are summed in f32, in PE order: by an all-reduce, so that `y` is replicated and
/// bitwise identical on every PE ([`RowOutput::Replicated`]), or by a reduce-scatter, so that
/// each PE gets its share of the tokens ([`RowOutput::SequenceParallel`]).
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::{bf16, tp::{RowParallelLinear, TensorParallel}};
/// let shmem = nvshmem::Nvshmem::init()?;
/// let tp = TensorParallel::new(&shmem)?;
/// let o_proj = RowParallelLinear::new(&tp, 4096, 4096, 128)?;
/// o_proj.load_weight(&vec![bf16::ZERO; 4096 * 4096])?;
/// let x = shmem.alloc_device::<bf16>(128 * o_proj.local_in_features().len())?;
/// let y = shmem.malloc::<bf16>(128 * 4096)?;
/// o_proj.forward(&y, &x, shmem.stream())?;
/// # Ok(()) }
/// ```
pub struct RowParallelLinear {
    tp: TensorParallel,
    output: RowOutput,
    in_features: usize,
    out_features: usize,
    local_in: Range<usize>,
    max_tokens: usize,
    weight: DeviceBuffer<bf16>,
    /// This PE's partial product, which the all-reduce reads.
    partial: SymmetricBuffer<bf16>,
    /// The all-reduced pieces of an overlapped call cut along the output features, before
    /// their columns go in place (up to `PIECES_BY_FEATURES_TOKENS` tokens).
    reduced: SymmetricBuffer<bf16>,
    /// The fused GEMM + reduce-scatter, or + all-reduce with a replicated output (several
    /// PEs; with a replicated output, where the layer takes `FUSED_SCATTER_TOKENS` tokens
    /// per PE).
    exchange: Option<Exchange>,
    /// Bit m - 1: [`Schedule::Auto`] may fuse the GEMM of m tokens with the all-reduce.
    /// Every PE's calibration took our decode kernel there, and the fused kernel measured
    /// faster on every PE (agreed when the weight was loaded).
    fused_decode: AtomicU32,
    /// Where the PEs agree (one flag per token count, the minimum over PEs).
    agreed: SymmetricBuffer<i32>,
}

/// What the fused GEMM + reduce-scatter (or + all-reduce) of a row-parallel layer keeps.
struct Exchange {
    flags: ChunkFlags,
    /// Where every PE's GEMM stores the partial products of this PE's tokens (one slab per
    /// PE, in PE order)...
    _received: SymmetricBuffer<bf16>,
    /// ...and where that buffer lies on every PE.
    bases: Vec<u64>,
}

/// Tokens per piece from which a GEMM piece is compute-bound, so that cutting along the
/// tokens costs little (below it, each piece would read the whole weight again): Hopper does
/// about 200-300 bf16 flops per byte of memory traffic, and a GEMM of `m` tokens about `m`
/// per byte of weight.
const TOKENS_PER_PIECE: usize = 512;

/// Tokens per PE from which a row-parallel layer has a fused GEMM + reduce-scatter
/// ([`Schedule::Fused`]): each peer's tokens make a GEMM of their own, which reads the whole
/// weight, so only where that GEMM is compute-bound.
pub const FUSED_SCATTER_TOKENS: usize = TOKENS_PER_PIECE;

/// Enqueues the work that writes these rows of a row-parallel layer's input
/// ([`RowParallelLinear::run_producing`]).
pub(super) type Produce<'a> = Option<&'a dyn Fn(Range<usize>) -> Result<()>>;

/// Enqueue `produce`'s work for `rows`, if any.
fn produce_rows(produce: Produce<'_>, rows: Range<usize>) -> Result<()> {
    produce.map_or(Ok(()), |p| p(rows))
}

/// The rounds of the fused GEMM + reduce-scatter or + all-reduce over a PE's `rows` rows:
/// `rounds` of them (one at least), fewer where a round would have fewer than
/// [`TOKENS_PER_PIECE`] rows (each round's GEMMs read the whole weight), near-equal.
fn rounds_of(rows: usize, rounds: usize) -> Vec<Range<usize>> {
    let count = rounds.min(rows / TOKENS_PER_PIECE).max(1);
    (0..count).map(|r| shard_range(rows, r, count)).collect()
}

/// The rounds of a fused exchange over `n` PEs of `rows` rows each ([`rounds_of`]): the
/// thresholds' GEMMs over the PE count, and where the rounds also produce their input (an
/// MLP's gate and up projection), `fused_mlp_rounds` at least.
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

/// Where rows `part` of the `rows` rows that PE `pe` owns in a fused exchange over `n` PEs
/// start among the tokens: with a sequence-parallel output (`replicated` false) a PE owns
/// its own tokens; with a replicated output any rows will do, and each round takes a run
/// of `n ×` its rows per PE, PE `pe` owning the `pe`-th part of it, so that the round's
/// input can be produced in one piece.
fn owned_row(pe: usize, part: &Range<usize>, rows: usize, n: usize, replicated: bool) -> usize {
    match replicated {
        false => pe * rows + part.start,
        true => n * part.start + pe * part.len(),
    }
}

/// With a replicated output, the last of `rounds` (each PE's rows of it, [`owned_row`]) as
/// the run of tokens that one GEMM and our all-reduce take instead of the exchange, taken
/// off `rounds`: where that run starts on the all-reduce's 16-byte boundary (`cols` bf16
/// features a row). Nothing computes beside the last round, so the SMs' stores, to every
/// peer at once, beat the copy engines' copies one peer after another there (4 H200s: the
/// 8B MLP 3.8-4.3% faster at 4096 and 8192 tokens, docs/gemm.md).
fn all_reduced_round(
    rounds: &mut Vec<Range<usize>>,
    n: usize,
    cols: usize,
) -> Option<Range<usize>> {
    let last = rounds.last()?;
    if (n * last.start * cols) % 8 != 0 {
        return None;
    }
    rounds.pop().map(|part| n * part.start..n * part.end)
}

/// Tokens up to which an overlapped call may cut along the output features (the reduced
/// scratch holds that many).
const PIECES_BY_FEATURES_TOKENS: usize = 2048;

/// How an overlapped row-parallel call is cut.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pieces {
    /// Not at all.
    Whole,
    /// Along the tokens, these rows each.
    Tokens(Vec<Range<usize>>),
    /// Along the output features, this many each (the last fewer).
    Features(usize),
}

/// The cut of `tokens × features` into about `chunks` pieces. Every piece starts on a
/// 16-byte boundary of the partial product (our collectives' alignment): token pieces start
/// at multiples of `8 / gcd(features, 8)` rows, feature pieces are multiples of 8 wide.
fn pieces(tokens: usize, features: usize, chunks: usize, reduced_tokens: usize) -> Pieces {
    let chunks = chunks.min(tokens.max(features)).max(1);
    let by_tokens = tokens >= TOKENS_PER_PIECE.saturating_mul(chunks);
    if by_tokens || (tokens > reduced_tokens && tokens >= chunks) {
        let g = 8 / gcd(features, 8);
        let mut rows: Vec<Range<usize>> = Vec::new();
        let mut start = 0;
        for c in 1..=chunks {
            let end = if c == chunks {
                tokens
            } else {
                shard_range(tokens, c - 1, chunks).end / g * g
            };
            if end > start {
                rows.push(start..end);
                start = end;
            }
        }
        return match rows.len() {
            0 | 1 => Pieces::Whole,
            _ => Pieces::Tokens(rows),
        };
    }
    if tokens > reduced_tokens {
        return Pieces::Whole;
    }
    let width = features.div_ceil(chunks).div_ceil(8) * 8;
    if width >= features {
        Pieces::Whole
    } else {
        Pieces::Features(width)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// What a [`RowParallelLinear`] leaves in its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowOutput {
    /// Every PE gets every token (an all-reduce): `y` is `tokens × out_features`, the same
    /// bits on every PE.
    #[default]
    Replicated,
    /// Each PE gets an equal share of the tokens, in PE order (a reduce-scatter; sequence
    /// parallelism, the counterpart of [`ColumnInput::SequenceParallel`]): `y` is
    /// `tokens / n_pes × out_features`, and `tokens` must be a multiple of `n_pes`.
    /// [`Schedule::Fused`] has a fused form (see there); [`Schedule::Overlapped`] runs
    /// sequentially.
    ///
    /// [`ColumnInput::SequenceParallel`]: super::ColumnInput::SequenceParallel
    SequenceParallel,
}

impl RowParallelLinear {
    /// A layer of `in_features → out_features` with a zero weight and a replicated output,
    /// for up to `max_tokens` tokens per call. Allocates symmetric memory for the partial
    /// products: collective. With several PEs and `max_tokens` of at least `n_pes ×`
    /// [`FUSED_SCATTER_TOKENS`], also for [`Schedule::Fused`]'s GEMM + reduce-scatter: the
    /// partial products' size again, and a PE's share of it.
    pub fn new(
        tp: &TensorParallel,
        in_features: usize,
        out_features: usize,
        max_tokens: usize,
    ) -> Result<Self> {
        Self::with_output(
            tp,
            in_features,
            out_features,
            RowOutput::Replicated,
            max_tokens,
        )
    }

    /// [`new`](Self::new) with the output `output`.
    pub fn with_output(
        tp: &TensorParallel,
        in_features: usize,
        out_features: usize,
        output: RowOutput,
        max_tokens: usize,
    ) -> Result<Self> {
        let (n, me) = (tp.n_pes(), tp.my_pe());
        if in_features < n || out_features == 0 {
            return Err(Error::InvalidArgument(format!(
                "a row-parallel layer of {in_features} → {out_features} features over {n} PEs: \
                 it needs output features and at least one input feature per PE"
            )));
        }
        let local_in = shard_range(in_features, me, n);
        let shmem = tp.runtime();
        // The collective allocations first: a PE that fails a local one afterwards leaves no
        // other PE waiting in a collective one.
        let partial = shmem.malloc::<bf16>(max_tokens * out_features)?;
        let reduced_tokens = match output {
            RowOutput::Replicated => max_tokens.min(PIECES_BY_FEATURES_TOKENS),
            RowOutput::SequenceParallel => 0,
        };
        let reduced = shmem.malloc::<bf16>(reduced_tokens * out_features)?;
        let agreed = shmem.malloc::<i32>(DECODE_MAX_TOKENS)?;
        // The fused exchange's buffers.
        let fuses = n > 1
            && match output {
                RowOutput::SequenceParallel => true,
                RowOutput::Replicated => max_tokens / n >= FUSED_SCATTER_TOKENS,
            };
        let exchange = if fuses {
            let received = shmem.malloc::<bf16>(max_tokens * out_features)?;
            let bases = peer_bases(&received)?;
            Some(Exchange {
                flags: ChunkFlags::new(shmem)?,
                _received: received,
                bases,
            })
        } else {
            None
        };
        let weight = shmem.alloc_device::<bf16>(out_features * local_in.len())?;
        Ok(RowParallelLinear {
            tp: tp.clone(),
            output,
            in_features,
            out_features,
            local_in,
            max_tokens,
            weight,
            partial,
            reduced,
            exchange,
            fused_decode: AtomicU32::new(0),
            agreed,
        })
    }

    /// Input features of the whole layer.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// What the layer leaves in its output.
    pub fn output(&self) -> RowOutput {
        self.output
    }

    /// The input features this PE holds: the columns of its `x`.
    pub fn local_in_features(&self) -> Range<usize> {
        self.local_in.clone()
    }

    /// This PE's weight shard, `out_features × local_in_features().len()`, row-major.
    pub fn weight(&self) -> &DeviceBuffer<bf16> {
        &self.weight
    }

    /// Keep this PE's columns of the full weight (`out_features × in_features`, row-major).
    /// Then measures which GEMM path [`GemmPath::Auto`] takes for this shard on this GPU up
    /// to 16 tokens, and cuBLASLt's fastest algorithm up to 256 tokens
    /// ([`Gemm::calibrate`](super::Gemm::calibrate)), and agrees with every PE on the token
    /// counts where every PE's is our decode kernel. Where the thresholds would fuse there
    /// ([`ScheduleThresholds::fused_decode_max_tokens`](super::ScheduleThresholds::fused_decode_max_tokens)),
    /// it times the fused decode kernel against that kernel and the all-reduce one after the
    /// other (a few milliseconds per token count), and [`Schedule::Auto`] fuses only where
    /// the fused kernel was faster on every PE: on some GPUs it is, on others not (the 8B
    /// MLP's down projection on 2 H200s at 1 to 4 tokens; not on 2 H100s; docs/gemm.md).
    /// Collective: every PE calls it.
    pub fn load_weight(&self, full: &[bf16]) -> Result<()> {
        check_weight(
            "the row-parallel weight (out_features × in_features)",
            full.len(),
            self.out_features,
            self.in_features,
        )?;
        // No fusing at decode until this weight is measured, whatever fails below.
        self.fused_decode.store(0, Ordering::Relaxed);
        self.weight
            .copy_from_host(&take_cols(full, self.in_features, self.local_in.clone()))?;
        // Which of our decode kernel and cuBLASLt GemmPath::Auto takes on this GPU...
        let k = self.local_in.len();
        // (measure_fused's input, before the agreement: a PE without it agrees to none)
        let x = self
            .tp
            .runtime()
            .alloc_device::<bf16>(DECODE_MAX_TOKENS.min(self.max_tokens) * k);
        let calibrated =
            self.tp
                .gemm()
                .calibrate(&self.weight, self.out_features, k, self.max_tokens);
        // ...and where it is ours on every PE (the minimum of 0/1 flags over the PEs, through
        // our collectives: bounded waits). A PE whose calibration failed takes part with
        // none, then reports its error.
        let mine: Vec<i32> = (1..=DECODE_MAX_TOKENS)
            .map(|m| {
                let decode = calibrated.is_ok()
                    && x.is_ok()
                    && m <= self.max_tokens
                    && self.gemm_path(m) == GemmPath::Decode;
                i32::from(decode)
            })
            .collect();
        let decode = self.agree(&mine)?;
        // ...and where the fused kernel is faster than it and the all-reduce in turn (no
        // token count where any PE's calibration failed).
        let x = x?; // no bit of `decode` is set where it failed on any PE
        let fused = self.measure_fused(decode, &x)?;
        self.fused_decode.store(fused, Ordering::Relaxed);
        calibrated
    }

    /// The token counts (bit m - 1 for m tokens) where `mine[m - 1]` is 1 on every PE.
    /// Collective.
    fn agree(&self, mine: &[i32]) -> Result<u32> {
        self.agreed.copy_from_host(mine)?;
        let stream = self.tp.runtime().stream();
        self.tp.collectives().all_reduce(
            &self.agreed,
            &self.agreed,
            ReduceOp::Min,
            AllReduceAlgo::Auto,
            stream,
        )?;
        stream.synchronize().during("cuStreamSynchronize")?;
        let every = self.agreed.to_vec()?;
        Ok((0..DECODE_MAX_TOKENS)
            .filter(|&i| every[i] == 1)
            .fold(0u32, |bits, i| bits | 1 << i))
    }

    /// Of the token counts in `decode` (bit m - 1), those where the thresholds fuse and
    /// the fused decode kernel measured faster than the decode GEMM and the all-reduce one
    /// after the other, on every PE. Every PE measures the same token counts (the
    /// thresholds, the shape and `decode` are the same everywhere), on `x`'s zeros (the
    /// kernels' time does not depend on the values; `x` holds the most tokens measured).
    /// Collective.
    fn measure_fused(&self, decode: u32, x: &DeviceBuffer<bf16>) -> Result<u32> {
        let (n, limits) = (self.tp.n_pes(), self.tp.thresholds());
        let todo: Vec<usize> = (1..=DECODE_MAX_TOKENS.min(self.max_tokens))
            .filter(|&m| {
                self.output == RowOutput::Replicated
                    && decode & 1 << (m - 1) != 0
                    && limits.replicated(Schedule::Auto, m, n, self.out_features) == Schedule::Fused
                    && self.tp.fuses_decode(m, self.out_features)
            })
            .collect();
        if todo.is_empty() {
            return Ok(0);
        }
        let stream = self.tp.runtime().stream();
        let ways = [Schedule::Sequential, Schedule::Fused];
        let mut watch = Stopwatch::new(self.tp.runtime());
        let enqueued = todo.iter().try_for_each(|&m| {
            // The output in `reduced`, which holds max_tokens rows up to
            // PIECES_BY_FEATURES_TOKENS (so m of them) and which neither schedule uses here.
            let y = self.reduced.view(..m * self.out_features);
            // SAFETY: `x` holds at least m × local_in elements.
            let call = |way: usize| unsafe { self.run(y, x.device_ptr(), m, ways[way], stream) };
            (0..ways.len()).try_for_each(call)?; // warm-up
            watch.rounds(m, ways.len(), stream, call)
        });
        // One wait at the end, also after a failure (x must outlive what was enqueued).
        stream.synchronize().during("cuStreamSynchronize")?;
        let ms = enqueued.and_then(|()| watch.totals());
        let mine: Vec<i32> = (1..=DECODE_MAX_TOKENS)
            .map(|m| match &ms {
                Ok(ms) if todo.contains(&m) => i32::from(ms[&(m, 1)] < ms[&(m, 0)]),
                _ => 0,
            })
            .collect();
        // Every PE takes part in the agreement, also one whose measurement failed.
        let fused = self.agree(&mine)?;
        ms.map(|_| fused)
    }

    /// The schedule that [`forward`](Self::forward) ([`Schedule::Auto`]) takes for `tokens`
    /// tokens: [`Schedule::Fused`] where the group's
    /// [`ScheduleThresholds`](super::ScheduleThresholds) fuse (for decode, where every PE's
    /// calibration also took our decode kernel, and the fused kernel measured faster, when
    /// the weight was loaded), with a sequence-parallel output [`Schedule::Overlapped`] just
    /// below that (which this layer runs as `Sequential`; a
    /// [`SequenceParallelMlp`](super::SequenceParallelMlp)'s all-gather overlaps), else
    /// [`Schedule::Sequential`]. A fused call runs sequentially where `Fused` has no form of
    /// its own for it (see there). The same on every PE.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::tp::{RowParallelLinear, Schedule, TensorParallel};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let tp = TensorParallel::new(&shmem)?;
    /// let down = RowParallelLinear::new(&tp, 14336, 4096, 8192)?;
    /// down.load_weight(&vec![nvshmem::bf16::ZERO; 4096 * 14336])?;
    /// if down.auto_schedule(1) == Schedule::Fused {
    ///     println!("one token: the decode GEMM and its all-reduce in one kernel");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn auto_schedule(&self, tokens: usize) -> Schedule {
        self.resolve(Schedule::Auto, tokens)
    }

    /// What `schedule` means for a call of `tokens` tokens: [`Schedule::Auto`] resolved by
    /// the thresholds and, for the fused decode kernel, the PEs' agreement.
    fn resolve(&self, schedule: Schedule, tokens: usize) -> Schedule {
        let (n, limits) = (self.tp.n_pes(), self.tp.thresholds());
        if self.output == RowOutput::SequenceParallel {
            return limits.sequence(schedule, tokens / n.max(1), self.out_features);
        }
        match limits.replicated(schedule, tokens, n, self.out_features) {
            // The fused decode kernel multiplies with our decode GEMM: Auto fuses only where
            // that is the GEMM every PE would take anyway (where cuBLASLt measured faster,
            // the all-reduce saved costs less than the GEMM loses) and where the fused kernel
            // measured faster than it and the all-reduce in turn; agreed, so that every PE
            // makes the same call.
            Schedule::Fused
                if schedule == Schedule::Auto
                    && (1..=DECODE_MAX_TOKENS).contains(&tokens)
                    && self.fused_decode.load(Ordering::Relaxed) & 1 << (tokens - 1) == 0 =>
            {
                Schedule::Sequential
            }
            other => other,
        }
    }

    /// `y = Σ over PEs of x_p · w_pᵀ`, on `stream`: `x` is this PE's `tokens ×
    /// local_in_features`; `y` is `tokens × out_features`, the same on every PE afterwards,
    /// or this PE's `tokens / n_pes` rows of it ([`RowOutput`]). In [`Schedule::Auto`].
    pub fn forward<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceSlice<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.forward_with(y, x, Schedule::Auto, stream)
    }

    /// [`forward`](Self::forward) with a [`Schedule`]: [`Schedule::Overlapped`] cuts the
    /// GEMM into pieces (along the tokens or the output features, see there) and
    /// all-reduces each piece while the next one computes; [`Schedule::Fused`] computes and
    /// all-reduces decode batches in one kernel, and with a sequence-parallel output stores
    /// each peer's partial products straight into that peer's memory (see there).
    pub fn forward_with<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceSlice<bf16>,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let tokens = rows_of("the row-parallel input", x.len(), self.local_in.len())?;
        // SAFETY: `x` holds `tokens × local_in` elements.
        unsafe { self.run(y.into(), x.device_ptr(), tokens, schedule, stream) }
    }

    /// The GEMM into the partial product and the all-reduce into `y`, in `schedule`.
    ///
    /// # Safety
    /// `x` holds `tokens × local_in` elements of this PE's GPU.
    pub(super) unsafe fn run(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        tokens: usize,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.run_producing(y, x, tokens, schedule, stream, None)
    }

    /// [`run`](Self::run) of an input that `produce` writes on `stream` as the call goes:
    /// `produce(rows)` enqueues the work that writes those rows of `x`, after every check.
    /// The fused GEMM + all-reduce produces each round's rows just before the round's
    /// GEMMs, so that a round's exchange travels beside the next round's production (the
    /// MLP's gate and up projection), in at least
    /// [`fused_mlp_rounds`](super::ScheduleThresholds::fused_mlp_rounds) rounds; every
    /// other schedule produces every row first.
    ///
    /// # Safety
    /// As for [`run`](Self::run), once `produce` has written the rows.
    pub(super) unsafe fn run_producing(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        tokens: usize,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
        produce: Produce<'_>,
    ) -> Result<()> {
        check_tokens("RowParallelLinear::forward", tokens, self.max_tokens)?;
        if self.output == RowOutput::SequenceParallel {
            return self.reduce_scatter(y, x, tokens, schedule, stream, produce);
        }
        if y.len() != tokens * self.out_features {
            return Err(Error::Length {
                what: "the row-parallel output (tokens × out_features)",
                expected: tokens * self.out_features,
                got: y.len(),
            });
        }
        let resolved = self.resolve(schedule, tokens);
        // Fused: the decode kernel for a few tokens, the exchange in rounds for many.
        let decode = resolved == Schedule::Fused && self.tp.fuses_decode(tokens, self.out_features);
        if resolved == Schedule::Fused && !decode {
            if let (Some(exchange), Some(pusher)) = (self.scatters(tokens), self.tp.pusher()) {
                return self.gemm_exchange(exchange, pusher, y, (x, produce), tokens, stream);
            }
        }
        produce_rows(produce, 0..tokens)?;
        let chunks = match resolved {
            Schedule::Overlapped { chunks } if chunks >= 2 => chunks,
            Schedule::Fused if decode => {
                let lin = abi::DecodeLinear {
                    w: self.weight.device_ptr(),
                    m: tokens as u64,
                    n: self.out_features as u64,
                    k: self.local_in.len() as u64,
                };
                return self.tp.decode_all_reduce_raw(y, x, lin, stream);
            }
            _ => return self.piece(y, x, 0..tokens, stream),
        };
        match pieces(tokens, self.out_features, chunks, self.reduced_tokens()) {
            Pieces::Whole => self.piece(y, x, 0..tokens, stream),
            Pieces::Tokens(rows) => self.by_tokens(y, x, &rows, stream),
            Pieces::Features(width) => self.by_features(y, x, tokens, width, stream),
        }
    }

    /// The GEMM of every token, then the reduce-scatter that leaves this PE its share; or,
    /// [`Schedule::Fused`], both in one exchange ([`gemm_exchange`](Self::gemm_exchange)).
    ///
    /// # Safety
    /// As for [`run_producing`](Self::run_producing).
    unsafe fn reduce_scatter(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        tokens: usize,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
        produce: Produce<'_>,
    ) -> Result<()> {
        let n = self.tp.n_pes();
        if tokens % n != 0 {
            return Err(Error::InvalidArgument(format!(
                "a row-parallel layer with a sequence-parallel output shares the tokens equally: \
                 {tokens} tokens over {n} PEs"
            )));
        }
        let cols = self.out_features;
        if y.len() != tokens / n * cols {
            return Err(Error::Length {
                what: "the row-parallel output (tokens / n_pes × out_features)",
                expected: tokens / n * cols,
                got: y.len(),
            });
        }
        if self.resolve(schedule, tokens) == Schedule::Fused {
            if let (Some(exchange), Some(pusher)) = (self.scatters(tokens), self.tp.pusher()) {
                return self.gemm_exchange(exchange, pusher, y, (x, produce), tokens, stream);
            }
        }
        produce_rows(produce, 0..tokens)?;
        self.gemm_rows(x, 0..tokens, stream)?;
        self.tp.collectives().reduce_scatter(
            y,
            self.partial.view(..tokens * cols),
            ReduceOp::Sum,
            ReduceScatterAlgo::Auto,
            stream,
        )
    }

    /// The fused GEMM + reduce-scatter's state where it takes a call of `tokens`: several
    /// PEs sharing the tokens equally, [`FUSED_SCATTER_TOKENS`] each at least, and stream
    /// memory operations for its flags.
    fn scatters(&self, tokens: usize) -> Option<&Exchange> {
        let n = self.tp.n_pes();
        let exchange = self.exchange.as_ref()?;
        let fits = tokens % n == 0 && tokens / n >= FUSED_SCATTER_TOKENS;
        (fits && self.tp.has_stream_memops()).then_some(exchange)
    }

    /// The fused GEMM + reduce-scatter, or + all-reduce (`sums`), in rounds. Each PE owns
    /// `tokens / n_pes` rows of the sum, cut into rounds ([`rounds_of`]; the thresholds'
    /// GEMMs over the PE count, [`exchange_rounds`]), which rows among the tokens as
    /// [`owned_row`] says: with a replicated output each round's rows are one run, which
    /// `produce` writes just before the round (a sequence-parallel output has its input
    /// produced whole first). In each round, for each peer in turn (the next PE first), the
    /// GEMM of that peer's rows of the round into this PE's partial product, and a copy
    /// engine takes them into the peer's exchange buffer, at this PE's slab, and raises a
    /// flag there, while the next GEMM computes; then the GEMM of this PE's own rows of the
    /// round, into its own slab. (With a replicated output every round but the last is one
    /// GEMM of its run of tokens, larger than each PE's rows alone, whose copies start
    /// after it: 0.7-1.7% faster for the 8B MLP from 8192 tokens, docs/gemm.md.) On the
    /// side stream, once every peer's products of the round are here, a small kernel sums
    /// the slabs in PE order into this PE's rows of the output (the numbers the
    /// reduce-scatter of our collectives gives for the same partial products), and with a
    /// replicated output the copy engines bring those rows to every peer's, a flag each,
    /// while the next round's GEMMs compute. Only the last round's copies and sum follow
    /// the last GEMM; with a replicated output the last round is instead one GEMM of its
    /// run of tokens and our all-reduce of it ([`all_reduced_round`]), which sums in the
    /// same order. Every PE's rows of a replicated output come from one PE (or from the
    /// all-reduce, which is replicated bit for bit), so it is the same on every PE.
    ///
    /// The GEMMs store locally: a cuBLASLt GEMM storing into a peer's memory measured
    /// 20-30% slower than the same GEMM storing locally (the 8B MLP's down projection at
    /// 1024 to 4096 tokens on an H200, 104 against 82 µs at 1024), where the copy engines
    /// move the same bytes beside the next GEMM for a few percent of its time.
    ///
    /// # Safety
    /// As for [`run_producing`](Self::run_producing), with `tokens` a multiple of the PE
    /// count, the output `y` holding `tokens / n_pes × out_features` elements (a
    /// sequence-parallel layer) or `tokens × out_features` (a replicated one), and `pusher` a
    /// copy stream.
    unsafe fn gemm_exchange(
        &self,
        Exchange { flags, bases, .. }: &Exchange,
        pusher: &Arc<CudaStream>,
        y: SymmetricView<'_, bf16>,
        (x, produce): (u64, Produce<'_>),
        tokens: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (n, me) = (self.tp.n_pes(), self.tp.my_pe());
        let (rows, cols, k) = (tokens / n, self.out_features, self.local_in.len());
        let bf = std::mem::size_of::<bf16>();
        // A sequence-parallel output holds this PE's rows of the sum; a replicated one, every
        // row, and this PE's rows go to every PE's (at each PE's address of it).
        let replicated = self.output == RowOutput::Replicated;
        let outputs = match replicated {
            true => peer_bases(y)?,
            false => Vec::new(),
        };
        let produced = replicated && produce.is_some();
        let mut rounds = exchange_rounds(rows, n, self.tp.thresholds(), produced);
        let tail = match replicated {
            true => all_reduced_round(&mut rounds, n, cols),
            false => None,
        };
        let side = self.tp.side();
        let first_row = |pe: usize, part: &Range<usize>| owned_row(pe, part, rows, n, replicated);
        // The partial product of `m` tokens from token `first` into `dst` (rows of `cols`);
        // of PE `pe`'s rows `part`; and where those rows start in this PE's slab on PE `pe`.
        let gemm_at = |first: usize, m: usize, dst: u64| {
            let x_rows = x + (first * k * bf) as u64;
            let shape = LinearShape { m, n: cols, k };
            let w = self.weight.device_ptr();
            self.tp
                .gemm()
                .linear_raw(dst, cols, x_rows, w, shape, stream)
        };
        let gemm_of = |pe: usize, part: &Range<usize>, dst: u64| {
            gemm_at(first_row(pe, part), part.len(), dst)
        };
        let slab_at = |pe: usize, part: &Range<usize>| {
            bases[pe] + ((me * rows + part.start) * cols * bf) as u64
        };
        if !replicated {
            produce_rows(produce, 0..tokens)?;
        }
        let last = rounds.len() as u64;
        if last > 0 {
            flags.open(stream)?;
        }
        let mut ready_cleared = false;
        // Every peer's flags are raised even after a failure, so that no peer waits for
        // ever (its output is then wrong, and this call returns the error).
        let mut sent = Ok(());
        // This PE's partial product of PE `pe`'s rows `part`, at their rows among the tokens
        // (so that a round's whole run of tokens is one GEMM's output).
        let partial_of = |pe: usize, part: &Range<usize>| {
            self.partial.device_ptr() + (first_row(pe, part) * cols * bf) as u64
        };
        for (r, part) in rounds.iter().enumerate() {
            let round = r as u64 + 1;
            // With a replicated output a round's tokens are one run, so a round followed by
            // another (or by the all-reduced one) is one GEMM, whose copies start after it; a
            // last round's GEMMs are each PE's rows, so that its copies start while the next
            // GEMM computes.
            let whole = replicated && (r + 1 < rounds.len() || tail.is_some());
            if replicated {
                sent = sent.and_then(|()| produce_rows(produce, n * part.start..n * part.end));
            }
            if whole {
                sent = sent.and_then(|()| {
                    gemm_at(first_row(0, part), n * part.len(), partial_of(0, part))?;
                    join(pusher, stream)
                });
            }
            for peer in flags.peers() {
                let local = partial_of(peer, part);
                sent = sent.and_then(|()| {
                    if !whole {
                        gemm_of(peer, part, local)?;
                        join(pusher, stream)?;
                    }
                    if r == 0 {
                        flags.take_credit(pusher, peer)?;
                    }
                    result::memcpy_dtod_async(
                        slab_at(peer, part),
                        local,
                        part.len() * cols * bf,
                        pusher.cu_stream(),
                    )
                    .during("cuMemcpyDtoDAsync")
                });
                sent = sent.and(flags.raise_rounds(pusher, peer, round));
            }
            // This PE's rows of the round: its own product, then, beside the next round's
            // GEMMs, the sum of the slabs (and the copies to every peer).
            let len = part.len() * cols;
            let dst = match replicated {
                false => y.as_ptr() as u64 + (part.start * cols * bf) as u64,
                true => outputs[me] + (first_row(me, part) * cols * bf) as u64,
            };
            let own = match whole {
                true => partial_of(me, part),
                false => slab_at(me, part),
            };
            sent = sent.and_then(|()| {
                if !whole {
                    gemm_of(me, part, own)?;
                }
                join(side, stream)?;
                flags.wait_rounds(side, round)?;
                if round == last {
                    // Off the caller's stream: no peer sends another chunk in this call.
                    flags.clear_ready(side)?;
                    ready_cleared = true;
                }
                let src = bases[me] + (part.start * cols * bf) as u64;
                let slabs = (src, (me, own));
                self.tp
                    .sum_slabs_raw(dst, slabs, (len, n, rows * cols), side)
            });
            // Every peer has begun this call (its chunks are here), so its output is free.
            if !replicated {
                continue;
            }
            for peer in flags.peers() {
                sent = sent.and_then(|()| {
                    let to = outputs[peer] + (dst - outputs[me]);
                    result::memcpy_dtod_async(to, dst, len * bf, side.cu_stream())
                        .during("cuMemcpyDtoDAsync")
                });
                sent = sent.and(flags.announce_sums(side, peer, round));
            }
        }
        if let Some(run) = tail {
            let span = run.start * cols..run.end * cols;
            sent = sent.and_then(|()| {
                produce_rows(produce, run.clone())?;
                gemm_at(
                    run.start,
                    run.len(),
                    self.partial.device_ptr() + (span.start * bf) as u64,
                )
            });
            // Called even after a failure, so that no peer waits for ever.
            let view = self.partial.view(span.clone());
            let reduced = self.tp.collectives().all_reduce(
                y.view(span),
                view,
                ReduceOp::Sum,
                AllReduceAlgo::Auto,
                stream,
            );
            sent = sent.and(reduced);
        }
        if last == 0 {
            return sent;
        }
        // The caller's stream waits for this PE's sums and copies (joined even after a
        // failure, so that a capture stays whole), then for every peer's, and clears the
        // flags (even after a failure, so that no late chunk is left raised).
        let joined = join(stream, side).and(join(stream, pusher));
        sent.and(joined)
            .and(flags.close_rounds(stream, last, ready_cleared, replicated))
    }

    /// Tokens whose pieces along the output features fit the reduced scratch.
    fn reduced_tokens(&self) -> usize {
        self.reduced.len() / self.out_features
    }

    /// Each piece of tokens: its GEMM on `stream`, its all-reduce on the side stream; then
    /// the caller's stream waits for the last one. The side stream first waits for
    /// everything before (the input, and earlier calls of the collectives, which share their
    /// workspace).
    ///
    /// # Safety
    /// As for [`run`](Self::run).
    unsafe fn by_tokens(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        pieces: &[Range<usize>],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (side, cols) = (self.tp.side(), self.out_features);
        let enqueued = pieces.iter().try_for_each(|rows| {
            self.gemm_rows(x, rows.clone(), stream)?;
            join(side, stream)?;
            let span = rows.start * cols..rows.end * cols;
            self.tp.collectives().all_reduce(
                y.view(span.clone()),
                self.partial.view(span),
                ReduceOp::Sum,
                AllReduceAlgo::Auto,
                side,
            )
        });
        // Joined even after a failure: what the side stream holds stays ordered before the
        // caller's next work, and a capture stays whole.
        let joined = join(stream, side);
        enqueued.and(joined)
    }

    /// Each piece of `width` output features (the last one narrower): its GEMM (this PE's
    /// rows of the weight for them) into its own block of the partial product, its
    /// all-reduce into the same block of the reduced scratch (or of `y` itself for one
    /// token, where the blocks are `y`'s columns in place); then the columns go in place.
    ///
    /// # Safety
    /// As for [`run`](Self::run).
    unsafe fn by_features(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        tokens: usize,
        width: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (side, n, k) = (self.tp.side(), self.out_features, self.local_in.len());
        let bf = std::mem::size_of::<bf16>() as u64;
        let enqueued = (0..n).step_by(width).try_for_each(|first| {
            let w = width.min(n - first);
            let block = tokens * first..tokens * (first + w);
            let shape = LinearShape { m: tokens, n: w, k };
            self.tp.gemm().linear_raw(
                self.partial.device_ptr() + block.start as u64 * bf,
                w,
                x,
                self.weight.device_ptr() + (first * k) as u64 * bf,
                shape,
                stream,
            )?;
            join(side, stream)?;
            let dst = match tokens {
                1 => y.view(block.clone()),
                _ => self.reduced.view(block.clone()),
            };
            self.tp.collectives().all_reduce(
                dst,
                self.partial.view(block),
                ReduceOp::Sum,
                AllReduceAlgo::Auto,
                side,
            )
        });
        // Joined even after a failure (see by_tokens).
        let joined = join(stream, side);
        enqueued.and(joined)?;
        if tokens > 1 {
            let shape = (tokens, n, width);
            self.tp
                .unchunk_raw(y.as_ptr() as u64, self.reduced.device_ptr(), shape, stream)?;
        }
        Ok(())
    }

    /// The GEMM of `rows` into the partial product, then their all-reduce, on `stream`.
    ///
    /// # Safety
    /// As for [`run`](Self::run).
    unsafe fn piece(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        rows: Range<usize>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let cols = self.out_features;
        self.gemm_rows(x, rows.clone(), stream)?;
        let partial = self.partial.view(rows.start * cols..rows.end * cols);
        self.tp
            .collectives()
            .all_reduce(y, partial, ReduceOp::Sum, AllReduceAlgo::Auto, stream)
    }

    /// The GEMM [`GemmPath::Auto`] takes for `tokens` tokens of this layer.
    fn gemm_path(&self, tokens: usize) -> GemmPath {
        self.tp.gemm().auto_path(LinearShape {
            m: tokens,
            n: self.out_features,
            k: self.local_in.len(),
        })
    }

    /// The partial product of tokens `rows`, into the same rows of `partial`.
    ///
    /// # Safety
    /// As for [`run`](Self::run), with `rows` inside the call's tokens.
    unsafe fn gemm_rows(&self, x: u64, rows: Range<usize>, stream: &CudaStream) -> Result<()> {
        let k = self.local_in.len();
        let shape = LinearShape {
            m: rows.len(),
            n: self.out_features,
            k,
        };
        let row_bytes = |width: usize| (rows.start * width * std::mem::size_of::<bf16>()) as u64;
        self.tp.gemm().linear_raw(
            self.partial.device_ptr() + row_bytes(shape.n),
            shape.n,
            x + row_bytes(k),
            self.weight.device_ptr(),
            shape,
            stream,
        )
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
        // Rounds of fewer than 512 rows are not made.
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

    #[test]
    fn few_tokens_are_cut_along_the_features_in_aligned_widths() {
        assert_eq!(pieces(1, 4096, 4, 2048), Pieces::Features(1024));
        assert_eq!(pieces(128, 4096, 4, 2048), Pieces::Features(1024));
        // 129 features in 3: 43 rounded up to 48, then 48, 33.
        assert_eq!(pieces(16, 129, 3, 2048), Pieces::Features(48));
        // Too narrow to cut.
        assert_eq!(pieces(16, 8, 4, 2048), Pieces::Whole);
    }

    #[test]
    fn many_tokens_are_cut_along_the_tokens_on_aligned_rows() {
        let rows = |p: Pieces| match p {
            Pieces::Tokens(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            rows(pieces(2048, 4096, 4, 2048)),
            [0..512, 512..1024, 1024..1536, 1536..2048]
        );
        // 129 features: rows start at multiples of 8 (16-byte boundaries).
        let r = rows(pieces(2049, 129, 4, 2048));
        assert!(r.iter().all(|p| p.start % 8 == 0));
        assert_eq!((r[0].start, r.last().unwrap().end), (0, 2049));
        assert!(r.windows(2).all(|w| w[0].end == w[1].start));
        // More tokens than the reduced scratch holds, but too few per piece: still tokens.
        assert!(matches!(pieces(300, 4096, 2, 256), Pieces::Tokens(_)));
    }

    #[test]
    fn nothing_to_cut_is_whole() {
        assert_eq!(pieces(3, 4096, 4, 2), Pieces::Whole);
        assert_eq!(pieces(1, 4096, 1, 2048), Pieces::Whole);
    }
}
