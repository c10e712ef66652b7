//! GPU check of the host API: every public host function, run on every PE with random data and
//! compared with a reference computed on the CPU.
//!
//! ```text
//! make check
//! mpiexec -np 4 target/release/gpu_check [--verbose]
//! ```
//!
//! Every PE runs the same named checks in the same order. A check's random input on PE `p` comes
//! from a generator seeded with the check's name and `p`, so each PE can rebuild what every
//! other PE sent and compute the expected result itself. A check fails on a PE when it returns
//! an error, finds a wrong value or panics; the PE says which and carries on. At the end the
//! failures are summed over PEs (with this crate's all-reduce) and PE 0 prints
//! `N passed, M failed`, where a check counts as failed if it failed on any PE. The exit status
//! is 1 when anything failed.
//!
//! One module per group of checks; `harness` runs them, `data` makes their inputs.

mod atomic;
mod collectives;
mod data;
mod errors;
mod harness;
mod reliability;
mod rma;
mod runtime;
mod signal;
mod sync;

use clap::Parser;
use harness::{Ctx, Harness};
use nvshmem::{Error, Nvshmem};

/// What a check returns: any error (from NVSHMEM, CUDA or a wrong value) is a failure.
type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The most attempts any retry loop makes before it reports a failure.
const MAX_ATTEMPTS: usize = 10_000;

/// The command line.
#[derive(Parser)]
#[command(
    version,
    about = "GPU check of the host API: every public host function, run on every PE with random \
             data and compared with a reference computed on the CPU",
    long_about = "GPU check of the host API: every public host function, run on every PE with \
                  random data and compared with a reference computed on the CPU. Run one PE per \
                  GPU:\n\n    \
                  mpiexec -np 4 target/release/gpu_check [--verbose]\n\n\
                  PE 0 prints `N passed, M failed`, where a check counts as failed if it failed \
                  on any PE; the exit status is 1 when anything failed."
)]
struct Cli {
    /// PE 0 also prints `ok NAME` for every check that passes
    #[arg(short, long)]
    verbose: bool,
}

fn main() {
    // Before NVSHMEM starts, so that --help needs no GPU.
    let cli = Cli::parse();
    let code = match run(cli.verbose) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpu_check: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn run(verbose: bool) -> Result<i32> {
    let shmem = Nvshmem::init()?;
    let ctx = Ctx::new(shmem)?;
    let mut h = Harness::new(&ctx, verbose);

    runtime::checks(&mut h);
    rma::checks(&mut h);
    signal::checks(&mut h);
    atomic::checks(&mut h);
    sync::checks(&mut h);
    collectives::checks(&mut h);
    errors::checks(&mut h);
    reliability::checks(&mut h);

    let (passed, failed) = h.finish()?;
    let me = ctx.me;
    if me == 0 {
        println!("{passed} passed, {failed} failed");
    }
    // The last handle is gone (buffers freed with free() included): NVSHMEM has finalised,
    // so a new start is refused as finalised, not as already running.
    drop(ctx);
    let finalized = matches!(Nvshmem::init(), Err(Error::Finalized));
    if !finalized {
        eprintln!("[PE {me}] FAIL NVSHMEM still running after every handle was dropped");
    } else if me == 0 {
        println!("finalized after the last handle: ok");
    }
    Ok(if failed > 0 || !finalized { 1 } else { 0 })
}
