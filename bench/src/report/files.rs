//! The files of `--out`: bench.csv, bench.json and summary.txt.

use super::{Record, Results, Status};
use crate::cli::Config;
use crate::env::Environment;
use crate::error::{BenchError, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The CSV header and rows.
pub const CSV_HEADER: &str = "test,variant,implementation,mode,dtype,bytes,count,n_pes,samples,median_us,mean_us,min_us,max_us,p10_us,p90_us,algbw_gbs,busbw_gbs,hidden,ffn,tokens,tflops_per_gpu,speedup_vs_nccl,tp_overhead_percent,tp_slowest_pe_us,tp_overhead_slowest_percent,tp_auto,status,check";

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x}")).unwrap_or_default()
}

pub fn to_csv(records: &[Record]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in records {
        let (t, tp) = (r.time_us, r.tp);
        let status = match r.status {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Unsupported => "unsupported",
        };
        let fields = [
            csv_field(&r.test),
            csv_field(&r.variant),
            csv_field(&r.implementation),
            csv_field(&r.mode),
            csv_field(&r.dtype),
            r.bytes.to_string(),
            r.count.to_string(),
            r.n_pes.to_string(),
            t.map(|t| t.n.to_string()).unwrap_or_default(),
            opt(t.map(|t| t.median)),
            opt(t.map(|t| t.mean)),
            opt(t.map(|t| t.min)),
            opt(t.map(|t| t.max)),
            opt(t.map(|t| t.p10)),
            opt(t.map(|t| t.p90)),
            opt(r.algbw_gbs),
            opt(r.busbw_gbs),
            tp.map(|t| t.hidden.to_string()).unwrap_or_default(),
            tp.map(|t| t.ffn.to_string()).unwrap_or_default(),
            tp.map(|t| t.tokens.to_string()).unwrap_or_default(),
            opt(tp.and_then(|t| t.tflops_per_gpu)),
            opt(tp.and_then(|t| t.speedup_vs_nccl)),
            opt(tp.and_then(|t| t.overhead_percent)),
            opt(tp.and_then(|t| t.slowest_pe_us)),
            opt(tp.and_then(|t| t.overhead_slowest_percent)),
            tp.map(|t| t.auto.to_string()).unwrap_or_default(),
            status.to_string(),
            csv_field(&r.check),
        ];
        s.push_str(&fields.join(","));
        s.push('\n');
    }
    s
}

#[derive(Serialize)]
struct JsonReport<'a> {
    schema: &'static str,
    environment: Option<&'a Environment>,
    config: &'a Config,
    results: &'a [Record],
    notes: &'a [String],
    failed: usize,
}

pub fn to_json(results: &Results, cfg: &Config, env: Option<&Environment>) -> Result<String> {
    let report = JsonReport {
        schema: "nvshmem-bench/1",
        environment: env,
        config: cfg,
        results: &results.records,
        notes: &results.notes,
        failed: results.failed().count(),
    };
    serde_json::to_string_pretty(&report)
        .map_err(|e| BenchError::new(format!("JSON encoding failed: {e}")))
}

pub fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)
        .map_err(|e| BenchError::new(format!("cannot write {}: {e}", path.display())))
}

/// Write bench.json, bench.csv and summary.txt into `dir`; returns the paths.
pub fn write_all(
    dir: &Path,
    results: &Results,
    cfg: &Config,
    env: Option<&Environment>,
    summary: &str,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| BenchError::new(format!("cannot create {}: {e}", dir.display())))?;
    let json = dir.join("bench.json");
    write_file(&json, &to_json(results, cfg, env)?)?;
    let csv = dir.join("bench.csv");
    write_file(&csv, &to_csv(&results.records))?;
    let txt = dir.join("summary.txt");
    write_file(&txt, summary)?;
    Ok(vec![json, csv, txt])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{cfg, record};

    #[test]
    fn csv_has_a_header_and_quotes_awkward_fields() {
        let rows = vec![
            record("allreduce", "ours", "plain", 1024, 10.0, Status::Ok),
            record("allreduce", "nccl", "plain", 1024, 20.0, Status::Failed),
        ];
        let csv = to_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines.len(), 3);
        let cols = CSV_HEADER.split(',').count();
        assert!(lines[1].starts_with("allreduce,,ours,plain,f32,1024,256,8,3,10,"));
        assert_eq!(lines[1].split(',').count(), cols);
        assert!(
            lines[2].ends_with(",failed,\"3 wrong, \"\"first\"\", at 1\""),
            "{}",
            lines[2]
        );
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn json_holds_config_results_and_failures() {
        let c = cfg(&["--quick"]);
        let mut res = Results::default();
        res.push(record(
            "allgather",
            "nvshmem",
            "graph",
            4096,
            5.0,
            Status::Ok,
        ));
        res.push(record(
            "allgather",
            "ours",
            "graph",
            4096,
            4.0,
            Status::Failed,
        ));
        res.notes.push("p2p skipped".into());
        let text = to_json(&res, &c, None).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema"], "nvshmem-bench/1");
        assert_eq!(v["failed"], 1);
        assert_eq!(v["results"].as_array().unwrap().len(), 2);
        assert_eq!(v["results"][0]["time_us"]["median"], 5.0);
        assert_eq!(v["results"][1]["status"], "failed");
        assert_eq!(v["config"]["iters"], 10);
        assert_eq!(v["notes"][0], "p2p skipped");
    }

    #[test]
    fn files_are_written_to_the_output_directory() {
        let dir = std::env::temp_dir().join(format!("bench-report-test-{}", std::process::id()));
        let c = cfg(&[]);
        let mut res = Results::default();
        res.push(record("allreduce", "ours", "plain", 8, 3.0, Status::Ok));
        let paths = write_all(&dir, &res, &c, None, "summary").unwrap();
        assert_eq!(paths.len(), 3);
        let csv = std::fs::read_to_string(dir.join("bench.csv")).unwrap();
        assert!(csv.starts_with(CSV_HEADER));
        assert_eq!(
            std::fs::read_to_string(dir.join("summary.txt")).unwrap(),
            "summary"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
