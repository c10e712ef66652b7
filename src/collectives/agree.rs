//! The PEs agree before they rely on each other: on the configuration when a [`Collectives`]
//! is made (a hash of it; different workspaces would put staging at different offsets), and,
//! when [`CollectivesConfig::check_calls`] asks for it, on every call (operation, type,
//! algorithm, length and where the buffers are). A disagreement is
//! [`Error::CollectiveMismatch`] on every PE, naming both sides, instead of stale data on one
//! PE and stores past a view on another.
//!
//! [`Collectives`]: super::Collectives
//! [`CollectivesConfig::check_calls`]: super::CollectivesConfig::check_calls

use super::algo::{
    ALL_GATHER_ROWS, ALL_REDUCE_ROWS, ALL_TO_ALL_ROWS, BROADCAST_ROWS, REDUCE_ROWS,
    REDUCE_SCATTER_ROWS,
};
use super::members::Members;
use super::CollectivesConfig;
use crate::abi;
use crate::element::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::SymmetricBuffer;
use crate::runtime::{DuringWait, Exchanged, Nvshmem, WordExchange, RECORD_WORDS};
use std::sync::Mutex;
use std::time::Duration;

/// Words of a record: the runtime exchange's.
pub(crate) const WORDS: usize = RECORD_WORDS;

/// Which collective a call is, with the word that tags its record (4 is `Record::Failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Collective {
    AllReduce = 2,
    AllGather = 3,
    ReduceScatter = 5,
    Broadcast = 6,
    AllToAll = 7,
    AllToAllV = 8,
    Reduce = 9,
    /// A row-parallel layer's GEMM fused with its all-reduce (src/tp).
    LinearAllReduce = 10,
    /// An all-reduce fused with the residual add and RMSNorm after it (src/tp).
    AllReduceRmsNorm = 11,
    /// An all-reduce whose values travel quantised (its row says the compression).
    AllReduceCompressed = 12,
    /// Several all-reduces in one launch (its row is the algorithm's, its root the count).
    AllReduceGroup = 13,
}

impl Collective {
    const ALL: [Collective; 11] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::Reduce,
        Collective::LinearAllReduce,
        Collective::AllReduceRmsNorm,
        Collective::AllReduceCompressed,
        Collective::AllReduceGroup,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllV => "all_to_all_v",
            Collective::Reduce => "reduce",
            Collective::LinearAllReduce => "row-parallel linear + all_reduce",
            Collective::AllReduceRmsNorm => "all_reduce + residual + RMSNorm",
            Collective::AllReduceCompressed => "all_reduce_compressed",
            Collective::AllReduceGroup => "all_reduce_group",
        }
    }

    /// The name of its algorithm `row`.
    fn algorithm(self, row: usize) -> Option<&'static str> {
        if row == super::TEAM_ROW {
            return Some("NVSHMEM's team collective");
        }
        match self {
            Collective::AllReduce => ALL_REDUCE_ROWS.get(row).map(|r| r.name),
            Collective::AllGather => ALL_GATHER_ROWS.get(row).map(|r| r.name),
            Collective::ReduceScatter => REDUCE_SCATTER_ROWS.get(row).map(|r| r.name),
            Collective::Broadcast => BROADCAST_ROWS.get(row).map(|r| r.name),
            Collective::AllToAll => ALL_TO_ALL_ROWS.get(row).map(|r| r.name),
            Collective::AllToAllV => (row == 0).then_some("push"),
            Collective::Reduce => REDUCE_ROWS.get(row).map(|r| r.name),
            Collective::LinearAllReduce => (row == 0).then_some("decode"),
            Collective::AllReduceRmsNorm => (row == 0).then_some("ll"),
            Collective::AllReduceCompressed => super::compressed::format_of_row(row),
            Collective::AllReduceGroup => ALL_REDUCE_ROWS.get(row).map(|r| r.name),
        }
    }
}

/// What a PE is about to do, as the words it publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// Making a `Collectives` with a configuration of this hash, on this many PEs.
    Config { hash: u64, n_pes: u64 },
    /// Not making the call (or the `Collectives`): an argument or set-up check failed here,
    /// or an earlier call of this PE ran out of time. Published so that no PE waits for it.
    Failed,
    /// A call: which collective, its element type (and operator), its algorithm's row, its
    /// length, where `dst` and `src` sit in the symmetric heap, and its root (a broadcast).
    Call {
        collective: Collective,
        dtype: DataType,
        op: Option<ReduceOp>,
        row: usize,
        len: usize,
        dst: i64,
        src: i64,
        root: Option<usize>,
    },
}

const DTYPES: [DataType; 12] = [
    DataType::I8,
    DataType::I16,
    DataType::I32,
    DataType::I64,
    DataType::U8,
    DataType::U16,
    DataType::U32,
    DataType::U64,
    DataType::F32,
    DataType::F64,
    DataType::F16,
    DataType::BF16,
];

impl Record {
    pub(crate) fn encode(self) -> [u64; WORDS] {
        match self {
            Record::Config { hash, n_pes } => [1, hash, n_pes, 0, 0, 0, 0, 0],
            Record::Failed => [4, 0, 0, 0, 0, 0, 0, 0],
            Record::Call {
                collective,
                dtype,
                op,
                row,
                len,
                dst,
                src,
                root,
            } => [
                collective as u64,
                dtype as u64,
                op.map_or(u64::MAX, |o| {
                    ReduceOp::ALL.iter().position(|&x| x == o).unwrap() as u64
                }),
                row as u64,
                len as u64,
                dst as u64,
                src as u64,
                root.map_or(u64::MAX, |r| r as u64),
            ],
        }
    }

    /// The signature the copy-engine paths' barriers carry (the kernels compute their own
    /// from their entry point, length and root; kernels/collectives/call.cuh): a hash of what
    /// the PEs must agree on (collective, element type, operator, algorithm, length, root),
    /// 16 bits, never [`abi::COLL_SIG_FAILED`].
    pub(crate) fn signature(&self) -> u32 {
        let w = self.encode();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &x in w[..5].iter().chain(&w[7..]) {
            h = (h ^ x).wrapping_mul(0x0000_0100_0000_01b3);
            h ^= h >> 29;
        }
        let sig = (h ^ (h >> 32)) as u32 & 0xFFFF;
        if sig == abi::COLL_SIG_FAILED {
            0
        } else {
            sig
        }
    }

    /// This call's record with a root (the broadcast's).
    pub(crate) fn with_root(mut self, r: usize) -> Self {
        if let Record::Call { root, .. } = &mut self {
            *root = Some(r);
        }
        self
    }

    /// A record as words say it (`None` for words no PE writes).
    fn decode(w: &[u64]) -> Option<Record> {
        match w[0] {
            1 => Some(Record::Config {
                hash: w[1],
                n_pes: w[2],
            }),
            4 => Some(Record::Failed),
            2 | 3 | 5..=13 => Some(Record::Call {
                collective: *Collective::ALL.iter().find(|&&c| c as u64 == w[0])?,
                dtype: *DTYPES.iter().find(|&&t| t as u64 == w[1])?,
                op: ReduceOp::ALL.get(w[2] as usize).copied(),
                row: w[3] as usize,
                len: w[4] as usize,
                dst: w[5] as i64,
                src: w[6] as i64,
                root: (w[7] != u64::MAX).then_some(w[7] as usize),
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Record::Config { hash, n_pes } => write!(
                f,
                "makes Collectives with configuration {hash:#018x} on {n_pes} PEs"
            ),
            Record::Failed => f.write_str(
                "could not go on (an argument or set-up check failed there, or an earlier call \
                 ran out of time: its own error says which)",
            ),
            Record::Call {
                collective,
                dtype,
                op,
                row,
                len,
                dst,
                src,
                root,
            } => {
                let algo = collective.algorithm(row);
                let what = collective.name();
                let op = op.map(|o| format!("{o:?}, ")).unwrap_or_default();
                let root = root.map(|r| format!("root {r}, ")).unwrap_or_default();
                write!(
                    f,
                    "calls {what}({root}{op}{dtype:?}, {}, {len} elements, dst at heap offset \
                     {dst}, src at {src})",
                    algo.unwrap_or("?")
                )
            }
        }
    }
}

/// A stable hash of a configuration (FNV-1a over its printed form: the same on every PE
/// that runs this build).
pub(crate) fn config_hash(config: &CollectivesConfig) -> u64 {
    format!("{config:?}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The first member whose record differs from the first member's, described from member
/// `me`, `name` naming members by their place.
pub(crate) fn describe_disagreement(
    all: &[u64],
    me: usize,
    name: impl Fn(usize) -> String,
) -> Option<String> {
    let records: Vec<&[u64]> = all.chunks(WORDS).collect();
    let first = records.first()?;
    let pe = records.iter().position(|r| r != first)?;
    let show = |w: &[u64]| match Record::decode(w) {
        Some(r) => r.to_string(),
        None => format!("publishes {w:?}"),
    };
    Some(format!(
        "{} {} while {} {} (seen from {}); every PE must make the same calls on its \
         Collectives, with the same configuration",
        name(0),
        show(first),
        name(pe),
        show(records[pe]),
        name(me)
    ))
}

/// Agree with every PE of the world on `record` (the making of a `Collectives`, on any
/// team: its workspace is allocated on every PE alike), through the runtime's exchange.
pub(crate) fn agree_world(shmem: &Nvshmem, record: Record, limit: Option<Duration>) -> Result<()> {
    let what = || format!("making a Collectives (this PE {record})");
    match shmem.exchange(&record.encode(), limit, DuringWait::LetGo, what)? {
        Exchanged::All(all) => match describe_disagreement(&all, shmem.my_pe(), world_name) {
            Some(msg) => Err(Error::CollectiveMismatch(msg)),
            None => Ok(()),
        },
        Exchanged::GaveUp(missing) => Err(gave_up(
            &world_name(shmem.my_pe()),
            record,
            &world_name(missing),
            limit,
        )),
    }
}

fn world_name(pe: usize) -> String {
    format!("PE {pe}")
}

/// What a PE that waited in vain for `missing` says.
fn gave_up(me: &str, record: Record, missing: &str, limit: Option<Duration>) -> Error {
    Error::CollectiveMismatch(format!(
        "{me} {record}, and {missing} did not publish what it is doing within {:?}: a PE \
         skipped the call or stopped; this process cannot go on",
        limit.unwrap_or_default()
    ))
}

/// The records' exchange between a team's members (the runtime's bounded exchange,
/// src/runtime/exchange.rs, through scratch of its own) and that scratch. One exchange at a
/// time: a `Collectives` may be shared between threads.
pub(crate) struct Agreement {
    exchange: Mutex<(WordExchange, SymmetricBuffer<u64>)>,
    members: Members,
}

impl Agreement {
    /// Allocate the scratch (collective over the world: room for every PE, whichever
    /// team's members use it).
    pub(crate) fn new(shmem: &Nvshmem, members: &Members) -> Result<Self> {
        let scratch = shmem.calloc::<u64>(WordExchange::scratch_words(shmem.n_pes()))?;
        // Outside the team the exchange is never used (every call fails first).
        let (list, me) = match members.me() {
            Ok(me) => (members.world_pes().to_vec(), me),
            Err(_) => (vec![members.my_world()], 0),
        };
        // SAFETY: symmetric, zeroed, alike on every PE, and kept beside the exchange.
        let exchange = unsafe { WordExchange::new(scratch.as_ptr(), shmem.context(), list, me)? };
        Ok(Agreement {
            exchange: Mutex::new((exchange, scratch)),
            members: members.clone(),
        })
    }

    /// Publish `record`, collect every member's, and fail if any differs. Waits for every
    /// member to publish for at most `limit`.
    pub(crate) fn agree(
        &self,
        shmem: &Nvshmem,
        record: Record,
        limit: Option<Duration>,
    ) -> Result<()> {
        let mut guard = crate::runtime::lock_letting_go(&self.exchange);
        let what = || format!("the call agreement (this PE {record})");
        let m = &self.members;
        let me = m.me()?;
        match shmem.exchange_through(
            &mut guard.0,
            &record.encode(),
            limit,
            DuringWait::LetGo,
            what,
        )? {
            Exchanged::All(all) => match describe_disagreement(&all, me, |p| m.name(p)) {
                Some(msg) => Err(Error::CollectiveMismatch(msg)),
                None => Ok(()),
            },
            Exchanged::GaveUp(missing) => {
                Err(gave_up(&m.name(me), record, &m.name(missing), limit))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(len: usize) -> Record {
        Record::Call {
            collective: Collective::AllReduce,
            dtype: DataType::BF16,
            op: Some(ReduceOp::Sum),
            row: 0,
            len,
            dst: 4096,
            src: -8192,
            root: None,
        }
    }

    #[test]
    fn signatures_tell_calls_apart_but_not_their_buffers() {
        let base = call(1000);
        let sig = base.signature();
        assert!(sig <= 0xFFFF && sig != abi::COLL_SIG_FAILED);
        let with = |f: fn(&mut Record)| {
            let mut r = base;
            f(&mut r);
            r.signature()
        };
        // Where the buffers are is the host check's business, not the barrier's.
        assert_eq!(
            with(|r| {
                if let Record::Call { dst, src, .. } = r {
                    (*dst, *src) = (0, 64);
                }
            }),
            sig
        );
        for (what, other) in [
            ("length", call(1001).signature()),
            ("root", base.with_root(1).signature()),
            (
                "element type",
                with(|r| {
                    if let Record::Call { dtype, .. } = r {
                        *dtype = DataType::F32;
                    }
                }),
            ),
            (
                "operator",
                with(|r| {
                    if let Record::Call { op, .. } = r {
                        *op = Some(ReduceOp::Max);
                    }
                }),
            ),
            (
                "algorithm",
                with(|r| {
                    if let Record::Call { row, .. } = r {
                        *row = 1;
                    }
                }),
            ),
        ] {
            assert_ne!(
                other, sig,
                "a call of another {what} has the same signature"
            );
        }
        // Lengths near each other, as mismatched calls often are, spread over the 16 bits.
        let sigs: std::collections::HashSet<u32> = (0..4096).map(|n| call(n).signature()).collect();
        assert!(sigs.len() > 3900, "{} distinct of 4096", sigs.len());
    }

    #[test]
    fn records_round_trip_through_their_words() {
        for r in [
            call(1000),
            Record::Config { hash: 7, n_pes: 4 },
            Record::Failed,
            Record::Call {
                collective: Collective::AllGather,
                dtype: DataType::U8,
                op: None,
                row: 2,
                len: 3,
                dst: 0,
                src: 16,
                root: None,
            },
            Record::Call {
                collective: Collective::ReduceScatter,
                dtype: DataType::I32,
                op: Some(ReduceOp::Max),
                row: 0,
                len: 5,
                dst: -16,
                src: 32,
                root: None,
            },
            Record::Call {
                collective: Collective::Broadcast,
                dtype: DataType::F16,
                op: None,
                row: 1,
                len: 7,
                dst: 64,
                src: 64,
                root: Some(3),
            },
            Record::Call {
                collective: Collective::LinearAllReduce,
                dtype: DataType::BF16,
                op: Some(ReduceOp::Sum),
                row: 0,
                len: 4096,
                dst: 128,
                src: 0,
                root: None,
            },
        ] {
            assert_eq!(Record::decode(&r.encode()), Some(r));
        }
    }

    #[test]
    fn every_collective_round_trips_and_has_a_name_and_its_first_algorithm() {
        for c in Collective::ALL {
            let r = Record::Call {
                collective: c,
                dtype: DataType::BF16,
                op: None,
                row: 0,
                len: 1,
                dst: 0,
                src: 0,
                root: None,
            };
            assert_eq!(Record::decode(&r.encode()), Some(r), "{}", c.name());
            assert!(c.algorithm(0).is_some(), "{}", c.name());
        }
    }

    #[test]
    fn pes_naming_different_roots_are_named_with_both() {
        let bcast = |root| Record::Call {
            collective: Collective::Broadcast,
            dtype: DataType::BF16,
            op: None,
            row: 0,
            len: 64,
            dst: 0,
            src: 0,
            root: Some(root),
        };
        let all: Vec<u64> = [0, 1].into_iter().flat_map(|r| bcast(r).encode()).collect();
        let msg = describe_disagreement(&all, 0, world_name).unwrap();
        assert!(
            msg.contains("PE 0 calls broadcast(root 0, BF16, ll"),
            "{msg}"
        );
        assert!(
            msg.contains("PE 1 calls broadcast(root 1, BF16, ll"),
            "{msg}"
        );
    }

    #[test]
    fn a_pe_passing_another_length_is_named_with_both_calls() {
        let mut all = Vec::new();
        for len in [1000, 1000, 2000] {
            all.extend(call(len).encode());
        }
        let msg = describe_disagreement(&all, 1, world_name).unwrap();
        assert!(
            msg.contains("PE 0 calls all_reduce(Sum, BF16, sentinel, 1000 elements"),
            "{msg}"
        );
        assert!(
            msg.contains("PE 2 calls all_reduce(Sum, BF16, sentinel, 2000 elements"),
            "{msg}"
        );
        assert!(msg.contains("seen from PE 1"), "{msg}");
        let same: Vec<u64> = [call(5).encode(), call(5).encode()].concat();
        assert_eq!(describe_disagreement(&same, 0, world_name), None);
    }

    #[test]
    fn a_team_names_its_pes_by_world_and_team_number() {
        let all = [call(8).encode(), call(16).encode()].concat();
        let name = |p: usize| format!("PE {} (team PE {p})", 2 * p + 1);
        let msg = describe_disagreement(&all, 0, name).unwrap();
        assert!(
            msg.starts_with("PE 1 (team PE 0) calls all_reduce("),
            "{msg}"
        );
        assert!(msg.contains("while PE 3 (team PE 1) calls"), "{msg}");
        assert!(msg.contains("seen from PE 1 (team PE 0)"), "{msg}");
    }

    #[test]
    fn a_pe_that_cannot_go_on_is_named() {
        let all = [call(8).encode(), Record::Failed.encode()].concat();
        let msg = describe_disagreement(&all, 0, world_name).unwrap();
        assert!(msg.contains("PE 1 could not go on"), "{msg}");
    }

    #[test]
    fn configurations_differ_by_hash() {
        let a = CollectivesConfig::for_pes(2);
        let mut b = a.clone();
        assert_eq!(config_hash(&a), config_hash(&b));
        b.thresholds.oneshot_max_bytes += 1;
        assert_ne!(config_hash(&a), config_hash(&b));
        let all = [
            Record::Config {
                hash: config_hash(&a),
                n_pes: 2,
            }
            .encode(),
            Record::Config {
                hash: config_hash(&b),
                n_pes: 2,
            }
            .encode(),
        ]
        .concat();
        let msg = describe_disagreement(&all, 0, world_name).unwrap();
        assert!(
            msg.contains("PE 1 makes Collectives with configuration"),
            "{msg}"
        );
    }
}
