// The stage of checks/src/bin/pipeline/, written as a user's kernel would be: it includes the
// crate's device header and hands micro-batches from GPU to GPU with no host in between.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include <nvshmem_rs/channel.cuh>

using nvshmem_rs::Scope;

// What stage s does to every element of a micro-batch (checks/src/bin/pipeline/ repeats it).
__device__ __forceinline__ uint32_t stage_op(uint32_t x, uint32_t s) { return x * 3u + s + 1u; }

// Pop a micro-batch, apply stage_op, push it on; `batches` times. `buf` holds one micro-batch
// (max_len elements). Mode 0, 1, 2: the block, warp or thread functions (launch as many
// threads); mode 3: the block reads the message in place (peek) instead of copying it out.
// A wait that gives up (a neighbour stopped) ends the stage: the host learns why from the
// channel (Channel::check), and nothing made up is passed on.
template <Scope S>
__device__ void run(nvshmem_rs_channel in, nvshmem_rs_channel out, uint32_t *buf, uint32_t max_len,
                    uint32_t batches, uint32_t stage, bool peek) {
    const unsigned rank = nvshmem_rs::channel_detail::rank<S>(), size = nvshmem_rs::channel_detail::size<S>();
    for (uint32_t b = 0; b < batches; b++) {
        uint64_t bytes;
        if (peek) {
            const uint32_t *msg = (const uint32_t *)nvshmem_rs::channel_peek<S>(in, &bytes);
            if (msg == nullptr) return;
            for (uint64_t i = rank; i < bytes / 4; i += size) buf[i] = stage_op(__ldcg(msg + i), stage);
            nvshmem_rs::channel_release_peeked<S>(in);
        } else {
            bytes = nvshmem_rs::channel_pop<S>(in, buf, (uint64_t)max_len * 4);
            if (bytes == nvshmem_rs::CHANNEL_TIMED_OUT) return;
            nvshmem_rs::channel_detail::sync<S>();
            for (uint64_t i = rank; i < bytes / 4; i += size) buf[i] = stage_op(buf[i], stage);
        }
        nvshmem_rs::channel_detail::sync<S>();
        if (!nvshmem_rs::channel_push<S>(out, buf, bytes)) return;
    }
}

extern "C" __global__ void pipeline_stage(nvshmem_rs_channel in, nvshmem_rs_channel out, uint32_t *buf,
                                          uint32_t max_len, uint32_t batches, uint32_t stage, uint32_t mode) {
    switch (mode) {
    case 0: run<Scope::Block>(in, out, buf, max_len, batches, stage, false); break;
    case 1: if (threadIdx.x < 32) run<Scope::Warp>(in, out, buf, max_len, batches, stage, false); break;
    case 2: if (threadIdx.x == 0) run<Scope::Thread>(in, out, buf, max_len, batches, stage, false); break;
    default: run<Scope::Block>(in, out, buf, max_len, batches, stage, true); break;
    }
}
