// The layout of a channel as kernels see it: what `Channel::handle()` passes to a kernel by
// value, and what the device functions of nvshmem_rs/channel.cuh take. Plain C, read by nvcc
// and by bindgen (for the Rust side), so both agree on it.
#ifndef NVSHMEM_RS_CHANNEL_H
#define NVSHMEM_RS_CHANNEL_H

#include <stdint.h>

// Words of a channel's control block (symmetric, one block on every PE), after the `depth`
// ready words.
enum NvshmemRsChannelWord {
    // On the producer: messages the consumer has released (written by the consumer).
    CHANNEL_CREDIT = 0,
    // On the producer: messages pushed so far.
    CHANNEL_SENT = 1,
    // On the consumer: messages popped so far.
    CHANNEL_RECEIVED = 2,
    // On the producer: blocks of the current multi-block send that are done (low 32 bits),
    // and those whose wait gave up (high 32 bits).
    CHANNEL_SEND_ARRIVED = 3,
    // On the consumer: the same for the current multi-block receive.
    CHANNEL_RECV_ARRIVED = 4,
    // On the consumer: the byte length of the message popped last.
    CHANNEL_LAST_BYTES = 5,
    // On each PE: set, for good, by the first wait of this PE on the channel that gave up;
    // every later wait here stops at its first look at the clock.
    CHANNEL_STOPPED = 6,
    CHANNEL_WORDS = 7,
};

// Slots start on this boundary, and hold a multiple of it.
#define CHANNEL_SLOT_ALIGN 16

// Set in a ready word's length when the message travels as LL lines (see
// nvshmem_rs_channel::ll), so messages hold fewer than 2^31 bytes.
#define CHANNEL_READY_LL 0x80000000u

// The largest message a channel sends as LL lines: its LL slots hold this many data bytes
// (or the largest message, if smaller, rounded up to 8).
#define CHANNEL_LL_MAX_BYTES 4096

// What a wait that gave up waited for (nvshmem_rs_channel_fault.site).
enum NvshmemRsChannelWait {
    // A push, for a free slot: the consumer's release of message seq - depth.
    CHANNEL_WAIT_SLOT = 1,
    // A pop, for message seq.
    CHANNEL_WAIT_MESSAGE = 2,
};

// The first wait of this PE on a channel that ran out of time, written by the device into host
// memory the GPU maps, so that the host reads it without waiting for a stream (which may never
// finish). `raised` is written last.
typedef struct nvshmem_rs_channel_fault {
    uint32_t raised;
    // NvshmemRsChannelWait.
    int32_t site;
    // The PE waited for: the consumer for a slot, the producer for a message.
    int32_t pe;
    // The block that waited.
    int32_t block;
    // The message's number on the channel, from 0.
    uint64_t seq;
    // How long it waited, in nanoseconds.
    uint64_t waited_ns;
} nvshmem_rs_channel_fault;

// A bounded single-producer single-consumer queue from PE `producer` to PE `consumer`.
// Message s (counting from 0) goes into slot s % depth on the consumer; the producer may
// write it once the consumer has released message s - depth (credit >= s + 1 - depth), and the
// consumer may read it once the tag of ready[s % depth] is that of s. Counters are 64-bit and
// never wrap; a ready word carries only the low 32 bits of s + 1, which tell message s from
// s - depth since depth < 2^32.
//
// Small messages between PEs that map each other's memory travel as LL lines instead: 16
// bytes that carry 8 bytes of the message, each 4 beside the message's tag, stored with one
// instruction. A pop that sees the tag in both halves of a line has those bytes, so the
// producer needs no fence between the data and the ready word, and the consumer loads the
// first line while it waits for the ready word. The ready word says which form a message took
// (CHANNEL_READY_LL). A line keeps its tag until it is written again: so that no line is old
// enough for its tag to come round again (2^32 messages), a push rewrites every line of its LL
// slot once every 2^31 messages (ll_clean_every visits of the slot).
typedef struct nvshmem_rs_channel {
    // Symmetric: depth slots of slot_bytes bytes each; the consumer's copy holds the messages.
    char *slots;
    // Symmetric, `depth` words: on the consumer, once message s is in slot i,
    // `ready[i] = (s + 1) mod 2^32 << 32 | its length in bytes` (one word, so that a pop reads
    // the length with the word it waited for), with CHANNEL_READY_LL set in the length when it
    // came as LL lines.
    uint64_t *ready;
    // Symmetric, CHANNEL_WORDS words (NvshmemRsChannelWord).
    uint64_t *words;
    // Bytes a slot holds: the largest message.
    uint64_t slot_bytes;
    // Symmetric, after the slots: `depth` LL slots of 2 * ll_bytes bytes (ll_bytes / 8 lines)
    // each; the consumer's copy holds the lines.
    char *ll;
    // Data bytes an LL slot holds (a multiple of 8): messages of up to this many bytes may
    // travel as LL lines.
    uint64_t ll_bytes;
    // A push rewrites every line of its LL slot on one visit of the slot in this many (at
    // least 1): max(1, 2^31 / depth), so that no line is older than 2^31 messages (depth, if
    // more).
    // Smaller values are correct too, and cost a full slot's stores more often.
    uint64_t ll_clean_every;
    // Slots: messages in flight at most.
    uint32_t depth;
    // The PE that pushes.
    int32_t producer;
    // The PE that pops.
    int32_t consumer;
    // How long a wait for the other end may last, in units of 2^20 ns (about a millisecond);
    // 0: no bound.
    uint32_t wait_units;
    // This PE's fault record (mapped host memory), or null.
    nvshmem_rs_channel_fault *fault;
    // The other end's memory as this PE maps it (NVLink, or this GPU), so that kernels store
    // into it without asking NVSHMEM where it lies at every message. Each is null where only
    // NVSHMEM's transports reach the other end, and on the PEs that are neither end.
    // On the producer: the consumer's `slots`.
    char *peer_slots;
    // On the producer: the consumer's `ready`.
    uint64_t *peer_ready;
    // On the producer: the consumer's `ll`. Messages go as LL lines only where it is mapped.
    char *peer_ll;
    // On the consumer: the producer's `words` (its credit).
    uint64_t *peer_words;
} nvshmem_rs_channel;

#endif
