//! alloc: symmetric allocations, frees and constructors.

use crate::common::{below, hash, CHURN_MAX, CHURN_PAGE, FILL_U32, MAX_LIVE, TAG_ALLOC, TAG_CHURN};
use crate::outcome::{fail, same, Fail, Outcome};
use crate::page_pool::{page_contents, pool_round};
use crate::roles::{Env, Worker};
use crate::tally::Kind;
use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::pool::{PagePool, PagePoolConfig};
use nvshmem::{CudaStream, SymmetricBuffer};
use nvshmem_checks::splitmix::{mix, SplitMix64};
use std::collections::VecDeque;
use std::sync::Arc;

/// A buffer the allocator keeps, and the round that wrote it.
struct Live {
    buf: SymmetricBuffer<u32>,
    round: u64,
}

/// The words PE `pe` wrote into the buffer it allocated in round `round`.
fn alloc_words(env: &Env, pe: usize, round: u64, len: usize) -> Vec<u32> {
    let base = hash(env.seed, &[TAG_ALLOC, pe as u64, round]);
    (0..len).map(|i| mix(base ^ i as u64) as u32).collect()
}

pub(crate) fn allocator(w: &Worker) {
    let env = w.env;
    let Some(stream) = w.new_stream() else {
        return;
    };
    // Drawn alike on every PE: what to allocate, free or build, and when.
    let mut shared = SplitMix64(hash(env.seed, &[TAG_ALLOC]));
    // This PE's own: its page-pool rounds.
    let mut own = SplitMix64(hash(env.seed, &[TAG_ALLOC, env.me as u64 + 1]));
    let mut live = VecDeque::new();
    for round in 1u64.. {
        let fresh = collective_step(w, &stream, round, &mut shared, &mut live);
        w.doing(format!("round {round}: barrier"));
        let stop = agree_to_stop(w);
        if let (true, Some(newest)) = (fresh, live.back()) {
            w.record(Kind::AllocPeer, check_peer_copy(w, newest, &mut shared));
        }
        let user = env.plan.mixers;
        w.record(Kind::Pool, pool_round(w, user, &stream, round, &mut own));
        match stop {
            Ok(false) => {}
            Ok(true) => break,
            Err(f) => {
                w.record(Kind::Barrier, Err(f));
                break;
            }
        }
    }
    // What is left, oldest first: the same sequence on every PE.
    while let Some(old) = live.pop_front() {
        w.record(Kind::Free, free_checked(w, old));
    }
}

/// This round's collective step, drawn alike on every PE; whether it allocated a buffer.
fn collective_step(
    w: &Worker,
    stream: &Arc<CudaStream>,
    round: u64,
    shared: &mut SplitMix64,
    live: &mut VecDeque<Live>,
) -> bool {
    let draw = shared.next_u64();
    if round.is_multiple_of(16) {
        w.record(Kind::Built, churn_channel(w, stream, round, shared));
        false
    } else if round % 16 == 8 {
        w.record(Kind::Built, churn_pool(w, stream, round));
        false
    } else if !live.is_empty() && (live.len() == MAX_LIVE || draw.is_multiple_of(3)) {
        let old = live.pop_front().expect("a live buffer");
        w.record(Kind::Free, free_checked(w, old));
        false
    } else {
        match allocate(w, round, shared) {
            Ok((buf, zeroed)) => {
                w.record(Kind::Alloc, write_new(w, &buf, round, zeroed));
                // Kept even if its check failed: every PE frees what every PE allocated.
                live.push_back(Live { buf, round });
                true
            }
            Err(e) => {
                w.record(Kind::Alloc, Err(e.into()));
                false
            }
        }
    }
}

/// A buffer of a drawn size and kind; whether it is zeroed.
fn allocate(
    w: &Worker,
    round: u64,
    shared: &mut SplitMix64,
) -> nvshmem::Result<(SymmetricBuffer<u32>, bool)> {
    let sh = w.env.shmem;
    let (a, b, c) = (shared.next_u64(), shared.next_u64(), shared.next_u64());
    // Up to 1 MiB, sizes spread over every power of two, and now and then none at all.
    let len = if a.is_multiple_of(32) {
        0
    } else {
        1 + (b % (1u64 << (a % 19))) as usize
    };
    match c % 3 {
        0 => {
            w.doing(format!("round {round}: malloc of {len} words"));
            Ok((sh.malloc(len)?, false))
        }
        1 => {
            w.doing(format!("round {round}: calloc of {len} words"));
            Ok((sh.calloc(len)?, true))
        }
        _ => {
            let align = 16usize << (c / 3 % 9);
            w.doing(format!(
                "round {round}: malloc_aligned({align}) of {len} words"
            ));
            Ok((sh.malloc_aligned(align, len)?, false))
        }
    }
}

/// A new buffer: zeroed if it must be; then this PE's words, read back.
fn write_new(w: &Worker, buf: &SymmetricBuffer<u32>, round: u64, zeroed: bool) -> Outcome {
    w.doing(format!("round {round}: writing {} words", buf.len()));
    if zeroed {
        same("a calloc'd buffer", &buf.to_vec()?, &vec![0; buf.len()])?;
    }
    let words = alloc_words(w.env, w.env.me, round, buf.len());
    buf.copy_from_host(&words)?;
    same("a new buffer, read back", &buf.to_vec()?, &words)
}

/// The next PE's copy of the newest buffer (written before the barrier), at four places.
fn check_peer_copy(w: &Worker, newest: &Live, shared: &mut SplitMix64) -> Outcome {
    let env = w.env;
    let picks = [shared.next_u64(), shared.next_u64()];
    let len = newest.buf.len();
    if len == 0 {
        return Ok(());
    }
    let next = env.next();
    w.doing(format!("round {}: reading PE {next}'s copy", newest.round));
    let want = alloc_words(env, next, newest.round, len);
    for i in [0, len - 1, picks[0] as usize % len, picks[1] as usize % len] {
        let got = env.shmem.g(&newest.buf, i, next)?;
        if got != want[i] {
            return fail(format!(
                "word {i} of PE {next}'s copy of round {}'s buffer: {got:#x}, expected {:#x}",
                newest.round, want[i]
            ));
        }
    }
    Ok(())
}

/// A buffer's words still as written, then its free (made whatever the check found).
fn free_checked(w: &Worker, old: Live) -> Outcome {
    let len = old.buf.len();
    w.doing(format!("free of round {}'s {len} words", old.round));
    let want = alloc_words(w.env, w.env.me, old.round, len);
    let intact = match old.buf.to_vec() {
        Ok(got) => same("a buffer before its free", &got, &want),
        Err(e) => Err(e.into()),
    };
    intact.and(old.buf.free().map_err(Fail::from))
}

/// Whether the allocator's rounds end here. PE 0's clock decides: it sets every PE's stop
/// word before the barrier, so every PE reads the same after it.
fn agree_to_stop(w: &Worker) -> Outcome<bool> {
    let env = w.env;
    let (sh, stop) = (env.shmem, &env.world.stop);
    if env.me == 0 && w.time_up() {
        for pe in 0..env.n {
            sh.p(stop, 0, 1u64, pe)?;
        }
    }
    sh.barrier_all()?;
    w.record(Kind::Barrier, Ok(()));
    Ok(sh.g(stop, 0, env.me)? != 0)
}

/// A channel from PE 0 to the last PE, built, used for one message and dropped while the
/// other threads run.
fn churn_channel(
    w: &Worker,
    stream: &Arc<CudaStream>,
    round: u64,
    shared: &mut SplitMix64,
) -> Outcome {
    let env = w.env;
    let len = 1 + below(shared, CHURN_MAX);
    let depth = 1 + below(shared, 3);
    w.doing(format!(
        "round {round}: Channel::new({len} words, depth {depth})"
    ));
    let ch = Channel::<u32>::new(
        env.shmem,
        ChannelConfig::new(0, env.n - 1, len).depth(depth),
    )?;
    let message: Vec<u32> = (0..len)
        .map(|i| hash(env.seed, &[TAG_CHURN, round, i as u64]) as u32)
        .collect();
    if env.me == 0 {
        w.doing(format!("round {round}: a message through the new channel"));
        let src = env.world.churn_src.view(..len);
        src.copy_from_host(&message)?;
        ch.send(&src, stream)?;
        stream.synchronize()?;
    }
    if env.me == env.n - 1 {
        w.doing(format!("round {round}: the message of the new channel"));
        let mut dst = env.world.churn_dst.view(..len);
        dst.copy_from_host(&vec![FILL_U32; len])?;
        ch.recv(&mut dst, stream)?;
        stream.synchronize()?;
        same("a new channel's message", &dst.to_vec()?, &message)?;
    }
    w.doing(format!("round {round}: dropping the channel"));
    drop(ch);
    Ok(())
}

/// A small page pool, built, one page of the next PE written and read back, dropped.
fn churn_pool(w: &Worker, stream: &Arc<CudaStream>, round: u64) -> Outcome {
    let env = w.env;
    let pages = 2 + (round / 16 % 5) as usize;
    w.doing(format!("round {round}: PagePool::new({pages} pages)"));
    let pool = PagePool::new(env.shmem, PagePoolConfig::new(pages, CHURN_PAGE))?;
    let next = env.next();
    let id = pool.alloc(next)?;
    let bytes = page_contents(env, env.me, usize::MAX, round, id, CHURN_PAGE);
    let bufs = &env.world.page_bufs[env.plan.mixers];
    let (src, dst) = (bufs.src.view(..CHURN_PAGE), bufs.dst.view(..CHURN_PAGE));
    src.copy_from_host(&bytes)?;
    pool.scatter(&[id], &src, stream)?;
    pool.gather(&dst, &[id], stream)?;
    stream.synchronize()?;
    let checked = same(&format!("{id} of a new pool"), &dst.to_vec()?, &bytes);
    w.doing(format!("round {round}: dropping the pool"));
    checked.and(pool.free(id).map_err(Fail::from))
}
