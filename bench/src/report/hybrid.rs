//! The hybrid training step's table: a row per layout of the PEs, our step against the whole
//! model on one GPU.

use super::table::{time_cell, Table};
use super::Record;
use crate::hybrid::HYBRID_TEST;

/// One table of the hybrid rows (none without them).
pub fn hybrid_tables(records: &[Record]) -> Vec<Table> {
    let sel: Vec<&Record> = records
        .iter()
        .filter(|r| r.test == HYBRID_TEST && r.hybrid.is_some())
        .collect();
    if sel.is_empty() {
        return Vec::new();
    }
    let mut layouts: Vec<&str> = sel.iter().map(|r| r.variant.as_str()).collect();
    layouts.dedup();
    let find = |layout: &str, imp: &str| {
        sel.iter()
            .copied()
            .find(|r| r.variant == layout && r.implementation == imp)
    };
    let rows = layouts
        .into_iter()
        .map(|layout| {
            let (ours, one) = (find(layout, "ours"), find(layout, "1 GPU"));
            let fig = |r: Option<&Record>| r.and_then(|r| r.hybrid);
            let tokens = |r: Option<&Record>| {
                fig(r)
                    .and_then(|f| f.tokens_per_s)
                    .map_or("-".into(), |t| format!("{:.0}", t))
            };
            let efficiency = fig(ours)
                .and_then(|f| f.scaling_efficiency)
                .map_or("-".into(), |e| format!("{:.0}%", 100.0 * e));
            vec![
                layout.to_string(),
                ours.map_or(0, |r| r.n_pes).to_string(),
                fig(ours).map_or(0, |f| f.tokens_per_step).to_string(),
                time_cell(ours),
                tokens(ours),
                time_cell(one),
                tokens(one),
                efficiency,
            ]
        })
        .collect();
    vec![Table {
        title: "hybrid training step (8 Llama-like MLP blocks, hidden 2048, FFN 8192, 8 \
                micro-batches of 16 tokens per replica), CUDA graphs"
            .into(),
        headers: [
            "layout",
            "PEs",
            "tokens/step",
            "ours step us",
            "ours tokens/s",
            "1 GPU step us",
            "1 GPU tokens/s",
            "scaling efficiency",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        footer: vec![
            "a step: forward and backward of every micro-batch, weight gradients, their sum over \
             the replicas; us = the slowest PE's median ± half the p10-p90 range; scaling \
             efficiency = ours tokens/s / (PEs x 1 GPU tokens/s); ! = check failed"
                .into(),
        ],
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::record;
    use crate::report::{HybridFigures, Status};

    #[test]
    fn a_layout_row_shows_both_steps_and_the_efficiency() {
        let row = |imp: &str, median: f64, n: usize, rate: f64, eff: Option<f64>| {
            let mut r = record(HYBRID_TEST, imp, "graph", 0, median, Status::Ok);
            r.variant = "tp2 pp2 dp1".into();
            r.n_pes = n;
            r.hybrid = Some(HybridFigures {
                tp: 2,
                pp: 2,
                dp: 1,
                tokens_per_step: 128,
                tokens_per_s: Some(rate),
                scaling_efficiency: eff,
            });
            r
        };
        let rows = [
            row("ours", 2000.0, 4, 64000.0, Some(0.9)),
            row("1 GPU", 7200.0, 1, 17777.0, None),
        ];
        let t = &hybrid_tables(&rows)[0];
        assert_eq!(t.rows.len(), 1);
        let r = &t.rows[0];
        assert_eq!(
            (r[0].as_str(), r[1].as_str(), r[2].as_str()),
            ("tp2 pp2 dp1", "4", "128")
        );
        assert_eq!(
            (r[4].as_str(), r[6].as_str(), r[7].as_str()),
            ("64000", "17777", "90%")
        );
        assert!(hybrid_tables(&[]).is_empty());
    }
}
