// The tensor-parallel layers' own kernels (src/tp): what sits between their GEMMs, and a GEMM
// for decode.
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float silu_times(float gate, float up) {
    return gate / (1.0f + expf(-gate)) * up;
}

// out[r][j] = silu(gu[r][j]) * gu[r][f + j] for r < m, j < f: each row of gu holds this PE's
// gate features, then its up features (the merged column-parallel output). In f32, rounded
// once to bf16. Eight elements per thread when f is a multiple of 8 and both buffers start
// on 16-byte boundaries (every row then does too).
extern "C" __global__ void silu_mul_bf16(const __nv_bfloat16 *gu, __nv_bfloat16 *out, uint64_t m,
                                         uint64_t f) {
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

// dst (m × n, row-major) from src holding the same matrix cut into column pieces of width w
// (the last one narrower), each piece stored whole (m × its width, row-major) after the one
// before: how an overlapped row-parallel layer leaves its pieces' all-reduced products.
extern "C" __global__ void unchunk_bf16(const __nv_bfloat16 *src, __nv_bfloat16 *dst, uint64_t m,
                                        uint64_t n, uint64_t w) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m * n; i += stride) {
        const uint64_t r = i / n, c = i % n, piece = c / w;
        const uint64_t first = piece * w, width = (n - first < w) ? n - first : w;
        dst[i] = src[m * first + r * width + (c - first)];
    }
}

// ---- decode GEMM ---------------------------------------------------------------------------
// y (m × n, rows ldy apart) = x (m × k) · wᵀ (w: n × k), row-major bf16, f32 sums, for a few
// tokens (m <= DECODE_MAX_M). Such a product reads each weight once and does m multiply-adds
// with it: it is bound by the weight's bytes, so the kernel streams w at full memory bandwidth
// (16-byte loads that skip L1, several in flight per lane) and keeps x in L1 (every warp reads
// all of it). A warp takes two output features at a time (each x vector it loads serves
// both): its lanes stride over the rows' 8-element vectors, then a shuffle reduction sums the
// lanes in a fixed order, so the result is the same on every run and every GPU.
#define DECODE_MAX_M 8
#define DECODE_UNROLL 4

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    const __nv_bfloat162 *a2 = (const __nv_bfloat162 *)&a, *b2 = (const __nv_bfloat162 *)&b;
    float s = 0.0f;
#pragma unroll
    for (int h = 0; h < 4; h++) {
        const float2 af = __bfloat1622float2(a2[h]), bf = __bfloat1622float2(b2[h]);
        s = fmaf(af.x, bf.x, s);
        s = fmaf(af.y, bf.y, s);
    }
    return s;
}

template <int M, int R>
__device__ __forceinline__ void decode_tile(const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *y, uint64_t j,
                                            uint64_t k, uint64_t ldy, int lane) {
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) acc[r][i] = 0.0f;
    const uint64_t kv = k / 8;
    uint64_t v = lane;
    // DECODE_UNROLL vectors of each of R rows in flight per lane; each x vector serves R rows.
    for (; v + 32 * (DECODE_UNROLL - 1) < kv; v += 32 * DECODE_UNROLL) {
        uint4 wv[R][DECODE_UNROLL];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < DECODE_UNROLL; u++) wv[r][u] = ld_stream((const uint4 *)(w + (j + r) * k) + v + 32 * u);
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; u++)
#pragma unroll
            for (int i = 0; i < M; i++) {
                const uint4 xv = __ldg((const uint4 *)(x + i * k) + v + 32 * u);
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][i] += dot8(wv[r][u], xv);
            }
    }
    for (; v < kv; v += 32)
#pragma unroll
        for (int i = 0; i < M; i++) {
            const uint4 xv = __ldg((const uint4 *)(x + i * k) + v);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][i] += dot8(ld_stream((const uint4 *)(w + (j + r) * k) + v), xv);
        }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], o);
        }
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int i = 0; i < M; i++) y[i * ldy + j + r] = __float2bfloat16_rn(acc[r][i]);
}

// Pairs of output features per warp where the rows are 16-byte vectors (each x vector then
// serves two rows), one at a time otherwise and for an odd last feature.
template <int M>
__device__ void decode_rows(const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *y, uint64_t n, uint64_t k,
                            uint64_t ldy) {
    const int lane = threadIdx.x & 31;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const bool vectors = k % 8 == 0 && (((uintptr_t)x | (uintptr_t)w) & 15) == 0;
    if (vectors) {
        for (uint64_t p = warp; 2 * p < n; p += warps) {
            if (2 * p + 1 < n) decode_tile<M, 2>(x, w, y, 2 * p, k, ldy, lane);
            else decode_tile<M, 1>(x, w, y, 2 * p, k, ldy, lane);
        }
        return;
    }
    for (uint64_t j = warp; j < n; j += warps) {
        float acc[M];
#pragma unroll
        for (int i = 0; i < M; i++) acc[i] = 0.0f;
        for (uint64_t c = lane; c < k; c += 32) {
            const float wf = __bfloat162float(w[j * k + c]);
#pragma unroll
            for (int i = 0; i < M; i++) acc[i] = fmaf(wf, __bfloat162float(x[i * k + c]), acc[i]);
        }
#pragma unroll
        for (int i = 0; i < M; i++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
        }
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < M; i++) y[i * ldy + j] = __float2bfloat16_rn(acc[i]);
    }
}

extern "C" __global__ void __launch_bounds__(256) decode_linear_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                                                                     __nv_bfloat16 *y, uint64_t m, uint64_t n,
                                                                     uint64_t k, uint64_t ldy) {
    switch (m) {
    case 1: decode_rows<1>(x, w, y, n, k, ldy); break;
    case 2: decode_rows<2>(x, w, y, n, k, ldy); break;
    case 3: decode_rows<3>(x, w, y, n, k, ldy); break;
    case 4: decode_rows<4>(x, w, y, n, k, ldy); break;
    case 5: decode_rows<5>(x, w, y, n, k, ldy); break;
    case 6: decode_rows<6>(x, w, y, n, k, ldy); break;
    case 7: decode_rows<7>(x, w, y, n, k, ldy); break;
    case 8: decode_rows<8>(x, w, y, n, k, ldy); break;
    default: break;
    }
}
