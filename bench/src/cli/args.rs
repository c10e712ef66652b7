//! The options as clap parses them, and the names of the tests, element types,
//! implementations and launch modes they choose from.

use super::help::{ABOUT, LONG_ABOUT};
use super::sizes::parse_size;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, ValueEnum};
use nvshmem::{AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, ReduceScatterAlgo};
use serde::Serialize;
use std::fmt::Display;
use std::path::PathBuf;
use std::str::FromStr;

/// The parser of an algorithm option: the names the library's algorithm table gives (shown
/// in --help), parsed with its `FromStr`.
fn algo_parser<A>(names: impl IntoIterator<Item = &'static str>) -> impl TypedValueParser<Value = A>
where
    A: FromStr + Clone + Send + Sync + 'static,
    A::Err: Display,
{
    PossibleValuesParser::new(names).map(|name| {
        name.parse::<A>()
            .unwrap_or_else(|e| unreachable!("{name} is one of the table's names: {e}"))
    })
}

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TestName {
    /// All-reduce (sum): ours, NVSHMEM, NCCL
    Allreduce,
    /// All-gather: ours, NVSHMEM, NCCL
    Allgather,
    /// Reduce-scatter (sum): ours, NVSHMEM, NCCL
    Reducescatter,
    /// Broadcast from PE 0: ours, NVSHMEM, NCCL
    Broadcast,
    /// All-to-all with equal blocks: ours, NVSHMEM, NCCL (grouped send/recv)
    Alltoall,
    /// Every point-to-point test (p2p-latency, p2p-signal, p2p-bw, p2p-host, sendrecv,
    /// p2p-matrix)
    P2p,
    /// Device-initiated p/g and put/get latency at thread, warp and block scope
    P2pLatency,
    /// Put-with-signal ping-pong (and NCCL send/recv ping-pong)
    P2pSignal,
    /// Device-initiated put/get bandwidth over CTA counts (and NCCL send/recv)
    P2pBw,
    /// Host-initiated and on-stream put/get latency
    P2pHost,
    /// Every ordered pair of PEs: one-way and both-ways put bandwidth at 64 MiB, 8-byte put
    /// latency, and every PE to every other at once
    P2pMatrix,
    /// NCCL send/recv ping-pong and bandwidth only
    Sendrecv,
    /// Channel hand-off ping-pong and full-queue throughput (and NCCL send/recv)
    Channel,
    /// Tensor-parallel Llama MLP forward: the GEMMs alone, with NCCL's all-reduce, with ours
    /// (nvshmem::tp::TpMlp); not part of all
    Tp,
    /// 1F1B pipeline of MLP stages, one per PE: channels against NCCL send/recv and local
    /// copies (nvshmem::pipeline::OneFOneB); not part of all
    Pipeline,
    /// Our all-reduce with the residual add and RMSNorm fused into it, against our all-reduce
    /// and NCCL's each followed by the RMSNorm kernel (hidden 4096 and 8192, 1 to 64 tokens)
    Norm,
    /// The compressed all-reduce of f32 gradients (int8, fp8, fp16, bf16) from 256 KiB of
    /// --sizes up, against our plain all-reduce and NCCL's in f32 and bf16; not part of all
    Gradsync,
    /// The latency floor: a kernel node in a CUDA graph (with and without programmatic
    /// dependent launch), a remote store one way, an L2 round trip; run before any collective
    Floor,
    /// Page-pool gathers (nvshmem::pool::PagePool) of 1, 16, 256 pages of 16 and 64 KiB from
    /// one peer, all peers and locally
    Pool,
    /// The symmetric map (nvshmem::map::SymmetricMap): lookup latency from a kernel, batched
    /// lookups of 1, 1 Ki, 1 Mi keys against a local copy, and inserts
    Map,
    /// The KV-cache hand-off of disaggregated serving: a request's pages of PE 0's page pool
    /// pulled by --peer, against NCCL send/recv of the same pages and a put of the same bytes
    KvTransfer,
    /// A hybrid training step (tensor x pipeline x data parallel, examples/hybrid.rs's model)
    /// for each layout of the PEs, against the whole model on one GPU; not part of all
    Hybrid,
    /// Every collective and point-to-point test (not tp or pipeline, which need cuBLASLt and
    /// weights on every GPU: add them with --tests all,tp,pipeline)
    All,
}

/// Element types of the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bf16,
    F32,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
        }
    }
}

/// Collective implementations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Impl {
    /// nvshmem::Collectives (this crate's kernels)
    Ours,
    /// NVSHMEM's on-stream collectives
    Nvshmem,
    /// NCCL through cudarc
    Nccl,
    /// NCCL on buffers from ncclMemAlloc registered as symmetric windows (its symmetric
    /// kernels, NCCL 2.27 and later)
    #[value(name = "nccl-symm")]
    #[serde(rename = "nccl-symm")]
    NcclSymm,
    /// cuBLASMp 0.7's GEMMs with the communication overlapped (the tp test only)
    Cublasmp,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Nvshmem => "nvshmem",
            Impl::Nccl => "nccl",
            Impl::NcclSymm => "nccl-symm",
            Impl::Cublasmp => "cublasmp",
        }
    }

    /// Whether it implements the collectives (cublasmp runs in the tp test only).
    pub fn is_collective(self) -> bool {
        self != Impl::Cublasmp
    }
}

/// Launch modes of the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One launch per operation
    Plain,
    /// Operations captured into a CUDA graph, replayed
    Graph,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Graph => "graph",
        }
    }
}

#[derive(Parser, Debug, Clone)]
#[command(name = "bench", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Args {
    /// Tests to run, comma separated
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub tests: Vec<TestName>,

    /// Element types of the collectives, comma separated
    #[arg(long, value_enum, value_delimiter = ',', default_value = "bf16,f32")]
    pub dtypes: Vec<DType>,

    /// Implementations, comma separated (NCCL point-to-point runs only with nccl; tp runs
    /// cublas+nccl with nccl, cublas+ours, overlapped and fused with ours, cublasmp with
    /// cublasmp, and compute-only and cublas-only always; cublasmp runs in tp only)
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ours,nvshmem,nccl,nccl-symm,cublasmp"
    )]
    pub impls: Vec<Impl>,

    /// Algorithm of our all-reduce: auto (by size) or one forced, to compare algorithms
    #[arg(long, default_value = "auto", value_parser = algo_parser::<AllReduceAlgo>(AllReduceAlgo::ALL.map(AllReduceAlgo::name)))]
    pub algo: AllReduceAlgo,

    /// Algorithm of our all-gather [default: the family of --algo: ll for the low-latency
    /// and sentinel all-reduces, oneshot, bandwidth for twoshot and bandwidth, else auto]
    #[arg(long, value_parser = algo_parser::<AllGatherAlgo>(AllGatherAlgo::ALL.map(AllGatherAlgo::name)))]
    pub allgather_algo: Option<AllGatherAlgo>,

    /// Algorithm of our reduce-scatter: auto (by size) or one forced
    #[arg(long, default_value = "auto", value_parser = algo_parser::<ReduceScatterAlgo>(ReduceScatterAlgo::ALL.map(ReduceScatterAlgo::name)))]
    pub reducescatter_algo: ReduceScatterAlgo,

    /// Algorithm of our broadcast: auto (by size) or one forced
    #[arg(long, default_value = "auto", value_parser = algo_parser::<BroadcastAlgo>(BroadcastAlgo::ALL.map(BroadcastAlgo::name)))]
    pub broadcast_algo: BroadcastAlgo,

    /// Algorithm of our all-to-all: auto (by size) or one forced
    #[arg(long, default_value = "auto", value_parser = algo_parser::<AllToAllAlgo>(AllToAllAlgo::ALL.map(AllToAllAlgo::name)))]
    pub alltoall_algo: AllToAllAlgo,

    /// Collective launch modes, comma separated
    #[arg(long, value_enum, value_delimiter = ',', default_value = "plain,graph")]
    pub modes: Vec<Mode>,

    /// Smallest message size (bytes; K, M, G suffixes are powers of 1024) [default: 8]
    #[arg(short = 'b', long, value_parser = parse_size_arg)]
    pub min_bytes: Option<usize>,

    /// Largest message size [default: 256M; --quick: 16M]
    #[arg(short = 'e', long, value_parser = parse_size_arg)]
    pub max_bytes: Option<usize>,

    /// Size multiplication factor between steps [default: 2; --quick: 8]
    #[arg(short = 'f', long)]
    pub step_factor: Option<usize>,

    /// Explicit sizes, comma separated (instead of --min-bytes/--max-bytes/--step-factor)
    #[arg(long, value_delimiter = ',', value_parser = parse_size_arg)]
    pub sizes: Vec<usize>,

    /// Largest size of the point-to-point latency tests [default: 1M; --quick: 64K]
    #[arg(long, value_parser = parse_size_arg)]
    pub lat_max_bytes: Option<usize>,

    /// Timed iterations (collectives: operations or graph replays; p2p: launches or calls)
    /// [default: 50; --quick: 10]
    #[arg(short = 'n', long)]
    pub iters: Option<usize>,

    /// Untimed warm-up iterations before the timed ones [default: 10; --quick: 2]
    #[arg(short = 'w', long)]
    pub warmup: Option<usize>,

    /// Operations captured per CUDA graph in graph mode [default: 10; --quick: 4]
    #[arg(long)]
    pub graph_ops: Option<usize>,

    /// Repetitions inside one launch of a device latency or bandwidth kernel
    /// [default: 100; --quick: 20]
    #[arg(long)]
    pub inner: Option<usize>,

    /// CTA (block) counts of the bandwidth kernels, comma separated
    /// [default: 1,8,32,128; --quick: 4,32]
    #[arg(long, value_delimiter = ',')]
    pub ctas: Vec<u32>,

    /// Threads per block of block-scope and bandwidth kernels (multiple of 32, at most 1024)
    #[arg(long, default_value_t = 512)]
    pub block_threads: u32,

    /// The PE that PE 0 talks to in the point-to-point tests
    #[arg(long, default_value_t = 1)]
    pub peer: usize,

    /// Run our collectives over teams of N PEs (the rows of a 2-D split: PEs 0..N, N..2N,
    /// ...), every team at once, each on data of its own; the other implementations' rows are
    /// left out
    #[arg(long, value_name = "N")]
    pub team_size: Option<usize>,

    /// p2p-matrix: flag pairs whose one-way bandwidth is under this many GB/s (0: under 80%
    /// of the median pair)
    #[arg(long, default_value_t = 0.0)]
    pub min_gbps: f64,

    /// Use --iters/--warmup/--inner for every size (no reduction for large sizes)
    #[arg(long)]
    pub fixed_iters: bool,

    /// Seconds a collective case may take: slower ones (NVSHMEM's large on-stream collectives
    /// take hundreds of ms per operation) run fewer iterations, and smaller graphs, down to
    /// 1 warm-up and 3 timed samples (0: no limit)
    #[arg(long, default_value_t = 2.0)]
    pub case_budget: f64,

    /// Short run: fewer sizes (8 B to 16 MiB, factor 8), iterations and CTA counts
    #[arg(long)]
    pub quick: bool,

    /// Output directory for bench.json, bench.csv, summary.txt and the SVG plots
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,

    /// Do not write SVG plots
    #[arg(long)]
    pub no_plots: bool,

    /// Seed of the random test data
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,

    /// MLP shapes of the tp test, comma separated: 8b (hidden 4096, ffn 14336), 70b (hidden
    /// 8192, ffn 28672), or a pair of numbers HIDDEN,FFN
    #[arg(long, default_value = "8b,70b")]
    pub tp_shapes: String,

    /// How the tp test's MLP holds its tokens, comma separated: replicated (every PE has
    /// every token: TpMlp), sequence (each PE has its share on the way in and out:
    /// SequenceParallelMlp)
    #[arg(long, default_value = "replicated,sequence")]
    pub tp_layouts: String,

    /// Token counts M of the tp test, comma separated
    /// [default: 1,16,64,128,512,2048,8192; --quick: 1,128,2048]
    #[arg(long, value_delimiter = ',')]
    pub tp_m: Vec<usize>,

    /// Tokens per micro-batch of the pipeline test, comma separated [default: 1,16,64]
    #[arg(long, value_delimiter = ',')]
    pub pipe_tokens: Vec<usize>,

    /// Micro-batches per step of the pipeline test
    #[arg(long, default_value_t = 8)]
    pub pipe_micro_batches: usize,

    /// Hidden size of the pipeline test's MLP stages (a Llama-like 4096)
    #[arg(long, default_value_t = 4096)]
    pub pipe_hidden: usize,

    /// FFN size of the pipeline test's MLP stages
    #[arg(long, default_value_t = 4096)]
    pub pipe_ffn: usize,

    /// Abort when one measurement makes no progress for this many seconds (0: never). The
    /// longest measurement takes a few seconds; NCCL's grouped send/recv all-to-all of
    /// 256 MiB in a CUDA graph has been seen never to finish on NVLink machines
    #[arg(long, default_value_t = 120)]
    pub watchdog: u64,
}

fn parse_size_arg(text: &str) -> Result<usize, String> {
    parse_size(text)
}
