//! Page-pool gathers: `nvshmem::pool::PagePool::gather_device` of 1, 16 and 256 pages of
//! 16 KiB and 64 KiB into local memory, from one peer, from all peers in turn, and from this
//! PE's own pages (the local baseline: the same kernel doing a device-to-device copy of the
//! same number of pages). PE 0 gathers; the other PEs hold pages. Each row's gathers are
//! captured in a CUDA graph and timed by replays; every row gets fresh random pages on every
//! PE, and its destination (poisoned before the replays) must hold them afterwards.

use crate::cli::{format_size, Config, Mode};
use crate::coord::Coord;
use crate::data;
use crate::error::{CudaExt, Guard, Result};
use crate::report::{Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::CudaStream;
use nvshmem::pool::{PageId, PagePool, PagePoolConfig};
use nvshmem::{DeviceBuffer, Nvshmem};
use std::sync::Arc;
use std::time::Instant;

/// The `test` of the pool rows.
pub const POOL_TEST: &str = "pool";

/// Page sizes of the rows.
pub const PAGE_BYTES: [usize; 2] = [16 << 10, 64 << 10];

/// Pages per gather.
pub const PAGE_COUNTS: [usize; 3] = [1, 16, 256];

/// Pages every PE holds (all allocated): enough for the largest gather from one PE.
pub const POOL_PAGES: usize = 256;

/// Where the pages of a row come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The peer PE (--peer; PE 0 itself when alone).
    Peer,
    /// Every other PE in turn (PE 0 itself when alone).
    AllPeers,
    /// PE 0's own pages: a local device-to-device copy by the same kernel.
    Local,
}

impl Source {
    pub const ALL: [Source; 3] = [Source::Peer, Source::AllPeers, Source::Local];

    /// The implementation column of the row.
    pub fn name(self) -> &'static str {
        match self {
            Source::Peer => "one peer",
            Source::AllPeers => "all peers",
            Source::Local => "local",
        }
    }
}

/// The variant of a row: its page size and source.
pub fn variant(page_bytes: usize, source: Source) -> String {
    format!("{} pages, {}", format_size(page_bytes), source.name())
}

/// The pages PE `me` of `n` gathers in a row of `count` pages from `source` (`peer`: the PE of
/// `Source::Peer`): distinct indices drawn by `key`, page `k` from its source's PE.
pub fn pages_of(
    source: Source,
    count: usize,
    me: usize,
    n: usize,
    peer: usize,
    key: u64,
) -> Vec<PageId> {
    let others: Vec<usize> = match n {
        1 => vec![me],
        _ => (0..n).filter(|&p| p != me).collect(),
    };
    // A shuffle of every index (Fisher-Yates on the counter-based words), cut to `count`.
    let mut indices: Vec<u32> = (0..POOL_PAGES as u32).collect();
    for i in (1..indices.len()).rev() {
        let j = (data::word(key, 0, i) % (i as u64 + 1)) as usize;
        indices.swap(i, j);
    }
    (0..count)
        .map(|k| {
            let pe = match source {
                Source::Peer => peer,
                Source::AllPeers => others[k % others.len()],
                Source::Local => me,
            };
            PageId::new(pe as u32, indices[k % POOL_PAGES])
        })
        .collect()
}

/// What the gather of `ids` must leave: each page's random bytes as its PE wrote them.
pub fn expected(key: u64, ids: &[PageId], page_bytes: usize) -> Vec<u8> {
    ids.iter()
        .flat_map(|id| {
            data::bytes_at(
                key,
                id.pe as usize,
                id.index as usize * page_bytes,
                page_bytes,
            )
        })
        .collect()
}

/// What the pool benchmark runs with.
pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    pub progress: &'a Progress,
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let n = ctx.shmem.n_pes();
    let peer = match n {
        1 => 0,
        _ => ctx.cfg.peer,
    };
    let sources: Vec<Source> = if peer >= n {
        let note =
            format!("pool: gathers from one peer skipped: there are {n} PEs and --peer is {peer}");
        ctx.progress.say(&note);
        results.notes.push(note);
        vec![Source::AllPeers, Source::Local]
    } else {
        Source::ALL.to_vec()
    };
    for page_bytes in PAGE_BYTES {
        timing::step(format!(
            "pool: {} pages: building the pool",
            format_size(page_bytes)
        ));
        let pool = Guard::new(PagePool::new(
            ctx.shmem,
            PagePoolConfig::new(POOL_PAGES, page_bytes),
        )?);
        // Every page of every PE allocated: any index is a page a gather may name.
        let mine = pool.alloc_n(ctx.shmem.my_pe(), POOL_PAGES)?;
        for count in PAGE_COUNTS {
            for &source in &sources {
                let r = row(ctx, timer, &pool, page_bytes, count, source, peer)?;
                ctx.progress.say(format!(
                    "pool {} x {}: {}",
                    count,
                    variant(page_bytes, source),
                    match (r.status, r.median_us(), r.algbw_gbs) {
                        (Status::Ok, Some(t), Some(bw)) => format!("{t:.2} us, {bw:.1} GB/s"),
                        _ => format!("FAILED: {}", r.check),
                    }
                ));
                results.push(r);
            }
        }
        ctx.coord.barrier()?;
        pool.free_n(&mine)?;
    }
    Ok(())
}

/// One row: fresh pages on every PE; on PE 0 the gathers captured, replayed, timed and
/// checked. Every PE returns the row with the same status (the time only on PE 0).
fn row(
    ctx: &Ctx,
    timer: &mut Timer,
    pool: &PagePool,
    page_bytes: usize,
    count: usize,
    source: Source,
    peer: usize,
) -> Result<Record> {
    let (me, n) = (ctx.shmem.my_pe(), ctx.shmem.n_pes());
    let stream = ctx.stream;
    let bytes = count * page_bytes;
    let what = format!("pool {count} x {}", variant(page_bytes, source));
    let key = data::key(
        ctx.cfg.seed,
        &[
            data::hash_bytes(POOL_TEST.as_bytes()),
            page_bytes as u64,
            count as u64,
            source as u64,
        ],
    );
    timing::step(format!("{what}: writing fresh pages"));
    pool.pages()
        .copy_from_host(&data::bytes(key, me, POOL_PAGES * page_bytes))?;
    ctx.coord.barrier()?;

    let mut record = Record::bytes_row(
        POOL_TEST,
        variant(page_bytes, source),
        source.name(),
        Mode::Graph,
        bytes,
        count,
        n,
    );
    let mut problem = None;
    if me == 0 {
        let ids = pages_of(source, count, me, n, peer, key);
        let raw: Vec<u64> = ids.iter().map(|id| id.to_raw()).collect();
        let ids_dev: Guard<DeviceBuffer<u64>> = Guard::new(ctx.shmem.alloc_device(count)?);
        ids_dev.copy_from_host(&raw)?;
        let dst = Guard::new(ctx.shmem.alloc_device::<u8>(bytes)?);
        let gather = || pool.gather_device(&*dst, &*ids_dev, stream);

        // The first gather shows that it runs and sizes the case.
        timing::step(format!("{what}: first gathers"));
        gather()?;
        stream.synchronize().cuda("cuStreamSynchronize")?;
        let start = Instant::now();
        gather()?;
        stream.synchronize().cuda("cuStreamSynchronize")?;
        let probe_us = start.elapsed().as_secs_f64() * 1e6;
        let (warm, iters, graph_ops) = ctx.cfg.budgeted(bytes, probe_us, true);

        timing::step(format!("{what}: capturing {graph_ops} gathers"));
        match timing::capture(stream, graph_ops, || gather().map_err(|e| e.to_string())) {
            Err(msg) => problem = Some(format!("CUDA graph capture failed: {msg}")),
            Ok(graph) => {
                // Poisoned: what is checked below is the replays' own.
                ctx.shmem
                    .context()
                    .bind_to_thread()
                    .cuda("cuCtxSetCurrent")?;
                // SAFETY: the destination's own address and size.
                unsafe {
                    cudarc::driver::result::memset_d8_async(
                        dst.addr(),
                        0xff,
                        bytes,
                        stream.cu_stream(),
                    )
                }
                .cuda("cuMemsetD8Async")?;
                timing::step(format!("{what}: warm-up and timed replays"));
                let samples = timer.time_graph(stream, &graph, warm, iters, graph_ops)?;
                timing::step(format!("{what}: checking"));
                let mismatch =
                    data::compare_plain(&dst.to_vec()?, &expected(key, &ids, page_bytes));
                if mismatch.count > 0 {
                    problem = Some(format!("gathered pages: {}", mismatch.describe()));
                }
                record.time_us = stats::summarize(&samples);
                record.algbw_gbs = record
                    .time_us
                    .map(|t| stats::algbw_gbs(bytes as f64, t.median));
                record.busbw_gbs = record.algbw_gbs;
            }
        }
    }
    // Every PE reports the row as PE 0 found it.
    if ctx.coord.sum(problem.is_some() as u64)? > 0 {
        record.status = Status::Failed;
        record.check = problem.unwrap_or_else(|| "failed on PE 0".into());
    }
    if record.status == Status::Failed {
        // A wrong row gives no figure.
        record.algbw_gbs = None;
        record.busbw_gbs = None;
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn rows_take_distinct_pages_from_their_sources() {
        for (n, me, peer) in [(1, 0, 0), (2, 0, 1), (4, 0, 2), (8, 0, 1)] {
            for source in Source::ALL {
                for count in PAGE_COUNTS {
                    let ids = pages_of(source, count, me, n, peer, 42);
                    assert_eq!(ids.len(), count);
                    let distinct: HashSet<PageId> = ids.iter().copied().collect();
                    assert_eq!(distinct.len(), count, "{source:?} {count} of {n}");
                    assert!(ids.iter().all(|id| (id.index as usize) < POOL_PAGES));
                    let pes: HashSet<u32> = ids.iter().map(|id| id.pe).collect();
                    match source {
                        Source::Peer => assert_eq!(pes, HashSet::from([peer as u32])),
                        Source::Local => assert_eq!(pes, HashSet::from([me as u32])),
                        Source::AllPeers if n == 1 => assert_eq!(pes, HashSet::from([0])),
                        Source::AllPeers => {
                            assert!(!pes.contains(&(me as u32)));
                            assert_eq!(pes.len(), (n - 1).min(count));
                        }
                    }
                }
            }
        }
        // Fresh keys draw other pages.
        assert_ne!(
            pages_of(Source::Peer, 16, 0, 2, 1, 1),
            pages_of(Source::Peer, 16, 0, 2, 1, 2)
        );
    }

    #[test]
    fn the_expected_pages_are_what_their_pes_wrote() {
        let page = 64;
        let ids = [PageId::new(1, 3), PageId::new(0, 0)];
        let want = expected(7, &ids, page);
        assert_eq!(want.len(), 2 * page);
        assert_eq!(&want[..page], &data::bytes(7, 1, 4 * page)[3 * page..]);
        assert_eq!(&want[page..], &data::bytes(7, 0, page)[..]);
    }

    #[test]
    fn variants_name_the_page_size_and_source() {
        assert_eq!(variant(16 << 10, Source::Peer), "16 KiB pages, one peer");
        assert_eq!(variant(64 << 10, Source::Local), "64 KiB pages, local");
    }
}
