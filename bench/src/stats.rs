//! Summary statistics of timing samples, and the bandwidth figures of nccl-tests.

use serde::Serialize;

/// Median, mean and spread of a set of samples (all in the unit of the samples).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    pub p10: f64,
    pub p90: f64,
}

impl Summary {
    /// Half the p10..p90 range relative to the median, in percent (0 for one sample).
    pub fn spread_percent(&self) -> f64 {
        if self.median > 0.0 {
            (self.p90 - self.p10) / (2.0 * self.median) * 100.0
        } else {
            0.0
        }
    }
}

/// The `p`-th percentile (0..=100) of sorted samples, interpolating linearly between the two
/// nearest ranks (the numpy default).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            let frac = rank - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

/// Summarise samples; `None` when there are none. Non-finite samples are ignored.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(Summary {
        n,
        median: percentile(&v, 50.0),
        mean: v.iter().sum::<f64>() / n as f64,
        min: v[0],
        max: v[n - 1],
        p10: percentile(&v, 10.0),
        p90: percentile(&v, 90.0),
    })
}

/// The collectives whose bus bandwidth we report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    AllToAll,
}

impl Collective {
    /// Every collective, in the order they run and are reported.
    pub const ALL: [Collective; 5] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
    ];

    /// The name of its test and records (`--tests`, the `test` column).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reducescatter",
            Collective::Broadcast => "broadcast",
            Collective::AllToAll => "alltoall",
        }
    }

    /// Its name in table and plot titles.
    pub fn title(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce (sum)",
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter (sum)",
            Collective::Broadcast => "broadcast (root 0)",
            Collective::AllToAll => "all-to-all",
        }
    }

    /// Whether a record's `test` names a collective.
    pub fn is_collective_test(test: &str) -> bool {
        Collective::ALL.iter().any(|c| c.name() == test)
    }
}

/// nccl-tests' bus bandwidth factor: all-reduce 2(n-1)/n, all-gather, reduce-scatter and
/// all-to-all (n-1)/n (of the all-gather's output, the reduce-scatter's input, the
/// all-to-all's buffer), broadcast 1.
pub fn busbw_factor(coll: Collective, n_pes: usize) -> f64 {
    if n_pes == 0 {
        return 0.0;
    }
    let n = n_pes as f64;
    match coll {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
        Collective::Broadcast => 1.0,
    }
}

/// Algorithm bandwidth in GB/s (10^9 bytes per second) for `bytes` moved in `time_us`.
pub fn algbw_gbs(bytes: f64, time_us: f64) -> f64 {
    if time_us > 0.0 {
        bytes / (time_us * 1e3)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(summarize(&[3.0, 1.0, 2.0]).unwrap().median, 2.0);
        assert_eq!(summarize(&[4.0, 1.0, 3.0, 2.0]).unwrap().median, 2.5);
        assert_eq!(summarize(&[7.0]).unwrap().median, 7.0);
        assert!(summarize(&[]).is_none());
    }

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v: Vec<f64> = (0..=10).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 10.0), 1.0);
        assert_eq!(percentile(&v, 90.0), 9.0);
        assert_eq!(percentile(&v, 0.0), 0.0);
        assert_eq!(percentile(&v, 100.0), 10.0);
        let w = [1.0, 2.0];
        assert!((percentile(&w, 25.0) - 1.25).abs() < 1e-12);
    }

    #[test]
    fn summary_has_min_max_mean_and_ignores_nan() {
        let s = summarize(&[5.0, f64::NAN, 1.0, 3.0]).unwrap();
        assert_eq!(
            (s.n, s.min, s.max, s.mean, s.median),
            (3, 1.0, 5.0, 3.0, 3.0)
        );
        assert!((s.p10 - 1.4).abs() < 1e-12 && (s.p90 - 4.6).abs() < 1e-12);
    }

    #[test]
    fn spread_is_half_the_p10_p90_range_over_the_median() {
        let s = Summary {
            n: 3,
            median: 10.0,
            mean: 10.0,
            min: 8.0,
            max: 12.0,
            p10: 9.0,
            p90: 11.0,
        };
        assert!((s.spread_percent() - 10.0).abs() < 1e-12);
    }

    #[test]
    fn bus_bandwidth_factors_match_nccl_tests() {
        assert_eq!(busbw_factor(Collective::AllReduce, 8), 1.75);
        assert_eq!(busbw_factor(Collective::AllReduce, 2), 1.0);
        assert_eq!(busbw_factor(Collective::AllGather, 8), 0.875);
        assert_eq!(busbw_factor(Collective::AllGather, 4), 0.75);
        assert_eq!(busbw_factor(Collective::ReduceScatter, 8), 0.875);
        assert_eq!(busbw_factor(Collective::ReduceScatter, 2), 0.5);
        assert_eq!(busbw_factor(Collective::AllReduce, 1), 0.0);
        assert_eq!(busbw_factor(Collective::ReduceScatter, 1), 0.0);
        assert_eq!(busbw_factor(Collective::ReduceScatter, 0), 0.0);
        assert_eq!(busbw_factor(Collective::AllToAll, 4), 0.75);
        assert_eq!(busbw_factor(Collective::Broadcast, 4), 1.0);
    }

    #[test]
    fn collectives_have_distinct_names_and_titles() {
        let names: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "allreduce",
                "allgather",
                "reducescatter",
                "broadcast",
                "alltoall"
            ]
        );
        assert_eq!(Collective::ReduceScatter.title(), "reduce-scatter (sum)");
        assert!(Collective::is_collective_test("reducescatter"));
        assert!(!Collective::is_collective_test("put_bw"));
        // The data keys use the discriminant: the earlier collectives keep theirs.
        assert_eq!(
            Collective::ALL.map(|c| c as u64),
            [0, 1, 2, 3, 4],
            "reordering changes every case's data"
        );
    }

    #[test]
    fn algbw_is_bytes_per_nanosecond() {
        // 1 GB in 1 s is 1 GB/s; 1 MiB in 10 us is 104.8576 GB/s.
        assert!((algbw_gbs(1e9, 1e6) - 1.0).abs() < 1e-12);
        assert!((algbw_gbs((1 << 20) as f64, 10.0) - 104.8576).abs() < 1e-9);
        assert_eq!(algbw_gbs(8.0, 0.0), 0.0);
    }
}
