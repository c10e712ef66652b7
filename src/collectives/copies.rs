//! The copy-engine paths of the collectives that move data without reducing it (all-gather,
//! broadcast, all-to-all): the copies each PE makes to its peers, as peer `cuMemcpyAsync`s
//! that the driver gives to the copy engines, between an opening and a closing barrier
//! kernel; its copy into its own output by the SMs meanwhile. One way over NVLink the copy
//! engines outrun SM stores on large messages, and they leave the SMs free.

use super::plan::copy_grid;
use super::Collectives;
use crate::error::{CudaResultExt, Result};
use crate::module::{grid, Function, KernelArgs, LaunchOptions};
use cudarc::driver::{result, CudaStream};
use std::sync::Arc;

/// One copy of a call: `bytes` from `src` (this PE's memory) to `dst` (this PE's or a peer's,
/// as mapped here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PeerCopy {
    pub(super) dst: u64,
    pub(super) src: u64,
    pub(super) bytes: usize,
    /// Into this PE's own memory (by the SMs).
    pub(super) local: bool,
}

impl Collectives {
    /// Where the symmetric address `addr` (of this PE) lives on `pe`, as mapped here: the
    /// same offset from our control words there (every PE's symmetric heap has the same
    /// layout, and every peer is mapped: checked at construction).
    fn on_pe(&self, addr: u64, pe: usize) -> u64 {
        self.ctrl_peers[pe].wrapping_add(addr.wrapping_sub(self.ctrl.device_ptr()))
    }

    /// The peers in the order this PE serves them: the next PE first, itself last (so that
    /// the PEs do not all write into PE 0 first).
    fn destinations(&self) -> impl Iterator<Item = usize> {
        let (n, me) = (self.dims.n_pes, self.shmem.my_pe());
        (1..=n).map(move |k| (me + k) % n)
    }

    /// A copy of `bytes` from `src` here to `dst` (an address of this PE) on PE `pe`.
    fn copy_to(&self, pe: usize, dst: u64, src: u64, bytes: usize) -> PeerCopy {
        PeerCopy {
            dst: self.on_pe(dst, pe),
            src,
            bytes,
            local: pe == self.shmem.my_pe(),
        }
    }

    /// An all-gather of `bytes` per PE: this PE's input into its block of every PE's output.
    pub(super) fn all_gather_copies(&self, dst: u64, src: u64, bytes: usize) -> Vec<PeerCopy> {
        let at = (self.shmem.my_pe() * bytes) as u64;
        self.destinations()
            .map(|p| self.copy_to(p, dst + at, src, bytes))
            .collect()
    }

    /// A broadcast of `bytes` from `root`: the root's input into every PE's output (its own
    /// unless in place); nothing on the other PEs.
    pub(super) fn broadcast_copies(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        root: usize,
    ) -> Vec<PeerCopy> {
        if self.shmem.my_pe() != root {
            return Vec::new();
        }
        self.destinations()
            .map(|p| self.copy_to(p, dst, src, bytes))
            .filter(|c| c.dst != c.src)
            .collect()
    }

    /// An all-to-all of `bytes` per block: block `p` of this PE's input into block `me` of PE
    /// `p`'s output.
    pub(super) fn all_to_all_copies(&self, dst: u64, src: u64, bytes: usize) -> Vec<PeerCopy> {
        let at = (self.shmem.my_pe() * bytes) as u64;
        self.destinations()
            .map(|p| self.copy_to(p, dst + at, src + (p * bytes) as u64, bytes))
            .collect()
    }

    /// Launch a copy-engine call on `stream`: the opening barrier, each copy to a peer on a
    /// copy stream of its own (forked from `stream`) and the copy into this PE's output by a
    /// kernel on `stream`, the join, the closing barrier. After a failure to enqueue a copy
    /// the rest is still joined and the closing barrier still launched, so that no peer waits
    /// for ever (this PE's output is then wrong, and the error returned).
    pub(super) fn launch_copies(
        &self,
        copies: &[PeerCopy],
        options: LaunchOptions,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let barrier = |function: &Function| -> Result<()> {
            let mut args = KernelArgs::new();
            args.device_ptr(self.ctrl.device_ptr())
                .device_ptr(self.flags.device_ptr());
            let threads = self.dims.n_pes.next_multiple_of(32) as u32;
            // SAFETY: the barrier's parameters; the control words and flags live as long as
            // this Collectives, whose drop waits for the device.
            unsafe { function.launch_with(grid(1, threads), options, stream, &mut args) }
        };
        barrier(&self.ce_open)?;
        let (local, remote): (Vec<PeerCopy>, Vec<PeerCopy>) = copies.iter().partition(|c| c.local);
        let mut sent = Ok(());
        let used = &self.copy_streams[..remote.len().min(self.copy_streams.len())];
        for (c, side) in remote.iter().zip(used) {
            sent = sent.and_then(|()| {
                side.join(stream).during("cuStreamWaitEvent")?;
                // SAFETY: both ranges were checked against the views of the call, which
                // outlive it; a peer writes its output only after the opening barrier.
                unsafe { result::memcpy_dtod_async(c.dst, c.src, c.bytes, side.cu_stream()) }
                    .during("cuMemcpyDtoDAsync")
            });
        }
        for c in &local {
            sent = sent.and_then(|()| {
                let (blocks, threads) = copy_grid(c.bytes, &self.dims);
                let mut args = KernelArgs::new();
                args.device_ptr(c.src).device_ptr(c.dst).value(c.bytes);
                // SAFETY: the kernel's parameters; both ranges lie in the call's views.
                unsafe {
                    self.ce_local_copy.launch_with(
                        grid(blocks, threads),
                        options,
                        stream,
                        &mut args,
                    )
                }
            });
        }
        let joined = used
            .iter()
            .try_for_each(|side| stream.join(side).during("cuStreamWaitEvent"));
        let closed = barrier(&self.ce_close);
        sent.and(joined).and(closed)
    }
}
