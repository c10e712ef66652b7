//! Collectives.

use crate::data::*;
use crate::harness::*;
use crate::Result;
use nvshmem::{bf16, f16, ReduceOp, Team};

/// All-reduce of every applicable operator over `team` (world numbers `members`).
fn check_all_reduce<T: Num>(
    c: &Ctx,
    seed: u64,
    len: usize,
    team: &Team,
    members: &[usize],
) -> Result {
    let sh = &c.shmem;
    let src = sh.malloc::<T>(len)?;
    let dst = sh.malloc::<T>(len)?;
    let mut p = Problems::default();
    for (k, op) in ReduceOp::ALL.into_iter().enumerate() {
        if op.is_bitwise() && !T::IS_INTEGER {
            continue;
        }
        let seed = seed ^ ((k as u64 + 1) << 56);
        let kind = Kind::for_op(op);
        src.copy_from_host(&data::<T>(seed, c.me, len, kind))?;
        team.all_reduce(&dst, &src, op, &c.stream)?;
        c.sync()?;
        let got = dst.to_vec()?;
        let inputs: Vec<Vec<T>> = members
            .iter()
            .map(|&q| data::<T>(seed, q, len, kind))
            .collect();
        let mut column = vec![T::default(); members.len()];
        let mut bad = 0;
        let mut first = None;
        for i in 0..len {
            for (slot, x) in column.iter_mut().zip(&inputs) {
                *slot = x[i];
            }
            let want = T::reference(op, &column);
            if !agrees(op, got[i], want, &column) {
                bad += 1;
                first.get_or_insert(format!("first at {i}: got {:?}, expected {want:?}", got[i]));
            }
        }
        if let Some(first) = first {
            p.note(Err(format!("{op:?}: {bad} of {len} wrong; {first}").into()));
        }
        // Nobody overwrites its source while another PE may still read it.
        sh.barrier_all()?;
    }
    p.done()
}

fn check_all_reduce_world<T: Num>(c: &Ctx, seed: u64, len: usize) -> Result {
    check_all_reduce::<T>(c, seed, len, &c.world, &(0..c.n).collect::<Vec<_>>())
}

fn check_reduce_scatter<T: Num>(c: &Ctx, seed: u64, per_pe: usize) -> Result {
    let sh = &c.shmem;
    let n = c.n;
    let src = sh.malloc::<T>(per_pe * n)?;
    let dst = sh.malloc::<T>(per_pe)?;
    let mut p = Problems::default();
    for (k, op) in ReduceOp::ALL.into_iter().enumerate() {
        if op.is_bitwise() && !T::IS_INTEGER {
            continue;
        }
        let seed = seed ^ ((k as u64 + 1) << 56);
        let kind = Kind::for_op(op);
        src.copy_from_host(&data::<T>(seed, c.me, per_pe * n, kind))?;
        c.world.reduce_scatter(&dst, &src, op, &c.stream)?;
        c.sync()?;
        let got = dst.to_vec()?;
        let inputs: Vec<Vec<T>> = (0..n)
            .map(|q| data::<T>(seed, q, per_pe * n, kind))
            .collect();
        let mut bad = Vec::new();
        for i in 0..per_pe {
            let column: Vec<T> = inputs.iter().map(|x| x[c.me * per_pe + i]).collect();
            let want = T::reference(op, &column);
            if !agrees(op, got[i], want, &column) {
                bad.push(format!("at {i}: got {:?}, expected {want:?}", got[i]));
            }
        }
        if let Some(first) = bad.first() {
            p.note(Err(format!(
                "{op:?}: {} of {per_pe} wrong; first {first}",
                bad.len()
            )
            .into()));
        }
        sh.barrier_all()?;
    }
    p.done()
}

fn check_all_gather<T: Num>(
    c: &Ctx,
    seed: u64,
    per_pe: usize,
    team: &Team,
    members: &[usize],
) -> Result {
    let src = c.upload(&data::<T>(seed, c.me, per_pe, Kind::Bits))?;
    // Sized for the world: team sizes may differ between PEs (node teams), allocations may not.
    let dst = c.zeros::<T>(per_pe * c.n)?;
    let used = dst.view(..per_pe * members.len());
    team.all_gather(used, &src, &c.stream)?;
    c.sync()?;
    let want: Vec<T> = members
        .iter()
        .flat_map(|&q| data::<T>(seed, q, per_pe, Kind::Bits))
        .collect();
    same("gathered", &used.to_vec()?, &want)
}

fn check_broadcast<T: Num>(c: &Ctx, seed: u64, len: usize, root: usize) -> Result {
    let src = c.upload(&data::<T>(seed, c.me, len, Kind::Bits))?;
    let dst = c.zeros::<T>(len)?;
    c.world.broadcast(&dst, &src, root, &c.stream)?;
    c.sync()?;
    same(
        "received",
        &dst.to_vec()?,
        &data::<T>(seed, root, len, Kind::Bits),
    )
}

fn check_all_to_all<T: Num>(c: &Ctx, seed: u64, per_pair: usize) -> Result {
    let n = c.n;
    let src = c.upload(&data::<T>(seed, c.me, per_pair * n, Kind::Bits))?;
    let dst = c.zeros::<T>(per_pair * n)?;
    c.world.all_to_all(&dst, &src, &c.stream)?;
    c.sync()?;
    let want: Vec<T> = (0..n)
        .flat_map(|q| {
            data::<T>(seed, q, per_pair * n, Kind::Bits)[c.me * per_pair..(c.me + 1) * per_pair]
                .to_vec()
        })
        .collect();
    same("received blocks", &dst.to_vec()?, &want)
}

pub(crate) fn checks(h: &mut Harness) {
    let c = h.ctx;
    h.check("all_reduce<int8>", |seed| {
        check_all_reduce_world::<i8>(c, seed, 4099)
    });
    h.check("all_reduce<int16>", |seed| {
        check_all_reduce_world::<i16>(c, seed, 4099)
    });
    h.check("all_reduce<int32>", |seed| {
        check_all_reduce_world::<i32>(c, seed, 4099)
    });
    h.check("all_reduce<int64>", |seed| {
        check_all_reduce_world::<i64>(c, seed, 4099)
    });
    h.check("all_reduce<uint8>", |seed| {
        check_all_reduce_world::<u8>(c, seed, 4099)
    });
    h.check("all_reduce<uint16>", |seed| {
        check_all_reduce_world::<u16>(c, seed, 4099)
    });
    h.check("all_reduce<uint32>", |seed| {
        check_all_reduce_world::<u32>(c, seed, 4099)
    });
    h.check("all_reduce<uint64>", |seed| {
        check_all_reduce_world::<u64>(c, seed, 4099)
    });
    h.check("all_reduce<float>", |seed| {
        check_all_reduce_world::<f32>(c, seed, 4099)
    });
    h.check("all_reduce<double>", |seed| {
        check_all_reduce_world::<f64>(c, seed, 4099)
    });
    h.check("all_reduce<half>", |seed| {
        check_all_reduce_world::<f16>(c, seed, 4099)
    });
    h.check("all_reduce<bfloat16>", |seed| {
        check_all_reduce_world::<bf16>(c, seed, 4099)
    });
    h.check("all_reduce<float> of 1 Mi elements", |seed| {
        check_all_reduce_world::<f32>(c, seed, 1 << 20)
    });
    h.check("all_reduce<int32> in place", |seed| {
        let x = data::<i32>(seed, c.me, 1000, Kind::Arith);
        let buf = c.upload(&x)?;
        c.world.all_reduce(&buf, &buf, ReduceOp::Sum, &c.stream)?;
        c.sync()?;
        let want: Vec<i32> = (0..1000)
            .map(|i| {
                (0..c.n)
                    .map(|q| data::<i32>(seed, q, 1000, Kind::Arith)[i])
                    .sum()
            })
            .collect();
        same("sums", &buf.to_vec()?, &want)
    });
    h.check("all_reduce<int64> over the even PEs", |seed| {
        let evens = c.evens()?;
        match &evens {
            Some(t) => {
                let members: Vec<usize> = (0..c.n).step_by(2).collect();
                check_all_reduce::<i64>(c, seed, 513, t, &members)
            }
            None => {
                // The allocations are collective over the world; match them.
                let _src = c.shmem.malloc::<i64>(513)?;
                let _dst = c.shmem.malloc::<i64>(513)?;
                for _ in 0..ReduceOp::ALL.len() {
                    c.shmem.barrier_all()?;
                }
                Ok(())
            }
        }
    });

    h.check("reduce_scatter<int32>", |seed| {
        check_reduce_scatter::<i32>(c, seed, 257)
    });
    h.check("reduce_scatter<uint64>", |seed| {
        check_reduce_scatter::<u64>(c, seed, 100)
    });
    h.check("reduce_scatter<int8>", |seed| {
        check_reduce_scatter::<i8>(c, seed, 64)
    });
    h.check("reduce_scatter<float>", |seed| {
        check_reduce_scatter::<f32>(c, seed, 257)
    });
    h.check("reduce_scatter<bfloat16>", |seed| {
        check_reduce_scatter::<bf16>(c, seed, 130)
    });
    h.check("reduce_scatter<double>", |seed| {
        check_reduce_scatter::<f64>(c, seed, 33)
    });

    let world: Vec<usize> = (0..c.n).collect();
    h.check("all_gather<uint8>", |seed| {
        check_all_gather::<u8>(c, seed, 1001, &c.world, &world)
    });
    h.check("all_gather<int64>", |seed| {
        check_all_gather::<i64>(c, seed, 4097, &c.world, &world)
    });
    h.check("all_gather<double>", |seed| {
        check_all_gather::<f64>(c, seed, 65_536, &c.world, &world)
    });
    h.check("all_gather<half>", |seed| {
        check_all_gather::<f16>(c, seed, 333, &c.world, &world)
    });
    h.check("all_gather<int16>", |seed| {
        check_all_gather::<i16>(c, seed, 999, &c.world, &world)
    });
    h.check("all_gather<uint32> over the node team", |seed| {
        let node = c.shmem.team_node();
        let members: Vec<usize> = (0..node.n_pes())
            .map(|k| node.world_pe(k))
            .collect::<nvshmem::Result<_>>()?;
        check_all_gather::<u32>(c, seed, 100, &node, &members)
    });

    let last = c.n - 1;
    h.check("broadcast<int16> from PE 0", |seed| {
        check_broadcast::<i16>(c, seed, 1001, 0)
    });
    h.check("broadcast<float> from the last PE", |seed| {
        check_broadcast::<f32>(c, seed, 70_001, last)
    });
    h.check("broadcast<bfloat16> from the last PE", |seed| {
        check_broadcast::<bf16>(c, seed, 77, last)
    });
    h.check("broadcast<uint64> from PE 0", |seed| {
        check_broadcast::<u64>(c, seed, 4096, 0)
    });

    h.check("all_to_all<int32>", |seed| {
        check_all_to_all::<i32>(c, seed, 513)
    });
    h.check("all_to_all<double>", |seed| {
        check_all_to_all::<f64>(c, seed, 1000)
    });
    h.check("all_to_all<uint16>", |seed| {
        check_all_to_all::<u16>(c, seed, 7)
    });
    h.check("all_to_all<bfloat16>", |seed| {
        check_all_to_all::<bf16>(c, seed, 64)
    });
}
