//! `GradientSync`: parameters of odd lengths in many buckets, made ready one by one (with
//! work on the stream between them) or all at once, plain (bit for bit against the sum in PE
//! order) and compressed with error feedback (bit for bit against the CPU model, bucket by
//! bucket), for several steps and in a replayed graph; and the misuse it refuses.

use nvshmem::collectives::compressed::model;
use nvshmem::collectives::Compression;
use nvshmem::{bf16, Collectives, Error, GradSyncConfig, GradientSync, Nvshmem, ReduceOp, Result};
use nvshmem_checks::graph::capture;

use crate::compressed::with_compressed_bytes;
use crate::harness::{compare, cuda, expect_err, place, sync, Checker};
use crate::reference::{inputs, reference, Reducible};

/// The parameters of the checks: odd lengths, a few large.
pub(crate) const PARAMS: [usize; 9] = [1000, 7, 65_537, 3, 4096, 20_001, 1, 130_000, 999];

/// Every PE's gradients for step `step` of check `seed`, one vector per parameter.
fn step_grads<T: Reducible>(seed: u64, step: u64, n: usize) -> Vec<Vec<Vec<T>>> {
    PARAMS
        .iter()
        .enumerate()
        .map(|(p, &len)| inputs::<T>(seed ^ (step << 32) ^ (p as u64 * 7919), n, len))
        .collect()
}

/// `steps` plain steps: each parameter's gradient written (a copy on the stream) and made
/// ready from the last one back, or all at once with `sync`; each parameter's sum against
/// the reference, bit for bit.
pub(crate) fn plain_steps<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    bucket_bytes: usize,
    one_by_one: bool,
) -> Result<()> {
    let (me, n) = place(coll)?;
    let config = GradSyncConfig {
        bucket_bytes,
        compression: None,
    };
    let mut gs = GradientSync::<T>::new(shmem, coll, &PARAMS, config)?;
    let s = shmem.stream();
    for step in 0..3 {
        let all = step_grads::<T>(seed, step, n);
        match one_by_one {
            true => {
                for p in (0..PARAMS.len()).rev() {
                    gs.grad(p).copy_from_host(&all[p][me])?;
                    gs.ready(p, s)?;
                }
                gs.wait(s)?;
            }
            false => {
                for (p, per_pe) in all.iter().enumerate() {
                    gs.grad(p).copy_from_host(&per_pe[me])?;
                }
                gs.sync(s)?;
            }
        }
        sync(shmem)?;
        for (p, per_pe) in all.iter().enumerate() {
            compare(
                &format!("step {step}, parameter {p}"),
                &gs.grad(p).to_vec()?,
                &reference(ReduceOp::Sum, per_pe),
            )?;
        }
    }
    Ok(())
}

/// Compressed steps with error feedback: each bucket against the model (its parameters end
/// to end, zeros between, as the sync lays them out), the feedback carried over the steps;
/// step 2 in a graph.
pub(crate) fn compressed_steps(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    c: Compression,
) -> Result<()> {
    let (me, n) = place(coll)?;
    let config = GradSyncConfig {
        bucket_bytes: 64 << 10,
        compression: Some(c),
    };
    let mut gs = GradientSync::<f32>::new(shmem, coll, &PARAMS, config)?;
    let buckets = gs.buckets();
    // Where each parameter sits in the buffer, from the views.
    let base = gs.grads().as_ptr() as usize;
    let at: Vec<usize> = (0..PARAMS.len())
        .map(|p| (gs.grad(p).as_ptr() as usize - base) / 4)
        .collect();
    let mut carried: Vec<Vec<Vec<f32>>> = buckets
        .iter()
        .map(|b| {
            let len = at[b.end - 1] + PARAMS[b.end - 1] - at[b.start];
            vec![vec![0f32; c.feedback_len(len, n)]; n]
        })
        .collect();
    let s = shmem.stream();
    let stream = shmem.new_stream()?;
    let steps = 4;
    let mut want = vec![Vec::new(); PARAMS.len()];
    for step in 0..steps {
        let all = step_grads::<f32>(seed, step, n);
        for (p, per_pe) in all.iter().enumerate() {
            gs.grad(p).copy_from_host(&per_pe[me])?;
        }
        // The model, bucket by bucket.
        for (b, r) in buckets.iter().enumerate() {
            let start = at[r.start];
            let len = at[r.end - 1] + PARAMS[r.end - 1] - start;
            let per_pe: Vec<Vec<f32>> = (0..n)
                .map(|pe| {
                    let mut v = vec![0f32; len];
                    for p in r.clone() {
                        v[at[p] - start..at[p] - start + PARAMS[p]].copy_from_slice(&all[p][pe]);
                    }
                    v
                })
                .collect();
            let m = model(c, &per_pe, Some(&mut carried[b]));
            for p in r.clone() {
                want[p] = m.out[at[p] - start..at[p] - start + PARAMS[p]].to_vec();
            }
        }
        match step {
            // Step 2 in a graph, captured and launched.
            2 => {
                let graph = capture(&stream, || {
                    for p in (0..PARAMS.len()).rev() {
                        gs.ready(p, &stream)?;
                    }
                    gs.wait(&stream)
                })?;
                cuda("cuGraphLaunch", graph.launch())?;
                cuda("cuStreamSynchronize", stream.synchronize())?;
            }
            _ => {
                for p in (0..PARAMS.len()).rev() {
                    gs.ready(p, s)?;
                }
                gs.wait(s)?;
                sync(shmem)?;
            }
        }
        for (p, w) in want.iter().enumerate() {
            let got = gs.grad(p).to_vec()?;
            if let Some(i) = (0..w.len()).find(|&i| got[i].to_bits() != w[i].to_bits()) {
                return Err(Error::InvalidArgument(format!(
                    "{c}, step {step}, parameter {p}: element {i} is {}, the model's {}",
                    got[i], w[i]
                )));
            }
        }
    }
    Ok(())
}

/// What the sync refuses, on every PE alike.
fn refusals(shmem: &Nvshmem, coll: &Collectives) -> Result<()> {
    let invalid = |e: &Error| matches!(e, Error::InvalidArgument(_));
    let zero = GradSyncConfig {
        bucket_bytes: 0,
        compression: None,
    };
    expect_err(
        GradientSync::<f32>::new(shmem, coll, &PARAMS, zero).map(|_| ()),
        "buckets of 0 bytes",
        invalid,
    )?;
    let int8 = GradSyncConfig {
        bucket_bytes: 1 << 20,
        compression: Some(Compression::Int8 { block: 128 }),
    };
    expect_err(
        GradientSync::<f32>::new(shmem, coll, &PARAMS, int8).map(|_| ()),
        "a compressed sync without compressed workspace",
        |e| e.to_string().contains("compressed_workspace_bytes"),
    )?;
    let bad_block = GradSyncConfig {
        compression: Some(Compression::Int8 { block: 0 }),
        ..int8
    };
    expect_err(
        GradientSync::<f32>::new(shmem, coll, &PARAMS, bad_block).map(|_| ()),
        "a block of 0",
        invalid,
    )?;
    let bf16_in_bf16 = GradSyncConfig {
        compression: Some(Compression::Bf16),
        ..int8
    };
    expect_err(
        GradientSync::<bf16>::new(shmem, coll, &PARAMS, bf16_in_bf16).map(|_| ()),
        "bf16 gradients sent as bf16",
        invalid,
    )?;
    expect_err(
        GradientSync::<u16>::new(shmem, coll, &PARAMS, GradSyncConfig::default()).map(|_| ()),
        "u16 gradients",
        |e| matches!(e, Error::TypeMismatch { .. }),
    )?;
    let mut gs = GradientSync::<f32>::new(shmem, coll, &PARAMS, GradSyncConfig::default())?;
    let s = shmem.stream();
    expect_err(gs.wait(s), "a step with no parameter ready", invalid)?;
    gs.ready(3, s)?;
    expect_err(gs.ready(3, s), "a parameter ready twice", invalid)?;
    expect_err(
        gs.ready(PARAMS.len(), s),
        "a parameter past the last",
        invalid,
    )?;
    // Still sound: the step completes.
    gs.sync(s)?;
    sync(shmem)
}

pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    for bucket_bytes in [1, 100 << 10, 1 << 30] {
        for one_by_one in [true, false] {
            let tag = format!("grad_sync buckets of {bucket_bytes} bytes, one by one {one_by_one}");
            c.check(&format!("{tag} f32"), |s, seed| {
                plain_steps::<f32>(s, coll, seed, bucket_bytes, one_by_one)
            });
            c.check(&format!("{tag} bf16"), |s, seed| {
                plain_steps::<bf16>(s, coll, seed, bucket_bytes, one_by_one)
            });
        }
    }
    c.check("grad_sync refusals", |s, _| refusals(s, coll));
    let shmem = c.shmem.clone();
    let n = shmem.n_pes();
    let formats = [Compression::Int8 { block: 128 }, Compression::Fp16];
    let bytes = formats
        .iter()
        .map(|&f| {
            GradientSync::<f32>::compressed_workspace_bytes(
                &PARAMS,
                GradSyncConfig {
                    bucket_bytes: 64 << 10,
                    compression: Some(f),
                },
                n,
            )
        })
        .max()
        .unwrap_or(0);
    let compressed = match with_compressed_bytes(&shmem, bytes) {
        Ok(c) => c,
        Err(e) => {
            c.check(
                "grad_sync: a Collectives with a compressed workspace",
                |_, _| Err(e),
            );
            return;
        }
    };
    for f in formats {
        c.check(
            &format!("grad_sync compressed {f}, feedback and graph"),
            |s, seed| compressed_steps(s, &compressed, seed, f),
        );
    }
}
