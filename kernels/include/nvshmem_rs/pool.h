// The layout of a page pool as kernels see it: what `PagePool::handle()` passes to a kernel by
// value, and what the device functions of nvshmem_rs/pool.cuh take. Plain C, read by nvcc and
// by bindgen (for the Rust side), so both agree on it.
//
// A page id is 64 bits: the owning PE in the high 32 bits, the page's index on that PE in the
// low 32 (`(pe << 32) | index`). POOL_NO_PAGE (all ones) is no page: no PE has that number.
#ifndef NVSHMEM_RS_POOL_H
#define NVSHMEM_RS_POOL_H

#include <stdint.h>

// No page: what an allocation returns when the PE is full, and an empty page-table entry.
#define POOL_NO_PAGE 0xFFFFFFFFFFFFFFFFull
// Pages start on this boundary and hold a multiple of it (vector copies).
#define POOL_PAGE_ALIGN 16
// Pages one bitmap word tracks.
#define POOL_WORD_PAGES 64

/// A symmetric region of pages_per_pe pages of page_bytes on every PE, the bitmap that says
/// which are allocated, and a page table of table_len entries on every PE.
typedef struct nvshmem_rs_pool {
    /// Symmetric, pages_per_pe * page_bytes: page i of PE p is pages + i * page_bytes on PE p.
    char *pages;
    /// Symmetric, ceil(pages_per_pe / 64) words: on PE p, bit i % 64 of word i / 64 is set
    /// while page i of PE p is allocated. Bits past pages_per_pe in the last word stay set.
    /// Changed only by NVSHMEM atomics (fetch_or to allocate, fetch_and to free).
    uint64_t *bitmap;
    /// Symmetric, table_len words: page ids (POOL_NO_PAGE when empty), read and written with
    /// NVSHMEM atomics, what PEs publish pages through.
    uint64_t *table;
    /// Bytes of a page, a multiple of POOL_PAGE_ALIGN.
    uint64_t page_bytes;
    /// Pages each PE holds.
    uint32_t pages_per_pe;
    /// Entries of each PE's page table.
    uint32_t table_len;
    /// This PE.
    int32_t my_pe;
    /// The number of PEs.
    int32_t n_pes;
} nvshmem_rs_pool;

#endif
