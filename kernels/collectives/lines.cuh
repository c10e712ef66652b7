// Inputs of any length in 8- and 16-byte pieces: the last piece of an input whose length is
// not a multiple is loaded zero-padded and stored in part, never past the end.
#pragma once

#include <stdint.h>

#include "collectives/memory.cuh"

// Bytes [at, at + 4) of src as a little-endian word, those past `bytes` zero. src + at is
// 4-byte aligned (inputs start on 16 bytes), so the valid bytes come in at most two loads
// that stay inside the input.
__device__ __forceinline__ uint32_t load_word_tail(const char *src, size_t bytes, size_t at) {
    const size_t m = bytes > at ? (bytes - at < 4 ? bytes - at : 4) : 0;
    if (m == 4) return ld_cg_t((const uint32_t *)(src + at));
    uint32_t w = 0;
    if (m >= 2) w = ld_cg_t((const unsigned short *)(src + at));
    if (m & 1) w |= (uint32_t)(unsigned char)ld_cg_t(src + at + (m & 2)) << (8 * (m & 2));
    return w;
}

__device__ __forceinline__ void store_word_tail(char *dst, size_t bytes, size_t at, uint32_t w) {
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (at + k < bytes) dst[at + k] = (char)(w >> (8 * k));
}

// 8 bytes of input at line j, zero-padded past the end.
__device__ __forceinline__ uint2 load8(const char *src, size_t bytes, size_t j) {
    if ((j + 1) * 8 <= bytes) return __ldcg((const uint2 *)(src + j * 8));
    return make_uint2(load_word_tail(src, bytes, j * 8), load_word_tail(src, bytes, j * 8 + 4));
}

// 8 bytes at line j of an input that may start anywhere (a block of an all-to-all or a
// reduce-scatter whose size is not a multiple of 8): load8 where the line is 8-byte aligned,
// bytes otherwise, zero-padded past the end.
__device__ __forceinline__ uint2 load8_any(const char *src, size_t bytes, size_t j) {
    if (((size_t)(src + j * 8) & 7) == 0) return load8(src, bytes, j);
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (j * 8 + k < bytes) w[k / 4] |= (uint32_t)(unsigned char)ld_cg_t(src + j * 8 + k) << (8 * (k % 4));
    return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ void store8(char *dst, size_t bytes, size_t j, uint2 v) {
    if ((j + 1) * 8 <= bytes && ((size_t)(dst + j * 8) & 7) == 0) {
        *(uint2 *)(dst + j * 8) = v;
        return;
    }
    store_word_tail(dst, bytes, j * 8, v.x);
    store_word_tail(dst, bytes, j * 8 + 4, v.y);
}

// 16 bytes of a 16-byte aligned input at vector i, zero-padded past the end.
__device__ __forceinline__ uint4 load16(const char *src, size_t bytes, size_t i) {
    if ((i + 1) * 16 <= bytes) return ld_cg((const uint4 *)src + i);
    const uint2 lo = load8(src, bytes, 2 * i), hi = load8(src, bytes, 2 * i + 1);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ void store16(char *dst, size_t bytes, size_t i, uint4 v) {
    if ((i + 1) * 16 <= bytes) {
        ((uint4 *)dst)[i] = v;
        return;
    }
    store8(dst, bytes, 2 * i, make_uint2(v.x, v.y));
    store8(dst, bytes, 2 * i + 1, make_uint2(v.z, v.w));
}
