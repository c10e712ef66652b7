//! A Llama-style tensor-parallel MLP: `down(SiLU(gate(x)) * up(x))`.

use super::{check_tokens, check_weight, rows_of, ColumnInput, ColumnParallelLinear};
use super::{RowParallelLinear, Schedule, TensorParallel};
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceSlice, SymmetricView};
use cudarc::driver::CudaStream;
use half::bf16;
use std::sync::Arc;

/// `y = down(SiLU(x · gateᵀ) * (x · upᵀ))` with the FFN features sharded across the PEs:
/// the gate and up projections are one merged [`ColumnParallelLinear`] (replicated input),
/// `SiLU(gate) * up` is one element-wise kernel, and the down projection is a
/// [`RowParallelLinear`] whose all-reduce leaves `y` replicated, bitwise identical on every
/// PE. One forward call is: GEMM, kernel, GEMM, all-reduce, on one stream.
///
/// See the [module documentation](super) for an example.
pub struct TpMlp {
    tp: TensorParallel,
    hidden: usize,
    ffn: usize,
    max_tokens: usize,
    gate_up: ColumnParallelLinear,
    down: RowParallelLinear,
    /// This PE's gate and up features per token.
    gate_up_out: DeviceBuffer<bf16>,
    /// `SiLU(gate) * up` per token: the down projection's input.
    act: DeviceBuffer<bf16>,
}

impl TpMlp {
    /// An MLP of `hidden → ffn → hidden` features with zero weights, for up to `max_tokens`
    /// tokens per call (collective: allocates symmetric memory).
    pub fn new(tp: &TensorParallel, hidden: usize, ffn: usize, max_tokens: usize) -> Result<Self> {
        let gate_up = ColumnParallelLinear::merged(
            tp,
            hidden,
            &[ffn, ffn],
            ColumnInput::Replicated,
            max_tokens,
        )?;
        let down = RowParallelLinear::new(tp, ffn, hidden, max_tokens)?;
        let local_ffn = down.local_in_features().len();
        let shmem = tp.runtime();
        Ok(TpMlp {
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

    /// Hidden features (the input and output width).
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// FFN features of the whole MLP.
    pub fn ffn(&self) -> usize {
        self.ffn
    }

    /// The merged gate and up projection.
    pub fn gate_up(&self) -> &ColumnParallelLinear {
        &self.gate_up
    }

    /// The down projection.
    pub fn down(&self) -> &RowParallelLinear {
        &self.down
    }

    /// Keep this PE's shards of the full weights: `gate` and `up` are `ffn × hidden`, `down`
    /// is `hidden × ffn`, row-major (as PyTorch stores `nn.Linear` weights).
    pub fn load_weights(&self, gate: &[bf16], up: &[bf16], down: &[bf16]) -> Result<()> {
        check_weight(
            "the MLP gate weight (ffn × hidden)",
            gate.len(),
            self.ffn,
            self.hidden,
        )?;
        check_weight(
            "the MLP up weight (ffn × hidden)",
            up.len(),
            self.ffn,
            self.hidden,
        )?;
        let mut merged = Vec::with_capacity(gate.len() + up.len());
        merged.extend_from_slice(gate);
        merged.extend_from_slice(up);
        self.gate_up.load_weight(&merged)?;
        self.down.load_weight(down)
    }

    /// The MLP of `x` (`tokens × hidden`, the same on every PE) into `y` (`tokens × hidden`,
    /// the same on every PE afterwards), on `stream`.
    pub fn forward<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceSlice<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.forward_with(y, x, Schedule::Sequential, stream)
    }

    /// [`forward`](Self::forward) with the down projection in `schedule`.
    pub fn forward_with<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceSlice<bf16>,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let y = y.into();
        let tokens = rows_of("the MLP input", x.len(), self.hidden)?;
        check_tokens("TpMlp::forward", tokens, self.max_tokens)?;
        // Before anything is launched, so that a bad call leaves nothing running.
        if y.len() != tokens * self.hidden {
            return Err(Error::Length {
                what: "the MLP output (tokens × hidden)",
                expected: tokens * self.hidden,
                got: y.len(),
            });
        }
        let f = self.down.local_in_features().len();
        // SAFETY: `x` holds `tokens × hidden` elements and the scratch buffers `max_tokens`
        // rows, at least `tokens`.
        unsafe {
            self.gate_up.run(
                self.gate_up_out.device_ptr(),
                x.device_ptr(),
                tokens,
                stream,
            )?;
            self.tp.silu_mul_raw(
                self.act.device_ptr(),
                self.gate_up_out.device_ptr(),
                tokens,
                f,
                stream,
            )?;
            self.down
                .run(y, self.act.device_ptr(), tokens, schedule, stream)
        }
    }
}
