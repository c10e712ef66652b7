//! The allocator under pressure: exhaustion, double frees and reuse in a small pool, and
//! allocations from every PE into one PE at once.

use nvshmem::pool::{PagePool, PagePoolConfig};
use nvshmem::{Error, Nvshmem};
use std::collections::HashSet;

use crate::harness::{e, expect_err, Outcome};
use crate::stale::next_generation;

/// Pages each PE allocates on PE 0 in the concurrent check, in batches of `BATCH`.
const CONCURRENT: usize = 24;
const BATCH: usize = 8;

/// Exhaustion, a double free and the reuse of freed pages.
pub(crate) fn exhaustion_and_reuse(shmem: &Nvshmem) -> Outcome {
    let me = shmem.my_pe();
    // Five pages: the last bitmap word has padding bits that must never be handed out.
    let small = PagePool::new(shmem, PagePoolConfig::new(5, 64).table_len(1)).map_err(e)?;
    let all = small.alloc_n(me, 5).map_err(e)?;
    let mut indices: Vec<u32> = all.iter().map(|id| id.index).collect();
    indices.sort_unstable();
    if indices != [0, 1, 2, 3, 4] {
        return Err(format!("5 pages of 5: {indices:?}"));
    }
    expect_err("a sixth page", small.alloc(me), |err| {
        matches!(
            err,
            Error::PoolExhausted {
                available: 0,
                requested: 1,
                ..
            }
        )
    })?;
    small.free(all[2]).map_err(e)?;
    expect_err("a double free", small.free(all[2]), |err| {
        matches!(err, Error::PageNotAllocated { .. })
    })?;
    let again = small.alloc(me).map_err(e)?;
    if again != next_generation(all[2]) {
        return Err(format!(
            "freed {} but got {again}: expected the same page in the next generation",
            all[2]
        ));
    }
    small.free_n(&[all[1], all[3]]).map_err(e)?;
    // All or nothing: 3 asked for, 2 free; the 2 taken are given back.
    expect_err("3 pages of 2 free", small.alloc_n(me, 3), |err| {
        matches!(
            err,
            Error::PoolExhausted {
                available: 2,
                requested: 3,
                ..
            }
        )
    })?;
    if small.in_use(me).map_err(e)? != 3 {
        return Err("a failed allocation kept pages".into());
    }
    let mut back: Vec<u32> = small
        .alloc_n(me, 2)
        .map_err(e)?
        .iter()
        .map(|id| id.index)
        .collect();
    back.sort_unstable();
    // `all` is in the threads' order, not the pages': its entries 1 and 3 are any pages.
    let mut freed = [all[1].index, all[3].index];
    freed.sort_unstable();
    if back != freed {
        return Err(format!(
            "reallocated {back:?}, expected the freed {freed:?}"
        ));
    }
    Ok(())
}

/// Concurrent allocation into PE 0 hands out every page once.
pub(crate) fn concurrent(shmem: &Nvshmem) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    // Room for everyone's pages and 5 more (padding in the last word).
    let pages = CONCURRENT * n + 5;
    let shared = PagePool::new(
        shmem,
        PagePoolConfig::new(pages, 16).table_len(CONCURRENT * n),
    )
    .map_err(e)?;
    // Every PE allocates on PE 0 at once, in batches (no error returns before the
    // barrier, which every PE must reach).
    let mut got = Vec::new();
    let allocated: Result<(), String> = (0..CONCURRENT / BATCH).try_for_each(|_| {
        got.extend(shared.alloc_n(0, BATCH).map_err(e)?);
        Ok(())
    });
    let published: Result<(), String> = got.iter().enumerate().try_for_each(|(k, &id)| {
        shared
            .table_set(0, me * CONCURRENT + k, Some(id))
            .map_err(e)
    });
    shmem.barrier_all().map_err(e)?;
    // Checked between barriers that every PE reaches, whatever it finds.
    let verified = (|| {
        let mut seen = HashSet::new();
        for entry in 0..CONCURRENT * n {
            let id = shared
                .table_get(0, entry)
                .map_err(e)?
                .ok_or_else(|| format!("entry {entry} of PE 0 is empty"))?;
            if id.pe != 0 || !seen.insert(id.index) {
                return Err(format!("{id} handed out twice, or not on PE 0"));
            }
        }
        match shared.in_use(0).map_err(e)? {
            used if used == CONCURRENT * n => Ok(()),
            used => Err(format!(
                "{used} pages of PE 0 in use, expected {}",
                CONCURRENT * n
            )),
        }
    })();
    shmem.barrier_all().map_err(e)?;
    let freed = shared.free_n(&got).map_err(e);
    shmem.barrier_all().map_err(e)?;
    let emptied = match shared.in_use(0).map_err(e)? {
        0 => Ok(()),
        left => Err(format!(
            "{left} pages of PE 0 still in use after every PE freed its own"
        )),
    };
    allocated
        .and(published)
        .and(verified)
        .and(freed)
        .and(emptied)
}
