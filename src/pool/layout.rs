//! What a pool's layout and arguments must satisfy, without a GPU: page ids and their
//! packing, the bitmap's words, size and id checks, and how a copy is cut into blocks.

use crate::abi;
use crate::error::{Error, Result};
use std::fmt;

/// A page of a [`PagePool`](super::PagePool): the PE that holds it and its index there.
///
/// Kernels see it as one 64-bit value, `(pe << 32) | index` ([`to_raw`](Self::to_raw)); the
/// all-ones value is no page ([`NO_PAGE`]).
///
/// ```
/// use nvshmem::pool::PageId;
/// let id = PageId::new(3, 17);
/// assert_eq!(id.to_raw(), (3 << 32) | 17);
/// assert_eq!(PageId::from_raw(id.to_raw()), Some(id));
/// assert_eq!(PageId::from_raw(nvshmem::pool::NO_PAGE), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId {
    /// The PE whose memory holds the page.
    pub pe: u32,
    /// The page's index among that PE's pages.
    pub index: u32,
}

/// The raw id of no page: what the page table holds where nothing was published, and what a
/// kernel's allocation returns when the PE is full.
// bindgen reads the all-ones literal as -1: widened with its sign, it is all ones again.
pub const NO_PAGE: u64 = abi::POOL_NO_PAGE as u64;

impl PageId {
    /// Page `index` of PE `pe`.
    pub const fn new(pe: u32, index: u32) -> Self {
        PageId { pe, index }
    }

    /// The 64-bit id kernels take: `(pe << 32) | index`.
    pub const fn to_raw(self) -> u64 {
        ((self.pe as u64) << 32) | self.index as u64
    }

    /// The page of a raw id, or `None` for [`NO_PAGE`].
    pub const fn from_raw(raw: u64) -> Option<Self> {
        if raw == NO_PAGE {
            None
        } else {
            Some(PageId {
                pe: (raw >> 32) as u32,
                index: raw as u32,
            })
        }
    }
}

impl fmt::Display for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "page {} of PE {}", self.index, self.pe)
    }
}

/// Words of a bitmap of `pages` bits.
pub(crate) fn bitmap_words(pages: usize) -> usize {
    pages.div_ceil(abi::POOL_WORD_PAGES as usize)
}

/// A bitmap with no page allocated: the bits past `pages` in the last word set, so that no
/// allocation ever takes them.
pub(crate) fn initial_bitmap(pages: usize) -> Vec<u64> {
    let mut words = vec![0u64; bitmap_words(pages)];
    let used = pages % abi::POOL_WORD_PAGES as usize;
    if let (Some(last), true) = (words.last_mut(), used != 0) {
        *last = !0u64 << used;
    }
    words
}

/// Allocated pages in a PE's bitmap of `pages` bits (the padding bits do not count).
pub(crate) fn pages_in_use(words: &[u64], pages: usize) -> usize {
    let set: usize = words.iter().map(|w| w.count_ones() as usize).sum();
    let padding = words.len() * abi::POOL_WORD_PAGES as usize - pages;
    set - padding
}

/// Check a pool's sizes: at least one page of at least `POOL_PAGE_ALIGN` bytes, a multiple
/// of it; indices, entries and PEs that fit the 32 bits kernels give them; a region whose size
/// fits `usize`. Returns the region's bytes.
pub(crate) fn check_sizes(
    pages_per_pe: usize,
    page_bytes: usize,
    table_len: usize,
    n_pes: usize,
) -> Result<usize> {
    let align = abi::POOL_PAGE_ALIGN as usize;
    let bad = |msg: String| Err(Error::InvalidArgument(msg));
    if pages_per_pe == 0 || pages_per_pe > u32::MAX as usize {
        return bad(format!(
            "a page pool of {pages_per_pe} pages per PE: give it 1 to {} pages",
            u32::MAX
        ));
    }
    if page_bytes == 0 || !page_bytes.is_multiple_of(align) {
        return bad(format!(
            "a page pool with pages of {page_bytes} bytes: a page must hold a positive multiple \
             of {align} bytes"
        ));
    }
    if table_len > u32::MAX as usize {
        return bad(format!(
            "a page table of {table_len} entries: at most {} fit",
            u32::MAX
        ));
    }
    if n_pes > i32::MAX as usize {
        return bad(format!(
            "a page pool over {n_pes} PEs: at most {}",
            i32::MAX
        ));
    }
    pages_per_pe.checked_mul(page_bytes).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "a page pool of {pages_per_pe} pages of {page_bytes} bytes overflows usize"
        ))
    })
}

/// Check that `id` names a page of a pool over `n_pes` PEs of `pages_per_pe` pages each.
pub(crate) fn check_id(id: PageId, n_pes: usize, pages_per_pe: usize) -> Result<()> {
    if id.pe as usize >= n_pes {
        return Err(Error::PeOutOfRange {
            pe: id.pe as usize,
            n_pes,
        });
    }
    if id.index as usize >= pages_per_pe {
        return Err(Error::PageOutOfRange {
            pe: id.pe as usize,
            index: id.index as usize,
            pages_per_pe,
        });
    }
    Ok(())
}

/// Check that local memory of `len` elements of `elem_bytes` holds `n_pages` pages of
/// `page_bytes` exactly.
pub(crate) fn check_pages_len(
    what: &'static str,
    elem_bytes: usize,
    len: usize,
    n_pages: usize,
    page_bytes: usize,
) -> Result<()> {
    if !page_bytes.is_multiple_of(elem_bytes) {
        return Err(Error::InvalidArgument(format!(
            "{what}: pages of {page_bytes} bytes are not a whole number of {elem_bytes}-byte \
             elements; use bytes (u8) or an element that divides the page"
        )));
    }
    let expected = n_pages
        .checked_mul(page_bytes / elem_bytes)
        .ok_or_else(|| Error::InvalidArgument(format!("{what}: {n_pages} pages overflow usize")))?;
    if len != expected {
        return Err(Error::Length {
            what,
            expected,
            got: len,
        });
    }
    Ok(())
}

/// Threads of a copy kernel's block, and of the small kernels.
pub(crate) const THREADS: u32 = 256;

/// Blocks a copy kernel launches at most; more pieces are taken in turn.
pub(crate) const MAX_COPY_BLOCKS: u64 = 65_535;

/// How a gather or scatter of `n_pages` pages of `page_bytes` is cut: pieces of
/// `chunk_bytes` (a multiple of 16), one block each. Small copies take 4 KiB pieces (one
/// vector per thread, the most blocks at once: latency); large ones 16 KiB (four vectors in
/// flight per thread, fewer blocks to schedule: bandwidth). Returns `(chunk_bytes, blocks)`.
pub(crate) fn copy_grid(n_pages: usize, page_bytes: usize) -> (u64, u32) {
    const SMALL: u64 = 1 << 20;
    let total = n_pages as u64 * page_bytes as u64;
    let piece: u64 = if total <= SMALL { 4 << 10 } else { 16 << 10 };
    let chunk = piece.min(page_bytes as u64).max(1);
    let blocks = (n_pages as u64 * (page_bytes as u64).div_ceil(chunk)).clamp(1, MAX_COPY_BLOCKS);
    (chunk, blocks as u32)
}

/// Blocks of `THREADS` threads for `n` threads of work (at least one block).
pub(crate) fn blocks_for(n: usize) -> u32 {
    n.div_ceil(THREADS as usize).max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `pool_alloc` does to one PE's bitmap, on the CPU: from word `start`, the lowest
    /// clear bit of the first word that has one.
    fn claim(words: &mut [u64], start: usize) -> Option<usize> {
        for k in 0..words.len() {
            let w = (start + k) % words.len();
            if words[w] != !0 {
                let bit = (!words[w]).trailing_zeros() as usize;
                words[w] |= 1 << bit;
                return Some(w * 64 + bit);
            }
        }
        None
    }

    #[test]
    fn page_ids_pack_pe_high_and_index_low() {
        let id = PageId::new(7, 0xdead_beef);
        assert_eq!(id.to_raw(), 0x0000_0007_dead_beef);
        assert_eq!(PageId::from_raw(0x0000_0007_dead_beef), Some(id));
        assert_eq!(PageId::from_raw(NO_PAGE), None);
        assert_eq!(NO_PAGE, u64::MAX);
        // The largest real id is not the sentinel.
        let last = PageId::new(u32::MAX, u32::MAX - 1);
        assert_eq!(PageId::from_raw(last.to_raw()), Some(last));
        assert_eq!(id.to_string(), "page 3735928559 of PE 7");
        assert!(PageId::new(0, 5) < PageId::new(1, 0));
    }

    #[test]
    fn bitmaps_mark_the_padding_as_taken() {
        assert_eq!(bitmap_words(1), 1);
        assert_eq!(bitmap_words(64), 1);
        assert_eq!(bitmap_words(65), 2);
        assert_eq!(initial_bitmap(64), vec![0]);
        assert_eq!(initial_bitmap(3), vec![!0u64 << 3]);
        assert_eq!(initial_bitmap(70), vec![0, !0u64 << 6]);
        for pages in [1, 3, 63, 64, 65, 130, 1000] {
            let words = initial_bitmap(pages);
            assert_eq!(pages_in_use(&words, pages), 0, "{pages}");
        }
        let mut words = initial_bitmap(70);
        words[0] |= 0b101;
        words[1] |= 1;
        assert_eq!(pages_in_use(&words, 70), 3);
    }

    #[test]
    fn the_allocation_search_hands_out_every_page_once_and_no_padding() {
        for pages in [1, 5, 64, 65, 200] {
            for start in [0, 1, 3] {
                let mut words = initial_bitmap(pages);
                let mut got = Vec::new();
                let first = start % words.len();
                while let Some(p) = claim(&mut words, first) {
                    got.push(p);
                }
                got.sort_unstable();
                assert_eq!(got, (0..pages).collect::<Vec<_>>(), "{pages} from {start}");
                assert_eq!(pages_in_use(&words, pages), pages);
                // Freeing one makes exactly that one available again.
                let freed = 2.min(pages - 1);
                words[freed / 64] &= !(1u64 << (freed % 64));
                assert_eq!(claim(&mut words, 0), Some(freed));
                assert_eq!(claim(&mut words, 0), None);
            }
        }
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(check_sizes(16, 4096, 8, 2).unwrap(), 65536);
        assert!(check_sizes(1, 16, 0, 1).is_ok());
        for (pages, bytes, table) in [
            (0, 4096, 1),
            (16, 0, 1),
            (16, 4100, 1),
            (16, 8, 1),
            (u32::MAX as usize + 1, 16, 1),
            (16, 16, u32::MAX as usize + 1),
            (u32::MAX as usize, usize::MAX - 15, 1),
        ] {
            let e = check_sizes(pages, bytes, table, 2).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument(_)),
                "{pages} {bytes} {table}"
            );
        }
        let text = check_sizes(16, 4100, 1, 2).unwrap_err().to_string();
        assert!(text.contains("multiple of 16"), "{text}");
    }

    #[test]
    fn ids_are_checked_against_the_pes_and_pages() {
        assert!(check_id(PageId::new(1, 9), 2, 10).is_ok());
        assert!(matches!(
            check_id(PageId::new(2, 0), 2, 10),
            Err(Error::PeOutOfRange { pe: 2, n_pes: 2 })
        ));
        assert!(matches!(
            check_id(PageId::new(1, 10), 2, 10),
            Err(Error::PageOutOfRange {
                pe: 1,
                index: 10,
                pages_per_pe: 10
            })
        ));
        let text = check_id(PageId::new(0, 10), 2, 10).unwrap_err().to_string();
        assert!(
            text.contains("page 10 of PE 0") && text.contains("10 pages"),
            "{text}"
        );
    }

    #[test]
    fn local_memory_must_hold_the_pages_exactly() {
        assert!(check_pages_len("dst", 1, 8192, 2, 4096).is_ok());
        assert!(check_pages_len("dst", 4, 2048, 2, 4096).is_ok());
        assert!(matches!(
            check_pages_len("dst", 1, 8191, 2, 4096),
            Err(Error::Length {
                expected: 8192,
                got: 8191,
                ..
            })
        ));
        assert!(check_pages_len("dst", 8, 6, 1, 48).is_ok());
        assert!(matches!(
            check_pages_len("dst", 32, 1, 1, 48),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn copies_are_cut_into_pieces_one_block_each() {
        // One 16 KiB page: four 4 KiB pieces.
        assert_eq!(copy_grid(1, 16 << 10), (4 << 10, 4));
        // 256 pages of 64 KiB (16 MiB): 16 KiB pieces, 1024 blocks.
        assert_eq!(copy_grid(256, 64 << 10), (16 << 10, 1024));
        // Pages smaller than a piece are copied whole, one block each.
        assert_eq!(copy_grid(3, 1040), (1040, 3));
        // A page that is not a multiple of the piece gets a shorter last piece.
        assert_eq!(copy_grid(1, 4096 + 16), (4096, 2));
        // Huge copies are capped; the kernel takes the pieces in turn.
        assert_eq!(copy_grid(1 << 20, 64 << 10).1 as u64, MAX_COPY_BLOCKS);
        assert_eq!(copy_grid(0, 4096).1, 1);
        assert_eq!(blocks_for(0), 1);
        assert_eq!(blocks_for(257), 2);
    }
}
