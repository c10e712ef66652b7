// The backward pass of what sits between the tensor-parallel layers' GEMMs (src/tp/train.rs):
// SiLU(gate) · up, and the RMSNorm after a residual add. In f32, each output rounded once to
// bf16; one thread per element, or a block per row for the norm.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "tp/rmsnorm.cuh"

// dgu[r] = [dgate | dup] for the merged gate/up row gu[r] = [gate | up] (f features each) and
// the gradient da[r] of a = silu(gate) · up:
//   dup = da · silu(gate),  dgate = da · up · σ(gate) · (1 + gate · (1 − σ(gate))).
__device__ __forceinline__ void silu_mul_grad(float g, float u, float da, float *dg, float *du) {
    const float s = 1.0f / (1.0f + expf(-g));
    *du = da * g * s;
    *dg = da * u * s * (1.0f + g * (1.0f - s));
}

// The block sum of v (the same bits in every thread), for the norm's backward.
__device__ __forceinline__ float train_block_sum(float v, float *scratch) {
    return rmsnorm::block_sum(v, scratch);
}

// dres_out[r] = dres_in[r] + the gradient, through out = r · scale · w (scale = rsqrt(mean
// of r² + eps)), of dout:
//   dr_i = scale · w_i · dout_i − r_i · scale³ / hidden · Σ_j dout_j · w_j · r_j.
// A block per row (rows b, b + grid, ...); dres_out may be dres_in.
__device__ __forceinline__ void rmsnorm_grad_rows(const __nv_bfloat16 *dout, const __nv_bfloat16 *r,
                                                  const __nv_bfloat16 *w, const __nv_bfloat16 *dres_in,
                                                  __nv_bfloat16 *dres_out, uint64_t rows, uint32_t hidden,
                                                  float eps, float *scratch) {
    for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const __nv_bfloat16 *rr = r + row * hidden, *dd = dout + row * hidden;
        float sq = 0.0f, dot = 0.0f;
        for (uint32_t j = threadIdx.x; j < hidden; j += blockDim.x) {
            const float x = __bfloat162float(rr[j]);
            sq += x * x;
            dot += __bfloat162float(dd[j]) * __bfloat162float(w[j]) * x;
        }
        sq = train_block_sum(sq, scratch);
        dot = train_block_sum(dot, scratch);
        const float scale = rsqrtf(sq / (float)hidden + eps);
        const float k = scale * scale * scale / (float)hidden * dot;
        for (uint32_t j = threadIdx.x; j < hidden; j += blockDim.x) {
            const uint64_t i = row * hidden + j;
            const float dr = scale * __bfloat162float(w[j]) * __bfloat162float(dd[j]) - __bfloat162float(rr[j]) * k;
            dres_out[i] = __float2bfloat16_rn(__bfloat162float(dres_in[i]) + dr);
        }
    }
}
