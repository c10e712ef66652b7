//! The all-reduce + RMSNorm tables: one per hidden size, a row per token count.

use super::table::{by_variant, fmt_us, present, speedup, time_cell, Table};
use super::Record;
use crate::cli::format_size;
use crate::norm::{BlockImpl, NormImpl, BLOCK_TEST, NORM_TEST};

pub fn norm_tables(records: &[Record]) -> Vec<Table> {
    let mut out = Vec::new();
    for (variant, sel) in by_variant(records, |r| r.test == NORM_TEST) {
        let impls = present(NormImpl::ALL, &sel, NormImpl::name);
        let mut headers = vec!["tokens".to_string(), "bytes".to_string()];
        headers.extend(impls.iter().map(|i| format!("{} us", i.name())));
        headers.push("fused - all-reduce us".into());
        headers.extend(
            impls
                .iter()
                .filter(|i| matches!(i, NormImpl::Ours | NormImpl::Nccl))
                .map(|i| format!("fused vs {}", i.name())),
        );
        let mut tokens: Vec<usize> = sel.iter().map(|r| r.count).collect();
        tokens.sort_unstable();
        tokens.dedup();
        let table_rows = tokens
            .into_iter()
            .map(|t| {
                let get = |i: NormImpl| {
                    sel.iter()
                        .copied()
                        .find(|r| r.count == t && r.implementation == i.name())
                };
                let bytes = sel.iter().find(|r| r.count == t).map_or(0, |r| r.bytes);
                let mut row = vec![t.to_string(), format_size(bytes)];
                row.extend(impls.iter().map(|i| time_cell(get(*i))));
                let median = |i: NormImpl| get(i).and_then(|r| r.median_us());
                row.push(
                    median(NormImpl::Fused)
                        .zip(median(NormImpl::AllReduce))
                        .map_or("-".into(), |(f, a)| fmt_us(f - a)),
                );
                for i in impls
                    .iter()
                    .filter(|i| matches!(i, NormImpl::Ours | NormImpl::Nccl))
                {
                    row.push(speedup(get(NormImpl::Fused), get(*i)));
                }
                row
            })
            .collect();
        out.push(Table {
            title: format!(
                "all-reduce + residual + RMSNorm, bf16, {variant}, {} PEs (CUDA graphs)",
                sel[0].n_pes
            ),
            headers,
            rows: table_rows,
            footer: vec!["us = median per call ± half the p10-p90 range; fused = \
                 TensorParallel::all_reduce_rmsnorm; X+rmsnorm = X's all-reduce then \
                 TensorParallel::rmsnorm; \"fused vs X\" = time of X / time of fused; ! = check \
                 failed"
                .into()],
        });
    }
    out
}

/// The MLP block's table: a row per token count, what the residual add and RMSNorm cost
/// over the MLP alone, fused and apart.
pub fn block_tables(records: &[Record]) -> Vec<Table> {
    let sel: Vec<&Record> = records.iter().filter(|r| r.test == BLOCK_TEST).collect();
    let Some(first) = sel.first() else {
        return Vec::new();
    };
    let mut headers = vec!["tokens".to_string()];
    headers.extend(BlockImpl::ALL.iter().map(|i| format!("{} us", i.name())));
    headers.extend(["norm apart us", "norm fused us", "fused vs apart"].map(String::from));
    let mut tokens: Vec<usize> = sel.iter().map(|r| r.count).collect();
    tokens.sort_unstable();
    tokens.dedup();
    let rows = tokens
        .into_iter()
        .map(|t| {
            let get = |i: BlockImpl| {
                sel.iter()
                    .copied()
                    .find(|r| r.count == t && r.implementation == i.name())
            };
            let median = |i: BlockImpl| get(i).and_then(|r| r.median_us());
            let over = |i: BlockImpl| {
                median(i)
                    .zip(median(BlockImpl::MlpOnly))
                    .map_or("-".into(), |(a, b)| fmt_us(a - b))
            };
            let mut row = vec![t.to_string()];
            row.extend(BlockImpl::ALL.iter().map(|i| time_cell(get(*i))));
            row.push(over(BlockImpl::Apart));
            row.push(over(BlockImpl::Fused));
            row.push(speedup(get(BlockImpl::Fused), get(BlockImpl::Apart)));
            row
        })
        .collect();
    vec![Table {
        title: format!(
            "decoder layer MLP half, {} (TpMlp), {} PEs (CUDA graphs)",
            first.variant, first.n_pes
        ),
        headers,
        rows,
        footer: vec![
            "mlp+fused = TpMlp::forward_rmsnorm; mlp, rmsnorm = TpMlp::forward then \
             TensorParallel::rmsnorm; norm X = time of X - time of mlp; ! = check failed"
                .into(),
        ],
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::record;
    use crate::report::Status;

    #[test]
    fn the_norm_table_gives_what_fusing_adds_and_saves() {
        let rows: Vec<Record> = [
            (NormImpl::Fused, 2.5),
            (NormImpl::Ours, 4.0),
            (NormImpl::AllReduce, 2.25),
        ]
        .into_iter()
        .map(|(i, t)| {
            let mut r = record(NORM_TEST, i.name(), "graph", 8192, t, Status::Ok);
            r.variant = "hidden 4096".into();
            r.count = 1;
            r
        })
        .collect();
        let text = norm_tables(&rows)[0].render();
        assert!(text.contains("hidden 4096"), "{text}");
        assert!(text.contains("0.25"), "fused - all-reduce: {text}");
        assert!(text.contains("1.60x"), "fused vs ours+rmsnorm: {text}");
    }
}
