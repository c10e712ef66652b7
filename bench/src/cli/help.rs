//! The text of `--help`: the one-line summary and the long description of every test, its
//! figures, output and environment.

pub(super) const ABOUT: &str = "NVSHMEM vs NCCL benchmark: our all-reduce/all-gather/reduce-scatter kernels, \
NVSHMEM's own on-stream collectives and NCCL side by side, plus device-, host- and stream-initiated \
point-to-point latency and bandwidth";

pub(super) const LONG_ABOUT: &str = "\
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
               with NCCL: ncclSend/ncclRecv ping-pong, one way = round trip / 2; and
               channel_push/channel_pop (nvshmem_rs/channel.cuh) between a persistent kernel
               on each end, thread/warp/block, one way = round trip / 2
  p2p-bw       nvshmemx_putmem_nbi_block / nvshmemx_getmem_nbi_block, the message split over
               --ctas blocks, repeated inside the kernel, then nvshmem_quiet; CUDA events around
               each launch; one way (PE 0 only) and both ways (PE 0 and the peer at once,
               bandwidth counts both directions); with NCCL: ncclSend/ncclRecv one way and
               grouped send+recv both ways
  p2p-host     host-initiated nvshmem_putmem + nvshmem_quiet / nvshmem_getmem (host clock), and
               on-stream nvshmemx_putmem_on_stream + nvshmemx_quiet_on_stream /
               nvshmemx_getmem_on_stream (CUDA events)
  sendrecv     only the NCCL send/recv comparisons above
  p2p-matrix   every ordered pair of PEs: one-way and both-ways put bandwidth at 64 MiB (the
               largest --ctas), 8-byte put latency, as p2p-bw and p2p-latency measure them
               for PE 0 and --peer; then every PE to every other at once (16 MiB to each),
               GB/s per GPU. Tables name the slowest pair and mark pairs under --min-gbps
               (0: under 80% of the median pair) with *; p2p_matrix_put_bw.svg is a heat map
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

ALL-REDUCE + RMSNORM (--tests norm; not part of `all`)
  The residual add and RMSNorm after a row-parallel layer, bf16, hidden 4096 and 8192, 1, 4,
  16 and 64 tokens, each in CUDA graphs of --graph-ops calls:
    fused         nvshmem::tp::TensorParallel::all_reduce_rmsnorm
    ours+rmsnorm  our all-reduce, then TensorParallel::rmsnorm
    nccl+rmsnorm  ncclAllReduce, then the same rmsnorm
    all-reduce    our all-reduce alone
  Check: after the replays each runs once from a fresh residual; the new residual must be the
  CPU's bit for bit (NCCL's within 2^-7) and the output within a bf16 rounding of the CPU's.
  Then the MLP half of a Llama 8B decoder layer (TpMlp, hidden 4096, ffn 14336), 1 to 64
  tokens: TpMlp::forward_rmsnorm (mlp+fused), TpMlp::forward then rmsnorm, and the MLP alone;
  the fused block must equal the sequential forward then rmsnorm bit for bit.

GRADIENT SYNC (--tests gradsync; not part of `all`)
  The compressed all-reduce of f32 gradients, at the --sizes from 256 KiB up, each in CUDA
  graphs of --graph-ops calls; GB/s over the uncompressed f32 bytes:
    int8/128, fp8e4m3/128, fp16, bf16   Collectives::all_reduce_compressed
    ours-f32                            our all-reduce of the f32 gradients
    nccl-f32, nccl-bf16                 ncclAllReduce in f32, and of the gradients in bf16
  Check: after the replays each runs once more; a compressed row must equal the CPU model bit
  for bit and lie within its error bound everywhere (the largest error / bound is printed);
  ours-f32 the f32 sum in PE order bit for bit; NCCL within 2n roundings of its type.

LATENCY FLOOR (--tests floor; part of all, and run before any collective)
  kernel node   graphs of 64 one-thread kernels (each adds 1 to a counter the host checks),
                plain and with programmatic dependent launch (PDL); time per node
  remote store  PE 0 and --peer ping-pong 8-byte st.release.sys stores, each polling its own
                word with ld.acquire.sys, 1000 rounds per launch; one way = round trip / 2
  L2            one thread chasing a random cycle of 4 MiB with ld.global.cg; per load
  A one-shot collective in a graph pays at least a PDL node + a store + an L2 round trip: the
  collective tables give our rows as multiples of that sum (ours / floor).

1F1B PIPELINE (--tests pipeline; not part of `all`), one stage per PE
  Each stage an MLP block y = x + relu(x w1^T) w2^T (bf16, cuBLASLt; --pipe-hidden,
  --pipe-ffn), --pipe-micro-batches micro-batches of each --pipe-tokens count per step,
  forward and backward in nvshmem::pipeline::OneFOneB's order, loss |y|^2 / 2; each step one
  CUDA graph, timed by --iters replays:
    ours   activations and gradients through nvshmem::channel::Channel (2 slots each way)
    nccl   ncclSend/ncclRecv, each send grouped with the receive after it
    local  each receive copies what the single-GPU run handed over, each send copies to a
           scratch buffer: the stage's compute, the base of the bubble and exposed figures
  Check: outputs, input gradients and weight gradients equal a single-GPU run of every stage,
  bit for bit; each stage's block is checked against the CPU first.

HYBRID TRAINING STEP (--tests hybrid; not part of `all`)
  examples/hybrid.rs's model (8 Llama-like MLP blocks: bf16, RMSNorm, residual; hidden 2048,
  FFN 8192; 8 micro-batches of 16 tokens per replica) for each layout of the PEs (4: TP2 x
  PP2, TP2 x DP2, PP2 x DP2; 2: TP2, PP2, DP2). A step (every micro-batch forward and
  backward, the weight gradients, their sum over the replicas) in a CUDA graph:
    ours     our layers in a group, channels between stages (1F1B), GradientSync over replicas
    nccl     the same passes with ncclAllReduce on communicators split per group and per
             replica column (ncclCommSplit), and ncclSend/ncclRecv between stages
    compute  the same passes with no communication
    1 GPU    the whole model on one GPU over every replica's micro-batches
  Tokens/s, ours vs nccl, comm share = 1 - compute / step, and scaling efficiency = tokens/s
  / (PEs x 1 GPU tokens/s). Needs NVSHMEM_SYMMETRIC_SIZE=4G or more, and one GPU per PE for
  the nccl rows (--impls ours leaves them out). Check: every PE's summed gradients against the
  single-GPU run's (2^-6 of their RMS per block plus 2^-5 of each); replicas' bits equal;
  compute's replays equal one more run of it, bit for bit.

TEAMS (--team-size N with the collective tests)
  Our collectives over teams of N PEs (rows of a 2-D split), every team at once, each on
  data of its own; the NCCL and NVSHMEM rows are left out.

PAGE POOL (--tests pool; part of all)
  nvshmem::pool::PagePool::gather_device of 1, 16 and 256 pages of 16 KiB and 64 KiB into
  local device memory, by PE 0: from --peer (PE 0 itself when alone), from every other PE in
  turn, and from PE 0's own pages (local: the same kernel copying device to device). Each
  PE's pool holds 256 pages, all allocated. Gathers are captured into CUDA graphs of
  --graph-ops gathers, cut to --case-budget; time = median per gather; GB/s = gathered
  bytes / time. Check: every row writes fresh random bytes into every PE's pages, PE 0's
  destination is poisoned before the replays and must hold the pages' bytes afterwards.

SYMMETRIC MAP (--tests map; part of all)
  nvshmem::map::SymmetricMap, by PE 0. Latency: one warp of a kernel looks up 256 keys of
  64-byte values one after another (each key depends on the value before), held by PE 0
  (local owner) and by --peer (remote owner); time = per lookup. Batches: lookup_batch of 1,
  1 Ki and 1 Mi keys of every PE, values of 64 B, 1 KiB and 16 KiB, against a
  device-to-device copy of the same bytes (local copy), in CUDA graphs. Inserts:
  insert_batch of 1 Ki and 1 Mi keys of 64 B and 1 KiB, each after an untimed remove_batch.
  Maps larger than 512 MiB a PE are skipped with a note. Check: every case's map is filled
  with fresh random values; every status must be Done and every looked-up value equal the
  one inserted.

KV HAND-OFF (--tests kv-transfer; part of all)
  Disaggregated serving's hand-off: PE 0 (prefill) holds a request's pages at random places
  of its PagePool, and --peer (decode) takes them into one contiguous buffer. Requests of 1,
  4, 16, 64 and 256 pages of 16 KiB and 64 KiB, each moved three ways, one launch per
  request: pool pull (PagePool::gather_device on the decode PE), nccl (ncclSend of each page
  and ncclRecv of each into place, one group per request a side), and put (put_on_stream of
  the same bytes from a contiguous region, then quiet_on_stream: the pair's one-way put
  bandwidth). Time = median per request on the side that finishes it. Check: fresh random
  pages on PE 0 in every row; the decode PE's destination is poisoned first and must hold
  the request's bytes afterwards.

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
