// Kernels of checks/src/bin/kv_pool/, written as a user's: they allocate, write, publish, gather
// and free pages of the pool from the device, through <nvshmem_rs/pool.cuh>.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include <nvshmem_rs/pool.cuh>

// Byte i of the k-th page written by PE p (kv_pool.rs repeats it).
__device__ __forceinline__ uint8_t device_pattern(uint32_t p, uint32_t k, uint64_t i) {
    return (uint8_t)(p * 37u + k * 11u + (uint32_t)i * 3u + (uint32_t)(i >> 8));
}

// One block: page k allocated on PE my_pe + 1 + k (mod n_pes), each filled with device_pattern through
// `staging` (count pages of local memory), written with a block put, completed, then
// published in entries 0..count of this PE's page table. A page that cannot be allocated is
// published as POOL_NO_PAGE.
extern "C" __global__ void kv_device_produce(nvshmem_rs_pool pool, uint32_t count, char *staging) {
    __shared__ uint64_t id;
    for (uint32_t k = 0; k < count; k++) {
        if (threadIdx.x == 0) id = nvshmem_rs::pool_alloc(pool, (pool.my_pe + 1 + k) % pool.n_pes);
        char *page = staging + (uint64_t)k * pool.page_bytes;
        for (uint64_t i = threadIdx.x; i < pool.page_bytes; i += blockDim.x)
            page[i] = (char)device_pattern((uint32_t)pool.my_pe, k, i);
        __syncthreads();
        if (id != POOL_NO_PAGE)
            nvshmem_rs::pool_put_block(nvshmem_rs::pool_page_sym(pool, id), page, pool.page_bytes,
                                       nvshmem_rs::pool_page_pe(id));
        nvshmem_rs::pool_quiet_block();
        if (threadIdx.x == 0) nvshmem_rs::pool_table_publish(pool, pool.my_pe, k, id);
        __syncthreads();
    }
}

// One block: the ids in entries 0..count of PE `from`'s page table into ids, then those pages
// gathered into dst.
extern "C" __global__ void kv_device_consume(nvshmem_rs_pool pool, int32_t from, uint32_t count,
                                             uint64_t *ids, char *dst) {
    for (uint32_t k = threadIdx.x; k < count; k += blockDim.x)
        ids[k] = nvshmem_rs::pool_table_read(pool, from, k);
    __syncthreads();
    nvshmem_rs::pool_gather_block(pool, dst, ids, count);
}

// One thread: a stale id freed from a kernel. Page a is allocated on PE `pe` and freed, then
// page b allocated there (the same page, when each PE holds one), then a freed again. out:
// a, whether a's first free succeeded, b, whether a's second (stale) free did, whether b and
// a are allocated at the end.
extern "C" __global__ void kv_device_stale_free(nvshmem_rs_pool pool, int32_t pe, uint64_t *out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const uint64_t a = nvshmem_rs::pool_alloc(pool, pe);
    out[0] = a;
    out[1] = nvshmem_rs::pool_free(pool, a) ? 1 : 0;
    const uint64_t b = nvshmem_rs::pool_alloc(pool, pe);
    out[2] = b;
    out[3] = nvshmem_rs::pool_free(pool, a) ? 1 : 0;
    out[4] = nvshmem_rs::pool_is_allocated(pool, b) ? 1 : 0;
    out[5] = nvshmem_rs::pool_is_allocated(pool, a) ? 1 : 0;
}

// Thread 0 of every block, all at once: even blocks free `id` (done[b] = 1 if that free
// succeeded, 0 if not), odd blocks allocate on id's PE, up to `tries` times until a page
// comes (done[b] = its id, or POOL_NO_PAGE).
extern "C" __global__ void kv_device_free_race(nvshmem_rs_pool pool, uint64_t id, uint32_t tries,
                                               uint64_t *done) {
    if (threadIdx.x != 0) return;
    uint64_t result = POOL_NO_PAGE;
    if (blockIdx.x % 2 == 0) {
        result = nvshmem_rs::pool_free(pool, id) ? 1 : 0;
    } else {
        for (uint32_t t = 0; t < tries && result == POOL_NO_PAGE; t++)
            result = nvshmem_rs::pool_alloc(pool, nvshmem_rs::pool_page_pe(id));
    }
    done[blockIdx.x] = result;
}
