//! The algorithms of our collectives as types: one row per algorithm, from which the
//! dispatch (kernel names, parameters, which types it takes) and every command line
//! (`ALL`, `FromStr`, `Display`) derive.

use crate::element::{DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// All-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllReduceAlgo {
    /// Chosen by size, PE count and element type ([`Thresholds`](super::Thresholds)).
    Auto,
    /// One-shot of the raw data into receive buffers pre-filled with a sentinel (an all-ones
    /// NaN pattern): readers poll the data itself until no word is the sentinel, then refill.
    /// No flags and no doubled bytes; for `f32`, `f16` and `bf16` only (an `i32` can be any
    /// pattern). A NaN input with all bits set is sent, and reduced, as another NaN.
    Sentinel,
    /// Reduce-scatter, then all-gather, both into sentinel-filled receive buffers: each PE
    /// pushes every part of its input to the part's owner, the owner reduces it and pushes
    /// the result to every PE. For three or more PEs it moves 2 (n - 1) / n times the input
    /// where the sentinel one-shot moves n - 1 times, for one more hop (medium messages);
    /// `f32`, `f16` and `bf16` only.
    SentinelTwoShot,
    /// One-shot with the flags packed into the data (each 16-byte store carries 8 bytes and
    /// the call's epoch), so readers poll the data itself: no fence, no separate flag round.
    /// Moves twice the bytes; for the smallest messages.
    LowLatency,
    /// Reduce-scatter, then all-gather, both in low-latency lines: each PE pushes every part
    /// of its input to the part's owner, the owner reduces it and pushes the result to every
    /// PE. For three or more PEs it moves 2 (n - 1) / n times the input where the one-shot
    /// moves n - 1 times, for one more hop (small to medium messages).
    LowLatencyTwoShot,
    /// Every PE pushes its input to every peer, one flag handshake per block, then every PE
    /// reduces locally (small messages where the low-latency paths do not apply).
    OneShot,
    /// Reduce-scatter, then all-gather, with no staging: each PE reads its part of every
    /// peer's input, reduces it and stores the result into every PE's output (medium
    /// messages).
    TwoShot,
    /// Reduce-scatter, then all-gather, with stores only: each PE pushes every part of its
    /// input to the part's owner through chunked staging, the owner reduces and pushes the
    /// result to every PE, pipelined over rounds of chunks (large messages).
    Bandwidth,
}

/// All-gather algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllGatherAlgo {
    /// Chosen by size and PE count ([`Thresholds`](super::Thresholds)).
    Auto,
    /// One-shot push with the flags packed into the data (smallest messages). On more than 2
    /// PEs each reader thread takes one 8-byte word of the output, from every block over it.
    LowLatency,
    /// One-shot push with signals into staging buffers (small messages).
    OneShot,
    /// Push straight into every PE's output over all SMs (large messages).
    Bandwidth,
    /// By the copy engines: an opening barrier, peer `cuMemcpyAsync`s one after another on a
    /// copy stream (this PE's own copy by the SMs meanwhile), a closing barrier (the largest
    /// messages: the copy engines outrun SM stores over NVLink, and leave the SMs free). A
    /// copy engine cannot be stopped from the device: after an opening barrier that ran out
    /// of time the copies still run, into a peer that may not have reached the call.
    CopyEngine,
}

/// Reduce-scatter algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceScatterAlgo {
    /// Chosen by size and PE count ([`Thresholds`](super::Thresholds)).
    Auto,
    /// Low-latency lines (as the low-latency all-reduce): each PE pushes every block of its
    /// input to the block's owner, each line carrying the call's tag, and the owner reduces
    /// as the lines arrive; no barrier (small blocks).
    LowLatency,
    /// No staging: after a start barrier each PE reads its block of every PE's input
    /// (remote loads over NVLink), reduces it in PE order and stores it; an end barrier keeps
    /// the inputs alive until every PE has read them.
    Pull,
}

/// Reduce (to one root) algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceAlgo {
    /// Chosen by size and PE count (today: [`Pull`](Self::Pull)).
    Auto,
    /// No staging: after a start barrier the root reads every PE's input (remote loads over
    /// NVLink) and reduces it in PE order; an end barrier keeps the inputs alive until it has.
    Pull,
}

/// Broadcast algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BroadcastAlgo {
    /// Chosen by size: [`LowLatency`](Self::LowLatency) up to
    /// [`Thresholds::broadcast_ll_max_bytes`](super::Thresholds::broadcast_ll_max_bytes)
    /// (on more than 2 PEs [`LowLatencyRelay`](Self::LowLatencyRelay) there from
    /// [`Thresholds::broadcast_ll_relay_min_bytes`](super::Thresholds::broadcast_ll_relay_min_bytes));
    /// on more than 2 PEs [`Relay`](Self::Relay) from
    /// [`Thresholds::broadcast_relay_min_bytes`](super::Thresholds::broadcast_relay_min_bytes);
    /// else [`OneShot`](Self::OneShot) up to
    /// [`BROADCAST_ONESHOT_BYTES`](super::BROADCAST_ONESHOT_BYTES) (and the staging slot),
    /// [`Push`](Self::Push) above, [`CopyEngine`](Self::CopyEngine) from
    /// [`Thresholds::copy_engine_min_bytes`](super::Thresholds::copy_engine_min_bytes) where
    /// the relay does not take the call.
    Auto,
    /// The root pushes its input to every peer in low-latency lines (8 bytes of data and
    /// the call's tag in each 16-byte store), which the peers poll: no barrier (small
    /// messages).
    LowLatency,
    /// The root pushes its input into every peer's staging, one flag handshake, then every
    /// PE copies it out locally (small messages: one handshake).
    OneShot,
    /// A start barrier, the root stores its input straight into every PE's output over all
    /// SMs, an end barrier (large messages; no staging, any size).
    Push,
    /// By the copy engines: an opening barrier, peer `cuMemcpyAsync`s one after another on a
    /// copy stream (this PE's own copy by the SMs meanwhile), a closing barrier (the largest
    /// messages: the copy engines outrun SM stores over NVLink, and leave the SMs free). A
    /// copy engine cannot be stopped from the device: after an opening barrier that ran out
    /// of time the copies still run, into a peer that may not have reached the call.
    CopyEngine,
    /// The low-latency lines, relayed (more than 2 PEs, the larger messages of the
    /// low-latency range): the root sends each line to one PE only, which forwards it to
    /// the others. The root's links carry the lines once, not once per peer, for a second
    /// hop. On 2 PEs it is [`LowLatency`](Self::LowLatency).
    LowLatencyRelay,
    /// Scatter and forward, pipelined (large messages on more than 2 PEs): the root sends
    /// each piece of its input to one PE only, which forwards it to the others while the
    /// root sends the next pieces. The root's links carry the message once, not once per
    /// peer, as the push's and the copy engines' do. No staging, any size; on 2 PEs it is
    /// the push.
    Relay,
}

/// All-to-all algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllToAllAlgo {
    /// Chosen by size: [`LowLatency`](Self::LowLatency) up to
    /// [`Thresholds::alltoall_ll_max_bytes`](super::Thresholds::alltoall_ll_max_bytes) per
    /// block, then [`OneShot`](Self::OneShot) up to
    /// [`Thresholds::alltoall_oneshot_max_bytes`](super::Thresholds::alltoall_oneshot_max_bytes)
    /// (and the staging slot),
    /// [`Push`](Self::Push) above, [`CopyEngine`](Self::CopyEngine) from
    /// [`Thresholds::alltoall_copy_engine_min_bytes`](super::Thresholds::alltoall_copy_engine_min_bytes).
    Auto,
    /// Every PE pushes each block to its owner in low-latency lines, which the owner polls:
    /// no barrier (small blocks).
    LowLatency,
    /// Every PE pushes each block into its owner's staging, one flag handshake, then every PE
    /// copies its blocks out locally (small messages: one handshake).
    OneShot,
    /// A start barrier, every PE stores each block straight into its owner's output, an end
    /// barrier (large messages; no staging, any size).
    Push,
    /// By the copy engines: an opening barrier, peer `cuMemcpyAsync`s one after another on a
    /// copy stream (this PE's own copy by the SMs meanwhile), a closing barrier (the largest
    /// messages: the copy engines outrun SM stores over NVLink, and leave the SMs free). A
    /// copy engine cannot be stopped from the device: after an opening barrier that ran out
    /// of time the copies still run, into a peer that may not have reached the call.
    CopyEngine,
}

/// Where a kernel's region parameter points, and its by-value parameter after the common
/// ones (`kernels/collectives.cu`: `src, dst, n, ctrl, flags, region, slot_bytes[, extra]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Params {
    /// The staging area, nothing after (but the root, for calls that have one).
    Staging,
    /// The low-latency lines region and its table of peer addresses (`Peers`), then the
    /// root for calls that have one.
    LinesPeers,
    /// The staging area and the bandwidth all-reduce's chunking (`BandwidthPlan`).
    StagingPlan,
    /// The staging area (unused) and a segment size in 16-byte vectors, then the root: the
    /// relay broadcast.
    StagingChunks,
    /// The sentinel buffers and their table of peer addresses.
    SentinelPeers,
    /// The all-to-all-v's table of counts and the counts themselves (`Counts`).
    CountsTable,
    /// No kernel of its own: copies by the copy engines between the `ce_open` and
    /// `ce_close` barriers (`ctrl, flags`).
    CopyEngine,
}

/// One algorithm: its name on command lines, the stem of its kernels' names, whether it takes
/// floating-point types only, and its parameters.
pub(crate) struct Row<A: 'static> {
    pub(crate) algo: A,
    pub(crate) name: &'static str,
    pub(crate) kernel: &'static str,
    pub(crate) floats_only: bool,
    pub(crate) params: Params,
}

/// The all-reduce algorithms (`Auto` has no row: it picks one of these).
pub(crate) const ALL_REDUCE_ROWS: [Row<AllReduceAlgo>; 7] = [
    Row {
        algo: AllReduceAlgo::Sentinel,
        name: "sentinel",
        kernel: "sentinel",
        floats_only: true,
        params: Params::SentinelPeers,
    },
    Row {
        algo: AllReduceAlgo::SentinelTwoShot,
        name: "sentinel-twoshot",
        kernel: "sentinel_twoshot",
        floats_only: true,
        params: Params::SentinelPeers,
    },
    Row {
        algo: AllReduceAlgo::LowLatency,
        name: "ll",
        kernel: "ll",
        floats_only: false,
        params: Params::LinesPeers,
    },
    Row {
        algo: AllReduceAlgo::LowLatencyTwoShot,
        name: "ll-twoshot",
        kernel: "ll_twoshot",
        floats_only: false,
        params: Params::LinesPeers,
    },
    Row {
        algo: AllReduceAlgo::OneShot,
        name: "oneshot",
        kernel: "oneshot",
        floats_only: false,
        params: Params::Staging,
    },
    Row {
        algo: AllReduceAlgo::TwoShot,
        name: "twoshot",
        kernel: "twoshot",
        floats_only: false,
        params: Params::Staging,
    },
    Row {
        algo: AllReduceAlgo::Bandwidth,
        name: "bandwidth",
        kernel: "bandwidth",
        floats_only: false,
        params: Params::StagingPlan,
    },
];

/// The all-gather algorithms (`Auto` has no row).
pub(crate) const ALL_GATHER_ROWS: [Row<AllGatherAlgo>; 4] = [
    Row {
        algo: AllGatherAlgo::LowLatency,
        name: "ll",
        kernel: "ll",
        floats_only: false,
        params: Params::LinesPeers,
    },
    Row {
        algo: AllGatherAlgo::OneShot,
        name: "oneshot",
        kernel: "oneshot",
        floats_only: false,
        params: Params::Staging,
    },
    Row {
        algo: AllGatherAlgo::Bandwidth,
        name: "bandwidth",
        kernel: "bandwidth",
        floats_only: false,
        params: Params::Staging,
    },
    Row {
        algo: AllGatherAlgo::CopyEngine,
        name: "ce",
        kernel: "ce",
        floats_only: false,
        params: Params::CopyEngine,
    },
];

/// The reduce-scatter algorithms (`Auto` has no row).
pub(crate) const REDUCE_SCATTER_ROWS: [Row<ReduceScatterAlgo>; 2] = [
    Row {
        algo: ReduceScatterAlgo::LowLatency,
        name: "ll",
        kernel: "ll",
        floats_only: false,
        params: Params::LinesPeers,
    },
    Row {
        algo: ReduceScatterAlgo::Pull,
        name: "pull",
        kernel: "pull",
        floats_only: false,
        params: Params::Staging,
    },
];

/// The reduce algorithms (`Auto` has no row).
pub(crate) const REDUCE_ROWS: [Row<ReduceAlgo>; 1] = [Row {
    algo: ReduceAlgo::Pull,
    name: "pull",
    kernel: "pull",
    floats_only: false,
    params: Params::Staging,
}];

/// The broadcast algorithms (`Auto` has no row).
pub(crate) const BROADCAST_ROWS: [Row<BroadcastAlgo>; 6] = [
    Row {
        algo: BroadcastAlgo::LowLatency,
        name: "ll",
        kernel: "ll",
        floats_only: false,
        params: Params::LinesPeers,
    },
    Row {
        algo: BroadcastAlgo::OneShot,
        name: "oneshot",
        kernel: "oneshot",
        floats_only: false,
        params: Params::Staging,
    },
    Row {
        algo: BroadcastAlgo::Push,
        name: "push",
        kernel: "push",
        floats_only: false,
        params: Params::Staging,
    },
    Row {
        algo: BroadcastAlgo::CopyEngine,
        name: "ce",
        kernel: "ce",
        floats_only: false,
        params: Params::CopyEngine,
    },
    Row {
        algo: BroadcastAlgo::LowLatencyRelay,
        name: "ll-relay",
        kernel: "ll_relay",
        floats_only: false,
        params: Params::LinesPeers,
    },
    Row {
        algo: BroadcastAlgo::Relay,
        name: "relay",
        kernel: "relay",
        floats_only: false,
        params: Params::StagingChunks,
    },
];

/// The all-to-all algorithms (`Auto` has no row).
pub(crate) const ALL_TO_ALL_ROWS: [Row<AllToAllAlgo>; 4] = [
    Row {
        algo: AllToAllAlgo::LowLatency,
        name: "ll",
        kernel: "ll",
        floats_only: false,
        params: Params::LinesPeers,
    },
    Row {
        algo: AllToAllAlgo::OneShot,
        name: "oneshot",
        kernel: "oneshot",
        floats_only: false,
        params: Params::Staging,
    },
    Row {
        algo: AllToAllAlgo::Push,
        name: "push",
        kernel: "push",
        floats_only: false,
        params: Params::Staging,
    },
    Row {
        algo: AllToAllAlgo::CopyEngine,
        name: "ce",
        kernel: "ce",
        floats_only: false,
        params: Params::CopyEngine,
    },
];

/// The element types our all-reduce takes, with their names in kernel names.
pub(crate) const TYPES: [(DataType, &str); 4] = [
    (DataType::F32, "f32"),
    (DataType::F16, "f16"),
    (DataType::BF16, "bf16"),
    (DataType::I32, "i32"),
];

/// The operators our all-reduce does, with their names in kernel names.
pub(crate) const OPS: [(ReduceOp, &str); 3] = [
    (ReduceOp::Sum, "sum"),
    (ReduceOp::Max, "max"),
    (ReduceOp::Min, "min"),
];

/// The shared parts of the algorithm enums.
pub(crate) trait Algo: Copy + PartialEq + fmt::Debug + 'static {
    const AUTO: Self;
    const ROWS: &'static [Row<Self>];
    const WHAT: &'static str;

    /// The algorithm's row; `None` for `Auto`.
    fn row(self) -> Option<&'static Row<Self>> {
        Self::ROWS.iter().find(|r| r.algo == self)
    }

    /// Its index in the rows (the kernel table is laid out by it); `None` for `Auto`.
    fn index(self) -> Option<usize> {
        Self::ROWS.iter().position(|r| r.algo == self)
    }

    fn name(self) -> &'static str {
        self.row().map_or("auto", |r| r.name)
    }

    fn parse(s: &str) -> Result<Self> {
        if s == "auto" {
            return Ok(Self::AUTO);
        }
        Self::ROWS
            .iter()
            .find(|r| r.name == s)
            .map(|r| r.algo)
            .ok_or_else(|| {
                let names: Vec<&str> = std::iter::once("auto")
                    .chain(Self::ROWS.iter().map(|r| r.name))
                    .collect();
                Error::InvalidArgument(format!(
                    "`{s}` is not an {} algorithm; choose one of {}",
                    Self::WHAT,
                    names.join(", ")
                ))
            })
    }
}

impl Algo for AllReduceAlgo {
    const AUTO: Self = AllReduceAlgo::Auto;
    const ROWS: &'static [Row<Self>] = &ALL_REDUCE_ROWS;
    const WHAT: &'static str = "all-reduce";
}

impl Algo for AllGatherAlgo {
    const AUTO: Self = AllGatherAlgo::Auto;
    const ROWS: &'static [Row<Self>] = &ALL_GATHER_ROWS;
    const WHAT: &'static str = "all-gather";
}

impl Algo for ReduceScatterAlgo {
    const AUTO: Self = ReduceScatterAlgo::Auto;
    const ROWS: &'static [Row<Self>] = &REDUCE_SCATTER_ROWS;
    const WHAT: &'static str = "reduce-scatter";
}

impl Algo for ReduceAlgo {
    const AUTO: Self = ReduceAlgo::Auto;
    const ROWS: &'static [Row<Self>] = &REDUCE_ROWS;
    const WHAT: &'static str = "reduce";
}

impl ReduceAlgo {
    /// Every algorithm, `Auto` first.
    pub const ALL: [ReduceAlgo; 2] = [ReduceAlgo::Auto, ReduceAlgo::Pull];

    /// Its name on command lines (`pull`), as `Display` prints and `FromStr` reads it.
    pub fn name(self) -> &'static str {
        Algo::name(self)
    }
}

impl fmt::Display for ReduceAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Algo::parse(s)
    }
}

impl Algo for BroadcastAlgo {
    const AUTO: Self = BroadcastAlgo::Auto;
    const ROWS: &'static [Row<Self>] = &BROADCAST_ROWS;
    const WHAT: &'static str = "broadcast";
}

impl Algo for AllToAllAlgo {
    const AUTO: Self = AllToAllAlgo::Auto;
    const ROWS: &'static [Row<Self>] = &ALL_TO_ALL_ROWS;
    const WHAT: &'static str = "all-to-all";
}

impl BroadcastAlgo {
    /// Every algorithm, `Auto` first.
    pub const ALL: [BroadcastAlgo; 7] = [
        BroadcastAlgo::Auto,
        BroadcastAlgo::LowLatency,
        BroadcastAlgo::OneShot,
        BroadcastAlgo::Push,
        BroadcastAlgo::CopyEngine,
        BroadcastAlgo::LowLatencyRelay,
        BroadcastAlgo::Relay,
    ];

    /// Its name on command lines (`push`), as `Display` prints and `FromStr` reads it.
    pub fn name(self) -> &'static str {
        Algo::name(self)
    }
}

impl AllToAllAlgo {
    /// Every algorithm, `Auto` first.
    pub const ALL: [AllToAllAlgo; 5] = [
        AllToAllAlgo::Auto,
        AllToAllAlgo::LowLatency,
        AllToAllAlgo::OneShot,
        AllToAllAlgo::Push,
        AllToAllAlgo::CopyEngine,
    ];

    /// Its name on command lines (`push`), as `Display` prints and `FromStr` reads it.
    pub fn name(self) -> &'static str {
        Algo::name(self)
    }
}

impl fmt::Display for BroadcastAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BroadcastAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Algo::parse(s)
    }
}

impl fmt::Display for AllToAllAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AllToAllAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Algo::parse(s)
    }
}

impl AllReduceAlgo {
    /// Every algorithm, `Auto` first.
    ///
    /// ```
    /// use nvshmem::AllReduceAlgo;
    /// let names: Vec<String> = AllReduceAlgo::ALL.iter().map(|a| a.to_string()).collect();
    /// assert_eq!(names[0], "auto");
    /// assert_eq!("sentinel-twoshot".parse::<AllReduceAlgo>().unwrap(), AllReduceAlgo::SentinelTwoShot);
    /// ```
    pub const ALL: [AllReduceAlgo; 8] = [
        AllReduceAlgo::Auto,
        AllReduceAlgo::Sentinel,
        AllReduceAlgo::SentinelTwoShot,
        AllReduceAlgo::LowLatency,
        AllReduceAlgo::LowLatencyTwoShot,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::Bandwidth,
    ];

    /// Its name on command lines (`sentinel-twoshot`), as `Display` prints and `FromStr`
    /// reads it.
    pub fn name(self) -> &'static str {
        Algo::name(self)
    }

    /// Whether it takes elements of type `t` (`Auto` takes whatever some algorithm takes).
    pub fn takes(self, t: DataType) -> bool {
        TYPES.iter().any(|(ty, _)| *ty == t)
            && self.row().is_none_or(|r| !r.floats_only || t.is_float())
    }
}

impl AllGatherAlgo {
    /// Every algorithm, `Auto` first.
    pub const ALL: [AllGatherAlgo; 5] = [
        AllGatherAlgo::Auto,
        AllGatherAlgo::LowLatency,
        AllGatherAlgo::OneShot,
        AllGatherAlgo::Bandwidth,
        AllGatherAlgo::CopyEngine,
    ];

    /// Its name on command lines (`oneshot`), as `Display` prints and `FromStr` reads it.
    pub fn name(self) -> &'static str {
        Algo::name(self)
    }
}

impl ReduceScatterAlgo {
    /// Every algorithm, `Auto` first.
    pub const ALL: [ReduceScatterAlgo; 3] = [
        ReduceScatterAlgo::Auto,
        ReduceScatterAlgo::LowLatency,
        ReduceScatterAlgo::Pull,
    ];

    /// Its name on command lines (`pull`), as `Display` prints and `FromStr` reads it.
    pub fn name(self) -> &'static str {
        Algo::name(self)
    }
}

impl fmt::Display for ReduceScatterAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceScatterAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Algo::parse(s)
    }
}

impl fmt::Display for AllReduceAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for AllGatherAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AllReduceAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Algo::parse(s)
    }
}

impl FromStr for AllGatherAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Algo::parse(s)
    }
}

/// The entry points of `kernels/collectives.cu`: every all-reduce algorithm for every type it
/// takes and every operator, then the all-gathers, then every reduce-scatter algorithm for
/// every type and operator, then the broadcasts, the all-to-alls, the all-to-all with counts,
/// every reduce algorithm for every type and operator, and the copy-engine paths' barriers
/// (once: the copy-engine rows of the tables name the opening one).
pub fn kernel_names() -> Vec<String> {
    let kernels = |names: Vec<String>| names.into_iter().filter(|n| n != CE_OPEN_KERNEL);
    let mut names: Vec<String> = all_reduce_kernels()
        .filter_map(|(row, t, o)| Some(all_reduce_kernel(row, t?, o)))
        .collect();
    names.extend(kernels(
        ALL_GATHER_ROWS.iter().map(all_gather_kernel).collect(),
    ));
    names.extend(ALL_GATHER_WORDS_KERNELS.map(String::from));
    names.extend(reduce_scatter_kernels().map(|(row, t, o)| reduce_scatter_kernel(row, t, o)));
    names.extend(kernels(
        BROADCAST_ROWS.iter().map(broadcast_kernel).collect(),
    ));
    names.extend(kernels(
        ALL_TO_ALL_ROWS.iter().map(all_to_all_kernel).collect(),
    ));
    names.push(ALL_TO_ALL_V_KERNEL.into());
    names.extend(reduce_kernels().map(|(row, t, o)| reduce_kernel(row, t, o)));
    names.extend([CE_OPEN_KERNEL, CE_CLOSE_KERNEL, CE_LOCAL_COPY_KERNEL].map(String::from));
    names.extend(super::compressed::kernel_names());
    names.extend(super::group::kernel_names());
    names
}

/// The copy-engine paths' barriers (before their copies, and after them), and their copy
/// into this PE's own output (by the SMs).
pub(crate) const CE_OPEN_KERNEL: &str = "ce_open";
pub(crate) const CE_CLOSE_KERNEL: &str = "ce_close";
pub(crate) const CE_LOCAL_COPY_KERNEL: &str = "ce_local_copy";

/// The kernel of a move (all-gather, broadcast, all-to-all) row: `STEM_WHAT_bytes`, or the
/// opening barrier for the copy-engine rows.
fn move_kernel(kernel: &str, params: Params, what: &str) -> String {
    match params {
        Params::CopyEngine => CE_OPEN_KERNEL.into(),
        _ => format!("{kernel}_{what}_bytes"),
    }
}

/// Every slot of the reduce kernel table: (row, type index, operator index), row-major.
pub(crate) fn reduce_kernels() -> impl Iterator<Item = (&'static Row<ReduceAlgo>, usize, usize)> {
    REDUCE_ROWS.iter().flat_map(|row| {
        (0..TYPES.len()).flat_map(move |t| (0..OPS.len()).map(move |o| (row, t, o)))
    })
}

/// `pull_reduce_bf16_sum`.
pub(crate) fn reduce_kernel(row: &Row<ReduceAlgo>, t: usize, o: usize) -> String {
    format!("{}_reduce_{}_{}", row.kernel, TYPES[t].1, OPS[o].1)
}

/// The all-to-all with counts (one algorithm: a push straight into the outputs).
pub(crate) const ALL_TO_ALL_V_KERNEL: &str = "push_alltoallv_bytes";

/// The low-latency all-gather by output words, a thread per 8 bytes of the output (the host
/// takes it in place of the `ll` row's kernel on more than 2 PEs, `plan::all_gather_words_plan`):
/// for blocks of a multiple of 8 bytes, and for the others.
pub(crate) const ALL_GATHER_WORDS_KERNELS: [&str; 2] =
    ["ll_words_allgather_bytes", "ll_words_cut_allgather_bytes"];

/// `push_broadcast_bytes`.
pub(crate) fn broadcast_kernel(row: &Row<BroadcastAlgo>) -> String {
    move_kernel(row.kernel, row.params, "broadcast")
}

/// `oneshot_alltoall_bytes`.
pub(crate) fn all_to_all_kernel(row: &Row<AllToAllAlgo>) -> String {
    move_kernel(row.kernel, row.params, "alltoall")
}

/// Every slot of the reduce-scatter kernel table: (row, type index, operator index),
/// row-major (every algorithm takes every type).
pub(crate) fn reduce_scatter_kernels(
) -> impl Iterator<Item = (&'static Row<ReduceScatterAlgo>, usize, usize)> {
    REDUCE_SCATTER_ROWS.iter().flat_map(|row| {
        (0..TYPES.len()).flat_map(move |t| (0..OPS.len()).map(move |o| (row, t, o)))
    })
}

/// `pull_reducescatter_bf16_sum`.
pub(crate) fn reduce_scatter_kernel(row: &Row<ReduceScatterAlgo>, t: usize, o: usize) -> String {
    format!("{}_reducescatter_{}_{}", row.kernel, TYPES[t].1, OPS[o].1)
}

/// Every slot of the all-reduce kernel table: (row, type index if the row takes the type,
/// operator index), row-major.
pub(crate) fn all_reduce_kernels(
) -> impl Iterator<Item = (&'static Row<AllReduceAlgo>, Option<usize>, usize)> {
    ALL_REDUCE_ROWS.iter().flat_map(|row| {
        (0..TYPES.len()).flat_map(move |t| {
            let takes = !row.floats_only || TYPES[t].0.is_float();
            (0..OPS.len()).map(move |o| (row, takes.then_some(t), o))
        })
    })
}

/// `sentinel_twoshot_allreduce_bf16_sum`.
pub(crate) fn all_reduce_kernel(row: &Row<AllReduceAlgo>, t: usize, o: usize) -> String {
    format!("{}_allreduce_{}_{}", row.kernel, TYPES[t].1, OPS[o].1)
}

/// `ll_allgather_bytes`.
pub(crate) fn all_gather_kernel(row: &Row<AllGatherAlgo>) -> String {
    move_kernel(row.kernel, row.params, "allgather")
}

/// Where the kernel of algorithm `row`, type index `t` and operator index `o` sits in a
/// reduction's kernel table (row-major: every row holds a slot per type and operator).
pub(crate) fn reduction_slot(row: usize, t: usize, o: usize) -> usize {
    (row * TYPES.len() + t) * OPS.len() + o
}

/// The indices of `T` and `op` in the kernel tables of our reductions, or the error that
/// names the `what` collective and the NVSHMEM team call that takes any type.
pub(crate) fn type_and_op<T: Element>(
    op: ReduceOp,
    what: &str,
    team_call: &str,
) -> Result<(usize, usize)> {
    let what = || format!("our {what} (Team::{team_call} takes any)");
    let t = TYPES
        .iter()
        .position(|(ty, _)| *ty == T::DTYPE)
        .ok_or_else(|| Error::TypeMismatch {
            what: what(),
            expected: "f32, f16, bf16 or i32",
            got: T::NVSHMEM_NAME.into(),
        })?;
    let o = OPS
        .iter()
        .position(|(o, _)| *o == op)
        .ok_or_else(|| Error::TypeMismatch {
            what: what(),
            expected: "the Sum, Max or Min operator",
            got: format!("{op:?}"),
        })?;
    Ok((t, o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_display_and_from_str() {
        for a in AllReduceAlgo::ALL {
            assert_eq!(a.to_string().parse::<AllReduceAlgo>().unwrap(), a);
        }
        for a in AllGatherAlgo::ALL {
            assert_eq!(a.to_string().parse::<AllGatherAlgo>().unwrap(), a);
        }
        // Every algorithm but Auto has a row, and no two share a name.
        assert_eq!(ALL_REDUCE_ROWS.len() + 1, AllReduceAlgo::ALL.len());
        assert_eq!(ALL_GATHER_ROWS.len() + 1, AllGatherAlgo::ALL.len());
        assert_eq!(REDUCE_SCATTER_ROWS.len() + 1, ReduceScatterAlgo::ALL.len());
        for a in ReduceScatterAlgo::ALL {
            assert_eq!(a.to_string().parse::<ReduceScatterAlgo>().unwrap(), a);
        }
        let mut names: Vec<&str> = AllReduceAlgo::ALL.iter().map(|a| a.name()).collect();
        names.dedup();
        assert_eq!(names.len(), AllReduceAlgo::ALL.len());
        let e = "fast".parse::<AllReduceAlgo>().unwrap_err().to_string();
        assert!(
            e.contains("`fast`") && e.contains("sentinel-twoshot"),
            "{e}"
        );
    }

    #[test]
    fn kernel_names_cover_types_ops_and_algorithms() {
        let names = kernel_names();
        assert_eq!(
            names.len(),
            5 * 4 * 3 + 2 * 3 * 3 + 3 + 2 + 2 * 4 * 3 + 5 + 3 + 1 + 4 * 3 + 3 + 4 * 5 + 2 * 4 * 3
        );
        assert!(names.contains(&"ce_local_copy".to_string()));
        assert!(names.contains(&"compress_quantize_bf16_fp8".to_string()));
        assert!(names.contains(&"compress_reduce_int8".to_string()));
        // Every name once.
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        assert!(names.contains(&"push_alltoallv_bytes".to_string()));
        assert!(names.contains(&"ll_words_cut_allgather_bytes".to_string()));
        assert!(names.contains(&"pull_reduce_i32_min".to_string()));
        assert!(names.contains(&"oneshot_broadcast_bytes".to_string()));
        assert!(names.contains(&"push_alltoall_bytes".to_string()));
        assert!(names.contains(&"pull_reducescatter_i32_max".to_string()));
        assert!(names.contains(&"ll_reducescatter_bf16_sum".to_string()));
        assert!(names.contains(&"ll_broadcast_bytes".to_string()));
        assert!(names.contains(&"relay_broadcast_bytes".to_string()));
        assert!(names.contains(&"ll_relay_broadcast_bytes".to_string()));
        assert!(names.contains(&"ll_alltoall_bytes".to_string()));
        assert!(names.contains(&"sentinel_twoshot_allreduce_f16_min".to_string()));
        assert!(names.contains(&"sentinel_allreduce_bf16_sum".to_string()));
        assert!(!names
            .iter()
            .any(|n| n.starts_with("sentinel_allreduce_i32")));
        assert!(names.contains(&"ll_twoshot_allreduce_f16_max".to_string()));
        assert!(names.contains(&"oneshot_allreduce_bf16_sum".to_string()));
        assert!(names.contains(&"bandwidth_allreduce_i32_min".to_string()));
        assert!(names.contains(&"ll_allgather_bytes".to_string()));
    }

    #[test]
    fn reduction_slots_follow_the_kernel_tables() {
        // A row's slots for types it does not take are there, empty (`None`): i32, index 3.
        for (i, (row, t, o)) in all_reduce_kernels().enumerate() {
            let r = row.algo.index().unwrap();
            assert_eq!(reduction_slot(r, t.unwrap_or(3), o), i);
        }
        for (i, (row, t, o)) in reduce_scatter_kernels().enumerate() {
            assert_eq!(reduction_slot(row.algo.index().unwrap(), t, o), i);
        }
        for (i, (_, t, o)) in reduce_kernels().enumerate() {
            assert_eq!(reduction_slot(0, t, o), i);
        }
    }

    #[test]
    fn sentinel_paths_take_floats_only() {
        assert!(AllReduceAlgo::Sentinel.takes(DataType::BF16));
        assert!(!AllReduceAlgo::Sentinel.takes(DataType::I32));
        assert!(!AllReduceAlgo::SentinelTwoShot.takes(DataType::I32));
        assert!(AllReduceAlgo::Auto.takes(DataType::I32));
        assert!(AllReduceAlgo::OneShot.takes(DataType::I32));
        assert!(!AllReduceAlgo::OneShot.takes(DataType::U64));
        assert_eq!(
            type_and_op::<half::bf16>(ReduceOp::Min, "x", "y").unwrap(),
            (2, 2)
        );
        let e = type_and_op::<u64>(ReduceOp::Sum, "reduce-scatter", "reduce_scatter").unwrap_err();
        assert!(
            matches!(&e, Error::TypeMismatch { what, .. } if what.contains("Team::reduce_scatter")),
            "{e}"
        );
        let e = type_and_op::<half::bf16>(ReduceOp::Xor, "all-reduce", "all_reduce").unwrap_err();
        assert!(matches!(e, Error::TypeMismatch { expected, .. } if expected.contains("Sum")));
    }
}
