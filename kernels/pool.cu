// The page pool's kernels (src/pool): what the host API launches. Device code of users'
// kernels calls the same functions, from nvshmem_rs/pool.cuh.
#include <stdint.h>

#include "abi.h"
#include "nvshmem_rs/pool.cuh"

using namespace nvshmem_rs;

// Thread i allocates a page on PE `pe` into ids[i] (POOL_NO_PAGE when there was none).
extern "C" __global__ void pool_alloc_pages(nvshmem_rs_pool pool, int32_t pe, uint32_t n,
                                            uint64_t *ids) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ids[i] = pool_alloc(pool, pe);
}

// Thread i frees page ids[i]; done[i] = 1 if it was allocated in the id's generation, 0 if
// not (a double free, a stale id).
extern "C" __global__ void pool_free_pages(nvshmem_rs_pool pool, const uint64_t *ids, uint32_t n,
                                           uint64_t *done) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) done[i] = pool_free(pool, ids[i]) ? 1 : 0;
}

// Thread i: allocated[i] = 1 if page ids[i] is allocated now in the id's generation, 0 if not.
extern "C" __global__ void pool_check_pages(nvshmem_rs_pool pool, const uint64_t *ids, uint32_t n,
                                            uint64_t *allocated) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) allocated[i] = pool_is_allocated(pool, ids[i]) ? 1 : 0;
}

// Thread i reads word i of symmetric `words` on PE `pe` atomically into out[i] (the bitmap
// and the sizes the PEs compare at construction).
extern "C" __global__ void pool_read_words(const uint64_t *words, int32_t pe, uint32_t n,
                                           uint64_t *out) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = nvshmem_uint64_atomic_fetch(words + i, pe);
}

// f(at, piece, len, pe) for every piece of the pages ids[0..n) that name a page of the pool:
// `at` is where the piece lies in the caller's local buffer (page k at k * page_bytes),
// `piece` its symmetric address, on PE `pe`. Pages are cut into pieces of chunk_bytes; block b
// takes piece b % chunks of page b / chunks (then b + gridDim.x, ...).
template <typename F>
__device__ __forceinline__ void for_each_piece(const nvshmem_rs_pool &pool, const uint64_t *ids,
                                               uint32_t n, uint64_t chunk_bytes, F f) {
    const uint64_t chunks = (pool.page_bytes + chunk_bytes - 1) / chunk_bytes;
    for (uint64_t b = blockIdx.x; b < n * chunks; b += gridDim.x) {
        const uint64_t k = b / chunks, off = (b % chunks) * chunk_bytes;
        const uint64_t id = ids[k];
        if (!pool_page_valid(pool, id)) continue;
        f(k * pool.page_bytes + off, pool_page_sym(pool, id) + off,
          min(chunk_bytes, pool.page_bytes - off), pool_page_pe(id));
    }
}

// Page k of ids into dst + k * page_bytes. Ids that name no page are skipped.
extern "C" __global__ void pool_gather(nvshmem_rs_pool pool, char *dst, const uint64_t *ids,
                                       uint32_t n, uint64_t chunk_bytes) {
    for_each_piece(pool, ids, n, chunk_bytes, [&](uint64_t at, char *piece, uint64_t len, int32_t pe) {
        pool_get_block(dst + at, piece, len, pe);
    });
}

// The reverse of pool_gather: src + k * page_bytes into page k of ids, complete at the pages'
// PEs when the kernel ends.
extern "C" __global__ void pool_scatter(nvshmem_rs_pool pool, const uint64_t *ids, const char *src,
                                        uint32_t n, uint64_t chunk_bytes) {
    for_each_piece(pool, ids, n, chunk_bytes, [&](uint64_t at, char *piece, uint64_t len, int32_t pe) {
        pool_put_block(piece, src + at, len, pe);
    });
    pool_quiet_block();
}
