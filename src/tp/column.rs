//! The column-parallel linear layer: each PE holds some of the output features.

use super::cutlass::ALIGN_ELEMENTS;
use super::exchange::{peer_bases, ChunkFlags};
use super::TensorParallel;
use super::{check_tokens, check_weight, join, merged_rows, rows_of, shard_range, LinearShape};
use super::{Schedule, FUSED_SCATTER_TOKENS};
use crate::collectives::AllGatherAlgo;
use crate::error::CudaResultExt;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceSlice, SymmetricBuffer, SymmetricView};
use cudarc::driver::{result, CudaStream};
use half::bf16;
use std::sync::Arc;

/// What a [`ColumnParallelLinear`] is given as input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnInput {
    /// Every PE has all the tokens: no communication.
    Replicated,
    /// Each PE has an equal share of the tokens, in PE order (sequence parallelism): they
    /// are all-gathered, then multiplied.
    SequenceParallel,
}

/// `y = x · wᵀ` with the weight's output features (its rows) sharded across the PEs: PE `p`
/// computes output features [`shard_range`]`(out, p, n)` for every token, so `y` is
/// `tokens × local_out_features()` on each PE.
///
/// The output features may be several matrices stacked ([`merged`](Self::merged)), each
/// sharded alike, as the gate and up projections of an MLP: the local output is this PE's
/// columns of the first, then of the second.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::{bf16, tp::{ColumnInput, ColumnParallelLinear, TensorParallel}};
/// let shmem = nvshmem::Nvshmem::init()?;
/// let tp = TensorParallel::new(&shmem)?;
/// let qkv = ColumnParallelLinear::new(&tp, 4096, 6144, ColumnInput::SequenceParallel, 2048)?;
/// qkv.load_weight(&vec![bf16::ZERO; 6144 * 4096])?;
/// let tokens = 2048;
/// let x = shmem.malloc::<bf16>(tokens / shmem.n_pes() * 4096)?; // this PE's tokens
/// let y = shmem.alloc_device::<bf16>(tokens * qkv.local_out_features())?;
/// qkv.forward(&y, &x, shmem.stream())?;
/// # Ok(()) }
/// ```
pub struct ColumnParallelLinear {
    tp: TensorParallel,
    in_features: usize,
    parts: Vec<usize>,
    local_out: usize,
    input: ColumnInput,
    max_tokens: usize,
    weight: DeviceBuffer<bf16>,
    /// Every PE's tokens, gathered (sequence parallel only).
    gathered: Option<SymmetricBuffer<bf16>>,
    /// The fused all-gather into `gathered` (sequence parallel, several PEs): its flags,
    /// and where `gathered` lies on every PE.
    exchange: Option<(ChunkFlags, Vec<u64>)>,
}

/// Tokens (all PEs' together) from which the fused all-gather + GEMM of a sequence-parallel
/// layer may multiply with our CUTLASS kernel, whose tiles wait for their rows
/// ([`ScheduleThresholds::fused_gather_cutlass_min_tokens`](super::ScheduleThresholds::fused_gather_cutlass_min_tokens)):
/// from here on that kernel measured within 2% of cuBLASLt on one H100 (docs/gemm.md).
pub const FUSED_GATHER_TOKENS: usize = 2048;

impl ColumnParallelLinear {
    /// A layer of `in_features → out_features` with a zero weight (load it with
    /// [`load_weight`](Self::load_weight)). `max_tokens` bounds the tokens of a forward
    /// call (all PEs' together); with [`ColumnInput::SequenceParallel`] the layer allocates
    /// symmetric memory for them, so building it is collective.
    pub fn new(
        tp: &TensorParallel,
        in_features: usize,
        out_features: usize,
        input: ColumnInput,
        max_tokens: usize,
    ) -> Result<Self> {
        Self::merged(tp, in_features, &[out_features], input, max_tokens)
    }

    /// A layer whose output features are the matrices of `parts` rows stacked, each sharded
    /// across the PEs alike (vLLM's merged column-parallel layer).
    pub fn merged(
        tp: &TensorParallel,
        in_features: usize,
        parts: &[usize],
        input: ColumnInput,
        max_tokens: usize,
    ) -> Result<Self> {
        let (n, me) = (tp.n_pes(), tp.my_pe());
        if in_features == 0 || parts.is_empty() || parts.iter().any(|&p| p < n) {
            return Err(Error::InvalidArgument(format!(
                "a column-parallel layer of {in_features} input features and output parts \
                 {parts:?} over {n} PEs: every part needs at least one output feature per PE"
            )));
        }
        let local_out = parts.iter().map(|&p| shard_range(p, me, n).len()).sum();
        let shmem = tp.runtime();
        // The collective allocation first (see RowParallelLinear::with_output).
        let gathered = match input {
            ColumnInput::Replicated => None,
            ColumnInput::SequenceParallel => Some(shmem.malloc::<bf16>(max_tokens * in_features)?),
        };
        let exchange = match &gathered {
            Some(g) if n > 1 => Some((ChunkFlags::new(shmem)?, peer_bases(g)?)),
            _ => None,
        };
        let weight = shmem.alloc_device::<bf16>(local_out * in_features)?;
        Ok(ColumnParallelLinear {
            tp: tp.clone(),
            in_features,
            parts: parts.to_vec(),
            local_out,
            input,
            max_tokens,
            weight,
            gathered,
            exchange,
        })
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output features of the whole layer (every part, every PE).
    pub fn out_features(&self) -> usize {
        self.parts.iter().sum()
    }

    /// Output features this PE computes: the columns of its `y`.
    pub fn local_out_features(&self) -> usize {
        self.local_out
    }

    /// How the layer takes its input.
    pub fn input(&self) -> ColumnInput {
        self.input
    }

    /// This PE's weight shard, `local_out_features × in_features`, row-major.
    pub fn weight(&self) -> &DeviceBuffer<bf16> {
        &self.weight
    }

    /// Keep this PE's rows of the full weight (`out_features × in_features`, row-major, the
    /// parts stacked): [`merged_rows`] of it. Then measures which GEMM path
    /// [`GemmPath::Auto`](super::GemmPath::Auto) takes for this shard on this GPU up to 16
    /// tokens, and cuBLASLt's fastest algorithm up to 256 tokens
    /// ([`Gemm::calibrate`](super::Gemm::calibrate)).
    pub fn load_weight(&self, full: &[bf16]) -> Result<()> {
        check_weight(
            "the column-parallel weight (out_features × in_features)",
            full.len(),
            self.out_features(),
            self.in_features,
        )?;
        let part = merged_rows(
            full,
            self.in_features,
            &self.parts,
            self.tp.my_pe(),
            self.tp.n_pes(),
        );
        self.weight.copy_from_host(&part)?;
        // Which of our decode kernel and cuBLASLt GemmPath::Auto takes on this GPU, and
        // cuBLASLt's algorithms.
        let n = part.len() / self.in_features;
        self.tp
            .gemm()
            .calibrate(&self.weight, n, self.in_features, self.max_tokens)
    }

    /// `y = x · wᵀ` for this PE's output features, on `stream`. With replicated input `x` is
    /// `tokens × in_features`; sequence parallel, it is this PE's `tokens / n_pes` rows, and
    /// every PE passes as many. `y` is `tokens × local_out_features`. In [`Schedule::Auto`].
    pub fn forward<'a>(
        &self,
        y: &impl DeviceSlice<bf16>,
        x: impl Into<SymmetricView<'a, bf16>>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.forward_with(y, x, Schedule::Auto, stream)
    }

    /// [`forward`](Self::forward) with a [`Schedule`]. Sequence parallel, with several PEs:
    /// [`Schedule::Overlapped`] multiplies this PE's own tokens while the all-gather brings
    /// the others', then the others'; [`Schedule::Fused`], from [`FUSED_SCATTER_TOKENS`]
    /// tokens per PE, sends each PE's tokens to every peer by the copy engines, each chunk
    /// raising a flag as it lands, multiplies this PE's own tokens meanwhile, then each
    /// peer's after its flag; or, from
    /// [`ScheduleThresholds::fused_gather_cutlass_min_tokens`](super::ScheduleThresholds::fused_gather_cutlass_min_tokens)
    /// and [`FUSED_GATHER_TOKENS`] tokens on a GPU that runs our CUTLASS kernel (with input
    /// features and every PE's output features multiples of 8), multiplies with that
    /// kernel, whose tiles start with this PE's own rows and each wait for their chunk's
    /// flag before their first load (where the kernel cannot take this PE's output,
    /// misaligned, the GEMM waits for every chunk). Below, it runs sequentially. Replicated
    /// input has no communication to overlap.
    pub fn forward_with<'a>(
        &self,
        y: &impl DeviceSlice<bf16>,
        x: impl Into<SymmetricView<'a, bf16>>,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let x = x.into();
        let rows = rows_of("the column-parallel input", x.len(), self.in_features)?;
        let (n, me) = (self.tp.n_pes(), self.tp.my_pe());
        let tokens = match self.input {
            ColumnInput::Replicated => rows,
            ColumnInput::SequenceParallel => rows * n,
        };
        if y.len() != tokens * self.local_out {
            return Err(Error::Length {
                what: "the column-parallel output (tokens × local_out_features)",
                expected: tokens * self.local_out,
                got: y.len(),
            });
        }
        let Some(gathered) = &self.gathered else {
            // SAFETY: the lengths were checked above.
            return unsafe { self.run(y.device_ptr(), x.as_ptr() as u64, tokens, stream) };
        };
        check_tokens("ColumnParallelLinear::forward", tokens, self.max_tokens)?;
        let schedule = self
            .tp
            .thresholds()
            .sequence(schedule, rows, self.in_features);
        if let (Schedule::Fused, Some(exchange), Some(pusher)) =
            (schedule, &self.exchange, self.tp.pusher())
        {
            let (y_at, x_at) = (y.device_ptr(), x.as_ptr() as u64);
            let cutlass_from = self.tp.thresholds().fused_gather_cutlass_min_tokens;
            let cutlass = tokens >= cutlass_from && self.fuses_gather(tokens);
            if cutlass || rows >= FUSED_SCATTER_TOKENS {
                // SAFETY: the lengths were checked above.
                return unsafe {
                    self.gather_and_run(exchange, pusher, y_at, x_at, rows, cutlass, stream)
                };
            }
        }
        let all = gathered.view(..tokens * self.in_features);
        let coll = self.tp.collectives();
        if !matches!(schedule, Schedule::Overlapped { .. }) || n == 1 {
            coll.all_gather(all, x, AllGatherAlgo::Auto, stream)?;
            // SAFETY: the lengths were checked above.
            return unsafe { self.run(y.device_ptr(), all.as_ptr() as u64, tokens, stream) };
        }
        // The all-gather on the side stream (after everything before the call), this PE's
        // own rows from `x` meanwhile, then the rows before and after them from `gathered`.
        let side = self.tp.side();
        join(side, stream)?;
        let gathering = coll.all_gather(all, x, AllGatherAlgo::Auto, side);
        let bf = std::mem::size_of::<bf16>() as u64;
        let y_row = |r: usize| y.device_ptr() + (r * self.local_out) as u64 * bf;
        let all_row = |r: usize| all.as_ptr() as u64 + (r * self.in_features) as u64 * bf;
        let (mine, end) = (me * rows..(me + 1) * rows, tokens);
        // SAFETY: every range lies inside `y`, `x` and `gathered`, whose lengths were checked.
        let own = unsafe { self.run(y_row(mine.start), x.as_ptr() as u64, rows, stream) };
        // Joined even after a failure, so that the side stream is ordered before what follows.
        let joined = join(stream, side);
        gathering.and(own).and(joined)?;
        // SAFETY: as above.
        unsafe {
            self.run(y.device_ptr(), all_row(0), mine.start, stream)?;
            self.run(y_row(mine.end), all_row(mine.end), end - mine.end, stream)
        }
    }

    /// Whether [`Schedule::Fused`] fuses a call of `tokens`: decided alike on every PE (the
    /// tokens, the GPU, the shapes of every PE's shard), since the PEs exchange differently
    /// in the fused and the sequential schedule.
    fn fuses_gather(&self, tokens: usize) -> bool {
        let n = self.tp.n_pes();
        let aligned = |features: usize| features % ALIGN_ELEMENTS == 0;
        tokens >= FUSED_GATHER_TOKENS
            && self.tp.gemm().cutlass_available().is_ok()
            && aligned(self.in_features)
            && (0..n).all(|pe| {
                aligned(
                    self.parts
                        .iter()
                        .map(|&p| shard_range(p, pe, n).len())
                        .sum(),
                )
            })
    }

    /// The fused all-gather + GEMM ([`Schedule::Fused`]) of `rows` tokens per PE: this PE's
    /// rows go to every peer by the copy engines, a flag following each copy; then a GEMM
    /// per PE's rows (this PE's own from `x` while the peers' travel, then each peer's after
    /// its flag), or, `cutlass`, our CUTLASS kernel, whose tiles each wait for their rows.
    ///
    /// # Safety
    /// `y` holds `rows × n_pes × local_out` and `x` `rows × in_features` elements, and
    /// `rows × n_pes` is at most `max_tokens`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gather_and_run(
        &self,
        (flags, gathered): &(ChunkFlags, Vec<u64>),
        pusher: &Arc<CudaStream>,
        y: u64,
        x: u64,
        rows: usize,
        cutlass: bool,
        stream: &CudaStream,
    ) -> Result<()> {
        let (n, me) = (self.tp.n_pes(), self.tp.my_pe());
        let (k, out, tokens) = (self.in_features, self.local_out, rows * n);
        let bf = std::mem::size_of::<bf16>();
        let (bytes, base) = (rows * k * bf, gathered[me]);
        let mine = (me * bytes) as u64;
        flags.open(stream)?;
        // This PE's rows to every peer, one after another on the copy stream after what
        // `stream` holds (the input and the credits), and for our CUTLASS kernel into its
        // own gathered rows on `stream`. Every peer's flag is raised even after a failure,
        // so that no peer waits for ever (its output is then wrong, and this call returns
        // the error).
        let mut sent = join(pusher, stream);
        for peer in flags.peers() {
            sent = sent.and_then(|()| {
                flags.take_credit(pusher, peer)?;
                result::memcpy_dtod_async(gathered[peer] + mine, x, bytes, pusher.cu_stream())
                    .during("cuMemcpyDtoDAsync")
            });
            sent = sent.and(flags.raise(pusher, peer));
        }
        let w = self.weight.device_ptr();
        let at = |r: usize| (y + (r * out * bf) as u64, base + (r * k * bf) as u64);
        let shape = |m: usize| LinearShape { m, n: out, k };
        let gemm = self.tp.gemm();
        let by_rows = || -> Result<()> {
            self.run(at(me * rows).0, x, rows, stream)?;
            flags.peers().try_for_each(|peer| {
                flags.wait_from(stream, peer)?;
                let (y_rows, x_rows) = at(peer * rows);
                self.run(y_rows, x_rows, rows, stream)
            })
        };
        let waiting = || -> Result<()> {
            result::memcpy_dtod_async(base + mine, x, bytes, stream.cu_stream())
                .during("cuMemcpyDtoDAsync")?;
            // This PE's rows and those after them first (the first tiles are this PE's
            // rows, which are here), then those before them.
            let (y_mine, x_mine) = at(me * rows);
            let waiting = gemm.linear_waiting(
                y_mine,
                out,
                x_mine,
                w,
                shape(tokens - me * rows),
                flags.chunk_wait(rows, me * rows, n),
                stream,
            )?;
            if !waiting {
                flags.wait_all(stream)?;
                return self.run(y, base, tokens, stream);
            }
            let wait = flags.chunk_wait(rows, 0, me);
            if !gemm.linear_waiting(y, out, base, w, shape(me * rows), wait, stream)? {
                return Err(Error::InvalidArgument(
                    "the CUTLASS GEMM took this PE's rows but not the rows before them".into(),
                ));
            }
            Ok(())
        };
        let run = || match cutlass {
            true => waiting(),
            false => by_rows(),
        };
        // Closed even after a failure, and the copy stream joined: what follows on `stream`
        // may overwrite `x`, and a capture stays whole.
        let ran = sent.and_then(|()| run()).and(flags.close(stream));
        ran.and(join(stream, pusher))
    }

    /// The GEMM alone, on input that is already complete.
    ///
    /// # Safety
    /// `y` holds `tokens × local_out` and `x` `tokens × in_features` elements.
    pub(super) unsafe fn run(
        &self,
        y: u64,
        x: u64,
        tokens: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let shape = LinearShape {
            m: tokens,
            n: self.local_out,
            k: self.in_features,
        };
        self.tp
            .gemm()
            .linear_raw(y, shape.n, x, self.weight.device_ptr(), shape, stream)
    }
}
