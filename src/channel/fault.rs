//! Where a channel's wait that gave up says so: an `nvshmem_rs_channel_fault` (channel.h) in
//! pinned host memory that the GPU maps, one per channel and PE. The first wait of this PE on
//! the channel to give up writes it (`record_fault` in channel.cuh); the host reads it at every
//! call without waiting for a stream (the stream may never finish). It is never cleared: the
//! two ends no longer agree on what comes next.

use crate::abi::{self, nvshmem_rs_channel_fault as Fault};
use crate::error::{ChannelWait, CudaResultExt, Error, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, sys as cusys};
use std::time::Duration;

pub(crate) struct FaultRecord {
    host: *mut Fault,
    device: u64,
    my_pe: usize,
}

// SAFETY: pinned host memory owned by this value; the host only reads it.
unsafe impl Send for FaultRecord {}
unsafe impl Sync for FaultRecord {}

impl FaultRecord {
    pub(crate) fn new(shmem: &Nvshmem) -> Result<Self> {
        shmem.bind_context()?;
        let bytes = std::mem::size_of::<Fault>();
        // SAFETY: a fresh allocation of `bytes`, zeroed before anything reads it.
        let host = unsafe { cu::malloc_host(bytes, cusys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .during("cuMemHostAlloc")? as *mut Fault;
        unsafe { host.write(Fault::default()) };
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
    pub(crate) fn device_ptr(&self) -> *mut Fault {
        self.device as *mut Fault
    }

    /// `Err(Error::ChannelTimeout)` once a wait of this PE on the channel gave up.
    pub(crate) fn check(&self) -> Result<()> {
        // SAFETY: live pinned memory; the GPU writes `raised` last, after a system fence.
        let raised = unsafe { std::ptr::addr_of!((*self.host).raised).read_volatile() };
        if raised == 0 {
            return Ok(());
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let fault = unsafe { self.host.read_volatile() };
        Err(timeout_error(self.my_pe, &fault))
    }
}

impl Drop for FaultRecord {
    fn drop(&mut self) {
        // The channel dropped its buffers first, whose frees waited for every kernel that could
        // write here, unless the runtime is stranded: then freeing would wait for the GPU for
        // ever.
        if crate::runtime::check_not_stranded().is_ok() {
            unsafe { cu::free_host(self.host as *mut std::ffi::c_void) }.ok();
        }
    }
}

/// The error a raised record stands for, on PE `my_pe`.
fn timeout_error(my_pe: usize, fault: &Fault) -> Error {
    Error::ChannelTimeout {
        pe: my_pe,
        waited_for: fault.pe.max(0) as usize,
        site: if fault.site as u32 == abi::CHANNEL_WAIT_SLOT {
            ChannelWait::Slot
        } else {
            ChannelWait::Message
        },
        message: fault.seq,
        waited: Duration::from_nanos(fault.waited_ns),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_the_peer_the_wait_and_the_message() {
        let fault = Fault {
            raised: 1,
            site: abi::CHANNEL_WAIT_SLOT as i32,
            pe: 3,
            block: 0,
            seq: 9,
            waited_ns: 2_000_000_000,
        };
        assert!(matches!(
            timeout_error(1, &fault),
            Error::ChannelTimeout {
                pe: 1,
                waited_for: 3,
                site: ChannelWait::Slot,
                message: 9,
                waited,
            } if waited == Duration::from_secs(2)
        ));
        let fault = Fault {
            site: abi::CHANNEL_WAIT_MESSAGE as i32,
            pe: 0,
            seq: 0,
            ..fault
        };
        assert!(matches!(
            timeout_error(1, &fault),
            Error::ChannelTimeout {
                waited_for: 0,
                site: ChannelWait::Message,
                message: 0,
                ..
            }
        ));
    }
}
