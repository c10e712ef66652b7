//! The hybrid training step (`--tests hybrid`): examples/hybrid.rs's model (Llama-like MLP
//! blocks: bf16, RMSNorm, residual), 8 blocks of hidden 2048 and FFN 8192, 8 micro-batches of
//! 16 tokens per replica, for each layout of the PEs (on 4 PEs TP2 x PP2, TP2 x DP2 and
//! PP2 x DP2; on 2, TP2, PP2 and DP2; on 8, the same with DP doubled). Rows:
//! - `ours`: the step as the example runs it: our layers within a tensor-parallel group,
//!   channels between stages in the 1F1B order, `GradientSync` over the replicas;
//! - `nccl`: the same passes with NCCL's calls in their place, on communicators split per
//!   group and per replica column (nccl.rs says which);
//! - `compute`: the same passes with no communication (the step's compute: each row's
//!   communication share is 1 - compute / its step);
//! - `1 GPU`: the whole model on one GPU over every replica's micro-batches (every PE runs
//!   it alone at once; the slowest PE's median counts).
//!
//! A step is the forward and backward pass of every micro-batch, the weight gradients, and
//! their sum over the replicas (no optimizer update), captured in a CUDA graph and timed by
//! replays. Tokens per second count every replica's tokens; scaling efficiency = tokens per
//! second on N PEs / (N x tokens per second on one GPU). Checked after the timed replays
//! (check.rs): `ours`' and `nccl`'s summed gradients on every PE against the single-GPU
//! run's, every replica's bits the same; `compute`'s replays against one more run of it, bit
//! for bit. The single-GPU run's gradients of the whole model live in symmetric memory: give
//! `NVSHMEM_SYMMETRIC_SIZE=4G` or more.

#[allow(dead_code)]
#[path = "../../../examples/common/hybrid/layout.rs"]
mod layout;
#[allow(dead_code)]
#[path = "../../../examples/common/hybrid/stage.rs"]
mod stage;
// Its data comes from examples/common/mlp_cpu.rs, which brings its own copy of the
// generator data.rs uses.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../../../examples/common/hybrid/weights.rs"]
mod weights;

mod check;
mod nccl;

use crate::cli::{Config, Impl};
use crate::coord::Coord;
use crate::error::{BenchError, CudaExt, Result};
use crate::nccl::Nccl;
use crate::report::{HybridFigures, Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use check::Verdict;
use cudarc::driver::CudaStream;
use half::bf16;
use layout::{Groups, Layout, Pipes};
use nccl::{Baseline, Comms};
use nvshmem::pipeline::OneFOneB;
use nvshmem::Nvshmem;
use nvshmem::{GradSyncConfig, GradientSync};
use stage::comm::Ours;
use stage::{Sizes, Stage};
use std::fmt::Display;
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
    /// NCCL over every PE, for the `nccl` rows (none: no such rows).
    pub nccl: Option<&'a Nccl>,
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
    if ctx.nccl.is_none() && ctx.cfg.has_impl(Impl::Nccl) {
        results
            .notes
            .push("hybrid: no nccl rows (NCCL was not initialised)".into());
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

/// One run of `step` (NCCL connects and cuBLASLt chooses on it), waited for.
fn warm_up<E: Display>(
    ctx: &Ctx,
    mut step: impl FnMut() -> std::result::Result<(), E>,
) -> Result<()> {
    step().map_err(|e| BenchError::new(format!("hybrid: {e}")))?;
    ctx.stream.synchronize().cuda("cuStreamSynchronize")
}

/// Time `step` captured in a CUDA graph: µs per replay on this PE.
fn time_step<E: Display>(
    ctx: &Ctx,
    timer: &mut Timer,
    mut step: impl FnMut() -> std::result::Result<(), E>,
) -> Result<Vec<f64>> {
    let graph = timing::capture(ctx.stream, 1, || step().map_err(|e| e.to_string()))
        .map_err(|e| BenchError::new(format!("hybrid: {e}")))?;
    ctx.coord.barrier()?;
    let (warm, iters) = (ctx.cfg.warmup.max(2), ctx.cfg.iters.clamp(5, 50));
    timer.time_graph(ctx.stream, &graph, warm, iters, 1)
}

/// The colours and keys of NCCL's splits for this PE: its tensor-parallel group's, then its
/// replicas' (the same teams as `layout::Groups`', ranked alike).
fn colours(at: Layout) -> [(usize, usize); 2] {
    [(at.d * at.pp + at.s, at.t), (at.s * at.tp + at.t, at.d)]
}

/// NCCL's communicators for `at`, split from `world` (collective over every PE).
fn split(world: &Nccl, at: Layout) -> Result<(Nccl, Nccl)> {
    let [(gc, gk), (rc, rk)] = colours(at);
    let group = world.split(gc, gk)?;
    let replicas = world.split(rc, rk)?;
    if (group.n_ranks(), replicas.n_ranks()) != (at.tp, at.dp) {
        return Err(BenchError::new(format!(
            "hybrid: NCCL's split gave a group of {} and {} replicas; the layout has {} and {}",
            group.n_ranks(),
            replicas.n_ranks(),
            at.tp,
            at.dp
        )));
    }
    Ok((group, replicas))
}

/// The rows of one layout: `ours`, `nccl`, `compute`, `1 GPU`.
fn layout_rows(ctx: &Ctx, timer: &mut Timer, tp_pp: (usize, usize)) -> Result<Vec<Record>> {
    let (shmem, s0) = (ctx.shmem, ctx.stream);
    let at = Layout::new(shmem, tp_pp, BLOCKS, Z.ffn).map_err(BenchError::new)?;
    let (pp, dp, s, d) = (at.pp, at.dp, at.s, at.d);
    let g = Groups::new(shmem, at)?;
    let per = BLOCKS / pp;
    let mine = (s * per..(s + 1) * per).map(|b| weights::block(Z, b));
    let stage = Stage::new(shmem, &g.tp, Z, MICRO_BATCHES, mine)?;
    let all = (0..BLOCKS).map(|b| weights::block(Z, b));
    let reference = Stage::new(shmem, &g.one, Z, dp * MICRO_BATCHES, all)?;
    let (plain, lens) = (GradSyncConfig::default(), stage.param_lens());
    let mut sync = GradientSync::<bf16>::new(shmem, &g.dp, &lens, plain)?;
    let base_sync = GradientSync::<bf16>::new(shmem, &g.dp, &lens, plain)?;
    let ref_lens = reference.param_lens();
    let mut ref_sync = GradientSync::<bf16>::new(shmem, g.one.collectives(), &ref_lens, plain)?;
    let pipes = Pipes::new(shmem, at, Z.tokens * Z.hidden)?;
    let partial = shmem.alloc_device::<bf16>(Z.tokens * Z.hidden)?;
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
    let split = match ctx.nccl {
        Some(world) if ctx.cfg.has_impl(Impl::Nccl) => Some((world, split(world, at)?)),
        _ => None,
    };
    let baseline = |comms| Baseline {
        comms,
        tp: &g.tp,
        at,
        partial: &partial,
        sync: &base_sync,
    };
    let mut times = Vec::new();
    let mut grads = Vec::new();
    if ctx.cfg.has_impl(Impl::Ours) {
        let pipes = Some((&pipes, s));
        let mut step = || {
            stage.run_schedule(
                &steps,
                &mut Ours {
                    pipes,
                    sync: &mut sync,
                },
                s0,
            )
        };
        warm_up(ctx, &mut step)?;
        times.push(("ours", time_step(ctx, timer, step)?));
        grads.push(check::download(&sync, s0)?);
    }
    if let Some((world, (group, replicas))) = &split {
        let comms = Comms {
            world,
            group: (at.tp > 1).then_some(group),
            replicas: (dp > 1).then_some(replicas),
        };
        let step = || stage.run_schedule(&steps, &mut baseline(Some(comms)), s0);
        warm_up(ctx, step)?;
        times.push(("nccl", time_step(ctx, timer, step)?));
        grads.push(check::download(&base_sync, s0)?);
    }
    // The compute alone, replayed over zeroed gradients, then run once more to check them.
    let compute_step = || stage.run_schedule(&steps, &mut baseline(None), s0);
    warm_up(ctx, compute_step)?;
    base_sync
        .grads()
        .copy_from_host(&vec![bf16::ZERO; base_sync.grads().len()])?;
    let compute = time_step(ctx, timer, compute_step)?;
    let replayed = check::download(&base_sync, s0)?;
    warm_up(ctx, compute_step)?;
    let compute_verdict = check::replays(&replayed, &check::download(&base_sync, s0)?);
    let alone = &mut Ours {
        pipes: None,
        sync: &mut ref_sync,
    };
    let mut single_step = || reference.run_alone(dp * MICRO_BATCHES, alone, s0);
    warm_up(ctx, &mut single_step)?;
    let single = time_step(ctx, timer, single_step)?;
    pipes.check()?;

    let want = check::download(&ref_sync, s0)?;
    let want = weights::shards(&want, (s * per, per), (at.t, at.tp), Z);
    let mut verdicts = Vec::new();
    for got in &grads {
        let pair = (got.as_slice(), want.as_slice());
        verdicts.push(check::against((ctx.coord, shmem), &g.dp, pair, BLOCKS, s0)?);
    }
    let compute_verdict = check::everywhere(ctx.coord, compute_verdict)?;

    let compute = slowest(ctx, &compute)?;
    let single = slowest(ctx, &single)?;
    let mut rows = Vec::new();
    for ((imp, samples), verdict) in times.iter().zip(verdicts) {
        let time = slowest(ctx, samples)?;
        let share = match (time.as_ref(), compute.as_ref()) {
            (Some(t), Some(c)) => Some(1.0 - c.median / t.median),
            _ => None,
        };
        rows.push(record(
            ctx,
            at,
            imp,
            (time, share),
            single.as_ref(),
            verdict,
        ));
    }
    rows.push(record(
        ctx,
        at,
        "compute",
        (compute, None),
        single.as_ref(),
        compute_verdict,
    ));
    let reference_row = Verdict::ok("ok (the reference)".into());
    rows.push(record(
        ctx,
        at,
        "1 GPU",
        (single, None),
        single.as_ref(),
        reference_row,
    ));
    Ok(rows)
}

/// A row: `time` (and the communication share) of `imp`, against the single-GPU step.
fn record(
    ctx: &Ctx,
    at: Layout,
    imp: &str,
    (time, comm_share): (Option<stats::Summary>, Option<f64>),
    single: Option<&stats::Summary>,
    verdict: Verdict,
) -> Record {
    let n = ctx.shmem.n_pes();
    let pes = if imp == "1 GPU" { 1 } else { n };
    let tokens = at.dp * MICRO_BATCHES * Z.tokens;
    let figures = HybridFigures {
        tp: at.tp,
        pp: at.pp,
        dp: at.dp,
        tokens_per_step: tokens,
        tokens_per_s: time.map(|t| tokens as f64 / (t.median * 1e-6)),
        scaling_efficiency: match (time, single, pes) {
            (Some(t), Some(one), n) if n > 1 => Some(one.median / (n as f64 * t.median)),
            _ => None,
        },
        comm_share,
    };
    Record {
        test: HYBRID_TEST.into(),
        variant: format!("tp{} pp{} dp{}", at.tp, at.pp, at.dp),
        implementation: imp.into(),
        mode: "graph".into(),
        dtype: "bf16".into(),
        bytes: 0,
        count: tokens,
        n_pes: pes,
        time_us: time,
        algbw_gbs: None,
        busbw_gbs: None,
        status: if verdict.failed {
            Status::Failed
        } else {
            Status::Ok
        },
        check: verdict.text,
        tp: None,
        pipeline: None,
        hybrid: Some(figures),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvshmem::pipeline::Step;

    fn layout(tp: usize, pp: usize, dp: usize, me: usize) -> Layout {
        let (t, s, d) = (me % tp, me / tp % pp, me / (tp * pp));
        Layout {
            tp,
            pp,
            dp,
            t,
            s,
            d,
        }
    }

    #[test]
    fn nccl_splits_make_the_groups_and_replicas_of_the_layout() {
        for (tp, pp, dp) in [
            (2, 2, 1),
            (2, 1, 2),
            (1, 2, 2),
            (2, 2, 2),
            (4, 1, 2),
            (1, 1, 4),
        ] {
            let n = tp * pp * dp;
            let pes: Vec<Layout> = (0..n).map(|me| layout(tp, pp, dp, me)).collect();
            for (which, size) in [(0, tp), (1, dp)] {
                for (me, at) in pes.iter().enumerate() {
                    let (colour, key) = colours(*at)[which];
                    let mut mates: Vec<(usize, usize)> = (0..n)
                        .filter(|&p| colours(pes[p])[which].0 == colour)
                        .map(|p| (colours(pes[p])[which].1, p))
                        .collect();
                    mates.sort();
                    let want: Vec<usize> = match which {
                        0 => (0..tp).map(|t| at.pe(at.d, at.s, t)).collect(),
                        _ => (0..dp).map(|d| at.pe(d, at.s, at.t)).collect(),
                    };
                    let got: Vec<usize> = mates.iter().map(|&(_, p)| p).collect();
                    assert_eq!(got, want, "tp {tp} pp {pp} dp {dp} PE {me} split {which}");
                    assert_eq!(mates.len(), size);
                    assert_eq!(mates[key].1, me, "PE {me}'s rank is its key");
                }
            }
        }
    }

    /// NCCL runs a group's transfers at once: none may receive into the buffer another sends
    /// from (a stage sends activations from and receives gradients into its outputs), and
    /// the groups must not deadlock.
    #[test]
    fn no_nccl_group_receives_into_what_it_sends_and_none_deadlocks() {
        // The check can fail: the pipeline's pairs do.
        let s = OneFOneB::new(2, 1).unwrap().steps(0).unwrap();
        let pair = vec![Step::SendActivation(0), Step::RecvGradient(0)];
        assert!(crate::pipeline::nccl_groups(&s).contains(&pair));
        for pp in 1..=8 {
            for m in 1..=12 {
                let ok = crate::pipeline::rendezvous_completes(pp, m, nccl::groups);
                assert!(ok, "pp {pp} m {m} deadlocks");
                let schedule = OneFOneB::new(pp, m).unwrap();
                for s in 0..pp {
                    for group in nccl::groups(&schedule.steps(s).unwrap()) {
                        for a in &group {
                            if let Step::SendActivation(j) = a {
                                assert!(!group.contains(&Step::RecvGradient(*j)), "pp {pp} m {m}");
                            }
                        }
                    }
                }
            }
        }
    }
}
