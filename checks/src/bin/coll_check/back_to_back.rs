//! All-reduces back to back with no host synchronisation: one algorithm repeated, every
//! algorithm after every other, the sentinel paths among them, and calls alternating between
//! two streams.

use nvshmem::{bf16, AllReduceAlgo, Collectives, Error, Nvshmem, ReduceOp, Result};

use crate::all_reduce::INT_ALGOS;
use crate::harness::{compare, place, sync, Checker};
use crate::reference::{inputs, reference, summed_again, Reducible};

/// Repeated in-place sums with no host synchronisation between calls: after the first, every
/// PE holds the same data, so each further call multiplies it by n_pes. A peer reading or
/// writing a buffer too early would show as a wrong multiple.
pub(crate) fn back_to_back<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algos: &[AllReduceAlgo],
    n: usize,
    rounds: usize,
) -> Result<()> {
    let (me, np) = place(coll)?;
    let all = inputs::<T>(seed, np, n);
    let x = shmem.malloc::<T>(n)?;
    x.copy_from_host(&all[me])?;
    for r in 0..rounds {
        coll.all_reduce(
            &x,
            &x,
            ReduceOp::Sum,
            algos[r % algos.len()],
            shmem.stream(),
        )?;
    }
    sync(shmem)?;
    let want = summed_again(reference(ReduceOp::Sum, &all), np, rounds - 1);
    compare("back-to-back all_reduce", &x.to_vec()?, &want)
}

/// Calls alternating between two streams, each on its own buffer, with no host
/// synchronisation: the Collectives orders a call on a new stream after the last one (they
/// share the epoch, flags and staging; run at once, they would take each other's data).
pub(crate) fn two_streams<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllReduceAlgo,
    n: usize,
    rounds: usize,
) -> Result<()> {
    let streams = [shmem.new_stream()?, shmem.new_stream()?];
    let inputs: Vec<Vec<Vec<T>>> = (0..2)
        .map(|k| inputs::<T>(seed + k, shmem.n_pes(), n))
        .collect();
    let bufs = [shmem.malloc::<T>(n)?, shmem.malloc::<T>(n)?];
    for (b, all) in bufs.iter().zip(&inputs) {
        b.copy_from_host(&all[shmem.my_pe()])?;
    }
    for r in 0..2 * rounds {
        let k = r % 2;
        coll.all_reduce(&bufs[k], &bufs[k], ReduceOp::Sum, algo, &streams[k])?;
    }
    for (k, s) in streams.iter().enumerate() {
        s.synchronize().map_err(|source| Error::Cuda {
            call: "cuStreamSynchronize",
            source,
        })?;
        let want = summed_again(
            reference(ReduceOp::Sum, &inputs[k]),
            shmem.n_pes(),
            rounds - 1,
        );
        compare(&format!("stream {k}"), &bufs[k].to_vec()?, &want)?;
    }
    Ok(())
}

/// Each algorithm repeated, then algorithms mixed, the sentinel paths included.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    c.check("back-to-back low-latency x20", |s, seed| {
        back_to_back::<i32>(s, coll, seed, &[AllReduceAlgo::LowLatency], 4096, 20)
    });
    c.check("back-to-back low-latency two-shot x20", |s, seed| {
        back_to_back::<i32>(
            s,
            coll,
            seed,
            &[AllReduceAlgo::LowLatencyTwoShot],
            50_001,
            20,
        )
    });
    c.check("back-to-back one-shot x20", |s, seed| {
        back_to_back::<i32>(s, coll, seed, &[AllReduceAlgo::OneShot], 4096, 20)
    });
    c.check("back-to-back two-shot x20", |s, seed| {
        back_to_back::<i32>(s, coll, seed, &[AllReduceAlgo::TwoShot], 100_000, 20)
    });
    c.check("back-to-back bandwidth, many rounds, x8", |s, seed| {
        back_to_back::<i32>(s, coll, seed, &[AllReduceAlgo::Bandwidth], 6 << 20, 8)
    });
    c.check("back-to-back bandwidth x20", |s, seed| {
        back_to_back::<i32>(s, coll, seed, &[AllReduceAlgo::Bandwidth], 1 << 20, 20)
    });
    // Every algorithm after every other, repeatedly, in place: a call that read data left
    // from the call before it would be off by a factor.
    for rep in 0..4 {
        c.check(&format!("back-to-back mixed x24 #{rep}"), |s, seed| {
            back_to_back::<i32>(s, coll, seed, &INT_ALGOS, 50_000, 24)
        });
    }
    // The sentinel path refills its buffers for the call two on: every algorithm after it,
    // and it after every other, in floating point (it takes no i32).
    c.check("back-to-back sentinel x20", |s, seed| {
        back_to_back::<f32>(s, coll, seed, &[AllReduceAlgo::Sentinel], 50_001, 20)
    });
    c.check("back-to-back sentinel two-shot x20", |s, seed| {
        back_to_back::<f32>(s, coll, seed, &[AllReduceAlgo::SentinelTwoShot], 50_001, 20)
    });
    for rep in 0..2 {
        c.check(
            &format!("back-to-back mixed with sentinel x25 #{rep}"),
            |s, seed| {
                back_to_back::<bf16>(
                    s,
                    coll,
                    seed,
                    &[
                        AllReduceAlgo::Sentinel,
                        AllReduceAlgo::LowLatency,
                        AllReduceAlgo::Sentinel,
                        AllReduceAlgo::LowLatencyTwoShot,
                        AllReduceAlgo::OneShot,
                        AllReduceAlgo::SentinelTwoShot,
                        AllReduceAlgo::TwoShot,
                        AllReduceAlgo::SentinelTwoShot,
                        AllReduceAlgo::Sentinel,
                        AllReduceAlgo::Bandwidth,
                    ],
                    30_000,
                    25,
                )
            },
        );
    }
}

/// Calls alternating between two streams.
pub(crate) fn two_stream_checks(c: &mut Checker, coll: &Collectives) {
    for algo in [
        AllReduceAlgo::LowLatency,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::Bandwidth,
    ] {
        c.check(
            &format!("two streams alternating, {algo:?} x2x8"),
            |s, seed| two_streams::<i32>(s, coll, seed, algo, 30_001, 8),
        );
    }
}
