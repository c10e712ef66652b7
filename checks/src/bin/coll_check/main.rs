//! GPU checks of our device collectives (kernels/collectives.cu), on random data against a
//! CPU reference computed exactly as the kernels do (PE order, f32 accumulation), so results
//! must match bit for bit on every PE.
//!
//! ```text
//! scripts/nvshmrun -np 4 target/release/coll_check
//! ```
//! Prints `N passed, M failed` on PE 0 and exits non-zero if anything failed.
//!
//! With `--soak SECONDS`, runs random calls instead until the time is up: every collective,
//! algorithm, type, size, in and out of place, on the runtime's stream, alternating streams
//! and graph replays, each checked; the PEs draw the same arguments from one seed, so they
//! agree without talking. Prints the operations done, the failures (0), and this PE's free
//! device memory and symmetric heap in use at the start and the end (which must match).
//!
//! One module per collective or group of checks, run in the order `main` calls them;
//! `harness` runs and tallies them, `reference` makes their inputs and the CPU results.

mod all_gather;
mod all_reduce;
mod all_to_all_v;
mod arg_errors;
mod back_to_back;
mod compressed;
mod domains;
mod grad_sync;
mod graph_replay;
mod group;
mod harness;
mod lifecycle;
mod movement;
mod reduce;
mod reduce_scatter;
mod reference;
mod soak;
mod teams;

use clap::Parser;
use nvshmem::{AllReduceAlgo, Collectives, DataType};
use std::time::Duration;

use all_reduce::INT_ALGOS;
use harness::Checker;

/// GPU checks of the device collectives against a CPU reference, bit for bit on every PE.
///
/// Run under the launcher (`scripts/nvshmrun -np 4 target/release/coll_check`); PE 0 prints
/// `N passed, M failed` and the exit status is 1 if anything failed.
#[derive(Parser)]
#[command(name = "coll_check")]
struct Args {
    /// Run random checked calls for SECONDS instead of the fixed checks (`make soak`).
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    soak: Option<f64>,
    /// Run only the checks whose name holds TEXT (for example `compressed`).
    #[arg(long, value_name = "TEXT")]
    only: Option<String>,
}

/// A soak's length: a finite number of seconds, zero or more.
fn seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(format!("`{text}` is not a number of seconds (0 or more)")),
    }
}

fn main() {
    let args = Args::parse();
    // `INT_ALGOS` is the table's list, not a second one kept by hand.
    let takes_i32: Vec<AllReduceAlgo> = AllReduceAlgo::ALL
        .into_iter()
        .filter(|&a| a != AllReduceAlgo::Auto && a.takes(DataType::I32))
        .collect();
    assert_eq!(INT_ALGOS.to_vec(), takes_i32, "INT_ALGOS is out of date");
    let shmem = nvshmem_checks::start("coll_check");
    let coll = match Collectives::new(&shmem) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("coll_check: PE {}: {e}", shmem.my_pe());
            std::process::exit(2);
        }
    };
    if shmem.my_pe() == 0 {
        println!(
            "coll_check: {} PEs; {}",
            shmem.n_pes(),
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    if let Some(seconds) = args.soak {
        let ok = soak::soak(&shmem, &coll, Duration::from_secs_f64(seconds));
        drop(coll);
        drop(shmem);
        std::process::exit(if ok { 0 } else { 1 });
    }
    let mut c = Checker {
        shmem: shmem.clone(),
        passed: 0,
        failed: 0,
        seq: 0,
        only: args.only,
    };
    // Each check's seed is its place in the run: a new check goes after the others.
    all_reduce::checks(&mut c, &coll);
    all_gather::checks(&mut c, &coll);
    reduce_scatter::checks(&mut c, &coll);
    reduce::checks(&mut c, &coll);
    movement::checks(&mut c, &coll);
    all_to_all_v::checks(&mut c, &coll);
    all_gather::repeated_checks(&mut c, &coll);
    lifecycle::fresh_workspace_checks(&mut c);
    back_to_back::checks(&mut c, &coll);
    all_reduce::sentinel_checks(&mut c, &coll);
    graph_replay::checks(&mut c, &coll);
    back_to_back::two_stream_checks(&mut c, &coll);
    lifecycle::checks(&mut c);
    arg_errors::checks(&mut c, &coll);
    compressed::checks(&mut c, &coll);
    group::checks(&mut c, &coll);
    grad_sync::checks(&mut c, &coll);
    teams::checks(&mut c);
    domains::checks(&mut c, &coll);
    if shmem.my_pe() == 0 {
        println!("{} passed, {} failed", c.passed, c.failed);
    }
    drop(coll);
    let failed = c.failed;
    drop(c);
    drop(shmem);
    std::process::exit(if failed > 0 { 1 } else { 0 });
}
