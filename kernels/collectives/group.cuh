// The grouped all-reduce: up to COLL_GROUP_MAX buffers of one type and operator reduced in
// one launch, as one call (one epoch, one or two handshakes). For many small buffers
// (gradient buckets), where a launch and a handshake per buffer cost more than the data.
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "abi.h"
#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// The buffers are one run of 16-byte vectors end to end: vector v of the run is vector
// v - before of the last buffer that starts at or before it. Each thread takes UNROLL
// vectors of the run at once, wherever they fall, so that small buffers spread over the
// grid and every thread keeps several loads in flight. The same on every PE, and in the push
// and the read of the one-shot (which must agree on which block moves which vector: its
// handshake is per block).
__device__ __forceinline__ unsigned group_entry_of(const Group &g, unsigned count, unsigned long long v) {
    unsigned lo = 0, hi = count;
    while (hi - lo > 1) {
        const unsigned mid = (lo + hi) / 2;
        if (g.entry[mid].before <= v) lo = mid;
        else hi = mid;
    }
    return lo;
}

// The vectors of the run.
template <typename T> __device__ __forceinline__ size_t group_vectors(const Group &g, unsigned count) {
    const GroupEntry &last = g.entry[count - 1];
    return last.before + last.n / Vec<T>::N;
}

// Where the UNROLL vectors v0 + u * stride of the run are: buffer k[u], vector i[u] of it
// (a vector past `end` is given the last one's buffer; its callers skip it).
__device__ __forceinline__ void group_locate(const Group &g, unsigned count, size_t v0, size_t stride, size_t end,
                                             unsigned k[UNROLL], size_t i[UNROLL]) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const size_t v = v0 + u * stride;
        k[u] = group_entry_of(g, count, v < end ? v : end - 1);
        i[u] = v - g.entry[k[u]].before;
    }
}

// What every PE's kernel compares in its handshakes (with the entry point and the count):
// the buffers' lengths, in order.
__device__ __forceinline__ uint64_t group_shape(const Group &g) {
    uint64_t h = 0;
    for (unsigned k = 0; k < g.count; k++) h = h * 0x100000001B3ull + g.entry[k].n + 1;
    return h;
}

// Vectors [begin, end) of the run reduced in PE order into every one of `outs` PEs'
// destinations: `src_of(p, k)` is where PE p's input of buffer k starts, `out_of(o, k)`
// where output o of buffer k does.
template <typename T, typename Op, typename SrcOf, typename OutOf>
__device__ __forceinline__ void group_reduce(const Group &g, unsigned count, size_t begin, size_t end, size_t first,
                                             size_t stride, int npes, SrcOf src_of, OutOf out_of, int outs) {
    for (size_t v0 = begin + first; v0 < end; v0 += stride * UNROLL) {
        unsigned k[UNROLL];
        size_t i[UNROLL];
        group_locate(g, count, v0, stride, end, k, i);
        Vec<T> acc[UNROLL];
        for (int p = 0; p < npes; p++) {
            uint4 raw[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                raw[u] = v0 + u * stride < end ? ld_cg(src_of(p, k[u]) + i[u]) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (p == 0) acc[u].load(raw[u]);
                else acc[u].template combine<Op>(raw[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            if (v0 + u * stride < end) {
                const uint4 r = acc[u].store();
                for (int o = 0; o < outs; o++) out_of(o, k[u])[i[u]] = r;
            }
    }
}

// ---- one-shot: every buffer pushed into my slot of every peer's staging, one handshake,
// each PE reduces locally. The buffers' inputs sit end to end in the slot (at `off`); the
// tails (past each buffer's last whole vector) go by block 0.
template <typename T, typename Op>
__device__ void oneshot_allreduce_group(const Group &g, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    __shared__ char *peer_slot[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x)
        peer_slot[p] = (char *)peer_ptr(ctrl, base + (size_t)me * slot_bytes, p);
    __syncthreads();
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const unsigned count = g.count;
    const size_t total = group_vectors<T>(g, count);

    for (size_t v0 = first; v0 < total; v0 += stride * UNROLL) {
        uint4 val[UNROLL];
        unsigned k[UNROLL];
        size_t i[UNROLL];
        group_locate(g, count, v0, stride, total, k, i);
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            if (v0 + u * stride < total) val[u] = ld_cg((const uint4 *)g.entry[k[u]].src + i[u]);
        for (int p = 0; p < npes; p++) {
            if (p == me) continue;
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (v0 + u * stride < total) ((uint4 *)(peer_slot[p] + g.entry[k[u]].off))[i[u]] = val[u];
        }
    }
    if (blockIdx.x == 0)
        for (unsigned k = 0; k < count; k++) {
            const GroupEntry &x = g.entry[k];
            const T *src = (const T *)x.src;
            for (size_t i = x.n / Vec<T>::N * Vec<T>::N + threadIdx.x; i < x.n; i += blockDim.x) {
                const T v = ld_cg_t(src + i);
                for (int p = 0; p < npes; p++)
                    if (p != me) ((T *)(peer_slot[p] + x.off))[i] = v;
            }
        }
    // After a wait that gave up, only this PE's own (garbage) result follows.
    signal_and_wait(ctrl, flags, FLAGS_DATA, me, npes, e);

    auto src_of = [&](int p, unsigned k) -> const uint4 * {
        return p == me ? (const uint4 *)g.entry[k].src : (const uint4 *)(base + (size_t)p * slot_bytes + g.entry[k].off);
    };
    group_reduce<T, Op>(g, count, 0, total, first, stride, npes, src_of,
                        [&](int, unsigned k) { return (uint4 *)g.entry[k].dst; }, 1);
    for (unsigned k = 0; k < count; k++) {
        auto src_of_t = [&](int p) -> const T * { return (const T *)src_of(p, k); };
        T *dst = (T *)g.entry[k].dst;
        reduce_tail<T, Op>(g.entry[k].n / Vec<T>::N * Vec<T>::N, g.entry[k].n, npes, src_of_t, [&](int) { return dst; }, 1);
    }
    finish_call(ctrl, e);
}

// ---- two-shot: no staging (the buffers are symmetric). After a start barrier, PE q reduces
// part q of the run from every PE's sources (remote loads) into every PE's destinations; an
// end barrier keeps the sources alive until every read is done. A peer's copy of a buffer
// is the buffer's address plus that peer's heap offset (`delta`), as peer_ptr maps it.
template <typename T, typename Op>
__device__ void twoshot_allreduce_group(const Group &g, Ctrl *ctrl, uint64_t *flags) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    __shared__ long long delta[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x)
        delta[p] = (const char *)peer_ptr(ctrl, (const void *)g.entry[0].src, p) - (const char *)g.entry[0].src;
    // A peer that never came: write nothing into the others, and send no end flag.
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const unsigned count = g.count;
    const size_t total = group_vectors<T>(g, count);
    size_t mb, mend;
    part_of(total, me, npes, &mb, &mend);
    auto src_of = [&](int p, unsigned k) -> const uint4 * { return (const uint4 *)((const char *)g.entry[k].src + delta[p]); };
    auto out_of = [&](int p, unsigned k) -> uint4 * { return (uint4 *)((char *)g.entry[k].dst + delta[p]); };
    group_reduce<T, Op>(g, count, mb, mend, first, stride, npes, src_of, out_of, npes);
    if (me == npes - 1)
        for (unsigned k = 0; k < count; k++) {
            auto src_of_t = [&](int p) -> const T * { return (const T *)src_of(p, k); };
            auto out_t = [&](int p) -> T * { return (T *)out_of(p, k); };
            reduce_tail<T, Op>(g.entry[k].n / Vec<T>::N * Vec<T>::N, g.entry[k].n, npes, src_of_t, out_t, npes);
        }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}
