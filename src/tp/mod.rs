//! Tensor parallelism: linear layers whose weights are sharded across the PEs, with their
//! local GEMMs through cuBLASLt ([`Gemm`]) and their communication through our collectives.
//!
//! - [`ColumnParallelLinear`]: the weight's output features are sharded; the input is
//!   replicated (no communication) or sharded along the tokens (sequence parallel: an
//!   all-gather, then the GEMM).
//! - [`RowParallelLinear`]: the input features are sharded; the partial products are summed
//!   by an all-reduce, so the output is replicated and bitwise identical on every PE, or by
//!   a reduce-scatter, so each PE gets its share of the tokens (sequence parallel).
//! - [`TpMlp`]: a Llama-style MLP, gate and up projections as one column-parallel GEMM,
//!   `SiLU(gate) * up` in a small kernel, and the row-parallel down projection; and
//!   [`SequenceParallelMlp`], the same MLP with the tokens sharded on the way in and out
//!   (all-gather + GEMM, GEMM + reduce-scatter).
//!
//! Everything is bf16 in and out with f32 accumulation, runs on the stream it is given with
//! no host synchronisation, and can be captured in a CUDA graph. The tensor-parallel group is
//! the world team: every PE builds the same layers in the same order (building one that
//! allocates symmetric memory is collective) and runs the same forward calls, with the same
//! shapes: a PE whose own arguments fail a check returns an error before its collective,
//! while the others wait in theirs. [`CollectivesConfig::check_calls`] makes every PE agree
//! on every call first, and fail together. Weights live in ordinary device memory
//! ([`DeviceBuffer`](crate::DeviceBuffer)); what a collective reads or writes lives in
//! symmetric memory.
//!
//! [`CollectivesConfig::check_calls`]: crate::collectives::CollectivesConfig::check_calls
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::{bf16, tp::{TensorParallel, TpMlp}};
//! let shmem = nvshmem::Nvshmem::init()?;
//! let tp = TensorParallel::new(&shmem)?;
//! let (hidden, ffn, tokens) = (4096, 14336, 128);
//! let mlp = TpMlp::new(&tp, hidden, ffn, tokens)?;
//! # let (gate, up, down) = (vec![bf16::ZERO; ffn * hidden], vec![bf16::ZERO; ffn * hidden], vec![bf16::ZERO; hidden * ffn]);
//! mlp.load_weights(&gate, &up, &down)?; // full weights; each PE keeps its shard
//! let x = shmem.alloc_device::<bf16>(tokens * hidden)?;
//! let y = shmem.malloc::<bf16>(tokens * hidden)?;
//! mlp.forward(&y, &x, shmem.stream())?; // y is the same on every PE
//! # Ok(()) }
//! ```

mod column;
mod cutlass;
mod exchange;
mod gemm;
mod mlp;
mod row;
mod shard;

pub use column::{ColumnInput, ColumnParallelLinear, FUSED_GATHER_TOKENS};
pub use gemm::{
    Gemm, GemmPath, LinearShape, DECODE_MAX_TOKENS, DECODE_TOKENS, TUNED_TOKENS, WORKSPACE_BYTES,
};
pub use mlp::{SequenceParallelMlp, TpMlp};
pub use row::{RowOutput, RowParallelLinear, FUSED_SCATTER_TOKENS};
pub use shard::{merged_rows, shard_range, take_cols, take_rows};

use crate::collectives::{Collectives, FusedRegion};
use crate::cubins::TP;
use crate::error::{Error, Result};
use crate::memory::{DeviceSlice, SymmetricView};
use crate::module::{grid, Function, KernelArgs, LaunchOptions, Module};
use crate::runtime::Nvshmem;
use cudarc::driver::CudaStream;
use half::bf16;
use std::sync::Arc;

/// How a layer orders its GEMM and its communication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// Chosen for each call by the group's [`ScheduleThresholds`]: [`Fused`](Self::Fused)
    /// where it measured faster, [`Overlapped`](Self::Overlapped) in sequence parallelism
    /// just below that, [`Sequential`](Self::Sequential) elsewhere. What the layers'
    /// `forward` takes. The choice depends only on the call's shape, the thresholds
    /// and the GPU, and is not exchanged: every PE must build its group with the same
    /// thresholds (as it builds the same layers) on the same model of GPU. Where it fuses,
    /// the call has `Fused`'s limits: its waits for the peers have no bound and no call
    /// agreement, so a PE that stops leaves the others waiting (by default that is the
    /// sequence-parallel layers from 2048 tokens per PE of 4096 features, the row-parallel
    /// layer with a replicated output from 1024, and on 2 PEs its decode up to 8 tokens; use
    /// `Sequential` where a bounded failure matters more than the few percent). Where it
    /// overlaps, the group's overlapped calls must be made one at a time, as for
    /// `Overlapped`.
    #[default]
    Auto,
    /// The GEMM, then the collective, on the caller's stream: what a user writes first.
    Sequential,
    /// Communication on a second stream, overlapped with computation. A row-parallel layer
    /// cuts its GEMM into about `chunks` pieces and all-reduces each piece while the next
    /// one computes: along the tokens when each piece still has enough tokens to be
    /// compute-bound (or there are more tokens than its scratch for pieces along the
    /// features holds, 2048), else along the output features (each piece then reads its own rows of
    /// the weight, so small batches read the weight once, and a last kernel puts the pieces'
    /// columns in place). A sequence-parallel column layer multiplies this PE's own tokens
    /// while the all-gather brings the others'. With `chunks` below 2, or too few tokens or
    /// features to cut, a layer runs sequentially. The caller's stream waits for the second
    /// stream before the call returns, so what follows on it sees the whole result, and the
    /// call can be captured in a CUDA graph like a sequential one.
    ///
    /// Cutting costs GEMM efficiency and launches: with one PE on an H100 (no communication
    /// to hide) the 8B MLP's overlapped call took 13 to 78 µs longer than the sequential one
    /// at 1 to 512 tokens, and was within ±3% of it at 2048 tokens and more. So it pays only
    /// where the collective takes longer than that (prefill); for decode, use `Sequential`.
    /// The layers of one [`TensorParallel`] share that second stream: make their overlapped
    /// calls one at a time (from one thread, or in an order every PE keeps anyway).
    Overlapped {
        /// Pieces of the row-parallel GEMM.
        chunks: usize,
    },
    /// The GEMM and its communication fused, where the crate has a fused form for the call,
    /// and [`Sequential`](Self::Sequential) elsewhere. There are four.
    ///
    /// The sequence-parallel [`ColumnParallelLinear`] (all-gather + GEMM) with several PEs,
    /// from [`FUSED_SCATTER_TOKENS`] tokens per PE: each PE's tokens go to every peer by the
    /// copy engines, with no SM involved, each chunk raising a flag when it lands; the GEMM
    /// of this PE's own rows runs while the others travel, then a GEMM per peer's rows, each
    /// after that peer's flag. From
    /// [`ScheduleThresholds::fused_gather_cutlass_min_tokens`] (never, by default) and
    /// [`FUSED_GATHER_TOKENS`] tokens, on GPUs that run our CUTLASS GEMM (input features and
    /// every PE's output features multiples of 8), one CUTLASS GEMM instead, which starts on
    /// this PE's own rows and whose tiles each wait for their chunk's flag before their
    /// first TMA load (a PE whose output TMA cannot address waits for every chunk, then
    /// multiplies as [`GemmPath::Auto`] chooses). It needs a GPU with 64-bit stream memory
    /// operations (every GPU of compute capability 7.0 and later under a CUDA 12 driver).
    ///
    /// The row-parallel layer with a sequence-parallel output (GEMM + reduce-scatter) with
    /// several PEs, from 512 tokens per PE (below, each peer's GEMM, which reads the whole
    /// weight, would be bound by that read), in rounds
    /// ([`ScheduleThresholds::fused_exchange_gemms`]): in each round, the GEMM of each
    /// peer's rows of the round (the next PE's first), whose partial products a copy engine
    /// takes into that peer's memory while the next GEMM computes, a flag following; this
    /// PE's own rows last; then, on a second stream while the next round's GEMMs compute,
    /// a small kernel sums the PEs' products for this PE's rows of the round in PE order
    /// (the numbers the sequential reduce-scatter gives for the same partial products).
    /// The GEMMs store locally: one that stores into a peer's memory runs 20-30% slower.
    /// Same GPU requirement.
    ///
    /// The row-parallel layer with a replicated output (GEMM + all-reduce) with several PEs,
    /// from [`FUSED_SCATTER_TOKENS`] tokens per PE and for tokens that the PEs share
    /// equally: the same exchange, and with each round's sums the copy engines bring this
    /// PE's rows of the sum to every peer's output, a flag each, while the next round's
    /// GEMMs compute (an all-reduce is a reduce-scatter and an all-gather: both halves
    /// travel beside the GEMMs); the last round, which nothing computes beside, is one GEMM
    /// of its tokens and our all-reduce of it. The output is the same on every PE, bit for
    /// bit. The layer keeps the buffers for it (its partial
    /// products' size again) where it takes `n_pes × FUSED_SCATTER_TOKENS` tokens or more.
    /// In a [`TpMlp`] the rounds carry the whole MLP (each round's tokens through the gate
    /// and up projection, the activation and the down projection), so that a round's
    /// exchange travels beside the next round's three GEMMs
    /// ([`ScheduleThresholds::fused_mlp_rounds`]).
    ///
    /// Both exchanges need no SM for their signals (stream memory operations; the copies are
    /// peer `cuMemcpyAsync`s, which the driver gives to the copy engines), write only
    /// constants (graph replays are safe), and let a PE write into a peer's buffer only once
    /// that peer has started the same call, so after whatever read the buffer before (a
    /// credit per pair of PEs, given as each call opens). Whether a call fuses is decided
    /// alike on every PE from the call's shape and the GPU, which must be the same model on
    /// every PE. PEs that share a GPU (CUDA MPS) must each be held to their share of its
    /// SMs (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, as `scripts/nvshmrun --share-gpus` sets it):
    /// a waiting GEMM holds the SMs it has, and a peer's copy waits for the kernels before it
    /// on that peer's stream. Unlike our collectives they have no bounded wait
    /// ([`CollectivesConfig::timeout`](crate::collectives::CollectivesConfig)) and no call
    /// agreement: a PE that never makes the matching call leaves its peers waiting.
    ///
    /// The row-parallel layer with a replicated output at up to [`DECODE_MAX_TOKENS`] tokens
    /// (decode, GEMM + all-reduce): our decode GEMM, whose blocks send each finished task's
    /// sums, rounded to bf16, straight to every peer, and at the end add their tasks'
    /// features over the PEs in PE order, in the same kernel (kernels/tp/decode_allreduce.cuh).
    /// Up to 16 PEs, where the output's rows are whole lines of 4 features
    /// (`out_features` a multiple of 4), the sums travel as our collectives' low-latency
    /// lines, data and the call's tag together: no fence and no flag. Otherwise they go
    /// through the staging slots, with a flag handshake per block. No partial product goes
    /// through memory of its own and no kernel boundary separates the GEMM from the
    /// exchange. The result is the same on every PE, bit for bit, and the same as
    /// `Sequential`'s wherever that one's GEMM is the same decode kernel (up to
    /// [`DECODE_TOKENS`] tokens, where [`GemmPath::Auto`] takes it: see
    /// [`Gemm::set_auto_path`] to fix that). It needs `tokens × out_features` bf16 of each
    /// lines slot or, in the flagged form, of each staging slot
    /// ([`CollectivesConfig::workspace`]; the default staging slot holds 1 Mi elements), and
    /// falls back to `Sequential` where they do not fit.
    ///
    /// [`Auto`](Self::Auto) takes it up to
    /// [`ScheduleThresholds::fused_decode_max_tokens`] (on 2 PEs; not on 4 H200s, where it
    /// measured slower), where it measured faster on every PE when the layer's weight was
    /// loaded ([`RowParallelLinear::load_weight`]).
    ///
    /// [`CollectivesConfig::workspace`]: crate::collectives::CollectivesConfig::workspace
    Fused,
}

/// Where [`Schedule::Auto`] fuses or overlaps a layer's GEMM with its communication. The
/// defaults come from `bench --tests tp` and `tp_mlp` on 2 and 4 H200s (NVSwitch, one PE per
/// GPU; docs/gemm.md); measure on your GPUs and set your own with
/// [`TensorParallel::with_thresholds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleThresholds {
    /// Elements per PE of the exchanged rows (tokens per PE × the rows' width: a
    /// [`ColumnParallelLinear`]'s input features, a [`RowParallelLinear`]'s output
    /// features) from which the sequence-parallel layers fuse their exchanges (the
    /// all-gather + GEMM of a column-parallel layer with a sequence-parallel input and the
    /// GEMM + reduce-scatter of a row-parallel layer with a sequence-parallel output). The
    /// exchange grows with the width, the GEMMs with the width and the FFN features, so a
    /// wider model fuses from fewer tokens. On 2 PEs 4 Mi elements, 1024 tokens per PE for
    /// the 8B MLP (hidden 4096) and 512 for the 70B one (hidden 8192); on more PEs
    /// ([`for_pes`](Self::for_pes)) 8 Mi, 2048 and 1024. Measured with `bench --tests tp
    /// --tp-layouts sequence` (the all-gather + GEMM by a GEMM per PE's rows), µs
    /// sequential / overlapped / fused: on 2 H200s the 8B MLP at 1024 tokens per PE 642.0 /
    /// 631.3 / 615.2, the 70B MLP at 512 1187 / 1173 / 1156; on 2 H100s 652.5 / 635.7 / 625.4
    /// and 1198 / 1169 / 1157 (fused the fastest at 4 of 6 such points in three runs there,
    /// and 1.3-2.2% ahead of overlapped in earlier runs); the 8B MLP at 512 tokens per PE
    /// 319.0 / 342.6 / 351.5 on 2 H200s. On 4 H200s the fused MLPs were the fastest schedule
    /// from 2048 tokens per PE (the 8B MLP 13.3% over compute-only against 32.8% for the
    /// best other schedule, the 70B one 4.2% against 10.7%); at 1024 tokens per PE the 70B
    /// MLP was 5.7-6.1% faster fused than sequential, the 8B MLP 0.5-1.4% slower.
    pub fused_sequence_min_elements: usize,
    /// Elements per PE of the exchanged rows (as
    /// [`fused_sequence_min_elements`](Self::fused_sequence_min_elements)) from which the
    /// sequence-parallel layers, below the fused threshold, take [`Schedule::Overlapped`]
    /// (4 chunks: the column-parallel layer multiplies this PE's own tokens while the
    /// all-gather brings the others'; the reduce-scatter stays sequential); `usize::MAX`:
    /// never. 4 Mi elements, 1024 tokens per PE for the 8B MLP and 512 for the 70B one: on 2
    /// PEs the fused threshold, so that they are never overlapped there (fused was faster
    /// from there, overlapped slower than sequential below). Measured with `bench --tests tp
    /// --tp-layouts sequence`, sequential against overlapped µs: the 8B MLP at 1024 tokens
    /// per PE 745.3 / 712.8 and 716.2 / 690.4 on 4 H200s, 738.7 / 719.6 on 4 H100s; the 70B
    /// MLP at 512 tokens per PE 1280 / 1248 on 4 H100s. At 512 tokens per PE the 8B MLP was
    /// 13% (4 H100s), 5.5% (2 H100s) and 7.4% (2 H200s) slower overlapped.
    pub overlapped_sequence_min_elements: usize,
    /// Tokens up to which a row-parallel layer with a replicated output fuses its decode
    /// GEMM with the all-reduce; 0: never. Only where every PE's [`Gemm::calibrate`] took our
    /// decode kernel for the layer's GEMM at that token count when its weight was loaded
    /// ([`RowParallelLinear::load_weight`]): the fused kernel multiplies with it, and where
    /// cuBLASLt is faster the GEMM loses more than the all-reduce saves (the 70B MLP's down
    /// projection from 4 tokens on an H200: 2-3 µs). And only where the fused kernel then
    /// measured faster than that GEMM and the all-reduce in turn, on every PE: on 2 H100s
    /// the 8B MLP fused took 70.5, 70.9, 71.0, 72.4 and 77.3 µs at 1, 2, 4, 8 and 16 tokens
    /// against 70.2, 70.0, 71.0, 71.5 and 76.0 sequential (`tp_mlp --test mlp`). Measured on
    /// 2 H200s with the fused kernel on low-latency lines (docs/gemm.md), three machines,
    /// before that measurement at load time: the 8B MLP fused took
    /// 51.7, 53.0 and 54.0 µs at 1, 4 and 8 tokens against 53.6, 54.4 and 55.6 sequential;
    /// 53.1, 53.8 and 53.7 against 53.0, 54.5 and 55.2; 51.3, 53.0 and 53.6 against 53.1,
    /// 54.8 and 55.1; and 56.8-57.2 against 56.7-57.0 at 16. On more than 2 PEs never
    /// ([`for_pes`](Self::for_pes)): on 4 H200s (`bench --tests tp --tp-layouts
    /// replicated`, three runs) the 8B MLP fused took 31.2-31.4, 31.5, 31.7-31.8 and
    /// 34.2-34.9 µs at 1, 2, 4 and 8 tokens against 30.5-31.0, 30.8, 31.2-31.6 and 31.7-32.0
    /// sequential, whose down projection is the same decode kernel (not profiled); on 4
    /// H100s 37.9, 38.2, 38.6 and 39.6 against 38.1, 38.2, 38.5 and 38.9 (one run).
    pub fused_decode_max_tokens: usize,
    /// Elements per PE of the output (tokens per PE × the layer's output features) from
    /// which a row-parallel layer with a replicated output fuses its GEMM with the
    /// all-reduce; `usize::MAX`: never. 4 Mi elements are 1024 tokens per PE for the 8B MLP
    /// (hidden 4096) and 512 for the 70B one (hidden 8192). Below 1024 tokens per PE the
    /// fused layer is one round, which is the sequential schedule's work (the GEMM and our
    /// all-reduce). Since the last round is all-reduced, the 8B MLP at 1024 tokens per PE
    /// took 654-660 µs fused against 691-720 sequential on 4 H200s (three runs, `tp_mlp
    /// --test mlp` and `bench --tests tp`) and 607-616 against 603-622 on 2; at 2048 tokens
    /// per PE on 2 H200s fused was 3% faster (1175 against 1210 µs) and 6% at 4096. With
    /// `bench --tests tp` at 1024 tokens per PE the 70B MLP was 1.7-1.9% faster fused on 2
    /// H200s and 3.7-4.3% on 4 (two and three runs).
    pub fused_replicated_min_elements: usize,
    /// GEMMs of the fused GEMM + reduce-scatter and GEMM + all-reduce (a row-parallel layer
    /// with a sequence-parallel or a replicated output, [`Schedule::Fused`] from
    /// [`FUSED_SCATTER_TOKENS`] tokens per PE): each PE's share of the tokens is cut into
    /// this many over the PE count rounds (one at least, fewer where a round would have
    /// fewer than 512 tokens per PE), and each round makes a GEMM for each PE's rows of it
    /// (with a replicated output one GEMM of the round's tokens, and the last round is
    /// all-reduced). While one round's partial products and sums travel, the next round's
    /// GEMMs compute:
    /// more rounds leave less of the exchange after the last GEMM, and make smaller GEMMs
    /// and more copies. Measured with the 8B MLP, replicated output (`tp_mlp --test mlp
    /// --rounds N`), over compute-only at 2048 / 4096 tokens per PE: on 2 H200s 4 rounds
    /// 9.1% / 5.4%, 2 rounds 10.8% / 6.8%, 8 rounds 9.5% / 5.5%; on 4 H200s 2 rounds 29.6%
    /// / 20.7%, 4 rounds 37.9% / 27.5%, one round 27.6% / 23.8% (there the copies take about
    /// as long as the GEMMs, and each round adds its own).
    pub fused_exchange_gemms: usize,
    /// Rounds of a [`TpMlp`]'s fused GEMM + all-reduce, whose rounds also carry the gate
    /// and up projection and the activation of their tokens (at least the rounds of
    /// [`fused_exchange_gemms`](Self::fused_exchange_gemms); fewer where a round would
    /// have fewer than 512 tokens per PE): there a round's exchange travels beside the next
    /// round's three GEMMs, so more rounds pay off than for a layer alone, and with the last
    /// round all-reduced, the more rounds the less follows the last GEMM. Measured with
    /// `tp_mlp --test mlp --rounds N`, fused µs: on 4 H200s at 4096 tokens per PE (two runs
    /// each) the 8B MLP 2358 / 2362 in 4 rounds against 2309 / 2304 in 8, the 70B MLP 9416
    /// / 9362 against 9337 / 9332; on 2 H200s at 8192 tokens per PE the 8B MLP 4683 (4
    /// rounds), 4664 (8) and 4709 (16), the 70B MLP 18091 (4) against 18164 (8), and at 4096
    /// tokens per PE 8971 against 9028 (one run each). Up to 2048 tokens per PE 8 rounds
    /// and 4 are the same rounds (512 tokens per PE each, or fewer rounds).
    pub fused_mlp_rounds: usize,
    /// Tokens from which the fused all-gather + GEMM of a sequence-parallel
    /// [`ColumnParallelLinear`] multiplies with our CUTLASS kernel, whose tiles each wait for
    /// their rows (from [`FUSED_GATHER_TOKENS`], where the kernel takes the shard), rather
    /// than with a cuBLASLt GEMM per PE's rows, each after that PE's rows have landed;
    /// `usize::MAX` (the default): never. Measured on 2 H200s (`bench --tests tp
    /// --tp-layouts sequence`), the sequence-parallel MLP fused with the CUTLASS kernel
    /// against the GEMM per PE's rows at 2048 / 4096 / 8192 / 16384 tokens: 8B 702.2 /
    /// 1235 / 2415 / 4731 µs against 625.6 / 1218 / 2322 / 4635, 70B 2411 / 4594 / 9248 /
    /// 18324 against 2280 / 4549 / 9077 / 17947.
    pub fused_gather_cutlass_min_tokens: usize,
}

/// The thresholds of 2 PEs ([`ScheduleThresholds::for_pes`]).
impl Default for ScheduleThresholds {
    fn default() -> Self {
        ScheduleThresholds {
            fused_sequence_min_elements: MIN_ELEMENTS,
            overlapped_sequence_min_elements: MIN_ELEMENTS,
            fused_decode_max_tokens: 8,
            fused_replicated_min_elements: MIN_ELEMENTS,
            fused_exchange_gemms: 8,
            fused_mlp_rounds: 8,
            fused_gather_cutlass_min_tokens: usize::MAX,
        }
    }
}

/// 1024 tokens per PE of 4096 features: where 2 PEs fuse every exchange (sequence-parallel
/// and replicated) and more PEs fuse the replicated one and overlap the sequence-parallel
/// ones (they fuse those from twice as many).
const MIN_ELEMENTS: usize = 4 << 20;

/// The chunks of the [`Schedule::Overlapped`] that [`Schedule::Auto`] takes (those measured).
pub const AUTO_OVERLAP_CHUNKS: usize = 4;

impl ScheduleThresholds {
    /// The thresholds measured for a group of `n_pes` PEs, which [`TensorParallel::new`]
    /// takes: the [`Default`] ones, but on more than 2 PEs no fused decode
    /// ([`fused_decode_max_tokens`](Self::fused_decode_max_tokens) 0) and sequence-parallel
    /// exchanges fused from twice the elements
    /// ([`fused_sequence_min_elements`](Self::fused_sequence_min_elements)), overlapped
    /// below.
    ///
    /// ```
    /// use nvshmem::tp::{Schedule, ScheduleThresholds};
    /// let two = ScheduleThresholds::for_pes(2);
    /// assert_eq!(two, ScheduleThresholds::default());
    /// assert_eq!(two.replicated(Schedule::Auto, 1, 2, 4096), Schedule::Fused);
    /// let four = ScheduleThresholds::for_pes(4);
    /// assert_eq!(four.replicated(Schedule::Auto, 1, 4, 4096), Schedule::Sequential);
    /// // 1024 tokens per PE of the 8B MLP's 4096 features.
    /// assert_eq!(two.sequence(Schedule::Auto, 1024, 4096), Schedule::Fused);
    /// assert!(matches!(four.sequence(Schedule::Auto, 1024, 4096), Schedule::Overlapped { .. }));
    /// ```
    pub fn for_pes(n_pes: usize) -> Self {
        let two = ScheduleThresholds::default();
        match n_pes {
            0..=2 => two,
            _ => ScheduleThresholds {
                fused_sequence_min_elements: 2 * MIN_ELEMENTS,
                fused_decode_max_tokens: 0,
                ..two
            },
        }
    }

    /// What `schedule` means for a sequence-parallel exchange of `tokens_per_pe` tokens
    /// per PE, rows of `width` elements: [`Schedule::Auto`] resolved (fused, overlapped or
    /// sequential), any other schedule as it is.
    pub fn sequence(&self, schedule: Schedule, tokens_per_pe: usize, width: usize) -> Schedule {
        match schedule {
            Schedule::Auto
                if tokens_per_pe.saturating_mul(width) >= self.fused_sequence_min_elements =>
            {
                Schedule::Fused
            }
            Schedule::Auto
                if tokens_per_pe.saturating_mul(width) >= self.overlapped_sequence_min_elements =>
            {
                Schedule::Overlapped {
                    chunks: AUTO_OVERLAP_CHUNKS,
                }
            }
            Schedule::Auto => Schedule::Sequential,
            other => other,
        }
    }

    /// What `schedule` means for a row-parallel layer with a replicated output of `width`
    /// features, at `tokens` tokens over `n_pes` PEs.
    pub fn replicated(
        &self,
        schedule: Schedule,
        tokens: usize,
        n_pes: usize,
        width: usize,
    ) -> Schedule {
        let per_pe = (tokens / n_pes.max(1)).saturating_mul(width);
        match schedule {
            Schedule::Auto if tokens <= self.fused_decode_max_tokens => Schedule::Fused,
            Schedule::Auto if per_pe >= self.fused_replicated_min_elements => Schedule::Fused,
            Schedule::Auto => Schedule::Sequential,
            other => other,
        }
    }
}

/// What every layer of one tensor-parallel group shares: the runtime, the collectives, the
/// cuBLASLt handle and the element-wise kernels. Cheap to clone.
///
/// The GEMMs of a group share one cuBLASLt workspace: run layers of one group on streams
/// that may overlap each other only through its own schedules; give concurrent work its
/// own group.
#[derive(Clone)]
pub struct TensorParallel {
    inner: Arc<Inner>,
    thresholds: ScheduleThresholds,
}

struct Inner {
    shmem: Nvshmem,
    collectives: Arc<Collectives>,
    gemm: Gemm,
    silu_mul: Function,
    unchunk: Function,
    sum_slabs: Function,
    /// The row-parallel decode GEMM fused with its all-reduce, through the staging slots
    /// and through the low-latency lines, and their grid: the same on every PE (0 blocks
    /// where they do not fit).
    decode_allreduce: [Function; 2],
    decode_allreduce_lines: [Function; 2],
    fused_blocks: u32,
    sms: u32,
    /// Where overlapped schedules communicate.
    side: Arc<CudaStream>,
    /// The fused exchanges' copy stream (exchange.rs), where the GPU takes the stream
    /// memory operations they signal with.
    pusher: Option<Arc<CudaStream>>,
}

impl TensorParallel {
    /// A group over every PE with a new [`Collectives`] of the default configuration
    /// (collective).
    pub fn new(shmem: &Nvshmem) -> Result<Self> {
        Self::with_collectives(shmem, Arc::new(Collectives::new(shmem)?))
    }

    /// A group over every PE that communicates through `collectives` (which other code may
    /// share: its calls are ordered by stream as usual).
    pub fn with_collectives(shmem: &Nvshmem, collectives: Arc<Collectives>) -> Result<Self> {
        let module = Module::load(shmem, &TP)?;
        let gemm = Gemm::with_module(shmem, &module)?;
        let silu_mul = module.function("silu_mul_bf16")?;
        let unchunk = module.function("unchunk_bf16")?;
        let sum_slabs = module.function("sum_slabs_bf16")?;
        // Up to 8 tokens, and 9 to 16.
        let decode_allreduce = [
            module.function("decode_linear_allreduce_bf16")?,
            module.function("decode_linear16_allreduce_bf16")?,
        ];
        let decode_allreduce_lines = [
            module.function("decode_linear_allreduce_lines_bf16")?,
            module.function("decode_linear16_allreduce_lines_bf16")?,
        ];
        let sms = shmem.sm_count()?;
        // Blocks pair up with the same block of every peer: the grid comes from the SM
        // count every PE agreed on, and the kernels' occupancy (the same binary everywhere).
        let per_sm = decode_allreduce
            .iter()
            .chain(&decode_allreduce_lines)
            .map(|f| f.max_resident_blocks(FUSED_THREADS, 0))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .min()
            .unwrap_or(0)
            / sms.max(1);
        let fused_blocks = (collectives.sm_count() as u32 * per_sm.min(FUSED_BLOCKS_PER_SM))
            .min(crate::abi::COLL_MAX_BLOCKS);
        let pusher = match exchange::stream_memops(shmem)? {
            true => Some(shmem.new_stream()?),
            false => None,
        };
        Ok(TensorParallel {
            inner: Arc::new(Inner {
                side: shmem.new_stream()?,
                pusher,
                shmem: shmem.clone(),
                collectives,
                gemm,
                silu_mul,
                unchunk,
                sum_slabs,
                decode_allreduce,
                decode_allreduce_lines,
                fused_blocks,
                sms,
            }),
            thresholds: ScheduleThresholds::for_pes(shmem.n_pes()),
        })
    }

    /// This group with `thresholds` for [`Schedule::Auto`]. Layers take the thresholds of
    /// the group they are built from; every PE must set the same.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::tp::{ScheduleThresholds, TensorParallel};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let tp = TensorParallel::new(&shmem)?.with_thresholds(ScheduleThresholds {
    ///     fused_sequence_min_elements: 2048 * 4096,
    ///     ..ScheduleThresholds::for_pes(shmem.n_pes())
    /// });
    /// # Ok(()) }
    /// ```
    pub fn with_thresholds(mut self, thresholds: ScheduleThresholds) -> Self {
        self.thresholds = thresholds;
        self
    }

    /// The thresholds of [`Schedule::Auto`].
    pub fn thresholds(&self) -> &ScheduleThresholds {
        &self.thresholds
    }

    /// The runtime.
    pub fn runtime(&self) -> &Nvshmem {
        &self.inner.shmem
    }

    /// The collectives the layers communicate through.
    pub fn collectives(&self) -> &Collectives {
        &self.inner.collectives
    }

    /// The cuBLASLt GEMMs the layers compute with.
    pub fn gemm(&self) -> &Gemm {
        &self.inner.gemm
    }

    /// The stream on which overlapped schedules communicate. Layers of one group take turns
    /// on it: a group's overlapped calls must be made one at a time (as any collective call).
    pub(crate) fn side(&self) -> &Arc<CudaStream> {
        &self.inner.side
    }

    /// The fused exchanges' copy stream, whose copies to the peers run one after another
    /// (next PE first: side by side they shared the links badly, see the collectives'
    /// copy-engine paths); `None` where the GPU lacks 64-bit stream memory operations (the
    /// same on every PE of one node).
    pub(crate) fn pusher(&self) -> Option<&Arc<CudaStream>> {
        self.inner.pusher.as_ref()
    }

    /// Whether the fused exchanges (exchange.rs) can run: the GPU takes 64-bit stream memory
    /// operations.
    pub(crate) fn has_stream_memops(&self) -> bool {
        self.inner.pusher.is_some()
    }

    /// PEs in the group.
    pub fn n_pes(&self) -> usize {
        self.inner.shmem.n_pes()
    }

    /// This PE's place in the group.
    pub fn my_pe(&self) -> usize {
        self.inner.shmem.my_pe()
    }

    /// `out[r][j] = silu(gu[r][j]) * gu[r][f + j]`, in f32 rounded once to bf16: `gu` holds
    /// `tokens` rows of gate features then as many up features (`tokens × 2f`), `out` is
    /// `tokens × f`, both row-major. The kernel between [`TpMlp`]'s GEMMs, for MLPs built
    /// from the parts. It is launched with programmatic stream serialization: it waits for
    /// the kernel before it on `stream` and lets the next one start its launch, so that a
    /// decode GEMM after it ([`GemmPath::Decode`]) starts at once.
    pub fn silu_mul(
        &self,
        out: &impl DeviceSlice<bf16>,
        gu: &impl DeviceSlice<bf16>,
        tokens: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let f = out.len().checked_div(tokens).unwrap_or(0);
        if out.len() != tokens * f || gu.len() != 2 * tokens * f {
            return Err(Error::InvalidArgument(format!(
                "silu_mul of {tokens} tokens: the output has {} elements and the gate/up input \
                 {}; they must be tokens × f and tokens × 2f",
                out.len(),
                gu.len()
            )));
        }
        // SAFETY: the lengths were checked.
        unsafe { self.silu_mul_raw(out.device_ptr(), gu.device_ptr(), tokens, f, stream) }
    }

    /// [`silu_mul`](Self::silu_mul) on addresses.
    ///
    /// # Safety
    /// Both must hold that many elements of this PE's GPU until the kernel has run.
    pub(crate) unsafe fn silu_mul_raw(
        &self,
        out: u64,
        gu: u64,
        m: usize,
        f: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        // As the kernel chooses its path (tp.cu).
        let vectors = f % 8 == 0 && (gu | out) % 16 == 0;
        let work = if vectors { m * f / 8 } else { m * f };
        if work == 0 {
            return Ok(());
        }
        let mut args = KernelArgs::new();
        args.device_ptr(gu)
            .device_ptr(out)
            .value(m as u64)
            .value(f as u64);
        // Programmatic: it waits for the kernel before it, then lets the next one (the down
        // projection's decode GEMM or fused decode kernel) start its launch (kernels/tp.cu).
        let options = LaunchOptions {
            programmatic: true,
            ..LaunchOptions::default()
        };
        self.inner
            .silu_mul
            .launch_with(self.spread(work), options, stream, &mut args)
    }
}

/// Threads of a block of the fused decode kernel, and its blocks per SM (its launch
/// bounds in kernels/tp.cu).
const FUSED_THREADS: u32 = 256;
const FUSED_BLOCKS_PER_SM: u32 = 2;

impl TensorParallel {
    /// Whether [`Schedule::Fused`] has a kernel for a row-parallel product of `tokens` ×
    /// `out_features`: up to [`DECODE_MAX_TOKENS`] tokens, whose partial products fit a
    /// staging slot.
    pub(crate) fn fuses_decode(&self, tokens: usize, out_features: usize) -> bool {
        let staged = tokens * out_features * std::mem::size_of::<bf16>();
        (1..=DECODE_MAX_TOKENS).contains(&tokens)
            && self.inner.fused_blocks > 0
            && staged <= self.inner.collectives.staging_slot_bytes()
    }

    /// `y = Σ over PEs of x · wᵀ` in one kernel (see [`Schedule::Fused`]), for a shape
    /// [`fuses_decode`](Self::fuses_decode) takes.
    ///
    /// # Safety
    /// `x` holds `lin.m × lin.k` and `lin.w` `lin.n × lin.k` elements of this PE's GPU,
    /// and `y` `lin.m × lin.n`, until the kernel has run.
    pub(crate) unsafe fn decode_all_reduce_raw(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        lin: crate::abi::DecodeLinear,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let staged = y.len() * std::mem::size_of::<bf16>();
        // The lines where every PE can take them: the choice depends only on what every PE
        // shares (the shape, the output's symmetric address, the configuration).
        let lines = lin.n % 4 == 0
            && (y.as_ptr() as u64) % 8 == 0
            && self.inner.collectives.fused_lines_fit(staged);
        let (kernels, region) = match lines {
            true => (&self.inner.decode_allreduce_lines, FusedRegion::Lines),
            false => (&self.inner.decode_allreduce, FusedRegion::Staging),
        };
        self.inner.collectives.fused_call(
            &kernels[usize::from(lin.m as usize > gemm::DECODE_SMALL_TOKENS)],
            region,
            y,
            x,
            staged,
            (self.inner.fused_blocks, FUSED_THREADS),
            lin,
            stream,
        )
    }

    /// A grid for `work` independent pieces of 256 threads' work, at most 8 blocks per SM.
    fn spread(&self, work: usize) -> cudarc::driver::LaunchConfig {
        let threads = 256;
        grid(
            work.div_ceil(threads).min(self.inner.sms as usize * 8) as u32,
            threads as u32,
        )
    }

    /// `dst` (`m × n`, row-major) from `src`, the same matrix cut into column pieces of width
    /// `w` stored one after the other, each whole.
    ///
    /// # Safety
    /// Both hold `m × n` elements of this PE's GPU until the kernel has run.
    pub(crate) unsafe fn unchunk_raw(
        &self,
        dst: u64,
        src: u64,
        (m, n, w): (usize, usize, usize),
        stream: &CudaStream,
    ) -> Result<()> {
        if m * n == 0 {
            return Ok(());
        }
        let mut args = KernelArgs::new();
        args.device_ptr(src)
            .device_ptr(dst)
            .value(m as u64)
            .value(n as u64)
            .value(w as u64);
        self.inner
            .unchunk
            .launch(self.spread(m * n), stream, &mut args)
    }
}

impl TensorParallel {
    /// `dst[i] = Σ over s < slabs of slab s's element i` for `i < len`, where slab `s` is
    /// `src + s × stride` except slab `own.0`, which is `own.1` (a PE's own partial product
    /// where its GEMM left it), in f32 in slab order, rounded once to bf16 (as the
    /// reduce-scatter of our collectives sums the PEs' values).
    ///
    /// # Safety
    /// `src` holds `(slabs - 1) × stride + len`, `own.1` and `dst` `len` elements of this
    /// PE's GPU until the kernel has run, with `stride >= len`.
    pub(crate) unsafe fn sum_slabs_raw(
        &self,
        dst: u64,
        (src, own): (u64, (usize, u64)),
        (len, slabs, stride): (usize, usize, usize),
        stream: &CudaStream,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let work = if len % 8 == 0 { len / 8 } else { len };
        let mut args = KernelArgs::new();
        args.device_ptr(src)
            .device_ptr(own.1)
            .device_ptr(dst)
            .value(len as u64)
            .value(slabs as u32)
            .value(stride as u64)
            .value(own.0 as u32);
        self.inner
            .sum_slabs
            .launch(self.spread(work), stream, &mut args)
    }
}

/// `waiter` waits, on the device, for what `stream` has enqueued so far.
fn join(waiter: &CudaStream, stream: &CudaStream) -> Result<()> {
    waiter.join(stream).map_err(|source| Error::Cuda {
        call: "cuStreamWaitEvent",
        source,
    })
}

/// Check that `got` elements are `rows × cols` for some `rows`, and return `rows`.
fn rows_of(what: &str, got: usize, cols: usize) -> Result<usize> {
    if cols == 0 || got % cols != 0 {
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

#[cfg(test)]
mod tests {
    use super::{Schedule, ScheduleThresholds};

    #[test]
    fn auto_fuses_the_sequence_parallel_exchanges_from_the_threshold_on() {
        let t = ScheduleThresholds::for_pes(4);
        let overlapped = Schedule::Overlapped {
            chunks: super::AUTO_OVERLAP_CHUNKS,
        };
        // On more than 2 PEs fused from 2048 tokens per PE of the 8B MLP's width, 1024 of
        // the 70B MLP's; overlapped from half that.
        for (min, width) in [(2048, 4096), (1024, 8192)] {
            assert_eq!(t.sequence(Schedule::Auto, min, width), Schedule::Fused);
            assert_eq!(t.sequence(Schedule::Auto, 4 * min, width), Schedule::Fused);
            assert_eq!(t.sequence(Schedule::Auto, min - 1, width), overlapped);
            assert_eq!(t.sequence(Schedule::Auto, min / 2, width), overlapped);
            assert_eq!(
                t.sequence(Schedule::Auto, min / 2 - 1, width),
                Schedule::Sequential
            );
            assert_eq!(t.sequence(Schedule::Auto, 1, width), Schedule::Sequential);
        }
        // On 2 PEs fused from half as many, never overlapped.
        let two = ScheduleThresholds::for_pes(2);
        for (min, width) in [(1024, 4096), (512, 8192)] {
            assert_eq!(two.sequence(Schedule::Auto, min, width), Schedule::Fused);
            assert_eq!(
                two.sequence(Schedule::Auto, min - 1, width),
                Schedule::Sequential
            );
        }
        // Never overlapped: sequential up to the fused threshold.
        let never = ScheduleThresholds {
            overlapped_sequence_min_elements: usize::MAX,
            ..t
        };
        assert_eq!(
            never.sequence(Schedule::Auto, 2047, 4096),
            Schedule::Sequential
        );
        assert_eq!(never.sequence(Schedule::Auto, 2048, 4096), Schedule::Fused);
        assert_eq!(t.sequence(Schedule::Auto, usize::MAX, 2), Schedule::Fused);
        // A schedule the caller names stays as it is.
        for s in [
            Schedule::Sequential,
            Schedule::Fused,
            Schedule::Overlapped { chunks: 4 },
        ] {
            assert_eq!(t.sequence(s, 1, 4096), s);
            assert_eq!(t.sequence(s, 8192, 4096), s);
            assert_eq!(t.replicated(s, 1, 2, 4096), s);
            assert_eq!(t.replicated(s, 1 << 20, 2, 4096), s);
        }
    }

    #[test]
    fn auto_fuses_decode_only_up_to_its_threshold() {
        // Measured faster on 2 H200s up to 8 tokens (the layer then also asks whether every
        // PE's GEMM is the decode kernel).
        let t = ScheduleThresholds::default();
        assert_eq!(t.fused_decode_max_tokens, 8);
        for tokens in [1, 8] {
            assert_eq!(
                t.replicated(Schedule::Auto, tokens, 2, 4096),
                Schedule::Fused
            );
        }
        for tokens in [9, 16, 2047] {
            assert_eq!(
                t.replicated(Schedule::Auto, tokens, 2, 4096),
                Schedule::Sequential
            );
        }
        let t = ScheduleThresholds {
            fused_decode_max_tokens: 0,
            ..t
        };
        assert_eq!(
            t.replicated(Schedule::Auto, 1, 2, 4096),
            Schedule::Sequential
        );
        let t = ScheduleThresholds {
            fused_decode_max_tokens: 4,
            ..t
        };
        assert_eq!(t.replicated(Schedule::Auto, 1, 2, 4096), Schedule::Fused);
        assert_eq!(t.replicated(Schedule::Auto, 4, 2, 4096), Schedule::Fused);
        assert_eq!(
            t.replicated(Schedule::Auto, 5, 2, 4096),
            Schedule::Sequential
        );
        assert_eq!(Schedule::default(), Schedule::Auto);
    }

    #[test]
    fn two_pes_fuse_decode_and_fuse_sequence_parallelism_sooner() {
        // Fused decode measured slower than sequential at 1 to 8 tokens on 4 H200s; the
        // sequence-parallel MLPs fused faster than overlapped from 4 Mi elements per PE on 2
        // PEs, from 8 Mi on 4. Every other threshold is the same for any PE count.
        for n in [1, 2] {
            assert_eq!(
                ScheduleThresholds::for_pes(n),
                ScheduleThresholds::default()
            );
        }
        let two = ScheduleThresholds::default();
        for n in [3, 4, 8] {
            let t = ScheduleThresholds::for_pes(n);
            assert_eq!(
                t,
                ScheduleThresholds {
                    fused_decode_max_tokens: 0,
                    fused_sequence_min_elements: 2 * two.fused_sequence_min_elements,
                    ..two
                }
            );
            for tokens in [1, 8] {
                assert_eq!(
                    t.replicated(Schedule::Auto, tokens, n, 4096),
                    Schedule::Sequential
                );
            }
            assert_eq!(
                t.replicated(Schedule::Auto, 1024 * n, n, 4096),
                Schedule::Fused
            );
        }
    }

    #[test]
    fn auto_fuses_a_replicated_prefill_by_elements_per_pe() {
        use Schedule::{Fused, Sequential};
        let default = ScheduleThresholds::default();
        let raised = ScheduleThresholds {
            fused_replicated_min_elements: 4096 * 4096,
            ..default
        };
        // (thresholds, tokens, PEs, width, what Auto takes)
        let cases = [
            // The 8B MLP's width: from 1024 tokens per PE.
            (default, 2048, 2, 4096, Fused),
            (default, 4096, 4, 4096, Fused),
            (default, 2046, 2, 4096, Sequential),
            (default, 4092, 4, 4096, Sequential),
            // The 70B MLP's width: from 512 tokens per PE.
            (default, 1024, 2, 8192, Fused),
            (default, 2048, 4, 8192, Fused),
            (default, 1022, 2, 8192, Sequential),
            // A raised threshold: from 4096 tokens per PE of the 8B MLP.
            (raised, 8192, 2, 4096, Fused),
            (raised, 16384, 4, 4096, Fused),
            (raised, 8190, 2, 4096, Sequential),
            (raised, 8192, 4, 4096, Sequential),
            // One PE: its tokens are its own.
            (raised, 4096, 1, 4096, Fused),
            (raised, 4096, 0, 4096, Fused),
        ];
        for (t, tokens, n, width, want) in cases {
            assert_eq!(
                t.replicated(Schedule::Auto, tokens, n, width),
                want,
                "{tokens} tokens on {n} PEs, width {width}"
            );
        }
    }
}
