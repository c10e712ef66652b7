//! Whether this PE's symmetric heap can take an allocation, decided before NVSHMEM is asked.
//!
//! NVSHMEM 3 returns NULL when a fixed heap is full, but a growing heap (the default) that
//! cannot map more GPU memory fails inside NVSHMEM and takes every PE down. So each PE checks
//! the request against a model of its heap first and the PEs agree on the verdict (see
//! `check`): a refused allocation is an error on every PE, and the heap stays usable.
//!
//! The model follows NVSHMEM's allocator: blocks in 512-byte steps, placed first-fit by
//! address; `nvshmem_align(a, n)` takes `n + a`; a growing heap maps a whole number of
//! granules at its end when no gap fits, and never unmaps. NVSHMEM's own blocks (team
//! scratch, proxy buffers) lie below the runtime's first allocation, measured at start-up.

use super::HeapConfig;
use crate::error::{HeapLimit, Result};
use std::collections::BTreeMap;

/// Free GPU memory a growing heap leaves to CUDA (contexts, modules, other allocations).
pub(crate) const CUDA_MARGIN: usize = 256 << 20;

/// The step NVSHMEM's allocator rounds every block to.
pub(crate) const BLOCK_STEP: usize = 512;

/// The heap space an allocation of `bytes` at alignment `align` (0 for none) takes, or `None`
/// when that overflows.
pub(crate) fn footprint(bytes: usize, align: usize) -> Option<usize> {
    if bytes == 0 {
        return Some(0);
    }
    bytes
        .checked_add(align)?
        .checked_next_multiple_of(BLOCK_STEP)
}

/// This PE's heap as the crate sees it. Callers give offsets from the runtime's first
/// allocation (`Nvshmem::heap_offset`); the model keeps them from the heap's base.
#[derive(Debug, Clone)]
pub(crate) struct HeapModel {
    /// NVSHMEM's own blocks: the bytes below the runtime's first allocation.
    reserved: usize,
    /// The crate's live blocks: offset to footprint.
    blocks: BTreeMap<usize, usize>,
    /// A fixed heap's size; for a growing heap, what it has mapped at least (whole granules up
    /// to the furthest block ever placed).
    mapped: usize,
    /// Whether every block so far landed where the model put it.
    as_predicted: bool,
}

/// What the model says of this PE's heap (see [`crate::Nvshmem::heap_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeapUsage {
    /// Bytes NVSHMEM itself holds (its blocks below the first allocation of this crate).
    pub nvshmem: usize,
    /// Bytes the crate's live buffers take, as NVSHMEM rounds them.
    pub buffers: usize,
    /// A fixed heap's size; for a growing heap, how much it has mapped at least.
    pub mapped: usize,
    /// Whether every buffer so far was placed where the model predicted: when `false`, the
    /// estimate before each allocation may be off (a newer NVSHMEM allocator).
    pub placements_as_predicted: bool,
}

impl HeapModel {
    /// The model at start-up: NVSHMEM's blocks fill `reserved` bytes; `mapped` is a fixed
    /// heap's measured size, or `None` for a growing heap.
    pub(crate) fn new(heap: &HeapConfig, reserved: usize, fixed_size: Option<usize>) -> Self {
        let mapped = match fixed_size {
            Some(size) if !heap.grows => size,
            _ if !heap.grows => heap.symmetric_size.saturating_add(reserved),
            _ => reserved.next_multiple_of(heap.granularity),
        };
        HeapModel {
            reserved,
            blocks: BTreeMap::new(),
            mapped,
            as_predicted: true,
        }
    }

    /// Bytes from the heap's base of a block `offset` bytes from the runtime's first
    /// allocation.
    fn base_offset(&self, offset: u64) -> usize {
        offset.wrapping_add(self.reserved as u64) as usize
    }

    pub(crate) fn usage(&self) -> HeapUsage {
        HeapUsage {
            nvshmem: self.reserved,
            buffers: self.blocks.values().sum(),
            mapped: self.mapped,
            placements_as_predicted: self.as_predicted,
        }
    }

    /// Where NVSHMEM's first fit puts a block of `need` bytes, whatever the heap's end.
    fn first_fit(&self, need: usize) -> usize {
        let mut at = self.reserved;
        for (&offset, &len) in &self.blocks {
            if offset >= at && offset - at >= need {
                return at;
            }
            at = at.max(offset + len);
        }
        at
    }

    /// The limit that refuses a block of `need` bytes (a [`footprint`]), or `None` when it
    /// fits. `gpu_free` is asked only when a growing heap must map new memory.
    pub(crate) fn refusal(
        &self,
        heap: &HeapConfig,
        need: usize,
        gpu_free: impl FnOnce() -> Result<usize>,
    ) -> Result<Option<HeapLimit>> {
        let end = self.first_fit(need).checked_add(need);
        if end.is_some_and(|e| e <= self.mapped) {
            return Ok(None);
        }
        if !heap.grows {
            return Ok(Some(HeapLimit::SymmetricSize(heap.symmetric_size)));
        }
        // No gap fits: NVSHMEM maps whole granules for the block at the heap's end.
        let step = need.checked_next_multiple_of(heap.granularity);
        let grown = step.and_then(|s| self.mapped.checked_add(s));
        let (Some(step), true) = (step, grown.is_some_and(|g| g < heap.max_memory_per_gpu)) else {
            return Ok(Some(HeapLimit::MaxMemoryPerGpu(heap.max_memory_per_gpu)));
        };
        let free = gpu_free()?;
        Ok(match step.checked_add(CUDA_MARGIN) {
            Some(n) if n <= free => None,
            _ => Some(HeapLimit::GpuMemory(free)),
        })
    }

    /// A block of `need` bytes (a [`footprint`] at alignment `align`, 0 for none) was handed
    /// out `offset` bytes from the runtime's first allocation: an aligned one at most `align`
    /// bytes past its block's start, whose leading pad NVSHMEM gives back.
    pub(crate) fn place(
        &mut self,
        heap: &HeapConfig,
        offset: u64,
        need: usize,
        align: usize,
        pe: usize,
    ) {
        if need == 0 {
            return;
        }
        let offset = self.base_offset(offset);
        let start = self.first_fit(need);
        let (at, len) = if offset >= start && offset - start <= align {
            (offset, need - (offset - start))
        } else {
            if self.as_predicted {
                self.as_predicted = false;
                crate::diag::warn_pe!(
                    Some(pe),
                    "a symmetric block of {need} bytes (alignment {align}) landed {offset} bytes \
                     into the heap, not at {start} as modelled: the heap check before \
                     allocations may be off"
                );
            }
            (offset, need)
        };
        let mut end = at.saturating_add(len);
        if heap.grows && end > self.mapped {
            // The heap mapped whole granules from its base to hold the block.
            end = end.next_multiple_of(heap.granularity);
        }
        self.mapped = self.mapped.max(end);
        self.blocks.insert(at, len);
    }

    /// The block `offset` bytes from the runtime's first allocation was freed.
    pub(crate) fn remove(&mut self, offset: u64) {
        let offset = self.base_offset(offset);
        self.blocks.remove(&offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;
    const MIB: usize = 1 << 20;

    fn growing() -> HeapConfig {
        HeapConfig {
            symmetric_size: GIB,
            grows: true,
            max_memory_per_gpu: 128 * GIB,
            granularity: GIB / 2,
        }
    }

    fn fixed() -> HeapConfig {
        HeapConfig {
            grows: false,
            ..growing()
        }
    }

    fn free(bytes: usize) -> impl FnOnce() -> Result<usize> {
        move || Ok(bytes)
    }

    fn never() -> impl FnOnce() -> Result<usize> {
        || panic!("free memory asked for")
    }

    #[test]
    fn blocks_take_512_byte_steps_and_an_alignment_on_top() {
        assert_eq!(footprint(0, 0), Some(0));
        assert_eq!(footprint(1, 0), Some(512));
        assert_eq!(footprint(512, 0), Some(512));
        assert_eq!(footprint(513, 0), Some(1024));
        assert_eq!(footprint(4096, 4096), Some(8192));
        assert_eq!(footprint(usize::MAX, 0), None);
        assert_eq!(footprint(usize::MAX - 600, 0), Some(usize::MAX - 511));
        assert_eq!(footprint(usize::MAX - 500, 0), None);
    }

    #[test]
    fn a_fixed_heap_takes_up_to_its_measured_size_past_nvshmems_blocks() {
        let heap = fixed();
        let mut m = HeapModel::new(&heap, 10 * MIB, Some(GIB + 16 * MIB));
        assert_eq!(m.usage().mapped, GIB + 16 * MIB);
        m.place(&heap, 0, GIB, 0, 0);
        assert_eq!(m.refusal(&heap, 6 * MIB, never()).unwrap(), None);
        assert_eq!(
            m.refusal(&heap, 6 * MIB + 512, free(80 * GIB)).unwrap(),
            Some(HeapLimit::SymmetricSize(GIB))
        );
        // Unmeasured: NVSHMEM's reserve comes on top of NVSHMEM_SYMMETRIC_SIZE.
        let m = HeapModel::new(&heap, 10 * MIB, None);
        assert_eq!(m.usage().mapped, GIB + 10 * MIB);
    }

    #[test]
    fn a_freed_gap_is_reused_first_fit_and_fragments_count() {
        let heap = fixed();
        let mut m = HeapModel::new(&heap, 0, Some(4 * MIB));
        m.place(&heap, 0, MIB, 0, 0);
        m.place(&heap, MIB as u64, MIB, 0, 0);
        m.place(&heap, 2 * MIB as u64, MIB, 0, 0);
        m.remove(MIB as u64);
        assert_eq!(m.first_fit(512), MIB);
        assert_eq!(m.first_fit(MIB), MIB);
        assert_eq!(m.first_fit(MIB + 512), 3 * MIB);
        // 2 MiB are free in all, but not in one piece.
        assert_eq!(m.refusal(&heap, MIB, never()).unwrap(), None);
        assert_eq!(
            m.refusal(&heap, 2 * MIB, never()).unwrap(),
            Some(HeapLimit::SymmetricSize(GIB))
        );
        m.place(&heap, MIB as u64, 512, 0, 0);
        assert!(m.usage().placements_as_predicted);
        assert_eq!(m.usage().buffers, 2 * MIB + 512);
        // A block where the model did not put it is noted.
        m.place(&heap, 3 * MIB as u64 + 512, 512, 0, 0);
        assert!(!m.usage().placements_as_predicted);
    }

    #[test]
    fn an_aligned_block_gives_back_the_pad_before_its_pointer() {
        let heap = fixed();
        let mut m = HeapModel::new(&heap, 512, Some(GIB));
        // 100 bytes at 64 KiB alignment: a block of 66048 from the base's 512, handed out at
        // 65536 (65024 past the first allocation's place).
        m.place(&heap, 65024, footprint(100, 65536).unwrap(), 65536, 0);
        assert!(m.usage().placements_as_predicted);
        assert_eq!(m.usage().buffers, 66048 - 65024);
        assert_eq!(m.first_fit(65024), 512);
        assert_eq!(m.first_fit(65025), 66560);
        // A pointer past the pad the alignment allows is not where the model put it.
        m.place(
            &heap,
            2 * 66048 + 65024,
            footprint(100, 4096).unwrap(),
            4096,
            0,
        );
        assert!(!m.usage().placements_as_predicted);
    }

    #[test]
    fn a_growing_heap_needs_gpu_memory_only_beyond_what_it_mapped() {
        let heap = growing();
        // NVSHMEM's own 130 MiB: one granule mapped.
        let mut m = HeapModel::new(&heap, 130 * MIB, None);
        assert_eq!(m.usage().mapped, GIB / 2);
        assert_eq!(m.refusal(&heap, 382 * MIB, never()).unwrap(), None);
        // Beyond it, the block in whole granules (three here) and the margin must be free.
        let need = 3 * (GIB / 2) + CUDA_MARGIN;
        assert_eq!(m.refusal(&heap, GIB + 1, free(need)).unwrap(), None);
        assert_eq!(
            m.refusal(&heap, GIB + 1, free(need - 1)).unwrap(),
            Some(HeapLimit::GpuMemory(need - 1))
        );
        // What was mapped once is kept: the same block again, after a free, needs nothing new.
        m.place(&heap, 0, 40 * GIB, 0, 0);
        assert_eq!(m.usage().mapped, 40 * GIB + GIB / 2);
        m.remove(0);
        assert_eq!(m.refusal(&heap, 40 * GIB, never()).unwrap(), None);
    }

    #[test]
    fn a_growing_heap_stops_at_the_per_gpu_maximum() {
        let heap = growing();
        let m = HeapModel::new(&heap, 130 * MIB, None);
        // The request that took a 2-GPU job down: 1 TiB.
        for need in [1 << 40, usize::MAX - 511, 128 * GIB - GIB / 2] {
            assert_eq!(
                m.refusal(&heap, need, free(140 * GIB)).unwrap(),
                Some(HeapLimit::MaxMemoryPerGpu(128 * GIB))
            );
        }
        // Under the maximum but more than the GPU has.
        assert_eq!(
            m.refusal(&heap, 100 * GIB, free(70 * GIB)).unwrap(),
            Some(HeapLimit::GpuMemory(70 * GIB))
        );
    }
}
