// The layout of a channel as kernels see it: what `Channel::handle()` passes to a kernel by
// value, and what the device functions of nvshmem_rs/channel.cuh take. Plain C, read by nvcc
// and by bindgen (for the Rust side), so both agree on it.
#ifndef NVSHMEM_RS_CHANNEL_H
#define NVSHMEM_RS_CHANNEL_H

#include <stdint.h>

// Words of a channel's control block (symmetric, one block on every PE), after the
// 2 * depth words of `ready` and `lens`.
enum NvshmemRsChannelWord {
    // On the producer: messages the consumer has released (written by the consumer).
    CHANNEL_CREDIT = 0,
    // On the producer: messages pushed so far.
    CHANNEL_SENT = 1,
    // On the consumer: messages popped so far.
    CHANNEL_RECEIVED = 2,
    // On the producer: blocks of the current multi-block send that are done.
    CHANNEL_SEND_ARRIVED = 3,
    // On the consumer: blocks of the current multi-block receive that are done.
    CHANNEL_RECV_ARRIVED = 4,
    // On the consumer: the byte length of the message popped last.
    CHANNEL_LAST_BYTES = 5,
    CHANNEL_WORDS = 6,
};

// Slots start on this boundary, and hold a multiple of it.
#define CHANNEL_SLOT_ALIGN 16

// A bounded single-producer single-consumer queue from PE `producer` to PE `consumer`.
// Message s (counting from 0) goes into slot s % depth on the consumer; the producer may
// write it once the consumer has released message s - depth (credit >= s + 1 - depth), and the
// consumer may read it once ready[s % depth] >= s + 1. Counters are 64-bit and never wrap.
typedef struct nvshmem_rs_channel {
    // Symmetric: depth slots of slot_bytes bytes each; the consumer's copy holds the messages.
    char *slots;
    // Symmetric, `depth` words: on the consumer, `ready[i] = s + 1` once message s is in slot i.
    uint64_t *ready;
    // Symmetric, `depth` words: on the consumer, the byte length of the message in slot i.
    uint64_t *lens;
    // Symmetric, CHANNEL_WORDS words (NvshmemRsChannelWord).
    uint64_t *words;
    // Bytes a slot holds: the largest message.
    uint64_t slot_bytes;
    // Slots: messages in flight at most.
    uint32_t depth;
    // The PE that pushes.
    int32_t producer;
    // The PE that pops.
    int32_t consumer;
} nvshmem_rs_channel;

#endif
