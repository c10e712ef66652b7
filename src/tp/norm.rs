//! The residual add and RMSNorm after a row-parallel layer's all-reduce, as a Llama decoder
//! layer has them, fused with the all-reduce (kernels/tp/rmsnorm.cuh) where its low-latency
//! lines hold the call, and after it otherwise.

use super::TensorParallel;
use crate::abi::{RmsNorm, COLL_MAX_BLOCKS};
use crate::collectives::{AllReduceAlgo, Collective};
use crate::element::ReduceOp;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, SymmetricView};
use crate::module::{grid, KernelArgs, LaunchOptions};
use cudarc::driver::CudaStream;
use half::bf16;
use std::sync::Arc;

/// The kernels' names in the tensor-parallel cubin: fused with the all-reduce, and alone.
pub(super) const FUSED_KERNEL: &str = "allreduce_rmsnorm_bf16";
pub(super) const KERNEL: &str = "rmsnorm_residual_bf16";
/// Threads of a block of either (`RMSNORM_THREADS`): a row's lines are dealt to them the
/// same way in both, so both give the same bits.
const THREADS: u32 = 512;

/// Where an address range starts and ends.
fn span(addr: u64, len: usize) -> (u64, u64) {
    (addr, addr + (len * std::mem::size_of::<bf16>()) as u64)
}

fn disjoint(a: (u64, u64), b: (u64, u64)) -> bool {
    a.1 <= b.0 || b.1 <= a.0
}

impl TensorParallel {
    /// `residual = residual + all_reduce(x)` and `out = rmsnorm(residual) · weight`, per token
    /// of `hidden = weight.len()` elements: the residual add and the RMSNorm that follow a
    /// row-parallel layer in a Llama decoder layer, in one kernel with the all-reduce where
    /// [`fuses_rmsnorm`](Self::fuses_rmsnorm) says so, and after our all-reduce otherwise.
    ///
    /// In bf16, computed in f32: the all-reduce's result `s` is our all-reduce's (summed in PE
    /// order, rounded to bf16), the new residual is `bf16(s + residual)`, and
    /// `out = bf16(r · weight / sqrt(mean(r²) + eps))` with `r` the new residual. So the
    /// result is the same bits as [`Collectives::all_reduce`](crate::Collectives::all_reduce)
    /// followed by [`rmsnorm`](Self::rmsnorm), on every PE.
    ///
    /// `x` and `out` are `tokens × hidden` and symmetric; `out` may be `x` (in place).
    /// `residual` (`tokens × hidden`, the same on every PE for the result to be) and `weight`
    /// are this PE's device memory, 8-byte aligned, apart from `x` and `out`. `hidden` must
    /// be a multiple of 4. Stream-ordered and capturable in CUDA graphs; every PE makes the
    /// call, as for any collective.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{bf16, tp::TensorParallel};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let tp = TensorParallel::new(&shmem)?;
    /// let (tokens, hidden) = (4, 4096);
    /// // A row-parallel layer's partial output on each PE, and the layer's residual stream.
    /// let partial = shmem.malloc::<bf16>(tokens * hidden)?;
    /// let normed = shmem.malloc::<bf16>(tokens * hidden)?;
    /// let residual = shmem.alloc_device::<bf16>(tokens * hidden)?;
    /// let weight = shmem.alloc_device::<bf16>(hidden)?;
    /// tp.all_reduce_rmsnorm(&normed, &residual, &partial, &weight, 1e-5, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_rmsnorm<'a>(
        &self,
        out: impl Into<SymmetricView<'a, bf16>>,
        residual: &impl DeviceMemory<bf16>,
        x: impl Into<SymmetricView<'a, bf16>>,
        weight: &impl DeviceMemory<bf16>,
        eps: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (out, x) = (out.into(), x.into());
        let norm = self.check_rmsnorm(
            (out.as_ptr() as u64, out.len()),
            residual,
            (x.as_ptr() as u64, x.len()),
            weight,
            eps,
            stream,
        )?;
        let tokens = x.len() / norm.hidden as usize;
        let c = self.collectives();
        if !self.fuses_rmsnorm(tokens, norm.hidden as usize) {
            c.all_reduce(out, x, ReduceOp::Sum, AllReduceAlgo::Auto, stream)?;
            // SAFETY: checked above; `out` holds the sum, which the kernel reads in place.
            return unsafe {
                self.rmsnorm_raw(
                    out.as_ptr() as u64,
                    out.as_ptr() as u64,
                    tokens,
                    norm,
                    stream,
                )
            };
        }
        let blocks = tokens.min(c.sm_count()).min(COLL_MAX_BLOCKS as usize) as u32;
        let staged = x.num_bytes();
        // SAFETY: the kernel's parameters end with the RmsNorm, whose buffers were checked to
        // hold tokens × hidden and hidden elements, on this PE's GPU, for the call's stream.
        unsafe {
            c.fused_call(
                Collective::AllReduceRmsNorm,
                &self.inner_norm().fused,
                out,
                (x.as_ptr() as u64, staged),
                (blocks, THREADS),
                norm,
                stream,
            )
        }
    }

    /// Whether [`all_reduce_rmsnorm`](Self::all_reduce_rmsnorm) of `tokens × hidden` runs as
    /// one kernel: when the collectives' low-latency lines hold the call (up to their PE
    /// limit; 1 MiB of input per PE with the default workspace: 64 tokens of 8192), else it
    /// is our all-reduce and then [`rmsnorm`](Self::rmsnorm). The same on every PE.
    pub fn fuses_rmsnorm(&self, tokens: usize, hidden: usize) -> bool {
        let bytes = tokens * hidden * std::mem::size_of::<bf16>();
        tokens > 0 && hidden.is_multiple_of(4) && self.collectives().fused_lines_fit(bytes)
    }

    /// `residual = residual + sum` and `out = rmsnorm(residual) · weight`, per token of
    /// `weight.len()` elements, on this PE alone: what
    /// [`all_reduce_rmsnorm`](Self::all_reduce_rmsnorm) does after the all-reduce, with the
    /// same arithmetic. `out` may be `sum`; the rules on the buffers are the same.
    pub fn rmsnorm(
        &self,
        out: &impl DeviceMemory<bf16>,
        residual: &impl DeviceMemory<bf16>,
        sum: &impl DeviceMemory<bf16>,
        weight: &impl DeviceMemory<bf16>,
        eps: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (o, s) = (out.device_addr(stream), sum.device_addr(stream));
        let norm = self.check_rmsnorm(
            (o, out.device_len()),
            residual,
            (s, sum.device_len()),
            weight,
            eps,
            stream,
        )?;
        let tokens = sum.device_len() / norm.hidden as usize;
        // SAFETY: checked above.
        unsafe { self.rmsnorm_raw(o, s, tokens, norm, stream) }
    }

    /// The checks both calls make, and the kernels' by-value parameter.
    fn check_rmsnorm(
        &self,
        (out, out_len): (u64, usize),
        residual: &impl DeviceMemory<bf16>,
        (x, x_len): (u64, usize),
        weight: &impl DeviceMemory<bf16>,
        eps: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<RmsNorm> {
        let hidden = weight.device_len();
        let (res, w) = (residual.device_addr(stream), weight.device_addr(stream));
        let bad = |why: String| Err(Error::InvalidArgument(format!("all_reduce_rmsnorm: {why}")));
        if hidden == 0 || !hidden.is_multiple_of(4) {
            return bad(format!(
                "the weight has {hidden} elements; the hidden size must be a positive multiple of 4"
            ));
        }
        if !x_len.is_multiple_of(hidden) || out_len != x_len || residual.device_len() != x_len {
            return bad(format!(
                "the input has {x_len} elements, the output {out_len} and the residual {}; \
                 each must be tokens × hidden ({hidden})",
                residual.device_len()
            ));
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return bad(format!("eps is {eps}; it must be finite and not negative"));
        }
        if [out, res, x, w].iter().any(|a| !a.is_multiple_of(8)) {
            return Err(Error::Misaligned {
                what: "an all_reduce_rmsnorm buffer (input, output, residual or weight)",
                align: 8,
            });
        }
        let (xs, os, rs, ws) = (
            span(x, x_len),
            span(out, out_len),
            span(res, x_len),
            span(w, hidden),
        );
        if !(out == x || disjoint(xs, os)) {
            return bad("the output overlaps the input without being it".into());
        }
        if [xs, os, ws].iter().any(|s| !disjoint(rs, *s)) || !disjoint(ws, os) {
            return bad("the residual, the weight and the output must not overlap".into());
        }
        Ok(RmsNorm {
            residual: res,
            weight: w,
            hidden: hidden as u64,
            eps,
        })
    }

    /// The residual add and RMSNorm alone, after an all-reduce into `sum`.
    ///
    /// # Safety
    /// `out` and `sum` hold `tokens × norm.hidden` elements and `norm`'s buffers what it says,
    /// on this PE's GPU, until the kernel has run.
    unsafe fn rmsnorm_raw(
        &self,
        out: u64,
        sum: u64,
        tokens: usize,
        norm: RmsNorm,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if tokens == 0 {
            return Ok(());
        }
        let mut args = KernelArgs::new();
        args.device_ptr(sum)
            .device_ptr(out)
            .value(tokens as u64)
            .value(norm);
        let blocks = tokens.min(65_535) as u32;
        // Programmatic: it waits for the all-reduce before it (kernels/tp.cu).
        let options = LaunchOptions::new().programmatic(true);
        self.inner_norm()
            .alone
            .launch_with(grid(blocks, THREADS), options, stream, &mut args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_overlap_only_where_they_share_bytes() {
        assert!(disjoint(span(0, 4), span(8, 4)));
        assert!(!disjoint(span(0, 5), span(8, 4)));
        assert!(disjoint(span(16, 4), span(0, 8)));
        assert_eq!(span(100, 3), (100, 106));
    }
}
