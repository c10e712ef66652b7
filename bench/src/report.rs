//! Results: records, tables for the terminal, JSON and CSV files.

use crate::cli::{format_size, Config};
use crate::env::Environment;
use crate::error::{BenchError, Result};
use crate::pool::{Source, PAGE_BYTES, POOL_TEST};
use crate::stats::{Collective, Summary};
use crate::tp::{TpImpl, TP_TEST};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

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
    /// `allreduce`, `allgather`, `reducescatter`, `p`, `g`, `put`, `get`, `put_signal_pingpong`, `put_bw`,
    /// `get_bw`, `host_put`, `host_get`, `stream_put`, `stream_get`, `nccl_pingpong`,
    /// `nccl_sendrecv_bw`.
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
    pub fn median_us(&self) -> Option<f64> {
        self.time_us.map(|s| s.median)
    }

    pub fn key(&self) -> String {
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

/// A text table with right-aligned columns.
#[derive(Debug, Default)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub footer: Vec<String>,
}

impl Table {
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let mut width: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, c) in row.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut s = String::new();
        let _ = writeln!(s, "\n## {}", self.title);
        let line = |cells: &[String]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate().take(cols) {
                if i > 0 {
                    l.push_str("  ");
                }
                let pad = width[i].saturating_sub(c.chars().count());
                l.push_str(&" ".repeat(pad));
                l.push_str(c);
            }
            l.trim_end().to_string()
        };
        let _ = writeln!(s, "{}", line(&self.headers));
        let total: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
        let _ = writeln!(s, "{}", "-".repeat(total));
        for row in &self.rows {
            let _ = writeln!(s, "{}", line(row));
        }
        for f in &self.footer {
            let _ = writeln!(s, "{f}");
        }
        s
    }
}

fn fmt_us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn fmt_gbs(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A time cell: `12.34 ±3%`, `n/a`, or with `!` when the check failed.
fn time_cell(r: Option<&Record>) -> String {
    match r {
        None => "-".into(),
        Some(r) => match (r.status, r.time_us) {
            (Status::Unsupported, _) => "n/a".into(),
            (_, None) => "FAIL".into(),
            (st, Some(t)) => {
                let mark = if st == Status::Failed { "!" } else { "" };
                format!("{}{mark} ±{:.0}%", fmt_us(t.median), t.spread_percent())
            }
        },
    }
}

fn bw_cell(r: Option<&Record>, bus: bool) -> String {
    match r.and_then(|r| if bus { r.busbw_gbs } else { r.algbw_gbs }) {
        Some(v) => fmt_gbs(v),
        None => "-".into(),
    }
}

fn speedup(ours: Option<&Record>, other: Option<&Record>) -> String {
    match (
        ours.and_then(|r| r.median_us()),
        other.and_then(|r| r.median_us()),
    ) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.2}x", b / a),
        _ => "-".into(),
    }
}

/// Of two rows, the one with the lower median time (either, when only one has a time).
fn faster<'a>(a: Option<&'a Record>, b: Option<&'a Record>) -> Option<&'a Record> {
    match (a.and_then(|r| r.median_us()), b.and_then(|r| r.median_us())) {
        (Some(x), Some(y)) => Some(if x <= y { a? } else { b? }),
        (Some(_), None) => a,
        (None, Some(_)) => b,
        (None, None) => None,
    }
}

fn sizes_of<'a>(records: impl Iterator<Item = &'a Record>) -> Vec<usize> {
    let mut v: Vec<usize> = records.map(|r| r.bytes).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn find(records: &[Record], f: impl Fn(&Record) -> bool) -> Option<&Record> {
    records.iter().find(|r| f(r))
}

/// One table per collective, data type and mode: ours vs NVSHMEM vs NCCL.
pub fn collective_tables(records: &[Record], cfg: &Config) -> Vec<Table> {
    let mut out = Vec::new();
    for (test, title) in Collective::ALL.map(|c| (c.name(), c.title())) {
        for dtype in &cfg.dtypes {
            for mode in &cfg.modes {
                let sel: Vec<&Record> = records
                    .iter()
                    .filter(|r| r.test == test && r.dtype == dtype.name() && r.mode == mode.name())
                    .collect();
                if sel.is_empty() {
                    continue;
                }
                let n_pes = sel[0].n_pes;
                let mut headers = vec!["size".to_string(), "count/PE".to_string()];
                let impls: Vec<&str> = cfg.collective_impls().iter().map(|i| i.name()).collect();
                for i in &impls {
                    headers.push(format!("{i} us"));
                    headers.push(format!("{i} busbw"));
                }
                let has = |name: &str| impls.contains(&name);
                if has("ours") && has("nccl") {
                    headers.push("ours vs nccl".into());
                }
                if has("ours") && has("nccl-symm") {
                    headers.push("ours vs nccl-symm".into());
                }
                if has("ours") && has("nccl") && has("nccl-symm") {
                    headers.push("ours vs best nccl".into());
                }
                if has("ours") && has("nvshmem") {
                    headers.push("ours vs nvshmem".into());
                }
                let mut rows = Vec::new();
                for bytes in sizes_of(sel.iter().copied()) {
                    let get = |imp: &str| {
                        sel.iter()
                            .copied()
                            .find(|r| r.bytes == bytes && r.implementation == imp)
                    };
                    let count = sel
                        .iter()
                        .find(|r| r.bytes == bytes)
                        .map(|r| r.count)
                        .unwrap_or(0);
                    let mut row = vec![format_size(bytes), count.to_string()];
                    for i in &impls {
                        row.push(time_cell(get(i)));
                        row.push(bw_cell(get(i), true));
                    }
                    if has("ours") && has("nccl") {
                        row.push(speedup(get("ours"), get("nccl")));
                    }
                    if has("ours") && has("nccl-symm") {
                        row.push(speedup(get("ours"), get("nccl-symm")));
                    }
                    if has("ours") && has("nccl") && has("nccl-symm") {
                        row.push(speedup(get("ours"), faster(get("nccl"), get("nccl-symm"))));
                    }
                    if has("ours") && has("nvshmem") {
                        row.push(speedup(get("ours"), get("nvshmem")));
                    }
                    rows.push(row);
                }
                let mode_text = if mode.name() == "graph" {
                    format!("CUDA graph of {} ops", cfg.graph_ops)
                } else {
                    "plain launches".to_string()
                };
                out.push(Table {
                    title: format!("{title}, {}, {mode_text}, {n_pes} PEs", dtype.name()),
                    headers,
                    rows,
                    footer: vec![
                        "us = median time per operation ± half the p10-p90 range; busbw in GB/s (nccl-tests); \
                         \"ours vs X\" = time of X / time of ours (> 1: ours is faster); ! = check failed"
                            .into(),
                    ],
                });
            }
        }
    }
    out
}

/// A table column: its header and which records belong in it.
type Column = (String, Box<dyn Fn(&Record) -> bool>);

/// Point-to-point tables: latency by scope, ping-pong, host/stream, bandwidth.
pub fn p2p_tables(records: &[Record], cfg: &Config) -> Vec<Table> {
    let mut out = Vec::new();
    let p2p: Vec<Record> = records
        .iter()
        .filter(|r| {
            !Collective::is_collective_test(&r.test) && r.test != TP_TEST && r.test != POOL_TEST
        })
        .cloned()
        .collect();
    if p2p.is_empty() {
        return out;
    }
    let peer = cfg.peer;
    let note_spread = "us = median ± half the p10-p90 range; ! = check failed".to_string();

    // Single-element p and g.
    let single: Vec<&Record> = p2p
        .iter()
        .filter(|r| r.test == "p" || r.test == "g")
        .collect();
    if !single.is_empty() {
        out.push(Table {
            title: format!("device p/g latency (one uint32, one thread), PE 0 -> PE {peer}"),
            headers: vec!["operation".into(), "us".into()],
            rows: single
                .iter()
                .map(|r| {
                    let what = if r.test == "p" {
                        "nvshmem_uint32_p + quiet"
                    } else {
                        "nvshmem_uint32_g"
                    };
                    vec![what.to_string(), time_cell(Some(r))]
                })
                .collect(),
            footer: vec![note_spread.clone()],
        });
    }

    // Column-wise tables over sizes.
    let column_table =
        |title: String, columns: Vec<Column>, bw: bool, footer: String| -> Option<Table> {
            let sel: Vec<&Record> = p2p
                .iter()
                .filter(|r| columns.iter().any(|(_, f)| f(r)))
                .collect();
            if sel.is_empty() {
                return None;
            }
            let mut headers = vec!["size".to_string()];
            let present: Vec<&Column> = columns
                .iter()
                .filter(|(_, f)| sel.iter().any(|r| f(r)))
                .collect();
            headers.extend(present.iter().map(|(h, _)| h.clone()));
            let rows = sizes_of(sel.iter().copied())
                .into_iter()
                .map(|bytes| {
                    let mut row = vec![format_size(bytes)];
                    for (_, f) in &present {
                        let r = find(&p2p, |r| r.bytes == bytes && f(r));
                        row.push(if bw { bw_cell(r, false) } else { time_cell(r) });
                    }
                    row
                })
                .collect();
            Some(Table {
                title,
                headers,
                rows,
                footer: vec![footer],
            })
        };

    let scoped = |test: &'static str, scope: &'static str| -> Box<dyn Fn(&Record) -> bool> {
        Box::new(move |r: &Record| r.test == test && r.variant == scope)
    };
    let plain = |test: &'static str| -> Box<dyn Fn(&Record) -> bool> {
        Box::new(move |r: &Record| r.test == test)
    };

    let mut cols: Vec<Column> = Vec::new();
    for test in ["put", "get"] {
        for scope in ["thread", "warp", "block"] {
            cols.push((format!("{test} {scope}"), scoped(test, scope)));
        }
    }
    out.extend(column_table(
        format!("device-initiated put/get latency (us), PE 0 -> PE {peer}"),
        cols,
        false,
        format!("put = nvshmem[x]_putmem[_warp|_block] + nvshmem_quiet; get = nvshmem[x]_getmem[...]; {note_spread}"),
    ));

    let mut cols: Vec<Column> = Vec::new();
    for scope in ["thread", "warp", "block"] {
        cols.push((
            format!("signal {scope}"),
            scoped("put_signal_pingpong", scope),
        ));
    }
    cols.push(("nccl send/recv".into(), plain("nccl_pingpong")));
    out.extend(column_table(
        format!("ping-pong latency, one way (us), PE 0 <-> PE {peer}"),
        cols,
        false,
        format!("round trip / 2; signal = put-with-signal + signal_wait_until; {note_spread}"),
    ));

    let cols: Vec<Column> = vec![
        ("host put".into(), plain("host_put")),
        ("host get".into(), plain("host_get")),
        ("stream put".into(), plain("stream_put")),
        ("stream get".into(), plain("stream_get")),
    ];
    out.extend(column_table(
        format!("host-initiated and on-stream latency (us), PE 0 -> PE {peer}"),
        cols,
        false,
        format!("host: nvshmem_putmem + nvshmem_quiet / nvshmem_getmem; stream: *_on_stream (+ quiet_on_stream); {note_spread}"),
    ));

    let by_impl = |test: &'static str, imp: &'static str| -> Box<dyn Fn(&Record) -> bool> {
        Box::new(move |r: &Record| r.test == test && r.implementation == imp)
    };
    // With one PE the channel rows are a loopback (channel.rs).
    let loopback = p2p
        .iter()
        .any(|r| r.test.starts_with("channel_") && r.n_pes == 1);
    let (both_ways, one_way) = match loopback {
        true => ("PE 0 loopback".to_string(), "PE 0 loopback".to_string()),
        false => (format!("PE 0 <-> PE {peer}"), format!("PE 0 -> PE {peer}")),
    };
    out.extend(column_table(
        format!("channel hand-off, one way (us), {both_ways}"),
        vec![
            ("channel".into(), by_impl("channel_pingpong", "ours")),
            ("put+signal".into(), by_impl("channel_pingpong", "nvshmem")),
            ("nccl send/recv".into(), by_impl("channel_pingpong", "nccl")),
        ],
        false,
        format!(
            "CUDA graphs of ping-pong rounds, round trip / 2; channel = Channel::send + recv; \
             put+signal = put_signal_on_stream + signal_wait_until_on_stream; {note_spread}"
        ),
    ));
    for (bw, unit) in [(false, "us per message"), (true, "GB/s")] {
        out.extend(column_table(
            format!("channel throughput, full queue ({unit}), {one_way}"),
            vec![
                ("channel".into(), by_impl("channel_throughput", "ours")),
                ("nccl send/recv".into(), by_impl("channel_throughput", "nccl")),
            ],
            bw,
            "messages back to back in CUDA graphs; channel of 4 slots; messages/s = 10^6 / us per message"
                .into(),
        ));
    }

    for (dir, label) in [("uni", "one way"), ("bidir", "both ways")] {
        let mut cols: Vec<Column> = Vec::new();
        for test in ["put_bw", "get_bw"] {
            for &ctas in &cfg.ctas {
                let variant = format!("{dir} ctas={ctas}");
                let name = test.trim_end_matches("_bw");
                cols.push((
                    format!("{name} {ctas}c"),
                    Box::new(move |r: &Record| r.test == test && r.variant == variant),
                ));
            }
        }
        let dir_s = dir.to_string();
        cols.push((
            "nccl".into(),
            Box::new(move |r: &Record| r.test == "nccl_sendrecv_bw" && r.variant == dir_s),
        ));
        out.extend(column_table(
            format!("bandwidth {label} (GB/s), PE 0 {} PE {peer}", if dir == "uni" { "->" } else { "<->" }),
            cols,
            true,
            "GB/s = 10^9 bytes/s from the median time; Nc = N CTAs; both ways counts the bytes of both directions"
                .into(),
        ));
    }
    out
}

/// The shapes of the tp rows, in the order first measured: (name, hidden, ffn).
pub fn tp_shapes_of(records: &[Record]) -> Vec<(String, usize, usize)> {
    let mut shapes: Vec<(String, usize, usize)> = Vec::new();
    for r in records.iter().filter(|r| r.test == TP_TEST) {
        if let Some(tp) = &r.tp {
            if !shapes.iter().any(|(name, _, _)| *name == r.variant) {
                shapes.push((r.variant.clone(), tp.hidden, tp.ffn));
            }
        }
    }
    shapes
}

fn percent_cell(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{v:.1}%"),
        None => "-".into(),
    }
}

/// One table per tensor-parallel MLP shape: a row per token count, the implementations side
/// by side.
pub fn tp_tables(records: &[Record]) -> Vec<Table> {
    let mut out = Vec::new();
    for (shape, hidden, ffn) in tp_shapes_of(records) {
        let sel: Vec<&Record> = records
            .iter()
            .filter(|r| r.test == TP_TEST && r.variant == shape)
            .collect();
        let n_pes = sel[0].n_pes;
        let impls: Vec<&str> = TpImpl::ALL
            .iter()
            .map(|i| i.name())
            .filter(|name| sel.iter().any(|r| r.implementation == *name))
            .collect();
        let compute = TpImpl::ComputeOnly.name();
        let nccl = TpImpl::CublasNccl.name();
        let ours_impls = [
            TpImpl::CublasOurs.name(),
            TpImpl::Overlapped.name(),
            TpImpl::Fused.name(),
        ];
        let mut headers = vec!["M".to_string()];
        for &i in &impls {
            headers.push(format!("{i} us"));
            headers.push("TFLOP/s".into());
            if i != compute {
                headers.push("overhead".into());
            }
        }
        let cublas = TpImpl::CublasOnly.name();
        let any_ours = ours_impls.iter().any(|o| impls.contains(o));
        let both = impls.contains(&nccl) && any_ours;
        let over_cublas = impls.contains(&cublas) && any_ours;
        let mp = TpImpl::Cublasmp.name();
        let vs_mp = impls.contains(&mp) && any_ours;
        if both {
            headers.push("best ours vs nccl".into());
        }
        // The schedule `forward` takes, where the run says.
        let has_auto = sel.iter().any(|r| r.tp.is_some_and(|t| t.auto));
        if has_auto {
            headers.push("auto".into());
            if impls.contains(&nccl) {
                headers.push("auto vs nccl".into());
            }
        }
        if vs_mp {
            headers.push("best ours vs cublasmp".into());
        }
        if over_cublas {
            headers.push("best ours over cublas-only".into());
        }
        // Against the slowest PE's local work, where the PEs' own medians were gathered.
        let slowest = |imp: &str, m: usize| {
            sel.iter()
                .find(|r| {
                    r.implementation == imp
                        && r.status == Status::Ok
                        && r.tp.is_some_and(|t| t.tokens == m)
                })
                .and_then(|r| r.tp.and_then(|t| t.slowest_pe_us))
        };
        let by_slowest = n_pes > 1
            && any_ours
            && sel.iter().any(|r| {
                r.implementation == compute && r.tp.is_some_and(|t| t.slowest_pe_us.is_some())
            });
        if by_slowest {
            headers.push("slowest PE's compute-only us".into());
            headers.push("best ours over it".into());
            if impls.contains(&cublas) {
                headers.push("best ours over slowest PE's cublas-only".into());
            }
        }
        let mut tokens: Vec<usize> = sel.iter().filter_map(|r| r.tp.map(|t| t.tokens)).collect();
        tokens.sort_unstable();
        tokens.dedup();
        let mut rows = Vec::new();
        for m in tokens {
            let get = |imp: &str| {
                sel.iter()
                    .copied()
                    .find(|r| r.implementation == imp && r.tp.is_some_and(|t| t.tokens == m))
            };
            let mut row = vec![m.to_string()];
            for &i in &impls {
                let r = get(i);
                let fig = r.and_then(|r| r.tp);
                row.push(time_cell(r));
                row.push(match fig.and_then(|f| f.tflops_per_gpu) {
                    Some(v) => fmt_gbs(v),
                    None => "-".into(),
                });
                if i != compute {
                    row.push(percent_cell(fig.and_then(|f| f.overhead_percent)));
                }
            }
            // The faster of our schedules.
            let best = ours_impls
                .iter()
                .filter_map(|&o| get(o))
                .filter(|r| r.status == Status::Ok && r.median_us().is_some())
                .min_by(|a, b| a.median_us().unwrap().total_cmp(&b.median_us().unwrap()));
            if both {
                row.push(speedup(best, get(nccl)));
            }
            if has_auto {
                let auto = sel
                    .iter()
                    .copied()
                    .find(|r| r.tp.is_some_and(|t| t.tokens == m && t.auto));
                row.push(auto.map_or("-".into(), |r| r.implementation.clone()));
                if impls.contains(&nccl) {
                    let timed = auto.filter(|r| r.status == Status::Ok);
                    row.push(speedup(timed, get(nccl)));
                }
            }
            if vs_mp {
                row.push(speedup(best, get(mp)));
            }
            if over_cublas {
                let base = get(cublas)
                    .filter(|r| r.status == Status::Ok)
                    .and_then(|r| r.median_us());
                let t = best.and_then(|r| r.median_us());
                row.push(percent_cell(
                    t.zip(base)
                        .and_then(|(t, c)| crate::tp::overhead_percent(t, c)),
                ));
            }
            if by_slowest {
                row.push(slowest(compute, m).map_or("-".into(), fmt_us));
                row.push(percent_cell(
                    best.and_then(|r| r.tp)
                        .and_then(|t| t.overhead_slowest_percent),
                ));
                if impls.contains(&cublas) {
                    let t = best.and_then(|r| r.median_us());
                    row.push(percent_cell(
                        t.zip(slowest(cublas, m))
                            .and_then(|(t, c)| crate::tp::overhead_percent(t, c)),
                    ));
                }
            }
            rows.push(row);
        }
        let mut footer = vec![
            "us = median time per forward ± half the p10-p90 range",
            "TFLOP/s per GPU = 6 M hidden ffn / PEs / time",
        ];
        if impls.iter().any(|&i| i != compute) {
            footer.push("overhead = (time - compute-only) / compute-only");
        }
        if both {
            footer.push(
                "\"best ours vs nccl\" = time of cublas+nccl / the fastest of cublas+ours, overlapped and fused (> 1: ours is faster); fused runs where the layers have a fused form (up to 8 tokens, and from 512 tokens per PE), overlapped in sequence parallelism (-sp) only",
            );
        }
        if has_auto {
            footer.push("auto = the schedule that forward (Schedule::Auto) takes there; \"auto vs nccl\" = time of cublas+nccl / its time");
        }
        if vs_mp {
            footer.push("\"best ours vs cublasmp\" = time of cublasmp / the fastest of ours (> 1: ours is faster); cublasmp = cuBLASMp's GEMM + all-reduce without overlap (its overlapped one needs NVLink multicast, kept off), and in sequence parallelism its overlapped all-gather + GEMM and GEMM + reduce-scatter");
        }
        if impls.contains(&cublas) {
            footer.push("compute-only's GEMMs are, up to 16 tokens, the faster of our decode kernel and cuBLASLt for each GEMM, and cuBLASLt's algorithms up to 256 tokens the fastest of its heuristic's first 8 (measured when the weights were loaded); cublas-only's are cuBLASLt's with its heuristic's first choice (run up to 256 tokens)");
        }
        if over_cublas {
            footer.push("\"best ours over cublas-only\" = (the fastest of our schedules - cublas-only) / cublas-only: the TP overhead over cuBLAS's compute alone");
        }
        if by_slowest {
            footer.push("the baselines' times are PE 0's; \"slowest PE's\" = the largest of the PEs' own medians, the local work of the slowest GPU, which a layer that communicates waits for; \"best ours over it\" = (the fastest of our schedules - that) / that");
        }
        footer.push("! = check failed");
        out.push(Table {
            title: format!(
                "tensor-parallel MLP {shape} (hidden {hidden}, ffn {ffn}), bf16, TP {n_pes} (one PE per GPU), CUDA graphs"
            ),
            headers,
            rows,
            footer: vec![footer.join("; ")],
        });
    }
    out
}

/// One table per page size of the pool rows: a row per page count, the sources side by
/// side (time and GB/s).
pub fn pool_tables(records: &[Record]) -> Vec<Table> {
    let mut out = Vec::new();
    for page_bytes in PAGE_BYTES {
        let sel: Vec<&Record> = records
            .iter()
            .filter(|r| r.test == POOL_TEST && r.bytes == r.count * page_bytes)
            .collect();
        if sel.is_empty() {
            continue;
        }
        let sources: Vec<Source> = Source::ALL
            .into_iter()
            .filter(|s| sel.iter().any(|r| r.implementation == s.name()))
            .collect();
        let mut headers = vec!["pages".to_string(), "bytes".to_string()];
        for s in &sources {
            headers.push(format!("{} us", s.name()));
            headers.push(format!("{} GB/s", s.name()));
        }
        let mut counts: Vec<usize> = sel.iter().map(|r| r.count).collect();
        counts.sort_unstable();
        counts.dedup();
        let rows = counts
            .into_iter()
            .map(|count| {
                let mut row = vec![count.to_string(), format_size(count * page_bytes)];
                for s in &sources {
                    let r = sel
                        .iter()
                        .copied()
                        .find(|r| r.count == count && r.implementation == s.name());
                    row.push(time_cell(r));
                    row.push(bw_cell(r, false));
                }
                row
            })
            .collect();
        out.push(Table {
            title: format!(
                "page pool gather of {} pages into PE 0 (PagePool::gather_device, CUDA graphs), {} PEs",
                format_size(page_bytes),
                sel[0].n_pes
            ),
            headers,
            rows,
            footer: vec![
                "us = median per gather ± half the p10-p90 range; GB/s = gathered bytes / median \
                 time; local = PE 0's own pages, the same kernel; ! = check failed"
                    .into(),
            ],
        });
    }
    out
}

/// Everything PE 0 prints after the header.
pub fn render_tables(results: &Results, cfg: &Config) -> String {
    let mut s = String::new();
    for t in collective_tables(&results.records, cfg) {
        s.push_str(&t.render());
    }
    for t in tp_tables(&results.records) {
        s.push_str(&t.render());
    }
    for t in p2p_tables(&results.records, cfg) {
        s.push_str(&t.render());
    }
    for t in pool_tables(&results.records) {
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

/// The CSV header and rows.
pub const CSV_HEADER: &str = "test,variant,implementation,mode,dtype,bytes,count,n_pes,samples,median_us,mean_us,min_us,max_us,p10_us,p90_us,algbw_gbs,busbw_gbs,hidden,ffn,tokens,tflops_per_gpu,speedup_vs_nccl,tp_overhead_percent,tp_slowest_pe_us,tp_overhead_slowest_percent,tp_auto,status,check";

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x}")).unwrap_or_default()
}

pub fn to_csv(records: &[Record]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in records {
        let (t, tp) = (r.time_us, r.tp);
        let status = match r.status {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Unsupported => "unsupported",
        };
        let fields = [
            csv_field(&r.test),
            csv_field(&r.variant),
            csv_field(&r.implementation),
            csv_field(&r.mode),
            csv_field(&r.dtype),
            r.bytes.to_string(),
            r.count.to_string(),
            r.n_pes.to_string(),
            t.map(|t| t.n.to_string()).unwrap_or_default(),
            opt(t.map(|t| t.median)),
            opt(t.map(|t| t.mean)),
            opt(t.map(|t| t.min)),
            opt(t.map(|t| t.max)),
            opt(t.map(|t| t.p10)),
            opt(t.map(|t| t.p90)),
            opt(r.algbw_gbs),
            opt(r.busbw_gbs),
            tp.map(|t| t.hidden.to_string()).unwrap_or_default(),
            tp.map(|t| t.ffn.to_string()).unwrap_or_default(),
            tp.map(|t| t.tokens.to_string()).unwrap_or_default(),
            opt(tp.and_then(|t| t.tflops_per_gpu)),
            opt(tp.and_then(|t| t.speedup_vs_nccl)),
            opt(tp.and_then(|t| t.overhead_percent)),
            opt(tp.and_then(|t| t.slowest_pe_us)),
            opt(tp.and_then(|t| t.overhead_slowest_percent)),
            tp.map(|t| t.auto.to_string()).unwrap_or_default(),
            status.to_string(),
            csv_field(&r.check),
        ];
        s.push_str(&fields.join(","));
        s.push('\n');
    }
    s
}

#[derive(Serialize)]
struct JsonReport<'a> {
    schema: &'static str,
    environment: Option<&'a Environment>,
    config: &'a Config,
    results: &'a [Record],
    notes: &'a [String],
    failed: usize,
}

pub fn to_json(results: &Results, cfg: &Config, env: Option<&Environment>) -> Result<String> {
    let report = JsonReport {
        schema: "nvshmem-bench/1",
        environment: env,
        config: cfg,
        results: &results.records,
        notes: &results.notes,
        failed: results.failed().count(),
    };
    serde_json::to_string_pretty(&report)
        .map_err(|e| BenchError::new(format!("JSON encoding failed: {e}")))
}

pub fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)
        .map_err(|e| BenchError::new(format!("cannot write {}: {e}", path.display())))
}

/// Write bench.json, bench.csv and summary.txt into `dir`; returns the paths.
pub fn write_all(
    dir: &Path,
    results: &Results,
    cfg: &Config,
    env: Option<&Environment>,
    summary: &str,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| BenchError::new(format!("cannot create {}: {e}", dir.display())))?;
    let json = dir.join("bench.json");
    write_file(&json, &to_json(results, cfg, env)?)?;
    let csv = dir.join("bench.csv");
    write_file(&csv, &to_csv(&results.records))?;
    let txt = dir.join("summary.txt");
    write_file(&txt, summary)?;
    Ok(vec![json, csv, txt])
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::cli::{Args, Config};
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

    fn cfg(args: &[&str]) -> Config {
        let mut v = vec!["bench"];
        v.extend_from_slice(args);
        Config::from_args(Args::try_parse_from(v).unwrap()).unwrap()
    }

    #[test]
    fn collective_tables_compare_ours_with_both_nccl_columns_and_the_better_one() {
        let mut rows = Vec::new();
        for (bytes, nccl, symm) in [(1024, 6.0, 4.0), (1 << 20, 20.0, 30.0)] {
            rows.push(record("allreduce", "ours", "graph", bytes, 2.0, Status::Ok));
            rows.push(record(
                "allreduce",
                "nccl",
                "graph",
                bytes,
                nccl,
                Status::Ok,
            ));
            rows.push(record(
                "allreduce",
                "nccl-symm",
                "graph",
                bytes,
                symm,
                Status::Ok,
            ));
        }
        let c = cfg(&[
            "--tests",
            "allreduce",
            "--dtypes",
            "f32",
            "--modes",
            "graph",
            "--impls",
            "ours,nccl,nccl-symm",
        ]);
        let tables = collective_tables(&rows, &c);
        assert_eq!(tables.len(), 1);
        let t = &tables[0];
        let col = |h: &str| t.headers.iter().position(|x| x == h).unwrap();
        let (vs_nccl, vs_symm, vs_best) = (
            col("ours vs nccl"),
            col("ours vs nccl-symm"),
            col("ours vs best nccl"),
        );
        // 1 KiB: symmetric NCCL is the better one; 1 MiB: the default path.
        assert_eq!(
            [
                &t.rows[0][vs_nccl],
                &t.rows[0][vs_symm],
                &t.rows[0][vs_best]
            ],
            ["3.00x", "2.00x", "2.00x"]
        );
        assert_eq!(
            [
                &t.rows[1][vs_nccl],
                &t.rows[1][vs_symm],
                &t.rows[1][vs_best]
            ],
            ["10.00x", "15.00x", "10.00x"]
        );
    }

    #[test]
    fn channel_rows_get_the_hand_off_and_throughput_tables() {
        let mut rows = Vec::new();
        for (imp, t) in [("ours", 3.0), ("nvshmem", 4.0), ("nccl", 9.0)] {
            rows.push(record(
                "channel_pingpong",
                imp,
                "graph",
                4096,
                t,
                Status::Ok,
            ));
        }
        for (imp, t) in [("ours", 5.0), ("nccl", 6.0)] {
            rows.push(record(
                "channel_throughput",
                imp,
                "graph",
                1 << 20,
                t,
                Status::Ok,
            ));
        }
        let tables = p2p_tables(&rows, &cfg(&[]));
        let titles: Vec<&str> = tables.iter().map(|t| t.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "channel hand-off, one way (us), PE 0 <-> PE 1",
                "channel throughput, full queue (us per message), PE 0 -> PE 1",
                "channel throughput, full queue (GB/s), PE 0 -> PE 1",
            ]
        );
        assert_eq!(
            tables[0].headers,
            ["size", "channel", "put+signal", "nccl send/recv"]
        );
        assert!(
            tables[0].rows[0][1].starts_with("3.00"),
            "{:?}",
            tables[0].rows
        );
        assert!(
            tables[0].rows[0][3].starts_with("9.00"),
            "{:?}",
            tables[0].rows
        );
        assert_eq!(tables[1].headers, ["size", "channel", "nccl send/recv"]);
        // One PE: a loopback, and the titles say so.
        for r in &mut rows {
            r.n_pes = 1;
        }
        let tables = p2p_tables(&rows, &cfg(&[]));
        assert!(tables.iter().all(|t| t.title.ends_with("PE 0 loopback")));
    }

    #[test]
    fn csv_has_a_header_and_quotes_awkward_fields() {
        let rows = vec![
            record("allreduce", "ours", "plain", 1024, 10.0, Status::Ok),
            record("allreduce", "nccl", "plain", 1024, 20.0, Status::Failed),
        ];
        let csv = to_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines.len(), 3);
        let cols = CSV_HEADER.split(',').count();
        assert!(lines[1].starts_with("allreduce,,ours,plain,f32,1024,256,8,3,10,"));
        assert_eq!(lines[1].split(',').count(), cols);
        assert!(
            lines[2].ends_with(",failed,\"3 wrong, \"\"first\"\", at 1\""),
            "{}",
            lines[2]
        );
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn json_holds_config_results_and_failures() {
        let c = cfg(&["--quick"]);
        let mut res = Results::default();
        res.push(record(
            "allgather",
            "nvshmem",
            "graph",
            4096,
            5.0,
            Status::Ok,
        ));
        res.push(record(
            "allgather",
            "ours",
            "graph",
            4096,
            4.0,
            Status::Failed,
        ));
        res.notes.push("p2p skipped".into());
        let text = to_json(&res, &c, None).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema"], "nvshmem-bench/1");
        assert_eq!(v["failed"], 1);
        assert_eq!(v["results"].as_array().unwrap().len(), 2);
        assert_eq!(v["results"][0]["time_us"]["median"], 5.0);
        assert_eq!(v["results"][1]["status"], "failed");
        assert_eq!(v["config"]["iters"], 10);
        assert_eq!(v["notes"][0], "p2p skipped");
    }

    #[test]
    fn files_are_written_to_the_output_directory() {
        let dir = std::env::temp_dir().join(format!("bench-report-test-{}", std::process::id()));
        let c = cfg(&[]);
        let mut res = Results::default();
        res.push(record("allreduce", "ours", "plain", 8, 3.0, Status::Ok));
        let paths = write_all(&dir, &res, &c, None, "summary").unwrap();
        assert_eq!(paths.len(), 3);
        let csv = std::fs::read_to_string(dir.join("bench.csv")).unwrap();
        assert!(csv.starts_with(CSV_HEADER));
        assert_eq!(
            std::fs::read_to_string(dir.join("summary.txt")).unwrap(),
            "summary"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn collective_table_puts_implementations_side_by_side() {
        let c = cfg(&["--dtypes", "f32", "--modes", "plain"]);
        let rows = vec![
            record("allreduce", "ours", "plain", 1 << 20, 10.0, Status::Ok),
            record("allreduce", "nvshmem", "plain", 1 << 20, 30.0, Status::Ok),
            record("allreduce", "nccl", "plain", 1 << 20, 20.0, Status::Ok),
        ];
        let tables = collective_tables(&rows, &c);
        assert_eq!(tables.len(), 1);
        let text = tables[0].render();
        assert!(
            text.contains("ours vs nccl") && text.contains("ours vs nvshmem"),
            "{text}"
        );
        assert!(text.contains("2.00x") && text.contains("3.00x"), "{text}");
        assert!(
            text.contains("1 MiB") && text.contains("10.00 ±5%"),
            "{text}"
        );
    }

    #[test]
    fn reduce_scatter_gets_its_own_tables_and_rows() {
        let c = cfg(&["--tests", "reducescatter", "--dtypes", "f32"]);
        let mut rows = Vec::new();
        for mode in ["plain", "graph"] {
            rows.push(record(
                "reducescatter",
                "ours",
                mode,
                1 << 20,
                10.0,
                Status::Ok,
            ));
            rows.push(record(
                "reducescatter",
                "nccl",
                mode,
                1 << 20,
                15.0,
                Status::Ok,
            ));
        }
        // NVSHMEM's reduce-scatter only at the sizes its scratch holds: a "-" at 1 MiB.
        rows.push(record(
            "reducescatter",
            "nvshmem",
            "plain",
            4096,
            8.0,
            Status::Ok,
        ));
        rows.push(record(
            "reducescatter",
            "ours",
            "plain",
            4096,
            4.0,
            Status::Ok,
        ));
        let tables = collective_tables(&rows, &c);
        assert_eq!(tables.len(), 2);
        let text = tables[0].render();
        assert!(
            text.contains("reduce-scatter (sum), f32, plain launches, 8 PEs"),
            "{text}"
        );
        assert!(text.contains("1.50x") && text.contains("2.00x"), "{text}");
        let mib_row = text
            .lines()
            .find(|l| l.trim_start().starts_with("1 MiB"))
            .unwrap();
        assert!(mib_row.contains(" - "), "{mib_row}");
        assert!(tables[1].render().contains("CUDA graph of 10 ops"));
        // Collective rows stay out of the point-to-point tables.
        assert!(p2p_tables(&rows, &c).is_empty());
        let csv = to_csv(&rows);
        assert!(csv
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("reducescatter,,ours,plain,f32,1048576,262144,8,"));
        let json = to_json(
            &Results {
                records: rows,
                notes: vec!["reducescatter f32: nvshmem not run above 256 KiB".into()],
            },
            &c,
            None,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["results"][0]["test"], "reducescatter");
        assert_eq!(v["config"]["tests"]["reducescatter"], true);
        assert_eq!(v["config"]["reducescatter_algo"], "auto");
        let text = render_tables(
            &Results {
                records: vec![record(
                    "reducescatter",
                    "ours",
                    "plain",
                    64,
                    1.0,
                    Status::Ok,
                )],
                notes: vec![],
            },
            &c,
        );
        assert!(text.contains("all 1 checks passed"), "{text}");
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

    #[test]
    fn tp_tables_compare_the_best_of_ours_with_cublasmp() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 4096, 1000.0),
            tp_record("8b", TpImpl::CublasOurs, 4096, 1100.0),
            tp_record("8b", TpImpl::Fused, 4096, 1050.0),
            tp_record("8b", TpImpl::Cublasmp, 4096, 1260.0),
        ];
        crate::tp::fill_relative(&mut rows);
        let text = tp_tables(&rows)[0].render();
        assert!(text.contains("cublasmp us"), "{text}");
        assert!(text.contains("best ours vs cublasmp"), "{text}");
        // The best of ours (fused, 1050) against cublasmp's 1260: 1.20x; cublasmp is 26%
        // over compute-only.
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("4096 "))
            .unwrap_or_else(|| panic!("no row: {text}"));
        assert!(row.trim_end().ends_with("1.20x"), "{row}");
        assert!(row.contains("26.0%"), "{row}");
    }

    #[test]
    fn tp_tables_name_the_schedule_auto_takes_and_time_it_against_nccl() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 4096, 1000.0),
            tp_record("8b", TpImpl::CublasNccl, 4096, 1400.0),
            tp_record("8b", TpImpl::CublasOurs, 4096, 1300.0),
            tp_record("8b", TpImpl::Overlapped, 4096, 1100.0),
            tp_record("8b", TpImpl::Fused, 4096, 1200.0),
        ];
        crate::tp::fill_relative(&mut rows);
        // No run said what Auto takes: no such column.
        let text = tp_tables(&rows)[0].render();
        assert!(!text.contains("auto"), "{text}");
        // Auto fuses here, though the overlapped schedule was the fastest of ours.
        rows[4].tp.as_mut().unwrap().auto = true;
        let text = tp_tables(&rows)[0].render();
        assert!(text.contains("auto vs nccl"), "{text}");
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("4096 "))
            .unwrap_or_else(|| panic!("no row: {text}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        // The best of ours: 1400 / 1100; Auto's: 1400 / 1200.
        assert_eq!(
            cells[cells.len() - 3..],
            ["1.27x", "fused", "1.17x"],
            "{row}"
        );
    }

    #[test]
    fn tp_tables_give_the_best_of_ours_over_cublas_only() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 1, 60.0),
            tp_record("8b", TpImpl::CublasOnly, 1, 80.0),
            tp_record("8b", TpImpl::CublasNccl, 1, 90.0),
            tp_record("8b", TpImpl::CublasOurs, 1, 70.0),
            tp_record("8b", TpImpl::Fused, 1, 72.0),
            tp_record("8b", TpImpl::ComputeOnly, 16, 100.0),
            tp_record("8b", TpImpl::CublasOurs, 16, 110.0),
        ];
        crate::tp::fill_relative(&mut rows[..5]);
        crate::tp::fill_relative(&mut rows[5..]);
        let text = tp_tables(&rows)[0].render();
        assert!(text.contains("best ours over cublas-only"), "{text}");
        let line = |m: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(m))
                .unwrap_or_else(|| panic!("no row {m}: {text}"))
                .to_string()
        };
        // M = 1: the best of ours (70) against cublas-only (80): -12.5%; cublas-only is
        // 33.3% over compute-only (60).
        let one = line("1 ");
        assert!(one.ends_with("-12.5%"), "{one}");
        assert!(one.contains("33.3%"), "{one}");
        // M = 16 has no cublas-only run: no figure.
        assert!(line("16 ").ends_with('-'), "{text}");
    }

    #[test]
    fn tp_rows_get_a_table_per_shape_and_their_own_csv_columns() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 16, 10.0),
            tp_record("8b", TpImpl::CublasNccl, 16, 30.0),
            tp_record("8b", TpImpl::CublasOurs, 16, 15.0),
            tp_record("70b", TpImpl::ComputeOnly, 1, 20.0),
        ];
        crate::tp::fill_relative(&mut rows[..3]);
        rows.push(record("allreduce", "ours", "plain", 64, 1.0, Status::Ok));
        let tables = tp_tables(&rows);
        // Without the PEs' own medians there is no slowest PE to compare with.
        assert!(!tables[0].render().contains("slowest PE"));
        // The slowest PE's compute-only (12 us) where PE 0's took 10: ours (15) is 25% over it.
        rows[0].tp.as_mut().unwrap().slowest_pe_us = Some(12.0);
        crate::tp::fill_relative(&mut rows[..3]);
        let with_slowest = tp_tables(&rows)[0].render();
        assert!(
            with_slowest.contains("slowest PE's compute-only us") && with_slowest.contains("25.0%"),
            "{with_slowest}"
        );
        assert_eq!(rows[2].tp.unwrap().overhead_slowest_percent, Some(25.0));
        rows[0].tp.as_mut().unwrap().slowest_pe_us = None;
        crate::tp::fill_relative(&mut rows[..3]);
        assert_eq!(tables.len(), 2);
        let text = tables[0].render();
        assert!(
            text.contains("tensor-parallel MLP 8b (hidden 4096, ffn 14336)"),
            "{text}"
        );
        assert!(
            text.contains("cublas+ours us") && text.contains("best ours vs nccl"),
            "{text}"
        );
        // ours: 50% over compute-only, 2x faster than nccl (200% over compute-only).
        assert!(
            text.contains("50.0%") && text.contains("200.0%") && text.contains("2.00x"),
            "{text}"
        );
        let other = tables[1].render();
        assert!(
            !other.contains("ours vs nccl") && !other.contains("overhead"),
            "{other}"
        );
        // The point-to-point tables leave tp rows alone.
        assert!(p2p_tables(&rows, &cfg(&[])).is_empty());
        let csv = to_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        let cols = CSV_HEADER.split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == cols), "{csv}");
        assert!(
            lines[3].starts_with("tp,8b,cublas+ours,graph,bf16,"),
            "{}",
            lines[3]
        );
        assert!(lines[3].contains(",4096,14336,16,"), "{}", lines[3]);
        assert!(lines[3].ends_with(",2,50,,,false,ok,ok"), "{}", lines[3]);
        assert!(lines[5].ends_with(",,,,,,,,,,ok,ok"), "{}", lines[5]);
        assert_eq!(rows[2].key(), "tp 8b M=16 cublas+ours");
        let json = to_json(
            &Results {
                records: rows,
                notes: vec![],
            },
            &cfg(&[]),
            None,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["results"][2]["tp"]["speedup_vs_nccl"], 2.0);
        assert_eq!(v["results"][2]["tp"]["tokens"], 16);
        assert!(v["results"][4].get("tp").is_none());
    }

    #[test]
    fn pool_rows_get_a_table_per_page_size_not_the_p2p_tables() {
        let row = |count: usize, page: usize, source: Source, median: f64, status: Status| {
            let mut r = record(
                POOL_TEST,
                source.name(),
                "graph",
                count * page,
                median,
                status,
            );
            r.count = count;
            r.variant = crate::pool::variant(page, source);
            r
        };
        let rows = vec![
            row(1, 16 << 10, Source::Peer, 2.5, Status::Ok),
            row(1, 16 << 10, Source::Local, 1.5, Status::Ok),
            row(256, 64 << 10, Source::Peer, 50.0, Status::Failed),
        ];
        assert!(p2p_tables(&rows, &cfg(&[])).is_empty());
        let tables = pool_tables(&rows);
        assert_eq!(tables.len(), 2);
        let text: String = tables.iter().map(Table::render).collect();
        assert!(text.contains("gather of 16 KiB pages"), "{text}");
        assert!(
            text.contains("one peer us") && text.contains("local GB/s"),
            "{text}"
        );
        assert!(text.contains("50.00! ±"), "{text}");
    }

    #[test]
    fn tables_align_columns() {
        let t = Table {
            title: "t".into(),
            headers: vec!["a".into(), "bbb".into()],
            rows: vec![vec!["1234".into(), "5".into()]],
            footer: vec![],
        };
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[2], "   a  bbb");
        assert_eq!(lines[4], "1234    5");
    }
}
