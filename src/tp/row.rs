//! The row-parallel linear layer: each PE holds some of the input features, and the partial
//! products are summed across the PEs.

use super::decode::{self, FUSED_DECODE_MAX_TOKENS};
use super::exchange::{peer_bases, produce_rows, ChunkFlags, Produce, RoundsCall};
use super::gemm::Operands;
use super::schedule::{row_path, Facts, RowPath};
use super::{check_tokens, check_weight, rows_of, shard_range, take_cols, LinearShape};
use super::{GemmPath, Schedule, TensorParallel, FUSED_EXCHANGE_TOKENS};
use crate::abi::DecodeLinear;
use crate::collectives::{AllReduceAlgo, ReduceScatterAlgo};
use crate::element::ReduceOp;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceMemory, SymmetricBuffer, SymmetricView};
use cudarc::driver::CudaStream;
use half::bf16;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

const BF16: usize = std::mem::size_of::<bf16>();

/// `y = x · wᵀ` with the weight's input features (its columns) sharded across the PEs: PE
/// `p` holds input features [`shard_range`]`(in, p, n)` of `x` and of `w`, multiplies them
/// into a partial product (rounded to bf16, as a cuBLAS GEMM writes it), and the PEs' partial
/// products are summed in f32, in PE order: by an all-reduce, so that `y` is replicated and
/// bitwise identical on every PE ([`RowOutput::Replicated`]), or by a reduce-scatter, so that
/// each PE gets its share of the tokens ([`RowOutput::SequenceParallel`]).
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::{bf16, tp::{RowParallelLinear, TensorParallel}};
/// let shmem = nvshmem::Nvshmem::init()?;
/// let tp = TensorParallel::new(&shmem)?;
/// let o_proj = RowParallelLinear::new(&tp, 4096, 4096, 128)?;
/// o_proj.load_weight(&vec![bf16::ZERO; 4096 * 4096])?;
/// let x = shmem.alloc_device::<bf16>(128 * o_proj.local_in_features().len())?;
/// let y = shmem.malloc::<bf16>(128 * 4096)?;
/// o_proj.forward(&y, &x, shmem.stream())?;
/// # Ok(()) }
/// ```
pub struct RowParallelLinear {
    tp: TensorParallel,
    output: RowOutput,
    in_features: usize,
    out_features: usize,
    local_in: Range<usize>,
    max_tokens: usize,
    weight: DeviceBuffer<bf16>,
    /// This PE's partial product, which the collective reads.
    partial: SymmetricBuffer<bf16>,
    /// The fused exchange's state (several PEs; with a replicated output, where the layer
    /// takes [`FUSED_EXCHANGE_TOKENS`] tokens per PE).
    exchange: Option<Exchange>,
    /// Bit m - 1: the fused decode kernel measured faster at m tokens on every PE, when the
    /// weight was loaded.
    fused_decode: AtomicU32,
    /// Where the PEs agree (one flag per token count, the minimum over PEs).
    agreed: SymmetricBuffer<i32>,
    /// The output of that measurement (a replicated output's first tokens).
    probe: SymmetricBuffer<bf16>,
}

/// What the fused exchange of a row-parallel layer keeps.
struct Exchange {
    flags: ChunkFlags,
    /// Where every PE's GEMM stores the partial products of this PE's tokens (one slab per
    /// PE, in PE order)...
    _received: SymmetricBuffer<bf16>,
    /// ...and where that buffer lies on every PE.
    bases: Vec<u64>,
}

/// What a [`RowParallelLinear`] leaves in its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowOutput {
    /// Every PE gets every token (an all-reduce): `y` is `tokens × out_features`, the same
    /// bits on every PE.
    #[default]
    Replicated,
    /// Each PE gets an equal share of the tokens, in PE order (a reduce-scatter; sequence
    /// parallelism, the counterpart of [`ColumnInput::SequenceParallel`]): `y` is
    /// `tokens / n_pes × out_features`, and `tokens` must be a multiple of `n_pes`.
    ///
    /// [`ColumnInput::SequenceParallel`]: super::ColumnInput::SequenceParallel
    SequenceParallel,
}

impl RowParallelLinear {
    /// A layer of `in_features → out_features` with a zero weight and a replicated output,
    /// for up to `max_tokens` tokens per call. Allocates symmetric memory for the partial
    /// products, and where the layer can fuse its exchange (several PEs, `max_tokens` of at
    /// least `n_pes ×` [`FUSED_EXCHANGE_TOKENS`]) as much again: collective.
    pub fn new(
        tp: &TensorParallel,
        in_features: usize,
        out_features: usize,
        max_tokens: usize,
    ) -> Result<Self> {
        Self::with_output(
            tp,
            in_features,
            out_features,
            RowOutput::Replicated,
            max_tokens,
        )
    }

    /// [`new`](Self::new) with the output `output` (a sequence-parallel layer always keeps
    /// the fused exchange's buffers).
    pub fn with_output(
        tp: &TensorParallel,
        in_features: usize,
        out_features: usize,
        output: RowOutput,
        max_tokens: usize,
    ) -> Result<Self> {
        let (n, me) = (tp.n_pes(), tp.my_pe());
        if in_features < n || out_features == 0 {
            return Err(Error::InvalidArgument(format!(
                "a row-parallel layer of {in_features} → {out_features} features over {n} PEs: \
                 it needs output features and at least one input feature per PE"
            )));
        }
        let local_in = shard_range(in_features, me, n);
        let shmem = tp.runtime();
        // The collective allocations first: a PE that fails a local one afterwards leaves no
        // other PE waiting in a collective one.
        let partial = shmem.malloc::<bf16>(max_tokens * out_features)?;
        let agreed = shmem.malloc::<i32>(FUSED_DECODE_MAX_TOKENS)?;
        let probe_tokens = match output {
            RowOutput::Replicated => max_tokens.min(FUSED_DECODE_MAX_TOKENS),
            RowOutput::SequenceParallel => 0,
        };
        let probe = shmem.malloc::<bf16>(probe_tokens * out_features)?;
        let fuses = n > 1
            && match output {
                RowOutput::SequenceParallel => true,
                RowOutput::Replicated => max_tokens / n >= FUSED_EXCHANGE_TOKENS,
            };
        let exchange = match fuses {
            true => {
                let received = shmem.malloc::<bf16>(max_tokens * out_features)?;
                let members = tp.collectives().members();
                let bases = peer_bases(&received, members)?;
                Some(Exchange {
                    flags: ChunkFlags::new(shmem, members)?,
                    _received: received,
                    bases,
                })
            }
            false => None,
        };
        let weight = shmem.alloc_device::<bf16>(out_features * local_in.len())?;
        Ok(RowParallelLinear {
            tp: tp.clone(),
            output,
            in_features,
            out_features,
            local_in,
            max_tokens,
            weight,
            partial,
            exchange,
            fused_decode: AtomicU32::new(0),
            agreed,
            probe,
        })
    }

    /// The group the layer belongs to.
    pub(super) fn group(&self) -> &TensorParallel {
        &self.tp
    }

    /// Input features of the whole layer.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// What the layer leaves in its output.
    pub fn output(&self) -> RowOutput {
        self.output
    }

    /// The input features this PE holds: the columns of its `x`.
    pub fn local_in_features(&self) -> Range<usize> {
        self.local_in.clone()
    }

    /// This PE's weight shard, `out_features × local_in_features().len()`, row-major.
    pub fn weight(&self) -> &DeviceBuffer<bf16> {
        &self.weight
    }

    /// Keep this PE's columns of the full weight (`out_features × in_features`, row-major).
    /// Then measures this shard's GEMMs on this GPU ([`Gemm::calibrate`](super::Gemm)), and
    /// where every PE's GEMM is our decode kernel and the thresholds would fuse decode, times
    /// the fused decode kernel against the GEMM and the all-reduce in turn (a few
    /// milliseconds per token count): [`Schedule::Auto`] fuses only where it was faster on
    /// every PE. Collective: every PE calls it.
    pub fn load_weight(&self, full: &[bf16]) -> Result<()> {
        check_weight(
            "the row-parallel weight (out_features × in_features)",
            full.len(),
            self.out_features,
            self.in_features,
        )?;
        // No fusing at decode until this weight is measured, whatever fails below.
        self.fused_decode.store(0, Ordering::Relaxed);
        self.weight
            .copy_from_host(&take_cols(full, self.in_features, self.local_in.clone()))?;
        let k = self.local_in.len();
        // (the measurement's input, before the agreement: a PE without it agrees to none)
        let x = self
            .tp
            .runtime()
            .alloc_device::<bf16>(FUSED_DECODE_MAX_TOKENS.min(self.max_tokens) * k);
        let calibrated =
            self.tp
                .gemm()
                .calibrate(&self.weight, self.out_features, k, self.max_tokens);
        // Where every PE's GEMM is our decode kernel (a PE whose calibration failed takes
        // part with none, then reports its error).
        let mine: Vec<i32> = (1..=FUSED_DECODE_MAX_TOKENS)
            .map(|m| {
                let shape = LinearShape {
                    m,
                    n: self.out_features,
                    k,
                };
                let ours = self.tp.gemm().auto_path(shape) == GemmPath::Decode;
                i32::from(calibrated.is_ok() && x.is_ok() && m <= self.max_tokens && ours)
            })
            .collect();
        let decode = decode::agree(&self.tp, &self.agreed, &mine)?;
        let x = x?; // no bit of `decode` is set where it failed on any PE
        let fused = self.measure_fused(decode, &x)?;
        self.fused_decode.store(fused, Ordering::Relaxed);
        calibrated
    }

    /// Of the token counts in `decode` (bit m - 1), those where the fused decode kernel
    /// measured faster than the sequential schedule on every PE, among those where
    /// [`Schedule::Auto`] would fuse if it did. The same token counts on every PE (the
    /// thresholds, the shape and `decode` are), measured on `x`. Collective.
    fn measure_fused(&self, decode: u32, x: &DeviceBuffer<bf16>) -> Result<u32> {
        let probe = self.probe.addr();
        let todo: Vec<usize> = (1..=FUSED_DECODE_MAX_TOKENS.min(self.max_tokens))
            .filter(|&m| {
                let facts = Facts {
                    decode_measured: true,
                    ..self.facts(m, probe)
                };
                let path = row_path(
                    self.tp.thresholds(),
                    Schedule::Auto,
                    (self.output, m),
                    facts,
                );
                decode & 1 << (m - 1) != 0 && path == RowPath::FusedDecode
            })
            .collect();
        if todo.is_empty() {
            return Ok(0);
        }
        let stream = self.tp.runtime().stream();
        let measured = decode::measure(&self.tp, &todo, |m, way| {
            let y = self.probe.view(..m * self.out_features);
            // SAFETY: `x` holds FUSED_DECODE_MAX_TOKENS.min(max_tokens) >= m rows.
            unsafe { self.run(y, x.addr(), m, way, stream) }
        });
        // Every PE takes part in the agreement, also one whose measurement failed.
        let none = vec![0; FUSED_DECODE_MAX_TOKENS];
        let fused = decode::agree(&self.tp, &self.agreed, measured.as_deref().unwrap_or(&none))?;
        measured.map(|_| fused)
    }

    /// What the path of a call of `tokens` into an output at `y` depends on.
    fn facts(&self, tokens: usize, y: u64) -> Facts {
        let c = self.tp.collectives();
        let measured = (1..=FUSED_DECODE_MAX_TOKENS).contains(&tokens)
            && self.fused_decode.load(Ordering::Relaxed) & 1 << (tokens - 1) != 0;
        Facts {
            n_pes: self.tp.n_pes(),
            width: self.out_features,
            exchange: self.exchange.is_some() && self.tp.pusher().is_some(),
            decode_fits: self
                .tp
                .fused_decode()
                .fits(c, (tokens, self.out_features), y),
            decode_measured: measured,
        }
    }

    /// The path a call of `tokens` in `schedule` into an output at `y` takes.
    fn path(&self, schedule: Schedule, tokens: usize, y: u64) -> RowPath {
        let facts = self.facts(tokens, y);
        row_path(self.tp.thresholds(), schedule, (self.output, tokens), facts)
    }

    /// What a call of `tokens` tokens in `schedule` runs: [`Schedule::Fused`] where the
    /// layer has a fused form for it, else [`Schedule::Sequential`] (a row-parallel layer
    /// does not overlap). For an output on an 8-byte boundary, as symmetric allocations are.
    /// The same on every PE.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::tp::{RowParallelLinear, Schedule, TensorParallel};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let tp = TensorParallel::new(&shmem)?;
    /// let down = RowParallelLinear::new(&tp, 14336, 4096, 8192)?;
    /// down.load_weight(&vec![nvshmem::bf16::ZERO; 4096 * 14336])?;
    /// if down.resolved_schedule(Schedule::Auto, 1) == Schedule::Fused {
    ///     println!("one token: the decode GEMM and its all-reduce in one kernel");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn resolved_schedule(&self, schedule: Schedule, tokens: usize) -> Schedule {
        self.path(schedule, tokens, 0).schedule()
    }

    /// What [`forward`](Self::forward) ([`Schedule::Auto`]) runs for `tokens` tokens
    /// ([`resolved_schedule`](Self::resolved_schedule)).
    pub fn auto_schedule(&self, tokens: usize) -> Schedule {
        self.resolved_schedule(Schedule::Auto, tokens)
    }

    /// `y = Σ over PEs of x_p · w_pᵀ`, on `stream`: `x` is this PE's `tokens ×
    /// local_in_features`; `y` is `tokens × out_features`, the same on every PE afterwards,
    /// or this PE's `tokens / n_pes` rows of it ([`RowOutput`]). In [`Schedule::Auto`].
    pub fn forward<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceMemory<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.forward_with(y, x, Schedule::Auto, stream)
    }

    /// [`forward`](Self::forward) in `schedule`.
    pub fn forward_with<'a>(
        &self,
        y: impl Into<SymmetricView<'a, bf16>>,
        x: &impl DeviceMemory<bf16>,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let tokens = self.input_tokens(x)?;
        let y = y.into();
        // SAFETY: `x` holds `tokens × local_in` elements.
        self.tp.ordered(stream, || unsafe {
            self.run(y, x.device_addr(stream), tokens, schedule, stream)
        })
    }

    /// `residual += Σ over PEs of x_p · w_pᵀ` and `out = rmsnorm(residual) · norm_weight`:
    /// this layer's GEMM into its partial product, then
    /// [`TensorParallel::all_reduce_rmsnorm`] (one kernel with the all-reduce where it
    /// fits). The layer after a Llama layer's attention (its output projection) or MLP (its
    /// down projection), with the residual add and the next RMSNorm. `out` and `residual` are
    /// `tokens × out_features`; a replicated output only.
    pub fn forward_rmsnorm<'a>(
        &self,
        out: impl Into<SymmetricView<'a, bf16>>,
        residual: &impl DeviceMemory<bf16>,
        x: &impl DeviceMemory<bf16>,
        norm_weight: &impl DeviceMemory<bf16>,
        eps: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let tokens = self.input_tokens(x)?;
        let out = out.into();
        // SAFETY: `x` holds `tokens × local_in` elements.
        self.tp.ordered(stream, || unsafe {
            self.run_rmsnorm(
                out,
                residual,
                x.device_addr(stream),
                tokens,
                (norm_weight, eps),
                stream,
            )
        })
    }

    /// The GEMM into the partial product, then the all-reduce with the residual add and
    /// RMSNorm into `out`.
    ///
    /// # Safety
    /// As for [`run`](Self::run).
    pub(super) unsafe fn run_rmsnorm(
        &self,
        out: SymmetricView<'_, bf16>,
        residual: &impl DeviceMemory<bf16>,
        x: u64,
        tokens: usize,
        (norm_weight, eps): (&impl DeviceMemory<bf16>, f32),
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        check_tokens(
            "RowParallelLinear::forward_rmsnorm",
            tokens,
            self.max_tokens,
        )?;
        if self.output != RowOutput::Replicated {
            return Err(Error::InvalidArgument(
                "forward_rmsnorm takes a layer with a replicated output (the residual add and \
                 RMSNorm follow an all-reduce)"
                    .into(),
            ));
        }
        self.check_output(&out, tokens)?;
        self.gemm_rows(x, 0..tokens, stream)?;
        let partial = self.partial.view(..tokens * self.out_features);
        self.tp
            .all_reduce_rmsnorm(out, residual, partial, norm_weight, eps, stream)
    }

    /// The tokens of input `x` (this PE's `tokens × local_in_features`), once the fused
    /// exchange (if the layer has one) is still usable.
    fn input_tokens(&self, x: &impl DeviceMemory<bf16>) -> Result<usize> {
        if let Some(e) = &self.exchange {
            e.flags.refuse()?;
        }
        rows_of(
            "the row-parallel input",
            x.device_len(),
            self.local_in.len(),
        )
    }

    /// The GEMM and the collective into `y`, in `schedule`.
    ///
    /// # Safety
    /// `x` holds `tokens × local_in` elements of this PE's GPU.
    pub(super) unsafe fn run(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        tokens: usize,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.run_producing(y, x, tokens, schedule, stream, None)
    }

    /// [`run`](Self::run) of an input that `produce` writes on `stream` as the call goes:
    /// `produce(rows)` enqueues the work that writes those rows of `x`, after every check.
    /// The fused GEMM + all-reduce produces each round's rows just before the round's GEMMs
    /// (an MLP's exchange then travels beside its next gate and up projection); every other
    /// path produces every row first.
    ///
    /// # Safety
    /// As for [`run`](Self::run), once `produce` has written the rows.
    pub(super) unsafe fn run_producing(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        tokens: usize,
        schedule: Schedule,
        stream: &Arc<CudaStream>,
        produce: Produce<'_>,
    ) -> Result<()> {
        check_tokens("RowParallelLinear::forward", tokens, self.max_tokens)?;
        self.check_output(&y, tokens)?;
        match self.path(schedule, tokens, y.as_ptr() as u64) {
            RowPath::Sequential => {
                produce_rows(produce, 0..tokens)?;
                self.sequential(y, x, tokens, stream)
            }
            RowPath::FusedDecode => {
                produce_rows(produce, 0..tokens)?;
                let lin = DecodeLinear {
                    w: self.weight.addr(),
                    m: tokens as u64,
                    n: self.out_features as u64,
                    k: self.local_in.len() as u64,
                };
                let c = self.tp.collectives();
                self.tp.fused_decode().launch(c, y, x, lin, stream)
            }
            RowPath::Exchange => self.exchange(y, (x, produce), tokens, stream),
        }
    }

    /// `y`'s length for `tokens` tokens, and with a sequence-parallel output tokens that the
    /// PEs share equally.
    fn check_output(&self, y: &SymmetricView<'_, bf16>, tokens: usize) -> Result<()> {
        let (n, cols) = (self.tp.n_pes(), self.out_features);
        let (what, rows) = match self.output {
            RowOutput::Replicated => ("the row-parallel output (tokens × out_features)", tokens),
            RowOutput::SequenceParallel if !tokens.is_multiple_of(n) => {
                return Err(Error::InvalidArgument(format!(
                    "a row-parallel layer with a sequence-parallel output shares the tokens \
                     equally: {tokens} tokens over {n} PEs"
                )))
            }
            RowOutput::SequenceParallel => (
                "the row-parallel output (tokens / n_pes × out_features)",
                tokens / n,
            ),
        };
        match y.len() == rows * cols {
            true => Ok(()),
            false => Err(Error::Length {
                what,
                expected: rows * cols,
                got: y.len(),
            }),
        }
    }

    /// The GEMM of every token into the partial product, then our all-reduce or
    /// reduce-scatter of it into `y`.
    ///
    /// # Safety
    /// As for [`run`](Self::run).
    unsafe fn sequential(
        &self,
        y: SymmetricView<'_, bf16>,
        x: u64,
        tokens: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.gemm_rows(x, 0..tokens, stream)?;
        let partial = self.partial.view(..tokens * self.out_features);
        let c = self.tp.collectives();
        match self.output {
            RowOutput::Replicated => {
                c.all_reduce(y, partial, ReduceOp::Sum, AllReduceAlgo::Auto, stream)
            }
            RowOutput::SequenceParallel => {
                c.reduce_scatter(y, partial, ReduceOp::Sum, ReduceScatterAlgo::Auto, stream)
            }
        }
    }

    /// The fused GEMM + reduce-scatter, or + all-reduce, in rounds (exchange/rounds.rs).
    ///
    /// # Safety
    /// As for [`run_producing`](Self::run_producing), for a call whose path is
    /// [`RowPath::Exchange`].
    unsafe fn exchange(
        &self,
        y: SymmetricView<'_, bf16>,
        (x, produce): (u64, Produce<'_>),
        tokens: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (Some(exchange), Some(pusher)) = (&self.exchange, self.tp.pusher()) else {
            return Err(Error::InvalidArgument(
                "the fused exchange needs its buffers and stream memory operations".into(),
            ));
        };
        let (cols, k) = (self.out_features, self.local_in.len());
        let gemm = |first: usize, m: usize, dst: u64| {
            let ops = Operands {
                y: dst,
                ldy: cols,
                x: x + (first * k * BF16) as u64,
                w: self.weight.addr(),
            };
            // SAFETY: the rounds ask for tokens of the call, into the call's buffers.
            unsafe {
                self.tp
                    .gemm()
                    .linear_raw(ops, LinearShape { m, n: cols, k }, stream)
            }
        };
        RoundsCall {
            tp: &self.tp,
            flags: &exchange.flags,
            bases: &exchange.bases,
            partial: self.partial.view(..tokens * cols),
            y,
            cols,
            tokens,
            replicated: self.output == RowOutput::Replicated,
            produce,
            gemm: &gemm,
            pusher,
            stream,
        }
        .run()
    }

    /// The partial product of tokens `rows`, into the same rows of `partial`.
    ///
    /// # Safety
    /// As for [`run`](Self::run), with `rows` inside the call's tokens.
    unsafe fn gemm_rows(&self, x: u64, rows: Range<usize>, stream: &Arc<CudaStream>) -> Result<()> {
        let (n, k) = (self.out_features, self.local_in.len());
        let ops = Operands {
            y: self.partial.addr() + (rows.start * n * BF16) as u64,
            ldy: n,
            x: x + (rows.start * k * BF16) as u64,
            w: self.weight.addr(),
        };
        let shape = LinearShape {
            m: rows.len(),
            n,
            k,
        };
        self.tp.gemm().linear_raw(ops, shape, stream)
    }
}
