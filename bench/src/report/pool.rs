//! The page pool's tables: one per page size, the sources side by side.

use super::table::{bw_cell, time_cell, Table};
use super::Record;
use crate::cli::format_size;
use crate::pool::{Source, PAGE_BYTES, POOL_TEST};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::p2p::p2p_tables;
    use crate::report::tests::{cfg, record};
    use crate::report::Status;

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
}
