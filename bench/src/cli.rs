//! Command line: options, their defaults (full and `--quick`), and message sizes.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, ValueEnum};
use nvshmem::{AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, ReduceScatterAlgo};
use serde::{Serialize, Serializer};
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

const ABOUT: &str = "NVSHMEM vs NCCL benchmark: our all-reduce/all-gather/reduce-scatter kernels, \
NVSHMEM's own on-stream collectives and NCCL side by side, plus device-, host- and stream-initiated \
point-to-point latency and bandwidth";

const LONG_ABOUT: &str = "\
NVSHMEM vs NCCL benchmark suite. Run one PE per GPU:

    scripts/nvshmrun -np <GPUs> target/release/bench [OPTIONS]
    make bench NP=8 ARGS='--quick'

Every PE runs the same sequence of operations; PE 0 prints the environment header, progress \
(stderr) and the result tables (stdout), and writes JSON, CSV and SVG plots to --out.

COLLECTIVES (--tests allreduce,allgather,reducescatter,broadcast,alltoall)
  For each data type, message size, implementation and launch mode:
    ours     nvshmem::Collectives::all_reduce (sum) / all_gather / reduce_scatter (sum) /
             broadcast (root 0) / all_to_all, algorithm --algo / --allgather-algo /
             --reducescatter-algo / --broadcast-algo / --alltoall-algo (default auto)
    nvshmem  nvshmemx_<type>_sum_reduce_on_stream / nvshmemx_<type>_fcollect_on_stream /
             nvshmemx_<type>_sum_reducescatter_on_stream / nvshmemx_<type>_broadcast_on_stream
             / nvshmemx_<type>_alltoall_on_stream
    nccl     ncclAllReduce (sum) / ncclAllGather / ncclReduceScatter (sum) / ncclBroadcast /
             one ncclSend and ncclRecv per peer in a group (all-to-all) (communicator from
             a unique id that PE 0 broadcasts through NVSHMEM)
    nccl-symm  the same calls on buffers from ncclMemAlloc registered with
             ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC): NCCL's symmetric kernels where
             NCCL has one for the call (2.27 and later); where it has none, NCCL runs its
             default path on those buffers (NCCL_DEBUG=INFO names the kernel it chose). An
             NCCL that refuses the windows is reported in the notes and not run
  Modes: plain = one launch per operation; graph = --graph-ops operations captured into one CUDA
  graph, the time of a replay divided by --graph-ops.
  Size is the buffer size as in nccl-tests: the all-reduce buffer, the all-gather OUTPUT
  (each PE contributes size / PEs), the reduce-scatter INPUT (each PE's source holds a block
  of size / PEs for every PE, and each PE gets its block, size / PEs, summed over the PEs),
  the broadcast buffer, the all-to-all buffer (a block of size / PEs for every PE each way).
  Sizes that do not divide are rounded down.
  NVSHMEM's reduce-scatter stages the whole source in its reduction scratch, which must hold
  twice the size (NVSHMEM_REDUCE_SCRATCH_SIZE, 512 KiB unless set, reserved for each of
  NVSHMEM_MAX_TEAMS teams): larger sizes are not run for nvshmem (see the notes).
  time   = median over --iters timed operations (CUDA events between consecutive operations),
           after --warmup untimed ones; spread = (p90 - p10) / 2 / median
  algbw  = size / time;  busbw = algbw * 2(n-1)/n (all-reduce), (n-1)/n (all-gather,
           reduce-scatter, all-to-all) or 1 (broadcast)
  Check: every size gets new random input on every PE (values k/4, |k| small enough that every
  partial sum is exact in bf16), the output is compared bit for bit with a CPU reference on
  every PE after the timed runs (reduce-scatter: this PE's block of every PE's input added in
  PE order); the output buffer is poisoned (0xFF bytes) before each implementation/mode.

POINT-TO-POINT (--tests p2p, or a subset), PE 0 and --peer (default PE 1); other PEs idle
  p2p-latency  device-initiated, kernels in bench/kernels/bench_p2p.cu, timed inside the kernel with
               %globaltimer over --inner repetitions (after --inner/10 untimed ones); one
               sample per launch:
                 p, g        nvshmem_uint32_p + nvshmem_quiet / nvshmem_uint32_g, one thread
                 put         nvshmem_putmem[_warp|_block] + nvshmem_quiet, thread/warp/block
                 get         nvshmem_getmem[_warp|_block], thread/warp/block
  p2p-signal   put-with-signal ping-pong (nvshmem[x]_putmem_signal[_warp|_block] +
               nvshmem_signal_wait_until), thread/warp/block; reported one way = round trip / 2;
               with NCCL: ncclSend/ncclRecv ping-pong, one way = round trip / 2
  p2p-bw       nvshmemx_putmem_nbi_block / nvshmemx_getmem_nbi_block, the message split over
               --ctas blocks, repeated inside the kernel, then nvshmem_quiet; CUDA events around
               each launch; one way (PE 0 only) and both ways (PE 0 and the peer at once,
               bandwidth counts both directions); with NCCL: ncclSend/ncclRecv one way and
               grouped send+recv both ways
  p2p-host     host-initiated nvshmem_putmem + nvshmem_quiet / nvshmem_getmem (host clock), and
               on-stream nvshmemx_putmem_on_stream + nvshmemx_quiet_on_stream /
               nvshmemx_getmem_on_stream (CUDA events)
  sendrecv     only the NCCL send/recv comparisons above
  Latency tests use the sizes up to --lat-max-bytes, bandwidth tests all sizes. Bandwidth in GB/s = 10^9 bytes/s, as the
  NVSHMEM perftests. Check: the destination must hold the sender's random bytes afterwards.
  No repetition reuses bytes a cache could serve: every get reads, and every put-bandwidth
  repetition writes, its own slot of a 128 MiB region (the last one's is checked); g follows
  dependent reads over 8 MiB of distinct lines.

CHANNELS (--tests channel), PE 0 and --peer (a loopback on PE 0 when there is one PE)
  channel_pingpong    a message handed from PE 0 to the peer and back, one way = round trip / 2,
                      8 B to 16 MiB (by factors of 8, up to --max-bytes), each implementation
                      in CUDA graphs of --graph-ops rounds (replay time / rounds / 2):
                        ours     nvshmem::channel::Channel send + recv (2 slots each way)
                        nvshmem  put_signal_on_stream + signal_wait_until_on_stream (+ a reset
                                 of the signal, so the graph replays)
                        nccl     ncclSend + ncclRecv
  channel_throughput  --graph-ops messages back to back from PE 0 to the peer through a channel
                      of 4 slots (the producer waits for free slots), or ncclSend/ncclRecv;
                      time per message on the producer, GB/s and messages/s
  Check: the destination holds the sender's fresh random bytes after the timed runs.

PAGE POOL (--tests pool; part of all)
  nvshmem::pool::PagePool::gather_device of 1, 16 and 256 pages of 16 KiB and 64 KiB into
  local device memory, by PE 0: from --peer (PE 0 itself when alone), from every other PE in
  turn, and from PE 0's own pages (local: the same kernel copying device to device). Each
  PE's pool holds 256 pages, all allocated. Gathers are captured into CUDA graphs of
  --graph-ops gathers, cut to --case-budget; time = median per gather; GB/s = gathered
  bytes / time. Check: every row writes fresh random bytes into every PE's pages, PE 0's
  destination is poisoned before the replays and must hold the pages' bytes afterwards.

TENSOR-PARALLEL MLP (--tests tp; not part of `all`: name it, e.g. --tests all,tp)
  A Llama MLP forward, y = down(SiLU(x gate^T) * (x up^T)) in bf16, with the FFN features
  sharded over every PE (tensor-parallel degree = PEs), for each --tp-shapes shape (8b: hidden
  4096, ffn 14336; 70b: hidden 8192, ffn 28672) and each --tp-m token count M:
    compute-only  this PE's merged gate/up GEMM, the SiLU(gate)*up kernel and the down GEMM
                  into a local buffer, no communication: the lower bound; the GEMMs as
                  GemmPath::Auto takes them (up to 16 tokens, per GEMM, the faster of our
                  decode kernel and cuBLASLt as measured when the weights were loaded;
                  cuBLASLt above; cuBLASLt's algorithm up to 256 tokens the fastest of its
                  heuristic's first 8, measured then too), as in every other implementation
    cublas-only   the same with cuBLASLt's GEMMs as its heuristic chooses them (cuBLAS's
                  compute alone), up to 256 tokens (above, it is compute-only)
    cublas+nccl   the same calls, then ncclAllReduce (sum, bf16) of the down projection's
                  partial product into the output (with nccl in --impls)
    cublas+ours   nvshmem::tp::TpMlp::forward_with(Schedule::Sequential): GEMM, kernel, GEMM,
                  our all-reduce (with ours in --impls)
    fused         TpMlp::forward_with(Schedule::Fused): the down projection's decode GEMM and
                  its all-reduce in one kernel up to 8 tokens (FUSED_DECODE_MAX_TOKENS, where
                  hidden is a multiple of 4); from 512 tokens per PE (when the PEs share M
                  equally) its GEMMs in rounds, each round's partial products and sums moved
                  by the copy engines while the next round computes; not run between (with
                  ours in --impls)
    cublasmp      cuBLASMp 0.7 (libcublasmp.so.0, the nvidia-cublasmp-cu13 wheel): the gate/up
                  GEMM by cuBLASLt, the SiLU(gate)*up kernel, then cublasMpMatmul's GEMM +
                  all-reduce of the down projection (with cublasmp in --impls). cuBLASMp's
                  overlapped GEMM + all-reduce uses NVLink multicast, which these runs keep
                  off, so this one runs without overlap (CUBLASMP_MATMUL_ALGO_TYPE_NO_OVERLAP)
  --tp-layouts sequence (on by default) runs the same MLP in sequence parallelism: each PE
  holds M / PEs tokens on the way in and out (nvshmem::tp::SequenceParallelMlp), for the
  token counts that are multiples of the PEs (variant SHAPE-sp):
    compute-only  as above, on every token
    cublas+nccl   ncclAllGather of the tokens, the same local work, ncclReduceScatter (sum)
    cublas+ours   SequenceParallelMlp::forward_with(Schedule::Sequential): our all-gather,
                  GEMM, kernel, GEMM, our reduce-scatter
    overlapped    the gate/up GEMM of this PE's tokens while the all-gather brings the others
    fused         Schedule::Fused, from 512 tokens per PE: the all-gather by the copy engines
                  with a flag per PE, a GEMM per PE's rows after its flag, and the down
                  GEMMs in rounds, each round's partial products moved by the copy engines
                  to their PE while the next round computes; below, not run
    cublasmp      cublasMpMatmul's all-gather + GEMM (gate/up) and GEMM + reduce-scatter
                  (down), both its overlapped SPLIT_P2P algorithm, with the SiLU kernel
                  between; its workspaces come from the symmetric heap (on ordinary memory
                  cuBLASMp quietly runs without overlap)
  and each PE's output rows are checked against its rows of the unsharded MLP.
  Each implementation's forward is captured into a CUDA graph of --graph-ops forwards, cut to
  --case-budget as for the collectives (the size is the output, M x hidden bf16). After the
  warm-up replays the timed replays alternate between the implementations: the --iters
  replays of each are split into 5 rounds, each round a block of replays of every
  implementation in turn (the order rotated every round), and the samples are pooled per
  implementation, so that clock drift weighs on all alike.
  time     = median per forward ± half the p10-p90 range, as above
  TFLOP/s  = per GPU: 6 M hidden ffn / PEs / time
  vs nccl  = time of cublas+nccl / time (> 1: faster)
  overhead = (time - time of compute-only) / time of compute-only
  best ours over cublas-only = (time of the fastest of cublas+ours, overlapped and fused
             - time of cublas-only) / time of cublas-only
  slowest PE's compute-only = the largest of the PEs' own medians of compute-only (the
             times above are PE 0's; a layer that communicates waits for its slowest GPU),
             and the fastest of ours over it and over the slowest PE's cublas-only
  auto     = which of cublas+ours, overlapped and fused TpMlp::forward (Schedule::Auto)
             takes at that shape and M (TpMlp::auto_schedule), and its speed-up over
             cublas+nccl
  Check: every M gets new random data, the same on every PE (x uniform in [-1, 1), weights
  uniform in ±sqrt(3 / input features)). Outputs are poisoned after the first eager calls,
  so the timed graph replays must rewrite them; afterwards they are compared with the
  unsharded MLP on this GPU (gate/up GEMM of 2 ffn features, SiLU(gate)*up, down GEMM):
  |got - ref| <= (|ref| + rms(ref)) / 64 for every element (cublas+nccl and cublasmp: n - 1
  times that on n > 2 PEs, as NCCL adds bf16 in bf16). cublas+ours, overlapped and fused must
  also be bitwise identical on every PE; compute-only and cublas-only (partial products when
  there are 2 PEs or more) must equal an eager run of the same calls bit for bit, and the
  reference too with one PE.
  Needs cuBLASLt (libcublasLt.so.13, installed by `make setup`), and room for a shape's full
  weights on every GPU (for the reference) and in every PE's host memory.

ITERATIONS
  Unless --fixed-iters: iterations and warm-ups are halved above 4 MiB and divided by five
  above 32 MiB; in-kernel repetitions of latency kernels shrink with size above 64 KiB.
  A collective case whose first operation shows it would take more than --case-budget
  seconds runs fewer iterations (and smaller graphs), never below 1 warm-up and 3 samples.

OUTPUT (PE 0)
  stdout: environment header (GPUs, driver, CUDA, NVSHMEM and NCCL versions, peer access
  matrix, NVSHMEM_*/NCCL_*/CUDA_VISIBLE_DEVICES) and tables: ours vs NVSHMEM vs NCCL with
  speed-ups (time of the other / time of ours: > 1 means ours is faster); tp: one table per
  shape.
  --out DIR: bench.json (environment, options, every result with min/max/mean/p10/p90; tp
  rows add hidden, ffn, tokens, TFLOP/s, speed-up and overhead), bench.csv, summary.txt, and
  SVG plots (latency and bus bandwidth vs size, tp time and TFLOP/s vs M, log axes).
  Exit status: 0 when every check passed, 1 when a check or an operation failed, 2 on bad
  options.

ENVIRONMENT
  NVSHMEM_SYMMETRIC_SIZE, when not set, becomes 3 x the largest size (a collective's input and
  output are at most 2 x the largest size; with tp: (3 M + min(M, 2048)) x hidden bf16 for the
  largest M and hidden, when that is more) + 512 MiB, at least 1 GiB.
  NVSHMEM_REDUCE_SCRATCH_SIZE is left as it is: NVSHMEM's reduce-scatter runs up to half of it
  (above). Raising it to 2 x the largest size, the same on every PE, runs every size; NVSHMEM
  reserves it for each of NVSHMEM_MAX_TEAMS teams (default 32) besides the symmetric heap.
  NVSHMEM_DISABLE_NCCL, when not set, becomes 1: the nvshmem column then measures NVSHMEM's own
  collectives (NVSHMEM can route its on-stream collectives through NCCL); set it to 0 to allow.
  scripts/nvshmrun puts libnccl.so on LD_LIBRARY_PATH; without NCCL use --impls ours,nvshmem.";

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
    /// Every point-to-point test (p2p-latency, p2p-signal, p2p-bw, p2p-host, sendrecv)
    P2p,
    /// Device-initiated p/g and put/get latency at thread, warp and block scope
    P2pLatency,
    /// Put-with-signal ping-pong (and NCCL send/recv ping-pong)
    P2pSignal,
    /// Device-initiated put/get bandwidth over CTA counts (and NCCL send/recv)
    P2pBw,
    /// Host-initiated and on-stream put/get latency
    P2pHost,
    /// NCCL send/recv ping-pong and bandwidth only
    Sendrecv,
    /// Channel hand-off ping-pong and full-queue throughput (and NCCL send/recv)
    Channel,
    /// Tensor-parallel Llama MLP forward: the GEMMs alone, with NCCL's all-reduce, with ours
    /// (nvshmem::tp::TpMlp); not part of all
    Tp,
    /// Page-pool gathers (nvshmem::pool::PagePool) of 1, 16, 256 pages of 16 and 64 KiB from
    /// one peer, all peers and locally
    Pool,
    /// Every collective and point-to-point test (not tp, which needs cuBLASLt and gigabytes of
    /// weights per GPU: add it with --tests all,tp)
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

    /// Abort when one measurement makes no progress for this many seconds (0: never). The
    /// longest measurement takes a few seconds; NCCL's grouped send/recv all-to-all of
    /// 256 MiB in a CUDA graph has been seen never to finish on NVLink machines
    #[arg(long, default_value_t = 120)]
    pub watchdog: u64,
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
    pub sendrecv: bool,
    pub channel: bool,
    pub tp: bool,
    pub pool: bool,
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
                TestName::Sendrecv => t.sendrecv = true,
                TestName::Channel => t.channel = true,
                TestName::Tp => t.tp = true,
                TestName::Pool => t.pool = true,
                TestName::P2p | TestName::All => {
                    t.p2p_latency = true;
                    t.p2p_signal = true;
                    t.p2p_bw = true;
                    t.p2p_host = true;
                    t.sendrecv = true;
                    if *name == TestName::All {
                        t.channel = true;
                        t.pool = true;
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
        self.p2p_latency || self.p2p_signal || self.p2p_bw || self.p2p_host || self.sendrecv
    }

    /// Whether the device kernels of this crate's kernels/bench_p2p.cu are needed.
    pub fn device_p2p(&self) -> bool {
        self.p2p_latency || self.p2p_signal || self.p2p_bw
    }
}

/// The Llama MLP shapes that --tp-shapes knows by name: (name, hidden, ffn).
pub const TP_NAMED_SHAPES: [(&str, usize, usize); 2] = [("8b", 4096, 14336), ("70b", 8192, 28672)];

/// One MLP shape of the tp test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TpShape {
    /// `8b`, `70b`, or `HIDDENxFFN`.
    pub name: String,
    pub hidden: usize,
    pub ffn: usize,
}

/// How the tp test's MLP holds its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TpLayout {
    /// Every PE has every token (`TpMlp`: the down projection all-reduces).
    Replicated,
    /// Each PE has an equal share of the tokens on the way in and out (`SequenceParallelMlp`:
    /// an all-gather before the gate/up GEMM, a reduce-scatter after the down GEMM).
    Sequence,
}

impl TpLayout {
    pub const ALL: [TpLayout; 2] = [TpLayout::Replicated, TpLayout::Sequence];

    pub fn name(self) -> &'static str {
        match self {
            TpLayout::Replicated => "replicated",
            TpLayout::Sequence => "sequence",
        }
    }

    /// The report's variant of `shape` in this layout: its name, `-sp` after it in sequence
    /// parallelism.
    pub fn variant(self, shape: &str) -> String {
        match self {
            TpLayout::Replicated => shape.into(),
            TpLayout::Sequence => format!("{shape}-sp"),
        }
    }
}

/// Parse --tp-layouts: names of [`TpLayout`]s, comma separated; one given twice counts once.
pub fn parse_tp_layouts(text: &str) -> Result<Vec<TpLayout>, String> {
    let mut layouts = Vec::new();
    for t in text.split(',').map(str::trim) {
        let layout = TpLayout::ALL
            .into_iter()
            .find(|l| l.name() == t.to_ascii_lowercase())
            .ok_or_else(|| format!("--tp-layouts: `{t}` is not a layout (replicated, sequence)"))?;
        if !layouts.contains(&layout) {
            layouts.push(layout);
        }
    }
    Ok(layouts)
}

/// Parse --tp-shapes: names of [`TP_NAMED_SHAPES`] and `HIDDEN,FFN` pairs, comma separated
/// (`8b,70b`, `4096,14336`, `70b,1024,4096`); a shape given twice counts once.
pub fn parse_tp_shapes(text: &str) -> Result<Vec<TpShape>, String> {
    let mut shapes: Vec<TpShape> = Vec::new();
    let mut tokens = text.split(',').map(str::trim);
    while let Some(token) = tokens.next() {
        let lower = token.to_ascii_lowercase();
        let shape = match TP_NAMED_SHAPES.iter().find(|(name, _, _)| *name == lower) {
            Some(&(name, hidden, ffn)) => TpShape {
                name: name.into(),
                hidden,
                ffn,
            },
            None => {
                let number = |t: &str| -> Result<usize, String> {
                    match t.parse::<usize>() {
                        Ok(v) if v > 0 => Ok(v),
                        _ => Err(format!(
                            "--tp-shapes: `{t}` is neither a shape name (8b, 70b) nor a positive \
                             number of features (HIDDEN,FFN)"
                        )),
                    }
                };
                let hidden = number(token)?;
                let ffn = number(tokens.next().ok_or_else(|| {
                    format!("--tp-shapes: hidden size {hidden} needs its FFN size after it (HIDDEN,FFN)")
                })?)?;
                TpShape {
                    name: format!("{hidden}x{ffn}"),
                    hidden,
                    ffn,
                }
            }
        };
        if !shapes
            .iter()
            .any(|s| (s.hidden, s.ffn) == (shape.hidden, shape.ffn))
        {
            shapes.push(shape);
        }
    }
    Ok(shapes)
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
}

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

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
        if a.block_threads == 0 || a.block_threads % 32 != 0 || a.block_threads > 1024 {
            return Err(format!(
                "--block-threads {}: must be a multiple of 32 between 32 and 1024",
                a.block_threads
            ));
        }
        if a.peer == 0 {
            return Err("--peer: the peer of PE 0 must be another PE (1 or more)".into());
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
                || self.tests.tp))
            || self.needs_cublasmp()
    }

    /// Whether cuBLASMp is used (the tp test's cublasmp column).
    pub fn needs_cublasmp(&self) -> bool {
        self.impls.contains(&Impl::Cublasmp) && self.tests.tp
    }

    /// The implementations of the collectives, in `--impls` order.
    pub fn collective_impls(&self) -> Vec<Impl> {
        self.impls
            .iter()
            .copied()
            .filter(|i| i.is_collective())
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

/// Parse a size: a number with an optional K/M/G/T suffix (powers of 1024), optionally
/// followed by `B` or `iB` (`64`, `4K`, `1MiB`, `256M`, `2G`).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let value: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size (examples: 8, 4K, 1M, 256MiB)"))?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("`{text}`: unknown size unit (use K, M, G or T)")),
    };
    value
        .checked_mul(1usize << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

fn parse_size_arg(text: &str) -> Result<usize, String> {
    parse_size(text)
}

/// `min, min*factor, ...` up to and including `max` (as nccl-tests' -b/-e/-f).
pub fn size_list(min: usize, max: usize, factor: usize) -> Result<Vec<usize>, String> {
    if min == 0 {
        return Err("--min-bytes must be at least 1".into());
    }
    if min > max {
        return Err(format!(
            "--min-bytes {min} is larger than --max-bytes {max}"
        ));
    }
    if factor < 2 {
        return Err("--step-factor must be at least 2".into());
    }
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        match s.checked_mul(factor) {
            Some(n) => s = n,
            None => break,
        }
    }
    Ok(v)
}

/// A size for people: `8 B`, `4 KiB`, `1.5 MiB`.
pub fn format_size(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{} {}", value as u64, UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut full = vec!["bench"];
        full.extend_from_slice(args);
        let a = Args::try_parse_from(full).map_err(|e| e.to_string())?;
        Config::from_args(a)
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert_eq!(parse_size(" 16 KiB "), Ok(16 << 10));
        assert!(parse_size("").is_err());
        assert!(parse_size("1.5M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999999999999T").is_err());
    }

    #[test]
    fn size_lists_follow_nccl_tests() {
        assert_eq!(size_list(8, 64, 2).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(size_list(8, 100, 2).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(size_list(8, 8, 2).unwrap(), vec![8]);
        let full = size_list(8, 256 << 20, 2).unwrap();
        assert_eq!(full.len(), 26);
        assert_eq!(*full.last().unwrap(), 256 << 20);
        assert!(size_list(16, 8, 2).is_err());
        assert!(size_list(0, 8, 2).is_err());
        assert!(size_list(8, 64, 1).is_err());
    }

    #[test]
    fn sizes_print_for_people() {
        assert_eq!(format_size(8), "8 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(3 << 19), "1.5 MiB");
        assert_eq!(format_size(256 << 20), "256 MiB");
    }

    #[test]
    fn defaults_cover_everything() {
        let c = parse(&[]).unwrap();
        assert!(c.tests.allreduce && c.tests.allgather && c.tests.p2p_latency && c.tests.sendrecv);
        assert!(c.tests.reducescatter);
        assert_eq!(c.reducescatter_algo, ReduceScatterAlgo::Auto);
        assert_eq!(c.dtypes, vec![DType::Bf16, DType::F32]);
        assert_eq!(
            c.impls,
            vec![
                Impl::Ours,
                Impl::Nvshmem,
                Impl::Nccl,
                Impl::NcclSymm,
                Impl::Cublasmp
            ]
        );
        assert_eq!(
            c.collective_impls(),
            vec![Impl::Ours, Impl::Nvshmem, Impl::Nccl, Impl::NcclSymm]
        );
        // cuBLASMp only with the tp test, and NCCL with it (its communicator).
        assert!(!c.needs_cublasmp());
        let tp = parse(&["--tests", "tp", "--impls", "ours,cublasmp"]).unwrap();
        assert!(tp.needs_cublasmp() && tp.needs_nccl());
        assert!(parse(&["--tests", "allreduce", "--impls", "cublasmp"]).is_err());
        assert_eq!(c.modes, vec![Mode::Plain, Mode::Graph]);
        assert_eq!(c.sizes.first(), Some(&8));
        assert_eq!(c.sizes.last(), Some(&(256 << 20)));
        assert_eq!(c.lat_sizes.last(), Some(&(1 << 20)));
        assert_eq!((c.iters, c.warmup, c.graph_ops, c.inner), (50, 10, 10, 100));
        assert_eq!(c.ctas, vec![1, 8, 32, 128]);
        assert_eq!(c.out, PathBuf::from("bench-results"));
        assert!(c.needs_nccl() && c.plots);
        assert_eq!(c.watchdog_s, 120);
        assert_eq!(c.case_budget_s, 2.0);
    }

    #[test]
    fn slow_cases_are_cut_to_the_budget() {
        let c = parse(&[]).unwrap();
        // Fast operations keep the configured counts.
        assert_eq!(c.budgeted(4096, 10.0, true), (10, 50, 10));
        assert_eq!(c.budgeted(4096, 10.0, false), (10, 50, 1));
        // 381 ms per operation, 2 s budget: 5 operations in all, graphs of one.
        assert_eq!(c.budgeted(256 << 20, 381_000.0, true), (1, 4, 1));
        assert_eq!(c.budgeted(256 << 20, 381_000.0, false), (1, 4, 1));
        // 20 ms at 64 MiB: 100 operations; (2, 10) x 10-op graphs would be 110.
        assert_eq!(c.budgeted(64 << 20, 20_000.0, true), (2, 9, 10));
        // Never below 3 timed samples; no budget, no cut.
        assert_eq!(c.budgeted(256 << 20, 5e6, true), (1, 3, 1));
        let unlimited = parse(&["--case-budget", "0"]).unwrap();
        assert_eq!(unlimited.budgeted(256 << 20, 5e6, true), (2, 10, 10));
        assert!(parse(&["--case-budget", "-1"]).is_err());
    }

    #[test]
    fn quick_shrinks_the_run_but_explicit_options_win() {
        let c = parse(&["--quick"]).unwrap();
        assert_eq!(
            c.sizes,
            vec![8, 64, 512, 4096, 32768, 262144, 2097152, 16777216]
        );
        assert_eq!((c.iters, c.warmup), (10, 2));
        let c = parse(&["--quick", "--iters", "7", "--max-bytes", "1M", "-f", "4"]).unwrap();
        assert_eq!(c.iters, 7);
        // 8 * 4^k up to 1 MiB: the last is 512 KiB.
        assert_eq!(*c.sizes.last().unwrap(), 512 << 10);
        assert_eq!(c.sizes[1], 32);
    }

    #[test]
    fn lists_and_test_groups_parse() {
        let c = parse(&[
            "--tests",
            "allreduce,p2p-bw",
            "--dtypes",
            "f32",
            "--impls",
            "nccl,ours",
        ])
        .unwrap();
        assert!(c.tests.allreduce && !c.tests.allgather && c.tests.p2p_bw && !c.tests.p2p_latency);
        assert_eq!(c.dtypes, vec![DType::F32]);
        assert_eq!(c.impls, vec![Impl::Ours, Impl::Nccl]);
        let c = parse(&["--tests", "reducescatter", "--dtypes", "bf16"]).unwrap();
        assert!(c.tests.reducescatter && !c.tests.allreduce && !c.tests.allgather);
        assert!(c.tests.any_collective() && !c.tests.any_p2p() && !c.tests.tp);
        assert!(c.needs_nccl());
        assert!(
            !parse(&["--tests", "reducescatter", "--impls", "ours,nvshmem"])
                .unwrap()
                .needs_nccl()
        );
        let c = parse(&["--tests", "allgather,reducescatter"]).unwrap();
        assert!(!c.tests.allreduce && c.tests.allgather && c.tests.reducescatter);
        let c = parse(&["--tests", "p2p", "--impls", "ours,nvshmem"]).unwrap();
        assert!(
            !c.tests.allreduce && !c.tests.reducescatter && c.tests.p2p_host && c.tests.sendrecv
        );
        assert!(!c.needs_nccl());
        let c = parse(&["--sizes", "1K,8,1K,64"]).unwrap();
        assert_eq!(c.sizes, vec![8, 64, 1024]);
        let c = parse(&["--ctas", "32,1", "--min-bytes", "1K", "--max-bytes", "4K"]).unwrap();
        assert_eq!(c.ctas, vec![1, 32]);
        assert_eq!(c.sizes, vec![1024, 2048, 4096]);
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(parse(&["--tests", "bogus"]).is_err());
        assert!(parse(&["--dtypes", "f64"]).is_err());
        assert!(parse(&["--min-bytes", "1M", "--max-bytes", "1K"]).is_err());
        assert!(parse(&["--iters", "0"]).is_err());
        assert!(parse(&["--block-threads", "100"]).is_err());
        assert!(parse(&["--ctas", "0"]).is_err());
        assert!(parse(&["--peer", "0"]).is_err());
        assert!(parse(&["--sizes", "0"]).is_err());
    }

    #[test]
    fn large_sizes_get_fewer_iterations_unless_fixed() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.iters_for(1024), (10, 50));
        assert_eq!(c.iters_for(16 << 20), (5, 25));
        assert_eq!(c.iters_for(256 << 20), (2, 10));
        assert_eq!(c.inner_for(8), 100);
        assert_eq!(c.inner_for(1 << 20), 6);
        assert_eq!(c.bw_reps_for(8), 100);
        assert_eq!(c.bw_reps_for(256 << 20), 1);
        let c = parse(&["--fixed-iters"]).unwrap();
        assert_eq!(c.iters_for(256 << 20), (10, 50));
        assert_eq!(c.inner_for(1 << 20), 100);
    }

    #[test]
    fn fingerprints_differ_with_options() {
        let a = parse(&[]).unwrap().fingerprint();
        assert_eq!(a, parse(&[]).unwrap().fingerprint());
        assert_ne!(a, parse(&["--seed", "3"]).unwrap().fingerprint());
    }

    #[test]
    fn algorithm_options_take_the_names_of_the_library_tables() {
        for a in AllReduceAlgo::ALL {
            assert_eq!(parse(&["--algo", a.name()]).unwrap().algo, a);
        }
        for a in AllGatherAlgo::ALL {
            let c = parse(&["--allgather-algo", a.name()]).unwrap();
            assert_eq!(c.allgather_algo, a);
        }
        for a in ReduceScatterAlgo::ALL {
            let c = parse(&["--reducescatter-algo", a.name()]).unwrap();
            assert_eq!(c.reducescatter_algo, a);
        }
        assert!(parse(&["--algo", "fastest"]).is_err());
        assert!(parse(&["--reducescatter-algo", "push"]).is_err());
        // --algo leaves the reduce-scatter alone.
        let c = parse(&["--algo", "twoshot"]).unwrap();
        assert_eq!(c.reducescatter_algo, ReduceScatterAlgo::Auto);
        assert_ne!(
            parse(&[]).unwrap().fingerprint(),
            parse(&["--reducescatter-algo", "pull"])
                .unwrap()
                .fingerprint()
        );
        // --algo alone picks the all-gather of its family.
        let c = parse(&["--algo", "sentinel-twoshot"]).unwrap();
        assert_eq!(c.allgather_algo, AllGatherAlgo::LowLatency);
        let c = parse(&["--algo", "twoshot", "--allgather-algo", "oneshot"]).unwrap();
        assert_eq!(c.allgather_algo, AllGatherAlgo::OneShot);
        assert_eq!(parse(&[]).unwrap().allgather_algo, AllGatherAlgo::Auto);
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        assert!(
            help.contains("sentinel-twoshot"),
            "help lacks the algorithm names"
        );
    }

    #[test]
    fn tp_is_named_not_part_of_all() {
        let c = parse(&[]).unwrap();
        assert!(!c.tests.tp);
        assert_eq!(c.tp_symmetric_bytes(), 0);
        let c = parse(&["--tests", "tp"]).unwrap();
        assert!(c.tests.tp && !c.tests.any_collective() && !c.tests.any_p2p());
        assert!(c.needs_nccl());
        assert!(!parse(&["--tests", "tp", "--impls", "ours"])
            .unwrap()
            .needs_nccl());
        let c = parse(&["--tests", "all,tp"]).unwrap();
        assert!(c.tests.tp && c.tests.allreduce && c.tests.reducescatter && c.tests.p2p_bw);
    }

    #[test]
    fn tp_layouts_parse_by_name() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.tp_layouts, [TpLayout::Replicated, TpLayout::Sequence]);
        let c = parse(&["--tp-layouts", "Sequence, sequence"]).unwrap();
        assert_eq!(c.tp_layouts, [TpLayout::Sequence]);
        assert!(parse(&["--tp-layouts", "sharded"]).is_err());
        assert_eq!(TpLayout::Sequence.variant("8b"), "8b-sp");
        assert_eq!(TpLayout::Replicated.variant("8b"), "8b");
    }

    #[test]
    fn tp_shapes_parse_by_name_and_by_size() {
        let c = parse(&[]).unwrap();
        let sizes = |c: &Config| -> Vec<(String, usize, usize)> {
            c.tp_shapes
                .iter()
                .map(|s| (s.name.clone(), s.hidden, s.ffn))
                .collect()
        };
        assert_eq!(
            sizes(&c),
            vec![("8b".into(), 4096, 14336), ("70b".into(), 8192, 28672)]
        );
        let c = parse(&["--tp-shapes", "4096,14336"]).unwrap();
        assert_eq!(sizes(&c), vec![("4096x14336".into(), 4096, 14336)]);
        let c = parse(&["--tp-shapes", "70B, 1024,4096 ,8b,70b"]).unwrap();
        assert_eq!(
            sizes(&c),
            vec![
                ("70b".into(), 8192, 28672),
                ("1024x4096".into(), 1024, 4096),
                ("8b".into(), 4096, 14336)
            ]
        );
        for bad in ["13b", "8b,4096", "0,128", "128,0", "", "8b,,70b", "4096,x"] {
            assert!(parse(&["--tp-shapes", bad]).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn tp_token_counts_parse_and_have_defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.tp_m, vec![1, 16, 64, 128, 512, 2048, 8192]);
        assert_eq!(parse(&["--quick"]).unwrap().tp_m, vec![1, 128, 2048]);
        let c = parse(&["--tp-m", "2048,1,16,1", "--quick"]).unwrap();
        assert_eq!(c.tp_m, vec![1, 16, 2048]);
        assert!(parse(&["--tp-m", "0"]).is_err());
        assert!(parse(&["--tp-m", "8,x"]).is_err());
        assert_ne!(
            parse(&["--tests", "tp"]).unwrap().fingerprint(),
            parse(&["--tests", "tp", "--tp-m", "1"])
                .unwrap()
                .fingerprint()
        );
        assert_ne!(
            parse(&[]).unwrap().fingerprint(),
            parse(&["--tp-shapes", "8b"]).unwrap().fingerprint()
        );
    }

    #[test]
    fn the_symmetric_heap_fits_the_tp_buffers() {
        // 70b at M = 8192: a partial product and three outputs of 8192 x 8192 bf16, the
        // feature pieces' scratch of 2048 x 8192, and the fused GEMM + reduce-scatter's two
        // buffers of at most 8192 x 8192.
        let replicated = [
            "--tests",
            "tp",
            "--tp-layouts",
            "replicated",
            "--impls",
            "ours,nccl",
        ];
        let c = parse(&replicated).unwrap();
        assert_eq!(c.tp_symmetric_bytes(), (5 * 8192 + 8) * 8192 * 2);
        // cublasmp's workspaces besides: the GEMM + all-reduce's of 4 M x hidden and the
        // fixed part of two (sequence parallel has two workspaces).
        let c = parse(&[&replicated[..4], &["--impls", "cublasmp"]].concat()).unwrap();
        assert_eq!(
            c.tp_symmetric_bytes(),
            (9 * 8192 + 8) * 8192 * 2 + 2 * CUBLASMP_FIXED_BYTES
        );
        // Below 1024 tokens no PE of several has 512 tokens: no exchange buffers.
        let c =
            parse(&[&replicated[..], &["--tp-shapes", "8b", "--tp-m", "16,512"]].concat()).unwrap();
        assert_eq!(c.tp_symmetric_bytes(), (3 * 512 + 8) * 4096 * 2);
        // Sequence parallel (on by default): the gathered input, the partial product and the
        // exchange buffer of 8192 x 8192, the input and three outputs of at most as much.
        let c = parse(&["--tests", "tp", "--impls", "ours"]).unwrap();
        assert_eq!(c.tp_symmetric_bytes(), 7 * 8192 * 8192 * 2);
        // And cublasmp's all-gather and reduce-scatter workspaces (1 and 2 M x hidden): 10 M
        // x hidden, more than the replicated layout's with cublasmp (on by default).
        let c = parse(&["--tests", "tp", "--tp-layouts", "sequence"]).unwrap();
        assert_eq!(
            c.tp_symmetric_bytes(),
            10 * 8192 * 8192 * 2 + 2 * CUBLASMP_FIXED_BYTES
        );
        let c = parse(&["--tests", "tp"]).unwrap();
        assert_eq!(
            c.tp_symmetric_bytes(),
            10 * 8192 * 8192 * 2 + 2 * CUBLASMP_FIXED_BYTES
        );
    }

    #[test]
    fn help_documents_the_options() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        for word in [
            "--tests",
            "--min-bytes",
            "--dtypes",
            "--iters",
            "--out",
            "--quick",
            "busbw",
            "nvshmrun",
            "--tp-shapes",
            "--tp-m",
            "compute-only",
            "cublas+nccl",
            "cublas+ours",
            "TpMlp::auto_schedule",
            "not part of `all`",
            "reducescatter",
            "--reducescatter-algo",
            "ncclReduceScatter",
            "reduce-scatter INPUT",
            "NVSHMEM_REDUCE_SCRATCH_SIZE",
        ] {
            assert!(help.contains(word), "help lacks {word}");
        }
    }
}
