//! SVG plots: time and bandwidth against message size, log-log.

use crate::cli::Config;
use crate::error::{BenchError, Result};
use crate::report::{tp_shapes_of, Record, Status};
use crate::stats::Collective;
use crate::tp::{TpImpl, TP_TEST};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Short size labels for the x axis: 8, 1K, 64K, 1M, 256M.
pub fn axis_size(v: f64) -> String {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut v = v;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if (v - v.round()).abs() < 1e-9 {
        format!("{}{}", v.round() as u64, UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// Tick positions for a log axis of sizes: powers of two, every 2^k-th so that at most
/// about ten fall in `[lo, hi]`.
pub fn size_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && hi >= lo) {
        return Vec::new();
    }
    let (a, b) = (lo.log2().ceil() as i32, hi.log2().floor() as i32);
    let span = (b - a).max(0) as usize + 1;
    let step = span.div_ceil(10).max(1);
    (a..=b).step_by(step).map(|e| 2f64.powi(e)).collect()
}

/// Tick positions for a log axis of values: powers of ten, or 1-2-5 (or 1..9) steps when the
/// range is too narrow for three of them.
pub fn value_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && hi >= lo) {
        return Vec::new();
    }
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    for mantissas in [
        &[1.0][..],
        &[1.0, 2.0, 5.0],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    ] {
        let ticks: Vec<f64> = (a..=b)
            .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| *v >= lo && *v <= hi)
            .collect();
        if ticks.len() >= 3 {
            let step = ticks.len().div_ceil(12);
            return ticks.into_iter().step_by(step).collect();
        }
    }
    vec![lo, (lo * hi).sqrt(), hi]
}

/// A tick label: `0.05`, `2`, `1500`.
pub fn value_label(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        let s = format!("{v:.1}");
        s.trim_end_matches(".0").to_string()
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn usable(series: &[Series]) -> Vec<Series> {
    series
        .iter()
        .map(|s| Series {
            label: s.label.clone(),
            points: s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0 && *y > 0.0)
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

/// Draw `series` into an SVG at `path`, against message size. Returns false (and writes
/// nothing) without data.
pub fn line_plot(path: &Path, title: &str, y_desc: &str, series: &[Series]) -> Result<bool> {
    line_plot_x(path, title, "message size (bytes)", y_desc, series)
}

/// [`line_plot`] with `x_desc` naming the x axis (powers of two, log scale).
pub fn line_plot_x(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<bool> {
    let series = usable(series);
    if series.is_empty() {
        return Ok(false);
    }
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let (x0, x1) = (x0 / 1.5, x1 * 1.5);
    let (y0, y1) = (y0 / 1.5, y1 * 1.5);
    let err = |e: &dyn std::fmt::Display| BenchError::new(format!("plot {}: {e}", path.display()));

    let root = SVGBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0..x1).log_scale().with_key_points(size_ticks(x0, x1)),
            (y0..y1).log_scale().with_key_points(value_ticks(y0, y1)),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| axis_size(*v))
        .y_label_formatter(&|v| value_label(*v))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(PointSeries::of_element(
                s.points.iter().copied(),
                3,
                color.filled(),
                &|c, size, style| EmptyElement::at(c) + Circle::new((0, 0), size, style),
            ))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(true)
}

fn series_of(
    records: &[Record],
    label: &str,
    pick: impl Fn(&Record) -> bool,
    value: impl Fn(&Record) -> Option<f64>,
) -> Series {
    let mut points: Vec<(f64, f64)> = records
        .iter()
        .filter(|r| r.status != Status::Unsupported && pick(r))
        .filter_map(|r| value(r).map(|v| (r.bytes as f64, v)))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    Series {
        label: label.to_string(),
        points,
    }
}

fn time(r: &Record) -> Option<f64> {
    r.median_us()
}

fn busbw(r: &Record) -> Option<f64> {
    r.busbw_gbs
}

fn algbw(r: &Record) -> Option<f64> {
    r.algbw_gbs
}

fn tp_tflops(r: &Record) -> Option<f64> {
    r.tp?.tflops_per_gpu
}

/// A shape name as part of a file name: letters, digits, `-` and `_` kept, the rest `_`.
fn file_part(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
            _ => '_',
        })
        .collect()
}

/// All plots for the results; returns the files written.
pub fn write_plots(dir: &Path, records: &[Record], cfg: &Config) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| BenchError::new(format!("cannot create {}: {e}", dir.display())))?;
    let mut written = Vec::new();
    let mut plot = |name: &str, title: &str, y: &str, series: Vec<Series>| -> Result<()> {
        let path = dir.join(name);
        if line_plot(&path, title, y, &series)? {
            written.push(path);
        }
        Ok(())
    };

    for (test, title) in Collective::ALL.map(|c| (c.name(), c.title())) {
        for dtype in &cfg.dtypes {
            for mode in &cfg.modes {
                let sel = |imp: &'static str| {
                    let (d, m) = (dtype.name(), mode.name());
                    move |r: &Record| {
                        r.test == test && r.dtype == d && r.mode == m && r.implementation == imp
                    }
                };
                let n_pes = records
                    .iter()
                    .find(|r| r.test == test)
                    .map(|r| r.n_pes)
                    .unwrap_or(0);
                let impls: Vec<&'static str> =
                    cfg.collective_impls().iter().map(|i| i.name()).collect();
                let base = format!("{test}_{}_{}", dtype.name(), mode.name());
                let heading = format!("{title}, {}, {}, {n_pes} PEs", dtype.name(), mode.name());
                plot(
                    &format!("{base}_time.svg"),
                    &format!("{heading}: time"),
                    "time per operation (us)",
                    impls
                        .iter()
                        .map(|&i| series_of(records, i, sel(i), time))
                        .collect(),
                )?;
                plot(
                    &format!("{base}_busbw.svg"),
                    &format!("{heading}: bus bandwidth"),
                    "bus bandwidth (GB/s)",
                    impls
                        .iter()
                        .map(|&i| series_of(records, i, sel(i), busbw))
                        .collect(),
                )?;
            }
        }
    }

    // Tensor-parallel MLP: time and TFLOP/s per GPU against tokens, one pair per shape.
    let mut tp_written = Vec::new();
    for (shape, hidden, ffn) in tp_shapes_of(records) {
        let n_pes = records
            .iter()
            .find(|r| r.test == TP_TEST && r.variant == shape)
            .map(|r| r.n_pes)
            .unwrap_or(0);
        let series = |value: fn(&Record) -> Option<f64>| -> Vec<Series> {
            TpImpl::ALL
                .iter()
                .map(|imp| {
                    let mut points: Vec<(f64, f64)> = records
                        .iter()
                        .filter(|r| {
                            r.test == TP_TEST
                                && r.variant == shape
                                && r.implementation == imp.name()
                                && r.status != Status::Unsupported
                        })
                        .filter_map(|r| Some((r.tp?.tokens as f64, value(r)?)))
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series {
                        label: imp.name().to_string(),
                        points,
                    }
                })
                .collect()
        };
        let heading =
            format!("tensor-parallel MLP {shape} (hidden {hidden}, ffn {ffn}), bf16, TP {n_pes}");
        for (name, title, y, value) in [
            (
                "time",
                "time per forward",
                "time (us)",
                time as fn(&Record) -> Option<f64>,
            ),
            ("tflops", "TFLOP/s per GPU", "TFLOP/s per GPU", tp_tflops),
        ] {
            let path = dir.join(format!("tp_{}_{name}.svg", file_part(&shape)));
            if line_plot_x(
                &path,
                &format!("{heading}: {title}"),
                "tokens (M)",
                y,
                &series(value),
            )? {
                tp_written.push(path);
            }
        }
    }

    let mut lat = Vec::new();
    for test in ["put", "get", "put_signal_pingpong"] {
        for scope in ["thread", "warp", "block"] {
            let label = format!(
                "{} {scope}",
                if test == "put_signal_pingpong" {
                    "put-signal ping-pong"
                } else {
                    test
                }
            );
            lat.push(series_of(
                records,
                &label,
                |r| r.test == test && r.variant == scope,
                time,
            ));
        }
    }
    for scope in ["thread", "warp", "block"] {
        lat.push(series_of(
            records,
            &format!("channel ping-pong {scope}"),
            |r| r.test == "channel_pingpong_device" && r.variant == scope,
            time,
        ));
    }
    lat.push(series_of(
        records,
        "NCCL send/recv ping-pong",
        |r| r.test == "nccl_pingpong",
        time,
    ));
    plot(
        "p2p_device_latency.svg",
        &format!("point-to-point latency (one way), PE 0 -> PE {}", cfg.peer),
        "latency (us)",
        lat,
    )?;

    let host = [
        "host_put",
        "host_get",
        "stream_put",
        "stream_get",
        "nccl_pingpong",
    ]
    .iter()
    .map(|&t| series_of(records, &t.replace('_', " "), |r| r.test == t, time))
    .collect();
    plot(
        "p2p_host_latency.svg",
        &format!(
            "host-initiated and on-stream latency, PE 0 -> PE {}",
            cfg.peer
        ),
        "latency (us)",
        host,
    )?;

    for (dir_name, label) in [("uni", "one way"), ("bidir", "both ways")] {
        let mut bw = Vec::new();
        for test in ["put_bw", "get_bw"] {
            for &ctas in &cfg.ctas {
                let variant = format!("{dir_name} ctas={ctas}");
                bw.push(series_of(
                    records,
                    &format!("{} {ctas} CTAs", test.trim_end_matches("_bw")),
                    |r| r.test == test && r.variant == variant,
                    algbw,
                ));
            }
        }
        bw.push(series_of(
            records,
            "NCCL send/recv",
            |r| r.test == "nccl_sendrecv_bw" && r.variant == dir_name,
            algbw,
        ));
        plot(
            &format!("p2p_bandwidth_{dir_name}.svg"),
            &format!("point-to-point bandwidth {label}, PE 0 and PE {}", cfg.peer),
            "bandwidth (GB/s)",
            bw,
        )?;
    }
    written.extend(tp_written);
    // The bandwidth matrix: one way, as a heat map.
    let path = dir.join("p2p_matrix_put_bw.svg");
    if heat_map(&path, records)? {
        written.push(path);
    }
    Ok(written)
}

/// The one-way put bandwidth of every ordered pair (`p2p-matrix`) as a grid of squares, the
/// slowest pairs darkest, each labelled with its GB/s; `false` when there is none.
fn heat_map(path: &Path, records: &[Record]) -> Result<bool> {
    let cells: Vec<(usize, usize, f64)> = records
        .iter()
        .filter(|r| r.test == crate::p2p::matrix::UNI && r.status == Status::Ok)
        .filter_map(|r| {
            let (a, b) = r.variant.split_once("->")?;
            Some((a.parse().ok()?, b.parse().ok()?, r.algbw_gbs?))
        })
        .collect();
    let Some(n) = records
        .iter()
        .find(|r| r.test == crate::p2p::matrix::UNI)
        .map(|r| r.n_pes)
    else {
        return Ok(false);
    };
    if cells.is_empty() {
        return Ok(false);
    }
    let (lo, hi) = cells
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), c| (lo.min(c.2), hi.max(c.2)));
    let err = |e: &dyn std::fmt::Display| BenchError::new(format!("plot {}: {e}", path.display()));
    let side = 120 * n as u32 + 160;
    let root = SVGBackend::new(path, (side, side)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(
            "put bandwidth one way, GB/s (row: from, column: to)",
            ("sans-serif", 18),
        )
        .map_err(|e| err(&e))?;
    for &(a, b, gbs) in &cells {
        // 0 at the slowest pair, 1 at the fastest.
        let t = if hi > lo { (gbs - lo) / (hi - lo) } else { 1.0 };
        let shade = (80.0 + 175.0 * t) as u8;
        let (x, y) = (80 + 120 * b as i32, 40 + 120 * a as i32);
        root.draw(&Rectangle::new(
            [(x, y), (x + 116, y + 116)],
            RGBColor(255 - shade / 2, shade, 120).filled(),
        ))
        .map_err(|e| err(&e))?;
        root.draw(&Text::new(
            format!("{gbs:.0}"),
            (x + 30, y + 50),
            ("sans-serif", 20),
        ))
        .map_err(|e| err(&e))?;
    }
    for pe in 0..n as i32 {
        let label = format!("PE {pe}");
        root.draw(&Text::new(
            label.clone(),
            (20, 90 + 120 * pe),
            ("sans-serif", 16),
        ))
        .map_err(|e| err(&e))?;
        root.draw(&Text::new(label, (110 + 120 * pe, 20), ("sans-serif", 16)))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_are_short_sizes() {
        assert_eq!(axis_size(8.0), "8");
        assert_eq!(axis_size(1024.0), "1K");
        assert_eq!(axis_size(1536.0), "1.5K");
        assert_eq!(axis_size((256u64 << 20) as f64), "256M");
    }

    #[test]
    fn ticks_are_powers_of_two_and_round_values() {
        assert_eq!(size_ticks(5.0, 70.0), vec![8.0, 16.0, 32.0, 64.0]);
        let wide = size_ticks(5.0, 400e6);
        assert!(wide.len() <= 10 && wide[0] == 8.0, "{wide:?}");
        assert!(wide.iter().all(|t| t.log2().fract() == 0.0));
        assert_eq!(value_ticks(0.5, 2000.0), vec![1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(value_ticks(1.3, 6.0), vec![2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(value_ticks(1.5, 30.0), vec![2.0, 5.0, 10.0, 20.0]);
        assert_eq!(value_label(1500.0), "1500");
        assert_eq!(value_label(2.0), "2");
        assert_eq!(value_label(2.5), "2.5");
        assert_eq!(value_label(0.05), "0.05");
    }

    #[test]
    fn plots_are_svg_and_skip_empty_data() {
        let dir = std::env::temp_dir().join(format!("bench-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.svg");
        let s = vec![
            Series {
                label: "ours".into(),
                points: vec![(8.0, 3.0), (1024.0, 4.0), (1048576.0, 40.0)],
            },
            Series {
                label: "nccl".into(),
                points: vec![(8.0, 9.0), (1024.0, 0.0), (1048576.0, 30.0)],
            },
        ];
        assert!(line_plot(&path, "title", "time (us)", &s).unwrap());
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("ours") && svg.contains("nccl"));
        let empty = vec![Series {
            label: "x".into(),
            points: vec![(0.0, 1.0)],
        }];
        assert!(!line_plot(&dir.join("e.svg"), "t", "y", &empty).unwrap());
        assert!(!dir.join("e.svg").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn result_plots_are_written_per_collective_and_for_p2p() {
        use crate::report::tests::record;
        let dir = std::env::temp_dir().join(format!("bench-plots-test-{}", std::process::id()));
        let cfg = crate::cli::Config::from_args(
            <crate::cli::Args as clap::Parser>::try_parse_from([
                "bench", "--dtypes", "f32", "--modes", "plain",
            ])
            .unwrap(),
        )
        .unwrap();
        let mut recs = vec![
            record("allreduce", "ours", "plain", 1024, 5.0, Status::Ok),
            record("allreduce", "nccl", "plain", 2048, 6.0, Status::Ok),
        ];
        let mut put = record("put", "nvshmem", "device", 64, 2.0, Status::Ok);
        put.variant = "thread".into();
        recs.push(put);
        let files = write_plots(&dir, &recs, &cfg).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.contains(&"allreduce_f32_plain_time.svg".to_string()),
            "{names:?}"
        );
        assert!(
            names.contains(&"allreduce_f32_plain_busbw.svg".to_string()),
            "{names:?}"
        );
        assert!(
            names.contains(&"p2p_device_latency.svg".to_string()),
            "{names:?}"
        );
        assert!(
            !names.iter().any(|n| n.starts_with("allgather")
                || n.starts_with("reducescatter")
                || n.starts_with("tp_")),
            "{names:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reduce_scatter_plots_are_written_per_dtype_and_mode() {
        use crate::report::tests::record;
        let dir = std::env::temp_dir().join(format!("bench-rs-plots-{}", std::process::id()));
        let cfg = crate::cli::Config::from_args(
            <crate::cli::Args as clap::Parser>::try_parse_from([
                "bench",
                "--tests",
                "reducescatter",
                "--dtypes",
                "f32",
            ])
            .unwrap(),
        )
        .unwrap();
        let mut recs = Vec::new();
        for mode in ["plain", "graph"] {
            for (bytes, t) in [(4096, 5.0), (1 << 20, 20.0)] {
                recs.push(record("reducescatter", "ours", mode, bytes, t, Status::Ok));
                recs.push(record(
                    "reducescatter",
                    "nccl",
                    mode,
                    bytes,
                    2.0 * t,
                    Status::Ok,
                ));
            }
        }
        let files = write_plots(&dir, &recs, &cfg).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "reducescatter_f32_plain_time.svg",
            "reducescatter_f32_plain_busbw.svg",
            "reducescatter_f32_graph_time.svg",
            "reducescatter_f32_graph_busbw.svg",
        ] {
            assert!(names.contains(&want.to_string()), "{names:?}");
        }
        assert!(
            !names.iter().any(|n| n.starts_with("allreduce")),
            "{names:?}"
        );
        let svg = std::fs::read_to_string(dir.join("reducescatter_f32_plain_busbw.svg")).unwrap();
        assert!(svg.contains("reduce-scatter (sum), f32, plain, 8 PEs: bus bandwidth"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tp_plots_are_written_per_shape() {
        use crate::report::tests::tp_record;
        let dir = std::env::temp_dir().join(format!("bench-tp-plots-{}", std::process::id()));
        let cfg = crate::cli::Config::from_args(
            <crate::cli::Args as clap::Parser>::try_parse_from(["bench", "--tests", "tp"]).unwrap(),
        )
        .unwrap();
        let mut recs = Vec::new();
        for m in [1, 16, 128] {
            recs.push(tp_record("8b", TpImpl::ComputeOnly, m, 10.0 + m as f64));
            recs.push(tp_record("8b", TpImpl::CublasOurs, m, 12.0 + m as f64));
        }
        recs.push(tp_record("4096x14336", TpImpl::CublasNccl, 64, 30.0));
        let files = write_plots(&dir, &recs, &cfg).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "tp_8b_time.svg",
            "tp_8b_tflops.svg",
            "tp_4096x14336_time.svg",
        ] {
            assert!(names.contains(&want.to_string()), "{names:?}");
        }
        let svg = std::fs::read_to_string(dir.join("tp_8b_time.svg")).unwrap();
        assert!(svg.contains("tokens (M)") && svg.contains("cublas+ours"));
        assert_eq!(file_part("a,b/c"), "a_b_c");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_heat_map_draws_the_pairs_it_has() {
        use crate::report::tests::record;
        let dir = std::env::temp_dir().join(format!("bench-heat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.svg");
        assert!(!heat_map(&path, &[]).unwrap());
        let rows: Vec<Record> = [(0, 1, 412.0), (1, 0, 398.0)]
            .into_iter()
            .map(|(a, b, g)| {
                let mut r = record(
                    crate::p2p::matrix::UNI,
                    "nvshmem",
                    "device",
                    1 << 26,
                    1.0,
                    Status::Ok,
                );
                r.variant = format!("{a}->{b}");
                r.n_pes = 2;
                r.algbw_gbs = Some(g);
                r
            })
            .collect();
        assert!(heat_map(&path, &rows).unwrap());
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.contains("412") && svg.contains("398") && svg.contains("PE 1"),
            "{svg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
