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
