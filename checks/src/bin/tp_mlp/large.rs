//! The large shape (`--shape`, each `--m`): the layers against the unsharded GEMMs on this
//! GPU.

use nvshmem::bf16;
use nvshmem::tp::{
    shard_range, take_cols, take_rows, ColumnInput, ColumnParallelLinear, LinearShape, MlpShape,
    RowParallelLinear, Schedule, SequenceParallelMlp, TpMlp,
};

use crate::harness::{sync, text, Checks, Outcome};
use crate::mlp::{mlp_data, MlpData};
use crate::reference::{compare, compare_unsharded, sampled, Rng};

/// The unsharded MLP on this GPU: full gate/up GEMM, SiLU·up, full down GEMM.
fn mlp_unsharded(
    c: &Checks,
    d: &MlpData,
    m: usize,
    hidden: usize,
    ffn: usize,
) -> Result<Vec<bf16>, String> {
    let gemm = c.tp.gemm();
    let mut gate_up = d.gate.clone();
    gate_up.extend_from_slice(&d.up);
    let (w1, w2) = (c.device(&gate_up)?, c.device(&d.down)?);
    let x = c.device(&d.x)?;
    let gu = c.shmem.alloc_device::<bf16>(m * 2 * ffn).map_err(text)?;
    let act = c.shmem.alloc_device::<bf16>(m * ffn).map_err(text)?;
    let y = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
    let s = &c.stream;
    gemm.linear(
        &gu,
        &x,
        &w1,
        LinearShape {
            m,
            n: 2 * ffn,
            k: hidden,
        },
        s,
    )
    .map_err(text)?;
    c.tp.silu_mul(&act, &gu, m, s).map_err(text)?;
    gemm.linear(
        &y,
        &act,
        &w2,
        LinearShape {
            m,
            n: hidden,
            k: ffn,
        },
        s,
    )
    .map_err(text)?;
    sync(s).map_err(text)?;
    y.to_vec().map_err(text)
}

/// The large shape: the MLP against the unsharded MLP on this GPU, and the column and row
/// layers of its sizes against single GEMMs.
pub fn large(
    c: &Checks,
    seed: u64,
    m: usize,
    hidden: usize,
    ffn: usize,
    which: (bool, bool, bool),
) -> Outcome {
    let d = mlp_data(seed, m, hidden, ffn);
    let f64s = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let s = &c.stream;
    // Each part runs on every PE whatever an earlier part found (they allocate symmetric
    // memory and call collectives); the first failure is reported.
    let mut outcome: Outcome = Ok(());
    if which.0 {
        let column = || -> Outcome {
            // Column: the gate projection alone.
            let layer = ColumnParallelLinear::new(&c.tp, hidden, ffn, ColumnInput::Replicated, m)
                .map_err(text)?;
            layer.load_weight(&d.gate).map_err(text)?;
            let (xs, w) = (c.symmetric(&d.x)?, c.device(&d.gate)?);
            let y = c
                .shmem
                .alloc_device::<bf16>(m * layer.local_out_features())
                .map_err(text)?;
            let full = c.shmem.alloc_device::<bf16>(m * ffn).map_err(text)?;
            layer.forward(&y, &xs, s).map_err(text)?;
            c.tp.gemm()
                .linear(
                    &full,
                    &xs,
                    &w,
                    LinearShape {
                        m,
                        n: ffn,
                        k: hidden,
                    },
                    s,
                )
                .map_err(text)?;
            sync(s).map_err(text)?;
            let full = full.to_vec().map_err(text)?;
            let shape = LinearShape {
                m,
                n: ffn,
                k: hidden,
            };
            sampled("the unsharded gate GEMM", &full, &d.x, &d.gate, shape, seed)?;
            let want = f64s(&take_cols(&full, ffn, shard_range(ffn, c.me(), c.n())));
            compare(
                "column-parallel vs unsharded",
                &y.to_vec().map_err(text)?,
                &want,
            )?;
            if !m.is_multiple_of(c.n()) {
                return Ok(());
            }
            // Sequence parallel, fused: the same product from this PE's share of the tokens.
            let per_pe = m / c.n();
            let layer =
                ColumnParallelLinear::new(&c.tp, hidden, ffn, ColumnInput::SequenceParallel, m)
                    .map_err(text)?;
            layer.load_weight(&d.gate).map_err(text)?;
            let mine = c.symmetric(&take_rows(
                &d.x,
                hidden,
                c.me() * per_pe..(c.me() + 1) * per_pe,
            ))?;
            layer
                .forward_with(&y, &mine, Schedule::Fused, s)
                .map_err(text)?;
            sync(s).map_err(text)?;
            compare_unsharded(
                "fused sequence-parallel column vs unsharded",
                &y.to_vec().map_err(text)?,
                &want,
            )
        };
        outcome = outcome.and(column());
    }
    if which.1 {
        let row = || -> Outcome {
            // Row: the down projection alone, on the input x widened to ffn features.
            let mut rng = Rng::new(seed ^ 1);
            let x = rng.bf16s(m * ffn, 1.0);
            let layer = RowParallelLinear::new(&c.tp, ffn, hidden, m).map_err(text)?;
            layer.load_weight(&d.down).map_err(text)?;
            let xs = c.device(&take_cols(&x, ffn, layer.local_in_features()))?;
            let (xf, w) = (c.device(&x)?, c.device(&d.down)?);
            let y = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
            let full = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
            layer.forward(&y, &xs, s).map_err(text)?;
            c.tp.gemm()
                .linear(
                    &full,
                    &xf,
                    &w,
                    LinearShape {
                        m,
                        n: hidden,
                        k: ffn,
                    },
                    s,
                )
                .map_err(text)?;
            sync(s).map_err(text)?;
            let got = y.to_vec().map_err(text)?;
            let full = full.to_vec().map_err(text)?;
            let shape = LinearShape {
                m,
                n: hidden,
                k: ffn,
            };
            sampled("the unsharded down GEMM", &full, &x, &d.down, shape, seed)?;
            let compared = compare_unsharded("row-parallel vs unsharded", &got, &f64s(&full));
            compared.and(c.identical("row-parallel output", &got))
        };
        outcome = outcome.and(row());
    }
    if which.2 {
        let mlp = || -> Outcome {
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
            let want = f64s(&mlp_unsharded(c, &d, m, hidden, ffn)?);
            let mut found: Outcome = Ok(());
            for schedule in [Schedule::Sequential, Schedule::Fused] {
                let y = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
                mlp.forward_with(&y, &x, schedule, s).map_err(text)?;
                sync(s).map_err(text)?;
                let got = y.to_vec().map_err(text)?;
                let compared =
                    compare_unsharded(&format!("MLP ({schedule:?}) vs unsharded"), &got, &want);
                found = found.and(compared).and(c.identical("MLP output", &got));
            }
            if !m.is_multiple_of(c.n()) {
                return found;
            }
            // Sequence parallel: this PE's rows of the same outputs.
            let per_pe = m / c.n();
            let sp = SequenceParallelMlp::new(
                &c.tp,
                MlpShape {
                    hidden,
                    ffn,
                    max_tokens: m,
                },
            )
            .map_err(text)?;
            sp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
            let rows = c.me() * per_pe..(c.me() + 1) * per_pe;
            let x = c.symmetric(&take_rows(&d.x, hidden, rows.clone()))?;
            let mine = &want[rows.start * hidden..rows.end * hidden];
            for schedule in [Schedule::Sequential, Schedule::Fused] {
                let y = c.shmem.malloc::<bf16>(per_pe * hidden).map_err(text)?;
                sp.forward_with(&y, &x, schedule, s).map_err(text)?;
                sync(s).map_err(text)?;
                found = found.and(compare_unsharded(
                    &format!("sequence-parallel MLP ({schedule:?}) vs unsharded"),
                    &y.to_vec().map_err(text)?,
                    mine,
                ));
            }
            found
        };
        outcome = outcome.and(mlp());
    }
    outcome
}
