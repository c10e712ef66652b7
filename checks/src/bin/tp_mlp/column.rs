//! The column-parallel layer's checks: replicated and sequence-parallel input, and the fused
//! all-gather + GEMM.

use nvshmem::bf16;
use nvshmem::tp::{
    shard_range, take_cols, take_rows, ColumnInput, ColumnParallelLinear, Schedule,
    FUSED_EXCHANGE_TOKENS,
};

use crate::args::small;
use crate::fused_exchange::{fused_exchange, FusedIo};
use crate::harness::{sync, text, Checks, Outcome, SCHEDULES};
use crate::reference::{compare, matmul, weight, Rng};

/// Column-parallel, replicated input: this PE's columns of `x · wᵀ`.
fn column_replicated(c: &Checks, seed: u64, (m, k, n): (usize, usize, usize)) -> Outcome {
    let mut rng = Rng::new(seed);
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let layer = ColumnParallelLinear::new(&c.tp, k, n, ColumnInput::Replicated, m).map_err(text)?;
    layer.load_weight(&w).map_err(text)?;
    let xs = c.symmetric(&x)?;
    let y = c
        .shmem
        .alloc_device::<bf16>(m * layer.local_out_features())
        .map_err(text)?;
    layer.forward(&y, &xs, &c.stream).map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let want = take_cols(&matmul(&x, &w, m, n, k), n, shard_range(n, c.me(), c.n()));
    compare("column-parallel output", &y.to_vec().map_err(text)?, &want)
}

/// Column-parallel, sequence-parallel input: each PE gives `per_pe` rows.
fn column_sequence(
    c: &Checks,
    seed: u64,
    (per_pe, k, n): (usize, usize, usize),
    schedule: Schedule,
) -> Outcome {
    let mut rng = Rng::new(seed);
    let m = per_pe * c.n();
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let layer =
        ColumnParallelLinear::new(&c.tp, k, n, ColumnInput::SequenceParallel, m).map_err(text)?;
    layer.load_weight(&w).map_err(text)?;
    let mine = c.symmetric(&take_rows(&x, k, c.me() * per_pe..(c.me() + 1) * per_pe))?;
    let y = c
        .shmem
        .alloc_device::<bf16>(m * layer.local_out_features())
        .map_err(text)?;
    layer
        .forward_with(&y, &mine, schedule, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let want = take_cols(&matmul(&x, &w, m, n, k), n, shard_range(n, c.me(), c.n()));
    compare(
        "sequence-parallel output",
        &y.to_vec().map_err(text)?,
        &want,
    )
}

/// The fused all-gather + GEMM (sequence-parallel input), `per_pe` rows per PE, through
/// [`fused_exchange`]. With `skew`, PE 0's outputs start 2 bytes past a 16-byte boundary,
/// so that its GEMMs take other cuBLASLt kernels than its peers' in the same exchange.
fn column_fused(
    c: &Checks,
    seed: u64,
    (per_pe, k, nn): (usize, usize, usize),
    skew: bool,
) -> Outcome {
    let mut rng = Rng::new(seed);
    let m = per_pe * c.n();
    let w = weight(&mut rng, nn, k);
    let tp = c.tp.clone();
    let build = || -> Result<ColumnParallelLinear, String> {
        let layer = ColumnParallelLinear::new(&tp, k, nn, ColumnInput::SequenceParallel, m)
            .map_err(text)?;
        layer.load_weight(&w).map_err(text)?;
        Ok(layer)
    };
    let layers = [build()?, build()?];
    let cols = shard_range(nn, c.me(), c.n());
    let (out, w_mine) = (cols.len(), take_rows(&w, k, cols));
    let mine_of = |x: &[bf16]| take_rows(x, k, c.me() * per_pe..(c.me() + 1) * per_pe);
    let inputs: Vec<Vec<bf16>> = (0..3).map(|_| rng.bf16s(m * k, 1.0)).collect();
    let xs: Vec<_> = inputs
        .iter()
        .map(|x| c.symmetric(&mine_of(x)))
        .collect::<Result<_, _>>()?;
    // Symmetric (allocated alike on every PE: room for the widest shard and the skew).
    let ys: Vec<_> = (0..9)
        .map(|_| {
            c.shmem
                .malloc::<bf16>(m * nn.div_ceil(c.n()) + 1)
                .map_err(text)
        })
        .collect::<Result<_, _>>()?;
    let at = usize::from(skew && c.me() == 0);
    let y = |o: usize| ys[o].view(at..at + m * out);
    fused_exchange(
        c,
        &FusedIo {
            call: &|l, i, o, schedule| layers[l].forward_with(&y(o), &xs[i], schedule, &c.stream),
            read: &|o| y(o).to_vec().map_err(text),
            poison: &|o| y(o).copy_from_host(&vec![bf16::NAN; m * out]).map_err(text),
            reload: &|i| xs[0].copy_from_host(&mine_of(&inputs[i])).map_err(text),
            check: &|i, got| {
                let want = matmul(&inputs[i], &w_mine, m, out, k);
                compare("fused sequence-parallel column output", got, &want)
            },
        },
    )
}

/// The column-parallel checks: replicated and sequence-parallel input in every schedule,
/// then the fused all-gather + GEMM.
pub fn run(c: &mut Checks) {
    let n = c.n();
    for s in small(n) {
        c.run(
            format!("column replicated m={} k={} n={}", s.0, s.1, s.2),
            |c, seed| column_replicated(c, seed, s),
        );
    }
    for schedule in SCHEDULES {
        for (per_pe, k, nn) in [(1, 64, 96), (3, 200, 328), (16, 129, 8 * n + 3)] {
            c.run(
                format!("column sequence-parallel {per_pe} rows per PE k={k} n={nn} {schedule:?}"),
                |c, seed| column_sequence(c, seed, (per_pe, k, nn), schedule),
            );
        }
    }
    // The fused all-gather + GEMM: below FUSED_EXCHANGE_TOKENS rows per PE (sequential),
    // from there a GEMM per PE's rows, with shard widths of odd lengths too.
    let big = 2048usize.div_ceil(n) + 6;
    for s in [
        (3, 200, 328),
        (16, 136, 64 * n),
        (FUSED_EXCHANGE_TOKENS + 3, 136, 64 * n),
        (big, 136, 512 * n),
        (big, 264, 16 * n + 5),
    ] {
        c.run(
            format!(
                "column fused {} rows per PE k={} n={}: back to back, two layers, graph replay",
                s.0, s.1, s.2
            ),
            |c, seed| column_fused(c, seed, s, false),
        );
    }
    let s = (big, 136, 512 * n);
    c.run(
        format!(
            "column fused {} rows per PE k={} n={}, PE 0's output misaligned: back to back, two layers, graph replay",
            s.0, s.1, s.2
        ),
        |c, seed| column_fused(c, seed, s, true),
    );
}
