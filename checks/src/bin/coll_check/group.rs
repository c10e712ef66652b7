//! The grouped all-reduce: groups of odd lengths (more buffers than one launch takes, and
//! buffers too large for a one-shot group), every type and operator, in and out of place,
//! in a replayed graph, each buffer against the reference bit for bit; and what it must
//! refuse.

use nvshmem::{bf16, f16, GROUP_MAX};
use nvshmem::{
    AllReduceAlgo, Collectives, Element, Error, Nvshmem, ReduceOp, Result, SymmetricBuffer,
    SymmetricView,
};
use nvshmem_checks::graph::capture;

use crate::harness::{compare, cuda, expect_err, sync, Checker};
use crate::reference::{inputs, reference, summed_again, Reducible};

/// Where each of `lens` sits in one buffer: end to end, each on 16 bytes.
fn offsets<T>(lens: &[usize]) -> (Vec<usize>, usize) {
    let per16 = 16 / std::mem::size_of::<T>();
    let mut at = Vec::new();
    let mut end = 0;
    for &n in lens {
        at.push(end);
        end += n.div_ceil(per16) * per16;
    }
    (at, end.max(1))
}

/// The buffers at `at` of `lens` elements in `b`.
fn views<'a, T: Element>(
    b: &'a SymmetricBuffer<T>,
    at: &[usize],
    lens: &[usize],
) -> Vec<SymmetricView<'a, T>> {
    at.iter()
        .zip(lens)
        .map(|(&a, &n)| b.view(a..a + n))
        .collect()
}

/// One group of buffers of `lens` elements, cut from one symmetric buffer (inputs) and
/// another (outputs, poisoned) or in place; each buffer compared with its reference.
pub(crate) fn group_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    op: ReduceOp,
    algo: AllReduceAlgo,
    lens: &[usize],
    in_place: bool,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let (at, total) = offsets::<T>(lens);
    let all = inputs::<T>(seed, np, total);
    let src = shmem.malloc::<T>(total)?;
    src.copy_from_host(&all[me])?;
    let dst = shmem.malloc::<T>(total)?;
    dst.copy_from_host(&inputs::<T>(seed ^ 0xD57, np, total)[me])?;
    let out: &SymmetricBuffer<T> = if in_place { &src } else { &dst };
    coll.all_reduce_group(
        &views(out, &at, lens),
        &views(&src, &at, lens),
        op,
        algo,
        shmem.stream(),
    )?;
    sync(shmem)?;
    let got = out.to_vec()?;
    for (k, (&a, &n)) in at.iter().zip(lens).enumerate() {
        let piece: Vec<Vec<T>> = all.iter().map(|x| x[a..a + n].to_vec()).collect();
        compare(
            &format!("buffer {k} of {}", lens.len()),
            &got[a..a + n],
            &reference(op, &piece),
        )?;
    }
    // Between the buffers, an out-of-place call writes nothing.
    if !in_place {
        let poison = &inputs::<T>(seed ^ 0xD57, np, total)[me];
        let mut covered = vec![false; total];
        for (&a, &n) in at.iter().zip(lens) {
            covered[a..a + n].fill(true);
        }
        if let Some(i) = (0..total).find(|&i| !covered[i] && got[i].bits() != poison[i].bits()) {
            return Err(Error::InvalidArgument(format!(
                "element {i}, between the buffers, was written"
            )));
        }
    }
    Ok(())
}

/// A group captured in a graph and replayed: x -> y -> x per replay, each a new call.
fn group_replay(shmem: &Nvshmem, coll: &Collectives, seed: u64, algo: AllReduceAlgo) -> Result<()> {
    let lens = [5usize, 4096, 333, 17, 70_000];
    let (at, total) = offsets::<i32>(&lens);
    let all = inputs::<i32>(seed, shmem.n_pes(), total);
    let (x, y) = (shmem.calloc::<i32>(total)?, shmem.calloc::<i32>(total)?);
    x.copy_from_host(&all[shmem.my_pe()])?;
    let stream = shmem.new_stream()?;
    let graph = capture(&stream, || {
        coll.all_reduce_group(
            &views(&y, &at, &lens),
            &views(&x, &at, &lens),
            ReduceOp::Sum,
            algo,
            &stream,
        )
        .and_then(|_| {
            coll.all_reduce_group(
                &views(&x, &at, &lens),
                &views(&y, &at, &lens),
                ReduceOp::Sum,
                algo,
                &stream,
            )
        })
    })?;
    let replays = 3;
    for _ in 0..replays {
        cuda("cuGraphLaunch", graph.launch())?;
    }
    cuda("cuStreamSynchronize", stream.synchronize())?;
    let got = x.to_vec()?;
    for (&a, &n) in at.iter().zip(&lens) {
        let piece: Vec<Vec<i32>> = all.iter().map(|v| v[a..a + n].to_vec()).collect();
        let want = summed_again(
            reference(ReduceOp::Sum, &piece),
            shmem.n_pes(),
            2 * replays - 1,
        );
        compare("group graph replay", &got[a..a + n], &want)?;
    }
    Ok(())
}

/// Calls the group refuses, on every PE alike, and a call after them that works.
fn refusals(shmem: &Nvshmem, coll: &Collectives) -> Result<()> {
    let b = shmem.calloc::<f32>(4096)?;
    let s = shmem.stream();
    let (a, c) = (b.view(..1024), b.view(1024..2048));
    let overlapping = b.view(512..1536);
    let e = coll.all_reduce_group(&[a, c], &[c, a], ReduceOp::Sum, AllReduceAlgo::Auto, s);
    expect_err(e, "a destination that is another buffer's source", |e| {
        matches!(e, Error::Overlap { .. })
    })?;
    let e = coll.all_reduce_group(
        &[a, overlapping],
        &[a, overlapping],
        ReduceOp::Sum,
        AllReduceAlgo::Auto,
        s,
    );
    expect_err(e, "overlapping destinations", |e| {
        matches!(e, Error::Overlap { .. })
    })?;
    let e = coll.all_reduce_group(&[a], &[a, c], ReduceOp::Sum, AllReduceAlgo::Auto, s);
    expect_err(e, "fewer destinations than sources", |e| {
        e.to_string().contains("one per source")
    })?;
    let e = coll.all_reduce_group(&[a], &[a], ReduceOp::Sum, AllReduceAlgo::LowLatency, s);
    expect_err(e, "the low-latency algorithm", |e| {
        e.to_string().contains("Auto, OneShot or TwoShot")
    })?;
    let slot = coll.workspace().staging_slot_bytes / 4;
    let big = shmem.calloc::<f32>(slot + 4)?;
    let e = coll.all_reduce_group(
        &[big.view(..)],
        &[big.view(..)],
        ReduceOp::Sum,
        AllReduceAlgo::OneShot,
        s,
    );
    expect_err(e, "a buffer larger than the staging slot, one-shot", |e| {
        e.to_string().contains("staging slot")
    })?;
    let (b16, d16) = (shmem.calloc::<u16>(64)?, shmem.calloc::<u16>(64)?);
    let e = coll.all_reduce_group(
        &[d16.view(..)],
        &[b16.view(..)],
        ReduceOp::Sum,
        AllReduceAlgo::Auto,
        s,
    );
    expect_err(e, "a type our reductions do not take", |e| {
        matches!(e, Error::TypeMismatch { .. })
    })?;
    // Still sound after the refusals.
    group_case::<f32>(
        shmem,
        coll,
        77,
        ReduceOp::Sum,
        AllReduceAlgo::Auto,
        &[3, 1000],
        false,
    )
}

/// Every algorithm, operator and type over several groups, then replays and refusals.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    // More buffers than one launch takes; one empty; and, last, sizes from one element to
    // past the one-shot threshold (Auto then takes the two-shot).
    let many: Vec<usize> = (0..GROUP_MAX + 9).map(|k| 1 + (k * 131) % 997).collect();
    let groups: [(&str, Vec<usize>); 3] = [
        ("odd", vec![1, 7, 0, 8, 13, 1000, 4099]),
        ("many", many),
        ("mixed", vec![65_539, 3, 300_001, 12, 1 << 18]),
    ];
    for algo in [
        AllReduceAlgo::Auto,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
    ] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for (i, (name, lens)) in groups.iter().enumerate() {
                let in_place = i % 2 == 1;
                let tag = format!("all_reduce_group {algo:?} {op:?} {name} in_place={in_place}");
                c.check(&format!("{tag} f32"), |s, seed| {
                    group_case::<f32>(s, coll, seed, op, algo, lens, in_place)
                });
                c.check(&format!("{tag} bf16"), |s, seed| {
                    group_case::<bf16>(s, coll, seed, op, algo, lens, in_place)
                });
                c.check(&format!("{tag} f16"), |s, seed| {
                    group_case::<f16>(s, coll, seed, op, algo, lens, in_place)
                });
                c.check(&format!("{tag} i32"), |s, seed| {
                    group_case::<i32>(s, coll, seed, op, algo, lens, in_place)
                });
            }
        }
    }
    for algo in [
        AllReduceAlgo::Auto,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
    ] {
        c.check(
            &format!("all_reduce_group {algo:?} graph replay"),
            |s, seed| group_replay(s, coll, seed, algo),
        );
    }
    // A buffer past the two-shot's limit: an all-reduce of its own, after the group.
    let large = coll.thresholds().twoshot_max_bytes / 4 + 5;
    c.check(
        "all_reduce_group Auto, a buffer past the two-shot",
        |s, seed| {
            group_case::<f32>(
                s,
                coll,
                seed,
                ReduceOp::Sum,
                AllReduceAlgo::Auto,
                &[100, large, 7],
                false,
            )
        },
    );
    c.check("all_reduce_group refusals", |s, _| refusals(s, coll));
}
