//! Tensor parallelism: linear layers whose weights are sharded across the PEs, with their
//! local GEMMs through cuBLASLt or our decode kernel ([`Gemm`]) and their communication
//! through our collectives.
//!
//! - [`ColumnParallelLinear`]: the weight's output features are sharded; the input is
//!   replicated (no communication) or sharded along the tokens (sequence parallel: an
//!   all-gather, then the GEMM).
//! - [`RowParallelLinear`]: the input features are sharded; the partial products are summed
//!   by an all-reduce, so the output is replicated and bitwise identical on every PE, or by
//!   a reduce-scatter, so each PE gets its share of the tokens (sequence parallel).
//! - [`TpMlp`]: a Llama-style MLP, gate and up projections as one column-parallel GEMM,
//!   `SiLU(gate) * up` in a small kernel, and the row-parallel down projection; and
//!   [`SequenceParallelMlp`], the same MLP with the tokens sharded on the way in and out.
//!
//! Each call runs in a [`Schedule`]: sequential, overlapped or fused, chosen per call by
//! [`Schedule::Auto`] from the group's [`ScheduleThresholds`] (module `schedule` holds that
//! one decision). Everything is bf16 in and out with f32 accumulation, runs on the stream it
//! is given with no host synchronisation, and can be captured in a CUDA graph.
//!
//! The tensor-parallel group is the world team, or a team ([`TensorParallel::with_team`]):
//! every PE builds the same layers in the same order (building one that allocates symmetric
//! memory is collective) and makes the same calls with the same shapes. The layers' backward
//! passes (`backward`) and the kernels between them
//! ([`TensorParallel::silu_mul_backward`], [`TensorParallel::rmsnorm_backward`]) serve
//! training. A PE whose own arguments fail a check returns an
//! error before its collective, while the others wait in theirs;
//! [`CollectivesConfig::check_calls`] makes every PE agree on every call first, and fail
//! together. Weights live in ordinary device memory ([`DeviceBuffer`](crate::DeviceBuffer));
//! what a collective reads or writes lives in symmetric memory.
//!
//! [`CollectivesConfig::check_calls`]: crate::collectives::CollectivesConfig::check_calls
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::{bf16, tp::{MlpShape, TensorParallel, TpMlp}};
//! let shmem = nvshmem::Nvshmem::init()?;
//! let tp = TensorParallel::new(&shmem)?;
//! let (hidden, ffn, tokens) = (4096, 14336, 128);
//! let mlp = TpMlp::new(&tp, MlpShape { hidden, ffn, max_tokens: tokens })?;
//! # let (gate, up, down) = (vec![bf16::ZERO; ffn * hidden], vec![bf16::ZERO; ffn * hidden], vec![bf16::ZERO; hidden * ffn]);
//! mlp.load_weights(&gate, &up, &down)?; // full weights; each PE keeps its shard
//! let x = shmem.alloc_device::<bf16>(tokens * hidden)?;
//! let y = shmem.malloc::<bf16>(tokens * hidden)?;
//! mlp.forward(&y, &x, shmem.stream())?; // y is the same on every PE
//! # Ok(()) }
//! ```

mod column;
mod decode;
mod exchange;
mod gemm;
mod group;
mod mlp;
mod norm;
mod row;
mod schedule;
mod shard;
mod train;

pub use column::{ColumnInput, ColumnParallelLinear};
pub use decode::FUSED_DECODE_MAX_TOKENS;
pub use exchange::FUSED_EXCHANGE_TOKENS;
pub use gemm::{Gemm, GemmPath, LinearShape, DECODE_MAX_TOKENS, TUNED_TOKENS, WORKSPACE_BYTES};
pub use group::{kernel_names, TensorParallel};
pub use mlp::{MlpShape, SequenceParallelMlp, TpMlp};
pub use row::{RowOutput, RowParallelLinear};
pub use schedule::{Schedule, ScheduleThresholds};
pub use shard::{merged_rows, shard_range, take_cols, take_rows};

use crate::error::{Error, Result};

pub(crate) use crate::order::join;

/// Check that `got` elements are `rows × cols` for some `rows`, and return `rows`.
fn rows_of(what: &str, got: usize, cols: usize) -> Result<usize> {
    if cols == 0 || !got.is_multiple_of(cols) {
        return Err(Error::InvalidArgument(format!(
            "{what} has {got} elements, not a whole number of rows of {cols}"
        )));
    }
    Ok(got / cols)
}

/// Check `tokens` against a layer's `max_tokens`.
fn check_tokens(what: &str, tokens: usize, max_tokens: usize) -> Result<()> {
    if tokens > max_tokens {
        return Err(Error::InvalidArgument(format!(
            "{what}: {tokens} tokens, more than the {max_tokens} the layer was built for \
             (its max_tokens)"
        )));
    }
    Ok(())
}

/// Check a full weight's length against `rows × cols`.
fn check_weight(what: &'static str, got: usize, rows: usize, cols: usize) -> Result<()> {
    if got != rows * cols {
        return Err(Error::Length {
            what,
            expected: rows * cols,
            got,
        });
    }
    Ok(())
}
