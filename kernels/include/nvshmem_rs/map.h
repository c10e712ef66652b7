// The layout of a symmetric hash map as kernels see it: what `SymmetricMap::handle()` passes
// to a kernel by value, and what the device functions of nvshmem_rs/map.cuh take. Plain C,
// read by nvcc and by bindgen (for the Rust side), so both agree on it.
//
// Every PE holds `slots` slots: a key word each, and a value of value_bytes each. A key
// lives on one PE, its owner, chosen by its hash, and in the first free slot of that PE
// from a home slot chosen by its hash (open addressing, linear probing). A key word is a
// key, or one of three reserved words:
//   MAP_EMPTY_KEY    never used: a lookup that meets one stops (the key is absent);
//   MAP_REMOVED_KEY  a removed key's slot: lookups go on past it, inserts take it again;
//   MAP_BUSY_KEY     claimed by an insert that is writing the value.
// So the three largest 64-bit words are not keys (MAP_FIRST_RESERVED_KEY and above).
#ifndef NVSHMEM_RS_MAP_H
#define NVSHMEM_RS_MAP_H

#include <stdint.h>

#define MAP_EMPTY_KEY 0xFFFFFFFFFFFFFFFFull
#define MAP_REMOVED_KEY 0xFFFFFFFFFFFFFFFEull
#define MAP_BUSY_KEY 0xFFFFFFFFFFFFFFFDull
// Keys from here up are reserved.
#define MAP_FIRST_RESERVED_KEY 0xFFFFFFFFFFFFFFFDull
// Values start on this boundary and their size is a multiple of it (vector copies).
#define MAP_VALUE_ALIGN 16
// Bytes of a value at most.
#define MAP_MAX_VALUE_BYTES 65536
// Slots per PE at most.
#define MAP_MAX_SLOTS 0x7FFFFFFF

// What an operation did, as the batched kernels write it and the device functions return it.
// Done: the insert stored the value, the lookup copied it, the remove removed the key.
#define MAP_DONE 0
// The key is not in the map (lookup, remove).
#define MAP_ABSENT 1
// The key is in the map already; the insert changed nothing.
#define MAP_EXISTS 2
// Every slot of the key's owner is taken; the insert changed nothing.
#define MAP_FULL 3
// The key is one of the reserved words; nothing was done.
#define MAP_RESERVED 4
// The value is larger than the map's value_bytes; nothing was done.
#define MAP_TOO_LARGE 5

/// A symmetric hash map: `slots` key words and `slots` values of `value_bytes` on every PE.
typedef struct nvshmem_rs_map {
    /// Symmetric, slots words: on PE p, word i is slot i's key (or a reserved word), changed
    /// only by NVSHMEM atomics.
    uint64_t *keys;
    /// Symmetric, slots * value_bytes: slot i's value is values + i * value_bytes.
    char *values;
    /// Bytes of a value, a positive multiple of MAP_VALUE_ALIGN, at most MAP_MAX_VALUE_BYTES.
    uint64_t value_bytes;
    /// Slots each PE holds, at least 1 and at most MAP_MAX_SLOTS.
    uint32_t slots;
    /// This PE.
    int32_t my_pe;
    /// The number of PEs.
    int32_t n_pes;
} nvshmem_rs_map;

#endif
