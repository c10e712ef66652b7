// All-reduce and all-gather over NVLink, initiated from the device.
//
// Every PE's buffers are symmetric, so a peer's copy is reached with a plain load or store
// through nvshmem_ptr(). Synchronisation uses per-block flags in the symmetric heap:
//   - each call has an epoch e (a per-PE counter in device memory, advanced at the end of
//     every call, so a CUDA graph replays correctly: nothing is baked in at capture);
//   - flags only grow, a block waits for flag >= e, and writes them with st.release.sys after
//     its data stores; the waiter reads with ld.acquire.sys;
//   - staging buffers are double-buffered by the parity of e. A PE cannot be two calls ahead
//     of a peer (each call waits on every peer), so the buffer written in call e+2 is no
//     longer read by call e.
// Reductions add the PEs' values in PE order 0..n-1 (in f32 for 16-bit types), so every PE
// computes a bitwise-identical result.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define MAX_BLOCKS 512
#define MAX_PES 64
#define UNROLL 4

// Flag sets, each MAX_BLOCKS x n_pes words.
#define FLAGS_DATA 0     // one-shot data landed
#define FLAGS_DONE 1     // two-shot / all-gather bandwidth end barrier
#define FLAGS_START 2    // two-shot / all-gather bandwidth start barrier
#define FLAGS_BW 3       // bandwidth all-reduce: rounds of chunks (see there)
#define FLAG_SETS 4

// Where this PE's slot of the staging area lives on every PE (host-computed nvshmem_ptr),
// passed by value so the low-latency kernels read it from the constant bank instead of
// NVSHMEM's device state.
#define LL_MAX_PES 16
struct Peers {
    char *slot[LL_MAX_PES];  // PE p's staging base (both parities) as mapped here
    int me;
    int npes;
};

// The epoch, one copy per block index: block b reads copy b when it starts and, when it ends,
// writes the new epoch into copies b, b + gridDim.x, ... Blocks of one call touch disjoint
// copies, so no atomics or fences are needed, and after every call all copies agree whatever
// the grid size of the next call. Kernel completion publishes the stores to the next call.
struct Ctrl {
    unsigned long long epoch[MAX_BLOCKS];
};

__device__ __forceinline__ void st_release_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint64_t *flag_at(uint64_t *flags, int set, int block, int pe, int npes) {
    return flags + ((size_t)set * MAX_BLOCKS + block) * npes + pe;
}

// The epoch of this call.
__device__ __forceinline__ uint64_t call_epoch(const Ctrl *ctrl) {
    return ctrl->epoch[blockIdx.x] + 1;
}

// Staging, and the sentinel buffers, on every PE: [epoch parity][source PE][slot_bytes], so
// that calls sharing a slot are two epochs apart. Where source's slot of epoch e starts.
__device__ __forceinline__ size_t slot_offset(uint64_t e, int source, int npes, size_t slot_bytes) {
    return (e & 1) * npes * slot_bytes + (size_t)source * slot_bytes;
}

// Publish the epoch for the next call on this PE (see Ctrl).
__device__ __forceinline__ void finish_call(Ctrl *ctrl, uint64_t e) {
    __syncthreads();  // every thread of this block has read its copy
    for (unsigned int i = blockIdx.x + threadIdx.x * gridDim.x; i < MAX_BLOCKS; i += blockDim.x * gridDim.x)
        ctrl->epoch[i] = e;
}

// Tell every other PE's block `blockIdx.x` that this block's stores to it are done, then wait
// for the same from each of them. Threads 0..npes-1 each handle one peer.
__device__ __forceinline__ void signal_and_wait(uint64_t *flags, int set, int me, int npes, uint64_t e) {
    __syncthreads();
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        if (p != me) {
            uint64_t *remote = (uint64_t *)nvshmem_ptr(flag_at(flags, set, blockIdx.x, me, npes), p);
            st_release_sys(remote, e);
        }
    }
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        if (p != me) {
            const uint64_t *mine = flag_at(flags, set, blockIdx.x, p, npes);
            while (ld_acquire_sys(mine) < e) {
            }
        }
    }
    __syncthreads();
}

// ---- element types and operators -------------------------------------------------------

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

// Every load of data that another PE, or an earlier call, may have written goes to L2 (.cg),
// never through L1: with programmatic launches (see enter_call) a call begins while the one
// before it still runs, so this SM's L1 may hold lines that the previous call loaded before
// peers overwrote them; L2 is where peers' stores land, so it is never stale.
__device__ __forceinline__ uint4 ld_cg(const uint4 *p) { return __ldcg(p); }

template <typename T> __device__ __forceinline__ T ld_cg_t(const T *p) {
    static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4, "1, 2 or 4 bytes");
    T v;
    if constexpr (sizeof(T) == 1) {
        const unsigned char r = __ldcg((const unsigned char *)p);
        memcpy(&v, &r, 1);
    } else if constexpr (sizeof(T) == 2) {
        const unsigned short r = __ldcg((const unsigned short *)p);
        memcpy(&v, &r, 2);
    } else {
        const unsigned int r = __ldcg((const unsigned int *)p);
        memcpy(&v, &r, 4);
    }
    return v;
}

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

// Push n elements of src into this PE's slot (at `base + me * slot_bytes`) on every peer:
// 16-byte vectors spread over the grid, the tail by block 0. A reader must take each vector
// from the same block index that pushed it (its handshake covers only that block).
template <typename E>
__device__ __forceinline__ void push_to_peers(const E *src, size_t n, char *base, size_t slot_bytes, int me, int npes) {
    __shared__ uint4 *peer_slot[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x)
        peer_slot[p] = (uint4 *)nvshmem_ptr(base + (size_t)me * slot_bytes, p);
    __syncthreads();
    const size_t nvec = n * sizeof(E) / 16, tail = nvec * 16 / sizeof(E);
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const uint4 *src4 = (const uint4 *)src;
    for (size_t i = first; i < nvec; i += stride) {
        const uint4 v = ld_cg(src4 + i);
        for (int p = 0; p < npes; p++)
            if (p != me) peer_slot[p][i] = v;
    }
    if (blockIdx.x == 0)
        for (size_t i = tail + threadIdx.x; i < n; i += blockDim.x)
            for (int p = 0; p < npes; p++)
                if (p != me) ((E *)peer_slot[p])[i] = ld_cg_t(src + i);
}

// ---- one-shot all-reduce ------------------------------------------------------------------
// Push the input into every peer's staging slot, one handshake, reduce locally.
template <typename T, typename Op>
__device__ void oneshot_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    // staging[parity][source PE][slot_bytes]
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    push_to_peers(src, n, base, slot_bytes, me, npes);
    signal_and_wait(flags, FLAGS_DATA, me, npes, e);

    const size_t nvec = n / Vec<T>::N;
    const size_t tail = nvec * Vec<T>::N;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    auto src_of = [&](int p) -> const uint4 * {
        return p == me ? (const uint4 *)src : (const uint4 *)(base + (size_t)p * slot_bytes);
    };
    uint4 *outs[1] = {(uint4 *)dst};
    reduce_vectors<T, Op>(0, nvec, first, stride, npes, src_of, outs, 1);
    auto src_of_t = [&](int p) -> const T * { return (const T *)src_of(p); };
    reduce_tail<T, Op>(tail, n, npes, src_of_t, [&](int) { return dst; }, 1);
    finish_call(ctrl, e);
}

// ---- two-shot all-reduce ------------------------------------------------------------------
// No staging: after a start barrier (every PE's src ready and dst free), PE q reads part q of
// every PE's src (remote loads), reduces, and writes the result into every PE's dst; an end
// barrier keeps src alive until all reads are done and makes dst complete. PE q owns vectors
// [nvec * q / npes, nvec * (q + 1) / npes).
__device__ __forceinline__ void part_of(size_t nvec, int q, int npes, size_t *b, size_t *e) {
    *b = nvec * q / npes;
    *e = nvec * (q + 1) / npes;
}

template <typename T, typename Op>
__device__ void twoshot_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    __shared__ const uint4 *peer_src[MAX_PES];
    __shared__ uint4 *peer_dst[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        peer_src[p] = (const uint4 *)nvshmem_ptr(src, p);
        peer_dst[p] = (uint4 *)nvshmem_ptr(dst, p);
    }
    signal_and_wait(flags, FLAGS_START, me, npes, e);

    const size_t nvec = n / Vec<T>::N;
    const size_t tail = nvec * Vec<T>::N;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t mb, mend;
    part_of(nvec, me, npes, &mb, &mend);
    auto src_of = [&](int p) -> const uint4 * { return peer_src[p]; };
    reduce_vectors_any<T, Op>(mb, mend, first, stride, npes, src_of, peer_dst, npes);
    if (me == npes - 1) {
        auto src_of_t = [&](int p) -> const T * { return (const T *)peer_src[p]; };
        reduce_tail<T, Op>(tail, n, npes, src_of_t, [&](int p) { return (T *)peer_dst[p]; }, npes);
    }
    signal_and_wait(flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}

// ---- bandwidth all-reduce ----------------------------------------------------------------
// PE q owns part q of the vectors. Each part is cut into chunks dealt round-robin to the
// blocks: in round r, block b handles chunk r * gridDim.x + b of every part. A block pushes
// its round-r chunk of part q into owner q's staging (stores only, never remote loads); in
// round r it waits for every source's chunk of its own part, reduces it, stores the result
// into every PE's dst, pushes its round r + 1 chunks, and then sends each peer one flag that
// says three things: "my round r + 1 chunk is in your staging", "your round-r result is in
// your dst" and "my staging slot for your round-r chunk is free". Flag values are
// round_tag(e, r) = (epoch << 32 | r + 1), so they grow across rounds and calls: tag(0)
// announces round 0, tag(r + 1) the above, tag(rounds) the last results.
// With two chunk slots, the wait for round r's data (tag r from every peer) also covers the
// slot that round r + 1 reuses (freed in round r + 1 - slots <= r - 1). With three or more,
// a block pushes its round r + 1 chunks before that wait, overlapping them with it: the
// wait for round r - 1 already covers the slot (freed in round r + 1 - slots <= r - 2).
// Only stores cross NVLink (the two-shot above reads its peers' inputs with remote loads,
// which the fabric carries less efficiently), and two blocks per SM overlap one's flag
// handshake with the other's copies.
//
// Staging: parity [source PE][slot plan.slots][block gridDim.x][plan.chunk_vecs x 16 bytes],
// which the host fits into one staging slot per source. Calls of the same parity are two
// apart, and a PE in call e + 2 has seen every owner's last flag of call e + 1, so every owner
// has finished reading call e's staging.
struct BandwidthPlan {
    unsigned int chunk_vecs;  // vectors per chunk, at most
    unsigned int slots;       // chunk slots per block and source, at least 2
};

__device__ __forceinline__ uint64_t round_tag(uint64_t e, int r) { return (e << 32) | (uint64_t)(r + 1); }

template <typename T, typename Op>
__device__ void bandwidth_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes, BandwidthPlan plan) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    __shared__ char *peer_in[MAX_PES];   // my source region in PE q's staging
    __shared__ uint4 *peer_dst[MAX_PES];  // PE q's dst
    __shared__ const T *peer_src[MAX_PES];
    __shared__ uint64_t *peer_flag[MAX_PES];  // my flag word at PE q
    __shared__ size_t part_begin[MAX_PES], part_end[MAX_PES];  // PE q's part
    uint64_t *my_flags = flag_at(flags, FLAGS_BW, blockIdx.x, 0, npes);  // [source PE]
    const size_t nvec = n / Vec<T>::N;
    for (int p = threadIdx.x; p < npes; p += blockDim.x) {
        part_of(nvec, p, npes, &part_begin[p], &part_end[p]);
        peer_in[p] = (char *)nvshmem_ptr(base + (size_t)me * slot_bytes, p);
        peer_dst[p] = (uint4 *)nvshmem_ptr(dst, p);
        peer_src[p] = (const T *)nvshmem_ptr(src, p);
        peer_flag[p] = (uint64_t *)nvshmem_ptr(my_flags + me, p);
    }
    __syncthreads();

    const size_t tail = nvec * Vec<T>::N;
    const size_t max_part = (nvec + npes - 1) / npes;
    const size_t G = gridDim.x, b = blockIdx.x;
    // As few rounds as the chunk ring allows, then chunks evened out over them (no short
    // last round).
    const size_t cap = (size_t)plan.chunk_vecs * G;
    const int rounds = max_part == 0 ? 1 : (int)((max_part + cap - 1) / cap);
    size_t chunk = (max_part + G * rounds - 1) / (G * rounds);
    if (chunk == 0) chunk = 1;
    const uint4 *src4 = (const uint4 *)src;
    size_t mb, mend;
    part_of(nvec, me, npes, &mb, &mend);
    auto slot_off = [&](int r) -> size_t { return ((size_t)(r % plan.slots) * G + b) * plan.chunk_vecs * 16; };

    // My round-r chunk of every other PE's part into that PE's staging, peers in turn from the
    // next one on (measured on 4 H200s: 1-4% faster at 64-256 MiB than all PEs starting with
    // the same one).
    auto push = [&](int r) {
        const size_t c0 = ((size_t)r * G + b) * chunk;
        for (int k = 1; k < npes; k++) {
            const int q = (me + k) % npes;
            const size_t lo = part_begin[q] + c0, hi = lo + chunk < part_end[q] ? lo + chunk : part_end[q];
            uint4 *to = (uint4 *)(peer_in[q] + slot_off(r)) - lo;
            // All loads of a step before its stores (the compiler cannot tell they don't alias).
            for (size_t i0 = lo + threadIdx.x; i0 < hi; i0 += (size_t)blockDim.x * UNROLL) {
                uint4 v[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const size_t i = i0 + (size_t)u * blockDim.x;
                    if (i < hi) v[u] = ld_cg(src4 + i);
                }
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    const size_t i = i0 + (size_t)u * blockDim.x;
                    if (i < hi) to[i] = v[u];
                }
            }
        }
    };
    // After every thread's stores: one flag to each peer.
    auto tell_all = [&](uint64_t v) {
        __syncthreads();
        for (int q = threadIdx.x; q < npes; q += blockDim.x)
            if (q != me) st_release_sys(peer_flag[q], v);
    };
    auto wait_all = [&](uint64_t v) {
        for (int p = threadIdx.x; p < npes; p += blockDim.x)
            if (p != me)
                while (ld_acquire_sys(my_flags + p) < v) {
                }
        __syncthreads();
    };

    // With three or more slots, round r + 1's chunks go out before the wait for round r.
    const bool ahead = plan.slots >= 3;
    push(0);
    tell_all(round_tag(e, 0));
    for (int r = 0; r < rounds; r++) {
        if (ahead && r + 1 < rounds) push(r + 1);
        wait_all(round_tag(e, r));
        // Reduce my part's round-r chunk (PE order) into every PE's dst.
        const size_t c0 = ((size_t)r * G + b) * chunk;
        const size_t lo = mb + c0, hi = mb + c0 + chunk < mend ? mb + c0 + chunk : mend;
        if (lo < hi) {
            const size_t off = slot_off(r);
            auto src_of = [&](int p) -> const uint4 * {
                return p == me ? src4 : (const uint4 *)(base + (size_t)p * slot_bytes + off) - lo;
            };
            reduce_vectors_any<T, Op>(lo, hi, threadIdx.x, blockDim.x, npes, src_of, peer_dst, npes);
        }
        // The scalar tail: the last PE reads it from every PE's src (all PEs are in this call,
        // and none leaves before this block's last flag).
        if (r == rounds - 1 && me == npes - 1)
            reduce_tail<T, Op>(tail, n, npes, [&](int p) { return peer_src[p]; }, [&](int p) { return (T *)peer_dst[p]; }, npes);
        if (!ahead && r + 1 < rounds) push(r + 1);
        tell_all(round_tag(e, r + 1));
    }
    // Every owner's results of this block's chunks are in my dst.
    wait_all(round_tag(e, rounds));
    finish_call(ctrl, e);
}

// ---- all-gather ---------------------------------------------------------------------------
// One-shot: push my input into every peer's staging slot, one handshake, copy the slots into
// dst locally (writing a peer's dst directly would race with its use of the previous result).
__device__ void oneshot_allgather(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    push_to_peers(src, bytes, base, slot_bytes, me, npes);
    signal_and_wait(flags, FLAGS_DATA, me, npes, e);
    const size_t nvec = bytes / 16, tail = nvec * 16;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const uint4 *src4 = (const uint4 *)src;
    // Each block copies exactly the vectors its peers' same block pushed (the only ones its
    // handshake covers), and block 0 the tail. When bytes is not a multiple of 16 the output
    // blocks are not 16-byte aligned and the vectors are stored bytewise.
    for (int p = 0; p < npes; p++) {
        const uint4 *from = p == me ? src4 : (const uint4 *)(base + (size_t)p * slot_bytes);
        char *to = dst + (size_t)p * bytes;
        if (((size_t)to & 15) == 0) {
            for (size_t i = first; i < nvec; i += stride) ((uint4 *)to)[i] = ld_cg(from + i);
        } else {
            for (size_t i = first; i < nvec; i += stride) {
                uint4 v = ld_cg(from + i);
                const char *c = (const char *)&v;
#pragma unroll
                for (int k = 0; k < 16; k++) to[i * 16 + k] = c[k];
            }
        }
        if (blockIdx.x == 0)
            for (size_t i = tail + threadIdx.x; i < bytes; i += blockDim.x) to[i] = ld_cg_t((const char *)from + i);
    }
    finish_call(ctrl, e);
}

// Bandwidth: start barrier (every dst free), push my input into every PE's dst, end barrier.
__device__ void bandwidth_allgather(const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const uint64_t e = call_epoch(ctrl);
    __shared__ char *peer_dst[MAX_PES];
    for (int p = threadIdx.x; p < npes; p += blockDim.x) peer_dst[p] = (char *)nvshmem_ptr(dst, p) + (size_t)me * bytes;
    signal_and_wait(flags, FLAGS_START, me, npes, e);
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if ((bytes & 15) == 0) {
        const size_t nvec = bytes / 16;
        const uint4 *src4 = (const uint4 *)src;
        for (size_t base = first; base < nvec; base += stride * UNROLL) {
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                size_t i = base + u * stride;
                if (i < nvec) v[u] = ld_cg(src4 + i);
            }
            for (int p = 0; p < npes; p++) {
                uint4 *to = (uint4 *)peer_dst[(me + p) % npes];
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    size_t i = base + u * stride;
                    if (i < nvec) to[i] = v[u];
                }
            }
        }
    } else {
        for (size_t i = first; i < bytes; i += stride)
            for (int p = 0; p < npes; p++) peer_dst[p][i] = ld_cg_t(src + i);
    }
    signal_and_wait(flags, FLAGS_DONE, me, npes, e);
    finish_call(ctrl, e);
}

// ---- low-latency one-shot (flags packed with the data) ---------------------------------
// Each 16-byte line carries 8 bytes of data and the call's tag twice: {d0, t, d1, t}. A
// reader polls the line itself until both tag words match, so no fence and no separate flag
// round are needed (NCCL's LL protocol relies on the same 8-byte store atomicity). Lines
// live in the parity's staging slots; stale lines carry an older tag. Twice the bytes move,
// which is cheap for the small messages this path is for.
//
// Tags are the epoch times an odd constant: distinct for 2^32 consecutive epochs, 0 (what
// the zeroed staging holds) only when the epoch's low 32 bits are, and unlike the small epoch
// numbers themselves, not a value that a one-shot call's raw data left in the same slot is
// likely to hold.
__device__ __forceinline__ uint32_t ll_tag(uint64_t e) { return (uint32_t)e * 0x9E3779B1u; }

__device__ __forceinline__ void st_line(uint4 *p, uint32_t d0, uint32_t d1, uint32_t t) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(t), "r"(d1), "r"(t) : "memory");
}

__device__ __forceinline__ uint4 ld_volatile(const uint4 *p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ bool line_ready(uint4 v, uint32_t t) { return v.y == t && v.w == t; }

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

// Line j of every source PE but me, with all first loads in flight together (one L2 round
// trip instead of one per peer), then each polled until its tag matches. NP is the PE count
// when known at compile time, 0 for any (one source at a time).
template <int NP>
__device__ __forceinline__ void ld_lines(const char *base, size_t slot_bytes, size_t j, int me, int npes, uint32_t t, uint2 *out) {
    if (NP == 0) {
        for (int p = 0; p < npes; p++) {
            if (p == me) continue;
            const uint4 *at = (const uint4 *)(base + (size_t)p * slot_bytes) + j;
            uint4 v;
            do v = ld_volatile(at);
            while (!line_ready(v, t));
            out[p] = make_uint2(v.x, v.z);
        }
        return;
    }
    uint4 v[NP > 0 ? NP : 1];
#pragma unroll
    for (int p = 0; p < NP; p++)
        if (p != me) v[p] = ld_volatile((const uint4 *)(base + (size_t)p * slot_bytes) + j);
#pragma unroll
    for (int p = 0; p < NP; p++) {
        if (p == me) continue;
        while (!line_ready(v[p], t)) v[p] = ld_volatile((const uint4 *)(base + (size_t)p * slot_bytes) + j);
        out[p] = make_uint2(v[p].x, v[p].z);
    }
}

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

__device__ __forceinline__ void store8(char *dst, size_t bytes, size_t j, uint2 v) {
    if ((j + 1) * 8 <= bytes && ((size_t)(dst + j * 8) & 7) == 0) {
        *(uint2 *)(dst + j * 8) = v;
        return;
    }
    store_word_tail(dst, bytes, j * 8, v.x);
    store_word_tail(dst, bytes, j * 8 + 4, v.y);
}

template <typename T, typename Op, int NP>
__device__ void ll_allreduce_np(const T *src, T *dst, size_t n, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    constexpr int MAXP = NP > 0 ? NP : LL_MAX_PES;
    const int me = peers.me, npes = NP > 0 ? NP : peers.npes;
    const uint64_t e = call_epoch(ctrl);
    const uint32_t t = ll_tag(e);
    const size_t offset = slot_offset(e, me, npes, slot_bytes);
    const char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    const size_t bytes = n * sizeof(T), lines = (bytes + 7) / 8;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = first; j < lines; j += stride) {
        uint2 v = load8((const char *)src, bytes, j);
        for (int p = 0; p < npes; p++)
            if (p != me) st_line((uint4 *)(peers.slot[p] + offset) + j, v.x, v.y, t);
    }
    // Each thread reads back the lines it wrote, so no barrier is needed in between.
    for (size_t j = first; j < lines; j += stride) {
        // Own input first: its load overlaps the wait for the peers' lines.
        const uint2 own = load8((const char *)src, bytes, j);
        uint2 in[MAXP];
        ld_lines<NP>(base, slot_bytes, j, me, npes, t, in);
        store8((char *)dst, bytes, j, reduce_in_pe_order<T, Op, MAXP>(in, own, me, npes));
    }
    finish_call(ctrl, e);
}

// Run CALL with NP, the PE count as a compile-time constant where it is a common one (0: any).
#define WITH_NP(npes, CALL)                           \
    switch (npes) {                                   \
    case 2: { constexpr int NP = 2; CALL; break; }    \
    case 4: { constexpr int NP = 4; CALL; break; }    \
    case 8: { constexpr int NP = 8; CALL; break; }    \
    default: { constexpr int NP = 0; CALL; }          \
    }

template <typename T, typename Op>
__device__ void ll_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    WITH_NP(peers.npes, (ll_allreduce_np<T, Op, NP>(src, dst, n, ctrl, staging, slot_bytes, peers)))
}

// ---- low-latency two-shot (reduce-scatter, then all-gather, both in low-latency lines) ----
// Owner q holds lines [q * P, (q + 1) * P) of the input, P = ceil(lines / npes). Every thread
// takes the same offsets k into every part in each of three loops, so no barrier is needed
// between them:
//   1. push line k of every other owner's part into that owner's staging (this PE's slot,
//      first half, at k);
//   2. as owner, wait for line k of my part from every peer, reduce in PE order, push the
//      result into every peer's staging (this PE's slot, second half, at k) and store it;
//   3. wait for line k of every other owner's part and store it.
// Each PE sends 2 (n - 1) / n lines per input line instead of the one-shot's n - 1, for one
// more hop. In place is safe: a thread overwrites only lines whose input it has read. A PE
// in call e + 2 has had line 0's result of call e + 1 from owner 0, which had line 0 from
// every PE, so every PE has finished call e and no longer reads this parity's staging.
template <typename T, typename Op, int NP>
__device__ void ll_twoshot_allreduce_np(const T *src, T *dst, size_t n, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    constexpr int MAXP = NP > 0 ? NP : LL_MAX_PES;
    const int me = peers.me, npes = NP > 0 ? NP : peers.npes;
    const uint64_t e = call_epoch(ctrl);
    const uint32_t t = ll_tag(e);
    const size_t half = slot_bytes / 2;
    const size_t offset = slot_offset(e, me, npes, slot_bytes);  // my slot, at any PE
    const char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    const size_t bytes = n * sizeof(T), lines = (bytes + 7) / 8;
    const size_t P = (lines + npes - 1) / npes;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    // 1. Every part's load first, then the stores (a line store keeps the loads after it
    // waiting behind it).
    for (size_t k = first; k < P; k += stride) {
        uint2 v[MAXP];
#pragma unroll
        for (int q = 0; q < MAXP; q++)
            if (q < npes && q != me && q * P + k < lines) v[q] = load8((const char *)src, bytes, q * P + k);
#pragma unroll
        for (int q = 0; q < MAXP; q++)
            if (q < npes && q != me && q * P + k < lines) st_line((uint4 *)(peers.slot[q] + offset) + k, v[q].x, v[q].y, t);
    }
    // 2. My part.
    for (size_t k = first; k < P && me * P + k < lines; k += stride) {
        const size_t j = me * P + k;
        const uint2 own = load8((const char *)src, bytes, j);
        uint2 in[MAXP];
        ld_lines<NP>(base, slot_bytes, k, me, npes, t, in);
        const uint2 r = reduce_in_pe_order<T, Op, MAXP>(in, own, me, npes);
#pragma unroll
        for (int q = 0; q < MAXP; q++)
            if (q < npes && q != me) st_line((uint4 *)(peers.slot[q] + offset + half) + k, r.x, r.y, t);
        store8((char *)dst, bytes, j, r);
    }
    // 3. Every other owner's results, all first loads in flight together.
    for (size_t k = first; k < P; k += stride) {
        uint4 v[MAXP];
#pragma unroll
        for (int q = 0; q < MAXP; q++)
            if (q < npes && q != me && q * P + k < lines) v[q] = ld_volatile((const uint4 *)(base + (size_t)q * slot_bytes + half) + k);
#pragma unroll
        for (int q = 0; q < MAXP; q++) {
            if (q >= npes || q == me || q * P + k >= lines) continue;
            while (!line_ready(v[q], t)) v[q] = ld_volatile((const uint4 *)(base + (size_t)q * slot_bytes + half) + k);
            store8((char *)dst, bytes, q * P + k, make_uint2(v[q].x, v[q].z));
        }
    }
    finish_call(ctrl, e);
}

template <typename T, typename Op>
__device__ void ll_twoshot_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    WITH_NP(peers.npes, (ll_twoshot_allreduce_np<T, Op, NP>(src, dst, n, ctrl, staging, slot_bytes, peers)))
}

template <int NP>
__device__ void ll_allgather_np(const char *src, char *dst, size_t bytes, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    const int me = peers.me, npes = NP > 0 ? NP : peers.npes;
    const uint64_t e = call_epoch(ctrl);
    const uint32_t t = ll_tag(e);
    const size_t offset = slot_offset(e, me, npes, slot_bytes);
    const char *base = staging + slot_offset(e, 0, npes, slot_bytes);
    const size_t lines = (bytes + 7) / 8;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = first; j < lines; j += stride) {
        uint2 v = load8(src, bytes, j);
        for (int p = 0; p < npes; p++)
            if (p != me) st_line((uint4 *)(peers.slot[p] + offset) + j, v.x, v.y, t);
        store8(dst + (size_t)me * bytes, bytes, j, v);
    }
    for (size_t j = first; j < lines; j += stride) {
        uint2 in[NP > 0 ? NP : LL_MAX_PES];
        ld_lines<NP>(base, slot_bytes, j, me, npes, t, in);
#pragma unroll
        for (int p = 0; p < (NP > 0 ? NP : LL_MAX_PES); p++)
            if (p < npes && p != me) store8(dst + (size_t)p * bytes, bytes, j, in[p]);
    }
    finish_call(ctrl, e);
}

__device__ void ll_allgather(const char *src, char *dst, size_t bytes, Ctrl *ctrl, char *staging, size_t slot_bytes, const Peers &peers) {
    WITH_NP(peers.npes, (ll_allgather_np<NP>(src, dst, bytes, ctrl, staging, slot_bytes, peers)))
}

// ---- sentinel one-shot (raw data into receive buffers pre-filled with a sentinel) --------
// Every PE's receive buffers start filled with SENTINEL, a 32-bit pattern that no pushed word
// carries: a sender turns such a word (a NaN in f32, two NaNs in f16 or bf16) into another NaN,
// so this path is for floating-point types only. A reader polls each 16-byte vector until
// none of its words is the sentinel (an aligned word is stored whole, so a vector may arrive
// in parts but no word is torn), then writes the sentinel back. Unlike the tagged lines
// above, only the data crosses NVLink: half the bytes.
// Buffers: [parity][source PE][slot] in an allocation of their own (a word left by any other
// algorithm would pass for data). A PE in call e + 2 has heard from every peer in call e + 1,
// so every peer has finished call e, refills included, before this parity is written again.
#define SENTINEL 0xFFFFFFFFu

__device__ __forceinline__ uint32_t off_sentinel(uint32_t w) { return w == SENTINEL ? 0x7FFFFFFFu : w; }

// A vector as it is sent (and used by its own PE, so that every PE reduces the same values).
__device__ __forceinline__ uint4 to_wire(uint4 v) {
    return make_uint4(off_sentinel(v.x), off_sentinel(v.y), off_sentinel(v.z), off_sentinel(v.w));
}

__device__ __forceinline__ bool arrived(uint4 v) {
    return v.x != SENTINEL && v.y != SENTINEL && v.z != SENTINEL && v.w != SENTINEL;
}

__device__ __forceinline__ void st_volatile(uint4 *p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// Vector i of every source PE but me (PE p's at base + p * slot_bytes): all first loads in
// flight together (one L2 round trip instead of one per peer), then each polled until it
// has arrived.
template <int MAXP>
__device__ __forceinline__ void ld_arrived(const char *base, size_t slot_bytes, size_t i, int me, int npes, uint4 *in) {
#pragma unroll
    for (int p = 0; p < MAXP; p++)
        if (p < npes && p != me) in[p] = ld_volatile((const uint4 *)(base + (size_t)p * slot_bytes) + i);
#pragma unroll
    for (int p = 0; p < MAXP; p++)
        if (p < npes && p != me)
            while (!arrived(in[p])) in[p] = ld_volatile((const uint4 *)(base + (size_t)p * slot_bytes) + i);
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

template <typename T, typename Op, int NP>
__device__ void sentinel_allreduce_np(const T *src, T *dst, size_t n, Ctrl *ctrl, char *region, size_t slot_bytes, const Peers &peers) {
    constexpr int MAXP = NP > 0 ? NP : LL_MAX_PES;
    const int me = peers.me, npes = NP > 0 ? NP : peers.npes;
    const uint64_t e = call_epoch(ctrl);
    const size_t offset = slot_offset(e, me, npes, slot_bytes);  // my slot, at any PE
    char *base = region + slot_offset(e, 0, npes, slot_bytes);
    const size_t bytes = n * sizeof(T), nvec = (bytes + 15) / 16;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = first; i < nvec; i += stride) {
        const uint4 v = to_wire(load16((const char *)src, bytes, i));
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (p < npes && p != me) st_volatile((uint4 *)(peers.slot[p] + offset) + i, v);
    }
    // Each thread reads back the vectors it sent, so no barrier is needed in between.
    for (size_t i = first; i < nvec; i += stride) {
        const uint4 own = to_wire(load16((const char *)src, bytes, i));
        uint4 in[MAXP];
        ld_arrived<MAXP>(base, slot_bytes, i, me, npes, in);
        store16((char *)dst, bytes, i, reduce_in_pe_order<T, Op, MAXP>(in, own, me, npes));
        // Refill for the call two epochs on.
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (p < npes && p != me) st_volatile((uint4 *)(base + (size_t)p * slot_bytes) + i, make_uint4(SENTINEL, SENTINEL, SENTINEL, SENTINEL));
    }
    finish_call(ctrl, e);
}

template <typename T, typename Op>
__device__ void sentinel_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, char *region, size_t slot_bytes, const Peers &peers) {
    WITH_NP(peers.npes, (sentinel_allreduce_np<T, Op, NP>(src, dst, n, ctrl, region, slot_bytes, peers)))
}

// ---- sentinel two-shot (reduce-scatter, then all-gather, both into sentinel buffers) ----
// Owner q holds vectors [q * P, (q + 1) * P) of the input, P = ceil(vectors / npes). Each
// sentinel slot has two halves: a PE pushes its vector q * P + k to owner q's buffer (its own
// slot, first half, at k); the owner polls vector k of every peer, reduces in PE order, and
// pushes the result to every PE (its slot, second half, at k), which polls and stores it.
// Each PE sends 2 (n - 1) / n vectors per input vector, the one-shot n - 1, for one more hop.
// The three loops need no barrier and may map vectors to threads differently: an owner's
// result at k exists only after every PE's input at q * P + k has been read, so a result
// stored in place never overwrites input still to be sent. A PE in call e + 2 has had
// vector 0's result of call e + 1 from owner 0 (or, as owner 0, every peer's vector 0), so
// every PE has finished call e, refills included.
template <typename T, typename Op, int NP>
__device__ void sentinel_twoshot_allreduce_np(const T *src, T *dst, size_t n, Ctrl *ctrl, char *region, size_t slot_bytes, const Peers &peers) {
    constexpr int MAXP = NP > 0 ? NP : LL_MAX_PES;
    const int me = peers.me, npes = NP > 0 ? NP : peers.npes;
    const uint64_t e = call_epoch(ctrl);
    const size_t half = slot_bytes / 2;
    const size_t offset = slot_offset(e, me, npes, slot_bytes);  // my slot, at any PE
    char *base = region + slot_offset(e, 0, npes, slot_bytes);
    const size_t bytes = n * sizeof(T), nvec = (bytes + 15) / 16;
    const size_t P = (nvec + npes - 1) / npes;
    // Consecutive warps on different blocks, so that the owner's loop, which covers only a
    // part, still runs on every SM (block size: a multiple of 32).
    const size_t first = (((size_t)(threadIdx.x >> 5) * gridDim.x + blockIdx.x) << 5) + (threadIdx.x & 31);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const uint4 empty = make_uint4(SENTINEL, SENTINEL, SENTINEL, SENTINEL);
    // 1. Every other owner's part to its owner.
    for (size_t j = first; j < nvec; j += stride) {
        const int q = (int)(j / P);
        if (q != me) st_volatile((uint4 *)(peers.slot[q] + offset) + (j - q * P), to_wire(load16((const char *)src, bytes, j)));
    }
    // 2. My part: reduce, refill, send the result everywhere.
    for (size_t k = first; k < P && me * P + k < nvec; k += stride) {
        const size_t j = me * P + k;
        const uint4 own = to_wire(load16((const char *)src, bytes, j));
        uint4 in[MAXP];
        ld_arrived<MAXP>(base, slot_bytes, k, me, npes, in);
        const uint4 r = to_wire(reduce_in_pe_order<T, Op, MAXP>(in, own, me, npes));
#pragma unroll
        for (int p = 0; p < MAXP; p++)
            if (p < npes && p != me) {
                st_volatile((uint4 *)(peers.slot[p] + offset + half) + k, r);
                st_volatile((uint4 *)(base + (size_t)p * slot_bytes) + k, empty);
            }
        store16((char *)dst, bytes, j, r);
    }
    // 3. Every other owner's results.
    for (size_t j = first; j < nvec; j += stride) {
        const int q = (int)(j / P);
        if (q == me) continue;
        uint4 *at = (uint4 *)(base + (size_t)q * slot_bytes + half) + (j - q * P);
        uint4 v;
        do v = ld_volatile(at);
        while (!arrived(v));
        store16((char *)dst, bytes, j, v);
        st_volatile(at, empty);
    }
    finish_call(ctrl, e);
}

template <typename T, typename Op>
__device__ void sentinel_twoshot_allreduce(const T *src, T *dst, size_t n, Ctrl *ctrl, char *region, size_t slot_bytes, const Peers &peers) {
    WITH_NP(peers.npes, (sentinel_twoshot_allreduce_np<T, Op, NP>(src, dst, n, ctrl, region, slot_bytes, peers)))
}

// Every entry point starts here. Launched with programmatic stream serialization, a kernel
// may start while the previous kernel on its stream is still running: griddepcontrol.wait
// holds it until that kernel has completed and its memory is visible (without the launch
// attribute it returns at once). Then it lets the next kernel on the stream begin its launch,
// which overlaps that launch with this call; the next kernel waits here in turn before it
// touches memory. All of this call's blocks are resident by then, so the early blocks of the
// next kernel cannot keep any of them from running.
__device__ __forceinline__ void enter_call() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- entry points -------------------------------------------------------------------------
#define ALLREDUCE_ENTRIES(NAME, T, OPNAME, OP)                                                                   \
    extern "C" __global__ void __launch_bounds__(512) oneshot_allreduce_##NAME##_##OPNAME(                     \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {         \
        enter_call();                                                                                            \
        oneshot_allreduce<T, OP>(src, dst, n, ctrl, flags, staging, slot_bytes);                                 \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(512) twoshot_allreduce_##NAME##_##OPNAME(                     \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {         \
        enter_call();                                                                                            \
        twoshot_allreduce<T, OP>(src, dst, n, ctrl, flags);                                                      \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(512) ll_allreduce_##NAME##_##OPNAME(                          \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes,           \
        const Peers peers) {                                                                                     \
        enter_call();                                                                                            \
        ll_allreduce<T, OP>(src, dst, n, ctrl, staging, slot_bytes, peers);                                      \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(512) ll_twoshot_allreduce_##NAME##_##OPNAME(                  \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes,           \
        const Peers peers) {                                                                                     \
        enter_call();                                                                                            \
        ll_twoshot_allreduce<T, OP>(src, dst, n, ctrl, staging, slot_bytes, peers);                              \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(512) bandwidth_allreduce_##NAME##_##OPNAME(                   \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes,           \
        const BandwidthPlan plan) {                                                                              \
        enter_call();                                                                                            \
        bandwidth_allreduce<T, OP>(src, dst, n, ctrl, flags, staging, slot_bytes, plan);                         \
    }

// The sentinel path: floating-point types only (see there).
#define SENTINEL_ENTRY(NAME, T, OPNAME, OP)                                                                      \
    extern "C" __global__ void __launch_bounds__(512) sentinel_allreduce_##NAME##_##OPNAME(                    \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *region, size_t slot_bytes,            \
        const Peers peers) {                                                                                     \
        enter_call();                                                                                            \
        sentinel_allreduce<T, OP>(src, dst, n, ctrl, region, slot_bytes, peers);                                 \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(512) sentinel_twoshot_allreduce_##NAME##_##OPNAME(            \
        const T *src, T *dst, size_t n, Ctrl *ctrl, uint64_t *flags, char *region, size_t slot_bytes,            \
        const Peers peers) {                                                                                     \
        enter_call();                                                                                            \
        sentinel_twoshot_allreduce<T, OP>(src, dst, n, ctrl, region, slot_bytes, peers);                         \
    }

#define ALLREDUCE_TYPE(NAME, T)              \
    ALLREDUCE_ENTRIES(NAME, T, sum, OpSum)   \
    ALLREDUCE_ENTRIES(NAME, T, max, OpMax)   \
    ALLREDUCE_ENTRIES(NAME, T, min, OpMin)

#define FLOAT_ALLREDUCE_TYPE(NAME, T)    \
    ALLREDUCE_TYPE(NAME, T)              \
    SENTINEL_ENTRY(NAME, T, sum, OpSum)  \
    SENTINEL_ENTRY(NAME, T, max, OpMax)  \
    SENTINEL_ENTRY(NAME, T, min, OpMin)

FLOAT_ALLREDUCE_TYPE(f32, float)
FLOAT_ALLREDUCE_TYPE(f16, __half)
FLOAT_ALLREDUCE_TYPE(bf16, __nv_bfloat16)
ALLREDUCE_TYPE(i32, int32_t)

extern "C" __global__ void __launch_bounds__(512) oneshot_allgather_bytes(
    const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    enter_call();
    oneshot_allgather(src, dst, bytes, ctrl, flags, staging, slot_bytes);
}

extern "C" __global__ void __launch_bounds__(512) bandwidth_allgather_bytes(
    const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes) {
    enter_call();
    bandwidth_allgather(src, dst, bytes, ctrl, flags);
}

extern "C" __global__ void __launch_bounds__(512) ll_allgather_bytes(
    const char *src, char *dst, size_t bytes, Ctrl *ctrl, uint64_t *flags, char *staging, size_t slot_bytes,
    const Peers peers) {
    enter_call();
    ll_allgather(src, dst, bytes, ctrl, staging, slot_bytes, peers);
}
