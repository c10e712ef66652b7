//! All-reduces captured in a CUDA graph and replayed: each replay must be a new call.

use nvshmem::{AllReduceAlgo, Collectives, Nvshmem, ReduceOp, Result};

use nvshmem_checks::graph::capture;

use crate::all_reduce::INT_ALGOS;
use crate::harness::{compare, cuda, place, Checker};
use crate::reference::{inputs, reference, summed_again, Reducible};

/// Capture calls in a CUDA graph and replay it: the epoch lives in device memory, so each
/// replay is a new call.
pub(crate) fn graph_replay<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllReduceAlgo,
    n: usize,
) -> Result<()> {
    let (me, np) = place(coll)?;
    let all = inputs::<T>(seed, np, n);
    let x = shmem.malloc::<T>(n)?;
    let y = shmem.malloc::<T>(n)?;
    x.copy_from_host(&all[me])?;
    let stream = shmem.new_stream()?;
    // x -> y -> x: two calls per replay, out of place both ways.
    let graph = capture(&stream, || {
        coll.all_reduce(&y, &x, ReduceOp::Sum, algo, &stream)
            .and_then(|_| coll.all_reduce(&x, &y, ReduceOp::Sum, algo, &stream))
    })?;
    let replays = 3;
    for _ in 0..replays {
        cuda("cuGraphLaunch", graph.launch())?;
    }
    cuda("cuStreamSynchronize", stream.synchronize())?;
    let want = summed_again(reference(ReduceOp::Sum, &all), np, 2 * replays - 1);
    compare("graph replay", &x.to_vec()?, &want)
}

/// Every algorithm replayed, and the bandwidth path over many rounds.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    for algo in INT_ALGOS {
        c.check(&format!("graph replay {algo:?}"), |s, seed| {
            graph_replay::<i32>(s, coll, seed, algo, 20_000)
        });
    }
    for algo in [AllReduceAlgo::Sentinel, AllReduceAlgo::SentinelTwoShot] {
        c.check(&format!("graph replay {algo:?}"), |s, seed| {
            graph_replay::<f32>(s, coll, seed, algo, 20_000)
        });
    }
    c.check("graph replay Bandwidth, many rounds", |s, seed| {
        graph_replay::<i32>(s, coll, seed, AllReduceAlgo::Bandwidth, 5 << 20)
    });
}
