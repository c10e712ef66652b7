//! Where the sequential MLP's time goes (`--test breakdown`, timing only).

use nvshmem::tp::{LinearShape, MlpShape, Schedule, TpMlp};
use nvshmem::{bf16, AllReduceAlgo, Error, ReduceOp, SymmetricBuffer};

use crate::args::Args;
use crate::harness::{text, time_calls, Checks, Outcome};
use crate::mlp::mlp_data;
use crate::reference::{bits, Rng};

/// Where the sequential MLP's time over its GEMMs goes: the GEMMs alone; the GEMMs then an
/// all-reduce of 8 bytes, which ends when the slowest PE's GEMMs have (so its excess over the
/// GEMMs is the PEs' spread plus one small all-reduce); the all-reduce of the output alone;
/// and the sequential MLP. Where the MLP costs more than the second and third together, the
/// all-reduce runs slower after the GEMMs than alone. Every timed output checked.
pub fn breakdown(c: &Checks, a: &Args) -> Outcome {
    let (hidden, ffn) = (a.hidden, a.ffn);
    let max_m = *a.ms.iter().max().expect("a non-empty --m");
    let d = mlp_data(0x7137, 0, hidden, ffn);
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
    let (gemm, s, coll) = (c.tp.gemm(), &c.stream, c.tp.collectives());
    if c.shmem.my_pe() == 0 {
        println!(
            "\nMLP {} (hidden {hidden}, ffn {ffn}), TP {}, sequential schedule, where the time \
             goes; CUDA graphs, {} replays in 5 alternating blocks, PE 0; us: median [p10, p90]",
            a.shape_name,
            c.n(),
            a.iters
        );
        println!(
            "{:>6} {:>26} {:>26} {:>26} {:>26}",
            "M", "GEMMs alone", "GEMMs + 8 B all-reduce", "all-reduce alone", "sequential MLP"
        );
    }
    let mut rng = Rng::new(0x7138);
    let sync_in = c.shmem.calloc::<bf16>(4).map_err(text)?;
    let sync_out = c.shmem.malloc::<bf16>(4).map_err(text)?;
    for &m in &a.ms {
        let x = c.device(&rng.bf16s(m * hidden, 1.0))?;
        let gu = c.shmem.alloc_device::<bf16>(m * 2 * f).map_err(text)?;
        let act = c.shmem.alloc_device::<bf16>(m * f).map_err(text)?;
        let partials: Vec<_> = (0..2)
            .map(|_| c.shmem.malloc::<bf16>(m * hidden))
            .collect::<Result<_, _>>()
            .map_err(text)?;
        let ys: Vec<_> = (0..2)
            .map(|_| c.shmem.malloc::<bf16>(m * hidden))
            .collect::<Result<_, _>>()
            .map_err(text)?;
        let compute = |partial: &SymmetricBuffer<bf16>| -> Result<(), Error> {
            let shape = LinearShape {
                m,
                n: 2 * f,
                k: hidden,
            };
            gemm.linear(&gu, &x, mlp.gate_up().weight(), shape, s)?;
            c.tp.silu_mul(&act, &gu, m, s)?;
            let shape = LinearShape { m, n: hidden, k: f };
            gemm.linear(partial, &act, mlp.down().weight(), shape, s)
        };
        // The all-reduce alone sums the partial products the first call leaves.
        compute(&partials[1]).map_err(text)?;
        let alone = || compute(&partials[0]);
        let then_sync = || {
            compute(&partials[1])?;
            coll.all_reduce(&sync_out, &sync_in, ReduceOp::Sum, AllReduceAlgo::Auto, s)
        };
        let reduce =
            || coll.all_reduce(&ys[0], &partials[1], ReduceOp::Sum, AllReduceAlgo::Auto, s);
        let forward = || mlp.forward_with(&ys[1], &x, Schedule::Sequential, s);
        let read = |i: usize| {
            match i {
                0 => partials[0].to_vec(),
                1 => partials[1].to_vec(),
                i => ys[i - 2].to_vec(),
            }
            .map_err(text)
        };
        let cells = time_calls(c, a.iters, &[&alone, &then_sync, &reduce, &forward], &read)?;
        if bits(&ys[0].to_vec().map_err(text)?) != bits(&ys[1].to_vec().map_err(text)?) {
            return Err(format!(
                "M={m}: the all-reduce of the GEMMs' output differs from the MLP's"
            ));
        }
        if c.shmem.my_pe() == 0 {
            println!(
                "{m:>6} {:>26} {:>26} {:>26} {:>26}",
                cells[0], cells[1], cells[2], cells[3]
            );
        }
    }
    Ok(())
}
