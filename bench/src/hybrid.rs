//! The hybrid training step (`--tests hybrid`): examples/hybrid.rs's model (Llama-like MLP
//! blocks: bf16, RMSNorm, residual), 8 blocks of hidden 2048 and FFN 8192, 8 micro-batches of
//! 16 tokens per replica, for each layout of the PEs (on 4 PEs TP2 x PP2, TP2 x DP2 and
//! PP2 x DP2; on 2, TP2, PP2 and DP2; on 8, the same with DP doubled):
//! - `ours`: the step as the example runs it: our layers within a tensor-parallel group,
//!   channels between stages in the 1F1B order, `GradientSync` over the replicas;
//! - `1 GPU`: the whole model on one GPU over every replica's micro-batches (every PE runs
//!   it alone at once; the slowest PE's median counts).
//!
//! A step is the forward and backward pass of every micro-batch, the weight gradients, and
//! their sum over the replicas (no optimizer update), captured in a CUDA graph and timed by
//! replays. Tokens per second count every replica's tokens; scaling efficiency = tokens per
//! second on N PEs / (N x tokens per second on one GPU). Checked after the timed replays:
//! every PE's summed gradients against the single-GPU run's (within the allowance of
//! `worst_ratio`), and every replica's bits the same. The single-GPU run's gradients of the
//! whole model live in symmetric memory: give `NVSHMEM_SYMMETRIC_SIZE=4G` or more.

#[allow(dead_code)]
#[path = "../../examples/common/hybrid/layout.rs"]
mod layout;
#[allow(dead_code)]
#[path = "../../examples/common/hybrid/stage.rs"]
mod stage;
// Its data comes from examples/common/mlp_cpu.rs, which brings its own copy of the
// generator data.rs uses.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../../examples/common/hybrid/weights.rs"]
mod weights;

use crate::cli::Config;
use crate::coord::Coord;
use crate::error::{BenchError, Result};
use crate::report::{HybridFigures, Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::CudaStream;
use half::bf16;
use layout::{Layout, Pipes};
use nvshmem::pipeline::OneFOneB;
use nvshmem::tp::TensorParallel;
use nvshmem::Nvshmem;
use nvshmem::{AllGatherAlgo, Collectives, CollectivesConfig, GradSyncConfig, GradientSync};
use stage::{Sizes, Stage};
use std::sync::Arc;

/// The `test` of the rows.
pub const HYBRID_TEST: &str = "hybrid";
const Z: Sizes = Sizes {
    hidden: 2048,
    ffn: 8192,
    tokens: 16,
};
const BLOCKS: usize = 8;
const MICRO_BATCHES: usize = 8;

pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    pub progress: &'a Progress,
}

/// The layouts `(tp, pp)` of `n` PEs (the replicas take the rest).
pub fn layouts(n: usize) -> Vec<(usize, usize)> {
    [(2, 2), (2, 1), (1, 2), (1, 1)]
        .into_iter()
        .filter(|&(tp, pp)| n.is_multiple_of(tp * pp) && (tp * pp > 1 || n == 2))
        .collect()
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let n = ctx.shmem.n_pes();
    if layouts(n).is_empty() {
        let note = format!("hybrid: no layout of {n} PEs (it needs 2, or a multiple of 4)");
        ctx.progress.say(&note);
        results.notes.push(note);
        return Ok(());
    }
    for (tp, pp) in layouts(n) {
        ctx.progress
            .say(format!("hybrid: tp {tp} x pp {pp} x dp {}", n / (tp * pp)));
        for rec in layout_rows(ctx, timer, (tp, pp))? {
            results.push(rec);
        }
    }
    Ok(())
}

/// The slowest PE's summary of `samples` (µs per step).
fn slowest(ctx: &Ctx, samples: &[f64]) -> Result<Option<stats::Summary>> {
    let all = ctx.coord.gather_summaries(stats::summarize(samples))?;
    Ok(all
        .into_iter()
        .flatten()
        .max_by(|a, b| a.median.total_cmp(&b.median)))
}

/// Time `step` captured in a CUDA graph: µs per replay on this PE.
fn time_step(
    ctx: &Ctx,
    timer: &mut Timer,
    mut step: impl FnMut() -> nvshmem::Result<()>,
) -> Result<Vec<f64>> {
    let graph = timing::capture(ctx.stream, 1, || step().map_err(|e| e.to_string()))
        .map_err(|e| BenchError::new(format!("hybrid: {e}")))?;
    ctx.coord.barrier()?;
    let (warm, iters) = (ctx.cfg.warmup.max(2), ctx.cfg.iters.clamp(5, 50));
    timer.time_graph(ctx.stream, &graph, warm, iters, 1)
}

/// The worst ratio of a gradient's distance from the single-GPU run's to its allowance:
/// 2^-6 of the RMS of the gradient per block (on its way back a gradient passes, in each
/// block, two products and a norm rounded to bf16, 2^-8 each, which the single-GPU run may
/// round the other way, or sum in another order where the GEMM path differs), plus 2^-5 of
/// itself.
fn worst_ratio(got: &[Vec<bf16>], want: &[Vec<bf16>]) -> f64 {
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        let rms =
            (w.iter().map(|x| x.to_f64().powi(2)).sum::<f64>() / w.len().max(1) as f64).sqrt();
        for (g, w) in g.iter().zip(w) {
            let allowed = BLOCKS as f64 * rms / 64.0 + w.to_f64().abs() / 32.0;
            worst = worst.max((g.to_f64() - w.to_f64()).abs() / allowed.max(f64::MIN_POSITIVE));
        }
    }
    worst
}

/// The rows of one layout: `ours`, then `1 GPU`.
fn layout_rows(ctx: &Ctx, timer: &mut Timer, tp_pp: (usize, usize)) -> Result<Vec<Record>> {
    let (shmem, s0) = (ctx.shmem, ctx.stream);
    let at = Layout::new(shmem, tp_pp, BLOCKS, Z.ffn).map_err(BenchError::new)?;
    let (tp, pp, dp, s, d) = (at.tp, at.pp, at.dp, at.s, at.d);
    let world = shmem.team_world();
    let none = |what: &str| BenchError::new(format!("hybrid: this PE is in no {what}"));
    let group = world
        .split_2d(tp)?
        .0
        .ok_or_else(|| none("tensor-parallel group"))?;
    let replicas = world.split_2d(tp * pp)?.1;
    let alone = world.split_2d(1)?.0.ok_or_else(|| none("team of one"))?;
    let tpg = TensorParallel::with_team(shmem, &group)?;
    let mut config = CollectivesConfig::for_pes(dp);
    config.max_blocks = Some(32); // the sync runs beside the weight gradients' GEMMs
    let dp_coll = Collectives::with_team(shmem, replicas.as_ref(), config)?;
    let one = TensorParallel::with_team(shmem, &alone)?;
    let per = BLOCKS / pp;
    let mine = (s * per..(s + 1) * per).map(|b| weights::block(Z, b));
    let stage = Stage::new(shmem, &tpg, Z, MICRO_BATCHES, mine)?;
    let all = (0..BLOCKS).map(|b| weights::block(Z, b));
    let reference = Stage::new(shmem, &one, Z, dp * MICRO_BATCHES, all)?;
    let plain = GradSyncConfig::default();
    let mut sync = GradientSync::<bf16>::new(shmem, &dp_coll, &stage.param_lens(), plain)?;
    let ref_lens = reference.param_lens();
    let mut ref_sync = GradientSync::<bf16>::new(shmem, one.collectives(), &ref_lens, plain)?;
    let pipes = Pipes::new(shmem, at, Z.tokens * Z.hidden)?;
    let steps = OneFOneB::new(pp, MICRO_BATCHES)?.steps(s)?;
    if s == 0 {
        for j in 0..MICRO_BATCHES {
            stage.input(j).copy_from_host(&weights::input(Z, 0, d, j))?;
        }
    }
    for k in 0..dp * MICRO_BATCHES {
        let x = weights::input(Z, 0, k / MICRO_BATCHES, k % MICRO_BATCHES);
        reference.input(k).copy_from_host(&x)?;
    }
    let ours = time_step(ctx, timer, || {
        stage.run_schedule((&steps, &pipes, s), &mut sync, s0)
    })?;
    let single = time_step(ctx, timer, || {
        reference.run_alone(dp * MICRO_BATCHES, &mut ref_sync, s0)
    })?;
    s0.synchronize()
        .map_err(|e| BenchError::new(format!("cuStreamSynchronize: {e}")))?;
    pipes.check()?;

    // The check: this PE's gradients against the single-GPU run's, every replica's the same.
    let grads = |sync: &GradientSync<bf16>, count: usize| -> nvshmem::Result<Vec<Vec<bf16>>> {
        (0..count).map(|p| sync.grad(p).to_vec()).collect()
    };
    let got = grads(&sync, stage.param_lens().len())?;
    let want = weights::shards(
        &grads(&ref_sync, ref_lens.len())?,
        (s * per, per),
        (at.t, tp),
        Z,
    );
    let worst = worst_ratio(&got, &want);
    let (hash, hashes) = (shmem.malloc::<u64>(1)?, shmem.malloc::<u64>(dp)?);
    let h = got.iter().flatten().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
    });
    hash.copy_from_host(&[h])?;
    dp_coll.all_gather(&hashes, &hash, AllGatherAlgo::Auto, s0)?;
    s0.synchronize()
        .map_err(|e| BenchError::new(format!("cuStreamSynchronize: {e}")))?;
    let seen = hashes.to_vec()?;
    let bad = u64::from(worst > 1.0 || seen.iter().any(|&x| x != seen[0]));
    let failed = ctx.coord.sum(bad)?;
    let worst_everywhere = ctx.coord.reduce(
        nvshmem::ReduceOp::Max,
        &[(worst * 1000.0).min(u64::MAX as f64 / 2.0) as u64],
    )?[0] as f64
        / 1000.0;

    let (ours, single) = (slowest(ctx, &ours)?, slowest(ctx, &single)?);
    let n = shmem.n_pes();
    let tokens = dp * MICRO_BATCHES * Z.tokens;
    let figures = |time: Option<&stats::Summary>| HybridFigures {
        tp,
        pp,
        dp,
        tokens_per_step: tokens,
        tokens_per_s: time.map(|t| tokens as f64 / (t.median * 1e-6)),
        scaling_efficiency: match (time, single.as_ref()) {
            (Some(t), Some(one)) => Some(one.median / (n as f64 * t.median)),
            _ => None,
        },
    };
    let record = |imp: &str, time: Option<stats::Summary>, check: String, status| Record {
        test: HYBRID_TEST.into(),
        variant: format!("tp{tp} pp{pp} dp{dp}"),
        implementation: imp.into(),
        mode: "graph".into(),
        dtype: "bf16".into(),
        bytes: 0,
        count: tokens,
        n_pes: if imp == "ours" { n } else { 1 },
        time_us: time,
        algbw_gbs: None,
        busbw_gbs: None,
        status,
        check,
        tp: None,
        pipeline: None,
        hybrid: Some(figures(time.as_ref())),
    };
    let check = match failed {
        0 => format!("ok (gradients {worst_everywhere:.2} of the tolerance)"),
        k => format!(
            "{k} PE(s): gradients {worst_everywhere:.2} of the tolerance from the single-GPU \
             run, or replicas that differ"
        ),
    };
    let status = if failed == 0 {
        Status::Ok
    } else {
        Status::Failed
    };
    Ok(vec![
        record("ours", ours, check, status),
        record("1 GPU", single, "ok (the reference)".into(), Status::Ok),
    ])
}
