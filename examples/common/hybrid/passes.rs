//! The hybrid example's passes over a stage: forward and backward one micro-batch at a time,
//! and the weight gradients once a step over every micro-batch, communicating through a
//! [`Comm`]. The loss is `|y|² / 2` on the last stage's output, so the output's gradient is
//! the output.

use super::comm::Comm;
use super::{Stage, EPS};
use nvshmem::cudarc::driver::CudaStream;
use nvshmem::pipeline::Step;
use nvshmem::{bf16, SymmetricView};
use std::sync::Arc;

impl Stage {
    /// Micro-batch `j` through the stage, from [`input`](Stage::input) to
    /// [`output`](Stage::output), keeping what the backward pass needs.
    pub fn forward<C: Comm>(
        &self,
        j: usize,
        c: &mut C,
        s: &Arc<CudaStream>,
    ) -> Result<(), C::Error> {
        let (tp, hid, t) = (&self.tp, self.z.hidden, self.z.tokens);
        let row = |buf, cols| self.rows(buf, j, cols);
        tp.rmsnorm(
            &row(&self.h[0], hid),
            &row(&self.r[0], hid),
            &self.zeros,
            &self.norms[0],
            EPS,
            s,
        )?;
        for (b, mlp) in self.blocks.iter().enumerate() {
            let fl = mlp.down().local_in_features().len();
            mlp.gate_up()
                .forward(&row(&self.gu[b], 2 * fl), row(&self.h[b], hid), s)?;
            tp.silu_mul(&row(&self.act[b], fl), &row(&self.gu[b], 2 * fl), t, s)?;
            let (next, me) = (row(&self.r[b + 1], hid), tp.runtime().my_pe());
            tp.runtime()
                .put_on_stream(next, row(&self.r[b], hid), me, s)?;
            let (h, act) = (row(&self.h[b + 1], hid), row(&self.act[b], fl));
            c.down_rmsnorm(mlp, (h, &next, &act), &self.norms[b + 1], s)?;
        }
        Ok(())
    }

    /// Micro-batch `j`'s backward pass from `dout` (the gradient of its output); the
    /// gradient of its input is in [`dr`](Self::dr) after.
    pub fn backward<C: Comm>(
        &self,
        j: usize,
        dout: SymmetricView<'_, bf16>,
        c: &mut C,
        s: &Arc<CudaStream>,
    ) -> Result<(), C::Error> {
        let (tp, hid, t, me) = (
            &self.tp,
            self.z.hidden,
            self.z.tokens,
            self.tp.runtime().my_pe(),
        );
        let row = |buf, cols| self.rows(buf, j, cols);
        tp.runtime().put_on_stream(&self.dr, dout, me, s)?;
        for (b, mlp) in self.blocks.iter().enumerate().rev() {
            let (fl, dy) = (mlp.down().local_in_features().len(), row(&self.dy[b], hid));
            tp.runtime().put_on_stream(dy, &self.dr, me, s)?;
            mlp.down().input_grad(&self.da, &dy, s)?;
            let dgu = row(&self.dgu[b], 2 * fl);
            tp.silu_mul_backward(&dgu, &self.da, &row(&self.gu[b], 2 * fl), t, s)?;
            c.gate_up_input_grad(mlp, &self.dh, &dgu, s)?;
            tp.rmsnorm_backward(
                &self.dr,
                &self.dh,
                &row(&self.r[b], hid),
                &self.norms[b],
                EPS,
                s,
            )?;
        }
        Ok(())
    }

    /// Every block's weight gradients over every micro-batch into `c`'s gradients
    /// (parameter `p`: block `p / 2`'s gate/up, then its down projection), each made ready,
    /// last first, so that its sum over the replicas starts under the GEMMs after it.
    pub fn weight_grads<C: Comm>(&self, c: &mut C, s: &Arc<CudaStream>) -> Result<(), C::Error> {
        for (b, mlp) in self.blocks.iter().enumerate().rev() {
            mlp.down()
                .weight_grad(&c.grad(2 * b + 1), &self.dy[b], &self.act[b], s)?;
            c.grad_ready(2 * b + 1, s)?;
            mlp.gate_up()
                .weight_grad(&c.grad(2 * b), &self.dgu[b], &self.h[b], s)?;
            c.grad_ready(2 * b, s)?;
        }
        Ok(())
    }

    /// This stage's part of a step: `steps` (its 1F1B order) with their transfers through
    /// `c`, then the weight gradients, summed over the replicas.
    pub fn run_schedule<C: Comm>(
        &self,
        steps: &[Step],
        c: &mut C,
        s0: &Arc<CudaStream>,
    ) -> Result<(), C::Error> {
        for group in c.groups(steps) {
            match group[..] {
                [Step::Forward(j)] => self.forward(j, c, s0)?,
                [Step::Backward(j)] => self.backward(j, self.output(j), c, s0)?,
                _ => c.transfer(&group, self, s0)?,
            }
        }
        self.weight_grads(c, s0)?;
        c.grads_done(s0)
    }

    /// The single-GPU run of a step: `micro_batches` forward, then backward, then the weight
    /// gradients into `c`.
    pub fn run_alone<C: Comm>(
        &self,
        micro_batches: usize,
        c: &mut C,
        s0: &Arc<CudaStream>,
    ) -> Result<(), C::Error> {
        for k in 0..micro_batches {
            self.forward(k, c, s0)?;
        }
        for k in 0..micro_batches {
            self.backward(k, self.output(k), c, s0)?;
        }
        self.weight_grads(c, s0)?;
        c.grads_done(s0)
    }
}
