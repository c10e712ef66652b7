// Sentinel paths: raw data pushed into receive buffers pre-filled with a sentinel pattern,
// polled by the reader, for floating-point all-reduce of small and medium messages.
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/lines.cuh"
#include "collectives/reduce.cuh"

// ---- sentinel one-shot (raw data into receive buffers pre-filled with a sentinel) --------
// Every PE's receive buffers start filled with SENTINEL, a 32-bit pattern that no pushed word
// carries: a sender turns such a word (a NaN in f32, two NaNs in f16 or bf16) into another NaN,
// so this path is for floating-point types only. A reader polls each 16-byte vector until
// none of its words is the sentinel (an aligned word is stored whole, so a vector may arrive
// in parts but no word is torn), then writes the sentinel back. Unlike the tagged lines
// above, only the data crosses NVLink: half the bytes.
// Buffers: [parity][source PE][slot] in an allocation of their own (a word left by any other
// algorithm would pass for data). A PE in call e + 2 has heard from every peer in call e + 1,
// so every peer has finished call e, refills included, before this parity is written again.
#define SENTINEL COLL_SENTINEL

__device__ __forceinline__ uint32_t off_sentinel(uint32_t w) { return w == SENTINEL ? 0x7FFFFFFFu : w; }

// A vector as it is sent (and used by its own PE, so that every PE reduces the same values).
__device__ __forceinline__ uint4 to_wire(uint4 v) {
    return make_uint4(off_sentinel(v.x), off_sentinel(v.y), off_sentinel(v.z), off_sentinel(v.w));
}

__device__ __forceinline__ bool arrived(uint4 v) {
    return v.x != SENTINEL && v.y != SENTINEL && v.z != SENTINEL && v.w != SENTINEL;
}

// Vector i of every source PE but me (PE p's at base + p * slot_bytes), polled until each
// has arrived: on more than 2 PEs all together (poll_together), on 2 the one peer's alone
// (as ld_lines). False when a wait gave up (see Wait).
template <int MAXP>
__device__ __forceinline__ bool ld_arrived(Ctrl *ctrl, uint64_t e, const char *base, size_t slot_bytes, size_t i, int me, int npes, uint4 *in) {
    Wait w(ctrl);
    auto has = [&](int p) { return p < npes && p != me; };
    auto at = [&](int p) { return (const uint4 *)(base + (size_t)p * slot_bytes) + i; };
#pragma unroll
    for (int p = 0; p < MAXP; p++)
        if (has(p)) in[p] = ld_volatile(at(p));
    bool ok = true;
    if constexpr (MAXP > 2) {
        ok = poll_together<MAXP>(w, in, has, at, [](uint4 v) { return arrived(v); });
    } else {
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (has(p)) {
                while (ok && !arrived(in[p])) {
                    ok = w.again(p);
                    in[p] = ld_volatile(at(p));
                }
                ok = ok && arrived(in[p]);
            }
    }
    if (!ok) w.report(FAULT_SENTINEL, e);
    return ok;
}

template <typename T, typename Op, int NP>
__device__ void sentinel_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, char *region, size_t slot_bytes, const Peers &peers) {
    const TableCall<NP> c(ctrl, region, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const size_t bytes = n * sizeof(T), nvec = (bytes + 15) / 16;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = first; i < nvec; i += stride) {
        const uint4 v = to_wire(load16((const char *)src, bytes, i));
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (p < npes && p != me) st_volatile((uint4 *)(peers.slot[p] + offset) + i, v);
    }
    // Each thread reads back the vectors it sent, so no barrier is needed in between.
    for (size_t i = first; i < nvec; i += stride) {
        const uint4 own = to_wire(load16((const char *)src, bytes, i));
        uint4 in[MAXP];
        ld_arrived<MAXP>(ctrl, c.e, base, slot_bytes, i, me, npes, in);
        store16((char *)dst, bytes, i, reduce_in_pe_order<T, Op, MAXP>(in, own, me, npes));
        // Refill for the call two epochs on.
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (p < npes && p != me) st_volatile((uint4 *)(base + (size_t)p * slot_bytes) + i, make_uint4(SENTINEL, SENTINEL, SENTINEL, SENTINEL));
    }
    finish_call(ctrl, c.e);
}

// ---- sentinel two-shot (reduce-scatter, then all-gather, both into sentinel buffers) ----
// Owner q holds vectors [q * P, (q + 1) * P) of the input, P = ceil(vectors / npes). Each
// sentinel slot has two halves: a PE pushes its vector q * P + k to owner q's buffer (its own
// slot, first half, at k); the owner polls vector k of every peer, reduces in PE order, and
// pushes the result to every PE (its slot, second half, at k), which polls and stores it.
// Each PE sends 2 (n - 1) / n vectors per input vector, the one-shot n - 1, for one more hop.
// The three loops need no barrier and may map vectors to threads differently: an owner's
// result at k exists only after every PE's input at q * P + k has been read, so a result
// stored in place never overwrites input still to be sent. A PE in call e + 2 has had
// vector 0's result of call e + 1 from owner 0 (or, as owner 0, every peer's vector 0), so
// every PE has finished call e, refills included.
template <typename T, typename Op, int NP>
__device__ void sentinel_twoshot_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, char *region, size_t slot_bytes, const Peers &peers) {
    const TableCall<NP> c(ctrl, region, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const size_t half = slot_bytes / 2;
    const size_t bytes = n * sizeof(T), nvec = (bytes + 15) / 16;
    const size_t P = (nvec + npes - 1) / npes;
    // Consecutive warps on different blocks, so that the owner's loop, which covers only a
    // part, still runs on every SM (block size: a multiple of 32).
    const size_t first = (((size_t)(threadIdx.x >> 5) * gridDim.x + blockIdx.x) << 5) + (threadIdx.x & 31);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const uint4 empty = make_uint4(SENTINEL, SENTINEL, SENTINEL, SENTINEL);
    // 1. Every other owner's part to its owner.
    for (size_t j = first; j < nvec; j += stride) {
        const int q = (int)(j / P);
        if (q != me) st_volatile((uint4 *)(peers.slot[q] + offset) + (j - q * P), to_wire(load16((const char *)src, bytes, j)));
    }
    // 2. My part: reduce, refill, send the result everywhere.
    for (size_t k = first; k < P && me * P + k < nvec; k += stride) {
        const size_t j = me * P + k;
        const uint4 own = to_wire(load16((const char *)src, bytes, j));
        uint4 in[MAXP];
        const bool ok = ld_arrived<MAXP>(ctrl, c.e, base, slot_bytes, k, me, npes, in);
        const uint4 r = to_wire(reduce_in_pe_order<T, Op, MAXP>(in, own, me, npes));
        // A peer that never came: no result from its missing vector goes out.
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (p < npes && p != me) {
                if (ok) st_volatile((uint4 *)(peers.slot[p] + offset + half) + k, r);
                st_volatile((uint4 *)(base + (size_t)p * slot_bytes) + k, empty);
            }
        store16((char *)dst, bytes, j, r);
    }
    // 3. Every other owner's results.
    for (size_t j = first; j < nvec; j += stride) {
        const int q = (int)(j / P);
        if (q == me) continue;
        uint4 *at = (uint4 *)(base + (size_t)q * slot_bytes + half) + (j - q * P);
        uint4 v = ld_volatile(at);
        Wait w(ctrl);
        bool ok = true;
        while (ok && !arrived(v)) {
            ok = w.again(q);
            v = ld_volatile(at);
        }
        if (!ok) w.report(FAULT_SENTINEL, c.e);
        store16((char *)dst, bytes, j, v);
        st_volatile(at, empty);
    }
    finish_call(ctrl, c.e);
}
