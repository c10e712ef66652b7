// Broadcast and all-to-all: data that moves without being reduced, from one PE to all (the
// broadcast) or from every PE to every PE in blocks (the all-to-all).
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/oneshot.cuh"

// 16 bytes at any address: one vector where it is aligned, bytes otherwise (blocks of an
// all-to-all whose size is not a multiple of 16 start anywhere).
__device__ __forceinline__ uint4 load16(const char *p) {
    if (((size_t)p & 15) == 0) return ld_cg((const uint4 *)p);
    uint4 v;
    char *c = (char *)&v;
#pragma unroll
    for (int k = 0; k < 16; k++) c[k] = ld_cg_t(p + k);
    return v;
}

__device__ __forceinline__ void store16(char *p, uint4 v) {
    if (((size_t)p & 15) == 0) {
        *(uint4 *)p = v;
        return;
    }
    const char *c = (const char *)&v;
#pragma unroll
    for (int k = 0; k < 16; k++) p[k] = c[k];
}

// Copy `bytes` from `from` to `to` (either may live on a peer) with the thread-to-byte mapping
// every kernel here uses: vector i by thread i of the grid (strided), the tail by block 0. A
// reader of data that a peer pushed this way reads exactly what its own block's handshake
// covers.
__device__ __forceinline__ void copy_mapped(char *to, const char *from, size_t bytes) {
    const size_t nvec = bytes / 16, tail = nvec * 16;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = first; i < nvec; i += stride) store16(to + i * 16, load16(from + i * 16));
    if (blockIdx.x == 0)
        for (size_t i = tail + threadIdx.x; i < bytes; i += blockDim.x) to[i] = ld_cg_t(from + i);
}

// ---- broadcast ----------------------------------------------------------------------------
// One-shot: the root pushes its input into its slot of every peer's staging, one handshake
// (every PE with every PE, which keeps any PE from running two calls ahead of another, as the
// staging's parity needs), then every PE copies the root's slot into dst; the root copies its
// input unless the call is in place.
__device__ void oneshot_broadcast(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes, int root) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    if (me == root) push_to_peers(src, bytes, base, slot_bytes, me, npes);
    if (!signal_and_wait(ctrl, flags, FLAGS_DATA, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    const char *from = me == root ? src : base + (size_t)root * slot_bytes;
    if (from != dst) copy_mapped(dst, from, bytes);
    finish_call(ctrl, e);
}

// Push: a start barrier (every PE has entered the call, so its dst is free to overwrite), the
// root stores its input straight into every PE's dst over all blocks, and an end barrier
// (the root's stores have landed). No staging, so any size.
__device__ void push_broadcast(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, int root) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    if (me == root) {
        for (int p = 0; p < npes; p++) {
            char *to = p == me ? dst : (char *)nvshmem_ptr(dst, p);
            if (to != src) copy_mapped(to, src, bytes);
        }
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}

// ---- all-to-all ---------------------------------------------------------------------------
// src and dst hold npes blocks of `bytes`: block q of PE p's src becomes block p of PE q's dst.

// One-shot: block q of my input into my slot of PE q's staging, one handshake, then every
// PE copies slot p into block p of dst (its own block straight from its input).
__device__ void oneshot_alltoall(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    for (int p = 0; p < npes; p++) {
        if (p == me) continue;
        char *slot = (char *)nvshmem_ptr(base + (size_t)me * slot_bytes, p);
        copy_mapped(slot, src + (size_t)p * bytes, bytes);
    }
    if (!signal_and_wait(ctrl, flags, FLAGS_DATA, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    for (int p = 0; p < npes; p++) {
        const char *from = p == me ? src + (size_t)me * bytes : base + (size_t)p * slot_bytes;
        copy_mapped(dst + (size_t)p * bytes, from, bytes);
    }
    finish_call(ctrl, e);
}

// Push: a start barrier (every PE's dst is free), block q of my input stored straight into
// block me of PE q's dst, and an end barrier. No staging, so any size.
__device__ void push_alltoall(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    // Start with the next PE, so that the PEs do not all store into PE 0 first.
    for (int k = 0; k < npes; k++) {
        const int p = (me + k) % npes;
        char *to = (p == me ? dst : (char *)nvshmem_ptr(dst, p)) + (size_t)me * bytes;
        copy_mapped(to, src + (size_t)p * bytes, bytes);
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}
