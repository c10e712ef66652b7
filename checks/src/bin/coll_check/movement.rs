//! The broadcast and the all-to-all: every algorithm, root and size (refusing what a staging
//! slot or the lines cannot hold), calls back to back and in a graph, bursts with late peers,
//! and broadcasts between all-reduces.

use nvshmem::{
    bf16, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Collectives, Error, Nvshmem, ReduceOp, Result,
};
use std::time::Duration;

use nvshmem_checks::graph::capture;

use crate::harness::{
    compare, cuda, expect_err, ll_limit, operands, place, sync, uploaded, zeroed, Checker,
};
use crate::reference::{all_to_all_want, inputs, reference, Reducible};

/// `dst = src on root` on every PE (`dst` is `src` itself when `in_place`).
pub(crate) fn broadcast_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (algo, root, in_place): (BroadcastAlgo, usize, bool),
    n: usize,
) -> Result<()> {
    let (all, src, dst, _) = operands::<T>(shmem, coll, seed, n)?;
    let dst = if in_place { &src } else { &dst };
    coll.broadcast(dst, &src, root, algo, shmem.stream())?;
    sync(shmem)?;
    compare("broadcast", &dst.to_vec()?, &all[root])
}

pub(crate) fn all_to_all_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllToAllAlgo,
    block: usize,
) -> Result<()> {
    let (me, np) = place(coll)?;
    let (all, src, dst, _) = operands::<T>(shmem, coll, seed, block * np)?;
    coll.all_to_all(&dst, &src, algo, shmem.stream())?;
    sync(shmem)?;
    compare(
        "all_to_all",
        &dst.to_vec()?,
        &all_to_all_want(&all, me, block),
    )
}

/// Broadcasts from every root and all-to-alls, back to back on one stream with the same
/// buffers and no host synchronisation, then an all-to-all captured in a graph and replayed
/// on new inputs: each must leave its own result.
fn movement_repeated(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (algo, a2a): (BroadcastAlgo, AllToAllAlgo),
    block: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let n = block * np;
    let rounds: Vec<Vec<Vec<f32>>> = (0..np as u64 + 2)
        .map(|r| inputs::<f32>(seed + r, np, n))
        .collect();
    let srcs = uploaded(shmem, rounds.iter().map(|all| &all[me][..]))?;
    // One output per round, each written by a broadcast from root r and then, in the same
    // buffer's second half of the rounds, by an all-to-all.
    let dsts = zeroed(shmem, rounds.len(), n)?;
    let s = shmem.stream();
    for (r, (src, dst)) in srcs.iter().zip(&dsts).enumerate() {
        if r < np {
            coll.broadcast(dst, src, r, algo, s)?;
        } else {
            coll.all_to_all(dst, src, a2a, s)?;
        }
    }
    sync(shmem)?;
    let want = |r: usize| match r < np {
        true => rounds[r][r].clone(),
        false => all_to_all_want(&rounds[r], me, block),
    };
    let mut found = Ok(());
    for (r, d) in dsts.iter().enumerate() {
        found = found.and(compare(
            &format!("back-to-back call {r}"),
            &d.to_vec()?,
            &want(r),
        ));
    }
    // Every PE runs the graph part whatever it found (its replays wait for every PE).
    let stream = shmem.new_stream()?;
    let last = rounds.len() - 1;
    let graph = capture(&stream, || {
        coll.all_to_all(&dsts[0], &srcs[0], a2a, &stream)
    })?;
    for r in [last - 1, last] {
        srcs[0].copy_from_host(&rounds[r][me])?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        found = found.and(compare(
            &format!("graph replay of all_to_all {r}"),
            &dsts[0].to_vec()?,
            &all_to_all_want(&rounds[r], me, block),
        ));
    }
    found
}

/// `calls` broadcasts from `root` back to back, each into an output of its own, with no host
/// synchronisation in between, the other PEs enqueueing theirs 20 ms late: the root must not
/// run ahead into staging its peers have not read yet.
fn broadcast_burst(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (algo, root, calls): (BroadcastAlgo, usize, usize),
    n: usize,
) -> Result<()> {
    let np = shmem.n_pes();
    let rounds: Vec<Vec<f32>> = (0..calls as u64)
        .map(|r| inputs::<f32>(seed + r, np, n).swap_remove(root))
        .collect();
    let srcs = uploaded(shmem, rounds.iter().map(|x| &x[..]))?;
    let dsts = zeroed(shmem, calls, n)?;
    sync(shmem)?;
    if shmem.my_pe() != root {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (src, dst) in srcs.iter().zip(&dsts) {
        coll.broadcast(dst, src, root, algo, shmem.stream())?;
    }
    sync(shmem)?;
    let mut found = Ok(());
    for (r, d) in dsts.iter().enumerate() {
        found = found.and(compare(&format!("broadcast {r}"), &d.to_vec()?, &rounds[r]));
    }
    found
}

/// Broadcasts between all-reduces, back to back with no host synchronisation: a one-shot
/// all-reduce (staging of one epoch parity; the bandwidth one around the relay, whose round
/// flags it shares), a broadcast from a rotating root, a low-latency all-reduce (lines of the
/// other parity), `rounds` times. A broadcast that let a PE run ahead into the next call
/// would let it overwrite staging or lines a peer still reads.
fn broadcast_between_reductions(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: BroadcastAlgo,
    (rounds, n): (usize, usize),
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let data: Vec<Vec<Vec<f32>>> = (0..3 * rounds as u64)
        .map(|r| inputs::<f32>(seed + r, np, n))
        .collect();
    let bufs = uploaded(shmem, data.iter().map(|all| &all[me][..]))?;
    let outs = zeroed(shmem, bufs.len(), n)?;
    let s = shmem.stream();
    let sum = |i: usize, a: AllReduceAlgo| coll.all_reduce(&outs[i], &bufs[i], ReduceOp::Sum, a, s);
    // The relay's round flags are the bandwidth all-reduce's: it goes between those.
    let first = match algo {
        BroadcastAlgo::Relay => AllReduceAlgo::Bandwidth,
        _ => AllReduceAlgo::OneShot,
    };
    for r in 0..rounds {
        sum(3 * r, first)?;
        coll.broadcast(&outs[3 * r + 1], &bufs[3 * r + 1], r % np, algo, s)?;
        sum(3 * r + 2, AllReduceAlgo::LowLatency)?;
    }
    sync(shmem)?;
    let mut found = Ok(());
    for (i, out) in outs.iter().enumerate() {
        let want = match i % 3 {
            1 => data[i][(i / 3) % np].clone(),
            _ => reference(ReduceOp::Sum, &data[i]),
        };
        found = found.and(compare(&format!("call {i}"), &out.to_vec()?, &want));
    }
    found
}

/// Every algorithm, root and size, then the broadcast and the all-to-all back to back,
/// in bursts and between all-reduces.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    // The broadcast from every root, in place and not, and the all-to-all: every algorithm
    // at odd sizes (unaligned blocks included); an explicit one-shot too large for its
    // staging slot must be refused, not overrun it.
    let ll = ll_limit(coll);
    let slot = coll.workspace().staging_slot_bytes;
    for algo in BroadcastAlgo::ALL {
        // The relay also at a size of many rounds per block, and a tail.
        let large = (algo == BroadcastAlgo::Relay).then_some(3_000_017);
        for n in [1usize, 3, 1000, 4097, 65_537, 300_001]
            .into_iter()
            .chain(large)
        {
            let lines = matches!(
                algo,
                BroadcastAlgo::LowLatency | BroadcastAlgo::LowLatencyRelay
            );
            let too_large = algo == BroadcastAlgo::OneShot && 4 * n > slot || lines && 4 * n > ll;
            for root in 0..c.shmem.n_pes() {
                let case = (algo, root, root % 2 == 1);
                let name = format!("broadcast {algo:?} root {root} in place {} n={n}", case.2);
                c.check(&format!("{name} f32"), |s, seed| match too_large {
                    true => expect_err(
                        broadcast_case::<f32>(s, coll, seed, case, n),
                        "a one-shot broadcast larger than its staging slot",
                        |e| matches!(e, Error::InvalidArgument(_)),
                    ),
                    false => broadcast_case::<f32>(s, coll, seed, case, n),
                });
            }
            if !too_large || 2 * n <= ll && lines {
                c.check(
                    &format!("broadcast {algo:?} root 0 n={n} bf16"),
                    |s, seed| broadcast_case::<bf16>(s, coll, seed, (algo, 0, false), n),
                );
            }
        }
    }
    for algo in AllToAllAlgo::ALL {
        for block in [1usize, 3, 1000, 4097, 65_537, 300_001] {
            if algo == AllToAllAlgo::OneShot && 4 * block > slot {
                continue;
            }
            if algo == AllToAllAlgo::LowLatency && 4 * block > ll {
                c.check(
                    &format!("all_to_all {algo:?} block={block} f32 refused"),
                    |s, seed| {
                        expect_err(
                            all_to_all_case::<f32>(s, coll, seed, algo, block),
                            "a low-latency all-to-all larger than its lines",
                            |e| matches!(e, Error::InvalidArgument(_)),
                        )
                    },
                );
                continue;
            }
            c.check(
                &format!("all_to_all {algo:?} block={block} f32"),
                |s, seed| all_to_all_case::<f32>(s, coll, seed, algo, block),
            );
            c.check(
                &format!("all_to_all {algo:?} block={block} bf16"),
                |s, seed| all_to_all_case::<bf16>(s, coll, seed, algo, block),
            );
        }
    }
    for (algo, a2a) in [
        (BroadcastAlgo::LowLatency, AllToAllAlgo::LowLatency),
        (BroadcastAlgo::OneShot, AllToAllAlgo::OneShot),
        (BroadcastAlgo::Push, AllToAllAlgo::Push),
        (BroadcastAlgo::CopyEngine, AllToAllAlgo::CopyEngine),
        (BroadcastAlgo::Relay, AllToAllAlgo::Auto),
        (BroadcastAlgo::LowLatencyRelay, AllToAllAlgo::LowLatency),
    ] {
        c.check(
            &format!("broadcast {algo:?} and all_to_all {a2a:?} back to back and in a graph"),
            |s, seed| movement_repeated(s, coll, seed, (algo, a2a), 1000 + 3),
        );
    }
    for algo in [
        BroadcastAlgo::LowLatency,
        BroadcastAlgo::OneShot,
        BroadcastAlgo::CopyEngine,
        BroadcastAlgo::Relay,
        BroadcastAlgo::LowLatencyRelay,
    ] {
        for root in [0, c.shmem.n_pes() - 1] {
            c.check(
                &format!("broadcast {algo:?} from {root}, 64 back to back with late peers"),
                |s, seed| broadcast_burst(s, coll, seed, (algo, root, 64), 1000 + 1),
            );
        }
    }
    for algo in [
        BroadcastAlgo::LowLatency,
        BroadcastAlgo::CopyEngine,
        BroadcastAlgo::Relay,
        BroadcastAlgo::LowLatencyRelay,
    ] {
        c.check(
            &format!("broadcast {algo:?} between all-reduces, back to back"),
            |s, seed| broadcast_between_reductions(s, coll, seed, algo, (32, 1000 + 1)),
        );
    }
}
