//! The KV hand-off's tables: one per page size, a row per request size, the three ways side
//! by side.

use super::table::{bw_cell, time_cell, Table};
use super::Record;
use crate::cli::format_size;
use crate::kv_transfer::{variant, Way, KV_TEST, PAGE_BYTES};

/// One table per page size of the kv-transfer rows.
pub fn kv_tables(records: &[Record]) -> Vec<Table> {
    let mut out = Vec::new();
    for page_bytes in PAGE_BYTES {
        let sel: Vec<&Record> = records
            .iter()
            .filter(|r| r.test == KV_TEST && r.variant == variant(page_bytes))
            .collect();
        let Some(first) = sel.first() else {
            continue;
        };
        let find = |way: Way, pages: usize| {
            sel.iter()
                .copied()
                .find(|r| r.implementation == way.name() && r.count == pages)
        };
        let mut counts: Vec<usize> = sel.iter().map(|r| r.count).collect();
        counts.sort_unstable();
        counts.dedup();
        let mut headers = vec!["pages".to_string(), "bytes".to_string()];
        for way in Way::ALL {
            headers.push(format!("{} us", way.name()));
            headers.push(format!("{} GB/s", way.name()));
        }
        headers.push("nccl / pull".into());
        headers.push("pull / put GB/s".into());
        let rows = counts
            .into_iter()
            .map(|pages| {
                let mut row = vec![pages.to_string(), format_size(pages * page_bytes)];
                for way in Way::ALL {
                    row.push(time_cell(find(way, pages)));
                    row.push(bw_cell(find(way, pages), false));
                }
                let t = |way| find(way, pages).and_then(|r| r.median_us());
                let bw = |way| find(way, pages).and_then(|r| r.algbw_gbs);
                row.push(match (t(Way::Nccl), t(Way::PoolPull)) {
                    (Some(a), Some(b)) => format!("{:.2}x", a / b),
                    _ => "-".into(),
                });
                row.push(match (bw(Way::PoolPull), bw(Way::Put)) {
                    (Some(a), Some(b)) => format!("{:.0}%", 100.0 * a / b),
                    _ => "-".into(),
                });
                row
            })
            .collect();
        out.push(Table {
            title: format!(
                "KV hand-off of {} pages, PE 0 to the decode PE, {} PEs",
                format_size(page_bytes),
                first.n_pes
            ),
            headers,
            rows,
            footer: vec![
                "us = median per request ± half the p10-p90 range; nccl / pull = NCCL's time over \
                 the pull's; pull / put GB/s = the pull's bandwidth as a share of a put of the same \
                 bytes; ! = check failed"
                    .into(),
            ],
        });
    }
    out
}
