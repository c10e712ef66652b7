//! Roles and the threads of a run: which thread does what, what they share, and how each
//! one starts.

use crate::alloc::allocator;
use crate::args::skipped;
use crate::channels::{receiver, sender};
use crate::collectives::{collectives, Turns};
use crate::flags::{ping, pong};
use crate::host_rma::mixer;
use crate::outcome::{fail, panic_text, Outcome};
use crate::tally::{Kind, Tally};
use crate::tp::tp_layers;
use crate::watchdog::Board;
use crate::world::World;
use nvshmem::{CudaStream, Nvshmem};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Copy)]
pub(crate) enum Role {
    Alloc,
    Coll(usize),
    Send,
    Recv,
    Ping,
    Pong,
    Mix(usize),
    Tp,
}

impl Role {
    pub(crate) fn name(self) -> String {
        match self {
            Role::Alloc => "alloc".into(),
            Role::Coll(j) => format!("coll-{j}"),
            Role::Send => "send".into(),
            Role::Recv => "recv".into(),
            Role::Ping => "ping".into(),
            Role::Pong => "pong".into(),
            Role::Mix(j) => format!("mix-{j}"),
            Role::Tp => "tp".into(),
        }
    }
}

/// The least number of threads: one per role.
pub(crate) const MIN_THREADS: usize = 9;

/// The roles of `threads` threads, and how many collective threads and mixers they hold.
pub(crate) struct Plan {
    pub(crate) roles: Vec<Role>,
    pub(crate) colls: usize,
    pub(crate) mixers: usize,
}

impl Plan {
    pub(crate) fn new(threads: usize) -> Self {
        let mut roles = vec![
            Role::Alloc,
            Role::Coll(0),
            Role::Coll(1),
            Role::Send,
            Role::Recv,
            Role::Ping,
            Role::Pong,
            Role::Mix(0),
            Role::Tp,
        ];
        let (mut colls, mut mixers) = (2, 1);
        while roles.len() < threads {
            if roles.len().is_multiple_of(2) {
                roles.push(Role::Mix(mixers));
                mixers += 1;
            } else {
                roles.push(Role::Coll(colls));
                colls += 1;
            }
        }
        Plan {
            roles,
            colls,
            mixers,
        }
    }
}

/// What the threads of one run share.
pub(crate) struct Env<'a> {
    pub(crate) shmem: &'a Nvshmem,
    pub(crate) world: &'a World,
    pub(crate) plan: &'a Plan,
    pub(crate) board: &'a Board,
    pub(crate) tally: &'a Tally,
    pub(crate) turns: Turns,
    /// The run's seed, the same on every PE.
    pub(crate) seed: u64,
    pub(crate) deadline: Instant,
    pub(crate) me: usize,
    pub(crate) n: usize,
}

impl Env<'_> {
    pub(crate) fn next(&self) -> usize {
        (self.me + 1) % self.n
    }

    pub(crate) fn prev(&self) -> usize {
        (self.me + self.n - 1) % self.n
    }
}

/// One thread of a run.
pub(crate) struct Worker<'a> {
    pub(crate) env: &'a Env<'a>,
    row: usize,
    name: String,
}

impl Worker<'_> {
    pub(crate) fn doing(&self, what: String) {
        self.env.board.set(self.row, what);
    }

    pub(crate) fn record(&self, kind: Kind, outcome: Outcome) -> bool {
        self.env
            .tally
            .record(self.env.me, &self.name, kind, outcome)
    }

    pub(crate) fn time_up(&self) -> bool {
        Instant::now() >= self.env.deadline
    }

    /// A stream of this thread's own, or `None` (counted as a failure).
    pub(crate) fn new_stream(&self) -> Option<Arc<CudaStream>> {
        match self.env.shmem.new_stream() {
            Ok(s) => Some(s),
            Err(e) => {
                self.record(Kind::Setup, Err(e.into()));
                None
            }
        }
    }
}

pub(crate) fn run_role(env: &Env, row: usize, role: Role) {
    let w = Worker {
        env,
        row,
        name: role.name(),
    };
    env.board.claim(row, &w.name);
    if skipped(role) {
        env.board.idle(row);
        return;
    }
    let ran = catch_unwind(AssertUnwindSafe(|| match role {
        Role::Alloc => allocator(&w),
        Role::Coll(j) => collectives(&w, j),
        Role::Send => sender(&w),
        Role::Recv => receiver(&w),
        Role::Ping => ping(&w),
        Role::Pong => pong(&w),
        Role::Mix(j) => mixer(&w, j),
        Role::Tp => tp_layers(&w),
    }));
    if let Err(panic) = ran {
        w.record(Kind::Panic, fail(panic_text(panic.as_ref())));
        // The other collective threads of this PE must not wait for its turn.
        env.turns.stop();
    }
    env.board.idle(row);
}
