// Low-latency paths: 16-byte lines that carry 8 bytes of data and the call's tag, polled by
// the reader, for the smallest messages.
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/lines.cuh"
#include "collectives/reduce.cuh"

// ---- low-latency one-shot (flags packed with the data) ---------------------------------
// Each 16-byte line carries 8 bytes of data and the call's tag twice: {d0, t, d1, t}. A
// reader polls the line itself until both tag words match, so no fence and no separate flag
// round are needed (NCCL's LL protocol relies on the same 8-byte store atomicity). Twice the
// bytes move, which is cheap for the small messages this path is for.
//
// Lines live in a region of their own (no other path writes there), zeroed at construction,
// and a reader zeroes every line it has taken: so at the start of every call each line of
// the region is zero, whatever the earlier calls' sizes, and a line with a tag is this call's.
// Tags are never 0 (the low bit is set), so neither an empty line nor one half of a line
// being written passes for data, however many calls ran. A tag is a hash of the epoch in its
// high half and the call's signature in its low (see call_sig): a reader polls for its own
// tag, and a whole line with another tag, which it never takes, is a mismatch that the
// wait's checks find (Wait::again).
__device__ __forceinline__ uint32_t ll_tag(uint64_t e) {
    return (((uint32_t)e * 0x9E3779B1u) & 0xFFFF0000u) | (call_sig() & 0xFFFEu) | 1u;
}

__device__ __forceinline__ void st_line(uint4 *p, uint32_t d0, uint32_t d1, uint32_t t) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(t), "r"(d1), "r"(t) : "memory");
}

__device__ __forceinline__ bool line_ready(uint4 v, uint32_t t) { return v.y == t && v.w == t; }

// Whether v is a whole line of another call than the one of tag t (both halves written, with
// the same tag); its tag into *theirs, t into *mine.
__device__ __forceinline__ bool line_of_another_call(uint4 v, uint32_t t, uint32_t *theirs, uint32_t *mine) {
    *theirs = v.y;
    *mine = t;
    return v.y == v.w && v.y != 0 && v.y != t;
}

// The mismatch probe (Wait::again) for the lines v[p] of the sources p with has(p).
template <int NP, typename Has>
__device__ __forceinline__ auto lines_of_another_call(Has has, uint32_t t) {
    return [=](const uint4 *v, int *pe, uint32_t *theirs, uint32_t *mine) {
        bool found = false;
#pragma unroll
        for (int p = 0; p < NP; p++)
            if (!found && has(p) && line_of_another_call(v[p], t, theirs, mine)) {
                *pe = p;
                found = true;
            }
        return found;
    };
}

// Take the line at `at` into *out: poll it until it carries tag t, then zero it for the calls
// to come. False when the wait gave up or found another call's line (see Wait; the caller
// reports). After a shared wait gave up for another peer, it does not poll at all (the
// record keeps that peer).
__device__ __forceinline__ bool take_line(Wait &w, uint4 *at, uint4 v, uint32_t t, int pe, uint2 *out) {
    bool ok = !(w.spins & WAIT_STUCK);
    while (ok && !line_ready(v, t)) {
        ok = w.again(pe);
        // At a check (the count starts again): whether the line is another call's. Written
        // out here, not as again()'s probe: that made the 8-byte broadcast on 4 H200s 2.84 us
        // a call against 2.74 (docs/history/2026-11-28-call-signatures.md).
        uint32_t theirs, mine;
        if (ok && w.spins == 0 && line_of_another_call(v, t, &theirs, &mine)) ok = w.mismatch(pe, theirs, mine);
        v = ld_volatile(at);
    }
    ok = line_ready(v, t);
    st_volatile(at, make_uint4(0, 0, 0, 0));
    *out = make_uint2(v.x, v.z);
    return ok;
}

// The lines at(p) of the sources p with has(p), NP of them at most, polled together
// (poll_together) until each carries tag t, then zeroed; line p's data into out[p]. False
// when the wait gave up or found another call's line.
template <int NP, typename Has, typename At>
__device__ __forceinline__ bool take_lines_together(Wait &w, Has has, At at, uint32_t t, uint2 *out) {
    uint4 v[NP];
#pragma unroll
    for (int p = 0; p < NP; p++)
        if (has(p)) v[p] = ld_volatile(at(p));
    const bool ok = poll_together<NP>(w, v, has, at, [&](uint4 x) { return line_ready(x, t); }, lines_of_another_call<NP>(has, t));
#pragma unroll
    for (int p = 0; p < NP; p++)
        if (has(p)) {
            st_volatile(at(p), make_uint4(0, 0, 0, 0));
            out[p] = make_uint2(v[p].x, v[p].z);
        }
    return ok;
}

// Line j of every source PE but me, and zeroed. On more than 2 PEs they are polled together
// (poll_together); NP is the PE count when known at compile time, 0 for any, polled one
// source at a time (an array of LL_MAX_PES lines would not stay in registers). On 2 PEs the
// one peer's line is polled as take_line does (poll_together's code measured 0.06 us slower
// there). False when a wait gave up.
template <int NP>
__device__ __forceinline__ bool ld_lines(Ctrl *ctrl, uint64_t e, char *base, size_t slot_bytes, size_t j, int me, int npes, uint32_t t, uint2 *out) {
    Wait w(ctrl);
    bool ok = true;
    auto at = [&](int p) { return (uint4 *)(base + (size_t)p * slot_bytes) + j; };
    if constexpr (NP > 2) {
        ok = take_lines_together<NP>(w, [&](int p) { return p != me; }, at, t, out);
    } else if constexpr (NP == 2) {
        uint4 v[NP];
#pragma unroll
        for (int p = 0; p < NP; p++)
            if (p != me) v[p] = ld_volatile(at(p));
#pragma unroll
        for (int p = 0; p < NP; p++)
            if (p != me) ok &= take_line(w, at(p), v[p], t, p, &out[p]);
    } else {
        for (int p = 0; p < npes; p++)
            if (p != me) ok &= take_line(w, at(p), ld_volatile(at(p)), t, p, &out[p]);
    }
    if (!ok) w.report(FAULT_LINE, e);
    return ok;
}

template <typename T, typename Op, int NP>
__device__ void ll_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    const TableCall<NP> c(ctrl, staging, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const uint32_t t = ll_tag(c.e);
    const size_t bytes = n * sizeof(T), lines = (bytes + 7) / 8;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = first; j < lines; j += stride) {
        uint2 v = load8((const char *)src, bytes, j);
        for (int p = 0; p < npes; p++)
            if (p != me) st_line((uint4 *)(peers.slot[p] + offset) + j, v.x, v.y, t);
    }
    // Each thread reads back the lines it wrote, so no barrier is needed in between.
    for (size_t j = first; j < lines; j += stride) {
        // Own input first: its load overlaps the wait for the peers' lines.
        const uint2 own = load8((const char *)src, bytes, j);
        uint2 in[MAXP];
        ld_lines<NP>(ctrl, c.e, base, slot_bytes, j, me, npes, t, in);
        store8((char *)dst, bytes, j, reduce_in_pe_order<T, Op, MAXP>(in, own, me, npes));
    }
    finish_call(ctrl, c.e);
}

// ---- low-latency two-shot (reduce-scatter, then all-gather, both in low-latency lines) ----
// Owner q holds lines [q * P, (q + 1) * P) of the input, P = ceil(lines / npes). Every thread
// takes the same offsets k into every part in each of three loops, so no barrier is needed
// between them:
//   1. push line k of every other owner's part into that owner's staging (this PE's slot,
//      first half, at k);
//   2. as owner, wait for line k of my part from every peer, reduce in PE order, push the
//      result into every peer's staging (this PE's slot, second half, at k) and store it;
//   3. wait for line k of every other owner's part and store it.
// Each PE sends 2 (n - 1) / n lines per input line instead of the one-shot's n - 1, for one
// more hop. In place is safe: a thread overwrites only lines whose input it has read. A PE
// in call e + 2 has had line 0's result of call e + 1 from owner 0, which had line 0 from
// every PE, so every PE has finished call e and no longer reads this parity's staging.
template <typename T, typename Op, int NP>
__device__ void ll_twoshot_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    const TableCall<NP> c(ctrl, staging, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const uint32_t t = ll_tag(c.e);
    const size_t half = slot_bytes / 2;
    const size_t bytes = n * sizeof(T), lines = (bytes + 7) / 8;
    const size_t P = (lines + npes - 1) / npes;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    // 1. Every part's load first, then the stores (a line store keeps the loads after it
    // waiting behind it).
    for (size_t k = first; k < P; k += stride) {
        uint2 v[MAXP];
#pragma unroll
        for (int q = 0; q < MAXP; q++)
            if (q < npes && q != me && q * P + k < lines) v[q] = load8((const char *)src, bytes, q * P + k);
#pragma unroll
        for (int q = 0; q < MAXP; q++)
            if (q < npes && q != me && q * P + k < lines) st_line((uint4 *)(peers.slot[q] + offset) + k, v[q].x, v[q].y, t);
    }
    // 2. My part.
    for (size_t k = first; k < P && me * P + k < lines; k += stride) {
        const size_t j = me * P + k;
        const uint2 own = load8((const char *)src, bytes, j);
        uint2 in[MAXP];
        const bool ok = ld_lines<NP>(ctrl, c.e, base, slot_bytes, k, me, npes, t, in);
        const uint2 r = reduce_in_pe_order<T, Op, MAXP>(in, own, me, npes);
        // A peer that never came: no result from its missing line goes out.
#pragma unroll
        for (int q = 0; q < MAXP; q++)
            if (ok && q < npes && q != me) st_line((uint4 *)(peers.slot[q] + offset + half) + k, r.x, r.y, t);
        store8((char *)dst, bytes, j, r);
    }
    // 3. Every other owner's results (on more than 2 PEs all polled together, as in ld_lines).
    for (size_t k = first; k < P; k += stride) {
        Wait w(ctrl);
        auto has = [&](int q) { return q < npes && q != me && q * P + k < lines; };
        auto at = [&](int q) { return (uint4 *)(base + (size_t)q * slot_bytes + half) + k; };
        bool ok = true;
        uint4 v[MAXP];
#pragma unroll
        for (int q = 0; q < MAXP; q++)
            if (has(q)) v[q] = ld_volatile(at(q));
        if constexpr (MAXP > 2) {
            ok = poll_together<MAXP>(w, v, has, at, [&](uint4 x) { return line_ready(x, t); }, lines_of_another_call<MAXP>(has, t));
#pragma unroll
            for (int q = 0; q < MAXP; q++)
                if (has(q)) {
                    st_volatile(at(q), make_uint4(0, 0, 0, 0));
                    store8((char *)dst, bytes, q * P + k, make_uint2(v[q].x, v[q].z));
                }
        } else {
#pragma unroll
            for (int q = 0; q < MAXP; q++) {
                if (!has(q)) continue;
                uint2 r;
                ok &= take_line(w, at(q), v[q], t, q, &r);
                store8((char *)dst, bytes, q * P + k, r);
            }
        }
        if (!ok) w.report(FAULT_LINE, c.e);
    }
    finish_call(ctrl, c.e);
}

template <int NP>
__device__ void ll_allgather(const char *src, char *dst, size_t bytes, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    const TableCall<NP> c(ctrl, staging, slot_bytes, peers);
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const uint32_t t = ll_tag(c.e);
    const size_t lines = (bytes + 7) / 8;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = first; j < lines; j += stride) {
        uint2 v = load8(src, bytes, j);
        for (int p = 0; p < npes; p++)
            if (p != me) st_line((uint4 *)(peers.slot[p] + offset) + j, v.x, v.y, t);
        store8(dst + (size_t)me * bytes, bytes, j, v);
    }
    for (size_t j = first; j < lines; j += stride) {
        uint2 in[NP > 0 ? NP : LL_MAX_PES];
        ld_lines<NP>(ctrl, c.e, base, slot_bytes, j, me, npes, t, in);
#pragma unroll
        for (int p = 0; p < (NP > 0 ? NP : LL_MAX_PES); p++)
            if (p < npes && p != me) store8(dst + (size_t)p * bytes, bytes, j, in[p]);
    }
    finish_call(ctrl, c.e);
}

// ---- low-latency all-gather by output words ----------------------------------------------
// The all-gather above gives a thread line j of every PE's block: on 4 PEs it polls 3 lines,
// and where `bytes` is not a multiple of 8, block p starts off an 8-byte boundary and every
// line of it is stored in pieces (byte stores). Here a thread takes one output word (bytes
// [8w, 8w + 8) of the output): the OR of what each block it overlaps puts there, each
// block's part shifted into place by its sender and zero elsewhere. PE p sends words
// p * bytes / 8 .. ((p + 1) * bytes - 1) / 8 (line j of its slot is the j-th of them); the
// reader of word w polls the blocks over it (one for whole lines, two at most from 8 bytes
// on, every PE's for 2-byte blocks on 4 PEs), ORs them with its own part and stores the
// word whole. The host takes it on more than 2 PEs (plan.rs says what it measured), with CUT
// (block_in_word) where `bytes` is not a multiple of 8. Kernels of their own: inside the
// all-gather above, a branch for unaligned blocks made the whole lines slower too (the code
// around them changed), and so did a branch between the two ways to cut (0.04 us).

// This PE's part of output word w, where its block starts `at` = 8w - p * bytes bytes into
// the word's span (at in (-8, bytes)): the block's bytes in place, zero elsewhere. CUT: the
// blocks are off an 8-byte boundary, and the part is cut without a branch (load8_span).
// Cut in branches, a thread's parts of two words that took different branches (at < 0 and
// at > 0) loaded one after the other: blocks of 6, 10 and 12 bytes took 2.96-3.04 us on 4
// H200s, against 2.66-2.72 cut without (measured).
template <bool CUT>
__device__ __forceinline__ uint2 block_in_word(const char *src, size_t bytes, long long at) {
    if constexpr (CUT) return load8_span(src, bytes, at);
    if (at >= 0) return load8_block(src, (size_t)at, bytes - (size_t)at, 0);
    const uint2 v = load8(src, bytes, 0);
    const uint64_t w = ((uint64_t)v.y << 32 | v.x) << (8 * -at);
    return make_uint2((uint32_t)w, (uint32_t)(w >> 32));
}

template <int NP, bool CUT>
__device__ void ll_allgather_words(const char *src, char *dst, size_t bytes, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    const TableCall<NP> c(ctrl, staging, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const uint32_t t = ll_tag(c.e);
    const size_t total = (size_t)npes * bytes, words = (total + 7) / 8;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    auto first_word = [&](int p) { return (size_t)p * bytes / 8; };
    const size_t mine = first_word(me), sent = ((size_t)(me + 1) * bytes - 1) / 8 - mine + 1;
    for (size_t j = first; j < sent; j += stride) {
        const uint2 v = block_in_word<CUT>(src, bytes, (long long)(8 * (mine + j)) - (long long)(me * bytes));
        for (int p = 0; p < npes; p++)
            if (p != me) st_line((uint4 *)(peers.slot[p] + offset) + j, v.x, v.y, t);
    }
    for (size_t w = first; w < words; w += stride) {
        // The blocks over this word: lo .. hi (in 32 bits: a low-latency output is far
        // below 4 GiB, and a 64-bit division is a long call).
        const uint32_t end = (uint32_t)(8 * w + 8 < total ? 8 * w + 8 : total), b = (uint32_t)bytes;
        const int lo = (int)((uint32_t)(8 * w) / b), hi = (int)((end - 1) / b);
        uint2 acc = lo <= me && me <= hi ? block_in_word<CUT>(src, bytes, (long long)(8 * w) - (long long)(me * bytes))
                                         : make_uint2(0, 0);
        Wait wait(ctrl);
        auto at = [&](int p) { return (uint4 *)(base + (size_t)p * slot_bytes) + (w - first_word(p)); };
        auto has = [&](int p) { return lo <= p && p <= hi && p != me; };
        bool ok = true;
        if constexpr (NP > 2) {
            uint2 got[NP];
            ok = take_lines_together<NP>(wait, has, at, t, got);
#pragma unroll
            for (int p = 0; p < NP; p++)
                if (has(p)) {
                    acc.x |= got[p].x;
                    acc.y |= got[p].y;
                }
        } else {
            for (int p = lo; p <= hi && p < MAXP; p++) {
                if (p == me) continue;
                uint2 r;
                ok &= take_line(wait, at(p), ld_volatile(at(p)), t, p, &r);
                acc.x |= r.x;
                acc.y |= r.y;
            }
        }
        if (!ok) wait.report(FAULT_LINE, c.e);
        // After a wait that gave up the word is left alone (the host reports the fault).
        if (ok) store8(dst, total, w, acc);
    }
    finish_call(ctrl, c.e);
}

// ---- low-latency reduce-scatter ----------------------------------------------------------
// Line k of block q (of `bytes`, anywhere) of `in` into my slot (`offset`) of PE q's lines,
// for every peer q: every block's line loaded first, then the stores (a line store keeps the
// loads after it waiting behind it). The reduce-scatter's and the all-to-all's first step.
template <int NP>
__device__ __forceinline__ void push_block_lines(const char *in, size_t bytes, size_t k, int me, int npes, const Peers &peers, size_t offset, uint32_t t) {
    constexpr int MAXP = NP > 0 ? NP : LL_MAX_PES;
    uint2 v[MAXP];
#pragma unroll
    for (int q = 0; q < MAXP; q++)
        if (q < npes && q != me) v[q] = load8_block(in, (size_t)q * bytes, bytes, k);
#pragma unroll
    for (int q = 0; q < MAXP; q++)
        if (q < npes && q != me) st_line((uint4 *)(peers.slot[q] + offset) + k, v[q].x, v[q].y, t);
}

// The first half of the low-latency two-shot, with the caller's blocks as the parts: line k
// of block q of my input goes into my slot of PE q's lines, and as owner of block me I wait
// for line k of it from every peer and reduce it with mine in PE order. Blocks of any size
// (n elements, so a block may start off an 8-byte boundary). Every PE hears from every peer
// in each call (no block is empty), which keeps a PE from running two calls ahead of
// another, as the lines' parity needs.
template <typename T, typename Op, int NP>
__device__ void ll_reducescatter(const T *src, T *dst, size_t n, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    const TableCall<NP> c(ctrl, staging, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const uint32_t t = ll_tag(c.e);
    const char *in = (const char *)src;
    const size_t bytes = n * sizeof(T), lines = (bytes + 7) / 8;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = first; k < lines; k += stride) push_block_lines<NP>(in, bytes, k, me, npes, peers, offset, t);
    for (size_t k = first; k < lines; k += stride) {
        const uint2 own = load8_block(in, (size_t)me * bytes, bytes, k);
        uint2 got[MAXP];
        ld_lines<NP>(ctrl, c.e, base, slot_bytes, k, me, npes, t, got);
        store8((char *)dst, bytes, k, reduce_in_pe_order<T, Op, MAXP>(got, own, me, npes));
    }
    finish_call(ctrl, c.e);
}
