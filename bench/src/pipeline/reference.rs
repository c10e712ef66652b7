//! What a stage must compute: every stage of the pipeline run one after the other on this
//! GPU (the single-GPU run the pipeline must equal, bit for bit), and a check of one block's
//! forward and backward against the CPU.

use super::block::{Block, Kernels, Lt};
use super::Shape;
use crate::data::{self, Mismatch};
use crate::error::{BenchError, Result};
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem::{DeviceBuffer, Nvshmem};
use std::sync::Arc;

/// Data key of the step's inputs (`data::key`).
const K_INPUT: u64 = 52;

/// One stage's part of the single-GPU run: what it receives, kept on the GPU (the `local`
/// transport hands these over in place of a neighbour), and what it must produce, on the
/// host.
pub struct Expected {
    /// The stage's input for each micro-batch (stage 0: the step's inputs).
    pub act_in: Vec<DeviceBuffer<bf16>>,
    /// The gradient of the stage's output for each micro-batch (empty on the last stage,
    /// which takes its own output).
    pub grad_in: Vec<DeviceBuffer<bf16>>,
    /// The stage's outputs, micro-batch after micro-batch.
    pub y: Vec<bf16>,
    /// The gradients of the stage's inputs, micro-batch after micro-batch.
    pub gx: Vec<bf16>,
    pub dw1: Vec<bf16>,
    pub dw2: Vec<bf16>,
}

fn buffers(shmem: &Nvshmem, count: usize, len: usize) -> Result<Vec<DeviceBuffer<bf16>>> {
    (0..count)
        .map(|_| Ok(shmem.alloc_device::<bf16>(len)?))
        .collect()
}

/// Micro-batch after micro-batch, on the host.
pub fn download(bufs: &[DeviceBuffer<bf16>]) -> Result<Vec<bf16>> {
    let mut out = Vec::new();
    for b in bufs {
        out.extend(b.to_vec()?);
    }
    Ok(out)
}

/// Run every block of `blocks` (stage after stage) forward over the step's micro-batches,
/// then backward from the last stage to the first, micro-batch after micro-batch: the order
/// in which 1F1B sums each stage's weight gradients. Returns stage `me`'s part.
#[allow(clippy::too_many_arguments)]
pub fn single_gpu(
    shmem: &Nvshmem,
    kernels: &Kernels,
    lt: &Lt,
    stream: &Arc<CudaStream>,
    blocks: &mut [Block],
    me: usize,
    shape: Shape,
    seed: u64,
) -> Result<Expected> {
    let (p, mb, m) = (blocks.len(), shape.micro_batches, shape.tokens);
    let (h, f) = (shape.hidden, shape.ffn);
    // xs[s][i]: stage s's input of micro-batch i (xs[p]: the last stage's outputs); gs[s][i]
    // the gradient of xs[s][i].
    let mut xs: Vec<Vec<DeviceBuffer<bf16>>> = Vec::with_capacity(p + 1);
    for _ in 0..=p {
        xs.push(buffers(shmem, mb, m * h)?);
    }
    for (i, x) in xs[0].iter().enumerate() {
        let key = data::key(seed, &[K_INPUT, m as u64, i as u64]);
        kernels.fill(x, key, 1.0, stream)?;
    }
    let mut acts: Vec<Vec<DeviceBuffer<bf16>>> = Vec::with_capacity(p);
    for _ in 0..p {
        acts.push(buffers(shmem, mb, m * f)?);
    }
    for i in 0..mb {
        for s in 0..p {
            let (before, after) = xs.split_at_mut(s + 1);
            blocks[s].forward(lt, m, &before[s][i], &mut acts[s][i], &mut after[0][i])?;
        }
    }
    let mut gs: Vec<Vec<DeviceBuffer<bf16>>> = Vec::with_capacity(p);
    for _ in 0..p {
        gs.push(buffers(shmem, mb, m * h)?);
    }
    let mut ga = shmem.alloc_device::<bf16>(m * f)?;
    for b in blocks.iter_mut() {
        b.zero_grads(stream)?;
    }
    for i in 0..mb {
        for s in (0..p).rev() {
            let (lower, upper) = gs.split_at_mut(s + 1);
            let gy = match upper.first() {
                Some(g) => &g[i],
                None => &xs[p][i], // the loss |y|²/2: the gradient of y is y
            };
            blocks[s].backward(
                lt,
                kernels,
                m,
                gy,
                &xs[s][i],
                &acts[s][i],
                &mut ga,
                &mut lower[s][i],
            )?;
        }
    }
    stream
        .synchronize()
        .map_err(|e| BenchError::cuda("cuStreamSynchronize", e))?;
    let expected = Expected {
        y: download(&xs[me + 1])?,
        gx: download(&gs[me])?,
        dw1: blocks[me].dw1.to_vec()?,
        dw2: blocks[me].dw2.to_vec()?,
        act_in: std::mem::take(&mut xs[me]),
        grad_in: match me + 1 < p {
            true => std::mem::take(&mut gs[me + 1]),
            false => Vec::new(),
        },
    };
    Ok(expected)
}

/// One block's forward and backward for `m` tokens against the CPU, each product computed
/// in f64 from the GPU's own operands (so that one rounding is compared, not a chain):
/// `None` when every output is within bf16's rounding, else what differs.
pub fn check_block_on_cpu(
    shmem: &Nvshmem,
    kernels: &Kernels,
    lt: &Lt,
    stream: &Arc<CudaStream>,
    block: &mut Block,
    m: usize,
    seed: u64,
) -> Result<Option<String>> {
    let (h, f) = (block.hidden, block.ffn);
    let x = shmem.alloc_device::<bf16>(m * h)?;
    kernels.fill(&x, data::key(seed, &[K_INPUT, 0xc0, m as u64]), 1.0, stream)?;
    let mut a = shmem.alloc_device::<bf16>(m * f)?;
    let mut y = shmem.alloc_device::<bf16>(m * h)?;
    let mut ga = shmem.alloc_device::<bf16>(m * f)?;
    let mut gx = shmem.alloc_device::<bf16>(m * h)?;
    block.zero_grads(stream)?;
    block.forward(lt, m, &x, &mut a, &mut y)?;
    // The gradient of y is y (the loss |y|²/2).
    block.backward(lt, kernels, m, &y, &x, &a, &mut ga, &mut gx)?;
    stream
        .synchronize()
        .map_err(|e| BenchError::cuda("cuStreamSynchronize", e))?;
    let get = |b: &DeviceBuffer<bf16>| -> Result<Vec<f64>> {
        Ok(b.to_vec()?.into_iter().map(f64::from).collect())
    };
    let (w1, w2) = block.weights();
    let (w1, w2, xv, av, yv) = (get(w1)?, get(w2)?, get(&x)?, get(&a)?, get(&y)?);
    let gav = get(&ga)?;
    let dot = |u: &[f64], v: &[f64]| u.iter().zip(v).map(|(p, q)| p * q).sum::<f64>();
    let mut a_exp = vec![0.0; m * f];
    let mut y_exp = vec![0.0; m * h];
    let mut ga_exp = vec![0.0; m * f];
    let mut gx_exp = vec![0.0; m * h];
    let mut dw1_exp = vec![0.0; f * h];
    let mut dw2_exp = vec![0.0; h * f];
    for t in 0..m {
        let (xt, at, yt, gat) = (
            &xv[t * h..][..h],
            &av[t * f..][..f],
            &yv[t * h..][..h],
            &gav[t * f..][..f],
        );
        for j in 0..f {
            a_exp[t * f + j] = dot(xt, &w1[j * h..][..h]).max(0.0);
        }
        for j in 0..h {
            y_exp[t * h + j] = xt[j] + dot(at, &w2[j * f..][..f]);
        }
        // ga = (gy · w2) ⊙ [a > 0] with gy = y; gx = gy + ga · w1.
        for j in 0..f {
            let s: f64 = (0..h).map(|k| yt[k] * w2[k * f + j]).sum();
            ga_exp[t * f + j] = if at[j] > 0.0 { s } else { 0.0 };
        }
        for k in 0..h {
            let s: f64 = (0..f).map(|j| gat[j] * w1[j * h + k]).sum();
            gx_exp[t * h + k] = yt[k] + s;
        }
        for j in 0..h {
            for q in 0..f {
                dw2_exp[j * f + q] += yt[j] * at[q];
            }
        }
        for j in 0..f {
            for k in 0..h {
                dw1_exp[j * h + k] += gat[j] * xt[k];
            }
        }
    }
    let (dw1, dw2) = (block.dw1.to_vec()?, block.dw2.to_vec()?);
    let to_bf16 = |v: &[f64]| -> Vec<bf16> { v.iter().map(|&e| bf16::from_f64(e)).collect() };
    // bf16 keeps 8 bits: each output is one rounding of a sum formed in f32 (the gradient
    // sums of several tokens are rounded once per token), well inside 2^-6.
    let rel = 1.0 / 64.0;
    let checks: [(&str, Vec<bf16>, &[f64]); 6] = [
        ("a", a.to_vec()?, &a_exp),
        ("y", y.to_vec()?, &y_exp),
        ("ga", ga.to_vec()?, &ga_exp),
        ("gx", gx.to_vec()?, &gx_exp),
        ("dw1", dw1, &dw1_exp),
        ("dw2", dw2, &dw2_exp),
    ];
    for (name, got, want) in checks {
        let mismatch: Mismatch = data::compare_close(&got, &to_bf16(want), rel);
        if mismatch.count > 0 {
            return Ok(Some(format!(
                "the block's {name} disagrees with the CPU for {m} token(s): {}",
                mismatch.describe()
            )));
        }
    }
    Ok(None)
}
