//! Checks of whole Collectives: a new one after a dropped one, cooperative launches, call
//! counters around the points where tags wrap, and the timeout when a PE skips a call.

use nvshmem::{
    bf16, AllGatherAlgo, AllReduceAlgo, Collectives, CollectivesConfig, Error, ReduceOp,
};
use std::time::{Duration, Instant};

use crate::all_gather::all_gather_case;
use crate::all_reduce::{all_reduce_case, INT_ALGOS};
use crate::graph_replay::graph_replay;
use crate::harness::{sync, Checker};

/// A new Collectives after a dropped one takes no low-latency line of the old one.
pub(crate) fn fresh_workspace_checks(c: &mut Checker) {
    // Low-latency readers take a line whose tag matches the call: a new workspace must not
    // hold lines of an earlier one (the heap hands the freed space back out).
    c.check(
        "new Collectives after a dropped one: low-latency, fresh data",
        |s, seed| {
            for round in 0..3 {
                let fresh = Collectives::new(s)?;
                // Two calls: both parities of the staging.
                for _ in 0..2 {
                    all_reduce_case::<i32>(
                        s,
                        &fresh,
                        seed + round,
                        ReduceOp::Sum,
                        AllReduceAlgo::LowLatency,
                        4099,
                        false,
                    )?;
                }
            }
            Ok(())
        },
    );
}

/// Cooperative launches, call counters around tag wrap, and timeouts.
pub(crate) fn checks(c: &mut Checker) {
    c.check(
        "cooperative launches: every algorithm, eager and in a graph",
        |s, seed| {
            let mut config = CollectivesConfig::for_pes(s.n_pes());
            config.cooperative_launch = true;
            let coop = Collectives::with_config(s, config)?;
            for algo in AllReduceAlgo::ALL {
                all_reduce_case::<f32>(s, &coop, seed, ReduceOp::Sum, algo, 20_011, false)?;
            }
            for algo in AllGatherAlgo::ALL {
                all_gather_case::<bf16>(s, &coop, seed, algo, 5_003)?;
            }
            graph_replay::<f32>(s, &coop, seed, AllReduceAlgo::Auto, 20_011)
        },
    );
    // Flag values and low-latency tags derive from the call counter: calls around the points
    // where 32-bit tags wrapped (and a counter's low 32 bits are 0) still give right results.
    for start in [(1u64 << 32) - 3, (1 << 33) - 2] {
        c.check(
            &format!("epoch from {start:#x}: every algorithm, 6 calls each"),
            |s, seed| {
                let fresh = Collectives::new(s)?;
                fresh.set_epoch_for_test(start)?;
                for k in 0..6 {
                    for algo in INT_ALGOS {
                        all_reduce_case::<i32>(
                            s,
                            &fresh,
                            seed + k,
                            ReduceOp::Sum,
                            algo,
                            20_011,
                            false,
                        )?;
                    }
                    all_reduce_case::<f32>(
                        s,
                        &fresh,
                        seed + k,
                        ReduceOp::Max,
                        AllReduceAlgo::Sentinel,
                        4099,
                        k % 2 == 1,
                    )?;
                    all_reduce_case::<bf16>(
                        s,
                        &fresh,
                        seed + k,
                        ReduceOp::Sum,
                        AllReduceAlgo::SentinelTwoShot,
                        30_001,
                        false,
                    )?;
                    all_gather_case::<i32>(s, &fresh, seed + k, AllGatherAlgo::LowLatency, 1000)?;
                    all_gather_case::<i32>(s, &fresh, seed + k, AllGatherAlgo::Bandwidth, 5000)?;
                }
                Ok(())
            },
        );
    }
    // A low-latency line is zeroed once taken. Tags repeat every 2^32 calls: a call exactly
    // 2^32 calls after another of the same size would find that call's lines, with its tag,
    // where a line is not zeroed. PE 0 reads while PE 1 holds back its second call.
    c.check(
        "low-latency: a call 2^32 calls on takes no line of the first",
        |s, seed| {
            let fresh = Collectives::new(s)?;
            let start = 5u64 << 32;
            for (k, epoch) in [start, start + (1 << 32)].into_iter().enumerate() {
                // Calls at epochs epoch + 1 and epoch + 2: the same tags and parities both times.
                fresh.set_epoch_for_test(epoch)?;
                if s.my_pe() == 1 && k == 1 {
                    std::thread::sleep(Duration::from_millis(200));
                }
                let seed = seed + k as u64;
                all_reduce_case::<i32>(
                    s,
                    &fresh,
                    seed,
                    ReduceOp::Sum,
                    AllReduceAlgo::LowLatency,
                    60_000,
                    false,
                )?;
                all_reduce_case::<i32>(
                    s,
                    &fresh,
                    seed,
                    ReduceOp::Sum,
                    AllReduceAlgo::LowLatencyTwoShot,
                    60_000,
                    false,
                )?;
            }
            Ok(())
        },
    );
    // A PE that skips a call: the others give up after the configured bound, say which PE
    // they waited for, and refuse every later call.
    if c.shmem.n_pes() >= 2 {
        for algo in [
            AllReduceAlgo::LowLatency,
            AllReduceAlgo::Sentinel,
            AllReduceAlgo::OneShot,
            AllReduceAlgo::Bandwidth,
        ] {
            c.check(&format!("timeout: PE 1 skips a {algo:?} call"), |s, _| {
                let mut config = CollectivesConfig::for_pes(s.n_pes());
                config.timeout = Some(Duration::from_millis(500));
                // The kernels' own bound (the per-call agreement would catch the skip first).
                config.check_calls = false;
                let bounded = Collectives::with_config(s, config)?;
                let n = if algo == AllReduceAlgo::Bandwidth {
                    1 << 20
                } else {
                    4096
                };
                let x = s.calloc::<f32>(n)?;
                let y = s.malloc::<f32>(n)?;
                s.barrier_all()?;
                let outcome = if s.my_pe() == 1 {
                    // Skips the call: the call's own checks pass, nothing runs.
                    bounded.check()
                } else {
                    let began = Instant::now();
                    bounded.all_reduce(&y, &x, ReduceOp::Sum, algo, s.stream())?;
                    sync(s)?;
                    let took = began.elapsed();
                    match (
                        bounded.check(),
                        bounded.all_reduce(&y, &x, ReduceOp::Sum, algo, s.stream()),
                    ) {
                        (Err(Error::Timeout { waited_for: 1, .. }), Err(Error::Timeout { .. }))
                            if took < Duration::from_secs(10) =>
                        {
                            Ok(())
                        }
                        (first, later) => Err(Error::InvalidArgument(format!(
                            "after {took:?}: check gave {first:?}, the next call {later:?}; \
                             expected a timeout waiting for PE 1, then the same"
                        ))),
                    }
                };
                // Every PE drops its Collectives (collective frees) and goes on.
                drop(bounded);
                outcome
            });
        }
    }
}
