//! tp: small tensor-parallel layers called from a thread of their own, beside every other
//! role: a row-parallel layer with a replicated output and one with a sequence-parallel
//! output, and a sequence-parallel column layer, in the sequential schedule and, from
//! `FUSED_EXCHANGE_TOKENS` tokens per PE, the fused exchange.
//!
//! Inputs and weights are -1, 0 or 1 and no sum has more than [`TP_IN`] terms, so every sum
//! is an integer that bf16 holds exactly, whatever order the GEMMs and the reduction take:
//! every output is checked bit for bit against the CPU's product.

use crate::common::{hash, TAG_TP};
use crate::outcome::{fail, same, Fail, Outcome};
use crate::roles::{Env, Worker};
use crate::stream_copy::{download, upload};
use crate::tally::Kind;
use nvshmem::cudarc::driver::result as cu;
use nvshmem::tp::{
    shard_range, take_cols, ColumnInput, ColumnParallelLinear, RowOutput, RowParallelLinear,
    Schedule, TensorParallel, FUSED_EXCHANGE_TOKENS,
};
use nvshmem::SymmetricView;
use nvshmem::{bf16, Collectives, CollectivesConfig, CudaStream, Nvshmem, ReduceOp};
use nvshmem::{AllReduceAlgo, SymmetricBuffer};
use std::sync::Arc;

/// Input features of every layer (the most terms of a sum: outputs stay exact in bf16).
pub(crate) const TP_IN: usize = 128;
/// Output features of every layer.
pub(crate) const TP_OUT: usize = 64;
/// Every this many calls, the tp threads vote on stopping.
const TP_VOTE_EVERY: u64 = 8;
/// Elements from the vote's source to its destination: 16 bytes, the alignment that
/// collectives ask of their buffers.
const VOTE_STRIDE: usize = 4;

/// The layers and their buffers, built before the threads start.
pub(crate) struct TpWorld {
    group: TensorParallel,
    row: RowParallelLinear,
    row_seq: RowParallelLinear,
    col_seq: ColumnParallelLinear,
    /// Every layer's whole weight, `TP_OUT × TP_IN` (the row layers share one).
    w_row: Vec<bf16>,
    w_col: Vec<bf16>,
    /// The most tokens of a call (all PEs' together).
    max_tokens: usize,
    x: SymmetricBuffer<bf16>,
    y: SymmetricBuffer<bf16>,
    vote: SymmetricBuffer<i32>,
}

/// A weight of -1, 0 and 1, the same on every PE.
fn weight(seed: u64, which: u64) -> Vec<bf16> {
    (0..TP_OUT * TP_IN)
        .map(|i| ternary(hash(seed, &[TAG_TP, which, i as u64])))
        .collect()
}

fn ternary(h: u64) -> bf16 {
    bf16::from_f32((h % 3) as f32 - 1.0)
}

impl TpWorld {
    /// The layers over a `Collectives` of their own, capped at `max_blocks` like the shared
    /// one (collective).
    pub(crate) fn build(
        shmem: &Nvshmem,
        seed: u64,
        config: CollectivesConfig,
    ) -> nvshmem::Result<Self> {
        let n = shmem.n_pes();
        let group = TensorParallel::with_collectives(
            shmem,
            Arc::new(Collectives::with_config(shmem, config)?),
        )?;
        let max_tokens = FUSED_EXCHANGE_TOKENS * n;
        let row = RowParallelLinear::new(&group, TP_IN, TP_OUT, max_tokens)?;
        let row_seq = RowParallelLinear::with_output(
            &group,
            TP_IN,
            TP_OUT,
            RowOutput::SequenceParallel,
            max_tokens,
        )?;
        let col_seq = ColumnParallelLinear::new(
            &group,
            TP_IN,
            TP_OUT,
            ColumnInput::SequenceParallel,
            max_tokens,
        )?;
        let (w_row, w_col) = (weight(seed, 0), weight(seed, 1));
        row.load_weight(&w_row)?;
        row_seq.load_weight(&w_row)?;
        col_seq.load_weight(&w_col)?;
        Ok(TpWorld {
            x: shmem.malloc(max_tokens * TP_IN)?,
            y: shmem.malloc(max_tokens * TP_OUT)?,
            vote: shmem.malloc(2 * VOTE_STRIDE)?,
            group,
            row,
            row_seq,
            col_seq,
            w_row,
            w_col,
            max_tokens,
        })
    }

    /// Free the buffers (the layers go with the value); the first error.
    pub(crate) fn tear_down(self) -> nvshmem::Result<()> {
        let TpWorld { x, y, vote, .. } = self;
        x.free().and(y.free()).and(vote.free())
    }
}

/// Which layer a call goes through.
#[derive(Clone, Copy, Debug)]
enum Layer {
    Row,
    RowSequence,
    ColumnSequence,
}

/// One call, drawn alike on every PE.
struct TpCall {
    layer: Layer,
    tokens: usize,
    schedule: Schedule,
    /// Every token's input features, `tokens × TP_IN`.
    x: Vec<bf16>,
}

impl TpCall {
    fn draw(env: &Env, tp: &TpWorld, i: u64) -> Self {
        let n = env.n;
        let h = |part: u64| hash(env.seed, &[TAG_TP, 2, i, part]);
        let layer = [Layer::Row, Layer::RowSequence, Layer::ColumnSequence][(h(0) % 3) as usize];
        // Tokens that every PE shares equally where the layer needs it; now and then enough
        // for the fused exchange.
        let fused = h(1) % 4 == 0 && n > 1;
        let tokens = match (fused, layer) {
            (true, _) => tp.max_tokens,
            (false, Layer::Row) => [1, 5, 16][(h(2) % 3) as usize],
            (false, _) => n * [1, 3, 8][(h(2) % 3) as usize],
        };
        let schedule = if fused {
            Schedule::Fused
        } else {
            Schedule::Sequential
        };
        let x = (0..tokens * TP_IN)
            .map(|j| ternary(hash(env.seed, &[TAG_TP, 3, i, j as u64])))
            .collect();
        TpCall {
            layer,
            tokens,
            schedule,
            x,
        }
    }

    /// `x · wᵀ`, `tokens × TP_OUT`, exact.
    fn product(&self, w: &[bf16]) -> Vec<bf16> {
        let mut y = Vec::with_capacity(self.tokens * TP_OUT);
        for t in 0..self.tokens {
            let row = &self.x[t * TP_IN..(t + 1) * TP_IN];
            for o in 0..TP_OUT {
                let terms = row.iter().zip(&w[o * TP_IN..(o + 1) * TP_IN]);
                y.push(bf16::from_f32(
                    terms.map(|(a, b)| a.to_f32() * b.to_f32()).sum(),
                ));
            }
        }
        y
    }
}

pub(crate) fn tp_layers(w: &Worker) {
    let env = w.env;
    let Some(tp) = env.world.tp.as_ref() else {
        return;
    };
    let Some(stream) = w.new_stream() else {
        return;
    };
    for i in 0u64.. {
        if i % TP_VOTE_EVERY == TP_VOTE_EVERY - 1 {
            w.doing(format!("tp call {i}: the stop vote"));
            let vote = vote(w, tp, &stream);
            let stop = !matches!(vote, Ok(false));
            w.record(Kind::Vote, vote.map(|_| ()));
            if stop {
                break;
            }
            continue;
        }
        let call = TpCall::draw(env, tp, i);
        w.doing(format!(
            "tp call {i}: {:?}, {} tokens, {:?}",
            call.layer, call.tokens, call.schedule
        ));
        let outcome = make_call(env, tp, &stream, &call).map_err(|e| {
            Fail(format!(
                "tp call {i} ({:?}, {} tokens): {}",
                call.layer, call.tokens, e.0
            ))
        });
        // A call that failed on this PE leaves the others waiting for it: stop here, as
        // they will once their bound runs out.
        if !w.record(Kind::Tp, outcome) {
            break;
        }
    }
}

/// Whether any PE's time is up: an all-reduce (max) through the layers' `Collectives`.
fn vote(w: &Worker, tp: &TpWorld, stream: &Arc<CudaStream>) -> Outcome<bool> {
    let coll = tp.group.collectives();
    let result = tp.vote.view(VOTE_STRIDE..VOTE_STRIDE + 1);
    upload(stream, tp.vote.view(..1), &[i32::from(w.time_up())])?;
    coll.all_reduce(
        result,
        tp.vote.view(..1),
        ReduceOp::Max,
        AllReduceAlgo::Auto,
        stream,
    )?;
    let got = download(stream, result)?[0];
    coll.check()?;
    match got {
        0 => Ok(false),
        1 => Ok(true),
        other => fail(format!("the tp vote (max of 0s and 1s) gave {other}")),
    }
}

/// Upload this PE's part of the input, call the layer on `stream`, and check its output.
fn make_call(env: &Env, tp: &TpWorld, stream: &Arc<CudaStream>, call: &TpCall) -> Outcome {
    let (me, n, tokens) = (env.me, env.n, call.tokens);
    let mine = shard_range(tokens, me, n);
    match call.layer {
        Layer::Row | Layer::RowSequence => {
            let layer = match call.layer {
                Layer::Row => &tp.row,
                _ => &tp.row_seq,
            };
            let cols = layer.local_in_features();
            let x = take_cols(&call.x, TP_IN, cols.clone());
            upload_bf16(stream, tp.x.view(..x.len()), &x)?;
            let whole = call.product(&tp.w_row);
            let (want, y_len) = match call.layer {
                Layer::Row => (whole, tokens * TP_OUT),
                _ => (
                    whole[mine.start * TP_OUT..mine.end * TP_OUT].to_vec(),
                    mine.len() * TP_OUT,
                ),
            };
            let x_view = tp.x.view(..x.len());
            layer.forward_with(tp.y.view(..y_len), &x_view, call.schedule, stream)?;
            let got = download_bf16(stream, tp.y.view(..y_len))?;
            tp.group.collectives().check()?;
            same("the row-parallel output", &got, &bits(&want))
        }
        Layer::ColumnSequence => {
            let layer = &tp.col_seq;
            let x = &call.x[mine.start * TP_IN..mine.end * TP_IN];
            upload_bf16(stream, tp.x.view(..x.len()), x)?;
            let local = layer.local_out_features();
            let outs = shard_range(TP_OUT, me, n);
            let whole = call.product(&tp.w_col);
            let want = take_cols(&whole, TP_OUT, outs);
            let y = tp.y.view(..tokens * local);
            layer.forward_with(&y, tp.x.view(..x.len()), call.schedule, stream)?;
            let got = download_bf16(stream, tp.y.view(..tokens * local))?;
            same("the column-parallel output", &got, &bits(&want))
        }
    }
}

fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// [`upload`] of bf16 values, as their bits (cudarc copies bf16 only with its `f16` feature).
fn upload_bf16(stream: &Arc<CudaStream>, view: SymmetricView<'_, bf16>, data: &[bf16]) -> Outcome {
    assert_eq!(view.len(), data.len());
    // SAFETY: `view` holds `data.len()` elements of 2 bytes; the copy is waited for.
    unsafe { cu::memcpy_htod_async(view.as_ptr() as u64, &bits(data), stream.cu_stream()) }?;
    stream.synchronize()?;
    Ok(())
}

/// [`download`] of bf16 values, as their bits.
fn download_bf16(stream: &Arc<CudaStream>, view: SymmetricView<'_, bf16>) -> Outcome<Vec<u16>> {
    let mut out = vec![0u16; view.len()];
    stream.synchronize()?;
    // SAFETY: `view` holds `out.len()` elements of 2 bytes; the copy is waited for.
    unsafe { cu::memcpy_dtoh_async(&mut out, view.as_ptr() as u64, stream.cu_stream()) }?;
    stream.synchronize()?;
    Ok(out)
}
