// A user's kernels on a symmetric map (checks/src/bin/map_check/device.rs): the thread, warp
// and block forms of nvshmem_rs/map.cuh, built as a dependent crate's kernels are.
#include <stdint.h>

#include <nvshmem_rs/map.cuh>

using namespace nvshmem_rs;

// Byte i of the value a kernel stores for `key` (device_value in device.rs).
__device__ __forceinline__ char device_value(uint64_t key, uint64_t i) {
    return (char)(uint8_t)(key * 131 + i * 7 + (key >> 17));
}

// Bytes the form stores: the warp form leaves the last 3 of the slot to the map's zeros.
__device__ __forceinline__ uint64_t form_bytes(const nvshmem_rs_map &map, uint32_t form) {
    return form == 1 ? map.value_bytes - 3 : map.value_bytes;
}

// Block `form` (0: one thread, 1: a warp, 2: the block) inserts keys[form * per_form ..]
// one at a time, building each value in scratch; status[k] gets what each insert did.
extern "C" __global__ void map_device_insert(nvshmem_rs_map map, const uint64_t *keys,
                                             uint32_t per_form, char *scratch, uint32_t *status) {
    const uint32_t form = blockIdx.x;
    char *value = scratch + form * map.value_bytes;
    for (uint32_t k = form * per_form; k < (form + 1) * per_form; k++) {
        for (uint64_t i = threadIdx.x; i < map.value_bytes; i += blockDim.x) {
            value[i] = device_value(keys[k], i);
        }
        __syncthreads();
        uint32_t s = 0;
        const uint64_t bytes = form_bytes(map, form);
        if (form == 0 && threadIdx.x == 0) s = map_insert(map, keys[k], value, bytes);
        if (form == 1 && threadIdx.x < warpSize) s = map_insert_warp(map, keys[k], value, bytes);
        if (form == 2) s = map_insert_block(map, keys[k], value, bytes);
        if (threadIdx.x == 0) status[k] = s;
        __syncthreads();
    }
}

// Block `form` looks up keys[form * per_form ..] into dst (value k at k * value_bytes).
extern "C" __global__ void map_device_lookup(nvshmem_rs_map map, const uint64_t *keys,
                                             uint32_t per_form, char *dst, uint32_t *status) {
    const uint32_t form = blockIdx.x;
    for (uint32_t k = form * per_form; k < (form + 1) * per_form; k++) {
        char *at = dst + (uint64_t)k * map.value_bytes;
        uint32_t s = 0;
        if (form == 0 && threadIdx.x == 0) s = map_lookup(map, keys[k], at);
        if (form == 1 && threadIdx.x < warpSize) s = map_lookup_warp(map, keys[k], at);
        if (form == 2) s = map_lookup_block(map, keys[k], at);
        if (threadIdx.x == 0) status[k] = s;
        __syncthreads();
    }
}

// Block `form` removes keys[form * per_form ..].
extern "C" __global__ void map_device_remove(nvshmem_rs_map map, const uint64_t *keys,
                                             uint32_t per_form, uint32_t *status) {
    const uint32_t form = blockIdx.x;
    for (uint32_t k = form * per_form; k < (form + 1) * per_form; k++) {
        uint32_t s = 0;
        if (form == 0 && threadIdx.x == 0) s = map_remove(map, keys[k]);
        if (form == 1 && threadIdx.x < warpSize) s = map_remove_warp(map, keys[k]);
        if (form == 2) s = map_remove_block(map, keys[k]);
        if (threadIdx.x == 0) status[k] = s;
        __syncthreads();
    }
}

// Bad input in a kernel gives statuses (one block): a value one byte too large, then the
// three reserved words through the three forms.
extern "C" __global__ void map_device_bad(nvshmem_rs_map map, uint64_t key, char *scratch,
                                          uint32_t *status) {
    uint32_t s[4] = {0, 0, 0, 0};
    if (threadIdx.x == 0) s[0] = map_insert(map, key, scratch, map.value_bytes + 1);
    if (threadIdx.x < warpSize) s[1] = map_insert_warp(map, MAP_EMPTY_KEY, scratch, 16);
    if (threadIdx.x == 0) s[2] = map_lookup(map, MAP_REMOVED_KEY, scratch);
    s[3] = map_remove_block(map, MAP_BUSY_KEY);
    if (threadIdx.x == 0) {
        for (int i = 0; i < 4; i++) status[i] = s[i];
    }
}
