// The symmetric map's kernels (src/map): the batched operations the host API launches. Users'
// kernels call the same device functions, from nvshmem_rs/map.cuh.
#include <stdint.h>

#include "abi.h"
#include "nvshmem_rs/map.cuh"

using namespace nvshmem_rs;

namespace {

// The warps of the grid, and this thread's warp among them.
__device__ __forceinline__ uint32_t warps_in_grid() { return gridDim.x * blockDim.x / warpSize; }
__device__ __forceinline__ uint32_t warp_in_grid() {
    return (blockIdx.x * blockDim.x + threadIdx.x) / warpSize;
}
__device__ __forceinline__ bool lane_zero() { return threadIdx.x % warpSize == 0; }

}  // namespace

// Insert keys[i] with the value at values + i * value_bytes, for i in 0..n; status[i] says
// what happened. One warp per key (warp w takes w, w + warps, ...).
extern "C" __global__ void map_insert_warps(nvshmem_rs_map map, const uint64_t *keys,
                                            const char *values, uint32_t n, uint32_t *status) {
    for (uint32_t i = warp_in_grid(); i < n; i += warps_in_grid()) {
        const uint32_t s = map_insert_warp(map, keys[i], values + (uint64_t)i * map.value_bytes,
                                           map.value_bytes);
        if (lane_zero()) status[i] = s;
    }
}

// map_insert_warps with one block per key, for large values.
extern "C" __global__ void map_insert_blocks(nvshmem_rs_map map, const uint64_t *keys,
                                             const char *values, uint32_t n, uint32_t *status) {
    for (uint32_t i = blockIdx.x; i < n; i += gridDim.x) {
        const uint32_t s = map_insert_block(map, keys[i], values + (uint64_t)i * map.value_bytes,
                                            map.value_bytes);
        if (threadIdx.x == 0) status[i] = s;
    }
}

// Copy the value of keys[i] to dst + i * value_bytes, for i in 0..n (left as it was for an
// absent key); status[i] says which. One warp per key.
extern "C" __global__ void map_lookup_warps(nvshmem_rs_map map, char *dst, const uint64_t *keys,
                                            uint32_t n, uint32_t *status) {
    for (uint32_t i = warp_in_grid(); i < n; i += warps_in_grid()) {
        const uint32_t s = map_lookup_warp(map, keys[i], dst + (uint64_t)i * map.value_bytes);
        if (lane_zero()) status[i] = s;
    }
}

// map_lookup_warps with one block per key, for large values.
extern "C" __global__ void map_lookup_blocks(nvshmem_rs_map map, char *dst, const uint64_t *keys,
                                             uint32_t n, uint32_t *status) {
    for (uint32_t i = blockIdx.x; i < n; i += gridDim.x) {
        const uint32_t s = map_lookup_block(map, keys[i], dst + (uint64_t)i * map.value_bytes);
        if (threadIdx.x == 0) status[i] = s;
    }
}

// Remove keys[i] for i in 0..n; status[i] says whether it was there. One warp per key.
extern "C" __global__ void map_remove_warps(nvshmem_rs_map map, const uint64_t *keys, uint32_t n,
                                            uint32_t *status) {
    for (uint32_t i = warp_in_grid(); i < n; i += warps_in_grid()) {
        const uint32_t s = map_remove_warp(map, keys[i]);
        if (lane_zero()) status[i] = s;
    }
}

// Count the slots of PE `pe` by their key word (one block): counts[0] keys, [1] removed,
// [2] being written, [3] empty.
extern "C" __global__ void map_count_slots(nvshmem_rs_map map, int32_t pe, uint64_t *counts) {
    __shared__ unsigned long long total[4];
    if (threadIdx.x < 4) total[threadIdx.x] = 0;
    __syncthreads();
    const uint64_t *keys = detail::map_peer(map, (const uint64_t *)map.keys, pe);
    for (uint32_t s = threadIdx.x; s < map.slots; s += blockDim.x) {
        const uint64_t word = detail::map_read_key(map, keys, s, pe);
        const int k = word == MAP_EMPTY_KEY     ? 3
                      : word == MAP_BUSY_KEY    ? 2
                      : word == MAP_REMOVED_KEY ? 1
                                                : 0;
        atomicAdd(total + k, 1ull);
    }
    __syncthreads();
    if (threadIdx.x < 4) counts[threadIdx.x] = total[threadIdx.x];
}
