//! Tensor-parallel Llama MLP: `nvshmem::tp::TpMlp` in each schedule (the local GEMMs, the
//! SiLU kernel and our all-reduce) against the same local work followed by NCCL's all-reduce,
//! and against the local work alone (with our GEMMs, and with cuBLASLt's); and in sequence parallelism `SequenceParallelMlp` (all-gather + GEMM,
//! GEMM + reduce-scatter) against NCCL's all-gather and reduce-scatter around the same local
//! work; and against cuBLASMp's GEMMs with the communication overlapped (`cublasmp`). Each is
//! captured in CUDA graphs and timed in alternating blocks; every token count is checked
//! against the unsharded MLP on fresh random data.

mod buffers;
mod check;
mod figures;
mod mlp;
mod ops;
mod point;

use crate::cli::{Config, Impl, TpLayout, TpShape};
use crate::coord::Coord;
use crate::cublasmp::CublasMp;
use crate::error::{BenchError, Guard, Result};
use crate::nccl::Nccl;
use crate::report::{Record, Results, Status};
use crate::timing::{self, Timer};
use crate::Progress;
use cudarc::driver::CudaStream;
use half::bf16;
use mlp::{Mlp, Weights};
use nvshmem::tp::{MlpShape, SequenceParallelMlp, TensorParallel, TpMlp};
use nvshmem::{Collectives, Nvshmem};
use point::point;
use std::collections::HashSet;
use std::sync::Arc;

pub use figures::{fill_relative, overhead_percent};

/// The `test` of the tensor-parallel MLP rows.
pub const TP_TEST: &str = "tp";

/// The implementations of the tensor-parallel MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TpImpl {
    /// The local GEMMs (as `GemmPath::Auto` chooses: up to `DECODE_MAX_TOKENS` tokens the faster
    /// of our decode kernel and cuBLASLt as measured when the weights were loaded, cuBLASLt
    /// above, with the algorithm measured then up to `TUNED_TOKENS` tokens) and the SiLU
    /// kernel alone, no communication.
    ComputeOnly,
    /// The same with every GEMM by cuBLASLt with its heuristic's first choice
    /// (`GemmPath::CublasLtHeuristic`: cuBLAS's compute alone): run only up to `TUNED_TOKENS`
    /// tokens, where `GemmPath::Auto` may take our decode kernel or a measured algorithm
    /// (above, it is compute-only again).
    CublasOnly,
    /// The local work, then NCCL's all-reduce (sequence parallel: NCCL's all-gather, the
    /// local work, NCCL's reduce-scatter).
    CublasNccl,
    /// `TpMlp::forward_with(Schedule::Sequential)`: the local work, then our all-reduce
    /// (sequence parallel: `SequenceParallelMlp`, our all-gather and reduce-scatter).
    CublasOurs,
    /// `SequenceParallelMlp::forward_with(Schedule::Overlapped)`: the gate/up GEMM of this
    /// PE's tokens while the all-gather brings the others' (sequence parallel only: a
    /// replicated MLP has no overlapped form).
    Overlapped,
    /// `TpMlp::forward_with(Schedule::Fused)`: the down projection's GEMM and all-reduce in
    /// one kernel up to `FUSED_DECODE_MAX_TOKENS` tokens; from `FUSED_EXCHANGE_TOKENS` tokens
    /// per PE, its GEMMs in rounds with the all-reduce's exchanges beside them. Sequence
    /// parallel: both exchanges fused with their GEMMs. Run only where the layers have that
    /// form (`resolved_schedule`: elsewhere it is cublas+ours again).
    Fused,
    /// cuBLASMp: the gate/up GEMM by cuBLASLt, the SiLU kernel, then `cublasMpMatmul`'s
    /// GEMM and all-reduce (without overlap: its overlapped form needs NVLink multicast).
    /// Sequence parallel: its overlapped all-gather + GEMM and GEMM + reduce-scatter.
    Cublasmp,
}

impl TpImpl {
    pub const ALL: [TpImpl; 7] = [
        TpImpl::ComputeOnly,
        TpImpl::CublasOnly,
        TpImpl::CublasNccl,
        TpImpl::CublasOurs,
        TpImpl::Overlapped,
        TpImpl::Fused,
        TpImpl::Cublasmp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TpImpl::ComputeOnly => "compute-only",
            TpImpl::CublasOnly => "cublas-only",
            TpImpl::CublasNccl => "cublas+nccl",
            TpImpl::CublasOurs => "cublas+ours",
            TpImpl::Overlapped => "overlapped",
            TpImpl::Fused => "fused",
            TpImpl::Cublasmp => "cublasmp",
        }
    }

    /// What `--impls` selects: compute-only and cublas-only always (the baselines of the
    /// overhead), cublas+nccl with `nccl`, cublas+ours, overlapped and fused with `ours`,
    /// cublasmp with `cublasmp`.
    pub fn selected(cfg: &Config) -> Vec<TpImpl> {
        TpImpl::ALL
            .into_iter()
            .filter(|i| match i {
                TpImpl::ComputeOnly | TpImpl::CublasOnly => true,
                TpImpl::CublasNccl => cfg.has_impl(Impl::Nccl),
                TpImpl::CublasOurs | TpImpl::Overlapped | TpImpl::Fused => cfg.has_impl(Impl::Ours),
                TpImpl::Cublasmp => cfg.has_impl(Impl::Cublasmp),
            })
            .collect()
    }
}

/// What the tensor-parallel benchmark runs with.
pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    /// The collectives of `TpMlp`'s all-reduce (shared with the collectives tests).
    pub collectives: &'a Arc<Collectives>,
    pub nccl: Option<&'a Nccl>,
    /// cuBLASMp, when the cublasmp column runs.
    pub cublasmp: Option<&'a CublasMp>,
    pub progress: &'a Progress,
    /// CPU threads for the random data.
    pub threads: usize,
}

/// A tensor-parallel group on `collectives`, or the error of any PE that could not make one
/// (`test` names the test in it). Not collective: the PEs agree on the outcome before
/// anything that is.
pub fn group(
    shmem: &Nvshmem,
    coord: &Coord,
    collectives: &Arc<Collectives>,
    test: &str,
) -> Result<Guard<TensorParallel>> {
    let n = shmem.n_pes();
    let tp = TensorParallel::with_collectives(shmem, Arc::clone(collectives));
    let failed = coord.sum(tp.is_err() as u64)?;
    match tp {
        Ok(tp) if failed == 0 => Ok(Guard::new(tp)),
        Ok(_) => Err(BenchError::new(format!(
            "{test}: setting up the tensor-parallel layers failed on {failed} of {n} PEs"
        ))),
        Err(e) => Err(BenchError::new(format!(
            "{test}: cannot set up the tensor-parallel layers: {e}"
        ))),
    }
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let n = ctx.shmem.n_pes();
    ctx.progress
        .say("tp: setting up cuBLASLt and the tensor-parallel kernels");
    timing::step("tp: setting up cuBLASLt and the tensor-parallel kernels");
    let tp = group(ctx.shmem, ctx.coord, ctx.collectives, "tp")?;
    let impls = TpImpl::selected(ctx.cfg);
    for shape in &ctx.cfg.tp_shapes {
        if shape.ffn < n {
            let note = format!(
                "tp {}: skipped, its {} FFN features cannot be shared by {n} PEs",
                shape.name, shape.ffn
            );
            ctx.progress.say(&note);
            results.notes.push(note);
            continue;
        }
        for &layout in &ctx.cfg.tp_layouts {
            run_shape(ctx, timer, results, &tp, shape, layout, &impls)?;
        }
    }
    Ok(())
}

fn run_shape(
    ctx: &Ctx,
    timer: &mut Timer,
    results: &mut Results,
    tp: &TensorParallel,
    shape: &TpShape,
    layout: TpLayout,
    impls: &[TpImpl],
) -> Result<()> {
    let (hidden, ffn, n) = (shape.hidden, shape.ffn, ctx.shmem.n_pes());
    let variant = layout.variant(&shape.name);
    // Sequence parallelism shares the tokens equally.
    let ms: Vec<usize> = match layout {
        TpLayout::Replicated => ctx.cfg.tp_m.clone(),
        TpLayout::Sequence => ctx
            .cfg
            .tp_m
            .iter()
            .copied()
            .filter(|m| m % n == 0)
            .collect(),
    };
    if ms.len() < ctx.cfg.tp_m.len() {
        let note = format!(
            "tp {variant}: token counts that are not multiples of the {n} PEs skipped \
             (sequence parallelism shares them equally)"
        );
        ctx.progress.say(&note);
        results.notes.push(note);
    }
    let Some(&max_m) = ms.last() else {
        return Ok(());
    };
    ctx.progress.say(format!(
        "tp {variant} (hidden {hidden}, ffn {ffn}, {} tokens), TP {n}: M = {ms:?}",
        layout.name()
    ));
    timing::step(format!("tp {variant}: building the MLP"));
    let mlp_shape = MlpShape {
        hidden,
        ffn,
        max_tokens: max_m,
    };
    let mlp = Guard::new(match layout {
        TpLayout::Replicated => Mlp::Replicated(TpMlp::new(tp, mlp_shape)?),
        TpLayout::Sequence => Mlp::Sequence(SequenceParallelMlp::new(tp, mlp_shape)?),
    });
    let full = Weights {
        gate_up: Guard::new(ctx.shmem.alloc_device::<bf16>(2 * ffn * hidden)?),
        down: Guard::new(ctx.shmem.alloc_device::<bf16>(hidden * ffn)?),
    };
    let mut disabled = HashSet::new();
    for (index, &m) in ms.iter().enumerate() {
        let first = results.records.len();
        for r in point(
            ctx,
            timer,
            tp,
            &mlp,
            &full,
            (shape, &variant),
            m,
            impls,
            &mut disabled,
        )? {
            results.push(r);
        }
        ctx.progress.say(progress_line(
            &variant,
            index + 1,
            ms.len(),
            m,
            &results.records[first..],
        ));
    }
    Ok(())
}

fn progress_line(variant: &str, i: usize, total: usize, m: usize, recs: &[Record]) -> String {
    let parts: Vec<String> = recs
        .iter()
        .map(|r| {
            let cell = match (r.status, r.median_us()) {
                (Status::Ok, Some(t)) => format!("{t:.1}us"),
                (Status::Failed, Some(t)) => format!("{t:.1}us WRONG"),
                (Status::Unsupported, _) => "n/a".into(),
                _ => "FAILED".into(),
            };
            format!("{}: {cell}", r.implementation)
        })
        .collect();
    let mut line = format!("tp {variant} [{i}/{total}] M={m}: {}", parts.join(" | "));
    let ours = recs
        .iter()
        .find(|r| r.implementation == TpImpl::CublasOurs.name())
        .and_then(|r| r.tp)
        .and_then(|t| t.speedup_vs_nccl);
    if let Some(s) = ours {
        line.push_str(&format!(" (ours {s:.2}x vs nccl)"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(args: &[&str]) -> Config {
        let mut v = vec!["bench"];
        v.extend_from_slice(args);
        Config::from_args(<crate::cli::Args as clap::Parser>::try_parse_from(v).unwrap()).unwrap()
    }

    #[test]
    fn impls_follow_the_impls_option() {
        let names = |c: &Config| {
            TpImpl::selected(c)
                .into_iter()
                .map(TpImpl::name)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(&cfg(&["--tests", "tp"])),
            [
                "compute-only",
                "cublas-only",
                "cublas+nccl",
                "cublas+ours",
                "overlapped",
                "fused",
                "cublasmp"
            ]
        );
        assert_eq!(
            names(&cfg(&["--tests", "tp", "--impls", "cublasmp"])),
            ["compute-only", "cublas-only", "cublasmp"]
        );
        assert_eq!(
            names(&cfg(&["--tests", "tp", "--impls", "ours"])),
            [
                "compute-only",
                "cublas-only",
                "cublas+ours",
                "overlapped",
                "fused"
            ]
        );
        assert_eq!(
            names(&cfg(&["--tests", "tp", "--impls", "nvshmem"])),
            ["compute-only", "cublas-only"]
        );
    }
}
