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

// r = bf16(s + residual) for line j (4 elements): stored as the new residual; returns the
// sum of the squares of r.
__device__ __forceinline__ float add_residual(uint2 s, __nv_bfloat16 *residual, size_t j) {
    float a[4], b[4], r[4];
    unpack4(s, a);
    unpack4(*(const uint2 *)(residual + 4 * j), b);
#pragma unroll
    for (int h = 0; h < 4; h++) r[h] = __bfloat162float(__float2bfloat16_rn(a[h] + b[h]));
    *(uint2 *)(residual + 4 * j) = pack4(r);
    return ((r[0] * r[0] + r[1] * r[1]) + r[2] * r[2]) + r[3] * r[3];
}

// out = bf16(r · scale · weight) for this thread's lines of `row` (lpr lines a row), r the
// new residual this thread stored.
__device__ __forceinline__ void normalize_row(const __nv_bfloat16 *residual, const __nv_bfloat16 *weight,
                                              __nv_bfloat16 *out, size_t row, size_t lpr, float scale) {
    for (size_t q = threadIdx.x; q < lpr; q += blockDim.x) {
        const size_t j = row * lpr + q;
        float r[4], w[4], o[4];
        unpack4(*(const uint2 *)(residual + 4 * j), r);
        unpack4(*(const uint2 *)(weight + 4 * q), w);
#pragma unroll
        for (int h = 0; h < 4; h++) o[h] = r[h] * scale * w[h];
        *(uint2 *)(out + 4 * j) = pack4(o);
    }
}

__device__ __forceinline__ float scale_of(float sum_squares, const RmsNorm &a) {
    return rsqrtf(sum_squares / (float)a.hidden + a.eps);
}

}  // namespace rmsnorm

// After an all-reduce: `sum` (tokens × hidden, may be `out`) is its result.
__device__ void rmsnorm_after(const __nv_bfloat16 *sum, __nv_bfloat16 *out, uint64_t rows, const RmsNorm &a) {
    __shared__ float scratch[RMSNORM_THREADS / 32];
    __nv_bfloat16 *residual = (__nv_bfloat16 *)(uintptr_t)a.residual;
    const __nv_bfloat16 *weight = (const __nv_bfloat16 *)(uintptr_t)a.weight;
    const size_t lpr = a.hidden / 4;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        float sq = 0.0f;
        for (size_t q = threadIdx.x; q < lpr; q += blockDim.x) {
            const size_t j = row * lpr + q;
            sq += rmsnorm::add_residual(*(const uint2 *)(sum + 4 * j), residual, j);
        }
        const float total = rmsnorm::block_sum(sq, scratch);
        rmsnorm::normalize_row(residual, weight, out, row, lpr, rmsnorm::scale_of(total, a));
    }
}

// Fused: every line of this block's rows of x goes to every peer (as the low-latency
// all-reduce sends them), then row by row each thread takes its lines from every PE, sums
// them in PE order, adds the residual, and the block normalises the row. A line's sender and
// reader are the same block on every PE. After a wait that gave up, the rows from there on
// are left (the host reports the fault).
template <int NP>
__device__ void allreduce_rmsnorm_lines(const __nv_bfloat16 *x, __nv_bfloat16 *out, size_t n, Ctrl *ctrl, char *lines,
                                        size_t slot_bytes, const Peers &peers, const RmsNorm &a) {
    __shared__ float scratch[RMSNORM_THREADS / 32];
    const TableCall<NP> c(ctrl, lines, slot_bytes, peers);
    constexpr int MAXP = TableCall<NP>::MAXP;
    const int me = c.me, npes = c.npes;
    const size_t offset = c.offset;
    char *base = c.base;
    const uint32_t t = ll_tag(c.e);
    __nv_bfloat16 *residual = (__nv_bfloat16 *)(uintptr_t)a.residual;
    const __nv_bfloat16 *weight = (const __nv_bfloat16 *)(uintptr_t)a.weight;
    const size_t lpr = a.hidden / 4, rows = n / a.hidden;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x)
        for (size_t q = threadIdx.x; q < lpr; q += blockDim.x) {
            const size_t j = row * lpr + q;
            const uint2 v = *(const uint2 *)(x + 4 * j);
            for (int p = 0; p < npes; p++)
                if (p != me) st_line((uint4 *)(peers.slot[p] + offset) + j, v.x, v.y, t);
        }
    bool ok = true;
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        float sq = 0.0f;
        for (size_t q = threadIdx.x; q < lpr; q += blockDim.x) {
            const size_t j = row * lpr + q;
            const uint2 own = *(const uint2 *)(x + 4 * j);
            uint2 in[MAXP];
            const bool got = ld_lines<NP>(ctrl, c.e, base, slot_bytes, j, me, npes, t, in);
            ok = ok && got;
            if (ok) sq += rmsnorm::add_residual(reduce_in_pe_order<__nv_bfloat16, OpSum, MAXP>(in, own, me, npes), residual, j);
        }
        const float total = rmsnorm::block_sum(sq, scratch);
        if (__syncthreads_and(ok)) rmsnorm::normalize_row(residual, weight, out, row, lpr, rmsnorm::scale_of(total, a));
    }
    finish_call(ctrl, c.e);
}
