// The protocol every call of our collectives follows: how it starts, its epoch, the flags
// its blocks exchange with their peers, the staging layout, and how it ends.
#pragma once

#include <nvshmem.h>
#include <stdint.h>

#include <type_traits>

#include "abi.h"
#include "collectives/memory.cuh"

#define MAX_BLOCKS COLL_MAX_BLOCKS
#define MAX_PES COLL_MAX_PES

// Flag sets, each MAX_BLOCKS x n_pes words (COLL_FLAG_SETS of them).
#define FLAGS_DATA 0     // one-shot data landed
#define FLAGS_DONE 1     // two-shot / all-gather bandwidth end barrier
#define FLAGS_START 2    // two-shot / all-gather bandwidth start barrier
#define FLAGS_BW 3       // rounds of chunks: bandwidth all-reduce, relay broadcast (see there)
#define FLAGS_ACK 4      // low-latency broadcast: the last call each PE began (row 0; see there)


// ---- the call's signature ------------------------------------------------------------------
// A short hash of what this PE was asked to do: the entry point (collective, algorithm,
// element type, operator), the length and the root. Every handshake flag and every
// low-latency line carries it, and a reader compares it with its own before it uses what
// came: PEs that disagree (one all-to-all of 4-element blocks against another of 8) stop
// with a fault that names the peer instead of moving the wrong bytes. No extra memory
// traffic: a handshake compares after its wait, a line of another call (which a reader,
// polling for its own tag, never takes) is found at the wait's checks (Wait::again). 16 bits
// (15 in the lines): a disagreement passes unseen with odds of 1 in 32768 per call. A flag
// holds the epoch above them, so epochs count to 2^48.
#define SIG_BITS 16
#define SIG_MASK ((1u << SIG_BITS) - 1)
// No call has this signature: a copy-engine call's closing barrier sends it from a PE that
// could not queue all its copies (see ce_close), so that its peers fail too.
#define SIG_FAILED COLL_SIG_FAILED

// FNV-1a of an entry point's name, at compile time.
__host__ __device__ constexpr uint32_t name_hash(const char *s, uint32_t h = 2166136261u) {
    return *s ? name_hash(s + 1, (h ^ (uint32_t)(unsigned char)*s) * 16777619u) : h;
}

__device__ __forceinline__ uint32_t call_sig_of(uint32_t name, uint64_t len, int root) {
    uint64_t x = ((uint64_t)name << 32 | (uint32_t)root) ^ (len * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const uint32_t sig = (uint32_t)x & SIG_MASK;
    return sig == SIG_FAILED ? 0 : sig;
}

// The signature of the entry point `name` (a string literal) called for `len` from `root`.
#define CALL_SIG(name, len, root) call_sig_of(std::integral_constant<uint32_t, name_hash(name)>::value, (len), (root))

// Kept per block: every thread stores the same value before it reads it.
static __shared__ uint32_t call_sig_s;

__device__ __forceinline__ uint32_t call_sig() { return call_sig_s; }

// Every entry point starts here. Launched with programmatic stream serialization, a kernel
// may start while the previous kernel on its stream is still running: griddepcontrol.wait
// holds it until that kernel has completed and its memory is visible (without the launch
// attribute it returns at once). Then it lets the next kernel on the stream begin its launch,
// which overlaps that launch with this call; the next kernel waits here in turn before it
// touches memory. All of this call's blocks are resident by then, so the early blocks of the
// next kernel cannot keep any of them from running.
// `sig` is the call's signature (above), kept for its handshakes and lines.
__device__ __forceinline__ void enter_call(uint32_t sig) {
    call_sig_s = sig;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- the team --------------------------------------------------------------------------
// A call numbers PEs in its Collectives' team (Ctrl.team): this PE is team_me of team_npes,
// and peer_ptr maps member p's copy of a symmetric address here. Read from the control words
// alongside the epoch, in the same round trip.
__device__ __forceinline__ int team_me(const Ctrl *ctrl) { return ctrl->team.me; }
__device__ __forceinline__ int team_npes(const Ctrl *ctrl) { return ctrl->team.npes; }
__device__ __forceinline__ void *peer_ptr(const Ctrl *ctrl, const void *addr, int p) {
    return nvshmem_ptr(addr, ctrl->team.start + p * ctrl->team.stride);
}

__device__ __forceinline__ uint64_t *flag_at(uint64_t *flags, int set, int block, int pe, int npes) {
    return flags + ((size_t)set * MAX_BLOCKS + block) * npes + pe;
}

// ---- bounded waits -----------------------------------------------------------------------
// Every poll loop of our collectives counts its polls, and once in WAIT_SPINS_PER_CHECK polls
// takes the slow path below: so a wait that ends quickly never reads the clock. A wait that
// lasts longer than ctrl->timeout_ns (from its first check on; 0: no bound) stops; the first
// such wait of this PE sets ctrl->aborted and records where it was in ctrl->fault (host
// memory), and every later wait of this PE's calls stops at its first check. A thread whose
// wait stopped passes nothing it computed from the missing data on to its peers, and sends
// no flag that says it is done: a late peer then times out too, instead of taking garbage.
// The call's own result is garbage, and the host reports the fault instead of returning it.
#define WAIT_SPINS_PER_CHECK 1024

__device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One wait's poll count and clock, inlined (a call out of the loop gives kernels a stack
// frame: measured 0.1 us more per call at one PE), in two registers (more spill in the
// kernels that poll many peers). A kernel that polls several peers in an unrolled loop
// shares one Wait between them and reports once, after the loop: the report inlined at every
// poll site made such kernels half as large again, and slower. Time is counted in units of
// 2^20 ns (about a millisecond).
#define WAIT_STUCK 0x80000000u
#define WAIT_MISMATCH 0x40000000u
#define WAIT_PE 0x00FFFFFFu
struct Wait {
    Ctrl *ctrl;
    uint32_t spins = 0;  // polls since the last check; once the bound ran out, WAIT_STUCK | the PE
    uint32_t since = 0;  // the first check's time (never 0 once set); after a mismatch, both signatures
    __device__ __forceinline__ explicit Wait(Ctrl *c) : ctrl(c) {}
    __device__ __forceinline__ static uint32_t units(uint64_t ns) { return (uint32_t)(ns >> 20); }
    // After a poll that found nothing: whether to poll again. False when this PE already
    // gave up a wait, or when this wait, for `pe`, ran past the bound (report() follows).
    __device__ __forceinline__ bool again(int pe) {
        return again(pe, [](int *, uint32_t *, uint32_t *) { return false; });
    }
    // The same, and at each check `mismatched(&pe, &theirs, &mine)` says whether what came
    // so far is another call's (a line with another signature, which the poll, looking for
    // this call's, never takes): the wait then stops with a mismatch. Only at the checks, so
    // that the polls themselves cost what they cost without the signatures.
    template <typename Mismatched>
    __device__ __forceinline__ bool again(int pe, Mismatched mismatched) {
        // Counted from 0 again at every check: a count of every poll would reach WAIT_STUCK
        // after 2^31 polls (half an hour or so) and stop a wait with no bound, or a long one.
        if (__builtin_expect(++spins < WAIT_SPINS_PER_CHECK, 1)) return true;
        uint32_t theirs, mine;
        if (mismatched(&pe, &theirs, &mine)) return mismatch(pe, theirs, mine);
        spins = 0;
        if (*(volatile unsigned int *)&ctrl->aborted) return false;
        const uint32_t now = units(globaltimer()) | 1u;
        if (since == 0) since = now;
        const uint64_t limit = ctrl->timeout_ns >> 20;
        if (limit == 0 || limit > 0xFFFFFFFFu || now - since < (uint32_t)limit) return true;
        spins = WAIT_STUCK | (uint32_t)pe;
        return false;
    }
    // What came from `pe` carries signature `theirs` where this PE's call has `mine`: the
    // wait stops as one that ran out of time does (false), and report() says so.
    __device__ __forceinline__ bool mismatch(int pe, uint32_t theirs, uint32_t mine) {
        spins = WAIT_STUCK | WAIT_MISMATCH | (uint32_t)pe;
        since = (theirs & SIG_MASK) << SIG_BITS | (mine & SIG_MASK);
        return false;
    }
    // After a wait that stopped: the first wait of this PE to run past the bound (or to find
    // a mismatch) claims ctrl->aborted and writes the record, alone.
    __device__ __forceinline__ void report(int site, uint64_t e) {
        if (!(spins & WAIT_STUCK) || atomicCAS(&ctrl->aborted, 0u, 1u) != 0u || ctrl->fault == nullptr) return;
        volatile Fault *f = ctrl->fault;
        const bool mismatched = spins & WAIT_MISMATCH;
        f->site = mismatched ? FAULT_MISMATCH : site;
        f->pe = (int)(spins & WAIT_PE);
        f->block = blockIdx.x;
        f->epoch = e;
        f->waited_ns = mismatched ? 0 : (uint64_t)(units(globaltimer()) - since) << 20;
        if (mismatched) {
            f->sent = since >> SIG_BITS;
            f->expected = since & SIG_MASK;
        }
        __threadfence_system();
        f->raised = 1;
    }
};

// Poll the vectors v[p] of every source p with has(p) until ready(v[p]) holds for each, every
// round's loads of the sources still missing in flight together: a source whose data came
// while an earlier one was awaited then costs no round trip of its own. Polled one source
// after another, each such source cost one more L2 round trip: the 8-byte all-reduce took
// 2.93-3.03 us a call on 4 H200s, against 2.60-2.63 polled together (measured). False when
// the wait gave up (see Wait); the caller reports.
// `mismatched` as for Wait::again, given the vectors so far.
template <int MAXP, typename Has, typename At, typename Ready, typename Mismatched>
__device__ __forceinline__ bool poll_together(Wait &w, uint4 *v, Has has, At at, Ready ready, Mismatched mismatched) {
    bool ok = !(w.spins & WAIT_STUCK);
    for (;;) {
        int late = -1;
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (has(p) && !ready(v[p])) late = p;
        if (late < 0) return true;
        if (!ok || !(ok = w.again(late, [&](int *pe, uint32_t *theirs, uint32_t *mine) { return mismatched(v, pe, theirs, mine); })))
            return false;
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (has(p) && !ready(v[p])) v[p] = ld_volatile(at(p));
    }
}

template <int MAXP, typename Has, typename At, typename Ready>
__device__ __forceinline__ bool poll_together(Wait &w, uint4 *v, Has has, At at, Ready ready) {
    return poll_together<MAXP>(w, v, has, at, ready, [](const uint4 *, int *, uint32_t *, uint32_t *) { return false; });
}

// The epoch of this call.
__device__ __forceinline__ uint64_t call_epoch(const Ctrl *ctrl) {
    return ctrl->epoch[blockIdx.x] + 1;
}

// Staging, and the sentinel buffers, on every PE: [epoch parity][source PE][slot_bytes], so
// that calls sharing a slot are two epochs apart. Where source's slot of epoch e starts.
__device__ __forceinline__ size_t slot_offset(uint64_t e, int source, int npes, size_t slot_bytes) {
    return (e & 1) * npes * slot_bytes + (size_t)source * slot_bytes;
}

// Publish the epoch for the next call on this PE (see Ctrl).
__device__ __forceinline__ void finish_call(Ctrl *ctrl, uint64_t e) {
    __syncthreads();  // every thread of this block has read its copy
    for (unsigned int i = blockIdx.x + threadIdx.x * gridDim.x; i < MAX_BLOCKS; i += blockDim.x * gridDim.x)
        ctrl->epoch[i] = e;
}

// Tell every other PE's block `blockIdx.x` that this block's stores to it are done, then wait
// for the same from each of them. Threads 0..npes-1 each handle one peer. A flag holds
// (epoch << SIG_BITS) | signature: it still only grows, and a peer's flag of this epoch with
// another signature is a mismatch (one already a call ahead is not compared). False, in
// every thread of the block, when a wait gave up or found a mismatch (see Wait).
__device__ __forceinline__ bool signal_and_wait(Ctrl *ctrl, uint64_t *flags, int set, int me, int npes, uint64_t e) {
    const uint32_t sig = call_sig();
    const uint64_t word = e << SIG_BITS | sig;
    __syncthreads();
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        if (p != me) {
            uint64_t *remote = (uint64_t *)peer_ptr(ctrl, flag_at(flags, set, blockIdx.x, me, npes), p);
            st_release_sys(remote, word);
        }
    }
    bool ok = true;
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        if (p != me) {
            const uint64_t *mine = flag_at(flags, set, blockIdx.x, p, npes);
            Wait w(ctrl);
            uint64_t v;
            while (ok && (v = ld_acquire_sys(mine)) < (e << SIG_BITS)) ok = w.again(p);
            if (ok && (v >> SIG_BITS) == e && (uint32_t)(v & SIG_MASK) != sig) ok = w.mismatch(p, (uint32_t)v, sig);
            if (!ok) w.report(FAULT_FLAGS, e);
        }
    }
    return __syncthreads_and(ok);
}


// The flag value that announces round r of call e, for the paths that signal in rounds (the
// bandwidth all-reduce, the relay broadcast): (e << COLL_ROUND_BITS) | (r + 1), so values grow
// over rounds and calls.
__device__ __forceinline__ uint64_t round_tag(uint64_t e, int r) { return (e << COLL_ROUND_BITS) | (uint64_t)(r + 1); }

// PE q's part of nvec vectors in the two-shot algorithms: [nvec * q / npes, nvec * (q + 1) / npes).
__device__ __forceinline__ void part_of(size_t nvec, int q, int npes, size_t *b, size_t *e) {
    *b = nvec * q / npes;
    *e = nvec * (q + 1) / npes;
}

// Run CALL with NP, the PE count as a compile-time constant where it is a common one (0: any).
#define WITH_NP(npes, CALL)                           \
    switch (npes) {                                   \
    case 2: { constexpr int NP = 2; CALL; break; }    \
    case 4: { constexpr int NP = 4; CALL; break; }    \
    case 8: { constexpr int NP = 8; CALL; break; }    \
    default: { constexpr int NP = 0; CALL; }          \
    }

// Where a call that reaches its peers through a Peers table stands: who it is, its epoch, and
// where this epoch's slots of the region (staging or the sentinel buffers) are. NP is the PE
// count when known at compile time (0: any, up to LL_MAX_PES). Kernels copy `offset` and
// `base` into locals before their loops: read through the object, they compile to other
// (measured: different) code.
template <int NP> struct TableCall {
    static constexpr int MAXP = NP > 0 ? NP : LL_MAX_PES;
    int me, npes;
    uint64_t e;
    size_t offset;  // my slot in the region, at any PE (add peers.slot[p])
    char *base;     // this epoch's slots here: source p's at base + p * slot_bytes
    __device__ __forceinline__ TableCall(Ctrl *ctrl, char *region, size_t slot_bytes, const Peers &peers)
        : me(peers.me),
          npes(NP > 0 ? NP : peers.npes),
          e(call_epoch(ctrl)),
          offset(slot_offset(e, me, npes, slot_bytes)),
          base(region + slot_offset(e, 0, npes, slot_bytes)) {}
};
