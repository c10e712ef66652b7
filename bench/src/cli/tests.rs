//! Tests of the command line as a whole: options parsed by clap, then resolved and checked.

use super::config::CUBLASMP_FIXED_BYTES;
use super::*;
use clap::Parser;
use nvshmem::{AllGatherAlgo, AllReduceAlgo, ReduceScatterAlgo};
use std::path::PathBuf;

fn parse(args: &[&str]) -> Result<Config, String> {
    let mut full = vec!["bench"];
    full.extend_from_slice(args);
    let a = Args::try_parse_from(full).map_err(|e| e.to_string())?;
    Config::from_args(a)
}

#[test]
fn defaults_cover_everything() {
    let c = parse(&[]).unwrap();
    assert!(c.tests.allreduce && c.tests.allgather && c.tests.p2p_latency && c.tests.sendrecv);
    assert!(c.tests.reducescatter && c.tests.floor && !c.tests.pipeline);
    assert_eq!(c.reducescatter_algo, ReduceScatterAlgo::Auto);
    assert_eq!(c.dtypes, vec![DType::Bf16, DType::F32]);
    assert_eq!(
        c.impls,
        vec![
            Impl::Ours,
            Impl::Nvshmem,
            Impl::Nccl,
            Impl::NcclSymm,
            Impl::Cublasmp
        ]
    );
    assert_eq!(
        c.collective_impls(),
        vec![Impl::Ours, Impl::Nvshmem, Impl::Nccl, Impl::NcclSymm]
    );
    // cuBLASMp only with the tp test, and NCCL with it (its communicator).
    assert!(!c.needs_cublasmp());
    let tp = parse(&["--tests", "tp", "--impls", "ours,cublasmp"]).unwrap();
    assert!(tp.needs_cublasmp() && tp.needs_nccl());
    assert!(parse(&["--tests", "allreduce", "--impls", "cublasmp"]).is_err());
    assert_eq!(c.modes, vec![Mode::Plain, Mode::Graph]);
    assert_eq!(c.sizes.first(), Some(&8));
    assert_eq!(c.sizes.last(), Some(&(256 << 20)));
    assert_eq!(c.lat_sizes.last(), Some(&(1 << 20)));
    assert_eq!((c.iters, c.warmup, c.graph_ops, c.inner), (50, 10, 10, 100));
    assert_eq!(c.ctas, vec![1, 8, 32, 128]);
    assert_eq!(c.out, PathBuf::from("bench-results"));
    assert!(c.needs_nccl() && c.plots);
    assert_eq!(c.watchdog_s, 120);
    assert_eq!(c.case_budget_s, 2.0);
}

#[test]
fn slow_cases_are_cut_to_the_budget() {
    let c = parse(&[]).unwrap();
    // Fast operations keep the configured counts.
    assert_eq!(c.budgeted(4096, 10.0, true), (10, 50, 10));
    assert_eq!(c.budgeted(4096, 10.0, false), (10, 50, 1));
    // 381 ms per operation, 2 s budget: 5 operations in all, graphs of one.
    assert_eq!(c.budgeted(256 << 20, 381_000.0, true), (1, 4, 1));
    assert_eq!(c.budgeted(256 << 20, 381_000.0, false), (1, 4, 1));
    // 20 ms at 64 MiB: 100 operations; (2, 10) x 10-op graphs would be 110.
    assert_eq!(c.budgeted(64 << 20, 20_000.0, true), (2, 9, 10));
    // Never below 3 timed samples; no budget, no cut.
    assert_eq!(c.budgeted(256 << 20, 5e6, true), (1, 3, 1));
    let unlimited = parse(&["--case-budget", "0"]).unwrap();
    assert_eq!(unlimited.budgeted(256 << 20, 5e6, true), (2, 10, 10));
    assert!(parse(&["--case-budget", "-1"]).is_err());
}

#[test]
fn quick_shrinks_the_run_but_explicit_options_win() {
    let c = parse(&["--quick"]).unwrap();
    assert_eq!(
        c.sizes,
        vec![8, 64, 512, 4096, 32768, 262144, 2097152, 16777216]
    );
    assert_eq!((c.iters, c.warmup), (10, 2));
    let c = parse(&["--quick", "--iters", "7", "--max-bytes", "1M", "-f", "4"]).unwrap();
    assert_eq!(c.iters, 7);
    // 8 * 4^k up to 1 MiB: the last is 512 KiB.
    assert_eq!(*c.sizes.last().unwrap(), 512 << 10);
    assert_eq!(c.sizes[1], 32);
}

#[test]
fn lists_and_test_groups_parse() {
    let c = parse(&[
        "--tests",
        "allreduce,p2p-bw",
        "--dtypes",
        "f32",
        "--impls",
        "nccl,ours",
    ])
    .unwrap();
    assert!(c.tests.allreduce && !c.tests.allgather && c.tests.p2p_bw && !c.tests.p2p_latency);
    assert_eq!(c.dtypes, vec![DType::F32]);
    assert_eq!(c.impls, vec![Impl::Ours, Impl::Nccl]);
    let c = parse(&["--tests", "reducescatter", "--dtypes", "bf16"]).unwrap();
    assert!(c.tests.reducescatter && !c.tests.allreduce && !c.tests.allgather);
    assert!(c.tests.any_collective() && !c.tests.any_p2p() && !c.tests.tp);
    assert!(c.needs_nccl());
    assert!(
        !parse(&["--tests", "reducescatter", "--impls", "ours,nvshmem"])
            .unwrap()
            .needs_nccl()
    );
    let c = parse(&["--tests", "allgather,reducescatter"]).unwrap();
    assert!(!c.tests.allreduce && c.tests.allgather && c.tests.reducescatter);
    let c = parse(&["--tests", "p2p", "--impls", "ours,nvshmem"]).unwrap();
    assert!(!c.tests.allreduce && !c.tests.reducescatter && c.tests.p2p_host && c.tests.sendrecv);
    assert!(!c.needs_nccl());
    let c = parse(&["--sizes", "1K,8,1K,64"]).unwrap();
    assert_eq!(c.sizes, vec![8, 64, 1024]);
    let c = parse(&["--ctas", "32,1", "--min-bytes", "1K", "--max-bytes", "4K"]).unwrap();
    assert_eq!(c.ctas, vec![1, 32]);
    assert_eq!(c.sizes, vec![1024, 2048, 4096]);
}

#[test]
fn bad_options_are_refused() {
    assert!(parse(&["--tests", "bogus"]).is_err());
    assert!(parse(&["--dtypes", "f64"]).is_err());
    assert!(parse(&["--min-bytes", "1M", "--max-bytes", "1K"]).is_err());
    assert!(parse(&["--iters", "0"]).is_err());
    assert!(parse(&["--block-threads", "100"]).is_err());
    assert!(parse(&["--ctas", "0"]).is_err());
    assert!(parse(&["--peer", "0"]).is_err());
    assert!(parse(&["--sizes", "0"]).is_err());
}

#[test]
fn large_sizes_get_fewer_iterations_unless_fixed() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.iters_for(1024), (10, 50));
    assert_eq!(c.iters_for(16 << 20), (5, 25));
    assert_eq!(c.iters_for(256 << 20), (2, 10));
    assert_eq!(c.inner_for(8), 100);
    assert_eq!(c.inner_for(1 << 20), 6);
    assert_eq!(c.bw_reps_for(8), 100);
    assert_eq!(c.bw_reps_for(256 << 20), 1);
    let c = parse(&["--fixed-iters"]).unwrap();
    assert_eq!(c.iters_for(256 << 20), (10, 50));
    assert_eq!(c.inner_for(1 << 20), 100);
}

#[test]
fn fingerprints_differ_with_options() {
    let a = parse(&[]).unwrap().fingerprint();
    assert_eq!(a, parse(&[]).unwrap().fingerprint());
    assert_ne!(a, parse(&["--seed", "3"]).unwrap().fingerprint());
}

#[test]
fn algorithm_options_take_the_names_of_the_library_tables() {
    for a in AllReduceAlgo::ALL {
        assert_eq!(parse(&["--algo", a.name()]).unwrap().algo, a);
    }
    for a in AllGatherAlgo::ALL {
        let c = parse(&["--allgather-algo", a.name()]).unwrap();
        assert_eq!(c.allgather_algo, a);
    }
    for a in ReduceScatterAlgo::ALL {
        let c = parse(&["--reducescatter-algo", a.name()]).unwrap();
        assert_eq!(c.reducescatter_algo, a);
    }
    assert!(parse(&["--algo", "fastest"]).is_err());
    assert!(parse(&["--reducescatter-algo", "push"]).is_err());
    // --algo leaves the reduce-scatter alone.
    let c = parse(&["--algo", "twoshot"]).unwrap();
    assert_eq!(c.reducescatter_algo, ReduceScatterAlgo::Auto);
    assert_ne!(
        parse(&[]).unwrap().fingerprint(),
        parse(&["--reducescatter-algo", "pull"])
            .unwrap()
            .fingerprint()
    );
    // --algo alone picks the all-gather of its family.
    let c = parse(&["--algo", "sentinel-twoshot"]).unwrap();
    assert_eq!(c.allgather_algo, AllGatherAlgo::LowLatency);
    let c = parse(&["--algo", "twoshot", "--allgather-algo", "oneshot"]).unwrap();
    assert_eq!(c.allgather_algo, AllGatherAlgo::OneShot);
    assert_eq!(parse(&[]).unwrap().allgather_algo, AllGatherAlgo::Auto);
    use clap::CommandFactory;
    let help = Args::command().render_long_help().to_string();
    assert!(
        help.contains("sentinel-twoshot"),
        "help lacks the algorithm names"
    );
}

#[test]
fn tp_is_named_not_part_of_all() {
    let c = parse(&[]).unwrap();
    assert!(!c.tests.tp);
    assert_eq!(c.tp_symmetric_bytes(), 0);
    let c = parse(&["--tests", "tp"]).unwrap();
    assert!(c.tests.tp && !c.tests.any_collective() && !c.tests.any_p2p());
    assert!(c.needs_nccl());
    assert!(!parse(&["--tests", "tp", "--impls", "ours"])
        .unwrap()
        .needs_nccl());
    let c = parse(&["--tests", "all,tp"]).unwrap();
    assert!(c.tests.tp && c.tests.allreduce && c.tests.reducescatter && c.tests.p2p_bw);
}

#[test]
fn tp_layouts_parse_by_name() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.tp_layouts, [TpLayout::Replicated, TpLayout::Sequence]);
    let c = parse(&["--tp-layouts", "Sequence, sequence"]).unwrap();
    assert_eq!(c.tp_layouts, [TpLayout::Sequence]);
    assert!(parse(&["--tp-layouts", "sharded"]).is_err());
    assert_eq!(TpLayout::Sequence.variant("8b"), "8b-sp");
    assert_eq!(TpLayout::Replicated.variant("8b"), "8b");
}

#[test]
fn tp_shapes_parse_by_name_and_by_size() {
    let c = parse(&[]).unwrap();
    let sizes = |c: &Config| -> Vec<(String, usize, usize)> {
        c.tp_shapes
            .iter()
            .map(|s| (s.name.clone(), s.hidden, s.ffn))
            .collect()
    };
    assert_eq!(
        sizes(&c),
        vec![("8b".into(), 4096, 14336), ("70b".into(), 8192, 28672)]
    );
    let c = parse(&["--tp-shapes", "4096,14336"]).unwrap();
    assert_eq!(sizes(&c), vec![("4096x14336".into(), 4096, 14336)]);
    let c = parse(&["--tp-shapes", "70B, 1024,4096 ,8b,70b"]).unwrap();
    assert_eq!(
        sizes(&c),
        vec![
            ("70b".into(), 8192, 28672),
            ("1024x4096".into(), 1024, 4096),
            ("8b".into(), 4096, 14336)
        ]
    );
    for bad in ["13b", "8b,4096", "0,128", "128,0", "", "8b,,70b", "4096,x"] {
        assert!(parse(&["--tp-shapes", bad]).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn tp_token_counts_parse_and_have_defaults() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.tp_m, vec![1, 16, 64, 128, 512, 2048, 8192]);
    assert_eq!(parse(&["--quick"]).unwrap().tp_m, vec![1, 128, 2048]);
    let c = parse(&["--tp-m", "2048,1,16,1", "--quick"]).unwrap();
    assert_eq!(c.tp_m, vec![1, 16, 2048]);
    assert!(parse(&["--tp-m", "0"]).is_err());
    assert!(parse(&["--tp-m", "8,x"]).is_err());
    assert_ne!(
        parse(&["--tests", "tp"]).unwrap().fingerprint(),
        parse(&["--tests", "tp", "--tp-m", "1"])
            .unwrap()
            .fingerprint()
    );
    assert_ne!(
        parse(&[]).unwrap().fingerprint(),
        parse(&["--tp-shapes", "8b"]).unwrap().fingerprint()
    );
}

#[test]
fn the_symmetric_heap_fits_the_tp_buffers() {
    // 70b at M = 8192: a partial product and three outputs of 8192 x 8192 bf16, the
    // feature pieces' scratch of 2048 x 8192, and the fused GEMM + reduce-scatter's two
    // buffers of at most 8192 x 8192.
    let replicated = [
        "--tests",
        "tp",
        "--tp-layouts",
        "replicated",
        "--impls",
        "ours,nccl",
    ];
    let c = parse(&replicated).unwrap();
    assert_eq!(c.tp_symmetric_bytes(), (5 * 8192 + 8) * 8192 * 2);
    // cublasmp's workspaces besides: the GEMM + all-reduce's of 4 M x hidden and the
    // fixed part of two (sequence parallel has two workspaces).
    let c = parse(&[&replicated[..4], &["--impls", "cublasmp"]].concat()).unwrap();
    assert_eq!(
        c.tp_symmetric_bytes(),
        (9 * 8192 + 8) * 8192 * 2 + 2 * CUBLASMP_FIXED_BYTES
    );
    // Below 1024 tokens no PE of several has 512 tokens: no exchange buffers.
    let c = parse(&[&replicated[..], &["--tp-shapes", "8b", "--tp-m", "16,512"]].concat()).unwrap();
    assert_eq!(c.tp_symmetric_bytes(), (3 * 512 + 8) * 4096 * 2);
    // Sequence parallel (on by default): the gathered input, the partial product and the
    // exchange buffer of 8192 x 8192, the input and three outputs of at most as much.
    let c = parse(&["--tests", "tp", "--impls", "ours"]).unwrap();
    assert_eq!(c.tp_symmetric_bytes(), 7 * 8192 * 8192 * 2);
    // And cublasmp's all-gather and reduce-scatter workspaces (1 and 2 M x hidden): 10 M
    // x hidden, more than the replicated layout's with cublasmp (on by default).
    let c = parse(&["--tests", "tp", "--tp-layouts", "sequence"]).unwrap();
    assert_eq!(
        c.tp_symmetric_bytes(),
        10 * 8192 * 8192 * 2 + 2 * CUBLASMP_FIXED_BYTES
    );
    let c = parse(&["--tests", "tp"]).unwrap();
    assert_eq!(
        c.tp_symmetric_bytes(),
        10 * 8192 * 8192 * 2 + 2 * CUBLASMP_FIXED_BYTES
    );
}

#[test]
fn help_documents_the_options() {
    use clap::CommandFactory;
    let help = Args::command().render_long_help().to_string();
    for word in [
        "--tests",
        "--min-bytes",
        "--dtypes",
        "--iters",
        "--out",
        "--quick",
        "busbw",
        "nvshmrun",
        "--tp-shapes",
        "--tp-m",
        "compute-only",
        "cublas+nccl",
        "cublas+ours",
        "TpMlp::auto_schedule",
        "not part of `all`",
        "reducescatter",
        "--reducescatter-algo",
        "ncclReduceScatter",
        "reduce-scatter INPUT",
        "NVSHMEM_REDUCE_SCRATCH_SIZE",
    ] {
        assert!(help.contains(word), "help lacks {word}");
    }
}

#[test]
fn gradsync_is_a_named_test_of_the_sizes_from_256_kib() {
    let c = parse(&["--tests", "gradsync", "--sizes", "8,64K,256K,16M"]).unwrap();
    assert!(c.tests.gradsync && !c.tests.allreduce && c.needs_nccl());
    assert_eq!(crate::gradsync::sizes(&c.sizes), vec![256 << 10, 16 << 20]);
    assert!(!parse(&["--tests", "all"]).unwrap().tests.gradsync);
    assert!(!parse(&["--tests", "gradsync", "--impls", "ours"])
        .unwrap()
        .needs_nccl());
}

#[test]
fn pipeline_norm_and_floor_are_named_tests_with_their_options() {
    let c = parse(&["--tests", "pipeline"]).unwrap();
    assert!(c.tests.pipeline && !c.tests.floor && !c.tests.any_collective());
    assert_eq!(c.pipe_tokens, vec![1, 16, 64]);
    assert_eq!(
        (c.pipe_micro_batches, c.pipe_hidden, c.pipe_ffn),
        (8, 4096, 4096)
    );
    assert!(c.needs_nccl());
    let c = parse(&[
        "--tests",
        "pipeline",
        "--pipe-tokens",
        "64,1",
        "--pipe-micro-batches",
        "4",
    ])
    .unwrap();
    assert_eq!((c.pipe_tokens, c.pipe_micro_batches), (vec![1, 64], 4));
    assert!(parse(&["--tests", "pipeline", "--pipe-tokens", "0"]).is_err());
    assert!(parse(&["--pipe-micro-batches", "0"]).is_err());
    assert!(parse(&["--pipe-hidden", "0"]).is_err());
    let c = parse(&["--tests", "norm"]).unwrap();
    assert!(c.tests.norm && !c.tests.pipeline && c.needs_nccl());
    assert!(!parse(&["--tests", "norm", "--impls", "ours"])
        .unwrap()
        .needs_nccl());
    assert!(parse(&["--tests", "floor"]).unwrap().tests.floor);
}

#[test]
fn the_bandwidth_matrix_is_a_point_to_point_test_with_a_threshold() {
    let c = parse(&["--tests", "p2p-matrix"]).unwrap();
    assert!(c.tests.p2p_matrix && c.tests.any_p2p() && c.tests.device_p2p() && !c.tests.p2p_bw);
    assert_eq!(c.min_gbps, 0.0);
    assert!(parse(&[]).unwrap().tests.p2p_matrix);
    assert!(parse(&["--tests", "p2p"]).unwrap().tests.p2p_matrix);
    assert_eq!(parse(&["--min-gbps", "230"]).unwrap().min_gbps, 230.0);
    assert!(parse(&["--min-gbps", "-1"]).is_err());
}
