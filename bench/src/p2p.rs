//! Point-to-point: device-initiated p/g, put/get and put-with-signal ping-pong (kernels in
//! kernels/bench_p2p.cu), device bandwidth over CTA counts, host-initiated and on-stream RMA,
//! and NCCL send/recv. PE 0 talks to `--peer`; the other PEs only join barriers and checks.

use crate::cli::{format_size, Config};
use crate::coord::Coord;
use crate::data::{self, Mismatch};
use crate::error::{BenchError, CudaExt, Guard, Result};
use crate::nccl::Nccl;
use crate::report::{Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::CudaStream;
use nvshmem::module::{Function, KernelArgs, Module};
use nvshmem::{sys, LaunchConfig, Nvshmem, SymmetricBuffer};
use std::sync::Arc;

/// Work-group scope of a device operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Thread,
    Warp,
    Block,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Thread, Scope::Warp, Scope::Block];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Thread => "thread",
            Scope::Warp => "warp",
            Scope::Block => "block",
        }
    }

    fn threads(self, block_threads: u32) -> u32 {
        match self {
            Scope::Thread => 1,
            Scope::Warp => 32,
            Scope::Block => block_threads,
        }
    }
}

/// Slots written by the `p` kernel, read by the `g` kernel (`% 32` in bench_p2p.cu).
const P_SLOTS: usize = 32;

/// What `dst[0..32]` holds on the target after the `p` kernel wrote `token + i` into
/// `dst[i % 32]` for `i` in `0..total` (slots never written stay 0).
pub fn p_expected(token: u32, total: usize) -> Vec<u32> {
    (0..P_SLOTS)
        .map(|j| {
            if j < total {
                let last = j + P_SLOTS * ((total - 1 - j) / P_SLOTS);
                token.wrapping_add(last as u32)
            } else {
                0
            }
        })
        .collect()
}

/// Words the `g` kernel reads: one per 128-byte line over 8 MiB, visited in a scattered
/// order, so no read is served by a cache (`G_*` in bench_p2p.cu).
const G_SLOTS: usize = 65536;
const G_STRIDE: usize = 32;
const G_STEP: usize = 40503;
/// A read returning this moves the next read one word on (a data dependency).
const G_MAGIC: u32 = 0x9E37_79B9;

/// The word of the `g` kernel's `i`-th read.
pub fn g_index(i: usize) -> usize {
    (i * G_STEP) % G_SLOTS * G_STRIDE
}

/// The sum the `g` kernel computes over `total` dependent reads, replayed.
pub fn g_expected(values: &[u32], total: usize) -> u64 {
    let (mut v, mut sum) = (0u32, 0u64);
    for i in 0..total {
        v = values[g_index(i) + usize::from(v == G_MAGIC)];
        sum += v as u64;
    }
    sum
}

/// The region that get tests read from and put-bandwidth tests write to, cycling, larger than
/// any GPU's L2 cache.
const REGION: usize = 128 << 20;

/// Where the repetitions of a test land: repetition `rep` (counted over the whole test) uses
/// slot `rep % nslots` of the remote region, so no repetition finds an earlier one's bytes in
/// a cache (a get) or merges with them there (a put), and each moves its bytes over the link
/// (`first`/`nslots` in bench_p2p.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    pub slot_bytes: usize,
    pub nslots: usize,
}

impl Slots {
    /// Slots of `bytes` (rounded up to 256) in a region of `region` bytes.
    pub fn new(bytes: usize, region: usize) -> Self {
        let slot_bytes = bytes.max(1).div_ceil(256) * 256;
        Slots {
            slot_bytes,
            nslots: (region / slot_bytes).max(1),
        }
    }

    /// Bytes of the region that `total` repetitions use.
    pub fn used_bytes(&self, total: usize) -> usize {
        self.nslots.min(total.max(1)) * self.slot_bytes
    }

    /// Byte offset of the slot that repetition `rep` uses.
    pub fn offset(&self, rep: usize) -> usize {
        (rep % self.nslots) * self.slot_bytes
    }
}

/// The source and destination buffers' length: the largest message, and at least the region.
pub fn region_len(max_bytes: usize) -> usize {
    max_bytes.max(REGION).div_ceil(256) * 256
}

/// In-kernel warm-up repetitions for `inner` timed ones.
pub fn inner_warmup(inner: usize) -> usize {
    (inner / 10).max(1)
}

// Keys of the random data of each test.
const K_P: u64 = 1;
const K_G: u64 = 2;
const K_RMA: u64 = 3;
const K_SIGNAL: u64 = 4;
const K_BW: u64 = 5;
const K_HOST: u64 = 6;
const K_NCCL: u64 = 7;

/// Device-side state of the point-to-point tests (all PEs allocate it).
pub struct P2p<'a> {
    shmem: &'a Nvshmem,
    coord: &'a Coord,
    cfg: &'a Config,
    stream: &'a Arc<CudaStream>,
    module: Option<&'a Module>,
    nccl: Option<&'a Nccl>,
    progress: &'a Progress,
    me: usize,
    peer: usize,
    src: Guard<SymmetricBuffer<u8>>,
    dst: Guard<SymmetricBuffer<u8>>,
    sig: Guard<SymmetricBuffer<u64>>,
    times: Guard<SymmetricBuffer<u64>>,
    words: Guard<SymmetricBuffer<u32>>,
    gsum: Guard<SymmetricBuffer<u64>>,
    /// The `g` kernel's 8 MiB of scattered words.
    gwords: Guard<SymmetricBuffer<u32>>,
}

/// Run the selected point-to-point tests (collective over all PEs).
#[allow(clippy::too_many_arguments)]
pub fn run(
    shmem: &Nvshmem,
    coord: &Coord,
    cfg: &Config,
    stream: &Arc<CudaStream>,
    module: Option<&Module>,
    nccl: Option<&Nccl>,
    progress: &Progress,
    timer: &mut Timer,
    results: &mut Results,
) -> Result<()> {
    let max_bytes = cfg.max_size().max(64);
    let p = P2p {
        shmem,
        coord,
        cfg,
        stream,
        module,
        nccl,
        progress,
        me: shmem.my_pe(),
        peer: cfg.peer,
        src: Guard::new(shmem.malloc::<u8>(region_len(max_bytes))?),
        dst: Guard::new(shmem.calloc::<u8>(region_len(max_bytes))?),
        sig: Guard::new(shmem.calloc::<u64>(8)?),
        times: Guard::new(shmem.calloc::<u64>(cfg.warmup + cfg.iters + 1)?),
        words: Guard::new(shmem.calloc::<u32>(2 * P_SLOTS)?),
        gsum: Guard::new(shmem.calloc::<u64>(1)?),
        gwords: Guard::new(shmem.calloc::<u32>(G_SLOTS * G_STRIDE)?),
    };
    let t = cfg.tests;
    if t.p2p_latency {
        p.p_and_g(results)?;
        for get in [false, true] {
            for scope in Scope::ALL {
                for &bytes in &cfg.lat_sizes {
                    results.push(p.rma_latency(get, scope, bytes)?);
                }
                p.say_series(results, if get { "get" } else { "put" }, scope.name());
            }
        }
    }
    if t.p2p_signal {
        for scope in Scope::ALL {
            for &bytes in &cfg.lat_sizes {
                results.push(p.signal_pingpong(scope, bytes)?);
            }
            p.say_series(results, "put_signal_pingpong", scope.name());
        }
    }
    if (t.p2p_signal || t.sendrecv) && nccl.is_some() {
        for &bytes in &cfg.lat_sizes {
            results.push(p.nccl_pingpong(timer, bytes)?);
        }
        p.say_series(results, "nccl_pingpong", "");
    }
    if t.p2p_bw {
        for get in [false, true] {
            for bidir in [false, true] {
                for &ctas in &cfg.ctas {
                    for &bytes in &cfg.sizes {
                        results.push(p.bandwidth(timer, get, bidir, ctas, bytes)?);
                    }
                    p.say_series(
                        results,
                        if get { "get_bw" } else { "put_bw" },
                        &bw_variant(bidir, ctas),
                    );
                }
            }
        }
    }
    if (t.p2p_bw || t.sendrecv) && nccl.is_some() {
        for bidir in [false, true] {
            for &bytes in &cfg.sizes {
                results.push(p.nccl_bandwidth(timer, bidir, bytes)?);
            }
            p.say_series(
                results,
                "nccl_sendrecv_bw",
                if bidir { "bidir" } else { "uni" },
            );
        }
    }
    if t.p2p_host {
        for test in ["host_put", "host_get", "stream_put", "stream_get"] {
            for &bytes in &cfg.lat_sizes {
                results.push(p.host_latency(timer, test, bytes)?);
            }
            p.say_series(results, test, "");
        }
    }
    Ok(())
}

fn bw_variant(bidir: bool, ctas: u32) -> String {
    format!("{} ctas={ctas}", if bidir { "bidir" } else { "uni" })
}

impl P2p<'_> {
    fn is_initiator(&self) -> bool {
        self.me == 0
    }

    fn is_target(&self) -> bool {
        self.me == self.peer
    }

    /// The PE this one talks to (PE 0 <-> peer).
    fn other(&self) -> usize {
        if self.is_initiator() {
            self.peer
        } else {
            0
        }
    }

    fn raw_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    fn bind(&self) -> Result<()> {
        self.shmem
            .context()
            .bind_to_thread()
            .cuda("cuCtxSetCurrent")
    }

    fn module(&self) -> Result<&Module> {
        self.module
            .ok_or_else(|| BenchError::new("the point-to-point kernels (bench_p2p) are not loaded"))
    }

    fn function(&self, name: &str) -> Result<Function> {
        Ok(self.module()?.function(name)?)
    }

    fn say_series(&self, results: &Results, test: &str, variant: &str) {
        let recs: Vec<&Record> = results
            .records
            .iter()
            .filter(|r| r.test == test && (variant.is_empty() || r.variant == variant))
            .collect();
        let failed = recs.iter().filter(|r| r.status == Status::Failed).count();
        let best_time = recs
            .iter()
            .filter_map(|r| r.median_us())
            .fold(f64::INFINITY, f64::min);
        let best_bw = recs.iter().filter_map(|r| r.algbw_gbs).fold(0.0, f64::max);
        self.progress.say(format!(
            "p2p {test}{}{}: {} sizes, best {:.2} us, peak {:.2} GB/s{}",
            if variant.is_empty() { "" } else { " " },
            variant,
            recs.len(),
            best_time,
            best_bw,
            if failed > 0 {
                format!(", {failed} FAILED")
            } else {
                String::new()
            }
        ));
    }

    /// Fresh random source bytes on every PE and a zeroed destination, then a barrier.
    fn prepare(&self, key: u64, bytes: usize) -> Result<()> {
        self.prepare_put(key, bytes, bytes)
    }

    /// As [`P2p::prepare`], with the first `zero` bytes of the destination zeroed (the slots
    /// a put-bandwidth test writes).
    fn prepare_put(&self, key: u64, bytes: usize, zero: usize) -> Result<()> {
        self.src
            .view(0..bytes)
            .copy_from_host(&data::bytes(key, self.me, bytes))?;
        self.zero_dst_and_sync(zero)
    }

    /// For a get test: fresh random words over the first `used` bytes of every PE's source
    /// region (made on the GPU, `data::bytes_at` on the host), a zeroed destination, a barrier.
    fn prepare_get(&self, key: u64, bytes: usize, used: usize) -> Result<()> {
        self.bind()?;
        let f = self.function("bench_fill_random")?;
        let words = used / 8;
        let mut args = KernelArgs::new();
        args.value(self.src.addr())
            .value(words)
            .value(data::pe_base(key, self.me));
        let cfg = LaunchConfig {
            grid_dim: (words.div_ceil(256).clamp(1, 1024) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches bench_fill_random(uint64_t*, size_t, uint64_t); `used` <= the source
        // buffer's length (Slots never exceeds the region).
        unsafe { f.launch(cfg, self.stream, &mut args)? };
        self.zero_dst_and_sync(bytes)
    }

    /// Zero the first `len` bytes of the destination, wait for the stream, then for every PE.
    fn zero_dst_and_sync(&self, len: usize) -> Result<()> {
        self.bind()?;
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.dst.addr(),
                0,
                len,
                self.stream.cu_stream(),
            )
        }
        .cuda("cuMemsetD8Async")?;
        self.stream.synchronize().cuda("cuStreamSynchronize")?;
        self.coord.barrier()
    }

    /// Compare the last repetition's bytes with `from`'s source: for a get, `dst[..bytes]`
    /// against `from`'s region at `offset`; for a put, `dst[offset..]` against its message.
    fn check_slot(
        &self,
        key: u64,
        from: usize,
        get: bool,
        offset: usize,
        bytes: usize,
    ) -> Result<Mismatch> {
        let (at, want) = if get {
            (0, data::bytes_at(key, from, offset, bytes))
        } else {
            (offset, data::bytes(key, from, bytes))
        };
        let got = self.dst.view(at..at + bytes).to_vec()?;
        Ok(data::compare_plain(&got, &want))
    }

    /// Wait for this PE's stream, then for every PE.
    fn finish(&self) -> Result<()> {
        self.stream.synchronize().cuda("cuStreamSynchronize")?;
        self.coord.barrier()
    }

    /// Compare this PE's destination with `from`'s source bytes.
    fn check_dst(&self, key: u64, from: usize, bytes: usize) -> Result<Mismatch> {
        let got = self.dst.view(0..bytes).to_vec()?;
        Ok(data::compare_plain(&got, &data::bytes(key, from, bytes)))
    }

    /// Sum mismatches over all PEs into a status.
    fn agree(&self, local: Mismatch) -> Result<(Status, String)> {
        let totals = self.coord.sums(&[local.count, (local.count > 0) as u64])?;
        if totals[0] == 0 {
            Ok((Status::Ok, "ok".into()))
        } else {
            Ok((
                Status::Failed,
                format!(
                    "{} wrong values on {} PE(s); this PE: {}",
                    totals[0],
                    totals[1],
                    local.describe()
                ),
            ))
        }
    }

    /// Kernel-measured times of launches `warm..warm+n` in microseconds per repetition,
    /// divided by `div` (2 for one way of a round trip). PE 0 only; empty elsewhere.
    fn kernel_samples(&self, warm: usize, n: usize, inner: usize, div: f64) -> Result<Vec<f64>> {
        if !self.is_initiator() {
            return Ok(Vec::new());
        }
        let ns = self.times.view(warm..warm + n).to_vec()?;
        Ok(ns
            .iter()
            .map(|&t| t as f64 / inner as f64 / div / 1e3)
            .collect())
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        test: &str,
        variant: &str,
        mode: &str,
        dtype: &str,
        bytes: usize,
        samples: &[f64],
        directions: f64,
        check: (Status, String),
    ) -> Record {
        let time_us = stats::summarize(samples);
        let bw = time_us.map(|t| stats::algbw_gbs(bytes as f64 * directions, t.median));
        Record {
            test: test.into(),
            variant: variant.into(),
            implementation: if test.starts_with("nccl") {
                "nccl"
            } else {
                "nvshmem"
            }
            .into(),
            mode: mode.into(),
            dtype: dtype.into(),
            bytes,
            count: bytes,
            n_pes: self.shmem.n_pes(),
            time_us,
            algbw_gbs: bw,
            busbw_gbs: bw,
            status: check.0,
            check: check.1,
            tp: None,
        }
    }

    fn times_ptr(&self, slot: usize) -> u64 {
        self.times.addr() + 8 * slot as u64
    }

    fn one_block(threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// nvshmem_uint32_p + quiet and nvshmem_uint32_g latency, one thread.
    fn p_and_g(&self, results: &mut Results) -> Result<()> {
        timing::step("p2p p and g latency");
        let (warm, launches) = self.cfg.iters_for(4);
        let inner = self.cfg.inner_for(4);
        let inner_warm = inner_warmup(inner);
        let total = inner_warm + inner;
        let words = self.words.addr();

        // p: PE 0 writes token + i into the target's words[i % 32].
        let key = data::key(self.cfg.seed, &[K_P]);
        let token = data::word(key, 0, 0) as u32;
        self.words.copy_from_host(&[0u32; 2 * P_SLOTS])?;
        self.coord.barrier()?;
        if self.is_initiator() {
            let f = self.function("bench_p_latency")?;
            for s in 0..warm + launches {
                let mut args = KernelArgs::new();
                args.value(words)
                    .value(self.peer as i32)
                    .value(token)
                    .value(inner_warm as i32)
                    .value(inner as i32)
                    .value(self.times_ptr(s));
                // SAFETY: matches bench_p_latency(uint32_t*, int, uint32_t, int, int, u64*);
                // words holds 64 u32 on every PE, times warmup + iters + 1 u64.
                unsafe { f.launch(Self::one_block(1), self.stream, &mut args)? };
            }
        }
        self.finish()?;
        let local = if self.is_target() {
            let got = self.words.view(0..P_SLOTS).to_vec()?;
            data::compare_plain(&got, &p_expected(token, total))
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        let samples = self.kernel_samples(warm, launches, inner, 1.0)?;
        results.push(self.record("p", "thread", "device", "u32", 4, &samples, 1.0, check));

        // g: PE 0 reads the target's gwords[g_index(i)], each read's address depending on the
        // previous read's value, and sums them.
        let key = data::key(self.cfg.seed, &[K_G]);
        self.gwords
            .copy_from_host(&data::words32(key, self.me, G_SLOTS * G_STRIDE))?;
        self.gsum.copy_from_host(&[0])?;
        self.coord.barrier()?;
        if self.is_initiator() {
            let f = self.function("bench_g_latency")?;
            for s in 0..warm + launches {
                let mut args = KernelArgs::new();
                args.value(self.gwords.addr())
                    .value(self.peer as i32)
                    .value(inner_warm as i32)
                    .value(inner as i32)
                    .value(self.gsum.addr())
                    .value(self.times_ptr(s));
                // SAFETY: matches bench_g_latency(const uint32_t*, int, int, int, u64*, u64*).
                unsafe { f.launch(Self::one_block(1), self.stream, &mut args)? };
            }
        }
        self.finish()?;
        let local = if self.is_initiator() {
            let got = self.gsum.to_vec()?;
            let want = g_expected(&data::words32(key, self.peer, G_SLOTS * G_STRIDE), total);
            data::compare_plain(&got, &[want])
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        let samples = self.kernel_samples(warm, launches, inner, 1.0)?;
        results.push(self.record("g", "thread", "device", "u32", 4, &samples, 1.0, check));
        self.progress.say(format!(
            "p2p p/g: p {:.2} us, g {:.2} us",
            results.records[results.records.len() - 2]
                .median_us()
                .unwrap_or(f64::NAN),
            results.records[results.records.len() - 1]
                .median_us()
                .unwrap_or(f64::NAN)
        ));
        Ok(())
    }

    /// put + quiet (or blocking get) of `bytes`, repeated in one kernel, at `scope`.
    fn rma_latency(&self, get: bool, scope: Scope, bytes: usize) -> Result<Record> {
        timing::step(format!(
            "p2p {} latency, {} scope, {}",
            if get { "get" } else { "put" },
            scope.name(),
            format_size(bytes)
        ));
        let (warm, launches) = self.cfg.iters_for(bytes);
        let inner = self.cfg.inner_for(bytes);
        let key = data::key(
            self.cfg.seed,
            &[K_RMA, get as u64, scope as u64, bytes as u64],
        );
        let per_launch = inner_warmup(inner) + inner;
        let total = (warm + launches) * per_launch;
        let slots = Slots::new(bytes, self.src.len());
        if get {
            self.prepare_get(key, bytes, slots.used_bytes(total))?;
        } else {
            self.prepare(key, bytes)?;
        }
        if self.is_initiator() {
            let name = format!(
                "bench_{}_latency_{}",
                if get { "get" } else { "put" },
                scope.name()
            );
            let f = self.function(&name)?;
            let cfg = Self::one_block(scope.threads(self.cfg.block_threads));
            for s in 0..warm + launches {
                let mut args = KernelArgs::new();
                // put: dst on the peer <- local src; get: local dst <- slots of src on the peer.
                args.value(self.dst.addr()).value(self.src.addr());
                if get {
                    args.value(slots.slot_bytes)
                        .value(slots.nslots)
                        .value(s * per_launch);
                }
                args.value(bytes)
                    .value(self.peer as i32)
                    .value(inner_warmup(inner) as i32)
                    .value(inner as i32)
                    .value(self.times_ptr(s));
                // SAFETY: matches bench_put_latency_*(void*, const void*, size_t, int, int, int,
                // u64*) and bench_get_latency_*(void*, const char*, size_t, size_t, size_t,
                // size_t, int, int, int, u64*); both buffers hold at least `bytes` bytes on
                // every PE and the slots lie within the source buffer.
                unsafe { f.launch(cfg, self.stream, &mut args)? };
            }
        }
        self.finish()?;
        let local = match (get, self.is_initiator(), self.is_target()) {
            (false, _, true) => self.check_dst(key, 0, bytes)?,
            // The last repetition's slot.
            (true, true, _) => {
                self.check_slot(key, self.peer, true, slots.offset(total - 1), bytes)?
            }
            _ => Mismatch::default(),
        };
        let check = self.agree(local)?;
        let samples = self.kernel_samples(warm, launches, inner, 1.0)?;
        Ok(self.record(
            if get { "get" } else { "put" },
            scope.name(),
            "device",
            "bytes",
            bytes,
            &samples,
            1.0,
            check,
        ))
    }

    /// Put-with-signal ping-pong between PE 0 and the peer; one way = round trip / 2.
    fn signal_pingpong(&self, scope: Scope, bytes: usize) -> Result<Record> {
        timing::step(format!(
            "p2p put-with-signal ping-pong, {} scope, {}",
            scope.name(),
            format_size(bytes)
        ));
        let (warm, launches) = self.cfg.iters_for(bytes);
        let inner = self.cfg.inner_for(bytes);
        let key = data::key(self.cfg.seed, &[K_SIGNAL, scope as u64, bytes as u64]);
        self.prepare(key, bytes)?;
        let active = self.is_initiator() || self.is_target();
        let f = if active {
            Some(self.function(&format!("bench_put_signal_pingpong_{}", scope.name()))?)
        } else {
            None
        };
        let cfg = Self::one_block(scope.threads(self.cfg.block_threads));
        for s in 0..warm + launches {
            // The signal must be 0 on both sides before either kernel starts.
            self.bind()?;
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    self.sig.addr(),
                    0,
                    8,
                    self.stream.cu_stream(),
                )
            }
            .cuda("cuMemsetD8Async")?;
            unsafe { sys::nvshmemx_barrier_all_on_stream(self.raw_stream()) };
            if let Some(f) = &f {
                let mut args = KernelArgs::new();
                args.value(self.dst.addr())
                    .value(self.src.addr())
                    .value(bytes)
                    .value(self.sig.addr())
                    .value(self.other() as i32)
                    .value(self.is_initiator() as i32)
                    .value(inner_warmup(inner) as i32)
                    .value(inner as i32)
                    .value(self.times_ptr(s));
                // SAFETY: matches bench_put_signal_pingpong_*(void*, const void*, size_t,
                // uint64_t*, int, int, int, int, u64*); the two PEs wait on each other, so the
                // launch must be co-resident.
                unsafe { f.launch_collective(cfg, self.stream, &mut args)? };
            }
        }
        self.finish()?;
        let local = if active {
            self.check_dst(key, self.other(), bytes)?
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        let samples = self.kernel_samples(warm, launches, inner, 2.0)?;
        Ok(self.record(
            "put_signal_pingpong",
            scope.name(),
            "device",
            "bytes",
            bytes,
            &samples,
            1.0,
            check,
        ))
    }

    /// Device put/get bandwidth: `ctas` blocks, the message repeated inside the kernel.
    fn bandwidth(
        &self,
        timer: &mut Timer,
        get: bool,
        bidir: bool,
        ctas: u32,
        bytes: usize,
    ) -> Result<Record> {
        timing::step(format!(
            "p2p {} bandwidth {}, {ctas} CTAs, {}",
            if get { "get" } else { "put" },
            if bidir { "both ways" } else { "one way" },
            format_size(bytes)
        ));
        let (warm, launches) = self.cfg.iters_for(bytes);
        let reps = self.cfg.bw_reps_for(bytes);
        let key = data::key(
            self.cfg.seed,
            &[K_BW, get as u64, bidir as u64, ctas as u64, bytes as u64],
        );
        let total = (warm + launches) * reps;
        let slots = Slots::new(bytes, self.src.len().min(self.dst.len()));
        if get {
            self.prepare_get(key, bytes, slots.used_bytes(total))?;
        } else {
            self.prepare_put(key, bytes, slots.used_bytes(total))?;
        }
        let active = self.is_initiator() || (bidir && self.is_target());
        let f = if active {
            Some(self.function(if get { "bench_get_bw" } else { "bench_put_bw" })?)
        } else {
            None
        };
        let cfg = LaunchConfig {
            grid_dim: (ctas, 1, 1),
            block_dim: (self.cfg.block_threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let raw = self.raw_stream();
        let samples = timer.time_each(
            self.stream,
            warm + launches,
            reps,
            |_| {
                if bidir {
                    // Both directions start together.
                    self.bind()?;
                    unsafe { sys::nvshmemx_barrier_all_on_stream(raw) };
                }
                Ok(())
            },
            |launch| match &f {
                Some(f) => {
                    let mut args = KernelArgs::new();
                    args.value(self.dst.addr())
                        .value(self.src.addr())
                        .value(slots.slot_bytes)
                        .value(slots.nslots)
                        .value(launch * reps)
                        .value(bytes)
                        .value(self.other() as i32)
                        .value(reps as i32);
                    // SAFETY: matches bench_{put,get}_bw(char*, const char*, size_t, size_t,
                    // size_t, size_t, int, int); the slots lie within both buffers on every PE.
                    unsafe { f.launch(cfg, self.stream, &mut args)? };
                    Ok(())
                }
                None => Ok(()),
            },
        )?;
        self.finish()?;
        // put: the target receives PE 0's bytes (and PE 0 the target's when both ways) in the
        // last repetition's slot; get: PE 0 fetches the target's bytes (and the target PE
        // 0's when both ways) from the last repetition's slot.
        let receives = match get {
            false => self.is_target() || (bidir && self.is_initiator()),
            true => self.is_initiator() || (bidir && self.is_target()),
        };
        let local = if receives {
            self.check_slot(key, self.other(), get, slots.offset(total - 1), bytes)?
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        let samples = if self.is_initiator() {
            samples[warm..].to_vec()
        } else {
            Vec::new()
        };
        let dirs = if bidir { 2.0 } else { 1.0 };
        Ok(self.record(
            if get { "get_bw" } else { "put_bw" },
            &bw_variant(bidir, ctas),
            "device",
            "bytes",
            bytes,
            &samples,
            dirs,
            check,
        ))
    }

    /// Host-initiated (`host_*`, host clock) and on-stream (`stream_*`, CUDA events) RMA.
    fn host_latency(&self, timer: &mut Timer, test: &str, bytes: usize) -> Result<Record> {
        timing::step(format!("p2p {test}, {}", format_size(bytes)));
        let (warm, iters) = self.cfg.iters_for(bytes);
        let key = data::key(
            self.cfg.seed,
            &[K_HOST, data::hash_bytes(test.as_bytes()), bytes as u64],
        );
        self.prepare(key, bytes)?;
        let dst = self.dst.as_ptr() as *mut std::ffi::c_void;
        let src = self.src.as_ptr() as *const std::ffi::c_void;
        let peer = self.peer as i32;
        let raw = self.raw_stream();
        let mut samples = Vec::new();
        if self.is_initiator() {
            self.bind()?;
            let n = warm + iters;
            samples = match test {
                "host_put" => timing::time_host(n, || {
                    unsafe {
                        sys::nvshmem_putmem(dst, src, bytes, peer);
                        sys::nvshmem_quiet();
                    }
                    Ok(())
                })?,
                "host_get" => timing::time_host(n, || {
                    unsafe { sys::nvshmem_getmem(dst, src, bytes, peer) };
                    Ok(())
                })?,
                "stream_put" => timer.time_each(
                    self.stream,
                    n,
                    1,
                    |_| Ok(()),
                    |_| {
                        unsafe {
                            sys::nvshmemx_putmem_on_stream(dst, src, bytes, peer, raw);
                            sys::nvshmemx_quiet_on_stream(raw);
                        }
                        Ok(())
                    },
                )?,
                _ => timer.time_each(
                    self.stream,
                    n,
                    1,
                    |_| Ok(()),
                    |_| {
                        unsafe { sys::nvshmemx_getmem_on_stream(dst, src, bytes, peer, raw) };
                        Ok(())
                    },
                )?,
            };
            samples.drain(..warm);
        }
        self.finish()?;
        let local = match (test.ends_with("get"), self.is_initiator(), self.is_target()) {
            (false, _, true) => self.check_dst(key, 0, bytes)?,
            (true, true, _) => self.check_dst(key, self.peer, bytes)?,
            _ => Mismatch::default(),
        };
        let check = self.agree(local)?;
        let mode = if test.starts_with("host") {
            "host"
        } else {
            "stream"
        };
        Ok(self.record(test, "", mode, "bytes", bytes, &samples, 1.0, check))
    }

    fn nccl(&self) -> Result<&Nccl> {
        self.nccl
            .ok_or_else(|| BenchError::new("NCCL is not initialised"))
    }

    /// NCCL send/recv ping-pong; one way = round trip / 2.
    fn nccl_pingpong(&self, timer: &mut Timer, bytes: usize) -> Result<Record> {
        timing::step(format!("p2p NCCL ping-pong, {}", format_size(bytes)));
        let nccl = self.nccl()?;
        let (warm, iters) = self.cfg.iters_for(bytes);
        let key = data::key(self.cfg.seed, &[K_NCCL, 0, bytes as u64]);
        self.prepare(key, bytes)?;
        let (src, dst, other) = (self.src.addr(), self.dst.addr(), self.other());
        let mut samples = Vec::new();
        if self.is_initiator() {
            samples = timer.time_each(
                self.stream,
                warm + iters,
                1,
                |_| Ok(()),
                |_| unsafe {
                    nccl.send(src, bytes, other, self.stream)?;
                    nccl.recv(dst, bytes, other, self.stream)
                },
            )?;
            samples = samples[warm..].iter().map(|t| t / 2.0).collect();
        } else if self.is_target() {
            timer.time_each(
                self.stream,
                warm + iters,
                1,
                |_| Ok(()),
                |_| unsafe {
                    nccl.recv(dst, bytes, other, self.stream)?;
                    nccl.send(src, bytes, other, self.stream)
                },
            )?;
        }
        self.finish()?;
        let active = self.is_initiator() || self.is_target();
        let local = if active {
            self.check_dst(key, other, bytes)?
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        Ok(self.record(
            "nccl_pingpong",
            "",
            "stream",
            "bytes",
            bytes,
            &samples,
            1.0,
            check,
        ))
    }

    /// NCCL send/recv bandwidth, one way or both ways (grouped send + recv).
    fn nccl_bandwidth(&self, timer: &mut Timer, bidir: bool, bytes: usize) -> Result<Record> {
        timing::step(format!(
            "p2p NCCL send/recv bandwidth {}, {}",
            if bidir { "both ways" } else { "one way" },
            format_size(bytes)
        ));
        let nccl = self.nccl()?;
        let (warm, iters) = self.cfg.iters_for(bytes);
        let key = data::key(self.cfg.seed, &[K_NCCL, 1 + bidir as u64, bytes as u64]);
        self.prepare(key, bytes)?;
        let (src, dst, other) = (self.src.addr(), self.dst.addr(), self.other());
        let n = warm + iters;
        let mut samples = Vec::new();
        if self.is_initiator() || self.is_target() {
            let sender = self.is_initiator();
            let t = timer.time_each(
                self.stream,
                n,
                1,
                |_| Ok(()),
                |_| unsafe {
                    if bidir {
                        nccl.send_recv(src, dst, bytes, other, self.stream)
                    } else if sender {
                        nccl.send(src, bytes, other, self.stream)
                    } else {
                        nccl.recv(dst, bytes, other, self.stream)
                    }
                },
            )?;
            if sender {
                samples = t[warm..].to_vec();
            }
        }
        self.finish()?;
        let receives = self.is_target() || (bidir && self.is_initiator());
        let local = if receives {
            self.check_dst(key, other, bytes)?
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        let variant = if bidir { "bidir" } else { "uni" };
        let dirs = if bidir { 2.0 } else { 1.0 };
        Ok(self.record(
            "nccl_sendrecv_bw",
            variant,
            "stream",
            "bytes",
            bytes,
            &samples,
            dirs,
            check,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p_kernel_leaves_the_last_write_of_each_slot() {
        let v = p_expected(100, 70);
        assert_eq!(v.len(), 32);
        // Slot 0 was written at i = 0, 32, 64; slot 5 at 5, 37, 69; slot 6 at 6, 38.
        assert_eq!(v[0], 164);
        assert_eq!(v[5], 169);
        assert_eq!(v[6], 138);
        assert_eq!(v[31], 163);
        let short = p_expected(u32::MAX, 3);
        assert_eq!(&short[..4], &[u32::MAX, 0, 1, 0]);
    }

    #[test]
    fn g_kernel_reads_fresh_lines_and_is_replayed_exactly() {
        // Every read is a different 128-byte line until the 65536 lines are used up.
        let lines: std::collections::HashSet<usize> = (0..G_SLOTS).map(g_index).collect();
        assert_eq!(lines.len(), G_SLOTS);
        assert!(lines
            .iter()
            .all(|w| w % G_STRIDE == 0 && *w < G_SLOTS * G_STRIDE));
        let big: Vec<u32> = (0..(G_SLOTS * G_STRIDE) as u32).collect();
        assert_eq!(
            g_expected(&big, 3),
            (G_STEP * G_STRIDE + (2 * G_STEP % G_SLOTS) * G_STRIDE) as u64
        );
        assert_eq!(
            g_expected(&vec![u32::MAX; G_SLOTS * G_STRIDE], 64),
            64 * u32::MAX as u64
        );
        // The magic value shifts the next read by one word.
        let mut magic = big.clone();
        magic[0] = G_MAGIC;
        let shifted = G_MAGIC as u64
            + (G_STEP * G_STRIDE + 1) as u64
            + ((2 * G_STEP % G_SLOTS) * G_STRIDE) as u64;
        assert_eq!(g_expected(&magic, 3), shifted);
    }

    #[test]
    fn get_slots_stay_in_the_region_and_do_not_repeat_within_it() {
        // Small messages: 256-byte slots, every repetition of a test a new slot.
        let small = Slots::new(8, REGION);
        assert_eq!(small.slot_bytes, 256);
        assert_eq!(small.nslots, REGION / 256);
        assert_eq!(small.used_bytes(6600), 6600 * 256);
        let offsets: std::collections::HashSet<usize> =
            (0..6600).map(|r| small.offset(r)).collect();
        assert_eq!(offsets.len(), 6600);
        // Large messages wrap around a region larger than any L2, never past its end.
        let region = region_len(REGION);
        let big = Slots::new(40 << 20, region);
        assert_eq!((big.slot_bytes, big.nslots), (40 << 20, 3));
        assert_eq!(big.used_bytes(1000), 120 << 20);
        assert_eq!(big.offset(4), 40 << 20);
        assert!((0..1000).all(|r| big.offset(r) + (40 << 20) <= region));
        // A message as large as the buffer: one slot, rounded sizes still fit.
        let len = region_len((256 << 20) + 3);
        let whole = Slots::new((256 << 20) + 3, len);
        assert_eq!(whole.nslots, 1);
        assert!(whole.used_bytes(10) <= len);
    }

    #[test]
    fn fill_stream_offsets_match_the_whole_stream() {
        let k = data::key(9, &[1]);
        let whole = data::bytes(k, 3, 4096);
        assert_eq!(data::bytes_at(k, 3, 256, 100), whole[256..356].to_vec());
        assert_eq!(data::bytes_at(k, 3, 0, 13), whole[..13].to_vec());
    }

    #[test]
    fn kernel_warmup_is_a_tenth_at_least_one() {
        assert_eq!(inner_warmup(100), 10);
        assert_eq!(inner_warmup(5), 1);
    }

    #[test]
    fn scopes_pick_thread_counts() {
        assert_eq!(Scope::Thread.threads(512), 1);
        assert_eq!(Scope::Warp.threads(512), 32);
        assert_eq!(Scope::Block.threads(256), 256);
        assert_eq!(bw_variant(true, 8), "bidir ctas=8");
    }
}
