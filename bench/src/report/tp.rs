//! The tensor-parallel MLP tables: one per shape, the implementations side by side.

use super::table::{fmt_gbs, fmt_us, speedup, time_cell, Table};
use super::{Record, Status};
use crate::tp::{TpImpl, TP_TEST};

/// The shapes of the tp rows, in the order first measured: (name, hidden, ffn).
pub fn tp_shapes_of(records: &[Record]) -> Vec<(String, usize, usize)> {
    let mut shapes: Vec<(String, usize, usize)> = Vec::new();
    for r in records.iter().filter(|r| r.test == TP_TEST) {
        if let Some(tp) = &r.tp {
            if !shapes.iter().any(|(name, _, _)| *name == r.variant) {
                shapes.push((r.variant.clone(), tp.hidden, tp.ffn));
            }
        }
    }
    shapes
}

fn percent_cell(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{v:.1}%"),
        None => "-".into(),
    }
}

/// One table per tensor-parallel MLP shape: a row per token count, the implementations side
/// by side.
pub fn tp_tables(records: &[Record]) -> Vec<Table> {
    let mut out = Vec::new();
    for (shape, hidden, ffn) in tp_shapes_of(records) {
        let sel: Vec<&Record> = records
            .iter()
            .filter(|r| r.test == TP_TEST && r.variant == shape)
            .collect();
        let n_pes = sel[0].n_pes;
        let impls: Vec<&str> = TpImpl::ALL
            .iter()
            .map(|i| i.name())
            .filter(|name| sel.iter().any(|r| r.implementation == *name))
            .collect();
        let compute = TpImpl::ComputeOnly.name();
        let nccl = TpImpl::CublasNccl.name();
        let ours_impls = [
            TpImpl::CublasOurs.name(),
            TpImpl::Overlapped.name(),
            TpImpl::Fused.name(),
        ];
        let mut headers = vec!["M".to_string()];
        for &i in &impls {
            headers.push(format!("{i} us"));
            headers.push("TFLOP/s".into());
            if i != compute {
                headers.push("overhead".into());
            }
        }
        let cublas = TpImpl::CublasOnly.name();
        let any_ours = ours_impls.iter().any(|o| impls.contains(o));
        let both = impls.contains(&nccl) && any_ours;
        let over_cublas = impls.contains(&cublas) && any_ours;
        let mp = TpImpl::Cublasmp.name();
        let vs_mp = impls.contains(&mp) && any_ours;
        if both {
            headers.push("best ours vs nccl".into());
        }
        // The schedule `forward` takes, where the run says.
        let has_auto = sel.iter().any(|r| r.tp.is_some_and(|t| t.auto));
        if has_auto {
            headers.push("auto".into());
            if impls.contains(&nccl) {
                headers.push("auto vs nccl".into());
            }
        }
        if vs_mp {
            headers.push("best ours vs cublasmp".into());
        }
        if over_cublas {
            headers.push("best ours over cublas-only".into());
        }
        // Against the slowest PE's local work, where the PEs' own medians were gathered.
        let slowest = |imp: &str, m: usize| {
            sel.iter()
                .find(|r| {
                    r.implementation == imp
                        && r.status == Status::Ok
                        && r.tp.is_some_and(|t| t.tokens == m)
                })
                .and_then(|r| r.tp.and_then(|t| t.slowest_pe_us))
        };
        let by_slowest = n_pes > 1
            && any_ours
            && sel.iter().any(|r| {
                r.implementation == compute && r.tp.is_some_and(|t| t.slowest_pe_us.is_some())
            });
        if by_slowest {
            headers.push("slowest PE's compute-only us".into());
            headers.push("best ours over it".into());
            if impls.contains(&cublas) {
                headers.push("best ours over slowest PE's cublas-only".into());
            }
        }
        let mut tokens: Vec<usize> = sel.iter().filter_map(|r| r.tp.map(|t| t.tokens)).collect();
        tokens.sort_unstable();
        tokens.dedup();
        let mut rows = Vec::new();
        for m in tokens {
            let get = |imp: &str| {
                sel.iter()
                    .copied()
                    .find(|r| r.implementation == imp && r.tp.is_some_and(|t| t.tokens == m))
            };
            let mut row = vec![m.to_string()];
            for &i in &impls {
                let r = get(i);
                let fig = r.and_then(|r| r.tp);
                row.push(time_cell(r));
                row.push(match fig.and_then(|f| f.tflops_per_gpu) {
                    Some(v) => fmt_gbs(v),
                    None => "-".into(),
                });
                if i != compute {
                    row.push(percent_cell(fig.and_then(|f| f.overhead_percent)));
                }
            }
            // The faster of our schedules.
            let best = ours_impls
                .iter()
                .filter_map(|&o| get(o))
                .filter(|r| r.status == Status::Ok && r.median_us().is_some())
                .min_by(|a, b| a.median_us().unwrap().total_cmp(&b.median_us().unwrap()));
            if both {
                row.push(speedup(best, get(nccl)));
            }
            if has_auto {
                let auto = sel
                    .iter()
                    .copied()
                    .find(|r| r.tp.is_some_and(|t| t.tokens == m && t.auto));
                row.push(auto.map_or("-".into(), |r| r.implementation.clone()));
                if impls.contains(&nccl) {
                    let timed = auto.filter(|r| r.status == Status::Ok);
                    row.push(speedup(timed, get(nccl)));
                }
            }
            if vs_mp {
                row.push(speedup(best, get(mp)));
            }
            if over_cublas {
                let base = get(cublas)
                    .filter(|r| r.status == Status::Ok)
                    .and_then(|r| r.median_us());
                let t = best.and_then(|r| r.median_us());
                row.push(percent_cell(
                    t.zip(base)
                        .and_then(|(t, c)| crate::tp::overhead_percent(t, c)),
                ));
            }
            if by_slowest {
                row.push(slowest(compute, m).map_or("-".into(), fmt_us));
                row.push(percent_cell(
                    best.and_then(|r| r.tp)
                        .and_then(|t| t.overhead_slowest_percent),
                ));
                if impls.contains(&cublas) {
                    let t = best.and_then(|r| r.median_us());
                    row.push(percent_cell(
                        t.zip(slowest(cublas, m))
                            .and_then(|(t, c)| crate::tp::overhead_percent(t, c)),
                    ));
                }
            }
            rows.push(row);
        }
        let mut footer = vec![
            "us = median time per forward ± half the p10-p90 range",
            "TFLOP/s per GPU = 6 M hidden ffn / PEs / time",
        ];
        if impls.iter().any(|&i| i != compute) {
            footer.push("overhead = (time - compute-only) / compute-only");
        }
        if both {
            footer.push(
                "\"best ours vs nccl\" = time of cublas+nccl / the fastest of cublas+ours, overlapped and fused (> 1: ours is faster); fused runs where the layers have a fused form (up to 8 tokens, and from 512 tokens per PE), overlapped in sequence parallelism (-sp) only",
            );
        }
        if has_auto {
            footer.push("auto = the schedule that forward (Schedule::Auto) takes there; \"auto vs nccl\" = time of cublas+nccl / its time");
        }
        if vs_mp {
            footer.push("\"best ours vs cublasmp\" = time of cublasmp / the fastest of ours (> 1: ours is faster); cublasmp = cuBLASMp's GEMM + all-reduce without overlap (its overlapped one needs NVLink multicast, kept off), and in sequence parallelism its overlapped all-gather + GEMM and GEMM + reduce-scatter");
        }
        if impls.contains(&cublas) {
            footer.push("compute-only's GEMMs are, up to 16 tokens, the faster of our decode kernel and cuBLASLt for each GEMM, and cuBLASLt's algorithms up to 256 tokens the fastest of its heuristic's first 8 (measured when the weights were loaded); cublas-only's are cuBLASLt's with its heuristic's first choice (run up to 256 tokens)");
        }
        if over_cublas {
            footer.push("\"best ours over cublas-only\" = (the fastest of our schedules - cublas-only) / cublas-only: the TP overhead over cuBLAS's compute alone");
        }
        if by_slowest {
            footer.push("the baselines' times are PE 0's; \"slowest PE's\" = the largest of the PEs' own medians, the local work of the slowest GPU, which a layer that communicates waits for; \"best ours over it\" = (the fastest of our schedules - that) / that");
        }
        footer.push("! = check failed");
        out.push(Table {
            title: format!(
                "tensor-parallel MLP {shape} (hidden {hidden}, ffn {ffn}), bf16, TP {n_pes} (one PE per GPU), CUDA graphs"
            ),
            headers,
            rows,
            footer: vec![footer.join("; ")],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::files::{to_csv, to_json, CSV_HEADER};
    use crate::report::p2p::p2p_tables;
    use crate::report::tests::{cfg, record, tp_record};
    use crate::report::Results;

    #[test]
    fn tp_tables_compare_the_best_of_ours_with_cublasmp() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 4096, 1000.0),
            tp_record("8b", TpImpl::CublasOurs, 4096, 1100.0),
            tp_record("8b", TpImpl::Fused, 4096, 1050.0),
            tp_record("8b", TpImpl::Cublasmp, 4096, 1260.0),
        ];
        crate::tp::fill_relative(&mut rows);
        let text = tp_tables(&rows)[0].render();
        assert!(text.contains("cublasmp us"), "{text}");
        assert!(text.contains("best ours vs cublasmp"), "{text}");
        // The best of ours (fused, 1050) against cublasmp's 1260: 1.20x; cublasmp is 26%
        // over compute-only.
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("4096 "))
            .unwrap_or_else(|| panic!("no row: {text}"));
        assert!(row.trim_end().ends_with("1.20x"), "{row}");
        assert!(row.contains("26.0%"), "{row}");
    }

    #[test]
    fn tp_tables_name_the_schedule_auto_takes_and_time_it_against_nccl() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 4096, 1000.0),
            tp_record("8b", TpImpl::CublasNccl, 4096, 1400.0),
            tp_record("8b", TpImpl::CublasOurs, 4096, 1300.0),
            tp_record("8b", TpImpl::Overlapped, 4096, 1100.0),
            tp_record("8b", TpImpl::Fused, 4096, 1200.0),
        ];
        crate::tp::fill_relative(&mut rows);
        // No run said what Auto takes: no such column.
        let text = tp_tables(&rows)[0].render();
        assert!(!text.contains("auto"), "{text}");
        // Auto fuses here, though the overlapped schedule was the fastest of ours.
        rows[4].tp.as_mut().unwrap().auto = true;
        let text = tp_tables(&rows)[0].render();
        assert!(text.contains("auto vs nccl"), "{text}");
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("4096 "))
            .unwrap_or_else(|| panic!("no row: {text}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        // The best of ours: 1400 / 1100; Auto's: 1400 / 1200.
        assert_eq!(
            cells[cells.len() - 3..],
            ["1.27x", "fused", "1.17x"],
            "{row}"
        );
    }

    #[test]
    fn tp_tables_give_the_best_of_ours_over_cublas_only() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 1, 60.0),
            tp_record("8b", TpImpl::CublasOnly, 1, 80.0),
            tp_record("8b", TpImpl::CublasNccl, 1, 90.0),
            tp_record("8b", TpImpl::CublasOurs, 1, 70.0),
            tp_record("8b", TpImpl::Fused, 1, 72.0),
            tp_record("8b", TpImpl::ComputeOnly, 16, 100.0),
            tp_record("8b", TpImpl::CublasOurs, 16, 110.0),
        ];
        crate::tp::fill_relative(&mut rows[..5]);
        crate::tp::fill_relative(&mut rows[5..]);
        let text = tp_tables(&rows)[0].render();
        assert!(text.contains("best ours over cublas-only"), "{text}");
        let line = |m: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(m))
                .unwrap_or_else(|| panic!("no row {m}: {text}"))
                .to_string()
        };
        // M = 1: the best of ours (70) against cublas-only (80): -12.5%; cublas-only is
        // 33.3% over compute-only (60).
        let one = line("1 ");
        assert!(one.ends_with("-12.5%"), "{one}");
        assert!(one.contains("33.3%"), "{one}");
        // M = 16 has no cublas-only run: no figure.
        assert!(line("16 ").ends_with('-'), "{text}");
    }

    #[test]
    fn tp_rows_get_a_table_per_shape_and_their_own_csv_columns() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 16, 10.0),
            tp_record("8b", TpImpl::CublasNccl, 16, 30.0),
            tp_record("8b", TpImpl::CublasOurs, 16, 15.0),
            tp_record("70b", TpImpl::ComputeOnly, 1, 20.0),
        ];
        crate::tp::fill_relative(&mut rows[..3]);
        rows.push(record("allreduce", "ours", "plain", 64, 1.0, Status::Ok));
        let tables = tp_tables(&rows);
        // Without the PEs' own medians there is no slowest PE to compare with.
        assert!(!tables[0].render().contains("slowest PE"));
        // The slowest PE's compute-only (12 us) where PE 0's took 10: ours (15) is 25% over it.
        rows[0].tp.as_mut().unwrap().slowest_pe_us = Some(12.0);
        crate::tp::fill_relative(&mut rows[..3]);
        let with_slowest = tp_tables(&rows)[0].render();
        assert!(
            with_slowest.contains("slowest PE's compute-only us") && with_slowest.contains("25.0%"),
            "{with_slowest}"
        );
        assert_eq!(rows[2].tp.unwrap().overhead_slowest_percent, Some(25.0));
        rows[0].tp.as_mut().unwrap().slowest_pe_us = None;
        crate::tp::fill_relative(&mut rows[..3]);
        assert_eq!(tables.len(), 2);
        let text = tables[0].render();
        assert!(
            text.contains("tensor-parallel MLP 8b (hidden 4096, ffn 14336)"),
            "{text}"
        );
        assert!(
            text.contains("cublas+ours us") && text.contains("best ours vs nccl"),
            "{text}"
        );
        // ours: 50% over compute-only, 2x faster than nccl (200% over compute-only).
        assert!(
            text.contains("50.0%") && text.contains("200.0%") && text.contains("2.00x"),
            "{text}"
        );
        let other = tables[1].render();
        assert!(
            !other.contains("ours vs nccl") && !other.contains("overhead"),
            "{other}"
        );
        // The point-to-point tables leave tp rows alone.
        assert!(p2p_tables(&rows, &cfg(&[])).is_empty());
        let csv = to_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        let cols = CSV_HEADER.split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == cols), "{csv}");
        assert!(
            lines[3].starts_with("tp,8b,cublas+ours,graph,bf16,"),
            "{}",
            lines[3]
        );
        assert!(lines[3].contains(",4096,14336,16,"), "{}", lines[3]);
        assert!(lines[3].ends_with(",2,50,,,false,ok,ok"), "{}", lines[3]);
        assert!(lines[5].ends_with(",,,,,,,,,,ok,ok"), "{}", lines[5]);
        assert_eq!(rows[2].key(), "tp 8b M=16 cublas+ours");
        let json = to_json(
            &Results {
                records: rows,
                notes: vec![],
            },
            &cfg(&[]),
            None,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["results"][2]["tp"]["speedup_vs_nccl"], 2.0);
        assert_eq!(v["results"][2]["tp"]["tokens"], 16);
        assert!(v["results"][4].get("tp").is_none());
    }
}
