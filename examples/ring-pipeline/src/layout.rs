//! How the all-gather buffer is cut into slots, chunks and signal words.

use nvshmem::{Error, Result};
use std::ops::Range;

/// How the all-gather buffer is cut: one slot of `elems_per_pe` elements per PE, each slot in
/// chunks of `chunk_elems` elements (the last chunk of a slot may be shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    n_pes: usize,
    elems_per_pe: usize,
    chunk_elems: usize,
}

impl Layout {
    /// A layout; a chunk larger than a slot is cut down to the slot.
    pub fn new(n_pes: usize, elems_per_pe: usize, chunk_elems: usize) -> Result<Layout> {
        if n_pes == 0 || elems_per_pe == 0 || chunk_elems == 0 {
            return Err(Error::InvalidArgument(format!(
                "ring all-gather needs at least one PE, element and chunk element (got {n_pes} PEs, \
                 {elems_per_pe} elements per PE, chunks of {chunk_elems})"
            )));
        }
        if n_pes.checked_mul(elems_per_pe).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{n_pes} x {elems_per_pe} elements overflow usize"
            )));
        }
        Ok(Layout {
            n_pes,
            elems_per_pe,
            chunk_elems: chunk_elems.min(elems_per_pe),
        })
    }

    /// Number of PEs.
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }

    /// Elements each PE contributes.
    pub fn elems_per_pe(&self) -> usize {
        self.elems_per_pe
    }

    /// Elements per chunk.
    pub fn chunk_elems(&self) -> usize {
        self.chunk_elems
    }

    /// Chunks per slot.
    pub fn chunks_per_slot(&self) -> usize {
        self.elems_per_pe.div_ceil(self.chunk_elems)
    }

    /// Elements of the whole buffer (every PE's slot).
    pub fn total_elems(&self) -> usize {
        self.n_pes * self.elems_per_pe
    }

    /// Number of signal words: one per chunk of every slot.
    pub fn signal_count(&self) -> usize {
        self.n_pes * self.chunks_per_slot()
    }

    /// The elements of PE `pe`'s slot in the buffer.
    pub fn slot(&self, pe: usize) -> Range<usize> {
        pe * self.elems_per_pe..(pe + 1) * self.elems_per_pe
    }

    /// The elements of chunk `c` of `slot` in the buffer.
    pub fn chunk(&self, slot: usize, c: usize) -> Range<usize> {
        let begin = slot * self.elems_per_pe + c * self.chunk_elems;
        begin..(begin + self.chunk_elems).min((slot + 1) * self.elems_per_pe)
    }

    /// The signal word of chunk `c` of `slot`.
    pub fn signal_index(&self, slot: usize, c: usize) -> usize {
        slot * self.chunks_per_slot() + c
    }

    /// The slot PE `me` forwards to the next PE at `step` (0 for its own, up to
    /// `n_pes - 2`): `(me - step) mod n_pes`.
    pub fn slot_sent(&self, me: usize, step: usize) -> usize {
        (me + self.n_pes - step % self.n_pes) % self.n_pes
    }
}
