//! The MLP half of a Llama 8B decoder layer (hidden 4096, ffn 14336, sharded over the PEs),
//! with and without the fused all-reduce + residual + RMSNorm, for 1 to 64 tokens:
//! - `mlp+fused`: `TpMlp::forward_rmsnorm`;
//! - `mlp, rmsnorm`: `TpMlp::forward` (in `Schedule::Auto`), then `TensorParallel::rmsnorm`;
//! - `mlp`: `TpMlp::forward` alone.
//!
//! After the timed replays each runs once from a fresh residual. `mlp+fused` must equal the
//! MLP's sequential forward (the same GEMMs and all-reduce) then `rmsnorm`, bit for bit;
//! `mlp, rmsnorm` and `mlp` may take other paths (the fused decode kernel) and must be within
//! 2^-6 of it (of magnitude plus RMS).

use super::{Ctx, EPS, K_NORM};
use crate::data::{self, Mismatch};
use crate::error::{CudaExt, Guard, Result};
use crate::report::{Record, Results};
use crate::stats;
use crate::timing::{self, Timer};
use half::bf16;
use nvshmem::tp::{MlpShape, Schedule, TensorParallel, TpMlp};
use nvshmem::{DeviceBuffer, SymmetricBuffer};

/// The rows' `test`, shape and token counts.
pub const BLOCK_TEST: &str = "norm-block";
pub const SHAPE: (usize, usize) = (4096, 14336);
pub const TOKENS: [usize; 4] = [1, 4, 16, 64];

/// The implementations, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockImpl {
    Fused,
    Apart,
    MlpOnly,
}

impl BlockImpl {
    pub const ALL: [BlockImpl; 3] = [BlockImpl::Fused, BlockImpl::Apart, BlockImpl::MlpOnly];

    pub fn name(self) -> &'static str {
        match self {
            BlockImpl::Fused => "mlp+fused",
            BlockImpl::Apart => "mlp, rmsnorm",
            BlockImpl::MlpOnly => "mlp",
        }
    }
}

struct Buffers {
    x: DeviceBuffer<bf16>,
    out: Guard<SymmetricBuffer<bf16>>,
    residual: DeviceBuffer<bf16>,
    start: Vec<bf16>,
    weight: DeviceBuffer<bf16>,
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results, tp: &TensorParallel) -> Result<()> {
    let (hidden, ffn) = SHAPE;
    if ffn % ctx.shmem.n_pes() != 0 {
        results.notes.push(format!(
            "norm: the MLP block is skipped: {ffn} FFN features do not split over {} PEs",
            ctx.shmem.n_pes()
        ));
        return Ok(());
    }
    timing::step("norm: loading the MLP block's weights");
    let max_tokens = *TOKENS.iter().max().unwrap_or(&1);
    let mlp = Guard::new(TpMlp::new(
        tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens,
        },
    )?);
    let key = |part: u64| data::key(ctx.cfg.seed, &[K_NORM, 0xb10c, part]);
    let scale = |k: usize| 1.0 / (k as f32).sqrt();
    let gate = data::uniform_bf16(key(1), ffn * hidden, scale(hidden), ctx.threads);
    let up = data::uniform_bf16(key(2), ffn * hidden, scale(hidden), ctx.threads);
    let down = data::uniform_bf16(key(3), hidden * ffn, scale(ffn), ctx.threads);
    mlp.load_weights(&gate, &up, &down)?;
    drop((gate, up, down));
    let weight: Vec<bf16> = data::uniform_bf16(key(4), hidden, 0.5, ctx.threads)
        .iter()
        .map(|w| bf16::from_f32(1.0 + w.to_f32()))
        .collect();
    for tokens in TOKENS {
        let n = tokens * hidden;
        let b = Buffers {
            x: ctx.shmem.alloc_device::<bf16>(n)?,
            out: Guard::new(ctx.shmem.malloc::<bf16>(n)?),
            residual: ctx.shmem.alloc_device::<bf16>(n)?,
            start: data::uniform_bf16(key(10 + tokens as u64), n, 1.0, ctx.threads),
            weight: ctx.shmem.alloc_device::<bf16>(hidden)?,
        };
        b.x.copy_from_host(&data::uniform_bf16(
            key(100 + tokens as u64),
            n,
            1.0,
            ctx.threads,
        ))?;
        b.weight.copy_from_host(&weight)?;
        let want = expected(ctx, tp, &mlp, &b)?;
        for imp in BlockImpl::ALL {
            results.push(measure(ctx, timer, tp, &mlp, &b, imp, &want)?);
        }
        let said: Vec<String> = results.records[results.records.len() - 3..]
            .iter()
            .map(|r| {
                let t = r.median_us().map_or("-".into(), |t| format!("{t:.2}us"));
                format!("{} {t} {}", r.implementation, r.check)
            })
            .collect();
        ctx.progress.say(format!(
            "norm MLP block, {tokens} tokens: {}",
            said.join(", ")
        ));
    }
    Ok(())
}

/// The sequential forward, then `rmsnorm`, from a fresh residual: (the MLP's output, the
/// new residual, the normalised output).
fn expected(
    ctx: &Ctx,
    tp: &TensorParallel,
    mlp: &TpMlp,
    b: &Buffers,
) -> Result<(Vec<bf16>, Vec<bf16>, Vec<bf16>)> {
    let s = ctx.stream;
    b.residual.copy_from_host(&b.start)?;
    mlp.forward_with(&*b.out, &b.x, Schedule::Sequential, s)?;
    s.synchronize().cuda("cuStreamSynchronize")?;
    let y = b.out.to_vec()?;
    tp.rmsnorm(&*b.out, &b.residual, &*b.out, &b.weight, EPS, s)?;
    s.synchronize().cuda("cuStreamSynchronize")?;
    Ok((y, b.residual.to_vec()?, b.out.to_vec()?))
}

fn call(ctx: &Ctx, tp: &TensorParallel, mlp: &TpMlp, b: &Buffers, imp: BlockImpl) -> Result<()> {
    let s = ctx.stream;
    match imp {
        BlockImpl::Fused => mlp.forward_rmsnorm(&*b.out, &b.residual, &b.x, &b.weight, EPS, s)?,
        BlockImpl::Apart => {
            mlp.forward(&*b.out, &b.x, s)?;
            tp.rmsnorm(&*b.out, &b.residual, &*b.out, &b.weight, EPS, s)?;
        }
        BlockImpl::MlpOnly => mlp.forward(&*b.out, &b.x, s)?,
    }
    Ok(())
}

fn measure(
    ctx: &Ctx,
    timer: &mut Timer,
    tp: &TensorParallel,
    mlp: &TpMlp,
    b: &Buffers,
    imp: BlockImpl,
    (want_y, want_r, want_out): &(Vec<bf16>, Vec<bf16>, Vec<bf16>),
) -> Result<Record> {
    let tokens = b.x.len() / SHAPE.0;
    timing::step(format!("norm: MLP block {} {tokens} tokens", imp.name()));
    let check = || -> Result<Mismatch> {
        let (out, r) = (b.out.to_vec()?, b.residual.to_vec()?);
        // The residual first, then the output (or the MLP's output alone).
        let first = |m: Mismatch, then: &dyn Fn() -> Mismatch| if m.count > 0 { m } else { then() };
        Ok(match imp {
            BlockImpl::Fused => first(data::compare_elems(&r, want_r), &|| {
                data::compare_elems(&out, want_out)
            }),
            BlockImpl::Apart => first(data::compare_close(&r, want_r, 1.0 / 64.0), &|| {
                data::compare_close(&out, want_out, 1.0 / 64.0)
            }),
            BlockImpl::MlpOnly => data::compare_close(&out, want_y, 1.0 / 64.0),
        })
    };
    let (samples, status, check) = super::time_and_check(
        ctx,
        timer,
        tokens * SHAPE.0 * 2,
        || Ok(b.residual.copy_from_host(&b.start)?),
        || call(ctx, tp, mlp, b, imp),
        check,
    )?;
    Ok(Record {
        test: BLOCK_TEST.into(),
        variant: format!("8b MLP, hidden {}, ffn {}", SHAPE.0, SHAPE.1),
        implementation: imp.name().into(),
        mode: "graph".into(),
        dtype: "bf16".into(),
        bytes: tokens * SHAPE.0 * 2,
        count: tokens,
        n_pes: ctx.shmem.n_pes(),
        time_us: stats::summarize(&samples),
        algbw_gbs: None,
        busbw_gbs: None,
        status,
        check,
        tp: None,
        pipeline: None,
        hybrid: None,
    })
}
