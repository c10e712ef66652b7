//! Disaggregated serving on the page pool. Prefill PEs (the first half) build each request's
//! KV cache in pages of their own and publish the page ids under the request's id in a
//! `SymmetricMap`. Decode PEs (the second half; with one PE, the same PE) pull the pages of
//! the requests that arrive and check every byte. They keep each request for a few decode
//! steps and then free its pages, which the prefill PE reuses: requests join and leave every
//! step. Every third step the pull runs from device ids (`gather_device`, a kernel) instead
//! of the host's checked `gather`. PE 0 prints the pool's occupancy per step.
//!
//! ```text
//! nvshmemrun -np 2 target/release/examples/disaggregated
//! ```

use nvshmem::map::{MapConfig, SymmetricMap};
use nvshmem::pool::{PageId, PagePool, PagePoolConfig, NO_PAGE};
use nvshmem::Nvshmem;

const PAGE_BYTES: usize = 16 << 10;
/// A request's KV cache: LAYERS pages for each of its 1 to MAX_BLOCKS blocks of tokens.
const LAYERS: usize = 4;
const MAX_BLOCKS: usize = 8;
const MAX_PAGES: usize = LAYERS * MAX_BLOCKS;
const PAGES_PER_PE: usize = 512;
const STEPS: u64 = 12;
/// New requests per prefill PE and step.
const ARRIVALS: u64 = 3;

fn main() {
    if let Err(e) = run() {
        eprintln!("disaggregated: {e}");
        std::process::exit(1);
    }
}

/// Byte `i` of page `k` of request `req`'s KV cache.
fn kv_byte(req: u64, k: usize, i: usize) -> u8 {
    (req.wrapping_mul(0x9E37_79B9) as usize ^ k.wrapping_mul(131) ^ i.wrapping_mul(7)) as u8
}

fn kv_pages(req: u64, count: usize) -> Vec<u8> {
    (0..count * PAGE_BYTES)
        .map(|i| kv_byte(req, i / PAGE_BYTES, i % PAGE_BYTES))
        .collect()
}

/// A small counter-based generator: the same draws on the PE that needs them.
fn draw(seed: u64, range: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (z ^ (z >> 27)) % range
}

fn run() -> nvshmem::Result<()> {
    let shmem = Nvshmem::init()?;
    let (me, n, stream) = (shmem.my_pe(), shmem.n_pes(), shmem.stream());
    let half = n / 2;
    // With one PE it does both; with an odd count the last PE only keeps step.
    let prefill = n == 1 || me < half;
    let partner = if n == 1 {
        Some(0)
    } else {
        (me >= half && me < 2 * half).then(|| me - half)
    };
    let pool = PagePool::new(&shmem, PagePoolConfig::new(PAGES_PER_PE, PAGE_BYTES))?;
    // A request's page ids, unused ones NO_PAGE.
    let map = SymmetricMap::new(&shmem, MapConfig::new(1024, 8 * MAX_PAGES))?;
    let (mut active, mut pulled, mut wrong, mut peak) = (Vec::new(), 0, 0, 0);
    for step in 0..STEPS {
        if prefill {
            for a in 0..ARRIVALS {
                let req = ((me as u64) << 32) | (step * ARRIVALS + a);
                let count = LAYERS * (1 + draw(req, MAX_BLOCKS as u64) as usize);
                let ids = pool.alloc_n(me, count)?;
                let src = shmem.alloc_device::<u8>(count * PAGE_BYTES)?;
                src.copy_from_host(&kv_pages(req, count))?;
                pool.scatter(&ids, &src, stream)?;
                stream.synchronize()?; // the pages are written before their ids are published
                let mut raw: Vec<u64> = ids.iter().map(|id| id.to_raw()).collect();
                raw.resize(MAX_PAGES, NO_PAGE);
                let bytes: Vec<u8> = raw.iter().flat_map(|w| w.to_le_bytes()).collect();
                map.insert(req, &bytes)?;
            }
        }
        shmem.barrier_all()?;
        if let Some(p) = partner {
            for a in 0..ARRIVALS {
                let req = ((p as u64) << 32) | (step * ARRIVALS + a);
                let value = map.get(req)?.expect("the prefill PE published the request");
                let ids: Vec<PageId> = value
                    .chunks(8)
                    .filter_map(|w| PageId::from_raw(u64::from_le_bytes(w.try_into().unwrap())))
                    .collect();
                let dst = shmem.alloc_device::<u8>(ids.len() * PAGE_BYTES)?;
                if step % 3 == 2 {
                    let raw: Vec<u64> = ids.iter().map(|id| id.to_raw()).collect();
                    let dev_ids = shmem.alloc_device::<u64>(raw.len())?;
                    dev_ids.copy_from_host(&raw)?;
                    pool.gather_device(&dst, &dev_ids, stream)?;
                } else {
                    pool.gather(&dst, &ids, stream)?;
                }
                let got = dst.to_vec()?;
                wrong += got
                    .iter()
                    .zip(kv_pages(req, ids.len()))
                    .filter(|(g, w)| **g != *w)
                    .count();
                pulled += ids.len();
                map.remove(req)?;
                // Decode for 1 to 3 steps, then leave.
                active.push((ids, 1 + draw(req ^ 1, 3)));
            }
            for (ids, left) in active.iter_mut() {
                *left -= 1;
                if *left == 0 {
                    pool.free_n(ids)?;
                }
            }
            active.retain(|(_, left)| *left > 0);
        }
        shmem.barrier_all()?;
        let in_use = pool.in_use(0)?;
        peak = peak.max(in_use);
        if me == 0 {
            println!("disaggregated: step {step}: {in_use} pages of PE 0 in use");
        }
    }
    for (ids, _) in &active {
        pool.free_n(ids)?;
    }
    shmem.barrier_all()?;
    let left = pool.in_use(me)?;
    println!(
        "disaggregated: PE {me}/{n}: {pulled} pages pulled, {wrong} wrong bytes; PE 0's pool \
         peaked at {peak} of {PAGES_PER_PE} pages; {left} pages of this PE in use at the end"
    );
    if wrong > 0 || left > 0 {
        std::process::exit(1);
    }
    Ok(())
}
