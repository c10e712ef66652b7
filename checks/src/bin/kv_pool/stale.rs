//! Stale ids, their pages freed and allocated again: freed from the host and from a kernel
//! they free nothing, and of many frees of one id racing in kernels exactly one succeeds.

use nvshmem::module::{grid, KernelArgs, Module};
use nvshmem::pool::{PageId, PagePool, PagePoolConfig};
use nvshmem::{Error, Nvshmem};

use nvshmem_checks::kernels;

use crate::harness::{compare, e, expect_err, pattern, sync, Outcome};
use crate::PAGE_BYTES;

/// Blocks of every PE's kernel in the free race: half free one id, half allocate.
const RACE_BLOCKS: u32 = 16;
/// Allocations an allocating block of the race tries before it gives up.
const RACE_TRIES: u32 = 1000;

/// The id of `id`'s page in the generation after it (what its next allocation gets).
pub(crate) fn next_generation(id: PageId) -> PageId {
    id.with_generation((id.generation + 1) % PageId::GENERATIONS)
}

/// A stale id freed from the host: page `a` allocated and freed, `b` allocated (the same page:
/// each PE holds one), then `a` freed again must be `PageNotAllocated` and leave `b`
/// allocated, readable and writable; a and b's frees of their own succeed once each.
pub(crate) fn host_stale_free(shmem: &Nvshmem) -> Outcome {
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
pub(crate) fn device_stale_free(shmem: &Nvshmem) -> Outcome {
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
pub(crate) fn device_free_race(shmem: &Nvshmem) -> Outcome {
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
