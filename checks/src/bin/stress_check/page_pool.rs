//! The page pool, from the allocator and the mixers.

use crate::common::{below, hash, MAX_BATCH, PAGE_BYTES, TAG_PAGE};
use crate::outcome::{fail, same, Fail, Outcome};
use crate::roles::{Env, Worker};
use nvshmem::pool::PageId;
use nvshmem::CudaStream;
use nvshmem_checks::splitmix::{mix, SplitMix64};
use std::sync::Arc;

/// The bytes pool user `user` of PE `pe` writes into page `id` in its round `round`.
pub(crate) fn page_contents(
    env: &Env,
    pe: usize,
    user: usize,
    round: u64,
    id: PageId,
    len: usize,
) -> Vec<u8> {
    let base = hash(
        env.seed,
        &[TAG_PAGE, pe as u64, user as u64, round, id.to_raw()],
    );
    (0..len.div_ceil(8) as u64)
        .flat_map(|j| mix(base ^ j).to_le_bytes())
        .take(len)
        .collect()
}

/// Pages of a random PE, allocated, used and freed (whatever the use found).
pub(crate) fn pool_round(
    w: &Worker,
    user: usize,
    stream: &Arc<CudaStream>,
    round: u64,
    rng: &mut SplitMix64,
) -> Outcome {
    let pool = &w.env.world.pool;
    let pe = below(rng, w.env.n);
    let k = 1 + below(rng, MAX_BATCH);
    let in_place = rng.next_u64();
    w.doing(format!(
        "pool round {round}: allocating {k} pages of PE {pe}"
    ));
    let ids = pool.alloc_n(pe, k)?;
    let used = use_pages(w, user, stream, round, &ids, in_place);
    w.doing(format!("pool round {round}: freeing {k} pages of PE {pe}"));
    used.and(pool.free_n(&ids).map_err(Fail::from))
}

/// Write `ids` (this PE's own pages in place where `in_place`'s bit says so, the others by
/// one scatter), check they are still allocated, gather them back and compare.
fn use_pages(
    w: &Worker,
    user: usize,
    stream: &Arc<CudaStream>,
    round: u64,
    ids: &[PageId],
    in_place: u64,
) -> Outcome {
    let env = w.env;
    let (pool, bufs) = (&env.world.pool, &env.world.page_bufs[user]);
    let pages: Vec<Vec<u8>> = ids
        .iter()
        .map(|&id| page_contents(env, env.me, user, round, id, PAGE_BYTES))
        .collect();
    w.doing(format!("pool round {round}: writing {} pages", ids.len()));
    let (mut scattered, mut staged) = (Vec::new(), Vec::new());
    for (j, (&id, page)) in ids.iter().zip(&pages).enumerate() {
        if id.pe as usize == env.me && (in_place >> j) & 1 == 1 {
            pool.page_view(id.index as usize)?.copy_from_host(page)?;
        } else {
            scattered.push(id);
            staged.extend_from_slice(page);
        }
    }
    if !scattered.is_empty() {
        let src = bufs.src.view(..staged.len());
        src.copy_from_host(&staged)?;
        pool.scatter(&scattered, &src, stream)?;
        stream.synchronize()?;
    }
    for &id in ids {
        if !pool.is_allocated(id)? {
            return fail(format!("{id} is not allocated while this thread holds it"));
        }
    }
    w.doing(format!("pool round {round}: gathering {} pages", ids.len()));
    let dst = bufs.dst.view(..ids.len() * PAGE_BYTES);
    pool.gather(&dst, ids, stream)?;
    stream.synchronize()?;
    same(
        &format!("{} pages gathered back", ids.len()),
        &dst.to_vec()?,
        &pages.concat(),
    )
}
