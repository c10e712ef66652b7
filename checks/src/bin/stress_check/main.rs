//! A threaded stress check: the promise that every type may be used from any thread
//! (src/lib.rs, "Threads") and that nothing deadlocks or passes wrong data on with `Ok`
//! (README, "When something goes wrong"), tested by doing everything at once.
//!
//! ```text
//! scripts/nvshmrun -np 4 target/release/stress_check [--seconds 20] [--threads 9] [--seed N] [--max-blocks 32|all]
//! ```
//!
//! To narrow a failure down, `--skip send,recv` (any of alloc, coll, send, recv, ping, pong, mix, tp)
//! leaves those threads idle, `--cooperative true` launches the collectives cooperatively
//! and `--programmatic false` without programmatic stream serialization.
//!
//! The shared collectives launch at most `--max-blocks` blocks a call (32; `all`: one per
//! SM), as the docs ask of collectives beside channels.
//!
//! Every PE runs `--threads` threads (9, the default, is one per role; more add mixers and
//! collective threads in turn) sharing one [`Nvshmem`] for `--seconds`, after a warm-up run
//! of a fifth of that (1 to 5 s). Each thread has one role:
//!
//! - **alloc**: symmetric allocations (`malloc`, `calloc`, `malloc_aligned`, 0 to 1 MiB) and
//!   frees, oldest first; every buffer is written, read back from the next PE after a barrier
//!   and checked again before its free. Now and then it builds a `Channel` or a `PagePool`,
//!   uses it once and drops it. Between its collective steps it does page-pool rounds.
//! - **coll-0, coll-1** (and more): one shared [`Collectives`], called in turns (call `k` is
//!   made by collective thread `k % threads`), coll-0 on the runtime's stream and the others
//!   on streams of their own: all-reduce (i32, and f32 holding integers, in place or not),
//!   all-gather, reduce-scatter, reduce, broadcast, all-to-all and all-to-all-v of up to 16 KiB
//!   per PE, every element checked, bit for bit.
//! - **send, recv**: messages of random lengths around the ring of channels (PE `i` to
//!   `i + 1`): the sender on its PE's outgoing channel, the receiver on its incoming one.
//! - **ping, pong**: flags. `ping` sets a word on the next PE (by `p`, `put`, `atomic_set`,
//!   `signal_op`, or `put_signal` with a payload) and waits (`wait_until`, `signal_wait_until`)
//!   for that PE's `pong` to answer the same way; then the same with its own PE's `pong`
//!   through `copy_from_host`.
//! - **mix** (and more): puts and gets (blocking and `_nbi`), `p`/`g` and every atomic into the
//!   thread's own slots on a random PE, read back and checked; and page-pool rounds: pages of a
//!   random PE allocated, written (this PE's own in place, the others by a scatter), checked
//!   to be allocated, gathered back, checked and freed.
//! - **tp**: small tensor-parallel layers over a `Collectives` of their own (capped like the
//!   shared one): a row-parallel layer with a replicated output, one with a sequence-parallel
//!   output and a sequence-parallel column layer, of 1 to 16 tokens in the sequential
//!   schedule and of 512 per PE in the fused exchange. Inputs and weights are -1, 0 and 1, so
//!   every output is exact in bf16 and checked bit for bit; a vote every 8th call ends them.
//!
//! # How the PEs agree without talking
//! Whatever is collective has one thread per PE driving it, in a sequence every PE draws from
//! the same seed: the allocator's allocations, frees and constructors; the calls of the shared
//! `Collectives` (the turns make their order the same on every PE, whatever the threads'
//! timing); the tp thread's layer calls. Each protocol ends the same way everywhere: PE 0's
//! clock ends the allocator's rounds (a word it puts on every PE before the round's barrier),
//! the collective threads and the tp thread vote every 8th call (an all-reduce of "my time is
//! up"), and senders mark their last message and
//! last flag, which their partners answer before they stop. Everything shared is built before
//! the threads start and dropped after they end, in one order on every PE.
//!
//! # Why some threads bypass the host library's lock
//! An agreement (allocation, free, barrier) holds the host library's lock while it waits for
//! the other PEs, and a PE's free waits for its whole GPU. So a thread whose GPU work a peer
//! waits for (the collective, channel and tp threads) must never wait for the lock: that would
//! close a cycle through the peer's free. They move their data with cudarc's stream-ordered
//! copies on their own streams; every other thread uses the crate's host calls. For the same
//! reason the collectives do not check their calls (`check_calls`: an agreement per call).
//!
//! # Failures and hangs
//! Every checked operation counts once, as passed or failed, under its kind; a failure is
//! printed with its PE, thread and what was wrong. A watchdog takes an operation that lasts
//! longer than a minute for a hang: it prints what every thread of the PE is doing and exits
//! with status 1 (our collectives give up after 30 s, `NVSHMEM_RS_TIMEOUT` bounds the host's
//! waits). At the end, with everything dropped, the free device memory and the symmetric heap
//! in use must be what they were after the warm-up, as `coll_check --soak` compares them.
//! PE 0 prints the operations of each kind over all PEs and `N passed, M failed`; a PE with a
//! failure exits with status 1.
//!
//! [`Collectives`]: nvshmem::Collectives

mod alloc;
mod args;
mod channels;
mod coll_calls;
mod collectives;
mod common;
mod flags;
mod host_rma;
mod outcome;
mod page_pool;
mod roles;
mod run;
mod stream_copy;
mod tally;
mod tp;
mod watchdog;
mod world;

use args::Args;
use clap::Parser;
use common::hash;
use outcome::fail;
use roles::Plan;
use run::Main;
use std::sync::Arc;
use tally::{report, Kind, Tally, KINDS};
use watchdog::{start_watchdog, Board};

fn main() {
    let config = Args::parse().into_config();
    let shmem = nvshmem_checks::start("stress_check");
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let plan = Plan::new(config.threads);
    let warm_up = (config.seconds / 5.0).clamp(1.0, 5.0);
    if me == 0 {
        println!(
            "stress_check: {n} PEs, {} threads each, {} s after {warm_up} s of warm-up, seed {}; {}",
            plan.roles.len(),
            config.seconds,
            config.seed,
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    let board = Arc::new(Board::new(plan.roles.len() + 1));
    let tally = Arc::new(Tally::new());
    start_watchdog(board.clone(), tally.clone(), me);
    let main = Main {
        shmem: &shmem,
        board: &board,
        tally: &tally,
        plan: &plan,
        row: plan.roles.len(),
    };
    board.claim(main.row, "main");
    let totals = shmem.calloc::<u64>(2 * KINDS).unwrap_or_else(|e| {
        eprintln!("stress_check: PE {me}: {e}");
        std::process::exit(2)
    });
    // The first run loads every kernel and grows the driver's pools: memory is compared
    // from its end to the end of the second.
    main.run(hash(config.seed, &[0]), warm_up);
    let start = main.memory();
    main.run(hash(config.seed, &[1]), config.seconds);
    let end = main.memory();
    let kept = matches!((&start.0, &end.0), (Ok(a), Ok(b)) if a == b) && start.1 == end.1;
    println!(
        "PE {me}: free device memory {:?} -> {:?} bytes, symmetric heap in use {} -> {} bytes{}",
        start.0.as_ref().ok(),
        end.0.as_ref().ok(),
        start.1,
        end.1,
        if kept { "" } else { " (CHANGED)" }
    );
    let memory = if kept {
        Ok(())
    } else {
        fail("the memory in use changed over the run".into())
    };
    main.record(Kind::Memory, memory);
    let status = match main.sum_over_pes(&totals) {
        Ok(Some(totals)) => u64::from(report(&totals) > 0),
        Ok(None) => u64::from(tally.sums().1 > 0),
        Err(e) => {
            eprintln!("stress_check: PE {me}: summing the counts: {e}");
            2
        }
    };
    board.idle(main.row);
    drop(totals);
    drop(shmem);
    std::process::exit(status as i32);
}
