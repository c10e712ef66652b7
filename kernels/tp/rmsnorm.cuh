// The residual add and RMSNorm after a row-parallel layer's all-reduce (src/tp/norm.rs):
//   r   = bf16(s + residual), s the all-reduce's result as our all-reduces give it (summed in
//         PE order in f32, rounded to bf16); r is the new residual
//   out = bf16(r · rsqrt(mean over the token of r² + eps) · weight)
// fused with the all-reduce on our collectives' low-latency lines, or alone after it. Both
// kernels give block b rows b, b + grid, ... and each thread the same 4-element lines of a
// row, and sum the squares in the same order: their results are the same bits.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "abi.h"
#include "collectives/call.cuh"
#include "collectives/low_latency.cuh"

#define RMSNORM_THREADS 512

namespace rmsnorm {

__device__ __forceinline__ void unpack4(uint2 v, float *f) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
    const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
}

__device__ __forceinline__ uint2 pack4(const float *f) {
    uint2 v;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&v;
    h[0] = __floats2bfloat162_rn(f[0], f[1]);
    h[1] = __floats2bfloat162_rn(f[2], f[3]);
    return v;
}

// The sum of v over the block, the same bits on every call, in every thread. `scratch`
// holds a float per warp.
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();  // scratch is free from the row before
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    float s = 0.0f;
    for (unsigned int w = 0; w < blockDim.x / 32; w++) s += scratch[w];
    return s;
}

// r = bf16(s + res) for 4 elements; returns r and adds the sum of its squares to *sq.
__device__ __forceinline__ uint2 add_residual(uint2 s, uint2 res, float *sq) {
    float a[4], b[4], r[4];
    unpack4(s, a);
    unpack4(res, b);
#pragma unroll
    for (int h = 0; h < 4; h++) r[h] = __bfloat162float(__float2bfloat16_rn(a[h] + b[h]));
    *sq += ((r[0] * r[0] + r[1] * r[1]) + r[2] * r[2]) + r[3] * r[3];
    return pack4(r);
}

// bf16(r · scale · w) for 4 elements.
__device__ __forceinline__ uint2 normalize(uint2 r, uint2 w, float scale) {
    float a[4], b[4], o[4];
    unpack4(r, a);
    unpack4(w, b);
#pragma unroll
    for (int h = 0; h < 4; h++) o[h] = a[h] * scale * b[h];
    return pack4(o);
}

__device__ __forceinline__ float scale_of(float sum_squares, const RmsNorm &a) {
    return rsqrtf(sum_squares / (float)a.hidden + a.eps);
}

// A row's lines a thread keeps in registers, and the weight's elements kept in shared memory:
// rows of up to 4 × RMSNORM_MAX_LINES × RMSNORM_THREADS (8192) elements load their residual
// and weight before the sums are waited for, and normalise from there; longer rows read
// them again.
#define RMSNORM_MAX_LINES 4
#define RMSNORM_SHARED_WEIGHT (4 * RMSNORM_MAX_LINES * RMSNORM_THREADS)

// What a block keeps: the weight (when the row fits) and the block sum's scratch.
struct RmsShared {
    uint2 weight[RMSNORM_SHARED_WEIGHT / 4];
    float scratch[RMSNORM_THREADS / 32];
};

// The weight into shared memory, when the rows fit there (before any row: every thread then
// reads it after its first block_sum, whose barriers order the stores before).
__device__ __forceinline__ void load_weight(const RmsNorm &a, RmsShared &sh) {
    const size_t lpr = a.hidden / 4;
    if (lpr > RMSNORM_MAX_LINES * (size_t)blockDim.x) return;
    const uint2 *weight = (const uint2 *)(uintptr_t)a.weight;
    for (size_t q = threadIdx.x; q < lpr; q += blockDim.x) sh.weight[q] = weight[q];
}

// One row: this thread's lines q = threadIdx.x, + blockDim.x, ... of `lpr`, each summed by
// `sum_of(j, &ok)` (line j = row * lpr + q of the input), the residual added and stored, the
// block's sum of squares taken, and the row normalised into `out` unless some thread's `ok`
// is false. Both kernels call it, so their bits agree.
template <typename SumOf>
__device__ __forceinline__ bool rms_row(size_t row, size_t lpr, const RmsNorm &a, __nv_bfloat16 *out, RmsShared &sh,
                                        bool ok, SumOf sum_of) {
    uint2 *residual = (uint2 *)(uintptr_t)a.residual;
    const uint2 *weight = (const uint2 *)(uintptr_t)a.weight;
    uint2 *out2 = (uint2 *)out;
    float sq = 0.0f;
    if (lpr <= RMSNORM_MAX_LINES * (size_t)blockDim.x) {
        uint2 r[RMSNORM_MAX_LINES];
#pragma unroll
        for (int k = 0; k < RMSNORM_MAX_LINES; k++) {
            const size_t q = threadIdx.x + (size_t)k * blockDim.x;
            if (q < lpr) r[k] = residual[row * lpr + q];
        }
#pragma unroll
        for (int k = 0; k < RMSNORM_MAX_LINES; k++) {
            const size_t q = threadIdx.x + (size_t)k * blockDim.x;
            if (q < lpr) {
                const uint2 s = sum_of(row * lpr + q, &ok);
                if (ok) {
                    r[k] = add_residual(s, r[k], &sq);
                    residual[row * lpr + q] = r[k];
                }
            }
        }
        const float scale = scale_of(block_sum(sq, sh.scratch), a);
        ok = __syncthreads_and(ok);
        if (ok) {
#pragma unroll
            for (int k = 0; k < RMSNORM_MAX_LINES; k++) {
                const size_t q = threadIdx.x + (size_t)k * blockDim.x;
                if (q < lpr) out2[row * lpr + q] = normalize(r[k], sh.weight[q], scale);
            }
        }
        return ok;
    }
    for (size_t q = threadIdx.x; q < lpr; q += blockDim.x) {
        const size_t j = row * lpr + q;
        const uint2 s = sum_of(j, &ok);
        if (ok) residual[j] = add_residual(s, residual[j], &sq);
    }
    const float scale = scale_of(block_sum(sq, sh.scratch), a);
    ok = __syncthreads_and(ok);
    if (ok)
        for (size_t q = threadIdx.x; q < lpr; q += blockDim.x)
            out2[row * lpr + q] = normalize(residual[row * lpr + q], weight[q], scale);
    return ok;
}

}  // namespace rmsnorm

// After an all-reduce: `sum` (tokens × hidden, may be `out`) is its result.
__device__ void rmsnorm_after(const __nv_bfloat16 *sum, __nv_bfloat16 *out, uint64_t rows, const RmsNorm &a) {
    __shared__ rmsnorm::RmsShared sh;
    rmsnorm::load_weight(a, sh);
    const size_t lpr = a.hidden / 4;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x)
        rmsnorm::rms_row(row, lpr, a, out, sh, true,
                         [&](size_t j, bool *) { return ((const uint2 *)sum)[j]; });
}

// Fused: every line of this block's rows of x goes to every peer (as the low-latency
// all-reduce sends them), then row by row each thread takes its lines from every PE, sums
// them in PE order, adds the residual, and the block normalises the row. A line's sender and
// reader are the same block on every PE. After a wait that gave up, the rows from there on
// are left (the host reports the fault). `sh` is the entry point's (one for every PE count's
// instance).
template <int NP>
__device__ void allreduce_rmsnorm_lines(const __nv_bfloat16 *x, __nv_bfloat16 *out, size_t n, Ctrl *ctrl, char *lines,
                                        size_t slot_bytes, const Peers &peers, const RmsNorm &a,
                                        rmsnorm::RmsShared &sh) {
    const TableCall<NP> c(ctrl, lines, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const uint32_t t = ll_tag(c.e);
    const uint2 *x2 = (const uint2 *)x;
    const size_t lpr = a.hidden / 4, rows = n / a.hidden;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x)
        for (size_t q = threadIdx.x; q < lpr; q += blockDim.x) {
            const size_t j = row * lpr + q;
            const uint2 v = x2[j];
            for (int p = 0; p < npes; p++)
                if (p != me) st_line((uint4 *)(peers.slot[p] + offset) + j, v.x, v.y, t);
        }
    rmsnorm::load_weight(a, sh);
    bool ok = true;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x)
        ok = rmsnorm::rms_row(row, lpr, a, out, sh, ok, [&](size_t j, bool *fine) {
            const uint2 own = x2[j];
            uint2 in[MAXP];
            const bool got = ld_lines<NP>(ctrl, c.e, base, slot_bytes, j, me, npes, t, in);
            *fine = *fine && got;
            return reduce_in_pe_order<__nv_bfloat16, OpSum, MAXP>(in, own, me, npes);
        });
    finish_call(ctrl, c.e);
}
