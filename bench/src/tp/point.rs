//! One shape and token count measured: every implementation's forward captured in CUDA
//! graphs, replayed in alternating blocks, then checked.

use super::buffers::Buffers;
use super::check::{bits_hash, poison, reference, tolerance};
use super::figures::{mlp_flops_per_gpu, tflops};
use super::mlp::{fresh_data, Mlp, Weights};
use super::ops::{mp_plans, Ops};
use super::{fill_relative, Ctx, TpImpl, TP_TEST};
use crate::cli::{Mode, TpLayout, TpShape};
use crate::cublasmp::Plan;
use crate::data::{self, BenchElem};
use crate::error::{BenchError, CudaExt, Result};
use crate::report::{Record, Status, TpFigures};
use crate::stats;
use crate::timing::{self, Timer};
use cudarc::driver::CudaGraph;
use half::bf16;
use nvshmem::tp::{Schedule, TensorParallel, TUNED_TOKENS};
use nvshmem::ReduceOp;
use std::collections::HashSet;
use std::time::Instant;

/// The timed replays of each implementation are split into this many blocks (fewer when
/// there are fewer replays), alternating between the implementations.
pub const ROUNDS: usize = 5;

/// The order of the timed replays of `impls` implementations, `iters` of each: `rounds`
/// rounds (at most `iters`), each a block of replays of every implementation in turn, the
/// order rotated by one every round. Entry `i` is the implementation of replay `i`.
pub fn interleave(impls: usize, iters: usize, rounds: usize) -> Vec<usize> {
    let rounds = rounds.clamp(1, iters.max(1));
    let mut order = Vec::with_capacity(impls * iters);
    for round in 0..rounds {
        let block = iters / rounds + usize::from(round < iters % rounds);
        for j in 0..impls {
            order.extend(std::iter::repeat_n((j + round) % impls, block));
        }
    }
    order
}

/// One shape and token count: every implementation not switched off, on fresh data, timed in
/// alternating blocks of graph replays, then checked.
#[allow(clippy::too_many_arguments)]
pub(super) fn point(
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
        pipeline: None,
        hybrid: None,
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
    fn the_help_states_the_rounds() {
        use clap::CommandFactory;
        let help = crate::cli::Args::command().render_long_help().to_string();
        assert!(
            help.contains(&format!("split into {ROUNDS} rounds")),
            "the help must match ROUNDS"
        );
    }
}
