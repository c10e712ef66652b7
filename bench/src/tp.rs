//! Tensor-parallel Llama MLP: `nvshmem::tp::TpMlp` in each schedule (the local GEMMs, the
//! SiLU kernel and our all-reduce) against the same local work followed by NCCL's all-reduce,
//! and against the local work alone (with our GEMMs, and with cuBLASLt's); and in sequence parallelism `SequenceParallelMlp` (all-gather + GEMM,
//! GEMM + reduce-scatter) against NCCL's all-gather and reduce-scatter around the same local
//! work; and against cuBLASMp's GEMMs with the communication overlapped (`cublasmp`). Each is
//! captured in CUDA graphs and timed in alternating blocks; every token count is checked
//! against the unsharded MLP on fresh random data.

use crate::cli::{Config, Impl, Mode, TpLayout, TpShape};
use crate::coord::Coord;
use crate::cublasmp::{self, CublasMp, Dims, Plan};
use crate::data::{self, BenchElem};
use crate::error::{BenchError, CudaExt, Guard, Result};
use crate::nccl::Nccl;
use crate::report::{Record, Results, Status, TpFigures};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::{CudaGraph, CudaStream};
use half::bf16;
use nvshmem::tp::{
    ColumnParallelLinear, GemmPath, LinearShape, MlpShape, RowParallelLinear, Schedule,
    SequenceParallelMlp, TensorParallel, TpMlp, TUNED_TOKENS,
};
use nvshmem::{Collectives, DeviceBuffer, Nvshmem, ReduceOp, SymmetricBuffer};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

/// The `test` of the tensor-parallel MLP rows.
pub const TP_TEST: &str = "tp";

/// The timed replays of each implementation are split into this many blocks (fewer when
/// there are fewer replays), alternating between the implementations.
pub const ROUNDS: usize = 5;

/// Tolerance per element against the unsharded reference, as a fraction of `|ref| +
/// rms(ref)`. The output is bf16 (relative spacing 2^-8), and gate, up, SiLU(gate)·up and
/// each PE's partial product are rounded to bf16 on the way, in a different order and over
/// other splits of the features than in the unsharded reference, so either may land on the
/// neighbouring bf16 at every rounding: a few output spacings of the element itself, plus as
/// much of the output's RMS for small elements that cancellation leaves carrying their
/// inputs' rounding. A wrong shard, a missing PE or swapped gate and up projections miss by
/// the order of the RMS itself.
const TOLERANCE: f64 = 1.0 / 64.0;

/// The tolerance of an implementation on `n` PEs. NCCL (and cuBLASMp, through NCCL) sums bf16
/// partial products in bf16: on more than 2 PEs each of its n - 1 additions rounds a running
/// sum, which cancellation may leave much larger than the result, so its output gets n - 1
/// times the tolerance (on 4 H200s a few elements in 10^7 were off by a bf16 spacing of
/// such a sum, the same elements with every NCCL protocol). Ours adds the partial products
/// in f32 and rounds once.
fn tolerance(imp: TpImpl, n: usize) -> f64 {
    match imp {
        TpImpl::CublasNccl | TpImpl::Cublasmp => TOLERANCE * n.saturating_sub(1).max(1) as f64,
        _ => TOLERANCE,
    }
}

/// The implementations of the tensor-parallel MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TpImpl {
    /// The local GEMMs (as `GemmPath::Auto` chooses: up to `DECODE_MAX_TOKENS` tokens the faster
    /// of our decode kernel and cuBLASLt as measured when the weights were loaded, cuBLASLt
    /// above, with the algorithm measured then up to `TUNED_TOKENS` tokens) and the SiLU
    /// kernel alone, no communication.
    ComputeOnly,
    /// The same with every GEMM by cuBLASLt with its heuristic's first choice
    /// (`GemmPath::CublasLtHeuristic`: cuBLAS's compute alone): run only up to `TUNED_TOKENS`
    /// tokens, where `GemmPath::Auto` may take our decode kernel or a measured algorithm
    /// (above, it is compute-only again).
    CublasOnly,
    /// The local work, then NCCL's all-reduce (sequence parallel: NCCL's all-gather, the
    /// local work, NCCL's reduce-scatter).
    CublasNccl,
    /// `TpMlp::forward_with(Schedule::Sequential)`: the local work, then our all-reduce
    /// (sequence parallel: `SequenceParallelMlp`, our all-gather and reduce-scatter).
    CublasOurs,
    /// `SequenceParallelMlp::forward_with(Schedule::Overlapped)`: the gate/up GEMM of this
    /// PE's tokens while the all-gather brings the others' (sequence parallel only: a
    /// replicated MLP has no overlapped form).
    Overlapped,
    /// `TpMlp::forward_with(Schedule::Fused)`: the down projection's GEMM and all-reduce in
    /// one kernel up to `FUSED_DECODE_MAX_TOKENS` tokens; from `FUSED_EXCHANGE_TOKENS` tokens
    /// per PE, its GEMMs in rounds with the all-reduce's exchanges beside them. Sequence
    /// parallel: both exchanges fused with their GEMMs. Run only where the layers have that
    /// form (`resolved_schedule`: elsewhere it is cublas+ours again).
    Fused,
    /// cuBLASMp: the gate/up GEMM by cuBLASLt, the SiLU kernel, then `cublasMpMatmul`'s
    /// GEMM and all-reduce (without overlap: its overlapped form needs NVLink multicast).
    /// Sequence parallel: its overlapped all-gather + GEMM and GEMM + reduce-scatter.
    Cublasmp,
}

impl TpImpl {
    pub const ALL: [TpImpl; 7] = [
        TpImpl::ComputeOnly,
        TpImpl::CublasOnly,
        TpImpl::CublasNccl,
        TpImpl::CublasOurs,
        TpImpl::Overlapped,
        TpImpl::Fused,
        TpImpl::Cublasmp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TpImpl::ComputeOnly => "compute-only",
            TpImpl::CublasOnly => "cublas-only",
            TpImpl::CublasNccl => "cublas+nccl",
            TpImpl::CublasOurs => "cublas+ours",
            TpImpl::Overlapped => "overlapped",
            TpImpl::Fused => "fused",
            TpImpl::Cublasmp => "cublasmp",
        }
    }

    /// What `--impls` selects: compute-only and cublas-only always (the baselines of the
    /// overhead), cublas+nccl with `nccl`, cublas+ours, overlapped and fused with `ours`,
    /// cublasmp with `cublasmp`.
    pub fn selected(cfg: &Config) -> Vec<TpImpl> {
        TpImpl::ALL
            .into_iter()
            .filter(|i| match i {
                TpImpl::ComputeOnly | TpImpl::CublasOnly => true,
                TpImpl::CublasNccl => cfg.has_impl(Impl::Nccl),
                TpImpl::CublasOurs | TpImpl::Overlapped | TpImpl::Fused => cfg.has_impl(Impl::Ours),
                TpImpl::Cublasmp => cfg.has_impl(Impl::Cublasmp),
            })
            .collect()
    }
}

/// Floating-point operations of one forward per GPU: the gate, up and down GEMMs of
/// `2 M hidden ffn` each, shared by the PEs.
pub fn mlp_flops_per_gpu(m: usize, hidden: usize, ffn: usize, n_pes: usize) -> f64 {
    6.0 * m as f64 * hidden as f64 * ffn as f64 / n_pes.max(1) as f64
}

/// 10^12 operations per second from `flops` done in `time_us`.
pub fn tflops(flops: f64, time_us: f64) -> Option<f64> {
    (time_us > 0.0).then(|| flops / time_us * 1e-6)
}

/// How many times faster than `base_us` a time of `time_us` is.
pub fn speedup(base_us: f64, time_us: f64) -> Option<f64> {
    (time_us > 0.0).then(|| base_us / time_us)
}

/// The time beyond the local work, in percent of the local work.
pub fn overhead_percent(time_us: f64, compute_us: f64) -> Option<f64> {
    (compute_us > 0.0).then(|| (time_us - compute_us) / compute_us * 100.0)
}

/// Fill in the speed-up over cublas+nccl and the overhead over compute-only of `records`, the
/// rows of one shape and token count, from their median times.
pub fn fill_relative(records: &mut [Record]) {
    let median = |imp: TpImpl, recs: &[Record]| {
        recs.iter()
            .find(|r| r.implementation == imp.name())
            .and_then(|r| r.median_us())
    };
    let nccl = median(TpImpl::CublasNccl, records);
    let compute = median(TpImpl::ComputeOnly, records);
    let slowest_compute = records
        .iter()
        .find(|r| r.implementation == TpImpl::ComputeOnly.name())
        .and_then(|r| r.tp.and_then(|t| t.slowest_pe_us));
    for r in records.iter_mut() {
        let t = r.median_us();
        if let Some(fig) = r.tp.as_mut() {
            fig.speedup_vs_nccl = t.zip(nccl).and_then(|(t, b)| speedup(b, t));
            fig.overhead_percent = t.zip(compute).and_then(|(t, c)| overhead_percent(t, c));
            fig.overhead_slowest_percent = t
                .zip(slowest_compute)
                .and_then(|(t, c)| overhead_percent(t, c));
        }
    }
}

/// The order of the timed replays of `impls` implementations, `iters` of each: `rounds`
/// rounds (at most `iters`), each a block of replays of every implementation in turn, the
/// order rotated by one every round. Entry `i` is the implementation of replay `i`.
pub fn interleave(impls: usize, iters: usize, rounds: usize) -> Vec<usize> {
    let rounds = rounds.clamp(1, iters.max(1));
    let mut order = Vec::with_capacity(impls * iters);
    for round in 0..rounds {
        let block = iters / rounds + usize::from(round < iters % rounds);
        for j in 0..impls {
            order.extend(std::iter::repeat((j + round) % impls).take(block));
        }
    }
    order
}

/// What the tensor-parallel benchmark runs with.
pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    /// The collectives of `TpMlp`'s all-reduce (shared with the collectives tests).
    pub collectives: &'a Arc<Collectives>,
    pub nccl: Option<&'a Nccl>,
    /// cuBLASMp, when the cublasmp column runs.
    pub cublasmp: Option<&'a CublasMp>,
    pub progress: &'a Progress,
    /// CPU threads for the random data.
    pub threads: usize,
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let n = ctx.shmem.n_pes();
    ctx.progress
        .say("tp: setting up cuBLASLt and the tensor-parallel kernels");
    timing::step("tp: setting up cuBLASLt and the tensor-parallel kernels");
    // Not collective: the PEs agree on the outcome before anything that is.
    let tp = TensorParallel::with_collectives(ctx.shmem, Arc::clone(ctx.collectives));
    let failed = ctx.coord.sum(tp.is_err() as u64)?;
    let tp = match tp {
        Ok(tp) if failed == 0 => Guard::new(tp),
        Ok(_) => {
            return Err(BenchError::new(format!(
                "tp: setting up the tensor-parallel layers failed on {failed} of {n} PEs"
            )))
        }
        Err(e) => {
            return Err(BenchError::new(format!(
                "tp: cannot set up the tensor-parallel layers: {e}"
            )))
        }
    };
    let impls = TpImpl::selected(ctx.cfg);
    for shape in &ctx.cfg.tp_shapes {
        if shape.ffn < n {
            let note = format!(
                "tp {}: skipped, its {} FFN features cannot be shared by {n} PEs",
                shape.name, shape.ffn
            );
            ctx.progress.say(&note);
            results.notes.push(note);
            continue;
        }
        for &layout in &ctx.cfg.tp_layouts {
            run_shape(ctx, timer, results, &tp, shape, layout, &impls)?;
        }
    }
    Ok(())
}

/// The MLP of one layout.
enum Mlp {
    Replicated(TpMlp),
    Sequence(SequenceParallelMlp),
}

impl Mlp {
    fn gate_up(&self) -> &ColumnParallelLinear {
        match self {
            Mlp::Replicated(m) => m.gate_up(),
            Mlp::Sequence(m) => m.gate_up(),
        }
    }

    fn down(&self) -> &RowParallelLinear {
        match self {
            Mlp::Replicated(m) => m.down(),
            Mlp::Sequence(m) => m.down(),
        }
    }

    /// What a forward of `m` tokens in `schedule` runs: the down projection's schedule
    /// (replicated), the gate/up projection's (sequence parallel, where it overlaps).
    fn resolved(&self, schedule: Schedule, m: usize) -> Schedule {
        match self {
            Mlp::Replicated(mlp) => mlp.down().resolved_schedule(schedule, m),
            Mlp::Sequence(mlp) => mlp.gate_up().resolved_schedule(schedule, m),
        }
    }

    fn load_weights(&self, gate: &[bf16], up: &[bf16], down: &[bf16]) -> nvshmem::Result<()> {
        match self {
            Mlp::Replicated(m) => m.load_weights(gate, up, down),
            Mlp::Sequence(m) => m.load_weights(gate, up, down),
        }
    }

    /// One forward into `y`: from every token (`x`) or this PE's (`mine`), by layout.
    fn forward(
        &self,
        y: &SymmetricBuffer<bf16>,
        (x, mine): (&DeviceBuffer<bf16>, Option<&SymmetricBuffer<bf16>>),
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<(), String> {
        match self {
            Mlp::Replicated(m) => m.forward_with(y, x, schedule, stream),
            Mlp::Sequence(m) => {
                let mine = mine.ok_or("the sequence-parallel MLP has no input of its own")?;
                m.forward_with(y, mine, schedule, stream)
            }
        }
        .map_err(|e| e.to_string())
    }
}

/// The full (unsharded) weights on this GPU, for the reference.
struct Weights {
    /// gate's `ffn` rows, then up's: `2 ffn × hidden`.
    gate_up: Guard<DeviceBuffer<bf16>>,
    /// `hidden × ffn`.
    down: Guard<DeviceBuffer<bf16>>,
}

fn run_shape(
    ctx: &Ctx,
    timer: &mut Timer,
    results: &mut Results,
    tp: &TensorParallel,
    shape: &TpShape,
    layout: TpLayout,
    impls: &[TpImpl],
) -> Result<()> {
    let (hidden, ffn, n) = (shape.hidden, shape.ffn, ctx.shmem.n_pes());
    let variant = layout.variant(&shape.name);
    // Sequence parallelism shares the tokens equally.
    let ms: Vec<usize> = match layout {
        TpLayout::Replicated => ctx.cfg.tp_m.clone(),
        TpLayout::Sequence => ctx
            .cfg
            .tp_m
            .iter()
            .copied()
            .filter(|m| m % n == 0)
            .collect(),
    };
    if ms.len() < ctx.cfg.tp_m.len() {
        let note = format!(
            "tp {variant}: token counts that are not multiples of the {n} PEs skipped \
             (sequence parallelism shares them equally)"
        );
        ctx.progress.say(&note);
        results.notes.push(note);
    }
    let Some(&max_m) = ms.last() else {
        return Ok(());
    };
    ctx.progress.say(format!(
        "tp {variant} (hidden {hidden}, ffn {ffn}, {} tokens), TP {n}: M = {ms:?}",
        layout.name()
    ));
    timing::step(format!("tp {variant}: building the MLP"));
    let mlp_shape = MlpShape {
        hidden,
        ffn,
        max_tokens: max_m,
    };
    let mlp = Guard::new(match layout {
        TpLayout::Replicated => Mlp::Replicated(TpMlp::new(tp, mlp_shape)?),
        TpLayout::Sequence => Mlp::Sequence(SequenceParallelMlp::new(tp, mlp_shape)?),
    });
    let full = Weights {
        gate_up: Guard::new(ctx.shmem.alloc_device::<bf16>(2 * ffn * hidden)?),
        down: Guard::new(ctx.shmem.alloc_device::<bf16>(hidden * ffn)?),
    };
    let mut disabled = HashSet::new();
    for (index, &m) in ms.iter().enumerate() {
        let first = results.records.len();
        for r in point(
            ctx,
            timer,
            tp,
            &mlp,
            &full,
            (shape, &variant),
            m,
            impls,
            &mut disabled,
        )? {
            results.push(r);
        }
        ctx.progress.say(progress_line(
            &variant,
            index + 1,
            ms.len(),
            m,
            &results.records[first..],
        ));
    }
    Ok(())
}

fn progress_line(variant: &str, i: usize, total: usize, m: usize, recs: &[Record]) -> String {
    let parts: Vec<String> = recs
        .iter()
        .map(|r| {
            let cell = match (r.status, r.median_us()) {
                (Status::Ok, Some(t)) => format!("{t:.1}us"),
                (Status::Failed, Some(t)) => format!("{t:.1}us WRONG"),
                (Status::Unsupported, _) => "n/a".into(),
                _ => "FAILED".into(),
            };
            format!("{}: {cell}", r.implementation)
        })
        .collect();
    let mut line = format!("tp {variant} [{i}/{total}] M={m}: {}", parts.join(" | "));
    let ours = recs
        .iter()
        .find(|r| r.implementation == TpImpl::CublasOurs.name())
        .and_then(|r| r.tp)
        .and_then(|t| t.speedup_vs_nccl);
    if let Some(s) = ours {
        line.push_str(&format!(" (ours {s:.2}x vs nccl)"));
    }
    line
}

/// Fresh random data of one token count, the same on every PE.
struct Data {
    /// gate's `ffn` rows, then up's (`2 ffn × hidden`), uniform in ±sqrt(3 / hidden).
    gate_up: Vec<bf16>,
    /// `hidden × ffn`, uniform in ±sqrt(3 / ffn).
    down: Vec<bf16>,
    /// `M × hidden`, uniform in [-1, 1).
    x: Vec<bf16>,
}

fn fresh_data(cfg: &Config, shape: &TpShape, m: usize, threads: usize) -> Data {
    let (hidden, ffn) = (shape.hidden, shape.ffn);
    let key = |part: u64| {
        data::key(
            cfg.seed,
            &[
                data::hash_bytes(TP_TEST.as_bytes()),
                hidden as u64,
                ffn as u64,
                m as u64,
                part,
            ],
        )
    };
    let scale = |in_features: usize| (3.0 / in_features as f64).sqrt() as f32;
    Data {
        gate_up: data::uniform_bf16(key(0), 2 * ffn * hidden, scale(hidden), threads),
        down: data::uniform_bf16(key(1), hidden * ffn, scale(ffn), threads),
        x: data::uniform_bf16(key(2), m * hidden, 1.0, threads),
    }
}

/// The local work's buffers: gate and up (`M × 2f`), SiLU(gate)·up (`M × f`) and the down
/// projection (`M × hidden`).
struct Scratch {
    gu: Guard<DeviceBuffer<bf16>>,
    act: Guard<DeviceBuffer<bf16>>,
    out: Guard<DeviceBuffer<bf16>>,
}

/// The input and each implementation's buffers, for one token count.
struct Buffers {
    /// Every token (`M × hidden`).
    x: Guard<DeviceBuffer<bf16>>,
    /// Sequence parallel: this PE's tokens (`M / PEs × hidden`).
    mine: Option<Guard<SymmetricBuffer<bf16>>>,
    /// compute-only's: its output is `out`, this PE's partial product.
    compute: Scratch,
    /// cublas-only's, the same.
    cublas: Option<Scratch>,
    /// cublas+nccl's local work, and the all-reduced output (sequence parallel: this PE's
    /// reduce-scattered rows).
    nccl: Option<(Scratch, Guard<DeviceBuffer<bf16>>)>,
    /// Sequence parallel, cublas+nccl's all-gathered input (`M × hidden`).
    nccl_gathered: Option<Guard<DeviceBuffer<bf16>>>,
    /// cublas+ours's output (TpMlp keeps its own scratch).
    ours: Option<Guard<SymmetricBuffer<bf16>>>,
    /// overlapped's output.
    overlapped: Option<Guard<SymmetricBuffer<bf16>>>,
    /// fused's output.
    fused: Option<Guard<SymmetricBuffer<bf16>>>,
    /// cublasmp's gate and up, SiLU(gate)·up, and output (this PE's rows in sequence
    /// parallelism).
    cublasmp: Option<Scratch>,
}

impl Buffers {
    /// Allocates symmetric memory when cublas+ours is in `active`, or in sequence
    /// parallelism: collective.
    fn new(
        shmem: &Nvshmem,
        active: &[TpImpl],
        layout: TpLayout,
        m: usize,
        f: usize,
        hidden: usize,
    ) -> Result<Self> {
        let sequence = layout == TpLayout::Sequence;
        // The output of each forward: every token, or this PE's.
        let out_len = match sequence {
            true => m / shmem.n_pes() * hidden,
            false => m * hidden,
        };
        let dev = |len: usize| -> Result<Guard<DeviceBuffer<bf16>>> {
            Ok(Guard::new(shmem.alloc_device::<bf16>(len)?))
        };
        let scratch = || -> Result<Scratch> {
            Ok(Scratch {
                gu: dev(m * 2 * f)?,
                act: dev(m * f)?,
                out: dev(m * hidden)?,
            })
        };
        // The collective allocations first: a PE that then fails a local one leaves no other
        // PE waiting in a collective one.
        let mine = match sequence {
            true => Some(Guard::new(shmem.malloc::<bf16>(out_len)?)),
            false => None,
        };
        let output = |imp| -> Result<_> {
            Ok(match active.contains(&imp) {
                true => Some(Guard::new(shmem.malloc::<bf16>(out_len)?)),
                false => None,
            })
        };
        let ours = output(TpImpl::CublasOurs)?;
        let overlapped = output(TpImpl::Overlapped)?;
        let fused = output(TpImpl::Fused)?;
        let nccl = active.contains(&TpImpl::CublasNccl);
        let cublasmp = match active.contains(&TpImpl::Cublasmp) {
            true => Some(Scratch {
                gu: dev(m * 2 * f)?,
                act: dev(m * f)?,
                out: dev(out_len)?,
            }),
            false => None,
        };
        Ok(Buffers {
            x: dev(m * hidden)?,
            mine,
            compute: scratch()?,
            cublas: match active.contains(&TpImpl::CublasOnly) {
                true => Some(scratch()?),
                false => None,
            },
            nccl: match nccl {
                true => Some((scratch()?, dev(out_len)?)),
                false => None,
            },
            nccl_gathered: match nccl && sequence {
                true => Some(dev(m * hidden)?),
                false => None,
            },
            ours,
            overlapped,
            fused,
            cublasmp,
        })
    }

    /// Where `imp` leaves its output: device address and bytes.
    fn output(&self, imp: TpImpl) -> Option<(u64, usize)> {
        match imp {
            TpImpl::ComputeOnly => Some((self.compute.out.addr(), self.compute.out.num_bytes())),
            TpImpl::CublasOnly => self
                .cublas
                .as_ref()
                .map(|s| (s.out.addr(), s.out.num_bytes())),
            TpImpl::CublasNccl => self
                .nccl
                .as_ref()
                .map(|(_, out)| (out.addr(), out.num_bytes())),
            TpImpl::CublasOurs => self.ours.as_ref().map(|y| (y.addr(), y.num_bytes())),
            TpImpl::Overlapped => self.overlapped.as_ref().map(|y| (y.addr(), y.num_bytes())),
            TpImpl::Fused => self.fused.as_ref().map(|y| (y.addr(), y.num_bytes())),
            TpImpl::Cublasmp => self
                .cublasmp
                .as_ref()
                .map(|s| (s.out.addr(), s.out.num_bytes())),
        }
    }

    /// `imp`'s output (the stream must be idle).
    fn read(&self, imp: TpImpl) -> Result<Vec<bf16>> {
        let out = match imp {
            TpImpl::ComputeOnly => Some(self.compute.out.to_vec()?),
            TpImpl::CublasOnly => self.cublas.as_ref().map(|s| s.out.to_vec()).transpose()?,
            TpImpl::CublasNccl => self.nccl.as_ref().map(|(_, o)| o.to_vec()).transpose()?,
            TpImpl::CublasOurs => self.ours.as_ref().map(|y| y.to_vec()).transpose()?,
            TpImpl::Overlapped => self.overlapped.as_ref().map(|y| y.to_vec()).transpose()?,
            TpImpl::Fused => self.fused.as_ref().map(|y| y.to_vec()).transpose()?,
            TpImpl::Cublasmp => self.cublasmp.as_ref().map(|s| s.out.to_vec()).transpose()?,
        };
        Ok(out.unwrap_or_default())
    }
}

/// Enqueues one forward of an implementation (copyable, so timing closures can hold it).
#[derive(Clone, Copy)]
struct Ops<'a> {
    tp: &'a TensorParallel,
    mlp: &'a Mlp,
    nccl: Option<&'a Nccl>,
    /// cublasmp's GEMMs at this token count.
    mp: Option<&'a MpPlans<'a>>,
    bufs: &'a Buffers,
    m: usize,
    hidden: usize,
    /// This PE's FFN features.
    f: usize,
}

impl Ops<'_> {
    /// This PE's share of the work on every token `x` into `s`: the merged gate/up GEMM on
    /// its weight shard, SiLU(gate)·up, the down GEMM on its shard (the partial product in
    /// `s.out`), its GEMMs by `path`.
    fn local(
        &self,
        x: &DeviceBuffer<bf16>,
        s: &Scratch,
        path: GemmPath,
        stream: &Arc<CudaStream>,
    ) -> nvshmem::Result<()> {
        let (m, f, hidden) = (self.m, self.f, self.hidden);
        let gemm = self.tp.gemm();
        gemm.linear_with(
            &*s.gu,
            x,
            self.mlp.gate_up().weight(),
            LinearShape {
                m,
                n: 2 * f,
                k: hidden,
            },
            path,
            stream,
        )?;
        self.tp.silu_mul(&*s.act, &*s.gu, m, stream)?;
        gemm.linear_with(
            &*s.out,
            &*s.act,
            self.mlp.down().weight(),
            LinearShape { m, n: hidden, k: f },
            path,
            stream,
        )
    }

    /// The MLP's input: every token, and this PE's in sequence parallelism.
    fn input(&self) -> (&DeviceBuffer<bf16>, Option<&SymmetricBuffer<bf16>>) {
        (&self.bufs.x, self.bufs.mine.as_deref())
    }

    /// Errors come back as text: a failure to enqueue is reported, and fatal only if the PEs
    /// disagree.
    fn enqueue(&self, imp: TpImpl, stream: &Arc<CudaStream>) -> Result<(), String> {
        match imp {
            TpImpl::ComputeOnly => self
                .local(&self.bufs.x, &self.bufs.compute, GemmPath::Auto, stream)
                .map_err(|e| e.to_string()),
            TpImpl::CublasOnly => {
                let s = self
                    .bufs
                    .cublas
                    .as_ref()
                    .ok_or("cublas-only has no buffers")?;
                self.local(&self.bufs.x, s, GemmPath::CublasLtHeuristic, stream)
                    .map_err(|e| e.to_string())
            }
            TpImpl::CublasNccl => {
                let nccl = self.nccl.ok_or("NCCL is not initialised")?;
                let (scratch, out) = self
                    .bufs
                    .nccl
                    .as_ref()
                    .ok_or("cublas+nccl has no buffers")?;
                let bf = <bf16 as BenchElem>::NCCL;
                let (Some(mine), Some(gathered)) = (&self.bufs.mine, &self.bufs.nccl_gathered)
                else {
                    self.local(&self.bufs.x, scratch, GemmPath::Auto, stream)
                        .map_err(|e| e.to_string())?;
                    // SAFETY: the partial product and the output both hold M × hidden bf16.
                    return unsafe {
                        nccl.all_reduce(
                            scratch.out.addr(),
                            out.addr(),
                            self.m * self.hidden,
                            bf,
                            stream,
                        )
                    };
                };
                // SAFETY: this PE's tokens and its output hold M / PEs × hidden bf16, the
                // gathered input and the partial product M × hidden.
                unsafe {
                    nccl.all_gather(mine.addr(), gathered.addr(), mine.len(), bf, stream)?;
                    self.local(gathered, scratch, GemmPath::Auto, stream)
                        .map_err(|e| e.to_string())?;
                    nccl.reduce_scatter(scratch.out.addr(), out.addr(), out.len(), bf, stream)
                }
            }
            TpImpl::CublasOurs => {
                let y = self
                    .bufs
                    .ours
                    .as_deref()
                    .ok_or("cublas+ours has no output buffer")?;
                self.mlp
                    .forward(y, self.input(), Schedule::Sequential, stream)
            }
            TpImpl::Overlapped => {
                let y = self
                    .bufs
                    .overlapped
                    .as_deref()
                    .ok_or("overlapped has no output buffer")?;
                self.mlp
                    .forward(y, self.input(), Schedule::Overlapped, stream)
            }
            TpImpl::Fused => {
                let y = self
                    .bufs
                    .fused
                    .as_deref()
                    .ok_or("fused has no output buffer")?;
                self.mlp.forward(y, self.input(), Schedule::Fused, stream)
            }
            TpImpl::Cublasmp => self.cublasmp(stream),
        }
    }

    /// cublasmp's forward: the gate/up GEMM (cuBLASMp's all-gather + GEMM in sequence
    /// parallelism, else cuBLASLt's), the SiLU kernel, cuBLASMp's GEMM + reduce-scatter or
    /// all-reduce.
    fn cublasmp(&self, stream: &Arc<CudaStream>) -> Result<(), String> {
        let plans = self.mp.ok_or("cuBLASMp is not set up")?;
        let s = self
            .bufs
            .cublasmp
            .as_ref()
            .ok_or("cublasmp has no buffers")?;
        let (m, f, hidden) = (self.m, self.f, self.hidden);
        let gate_up = self.mlp.gate_up().weight();
        match (&plans.gate_up, self.input()) {
            // SAFETY: this PE's M / PEs tokens, its 2f gate/up rows and M × 2f outputs, as
            // the plan was made for.
            (Some(gather), (_, Some(mine))) => unsafe {
                gather.enqueue(s.gu.addr(), mine.addr(), gate_up.addr(), stream)?
            },
            (_, (x, _)) => self
                .tp
                .gemm()
                .linear_with(
                    &*s.gu,
                    x,
                    gate_up,
                    LinearShape {
                        m,
                        n: 2 * f,
                        k: hidden,
                    },
                    GemmPath::CublasLt,
                    stream,
                )
                .map_err(|e| e.to_string())?,
        }
        self.tp
            .silu_mul(&*s.act, &*s.gu, m, stream)
            .map_err(|e| e.to_string())?;
        // SAFETY: M × f activations, this PE's hidden × f down columns, and the output of
        // M / PEs or M rows, as the plan was made for.
        unsafe {
            plans.down.enqueue(
                s.out.addr(),
                s.act.addr(),
                self.mlp.down().weight().addr(),
                stream,
            )
        }
    }
}

/// cublasmp's GEMMs at one token count: in sequence parallelism the gate/up all-gather +
/// GEMM, and the down projection's GEMM + reduce-scatter (sequence parallel) or all-reduce.
struct MpPlans<'a> {
    gate_up: Option<Plan<'a>>,
    down: Plan<'a>,
}

/// Makes cublasmp's plans for `m` tokens and takes their workspaces from the symmetric heap.
/// `Ok(Err(why))` when cuBLASMp refuses on any PE or the PEs' workspaces differ: every PE
/// gets it alike, before anything collective.
fn mp_plans<'a>(
    ctx: &Ctx,
    mp: &'a CublasMp,
    mlp: &Mlp,
    bufs: &Buffers,
    (m, f, hidden): (usize, usize, usize),
) -> Result<Result<MpPlans<'a>, String>> {
    let n = ctx.shmem.n_pes();
    let made = (|| -> Result<(MpPlans<'a>, Vec<(usize, usize)>), String> {
        let s = bufs.cublasmp.as_ref().ok_or("cublasmp has no buffers")?;
        let down = Dims {
            m,
            n: hidden,
            k: f * n,
        };
        let (gate_up, kind) = match &bufs.mine {
            Some(mine) => {
                let dims = Dims {
                    m,
                    n: 2 * f * n,
                    k: hidden,
                };
                let plan = Plan::new(mp, cublasmp::Kind::AllGather, dims)?;
                let ptrs = (s.gu.addr(), mine.addr(), mlp.gate_up().weight().addr());
                (Some((plan, ptrs)), cublasmp::Kind::ReduceScatter)
            }
            None => (None, cublasmp::Kind::AllReduce),
        };
        let down_plan = Plan::new(mp, kind, down)?;
        let down_ptrs = (s.out.addr(), s.act.addr(), mlp.down().weight().addr());
        let mut sizes = Vec::new();
        if let Some((plan, (y, x, w))) = &gate_up {
            sizes.push(plan.workspace_bytes(*w, *x, *y)?);
        }
        let (y, x, w) = down_ptrs;
        sizes.push(down_plan.workspace_bytes(w, x, y)?);
        let plans = MpPlans {
            gate_up: gate_up.map(|(p, _)| p),
            down: down_plan,
        };
        Ok((plans, sizes))
    })();
    // Every PE the same outcome and the same workspace sizes, or none allocates.
    let fingerprint = match &made {
        Ok((_, sizes)) => data::hash_bytes(format!("{sizes:?}").as_bytes()),
        Err(_) => 0,
    };
    let refused = ctx.coord.sum(made.is_err() as u64)?;
    if refused > 0 {
        return Ok(Err(match made {
            Err(e) => e,
            Ok(_) => format!("cuBLASMp refused on {refused} of {n} PEs"),
        }));
    }
    if !ctx.coord.all_equal(fingerprint)? {
        return Ok(Err(
            "cuBLASMp asked for workspaces of different sizes on different PEs".into(),
        ));
    }
    let (mut plans, sizes) = made.map_err(BenchError::new)?;
    let mut sizes = sizes.into_iter();
    for plan in plans.gate_up.iter_mut().chain([&mut plans.down]) {
        let (device, host) = sizes.next().unwrap_or_default();
        plan.set_workspace(ctx.shmem, device, host)?;
    }
    Ok(Ok(plans))
}

/// Fill the outputs of `imps` with 0xFF bytes (bf16 NaN), so that only what runs after
/// counts, then start together.
fn poison(ctx: &Ctx, bufs: &Buffers, imps: &[TpImpl]) -> Result<()> {
    ctx.shmem
        .context()
        .bind_to_thread()
        .cuda("cuCtxSetCurrent")?;
    for &imp in imps {
        if let Some((ptr, bytes)) = bufs.output(imp) {
            // SAFETY: the output's own address and size.
            unsafe {
                cudarc::driver::result::memset_d8_async(ptr, 0xff, bytes, ctx.stream.cu_stream())
            }
            .cuda("cuMemsetD8Async")?;
        }
    }
    ctx.stream.synchronize().cuda("cuStreamSynchronize")?;
    ctx.coord.barrier()
}

/// The unsharded MLP of `x` on this GPU: the gate/up GEMM of all `2 ffn` features,
/// SiLU(gate)·up, the down GEMM over all `ffn` features.
fn reference(
    ctx: &Ctx,
    tp: &TensorParallel,
    full: &Weights,
    x: &DeviceBuffer<bf16>,
    m: usize,
    hidden: usize,
    ffn: usize,
) -> Result<Vec<bf16>> {
    let stream = ctx.stream;
    let gu = Guard::new(ctx.shmem.alloc_device::<bf16>(m * 2 * ffn)?);
    let act = Guard::new(ctx.shmem.alloc_device::<bf16>(m * ffn)?);
    let y = Guard::new(ctx.shmem.alloc_device::<bf16>(m * hidden)?);
    let gemm = tp.gemm();
    gemm.linear(
        &*gu,
        x,
        &*full.gate_up,
        LinearShape {
            m,
            n: 2 * ffn,
            k: hidden,
        },
        stream,
    )?;
    tp.silu_mul(&*act, &*gu, m, stream)?;
    gemm.linear(
        &*y,
        &*act,
        &*full.down,
        LinearShape {
            m,
            n: hidden,
            k: ffn,
        },
        stream,
    )?;
    stream.synchronize().cuda("cuStreamSynchronize")?;
    Ok(y.to_vec()?)
}

/// FNV-1a over the bits, mixed: equal outputs give equal hashes.
fn bits_hash(values: &[bf16]) -> u64 {
    let h = values.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        v.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
    });
    data::mix(h)
}

/// One shape and token count: every implementation not switched off, on fresh data, timed in
/// alternating blocks of graph replays, then checked.
#[allow(clippy::too_many_arguments)]
fn point(
    ctx: &Ctx,
    timer: &mut Timer,
    tp: &TensorParallel,
    mlp: &Mlp,
    full: &Weights,
    (shape, variant): (&TpShape, &str),
    m: usize,
    impls: &[TpImpl],
    disabled: &mut HashSet<TpImpl>,
) -> Result<Vec<Record>> {
    let n = ctx.shmem.n_pes();
    let stream = ctx.stream;
    let (hidden, ffn) = (shape.hidden, shape.ffn);
    let f = mlp.down().local_in_features().len();
    let bytes = m * hidden * std::mem::size_of::<bf16>();
    let what = format!("tp {variant} M={m}");
    let layout = match mlp {
        Mlp::Replicated(_) => TpLayout::Replicated,
        Mlp::Sequence(_) => TpLayout::Sequence,
    };
    let fatal = |e: String| BenchError::new(format!("{what}: {e}"));
    let record = |imp: TpImpl| Record {
        test: TP_TEST.into(),
        variant: variant.into(),
        implementation: imp.name().into(),
        mode: Mode::Graph.name().into(),
        dtype: <bf16 as BenchElem>::NAME.into(),
        bytes,
        count: m * hidden,
        n_pes: n,
        time_us: None,
        algbw_gbs: None,
        busbw_gbs: None,
        status: Status::Ok,
        check: "ok".into(),
        tp: Some(TpFigures {
            hidden,
            ffn,
            tokens: m,
            tflops_per_gpu: None,
            speedup_vs_nccl: None,
            overhead_percent: None,
            slowest_pe_us: None,
            overhead_slowest_percent: None,
            auto: false,
        }),
    };

    // New weights and input, the same on every PE; this PE keeps its shards of the weights.
    timing::step(format!("{what}: generating and loading the data"));
    let d = fresh_data(ctx.cfg, shape, m, ctx.threads);
    let (gate, up) = d.gate_up.split_at(ffn * hidden);
    mlp.load_weights(gate, up, &d.down)?;
    full.gate_up.copy_from_host(&d.gate_up)?;
    full.down.copy_from_host(&d.down)?;
    // What `forward` (Schedule::Auto) runs here, decided once the weights are loaded.
    let auto = match mlp.resolved(Schedule::Auto, m) {
        Schedule::Fused => TpImpl::Fused,
        Schedule::Overlapped => TpImpl::Overlapped,
        _ => TpImpl::CublasOurs,
    };
    // Overlapped and fused only where the layers have that form.
    let runs = |schedule: Schedule| mlp.resolved(schedule, m) == schedule;
    let mut active: Vec<TpImpl> = impls
        .iter()
        .copied()
        .filter(|i| !disabled.contains(i))
        .filter(|&i| i != TpImpl::Fused || runs(Schedule::Fused))
        .filter(|&i| i != TpImpl::Overlapped || runs(Schedule::Overlapped))
        .filter(|&i| i != TpImpl::CublasOnly || m <= TUNED_TOKENS)
        .collect();
    let bufs = Buffers::new(ctx.shmem, &active, layout, m, f, hidden)?;
    bufs.x.copy_from_host(&d.x)?;
    // This PE's rows of every token, in sequence parallelism.
    let rows = match &bufs.mine {
        Some(mine) => {
            let rows = ctx.shmem.my_pe() * mine.len()..(ctx.shmem.my_pe() + 1) * mine.len();
            mine.copy_from_host(&d.x[rows.clone()])?;
            rows
        }
        None => 0..m * hidden,
    };
    drop(d);
    let mut records = Vec::new();
    // cublasmp's GEMMs for this M, with their workspaces (collective).
    let mp = match (active.contains(&TpImpl::Cublasmp), ctx.cublasmp) {
        (true, Some(mp)) => match mp_plans(ctx, mp, mlp, &bufs, (m, f, hidden))? {
            Ok(plans) => {
                let sizes: Vec<usize> = plans
                    .gate_up
                    .iter()
                    .chain([&plans.down])
                    .map(Plan::workspace_len)
                    .collect();
                ctx.progress.say(format!(
                    "{what} cublasmp: workspaces of {sizes:?} bytes in the symmetric heap"
                ));
                Some(plans)
            }
            Err(why) => {
                let note = format!("{what} cublasmp: not run: {why}");
                ctx.progress.say(&note);
                disabled.insert(TpImpl::Cublasmp);
                active.retain(|&i| i != TpImpl::Cublasmp);
                let mut r = record(TpImpl::Cublasmp);
                r.status = Status::Unsupported;
                r.check = format!("not run: {why}");
                records.push(r);
                None
            }
        },
        _ => None,
    };
    let ops = Ops {
        tp,
        mlp,
        nccl: ctx.nccl,
        mp: mp.as_ref(),
        bufs: &bufs,
        m,
        hidden,
        f,
    };
    poison(ctx, &bufs, &active)?;

    // The first call of each implementation makes cuBLASLt's plans and shows whether it runs
    // at all: one that refuses on every PE is reported and switched off for this shape; one
    // that refuses on some PEs only leaves the others waiting. The second call, timed on the
    // host and averaged over the PEs, sizes the case.
    let mut running = Vec::new();
    let mut probe_us = 0.0f64;
    for &imp in &active {
        timing::step(format!("{what} {}: first calls", imp.name()));
        let first = ops.enqueue(imp, stream);
        if first.is_ok() {
            stream.synchronize().cuda("cuStreamSynchronize")?;
        }
        let refused = ctx.coord.sum(first.is_err() as u64)?;
        if refused > 0 {
            let msg = first
                .err()
                .unwrap_or_else(|| "refused on another PE".into());
            if refused as usize != n {
                return Err(fatal(format!(
                    "{} failed on {refused} of {n} PEs ({msg}); the others cannot continue",
                    imp.name()
                )));
            }
            disabled.insert(imp);
            let mut r = record(imp);
            r.status = Status::Failed;
            r.check = format!("could not run: {msg}");
            records.push(r);
            continue;
        }
        let again = Instant::now();
        ops.enqueue(imp, stream).map_err(fatal)?;
        stream.synchronize().cuda("cuStreamSynchronize")?;
        let ns = again.elapsed().as_nanos() as u64;
        probe_us = probe_us.max(ctx.coord.sum(ns)? as f64 / n as f64 / 1e3);
        running.push(imp);
    }
    // compute-only's and cublas-only's eager outputs: their graph replays must give the
    // same bits.
    let eager = |imp: TpImpl| -> Result<Vec<bf16>> {
        match running.contains(&imp) {
            true => bufs.read(imp),
            false => Ok(Vec::new()),
        }
    };
    let (eager_compute, eager_cublas) = (eager(TpImpl::ComputeOnly)?, eager(TpImpl::CublasOnly)?);

    // The same counts for every implementation, sized by the slowest.
    let (warm, iters, graph_ops) = ctx.cfg.budgeted(bytes, probe_us, true);
    let mut graphs: Vec<(TpImpl, CudaGraph)> = Vec::new();
    for &imp in &running {
        timing::step(format!(
            "{what} {}: capturing {graph_ops} forwards",
            imp.name()
        ));
        let graph = timing::capture(stream, graph_ops, || ops.enqueue(imp, stream));
        let failed = ctx.coord.sum(graph.is_err() as u64)?;
        match graph {
            Ok(g) if failed == 0 => graphs.push((imp, g)),
            other => {
                let msg = other
                    .err()
                    .unwrap_or_else(|| "graph capture failed on another PE".into());
                disabled.insert(imp);
                stream.synchronize().cuda("cuStreamSynchronize")?;
                let mut r = record(imp);
                // The GEMMs, the kernel and our all-reduce must be capturable; NCCL's
                // all-reduce is reported as not measured.
                r.status = match imp {
                    TpImpl::CublasNccl => Status::Unsupported,
                    _ => Status::Failed,
                };
                r.check = format!("CUDA graph capture failed: {msg}");
                records.push(r);
            }
        }
    }

    // Poisoned again: the outputs checked below are the graph replays' own.
    let timed: Vec<TpImpl> = graphs.iter().map(|(imp, _)| *imp).collect();
    poison(ctx, &bufs, &timed)?;
    timing::step(format!("{what}: warm-up"));
    for (_, graph) in &graphs {
        for _ in 0..warm.div_ceil(graph_ops).max(1) {
            graph.launch().cuda("cuGraphLaunch")?;
        }
    }
    stream.synchronize().cuda("cuStreamSynchronize")?;
    ctx.coord.barrier()?;

    // Alternating blocks of replays, so that a drift of the clocks weighs on all alike; the
    // samples are pooled per implementation.
    timing::step(format!("{what}: timed replays"));
    let order = interleave(graphs.len(), iters, ROUNDS);
    let samples = timer.time_each(
        stream,
        order.len(),
        graph_ops,
        |_| Ok(()),
        |i| graphs[order[i]].1.launch().cuda("cuGraphLaunch"),
    )?;
    let mut pooled = vec![Vec::new(); graphs.len()];
    for (&k, s) in order.iter().zip(samples) {
        pooled[k].push(s);
    }

    timing::step(format!("{what}: unsharded reference"));
    let want = reference(ctx, tp, full, &bufs.x, m, hidden, ffn)?;
    let want = &want[rows];
    timing::step(format!("{what}: checking"));
    let flops = mlp_flops_per_gpu(m, hidden, ffn, n);
    for (imp, samples) in timed.iter().copied().zip(&pooled) {
        let got = bufs.read(imp)?;
        // compute-only and cublas-only leave a partial product when there are several PEs:
        // that one must equal the eager calls' bits, and the reference too on one PE.
        let exact = match imp {
            TpImpl::ComputeOnly => Some(data::compare_elems(&got, &eager_compute)),
            TpImpl::CublasOnly => Some(data::compare_elems(&got, &eager_cublas)),
            _ => None,
        };
        let (mismatch, against) = match exact {
            Some(e) if e.count > 0 || n > 1 => (e, "an eager run of the same calls"),
            _ => (
                data::compare_close(&got, want, tolerance(imp, n)),
                "the unsharded reference",
            ),
        };
        let totals = ctx
            .coord
            .sums(&[mismatch.count, (mismatch.count > 0) as u64])?;
        // Our all-reduce leaves the same bits on every PE.
        let identical = match imp {
            TpImpl::CublasOurs | TpImpl::Overlapped | TpImpl::Fused
                if layout == TpLayout::Replicated =>
            {
                ctx.coord.all_equal(bits_hash(&got))?
            }
            _ => true,
        };
        let mut r = record(imp);
        let mut problems = Vec::new();
        if totals[0] > 0 {
            problems.push(format!(
                "{} elements differ from {against} on {} PE(s); this PE: {}",
                totals[0],
                totals[1],
                mismatch.describe()
            ));
        }
        if !identical {
            problems.push("the output differs between PEs".into());
        }
        if !problems.is_empty() {
            r.status = Status::Failed;
            r.check = problems.join("; ");
        }
        r.time_us = stats::summarize(samples);
        // Positive f64s order as their bits do, so the largest median is a u64 maximum.
        let median_bits = r.median_us().map_or(0, f64::to_bits);
        let slowest = ctx.coord.reduce(ReduceOp::Max, &[median_bits])?[0];
        if let Some(fig) = r.tp.as_mut() {
            fig.tflops_per_gpu = r.time_us.and_then(|t| tflops(flops, t.median));
            fig.slowest_pe_us = (slowest != 0).then(|| f64::from_bits(slowest));
        }
        records.push(r);
    }
    records.sort_by_key(|r| {
        TpImpl::ALL
            .iter()
            .position(|i| i.name() == r.implementation)
    });
    for r in &mut records {
        if let Some(fig) = r.tp.as_mut() {
            fig.auto = r.implementation == auto.name();
        }
    }
    fill_relative(&mut records);
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::tp_record;

    fn cfg(args: &[&str]) -> Config {
        let mut v = vec!["bench"];
        v.extend_from_slice(args);
        Config::from_args(<crate::cli::Args as clap::Parser>::try_parse_from(v).unwrap()).unwrap()
    }

    #[test]
    fn figures_follow_the_definitions() {
        // 6 M hidden ffn, shared by the GPUs.
        let f = mlp_flops_per_gpu(8192, 8192, 28672, 8);
        assert_eq!(f, 6.0 * 8192.0 * 8192.0 * 28672.0 / 8.0);
        assert_eq!(mlp_flops_per_gpu(1, 2, 3, 1), 36.0);
        assert!((tflops(f, 2000.0).unwrap() - f / 2e-3 / 1e12).abs() < 1e-9);
        assert_eq!(tflops(1e6, 1.0), Some(1.0));
        assert_eq!(tflops(1e6, 0.0), None);
        assert_eq!(speedup(30.0, 15.0), Some(2.0));
        assert_eq!(speedup(30.0, 0.0), None);
        assert_eq!(overhead_percent(15.0, 10.0), Some(50.0));
        assert_eq!(overhead_percent(9.0, 10.0), Some(-10.0));
        assert_eq!(overhead_percent(9.0, 0.0), None);
    }

    #[test]
    fn relative_figures_come_from_the_rows_of_one_point() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 64, 40.0),
            tp_record("8b", TpImpl::CublasNccl, 64, 80.0),
            tp_record("8b", TpImpl::CublasOurs, 64, 50.0),
        ];
        // compute-only's slowest PE took 45 us where PE 0 took 40.
        rows[0].tp.as_mut().unwrap().slowest_pe_us = Some(45.0);
        fill_relative(&mut rows);
        let fig = |i: usize| rows[i].tp.unwrap();
        let near = |v: Option<f64>, want: f64| (v.unwrap() - want).abs() < 1e-9;
        assert!(near(fig(0).overhead_slowest_percent, -100.0 / 9.0));
        assert!(near(fig(2).overhead_slowest_percent, 100.0 / 9.0));
        assert_eq!(fig(0).overhead_percent, Some(0.0));
        assert_eq!(fig(1).overhead_percent, Some(100.0));
        assert_eq!(fig(2).overhead_percent, Some(25.0));
        assert_eq!(fig(0).speedup_vs_nccl, Some(2.0));
        assert_eq!(fig(1).speedup_vs_nccl, Some(1.0));
        assert_eq!(fig(2).speedup_vs_nccl, Some(1.6));
        // Without NCCL and compute-only rows there is nothing to compare with.
        let mut alone = vec![tp_record("8b", TpImpl::CublasOurs, 64, 50.0)];
        fill_relative(&mut alone);
        let t = alone[0].tp.unwrap();
        assert_eq!((t.speedup_vs_nccl, t.overhead_percent), (None, None));
        assert_eq!(t.overhead_slowest_percent, None);
    }

    #[test]
    fn replays_alternate_in_rotated_blocks() {
        assert_eq!(
            interleave(3, 4, 2),
            vec![0, 0, 1, 1, 2, 2, 1, 1, 2, 2, 0, 0]
        );
        // Uneven blocks: the first rounds take the remainder.
        assert_eq!(interleave(2, 5, 3), vec![0, 0, 1, 1, 1, 1, 0, 0, 0, 1]);
        // Fewer replays than rounds: one replay per block.
        assert_eq!(interleave(2, 2, 5), vec![0, 1, 1, 0]);
        assert!(interleave(0, 10, 5).is_empty());
        assert!(interleave(3, 0, 5).is_empty());
        for (impls, iters) in [(3, 50), (2, 7), (1, 3), (3, 10)] {
            let order = interleave(impls, iters, ROUNDS);
            for k in 0..impls {
                assert_eq!(order.iter().filter(|&&i| i == k).count(), iters);
            }
        }
    }

    #[test]
    fn impls_follow_the_impls_option() {
        let names = |c: &Config| {
            TpImpl::selected(c)
                .into_iter()
                .map(TpImpl::name)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(&cfg(&["--tests", "tp"])),
            [
                "compute-only",
                "cublas-only",
                "cublas+nccl",
                "cublas+ours",
                "overlapped",
                "fused",
                "cublasmp"
            ]
        );
        assert_eq!(
            names(&cfg(&["--tests", "tp", "--impls", "cublasmp"])),
            ["compute-only", "cublas-only", "cublasmp"]
        );
        assert_eq!(
            names(&cfg(&["--tests", "tp", "--impls", "ours"])),
            [
                "compute-only",
                "cublas-only",
                "cublas+ours",
                "overlapped",
                "fused"
            ]
        );
        assert_eq!(
            names(&cfg(&["--tests", "tp", "--impls", "nvshmem"])),
            ["compute-only", "cublas-only"]
        );
    }

    #[test]
    fn hashes_tell_outputs_apart() {
        let a = [bf16::from_f32(1.0), bf16::from_f32(-2.0)];
        let b = [bf16::from_f32(1.0), bf16::from_f32(-2.015625)];
        assert_eq!(bits_hash(&a), bits_hash(&[a[0], a[1]]));
        assert_ne!(bits_hash(&a), bits_hash(&b));
        assert_ne!(bits_hash(&a), bits_hash(&a[..1]));
    }

    #[test]
    fn the_help_states_the_rounds() {
        use clap::CommandFactory;
        let help = crate::cli::Args::command().render_long_help().to_string();
        assert!(
            help.contains(&format!("split into {ROUNDS} rounds")),
            "the help must match ROUNDS"
        );
    }
}
