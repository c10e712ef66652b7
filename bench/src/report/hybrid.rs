//! The hybrid training step's table: a row per layout of the PEs, our step and NCCL's against
//! the step's compute and the whole model on one GPU.

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
    let percent = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.0}%", 100.0 * v));
    let rows = layouts
        .into_iter()
        .map(|layout| {
            let [ours, nccl, compute, one] =
                ["ours", "nccl", "compute", "1 GPU"].map(|imp| find(layout, imp));
            let fig = |r: Option<&Record>| r.and_then(|r| r.hybrid);
            let speedup = match (
                ours.and_then(|r| r.median_us()),
                nccl.and_then(|r| r.median_us()),
            ) {
                (Some(o), Some(n)) => format!("{:.2}x", n / o),
                _ => "-".into(),
            };
            let any = ours.or(nccl).or(compute);
            vec![
                layout.to_string(),
                any.map_or(0, |r| r.n_pes).to_string(),
                fig(any).map_or(0, |f| f.tokens_per_step).to_string(),
                time_cell(ours),
                time_cell(nccl),
                speedup,
                time_cell(compute),
                percent(fig(ours).and_then(|f| f.comm_share)),
                percent(fig(nccl).and_then(|f| f.comm_share)),
                time_cell(one),
                percent(fig(ours).and_then(|f| f.scaling_efficiency)),
                percent(fig(nccl).and_then(|f| f.scaling_efficiency)),
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
            "ours us",
            "nccl us",
            "ours vs nccl",
            "compute us",
            "ours comm share",
            "nccl comm share",
            "1 GPU us",
            "ours efficiency",
            "nccl efficiency",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        footer: vec![
            "a step: forward and backward of every micro-batch, weight gradients, their sum over \
             the replicas; us = the slowest PE's median ± half the p10-p90 range; ours vs nccl = \
             nccl us / ours us; compute = the same passes with no communication; comm share = \
             1 - compute us / the row's us; efficiency = tokens/s / (PEs x 1 GPU tokens/s); \
             ! = check failed"
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
    fn a_layout_row_compares_ours_with_nccl_and_gives_shares_and_efficiencies() {
        let row = |imp: &str, median: f64, n: usize, share: Option<f64>, eff: Option<f64>| {
            let mut r = record(HYBRID_TEST, imp, "graph", 0, median, Status::Ok);
            r.variant = "tp2 pp2 dp1".into();
            r.n_pes = n;
            r.hybrid = Some(HybridFigures {
                tp: 2,
                pp: 2,
                dp: 1,
                tokens_per_step: 128,
                tokens_per_s: Some(128.0 / (median * 1e-6)),
                scaling_efficiency: eff,
                comm_share: share,
            });
            r
        };
        let rows = [
            row("ours", 2000.0, 4, Some(0.1), Some(0.9)),
            row("nccl", 3000.0, 4, Some(0.4), Some(0.6)),
            row("compute", 1800.0, 4, None, None),
            row("1 GPU", 7200.0, 1, None, None),
        ];
        let t = &hybrid_tables(&rows)[0];
        assert_eq!(t.rows.len(), 1);
        let r = &t.rows[0];
        assert_eq!(r.len(), t.headers.len());
        assert_eq!(
            (r[0].as_str(), r[1].as_str(), r[2].as_str()),
            ("tp2 pp2 dp1", "4", "128")
        );
        assert_eq!(r[5], "1.50x");
        assert_eq!((r[7].as_str(), r[8].as_str()), ("10%", "40%"));
        assert_eq!((r[10].as_str(), r[11].as_str()), ("90%", "60%"));
        assert!(hybrid_tables(&[]).is_empty());
    }

    #[test]
    fn a_layout_without_nccl_leaves_its_cells_empty() {
        let mut r = record(HYBRID_TEST, "ours", "graph", 0, 2000.0, Status::Ok);
        r.variant = "tp2 pp1 dp1".into();
        r.hybrid = Some(HybridFigures::default());
        let t = &hybrid_tables(&[r])[0];
        assert_eq!((t.rows[0][4].as_str(), t.rows[0][5].as_str()), ("-", "-"));
    }
}
