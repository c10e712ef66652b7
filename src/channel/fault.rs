//! Where a channel's wait that gave up says so: an `nvshmem_rs_channel_fault` (channel.h) in
//! pinned host memory that the GPU maps, one per channel and PE. The first wait of this PE on
//! the channel to give up writes it (`record_fault` in channel.cuh); the host reads it at every
//! call without waiting for a stream (the stream may never finish). It is never cleared: the
//! two ends no longer agree on what comes next.

use crate::abi::{self, nvshmem_rs_channel_fault as Fault};
use crate::error::{ChannelWait, Error, Result};
use crate::memory::MappedRecord;
use crate::runtime::Nvshmem;
use std::time::Duration;

pub(crate) struct FaultRecord {
    record: MappedRecord<Fault>,
    my_pe: usize,
}

impl FaultRecord {
    pub(crate) fn new(shmem: &Nvshmem) -> Result<Self> {
        Ok(FaultRecord {
            record: MappedRecord::new(shmem)?,
            my_pe: shmem.my_pe(),
        })
    }

    /// The address the kernels write the record at.
    pub(crate) fn device_ptr(&self) -> *mut Fault {
        self.record.device_addr() as *mut Fault
    }

    /// `Err(Error::ChannelTimeout)` once a wait of this PE on the channel gave up.
    pub(crate) fn check(&self) -> Result<()> {
        // SAFETY (of the projection): a field of the live record.
        match self
            .record
            .raised(|f| unsafe { std::ptr::addr_of!((*f).raised) })
        {
            None => Ok(()),
            Some(fault) => Err(timeout_error(self.my_pe, &fault)),
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
