//! GPU checks of the page pool (nvshmem::pool::PagePool): every PE allocates pages on itself,
//! writes a known pattern, publishes the pages in its page table, and gathers random pages of
//! its peers (host and device-id forms), checking them bit for bit; scatters into a peer's
//! pages; bad input gives the right error; concurrent allocations from every PE into one PE
//! never hand out a page twice; a stale id (its page freed and allocated again) frees
//! nothing, from the host or a kernel, and of many frees of one id racing with allocations
//! exactly one succeeds; and a user's kernels (checks/kernels/kv_pool_device.cu) allocate
//! on peers, write, publish and gather pages through `nvshmem_rs/pool.cuh`. Works with any
//! number of PEs, one included.
//!
//! ```text
//! scripts/nvshmrun -np 4 target/release/kv_pool
//! ```
//! Prints `N passed, M failed` on PE 0 and exits non-zero if anything failed.

mod allocator;
mod device;
mod harness;
mod main_pool;
mod stale;

use clap::Parser;
use nvshmem::pool::{PageId, PagePool, PagePoolConfig};

use nvshmem_checks::splitmix::{mix, SplitMix64};

use harness::Checks;

/// Pages per PE of the main pool.
const PAGES: usize = 64;
/// Bytes of a page: not a multiple of the gather kernel's 4 KiB pieces, so the last piece of
/// every page is a short one.
const PAGE_BYTES: usize = 4096 + 64;
/// Pages each PE allocates on itself and publishes.
const MINE: usize = 8;
/// Page-table entries per PE.
const TABLE: usize = 16;

/// The command line: no options of its own, only `--help` and `--version`.
#[derive(Parser)]
#[command(
    version,
    about = "GPU checks of the page pool (nvshmem::pool::PagePool), from the host and from a \
             user's kernels",
    long_about = "GPU checks of the page pool (nvshmem::pool::PagePool): allocation, the page \
                  tables, gathers and scatters between the PEs, bad input, exhaustion, \
                  concurrent allocation, stale ids (from the host and from kernels) and a \
                  user's kernels through nvshmem_rs/pool.cuh. Works with any number of PEs, \
                  one included:\n\n    \
                  scripts/nvshmrun -np 4 target/release/kv_pool\n\n\
                  Prints `N passed, M failed` on PE 0 and exits non-zero if anything failed."
)]
struct Cli {}

fn main() {
    // Before NVSHMEM starts, so that --help needs no GPU.
    Cli::parse();
    let shmem = nvshmem_checks::start("kv_pool");
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let pool = match PagePool::new(
        &shmem,
        PagePoolConfig::new(PAGES, PAGE_BYTES).table_len(TABLE),
    ) {
        Ok(p) => p,
        Err(err) => {
            eprintln!("kv_pool: PE {me}: {err}");
            std::process::exit(2);
        }
    };
    if me == 0 {
        println!(
            "kv_pool: {n} PEs, {PAGES} pages of {PAGE_BYTES} bytes per PE; {}",
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    let mut c = Checks {
        shmem: shmem.clone(),
        names: Vec::new(),
        failed: Vec::new(),
    };
    let mut rng = SplitMix64(mix(0x5EED ^ me as u64));
    let mut mine: Vec<PageId> = Vec::new();

    c.run("the handle describes the pool", || {
        main_pool::handle(&shmem, &pool)
    });
    c.run("host allocation on this PE", || {
        main_pool::alloc_mine(&shmem, &pool, &mut mine)
    });
    c.run("pages written and published in the page table", || {
        main_pool::publish(&shmem, &pool, &mine)
    });
    c.run("every PE's page table is readable", || {
        main_pool::tables_readable(&shmem, &pool)
    });
    c.run("host gather of random pages of the peers", || {
        main_pool::gather_random(&shmem, &pool, &mut rng)
    });
    c.run("host gather into u32 elements", || {
        main_pool::gather_u32(&shmem, &pool, &mut rng)
    });
    c.run("device-id gather skips ids that name no page", || {
        main_pool::gather_device_ids(&shmem, &pool, &mut rng)
    });
    c.run("scatter into the next PE's pages", || {
        main_pool::scatter_next(&shmem, &pool)
    });
    c.run("scattered pages hold the writer's data", || {
        main_pool::scattered(&shmem, &pool, &mine)
    });
    c.run("bad input gives the right error", || {
        main_pool::bad_input(&shmem, &pool, &mine)
    });
    c.run("exhaustion, double free and reuse", || {
        allocator::exhaustion_and_reuse(&shmem)
    });
    c.run(
        "concurrent allocation into PE 0 hands out every page once",
        || allocator::concurrent(&shmem),
    );

    c.run(
        "a stale id frees nothing and its page's new allocation lives (host)",
        || stale::host_stale_free(&shmem),
    );

    c.run(
        "a stale id frees nothing and its page's new allocation lives (kernel)",
        || stale::device_stale_free(&shmem),
    );

    c.run(
        "frees of one id racing in kernels on every PE: exactly one succeeds",
        || stale::device_free_race(&shmem),
    );

    c.run(
        "a user's kernels allocate, write, publish and gather pages (nvshmem_rs/pool.cuh)",
        || device::device_side(&shmem),
    );

    c.run("freed pages of the main pool", || {
        main_pool::free_mine(&shmem, &pool, &mine)
    });

    match c.finish() {
        Ok((passed, failed)) => {
            if me == 0 {
                println!("{passed} passed, {failed} failed");
            }
            drop(pool);
            std::process::exit(if failed == 0 { 0 } else { 1 });
        }
        Err(err) => {
            eprintln!("kv_pool: PE {me}: the final tally failed: {err}");
            std::process::exit(1);
        }
    }
}
