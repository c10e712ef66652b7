//! Our collectives on teams whose PEs do not all reach each other by loads and stores, as
//! across nodes: `CollectivesConfig::domain_size` makes virtual nodes of one node's PEs.
//! There the calls with `Auto` go through NVSHMEM's team collectives (checked against the
//! CPU reference: exact sums of i32, maxima of f32, data moved bit for bit), and what only
//! our kernels do is refused with an error that says so. The world's `Collectives` is flat.

use nvshmem::collectives::Compression;
use nvshmem::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Collectives, CollectivesConfig,
    Error, Nvshmem, Reach, ReduceOp, ReduceScatterAlgo, Result,
};

use crate::all_gather::all_gather_case;
use crate::all_reduce::all_reduce_case;
use crate::back_to_back::back_to_back;
use crate::graph_replay::graph_replay;
use crate::harness::{expect_err, Checker};
use crate::movement::{all_to_all_case, broadcast_case};
use crate::reduce_scatter::reduce_scatter_case;

/// A `Collectives` over the world (or `team`) as domains of `size` PEs, checked to say so.
fn in_domains(shmem: &Nvshmem, size: usize, team: Option<&nvshmem::Team>) -> Result<Collectives> {
    let n = team.map_or(shmem.n_pes(), |t| t.n_pes());
    let mut config = CollectivesConfig::for_pes(n);
    config.domain_size = Some(size);
    let coll = match team {
        None => Collectives::with_config(shmem, config)?,
        Some(t) => Collectives::with_team(shmem, Some(t), config)?,
    };
    let want = if size >= n {
        Reach::Flat
    } else {
        Reach::Domains { size }
    };
    if coll.reach() != want {
        return Err(Error::InvalidArgument(format!(
            "domains of {size} on {n} PEs: the reach is {:?}, not {want:?}",
            coll.reach()
        )));
    }
    Ok(coll)
}

/// Every collective `Auto` runs through NVSHMEM on `coll`, at an odd size, in and out of
/// place, back to back and replayed in a graph.
fn every_collective(shmem: &Nvshmem, coll: &Collectives, seed: u64) -> Result<()> {
    let (n, last) = (1001, coll.n_pes() - 1);
    for in_place in [false, true] {
        let auto = AllReduceAlgo::Auto;
        all_reduce_case::<i32>(shmem, coll, seed, ReduceOp::Sum, auto, n, in_place)?;
        all_reduce_case::<f32>(shmem, coll, seed + 1, ReduceOp::Max, auto, n, in_place)?;
    }
    all_gather_case::<f32>(shmem, coll, seed + 2, AllGatherAlgo::Auto, n)?;
    let rs = (ReduceOp::Sum, ReduceScatterAlgo::Auto);
    reduce_scatter_case::<i32>(shmem, coll, seed + 3, rs, n)?;
    for in_place in [false, true] {
        let bc = (BroadcastAlgo::Auto, last, in_place);
        broadcast_case::<f32>(shmem, coll, seed + 4, bc, n)?;
    }
    all_to_all_case::<f32>(shmem, coll, seed + 5, AllToAllAlgo::Auto, n)?;
    back_to_back::<i32>(shmem, coll, seed + 6, &[AllReduceAlgo::Auto], n, 5)?;
    graph_replay::<i32>(shmem, coll, seed + 7, AllReduceAlgo::Auto, n)
}

/// On domains, an algorithm of ours and the calls only our kernels make are refused with
/// what to do, on every PE alike (nothing waits).
fn ours_refused(shmem: &Nvshmem, coll: &Collectives) -> Result<()> {
    let s = shmem.stream();
    let x = shmem.calloc::<f32>(64 * shmem.n_pes())?;
    let y = shmem.calloc::<f32>(64 * shmem.n_pes())?;
    let r = coll.all_reduce(&x, &x, ReduceOp::Sum, AllReduceAlgo::OneShot, s);
    expect_err(
        r,
        "a one-shot all-reduce on domains",
        |e| matches!(e, Error::InvalidArgument(m) if m.contains("pass Auto")),
    )?;
    let counts = vec![1; shmem.n_pes()];
    let r = coll.all_to_all_v(&y, &counts, &x, &counts, s);
    expect_err(
        r,
        "an all_to_all_v on domains",
        |e| matches!(e, Error::InvalidArgument(m) if m.contains("our kernels only")),
    )?;
    let int8 = Compression::Int8 { block: 128 };
    let r = coll.all_reduce_compressed(&x, &x, int8, None, s);
    expect_err(
        r,
        "a compressed all-reduce on domains",
        |e| matches!(e, Error::InvalidArgument(m) if m.contains("our kernels only")),
    )?;
    // Refused before anything was enqueued: the next call runs.
    all_reduce_case::<i32>(shmem, coll, 17, ReduceOp::Sum, AllReduceAlgo::Auto, 5, true)
}

pub(crate) fn checks(c: &mut Checker, world: &Collectives) {
    c.check("domains: one node is flat", |_, _| match world.reach() {
        Reach::Flat => Ok(()),
        r => Err(Error::InvalidArgument(format!("one node's reach is {r:?}"))),
    });
    // One PE is one domain: nothing goes through NVSHMEM.
    let n = c.shmem.n_pes();
    if n < 2 {
        return;
    }
    c.check("domains of 1 PE, every collective by NVSHMEM", |s, seed| {
        every_collective(s, &in_domains(s, 1, None)?, seed)
    });
    c.check("domains: ours refused, saying what to do", |s, _| {
        ours_refused(s, &in_domains(s, 1, None)?)
    });
    if n >= 4 && n.is_multiple_of(2) {
        c.check(
            "domains of 2 PEs, every collective by NVSHMEM",
            |s, seed| every_collective(s, &in_domains(s, 2, None)?, seed),
        );
        c.check("domains of 1 in pairs (a team's own split)", |s, seed| {
            let pair = s.team_world().split_2d(2)?.0;
            let coll = in_domains(s, 1, pair.as_ref())?;
            // Each pair on data of its own, so that data crossing pairs shows.
            let first = coll.world_pe(0)? as u64;
            every_collective(s, &coll, seed.wrapping_add(7919 * (first + 1)))
        });
    }
}
