//! The all-gather: every algorithm and type, calls chained back to back and replayed in a
//! graph, and low-latency blocks off an 8-byte boundary.

use nvshmem::{bf16, AllGatherAlgo, Collectives, Nvshmem, Result};

use nvshmem_checks::graph::capture;

use crate::harness::{compare, cuda, place, sync, zeroed, Checker};
use crate::reference::{inputs, Reducible};

pub(crate) fn all_gather_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllGatherAlgo,
    n: usize,
) -> Result<()> {
    let (me, np) = place(coll)?;
    let all = inputs::<T>(seed, np, n);
    let src = shmem.malloc::<T>(n)?;
    src.copy_from_host(&all[me])?;
    let dst = shmem.calloc::<T>(n * np)?;
    coll.all_gather(&dst, &src, algo, shmem.stream())?;
    sync(shmem)?;
    let want: Vec<T> = all.concat();
    compare("all_gather", &dst.to_vec()?, &want)
}

/// Low-latency all-gathers of `n` bf16 per PE, a block that is not a multiple of 8 bytes
/// (by output words on more than 2 PEs, lines stored in pieces on 2): four back to back on
/// one stream, each on inputs and into an output of its own (so that lines left set, or
/// taken by the wrong call, show), then two captured in a graph and replayed on new inputs.
fn all_gather_words_repeated(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    n: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let algo = AllGatherAlgo::LowLatency;
    let calls = 4;
    let srcs = (0..calls)
        .map(|_| shmem.malloc::<bf16>(n))
        .collect::<Result<Vec<_>>>()?;
    let dsts = (0..calls)
        .map(|_| shmem.calloc::<bf16>(n * np))
        .collect::<Result<Vec<_>>>()?;
    let fill = |seed: u64| -> Result<Vec<Vec<bf16>>> {
        let all: Vec<_> = (0..calls as u64)
            .map(|c| inputs::<bf16>(seed + c, np, n))
            .collect();
        for (src, mine) in srcs.iter().zip(&all) {
            src.copy_from_host(&mine[me])?;
        }
        Ok(all.into_iter().map(|a| a.concat()).collect())
    };
    let want = fill(seed)?;
    let s = shmem.stream();
    for (dst, src) in dsts.iter().zip(&srcs) {
        coll.all_gather(dst, src, algo, s)?;
    }
    sync(shmem)?;
    let mut found = Ok(());
    for (c, (dst, want)) in dsts.iter().zip(&want).enumerate() {
        found = found.and(compare(
            &format!("back-to-back all_gather {c}"),
            &dst.to_vec()?,
            want,
        ));
    }
    let stream = shmem.new_stream()?;
    let graph = capture(&stream, || {
        coll.all_gather(&dsts[0], &srcs[0], algo, &stream)?;
        coll.all_gather(&dsts[1], &srcs[1], algo, &stream)
    })?;
    for round in [1u64, 2] {
        let want = fill(seed + 100 * round)?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        for c in 0..2 {
            found = found.and(compare(
                &format!("graph replay {round} of all_gather {c}"),
                &dsts[c].to_vec()?,
                &want[c],
            ));
        }
    }
    found
}

/// All-gathers chained back to back on one stream (each call gathers the blocks the call
/// before it gathered, shifted by one PE, so a call that reads its input early, or writes a
/// peer's output before that peer is done with it, shows), then one captured in a graph and
/// replayed on new inputs.
fn all_gather_repeated(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllGatherAlgo,
    n: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let all = inputs::<f32>(seed, np, n);
    let bufs = zeroed(shmem, 4, n * np)?;
    let src = shmem.malloc::<f32>(n)?;
    src.copy_from_host(&all[me])?;
    let s = shmem.stream();
    coll.all_gather(&bufs[0], &src, algo, s)?;
    // Round r gathers block (me + 1) % np of round r - 1's output: PE p's block of round r
    // is PE p + r's input.
    let next = (me + 1) % np;
    for r in 1..bufs.len() {
        let from = bufs[r - 1].view(next * n..(next + 1) * n);
        coll.all_gather(&bufs[r], from, algo, s)?;
    }
    sync(shmem)?;
    let mut found = Ok(());
    for (r, b) in bufs.iter().enumerate() {
        let want: Vec<f32> = (0..np).flat_map(|p| all[(p + r) % np].clone()).collect();
        found = found.and(compare(
            &format!("chained all_gather {r}"),
            &b.to_vec()?,
            &want,
        ));
    }
    let stream = shmem.new_stream()?;
    let graph = capture(&stream, || coll.all_gather(&bufs[0], &src, algo, &stream))?;
    for round in [1u64, 2] {
        let fresh = inputs::<f32>(seed + round, np, n);
        src.copy_from_host(&fresh[me])?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        found = found.and(compare(
            &format!("graph replay of all_gather {round}"),
            &bufs[0].to_vec()?,
            &fresh.concat(),
        ));
    }
    found
}

/// Every algorithm at sizes from 1 to 200 000 elements, in f32, bf16 and i32.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    for &algo in AllGatherAlgo::ALL
        .iter()
        .cycle()
        .skip(1)
        .take(AllGatherAlgo::ALL.len())
    {
        for n in [1usize, 3, 1000, 4097, 65_537, 200_000] {
            c.check(&format!("all_gather {algo:?} n={n} f32"), |s, seed| {
                all_gather_case::<f32>(s, coll, seed, algo, n)
            });
            c.check(&format!("all_gather {algo:?} n={n} bf16"), |s, seed| {
                all_gather_case::<bf16>(s, coll, seed, algo, n)
            });
            c.check(&format!("all_gather {algo:?} n={n} i32"), |s, seed| {
                all_gather_case::<i32>(s, coll, seed, algo, n)
            });
        }
    }
}

/// Calls back to back and in a graph, then one large call.
pub(crate) fn repeated_checks(c: &mut Checker, coll: &Collectives) {
    for algo in AllGatherAlgo::ALL {
        c.check(
            &format!("all_gather {algo:?} chained back to back and in a graph"),
            |s, seed| all_gather_repeated(s, coll, seed, algo, 4096 + 4),
        );
    }
    // Blocks of 2, 6 and 8194 bytes: one output word over every PE's block (up to 4 PEs),
    // words over two blocks, and lines of a block all off an 8-byte boundary.
    for n in [1usize, 3, 4097] {
        c.check(
            &format!("all_gather LowLatency n={n} bf16 off 8 bytes, back to back and in a graph"),
            |s, seed| all_gather_words_repeated(s, coll, seed, n),
        );
    }
    c.check("all_gather Auto n=8M bf16", |s, seed| {
        all_gather_case::<bf16>(s, coll, seed, AllGatherAlgo::Auto, 8 << 20)
    });
}
