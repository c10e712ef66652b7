//! The copy-engine paths of the collectives that move data without reducing it (all-gather,
//! broadcast, all-to-all): the copies each PE makes to its peers, as peer `cuMemcpyAsync`s
//! that the driver gives to the copy engines, one after another on one copy stream, between
//! an opening and a closing barrier kernel; its copy into its own output, and the last
//! eighth of each copy to a peer, by the SMs meanwhile. One way over NVLink the copy engines
//! outrun SM stores on large messages; the SMs' stores beside them add to what the link
//! carries.

use super::plan::copy_grid;
use super::Collectives;
use crate::abi;
use crate::error::{CudaResultExt, Result};
use crate::module::{grid, Function, KernelArgs, LaunchOptions};
use cudarc::driver::{result, CudaStream};
use std::sync::Arc;

/// The SMs take `1 / SM_SHARE` of each copy to a peer (rounded down to 4 KiB), beside the
/// copy engines' share. Measured on 2 H200s (NVLink 4, graph replays, 128 MiB calls), µs
/// with the copy engines alone, an eighth by the SMs, a quarter and three eighths:
/// all-to-all 193.5, 188.2, 189.6, 230.5; all-gather 192.2, 188.2, 189.8, 230.6; broadcast
/// 356.3, 355.4, 358.1, 427.3. From a quarter on, the SMs' part and their copy into this
/// PE's own output, one after the other, take longer than the copy engines' part.
const SM_SHARE: usize = 8;

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
    /// This PE's number in the team (calls outside it fail before they copy).
    fn team_me(&self) -> usize {
        self.members.me().unwrap_or(0)
    }

    /// Where the symmetric address `addr` (of this PE) lives on `pe`, as mapped here: the
    /// same offset from our control words there (every PE's symmetric heap has the same
    /// layout, and every peer is mapped: checked at construction).
    fn on_pe(&self, addr: u64, pe: usize) -> u64 {
        self.ctrl_peers[pe].wrapping_add(addr.wrapping_sub(self.ctrl.addr()))
    }

    /// The peers in the order this PE serves them: the next PE first, itself last (so that
    /// the PEs do not all write into PE 0 first).
    fn destinations(&self) -> impl Iterator<Item = usize> {
        let (n, me) = (self.dims.n_pes, self.team_me());
        (1..=n).map(move |k| (me + k) % n)
    }

    /// A copy of `bytes` from `src` here to `dst` (an address of this PE) on PE `pe`.
    fn copy_to(&self, pe: usize, dst: u64, src: u64, bytes: usize) -> PeerCopy {
        PeerCopy {
            dst: self.on_pe(dst, pe),
            src,
            bytes,
            local: pe == self.team_me(),
        }
    }

    /// An all-gather of `bytes` per PE: this PE's input into its block of every PE's output.
    pub(super) fn all_gather_copies(&self, dst: u64, src: u64, bytes: usize) -> Vec<PeerCopy> {
        let at = (self.team_me() * bytes) as u64;
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
        if self.team_me() != root {
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
        let at = (self.team_me() * bytes) as u64;
        self.destinations()
            .map(|p| self.copy_to(p, dst + at, src + (p * bytes) as u64, bytes))
            .collect()
    }

    /// Launch a copy-engine call on `stream`: the opening barrier; the copies to the peers,
    /// in `copies`' order, one after another on the copy stream (forked from `stream`), each
    /// but for its last [`SM_SHARE`]th, which a kernel on `stream` copies with this PE's copy
    /// into its own output; the join; the closing barrier. Both barriers carry the call's
    /// signature `sig` (a peer that disagrees records a mismatch). After a failure to enqueue
    /// a copy the rest is still joined and the closing barrier still launched, so that no peer
    /// waits for ever, but with the signature no call has: every peer then records a mismatch
    /// instead of returning with this PE's block missing, and so does this PE. The closing
    /// barrier sends that signature too when this PE gave up a wait (its opening barrier's,
    /// say): queued copies cannot be called back, so they land in a late peer's output, and
    /// that peer must then fail the call rather than return what landed before it entered.
    ///
    /// One after another: the copy engines ran copies on a stream per peer side by side,
    /// which on 4 H200s took an all-gather of 64 MiB per PE to 228-238 GB/s out of each GPU
    /// (847-887 µs); in turn, every PE sending to the next PE first, to 367 GB/s (548.5 µs).
    pub(super) fn launch_copies(
        &self,
        copies: &[PeerCopy],
        sig: u32,
        options: LaunchOptions,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let barrier = |function: &Function, sig: u32| -> Result<()> {
            let mut args = KernelArgs::new();
            args.device_ptr(self.ctrl.addr())
                .device_ptr(self.flags.addr())
                .value(sig);
            let threads = self.dims.n_pes.next_multiple_of(32) as u32;
            // SAFETY: the barrier's parameters; the control words and flags live as long as
            // this Collectives, whose drop waits for the device.
            unsafe { function.launch_with(grid(1, threads), options, stream, &mut args) }
        };
        barrier(&self.ce_open, sig)?;
        let (local, remote): (Vec<PeerCopy>, Vec<PeerCopy>) = copies.iter().partition(|c| c.local);
        let side = &self.copy_stream;
        let mut sent = match remote.is_empty() {
            true => Ok(()),
            false => crate::order::join(side, stream),
        };
        let mut by_sms = Vec::new();
        for c in &remote {
            let (engine, sms) = split_for_sms(c);
            by_sms.extend(sms);
            sent = sent.and_then(|()| {
                // SAFETY: both ranges were checked against the views of the call, which
                // outlive it; a peer writes its output only after the opening barrier.
                unsafe {
                    result::memcpy_dtod_async(
                        engine.dst,
                        engine.src,
                        engine.bytes,
                        side.cu_stream(),
                    )
                }
                .during("cuMemcpyDtoDAsync")
            });
        }
        // Every peer is mapped here, so the SMs store into a peer as into this PE.
        for c in by_sms.iter().chain(&local) {
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
        // Joined only where forked: a capture must not wait on work outside it.
        let joined = match remote.is_empty() {
            true => Ok(()),
            false => crate::order::join(stream, side),
        };
        let sig = match (&sent, &joined) {
            (Ok(()), Ok(())) => sig,
            _ => abi::COLL_SIG_FAILED,
        };
        let closed = barrier(&self.ce_close, sig);
        sent.and(joined).and(closed)
    }
}

/// A copy to a peer cut in two: the copy engine's part, and the SMs' last [`SM_SHARE`]th
/// (none below `SM_SHARE` × 4 KiB).
fn split_for_sms(c: &PeerCopy) -> (PeerCopy, Option<PeerCopy>) {
    let sms = (c.bytes / SM_SHARE) & !4095;
    let engine = PeerCopy {
        bytes: c.bytes - sms,
        ..*c
    };
    let tail = (sms > 0).then(|| PeerCopy {
        dst: c.dst + engine.bytes as u64,
        src: c.src + engine.bytes as u64,
        bytes: sms,
        local: false,
    });
    (engine, tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sms_take_the_last_eighth_of_large_copies() {
        let c = PeerCopy {
            dst: 1 << 40,
            src: 1 << 30,
            bytes: 64 << 20,
            local: false,
        };
        let (engine, sms) = split_for_sms(&c);
        let sms = sms.unwrap();
        assert_eq!(engine.bytes + sms.bytes, c.bytes);
        assert_eq!(sms.bytes, 8 << 20);
        assert_eq!((engine.dst, engine.src), (c.dst, c.src));
        assert_eq!(sms.dst, c.dst + engine.bytes as u64);
        assert_eq!(sms.src, c.src + engine.bytes as u64);
        assert_eq!(sms.bytes % 4096, 0);
        // An odd size: the SMs' part is whole 4 KiB pages, the engine takes the rest.
        let odd = PeerCopy {
            bytes: 1_000_003,
            ..c
        };
        let (engine, sms) = split_for_sms(&odd);
        let sms = sms.unwrap();
        assert_eq!(sms.bytes, 122_880);
        assert_eq!(engine.bytes + sms.bytes, odd.bytes);
        // Small copies stay whole on the copy engine.
        let small = PeerCopy { bytes: 32767, ..c };
        assert_eq!(split_for_sms(&small), (small, None));
    }
}
