//! The calls of the shared `Collectives`, drawn alike on every PE, and what each must leave
//! in this PE's destination.

use crate::common::{below, hash, FILL_I32, TAG_CALL, TAG_COUNTS, VOTE_EVERY};
use crate::roles::Env;
use crate::tally::Kind;
use nvshmem::ReduceOp;
use nvshmem_checks::splitmix::{mix, SplitMix64};

#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    AllReduce {
        op: ReduceOp,
        float: bool,
        in_place: bool,
    },
    AllGather,
    ReduceScatter(ReduceOp),
    Reduce {
        op: ReduceOp,
        root: usize,
    },
    Broadcast {
        root: usize,
        in_place: bool,
    },
    AllToAll,
    AllToAllV,
    /// An all-reduce (max) of whether each PE's time is up.
    Vote,
}

/// Call `k` of a run, the same on every PE: what, with `m` elements per PE block.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) k: u64,
    pub(crate) op: Op,
    pub(crate) m: usize,
}

impl Call {
    pub(crate) fn at(env: &Env, k: u64) -> Call {
        if k % VOTE_EVERY == VOTE_EVERY - 1 {
            return Call {
                k,
                op: Op::Vote,
                m: 1,
            };
        }
        let mut rng = SplitMix64(hash(env.seed, &[TAG_CALL, k]));
        let bits = below(&mut rng, 13);
        let m = 1 + below(&mut rng, 1 << bits);
        let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min][below(&mut rng, 3)];
        let root = below(&mut rng, env.n);
        let in_place = below(&mut rng, 2) == 1;
        let op = match below(&mut rng, 9) {
            0 | 1 => Op::AllReduce {
                op,
                float: false,
                in_place,
            },
            2 => Op::AllReduce {
                op,
                float: true,
                in_place,
            },
            3 => Op::AllGather,
            4 => Op::ReduceScatter(op),
            5 => Op::Reduce { op, root },
            6 => Op::Broadcast { root, in_place },
            7 => Op::AllToAll,
            _ => Op::AllToAllV,
        };
        Call { k, op, m }
    }

    pub(crate) fn kind(&self) -> Kind {
        match self.op {
            Op::AllReduce { .. } => Kind::AllReduce,
            Op::AllGather => Kind::AllGather,
            Op::ReduceScatter(_) => Kind::ReduceScatter,
            Op::Reduce { .. } => Kind::Reduce,
            Op::Broadcast { .. } => Kind::Broadcast,
            Op::AllToAll => Kind::AllToAll,
            Op::AllToAllV => Kind::AllToAllV,
            Op::Vote => Kind::Vote,
        }
    }

    /// Elements of the source and the destination on this PE.
    pub(crate) fn lens(&self, n: usize) -> (usize, usize) {
        let m = self.m;
        match self.op {
            Op::AllGather => (m, n * m),
            Op::ReduceScatter(_) => (n * m, m),
            Op::AllToAll | Op::AllToAllV => (n * m, n * m),
            _ => (m, m),
        }
    }

    /// Whether the destination is the source.
    pub(crate) fn in_place(&self) -> bool {
        matches!(
            self.op,
            Op::AllReduce { in_place: true, .. } | Op::Broadcast { in_place: true, .. }
        )
    }
}

/// PE `pe`'s first `len` input elements of call `k`: integers in [-1000, 1000], so that every
/// sum is exact in f32 too.
pub(crate) fn inputs(env: &Env, k: u64, pe: usize, len: usize) -> Vec<i32> {
    let base = hash(env.seed, &[TAG_CALL, k, pe as u64]);
    (0..len as u64)
        .map(|i| (mix(base ^ i) % 2001) as i32 - 1000)
        .collect()
}

/// Elements PE `p` sends PE `q` in all-to-all-v call `k`: 0 to `m`.
pub(crate) fn count(env: &Env, call: &Call, p: usize, q: usize) -> usize {
    (hash(env.seed, &[TAG_COUNTS, call.k, p as u64, q as u64]) % (call.m as u64 + 1)) as usize
}

fn combine(op: ReduceOp, a: i32, b: i32) -> i32 {
    match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
        other => unreachable!("no call draws {other:?}"),
    }
}

/// `op` over PEs of element `i` of `all` (every PE's inputs), in PE order.
fn reduced(op: ReduceOp, all: &[Vec<i32>], i: usize) -> i32 {
    all.iter()
        .map(|x| x[i])
        .reduce(|a, b| combine(op, a, b))
        .expect("at least one PE")
}

/// What this PE's destination holds after `call` (as i32; the float all-reduce's values
/// are these, converted).
pub(crate) fn expected(env: &Env, call: &Call) -> Vec<i32> {
    let (n, me, m, k) = (env.n, env.me, call.m, call.k);
    let all = |len| (0..n).map(|p| inputs(env, k, p, len)).collect::<Vec<_>>();
    match call.op {
        Op::AllReduce { op, .. } => {
            let x = all(m);
            (0..m).map(|i| reduced(op, &x, i)).collect()
        }
        Op::AllGather => all(m).concat(),
        Op::ReduceScatter(op) => {
            let x = all(n * m);
            (0..m).map(|i| reduced(op, &x, me * m + i)).collect()
        }
        Op::Reduce { op, root } if root == me => {
            let x = all(m);
            (0..m).map(|i| reduced(op, &x, i)).collect()
        }
        Op::Reduce { .. } => vec![FILL_I32; m],
        Op::Broadcast { root, .. } => inputs(env, k, root, m),
        Op::AllToAll => all(n * m)
            .iter()
            .flat_map(|x| x[me * m..(me + 1) * m].to_vec())
            .collect(),
        Op::AllToAllV => {
            let mut out = Vec::with_capacity(n * m);
            for (p, x) in all(n * m).iter().enumerate() {
                let from: usize = (0..me).map(|q| count(env, call, p, q)).sum();
                out.extend_from_slice(&x[from..from + count(env, call, p, me)]);
            }
            out.resize(n * m, FILL_I32);
            out
        }
        Op::Vote => unreachable!("a vote is read, not checked"),
    }
}
