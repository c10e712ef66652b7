// The tensor-parallel layers' own kernels (src/tp): what sits between their GEMMs, a GEMM for
// decode (tp/decode.cuh), the row-parallel layer's decode GEMM fused with its all-reduce
// (tp/decode_allreduce.cuh), the residual add and RMSNorm after an all-reduce, fused with it
// or alone (tp/rmsnorm.cuh), and the backward pass of SiLU · up and of the norm (tp/train.cuh).
#include <cuda_bf16.h>
#include <stdint.h>

#include "abi.h"
#include "tp/decode.cuh"
#include "tp/decode_allreduce.cuh"
#include "tp/rmsnorm.cuh"
#include "tp/train.cuh"

__device__ __forceinline__ float silu_times(float gate, float up) {
    return gate / (1.0f + expf(-gate)) * up;
}

// out[r][j] = silu(gu[r][j]) * gu[r][f + j] for r < m, j < f: each row of gu holds this PE's
// gate features, then its up features (the merged column-parallel output). In f32, rounded
// once to bf16. Eight elements per thread when f is a multiple of 8 and both buffers start
// on 16-byte boundaries (every row then does too). Launched with programmatic stream
// serialization (TensorParallel::silu_mul): it waits for the GEMM before it, then lets the
// next kernel begin its launch, so that a decode GEMM or fused decode kernel launched so
// after it (the down projection) is resident and waiting when it ends.
extern "C" __global__ void silu_mul_bf16(const __nv_bfloat16 *gu, __nv_bfloat16 *out, uint64_t m,
                                         uint64_t f) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (f % 8 == 0 && (((uintptr_t)gu | (uintptr_t)out) & 15) == 0) {
        const uint64_t per_row = f / 8, n = m * per_row;
        for (uint64_t i = first; i < n; i += stride) {
            const uint64_t r = i / per_row, j = (i % per_row) * 8;
            const uint4 g = *(const uint4 *)(gu + r * 2 * f + j);
            const uint4 u = *(const uint4 *)(gu + r * 2 * f + f + j);
            const __nv_bfloat162 *g2 = (const __nv_bfloat162 *)&g, *u2 = (const __nv_bfloat162 *)&u;
            uint4 o;
            __nv_bfloat162 *o2 = (__nv_bfloat162 *)&o;
#pragma unroll
            for (int h = 0; h < 4; h++) {
                const float2 gf = __bfloat1622float2(g2[h]), uf = __bfloat1622float2(u2[h]);
                o2[h] = __floats2bfloat162_rn(silu_times(gf.x, uf.x), silu_times(gf.y, uf.y));
            }
            *(uint4 *)(out + r * f + j) = o;
        }
    } else {
        const uint64_t n = m * f;
        for (uint64_t i = first; i < n; i += stride) {
            const uint64_t r = i / f, j = i % f;
            const float g = __bfloat162float(gu[r * 2 * f + j]);
            const float u = __bfloat162float(gu[r * 2 * f + f + j]);
            out[i] = __float2bfloat16_rn(silu_times(g, u));
        }
    }
}

// dst[i] = Σ over s < slabs of slab s's element i, in f32 in slab order, rounded once, where
// slab s is src + s · slab_stride, except slab own_slab, which is `own` (a PE's own partial
// product, where its GEMM left it): the fused GEMM + reduce-scatter (and + all-reduce) sums
// the partial products its peers stored here, in PE order, as the reduce-scatter of our
// collectives does. Eight elements per thread when len and slab_stride are multiples of 8
// and every buffer starts on a 16-byte boundary.
extern "C" __global__ void sum_slabs_bf16(const __nv_bfloat16 *src, const __nv_bfloat16 *own, __nv_bfloat16 *dst,
                                          uint64_t len, uint32_t slabs, uint64_t slab_stride, uint32_t own_slab) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (len % 8 == 0 && slab_stride % 8 == 0 && (((uintptr_t)src | (uintptr_t)own | (uintptr_t)dst) & 15) == 0) {
        const uint4 *s4 = (const uint4 *)src, *own4 = (const uint4 *)own;
        for (uint64_t i = first; i < len / 8; i += stride) {
            float acc[8];
            for (uint32_t s = 0; s < slabs; s++) {
                const uint4 raw = s == own_slab ? own4[i] : s4[s * (slab_stride / 8) + i];
                const __nv_bfloat162 *v = (const __nv_bfloat162 *)&raw;
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    const float2 f = __bfloat1622float2(v[h]);
                    acc[2 * h] = s == 0 ? f.x : acc[2 * h] + f.x;
                    acc[2 * h + 1] = s == 0 ? f.y : acc[2 * h + 1] + f.y;
                }
            }
            uint4 out;
            __nv_bfloat162 *o = (__nv_bfloat162 *)&out;
#pragma unroll
            for (int h = 0; h < 4; h++) o[h] = __floats2bfloat162_rn(acc[2 * h], acc[2 * h + 1]);
            ((uint4 *)dst)[i] = out;
        }
    } else {
        for (uint64_t i = first; i < len; i += stride) {
            float acc = 0.0f;
            for (uint32_t s = 0; s < slabs; s++) {
                const float v = __bfloat162float(s == own_slab ? own[i] : src[s * slab_stride + i]);
                acc = s == 0 ? v : acc + v;
            }
            dst[i] = __float2bfloat16_rn(acc);
        }
    }
}

// ---- decode GEMM ---------------------------------------------------------------------------
// y (m × n, rows ldy apart) = x (m × k) · wᵀ, for m <= DECODE_MAX_M (tp/decode.cuh).
struct StoreY {
    __nv_bfloat16 *y;
    uint64_t ldy;
    __device__ __forceinline__ void operator()(uint64_t j, int i, float sum) const { y[i * ldy + j] = __float2bfloat16_rn(sum); }
};

extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 2) decode_linear_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                                                                     __nv_bfloat16 *y, uint64_t m, uint64_t n,
                                                                     uint64_t k, uint64_t ldy) {
    __shared__ DecodeRed<8> red;
    decode_enter();
    StoreY store{y, ldy};
    WITH_DECODE_M(m, (decode_rows<M>(x, w, (int)m, n, k, red, store)));
}

// The same for 9 to 16 tokens.
extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 2) decode_linear16_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                                                                       __nv_bfloat16 *y, uint64_t m, uint64_t n,
                                                                       uint64_t k, uint64_t ldy) {
    __shared__ DecodeRed<16> red;
    decode_enter();
    StoreY store{y, ldy};
    if (m > 8 && m <= 16) decode_rows<16>(x, w, (int)m, n, k, red, store);
}

// ---- decode GEMM + all-reduce ---------------------------------------------------------------
// y (len = m × n, the same on every PE) = Σ over PEs of x · wᵀ, for m <= FUSED_DECODE_MAX_M
// (tp/decode_allreduce.cuh): the parameters every collective takes (src is x, dst is y, the
// region is the low-latency lines), the peer table, then the weight and the shape. Two blocks
// of DECODE_THREADS per SM, all resident (a block polls for the lines of its peers' same block).
extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 2) decode_linear_allreduce_bf16(
    const __nv_bfloat16 *x, __nv_bfloat16 *y, size_t len, Ctrl *ctrl, uint64_t *flags, char *lines, size_t slot_bytes,
    const Peers peers, const DecodeLinear lin) {
    __shared__ DecodeLinesShared sh;
    enter_call(CALL_SIG("decode_linear_allreduce_bf16", len, 0));
    const __nv_bfloat16 *w = (const __nv_bfloat16 *)(uintptr_t)lin.w;
    WITH_DECODE_M(lin.m, (decode_linear_allreduce_lines<M>(x, w, y, (int)lin.m, lin.n, lin.k, ctrl, lines, slot_bytes, peers, sh)));
}

// ---- residual add + RMSNorm ----------------------------------------------------------------
// After an all-reduce whose result is `sum` (rows × norm.hidden; may be `out`), on its own
// (tp/rmsnorm.cuh). Launched with programmatic stream serialization: it waits for the
// all-reduce before it.
extern "C" __global__ void __launch_bounds__(RMSNORM_THREADS) rmsnorm_residual_bf16(const __nv_bfloat16 *sum,
                                                                               __nv_bfloat16 *out, uint64_t rows,
                                                                               const RmsNorm norm) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    rmsnorm_after(sum, out, rows, norm);
}

// Fused with the all-reduce of x (len = tokens × norm.hidden): the parameters every
// collective takes (src is x, dst is out, the region is the low-latency lines), the peer
// table, then the residual and weight. RMSNORM_THREADS a block, all blocks resident (a block
// polls for the lines of its peers' same block).
extern "C" __global__ void __launch_bounds__(RMSNORM_THREADS) allreduce_rmsnorm_bf16(
    const __nv_bfloat16 *x, __nv_bfloat16 *out, size_t len, Ctrl *ctrl, uint64_t *flags, char *lines,
    size_t slot_bytes, const Peers peers, const RmsNorm norm) {
    __shared__ rmsnorm::RmsShared sh;
    enter_call(CALL_SIG("allreduce_rmsnorm_bf16", len, 0));
    WITH_NP(peers.npes, (allreduce_rmsnorm_lines<NP>(x, out, len, ctrl, lines, slot_bytes, peers, norm, sh)));
}

// ---- the backward pass (tp/train.cuh) ------------------------------------------------------
// dgu (m × 2f, [dgate | dup] per row) from gu (m × 2f, [gate | up]) and da (m × f).
extern "C" __global__ void silu_mul_backward_bf16(const __nv_bfloat16 *gu, const __nv_bfloat16 *da,
                                                  __nv_bfloat16 *dgu, uint64_t m, uint64_t f) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m * f; i += stride) {
        const uint64_t r = i / f, j = i % f;
        float dg, du;
        silu_mul_grad(__bfloat162float(gu[r * 2 * f + j]), __bfloat162float(gu[r * 2 * f + f + j]),
                      __bfloat162float(da[i]), &dg, &du);
        dgu[r * 2 * f + j] = __float2bfloat16_rn(dg);
        dgu[r * 2 * f + f + j] = __float2bfloat16_rn(du);
    }
}

// dres_out = dres_in + the gradient of rmsnorm(r) · w for dout, rows × hidden.
extern "C" __global__ void __launch_bounds__(RMSNORM_THREADS) rmsnorm_backward_bf16(
    const __nv_bfloat16 *dout, const __nv_bfloat16 *r, const __nv_bfloat16 *w, const __nv_bfloat16 *dres_in,
    __nv_bfloat16 *dres_out, uint64_t rows, uint32_t hidden, float eps) {
    __shared__ float scratch[RMSNORM_THREADS / 32];
    rmsnorm_grad_rows(dout, r, w, dres_in, dres_out, rows, hidden, eps, scratch);
}
