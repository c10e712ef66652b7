//! Where a call's wait that ran out of time says so: a `Fault` (kernels/abi.h) in pinned host
//! memory that the GPU maps, so the host reads it at every call without waiting for a stream
//! (the stream may never finish). The kernels write it (see `Wait` in
//! kernels/collectives/call.cuh); it is never cleared: a `Collectives` whose PEs fell out of
//! step cannot be trusted again.

use super::Members;
use crate::abi;
use crate::error::{Error, Result};
use crate::memory::MappedRecord;
use crate::runtime::Nvshmem;
use std::time::Duration;

pub(crate) struct FaultRecord {
    record: MappedRecord<abi::Fault>,
    /// The kernels record team PE numbers; errors name world PEs (and team ones).
    members: Members,
}

impl FaultRecord {
    pub(crate) fn new(shmem: &Nvshmem, members: &Members) -> Result<Self> {
        Ok(FaultRecord {
            record: MappedRecord::new(shmem)?,
            members: members.clone(),
        })
    }

    /// The address the kernels write the record at.
    pub(crate) fn addr(&self) -> u64 {
        self.record.device_addr()
    }

    /// `Err(Error::Timeout)` once a wait of this PE's calls ran out of time;
    /// `Err(Error::CollectiveMismatch)` once a call found a peer's call signature (or an
    /// all-to-all-v a peer's counts) disagreeing with its own.
    pub(crate) fn check(&self) -> Result<()> {
        // SAFETY (of the projection): a field of the live record.
        let Some(f) = self
            .record
            .raised(|f| unsafe { std::ptr::addr_of!((*f).raised) })
        else {
            return Ok(());
        };
        let m = &self.members;
        let (me, peer) = (m.me().unwrap_or(0), f.pe.max(0) as usize);
        if f.site as u32 == abi::FAULT_COUNTS {
            let (from, to) = if f.sending != 0 {
                (me, peer)
            } else {
                (peer, me)
            };
            return Err(Error::CollectiveMismatch(format!(
                "all_to_all_v call #{}: {} sends {} elements to {}, which expects {} from it \
                 (every PE p's send_counts[q] must be PE q's recv_counts[p]); nothing moved \
                 between them. Drop this Collectives and make a new one on every PE",
                f.epoch,
                m.name(from),
                f.sent,
                m.name(to),
                f.expected
            )));
        }
        if f.site as u32 == abi::FAULT_MISMATCH {
            return Err(Error::CollectiveMismatch(mismatch_message(
                (&m.name(me), &m.name(peer)),
                f.epoch,
                f.sent as u32,
                f.expected as u32,
            )));
        }
        Err(Error::Timeout {
            pe: m.my_world(),
            waited_for: m.world_pes().get(peer).copied().unwrap_or(peer),
            site: site_name(f.site),
            block: f.block.max(0) as usize,
            epoch: f.epoch,
            waited: Duration::from_nanos(f.waited_ns),
        })
    }
}

/// What a `FAULT_MISMATCH` record says: `me`'s call #`epoch` found `peer`'s call of
/// signature `theirs` where its own has `mine`, or (`theirs` = `COLL_SIG_FAILED`) a PE that
/// gave up a wait or could not queue its copies before a copy-engine call's closing barrier.
/// PEs as messages name them.
fn mismatch_message((me, peer): (&str, &str), epoch: u64, theirs: u32, mine: u32) -> String {
    let drop = "Drop this Collectives and make a new one on every PE";
    if theirs == abi::COLL_SIG_FAILED {
        let who = if peer == me { "this PE" } else { peer };
        return format!(
            "collective call #{epoch}: {who} gave up this call (a wait of its ran out of time) \
             or could not queue its copy-engine copies (its error says which), so its part of \
             the output on {me} is missing or was written before {me} entered the call. \
             {drop}"
        );
    }
    format!(
        "collective call #{epoch}: {me} and {peer} made different calls (signatures \
         {mine:#06x} and {theirs:#06x}: the collective, element type, operator, algorithm, \
         length or root differ, or one PE skipped a call). Every PE must make the same calls \
         in the same order; `check_calls: true` in `CollectivesConfig` names the difference \
         (one agreement per call). {drop}"
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatch_messages_name_both_pes_and_the_way_out() {
        let m = mismatch_message(("PE 2", "PE 0"), 17, 0x1234, 0xbeef);
        assert!(
            m.contains("call #17: PE 2 and PE 0 made different calls"),
            "{m}"
        );
        assert!(m.contains("0xbeef and 0x1234"), "{m}");
        assert!(m.contains("check_calls: true"), "{m}");
        let peer = mismatch_message(("PE 1", "PE 3"), 5, abi::COLL_SIG_FAILED, 0x10);
        assert!(peer.contains("call #5: PE 3 gave up this call"), "{peer}");
        assert!(
            peer.contains("could not queue its copy-engine copies"),
            "{peer}"
        );
        assert!(peer.contains("output on PE 1 is missing"), "{peer}");
        let own = mismatch_message(
            ("PE 1", "PE 1"),
            5,
            abi::COLL_SIG_FAILED,
            abi::COLL_SIG_FAILED,
        );
        assert!(own.contains("this PE gave up this call"), "{own}");
    }
}
