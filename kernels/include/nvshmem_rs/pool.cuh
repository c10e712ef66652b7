// Device functions of a page pool (nvshmem::pool::PagePool) for kernels: allocate and free
// pages on any PE, publish and read page ids through the page table, and copy pages between
// any PE and local memory. The pool arrives by value: `PagePool::handle()` passed with
// `KernelArgs::value`, a `nvshmem_rs_pool` parameter here.
//
// Memory ordering (the same rules as the host API):
// - pool_alloc and pool_free are NVSHMEM atomics on the owning PE's bitmap and page states: a
//   page is handed out once until it is freed, whichever PEs and threads allocate at once,
//   and of the frees of one id exactly one succeeds.
// - Ids carry the page's generation (pool.h): a free of an id whose page was freed since,
//   and maybe allocated again, fails and leaves the page as it is; pool_is_allocated says
//   false for it. The copies (pool_gather_*, pool_scatter_*) do not read the generation:
//   they copy whatever page the id's PE and index name.
// - A writer makes a page's contents complete before it publishes the page's id:
//   pool_scatter_* and pool_table_publish do this for the calling block or thread
//   (nvshmem_quiet); other writes need their own nvshmem_quiet (or a signal) first.
// - A reader reads the id (pool_table_read, or a signal it waited for), then the page.
// - A page is freed only once every reader and writer is done with it: that is the user's
//   protocol (a barrier, a signal, a reference count). pool_free makes the calling thread's
//   own puts complete first.
#ifndef NVSHMEM_RS_POOL_CUH
#define NVSHMEM_RS_POOL_CUH

#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include "copy.cuh"
#include "pool.h"

namespace nvshmem_rs {

// The fields of an id (pool.h: generation, PE, index from high to low bits).
constexpr uint64_t POOL_INDEX_MASK = (1ull << POOL_INDEX_BITS) - 1;
constexpr uint64_t POOL_PE_MASK = (1ull << POOL_PE_BITS) - 1;
constexpr uint64_t POOL_GENERATION_MASK = (1ull << POOL_GENERATION_BITS) - 1;
static_assert(POOL_INDEX_BITS + POOL_PE_BITS + POOL_GENERATION_BITS == 64, "ids are 64 bits");
static_assert(POOL_MAX_PAGES == 1ull << POOL_INDEX_BITS, "every index fits its field");
static_assert(POOL_MAX_PES == POOL_PE_MASK, "the all-ones PE field (POOL_NO_PAGE's) is no PE");

// The id of page `index` of PE `pe` in generation `generation` (each within its field).
__device__ __forceinline__ uint64_t pool_page_id(int32_t pe, uint32_t index, uint32_t generation) {
    return ((uint64_t)generation << (POOL_PE_BITS + POOL_INDEX_BITS)) |
           ((uint64_t)(uint32_t)pe << POOL_INDEX_BITS) | index;
}
__device__ __forceinline__ int32_t pool_page_pe(uint64_t id) {
    return (int32_t)((id >> POOL_INDEX_BITS) & POOL_PE_MASK);
}
__device__ __forceinline__ uint32_t pool_page_index(uint64_t id) {
    return (uint32_t)(id & POOL_INDEX_MASK);
}
__device__ __forceinline__ uint32_t pool_page_generation(uint64_t id) {
    return (uint32_t)(id >> (POOL_PE_BITS + POOL_INDEX_BITS));
}

// Whether `id` names a page of the pool, of any generation (allocated or not); POOL_NO_PAGE
// does not.
__device__ __forceinline__ bool pool_page_valid(const nvshmem_rs_pool &pool, uint64_t id) {
    return pool_page_pe(id) < pool.n_pes && pool_page_index(id) < pool.pages_per_pe;
}

// Words of the bitmap: a bit per page, rounded up without `pages + 63` (which wraps in 32
// bits for the largest pools).
__device__ __forceinline__ uint32_t pool_bitmap_words(const nvshmem_rs_pool &pool) {
    return pool.pages_per_pe / POOL_WORD_PAGES + (pool.pages_per_pe % POOL_WORD_PAGES != 0);
}

// The page's symmetric address: pass it with pool_page_pe(id) to NVSHMEM calls.
__device__ __forceinline__ char *pool_page_sym(const nvshmem_rs_pool &pool, uint64_t id) {
    return pool.pages + (uint64_t)pool_page_index(id) * pool.page_bytes;
}

// The page's address for loads and stores from this GPU (NVLink or PCIe peer access, or this
// PE's own page), or nullptr when its PE is reachable only through NVSHMEM calls.
__device__ __forceinline__ char *pool_page_ptr(const nvshmem_rs_pool &pool, uint64_t id) {
    return (char *)nvshmem_ptr(pool_page_sym(pool, id), pool_page_pe(id));
}

namespace detail {

// A well-mixed 64-bit value of x: where an allocation starts looking.
__device__ __forceinline__ uint64_t pool_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Page `index` of PE `pe`, whose bitmap bit this thread has just claimed: marked allocated
// in its state, which returns the generation for the id.
__device__ inline uint64_t pool_take(const nvshmem_rs_pool &pool, int32_t pe, uint32_t index) {
    // The bit was cleared by a free after it advanced the state: that change comes first.
    __threadfence_system();
    const uint64_t state = nvshmem_uint64_atomic_fetch_or(pool.states + index, 1ull, pe);
    return pool_page_id(pe, index, (uint32_t)(state >> 1));
}

}  // namespace detail

// Allocate a page on PE `pe` (one thread): its id, or POOL_NO_PAGE when every page of `pe` is
// allocated (or `pe` is out of range). Probes bitmap words from a random one with fetch_or
// of a random bit: a probe claims that page when it is free, and otherwise reads the word
// (setting a set bit changes nothing), so with room in the pool an allocation takes two
// atomics, the claim and the state. A word with a clear bit is claimed at its lowest; a bit
// another thread claimed first is skipped.
__device__ inline uint64_t pool_alloc(const nvshmem_rs_pool &pool, int32_t pe) {
    if (pe < 0 || pe >= pool.n_pes) return POOL_NO_PAGE;
    const uint32_t words = pool_bitmap_words(pool);
    // Threads, PEs and calls start at different places, so that allocations rarely meet.
    const uint64_t thread = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    const uint64_t r =
        detail::pool_mix((uint64_t)clock64() ^ (thread << 24) ^ ((uint64_t)pool.my_pe << 48));
    const uint32_t start = (uint32_t)(r % words);
    const uint64_t guess = 1ull << (r >> 58);
    for (uint32_t k = 0; k < words; k++) {
        const uint32_t w = (start + k) % words;
        uint64_t *word = pool.bitmap + w;
        uint64_t mask = guess;
        uint64_t old = nvshmem_uint64_atomic_fetch_or(word, mask, pe);
        while ((old & mask) != 0 && old != ~0ull) {
            mask = 1ull << (__ffsll((long long)~old) - 1);
            old = nvshmem_uint64_atomic_fetch_or(word, mask, pe);
        }
        if ((old & mask) == 0) {
            const uint32_t bit = __ffsll((long long)mask) - 1;
            return detail::pool_take(pool, pe, w * POOL_WORD_PAGES + bit);
        }
    }
    return POOL_NO_PAGE;
}

// Free page `id` (one thread): true if it was allocated in the id's generation, false if not
// (a double free, a stale id, a page never allocated) or `id` is not a page of the pool;
// a false free changes nothing. This thread's puts complete first.
__device__ inline bool pool_free(const nvshmem_rs_pool &pool, uint64_t id) {
    if (!pool_page_valid(pool, id)) return false;
    nvshmem_quiet();
    const int32_t pe = pool_page_pe(id);
    const uint32_t i = pool_page_index(id);
    const uint64_t g = pool_page_generation(id);
    const uint64_t live = (g << 1) | 1;
    const uint64_t next = ((g + 1) & POOL_GENERATION_MASK) << 1;
    // One free of an id wins the swap; the others, and stale ids, see another state.
    if (nvshmem_uint64_atomic_compare_swap(pool.states + i, live, next, pe) != live) return false;
    // Only then is the page free to claim, its new generation in place.
    __threadfence_system();
    const uint64_t mask = 1ull << (i % POOL_WORD_PAGES);
    nvshmem_uint64_atomic_fetch_and(pool.bitmap + i / POOL_WORD_PAGES, ~mask, pe);
    return true;
}

// Whether page `id` is allocated now in the id's generation (one thread).
__device__ inline bool pool_is_allocated(const nvshmem_rs_pool &pool, uint64_t id) {
    if (!pool_page_valid(pool, id)) return false;
    const uint64_t state =
        nvshmem_uint64_atomic_fetch(pool.states + pool_page_index(id), pool_page_pe(id));
    return state == (((uint64_t)pool_page_generation(id) << 1) | 1);
}

// Write `id` into entry `entry` of PE `pe`'s page table (one thread), after this thread's
// puts are complete: the page's contents are visible before its id is.
__device__ inline void pool_table_publish(const nvshmem_rs_pool &pool, int32_t pe, uint32_t entry,
                                          uint64_t id) {
    nvshmem_quiet();
    nvshmem_uint64_atomic_set(pool.table + entry, id, pe);
}

// Entry `entry` of PE `pe`'s page table (one thread). The fence keeps this thread's later
// reads of the page after the read of its id.
__device__ inline uint64_t pool_table_read(const nvshmem_rs_pool &pool, int32_t pe,
                                           uint32_t entry) {
    const uint64_t id = nvshmem_uint64_atomic_fetch(pool.table + entry, pe);
    __threadfence_system();
    return id;
}

// Copy `bytes` at symmetric address `sym` of PE `pe` into local `dst`, by every thread of the
// block (each must call it with the same arguments).
__device__ inline void pool_get_block(char *dst, const char *sym, uint64_t bytes, int32_t pe) {
    detail::get_bytes<detail::Group::Block>(dst, sym, bytes, pe);
}

// Copy `bytes` of local `src` to symmetric address `sym` of PE `pe`, by every thread of the
// block; complete at `pe` once pool_quiet_block (or nvshmem_quiet) has run.
__device__ inline void pool_put_block(char *sym, const char *src, uint64_t bytes, int32_t pe) {
    detail::put_bytes<detail::Group::Block>(sym, src, bytes, pe);
}

// The warp forms: every lane of the warp calls with the same arguments.
__device__ inline void pool_get_warp(char *dst, const char *sym, uint64_t bytes, int32_t pe) {
    detail::get_bytes<detail::Group::Warp>(dst, sym, bytes, pe);
}

__device__ inline void pool_put_warp(char *sym, const char *src, uint64_t bytes, int32_t pe) {
    detail::put_bytes<detail::Group::Warp>(sym, src, bytes, pe);
}

// Make the block's puts and stores complete at their PEs (every thread of the block calls).
__device__ inline void pool_quiet_block() {
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
    __syncthreads();
}

namespace detail {

// f(offset, id) for each k in 0..n whose ids[k] names a page of the pool, offset being
// k * page_bytes: where page k lies in the caller's local buffer. Other ids are skipped.
template <typename F>
__device__ __forceinline__ void for_each_page(const nvshmem_rs_pool &pool, const uint64_t *ids,
                                              uint32_t n, F f) {
    for (uint32_t k = 0; k < n; k++) {
        const uint64_t id = ids[k];
        if (pool_page_valid(pool, id)) f((uint64_t)k * pool.page_bytes, id);
    }
}

}  // namespace detail

// The block copies pages ids[0..n) into dst, page k at dst + k * page_bytes. Ids that name no
// page of the pool (POOL_NO_PAGE among them) are skipped, their place in dst left as it was;
// generations are not read (an id's PE and index name the page).
__device__ inline void pool_gather_block(const nvshmem_rs_pool &pool, char *dst,
                                         const uint64_t *ids, uint32_t n) {
    detail::for_each_page(pool, ids, n, [&](uint64_t at, uint64_t id) {
        pool_get_block(dst + at, pool_page_sym(pool, id), pool.page_bytes, pool_page_pe(id));
    });
}

// The block writes src (page k at src + k * page_bytes) into pages ids[0..n), skipping ids
// that name no page, and returns once the writes are complete at their PEs.
__device__ inline void pool_scatter_block(const nvshmem_rs_pool &pool, const uint64_t *ids,
                                          const char *src, uint32_t n) {
    detail::for_each_page(pool, ids, n, [&](uint64_t at, uint64_t id) {
        pool_put_block(pool_page_sym(pool, id), src + at, pool.page_bytes, pool_page_pe(id));
    });
    pool_quiet_block();
}

// The warp forms of gather and scatter (every lane calls).
__device__ inline void pool_gather_warp(const nvshmem_rs_pool &pool, char *dst,
                                        const uint64_t *ids, uint32_t n) {
    detail::for_each_page(pool, ids, n, [&](uint64_t at, uint64_t id) {
        pool_get_warp(dst + at, pool_page_sym(pool, id), pool.page_bytes, pool_page_pe(id));
    });
}

__device__ inline void pool_scatter_warp(const nvshmem_rs_pool &pool, const uint64_t *ids,
                                         const char *src, uint32_t n) {
    detail::for_each_page(pool, ids, n, [&](uint64_t at, uint64_t id) {
        pool_put_warp(pool_page_sym(pool, id), src + at, pool.page_bytes, pool_page_pe(id));
    });
    __syncwarp();
    if (threadIdx.x % warpSize == 0) nvshmem_quiet();
    __syncwarp();
}

}  // namespace nvshmem_rs

#endif
