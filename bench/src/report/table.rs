//! Text tables with right-aligned columns, and the cells they are made of.

use super::Record;
use super::Status;
use std::fmt::Write as _;

/// A text table with right-aligned columns.
#[derive(Debug, Default)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub footer: Vec<String>,
}

impl Table {
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let mut width: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, c) in row.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut s = String::new();
        let _ = writeln!(s, "\n## {}", self.title);
        let line = |cells: &[String]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate().take(cols) {
                if i > 0 {
                    l.push_str("  ");
                }
                let pad = width[i].saturating_sub(c.chars().count());
                l.push_str(&" ".repeat(pad));
                l.push_str(c);
            }
            l.trim_end().to_string()
        };
        let _ = writeln!(s, "{}", line(&self.headers));
        let total: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
        let _ = writeln!(s, "{}", "-".repeat(total));
        for row in &self.rows {
            let _ = writeln!(s, "{}", line(row));
        }
        for f in &self.footer {
            let _ = writeln!(s, "{f}");
        }
        s
    }
}

pub(super) fn fmt_us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub(super) fn fmt_gbs(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A time cell: `12.34 ±3%`, `n/a`, or with `!` when the check failed.
pub(super) fn time_cell(r: Option<&Record>) -> String {
    match r {
        None => "-".into(),
        Some(r) => match (r.status, r.time_us) {
            (Status::Unsupported, _) => "n/a".into(),
            (_, None) => "FAIL".into(),
            (st, Some(t)) => {
                let mark = if st == Status::Failed { "!" } else { "" };
                format!("{}{mark} ±{:.0}%", fmt_us(t.median), t.spread_percent())
            }
        },
    }
}

pub(super) fn bw_cell(r: Option<&Record>, bus: bool) -> String {
    match r.and_then(|r| if bus { r.busbw_gbs } else { r.algbw_gbs }) {
        Some(v) => fmt_gbs(v),
        None => "-".into(),
    }
}

pub(super) fn speedup(ours: Option<&Record>, other: Option<&Record>) -> String {
    match (
        ours.and_then(|r| r.median_us()),
        other.and_then(|r| r.median_us()),
    ) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.2}x", b / a),
        _ => "-".into(),
    }
}

/// The records that `keep` selects, grouped by variant in the order the variants first come.
pub(super) fn by_variant(
    records: &[Record],
    keep: impl Fn(&Record) -> bool,
) -> Vec<(&str, Vec<&Record>)> {
    let mut groups: Vec<(&str, Vec<&Record>)> = Vec::new();
    for r in records.iter().filter(|r| keep(r)) {
        match groups.iter_mut().find(|(v, _)| *v == r.variant) {
            Some((_, g)) => g.push(r),
            None => groups.push((r.variant.as_str(), vec![r])),
        }
    }
    groups
}

/// Of `all`, in its order, those that some record of `sel` names as its implementation.
pub(super) fn present<T: Copy>(
    all: impl IntoIterator<Item = T>,
    sel: &[&Record],
    name: impl Fn(T) -> &'static str,
) -> Vec<T> {
    all.into_iter()
        .filter(|&i| sel.iter().any(|r| r.implementation == name(i)))
        .collect()
}

pub(super) fn sizes_of<'a>(records: impl Iterator<Item = &'a Record>) -> Vec<usize> {
    let mut v: Vec<usize> = records.map(|r| r.bytes).collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = Table {
            title: "t".into(),
            headers: vec!["a".into(), "bbb".into()],
            rows: vec![vec!["1234".into(), "5".into()]],
            footer: vec![],
        };
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[2], "   a  bbb");
        assert_eq!(lines[4], "1234    5");
    }

    #[test]
    fn records_group_by_variant_in_first_order() {
        use crate::report::tests::record;
        use crate::report::Status;
        let mut rows = Vec::new();
        for (v, imp) in [("b", "x"), ("a", "y"), ("b", "y"), ("c", "x")] {
            let mut r = record("t", imp, "graph", 8, 1.0, Status::Ok);
            r.variant = v.into();
            rows.push(r);
        }
        let groups = by_variant(&rows, |r| r.variant != "c");
        let shape: Vec<(&str, usize)> = groups.iter().map(|(v, g)| (*v, g.len())).collect();
        assert_eq!(shape, vec![("b", 2), ("a", 1)]);
        let names = |i: usize| ["x", "y", "z"][i];
        assert_eq!(present(0..3, &groups[1].1, names), vec![1]);
        assert_eq!(present(0..3, &groups[0].1, names), vec![0, 1]);
    }
}
