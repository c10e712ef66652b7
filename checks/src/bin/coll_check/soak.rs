//! The soak (`--soak SECONDS`): random checked calls until the time is up, comparing the
//! memory in use at the start and the end; the program's documentation (main.rs) says what
//! it runs and prints.

use nvshmem::{
    bf16, f16, AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Collectives, DataType,
    Error, Nvshmem, ReduceOp, ReduceScatterAlgo, Result,
};
use std::time::{Duration, Instant};

use crate::all_gather::all_gather_case;
use crate::all_reduce::all_reduce_case;
use crate::all_to_all_v::all_to_all_v_case;
use crate::back_to_back::{back_to_back, two_streams};
use crate::compressed::{self, FORMATS, MAX_LEN};
use crate::graph_replay::graph_replay;
use crate::group::group_case;
use crate::harness::{any_pe, cuda, ll_limit};
use crate::movement::{all_to_all_case, broadcast_case};
use crate::reduce::reduce_case;
use crate::reduce_scatter::reduce_scatter_case;
use crate::reference::Rng;

/// Free device memory on this PE's GPU.
fn free_memory(shmem: &Nvshmem) -> Result<usize> {
    shmem
        .context()
        .bind_to_thread()
        .map_err(|source| Error::Cuda {
            call: "cuCtxSetCurrent",
            source,
        })?;
    let (free, _) = cuda(
        "cuMemGetInfo",
        nvshmem::cudarc::driver::result::mem_get_info(),
    )?;
    Ok(free)
}

/// Random checked calls until `time` is up (see the program's documentation).
pub(crate) fn soak(shmem: &Nvshmem, coll: &Collectives, time: Duration) -> bool {
    let me = shmem.my_pe();
    // A second Collectives, with room for compressed calls of up to MAX_LEN elements.
    let squeezed = match compressed::with_room(shmem) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("PE {me}: soak: a Collectives with a compressed workspace: {e}");
            return false;
        }
    };
    // Every kernel once first: CUDA loads a kernel's code on its first launch, which takes
    // device memory that stays.
    let warm = (|| -> Result<()> {
        for algo in AllReduceAlgo::ALL {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                all_reduce_case::<f32>(shmem, coll, 1, op, algo, 1000, false)?;
                all_reduce_case::<bf16>(shmem, coll, 2, op, algo, 1000, false)?;
                all_reduce_case::<f16>(shmem, coll, 3, op, algo, 1000, false)?;
                if algo.takes(DataType::I32) {
                    all_reduce_case::<i32>(shmem, coll, 4, op, algo, 1000, false)?;
                }
            }
        }
        for algo in AllGatherAlgo::ALL {
            all_gather_case::<i32>(shmem, coll, 5, algo, 1000)?;
        }
        two_streams::<i32>(shmem, coll, 6, AllReduceAlgo::OneShot, 1000, 2)?;
        graph_replay::<f32>(shmem, coll, 7, AllReduceAlgo::OneShot, 1000)?;
        for algo in ReduceScatterAlgo::ALL {
            reduce_scatter_case::<f32>(shmem, coll, 8, (ReduceOp::Sum, algo), 1000)?;
        }
        reduce_case::<f32>(shmem, coll, 12, (ReduceOp::Sum, 0, false), 1000)?;
        for algo in BroadcastAlgo::ALL {
            broadcast_case::<f32>(shmem, coll, 9, (algo, 0, false), 1000)?;
        }
        for algo in AllToAllAlgo::ALL {
            all_to_all_case::<f32>(shmem, coll, 10, algo, 1000)?;
        }
        all_to_all_v_case(shmem, coll, 11, 100)?;
        for (i, f) in FORMATS.into_iter().enumerate() {
            compressed::call::<f32>(shmem, &squeezed, 13 + i as u64, f, 1000, false, None)?;
        }
        let grouped = [
            AllReduceAlgo::Auto,
            AllReduceAlgo::OneShot,
            AllReduceAlgo::TwoShot,
        ];
        for (i, algo) in grouped.into_iter().enumerate() {
            group_case::<f32>(
                shmem,
                coll,
                17 + i as u64,
                ReduceOp::Sum,
                algo,
                &[5, 1000],
                false,
            )?;
        }
        Ok(())
    })();
    if let Err(e) = warm {
        eprintln!("PE {me}: soak: the warm-up failed: {e}");
        return false;
    }
    // The driver grows its own pools (streams, graphs) over the first calls: memory is
    // taken as the start after the first tenth of the run (30 s at most) of random calls.
    let settle = (time / 10).min(Duration::from_secs(30));
    let mut start = None;
    // The same seed on every PE: the same arguments, in the same order.
    let mut rng = Rng::new(0x50a4, 0);
    let began = Instant::now();
    let (mut ops, mut failures, mut k) = (0u64, 0u64, 0u64);
    let reduce_algos = AllReduceAlgo::ALL;
    let gather_algos = AllGatherAlgo::ALL;
    let ops_of = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
    // Decided by PE 0's clock and shared, so every PE stops after the same call.
    let mut go_on = true;
    while go_on {
        k += 1;
        let pick = |r: &mut Rng, n: usize| (r.next() % n as u64) as usize;
        // Log-uniform sizes from 1 to 2^20 elements; a few larger ones.
        let n = if pick(&mut rng, 50) == 0 {
            (4 << 20) + pick(&mut rng, 4096)
        } else {
            1 + (rng.next() % (1u64 << pick(&mut rng, 21))) as usize
        };
        let op = ops_of[pick(&mut rng, 3)];
        let in_place = pick(&mut rng, 2) == 1;
        let kind = pick(&mut rng, 26);
        let mut algo = reduce_algos[pick(&mut rng, reduce_algos.len())];
        // The paths with a part of the workspace take small inputs only: Auto beyond 64 Ki
        // elements (the smallest such part holds 256 KiB on 8 PEs).
        let bounded = !matches!(
            algo,
            AllReduceAlgo::Auto | AllReduceAlgo::TwoShot | AllReduceAlgo::Bandwidth
        );
        if bounded && n > 1 << 16 {
            algo = AllReduceAlgo::Auto;
        }
        let seed = 0x50a4_0000 + k;
        let (what, r) = match kind {
            0..=9 => {
                let r = match pick(&mut rng, 4) {
                    0 if algo.takes(DataType::I32) => {
                        all_reduce_case::<i32>(shmem, coll, seed, op, algo, n, in_place)
                    }
                    0 | 1 => all_reduce_case::<f32>(shmem, coll, seed, op, algo, n, in_place),
                    2 => all_reduce_case::<bf16>(shmem, coll, seed, op, algo, n, in_place),
                    _ => all_reduce_case::<f16>(shmem, coll, seed, op, algo, n, in_place),
                };
                (
                    format!("all_reduce {algo:?} {op:?} n={n} in_place={in_place}"),
                    r,
                )
            }
            10..=14 => {
                let mut g = gather_algos[pick(&mut rng, gather_algos.len())];
                let n = n.min(1 << 18);
                if g == AllGatherAlgo::LowLatency && n > 1 << 16 {
                    g = AllGatherAlgo::Auto;
                }
                let r = match pick(&mut rng, 3) {
                    0 => all_gather_case::<i32>(shmem, coll, seed, g, n),
                    1 => all_gather_case::<bf16>(shmem, coll, seed, g, n),
                    _ => all_gather_case::<f32>(shmem, coll, seed, g, n),
                };
                (format!("all_gather {g:?} n={n}"), r)
            }
            15..=16 => {
                let algo = if algo.takes(DataType::I32) {
                    algo
                } else {
                    AllReduceAlgo::Auto
                };
                let rounds = 1 + pick(&mut rng, 8);
                let n = n.min(1 << 16);
                (
                    format!("two streams {algo:?} n={n} x{rounds}"),
                    two_streams::<i32>(shmem, coll, seed, algo, n, rounds),
                )
            }
            17..=18 => {
                let n = n.min(1 << 16);
                (
                    format!("graph replay {algo:?} n={n}"),
                    graph_replay::<f32>(shmem, coll, seed, algo, n),
                )
            }
            20 if pick(&mut rng, 2) == 0 => {
                let case = (op, pick(&mut rng, shmem.n_pes()), in_place);
                let r = match pick(&mut rng, 2) {
                    0 => reduce_case::<bf16>(shmem, coll, seed, case, n),
                    _ => reduce_case::<i32>(shmem, coll, seed, case, n),
                };
                (format!("reduce {case:?} n={n}"), r)
            }
            20 => {
                let n = n.min(1 << 18);
                let mut a = ReduceScatterAlgo::ALL[pick(&mut rng, ReduceScatterAlgo::ALL.len())];
                if a == ReduceScatterAlgo::LowLatency && 4 * n > ll_limit(coll) {
                    a = ReduceScatterAlgo::Auto;
                }
                let case = (op, a);
                let r = match pick(&mut rng, 4) {
                    0 => reduce_scatter_case::<i32>(shmem, coll, seed, case, n),
                    1 => reduce_scatter_case::<bf16>(shmem, coll, seed, case, n),
                    2 => reduce_scatter_case::<f16>(shmem, coll, seed, case, n),
                    _ => reduce_scatter_case::<f32>(shmem, coll, seed, case, n),
                };
                (format!("reduce_scatter {case:?} n={n}"), r)
            }
            21 => {
                let mut b = BroadcastAlgo::ALL[pick(&mut rng, BroadcastAlgo::ALL.len())];
                if b == BroadcastAlgo::OneShot && 4 * n > coll.workspace().staging_slot_bytes
                    || matches!(
                        b,
                        BroadcastAlgo::LowLatency | BroadcastAlgo::LowLatencyRelay
                    ) && 4 * n > ll_limit(coll)
                {
                    b = BroadcastAlgo::Auto;
                }
                let case = (b, pick(&mut rng, shmem.n_pes()), in_place);
                let r = match pick(&mut rng, 2) {
                    0 => broadcast_case::<bf16>(shmem, coll, seed, case, n),
                    _ => broadcast_case::<f32>(shmem, coll, seed, case, n),
                };
                (format!("broadcast {case:?} n={n}"), r)
            }
            22 => {
                let block = n.min(1 << 16);
                let mut a = AllToAllAlgo::ALL[pick(&mut rng, AllToAllAlgo::ALL.len())];
                if a == AllToAllAlgo::OneShot && 4 * block > coll.workspace().staging_slot_bytes
                    || a == AllToAllAlgo::LowLatency && 4 * block > ll_limit(coll)
                {
                    a = AllToAllAlgo::Auto;
                }
                let r = match pick(&mut rng, 2) {
                    0 => all_to_all_case::<bf16>(shmem, coll, seed, a, block),
                    _ => all_to_all_case::<f32>(shmem, coll, seed, a, block),
                };
                (format!("all_to_all {a:?} block={block}"), r)
            }
            24 => {
                // Up to 40 buffers of up to 2^15 elements each, any algorithm of the group.
                let count = 1 + pick(&mut rng, 40);
                let lens: Vec<usize> = (0..count).map(|_| pick(&mut rng, 1 << 15)).collect();
                let g = [
                    AllReduceAlgo::Auto,
                    AllReduceAlgo::OneShot,
                    AllReduceAlgo::TwoShot,
                ][pick(&mut rng, 3)];
                let r = match pick(&mut rng, 2) {
                    0 => group_case::<bf16>(shmem, coll, seed, op, g, &lens, in_place),
                    _ => group_case::<f32>(shmem, coll, seed, op, g, &lens, in_place),
                };
                (format!("all_reduce_group {g:?} {op:?} {count} buffers"), r)
            }
            25 => {
                let f = FORMATS[pick(&mut rng, FORMATS.len())];
                let n = n.min(MAX_LEN);
                let r = match pick(&mut rng, 2) {
                    0 if f != nvshmem::Compression::Bf16 => {
                        compressed::call::<bf16>(shmem, &squeezed, seed, f, n, in_place, None)
                    }
                    _ => compressed::call::<f32>(shmem, &squeezed, seed, f, n, in_place, None),
                };
                (
                    format!("all_reduce_compressed {f} n={n} in_place={in_place}"),
                    r,
                )
            }
            23 => {
                let max = n.min(1 << 14);
                (
                    format!("all_to_all_v counts up to {max}"),
                    all_to_all_v_case(shmem, coll, seed, max),
                )
            }
            _ => {
                let algos = [
                    reduce_algos[1 + pick(&mut rng, reduce_algos.len() - 1)],
                    algo,
                ];
                let algos: Vec<AllReduceAlgo> = algos
                    .into_iter()
                    .map(|a| {
                        if a.takes(DataType::I32) {
                            a
                        } else {
                            AllReduceAlgo::OneShot
                        }
                    })
                    .collect();
                let n = n.min(1 << 15);
                let rounds = 2 + pick(&mut rng, 10);
                (
                    format!("back-to-back {algos:?} n={n} x{rounds}"),
                    back_to_back::<i32>(shmem, coll, seed, &algos, n, rounds),
                )
            }
        };
        ops += 1;
        let mut fatal = false;
        if let Err(e) = r {
            failures += 1;
            eprintln!("PE {me}: soak FAIL {what}: {e}");
            // A lost context or a peer that never came: every PE stops at this call.
            fatal = matches!(e, Error::Cuda { .. } | Error::Timeout { .. });
        }
        // After every call, so that every PE stops at the same one. PE 0's clock decides
        // when the start is taken and when to stop; any PE can stop the run.
        let settled = start.is_some() || (me == 0 && began.elapsed() >= settle);
        let done = fatal || (me == 0 && began.elapsed() >= time + settle);
        let votes = any_pe(shmem, i32::from(settled) * 2 + i32::from(done) * 1024).unwrap_or(1024);
        if start.is_none() && votes % 1024 >= 2 {
            start = Some((free_memory(shmem), shmem.heap_in_use(), ops, Instant::now()));
        }
        go_on = votes < 1024;
    }
    let Some((free_start, heap_start, ops_before, measured_from)) = start else {
        eprintln!("PE {me}: soak: stopped before the warm-up ended");
        return false;
    };
    let start = (free_start, heap_start);
    let ops = ops - ops_before;
    let failed_pes = any_pe(shmem, i32::from(failures > 0)).unwrap_or(-1);
    let end = (free_memory(shmem), shmem.heap_in_use());
    let memory_kept = matches!((&start.0, &end.0), (Ok(a), Ok(b)) if a == b) && start.1 == end.1;
    println!(
        "PE {me}: soak: {ops} operations in {:.0} s (after {:.0} s of warm-up), {failures} \
         failures; free device memory {:?} -> {:?} bytes, symmetric heap in use {} -> {} bytes{}",
        measured_from.elapsed().as_secs_f64(),
        (measured_from - began).as_secs_f64(),
        start.0.as_ref().ok(),
        end.0.as_ref().ok(),
        start.1,
        end.1,
        if memory_kept { "" } else { " (CHANGED)" }
    );
    failures == 0 && failed_pes == 0 && memory_kept
}
