//! The collectives' tables: ours against NVSHMEM and NCCL, side by side.

use super::table::{bw_cell, sizes_of, speedup, time_cell, Table};
use super::Record;
use crate::cli::{format_size, Config};
use crate::floor::one_shot_floor_us;
use crate::stats::Collective;

/// Of two rows, the one with the lower median time (either, when only one has a time).
fn faster<'a>(a: Option<&'a Record>, b: Option<&'a Record>) -> Option<&'a Record> {
    match (a.and_then(|r| r.median_us()), b.and_then(|r| r.median_us())) {
        (Some(x), Some(y)) => Some(if x <= y { a? } else { b? }),
        (Some(_), None) => a,
        (None, Some(_)) => b,
        (None, None) => None,
    }
}

/// One table per collective, data type and mode: ours vs NVSHMEM vs NCCL.
pub fn collective_tables(records: &[Record], cfg: &Config) -> Vec<Table> {
    let mut out = Vec::new();
    let floor = one_shot_floor_us(records);
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
                if has("ours") && floor.is_some() {
                    headers.push("ours / floor".into());
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
                    if let (true, Some(f)) = (has("ours"), floor) {
                        let ratio = get("ours").and_then(|r| r.median_us()).map(|t| t / f);
                        row.push(ratio.map_or("-".into(), |x| format!("{x:.2}x")));
                    }
                    rows.push(row);
                }
                let mode_text = if mode.name() == "graph" {
                    format!("CUDA graph of {} ops", cfg.graph_ops)
                } else {
                    "plain launches".to_string()
                };
                // `--team-size`: the rows are per team, every team at once.
                let teams = match sel[0].variant.as_str() {
                    "" => String::new(),
                    v => format!(", {v}"),
                };
                out.push(Table {
                    title: format!("{title}, {}, {mode_text}, {n_pes} PEs{teams}", dtype.name()),
                    headers,
                    rows,
                    footer: vec![
                        "us = median time per operation ± half the p10-p90 range; busbw in GB/s (nccl-tests); \
                         \"ours vs X\" = time of X / time of ours (> 1: ours is faster); \
                         ours / floor = time of ours / the one-shot latency floor of this run; \
                         ! = check failed"
                            .into(),
                    ],
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::files::{to_csv, to_json};
    use crate::report::p2p::p2p_tables;
    use crate::report::tests::{cfg, record};
    use crate::report::{render_tables, Results, Status};

    #[test]
    fn team_rows_are_ours_alone_and_their_title_says_the_teams() {
        let place = crate::teams::Place {
            me: 1,
            n: 2,
            first: 2,
            teams: 2,
        };
        let mut row = record("allreduce", "ours", "graph", 1024, 3.0, Status::Ok);
        (row.variant, row.n_pes) = (place.variant(), place.n);
        let c = cfg(&[
            "--tests",
            "allreduce",
            "--dtypes",
            "f32",
            "--modes",
            "graph",
            "--impls",
            "ours,nccl,nvshmem",
            "--team-size",
            "2",
        ]);
        assert_eq!(c.collective_impls(), [crate::cli::Impl::Ours]);
        let tables = collective_tables(&[row], &c);
        assert_eq!(tables.len(), 1);
        let t = &tables[0];
        assert!(
            t.title.ends_with("2 PEs, teams of 2 (2 at once)"),
            "{}",
            t.title
        );
        assert!(
            !t.headers.iter().any(|h| h.contains("nccl")),
            "{:?}",
            t.headers
        );
        let bench = |args: &[&str]| {
            let v: Vec<&str> = ["bench"].iter().chain(args).copied().collect();
            Config::from_args(<crate::cli::Args as clap::Parser>::try_parse_from(v).unwrap())
        };
        let e = bench(&["--team-size", "0"]).err().unwrap();
        assert!(e.contains("--team-size"), "{e}");
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
}
