// Copies between local memory and a symmetric address of any PE, by one thread, a warp or a
// block: loads and stores where the peer is load/store reachable (nvshmem_ptr), NVSHMEM's
// get and put otherwise. What the page pool and the map copy pages and values with.
#ifndef NVSHMEM_RS_COPY_CUH
#define NVSHMEM_RS_COPY_CUH

#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

namespace nvshmem_rs {
namespace detail {

// Who runs a copy: every thread of the group calls it with the same arguments. Blocks are
// one-dimensional.
enum class Group { Thread, Warp, Block };

template <Group G>
__device__ __forceinline__ uint32_t group_rank() {
    return G == Group::Thread ? 0 : G == Group::Warp ? threadIdx.x % warpSize : threadIdx.x;
}

template <Group G>
__device__ __forceinline__ uint32_t group_size() {
    return G == Group::Thread ? 1 : G == Group::Warp ? warpSize : blockDim.x;
}

template <Group G>
__device__ __forceinline__ void group_sync() {
    if (G == Group::Warp) __syncwarp();
    if (G == Group::Block) __syncthreads();
}

// Copy `bytes` from src to dst by `size` threads of rank `rank`: 16-byte vectors when both
// addresses and the length allow (four loads in flight per thread), bytes otherwise. Loads
// bypass L1, so that memory a peer rewrote is not read from a stale line.
__device__ __forceinline__ void copy_bytes(char *dst, const char *src, uint64_t bytes,
                                           uint32_t rank, uint32_t size) {
    if ((((uintptr_t)dst | (uintptr_t)src | bytes) & 15) == 0) {
        uint4 *d = (uint4 *)dst;
        const uint4 *s = (const uint4 *)src;
        const uint64_t n = bytes / 16;
        uint64_t i = rank;
        for (; i + 3 * (uint64_t)size < n; i += 4 * (uint64_t)size) {
            const uint4 a = __ldcg(s + i), b = __ldcg(s + i + size);
            const uint4 c = __ldcg(s + i + 2 * size), e = __ldcg(s + i + 3 * size);
            d[i] = a;
            d[i + size] = b;
            d[i + 2 * size] = c;
            d[i + 3 * size] = e;
        }
        for (; i < n; i += size) d[i] = __ldcg(s + i);
    } else {
        for (uint64_t i = rank; i < bytes; i += size) dst[i] = __ldcg(src + i);
    }
}

// Copy `bytes` at symmetric address `sym` of PE `pe` into local `dst`; `src` is
// nvshmem_ptr(sym, pe), found by the caller.
template <Group G>
__device__ __forceinline__ void get_bytes_via(char *dst, const char *src, const char *sym,
                                              uint64_t bytes, int32_t pe) {
    if (src != nullptr) {
        copy_bytes(dst, src, bytes, group_rank<G>(), group_size<G>());
    } else if (G == Group::Block) {
        nvshmemx_getmem_block(dst, sym, bytes, pe);
    } else if (G == Group::Warp) {
        nvshmemx_getmem_warp(dst, sym, bytes, pe);
    } else {
        nvshmem_getmem(dst, sym, bytes, pe);
    }
}

// Copy `bytes` at symmetric address `sym` of PE `pe` into local `dst`.
template <Group G>
__device__ __forceinline__ void get_bytes(char *dst, const char *sym, uint64_t bytes, int32_t pe) {
    get_bytes_via<G>(dst, (const char *)nvshmem_ptr(sym, pe), sym, bytes, pe);
}

// Copy `bytes` of local `src` to symmetric address `sym` of PE `pe`; complete at `pe` once
// the writing threads have run nvshmem_quiet. `dst` is nvshmem_ptr(sym, pe), found by the
// caller.
template <Group G>
__device__ __forceinline__ void put_bytes_via(char *dst, char *sym, const char *src,
                                              uint64_t bytes, int32_t pe) {
    if (dst != nullptr) {
        copy_bytes(dst, src, bytes, group_rank<G>(), group_size<G>());
    } else if (G == Group::Block) {
        nvshmemx_putmem_block(sym, src, bytes, pe);
    } else if (G == Group::Warp) {
        nvshmemx_putmem_warp(sym, src, bytes, pe);
    } else {
        nvshmem_putmem(sym, src, bytes, pe);
    }
}

// Copy `bytes` of local `src` to symmetric address `sym` of PE `pe`, as put_bytes_via.
template <Group G>
__device__ __forceinline__ void put_bytes(char *sym, const char *src, uint64_t bytes, int32_t pe) {
    put_bytes_via<G>((char *)nvshmem_ptr(sym, pe), sym, src, bytes, pe);
}

}  // namespace detail
}  // namespace nvshmem_rs

#endif
