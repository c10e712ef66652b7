//! Where the kernels of bench_p2p.cu write and read, and what they leave there: the `p`
//! and `g` kernels' words, and the slots of the region that repetitions cycle through.

/// Slots written by the `p` kernel, read by the `g` kernel (`% 32` in bench_p2p.cu).
pub(super) const P_SLOTS: usize = 32;

/// What `dst[0..32]` holds on the target after the `p` kernel wrote `token + i` into
/// `dst[i % 32]` for `i` in `0..total` (slots never written stay 0).
pub fn p_expected(token: u32, total: usize) -> Vec<u32> {
    (0..P_SLOTS)
        .map(|j| {
            if j < total {
                let last = j + P_SLOTS * ((total - 1 - j) / P_SLOTS);
                token.wrapping_add(last as u32)
            } else {
                0
            }
        })
        .collect()
}

/// Words the `g` kernel reads: one per 128-byte line over 8 MiB, visited in a scattered
/// order, so no read is served by a cache (`G_*` in bench_p2p.cu).
pub(super) const G_SLOTS: usize = 65536;
pub(super) const G_STRIDE: usize = 32;
const G_STEP: usize = 40503;
/// A read returning this moves the next read one word on (a data dependency).
const G_MAGIC: u32 = 0x9E37_79B9;

/// The word of the `g` kernel's `i`-th read.
pub fn g_index(i: usize) -> usize {
    (i * G_STEP) % G_SLOTS * G_STRIDE
}

/// The sum the `g` kernel computes over `total` dependent reads, replayed.
pub fn g_expected(values: &[u32], total: usize) -> u64 {
    let (mut v, mut sum) = (0u32, 0u64);
    for i in 0..total {
        v = values[g_index(i) + usize::from(v == G_MAGIC)];
        sum += v as u64;
    }
    sum
}

/// The region that get tests read from and put-bandwidth tests write to, cycling, larger than
/// any GPU's L2 cache.
const REGION: usize = 128 << 20;

/// Where the repetitions of a test land: repetition `rep` (counted over the whole test) uses
/// slot `rep % nslots` of the remote region, so no repetition finds an earlier one's bytes in
/// a cache (a get) or merges with them there (a put), and each moves its bytes over the link
/// (`first`/`nslots` in bench_p2p.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    pub slot_bytes: usize,
    pub nslots: usize,
}

impl Slots {
    /// Slots of `bytes` (rounded up to 256) in a region of `region` bytes.
    pub fn new(bytes: usize, region: usize) -> Self {
        let slot_bytes = bytes.max(1).div_ceil(256) * 256;
        Slots {
            slot_bytes,
            nslots: (region / slot_bytes).max(1),
        }
    }

    /// Bytes of the region that `total` repetitions use.
    pub fn used_bytes(&self, total: usize) -> usize {
        self.nslots.min(total.max(1)) * self.slot_bytes
    }

    /// Byte offset of the slot that repetition `rep` uses.
    pub fn offset(&self, rep: usize) -> usize {
        (rep % self.nslots) * self.slot_bytes
    }
}

/// The source and destination buffers' length: the largest message, and at least the region.
pub fn region_len(max_bytes: usize) -> usize {
    max_bytes.max(REGION).div_ceil(256) * 256
}

/// In-kernel warm-up repetitions for `inner` timed ones.
pub fn inner_warmup(inner: usize) -> usize {
    (inner / 10).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p_kernel_leaves_the_last_write_of_each_slot() {
        let v = p_expected(100, 70);
        assert_eq!(v.len(), 32);
        // Slot 0 was written at i = 0, 32, 64; slot 5 at 5, 37, 69; slot 6 at 6, 38.
        assert_eq!(v[0], 164);
        assert_eq!(v[5], 169);
        assert_eq!(v[6], 138);
        assert_eq!(v[31], 163);
        let short = p_expected(u32::MAX, 3);
        assert_eq!(&short[..4], &[u32::MAX, 0, 1, 0]);
    }

    #[test]
    fn g_kernel_reads_fresh_lines_and_is_replayed_exactly() {
        // Every read is a different 128-byte line until the 65536 lines are used up.
        let lines: std::collections::HashSet<usize> = (0..G_SLOTS).map(g_index).collect();
        assert_eq!(lines.len(), G_SLOTS);
        assert!(lines
            .iter()
            .all(|w| w % G_STRIDE == 0 && *w < G_SLOTS * G_STRIDE));
        let big: Vec<u32> = (0..(G_SLOTS * G_STRIDE) as u32).collect();
        assert_eq!(
            g_expected(&big, 3),
            (G_STEP * G_STRIDE + (2 * G_STEP % G_SLOTS) * G_STRIDE) as u64
        );
        assert_eq!(
            g_expected(&vec![u32::MAX; G_SLOTS * G_STRIDE], 64),
            64 * u32::MAX as u64
        );
        // The magic value shifts the next read by one word.
        let mut magic = big.clone();
        magic[0] = G_MAGIC;
        let shifted = G_MAGIC as u64
            + (G_STEP * G_STRIDE + 1) as u64
            + ((2 * G_STEP % G_SLOTS) * G_STRIDE) as u64;
        assert_eq!(g_expected(&magic, 3), shifted);
    }

    #[test]
    fn get_slots_stay_in_the_region_and_do_not_repeat_within_it() {
        // Small messages: 256-byte slots, every repetition of a test a new slot.
        let small = Slots::new(8, REGION);
        assert_eq!(small.slot_bytes, 256);
        assert_eq!(small.nslots, REGION / 256);
        assert_eq!(small.used_bytes(6600), 6600 * 256);
        let offsets: std::collections::HashSet<usize> =
            (0..6600).map(|r| small.offset(r)).collect();
        assert_eq!(offsets.len(), 6600);
        // Large messages wrap around a region larger than any L2, never past its end.
        let region = region_len(REGION);
        let big = Slots::new(40 << 20, region);
        assert_eq!((big.slot_bytes, big.nslots), (40 << 20, 3));
        assert_eq!(big.used_bytes(1000), 120 << 20);
        assert_eq!(big.offset(4), 40 << 20);
        assert!((0..1000).all(|r| big.offset(r) + (40 << 20) <= region));
        // A message as large as the buffer: one slot, rounded sizes still fit.
        let len = region_len((256 << 20) + 3);
        let whole = Slots::new((256 << 20) + 3, len);
        assert_eq!(whole.nslots, 1);
        assert!(whole.used_bytes(10) <= len);
    }

    #[test]
    fn kernel_warmup_is_a_tenth_at_least_one() {
        assert_eq!(inner_warmup(100), 10);
        assert_eq!(inner_warmup(5), 1);
    }
}
