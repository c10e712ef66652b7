//! The KV-cache hand-off of disaggregated serving (`--tests kv-transfer`): PE 0 (prefill)
//! holds a request's pages at random places of its `PagePool`; `--peer` (decode) takes them
//! into one contiguous local buffer. Requests of 1, 4, 16, 64 and 256 pages of 16 KiB and
//! 64 KiB, each moved three ways in the same run, one launch per request:
//! - `pool pull`: the decode PE's `PagePool::gather_device` of the request's page ids;
//! - `nccl`: PE 0's `ncclSend` of each page and the decode PE's `ncclRecv` of each into
//!   place, one NCCL group per request on each side;
//! - `put`: PE 0's `put_on_stream` of the same bytes from a contiguous region, then
//!   `quiet_on_stream`: the pair's one-way put bandwidth at that size.
//!
//! Every row writes fresh random pages on PE 0; the decode PE's destination is poisoned
//! before the timed requests and must hold the request's pages after them, bit for bit. The
//! time is the decode PE's (PE 0's for `put`), per request.

use crate::cli::{format_size, Config, Mode};
use crate::coord::Coord;
use crate::data;
use crate::error::{CudaExt, Guard, Result};
use crate::nccl::Nccl;
use crate::pool::{expected, pages_of, Source, POOL_PAGES};
use crate::report::{Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::CudaStream;
use nvshmem::pool::{PageId, PagePool, PagePoolConfig};
use nvshmem::{DeviceBuffer, Nvshmem, SymmetricBuffer};
use std::sync::Arc;

/// The `test` of the rows.
pub const KV_TEST: &str = "kv-transfer";
pub const PAGE_BYTES: [usize; 2] = [16 << 10, 64 << 10];
pub const REQUEST_PAGES: [usize; 5] = [1, 4, 16, 64, 256];
/// Data key (`data::key`).
const K_KV: u64 = 78;

/// How a row moves the pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    PoolPull,
    Nccl,
    Put,
}

impl Way {
    pub const ALL: [Way; 3] = [Way::PoolPull, Way::Nccl, Way::Put];

    /// The implementation column.
    pub fn name(self) -> &'static str {
        match self {
            Way::PoolPull => "pool pull",
            Way::Nccl => "nccl",
            Way::Put => "put",
        }
    }
}

/// The variant of a row: its page size.
pub fn variant(page_bytes: usize) -> String {
    format!("{} pages", format_size(page_bytes))
}

/// What the benchmark runs with.
pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    pub progress: &'a Progress,
    pub nccl: Option<&'a Nccl>,
}

/// A page size's pool (every page of every PE allocated) and the puts' destination.
struct Setup {
    pool: Guard<PagePool>,
    /// The decode PE's destination of the puts (symmetric, the largest request).
    put_dst: Guard<SymmetricBuffer<u8>>,
    page_bytes: usize,
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let n = ctx.shmem.n_pes();
    if n < 2 || ctx.cfg.peer >= n || ctx.cfg.peer == 0 {
        let note = format!(
            "kv-transfer skipped: it needs PE 0 and a decode PE --peer (there are {n} PEs, --peer {})",
            ctx.cfg.peer
        );
        ctx.progress.say(&note);
        results.notes.push(note);
        return Ok(());
    }
    for page_bytes in PAGE_BYTES {
        timing::step(format!(
            "kv-transfer: {}: building the pool",
            variant(page_bytes)
        ));
        let s = Setup {
            pool: Guard::new(PagePool::new(
                ctx.shmem,
                PagePoolConfig::new(POOL_PAGES, page_bytes),
            )?),
            put_dst: Guard::new(ctx.shmem.malloc::<u8>(POOL_PAGES * page_bytes)?),
            page_bytes,
        };
        let mine = s.pool.alloc_n(ctx.shmem.my_pe(), POOL_PAGES)?;
        for pages in REQUEST_PAGES {
            for way in Way::ALL {
                if way == Way::Nccl && ctx.nccl.is_none() {
                    continue;
                }
                let r = row(ctx, timer, &s, pages, way)?;
                ctx.progress.say(format!(
                    "kv-transfer {pages} x {} {}: {}",
                    variant(page_bytes),
                    way.name(),
                    match (r.status, r.median_us(), r.algbw_gbs) {
                        (Status::Ok, Some(t), Some(bw)) => format!("{t:.2} us, {bw:.1} GB/s"),
                        _ => format!("FAILED: {}", r.check),
                    }
                ));
                results.push(r);
            }
        }
        ctx.coord.barrier()?;
        s.pool.free_n(&mine)?;
    }
    Ok(())
}

/// One row: fresh pages on PE 0, the request moved `iters` times after a warm-up, timed on
/// the side that finishes it, and checked on the decode PE.
fn row(ctx: &Ctx, timer: &mut Timer, s: &Setup, pages: usize, way: Way) -> Result<Record> {
    let (me, n, peer) = (ctx.shmem.my_pe(), ctx.shmem.n_pes(), ctx.cfg.peer);
    let bytes = pages * s.page_bytes;
    let stream = ctx.stream;
    let key = data::key(
        ctx.cfg.seed,
        &[K_KV, s.page_bytes as u64, pages as u64, way as u64],
    );
    timing::step(format!(
        "kv-transfer {pages} x {}: {}",
        variant(s.page_bytes),
        way.name()
    ));
    if me == 0 {
        s.pool
            .pages()
            .copy_from_host(&data::bytes(key, 0, POOL_PAGES * s.page_bytes))?;
    }
    // The request's pages: distinct random pages of PE 0.
    let ids: Vec<PageId> = pages_of(Source::Peer, pages, peer, n, 0, key);
    // The decode PE's destination and the ids, poisoned and written before any move.
    let dst: Guard<DeviceBuffer<u8>> = Guard::new(ctx.shmem.alloc_device(bytes)?);
    let ids_dev: Guard<DeviceBuffer<u64>> = Guard::new(ctx.shmem.alloc_device(pages)?);
    if me == peer {
        ids_dev.copy_from_host(&ids.iter().map(|id| id.to_raw()).collect::<Vec<_>>())?;
        dst.copy_from_host(&vec![0xA5; bytes])?;
        s.put_dst.copy_from_host(&vec![0xA5; s.put_dst.len()])?;
    }
    ctx.coord.barrier()?;
    let nccl = ctx.nccl;
    // One request's move on this PE (nothing on the PEs it does not involve).
    let op = |_: usize| -> Result<()> {
        match (way, me == 0, me == peer) {
            (Way::PoolPull, _, true) => Ok(s.pool.gather_device(&*dst, &*ids_dev, stream)?),
            (Way::Nccl, true, _) => nccl.expect("NCCL rows only with NCCL").group(|| {
                for id in &ids {
                    let src = s.pool.pages().addr() + id.index as u64 * s.page_bytes as u64;
                    // SAFETY: a page of the pool, page_bytes long.
                    unsafe { nccl.unwrap().send(src, s.page_bytes, peer, stream)? };
                }
                Ok(())
            }),
            (Way::Nccl, _, true) => nccl.expect("NCCL rows only with NCCL").group(|| {
                for k in 0..pages {
                    let at = dst.addr() + (k * s.page_bytes) as u64;
                    // SAFETY: page k of the destination, inside it.
                    unsafe { nccl.unwrap().recv(at, s.page_bytes, 0, stream)? };
                }
                Ok(())
            }),
            (Way::Put, true, _) => {
                let src = s.pool.pages().try_view(0..bytes)?;
                ctx.shmem
                    .put_on_stream(s.put_dst.try_view(0..bytes)?, src, peer, stream)?;
                Ok(ctx.shmem.quiet_on_stream(stream)?)
            }
            _ => Ok(()),
        }
    };
    let (warm, iters) = ctx.cfg.iters_for(bytes);
    let samples = timer.time_each(stream, warm + iters, 1, |_| Ok(()), op)?;
    stream.synchronize().cuda("cuStreamSynchronize")?;
    ctx.coord.barrier()?;
    let timed_here = match way {
        Way::Put => me == 0,
        _ => me == peer,
    };
    let mut problem = None;
    if me == peer {
        let want = match way {
            Way::Put => data::bytes_at(key, 0, 0, bytes),
            _ => expected(key, &ids, s.page_bytes),
        };
        let got = match way {
            Way::Put => s.put_dst.to_vec()?[..bytes].to_vec(),
            _ => dst.to_vec()?,
        };
        let m = data::compare_plain(&got, &want);
        if m.count > 0 {
            problem = Some(format!(
                "the request's pages on PE {peer}: {}",
                m.describe()
            ));
        }
    }
    let mut r = Record::bytes_row(
        KV_TEST,
        variant(s.page_bytes),
        way.name(),
        Mode::Plain,
        bytes,
        pages,
        n,
    );
    // The timing side's figures reach every PE's report.
    let mine = match timed_here {
        true => stats::summarize(&samples[warm..]),
        false => None,
    };
    let timer_pe = if way == Way::Put { 0 } else { peer };
    r.time_us = ctx.coord.gather_summaries(mine)?[timer_pe];
    r.algbw_gbs = r.time_us.map(|t| stats::algbw_gbs(bytes as f64, t.median));
    r.busbw_gbs = r.algbw_gbs;
    if ctx.coord.sum(problem.is_some() as u64)? > 0 {
        r.status = Status::Failed;
        r.check = problem.unwrap_or_else(|| format!("failed on PE {peer}"));
        r.algbw_gbs = None;
        r.busbw_gbs = None;
    }
    Ok(r)
}
