//! The MLP's checks (replicated and sequence-parallel, graph replay, calls back to back, bad
//! arguments) and its timing table.

use nvshmem::tp::{
    take_rows, LinearShape, MlpShape, RowParallelLinear, Schedule, SequenceParallelMlp,
    TensorParallel, TpMlp, FUSED_EXCHANGE_TOKENS,
};
use nvshmem::{bf16, Error};

use crate::args::Args;
use crate::harness::{capture, median, sync, text, time_graph, Checks, Outcome, SCHEDULES};
use crate::reference::{bits, compare_with, mlp_reference, weight, Rng};

pub struct MlpData {
    pub x: Vec<bf16>,
    pub gate: Vec<bf16>,
    pub up: Vec<bf16>,
    pub down: Vec<bf16>,
}

pub fn mlp_data(seed: u64, m: usize, hidden: usize, ffn: usize) -> MlpData {
    let mut rng = Rng::new(seed);
    MlpData {
        x: rng.bf16s(m * hidden, 1.0),
        gate: weight(&mut rng, ffn, hidden),
        up: weight(&mut rng, ffn, hidden),
        down: weight(&mut rng, hidden, ffn),
    }
}

fn mlp_small(
    c: &Checks,
    seed: u64,
    (m, hidden, ffn): (usize, usize, usize),
    schedule: Schedule,
) -> Outcome {
    let d = mlp_data(seed, m, hidden, ffn);
    let mlp = TpMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: m,
        },
    )
    .map_err(text)?;
    mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
    let x = c.device(&d.x)?;
    let y = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
    mlp.forward_with(&y, &x, schedule, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let got = y.to_vec().map_err(text)?;
    let (want, term) = mlp_reference(&d.x, (&d.gate, &d.up, &d.down), m, hidden, ffn, c.n());
    // Every PE reaches the collective check, whatever its own comparison found.
    let compared = compare_with("MLP output", &got, &want, &term, 1.0 / 128.0);
    compared.and(c.identical("MLP output", &got))
}

/// The sequence-parallel MLP, `per_pe` tokens per PE: this PE's rows of the reference.
fn mlp_sequence_parallel(
    c: &Checks,
    seed: u64,
    (per_pe, hidden, ffn): (usize, usize, usize),
    schedule: Schedule,
) -> Outcome {
    let m = per_pe * c.n();
    let d = mlp_data(seed, m, hidden, ffn);
    let mlp = SequenceParallelMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: m,
        },
    )
    .map_err(text)?;
    mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
    let rows = c.me() * per_pe..(c.me() + 1) * per_pe;
    let x = c.symmetric(&take_rows(&d.x, hidden, rows.clone()))?;
    let y = c.shmem.malloc::<bf16>(per_pe * hidden).map_err(text)?;
    mlp.forward_with(&y, &x, schedule, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let (want, term) = mlp_reference(&d.x, (&d.gate, &d.up, &d.down), m, hidden, ffn, c.n());
    let mine = rows.start * hidden..rows.end * hidden;
    compare_with(
        "sequence-parallel MLP output",
        &y.to_vec().map_err(text)?,
        &want[mine.clone()],
        &term[mine],
        1.0 / 128.0,
    )
}

/// `Schedule::Auto` in the sequence-parallel MLP, `per_pe` tokens per PE, with the group's
/// fused and overlapped thresholds at `per_pe` tokens' elements (fused), the fused one a
/// token above (overlapped), and both a token above (sequential): bit for bit the output of
/// the schedule it stands for, each checked against the reference.
fn sequence_parallel_auto(
    c: &Checks,
    seed: u64,
    (per_pe, hidden, ffn): (usize, usize, usize),
) -> Outcome {
    let m = per_pe * c.n();
    let d = mlp_data(seed, m, hidden, ffn);
    let rows = c.me() * per_pe..(c.me() + 1) * per_pe;
    let x = c.symmetric(&take_rows(&d.x, hidden, rows.clone()))?;
    let y = c.shmem.malloc::<bf16>(per_pe * hidden).map_err(text)?;
    let run = |tp: &TensorParallel, schedule: Schedule| -> Result<Vec<bf16>, String> {
        let mlp = SequenceParallelMlp::new(
            tp,
            MlpShape {
                hidden,
                ffn,
                max_tokens: m,
            },
        )
        .map_err(text)?;
        mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
        mlp.forward_with(&y, &x, schedule, &c.stream)
            .map_err(text)?;
        sync(&c.stream).map_err(text)?;
        y.to_vec().map_err(text)
    };
    // The group's thresholds with fused and overlapped from these tokens per PE.
    let at = |fused: usize, overlapped: usize| {
        let mut t = *c.tp.thresholds();
        t.fused_sequence_min_elements = fused * hidden;
        t.overlapped_sequence_min_elements = overlapped * hidden;
        c.tp.clone().with_thresholds(t)
    };
    let overlap = Schedule::Overlapped;
    let fused = run(&c.tp, Schedule::Fused)?;
    let sequential = run(&c.tp, Schedule::Sequential)?;
    let overlapped = run(&c.tp, overlap)?;
    let auto_fused = run(&at(per_pe, per_pe), Schedule::Auto)?;
    let auto_overlapped = run(&at(per_pe + 1, per_pe), Schedule::Auto)?;
    let auto_sequential = run(&at(per_pe + 1, per_pe + 1), Schedule::Auto)?;
    let (want, term) = mlp_reference(&d.x, (&d.gate, &d.up, &d.down), m, hidden, ffn, c.n());
    let mine = rows.start * hidden..rows.end * hidden;
    compare_with(
        "the fused sequence-parallel MLP",
        &fused,
        &want[mine.clone()],
        &term[mine.clone()],
        1.0 / 128.0,
    )?;
    if bits(&auto_fused) != bits(&fused) {
        return Err("Auto at its threshold differs from Fused".into());
    }
    compare_with(
        "the overlapped sequence-parallel MLP",
        &overlapped,
        &want[mine.clone()],
        &term[mine],
        1.0 / 128.0,
    )?;
    if bits(&auto_overlapped) != bits(&overlapped) {
        return Err("Auto between its thresholds differs from Overlapped".into());
    }
    if bits(&auto_sequential) != bits(&sequential) {
        return Err("Auto below its thresholds differs from Sequential".into());
    }
    if c.verbose && bits(&fused) == bits(&sequential) {
        println!("  (the fused and sequential outputs are the same bits here)");
    }
    Ok(())
}

/// A captured forward replayed on new inputs gives what an eager call gives, bit for bit;
/// calls back to back (no host wait between), on one stream or alternating between two, each
/// give their own result.
fn mlp_graph_and_back_to_back(
    c: &Checks,
    seed: u64,
    (m, hidden, ffn): (usize, usize, usize),
) -> Outcome {
    let d = mlp_data(seed, m, hidden, ffn);
    let mlp = TpMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: m,
        },
    )
    .map_err(text)?;
    mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
    let mut rng = Rng::new(seed ^ 2);
    let inputs: Vec<Vec<bf16>> = (0..3).map(|_| rng.bf16s(m * hidden, 1.0)).collect();
    // Eager, one at a time.
    let mut eager = Vec::new();
    for x in &inputs {
        let (x, y) = (
            c.device(x)?,
            c.shmem.malloc::<bf16>(m * hidden).map_err(text)?,
        );
        mlp.forward(&y, &x, &c.stream).map_err(text)?;
        sync(&c.stream).map_err(text)?;
        eager.push(bits(&y.to_vec().map_err(text)?));
    }
    // Back to back on one stream.
    let xs: Vec<_> = inputs
        .iter()
        .map(|x| c.device(x))
        .collect::<Result<_, _>>()?;
    let ys: Vec<_> = (0..3)
        .map(|_| c.shmem.malloc::<bf16>(m * hidden).map_err(text))
        .collect::<Result<_, _>>()?;
    for (x, y) in xs.iter().zip(&ys) {
        mlp.forward(y, x, &c.stream).map_err(text)?;
    }
    sync(&c.stream).map_err(text)?;
    for (i, y) in ys.iter().enumerate() {
        if bits(&y.to_vec().map_err(text)?) != eager[i] {
            return Err(format!(
                "back-to-back call {i} differs from the same call made alone"
            ));
        }
    }
    // Back to back, alternating between two streams: the calls share the MLP's scratch and
    // the group's GEMM workspace, so each must wait for the last on the device.
    let other = c.shmem.new_stream().map_err(text)?;
    let ys2: Vec<_> = (0..3)
        .map(|_| c.shmem.malloc::<bf16>(m * hidden).map_err(text))
        .collect::<Result<_, _>>()?;
    for round in 0..2 {
        for (i, (x, y)) in xs.iter().zip(&ys2).enumerate() {
            let stream = if (i + round) % 2 == 0 {
                &c.stream
            } else {
                &other
            };
            mlp.forward(y, x, stream).map_err(text)?;
        }
    }
    sync(&c.stream).map_err(text)?;
    sync(&other).map_err(text)?;
    for (i, y) in ys2.iter().enumerate() {
        if bits(&y.to_vec().map_err(text)?) != eager[i] {
            return Err(format!(
                "call {i} on alternating streams differs from the same call made alone"
            ));
        }
    }
    // A graph of one forward, replayed with each input copied into its input buffer.
    let (x, y) = (&xs[0], &ys[0]);
    let graph = capture(&c.stream, || mlp.forward(y, x, &c.stream))?;
    for (i, input) in inputs.iter().enumerate().rev() {
        x.copy_from_host(input).map_err(text)?;
        graph.launch().map_err(|e| format!("cuGraphLaunch: {e}"))?;
        sync(&c.stream).map_err(text)?;
        if bits(&y.to_vec().map_err(text)?) != eager[i] {
            return Err(format!(
                "graph replay on input {i} differs from the eager call"
            ));
        }
    }
    Ok(())
}

/// Bad arguments are errors that say what is wrong, on every PE alike.
fn errors(c: &Checks, _seed: u64) -> Outcome {
    let expect = |what: &str, r: Result<(), Error>, want: fn(&Error) -> bool| -> Outcome {
        match r {
            Err(e) if want(&e) => Ok(()),
            Err(e) => Err(format!("{what}: the wrong error: {e}")),
            Ok(()) => Err(format!("{what}: accepted")),
        }
    };
    let (hidden, ffn, m) = (64, 32 * c.n(), 4);
    let mlp = TpMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: m,
        },
    )
    .map_err(text)?;
    let x = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
    let big = c
        .shmem
        .alloc_device::<bf16>((m + 1) * hidden)
        .map_err(text)?;
    let y = c.shmem.malloc::<bf16>((m + 1) * hidden).map_err(text)?;
    let length = |e: &Error| matches!(e, Error::Length { .. });
    let argument = |e: &Error| matches!(e, Error::InvalidArgument(_));
    expect(
        "a gate weight of the wrong size",
        mlp.load_weights(&[bf16::ZERO; 3], &[], &[]),
        length,
    )?;
    expect(
        "an output of the wrong length",
        mlp.forward(&y, &x, &c.stream),
        length,
    )?;
    expect(
        "more tokens than max_tokens",
        mlp.forward(&y, &big, &c.stream),
        argument,
    )?;
    let ragged = c.shmem.alloc_device::<bf16>(hidden + 1).map_err(text)?;
    expect(
        "an input that is not whole rows",
        mlp.forward(y.view(..hidden), &ragged, &c.stream),
        argument,
    )?;
    let too_narrow = RowParallelLinear::new(&c.tp, c.n() - 1, 8, 1).map(|_| ());
    expect("fewer input features than PEs", too_narrow, argument)?;
    Ok(())
}

/// The MLP in a CUDA graph against its local GEMMs and kernel alone (no all-reduce), for
/// each token count, on fresh data; every timed output is checked bit for bit against an
/// eager call on the same data.
pub fn timing(c: &Checks, a: &Args) -> Outcome {
    let (hidden, ffn) = (a.hidden, a.ffn);
    let max_m = *a.ms.iter().max().expect("a non-empty --m");
    let d = mlp_data(0x7135, 0, hidden, ffn);
    let mlp = TpMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: max_m,
        },
    )
    .map_err(text)?;
    mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
    let f = mlp.down().local_in_features().len();
    let (gemm, s) = (c.tp.gemm(), &c.stream);
    if c.shmem.my_pe() == 0 {
        println!(
            "\nMLP {} (hidden {hidden}, ffn {ffn}), TP {}, bf16, CUDA graphs, {} replays in 5 alternating blocks, PE 0; \
             us: median [p10, p90]",
            a.shape_name,
            c.n(),
            a.iters
        );
        println!(
            "{:>6} {:>26} {:>26} {:>9} {:>26} {:>9} {:>13}",
            "M", "compute-only", "sequential", "overhead", "fused", "overhead", "TFLOP/s/GPU"
        );
    }
    let mut rng = Rng::new(0x7136);
    for &m in &a.ms {
        let x = c.device(&rng.bf16s(m * hidden, 1.0))?;
        let y = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
        let gu = c.shmem.alloc_device::<bf16>(m * 2 * f).map_err(text)?;
        let act = c.shmem.alloc_device::<bf16>(m * f).map_err(text)?;
        let partial = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
        // The local work of one forward call: what no schedule can go below.
        let compute = || -> Result<(), Error> {
            gemm.linear(
                &gu,
                &x,
                mlp.gate_up().weight(),
                LinearShape {
                    m,
                    n: 2 * f,
                    k: hidden,
                },
                s,
            )?;
            c.tp.silu_mul(&act, &gu, m, s)?;
            gemm.linear(
                &partial,
                &act,
                mlp.down().weight(),
                LinearShape { m, n: hidden, k: f },
                s,
            )
        };
        mlp.forward_with(&y, &x, Schedule::Sequential, s)
            .map_err(text)?;
        compute().map_err(text)?;
        sync(s).map_err(text)?;
        let (eager, eager_partial) = (
            bits(&y.to_vec().map_err(text)?),
            bits(&partial.to_vec().map_err(text)?),
        );
        // The fused schedule, into its own output, where it has a form of its own (the
        // decode kernel; the GEMM + all-reduce in rounds): elsewhere it is the sequential
        // schedule again.
        let mut others = Vec::new();
        if mlp.down().resolved_schedule(Schedule::Fused, m) == Schedule::Fused {
            others.push(Schedule::Fused);
        }
        let mut outs = Vec::new();
        for &schedule in &others {
            let y2 = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
            mlp.forward_with(&y2, &x, schedule, s).map_err(text)?;
            sync(s).map_err(text)?;
            let eager = bits(&y2.to_vec().map_err(text)?);
            outs.push((y2, eager));
        }
        let mut graphs = vec![
            capture(s, compute)?,
            capture(s, || mlp.forward_with(&y, &x, Schedule::Sequential, s))?,
        ];
        for (&schedule, (y2, _)) in others.iter().zip(&outs) {
            graphs.push(capture(s, || mlp.forward_with(y2, &x, schedule, s))?);
        }
        // In alternating blocks, so that clock and power drift fall on all alike.
        let mut times = vec![Vec::new(); graphs.len()];
        let rounds = 5;
        for _ in 0..rounds {
            for (g, t) in graphs.iter().zip(&mut times) {
                t.extend(time_graph(c, g, a.iters.div_ceil(rounds))?);
            }
        }
        let mut same = bits(&y.to_vec().map_err(text)?) == eager
            && bits(&partial.to_vec().map_err(text)?) == eager_partial;
        for (y2, eager) in &outs {
            same &= bits(&y2.to_vec().map_err(text)?) == *eager;
        }
        if !same {
            return Err(format!(
                "M={m}: the timed graphs' output differs from the eager call"
            ));
        }
        let t: Vec<_> = times.into_iter().map(median).collect();
        let tc = t[0];
        let best = t[1..].iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
        let flops = 6.0 * m as f64 * hidden as f64 * ffn as f64 / c.n() as f64;
        let cell = |(med, p10, p90): (f64, f64, f64)| format!("{med:.1} [{p10:.1}, {p90:.1}]");
        let with_overhead = |x: Option<&(f64, f64, f64)>| match x {
            Some(&x) => format!("{:>26} {:>8.1}%", cell(x), (x.0 - tc.0) / tc.0 * 100.0),
            None => format!("{:>26} {:>9}", "-", "-"),
        };
        if c.shmem.my_pe() == 0 {
            println!(
                "{m:>6} {:>26} {} {} {:>13.1}",
                cell(tc),
                with_overhead(t.get(1)),
                with_overhead(t.get(2)),
                flops / best * 1e-6
            );
        }
    }
    Ok(())
}

/// The MLP's checks: small shapes in every schedule, replicated and sequence-parallel,
/// `Auto`'s choice, graph replay and calls back to back, and the errors.
pub fn run(c: &mut Checks) {
    let n = c.n();
    for s in [
        (1, 64, 8 * n),
        (3, 96, 200),
        (127, 136, 328),
        (16, 200, 16 * n + 5),
    ] {
        for schedule in SCHEDULES {
            c.run(
                format!("mlp m={} hidden={} ffn={} {schedule:?}", s.0, s.1, s.2),
                |c, seed| mlp_small(c, seed, s, schedule),
            );
        }
    }
    for s in [(1, 64, 8 * n), (3, 96, 200), (16, 200, 16 * n + 5)] {
        for schedule in SCHEDULES {
            c.run(
                format!(
                    "sequence-parallel mlp {} rows per PE hidden={} ffn={} {schedule:?}",
                    s.0, s.1, s.2
                ),
                |c, seed| mlp_sequence_parallel(c, seed, s, schedule),
            );
        }
    }
    // From FUSED_EXCHANGE_TOKENS per PE both exchanges fuse.
    let s = (
        2048usize.div_ceil(n).max(FUSED_EXCHANGE_TOKENS) + 2,
        136,
        64 * n,
    );
    c.run(
        format!(
            "sequence-parallel mlp {} rows per PE hidden={} ffn={}: Auto at and below its threshold",
            s.0, s.1, s.2
        ),
        |c, seed| sequence_parallel_auto(c, seed, s),
    );
    c.run(
        "mlp graph replay and back-to-back calls".into(),
        |c, seed| mlp_graph_and_back_to_back(c, seed, (64, 256, 512 * n)),
    );
    c.run("errors name the bad argument".into(), errors);
}
