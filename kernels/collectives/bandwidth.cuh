// The bandwidth paths for large messages: a store-only, pipelined reduce-scatter and
// all-gather for the all-reduce, and a push into every PE's output for the all-gather.
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/reduce.cuh"

// ---- bandwidth all-reduce ----------------------------------------------------------------
// PE q owns part q of the vectors. Each part is cut into chunks dealt round-robin to the
// blocks: in round r, block b handles chunk r * gridDim.x + b of every part. A block pushes
// its round-r chunk of part q into owner q's staging (stores only, never remote loads); in
// round r it waits for every source's chunk of its own part, reduces it, stores the result
// into every PE's dst, pushes its round r + 1 chunks, and then sends each peer one flag that
// says three things: "my round r + 1 chunk is in your staging", "your round-r result is in
// your dst" and "my staging slot for your round-r chunk is free". Flag values are
// round_tag(e, r) = (epoch << COLL_ROUND_BITS | r + 1), so they grow across rounds and calls
// (the host keeps rounds below 2^COLL_ROUND_BITS - 1): tag(0)
// announces round 0, tag(r + 1) the above, tag(rounds) the last results.
// With two chunk slots, the wait for round r's data (tag r from every peer) also covers the
// slot that round r + 1 reuses (freed in round r + 1 - slots <= r - 1). With three or more,
// a block pushes its round r + 1 chunks before that wait, overlapping them with it: the
// wait for round r - 1 already covers the slot (freed in round r + 1 - slots <= r - 2).
// Only stores cross NVLink (the two-shot above reads its peers' inputs with remote loads,
// which the fabric carries less efficiently), and two blocks per SM overlap one's flag
// handshake with the other's copies.
//
// Staging: parity [source PE][slot plan.slots][block gridDim.x][plan.chunk_vecs x 16 bytes],
// which the host fits into one staging slot per source. Calls of the same parity are two
// apart, and a PE in call e + 2 has seen every owner's last flag of call e + 1, so every owner
// has finished reading call e's staging.

template <typename T, typename Op>
__device__ void bandwidth_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes, BandwidthPlan plan) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    __shared__ char *peer_in[MAX_PES];   // my source region in PE q's staging
    __shared__ uint4 *peer_dst[MAX_PES];  // PE q's dst
    __shared__ const T *peer_src[MAX_PES];
    __shared__ uint64_t *peer_flag[MAX_PES];  // my flag word at PE q
    __shared__ size_t part_begin[MAX_PES], part_end[MAX_PES];  // PE q's part
    uint64_t *my_flags = flag_at(flags, FLAGS_BW, blockIdx.x, 0, npes);  // [source PE]
    const size_t nvec = n / Vec<T>::N;
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        part_of(nvec, p, npes, &part_begin[p], &part_end[p]);
        peer_in[p] = (char *)peer_ptr(ctrl, base + (size_t)me * slot_bytes, p);
        peer_dst[p] = (uint4 *)peer_ptr(ctrl, dst, p);
        peer_src[p] = (const T *)peer_ptr(ctrl, src, p);
        peer_flag[p] = (uint64_t *)peer_ptr(ctrl, my_flags + me, p);
    }
    __syncthreads();

    const size_t tail = nvec * Vec<T>::N;
    const size_t max_part = (nvec + npes - 1) / npes;
    const size_t G = gridDim.x, b = blockIdx.x;
    // As few rounds as the chunk ring allows, then chunks evened out over them (no short
    // last round).
    const size_t cap = (size_t)plan.chunk_vecs * G;
    const int rounds = max_part == 0 ? 1 : (int)((max_part + cap - 1) / cap);
    size_t chunk = (max_part + G * rounds - 1) / (G * rounds);
    if (chunk == 0) chunk = 1;
    const uint4 *src4 = (const uint4 *)src;
    size_t mb, mend;
    part_of(nvec, me, npes, &mb, &mend);
    auto slot_off = [&](int r) -> size_t { return ((size_t)(r % plan.slots) * G + b) * plan.chunk_vecs * 16; };

    // My round-r chunk of every other PE's part into that PE's staging, peers in turn from the
    // next one on (measured on 4 H200s: 1-4% faster at 64-256 MiB than all PEs starting with
    // the same one).
    auto push = [&](int r) {
        const size_t c0 = ((size_t)r * G + b) * chunk;
        for (int k = 1; k < npes; k++) {
            const int q = (me + k) % npes;
            const size_t lo = part_begin[q] + c0, hi = lo + chunk < part_end[q] ? lo + chunk : part_end[q];
            uint4 *to = (uint4 *)(peer_in[q] + slot_off(r)) - lo;
            // All loads of a step before its stores (the compiler cannot tell they don't alias).
            for (size_t i0 = lo + threadIdx.x; i0 < hi; i0 += (size_t)blockDim.x * UNROLL) {
                uint4 v[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const size_t i = i0 + (size_t)u * blockDim.x;
                    if (i < hi) v[u] = ld_cg(src4 + i);
                }
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const size_t i = i0 + (size_t)u * blockDim.x;
                    if (i < hi) to[i] = v[u];
                }
            }
        }
    };
    // After every thread's stores: one flag to each peer.
    auto tell_all = [&](uint64_t v) {
        __syncthreads();
        for (int q = threadIdx.x; q < npes; q += blockDim.x)
            if (q != me) st_release_sys(peer_flag[q], v);
    };
    // False, in every thread, when a wait gave up (see Wait).
    auto wait_all = [&](uint64_t v) {
        bool ok = true;
        for (int p = threadIdx.x; p < npes; p += blockDim.x)
            if (p != me) {
                Wait w(ctrl);
                while (ok && ld_acquire_sys(my_flags + p) < v) ok = w.again(p);
                if (!ok) w.report(FAULT_ROUND, e);
            }
        return __syncthreads_and(ok);
    };

    // With three or more slots, round r + 1's chunks go out before the wait for round r.
    const bool ahead = plan.slots >= 3;
    push(0);
    tell_all(round_tag(e, 0));
    bool ok = true;
    for (int r = 0; r < rounds && ok; r++) {
        if (ahead && r + 1 < rounds) push(r + 1);
        // A peer that never came: no result from missing chunks, and no more flags.
        if (!(ok = wait_all(round_tag(e, r)))) break;
        // Reduce my part's round-r chunk (PE order) into every PE's dst.
        const size_t c0 = ((size_t)r * G + b) * chunk;
        const size_t lo = mb + c0, hi = mb + c0 + chunk < mend ? mb + c0 + chunk : mend;
        if (lo < hi) {
            const size_t off = slot_off(r);
            auto src_of = [&](int p) -> const uint4 * {
                return p == me ? src4 : (const uint4 *)(base + (size_t)p * slot_bytes + off) - lo;
            };
            reduce_vectors_any<T, Op>(lo, hi, threadIdx.x, blockDim.x, npes, src_of, peer_dst, npes);
        }
        // The scalar tail: the last PE reads it from every PE's src (all PEs are in this call,
        // and none leaves before this block's last flag).
        if (r == rounds - 1 && me == npes - 1)
            reduce_tail<T, Op>(tail, n, npes, [&](int p) { return peer_src[p]; }, [&](int p) { return (T *)peer_dst[p]; }, npes);
        if (!ahead && r + 1 < rounds) push(r + 1);
        tell_all(round_tag(e, r + 1));
    }
    // Every owner's results of this block's chunks are in my dst.
    if (ok) wait_all(round_tag(e, rounds));
    finish_call(ctrl, e);
}

// Bandwidth: start barrier (every dst free), push my input into every PE's dst, end barrier.
__device__ void bandwidth_allgather(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    __shared__ char *peer_dst[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x) peer_dst[p] = (char *)peer_ptr(ctrl, dst, p) + (size_t)me * bytes;
    // A peer that never came: its dst may still be in use; write nothing, send no end flag.
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if ((bytes & 15) == 0) {
        const size_t nvec = bytes / 16;
        const uint4 *src4 = (const uint4 *)src;
        for (size_t base = first; base < nvec; base += stride * UNROLL) {
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                size_t i = base + u * stride;
                if (i < nvec) v[u] = ld_cg(src4 + i);
            }
            for (int p = 0; p < npes; p++) {
                uint4 *to = (uint4 *)peer_dst[(me + p) % npes];
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    size_t i = base + u * stride;
                    if (i < nvec) to[i] = v[u];
                }
            }
        }
    } else {
        for (size_t i = first; i < bytes; i += stride)
            for (int p = 0; p < npes; p++) peer_dst[p][i] = ld_cg_t(src + i);
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}
