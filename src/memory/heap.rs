//! Whether this PE's symmetric heap can take an allocation, decided before NVSHMEM is asked.
//!
//! NVSHMEM 3 returns NULL when a fixed heap is full, but a growing heap (the default) that
//! cannot map more GPU memory fails inside NVSHMEM and takes every PE down. So each PE checks
//! the request against its own limits first and the PEs agree on the verdict (see `check`):
//! a refused allocation is an error on every PE, and the heap stays usable.

use crate::error::{HeapLimit, Result};
use crate::runtime::HeapConfig;

/// Free GPU memory a growing heap leaves to CUDA (contexts, modules, other allocations).
pub(crate) const CUDA_MARGIN: usize = 256 << 20;

/// What this PE's heap holds: bytes in use, and how much a growing heap has mapped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeapUse {
    pub(crate) in_use: usize,
    pub(crate) mapped: usize,
}

/// The limit that refuses `requested` more bytes, or `None` when they fit. `gpu_free` is
/// asked only when a growing heap must map new memory.
pub(crate) fn refusal(
    heap: &HeapConfig,
    now: HeapUse,
    requested: usize,
    gpu_free: impl FnOnce() -> Result<usize>,
) -> Result<Option<HeapLimit>> {
    let total = now.in_use.checked_add(requested);
    if !heap.grows {
        return Ok(match total {
            Some(t) if t <= heap.symmetric_size => None,
            _ => Some(HeapLimit::SymmetricSize(heap.symmetric_size)),
        });
    }
    let Some(total) = total.filter(|&t| t <= heap.max_memory_per_gpu) else {
        return Ok(Some(HeapLimit::MaxMemoryPerGpu(heap.max_memory_per_gpu)));
    };
    if total <= now.mapped.max(heap.symmetric_size) {
        return Ok(None);
    }
    // The heap grows by whole steps, the request's worth at least.
    let step = requested
        .div_ceil(heap.granularity)
        .checked_mul(heap.granularity);
    let free = gpu_free()?;
    Ok(match step.and_then(|s| s.checked_add(CUDA_MARGIN)) {
        Some(need) if need <= free => None,
        _ => Some(HeapLimit::GpuMemory(free)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    fn growing() -> HeapConfig {
        HeapConfig {
            symmetric_size: GIB,
            grows: true,
            max_memory_per_gpu: 128 * GIB,
            granularity: GIB / 2,
        }
    }

    fn fresh() -> HeapUse {
        HeapUse {
            in_use: 0,
            mapped: GIB,
        }
    }

    fn free(bytes: usize) -> impl FnOnce() -> Result<usize> {
        move || Ok(bytes)
    }

    #[test]
    fn a_fixed_heap_takes_up_to_its_size() {
        let fixed = HeapConfig {
            grows: false,
            ..growing()
        };
        let used = HeapUse {
            in_use: GIB - 4096,
            mapped: GIB,
        };
        assert_eq!(refusal(&fixed, used, 4096, free(0)).unwrap(), None);
        assert_eq!(
            refusal(&fixed, used, 4097, free(80 * GIB)).unwrap(),
            Some(HeapLimit::SymmetricSize(GIB))
        );
        assert_eq!(
            refusal(&fixed, used, usize::MAX, free(0)).unwrap(),
            Some(HeapLimit::SymmetricSize(GIB))
        );
    }

    #[test]
    fn a_growing_heap_needs_gpu_memory_only_beyond_what_it_mapped() {
        // Within the first mapping: the GPU's free memory is not even asked.
        let never = || -> Result<usize> { panic!("free memory asked for") };
        assert_eq!(refusal(&growing(), fresh(), GIB, never).unwrap(), None);
        // Beyond it, the request in whole steps (three half-GiB steps here) and the margin
        // must be free.
        let need = 3 * (GIB / 2) + CUDA_MARGIN;
        assert_eq!(
            refusal(&growing(), fresh(), GIB + 1, free(need)).unwrap(),
            None
        );
        assert_eq!(
            refusal(&growing(), fresh(), GIB + 1, free(need - 1)).unwrap(),
            Some(HeapLimit::GpuMemory(need - 1))
        );
        // What was mapped once is kept: a second allocation of that size needs nothing new.
        let after = HeapUse {
            in_use: 0,
            mapped: 40 * GIB,
        };
        assert_eq!(refusal(&growing(), after, 40 * GIB, free(0)).unwrap(), None);
    }

    #[test]
    fn a_growing_heap_stops_at_the_per_gpu_maximum() {
        // The request that took a 2-GPU job down: 1 TiB.
        assert_eq!(
            refusal(&growing(), fresh(), 1 << 40, free(140 * GIB)).unwrap(),
            Some(HeapLimit::MaxMemoryPerGpu(128 * GIB))
        );
        assert_eq!(
            refusal(&growing(), fresh(), usize::MAX, free(140 * GIB)).unwrap(),
            Some(HeapLimit::MaxMemoryPerGpu(128 * GIB))
        );
        // Under the maximum but more than the GPU has.
        assert_eq!(
            refusal(&growing(), fresh(), 100 * GIB, free(70 * GIB)).unwrap(),
            Some(HeapLimit::GpuMemory(70 * GIB))
        );
    }
}
