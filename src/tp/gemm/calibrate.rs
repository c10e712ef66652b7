//! Measuring on this GPU what [`GemmPath::Auto`] takes: cuBLASLt's fastest candidate
//! algorithm for few tokens, and where our decode kernel beats cuBLASLt.

use super::plan::{common_alignment, Key, Product, Tuned};
use super::{Gemm, GemmPath, LinearShape, Operands, DECODE_MAX_TOKENS};
use crate::error::{CudaResultExt, Error, Result};
use crate::memory::{DeviceBuffer, DeviceMemory};
use crate::runtime::Nvshmem;
use cudarc::cublaslt::sys as ltsys;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use half::bf16;
use std::collections::HashMap;
use std::sync::Arc;

/// Tokens up to which [`Gemm::calibrate`] measures the candidates of cuBLASLt's heuristic
/// (at 1, 2, 4, ... tokens) and [`GemmPath::CublasLt`] takes the fastest: a call of `m`
/// tokens takes the algorithm measured at the power of two at or above `m`. The heuristic
/// is built for large products; for few tokens its first choice is often not its fastest.
pub const TUNED_TOKENS: usize = 256;

/// The heuristic's candidates measured per token count, and how much faster one must be to
/// replace its first choice (2%: not noise).
const TUNE_CANDIDATES: usize = 8;
const TUNE_MARGIN: f32 = 0.98;

/// Rounds per token count, and calls of each way per round: a few hundred microseconds a
/// block, where CUDA events' resolution and the launch gaps are small.
const CALIBRATION_ROUNDS: usize = 3;
const CALIBRATION_CALLS: usize = 5;

/// Copies of a weight [`Gemm::calibrate`] makes at most.
const MAX_WEIGHT_COPIES: usize = 3;

/// The token counts [`Gemm::calibrate`] measures cuBLASLt's candidates at for layers of up
/// to `max_tokens` tokens: 1, 2, 4, ... up to the power of two at or above `max_tokens`,
/// [`TUNED_TOKENS`] at most.
pub(super) fn tuned_counts(max_tokens: usize) -> impl Iterator<Item = usize> {
    let top = tuned_count_of(max_tokens.clamp(1, TUNED_TOKENS));
    std::iter::successors(Some(1usize), |m| Some(m * 2)).take_while(move |&m| m <= top)
}

/// The measured token count whose algorithm a call of `m` tokens (1 to [`TUNED_TOKENS`])
/// takes: the power of two at or above it.
pub(super) fn tuned_count_of(m: usize) -> usize {
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
        weights.extend(copies.iter().map(|c| c.addr()));
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
pub(crate) struct Stopwatch<'a> {
    shmem: &'a Nvshmem,
    blocks: Vec<((usize, usize), CudaEvent, CudaEvent)>,
}

impl<'a> Stopwatch<'a> {
    pub(crate) fn new(shmem: &'a Nvshmem) -> Self {
        Stopwatch {
            shmem,
            blocks: Vec::new(),
        }
    }

    /// [`CALIBRATION_ROUNDS`] rounds of [`CALIBRATION_CALLS`] calls of each of `ways` ways
    /// (`call(way)` enqueues one on `stream`), for `m` tokens.
    pub(crate) fn rounds(
        &mut self,
        m: usize,
        ways: usize,
        stream: &Arc<CudaStream>,
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
    pub(crate) fn totals(&self) -> Result<HashMap<(usize, usize), f32>> {
        let mut ms = HashMap::new();
        for (key, start, end) in &self.blocks {
            let t = start.elapsed_ms(end).during("cuEventElapsedTime")?;
            *ms.entry(*key).or_default() += t;
        }
        Ok(ms)
    }
}

impl Gemm {
    /// Measures, for this `w` (`n × k`) on this GPU:
    /// - which of cuBLASLt's first 8 candidate algorithms is fastest at 1, 2, 4, ... tokens,
    ///   up to `max_tokens` (at most [`TUNED_TOKENS`]); [`GemmPath::CublasLt`] takes it
    ///   where it beat the heuristic's first choice by 2%;
    /// - which of our decode kernel and cuBLASLt is faster at each token count up to
    ///   `max_tokens` (at most [`DECODE_MAX_TOKENS`]); [`GemmPath::Auto`] takes it. It
    ///   depends on the GPU: on H100s our decode kernel mostly is, on H200s cuBLASLt.
    ///
    /// Sizes measured before are skipped. Where two algorithms are close the winner, and
    /// with it the low bits of the results, can differ between runs:
    /// [`GemmPath::CublasLtHeuristic`] and [`set_auto_path`](Self::set_auto_path) fix them.
    /// Each call reads its weight from memory, as a model's calls do: the calls take copies
    /// of `w` in turn, as many as make twice the L2's size (at most 3).
    ///
    /// The layers call it when their weights are loaded; it runs on the runtime's stream,
    /// waits for it, and takes a fraction of a second per layer. Other work on the GPU
    /// skews it, and a call of this `Gemm` on another stream would share its workspace:
    /// calibrate while nothing else runs.
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
        w: &impl DeviceMemory<bf16>,
        n: usize,
        k: usize,
        max_tokens: usize,
    ) -> Result<()> {
        if w.device_len() != n * k {
            return Err(Error::Length {
                what: "the GEMM weight w (n × k)",
                expected: n * k,
                got: w.device_len(),
            });
        }
        if n == 0 || k == 0 {
            return Ok(());
        }
        let stream = self.shmem.stream();
        let w = w.device_addr(stream);
        self.tune(w, n, k, max_tokens)?;
        let todo: Vec<usize> = {
            let known = self.decode_choice.lock().unwrap_or_else(|e| e.into_inner());
            (1..=max_tokens.min(DECODE_MAX_TOKENS))
                .filter(|&m| !known.contains_key(&(m, n, k)))
                .collect()
        };
        let Some(&most) = todo.last() else {
            return Ok(());
        };
        let (x, y) = self.calibration_inputs(most, n, k)?;
        let copies = self.weight_copies(w, n * k)?;
        let weights = Rotation::new(w, &copies);
        let paths = [GemmPath::Decode, GemmPath::CublasLt];
        let mut watch = Stopwatch::new(&self.shmem);
        let enqueued = todo.iter().try_for_each(|&m| -> Result<()> {
            let shape = LinearShape { m, n, k };
            let (x, y) = (x.addr(), y.addr());
            let call = |which: usize| {
                let ops = Operands {
                    y,
                    ldy: n,
                    x,
                    w: weights.next(),
                };
                // SAFETY: x holds m × k, w n × k and y m × n elements of this GPU (m <= most,
                // and m <= DECODE_MAX_TOKENS for the decode kernel).
                unsafe {
                    match paths[which] {
                        GemmPath::Decode => self.decode(ops, shape, false, stream),
                        path => self.linear_path(ops, shape, path, stream),
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
        let (x, y) = (x.addr(), y.addr());
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
                product: Product::Linear,
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
                cudarc::driver::result::memcpy_dtod_async(copy.addr(), w, bytes, stream.cu_stream())
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
}
