//! Ordering and synchronisation.

use crate::data::*;
use crate::harness::*;
use crate::Result;
use nvshmem::{Cmp, Team};

/// How the PEs in `members` (world numbers) are brought in step after writing to each other.
#[derive(Clone, Copy, Debug)]
enum Step {
    BarrierAll,
    Barrier,
    SyncAll,
    Sync,
    BarrierAllOnStream,
    BarrierOnStream,
    SyncAllOnStream,
    SyncOnStream,
}

/// Every member writes `me + 1` into its slot on every member, then the members step together
/// with `step` (over `team` where it takes one) and check every slot.
fn check_step(c: &Ctx, team: Option<&Team>, step: Step) -> Result {
    let (sh, s) = (&c.shmem, &c.stream);
    let buf = c.zeros::<u32>(c.n)?;
    let members: Vec<usize> = match team {
        Some(t) => (0..t.n_pes())
            .map(|k| t.world_pe(k))
            .collect::<nvshmem::Result<_>>()?,
        None => (0..c.n).collect(),
    };
    let on_stream = matches!(
        step,
        Step::BarrierAllOnStream
            | Step::BarrierOnStream
            | Step::SyncAllOnStream
            | Step::SyncOnStream
    );
    for &pe in &members {
        if on_stream {
            sh.p_on_stream(&buf, c.me, c.me as u32 + 1, pe, s)?;
        } else {
            sh.p(&buf, c.me, c.me as u32 + 1, pe)?;
        }
    }
    let team_or_world = team.unwrap_or(&c.world);
    match step {
        Step::BarrierAll => sh.barrier_all()?,
        Step::Barrier => sh.barrier(team_or_world)?,
        Step::SyncAll => {
            sh.quiet()?;
            sh.sync_all()?;
        }
        Step::Sync => {
            sh.quiet()?;
            sh.sync(team_or_world)?;
        }
        Step::BarrierAllOnStream => sh.barrier_all_on_stream(s)?,
        Step::BarrierOnStream => sh.barrier_on_stream(team_or_world, s)?,
        Step::SyncAllOnStream => {
            sh.quiet_on_stream(s)?;
            sh.sync_all_on_stream(s)?;
        }
        Step::SyncOnStream => {
            sh.quiet_on_stream(s)?;
            sh.sync_on_stream(team_or_world, s)?;
        }
    }
    c.sync()?;
    let got = buf.to_vec()?;
    let want: Vec<u32> = (0..c.n)
        .map(|q| {
            if members.contains(&q) {
                q as u32 + 1
            } else {
                0
            }
        })
        .collect();
    same("slots", &got, &want)
}

/// `wait_until` (or its stream form) for every comparison, on a value the previous PE wrote.
fn check_wait_until<T: Ones>(c: &Ctx, on_stream: bool) -> Result {
    let (sh, s) = (&c.shmem, &c.stream);
    let ivar = c.zeros::<T>(2)?;
    let expect = small::<T>(c.left + 1);
    if on_stream {
        sh.p_on_stream(&ivar, 1, small::<T>(c.me + 1), c.right, s)?;
        sh.quiet_on_stream(s)?;
    } else {
        sh.p(&ivar, 1, small::<T>(c.me + 1), c.right)?;
        sh.quiet()?;
    }
    let cases = [
        (Cmp::Eq, expect),
        (Cmp::Ne, small::<T>(0)),
        (Cmp::Gt, small::<T>(0)),
        (Cmp::Ge, expect),
        (Cmp::Lt, small::<T>(c.left + 2)),
        (Cmp::Le, expect),
    ];
    for (cmp, v) in cases {
        if on_stream {
            sh.wait_until_on_stream(&ivar, 1, cmp, v, s)?;
        } else {
            sh.wait_until(&ivar, 1, cmp, v)?;
        }
    }
    c.sync()?;
    same("wait variables", &ivar.to_vec()?, &[T::default(), expect])
}

pub(crate) fn checks(h: &mut Harness) {
    let c = h.ctx;
    h.check("quiet and fence", |_| {
        let sh = &c.shmem;
        let buf = c.zeros::<i32>(2)?;
        sh.p(&buf, 0, 1, c.right)?;
        sh.fence()?;
        sh.p(&buf, 1, 2, c.right)?;
        sh.quiet()?;
        sh.barrier_all()?;
        same("values", &buf.to_vec()?, &[1, 2])
    });
    for step in [
        Step::BarrierAll,
        Step::SyncAll,
        Step::BarrierAllOnStream,
        Step::SyncAllOnStream,
    ] {
        h.check(format!("{step:?} after p to all PEs"), |_| {
            check_step(c, None, step)
        });
    }
    for step in [
        Step::Barrier,
        Step::Sync,
        Step::BarrierOnStream,
        Step::SyncOnStream,
    ] {
        h.check(format!("{step:?} over the world team"), |_| {
            check_step(c, Some(&c.world), step)
        });
        h.check(format!("{step:?} over the node team"), |_| {
            check_step(c, Some(&c.shmem.team_node()), step)
        });
        h.check(format!("{step:?} over the even PEs"), |_| {
            let evens = c.evens()?;
            match &evens {
                Some(t) => check_step(c, Some(t), step),
                // Odd PEs still allocate, as the check's allocation is collective.
                None => c.zeros::<u32>(c.n).map(|_| ()),
            }
        });
    }
    h.check(
        "teams split, barrier-synced and dropped 6 times (a reused handle starts afresh)",
        |_| check_team_reuse(c),
    );
    h.check("threads: barriers over two teams at once", |_| {
        check_two_teams_at_once(c)
    });
    h.check("wait_until<int32>", |_| check_wait_until::<i32>(c, false));
    h.check("wait_until<int64>", |_| check_wait_until::<i64>(c, false));
    h.check("wait_until<uint32>", |_| check_wait_until::<u32>(c, false));
    h.check("wait_until<uint64>", |_| check_wait_until::<u64>(c, false));
    h.check("wait_until_on_stream<int32>", |_| {
        check_wait_until::<i32>(c, true)
    });
    h.check("wait_until_on_stream<uint64>", |_| {
        check_wait_until::<u64>(c, true)
    });
    h.check(
        "threads: wait_until ended by another thread's host copy",
        |_| check_wait_across_threads(c, false),
    );
    h.check(
        "threads: signal_wait_until ended by another thread's host copy",
        |_| check_wait_across_threads(c, true),
    );
}

/// One thread blocks in a host-side wait for a flag of this PE; another sets the flag with a
/// host copy 100 ms later. The wait must end: a wait that holds up the copy (the host
/// library's lock, or a shared stream) would never return, so after 20 s the process says so
/// and exits instead of hanging.
fn check_wait_across_threads(c: &Ctx, signal: bool) -> Result {
    let flag = c.zeros::<u64>(1)?;
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::scope(|scope| -> Result {
        scope.spawn(|| {
            let waited = if signal {
                c.shmem.signal_wait_until(&flag, 0, Cmp::Ge, 1).map(|_| ())
            } else {
                c.shmem.wait_until(&flag, 0, Cmp::Ge, 1u64)
            };
            let _ = done.send(waited.map_err(|e| e.to_string()));
        });
        let setter = scope.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            flag.copy_from_host(&[1])
        });
        match ended.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(waited) => waited?,
            Err(_) => {
                eprintln!(
                    "PE {}: the wait did not end within 20 s of another thread setting its flag",
                    c.me
                );
                println!("0 passed, 1 failed (a wait across threads never ended)");
                std::process::exit(1);
            }
        }
        setter.join().map_err(|_| "the setting thread panicked")??;
        Ok(())
    })?;
    c.shmem.barrier_all()?;
    Ok(())
}

/// The even and the odd PEs, split, synced three times and dropped, six times over: NVSHMEM
/// hands a dropped team's handle to the next split, and a barrier that took the old team's
/// rounds for the new one's would pass early. The last member of each team writes its value
/// 50 ms late, so a barrier that passed early leaves its slot stale on the others.
fn check_team_reuse(c: &Ctx) -> Result {
    let sh = &c.shmem;
    let buf = c.zeros::<u32>(c.n)?;
    for round in 0..6u32 {
        let team = &half(c)?;
        let members: Vec<usize> = (0..team.n_pes())
            .map(|k| team.world_pe(k))
            .collect::<nvshmem::Result<_>>()?;
        for step in 0..3u32 {
            let value = 1 + round * 10 + step + c.me as u32 * 1000;
            if Some(&c.me) == members.last() {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            for &pe in &members {
                sh.p(&buf, c.me, value, pe)?;
            }
            sh.barrier(team)?;
            let got = buf.to_vec()?;
            for &pe in &members {
                let want = 1 + round * 10 + step + pe as u32 * 1000;
                if got[pe] != want {
                    return Err(format!(
                        "split {round}, barrier {step}: PE {pe}'s slot holds {}, want {want}",
                        got[pe]
                    )
                    .into());
                }
            }
            sh.barrier(team)?;
        }
    }
    Ok(())
}

/// Two threads of every PE: one syncs the world team, the other the even (or odd) PEs, 20
/// times each, at once. Each team's syncs take their rounds in order; neither holds the other
/// up.
fn check_two_teams_at_once(c: &Ctx) -> Result {
    let team = &half(c)?;
    let sh = &c.shmem;
    let (world, half) = std::thread::scope(|s| {
        let world = s.spawn(|| (0..20).try_for_each(|_| sh.sync(&c.world)));
        let half = s.spawn(|| (0..20).try_for_each(|_| sh.barrier(team)));
        (world.join(), half.join())
    });
    world.map_err(|_| "the world team's thread panicked")??;
    half.map_err(|_| "the half team's thread panicked")??;
    Ok(())
}

/// This PE's half of the world, the even or the odd PEs (both split, collectively, on every
/// PE; dropping it is collective over the half).
fn half(c: &Ctx) -> Result<Team> {
    let evens = c.world.split_strided(0, 2, c.n.div_ceil(2))?;
    let odds = match c.n {
        1 => None,
        n => c.world.split_strided(1, 2, n / 2)?,
    };
    Ok(evens.or(odds).ok_or("a PE in neither half")?)
}
