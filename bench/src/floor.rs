//! The latency floor (`--tests floor`, and before any collective): what no collective can
//! beat on this machine, measured in the same run (kernels in kernels/floor.cu):
//! - a kernel node in a CUDA graph, with and without programmatic dependent launch (PDL):
//!   graphs of [`NODES`] one-thread kernels, each adding 1 to a counter the host checks;
//! - a remote store, one way: PE 0 and `--peer` ping-pong 8-byte `st.release.sys` stores,
//!   each polling its own word with `ld.acquire.sys` (round trip / 2; a loopback on one PE);
//! - an L2 round trip: one thread chasing a random cycle of 4 MiB with loads cached in L2
//!   only, each load waiting for the one before; the host checks where it ends.
//!
//! A one-shot collective launched in a graph pays at least a PDL node, one remote store and
//! one L2 round trip (its local reduce or copy): [`one_shot_floor_us`] adds them, and the
//! collective tables give each of our rows as a multiple of it.

use crate::cli::Config;
use crate::coord::Coord;
use crate::error::{CudaExt, Guard, Result};
use crate::report::{Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::{CudaStream, LaunchConfig};
use nvshmem::module::{Function, KernelArgs, LaunchOptions, Module};
use nvshmem::{DeviceBuffer, Nvshmem};
use std::sync::Arc;

/// The `test` of the floor rows.
pub const FLOOR_TEST: &str = "floor";
/// The kernels of kernels/floor.cu.
pub const KERNEL_NAMES: [&str; 4] = [
    "floor_count",
    "floor_count_pdl",
    "floor_store_pingpong",
    "floor_l2_chase",
];
/// Kernel nodes per timed graph.
pub const NODES: usize = 64;
/// Entries of the L2 chase's cycle (4 MiB of u32: well inside an H100's or H200's L2, far
/// beyond an SM's L1).
pub const CHASE_ENTRIES: usize = 1 << 20;
/// Dependent loads per chase (and as many before them, to bring the cycle into L2).
pub const CHASE_STEPS: usize = 4096;
/// Round trips per ping-pong launch, after as many untimed ones.
pub const PINGPONG_ROUNDS: usize = 1000;
/// How long a ping-pong waits for the peer before it gives up (ns).
const WAIT_LIMIT_NS: u64 = 2_000_000_000;
/// Data key of the chase's cycle.
const K_CHASE: u64 = 61;

/// The rows, by variant.
pub const NODE: &str = "kernel node in a graph";
pub const NODE_PDL: &str = "kernel node in a graph, PDL";
pub const STORE: &str = "remote store, one way";
pub const L2: &str = "L2 round trip";

pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    pub progress: &'a Progress,
}

fn one_thread() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    timing::step("floor: loading kernels");
    let module = Guard::new(Module::load(ctx.shmem, &crate::kernels::FLOOR)?);
    let f = |i: usize| -> Result<Function> { Ok(module.function(KERNEL_NAMES[i])?) };
    for (i, pdl) in [(0, false), (1, true)] {
        results.push(nodes(ctx, timer, &f(i)?, pdl)?);
    }
    results.push(store_pingpong(ctx, &f(2)?)?);
    results.push(l2_chase(ctx, &f(3)?)?);
    let said: Vec<String> = results
        .records
        .iter()
        .filter(|r| r.test == FLOOR_TEST)
        .map(|r| {
            let t = r.median_us().map_or("-".into(), |t| format!("{t:.2}us"));
            format!("{} {t} {}", r.variant, r.check)
        })
        .collect();
    ctx.progress.say(format!("floor: {}", said.join(", ")));
    Ok(())
}

/// This PE's result and every PE's failures, as a status.
fn agree(ctx: &Ctx, problem: Option<String>) -> Result<(Status, String)> {
    let failed = ctx.coord.sum(problem.is_some() as u64)?;
    Ok(match (problem, failed) {
        (None, 0) => (Status::Ok, "ok".into()),
        (Some(p), _) => (Status::Failed, p),
        (None, n) => (Status::Failed, format!("failed on {n} other PE(s)")),
    })
}

fn record(
    ctx: &Ctx,
    variant: &str,
    mode: &str,
    bytes: usize,
    samples: &[f64],
    check: (Status, String),
) -> Record {
    Record {
        test: FLOOR_TEST.into(),
        variant: variant.into(),
        implementation: "floor".into(),
        mode: mode.into(),
        dtype: "-".into(),
        bytes,
        count: 1,
        n_pes: ctx.shmem.n_pes(),
        time_us: stats::summarize(samples),
        algbw_gbs: None,
        busbw_gbs: None,
        status: check.0,
        check: check.1,
        tp: None,
        pipeline: None,
        hybrid: None,
    }
}

/// Graphs of [`NODES`] counting kernels on every PE; time per node on PE 0.
fn nodes(ctx: &Ctx, timer: &mut Timer, kernel: &Function, pdl: bool) -> Result<Record> {
    let variant = if pdl { NODE_PDL } else { NODE };
    timing::step(format!("floor: {variant}"));
    let count = ctx.shmem.alloc_device::<u64>(1)?;
    let options = LaunchOptions::new().programmatic(pdl);
    let graph = timing::capture(ctx.stream, NODES, || {
        let mut args = KernelArgs::new();
        args.value(count.addr());
        // SAFETY: matches floor_count[_pdl](unsigned long long*); `count` outlives the graph.
        unsafe { kernel.launch_with(one_thread(), options, ctx.stream, &mut args) }
            .map_err(|e| e.to_string())
    });
    let mut samples = Vec::new();
    let problem = match graph {
        Ok(g) => {
            let warm = ctx.cfg.warmup.max(1);
            for _ in 0..warm {
                g.launch().cuda("cuGraphLaunch")?;
            }
            samples = timer.time_each(
                ctx.stream,
                ctx.cfg.iters,
                NODES,
                |_| Ok(()),
                |_| g.launch().cuda("cuGraphLaunch"),
            )?;
            let want = ((warm + ctx.cfg.iters) * NODES) as u64;
            let got = count.to_vec()?[0];
            (got != want).then(|| format!("the counter is {got}, not {want}: nodes did not run"))
        }
        Err(e) => Some(e),
    };
    let check = agree(ctx, problem)?;
    Ok(record(ctx, variant, "graph", 0, &samples, check))
}

/// The store ping-pong between PE 0 and the peer (PE 0 alone with one PE); one way per round
/// on PE 0.
fn store_pingpong(ctx: &Ctx, kernel: &Function) -> Result<Record> {
    timing::step("floor: remote store ping-pong");
    let (me, n) = (ctx.shmem.my_pe(), ctx.shmem.n_pes());
    let peer = if n == 1 { 0 } else { ctx.cfg.peer.min(n - 1) };
    let flag = Guard::new(ctx.shmem.calloc::<u64>(1)?);
    let elapsed: DeviceBuffer<u64> = ctx.shmem.alloc_device::<u64>(1)?;
    let active = me == 0 || me == peer;
    let launches = ctx.cfg.warmup.max(1) + ctx.cfg.iters;
    let mut samples = Vec::new();
    let mut problem = None;
    ctx.coord.barrier()?;
    if active {
        let other = if me == 0 { peer } else { 0 };
        for l in 0..launches {
            let base = (l * 2 * PINGPONG_ROUNDS) as u64;
            let mut args = KernelArgs::new();
            args.value(flag.addr())
                .value(other as i32)
                .value((me == 0) as i32)
                .value(base)
                .value(PINGPONG_ROUNDS as i32)
                .value(PINGPONG_ROUNDS as i32)
                .value(WAIT_LIMIT_NS)
                .value(elapsed.addr());
            // SAFETY: matches floor_store_pingpong(uint64_t*, int, int, uint64_t, int, int,
            // unsigned long long, unsigned long long*); both buffers outlive the launch, which
            // is waited for below. Its peer launches the matching kernel (each wait bounded).
            unsafe { kernel.launch(one_thread(), ctx.stream, &mut args)? };
            ctx.stream.synchronize().cuda("cuStreamSynchronize")?;
            let ns = elapsed.to_vec()?[0];
            if me == 0 && ns == 0 {
                problem = Some(format!(
                    "PE {other} did not answer within {} s",
                    WAIT_LIMIT_NS / 1_000_000_000
                ));
                break;
            }
            if me == 0 && l >= launches - ctx.cfg.iters {
                samples.push(ns as f64 / 1e3 / PINGPONG_ROUNDS as f64 / 2.0);
            }
        }
        // Each side's word holds the last value the other stored.
        let want = ((launches - 1) * 2 * PINGPONG_ROUNDS + 2 * PINGPONG_ROUNDS) as u64;
        let got = flag.to_vec()?[0];
        if problem.is_none() && got != want {
            problem = Some(format!("the flag holds {got}, not {want}"));
        }
    }
    ctx.coord.barrier()?;
    let check = agree(ctx, problem)?;
    Ok(record(ctx, STORE, "device", 8, &samples, check))
}

/// A random cycle through `n` entries: `next[i]` follows `i`.
pub fn chase_cycle(key: u64, n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    // Fisher-Yates with splitmix64 steps.
    let mut s = key;
    for i in (1..n).rev() {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        order.swap(i, (z % (i as u64 + 1)) as usize);
    }
    let mut next = vec![0u32; n];
    for w in 0..n {
        next[order[w] as usize] = order[(w + 1) % n];
    }
    next
}

/// Where a chase from `start` is after `steps` loads.
pub fn chase_end(next: &[u32], start: u32, steps: usize) -> u32 {
    (0..steps).fold(start, |i, _| next[i as usize])
}

/// The L2 chase on every PE; time per load on PE 0.
fn l2_chase(ctx: &Ctx, kernel: &Function) -> Result<Record> {
    timing::step("floor: L2 chase");
    let next = chase_cycle(crate::data::key(ctx.cfg.seed, &[K_CHASE]), CHASE_ENTRIES);
    let table = ctx.shmem.alloc_device::<u32>(CHASE_ENTRIES)?;
    table.copy_from_host(&next)?;
    let end = ctx.shmem.alloc_device::<u32>(1)?;
    let elapsed = ctx.shmem.alloc_device::<u64>(1)?;
    let want = chase_end(&next, 0, 2 * CHASE_STEPS);
    let mut samples = Vec::new();
    let mut problem = None;
    for l in 0..ctx.cfg.warmup.max(1) + ctx.cfg.iters {
        let mut args = KernelArgs::new();
        args.value(table.addr())
            .value(0u32)
            .value(CHASE_STEPS as i32)
            .value(end.addr())
            .value(elapsed.addr());
        // SAFETY: matches floor_l2_chase(const uint32_t*, uint32_t, int, uint32_t*,
        // unsigned long long*); every entry of `table` is an index into it.
        unsafe { kernel.launch(one_thread(), ctx.stream, &mut args)? };
        // Our buffers' host copies do not wait for this stream.
        ctx.stream.synchronize().cuda("cuStreamSynchronize")?;
        let got = end.to_vec()?[0];
        if got != want {
            problem = Some(format!("the chase ended at {got}, not {want}"));
            break;
        }
        if l >= ctx.cfg.warmup.max(1) {
            samples.push(elapsed.to_vec()?[0] as f64 / 1e3 / CHASE_STEPS as f64);
        }
    }
    let check = agree(ctx, problem)?;
    Ok(record(ctx, L2, "device", 4, &samples, check))
}

/// The floor of a one-shot collective launched in a graph: a PDL node, one remote store and
/// one L2 round trip, from the floor rows in `records` (`None` unless all three passed).
pub fn one_shot_floor_us(records: &[Record]) -> Option<f64> {
    let median = |variant: &str| {
        records
            .iter()
            .find(|r| r.test == FLOOR_TEST && r.variant == variant && r.status == Status::Ok)
            .and_then(|r| r.median_us())
    };
    Some(median(NODE_PDL)? + median(STORE)? + median(L2)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cubin_has_exactly_the_floor_kernels() {
        crate::cubin_set::check_set(&crate::kernels::FLOOR, &KERNEL_NAMES.map(String::from));
    }

    #[test]
    fn the_chase_is_one_cycle_through_every_entry() {
        let next = chase_cycle(7, 1000);
        let mut seen = vec![false; 1000];
        let mut i = 0u32;
        for _ in 0..1000 {
            assert!(!seen[i as usize], "entry {i} visited twice");
            seen[i as usize] = true;
            i = next[i as usize];
        }
        assert_eq!(i, 0, "the cycle closes after every entry");
        assert_eq!(chase_end(&next, 0, 1000), 0);
        assert_ne!(chase_end(&next, 0, 999), 0);
    }

    #[test]
    fn the_one_shot_floor_adds_the_three_rows_that_passed() {
        use crate::report::tests::record as rec;
        let row = |variant: &str, t: f64, ok: bool| {
            let mut r = rec(
                FLOOR_TEST,
                "floor",
                "device",
                8,
                t,
                if ok { Status::Ok } else { Status::Failed },
            );
            r.variant = variant.into();
            r
        };
        let rows = vec![
            row(NODE, 2.0, true),
            row(NODE_PDL, 0.5, true),
            row(STORE, 1.25, true),
            row(L2, 0.25, true),
        ];
        assert_eq!(one_shot_floor_us(&rows), Some(2.0));
        let rows = vec![
            row(NODE_PDL, 0.5, true),
            row(STORE, 1.25, false),
            row(L2, 0.25, true),
        ];
        assert_eq!(one_shot_floor_us(&rows), None);
    }
}
