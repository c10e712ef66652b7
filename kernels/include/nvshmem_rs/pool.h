// The layout of a page pool as kernels see it: what `PagePool::handle()` passes to a kernel by
// value, and what the device functions of nvshmem_rs/pool.cuh take. Plain C, read by nvcc and
// by bindgen (for the Rust side), so both agree on it.
//
// A page id is 64 bits: the page's generation in the high 20 bits, the owning PE in the next
// 16, and the page's index on that PE in the low 28:
//   (generation << 44) | (pe << 28) | index
// The generation counts the page's frees (modulo 2^20): an id kept after its page was freed
// and allocated again differs from the new allocation's, so freeing it, or asking whether it
// is allocated, finds it stale. It repeats after 2^20 = 1048576 frees of one page.
// POOL_NO_PAGE (all ones) is no page: its PE field is 0xFFFF, and a pool spans at most
// POOL_MAX_PES = 0xFFFF PEs (numbered below it).
#ifndef NVSHMEM_RS_POOL_H
#define NVSHMEM_RS_POOL_H

#include <stdint.h>

// No page: what an allocation returns when the PE is full, and an empty page-table entry.
#define POOL_NO_PAGE 0xFFFFFFFFFFFFFFFFull
// Pages start on this boundary and hold a multiple of it (vector copies).
#define POOL_PAGE_ALIGN 16
// Pages one bitmap word tracks.
#define POOL_WORD_PAGES 64
// Bits of a page id: the index (low), the PE, the generation (high).
#define POOL_INDEX_BITS 28
#define POOL_PE_BITS 16
#define POOL_GENERATION_BITS 20
// Pages per PE at most (2^28): every index fits its field.
#define POOL_MAX_PAGES 268435456
// PEs a pool spans at most (2^16 - 1): the all-ones PE field is no PE.
#define POOL_MAX_PES 65535

/// A symmetric region of pages_per_pe pages of page_bytes on every PE, the bitmap of the
/// pages taken, every page's state (its generation, and whether it is allocated), and a page
/// table of table_len entries on every PE.
typedef struct nvshmem_rs_pool {
    /// Symmetric, pages_per_pe * page_bytes: page i of PE p is pages + i * page_bytes on PE p.
    char *pages;
    /// Symmetric, ceil(pages_per_pe / 64) words: on PE p, bit i % 64 of word i / 64 is set
    /// while page i of PE p is allocated, and from the start of its free until the free
    /// ends. Bits past pages_per_pe in the last word stay set. Changed only by NVSHMEM
    /// atomics (fetch_or to claim a page, fetch_and to give it back): allocations search it.
    uint64_t *bitmap;
    /// Symmetric, pages_per_pe words: on PE p, word i is page i's state,
    /// (generation << 1) | allocated. An allocation that claimed the page's bit sets
    /// `allocated` (fetch_or, which returns the generation for the id); a free swaps
    /// (g << 1) | 1 for ((g + 1) mod 2^20) << 1 (compare_swap, which fails for a stale id),
    /// then clears the bit. An id of generation g is allocated while the word is (g << 1) | 1.
    uint64_t *states;
    /// Symmetric, table_len words: page ids (POOL_NO_PAGE when empty), read and written with
    /// NVSHMEM atomics, what PEs publish pages through.
    uint64_t *table;
    /// Bytes of a page, a multiple of POOL_PAGE_ALIGN.
    uint64_t page_bytes;
    /// Pages each PE holds, at most POOL_MAX_PAGES.
    uint32_t pages_per_pe;
    /// Entries of each PE's page table.
    uint32_t table_len;
    /// This PE.
    int32_t my_pe;
    /// The number of PEs, at most POOL_MAX_PES.
    int32_t n_pes;
} nvshmem_rs_pool;

#endif
