//! What every check shares: the pages' contents and their comparison.

pub(crate) use nvshmem_checks::tally::{e, expect_err, sync, Checks, Outcome};

use nvshmem_checks::splitmix::{mix, SplitMix64};

use crate::PAGE_BYTES;

/// The contents of page `index` of PE `pe` as written by PE `writer` in round `round`.
pub(crate) fn pattern(round: u64, writer: usize, pe: u32, index: u32) -> Vec<u8> {
    let seed = mix(round ^ mix(writer as u64 ^ mix(((pe as u64) << 32) | index as u64)));
    let mut rng = SplitMix64(seed);
    let mut out = Vec::with_capacity(PAGE_BYTES);
    while out.len() < PAGE_BYTES {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(PAGE_BYTES);
    out
}

/// Where `got` first differs from `want`, as text.
pub(crate) fn compare(what: &str, got: &[u8], want: &[u8]) -> Outcome {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: {} bytes differ, first at byte {i} (page {}, offset {}): got {:#04x}, expected {:#04x}",
            got.iter().zip(want).filter(|(g, w)| g != w).count(),
            i / PAGE_BYTES,
            i % PAGE_BYTES,
            got[i],
            want[i]
        )),
    }
}
