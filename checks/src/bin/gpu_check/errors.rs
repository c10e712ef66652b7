//! Errors: every one of these must come back as an error, before NVSHMEM is called (no PE waits).

use crate::harness::*;
use nvshmem::{Cmp, ReduceOp, SignalOp};

pub(crate) fn checks(h: &mut Harness) {
    let c = h.ctx;
    let n = c.n;
    h.check("errors: RMA", |_| {
        let sh = &c.shmem;
        let (a, b) = (c.zeros::<i32>(8)?, c.zeros::<i32>(9)?);
        let s = &c.stream;
        let mut p = Problems::default();
        p.note(refused("put to PE n", sh.put(&a, &a, n), pe_error));
        p.note(refused(
            "put_nbi of unequal lengths",
            sh.put_nbi(&a, &b, 0),
            length_error,
        ));
        p.note(refused(
            "put_on_stream to PE n",
            sh.put_on_stream(&a, &a, n, s),
            pe_error,
        ));
        p.note(refused(
            "put_nbi_on_stream of unequal lengths",
            sh.put_nbi_on_stream(&b, &a, 0, s),
            length_error,
        ));
        p.note(refused(
            "get from PE n + 3",
            sh.get(&a, &a, n + 3),
            pe_error,
        ));
        p.note(refused(
            "get_nbi of unequal lengths",
            sh.get_nbi(&b, &a, 0),
            length_error,
        ));
        p.note(refused(
            "get_on_stream of unequal lengths",
            sh.get_on_stream(&a, &b, 0, s),
            length_error,
        ));
        p.note(refused(
            "get_nbi_on_stream from PE n",
            sh.get_nbi_on_stream(&a, &a, n, s),
            pe_error,
        ));
        p.note(refused("p past the end", sh.p(&a, 8, 1, 0), index_error));
        p.note(refused("p to PE n", sh.p(&a, 0, 1, n), pe_error));
        p.note(refused(
            "g past the end",
            sh.g(a.view(2..4), 2, 0),
            index_error,
        ));
        p.note(refused("g from PE n", sh.g(&a, 0, n), pe_error));
        p.note(refused(
            "p_on_stream past the end",
            sh.p_on_stream(&b, 9, 1, 0, s),
            index_error,
        ));
        p.note(refused(
            "g_on_stream from PE n",
            sh.g_on_stream(&b, 0, n, s),
            pe_error,
        ));
        // Empty transfers are fine and do nothing.
        p.note(
            sh.put(a.view(0..0), b.view(9..), c.right)
                .map_err(Into::into),
        );
        p.note(
            sh.get_on_stream(a.view(8..), b.view(0..0), c.right, s)
                .map_err(Into::into),
        );
        p.done()
    });

    h.check("errors: signals", |_| {
        let sh = &c.shmem;
        let (a, b) = (c.zeros::<u8>(16)?, c.zeros::<u8>(15)?);
        let sig = c.zeros::<u64>(2)?;
        let s = &c.stream;
        let mut p = Problems::default();
        p.note(refused(
            "put_signal to PE n",
            sh.put_signal(&a, &a, &sig, 0, 1, SignalOp::Set, n),
            pe_error,
        ));
        p.note(refused(
            "put_signal with signal 2 of 2",
            sh.put_signal(&a, &a, &sig, 2, 1, SignalOp::Set, 0),
            index_error,
        ));
        p.note(refused(
            "put_signal_nbi of unequal lengths",
            sh.put_signal_nbi(&a, &b, &sig, 0, 1, SignalOp::Add, 0),
            length_error,
        ));
        p.note(refused(
            "put_signal_on_stream to PE n",
            sh.put_signal_on_stream(&a, &a, &sig, 0, 1, SignalOp::Add, n, s),
            pe_error,
        ));
        p.note(refused(
            "put_signal_nbi_on_stream with signal 5",
            sh.put_signal_nbi_on_stream(&a, &a, &sig, 5, 1, SignalOp::Add, 0, s),
            index_error,
        ));
        p.note(refused(
            "signal_op to PE n",
            sh.signal_op(&sig, 0, 1, SignalOp::Add, n),
            pe_error,
        ));
        p.note(refused(
            "signal_op_on_stream with signal 2",
            sh.signal_op_on_stream(&sig, 2, 1, SignalOp::Set, 0, s),
            index_error,
        ));
        p.note(refused(
            "signal_wait_until with signal 2",
            sh.signal_wait_until(&sig, 2, Cmp::Eq, 0),
            index_error,
        ));
        p.note(refused(
            "signal_wait_until_on_stream with signal 3",
            sh.signal_wait_until_on_stream(&sig, 3, Cmp::Eq, 0, s),
            index_error,
        ));
        p.note(refused(
            "signal_fetch of signal 2",
            sh.signal_fetch(&sig, 2),
            index_error,
        ));
        p.done()
    });

    h.check("errors: atomics and waits", |_| {
        let sh = &c.shmem;
        let a = c.zeros::<u64>(4)?;
        let f = c.zeros::<f32>(4)?;
        let s = &c.stream;
        let mut p = Problems::default();
        p.note(refused(
            "atomic_fetch from PE n",
            sh.atomic_fetch(&a, 0, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_set past the end",
            sh.atomic_set(&f, 4, 1.0, 0),
            index_error,
        ));
        p.note(refused(
            "atomic_swap on PE n",
            sh.atomic_swap(&f, 0, 1.0, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_compare_swap past the end",
            sh.atomic_compare_swap(&a, 4, 0, 1, 0),
            index_error,
        ));
        p.note(refused(
            "atomic_fetch_add on PE n",
            sh.atomic_fetch_add(&a, 0, 1, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_add past the end",
            sh.atomic_add(a.view(1..), 3, 1, 0),
            index_error,
        ));
        p.note(refused(
            "atomic_fetch_inc on PE n",
            sh.atomic_fetch_inc(&a, 0, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_inc past the end",
            sh.atomic_inc(&a, 9, 0),
            index_error,
        ));
        p.note(refused(
            "atomic_fetch_and on PE n",
            sh.atomic_fetch_and(&a, 0, 1, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_fetch_or past the end",
            sh.atomic_fetch_or(&a, 4, 1, 0),
            index_error,
        ));
        p.note(refused(
            "atomic_fetch_xor on PE n",
            sh.atomic_fetch_xor(&a, 0, 1, n),
            pe_error,
        ));
        p.note(refused(
            "wait_until past the end",
            sh.wait_until(&a, 4, Cmp::Eq, 0),
            index_error,
        ));
        p.note(refused(
            "wait_until_on_stream past the end",
            sh.wait_until_on_stream(&a, 4, Cmp::Eq, 0, s),
            index_error,
        ));
        p.done()
    });

    h.check("errors: collectives", |_| {
        let w = &c.world;
        let s = &c.stream;
        let f = c.zeros::<f32>(4 * n)?;
        let g = c.zeros::<f32>(4 * n + 1)?;
        let small = c.zeros::<f32>(4)?;
        let mut p = Problems::default();
        for op in [ReduceOp::And, ReduceOp::Or, ReduceOp::Xor] {
            p.note(refused(
                "a bitwise all_reduce of f32",
                w.all_reduce(&f, g.view(..4 * n), op, s),
                type_error,
            ));
            p.note(refused(
                "a bitwise reduce_scatter of f32",
                w.reduce_scatter(&small, &f, op, s),
                type_error,
            ));
        }
        p.note(refused(
            "all_reduce of unequal lengths",
            w.all_reduce(&f, &g, ReduceOp::Sum, s),
            length_error,
        ));
        p.note(refused(
            "reduce_scatter with a short source",
            w.reduce_scatter(&small, g.view(..4 * n - 1), ReduceOp::Sum, s),
            length_error,
        ));
        p.note(refused(
            "all_gather into a short destination",
            w.all_gather(f.view(1..), &small, s),
            length_error,
        ));
        p.note(refused(
            "all_gather into a long destination",
            w.all_gather(&g, &small, s),
            length_error,
        ));
        p.note(refused(
            "all_gather within one buffer",
            w.all_gather(f.view(..), f.view(..4), s),
            overlap_error,
        ));
        p.note(refused(
            "all_to_all of unequal lengths",
            w.all_to_all(&f, &g, s),
            length_error,
        ));
        // (With one PE the lengths divide, and the overlap is refused instead.)
        p.note(refused(
            "all_to_all not divisible by n_pes",
            w.all_to_all(&g, &g, s),
            if n == 1 {
                overlap_error
            } else {
                argument_error
            },
        ));
        p.note(refused(
            "broadcast from PE n",
            w.broadcast(&f, g.view(1..), n, s),
            pe_error,
        ));
        p.note(refused(
            "broadcast of unequal lengths",
            w.broadcast(&f, &g, 0, s),
            length_error,
        ));
        p.done()
    });
}
