//! The column-parallel linear layer: each PE holds some of the output features.

use super::exchange::{peer_bases, ChunkFlags, GatherCall};
use super::gemm::Operands;
use super::schedule::{column_path, ColumnPath, Facts};
use super::{check_tokens, check_weight, join, merged_rows, rows_of, shard_range, LinearShape};
use super::{Schedule, TensorParallel};
use crate::collectives::AllGatherAlgo;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceMemory, SymmetricBuffer, SymmetricView};
use cudarc::driver::CudaStream;
use half::bf16;
use std::sync::Arc;

const BF16: usize = std::mem::size_of::<bf16>();

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
            Some(g) if n > 1 => {
                let members = tp.collectives().members();
                Some((ChunkFlags::new(shmem, members)?, peer_bases(g, members)?))
            }
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

    /// The group the layer belongs to.
    pub(super) fn group(&self) -> &TensorParallel {
        &self.tp
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

    /// What a call of `tokens` tokens (every PE's together) in `schedule` runs:
    /// [`Schedule::Fused`] or [`Schedule::Overlapped`] where a sequence-parallel layer has
    /// that form for it, else [`Schedule::Sequential`]. The same on every PE.
    pub fn resolved_schedule(&self, schedule: Schedule, tokens: usize) -> Schedule {
        self.path(schedule, tokens).schedule()
    }

    /// The path a call of `tokens` tokens in `schedule` takes.
    fn path(&self, schedule: Schedule, tokens: usize) -> ColumnPath {
        let facts = Facts {
            n_pes: self.tp.n_pes(),
            width: self.in_features,
            exchange: self.exchange.is_some() && self.tp.pusher().is_some(),
            decode_fits: false,
            decode_measured: false,
        };
        let sequence = self.input == ColumnInput::SequenceParallel;
        column_path(self.tp.thresholds(), schedule, (sequence, tokens), facts)
    }

    /// `y = x · wᵀ` for this PE's output features, on `stream`. With replicated input `x` is
    /// `tokens × in_features`; sequence parallel, it is this PE's `tokens / n_pes` rows, and
    /// every PE passes as many. `y` is `tokens × local_out_features`. In [`Schedule::Auto`].
    pub fn forward<'a>(
        &self,
        y: &impl DeviceMemory<bf16>,
        x: impl Into<SymmetricView<'a, bf16>>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.forward_with(y, x, Schedule::Auto, stream)
    }

    /// [`forward`](Self::forward) in `schedule` (see [`Schedule`]: a sequence-parallel layer
    /// overlaps or fuses its all-gather with the GEMM; replicated input has no
    /// communication).
    pub fn forward_with<'a>(
        &self,
        y: &impl DeviceMemory<bf16>,
        x: impl Into<SymmetricView<'a, bf16>>,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if let Some((flags, _)) = &self.exchange {
            flags.refuse()?;
        }
        let x = x.into();
        let rows = rows_of("the column-parallel input", x.len(), self.in_features)?;
        let tokens = match self.input {
            ColumnInput::Replicated => rows,
            ColumnInput::SequenceParallel => rows * self.tp.n_pes(),
        };
        if y.device_len() != tokens * self.local_out {
            return Err(Error::Length {
                what: "the column-parallel output (tokens × local_out_features)",
                expected: tokens * self.local_out,
                got: y.device_len(),
            });
        }
        if self.input == ColumnInput::SequenceParallel {
            check_tokens("ColumnParallelLinear::forward", tokens, self.max_tokens)?;
        }
        // SAFETY: the lengths were checked above.
        self.tp.ordered(stream, || unsafe {
            self.run_path(y.device_addr(stream), x, tokens, schedule, stream)
        })
    }

    /// The call's path into `y`.
    ///
    /// # Safety
    /// `y` holds `tokens × local_out` elements and `x` this PE's rows of the input
    /// (`tokens` of them with replicated input, `tokens / n_pes` sequence parallel), with
    /// `tokens` at most `max_tokens` sequence parallel.
    pub(super) unsafe fn run_path(
        &self,
        y: u64,
        x: SymmetricView<'_, bf16>,
        tokens: usize,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (x_at, rows) = (x.as_ptr() as u64, tokens / self.tp.n_pes());
        match self.path(schedule, tokens) {
            ColumnPath::Local => self.run(y, x_at, tokens, stream),
            ColumnPath::Sequential => self.gather_then_run(y, x, tokens, stream),
            ColumnPath::Overlapped => self.overlapped(y, x, tokens, stream),
            ColumnPath::FusedGather => self.fused_gather(y, x_at, rows, stream),
        }
    }

    /// The rows of every PE, gathered (sequence parallel only).
    fn gathered(&self, tokens: usize) -> Result<SymmetricView<'_, bf16>> {
        match &self.gathered {
            Some(g) => Ok(g.view(..tokens * self.in_features)),
            None => Err(Error::InvalidArgument(
                "a column-parallel layer with replicated input gathers nothing".into(),
            )),
        }
    }

    /// Our all-gather, then the GEMM of every token.
    ///
    /// # Safety
    /// `y` holds `tokens × local_out` elements, `x` this PE's share of the tokens.
    unsafe fn gather_then_run(
        &self,
        y: u64,
        x: SymmetricView<'_, bf16>,
        tokens: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let all = self.gathered(tokens)?;
        let coll = self.tp.collectives();
        coll.all_gather(all, x, AllGatherAlgo::Auto, stream)?;
        self.run(y, all.as_ptr() as u64, tokens, stream)
    }

    /// The all-gather on the side stream (after everything before the call), this PE's own
    /// rows from `x` meanwhile, then the rows before and after them from the gathered rows.
    ///
    /// # Safety
    /// As for [`gather_then_run`](Self::gather_then_run).
    unsafe fn overlapped(
        &self,
        y: u64,
        x: SymmetricView<'_, bf16>,
        tokens: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (all, side) = (self.gathered(tokens)?, self.tp.side());
        let rows = tokens / self.tp.n_pes();
        join(side, stream)?;
        let gathering = self
            .tp
            .collectives()
            .all_gather(all, x, AllGatherAlgo::Auto, side);
        let y_row = |r: usize| y + (r * self.local_out * BF16) as u64;
        let all_row = |r: usize| all.as_ptr() as u64 + (r * self.in_features * BF16) as u64;
        let mine = self.tp.my_pe() * rows..(self.tp.my_pe() + 1) * rows;
        let own = self.run(y_row(mine.start), x.as_ptr() as u64, rows, stream);
        // Joined even after a failure, so that the side stream is ordered before what follows.
        let joined = join(stream, side);
        gathering.and(own).and(joined)?;
        self.run(y, all_row(0), mine.start, stream)?;
        self.run(
            y_row(mine.end),
            all_row(mine.end),
            tokens - mine.end,
            stream,
        )
    }

    /// The fused all-gather + GEMM of `rows` tokens per PE (exchange/gather.rs).
    ///
    /// # Safety
    /// `y` holds `rows × n_pes × local_out` and `x` `rows × in_features` elements, and
    /// `rows × n_pes` is at most `max_tokens`.
    unsafe fn fused_gather(
        &self,
        y: u64,
        x: u64,
        rows: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (Some((flags, gathered)), Some(pusher)) = (&self.exchange, self.tp.pusher()) else {
            return Err(Error::InvalidArgument(
                "the fused all-gather needs its buffers and stream memory operations".into(),
            ));
        };
        let call = GatherCall {
            flags,
            gathered,
            pusher,
            stream,
            rows,
            row_bytes: (self.in_features * BF16, self.local_out * BF16),
        };
        // SAFETY: every PE's rows lie inside `y` and the gathered buffer.
        call.run(y, x, |y_rows, x_rows, m| unsafe {
            self.run(y_rows, x_rows, m, stream)
        })
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
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let shape = LinearShape {
            m: tokens,
            n: self.local_out,
            k: self.in_features,
        };
        let ops = Operands {
            y,
            ldy: shape.n,
            x,
            w: self.weight.addr(),
        };
        self.tp.gemm().linear_raw(ops, shape, stream)
    }
}
