// One-shot all-reduce and all-gather: every PE pushes its input into every peer's staging
// slot, one flag handshake, then each PE finishes locally.
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// Push n elements of src into this PE's slot (at `base + me * slot_bytes`) on every peer:
// 16-byte vectors spread over the grid, the tail by block 0. A reader must take each vector
// from the same block index that pushed it (its handshake covers only that block).
template <typename E>
__device__ __forceinline__ void push_to_peers(const Ctrl *ctrl, const E *src, size_t n, char *base, size_t slot_bytes, int me, int npes) {
    __shared__ uint4 *peer_slot[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x)
        peer_slot[p] = (uint4 *)peer_ptr(ctrl, base + (size_t)me * slot_bytes, p);
    __syncthreads();
    const size_t nvec = n * sizeof(E) / 16, tail = nvec * 16 / sizeof(E);
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const uint4 *src4 = (const uint4 *)src;
    for (size_t i = first; i < nvec; i += stride) {
        const uint4 v = ld_cg(src4 + i);
        for (int p = 0; p < npes; p++)
            if (p != me) peer_slot[p][i] = v;
    }
    if (blockIdx.x == 0)
        for (size_t i = tail + threadIdx.x; i < n; i += blockDim.x)
            for (int p = 0; p < npes; p++)
                if (p != me) ((E *)peer_slot[p])[i] = ld_cg_t(src + i);
}

// The one-shot exchange of call e: my n elements of src into my slot of this epoch's staging
// on every peer, then one handshake. Returns where this epoch's slots are here
// (staging[parity][source PE][slot_bytes]), each holding its source's input.
template <typename E>
__device__ __forceinline__ char *oneshot_exchange(Ctrl *ctrl, const E *src, size_t n, uint64_t e, uint64_t *flags, char *staging, size_t slot_bytes, int me, int npes) {
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    push_to_peers(ctrl, src, n, base, slot_bytes, me, npes);
    // After a wait that gave up, only this PE's own (garbage) result follows.
    signal_and_wait(ctrl, flags, FLAGS_DATA, me, npes, e);
    return base;
}

// ---- one-shot all-reduce ------------------------------------------------------------------
// Push the input into every peer's staging slot, one handshake, reduce locally.
template <typename T, typename Op>
__device__ void oneshot_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    char *base = oneshot_exchange(ctrl, src, n, e, flags, staging, slot_bytes, me, npes);

    const size_t nvec = n / Vec<T>::N;
    const size_t tail = nvec * Vec<T>::N;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    auto src_of = [&](int p) -> const uint4 * {
        return p == me ? (const uint4 *)src : (const uint4 *)(base + (size_t)p * slot_bytes);
    };
    uint4 *outs[1] = {(uint4 *)dst};
    reduce_vectors<T, Op>(0, nvec, first, stride, npes, src_of, outs, 1);
    auto src_of_t = [&](int p) -> const T * { return (const T *)src_of(p); };
    reduce_tail<T, Op>(tail, n, npes, src_of_t, [&](int) { return dst; }, 1);
    finish_call(ctrl, e);
}

// ---- all-gather ---------------------------------------------------------------------------
// One-shot: push my input into every peer's staging slot, one handshake, copy the slots into
// dst locally (writing a peer's dst directly would race with its use of the previous result).
__device__ void oneshot_allgather(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    char *base = oneshot_exchange(ctrl, src, bytes, e, flags, staging, slot_bytes, me, npes);
    const size_t nvec = bytes / 16, tail = nvec * 16;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const uint4 *src4 = (const uint4 *)src;
    // Each block copies exactly the vectors its peers' same block pushed (the only ones its
    // handshake covers), and block 0 the tail. When bytes is not a multiple of 16 the output
    // blocks are not 16-byte aligned and the vectors are stored bytewise.
    for (int p = 0; p < npes; p++) {
        const uint4 *from = p == me ? src4 : (const uint4 *)(base + (size_t)p * slot_bytes);
        char *to = dst + (size_t)p * bytes;
        if (((size_t)to & 15) == 0) {
            for (size_t i = first; i < nvec; i += stride) ((uint4 *)to)[i] = ld_cg(from + i);
        } else {
            for (size_t i = first; i < nvec; i += stride) {
                uint4 v = ld_cg(from + i);
                const char *c = (const char *)&v;
#pragma unroll
                for (int k = 0; k < 16; k++) to[i * 16 + k] = c[k];
            }
        }
        if (blockIdx.x == 0)
            for (size_t i = tail + threadIdx.x; i < bytes; i += blockDim.x) to[i] = ld_cg_t((const char *)from + i);
    }
    finish_call(ctrl, e);
}
