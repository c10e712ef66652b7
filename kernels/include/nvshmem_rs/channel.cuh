// Device side of nvshmem::channel::Channel: push and pop messages from inside a kernel, so a
// producer kernel on one GPU hands data straight to a consumer kernel on another, with no host
// in between. Include as <nvshmem_rs/channel.cuh>: crates that build their kernels with
// nvshmem_build have it on their include path. Pass the channel to the kernel by value
// (`Channel::handle()`, an `nvshmem_rs_channel`).
//
//   extern "C" __global__ void produce(nvshmem_rs_channel ch, const float *x, uint64_t n) {
//       if (!nvshmem_rs::channel_push_block(ch, x, n * sizeof(float))) return;  // gave up
//   }
//   extern "C" __global__ void consume(nvshmem_rs_channel ch, float *y, uint64_t cap) {
//       uint64_t bytes = nvshmem_rs::channel_pop_block(ch, y, cap * sizeof(float));
//       if (bytes == nvshmem_rs::CHANNEL_TIMED_OUT) return;                    // gave up
//   }
//
// Rules:
//   - Pushes run on the producer PE, pops on the consumer PE. One group (a thread, a warp or a
//     block) pushes at a time, and one pops at a time: the end's counter lives in memory and
//     is read, then advanced, by the group's leader. Kernels that take turns on a stream (and
//     the host's Channel::send / recv) may share an end.
//   - A push waits while all `depth` slots hold unread messages; a pop waits for a message.
//     Every wait is bounded by the channel's timeout (ChannelConfig::timeout, carried in the
//     handle): past it, a push returns false and a pop CHANNEL_TIMED_OUT (a peek: null), having
//     taken nothing and moved no counter, and the wait records the PE it waited for in the
//     channel's fault record, which the host's next call on the channel (or Channel::check)
//     returns as Error::ChannelTimeout. From then on every wait of this PE on the channel gives
//     up at its first look at the clock (about a millisecond in). Test what each call returns:
//     a kernel that goes on as if the message had come passes garbage down the pipeline.
//   - Ordering: a pop returns after the message's bytes, as pushed, are visible to the popping
//     group. Data written before a push (by the pushing group) is not ordered with the
//     consumer's reads beyond the message itself: send it in the message.
//   - Every pointer must be 16-byte aligned for the fast path of large messages (8-byte for
//     small ones, which go as LL lines); any alignment works.
#ifndef NVSHMEM_RS_CHANNEL_CUH
#define NVSHMEM_RS_CHANNEL_CUH

#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include "nvshmem_rs/channel.h"

namespace nvshmem_rs {

// Which threads act together on a channel end.
enum class Scope { Thread, Warp, Block };

// What a pop (and the lower-level reserve and wait) returns when its wait gave up: no message
// is that long, and no sequence number that large.
constexpr uint64_t CHANNEL_TIMED_OUT = ~0ull;

namespace channel_detail {

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void st_relaxed_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Polls of a wait between two looks at the clock: a wait that ends sooner never reads it, and
// the poll loop touches nothing but the polled words and registers.
constexpr uint32_t spins_per_check = 1024;

// The clock in units of 2^20 ns (about a millisecond), never 0.
__device__ __forceinline__ uint32_t clock_units() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return (uint32_t)(t >> 20) | 1u;
}

// After a wait that ran out of time: the first of this PE on the channel claims
// CHANNEL_STOPPED and writes the fault record, alone.
__device__ __forceinline__ void record_fault(const nvshmem_rs_channel &ch, int site, int pe, uint64_t seq,
                                             uint32_t since) {
    if (atomicCAS((unsigned long long *)&ch.words[CHANNEL_STOPPED], 0ull, 1ull) != 0ull || ch.fault == nullptr)
        return;
    volatile nvshmem_rs_channel_fault *f = ch.fault;
    f->site = site;
    f->pe = pe;
    f->block = (int32_t)blockIdx.x;
    f->seq = seq;
    f->waited_ns = (uint64_t)(clock_units() - since) << 20;
    __threadfence_system();
    f->raised = 1;
}

// Spin until `done(load())` (memory PE `pe` writes); the value that ended the wait is left in
// *seen. False when the wait gave up: it lasted ch.wait_units from its first look at the clock
// (the first to give up records itself as waiting at `site` for message `seq`), or an earlier
// wait of this PE on the channel gave up.
template <typename Load, typename Done, typename V>
__device__ __forceinline__ bool wait_until(const nvshmem_rs_channel &ch, Load load, Done done, int site, int pe,
                                           uint64_t seq, V *seen) {
    uint32_t spins = 0, since = 0;
    for (;;) {
        const V v = load();
        if (done(v)) {
            *seen = v;
            return true;
        }
        if (__builtin_expect(++spins < spins_per_check, 1)) continue;
        spins = 0;
        if (*(volatile uint64_t *)&ch.words[CHANNEL_STOPPED] != 0) return false;
        const uint32_t now = clock_units();
        if (since == 0) since = now;
        if (ch.wait_units == 0 || now - since < ch.wait_units) continue;
        record_fault(ch, site, pe, seq, since);
        return false;
    }
}

// wait_until for a word at p, read with acquire ordering.
template <typename Done>
__device__ __forceinline__ bool wait_for(const nvshmem_rs_channel &ch, const uint64_t *p, Done done, int site,
                                         int pe, uint64_t seq, uint64_t *seen) {
    return wait_until(ch, [p] { return ld_acquire_sys(p); }, done, site, pe, seq, seen);
}

// Spin until *p >= v (a counter PE `pe` advances); as wait_for.
__device__ __forceinline__ bool wait_at_least(const nvshmem_rs_channel &ch, const uint64_t *p, uint64_t v,
                                              int site, int pe, uint64_t seq) {
    uint64_t seen;
    return wait_for(ch, p, [v](uint64_t w) { return w >= v; }, site, pe, seq, &seen);
}

// The tag of message `seq` in a ready word (see nvshmem_rs_channel::ready).
__device__ __forceinline__ uint32_t ready_tag(uint64_t seq) { return (uint32_t)(seq + 1); }

// The ready word of message `seq`, of `bytes` bytes (fewer than 2^31: Channel checks), and
// CHANNEL_READY_LL when it came as LL lines.
__device__ __forceinline__ uint64_t ready_word(uint64_t seq, uint64_t bytes, bool ll) {
    return (uint64_t)ready_tag(seq) << 32 | (uint32_t)bytes | (ll ? CHANNEL_READY_LL : 0u);
}

// The message's length in a ready word, and whether it came as LL lines.
__device__ __forceinline__ uint64_t ready_bytes(uint64_t word) { return (uint32_t)word & ~CHANNEL_READY_LL; }
__device__ __forceinline__ bool ready_ll(uint64_t word) { return ((uint32_t)word & CHANNEL_READY_LL) != 0; }

template <Scope S> __device__ __forceinline__ unsigned rank() {
    if constexpr (S == Scope::Thread) return 0;
    else if constexpr (S == Scope::Warp) return threadIdx.x % 32;
    else return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

template <Scope S> __device__ __forceinline__ unsigned size() {
    if constexpr (S == Scope::Thread) return 1;
    else if constexpr (S == Scope::Warp) return 32;
    else return blockDim.x * blockDim.y * blockDim.z;
}

template <Scope S> __device__ __forceinline__ void sync() {
    if constexpr (S == Scope::Warp) __syncwarp();
    else if constexpr (S == Scope::Block) __syncthreads();
}

// The leader's value (plain data, whole 8-byte words), in every thread of the group.
template <Scope S, typename V> __device__ __forceinline__ V broadcast(V v) {
    static_assert(sizeof(V) % 8 == 0, "broadcast moves 8-byte words");
    if constexpr (S == Scope::Thread) {
        return v;
    } else if constexpr (S == Scope::Warp) {
        uint64_t w[sizeof(V) / 8];
        memcpy(w, &v, sizeof(V));
        for (auto &x : w) x = __shfl_sync(0xffffffffu, x, 0);
        memcpy(&v, w, sizeof(V));
        return v;
    } else {
        __shared__ V shared;
        if (rank<S>() == 0) shared = v;
        __syncthreads();
        v = shared;
        __syncthreads();  // the next broadcast may overwrite it
        return v;
    }
}

// Whether `ok` holds in every thread of the group (a barrier for a block).
template <Scope S> __device__ __forceinline__ bool all(bool ok) {
    if constexpr (S == Scope::Thread) return ok;
    else if constexpr (S == Scope::Warp) return __all_sync(0xffffffffu, ok);
    else return __syncthreads_and(ok) != 0;
}

template <Scope S>
__device__ __forceinline__ void put(void *dst, const void *src, size_t bytes, int pe) {
    if constexpr (S == Scope::Thread) nvshmem_putmem(dst, src, bytes, pe);
    else if constexpr (S == Scope::Warp) nvshmemx_putmem_warp(dst, src, bytes, pe);
    else nvshmemx_putmem_block(dst, src, bytes, pe);
}

// *p, through L2 with `ThroughL2` (past this SM's L1).
template <bool ThroughL2, typename W> __device__ __forceinline__ W load(const W *p) {
    if constexpr (ThroughL2) return __ldcg(p);
    else return *p;
}

// Copy `bytes` from src to dst by the threads of the group, in the widest units both addresses
// align to: 16-byte vectors, then 8-byte words (a whole message of them, where only 8 bytes
// align), then bytes. Each store over NVLink is a transaction.
template <Scope S, bool ThroughL2>
__device__ __forceinline__ void copy_by_group(char *dst, const char *src, uint64_t bytes) {
    const unsigned r = rank<S>(), n = size<S>();
    const uintptr_t both = (uintptr_t)dst | (uintptr_t)src;
    uint64_t done = 0;
    if ((both & 15) == 0) {
        const uint64_t vecs = bytes / 16;
        for (uint64_t i = r; i < vecs; i += n) ((uint4 *)dst)[i] = load<ThroughL2>((const uint4 *)src + i);
        done = vecs * 16;
    }
    if ((both & 7) == 0) {
        const uint64_t words = bytes / 8;
        for (uint64_t i = done / 8 + r; i < words; i += n)
            ((unsigned long long *)dst)[i] = load<ThroughL2>((const unsigned long long *)src + i);
        done = words * 8;
    }
    for (uint64_t i = done + r; i < bytes; i += n) dst[i] = (char)load<ThroughL2>((const signed char *)src + i);
}

// Copy `bytes` from src to dst (the consumer's slot, as this PE maps it), by the threads of
// the group: plain stores over NVLink, with no lookup of where the peer lies.
template <Scope S>
__device__ __forceinline__ void store_to_slot(char *dst, const char *src, uint64_t bytes) {
    copy_by_group<S, false>(dst, src, bytes);
}

// Copy `bytes` from a slot (which peers write, so read through L2: this SM's L1 may hold the
// slot's previous message) to local memory, by the threads of the group.
template <Scope S>
__device__ __forceinline__ void copy_from_slot(char *dst, const char *slot, uint64_t bytes) {
    copy_by_group<S, true>(dst, slot, bytes);
}

// LL lines (see nvshmem_rs_channel::ll). A line is two 8-byte words, each 4 bytes of data
// beside the tag: 8-byte stores and loads are single-copy atomic, so a word that shows the tag
// shows its data.
__device__ __forceinline__ void st_line(char *p, uint64_t data, uint32_t tag) {
    const uint64_t t = (uint64_t)tag << 32;
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(t | (uint32_t)data),
                 "l"(t | (data >> 32))
                 : "memory");
}

__device__ __forceinline__ ulonglong2 ld_line(const char *p) {
    ulonglong2 l;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(l.x), "=l"(l.y) : "l"(p) : "memory");
    return l;
}

__device__ __forceinline__ bool line_is(ulonglong2 l, uint32_t tag) {
    return (uint32_t)(l.x >> 32) == tag && (uint32_t)(l.y >> 32) == tag;
}

__device__ __forceinline__ uint64_t line_data(ulonglong2 l) { return l.y << 32 | (uint32_t)l.x; }

// Lines of a message of `bytes` bytes.
__device__ __forceinline__ uint64_t ll_lines(uint64_t bytes) { return (bytes + 7) / 8; }

// The largest message a group of scope S pushes as LL lines: a line is one store, and a thread
// that stores many lines in turn is slower than one that stores the data and a ready word.
template <Scope S> __device__ __forceinline__ uint64_t ll_most() {
    if constexpr (S == Scope::Thread) return 64;
    else if constexpr (S == Scope::Warp) return 1024;
    else return CHANNEL_LL_MAX_BYTES;
}

// The 8 bytes of src from byte `at` on (those past `bytes` read as 0).
__device__ __forceinline__ uint64_t read8(const char *src, uint64_t at, uint64_t bytes) {
    if (at + 8 <= bytes && ((uintptr_t)(src + at) & 7) == 0) return *(const uint64_t *)(src + at);
    uint64_t v = 0;
    for (uint64_t b = 0; b < 8 && at + b < bytes; ++b) v |= (uint64_t)(uint8_t)src[at + b] << (8 * b);
    return v;
}

// Write the 8 bytes of v to dst from byte `at` on, those before byte `limit`.
__device__ __forceinline__ void write8(char *dst, uint64_t at, uint64_t v, uint64_t limit) {
    if (at + 8 <= limit && ((uintptr_t)(dst + at) & 7) == 0) {
        *(uint64_t *)(dst + at) = v;
        return;
    }
    for (uint64_t b = 0; b < 8 && at + b < limit; ++b) dst[at + b] = (char)(v >> (8 * b));
}

// Whether message seq's push rewrites every line of its LL slot: on one visit of the slot in
// every ch.ll_clean_every, so that no line's tag is old enough to be the current one (tags come
// round every 2^32 messages). The last visit of each period: the first rewrite comes before
// message 2^32 - 1, whose tag (0) the zeroed slots hold.
__device__ __forceinline__ bool ll_clean_due(const nvshmem_rs_channel &ch, uint64_t seq) {
    const uint64_t every = ch.ll_clean_every > 0 ? ch.ll_clean_every : 1;
    return (seq / ch.depth) % every == every - 1;
}

// Store message seq (`bytes` from src) into the consumer's LL slot as its first `lines` lines
// (lines past the message carry the tag and zeroes), by the threads of the group.
template <Scope S>
__device__ __forceinline__ void ll_store(const nvshmem_rs_channel &ch, uint64_t seq, const char *src,
                                         uint64_t bytes, uint64_t lines) {
    char *slot = ch.peer_ll + (seq % ch.depth) * 2 * ch.ll_bytes;
    const uint32_t tag = ready_tag(seq);
    for (uint64_t k = rank<S>(); k < lines; k += size<S>())
        st_line(slot + 16 * k, 8 * k < bytes ? read8(src, 8 * k, bytes) : 0, tag);
}

// What the consumer saw when its message came: the message's number, its ready word, and the
// first line of its LL slot, loaded beside the ready word (it holds the message's first 8
// bytes if the message came as LL lines and that line had come too).
struct Arrival {
    uint64_t seq;
    uint64_t word;
    ulonglong2 first;
};

// One thread: wait for the next message (a.seq is CHANNEL_TIMED_OUT when the wait gave up).
__device__ __forceinline__ Arrival wait_arrival(const nvshmem_rs_channel &ch) {
    const uint64_t seq = *(volatile uint64_t *)&ch.words[CHANNEL_RECEIVED];
    const uint32_t i = (uint32_t)(seq % ch.depth), tag = ready_tag(seq);
    const uint64_t *ready = &ch.ready[i];
    const char *line = ch.ll_bytes > 0 ? ch.ll + (uint64_t)i * 2 * ch.ll_bytes : nullptr;
    Arrival a{seq, 0, {0, 0}};
    // The line's load comes first: after the acquiring load it would wait for that one.
    auto load = [ready, line] {
        Arrival seen{0, 0, {0, 0}};
        if (line) seen.first = ld_line(line);
        seen.word = ld_acquire_sys(ready);
        return seen;
    };
    auto done = [tag](const Arrival &seen) { return (uint32_t)(seen.word >> 32) == tag; };
    Arrival seen;
    if (!wait_until(ch, load, done, CHANNEL_WAIT_MESSAGE, ch.producer, seq, &seen)) {
        a.seq = CHANNEL_TIMED_OUT;
        return a;
    }
    a.word = seen.word;
    a.first = seen.first;
    return a;
}

// Copy the LL message `a` (of `bytes` bytes) into dst, the bytes before `limit`, by the threads
// of the group: first every thread waits until its lines have come, keeping its first line;
// then, if every line came, it writes them out. False, in every thread, when a wait gave up
// (dst untouched).
template <Scope S>
__device__ __forceinline__ bool ll_load(const nvshmem_rs_channel &ch, const Arrival &a, uint64_t bytes,
                                        char *dst, uint64_t limit) {
    const char *slot = ch.ll + (a.seq % ch.depth) * 2 * ch.ll_bytes;
    const uint32_t tag = ready_tag(a.seq);
    const uint64_t lines = ll_lines(bytes), first = rank<S>();
    ulonglong2 mine = a.first;
    bool ok = true;
    for (uint64_t k = first; k < lines && ok; k += size<S>()) {
        ulonglong2 l = k == 0 ? a.first : ulonglong2{0, 0};
        if (!line_is(l, tag)) {
            const char *p = slot + 16 * k;
            ok = wait_until(
                ch, [p] { return ld_line(p); }, [tag](ulonglong2 v) { return line_is(v, tag); },
                CHANNEL_WAIT_MESSAGE, ch.producer, a.seq, &l);
        }
        if (k == first) mine = l;
    }
    if (!all<S>(ok)) return false;
    // The lines stay as they are until the slot is released.
    for (uint64_t k = first; k < lines && 8 * k < limit; k += size<S>())
        write8(dst, 8 * k, line_data(k == first ? mine : ld_line(slot + 16 * k)), limit);
    return true;
}

}  // namespace channel_detail

// The slot message `seq` goes into, on the consumer.
__device__ __forceinline__ char *channel_slot(const nvshmem_rs_channel &ch, uint64_t seq) {
    return ch.slots + (seq % ch.depth) * ch.slot_bytes;
}

// Producer, one thread: wait until the slot of the next message is free; returns the
// message's sequence number, or CHANNEL_TIMED_OUT when the wait gave up.
__device__ __forceinline__ uint64_t channel_reserve(const nvshmem_rs_channel &ch) {
    // The words load at once: the credit usually came long ago. A channel on which a wait of
    // this PE gave up takes no more messages: a multi-block send that gave up may have left
    // lines of message seq behind, which a push of the same number must not meet.
    const uint64_t seq = *(volatile uint64_t *)&ch.words[CHANNEL_SENT];
    const uint64_t stopped = *(volatile uint64_t *)&ch.words[CHANNEL_STOPPED];
    const uint64_t credit = channel_detail::ld_acquire_sys(&ch.words[CHANNEL_CREDIT]);
    if (stopped != 0) return CHANNEL_TIMED_OUT;
    if (seq >= ch.depth && credit < seq + 1 - ch.depth &&
        !channel_detail::wait_at_least(ch, &ch.words[CHANNEL_CREDIT], seq + 1 - ch.depth, CHANNEL_WAIT_SLOT,
                                       ch.consumer, seq))
        return CHANNEL_TIMED_OUT;
    return seq;
}

namespace channel_detail {

// channel_publish, but for the rewrite of the LL slot (done by the caller when due).
__device__ __forceinline__ void publish_bulk(const nvshmem_rs_channel &ch, uint64_t seq, uint64_t bytes) {
    const uint32_t i = (uint32_t)(seq % ch.depth);
    const uint64_t word = channel_detail::ready_word(seq, bytes, false);
    if (ch.peer_ready) {
        // Load/store reach (NVLink, or this GPU): the ready word with release semantics, which
        // orders the data the group stored (the barrier before) before it.
        channel_detail::st_release_sys(&ch.peer_ready[i], word);
    } else {
        // The data lands before the ready word (NVSHMEM orders puts to one PE across a fence,
        // and the group's puts are this thread's by the barrier before).
        nvshmem_fence();
        nvshmemx_signal_op(&ch.ready[i], word, NVSHMEM_SIGNAL_SET, ch.consumer);
    }
    *(volatile uint64_t *)&ch.words[CHANNEL_SENT] = seq + 1;
}

}  // namespace channel_detail

// Producer, one thread, after the message's bytes were put into its slot by this thread (or
// by a group it synchronised with): record its length and mark it ready on the consumer (and,
// once in 2^31 messages, rewrite the slot's LL lines: see nvshmem_rs_channel::ll).
__device__ __forceinline__ void channel_publish(const nvshmem_rs_channel &ch, uint64_t seq,
                                                uint64_t bytes) {
    using namespace channel_detail;
    if (ch.peer_ll && ll_clean_due(ch, seq)) ll_store<Scope::Thread>(ch, seq, nullptr, 0, ch.ll_bytes / 8);
    publish_bulk(ch, seq, bytes);
}

namespace channel_detail {

// Producer, one thread: channel_publish for a message pushed as LL lines, whose lines carry
// their own tags: the ready word needs no fence before it, unless the push rewrote the whole LL
// slot (`cleaned`), whose lines past the message must land before the next message's.
__device__ __forceinline__ void publish_lines(const nvshmem_rs_channel &ch, uint64_t seq, uint64_t bytes,
                                              bool cleaned) {
    if (cleaned) __threadfence_system();
    st_relaxed_sys(&ch.peer_ready[seq % ch.depth], ready_word(seq, bytes, true));
    *(volatile uint64_t *)&ch.words[CHANNEL_SENT] = seq + 1;
}

}  // namespace channel_detail

// Consumer, one thread: wait for the next message; returns its sequence number and stores its
// byte length in *bytes, or CHANNEL_TIMED_OUT (in both) when the wait gave up. The message is
// then in channel_slot(ch, seq): one that came as LL lines is copied there first, so release it
// with channel_release (channel_release_copied orders only loads of the slot).
__device__ __forceinline__ uint64_t channel_wait(const nvshmem_rs_channel &ch, uint64_t *bytes) {
    using namespace channel_detail;
    const Arrival a = wait_arrival(ch);
    const uint64_t n = ready_bytes(a.word);
    if (a.seq == CHANNEL_TIMED_OUT ||
        (ready_ll(a.word) && !ll_load<Scope::Thread>(ch, a, n, channel_slot(ch, a.seq), n))) {
        *bytes = CHANNEL_TIMED_OUT;
        return CHANNEL_TIMED_OUT;
    }
    *bytes = n;
    return a.seq;
}

// Consumer, one thread, once every read of message `seq`'s slot is done (by this thread, or by
// a group it synchronised with): give the slot back to the producer.
__device__ __forceinline__ void channel_release(const nvshmem_rs_channel &ch, uint64_t seq,
                                                uint64_t bytes) {
    // The slot's reads complete before the producer may overwrite it (a release store, or a
    // fence before NVSHMEM's signal).
    if (ch.peer_words) {
        channel_detail::st_release_sys(&ch.peer_words[CHANNEL_CREDIT], seq + 1);
    } else {
        __threadfence_system();
        nvshmemx_signal_op(&ch.words[CHANNEL_CREDIT], seq + 1, NVSHMEM_SIGNAL_SET, ch.producer);
    }
    *(volatile uint64_t *)&ch.words[CHANNEL_LAST_BYTES] = bytes;
    *(volatile uint64_t *)&ch.words[CHANNEL_RECEIVED] = seq + 1;
}

// channel_release after the group copied the slot out (channel_pop): every thread's loads of the
// slot returned their data before its stores of that data to dst issued, and those before the
// barrier this thread passed, so no later write of the producer can reach them. The credit then
// needs no fence of its own: a plain store, which spares the pop a wait for the whole memory
// system. Over NVSHMEM's transports, as channel_release.
__device__ __forceinline__ void channel_release_copied(const nvshmem_rs_channel &ch, uint64_t seq,
                                                       uint64_t bytes) {
    if (!ch.peer_words) {
        channel_release(ch, seq, bytes);
        return;
    }
    channel_detail::st_relaxed_sys(&ch.peer_words[CHANNEL_CREDIT], seq + 1);
    *(volatile uint64_t *)&ch.words[CHANNEL_LAST_BYTES] = bytes;
    *(volatile uint64_t *)&ch.words[CHANNEL_RECEIVED] = seq + 1;
}

// Push `bytes` (at most ch.slot_bytes, which is less than 2^31) from src, local memory of the producer PE, as one
// message. Every thread of the group calls it with the same arguments. Waits for a free slot;
// false, in every thread, when that wait gave up (nothing was pushed).
template <Scope S>
__device__ __forceinline__ bool channel_push(const nvshmem_rs_channel &ch, const void *src,
                                             uint64_t bytes) {
    using namespace channel_detail;
    uint64_t seq = 0;
    if (rank<S>() == 0) seq = channel_reserve(ch);
    seq = broadcast<S>(seq);
    if (seq == CHANNEL_TIMED_OUT) return false;
    // Small messages go as LL lines where the consumer's memory is mapped; every push rewrites
    // the whole LL slot when due.
    const bool ll = ch.peer_ll && bytes <= ch.ll_bytes && bytes <= ll_most<S>();
    const bool clean = ch.peer_ll && ll_clean_due(ch, seq);
    if (ll || clean) ll_store<S>(ch, seq, (const char *)src, ll ? bytes : 0, clean ? ch.ll_bytes / 8 : ll_lines(bytes));
    if (!ll && bytes > 0 && ch.peer_slots)
        store_to_slot<S>(ch.peer_slots + (seq % ch.depth) * ch.slot_bytes, (const char *)src, bytes);
    else if (!ll && bytes > 0)
        put<S>(channel_slot(ch, seq), src, bytes, ch.consumer);
    // The lines carry their tags: the ready word may pass them, unless the slot was rewritten.
    if (!ll || clean) sync<S>();
    if (rank<S>() == 0) {
        if (ll) publish_lines(ch, seq, bytes, clean);
        else publish_bulk(ch, seq, bytes);
    }
    sync<S>();
    return true;
}

// Pop the next message into dst (local memory of the consumer PE), copying at most `capacity`
// bytes; returns the message's length in bytes (larger than `capacity` if it did not fit), or
// CHANNEL_TIMED_OUT, in every thread, when the wait for it gave up (nothing was taken). Every
// thread of the group calls it with the same arguments.
template <Scope S>
__device__ __forceinline__ uint64_t channel_pop(const nvshmem_rs_channel &ch, void *dst,
                                                uint64_t capacity) {
    using namespace channel_detail;
    Arrival a{0, 0, {0, 0}};
    if (rank<S>() == 0) a = wait_arrival(ch);
    a = broadcast<S>(a);
    if (a.seq == CHANNEL_TIMED_OUT) return CHANNEL_TIMED_OUT;
    const uint64_t bytes = ready_bytes(a.word), limit = bytes < capacity ? bytes : capacity;
    if (!ready_ll(a.word)) copy_from_slot<S>((char *)dst, channel_slot(ch, a.seq), limit);
    else if (!ll_load<S>(ch, a, bytes, (char *)dst, limit)) return CHANNEL_TIMED_OUT;
    sync<S>();
    if (rank<S>() == 0) channel_release_copied(ch, a.seq, bytes);
    sync<S>();
    return bytes;
}

// Pop in place: wait for the next message and return where it lies (in this PE's slot, valid
// until channel_release_peeked); its length in *bytes. A large message is read where the
// producer put it, with no copy; a small one, which came as LL lines, is first copied into the
// slot by the group. Read it with __ldcg or volatile loads (the slot is rewritten by the
// producer after the release). Every thread of the group calls it. Null, with *bytes CHANNEL_TIMED_OUT, when the wait gave up: then there is nothing to
// release.
template <Scope S>
__device__ __forceinline__ const void *channel_peek(const nvshmem_rs_channel &ch, uint64_t *bytes) {
    using namespace channel_detail;
    Arrival a{0, 0, {0, 0}};
    if (rank<S>() == 0) a = wait_arrival(ch);
    a = broadcast<S>(a);
    *bytes = a.seq == CHANNEL_TIMED_OUT ? CHANNEL_TIMED_OUT : ready_bytes(a.word);
    if (a.seq == CHANNEL_TIMED_OUT) return nullptr;
    // A message that came as LL lines is copied into its slot, to be read in place.
    char *slot = channel_slot(ch, a.seq);
    if (ready_ll(a.word)) {
        if (!ll_load<S>(ch, a, *bytes, slot, *bytes)) {
            *bytes = CHANNEL_TIMED_OUT;
            return nullptr;
        }
        sync<S>();
    }
    return slot;
}

// Give back the slot of the message returned by the last channel_peek (one that returned a
// message).
template <Scope S>
__device__ __forceinline__ void channel_release_peeked(const nvshmem_rs_channel &ch) {
    using namespace channel_detail;
    sync<S>();
    if (rank<S>() == 0) {
        const uint64_t seq = *(volatile uint64_t *)&ch.words[CHANNEL_RECEIVED];
        channel_release(ch, seq, ready_bytes(ld_acquire_sys(&ch.ready[seq % ch.depth])));
    }
    sync<S>();
}

// Whether a message is waiting (no wait; any thread of the consumer).
__device__ __forceinline__ bool channel_poll(const nvshmem_rs_channel &ch) {
    const uint64_t seq = *(volatile uint64_t *)&ch.words[CHANNEL_RECEIVED];
    return (uint32_t)(channel_detail::ld_acquire_sys(&ch.ready[seq % ch.depth]) >> 32) ==
           channel_detail::ready_tag(seq);
}

// The scopes under their usual names.
__device__ __forceinline__ bool channel_push_thread(const nvshmem_rs_channel &ch, const void *src, uint64_t bytes) {
    return channel_push<Scope::Thread>(ch, src, bytes);
}
__device__ __forceinline__ bool channel_push_warp(const nvshmem_rs_channel &ch, const void *src, uint64_t bytes) {
    return channel_push<Scope::Warp>(ch, src, bytes);
}
__device__ __forceinline__ bool channel_push_block(const nvshmem_rs_channel &ch, const void *src, uint64_t bytes) {
    return channel_push<Scope::Block>(ch, src, bytes);
}
__device__ __forceinline__ uint64_t channel_pop_thread(const nvshmem_rs_channel &ch, void *dst, uint64_t capacity) {
    return channel_pop<Scope::Thread>(ch, dst, capacity);
}
__device__ __forceinline__ uint64_t channel_pop_warp(const nvshmem_rs_channel &ch, void *dst, uint64_t capacity) {
    return channel_pop<Scope::Warp>(ch, dst, capacity);
}
__device__ __forceinline__ uint64_t channel_pop_block(const nvshmem_rs_channel &ch, void *dst, uint64_t capacity) {
    return channel_pop<Scope::Block>(ch, dst, capacity);
}

}  // namespace nvshmem_rs

#endif
