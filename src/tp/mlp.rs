//! A Llama-style tensor-parallel MLP, `down(SiLU(gate(x)) * up(x))`, with its tokens
//! replicated ([`TpMlp`]) or sharded ([`SequenceParallelMlp`]): one core, two layouts.

use super::{check_tokens, check_weight, rows_of, ColumnInput, ColumnParallelLinear};
use super::{RowOutput, RowParallelLinear, Schedule, TensorParallel};
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceMemory, SymmetricView};
use cudarc::driver::CudaStream;
use half::bf16;
use std::ops::Range;
use std::sync::Arc;

const BF16: usize = std::mem::size_of::<bf16>();

/// The sizes of an MLP: `hidden → ffn → hidden` features, for up to `max_tokens` tokens per
/// call (this PE's for [`TpMlp`], all PEs' together for [`SequenceParallelMlp`]).
///
/// ```
/// let shape = nvshmem::tp::MlpShape { hidden: 4096, ffn: 14336, max_tokens: 64 };
/// # assert_eq!(shape.ffn, 14336);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpShape {
    /// Input and output features.
    pub hidden: usize,
    /// FFN features of the whole MLP (every PE holds `ffn / n_pes` of them).
    pub ffn: usize,
    /// The most tokens a call may take.
    pub max_tokens: usize,
}

/// `y = down(SiLU(x · gateᵀ) * (x · upᵀ))` with the FFN features sharded across the PEs:
/// the gate and up projections are one merged [`ColumnParallelLinear`] (replicated input),
/// `SiLU(gate) * up` is one element-wise kernel, and the down projection is a
/// [`RowParallelLinear`] whose all-reduce leaves `y` replicated, bitwise identical on every
/// PE. Where the down projection fuses its all-reduce in rounds ([`Schedule::Fused`]), the
/// whole MLP runs round by round, so that a round's exchange travels beside the next round's
/// three GEMMs.
///
/// See the [module documentation](super) for an example.
pub struct TpMlp {
    layers: MlpLayers,
}

/// [`TpMlp`] in sequence parallelism (Megatron-LM's layout between the attention and the MLP):
/// each PE holds an equal share of the tokens, in PE order, on the way in and on the way out.
/// The gate and up projection all-gathers the tokens before its GEMM (a
/// [`ColumnInput::SequenceParallel`] layer), and the down projection reduce-scatters its
/// partial products (a [`RowOutput::SequenceParallel`] layer), so that each PE gets the sums
/// of its own tokens back.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::{bf16, tp::{MlpShape, Schedule, SequenceParallelMlp, TensorParallel}};
/// let shmem = nvshmem::Nvshmem::init()?;
/// let tp = TensorParallel::new(&shmem)?;
/// let (hidden, ffn, tokens) = (4096, 14336, 4096);
/// let mlp = SequenceParallelMlp::new(&tp, MlpShape { hidden, ffn, max_tokens: tokens })?;
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

/// What both MLPs share: their parts, and the loading of their weights.
macro_rules! mlp_parts {
    ($mlp:ident, $layout:expr, $tokens:literal) => {
        impl $mlp {
            #[doc = concat!("An MLP of `hidden → ffn → hidden` features with zero weights, for up \
                to `max_tokens` tokens per call", $tokens, " (collective: allocates symmetric \
                memory).")]
            pub fn new(tp: &TensorParallel, shape: MlpShape) -> Result<Self> {
                let MlpShape { hidden, ffn, max_tokens } = shape;
                let layers = MlpLayers::new(tp, (hidden, ffn, max_tokens), $layout)?;
                Ok($mlp { layers })
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

            /// Keep this PE's shards of the full weights: `gate` and `up` are `ffn × hidden`,
            /// `down` is `hidden × ffn`, row-major (as PyTorch stores `nn.Linear` weights).
            /// Collective.
            pub fn load_weights(&self, gate: &[bf16], up: &[bf16], down: &[bf16]) -> Result<()> {
                self.layers.load_weights(gate, up, down)
            }
        }
    };
}

mlp_parts!(TpMlp, (ColumnInput::Replicated, RowOutput::Replicated), "");
mlp_parts!(
    SequenceParallelMlp,
    (ColumnInput::SequenceParallel, RowOutput::SequenceParallel),
    ", all PEs' together"
);

impl TpMlp {
    /// What [`forward`](Self::forward) runs for `tokens` tokens: the down projection's
    /// schedule ([`RowParallelLinear::auto_schedule`]).
    pub fn auto_schedule(&self, tokens: usize) -> Schedule {
        self.layers.down.auto_schedule(tokens)
    }

    /// The MLP of `x` (`tokens × hidden`, the same on every PE) into `y` (`tokens × hidden`,
    /// the same on every PE afterwards), on `stream`, in [`Schedule::Auto`].
    pub fn forward<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceMemory<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.forward_with(y, x, Schedule::Auto, stream)
    }

    /// [`forward`](Self::forward) with the down projection in `schedule`.
    pub fn forward_with<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceMemory<bf16>,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (y, l) = (y.into(), &self.layers);
        let tokens = rows_of("the MLP input", x.device_len(), l.hidden)?;
        l.check(tokens, y.len(), tokens * l.hidden)?;
        // The gate and up projection and the activation of some tokens: all of them first,
        // or, fused, each round's just before the round.
        // SAFETY: `x` holds `tokens × hidden` elements; `rows` lies within `tokens`.
        let produce =
            |rows: Range<usize>| unsafe { l.activate(x.device_addr(stream), rows, stream) };
        // SAFETY: `produce` writes `act`'s rows before the GEMMs that read them.
        l.tp.ordered(stream, || unsafe {
            l.down
                .run_producing(y, l.act.addr(), tokens, schedule, stream, Some(&produce))
        })
    }

    /// The MLP half of a Llama decoder layer: `residual += mlp(x)` and
    /// `out = rmsnorm(residual) · norm_weight`, the down projection's all-reduce fused with
    /// the residual add and RMSNorm where it fits
    /// ([`RowParallelLinear::forward_rmsnorm`]). `x`, `out` and `residual` are
    /// `tokens × hidden`; `norm_weight` is `hidden`.
    pub fn forward_rmsnorm<'a>(
        &self,
        out: impl Into<SymmetricView<'a, bf16>>,
        residual: &impl DeviceMemory<bf16>,
        x: &impl DeviceMemory<bf16>,
        norm_weight: &impl DeviceMemory<bf16>,
        eps: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (out, l) = (out.into(), &self.layers);
        let tokens = rows_of("the MLP input", x.device_len(), l.hidden)?;
        l.check(tokens, out.len(), tokens * l.hidden)?;
        // SAFETY: `x` holds `tokens × hidden` elements.
        l.tp.ordered(stream, || unsafe {
            l.activate(x.device_addr(stream), 0..tokens, stream)?;
            let act = l.act.addr();
            l.down
                .run_rmsnorm(out, residual, act, tokens, (norm_weight, eps), stream)
        })
    }
}

impl SequenceParallelMlp {
    /// What [`forward`](Self::forward) runs for `tokens` tokens (all PEs' together):
    /// [`Schedule::Fused`] (both exchanges fused), [`Schedule::Overlapped`] (the all-gather
    /// beside the gate and up projection) or [`Schedule::Sequential`]. Both projections
    /// share the width and the tokens, so the gate and up projection's
    /// [`resolved_schedule`](ColumnParallelLinear::resolved_schedule) says it.
    pub fn auto_schedule(&self, tokens: usize) -> Schedule {
        let gate_up = &self.layers.gate_up;
        gate_up.resolved_schedule(Schedule::Auto, tokens)
    }

    /// The MLP of this PE's tokens `x` (`tokens / n_pes × hidden`; every PE passes as many)
    /// into `y` (the same shape: their outputs), on `stream`, in [`Schedule::Auto`].
    pub fn forward<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: impl Into<SymmetricView<'a, bf16>>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.forward_with(y, x, Schedule::Auto, stream)
    }

    /// [`forward`](Self::forward) with both projections in `schedule`.
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
        l.check(tokens, y.len(), x.len())?;
        let f = l.down.local_in_features().len();
        let (gu, act) = (l.gate_up_out.addr(), l.act.addr());
        // SAFETY: the scratch buffers hold `max_tokens` rows, at least `tokens`, and `y`
        // this PE's rows.
        l.tp.ordered(stream, || unsafe {
            l.gate_up.run_path(gu, x, tokens, schedule, stream)?;
            l.tp.silu_mul_raw(act, gu, tokens, f, stream)?;
            l.down.run(y, act, tokens, schedule, stream)
        })
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

    /// A call's tokens and its output's length, before anything is launched, so that a bad
    /// call leaves nothing running.
    fn check(&self, tokens: usize, got: usize, expected: usize) -> Result<()> {
        check_tokens("the MLP's forward", tokens, self.max_tokens)?;
        match got == expected {
            true => Ok(()),
            false => Err(Error::Length {
                what: "the MLP output (as many tokens × hidden as its input)",
                expected,
                got,
            }),
        }
    }

    /// The gate and up projection of tokens `rows` of `x` (replicated input), then their
    /// activation `SiLU(gate) * up` into the same rows of `act`.
    ///
    /// # Safety
    /// `x` holds the call's `tokens × hidden` elements, `rows` lies within them, and
    /// `tokens` is at most `max_tokens` (the scratch buffers' rows).
    unsafe fn activate(&self, x: u64, rows: Range<usize>, stream: &Arc<CudaStream>) -> Result<()> {
        let f = self.down.local_in_features().len();
        let gu = self.gate_up_out.addr() + (rows.start * 2 * f * BF16) as u64;
        let act = self.act.addr() + (rows.start * f * BF16) as u64;
        let x = x + (rows.start * self.hidden * BF16) as u64;
        self.gate_up.run(gu, x, rows.len(), stream)?;
        self.tp.silu_mul_raw(act, gu, rows.len(), f, stream)
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
        self.gate_up.load_weight(&[gate, up].concat())?;
        self.down.load_weight(down)
    }
}
