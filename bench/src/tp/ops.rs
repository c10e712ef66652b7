//! Enqueuing one forward of each implementation, and cuBLASMp's plans for it.

use super::buffers::{Buffers, Scratch};
use super::mlp::Mlp;
use super::{Ctx, TpImpl};
use crate::cublasmp::{self, CublasMp, Dims, Plan};
use crate::data::{self, BenchElem};
use crate::error::{BenchError, Result};
use crate::nccl::Nccl;
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem::tp::{GemmPath, LinearShape, Schedule, TensorParallel};
use nvshmem::{DeviceBuffer, SymmetricBuffer};
use std::sync::Arc;

/// Enqueues one forward of an implementation (copyable, so timing closures can hold it).
#[derive(Clone, Copy)]
pub(super) struct Ops<'a> {
    pub(super) tp: &'a TensorParallel,
    pub(super) mlp: &'a Mlp,
    pub(super) nccl: Option<&'a Nccl>,
    /// cublasmp's GEMMs at this token count.
    pub(super) mp: Option<&'a MpPlans<'a>>,
    pub(super) bufs: &'a Buffers,
    pub(super) m: usize,
    pub(super) hidden: usize,
    /// This PE's FFN features.
    pub(super) f: usize,
}

impl Ops<'_> {
    /// This PE's share of the work on every token `x` into `s`: the merged gate/up GEMM on
    /// its weight shard, SiLU(gate)·up, the down GEMM on its shard (the partial product in
    /// `s.out`), its GEMMs by `path`.
    fn local(
        &self,
        x: &DeviceBuffer<bf16>,
        s: &Scratch,
        path: GemmPath,
        stream: &Arc<CudaStream>,
    ) -> nvshmem::Result<()> {
        let (m, f, hidden) = (self.m, self.f, self.hidden);
        let gemm = self.tp.gemm();
        gemm.linear_with(
            &*s.gu,
            x,
            self.mlp.gate_up().weight(),
            LinearShape {
                m,
                n: 2 * f,
                k: hidden,
            },
            path,
            stream,
        )?;
        self.tp.silu_mul(&*s.act, &*s.gu, m, stream)?;
        gemm.linear_with(
            &*s.out,
            &*s.act,
            self.mlp.down().weight(),
            LinearShape { m, n: hidden, k: f },
            path,
            stream,
        )
    }

    /// The MLP's input: every token, and this PE's in sequence parallelism.
    fn input(&self) -> (&DeviceBuffer<bf16>, Option<&SymmetricBuffer<bf16>>) {
        (&self.bufs.x, self.bufs.mine.as_deref())
    }

    /// Errors come back as text: a failure to enqueue is reported, and fatal only if the PEs
    /// disagree.
    pub(super) fn enqueue(&self, imp: TpImpl, stream: &Arc<CudaStream>) -> Result<(), String> {
        match imp {
            TpImpl::ComputeOnly => self
                .local(&self.bufs.x, &self.bufs.compute, GemmPath::Auto, stream)
                .map_err(|e| e.to_string()),
            TpImpl::CublasOnly => {
                let s = self
                    .bufs
                    .cublas
                    .as_ref()
                    .ok_or("cublas-only has no buffers")?;
                self.local(&self.bufs.x, s, GemmPath::CublasLtHeuristic, stream)
                    .map_err(|e| e.to_string())
            }
            TpImpl::CublasNccl => {
                let nccl = self.nccl.ok_or("NCCL is not initialised")?;
                let (scratch, out) = self
                    .bufs
                    .nccl
                    .as_ref()
                    .ok_or("cublas+nccl has no buffers")?;
                let bf = <bf16 as BenchElem>::NCCL;
                let (Some(mine), Some(gathered)) = (&self.bufs.mine, &self.bufs.nccl_gathered)
                else {
                    self.local(&self.bufs.x, scratch, GemmPath::Auto, stream)
                        .map_err(|e| e.to_string())?;
                    // SAFETY: the partial product and the output both hold M × hidden bf16.
                    return unsafe {
                        nccl.all_reduce(
                            scratch.out.addr(),
                            out.addr(),
                            self.m * self.hidden,
                            bf,
                            stream,
                        )
                    };
                };
                // SAFETY: this PE's tokens and its output hold M / PEs × hidden bf16, the
                // gathered input and the partial product M × hidden.
                unsafe {
                    nccl.all_gather(mine.addr(), gathered.addr(), mine.len(), bf, stream)?;
                    self.local(gathered, scratch, GemmPath::Auto, stream)
                        .map_err(|e| e.to_string())?;
                    nccl.reduce_scatter(scratch.out.addr(), out.addr(), out.len(), bf, stream)
                }
            }
            TpImpl::CublasOurs => {
                let y = self
                    .bufs
                    .ours
                    .as_deref()
                    .ok_or("cublas+ours has no output buffer")?;
                self.mlp
                    .forward(y, self.input(), Schedule::Sequential, stream)
            }
            TpImpl::Overlapped => {
                let y = self
                    .bufs
                    .overlapped
                    .as_deref()
                    .ok_or("overlapped has no output buffer")?;
                self.mlp
                    .forward(y, self.input(), Schedule::Overlapped, stream)
            }
            TpImpl::Fused => {
                let y = self
                    .bufs
                    .fused
                    .as_deref()
                    .ok_or("fused has no output buffer")?;
                self.mlp.forward(y, self.input(), Schedule::Fused, stream)
            }
            TpImpl::Cublasmp => self.cublasmp(stream),
        }
    }

    /// cublasmp's forward: the gate/up GEMM (cuBLASMp's all-gather + GEMM in sequence
    /// parallelism, else cuBLASLt's), the SiLU kernel, cuBLASMp's GEMM + reduce-scatter or
    /// all-reduce.
    fn cublasmp(&self, stream: &Arc<CudaStream>) -> Result<(), String> {
        let plans = self.mp.ok_or("cuBLASMp is not set up")?;
        let s = self
            .bufs
            .cublasmp
            .as_ref()
            .ok_or("cublasmp has no buffers")?;
        let (m, f, hidden) = (self.m, self.f, self.hidden);
        let gate_up = self.mlp.gate_up().weight();
        match (&plans.gate_up, self.input()) {
            // SAFETY: this PE's M / PEs tokens, its 2f gate/up rows and M × 2f outputs, as
            // the plan was made for.
            (Some(gather), (_, Some(mine))) => unsafe {
                gather.enqueue(s.gu.addr(), mine.addr(), gate_up.addr(), stream)?
            },
            (_, (x, _)) => self
                .tp
                .gemm()
                .linear_with(
                    &*s.gu,
                    x,
                    gate_up,
                    LinearShape {
                        m,
                        n: 2 * f,
                        k: hidden,
                    },
                    GemmPath::CublasLt,
                    stream,
                )
                .map_err(|e| e.to_string())?,
        }
        self.tp
            .silu_mul(&*s.act, &*s.gu, m, stream)
            .map_err(|e| e.to_string())?;
        // SAFETY: M × f activations, this PE's hidden × f down columns, and the output of
        // M / PEs or M rows, as the plan was made for.
        unsafe {
            plans.down.enqueue(
                s.out.addr(),
                s.act.addr(),
                self.mlp.down().weight().addr(),
                stream,
            )
        }
    }
}

/// cublasmp's GEMMs at one token count: in sequence parallelism the gate/up all-gather +
/// GEMM, and the down projection's GEMM + reduce-scatter (sequence parallel) or all-reduce.
pub(super) struct MpPlans<'a> {
    pub(super) gate_up: Option<Plan<'a>>,
    pub(super) down: Plan<'a>,
}

/// Makes cublasmp's plans for `m` tokens and takes their workspaces from the symmetric heap.
/// `Ok(Err(why))` when cuBLASMp refuses on any PE or the PEs' workspaces differ: every PE
/// gets it alike, before anything collective.
pub(super) fn mp_plans<'a>(
    ctx: &Ctx,
    mp: &'a CublasMp,
    mlp: &Mlp,
    bufs: &Buffers,
    (m, f, hidden): (usize, usize, usize),
) -> Result<Result<MpPlans<'a>, String>> {
    let n = ctx.shmem.n_pes();
    let made = (|| -> Result<(MpPlans<'a>, Vec<(usize, usize)>), String> {
        let s = bufs.cublasmp.as_ref().ok_or("cublasmp has no buffers")?;
        let down = Dims {
            m,
            n: hidden,
            k: f * n,
        };
        let (gate_up, kind) = match &bufs.mine {
            Some(mine) => {
                let dims = Dims {
                    m,
                    n: 2 * f * n,
                    k: hidden,
                };
                let plan = Plan::new(mp, cublasmp::Kind::AllGather, dims)?;
                let ptrs = (s.gu.addr(), mine.addr(), mlp.gate_up().weight().addr());
                (Some((plan, ptrs)), cublasmp::Kind::ReduceScatter)
            }
            None => (None, cublasmp::Kind::AllReduce),
        };
        let down_plan = Plan::new(mp, kind, down)?;
        let down_ptrs = (s.out.addr(), s.act.addr(), mlp.down().weight().addr());
        let mut sizes = Vec::new();
        if let Some((plan, (y, x, w))) = &gate_up {
            sizes.push(plan.workspace_bytes(*w, *x, *y)?);
        }
        let (y, x, w) = down_ptrs;
        sizes.push(down_plan.workspace_bytes(w, x, y)?);
        let plans = MpPlans {
            gate_up: gate_up.map(|(p, _)| p),
            down: down_plan,
        };
        Ok((plans, sizes))
    })();
    // Every PE the same outcome and the same workspace sizes, or none allocates.
    let fingerprint = match &made {
        Ok((_, sizes)) => data::hash_bytes(format!("{sizes:?}").as_bytes()),
        Err(_) => 0,
    };
    let refused = ctx.coord.sum(made.is_err() as u64)?;
    if refused > 0 {
        return Ok(Err(match made {
            Err(e) => e,
            Ok(_) => format!("cuBLASMp refused on {refused} of {n} PEs"),
        }));
    }
    if !ctx.coord.all_equal(fingerprint)? {
        return Ok(Err(
            "cuBLASMp asked for workspaces of different sizes on different PEs".into(),
        ));
    }
    let (mut plans, sizes) = made.map_err(BenchError::new)?;
    let mut sizes = sizes.into_iter();
    for plan in plans.gate_up.iter_mut().chain([&mut plans.down]) {
        let (device, host) = sizes.next().unwrap_or_default();
        plan.set_workspace(ctx.shmem, device, host)?;
    }
    Ok(Ok(plans))
}
