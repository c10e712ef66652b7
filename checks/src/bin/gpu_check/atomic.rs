//! Atomics.

use crate::data::*;
use crate::harness::*;
use crate::{Result, MAX_ATTEMPTS};
use nvshmem::ReduceOp;

/// Every PE adds and increments counters on PE 0; the fetched values must be a consistent
/// order of the updates.
fn check_add_inc<T: Ones>(c: &Ctx) -> Result {
    let sh = &c.shmem;
    let buf = c.zeros::<T>(4)?;
    let mut p = Problems::default();
    let fetched_add = sh.atomic_fetch_add(&buf, 0, small::<T>(c.me + 1), 0)?;
    sh.atomic_add(&buf, 1, small::<T>(2), 0)?;
    let ticket = sh.atomic_fetch_inc(&buf, 2, 0)?;
    sh.atomic_inc(&buf, 3, 0)?;
    sh.quiet()?;
    sh.barrier_all()?;
    let finals: Vec<T> = (0..4)
        .map(|i| sh.atomic_fetch(&buf, i, 0))
        .collect::<nvshmem::Result<_>>()?;
    let n = c.n;
    p.note(same(
        "counters on PE 0",
        &finals,
        &[small(n * (n + 1) / 2), small(2 * n), small(n), small(n)],
    ));
    // Everyone's fetched values, gathered.
    let mine = c.upload(&[as_u64(fetched_add), as_u64(ticket)])?;
    let all = sh.malloc::<u64>(2 * n)?;
    c.world.all_gather(&all, &mine, &c.stream)?;
    c.sync()?;
    let all = all.to_vec()?;
    let mut tickets: Vec<u64> = all.chunks(2).map(|x| x[1]).collect();
    tickets.sort_unstable();
    p.note(same(
        "fetch_inc tickets",
        &tickets,
        &(0..n as u64).collect::<Vec<_>>(),
    ));
    // Ordered by what they saw, the fetch-adds must chain: each saw the previous plus its add.
    let mut adds: Vec<(u64, usize)> = all.chunks(2).map(|x| x[0]).zip(0..n).collect();
    adds.sort_unstable();
    let mut expect = 0;
    for (seen, pe) in adds {
        p.note(ensure(seen == expect, || {
            format!("PE {pe}'s fetch_add saw {seen}, expected {expect}")
        }));
        expect = seen + pe as u64 + 1;
    }
    p.done()
}

/// One PE wins a compare-and-swap race on PE 0; then every PE increments with a CAS loop.
fn check_compare_swap<T: Ones>(c: &Ctx) -> Result {
    let sh = &c.shmem;
    let buf = c.zeros::<T>(1)?;
    let mut p = Problems::default();
    let old = sh.atomic_compare_swap(&buf, 0, small::<T>(0), small::<T>(c.me + 1), 0)?;
    let mine = c.upload(&[as_u64(old)])?;
    let all = sh.malloc::<u64>(c.n)?;
    c.world.all_gather(&all, &mine, &c.stream)?;
    c.sync()?;
    let olds = all.to_vec()?;
    let winners: Vec<usize> = (0..c.n).filter(|&q| olds[q] == 0).collect();
    let winner = winners.first().copied().unwrap_or(0);
    p.note(ensure(winners.len() == 1, || {
        format!("{} PEs won the swap", winners.len())
    }));
    for (q, &o) in olds.iter().enumerate() {
        if q != winner {
            p.note(ensure(o == winner as u64 + 1, || {
                format!("PE {q} saw {o}, winner was PE {winner}")
            }));
        }
    }
    sh.barrier_all()?;
    const ROUNDS: usize = 3;
    for round in 0..ROUNDS {
        // Bounded: a CAS that never succeeds is a failure, not a hang. `?` stops at the first
        // error.
        let mut done = false;
        for _ in 0..MAX_ATTEMPTS {
            let cur = sh.atomic_fetch(&buf, 0, 0)?;
            let next = small::<T>(as_u64(cur) as usize + 1);
            if sh.atomic_compare_swap(&buf, 0, cur, next, 0)? == cur {
                done = true;
                break;
            }
        }
        if !done {
            return Err(format!(
                "CAS increment round {round} did not succeed in {MAX_ATTEMPTS} attempts"
            )
            .into());
        }
    }
    sh.quiet()?;
    sh.barrier_all()?;
    let end = as_u64(sh.atomic_fetch(&buf, 0, 0)?);
    p.note(ensure(end == (winner + 1 + ROUNDS * c.n) as u64, || {
        format!("after the CAS loops: {end}")
    }));
    p.done()
}

/// Whether `x` is `init` combined by `op` with some subset of `others`.
fn from_some_subset<T: Num>(op: ReduceOp, init: T, others: &[T], x: T) -> bool {
    if others.len() > 16 {
        return true; // too many subsets to try
    }
    (0u32..1 << others.len()).any(|mask| {
        let mut v = vec![init];
        v.extend(
            others
                .iter()
                .enumerate()
                .filter(|(i, _)| mask >> i & 1 == 1)
                .map(|(_, &o)| o),
        );
        T::reference(op, &v) == x
    })
}

/// Every PE ANDs, ORs and XORs a random value into PE 0's words; what each fetched must be the
/// start value combined with some of the other PEs' values.
fn check_bitwise<T: Ones>(c: &Ctx, seed: u64) -> Result {
    let sh = &c.shmem;
    let buf = c.upload(&[T::ones(), T::default(), T::default()])?;
    sh.barrier_all()?;
    let v = |q: usize| data::<T>(seed, q, 3, Kind::Bits);
    let mine = v(c.me);
    let fetched = [
        sh.atomic_fetch_and(&buf, 0, mine[0], 0)?,
        sh.atomic_fetch_or(&buf, 1, mine[1], 0)?,
        sh.atomic_fetch_xor(&buf, 2, mine[2], 0)?,
    ];
    sh.quiet()?;
    sh.barrier_all()?;
    let all: Vec<Vec<T>> = (0..c.n).map(v).collect();
    let ops = [
        (ReduceOp::And, T::ones()),
        (ReduceOp::Or, T::default()),
        (ReduceOp::Xor, T::default()),
    ];
    let mut p = Problems::default();
    let got: Vec<T> = (0..3)
        .map(|i| sh.atomic_fetch(&buf, i, 0))
        .collect::<nvshmem::Result<_>>()?;
    for (i, &(op, init)) in ops.iter().enumerate() {
        let everyone: Vec<T> = std::iter::once(init)
            .chain(all.iter().map(|x| x[i]))
            .collect();
        let want = T::reference(op, &everyone);
        p.note(ensure(got[i] == want, || {
            format!("{op:?}: PE 0 holds {:?}, expected {want:?}", got[i])
        }));
        let others: Vec<T> = (0..c.n).filter(|&q| q != c.me).map(|q| all[q][i]).collect();
        p.note(ensure(
            from_some_subset(op, init, &others, fetched[i]),
            || {
                format!(
                    "{op:?}: fetched {:?}, which no order of the updates explains",
                    fetched[i]
                )
            },
        ));
    }
    p.done()
}

/// Every PE sets, reads and swaps a slot on the next PE.
fn check_set_fetch_swap<T: Num + nvshmem::AtomicElement>(c: &Ctx, seed: u64) -> Result {
    let sh = &c.shmem;
    let buf = c.zeros::<T>(c.n)?;
    let v = |q: usize| data::<T>(seed, q, 2, Kind::Arith);
    let (mine, theirs) = (v(c.me), v(c.left));
    let mut p = Problems::default();
    sh.atomic_set(&buf, c.me, mine[0], c.right)?;
    sh.quiet()?;
    sh.barrier_all()?;
    p.note(ensure(buf.to_vec()?[c.left] == theirs[0], || {
        "atomic_set did not land".into()
    }));
    p.note(ensure(
        sh.atomic_fetch(&buf, c.me, c.right)? == mine[0],
        || "remote atomic_fetch".into(),
    ));
    p.note(ensure(
        sh.atomic_fetch(&buf, c.left, c.me)? == theirs[0],
        || "local atomic_fetch".into(),
    ));
    sh.barrier_all()?;
    let old = sh.atomic_swap(&buf, c.me, mine[1], c.right)?;
    p.note(ensure(old == mine[0], || {
        format!("atomic_swap returned {old:?}, expected {:?}", mine[0])
    }));
    sh.quiet()?;
    sh.barrier_all()?;
    let now = buf.to_vec()?;
    p.note(ensure(now[c.left] == theirs[1], || {
        format!("after swap: {:?}, expected {:?}", now[c.left], theirs[1])
    }));
    p.note(ensure(
        now.iter()
            .enumerate()
            .all(|(i, x)| i == c.left || *x == T::default()),
        || "stray writes".into(),
    ));
    p.done()
}

fn atomic_for<T: Ones>(h: &mut Harness) {
    let c = h.ctx;
    let t = T::NVSHMEM_NAME;
    h.check(format!("atomic_fetch_add/add/fetch_inc/inc<{t}>"), |_| {
        check_add_inc::<T>(c)
    });
    h.check(format!("atomic_compare_swap<{t}>"), |_| {
        check_compare_swap::<T>(c)
    });
    h.check(format!("atomic_fetch_and/or/xor<{t}>"), |seed| {
        check_bitwise::<T>(c, seed)
    });
}

pub(crate) fn checks(h: &mut Harness) {
    atomic_for::<i32>(h);
    atomic_for::<i64>(h);
    atomic_for::<u32>(h);
    atomic_for::<u64>(h);
    let c = h.ctx;
    h.check("atomic_set/fetch/swap<float>", |seed| {
        check_set_fetch_swap::<f32>(c, seed)
    });
    h.check("atomic_set/fetch/swap<double>", |seed| {
        check_set_fetch_swap::<f64>(c, seed)
    });
    h.check("atomic_set/fetch/swap<int32>", |seed| {
        check_set_fetch_swap::<i32>(c, seed)
    });
    h.check("atomic_set/fetch/swap<uint64>", |seed| {
        check_set_fetch_swap::<u64>(c, seed)
    });
}
