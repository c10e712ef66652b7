//! Reliability: the host API from many threads at once, frees that wait for kernels on every
//! stream, and allocations the heap cannot take refused on every PE with the heap still usable.

use crate::harness::*;
use nvshmem::cudarc::driver::result as cu;
use nvshmem::{AllReduceAlgo, Collectives, CollectivesConfig, Error, HeapLimit, ReduceOp};

const THREADS: usize = 8;
const ITERS: usize = 200;

/// What thread `t` of PE `pe` writes in its iteration `i`.
fn stamp(pe: usize, t: usize, i: usize) -> u64 {
    ((pe as u64) << 40) | ((t as u64) << 20) | (i as u64 + 1)
}

pub(crate) fn checks(h: &mut Harness) {
    let c = h.ctx;
    h.check(
        "threads: 8 threads put, get, quiet and add atomically at once",
        |_| {
            let sh = &c.shmem;
            // Slots and counters that the left PE's threads write into.
            let slots = c.zeros::<u64>(THREADS * ITERS)?;
            let counters = c.zeros::<u64>(THREADS)?;
            let mine: Vec<u64> = (0..THREADS * ITERS)
                .map(|k| stamp(c.me, k / ITERS, k % ITERS))
                .collect();
            let sources = c.upload(&mine)?;
            let outcomes: Vec<std::result::Result<(), String>> = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let (slots, counters, sources) = (&slots, &counters, &sources);
                        scope.spawn(move || -> std::result::Result<(), String> {
                            let e = |e: nvshmem::Error| format!("thread {t}: {e}");
                            for i in 0..ITERS {
                                let at = t * ITERS + i;
                                let v = stamp(c.me, t, i);
                                if i % 2 == 0 {
                                    sh.p(slots, at, v, c.right).map_err(e)?;
                                } else {
                                    sh.put(slots.view(at..=at), sources.view(at..=at), c.right)
                                        .map_err(e)?;
                                }
                                sh.quiet().map_err(e)?;
                                let back = sh.g(slots, at, c.right).map_err(e)?;
                                if back != v {
                                    return Err(format!(
                                        "thread {t}: read {back:#x} back from PE {}, wrote {v:#x}",
                                        c.right
                                    ));
                                }
                                sh.atomic_add(counters, t, 1u64, c.right).map_err(e)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| w.join().unwrap_or_else(|_| Err("a thread panicked".into())))
                    .collect()
            });
            sh.barrier_all()?;
            let mut problems = Problems::default();
            for o in outcomes {
                problems.note(o.map_err(Into::into));
            }
            let want: Vec<u64> = (0..THREADS * ITERS)
                .map(|k| stamp(c.left, k / ITERS, k % ITERS))
                .collect();
            problems.note(same("slots from the left PE", &slots.to_vec()?, &want));
            problems.note(same(
                "atomic counters",
                &counters.to_vec()?,
                &[ITERS as u64; THREADS],
            ));
            problems.done()
        },
    );

    h.check(
        "free waits for kernels still writing on another stream",
        |_| {
            let sh = &c.shmem;
            const SMALL: usize = 1 << 20;
            // Keep a side stream busy for milliseconds, then have it write the small buffer.
            let busy = sh.malloc::<u8>(256 << 20)?;
            let small = sh.malloc::<u8>(SMALL)?;
            let addr = small.addr();
            let side = sh.new_stream()?;
            unsafe {
                for _ in 0..40 {
                    cu::memset_d8_async(busy.addr(), 1, busy.len(), side.cu_stream())?;
                }
                cu::memset_d8_async(addr, 0xAA, SMALL, side.cu_stream())?;
            }
            small.free()?;
            // The same request gets the freed memory back; what the side stream wrote into the
            // old buffer must not show up in the new one.
            let again = sh.malloc::<u8>(SMALL)?;
            ensure(again.addr() == addr, || {
                format!(
                    "the heap did not hand the freed memory back ({:#x}, then {addr:#x}): the \
                 check cannot tell",
                    again.addr()
                )
            })?;
            again.copy_from_host(&vec![0x55; SMALL])?;
            side.synchronize()?;
            let got = again.to_vec()?;
            let late = got.iter().filter(|&&b| b != 0x55).count();
            ensure(late == 0, || {
                format!(
                    "{late} bytes of the new buffer were overwritten by a kernel on the freed one"
                )
            })
        },
    );

    h.check(
        "threads: pools built and dropped, buffers freed, while another thread's kernels wait for the left PE",
        |_| {
            use nvshmem::channel::{Channel, ChannelConfig};
            use nvshmem::pool::{PagePool, PagePoolConfig};
            let sh = &c.shmem;
            const BUILDS: usize = 24;
            const ROUNDS: usize = 6000;
            const CHECK_EVERY: usize = 200;
            let limit = std::time::Duration::from_secs(10);
            // A ring of channels (made on every PE in the same order): thread B sends to the
            // right and receives from the left, so each of its receive kernels waits for a
            // launch on the left PE. A drop on thread A must not hold back B's launches until
            // the GPU is idle (cuModuleUnload, cuMemFree did): the GPU waits for the left PE,
            // which may be doing the same. The stress check met that hang; this narrower
            // pattern passed even before (the window is small), and guards what it can.
            let links: Vec<Channel<u64>> = (0..c.n)
                .map(|i| {
                    let config = ChannelConfig::new(i, (i + 1) % c.n, 1).depth(4);
                    Channel::new(sh, config.timeout(limit))
                })
                .collect::<nvshmem::Result<_>>()?;
            let (inbox, outbox) = (&links[c.left], &links[c.me]);
            let mine = c.upload(&[c.me as u64 + 1])?;
            let mut got = sh.alloc_device::<u64>(1)?;
            let ring = |got: &mut nvshmem::DeviceBuffer<u64>| -> crate::Result {
                let stream = sh.new_stream()?;
                for r in 1..=ROUNDS {
                    outbox.send(&mine, &stream)?;
                    inbox.recv(got, &stream)?;
                    if r % CHECK_EVERY == 0 {
                        stream.synchronize()?;
                        inbox.check()?;
                        outbox.check()?;
                        same("a message from the left PE", &got.to_vec()?, &[c.left as u64 + 1])?;
                    }
                }
                Ok(())
            };
            let churn = || -> crate::Result {
                for _ in 0..BUILDS {
                    drop(PagePool::new(sh, PagePoolConfig::new(4, 256))?);
                    drop(sh.alloc_device::<u64>(1 << 16)?);
                    sh.malloc::<u64>(1 << 10)?.free()?;
                }
                Ok(())
            };
            let (ring, churn) = std::thread::scope(|scope| {
                let b = scope.spawn(|| ring(&mut got).map_err(|e| format!("thread B: {e}")));
                let a = churn().map_err(|e| format!("thread A: {e}"));
                (b.join().unwrap_or_else(|_| Err("thread B panicked".into())), a)
            });
            let mut problems = Problems::default();
            problems.note(churn.map_err(Into::into));
            problems.note(ring.map_err(Into::into));
            problems.done()
        },
    );

    if c.n >= 2 {
        h.check(
            "free: a PE that cannot wait for its GPU (a capture on another thread) refuses it on every PE",
            |_| {
                let sh = &c.shmem;
                let buf = c.upload(&vec![7u32; 4096])?;
                // On PE 0 another thread captures a stream in the default (global) mode while
                // the free runs: PE 0's wait for its GPU is refused by CUDA. Before, PE 0
                // returned an error and the others hung in NVSHMEM's free.
                let freed = while_pe0_captures(c, || buf.free())?;
                let mut problems = Problems::default();
                problems.note(refused("a free while PE 0 captures on another thread", freed, |e| {
                    matches!(e, Error::FreeRefused { pe: 0, .. })
                }));
                // The heap, the agreement and the collectives still work on every PE.
                let n = 1 << 16;
                let x = c.upload(&vec![c.me as f32 + 1.0; n])?;
                let sum = sh.malloc::<f32>(n)?;
                c.world.all_reduce(&sum, &x, ReduceOp::Sum, &c.stream)?;
                c.sync()?;
                let want = (c.n * (c.n + 1) / 2) as f32;
                problems.note(same("all-reduce after the refused free", &sum.to_vec()?, &vec![want; n]));
                sum.free()?;
                x.free()?;
                problems.done()
            },
        );
    }

    if c.n >= 2 {
        h.check(
            "team drop: a member that cannot wait for its GPU (a capture on another thread) leaves the team in place on every member",
            |_| {
                let sh = &c.shmem;
                let team = c.world.split_strided(0, 1, c.n)?.ok_or("a PE outside a team of every PE")?;
                let old = team.handle();
                // Before, the others destroyed the team while PE 0 left it (or waited for
                // PE 0's sync until their bound, its copies refused under the capture).
                while_pe0_captures(c, || drop(team))?;
                // Kept on every member, the old team's handle is taken on every member: the
                // next split gets one handle, the same everywhere, and it works.
                let next = c.world.split_strided(0, 1, c.n)?.ok_or("a PE outside the next team")?;
                let mine = c.upload(&[next.handle() as i64])?;
                let (low, high) = (sh.malloc::<i64>(1)?, sh.malloc::<i64>(1)?);
                c.world.all_reduce(&low, &mine, ReduceOp::Min, &c.stream)?;
                c.world.all_reduce(&high, &mine, ReduceOp::Max, &c.stream)?;
                c.sync()?;
                let mut problems = Problems::default();
                let (low, high) = (low.to_vec()?[0], high.to_vec()?[0]);
                if low != high {
                    problems.note(Err(format!("the next split's handle differs across PEs ({low} to {high})").into()));
                }
                if next.handle() == old {
                    problems.note(Err(format!("the next split took the kept team's handle {old}").into()));
                }
                problems.note(sh.barrier(&next).map_err(Into::into));
                problems.done()
            },
        );
    }

    h.check(
        "heap: refused allocations leave the heap and the job usable",
        |_| {
            let sh = &c.shmem;
            let mut problems = Problems::default();
            // More than any GPU's heap may reserve (NVSHMEM_MAX_MEMORY_PER_GPU, 128 GiB by
            // default; NVSHMEM itself would take the job down), or a fixed heap holds.
            problems.note(refused(
                "a 1 TiB allocation",
                sh.malloc::<u8>(1 << 40),
                |e| {
                    matches!(
                        e,
                        Error::HeapExhausted {
                            limit: HeapLimit::MaxMemoryPerGpu(_) | HeapLimit::SymmetricSize(_),
                            ..
                        }
                    )
                },
            ));
            // More than the GPU has free, under that maximum where the GPU is small enough.
            // The same request on every PE: the most any GPU has free.
            let (free, _) = cu::mem_get_info()?;
            let mine = c.upload(&[free as u64])?;
            let most = sh.malloc::<u64>(1)?;
            c.world.all_reduce(&most, &mine, ReduceOp::Max, &c.stream)?;
            c.sync()?;
            let free = most.to_vec()?[0] as usize;
            drop((mine, most));
            problems.note(refused(
                "an allocation of the GPU's free memory and 1 GiB",
                sh.malloc::<u8>(free + (1 << 30)),
                |e| {
                    matches!(
                        e,
                        Error::HeapExhausted {
                            limit: HeapLimit::GpuMemory(_)
                                | HeapLimit::MaxMemoryPerGpu(_)
                                | HeapLimit::SymmetricSize(_),
                            ..
                        }
                    )
                },
            ));
            // The heap and the collectives still work.
            let n = 1 << 20;
            let x = c.upload(&vec![c.me as f32 + 1.0; n])?;
            let sum = sh.malloc::<f32>(n)?;
            c.world.all_reduce(&sum, &x, ReduceOp::Sum, &c.stream)?;
            c.sync()?;
            let want = (c.n * (c.n + 1) / 2) as f32;
            problems.note(same(
                "all-reduce after the refusals",
                &sum.to_vec()?,
                &vec![want; n],
            ));
            problems.done()
        },
    );

    h.check(
        "heap: the model counts NVSHMEM's own blocks and places buffers where NVSHMEM does",
        |_| {
            let sh = &c.shmem;
            let before = sh.heap_usage();
            let mut problems = Problems::default();
            if before.nvshmem == 0 || before.nvshmem >= 64 << 30 {
                problems.note(Err(format!(
                    "NVSHMEM's own blocks measured as {} bytes",
                    before.nvshmem
                )
                .into()));
            }
            // Blocks of 512-byte steps, an alignment on top, and a freed gap filled first.
            let a = sh.malloc::<u8>(1)?;
            let b = sh.malloc_aligned::<u8>(4096, 10_000)?;
            let big = sh.malloc::<u8>((3 << 20) + 7)?;
            drop(b);
            let d = sh.malloc::<u8>(700)?;
            let after = sh.heap_usage();
            let want = 512 + ((3 << 20) + 512) + 1024;
            if after.buffers != before.buffers + want {
                problems.note(Err(format!(
                    "the buffers take {} bytes more, not {want}",
                    after.buffers - before.buffers
                )
                .into()));
            }
            // An aligned block takes its length and the alignment, less the pad before it;
            // a small block after it may go into that pad.
            let e = sh.malloc_aligned::<u8>(65536, 100)?;
            let f = sh.malloc::<u8>(512)?;
            let grown = sh.heap_usage().buffers - after.buffers;
            if !(66048 - 65536 + 512..=66048 + 512).contains(&grown) {
                problems.note(Err(format!(
                    "an aligned block and a small one took {grown} bytes"
                )
                .into()));
            }
            let after = sh.heap_usage();
            if !after.placements_as_predicted {
                problems.note(Err(
                    "a buffer landed elsewhere than the heap model put it".into()
                ));
            }
            if after.mapped < before.nvshmem + after.buffers || after.nvshmem != before.nvshmem {
                problems.note(Err(format!("{after:?} after {before:?}").into()));
            }
            drop((a, big, d, e, f));
            let end = sh.heap_usage();
            if end.buffers != before.buffers {
                problems.note(Err(format!(
                    "{} buffer bytes left, not {}",
                    end.buffers, before.buffers
                )
                .into()));
            }
            problems.done()
        },
    );

    h.check("collectives: calls checked across PEs; different lengths refused everywhere", |_| {
        let sh = &c.shmem;
        let mut config = CollectivesConfig::for_pes(c.n);
        config.check_calls = true;
        let coll = Collectives::with_config(sh, config)?;
        let n = 2000;
        let x = c.upload(&vec![1.0f32; n])?;
        let y = sh.malloc::<f32>(n)?;
        let mut problems = Problems::default();
        if c.n >= 2 {
            // PE 0 passes half the length the others pass.
            let len = if c.me == 0 { n / 2 } else { n };
            let r = coll.all_reduce(y.view(..len), x.view(..len), ReduceOp::Sum, AllReduceAlgo::Auto, &c.stream);
            problems.note(refused("all_reduce with PE 0 passing 1000 elements and the others 2000", r, |e| {
                matches!(e, Error::CollectiveMismatch(m) if m.contains("1000 elements") && m.contains("2000 elements"))
            }));
        }
        // Calls the PEs agree on run, and are right.
        coll.all_reduce(&y, &x, ReduceOp::Sum, AllReduceAlgo::Auto, &c.stream)?;
        c.sync()?;
        problems.note(same("checked all-reduce", &y.to_vec()?, &vec![c.n as f32; n]));
        problems.done()
    });

    if c.n >= 2 {
        h.check("collectives: a different configuration on one PE is refused everywhere", |_| {
            let mut config = CollectivesConfig::for_pes(c.n);
            if c.me == 1 {
                config.thresholds.oneshot_max_bytes += 16;
            }
            let made = Collectives::with_config(&c.shmem, config).map(|_| ());
            refused("Collectives with PE 1's one-shot threshold 16 bytes higher", made, |e| {
                matches!(e, Error::CollectiveMismatch(m) if m.contains("PE 1 makes Collectives with configuration"))
            })
        });
    }
}

/// Run `f` on every PE while, on PE 0, another thread captures a stream in the default
/// (global) mode, under which CUDA refuses PE 0's waits for its GPU.
fn while_pe0_captures<R>(
    c: &Ctx,
    f: impl FnOnce() -> R,
) -> std::result::Result<R, Box<dyn std::error::Error>> {
    use nvshmem::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (began_tx, began_rx) = std::sync::mpsc::channel::<std::result::Result<(), String>>();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let side = c.shmem.new_stream()?;
    std::thread::scope(|scope| {
        if c.me == 0 {
            let side = &side;
            scope.spawn(move || {
                let began = side
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
                    .map_err(|e| format!("{e:?}"));
                let capturing = began.is_ok();
                let _ = began_tx.send(began);
                let _ = end_rx.recv();
                if capturing {
                    let _ = side.end_capture(CUgraphInstantiate_flags(0));
                }
            });
            began_rx
                .recv()
                .map_err(|_| "the capturing thread died")?
                .map_err(|e| format!("PE 0 could not begin a capture: {e}"))?;
        }
        let done = f();
        let _ = end_tx.send(());
        Ok(done)
    })
}
