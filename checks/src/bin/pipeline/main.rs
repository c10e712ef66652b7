//! A pipeline of one stage per PE passing micro-batches through channels, and the GPU checks
//! of `nvshmem::channel`.
//!
//! ```text
//! scripts/nvshmrun -np 4 target/release/pipeline
//! ```
//!
//! PE 0 feeds micro-batches of varying sizes into the first stage and drains the last. Every
//! stage is one persistent kernel (checks/kernels/pipeline_stage.cu, a user's kernel that
//! includes `nvshmem_rs/channel.cuh`) that pops a micro-batch, transforms it and pushes it to
//! the next PE's stage, with no host in between; the result is checked against the same
//! transforms on the CPU, for the block, warp and thread functions and the in-place (peek)
//! pop. The host API is checked around it: messages of every size up to a multi-block one,
//! flow control with a consumer that starts late, `try_recv`, CUDA graph replay, the errors,
//! the bound on every wait (a receive with no sender, a send into a full channel, a drop with
//! a receive still waiting) and two threads at each end at once, on streams of their own.
//! Prints `N passed, M failed` on PE 0 and exits non-zero if anything failed.

mod harness;
mod host_api;
mod stages;
mod threads;
mod timeouts;

use clap::Parser;
use std::time::Duration;

use harness::Checks;
use host_api::{errors, graph_replay, ring_messages, try_recv};
use stages::pipeline;
use threads::concurrent_ends;
use timeouts::{drop_while_receiving, recv_without_sender, send_into_full_channel};

/// The command line: no options of its own, only `--help` and `--version`.
#[derive(Parser)]
#[command(
    version,
    about = "A pipeline of one stage per PE passing micro-batches through channels, and the GPU \
             checks of nvshmem::channel",
    long_about = "A pipeline of one stage per PE passing micro-batches through channels, and \
                  the GPU checks of nvshmem::channel: messages of every size, flow control, \
                  try_recv, CUDA graph replay, the errors, the bound on every wait and two \
                  threads at each end. Run one PE per GPU:\n\n    \
                  scripts/nvshmrun -np 4 target/release/pipeline\n\n\
                  Prints `N passed, M failed` on PE 0 and exits non-zero if anything failed."
)]
struct Cli {}

fn main() {
    // Before NVSHMEM starts, so that --help needs no GPU.
    Cli::parse();
    let shmem = nvshmem_checks::start("pipeline");
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    if me == 0 {
        println!(
            "pipeline: {n} PEs; {}",
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    let mut c = Checks {
        shmem: shmem.clone(),
        names: Vec::new(),
        failed: Vec::new(),
    };
    let none = Duration::ZERO;
    c.run("one message of every small length, and empty ones", |s| {
        ring_messages(
            s,
            1,
            64,
            4,
            &(0..=64).chain([0, 1, 63]).collect::<Vec<_>>(),
            none,
        )
    });
    c.run("messages up to 4 MiB (multi-block)", |s| {
        ring_messages(
            s,
            2,
            1 << 20,
            2,
            &[1 << 20, (1 << 20) - 5, 65_537, 3, 1 << 20],
            none,
        )
    });
    c.run(
        "depth 2, 24 messages, consumer 50 ms late (flow control)",
        |s| {
            ring_messages(
                s,
                3,
                1000,
                2,
                &(0..24).map(|k| 1000 - k * 17).collect::<Vec<_>>(),
                Duration::from_millis(50),
            )
        },
    );
    c.run("multi-block messages with the consumer late", |s| {
        ring_messages(s, 4, 300_000, 2, &[300_000; 6], Duration::from_millis(50))
    });
    c.run("try_recv", |s| try_recv(s, 5));
    c.run("graph replay", |s| graph_replay(s, 6));
    c.run("errors", errors);
    c.run(
        "a receive with no sender gives up within the bound",
        recv_without_sender,
    );
    c.run(
        "a drop while a receive waits for no sender",
        drop_while_receiving,
    );
    c.run(
        "a send into a full channel gives up within the bound",
        |s| send_into_full_channel(s, 7),
    );
    c.run("two threads at each end, on streams of their own", |s| {
        concurrent_ends(s, 8)
    });
    let modes = [
        (0, "block functions", None),
        (1, "warp functions", None),
        (2, "thread functions", None),
        (3, "block functions, peek", None),
        (
            0,
            "block functions, LL slots rewritten at every push",
            Some(1),
        ),
        (
            1,
            "warp functions, LL slots rewritten every 2nd visit",
            Some(2),
        ),
    ];
    for (i, (mode, name, clean_every)) in modes.into_iter().enumerate() {
        c.run(&format!("pipeline of {n} stages, {name}"), |s| {
            let t = pipeline(s, 100 + i as u64, mode, 64, clean_every)?;
            if s.my_pe() == 0 {
                println!(
                    "  pipeline ({name}): 64 micro-batches through {n} stages in {:.2} ms",
                    t.as_secs_f64() * 1e3
                );
            }
            Ok(())
        });
    }
    match c.finish() {
        Ok((passed, failed)) => {
            if me == 0 {
                println!("{passed} passed, {failed} failed");
            }
            std::process::exit((failed > 0) as i32);
        }
        Err(e) => {
            eprintln!("pipeline: PE {me}: {e}");
            std::process::exit(2);
        }
    }
}
