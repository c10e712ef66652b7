//! The gradient sync of a model (`--tests gradsync`, after the compressed rows): a stack of
//! bf16 linear layers trained data-parallel as examples/data_parallel.rs trains it, on
//! `tokens` rows per PE, for each bucket size:
//! - `sync ours`: `GradientSync::sync`, every bucket at once (grouped launches), no GEMM;
//! - `sync nccl`: `ncclAllReduce` of each bucket, in one NCCL group, no GEMM;
//! - `compute`: the forward and backward GEMMs alone (cuBLASLt), no sync;
//! - `step ours`: the GEMMs, each layer's bucket summed on a side stream once its weight
//!   gradient is written (`GradientSync::ready`), the step ending when every sum is done;
//! - `step nccl`: the same schedule, each bucket by `ncclAllReduce` on a side stream;
//!
//! and once per model `one call`, our all-reduce of the whole gradient buffer at once (the
//! bandwidth a sync could reach). Exposed communication = step - compute.
//!
//! Our calls here run with `CollectivesConfig::max_blocks` = 32, as a sync beside other
//! kernels needs.
//!
//! Checked after the timed replays on every PE: `sync ours` and `step ours` must equal the
//! sum in PE order (in f32, rounded once) of every PE's gradients from `compute` bit for
//! bit, `compute` its own gradients, and NCCL's rows that sum within 2n bf16 roundings.

use super::Row;
use crate::data::{self, Mismatch};
use crate::error::{BenchError, CudaExt, Guard, Result};
use crate::norm::{time_and_check, Ctx};
use crate::report::{Record, Results};
use crate::timing::{self, Timer};
use cudarc::driver::CudaStream;
use cudarc::nccl::sys::ncclDataType_t;
use half::bf16;
use nvshmem::tp::{Gemm, LinearShape};
use nvshmem::SymmetricView;
use nvshmem::{AllReduceAlgo, DeviceBuffer, GradSyncConfig, GradientSync, ReduceOp};
use nvshmem::{Collectives, CollectivesConfig};
use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

/// The `test` of the rows.
pub const STEP_TEST: &str = "gradsync-step";
/// Data key (`data::key`).
const K_STEP: u64 = 74;
/// Blocks of our collectives' calls in these rows (`CollectivesConfig::max_blocks`).
pub const STEP_MAX_BLOCKS: usize = 32;

/// A model: its layers' (output, input) features, tokens per PE, and bucket sizes.
pub struct Model {
    pub name: &'static str,
    pub layers: Vec<(usize, usize)>,
    pub tokens: usize,
    pub buckets: &'static [usize],
}

/// The models of the rows: 2 M parameters (16 layers of 128 Ki, alternately 512 -> 256 and
/// 256 -> 512), and 50 M (12 layers of 2048 x 2048).
pub fn models() -> Vec<Model> {
    vec![
        Model {
            name: "2M",
            layers: (0..16)
                .map(|l| if l % 2 == 0 { (256, 512) } else { (512, 256) })
                .collect(),
            tokens: 1024,
            buckets: &[256 << 10, 1 << 20, 4 << 20],
        },
        Model {
            name: "50M",
            layers: vec![(2048, 2048); 12],
            tokens: 2048,
            buckets: &[1 << 20, 4 << 20, 25 << 20],
        },
    ]
}

impl Model {
    pub fn params(&self) -> usize {
        self.layers.iter().map(|(n, k)| n * k).sum()
    }
    fn shape(&self, l: usize) -> LinearShape {
        let (n, k) = self.layers[l];
        LinearShape {
            m: self.tokens,
            n,
            k,
        }
    }
}

/// One row's implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepImpl {
    SyncOurs,
    SyncNccl,
    OneCall,
    Compute,
    StepOurs,
    StepNccl,
}

impl StepImpl {
    pub const ALL: [StepImpl; 6] = [
        StepImpl::SyncOurs,
        StepImpl::SyncNccl,
        StepImpl::OneCall,
        StepImpl::Compute,
        StepImpl::StepOurs,
        StepImpl::StepNccl,
    ];
    pub fn name(self) -> &'static str {
        match self {
            StepImpl::SyncOurs => "sync ours",
            StepImpl::SyncNccl => "sync nccl",
            StepImpl::OneCall => "one call",
            StepImpl::Compute => "compute",
            StepImpl::StepOurs => "step ours",
            StepImpl::StepNccl => "step nccl",
        }
    }
    fn nccl(self) -> bool {
        matches!(self, StepImpl::SyncNccl | StepImpl::StepNccl)
    }
}

/// A model on this PE: the weights, the activations, the gradient of each layer's output
/// (the last one the loss gradient, fixed), the sync, NCCL's side stream and the buckets
/// as NCCL sums them, and the reference.
struct Run<'a> {
    model: &'a Model,
    gemm: Gemm,
    w: Vec<DeviceBuffer<bf16>>,
    acts: Vec<DeviceBuffer<bf16>>,
    dys: Vec<DeviceBuffer<bf16>>,
    sync: RefCell<GradientSync<'a, bf16>>,
    side: Arc<CudaStream>,
    /// Per bucket: its parameters, its first element's address and its length.
    spans: Vec<(Range<usize>, u64, usize)>,
    /// This PE's gradients from `compute` (the sync's layout), every PE's summed in PE
    /// order in f32, and the sum of their magnitudes.
    local: Vec<bf16>,
    want: Vec<f32>,
    magnitude: Vec<f32>,
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    // The sync runs beside the GEMMs' stream: its kernels leave them room (README, "When
    // something goes wrong"), as examples/data_parallel.rs does.
    let mut config = CollectivesConfig::for_pes(ctx.shmem.n_pes());
    config.max_blocks = Some(STEP_MAX_BLOCKS);
    let coll = Arc::new(Collectives::with_config(ctx.shmem, config)?);
    let ctx = &Ctx {
        collectives: &coll,
        ..*ctx
    };
    for model in models() {
        for (i, &bucket) in model.buckets.iter().enumerate() {
            timing::step(format!(
                "gradsync: model {}, buckets of {bucket} bytes",
                model.name
            ));
            let r = setup(ctx, &model, bucket)?;
            let mut said = Vec::new();
            for imp in StepImpl::ALL {
                let once = matches!(imp, StepImpl::OneCall | StepImpl::Compute);
                if (imp.nccl() && ctx.nccl.is_none()) || (once && i > 0) {
                    continue;
                }
                let rec = measure(ctx, timer, &r, bucket, imp)?;
                let t = rec.median_us().map_or("-".into(), |t| format!("{t:.1}us"));
                said.push(format!("{} {t} {}", imp.name(), rec.check));
                results.push(rec);
            }
            ctx.progress.say(format!(
                "gradsync {} ({} buckets of {}): {}",
                model.name,
                r.spans.len(),
                crate::cli::format_size(bucket),
                said.join(", ")
            ));
        }
    }
    Ok(())
}

fn setup<'a>(ctx: &'a Ctx, model: &'a Model, bucket: usize) -> Result<Run<'a>> {
    let (me, n) = (ctx.shmem.my_pe(), ctx.shmem.n_pes());
    let key = |part: u64| data::key(ctx.cfg.seed, &[K_STEP, model.params() as u64, part]);
    let upload = |part: u64, len: usize, scale: f32| -> Result<DeviceBuffer<bf16>> {
        let b = ctx.shmem.alloc_device::<bf16>(len)?;
        b.copy_from_host(&data::uniform_bf16(key(part), len, scale, ctx.threads))?;
        Ok(b)
    };
    let layers = model.layers.len();
    let mut w = Vec::new();
    let mut acts = vec![upload(
        1000 + me as u64,
        model.tokens * model.layers[0].1,
        1.0,
    )?];
    let mut dys = Vec::new();
    for (l, &(out, inp)) in model.layers.iter().enumerate() {
        w.push(upload(l as u64, out * inp, 1.0 / (inp as f32).sqrt())?);
        acts.push(ctx.shmem.alloc_device::<bf16>(model.tokens * out)?);
        dys.push(match l + 1 == layers {
            true => upload(2000 + me as u64, model.tokens * out, 1.0)?,
            false => ctx.shmem.alloc_device::<bf16>(model.tokens * out)?,
        });
    }
    let lens: Vec<usize> = model.layers.iter().map(|(a, b)| a * b).collect();
    let config = GradSyncConfig {
        bucket_bytes: bucket,
        compression: None,
    };
    let sync = GradientSync::new(ctx.shmem, ctx.collectives, &lens, config)?;
    let spans = sync
        .buckets()
        .into_iter()
        .map(|ps| {
            let (first, last) = (sync.grad(ps.start), sync.grad(ps.end - 1));
            let start = first.as_ptr() as u64;
            let end = last.as_ptr() as u64 + 2 * last.len() as u64;
            (ps, start, ((end - start) / 2) as usize)
        })
        .collect();
    let mut r = Run {
        model,
        gemm: Gemm::new(ctx.shmem)?,
        w,
        acts,
        dys,
        sync: RefCell::new(sync),
        side: ctx.shmem.new_stream()?,
        spans,
        local: Vec::new(),
        want: Vec::new(),
        magnitude: Vec::new(),
    };
    // One eager step: the GEMMs' plans, and this PE's gradients.
    step(ctx, &r, Overlap::None)?;
    ctx.stream.synchronize().cuda("cuStreamSynchronize")?;
    r.local = r.sync.borrow().grads().to_vec()?;
    // Every PE's, through NVSHMEM's own all-gather, summed as our all-reduce sums bf16.
    let len = r.local.len();
    let mine = Guard::new(ctx.shmem.malloc::<bf16>(len)?);
    mine.copy_from_host(&r.local)?;
    let all = Guard::new(ctx.shmem.malloc::<bf16>(len * n)?);
    ctx.shmem
        .team_world()
        .all_gather(&*all, &*mine, ctx.stream)?;
    let all = all.to_vec()?;
    let at = |p: usize, i: usize| all[p * len + i].to_f32();
    r.want = (0..len)
        .map(|i| (1..n).fold(at(0, i), |a, p| a + at(p, i)))
        .collect();
    r.magnitude = (0..len)
        .map(|i| (0..n).map(|p| at(p, i).abs()).sum())
        .collect();
    Ok(r)
}

/// What a step does with each layer's gradient once it is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Overlap {
    None,
    Ours,
    Nccl,
}

/// The forward and backward GEMMs on the context's stream, each layer's weight gradient
/// summed as `overlap` says once its bucket is written, the step ending when every sum is.
fn step(ctx: &Ctx, r: &Run, overlap: Overlap) -> Result<()> {
    let s = ctx.stream;
    let m = r.model;
    let layers = m.layers.len();
    for l in 0..layers {
        r.gemm
            .linear(&r.acts[l + 1], &r.acts[l], &r.w[l], m.shape(l), s)?;
    }
    let mut sync = r.sync.borrow_mut();
    for l in (0..layers).rev() {
        r.gemm
            .linear_weight_grad(&sync.grad(l), &r.dys[l], &r.acts[l], m.shape(l), s)?;
        match overlap {
            Overlap::None => {}
            Overlap::Ours => sync.ready(l, s)?,
            Overlap::Nccl => {
                // The bucket that starts with this layer is complete.
                if let Some((_, addr, len)) = r.spans.iter().find(|(ps, ..)| ps.start == l) {
                    r.side.join(s).cuda("cuStreamWaitEvent")?;
                    nccl_sum(ctx, *addr, *len, &r.side)?;
                }
            }
        }
        if l > 0 {
            r.gemm
                .linear_input_grad(&r.dys[l - 1], &r.dys[l], &r.w[l], m.shape(l), s)?;
        }
    }
    match overlap {
        Overlap::None => Ok(()),
        Overlap::Ours => Ok(sync.wait(s)?),
        Overlap::Nccl => s.join(&r.side).cuda("cuStreamWaitEvent"),
    }
}

/// NCCL's in-place sum of `len` bf16 elements at `addr`, on `stream`.
fn nccl_sum(ctx: &Ctx, addr: u64, len: usize, stream: &CudaStream) -> Result<()> {
    let nccl = ctx.nccl.expect("NCCL's rows only with NCCL");
    // SAFETY: the span lies in the sync's gradient buffer, which outlives the call.
    unsafe { nccl.all_reduce(addr, addr, len, ncclDataType_t::ncclBfloat16, stream) }
        .map_err(BenchError::new)
}

/// One call of `imp` on the context's stream.
fn call(ctx: &Ctx, r: &Run, imp: StepImpl) -> Result<()> {
    let s = ctx.stream;
    match imp {
        StepImpl::SyncOurs => Ok(r.sync.borrow_mut().sync(s)?),
        StepImpl::SyncNccl => {
            let nccl = ctx.nccl.expect("NCCL's rows only with NCCL");
            nccl.group(|| {
                for (_, addr, len) in &r.spans {
                    nccl_sum(ctx, *addr, *len, s)?;
                }
                Ok(())
            })
        }
        StepImpl::OneCall => {
            let sync = r.sync.borrow();
            let all: SymmetricView<bf16> = sync.grads().into();
            Ok(ctx
                .collectives
                .all_reduce(all, all, ReduceOp::Sum, AllReduceAlgo::Auto, s)?)
        }
        StepImpl::Compute => step(ctx, r, Overlap::None),
        StepImpl::StepOurs => step(ctx, r, Overlap::Ours),
        StepImpl::StepNccl => step(ctx, r, Overlap::Nccl),
    }
}

fn measure(ctx: &Ctx, timer: &mut Timer, r: &Run, bucket: usize, imp: StepImpl) -> Result<Record> {
    let m = r.model;
    timing::step(format!("gradsync: {} {} {bucket}", m.name, imp.name()));
    let bytes = 2 * m.params();
    let reset = || Ok(r.sync.borrow().grads().copy_from_host(&r.local)?);
    let (samples, status, text) = time_and_check(
        ctx,
        timer,
        bytes,
        reset,
        || call(ctx, r, imp),
        || check(r, imp, ctx.shmem.n_pes()),
    )?;
    let once = matches!(imp, StepImpl::OneCall | StepImpl::Compute);
    let size = crate::cli::format_size(bucket);
    let row = Row {
        test: STEP_TEST,
        variant: match once {
            true => format!("{}, {} tokens", m.name, m.tokens),
            false => format!("{}, {} tokens, buckets of {size}", m.name, m.tokens),
        },
        implementation: imp.name().into(),
        dtype: "bf16",
        bytes,
        count: m.params(),
    };
    Ok(row.record(ctx, &samples, status, text))
}

/// The gradients after a checked call of `imp` (see the module documentation).
fn check(r: &Run, imp: StepImpl, n: usize) -> Result<Mismatch> {
    let got = r.sync.borrow().grads().to_vec()?;
    let n = n as f32;
    let mut m = Mismatch::default();
    let mut wrong = |i: usize, want: String| {
        m.count += 1;
        if m.first.is_none() {
            m.first = Some((i, got[i].to_string(), want));
        }
    };
    for (i, &g) in got.iter().enumerate() {
        match imp {
            StepImpl::Compute => {
                if g.to_bits() != r.local[i].to_bits() {
                    wrong(i, r.local[i].to_string());
                }
            }
            StepImpl::SyncNccl | StepImpl::StepNccl => {
                let tolerance = 2.0 * n * 2f32.powi(-8) * (r.magnitude[i] + r.want[i].abs());
                if (g.to_f32() - r.want[i]).abs() > tolerance {
                    wrong(i, r.want[i].to_string());
                }
            }
            _ => {
                let want = bf16::from_f32(r.want[i]);
                if g.to_bits() != want.to_bits() {
                    wrong(i, want.to_string());
                }
            }
        }
    }
    Ok(m)
}
