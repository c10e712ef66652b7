//! The backward pass, for training: the column- and row-parallel layers' input and weight
//! gradients (their GEMMs, and the column layer's all-reduce of its input gradient over the
//! group; the weight gradients apart, so that a pipeline stage may take them once for all its
//! micro-batches), and the
//! kernels between the GEMMs of a Llama block: SiLU(gate) · up, and the RMSNorm after a
//! residual add (kernels/tp/train.cuh). The layers take a replicated input (column) and give
//! a replicated output (row), as in the forward pass of [`TpMlp`](super::TpMlp).

use super::{rows_of, ColumnInput, ColumnParallelLinear, LinearShape, RowOutput};
use super::{RowParallelLinear, TensorParallel};
use crate::collectives::AllReduceAlgo;
use crate::element::ReduceOp;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, SymmetricView};
use crate::module::{grid, Function, KernelArgs, Module};
use cudarc::driver::CudaStream;
use half::bf16;
use std::sync::Arc;

pub(super) const SILU_MUL_BACKWARD: &str = "silu_mul_backward_bf16";
pub(super) const RMSNORM_BACKWARD: &str = "rmsnorm_backward_bf16";

/// Threads of a norm backward block (the kernel's launch bound, RMSNORM_THREADS).
const NORM_THREADS: u32 = 512;

/// The backward kernels of the tensor-parallel cubin.
pub(super) struct TrainKernels {
    silu_mul: Function,
    rmsnorm: Function,
}

impl TrainKernels {
    pub(super) fn load(module: &Module) -> Result<Self> {
        Ok(TrainKernels {
            silu_mul: module.function(SILU_MUL_BACKWARD)?,
            rmsnorm: module.function(RMSNORM_BACKWARD)?,
        })
    }
}

/// `dw = dyᵀ · x` of `shape`, ordered among the group's calls.
fn weight_grad(
    tp: &TensorParallel,
    shape: LinearShape,
    (dw, dy, x): (
        &impl DeviceMemory<bf16>,
        &impl DeviceMemory<bf16>,
        &impl DeviceMemory<bf16>,
    ),
    stream: &Arc<CudaStream>,
) -> Result<()> {
    tp.ordered(stream, || {
        tp.gemm().linear_weight_grad(dw, dy, x, shape, stream)
    })
}

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<()> {
    crate::memory::check_len(what, expected, got)
}

impl TensorParallel {
    /// The gradient of [`silu_mul`](Self::silu_mul): `dgu` (`tokens × 2f`, `[dgate | dup]`
    /// per row, as `gu` holds gate then up) from the forward input `gu` and the output's
    /// gradient `da` (`tokens × f`): `dup = da · silu(gate)`, `dgate = da · up · σ(gate) ·
    /// (1 + gate · (1 − σ(gate)))`, in f32, each rounded once to bf16.
    pub fn silu_mul_backward(
        &self,
        dgu: &impl DeviceMemory<bf16>,
        da: &impl DeviceMemory<bf16>,
        gu: &impl DeviceMemory<bf16>,
        tokens: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let f = da.device_len().checked_div(tokens).unwrap_or(0);
        if da.device_len() != tokens * f {
            return Err(Error::InvalidArgument(format!(
                "silu_mul_backward of {tokens} tokens: the output gradient has {} elements, \
                 not tokens × f",
                da.device_len()
            )));
        }
        check_len(
            "silu_mul_backward's gu (tokens × 2f)",
            gu.device_len(),
            2 * tokens * f,
        )?;
        check_len(
            "silu_mul_backward's dgu (tokens × 2f)",
            dgu.device_len(),
            2 * tokens * f,
        )?;
        if tokens * f == 0 {
            return Ok(());
        }
        let mut args = KernelArgs::new();
        args.device_ptr(gu.device_addr(stream))
            .device_ptr(da.device_addr(stream))
            .device_ptr(dgu.device_addr(stream))
            .value(tokens as u64)
            .value(f as u64);
        let blocks = (tokens * f).div_ceil(256).min(self.sm_count() as usize * 8) as u32;
        // SAFETY: the lengths were checked above.
        unsafe {
            self.train()
                .silu_mul
                .launch(grid(blocks, 256), stream, &mut args)
        }
    }

    /// `dresidual += ` the gradient, through `out = rmsnorm(residual) · weight` (as
    /// [`rmsnorm`](Self::rmsnorm) computes it, `weight.len()` elements a token), of `dout`:
    /// per token, `scale · weight · dout − residual · scale³ / hidden · Σ dout · weight ·
    /// residual`, `scale = 1 / √(mean of residual² + eps)`, in f32, rounded once to bf16
    /// with the sum. The weight itself is not trained here.
    pub fn rmsnorm_backward(
        &self,
        dresidual: &impl DeviceMemory<bf16>,
        dout: &impl DeviceMemory<bf16>,
        residual: &impl DeviceMemory<bf16>,
        weight: &impl DeviceMemory<bf16>,
        eps: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let hidden = weight.device_len();
        let rows = rows_of("rmsnorm_backward's dout", dout.device_len(), hidden)?;
        check_len(
            "rmsnorm_backward's residual",
            residual.device_len(),
            rows * hidden,
        )?;
        check_len(
            "rmsnorm_backward's dresidual",
            dresidual.device_len(),
            rows * hidden,
        )?;
        if !(eps > 0.0 && eps.is_finite()) || hidden > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "rmsnorm_backward with eps {eps} over {hidden} features: eps must be positive"
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        let d = dresidual.device_addr(stream);
        let mut args = KernelArgs::new();
        args.device_ptr(dout.device_addr(stream))
            .device_ptr(residual.device_addr(stream))
            .device_ptr(weight.device_addr(stream))
            .device_ptr(d)
            .device_ptr(d)
            .value(rows as u64)
            .value(hidden as u32)
            .value(eps);
        let blocks = rows.min(self.sm_count() as usize * 4) as u32;
        // SAFETY: the lengths were checked above.
        unsafe {
            self.train()
                .rmsnorm
                .launch(grid(blocks, NORM_THREADS), stream, &mut args)
        }
    }
}

impl ColumnParallelLinear {
    /// The input gradient of [`forward`](Self::forward) with a replicated input: `dx = Σ
    /// over the group's PEs of dy · w`, summed by our all-reduce into `dx` (`tokens ×
    /// in_features`, symmetric), the same bits on every PE of the group. `dy` is the
    /// gradient of this PE's output (`tokens × local_out_features`). Collective over the
    /// group. A sequence-parallel layer is refused.
    ///
    /// The backward pass of a Megatron pair:
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::bf16;
    /// use nvshmem::tp::{ColumnInput, ColumnParallelLinear, RowParallelLinear, TensorParallel};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let tp = TensorParallel::new(&shmem)?;
    /// let (hidden, ffn, tokens) = (1024, 4096, 16);
    /// let up = ColumnParallelLinear::new(&tp, hidden, ffn, ColumnInput::Replicated, tokens)?;
    /// let down = RowParallelLinear::new(&tp, ffn, hidden, tokens)?;
    /// let local = up.local_out_features();
    /// let device = |len| shmem.alloc_device::<bf16>(len);
    /// let x = shmem.malloc::<bf16>(tokens * hidden)?; // the pair's input, as forward took it
    /// let h = device(tokens * local)?; // up's output, down's input
    /// let dy = device(tokens * hidden)?; // the gradient of down's output
    /// let (dh, dx) = (device(tokens * local)?, shmem.malloc::<bf16>(tokens * hidden)?);
    /// let (dw_up, dw_down) = (device(local * hidden)?, device(hidden * local)?);
    /// let s = shmem.stream();
    /// down.input_grad(&dh, &dy, s)?; // this PE's features: no communication
    /// down.weight_grad(&dw_down, &dy, &h, s)?;
    /// up.input_grad(&dx, &dh, s)?; // summed over the group
    /// up.weight_grad(&dw_up, &dh, &x, s)?;
    /// # Ok(()) }
    /// ```
    pub fn input_grad<'a>(
        &self,
        dx: impl Into<SymmetricView<'a, bf16>>,
        dy: &impl DeviceMemory<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.replicated("input_grad")?;
        let dx = dx.into();
        let (k, n) = (self.in_features(), self.local_out_features());
        let tokens = rows_of("the column-parallel output gradient dy", dy.device_len(), n)?;
        let shape = LinearShape { m: tokens, n, k };
        let tp = self.group();
        tp.ordered(stream, || {
            tp.gemm()
                .linear_input_grad(&dx, dy, self.weight(), shape, stream)?;
            tp.collectives()
                .all_reduce(dx, dx, ReduceOp::Sum, AllReduceAlgo::Auto, stream)
        })
    }

    /// This PE's weight gradient: `dw = dyᵀ · x` (`local_out_features × in_features`),
    /// summed over the tokens of `dy` (`tokens × local_out_features`) and the input `x`
    /// (`tokens × in_features`, as [`forward`](Self::forward) took it). Pass every
    /// micro-batch's rows at once to sum them in one product. No communication.
    pub fn weight_grad(
        &self,
        dw: &impl DeviceMemory<bf16>,
        dy: &impl DeviceMemory<bf16>,
        x: &impl DeviceMemory<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.replicated("weight_grad")?;
        let (k, n) = (self.in_features(), self.local_out_features());
        let tokens = rows_of("the column-parallel input x", x.device_len(), k)?;
        weight_grad(
            self.group(),
            LinearShape { m: tokens, n, k },
            (dw, dy, x),
            stream,
        )
    }

    fn replicated(&self, what: &str) -> Result<()> {
        match self.input() {
            ColumnInput::Replicated => Ok(()),
            ColumnInput::SequenceParallel => Err(Error::InvalidArgument(format!(
                "ColumnParallelLinear::{what} takes a replicated input; a sequence-parallel \
                 layer has no backward pass"
            ))),
        }
    }
}

impl RowParallelLinear {
    /// The input gradient of [`forward`](Self::forward) with a replicated output: `dx = dy ·
    /// w` (`tokens × local_in_features`) from the output's gradient `dy` (`tokens ×
    /// out_features`, the same on every PE of the group). No communication. A
    /// sequence-parallel layer is refused.
    pub fn input_grad(
        &self,
        dx: &impl DeviceMemory<bf16>,
        dy: &impl DeviceMemory<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let shape = self.grad_shape("input_grad", dy)?;
        let tp = self.group();
        tp.ordered(stream, || {
            tp.gemm()
                .linear_input_grad(dx, dy, self.weight(), shape, stream)
        })
    }

    /// This PE's weight gradient: `dw = dyᵀ · x` (`out_features × local_in_features`),
    /// summed over the tokens of `dy` and of this PE's forward input `x` (`tokens ×
    /// local_in_features`). Pass every micro-batch's rows at once to sum them in one
    /// product. No communication.
    pub fn weight_grad(
        &self,
        dw: &impl DeviceMemory<bf16>,
        dy: &impl DeviceMemory<bf16>,
        x: &impl DeviceMemory<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let shape = self.grad_shape("weight_grad", dy)?;
        weight_grad(self.group(), shape, (dw, dy, x), stream)
    }

    /// The product's shape for an output gradient `dy`; refused for a sequence-parallel layer.
    fn grad_shape(&self, what: &str, dy: &impl DeviceMemory<bf16>) -> Result<LinearShape> {
        if self.output() != RowOutput::Replicated {
            return Err(Error::InvalidArgument(format!(
                "RowParallelLinear::{what} takes a replicated output gradient; a \
                 sequence-parallel layer has no backward pass"
            )));
        }
        let (k, n) = (self.local_in_features().len(), self.out_features());
        let m = rows_of("the row-parallel output gradient dy", dy.device_len(), n)?;
        Ok(LinearShape { m, n, k })
    }
}
