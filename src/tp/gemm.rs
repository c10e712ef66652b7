//! Local GEMMs: `y = x · wᵀ` with `x` (m × k), `w` (n × k, a linear layer's weight as
//! PyTorch stores it) and `y` (m × n), all row-major bf16, accumulated in f32 (split-K parts
//! too), by cuBLASLt, our decode kernel or our CUTLASS kernel ([`GemmPath`]).
//!
//! Row-major `y = x · wᵀ` is column-major `yᵀ = w · xᵀ` with the same memory: cuBLASLt's "TN"
//! case (A = w transposed, B = x), the layout its Hopper kernels favour.

use super::cutlass::{ChunkWait, CutlassGemm};
use crate::cubins::TP;
use crate::error::{CudaResultExt, Error, Result};
use crate::memory::{DeviceBuffer, DeviceSlice};
use crate::module::{grid, Function, KernelArgs, LaunchOptions, Module};
use crate::runtime::Nvshmem;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as ltsys;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use half::bf16;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Tokens up to which [`GemmPath::Auto`] may take our decode kernels (`decode_linear_bf16`
/// and `decode_linear16_bf16` in kernels/tp.cu, kernels/tp/decode.cuh) rather than cuBLASLt:
/// all they take. Which of the two runs depends on the GPU and the shape, so `Auto` takes the
/// one [`Gemm::calibrate`] measured faster (the layers calibrate when their weights are
/// loaded), and our decode kernel where nothing was measured. On H100s (`tp_mlp --test
/// gemm`, docs/gemm.md) the decode kernel was 1.00 to 1.14x cuBLASLt's speed from 1 to 8
/// tokens on the Llama-3 8B and 70B MLP shards of TP 2, and 0.95 to 1.12x from 9 to 16; on
/// an H200, where cuBLASLt streams large weights faster, 0.80 to 1.16x by shape.
pub const DECODE_TOKENS: usize = DECODE_MAX_TOKENS;
/// Tokens up to which [`Gemm::calibrate`] measures the candidates of cuBLASLt's heuristic
/// (at 1, 2, 4, ... tokens up to this) and [`GemmPath::CublasLt`] takes the fastest: a call
/// of `m` tokens takes the algorithm measured at the power of two at or above `m`. Its first
/// choice for few tokens is often not its fastest: on one H200 the best of its first 8 was
/// 1.03-1.10x faster for the Llama-3 70B down shard at 16 to 64 tokens, and up to 1.08x for
/// the 8B gate/up shard (docs/gemm.md); the heuristic is built for large products.
pub const TUNED_TOKENS: usize = 256;
/// The heuristic's candidates measured per token count.
const TUNE_CANDIDATES: usize = 8;
/// A candidate replaces the heuristic's first choice only where it measured at least this
/// much faster (2%: not noise).
const TUNE_MARGIN: f32 = 0.98;

/// The most tokens our decode kernel takes.
pub const DECODE_MAX_TOKENS: usize = 16;
/// Tokens up to which the first of our two decode kernels runs (`decode_linear_bf16`); the
/// second (`decode_linear16_bf16`, more registers and shared memory) takes the rest, so that
/// it costs the first nothing.
pub(crate) const DECODE_SMALL_TOKENS: usize = 8;

/// Which kernel computes a [`Gemm`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmPath {
    /// Up to [`DECODE_TOKENS`] tokens, our decode kernel or cuBLASLt, whichever
    /// [`Gemm::calibrate`] measured faster for these sizes on this GPU (our decode kernel
    /// where nothing was measured); cuBLASLt above. Our CUTLASS kernel measured 0.98 to
    /// 0.99x cuBLASLt's speed from 2048 tokens on one H100 (docs/gemm.md), and down to 0.38x with few tokens and 4096 output features
    /// (16 tiles of 128 tokens for 132 SMs, where cuBLASLt splits K), so `Auto` does not take
    /// it for a plain GEMM; it is the base of the fused kernels.
    #[default]
    Auto,
    /// cuBLASLt, whatever the shape, with the algorithm [`Gemm::calibrate`] measured fastest
    /// among its heuristic's candidates up to [`TUNED_TOKENS`] tokens (the heuristic's first
    /// choice elsewhere, and where nothing was measured).
    CublasLt,
    /// cuBLASLt with its heuristic's first choice, never a measured one: what cuBLAS alone
    /// runs, and the same algorithm, so the same bits, on every run with this cuBLASLt and GPU.
    CublasLtHeuristic,
    /// Our decode kernel: one pass over the weight at memory bandwidth, for up to
    /// [`DECODE_MAX_TOKENS`] tokens.
    Decode,
    /// Our CUTLASS kernel (TMA and WGMMA, persistent 128 × 256 tiles in clusters of two), on
    /// GPUs of compute capability 9.0 (it is built for `sm_90a`), for `k` and `y`'s row
    /// stride multiples of 8 and 16-byte aligned buffers (TMA's rules).
    Cutlass,
}

/// The workspace cuBLASLt may use per call: what its Hopper kernels ask for at most
/// (NVIDIA recommends 32 MiB on Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// The shape of one `y = x · wᵀ`: `m` rows (tokens), `n` output and `k` input features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinearShape {
    /// Rows of `x` and `y`.
    pub m: usize,
    /// Columns of `y`, rows of `w`.
    pub n: usize,
    /// Columns of `x` and `w`.
    pub k: usize,
}

impl LinearShape {
    /// Floating-point operations of the product (`2 m n k`).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// What a cached plan depends on besides the shape: the row stride of `y` and the
/// alignment every pointer has (cuBLASLt picks kernels that assume it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    shape: LinearShape,
    ldy: usize,
    align: u32,
    /// The heuristic's first choice, never a measured one.
    heuristic: bool,
}

/// The algorithm [`Gemm::calibrate`] measured fastest for a shape, and the pointer alignment
/// it was measured with (a call with less takes the heuristic's).
#[derive(Clone, Copy)]
struct Tuned {
    algo: ltsys::cublasLtMatmulAlgo_t,
    align: u32,
}

/// The descriptors and chosen algorithm of one key.
struct Plan {
    desc: ltsys::cublasLtMatmulDesc_t,
    w: ltsys::cublasLtMatrixLayout_t,
    x: ltsys::cublasLtMatrixLayout_t,
    y: ltsys::cublasLtMatrixLayout_t,
    algo: ltsys::cublasLtMatmulAlgo_t,
}

// SAFETY: the descriptors are immutable once made, and cuBLASLt reads them from any thread.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by `Gemm::plan`, destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.y);
            let _ = lt::destroy_matrix_layout(self.x);
            let _ = lt::destroy_matrix_layout(self.w);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn cublas(call: &'static str, e: lt::CublasError) -> Error {
    Error::Cublas {
        call,
        message: String::new(),
        source: Some(e),
    }
}

/// Blocks of the decode kernel per SM (256 threads at 94 registers, its launch bounds).
const DECODE_BLOCKS_PER_SM: u32 = 2;

/// Blocks of a decode GEMM of `n` output features (tasks of 16 features go round the grid):
/// as many tasks per block as `max` blocks would give the busiest one, and just enough blocks
/// for that, so that the tasks divide (nearly) evenly instead of a few blocks running a last
/// round alone (896 tasks: 224 blocks of 4, not 264 of which 104 take a fourth).
fn decode_grid(n: usize, max: u32) -> u32 {
    let tasks = n.div_ceil(16);
    let per_block = tasks.div_ceil(max.max(1) as usize);
    tasks.div_ceil(per_block.max(1)) as u32
}

/// [`Gemm::calibrate`]'s rounds per token count, and calls of each path per round: enough
/// for a few hundred microseconds a block, where CUDA events' half-microsecond resolution
/// and the launch gaps are small.
const CALIBRATION_ROUNDS: usize = 3;
const CALIBRATION_CALLS: usize = 5;
/// Copies of a weight [`Gemm::calibrate`] makes at most (`Gemm::weight_copies`).
const MAX_WEIGHT_COPIES: usize = 3;

/// The token counts [`Gemm::calibrate`] measures cuBLASLt's candidates at for layers of up
/// to `max_tokens` tokens: 1, 2, 4, ... up to the power of two at or above `max_tokens`,
/// [`TUNED_TOKENS`] at most.
fn tuned_counts(max_tokens: usize) -> impl Iterator<Item = usize> {
    let top = tuned_count_of(max_tokens.clamp(1, TUNED_TOKENS));
    std::iter::successors(Some(1usize), |m| Some(m * 2)).take_while(move |&m| m <= top)
}

/// The measured token count whose algorithm a call of `m` tokens (1 to [`TUNED_TOKENS`])
/// takes: the power of two at or above it.
fn tuned_count_of(m: usize) -> usize {
    m.next_power_of_two()
}

/// A weight and its copies, taken in turn.
struct Rotation {
    weights: Vec<u64>,
    next: std::cell::Cell<usize>,
}

impl Rotation {
    fn new(w: u64, copies: &[DeviceBuffer<bf16>]) -> Self {
        let mut weights = vec![w];
        weights.extend(copies.iter().map(|c| c.device_ptr()));
        Rotation {
            weights,
            next: std::cell::Cell::new(0),
        }
    }

    /// The next weight's address.
    fn next(&self) -> u64 {
        let i = self.next.get();
        self.next.set((i + 1) % self.weights.len());
        self.weights[i]
    }

    fn all(&self) -> impl Iterator<Item = u64> + '_ {
        self.weights.iter().copied()
    }
}

/// Blocks of calls on one stream between CUDA events, summed per (token count, way) once
/// the stream has run them: the ways of one token count take turns, in an order that
/// rotates from round to round, so that a drift of the clocks weighs on each alike.
pub(super) struct Stopwatch<'a> {
    shmem: &'a Nvshmem,
    blocks: Vec<((usize, usize), CudaEvent, CudaEvent)>,
}

impl<'a> Stopwatch<'a> {
    pub(super) fn new(shmem: &'a Nvshmem) -> Self {
        Stopwatch {
            shmem,
            blocks: Vec::new(),
        }
    }

    /// [`CALIBRATION_ROUNDS`] rounds of [`CALIBRATION_CALLS`] calls of each of `ways` ways
    /// (`call(way)` enqueues one on `stream`), for `m` tokens.
    pub(super) fn rounds(
        &mut self,
        m: usize,
        ways: usize,
        stream: &CudaStream,
        call: impl Fn(usize) -> Result<()>,
    ) -> Result<()> {
        let event = || {
            self.shmem
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)) // with timing
                .during("cuEventCreate")
        };
        for round in 0..CALIBRATION_ROUNDS {
            for i in 0..ways {
                let way = (i + round) % ways;
                let (start, end) = (event()?, event()?);
                start.record(stream).during("cuEventRecord")?;
                for _ in 0..CALIBRATION_CALLS {
                    call(way)?;
                }
                end.record(stream).during("cuEventRecord")?;
                self.blocks.push(((m, way), start, end));
            }
        }
        Ok(())
    }

    /// Milliseconds per (token count, way), once the stream has run every block.
    pub(super) fn totals(&self) -> Result<HashMap<(usize, usize), f32>> {
        let mut ms = HashMap::new();
        for (key, start, end) in &self.blocks {
            let t = start.elapsed_ms(end).during("cuEventElapsedTime")?;
            *ms.entry(*key).or_default() += t;
        }
        Ok(ms)
    }
}

/// The largest power of two (at most 256) that divides every address.
fn common_alignment(addresses: &[u64]) -> u32 {
    let bits = addresses.iter().fold(0u64, |acc, a| acc | a) | 256;
    1 << bits.trailing_zeros()
}

/// A cuBLASLt handle with its workspace and a plan per shape, for bf16 linear layers on
/// this PE's GPU. Plans are made on first use (a heuristic query, no GPU work), so a call
/// can be captured in a CUDA graph, and its first call should be made before timing.
/// Calls share the workspace: calls on streams that may run at the same time need a `Gemm`
/// each.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::{bf16, tp::{Gemm, LinearShape}};
/// let shmem = nvshmem::Nvshmem::init()?;
/// let gemm = Gemm::new(&shmem)?;
/// let shape = LinearShape { m: 16, n: 1024, k: 4096 };
/// let x = shmem.alloc_device::<bf16>(shape.m * shape.k)?;
/// let w = shmem.alloc_device::<bf16>(shape.n * shape.k)?;
/// let y = shmem.alloc_device::<bf16>(shape.m * shape.n)?;
/// gemm.linear(&y, &x, &w, shape, shmem.stream())?;
/// # Ok(()) }
/// ```
pub struct Gemm {
    shmem: Nvshmem,
    handle: ltsys::cublasLtHandle_t,
    workspace: DeviceBuffer<u8>,
    plans: Mutex<HashMap<Key, Arc<Plan>>>,
    /// Our decode kernels: up to 8 tokens, and 9 to 16.
    decode: [Function; 2],
    /// Blocks of the decode kernel resident at once on this GPU.
    decode_blocks: u32,
    /// Our CUTLASS kernel, or why it cannot run here.
    cutlass: std::result::Result<CutlassGemm, String>,
    /// What [`GemmPath::Auto`] takes up to [`DECODE_TOKENS`] tokens, by `(m, n, k)`, where
    /// [`Gemm::calibrate`] measured it.
    decode_choice: Mutex<HashMap<(usize, usize, usize), GemmPath>>,
    /// cuBLASLt's fastest measured algorithm by `(m, n, k)`, `m` a power of two up to
    /// [`TUNED_TOKENS`].
    tuned: Mutex<HashMap<(usize, usize, usize), Tuned>>,
}

// SAFETY: a cuBLASLt handle may be used from any thread (it holds no per-call state; calls
// on one handle from several threads are allowed); plans are immutable once made and shared
// behind a lock.
unsafe impl Send for Gemm {}
unsafe impl Sync for Gemm {}

impl Drop for Gemm {
    fn drop(&mut self) {
        // Calls may still run: the plans and workspace go after the GPU is idle.
        let _ = self.shmem.quiesce();
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

impl Gemm {
    /// Load cuBLASLt and make a handle and a workspace on this PE's GPU.
    pub fn new(shmem: &Nvshmem) -> Result<Self> {
        Self::with_module(shmem, &Module::load(shmem, &TP)?)
    }

    /// [`new`](Self::new) with the decode kernel from `tp`, the tensor-parallel cubin already
    /// loaded (the layers load it once for all their kernels).
    pub(crate) fn with_module(shmem: &Nvshmem, tp: &Module) -> Result<Self> {
        // SAFETY: only tries to open the library.
        if !unsafe { ltsys::is_culib_present() } {
            return Err(Error::Cublas {
                call: "load",
                message: "libcublasLt.so.13 was not found: run `make setup` (installs the pinned \
                          nvidia-cublas wheel) and launch through scripts/nvshmrun or nvshmemrun, \
                          or add the folder holding libcublasLt.so.13 to LD_LIBRARY_PATH"
                    .into(),
                source: None,
            });
        }
        shmem.bind_context()?;
        let decode = [
            tp.function("decode_linear_bf16")?,
            tp.function("decode_linear16_bf16")?,
        ];
        let sms = shmem.sm_count()?;
        let handle = lt::create_handle().map_err(|e| cublas("cublasLtCreate", e))?;
        let workspace = match shmem.alloc_device::<u8>(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: just created.
                unsafe {
                    let _ = lt::destroy_handle(handle);
                }
                return Err(e);
            }
        };
        Ok(Gemm {
            shmem: shmem.clone(),
            handle,
            workspace,
            plans: Mutex::new(HashMap::new()),
            decode,
            decode_blocks: sms * DECODE_BLOCKS_PER_SM,
            cutlass: CutlassGemm::load(shmem).map_err(|e| e.to_string()),
            decode_choice: Mutex::new(HashMap::new()),
            tuned: Mutex::new(HashMap::new()),
        })
    }

    /// Measures, for this `w` (`n × k`) on this GPU:
    /// - which of cuBLASLt's candidate algorithms (the first 8 of its
    ///   heuristic) is fastest at 1, 2, 4, ... tokens, up to the power of two at or above
    ///   `max_tokens` and at most [`TUNED_TOKENS`]; [`GemmPath::CublasLt`] takes it from then on
    ///   (up to the next power of two), where it beat the heuristic's first choice by 2%;
    /// - then which of our decode kernel and cuBLASLt computes `x · wᵀ` faster for each token
    ///   count from 1 to `max_tokens` (at most [`DECODE_TOKENS`]), and has [`GemmPath::Auto`]
    ///   take the faster for those sizes. Which is faster depends on the GPU: on H100s our
    ///   decode kernel mostly is, on an H200 cuBLASLt mostly is (docs/gemm.md).
    ///
    /// Sizes measured before are skipped. Which algorithm wins can differ between runs where
    /// two are close, and with it the low bits of the results: [`GemmPath::CublasLtHeuristic`]
    /// and [`set_auto_path`](Self::set_auto_path) fix them.
    ///
    /// Each measurement reads the weight from memory, as a model's calls do (other layers'
    /// weights pass through L2 between two calls of one): calls take copies of `w` in turn,
    /// as many as make twice the L2's size (at most 3, none for a weight that large, fewer
    /// where memory is short), kept only while it runs.
    ///
    /// The layers call it when their weights are loaded. It runs on the runtime's stream and
    /// waits for it: about 15 calls of each candidate per power of two and 30 of each path
    /// per token count up to 16; on one H200, 0.38 s for the Llama-3 70B MLP shard of TP 2
    /// up to 128 tokens, 0.18 s for the 8B one.
    /// Work on the GPU at the same time skews the measurement, and a call of this `Gemm` on
    /// another stream at the same time would share cuBLASLt's workspace: calibrate while no
    /// other call of it runs.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{bf16, tp::{Gemm, GemmPath, LinearShape}};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let gemm = Gemm::new(&shmem)?;
    /// let (n, k) = (14336, 4096);
    /// let w = shmem.alloc_device::<bf16>(n * k)?;
    /// gemm.calibrate(&w, n, k, 16)?;
    /// let path = gemm.auto_path(LinearShape { m: 8, n, k }); // Decode or CublasLt
    /// # Ok(()) }
    /// ```
    pub fn calibrate(
        &self,
        w: &impl DeviceSlice<bf16>,
        n: usize,
        k: usize,
        max_tokens: usize,
    ) -> Result<()> {
        if w.len() != n * k {
            return Err(Error::Length {
                what: "the GEMM weight w (n × k)",
                expected: n * k,
                got: w.len(),
            });
        }
        if n == 0 || k == 0 {
            return Ok(());
        }
        self.tune(w.device_ptr(), n, k, max_tokens)?;
        let todo: Vec<usize> = {
            let known = self.decode_choice.lock().unwrap_or_else(|e| e.into_inner());
            (1..=max_tokens.min(DECODE_TOKENS))
                .filter(|&m| !known.contains_key(&(m, n, k)))
                .collect()
        };
        let Some(&most) = todo.last() else {
            return Ok(());
        };
        let (x, y) = self.calibration_inputs(most, n, k)?;
        let stream = self.shmem.stream();
        let copies = self.weight_copies(w.device_ptr(), n * k)?;
        let weights = Rotation::new(w.device_ptr(), &copies);
        let paths = [GemmPath::Decode, GemmPath::CublasLt];
        let mut watch = Stopwatch::new(&self.shmem);
        let enqueued = todo.iter().try_for_each(|&m| -> Result<()> {
            let shape = LinearShape { m, n, k };
            let (x, y) = (x.device_ptr(), y.device_ptr());
            let call = |which: usize| {
                let w = weights.next();
                // SAFETY: x holds m × k, w n × k and y m × n elements of this GPU (m <= most,
                // and m <= DECODE_TOKENS for the decode kernel).
                unsafe {
                    match paths[which] {
                        GemmPath::Decode => self.decode(y, n, x, w, shape, false, stream),
                        path => self.linear_path(y, n, x, w, shape, path, stream),
                    }
                }
            };
            (0..paths.len()).try_for_each(call)?; // warm-up, and cuBLASLt's plan
            watch.rounds(m, paths.len(), stream, call)
        });
        // One wait at the end, also after a failure (x and y must outlive what was enqueued).
        stream.synchronize().during("cuStreamSynchronize")?;
        enqueued?;
        let ms = watch.totals()?;
        let mut known = self.decode_choice.lock().unwrap_or_else(|e| e.into_inner());
        for &m in &todo {
            let (decode, cublas) = (ms[&(m, 0)], ms[&(m, 1)]);
            let faster = if cublas < decode { paths[1] } else { paths[0] };
            known.insert((m, n, k), faster);
        }
        Ok(())
    }

    /// [`calibrate`](Self::calibrate)'s first part: cuBLASLt's candidates for `w` (`n × k`,
    /// both not 0) at every power of two of tokens up to `max_tokens`' (at most
    /// [`TUNED_TOKENS`]) not measured before.
    fn tune(&self, w: u64, n: usize, k: usize, max_tokens: usize) -> Result<()> {
        let todo: Vec<usize> = {
            let tuned = self.tuned.lock().unwrap_or_else(|e| e.into_inner());
            tuned_counts(max_tokens)
                .filter(|&m| !tuned.contains_key(&(m, n, k)))
                .collect()
        };
        let Some(&most) = todo.last() else {
            return Ok(());
        };
        let (x, y) = self.calibration_inputs(most, n, k)?;
        let (x, y) = (x.device_ptr(), y.device_ptr());
        let copies = self.weight_copies(w, n * k)?;
        let weights = Rotation::new(w, &copies);
        let bf = std::mem::size_of::<bf16>();
        let mut addresses = vec![y, x, (n * bf) as u64, (k * bf) as u64];
        addresses.extend(weights.all());
        let align = common_alignment(&addresses);
        self.shmem.bind_context()?;
        let stream = self.shmem.stream();
        let mut watch = Stopwatch::new(&self.shmem);
        // Per token count: the plan (its first choice) and the candidates that ran.
        let mut tried = Vec::new();
        let enqueued = todo.iter().try_for_each(|&m| -> Result<()> {
            let key = Key {
                shape: LinearShape { m, n, k },
                ldy: n,
                align,
                heuristic: true,
            };
            let (plan, candidates) = self.make_plan(key, TUNE_CANDIDATES)?;
            // SAFETY: x holds m × k, w n × k and y m × n elements of this GPU (m <= most).
            let call = |algo: &ltsys::cublasLtMatmulAlgo_t| unsafe {
                self.matmul(&plan, algo, y, x, weights.next(), stream)
            };
            // A candidate that cannot run this call (cuBLASLt says so) is left out.
            let runs: Vec<_> = candidates.into_iter().filter(|a| call(a).is_ok()).collect();
            let timed = watch.rounds(m, runs.len(), stream, |i| call(&runs[i]));
            tried.push((m, plan, runs));
            timed
        });
        stream.synchronize().during("cuStreamSynchronize")?;
        enqueued?;
        let ms = watch.totals()?;
        let mut tuned = self.tuned.lock().unwrap_or_else(|e| e.into_inner());
        for (m, plan, runs) in &tried {
            let time = |i: usize| ms.get(&(*m, i)).copied().unwrap_or(f32::INFINITY);
            let first = runs.iter().position(|a| a.data == plan.algo.data);
            let first_time = first.map_or(f32::INFINITY, time);
            let fastest = (0..runs.len()).min_by(|&a, &b| time(a).total_cmp(&time(b)));
            let algo = match fastest {
                Some(i) if time(i) < TUNE_MARGIN * first_time => runs[i],
                _ => plan.algo,
            };
            tuned.insert((*m, n, k), Tuned { algo, align });
        }
        drop(tuned);
        // Plans of this shape made before take the measured algorithms from now on.
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.retain(|key, _| key.heuristic || (key.shape.n, key.shape.k) != (n, k));
        Ok(())
    }

    /// Copies of the weight at `w` (`len` elements) for calibration to take in turn, so that
    /// each call reads its weight from memory, as in a model where other layers' weights
    /// pass through L2 between two calls of one: as many as make twice the L2's size, at most
    /// 3 (none for a weight that large), and fewer where the GPU has no room for them (a
    /// model that fills its memory still loads; its calls then read more from L2).
    fn weight_copies(&self, w: u64, len: usize) -> Result<Vec<DeviceBuffer<bf16>>> {
        let bytes = len * std::mem::size_of::<bf16>();
        let wanted = (2 * self.shmem.l2_bytes()?).div_ceil(bytes.max(1));
        let stream = self.shmem.stream();
        let mut copies = Vec::new();
        for _ in 1..wanted.min(1 + MAX_WEIGHT_COPIES) {
            let Ok(copy) = self.shmem.alloc_device::<bf16>(len) else {
                break;
            };
            // SAFETY: both hold `len` elements of this GPU; the stream orders the copy before
            // the calls that read it.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    copy.device_ptr(),
                    w,
                    bytes,
                    stream.cu_stream(),
                )
            }
            .during("cuMemcpyDtoDAsync")?;
            copies.push(copy);
        }
        Ok(copies)
    }

    /// Inputs for measuring `most × k` by `n × k` products: `x` of a fixed pseudo-random
    /// pattern in [-1, 1) (no zeros, which draw less power) and room for `y`.
    fn calibration_inputs(
        &self,
        most: usize,
        n: usize,
        k: usize,
    ) -> Result<(DeviceBuffer<bf16>, DeviceBuffer<bf16>)> {
        let pattern: Vec<bf16> = (0..most * k)
            .map(|i| {
                let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
                bf16::from_f32(h as f32 / (1u64 << 23) as f32 - 1.0)
            })
            .collect();
        let x = self.shmem.alloc_device::<bf16>(most * k)?;
        x.copy_from_host(&pattern)?;
        let y = self.shmem.alloc_device::<bf16>(most * n)?;
        Ok((x, y))
    }

    /// Has [`GemmPath::Auto`] take `path` for `shape` (up to [`DECODE_TOKENS`] tokens, our
    /// decode kernel or cuBLASLt) whatever [`calibrate`](Self::calibrate) measured or will
    /// measure: for the same path on every GPU, or the same bits as another program.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::tp::{Gemm, GemmPath, LinearShape};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let gemm = Gemm::new(&shmem)?;
    /// for m in 1..=16 {
    ///     gemm.set_auto_path(LinearShape { m, n: 14336, k: 4096 }, GemmPath::Decode)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn set_auto_path(&self, shape: LinearShape, path: GemmPath) -> Result<()> {
        let LinearShape { m, n, k } = shape;
        if m == 0 || m > DECODE_TOKENS {
            return Err(Error::InvalidArgument(format!(
                "GemmPath::Auto chooses between paths from 1 to {DECODE_TOKENS} tokens, not {m}; \
                 above it takes cuBLASLt (pass a GemmPath to linear_with for another)"
            )));
        }
        if !matches!(path, GemmPath::Decode | GemmPath::CublasLt) {
            return Err(Error::InvalidArgument(format!(
                "GemmPath::Auto takes our decode kernel or cuBLASLt up to {DECODE_TOKENS} \
                 tokens, not {path:?}"
            )));
        }
        let mut known = self.decode_choice.lock().unwrap_or_else(|e| e.into_inner());
        known.insert((m, n, k), path);
        Ok(())
    }

    /// The path [`GemmPath::Auto`] takes for `shape` (see [`calibrate`](Self::calibrate)).
    pub fn auto_path(&self, shape: LinearShape) -> GemmPath {
        let LinearShape { m, n, k } = shape;
        if m > DECODE_TOKENS {
            return GemmPath::CublasLt;
        }
        let known = self.decode_choice.lock().unwrap_or_else(|e| e.into_inner());
        known.get(&(m, n, k)).copied().unwrap_or(GemmPath::Decode)
    }

    /// `y = x · wᵀ` on `stream`: `x` is `m × k`, `w` is `n × k` and `y` is `m × n`, row-major,
    /// each exactly that long. Nothing is launched when `m` is 0.
    pub fn linear(
        &self,
        y: &impl DeviceSlice<bf16>,
        x: &impl DeviceSlice<bf16>,
        w: &impl DeviceSlice<bf16>,
        shape: LinearShape,
        stream: &CudaStream,
    ) -> Result<()> {
        self.linear_with(y, x, w, shape, GemmPath::Auto, stream)
    }

    /// Whether [`GemmPath::Cutlass`] runs on this GPU, or why not (a GPU other than compute
    /// capability 9.0, a crate built without sm_90, an MPS share too small for a cluster).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{bf16, tp::{Gemm, GemmPath, LinearShape}};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let gemm = Gemm::new(&shmem)?;
    /// let shape = LinearShape { m: 4096, n: 14336, k: 4096 };
    /// let x = shmem.alloc_device::<bf16>(shape.m * shape.k)?;
    /// let w = shmem.alloc_device::<bf16>(shape.n * shape.k)?;
    /// let y = shmem.alloc_device::<bf16>(shape.m * shape.n)?;
    /// let path = match gemm.cutlass_available() {
    ///     Ok(()) => GemmPath::Cutlass,
    ///     Err(why) => {
    ///         eprintln!("cuBLASLt instead: {why}");
    ///         GemmPath::CublasLt
    ///     }
    /// };
    /// gemm.linear_with(&y, &x, &w, shape, path, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn cutlass_available(&self) -> std::result::Result<(), String> {
        self.cutlass.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// [`linear`](Self::linear) computed by `path`.
    pub fn linear_with(
        &self,
        y: &impl DeviceSlice<bf16>,
        x: &impl DeviceSlice<bf16>,
        w: &impl DeviceSlice<bf16>,
        shape: LinearShape,
        path: GemmPath,
        stream: &CudaStream,
    ) -> Result<()> {
        let LinearShape { m, n, k } = shape;
        for (what, got, want) in [
            ("the GEMM input x (m × k)", x.len(), m * k),
            ("the GEMM weight w (n × k)", w.len(), n * k),
            ("the GEMM output y (m × n)", y.len(), m * n),
        ] {
            if got != want {
                return Err(Error::Length {
                    what,
                    expected: want,
                    got,
                });
            }
        }
        // SAFETY: the lengths were checked against the shape, and the slices are device
        // memory of this PE.
        unsafe {
            self.linear_path(
                y.device_ptr(),
                n,
                x.device_ptr(),
                w.device_ptr(),
                shape,
                path,
                stream,
            )
        }
    }

    /// `y = x · wᵀ` with `y`'s rows `ldy` elements apart (`ldy >= n`), for a product that
    /// fills some of `y`'s columns.
    ///
    /// # Safety
    /// `x` must hold `m × k`, `w` `n × k` and `y` `(m - 1) × ldy + n` elements of this PE's
    /// GPU, valid until the call has run on `stream`.
    pub(crate) unsafe fn linear_raw(
        &self,
        y: u64,
        ldy: usize,
        x: u64,
        w: u64,
        shape: LinearShape,
        stream: &CudaStream,
    ) -> Result<()> {
        self.linear_path(y, ldy, x, w, shape, GemmPath::Auto, stream)
    }

    /// [`linear_raw`](Self::linear_raw) by our CUTLASS kernel, each tile first waiting for
    /// its rows of `x` as `wait` says. `Ok(false)`, with nothing launched, where that kernel
    /// cannot run here or take the call (the caller then waits for all of `x` and
    /// multiplies by another path).
    ///
    /// # Safety
    /// As for [`linear_raw`](Self::linear_raw), and `wait`'s flags must be set by work that
    /// needs no SM of this GPU (the waiting kernel may hold them all).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn linear_waiting(
        &self,
        y: u64,
        ldy: usize,
        x: u64,
        w: u64,
        shape: LinearShape,
        wait: ChunkWait,
        stream: &CudaStream,
    ) -> Result<bool> {
        let LinearShape { m, n, k } = shape;
        let Ok(cutlass) = self.cutlass.as_ref() else {
            return Ok(false);
        };
        if n == 0 || k == 0 || ldy < n || !cutlass.takes(y, ldy, x, w, (m, n, k)) {
            return Ok(false);
        }
        if m > 0 {
            self.shmem.bind_context()?;
            cutlass.linear(y, ldy, x, w, (m, n, k), Some(wait), stream)?;
        }
        Ok(true)
    }

    /// [`linear_raw`](Self::linear_raw) computed by `path`.
    ///
    /// # Safety
    /// As for [`linear_raw`](Self::linear_raw).
    #[allow(clippy::too_many_arguments)]
    unsafe fn linear_path(
        &self,
        y: u64,
        ldy: usize,
        x: u64,
        w: u64,
        shape: LinearShape,
        path: GemmPath,
        stream: &CudaStream,
    ) -> Result<()> {
        let LinearShape { m, n, k } = shape;
        if n == 0 || k == 0 {
            return Err(Error::InvalidArgument(format!(
                "a GEMM of {m} × {k} by {k} × {n}: a linear layer needs input and output features"
            )));
        }
        if ldy < n {
            return Err(Error::InvalidArgument(format!(
                "the GEMM output's rows are {ldy} elements apart, fewer than its {n} columns"
            )));
        }
        if m == 0 {
            return Ok(());
        }
        let path = match path {
            GemmPath::Auto => self.auto_path(shape),
            GemmPath::Decode if m > DECODE_MAX_TOKENS => {
                return Err(Error::InvalidArgument(format!(
                    "the decode GEMM takes up to {DECODE_MAX_TOKENS} tokens, not {m}: use \
                     GemmPath::Auto or CublasLt"
                )))
            }
            other => other,
        };
        if path == GemmPath::Cutlass {
            let cutlass = self.cutlass.as_ref().map_err(|why| {
                Error::InvalidArgument(format!(
                    "our CUTLASS GEMM cannot run here: {why}. Use GemmPath::Auto or CublasLt"
                ))
            })?;
            self.shmem.bind_context()?;
            return cutlass.linear(y, ldy, x, w, (m, n, k), None, stream);
        }
        if path == GemmPath::Decode {
            return self.decode(y, ldy, x, w, shape, true, stream);
        }
        let key = Key {
            shape,
            ldy,
            align: common_alignment(&[
                y,
                x,
                w,
                (ldy * std::mem::size_of::<bf16>()) as u64,
                (k * std::mem::size_of::<bf16>()) as u64,
            ]),
            heuristic: path == GemmPath::CublasLtHeuristic,
        };
        // The heuristic query and the call both need this PE's context current.
        self.shmem.bind_context()?;
        let plan = self.plan(key)?;
        self.matmul(&plan, &plan.algo, y, x, w, stream)
    }

    /// cuBLASLt's `y = x · wᵀ` by `plan`'s descriptors with `algo`.
    ///
    /// # Safety
    /// As for [`linear_raw`](Self::linear_raw), with `plan` made for the call's shape,
    /// row stride and alignment, and this PE's context current.
    unsafe fn matmul(
        &self,
        plan: &Plan,
        algo: &ltsys::cublasLtMatmulAlgo_t,
        y: u64,
        x: u64,
        w: u64,
        stream: &CudaStream,
    ) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        lt::matmul(
            self.handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            w as *const c_void,
            plan.w,
            x as *const c_void,
            plan.x,
            y as *const c_void,
            plan.y,
            y as *mut c_void,
            plan.y,
            algo,
            self.workspace.device_ptr() as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as ltsys::cudaStream_t,
        )
        .map_err(|e| cublas("cublasLtMatmul", e))
    }

    /// Our decode kernel on `shape` (at most [`DECODE_MAX_TOKENS`] tokens, checked by the
    /// caller). `programmatic`: launched so that its blocks may start while the kernel before
    /// it on the stream finishes, and wait for it (decode_enter in kernels/tp/decode.cuh);
    /// [`calibrate`](Self::calibrate) launches without, so that its back-to-back calls of one
    /// kernel are timed as cuBLASLt's are, each after the one before has ended.
    ///
    /// # Safety
    /// As for [`linear_raw`](Self::linear_raw).
    #[allow(clippy::too_many_arguments)]
    unsafe fn decode(
        &self,
        y: u64,
        ldy: usize,
        x: u64,
        w: u64,
        shape: LinearShape,
        programmatic: bool,
        stream: &CudaStream,
    ) -> Result<()> {
        let LinearShape { m, n, k } = shape;
        self.shmem.bind_context()?;
        let mut args = KernelArgs::new();
        args.device_ptr(x)
            .device_ptr(w)
            .device_ptr(y)
            .value(m as u64)
            .value(n as u64)
            .value(k as u64)
            .value(ldy as u64);
        let kernel = &self.decode[usize::from(m > DECODE_SMALL_TOKENS)];
        let options = LaunchOptions {
            programmatic,
            ..LaunchOptions::default()
        };
        let cfg = grid(decode_grid(n, self.decode_blocks), 256);
        kernel.launch_with(cfg, options, stream, &mut args)
    }

    /// The plan of `key`, made on first use.
    fn plan(&self, key: Key) -> Result<Arc<Plan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(&key) {
            return Ok(p.clone());
        }
        let (mut plan, _) = self.make_plan(key, 1)?;
        if let Some(tuned) = self.tuned_for(key) {
            // SAFETY: live descriptors.
            if unsafe { self.fits(&plan, &tuned) } {
                plan.algo = tuned;
            }
        }
        let plan = Arc::new(plan);
        plans.insert(key, plan.clone());
        Ok(plan)
    }

    /// The algorithm [`calibrate`](Self::calibrate) measured for `key`'s shape (at the power
    /// of two at or above its tokens), where one was and `key`'s pointers are as aligned.
    fn tuned_for(&self, key: Key) -> Option<ltsys::cublasLtMatmulAlgo_t> {
        let LinearShape { m, n, k } = key.shape;
        if key.heuristic || m > TUNED_TOKENS {
            return None;
        }
        let tuned = self.tuned.lock().unwrap_or_else(|e| e.into_inner());
        let t = tuned.get(&(tuned_count_of(m), n, k))?;
        (t.align <= key.align).then_some(t.algo)
    }

    /// Whether cuBLASLt takes `algo` for `plan`'s descriptors within the workspace.
    ///
    /// # Safety
    /// Live descriptors.
    unsafe fn fits(&self, plan: &Plan, algo: &ltsys::cublasLtMatmulAlgo_t) -> bool {
        let mut result = std::mem::MaybeUninit::<ltsys::cublasLtMatmulHeuristicResult_t>::uninit();
        let status = ltsys::cublasLtMatmulAlgoCheck(
            self.handle,
            plan.desc,
            plan.w,
            plan.x,
            plan.y,
            plan.y,
            algo,
            result.as_mut_ptr(),
        );
        // SAFETY: written where the check succeeds.
        status.result().is_ok() && result.assume_init().workspaceSize <= WORKSPACE_BYTES
    }

    /// The descriptors of `key` with the heuristic's first choice, and its first `count`
    /// candidates (at least one).
    fn make_plan(
        &self,
        key: Key,
        count: usize,
    ) -> Result<(Plan, Vec<ltsys::cublasLtMatmulAlgo_t>)> {
        let LinearShape { m, n, k } = key.shape;
        let bf = ltsys::cudaDataType_t::CUDA_R_16BF;
        let desc = lt::create_matmul_desc(
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(|e| cublas("cublasLtMatmulDescCreate", e))?;
        // From here on `plan` owns what is made, and frees it on an early return.
        let mut plan = Plan {
            desc,
            w: std::ptr::null_mut(),
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            algo: ltsys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        let layout = |rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(bf, rows as u64, cols as u64, ld as i64)
                .map_err(|e| cublas("cublasLtMatrixLayoutCreate", e))
        };
        // Column-major views of the row-major buffers: w is k × n, x is k × m, y is n × m.
        plan.w = layout(k, n, k)?;
        plan.x = layout(k, m, k)?;
        plan.y = layout(n, m, key.ldy)?;
        // cublasOperation_t (cuBLAS's header, not cuBLASLt's): CUBLAS_OP_T is 1.
        let transpose: i32 = 1;
        // SAFETY: live descriptors; the attribute values outlive the calls.
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &transpose as *const _ as *const c_void,
                std::mem::size_of_val(&transpose),
            )
            .map_err(|e| cublas("cublasLtMatmulDescSetAttribute", e))?;
            let pref = lt::create_matmul_pref()
                .map_err(|e| cublas("cublasLtMatmulPreferenceCreate", e))?;
            let chosen = self.candidates(&plan, pref, key, count);
            let _ = lt::destroy_matmul_pref(pref);
            let candidates = chosen?;
            plan.algo = candidates[0];
            Ok((plan, candidates))
        }
    }

    /// cuBLASLt's first `count` choices for `plan` under `key`'s workspace and alignment, best
    /// first (at least one).
    ///
    /// # Safety
    /// Live descriptors.
    unsafe fn candidates(
        &self,
        plan: &Plan,
        pref: ltsys::cublasLtMatmulPreference_t,
        key: Key,
        count: usize,
    ) -> Result<Vec<ltsys::cublasLtMatmulAlgo_t>> {
        use ltsys::cublasLtMatmulPreferenceAttributes_t as P;
        let set = |attr: P, value: u64| {
            lt::set_matmul_pref_attribute(
                pref,
                attr,
                &value as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            )
            .map_err(|e| cublas("cublasLtMatmulPreferenceSetAttribute", e))
        };
        set(
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            WORKSPACE_BYTES as u64,
        )?;
        let align = |attr: P| {
            lt::set_matmul_pref_attribute(
                pref,
                attr,
                &key.align as *const u32 as *const c_void,
                std::mem::size_of::<u32>(),
            )
            .map_err(|e| cublas("cublasLtMatmulPreferenceSetAttribute", e))
        };
        align(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES)?;
        align(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES)?;
        align(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES)?;
        align(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)?;
        // Split-K parts summed in f32 only. cuBLASLt may otherwise add them up in the output
        // (bf16), rounding every partial sum: seen at m = 16, n = 48, k = 9, where 29% of the
        // outputs came out one or two bf16 steps off the f32-accumulated product.
        let scheme =
            ltsys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
        lt::set_matmul_pref_attribute(
            pref,
            P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
            &scheme as *const u32 as *const c_void,
            std::mem::size_of::<u32>(),
        )
        .map_err(|e| cublas("cublasLtMatmulPreferenceSetAttribute", e))?;
        let LinearShape { m, n, k } = key.shape;
        let mut results =
            vec![std::mem::zeroed::<ltsys::cublasLtMatmulHeuristicResult_t>(); count.max(1)];
        let mut found = 0;
        let status = ltsys::cublasLtMatmulAlgoGetHeuristic(
            self.handle,
            plan.desc,
            plan.w,
            plan.x,
            plan.y,
            plan.y,
            pref,
            results.len() as i32,
            results.as_mut_ptr(),
            &mut found,
        )
        .result();
        let found = found.clamp(0, results.len() as i32) as usize;
        match status {
            Ok(()) if found > 0 => Ok(results[..found].iter().map(|r| r.algo).collect()),
            failed => Err(Error::Cublas {
                call: "cublasLtMatmulAlgoGetHeuristic",
                message: format!(
                    "no bf16 algorithm for y ({m} × {n}, rows {} apart) = x ({m} × {k}) · wᵀ with \
                 {}-byte aligned pointers",
                    key.ldy, key.align
                ),
                source: failed.err(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuned_token_counts_are_the_powers_of_two_that_cover_the_layer() {
        let counts = |max: usize| tuned_counts(max).collect::<Vec<_>>();
        assert_eq!(counts(1), [1]);
        assert_eq!(counts(16), [1, 2, 4, 8, 16]);
        // 100 tokens take 128's algorithm: 128 is measured.
        assert_eq!(counts(100), [1, 2, 4, 8, 16, 32, 64, 128]);
        assert_eq!(counts(100_000).last(), Some(&TUNED_TOKENS));
        assert_eq!(counts(0), [1]);
        // Every call up to the layer's tokens finds its measured count among them.
        for max in [1, 3, 17, 100, 128, 200, 256, 300] {
            for m in 1..=max.min(TUNED_TOKENS) {
                let at = tuned_count_of(m);
                assert!(
                    at >= m && at < 2 * m && counts(max).contains(&at),
                    "{m} of {max}"
                );
            }
        }
    }

    #[test]
    fn decode_grid_gives_every_block_the_same_tasks() {
        // The Llama-3 shards at TP 2 on 132 SMs (264 blocks at most).
        assert_eq!(decode_grid(14336, 264), 224); // 896 tasks, 4 a block
        assert_eq!(decode_grid(4096, 264), 256); // one a block
        assert_eq!(decode_grid(28672, 264), 256); // 1792 tasks, 7 a block
        assert_eq!(decode_grid(8192, 264), 256); // 2 a block
        assert_eq!(decode_grid(1, 264), 1);
        for n in 1usize..3000 {
            for max in [1, 7, 132, 264] {
                let (tasks, blocks) = (n.div_ceil(16), decode_grid(n, max) as usize);
                assert!(
                    (1..=max as usize).contains(&blocks) && blocks <= tasks,
                    "{n} {max}"
                );
                // No block takes more tasks than with `max` blocks, and every block works.
                assert_eq!(
                    tasks.div_ceil(blocks),
                    tasks.div_ceil(max as usize),
                    "{n} {max}"
                );
                assert!((blocks - 1) * tasks.div_ceil(blocks) < tasks, "{n} {max}");
            }
        }
    }

    #[test]
    fn alignment_is_the_largest_common_power_of_two() {
        assert_eq!(common_alignment(&[0x1000, 0x2000]), 256);
        assert_eq!(common_alignment(&[0x1000, 0x1002]), 2);
        assert_eq!(common_alignment(&[0x1010, 0x20, 8192]), 16);
        assert_eq!(common_alignment(&[0]), 256);
    }

    #[test]
    fn flops_count_multiply_and_add() {
        assert_eq!(LinearShape { m: 2, n: 3, k: 4 }.flops(), 48.0);
    }
}
