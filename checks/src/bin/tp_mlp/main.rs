//! GPU checks of the tensor-parallel layers (`nvshmem::tp`), then a short timing table.
//!
//! ```text
//! scripts/nvshmrun -np 2 target/release/tp_mlp --test all
//! scripts/nvshmrun -np 4 target/release/tp_mlp --test mlp --shape 70b --m 1,128,2048
//! ```
//! `--test all|column|row|mlp|gemm|norm|backward|breakdown` (several with commas), `--shape 8b|70b|HIDDEN,FFN` (the
//! large shape checked against the unsharded product on one GPU and timed; 8b by default),
//! `--m LIST` (its token counts), `--iters N` (timed graph replays per row), `--no-timing`.
//! `--rounds N` makes every fused exchange N rounds (`ScheduleThresholds::fused_exchange_gemms`
//! N × the PE count, `fused_mlp_rounds` 0). `gemm`
//! checks the local GEMM paths (`GemmPath::CublasLt` and `Decode`) against f64
//! sums and times them on this PE's shard of the shape for each `--m`: ours (the decode
//! kernels up to 16 tokens, the CUTLASS kernel above) against cuBLASLt. `breakdown` (timing
//! only, not part of `all`) splits the sequential MLP's time for each `--m`: its GEMMs alone,
//! its GEMMs then an 8-byte all-reduce (which waits for the slowest PE's GEMMs), the
//! all-reduce of its output alone, and the MLP.
//!
//! Every layer is checked on random bf16 data: small and odd shapes against an f64 CPU
//! reference, the large shape against the unsharded GEMMs on this GPU (themselves checked
//! against f64 sums on sampled elements). Replicated
//! outputs must be bitwise identical on every PE. Prints `N passed, M failed` on PE 0 and
//! exits non-zero if anything failed.
//!
//! Tolerance: every output goes through bf16 (2^-8 relative spacing) at least once, and the
//! layers round intermediate values to bf16 (the GEMM outputs, each PE's partial product,
//! SiLU(gate)·up) where the reference rounds the same values from f64 sums, which can fall on
//! the other side of a bf16 rounding boundary than the GPU's f32 sums. So an element may
//! differ from the reference by 2^-7 of its own magnitude plus 2^-7 of the output's root mean
//! square (the scale at which cancellation leaves a small element carrying its inputs'
//! rounding), and, in the MLP, by 2^-7 of its largest term act_j·down_ij (one intermediate
//! that rounded the other way moves act_j by up to 2^-7 of itself); a row-parallel output
//! likewise by 2^-7 of its largest partial product (a partial product that rounded the other
//! way moves the sum by one bf16 spacing of itself, which may exceed the sum's own). A wrong shard, a missing
//! PE or swapped gate and up projections miss by the order of the RMS itself. Against the
//! unsharded product on one GPU (the large shape), which rounds no partial product, the layers'
//! rounding of each PE's partial product (2^-9 of each, which need not cancel as their sum
//! does) is allowed as well: 2^-6 of magnitude plus RMS.
//!
//! Where the reference rounds exactly where a layer rounds (the column- and row-parallel
//! layers: the output, and each PE's partial product), a GPU element differs from the
//! reference's bf16 only when its f32 sum falls on the other side of a rounding boundary
//! than the f64 sum, which is rare (about 1 element in 10^4 on these shapes): so at most 1% of
//! the elements may differ at all. A GEMM that rounds more often than that (split-K parts
//! added up in bf16, seen in cuBLASLt at m = 16, n = 48, k = 9: 29% of the elements) fails.

mod args;
mod backward;
mod breakdown;
mod column;
mod fused_exchange;
mod gemm;
mod harness;
mod large;
mod mlp;
mod norm;
mod reference;
mod row;
mod sequence_timing;

use nvshmem::tp::TensorParallel;

use harness::Checks;

/// The group this PE runs the checks in: every PE, or its row of `size` PEs.
fn group(shmem: &nvshmem::Nvshmem, size: Option<usize>) -> nvshmem::Result<TensorParallel> {
    let Some(size) = size else {
        return TensorParallel::new(shmem);
    };
    if size == 0 || !shmem.n_pes().is_multiple_of(size) {
        return Err(nvshmem::Error::InvalidArgument(format!(
            "--group {size}: give a group size that divides the PE count ({})",
            shmem.n_pes()
        )));
    }
    let (row, _) = shmem.team_world().split_2d(size)?;
    let row = row.ok_or_else(|| nvshmem::Error::InvalidArgument("this PE is in no row".into()))?;
    TensorParallel::with_team(shmem, &row)
}

fn main() {
    let args = args::parse();
    let shmem = nvshmem_checks::start("tp_mlp");
    let tp = match group(&shmem, args.group) {
        Ok(t) => match args.rounds {
            Some(r) => {
                let mut thresholds = *t.thresholds();
                thresholds.fused_exchange_gemms = r * t.n_pes();
                thresholds.fused_mlp_rounds = 0;
                t.with_thresholds(thresholds)
            }
            None => t,
        },
        Err(e) => {
            eprintln!("tp_mlp: PE {}: {e}", shmem.my_pe());
            std::process::exit(2);
        }
    };
    let (n, group) = (shmem.n_pes(), tp.n_pes());
    if shmem.my_pe() == 0 {
        println!(
            "tp_mlp: {n} PEs in groups of {group}; {}",
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    let mut c = Checks::new(shmem, tp, args.verbose);
    if args.column {
        column::run(&mut c);
    }
    if args.row {
        row::run(&mut c);
    }
    if args.mlp {
        mlp::run(&mut c);
    }
    if args.gemm {
        gemm::run(&mut c, &args);
    }
    if args.norm {
        norm::run(&mut c);
    }
    if args.backward {
        backward::run(&mut c);
    }
    let which = (args.column, args.row, args.mlp);
    if which != (false, false, false) {
        for &m in &args.ms {
            c.run(
                format!(
                    "{} shape (hidden {}, ffn {}) m={m} against the unsharded GEMMs",
                    args.shape_name, args.hidden, args.ffn
                ),
                |c, seed| large::large(c, seed, m, args.hidden, args.ffn, which),
            );
        }
    }
    if args.timing && (args.column || args.row) {
        c.run(
            "sequence-parallel timing (every timed output checked)".into(),
            |c, _| sequence_timing::sequence_parallel_timing(c, &args),
        );
    }
    if args.timing && args.mlp {
        c.run("timing (every timed output checked)".into(), |c, _| {
            mlp::timing(c, &args)
        });
    }
    if args.timing && args.breakdown {
        c.run(
            "overhead breakdown (every timed output checked)".into(),
            |c, _| breakdown::breakdown(c, &args),
        );
    }
    match c.finish() {
        Ok((passed, failed)) => {
            if c.shmem.my_pe() == 0 {
                println!("{passed} passed, {failed} failed");
            }
            std::process::exit(if failed == 0 { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!(
                "tp_mlp: PE {}: the final tally failed: {e}",
                c.shmem.my_pe()
            );
            std::process::exit(1);
        }
    }
}
