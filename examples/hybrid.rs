//! A hybrid training step, tensor x pipeline x data parallel: Llama-like MLP blocks (bf16,
//! RMSNorm, residual) with each block's FFN sharded over a tensor-parallel group (our layers
//! and their all-reduces), the blocks cut into pipeline stages that hand micro-batches over
//! channels in the 1F1B order, and the gradients summed over the data-parallel replicas by
//! `GradientSync`. After every step each PE checks its weights against a single-GPU run of
//! the same model on every replica's micro-batches, and that every replica holds the same bits.
//!
//! ```text
//! nvshmemrun -np 4 target/release/examples/hybrid --tp 2 --pp 2    (needs the `tp` feature)
//! ```
//! Tolerance: the sharded run rounds each group PE's partial products and each replica's
//! gradient sum to bf16 where the single-GPU run rounds whole sums. Per step, a weight may
//! then differ by a bf16 step (2^-7 of it) and its update by a few roundings of 2^-8 on the
//! gradient's way back: `weights::Tolerance` allows (|w| + RMS of w) / 128 and 2^-4 of the
//! update's RMS, summed over the steps.

use nvshmem::pipeline::OneFOneB;
use nvshmem::ReduceOp;
use nvshmem::{bf16, AllGatherAlgo, GradSyncConfig, GradientSync};
#[path = "common/hybrid/layout.rs"]
mod layout;
#[path = "common/hybrid/stage.rs"]
mod stage;
#[path = "common/hybrid/weights.rs"]
mod weights;
use layout::{Groups, Layout, Pipes};
use stage::comm::Ours;
use stage::{Sizes, Stage};

const Z: Sizes = Sizes {
    hidden: 256,
    ffn: 1024,
    tokens: 16,
};
const BLOCKS: usize = 4;
const MICRO_BATCHES: usize = 4;
const STEPS: u64 = 3;

fn main() {
    if let Err(e) = run() {
        eprintln!("hybrid: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let shmem = nvshmem::Nvshmem::init()?;
    let (me, s0) = (shmem.my_pe(), shmem.stream());
    let at = Layout::from_args(&shmem, BLOCKS, Z.ffn)?;
    let (tp, pp, dp, s, d) = (at.tp, at.pp, at.dp, at.s, at.d);
    let Groups {
        tp: tpg,
        dp: dp_coll,
        one,
    } = Groups::new(&shmem, at)?;
    let world = shmem.team_world();

    let per = BLOCKS / pp;
    let mine = (s * per..(s + 1) * per).map(|b| weights::block(Z, b));
    let stage = Stage::new(&shmem, &tpg, Z, MICRO_BATCHES, mine)?;
    let all = (0..BLOCKS).map(|b| weights::block(Z, b));
    let reference = Stage::new(&shmem, &one, Z, dp * MICRO_BATCHES, all)?;
    let plain = GradSyncConfig::default();
    let mut sync = GradientSync::<bf16>::new(&shmem, &dp_coll, &stage.param_lens(), plain)?;
    let ref_lens = reference.param_lens();
    let mut ref_sync = GradientSync::<bf16>::new(&shmem, one.collectives(), &ref_lens, plain)?;
    let pipes = Pipes::new(&shmem, at, Z.tokens * Z.hidden)?;
    let schedule = OneFOneB::new(pp, MICRO_BATCHES)?;
    let lr = 0.25 / (dp * MICRO_BATCHES * Z.tokens) as f32;
    let (hash, hashes) = (shmem.malloc::<u64>(1)?, shmem.malloc::<u64>(dp)?);
    let (failed, mut tolerance) = (shmem.malloc::<i32>(1)?, weights::Tolerance::default());
    for step in 0..STEPS {
        // The hybrid step: this stage's micro-batches in the 1F1B order, then the weight
        // gradients, summed over the replicas bucket by bucket under the GEMMs.
        if s == 0 {
            for j in 0..MICRO_BATCHES {
                stage
                    .input(j)
                    .copy_from_host(&weights::input(Z, step, d, j))?;
            }
        }
        let steps = schedule.steps(s)?;
        let pipes = Some((&pipes, s));
        stage.run_schedule(
            &steps,
            &mut Ours {
                pipes,
                sync: &mut sync,
            },
            s0,
        )?;
        // The single-GPU run: every replica's micro-batches through every block here.
        for k in 0..dp * MICRO_BATCHES {
            let x = weights::input(Z, step, k / MICRO_BATCHES, k % MICRO_BATCHES);
            reference.input(k).copy_from_host(&x)?;
        }
        let alone = &mut Ours {
            pipes: None,
            sync: &mut ref_sync,
        };
        reference.run_alone(dp * MICRO_BATCHES, alone, s0)?;
        s0.synchronize()?;
        weights::update(&stage, &sync, lr)?;
        let moved = weights::update(&reference, &ref_sync, lr)?;
        let mine = (s * per, per);
        let want = weights::shards(&weights::of(&reference)?, mine, (at.t, tp), Z);
        tolerance.add(&want, &weights::shards(&moved, mine, (at.t, tp), Z));
        let worst = tolerance.worst(&weights::of(&stage)?, &want);
        hash.copy_from_host(&[weights::hash(&stage)?])?;
        dp_coll.all_gather(&hashes, &hash, AllGatherAlgo::Auto, s0)?;
        s0.synchronize()?;
        let seen = hashes.to_vec()?;
        let same = seen.iter().all(|&h| h == seen[0]);
        let ok = worst <= 1.0 && same;
        println!(
            "hybrid: PE {me} (tp {tp} x pp {pp} x dp {dp}: replica {d}, stage {s}, group PE {}): \
             step {step}: weights {worst:.2} of the tolerance from the single-GPU run, replicas \
             identical: {same}: {}",
            at.t,
            if ok { "passed" } else { "FAILED" }
        );
        // Every PE stops together: one that left alone would leave its peers waiting.
        failed.copy_from_host(&[i32::from(!ok)])?;
        world.all_reduce(&failed, &failed, ReduceOp::Max, s0)?;
        let ok = failed.to_vec()? == [0];
        if !ok {
            std::process::exit(1);
        }
    }
    pipes.check()?;
    shmem.barrier_all()?;
    Ok(())
}
