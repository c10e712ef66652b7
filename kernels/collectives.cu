// All-reduce, all-gather, reduce-scatter, reduce, broadcast and all-to-all over NVLink,
// initiated from the device.
//
// Every PE's buffers are symmetric, so a peer's copy is reached with a plain load or store
// through peer_ptr(ctrl, ). Synchronisation uses per-block flags in the symmetric heap:
//   - each call has an epoch e (a per-PE counter in device memory, advanced at the end of
//     every call, so a CUDA graph replays correctly: nothing is baked in at capture);
//   - flags only grow, a block waits for flag >= e, and writes them with st.release.sys after
//     its data stores; the waiter reads with ld.acquire.sys;
//   - staging buffers are double-buffered by the parity of e. A PE cannot be two calls ahead
//     of a peer (each call waits on every peer), so the buffer written in call e+2 is no
//     longer read by call e.
// Reductions add the PEs' values in PE order 0..n-1 (in f32 for 16-bit types), so every PE
// computes a bitwise-identical result.
//
// One file per job under collectives/: call.cuh (the protocol every call follows),
// memory.cuh, reduce.cuh, lines.cuh, then one header per family of algorithms. This file
// holds the entry points, whose names src/collectives/algo.rs derives from its tables.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include "abi.h"
#include "collectives/bandwidth.cuh"
#include "collectives/compress.cuh"
#include "collectives/group.cuh"
#include "collectives/movement.cuh"
#include "collectives/low_latency.cuh"
#include "collectives/oneshot.cuh"
#include "collectives/reduce_scatter.cuh"
#include "collectives/sentinel.cuh"
#include "collectives/twoshot.cuh"

// ---- entry points -------------------------------------------------------------------------
// One entry point `ALGO_allreduce_NAME_OPNAME`: the parameters every all-reduce takes, then
// EXTRA (nothing, or a by-value parameter), and the body CALL.
#define NO_EXTRA
#define PEERS_PARAM , const Peers peers
#define PLAN_PARAM , const BandwidthPlan plan
#define CHUNK_PARAM , unsigned int chunk_vecs
#define ALLREDUCE_ENTRY(ALGO, NAME, T, OPNAME, EXTRA, CALL)                                               \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) ALGO##_allreduce_##NAME##_##OPNAME(                 \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes EXTRA) { \
        enter_call(CALL_SIG(#ALGO "_allreduce_" #NAME "_" #OPNAME, n, 0));                                  \
        CALL;                                                                                               \
    }

#define ALLREDUCE_ENTRIES(NAME, T, OPNAME, OP)                                                                            \
    ALLREDUCE_ENTRY(oneshot, NAME, T, OPNAME, NO_EXTRA, (oneshot_allreduce<T, OP>(src, dst, n, ctrl, flags, staging, slot_bytes))) \
    ALLREDUCE_ENTRY(twoshot, NAME, T, OPNAME, NO_EXTRA, (twoshot_allreduce<T, OP>(src, dst, n, ctrl, flags)))                      \
    ALLREDUCE_ENTRY(ll, NAME, T, OPNAME, PEERS_PARAM, WITH_NP(peers.npes, (ll_allreduce<T, OP, NP>(src, dst, n, ctrl, staging, slot_bytes, peers))))          \
    ALLREDUCE_ENTRY(ll_twoshot, NAME, T, OPNAME, PEERS_PARAM,                                                                     \
                    WITH_NP(peers.npes, (ll_twoshot_allreduce<T, OP, NP>(src, dst, n, ctrl, staging, slot_bytes, peers))))                                  \
    ALLREDUCE_ENTRY(bandwidth, NAME, T, OPNAME, PLAN_PARAM,                                                                       \
                    (bandwidth_allreduce<T, OP>(src, dst, n, ctrl, flags, staging, slot_bytes, plan)))

// The sentinel paths: floating-point types only (see there). Their region is the sentinel
// buffers, passed where the others take the staging area.
#define SENTINEL_ENTRIES(NAME, T, OPNAME, OP)                                                                              \
    ALLREDUCE_ENTRY(sentinel, NAME, T, OPNAME, PEERS_PARAM,                                                                       \
                    WITH_NP(peers.npes, (sentinel_allreduce<T, OP, NP>(src, dst, n, ctrl, staging, slot_bytes, peers))))                                    \
    ALLREDUCE_ENTRY(sentinel_twoshot, NAME, T, OPNAME, PEERS_PARAM,                                                               \
                    WITH_NP(peers.npes, (sentinel_twoshot_allreduce<T, OP, NP>(src, dst, n, ctrl, staging, slot_bytes, peers))))

#define ALLREDUCE_TYPE(NAME, T)              \
    ALLREDUCE_ENTRIES(NAME, T, sum, OpSum)   \
    ALLREDUCE_ENTRIES(NAME, T, max, OpMax)   \
    ALLREDUCE_ENTRIES(NAME, T, min, OpMin)

#define FLOAT_ALLREDUCE_TYPE(NAME, T)    \
    ALLREDUCE_TYPE(NAME, T)              \
    SENTINEL_ENTRIES(NAME, T, sum, OpSum)  \
    SENTINEL_ENTRIES(NAME, T, max, OpMax)  \
    SENTINEL_ENTRIES(NAME, T, min, OpMin)

FLOAT_ALLREDUCE_TYPE(f32, float)
FLOAT_ALLREDUCE_TYPE(f16, __half)
FLOAT_ALLREDUCE_TYPE(bf16, __nv_bfloat16)
ALLREDUCE_TYPE(i32, int32_t)

// The grouped all-reduce (collectives/group.cuh): `ALGO_allreduce_group_NAME_OPNAME`, the
// buffers by value, then the parameters every collective takes but the buffers. Its
// handshakes compare the buffers' lengths and count.
#define GROUP_ENTRY(ALGO, NAME, T, OPNAME, OP, CALL)                                                         \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) ALGO##_allreduce_group_##NAME##_##OPNAME( \
        const Group g, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {                      \
        enter_call(CALL_SIG(#ALGO "_allreduce_group_" #NAME "_" #OPNAME, group_shape(g), (int)g.count));      \
        CALL;                                                                                                 \
    }

#define GROUP_TYPE(NAME, T)                                                                                   \
    GROUP_ENTRY(oneshot, NAME, T, sum, OpSum, (oneshot_allreduce_group<T, OpSum>(g, ctrl, flags, staging, slot_bytes))) \
    GROUP_ENTRY(oneshot, NAME, T, max, OpMax, (oneshot_allreduce_group<T, OpMax>(g, ctrl, flags, staging, slot_bytes))) \
    GROUP_ENTRY(oneshot, NAME, T, min, OpMin, (oneshot_allreduce_group<T, OpMin>(g, ctrl, flags, staging, slot_bytes))) \
    GROUP_ENTRY(twoshot, NAME, T, sum, OpSum, (twoshot_allreduce_group<T, OpSum>(g, ctrl, flags)))                      \
    GROUP_ENTRY(twoshot, NAME, T, max, OpMax, (twoshot_allreduce_group<T, OpMax>(g, ctrl, flags)))                      \
    GROUP_ENTRY(twoshot, NAME, T, min, OpMin, (twoshot_allreduce_group<T, OpMin>(g, ctrl, flags)))

GROUP_TYPE(f32, float)
GROUP_TYPE(f16, __half)
GROUP_TYPE(bf16, __nv_bfloat16)
GROUP_TYPE(i32, int32_t)

// One entry point `ALGO_reducescatter_NAME_OPNAME` per type and operator: the parameters
// every collective takes (the staging pair unused by the pull algorithm; the lines region and
// its peer table for the low-latency one), n per PE.
#define REDUCESCATTER_ENTRY(ALGO, NAME, T, OPNAME, EXTRA, CALL)                                             \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) ALGO##_reducescatter_##NAME##_##OPNAME(                 \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes EXTRA) {  \
        enter_call(CALL_SIG(#ALGO "_reducescatter_" #NAME "_" #OPNAME, n, 0));                              \
        CALL;                                                                                               \
    }

#define REDUCESCATTER_OP(NAME, T, OPNAME, OP)                                                                 \
    REDUCESCATTER_ENTRY(pull, NAME, T, OPNAME, NO_EXTRA, (pull_reducescatter<T, OP>(src, dst, n, ctrl, flags)))    \
    REDUCESCATTER_ENTRY(ll, NAME, T, OPNAME, PEERS_PARAM,                                                             \
                        WITH_NP(peers.npes, (ll_reducescatter<T, OP, NP>(src, dst, n, ctrl, staging, slot_bytes, peers))))

#define REDUCESCATTER_TYPE(NAME, T)              \
    REDUCESCATTER_OP(NAME, T, sum, OpSum)        \
    REDUCESCATTER_OP(NAME, T, max, OpMax)        \
    REDUCESCATTER_OP(NAME, T, min, OpMin)

REDUCESCATTER_TYPE(f32, float)
REDUCESCATTER_TYPE(f16, __half)
REDUCESCATTER_TYPE(bf16, __nv_bfloat16)
REDUCESCATTER_TYPE(i32, int32_t)

// One entry point `pull_reduce_NAME_OPNAME` per type and operator: the reduce-scatter's
// parameters, then the root.
#define REDUCE_ENTRY(NAME, T, OPNAME, OP)                                                                   \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) pull_reduce_##NAME##_##OPNAME(                      \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes, int root) { \
        enter_call(CALL_SIG("pull_reduce_" #NAME "_" #OPNAME, n, root));                                    \
        pull_reduce<T, OP>(src, dst, n, ctrl, flags, root);                                                 \
    }

#define REDUCE_TYPE(NAME, T)                \
    REDUCE_ENTRY(NAME, T, sum, OpSum)       \
    REDUCE_ENTRY(NAME, T, max, OpMax)       \
    REDUCE_ENTRY(NAME, T, min, OpMin)

REDUCE_TYPE(f32, float)
REDUCE_TYPE(f16, __half)
REDUCE_TYPE(bf16, __nv_bfloat16)
REDUCE_TYPE(i32, int32_t)

// The all-gathers move bytes, whatever the element type.
#define ALLGATHER_ENTRY(ALGO, EXTRA, CALL)                                                                  \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) ALGO##_allgather_bytes(                             \
        const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes EXTRA) { \
        enter_call(CALL_SIG(#ALGO "_allgather_bytes", bytes, 0));                                           \
        CALL;                                                                                               \
    }

ALLGATHER_ENTRY(oneshot, NO_EXTRA, (oneshot_allgather(src, dst, bytes, ctrl, flags, staging, slot_bytes)))
ALLGATHER_ENTRY(bandwidth, NO_EXTRA, (bandwidth_allgather(src, dst, bytes, ctrl, flags)))
ALLGATHER_ENTRY(ll, PEERS_PARAM, WITH_NP(peers.npes, (ll_allgather<NP>(src, dst, bytes, ctrl, staging, slot_bytes, peers))))
ALLGATHER_ENTRY(ll_words, PEERS_PARAM, WITH_NP(peers.npes, (ll_allgather_words<NP, false>(src, dst, bytes, ctrl, staging, slot_bytes, peers))))
ALLGATHER_ENTRY(ll_words_cut, PEERS_PARAM, WITH_NP(peers.npes, (ll_allgather_words<NP, true>(src, dst, bytes, ctrl, staging, slot_bytes, peers))))

// The broadcasts move bytes from PE `root`, whatever the element type (the low-latency one
// takes the lines region's peer table before the root, the relay its segment size).
#define BROADCAST_ENTRY(ALGO, EXTRA, CALL)                                                                  \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) ALGO##_broadcast_bytes(                             \
        const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes EXTRA, int root) { \
        enter_call(CALL_SIG(#ALGO "_broadcast_bytes", bytes, root));                                        \
        CALL;                                                                                               \
    }

BROADCAST_ENTRY(oneshot, NO_EXTRA, (oneshot_broadcast(src, dst, bytes, ctrl, flags, staging, slot_bytes, root)))
BROADCAST_ENTRY(push, NO_EXTRA, (push_broadcast(src, dst, bytes, ctrl, flags, root)))
BROADCAST_ENTRY(relay, CHUNK_PARAM, (relay_broadcast(src, dst, bytes, ctrl, flags, chunk_vecs, root)))
BROADCAST_ENTRY(ll, PEERS_PARAM, WITH_NP(peers.npes, (ll_broadcast<NP>(src, dst, bytes, ctrl, flags, staging, slot_bytes, peers, root))))
BROADCAST_ENTRY(ll_relay, PEERS_PARAM, WITH_NP(peers.npes, (ll_relay_broadcast<NP>(src, dst, bytes, ctrl, flags, staging, slot_bytes, peers, root))))

// The all-to-alls move bytes too: `bytes` per block, n_pes blocks each way.
#define ALLTOALL_ENTRY(ALGO, EXTRA, CALL)                                                                   \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) ALGO##_alltoall_bytes(                              \
        const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes EXTRA) { \
        enter_call(CALL_SIG(#ALGO "_alltoall_bytes", bytes, 0));                                            \
        CALL;                                                                                               \
    }

ALLTOALL_ENTRY(oneshot, NO_EXTRA, (oneshot_alltoall(src, dst, bytes, ctrl, flags, staging, slot_bytes)))
ALLTOALL_ENTRY(push, NO_EXTRA, (push_alltoall(src, dst, bytes, ctrl, flags)))
ALLTOALL_ENTRY(ll, PEERS_PARAM, WITH_NP(peers.npes, (ll_alltoall<NP>(src, dst, bytes, ctrl, staging, slot_bytes, peers))))

// The all-to-all with counts: `elem` bytes per element, the counts by value, the table of
// counts where the others take the staging area.
extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) push_alltoallv_bytes(
    const char *src, char *dst, size_t elem, Ctrl *ctrl, uint64_t *flags, char *table, size_t table_bytes, const Counts counts) {
    enter_call(CALL_SIG("push_alltoallv_bytes", elem, 0));
    push_alltoallv(src, dst, elem, ctrl, flags, (uint64_t *)table, counts);
}

// The copy-engine paths: the call's copies (cuMemcpyAsync on copy streams, from the host)
// run between an opening barrier (every PE has entered the call, so its output is free) and
// a closing one (every PE's copies into this PE have landed), each one block of a thread per
// PE. Each barrier is a call of its own on the epoch, with the call's signature from the
// host (`sig`). A PE that could not queue all its copies closes with SIG_FAILED instead: its
// peers then find a mismatch rather than return with its block missing, and it records the
// same about itself. So does a PE that gave up a wait (its opening barrier's, say): the copy
// engines cannot be stopped once queued, so its copies still land in the peer it gave up on,
// which may not have entered the call; that peer's closing barrier must then fail, not
// return with a block written before the peer was ready for it.
extern "C" __global__ void __launch_bounds__(COLL_MAX_PES) ce_open(Ctrl *ctrl, uint64_t *flags, unsigned int sig) {
    enter_call(sig);
    const uint64_t e = call_epoch(ctrl);
    signal_and_wait(ctrl, flags, FLAGS_START, team_me(ctrl), team_npes(ctrl), e);
    finish_call(ctrl, e);
}

extern "C" __global__ void __launch_bounds__(COLL_MAX_PES) ce_close(Ctrl *ctrl, uint64_t *flags, unsigned int sig) {
    enter_call(sig);
    // Read after enter_call: the opening barrier may still run until then.
    if (*(volatile unsigned int *)&ctrl->aborted != 0u) call_sig_s = SIG_FAILED;
    const int me = team_me(ctrl);
    const uint64_t e = call_epoch(ctrl);
    if (sig == SIG_FAILED && threadIdx.x == 0) {
        Wait w(ctrl);
        w.mismatch(me, SIG_FAILED, SIG_FAILED);
        w.report(FAULT_FLAGS, e);
    }
    signal_and_wait(ctrl, flags, FLAGS_DONE, me, team_npes(ctrl), e);
    finish_call(ctrl, e);
}

// The copy-engine paths' copy into this PE's own output, by the SMs beside the copy engines'
// copies to the peers: HBM-bound work that would otherwise take a copy engine too.
extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) ce_local_copy(const char *src, char *dst, size_t bytes) {
    enter_call(0);
    copy_mapped<true>(dst, src, bytes);
}

// The compressed all-reduce's local steps (see collectives/compress.cuh), one entry point per
// input type and format: `compress_quantize_NAME_FMT`, `compress_reduce_FMT`,
// `compress_expand_NAME_FMT`. Each is one of a call's launches, after its predecessor.
#define COMPRESS_TYPE_ENTRIES(NAME, T, FMT, F)                                                              \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) compress_quantize_##NAME##_##FMT(           \
        const T *src, float *fb, char *out, size_t len, size_t shard_len, size_t shard_bytes, size_t data_off, \
        unsigned int block, int npes) {                                                                       \
        enter_call(0);                                                                                        \
        compress_quantize<T, F>(src, fb, out, len, shard_len, shard_bytes, data_off, block, npes);            \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) compress_expand_##NAME##_##FMT(             \
        const char *in, T *dst, size_t len, size_t shard_len, size_t shard_bytes, size_t data_off,            \
        unsigned int block) {                                                                                 \
        enter_call(0);                                                                                        \
        compress_expand<T, F>(in, dst, len, shard_len, shard_bytes, data_off, block);                         \
    }

#define COMPRESS_FORMAT(FMT, F)                                                                               \
    COMPRESS_TYPE_ENTRIES(f32, float, FMT, F)                                                                 \
    COMPRESS_TYPE_ENTRIES(bf16, __nv_bfloat16, FMT, F)                                                        \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) compress_reduce_##FMT(                      \
        const char *in, char *out, float *fb, size_t shard_len, size_t shard_bytes, size_t data_off,          \
        unsigned int block, int npes, size_t valid) {                                                         \
        enter_call(0);                                                                                        \
        compress_reduce<F>(in, out, fb, shard_len, shard_bytes, data_off, block, npes, valid);                \
    }

COMPRESS_FORMAT(fp16, FmtF16)
COMPRESS_FORMAT(bf16, FmtBf16)
COMPRESS_FORMAT(int8, FmtInt8)
COMPRESS_FORMAT(fp8, FmtFp8)
