// The row-parallel layer's decode form, fused: the decode GEMM of this PE's partial product
// and the all-reduce of the partial products in one kernel, on our collectives' protocol
// (collectives/call.cuh: the call's epoch, the staging slots of its parity, one flag
// handshake per block, bounded waits).
//
// The thread that finishes a feature's sum stores it, rounded to bf16 as a GEMM writes its
// output, straight into this PE's staging slot on every PE, itself included: the partial
// product never goes through memory of its own, and no kernel boundary separates the GEMM
// from the exchange. Each block then signals its peers' same block and waits for theirs; the
// features a block computed are exactly those its peers' same block sent, so once its
// handshake is done it sums them over the PEs in PE order (in f32, rounded once, as the
// one-shot all-reduce does) and writes y. Blocks finish independently: the exchange of the
// first blocks to finish overlaps the GEMM of the others. Every PE launches the same grid.
#pragma once

#include <cuda_bf16.h>
#include <nvshmem.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/low_latency.cuh"
#include "tp/decode.cuh"

// Shared memory, declared once by the kernel: the warps' sums of a task for up to R tokens.
template <int R>
struct DecodeAllReduceShared {
    DecodeRed<R> red;
    __nv_bfloat16 *slot[MAX_PES];  // my slot of this epoch, on every PE
};

template <int M>
__device__ void decode_linear_allreduce(const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *y, int m, uint64_t n,
                                        uint64_t k, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes,
                                        DecodeAllReduceShared<DECODE_RED_TOKENS(M)> &sh) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    __nv_bfloat16 **slot = sh.slot;
    for (int p = threadIdx.x; p < npes; p += blockDim.x)
        slot[p] = (__nv_bfloat16 *)nvshmem_ptr(base + (size_t)me * slot_bytes, p);
    __syncthreads();
    auto push = [&](uint64_t j, int i, float sum) {
        const __nv_bfloat16 v = __float2bfloat16_rn(sum);
        for (int p = 0; p < npes; p++) slot[p][i * n + j] = v;
    };
    decode_rows<M>(x, w, m, n, k, sh.red, push);
    // After a wait that gave up, y is left alone (the host reports the fault).
    const bool ok = signal_and_wait(ctrl, flags, FLAGS_DATA, me, npes, e);
    // The block's tasks again: thread 16i + r sums feature f0 + r of token i.
    const int r = threadIdx.x % DECODE_TASK, i = threadIdx.x / DECODE_TASK;
    if (ok && i < m)
        FOR_EACH_DECODE_TASK(n, f0) {
            const uint64_t j = f0 + r;
            if (j >= n) continue;
            const size_t at = (size_t)i * n + j;
            float acc = __bfloat162float(ld_cg_t((const __nv_bfloat16 *)base + at));
            for (int q = 1; q < npes; q++)
                acc += __bfloat162float(ld_cg_t((const __nv_bfloat16 *)(base + (size_t)q * slot_bytes) + at));
            y[at] = __float2bfloat16_rn(acc);
        }
    finish_call(ctrl, e);
}

// ---- the same on low-latency lines ------------------------------------------------------
// Where every PE has the low-latency lines region (up to LL_MAX_PES PEs) and the output's
// rows are whole lines (n a multiple of 4, y 8-byte aligned): as each task is done, its sums,
// rounded to bf16, go to every peer as 16-byte lines of 4 features carrying the call's tag
// (collectives/low_latency.cuh), and this PE's own into its own slot of the region. No
// fence, no flag: at the end each thread takes the lines it sent, from every PE (polling
// each until its tag shows, then zeroing it), and sums them in PE order in f32, as the
// flagged form above and the all-reduces do, so the bits are the same. Each PE's block b
// takes the same tasks, so a line's sender and reader are the same block of every PE.
template <int R>
struct DecodeLinesShared {
    DecodeRed<R> red;
    __nv_bfloat16 out[R][DECODE_TASK];  // the task's sums, by token and feature
};

__device__ __forceinline__ uint32_t pack_bf16x2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}

template <int M>
__device__ void decode_linear_allreduce_lines(const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *y, int m,
                                              uint64_t n, uint64_t k, Ctrl *ctrl, char *lines, size_t slot_bytes,
                                              const Peers &peers, DecodeLinesShared<DECODE_RED_TOKENS(M)> &sh) {
    const TableCall<0> c(ctrl, lines, slot_bytes, peers);
    const int me = c.me, npes = c.npes;
    const uint32_t t = ll_tag(c.e);
    auto keep = [&](uint64_t j, int i, float sum) { sh.out[i][j % DECODE_TASK] = __float2bfloat16_rn(sum); };
    // Thread 4i + q: the line of token i's features f0 + 4q .. f0 + 4q + 3.
    const int i = threadIdx.x / 4, q = threadIdx.x % 4;
    uint4 *mine = (uint4 *)(c.base + (size_t)me * slot_bytes);
    auto send = [&](uint64_t f0) {
        __syncthreads();  // the task's sums are all in sh.out
        if (i < m && f0 + 4 * q < n) {
            const uint32_t d0 = pack_bf16x2(sh.out[i][4 * q], sh.out[i][4 * q + 1]);
            const uint32_t d1 = pack_bf16x2(sh.out[i][4 * q + 2], sh.out[i][4 * q + 3]);
            const size_t j = ((size_t)i * n + f0) / 4 + q;
            for (int p = 0; p < npes; p++)
                if (p != me) st_line((uint4 *)(peers.slot[p] + c.offset) + j, d0, d1, t);
            st_volatile(mine + j, make_uint4(d0, t, d1, t));
        }
        __syncthreads();  // sh.out is free for the next task
    };
    decode_rows<M>(x, w, m, n, k, sh.red, keep, send);
    // The lines this thread sent, from every PE; after a wait that gave up, y is left alone
    // (the host reports the fault).
    bool ok = true;
    FOR_EACH_DECODE_TASK(n, f0) {
        if (!(i < m && f0 + 4 * q < n)) continue;
        const size_t j = ((size_t)i * n + f0) / 4 + q;
        const uint4 own = ld_volatile(mine + j);
        st_volatile(mine + j, make_uint4(0, 0, 0, 0));
        uint2 in[LL_MAX_PES];
        const bool got = ld_lines<0>(ctrl, c.e, c.base, slot_bytes, j, me, npes, t, in);
        ok = ok && got;
        if (ok)
            *(uint2 *)(y + (size_t)i * n + f0 + 4 * q) =
                reduce_in_pe_order<__nv_bfloat16, OpSum, LL_MAX_PES>(in, make_uint2(own.x, own.z), me, npes);
    }
    finish_call(ctrl, c.e);
}
