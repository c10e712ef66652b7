//! Gradient sync (`--tests gradsync`): the compressed all-reduce of f32 gradients, from
//! 256 KiB up, against our plain all-reduce and NCCL's in f32 and bf16:
//! - `int8/128`, `fp8/128`, `fp16`, `bf16`: `Collectives::all_reduce_compressed`;
//! - `ours-f32`: `Collectives::all_reduce` of the f32 gradients;
//! - `nccl-f32`, `nccl-bf16`: `ncclAllReduce` of the gradients in f32, and rounded to bf16
//!   (half the bytes).
//!
//! Each in CUDA graphs of `--graph-ops` calls; GB/s is over the uncompressed f32 bytes.
//! After the timed replays each runs once more and is checked on every PE: a compressed row
//! must equal the CPU model (`nvshmem::collectives::compressed::model`) bit for bit, and be
//! within its bound of the exact sum at every element (the check text gives the largest
//! error over the bound); `ours-f32` must equal the f32 sum in PE order bit for bit; NCCL's
//! rows must be within `2n` roundings of their type of the exact sum.

pub mod step;

use crate::data::{self, Mismatch};
use crate::error::{Guard, Result};
use crate::norm::{time_and_check, Ctx};
use crate::report::{Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use cudarc::nccl::sys::ncclDataType_t;
use half::bf16;
use nvshmem::collectives::compressed::model;
use nvshmem::{AllReduceAlgo, Collectives, CollectivesConfig, Compression, ReduceOp};
use nvshmem::{DeviceBuffer, SymmetricBuffer};
use std::cell::Cell;

/// The `test` of the rows.
pub const GRADSYNC_TEST: &str = "gradsync";
/// The smallest size timed, in bytes of f32 gradients.
pub const MIN_BYTES: usize = 256 << 10;
/// Data key (`data::key`).
const K_GRAD: u64 = 73;

/// The compressions of the rows.
const COMPRESSIONS: [Compression; 4] = [
    Compression::Int8 { block: 128 },
    Compression::Fp8E4M3 { block: 128 },
    Compression::Fp16,
    Compression::Bf16,
];

/// One row's implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradImpl {
    Compressed(Compression),
    Ours,
    NcclF32,
    NcclBf16,
}

impl GradImpl {
    pub const ALL: [GradImpl; 7] = [
        GradImpl::Compressed(COMPRESSIONS[0]),
        GradImpl::Compressed(COMPRESSIONS[1]),
        GradImpl::Compressed(COMPRESSIONS[2]),
        GradImpl::Compressed(COMPRESSIONS[3]),
        GradImpl::Ours,
        GradImpl::NcclF32,
        GradImpl::NcclBf16,
    ];

    pub fn name(self) -> String {
        match self {
            GradImpl::Compressed(c) => c.to_string(),
            GradImpl::Ours => "ours-f32".into(),
            GradImpl::NcclF32 => "nccl-f32".into(),
            GradImpl::NcclBf16 => "nccl-bf16".into(),
        }
    }
}

/// One size's buffers: this PE's gradients (f32 and bf16), the outputs, and every PE's
/// gradients for the references.
struct Case {
    len: usize,
    x: Guard<SymmetricBuffer<f32>>,
    out: Guard<SymmetricBuffer<f32>>,
    x16: DeviceBuffer<bf16>,
    out16: DeviceBuffer<bf16>,
    all: Vec<Vec<f32>>,
}

/// The sizes of the rows: those of `--sizes` from 256 KiB up.
pub fn sizes(requested: &[usize]) -> Vec<usize> {
    requested
        .iter()
        .copied()
        .filter(|&b| b >= MIN_BYTES)
        .collect()
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let n = ctx.shmem.n_pes();
    let sizes = sizes(&ctx.cfg.sizes);
    let largest = sizes.iter().max().copied().unwrap_or(0) / 4;
    timing::step("gradsync: our collectives with a compressed workspace");
    let mut config = CollectivesConfig::for_pes(n);
    config.workspace.compressed_bytes = COMPRESSIONS
        .iter()
        .map(|c| c.workspace_bytes(largest, n))
        .max()
        .unwrap_or(0);
    let coll = Guard::new(Collectives::with_config(ctx.shmem, config)?);
    for bytes in sizes {
        let case = make_case(ctx, bytes / 4)?;
        let mut said = Vec::new();
        for imp in GradImpl::ALL {
            let nccl = matches!(imp, GradImpl::NcclF32 | GradImpl::NcclBf16);
            if nccl && ctx.nccl.is_none() {
                continue;
            }
            let r = measure(ctx, timer, &coll, &case, imp)?;
            let t = r.median_us().map_or("-".into(), |t| format!("{t:.1}us"));
            said.push(format!("{} {t} {}", r.implementation, r.check));
            results.push(r);
        }
        ctx.progress.say(format!(
            "gradsync {}: {}",
            crate::cli::format_size(bytes),
            said.join(", ")
        ));
    }
    drop(coll);
    step::run(ctx, timer, results)
}

fn make_case(ctx: &Ctx, len: usize) -> Result<Case> {
    let me = ctx.shmem.my_pe();
    // Blocks of 1000 elements at magnitudes from 2^-10 to 2^4, as layers' gradients differ.
    let all: Vec<Vec<f32>> = (0..ctx.shmem.n_pes())
        .map(|pe| {
            let key = data::key(ctx.cfg.seed, &[K_GRAD, len as u64, pe as u64]);
            let mut v = vec![0f32; len];
            data::par_fill(&mut v, ctx.threads, |start, chunk| {
                for (j, x) in chunk.iter_mut().enumerate() {
                    let i = start + j;
                    let u = (data::word(key, pe, i) >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                    *x = u * 2f32.powi(((i / 1000) % 15) as i32 - 10);
                }
            });
            v
        })
        .collect();
    let x = Guard::new(ctx.shmem.malloc::<f32>(len)?);
    x.copy_from_host(&all[me])?;
    let out = Guard::new(ctx.shmem.malloc::<f32>(len)?);
    let x16 = ctx.shmem.alloc_device::<bf16>(len)?;
    x16.copy_from_host(
        &all[me]
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect::<Vec<_>>(),
    )?;
    let out16 = ctx.shmem.alloc_device::<bf16>(len)?;
    ctx.coord.barrier()?;
    Ok(Case {
        len,
        x,
        out,
        x16,
        out16,
        all,
    })
}

/// One call of `imp` on the context's stream.
fn call(ctx: &Ctx, coll: &Collectives, c: &Case, imp: GradImpl) -> Result<()> {
    let s = ctx.stream;
    match imp {
        GradImpl::Compressed(comp) => coll.all_reduce_compressed(&*c.out, &*c.x, comp, None, s)?,
        GradImpl::Ours => coll.all_reduce(&*c.out, &*c.x, ReduceOp::Sum, AllReduceAlgo::Auto, s)?,
        GradImpl::NcclF32 | GradImpl::NcclBf16 => {
            let nccl = ctx.nccl.expect("rows of NCCL only with NCCL");
            let (src, dst, dtype) = match imp {
                GradImpl::NcclF32 => (c.x.addr(), c.out.addr(), ncclDataType_t::ncclFloat32),
                _ => (c.x16.addr(), c.out16.addr(), ncclDataType_t::ncclBfloat16),
            };
            // SAFETY: both buffers hold `len` elements of `dtype` and outlive the call.
            unsafe { nccl.all_reduce(src, dst, c.len, dtype, s) }
                .map_err(crate::error::BenchError::new)?;
        }
    }
    Ok(())
}

fn measure(
    ctx: &Ctx,
    timer: &mut Timer,
    coll: &Collectives,
    c: &Case,
    imp: GradImpl,
) -> Result<Record> {
    timing::step(format!("gradsync: {} {} elements", imp.name(), c.len));
    let bytes = c.len * 4;
    let worst = Cell::new(None);
    let (samples, status, mut text) = time_and_check(
        ctx,
        timer,
        bytes,
        || Ok(()),
        || call(ctx, coll, c, imp),
        || check(c, imp, &worst),
    )?;
    if let (Status::Ok, Some(w)) = (status, worst.get()) {
        text = format!("ok, largest error / bound {w:.3}");
    }
    let row = Row {
        test: GRADSYNC_TEST,
        variant: "f32 gradients".into(),
        implementation: imp.name(),
        dtype: "f32",
        bytes,
        count: c.len,
    };
    Ok(row.record(ctx, &samples, status, text))
}

/// What names a row of the gradsync tests (timed in CUDA graphs).
struct Row {
    test: &'static str,
    variant: String,
    implementation: String,
    dtype: &'static str,
    bytes: usize,
    count: usize,
}

impl Row {
    /// The row's record: its times, and GB/s over `bytes`.
    fn record(self, ctx: &Ctx, samples: &[f64], status: Status, check: String) -> Record {
        let time_us = stats::summarize(samples);
        Record {
            test: self.test.into(),
            variant: self.variant,
            implementation: self.implementation,
            mode: "graph".into(),
            dtype: self.dtype.into(),
            bytes: self.bytes,
            count: self.count,
            n_pes: ctx.shmem.n_pes(),
            algbw_gbs: time_us
                .as_ref()
                .map(|t| self.bytes as f64 / (t.median * 1e3)),
            time_us,
            busbw_gbs: None,
            status,
            check,
            tp: None,
            pipeline: None,
            hybrid: None,
        }
    }
}

/// This PE's output against the reference of `imp` (see the module documentation); a
/// compressed row's largest error over its bound goes to `worst`.
fn check(c: &Case, imp: GradImpl, worst: &Cell<Option<f64>>) -> Result<Mismatch> {
    let n = c.all.len() as f64;
    let exact = |i: usize| c.all.iter().map(|x| x[i] as f64).sum::<f64>();
    let magnitude = |i: usize| c.all.iter().map(|x| (x[i] as f64).abs()).sum::<f64>();
    let got: Vec<f64> = match imp {
        GradImpl::NcclBf16 => c.out16.to_vec()?.iter().map(|v| v.to_f64()).collect(),
        _ => c.out.to_vec()?.iter().map(|&v| v as f64).collect(),
    };
    let mut m = Mismatch::default();
    let mut wrong = |i: usize, want: String| {
        m.count += 1;
        if m.first.is_none() {
            m.first = Some((i, got[i].to_string(), want));
        }
    };
    match imp {
        GradImpl::Compressed(comp) => {
            let model = model(comp, &c.all, None);
            let mut largest = 0f64;
            for (i, &g) in got.iter().enumerate() {
                let same = g.to_bits() == (model.out[i] as f64).to_bits();
                let err = (g - model.exact[i]).abs();
                largest = largest.max(err / model.bound[i]);
                if !same || err > model.bound[i] {
                    wrong(i, format!("{} (bound {:e})", model.out[i], model.bound[i]));
                }
            }
            worst.set(Some(largest));
        }
        GradImpl::Ours => {
            for (i, &g) in got.iter().enumerate() {
                let want = c.all.iter().fold(0f32, |a, x| a + x[i]);
                if g.to_bits() != (want as f64).to_bits() {
                    wrong(i, want.to_string());
                }
            }
        }
        GradImpl::NcclF32 | GradImpl::NcclBf16 => {
            // Each input's rounding (bf16) and each partial sum's: 2n roundings at most.
            let unit = match imp {
                GradImpl::NcclF32 => 2f64.powi(-24),
                _ => 2f64.powi(-8),
            };
            for (i, &g) in got.iter().enumerate() {
                if (g - exact(i)).abs() > 2.0 * n * unit * (magnitude(i) + exact(i).abs()) {
                    wrong(i, exact(i).to_string());
                }
            }
        }
    }
    Ok(m)
}
