//! Runs the ring all-gather on every PE with random contributions and checks the result
//! against the CPU reference. One line per PE and check, then `N passed, M failed` on PE 0.
//!
//! ```text
//! cargo build --release -p ring-pipeline
//! scripts/nvshmrun -np 4 target/release/ring-pipeline          # or: mpiexec -np 4 ...
//! target/release/ring-pipeline --help
//! ```
//!
//! Exits with 1 when a check fails, 2 on any other error.

use nvshmem::{Error, Nvshmem, ReduceOp};
use ring_pipeline::{cpu, random_input, RingAllGather};
use std::process::ExitCode;

const USAGE: &str = "usage: ring-pipeline [--elems N] [--chunk N] [--trials N] [--seed N]
  --elems N    u32 elements each PE contributes (default 1000003)
  --chunk N    elements per chunk (default 16384)
  --trials N   runs per size, each with new data (default 3)
  --seed N     seed of the random data (default 1)
Besides the given size, small and odd sizes are checked too. Run one process per GPU under
mpiexec (or scripts/nvshmrun).";

struct Args {
    elems: usize,
    chunk: usize,
    trials: u64,
    seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        elems: 1_000_003,
        chunk: 16_384,
        trials: 3,
        seed: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: `{v}` is not a number"))
        };
        match flag.as_str() {
            "--elems" => args.elems = number(&value)? as usize,
            "--chunk" => args.chunk = number(&value)? as usize,
            "--trials" => args.trials = number(&value)?,
            "--seed" => args.seed = number(&value)?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("ring-pipeline: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if msg.is_empty() { 0 } else { 2 });
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ring-pipeline: {e}");
            ExitCode::from(2)
        }
    }
}

/// Run every size and trial; true when every check on every PE passed.
fn run(args: &Args) -> nvshmem::Result<bool> {
    let shmem = Nvshmem::init()?;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    if me == 0 {
        println!("ring-pipeline: {}", shmem.info()?);
    }
    // The size asked for, then edge cases: one element, chunks that do not divide the slot,
    // one chunk per slot.
    let sizes = [(args.elems, args.chunk), (1, 1), (1000, 7), (4096, 1 << 20)];
    let (mut passed, mut failed) = (0u64, 0u64);
    for (elems, chunk) in sizes {
        let mut ag = RingAllGather::<u32>::new(&shmem, elems, chunk)?;
        let layout = ag.layout();
        for trial in 0..args.trials {
            let inputs: Vec<Vec<u32>> = (0..n)
                .map(|pe| random_input(args.seed, trial, pe, elems))
                .collect();
            ag.input().copy_from_host(&inputs[me])?;
            ag.run()?;
            let got = ag.output().to_vec()?;
            let want = cpu::reference(&inputs);
            let wrong: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
            let what = format!(
                "PE {me}/{n}: {elems} x {n} u32 in {} chunks of {} with {} blocks, trial {trial}",
                layout.chunks_per_slot(),
                layout.chunk_elems(),
                ag.blocks()
            );
            match wrong.first() {
                None => {
                    passed += 1;
                    println!("{what}: ok");
                }
                Some(&i) => {
                    failed += 1;
                    println!(
                        "{what}: FAILED, {} elements wrong; first at {i} (slot of PE {}): got {:#010x}, want {:#010x}",
                        wrong.len(),
                        i / elems,
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }

    // Totals over all PEs, with NVSHMEM's own reduction (not our kernel).
    let counts = shmem.calloc::<u64>(2)?;
    let totals = shmem.calloc::<u64>(2)?;
    counts.copy_from_host(&[passed, failed])?;
    shmem
        .team_world()
        .all_reduce(&totals, &counts, ReduceOp::Sum, shmem.stream())?;
    shmem.stream().synchronize().map_err(|source| Error::Cuda {
        call: "cuStreamSynchronize",
        source,
    })?;
    let totals = totals.to_vec()?;
    if me == 0 {
        println!("{} passed, {} failed", totals[0], totals[1]);
    }
    Ok(failed == 0 && totals[1] == 0)
}
