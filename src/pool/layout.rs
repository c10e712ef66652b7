//! What a pool's layout and arguments must satisfy, without a GPU: page ids and their
//! packing, the bitmap's words, size and id checks, and how a copy is cut into blocks.

use crate::abi;
use crate::error::{Error, Result};
use std::fmt;

/// A page of a [`PagePool`](super::PagePool): the PE that holds it, its index there, and the
/// generation of the allocation it names.
///
/// A page's generation counts its frees: the first allocation of a page is generation 0, and
/// every free moves the page to the next, modulo [`GENERATIONS`](Self::GENERATIONS). An id
/// kept after its page was freed (and maybe allocated again) is stale: freeing it, or a
/// checked [`gather`](super::PagePool::gather) of it, is
/// [`Error::PageNotAllocated`], and [`is_allocated`](super::PagePool::is_allocated) says
/// `false`, without touching the page's new allocation. A generation repeats after
/// `GENERATIONS` (2^20 = 1 048 576) frees of one page: an id that old reads as current.
///
/// Kernels see an id as one 64-bit value ([`to_raw`](Self::to_raw)), from high bits to low:
/// the generation (20 bits), the PE (16), the index (28),
/// `(generation << 44) | (pe << 28) | index`. The all-ones value is no page ([`NO_PAGE`]):
/// its PE field is `0xFFFF`, and PEs are numbered below [`MAX_PES`](Self::MAX_PES).
///
/// ```
/// use nvshmem::pool::{PageId, NO_PAGE};
/// let id = PageId::new(3, 17);
/// assert_eq!(id.generation, 0);
/// assert_eq!(id.to_raw(), (3 << 28) | 17);
/// let later = id.with_generation(2);
/// assert_eq!(later.to_raw(), (2 << 44) | (3 << 28) | 17);
/// assert_eq!(PageId::from_raw(later.to_raw()), Some(later));
/// assert_eq!(PageId::from_raw(NO_PAGE), None);
/// assert_eq!(later.to_string(), "page 17 of PE 3 (generation 2)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId {
    /// The PE whose memory holds the page.
    pub pe: u32,
    /// The page's index among that PE's pages.
    pub index: u32,
    /// The page's generation when it was allocated: how many times it had been freed before,
    /// modulo [`GENERATIONS`](Self::GENERATIONS).
    pub generation: u32,
}

/// The raw id of no page: what the page table holds where nothing was published, and what a
/// kernel's allocation returns when the PE is full.
// bindgen reads the all-ones literal as -1: widened with its sign, it is all ones again.
pub const NO_PAGE: u64 = abi::POOL_NO_PAGE as u64;

const INDEX_BITS: u32 = abi::POOL_INDEX_BITS;
const PE_BITS: u32 = abi::POOL_PE_BITS;
const GENERATION_BITS: u32 = abi::POOL_GENERATION_BITS;
/// Where the PE and generation fields start in a raw id.
const PE_SHIFT: u32 = INDEX_BITS;
const GENERATION_SHIFT: u32 = INDEX_BITS + PE_BITS;

const _: () = {
    assert!(INDEX_BITS + PE_BITS + GENERATION_BITS == 64);
    assert!(abi::POOL_MAX_PAGES as u64 == 1 << INDEX_BITS);
    // The all-ones PE field is no PE, so NO_PAGE is never an id.
    assert!(abi::POOL_MAX_PES as u64 == (1 << PE_BITS) - 1);
};

impl PageId {
    /// Pages a PE of a pool holds at most (2^28): indices fit 28 bits.
    pub const MAX_PAGES_PER_PE: usize = abi::POOL_MAX_PAGES as usize;
    /// PEs a pool spans at most (65 535): PE numbers fit 16 bits, all ones excepted.
    pub const MAX_PES: usize = abi::POOL_MAX_PES as usize;
    /// Generations a page goes through before one repeats (2^20).
    pub const GENERATIONS: u32 = 1 << GENERATION_BITS;

    /// Page `index` of PE `pe` in generation 0: the id of its first allocation (copies
    /// that take raw ids in device memory do not read the generation).
    pub const fn new(pe: u32, index: u32) -> Self {
        PageId {
            pe,
            index,
            generation: 0,
        }
    }

    /// The same page in generation `generation`.
    pub const fn with_generation(self, generation: u32) -> Self {
        PageId { generation, ..self }
    }

    /// Whether the fields fit a raw id: a PE below [`MAX_PES`](Self::MAX_PES), an index
    /// below [`MAX_PAGES_PER_PE`](Self::MAX_PAGES_PER_PE), a generation below
    /// [`GENERATIONS`](Self::GENERATIONS). Every page of every pool fits.
    pub const fn fits(self) -> bool {
        (self.pe as usize) < Self::MAX_PES
            && (self.index as usize) < Self::MAX_PAGES_PER_PE
            && self.generation < Self::GENERATIONS
    }

    /// The 64-bit id kernels take, `(generation << 44) | (pe << 28) | index`; [`NO_PAGE`]
    /// for an id that does not [`fit`](Self::fits), which names no page of any pool (the
    /// pool's calls that take a `PageId` refuse one).
    pub const fn to_raw(self) -> u64 {
        if !self.fits() {
            return NO_PAGE;
        }
        ((self.generation as u64) << GENERATION_SHIFT)
            | ((self.pe as u64) << PE_SHIFT)
            | self.index as u64
    }

    /// The page of a raw id, or `None` for [`NO_PAGE`] (and any raw id whose PE field is all
    /// ones: no PE has that number).
    pub const fn from_raw(raw: u64) -> Option<Self> {
        let pe = ((raw >> PE_SHIFT) & ((1 << PE_BITS) - 1)) as u32;
        if pe as usize == Self::MAX_PES {
            return None;
        }
        Some(PageId {
            pe,
            index: (raw & ((1 << INDEX_BITS) - 1)) as u32,
            generation: (raw >> GENERATION_SHIFT) as u32,
        })
    }
}

impl fmt::Display for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "page {} of PE {} (generation {})",
            self.index, self.pe, self.generation
        )
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
/// of it; indices and PEs that fit a page id's fields; entries that fit the 32 bits kernels
/// give them; a region whose size fits `usize`. Returns the region's bytes.
pub(crate) fn check_sizes(
    pages_per_pe: usize,
    page_bytes: usize,
    table_len: usize,
    n_pes: usize,
) -> Result<usize> {
    let align = abi::POOL_PAGE_ALIGN as usize;
    let bad = |msg: String| Err(Error::InvalidArgument(msg));
    if pages_per_pe == 0 || pages_per_pe > PageId::MAX_PAGES_PER_PE {
        return bad(format!(
            "a page pool of {pages_per_pe} pages per PE: give it 1 to {} pages (page ids hold \
             indices in {INDEX_BITS} bits); for more memory per PE, take larger pages",
            PageId::MAX_PAGES_PER_PE
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
    if n_pes > PageId::MAX_PES {
        return bad(format!(
            "a page pool over {n_pes} PEs: a pool spans at most {} PEs (page ids hold PE \
             numbers in {PE_BITS} bits, all ones excepted)",
            PageId::MAX_PES
        ));
    }
    pages_per_pe.checked_mul(page_bytes).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "a page pool of {pages_per_pe} pages of {page_bytes} bytes overflows usize"
        ))
    })
}

/// Check that `id` names a page of a pool over `n_pes` PEs of `pages_per_pe` pages each, in
/// a generation that exists (so that it packs to itself, not to [`NO_PAGE`]).
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
    if id.generation >= PageId::GENERATIONS {
        return Err(Error::InvalidArgument(format!(
            "{id}: generations go from 0 to {} (then start again); use ids that \
             PagePool::alloc returned",
            PageId::GENERATIONS - 1
        )));
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

    /// What `pool_alloc` does to one PE's bitmap, on the CPU: from word `start`, a probe that
    /// sets bit `guess` (claiming it if it was clear), else the lowest clear bit of the first
    /// word that has one.
    fn claim(words: &mut [u64], start: usize, guess: u32) -> Option<usize> {
        for k in 0..words.len() {
            let w = (start + k) % words.len();
            let old = words[w];
            words[w] |= 1 << guess;
            if old & (1 << guess) == 0 {
                return Some(w * 64 + guess as usize);
            }
            if old != !0 {
                let bit = (!old).trailing_zeros() as usize;
                words[w] |= 1 << bit;
                return Some(w * 64 + bit);
            }
        }
        None
    }

    #[test]
    fn page_ids_pack_generation_pe_and_index_from_high_to_low() {
        let id = PageId::new(7, 0xdeadbee).with_generation(0xabcde);
        // In hex: 5 digits of generation, 4 of PE, 7 of index.
        let raw: u64 = 0xabcd_e000_7dea_dbee;
        assert_eq!(raw, (0xabcde << 44) | (7 << 28) | 0xdeadbee);
        assert_eq!(id.to_raw(), raw);
        assert_eq!(PageId::from_raw(raw), Some(id));
        assert_eq!(PageId::new(7, 5).to_raw(), (7 << 28) | 5);
        assert_eq!(id.to_string(), "page 233495534 of PE 7 (generation 703710)");
        assert!(PageId::new(0, 5) < PageId::new(1, 0));
        assert!(PageId::new(1, 5) < PageId::new(1, 5).with_generation(1));
        // The largest ids of the largest pool are ids, not the sentinel.
        let last = PageId::new(
            PageId::MAX_PES as u32 - 1,
            PageId::MAX_PAGES_PER_PE as u32 - 1,
        )
        .with_generation(PageId::GENERATIONS - 1);
        assert!(last.fits());
        assert_ne!(last.to_raw(), NO_PAGE);
        assert_eq!(PageId::from_raw(last.to_raw()), Some(last));
        assert_eq!(NO_PAGE, u64::MAX);
        assert_eq!(PageId::from_raw(NO_PAGE), None);
        // Any raw id with the all-ones PE field names no PE.
        assert_eq!(PageId::from_raw(0xFFFF << 28), None);
    }

    #[test]
    fn ids_that_do_not_fit_pack_to_no_page() {
        for id in [
            PageId::new(PageId::MAX_PES as u32, 0),
            PageId::new(u32::MAX, 0),
            PageId::new(0, PageId::MAX_PAGES_PER_PE as u32),
            PageId::new(0, 0).with_generation(PageId::GENERATIONS),
        ] {
            assert!(!id.fits(), "{id}");
            assert_eq!(id.to_raw(), NO_PAGE, "{id}");
        }
        // Every raw id but the sentinels comes back as itself.
        let mut rng = 0x1234_5678_9abc_def0u64;
        for _ in 0..10_000 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            match PageId::from_raw(rng) {
                Some(id) => assert_eq!(id.to_raw(), rng),
                None => assert_eq!((rng >> 28) & 0xFFFF, 0xFFFF),
            }
        }
    }

    #[test]
    fn generations_wrap_after_their_count() {
        // The free's next generation, as pool_free computes it (mod 2^20).
        let next = |g: u32| (g + 1) & (PageId::GENERATIONS - 1);
        assert_eq!(PageId::GENERATIONS, 1 << 20);
        assert_eq!(next(0), 1);
        assert_eq!(next(PageId::GENERATIONS - 1), 0);
        let id = PageId::new(1, 2).with_generation(PageId::GENERATIONS - 1);
        let again = id.with_generation(next(id.generation));
        assert_eq!(again, PageId::new(1, 2));
        assert_ne!(id.to_raw(), again.to_raw());
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
            for (start, guess) in [(0, 0), (1, 63), (3, 5)] {
                let mut words = initial_bitmap(pages);
                let mut got = Vec::new();
                let first = start % words.len();
                while let Some(p) = claim(&mut words, first, guess) {
                    got.push(p);
                }
                got.sort_unstable();
                assert_eq!(got, (0..pages).collect::<Vec<_>>(), "{pages} from {start}");
                assert_eq!(pages_in_use(&words, pages), pages);
                // Freeing one makes exactly that one available again, whatever the probe.
                let freed = 2.min(pages - 1);
                words[freed / 64] &= !(1u64 << (freed % 64));
                assert_eq!(claim(&mut words, 0, guess), Some(freed));
                assert_eq!(claim(&mut words, 0, guess), None);
                assert_eq!(pages_in_use(&words, pages), pages);
            }
        }
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(check_sizes(16, 4096, 8, 2).unwrap(), 65536);
        assert!(check_sizes(1, 16, 0, 1).is_ok());
        assert!(check_sizes(PageId::MAX_PAGES_PER_PE, 16, 0, PageId::MAX_PES).is_ok());
        for (pages, bytes, table, pes) in [
            (0, 4096, 1, 2),
            (16, 0, 1, 2),
            (16, 4100, 1, 2),
            (16, 8, 1, 2),
            (PageId::MAX_PAGES_PER_PE + 1, 16, 1, 2),
            (u32::MAX as usize + 1, 16, 1, 2),
            (16, 16, u32::MAX as usize + 1, 2),
            (16, 16, 1, PageId::MAX_PES + 1),
            (PageId::MAX_PAGES_PER_PE, usize::MAX - 15, 1, 2),
        ] {
            let e = check_sizes(pages, bytes, table, pes).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument(_)),
                "{pages} {bytes} {table} {pes}"
            );
        }
        let text = check_sizes(16, 4100, 1, 2).unwrap_err().to_string();
        assert!(text.contains("multiple of 16"), "{text}");
        // The limits are named, with what they come from.
        let text = check_sizes(PageId::MAX_PAGES_PER_PE + 1, 16, 1, 2)
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("1 to 268435456 pages") && text.contains("28 bits"),
            "{text}"
        );
        let text = check_sizes(16, 16, 1, 65536).unwrap_err().to_string();
        assert!(
            text.contains("at most 65535 PEs") && text.contains("16 bits"),
            "{text}"
        );
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
        let last = PageId::new(1, 9).with_generation(PageId::GENERATIONS - 1);
        assert!(check_id(last, 2, 10).is_ok());
        let unborn = last.with_generation(PageId::GENERATIONS);
        let text = check_id(unborn, 2, 10).unwrap_err().to_string();
        assert!(text.contains("from 0 to 1048575"), "{text}");
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
