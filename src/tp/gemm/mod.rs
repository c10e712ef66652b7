//! Local GEMMs: `y = x · wᵀ` with `x` (m × k), `w` (n × k, a linear layer's weight as
//! PyTorch stores it) and `y` (m × n), all row-major bf16, accumulated in f32 (split-K parts
//! too), by cuBLASLt or our decode kernel ([`GemmPath`]).
//!
//! Row-major `y = x · wᵀ` is column-major `yᵀ = w · xᵀ` with the same memory: cuBLASLt's "TN"
//! case (A = w transposed, B = x), the layout its Hopper kernels favour.

mod calibrate;
mod plan;

pub(super) use calibrate::Stopwatch;
pub use calibrate::TUNED_TOKENS;

use crate::cubins::TP;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceMemory};
use crate::module::{grid, Function, KernelArgs, LaunchOptions, Module};
use crate::order::CallOrder;
use crate::runtime::Nvshmem;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as ltsys;
use cudarc::driver::CudaStream;
use half::bf16;
use plan::{common_alignment, cublas, Key, Plan, Product, Tuned};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The most tokens our decode kernels take (kernels/tp/decode.cuh): a product of so few
/// tokens is bound by reading its weight, which they stream once at memory bandwidth.
/// [`GemmPath::Auto`] takes them where [`Gemm::calibrate`] measured them faster than cuBLASLt.
pub const DECODE_MAX_TOKENS: usize = 16;

/// Tokens up to which the first of our two decode kernels runs (`decode_linear_bf16`); the
/// second (`decode_linear16_bf16`, more registers and shared memory) takes the rest, so that
/// it costs the first nothing.
pub(crate) const DECODE_SMALL_TOKENS: usize = 8;

/// The decode kernels: up to [`DECODE_SMALL_TOKENS`] tokens, and from there up to
/// [`DECODE_MAX_TOKENS`].
pub(crate) const DECODE_KERNELS: [&str; 2] = ["decode_linear_bf16", "decode_linear16_bf16"];

/// Which kernel computes a [`Gemm`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GemmPath {
    /// Up to [`DECODE_MAX_TOKENS`] tokens, our decode kernel or cuBLASLt, whichever
    /// [`Gemm::calibrate`] measured faster for these sizes on this GPU (our decode kernel
    /// where nothing was measured); cuBLASLt above.
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

/// Each operand `(what, its length, (rows, columns))` must hold exactly rows × columns.
fn check_operands(operands: &[(&'static str, usize, (usize, usize))]) -> Result<()> {
    for &(what, got, (a, b)) in operands {
        match a.checked_mul(b) {
            Some(want) if want == got => {}
            Some(want) => {
                return Err(Error::Length {
                    what,
                    expected: want,
                    got,
                })
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "{what}: {a} × {b} elements overflow usize"
                )))
            }
        }
    }
    Ok(())
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

/// A cuBLASLt handle with its workspace and a plan per shape, for bf16 linear layers on
/// this PE's GPU. Plans are made on first use (a heuristic query, no GPU work), so a call
/// can be captured in a CUDA graph, and its first call should be made before timing.
/// Calls share the workspace, so a call on another stream than the last call's is ordered
/// after it (it waits on the device); calls on streams that should run at the same time need
/// a `Gemm` each.
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
    /// Our decode kernels ([`DECODE_KERNELS`]).
    decode: [Function; 2],
    /// Blocks of the decode kernel resident at once on this GPU.
    decode_blocks: u32,
    /// What [`GemmPath::Auto`] takes up to [`DECODE_MAX_TOKENS`] tokens, by `(m, n, k)`, where
    /// [`Gemm::calibrate`] measured it.
    decode_choice: Mutex<HashMap<(usize, usize, usize), GemmPath>>,
    /// cuBLASLt's fastest measured algorithm by `(m, n, k)`, `m` a power of two up to
    /// [`TUNED_TOKENS`].
    tuned: Mutex<HashMap<(usize, usize, usize), Tuned>>,
    /// Calls share the workspace: one on another stream than the last waits for it. A
    /// tensor-parallel group's layers take their calls through the same order.
    pub(in crate::tp) order: CallOrder,
}

// SAFETY: a cuBLASLt handle may be used from any thread (it holds no per-call state; calls
// on one handle from several threads are allowed); plans are immutable once made and shared
// behind a lock.
unsafe impl Send for Gemm {}
unsafe impl Sync for Gemm {}

/// The device addresses of one raw GEMM call: `y`'s rows are `ldy` elements apart.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operands {
    pub y: u64,
    pub ldy: usize,
    pub x: u64,
    pub w: u64,
}

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
            tp.function(DECODE_KERNELS[0])?,
            tp.function(DECODE_KERNELS[1])?,
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
            decode_choice: Mutex::new(HashMap::new()),
            tuned: Mutex::new(HashMap::new()),
            order: CallOrder::new(),
        })
    }

    /// Has [`GemmPath::Auto`] take `path` for `shape` (up to [`DECODE_MAX_TOKENS`] tokens, our
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
        if m == 0 || m > DECODE_MAX_TOKENS {
            return Err(Error::InvalidArgument(format!(
                "GemmPath::Auto chooses between paths from 1 to {DECODE_MAX_TOKENS} tokens, not {m}; \
                 above it takes cuBLASLt (pass a GemmPath to linear_with for another)"
            )));
        }
        if !matches!(path, GemmPath::Decode | GemmPath::CublasLt) {
            return Err(Error::InvalidArgument(format!(
                "GemmPath::Auto takes our decode kernel or cuBLASLt up to {DECODE_MAX_TOKENS} \
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
        if m > DECODE_MAX_TOKENS {
            return GemmPath::CublasLt;
        }
        let known = self.decode_choice.lock().unwrap_or_else(|e| e.into_inner());
        known.get(&(m, n, k)).copied().unwrap_or(GemmPath::Decode)
    }

    /// `y = x · wᵀ` on `stream`: `x` is `m × k`, `w` is `n × k` and `y` is `m × n`, row-major,
    /// each exactly that long. Nothing is launched when `m` is 0.
    pub fn linear(
        &self,
        y: &impl DeviceMemory<bf16>,
        x: &impl DeviceMemory<bf16>,
        w: &impl DeviceMemory<bf16>,
        shape: LinearShape,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.linear_with(y, x, w, shape, GemmPath::Auto, stream)
    }

    /// [`linear`](Self::linear) computed by `path`.
    pub fn linear_with(
        &self,
        y: &impl DeviceMemory<bf16>,
        x: &impl DeviceMemory<bf16>,
        w: &impl DeviceMemory<bf16>,
        shape: LinearShape,
        path: GemmPath,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let LinearShape { m, n, k } = shape;
        check_operands(&[
            ("the GEMM input x (m × k)", x.device_len(), (m, k)),
            ("the GEMM weight w (n × k)", w.device_len(), (n, k)),
            ("the GEMM output y (m × n)", y.device_len(), (m, n)),
        ])?;
        let ops = Operands {
            y: y.device_addr(stream),
            ldy: n,
            x: x.device_addr(stream),
            w: w.device_addr(stream),
        };
        // SAFETY: the lengths were checked against the shape, and the slices are device
        // memory of this PE.
        unsafe { self.linear_path(ops, shape, path, stream) }
    }

    /// The input gradient of [`linear`](Self::linear) on `stream`: `dx = dy · w`, with `dy`
    /// (`m × n`), `w` (`n × k`) and `dx` (`m × k`) row-major, each exactly that long. By
    /// cuBLASLt (its heuristic's first choice), accumulated in f32.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{bf16, tp::{Gemm, LinearShape}};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let gemm = Gemm::new(&shmem)?;
    /// let shape = LinearShape { m: 256, n: 1024, k: 512 };
    /// let (x, w) = (shmem.alloc_device::<bf16>(256 * 512)?, shmem.alloc_device::<bf16>(1024 * 512)?);
    /// let dy = shmem.alloc_device::<bf16>(256 * 1024)?;
    /// let (dx, dw) = (shmem.alloc_device::<bf16>(256 * 512)?, shmem.alloc_device::<bf16>(1024 * 512)?);
    /// gemm.linear_input_grad(&dx, &dy, &w, shape, shmem.stream())?;
    /// gemm.linear_weight_grad(&dw, &dy, &x, shape, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn linear_input_grad(
        &self,
        dx: &impl DeviceMemory<bf16>,
        dy: &impl DeviceMemory<bf16>,
        w: &impl DeviceMemory<bf16>,
        shape: LinearShape,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let LinearShape { m, n, k } = shape;
        let operands = [
            ("the input gradient dx (m × k)", dx.device_len(), (m, k)),
            ("the output gradient dy (m × n)", dy.device_len(), (m, n)),
            ("the GEMM weight w (n × k)", w.device_len(), (n, k)),
        ];
        check_operands(&operands)?;
        let (c, b, a) = (
            dx.device_addr(stream),
            dy.device_addr(stream),
            w.device_addr(stream),
        );
        // SAFETY: the lengths were checked against the shape.
        unsafe { self.backward(Product::InputGrad, c, b, a, shape, stream) }
    }

    /// The weight gradient of [`linear`](Self::linear) on `stream`: `dw = dyᵀ · x`, with `dy`
    /// (`m × n`), `x` (`m × k`) and `dw` (`n × k`) row-major, each exactly that long; a sum
    /// over the `m` tokens, in f32. By cuBLASLt (its heuristic's first choice).
    pub fn linear_weight_grad(
        &self,
        dw: &impl DeviceMemory<bf16>,
        dy: &impl DeviceMemory<bf16>,
        x: &impl DeviceMemory<bf16>,
        shape: LinearShape,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let LinearShape { m, n, k } = shape;
        let operands = [
            ("the weight gradient dw (n × k)", dw.device_len(), (n, k)),
            ("the output gradient dy (m × n)", dy.device_len(), (m, n)),
            ("the GEMM input x (m × k)", x.device_len(), (m, k)),
        ];
        check_operands(&operands)?;
        let (c, b, a) = (
            dw.device_addr(stream),
            dy.device_addr(stream),
            x.device_addr(stream),
        );
        // SAFETY: the lengths were checked against the shape.
        unsafe { self.backward(Product::WeightGrad, c, b, a, shape, stream) }
    }

    /// A backward product by cuBLASLt's heuristic plan, ordered after this `Gemm`'s last call.
    ///
    /// # Safety
    /// `c`, `b` and `a` must hold the product's operands (see [`Product`]; both products'
    /// outputs have rows of `k`), valid until the call has run on `stream`.
    unsafe fn backward(
        &self,
        product: Product,
        c: u64,
        b: u64,
        a: u64,
        shape: LinearShape,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let LinearShape { m, n, k } = shape;
        if n == 0 || k == 0 || m == 0 {
            return Err(Error::InvalidArgument(format!(
                "a {product:?} of m = {m}, n = {n}, k = {k}: a layer's gradient needs tokens, \
                 input and output features"
            )));
        }
        let key = Key {
            product,
            shape,
            ldy: shape.k,
            align: common_alignment(&[
                a,
                b,
                c,
                (n * std::mem::size_of::<bf16>()) as u64,
                (k * std::mem::size_of::<bf16>()) as u64,
            ]),
            heuristic: true,
        };
        self.order.run(&self.shmem, stream, "a GEMM", || {
            self.shmem.bind_context()?;
            let plan = self.plan(key)?;
            // SAFETY: the caller's; the plan was made for this product and shape.
            unsafe { self.matmul(&plan, &plan.algo, c, b, a, stream) }
        })
    }

    /// `y = x · wᵀ` with `y`'s rows `ldy` elements apart (`ldy >= n`), for a product that
    /// fills some of `y`'s columns.
    ///
    /// # Safety
    /// `x` must hold `m × k`, `w` `n × k` and `y` `(m - 1) × ldy + n` elements of this PE's
    /// GPU, valid until the call has run on `stream`.
    pub(crate) unsafe fn linear_raw(
        &self,
        ops: Operands,
        shape: LinearShape,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.linear_path(ops, shape, GemmPath::Auto, stream)
    }

    /// [`linear_raw`](Self::linear_raw) computed by `path`, ordered after this `Gemm`'s last
    /// call (they share the workspace).
    ///
    /// # Safety
    /// As for [`linear_raw`](Self::linear_raw).
    unsafe fn linear_path(
        &self,
        ops: Operands,
        shape: LinearShape,
        path: GemmPath,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        // SAFETY: the caller's.
        self.order.run(&self.shmem, stream, "a GEMM", || unsafe {
            self.linear_unordered(ops, shape, path, stream)
        })
    }

    /// [`linear_path`](Self::linear_path) without the ordering.
    ///
    /// # Safety
    /// As for [`linear_raw`](Self::linear_raw).
    unsafe fn linear_unordered(
        &self,
        ops: Operands,
        shape: LinearShape,
        path: GemmPath,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (LinearShape { m, n, k }, Operands { y, ldy, x, w }) = (shape, ops);
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
        if path == GemmPath::Decode {
            return self.decode(ops, shape, true, stream);
        }
        let key = Key {
            product: Product::Linear,
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

    /// Our decode kernel on `shape` (at most [`DECODE_MAX_TOKENS`] tokens, checked by the
    /// caller). `programmatic`: launched so that its blocks may start while the kernel before
    /// it on the stream finishes, and wait for it (decode_enter in kernels/tp/decode.cuh);
    /// [`calibrate`](Self::calibrate) launches without, so that its back-to-back calls of one
    /// kernel are timed as cuBLASLt's are, each after the one before has ended.
    ///
    /// # Safety
    /// As for [`linear_raw`](Self::linear_raw).
    unsafe fn decode(
        &self,
        ops: Operands,
        shape: LinearShape,
        programmatic: bool,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (LinearShape { m, n, k }, Operands { y, ldy, x, w }) = (shape, ops);
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
}

#[cfg(test)]
mod tests {
    use super::calibrate::{tuned_count_of, tuned_counts};
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
