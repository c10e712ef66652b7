//! The symmetric map (`--tests map`, `nvshmem::map::SymmetricMap`), on PE 0:
//! - lookup latency: one warp's lookups of 64-byte values one after another from a kernel
//!   (each key depends on the value before), keys held by PE 0 (`local owner`) and by
//!   `--peer` (`remote owner`); time = per lookup;
//! - batched lookups: `lookup_batch` of 1, 1 Ki and 1 Mi keys of every PE, for values of
//!   64 B, 1 KiB and 16 KiB, against a device-to-device copy of the same bytes on PE 0
//!   (`local copy`), both captured in CUDA graphs;
//! - inserts: `insert_batch` of 1 Ki and 1 Mi keys of 64 B and 1 KiB values, each timed
//!   insert after an untimed `remove_batch` of the same keys (so they take the removed
//!   slots again).
//!
//! Every case builds a fresh map filled with fresh random values (every PE inserts its share
//! of the keys), and every row checks what it timed: each looked-up value against the value
//! inserted, every status `Done`. Cases whose map would pass `MAX_MAP_BYTES` on a PE are
//! skipped with a note.

use crate::cli::{format_size, Config, Mode};
use crate::coord::Coord;
use crate::data;
use crate::error::{CudaExt, Guard, Result};
use crate::report::{Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::CudaStream;
use nvshmem::map::{MapConfig, SymmetricMap, FIRST_RESERVED_KEY};
use nvshmem::module::{grid, Function, KernelArgs};
use nvshmem::{DeviceBuffer, Nvshmem};
use std::sync::Arc;

/// The `test` of the rows.
pub const MAP_TEST: &str = "map";
/// Value sizes and key counts of the batched lookups, and of the inserts.
pub const LOOKUP_VALUES: [usize; 3] = [64, 1 << 10, 16 << 10];
pub const LOOKUP_KEYS: [usize; 3] = [1, 1 << 10, 1 << 20];
pub const INSERT_VALUES: [usize; 2] = [64, 1 << 10];
pub const INSERT_KEYS: [usize; 2] = [1 << 10, 1 << 20];
/// Lookups of one latency row, and the value size there.
pub const CHAIN: usize = 256;
pub const LATENCY_VALUE: usize = 64;
/// A case's map on one PE at most (keys and values), so the default symmetric heap holds it.
pub const MAX_MAP_BYTES: usize = 512 << 20;
/// Data key (`data::key`).
const K_MAP: u64 = 77;

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One lookup after another from a kernel; the keys' owner local or remote.
    Latency { remote: bool },
    /// `lookup_batch`.
    Lookup,
    /// A device-to-device copy of the bytes a lookup batch returns.
    LocalCopy,
    /// `insert_batch`.
    Insert,
}

impl Kind {
    /// The implementation column.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Latency { remote: false } => "local owner",
            Kind::Latency { remote: true } => "remote owner",
            Kind::Lookup => "lookup_batch",
            Kind::LocalCopy => "local copy",
            Kind::Insert => "insert_batch",
        }
    }
}

/// The variant of a row: its value size.
pub fn variant(value_bytes: usize) -> String {
    format!("{} values", format_size(value_bytes))
}

/// Slots per PE for `keys` keys over `n` PEs: the keys' share at most 2/3 full, with room
/// for an owner the hash favours.
pub fn slots_for(keys: usize, n: usize) -> usize {
    keys.div_ceil(n) * 3 / 2 + 64
}

/// Key `i` of a case: distinct, never reserved.
pub fn key_of(case: u64, i: usize) -> u64 {
    let k = data::word(case, 0, i) & !(1 << 63);
    debug_assert!(k < FIRST_RESERVED_KEY);
    // Distinct: the word's top bit is dropped, and i is folded in where it cannot collide.
    (k & !0xFFFF_FFFF) | i as u64
}

/// What the benchmark runs with.
pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    pub progress: &'a Progress,
    /// The latency kernel (kernels/map_bench.cu).
    pub chain: &'a Function,
}

/// A filled map and its keys.
struct Case {
    map: Guard<SymmetricMap>,
    keys: Vec<u64>,
    value_bytes: usize,
    /// The data key of the values.
    key: u64,
}

impl Case {
    /// Value `i`'s bytes.
    fn value(&self, i: usize) -> Vec<u8> {
        data::bytes_at(self.key, 0, i * self.value_bytes, self.value_bytes)
    }

    /// The values of keys `indices`, end to end.
    fn values(&self, indices: &[usize]) -> Vec<u8> {
        indices.iter().flat_map(|&i| self.value(i)).collect()
    }
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let n = ctx.shmem.n_pes();
    let peer = if n == 1 { 0 } else { ctx.cfg.peer.min(n - 1) };
    timing::step("map: latency");
    let case = build(ctx, 8 * CHAIN * n, LATENCY_VALUE, 0)?;
    for remote in [false, true] {
        if remote && peer == 0 {
            let note =
                "map: the remote-owner latency row skipped: it needs --peer, a PE other than 0";
            ctx.progress.say(note);
            results.notes.push(note.into());
            continue;
        }
        let owner = if remote { peer } else { 0 };
        let r = latency(ctx, timer, &case, owner, remote)?;
        say(ctx, &r);
        results.push(r);
    }
    drop(case);
    for value_bytes in LOOKUP_VALUES {
        for keys in LOOKUP_KEYS {
            if let Some(case) = case_or_note(ctx, results, keys, value_bytes, 1)? {
                for kind in [Kind::Lookup, Kind::LocalCopy] {
                    let r = lookups(ctx, timer, &case, kind)?;
                    say(ctx, &r);
                    results.push(r);
                }
            }
        }
    }
    for value_bytes in INSERT_VALUES {
        for keys in INSERT_KEYS {
            if let Some(case) = case_or_note(ctx, results, keys, value_bytes, 2)? {
                let r = inserts(ctx, timer, &case)?;
                say(ctx, &r);
                results.push(r);
            }
        }
    }
    Ok(())
}

fn say(ctx: &Ctx, r: &Record) {
    ctx.progress.say(format!(
        "map {} x {} {}: {}",
        r.count,
        r.variant,
        r.implementation,
        match (r.status, r.median_us()) {
            (Status::Ok, Some(t)) => format!("{t:.2} us"),
            _ => format!("FAILED: {}", r.check),
        }
    ));
}

/// The case, or `None` and a note when its map would pass `MAX_MAP_BYTES` on a PE.
fn case_or_note(
    ctx: &Ctx,
    results: &mut Results,
    keys: usize,
    value_bytes: usize,
    part: u64,
) -> Result<Option<Case>> {
    let n = ctx.shmem.n_pes();
    let per_pe = slots_for(keys, n) * (value_bytes + 8);
    if per_pe > MAX_MAP_BYTES {
        let note = format!(
            "map: {keys} keys of {} skipped: {} per PE with {n} PEs (at most {})",
            variant(value_bytes),
            format_size(per_pe),
            format_size(MAX_MAP_BYTES)
        );
        ctx.progress.say(&note);
        results.notes.push(note);
        return Ok(None);
    }
    timing::step(format!("map: {keys} keys of {}", variant(value_bytes)));
    build(ctx, keys, value_bytes, part).map(Some)
}

/// A fresh map of `count` keys with fresh random values, every PE inserting keys `i` with
/// `i % n == me`; every insert must be `Done`.
fn build(ctx: &Ctx, count: usize, value_bytes: usize, part: u64) -> Result<Case> {
    let (me, n) = (ctx.shmem.my_pe(), ctx.shmem.n_pes());
    let key = data::key(
        ctx.cfg.seed,
        &[K_MAP, part, count as u64, value_bytes as u64],
    );
    let map = Guard::new(SymmetricMap::new(
        ctx.shmem,
        MapConfig::new(slots_for(count, n), value_bytes),
    )?);
    let keys: Vec<u64> = (0..count).map(|i| key_of(key, i)).collect();
    let case = Case {
        map,
        keys,
        value_bytes,
        key,
    };
    let mine: Vec<usize> = (me..count).step_by(n).collect();
    let k: Vec<u64> = mine.iter().map(|&i| case.keys[i]).collect();
    let v = case.values(&mine);
    let failed = insert_checked(ctx, &case, &k, &v)?;
    if ctx.coord.sum(failed as u64)? > 0 {
        return Err(crate::error::BenchError::new(format!(
            "map: filling {count} keys of {}: an insert was not Done",
            variant(value_bytes)
        )));
    }
    ctx.coord.barrier()?;
    Ok(case)
}

/// Insert `keys` with `values` on the context's stream: whether any status was not `Done`.
fn insert_checked(ctx: &Ctx, case: &Case, keys: &[u64], values: &[u8]) -> Result<bool> {
    if keys.is_empty() {
        return Ok(false);
    }
    let k = Guard::new(ctx.shmem.alloc_device::<u64>(keys.len())?);
    let v = Guard::new(ctx.shmem.alloc_device::<u8>(values.len())?);
    let s = Guard::new(ctx.shmem.alloc_device::<u32>(keys.len())?);
    k.copy_from_host(keys)?;
    v.copy_from_host(values)?;
    case.map.insert_batch(&*k, &*v, &*s, ctx.stream)?;
    ctx.stream.synchronize().cuda("cuStreamSynchronize")?;
    Ok(s.to_vec()?.iter().any(|&c| c != 0))
}

/// A row with no figures yet.
fn record(case: &Case, kind: Kind, count: usize, n: usize, mode: Mode) -> Record {
    let variant = variant(case.value_bytes);
    let bytes = count * case.value_bytes;
    Record::bytes_row(MAP_TEST, variant, kind.name(), mode, bytes, count, n)
}

/// Every PE reports the row as PE 0 found it; a wrong row gives no figure.
fn settle(ctx: &Ctx, mut r: Record, problem: Option<String>) -> Result<Record> {
    if ctx.coord.sum(problem.is_some() as u64)? > 0 {
        r.status = Status::Failed;
        r.check = problem.unwrap_or_else(|| "failed on PE 0".into());
        r.algbw_gbs = None;
        r.busbw_gbs = None;
    }
    Ok(r)
}

/// Whether `dst` holds `want` and every status (a copy has none) is `Done`.
fn check_lookup(want: &[u8], dst: &[u8], status: Option<&[u32]>) -> Option<String> {
    let status = status.unwrap_or_default();
    if let Some(i) = status.iter().position(|&s| s != 0) {
        return Some(format!("lookup {i}: status {}, expected Done", status[i]));
    }
    let m = data::compare_plain(dst, want);
    (m.count > 0).then(|| format!("looked-up values: {}", m.describe()))
}

/// One warp's chain of CHAIN lookups of keys owned by `owner`, timed per lookup.
fn latency(
    ctx: &Ctx,
    timer: &mut Timer,
    case: &Case,
    owner: usize,
    remote: bool,
) -> Result<Record> {
    let n = ctx.shmem.n_pes();
    let kind = Kind::Latency { remote };
    let mut r = record(case, kind, CHAIN, n, Mode::Graph);
    r.variant = format!("{}, one warp", variant(case.value_bytes));
    let mut problem = None;
    if ctx.shmem.my_pe() == 0 {
        let indices: Vec<usize> = (0..case.keys.len())
            .filter(|&i| case.map.owner_of(case.keys[i]) == owner)
            .take(CHAIN)
            .collect();
        if indices.len() < CHAIN {
            problem = Some(format!(
                "{} keys of PE {owner}, {CHAIN} needed",
                indices.len()
            ));
        } else {
            let keys: Vec<u64> = indices.iter().map(|&i| case.keys[i]).collect();
            let k = Guard::new(ctx.shmem.alloc_device::<u64>(CHAIN)?);
            let dst = Guard::new(ctx.shmem.alloc_device::<u8>(CHAIN * case.value_bytes)?);
            let s = Guard::new(ctx.shmem.alloc_device::<u32>(CHAIN)?);
            k.copy_from_host(&keys)?;
            let launch = || {
                let mut args = KernelArgs::new();
                args.value(case.map.handle())
                    .device_ptr(k.addr())
                    .value(CHAIN as u32)
                    .device_ptr(dst.addr())
                    .device_ptr(s.addr())
                    .value(0u64);
                // SAFETY: map_bench_chain(nvshmem_rs_map, const uint64_t *, uint32_t, char *,
                // uint32_t *, uint64_t); the buffers hold CHAIN keys, values and statuses.
                Ok(unsafe { ctx.chain.launch(grid(1, 32), ctx.stream, &mut args) }?)
            };
            let samples = replay(ctx, timer, CHAIN * case.value_bytes, &dst, launch)?;
            let statuses = s.to_vec()?;
            problem = check_lookup(&case.values(&indices), &dst.to_vec()?, Some(&statuses));
            // Per lookup: a replay is one chain.
            let per: Vec<f64> = samples.iter().map(|t| t / CHAIN as f64).collect();
            r.time_us = stats::summarize(&per);
        }
    }
    settle(ctx, r, problem)
}

/// A lookup batch of every key of the case in a random order (or the copy of its bytes).
fn lookups(ctx: &Ctx, timer: &mut Timer, case: &Case, kind: Kind) -> Result<Record> {
    let count = case.keys.len();
    let bytes = count * case.value_bytes;
    let mut r = record(case, kind, count, ctx.shmem.n_pes(), Mode::Graph);
    let mut problem = None;
    if ctx.shmem.my_pe() == 0 {
        let mut indices: Vec<usize> = (0..count).collect();
        indices.sort_unstable_by_key(|&i| data::word(case.key, 1, i));
        let keys: Vec<u64> = indices.iter().map(|&i| case.keys[i]).collect();
        let k = Guard::new(ctx.shmem.alloc_device::<u64>(count)?);
        let dst = Guard::new(ctx.shmem.alloc_device::<u8>(bytes)?);
        let s = Guard::new(ctx.shmem.alloc_device::<u32>(count)?);
        k.copy_from_host(&keys)?;
        let want = case.values(&indices);
        // The copy's source: the same bytes in local memory.
        let src: Option<Guard<DeviceBuffer<u8>>> = match kind {
            Kind::LocalCopy => {
                let src = Guard::new(ctx.shmem.alloc_device(bytes)?);
                src.copy_from_host(&want)?;
                Some(src)
            }
            _ => None,
        };
        let op = || match &src {
            Some(src) => {
                // SAFETY: both buffers hold `bytes`.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        dst.addr(),
                        src.addr(),
                        bytes,
                        ctx.stream.cu_stream(),
                    )
                }
                .cuda("cuMemcpyDtoDAsync")
            }
            None => Ok(case.map.lookup_batch(&*dst, &*k, &*s, ctx.stream)?),
        };
        let samples = replay(ctx, timer, bytes, &dst, op)?;
        let statuses = match kind {
            Kind::LocalCopy => None,
            _ => Some(s.to_vec()?),
        };
        problem = check_lookup(&want, &dst.to_vec()?, statuses.as_deref());
        r.time_us = stats::summarize(&samples);
        r.algbw_gbs = r.time_us.map(|t| stats::algbw_gbs(bytes as f64, t.median));
        r.busbw_gbs = r.algbw_gbs;
    }
    settle(ctx, r, problem)
}

/// `op` captured in a CUDA graph, replayed after a warm-up with `dst` poisoned first (what
/// is checked afterwards is the replays' own), and timed: microseconds per `op`.
fn replay(
    ctx: &Ctx,
    timer: &mut Timer,
    bytes: usize,
    dst: &DeviceBuffer<u8>,
    op: impl Fn() -> Result<()>,
) -> Result<Vec<f64>> {
    let stream = ctx.stream;
    op()?;
    stream.synchronize().cuda("cuStreamSynchronize")?;
    let start = std::time::Instant::now();
    op()?;
    stream.synchronize().cuda("cuStreamSynchronize")?;
    let probe_us = start.elapsed().as_secs_f64() * 1e6;
    let (warm, iters, graph_ops) = ctx.cfg.budgeted(bytes, probe_us, true);
    let graph =
        timing::capture(stream, graph_ops, || op().map_err(|e| e.to_string())).map_err(|msg| {
            crate::error::BenchError::new(format!("CUDA graph capture failed: {msg}"))
        })?;
    dst.copy_from_host(&vec![0xA5; dst.len()])?;
    timer.time_graph(stream, &graph, warm, iters, graph_ops)
}

/// Inserts of every key of the case, each after an untimed remove of them all.
fn inserts(ctx: &Ctx, timer: &mut Timer, case: &Case) -> Result<Record> {
    let count = case.keys.len();
    let bytes = count * case.value_bytes;
    let mut r = record(case, Kind::Insert, count, ctx.shmem.n_pes(), Mode::Plain);
    let mut problem = None;
    if ctx.shmem.my_pe() == 0 {
        let k = Guard::new(ctx.shmem.alloc_device::<u64>(count)?);
        let v = Guard::new(ctx.shmem.alloc_device::<u8>(bytes)?);
        let s = Guard::new(ctx.shmem.alloc_device::<u32>(count)?);
        let gone = Guard::new(ctx.shmem.alloc_device::<u32>(count)?);
        k.copy_from_host(&case.keys)?;
        let all: Vec<usize> = (0..count).collect();
        let want = case.values(&all);
        v.copy_from_host(&want)?;
        let remove = || Ok(case.map.remove_batch(&*k, &*gone, ctx.stream)?);
        let insert = || Ok(case.map.insert_batch(&*k, &*v, &*s, ctx.stream)?);
        remove()?;
        insert()?;
        ctx.stream.synchronize().cuda("cuStreamSynchronize")?;
        let (_, iters) = ctx.cfg.iters_for(bytes);
        let samples = timer.time_each(ctx.stream, iters, 1, |_| remove(), |_| insert())?;
        r.time_us = stats::summarize(&samples);
        r.algbw_gbs = r.time_us.map(|t| stats::algbw_gbs(bytes as f64, t.median));
        r.busbw_gbs = r.algbw_gbs;
        let statuses = s.to_vec()?;
        problem = statuses
            .iter()
            .position(|&c| c != 0)
            .map(|i| format!("insert {i}: status {}, expected Done", statuses[i]));
        if problem.is_none() {
            // What the last insert stored, read back.
            let dst = Guard::new(ctx.shmem.alloc_device::<u8>(bytes)?);
            case.map.lookup_batch(&*dst, &*k, &*s, ctx.stream)?;
            ctx.stream.synchronize().cuda("cuStreamSynchronize")?;
            let statuses = s.to_vec()?;
            problem = check_lookup(&want, &dst.to_vec()?, Some(&statuses));
        }
    }
    settle(ctx, r, problem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn the_cubin_has_exactly_the_map_kernel() {
        crate::cubin_set::check_set(&crate::kernels::MAP_BENCH, &["map_bench_chain".to_string()]);
    }

    #[test]
    fn keys_are_distinct_and_never_reserved() {
        let keys: HashSet<u64> = (0..100_000).map(|i| key_of(42, i)).collect();
        assert_eq!(keys.len(), 100_000);
        assert!(keys.iter().all(|&k| k < FIRST_RESERVED_KEY));
        assert_ne!(key_of(1, 5), key_of(2, 5));
    }

    #[test]
    fn maps_leave_room_and_the_largest_cases_are_skipped() {
        for n in [1, 2, 4, 8] {
            for keys in LOOKUP_KEYS {
                let slots = slots_for(keys, n);
                assert!(
                    slots * 2 >= keys.div_ceil(n) * 3,
                    "{keys} keys on {n} PEs: {slots}"
                );
            }
        }
        // 1 Mi keys of 16 KiB never fit; of 1 KiB, from 4 PEs.
        let fits = |keys, value: usize, n| slots_for(keys, n) * (value + 8) <= MAX_MAP_BYTES;
        assert!(!fits(1 << 20, 16 << 10, 8));
        assert!(!fits(1 << 20, 1 << 10, 2) && fits(1 << 20, 1 << 10, 4));
        assert!(fits(1 << 20, 64, 1));
    }
}
