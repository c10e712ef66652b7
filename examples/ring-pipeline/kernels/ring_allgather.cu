// All-gather by ring pipelining with put-with-signal.
//
// The symmetric buffer `data` holds one slot of `slot_bytes` per PE; PE p's contribution is
// in slot p. Each slot is cut into chunks of `chunk_bytes` (the last one may be shorter).
// At step s (0 <= s < n_pes - 1) a PE forwards slot (me - s) mod n_pes to the next PE: its
// own slot at step 0, then the slot it received at step s - 1. Every chunk is sent with
// nvshmemx_putmem_signal_nbi_block, which sets that chunk's signal on the receiver once the
// data is there, so a chunk moves on as soon as it arrives while later chunks are still on
// their way: after n_pes - 1 hops every PE holds every slot.
//
// signals[slot * chunks + c] on a PE says that chunk c of `slot` has arrived there. The host
// passes a fresh `epoch` (1, 2, 3...) to every call; a signal holding `epoch` means "arrived
// in this call", so the signals never need resetting.
//
// The kernel waits on other PEs: it must be launched collectively (all blocks resident) on
// every PE. Block b handles chunks b, b + gridDim.x, ...; PEs may use different grid sizes.

#include <nvshmem.h>
#include <nvshmemx.h>
#include <cooperative_groups.h>
#include <stdint.h>

namespace cg = cooperative_groups;

extern "C" __global__ void ring_allgather(char *data, uint64_t *signals, size_t slot_bytes,
                                          size_t chunk_bytes, uint64_t epoch) {
    const int me = nvshmem_my_pe();
    const int n_pes = nvshmem_n_pes();
    const int next = (me + 1) % n_pes;
    const size_t chunks = (slot_bytes + chunk_bytes - 1) / chunk_bytes;

    // A peer may still be in the previous call, forwarding from the slots we are about to
    // overwrite: start together. (The barrier also completes this PE's earlier puts.)
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        nvshmem_barrier_all();
    }
    cg::this_grid().sync();
    if (n_pes == 1) {
        return;
    }

    for (int step = 0; step < n_pes - 1; ++step) {
        const int slot = (me - step + n_pes) % n_pes;
        for (size_t c = blockIdx.x; c < chunks; c += gridDim.x) {
            uint64_t *sig = signals + (size_t)slot * chunks + c;
            if (step > 0) {
                // Received from the previous PE at its step - 1.
                if (threadIdx.x == 0) {
                    nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, epoch);
                }
                __syncthreads();
            }
            const size_t begin = c * chunk_bytes;
            const size_t len = min(chunk_bytes, slot_bytes - begin);
            char *chunk = data + (size_t)slot * slot_bytes + begin;
            // Same offset on the next PE; its signal for (slot, c) is set after the data lands.
            nvshmemx_putmem_signal_nbi_block(chunk, chunk, len, sig, epoch, NVSHMEM_SIGNAL_SET, next);
        }
    }

    // The slot of the next PE arrives last (n_pes - 1 hops) and is not forwarded: wait for it.
    const int last = next;
    if (threadIdx.x == 0) {
        for (size_t c = blockIdx.x; c < chunks; c += gridDim.x) {
            nvshmem_signal_wait_until(signals + (size_t)last * chunks + c, NVSHMEM_CMP_GE, epoch);
        }
        // Our outgoing puts read from `data`: complete them before the host may change it.
        nvshmem_quiet();
    }
}
