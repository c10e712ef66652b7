//! The tally: operations passed and failed by kind, and PE 0's report of them.

use crate::outcome::{Fail, Outcome};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a counted operation was.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    PutGet,
    PG,
    Atomics,
    FlagRemote,
    FlagLocal,
    Alloc,
    AllocPeer,
    Free,
    Barrier,
    Built,
    Pool,
    AllReduce,
    AllGather,
    ReduceScatter,
    Reduce,
    Broadcast,
    AllToAll,
    AllToAllV,
    Vote,
    Tp,
    Send,
    Recv,
    Setup,
    Memory,
    Panic,
}

pub(crate) const KINDS: usize = Kind::Panic as usize + 1;

impl Kind {
    const ALL: [Kind; KINDS] = [
        Kind::PutGet,
        Kind::PG,
        Kind::Atomics,
        Kind::FlagRemote,
        Kind::FlagLocal,
        Kind::Alloc,
        Kind::AllocPeer,
        Kind::Free,
        Kind::Barrier,
        Kind::Built,
        Kind::Pool,
        Kind::AllReduce,
        Kind::AllGather,
        Kind::ReduceScatter,
        Kind::Reduce,
        Kind::Broadcast,
        Kind::AllToAll,
        Kind::AllToAllV,
        Kind::Vote,
        Kind::Tp,
        Kind::Send,
        Kind::Recv,
        Kind::Setup,
        Kind::Memory,
        Kind::Panic,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::PutGet => "put + get",
            Kind::PG => "p + g",
            Kind::Atomics => "atomics",
            Kind::FlagRemote => "flag, another PE",
            Kind::FlagLocal => "flag, another thread",
            Kind::Alloc => "symmetric allocation",
            Kind::AllocPeer => "allocation, peer's copy",
            Kind::Free => "symmetric free",
            Kind::Barrier => "barrier",
            Kind::Built => "Channel/PagePool built",
            Kind::Pool => "page-pool round",
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Reduce => "reduce",
            Kind::Broadcast => "broadcast",
            Kind::AllToAll => "all_to_all",
            Kind::AllToAllV => "all_to_all_v",
            Kind::Vote => "stop vote (all_reduce)",
            Kind::Tp => "tensor-parallel forward",
            Kind::Send => "channel send",
            Kind::Recv => "channel recv",
            Kind::Setup => "set-up and tear-down",
            Kind::Memory => "memory kept",
            Kind::Panic => "thread panicked",
        }
    }
}

/// Operations passed and failed on this PE, by kind.
pub(crate) struct Tally {
    passed: [AtomicU64; KINDS],
    failed: [AtomicU64; KINDS],
}

impl Tally {
    pub(crate) fn new() -> Self {
        Tally {
            passed: std::array::from_fn(|_| AtomicU64::new(0)),
            failed: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Count `outcome` under `kind`; print a failure with who had it. Whether it passed.
    pub(crate) fn record(&self, me: usize, who: &str, kind: Kind, outcome: Outcome) -> bool {
        let counter = match &outcome {
            Ok(()) => &self.passed,
            Err(Fail(why)) => {
                eprintln!("[PE {me}] FAIL {who}, {}: {why}", kind.name());
                &self.failed
            }
        };
        counter[kind as usize].fetch_add(1, Ordering::Relaxed);
        outcome.is_ok()
    }

    /// Passed and failed of every kind, in kind order: `[passed0, failed0, passed1, ...]`.
    pub(crate) fn words(&self) -> Vec<u64> {
        (0..KINDS)
            .flat_map(|k| {
                [
                    self.passed[k].load(Ordering::Relaxed),
                    self.failed[k].load(Ordering::Relaxed),
                ]
            })
            .collect()
    }

    pub(crate) fn sums(&self) -> (u64, u64) {
        let words = self.words();
        let passed = words.iter().step_by(2).sum();
        let failed = words.iter().skip(1).step_by(2).sum();
        (passed, failed)
    }
}

/// PE 0's report: the operations of each kind over all PEs, and the final line.
pub(crate) fn report(totals: &[u64]) -> u64 {
    println!("stress_check: operations over every PE (warm-up included)");
    let mut sums = (0, 0);
    for (kind, counts) in Kind::ALL.iter().zip(totals.chunks(2)) {
        let (passed, failed) = (counts[0], counts[1]);
        if passed + failed > 0 {
            println!(
                "  {:<26} {:>9} ok {:>6} failed",
                kind.name(),
                passed,
                failed
            );
        }
        sums = (sums.0 + passed, sums.1 + failed);
    }
    println!("{} passed, {} failed", sums.0, sums.1);
    sums.1
}
