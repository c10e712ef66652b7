//! Where a call's wait that ran out of time says so: a `Fault` (kernels/abi.h) in pinned host
//! memory that the GPU maps, so the host reads it at every call without waiting for a stream
//! (the stream may never finish). The kernels write it (see `Wait` in
//! kernels/collectives/call.cuh); it is never cleared: a `Collectives` whose PEs fell out of
//! step cannot be trusted again.

use crate::abi;
use crate::error::{CudaResultExt, Error, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, sys as cusys};
use std::time::Duration;

pub(crate) struct FaultRecord {
    host: *mut abi::Fault,
    device: u64,
    my_pe: usize,
}

// SAFETY: pinned host memory owned by this value; the host only reads it.
unsafe impl Send for FaultRecord {}
unsafe impl Sync for FaultRecord {}

impl FaultRecord {
    pub(crate) fn new(shmem: &Nvshmem) -> Result<Self> {
        shmem.bind_context()?;
        let bytes = std::mem::size_of::<abi::Fault>();
        // SAFETY: a fresh allocation of `bytes`, zeroed before anything reads it.
        let host = unsafe { cu::malloc_host(bytes, cusys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .during("cuMemHostAlloc")? as *mut abi::Fault;
        unsafe { host.write(abi::Fault::default()) };
        let mut device = 0;
        // SAFETY: `host` was allocated mapped, above.
        let mapped = unsafe {
            cusys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut std::ffi::c_void, 0)
        }
        .result()
        .during("cuMemHostGetDevicePointer");
        if let Err(e) = mapped {
            unsafe { cu::free_host(host as *mut std::ffi::c_void) }.ok();
            return Err(e);
        }
        Ok(FaultRecord {
            host,
            device,
            my_pe: shmem.my_pe(),
        })
    }

    /// The address the kernels write the record at.
    pub(crate) fn addr(&self) -> u64 {
        self.device
    }

    /// `Err(Error::Timeout)` once a wait of this PE's calls ran out of time;
    /// `Err(Error::CollectiveMismatch)` once an all-to-all-v found its counts disagreeing.
    pub(crate) fn check(&self) -> Result<()> {
        // SAFETY: live pinned memory; the GPU writes `raised` last, after a system fence.
        let raised = unsafe { std::ptr::addr_of!((*self.host).raised).read_volatile() };
        if raised == 0 {
            return Ok(());
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let f = unsafe { self.host.read_volatile() };
        if f.site as u32 == abi::FAULT_COUNTS {
            return Err(Error::CollectiveMismatch(format!(
                "all_to_all_v call #{}: PE {} sends {} elements to PE {}, which expects {} from \
                 it (every PE p's send_counts[q] must be PE q's recv_counts[p]); nothing moved \
                 between them. Drop this Collectives and make a new one on every PE",
                f.epoch,
                if f.sending != 0 {
                    self.my_pe
                } else {
                    f.pe.max(0) as usize
                },
                f.sent,
                if f.sending != 0 {
                    f.pe.max(0) as usize
                } else {
                    self.my_pe
                },
                f.expected
            )));
        }
        Err(Error::Timeout {
            pe: self.my_pe,
            waited_for: f.pe.max(0) as usize,
            site: site_name(f.site),
            block: f.block.max(0) as usize,
            epoch: f.epoch,
            waited: Duration::from_nanos(f.waited_ns),
        })
    }
}

impl Drop for FaultRecord {
    fn drop(&mut self) {
        // The owner (Collectives::drop) has waited for every kernel that could write here,
        // unless the runtime is stranded: then freeing would wait for the GPU for ever.
        if crate::runtime::check_not_stranded().is_ok() {
            unsafe { cu::free_host(self.host as *mut std::ffi::c_void) }.ok();
        }
    }
}

/// What a `FaultSite` waited for.
fn site_name(site: i32) -> &'static str {
    match site as u32 {
        abi::FAULT_FLAGS => "a handshake flag",
        abi::FAULT_ROUND => "a round flag",
        abi::FAULT_LINE => "a low-latency line",
        abi::FAULT_SENTINEL => "a sentinel vector",
        _ => "a peer",
    }
}
