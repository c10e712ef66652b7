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

use nvshmem::module::{grid, KernelArgs, Module};
use nvshmem::pool::{PageId, PagePool, PagePoolConfig, NO_PAGE};
use nvshmem::{DeviceBuffer, Error, Nvshmem};
use std::collections::HashSet;

use nvshmem_checks::splitmix;

use splitmix::{mix, SplitMix64};

/// The kernels of the device-side check (checks/kernels/kv_pool_device.cu).
use nvshmem_checks::kernels;

/// Pages per PE of the main pool.
const PAGES: usize = 64;
/// Bytes of a page: not a multiple of the gather kernel's 4 KiB pieces, so the last piece of
/// every page is a short one.
const PAGE_BYTES: usize = 4096 + 64;
/// Pages each PE allocates on itself and publishes.
const MINE: usize = 8;
/// Page-table entries per PE.
const TABLE: usize = 16;
/// Pages each PE allocates on PE 0 in the concurrent check, in batches of `BATCH`.
const CONCURRENT: usize = 24;
const BATCH: usize = 8;
/// Blocks of every PE's kernel in the free race: half free one id, half allocate.
const RACE_BLOCKS: u32 = 16;
/// Allocations an allocating block of the race tries before it gives up.
const RACE_TRIES: u32 = 1000;

type Outcome = Result<(), String>;

/// The contents of page `index` of PE `pe` as written by PE `writer` in round `round`.
fn pattern(round: u64, writer: usize, pe: u32, index: u32) -> Vec<u8> {
    let seed = mix(round ^ mix(writer as u64 ^ mix(((pe as u64) << 32) | index as u64)));
    let mut rng = SplitMix64(seed);
    let mut out = Vec::with_capacity(PAGE_BYTES);
    while out.len() < PAGE_BYTES {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(PAGE_BYTES);
    out
}

/// Where `got` first differs from `want`, as text.
fn compare(what: &str, got: &[u8], want: &[u8]) -> Outcome {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: {} bytes differ, first at byte {i} (page {}, offset {}): got {:#04x}, expected {:#04x}",
            got.iter().zip(want).filter(|(g, w)| g != w).count(),
            i / PAGE_BYTES,
            i % PAGE_BYTES,
            got[i],
            want[i]
        )),
    }
}

fn e(err: Error) -> String {
    err.to_string()
}

fn sync(shmem: &Nvshmem) -> Outcome {
    shmem
        .stream()
        .synchronize()
        .map_err(|err| format!("cuStreamSynchronize: {err:?}"))
}

/// Whether `r` is the error `want` describes.
fn expect_err<T: std::fmt::Debug>(
    what: &str,
    r: nvshmem::Result<T>,
    want: impl Fn(&Error) -> bool,
) -> Outcome {
    match r {
        Err(err) if want(&err) => Ok(()),
        Err(err) => Err(format!("{what}: wrong error: {err}")),
        Ok(v) => Err(format!("{what}: succeeded ({v:?}), expected an error")),
    }
}

struct Checks {
    shmem: Nvshmem,
    names: Vec<String>,
    failed: Vec<i32>,
}

impl Checks {
    fn run(&mut self, name: &str, f: impl FnOnce() -> Outcome) {
        let outcome = f();
        if let Err(err) = &outcome {
            eprintln!("[PE {}] FAIL {name}: {err}", self.shmem.my_pe());
        }
        if let Err(err) = self.shmem.barrier_all() {
            eprintln!("[PE {}] barrier after {name}: {err}", self.shmem.my_pe());
        }
        self.names.push(name.to_string());
        self.failed.push(outcome.is_err() as i32);
    }

    /// How many checks passed and failed on every PE (a check fails if it failed anywhere).
    fn finish(&self) -> nvshmem::Result<(usize, usize)> {
        let counts = self.shmem.calloc::<i32>(self.failed.len())?;
        for (i, _) in self.failed.iter().enumerate().filter(|(_, &f)| f != 0) {
            self.shmem.atomic_add(&counts, i, 1, 0)?;
        }
        self.shmem.barrier_all()?;
        let totals = counts.to_vec()?;
        if self.shmem.my_pe() == 0 {
            for (name, pes) in self.names.iter().zip(&totals).filter(|(_, &t)| t > 0) {
                eprintln!("FAILED {name} (on {pes} of {} PEs)", self.shmem.n_pes());
            }
        }
        let failed = totals.iter().filter(|&&t| t > 0).count();
        Ok((totals.len() - failed, failed))
    }
}

/// The PEs whose pages a PE reads: the others, or itself when it is alone.
fn peers(me: usize, n: usize) -> Vec<usize> {
    match n {
        1 => vec![0],
        _ => (0..n).filter(|&p| p != me).collect(),
    }
}

/// `count` random published pages of `peers` (from their page tables), with their owners'
/// expected contents.
fn random_published(
    pool: &PagePool,
    peers: &[usize],
    count: usize,
    rng: &mut SplitMix64,
) -> Result<(Vec<PageId>, Vec<u8>), String> {
    let mut ids = Vec::new();
    let mut want = Vec::new();
    for _ in 0..count {
        let pe = peers[(rng.next_u64() % peers.len() as u64) as usize];
        let entry = (rng.next_u64() % MINE as u64) as usize;
        let id = pool
            .table_get(pe, entry)
            .map_err(e)?
            .ok_or_else(|| format!("PE {pe} published nothing in entry {entry}"))?;
        want.extend(pattern(1, pe, id.pe, id.index));
        ids.push(id);
    }
    Ok((ids, want))
}

/// Byte `i` of the `k`-th page PE `p` writes from a kernel (`device_pattern` in
/// kv_pool_device.cu).
fn device_pattern(p: u32, k: u32, i: u64) -> u8 {
    p.wrapping_mul(37)
        .wrapping_add(k.wrapping_mul(11))
        .wrapping_add((i as u32).wrapping_mul(3))
        .wrapping_add((i >> 8) as u32) as u8
}

/// A user's kernels drive the pool through nvshmem_rs/pool.cuh: each PE's kernel allocates
/// its k-th page on PE me + 1 + k (remote atomics), writes it with a block put, completes
/// it and publishes it in its page table; then each PE's second kernel reads the next PE's
/// table and gathers those pages. The ids must name the PEs they were allocated on and the
/// pages must hold the producer's bytes; the consumer frees them (so each page is freed
/// once) and every PE's pool is empty again.
fn device_side(shmem: &Nvshmem) -> Outcome {
    const COUNT: usize = 4;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    // Room for every PE's pages on any one PE (all of them with one PE).
    let pool = PagePool::new(
        shmem,
        PagePoolConfig::new(COUNT * n, PAGE_BYTES).table_len(COUNT),
    )
    .map_err(e)?;
    let module = Module::load(shmem, &kernels::KV_POOL_DEVICE).map_err(e)?;
    let produce = module.function("kv_device_produce").map_err(e)?;
    let consume = module.function("kv_device_consume").map_err(e)?;
    let staging = shmem.alloc_device::<u8>(COUNT * PAGE_BYTES).map_err(e)?;
    let ids = shmem.alloc_device::<u64>(COUNT).map_err(e)?;
    let dst = shmem.alloc_device::<u8>(COUNT * PAGE_BYTES).map_err(e)?;
    let stream = shmem.stream();
    let sync = || stream.synchronize().map_err(|err| err.to_string());

    let mut args = KernelArgs::new();
    args.value(pool.handle())
        .value(COUNT as u32)
        .device_ptr(staging.addr());
    // SAFETY: kv_device_produce(nvshmem_rs_pool, uint32_t, char *); staging holds COUNT
    // pages and outlives the kernel, which is waited for.
    let produced = unsafe { produce.launch(grid(1, 256), stream, &mut args) }
        .map_err(e)
        .and_then(|()| sync());
    // Every page is published before anyone reads a table.
    shmem.barrier_all().map_err(e)?;

    let from = (me + 1) % n;
    let mut args = KernelArgs::new();
    args.value(pool.handle())
        .value(from as i32)
        .value(COUNT as u32)
        .device_ptr(ids.addr())
        .device_ptr(dst.addr());
    // SAFETY: kv_device_consume(nvshmem_rs_pool, int32_t, uint32_t, uint64_t *, char *);
    // ids and dst hold COUNT words and pages.
    let consumed = unsafe { consume.launch(grid(1, 256), stream, &mut args) }
        .map_err(e)
        .and_then(|()| sync());
    let checked = produced.and(consumed).and_then(|()| {
        let raw = ids.to_vec().map_err(e)?;
        let got = dst.to_vec().map_err(e)?;
        let mut gathered = Vec::new();
        for (k, &r) in raw.iter().enumerate() {
            let id = PageId::from_raw(r)
                .ok_or_else(|| format!("PE {from} published no page in entry {k}"))?;
            let owner = (from + 1 + k) % n;
            if id.pe as usize != owner || !pool.is_allocated(id).map_err(e)? {
                return Err(format!(
                    "entry {k} of PE {from}: {id}, expected an allocated page of PE {owner}"
                ));
            }
            let want: Vec<u8> = (0..PAGE_BYTES as u64)
                .map(|i| device_pattern(from as u32, k as u32, i))
                .collect();
            compare(
                &format!("page {id} written by PE {from}'s kernel"),
                &got[k * PAGE_BYTES..(k + 1) * PAGE_BYTES],
                &want,
            )?;
            gathered.push(id);
        }
        pool.free_n(&gathered).map_err(e)
    });
    // Every page is freed (by the PE that gathered it) before the pools are counted.
    shmem.barrier_all().map_err(e)?;
    let emptied = match pool.in_use(me).map_err(e)? {
        0 => Ok(()),
        used => Err(format!(
            "{used} pages of this PE still in use after the frees"
        )),
    };
    shmem.barrier_all().map_err(e)?;
    checked.and(emptied)
}

/// The id of `id`'s page in the generation after it (what its next allocation gets).
fn next_generation(id: PageId) -> PageId {
    id.with_generation((id.generation + 1) % PageId::GENERATIONS)
}

/// A stale id freed from the host: page `a` allocated and freed, `b` allocated (the same page:
/// each PE holds one), then `a` freed again must be `PageNotAllocated` and leave `b`
/// allocated, readable and writable; a and b's frees of their own succeed once each.
fn host_stale_free(shmem: &Nvshmem) -> Outcome {
    let me = shmem.my_pe();
    let stream = shmem.stream();
    let one = PagePool::new(shmem, PagePoolConfig::new(1, PAGE_BYTES)).map_err(e)?;
    let a = one.alloc(me).map_err(e)?;
    one.free(a).map_err(e)?;
    let b = one.alloc(me).map_err(e)?;
    if b != next_generation(a) {
        return Err(format!(
            "freed {a}, then allocated {b}: expected the same page in the next generation"
        ));
    }
    let stale_a = |err: &Error| {
        matches!(err, Error::PageNotAllocated { pe, index, generation }
            if *pe == me && *index == a.index as usize && *generation == a.generation)
    };
    expect_err("a stale free", one.free(a), stale_a)?;
    expect_err("a stale id among free_n's", one.free_n(&[a]), stale_a)?;
    if !one.is_allocated(b).map_err(e)? || one.is_allocated(a).map_err(e)? {
        return Err(format!(
            "after the stale frees, is_allocated says {} for {b} and {} for {a}",
            one.is_allocated(b).map_err(e)?,
            one.is_allocated(a).map_err(e)?
        ));
    }
    if one.in_use(me).map_err(e)? != 1 {
        return Err("the stale frees freed the page".into());
    }
    // b's page still works through the checked copies; a is refused by them.
    let data = pattern(3, me, b.pe, b.index);
    let src = shmem.alloc_device::<u8>(PAGE_BYTES).map_err(e)?;
    src.copy_from_host(&data).map_err(e)?;
    let dst = shmem.alloc_device::<u8>(PAGE_BYTES).map_err(e)?;
    one.scatter(&[b], &src, stream).map_err(e)?;
    one.gather(&dst, &[b], stream).map_err(e)?;
    sync(shmem)?;
    compare(
        &format!("{b} after a stale free"),
        &dst.to_vec().map_err(e)?,
        &data,
    )?;
    expect_err(
        "a gather of a stale id",
        one.gather(&dst, &[a], stream),
        stale_a,
    )?;
    expect_err(
        "a scatter of a stale id",
        one.scatter(&[a], &src, stream),
        stale_a,
    )?;
    one.free(b).map_err(e)?;
    let stale_b = |err: &Error| match err {
        Error::PageNotAllocated { generation, .. } => *generation == b.generation,
        _ => false,
    };
    expect_err("b freed twice", one.free(b), stale_b)?;
    match one.in_use(me).map_err(e)? {
        0 => Ok(()),
        used => Err(format!("{used} pages in use after b's free")),
    }
}

/// A stale id freed from a kernel (kv_device_stale_free), on the next PE's only page: the
/// device free of `a` after `b` took its page says not allocated, and `b` stays allocated.
fn device_stale_free(shmem: &Nvshmem) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let pe = (me + 1) % n;
    let one = PagePool::new(shmem, PagePoolConfig::new(1, 64)).map_err(e)?;
    let module = Module::load(shmem, &kernels::KV_POOL_DEVICE).map_err(e)?;
    let kernel = module.function("kv_device_stale_free").map_err(e)?;
    let out = shmem.alloc_device::<u64>(6).map_err(e)?;
    let mut args = KernelArgs::new();
    args.value(one.handle())
        .value(pe as i32)
        .device_ptr(out.addr());
    // SAFETY: kv_device_stale_free(nvshmem_rs_pool, int32_t, uint64_t *); out holds 6 words.
    unsafe { kernel.launch(grid(1, 32), shmem.stream(), &mut args) }.map_err(e)?;
    sync(shmem)?;
    let got = out.to_vec().map_err(e)?;
    let (a, b) = match (PageId::from_raw(got[0]), PageId::from_raw(got[2])) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            return Err(format!(
                "the kernel's allocations on PE {pe} gave {:#x} and {:#x}",
                got[0], got[2]
            ))
        }
    };
    if a.pe as usize != pe || got[1] != 1 {
        return Err(format!("{a}: allocated on PE {pe}, freed: {}", got[1]));
    }
    if b != next_generation(a) {
        return Err(format!(
            "the kernel freed {a}, then allocated {b}: expected the same page in the next \
             generation"
        ));
    }
    if got[3] != 0 {
        return Err(format!(
            "the kernel's stale free of {a} succeeded (after {b} took its page)"
        ));
    }
    if got[4] != 1 || got[5] != 0 {
        return Err(format!(
            "in the kernel after the stale free, pool_is_allocated says {} for {b} and {} for {a}",
            got[4], got[5]
        ));
    }
    // The host sees the same: b is the page's allocation, and its free is the one that works.
    if !one.is_allocated(b).map_err(e)? || one.is_allocated(a).map_err(e)? {
        return Err(format!("the host does not see {b} allocated and {a} stale"));
    }
    if one.in_use(pe).map_err(e)? != 1 {
        return Err(format!("PE {pe}'s page is not in use after the stale free"));
    }
    one.free(b).map_err(e)?;
    match one.in_use(pe).map_err(e)? {
        0 => Ok(()),
        used => Err(format!("{used} pages of PE {pe} in use after b's free")),
    }
}

/// Every PE's kernel (kv_device_free_race) frees one id of PE 0's only page from many blocks
/// while as many blocks allocate on PE 0: across the PEs exactly one free succeeds, at most
/// one allocation does (the page in its next generation), and the stale frees that run after
/// it leave that allocation alone.
fn device_free_race(shmem: &Nvshmem) -> Outcome {
    let me = shmem.my_pe();
    let one = PagePool::new(shmem, PagePoolConfig::new(1, 64).table_len(1)).map_err(e)?;
    // Successful frees, then allocations, over every PE (on PE 0).
    let counts = shmem.calloc::<u64>(2).map_err(e)?;
    let module = Module::load(shmem, &kernels::KV_POOL_DEVICE).map_err(e)?;
    let kernel = module.function("kv_device_free_race").map_err(e)?;
    let done = shmem.alloc_device::<u64>(RACE_BLOCKS as usize).map_err(e)?;
    let published = match me {
        0 => one
            .alloc(0)
            .and_then(|id| one.table_set(0, 0, Some(id)))
            .map_err(e),
        _ => Ok(()),
    };
    shmem.barrier_all().map_err(e)?;
    // No error returns between the barriers, which every PE must reach.
    let raced = published.and_then(|()| {
        let id = one
            .table_get(0, 0)
            .map_err(e)?
            .ok_or("PE 0 published no page")?;
        let mut args = KernelArgs::new();
        args.value(one.handle())
            .value(id.to_raw())
            .value(RACE_TRIES)
            .device_ptr(done.addr());
        // SAFETY: kv_device_free_race(nvshmem_rs_pool, uint64_t, uint32_t, uint64_t *); done
        // holds a word per block.
        unsafe { kernel.launch(grid(RACE_BLOCKS, 32), shmem.stream(), &mut args) }.map_err(e)?;
        sync(shmem)?;
        let got = done.to_vec().map_err(e)?;
        let frees = got.iter().step_by(2).filter(|&&d| d == 1).count();
        let fresh: Vec<PageId> = got
            .iter()
            .skip(1)
            .step_by(2)
            .filter_map(|&r| PageId::from_raw(r))
            .collect();
        shmem.atomic_add(&counts, 0, frees as u64, 0).map_err(e)?;
        shmem
            .atomic_add(&counts, 1, fresh.len() as u64, 0)
            .map_err(e)?;
        Ok((id, fresh))
    });
    shmem.barrier_all().map_err(e)?;
    // Every kernel has ended: every free that was going to run has run.
    let checked = raced
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|(id, fresh)| {
            for &f in fresh {
                if f != next_generation(*id) {
                    return Err(format!(
                        "the race freed {id} and allocated {f}: expected the next generation"
                    ));
                }
                if !one.is_allocated(f).map_err(e)? {
                    return Err(format!(
                        "{f}, allocated in the race, was freed by a stale free"
                    ));
                }
            }
            let frees = shmem.atomic_fetch(&counts, 0, 0).map_err(e)?;
            let allocations = shmem.atomic_fetch(&counts, 1, 0).map_err(e)?;
            let in_use = one.in_use(0).map_err(e)? as u64;
            if frees != 1 {
                return Err(format!(
                    "{frees} frees of {id} succeeded across the PEs' kernels, expected exactly 1"
                ));
            }
            if allocations > 1 || in_use != allocations {
                return Err(format!(
                    "{allocations} allocations of PE 0's only page succeeded and {in_use} pages \
                     are in use, expected as many, at most 1"
                ));
            }
            Ok(())
        });
    shmem.barrier_all().map_err(e)?;
    let freed = match &raced {
        Ok((_, fresh)) => one.free_n(fresh).map_err(e),
        Err(_) => Ok(()),
    };
    shmem.barrier_all().map_err(e)?;
    let emptied = match one.in_use(0).map_err(e)? {
        0 => Ok(()),
        used => Err(format!(
            "{used} pages of PE 0 in use after the race's pages were freed"
        )),
    };
    shmem.barrier_all().map_err(e)?;
    checked.and(freed).and(emptied)
}

fn main() {
    let shmem = match Nvshmem::init() {
        Ok(s) => s,
        Err(err) => {
            eprintln!("kv_pool: {err}");
            std::process::exit(2);
        }
    };
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
        let h = pool.handle();
        let fields = (h.pages_per_pe, h.page_bytes, h.table_len, h.my_pe, h.n_pes);
        let want = (
            PAGES as u32,
            PAGE_BYTES as u64,
            TABLE as u32,
            me as i32,
            n as i32,
        );
        if fields != want || h.pages as u64 != pool.pages().addr() {
            return Err(format!("handle {fields:?}, expected {want:?}"));
        }
        Ok(())
    });

    c.run("host allocation on this PE", || {
        mine = pool.alloc_n(me, MINE).map_err(e)?;
        let distinct: HashSet<PageId> = mine.iter().copied().collect();
        if distinct.len() != MINE || mine.iter().any(|id| id.pe as usize != me) {
            return Err(format!("got {mine:?}"));
        }
        for &id in &mine {
            if !pool.is_allocated(id).map_err(e)? {
                return Err(format!("{id} is not marked allocated"));
            }
        }
        match pool.in_use(me).map_err(e)? {
            MINE => Ok(()),
            used => Err(format!("{used} pages in use, expected {MINE}")),
        }
    });

    c.run("pages written and published in the page table", || {
        for (entry, &id) in mine.iter().enumerate() {
            let view = pool.page_view(id.index as usize).map_err(e)?;
            view.copy_from_host(&pattern(1, me, id.pe, id.index))
                .map_err(e)?;
            // The page is written (the copy waited): publish it.
            pool.table_set(me, entry, Some(id)).map_err(e)?;
        }
        Ok(())
    });

    c.run("every PE's page table is readable", || {
        for pe in 0..n {
            for entry in 0..MINE {
                match pool.table_get(pe, entry).map_err(e)? {
                    Some(id) if id.pe as usize == pe => {}
                    other => return Err(format!("PE {pe} entry {entry}: {other:?}")),
                }
            }
            if let Some(id) = pool.table_get(pe, MINE).map_err(e)? {
                return Err(format!("PE {pe} entry {MINE} was never set, holds {id}"));
            }
        }
        Ok(())
    });

    let others = peers(me, n);
    c.run("host gather of random pages of the peers", || {
        let (ids, want) = random_published(&pool, &others, 2 * MINE, &mut rng)?;
        let dst = shmem
            .alloc_device::<u8>(ids.len() * PAGE_BYTES)
            .map_err(e)?;
        pool.gather(&dst, &ids, shmem.stream()).map_err(e)?;
        sync(&shmem)?;
        compare("gathered pages", &dst.to_vec().map_err(e)?, &want)
    });

    c.run("host gather into u32 elements", || {
        let (ids, want) = random_published(&pool, &others, 3, &mut rng)?;
        let dst = shmem
            .alloc_device::<u32>(ids.len() * PAGE_BYTES / 4)
            .map_err(e)?;
        pool.gather(&dst, &ids, shmem.stream()).map_err(e)?;
        sync(&shmem)?;
        let got: Vec<u8> = dst
            .to_vec()
            .map_err(e)?
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        compare("gathered pages", &got, &want)
    });

    c.run("device-id gather skips ids that name no page", || {
        let (ids, published) = random_published(&pool, &others, MINE, &mut rng)?;
        let mut raw: Vec<u64> = ids.iter().map(|id| id.to_raw()).collect();
        // Two places whose ids name no page: they must keep what dst held.
        raw.insert(1, NO_PAGE);
        raw.push(PageId::new(me as u32, PAGES as u32).to_raw());
        let filler = vec![0xA5u8; PAGE_BYTES];
        let mut want = published[..PAGE_BYTES].to_vec();
        want.extend(&filler);
        want.extend(&published[PAGE_BYTES..]);
        want.extend(&filler);
        let ids_dev: DeviceBuffer<u64> = shmem.alloc_device(raw.len()).map_err(e)?;
        ids_dev.copy_from_host(&raw).map_err(e)?;
        let dst = shmem
            .alloc_device::<u8>(raw.len() * PAGE_BYTES)
            .map_err(e)?;
        dst.copy_from_host(&vec![0xA5u8; raw.len() * PAGE_BYTES])
            .map_err(e)?;
        pool.gather_device(&dst, &ids_dev, shmem.stream())
            .map_err(e)?;
        sync(&shmem)?;
        compare("gathered pages", &dst.to_vec().map_err(e)?, &want)
    });

    // Each PE writes round-2 data into the pages the next PE published.
    let next = (me + 1) % n;
    c.run("scatter into the next PE's pages", || {
        let mut ids = Vec::new();
        let mut src = Vec::new();
        for entry in 0..MINE {
            let id = pool
                .table_get(next, entry)
                .map_err(e)?
                .ok_or_else(|| format!("PE {next} published nothing in entry {entry}"))?;
            src.extend(pattern(2, me, id.pe, id.index));
            ids.push(id);
        }
        let dev = shmem.alloc_device::<u8>(src.len()).map_err(e)?;
        dev.copy_from_host(&src).map_err(e)?;
        pool.scatter(&ids, &dev, shmem.stream()).map_err(e)?;
        // Complete at the owner when the kernel ends; the barrier after the check orders it
        // before the owner's reads.
        sync(&shmem)
    });

    c.run("scattered pages hold the writer's data", || {
        let writer = (me + n - 1) % n;
        for &id in &mine {
            let got = pool
                .page_view(id.index as usize)
                .map_err(e)?
                .to_vec()
                .map_err(e)?;
            compare(
                &format!("{id} written by PE {writer}"),
                &got,
                &pattern(2, writer, id.pe, id.index),
            )?;
        }
        Ok(())
    });

    c.run("bad input gives the right error", || {
        let dst = shmem.alloc_device::<u8>(PAGE_BYTES).map_err(e)?;
        let stream = shmem.stream();
        expect_err("alloc on PE n", pool.alloc(n), |err| {
            matches!(err, Error::PeOutOfRange { pe, n_pes } if *pe == n && *n_pes == n)
        })?;
        let beyond = PageId::new(me as u32, PAGES as u32);
        expect_err("gather of a page past the end", pool.gather(&dst, &[beyond], stream), |err| {
            matches!(err, Error::PageOutOfRange { index, pages_per_pe, .. } if *index == PAGES && *pages_per_pe == PAGES)
        })?;
        let nowhere = PageId::new(n as u32, 0);
        expect_err("gather from PE n", pool.gather(&dst, &[nowhere], stream), |err| {
            matches!(err, Error::PeOutOfRange { .. })
        })?;
        let unused = (0..PAGES as u32)
            .map(|i| PageId::new(me as u32, i))
            .find(|id| !mine.contains(id))
            .ok_or("every page of this PE is in use")?;
        let not_allocated =
            |err: &Error| matches!(err, Error::PageNotAllocated { pe, index, .. } if *pe == me && *index == unused.index as usize);
        expect_err("gather of a page never allocated", pool.gather(&dst, &[unused], stream), not_allocated)?;
        expect_err("free of a page never allocated", pool.free(unused), not_allocated)?;
        if pool.is_allocated(unused).map_err(e)? {
            return Err(format!("{unused} reads as allocated"));
        }
        expect_err("gather into too small a buffer", pool.gather(&dst, &mine[..2], stream), |err| {
            matches!(err, Error::Length { expected, got, .. } if *expected == 2 * PAGE_BYTES && *got == PAGE_BYTES)
        })?;
        expect_err("table entry past the end", pool.table_get(me, TABLE), |err| {
            matches!(err, Error::IndexOutOfRange { index, len } if *index == TABLE && *len == TABLE)
        })?;
        expect_err("more pages than a PE holds", pool.alloc_n(me, PAGES + 1), |err| {
            matches!(err, Error::PoolExhausted { pe, requested, available, pages_per_pe, page_bytes }
                if *pe == me && *requested == PAGES + 1 && *available == PAGES - MINE
                    && *pages_per_pe == PAGES && *page_bytes == PAGE_BYTES)
        })?;
        let text = pool.alloc_n(me, PAGES + 1).unwrap_err().to_string();
        if !text.contains("pages_per_pe") {
            return Err(format!("the exhaustion message does not say what to raise: {text}"));
        }
        Ok(())
    });

    c.run("exhaustion, double free and reuse", || {
        // Five pages: the last bitmap word has padding bits that must never be handed out.
        let small = PagePool::new(&shmem, PagePoolConfig::new(5, 64).table_len(1)).map_err(e)?;
        let all = small.alloc_n(me, 5).map_err(e)?;
        let mut indices: Vec<u32> = all.iter().map(|id| id.index).collect();
        indices.sort_unstable();
        if indices != [0, 1, 2, 3, 4] {
            return Err(format!("5 pages of 5: {indices:?}"));
        }
        expect_err("a sixth page", small.alloc(me), |err| {
            matches!(
                err,
                Error::PoolExhausted {
                    available: 0,
                    requested: 1,
                    ..
                }
            )
        })?;
        small.free(all[2]).map_err(e)?;
        expect_err("a double free", small.free(all[2]), |err| {
            matches!(err, Error::PageNotAllocated { .. })
        })?;
        let again = small.alloc(me).map_err(e)?;
        if again != next_generation(all[2]) {
            return Err(format!(
                "freed {} but got {again}: expected the same page in the next generation",
                all[2]
            ));
        }
        small.free_n(&[all[1], all[3]]).map_err(e)?;
        // All or nothing: 3 asked for, 2 free; the 2 taken are given back.
        expect_err("3 pages of 2 free", small.alloc_n(me, 3), |err| {
            matches!(
                err,
                Error::PoolExhausted {
                    available: 2,
                    requested: 3,
                    ..
                }
            )
        })?;
        if small.in_use(me).map_err(e)? != 3 {
            return Err("a failed allocation kept pages".into());
        }
        let mut back: Vec<u32> = small
            .alloc_n(me, 2)
            .map_err(e)?
            .iter()
            .map(|id| id.index)
            .collect();
        back.sort_unstable();
        // `all` is in the threads' order, not the pages': its entries 1 and 3 are any pages.
        let mut freed = [all[1].index, all[3].index];
        freed.sort_unstable();
        if back != freed {
            return Err(format!(
                "reallocated {back:?}, expected the freed {freed:?}"
            ));
        }
        Ok(())
    });

    c.run(
        "concurrent allocation into PE 0 hands out every page once",
        || {
            // Room for everyone's pages and 5 more (padding in the last word).
            let pages = CONCURRENT * n + 5;
            let shared = PagePool::new(
                &shmem,
                PagePoolConfig::new(pages, 16).table_len(CONCURRENT * n),
            )
            .map_err(e)?;
            // Every PE allocates on PE 0 at once, in batches (no error returns before the
            // barrier, which every PE must reach).
            let mut got = Vec::new();
            let allocated: Result<(), String> = (0..CONCURRENT / BATCH).try_for_each(|_| {
                got.extend(shared.alloc_n(0, BATCH).map_err(e)?);
                Ok(())
            });
            let published: Result<(), String> = got.iter().enumerate().try_for_each(|(k, &id)| {
                shared
                    .table_set(0, me * CONCURRENT + k, Some(id))
                    .map_err(e)
            });
            shmem.barrier_all().map_err(e)?;
            // Checked between barriers that every PE reaches, whatever it finds.
            let verified = (|| {
                let mut seen = HashSet::new();
                for entry in 0..CONCURRENT * n {
                    let id = shared
                        .table_get(0, entry)
                        .map_err(e)?
                        .ok_or_else(|| format!("entry {entry} of PE 0 is empty"))?;
                    if id.pe != 0 || !seen.insert(id.index) {
                        return Err(format!("{id} handed out twice, or not on PE 0"));
                    }
                }
                match shared.in_use(0).map_err(e)? {
                    used if used == CONCURRENT * n => Ok(()),
                    used => Err(format!(
                        "{used} pages of PE 0 in use, expected {}",
                        CONCURRENT * n
                    )),
                }
            })();
            shmem.barrier_all().map_err(e)?;
            let freed = shared.free_n(&got).map_err(e);
            shmem.barrier_all().map_err(e)?;
            let emptied = match shared.in_use(0).map_err(e)? {
                0 => Ok(()),
                left => Err(format!(
                    "{left} pages of PE 0 still in use after every PE freed its own"
                )),
            };
            allocated
                .and(published)
                .and(verified)
                .and(freed)
                .and(emptied)
        },
    );

    c.run(
        "a stale id frees nothing and its page's new allocation lives (host)",
        || host_stale_free(&shmem),
    );

    c.run(
        "a stale id frees nothing and its page's new allocation lives (kernel)",
        || device_stale_free(&shmem),
    );

    c.run(
        "frees of one id racing in kernels on every PE: exactly one succeeds",
        || device_free_race(&shmem),
    );

    c.run(
        "a user's kernels allocate, write, publish and gather pages (nvshmem_rs/pool.cuh)",
        || device_side(&shmem),
    );

    c.run("freed pages of the main pool", || {
        // Every reader is done (the barrier after the last check): free this PE's pages.
        for entry in 0..MINE {
            pool.table_set(me, entry, None).map_err(e)?;
        }
        pool.free_n(&mine).map_err(e)?;
        match pool.in_use(me).map_err(e)? {
            0 => Ok(()),
            used => Err(format!("{used} pages still in use")),
        }
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
