//! Our collectives over teams (`Collectives::with_team`): pairs side by side, every
//! collective and algorithm; a strided team, and the calls of a PE outside it refused; the
//! rows and the columns of a 2-D split one after the other and at once on two streams; the
//! gradient sync of data-parallel pairs; the per-call agreement and the bounded waits within
//! a team; members that passed different teams refused on every PE. Each team draws its inputs from a seed of its own, so that data
//! crossing from one team into another shows.
//!
//! The checks' buffers are symmetric over the world, so every team of a check must have as
//! many PEs: they run with an even PE count.

use nvshmem::collectives::Compression;
use nvshmem::{
    bf16, AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Collectives,
    CollectivesConfig, Error, GradSyncConfig, GradientSync, Nvshmem, ReduceOp, ReduceScatterAlgo,
    Result, Team,
};
use std::time::Duration;

use crate::all_gather::all_gather_case;
use crate::all_reduce::all_reduce_case;
use crate::all_to_all_v::all_to_all_v_case;
use crate::back_to_back::back_to_back;
use crate::grad_sync::{compressed_steps, plain_steps, PARAMS};
use crate::graph_replay::graph_replay;
use crate::harness::{compare, cuda, expect_err, place, Checker};
use crate::movement::{all_to_all_case, broadcast_case};
use crate::reduce::reduce_case;
use crate::reduce_scatter::reduce_scatter_case;
use crate::reference::{inputs, reference};

/// A seed of the team's own, from its first world PE.
fn team_seed(coll: &Collectives, seed: u64) -> u64 {
    let first = coll.world_pe(0).map_or(0, |w| w as u64 + 1);
    seed.wrapping_add(7919 * first)
}

/// `CollectivesConfig::for_pes(n)` with at most `blocks` blocks a call, and `timeout`.
fn config(n: usize, blocks: Option<usize>, timeout: Option<Duration>) -> CollectivesConfig {
    let mut config = CollectivesConfig::for_pes(n);
    config.max_blocks = blocks;
    if timeout.is_some() {
        config.timeout = timeout;
    }
    config
}

/// Every collective and algorithm over `coll`'s team, at a size every algorithm takes, an
/// all-reduce large enough for the bandwidth path, calls back to back and a graph replay.
fn every_collective(shmem: &Nvshmem, coll: &Collectives, seed: u64) -> Result<()> {
    let s = team_seed(coll, seed);
    let (n, sum) = (1000, ReduceOp::Sum);
    let last = coll.n_pes() - 1;
    for algo in AllReduceAlgo::ALL {
        all_reduce_case::<f32>(shmem, coll, s, sum, algo, n, false)?;
    }
    all_reduce_case::<bf16>(
        shmem,
        coll,
        s + 1,
        sum,
        AllReduceAlgo::Bandwidth,
        1 << 20,
        true,
    )?;
    for algo in AllGatherAlgo::ALL {
        all_gather_case::<f32>(shmem, coll, s + 2, algo, n)?;
    }
    for algo in ReduceScatterAlgo::ALL {
        reduce_scatter_case::<f32>(shmem, coll, s + 3, (sum, algo), n)?;
    }
    for algo in BroadcastAlgo::ALL {
        broadcast_case::<f32>(shmem, coll, s + 4, (algo, last, false), n)?;
    }
    for algo in AllToAllAlgo::ALL {
        all_to_all_case::<f32>(shmem, coll, s + 5, algo, n)?;
    }
    reduce_case::<f32>(shmem, coll, s + 6, (ReduceOp::Max, last, false), n)?;
    all_to_all_v_case(shmem, coll, s + 7, 300)?;
    let algos = [AllReduceAlgo::LowLatency, AllReduceAlgo::OneShot];
    back_to_back::<f32>(shmem, coll, s + 8, &algos, n, 6)?;
    graph_replay::<f32>(shmem, coll, s + 9, AllReduceAlgo::Auto, n)
}

/// `coll` on a PE outside its team: its calls are refused, and say why.
fn refused_outside(shmem: &Nvshmem, coll: &Collectives) -> Result<()> {
    let x = shmem.malloc::<f32>(64)?;
    if coll.my_pe().is_some() {
        return Ok(());
    }
    let r = coll.all_reduce(&x, &x, ReduceOp::Sum, AllReduceAlgo::Auto, shmem.stream());
    expect_err(
        r,
        "a call outside the team",
        |e| matches!(e, Error::InvalidArgument(m) if m.contains("not a member of this Collectives' team")),
    )
}

/// The PEs of a column of `split_2d(2)`.
fn column(shmem: &Nvshmem) -> usize {
    shmem.n_pes() / 2
}

/// The pairs of neighbours (0 and 1, 2 and 3, ...), each with `Collectives` of its own.
fn pairs(shmem: &Nvshmem) -> Result<Option<Team>> {
    Ok(shmem.team_world().split_2d(2)?.0)
}

/// All-reduces of every PE's input over the rows (on one stream) and over the columns (on
/// another) of a 2-D split, `rounds` of each interleaved with no host synchronisation,
/// `n` elements each; each result checked against its team's reference.
fn rows_and_columns_at_once(shmem: &Nvshmem, seed: u64, n: usize, rounds: usize) -> Result<()> {
    let (row, col) = shmem.team_world().split_2d(2)?;
    // Two Collectives' calls at once must fit the GPU together.
    let blocks = Some(8);
    let rows = Collectives::with_team(shmem, row.as_ref(), config(2, blocks, None))?;
    let cols = Collectives::with_team(shmem, col.as_ref(), config(column(shmem), blocks, None))?;
    let streams = [shmem.new_stream()?, shmem.new_stream()?];
    let me = shmem.my_pe();
    let all: Vec<Vec<Vec<f32>>> = (0..rounds as u64)
        .map(|r| inputs::<f32>(seed + r, shmem.n_pes(), n))
        .collect();
    let mut bufs = Vec::new();
    for x in &all {
        let src = shmem.malloc::<f32>(n)?;
        src.copy_from_host(&x[me])?;
        bufs.push((src, shmem.calloc::<f32>(n)?, shmem.calloc::<f32>(n)?));
    }
    for (src, by_row, by_col) in &bufs {
        let algo = AllReduceAlgo::Auto;
        rows.all_reduce(by_row, src, ReduceOp::Sum, algo, &streams[0])?;
        cols.all_reduce(by_col, src, ReduceOp::Sum, algo, &streams[1])?;
    }
    for s in &streams {
        cuda("cuStreamSynchronize", s.synchronize())?;
    }
    let want = |coll: &Collectives, x: &[Vec<f32>]| -> Result<Vec<f32>> {
        let members = (0..coll.n_pes())
            .map(|p| Ok(x[coll.world_pe(p)?].clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(reference(ReduceOp::Sum, &members))
    };
    for (x, (_, by_row, by_col)) in all.iter().zip(&bufs) {
        compare("a row's all_reduce", &by_row.to_vec()?, &want(&rows, x)?)?;
        compare("a column's all_reduce", &by_col.to_vec()?, &want(&cols, x)?)?;
    }
    Ok(())
}

/// Within a pair with `check_calls`, team PE 1 passes another length: both members are told,
/// naming the world PEs; then, with a short bound, team PE 1 skips a call: team PE 0's wait
/// runs out and names the world PE it waited for.
fn agreement_and_bounded_waits(shmem: &Nvshmem) -> Result<()> {
    let pair = pairs(shmem)?;
    let mut checked = config(2, None, None);
    checked.check_calls = true;
    let coll = Collectives::with_team(shmem, pair.as_ref(), checked)?;
    let (me, _) = place(&coll)?;
    let partner = coll.world_pe(1 - me.min(1)).unwrap_or(0);
    let x = shmem.calloc::<f32>(256)?;
    let len = if me == 1 { 128 } else { 256 };
    let r = coll.all_reduce(
        x.view(..len),
        x.view(..len),
        ReduceOp::Sum,
        AllReduceAlgo::Auto,
        shmem.stream(),
    );
    if coll.n_pes() > 1 {
        let named = format!("PE {partner}");
        match r {
            Err(Error::CollectiveMismatch(m))
                if m.contains("128 elements")
                    && m.contains("256 elements")
                    && m.contains(&named) => {}
            other => {
                return Err(Error::InvalidArgument(format!(
                    "calls of different lengths in a pair, the partner {named}: {other:?}"
                )))
            }
        }
    }
    drop(coll);
    let bound = Some(Duration::from_millis(300));
    let coll = Collectives::with_team(shmem, pair.as_ref(), config(2, None, bound))?;
    if coll.n_pes() < 2 {
        return Ok(());
    }
    if me == 0 {
        let r = coll
            .all_reduce(
                &x,
                &x,
                ReduceOp::Sum,
                AllReduceAlgo::OneShot,
                shmem.stream(),
            )
            .and_then(|()| cuda("cuStreamSynchronize", shmem.stream().synchronize()))
            .and_then(|()| coll.check());
        match r {
            Err(Error::Timeout { waited_for, .. }) if waited_for == partner => {}
            other => {
                return Err(Error::InvalidArgument(format!(
                    "a call team PE 1 (PE {partner}) skipped: {other:?}"
                )))
            }
        }
    }
    Ok(())
}

/// Members that passed different teams: PE 0 passes its column where the others pass their
/// rows; every PE is refused.
fn different_teams_refused(shmem: &Nvshmem) -> Result<()> {
    let (row, col) = shmem.team_world().split_2d(2)?;
    let team = if shmem.my_pe() == 0 { &col } else { &row };
    // A configuration every team size takes (the columns may have 1 PE).
    let r = Collectives::with_team(shmem, team.as_ref(), config(1, None, None)).map(drop);
    expect_err(r, "Collectives made over different teams", |e| {
        matches!(e, Error::CollectiveMismatch(_))
    })
}

pub(crate) fn checks(c: &mut Checker) {
    if !c.shmem.n_pes().is_multiple_of(2) {
        if c.shmem.my_pe() == 0 {
            println!("teams: skipped (the team checks need an even PE count)");
        }
        return;
    }
    c.check("teams: two pairs at once, every collective", |s, seed| {
        let pair = pairs(s)?;
        let coll = Collectives::with_team(s, pair.as_ref(), config(2, None, None))?;
        every_collective(s, &coll, seed)
    });
    c.check(
        "teams: the odd PEs (strided), the others refused",
        |s, seed| {
            let half = s.n_pes() / 2;
            let world = s.team_world();
            let (evens, odds) = (
                world.split_strided(0, 2, half)?,
                world.split_strided(1, 2, half)?,
            );
            let config = config(half, None, None);
            let on_evens = Collectives::with_team(s, evens.as_ref(), config.clone())?;
            let on_odds = Collectives::with_team(s, odds.as_ref(), config)?;
            let (mine, other) = match s.my_pe() % 2 {
                0 => (&on_evens, &on_odds),
                _ => (&on_odds, &on_evens),
            };
            refused_outside(s, other)?;
            every_collective(s, mine, seed)
        },
    );
    c.check("teams: rows, then columns, of a 2-D split", |s, seed| {
        let (row, col) = s.team_world().split_2d(2)?;
        let rows = Collectives::with_team(s, row.as_ref(), config(2, None, None))?;
        let cols = Collectives::with_team(s, col.as_ref(), config(column(s), None, None))?;
        every_collective(s, &rows, seed)?;
        every_collective(s, &cols, seed + 100)
    });
    for (n, rounds) in [(1000, 4), (300_001, 3)] {
        let name = format!("teams: rows and columns at once on two streams, n={n}");
        c.check(&name, |s, seed| {
            rows_and_columns_at_once(s, seed, n, rounds)
        });
    }
    c.check(
        "teams: gradient sync in pairs, plain and int8",
        |s, seed| {
            let pair = pairs(s)?;
            let int8 = Compression::Int8 { block: 128 };
            let sync = GradSyncConfig {
                bucket_bytes: 64 << 10,
                compression: Some(int8),
            };
            let mut config = config(2, None, None);
            config.workspace.compressed_bytes =
                GradientSync::<f32>::compressed_workspace_bytes(&PARAMS, sync, 2);
            let coll = Collectives::with_team(s, pair.as_ref(), config)?;
            let seed = team_seed(&coll, seed);
            plain_steps::<f32>(s, &coll, seed, 100 << 10, true)?;
            compressed_steps(s, &coll, seed + 1, int8)
        },
    );
    c.check("teams: agreement and bounded waits in a pair", |s, _| {
        agreement_and_bounded_waits(s)
    });
    c.check("teams: members that passed different teams", |s, _| {
        different_teams_refused(s)
    });
}
