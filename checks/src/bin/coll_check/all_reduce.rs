//! The all-reduce: every algorithm, operator, type and size, in and out of place, and inputs
//! holding the sentinel path's bits.

use nvshmem::{
    bf16, f16, AllReduceAlgo, Collectives, DataType, Error, Nvshmem, ReduceOp, Result,
    SymmetricBuffer,
};

use crate::harness::{compare, place, sync, Checker};
use crate::reference::{inputs, reference, Reducible, Rng};

/// Every all-reduce algorithm that takes i32 (all but `Auto` and the sentinel paths).
pub(crate) const INT_ALGOS: [AllReduceAlgo; 5] = [
    AllReduceAlgo::LowLatency,
    AllReduceAlgo::LowLatencyTwoShot,
    AllReduceAlgo::OneShot,
    AllReduceAlgo::TwoShot,
    AllReduceAlgo::Bandwidth,
];

pub(crate) fn all_reduce_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    op: ReduceOp,
    algo: AllReduceAlgo,
    n: usize,
    in_place: bool,
) -> Result<()> {
    let (me, np) = place(coll)?;
    let all = inputs::<T>(seed, np, n);
    let want = reference(op, &all);
    let src = shmem.malloc::<T>(n)?;
    src.copy_from_host(&all[me])?;
    let dst = if in_place {
        None
    } else {
        let d = shmem.malloc::<T>(n)?;
        // Poison the output so an unwritten element shows.
        d.copy_from_host(&vec![
            T::from_acc(T::random(&mut Rng::new(999, me)).to_acc());
            n
        ])?;
        Some(d)
    };
    let out: &SymmetricBuffer<T> = dst.as_ref().unwrap_or(&src);
    coll.all_reduce(out, &src, op, algo, shmem.stream())?;
    sync(shmem)?;
    compare("all_reduce", &out.to_vec()?, &want)
}

/// Words with every bit set (what the sentinel path's empty buffers hold) in the input: the
/// call must not wait for them forever, and they must reduce as the NaN they are. Elsewhere
/// the result is exact.
fn sentinel_bits_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllReduceAlgo,
    op: ReduceOp,
) -> Result<()> {
    let (me, np, n) = (shmem.my_pe(), shmem.n_pes(), 4099);
    let mut all = inputs::<T>(seed, np, n);
    // Whole 32-bit words of set bits (two elements of a 16-bit type): some at the same place
    // on every PE, some on one PE only.
    let per_word = 4 / std::mem::size_of::<T>();
    for (pe, x) in all.iter_mut().enumerate() {
        for w in (0..n / per_word).step_by(97).chain([pe * 13 + 5]) {
            x[w * per_word..(w + 1) * per_word].fill(T::all_ones());
        }
    }
    let want = reference(op, &all);
    let buf = shmem.malloc::<T>(n)?;
    buf.copy_from_host(&all[me])?;
    coll.all_reduce(&buf, &buf, op, algo, shmem.stream())?;
    sync(shmem)?;
    let got = buf.to_vec()?;
    // NaN payloads may differ between this CPU and the GPU; NaN must stay NaN.
    let bad = (0..n)
        .filter(|&i| {
            if want[i].is_nan() {
                !got[i].is_nan()
            } else {
                got[i].bits() != want[i].bits()
            }
        })
        .count();
    if bad > 0 {
        return Err(Error::InvalidArgument(format!(
            "sentinel bits: {bad} of {n} elements wrong"
        )));
    }
    Ok(())
}

/// Every algorithm, operator, type and size of the table, then large calls.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    let sizes = [1usize, 7, 8, 13, 1000, 4099, 65536 + 3, 300_001];
    // Every algorithm of the table, `Auto` last.
    let algos = AllReduceAlgo::ALL
        .iter()
        .cycle()
        .skip(1)
        .take(AllReduceAlgo::ALL.len());
    for &algo in algos {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for (i, &n) in sizes.iter().enumerate() {
                // The low-latency path takes up to 1 MiB (twice that in staging).
                let low_latency = matches!(
                    algo,
                    AllReduceAlgo::Sentinel
                        | AllReduceAlgo::LowLatency
                        | AllReduceAlgo::LowLatencyTwoShot
                );
                if low_latency && n > 100_000 {
                    continue;
                }
                let in_place = i % 2 == 1;
                let tag = format!("all_reduce {algo:?} {op:?} n={n} in_place={in_place}");
                c.check(&format!("{tag} f32"), |s, seed| {
                    all_reduce_case::<f32>(s, coll, seed, op, algo, n, in_place)
                });
                c.check(&format!("{tag} bf16"), |s, seed| {
                    all_reduce_case::<bf16>(s, coll, seed, op, algo, n, in_place)
                });
                c.check(&format!("{tag} f16"), |s, seed| {
                    all_reduce_case::<f16>(s, coll, seed, op, algo, n, in_place)
                });
                if !algo.takes(DataType::I32) {
                    continue;
                }
                c.check(&format!("{tag} i32"), |s, seed| {
                    all_reduce_case::<i32>(s, coll, seed, op, algo, n, in_place)
                });
            }
        }
    }
    for n in [4usize << 20, 16 << 20] {
        c.check(&format!("all_reduce Auto Sum n={n} bf16"), |s, seed| {
            all_reduce_case::<bf16>(s, coll, seed, ReduceOp::Sum, AllReduceAlgo::Auto, n, false)
        });
    }
    // The bandwidth path over many rounds of its chunk ring (each block reuses its slots).
    let many_rounds = (16 << 20) + 5;
    for (op, in_place) in [(ReduceOp::Sum, false), (ReduceOp::Max, true)] {
        let tag = format!("all_reduce Bandwidth {op:?} n={many_rounds} in_place={in_place}");
        c.check(&format!("{tag} f32"), |s, seed| {
            all_reduce_case::<f32>(
                s,
                coll,
                seed,
                op,
                AllReduceAlgo::Bandwidth,
                many_rounds,
                in_place,
            )
        });
        c.check(&format!("{tag} bf16"), |s, seed| {
            all_reduce_case::<bf16>(
                s,
                coll,
                seed,
                op,
                AllReduceAlgo::Bandwidth,
                many_rounds,
                in_place,
            )
        });
    }
}

/// Inputs holding words with every bit set, on both sentinel paths.
pub(crate) fn sentinel_checks(c: &mut Checker, coll: &Collectives) {
    for algo in [AllReduceAlgo::Sentinel, AllReduceAlgo::SentinelTwoShot] {
        c.check(
            &format!("{algo:?}: inputs with the sentinel's bits arrive"),
            |s, seed| {
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                    sentinel_bits_case::<f32>(s, coll, seed, algo, op)?;
                    sentinel_bits_case::<f16>(s, coll, seed, algo, op)?;
                    sentinel_bits_case::<bf16>(s, coll, seed, algo, op)?;
                }
                Ok(())
            },
        );
    }
}
