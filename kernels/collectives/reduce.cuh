// Element types, reduction operators, and the reductions of our all-reduce kernels: the
// PEs' values are combined in PE order 0..n-1 (in f32 for 16-bit types), so that every PE
// computes a bitwise-identical result.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "abi.h"
#include "collectives/memory.cuh"

// Vectors each thread reduces at once in reduce_vectors (independent loads in flight).
#define UNROLL COLL_UNROLL

template <typename T> struct Acc { typedef float type; };
template <> struct Acc<int32_t> { typedef int32_t type; };

template <typename T> __device__ __forceinline__ typename Acc<T>::type to_acc(T v) { return v; }
template <> __device__ __forceinline__ float to_acc<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_acc<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_acc(typename Acc<T>::type v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

struct OpSum {
    template <typename A> __device__ __forceinline__ static A apply(A a, A b) { return a + b; }
};
struct OpMax {
    __device__ __forceinline__ static float apply(float a, float b) { return fmaxf(a, b); }
    __device__ __forceinline__ static int32_t apply(int32_t a, int32_t b) { return max(a, b); }
};
struct OpMin {
    __device__ __forceinline__ static float apply(float a, float b) { return fminf(a, b); }
    __device__ __forceinline__ static int32_t apply(int32_t a, int32_t b) { return min(a, b); }
};

// The elements of one raw vector (uint4: 16 bytes, uint2: 8), reduced in the accumulator type.
template <typename T, typename Raw> struct Packed {
    static const int N = sizeof(Raw) / sizeof(T);
    typename Acc<T>::type v[N];

    __device__ __forceinline__ void load(Raw raw) {
        const T *t = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int k = 0; k < N; k++) v[k] = to_acc<T>(t[k]);
    }
    template <typename Op> __device__ __forceinline__ void combine(Raw raw) {
        const T *t = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int k = 0; k < N; k++) v[k] = Op::apply(v[k], to_acc<T>(t[k]));
    }
    __device__ __forceinline__ Raw store() const {
        Raw raw;
        T *t = reinterpret_cast<T *>(&raw);
#pragma unroll
        for (int k = 0; k < N; k++) t[k] = from_acc<T>(v[k]);
        return raw;
    }
};

template <typename T> using Vec = Packed<T, uint4>;

// Reduce vector i of the sources (PE order) into dst; `src_of(p)` gives PE p's copy.
// UNROLL independent vectors per thread keep several loads in flight.
template <typename T, typename Op, typename SrcOf>
__device__ __forceinline__ void reduce_vectors(size_t begin, size_t end, size_t first, size_t stride, int npes, SrcOf src_of, uint4 *const *outs, int n_outs) {
    for (size_t base = begin + first; base < end; base += stride * UNROLL) {
        Vec<T> acc[UNROLL];
#pragma unroll
        for (int p = 0; p < npes; p++) {
            const uint4 *s = src_of(p);
            uint4 raw[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                size_t i = base + u * stride;
                raw[u] = i < end ? ld_cg(s + i) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (p == 0)
                    acc[u].load(raw[u]);
                else
                    acc[u].template combine<Op>(raw[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            size_t i = base + u * stride;
            if (i < end) {
                uint4 r = acc[u].store();
                for (int o = 0; o < n_outs; o++) outs[o][i] = r;
            }
        }
    }
}

// As reduce_vectors, with the PE count known at compile time so that every PE's loads for a
// step are issued before the first is used (8 loads in flight per thread).
template <typename T, typename Op, int NP, typename SrcOf>
__device__ __forceinline__ void reduce_vectors_np(size_t begin, size_t end, size_t first, size_t stride, SrcOf src_of, uint4 *const *outs, int n_outs) {
    constexpr int U = NP >= 8 ? 1 : 8 / NP;
    const uint4 *srcs[NP];
#pragma unroll
    for (int p = 0; p < NP; p++) srcs[p] = src_of(p);
    for (size_t base = begin + first; base < end; base += stride * U) {
        uint4 raw[NP][U];
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int u = 0; u < U; u++) {
                size_t i = base + u * stride;
                raw[p][u] = i < end ? ld_cg(srcs[p] + i) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            size_t i = base + u * stride;
            if (i >= end) continue;
            Vec<T> acc;
            acc.load(raw[0][u]);
#pragma unroll
            for (int p = 1; p < NP; p++) acc.template combine<Op>(raw[p][u]);
            uint4 r = acc.store();
            for (int o = 0; o < n_outs; o++) outs[o][i] = r;
        }
    }
}

template <typename T, typename Op, typename SrcOf>
__device__ __forceinline__ void reduce_vectors_any(size_t begin, size_t end, size_t first, size_t stride, int npes, SrcOf src_of, uint4 *const *outs, int n_outs) {
    switch (npes) {
    case 2: reduce_vectors_np<T, Op, 2>(begin, end, first, stride, src_of, outs, n_outs); break;
    case 4: reduce_vectors_np<T, Op, 4>(begin, end, first, stride, src_of, outs, n_outs); break;
    case 8: reduce_vectors_np<T, Op, 8>(begin, end, first, stride, src_of, outs, n_outs); break;
    default: reduce_vectors<T, Op>(begin, end, first, stride, npes, src_of, outs, n_outs);
    }
}

// The scalar tail (n not a multiple of the vector width): elements [begin, end) reduced by
// block 0 in PE order and stored into `out_of(0 .. n_outs - 1)`.
template <typename T, typename Op, typename SrcOf, typename OutOf>
__device__ __forceinline__ void reduce_tail(size_t begin, size_t end, int npes, SrcOf src_of, OutOf out_of, int n_outs) {
    if (blockIdx.x != 0) return;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        typename Acc<T>::type a = to_acc<T>(ld_cg_t(src_of(0) + i));
        for (int p = 1; p < npes; p++) a = Op::apply(a, to_acc<T>(ld_cg_t(src_of(p) + i)));
        T r = from_acc<T>(a);
        for (int o = 0; o < n_outs; o++) out_of(o)[i] = r;
    }
}

// PE p's value (`own` for me, `in[p]` for the others) reduced in PE order 0..npes-1, the
// order every PE uses, so that every PE gets the same bits.
template <typename T, typename Op, int MAXP, typename Raw>
__device__ __forceinline__ Raw reduce_in_pe_order(const Raw *in, Raw own, int me, int npes) {
    Packed<T, Raw> acc;
#pragma unroll
    for (int p = 0; p < MAXP; p++) {
        if (p >= npes) break;
        const Raw v = p == me ? own : in[p];
        if (p == 0)
            acc.load(v);
        else
            acc.template combine<Op>(v);
    }
    return acc.store();
}
