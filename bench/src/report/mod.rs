//! Results: records, tables for the terminal, JSON and CSV files.

mod collective;
mod files;
mod floor;
mod gradsync;
mod hybrid;
mod kv_transfer;
mod map;
mod matrix;
mod norm;
mod p2p;
mod pipeline;
mod pool;
mod table;
mod tp;

use crate::cli::{format_size, Config, Mode};
use crate::stats::Summary;
use collective::collective_tables;
use floor::floor_tables;
use gradsync::{gradsync_tables, step_tables};
use hybrid::hybrid_tables;
use kv_transfer::kv_tables;
use map::map_tables;
use matrix::matrix_tables;
use norm::{block_tables, norm_tables};
use p2p::p2p_tables;
use pipeline::pipeline_tables;
use pool::pool_tables;
use serde::Serialize;
use std::fmt::Write as _;
use tp::tp_tables;

pub use files::write_all;
pub use tp::tp_shapes_of;

/// Outcome of a measurement's check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Output verified.
    Ok,
    /// Wrong output, or the operation failed.
    Failed,
    /// Not measured: the implementation cannot run this way (for example graph capture).
    Unsupported,
}

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// `allreduce`, `allgather`, `reducescatter`, `p`, `g`, `put`, `get`, `put_signal_pingpong`,
    /// `channel_pingpong_device`, `put_bw`, `get_bw`, `host_put`, `host_get`, `stream_put`,
    /// `stream_get`, `nccl_pingpong`, `nccl_sendrecv_bw`.
    pub test: String,
    /// Scope (`thread`, `warp`, `block`), direction and CTAs (`uni ctas=8`), or empty.
    pub variant: String,
    /// `ours`, `nvshmem` or `nccl`.
    pub implementation: String,
    /// `plain`, `graph` (collectives), `device`, `host`, `stream` (point-to-point).
    pub mode: String,
    /// `bf16`, `f32`, `u32` or `bytes`.
    pub dtype: String,
    /// Message size in bytes (all-gather: the output; reduce-scatter: the input).
    pub bytes: usize,
    /// Elements per PE (all-gather: sent by each PE; reduce-scatter: received by each PE).
    pub count: usize,
    pub n_pes: usize,
    /// Time per operation in microseconds (point-to-point latency: one way; bandwidth tests:
    /// per message transfer).
    pub time_us: Option<Summary>,
    /// GB/s from the median time.
    pub algbw_gbs: Option<f64>,
    pub busbw_gbs: Option<f64>,
    pub status: Status,
    /// `ok`, or what went wrong.
    pub check: String,
    /// The figures of a tensor-parallel MLP row (`test` = `tp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp: Option<TpFigures>,
    /// The figures of a 1F1B pipeline row (`test` = `pipeline`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<PipelineFigures>,
    /// The figures of a hybrid training step's row (`test` = `hybrid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<HybridFigures>,
}

/// What a hybrid training step's row adds (bench/src/hybrid/mod.rs says how they are derived).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct HybridFigures {
    pub tp: usize,
    pub pp: usize,
    pub dp: usize,
    /// Every replica's tokens in a step.
    pub tokens_per_step: usize,
    pub tokens_per_s: Option<f64>,
    /// Tokens per second on the row's PEs / (PEs x tokens per second on one GPU).
    pub scaling_efficiency: Option<f64>,
    /// 1 - the `compute` row's step / this row's: what communication, and the waiting it
    /// makes, adds to the step (rows that communicate).
    pub comm_share: Option<f64>,
}

/// What a pipeline row adds: its configuration and the figures derived from every PE's
/// median step (bench/src/pipeline/mod.rs says how).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct PipelineFigures {
    pub stages: usize,
    pub micro_batches: usize,
    /// Tokens per micro-batch.
    pub tokens: usize,
    pub hidden: usize,
    pub ffn: usize,
    /// The slowest stage's busy time per step (its `local` step), in microseconds.
    pub compute_us: Option<f64>,
    /// The step with free hand-offs: `compute_us` x (m + p - 1) / m.
    pub ideal_step_us: Option<f64>,
    /// (p - 1) / (m + p - 1), in percent.
    pub ideal_bubble_percent: f64,
    /// The stages' mean idle share of this row's step, in percent.
    pub bubble_percent: Option<f64>,
    /// This row's step - `ideal_step_us`: the communication the schedule did not hide.
    pub exposed_us: Option<f64>,
    /// Activations and gradients handed across stage boundaries per second.
    pub handoffs_per_s: Option<f64>,
    /// The `nccl` row's step / this row's step.
    pub speedup_vs_nccl: Option<f64>,
}

/// What a tensor-parallel MLP row adds: its shape, token count and the figures derived from
/// its median time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TpFigures {
    pub hidden: usize,
    pub ffn: usize,
    /// Tokens of the forward call (M).
    pub tokens: usize,
    /// 10^12 floating-point operations per second per GPU: 6 M hidden ffn / PEs / time.
    pub tflops_per_gpu: Option<f64>,
    /// Time of `cublas+nccl` / this time, at the same shape and M (> 1: faster).
    pub speedup_vs_nccl: Option<f64>,
    /// (this time - time of `compute-only`) / time of `compute-only`, in percent.
    pub overhead_percent: Option<f64>,
    /// The largest of the PEs' own medians. The PEs run the same work on different GPUs,
    /// which need not be equally fast; a layer that communicates ends with its slowest PE,
    /// so the slowest PE's `compute-only` is the bound no schedule can beat.
    pub slowest_pe_us: Option<f64>,
    /// (this time - the slowest PE's `compute-only`) / the same, in percent.
    pub overhead_slowest_percent: Option<f64>,
    /// Whether this is the schedule that `forward` (`Schedule::Auto`) runs at this shape
    /// and M.
    pub auto: bool,
}

impl Record {
    /// A row of bytes moved (`dtype` `bytes`), not timed yet, its check `ok`.
    pub fn bytes_row(
        test: &str,
        variant: String,
        implementation: &str,
        mode: Mode,
        bytes: usize,
        count: usize,
        n_pes: usize,
    ) -> Record {
        Record {
            test: test.into(),
            variant,
            implementation: implementation.into(),
            mode: mode.name().into(),
            dtype: "bytes".into(),
            bytes,
            count,
            n_pes,
            time_us: None,
            algbw_gbs: None,
            busbw_gbs: None,
            status: Status::Ok,
            check: "ok".into(),
            tp: None,
            pipeline: None,
            hybrid: None,
        }
    }

    pub fn median_us(&self) -> Option<f64> {
        self.time_us.map(|s| s.median)
    }

    pub fn key(&self) -> String {
        if let Some(p) = &self.pipeline {
            return format!(
                "{} {} tokens={} {}",
                self.test, self.variant, p.tokens, self.implementation
            );
        }
        if let Some(tp) = &self.tp {
            return format!(
                "{} {} M={} {}",
                self.test, self.variant, tp.tokens, self.implementation
            );
        }
        let mut k = format!(
            "{} {} {} {} {}",
            self.test,
            self.implementation,
            self.mode,
            self.dtype,
            format_size(self.bytes)
        );
        if !self.variant.is_empty() {
            k.push_str(&format!(" [{}]", self.variant));
        }
        k
    }
}

/// Everything measured so far, and what failed.
#[derive(Debug, Default, Serialize)]
pub struct Results {
    pub records: Vec<Record>,
    /// Notes about skipped tests.
    pub notes: Vec<String>,
}

impl Results {
    pub fn push(&mut self, r: Record) {
        self.records.push(r);
    }

    pub fn failed(&self) -> impl Iterator<Item = &Record> {
        self.records.iter().filter(|r| r.status == Status::Failed)
    }

    pub fn unsupported(&self) -> impl Iterator<Item = &Record> {
        self.records
            .iter()
            .filter(|r| r.status == Status::Unsupported)
    }
}

/// Everything PE 0 prints after the header.
pub fn render_tables(results: &Results, cfg: &Config) -> String {
    let mut s = String::new();
    for t in floor_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in collective_tables(&results.records, cfg) {
        s.push_str(&t.render());
    }
    for t in tp_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in norm_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in block_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in gradsync_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in step_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in p2p_tables(&results.records, cfg) {
        s.push_str(&t.render());
    }
    for t in matrix_tables(&results.records, cfg) {
        s.push_str(&t.render());
    }
    for t in pool_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in map_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in kv_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in pipeline_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in hybrid_tables(&results.records) {
        s.push_str(&t.render());
    }
    if !results.notes.is_empty() {
        s.push_str("\n## notes\n");
        for n in &results.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    let unsupported: Vec<&Record> = results.unsupported().collect();
    if !unsupported.is_empty() {
        s.push_str("\n## not measured\n");
        for r in unsupported {
            let _ = writeln!(s, "- {}: {}", r.key(), r.check);
        }
    }
    let failed: Vec<&Record> = results.failed().collect();
    if failed.is_empty() {
        let _ = writeln!(
            s,
            "\nall {} checks passed",
            results
                .records
                .iter()
                .filter(|r| r.status == Status::Ok)
                .count()
        );
    } else {
        let _ = writeln!(s, "\n## FAILED ({})", failed.len());
        for r in failed {
            let _ = writeln!(s, "- {}: {}", r.key(), r.check);
        }
    }
    s
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::cli::{Args, Config};
    use crate::tp::{TpImpl, TP_TEST};
    use clap::Parser;

    pub fn record(
        test: &str,
        imp: &str,
        mode: &str,
        bytes: usize,
        median: f64,
        status: Status,
    ) -> Record {
        Record {
            test: test.into(),
            variant: String::new(),
            implementation: imp.into(),
            mode: mode.into(),
            dtype: "f32".into(),
            bytes,
            count: bytes / 4,
            n_pes: 8,
            time_us: Some(Summary {
                n: 3,
                median,
                mean: median,
                min: median * 0.9,
                max: median * 1.1,
                p10: median * 0.95,
                p90: median * 1.05,
            }),
            algbw_gbs: Some(bytes as f64 / median / 1e3),
            busbw_gbs: Some(bytes as f64 / median / 1e3 * 1.75),
            status,
            check: if status == Status::Ok {
                "ok".into()
            } else {
                "3 wrong, \"first\", at 1".into()
            },
            tp: None,
            pipeline: None,
            hybrid: None,
        }
    }

    /// A tp row: `shape` 8b-like (hidden 4096, ffn 14336) at `tokens`.
    pub fn tp_record(shape: &str, imp: TpImpl, tokens: usize, median: f64) -> Record {
        let mut r = record(
            TP_TEST,
            imp.name(),
            "graph",
            tokens * 4096 * 2,
            median,
            Status::Ok,
        );
        r.variant = shape.into();
        r.dtype = "bf16".into();
        r.count = tokens * 4096;
        r.algbw_gbs = None;
        r.busbw_gbs = None;
        r.tp = Some(TpFigures {
            hidden: 4096,
            ffn: 14336,
            tokens,
            tflops_per_gpu: Some(6.0 * tokens as f64 * 4096.0 * 14336.0 / 8.0 / median * 1e-6),
            speedup_vs_nccl: None,
            overhead_percent: None,
            slowest_pe_us: None,
            overhead_slowest_percent: None,
            auto: false,
        });
        r
    }

    pub fn cfg(args: &[&str]) -> Config {
        let mut v = vec!["bench"];
        v.extend_from_slice(args);
        Config::from_args(Args::try_parse_from(v).unwrap()).unwrap()
    }

    #[test]
    fn summary_lists_failures() {
        let c = cfg(&[]);
        let mut res = Results::default();
        res.push(record(
            "allreduce",
            "ours",
            "plain",
            64,
            1.0,
            Status::Failed,
        ));
        let mut r = record("put", "nvshmem", "device", 64, 2.0, Status::Ok);
        r.variant = "warp".into();
        res.push(r);
        let text = render_tables(&res, &c);
        assert!(text.contains("FAILED (1)"), "{text}");
        assert!(text.contains("put warp"), "{text}");
    }
}
