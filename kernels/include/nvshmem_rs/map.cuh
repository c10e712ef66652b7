// Device functions of a symmetric hash map (nvshmem::map::SymmetricMap) for kernels: insert,
// look up and remove keys on any PE, by one thread, a warp or a block. The map arrives by
// value: `SymmetricMap::handle()` passed with `KernelArgs::value`, a `nvshmem_rs_map`
// parameter here. Each function returns a status of map.h (MAP_DONE, MAP_ABSENT, ...); a
// full owner, an absent key, a reserved key or a value too large is a status, never a trap.
//
// Memory ordering:
// - A value is complete before its key is visible: an insert claims a free slot (an NVSHMEM
//   compare-and-swap to MAP_BUSY_KEY), writes the value, completes it (nvshmem_quiet) and
//   only then stores the key. A lookup reads the key with acquire semantics before the value.
// - Operations on different keys may run at once from any PEs and threads: each slot is
//   claimed by one compare-and-swap, and lookups pass slots that are being written.
// - Operations on one key are the program's to order: two inserts of one key at once may
//   store it twice, and a lookup of a key while it is removed (and its slot taken again)
//   may copy a value being overwritten. Order them with a barrier, a signal, or a kernel
//   boundary, as the host API's calls on one stream are.
// - A removed key's slot is taken again by a later insert; a slot never returns to empty,
//   so a map whose owners saw many distinct keys fills up (SymmetricMap::clear).
#ifndef NVSHMEM_RS_MAP_CUH
#define NVSHMEM_RS_MAP_CUH

#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include "copy.cuh"
#include "map.h"

namespace nvshmem_rs {

// The hash that places keys (SplitMix64's finaliser): its high half picks the owner, its low
// half the home slot (32-bit arithmetic: a 64-bit remainder is a long routine on the GPU).
__device__ __forceinline__ uint64_t map_hash(uint64_t key) {
    key = (key ^ (key >> 30)) * 0xBF58476D1CE4E5B9ull;
    key = (key ^ (key >> 27)) * 0x94D049BB133111EBull;
    return key ^ (key >> 31);
}

// The PE that holds `key`.
__device__ __forceinline__ int32_t map_owner(const nvshmem_rs_map &map, uint64_t key) {
    return (int32_t)((map_hash(key) >> 32) % (uint32_t)map.n_pes);
}

// Whether `key` is one of the reserved words (map.h), which no operation takes.
__device__ __forceinline__ bool map_key_reserved(uint64_t key) {
    return key >= MAP_FIRST_RESERVED_KEY;
}

// The symmetric address of slot `slot`'s value (on every PE).
__device__ __forceinline__ char *map_value_sym(const nvshmem_rs_map &map, uint32_t slot) {
    return map.values + (uint64_t)slot * map.value_bytes;
}

namespace detail {

// `sym` on PE `pe` for loads and stores: this PE's own address when `pe` is this PE, else
// nvshmem_ptr's (nullptr when `pe` is reachable only through NVSHMEM calls).
template <typename T>
__device__ __forceinline__ T *map_peer(const nvshmem_rs_map &map, T *sym, int32_t pe) {
    return pe == map.my_pe ? sym : (T *)nvshmem_ptr(sym, pe);
}

// The first slot of `key`'s chain.
__device__ __forceinline__ uint32_t map_home(const nvshmem_rs_map &map, uint64_t key) {
    return (uint32_t)map_hash(key) % map.slots;
}

// Slot `slot`'s key word on PE `pe`, read with acquire semantics: the caller's later reads
// of the slot's value see the value the key was stored after. `keys` is the owner's key
// array as map_peer gives it, or nullptr when the owner is reachable only through
// NVSHMEM calls.
__device__ __forceinline__ uint64_t map_read_key(const nvshmem_rs_map &map, const uint64_t *keys,
                                                 uint32_t slot, int32_t pe) {
    if (keys != nullptr) {
        uint64_t word;
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];"
                     : "=l"(word)
                     : "l"(keys + slot)
                     : "memory");
        return word;
    }
    const uint64_t word = nvshmem_uint64_atomic_fetch(map.keys + slot, pe);
    __threadfence_system();
    return word;
}

// A ballot over LANES lanes of a warp (1: the calling thread alone).
template <int LANES>
__device__ __forceinline__ uint32_t map_ballot(bool p) {
    if (LANES == 1) return p ? 1u : 0u;
    return __ballot_sync(0xFFFFFFFFu, p);
}

// Bits of `mask` below bit `lane` (all of them for lane 32).
__device__ __forceinline__ uint32_t map_below(uint32_t mask, int lane) {
    return lane >= 32 ? mask : mask & ((1u << lane) - 1);
}

// What a probe found (and what a claim did: MAP_DONE with the claimed slot, MAP_EXISTS or
// MAP_FULL).
struct MapProbe {
    // MAP_DONE: `key` is at `slot`. MAP_ABSENT: it is not in the map, and `slot` is the first
    // free slot of its chain (`seen` holds its word: MAP_REMOVED_KEY or MAP_EMPTY_KEY), or
    // there is none (`seen` is MAP_BUSY_KEY).
    uint32_t status;
    uint32_t slot;
    uint64_t seen;
};

// Probe `key`'s chain on its owner `pe` from step `from` (step k is slot (home + k) % slots),
// LANES slots at a time (each lane reads one key word): up to the first empty slot, or
// every slot. `keys` is map_peer(map, map.keys, pe). Every lane calls and gets the same
// answer.
template <int LANES>
__device__ inline MapProbe map_probe(const nvshmem_rs_map &map, const uint64_t *keys,
                                     uint64_t key, int32_t pe, uint32_t from) {
    const uint32_t home = map_home(map, key);
    const uint32_t lane = LANES == 1 ? 0 : threadIdx.x % warpSize;
    MapProbe free_slot = {MAP_ABSENT, 0, MAP_BUSY_KEY};
    for (uint32_t base = from; base < map.slots; base += LANES) {
        // Steps stay below slots (at most 2^31 - 1), so home + step fits 32 bits.
        const uint32_t step = base + lane;
        const uint32_t slot = home + step >= map.slots ? home + step - map.slots : home + step;
        const uint64_t word = step < map.slots ? map_read_key(map, keys, slot, pe) : MAP_BUSY_KEY;
        const uint32_t empty = map_ballot<LANES>(word == MAP_EMPTY_KEY);
        const int stop = empty ? __ffs(empty) - 1 : 32;
        const uint32_t found = map_below(map_ballot<LANES>(word == key), stop);
        const uint32_t removed = map_below(map_ballot<LANES>(word == MAP_REMOVED_KEY), stop);
        if (found) {
            const int at = __ffs(found) - 1;
            return {MAP_DONE, LANES == 1 ? slot : __shfl_sync(0xFFFFFFFFu, slot, at), key};
        }
        if (free_slot.seen == MAP_BUSY_KEY && (removed || empty)) {
            const int at = removed ? __ffs(removed) - 1 : stop;
            const uint32_t s = LANES == 1 ? slot : __shfl_sync(0xFFFFFFFFu, slot, at);
            free_slot = {MAP_ABSENT, s, removed ? MAP_REMOVED_KEY : MAP_EMPTY_KEY};
        }
        if (empty) break;
    }
    return free_slot;
}

// Claim a free slot for `key` by LANES lanes of a warp (all calling with the same
// arguments; lane 0 makes the atomic calls): MAP_DONE and the slot, or why not.
template <int LANES>
__device__ inline MapProbe map_claim(const nvshmem_rs_map &map, uint64_t key) {
    const int32_t pe = map_owner(map, key);
    const uint64_t *keys = map_peer(map, (const uint64_t *)map.keys, pe);
    uint32_t from = 0;
    for (;;) {
        const MapProbe p = map_probe<LANES>(map, keys, key, pe, from);
        if (p.status == MAP_DONE) return {MAP_EXISTS, p.slot, key};
        if (p.seen == MAP_BUSY_KEY) return {MAP_FULL, 0, MAP_BUSY_KEY};
        uint64_t old = 0;
        if (LANES == 1 || threadIdx.x % warpSize == 0) {
            old = nvshmem_uint64_atomic_compare_swap(map.keys + p.slot, p.seen, MAP_BUSY_KEY, pe);
        }
        if (LANES > 1) old = __shfl_sync(0xFFFFFFFFu, old, 0);
        if (old == p.seen) return {MAP_DONE, p.slot, MAP_BUSY_KEY};
        if (old == key) return {MAP_EXISTS, p.slot, key};
        // Another insert took the slot first: go on from the step after it.
        const uint32_t home = map_home(map, key);
        from = (p.slot >= home ? p.slot - home : p.slot + map.slots - home) + 1;
    }
}

// f() run where a group's probe runs, its result in every thread of the group: by the
// calling thread or warp itself (the warp's barrier passes a lane's acquire of the key on to
// the others), or by a block's first warp, its thread 0's result shared with the block.
template <Group G, typename T, typename F>
__device__ __forceinline__ T probe_in(F f) {
    if constexpr (G == Group::Block) {
        __shared__ T shared;
        if (threadIdx.x < warpSize) {
            const T v = f();
            if (threadIdx.x == 0) shared = v;
        }
        __syncthreads();
        const T v = shared;
        __syncthreads();
        return v;
    } else {
        const T v = f();
        group_sync<G>();
        return v;
    }
}

// Write `bytes` of `value` into claimed slot `slot` of PE `pe`, zeros after them up to
// value_bytes, complete it, then store `key` there (group G, every thread calling).
template <Group G>
__device__ inline void map_publish(const nvshmem_rs_map &map, uint32_t slot, uint64_t key,
                                   const void *value, uint64_t bytes, int32_t pe) {
    char *sym = map_value_sym(map, slot);
    char *tail = map_peer(map, sym, pe);
    put_bytes_via<G>(tail, sym, (const char *)value, bytes, pe);
    for (uint64_t i = bytes + group_rank<G>(); i < map.value_bytes; i += group_size<G>()) {
        if (tail != nullptr) {
            tail[i] = 0;
        } else {
            nvshmem_char_p(sym + i, 0, pe);
        }
    }
    nvshmem_quiet();
    group_sync<G>();
    if (group_rank<G>() == 0) nvshmem_uint64_atomic_set(map.keys + slot, key, pe);
    group_sync<G>();
}

// The checks every operation starts with: MAP_DONE when it may go on.
__device__ __forceinline__ uint32_t map_check(const nvshmem_rs_map &map, uint64_t key,
                                              uint64_t bytes) {
    if (map_key_reserved(key)) return MAP_RESERVED;
    if (bytes > map.value_bytes) return MAP_TOO_LARGE;
    return MAP_DONE;
}

template <int LANES, Group G>
__device__ inline uint32_t map_insert_group(const nvshmem_rs_map &map, uint64_t key,
                                            const void *value, uint64_t bytes) {
    const uint32_t status = map_check(map, key, bytes);
    if (status != MAP_DONE) return status;
    // The probe claims the slot; the whole group writes the value.
    const MapProbe c = probe_in<G, MapProbe>([&] { return map_claim<LANES>(map, key); });
    if (c.status == MAP_DONE) map_publish<G>(map, c.slot, key, value, bytes, map_owner(map, key));
    return c.status;
}

template <int LANES, Group G>
__device__ inline uint32_t map_lookup_group(const nvshmem_rs_map &map, uint64_t key, void *dst) {
    if (map_key_reserved(key)) return MAP_RESERVED;
    const int32_t pe = map_owner(map, key);
    // Both peer addresses before the key's acquire, which makes later reads miss L1.
    const uint64_t *keys = map_peer(map, (const uint64_t *)map.keys, pe);
    const char *values = map_peer(map, (const char *)map.values, pe);
    const MapProbe p =
        probe_in<G, MapProbe>([&] { return map_probe<LANES>(map, keys, key, pe, 0); });
    if (p.status != MAP_DONE) return MAP_ABSENT;
    const uint64_t at = (uint64_t)p.slot * map.value_bytes;
    get_bytes_via<G>((char *)dst, values == nullptr ? nullptr : values + at, map.values + at,
                     map.value_bytes, pe);
    return MAP_DONE;
}

template <int LANES>
__device__ inline uint32_t map_remove_lanes(const nvshmem_rs_map &map, uint64_t key) {
    if (map_key_reserved(key)) return MAP_RESERVED;
    const int32_t pe = map_owner(map, key);
    const MapProbe p =
        map_probe<LANES>(map, map_peer(map, (const uint64_t *)map.keys, pe), key, pe, 0);
    if (p.status != MAP_DONE) return MAP_ABSENT;
    uint64_t old = 0;
    if (LANES == 1 || threadIdx.x % warpSize == 0) {
        old = nvshmem_uint64_atomic_compare_swap(map.keys + p.slot, key, MAP_REMOVED_KEY, pe);
    }
    if (LANES > 1) old = __shfl_sync(0xFFFFFFFFu, old, 0);
    return old == key ? MAP_DONE : MAP_ABSENT;
}

}  // namespace detail

// Insert `key` with the `bytes` bytes at `value` (at most value_bytes; the rest of the slot's
// value is zeroed): MAP_DONE, MAP_EXISTS (the key is there; nothing changes), MAP_FULL,
// MAP_RESERVED or MAP_TOO_LARGE. The value is complete at the owner before the key is
// visible. One thread.
__device__ inline uint32_t map_insert(const nvshmem_rs_map &map, uint64_t key, const void *value,
                                      uint64_t bytes) {
    return detail::map_insert_group<1, detail::Group::Thread>(map, key, value, bytes);
}

// map_insert by a whole warp (every lane calls with the same arguments, the warp converged):
// the probe reads 32 slots at a time and the lanes write the value.
__device__ inline uint32_t map_insert_warp(const nvshmem_rs_map &map, uint64_t key,
                                           const void *value, uint64_t bytes) {
    return detail::map_insert_group<32, detail::Group::Warp>(map, key, value, bytes);
}

// map_insert by a whole one-dimensional block of whole warps: its first warp probes, the
// block writes. Every thread gets the status.
__device__ inline uint32_t map_insert_block(const nvshmem_rs_map &map, uint64_t key,
                                            const void *value, uint64_t bytes) {
    return detail::map_insert_group<32, detail::Group::Block>(map, key, value, bytes);
}

// Copy `key`'s value (value_bytes bytes) into local `dst`: MAP_DONE, MAP_ABSENT (dst is left
// as it was) or MAP_RESERVED. One thread.
__device__ inline uint32_t map_lookup(const nvshmem_rs_map &map, uint64_t key, void *dst) {
    return detail::map_lookup_group<1, detail::Group::Thread>(map, key, dst);
}

// map_lookup by a whole warp (every lane calls with the same arguments).
__device__ inline uint32_t map_lookup_warp(const nvshmem_rs_map &map, uint64_t key, void *dst) {
    return detail::map_lookup_group<32, detail::Group::Warp>(map, key, dst);
}

// map_lookup by a whole block: its first warp probes, the block copies the value.
__device__ inline uint32_t map_lookup_block(const nvshmem_rs_map &map, uint64_t key, void *dst) {
    return detail::map_lookup_group<32, detail::Group::Block>(map, key, dst);
}

// Remove `key`: MAP_DONE, MAP_ABSENT or MAP_RESERVED. Its slot is taken again by a later
// insert, so nothing may still be reading the value (see the rules above). One thread.
__device__ inline uint32_t map_remove(const nvshmem_rs_map &map, uint64_t key) {
    return detail::map_remove_lanes<1>(map, key);
}

// map_remove by a whole warp (every lane calls with the same arguments).
__device__ inline uint32_t map_remove_warp(const nvshmem_rs_map &map, uint64_t key) {
    return detail::map_remove_lanes<32>(map, key);
}

// map_remove by a whole block: its first warp removes, every thread gets the status.
__device__ inline uint32_t map_remove_block(const nvshmem_rs_map &map, uint64_t key) {
    return detail::probe_in<detail::Group::Block, uint32_t>(
        [&] { return detail::map_remove_lanes<32>(map, key); });
}

}  // namespace nvshmem_rs

#endif
