// The row-parallel layer's decode GEMM fused with its all-reduce (Schedule::Fused at up to
// FUSED_DECODE_MAX_M tokens, src/tp/decode.rs), on our collectives' low-latency lines
// (collectives/low_latency.cuh): no partial product goes through memory of its own, and no
// kernel boundary, fence or flag separates the GEMM from the exchange.
// As each task (16 features) is done, its sums, rounded to bf16 as a GEMM writes its output,
// go to every peer as 16-byte lines of 4 features carrying the call's tag, and this PE's own
// into its own slot. At the end each thread takes the lines it sent from every PE (polling
// each until its tag shows, then zeroing it) and sums them in PE order in f32, as the
// all-reduces do, so the bits are the same on every PE. Block b of every PE takes the same
// tasks, so a line's sender and reader are the same block. It needs the output's rows to be
// whole lines (n a multiple of 4, y 8-byte aligned) and up to LL_MAX_PES PEs.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "collectives/call.cuh"
#include "collectives/low_latency.cuh"
#include "tp/decode.cuh"

#define FUSED_DECODE_MAX_M 8

struct DecodeLinesShared {
    DecodeRed<FUSED_DECODE_MAX_M> red;
    __nv_bfloat16 out[FUSED_DECODE_MAX_M][DECODE_TASK];  // the task's sums, by token and feature
};

__device__ __forceinline__ uint32_t pack_bf16x2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}

template <int M>
__device__ void decode_linear_allreduce_lines(const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *y, int m,
                                              uint64_t n, uint64_t k, Ctrl *ctrl, char *lines, size_t slot_bytes,
                                              const Peers &peers, DecodeLinesShared &sh) {
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
