//! The main pool, from the host: each PE's pages allocated, written and published in its page
//! table, gathered by the peers (host and device-id forms), scattered into by the previous PE,
//! the errors of bad input, and the pages freed at the end.

use nvshmem::pool::{PageId, PagePool, NO_PAGE};
use nvshmem::{DeviceBuffer, Error, Nvshmem};
use std::collections::HashSet;

use nvshmem_checks::splitmix::SplitMix64;

use crate::harness::{compare, e, expect_err, pattern, sync, Outcome};
use crate::{MINE, PAGES, PAGE_BYTES, TABLE};

/// The PEs whose pages a PE reads: the others, or itself when it is alone.
fn peers(me: usize, n: usize) -> Vec<usize> {
    match n {
        1 => vec![0],
        _ => (0..n).filter(|&p| p != me).collect(),
    }
}

/// `count` random published pages of `peers` (from their page tables), with their owners'
/// expected contents.
fn random_published(
    pool: &PagePool,
    peers: &[usize],
    count: usize,
    rng: &mut SplitMix64,
) -> Result<(Vec<PageId>, Vec<u8>), String> {
    let mut ids = Vec::new();
    let mut want = Vec::new();
    for _ in 0..count {
        let pe = peers[(rng.next_u64() % peers.len() as u64) as usize];
        let entry = (rng.next_u64() % MINE as u64) as usize;
        let id = pool
            .table_get(pe, entry)
            .map_err(e)?
            .ok_or_else(|| format!("PE {pe} published nothing in entry {entry}"))?;
        want.extend(pattern(1, pe, id.pe, id.index));
        ids.push(id);
    }
    Ok((ids, want))
}

/// The handle describes the pool.
pub(crate) fn handle(shmem: &Nvshmem, pool: &PagePool) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let h = pool.handle();
    let fields = (h.pages_per_pe, h.page_bytes, h.table_len, h.my_pe, h.n_pes);
    let want = (
        PAGES as u32,
        PAGE_BYTES as u64,
        TABLE as u32,
        me as i32,
        n as i32,
    );
    if fields != want || h.pages as u64 != pool.pages().addr() {
        return Err(format!("handle {fields:?}, expected {want:?}"));
    }
    Ok(())
}

/// Host allocation on this PE: `MINE` distinct pages of this PE, marked allocated.
pub(crate) fn alloc_mine(shmem: &Nvshmem, pool: &PagePool, mine: &mut Vec<PageId>) -> Outcome {
    let me = shmem.my_pe();
    *mine = pool.alloc_n(me, MINE).map_err(e)?;
    let distinct: HashSet<PageId> = mine.iter().copied().collect();
    if distinct.len() != MINE || mine.iter().any(|id| id.pe as usize != me) {
        return Err(format!("got {mine:?}"));
    }
    for &id in mine.iter() {
        if !pool.is_allocated(id).map_err(e)? {
            return Err(format!("{id} is not marked allocated"));
        }
    }
    match pool.in_use(me).map_err(e)? {
        MINE => Ok(()),
        used => Err(format!("{used} pages in use, expected {MINE}")),
    }
}

/// This PE's pages written and published in its page table.
pub(crate) fn publish(shmem: &Nvshmem, pool: &PagePool, mine: &[PageId]) -> Outcome {
    let me = shmem.my_pe();
    for (entry, &id) in mine.iter().enumerate() {
        let view = pool.page_view(id.index as usize).map_err(e)?;
        view.copy_from_host(&pattern(1, me, id.pe, id.index))
            .map_err(e)?;
        // The page is written (the copy waited): publish it.
        pool.table_set(me, entry, Some(id)).map_err(e)?;
    }
    Ok(())
}

/// Every PE's page table is readable.
pub(crate) fn tables_readable(shmem: &Nvshmem, pool: &PagePool) -> Outcome {
    let n = shmem.n_pes();
    for pe in 0..n {
        for entry in 0..MINE {
            match pool.table_get(pe, entry).map_err(e)? {
                Some(id) if id.pe as usize == pe => {}
                other => return Err(format!("PE {pe} entry {entry}: {other:?}")),
            }
        }
        if let Some(id) = pool.table_get(pe, MINE).map_err(e)? {
            return Err(format!("PE {pe} entry {MINE} was never set, holds {id}"));
        }
    }
    Ok(())
}

/// A host gather of random pages of the peers.
pub(crate) fn gather_random(shmem: &Nvshmem, pool: &PagePool, rng: &mut SplitMix64) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let others = peers(me, n);
    let (ids, want) = random_published(pool, &others, 2 * MINE, rng)?;
    let dst = shmem
        .alloc_device::<u8>(ids.len() * PAGE_BYTES)
        .map_err(e)?;
    pool.gather(&dst, &ids, shmem.stream()).map_err(e)?;
    sync(shmem)?;
    compare("gathered pages", &dst.to_vec().map_err(e)?, &want)
}

/// A host gather into u32 elements.
pub(crate) fn gather_u32(shmem: &Nvshmem, pool: &PagePool, rng: &mut SplitMix64) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let others = peers(me, n);
    let (ids, want) = random_published(pool, &others, 3, rng)?;
    let dst = shmem
        .alloc_device::<u32>(ids.len() * PAGE_BYTES / 4)
        .map_err(e)?;
    pool.gather(&dst, &ids, shmem.stream()).map_err(e)?;
    sync(shmem)?;
    let got: Vec<u8> = dst
        .to_vec()
        .map_err(e)?
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    compare("gathered pages", &got, &want)
}

/// A device-id gather skips ids that name no page.
pub(crate) fn gather_device_ids(shmem: &Nvshmem, pool: &PagePool, rng: &mut SplitMix64) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let others = peers(me, n);
    let (ids, published) = random_published(pool, &others, MINE, rng)?;
    let mut raw: Vec<u64> = ids.iter().map(|id| id.to_raw()).collect();
    // Two places whose ids name no page: they must keep what dst held.
    raw.insert(1, NO_PAGE);
    raw.push(PageId::new(me as u32, PAGES as u32).to_raw());
    let filler = vec![0xA5u8; PAGE_BYTES];
    let mut want = published[..PAGE_BYTES].to_vec();
    want.extend(&filler);
    want.extend(&published[PAGE_BYTES..]);
    want.extend(&filler);
    let ids_dev: DeviceBuffer<u64> = shmem.alloc_device(raw.len()).map_err(e)?;
    ids_dev.copy_from_host(&raw).map_err(e)?;
    let dst = shmem
        .alloc_device::<u8>(raw.len() * PAGE_BYTES)
        .map_err(e)?;
    dst.copy_from_host(&vec![0xA5u8; raw.len() * PAGE_BYTES])
        .map_err(e)?;
    pool.gather_device(&dst, &ids_dev, shmem.stream())
        .map_err(e)?;
    sync(shmem)?;
    compare("gathered pages", &dst.to_vec().map_err(e)?, &want)
}

/// A scatter into the next PE's pages.
pub(crate) fn scatter_next(shmem: &Nvshmem, pool: &PagePool) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    // Each PE writes round-2 data into the pages the next PE published.
    let next = (me + 1) % n;
    let mut ids = Vec::new();
    let mut src = Vec::new();
    for entry in 0..MINE {
        let id = pool
            .table_get(next, entry)
            .map_err(e)?
            .ok_or_else(|| format!("PE {next} published nothing in entry {entry}"))?;
        src.extend(pattern(2, me, id.pe, id.index));
        ids.push(id);
    }
    let dev = shmem.alloc_device::<u8>(src.len()).map_err(e)?;
    dev.copy_from_host(&src).map_err(e)?;
    pool.scatter(&ids, &dev, shmem.stream()).map_err(e)?;
    // Complete at the owner when the kernel ends; the barrier after the check orders it
    // before the owner's reads.
    sync(shmem)
}

/// The scattered pages hold the writer's data.
pub(crate) fn scattered(shmem: &Nvshmem, pool: &PagePool, mine: &[PageId]) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let writer = (me + n - 1) % n;
    for &id in mine {
        let got = pool
            .page_view(id.index as usize)
            .map_err(e)?
            .to_vec()
            .map_err(e)?;
        compare(
            &format!("{id} written by PE {writer}"),
            &got,
            &pattern(2, writer, id.pe, id.index),
        )?;
    }
    Ok(())
}

/// Bad input gives the right error.
pub(crate) fn bad_input(shmem: &Nvshmem, pool: &PagePool, mine: &[PageId]) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let dst = shmem.alloc_device::<u8>(PAGE_BYTES).map_err(e)?;
    let stream = shmem.stream();
    expect_err(
        "alloc on PE n",
        pool.alloc(n),
        |err| matches!(err, Error::PeOutOfRange { pe, n_pes } if *pe == n && *n_pes == n),
    )?;
    let beyond = PageId::new(me as u32, PAGES as u32);
    expect_err(
        "gather of a page past the end",
        pool.gather(&dst, &[beyond], stream),
        |err| matches!(err, Error::PageOutOfRange { index, pages_per_pe, .. } if *index == PAGES && *pages_per_pe == PAGES),
    )?;
    let nowhere = PageId::new(n as u32, 0);
    expect_err(
        "gather from PE n",
        pool.gather(&dst, &[nowhere], stream),
        |err| matches!(err, Error::PeOutOfRange { .. }),
    )?;
    let unused = (0..PAGES as u32)
        .map(|i| PageId::new(me as u32, i))
        .find(|id| !mine.contains(id))
        .ok_or("every page of this PE is in use")?;
    let not_allocated = |err: &Error| matches!(err, Error::PageNotAllocated { pe, index, .. } if *pe == me && *index == unused.index as usize);
    expect_err(
        "gather of a page never allocated",
        pool.gather(&dst, &[unused], stream),
        not_allocated,
    )?;
    expect_err(
        "free of a page never allocated",
        pool.free(unused),
        not_allocated,
    )?;
    if pool.is_allocated(unused).map_err(e)? {
        return Err(format!("{unused} reads as allocated"));
    }
    expect_err(
        "gather into too small a buffer",
        pool.gather(&dst, &mine[..2], stream),
        |err| matches!(err, Error::Length { expected, got, .. } if *expected == 2 * PAGE_BYTES && *got == PAGE_BYTES),
    )?;
    expect_err(
        "table entry past the end",
        pool.table_get(me, TABLE),
        |err| matches!(err, Error::IndexOutOfRange { index, len } if *index == TABLE && *len == TABLE),
    )?;
    expect_err(
        "more pages than a PE holds",
        pool.alloc_n(me, PAGES + 1),
        |err| {
            matches!(err, Error::PoolExhausted { pe, requested, available, pages_per_pe, page_bytes }
            if *pe == me && *requested == PAGES + 1 && *available == PAGES - MINE
                && *pages_per_pe == PAGES && *page_bytes == PAGE_BYTES)
        },
    )?;
    let text = pool.alloc_n(me, PAGES + 1).unwrap_err().to_string();
    if !text.contains("pages_per_pe") {
        return Err(format!(
            "the exhaustion message does not say what to raise: {text}"
        ));
    }
    Ok(())
}

/// This PE's pages of the main pool freed, its page table cleared.
pub(crate) fn free_mine(shmem: &Nvshmem, pool: &PagePool, mine: &[PageId]) -> Outcome {
    let me = shmem.my_pe();
    // Every reader is done (the barrier after the last check): free this PE's pages.
    for entry in 0..MINE {
        pool.table_set(me, entry, None).map_err(e)?;
    }
    pool.free_n(mine).map_err(e)?;
    match pool.in_use(me).map_err(e)? {
        0 => Ok(()),
        used => Err(format!("{used} pages still in use")),
    }
}
