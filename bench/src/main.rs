//! NVSHMEM vs NCCL benchmark suite: our collectives, NVSHMEM's own and NCCL's side by side,
//! and point-to-point latency and bandwidth from devices, hosts and streams.
//!
//! ```text
//! make bench NP=8 ARGS='--quick'
//! scripts/nvshmrun -np 8 target/release/bench --tests allreduce --dtypes bf16
//! target/release/bench --help
//! ```

mod channel;
mod cli;
mod coll;
mod coord;
mod cublasmp;
mod data;
mod env;
mod error;
mod floor;
mod gradsync;
mod hybrid;
mod kv_transfer;
mod map;
mod nccl;
mod norm;
mod p2p;
mod pipeline;
mod plot;
mod pool;
mod report;
mod stats;
mod teams;
mod timing;
mod tp;

/// The crate's check of an embedded cubin set (shared with its tests and the checks').
#[cfg(test)]
#[path = "../../tests/support/cubin_set.rs"]
mod cubin_set;

/// This crate's kernels (kernels/bench_p2p.cu, floor.cu, pipeline.cu, map_bench.cu), built by
/// build.rs.
mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

use clap::Parser;
use cli::{Config, Impl};
use coord::Coord;
use error::{BenchError, CudaExt, Guard, Result};
use nvshmem::module::Module;
use nvshmem::{Collectives, Nvshmem};
use std::sync::Arc;
use std::time::Instant;

/// Progress lines on stderr, from PE 0 only.
pub struct Progress {
    lead: bool,
    start: Instant,
}

impl Progress {
    pub fn new(lead: bool) -> Self {
        Progress {
            lead,
            start: Instant::now(),
        }
    }

    pub fn say(&self, msg: impl AsRef<str>) {
        if self.lead {
            eprintln!(
                "[{:>7.1}s] {}",
                self.start.elapsed().as_secs_f64(),
                msg.as_ref()
            );
        }
    }
}

fn main() {
    // A panic must not unwind into collective clean-up (freeing symmetric memory waits for
    // every PE): report it and stop this process; the launcher stops the others.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("bench: internal error: {info}");
        std::process::abort();
    }));
    let cfg = match Config::from_args(cli::Args::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bench: {e} (see --help)");
            std::process::exit(2);
        }
    };
    set_environment(&cfg);
    if cfg.needs_nccl() {
        if let Err(e) = nccl::check_library() {
            let also = match cfg.needs_cublasmp() {
                true => " (cublasmp needs NCCL too: cuBLASMp runs on an NCCL communicator)",
                false => "",
            };
            eprintln!("bench: {e}{also}");
            std::process::exit(1);
        }
    }
    let cublasmp_version = match cfg.needs_cublasmp() {
        true => match cublasmp::check_library() {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!("bench: {e}");
                std::process::exit(1);
            }
        },
        false => None,
    };
    timing::step("starting NVSHMEM");
    let shmem = match Nvshmem::init() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: cannot start NVSHMEM: {e}");
            std::process::exit(1);
        }
    };
    if cfg.watchdog_s > 0 {
        timing::start_watchdog(
            std::time::Duration::from_secs(cfg.watchdog_s),
            shmem.my_pe(),
        );
    }
    match run(&shmem, &cfg, cublasmp_version) {
        Ok(all_passed) => {
            // Every PE gets here: finalise together.
            drop(shmem);
            std::process::exit(if all_passed { 0 } else { 1 });
        }
        Err(e) => {
            // Other PEs may be inside a collective: do not finalise, just stop.
            eprintln!("bench: PE {}: {e}", shmem.my_pe());
            std::process::exit(1);
        }
    }
}

/// Defaults for NVSHMEM, unless the user chose (read by NVSHMEM at initialisation):
/// a symmetric heap large enough for the largest size, and NVSHMEM's own collectives rather
/// than NCCL under NVSHMEM's on-stream API (NVSHMEM loads libnccl.so.2 when it can).
fn set_environment(cfg: &Config) {
    if std::env::var_os("NVSHMEM_DISABLE_NCCL").is_none() {
        std::env::set_var("NVSHMEM_DISABLE_NCCL", "1");
    }
    if std::env::var_os("NVSHMEM_SYMMETRIC_SIZE").is_some() {
        return;
    }
    let mib = symmetric_size_mib(cfg);
    std::env::set_var("NVSHMEM_SYMMETRIC_SIZE", format!("{mib}M"));
}

/// The symmetric heap the benchmark asks for, in MiB: 3 x the largest size (a collective
/// case holds its input and output at once, at most 2 x the size: the all-reduce's two
/// buffers of the size, the all-gather's output of the size and input of size / PEs, the
/// reduce-scatter's input of the size and output of size / PEs), or the tp test's buffers
/// (`Config::tp_symmetric_bytes`) when more, plus room for our collectives' workspace, NVSHMEM's own
/// and allocation alignment; at least 1 GiB.
fn symmetric_size_mib(cfg: &Config) -> usize {
    let need = (3 * cfg.max_size()).max(cfg.tp_symmetric_bytes()) + (512 << 20);
    need.max(1 << 30).div_ceil(1 << 20)
}

/// The whole benchmark on this PE; `Ok(true)` when every check passed.
fn run(shmem: &Nvshmem, cfg: &Config, cublasmp_version: Option<String>) -> Result<bool> {
    let me = shmem.my_pe();
    let n = shmem.n_pes();
    let lead = me == 0;
    let progress = Progress::new(lead);
    let coord = Coord::new(shmem)?;
    if !coord.all_equal(cfg.fingerprint())? {
        return Err(BenchError::new(
            "the PEs were started with different options; pass the same arguments to every PE",
        ));
    }

    let nccl = match cfg.needs_nccl() {
        true => {
            progress.say("initialising NCCL");
            timing::step("initialising NCCL");
            Some(Guard::new(nccl::Nccl::new(shmem, &coord)?))
        }
        false => None,
    };
    let nccl_version = match nccl {
        Some(_) => Some(nccl::version()?),
        None => None,
    };
    timing::step("collecting the environment");
    let probe = Guard::new(shmem.calloc::<u64>(1)?);
    let environment = env::collect(shmem, &coord, &probe, nccl_version, cublasmp_version)?;
    drop(probe);
    let header = environment.render();
    if lead {
        println!("{header}");
        println!(
            "options      : tests {:?}\n               dtypes {:?}, impls {:?}, modes {:?}, sizes {} to {} ({} sizes; latency up to {}), \
             iters {}, warm-up {}, graph ops {}, inner {}, CTAs {:?}, block threads {}, peer PE {}, seed {:#x}{}",
            cfg.tests,
            cfg.dtypes,
            cfg.impls,
            cfg.modes,
            cli::format_size(cfg.sizes.first().copied().unwrap_or(0)),
            cli::format_size(cfg.sizes.last().copied().unwrap_or(0)),
            cfg.sizes.len(),
            cli::format_size(cfg.lat_sizes.last().copied().unwrap_or(0)),
            cfg.iters,
            cfg.warmup,
            cfg.graph_ops,
            cfg.inner,
            cfg.ctas,
            cfg.block_threads,
            cfg.peer,
            cfg.seed,
            if cfg.fixed_iters { ", fixed iterations" } else { "" }
        );
        if cfg.tests.tp {
            println!(
                "               tp shapes {}, M {:?}, implementations {}",
                cfg.tp_shapes
                    .iter()
                    .map(|s| format!("{} (hidden {}, ffn {})", s.name, s.hidden, s.ffn))
                    .collect::<Vec<_>>()
                    .join(", "),
                cfg.tp_m,
                tp::TpImpl::selected(cfg)
                    .into_iter()
                    .map(tp::TpImpl::name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }

    let stream = shmem.new_stream()?;
    let mut timer = timing::Timer::new(shmem.context().clone());
    let mut results = report::Results::default();
    let threads = std::thread::available_parallelism()
        .map(|p| p.get())
        .unwrap_or(1)
        .div_ceil(shmem.node_n_pes())
        .max(1);

    // The floor first: the collective tables give our rows as multiples of it.
    if cfg.tests.floor || cfg.tests.any_collective() {
        let ctx = floor::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            progress: &progress,
        };
        floor::run(&ctx, &mut timer, &mut results)?;
    }

    // Our collectives: those measured, and the tp test's all-reduce (which it always needs:
    // the tensor-parallel layers are built on them).
    let ours = match (cfg.tests.any_collective() && cfg.has_impl(Impl::Ours))
        || cfg.tests.tp
        || cfg.tests.norm
        || cfg.tests.gradsync
    {
        true => {
            progress.say("loading our collectives");
            timing::step("loading our collectives");
            Some(Guard::new(Arc::new(Collectives::new(shmem)?)))
        }
        false => None,
    };
    if cfg.tests.any_collective() {
        // With --team-size, our collectives over this PE's row of that many PEs.
        let team = match cfg.team_size {
            Some(k) => Some(teams::TeamRun::new(shmem, k, &mut results, &progress)?),
            None => None,
        };
        let ctx = coll::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            ours: match (cfg.has_impl(Impl::Ours), &team) {
                (false, _) => None,
                (true, Some(t)) => Some(t.collectives()),
                (true, None) => ours.as_deref().map(|c| &**c),
            },
            team: team.as_ref().map(|t| t.place()),
            nccl: nccl.as_deref(),
            progress: &progress,
            threads,
        };
        coll::run(&ctx, &mut timer, &mut results)?;
    }
    if let (true, Some(collectives)) = (cfg.tests.tp, ours.as_deref()) {
        // cuBLASMp joins this process's NVSHMEM and runs on the NCCL communicator.
        let mp = match (cfg.needs_cublasmp(), nccl.as_deref()) {
            (true, Some(nccl)) => {
                progress.say("initialising cuBLASMp");
                timing::step("initialising cuBLASMp");
                // SAFETY: the communicator spans every PE, rank = PE, and outlives `mp`.
                let mp = unsafe { cublasmp::CublasMp::new(nccl.comm() as _, n, &stream) }?;
                Some(Guard::new(mp))
            }
            _ => None,
        };
        let ctx = tp::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            collectives,
            nccl: nccl.as_deref(),
            cublasmp: mp.as_deref(),
            progress: &progress,
            threads,
        };
        tp::run(&ctx, &mut timer, &mut results)?;
    }
    // The norm and gradsync tests share one context: our collectives and NCCL if asked.
    if let (true, Some(collectives)) = (cfg.tests.norm || cfg.tests.gradsync, ours.as_deref()) {
        let ctx = norm::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            collectives,
            nccl: match cfg.has_impl(Impl::Nccl) {
                true => nccl.as_deref(),
                false => None,
            },
            progress: &progress,
            threads,
        };
        if cfg.tests.norm {
            norm::run(&ctx, &mut timer, &mut results)?;
        }
        if cfg.tests.gradsync {
            gradsync::run(&ctx, &mut timer, &mut results)?;
        }
    }
    drop(ours);

    if cfg.tests.any_p2p() && !cfg.has_impl(Impl::Nccl) {
        results
            .notes
            .push("NCCL point-to-point comparisons skipped: nccl is not in --impls".into());
    }
    if cfg.tests.any_p2p() {
        if n < 2 || cfg.peer >= n {
            let note = format!(
                "point-to-point tests skipped: they need PE 0 and PE {} (there are {n} PEs; see --peer)",
                cfg.peer
            );
            progress.say(&note);
            results.notes.push(note);
        } else {
            let module = match cfg.tests.device_p2p() {
                true => Some(Guard::new(Module::load(shmem, &kernels::BENCH_P2P)?)),
                false => None,
            };
            p2p::run(
                shmem,
                &coord,
                cfg,
                &stream,
                module.as_deref(),
                nccl.as_deref(),
                &progress,
                &mut timer,
                &mut results,
            )?;
        }
    }

    if cfg.tests.channel {
        let ctx = channel::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            nccl: nccl.as_deref(),
            progress: &progress,
        };
        channel::run(&ctx, &mut timer, &mut results)?;
    }
    if cfg.tests.hybrid {
        let ctx = hybrid::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            nccl: nccl.as_deref(),
            progress: &progress,
        };
        hybrid::run(&ctx, &mut timer, &mut results)?;
    }
    if cfg.tests.pipeline {
        let ctx = pipeline::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            nccl: match cfg.has_impl(Impl::Nccl) {
                true => nccl.as_deref(),
                false => None,
            },
            progress: &progress,
        };
        pipeline::run(&ctx, &mut timer, &mut results)?;
    }
    if cfg.tests.pool {
        let ctx = pool::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            progress: &progress,
        };
        pool::run(&ctx, &mut timer, &mut results)?;
    }
    if cfg.tests.map {
        let module = Guard::new(Module::load(shmem, &kernels::MAP_BENCH)?);
        let chain = module.function("map_bench_chain")?;
        let ctx = map::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            progress: &progress,
            chain: &chain,
        };
        map::run(&ctx, &mut timer, &mut results)?;
    }
    if cfg.tests.kv_transfer {
        let ctx = kv_transfer::Ctx {
            shmem,
            coord: &coord,
            cfg,
            stream: &stream,
            progress: &progress,
            nccl: match cfg.has_impl(Impl::Nccl) {
                true => nccl.as_deref(),
                false => None,
            },
        };
        kv_transfer::run(&ctx, &mut timer, &mut results)?;
    }

    timing::step("finishing");
    stream.synchronize().cuda("cuStreamSynchronize")?;
    coord.barrier()?;
    let passed = results.failed().count() == 0;

    // PE 0 reports; every PE learns whether that worked before anyone finalises.
    let written = if lead {
        write_outputs(cfg, &results, &environment, &header)
    } else {
        Ok(())
    };
    let write_failed = coord.sum(written.is_err() as u64)?;
    written?;
    if write_failed > 0 {
        return Err(BenchError::new("PE 0 could not write the results"));
    }
    progress.say(if passed {
        "done: all checks passed"
    } else {
        "done: some checks FAILED"
    });
    Ok(passed)
}

fn write_outputs(
    cfg: &Config,
    results: &report::Results,
    environment: &env::Environment,
    header: &str,
) -> Result<()> {
    let tables = report::render_tables(results, cfg);
    print!("{tables}");
    let summary = format!("{header}\n{tables}");
    let mut files = report::write_all(&cfg.out, results, cfg, Some(environment), &summary)?;
    if cfg.plots {
        files.extend(plot::write_plots(&cfg.out, &results.records, cfg)?);
    }
    println!("\nwrote {} files to {}:", files.len(), cfg.out.display());
    for f in files {
        println!("  {}", f.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(args: &[&str]) -> Config {
        let mut v = vec!["bench"];
        v.extend_from_slice(args);
        Config::from_args(cli::Args::try_parse_from(v).unwrap()).unwrap()
    }

    #[test]
    fn the_symmetric_heap_holds_every_collective_case_and_room() {
        for args in [
            &["--tests", "reducescatter"][..],
            &[
                "--tests",
                "allreduce,allgather,reducescatter",
                "--max-bytes",
                "1G",
            ],
            &["--tests", "reducescatter", "--quick"],
            &["--tests", "all,tp", "--tp-m", "16"],
        ] {
            let c = cfg(args);
            let largest = *c.sizes.last().unwrap();
            let heap = symmetric_size_mib(&c) << 20;
            // The reduce-scatter's input of the largest size and its output (size / PEs, at
            // most the size with one PE); the all-reduce's input and output alike.
            assert!(heap >= 2 * largest + (512 << 20), "{args:?}: {heap}");
            assert!(
                heap >= c.tp_symmetric_bytes() + (512 << 20),
                "{args:?}: {heap}"
            );
            assert!(heap >= 1 << 30);
        }
        assert_eq!(
            symmetric_size_mib(&cfg(&["--tests", "reducescatter"])),
            1280
        );
    }
}
