//! The reduce to one root: every root, operator and type, in place and not.

use nvshmem::{bf16, f16, Collectives, Nvshmem, ReduceAlgo, ReduceOp, Result};

use crate::harness::{compare, operands, place, sync, Checker};
use crate::reference::{reference, Reducible};

/// `dst = op over PEs of src` on `root` (`dst` is `src` itself when `in_place`); on the
/// other PEs `dst` must keep what it held.
pub(crate) fn reduce_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (op, root, in_place): (ReduceOp, usize, bool),
    n: usize,
) -> Result<()> {
    let (me, _) = place(coll)?;
    let (all, src, dst, poison) = operands::<T>(shmem, coll, seed, n)?;
    let dst = if in_place { &src } else { &dst };
    coll.reduce(dst, &src, op, root, ReduceAlgo::Auto, shmem.stream())?;
    sync(shmem)?;
    let want = match (me == root, in_place) {
        (true, _) => reference(op, &all),
        (false, true) => all[me].clone(),
        (false, false) => poison,
    };
    compare("reduce", &dst.to_vec()?, &want)
}

/// Every root, in place and not, every type and operator.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    // The reduce to every root, in place and not, every type and operator.
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        for n in [1usize, 3, 1000, 4099, 300_001] {
            for root in 0..c.shmem.n_pes() {
                let case = (op, root, root % 2 == 1);
                let tag = format!("reduce {op:?} root {root} in place {} n={n}", case.2);
                c.check(&format!("{tag} f32"), |s, seed| {
                    reduce_case::<f32>(s, coll, seed, case, n)
                });
                c.check(&format!("{tag} bf16"), |s, seed| {
                    reduce_case::<bf16>(s, coll, seed, case, n)
                });
            }
            c.check(&format!("reduce {op:?} root 0 n={n} f16"), |s, seed| {
                reduce_case::<f16>(s, coll, seed, (op, 0, false), n)
            });
            c.check(&format!("reduce {op:?} root 0 n={n} i32"), |s, seed| {
                reduce_case::<i32>(s, coll, seed, (op, 0, false), n)
            });
        }
    }
}
