//! Collectives: our kernels vs NVSHMEM's on-stream collectives vs NCCL, plain and in CUDA
//! graphs, checked against a CPU reference at every size.

use crate::cli::{format_size, Config, DType, Impl, Mode};
use crate::coord::Coord;
use crate::data::{self, BenchElem};
use crate::error::{BenchError, CudaExt, Guard, Result};
use crate::nccl::{Nccl, SymmetricWindow};
use crate::report::{Record, Results, Status};
use crate::stats::{self, busbw_factor, Collective};
use crate::teams::Place;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem::team::collectives::{
    reduce_scatter_max_bytes, reduce_scratch_bytes, REDUCE_SCRATCH_VARIABLE,
};
use nvshmem::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Collectives, Nvshmem, ReduceOp,
    ReduceScatterAlgo, SymmetricBuffer, Team,
};
use std::collections::HashSet;
use std::sync::Arc;

/// What the collective benchmarks run with.
pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    pub ours: Option<&'a Collectives>,
    /// With `--team-size`: this PE's place in its team (`ours` runs over it).
    pub team: Option<Place>,
    pub nccl: Option<&'a Nccl>,
    pub progress: &'a Progress,
    /// CPU threads for the reference computation.
    pub threads: usize,
}

impl Ctx<'_> {
    /// This PE's number and the PE count that a call's data is laid out by: in its team with
    /// `--team-size`, else in the world.
    fn place(&self) -> Place {
        self.team.unwrap_or(Place {
            me: self.shmem.my_pe(),
            n: self.shmem.n_pes(),
            first: 0,
            teams: 1,
        })
    }
}

/// Where an implementation's operands live: our symmetric buffers, or for nccl-symm NCCL's
/// registered windows of the same sizes.
struct Operands<'a, T: BenchElem> {
    src: &'a SymmetricBuffer<T>,
    dst: &'a SymmetricBuffer<T>,
    windows: Option<(&'a SymmetricWindow<'a>, &'a SymmetricWindow<'a>)>,
}

impl<T: BenchElem> Operands<'_, T> {
    /// The source and destination addresses `imp` works on.
    fn pointers(&self, imp: Impl) -> Result<(u64, u64), String> {
        match (imp, self.windows) {
            (Impl::NcclSymm, Some((src, dst))) => Ok((src.addr(), dst.addr())),
            (Impl::NcclSymm, None) => Err("no symmetric windows for nccl-symm".into()),
            _ => Ok((self.src.addr(), self.dst.addr())),
        }
    }

    /// This PE's input into `imp`'s source, its destination poisoned (0xFF bytes); waits.
    fn prepare(&self, imp: Impl, input: &[T], stream: &CudaStream) -> Result<()> {
        let (src, dst) = self.pointers(imp).map_err(BenchError::new)?;
        // SAFETY: both operands hold these sizes (the windows as many bytes as the buffers),
        // and the copies are waited for before `input` can go.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(src, input, stream.cu_stream())
                .cuda("cuMemcpyHtoDAsync")?;
            cudarc::driver::result::memset_d8_async(
                dst,
                0xff,
                self.dst.num_bytes(),
                stream.cu_stream(),
            )
            .cuda("cuMemsetD8Async")?;
        }
        stream.synchronize().cuda("cuStreamSynchronize")
    }

    /// `imp`'s destination, after the work on `stream`.
    fn result(&self, imp: Impl, stream: &CudaStream) -> Result<Vec<T>> {
        let (_, dst) = self.pointers(imp).map_err(BenchError::new)?;
        stream.synchronize().cuda("cuStreamSynchronize")?;
        let mut out = vec![T::default(); self.dst.len()];
        // SAFETY: the destination holds dst.len() elements; the copy is waited for.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, dst, stream.cu_stream()) }
            .cuda("cuMemcpyDtoHAsync")?;
        stream.synchronize().cuda("cuStreamSynchronize")?;
        Ok(out)
    }
}

/// Enqueues one operation of an implementation (copyable, so timing closures can hold it).
#[derive(Clone, Copy)]
struct Ops<'a> {
    ours: Option<&'a Collectives>,
    all_reduce_algo: AllReduceAlgo,
    all_gather_algo: AllGatherAlgo,
    reduce_scatter_algo: ReduceScatterAlgo,
    broadcast_algo: BroadcastAlgo,
    all_to_all_algo: AllToAllAlgo,
    nccl: Option<&'a Nccl>,
    world: &'a Team,
}

impl Ops<'_> {
    /// Errors come back as text: a failure to enqueue is reported, and fatal only if the PEs
    /// disagree.
    fn enqueue<T: BenchElem>(
        &self,
        coll: Collective,
        imp: Impl,
        operands: &Operands<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), String> {
        let (src, dst) = (operands.src, operands.dst);
        match imp {
            Impl::Ours => {
                let ours = self.ours.ok_or("our collectives are not loaded")?;
                let r = match coll {
                    Collective::AllReduce => {
                        ours.all_reduce(dst, src, ReduceOp::Sum, self.all_reduce_algo, stream)
                    }
                    Collective::AllGather => {
                        ours.all_gather(dst, src, self.all_gather_algo, stream)
                    }
                    Collective::ReduceScatter => ours.reduce_scatter(
                        dst,
                        src,
                        ReduceOp::Sum,
                        self.reduce_scatter_algo,
                        stream,
                    ),
                    Collective::Broadcast => {
                        ours.broadcast(dst, src, BROADCAST_ROOT, self.broadcast_algo, stream)
                    }
                    Collective::AllToAll => ours.all_to_all(dst, src, self.all_to_all_algo, stream),
                };
                r.map_err(|e| e.to_string())
            }
            Impl::Nvshmem => {
                // nvshmemx_<type>_sum_reduce_on_stream / nvshmemx_<type>_fcollect_on_stream /
                // nvshmemx_<type>_sum_reducescatter_on_stream
                let r = match coll {
                    Collective::AllReduce => self.world.all_reduce(dst, src, ReduceOp::Sum, stream),
                    Collective::AllGather => self.world.all_gather(dst, src, stream),
                    Collective::ReduceScatter => {
                        self.world.reduce_scatter(dst, src, ReduceOp::Sum, stream)
                    }
                    Collective::Broadcast => self.world.broadcast(dst, src, BROADCAST_ROOT, stream),
                    Collective::AllToAll => self.world.all_to_all(dst, src, stream),
                };
                r.map_err(|e| e.to_string())
            }
            Impl::Nccl | Impl::NcclSymm => {
                let nccl = self.nccl.ok_or("NCCL is not initialised")?;
                let (src_ptr, dst_ptr) = operands.pointers(imp)?;
                // SAFETY: the operands hold src.len() and dst.len() elements of T, and
                // dst.len() is src.len() (all-reduce, broadcast, all-to-all), src.len() * PEs
                // (all-gather) or src.len() / PEs (reduce-scatter).
                unsafe {
                    match coll {
                        Collective::AllReduce => {
                            nccl.all_reduce(src_ptr, dst_ptr, src.len(), T::NCCL, stream)
                        }
                        Collective::AllGather => {
                            nccl.all_gather(src_ptr, dst_ptr, src.len(), T::NCCL, stream)
                        }
                        Collective::ReduceScatter => {
                            nccl.reduce_scatter(src_ptr, dst_ptr, dst.len(), T::NCCL, stream)
                        }
                        Collective::Broadcast => nccl.broadcast(
                            src_ptr,
                            dst_ptr,
                            src.len(),
                            T::NCCL,
                            BROADCAST_ROOT,
                            stream,
                        ),
                        Collective::AllToAll => {
                            let block = src.num_bytes() / self.world.n_pes();
                            nccl.all_to_all(src_ptr, dst_ptr, block, stream)
                        }
                    }
                }
            }
            Impl::Cublasmp => Err("cuBLASMp has no collectives of its own here".into()),
        }
    }
}

/// The broadcasts' root.
const BROADCAST_ROOT: usize = 0;

/// The largest NCCL all-to-all (a grouped send/recv per peer) measured to complete when
/// replayed from a CUDA graph, with NCCL 2.28.9 on H200s: 256 MiB never completes, on 4 PEs
/// (64 MiB blocks) as on 2 (128 MiB blocks), even one call to a graph; 192 MiB on 4 PEs and
/// 128 MiB on 2 do, and the same calls launched plainly complete at every size.
const NCCL_GRAPH_ALL_TO_ALL_MAX_BYTES: usize = 192 << 20;

/// Whether `imp`'s graph of `coll` over `bytes` is one that never completes. NCCL on
/// symmetric windows (`nccl-symm`) completed the same 256 MiB graph on 2 PEs.
fn nccl_graph_hangs(coll: Collective, imp: Impl, bytes: usize) -> bool {
    coll == Collective::AllToAll && imp == Impl::Nccl && bytes > NCCL_GRAPH_ALL_TO_ALL_MAX_BYTES
}

/// Implementations switched off after they failed: (collective, impl, dtype, mode or None
/// for every mode).
type Disabled = HashSet<(Collective, Impl, &'static str, Option<Mode>)>;

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let mut disabled = Disabled::new();
    let scratch = match ctx.cfg.tests.reducescatter && ctx.cfg.has_impl(Impl::Nvshmem) {
        true => Some(reduce_scratch_on_every_pe(ctx)?),
        false => None,
    };
    for coll in Collective::ALL {
        let selected = match coll {
            Collective::AllReduce => ctx.cfg.tests.allreduce,
            Collective::AllGather => ctx.cfg.tests.allgather,
            Collective::ReduceScatter => ctx.cfg.tests.reducescatter,
            Collective::Broadcast => ctx.cfg.tests.broadcast,
            Collective::AllToAll => ctx.cfg.tests.alltoall,
        };
        if !selected {
            continue;
        }
        // The largest size NVSHMEM's implementation can take.
        let nvshmem_max = match (coll, scratch) {
            (Collective::ReduceScatter, Some(bytes)) => {
                reduce_scatter_max_bytes(bytes, ctx.shmem.n_pes())
            }
            _ => usize::MAX,
        };
        for &dtype in &ctx.cfg.dtypes {
            match dtype {
                DType::Bf16 => {
                    run_type::<bf16>(ctx, timer, results, &mut disabled, coll, nvshmem_max)?
                }
                DType::F32 => {
                    run_type::<f32>(ctx, timer, results, &mut disabled, coll, nvshmem_max)?
                }
            }
        }
    }
    Ok(())
}

/// NVSHMEM's reduction scratch on every PE: the smallest of the PEs' (a value NVSHMEM would
/// not take counts as none).
fn reduce_scratch_on_every_pe(ctx: &Ctx) -> Result<usize> {
    let var = std::env::var(REDUCE_SCRATCH_VARIABLE).ok();
    let mine = reduce_scratch_bytes(var.as_deref()).unwrap_or(0);
    let least = ctx.coord.reduce(ReduceOp::Min, &[mine as u64])?[0];
    Ok(usize::try_from(least).unwrap_or(usize::MAX))
}

/// The note on the sizes that NVSHMEM's implementation of `coll` did not run (ascending,
/// not empty) because they exceed `max` bytes.
fn nvshmem_skipped_note(coll: Collective, dtype: &str, sizes: &[usize], max: usize) -> String {
    let (first, last) = (sizes[0], sizes[sizes.len() - 1]);
    let which = if first == last {
        format!("size {}", format_size(first))
    } else {
        format!(
            "{} sizes, {} to {}",
            sizes.len(),
            format_size(first),
            format_size(last)
        )
    };
    format!(
        "{} {dtype}: nvshmem not run at {which}: NVSHMEM's reduce-scatter stages the whole \
         input in half of its reduction scratch, {} here; set NVSHMEM_REDUCE_SCRATCH_SIZE to at \
         least {} on every PE to run them (NVSHMEM reserves it for each of NVSHMEM_MAX_TEAMS \
         teams)",
        coll.name(),
        format_size(max),
        format_size(2 * last)
    )
}

fn dtype_id(name: &str) -> u64 {
    data::hash_bytes(name.as_bytes())
}

fn run_type<T: BenchElem>(
    ctx: &Ctx,
    timer: &mut Timer,
    results: &mut Results,
    disabled: &mut Disabled,
    coll: Collective,
    nvshmem_max: usize,
) -> Result<()> {
    let Place { me, n, first, .. } = ctx.place();
    let elem = std::mem::size_of::<T>();
    let sizes = &ctx.cfg.sizes;
    let mut skipped = Vec::new();
    let mut nvshmem_skipped = Vec::new();
    for (index, &size) in sizes.iter().enumerate() {
        // nccl-tests: the size is the all-reduce buffer, the all-gather output or the
        // reduce-scatter input; `count` is the elements of one PE's block in the latter two.
        let (count, bytes) = match coll {
            Collective::AllReduce | Collective::Broadcast => (size / elem, (size / elem) * elem),
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                (size / (elem * n), (size / (elem * n)) * elem * n)
            }
        };
        if count == 0 {
            skipped.push(size);
            continue;
        }
        // Each team's data is its own (its first PE in the key).
        let parts = [coll as u64, dtype_id(T::NAME), bytes as u64, first as u64];
        let key = data::key(ctx.cfg.seed, &parts[..3 + usize::from(ctx.team.is_some())]);
        let (input, expected) = match coll {
            Collective::AllReduce => data::allreduce_case::<T>(key, me, n, count, ctx.threads),
            Collective::AllGather => data::allgather_case::<T>(key, me, n, count, ctx.threads),
            Collective::ReduceScatter => {
                data::reducescatter_case::<T>(key, me, n, count, ctx.threads)
            }
            Collective::Broadcast => {
                data::broadcast_case::<T>(key, me, BROADCAST_ROOT, count, ctx.threads)
            }
            Collective::AllToAll => data::alltoall_case::<T>(key, me, n, count, ctx.threads),
        };
        let src = Guard::new(ctx.shmem.malloc::<T>(input.len())?);
        let dst = Guard::new(ctx.shmem.malloc::<T>(expected.len())?);
        // nccl-symm's operands: windows of the same sizes (collective), while NCCL takes them.
        let windows = match (ctx.nccl, ctx.cfg.has_impl(Impl::NcclSymm)) {
            (Some(nccl), true) if !disabled.contains(&(coll, Impl::NcclSymm, T::NAME, None)) => {
                symmetric_windows(ctx, nccl, src.num_bytes(), dst.num_bytes())?
            }
            _ => Err("nccl-symm is not selected, or NCCL refused its windows".into()),
        };
        let first = results.records.len();
        for imp in ctx.cfg.collective_impls() {
            if imp == Impl::Nvshmem && bytes > nvshmem_max {
                nvshmem_skipped.push(bytes);
                continue;
            }
            if imp == Impl::NcclSymm {
                if let Err(why) = &windows {
                    if !disabled.contains(&(coll, imp, T::NAME, None)) {
                        let note = format!("nccl-symm {} {}: not run: {why}", coll.name(), T::NAME);
                        ctx.progress.say(&note);
                        results.notes.push(note);
                        disabled.insert((coll, imp, T::NAME, None));
                    }
                    continue;
                }
            }
            let operands = Operands {
                src: &src,
                dst: &dst,
                windows: windows.as_ref().ok().map(|(s, d)| (s, d)),
            };
            for &mode in &ctx.cfg.modes {
                if disabled.contains(&(coll, imp, T::NAME, None))
                    || disabled.contains(&(coll, imp, T::NAME, Some(mode)))
                {
                    continue;
                }
                let rec = point(
                    ctx, timer, disabled, coll, imp, mode, &operands, bytes, count, &input,
                    &expected,
                )?;
                results.push(rec);
            }
        }
        ctx.progress.say(progress_line(
            coll,
            T::NAME,
            index + 1,
            sizes.len(),
            bytes,
            &results.records[first..],
        ));
        drop(windows);
        drop(dst);
        drop(src);
    }
    if !skipped.is_empty() {
        let note = format!(
            "{} {}: sizes {} skipped (less than one element per PE)",
            coll.name(),
            T::NAME,
            skipped
                .iter()
                .map(|&s| format_size(s))
                .collect::<Vec<_>>()
                .join(", ")
        );
        ctx.progress.say(&note);
        results.notes.push(note);
    }
    if !nvshmem_skipped.is_empty() {
        let note = nvshmem_skipped_note(coll, T::NAME, &nvshmem_skipped, nvshmem_max);
        ctx.progress.say(&note);
        results.notes.push(note);
    }
    Ok(())
}

/// NCCL's symmetric windows for a case's source and destination, made on every PE; `Err`
/// (with why) on every PE when any PE's NCCL refused them, so all PEs skip nccl-symm alike.
#[allow(clippy::type_complexity)]
fn symmetric_windows<'a>(
    ctx: &Ctx,
    nccl: &'a Nccl,
    src_bytes: usize,
    dst_bytes: usize,
) -> Result<Result<(SymmetricWindow<'a>, SymmetricWindow<'a>), String>> {
    let made = nccl
        .symmetric_window(src_bytes)
        .and_then(|s| Ok((s, nccl.symmetric_window(dst_bytes)?)));
    let refused = ctx.coord.sum(made.is_err() as u64)?;
    Ok(match (made, refused) {
        (Ok(w), 0) => Ok(w),
        (Ok(_), r) => Err(format!("NCCL refused symmetric windows on {r} PE(s)")),
        (Err(e), _) => Err(e),
    })
}

fn progress_line(
    coll: Collective,
    dtype: &str,
    i: usize,
    total: usize,
    bytes: usize,
    recs: &[Record],
) -> String {
    let mut parts = Vec::new();
    for imp in ["ours", "nvshmem", "nccl", "nccl-symm"] {
        let times: Vec<String> = recs
            .iter()
            .filter(|r| r.implementation == imp)
            .map(|r| match (r.status, r.median_us()) {
                (Status::Ok, Some(t)) => format!("{} {t:.2}us", r.mode),
                (Status::Failed, Some(t)) => format!("{} {t:.2}us WRONG", r.mode),
                (Status::Unsupported, _) => format!("{} n/a", r.mode),
                _ => format!("{} FAILED", r.mode),
            })
            .collect();
        if !times.is_empty() {
            parts.push(format!("{imp}: {}", times.join(", ")));
        }
    }
    format!(
        "{} {dtype} [{i}/{total}] {}: {}",
        coll.name(),
        format_size(bytes),
        parts.join(" | ")
    )
}

#[allow(clippy::too_many_arguments)]
fn point<T: BenchElem>(
    ctx: &Ctx,
    timer: &mut Timer,
    disabled: &mut Disabled,
    coll: Collective,
    imp: Impl,
    mode: Mode,
    operands: &Operands<T>,
    bytes: usize,
    count: usize,
    input: &[T],
    expected: &[T],
) -> Result<Record> {
    // The PEs the call runs over (its team's with --team-size), and every PE's count, which
    // the sums over PEs below take.
    let (n, world_n) = (ctx.place().n, ctx.shmem.n_pes());
    let stream = ctx.stream;
    let world = ctx.shmem.team_world();
    let ops = Ops {
        ours: ctx.ours,
        all_reduce_algo: ctx.cfg.algo,
        all_gather_algo: ctx.cfg.allgather_algo,
        reduce_scatter_algo: ctx.cfg.reducescatter_algo,
        broadcast_algo: ctx.cfg.broadcast_algo,
        all_to_all_algo: ctx.cfg.alltoall_algo,
        nccl: ctx.nccl,
        world: &world,
    };
    let mut record = Record {
        test: coll.name().into(),
        variant: ctx.team.map(|t| t.variant()).unwrap_or_default(),
        implementation: imp.name().into(),
        mode: mode.name().into(),
        dtype: T::NAME.into(),
        bytes,
        count,
        n_pes: n,
        time_us: None,
        algbw_gbs: None,
        busbw_gbs: None,
        status: Status::Ok,
        check: "ok".into(),
        tp: None,
        pipeline: None,
        hybrid: None,
    };
    let what = format!(
        "{} {} {} {} {}",
        imp.name(),
        coll.name(),
        T::NAME,
        mode.name(),
        format_size(bytes)
    );
    let fatal = |e: String| BenchError::new(format!("{what}: {e}"));
    timing::step(what.clone());

    // This PE's input (again: no implementation may depend on what another left behind), a
    // poisoned output, then start together.
    ctx.shmem
        .context()
        .bind_to_thread()
        .cuda("cuCtxSetCurrent")?;
    operands.prepare(imp, input, stream)?;
    ctx.coord.barrier()?;

    // The first operation doubles as a probe: an implementation that refuses on every PE is
    // reported and switched off; one that refuses on some PEs only leaves the others waiting.
    let probe = std::time::Instant::now();
    let first = ops.enqueue(coll, imp, operands, stream);
    if first.is_ok() {
        stream.synchronize().cuda("cuStreamSynchronize")?;
    }
    let probe_ns = probe.elapsed().as_nanos() as u64;
    let refused = ctx.coord.sum(first.is_err() as u64)?;
    if refused > 0 {
        let msg = first
            .err()
            .unwrap_or_else(|| "refused on another PE".into());
        if refused as usize != world_n {
            return Err(fatal(format!(
                "failed on {refused} of {world_n} PEs ({msg}); the others cannot continue"
            )));
        }
        disabled.insert((coll, imp, T::NAME, None));
        record.status = Status::Failed;
        record.check = format!("could not run: {msg}");
        return Ok(record);
    }

    // The first operation's time (averaged over the PEs, so all choose alike) sizes the case;
    // when it looks slow, a second one is timed, as the first can include one-time set-up.
    let mut probe_us = ctx.coord.sum(probe_ns)? as f64 / world_n as f64 / 1e3;
    if probe_us > 1000.0 {
        let again = std::time::Instant::now();
        ops.enqueue(coll, imp, operands, stream).map_err(fatal)?;
        stream.synchronize().cuda("cuStreamSynchronize")?;
        let ns = again.elapsed().as_nanos() as u64;
        probe_us = ctx.coord.sum(ns)? as f64 / world_n as f64 / 1e3;
    }
    let (warm, iters, graph_ops) = ctx.cfg.budgeted(bytes, probe_us, mode == Mode::Graph);
    let samples = match mode {
        Mode::Plain => {
            for _ in 1..warm {
                ops.enqueue(coll, imp, operands, stream).map_err(fatal)?;
            }
            timer.time_each(
                stream,
                iters,
                1,
                |_| Ok(()),
                |_| ops.enqueue(coll, imp, operands, stream).map_err(fatal),
            )?
        }
        Mode::Graph if nccl_graph_hangs(coll, imp, bytes) => {
            // Not captured: the replay never ends (measured with NCCL 2.28.9 on H200s).
            stream.synchronize().cuda("cuStreamSynchronize")?;
            record.status = Status::Unsupported;
            record.check = format!(
                "not run: NCCL's all-to-all of {} (a grouped send/recv per peer), captured in \
                 a CUDA graph, never completes (NCCL 2.28.9; 192 MiB does)",
                format_size(bytes)
            );
            return Ok(record);
        }
        Mode::Graph => {
            let graph = timing::capture(stream, graph_ops, || {
                ops.enqueue(coll, imp, operands, stream)
            });
            let failed = ctx.coord.sum(graph.is_err() as u64)?;
            let graph = match graph {
                Ok(g) if failed == 0 => g,
                other => {
                    let msg = other
                        .err()
                        .unwrap_or_else(|| "graph capture failed on another PE".into());
                    disabled.insert((coll, imp, T::NAME, Some(Mode::Graph)));
                    stream.synchronize().cuda("cuStreamSynchronize")?;
                    // Our kernels must be capturable; the others are reported as not measured.
                    record.status = if imp == Impl::Ours {
                        Status::Failed
                    } else {
                        Status::Unsupported
                    };
                    record.check = format!("CUDA graph capture failed: {msg}");
                    return Ok(record);
                }
            };
            timer.time_graph(stream, &graph, warm, iters, graph_ops)?
        }
    };

    // Check the result of the last timed operation on every PE.
    let got = operands.result(imp, stream)?;
    let mismatch = data::compare_elems(&got, expected);
    let totals = ctx
        .coord
        .sums(&[mismatch.count, (mismatch.count > 0) as u64])?;
    if totals[0] > 0 {
        record.status = Status::Failed;
        record.check = format!(
            "{} wrong elements on {} PE(s); this PE: {}",
            totals[0],
            totals[1],
            mismatch.describe()
        );
    }
    record.time_us = stats::summarize(&samples);
    if let Some(t) = record.time_us {
        let alg = stats::algbw_gbs(bytes as f64, t.median);
        record.algbw_gbs = Some(alg);
        record.busbw_gbs = Some(alg * busbw_factor(coll, n));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nccls_large_graphed_all_to_all_is_left_out() {
        let mib = 1 << 20;
        assert!(nccl_graph_hangs(
            Collective::AllToAll,
            Impl::Nccl,
            256 * mib
        ));
        assert!(!nccl_graph_hangs(
            Collective::AllToAll,
            Impl::Nccl,
            192 * mib
        ));
        assert!(!nccl_graph_hangs(
            Collective::AllToAll,
            Impl::NcclSymm,
            256 * mib
        ));
        assert!(!nccl_graph_hangs(
            Collective::AllToAll,
            Impl::Ours,
            256 * mib
        ));
        assert!(!nccl_graph_hangs(
            Collective::AllReduce,
            Impl::Nccl,
            256 * mib
        ));
    }

    #[test]
    fn the_skipped_sizes_note_says_how_to_run_them() {
        let note = nvshmem_skipped_note(
            Collective::ReduceScatter,
            "bf16",
            &[512 << 10, 1 << 20, 256 << 20],
            256 << 10,
        );
        assert!(
            note.starts_with("reducescatter bf16: nvshmem not run at 3 sizes, 512 KiB to 256 MiB")
        );
        assert!(note.contains("256 KiB here") && note.contains("at least 512 MiB"));
        assert!(note.contains("NVSHMEM_REDUCE_SCRATCH_SIZE"));
        let one = nvshmem_skipped_note(Collective::ReduceScatter, "f32", &[1 << 20], 256 << 10);
        assert!(one.contains("nvshmem not run at size 1 MiB:"), "{one}");
    }
}
