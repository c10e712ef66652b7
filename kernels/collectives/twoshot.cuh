// Two-shot all-reduce: reduce-scatter then all-gather with remote loads, no staging.
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// ---- two-shot all-reduce ------------------------------------------------------------------
// No staging: after a start barrier (every PE's src ready and dst free), PE q reads part q of
// every PE's src (remote loads), reduces, and writes the result into every PE's dst; an end
// barrier keeps src alive until all reads are done and makes dst complete. PE q owns vectors
// [nvec * q / npes, nvec * (q + 1) / npes).
template <typename T, typename Op>
__device__ void twoshot_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    __shared__ const uint4 *peer_src[MAX_PES];
    __shared__ uint4 *peer_dst[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        peer_src[p] = (const uint4 *)peer_ptr(ctrl, src, p);
        peer_dst[p] = (uint4 *)peer_ptr(ctrl, dst, p);
    }
    // A peer that never came: write nothing into the others, and send no end flag.
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }

    const size_t nvec = n / Vec<T>::N;
    const size_t tail = nvec * Vec<T>::N;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t mb, mend;
    part_of(nvec, me, npes, &mb, &mend);
    auto src_of = [&](int p) -> const uint4 * { return peer_src[p]; };
    reduce_vectors_any<T, Op>(mb, mend, first, stride, npes, src_of, peer_dst, npes);
    if (me == npes - 1) {
        auto src_of_t = [&](int p) -> const T * { return (const T *)peer_src[p]; };
        reduce_tail<T, Op>(tail, n, npes, src_of_t, [&](int p) { return (T *)peer_dst[p]; }, npes);
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}
