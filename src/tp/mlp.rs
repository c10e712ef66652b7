//! A Llama-style tensor-parallel MLP: `down(SiLU(gate(x)) * up(x))`.

use super::{check_tokens, check_weight, rows_of, ColumnInput, ColumnParallelLinear};
use super::{RowOutput, RowParallelLinear, Schedule, TensorParallel};
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceSlice, SymmetricView};
use cudarc::driver::CudaStream;
use half::bf16;
use std::ops::Range;
use std::sync::Arc;

/// `y = down(SiLU(x · gateᵀ) * (x · upᵀ))` with the FFN features sharded across the PEs:
/// the gate and up projections are one merged [`ColumnParallelLinear`] (replicated input),
/// `SiLU(gate) * up` is one element-wise kernel, and the down projection is a
/// [`RowParallelLinear`] whose all-reduce leaves `y` replicated, bitwise identical on every
/// PE. One forward call is: GEMM, kernel, GEMM, all-reduce, on one stream. Where the down
/// projection's [`Schedule::Fused`] is its GEMM + all-reduce in rounds (see there), the
/// whole MLP runs round by round, each round's tokens through the gate and up projection,
/// the activation and the down projection, so that a round's exchange travels beside the
/// next round's GEMMs, all three of them.
///
/// See the [module documentation](super) for an example.
pub struct TpMlp {
    layers: MlpLayers,
}

impl TpMlp {
    /// An MLP of `hidden → ffn → hidden` features with zero weights, for up to `max_tokens`
    /// tokens per call (collective: allocates symmetric memory).
    pub fn new(tp: &TensorParallel, hidden: usize, ffn: usize, max_tokens: usize) -> Result<Self> {
        let layout = (ColumnInput::Replicated, RowOutput::Replicated);
        Ok(TpMlp {
            layers: MlpLayers::new(tp, (hidden, ffn, max_tokens), layout)?,
        })
    }

    /// Hidden features (the input and output width).
    pub fn hidden(&self) -> usize {
        self.layers.hidden
    }

    /// FFN features of the whole MLP.
    pub fn ffn(&self) -> usize {
        self.layers.ffn
    }

    /// The merged gate and up projection.
    pub fn gate_up(&self) -> &ColumnParallelLinear {
        &self.layers.gate_up
    }

    /// The down projection.
    pub fn down(&self) -> &RowParallelLinear {
        &self.layers.down
    }

    /// The schedule that [`forward`](Self::forward) takes for `tokens` tokens: the down
    /// projection's ([`RowParallelLinear::auto_schedule`]), [`Schedule::Fused`] or
    /// [`Schedule::Sequential`].
    pub fn auto_schedule(&self, tokens: usize) -> Schedule {
        self.layers.down.auto_schedule(tokens)
    }

    /// Keep this PE's shards of the full weights: `gate` and `up` are `ffn × hidden`, `down`
    /// is `hidden × ffn`, row-major (as PyTorch stores `nn.Linear` weights).
    pub fn load_weights(&self, gate: &[bf16], up: &[bf16], down: &[bf16]) -> Result<()> {
        self.layers.load_weights(gate, up, down)
    }

    /// The MLP of `x` (`tokens × hidden`, the same on every PE) into `y` (`tokens × hidden`,
    /// the same on every PE afterwards), on `stream`, in [`Schedule::Auto`].
    pub fn forward<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceSlice<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.forward_with(y, x, Schedule::Auto, stream)
    }

    /// [`forward`](Self::forward) with the down projection in `schedule`.
    pub fn forward_with<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceSlice<bf16>,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (y, l) = (y.into(), &self.layers);
        let tokens = rows_of("the MLP input", x.len(), l.hidden)?;
        check_tokens("TpMlp::forward", tokens, l.max_tokens)?;
        // Before anything is launched, so that a bad call leaves nothing running.
        if y.len() != tokens * l.hidden {
            return Err(Error::Length {
                what: "the MLP output (tokens × hidden)",
                expected: tokens * l.hidden,
                got: y.len(),
            });
        }
        let f = l.down.local_in_features().len();
        let (gu, act) = (l.gate_up_out.device_ptr(), l.act.device_ptr());
        let bf = std::mem::size_of::<bf16>();
        // The gate and up projection and the activation of some tokens: all of them first,
        // or, fused, each round's just before the round (its exchange then travels beside
        // the next round's projections, not only beside its down projection).
        let produce = |rows: Range<usize>| {
            let (gu_rows, act_rows) = (
                gu + (rows.start * 2 * f * bf) as u64,
                act + (rows.start * f * bf) as u64,
            );
            let x_rows = x.device_ptr() + (rows.start * l.hidden * bf) as u64;
            // SAFETY: `x` holds `tokens × hidden` elements and the scratch buffers
            // `max_tokens` rows, at least `tokens`; `rows` lies within `tokens`.
            unsafe {
                l.gate_up.run(gu_rows, x_rows, rows.len(), stream)?;
                l.tp.silu_mul_raw(act_rows, gu_rows, rows.len(), f, stream)
            }
        };
        // SAFETY: as above; `produce` writes `act`'s rows before the GEMMs that read them.
        unsafe {
            l.down
                .run_producing(y, act, tokens, schedule, stream, Some(&produce))
        }
    }
}

/// The layers and scratch of an MLP, in either layout.
struct MlpLayers {
    tp: TensorParallel,
    hidden: usize,
    ffn: usize,
    max_tokens: usize,
    gate_up: ColumnParallelLinear,
    down: RowParallelLinear,
    /// This PE's gate and up features of every token.
    gate_up_out: DeviceBuffer<bf16>,
    /// `SiLU(gate) * up` of every token: the down projection's input.
    act: DeviceBuffer<bf16>,
}

impl MlpLayers {
    /// Collective: the layers allocate symmetric memory.
    fn new(
        tp: &TensorParallel,
        (hidden, ffn, max_tokens): (usize, usize, usize),
        (input, output): (ColumnInput, RowOutput),
    ) -> Result<Self> {
        let gate_up = ColumnParallelLinear::merged(tp, hidden, &[ffn, ffn], input, max_tokens)?;
        let down = RowParallelLinear::with_output(tp, ffn, hidden, output, max_tokens)?;
        let local_ffn = down.local_in_features().len();
        let shmem = tp.runtime();
        Ok(MlpLayers {
            tp: tp.clone(),
            hidden,
            ffn,
            max_tokens,
            gate_up_out: shmem.alloc_device::<bf16>(max_tokens * 2 * local_ffn)?,
            act: shmem.alloc_device::<bf16>(max_tokens * local_ffn)?,
            gate_up,
            down,
        })
    }

    /// Check the full weights and keep this PE's shards in the layers.
    fn load_weights(&self, gate: &[bf16], up: &[bf16], down: &[bf16]) -> Result<()> {
        let (hidden, ffn) = (self.hidden, self.ffn);
        check_weight(
            "the MLP gate weight (ffn × hidden)",
            gate.len(),
            ffn,
            hidden,
        )?;
        check_weight("the MLP up weight (ffn × hidden)", up.len(), ffn, hidden)?;
        let mut merged = Vec::with_capacity(gate.len() + up.len());
        merged.extend_from_slice(gate);
        merged.extend_from_slice(up);
        self.gate_up.load_weight(&merged)?;
        self.down.load_weight(down)
    }
}

/// [`TpMlp`] in sequence parallelism (Megatron-LM's layout between the attention and the MLP):
/// each PE holds an equal share of the tokens, in PE order, on the way in and on the way out.
/// The merged gate and up projection all-gathers the tokens before its GEMM (a
/// [`ColumnInput::SequenceParallel`] layer), and the down projection reduce-scatters its
/// partial products, so that each PE gets the sums of its own tokens back (a
/// [`RowOutput::SequenceParallel`] layer). No PE holds every token's output.
///
/// With [`Schedule::Fused`] both exchanges are fused with their GEMMs (see there).
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::{bf16, tp::{Schedule, SequenceParallelMlp, TensorParallel}};
/// let shmem = nvshmem::Nvshmem::init()?;
/// let tp = TensorParallel::new(&shmem)?;
/// let (hidden, ffn, tokens) = (4096, 14336, 4096);
/// let mlp = SequenceParallelMlp::new(&tp, hidden, ffn, tokens)?;
/// # let (gate, up, down) = (vec![bf16::ZERO; ffn * hidden], vec![bf16::ZERO; ffn * hidden], vec![bf16::ZERO; hidden * ffn]);
/// mlp.load_weights(&gate, &up, &down)?;
/// let mine = tokens / shmem.n_pes();
/// let x = shmem.malloc::<bf16>(mine * hidden)?; // this PE's tokens
/// let y = shmem.malloc::<bf16>(mine * hidden)?; // their outputs
/// mlp.forward_with(&y, &x, Schedule::Fused, shmem.stream())?;
/// # Ok(()) }
/// ```
pub struct SequenceParallelMlp {
    layers: MlpLayers,
}

impl SequenceParallelMlp {
    /// An MLP of `hidden → ffn → hidden` features with zero weights, for up to `max_tokens`
    /// tokens per call, all PEs' together (collective: allocates symmetric memory).
    pub fn new(tp: &TensorParallel, hidden: usize, ffn: usize, max_tokens: usize) -> Result<Self> {
        let layout = (ColumnInput::SequenceParallel, RowOutput::SequenceParallel);
        Ok(SequenceParallelMlp {
            layers: MlpLayers::new(tp, (hidden, ffn, max_tokens), layout)?,
        })
    }

    /// Hidden features (the input and output width).
    pub fn hidden(&self) -> usize {
        self.layers.hidden
    }

    /// FFN features of the whole MLP.
    pub fn ffn(&self) -> usize {
        self.layers.ffn
    }

    /// The merged gate and up projection.
    pub fn gate_up(&self) -> &ColumnParallelLinear {
        &self.layers.gate_up
    }

    /// The down projection.
    pub fn down(&self) -> &RowParallelLinear {
        &self.layers.down
    }

    /// The schedule that [`forward`](Self::forward) takes for `tokens` tokens (all PEs'
    /// together), both projections alike: [`Schedule::Fused`], [`Schedule::Overlapped`]
    /// (the all-gather beside the gate and up projection) or [`Schedule::Sequential`]
    /// ([`RowParallelLinear::auto_schedule`]).
    pub fn auto_schedule(&self, tokens: usize) -> Schedule {
        self.layers.down.auto_schedule(tokens)
    }

    /// Keep this PE's shards of the full weights, as [`TpMlp::load_weights`].
    pub fn load_weights(&self, gate: &[bf16], up: &[bf16], down: &[bf16]) -> Result<()> {
        self.layers.load_weights(gate, up, down)
    }

    /// The MLP of this PE's tokens `x` (`tokens / n_pes × hidden`; every PE passes as many)
    /// into `y` (the same shape: their outputs), on `stream`, in [`Schedule::Auto`] (fused
    /// from [`ScheduleThresholds::fused_sequence_min_elements`](super::ScheduleThresholds)
    /// elements per PE, tokens per PE × hidden, and overlapped from
    /// `overlapped_sequence_min_elements` below it).
    pub fn forward<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: impl Into<SymmetricView<'a, bf16>>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.forward_with(y, x, Schedule::Auto, stream)
    }

    /// [`forward`](Self::forward) with both projections in `schedule`
    /// ([`Schedule::Overlapped`] overlaps the gate and up projection's all-gather; the
    /// down projection's reduce-scatter then runs sequentially).
    pub fn forward_with<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: impl Into<SymmetricView<'a, bf16>>,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (y, x, l) = (y.into(), x.into(), &self.layers);
        let rows = rows_of("the MLP input (this PE's tokens)", x.len(), l.hidden)?;
        let tokens = rows * l.tp.n_pes();
        check_tokens("SequenceParallelMlp::forward", tokens, l.max_tokens)?;
        // Before anything is launched, so that a bad call leaves nothing running.
        if y.len() != x.len() {
            return Err(Error::Length {
                what: "the MLP output (this PE's tokens × hidden)",
                expected: x.len(),
                got: y.len(),
            });
        }
        let f = l.down.local_in_features().len();
        let gate_up_out = Prefix::of(&l.gate_up_out, tokens * 2 * f);
        let act = Prefix::of(&l.act, tokens * f);
        l.gate_up.forward_with(&gate_up_out, x, schedule, stream)?;
        l.tp.silu_mul(&act, &gate_up_out, tokens, stream)?;
        l.down.forward_with(y, &act, schedule, stream)
    }
}

/// The first `len` elements of a scratch buffer: the layers take outputs of exact lengths.
struct Prefix<'a> {
    buf: &'a DeviceBuffer<bf16>,
    len: usize,
}

impl<'a> Prefix<'a> {
    fn of(buf: &'a DeviceBuffer<bf16>, len: usize) -> Self {
        Prefix {
            buf,
            len: len.min(buf.len()),
        }
    }
}

// SAFETY: a prefix of a live buffer it borrows.
unsafe impl DeviceSlice<bf16> for Prefix<'_> {
    fn device_ptr(&self) -> u64 {
        self.buf.device_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}
