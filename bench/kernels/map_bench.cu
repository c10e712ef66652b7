// The map benchmark's latency kernel (bench/src/map.rs): one warp looks up keys one after
// another, each lookup's key depending on the previous value's first bytes, so the time per
// lookup is a whole lookup (probe and value) and not an overlap of several; it includes the
// read of those bytes back from the destination.
#include <stdint.h>

#include <nvshmem_rs/map.cuh>

using namespace nvshmem_rs;

// Look up keys[0..n) in turn into dst (value i at i * value_bytes), status[i] each. `mask`
// is 0 at run time: key i + 1 is keys[i + 1] ^ (the first word of value i & mask), which the
// compiler cannot drop, so lookup i + 1 starts once value i has arrived.
extern "C" __global__ void map_bench_chain(nvshmem_rs_map map, const uint64_t *keys, uint32_t n,
                                           char *dst, uint32_t *status, uint64_t mask) {
    uint64_t carry = 0, next = n > 0 ? keys[0] : 0;
    for (uint32_t i = 0; i < n; i++) {
        char *at = dst + (uint64_t)i * map.value_bytes;
        // The key in hand before the lookup, as a caller's would be.
        const uint64_t key = next;
        if (i + 1 < n) next = keys[i + 1];
        const uint32_t s = map_lookup_warp(map, key ^ (carry & mask), at);
        if (threadIdx.x == 0) status[i] = s;
        // Lane 0 stored the value's first 16 bytes itself (the copy's first vector).
        carry = __shfl_sync(0xFFFFFFFFu, threadIdx.x == 0 ? *(volatile uint64_t *)at : 0, 0);
    }
}
