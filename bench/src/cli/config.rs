//! The resolved settings: the defaults applied, the options checked, and what follows from
//! them (the selected tests, iterations by size, case budgets, symmetric memory of tp).

use super::args::{Args, DType, Impl, Mode, TestName};
use super::sizes::{size_list, KIB, MIB};
use super::tp_options::{parse_tp_layouts, parse_tp_shapes, TpLayout, TpShape};
use nvshmem::{AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, ReduceScatterAlgo};
use serde::{Serialize, Serializer};
use std::fmt::Display;
use std::path::PathBuf;

/// The all-gather that an all-reduce algorithm's family implies (what `--algo` alone has
/// always forced on the all-gather).
fn all_gather_of_family(algo: AllReduceAlgo) -> AllGatherAlgo {
    match algo {
        AllReduceAlgo::Auto => AllGatherAlgo::Auto,
        AllReduceAlgo::Sentinel
        | AllReduceAlgo::SentinelTwoShot
        | AllReduceAlgo::LowLatency
        | AllReduceAlgo::LowLatencyTwoShot => AllGatherAlgo::LowLatency,
        AllReduceAlgo::OneShot => AllGatherAlgo::OneShot,
        AllReduceAlgo::TwoShot | AllReduceAlgo::Bandwidth => AllGatherAlgo::Bandwidth,
        _ => AllGatherAlgo::Auto,
    }
}

/// Serialise by the value's `Display` (an algorithm by its name).
fn by_name<T: Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// Which tests are selected, after expanding `p2p` and `all`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tests {
    pub allreduce: bool,
    pub allgather: bool,
    pub reducescatter: bool,
    pub broadcast: bool,
    pub alltoall: bool,
    pub p2p_latency: bool,
    pub p2p_signal: bool,
    pub p2p_bw: bool,
    pub p2p_host: bool,
    pub p2p_matrix: bool,
    pub sendrecv: bool,
    pub channel: bool,
    pub tp: bool,
    pub pipeline: bool,
    pub floor: bool,
    pub norm: bool,
    pub gradsync: bool,
    pub pool: bool,
    pub map: bool,
    pub kv_transfer: bool,
    pub hybrid: bool,
}

impl Tests {
    pub fn from_names(names: &[TestName]) -> Tests {
        let mut t = Tests::default();
        for name in names {
            match name {
                TestName::Allreduce => t.allreduce = true,
                TestName::Allgather => t.allgather = true,
                TestName::Reducescatter => t.reducescatter = true,
                TestName::Broadcast => t.broadcast = true,
                TestName::Alltoall => t.alltoall = true,
                TestName::P2pLatency => t.p2p_latency = true,
                TestName::P2pSignal => t.p2p_signal = true,
                TestName::P2pBw => t.p2p_bw = true,
                TestName::P2pHost => t.p2p_host = true,
                TestName::P2pMatrix => t.p2p_matrix = true,
                TestName::Sendrecv => t.sendrecv = true,
                TestName::Channel => t.channel = true,
                TestName::Tp => t.tp = true,
                TestName::Pipeline => t.pipeline = true,
                TestName::Floor => t.floor = true,
                TestName::Norm => t.norm = true,
                TestName::Gradsync => t.gradsync = true,
                TestName::Pool => t.pool = true,
                TestName::Map => t.map = true,
                TestName::KvTransfer => t.kv_transfer = true,
                TestName::Hybrid => t.hybrid = true,
                TestName::P2p | TestName::All => {
                    t.p2p_latency = true;
                    t.p2p_signal = true;
                    t.p2p_bw = true;
                    t.p2p_host = true;
                    t.p2p_matrix = true;
                    t.sendrecv = true;
                    if *name == TestName::All {
                        t.channel = true;
                        t.pool = true;
                        t.map = true;
                        t.kv_transfer = true;
                        t.floor = true;
                        t.allreduce = true;
                        t.allgather = true;
                        t.reducescatter = true;
                        t.broadcast = true;
                        t.alltoall = true;
                    }
                }
            }
        }
        t
    }

    pub fn any_collective(&self) -> bool {
        self.allreduce || self.allgather || self.reducescatter || self.broadcast || self.alltoall
    }

    pub fn any_p2p(&self) -> bool {
        self.p2p_latency
            || self.p2p_signal
            || self.p2p_bw
            || self.p2p_host
            || self.sendrecv
            || self.p2p_matrix
    }

    /// Whether the device kernels of this crate's kernels/bench_p2p.cu are needed.
    pub fn device_p2p(&self) -> bool {
        self.p2p_latency || self.p2p_signal || self.p2p_bw || self.p2p_matrix
    }
}

/// The resolved settings every PE runs with.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub tests: Tests,
    pub dtypes: Vec<DType>,
    pub impls: Vec<Impl>,
    #[serde(serialize_with = "by_name")]
    pub algo: AllReduceAlgo,
    #[serde(serialize_with = "by_name")]
    pub allgather_algo: AllGatherAlgo,
    #[serde(serialize_with = "by_name")]
    pub reducescatter_algo: ReduceScatterAlgo,
    #[serde(serialize_with = "by_name")]
    pub broadcast_algo: BroadcastAlgo,
    #[serde(serialize_with = "by_name")]
    pub alltoall_algo: AllToAllAlgo,
    pub modes: Vec<Mode>,
    /// Sizes of the collectives and bandwidth tests.
    pub sizes: Vec<usize>,
    /// Sizes of the point-to-point latency tests.
    pub lat_sizes: Vec<usize>,
    pub iters: usize,
    pub warmup: usize,
    pub graph_ops: usize,
    pub inner: usize,
    pub ctas: Vec<u32>,
    pub block_threads: u32,
    pub peer: usize,
    /// Our collectives over teams of this many PEs, every team at once (`--team-size`).
    pub team_size: Option<usize>,
    /// p2p-matrix: GB/s under which a pair is flagged (0: 80% of the median pair).
    pub min_gbps: f64,
    pub fixed_iters: bool,
    /// Seconds a collective case may take (0: no limit).
    pub case_budget_s: f64,
    pub quick: bool,
    pub out: PathBuf,
    pub plots: bool,
    pub seed: u64,
    pub watchdog_s: u64,
    /// MLP shapes of the tp test.
    pub tp_shapes: Vec<TpShape>,
    /// Token layouts of the tp test.
    pub tp_layouts: Vec<TpLayout>,
    /// Token counts of the tp test, ascending.
    pub tp_m: Vec<usize>,
    /// Tokens per micro-batch of the pipeline test, ascending.
    pub pipe_tokens: Vec<usize>,
    pub pipe_micro_batches: usize,
    pub pipe_hidden: usize,
    pub pipe_ffn: usize,
}

fn dedup_sorted<T: Ord + Copy>(mut v: Vec<T>) -> Vec<T> {
    v.sort_unstable();
    v.dedup();
    v
}

impl Config {
    /// Apply the defaults (full or `--quick`) and check the options.
    pub fn from_args(a: Args) -> Result<Config, String> {
        let q = a.quick;
        let min = a.min_bytes.unwrap_or(8);
        let max = a.max_bytes.unwrap_or(if q { 16 * MIB } else { 256 * MIB });
        let factor = a.step_factor.unwrap_or(if q { 8 } else { 2 });
        let lat_max = a.lat_max_bytes.unwrap_or(if q { 64 * KIB } else { MIB });
        let iters = a.iters.unwrap_or(if q { 10 } else { 50 });
        let warmup = a.warmup.unwrap_or(if q { 2 } else { 10 });
        let graph_ops = a.graph_ops.unwrap_or(if q { 4 } else { 10 });
        let inner = a.inner.unwrap_or(if q { 20 } else { 100 });
        let ctas = if a.ctas.is_empty() {
            if q {
                vec![4, 32]
            } else {
                vec![1, 8, 32, 128]
            }
        } else {
            dedup_sorted(a.ctas)
        };
        let sizes = if a.sizes.is_empty() {
            size_list(min, max, factor)?
        } else {
            if a.sizes.contains(&0) {
                return Err("--sizes: sizes must be at least 1 byte".into());
            }
            dedup_sorted(a.sizes)
        };
        if iters == 0 || graph_ops == 0 || inner == 0 {
            return Err("--iters, --graph-ops and --inner must be at least 1".into());
        }
        if !(a.case_budget >= 0.0 && a.case_budget.is_finite()) {
            return Err("--case-budget: seconds must be 0 (no limit) or more".into());
        }
        if ctas.contains(&0) || ctas.iter().any(|&c| c > 65535) {
            return Err("--ctas: CTA counts must be between 1 and 65535".into());
        }
        if a.block_threads == 0 || !a.block_threads.is_multiple_of(32) || a.block_threads > 1024 {
            return Err(format!(
                "--block-threads {}: must be a multiple of 32 between 32 and 1024",
                a.block_threads
            ));
        }
        if !(a.min_gbps >= 0.0 && a.min_gbps.is_finite()) {
            return Err("--min-gbps: GB/s must be 0 (relative to the median pair) or more".into());
        }
        if a.peer == 0 {
            return Err("--peer: the peer of PE 0 must be another PE (1 or more)".into());
        }
        if a.team_size == Some(0) {
            return Err("--team-size: a team has at least 1 PE".into());
        }
        let tests = Tests::from_names(&a.tests);
        let dtypes = dedup_sorted(a.dtypes);
        let impls = dedup_sorted(a.impls);
        let modes = dedup_sorted(a.modes);
        let collective_impls = impls.iter().any(|i| i.is_collective());
        if tests.any_collective() && (dtypes.is_empty() || !collective_impls || modes.is_empty()) {
            return Err("--dtypes, --impls and --modes must each name at least one value".into());
        }
        let tp_shapes = parse_tp_shapes(&a.tp_shapes)?;
        let tp_layouts = parse_tp_layouts(&a.tp_layouts)?;
        let tp_m = if a.tp_m.is_empty() {
            if q {
                vec![1, 128, 2048]
            } else {
                vec![1, 16, 64, 128, 512, 2048, 8192]
            }
        } else {
            if a.tp_m.contains(&0) {
                return Err("--tp-m: token counts must be at least 1".into());
            }
            dedup_sorted(a.tp_m)
        };
        if a.pipe_tokens.contains(&0) || a.pipe_micro_batches == 0 {
            return Err("--pipe-tokens and --pipe-micro-batches must be at least 1".into());
        }
        if a.pipe_hidden == 0 || a.pipe_ffn == 0 {
            return Err("--pipe-hidden and --pipe-ffn must be at least 1".into());
        }
        let pipe_tokens = match a.pipe_tokens.is_empty() {
            true => vec![1, 16, 64],
            false => dedup_sorted(a.pipe_tokens),
        };
        let lat_sizes: Vec<usize> = sizes.iter().copied().filter(|&s| s <= lat_max).collect();
        Ok(Config {
            tests,
            dtypes,
            impls,
            algo: a.algo,
            allgather_algo: a
                .allgather_algo
                .unwrap_or_else(|| all_gather_of_family(a.algo)),
            reducescatter_algo: a.reducescatter_algo,
            broadcast_algo: a.broadcast_algo,
            alltoall_algo: a.alltoall_algo,
            modes,
            sizes,
            lat_sizes,
            iters,
            warmup,
            graph_ops,
            inner,
            ctas,
            block_threads: a.block_threads,
            peer: a.peer,
            team_size: a.team_size,
            min_gbps: a.min_gbps,
            fixed_iters: a.fixed_iters,
            case_budget_s: a.case_budget,
            quick: q,
            out: a.out,
            plots: !a.no_plots,
            seed: a.seed,
            watchdog_s: a.watchdog,
            tp_shapes,
            tp_layouts,
            tp_m,
            pipe_tokens,
            pipe_micro_batches: a.pipe_micro_batches,
            pipe_hidden: a.pipe_hidden,
            pipe_ffn: a.pipe_ffn,
        })
    }

    /// Whether NCCL is used at all (cuBLASMp runs on an NCCL communicator).
    pub fn needs_nccl(&self) -> bool {
        ((self.impls.contains(&Impl::Nccl) || self.impls.contains(&Impl::NcclSymm))
            && (self.tests.any_collective()
                || self.tests.p2p_signal
                || self.tests.p2p_bw
                || self.tests.sendrecv
                || self.tests.channel
                || self.tests.pipeline
                || self.tests.norm
                || self.tests.gradsync
                || self.tests.kv_transfer
                || self.tests.hybrid
                || self.tests.tp))
            || self.needs_cublasmp()
    }

    /// Whether cuBLASMp is used (the tp test's cublasmp column).
    pub fn needs_cublasmp(&self) -> bool {
        self.impls.contains(&Impl::Cublasmp) && self.tests.tp
    }

    /// The implementations of the collectives, in `--impls` order.
    /// The collectives' implementations to run: ours alone over teams (`--team-size`).
    pub fn collective_impls(&self) -> Vec<Impl> {
        self.impls
            .iter()
            .copied()
            .filter(|i| i.is_collective())
            .filter(|&i| self.team_size.is_none() || i == Impl::Ours)
            .collect()
    }

    pub fn has_impl(&self, i: Impl) -> bool {
        self.impls.contains(&i)
    }

    /// (warm-up, timed) iterations for a message of `bytes`.
    pub fn iters_for(&self, bytes: usize) -> (usize, usize) {
        let div = if self.fixed_iters || bytes <= 4 * MIB {
            1
        } else if bytes <= 32 * MIB {
            2
        } else {
            5
        };
        let warm = if self.warmup == 0 {
            0
        } else {
            (self.warmup / div).max(1)
        };
        (warm, (self.iters / div).max(self.iters.min(3)))
    }

    /// (warm-up operations, timed samples, operations per graph) of a collective case of
    /// `bytes` whose first operation took `op_us`: [`Config::iters_for`] and `--graph-ops`,
    /// cut so that the whole case fits `--case-budget`, keeping at least 1 warm-up and 3
    /// timed samples. `graph` counts a sample as one replay of the graph.
    pub fn budgeted(&self, bytes: usize, op_us: f64, graph: bool) -> (usize, usize, usize) {
        let (warm, iters) = self.iters_for(bytes);
        let ops = if graph { self.graph_ops } else { 1 };
        if self.case_budget_s <= 0.0 || op_us.is_nan() || op_us <= 0.0 {
            return (warm, iters, ops);
        }
        let allowed = (self.case_budget_s * 1e6 / op_us).floor().max(0.0) as usize;
        // Warm-up operations count whole graphs in graph mode (see coll.rs).
        let cost = |warm: usize, iters: usize, ops: usize| {
            (if graph {
                warm.div_ceil(ops).max(1) * ops
            } else {
                warm
            }) + iters * ops
        };
        if cost(warm, iters, ops) <= allowed {
            return (warm, iters, ops);
        }
        let ops = if graph {
            (allowed / 4).clamp(1, self.graph_ops)
        } else {
            1
        };
        let warm = warm.min(if graph { ops } else { 1 }).max(1);
        let iters = (allowed.saturating_sub(cost(warm, 0, ops)) / ops).clamp(3, iters.max(3));
        (warm, iters, ops)
    }

    /// Repetitions inside one launch of a device latency kernel for a message of `bytes`.
    pub fn inner_for(&self, bytes: usize) -> usize {
        if self.fixed_iters {
            return self.inner;
        }
        let div = (bytes / (64 * KIB)).max(1);
        (self.inner / div).max(self.inner.min(5))
    }

    /// Repetitions inside one launch of a bandwidth kernel: enough for 64 MiB, at most --inner.
    pub fn bw_reps_for(&self, bytes: usize) -> usize {
        (64 * MIB / bytes.max(1)).clamp(1, self.inner)
    }

    /// The largest message any test uses.
    pub fn max_size(&self) -> usize {
        self.sizes
            .iter()
            .chain(self.lat_sizes.iter())
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Symmetric memory the tp test holds at once (0 without it), for the largest shape at
    /// the largest token count M, in bf16. Replicated: the MLP's partial product (M x hidden),
    /// the output of the fused decode kernel's measurement (FUSED_DECODE_MAX_TOKENS x
    /// hidden), the outputs of cublas+ours and fused (M x hidden each), and from 1024 tokens
    /// the fused GEMM + all-reduce's exchange buffer and this PE's rows of the sum (M x hidden
    /// and at most as much). Sequence parallel, at most: the gathered input, the partial product and the
    /// fused reduce-scatter's exchange buffer (M x hidden each), the input and the three
    /// outputs (M / PEs x hidden each, at most M x hidden). With cublasmp, its workspaces
    /// too: [`CUBLASMP_FIXED_BYTES`] each, plus 4 M x hidden for the GEMM + all-reduce, and
    /// 1 and 2 M x hidden for the all-gather + GEMM and GEMM + reduce-scatter.
    pub fn tp_symmetric_bytes(&self) -> usize {
        if !self.tests.tp {
            return 0;
        }
        let mp = self.needs_cublasmp();
        let m = self.tp_m.iter().copied().max().unwrap_or(0);
        let rows = self
            .tp_layouts
            .iter()
            .map(|l| match l {
                TpLayout::Replicated => {
                    // The fused exchange's buffers (at most M + M / PEs; with 2 PEs or more,
                    // from FUSED_EXCHANGE_TOKENS tokens per PE).
                    let exchange = if m >= 2 * nvshmem::tp::FUSED_EXCHANGE_TOKENS {
                        2 * m
                    } else {
                        0
                    };
                    let probe = nvshmem::tp::FUSED_DECODE_MAX_TOKENS;
                    3 * m + probe + exchange + if mp { 4 * m } else { 0 }
                }
                TpLayout::Sequence => 7 * m + if mp { 3 * m } else { 0 },
            })
            .max()
            .unwrap_or(0);
        let fixed = if mp { 2 * CUBLASMP_FIXED_BYTES } else { 0 };
        self.tp_shapes
            .iter()
            .map(|s| rows * s.hidden * std::mem::size_of::<half::bf16>() + fixed)
            .max()
            .unwrap_or(0)
    }

    /// A fingerprint of the settings, to check that every PE got the same options.
    pub fn fingerprint(&self) -> u64 {
        let text = serde_json::to_string(self).unwrap_or_default();
        crate::data::hash_bytes(text.as_bytes())
    }
}

/// The part of each of cuBLASMp's workspaces that does not grow with the matrices: 96 MiB
/// and a few hundred bytes in 0.7.0 (as `cublasMpMatmul_bufferSize` reports it), rounded up.
pub const CUBLASMP_FIXED_BYTES: usize = 97 * MIB;
