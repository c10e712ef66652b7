//! The collectives that move data without reducing it: the broadcast (one PE's buffer to
//! every PE) and the all-to-all (every PE's blocks to their owners, the exchange of
//! mixture-of-experts dispatch and combine).

use super::agree::Collective;
use super::algo::{Algo, AllToAllAlgo, BroadcastAlgo};
use super::plan::{all_to_all_plan, all_to_all_v_plan, broadcast_plan};
use super::{planned, planned_copies, planned_team, Collectives, Planned, Work, TEAM_ROW};
use crate::abi;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::memory::{check_len, SymmetricView};
use crate::team::collectives::check_overlap;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// Bytes up to which [`BroadcastAlgo::Auto`] takes the one-shot path (one handshake, plus a
/// local copy out of staging on every PE) rather than the push (two barriers, no copy),
/// above the low-latency path's threshold (or where that path cannot run).
/// Measured on 2 H100s (NVLink, graph replays): 8.1 us at 1 MiB and 12.4 at 2 MiB, against
/// 10.4 and 13.3 for the push.
pub const BROADCAST_ONESHOT_BYTES: usize = 2 << 20;

/// Bytes per block up to which [`AllToAllAlgo::Auto`] takes the one-shot path on 2 PEs
/// ([`Thresholds::alltoall_oneshot_max_bytes`](super::Thresholds::alltoall_oneshot_max_bytes)),
/// above the low-latency path's threshold. Measured on 2 H100s: 9.6 us for 1 MiB blocks,
/// against 10.6 for the push.
pub const ALL_TO_ALL_ONESHOT_BYTES: usize = 1 << 20;

impl Collectives {
    /// `dst = src on PE root`, on every PE, for any element type. `dst` and `src` have the
    /// same length on every PE (`src` is read on the root only) and may be the same buffer
    /// (in place); they must not otherwise overlap.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{BroadcastAlgo, Collectives};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let coll = Collectives::new(&shmem)?;
    /// let weights = shmem.malloc::<nvshmem::bf16>(4096)?;
    /// // PE 0's weights everywhere, in place.
    /// coll.broadcast(&weights, &weights, 0, BroadcastAlgo::Auto, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn broadcast<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        root: usize,
        algo: BroadcastAlgo,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        self.call(|| self.plan_broadcast(&dst, &src, root, algo), stream)
    }

    /// The algorithm `Auto` picks for a broadcast of `bytes`.
    pub fn choose_broadcast(&self, bytes: usize) -> BroadcastAlgo {
        let t = &self.thresholds;
        let relays = bytes >= t.broadcast_relay_min_bytes && self.dims.n_pes > 2;
        if bytes >= t.copy_engine_min_bytes && !relays {
            BroadcastAlgo::CopyEngine
        } else if bytes <= t.broadcast_ll_max_bytes && self.tables.is_some() {
            if bytes >= t.broadcast_ll_relay_min_bytes && self.dims.n_pes > 2 {
                BroadcastAlgo::LowLatencyRelay
            } else {
                BroadcastAlgo::LowLatency
            }
        } else if relays {
            BroadcastAlgo::Relay
        } else if bytes <= BROADCAST_ONESHOT_BYTES.min(self.dims.staging_slot_bytes) {
            BroadcastAlgo::OneShot
        } else {
            BroadcastAlgo::Push
        }
    }

    /// Check and plan a broadcast on this PE.
    fn plan_broadcast<'f, T: Element>(
        &'f self,
        dst: &SymmetricView<'f, T>,
        src: &SymmetricView<'f, T>,
        root: usize,
        algo: BroadcastAlgo,
    ) -> Result<Planned<'f>> {
        if root >= self.dims.n_pes {
            return Err(Error::PeOutOfRange {
                pe: root,
                n_pes: self.dims.n_pes,
            });
        }
        self.check_view(src, "the broadcast source")?;
        self.check_view(dst, "the broadcast destination")?;
        check_len(
            "broadcast destination (the source's length)",
            src.len(),
            dst.len(),
        )?;
        check_overlap("broadcast", dst, src, true)?;
        let bytes = src.num_bytes();
        let c = Collective::Broadcast;
        if let Some(team) = self.nvshmem_route(algo == BroadcastAlgo::Auto, c)? {
            let record = self
                .call_record(c, None, TEAM_ROW, dst, src, src.len())
                .with_root(root);
            let (dst, src) = (*dst, *src);
            let call = move |s: &Arc<CudaStream>| team.broadcast(dst, src, root, s);
            return Ok(planned_team(record, bytes == 0, call));
        }
        let algo = match algo {
            BroadcastAlgo::Auto => self.choose_broadcast(bytes),
            a => a,
        };
        let row = algo.index().expect("Auto was resolved");
        let record = self
            .call_record(Collective::Broadcast, None, row, dst, src, src.len())
            .with_root(root);
        if algo == BroadcastAlgo::CopyEngine {
            let (dst, src) = (dst.as_ptr() as u64, src.as_ptr() as u64);
            return Ok(planned_copies(record, bytes == 0, || {
                self.broadcast_copies(dst, src, bytes, root)
            }));
        }
        planned(record, bytes == 0, || {
            self.plan_launch(
                &self.broadcast[row],
                &algo,
                super::algo::BROADCAST_ROWS[row].params,
                broadcast_plan(algo, bytes, root, &self.dims),
                (src.as_ptr() as u64, dst.as_ptr() as u64),
                bytes,
                bytes,
            )
        })
    }

    /// All-to-all with equal blocks, for any element type: `src` and `dst` hold `n_pes`
    /// blocks of `len / n_pes` elements; block `q` of PE `p`'s `src` becomes block `p` of PE
    /// `q`'s `dst`. `dst` and `src` have the same length on every PE and must not overlap.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{AllToAllAlgo, Collectives};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let coll = Collectives::new(&shmem)?;
    /// let per_pe = 128 * 4096; // tokens x hidden for each expert's PE
    /// let send = shmem.malloc::<nvshmem::bf16>(per_pe * shmem.n_pes())?;
    /// let recv = shmem.malloc::<nvshmem::bf16>(per_pe * shmem.n_pes())?;
    /// coll.all_to_all(&recv, &send, AllToAllAlgo::Auto, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn all_to_all<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        algo: AllToAllAlgo,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        self.call(|| self.plan_all_to_all(&dst, &src, algo), stream)
    }

    /// The algorithm `Auto` picks for an all-to-all of `bytes` per block.
    pub fn choose_all_to_all(&self, bytes: usize) -> AllToAllAlgo {
        let t = &self.thresholds;
        if bytes >= t.alltoall_copy_engine_min_bytes {
            AllToAllAlgo::CopyEngine
        } else if bytes <= t.alltoall_ll_max_bytes && self.tables.is_some() {
            AllToAllAlgo::LowLatency
        } else if bytes
            <= t.alltoall_oneshot_max_bytes
                .min(self.dims.staging_slot_bytes)
        {
            AllToAllAlgo::OneShot
        } else {
            AllToAllAlgo::Push
        }
    }

    /// Check and plan an all-to-all on this PE.
    pub(super) fn plan_all_to_all<'f, T: Element>(
        &'f self,
        dst: &SymmetricView<'f, T>,
        src: &SymmetricView<'f, T>,
        algo: AllToAllAlgo,
    ) -> Result<Planned<'f>> {
        let n = self.dims.n_pes;
        self.check_view(src, "the all_to_all source")?;
        self.check_view(dst, "the all_to_all destination")?;
        check_len(
            "all_to_all destination (the source's length)",
            src.len(),
            dst.len(),
        )?;
        if !src.len().is_multiple_of(n) {
            return Err(Error::InvalidArgument(format!(
                "an all_to_all of {} elements over {n} PEs: the buffers hold one equal block per \
                 PE, so their length must be a multiple of {n}",
                src.len()
            )));
        }
        check_overlap("all_to_all", dst, src, false)?;
        let block = src.len() / n;
        let bytes = block * std::mem::size_of::<T>();
        let c = Collective::AllToAll;
        if let Some(team) = self.nvshmem_route(algo == AllToAllAlgo::Auto, c)? {
            let record = self.call_record(c, None, TEAM_ROW, dst, src, block);
            let (dst, src) = (*dst, *src);
            let call = move |s: &Arc<CudaStream>| team.all_to_all(dst, src, s);
            return Ok(planned_team(record, bytes == 0, call));
        }
        let algo = match algo {
            AllToAllAlgo::Auto => self.choose_all_to_all(bytes),
            a => a,
        };
        let row = algo.index().expect("Auto was resolved");
        let record = self.call_record(Collective::AllToAll, None, row, dst, src, block);
        if algo == AllToAllAlgo::CopyEngine {
            let (dst, src) = (dst.as_ptr() as u64, src.as_ptr() as u64);
            return Ok(planned_copies(record, bytes == 0, || {
                self.all_to_all_copies(dst, src, bytes)
            }));
        }
        planned(record, bytes == 0, || {
            self.plan_launch(
                &self.all_to_all[row],
                &algo,
                super::algo::ALL_TO_ALL_ROWS[row].params,
                all_to_all_plan(algo, bytes, &self.dims),
                (src.as_ptr() as u64, dst.as_ptr() as u64),
                bytes,
                bytes,
            )
        })
    }
}

impl Collectives {
    /// All-to-all with counts, for any element type (the exchange of mixture-of-experts
    /// dispatch and combine): this PE sends `send_counts[q]` elements to PE `q`, packed in PE
    /// order at the start of `src`, and receives `recv_counts[p]` elements from PE `p`,
    /// packed in PE order at the start of `dst`. Every PE calls it, also one that sends and
    /// receives nothing. PE `p`'s `send_counts[q]` must be PE `q`'s `recv_counts[p]`: a pair
    /// that disagrees moves nothing (no store past what the receiver expects), and the next
    /// call or [`check`](Self::check) on either PE returns [`Error::CollectiveMismatch`]
    /// naming both. `dst` and `src` must not overlap.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::Collectives;
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let coll = Collectives::new(&shmem)?;
    /// let n = shmem.n_pes();
    /// // 3 elements to every PE, 3 from every PE.
    /// let (send, recv) = (shmem.malloc::<f32>(3 * n)?, shmem.malloc::<f32>(3 * n)?);
    /// coll.all_to_all_v(&recv, &vec![3; n], &send, &vec![3; n], shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn all_to_all_v<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        recv_counts: &[usize],
        src: impl Into<SymmetricView<'a, T>>,
        send_counts: &[usize],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        self.call(
            || self.plan_all_to_all_v(&dst, recv_counts, &src, send_counts),
            stream,
        )
    }

    /// Check and plan an all-to-all with counts on this PE.
    fn plan_all_to_all_v<T: Element>(
        &self,
        dst: &SymmetricView<'_, T>,
        recv_counts: &[usize],
        src: &SymmetricView<'_, T>,
        send_counts: &[usize],
    ) -> Result<Planned<'_>> {
        let n = self.dims.n_pes;
        self.check_view(src, "the all_to_all_v source")?;
        self.check_view(dst, "the all_to_all_v destination")?;
        let mut counts = abi::Counts {
            send: [0; abi::COLL_MAX_PES as usize],
            recv: [0; abi::COLL_MAX_PES as usize],
        };
        for (what, given, view_len, into) in [
            (
                "all_to_all_v send_counts",
                send_counts,
                src.len(),
                &mut counts.send,
            ),
            (
                "all_to_all_v recv_counts",
                recv_counts,
                dst.len(),
                &mut counts.recv,
            ),
        ] {
            check_len(what, n, given.len())?;
            let total = given
                .iter()
                .try_fold(0usize, |t, &c| t.checked_add(c))
                .unwrap_or(usize::MAX);
            if total > view_len {
                return Err(Error::InvalidArgument(format!(
                    "{what} add up to {total} elements, more than the {view_len} of its buffer"
                )));
            }
            for (slot, &c) in into.iter_mut().zip(given) {
                *slot = c as u64;
            }
        }
        check_overlap("all_to_all_v", dst, src, false)?;
        // Every PE launches, whatever it sends: the others may send to it.
        let record = self.call_record(Collective::AllToAllV, None, 0, dst, src, 0);
        let mut launch = self.plan_launch(
            &self.all_to_all_v,
            &AllToAllAlgo::Push,
            super::algo::Params::CountsTable,
            all_to_all_v_plan(&self.dims),
            (src.as_ptr() as u64, dst.as_ptr() as u64),
            std::mem::size_of::<T>(),
            0,
        )?;
        launch.args.value(counts);
        Ok(Planned {
            record,
            launch: Some(Work::Kernel(launch)),
        })
    }
}
