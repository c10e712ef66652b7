//! A KV page pool: every PE allocates pages on the next PE, writes them there by a scatter,
//! publishes their ids in its own table; then every PE reads the table of the PE before it,
//! gathers those pages and checks them, and the owners free what they allocated.
//!
//! ```text
//! nvshmemrun -np 2 target/release/examples/page_pool
//! ```

use nvshmem::pool::{PagePool, PagePoolConfig};
use nvshmem::{Error, Nvshmem};

const PAGES_PER_PE: usize = 256;
const PAGE_BYTES: usize = 16 << 10;
/// Pages each PE takes on the next PE.
const TAKEN: usize = 8;

fn main() {
    if let Err(e) = run() {
        eprintln!("page_pool: {e}");
        std::process::exit(1);
    }
}

/// What page `k` of PE `pe`'s batch holds: every byte the same.
fn fill(pe: usize, k: usize) -> u8 {
    (pe * 31 + k * 7 + 1) as u8
}

fn run() -> nvshmem::Result<()> {
    let shmem = Nvshmem::init()?;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let stream = shmem.stream();
    // Collective: every PE makes the pool, with a table of TAKEN entries per PE.
    let pool = PagePool::new(
        &shmem,
        PagePoolConfig::new(PAGES_PER_PE, PAGE_BYTES).table_len(TAKEN),
    )?;

    // Pages of the next PE, written there by a scatter from local memory.
    let ids = pool.alloc_n(next, TAKEN)?;
    let src = shmem.alloc_device::<u8>(TAKEN * PAGE_BYTES)?;
    let bytes: Vec<u8> = (0..TAKEN * PAGE_BYTES)
        .map(|i| fill(me, i / PAGE_BYTES))
        .collect();
    src.copy_from_host(&bytes)?;
    pool.scatter(&ids, &src, stream)?;
    stream.synchronize()?;
    shmem.quiet()?;
    // Publish the ids after the contents, then wait for every PE to have published.
    for (k, &id) in ids.iter().enumerate() {
        pool.table_set(me, k, Some(id))?;
    }
    shmem.barrier_all()?;

    // The previous PE's pages (on this PE), found through its table and gathered.
    let theirs: Vec<_> = (0..TAKEN)
        .map(|k| {
            pool.table_get(prev, k)?.ok_or_else(|| {
                Error::InvalidArgument(format!("PE {prev} published no page at entry {k}"))
            })
        })
        .collect::<nvshmem::Result<_>>()?;
    let dst = shmem.alloc_device::<u8>(TAKEN * PAGE_BYTES)?;
    pool.gather(&dst, &theirs, stream)?;
    let got = dst.to_vec()?;
    let wrong = (0..TAKEN * PAGE_BYTES)
        .filter(|&i| got[i] != fill(prev, i / PAGE_BYTES))
        .count();

    // Every reader is done before the owners free; then no page of this PE is in use.
    shmem.barrier_all()?;
    pool.free_n(&ids)?;
    shmem.barrier_all()?;
    let in_use = pool.in_use(me)?;
    println!(
        "page_pool: PE {me}/{n}: {TAKEN} pages of {PAGE_BYTES} bytes written on PE {next}, \
         {TAKEN} of PE {prev}'s read back: {wrong} wrong bytes; {in_use} pages in use after the frees"
    );
    if wrong > 0 || in_use != 0 {
        std::process::exit(1);
    }
    Ok(())
}
