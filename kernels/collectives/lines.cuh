// Inputs of any length in 8- and 16-byte pieces: the last piece of an input whose length is
// not a multiple is loaded zero-padded and stored in part, never past the end (load8_block
// alone loads whole aligned words, see there).
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

// Bytes [x, x + 8) of the input `in` (16-byte aligned) of `len` bytes, zero outside
// [0, len); -8 < x < len. Both aligned words the span may cross are loaded, from indices
// clamped into the input's words and with no branch, so that a thread's loads of several
// spans go out together; a clamped word is then dropped. (Cut in branches, as load8_block
// does, the loads of a thread's spans that took different branches waited for each other:
// see ll_allgather_words.) A loaded word may hold bytes past the input, but it is an
// aligned word that holds one of the input's bytes, so it lies in memory the input's pages
// map.
__device__ __forceinline__ uint2 load8_span(const char *in, size_t len, long long x) {
    const unsigned long long *w = (const unsigned long long *)in;
    const long long last = (long long)((len - 1) >> 3), k = x >> 3;  // k: -1 .. last
    const uint32_t r = (uint32_t)x & 7;
    uint64_t a = __ldcg(w + (k < 0 ? 0 : k)), b = __ldcg(w + (k + 1 > last ? last : k + 1));
    a = k < 0 ? 0 : a;
    b = k + 1 > last ? 0 : b;
    // b's bytes shifted in above a's rest; two shifts, so that r = 0 shifts b out entirely.
    uint64_t v = a >> (8 * r) | (b << 1) << (63 - 8 * r);
    const long long left = (long long)len - x;
    v &= left >= 8 ? ~0ull : (1ull << (8 * left)) - 1;
    return make_uint2((uint32_t)v, (uint32_t)(v >> 32));
}

// 8 bytes at line j of the block at byte `start` (of `bytes`) of the input `in` (16-byte
// aligned), zero-padded past the block's end. Blocks of an all-to-all or a reduce-scatter
// whose size is not a multiple of 8 start off an 8-byte boundary: their lines are cut from the
// one or two aligned words they span, both loads issued together. Loaded byte by byte (a few
// loads at a time, each few waiting for the ones before), blocks of 6 to 20 bytes took 1.1-1.8
// us longer a call on 4 PEs. Such a word may hold bytes past the input, but it is an aligned
// word that holds one of the input's bytes, so it lies in memory the input's pages map.
__device__ __forceinline__ uint2 load8_block(const char *in, size_t start, size_t bytes, size_t j) {
    const size_t at = start + j * 8;
    const uint32_t s = at & 7;
    if (s == 0) return load8(in + start, bytes, j);
    const uint32_t m = bytes - j * 8 < 8 ? (uint32_t)(bytes - j * 8) : 8;
    const uint2 *w = (const uint2 *)(in + (at - s));
    const uint2 lo = __ldcg(w);
    uint2 hi = make_uint2(0, 0);
    if (s + m > 8) hi = __ldcg(w + 1);
    // The three words from word s / 4 on, shifted right by the rest of s.
    const uint32_t a = s < 4 ? lo.x : lo.y, b = s < 4 ? lo.y : hi.x, c = s < 4 ? hi.x : hi.y;
    const uint32_t sh = 8 * (s & 3);
    uint2 r = make_uint2(__funnelshift_r(a, b, sh), __funnelshift_r(b, c, sh));
    r.x &= m >= 4 ? ~0u : (1u << (8 * m)) - 1;
    r.y &= m >= 8 ? ~0u : m <= 4 ? 0u : (1u << (8 * (m - 4))) - 1;
    return r;
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
