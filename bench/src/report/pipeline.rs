//! The pipeline's tables: one per configuration (stages, micro-batches, shape), a row per
//! token count, the transports side by side.

use super::table::{by_variant, fmt_us, present, time_cell, Table};
use super::Record;
use crate::cli::format_size;
use crate::pipeline::{Transport, PIPELINE_TEST};

/// One table per configuration of the pipeline rows.
pub fn pipeline_tables(records: &[Record]) -> Vec<Table> {
    let mut out = Vec::new();
    let keep = |r: &Record| r.test == PIPELINE_TEST && r.pipeline.is_some();
    for (variant, sel) in by_variant(records, keep) {
        let transports = present(Transport::ALL, &sel, Transport::name);
        let mut headers = vec!["tokens".to_string(), "message".to_string()];
        for t in &transports {
            headers.push(format!("{} step us", t.name()));
        }
        for t in transports.iter().filter(|t| **t != Transport::Local) {
            headers.push(format!("{} exposed us", t.name()));
            headers.push(format!("{} bubble %", t.name()));
        }
        headers.push("ideal bubble %".into());
        if transports.contains(&Transport::Ours) {
            headers.push("ours hand-offs/s".into());
        }
        if transports.contains(&Transport::Nccl) {
            headers.push("ours vs nccl".into());
        }
        let mut tokens: Vec<usize> = sel
            .iter()
            .filter_map(|r| r.pipeline.map(|p| p.tokens))
            .collect();
        tokens.sort_unstable();
        tokens.dedup();
        let table_rows = tokens
            .into_iter()
            .map(|m| {
                let find = |t: Transport| {
                    sel.iter().copied().find(|r| {
                        r.implementation == t.name() && r.pipeline.is_some_and(|p| p.tokens == m)
                    })
                };
                let any = find(transports[0]);
                let mut row = vec![
                    m.to_string(),
                    any.map_or("-".into(), |r| format_size(r.bytes)),
                ];
                for t in &transports {
                    row.push(time_cell(find(*t)));
                }
                let fig = |t: Transport| find(t).and_then(|r| r.pipeline);
                for t in transports.iter().filter(|t| **t != Transport::Local) {
                    row.push(
                        fig(*t)
                            .and_then(|f| f.exposed_us)
                            .map_or("-".into(), fmt_us),
                    );
                    row.push(percent(fig(*t).and_then(|f| f.bubble_percent)));
                }
                row.push(percent(
                    any.and_then(|r| r.pipeline).map(|f| f.ideal_bubble_percent),
                ));
                if transports.contains(&Transport::Ours) {
                    row.push(
                        fig(Transport::Ours)
                            .and_then(|f| f.handoffs_per_s)
                            .map_or("-".into(), |v| format!("{:.0}", v)),
                    );
                }
                if transports.contains(&Transport::Nccl) {
                    row.push(
                        fig(Transport::Ours)
                            .and_then(|f| f.speedup_vs_nccl)
                            .map_or("-".into(), |v| format!("{v:.2}x")),
                    );
                }
                row
            })
            .collect();
        out.push(Table {
            title: format!("1F1B pipeline, {variant} (one stage per PE, CUDA graphs)"),
            headers,
            rows: table_rows,
            footer: vec![
                "step us = the slowest PE's median step ± half its p10-p90 range; local = each \
                 hand-off replaced by a local copy of the same bytes (the stages' compute); \
                 exposed = step - slowest local step x (m + p - 1) / m; bubble = the stages' \
                 mean idle share of the step (1 - local / step); ! = check failed"
                    .into(),
            ],
        });
    }
    out
}

fn percent(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}
