//! The floor's table: what no collective can beat on this machine, and the sum a one-shot
//! collective pays at least.

use super::table::{fmt_us, time_cell, Table};
use super::Record;
use crate::floor::{one_shot_floor_us, FLOOR_TEST, L2, NODE, NODE_PDL, STORE};

pub fn floor_tables(records: &[Record]) -> Vec<Table> {
    let rows: Vec<&Record> = records.iter().filter(|r| r.test == FLOOR_TEST).collect();
    if rows.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<Vec<String>> = [NODE, NODE_PDL, STORE, L2]
        .into_iter()
        .map(|v| {
            let r = rows.iter().copied().find(|r| r.variant == v);
            vec![v.to_string(), time_cell(r)]
        })
        .collect();
    out.push(vec![
        "one-shot collective floor (PDL node + store + L2)".into(),
        one_shot_floor_us(records).map_or("-".into(), fmt_us),
    ]);
    vec![Table {
        title: format!(
            "latency floor, {} PEs (PE 0 and --peer for the store)",
            rows[0].n_pes
        ),
        headers: vec!["what".into(), "us".into()],
        rows: out,
        footer: vec![
            "us = median ± half the p10-p90 range; a node = a one-thread kernel in a graph of \
             64; the store = half a ping-pong of st.release.sys / ld.acquire.sys; L2 = one \
             dependent ld.global.cg; ! = check failed"
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
    fn the_floor_table_lists_each_row_and_their_sum() {
        let rows: Vec<Record> = [(NODE, 1.2), (NODE_PDL, 0.6), (STORE, 1.25), (L2, 0.15)]
            .into_iter()
            .map(|(v, t)| {
                let mut r = record(FLOOR_TEST, "floor", "device", 8, t, Status::Ok);
                r.variant = v.into();
                r
            })
            .collect();
        let text = floor_tables(&rows)[0].render();
        assert!(
            text.contains("remote store, one way") && text.contains("1.25"),
            "{text}"
        );
        assert!(text.contains("2.00"), "the sum 0.6 + 1.25 + 0.15: {text}");
        assert!(floor_tables(&[]).is_empty());
    }
}
