//! The hybrid step's baselines: the same passes with NCCL's calls in place of ours, and with
//! no communication at all (the step's compute, which gives each step's communication share).

use super::layout::Layout;
use super::stage::comm::{Comm, View};
use super::stage::{Stage, EPS};
use crate::error::{BenchError, CudaExt, Result};
use crate::nccl::Nccl;
use crate::pipeline::nccl_groups;
use cudarc::driver::CudaStream;
use cudarc::nccl::sys::ncclDataType_t;
use half::bf16;
use nvshmem::pipeline::Step;
use nvshmem::tp::{GemmPath, LinearShape, TensorParallel, TpMlp};
use nvshmem::{DeviceBuffer, GradientSync, SymmetricBuffer};
use std::sync::Arc;

/// A stage's steps as NCCL must enqueue them: [`nccl_groups`], but a send of activations and
/// the receive of the same micro-batch's gradient apart (a stage's output holds both, and a
/// group's transfers run at once).
pub fn groups(steps: &[Step]) -> Vec<Vec<Step>> {
    let apart = |g: Vec<Step>| match g[..] {
        [Step::SendActivation(j), Step::RecvGradient(k)] if j == k => vec![vec![g[0]], vec![g[1]]],
        _ => vec![g],
    };
    nccl_groups(steps).into_iter().flat_map(apart).collect()
}

/// NCCL's communicators for the step.
#[derive(Clone, Copy)]
pub struct Comms<'a> {
    /// Every PE: the hand-offs between stages, by world rank.
    pub world: &'a Nccl,
    /// The tensor-parallel group's (none for groups of one).
    pub group: Option<&'a Nccl>,
    /// This stage and group PE's replicas' (none without replicas).
    pub replicas: Option<&'a Nccl>,
}

/// The step's baseline: `comms` does what ours does (the group's sums by `ncclAllReduce`,
/// the down projection's then followed by our residual add and RMSNorm; the hand-offs by
/// `ncclSend`/`ncclRecv`, each send grouped with the receive after it; the replicas' sums
/// bucket by bucket on `sync`'s side stream as each bucket is written), or, without
/// `comms`, nothing: the step's compute alone.
pub struct Baseline<'a, 'c> {
    pub comms: Option<Comms<'a>>,
    pub tp: &'a TensorParallel,
    pub at: Layout,
    /// The down projection's partial product: one micro-batch's tokens × hidden.
    pub partial: &'a DeviceBuffer<bf16>,
    /// Where the gradients go (only its buffers and buckets are used).
    pub sync: &'a GradientSync<'c, bf16>,
}

impl Baseline<'_, '_> {
    /// NCCL's in-place sum of `len` elements at `addr` over `comm`, if there is one.
    fn sum(comm: Option<&Nccl>, (addr, len): (u64, usize), s: &CudaStream) -> Result<()> {
        let Some(comm) = comm else { return Ok(()) };
        // SAFETY: the callers pass a buffer of theirs of `len` elements, alive for the step.
        unsafe { comm.all_reduce(addr, addr, len, ncclDataType_t::ncclBfloat16, s) }
            .map_err(BenchError::new)
    }

    fn group(&self) -> Option<&Nccl> {
        self.comms.and_then(|c| c.group)
    }

    fn replicas(&self) -> Option<&Nccl> {
        self.comms.and_then(|c| c.replicas)
    }
}

impl Comm for Baseline<'_, '_> {
    type Error = BenchError;

    fn down_rmsnorm(
        &mut self,
        mlp: &TpMlp,
        (out, residual, act): (View, &View, &View),
        gamma: &SymmetricBuffer<bf16>,
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let (hidden, k) = (gamma.len(), mlp.down().local_in_features().len());
        let m = act.len() / k;
        let shape = LinearShape { m, n: hidden, k };
        let p = self.partial;
        let gemm = self.tp.gemm();
        gemm.linear_with(p, act, mlp.down().weight(), shape, GemmPath::Auto, s)?;
        Self::sum(self.group(), (p.addr(), m * hidden), s)?;
        Ok(self.tp.rmsnorm(&out, residual, p, gamma, EPS, s)?)
    }

    fn gate_up_input_grad(
        &mut self,
        mlp: &TpMlp,
        dx: &SymmetricBuffer<bf16>,
        dy: &View,
        s: &Arc<CudaStream>,
    ) -> Result<()> {
        let (k, n) = (
            mlp.gate_up().in_features(),
            mlp.gate_up().local_out_features(),
        );
        let m = dy.len() / n;
        let shape = LinearShape { m, n, k };
        let gemm = self.tp.gemm();
        gemm.linear_input_grad(dx, dy, mlp.gate_up().weight(), shape, s)?;
        Self::sum(self.group(), (dx.addr(), m * k), s)
    }

    fn groups(&self, steps: &[Step]) -> Vec<Vec<Step>> {
        groups(steps)
    }

    fn transfer(&mut self, group: &[Step], stage: &Stage, s: &Arc<CudaStream>) -> Result<()> {
        let Some(comms) = self.comms else {
            return Ok(()); // the compute alone: what would arrive is what arrived last
        };
        let at = self.at;
        let (before, after) = (at.s.wrapping_sub(1), at.s + 1);
        let peer = |stage: usize| at.pe(at.d, stage, at.t);
        let world = comms.world;
        world.group(|| {
            for &st in group {
                let buf = stage.transfer_buffer(st)?;
                let (addr, bytes) = (buf.addr(), buf.num_bytes());
                // SAFETY: the buffer holds `bytes` and outlives the step.
                unsafe {
                    match st {
                        Step::RecvActivation(_) => world.recv(addr, bytes, peer(before), s),
                        Step::SendActivation(_) => world.send(addr, bytes, peer(after), s),
                        Step::RecvGradient(_) => world.recv(addr, bytes, peer(after), s),
                        _ => world.send(addr, bytes, peer(before), s), // SendGradient
                    }?;
                }
            }
            Ok(())
        })
    }

    fn grad(&self, p: usize) -> View<'_> {
        self.sync.grad(p)
    }

    fn grad_ready(&mut self, p: usize, s: &Arc<CudaStream>) -> Result<()> {
        let Some(replicas) = self.replicas() else {
            return Ok(());
        };
        // Parameters are written last first: a bucket is whole once its first one is.
        let Some(bucket) = self.sync.buckets().into_iter().find(|b| b.start == p) else {
            return Ok(());
        };
        let (first, last) = (self.sync.grad(bucket.start), self.sync.grad(bucket.end - 1));
        let (start, end) = (first.addr(), last.addr() + last.num_bytes() as u64);
        let len = (end - start) as usize / std::mem::size_of::<bf16>();
        let side = self.sync.side_stream();
        side.join(s).cuda("cuStreamWaitEvent")?;
        Self::sum(Some(replicas), (start, len), side)
    }

    fn grads_done(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        // The side stream has work (and joins a capture) only where there are replicas.
        match self.replicas() {
            Some(_) => s.join(self.sync.side_stream()).cuda("cuStreamWaitEvent"),
            None => Ok(()),
        }
    }
}
