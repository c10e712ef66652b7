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

// ---- 4 elements at a time --------------------------------------------------------------
// Every step moves 4 elements per load and store: a 16-byte (f32) or 8-byte (bf16) vector of
// the input or output where the pointer is so aligned (`vec`), element by element otherwise
// and at the end of the data; 4 codes as one 4-byte (8-bit formats) or 8-byte word (the
// shards' codes start on 16 bytes and every index is a multiple of 4).
template <typename T> __device__ __forceinline__ bool aligned4(const T *p) {
    return ((uintptr_t)p & (4 * sizeof(T) - 1)) == 0;
}

__device__ __forceinline__ void load4(float v[4], const float *p) {
    const float4 x = *(const float4 *)p;
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ __forceinline__ void load4(float v[4], const __nv_bfloat16 *p) {
    const uint2 x = *(const uint2 *)p;
    const __nv_bfloat162 a = *(const __nv_bfloat162 *)&x.x, b = *(const __nv_bfloat162 *)&x.y;
    v[0] = __low2float(a), v[1] = __high2float(a), v[2] = __low2float(b), v[3] = __high2float(b);
}
__device__ __forceinline__ void store4(float *p, const float v[4]) { *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]); }
__device__ __forceinline__ void store4(__nv_bfloat16 *p, const float v[4]) {
    __nv_bfloat16 h[4];
#pragma unroll
    for (int e = 0; e < 4; e++) h[e] = __float2bfloat16_rn(v[e]);
    *(uint2 *)p = *(const uint2 *)h;
}

template <typename Code> __device__ __forceinline__ void load_codes(Code c[4], const Code *p) {
    if (sizeof(Code) == 1) *(uint32_t *)c = *(const uint32_t *)p;
    else *(uint2 *)c = *(const uint2 *)p;
}
template <typename Code> __device__ __forceinline__ void store_codes(Code *p, const Code c[4]) {
    if (sizeof(Code) == 1) *(uint32_t *)p = *(const uint32_t *)c;
    else *(uint2 *)p = *(const uint2 *)c;
}

// Four elements of `src` from `i` (a multiple of 4), plus the feedback if any; zeros past
// `len`.
template <typename T>
__device__ __forceinline__ void load_input(float v[4], const T *src, const float *fb, size_t i, size_t len, bool vec) {
    if (vec && i + 4 <= len) {
        load4(v, src + i);
        if (fb) {
            float f[4];
            load4(f, fb + i);
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = __fadd_rn(v[k], f[k]);
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[k] = 0.f;
        if (i + k < len) {
            v[k] = to_f32(src[i + k]);
            if (fb) v[k] = __fadd_rn(v[k], fb[i + k]);
        }
    }
}

// Elements [i, i + 4) of `out` (those before `len`) from `v`.
template <typename T>
__device__ __forceinline__ void store_output(T *out, const float v[4], size_t i, size_t len, bool vec) {
    if (vec && i + 4 <= len) {
        store4(out, v);
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (i + k < len) out[k] = from_f32<T>(v[k]);
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

// A warp's pass over one block of `block` elements, 4 per lane and step (128 per step):
// the values of the first KEEP steps stay in registers between the scale and the encoding,
// so that a block of up to 128 * KEEP elements is read (or summed) once.
#define KEEP 4

// Quantise one block whose values `value(k, v)` gives (k: the block's element, a multiple
// of 4), into `codes` with the block's scale (written to `*scale` by lane 0 for the scaled
// formats); with `lost(k, v, c, s)` told each element's code, for the feedback.
template <typename F, typename Value, typename Lost>
__device__ __forceinline__ void quantize_block(unsigned lane, unsigned block, Value value, typename F::Code *codes, float *scale,
                                               Lost lost) {
    float kept[KEEP][4];
    float s = 1.f;
    if (F::SCALED) {
        float m = 0.f;
#pragma unroll
        for (int t = 0; t < KEEP; t++) {
            const unsigned k = 4 * lane + 128 * t;
            if (k < block) {
                value(k, kept[t]);
#pragma unroll
                for (int e = 0; e < 4; e++) m = max_or_nan(m, fabsf(kept[t][e]));
            }
        }
        for (unsigned k = 4 * lane + 128 * KEEP; k < block; k += 128) {
            float v[4];
            value(k, v);
#pragma unroll
            for (int e = 0; e < 4; e++) m = max_or_nan(m, fabsf(v[e]));
        }
        s = F::scale_of(warp_max_or_nan(m));
        if (lane == 0) *scale = s;
    }
    auto encode = [&](unsigned k, const float v[4]) {
        typename F::Code c[4];
#pragma unroll
        for (int e = 0; e < 4; e++) c[e] = F::encode(v[e], s);
        store_codes(codes + k, c);
        lost(k, v, c, s);
    };
#pragma unroll
    for (int t = 0; t < KEEP; t++) {
        const unsigned k = 4 * lane + 128 * t;
        if (k < block) {
            if (!F::SCALED) value(k, kept[t]);
            encode(k, kept[t]);
        }
    }
    for (unsigned k = 4 * lane + 128 * KEEP; k < block; k += 128) {
        float v[4];
        value(k, v);
        encode(k, v);
    }
}

// ---- the steps --------------------------------------------------------------------------
// Quantise this PE's input: shard p of `out` gets elements [p * shard_len, (p + 1) *
// shard_len). With `fb` (len floats), the input is src + fb, and fb becomes what the
// quantisation lost.
template <typename T, typename F>
__device__ void compress_quantize(const T *src, float *fb, char *out, size_t len, size_t shard_len, size_t shard_bytes,
                                  size_t data_off, unsigned block, int npes) {
    const Warps w;
    const bool vec = aligned4(src) && (!fb || aligned4(fb));
    const size_t per_shard = shard_len / block, total = per_shard * npes;
    for (size_t g = w.first; g < total; g += w.count) {
        const size_t p = g / per_shard, b = g - p * per_shard;
        char *shard = out + p * shard_bytes;
        const size_t base = p * shard_len + b * block;
        auto value = [&](unsigned k, float v[4]) { load_input(v, src, fb, base + k, len, vec); };
        auto lost = [&](unsigned k, const float v[4], const typename F::Code c[4], float s) {
            if (!fb) return;
            float d[4];
#pragma unroll
            for (int e = 0; e < 4; e++) d[e] = __fsub_rn(v[e], F::decode(c[e], s));
            store_output(fb + base + k, d, base + k, len, vec);
        };
        quantize_block<F>(w.lane, block, value, codes_of<F>(shard, data_off) + b * block,
                          reinterpret_cast<float *>(shard) + b, lost);
    }
}

// Element j..j+3 of this PE's shard of the sum: `in` holds every PE's shard for it (in PE
// order); the sum of their values, in f32 in PE order (plus `fb`, shard_len floats, if
// any). Only the first `valid` elements of the shard are data (fb keeps zeros past them).
template <typename F>
__device__ __forceinline__ void sum_shards(float v[4], const char *in, const float *fb, size_t shard_bytes, size_t data_off,
                                           int npes, size_t j, size_t valid, unsigned b, bool fvec) {
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = 0.f;
    for (int p = 0; p < npes; p++) {
        const char *shard = in + p * shard_bytes;
        const float s = F::SCALED ? reinterpret_cast<const float *>(shard)[b] : 1.f;
        typename F::Code c[4];
        load_codes(c, reinterpret_cast<const typename F::Code *>(shard + data_off) + j);
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = __fadd_rn(v[e], F::decode(c[e], s));
    }
    if (fb) {
        float f[4];
        load_input(f, fb, (const float *)nullptr, j, valid, fvec);
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = __fadd_rn(v[e], f[e]);
    }
}

template <typename F>
__device__ void compress_reduce(const char *in, char *out, float *fb, size_t shard_len, size_t shard_bytes, size_t data_off,
                                unsigned block, int npes, size_t valid) {
    const Warps w;
    const bool fvec = !fb || aligned4(fb);
    const size_t blocks = shard_len / block;
    for (size_t b = w.first; b < blocks; b += w.count) {
        const size_t base = b * block;
        auto value = [&](unsigned k, float v[4]) {
            sum_shards<F>(v, in, fb, shard_bytes, data_off, npes, base + k, valid, (unsigned)b, fvec);
        };
        auto lost = [&](unsigned k, const float v[4], const typename F::Code c[4], float s) {
            if (!fb) return;
            float d[4];
#pragma unroll
            for (int e = 0; e < 4; e++) d[e] = __fsub_rn(v[e], F::decode(c[e], s));
            store_output(fb + base + k, d, base + k, valid, fvec);
        };
        quantize_block<F>(w.lane, block, value, codes_of<F>(out, data_off) + base, reinterpret_cast<float *>(out) + b, lost);
    }
}

// The output: element i from shard i / shard_len of `in` (every PE's quantised sum), shard
// by shard so that no index is divided.
template <typename T, typename F>
__device__ void compress_expand(const char *in, T *dst, size_t len, size_t shard_len, size_t shard_bytes, size_t data_off,
                                unsigned block) {
    const bool vec = aligned4(dst);
    const size_t first = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x), stride = 4 * (size_t)gridDim.x * blockDim.x;
    for (size_t start = 0, p = 0; start < len; start += shard_len, p++) {
        const char *shard = in + p * shard_bytes;
        const float *scales = reinterpret_cast<const float *>(shard);
        const typename F::Code *codes = reinterpret_cast<const typename F::Code *>(shard + data_off);
        const size_t here = len - start < shard_len ? len - start : shard_len;
        for (size_t j = first; j < here; j += stride) {
            const size_t at = shard_len <= 0xFFFFFFFFu ? (unsigned)j / block : j / block;
            const float s = F::SCALED ? scales[at] : 1.f;
            typename F::Code c[4];
            load_codes(c, codes + j);
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] = F::decode(c[e], s);
            store_output(dst + start + j, v, start + j, len, vec && aligned4(dst + start));
        }
    }
}
