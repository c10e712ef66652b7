// The kernels behind Channel::send and Channel::recv (src/channel): one message each, by one
// block through the device header's block functions, or by several blocks for a large one,
// where each block moves a part and the last block to finish publishes (send) or releases
// (recv) the slot.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include "nvshmem_rs/channel.cuh"

using nvshmem_rs::Scope;

// This block's part of `bytes`, in 16-byte multiples except the last part.
__device__ __forceinline__ void block_part(uint64_t bytes, uint64_t *first, uint64_t *len) {
    const uint64_t vecs = (bytes + 15) / 16, per = (vecs + gridDim.x - 1) / gridDim.x;
    const uint64_t a = min(vecs, per * blockIdx.x) * 16, b = min(vecs, per * (blockIdx.x + 1)) * 16;
    *first = a;
    *len = (b < bytes ? b : bytes) - (a < bytes ? a : bytes);
}

// Launched with programmatic stream serialization (Channel::send/recv), a kernel may start
// while the kernel before it on the stream still runs: wait for it before touching anything
// it may write (the message, the channel's counters), and let the next kernel start
// launching at once, so that its launch overlaps this one's wait.
__device__ __forceinline__ void enter() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Whether this block is the last of the grid to get here, and every block's wait succeeded
// (`ok` is this block's). `arrived` counts the blocks in its low 32 bits and the blocks whose
// wait gave up in its high 32 bits; the last block resets it for the next launch. Called by one
// thread, after the block's work.
__device__ __forceinline__ bool last_to_arrive_all_ok(uint64_t *arrived, bool ok) {
    __threadfence_system();
    const uint64_t before = atomicAdd((unsigned long long *)arrived, ok ? 1ull : (1ull << 32) | 1ull);
    if ((uint32_t)before != gridDim.x - 1) return false;
    *arrived = 0;
    __threadfence_system();
    return ok && (before >> 32) == 0;
}

// A send whose wait for a free slot gives up publishes nothing: the channel's fault record says
// why, and Channel returns it.
extern "C" __global__ void __launch_bounds__(512)
    channel_send(nvshmem_rs_channel ch, const char *src, uint64_t bytes) {
    enter();
    if (gridDim.x == 1) {
        nvshmem_rs::channel_push_block(ch, src, bytes);
        return;
    }
    using namespace nvshmem_rs::channel_detail;
    // Every block reads the same count: the last block advances it, after all have started.
    uint64_t seq = 0;
    if (threadIdx.x == 0) seq = nvshmem_rs::channel_reserve(ch);
    seq = broadcast<Scope::Block>(seq);
    const bool ok = seq != nvshmem_rs::CHANNEL_TIMED_OUT;
    // A message this large never goes as LL lines; the first block rewrites the LL slot when due.
    if (ok && blockIdx.x == 0 && ch.peer_ll && ll_clean_due(ch, seq)) ll_store<Scope::Block>(ch, seq, src, 0, ch.ll_bytes / 8);
    if (ok) {
        uint64_t first, len;
        block_part(bytes, &first, &len);
        if (len > 0 && ch.peer_slots)
            store_to_slot<Scope::Block>(ch.peer_slots + (seq % ch.depth) * ch.slot_bytes + first, src + first, len);
        else if (len > 0)
            nvshmemx_putmem_block(nvshmem_rs::channel_slot(ch, seq) + first, src + first, len, ch.consumer);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // The block's puts are complete before it counts itself in (its plain stores: by the
        // fence there).
        if (!ch.peer_slots) nvshmem_quiet();
        if (last_to_arrive_all_ok(&ch.words[CHANNEL_SEND_ARRIVED], ok)) publish_bulk(ch, seq, bytes);
    }
}

// Copies at most `capacity` bytes of the message into dst; the message's length is left in
// the channel's CHANNEL_LAST_BYTES word. A receive whose wait gives up takes nothing.
extern "C" __global__ void __launch_bounds__(512)
    channel_recv(nvshmem_rs_channel ch, char *dst, uint64_t capacity) {
    enter();
    if (gridDim.x == 1) {
        nvshmem_rs::channel_pop_block(ch, dst, capacity);
        return;
    }
    using namespace nvshmem_rs::channel_detail;
    Arrival a{0, 0, {0, 0}};
    if (threadIdx.x == 0) a = wait_arrival(ch);
    a = broadcast<Scope::Block>(a);
    const uint64_t bytes = ready_bytes(a.word), limit = bytes < capacity ? bytes : capacity;
    bool ok = a.seq != nvshmem_rs::CHANNEL_TIMED_OUT;
    if (ok && ready_ll(a.word)) {
        // A small message, which came as LL lines: the first block copies it all.
        if (blockIdx.x == 0) ok = ll_load<Scope::Block>(ch, a, bytes, dst, limit);
    } else if (ok) {
        uint64_t first, len;
        block_part(limit, &first, &len);
        copy_from_slot<Scope::Block>(dst + first, nvshmem_rs::channel_slot(ch, a.seq) + first, len);
    }
    __syncthreads();
    if (threadIdx.x == 0 && last_to_arrive_all_ok(&ch.words[CHANNEL_RECV_ARRIVED], ok))
        nvshmem_rs::channel_release(ch, a.seq, bytes);
}
