//! The bandwidth matrix's tables: a row per sending PE, a column per receiving PE.

use super::table::{fmt_gbs, fmt_us, Table};
use super::{Record, Status};
use crate::cli::{format_size, Config};
use crate::p2p::matrix::{AGGREGATE, BIDIR, LATENCY, UNI};

/// Where a pair's one-way bandwidth flags it: `--min-gbps`, or 80% of the median pair.
pub fn slow_below(uni: &[f64], min_gbps: f64) -> Option<f64> {
    if min_gbps > 0.0 {
        return Some(min_gbps);
    }
    let mut v: Vec<f64> = uni.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(0.8 * v[v.len() / 2])
}

/// The ordered pair a matrix row names (`"a->b"`).
fn pair(r: &Record) -> Option<(usize, usize)> {
    let (a, b) = r.variant.split_once("->")?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

pub fn matrix_tables(records: &[Record], cfg: &Config) -> Vec<Table> {
    let of = |test: &str| -> Vec<&Record> { records.iter().filter(|r| r.test == test).collect() };
    let uni = of(UNI);
    let Some(first) = uni.first() else {
        return Vec::new();
    };
    let n = first.n_pes;
    let uni_gbs: Vec<f64> = uni.iter().filter_map(|r| r.algbw_gbs).collect();
    let threshold = slow_below(&uni_gbs, cfg.min_gbps);
    let mut out = Vec::new();
    for (test, what, bandwidth) in [
        (UNI, "put bandwidth one way, GB/s", true),
        (
            BIDIR,
            "put bandwidth both ways (both directions counted), GB/s",
            true,
        ),
        (LATENCY, "8-byte put latency (put + quiet), us", false),
    ] {
        let rows_of = of(test);
        if rows_of.is_empty() {
            continue;
        }
        let cell = |a: usize, b: usize| -> String {
            if a == b {
                return "-".into();
            }
            let Some(r) = rows_of.iter().find(|r| pair(r) == Some((a, b))) else {
                return "".into();
            };
            let mark = if r.status == Status::Failed { "!" } else { "" };
            let value = match bandwidth {
                true => r.algbw_gbs.map(|g| {
                    let slow = test == UNI && threshold.is_some_and(|t| g < t);
                    format!("{}{}", fmt_gbs(g), if slow { "*" } else { "" })
                }),
                false => r.median_us().map(fmt_us),
            };
            format!("{}{mark}", value.unwrap_or_else(|| "FAIL".into()))
        };
        let mut headers = vec!["from \\ to".to_string()];
        headers.extend((0..n).map(|b| format!("PE {b}")));
        let rows = (0..n)
            .map(|a| {
                let mut row = vec![format!("PE {a}")];
                row.extend((0..n).map(|b| cell(a, b)));
                row
            })
            .collect();
        let mut footer = Vec::new();
        let ranked = rows_of.iter().filter_map(|r| {
            let v = if bandwidth {
                r.algbw_gbs
            } else {
                r.median_us().map(|t| -t)
            };
            v.map(|v| (v, r))
        });
        if let Some((_, r)) = ranked.min_by(|x, y| x.0.total_cmp(&y.0)) {
            let v = match bandwidth {
                true => format!("{} GB/s", r.algbw_gbs.map_or("-".into(), fmt_gbs)),
                false => format!("{} us", r.median_us().map_or("-".into(), fmt_us)),
            };
            footer.push(format!("slowest pair: {} at {v}", r.variant));
        }
        if test == UNI {
            if let Some(t) = threshold {
                footer.push(format!(
                    "* = under {} GB/s ({})",
                    fmt_gbs(t),
                    if cfg.min_gbps > 0.0 {
                        "--min-gbps"
                    } else {
                        "80% of the median pair"
                    }
                ));
            }
        }
        footer.push("! = check failed".into());
        out.push(Table {
            title: format!("{what}, {}, {n} PEs", format_size(rows_of[0].bytes)),
            headers,
            rows,
            footer,
        });
    }
    if let Some(r) = of(AGGREGATE).first() {
        out.push(Table {
            title: format!("every PE to every other at once, {n} PEs"),
            headers: vec![
                "bytes per destination".into(),
                "us".into(),
                "GB/s per GPU".into(),
            ],
            rows: vec![vec![
                format_size(r.bytes),
                r.median_us().map_or("FAIL".into(), fmt_us),
                format!(
                    "{}{}",
                    r.algbw_gbs.map_or("-".into(), fmt_gbs),
                    if r.status == Status::Failed { "!" } else { "" }
                ),
            ]],
            footer: vec![
                "GB/s per GPU = (PEs - 1) × bytes / the median time on PE 0; ! = check failed"
                    .into(),
            ],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{cfg, record};

    #[test]
    fn the_matrix_names_the_slowest_pair_and_flags_slow_ones() {
        let mut rows = Vec::new();
        for (a, b, gbs) in [
            (0, 1, 400.0),
            (1, 0, 390.0),
            (0, 2, 410.0),
            (2, 0, 200.0),
            (1, 2, 405.0),
            (2, 1, 395.0),
        ] {
            let mut r = record(UNI, "nvshmem", "device", 1 << 26, 1.0, Status::Ok);
            r.variant = format!("{a}->{b}");
            r.n_pes = 3;
            r.algbw_gbs = Some(gbs);
            rows.push(r);
        }
        let text = matrix_tables(&rows, &cfg(&[]))[0].render();
        assert!(text.contains("slowest pair: 2->0"), "{text}");
        assert!(text.contains("200.0*") || text.contains("200*"), "{text}");
        assert!(!text.contains("390.0*") && !text.contains("390*"), "{text}");
        assert_eq!(slow_below(&[100.0, 200.0, 300.0], 0.0), Some(160.0));
        assert_eq!(slow_below(&[100.0], 250.0), Some(250.0));
        assert_eq!(slow_below(&[], 0.0), None);
    }
}
