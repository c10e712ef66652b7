//! A user's kernels (checks/kernels/kv_pool_device.cu) driving the pool through
//! `nvshmem_rs/pool.cuh`.

use nvshmem::module::{grid, KernelArgs, Module};
use nvshmem::pool::{PageId, PagePool, PagePoolConfig};
use nvshmem::Nvshmem;

/// The kernels of the device-side check (checks/kernels/kv_pool_device.cu).
use nvshmem_checks::kernels;

use crate::harness::{compare, e, Outcome};
use crate::PAGE_BYTES;

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
pub(crate) fn device_side(shmem: &Nvshmem) -> Outcome {
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
