// Definitions the kernels and the Rust side share. nvcc reads this header through the kernels
// that include it, and bindgen turns it into Rust for src/abi.rs (build.rs), so a value
// changed here changes on both sides. Plain C: integer constants, enums and structs only.
#ifndef NVSHMEM_RS_ABI_H
#define NVSHMEM_RS_ABI_H

#include <stdint.h>

// Structures users' kernels also see (kernels/include, on their include path).
#include "nvshmem_rs/channel.h"
#include "nvshmem_rs/pool.h"
#include "nvshmem_rs/map.h"

// ---- our collectives' workspace (src/collectives, kernels/collectives) -------------------

// Blocks a call launches at most: the epoch has one copy per block index (Ctrl), and every
// flag set one word per block index and PE.
#define COLL_MAX_BLOCKS 512
// PEs our collectives take.
#define COLL_MAX_PES 64
// Flag sets (one-shot data, two-shot start and end, bandwidth rounds, low-latency broadcast
// acknowledgements), each COLL_MAX_BLOCKS x n_pes words.
#define COLL_FLAG_SETS 5
// PEs whose staging addresses fit the by-value table of the kernels that take one (Peers).
#define LL_MAX_PES 16
// Threads per block at most (the kernels' __launch_bounds__).
#define COLL_MAX_THREADS 512
// Vectors each thread of the two-shot reduction and the bandwidth all-gather handles at once.
#define COLL_UNROLL 4
// The word the sentinel receive buffers are filled with: no pushed word carries it (a sender
// turns it into another NaN), so a reader polls until no word of a vector is this.
#define COLL_SENTINEL 0xFFFFFFFFu

// Bits of a bandwidth all-reduce's flag value that count its rounds: the value is
// (epoch << COLL_ROUND_BITS) | (round + 1), so values grow over rounds and calls for 2^44
// calls (a year at one call per microsecond), and a call has fewer than 2^20 - 1 rounds.
#define COLL_ROUND_BITS 20

// The signature (kernels/collectives/call.cuh) no call has: the closing barrier of a
// copy-engine call sends it from a PE that could not queue all its copies.
#define COLL_SIG_FAILED 0xFFFFu

// Where a wait that ran out of time was (Fault.site).
enum FaultSite {
    FAULT_FLAGS = 1,      // a handshake flag (one-shot, two-shot, all-gather barriers)
    FAULT_ROUND = 2,      // a round flag (bandwidth all-reduce, relay broadcast)
    FAULT_LINE = 3,       // a low-latency line
    FAULT_SENTINEL = 4,   // a sentinel vector
    FAULT_COUNTS = 5,     // not a wait: an all_to_all_v whose counts disagree (sent, expected)
    FAULT_MISMATCH = 6,   // not a wait: a peer's call has another signature (sent: the peer's, expected: ours)
};

// The first wait of a call that ran out of time, written by the kernel into host memory the
// GPU can map: the host reads it without waiting for the stream. `raised` is written last.
typedef struct Fault {
    unsigned int raised;
    int site;            // FaultSite
    int pe;              // the PE waited for
    int block;
    unsigned long long epoch;
    unsigned long long waited_ns;
    unsigned long long sent;      // FAULT_COUNTS: elements the sender sends to the receiver
    unsigned long long expected;  // and what the receiver expects from it (FAULT_MISMATCH: signatures)
    unsigned int sending;         // FAULT_COUNTS: whether this PE is the sender (pe: the receiver)
} Fault;

// The team a Collectives runs over, written once by the host: this PE's number in it, its
// size, and its members as world PEs (member p is world PE start + p * stride: every team
// NVSHMEM makes is strided). Kernels number PEs in the team; only nvshmem_ptr sees world PEs.
typedef struct CollTeam {
    int me;
    int npes;
    int start;
    int stride;
} CollTeam;

// The epoch of this PE's calls, one copy per block index: block b reads copy b when it
// starts and, when it ends, writes the new epoch into copies b, b + gridDim.x, ... Blocks of
// one call touch disjoint copies, so no atomics or fences are needed, and after every call
// all copies agree whatever the grid size of the next call. Kernel completion publishes the
// stores to the next call. After the epochs, what bounds every wait: how long it may last
// (0: no bound) and where a wait that ran out of time says so, then the team (the host
// writes these once), and `aborted`, set (for good) by the first wait of this PE that gave
// up: it claims the fault record, and every later wait polls it (device memory) to stop at
// once.
typedef struct Ctrl {
    unsigned long long epoch[COLL_MAX_BLOCKS];
    unsigned long long timeout_ns;
    Fault *fault;
    CollTeam team;
    unsigned int aborted;
} Ctrl;

// Where a buffer (the staging area, or the sentinel buffers) lives on every PE as mapped
// here, passed by value so that kernels read it from the constant bank instead of NVSHMEM's
// device state.
typedef struct Peers {
    char *slot[LL_MAX_PES];  // PE p's base as mapped here
    int me;
    int npes;
} Peers;

// An all_to_all_v's counts on this PE, in elements, passed by value: send[q] to PE q (packed
// in PE order in src), recv[p] from PE p (packed in PE order in dst).
typedef struct Counts {
    unsigned long long send[COLL_MAX_PES];
    unsigned long long recv[COLL_MAX_PES];
} Counts;

// How a bandwidth all-reduce cuts its parts into chunks.
typedef struct BandwidthPlan {
    unsigned int chunk_vecs;  // 16-byte vectors per chunk, at most
    unsigned int slots;       // chunk slots per block and source, at least 2
} BandwidthPlan;

// ---- the grouped all-reduce (src/collectives/group.rs, kernels/collectives/group.cuh) ----

// Buffers one launch of a grouped all-reduce takes.
#define COLL_GROUP_MAX 32

// One buffer of a grouped all-reduce: n elements from src into dst (device addresses).
// `off`: where its input sits in a one-shot staging slot (bytes, a multiple of 16);
// `before`: the 16-byte vectors of the buffers before it, so that the grid takes the
// buffers end to end instead of every small one on its first threads.
typedef struct GroupEntry {
    unsigned long long src;
    unsigned long long dst;
    unsigned long long n;
    unsigned long long off;
    unsigned long long before;
} GroupEntry;

// The buffers of one launch, passed by value.
typedef struct Group {
    GroupEntry entry[COLL_GROUP_MAX];
    unsigned int count;
} Group;

// ---- the tensor-parallel layers' fused kernels (src/tp, kernels/tp) ------------------------

// The weight and shape of a fused decode product y (m × n) = x (m × k) · wᵀ, passed by value
// after the parameters every collective takes.
typedef struct DecodeLinear {
    unsigned long long w;        // device address of w, n × k row-major bf16
    unsigned long long m;        // tokens, 1 to FUSED_DECODE_MAX_M
    unsigned long long n;
    unsigned long long k;
} DecodeLinear;

// The residual and weight of an all-reduce + RMSNorm (src/tp/norm.rs, kernels/tp/rmsnorm.cuh),
// passed by value after the parameters every collective takes.
typedef struct RmsNorm {
    unsigned long long residual;  // device address, tokens × hidden bf16, read and written
    unsigned long long weight;    // device address, hidden bf16
    unsigned long long hidden;    // elements per token, a multiple of 4
    float eps;
} RmsNorm;

// ---- the host atomics' helper (src/atomic.rs, kernels/atomics.cu) ------------------------

// Operations of host_amo.
enum AmoOp {
    AMO_FETCH = 0,
    AMO_SET = 1,
    AMO_SWAP = 2,
    AMO_COMPARE_SWAP = 3,
    AMO_FETCH_ADD = 4,
    AMO_ADD = 5,
    AMO_FETCH_INC = 6,
    AMO_INC = 7,
    AMO_FETCH_AND = 8,
    AMO_FETCH_OR = 9,
    AMO_FETCH_XOR = 10,
};

// ---- element types (DataType in src/element.rs) ------------------------------------------
enum TypeTag {
    TYPE_I8 = 0,
    TYPE_I16 = 1,
    TYPE_I32 = 2,
    TYPE_I64 = 3,
    TYPE_U8 = 4,
    TYPE_U16 = 5,
    TYPE_U32 = 6,
    TYPE_U64 = 7,
    TYPE_F32 = 8,
    TYPE_F64 = 9,
    TYPE_F16 = 10,
    TYPE_BF16 = 11,
};

#endif
