//! The debug-build agreement check of collective allocation: before each symmetric
//! allocation and free, every PE publishes `[kind, sequence, bytes, alignment]` with one
//! fcollect, and a PE that differs is named in an error instead of a hang or a corrupted heap.
//!
//! A runtime service ([`Nvshmem::with_service`]): made on the first allocation, which every
//! PE makes at the same point, and freed before NVSHMEM is finalised.

use crate::error::{check, CudaResultExt, Error, Result};
use crate::runtime::Nvshmem;
use nvshmem_sys as sys;

/// What a PE is about to do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum CheckKind {
    Alloc = 1,
    Free = 2,
}

/// Words each PE publishes.
const WORDS: usize = 4;

/// Symmetric scratch for the exchange: 4 words of ours, then 4 words per PE.
pub(crate) struct AllocCheck {
    scratch: *mut u64,
    n_pes: usize,
    next_seq: u64,
}

// SAFETY: the scratch pointer is device memory this value owns; the runtime keeps the
// service behind a lock and makes the context current before each use.
unsafe impl Send for AllocCheck {}

impl AllocCheck {
    /// Allocate the scratch (collective). Called with the runtime's services locked, so it
    /// allocates with NVSHMEM directly.
    pub(crate) fn new(shmem: &Nvshmem) -> Result<Self> {
        shmem.enter()?;
        let n_pes = shmem.n_pes();
        let bytes = (n_pes + 1) * WORDS * 8;
        let scratch = unsafe { sys::nvshmem_malloc(bytes) } as *mut u64;
        if scratch.is_null() {
            return Err(Error::HeapExhausted {
                requested: bytes,
                in_use: 0,
                heap_size: shmem.rt.heap_size,
            });
        }
        Ok(AllocCheck {
            scratch,
            n_pes,
            next_seq: 0,
        })
    }

    /// Exchange what every PE is about to do and fail if they differ. Returns the sequence
    /// number of the allocation (a new one for `Alloc`, `seq` for `Free`).
    pub(crate) fn agree(
        &mut self,
        shmem: &Nvshmem,
        kind: CheckKind,
        seq: Option<u64>,
        bytes: usize,
        align: usize,
    ) -> Result<u64> {
        let seq = seq.unwrap_or(self.next_seq);
        let mine = [kind as u64, seq, bytes as u64, align as u64];
        let stream = shmem.stream();
        let mut all = vec![0u64; self.n_pes * WORDS];
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                self.scratch as u64,
                &mine,
                stream.cu_stream(),
            )
            .during("cuMemcpyHtoDAsync")?;
            check(
                "nvshmemx_uint64_fcollect_on_stream",
                sys::nvshmemx_uint64_fcollect_on_stream(
                    sys::NVSHMEM_TEAM_WORLD,
                    self.scratch.add(WORDS),
                    self.scratch,
                    WORDS,
                    stream.cu_stream() as sys::cudaStream_t,
                ),
            )?;
            cudarc::driver::result::memcpy_dtoh_async(
                &mut all,
                self.scratch.add(WORDS) as u64,
                stream.cu_stream(),
            )
            .during("cuMemcpyDtoHAsync")?;
        }
        stream.synchronize().during("cuStreamSynchronize")?;
        if let Some(msg) = describe_mismatch(shmem.my_pe(), &all) {
            return Err(Error::CollectiveMismatch(msg));
        }
        if kind == CheckKind::Alloc {
            self.next_seq += 1;
        }
        Ok(seq)
    }
}

impl Drop for AllocCheck {
    fn drop(&mut self) {
        // The runtime drops its services with its context current, before finalising.
        unsafe { sys::nvshmem_free(self.scratch as *mut std::ffi::c_void) };
    }
}

/// Compare what each PE published; `None` when all agree.
fn describe_mismatch(my_pe: usize, all: &[u64]) -> Option<String> {
    let records: Vec<&[u64]> = all.chunks(WORDS).collect();
    let first = records.first()?;
    let pe = records.iter().position(|r| r != first)?;
    let show = |r: &[u64]| {
        let what = if r[0] == CheckKind::Alloc as u64 {
            "allocation"
        } else {
            "free of allocation"
        };
        let align = if r[3] != 0 {
            format!(", aligned to {}", r[3])
        } else {
            String::new()
        };
        format!("{what} #{} of {} bytes{align}", r[1], r[2])
    };
    Some(format!(
        "PE 0 is doing {} while PE {pe} is doing {} (seen from PE {my_pe}); every PE must \
         allocate and free symmetric buffers in the same order with the same sizes",
        show(first),
        show(records[pe])
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreeing_pes_pass_the_allocation_check() {
        let all = [1, 3, 4096, 0, 1, 3, 4096, 0, 1, 3, 4096, 0];
        assert_eq!(describe_mismatch(0, &all), None);
    }

    #[test]
    fn a_pe_allocating_another_size_is_named() {
        let all = [1, 3, 4096, 0, 1, 3, 4096, 0, 1, 3, 8192, 0];
        let msg = describe_mismatch(1, &all).unwrap();
        assert!(
            msg.contains("PE 2 is doing allocation #3 of 8192 bytes"),
            "{msg}"
        );
        assert!(
            msg.contains("PE 0 is doing allocation #3 of 4096 bytes"),
            "{msg}"
        );
    }

    #[test]
    fn a_pe_freeing_out_of_order_is_named() {
        let all = [2, 0, 64, 0, 2, 1, 128, 0];
        let msg = describe_mismatch(0, &all).unwrap();
        assert!(msg.contains("free of allocation #1 of 128 bytes"), "{msg}");
    }

    #[test]
    fn a_pe_allocating_while_another_frees_is_named() {
        let all = [1, 5, 64, 0, 2, 4, 64, 0];
        assert!(describe_mismatch(0, &all)
            .unwrap()
            .contains("PE 1 is doing free of allocation #4"));
    }
}
