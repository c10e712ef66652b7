//! A run of every role, driven by the main thread, and the measures around it.

use crate::collectives::Turns;
use crate::common::OP_LIMIT;
use crate::outcome::{fail, Fail, Outcome};
use crate::roles::{run_role, Env, Plan};
use crate::tally::{Kind, Tally};
use crate::watchdog::Board;
use crate::world::World;
use nvshmem::{Nvshmem, SymmetricBuffer};
use std::time::{Duration, Instant};

/// Free device memory on this PE's GPU.
fn free_memory(shmem: &Nvshmem) -> Outcome<usize> {
    shmem.context().bind_to_thread()?;
    Ok(nvshmem::cudarc::driver::result::mem_get_info()?.0)
}

/// What the main thread needs to count and report.
pub(crate) struct Main<'a> {
    pub(crate) shmem: &'a Nvshmem,
    pub(crate) board: &'a Board,
    pub(crate) tally: &'a Tally,
    pub(crate) plan: &'a Plan,
    pub(crate) row: usize,
}

impl Main<'_> {
    fn doing(&self, what: String) {
        self.board.set(self.row, what);
    }

    pub(crate) fn record(&self, kind: Kind, outcome: Outcome) -> bool {
        self.tally.record(self.shmem.my_pe(), "main", kind, outcome)
    }

    /// One run of every role for `seconds`: build, run the threads, check and tear down.
    pub(crate) fn run(&self, seed: u64, seconds: f64) {
        let shmem = self.shmem;
        self.doing(format!("building the objects of a {seconds:.0} s run"));
        let world = match World::build(shmem, self.plan, seed) {
            Ok(world) => world,
            Err(e) => {
                self.record(Kind::Setup, Err(e.into()));
                return;
            }
        };
        // Every PE's flags and slots are zeroed before any thread writes into a peer's.
        if self.record(Kind::Setup, shmem.barrier_all().map_err(Fail::from)) {
            let run = Duration::from_secs_f64(seconds);
            let env = Env {
                shmem,
                world: &world,
                plan: self.plan,
                board: self.board,
                tally: self.tally,
                turns: Turns::new(),
                seed,
                deadline: Instant::now() + run,
                me: shmem.my_pe(),
                n: shmem.n_pes(),
            };
            // The threads are watched one by one; this bounds a run that never ends.
            self.board
                .set_for(self.row, "waiting for the threads".into(), run + OP_LIMIT);
            std::thread::scope(|s| {
                for (row, &role) in self.plan.roles.iter().enumerate() {
                    let env = &env;
                    s.spawn(move || run_role(env, row, role));
                }
            });
            self.doing("checking that no page is left allocated".into());
            let empty = shmem.barrier_all().map_err(Fail::from).and_then(|()| {
                match world.pool.in_use(shmem.my_pe())? {
                    0 => Ok(()),
                    left => fail(format!("{left} pages of this PE still allocated")),
                }
            });
            self.record(Kind::Pool, empty);
        }
        self.doing("tearing the objects down".into());
        self.record(Kind::Setup, world.tear_down().map_err(Fail::from));
    }

    /// Free device memory and symmetric heap in use, once every PE is done.
    pub(crate) fn memory(&self) -> (Outcome<usize>, usize) {
        self.doing("measuring memory".into());
        if let Err(e) = self.shmem.barrier_all() {
            self.record(Kind::Setup, Err(e.into()));
        }
        (free_memory(self.shmem), self.shmem.heap_in_use())
    }

    /// Every PE's counts summed on PE 0 (`None` on the others).
    pub(crate) fn sum_over_pes(
        &self,
        totals: &SymmetricBuffer<u64>,
    ) -> nvshmem::Result<Option<Vec<u64>>> {
        self.doing("summing the counts over PEs".into());
        for (i, v) in self.tally.words().into_iter().enumerate() {
            if v > 0 {
                self.shmem.atomic_add(totals, i, v, 0)?;
            }
        }
        self.shmem.barrier_all()?;
        match self.shmem.my_pe() {
            0 => Ok(Some(totals.to_vec()?)),
            _ => Ok(None),
        }
    }
}
