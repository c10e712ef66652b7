//! One pipeline stage's model: an MLP block with a residual, `y = x + relu(x · w1ᵀ) · w2ᵀ`,
//! forward and backward, bf16 in memory and f32 in cuBLASLt's sums. The loss is `|y|² / 2`
//! at the last stage, so the gradient of its output is the output itself.
//!
//! Every matrix is row-major (a token per row, weights as PyTorch stores them: `w1` is
//! ffn × hidden, `w2` hidden × ffn). cuBLAS is column-major: a row-major r × c matrix is its
//! column-major c × r transpose with the same memory, so each product below is written for
//! cuBLAS on the transposes.

use crate::error::{BenchError, Result};
use cudarc::cublaslt::{result as lt, sys as ltsys};
use cudarc::driver::{CudaStream, LaunchConfig};
use half::bf16;
use nvshmem::module::{Function, KernelArgs, Module};
use nvshmem::{DeviceBuffer, Nvshmem};
use std::sync::Arc;

/// The kernels of kernels/pipeline.cu: the fill, the ReLU's backward.
pub const KERNEL_NAMES: [&str; 2] = ["pipeline_fill_bf16", "pipeline_relu_backward_bf16"];

/// The fill and ReLU-backward kernels (kernels/pipeline.cu).
pub struct Kernels {
    fill: Function,
    relu_backward: Function,
}

/// A grid-stride launch over `n` elements.
fn elementwise(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 2048) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Kernels {
    pub fn load(shmem: &Nvshmem) -> Result<Self> {
        let module = Module::load(shmem, &crate::kernels::PIPELINE)?;
        Ok(Kernels {
            fill: module.function(KERNEL_NAMES[0])?,
            relu_backward: module.function(KERNEL_NAMES[1])?,
        })
    }

    /// Uniform values in `[-scale, scale)` from `key`, the same on every PE.
    pub fn fill(
        &self,
        out: &DeviceBuffer<bf16>,
        key: u64,
        scale: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let mut args = KernelArgs::new();
        args.value(out.addr())
            .value(out.len() as u64)
            .value(key)
            .value(scale);
        // SAFETY: matches pipeline_fill_bf16(bf16*, uint64_t, uint64_t, float) over `out`.
        unsafe {
            self.fill
                .launch(elementwise(out.len()), stream, &mut args)?
        };
        Ok(())
    }

    /// `g` where `a > 0`, else 0, in place.
    fn relu_backward(
        &self,
        g: &DeviceBuffer<bf16>,
        a: &DeviceBuffer<bf16>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let n = g.len().min(a.len());
        let mut args = KernelArgs::new();
        args.value(g.addr()).value(a.addr()).value(n as u64);
        // SAFETY: matches pipeline_relu_backward_bf16(bf16*, const bf16*, uint64_t) over
        // the first `n` elements of both.
        unsafe {
            self.relu_backward
                .launch(elementwise(n), stream, &mut args)?
        };
        Ok(())
    }
}

/// Bytes of cuBLASLt's workspace (NVIDIA's recommendation for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// cuBLASLt on one stream: a handle and its workspace. Products are bf16 with f32 sums, by
/// the algorithm the heuristic puts first: the same for the same shape, so the same bits.
pub struct Lt {
    handle: ltsys::cublasLtHandle_t,
    workspace: DeviceBuffer<u8>,
    stream: Arc<CudaStream>,
}

/// One operand of a product: transposed or not, its memory, its leading dimension.
type Operand<'a> = (bool, &'a DeviceBuffer<bf16>, usize);

fn lt_error(call: &str, e: lt::CublasError) -> BenchError {
    BenchError::new(format!("{call}: {e:?}"))
}

impl Lt {
    pub fn new(shmem: &Nvshmem, stream: &Arc<CudaStream>) -> Result<Self> {
        let workspace = shmem.alloc_device::<u8>(WORKSPACE_BYTES)?;
        let handle = lt::create_handle().map_err(|e| lt_error("cublasLtCreate", e))?;
        Ok(Lt {
            handle,
            workspace,
            stream: stream.clone(),
        })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `c = op(a) · op(b)` (plus `c` when `accumulate`, then a ReLU when `relu`),
    /// column-major: `op(a)` is m × k, `op(b)` k × n, `c` m × n; `t` transposes.
    fn gemm(
        &self,
        (ta, a, lda): Operand,
        (tb, b, ldb): Operand,
        c: &mut DeviceBuffer<bf16>,
        (m, n, k): (usize, usize, usize),
        accumulate: bool,
        relu: bool,
    ) -> Result<()> {
        if a.len() < m * k || b.len() < k * n || c.len() < m * n {
            return Err(BenchError::new(format!(
                "pipeline GEMM {m} x {n} x {k}: a buffer is too small"
            )));
        }
        let bf = ltsys::cudaDataType_t::CUDA_R_16BF;
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        // A stored operand's rows and columns (column-major), before `op`.
        let dims = |t: bool, rows: usize, cols: usize| if t { (cols, rows) } else { (rows, cols) };
        let layouts: Vec<ltsys::cublasLtMatrixLayout_t> =
            [(dims(ta, m, k), lda), (dims(tb, k, n), ldb), ((m, n), m)]
                .into_iter()
                .map(|((rows, cols), ld)| {
                    lt::create_matrix_layout(bf, rows as u64, cols as u64, ld as i64)
                        .map_err(|e| lt_error("cublasLtMatrixLayoutCreate", e))
                })
                .collect::<Result<_>>()?;
        let desc = lt::create_matmul_desc(
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(|e| lt_error("cublasLtMatmulDescCreate", e))?;
        let pref =
            lt::create_matmul_pref().map_err(|e| lt_error("cublasLtMatmulPreferenceCreate", e))?;
        let (al, bl, cl) = (layouts[0], layouts[1], layouts[2]);
        let run = || -> Result<()> {
            use ltsys::cublasLtMatmulDescAttributes_t as D;
            let set = |attr: D, v: u32| {
                // SAFETY: `desc` lives until the end of `gemm`; the attribute is 4 bytes.
                unsafe {
                    lt::set_matmul_desc_attribute(desc, attr, &v as *const u32 as *const _, 4)
                }
                .map_err(|e| lt_error("cublasLtMatmulDescSetAttribute", e))
            };
            set(D::CUBLASLT_MATMUL_DESC_TRANSA, ta as u32)?;
            set(D::CUBLASLT_MATMUL_DESC_TRANSB, tb as u32)?;
            if relu {
                let epilogue = ltsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU as u32;
                set(D::CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue)?;
            }
            let bytes = WORKSPACE_BYTES as u64;
            let attr = ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES;
            // SAFETY: every descriptor lives until the end of `gemm`. The operands hold the
            // product's elements (checked above) and are used in stream order on
            // `self.stream`, as the workspace is.
            unsafe {
                lt::set_matmul_pref_attribute(pref, attr, &bytes as *const u64 as *const _, 8)
                    .map_err(|e| lt_error("cublasLtMatmulPreferenceSetAttribute", e))?;
                let heuristic =
                    lt::get_matmul_algo_heuristic(self.handle, desc, al, bl, cl, cl, pref)
                        .map_err(|e| lt_error("cublasLtMatmulAlgoGetHeuristic", e))?;
                lt::matmul(
                    self.handle,
                    desc,
                    &alpha as *const f32 as *const _,
                    &beta as *const f32 as *const _,
                    a.addr() as *const _,
                    al,
                    b.addr() as *const _,
                    bl,
                    c.addr() as *const _,
                    cl,
                    c.addr() as *mut _,
                    cl,
                    &heuristic.algo,
                    self.workspace.addr() as *mut _,
                    WORKSPACE_BYTES,
                    self.stream.cu_stream() as ltsys::cudaStream_t,
                )
                .map_err(|e| lt_error(&format!("cublasLtMatmul ({m} x {n} x {k})"), e))
            }
        };
        let result = run();
        // SAFETY: made above, destroyed once.
        unsafe {
            for l in layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_pref(pref);
            let _ = lt::destroy_matmul_desc(desc);
        }
        result
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle was made in `new` and is destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// A stage's weights and their gradients, summed over the micro-batches of a step.
pub struct Block {
    pub hidden: usize,
    pub ffn: usize,
    w1: DeviceBuffer<bf16>,
    w2: DeviceBuffer<bf16>,
    pub dw1: DeviceBuffer<bf16>,
    pub dw2: DeviceBuffer<bf16>,
}

impl Block {
    /// Weights drawn from `key` (scaled so that activations stay of order 1 through many
    /// blocks), gradients zero.
    pub fn new(
        shmem: &Nvshmem,
        kernels: &Kernels,
        stream: &Arc<CudaStream>,
        (hidden, ffn): (usize, usize),
        key: u64,
    ) -> Result<Self> {
        let w1 = shmem.alloc_device::<bf16>(ffn * hidden)?;
        let w2 = shmem.alloc_device::<bf16>(hidden * ffn)?;
        kernels.fill(&w1, key, (6.0 / hidden as f32).sqrt(), stream)?;
        kernels.fill(&w2, key ^ 0x77, (1.0 / ffn as f32).sqrt(), stream)?;
        Ok(Block {
            hidden,
            ffn,
            w1,
            w2,
            dw1: shmem.alloc_device::<bf16>(ffn * hidden)?,
            dw2: shmem.alloc_device::<bf16>(hidden * ffn)?,
        })
    }

    /// The weights, row-major (`w1` ffn × hidden, `w2` hidden × ffn).
    pub fn weights(&self) -> (&DeviceBuffer<bf16>, &DeviceBuffer<bf16>) {
        (&self.w1, &self.w2)
    }

    pub fn zero_grads(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        for g in [&self.dw1, &self.dw2] {
            // SAFETY: the gradient's own bytes, in stream order.
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    g.addr(),
                    0,
                    g.num_bytes(),
                    stream.cu_stream(),
                )
            }
            .map_err(|e| BenchError::cuda("cuMemsetD8Async", e))?;
        }
        Ok(())
    }

    /// `a = relu(x · w1ᵀ)` (m × ffn) and `y = x + a · w2ᵀ` (m × hidden) for `m` tokens.
    pub fn forward(
        &self,
        lt: &Lt,
        m: usize,
        x: &DeviceBuffer<bf16>,
        a: &mut DeviceBuffer<bf16>,
        y: &mut DeviceBuffer<bf16>,
    ) -> Result<()> {
        let (h, f) = (self.hidden, self.ffn);
        // aᵀ (f × m) = relu(w1 · xᵀ): w1's memory is w1ᵀ (h × f) column-major.
        lt.gemm(
            (true, &self.w1, h),
            (false, x, h),
            a,
            (f, m, h),
            false,
            true,
        )?;
        copy(lt.stream(), x, y, m * h)?;
        // yᵀ (h × m) += w2 · aᵀ.
        lt.gemm(
            (true, &self.w2, f),
            (false, a, f),
            y,
            (h, m, f),
            true,
            false,
        )
    }

    /// The backward of [`forward`](Self::forward) given the gradient `gy` of its output:
    /// `dw2 += gyᵀ · a`, `ga = (gy · w2) ⊙ [a > 0]` (in the scratch `ga`), `dw1 += gaᵀ · x`,
    /// `gx = gy + ga · w1`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        lt: &Lt,
        kernels: &Kernels,
        m: usize,
        gy: &DeviceBuffer<bf16>,
        x: &DeviceBuffer<bf16>,
        a: &DeviceBuffer<bf16>,
        ga: &mut DeviceBuffer<bf16>,
        gx: &mut DeviceBuffer<bf16>,
    ) -> Result<()> {
        let (h, f) = (self.hidden, self.ffn);
        // dw2ᵀ (f × h) += aᵀ · gy.
        lt.gemm(
            (false, a, f),
            (true, gy, h),
            &mut self.dw2,
            (f, h, m),
            true,
            false,
        )?;
        // gaᵀ (f × m) = w2ᵀ · gyᵀ: w2's memory is w2ᵀ (f × h) column-major.
        lt.gemm(
            (false, &self.w2, f),
            (false, gy, h),
            ga,
            (f, m, h),
            false,
            false,
        )?;
        kernels.relu_backward(ga, a, lt.stream())?;
        // dw1ᵀ (h × f) += xᵀ · ga.
        lt.gemm(
            (false, x, h),
            (true, ga, f),
            &mut self.dw1,
            (h, f, m),
            true,
            false,
        )?;
        copy(lt.stream(), gy, gx, m * h)?;
        // gxᵀ (h × m) += w1ᵀ · gaᵀ.
        lt.gemm(
            (false, &self.w1, h),
            (false, ga, f),
            gx,
            (h, m, f),
            true,
            false,
        )
    }
}

/// The first `n` elements of `src` into `dst`, on `stream`.
pub fn copy(
    stream: &Arc<CudaStream>,
    src: &DeviceBuffer<bf16>,
    dst: &mut DeviceBuffer<bf16>,
    n: usize,
) -> Result<()> {
    if src.len() < n || dst.len() < n {
        return Err(BenchError::new("pipeline copy beyond a buffer"));
    }
    // SAFETY: both hold at least `n` elements; the copy is ordered on `stream`.
    unsafe {
        cudarc::driver::result::memcpy_dtod_async(
            dst.addr(),
            src.addr(),
            n * std::mem::size_of::<bf16>(),
            stream.cu_stream(),
        )
    }
    .map_err(|e| BenchError::cuda("cuMemcpyDtoDAsync", e))
}
