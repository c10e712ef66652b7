//! What a hybrid stage communicates through: the passes (passes.rs) call a [`Comm`] wherever
//! a sum over the tensor-parallel group, a hand-off between stages or a sum over the replicas
//! is due. [`Ours`] does them with our layers, channels and `GradientSync`; the bench swaps
//! in NCCL's calls, and none, to time the same passes.

use super::super::layout::Pipes;
use super::{Stage, EPS};
use nvshmem::cudarc::driver::CudaStream;
use nvshmem::pipeline::Step;
use nvshmem::tp::TpMlp;
use nvshmem::{bf16, Error, GradientSync, SymmetricBuffer, SymmetricView};
use std::sync::Arc;

/// A view of a stage's buffer: micro-batch rows, or a parameter's gradient.
pub type View<'a> = SymmetricView<'a, bf16>;

/// A stage's communication, within its group, between stages and over the replicas.
pub trait Comm {
    type Error: From<Error>;

    /// `residual += Σ over the group of act · w_downᵀ`, then `out = rmsnorm(residual) · gamma`
    /// (`bufs`: out, residual, act).
    fn down_rmsnorm(
        &mut self,
        mlp: &TpMlp,
        bufs: (View, &View, &View),
        gamma: &SymmetricBuffer<bf16>,
        s: &Arc<CudaStream>,
    ) -> Result<(), Self::Error>;

    /// `dx = Σ over the group of dy · w_gate_up`: the gate/up projection's input gradient.
    fn gate_up_input_grad(
        &mut self,
        mlp: &TpMlp,
        dx: &SymmetricBuffer<bf16>,
        dy: &View,
        s: &Arc<CudaStream>,
    ) -> Result<(), Self::Error>;

    /// A schedule's steps in the groups they are enqueued in: one each, unless the transport
    /// must start some transfers together.
    fn groups(&self, steps: &[Step]) -> Vec<Vec<Step>> {
        steps.iter().map(|&st| vec![st]).collect()
    }

    /// Enqueue `group`, transfers of `stage`'s buffers to and from its neighbours.
    fn transfer(
        &mut self,
        group: &[Step],
        stage: &Stage,
        s: &Arc<CudaStream>,
    ) -> Result<(), Self::Error>;

    /// Where parameter `p`'s gradient goes.
    fn grad(&self, p: usize) -> View<'_>;

    /// Parameter `p`'s gradient is written: its sum over the replicas may start.
    fn grad_ready(&mut self, p: usize, s: &Arc<CudaStream>) -> Result<(), Self::Error>;

    /// The stream goes on once every sum over the replicas is done.
    fn grads_done(&mut self, s: &Arc<CudaStream>) -> Result<(), Self::Error>;
}

/// Ours: the layers' all-reduces (the down projection's fused with the residual add and
/// RMSNorm), channels between stages (`pipes` and this PE's stage; none for the single-GPU
/// run), and `sync` over the replicas.
pub struct Ours<'a, 'c> {
    pub pipes: Option<(&'a Pipes, usize)>,
    pub sync: &'a mut GradientSync<'c, bf16>,
}

impl Comm for Ours<'_, '_> {
    type Error = Error;

    fn down_rmsnorm(
        &mut self,
        mlp: &TpMlp,
        (out, residual, act): (View, &View, &View),
        gamma: &SymmetricBuffer<bf16>,
        s: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        mlp.down()
            .forward_rmsnorm(out, residual, act, gamma, EPS, s)
    }

    fn gate_up_input_grad(
        &mut self,
        mlp: &TpMlp,
        dx: &SymmetricBuffer<bf16>,
        dy: &View,
        s: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        mlp.gate_up().input_grad(dx, dy, s)
    }

    fn transfer(
        &mut self,
        group: &[Step],
        stage: &Stage,
        s: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        let Some((pipes, at)) = self.pipes else {
            return Err(Error::InvalidArgument(
                "a stage alone has no neighbours".into(),
            ));
        };
        for &st in group {
            let mut buf = stage.transfer_buffer(st)?;
            match st {
                Step::RecvActivation(_) => pipes.between(at - 1).0.recv(&mut buf, s)?,
                Step::SendActivation(_) => pipes.between(at).0.send(&buf, s)?,
                Step::RecvGradient(_) => pipes.between(at).1.recv(&mut buf, s)?,
                _ => pipes.between(at - 1).1.send(&buf, s)?, // SendGradient
            }
        }
        Ok(())
    }

    fn grad(&self, p: usize) -> View<'_> {
        self.sync.grad(p)
    }

    fn grad_ready(&mut self, p: usize, s: &Arc<CudaStream>) -> Result<(), Error> {
        self.sync.ready(p, s)
    }

    fn grads_done(&mut self, s: &Arc<CudaStream>) -> Result<(), Error> {
        self.sync.wait(s)
    }
}
