//! The fault suite: a bug or a death on one PE must end the job with a clear message, within
//! the configured timeout, and a non-zero exit; never a hang.
//!
//! ```text
//! target/release/fault_check [--np 2] [--launcher mpiexec] [--limit 60] [--only a,b] [--trace]
//! ```
//!
//! Run without a launcher: it starts one job per case (`LAUNCHER -np N fault_check --case
//! NAME`), kills a job that outlives `--limit` seconds, and checks that each ended non-zero,
//! in time, with the expected message from each PE that can see the fault. Prints
//! `N passed, M failed`. The launcher is `--launcher`, else `$MPIEXEC`, else `mpiexec`.
//! `--trace` makes each PE print its steps with times (shown for a failed case).
//!
//! Most cases run our all-reduce with a 2 s timeout (`CollectivesConfig::timeout`); the
//! others wait on the host for a flag nobody sets, free while a stream is being captured,
//! call a tensor-parallel layer's fused exchange without one PE, or start with no transport
//! between the GPUs. The runtime's own waits are bounded at 4 s
//! (`NVSHMEM_RS_TIMEOUT`). A PE that gets an error prints `fault_check: PE k: <error>` and
//! exits with status 1. The `missing-pe` case runs without the launcher: rank 0 of 2 starts
//! with a unique ID that no rank 1 ever uses, and the start's own bound
//! (`InitOptions::start_timeout`) must end it.

use clap::Parser;
use nvshmem::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, Cmp, Collectives, CollectivesConfig, InitOptions,
    Nvshmem, ReduceOp, SymmetricBuffer, UniqueId,
};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The bound on every wait of a case's collectives.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Calls each case makes.
const CALLS: usize = 8;

/// A case: its name, what it does wrong, and what each PE that sees the fault must print
/// (`(pe, text)`: a line `fault_check: PE pe: ...text...`; `pe` = `ANY`: any line).
struct Case {
    name: &'static str,
    about: &'static str,
    expect: &'static [(usize, &'static str)],
    /// Started without the launcher, as rank 0 of 2 with a unique ID.
    alone: bool,
}

const ANY: usize = usize::MAX;

const CASES: &[Case] = &[
    Case {
        name: "skip-call",
        about: "PE 1 skips the 4th of 8 calls",
        expect: &[(0, "from PE 1 and gave up")],
        alone: false,
    },
    Case {
        name: "length",
        about: "PE 0 passes 1000 elements, the others 2000 (no per-call check)",
        expect: &[
            (0, "made different calls"),
            (1, "PE 1 and PE 0 made different calls"),
        ],
        alone: false,
    },
    Case {
        name: "all-to-all-length",
        about:
            "PE 0 calls all_to_all with blocks of 4 elements, the others of 8 (release defaults)",
        expect: &[
            (0, "made different calls"),
            (1, "PE 1 and PE 0 made different calls"),
        ],
        alone: false,
    },
    Case {
        name: "length-checked",
        about: "the same with CollectivesConfig::check_calls",
        expect: &[
            (0, "PE 0 calls all_reduce(Sum, F32, ll, 1000 elements"),
            (1, "PE 1 calls all_reduce(Sum, F32, ll, 2000 elements"),
        ],
        alone: false,
    },
    Case {
        name: "exit",
        about: "PE 1 leaves after 3 calls (status 0)",
        expect: &[(0, "from PE 1 and gave up")],
        alone: false,
    },
    Case {
        name: "bad-argument",
        about: "PE 1's call fails its argument check (a misaligned view)",
        expect: &[(1, "byte boundary")],
        alone: false,
    },
    Case {
        name: "skip-call-checked",
        about: "PE 1 skips the 4th of 8 calls, with CollectivesConfig::check_calls",
        expect: &[(0, "did not publish what it is doing")],
        alone: false,
    },
    Case {
        name: "bad-argument-checked",
        about: "PE 1's argument check fails, with CollectivesConfig::check_calls",
        expect: &[(0, "PE 1 could not go on"), (1, "byte boundary")],
        alone: false,
    },
    Case {
        name: "wait-no-setter",
        about: "PE 1 waits on the host for a flag that PE 0 never sets",
        expect: &[(1, "for the wait variable (element 0) and gave up")],
        alone: false,
    },
    Case {
        name: "free-capture",
        about: "PE 0 frees while another of its threads captures a stream into a graph",
        expect: &[
            (0, "PE 0 could not wait for its GPU"),
            (1, "PE 0 could not wait for its GPU"),
        ],
        alone: false,
    },
    Case {
        name: "no-transport",
        about: "NVSHMEM_DISABLE_P2P=1 with no network transport: no way between the GPUs",
        expect: &[(ANY, "NVSHMEM_DISABLE_P2P turns off load/store")],
        alone: false,
    },
    Case {
        name: "missing-pe",
        about: "rank 0 of 2 starts with a unique ID, rank 1 never does",
        expect: &[(
            ANY,
            "the start of NVSHMEM on rank 0 of 2 (unique-ID bootstrap) has waited",
        )],
        alone: true,
    },
    Case {
        name: "team-sync-skip",
        about: "PE 1 skips a sync of a team split off the world (of every PE)",
        expect: &[(0, "PE 1 did not reach it within")],
        alone: false,
    },
    Case {
        name: "ce-late",
        about: "PE 1 enters a copy-engine all-gather after the others' bound ran out",
        expect: &[(0, "from PE 1 and gave up"), (1, "gave up this call")],
        alone: false,
    },
    Case {
        name: "tp-skip",
        about: "PE 1 skips a row-parallel layer's fused GEMM + reduce-scatter that the others call",
        expect: &[(0, "for PE 1 and gave up: it never made the same call")],
        alone: false,
    },
    Case {
        name: "channel-no-sender",
        about: "PE 0 skips its send on a channel to PE 1 (a 2 s bound), which receives",
        expect: &[
            (1, "for the message from PE 0 and gave up"),
            (0, "from PE 1 and gave up"),
        ],
        alone: false,
    },
];

/// The command line: the driver's options, and the internal `--case` of a job it starts.
#[derive(Parser)]
#[command(
    version,
    about = "The fault suite: a bug or a death on one PE must end the job with a clear message, \
             within the configured timeout, and a non-zero exit; never a hang",
    long_about = "The fault suite: a bug or a death on one PE must end the job with a clear \
                  message, within the configured timeout, and a non-zero exit; never a hang.\n\n\
                  Run it without a launcher: it starts one job per case (LAUNCHER -np N \
                  fault_check --case NAME), kills a job that outlives --limit seconds, and \
                  checks that each ended non-zero, in time, with the expected message from each \
                  PE that can see the fault. Prints `N passed, M failed` and exits non-zero if \
                  any case failed.",
    after_long_help = case_list()
)]
struct Cli {
    /// PEs of each case's job
    #[arg(long, value_name = "N", default_value_t = 2)]
    np: usize,
    /// The launcher of each case's job, split at spaces [default: $MPIEXEC, else mpiexec]
    #[arg(long, value_name = "COMMAND", allow_hyphen_values = true)]
    launcher: Option<String>,
    /// Seconds a case's job may run before it is killed as a hang
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    limit: u64,
    /// Run only these cases (names separated by commas; `--help` lists them)
    #[arg(long, value_name = "A,B")]
    only: Option<String>,
    /// Each PE prints its steps with times (shown for a failed case)
    #[arg(long)]
    trace: bool,
    /// Run one PE's part of case NAME: what the driver starts under the launcher
    #[arg(long, value_name = "NAME", hide = true)]
    case: Option<String>,
}

/// The cases, a line each, for `--help`.
fn case_list() -> String {
    let width = CASES.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let lines: Vec<String> = CASES
        .iter()
        .map(|c| format!("  {:width$}  {}", c.name, c.about))
        .collect();
    format!("Cases:\n{}", lines.join("\n"))
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.case {
        Some(case) => run_case(&case),
        None => drive(
            cli.np,
            cli.launcher
                .or_else(|| std::env::var("MPIEXEC").ok())
                .unwrap_or_else(|| "mpiexec".into()),
            Duration::from_secs(cli.limit),
            cli.only,
            cli.trace,
        ),
    };
    std::process::exit(code);
}

/// Start one job per case and check how each ended.
fn drive(np: usize, launcher: String, limit: Duration, only: Option<String>, trace: bool) -> i32 {
    let me = std::env::current_exe().expect("the path of this program");
    let (mut passed, mut failed) = (0, 0);
    let chosen = |name: &str| {
        only.as_ref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    for case in CASES.iter().filter(|c| chosen(c.name)) {
        let began = Instant::now();
        let launch = if case.alone {
            None
        } else {
            Some(launcher.as_str())
        };
        let verdict =
            run_job(launch, np, &me, case.name, limit, trace).and_then(|(status, output)| {
                let took = began.elapsed();
                if status == Some(0) {
                    return Err(format!(
                        "the job exited 0 after {took:.1?}; a fault must fail it"
                    ));
                }
                let missing: Vec<String> = case
                    .expect
                    .iter()
                    .filter(|(pe, text)| {
                        let from = |l: &str| {
                            *pe == ANY || l.starts_with(&format!("fault_check: PE {pe}:"))
                        };
                        !output.lines().any(|l| from(l) && l.contains(text))
                    })
                    .map(|(pe, text)| match *pe {
                        ANY => format!("\"{text}\""),
                        pe => format!("PE {pe}: \"{text}\""),
                    })
                    .collect();
                if !missing.is_empty() {
                    return Err(format!(
                        "no message {}; output:\n{output}",
                        missing.join(", ")
                    ));
                }
                Ok(took)
            });
        match verdict {
            Ok(took) => {
                passed += 1;
                println!(
                    "ok   {} ({}): failed cleanly in {took:.1?}",
                    case.name, case.about
                );
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {} ({}): {e}", case.name, case.about);
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    i32::from(failed > 0)
}

/// Run `launcher -np N exe --case NAME` (or `exe --case NAME` alone); its exit status
/// (`None` if killed by a signal) and its output, or an error if it outlived `limit` (then it
/// is killed).
fn run_job(
    launcher: Option<&str>,
    np: usize,
    exe: &std::path::Path,
    case: &str,
    limit: Duration,
    trace: bool,
) -> Result<(Option<i32>, String), String> {
    let mut command = match launcher {
        Some(launcher) => {
            let mut parts = launcher.split_whitespace();
            let mut c = Command::new(parts.next().ok_or("an empty --launcher")?);
            c.args(parts).args(["-np", &np.to_string()]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    // The runtime's own host-side waits (allocations, finalize) bounded like the cases'
    // collectives; the job in a process group of its own, so that a hang is killed whole.
    let mut child = command
        .args(["--case", case])
        .env("NVSHMEM_RS_TIMEOUT", (2 * TIMEOUT).as_secs().to_string())
        .envs(trace.then_some(("FAULT_CHECK_TRACE", "1")))
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {launcher:?}: {e} (set --launcher or MPIEXEC)"))?;
    // What the job printed, read on threads of their own; collected with a bound, as a
    // process the job left behind may hold the pipes open.
    let (sent, outputs) = std::sync::mpsc::channel::<String>();
    let pipes: [Box<dyn Read + Send>; 2] = [
        Box::new(child.stdout.take().unwrap()),
        Box::new(child.stderr.take().unwrap()),
    ];
    for mut pipe in pipes {
        let sent = sent.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            pipe.read_to_string(&mut s).ok();
            sent.send(s).ok();
        });
    }
    let collect = || {
        (0..2)
            .filter_map(|_| outputs.recv_timeout(Duration::from_secs(5)).ok())
            .collect::<String>()
    };
    let began = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if began.elapsed() > limit {
            // The launcher and every PE it started: SIGTERM to the group first, so that a
            // launcher script cleans up after itself (an MPS daemon it started), then SIGKILL.
            let group = format!("-{}", child.id());
            let signal = |s: &str| Command::new("kill").args([s, &group]).status().ok();
            signal("-TERM");
            let term = Instant::now();
            while child.try_wait().ok().flatten().is_none() && term.elapsed().as_secs() < 5 {
                std::thread::sleep(Duration::from_millis(50));
            }
            signal("-KILL");
            child.kill().ok();
            child.wait().ok();
            return Err(format!(
                "still running after {limit:?}: killed (a hang); output:\n{}",
                collect()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok((status.code(), collect()))
}

/// One PE's part of a case: 0 when it saw nothing wrong, 1 after printing the error it got.
fn run_case(case: &str) -> i32 {
    if case == "missing-pe" {
        // Rank 0 of 2; rank 1 never comes. The start's own bound ends the process.
        let start = UniqueId::new().and_then(|id| {
            let options = InitOptions::new().start_timeout(Some(TIMEOUT));
            Nvshmem::init_with_unique_id(0, 2, &id, options)
        });
        say(format!(
            "fault_check: PE 0: the start returned: {:?}",
            start.map(|_| ())
        ));
        return 1;
    }
    if case == "no-transport" {
        // Read by NVSHMEM and by the start's own check, before either starts.
        std::env::set_var("NVSHMEM_DISABLE_P2P", "1");
    }
    let shmem = match Nvshmem::init() {
        Ok(s) => s,
        Err(e) => {
            say(format!("fault_check: {e}"));
            return 1;
        }
    };
    let me = shmem.my_pe();
    let outcome = faulty_calls(&shmem, case);
    trace(
        me,
        &format!("the calls returned {:?}; buffers dropped", outcome.is_ok()),
    );
    match outcome {
        Ok(()) => {
            drop(shmem);
            trace(me, "finalized");
            0
        }
        Err(e) => {
            say(format!("fault_check: PE {me}: {e}"));
            // A moment for the other PEs to say what they saw before the launcher, seeing
            // this exit, ends them. Not through the runtime's drop: a peer may be gone, and
            // finalising would wait for it.
            std::thread::sleep(Duration::from_secs(1));
            std::process::exit(1);
        }
    }
}

/// `line` to stderr in one write: the PEs share the launcher's pipe, and a line written in
/// pieces (as `eprintln!` may) interleaves with another PE's, which the checks then miss.
fn say(line: String) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// With `FAULT_CHECK_TRACE` set (`--trace`), a line per step of a PE, timed from its start.
fn trace(me: usize, what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    if std::env::var_os("FAULT_CHECK_TRACE").is_some() {
        say(format!(
            "fault_check: trace PE {me} +{:.2?}: {what}",
            start.elapsed()
        ));
    }
}

fn faulty_calls(shmem: &Nvshmem, case: &str) -> nvshmem::Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    if n < 2 {
        return Err(nvshmem::Error::InvalidArgument(
            "the fault cases need 2 PEs or more".into(),
        ));
    }
    match case {
        "wait-no-setter" => return wait_for_nobody(shmem),
        "team-sync-skip" => return team_sync_skip(shmem),
        "free-capture" => return free_while_capturing(shmem),
        "tp-skip" => return tp_forward_skipped(shmem),
        _ => {}
    }
    let mut config = CollectivesConfig::for_pes(n);
    config.timeout = Some(TIMEOUT);
    config.check_calls = case.ends_with("-checked");
    let coll = Collectives::with_config(shmem, config)?;
    let x = shmem.malloc::<f32>(2048)?;
    x.copy_from_host(&vec![1.0; 2048])?;
    let y = shmem.malloc::<f32>(2048)?;
    let stream = shmem.stream();
    if case == "channel-no-sender" {
        return channel_no_sender(shmem, &coll, &x, &y);
    }
    if case == "all-to-all-length" {
        return all_to_all_length(shmem, &x, &y);
    }
    if case == "ce-late" {
        return copy_engine_late(shmem, &coll, &x, &y);
    }
    for call in 0..CALLS {
        let len = match case {
            "length" | "length-checked" if me == 0 => 1000,
            "length" | "length-checked" => 2000,
            _ => 2048,
        };
        if case.starts_with("skip-call") && me == 1 && call == 3 {
            continue;
        }
        trace(me, &format!("call {call}"));
        if case == "exit" && me == 1 && call == 3 {
            trace(me, "exit(0)");
            std::process::exit(0);
        }
        // One element in: not 16-byte aligned.
        let skew = usize::from(case.starts_with("bad-argument") && me == 1 && call == 3);
        let step = || -> nvshmem::Result<()> {
            coll.all_reduce(
                y.view(skew..len),
                x.view(skew..len),
                ReduceOp::Sum,
                AllReduceAlgo::LowLatency,
                stream,
            )?;
            stream.synchronize()?;
            coll.check()?;
            Ok(())
        };
        step().inspect_err(|e| trace(me, &format!("call {call} failed: {e}")))?;
    }
    Ok(())
}

/// PE 0 calls all_to_all with blocks of 4 elements, the others with blocks of 8, on a
/// `Collectives` of the default configuration (in release, no per-call agreement): the
/// calls' signatures differ, and every PE must get `CollectiveMismatch`, not `Ok`.
fn all_to_all_length(
    shmem: &Nvshmem,
    x: &SymmetricBuffer<f32>,
    y: &SymmetricBuffer<f32>,
) -> nvshmem::Result<()> {
    let mut config = CollectivesConfig::for_pes(shmem.n_pes());
    config.timeout = Some(TIMEOUT);
    config.check_calls = false; // the release default, in any build
    let coll = Collectives::with_config(shmem, config)?;
    let block = if shmem.my_pe() == 0 { 4 } else { 8 };
    let len = block * shmem.n_pes();
    let stream = shmem.stream();
    for call in 0..CALLS {
        trace(shmem.my_pe(), &format!("all_to_all {call}"));
        coll.all_to_all(y.view(..len), x.view(..len), AllToAllAlgo::Auto, stream)?;
        stream.synchronize()?;
        coll.check()?;
    }
    Ok(())
}

/// Three copy-engine all-gathers; PE 1 enters the third only after the others' opening
/// barrier gave up on it. Their copies, queued behind that barrier, still land in PE 1's
/// output: PE 1's call must then fail (its closing barrier finds that they gave up), not
/// return `Ok`. The others stay until PE 1 is done, so that its error ends the job.
fn copy_engine_late(
    shmem: &Nvshmem,
    coll: &Collectives,
    x: &SymmetricBuffer<f32>,
    y: &SymmetricBuffer<f32>,
) -> nvshmem::Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let len = y.len() / n;
    let stream = shmem.stream();
    for call in 0..3 {
        if me == 1 && call == 2 {
            trace(me, "late for the third all-gather");
            std::thread::sleep(2 * TIMEOUT + Duration::from_secs(1));
        }
        trace(me, &format!("all_gather {call}"));
        let step = || -> nvshmem::Result<()> {
            let out = y.view(..n * len);
            coll.all_gather(out, x.view(..len), AllGatherAlgo::CopyEngine, stream)?;
            stream.synchronize()?;
            coll.check()
        };
        if let Err(e) = step() {
            if me != 1 {
                std::thread::sleep(3 * TIMEOUT);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// PE 1 waits for a flag no PE sets: the runtime's wait limit (`NVSHMEM_RS_TIMEOUT`) ends it.
/// The others stay until well after that limit, so that PE 1's error (and not a peer
/// leaving) ends the job.
fn wait_for_nobody(shmem: &Nvshmem) -> nvshmem::Result<()> {
    let flag = shmem.calloc::<u64>(1)?;
    if shmem.my_pe() == 1 {
        trace(1, "waiting for a flag");
        let waited = shmem.wait_until(&flag, 0, Cmp::Ge, 1);
        if waited.is_err() {
            // The others have not reached the flag's free: dropping it would wait for them.
            std::mem::forget(flag);
        }
        return waited;
    }
    std::thread::sleep(4 * TIMEOUT);
    Ok(())
}

/// Every PE builds a row-parallel layer with a sequence-parallel output; every PE but PE 1
/// calls its fused GEMM + reduce-scatter (the exchange in rounds, whose flags stream memory
/// operations wait for). The watchdog's bound (`NVSHMEM_RS_TIMEOUT`) must release their
/// streams, and the layer's next call must return `ExchangeTimeout`, naming PE 1 alone.
fn tp_forward_skipped(shmem: &Nvshmem) -> nvshmem::Result<()> {
    use nvshmem::tp::{RowOutput, RowParallelLinear, Schedule, TensorParallel};
    use nvshmem::{bf16, Error};
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let tp = TensorParallel::new(shmem)?;
    let (k, width, tokens) = (64 * n, 64, nvshmem::tp::FUSED_EXCHANGE_TOKENS * n);
    let layer = RowParallelLinear::with_output(&tp, k, width, RowOutput::SequenceParallel, tokens)?;
    layer.load_weight(&vec![bf16::ONE; width * k])?;
    if layer.resolved_schedule(Schedule::Fused, tokens) != Schedule::Fused {
        return Err(Error::InvalidArgument(format!(
            "a fused call of {tokens} tokens on {n} PEs does not take the fused exchange here"
        )));
    }
    let x = shmem.alloc_device::<bf16>(tokens * layer.local_in_features().len())?;
    let y = shmem.malloc::<bf16>(tokens / n * width)?;
    let stream = shmem.stream();
    if me == 1 {
        trace(me, "skipping the forward");
        std::thread::sleep(4 * TIMEOUT);
        // Not dropped: the frees would wait for the others.
        std::mem::forget((layer, x, y, tp));
        return Ok(());
    }
    trace(me, "the forward, without PE 1");
    layer.forward_with(&y, &x, Schedule::Fused, stream)?;
    // Returns once the watchdog has released the waits.
    stream.synchronize()?;
    trace(me, "the stream is free; the next forward");
    layer.forward_with(&y, &x, Schedule::Fused, stream)?;
    Err(Error::InvalidArgument(
        "the forward after one that waited alone past the bound returned Ok".into(),
    ))
}

/// Every PE syncs a team of all PEs (a split of the world) twice, but PE 1 skips the second
/// sync: the others' bound (`NVSHMEM_RS_TIMEOUT`) ends it, naming PE 1.
fn team_sync_skip(shmem: &Nvshmem) -> nvshmem::Result<()> {
    let all = shmem.team_world().split_strided(0, 1, shmem.n_pes())?;
    let team = all.ok_or_else(|| nvshmem::Error::InvalidArgument("a PE outside".into()))?;
    shmem.sync(&team)?;
    if shmem.my_pe() == 1 {
        trace(1, "skipping the second sync");
        std::thread::sleep(4 * TIMEOUT);
        // Not dropped: the team's drop would wait for the others.
        std::mem::forget(team);
        return Ok(());
    }
    shmem.sync(&team)
}

/// Every PE frees a buffer while, on PE 0, another thread captures a stream in the default
/// (global) mode, under which CUDA refuses PE 0's wait for its GPU: every PE must refuse the
/// free, none may enter NVSHMEM's.
fn free_while_capturing(shmem: &Nvshmem) -> nvshmem::Result<()> {
    use nvshmem::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let buf = shmem.malloc::<f32>(1024)?;
    let side = shmem.new_stream()?;
    let (began_tx, began_rx) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        if shmem.my_pe() == 0 {
            let side = &side;
            scope.spawn(move || {
                let began = side.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
                let capturing = began.is_ok();
                let _ = began_tx.send(began);
                let _ = end_rx.recv();
                if capturing {
                    let _ = side.end_capture(CUgraphInstantiate_flags(0));
                }
            });
            let began = began_rx.recv().expect("the capturing thread answers");
            began.map_err(|source| nvshmem::Error::Cuda {
                call: "cuStreamBeginCapture",
                source,
            })?;
        }
        trace(shmem.my_pe(), "freeing");
        let freed = buf.free();
        let _ = end_tx.send(());
        freed
    })
}

/// PE 0 skips the one send of a channel to PE 1 and goes on to an all-reduce; PE 1 receives.
/// PE 1's receive gives up within the channel's bound and names PE 0; the others' all-reduce
/// then gives up on PE 1.
fn channel_no_sender(
    shmem: &Nvshmem,
    coll: &Collectives,
    x: &nvshmem::SymmetricBuffer<f32>,
    y: &nvshmem::SymmetricBuffer<f32>,
) -> nvshmem::Result<()> {
    let me = shmem.my_pe();
    let config = nvshmem::ChannelConfig::new(0, 1, 1024).timeout(TIMEOUT);
    let ch = nvshmem::Channel::<f32>::new(shmem, config)?;
    let stream = shmem.stream();
    if me == 1 {
        let mut dst = shmem.alloc_device::<f32>(1024)?;
        trace(me, "recv");
        ch.recv(&mut dst, stream)?;
        // Waits for the receive: its error, once it gives up.
        let len = ch.last_len(stream)?;
        trace(me, &format!("received {len} elements"));
    } else if me == 0 {
        trace(me, "skips its send");
    }
    coll.all_reduce(y, x, ReduceOp::Sum, AllReduceAlgo::LowLatency, stream)?;
    stream.synchronize()?;
    coll.check()
}
