//! mix: host RMA and atomics into this thread's slots, and the page pool.

use crate::common::{below, hash, SLOT, TAG_MIX, TAG_RMA};
use crate::outcome::{fail, same, Outcome};
use crate::page_pool::pool_round;
use crate::roles::{Env, Worker};
use crate::tally::Kind;
use nvshmem_checks::splitmix::SplitMix64;

/// The first word of mixer `m` of PE `pe`'s slot, on every PE.
fn slot(env: &Env, pe: usize, m: usize) -> usize {
    (pe * env.plan.mixers + m) * SLOT
}

pub(crate) fn mixer(w: &Worker, m: usize) {
    let env = w.env;
    let Some(stream) = w.new_stream() else {
        return;
    };
    let mut rng = SplitMix64(hash(env.seed, &[TAG_MIX, env.me as u64, m as u64]));
    // What this thread's counter holds on every PE (only this thread changes it).
    let mut held = vec![0u64; env.n];
    let mut round = 0u64;
    while !w.time_up() {
        round += 1;
        let pe = below(&mut rng, env.n);
        match below(&mut rng, 4) {
            0 => {
                w.record(Kind::PutGet, put_get(w, m, pe, round, &mut rng));
            }
            1 => {
                w.record(Kind::PG, p_g(w, m, pe, round, &mut rng));
            }
            2 => {
                let r = atomics(w, m, pe, &mut rng, &mut held[pe]);
                if !w.record(Kind::Atomics, r) {
                    // Start again from what the counter holds, so that one failure is one.
                    let at = env.me * env.plan.mixers + m;
                    if let Ok(v) = env.shmem.atomic_fetch(&env.world.counters, at, pe) {
                        held[pe] = v;
                    }
                }
            }
            _ => {
                w.record(Kind::Pool, pool_round(w, m, &stream, round, &mut rng));
            }
        }
    }
}

/// Words put into this thread's slot on `pe` (blocking or `_nbi`), and got back.
fn put_get(w: &Worker, m: usize, pe: usize, round: u64, rng: &mut SplitMix64) -> Outcome {
    let env = w.env;
    let (sh, world) = (env.shmem, env.world);
    let len = 1 + below(rng, SLOT);
    let at = slot(env, env.me, m) + below(rng, SLOT - len + 1);
    let nbi = rng.next_u64() % 2 == 1;
    let words: Vec<u64> = (0..len as u64)
        .map(|i| hash(env.seed, &[TAG_RMA, env.me as u64, m as u64, round, i]))
        .collect();
    let mine = m * 2 * SLOT;
    let src = world.rma.view(mine..mine + len);
    let back = world.rma.view(mine + SLOT..mine + SLOT + len);
    let dest = world.slots.view(at..at + len);
    let how = if nbi { "_nbi" } else { "" };
    w.doing(format!("put{how} of {len} words to PE {pe}"));
    src.copy_from_host(&words)?;
    if nbi {
        sh.put_nbi(dest, src, pe)?;
    } else {
        sh.put(dest, src, pe)?;
    }
    sh.quiet()?;
    w.doing(format!("get{how} of {len} words from PE {pe}"));
    if nbi {
        sh.get_nbi(back, dest, pe)?;
        sh.quiet()?;
    } else {
        sh.get(back, dest, pe)?;
    }
    same(
        &format!("{len} words put to PE {pe} and got back"),
        &back.to_vec()?,
        &words,
    )
}

/// One word `p`'d into this thread's slot on `pe`, and `g`'d back.
fn p_g(w: &Worker, m: usize, pe: usize, round: u64, rng: &mut SplitMix64) -> Outcome {
    let env = w.env;
    let (sh, slots) = (env.shmem, &env.world.slots);
    let at = slot(env, env.me, m) + below(rng, SLOT);
    let v = hash(env.seed, &[TAG_RMA, env.me as u64, m as u64, round]);
    w.doing(format!("p and g of word {at} on PE {pe}"));
    sh.p(slots, at, v, pe)?;
    sh.quiet()?;
    let got = sh.g(slots, at, pe)?;
    if got != v {
        return fail(format!("g read {got:#x} from PE {pe}, p wrote {v:#x}"));
    }
    Ok(())
}

/// Atomics on this thread's counter on `pe`, whose value it knows (`held`): every fetched
/// value must be it.
fn atomics(w: &Worker, m: usize, pe: usize, rng: &mut SplitMix64, held: &mut u64) -> Outcome {
    let env = w.env;
    let (sh, c) = (env.shmem, &env.world.counters);
    let at = env.me * env.plan.mixers + m;
    let v = rng.next_u64() >> 4;
    let is = |what: &str, got: u64, want: u64| {
        if got == want {
            Ok(())
        } else {
            fail(format!("{what} on PE {pe}: {got:#x}, expected {want:#x}"))
        }
    };
    let which = below(rng, 6);
    w.doing(format!("atomics ({which}) on PE {pe}"));
    match which {
        0 => {
            let old = sh.atomic_fetch_add(c, at, v, pe)?;
            let r = is("fetch_add returned", old, *held);
            *held = held.wrapping_add(v);
            r
        }
        1 => {
            let old = sh.atomic_compare_swap(c, at, *held, v, pe)?;
            let r = is("compare_swap (equal) returned", old, *held);
            *held = v;
            // A condition that does not hold leaves the counter as it is.
            let old = sh.atomic_compare_swap(c, at, v ^ 1, 0, pe)?;
            r.and(is("compare_swap (unequal) returned", old, v))
        }
        2 => {
            let old = sh.atomic_swap(c, at, v, pe)?;
            let r = is("swap returned", old, *held);
            *held = v;
            r
        }
        3 => {
            sh.atomic_set(c, at, v, pe)?;
            *held = v;
            is("fetch after set", sh.atomic_fetch(c, at, pe)?, v)
        }
        4 => {
            let old = sh.atomic_fetch_inc(c, at, pe)?;
            let r = is("fetch_inc returned", old, *held);
            sh.atomic_add(c, at, v, pe)?;
            sh.atomic_inc(c, at, pe)?;
            *held = held.wrapping_add(v).wrapping_add(2);
            r.and(is(
                "fetch after inc, add, inc",
                sh.atomic_fetch(c, at, pe)?,
                *held,
            ))
        }
        _ => {
            let old = sh.atomic_fetch_or(c, at, v, pe)?;
            let r = is("fetch_or returned", old, *held);
            *held |= v;
            let old = sh.atomic_fetch_xor(c, at, v >> 3, pe)?;
            let r = r.and(is("fetch_xor returned", old, *held));
            *held ^= v >> 3;
            let old = sh.atomic_fetch_and(c, at, !v, pe)?;
            let r = r.and(is("fetch_and returned", old, *held));
            *held &= !v;
            r
        }
    }
}
