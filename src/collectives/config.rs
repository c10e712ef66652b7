//! The two kinds of configuration of our collectives, kept apart: the [`Workspace`] sizes
//! the symmetric memory once, at construction; the [`Thresholds`] pick an algorithm for each
//! `Auto` call and must fit the workspace (raising one is an error until the workspace
//! grows too, never a silent allocation).

use super::algo::{AllGatherAlgo, AllReduceAlgo, ReduceScatterAlgo};
use super::movement::ALL_TO_ALL_ONESHOT_BYTES;
use super::plan::{
    all_gather_plan, all_reduce_plan, ll_max_input, ll_twoshot_slot_bytes,
    sentinel_twoshot_slot_bytes, Dims, BW_STAGING_BYTES,
};
use crate::element::DataType;
use crate::error::{Error, Result};
use crate::runtime::parse_seconds;
use std::time::Duration;

/// Bytes per destination from which the moves take the copy engines. Measured on 2 H100s
/// (NVLink 4, graph replays), against the SM paths: all-gather 193.6 / 192.9 us at 64 MiB
/// per PE, 365.7 / 376.5 at 128 MiB; broadcast 189.4 / 190.7 at 64 MiB, 357.9 / 372.7 at
/// 128 MiB, 695.7 / 737.6 at 256 MiB; all-to-all 195.1 / 199.7 with 64 MiB blocks, 109.4 /
/// 105.4 with 32 MiB ones. On 4 H200s (each PE's copies one after another, next PE first)
/// the all-gather took 548.5 us at 64 MiB per PE against 577.2 for the SM path, and 158.4
/// against 150.2 at 16 MiB. Their broadcast sends the whole message to every peer, as the
/// push does, so on more than 2 PEs the relay (which sends it out once) goes first.
const COPY_ENGINE_MIN_BYTES: usize = 64 << 20;

/// All-to-all blocks from which more than 2 PEs take the copy engines. Measured on 4 H200s
/// (graph replays, each PE's copies one after another, next PE first): 548.5 us with 16 MiB
/// blocks against 594.6 for the push, 159.9 against 156.2 with 4 MiB ones.
const ALL_TO_ALL_COPY_ENGINE_MIN_BYTES: usize = 16 << 20;

/// Broadcasts from which more than 2 PEs take the relayed low-latency lines. Measured on 4
/// H200s (graph replays), us at 32 / 64 / 128 / 256 KiB: relayed 3.36 / 3.45 / 3.66 / 4.08,
/// direct 2.97 / 3.22 / 3.77 / 5.84 (the root's links carry 3 copies of the lines there).
const LL_RELAY_MIN_BYTES: usize = 128 << 10;

/// Broadcasts from which more than 2 PEs take the relay. Measured on 4 H200s (graph
/// replays): 19.6 us at 2 MiB against 23.3 for the one-shot and the push; 14.9 at 1 MiB
/// against 13.6 for the one-shot.
const RELAY_MIN_BYTES: usize = 2 << 20;

/// Size thresholds of the automatic choice (the `Auto` algorithm of every collective), in
/// bytes per PE (per block for the all-to-all). Every PE must use the same.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Thresholds {
    /// Floating-point all-reduce inputs above this, up to `sentinel_max_bytes`, use the
    /// sentinel one-shot; those up to it use the low-latency one-shot, a little faster for a
    /// vector or two.
    pub sentinel_min_bytes: usize,
    /// See `sentinel_min_bytes`.
    pub sentinel_max_bytes: usize,
    /// Floating-point all-reduce inputs above `sentinel_max_bytes`, up to this, use the
    /// sentinel two-shot.
    pub sentinel_twoshot_max_bytes: usize,
    /// All-reduce inputs up to this (for floating-point types: outside the sentinel range)
    /// use the low-latency one-shot.
    pub ll_max_bytes: usize,
    /// All-reduce inputs up to this (above low-latency) use the low-latency two-shot.
    pub ll_twoshot_max_bytes: usize,
    /// All-reduce inputs up to this (above low-latency two-shot) use one-shot.
    pub oneshot_max_bytes: usize,
    /// All-reduce inputs up to this (above one-shot) use two-shot; larger ones the bandwidth
    /// path.
    pub twoshot_max_bytes: usize,
    /// All-gather inputs up to this use the low-latency one-shot.
    pub allgather_ll_max_bytes: usize,
    /// All-gather inputs up to this (above low-latency) use one-shot; larger ones the
    /// bandwidth path.
    pub allgather_oneshot_max_bytes: usize,
    /// Reduce-scatter outputs (a PE's block) up to this use the low-latency path; larger
    /// ones the pull.
    pub reducescatter_ll_max_bytes: usize,
    /// Broadcasts up to this use the low-latency path; larger ones the
    /// one-shot (up to [`BROADCAST_ONESHOT_BYTES`](super::BROADCAST_ONESHOT_BYTES)) or the
    /// push.
    pub broadcast_ll_max_bytes: usize,
    /// All-to-all blocks up to this use the low-latency path; larger ones the one-shot (up
    /// to `alltoall_oneshot_max_bytes`) or the push.
    pub alltoall_ll_max_bytes: usize,
    /// All-to-all blocks up to this (above low-latency, and within the staging slot) use
    /// the one-shot; larger ones the push.
    pub alltoall_oneshot_max_bytes: usize,
    /// Broadcasts of at least this, up to `broadcast_ll_max_bytes`, take the relayed
    /// low-latency lines on more than 2 PEs; `usize::MAX`: never.
    pub broadcast_ll_relay_min_bytes: usize,
    /// Broadcasts of at least this (above the low-latency path) take the relay on more than
    /// 2 PEs; `usize::MAX`: never.
    pub broadcast_relay_min_bytes: usize,
    /// All-gathers (bytes per PE) and broadcasts of at least this go by the copy engines
    /// (`CopyEngine`; not the broadcasts that the relay takes); `usize::MAX`: never.
    pub copy_engine_min_bytes: usize,
    /// All-to-alls of blocks of at least this go by the copy engines; `usize::MAX`: never.
    pub alltoall_copy_engine_min_bytes: usize,
}

impl Thresholds {
    /// Defaults measured on H200s connected by NVSwitch (see docs/benchmarks.md).
    pub fn for_pes(n_pes: usize) -> Self {
        if n_pes <= 2 {
            // 2 PEs (graph replays): floating point takes the low-latency one-shot to 2 KiB
            // and the sentinel one-shot to 2 MiB (1 MiB: 5.7 us against 8.2 for the flag
            // one-shot and 6.5 for the sentinel two-shot); i32 the low-latency one-shot to
            // 512 KiB and the flag one-shot to 1 MiB. A two-shot moves as much as a one-shot
            // on 2 PEs, so the low-latency two-shots are never chosen; the two-shot to
            // 32 MiB, the store-only bandwidth path above. All-gather: low-latency to
            // 512 KiB per PE, bandwidth above. On 2 H100s: the low-latency reduce-scatter
            // 5.8 us for 512 KiB blocks (the pull 10.4), the low-latency all-to-all 5.9 us
            // for 512 KiB blocks (the one-shot 7.3), the low-latency broadcast 2.8-3.5 us
            // up to 256 KiB and 4.7 us at 512 KiB (the one-shot 5.2-6.5).
            Thresholds {
                sentinel_min_bytes: 2 << 10,
                sentinel_max_bytes: 2 << 20,
                sentinel_twoshot_max_bytes: 2 << 20,
                ll_max_bytes: 512 << 10,
                ll_twoshot_max_bytes: 512 << 10,
                oneshot_max_bytes: 1 << 20,
                twoshot_max_bytes: 32 << 20,
                allgather_ll_max_bytes: 512 << 10,
                allgather_oneshot_max_bytes: 512 << 10,
                reducescatter_ll_max_bytes: 512 << 10,
                broadcast_ll_max_bytes: 512 << 10,
                alltoall_ll_max_bytes: 512 << 10,
                alltoall_oneshot_max_bytes: ALL_TO_ALL_ONESHOT_BYTES,
                broadcast_ll_relay_min_bytes: usize::MAX,
                broadcast_relay_min_bytes: usize::MAX,
                copy_engine_min_bytes: COPY_ENGINE_MIN_BYTES,
                alltoall_copy_engine_min_bytes: COPY_ENGINE_MIN_BYTES,
            }
        } else {
            // 4 PEs (graph replays): floating point takes the low-latency one-shot to 2 KiB,
            // the sentinel one-shot to 128 KiB (64 KiB: 4.1 us against 4.5 for the sentinel
            // two-shot) and the sentinel two-shot to 2 MiB (256 KiB: 5.6 us against 6.1 for
            // the sentinel one-shot; 1 MiB: 8.4 against 12.5 for the two-shot; 2 MiB: 15.1
            // against 16.6); i32 the low-latency one-shot to 128 KiB and the low-latency
            // two-shot to 512 KiB. The flag one-shot is never chosen; the two-shot to
            // 32 MiB, the store-only bandwidth path above. All-gather: low-latency to
            // 256 KiB per PE, bandwidth above. The low-latency reduce-scatter, broadcast and
            // all-to-all take the all-gather's threshold (measured since: the reduce-scatter
            // 8.7 us for 256 KiB blocks against 10.2 for the pull, 15.2 against 11.9 for
            // 512 KiB ones; the broadcast 5.8 us at 256 KiB against 6.4 for the one-shot,
            // 10.3 against 8.6 at 512 KiB). All-to-all blocks above it take the push, not
            // the one-shot (11.0 us against 13.7 for 512 KiB blocks, 16.6 against 22.7 for
            // 1 MiB), and the copy engines from 16 MiB blocks. Broadcasts from 128 KiB take
            // the relayed lines, from 2 MiB the relay; all-gathers the copy engines from
            // 64 MiB per PE.
            Thresholds {
                sentinel_min_bytes: 2 << 10,
                sentinel_max_bytes: 128 << 10,
                sentinel_twoshot_max_bytes: 2 << 20,
                ll_max_bytes: 128 << 10,
                ll_twoshot_max_bytes: 512 << 10,
                oneshot_max_bytes: 512 << 10,
                twoshot_max_bytes: 32 << 20,
                allgather_ll_max_bytes: 256 << 10,
                allgather_oneshot_max_bytes: 256 << 10,
                reducescatter_ll_max_bytes: 256 << 10,
                broadcast_ll_max_bytes: 256 << 10,
                alltoall_ll_max_bytes: 256 << 10,
                alltoall_oneshot_max_bytes: 256 << 10,
                broadcast_ll_relay_min_bytes: LL_RELAY_MIN_BYTES,
                broadcast_relay_min_bytes: RELAY_MIN_BYTES,
                copy_engine_min_bytes: COPY_ENGINE_MIN_BYTES,
                alltoall_copy_engine_min_bytes: ALL_TO_ALL_COPY_ENGINE_MIN_BYTES,
            }
        }
    }

    /// The all-reduce algorithm `Auto` picks for `bytes` of `dtype` per PE; `tables` says
    /// whether the kernels that take a table of peer addresses can run (up to 16 PEs).
    pub fn choose_all_reduce(&self, dtype: DataType, bytes: usize, tables: bool) -> AllReduceAlgo {
        let float = matches!(dtype, DataType::F32 | DataType::F16 | DataType::BF16);
        let sentinel = float && tables && bytes > self.sentinel_min_bytes;
        if sentinel && bytes <= self.sentinel_max_bytes {
            AllReduceAlgo::Sentinel
        } else if sentinel && bytes <= self.sentinel_twoshot_max_bytes {
            AllReduceAlgo::SentinelTwoShot
        } else if bytes <= self.ll_max_bytes && tables {
            AllReduceAlgo::LowLatency
        } else if bytes <= self.ll_twoshot_max_bytes && tables {
            AllReduceAlgo::LowLatencyTwoShot
        } else if bytes <= self.oneshot_max_bytes {
            AllReduceAlgo::OneShot
        } else if bytes <= self.twoshot_max_bytes {
            AllReduceAlgo::TwoShot
        } else {
            AllReduceAlgo::Bandwidth
        }
    }

    /// The all-gather algorithm `Auto` picks for `bytes` per PE.
    pub fn choose_all_gather(&self, bytes: usize, tables: bool) -> AllGatherAlgo {
        if bytes >= self.copy_engine_min_bytes {
            AllGatherAlgo::CopyEngine
        } else if bytes <= self.allgather_ll_max_bytes && tables {
            AllGatherAlgo::LowLatency
        } else if bytes <= self.allgather_oneshot_max_bytes {
            AllGatherAlgo::OneShot
        } else {
            AllGatherAlgo::Bandwidth
        }
    }

    /// The reduce-scatter algorithm `Auto` picks for blocks of `bytes`.
    pub fn choose_reduce_scatter(&self, bytes: usize, tables: bool) -> ReduceScatterAlgo {
        if bytes <= self.reducescatter_ll_max_bytes && tables {
            ReduceScatterAlgo::LowLatency
        } else {
            ReduceScatterAlgo::Pull
        }
    }

    /// The largest input of the low-latency paths these thresholds pick (bytes per
    /// destination).
    fn ll_max(&self) -> usize {
        self.ll_max_bytes
            .max(self.allgather_ll_max_bytes)
            .max(self.reducescatter_ll_max_bytes)
            .max(self.broadcast_ll_max_bytes)
            .max(self.alltoall_ll_max_bytes)
    }

    /// Check that every algorithm these thresholds can pick fits its part of the workspace
    /// at the largest size it is picked for; the error names the threshold and the
    /// workspace field to raise.
    pub(crate) fn check_fits(&self, d: &Dims) -> Result<()> {
        let ar =
            |algo: AllReduceAlgo, bytes| (algo.to_string(), all_reduce_plan(algo, bytes, d).limit);
        let ag =
            |algo: AllGatherAlgo, bytes| (algo.to_string(), all_gather_plan(algo, bytes, d).limit);
        let checks = [
            (
                "sentinel_max_bytes",
                self.sentinel_max_bytes,
                ar(AllReduceAlgo::Sentinel, self.sentinel_max_bytes),
            ),
            (
                "sentinel_twoshot_max_bytes",
                self.sentinel_twoshot_max_bytes,
                ar(
                    AllReduceAlgo::SentinelTwoShot,
                    self.sentinel_twoshot_max_bytes,
                ),
            ),
            (
                "ll_max_bytes",
                self.ll_max_bytes,
                ar(AllReduceAlgo::LowLatency, self.ll_max_bytes),
            ),
            (
                "ll_twoshot_max_bytes",
                self.ll_twoshot_max_bytes,
                ar(AllReduceAlgo::LowLatencyTwoShot, self.ll_twoshot_max_bytes),
            ),
            (
                "oneshot_max_bytes",
                self.oneshot_max_bytes,
                ar(AllReduceAlgo::OneShot, self.oneshot_max_bytes),
            ),
            (
                "allgather_ll_max_bytes",
                self.allgather_ll_max_bytes,
                ag(AllGatherAlgo::LowLatency, self.allgather_ll_max_bytes),
            ),
            (
                "allgather_oneshot_max_bytes",
                self.allgather_oneshot_max_bytes,
                ag(AllGatherAlgo::OneShot, self.allgather_oneshot_max_bytes),
            ),
        ];
        // The other low-latency paths hold a destination's input in a lines slot.
        let ll = |what: &str| (format!("ll {what}"), ll_max_input(d.lines_slot_bytes));
        let checks = checks.into_iter().chain([
            (
                "reducescatter_ll_max_bytes",
                self.reducescatter_ll_max_bytes,
                ll("reduce-scatter"),
            ),
            (
                "broadcast_ll_max_bytes",
                self.broadcast_ll_max_bytes,
                ll("broadcast"),
            ),
            (
                "alltoall_ll_max_bytes",
                self.alltoall_ll_max_bytes,
                ll("all-to-all"),
            ),
        ]);
        for (field, bytes, (algo, limit)) in checks {
            if bytes > limit {
                return Err(Error::InvalidArgument(format!(
                    "Thresholds::{field} = {bytes} bytes, but the workspace holds {algo} inputs \
                     of at most {limit} bytes: lower the threshold, or size the workspace for it \
                     (Workspace::for_thresholds) in CollectivesConfig::workspace"
                )));
            }
        }
        Ok(())
    }
}

/// The symmetric memory of our collectives, allocated once by
/// [`Collectives::with_config`](super::Collectives::with_config): one staging slot, one
/// low-latency lines slot and one sentinel slot per PE and epoch parity. Explicitly chosen algorithms take any input that
/// fits; `Auto` never picks one that does not.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Workspace {
    /// Bytes of one staging slot: one-shot inputs whole, and the bandwidth all-reduce's
    /// chunk ring. A multiple of 256.
    pub staging_slot_bytes: usize,
    /// Bytes of one low-latency slot (a region no other path writes): low-latency inputs
    /// (per destination) twice over (a line carries 8 bytes in 16), a low-latency two-shot's
    /// part twice over in each half. A multiple of 256.
    pub lines_slot_bytes: usize,
    /// Bytes of one sentinel receive slot: a sentinel one-shot's input, or a two-shot's part
    /// in each half. A multiple of 256.
    pub sentinel_slot_bytes: usize,
    /// Bytes of the largest quantised input of a compressed all-reduce
    /// ([`Compression::workspace_bytes`](super::Compression::workspace_bytes)); the
    /// workspace holds it twice, and a PE's shard of it once more. 0 (the default) takes
    /// no memory and no compressed call.
    pub compressed_bytes: usize,
}

impl Workspace {
    /// The smallest workspace in which every algorithm `thresholds` can pick fits on
    /// `n_pes` PEs, and at least 2 MiB of staging and lines slot and 1 MiB of sentinel slot,
    /// room for explicitly chosen algorithms up to a MiB or more.
    pub fn for_thresholds(thresholds: &Thresholds, n_pes: usize) -> Self {
        let t = thresholds;
        // Low-latency lines carry 8 bytes of data in 16.
        let ll = (2 * t.ll_max() + 16).max(ll_twoshot_slot_bytes(t.ll_twoshot_max_bytes, n_pes));
        let staging = t
            .oneshot_max_bytes
            .max(t.allgather_oneshot_max_bytes)
            .max(BW_STAGING_BYTES)
            .max(2 << 20);
        let lines = ll.max(2 << 20);
        let sentinel = t
            .sentinel_max_bytes
            .max(sentinel_twoshot_slot_bytes(
                t.sentinel_twoshot_max_bytes,
                n_pes,
            ))
            .max(1 << 20);
        Workspace {
            staging_slot_bytes: staging.div_ceil(256) * 256,
            lines_slot_bytes: lines.div_ceil(256) * 256,
            sentinel_slot_bytes: sentinel.div_ceil(256) * 256,
            compressed_bytes: 0,
        }
    }

    /// Symmetric bytes it takes on each PE (every slot, per PE and parity); `None` when that
    /// does not fit a `usize`.
    pub fn bytes(&self, n_pes: usize) -> Option<usize> {
        let compressed = self
            .compressed_bytes
            .checked_next_multiple_of(256)?
            .checked_mul(2)?
            .checked_add(super::compressed::shard_room(self.compressed_bytes, n_pes))?;
        self.staging_slot_bytes
            .checked_add(self.lines_slot_bytes)?
            .checked_add(self.sentinel_slot_bytes)?
            .checked_mul(n_pes)?
            .checked_mul(2)?
            .checked_add(compressed)
    }

    pub(crate) fn check(&self, n_pes: usize) -> Result<()> {
        if self.bytes(n_pes).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{self:?} on {n_pes} PEs does not fit in memory (its size overflows)"
            )));
        }
        for (field, bytes, min) in [
            (
                "staging_slot_bytes",
                self.staging_slot_bytes,
                BW_STAGING_BYTES,
            ),
            ("lines_slot_bytes", self.lines_slot_bytes, 256),
            ("sentinel_slot_bytes", self.sentinel_slot_bytes, 256),
        ] {
            if bytes % 256 != 0 || bytes < min {
                return Err(Error::InvalidArgument(format!(
                    "Workspace::{field} = {bytes}: it must be a multiple of 256 and at least \
                     {min} bytes"
                )));
            }
        }
        Ok(())
    }
}

/// Everything [`Collectives::with_config`](super::Collectives::with_config) takes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CollectivesConfig {
    /// What `Auto` picks; may change later with
    /// [`Collectives::set_thresholds`](super::Collectives::set_thresholds).
    pub thresholds: Thresholds,
    /// The symmetric memory allocated at construction.
    pub workspace: Workspace,
    /// Launch with programmatic stream serialization: a call may begin launching while the
    /// kernel before it on the stream runs, and waits on the device for that kernel to
    /// complete before it touches memory. This hides most of the launch latency between
    /// back-to-back kernels; `false` launches plainly.
    pub programmatic_launch: bool,
    /// Launch with the cooperative attribute: the driver starts a call only when all its
    /// blocks can be resident at once (beside whatever else runs on the GPU), or refuses it.
    /// Without it, the grid is still checked against the GPU's occupancy at every launch,
    /// and a call whose blocks wait behind other kernels finishes when those do, or fails
    /// with [`Error::Timeout`]. Off by default: it costs about 0.3 to 1 us per launch
    /// outside graphs (measured on one H100), and nothing measurable in a graph.
    pub cooperative_launch: bool,
    /// Before every call, the PEs exchange what they are about to do (operation, type,
    /// algorithm, length, where the buffers are) and refuse a call they disagree on with
    /// [`Error::CollectiveMismatch`] naming the difference, before anything moves. It costs
    /// a host round trip per call (puts of a record to every PE and host reads until every
    /// PE's has arrived, bounded by [`timeout`](Self::timeout); nothing of it waits on the
    /// GPU) and is skipped while the stream is captured into a graph. Every call becomes a
    /// host-side barrier: a program whose PEs wait for each other through work queued on a
    /// stream before a call must turn it off. On by default in debug builds.
    ///
    /// Without it, most mismatches are still caught, on the GPU and in graphs too: every
    /// call's handshake flags and low-latency lines carry a 16-bit signature of the
    /// collective, element type, operator, algorithm, length and root, a PE that finds a
    /// peer's differing stops the call before it uses what came, and that call's PEs get
    /// [`Error::CollectiveMismatch`] naming both PEs (from the next call or
    /// [`Collectives::check`]). Not so for PEs that pick different algorithms (they wait on
    /// different flags: [`Error::Timeout`]) or the sentinel all-reduce paths, which carry no
    /// signature (a length mismatch ends in [`Error::Timeout`]; an operator or type mismatch
    /// of the same byte length passes).
    ///
    /// [`Collectives::check`]: super::Collectives::check
    pub check_calls: bool,
    /// How long any wait of a call for a peer may last before the call gives up, records
    /// which PE it waited for, and every later call (and [`Collectives::check`]) returns
    /// [`Error::Timeout`]. `None`: no bound. Default: 10 minutes (as PyTorch's NCCL
    /// watchdog), or the seconds in `NVSHMEM_RS_TIMEOUT` (`0`: no bound). Every PE must use
    /// the same. It bounds our kernels' waits; on a team that is not one load/store domain
    /// ([`Reach`](super::Reach)) the calls are NVSHMEM's, which wait without a bound.
    ///
    /// A wait starts when the call starts on this GPU, so it includes the time a peer spends
    /// before it reaches the call (a checkpoint written by one rank while the others wait in
    /// the next all-reduce): keep the bound above the longest such gap.
    ///
    /// [`Collectives::check`]: super::Collectives::check
    pub timeout: Option<Duration>,
    /// The most blocks a call's kernel launches (most of them take a whole SM's registers),
    /// below the GPU's SM count. `None`: up to one per SM. Set it where other kernels that
    /// wait for peers run beside this `Collectives`' calls (channels, another `Collectives`,
    /// kernels of yours): a call that fills every SM leaves no room for them, and if their
    /// peers wait for them while this PE's peers wait for the call, both wait until the
    /// timeout. Every PE must use the same; at least 1.
    pub max_blocks: Option<usize>,
    /// Treat the team as load/store domains of this many consecutive team PEs at most, as
    /// if each were a node, whatever the hardware reaches: the calls then go through
    /// NVSHMEM's team collectives, as across nodes ([`Reach`](super::Reach)). For checking
    /// multi-node behaviour on one node. `None`: what the hardware reaches. Every PE must
    /// use the same; at least 1.
    pub domain_size: Option<usize>,
}

/// The default bound on a wait, and the variable that changes it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// Seconds (a decimal number) that bound every wait of our collectives; `0` for no bound.
pub const TIMEOUT_VARIABLE: &str = "NVSHMEM_RS_TIMEOUT";

/// The timeout `NVSHMEM_RS_TIMEOUT` asks for (`value`, if set), else the default.
pub(crate) fn timeout_from(value: Option<&str>) -> Result<Option<Duration>> {
    parse_seconds(TIMEOUT_VARIABLE, value, DEFAULT_TIMEOUT)
}

impl CollectivesConfig {
    /// The measured thresholds for this PE count, a workspace that fits them, programmatic
    /// launches, and per-call agreement in debug builds.
    ///
    /// ```
    /// use nvshmem::collectives::{CollectivesConfig, Workspace};
    /// let mut config = CollectivesConfig::for_pes(4);
    /// // The sentinel two-shot up to 8 MiB: grow the workspace with the threshold.
    /// config.thresholds.sentinel_twoshot_max_bytes = 8 << 20;
    /// config.workspace = Workspace::for_thresholds(&config.thresholds, 4);
    /// assert!(config.workspace.sentinel_slot_bytes >= 4 << 20);
    /// ```
    pub fn for_pes(n_pes: usize) -> Self {
        let thresholds = Thresholds::for_pes(n_pes);
        CollectivesConfig {
            workspace: Workspace::for_thresholds(&thresholds, n_pes),
            thresholds,
            programmatic_launch: true,
            cooperative_launch: false,
            check_calls: cfg!(debug_assertions),
            // A malformed variable keeps the default here; `Collectives::new` reports it.
            timeout: timeout_from(std::env::var(TIMEOUT_VARIABLE).ok().as_deref())
                .unwrap_or(Some(DEFAULT_TIMEOUT)),
            max_blocks: None,
            domain_size: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::{ll_twoshot_max_input, sentinel_twoshot_max_input};
    use super::*;

    fn dims(n_pes: usize, w: &Workspace) -> Dims {
        Dims {
            n_pes,
            sm_count: 132,
            bandwidth_max_blocks: 264,
            staging_slot_bytes: w.staging_slot_bytes,
            lines_slot_bytes: w.lines_slot_bytes,
            sentinel_slot_bytes: w.sentinel_slot_bytes,
            compressed_bytes: w.compressed_bytes,
        }
    }

    #[test]
    fn auto_thresholds_are_ordered_and_fit_the_default_workspace() {
        for n in [1, 2, 4, 8] {
            let c = CollectivesConfig::for_pes(n);
            let (t, w) = (&c.thresholds, &c.workspace);
            assert!(t.sentinel_min_bytes <= t.sentinel_max_bytes);
            assert!(t.sentinel_min_bytes <= t.ll_max_bytes);
            assert!(t.sentinel_max_bytes <= t.sentinel_twoshot_max_bytes);
            assert!(w.sentinel_slot_bytes >= t.sentinel_max_bytes);
            assert!(
                sentinel_twoshot_max_input(w.sentinel_slot_bytes, n)
                    >= t.sentinel_twoshot_max_bytes
            );
            assert!(t.ll_max_bytes <= t.ll_twoshot_max_bytes);
            assert!(t.ll_twoshot_max_bytes <= t.oneshot_max_bytes);
            assert!(t.oneshot_max_bytes <= t.twoshot_max_bytes);
            assert!(t.allgather_ll_max_bytes <= t.allgather_oneshot_max_bytes);
            assert!(ll_max_input(w.lines_slot_bytes) >= t.ll_max());
            // A slot holds a one-shot input, a low-latency input twice over, the chunk ring.
            let slot = w.staging_slot_bytes;
            assert!(slot >= t.oneshot_max_bytes && slot >= 2 * t.ll_max_bytes);
            assert!(slot >= BW_STAGING_BYTES);
            assert!(ll_twoshot_max_input(slot, n) >= t.ll_twoshot_max_bytes);
            assert_eq!(slot % 256, 0);
            assert!(w.check(n).is_ok());
            assert!(t.check_fits(&dims(n, w)).is_ok(), "{n} PEs");
            // A cap on the blocks (max_blocks) leaves every default threshold fitting.
            for blocks in [1, 8, 32] {
                let capped = Dims {
                    sm_count: blocks,
                    bandwidth_max_blocks: blocks,
                    ..dims(n, w)
                };
                assert!(t.check_fits(&capped).is_ok(), "{n} PEs, {blocks} blocks");
            }
        }
    }

    #[test]
    fn the_default_workspace_is_what_the_thresholds_always_sized() {
        // 6 MiB of staging (the chunk ring), 2 MiB of low-latency lines, and 1 MiB (4 PEs) or
        // 2 MiB (2 PEs) of sentinel slot.
        let w4 = CollectivesConfig::for_pes(4).workspace;
        assert_eq!(
            (
                w4.staging_slot_bytes,
                w4.lines_slot_bytes,
                w4.sentinel_slot_bytes
            ),
            (6 << 20, 2 << 20, 1 << 20)
        );
        let w2 = CollectivesConfig::for_pes(2).workspace;
        assert_eq!(
            (
                w2.staging_slot_bytes,
                w2.lines_slot_bytes,
                w2.sentinel_slot_bytes
            ),
            (6 << 20, 2 << 20, 2 << 20)
        );
        assert_eq!(w4.bytes(4), Some(2 * 4 * (9 << 20)));
    }

    #[test]
    fn the_timeout_comes_from_its_variable() {
        assert_eq!(timeout_from(None).unwrap(), Some(DEFAULT_TIMEOUT));
        assert_eq!(timeout_from(Some(" ")).unwrap(), Some(DEFAULT_TIMEOUT));
        assert_eq!(timeout_from(Some("0")).unwrap(), None);
        assert_eq!(
            timeout_from(Some("2.5")).unwrap(),
            Some(Duration::from_millis(2500))
        );
        for bad in ["-1", "soon", "inf", "NaN", "1e20"] {
            let e = timeout_from(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("NVSHMEM_RS_TIMEOUT"), "{e}");
        }
    }

    #[test]
    fn a_raised_threshold_needs_a_raised_workspace() {
        let mut c = CollectivesConfig::for_pes(4);
        c.thresholds.sentinel_twoshot_max_bytes = 8 << 20;
        let e = c
            .thresholds
            .check_fits(&dims(4, &c.workspace))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sentinel_twoshot_max_bytes") && e.contains("Workspace::for_thresholds"),
            "{e}"
        );
        c.workspace = Workspace::for_thresholds(&c.thresholds, 4);
        assert!(c.thresholds.check_fits(&dims(4, &c.workspace)).is_ok());
        assert!(c.workspace.sentinel_slot_bytes >= 4 << 20);
    }

    #[test]
    fn workspaces_are_checked() {
        let mut w = CollectivesConfig::for_pes(2).workspace;
        w.sentinel_slot_bytes = 1000;
        assert!(w
            .check(2)
            .unwrap_err()
            .to_string()
            .contains("multiple of 256"));
        w.sentinel_slot_bytes = 1024;
        w.staging_slot_bytes = 1 << 20;
        assert!(w
            .check(2)
            .unwrap_err()
            .to_string()
            .contains("staging_slot_bytes"));
        // Sizes whose total overflows are refused, not wrapped into a small allocation.
        w.staging_slot_bytes = usize::MAX / 2 / 256 * 256;
        assert!(w.bytes(4).is_none());
        assert!(w.check(4).unwrap_err().to_string().contains("overflows"));
    }

    #[test]
    fn auto_picks_by_size_type_and_tables() {
        let t = Thresholds::for_pes(4);
        assert_eq!(
            t.choose_all_reduce(DataType::BF16, 8, true),
            AllReduceAlgo::LowLatency
        );
        assert_eq!(
            t.choose_all_reduce(DataType::BF16, 64 << 10, true),
            AllReduceAlgo::Sentinel
        );
        assert_eq!(
            t.choose_all_reduce(DataType::F32, 1 << 20, true),
            AllReduceAlgo::SentinelTwoShot
        );
        assert_eq!(
            t.choose_all_reduce(DataType::I32, 256 << 10, true),
            AllReduceAlgo::LowLatencyTwoShot
        );
        assert_eq!(
            t.choose_all_reduce(DataType::BF16, 64 << 10, false),
            AllReduceAlgo::OneShot
        );
        assert_eq!(
            t.choose_all_reduce(DataType::F32, 64 << 20, true),
            AllReduceAlgo::Bandwidth
        );
        assert_eq!(t.choose_all_gather(4096, true), AllGatherAlgo::LowLatency);
        assert_eq!(t.choose_all_gather(4096, false), AllGatherAlgo::OneShot);
        assert_eq!(t.choose_all_gather(1 << 20, true), AllGatherAlgo::Bandwidth);
        assert_eq!(
            t.choose_reduce_scatter(8, true),
            ReduceScatterAlgo::LowLatency
        );
        assert_eq!(t.choose_reduce_scatter(8, false), ReduceScatterAlgo::Pull);
        // The copy engines from their threshold on; never when it is usize::MAX.
        let two = Thresholds::for_pes(2);
        for t in [&t, &two] {
            assert_eq!(
                t.choose_all_gather(64 << 20, true),
                AllGatherAlgo::CopyEngine
            );
            assert_eq!(
                t.choose_all_gather((64 << 20) - 1, true),
                AllGatherAlgo::Bandwidth
            );
        }
        let never = Thresholds {
            copy_engine_min_bytes: usize::MAX,
            ..t
        };
        assert_eq!(
            never.choose_all_gather(1 << 30, true),
            AllGatherAlgo::Bandwidth
        );
        assert!(t.alltoall_copy_engine_min_bytes < two.alltoall_copy_engine_min_bytes);
        assert_eq!(two.broadcast_relay_min_bytes, usize::MAX);
        assert_eq!(two.broadcast_ll_relay_min_bytes, usize::MAX);
        assert!(t.broadcast_ll_relay_min_bytes <= t.broadcast_ll_max_bytes);
        // The all-to-all's one-shot on 2 PEs only: on 4, the push above the low-latency path.
        assert_eq!(two.alltoall_oneshot_max_bytes, ALL_TO_ALL_ONESHOT_BYTES);
        assert_eq!(t.alltoall_oneshot_max_bytes, t.alltoall_ll_max_bytes);
        assert_eq!(
            t.choose_reduce_scatter(1 << 20, true),
            ReduceScatterAlgo::Pull
        );
    }

    #[test]
    fn a_low_latency_threshold_beyond_the_lines_slot_is_refused() {
        let mut c = CollectivesConfig::for_pes(2);
        c.thresholds.alltoall_ll_max_bytes = 4 << 20;
        let e = c
            .thresholds
            .check_fits(&dims(2, &c.workspace))
            .unwrap_err()
            .to_string();
        assert!(e.contains("alltoall_ll_max_bytes"), "{e}");
        c.workspace = Workspace::for_thresholds(&c.thresholds, 2);
        assert!(c.thresholds.check_fits(&dims(2, &c.workspace)).is_ok());
        assert!(ll_max_input(c.workspace.lines_slot_bytes) >= 4 << 20);
    }
}
