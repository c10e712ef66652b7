//! The flags of a fused exchange: a chunk of rows that one PE hands another raises a flag
//! when it lands.
//!
//! The flags are set and waited for by stream memory operations (`cuStreamWriteValue64` /
//! `cuStreamWaitValue64`), not by kernels, so that no SM is held while a transfer is awaited.
//! Every value written is a constant (a flag is 1 when set and 0 when clear; in rounds, the
//! count of rounds done), so a captured call replays correctly.
//!
//! Per PE, three flags per PE `c` in symmetric memory:
//! - `ready[c]`: PE `c`'s chunk has landed here (set by `c` after its transfer, cleared here
//!   once this PE's work has read it); an exchange in rounds sets it to the number of the
//!   rounds whose chunks have landed;
//! - `credit[c]`: PE `c` has started the same fused call, so everything it did before on its
//!   stream (whatever read its buffer last: a fused call, or the same layer's sequential
//!   schedule) is done, and this PE may write its chunk there (set by `c` when its call
//!   opens, taken here before the transfer);
//! - `done[c]`: the rounds of PE `c`'s rows of a fused GEMM + all-reduce whose sums have
//!   landed here (set by `c`, cleared here as the call closes).
//!
//! Each call's credits are consumed by the same call's transfers: a PE opens its next call
//! only after its last one saw every peer's chunk, which each peer sent after taking its
//! credit; and it clears its `ready` and `done` flags before it opens the next call, whose
//! credits any new chunk waits for.

use super::watch::Watch;
use crate::collectives::Members;
use crate::element::Element;
use crate::error::{CudaResultExt, Error, Result};
use crate::memory::{SetUp, SymmetricBuffer, SymmetricView};
use crate::runtime::Nvshmem;
use cudarc::driver::{sys, CudaStream};
use std::sync::Arc;

/// The flags of one layer's exchange buffer.
pub(in crate::tp) struct ChunkFlags {
    n: usize,
    me: usize,
    /// `ready`, `credit` and `done` (`n` flags each), on every PE: kept for `peer_flags`.
    _flags: SymmetricBuffer<u64>,
    /// Per PE: its flag array, as mapped here.
    peer_flags: Vec<u64>,
    /// The bound on the calls' waits (none without `NVSHMEM_RS_TIMEOUT`).
    watch: Option<Arc<Watch>>,
}

impl Drop for ChunkFlags {
    fn drop(&mut self) {
        // Before the flags are freed: no call left waiting on them, and no release after.
        if let Some(w) = &self.watch {
            w.close();
        }
    }
}

const FLAG: u64 = std::mem::size_of::<u64>() as u64;

/// Per PE of the group (`members`, in group order): where `buf` (a symmetric buffer, or a
/// view of one) starts on it, as mapped here.
pub(in crate::tp) fn peer_bases<'a, T: Element>(
    buf: impl Into<SymmetricView<'a, T>>,
    members: &Members,
) -> Result<Vec<u64>> {
    let buf = buf.into();
    let shmem = buf.runtime();
    (0..members.n())
        .map(|pe| match buf.peer_ptr(members.world_pe(pe))? {
            Some(p) => Ok(p as u64),
            None => Err(Error::InvalidArgument(format!(
                "{} is not load/store reachable from PE {}: a tensor-parallel group needs \
                 every PE on one node with peer access",
                members.name(pe),
                shmem.my_pe()
            ))),
        })
        .collect()
}

impl ChunkFlags {
    /// The flags of one exchange between `members`, all clear (collective over the world:
    /// allocates symmetric memory, then waits for every PE).
    pub(in crate::tp) fn new(shmem: &Nvshmem, members: &Members) -> Result<Self> {
        let (n, me) = (members.n(), members.me()?);
        // Room for the world's PEs: the same on every PE, whatever its group.
        let flags = shmem.calloc::<u64>(3 * shmem.n_pes())?;
        let peer_flags = peer_bases(&flags, members)?;
        // No peer may write a flag here before it is cleared (calloc's zeroing is complete).
        shmem.set_up_barrier(SetUp::TpExchange)?;
        let watch = Watch::new(shmem, peer_flags[me], members);
        Ok(ChunkFlags {
            n,
            me,
            _flags: flags,
            peer_flags,
            watch,
        })
    }

    /// This PE.
    pub(in crate::tp) fn me(&self) -> usize {
        self.me
    }

    /// The peers in the order this PE serves them: the next PE first.
    pub(in crate::tp) fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (1..self.n).map(move |i| (self.me + i) % self.n)
    }

    fn ready(&self, pe: usize, of: usize) -> u64 {
        self.peer_flags[pe] + of as u64 * FLAG
    }

    fn credit(&self, pe: usize, of: usize) -> u64 {
        self.peer_flags[pe] + (self.n + of) as u64 * FLAG
    }

    fn done(&self, pe: usize, of: usize) -> u64 {
        self.peer_flags[pe] + (2 * self.n + of) as u64 * FLAG
    }

    /// On `stream`, first in a call: let every peer write its chunk here (after everything
    /// before on `stream`, which may still read the buffer).
    /// [`Error::ExchangeTimeout`] once a call's wait gave up: the layer takes no call after.
    pub(in crate::tp) fn refuse(&self) -> Result<()> {
        self.watch.as_ref().map_or(Ok(()), |w| w.refuse())
    }

    /// Refused once a call's wait gave up ([`Error::ExchangeTimeout`]).
    pub(in crate::tp) fn open(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.refuse()?;
        self.peers()
            .try_for_each(|c| write(stream, self.credit(c, self.me), 1))
    }

    /// On `stream`: wait until `peer` may receive this PE's chunk, and take the credit.
    pub(in crate::tp) fn take_credit(&self, stream: &Arc<CudaStream>, peer: usize) -> Result<()> {
        wait_set(stream, self.credit(self.me, peer))?;
        write(stream, self.credit(self.me, peer), 0)
    }

    /// On `stream`, after the transfer before it: tell `peer` that this PE's chunk has landed.
    pub(in crate::tp) fn raise(&self, stream: &Arc<CudaStream>, peer: usize) -> Result<()> {
        self.raise_rounds(stream, peer, 1)
    }

    /// On `stream`, after the transfers before it: tell `peer` that this PE's chunks of its
    /// first `rounds` rounds have landed.
    pub(in crate::tp) fn raise_rounds(
        &self,
        stream: &Arc<CudaStream>,
        peer: usize,
        rounds: u64,
    ) -> Result<()> {
        write(stream, self.ready(peer, self.me), rounds)
    }

    /// After the call's last step on `stream` (which has joined every stream of the call):
    /// the bound on its waits starts.
    pub(in crate::tp) fn watch(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.watch.as_ref().map_or(Ok(()), |w| w.enqueued(stream))
    }

    /// Make `stream` wait until every peer's chunks of the first `rounds` rounds are here.
    pub(in crate::tp) fn wait_rounds(&self, stream: &Arc<CudaStream>, rounds: u64) -> Result<()> {
        self.peers()
            .try_for_each(|c| wait_at_least(stream, self.ready(self.me, c), rounds))
    }

    /// On `stream`, after the copies before it: tell `peer` that the sums of this PE's rows
    /// of the first `rounds` rounds have landed in its output.
    pub(in crate::tp) fn announce_sums(
        &self,
        stream: &Arc<CudaStream>,
        peer: usize,
        rounds: u64,
    ) -> Result<()> {
        write(stream, self.done(peer, self.me), rounds)
    }

    /// Make `stream` wait for `peer`'s chunk.
    pub(in crate::tp) fn wait_from(&self, stream: &Arc<CudaStream>, peer: usize) -> Result<()> {
        wait_set(stream, self.ready(self.me, peer))
    }

    /// Make `stream` wait for every peer's chunk.
    pub(in crate::tp) fn wait_all(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.wait_rounds(stream, 1)
    }

    /// On `stream`, last in a call: wait for every peer's chunk (already seen where the
    /// work waited chunk by chunk; after a failure, so that no late chunk is cleared), then
    /// clear the `ready` flags.
    pub(in crate::tp) fn close(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.wait_all(stream)?;
        self.clear_ready(stream)
    }

    /// On `stream`, once every peer's chunks of the last round have been awaited there:
    /// clear the `ready` flags (no peer sends more in this call).
    pub(in crate::tp) fn clear_ready(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.peers()
            .try_for_each(|c| write(stream, self.ready(self.me, c), 0))
    }

    /// [`close`](Self::close) for an exchange in `rounds` rounds: unless
    /// [`clear_ready`](Self::clear_ready) was enqueued (on a stream this one has joined),
    /// wait for every peer's chunks of every round and clear those flags; where the peers
    /// also sent `sums`, wait for their sums of every round and clear those flags.
    pub(in crate::tp) fn close_rounds(
        &self,
        stream: &Arc<CudaStream>,
        rounds: u64,
        ready_cleared: bool,
        sums: bool,
    ) -> Result<()> {
        if !ready_cleared {
            self.wait_rounds(stream, rounds)?;
            self.clear_ready(stream)?;
        }
        if !sums {
            return Ok(());
        }
        self.peers()
            .try_for_each(|c| wait_at_least(stream, self.done(self.me, c), rounds))?;
        self.peers()
            .try_for_each(|c| write(stream, self.done(self.me, c), 0))
    }
}

/// `stream` waits until the flag at `addr` is set (at least 1).
fn wait_set(stream: &Arc<CudaStream>, addr: u64) -> Result<()> {
    wait_at_least(stream, addr, 1)
}

/// `stream` waits until the flag at `addr` is at least `value`.
fn wait_at_least(stream: &Arc<CudaStream>, addr: u64, value: u64) -> Result<()> {
    let geq = sys::CUstreamWaitValue_flags_enum::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: `addr` is a flag of symmetric memory mapped here; freeing it is collective
    // and waits for all work of this PE's GPU first.
    unsafe { sys::cuStreamWaitValue64_v2(stream.cu_stream(), addr, value, geq) }
        .result()
        .during("cuStreamWaitValue64")
}

/// `stream` writes `value` to the flag at `addr`, after everything before it on `stream`
/// (the default flags include a memory barrier: the data copied before is visible first).
fn write(stream: &Arc<CudaStream>, addr: u64, value: u64) -> Result<()> {
    let fenced = sys::CUstreamWriteValue_flags_enum::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // SAFETY: as in `wait_at_least`.
    unsafe { sys::cuStreamWriteValue64_v2(stream.cu_stream(), addr, value, fenced) }
        .result()
        .during("cuStreamWriteValue64")
}

/// Whether this PE's GPU takes 64-bit stream memory operations (all GPUs of compute
/// capability 7.0 and later with CUDA 12 drivers).
pub(in crate::tp) fn stream_memops(shmem: &Nvshmem) -> Result<bool> {
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS;
    Ok(shmem
        .context()
        .attribute(attr)
        .during("cuDeviceGetAttribute")?
        != 0)
}
