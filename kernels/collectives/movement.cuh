// Broadcast and all-to-all: data that moves without being reduced, from one PE to all (the
// broadcast) or from every PE to every PE in blocks (the all-to-all).
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/lines.cuh"
#include "collectives/low_latency.cuh"
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

// Move vectors [0, nvec) of `sources` sources, vector i by thread i of the grid (strided):
// in each step a thread loads UNROLL vectors of one source before it stores any, so that they
// are in flight together (the compiler cannot tell that the stores do not alias the loads, and
// would otherwise wait for each load before the next). `load(s, i)` gives vector i of source
// s; `store(s, i, v)` puts it wherever it goes. Sources take turns within a step.
template <typename Load, typename Store>
__device__ __forceinline__ void move_vectors(size_t nvec, int sources, Load load, Store store) {
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t base = first; base < nvec; base += stride * UNROLL)
        for (int s = 0; s < sources; s++) {
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const size_t i = base + u * stride;
                if (i < nvec) v[u] = load(s, i);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const size_t i = base + u * stride;
                if (i < nvec) store(s, i, v[u]);
            }
        }
}

// Copy `bytes` from `from` to `to` (either may live on a peer) with the thread-to-byte mapping
// every kernel here uses: vector i by thread i of the grid (strided), the tail by block 0. A
// reader of data that a peer pushed this way reads exactly what its own block's handshake
// covers. PACED: one load in flight per thread, for the SMs' share of the copy-engine paths
// (ce_local_copy), where the copy engines read the same HBM meanwhile and a copy with more
// loads in flight took bandwidth from them. Measured on 2 H100s (graph replays, 128 MiB):
// all-to-all 188.1-188.9 us against 200.3-201.2, broadcast 355.6 against 382.9.
template <bool PACED = false>
__device__ __forceinline__ void copy_mapped(char *to, const char *from, size_t bytes) {
    const size_t nvec = bytes / 16, tail = nvec * 16;
    if (PACED) {
        const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        const size_t stride = (size_t)gridDim.x * blockDim.x;
        for (size_t i = first; i < nvec; i += stride) store16(to + i * 16, load16(from + i * 16));
    } else if ((((size_t)to | (size_t)from) & 15) == 0) {
        move_vectors(
            nvec, 1, [&](int, size_t i) { return ld_cg((const uint4 *)from + i); }, [&](int, size_t i, uint4 v) { ((uint4 *)to)[i] = v; });
    } else {
        move_vectors(
            nvec, 1, [&](int, size_t i) { return load16(from + i * 16); }, [&](int, size_t i, uint4 v) { store16(to + i * 16, v); });
    }
    if (blockIdx.x == 0)
        for (size_t i = tail + threadIdx.x; i < bytes; i += blockDim.x) to[i] = ld_cg_t(from + i);
}

// ---- broadcast ----------------------------------------------------------------------------
// One-shot: the root pushes its input into its slot of every peer's staging, one handshake
// (every PE with every PE, which keeps any PE from running two calls ahead of another, as the
// staging's parity needs), then every PE copies the root's slot into dst; the root copies its
// input unless the call is in place.
__device__ void oneshot_broadcast(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes, int root) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    if (me == root) push_to_peers(ctrl, src, bytes, base, slot_bytes, me, npes);
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
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    if (me == root) {
        // Each vector read once and stored to every PE in the same pass: the local copy (at
        // HBM speed) then hides behind the NVLink stores instead of adding to them.
        __shared__ char *to[MAX_PES];
        for (int p = threadIdx.x; p < npes; p += blockDim.x) to[p] = p == me ? dst : (char *)peer_ptr(ctrl, dst, p);
        __syncthreads();
        const bool in_place = dst == src;
        const size_t nvec = bytes / 16, tail = nvec * 16;
        move_vectors(
            nvec, 1, [&](int, size_t i) { return ld_cg((const uint4 *)src + i); },
            [&](int, size_t i, uint4 v) {
                for (int k = 1; k <= npes; k++) {
                    const int p = (me + k) % npes;  // peers first, my own copy last
                    if (p != me || !in_place) *((uint4 *)to[p] + i) = v;
                }
            });
        if (blockIdx.x == 0)
            for (size_t i = tail + threadIdx.x; i < bytes; i += blockDim.x)
                for (int p = 0; p < npes; p++)
                    if (p != me || !in_place) to[p][i] = ld_cg_t(src + i);
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}

// Relay (large messages on more than 2 PEs): the push sends every byte out of the root once
// per peer, so the root's outbound links carry npes - 1 copies of the message. Here they
// carry one: the root scatters, and the other PEs (the relays) forward, pipelined. The input
// is cut into segments of plan `chunk_vecs` vectors, dealt round-robin to the blocks (round
// r, block b: segment r * gridDim.x + b), and each segment into npes - 1 pieces, piece k for
// relay k (the k-th PE after the root). After a start barrier (every dst is free), block b of
// the root stores each of its segments, piece k into relay k's dst (and the whole segment
// into its own dst unless in place), and raises its flag at every relay to round_tag(e, r).
// Block b of relay k waits for that flag, then stores piece k from its own dst into every
// other relay's dst. An end barrier: every store into every dst has landed. Each relay takes
// in the whole message once, the root sends it once, and a relay lags the root by a round.
__device__ void relay_broadcast(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, unsigned int chunk_vecs, int root) {
    // One PE: the root is its own relay, and the call a copy.
    const int me = team_me(ctrl), npes = team_npes(ctrl), relays = npes > 1 ? npes - 1 : 1;
    const uint64_t e = call_epoch(ctrl);
    __shared__ uint4 *to[MAX_PES];  // PE p's dst
    __shared__ uint64_t *raise[MAX_PES];  // at the root: my flag word at relay k
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        to[p] = (uint4 *)(p == me ? dst : (char *)peer_ptr(ctrl, dst, p));
        raise[p] = (uint64_t *)peer_ptr(ctrl, flag_at(flags, FLAGS_BW, blockIdx.x, root, npes), (root + 1 + p) % npes);
    }
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    const size_t nvec = bytes / 16, G = gridDim.x, b = blockIdx.x, chunk = chunk_vecs;
    const int rounds = (int)((nvec + chunk * G - 1) / (chunk * G));
    // Segment (r, b): its first vector and length; piece k of it: [k * q, (k + 1) * q) there.
    auto segment = [&](int r, size_t *s0, unsigned int *len, unsigned int *q) {
        *s0 = ((size_t)r * G + b) * chunk;
        *len = *s0 < nvec ? (unsigned int)(nvec - *s0 < chunk ? nvec - *s0 : chunk) : 0u;
        *q = (*len + relays - 1) / relays;
    };
    bool ok = true;
    if (me == root) {
        const uint4 *src4 = (const uint4 *)src;
        const bool in_place = dst == src;
        for (int r = 0; r < rounds; r++) {
            size_t s0;
            unsigned int len, q;
            segment(r, &s0, &len, &q);
            for (unsigned int j0 = threadIdx.x; j0 < len; j0 += blockDim.x * UNROLL) {
                uint4 v[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const unsigned int j = j0 + u * blockDim.x;
                    if (j < len) v[u] = ld_cg(src4 + s0 + j);
                }
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const unsigned int j = j0 + u * blockDim.x;
                    if (j < len) {
                        to[(root + 1 + j / q) % npes][s0 + j] = v[u];
                        if (!in_place) to[me][s0 + j] = v[u];
                    }
                }
            }
            __syncthreads();
            for (int k = threadIdx.x; k < relays; k += blockDim.x) st_release_sys(raise[k], round_tag(e, r));
        }
        // The bytes after the last whole vector, straight to every PE.
        if (blockIdx.x == 0)
            for (size_t i = nvec * 16 + threadIdx.x; i < bytes; i += blockDim.x)
                for (int p = 0; p < npes; p++)
                    if (p != me || !in_place) ((char *)to[p])[i] = ld_cg_t(src + i);
    } else {
        const int k = (me - root - 1 + npes) % npes;
        const uint64_t *mine = flag_at(flags, FLAGS_BW, blockIdx.x, root, npes);
        for (int r = 0; r < rounds && ok; r++) {
            if (threadIdx.x == 0) {
                Wait w(ctrl);
                while (ok && ld_acquire_sys(mine) < round_tag(e, r)) ok = w.again(root);
                if (!ok) w.report(FAULT_ROUND, e);
            }
            // A root that never came: forward nothing, and send no end flag.
            if (!(ok = __syncthreads_and(ok))) break;
            size_t s0;
            unsigned int len, q;
            segment(r, &s0, &len, &q);
            const unsigned int lo = k * q, hi = (k + 1) * q < len ? (k + 1) * q : len;
            for (unsigned int j0 = lo + threadIdx.x; j0 < hi; j0 += blockDim.x * UNROLL) {
                uint4 v[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const unsigned int j = j0 + u * blockDim.x;
                    if (j < hi) v[u] = ld_cg(to[me] + s0 + j);
                }
                // Every other relay, from the next PE on (relays do not all store into the
                // same one first).
                for (int t = 1; t < npes; t++) {
                    const int p = (me + t) % npes;
                    if (p == root) continue;
#pragma unroll
                    for (int u = 0; u < UNROLL; u++) {
                        const unsigned int j = j0 + u * blockDim.x;
                        if (j < hi) to[p][s0 + j] = v[u];
                    }
                }
            }
        }
    }
    if (ok) signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}

// ---- all-to-all ---------------------------------------------------------------------------
// src and dst hold npes blocks of `bytes`: block q of PE p's src becomes block p of PE q's dst.

// One-shot: block q of my input into my slot of PE q's staging, one handshake, then every
// PE copies slot p into block p of dst (its own block straight from its input).
__device__ void oneshot_alltoall(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    for (int p = 0; p < npes; p++) {
        if (p == me) continue;
        char *slot = (char *)peer_ptr(ctrl, base + (size_t)me * slot_bytes, p);
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
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    // The same vectors of every block in one pass (the local block's copy hides behind the
    // NVLink stores), in turn k from the next PE on, so that the PEs do not all store into PE
    // 0 first: turn k reads from[k] and writes to[k].
    __shared__ const char *from[MAX_PES];
    __shared__ char *to[MAX_PES];
    for (int k = threadIdx.x; k < npes; k += blockDim.x) {
        const int p = (me + 1 + k) % npes;
        from[k] = src + (size_t)p * bytes;
        to[k] = (p == me ? dst : (char *)peer_ptr(ctrl, dst, p)) + (size_t)me * bytes;
    }
    __syncthreads();
    const size_t nvec = bytes / 16, tail = nvec * 16;
    if ((((size_t)src | (size_t)dst | bytes) & 15) == 0)
        move_vectors(
            nvec, npes, [&](int k, size_t i) { return ld_cg((const uint4 *)from[k] + i); },
            [&](int k, size_t i, uint4 v) { ((uint4 *)to[k])[i] = v; });
    else
        move_vectors(
            nvec, npes, [&](int k, size_t i) { return load16(from[k] + i * 16); },
            [&](int k, size_t i, uint4 v) { store16(to[k] + i * 16, v); });
    if (blockIdx.x == 0)
        for (size_t i = tail + threadIdx.x; i < bytes; i += blockDim.x)
            for (int k = 0; k < npes; k++) to[k][i] = ld_cg_t(from[k] + i);
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}

// ---- all-to-all with counts ---------------------------------------------------------------
// counts.send[q] elements of `elem` bytes go to PE q, packed in PE order in src; PE q takes
// them at its own place for this PE (its recv counts packed in PE order in dst). Every PE
// publishes its counts in `table` ([parity][recv counts | recv offsets | send counts] of npes
// words), a start barrier, then each PE reads where each receiver wants its block and checks
// that both sides agree on its size: the sender against the receiver's recv count, the
// receiver against the sender's send count. A pair that disagrees moves nothing (no store
// outside what the receiver expects), and each side records it (FAULT_COUNTS). An end barrier.

// Record a count mismatch with `pe` in the fault record, once per PE, and mark the Collectives
// broken (as a wait that ran out of time does).
__device__ __forceinline__ void report_counts(Ctrl *ctrl, int pe, bool sending, uint64_t sent, uint64_t expected, uint64_t e) {
    if (atomicCAS(&ctrl->aborted, 0u, 1u) != 0u || ctrl->fault == nullptr) return;
    volatile Fault *f = ctrl->fault;
    f->site = FAULT_COUNTS;
    f->pe = pe;
    f->block = blockIdx.x;
    f->epoch = e;
    f->waited_ns = 0;
    f->sent = sent;
    f->expected = expected;
    f->sending = sending;
    __threadfence_system();
    f->raised = 1;
}

__device__ void push_alltoallv(const char *src, char *dst, size_t elem, Ctrl *ctrl, uint64_t *flags, uint64_t *table, const Counts &counts) {
    const int me = team_me(ctrl), npes = team_npes(ctrl);
    const uint64_t e = call_epoch(ctrl);
    uint64_t *mine = table + (e & 1) * 3 * (size_t)npes;  // this call's table, at any PE
    // Every block publishes the same words: a peer's block b reads them after my block b's
    // flag, which covers only what block b wrote.
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        uint64_t offset = 0;
        for (int i = 0; i < p; i++) offset += counts.recv[i];
        mine[p] = counts.recv[p];
        mine[npes + p] = offset;
        mine[2 * npes + p] = counts.send[p];
    }
    if (!signal_and_wait(ctrl, flags, FLAGS_START, me, npes, e)) {
        finish_call(ctrl, e);
        return;
    }
    // As a receiver: does every sender send what I expect?
    if (blockIdx.x == 0)
        for (int p = threadIdx.x; p < npes; p += blockDim.x) {
            const uint64_t *theirs = (const uint64_t *)peer_ptr(ctrl, mine, p);
            const uint64_t sent = ld_acquire_sys(theirs + 2 * npes + me);
            if (sent != counts.recv[p]) report_counts(ctrl, p, false, sent, counts.recv[p], e);
        }
    for (int k = 0; k < npes; k++) {
        const int p = (me + k) % npes;  // start with the next PE: not all PEs store into PE 0 first
        uint64_t from = 0;  // my block for PE p starts here in src (elements)
        for (int i = 0; i < p; i++) from += counts.send[i];
        const uint64_t *theirs = (const uint64_t *)peer_ptr(ctrl, mine, p);
        const uint64_t expected = ld_acquire_sys(theirs + me), at = ld_acquire_sys(theirs + npes + me);
        if (expected != counts.send[p]) {
            if (blockIdx.x == 0 && threadIdx.x == 0) report_counts(ctrl, p, true, counts.send[p], expected, e);
            continue;
        }
        char *to = (p == me ? dst : (char *)peer_ptr(ctrl, dst, p)) + at * elem;
        copy_mapped(to, src + from * elem, counts.send[p] * elem);
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}

// ---- low-latency broadcast and all-to-all --------------------------------------------------
// The lines of the low-latency all-gather (low_latency.cuh), from the root only or in blocks.

// The acknowledgements of the low-latency broadcasts (see ll_broadcast): this PE's epoch and
// signature, as a handshake flag holds them (signal_and_wait), into its word of every peer's
// acknowledgement row, from the last threads of block 0 (blocks have at least 128 threads,
// tables at most 16 PEs), which take lines last. Returns the row here.
__device__ __forceinline__ uint64_t *announce_begun(const Ctrl *ctrl, uint64_t *flags, int me, int npes, uint64_t e) {
    uint64_t *begun = flag_at(flags, FLAGS_ACK, 0, 0, npes);  // [pe]: the last call it began
    const int acked = (int)(blockDim.x - 1 - threadIdx.x);
    if (blockIdx.x == 0 && acked < npes && acked != me)
        st_relaxed_sys((uint64_t *)peer_ptr(ctrl, begun + me, acked), e << SIG_BITS | call_sig());
    return begun;
}

// Before the call ends, block 0 waits until every peer has begun it, and compares the
// signatures: so the root, which takes no line, learns of a peer that disagrees too.
__device__ __forceinline__ void await_begun(Ctrl *ctrl, const uint64_t *begun, int me, int npes, uint64_t e) {
    if (blockIdx.x != 0) return;
    const uint32_t sig = call_sig();
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        if (p == me) continue;
        Wait w(ctrl);
        bool ok = true;
        uint64_t v;
        while (ok && (v = ld_acquire_sys(begun + p)) < (e << SIG_BITS)) ok = w.again(p);
        if (ok && (v >> SIG_BITS) == e && (uint32_t)(v & SIG_MASK) != sig) ok = w.mismatch(p, (uint32_t)v, sig);
        if (!ok) w.report(FAULT_FLAGS, e);
    }
}

// The root pushes line j of its input into its slot of every peer's lines and copies it into
// its own dst (unless in place); every other PE takes line j from the root's slot into dst.
//
// Every path that double-buffers by epoch parity (the lines, the staging, the sentinel
// buffers, the counts table) relies on this: a PE that has finished call e knows that every
// peer has begun call e, so has finished call e - 1. The other paths get it by hearing from
// every peer. Here the root hears from nobody and a non-root only from the root, so the call
// restores it itself: as it begins, every PE stores the epoch into its word of every peer's
// acknowledgement row (FLAGS_ACK), and before it ends, block 0 waits until every peer's word
// there has reached the epoch. The stores go out first, so by the end of the call they have
// mostly arrived. They are relaxed: what they stand for (the reads of earlier calls) ended
// with the kernels before this one, and a release store's system fence held up the stores
// and polls after it (4.3-4.6 us per broadcast up to 32 KiB against 2.4-2.5, measured).
template <int NP>
__device__ void ll_broadcast(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes, const Peers &peers, int root) {
    const TableCall<NP> c(ctrl, staging, slot_bytes, peers);
    const int me = c.me, npes = c.npes;
    const uint64_t e = c.e;
    const uint32_t t = ll_tag(e);
    const size_t lines = (bytes + 7) / 8;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    uint64_t *begun = announce_begun(ctrl, flags, me, npes, e);
    if (me == root) {
        const size_t offset = c.offset;
        for (size_t j = first; j < lines; j += stride) {
            const uint2 v = load8(src, bytes, j);
#pragma unroll
            for (int p = 0; p < TableCall<NP>::MAXP; p++)
                if (p < npes && p != me) st_line((uint4 *)(peers.slot[p] + offset) + j, v.x, v.y, t);
            if (dst != src) store8(dst, bytes, j, v);
        }
    } else {
        char *from = c.base + (size_t)root * slot_bytes;
        for (size_t j = first; j < lines; j += stride) {
            uint4 *at = (uint4 *)from + j;
            Wait w(ctrl);
            uint2 v;
            if (!take_line(w, at, ld_volatile(at), t, root, &v)) w.report(FAULT_LINE, e);
            store8(dst, bytes, j, v);
        }
    }
    await_begun(ctrl, begun, me, npes, e);
    finish_call(ctrl, e);
}

// Low-latency relay (more than 2 PEs, larger messages of the low-latency range): the root's
// lines leave it once, not once per peer. Line j belongs to relay r(j), the non-root PE
// (j / 32) mod (npes - 1) places after the root (a warp's 32 lines go to one PE). The root
// stores line j into its slot of r(j)'s lines only; r(j) takes it, forwards it into the
// root's slot of every other non-root PE's lines, and stores it; every other non-root PE
// takes it from the root's slot as in ll_broadcast. Each line of the root's slot at a PE is
// written once per call, by the root or by its relay, and zeroed by the PE that takes it.
// Every thread handles the same lines on every PE, in the same order, and a relay waits for
// its own lines on the root only, so the first line no thread has finished is always on its
// way. The acknowledgements are ll_broadcast's, for the same reason.
template <int NP>
__device__ void ll_relay_broadcast(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes, const Peers &peers, int root) {
    const TableCall<NP> c(ctrl, staging, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes, relays = npes > 1 ? npes - 1 : 1;
    const uint64_t e = c.e;
    const uint32_t t = ll_tag(e);
    const size_t lines = (bytes + 7) / 8;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t at_root = slot_offset(e, root, npes, slot_bytes);  // the root's slot, at any PE
    auto relay_of = [&](size_t j) { return (root + 1 + (int)((j / 32) % relays)) % npes; };
    uint64_t *begun = announce_begun(ctrl, flags, me, npes, e);
    if (me == root) {
        for (size_t j = first; j < lines; j += stride) {
            const uint2 v = load8(src, bytes, j);
            // Never into its own lines (one PE), which nobody would take and zero.
            if (relay_of(j) != me) st_line((uint4 *)(peers.slot[relay_of(j)] + at_root) + j, v.x, v.y, t);
            if (dst != src) store8(dst, bytes, j, v);
        }
    } else {
        char *from = c.base + (size_t)root * slot_bytes;
        for (size_t j = first; j < lines; j += stride) {
            uint4 *at = (uint4 *)from + j;
            Wait w(ctrl);
            uint2 v;
            if (!take_line(w, at, ld_volatile(at), t, relay_of(j) == me ? root : relay_of(j), &v)) {
                // Forward nothing taken from a line that never came.
                w.report(FAULT_LINE, e);
                store8(dst, bytes, j, v);
                continue;
            }
            if (relay_of(j) == me)
#pragma unroll
                for (int p = 0; p < MAXP; p++)
                    if (p < npes && p != me && p != root) st_line((uint4 *)(peers.slot[p] + at_root) + j, v.x, v.y, t);
            store8(dst, bytes, j, v);
        }
    }
    await_begun(ctrl, begun, me, npes, e);
    finish_call(ctrl, e);
}

// Line k of block q of my input into my slot of PE q's lines (my own block straight into
// dst), then line k of every peer's block from its slot into block p of dst. Every PE hears
// from every peer in each call (no block is empty), as the lines' parity needs.
template <int NP>
__device__ void ll_alltoall(const char *src, char *dst, size_t bytes, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    const TableCall<NP> c(ctrl, staging, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const uint32_t t = ll_tag(c.e);
    const size_t lines = (bytes + 7) / 8;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = first; k < lines; k += stride) {
        push_block_lines<NP>(src, bytes, k, me, npes, peers, offset, t);
        store8(dst + (size_t)me * bytes, bytes, k, load8_block(src, (size_t)me * bytes, bytes, k));
    }
    for (size_t k = first; k < lines; k += stride) {
        uint2 in[MAXP];
        ld_lines<NP>(ctrl, c.e, base, slot_bytes, k, me, npes, t, in);
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (p < npes && p != me) store8(dst + (size_t)p * bytes, bytes, k, in[p]);
    }
    finish_call(ctrl, c.e);
}
