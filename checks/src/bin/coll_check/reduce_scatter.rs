//! The reduce-scatter: every algorithm, operator, type and size (the low-latency path refusing
//! what its lines cannot hold), and calls back to back and in a graph.

use nvshmem::{bf16, f16, Collectives, Error, Nvshmem, ReduceOp, ReduceScatterAlgo, Result};

use nvshmem_checks::graph::capture;

use crate::harness::{compare, cuda, expect_err, ll_limit, place, sync, uploaded, zeroed, Checker};
use crate::reference::{inputs, reference, Reducible, Rng};

/// Each PE's block of the reduced inputs: `src` is `n_pes` blocks of `n`.
pub(crate) fn reduce_scatter_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (op, algo): (ReduceOp, ReduceScatterAlgo),
    n: usize,
) -> Result<()> {
    let (me, np) = place(coll)?;
    let all = inputs::<T>(seed, np, n * np);
    let want = reference(op, &all)[me * n..(me + 1) * n].to_vec();
    let src = shmem.malloc::<T>(n * np)?;
    src.copy_from_host(&all[me])?;
    let dst = shmem.malloc::<T>(n)?;
    // Poison the output so an unwritten element shows.
    dst.copy_from_host(&vec![
        T::from_acc(T::random(&mut Rng::new(999, me)).to_acc());
        n
    ])?;
    coll.reduce_scatter(&dst, &src, op, algo, shmem.stream())?;
    sync(shmem)?;
    compare("reduce_scatter", &dst.to_vec()?, &want)
}

/// Reduce-scatters back to back on one stream, then one captured in a graph and replayed:
/// each must leave its own result.
fn reduce_scatter_repeated(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: ReduceScatterAlgo,
    n: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let rounds: Vec<Vec<Vec<f32>>> = (0..3)
        .map(|r| inputs::<f32>(seed + r, np, n * np))
        .collect();
    let srcs = uploaded(shmem, rounds.iter().map(|all| &all[me][..]))?;
    let dsts = zeroed(shmem, 3, n)?;
    for (s, d) in srcs.iter().zip(&dsts) {
        coll.reduce_scatter(d, s, ReduceOp::Sum, algo, shmem.stream())?;
    }
    sync(shmem)?;
    let want = |r: usize| reference(ReduceOp::Sum, &rounds[r])[me * n..(me + 1) * n].to_vec();
    // A mismatch is reported after the graph part, which every PE must run (its replays wait
    // for every PE).
    let mut found = Ok(());
    for (r, d) in dsts.iter().enumerate() {
        found = found.and(compare(
            &format!("back-to-back reduce_scatter {r}"),
            &d.to_vec()?,
            &want(r),
        ));
    }
    let stream = shmem.new_stream()?;
    let graph = capture(&stream, || {
        coll.reduce_scatter(&dsts[0], &srcs[0], ReduceOp::Sum, algo, &stream)
    })?;
    for r in [1, 2] {
        srcs[0].copy_from_host(&rounds[r][me])?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        found = found.and(compare(
            &format!("graph replay of reduce_scatter {r}"),
            &dsts[0].to_vec()?,
            &want(r),
        ));
    }
    found
}

/// Every algorithm, operator, type and size, then calls back to back and in a graph.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    // Every algorithm, type and operator. Pull: blocks of 16-byte multiples go by vectors,
    // the others element by element; low-latency: blocks off an 8-byte boundary (n odd for
    // 4-byte types, n % 4 != 0 for 2-byte ones) are cut from aligned words. A low-latency call
    // too large for its lines must be refused, not overrun them.
    let ll = ll_limit(coll);
    for algo in ReduceScatterAlgo::ALL {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for n in [1usize, 3, 8, 1000, 4099, 65_536, 300_001] {
                let case = (op, algo);
                let tag = format!("reduce_scatter {algo:?} {op:?} n={n}");
                if algo == ReduceScatterAlgo::LowLatency && 2 * n > ll {
                    c.check(&format!("{tag} bf16 refused"), |s, seed| {
                        expect_err(
                            reduce_scatter_case::<bf16>(s, coll, seed, case, n),
                            "a low-latency reduce-scatter larger than its lines",
                            |e| matches!(e, Error::InvalidArgument(_)),
                        )
                    });
                    continue;
                }
                c.check(&format!("{tag} bf16"), |s, seed| {
                    reduce_scatter_case::<bf16>(s, coll, seed, case, n)
                });
                c.check(&format!("{tag} f16"), |s, seed| {
                    reduce_scatter_case::<f16>(s, coll, seed, case, n)
                });
                if 4 * n <= ll || algo != ReduceScatterAlgo::LowLatency {
                    c.check(&format!("{tag} f32"), |s, seed| {
                        reduce_scatter_case::<f32>(s, coll, seed, case, n)
                    });
                    c.check(&format!("{tag} i32"), |s, seed| {
                        reduce_scatter_case::<i32>(s, coll, seed, case, n)
                    });
                }
            }
        }
    }
    c.check("reduce_scatter Auto Sum n=4M bf16", |s, seed| {
        reduce_scatter_case::<bf16>(
            s,
            coll,
            seed,
            (ReduceOp::Sum, ReduceScatterAlgo::Auto),
            4 << 20,
        )
    });
    for algo in [ReduceScatterAlgo::LowLatency, ReduceScatterAlgo::Pull] {
        c.check(
            &format!("reduce_scatter {algo:?} back to back and in a graph"),
            |s, seed| reduce_scatter_repeated(s, coll, seed, algo, 4096 + 8),
        );
    }
}
