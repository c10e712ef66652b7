//! Device-initiated all-reduce, all-gather, reduce-scatter, reduce, broadcast and all-to-all
//! over NVLink: our kernels in `kernels/collectives.cu`, launched on a stream with no host
//! synchronisation, so they can be captured in CUDA graphs.
//!
//! A [`Collectives`] runs over every PE ([`Collectives::new`]) or over a team's
//! ([`Collectives::with_team`]); PE numbers and counts below (a root, `n_pes`, `my_pe`) are
//! the team's. Every PE of the team must make the same sequence of calls (same operations,
//! sizes and algorithms), as for any collective. A `Collectives` orders its calls: a call on
//! another stream than the last call's waits, on the device, for that stream (the calls share
//! one epoch, flags and staging). Graph launches are the caller's to order against other
//! calls. Back-to-back calls on the same buffers are safe: a call returns (on the stream)
//! only when no peer will touch this PE's buffers again for it. Our kernels' waits for a peer
//! are bounded ([`CollectivesConfig::timeout`]): a PE that skips a call, passes other
//! arguments or dies makes the others' calls fail with [`Error::Timeout`] instead of hanging.
//!
//! Our kernels need every PE of the team load/store reachable (one node with peer access).
//! On a team where they are not ([`Collectives::reach`]), the calls with `Auto` go through
//! NVSHMEM's team collectives, which run over any transport NVSHMEM has. Those wait for
//! their peers without a bound; [`CollectivesConfig::check_calls`] still agrees each call
//! on the host first.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::{AllReduceAlgo, Collectives, ReduceOp};
//! let shmem = nvshmem::Nvshmem::init()?;
//! let coll = Collectives::new(&shmem)?;
//! let x = shmem.malloc::<nvshmem::bf16>(1 << 20)?;
//! x.copy_from_host(&vec![nvshmem::bf16::ONE; 1 << 20])?;
//! coll.all_reduce(&x, &x, ReduceOp::Sum, AllReduceAlgo::Auto, shmem.stream())?; // in place
//! # Ok(()) }
//! ```
//!
//! The parts: [`algo`] (the algorithms as types, and the kernel names they give), `plan`
//! (grids and workspace limits of a call), [`config`] (the workspace, sized once, and the
//! thresholds of the automatic choice), `movement` (the broadcast and the all-to-all),
//! `copies` (the copy-engine paths of the moves: peer copies between two barrier kernels) and
//! this module (the workspace and the dispatch).

mod agree;
pub mod algo;
pub mod compressed;
pub mod config;
mod copies;
mod fault;
pub mod group;
mod members;
mod movement;
mod plan;
mod reach;

pub use algo::{
    kernel_names, AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, ReduceAlgo,
    ReduceScatterAlgo,
};
pub use compressed::Compression;
pub use config::{CollectivesConfig, Thresholds, Workspace, DEFAULT_TIMEOUT, TIMEOUT_VARIABLE};
pub use group::GROUP_MAX;
pub use movement::{ALL_TO_ALL_ONESHOT_BYTES, BROADCAST_ONESHOT_BYTES};
pub use reach::Reach;

use crate::abi;
use crate::cubins::COLLECTIVES;
use crate::element::{DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::{check_len, SetUp, SymmetricBuffer, SymmetricView};
use crate::module::{grid, Function, KernelArgs, LaunchOptions, Module};
use crate::order::CallOrder;
use crate::runtime::Nvshmem;
use crate::team::collectives::check_overlap;
use crate::team::Team;
pub(crate) use agree::Collective;
use agree::{agree_world, config_hash, Agreement, Record};
use algo::{
    all_gather_kernel, all_reduce_kernel, all_reduce_kernels, all_to_all_kernel, broadcast_kernel,
    reduce_kernel, reduce_kernels, reduce_scatter_kernel, reduce_scatter_kernels, type_and_op,
    Algo, Params,
};
use cudarc::driver::CudaStream;
use fault::FaultRecord;
pub(crate) use members::Members;
use plan::{
    all_gather_plan, all_gather_words_plan, all_reduce_plan, reduce_plan, reduce_scatter_plan,
    CallPlan, Dims, Extra,
};
use std::sync::Arc;
use std::time::Duration;

/// Where the waits' bound and the fault record's address sit in `Ctrl`, in words.
const CTRL_TIMEOUT: usize = abi::COLL_MAX_BLOCKS as usize;
const _: () = assert!(std::mem::offset_of!(abi::Ctrl, timeout_ns) == CTRL_TIMEOUT * 8);
const _: () = assert!(std::mem::offset_of!(abi::Ctrl, fault) == CTRL_TIMEOUT * 8 + 8);
/// Where the team (`CollTeam`, two words) sits in `Ctrl`, in words.
const CTRL_TEAM: usize = CTRL_TIMEOUT + 2;
const _: () = assert!(std::mem::offset_of!(abi::Ctrl, team) == CTRL_TEAM * 8);

/// Our collectives' kernels over the world or over a team (see the module documentation),
/// with their symmetric workspace.
pub struct Collectives {
    shmem: Nvshmem,
    /// The team's PEs (calls number PEs in it), and this PE's number there (none outside
    /// it, where every call fails first).
    members: Members,
    /// How the members reach each other, and where they do not all reach each other, the
    /// team NVSHMEM's collectives run the calls on (a member's; `None` outside).
    reach: Reach,
    nvshmem_team: Option<Team>,
    domain_size: Option<usize>,
    thresholds: Thresholds,
    programmatic_launch: bool,
    cooperative_launch: bool,
    check_calls: bool,
    timeout: Option<Duration>,
    max_blocks: Option<usize>,
    /// The workspace as configured (`dims` holds this team's slots in it).
    workspace: Workspace,
    /// Scratch of the agreements (configuration, and calls when `check_calls`).
    agreement: Agreement,
    /// Where a wait that ran out of time says so (read before every call).
    fault: FaultRecord,
    /// A call on another stream than the last call's is ordered after it (every call shares
    /// the epoch, the flags and the staging).
    order: CallOrder,
    dims: Dims,
    /// The epoch of this PE's calls, one copy per block index, then the waits' bound and
    /// the fault record's address (`Ctrl`).
    ctrl: SymmetricBuffer<u64>,
    flags: SymmetricBuffer<u64>,
    staging: SymmetricBuffer<u8>,
    /// The low-latency lines, a region no other path writes (every line starts at zero).
    lines: SymmetricBuffer<u8>,
    /// The sentinel all-reduce's receive buffers (every word starts as the sentinel).
    sentinel: SymmetricBuffer<u32>,
    /// Every PE's lines and sentinel base as mapped here, for the kernels that take a
    /// table; `None` above `LL_MAX_PES` PEs.
    tables: Option<(abi::Peers, abi::Peers)>,
    /// By algorithm row, type and operator (`algo::all_reduce_kernels` order); `None` where
    /// an algorithm does not take a type.
    all_reduce: Vec<Option<Function>>,
    /// By algorithm row.
    all_gather: Vec<Function>,
    /// The low-latency all-gather by output words (more than 2 PEs), for blocks of a multiple
    /// of 8 bytes and for the others.
    all_gather_words: [Function; 2],
    /// By algorithm row, type and operator (`algo::reduce_scatter_kernels` order).
    reduce_scatter: Vec<Function>,
    /// By algorithm row.
    broadcast: Vec<Function>,
    /// By algorithm row.
    all_to_all: Vec<Function>,
    all_to_all_v: Function,
    /// By algorithm row, type and operator (`algo::reduce_kernels` order).
    reduce: Vec<Function>,
    /// The all-to-all-v's counts as each PE publishes them: [parity][3 x n_pes] (see
    /// `push_alltoallv` in kernels/collectives/movement.cuh).
    counts_table: SymmetricBuffer<u64>,
    /// The copy-engine paths' barriers (before and after their copies), their copy into this
    /// PE's own output (by the SMs), and the copy stream of their copies to the peers.
    ce_open: Function,
    ce_close: Function,
    ce_local_copy: Function,
    copy_stream: Arc<CudaStream>,
    /// Every PE's control words as mapped here (where any symmetric address of a peer is).
    ctrl_peers: Vec<u64>,
    /// The compressed all-reduce's steps, and its scratch (`None` for a workspace with no
    /// `compressed_bytes`).
    compress: compressed::CompressKernels,
    compress_scratch: Option<compressed::CompressScratch>,
    /// The grouped all-reduce's kernels.
    group: group::GroupKernels,
}

// SAFETY: the tables hold device addresses, only ever passed to kernels; the functions and
// buffers are Send + Sync themselves.
unsafe impl Send for Collectives {}
unsafe impl Sync for Collectives {}

/// One call, checked and planned on this PE: what it agrees on with the other PEs, and what
/// it launches (`None` for an empty call).
struct Planned<'f> {
    record: Record,
    launch: Option<Work<'f>>,
}

/// What a call launches (made and consumed once per call: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Work<'f> {
    /// One kernel.
    Kernel(Launch<'f>),
    /// This PE's copies by the copy engines, between two barriers (`copies`).
    Copies(Vec<copies::PeerCopy>),
    /// NVSHMEM's team collective, on a team that is not [`Reach::Flat`].
    Team(TeamCall<'f>),
}

/// A call of NVSHMEM's team collectives on the stream it is given.
type TeamCall<'f> = Box<dyn FnOnce(&Arc<CudaStream>) -> Result<()> + 'f>;

struct Launch<'f> {
    function: &'f Function,
    grid: cudarc::driver::LaunchConfig,
    args: KernelArgs<'f>,
}

impl Planned<'static> {
    /// A call that launches nothing here, only agreed on (a call of several launches,
    /// made after it is agreed).
    fn agree_only(record: Record) -> Self {
        Planned {
            record,
            launch: None,
        }
    }
}

/// `record`'s call, launching what `launch` plans unless the call is `empty` (moves
/// nothing, on every PE alike).
fn planned<'f>(
    record: Record,
    empty: bool,
    launch: impl FnOnce() -> Result<Launch<'f>>,
) -> Result<Planned<'f>> {
    Ok(Planned {
        record,
        launch: if empty {
            None
        } else {
            Some(Work::Kernel(launch()?))
        },
    })
}

/// The row of a call that NVSHMEM's team collectives run, in the agreement's records.
pub(crate) const TEAM_ROW: usize = 0xFF;

/// `record`'s call by NVSHMEM's team collectives, unless the call is `empty`.
fn planned_team<'f>(
    record: Record,
    empty: bool,
    call: impl FnOnce(&Arc<CudaStream>) -> Result<()> + 'f,
) -> Planned<'f> {
    Planned {
        record,
        launch: (!empty).then(|| Work::Team(Box::new(call))),
    }
}

/// `record`'s call by the copy engines, making `copies` unless the call is `empty`.
fn planned_copies(
    record: Record,
    empty: bool,
    copies: impl FnOnce() -> Vec<copies::PeerCopy>,
) -> Planned<'static> {
    Planned {
        record,
        launch: (!empty).then(|| Work::Copies(copies())),
    }
}

/// Whether `stream` is being captured into a graph.
fn capturing(shmem: &Nvshmem, stream: &Arc<CudaStream>) -> Result<bool> {
    Ok(shmem.capture_id(stream)?.is_some())
}

impl Drop for Collectives {
    fn drop(&mut self) {
        // A call may still run on any stream: it reads the workspace and may write the fault
        // record, which are freed next (the buffers would wait too, the record would not).
        let _ = self.shmem.quiesce();
    }
}

impl std::fmt::Debug for Collectives {
    /// The team (world PEs), this PE's place in it, how its members reach each other (which
    /// says what runs the calls) and the launch settings.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collectives")
            .field("team", &self.members.world_pes())
            .field("my_pe", &self.my_pe())
            .field("reach", &self.reach)
            .field(
                "runs_calls",
                &match self.reach {
                    Reach::Flat => "our kernels",
                    _ => "NVSHMEM's team collectives",
                },
            )
            .field("max_blocks", &self.max_blocks)
            .field("timeout", &self.timeout)
            .field("check_calls", &self.check_calls)
            .finish_non_exhaustive()
    }
}

/// Where `buf` lives on every member, as mapped here (null where it is not), in team order;
/// `None` above `LL_MAX_PES` members.
fn peer_table<T: Element>(
    members: &Members,
    buf: &SymmetricBuffer<T>,
) -> Result<Option<abi::Peers>> {
    let n = members.n();
    if n > abi::LL_MAX_PES as usize {
        return Ok(None);
    }
    let mut table = abi::Peers {
        me: members.me().unwrap_or(0) as i32,
        npes: n as i32,
        ..Default::default()
    };
    for pe in 0..n {
        table.slot[pe] = buf
            .peer_ptr(members.world_pe(pe))?
            .map_or(std::ptr::null_mut(), |p| p as *mut std::ffi::c_char);
    }
    Ok(Some(table))
}

impl Collectives {
    /// Load the kernels and allocate the symmetric workspace (collective), with the default
    /// configuration for this PE count.
    pub fn new(shmem: &Nvshmem) -> Result<Self> {
        // `for_pes` falls back to the default on a malformed variable; say so here.
        let variable = config::timeout_from(std::env::var(TIMEOUT_VARIABLE).ok().as_deref());
        Self::build(
            (shmem, None),
            Ok(Members::world(shmem)),
            CollectivesConfig::for_pes(shmem.n_pes()),
            variable.map(|_| ()),
        )
    }

    /// [`new`](Self::new) with an explicit configuration; every PE must pass the same. The
    /// thresholds must fit the workspace.
    pub fn with_config(shmem: &Nvshmem, config: CollectivesConfig) -> Result<Self> {
        Self::build((shmem, None), Ok(Members::world(shmem)), config, Ok(()))
    }

    /// Our collectives over `team`: calls run between its PEs only, which number PEs (a
    /// root, an all-gather's blocks) in the team. Collective over the world, as every
    /// symmetric allocation is: every PE calls it at the same point with the same `config`
    /// (sized for the largest team, [`CollectivesConfig::for_pes`]), each with its own team
    /// (the one a split gave it), and `None` or a team without it on a PE outside every team;
    /// there the calls fail with a clear error. Teams may be disjoint (one `Collectives` per
    /// pair of a split) or overlap (the rows and the columns of [`Team::split_2d`], one
    /// `Collectives` each); each has its own workspace. `Collectives` whose calls run at
    /// once on different streams must fit the GPU together: give each a
    /// [`CollectivesConfig::max_blocks`].
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{AllReduceAlgo, Collectives, CollectivesConfig, ReduceOp};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// // Pairs of neighbours: PEs 0 and 1, 2 and 3, ...
    /// let (pair, _columns) = shmem.team_world().split_2d(2)?;
    /// let coll = Collectives::with_team(&shmem, pair.as_ref(), CollectivesConfig::for_pes(2))?;
    /// let x = shmem.malloc::<f32>(4096)?;
    /// coll.all_reduce(&x, &x, ReduceOp::Sum, AllReduceAlgo::Auto, shmem.stream())?; // within the pair
    /// # Ok(()) }
    /// ```
    pub fn with_team(
        shmem: &Nvshmem,
        team: Option<&Team>,
        config: CollectivesConfig,
    ) -> Result<Self> {
        Self::build((shmem, team), Members::of_team(shmem, team), config, Ok(()))
    }

    /// Construction over `members` (of `team`; none: the world), with the outcome of checks
    /// made before (`local`).
    fn build(
        (shmem, of_team): (&Nvshmem, Option<&Team>),
        members: Result<Members>,
        config: CollectivesConfig,
        local: Result<()>,
    ) -> Result<Self> {
        let max_pes = abi::COLL_MAX_PES as usize;
        // A team that cannot be taken fails here, after the agreements below (as an outsider,
        // so that the others do not wait for this PE).
        let (members, local) = match members {
            Ok(m) => (m, local),
            Err(e) => (Members::outside(shmem), local.and(Err(e))),
        };
        let n = members.n();
        // What this PE does alone first. Its outcome is agreed with the configuration below,
        // so that a PE that cannot go on (a module that does not load on its GPU) fails every
        // PE instead of leaving them waiting.
        let local = local
            .and_then(|()| {
                if shmem.n_pes() > max_pes {
                    return Err(Error::InvalidArgument(format!(
                        "our collectives support up to {max_pes} PEs ({} running); use \
                         Team::all_reduce",
                        shmem.n_pes()
                    )));
                }
                if config.domain_size == Some(0) {
                    return Err(Error::InvalidArgument(
                        "CollectivesConfig::domain_size is Some(0): a domain holds a PE at \
                         least; give None for what the hardware reaches"
                            .into(),
                    ));
                }
                if config.max_blocks == Some(0) {
                    return Err(Error::InvalidArgument(
                        "CollectivesConfig::max_blocks is Some(0): a call needs a block; \
                         give None for every SM"
                            .into(),
                    ));
                }
                config.workspace.check(shmem.n_pes())
            })
            .and_then(|()| {
                let module = Module::load(shmem, &COLLECTIVES)?;
                let all_reduce = all_reduce_kernels()
                    .map(|(row, t, o)| {
                        t.map(|t| module.function(&all_reduce_kernel(row, t, o)))
                            .transpose()
                    })
                    .collect::<Result<Vec<_>>>()?;
                let all_gather = algo::ALL_GATHER_ROWS
                    .iter()
                    .map(|row| module.function(&all_gather_kernel(row)))
                    .collect::<Result<Vec<_>>>()?;
                let [whole, cut] = algo::ALL_GATHER_WORDS_KERNELS;
                let words = [module.function(whole)?, module.function(cut)?];
                let all_gather = (all_gather, words);
                let reduce_scatter = reduce_scatter_kernels()
                    .map(|(row, t, o)| module.function(&reduce_scatter_kernel(row, t, o)))
                    .collect::<Result<Vec<_>>>()?;
                let broadcast = algo::BROADCAST_ROWS
                    .iter()
                    .map(|row| module.function(&broadcast_kernel(row)))
                    .collect::<Result<Vec<_>>>()?;
                let all_to_all = algo::ALL_TO_ALL_ROWS
                    .iter()
                    .map(|row| module.function(&all_to_all_kernel(row)))
                    .collect::<Result<Vec<_>>>()?;
                let all_to_all_v = module.function(algo::ALL_TO_ALL_V_KERNEL)?;
                let reduce = reduce_kernels()
                    .map(|(row, t, o)| module.function(&reduce_kernel(row, t, o)))
                    .collect::<Result<Vec<_>>>()?;
                let barriers = (
                    module.function(algo::CE_OPEN_KERNEL)?,
                    module.function(algo::CE_CLOSE_KERNEL)?,
                    module.function(algo::CE_LOCAL_COPY_KERNEL)?,
                );
                Ok((
                    (all_reduce, all_gather, reduce_scatter, reduce),
                    (broadcast, all_to_all, all_to_all_v, barriers),
                    (
                        FaultRecord::new(shmem, &members)?,
                        compressed::CompressKernels::load(&module)?,
                        group::GroupKernels::load(&module)?,
                    ),
                ))
            });
        // Every PE's team and launch limits, whatever happened here (the gathers are
        // collective). Members that passed different teams, or thresholds that do not fit
        // this team's part of the workspace, fail like a local check.
        let (largest_team, same_team) = agreed_teams(shmem, &members)?;
        let limits = agreed_limits(shmem, local.as_ref().map_or(&[][..], |l| &l.0 .0[..]))?;
        let cap = config.max_blocks.unwrap_or(usize::MAX);
        // Outside the team no call is made: any size that plans.
        let team_n = if members.is_member() { n } else { largest_team };
        // The workspace has a slot per PE of the largest team: a smaller team's slots are
        // larger, so that whatever fits the largest fits it.
        let slot = |bytes| plan::team_slot_bytes(bytes, largest_team, team_n);
        let w = &config.workspace;
        let dims = Dims {
            n_pes: team_n,
            sm_count: limits.sm_count.min(cap),
            bandwidth_max_blocks: (limits.sm_count * limits.per_sm)
                .min(plan::MAX_BLOCKS)
                .min(cap),
            staging_slot_bytes: slot(w.staging_slot_bytes),
            lines_slot_bytes: slot(w.lines_slot_bytes),
            sentinel_slot_bytes: slot(w.sentinel_slot_bytes),
            compressed_bytes: w.compressed_bytes,
        };
        let local = same_team
            .and_then(|()| config.thresholds.check_fits(&dims))
            .and(local);
        // Before anything that depends on it: the same configuration on every PE of the
        // world (each allocates the same workspace, whatever its team).
        let record = match &local {
            Ok(_) => Record::Config {
                hash: config_hash(&config),
                n_pes: shmem.n_pes() as u64,
            },
            Err(_) => Record::Failed,
        };
        let agreed = agree_world(shmem, record, config.timeout);
        let (
            (all_reduce, all_gather, reduce_scatter, reduce),
            (broadcast, all_to_all, all_to_all_v, (ce_open, ce_close, ce_local_copy)),
            (fault, compress, group),
        ) = local?;
        agreed?;
        let agreement = Agreement::new(shmem, &members)?;

        // Sized for the largest team, alike on every PE (symmetric allocations).
        let room = largest_team;
        let ctrl = shmem.calloc::<u64>(std::mem::size_of::<abi::Ctrl>() / 8)?;
        let bound = config
            .timeout
            .map_or(0, |t| t.as_nanos().clamp(1, u64::MAX as u128) as u64);
        ctrl.view(CTRL_TIMEOUT..CTRL_TIMEOUT + 2)
            .copy_from_host(&[bound, fault.addr()])?;
        let team = members.ctrl_team();
        ctrl.view(CTRL_TEAM..CTRL_TEAM + 2).copy_from_host(&[
            (team.me as u32 as u64) | (team.npes as u32 as u64) << 32,
            (team.start as u32 as u64) | (team.stride as u32 as u64) << 32,
        ])?;
        let flags = shmem.calloc::<u64>(abi::COLL_FLAG_SETS as usize * plan::MAX_BLOCKS * room)?;
        let staging = shmem.malloc::<u8>(2 * room * w.staging_slot_bytes)?;
        // Zeroed: no tag is 0, so no line is taken for data before it is sent (a dropped
        // workspace's lines would be).
        let lines = shmem.calloc::<u8>(2 * room * w.lines_slot_bytes)?;
        // Which members this PE reaches by loads and stores (one node, NVLink or PCIe peer
        // access), gathered from every PE: our kernels run on a team where all reach all.
        let mapped = (0..n)
            .map(|pe| ctrl.peer_ptr(members.world_pe(pe)))
            .collect::<Result<Vec<_>>>()?;
        let mine = match members.me() {
            Ok(me) => reach::report(
                me,
                &mapped.iter().map(Option::is_some).collect::<Vec<_>>(),
                config.domain_size,
            ),
            Err(_) => 0,
        };
        let reports = shmem.set_up_gather(SetUp::CollectivesReach, mine)?;
        let reach = reach::classify(
            &members
                .world_pes()
                .iter()
                .map(|&w| reports[w])
                .collect::<Vec<_>>(),
        );
        let ctrl_peers: Vec<u64> = match reach {
            // Every member reaches every other: all mapped.
            Reach::Flat => mapped.iter().map(|p| p.map_or(0, |p| p as u64)).collect(),
            // Our kernels never run; NVSHMEM's collectives go where loads and stores do not.
            _ => vec![0; n],
        };
        // The members' own team, for NVSHMEM's collectives (the split is collective over
        // the team's members, who all classified the reach alike).
        let nvshmem_team = match (reach, members.is_member(), of_team) {
            (Reach::Flat, ..) | (_, false, _) => None,
            (_, true, None) => Some(shmem.team_world()),
            (_, true, Some(team)) => team.split_strided(0, 1, team.n_pes())?,
        };
        let copy_stream = shmem.new_stream()?;
        let counts_table = shmem.calloc::<u64>(2 * 3 * room)?;
        let sentinel = shmem.malloc::<u32>(2 * room * w.sentinel_slot_bytes / 4)?;
        sentinel.copy_from_host(&vec![abi::COLL_SENTINEL; sentinel.len()])?;
        let compress_scratch =
            compressed::CompressScratch::new(shmem, dims.compressed_bytes, room)?;
        let tables = match (
            peer_table(&members, &lines)?,
            peer_table(&members, &sentinel)?,
        ) {
            (Some(s), Some(t)) => Some((s, t)),
            _ => None,
        };
        // Flags and the epoch must be zero everywhere before anyone signals (the zeroing
        // allocations and the copies above are complete).
        shmem.set_up_barrier(SetUp::Collectives)?;
        Ok(Collectives {
            shmem: shmem.clone(),
            members,
            reach,
            nvshmem_team,
            domain_size: config.domain_size,
            thresholds: config.thresholds,
            programmatic_launch: config.programmatic_launch,
            cooperative_launch: config.cooperative_launch,
            check_calls: config.check_calls,
            timeout: config.timeout,
            max_blocks: config.max_blocks,
            workspace: config.workspace.clone(),
            agreement,
            fault,
            order: CallOrder::new(),
            dims,
            ctrl,
            flags,
            staging,
            lines,
            sentinel,
            tables,
            all_reduce,
            all_gather: all_gather.0,
            all_gather_words: all_gather.1,
            reduce_scatter,
            broadcast,
            all_to_all,
            all_to_all_v,
            reduce,
            counts_table,
            ce_open,
            ce_close,
            ce_local_copy,
            copy_stream,
            ctrl_peers,
            compress,
            compress_scratch,
            group,
        })
    }

    /// The configuration in use: the thresholds now, the workspace allocated at
    /// construction, and how calls are launched.
    pub fn config(&self) -> CollectivesConfig {
        CollectivesConfig {
            thresholds: self.thresholds.clone(),
            workspace: self.workspace(),
            programmatic_launch: self.programmatic_launch,
            cooperative_launch: self.cooperative_launch,
            check_calls: self.check_calls,
            timeout: self.timeout,
            max_blocks: self.max_blocks,
            domain_size: self.domain_size,
        }
    }

    /// `Err(Error::Timeout)` once a wait of this PE's calls for a peer ran out of time (see
    /// [`CollectivesConfig::timeout`]), and `Err(Error::InvalidArgument)` on a PE outside
    /// the team; every call checks this first. Reads host memory only: it neither waits for
    /// a stream nor blocks.
    pub fn check(&self) -> Result<()> {
        self.members.me()?;
        self.fault.check()
    }

    /// Start the call counter (the epoch) of every later call at `epoch`, on this PE; every
    /// PE of the team must set the same, with no call in flight (they agree on it). For tests of what happens after billions
    /// of calls (flag values and low-latency tags derive from it). The counter only moves
    /// forward (flags written at a later epoch would pass every wait of an earlier one), and
    /// stays below 2^44 (where the bandwidth all-reduce's flag values would wrap).
    #[doc(hidden)]
    pub fn set_epoch_for_test(&self, epoch: u64) -> Result<()> {
        self.check()?;
        self.shmem.quiesce()?;
        let now = self.ctrl.view(..1).to_vec()?[0];
        let limit = 1u64 << (64 - abi::COLL_ROUND_BITS);
        if epoch < now || epoch >= limit - 1 {
            return Err(Error::InvalidArgument(format!(
                "set_epoch_for_test({epoch}): the epoch is {now}; it may only move forward, and \
                 stay below {limit}"
            )));
        }
        self.ctrl
            .view(..plan::MAX_BLOCKS)
            .copy_from_host(&vec![epoch; plan::MAX_BLOCKS])?;
        // Every member has set it before any goes on.
        let record = Record::Config {
            hash: epoch,
            n_pes: self.members.n() as u64,
        };
        self.agreement.agree(&self.shmem, record, self.timeout)
    }

    /// PEs in the team the calls run over (the world's for [`new`](Self::new)).
    pub fn n_pes(&self) -> usize {
        self.members.n()
    }

    /// This PE's number in the team, `None` on a PE outside it (whose calls fail).
    pub fn my_pe(&self) -> Option<usize> {
        self.members.me().ok()
    }

    /// The world PE of the team's PE `pe`.
    pub fn world_pe(&self, pe: usize) -> Result<usize> {
        match self.members.world_pes().get(pe) {
            Some(&w) => Ok(w),
            None => Err(Error::PeOutOfRange {
                pe,
                n_pes: self.members.n(),
            }),
        }
    }

    /// The team's PEs, for the layers that communicate beside the calls (src/tp).
    #[cfg(feature = "tp")]
    pub(crate) fn members(&self) -> &Members {
        &self.members
    }

    /// The thresholds of the automatic choice.
    pub fn thresholds(&self) -> &Thresholds {
        &self.thresholds
    }

    /// Change the thresholds of the automatic choice. They must fit the workspace allocated
    /// at construction. Collective: every PE makes the same change at the same point of its
    /// calls, and the PEs check that they agree ([`Error::CollectiveMismatch`] otherwise,
    /// with the thresholds unchanged).
    pub fn set_thresholds(&mut self, thresholds: Thresholds) -> Result<()> {
        thresholds.check_fits(&self.dims)?;
        let config = CollectivesConfig {
            thresholds: thresholds.clone(),
            ..self.config()
        };
        self.agreement.agree(
            &self.shmem,
            Record::Config {
                hash: config_hash(&config),
                n_pes: self.dims.n_pes as u64,
            },
            self.timeout,
        )?;
        self.thresholds = thresholds;
        Ok(())
    }

    /// The workspace allocated at construction.
    pub fn workspace(&self) -> Workspace {
        self.workspace.clone()
    }

    /// The algorithm `Auto` picks for an all-reduce of `bytes` of `dtype` per PE.
    pub fn choose_all_reduce(&self, dtype: DataType, bytes: usize) -> AllReduceAlgo {
        self.thresholds
            .choose_all_reduce(dtype, bytes, self.tables.is_some())
    }

    /// The algorithm `Auto` picks for an all-gather of `bytes` per PE.
    pub fn choose_all_gather(&self, bytes: usize) -> AllGatherAlgo {
        self.thresholds
            .choose_all_gather(bytes, self.tables.is_some())
    }

    /// The reduce-scatter algorithm `Auto` picks for blocks of `bytes` (each PE's output).
    pub fn choose_reduce_scatter(&self, bytes: usize) -> ReduceScatterAlgo {
        self.thresholds
            .choose_reduce_scatter(bytes, self.tables.is_some())
    }

    fn check_view<T: Element>(
        &self,
        view: &SymmetricView<'_, T>,
        what: &'static str,
    ) -> Result<()> {
        self.shmem.check_same_runtime(view.runtime(), what)?;
        if !(view.as_ptr() as usize).is_multiple_of(16) {
            return Err(Error::Misaligned { what, align: 16 });
        }
        Ok(())
    }

    /// `dst[i] = op over PEs of src[i]`, for `f32`, `f16`, `bf16` (accumulated in f32) and
    /// `i32`, with `Sum`, `Max` or `Min`. `dst` and `src` may be the same buffer (in place);
    /// they must not otherwise overlap. The result is bitwise identical on every PE.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{AllReduceAlgo, Collectives, ReduceOp};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let coll = Collectives::new(&shmem)?;
    /// let (grads, sum) = (shmem.malloc::<f32>(4096)?, shmem.malloc::<f32>(4096)?);
    /// coll.all_reduce(&sum, &grads, ReduceOp::Sum, AllReduceAlgo::Auto, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        op: ReduceOp,
        algo: AllReduceAlgo,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        self.call(|| self.plan_all_reduce(&dst, &src, op, algo), stream)
    }

    /// Check and plan an all-reduce on this PE.
    fn plan_all_reduce<'f, T: Element>(
        &'f self,
        dst: &SymmetricView<'f, T>,
        src: &SymmetricView<'f, T>,
        op: ReduceOp,
        algo: AllReduceAlgo,
    ) -> Result<Planned<'f>> {
        let (t, o) = type_and_op::<T>(op, "all-reduce", "all_reduce")?;
        self.check_view(src, "the all_reduce source")?;
        self.check_view(dst, "the all_reduce destination")?;
        check_len("all_reduce destination", src.len(), dst.len())?;
        check_overlap("all_reduce", dst, src, true)?;
        let c = Collective::AllReduce;
        if let Some(team) = self.nvshmem_route(algo == AllReduceAlgo::Auto, c)? {
            let record = self.call_record(c, Some(op), TEAM_ROW, dst, src, src.len());
            let (dst, src) = (*dst, *src);
            let call = move |s: &Arc<CudaStream>| team.all_reduce(dst, src, op, s);
            return Ok(planned_team(record, src.is_empty(), call));
        }
        let bytes = src.num_bytes();
        let algo = match algo {
            AllReduceAlgo::Auto => self.choose_all_reduce(T::DTYPE, bytes),
            a => a,
        };
        if !algo.takes(T::DTYPE) {
            return Err(Error::TypeMismatch {
                what: format!("the {algo} all-reduce (any i32 value could pass for its sentinel)"),
                expected: "f32, f16 or bf16; use Auto for i32",
                got: T::NVSHMEM_NAME.into(),
            });
        }
        let row = algo.index().expect("Auto was resolved");
        let record = self.call_record(Collective::AllReduce, Some(op), row, dst, src, src.len());
        let function = self.all_reduce[algo::reduction_slot(row, t, o)]
            .as_ref()
            .expect("every algorithm that takes a type has its kernels");
        planned(record, src.is_empty(), || {
            self.plan_launch(
                function,
                &algo,
                algo::ALL_REDUCE_ROWS[row].params,
                all_reduce_plan(algo, bytes, &self.dims),
                (src.as_ptr() as u64, dst.as_ptr() as u64),
                src.len(),
                bytes,
            )
        })
    }

    /// `dst[pe * n .. (pe + 1) * n] = src on PE pe`, `n = src.len()`, for any element type.
    /// `dst.len()` must be `n * n_pes`; `dst` and `src` must not overlap.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{AllGatherAlgo, Collectives};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let coll = Collectives::new(&shmem)?;
    /// let mine = shmem.malloc::<u16>(1024)?;
    /// let all = shmem.malloc::<u16>(1024 * shmem.n_pes())?;
    /// coll.all_gather(&all, &mine, AllGatherAlgo::Auto, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn all_gather<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        algo: AllGatherAlgo,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        self.call(|| self.plan_all_gather(&dst, &src, algo), stream)
    }

    /// Check and plan an all-gather on this PE.
    fn plan_all_gather<'f, T: Element>(
        &'f self,
        dst: &SymmetricView<'f, T>,
        src: &SymmetricView<'f, T>,
        algo: AllGatherAlgo,
    ) -> Result<Planned<'f>> {
        self.check_view(src, "the all_gather source")?;
        self.check_view(dst, "the all_gather destination")?;
        check_len(
            "all_gather destination (n_pes x source)",
            src.len() * self.dims.n_pes,
            dst.len(),
        )?;
        check_overlap("all_gather", dst, src, false)?;
        let bytes = src.num_bytes();
        let c = Collective::AllGather;
        if let Some(team) = self.nvshmem_route(algo == AllGatherAlgo::Auto, c)? {
            let record = self.call_record(c, None, TEAM_ROW, dst, src, src.len());
            let (dst, src) = (*dst, *src);
            let call = move |s: &Arc<CudaStream>| team.all_gather(dst, src, s);
            return Ok(planned_team(record, bytes == 0, call));
        }
        let algo = match algo {
            AllGatherAlgo::Auto => self.choose_all_gather(bytes),
            a => a,
        };
        let row = algo.index().expect("Auto was resolved");
        let record = self.call_record(Collective::AllGather, None, row, dst, src, src.len());
        if algo == AllGatherAlgo::CopyEngine {
            let (dst, src) = (dst.as_ptr() as u64, src.as_ptr() as u64);
            return Ok(planned_copies(record, bytes == 0, || {
                self.all_gather_copies(dst, src, bytes)
            }));
        }
        // On more than 2 PEs the low-latency all-gather goes by output words, where they fit.
        let (function, plan) = match all_gather_words_plan(algo, bytes, &self.dims) {
            Some(plan) => (
                &self.all_gather_words[usize::from(!bytes.is_multiple_of(8))],
                plan,
            ),
            None => (
                &self.all_gather[row],
                all_gather_plan(algo, bytes, &self.dims),
            ),
        };
        planned(record, bytes == 0, || {
            self.plan_launch(
                function,
                &algo,
                algo::ALL_GATHER_ROWS[row].params,
                plan,
                (src.as_ptr() as u64, dst.as_ptr() as u64),
                bytes,
                bytes,
            )
        })
    }

    /// `dst = op over PEs of block my_pe of src`: `src` holds `n_pes` blocks of
    /// `dst.len()` elements, and PE `p` gets block `p` reduced over every PE, in PE order (in
    /// f32 for 16-bit types), for `f32`, `f16`, `bf16` and `i32` with `Sum`, `Max` or `Min`.
    /// `dst` and `src` must not overlap. Blocks that start on 16-byte boundaries (a block
    /// of a multiple of 16 bytes) go by vectors; others element by element, more slowly.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{Collectives, ReduceOp, ReduceScatterAlgo};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let coll = Collectives::new(&shmem)?;
    /// let grads = shmem.malloc::<f32>(4096 * shmem.n_pes())?;
    /// let mine = shmem.malloc::<f32>(4096)?; // this PE's block, summed over PEs
    /// coll.reduce_scatter(&mine, &grads, ReduceOp::Sum, ReduceScatterAlgo::Auto, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        op: ReduceOp,
        algo: ReduceScatterAlgo,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        self.call(|| self.plan_reduce_scatter(&dst, &src, op, algo), stream)
    }

    /// Check and plan a reduce-scatter on this PE.
    fn plan_reduce_scatter<'f, T: Element>(
        &'f self,
        dst: &SymmetricView<'f, T>,
        src: &SymmetricView<'f, T>,
        op: ReduceOp,
        algo: ReduceScatterAlgo,
    ) -> Result<Planned<'f>> {
        let (t, o) = type_and_op::<T>(op, "reduce-scatter", "reduce_scatter")?;
        self.check_view(src, "the reduce_scatter source")?;
        self.check_view(dst, "the reduce_scatter destination")?;
        check_len(
            "reduce_scatter source (n_pes x destination)",
            dst.len() * self.dims.n_pes,
            src.len(),
        )?;
        check_overlap("reduce_scatter", dst, src, false)?;
        let c = Collective::ReduceScatter;
        if let Some(team) = self.nvshmem_route(algo == ReduceScatterAlgo::Auto, c)? {
            // NVSHMEM stops the kernel where the input does not fit its scratch: refuse first.
            crate::team::collectives::check_reduce_scatter_scratch(src.num_bytes(), team.n_pes())?;
            let record = self.call_record(c, Some(op), TEAM_ROW, dst, src, dst.len());
            let (dst, src) = (*dst, *src);
            let call = move |s: &Arc<CudaStream>| team.reduce_scatter(dst, src, op, s);
            return Ok(planned_team(record, dst.is_empty(), call));
        }
        let algo = match algo {
            ReduceScatterAlgo::Auto => self.choose_reduce_scatter(dst.num_bytes()),
            a => a,
        };
        let row = algo.index().expect("Auto was resolved");
        let record = self.call_record(
            Collective::ReduceScatter,
            Some(op),
            row,
            dst,
            src,
            dst.len(),
        );
        let bytes = dst.num_bytes();
        let function = &self.reduce_scatter[algo::reduction_slot(row, t, o)];
        planned(record, bytes == 0, || {
            self.plan_launch(
                function,
                &algo,
                algo::REDUCE_SCATTER_ROWS[row].params,
                reduce_scatter_plan(algo, bytes, &self.dims),
                (src.as_ptr() as u64, dst.as_ptr() as u64),
                dst.len(),
                bytes,
            )
        })
    }

    /// What a call publishes for the agreement. Buffers are named by where they sit in the
    /// symmetric heap, as an offset from our workspace: the same on every PE for the same
    /// symmetric location, whatever each PE's mapping.
    fn call_record<T: Element>(
        &self,
        collective: Collective,
        op: Option<ReduceOp>,
        row: usize,
        dst: &SymmetricView<'_, T>,
        src: &SymmetricView<'_, T>,
        len: usize,
    ) -> Record {
        let offset = |p: *mut T| (p as u64).wrapping_sub(self.ctrl.addr()) as i64;
        Record::Call {
            collective,
            dtype: T::DTYPE,
            op,
            row,
            len,
            dst: offset(dst.as_ptr()),
            src: offset(src.as_ptr()),
            root: None,
        }
    }

    /// SMs every PE can use (the smallest over PEs): kernels whose blocks pair up with the
    /// same block of every peer size their grids by it.
    #[cfg(feature = "tp")]
    pub(crate) fn sm_count(&self) -> usize {
        self.dims.sm_count
    }

    /// Whether a fused call ([`fused_call`](Self::fused_call)) can exchange `bytes` per PE
    /// through the low-latency lines: up to `LL_MAX_PES` PEs, and room in a lines slot.
    #[cfg(feature = "tp")]
    pub(crate) fn fused_lines_fit(&self, bytes: usize) -> bool {
        bytes <= self.fused_lines_room()
    }

    /// The data bytes per PE a fused call can exchange through the low-latency lines: half
    /// a lines slot, as a fused call's rows are whole lines (16 bytes carry 8 of data; the
    /// collectives' own limit leaves a line more for inputs of any length); none above
    /// `LL_MAX_PES` PEs (no peer table).
    #[cfg(feature = "tp")]
    fn fused_lines_room(&self) -> usize {
        match self.tables {
            Some(_) => self.dims.lines_slot_bytes / 2,
            None => 0,
        }
    }

    /// A call of `function`, a kernel of another module that follows our collectives'
    /// protocol (kernels/collectives/call.cuh) and takes the parameters every collective
    /// takes (`src, dst, len, ctrl, flags, region, slot_bytes`, its region the low-latency
    /// lines), then the peer table, then `extra`: a GEMM fused with its all-reduce, whose
    /// result `dst` is the same on every PE. Like every call, it is checked against this
    /// `Collectives`' state, agreed on with `check_calls`, ordered after the last call and
    /// launched on the one launch path. `staged` is what it exchanges per PE from `src` (data
    /// bytes), `blocks` × `threads` its grid (the same on every PE), `collective` what the
    /// PEs agree they are calling.
    ///
    /// # Safety
    /// `extra` must be the kernel's last parameter and `src` and everything `extra` points
    /// at valid for the kernel, until it has run on `stream`.
    #[cfg(feature = "tp")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn fused_call<X: Copy + 'static>(
        &self,
        collective: Collective,
        function: &Function,
        dst: SymmetricView<'_, half::bf16>,
        (src, staged): (u64, usize),
        (blocks, threads): (u32, u32),
        extra: X,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let plan = || {
            self.check_view(&dst, "the fused call's output")?;
            let (base, slot_bytes, room) = (
                self.lines.addr(),
                self.dims.lines_slot_bytes,
                self.fused_lines_room(),
            );
            if staged > room {
                return Err(Error::InvalidArgument(format!(
                    "{} exchanges {staged} bytes per PE, more than its region holds ({room} \
                     bytes; lines: up to {} PEs): a larger CollectivesConfig::workspace, or \
                     fewer tokens per call",
                    function.name(),
                    abi::LL_MAX_PES
                )));
            }
            if blocks == 0 || blocks as usize > plan::MAX_BLOCKS {
                return Err(Error::InvalidArgument(format!(
                    "{} with {blocks} blocks: a call takes 1 to {} (one epoch copy each)",
                    function.name(),
                    plan::MAX_BLOCKS
                )));
            }
            let record = Record::Call {
                collective,
                dtype: DataType::BF16,
                op: Some(ReduceOp::Sum),
                row: 0,
                len: dst.len(),
                dst: (dst.as_ptr() as u64).wrapping_sub(self.ctrl.addr()) as i64,
                // The input is this PE's own memory: nothing to agree on.
                src: 0,
                root: None,
            };
            let mut args = KernelArgs::new();
            args.device_ptr(src)
                .device_ptr(dst.as_ptr() as u64)
                .value(dst.len())
                .device_ptr(self.ctrl.addr())
                .device_ptr(self.flags.addr())
                .device_ptr(base)
                .value(slot_bytes);
            if let Some((lines, _)) = self.tables {
                args.value(lines);
            }
            args.value(extra);
            planned(record, dst.is_empty(), || {
                Ok(Launch {
                    function,
                    grid: grid(blocks, threads),
                    args,
                })
            })
        };
        self.call(plan, stream)
    }

    /// With `check_calls`, agree with every PE on this call before launching it: each PE
    /// publishes its call, or that it cannot make it (its checks failed, or an earlier call
    /// ran out of time), so that no PE waits for one that returned. Skipped while `stream` is
    /// being captured (a graph replays what was checked when it ran eagerly, and the
    /// exchange cannot be captured). Returns this PE's own error first.
    fn agree_call<'f>(
        &self,
        planned: Result<Planned<'f>>,
        stream: &Arc<CudaStream>,
    ) -> Result<Planned<'f>> {
        if !self.check_calls || capturing(&self.shmem, stream)? {
            return planned;
        }
        let record = planned.as_ref().map_or(Record::Failed, |p| p.record);
        let agreed = self.agreement.agree(&self.shmem, record, self.timeout);
        let planned = planned?;
        agreed.map(|()| planned)
    }

    /// The launch of one call: the parameters every kernel takes
    /// (`src, dst, n, ctrl, flags, region, slot_bytes`), then its by-value one; checked
    /// against the algorithm's part of the workspace.
    #[allow(clippy::too_many_arguments)]
    fn plan_launch<'f, A: Algo>(
        &self,
        function: &'f Function,
        algo: &A,
        params: Params,
        plan: CallPlan,
        (src, dst): (u64, u64),
        n: usize,
        bytes: usize,
    ) -> Result<Launch<'f>> {
        if bytes > plan.limit {
            return Err(Error::InvalidArgument(format!(
                "{algo:?} {} of {bytes} bytes exceeds its part of the workspace ({} bytes); use \
                 Auto (it picks an algorithm that fits), or a larger \
                 CollectivesConfig::workspace",
                A::WHAT,
                plan.limit
            )));
        }
        let (region, slot_bytes) = match params {
            Params::SentinelPeers => (self.sentinel.addr(), self.dims.sentinel_slot_bytes),
            Params::LinesPeers => (self.lines.addr(), self.dims.lines_slot_bytes),
            Params::Staging | Params::StagingPlan | Params::StagingChunks => {
                (self.staging.addr(), self.dims.staging_slot_bytes)
            }
            Params::CountsTable => (self.counts_table.addr(), self.counts_table.num_bytes()),
            Params::CopyEngine => {
                return Err(Error::InvalidArgument(format!(
                    "the {algo:?} {} launches copies, not a kernel of its own",
                    A::WHAT
                )))
            }
        };
        let mut args = KernelArgs::new();
        args.device_ptr(src)
            .device_ptr(dst)
            .value(n)
            .device_ptr(self.ctrl.addr())
            .device_ptr(self.flags.addr())
            .device_ptr(region)
            .value(slot_bytes);
        // The by-value parameters, in the kernels' order: the peer table, then the plan or
        // the root.
        if matches!(params, Params::LinesPeers | Params::SentinelPeers) {
            let (lines, sentinel) = self.tables.ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "the {algo:?} {} takes up to {} PEs",
                    A::WHAT,
                    abi::LL_MAX_PES
                ))
            })?;
            args.value(if params == Params::SentinelPeers {
                sentinel
            } else {
                lines
            });
        }
        match (params, plan.extra) {
            (Params::StagingPlan, Extra::Plan(chunks)) => {
                args.value(chunks);
            }
            (_, Extra::Root(root)) => {
                args.value(root);
            }
            (Params::StagingChunks, Extra::Relay { chunk_vecs, root }) => {
                args.value(chunk_vecs).value(root);
            }
            _ => {}
        }
        // Blocks of a call wait on each other's peers: they must all be resident. At most one
        // block per SM is asked for (a 512-thread block always fits), except by the bandwidth
        // all-reduce, whose limit comes from the occupancy every PE agreed on.
        debug_assert!(plan.blocks as usize <= plan::MAX_BLOCKS);
        Ok(Launch {
            function,
            grid: grid(plan.blocks, plan.threads),
            args,
        })
    }

    /// `dst = op over PEs of src` on PE `root`, in PE order (in f32 for 16-bit types), for
    /// `f32`, `f16`, `bf16` and `i32` with `Sum`, `Max` or `Min`; `dst` on the other PEs is
    /// left as it is. `dst` and `src` have the same length on every PE and may be the same
    /// buffer (in place); they must not otherwise overlap.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{Collectives, ReduceAlgo, ReduceOp};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let coll = Collectives::new(&shmem)?;
    /// let (loss, total) = (shmem.malloc::<f32>(1)?, shmem.malloc::<f32>(1)?);
    /// coll.reduce(&total, &loss, ReduceOp::Sum, 0, ReduceAlgo::Auto, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn reduce<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        op: ReduceOp,
        root: usize,
        algo: ReduceAlgo,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        self.call(|| self.plan_reduce(&dst, &src, op, root, algo), stream)
    }

    /// Check and plan a reduce on this PE.
    fn plan_reduce<T: Element>(
        &self,
        dst: &SymmetricView<'_, T>,
        src: &SymmetricView<'_, T>,
        op: ReduceOp,
        root: usize,
        algo: ReduceAlgo,
    ) -> Result<Planned<'_>> {
        let (t, o) = type_and_op::<T>(op, "reduce", "reduce")?;
        if root >= self.dims.n_pes {
            return Err(Error::PeOutOfRange {
                pe: root,
                n_pes: self.dims.n_pes,
            });
        }
        self.check_view(src, "the reduce source")?;
        self.check_view(dst, "the reduce destination")?;
        check_len(
            "reduce destination (the source's length)",
            src.len(),
            dst.len(),
        )?;
        check_overlap("reduce", dst, src, true)?;
        let algo = match algo {
            ReduceAlgo::Auto => ReduceAlgo::Pull,
            a => a,
        };
        let row = algo.index().expect("Auto was resolved");
        let record = self
            .call_record(Collective::Reduce, Some(op), row, dst, src, src.len())
            .with_root(root);
        let bytes = src.num_bytes();
        let function = &self.reduce[algo::reduction_slot(row, t, o)];
        planned(record, bytes == 0, || {
            self.plan_launch(
                function,
                &algo,
                algo::REDUCE_ROWS[row].params,
                reduce_plan(algo, bytes, root, &self.dims),
                (src.as_ptr() as u64, dst.as_ptr() as u64),
                src.len(),
                bytes,
            )
        })
    }

    /// Every call's path: this `Collectives` still sound, the call planned on this PE, agreed
    /// with the other PEs (with `check_calls`), launched.
    fn call<'f>(
        &'f self,
        plan: impl FnOnce() -> Result<Planned<'f>>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let planned = self.check().and_then(|()| plan()).and_then(|p| {
            // What only our kernels do, on a team they cannot run on (agreed like any error).
            if let (Some(Work::Kernel(_) | Work::Copies(_)), Record::Call { collective, .. }) =
                (&p.launch, &p.record)
            {
                self.ours_only(*collective)?;
            }
            Ok(p)
        });
        let planned = self.agree_call(planned, stream)?;
        self.launch(planned, stream)
    }

    /// Refused where the team is not [`Reach::Flat`]: a call only our kernels make.
    pub(super) fn ours_only(&self, collective: Collective) -> Result<()> {
        match self.reach {
            reach if reach.is_flat() => Ok(()),
            reach => Err(Error::InvalidArgument(format!(
                "{} runs on our kernels only, which need every PE of the team load/store \
                 reachable (one node with peer access), and this team is not ({reach}). Use \
                 the all-reduce, all-gather, reduce-scatter, broadcast or all-to-all with Auto",
                collective.name()
            ))),
        }
    }

    /// The team NVSHMEM's collectives run a call on where the team is not [`Reach::Flat`]
    /// (`auto`: the caller let `Auto` choose; an algorithm of ours is refused there), or
    /// `None`: our kernels run it.
    fn nvshmem_route(&self, auto: bool, collective: Collective) -> Result<Option<&Team>> {
        match (&self.nvshmem_team, auto) {
            (None, _) => Ok(None),
            (Some(team), true) => Ok(Some(team)),
            (Some(_), false) => Err(Error::InvalidArgument(format!(
                "{}: our algorithms need every PE of the team load/store reachable (one node \
                 with peer access), and this team is not ({}); pass Auto",
                collective.name(),
                self.reach
            ))),
        }
    }

    /// How the members reach each other, which says what runs the calls: our kernels on a
    /// [`Reach::Flat`] team, NVSHMEM's team collectives on any other (across nodes, say).
    pub fn reach(&self) -> Reach {
        self.reach
    }

    /// Launch a planned call on the one launch path ([`Function::launch_with`]), ordered
    /// after the last call.
    fn launch(&self, planned: Planned<'_>, stream: &Arc<CudaStream>) -> Result<()> {
        let sig = planned.record.signature();
        let Some(work) = planned.launch else {
            return Ok(());
        };
        let options = LaunchOptions {
            cooperative: self.cooperative_launch,
            programmatic: self.programmatic_launch,
            cluster: None,
        };
        self.order
            .run(&self.shmem, stream, "a Collectives call", || match work {
                // SAFETY: the arguments are the kernel's parameters (checked against its layout
                // by the launch); the buffers were checked against the plan's limit and outlive
                // the call, which is stream-ordered before anything that frees them.
                Work::Kernel(mut launch) => unsafe {
                    launch
                        .function
                        .launch_with(launch.grid, options, stream, &mut launch.args)
                },
                Work::Copies(copies) => self.launch_copies(&copies, sig, options, stream),
                Work::Team(call) => call(stream),
            })
    }
}

/// The launch limits every PE can run: the SM count and bandwidth blocks per SM.
struct Limits {
    sm_count: usize,
    per_sm: usize,
}

/// The launch limits every PE can run: blocks pair up with the same block index on every
/// PE, so every PE must launch the same grids (mixed GPU models take the smallest).
fn agreed_limits(shmem: &Nvshmem, all_reduce: &[Option<Function>]) -> Result<Limits> {
    let sm_count = shmem.sm_count()? as usize;
    let mut per_sm = plan::BW_BLOCKS_PER_SM;
    let bandwidth = all_reduce
        .iter()
        .flatten()
        .filter(|f| f.name().starts_with("bandwidth_allreduce_"));
    for f in bandwidth {
        let fit = f.max_resident_blocks(plan::BW_THREADS, 0)? as usize / sm_count.max(1);
        per_sm = per_sm.min(fit.max(1));
    }
    // Through the bounded set-up exchange, not a collective on the runtime's stream: that
    // waited without a bound, and queued behind other threads' work on the stream in an order
    // the PEs need not share.
    let mine = ((sm_count as u64) << 32) | per_sm as u64;
    let all = shmem.set_up_gather(SetUp::CollectivesGrid, mine)?;
    let smallest = |f: fn(u64) -> u64| all.iter().map(|&v| f(v)).min().unwrap_or(1).max(1);
    Ok(Limits {
        sm_count: smallest(|v| v >> 32) as usize,
        per_sm: smallest(|v| v & 0xFFFF_FFFF) as usize,
    })
}

/// Every PE's team, gathered over the world: the PEs of the largest (the workspace's room,
/// alike on every PE), and whether every member of this PE's team passed the same team
/// (the error says which did not).
fn agreed_teams(shmem: &Nvshmem, members: &Members) -> Result<(usize, Result<()>)> {
    // A hash of the members above the size (0 outside every team).
    let mine = members.hash() << 8 | members.n() as u64;
    let teams = shmem.set_up_gather(SetUp::CollectivesTeam, mine)?;
    let largest = teams.iter().map(|&v| (v & 0xFF) as usize).max();
    let other = members
        .world_pes()
        .iter()
        .find(|&&w| members.is_member() && teams[w] != mine);
    let same = match other {
        None => Ok(()),
        Some(other) => Err(Error::CollectiveMismatch(format!(
            "PE {other} passed Collectives::with_team another team than PE {} did (world PEs \
             {:?}): every member must pass the same team (the one a split gave it)",
            shmem.my_pe(),
            members.world_pes()
        ))),
    };
    Ok((largest.unwrap_or(1).max(1), same))
}
