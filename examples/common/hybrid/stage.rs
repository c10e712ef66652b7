//! One pipeline stage of the hybrid example: Llama-like MLP blocks `r += mlp(rmsnorm(r) · γ)`
//! sharded over a tensor-parallel group, and what each micro-batch keeps for the backward
//! pass (the passes are in passes.rs, what they communicate through in comm.rs). Included
//! with `#[path]`.

use nvshmem::pipeline::Step;
use nvshmem::tp::{MlpShape, TensorParallel, TpMlp};
use nvshmem::{bf16, Error, Nvshmem, Result, SymmetricBuffer, SymmetricView};

#[path = "comm.rs"]
pub mod comm;
#[path = "passes.rs"]
mod passes;

pub const EPS: f32 = 1e-5;

/// The model's sizes: `blocks` of `hidden` (FFN `ffn`), micro-batches of `tokens`.
#[derive(Clone, Copy)]
pub struct Sizes {
    pub hidden: usize,
    pub ffn: usize,
    pub tokens: usize,
}

/// A stage: its blocks, each micro-batch's activations kept for the backward pass (rows
/// `j × tokens ..` of every buffer hold micro-batch `j`), and their gradients.
pub struct Stage {
    pub tp: TensorParallel,
    pub blocks: Vec<TpMlp>,
    norms: Vec<SymmetricBuffer<bf16>>,
    z: Sizes,
    /// Per block: the residual before it (one more: the stage's output), its norm's output
    /// (one more: the norm after the last block, unused), the gate/up output, SiLU · up.
    pub r: Vec<SymmetricBuffer<bf16>>,
    h: Vec<SymmetricBuffer<bf16>>,
    gu: Vec<SymmetricBuffer<bf16>>,
    act: Vec<SymmetricBuffer<bf16>>,
    /// Per block: the gradients of its output and of its gate/up output; then scratch.
    dy: Vec<SymmetricBuffer<bf16>>,
    dgu: Vec<SymmetricBuffer<bf16>>,
    pub dr: SymmetricBuffer<bf16>,
    da: SymmetricBuffer<bf16>,
    dh: SymmetricBuffer<bf16>,
    zeros: SymmetricBuffer<bf16>,
}

impl Stage {
    /// `weights(b)`: block `b`'s full gate, up and down weights and its norm's γ (every PE
    /// passes the same; each keeps its shard). Collective over the world.
    pub fn new(
        shmem: &Nvshmem,
        tp: &TensorParallel,
        z: Sizes,
        micro_batches: usize,
        weights: impl Iterator<Item = (Vec<bf16>, Vec<bf16>, Vec<bf16>, Vec<bf16>)>,
    ) -> Result<Self> {
        let (mut blocks, mut norms) = (Vec::new(), Vec::new());
        for (gate, up, down, gamma) in weights {
            let shape = MlpShape {
                hidden: z.hidden,
                ffn: z.ffn,
                max_tokens: z.tokens,
            };
            let mlp = TpMlp::new(tp, shape)?;
            mlp.load_weights(&gate, &up, &down)?;
            blocks.push(mlp);
            norms.push(shmem.malloc::<bf16>(z.hidden)?);
            norms.last().unwrap().copy_from_host(&gamma)?;
        }
        let ones = shmem.malloc::<bf16>(z.hidden)?;
        ones.copy_from_host(&vec![bf16::ONE; z.hidden])?;
        norms.push(ones);
        let (nb, m) = (blocks.len(), micro_batches * z.tokens);
        let fl = blocks[0].down().local_in_features().len();
        let bufs = |count: usize, cols: usize| -> Result<Vec<SymmetricBuffer<bf16>>> {
            (0..count).map(|_| shmem.malloc::<bf16>(m * cols)).collect()
        };
        let one = |len: usize| shmem.calloc::<bf16>(len);
        Ok(Stage {
            tp: tp.clone(),
            norms,
            z,
            r: bufs(nb + 1, z.hidden)?,
            h: bufs(nb + 1, z.hidden)?,
            gu: bufs(nb, 2 * fl)?,
            act: bufs(nb, fl)?,
            dy: bufs(nb, z.hidden)?,
            dgu: bufs(nb, 2 * fl)?,
            dr: one(z.tokens * z.hidden)?,
            da: one(z.tokens * fl)?,
            dh: one(z.tokens * z.hidden)?,
            zeros: one(z.tokens * z.hidden)?,
            blocks,
        })
    }

    /// Micro-batch `j`'s rows of `buf`, `cols` a row.
    fn rows<'a>(
        &self,
        buf: &'a SymmetricBuffer<bf16>,
        j: usize,
        cols: usize,
    ) -> SymmetricView<'a, bf16> {
        let t = self.z.tokens;
        buf.view(j * t * cols..(j + 1) * t * cols)
    }

    /// The stage's input for micro-batch `j` (write it there first), and its output after
    /// [`forward`](Self::forward).
    pub fn input(&self, j: usize) -> SymmetricView<'_, bf16> {
        self.rows(&self.r[0], j, self.z.hidden)
    }
    pub fn output(&self, j: usize) -> SymmetricView<'_, bf16> {
        self.rows(&self.r[self.blocks.len()], j, self.z.hidden)
    }

    /// The buffer a transfer sends from or receives into: a micro-batch's input (activations
    /// in), its output (activations out, then the output's gradient in), and `dr` (the input's
    /// gradient out). A transport must not receive into an output while it sends from it.
    pub fn transfer_buffer(&self, step: Step) -> Result<SymmetricView<'_, bf16>> {
        match step {
            Step::RecvActivation(j) => Ok(self.input(j)),
            Step::SendActivation(j) | Step::RecvGradient(j) => Ok(self.output(j)),
            Step::SendGradient(_) => Ok(self.dr.view(..)),
            Step::Forward(_) | Step::Backward(_) => Err(Error::InvalidArgument(format!(
                "{step:?} is not a transfer"
            ))),
        }
    }

    /// The length of each parameter's gradient, in the order `weight_grads` takes them.
    pub fn param_lens(&self) -> Vec<usize> {
        let lens = |m: &TpMlp| [m.gate_up().weight().len(), m.down().weight().len()];
        self.blocks.iter().flat_map(lens).collect()
    }
}
