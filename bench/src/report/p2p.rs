//! The point-to-point tables: latency by scope, ping-pong, host and stream, channels and
//! bandwidth.

use super::table::{bw_cell, sizes_of, time_cell, Table};
use super::Record;
use crate::cli::{format_size, Config};
use crate::pool::POOL_TEST;
use crate::stats::Collective;
use crate::tp::TP_TEST;

fn find(records: &[Record], f: impl Fn(&Record) -> bool) -> Option<&Record> {
    records.iter().find(|r| f(r))
}

/// A table column: its header and which records belong in it.
type Column = (String, Box<dyn Fn(&Record) -> bool>);

/// Point-to-point tables: latency by scope, ping-pong, host/stream, bandwidth.
pub fn p2p_tables(records: &[Record], cfg: &Config) -> Vec<Table> {
    let mut out = Vec::new();
    let p2p: Vec<Record> = records
        .iter()
        .filter(|r| {
            !Collective::is_collective_test(&r.test) && r.test != TP_TEST && r.test != POOL_TEST
        })
        .cloned()
        .collect();
    if p2p.is_empty() {
        return out;
    }
    let peer = cfg.peer;
    let note_spread = "us = median ± half the p10-p90 range; ! = check failed".to_string();

    // Single-element p and g.
    let single: Vec<&Record> = p2p
        .iter()
        .filter(|r| r.test == "p" || r.test == "g")
        .collect();
    if !single.is_empty() {
        out.push(Table {
            title: format!("device p/g latency (one uint32, one thread), PE 0 -> PE {peer}"),
            headers: vec!["operation".into(), "us".into()],
            rows: single
                .iter()
                .map(|r| {
                    let what = if r.test == "p" {
                        "nvshmem_uint32_p + quiet"
                    } else {
                        "nvshmem_uint32_g"
                    };
                    vec![what.to_string(), time_cell(Some(r))]
                })
                .collect(),
            footer: vec![note_spread.clone()],
        });
    }

    // Column-wise tables over sizes.
    let column_table =
        |title: String, columns: Vec<Column>, bw: bool, footer: String| -> Option<Table> {
            let sel: Vec<&Record> = p2p
                .iter()
                .filter(|r| columns.iter().any(|(_, f)| f(r)))
                .collect();
            if sel.is_empty() {
                return None;
            }
            let mut headers = vec!["size".to_string()];
            let present: Vec<&Column> = columns
                .iter()
                .filter(|(_, f)| sel.iter().any(|r| f(r)))
                .collect();
            headers.extend(present.iter().map(|(h, _)| h.clone()));
            let rows = sizes_of(sel.iter().copied())
                .into_iter()
                .map(|bytes| {
                    let mut row = vec![format_size(bytes)];
                    for (_, f) in &present {
                        let r = find(&p2p, |r| r.bytes == bytes && f(r));
                        row.push(if bw { bw_cell(r, false) } else { time_cell(r) });
                    }
                    row
                })
                .collect();
            Some(Table {
                title,
                headers,
                rows,
                footer: vec![footer],
            })
        };

    let scoped = |test: &'static str, scope: &'static str| -> Box<dyn Fn(&Record) -> bool> {
        Box::new(move |r: &Record| r.test == test && r.variant == scope)
    };
    let plain = |test: &'static str| -> Box<dyn Fn(&Record) -> bool> {
        Box::new(move |r: &Record| r.test == test)
    };

    let mut cols: Vec<Column> = Vec::new();
    for test in ["put", "get"] {
        for scope in ["thread", "warp", "block"] {
            cols.push((format!("{test} {scope}"), scoped(test, scope)));
        }
    }
    out.extend(column_table(
        format!("device-initiated put/get latency (us), PE 0 -> PE {peer}"),
        cols,
        false,
        format!("put = nvshmem[x]_putmem[_warp|_block] + nvshmem_quiet; get = nvshmem[x]_getmem[...]; {note_spread}"),
    ));

    let mut cols: Vec<Column> = Vec::new();
    for scope in ["thread", "warp", "block"] {
        cols.push((
            format!("signal {scope}"),
            scoped("put_signal_pingpong", scope),
        ));
    }
    for scope in ["thread", "warp", "block"] {
        cols.push((
            format!("channel {scope}"),
            scoped("channel_pingpong_device", scope),
        ));
    }
    cols.push(("nccl send/recv".into(), plain("nccl_pingpong")));
    out.extend(column_table(
        format!("ping-pong latency, one way (us), PE 0 <-> PE {peer}"),
        cols,
        false,
        format!(
            "round trip / 2; signal = put-with-signal + signal_wait_until; channel = \
             channel_push/channel_pop of nvshmem_rs/channel.cuh between persistent kernels; \
             {note_spread}"
        ),
    ));

    let cols: Vec<Column> = vec![
        ("host put".into(), plain("host_put")),
        ("host get".into(), plain("host_get")),
        ("stream put".into(), plain("stream_put")),
        ("stream get".into(), plain("stream_get")),
    ];
    out.extend(column_table(
        format!("host-initiated and on-stream latency (us), PE 0 -> PE {peer}"),
        cols,
        false,
        format!("host: nvshmem_putmem + nvshmem_quiet / nvshmem_getmem; stream: *_on_stream (+ quiet_on_stream); {note_spread}"),
    ));

    let by_impl = |test: &'static str, imp: &'static str| -> Box<dyn Fn(&Record) -> bool> {
        Box::new(move |r: &Record| r.test == test && r.implementation == imp)
    };
    // With one PE the channel rows are a loopback (channel.rs).
    let loopback = p2p
        .iter()
        .any(|r| r.test.starts_with("channel_") && r.n_pes == 1);
    let (both_ways, one_way) = match loopback {
        true => ("PE 0 loopback".to_string(), "PE 0 loopback".to_string()),
        false => (format!("PE 0 <-> PE {peer}"), format!("PE 0 -> PE {peer}")),
    };
    out.extend(column_table(
        format!("channel hand-off, one way (us), {both_ways}"),
        vec![
            ("channel".into(), by_impl("channel_pingpong", "ours")),
            ("put+signal".into(), by_impl("channel_pingpong", "nvshmem")),
            ("nccl send/recv".into(), by_impl("channel_pingpong", "nccl")),
        ],
        false,
        format!(
            "CUDA graphs of ping-pong rounds, round trip / 2; channel = Channel::send + recv; \
             put+signal = put_signal_on_stream + signal_wait_until_on_stream; {note_spread}"
        ),
    ));
    for (bw, unit) in [(false, "us per message"), (true, "GB/s")] {
        out.extend(column_table(
            format!("channel throughput, full queue ({unit}), {one_way}"),
            vec![
                ("channel".into(), by_impl("channel_throughput", "ours")),
                ("nccl send/recv".into(), by_impl("channel_throughput", "nccl")),
            ],
            bw,
            "messages back to back in CUDA graphs; channel of 4 slots; messages/s = 10^6 / us per message"
                .into(),
        ));
    }

    for (dir, label) in [("uni", "one way"), ("bidir", "both ways")] {
        let mut cols: Vec<Column> = Vec::new();
        for test in ["put_bw", "get_bw"] {
            for &ctas in &cfg.ctas {
                let variant = format!("{dir} ctas={ctas}");
                let name = test.trim_end_matches("_bw");
                cols.push((
                    format!("{name} {ctas}c"),
                    Box::new(move |r: &Record| r.test == test && r.variant == variant),
                ));
            }
        }
        let dir_s = dir.to_string();
        cols.push((
            "nccl".into(),
            Box::new(move |r: &Record| r.test == "nccl_sendrecv_bw" && r.variant == dir_s),
        ));
        out.extend(column_table(
            format!("bandwidth {label} (GB/s), PE 0 {} PE {peer}", if dir == "uni" { "->" } else { "<->" }),
            cols,
            true,
            "GB/s = 10^9 bytes/s from the median time; Nc = N CTAs; both ways counts the bytes of both directions"
                .into(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{cfg, record};
    use crate::report::Status;

    #[test]
    fn channel_rows_get_the_hand_off_and_throughput_tables() {
        let mut rows = Vec::new();
        for (imp, t) in [("ours", 3.0), ("nvshmem", 4.0), ("nccl", 9.0)] {
            rows.push(record(
                "channel_pingpong",
                imp,
                "graph",
                4096,
                t,
                Status::Ok,
            ));
        }
        for (imp, t) in [("ours", 5.0), ("nccl", 6.0)] {
            rows.push(record(
                "channel_throughput",
                imp,
                "graph",
                1 << 20,
                t,
                Status::Ok,
            ));
        }
        let tables = p2p_tables(&rows, &cfg(&[]));
        let titles: Vec<&str> = tables.iter().map(|t| t.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "channel hand-off, one way (us), PE 0 <-> PE 1",
                "channel throughput, full queue (us per message), PE 0 -> PE 1",
                "channel throughput, full queue (GB/s), PE 0 -> PE 1",
            ]
        );
        assert_eq!(
            tables[0].headers,
            ["size", "channel", "put+signal", "nccl send/recv"]
        );
        assert!(
            tables[0].rows[0][1].starts_with("3.00"),
            "{:?}",
            tables[0].rows
        );
        assert!(
            tables[0].rows[0][3].starts_with("9.00"),
            "{:?}",
            tables[0].rows
        );
        assert_eq!(tables[1].headers, ["size", "channel", "nccl send/recv"]);
        // One PE: a loopback, and the titles say so.
        for r in &mut rows {
            r.n_pes = 1;
        }
        let tables = p2p_tables(&rows, &cfg(&[]));
        assert!(tables.iter().all(|t| t.title.ends_with("PE 0 loopback")));
    }
}
