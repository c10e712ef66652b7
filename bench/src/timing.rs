//! CUDA-event timing of stream work, and CUDA-graph capture.

use crate::error::{CudaExt, Result};
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaEvent, CudaGraph, CudaStream};
use std::sync::Arc;

/// A pool of timing events.
pub struct Timer {
    ctx: Arc<CudaContext>,
    events: Vec<CudaEvent>,
}

impl Timer {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Timer {
            ctx,
            events: Vec::new(),
        }
    }

    fn ensure(&mut self, n: usize) -> Result<()> {
        while self.events.len() < n {
            let e = self
                .ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .cuda("cuEventCreate")?;
            self.events.push(e);
        }
        Ok(())
    }

    /// For `i` in `0..n`: `pre(i)` (untimed), then `op(i)` between two events on `stream`.
    /// Waits for the stream and returns the time of each `op` in microseconds divided by
    /// `per` (the number of operations one `op` call enqueues).
    pub fn time_each(
        &mut self,
        stream: &CudaStream,
        n: usize,
        per: usize,
        mut pre: impl FnMut(usize) -> Result<()>,
        mut op: impl FnMut(usize) -> Result<()>,
    ) -> Result<Vec<f64>> {
        self.ensure(2 * n)?;
        for i in 0..n {
            pre(i)?;
            self.events[2 * i].record(stream).cuda("cuEventRecord")?;
            op(i)?;
            self.events[2 * i + 1]
                .record(stream)
                .cuda("cuEventRecord")?;
        }
        stream.synchronize().cuda("cuStreamSynchronize")?;
        let per = per.max(1) as f64;
        (0..n)
            .map(|i| {
                let ms = self.events[2 * i]
                    .elapsed_ms(&self.events[2 * i + 1])
                    .cuda("cuEventElapsedTime")?;
                Ok(ms as f64 * 1e3 / per)
            })
            .collect()
    }
}

impl Timer {
    /// `graph` (of `graph_ops` operations) replayed for a warm-up of `warm` operations (whole
    /// graphs, at least one), then `iters` times, each timed: microseconds per operation.
    pub fn time_graph(
        &mut self,
        stream: &CudaStream,
        graph: &CudaGraph,
        warm: usize,
        iters: usize,
        graph_ops: usize,
    ) -> Result<Vec<f64>> {
        for _ in 0..warm.div_ceil(graph_ops).max(1) {
            graph.launch().cuda("cuGraphLaunch")?;
        }
        self.time_each(
            stream,
            iters,
            graph_ops,
            |_| Ok(()),
            |_| graph.launch().cuda("cuGraphLaunch"),
        )
    }
}

/// Capture `ops` calls of `op` on `stream` into an instantiated, uploaded CUDA graph.
/// Errors come back as text (capture problems are reported, not fatal).
pub fn capture(
    stream: &Arc<CudaStream>,
    ops: usize,
    mut op: impl FnMut() -> Result<(), String>,
) -> Result<CudaGraph, String> {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| format!("cuStreamBeginCapture failed: {e}"))?;
    let mut failed = None;
    for _ in 0..ops {
        if let Err(e) = op() {
            failed = Some(e);
            break;
        }
    }
    // Always end the capture, so the stream is usable again.
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    if let Some(e) = failed {
        return Err(format!("enqueueing during capture failed: {e}"));
    }
    let graph = match ended {
        Ok(Some(g)) => g,
        Ok(None) => return Err("the capture produced no graph".into()),
        Err(e) => return Err(format!("cuStreamEndCapture/cuGraphInstantiate failed: {e}")),
    };
    graph
        .upload()
        .map_err(|e| format!("cuGraphUpload failed: {e}"))?;
    Ok(graph)
}

/// Host wall-clock timing of `op` for `n` calls, in microseconds.
pub fn time_host(n: usize, mut op: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        op()?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(out)
}

/// What this PE is doing now, and since when (for the watchdog).
static STEP: std::sync::Mutex<Option<(std::time::Instant, String)>> = std::sync::Mutex::new(None);

/// Note the start of a step of the benchmark.
pub fn step(what: impl Into<String>) {
    if let Ok(mut s) = STEP.lock() {
        *s = Some((std::time::Instant::now(), what.into()));
    }
}

/// Abort this PE when one step takes longer than `limit` (a PE stuck in a collective or a
/// kernel waiting for a peer would otherwise hang the whole job silently). The launcher then
/// stops the other PEs.
pub fn start_watchdog(limit: std::time::Duration, pe: usize) {
    std::thread::spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
        let stuck = STEP.lock().ok().and_then(|s| {
            s.as_ref()
                .filter(|(t, _)| t.elapsed() > limit)
                .map(|(_, w)| w.clone())
        });
        if let Some(what) = stuck {
            eprintln!(
                "bench: PE {pe}: no progress for {} s during: {what}. A PE is probably waiting for \
                 another in a collective or kernel; rerun with NVSHMEM_DEBUG=WARN NCCL_DEBUG=WARN, \
                 a subset (--tests, --impls, --modes plain), or a larger --watchdog",
                limit.as_secs()
            );
            std::process::abort();
        }
    });
}
