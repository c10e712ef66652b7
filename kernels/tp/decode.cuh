// The decode GEMM: y (m × n) = x (m × k) · wᵀ (w: n × k), row-major bf16, f32 sums, for a
// few tokens (m <= DECODE_MAX_M). Such a product is bound by reading the weight, so the kernel
// streams w once at memory bandwidth (16-byte loads that skip L1, several in flight per lane)
// and keeps x in L1. A block takes 16 output features at a time (a task; tasks go round the
// grid). Where rows are 16-byte vectors the tensor cores do the multiply-adds (mma m16n8k16),
// so that the instructions stay far below the memory time at any m, and the block's 8 warps
// split k, their sums added in warp order; elsewhere a warp takes two features and a shuffle
// sums its lanes. Every order is fixed: the result is the same on every run and GPU. Where
// each sum goes is the caller's: a Store, called as store(j, i, sum) for feature j of token i.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#define DECODE_MAX_M 16

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

// The lanes' sums, added in a fixed order; every lane ends with the total.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Features per task, and the block size every decode kernel is launched with.
#define DECODE_TASK 16
#define DECODE_THREADS 256
#define DECODE_WARPS (DECODE_THREADS / 32)

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Steps of 64 k per warp, in flight at once.
#define DECODE_UNROLL 2

// The task's 16 features (f0 ..) of every token by the tensor cores, k split over the warps.
// mma m16n8k16 adds over 16 k positions; any assignment of actual k to them is right as long
// as w and x use the same one. Lane (g, t) = (lane / 4, lane % 4) holds positions 2t, 2t + 1,
// 2t + 8, 2t + 9 of rows g and g + 8 of w and of column (token) g of x (and g + 8 from 9
// tokens on: a second mma on the same w): it loads 16 consecutive k of each (two 16-byte
// vectors: k0 + 16t ..), four mma steps' worth, so a quad of lanes reads 128 contiguous bytes
// of a row. Rows past n and tokens past m are zero. M (at least m) sizes the registers.
// Tokens of the warps' sums of a task for up to M tokens: whole groups of 8.
#define DECODE_RED_TOKENS(M) (((M) + 7) / 8 * 8)

template <int M, typename Store>
__device__ __forceinline__ void decode_task_mma(const __nv_bfloat16 *x, const __nv_bfloat16 *w, int m, uint64_t f0,
                                                uint64_t n, uint64_t k,
                                                float (*red)[DECODE_TASK][DECODE_RED_TOKENS(M)], Store &store) {
    constexpr int NT = (M + 7) / 8;  // groups of 8 tokens
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const bool row_lo = f0 + g < n, row_hi = f0 + g + 8 < n;
    const uint4 *wlo = (const uint4 *)(w + (f0 + g) * k) + 2 * t;
    const uint4 *whi = (const uint4 *)(w + (f0 + g + 8) * k) + 2 * t;
    const uint4 *xg[NT];
    bool tok[NT];
#pragma unroll
    for (int q = 0; q < NT; q++) {
        tok[q] = 8 * q + g < m;
        xg[q] = (const uint4 *)(x + (uint64_t)(tok[q] ? 8 * q + g : 0) * k) + 2 * t;
    }
    const uint4 zero = make_uint4(0, 0, 0, 0);
    float d[NT][4] = {};
    const uint64_t kv = k / 8;  // 16-byte vectors per row; a step is 8 of them (64 k)
    for (uint64_t s0 = (uint64_t)warp * 8; s0 < kv; s0 += (uint64_t)DECODE_WARPS * 8 * DECODE_UNROLL) {
        uint4 lo[DECODE_UNROLL][2], hi[DECODE_UNROLL][2], xv[DECODE_UNROLL][2][NT];
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; u++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                // Vector s0 + 2t + h of step u (steps of one warp are DECODE_WARPS * 8 apart).
                const uint64_t v = s0 + (uint64_t)u * DECODE_WARPS * 8 + 2 * t + h;
                const uint64_t off = (uint64_t)u * DECODE_WARPS * 8 + h;
                const bool in = v < kv;
                lo[u][h] = in && row_lo ? ld_stream(wlo + s0 + off) : zero;
                hi[u][h] = in && row_hi ? ld_stream(whi + s0 + off) : zero;
#pragma unroll
                for (int q = 0; q < NT; q++) xv[u][h][q] = in && tok[q] ? __ldg(xg[q] + s0 + off) : zero;
            }
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; u++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int q = 0; q < NT; q++) {
                    const uint4 a = lo[u][h], b = hi[u][h], c = xv[u][h][q];
                    mma_bf16_16816(d[q], a.x, b.x, a.y, b.y, c.x, c.y);
                    mma_bf16_16816(d[q], a.z, b.z, a.w, b.w, c.z, c.w);
                }
    }
    // d[q]: (row g, tokens 8q + 2t, 8q + 2t + 1), then (row g + 8, the same tokens).
#pragma unroll
    for (int q = 0; q < NT; q++) {
        red[warp][g][8 * q + 2 * t] = d[q][0];
        red[warp][g][8 * q + 2 * t + 1] = d[q][1];
        red[warp][g + 8][8 * q + 2 * t] = d[q][2];
        red[warp][g + 8][8 * q + 2 * t + 1] = d[q][3];
    }
    __syncthreads();
    if (threadIdx.x < DECODE_TASK * m) {
        const int r = threadIdx.x % DECODE_TASK, i = threadIdx.x / DECODE_TASK;
        if (f0 + r < n) {
            float sum = red[0][r][i];
#pragma unroll
            for (int q = 1; q < DECODE_WARPS; q++) sum += red[q][r][i];
            store(f0 + r, i, sum);
        }
    }
    __syncthreads();  // red is free for the next task
}

// The start of a decode GEMM launched with programmatic stream serialization (Gemm::linear):
// its blocks may start while the kernel before it finishes (the layer's SiLU kernel lets
// them), so they are resident when it ends; here they wait until that kernel's output (x) is
// visible (without the launch attribute this returns at once). It neither lets the kernel
// after it start early nor prefetches its weights before the wait: both measured slower.
__device__ __forceinline__ void decode_enter() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Feature j of every token, element by element (rows that are not 16-byte vectors).
template <int M, typename Store>
__device__ __forceinline__ void decode_feature(const __nv_bfloat16 *x, const __nv_bfloat16 *w, int m, uint64_t j,
                                               uint64_t k, int lane, Store &store) {
    float acc[M];
#pragma unroll
    for (int i = 0; i < M; i++) acc[i] = 0.0f;
    for (uint64_t c = lane; c < k; c += 32) {
        const float wf = __bfloat162float(w[j * k + c]);
#pragma unroll
        for (int i = 0; i < M; i++)
            if (i < m) acc[i] = fmaf(wf, __bfloat162float(x[i * k + c]), acc[i]);
    }
#pragma unroll
    for (int i = 0; i < M; i++) acc[i] = warp_sum(acc[i]);
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < M; i++)
            if (i < m) store(j, i, acc[i]);
}

// The tasks of this block: features DECODE_TASK * task .. for task = blockIdx.x,
// blockIdx.x + gridDim.x, ... A kernel that goes on with the features it computed walks them
// the same way.
#define FOR_EACH_DECODE_TASK(n, f0) \
    for (uint64_t f0 = (uint64_t)blockIdx.x * DECODE_TASK; f0 < (n); f0 += (uint64_t)gridDim.x * DECODE_TASK)

// The warps' sums of a task, in shared memory, for up to 8 tokens or up to 16: declared once
// by the kernel (each instantiation of a template would take its own). The two token ranges
// are separate kernels, so that the larger one's registers cost the smaller one nothing.
template <int R>
using DecodeRed = float[DECODE_WARPS][DECODE_TASK][R];

// What a kernel does once a task's features are all stored: nothing, for most.
struct NoTaskEnd {
    __device__ __forceinline__ void operator()(uint64_t) const {}
};

// Every feature of the block's tasks for m tokens (M >= m sizes the registers); blocks of
// DECODE_THREADS threads. After each task, every thread of the block calls task_end(f0);
// what the task's store calls wrote is visible to it only after a barrier of its own (the
// element path has none).
template <int M, typename Store, typename TaskEnd = NoTaskEnd>
__device__ __forceinline__ void decode_rows(const __nv_bfloat16 *x, const __nv_bfloat16 *w, int m, uint64_t n,
                                            uint64_t k, DecodeRed<DECODE_RED_TOKENS(M)> &red, Store &store,
                                            TaskEnd task_end = TaskEnd()) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool vectors = k % 8 == 0 && (((uintptr_t)x | (uintptr_t)w) & 15) == 0;
    FOR_EACH_DECODE_TASK(n, f0) {
        if (vectors) {
            decode_task_mma<M>(x, w, m, f0, n, k, red, store);
        } else {
            // Warp q: features f0 + 2q and f0 + 2q + 1.
            for (uint64_t j = f0 + 2 * warp; j < f0 + 2 * warp + 2 && j < n; j++) decode_feature<M>(x, w, m, j, k, lane, store);
        }
        task_end(f0);
    }
}

// decode_rows for m known at run time, CALL(M) with M a compile-time constant: m itself up
// to 8 (a kernel's shared sums DecodeRed<8>). From 9 to 16 tokens a kernel of its own calls
// M = 16 (one instantiation, DecodeRed<16>: the tokens past m are masked).
#define WITH_DECODE_M(m, CALL)                     \
    switch (m) {                                   \
    case 1: { constexpr int M = 1; CALL; break; }  \
    case 2: { constexpr int M = 2; CALL; break; }  \
    case 3: { constexpr int M = 3; CALL; break; }  \
    case 4: { constexpr int M = 4; CALL; break; }  \
    case 5: { constexpr int M = 5; CALL; break; }  \
    case 6: { constexpr int M = 6; CALL; break; }  \
    case 7: { constexpr int M = 7; CALL; break; }  \
    case 8: { constexpr int M = 8; CALL; break; }  \
    default: break;                                \
    }
