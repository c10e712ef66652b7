//! A parameter cache in symmetric memory: every PE publishes its adapters (an id, and 4 KiB
//! of f32 weights each) into one `SymmetricMap` spread over the PEs. Then a kernel on every
//! PE fetches 256 random adapters of any PE (`lookup_batch`), and the PE checks every
//! weight. Last, PE 0 swaps one adapter for new weights (remove, insert), and every PE
//! reads the new ones.
//!
//! ```text
//! nvshmemrun -np 4 target/release/examples/param_cache
//! ```

use nvshmem::map::{MapConfig, MapStatus, SymmetricMap};
use nvshmem::Nvshmem;

const ADAPTERS_PER_PE: usize = 64;
/// Weights of an adapter: 4 KiB.
const WEIGHTS: usize = 1024;
const FETCHES: usize = 256;

fn main() {
    if let Err(e) = run() {
        eprintln!("param_cache: {e}");
        std::process::exit(1);
    }
}

/// The id of adapter `i` of PE `pe`.
fn adapter_id(pe: usize, i: usize) -> u64 {
    ((pe as u64) << 32) | i as u64
}

/// The weights of adapter `id` in version `version`.
fn weights(id: u64, version: u64) -> Vec<f32> {
    (0..WEIGHTS as u64)
        .map(|j| ((id.wrapping_mul(7) + j * 13 + version * 101) % 1000) as f32 * 1e-3)
        .collect()
}

/// Whether every status a batch wrote is `Done`.
fn all_done(status: &nvshmem::DeviceBuffer<u32>) -> nvshmem::Result<bool> {
    let done = MapStatus::Done.code();
    Ok(status.to_vec()?.iter().all(|&s| s == done))
}

fn run() -> nvshmem::Result<()> {
    let shmem = Nvshmem::init()?;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let stream = shmem.stream();
    // Collective: room for four times the adapters each PE owns on average.
    let map = SymmetricMap::new(&shmem, MapConfig::new(4 * ADAPTERS_PER_PE, 4 * WEIGHTS))?;

    // Publish this PE's adapters in one batch; each lands on the PE its id hashes to.
    let ids: Vec<u64> = (0..ADAPTERS_PER_PE).map(|i| adapter_id(me, i)).collect();
    let keys = shmem.alloc_device::<u64>(ADAPTERS_PER_PE)?;
    let values = shmem.alloc_device::<f32>(ADAPTERS_PER_PE * WEIGHTS)?;
    let status = shmem.alloc_device::<u32>(ADAPTERS_PER_PE)?;
    keys.copy_from_host(&ids)?;
    let all: Vec<f32> = ids.iter().flat_map(|&id| weights(id, 0)).collect();
    values.copy_from_host(&all)?;
    map.insert_batch(&keys, &values, &status, stream)?;
    stream.synchronize()?;
    let published = all_done(&status)?;
    shmem.barrier_all()?;

    // Fetch random adapters of every PE from a kernel, into local memory.
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ me as u64;
    let wanted: Vec<u64> = (0..FETCHES)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (state >> 33) as usize;
            adapter_id(r % n, (r / n) % ADAPTERS_PER_PE)
        })
        .collect();
    let fetch_keys = shmem.alloc_device::<u64>(FETCHES)?;
    let fetched = shmem.alloc_device::<f32>(FETCHES * WEIGHTS)?;
    let fetch_status = shmem.alloc_device::<u32>(FETCHES)?;
    fetch_keys.copy_from_host(&wanted)?;
    map.lookup_batch(&fetched, &fetch_keys, &fetch_status, stream)?;
    stream.synchronize()?;
    let got = fetched.to_vec()?;
    let wrong = wanted
        .iter()
        .enumerate()
        .filter(|&(k, &id)| got[k * WEIGHTS..(k + 1) * WEIGHTS] != weights(id, 0)[..])
        .count();
    let found = all_done(&fetch_status)?;

    // Swap one adapter: nobody reads it while PE 0 removes it and inserts version 1.
    shmem.barrier_all()?;
    let swapped = adapter_id(n - 1, 0);
    let bytes = |w: Vec<f32>| -> Vec<u8> { w.iter().flat_map(|v| v.to_le_bytes()).collect() };
    if me == 0 {
        map.remove(swapped)?;
        map.insert(swapped, &bytes(weights(swapped, 1)))?;
    }
    shmem.barrier_all()?;
    let new_seen = map.get(swapped)? == Some(bytes(weights(swapped, 1)));

    println!(
        "param_cache: PE {me}/{n}: {ADAPTERS_PER_PE} adapters published: {published}; {FETCHES} \
         random adapters fetched: {wrong} wrong, all found: {found}; the swapped adapter's new \
         weights seen: {new_seen}; this PE holds {} adapters",
        map.occupancy(me)?.keys
    );
    if !(published && found && wrong == 0 && new_seen) {
        std::process::exit(1);
    }
    Ok(())
}
