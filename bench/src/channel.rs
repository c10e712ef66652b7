//! Channels (`nvshmem::channel`): the hand-off of a message from PE 0 to `--peer` and back
//! (a ping-pong; one way = round trip / 2) through our channels, through our put-with-signal
//! (`put_signal_on_stream` + `signal_wait_until_on_stream`) and through NCCL send/recv, and a
//! channel's throughput with a full queue against NCCL sending the same messages. Every
//! implementation runs in CUDA graphs of `--graph-ops` rounds, so launches are not what is
//! timed. With one PE the channel and put-with-signal rows run as a loopback (PE 0 to
//! itself) and NCCL's are skipped.

use crate::cli::{format_size, Config, Impl};
use crate::coord::Coord;
use crate::data::{self, Mismatch};
use crate::error::{BenchError, CudaExt, Guard, Result};
use crate::nccl::Nccl;
use crate::report::{Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::CudaStream;
use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::{Cmp, Nvshmem, SignalOp, SymmetricBuffer};
use std::sync::Arc;

/// Message sizes of the hand-off: 8 B to 16 MiB, by factors of 8.
pub const HANDOFF_SIZES: [usize; 8] = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20];
/// Slots of the throughput test's channel: the producer runs this far ahead.
pub const THROUGHPUT_DEPTH: usize = 4;
/// Data keys of this module's cases (`data::key`).
const K_HANDOFF: u64 = 21;
const K_THROUGHPUT: u64 = 22;

pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    pub nccl: Option<&'a Nccl>,
    pub progress: &'a Progress,
}

/// Who takes part: PE 0 and the peer (PE 0 alone on one PE).
struct Ends {
    me: usize,
    peer: usize,
}

impl Ends {
    fn initiator(&self) -> bool {
        self.me == 0
    }
    fn target(&self) -> bool {
        self.me == self.peer
    }
    fn active(&self) -> bool {
        self.initiator() || self.target()
    }
}

/// The sizes measured: those of [`HANDOFF_SIZES`] within `--max-bytes`.
pub fn sizes(cfg: &Config) -> Vec<usize> {
    HANDOFF_SIZES
        .into_iter()
        .filter(|&b| b <= cfg.max_size().max(8))
        .collect()
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let n = ctx.shmem.n_pes();
    let peer = if n == 1 { 0 } else { ctx.cfg.peer };
    if peer >= n {
        let note = format!("channel tests skipped: --peer {peer} with {n} PEs");
        results.notes.push(note);
        return Ok(());
    }
    let ends = Ends {
        me: ctx.shmem.my_pe(),
        peer,
    };
    let nccl = match (n > 1, ctx.cfg.has_impl(Impl::Nccl)) {
        (true, true) => ctx.nccl,
        _ => None,
    };
    if n == 1 {
        results.notes.push(
            "channel tests ran as a loopback (one PE sends to itself); NCCL's rows need 2 PEs"
                .into(),
        );
    }
    for &bytes in &sizes(ctx.cfg) {
        results.push(handoff(ctx, &ends, timer, HandOff::Channel, bytes)?);
        results.push(handoff(ctx, &ends, timer, HandOff::PutSignal, bytes)?);
        if nccl.is_some() {
            results.push(handoff(ctx, &ends, timer, HandOff::Nccl, bytes)?);
        }
    }
    say_series(ctx, results, "channel_pingpong");
    for &bytes in &sizes(ctx.cfg) {
        results.push(throughput(ctx, &ends, timer, false, bytes)?);
        if nccl.is_some() {
            results.push(throughput(ctx, &ends, timer, true, bytes)?);
        }
    }
    say_series(ctx, results, "channel_throughput");
    Ok(())
}

fn say_series(ctx: &Ctx, results: &Results, test: &str) {
    let rows: Vec<String> = results
        .records
        .iter()
        .filter(|r| r.test == test)
        .map(|r| {
            format!(
                "{} {} {}",
                r.implementation,
                format_size(r.bytes),
                r.time_us
                    .map(|t| format!("{:.2}us", t.median))
                    .unwrap_or_else(|| r.check.clone())
            )
        })
        .collect();
    ctx.progress.say(format!("{test}: {}", rows.join(", ")));
}

/// How a hand-off is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HandOff {
    Channel,
    PutSignal,
    Nccl,
}

impl HandOff {
    fn implementation(self) -> &'static str {
        match self {
            HandOff::Channel => "ours",
            HandOff::PutSignal => "nvshmem",
            HandOff::Nccl => "nccl",
        }
    }
}

/// A benchmark's symmetric byte buffer.
type Bytes = Guard<SymmetricBuffer<u8>>;

/// Fresh random bytes in this PE's source, a zeroed destination, and a barrier.
fn prepare(ctx: &Ctx, key: u64, bytes: usize) -> Result<(Bytes, Bytes)> {
    let src = Guard::new(ctx.shmem.calloc::<u8>(bytes)?);
    let dst = Guard::new(ctx.shmem.calloc::<u8>(bytes)?);
    src.copy_from_host(&data::bytes(key, ctx.shmem.my_pe(), bytes))?;
    ctx.coord.barrier()?;
    Ok((src, dst))
}

/// This PE's destination against `from`'s source bytes, agreed over all PEs.
fn check(
    ctx: &Ctx,
    key: u64,
    dst: &SymmetricBuffer<u8>,
    from: Option<usize>,
) -> Result<(Status, String)> {
    let local = match from {
        Some(from) => {
            let got = dst.to_vec()?;
            data::compare_plain(&got, &data::bytes(key, from, got.len()))
        }
        None => Mismatch::default(),
    };
    let totals = ctx.coord.sums(&[local.count, (local.count > 0) as u64])?;
    Ok(if totals[0] == 0 {
        (Status::Ok, "ok".into())
    } else {
        (
            Status::Failed,
            format!(
                "{} wrong bytes on {} PE(s); this PE: {}",
                totals[0],
                totals[1],
                local.describe()
            ),
        )
    })
}

/// The end of a case on every PE: its work done, a capture that failed anywhere reported as
/// such, else the destination checked against `from`'s source.
fn finish(
    ctx: &Ctx,
    capture_error: Option<String>,
    key: u64,
    dst: &SymmetricBuffer<u8>,
    from: Option<usize>,
) -> Result<(Status, String)> {
    ctx.stream.synchronize().cuda("cuStreamSynchronize")?;
    let failed = ctx.coord.sum(capture_error.is_some() as u64)?;
    ctx.coord.barrier()?;
    if failed > 0 {
        return Ok((
            Status::Failed,
            capture_error.unwrap_or_else(|| "graph capture failed on another PE".into()),
        ));
    }
    check(ctx, key, dst, from)
}

fn record(
    ctx: &Ctx,
    test: &str,
    variant: String,
    implementation: &str,
    bytes: usize,
    samples: &[f64],
    check: (Status, String),
) -> Record {
    let time_us = stats::summarize(samples);
    let bw = time_us.map(|t| stats::algbw_gbs(bytes as f64, t.median));
    Record {
        test: test.into(),
        variant,
        implementation: implementation.into(),
        mode: "graph".into(),
        dtype: "bytes".into(),
        bytes,
        count: bytes,
        n_pes: ctx.shmem.n_pes(),
        time_us,
        algbw_gbs: bw,
        busbw_gbs: bw,
        status: check.0,
        check: check.1,
        tp: None,
        pipeline: None,
        hybrid: None,
    }
}

/// Launch `graph` for the warm-up, then time `n` launches on PE 0 (each `per` operations).
fn time_graph(
    ctx: &Ctx,
    timer: &mut Timer,
    graph: &cudarc::driver::CudaGraph,
    warm: usize,
    iters: usize,
    per: usize,
) -> Result<Vec<f64>> {
    for _ in 0..warm.div_ceil(per).max(1) {
        graph.launch().cuda("cuGraphLaunch")?;
    }
    let t = timer.time_each(
        ctx.stream,
        iters,
        per,
        |_| Ok(()),
        |_| graph.launch().cuda("cuGraphLaunch"),
    )?;
    Ok(t)
}

/// One ping-pong of `bytes` between PE 0 and the peer, `--graph-ops` rounds per graph.
fn handoff(
    ctx: &Ctx,
    ends: &Ends,
    timer: &mut Timer,
    how: HandOff,
    bytes: usize,
) -> Result<Record> {
    timing::step(format!(
        "channel hand-off {:?}, {}",
        how,
        format_size(bytes)
    ));
    let shmem = ctx.shmem;
    let key = data::key(ctx.cfg.seed, &[K_HANDOFF, how as u64, bytes as u64]);
    let (src, dst) = prepare(ctx, key, bytes)?;
    // Collective: every PE makes both channels.
    let (there, back) = match how {
        HandOff::Channel => (
            Some(Guard::new(Channel::<u8>::new(
                shmem,
                ChannelConfig::new(0, ends.peer, bytes),
            )?)),
            Some(Guard::new(Channel::<u8>::new(
                shmem,
                ChannelConfig::new(ends.peer, 0, bytes),
            )?)),
        ),
        _ => (None, None),
    };
    let sig = Guard::new(shmem.calloc::<u64>(1)?);
    let stream = ctx.stream;
    let other = if ends.initiator() { ends.peer } else { 0 };
    let mut dst_view = dst.view(..);
    // One round on this PE: the initiator hands off and waits for the answer, the target
    // answers; on one PE both, in turn.
    let mut round = || -> std::result::Result<(), String> {
        let r: Result<()> = (|| {
            match how {
                HandOff::Channel => {
                    let (there, back) = (there.as_deref().unwrap(), back.as_deref().unwrap());
                    if ends.initiator() {
                        there.send(&*src, stream)?;
                    }
                    if ends.target() {
                        there.recv(&mut dst_view, stream)?;
                        back.send(&*src, stream)?;
                    }
                    if ends.initiator() {
                        back.recv(&mut dst_view, stream)?;
                    }
                }
                HandOff::PutSignal => {
                    // Set to 1 by the sender, reset by the receiver once seen: replayable.
                    let hand = |to: usize| -> Result<()> {
                        shmem.put_signal_on_stream(
                            &*dst,
                            &*src,
                            &*sig,
                            0,
                            1,
                            SignalOp::Set,
                            to,
                            stream,
                        )?;
                        Ok(())
                    };
                    let take = || -> Result<()> {
                        shmem.signal_wait_until_on_stream(&*sig, 0, Cmp::Eq, 1, stream)?;
                        shmem.signal_op_on_stream(
                            &*sig,
                            0,
                            0,
                            SignalOp::Set,
                            shmem.my_pe(),
                            stream,
                        )?;
                        Ok(())
                    };
                    if ends.initiator() {
                        hand(ends.peer)?;
                    }
                    if ends.target() {
                        take()?;
                        hand(0)?;
                    }
                    if ends.initiator() {
                        take()?;
                    }
                }
                HandOff::Nccl => {
                    let nccl = ctx
                        .nccl
                        .ok_or_else(|| BenchError::new("NCCL is not initialised"))?;
                    // SAFETY: both buffers hold `bytes` bytes and outlive the graph.
                    unsafe {
                        if ends.initiator() {
                            nccl.send(src.addr(), bytes, other, stream)?;
                            nccl.recv(dst.addr(), bytes, other, stream)?;
                        } else {
                            nccl.recv(dst.addr(), bytes, other, stream)?;
                            nccl.send(src.addr(), bytes, other, stream)?;
                        }
                    }
                }
            }
            Ok(())
        })();
        r.map_err(|e| e.to_string())
    };
    let (warm, iters) = ctx.cfg.iters_for(bytes);
    let ops = ctx.cfg.graph_ops.max(1);
    let mut samples = Vec::new();
    let mut capture_error = None;
    if ends.active() {
        match timing::capture(stream, ops, &mut round) {
            Ok(graph) => {
                samples = time_graph(ctx, timer, &graph, warm, iters, ops)?;
            }
            Err(e) => capture_error = Some(e),
        }
    }
    let check = finish(
        ctx,
        capture_error,
        key,
        &dst,
        ends.active().then_some(other),
    )?;
    let samples: Vec<f64> = match ends.initiator() {
        true => samples.iter().map(|t| t / 2.0).collect(),
        false => Vec::new(),
    };
    Ok(record(
        ctx,
        "channel_pingpong",
        String::new(),
        how.implementation(),
        bytes,
        &samples,
        check,
    ))
}

/// `--graph-ops` messages of `bytes` from PE 0 to the peer back to back, the consumer
/// receiving as they come: through a channel of [`THROUGHPUT_DEPTH`] slots, or NCCL
/// send/recv. Time per message on the producer.
fn throughput(
    ctx: &Ctx,
    ends: &Ends,
    timer: &mut Timer,
    nccl: bool,
    bytes: usize,
) -> Result<Record> {
    timing::step(format!(
        "channel throughput{}, {}",
        if nccl { " (NCCL)" } else { "" },
        format_size(bytes)
    ));
    let shmem = ctx.shmem;
    let key = data::key(ctx.cfg.seed, &[K_THROUGHPUT, nccl as u64, bytes as u64]);
    let (src, dst) = prepare(ctx, key, bytes)?;
    let ch = Guard::new(Channel::<u8>::new(
        shmem,
        ChannelConfig::new(0, ends.peer, bytes).depth(THROUGHPUT_DEPTH),
    )?);
    let ops = ctx.cfg.graph_ops.max(1);
    // On one PE the consumer runs on a stream of its own, beside the producer's.
    let consumer_stream = match ends.initiator() && ends.target() {
        true => Some(shmem.new_stream()?),
        false => None,
    };
    let mut dst_view = dst.view(..);
    let stream = ctx.stream;
    let produce = |s: &Arc<CudaStream>| -> std::result::Result<(), String> {
        if nccl {
            let n = ctx.nccl.ok_or("NCCL is not initialised")?;
            // SAFETY: `src` holds `bytes` bytes and outlives the graph.
            unsafe { n.send(src.addr(), bytes, ends.peer, s) }.map_err(|e| e.to_string())
        } else {
            ch.send(&*src, s).map_err(|e| e.to_string())
        }
    };
    let mut consume = |s: &Arc<CudaStream>| -> std::result::Result<(), String> {
        if nccl {
            let n = ctx.nccl.ok_or("NCCL is not initialised")?;
            // SAFETY: `dst` holds `bytes` bytes and outlives the graph.
            unsafe { n.recv(dst.addr(), bytes, 0, s) }.map_err(|e| e.to_string())
        } else {
            ch.recv(&mut dst_view, s).map_err(|e| e.to_string())
        }
    };
    let (warm, iters) = ctx.cfg.iters_for(bytes);
    let mut samples = Vec::new();
    let mut capture_error = None;
    if ends.initiator() {
        let producer = timing::capture(stream, ops, || produce(stream));
        let consumer = consumer_stream
            .as_ref()
            .map(|cs| timing::capture(cs, ops, || consume(cs)));
        match (producer, consumer.transpose()) {
            (Ok(p), Ok(c)) => {
                // Warm-up and timed launches of the producer's graph, each matched by one of
                // the consumer's (here on one PE, or on the peer).
                let launches = warm.div_ceil(ops).max(1) + iters;
                if let Some(c) = &c {
                    for _ in 0..launches {
                        c.launch().cuda("cuGraphLaunch")?;
                    }
                }
                samples = time_graph(ctx, timer, &p, warm, iters, ops)?;
                if let Some(cs) = &consumer_stream {
                    cs.synchronize().cuda("cuStreamSynchronize")?;
                }
            }
            (Err(e), _) | (_, Err(e)) => capture_error = Some(e),
        }
    } else if ends.target() {
        match timing::capture(stream, ops, || consume(stream)) {
            Ok(c) => {
                for _ in 0..warm.div_ceil(ops).max(1) + iters {
                    c.launch().cuda("cuGraphLaunch")?;
                }
            }
            Err(e) => capture_error = Some(e),
        }
    }
    let check = finish(ctx, capture_error, key, &dst, ends.target().then_some(0))?;
    let variant = format!("depth={THROUGHPUT_DEPTH}");
    let implementation = if nccl { "nccl" } else { "ours" };
    Ok(record(
        ctx,
        "channel_throughput",
        variant,
        implementation,
        bytes,
        &samples,
        check,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handoff_sizes_run_from_8_bytes_to_16_mib_and_include_4_kib() {
        assert_eq!(HANDOFF_SIZES[0], 8);
        assert_eq!(*HANDOFF_SIZES.last().unwrap(), 16 << 20);
        assert!(HANDOFF_SIZES.contains(&4096));
        assert!(HANDOFF_SIZES.windows(2).all(|w| w[1] == 8 * w[0]));
    }
}
