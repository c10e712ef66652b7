//! The bandwidth matrix (`--tests p2p-matrix`): for every ordered pair of PEs, the one-way
//! and both-ways device put bandwidth at [`MATRIX_BYTES`] (the largest `--ctas`) and the
//! 8-byte put latency, each the same measurement as `p2p-bw` and `p2p-latency` for PE 0 and
//! `--peer`, checked the same way. Then every PE putting [`AGGREGATE_BYTES`] to every other
//! at once: GB/s per GPU. The tables name the slowest pair and flag pairs under
//! `--min-gbps` (0: under 80% of the median pair).

use super::{P2p, Scope, PUT_ALL_BW_KERNEL};
use crate::data;
use crate::error::Result;
use crate::report::{Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use nvshmem::module::KernelArgs;
use nvshmem::{sys, LaunchConfig};

/// The pairs' message size, and the aggregate's per destination.
pub const MATRIX_BYTES: usize = 64 << 20;
pub const AGGREGATE_BYTES: usize = 16 << 20;
/// The `test` of each matrix.
pub const UNI: &str = "matrix_put_bw";
pub const BIDIR: &str = "matrix_put_bw_bidir";
pub const LATENCY: &str = "matrix_put_latency";
pub const AGGREGATE: &str = "matrix_all_to_all_bw";
/// Data key of the aggregate (`data::key`).
const K_AGGREGATE: u64 = 9;

pub(super) fn run(p: &P2p, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let n = p.shmem.n_pes();
    let bytes = MATRIX_BYTES.min(p.cfg.max_size());
    let ctas = p.cfg.ctas.iter().copied().max().unwrap_or(32);
    for from in 0..n {
        for to in (0..n).filter(|&to| to != from) {
            p.from.set(from);
            p.peer.set(to);
            let pair = [
                (UNI, p.bandwidth(timer, false, false, ctas, bytes)?),
                (BIDIR, p.bandwidth(timer, false, true, ctas, bytes)?),
                (LATENCY, p.rma_latency(false, Scope::Thread, 8)?),
            ];
            for (test, r) in pair {
                results.push(as_pair(p, test, from, to, r)?);
            }
        }
    }
    p.from.set(0);
    p.peer.set(p.cfg.peer);
    results.push(aggregate(p, timer)?);
    let failed = results
        .records
        .iter()
        .filter(|r| r.test.starts_with("matrix_") && r.status == Status::Failed)
        .count();
    p.progress.say(format!(
        "p2p matrix: {} ordered pairs, {failed} rows failed",
        n * (n - 1)
    ));
    Ok(())
}

/// `r`, measured on PE `from`, as every PE's record of the pair: the initiator's samples.
fn as_pair(p: &P2p, test: &str, from: usize, to: usize, mut r: Record) -> Result<Record> {
    let summaries = p.coord.gather_summaries(r.time_us)?;
    r.time_us = summaries.get(from).copied().flatten();
    let directions = if test == BIDIR { 2.0 } else { 1.0 };
    r.algbw_gbs = r
        .time_us
        .filter(|_| test != LATENCY)
        .map(|t| stats::algbw_gbs(r.bytes as f64 * directions, t.median));
    r.busbw_gbs = r.algbw_gbs;
    r.test = test.into();
    r.variant = format!("{from}->{to}");
    Ok(r)
}

/// Every PE puts `AGGREGATE_BYTES` to every other at once; GB/s per GPU from PE 0's time.
fn aggregate(p: &P2p, timer: &mut Timer) -> Result<Record> {
    timing::step("p2p matrix: all to all");
    let n = p.shmem.n_pes();
    let bytes = AGGREGATE_BYTES.min(p.src.len() / n.max(1)) / 16 * 16;
    let key = data::key(p.cfg.seed, &[K_AGGREGATE, bytes as u64]);
    p.prepare_put(key, bytes, n * bytes)?;
    let f = p.function(PUT_ALL_BW_KERNEL)?;
    let per_peer = (p.cfg.ctas.iter().copied().max().unwrap_or(32) as usize / (n - 1)).max(1);
    let cfg = LaunchConfig {
        grid_dim: ((per_peer * (n - 1)) as u32, 1, 1),
        block_dim: (p.cfg.block_threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let (warm, launches) = p.cfg.iters_for(bytes);
    let raw = p.raw_stream();
    let samples = timer.time_each(
        p.stream,
        warm + launches,
        1,
        |_| {
            // Every PE starts together.
            p.bind()?;
            // SAFETY: a collective barrier on this PE's stream; every PE makes it.
            unsafe { sys::nvshmemx_barrier_all_on_stream(raw) };
            Ok(())
        },
        |_| {
            let mut args = KernelArgs::new();
            args.value(p.dst.addr())
                .value(p.src.addr())
                .value(bytes)
                .value(1i32);
            // SAFETY: matches bench_put_all_bw(char*, const char*, size_t, int); every PE's
            // destination holds n × bytes.
            unsafe { f.launch(cfg, p.stream, &mut args) }?;
            Ok(())
        },
    )?;
    p.finish()?;
    // Slot q of this PE's destination holds PE q's message (its own slot stays zero).
    let got = p.dst.view(0..n * bytes).to_vec()?;
    let mut wrong = data::Mismatch::default();
    for q in (0..n).filter(|&q| q != p.me) {
        let m = data::compare_plain(
            &got[q * bytes..(q + 1) * bytes],
            &data::bytes(key, q, bytes),
        );
        if m.count > 0 && wrong.count == 0 {
            wrong = m;
        }
    }
    let check = p.agree(wrong)?;
    let samples: Vec<f64> = match p.me == 0 {
        true => samples[warm..].to_vec(),
        false => Vec::new(),
    };
    let mut r = p.record(
        AGGREGATE,
        &format!("{n} PEs"),
        "device",
        "bytes",
        bytes,
        &samples,
        (n - 1) as f64,
        check,
    );
    r.implementation = "nvshmem".into();
    Ok(r)
}
