// The local steps of the compressed all-reduce (src/collectives/compressed.rs): quantise
// this PE's input into one shard per PE, sum the shards the all-to-all brought in (in f32,
// in PE order) and quantise the sum again, and expand the gathered shards into the output.
// The moves between them are our all-to-all and all-gather.
//
// A shard holds `shard_len` elements: for the scaled formats (int8, fp8) a float scale per
// block of `block` elements, then the codes from `data_off`. Elements past `len` are zeros.
// Every step works on vectors of 4 elements (the host keeps `block` and `shard_len`
// multiples of 4), a warp per block. Every float operation is an explicit round-to-nearest
// intrinsic, so that the CPU model in compressed.rs computes the same bits (no contraction
// into FMAs).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

// ---- formats ----------------------------------------------------------------------------
// `scale_of(amax)`: a block's scale from its largest magnitude (NaN for a non-finite one, so
// the whole block reads back NaN); `encode(v, s)` and `decode(c, s)`.
struct FmtF16 {
    typedef __half Code;
    static const bool SCALED = false;
    __device__ __forceinline__ static float scale_of(float) { return 1.f; }
    __device__ __forceinline__ static Code encode(float v, float) { return __float2half_rn(v); }
    __device__ __forceinline__ static float decode(Code c, float) { return __half2float(c); }
};

struct FmtBf16 {
    typedef __nv_bfloat16 Code;
    static const bool SCALED = false;
    __device__ __forceinline__ static float scale_of(float) { return 1.f; }
    __device__ __forceinline__ static Code encode(float v, float) { return __float2bfloat16_rn(v); }
    __device__ __forceinline__ static float decode(Code c, float) { return __bfloat162float(c); }
};

struct FmtInt8 {
    typedef int8_t Code;
    static const bool SCALED = true;
    __device__ __forceinline__ static float scale_of(float amax) {
        return isfinite(amax) ? __fdiv_rn(amax, 127.f) : __int_as_float(0x7fc00000);
    }
    __device__ __forceinline__ static Code encode(float v, float s) {
        if (s == 0.f) return 0;
        // A NaN (a NaN scale) decodes to NaN whatever it converts to.
        const int q = __float2int_rn(__fdiv_rn(v, s));
        return (Code)max(-127, min(127, q));
    }
    __device__ __forceinline__ static float decode(Code c, float s) { return __fmul_rn((float)c, s); }
};

struct FmtFp8 {
    typedef __nv_fp8_storage_t Code;
    static const bool SCALED = true;
    __device__ __forceinline__ static float scale_of(float amax) {
        return isfinite(amax) ? __fdiv_rn(amax, 448.f) : __int_as_float(0x7fc00000);
    }
    __device__ __forceinline__ static Code encode(float v, float s) {
        if (s == 0.f) return 0;
        return __nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3);
    }
    __device__ __forceinline__ static float decode(Code c, float s) {
        return __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3))), s);
    }
};

// ---- helpers ----------------------------------------------------------------------------
// The larger magnitude, NaN once either is NaN (fmaxf would drop it).
__device__ __forceinline__ float max_or_nan(float a, float b) { return (b > a || b != b) ? b : a; }

__device__ __forceinline__ float warp_max_or_nan(float m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max_or_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Four elements of `src` from `i` (a multiple of 4), plus the feedback if any; zeros past
// `len`.
template <typename T>
__device__ __forceinline__ void load_input(float v[4], const T *src, const float *fb, size_t i, size_t len) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[k] = 0.f;
        if (i + k < len) {
            v[k] = to_f32(src[i + k]);
            if (fb) v[k] = __fadd_rn(v[k], fb[i + k]);
        }
    }
}

template <typename F> __device__ __forceinline__ typename F::Code *codes_of(char *shard, size_t data_off) {
    return reinterpret_cast<typename F::Code *>(shard + data_off);
}

// The warp's lane and global index, and the number of warps in the grid.
struct Warps {
    unsigned lane;
    size_t first, count;
    __device__ __forceinline__ Warps()
        : lane(threadIdx.x & 31u),
          first(((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5),
          count(((size_t)gridDim.x * blockDim.x) >> 5) {}
};

// ---- the steps --------------------------------------------------------------------------
// Quantise this PE's input: shard p of `out` gets elements [p * shard_len, (p + 1) *
// shard_len). With `fb` (len floats), the input is src + fb, and fb becomes what the
// quantisation lost.
template <typename T, typename F>
__device__ void compress_quantize(const T *src, float *fb, char *out, size_t len, size_t shard_len, size_t shard_bytes,
                                  size_t data_off, unsigned block, int npes) {
    const Warps w;
    const size_t per_shard = shard_len / block, total = per_shard * npes;
    for (size_t g = w.first; g < total; g += w.count) {
        const size_t p = g / per_shard, b = g % per_shard;
        char *shard = out + p * shard_bytes;
        const size_t base = p * shard_len + b * block;
        float s = 1.f;
        if (F::SCALED) {
            float m = 0.f;
            for (unsigned k = 4 * w.lane; k < block; k += 128) {
                float v[4];
                load_input(v, src, fb, base + k, len);
#pragma unroll
                for (int e = 0; e < 4; e++) m = max_or_nan(m, fabsf(v[e]));
            }
            s = F::scale_of(warp_max_or_nan(m));
            if (w.lane == 0) reinterpret_cast<float *>(shard)[b] = s;
        }
        typename F::Code *codes = codes_of<F>(shard, data_off) + b * block;
        for (unsigned k = 4 * w.lane; k < block; k += 128) {
            float v[4];
            load_input(v, src, fb, base + k, len);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const typename F::Code c = F::encode(v[e], s);
                codes[k + e] = c;
                if (fb && base + k + e < len) fb[base + k + e] = __fsub_rn(v[e], F::decode(c, s));
            }
        }
    }
}

// This PE's shard of the sum: `in` holds every PE's shard for it (in PE order); the sum of
// their values, in f32 in PE order (plus `fb`, shard_len floats, if any), quantised into
// `out`. Only the first `valid` elements of the shard are data (fb keeps zeros past them).
template <typename F>
__device__ __forceinline__ void sum_shards(float v[4], const char *in, float *fb, size_t shard_bytes, size_t data_off,
                                           unsigned block, int npes, size_t j, size_t valid) {
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = 0.f;
    for (int p = 0; p < npes; p++) {
        const char *shard = in + p * shard_bytes;
        const float s = F::SCALED ? reinterpret_cast<const float *>(shard)[j / block] : 1.f;
        const typename F::Code *codes = reinterpret_cast<const typename F::Code *>(shard + data_off);
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = __fadd_rn(v[e], F::decode(codes[j + e], s));
    }
    if (fb) {
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (j + e < valid) v[e] = __fadd_rn(v[e], fb[j + e]);
    }
}

template <typename F>
__device__ void compress_reduce(const char *in, char *out, float *fb, size_t shard_len, size_t shard_bytes, size_t data_off,
                                unsigned block, int npes, size_t valid) {
    const Warps w;
    const size_t blocks = shard_len / block;
    for (size_t b = w.first; b < blocks; b += w.count) {
        const size_t base = b * block;
        float s = 1.f;
        if (F::SCALED) {
            float m = 0.f;
            for (unsigned k = 4 * w.lane; k < block; k += 128) {
                float v[4];
                sum_shards<F>(v, in, fb, shard_bytes, data_off, block, npes, base + k, valid);
#pragma unroll
                for (int e = 0; e < 4; e++) m = max_or_nan(m, fabsf(v[e]));
            }
            s = F::scale_of(warp_max_or_nan(m));
            if (w.lane == 0) reinterpret_cast<float *>(out)[b] = s;
        }
        typename F::Code *codes = codes_of<F>(out, data_off) + base;
        for (unsigned k = 4 * w.lane; k < block; k += 128) {
            float v[4];
            sum_shards<F>(v, in, fb, shard_bytes, data_off, block, npes, base + k, valid);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const typename F::Code c = F::encode(v[e], s);
                codes[k + e] = c;
                if (fb && base + k + e < valid) fb[base + k + e] = __fsub_rn(v[e], F::decode(c, s));
            }
        }
    }
}

// The output: element i from shard i / shard_len of `in` (every PE's quantised sum).
template <typename T, typename F>
__device__ void compress_expand(const char *in, T *dst, size_t len, size_t shard_len, size_t shard_bytes, size_t data_off,
                                unsigned block) {
    const size_t vectors = (len + 3) / 4;
    for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < vectors; x += (size_t)gridDim.x * blockDim.x) {
        const size_t i = 4 * x, p = i / shard_len, j = i % shard_len;
        const char *shard = in + p * shard_bytes;
        const float s = F::SCALED ? reinterpret_cast<const float *>(shard)[j / block] : 1.f;
        const typename F::Code *codes = reinterpret_cast<const typename F::Code *>(shard + data_off);
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (i + e < len) dst[i + e] = from_f32<T>(F::decode(codes[j + e], s));
    }
}
