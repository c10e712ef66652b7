//! GPU checks of the symmetric map (nvshmem::map::SymmetricMap): single keys and batches
//! from the host, read back by every PE; removes and the reuse of their slots; owners that
//! fill up, and `clear`; inserts from every PE at once into crowded owners, and lookups
//! beside inserts; bad input; lookups in a CUDA graph; and a user's kernels (checks/kernels/map_device.cu)
//! through `nvshmem_rs/map.cuh`. Works with any number of PEs, one included.
//!
//! ```text
//! scripts/nvshmrun -np 4 target/release/map_check
//! ```
//! Prints `N passed, M failed` on PE 0 and exits non-zero if anything failed.

mod batch;
mod concurrent;
mod device;
mod host;

use clap::Parser;

use nvshmem_checks::tally::Checks;

/// The command line: no options of its own, only `--help` and `--version`.
#[derive(Parser)]
#[command(
    version,
    about = "GPU checks of the symmetric map (nvshmem::map::SymmetricMap), from the host and \
             from a user's kernels",
    long_about = "GPU checks of the symmetric map (nvshmem::map::SymmetricMap): single keys \
                  and batches, removes and slot reuse, full owners, concurrent inserts and \
                  lookups from every PE, bad input, CUDA graphs and a user's kernels through \
                  nvshmem_rs/map.cuh. Works with any number of PEs, one included:\n\n    \
                  scripts/nvshmrun -np 4 target/release/map_check\n\n\
                  Prints `N passed, M failed` on PE 0 and exits non-zero if anything failed."
)]
struct Cli {}

fn main() {
    // Before NVSHMEM starts, so that --help needs no GPU.
    Cli::parse();
    let shmem = nvshmem_checks::start("map_check");
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    if me == 0 {
        println!(
            "map_check: {n} PEs; {}",
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    let mut c = Checks::new(&shmem);
    c.run("single keys from the host, read by every PE", || {
        host::single_keys(&shmem)
    });
    c.run("batches: inserts, lookups, removes, slots reused", || {
        host::batches(&shmem)
    });
    c.run("owners that fill up say Full; clear empties them", || {
        host::full_owners(&shmem)
    });
    c.run("bad input gives the right error or status", || {
        host::bad_input(&shmem)
    });
    c.run("lookups captured in a CUDA graph", || host::graph(&shmem));
    c.run("inserts from every PE at once into crowded owners", || {
        concurrent::crowded_inserts(&shmem)
    });
    c.run("lookups beside inserts of other keys", || {
        concurrent::lookups_during_inserts(&shmem)
    });
    c.run(
        "a user's kernels insert, look up and remove (nvshmem_rs/map.cuh)",
        || device::device_side(&shmem),
    );
    match c.finish() {
        Ok((passed, failed)) => {
            if me == 0 {
                println!("{passed} passed, {failed} failed");
            }
            std::process::exit(if failed == 0 { 0 } else { 1 });
        }
        Err(err) => {
            eprintln!("map_check: PE {me}: the final tally failed: {err}");
            std::process::exit(1);
        }
    }
}
