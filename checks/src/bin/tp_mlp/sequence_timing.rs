//! The timing table of the sequence-parallel layers and MLP in each schedule.

use nvshmem::tp::{
    ColumnInput, ColumnParallelLinear, LinearShape, MlpShape, RowOutput, RowParallelLinear,
    Schedule, SequenceParallelMlp,
};
use nvshmem::{bf16, DeviceBuffer, Error};

use crate::args::Args;
use crate::harness::{text, time_calls, Checks, Outcome};
use crate::reference::Rng;

/// Device buffers of `len` elements, `count` of them.
fn outputs(c: &Checks, count: usize, len: usize) -> Result<Vec<DeviceBuffer<bf16>>, String> {
    (0..count)
        .map(|_| c.shmem.alloc_device::<bf16>(len).map_err(text))
        .collect()
}

/// The sequence-parallel layers in each schedule against their local GEMM alone: the
/// gate/up projection (all-gather + GEMM; the GEMM alone as `Auto` picks it) and the down
/// projection (GEMM + reduce-scatter). Every timed output checked.
pub fn sequence_parallel_timing(c: &Checks, a: &Args) -> Outcome {
    let (hidden, ffn, n) = (a.hidden, a.ffn, c.n());
    let ms: Vec<usize> = a.ms.iter().copied().filter(|m| m % n == 0).collect();
    let Some(&max_m) = ms.iter().max() else {
        return Ok(());
    };
    let mut rng = Rng::new(0x7137);
    let column = ColumnParallelLinear::merged(
        &c.tp,
        hidden,
        &[ffn, ffn],
        ColumnInput::SequenceParallel,
        max_m,
    )
    .map_err(text)?;
    let row =
        RowParallelLinear::with_output(&c.tp, ffn, hidden, RowOutput::SequenceParallel, max_m)
            .map_err(text)?;
    for w in [column.weight(), row.weight()] {
        w.copy_from_host(&rng.bf16s(w.len(), 0.02)).map_err(text)?;
    }
    let (out, f) = (column.local_out_features(), row.local_in_features().len());
    let s = &c.stream;
    let header = |what: String, columns: &[&str]| {
        if c.shmem.my_pe() == 0 {
            println!(
                "\n{what}, TP {n}, bf16, CUDA graphs, {} replays in 5 alternating blocks, PE 0; \
                 us: median [p10, p90]",
                a.iters
            );
            print!("{:>6}", "M");
            columns.iter().for_each(|h| print!(" {h:>26}"));
            println!();
        }
    };
    let line = |m: usize, cells: &[String]| {
        if c.shmem.my_pe() == 0 {
            print!("{m:>6}");
            cells.iter().for_each(|t| print!(" {t:>26}"));
            println!();
        }
    };
    let schedules = [Schedule::Sequential, Schedule::Overlapped, Schedule::Fused];
    header(
        format!(
            "Sequence-parallel gate/up {} (hidden {hidden} -> {out} features per PE)",
            a.shape_name
        ),
        &["GEMM alone (Auto)", "sequential", "overlapped", "fused"],
    );
    for &m in &ms {
        let x = c.symmetric(&rng.bf16s(m / n * hidden, 1.0))?;
        let all = c.device(&rng.bf16s(m * hidden, 1.0))?;
        let shape = LinearShape {
            m,
            n: out,
            k: hidden,
        };
        let ys = outputs(c, 4, m * out)?;
        let (ys, all, x, column) = (&ys, &all, &x, &column);
        let g0 = || c.tp.gemm().linear(&ys[0], all, column.weight(), shape, s);
        let layer = |i: usize| move || column.forward_with(&ys[i], x, schedules[i - 1], s);
        let (l1, l2, l3) = (layer(1), layer(2), layer(3));
        let calls: Vec<&dyn Fn() -> Result<(), Error>> = vec![&g0, &l1, &l2, &l3];
        let read = |i: usize| ys[i].to_vec().map_err(text);
        line(m, &time_calls(c, a.iters, &calls, &read)?);
    }
    header(
        format!(
            "Sequence-parallel down {} ({f} features per PE -> hidden {hidden})",
            a.shape_name
        ),
        &["GEMM alone (Auto)", "sequential", "fused"],
    );
    for &m in &ms {
        let x = c.device(&rng.bf16s(m * f, 1.0))?;
        let partial = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
        let ys: Vec<_> = (0..2)
            .map(|_| c.shmem.malloc::<bf16>(m / n * hidden).map_err(text))
            .collect::<Result<_, _>>()?;
        let shape = LinearShape { m, n: hidden, k: f };
        let g = || c.tp.gemm().linear(&partial, &x, row.weight(), shape, s);
        let seq = || row.forward_with(&ys[0], &x, Schedule::Sequential, s);
        let fused = || row.forward_with(&ys[1], &x, Schedule::Fused, s);
        let read = |i: usize| match i {
            0 => partial.to_vec().map_err(text),
            i => ys[i - 1].to_vec().map_err(text),
        };
        line(m, &time_calls(c, a.iters, &[&g, &seq, &fused], &read)?);
    }
    let mlp = SequenceParallelMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: max_m,
        },
    )
    .map_err(text)?;
    for (w, from) in [
        (mlp.gate_up().weight(), column.weight()),
        (mlp.down().weight(), row.weight()),
    ] {
        w.copy_from_host(&from.to_vec().map_err(text)?)
            .map_err(text)?;
    }
    header(
        format!(
            "Sequence-parallel MLP {} (hidden {hidden}, ffn {ffn})",
            a.shape_name
        ),
        &["compute-only", "sequential", "overlapped", "fused"],
    );
    for &m in &ms {
        let x = c.symmetric(&rng.bf16s(m / n * hidden, 1.0))?;
        let all = c.device(&rng.bf16s(m * hidden, 1.0))?;
        let gu = c.shmem.alloc_device::<bf16>(m * out).map_err(text)?;
        let act = c.shmem.alloc_device::<bf16>(m * f).map_err(text)?;
        let partial = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
        let ys: Vec<_> = (0..3)
            .map(|_| c.shmem.malloc::<bf16>(m / n * hidden).map_err(text))
            .collect::<Result<_, _>>()?;
        // The local work of one call over every token: what no schedule can go below.
        let compute = || -> Result<(), Error> {
            let gemm = c.tp.gemm();
            gemm.linear(
                &gu,
                &all,
                mlp.gate_up().weight(),
                LinearShape {
                    m,
                    n: out,
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
        let (ys, x, mlp) = (&ys, &x, &mlp);
        let call = |i: usize| move || mlp.forward_with(&ys[i], x, schedules[i], s);
        let (l0, l1, l2) = (call(0), call(1), call(2));
        let read = |i: usize| match i {
            0 => partial.to_vec().map_err(text),
            i => ys[i - 1].to_vec().map_err(text),
        };
        line(
            m,
            &time_calls(c, a.iters, &[&compute, &l0, &l1, &l2], &read)?,
        );
    }
    Ok(())
}
