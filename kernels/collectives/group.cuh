// The grouped all-reduce: up to COLL_GROUP_MAX buffers of one type and operator reduced in
// one launch, as one call (one epoch, one or two handshakes). For many small buffers
// (gradient buckets), where a launch and a handshake per buffer cost more than the data.
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "abi.h"
#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// Where thread `first` of `stride` starts in a buffer that follows `before` vectors of the
// others: the grid takes the buffers end to end, so that small ones spread over the blocks.
// The same on every PE, and in the push and the read of the one-shot (which must agree on
// which block moves which vector: its handshake is per block).
__device__ __forceinline__ size_t group_start(size_t first, size_t stride, unsigned long long before) {
    return (first + stride - (size_t)(before % stride)) % stride;
}

// What every PE's kernel compares in its handshakes (with the entry point and the count):
// the buffers' lengths, in order.
__device__ __forceinline__ uint64_t group_shape(const Group &g) {
    uint64_t h = 0;
    for (unsigned k = 0; k < g.count; k++) h = h * 0x100000001B3ull + g.entry[k].n + 1;
    return h;
}

// ---- one-shot: every buffer pushed into my slot of every peer's staging, one handshake,
// each PE reduces locally. The buffers' inputs sit end to end in the slot (at `off`).
template <typename T, typename Op>
__device__ void oneshot_allreduce_group(const Group &g, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    __shared__ char *peer_slot[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x)
        peer_slot[p] = (char *)nvshmem_ptr(base + (size_t)me * slot_bytes, p);
    __syncthreads();
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const unsigned count = g.count;

    for (unsigned k = 0; k < count; k++) {
        const GroupEntry x = g.entry[k];
        const T *src = (const T *)x.src;
        const size_t nvec = x.n / Vec<T>::N, tail = nvec * Vec<T>::N;
        for (size_t i = group_start(first, stride, x.before); i < nvec; i += stride) {
            const uint4 v = ld_cg((const uint4 *)src + i);
            for (int p = 0; p < npes; p++)
                if (p != me) ((uint4 *)(peer_slot[p] + x.off))[i] = v;
        }
        if (blockIdx.x == 0)
            for (size_t i = tail + threadIdx.x; i < x.n; i += blockDim.x) {
                const T v = ld_cg_t(src + i);
                for (int p = 0; p < npes; p++)
                    if (p != me) ((T *)(peer_slot[p] + x.off))[i] = v;
            }
    }
    // After a wait that gave up, only this PE's own (garbage) result follows.
    signal_and_wait(ctrl, flags, FLAGS_DATA, me, npes, e);

    for (unsigned k = 0; k < count; k++) {
        const GroupEntry x = g.entry[k];
        const T *src = (const T *)x.src;
        T *dst = (T *)x.dst;
        const size_t nvec = x.n / Vec<T>::N, tail = nvec * Vec<T>::N;
        auto src_of = [&](int p) -> const uint4 * {
            return p == me ? (const uint4 *)src : (const uint4 *)(base + (size_t)p * slot_bytes + x.off);
        };
        uint4 *outs[1] = {(uint4 *)dst};
        reduce_vectors<T, Op>(0, nvec, group_start(first, stride, x.before), stride, npes, src_of, outs, 1);
        auto src_of_t = [&](int p) -> const T * { return (const T *)src_of(p); };
        reduce_tail<T, Op>(tail, x.n, npes, src_of_t, [&](int) { return dst; }, 1);
    }
    finish_call(ctrl, e);
}

// ---- two-shot: no staging (the buffers are symmetric). After a start barrier, PE q reduces
// part q of every buffer from every PE's source (remote loads) into every PE's destination;
// an end barrier keeps the sources alive until every read is done.
template <typename T, typename Op>
__device__ void twoshot_allreduce_group(const Group &g, Ctrl *ctrl, uint64_t *flags) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    __shared__ const uint4 *peer_src[MAX_PES];
    __shared__ uint4 *peer_dst[MAX_PES];
    // A peer that never came: write nothing into the others, and send no end flag.
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const unsigned count = g.count;
    for (unsigned k = 0; k < count; k++) {
        const GroupEntry x = g.entry[k];
        __syncthreads();  // every thread is done with the last buffer's table
        for (int p = threadIdx.x; p < npes; p += blockDim.x) {
            peer_src[p] = (const uint4 *)nvshmem_ptr((const void *)x.src, p);
            peer_dst[p] = (uint4 *)nvshmem_ptr((void *)x.dst, p);
        }
        __syncthreads();
        const size_t nvec = x.n / Vec<T>::N, tail = nvec * Vec<T>::N;
        size_t mb, mend;
        part_of(nvec, me, npes, &mb, &mend);
        auto src_of = [&](int p) -> const uint4 * { return peer_src[p]; };
        reduce_vectors_any<T, Op>(mb, mend, group_start(first, stride, x.before / npes), stride, npes, src_of, peer_dst, npes);
        if (me == npes - 1) {
            auto src_of_t = [&](int p) -> const T * { return (const T *)peer_src[p]; };
            reduce_tail<T, Op>(tail, x.n, npes, src_of_t, [&](int p) { return (T *)peer_dst[p]; }, npes);
        }
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}
