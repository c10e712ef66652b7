//! Calls with wrong arguments: each must be refused with its own error before anything runs.

use nvshmem::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Collectives, Error, ReduceAlgo,
    ReduceOp, ReduceScatterAlgo,
};

use crate::harness::{expect_err, Checker};

/// Lengths, types, operators, overlaps, alignment, roots and sizes beyond the workspace.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    c.check("errors: length, type, op, overlap, staging", |s, _| {
        let a = s.malloc::<f32>(64)?;
        let b = s.malloc::<f32>(32)?;
        let st = s.stream();
        expect_err(
            coll.all_reduce(&b, &a, ReduceOp::Sum, AllReduceAlgo::Auto, st),
            "length mismatch",
            |e| matches!(e, Error::Length { .. }),
        )?;
        expect_err(
            coll.all_reduce(&a, &a, ReduceOp::Xor, AllReduceAlgo::Auto, st),
            "xor",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        let u = s.malloc::<u64>(64)?;
        expect_err(
            coll.all_reduce(&u, &u, ReduceOp::Sum, AllReduceAlgo::Auto, st),
            "u64",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        expect_err(
            coll.all_reduce(
                a.view(16..48),
                a.view(0..32),
                ReduceOp::Sum,
                AllReduceAlgo::Auto,
                st,
            ),
            "overlap",
            |e| matches!(e, Error::Overlap { .. }),
        )?;
        expect_err(
            coll.all_reduce(
                b.view(..),
                a.view(1..33),
                ReduceOp::Sum,
                AllReduceAlgo::Auto,
                st,
            ),
            "misaligned view",
            |e| matches!(e, Error::Misaligned { align: 16, .. }),
        )?;
        expect_err(
            coll.all_gather(&b, &a, AllGatherAlgo::Auto, st),
            "all_gather length",
            |e| matches!(e, Error::Length { .. }),
        )?;
        // The source must be n_pes blocks of the destination's length.
        let wrong = s.malloc::<f32>(32 * s.n_pes() + 4)?;
        expect_err(
            coll.reduce_scatter(&b, &wrong, ReduceOp::Sum, ReduceScatterAlgo::Auto, st),
            "reduce_scatter length",
            |e| matches!(e, Error::Length { .. }),
        )?;
        expect_err(
            coll.reduce_scatter(u.view(..32), &u, ReduceOp::Sum, ReduceScatterAlgo::Auto, st),
            "reduce_scatter of u64 (and overlapping)",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        // Lengths that fit, buffers that overlap: refused for the overlap on any PE count.
        let whole = s.malloc::<f32>(16 * s.n_pes())?;
        expect_err(
            coll.reduce_scatter(
                whole.view(..16),
                &whole,
                ReduceOp::Sum,
                ReduceScatterAlgo::Auto,
                st,
            ),
            "reduce_scatter overlap",
            |e| matches!(e, Error::Overlap { .. }),
        )?;
        expect_err(
            coll.reduce(&b, &b, ReduceOp::Sum, s.n_pes(), ReduceAlgo::Auto, st),
            "reduce root out of range",
            |e| matches!(e, Error::PeOutOfRange { .. }),
        )?;
        expect_err(
            coll.reduce(&u, &u, ReduceOp::Sum, 0, ReduceAlgo::Auto, st),
            "reduce of u64",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        expect_err(
            coll.broadcast(&b, &a, s.n_pes(), BroadcastAlgo::Auto, st),
            "broadcast root out of range",
            |e| matches!(e, Error::PeOutOfRange { .. }),
        )?;
        expect_err(
            coll.broadcast(&b, a.view(..16), 0, BroadcastAlgo::Auto, st),
            "broadcast length",
            |e| matches!(e, Error::Length { .. }),
        )?;
        expect_err(
            coll.all_to_all(&b, a.view(..16), AllToAllAlgo::Auto, st),
            "all_to_all length",
            |e| matches!(e, Error::Length { .. }),
        )?;
        let wide = s.malloc::<f32>(64 * s.n_pes())?;
        let (left, right) = (
            wide.view(..32 * s.n_pes()),
            wide.view(16..16 + 32 * s.n_pes()),
        );
        expect_err(
            coll.all_to_all(right, left, AllToAllAlgo::Auto, st),
            "all_to_all overlap",
            |e| matches!(e, Error::Overlap { .. }),
        )?;
        let ints = s.malloc::<i32>(64)?;
        expect_err(
            coll.all_reduce(&ints, &ints, ReduceOp::Sum, AllReduceAlgo::Sentinel, st),
            "sentinel all-reduce of i32",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        let big = s.malloc::<f32>(16 << 20)?;
        expect_err(
            coll.all_reduce(&big, &big, ReduceOp::Sum, AllReduceAlgo::Sentinel, st),
            "sentinel beyond its buffers",
            |e| matches!(e, Error::InvalidArgument(_)),
        )?;
        expect_err(
            coll.all_reduce(
                &ints,
                &ints,
                ReduceOp::Sum,
                AllReduceAlgo::SentinelTwoShot,
                st,
            ),
            "sentinel two-shot of i32",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        expect_err(
            coll.all_reduce(
                &big,
                &big,
                ReduceOp::Sum,
                AllReduceAlgo::SentinelTwoShot,
                st,
            ),
            "sentinel two-shot beyond its buffers",
            |e| matches!(e, Error::InvalidArgument(_)),
        )?;
        expect_err(
            coll.all_reduce(&big, &big, ReduceOp::Sum, AllReduceAlgo::OneShot, st),
            "one-shot beyond staging",
            |e| matches!(e, Error::InvalidArgument(_)),
        )
    });
}
