//! The row-parallel decode GEMM fused with its all-reduce ([`Schedule::Fused`] at up to
//! [`FUSED_DECODE_MAX_TOKENS`] tokens, kernels/tp/decode_allreduce.cuh): the kernel, when it
//! takes a call, its launch, and the measurement at load time that tells
//! [`Schedule::Auto`] where it is faster than the decode GEMM and the all-reduce in turn.

use super::gemm::Stopwatch;
use super::{Schedule, TensorParallel};
use crate::abi::{DecodeLinear, COLL_MAX_BLOCKS};
use crate::collectives::{AllReduceAlgo, Collective, Collectives};
use crate::element::ReduceOp;
use crate::error::{CudaResultExt, Result};
use crate::memory::{SymmetricBuffer, SymmetricView};
use crate::module::{Function, Module};
use cudarc::driver::CudaStream;
use half::bf16;
use std::sync::Arc;

/// The most tokens the fused decode kernel takes (`FUSED_DECODE_MAX_M` in
/// kernels/tp/decode_allreduce.cuh).
pub const FUSED_DECODE_MAX_TOKENS: usize = 8;

/// Threads of a block of the fused kernel, and its blocks per SM (its launch bounds in
/// kernels/tp.cu).
const THREADS: u32 = 256;
const BLOCKS_PER_SM: u32 = 2;

/// The fused kernel and its grid: the same on every PE (0 blocks where it does not fit).
pub(super) struct FusedDecode {
    kernel: Function,
    blocks: u32,
}

impl FusedDecode {
    /// The kernel of the tensor-parallel module, on a grid that pairs each block with the
    /// same block of every peer: sized by the SM count every PE agreed on and the kernel's
    /// occupancy (the same binary everywhere).
    pub(super) fn load(module: &Module, collectives: &Collectives, sms: u32) -> Result<Self> {
        let kernel = module.function(KERNEL)?;
        let per_sm = kernel.max_resident_blocks(THREADS, 0)? / sms.max(1);
        let blocks =
            (collectives.sm_count() as u32 * per_sm.min(BLOCKS_PER_SM)).min(COLL_MAX_BLOCKS);
        Ok(FusedDecode { kernel, blocks })
    }

    /// Whether the kernel takes `tokens × out_features` into an output at `y`: up to
    /// [`FUSED_DECODE_MAX_TOKENS`] tokens, rows of whole lines of 4 features, room in a lines
    /// slot. The same on every PE: it depends on the shape, the output's symmetric address
    /// and the configuration.
    pub(super) fn fits(
        &self,
        c: &Collectives,
        (tokens, out_features): (usize, usize),
        y: u64,
    ) -> bool {
        let bytes = tokens * out_features * std::mem::size_of::<bf16>();
        (1..=FUSED_DECODE_MAX_TOKENS).contains(&tokens)
            && self.blocks > 0
            && out_features % 4 == 0
            && y.is_multiple_of(8)
            && c.fused_lines_fit(bytes)
    }

    /// `y = Σ over PEs of x · wᵀ` in one kernel, for a call that [`fits`](Self::fits).
    ///
    /// # Safety
    /// `x` holds `lin.m × lin.k` and `lin.w` `lin.n × lin.k` elements of this PE's GPU, and
    /// `y` `lin.m × lin.n`, until the kernel has run.
    pub(super) unsafe fn launch(
        &self,
        c: &Collectives,
        y: SymmetricView<'_, bf16>,
        x: u64,
        lin: DecodeLinear,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let staged = y.len() * std::mem::size_of::<bf16>();
        c.fused_call(
            Collective::LinearAllReduce,
            &self.kernel,
            y,
            (x, staged),
            (self.blocks, THREADS),
            lin,
            stream,
        )
    }
}

/// The kernel's name in the tensor-parallel cubin.
pub(super) const KERNEL: &str = "decode_linear_allreduce_bf16";

/// The token counts (bit m - 1 for m tokens) where `mine[m - 1]` is 1 on every PE, through
/// `agreed` (one flag per token count) and our collectives' bounded waits. Collective.
pub(super) fn agree(
    tp: &TensorParallel,
    agreed: &SymmetricBuffer<i32>,
    mine: &[i32],
) -> Result<u32> {
    agreed.copy_from_host(mine)?;
    let stream = tp.runtime().stream();
    let min = ReduceOp::Min;
    tp.collectives()
        .all_reduce(agreed, agreed, min, AllReduceAlgo::Auto, stream)?;
    stream.synchronize().during("cuStreamSynchronize")?;
    let every = agreed.to_vec()?;
    Ok((0..mine.len())
        .filter(|&i| every[i] == 1)
        .fold(0u32, |bits, i| bits | 1 << i))
}

/// Of the token counts `todo`, those where `call(m, Fused)` measured faster than
/// `call(m, Sequential)` on this PE, as one flag per token count up to
/// [`FUSED_DECODE_MAX_TOKENS`] (for [`agree`]). Blocks of calls of either way alternate, in
/// an order that rotates, on the runtime's stream; it waits for the stream at the end, also
/// after a failure (the calls' buffers must outlive them).
pub(super) fn measure(
    tp: &TensorParallel,
    todo: &[usize],
    call: impl Fn(usize, Schedule) -> Result<()>,
) -> Result<Vec<i32>> {
    const WAYS: [Schedule; 2] = [Schedule::Sequential, Schedule::Fused];
    let stream = tp.runtime().stream();
    let mut watch = Stopwatch::new(tp.runtime());
    let enqueued = todo.iter().try_for_each(|&m| {
        let way = |i: usize| call(m, WAYS[i]);
        (0..WAYS.len()).try_for_each(way)?; // warm-up
        watch.rounds(m, WAYS.len(), stream, way)
    });
    stream.synchronize().during("cuStreamSynchronize")?;
    let ms = enqueued.and_then(|()| watch.totals())?;
    Ok((1..=FUSED_DECODE_MAX_TOKENS)
        .map(|m| i32::from(todo.contains(&m) && ms[&(m, 1)] < ms[&(m, 0)]))
        .collect())
}
