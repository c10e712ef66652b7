// What no collective can beat on this machine (used by bench/src/floor.rs): the cost of a
// kernel node in a CUDA graph, the one-way latency of a store to a peer's memory seen by the
// peer polling for it, and an L2 round trip.
#include <nvshmem.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void store_release(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t load_acquire(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Wait until *p >= v; false after `limit_ns` without it.
__device__ __forceinline__ bool wait_at_least(const uint64_t *p, uint64_t v, unsigned long long limit_ns) {
    const unsigned long long start = now_ns();
    while (load_acquire(p) < v)
        if (now_ns() - start > limit_ns) return false;
    return true;
}

}  // namespace

// A kernel node that does almost nothing: one thread adds 1 to *count with a reduction the
// SM issues without waiting for it, so that the host can check that every node ran.
extern "C" __global__ void floor_count(unsigned long long *count) {
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(count, 1ull);
}

// The same under programmatic dependent launch: wait for the kernel before (which lets this
// one launch while that one runs), then let the next one launch.
extern "C" __global__ void floor_count_pdl(unsigned long long *count) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(count, 1ull);
}

// A ping-pong of 8-byte stores between this PE and `peer` through the symmetric word `flag`:
// round r stores base + r into the peer's flag with st.release.sys, and the peer sees it by
// polling its own with ld.acquire.sys, then answers. The initiator writes the time of the
// last `iters` rounds to *elapsed (0 when a wait gave up). One PE alone stores to itself.
extern "C" __global__ void floor_store_pingpong(uint64_t *flag, int peer, int initiator, uint64_t base,
                                                int warmup, int iters, unsigned long long limit_ns,
                                                unsigned long long *elapsed) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t *remote = (uint64_t *)nvshmem_ptr(flag, peer);
    unsigned long long start = 0;
    if (remote == nullptr) {
        if (initiator) *elapsed = 0;
        return;
    }
    for (int r = 1; r <= warmup + iters; r++) {
        if (r == warmup + 1) start = now_ns();
        const uint64_t v = base + r;
        if (initiator) {
            // Alone, `remote` is `flag`: the wait sees this PE's own store.
            store_release(remote, v);
            if (!wait_at_least(flag, v, limit_ns)) {
                *elapsed = 0;
                return;
            }
        } else {
            if (!wait_at_least(flag, v, limit_ns)) return;
            store_release(remote, v);
        }
    }
    if (initiator) *elapsed = now_ns() - start;
}

// A chase through `next` (a cycle over its entries) by one thread with loads cached in L2
// only (ld.global.cg): `steps` loads to bring the chain into L2, then `steps` timed ones,
// each waiting for the one before. Writes where it ended and the time of the timed loads.
extern "C" __global__ void floor_l2_chase(const uint32_t *next, uint32_t start, int steps, uint32_t *end,
                                          unsigned long long *elapsed) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint32_t i = start;
    for (int s = 0; s < steps; s++) i = __ldcg(next + i);
    const unsigned long long t0 = now_ns();
    for (int s = 0; s < steps; s++) i = __ldcg(next + i);
    const unsigned long long t1 = now_ns();
    *end = i;
    *elapsed = t1 - t0;
}
