// Device-initiated point-to-point benchmarks (used by bench/).
//
// Latency kernels run one thread, one warp or one block, repeat an operation `warmup + iters`
// times and write the time of the last `iters` repetitions (read from %globaltimer, in ns) to
// `*elapsed`. Bandwidth kernels split a message over the blocks of the grid and are timed with
// CUDA events by the host. Every kernel takes device addresses of symmetric buffers.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include <nvshmem_rs/channel.cuh>

namespace {

enum Scope { THREAD = 0, WARP = 1, BLOCK = 2 };

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

template <int S>
__device__ __forceinline__ void scope_sync() {
    if constexpr (S == WARP) {
        __syncwarp();
    } else if constexpr (S == BLOCK) {
        __syncthreads();
    }
}

template <int S>
__device__ __forceinline__ void put_scoped(void *dst, const void *src, size_t bytes, int pe) {
    if constexpr (S == THREAD) {
        nvshmem_putmem(dst, src, bytes, pe);
    } else if constexpr (S == WARP) {
        nvshmemx_putmem_warp(dst, src, bytes, pe);
    } else {
        nvshmemx_putmem_block(dst, src, bytes, pe);
    }
}

template <int S>
__device__ __forceinline__ void get_scoped(void *dst, const void *src, size_t bytes, int pe) {
    if constexpr (S == THREAD) {
        nvshmem_getmem(dst, src, bytes, pe);
    } else if constexpr (S == WARP) {
        nvshmemx_getmem_warp(dst, src, bytes, pe);
    } else {
        nvshmemx_getmem_block(dst, src, bytes, pe);
    }
}

template <int S>
__device__ __forceinline__ void put_signal_scoped(void *dst, const void *src, size_t bytes, uint64_t *sig,
                                                  uint64_t value, int pe) {
    if constexpr (S == THREAD) {
        nvshmem_putmem_signal(dst, src, bytes, sig, value, NVSHMEM_SIGNAL_SET, pe);
    } else if constexpr (S == WARP) {
        nvshmemx_putmem_signal_warp(dst, src, bytes, sig, value, NVSHMEM_SIGNAL_SET, pe);
    } else {
        nvshmemx_putmem_signal_block(dst, src, bytes, sig, value, NVSHMEM_SIGNAL_SET, pe);
    }
}

// put + quiet, repeated: the time until the data is delivered at the peer.
template <int S>
__device__ void put_latency(void *dst, const void *src, size_t bytes, int peer, int warmup, int iters,
                            unsigned long long *elapsed) {
    unsigned long long t0 = 0;
    for (int i = 0; i < warmup + iters; ++i) {
        if (i == warmup) {
            scope_sync<S>();
            t0 = now_ns();
        }
        put_scoped<S>(dst, src, bytes, peer);
        scope_sync<S>();
        if (threadIdx.x == 0) nvshmem_quiet();
        scope_sync<S>();
    }
    if (threadIdx.x == 0) *elapsed = now_ns() - t0;
}

// Blocking get, repeated: returns once the data is in local memory. Repetition i of the
// launch reads slot (first + i) % nslots of the peer's source region, so no repetition finds
// the bytes of an earlier one in this GPU's caches.
template <int S>
__device__ void get_latency(void *dst, const char *src, size_t slot_bytes, size_t nslots, size_t first,
                            size_t bytes, int peer, int warmup, int iters, unsigned long long *elapsed) {
    unsigned long long t0 = 0;
    for (int i = 0; i < warmup + iters; ++i) {
        if (i == warmup) {
            scope_sync<S>();
            t0 = now_ns();
        }
        get_scoped<S>(dst, src + ((first + i) % nslots) * slot_bytes, bytes, peer);
        scope_sync<S>();
    }
    if (threadIdx.x == 0) *elapsed = now_ns() - t0;
}

// Ping-pong with put-with-signal: the initiator sends `bytes` and the signal value i + 1, the
// responder waits for it and answers the same way. `*elapsed` is the round-trip total.
// `sig` must hold 0 on both PEs before the launch.
template <int S>
__device__ void put_signal_pingpong(void *dst, const void *src, size_t bytes, uint64_t *sig, int peer,
                                    int initiator, int warmup, int iters, unsigned long long *elapsed) {
    unsigned long long t0 = 0;
    for (int i = 0; i < warmup + iters; ++i) {
        if (i == warmup) {
            scope_sync<S>();
            t0 = now_ns();
        }
        const uint64_t value = (uint64_t)i + 1;
        if (initiator) {
            put_signal_scoped<S>(dst, src, bytes, sig, value, peer);
            if (threadIdx.x == 0) nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, value);
            scope_sync<S>();
        } else {
            if (threadIdx.x == 0) nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, value);
            scope_sync<S>();
            put_signal_scoped<S>(dst, src, bytes, sig, value, peer);
        }
    }
    if (threadIdx.x == 0) *elapsed = now_ns() - t0;
}

// The part of a `bytes`-long message that this block moves: 16-byte aligned, contiguous pieces.
__device__ __forceinline__ void block_piece(size_t bytes, size_t &offset, size_t &len) {
    size_t chunk = (bytes + gridDim.x - 1) / gridDim.x;
    chunk = (chunk + 15) & ~(size_t)15;
    offset = (size_t)blockIdx.x * chunk;
    len = offset < bytes ? (bytes - offset < chunk ? bytes - offset : chunk) : 0;
}

}  // namespace

// ---- single-element put (p) and get (g), one thread -------------------------------------------

// dst[i % 32] = token + i on `peer`, each followed by quiet.
extern "C" __global__ void bench_p_latency(uint32_t *dst, int peer, uint32_t token, int warmup, int iters,
                                           unsigned long long *elapsed) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned long long t0 = 0;
    for (int i = 0; i < warmup + iters; ++i) {
        if (i == warmup) t0 = now_ns();
        nvshmem_uint32_p(dst + (i % 32), token + (uint32_t)i, peer);
        nvshmem_quiet();
    }
    *elapsed = now_ns() - t0;
}

// Sum of nvshmem_uint32_g reads from `peer`. Read i is at word ((i * G_STEP) % G_SLOTS) *
// G_STRIDE: a different 128-byte line each time over 8 MiB, so no cache serves it, and its
// address depends on the previous read's value (one word further when it equals G_MAGIC, which
// the host replays exactly), so reads cannot overlap: the time is the latency of one remote read.
#define G_SLOTS 65536
#define G_STRIDE 32
#define G_STEP 40503
#define G_MAGIC 0x9E3779B9u
extern "C" __global__ void bench_g_latency(const uint32_t *src, int peer, int warmup, int iters,
                                           unsigned long long *sum_out, unsigned long long *elapsed) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned long long t0 = 0;
    unsigned long long sum = 0;
    uint32_t v = 0;
    for (int i = 0; i < warmup + iters; ++i) {
        if (i == warmup) t0 = now_ns();
        const size_t word = (((size_t)i * G_STEP) % G_SLOTS) * G_STRIDE + (v == G_MAGIC ? 1 : 0);
        v = nvshmem_uint32_g(src + word, peer);
        sum += v;
    }
    *elapsed = now_ns() - t0;
    *sum_out = sum;
}

// ---- put / get latency at thread, warp and block scope ----------------------------------------

#define BENCH_LATENCY_KERNELS(NAME, SCOPE)                                                             \
    extern "C" __global__ void bench_put_latency_##NAME(void *dst, const void *src, size_t bytes,      \
                                                        int peer, int warmup, int iters,               \
                                                        unsigned long long *elapsed) {                 \
        put_latency<SCOPE>(dst, src, bytes, peer, warmup, iters, elapsed);                             \
    }                                                                                                  \
    extern "C" __global__ void bench_get_latency_##NAME(                                               \
        void *dst, const char *src, size_t slot_bytes, size_t nslots, size_t first, size_t bytes,      \
        int peer, int warmup, int iters, unsigned long long *elapsed) {                                \
        get_latency<SCOPE>(dst, src, slot_bytes, nslots, first, bytes, peer, warmup, iters, elapsed);  \
    }                                                                                                  \
    extern "C" __global__ void bench_put_signal_pingpong_##NAME(                                       \
        void *dst, const void *src, size_t bytes, uint64_t *sig, int peer, int initiator, int warmup,  \
        int iters, unsigned long long *elapsed) {                                                      \
        put_signal_pingpong<SCOPE>(dst, src, bytes, sig, peer, initiator, warmup, iters, elapsed);     \
    }

BENCH_LATENCY_KERNELS(thread, THREAD)
BENCH_LATENCY_KERNELS(warp, WARP)
BENCH_LATENCY_KERNELS(block, BLOCK)

// ---- bandwidth: the message split over the grid's blocks --------------------------------------

// Every block puts its piece into slot (first + i) % nslots of the peer's destination region
// for i < iters (non-blocking), then waits for completion. Writing fresh lines each time keeps
// the caches from merging repetitions, so every one crosses the link.
extern "C" __global__ void bench_put_bw(char *dst, const char *src, size_t slot_bytes, size_t nslots, size_t first,
                                        size_t bytes, int peer, int iters) {
    size_t offset, len;
    block_piece(bytes, offset, len);
    if (len > 0) {
        for (int i = 0; i < iters; ++i) {
            char *to = dst + ((first + i) % nslots) * slot_bytes;
            nvshmemx_putmem_nbi_block(to + offset, src + offset, len, peer);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
}

// Every PE to every other at once: the grid's blocks are dealt round the npes - 1 peers
// (block b to peer me + 1 + b % (npes - 1)), each moving its piece of `bytes` from src into
// this PE's slot of the peer's destination (dst + me * bytes), `iters` times, then waiting
// for completion. The grid is a multiple of npes - 1.
extern "C" __global__ void bench_put_all_bw(char *dst, const char *src, size_t bytes, int iters) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    if (npes < 2) return;
    const unsigned int per_peer = gridDim.x / (npes - 1);
    const int peer = (me + 1 + (int)(blockIdx.x % (npes - 1))) % npes;
    size_t chunk = (bytes + per_peer - 1) / per_peer;
    chunk = (chunk + 15) & ~(size_t)15;
    const size_t offset = (size_t)(blockIdx.x / (npes - 1)) * chunk;
    const size_t len = offset < bytes ? (bytes - offset < chunk ? bytes - offset : chunk) : 0;
    if (len > 0)
        for (int i = 0; i < iters; ++i)
            nvshmemx_putmem_nbi_block(dst + (size_t)me * bytes + offset, src + offset, len, peer);
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
}

// Every block gets its piece of slot (first + i) % nslots of the peer's source region for
// i < iters (non-blocking, fresh lines each time, as in get_latency), then waits for
// completion. Over NVLink a block's gets are its own threads' loads and stores, so the last
// repetition's bytes are what `dst` holds at the end.
extern "C" __global__ void bench_get_bw(char *dst, const char *src, size_t slot_bytes, size_t nslots, size_t first,
                                        size_t bytes, int peer, int iters) {
    size_t offset, len;
    block_piece(bytes, offset, len);
    if (len > 0) {
        for (int i = 0; i < iters; ++i) {
            const char *from = src + ((first + i) % nslots) * slot_bytes;
            nvshmemx_getmem_nbi_block(dst + offset, from + offset, len, peer);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
}

// ---- test data ---------------------------------------------------------------------------------

// dst[i] = mix(base + i): the benchmark's counter-based random words (data.rs, `mix`), made
// on the GPU so that large source regions are refreshed for every case at no host cost.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

extern "C" __global__ void bench_fill_random(uint64_t *dst, size_t words, uint64_t base) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = mix64(base + i);
}

// ---- channel ping-pong: persistent kernels handing messages through nvshmem_rs/channel.cuh ----

// The floor of a user's fused pipeline stage: one kernel on each end, the initiator pushing
// `bytes` of src through `there` and popping the answer from `back` into dst, the target
// popping and pushing its own src back, `warmup + iters` rounds with no host in between. A
// wait that gives up ends the kernel and leaves `*elapsed` 0 (the host then reads the
// channels' fault records).
template <nvshmem_rs::Scope S>
__device__ void channel_pingpong(nvshmem_rs_channel there, nvshmem_rs_channel back, void *dst,
                                 const void *src, uint64_t bytes, int initiator, int warmup,
                                 int iters, unsigned long long *elapsed) {
    if (threadIdx.x == 0) *elapsed = 0;
    unsigned long long t0 = 0;
    for (int i = 0; i < warmup + iters; ++i) {
        if (i == warmup) t0 = now_ns();
        if (initiator) {
            if (!nvshmem_rs::channel_push<S>(there, src, bytes)) return;
            if (nvshmem_rs::channel_pop<S>(back, dst, bytes) == nvshmem_rs::CHANNEL_TIMED_OUT) return;
        } else {
            if (nvshmem_rs::channel_pop<S>(there, dst, bytes) == nvshmem_rs::CHANNEL_TIMED_OUT) return;
            if (!nvshmem_rs::channel_push<S>(back, src, bytes)) return;
        }
    }
    if (threadIdx.x == 0) *elapsed = now_ns() - t0;
}

#define BENCH_CHANNEL_PINGPONG(NAME, SCOPE)                                                            \
    extern "C" __global__ void bench_channel_pingpong_##NAME(                                          \
        nvshmem_rs_channel there, nvshmem_rs_channel back, void *dst, const void *src, uint64_t bytes, \
        int initiator, int warmup, int iters, unsigned long long *elapsed) {                           \
        channel_pingpong<SCOPE>(there, back, dst, src, bytes, initiator, warmup, iters, elapsed);      \
    }

BENCH_CHANNEL_PINGPONG(thread, nvshmem_rs::Scope::Thread)
BENCH_CHANNEL_PINGPONG(warp, nvshmem_rs::Scope::Warp)
BENCH_CHANNEL_PINGPONG(block, nvshmem_rs::Scope::Block)
