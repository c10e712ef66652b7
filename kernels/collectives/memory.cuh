// Memory operations with the ordering and caching our collectives rely on.
#pragma once

#include <stdint.h>

// Release store and acquire load at system scope: a flag written after data stores, and the
// wait for it on another GPU.
__device__ __forceinline__ void st_release_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Relaxed store at system scope: a flag that orders nothing before it within its kernel (what
// it stands for happened in an earlier kernel), so it needs no fence.
__device__ __forceinline__ void st_relaxed_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Every load of data that another PE, or an earlier call, may have written goes to L2 (.cg),
// never through L1: with programmatic launches (see enter_call) a call begins while the one
// before it still runs, so this SM's L1 may hold lines that the previous call loaded before
// peers overwrote them; L2 is where peers' stores land, so it is never stale.
__device__ __forceinline__ uint4 ld_cg(const uint4 *p) { return __ldcg(p); }

template <typename T> __device__ __forceinline__ T ld_cg_t(const T *p) {
    static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4, "1, 2 or 4 bytes");
    T v;
    if constexpr (sizeof(T) == 1) {
        const unsigned char r = __ldcg((const unsigned char *)p);
        memcpy(&v, &r, 1);
    } else if constexpr (sizeof(T) == 2) {
        const unsigned short r = __ldcg((const unsigned short *)p);
        memcpy(&v, &r, 2);
    } else {
        const unsigned int r = __ldcg((const unsigned int *)p);
        memcpy(&v, &r, 4);
    }
    return v;
}

// Reduce vector i of the sources (PE order) into dst; `src_of(p)` gives PE p's copy.
// UNROLL independent vectors per thread keep several loads in flight.

// Polls of data a peer writes in place (low-latency lines, sentinel vectors): volatile, so
// every load goes to memory, and one 16-byte access, so no word of it is torn.
__device__ __forceinline__ uint4 ld_volatile(const uint4 *p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_volatile(uint4 *p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

