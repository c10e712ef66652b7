//! The map's tables: lookup latency by owner, batched lookups against a local copy per value
//! size, and inserts.

use super::table::{bw_cell, time_cell, Table};
use super::Record;
use crate::cli::format_size;
use crate::map::{Kind, INSERT_VALUES, LOOKUP_VALUES, MAP_TEST};

fn keys_per_s(r: Option<&Record>) -> String {
    match r.and_then(|r| r.median_us().map(|t| (r, t))) {
        Some((r, t)) if r.check == "ok" => format!("{:.1}", r.count as f64 / t),
        _ => "-".into(),
    }
}

/// The latency table, a batched-lookup table per value size, and the insert table.
pub fn map_tables(records: &[Record]) -> Vec<Table> {
    let sel: Vec<&Record> = records.iter().filter(|r| r.test == MAP_TEST).collect();
    let Some(first) = sel.first() else {
        return Vec::new();
    };
    let n = first.n_pes;
    let find = |kind: Kind, value: usize, count: usize| {
        sel.iter().copied().find(|r| {
            r.implementation == kind.name()
                && r.variant.starts_with(&crate::map::variant(value))
                && r.count == count
        })
    };
    let counts = |kind: Kind, value: usize| {
        let mut c: Vec<usize> = sel
            .iter()
            .filter(|r| r.implementation == kind.name() && r.bytes == r.count * value)
            .map(|r| r.count)
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let mut out = Vec::new();
    let latency: Vec<Vec<String>> = [false, true]
        .into_iter()
        .filter_map(|remote| {
            let kind = Kind::Latency { remote };
            let r = sel
                .iter()
                .copied()
                .find(|r| r.implementation == kind.name())?;
            Some(vec![
                kind.name().to_string(),
                r.variant.clone(),
                time_cell(Some(r)),
            ])
        })
        .collect();
    if !latency.is_empty() {
        out.push(Table {
            title: format!("map lookup latency from a kernel, PE 0, {n} PEs"),
            headers: vec!["keys held by".into(), "values".into(), "us per lookup".into()],
            rows: latency,
            footer: vec!["us = median per lookup of a chain of 256 ± half the p10-p90 range; ! = check failed".into()],
        });
    }
    for value in LOOKUP_VALUES {
        let rows: Vec<Vec<String>> = counts(Kind::Lookup, value)
            .into_iter()
            .map(|count| {
                let (ours, copy) = (
                    find(Kind::Lookup, value, count),
                    find(Kind::LocalCopy, value, count),
                );
                vec![
                    count.to_string(),
                    format_size(count * value),
                    time_cell(ours),
                    bw_cell(ours, false),
                    keys_per_s(ours),
                    time_cell(copy),
                    bw_cell(copy, false),
                ]
            })
            .collect();
        if !rows.is_empty() {
            out.push(Table {
                title: format!("map lookup_batch of {} values by PE 0 (keys of every PE), {n} PEs", format_size(value)),
                headers: ["keys", "bytes", "lookup us", "lookup GB/s", "M keys/s", "local copy us", "local copy GB/s"]
                    .map(String::from)
                    .to_vec(),
                rows,
                footer: vec!["us = median per batch ± half the p10-p90 range (CUDA graphs); local copy = cuMemcpyDtoD of the same bytes; ! = check failed".into()],
            });
        }
    }
    let inserts: Vec<Vec<String>> = INSERT_VALUES
        .into_iter()
        .flat_map(|value| {
            counts(Kind::Insert, value)
                .into_iter()
                .map(move |c| (value, c))
        })
        .map(|(value, count)| {
            let r = find(Kind::Insert, value, count);
            vec![
                count.to_string(),
                format_size(value),
                time_cell(r),
                bw_cell(r, false),
                keys_per_s(r),
            ]
        })
        .collect();
    if !inserts.is_empty() {
        out.push(Table {
            title: format!("map insert_batch by PE 0 (keys of every PE), {n} PEs"),
            headers: ["keys", "values", "us", "GB/s", "M keys/s"].map(String::from).to_vec(),
            rows: inserts,
            footer: vec!["us = median per batch ± half the p10-p90 range, each after an untimed remove of the same keys; ! = check failed".into()],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::variant;
    use crate::report::tests::record;
    use crate::report::Status;

    fn row(kind: Kind, value: usize, count: usize, median: f64, status: Status) -> Record {
        let mut r = record(
            MAP_TEST,
            kind.name(),
            "graph",
            count * value,
            median,
            status,
        );
        r.variant = variant(value);
        r.count = count;
        if status == Status::Failed {
            r.check = "looked-up values: 1 wrong".into();
        }
        r
    }

    #[test]
    fn latency_lookups_and_inserts_each_get_their_table() {
        let mut latency = row(Kind::Latency { remote: false }, 64, 256, 1.5, Status::Ok);
        latency.variant = format!("{}, one warp", variant(64));
        let rows = vec![
            latency,
            row(Kind::Lookup, 64, 1024, 2.0, Status::Ok),
            row(Kind::LocalCopy, 64, 1024, 1.0, Status::Ok),
            row(Kind::Insert, 64, 1024, 4.0, Status::Failed),
        ];
        let tables = map_tables(&rows);
        let titles: Vec<&str> = tables.iter().map(|t| t.title.as_str()).collect();
        assert_eq!(tables.len(), 3, "{titles:?}");
        let text: String = tables.iter().map(Table::render).collect();
        assert!(
            text.contains("local owner") && text.contains("1.50"),
            "{text}"
        );
        // 1024 keys in 2 us: 512 M keys/s.
        assert!(
            text.contains("lookup_batch of 64 B values") && text.contains("512.0"),
            "{text}"
        );
        // A failed insert is marked and gives no rate.
        let line = text.lines().find(|l| l.contains("4.00!")).unwrap();
        assert!(line.trim_end().ends_with("-"), "{line}");
    }
}
