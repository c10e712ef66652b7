// Reduce-scatter: PE q ends with block q of every PE's src, reduced in PE order; and the reduce to
// one root, its pull with one owner.
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// ---- pull reduce-scatter ------------------------------------------------------------------
// No staging: after a start barrier (every PE's src ready), each PE reads its block of every
// PE's src (remote loads), reduces in PE order into its own dst; an end barrier keeps src
// alive until every PE's reads are done. src holds npes blocks of n elements; dst holds n.
// Blocks on 16-byte boundaries go by vectors, others element by element.
template <typename T, typename Op>
__device__ void pull_reducescatter(const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    __shared__ const T *peer_block[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x)
        peer_block[p] = (const T *)peer_ptr(ctrl, src, p) + (size_t)me * n;
    // A peer that never came: read nothing, and send no end flag.
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }

    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if ((n * sizeof(T)) % 16 == 0) {
        const size_t nvec = n / Vec<T>::N;
        auto src_of = [&](int p) -> const uint4 * { return (const uint4 *)peer_block[p]; };
        uint4 *out = (uint4 *)dst;
        reduce_vectors_any<T, Op>(0, nvec, first, stride, npes, src_of, &out, 1);
    } else {
        for (size_t i = first; i < n; i += stride) {
            typename Acc<T>::type a = to_acc<T>(ld_cg_t(peer_block[0] + i));
            for (int p = 1; p < npes; p++) a = Op::apply(a, to_acc<T>(ld_cg_t(peer_block[p] + i)));
            dst[i] = from_acc<T>(a);
        }
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}

// ---- pull reduce --------------------------------------------------------------------------
// The reduce-scatter's pull with one owner: after a start barrier, the root reads every PE's
// src (remote loads), reduces it in PE order into its dst; an end barrier keeps the inputs
// alive until the root has read them. The other PEs only take part in the barriers (their dst
// is left as it is). src and dst hold n elements; the root may reduce in place (each thread
// reads an element of its own src before it writes that element).
template <typename T, typename Op>
__device__ void pull_reduce(const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, int root) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    __shared__ const T *peer_src[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x) peer_src[p] = (const T *)peer_ptr(ctrl, src, p);
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    if (me == root) {
        const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        const size_t stride = (size_t)gridDim.x * blockDim.x;
        const size_t nvec = n / Vec<T>::N, tail = nvec * Vec<T>::N;
        auto src_of = [&](int p) -> const uint4 * { return (const uint4 *)peer_src[p]; };
        uint4 *out = (uint4 *)dst;
        reduce_vectors_any<T, Op>(0, nvec, first, stride, npes, src_of, &out, 1);
        auto src_of_t = [&](int p) -> const T * { return peer_src[p]; };
        reduce_tail<T, Op>(tail, n, npes, src_of_t, [&](int) { return dst; }, 1);
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}
