//! cuBLASLt's side of [`Gemm`]: a plan (descriptors and algorithm) per shape, row stride and
//! pointer alignment, made on first use and cached, and the call itself.

use super::calibrate::{tuned_count_of, TUNED_TOKENS};
use super::{Gemm, LinearShape, WORKSPACE_BYTES};
use crate::error::{Error, Result};
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as ltsys;
use cudarc::driver::CudaStream;
use std::ffi::c_void;
use std::sync::Arc;

/// What a cached plan depends on besides the shape: the row stride of `y` and the
/// alignment every pointer has (cuBLASLt picks kernels that assume it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub(super) product: Product,
    pub(super) shape: LinearShape,
    pub(super) ldy: usize,
    pub(super) align: u32,
    /// The heuristic's first choice, never a measured one.
    pub(super) heuristic: bool,
}

/// Which product of a linear layer a plan computes, for its [`LinearShape`] (`m` tokens, `n`
/// output and `k` input features). Each names its operands A, B and C as cuBLASLt does, and
/// [`Gemm::matmul`] takes them in that order's reverse (C, B, A).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Product {
    /// The forward `y = x · wᵀ`: A = w, B = x, C = y.
    Linear,
    /// The input gradient `dx (m × k) = dy (m × n) · w`: A = w, B = dy, C = dx.
    InputGrad,
    /// The weight gradient `dw (n × k) = dyᵀ · x`: A = x, B = dy, C = dw.
    WeightGrad,
}

/// The algorithm [`Gemm::calibrate`] measured fastest for a shape, and the pointer alignment
/// it was measured with (a call with less takes the heuristic's).
#[derive(Clone, Copy)]
pub(super) struct Tuned {
    pub(super) algo: ltsys::cublasLtMatmulAlgo_t,
    pub(super) align: u32,
}

/// The descriptors and chosen algorithm of one key.
pub(super) struct Plan {
    pub(super) desc: ltsys::cublasLtMatmulDesc_t,
    pub(super) w: ltsys::cublasLtMatrixLayout_t,
    pub(super) x: ltsys::cublasLtMatrixLayout_t,
    pub(super) y: ltsys::cublasLtMatrixLayout_t,
    pub(super) algo: ltsys::cublasLtMatmulAlgo_t,
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

pub(super) fn cublas(call: &'static str, e: lt::CublasError) -> Error {
    Error::Cublas {
        call,
        message: String::new(),
        source: Some(e),
    }
}

/// The largest power of two (at most 256) that divides every address.
pub(super) fn common_alignment(addresses: &[u64]) -> u32 {
    let bits = addresses.iter().fold(0u64, |acc, a| acc | a) | 256;
    1 << bits.trailing_zeros()
}

impl Gemm {
    /// cuBLASLt's `y = x · wᵀ` by `plan`'s descriptors with `algo`.
    ///
    /// # Safety
    /// As for [`linear_raw`](Self::linear_raw), with `plan` made for the call's shape,
    /// row stride and alignment, and this PE's context current.
    pub(super) unsafe fn matmul(
        &self,
        plan: &Plan,
        algo: &ltsys::cublasLtMatmulAlgo_t,
        y: u64,
        x: u64,
        w: u64,
        stream: &Arc<CudaStream>,
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
            self.workspace.addr() as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as ltsys::cudaStream_t,
        )
        .map_err(|e| cublas("cublasLtMatmul", e))
    }

    /// The plan of `key`, made on first use.
    pub(super) fn plan(&self, key: Key) -> Result<Arc<Plan>> {
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
        if key.heuristic || key.product != Product::Linear || m > TUNED_TOKENS {
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
    pub(super) fn make_plan(
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
        // Column-major views of the row-major buffers (a row-major r × c matrix is a
        // column-major c × r one), in the fields A (`w`), B (`x`) and C (`y`), and whether
        // cuBLASLt transposes A and B. cublasOperation_t (cuBLAS's header, not cuBLASLt's):
        // CUBLAS_OP_N is 0, CUBLAS_OP_T 1.
        let (transa, transb): (i32, i32) = match key.product {
            // yᵀ (n × m) = (w: k × n)ᵀ · (x: k × m).
            Product::Linear => {
                plan.w = layout(k, n, k)?;
                plan.x = layout(k, m, k)?;
                plan.y = layout(n, m, key.ldy)?;
                (1, 0)
            }
            // dxᵀ (k × m) = (w: k × n) · (dy: n × m).
            Product::InputGrad => {
                plan.w = layout(k, n, k)?;
                plan.x = layout(n, m, n)?;
                plan.y = layout(k, m, key.ldy)?;
                (0, 0)
            }
            // dwᵀ (k × n) = (x: k × m) · (dy: n × m)ᵀ.
            Product::WeightGrad => {
                plan.w = layout(k, m, k)?;
                plan.x = layout(n, m, n)?;
                plan.y = layout(k, n, key.ldy)?;
                (0, 1)
            }
        };
        // SAFETY: live descriptors; the attribute values outlive the calls.
        unsafe {
            for (attr, value) in [
                (
                    ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                    &transa,
                ),
                (
                    ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                    &transb,
                ),
            ] {
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    attr,
                    value as *const i32 as *const c_void,
                    std::mem::size_of::<i32>(),
                )
                .map_err(|e| cublas("cublasLtMatmulDescSetAttribute", e))?;
            }
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
                    "no bf16 algorithm for {:?} of m = {m}, n = {n}, k = {k} (output rows {} \
                     apart) with {}-byte aligned pointers",
                    key.product, key.ldy, key.align
                ),
                source: failed.err(),
            }),
        }
    }
}
