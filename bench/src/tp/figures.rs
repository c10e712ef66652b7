//! The figures of a tp row: FLOPs, TFLOP/s, speed-ups and overheads, and the relative ones
//! filled in from the rows of one point.

use super::TpImpl;
use crate::report::Record;

/// Floating-point operations of one forward per GPU: the gate, up and down GEMMs of
/// `2 M hidden ffn` each, shared by the PEs.
pub fn mlp_flops_per_gpu(m: usize, hidden: usize, ffn: usize, n_pes: usize) -> f64 {
    6.0 * m as f64 * hidden as f64 * ffn as f64 / n_pes.max(1) as f64
}

/// 10^12 operations per second from `flops` done in `time_us`.
pub fn tflops(flops: f64, time_us: f64) -> Option<f64> {
    (time_us > 0.0).then(|| flops / time_us * 1e-6)
}

/// How many times faster than `base_us` a time of `time_us` is.
pub fn speedup(base_us: f64, time_us: f64) -> Option<f64> {
    (time_us > 0.0).then(|| base_us / time_us)
}

/// The time beyond the local work, in percent of the local work.
pub fn overhead_percent(time_us: f64, compute_us: f64) -> Option<f64> {
    (compute_us > 0.0).then(|| (time_us - compute_us) / compute_us * 100.0)
}

/// Fill in the speed-up over cublas+nccl and the overhead over compute-only of `records`, the
/// rows of one shape and token count, from their median times.
pub fn fill_relative(records: &mut [Record]) {
    let median = |imp: TpImpl, recs: &[Record]| {
        recs.iter()
            .find(|r| r.implementation == imp.name())
            .and_then(|r| r.median_us())
    };
    let nccl = median(TpImpl::CublasNccl, records);
    let compute = median(TpImpl::ComputeOnly, records);
    let slowest_compute = records
        .iter()
        .find(|r| r.implementation == TpImpl::ComputeOnly.name())
        .and_then(|r| r.tp.and_then(|t| t.slowest_pe_us));
    for r in records.iter_mut() {
        let t = r.median_us();
        if let Some(fig) = r.tp.as_mut() {
            fig.speedup_vs_nccl = t.zip(nccl).and_then(|(t, b)| speedup(b, t));
            fig.overhead_percent = t.zip(compute).and_then(|(t, c)| overhead_percent(t, c));
            fig.overhead_slowest_percent = t
                .zip(slowest_compute)
                .and_then(|(t, c)| overhead_percent(t, c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::tp_record;

    #[test]
    fn figures_follow_the_definitions() {
        // 6 M hidden ffn, shared by the GPUs.
        let f = mlp_flops_per_gpu(8192, 8192, 28672, 8);
        assert_eq!(f, 6.0 * 8192.0 * 8192.0 * 28672.0 / 8.0);
        assert_eq!(mlp_flops_per_gpu(1, 2, 3, 1), 36.0);
        assert!((tflops(f, 2000.0).unwrap() - f / 2e-3 / 1e12).abs() < 1e-9);
        assert_eq!(tflops(1e6, 1.0), Some(1.0));
        assert_eq!(tflops(1e6, 0.0), None);
        assert_eq!(speedup(30.0, 15.0), Some(2.0));
        assert_eq!(speedup(30.0, 0.0), None);
        assert_eq!(overhead_percent(15.0, 10.0), Some(50.0));
        assert_eq!(overhead_percent(9.0, 10.0), Some(-10.0));
        assert_eq!(overhead_percent(9.0, 0.0), None);
    }

    #[test]
    fn relative_figures_come_from_the_rows_of_one_point() {
        let mut rows = vec![
            tp_record("8b", TpImpl::ComputeOnly, 64, 40.0),
            tp_record("8b", TpImpl::CublasNccl, 64, 80.0),
            tp_record("8b", TpImpl::CublasOurs, 64, 50.0),
        ];
        // compute-only's slowest PE took 45 us where PE 0 took 40.
        rows[0].tp.as_mut().unwrap().slowest_pe_us = Some(45.0);
        fill_relative(&mut rows);
        let fig = |i: usize| rows[i].tp.unwrap();
        let near = |v: Option<f64>, want: f64| (v.unwrap() - want).abs() < 1e-9;
        assert!(near(fig(0).overhead_slowest_percent, -100.0 / 9.0));
        assert!(near(fig(2).overhead_slowest_percent, 100.0 / 9.0));
        assert_eq!(fig(0).overhead_percent, Some(0.0));
        assert_eq!(fig(1).overhead_percent, Some(100.0));
        assert_eq!(fig(2).overhead_percent, Some(25.0));
        assert_eq!(fig(0).speedup_vs_nccl, Some(2.0));
        assert_eq!(fig(1).speedup_vs_nccl, Some(1.0));
        assert_eq!(fig(2).speedup_vs_nccl, Some(1.6));
        // Without NCCL and compute-only rows there is nothing to compare with.
        let mut alone = vec![tp_record("8b", TpImpl::CublasOurs, 64, 50.0)];
        fill_relative(&mut alone);
        let t = alone[0].tp.unwrap();
        assert_eq!((t.speedup_vs_nccl, t.overhead_percent), (None, None));
        assert_eq!(t.overhead_slowest_percent, None);
    }
}
