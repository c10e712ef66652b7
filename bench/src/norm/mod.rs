//! The all-reduce with the residual add and RMSNorm after it (`--tests norm`), as a Llama
//! decoder layer runs them after each row-parallel layer, for hidden sizes 4096 and 8192 and
//! 1 to 64 tokens:
//! - `fused`: `TensorParallel::all_reduce_rmsnorm` (one kernel where it fuses);
//! - `ours+rmsnorm`: our all-reduce, then `TensorParallel::rmsnorm`;
//! - `nccl+rmsnorm`: NCCL's all-reduce, then the same `rmsnorm`;
//! - `all-reduce`: our all-reduce alone, what the fused call adds to;
//!
//! and the MLP half of a decoder layer with and without it (block.rs).
//!
//! Each in CUDA graphs of `--graph-ops` calls. After the timed replays every implementation
//! runs once more from a fresh residual: `fused` must give the CPU's new residual bit for bit
//! and its output within a bf16 rounding (2^-7 of magnitude plus RMS), and so must
//! `ours+rmsnorm`; `nccl+rmsnorm`, whose sum may round otherwise, within 2^-7 for the residual
//! and 2^-6 for the output; `all-reduce` the CPU's sum bit for bit.

mod block;

pub use block::{BlockImpl, BLOCK_TEST};

use crate::cli::{Config, Impl};
use crate::coord::Coord;
use crate::data::{self, Mismatch};
use crate::error::{BenchError, CudaExt, Guard, Result};
use crate::nccl::Nccl;
use crate::report::{Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem::tp::TensorParallel;
use nvshmem::{AllReduceAlgo, Collectives, DeviceBuffer, Nvshmem, ReduceOp, SymmetricBuffer};
use std::sync::Arc;

/// The `test` of the rows.
pub const NORM_TEST: &str = "norm";
/// Hidden sizes and token counts of the rows.
pub const HIDDEN: [usize; 2] = [4096, 8192];
pub const TOKENS: [usize; 4] = [1, 4, 16, 64];
const EPS: f32 = 1e-5;
/// Data key (`data::key`).
const K_NORM: u64 = 71;

/// The implementations, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormImpl {
    Fused,
    Ours,
    Nccl,
    AllReduce,
}

impl NormImpl {
    pub const ALL: [NormImpl; 4] = [
        NormImpl::Fused,
        NormImpl::Ours,
        NormImpl::Nccl,
        NormImpl::AllReduce,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NormImpl::Fused => "fused",
            NormImpl::Ours => "ours+rmsnorm",
            NormImpl::Nccl => "nccl+rmsnorm",
            NormImpl::AllReduce => "all-reduce",
        }
    }
}

pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    pub collectives: &'a Arc<Collectives>,
    pub nccl: Option<&'a Nccl>,
    pub progress: &'a Progress,
    pub threads: usize,
}

/// One shape's buffers: every PE's input (symmetric), the output, the residual and the
/// weight, and the residual to start from.
struct Case {
    tokens: usize,
    hidden: usize,
    x: Guard<SymmetricBuffer<bf16>>,
    out: Guard<SymmetricBuffer<bf16>>,
    residual: DeviceBuffer<bf16>,
    start: Vec<bf16>,
    weight: DeviceBuffer<bf16>,
    /// The CPU's all-reduce (bf16), new residual and output.
    want_sum: Vec<bf16>,
    want_r: Vec<bf16>,
    want_out: Vec<bf16>,
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    timing::step("norm: setting up the tensor-parallel kernels");
    let tp = crate::tp::group(ctx.shmem, ctx.coord, ctx.collectives, "norm")?;
    let impls: Vec<NormImpl> = NormImpl::ALL
        .into_iter()
        .filter(|i| *i != NormImpl::Nccl || (ctx.nccl.is_some() && ctx.cfg.has_impl(Impl::Nccl)))
        .collect();
    for hidden in HIDDEN {
        for tokens in TOKENS {
            let case = make_case(ctx, tokens, hidden)?;
            for &imp in &impls {
                results.push(measure(ctx, timer, &tp, &case, imp)?);
            }
            let said: Vec<String> = results.records[results.records.len() - impls.len()..]
                .iter()
                .map(|r| {
                    let t = r.median_us().map_or("-".into(), |t| format!("{t:.2}us"));
                    format!("{} {t} {}", r.implementation, r.check)
                })
                .collect();
            ctx.progress
                .say(format!("norm {tokens} x {hidden}: {}", said.join(", ")));
        }
    }
    block::run(ctx, timer, results, &tp)
}

fn make_case(ctx: &Ctx, tokens: usize, hidden: usize) -> Result<Case> {
    let (n, me) = (tokens * hidden, ctx.shmem.my_pe());
    let key = |part: u64| data::key(ctx.cfg.seed, &[K_NORM, tokens as u64, hidden as u64, part]);
    let xs: Vec<Vec<bf16>> = (0..ctx.shmem.n_pes())
        .map(|pe| data::uniform_bf16(key(100 + pe as u64), n, 1.0, ctx.threads))
        .collect();
    let start = data::uniform_bf16(key(1), n, 2.0, ctx.threads);
    let weight: Vec<bf16> = data::uniform_bf16(key(2), hidden, 0.5, ctx.threads)
        .iter()
        .map(|w| bf16::from_f32(1.0 + w.to_f32()))
        .collect();
    // The CPU: the PEs' inputs summed in f32 in PE order and rounded, the residual added and
    // rounded, then the norm in f64.
    let want_sum: Vec<bf16> = (0..n)
        .map(|j| {
            bf16::from_f32(
                xs.iter()
                    .skip(1)
                    .fold(xs[0][j].to_f32(), |a, x| a + x[j].to_f32()),
            )
        })
        .collect();
    let want_r: Vec<bf16> = (0..n)
        .map(|j| bf16::from_f32(want_sum[j].to_f32() + start[j].to_f32()))
        .collect();
    let mut want_out = vec![bf16::ZERO; n];
    for (t, row) in want_r.chunks(hidden).enumerate() {
        let ms = row.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / hidden as f64;
        let scale = 1.0 / (ms + EPS as f64).sqrt();
        for (j, v) in row.iter().enumerate() {
            want_out[t * hidden + j] = bf16::from_f64(v.to_f64() * scale * weight[j].to_f64());
        }
    }
    let x = Guard::new(ctx.shmem.malloc::<bf16>(n)?);
    x.copy_from_host(&xs[me])?;
    let out = Guard::new(ctx.shmem.malloc::<bf16>(n)?);
    let residual = ctx.shmem.alloc_device::<bf16>(n)?;
    let w = ctx.shmem.alloc_device::<bf16>(hidden)?;
    w.copy_from_host(&weight)?;
    ctx.coord.barrier()?;
    Ok(Case {
        tokens,
        hidden,
        x,
        out,
        residual,
        start,
        weight: w,
        want_sum,
        want_r,
        want_out,
    })
}

/// One call of `imp` on `stream`.
fn call(ctx: &Ctx, tp: &TensorParallel, c: &Case, imp: NormImpl) -> Result<()> {
    let s = ctx.stream;
    let coll = ctx.collectives;
    match imp {
        NormImpl::Fused => tp.all_reduce_rmsnorm(&*c.out, &c.residual, &*c.x, &c.weight, EPS, s)?,
        NormImpl::Ours => {
            coll.all_reduce(&*c.out, &*c.x, ReduceOp::Sum, AllReduceAlgo::Auto, s)?;
            tp.rmsnorm(&*c.out, &c.residual, &*c.out, &c.weight, EPS, s)?;
        }
        NormImpl::Nccl => {
            let nccl = ctx
                .nccl
                .ok_or_else(|| BenchError::new("NCCL is not initialised"))?;
            let count = c.tokens * c.hidden;
            // SAFETY: both buffers hold `count` bf16 elements and outlive the call.
            unsafe {
                nccl.all_reduce(
                    c.x.addr(),
                    c.out.addr(),
                    count,
                    cudarc::nccl::sys::ncclDataType_t::ncclBfloat16,
                    s,
                )
            }
            .map_err(BenchError::new)?;
            tp.rmsnorm(&*c.out, &c.residual, &*c.out, &c.weight, EPS, s)?;
        }
        NormImpl::AllReduce => {
            coll.all_reduce(&*c.out, &*c.x, ReduceOp::Sum, AllReduceAlgo::Auto, s)?;
        }
    }
    Ok(())
}

/// A row's measurement: `ops` calls of `call` captured into a graph and replayed (warm-up,
/// then timed), then `reset` and one more call, checked by `check` on every PE. The samples
/// (µs per call), and the row's status and text agreed over the PEs.
pub(super) fn time_and_check(
    ctx: &Ctx,
    timer: &mut Timer,
    bytes: usize,
    reset: impl Fn() -> Result<()>,
    call: impl Fn() -> Result<()>,
    check: impl Fn() -> Result<Mismatch>,
) -> Result<(Vec<f64>, Status, String)> {
    let s = ctx.stream;
    reset()?;
    ctx.coord.barrier()?;
    let ops = ctx.cfg.graph_ops.max(1);
    let graph = timing::capture(s, ops, || call().map_err(|e| e.to_string()));
    let failed = ctx.coord.sum(graph.is_err() as u64)?;
    let mut samples = Vec::new();
    let mut problem = None;
    match (graph, failed) {
        (Ok(g), 0) => {
            let (warm, iters) = ctx.cfg.iters_for(bytes);
            for _ in 0..warm.div_ceil(ops).max(1) {
                g.launch().cuda("cuGraphLaunch")?;
            }
            let launch = |_| g.launch().cuda("cuGraphLaunch");
            samples = timer.time_each(s, iters, ops, |_| Ok(()), launch)?;
        }
        (Err(e), _) => problem = Some(e),
        (Ok(_), _) => problem = Some("graph capture failed on another PE".into()),
    }
    s.synchronize().cuda("cuStreamSynchronize")?;
    ctx.coord.barrier()?;
    let mismatch = match problem {
        Some(_) => Mismatch::default(),
        None => {
            reset()?;
            ctx.coord.barrier()?;
            call()?;
            s.synchronize().cuda("cuStreamSynchronize")?;
            check()?
        }
    };
    let totals = ctx
        .coord
        .sums(&[mismatch.count, (mismatch.count > 0) as u64])?;
    let (status, text) = match (problem, totals[0]) {
        (Some(p), _) => (Status::Failed, p),
        (None, 0) => (Status::Ok, "ok".into()),
        (None, wrong) => (
            Status::Failed,
            format!(
                "{wrong} elements wrong on {} PE(s); this PE: {}",
                totals[1],
                mismatch.describe()
            ),
        ),
    };
    Ok((samples, status, text))
}

fn measure(
    ctx: &Ctx,
    timer: &mut Timer,
    tp: &TensorParallel,
    c: &Case,
    imp: NormImpl,
) -> Result<Record> {
    timing::step(format!("norm: {} {} x {}", imp.name(), c.tokens, c.hidden));
    let bytes = c.tokens * c.hidden * 2;
    let (samples, status, text) = time_and_check(
        ctx,
        timer,
        bytes,
        || Ok(c.residual.copy_from_host(&c.start)?),
        || call(ctx, tp, c, imp),
        || check(c, imp),
    )?;
    Ok(Record {
        test: NORM_TEST.into(),
        variant: format!("hidden {}", c.hidden),
        implementation: imp.name().into(),
        mode: "graph".into(),
        dtype: "bf16".into(),
        bytes,
        count: c.tokens,
        n_pes: ctx.shmem.n_pes(),
        time_us: stats::summarize(&samples),
        algbw_gbs: None,
        busbw_gbs: None,
        status,
        check: text,
        tp: None,
        pipeline: None,
        hybrid: None,
    })
}

/// This PE's results against the CPU's (see the module documentation).
fn check(c: &Case, imp: NormImpl) -> Result<Mismatch> {
    let out = c.out.to_vec()?;
    if imp == NormImpl::AllReduce {
        return Ok(data::compare_elems(&out, &c.want_sum));
    }
    let r = c.residual.to_vec()?;
    let (residual, output) = match imp {
        NormImpl::Nccl => (
            data::compare_close(&r, &c.want_r, 1.0 / 128.0),
            data::compare_close(&out, &c.want_out, 1.0 / 64.0),
        ),
        _ => (
            data::compare_elems(&r, &c.want_r),
            data::compare_close(&out, &c.want_out, 1.0 / 128.0),
        ),
    };
    Ok(if residual.count > 0 { residual } else { output })
}
