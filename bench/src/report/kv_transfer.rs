//! The KV hand-off's tables: one per page size, a row per request size, the three ways side
//! by side.

use super::table::{bw_cell, time_cell, Table};
use super::{Record, Status};
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
                // A failed row gives no ratio.
                let ok = |way| find(way, pages).filter(|r| r.status == Status::Ok);
                let t = |way| ok(way).and_then(|r| r.median_us());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::record;

    fn row(way: Way, pages: usize, median: f64, status: Status) -> Record {
        let mut r = record(KV_TEST, way.name(), "plain", pages << 16, median, status);
        r.variant = variant(64 << 10);
        r.count = pages;
        if status == Status::Failed {
            r.algbw_gbs = None;
        }
        r
    }

    #[test]
    fn a_table_per_page_size_with_the_ratios_of_good_rows_only() {
        let rows = vec![
            row(Way::PoolPull, 16, 10.0, Status::Ok),
            row(Way::Nccl, 16, 25.0, Status::Ok),
            row(Way::Put, 16, 8.0, Status::Ok),
            row(Way::PoolPull, 64, 30.0, Status::Failed),
            row(Way::Nccl, 64, 60.0, Status::Ok),
        ];
        let tables = kv_tables(&rows);
        assert_eq!(tables.len(), 1, "no 16 KiB rows, no 16 KiB table");
        let text = tables[0].render();
        assert!(text.contains("KV hand-off of 64 KiB pages"), "{text}");
        // 16 pages: NCCL 2.5 times the pull; the pull at 80% of the put's bandwidth.
        assert!(text.contains("2.50x") && text.contains("80%"), "{text}");
        // 64 pages: the failed pull gives no ratio, and its time is marked.
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("64 "))
            .unwrap();
        assert!(
            line.contains("30.00!") && line.trim_end().ends_with("-"),
            "{line}"
        );
    }
}
