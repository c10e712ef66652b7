//! A pipeline of one stage per PE passing micro-batches through channels, and the GPU checks
//! of `nvshmem::channel`.
//!
//! ```text
//! scripts/nvshmrun -np 4 target/release/pipeline
//! ```
//!
//! PE 0 feeds micro-batches of varying sizes into the first stage and drains the last. Every
//! stage is one persistent kernel (checks/kernels/pipeline_stage.cu, a user's kernel that
//! includes `nvshmem_rs/channel.cuh`) that pops a micro-batch, transforms it and pushes it to
//! the next PE's stage, with no host in between; the result is checked against the same
//! transforms on the CPU, for the block, warp and thread functions and the in-place (peek)
//! pop. The host API is checked around it: messages of every size up to a multi-block one,
//! flow control with a consumer that starts late, `try_recv`, CUDA graph replay, the errors,
//! the bound on every wait (a receive with no sender, a send into a full channel, a drop with
//! a receive still waiting) and two threads at each end at once, on streams of their own.
//! Prints `N passed, M failed` on PE 0 and exits non-zero if anything failed.

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use nvshmem::module::{grid, KernelArgs, Module};
use nvshmem::{ChannelWait, CudaStream, DeviceBuffer, Error, Nvshmem, ReduceOp, Result};
use std::time::{Duration, Instant};

use nvshmem_checks::graph;
use nvshmem_checks::splitmix;

use graph::capture;

use nvshmem_checks::kernels;

/// What stage `s` does to each element (`stage_op` in pipeline_stage.cu).
fn stage_op(x: u32, s: u32) -> u32 {
    x.wrapping_mul(3).wrapping_add(s + 1)
}

/// Random words, seeded by the check and the PE.
fn random_words(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = splitmix::SplitMix64(seed);
    (0..len).map(|_| rng.next_u64() as u32).collect()
}

fn cuda<T>(
    call: &'static str,
    r: std::result::Result<T, nvshmem::cudarc::driver::DriverError>,
) -> Result<T> {
    r.map_err(|source| Error::Cuda { call, source })
}

fn sync(stream: &CudaStream) -> Result<()> {
    cuda("cuStreamSynchronize", stream.synchronize())
}

fn fail(what: String) -> Result<()> {
    Err(Error::InvalidArgument(what))
}

/// `got[..want.len()]` is `want`, and the rest is still `fill`.
fn compare(what: &str, got: &[u32], want: &[u32], fill: u32) -> Result<()> {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want.get(i).copied().unwrap_or(fill)) {
        let expected = want.get(i).copied().unwrap_or(fill);
        return fail(format!(
            "{what}: element {i} of {} is {:#x}, expected {expected:#x} (message of {})",
            got.len(),
            got[i],
            want.len()
        ));
    }
    Ok(())
}

const FILL: u32 = 0xDEAD_BEEF;

struct Checks {
    shmem: Nvshmem,
    names: Vec<String>,
    failed: Vec<i32>,
}

impl Checks {
    fn run(&mut self, name: &str, f: impl FnOnce(&Nvshmem) -> Result<()>) {
        let outcome = f(&self.shmem);
        if let Err(e) = &outcome {
            eprintln!("[PE {}] FAIL {name}: {e}", self.shmem.my_pe());
        }
        if let Err(e) = self.shmem.barrier_all() {
            eprintln!("[PE {}] barrier after {name}: {e}", self.shmem.my_pe());
        }
        self.names.push(name.to_string());
        self.failed.push(outcome.is_err() as i32);
    }

    /// (passed, failed) over every PE: a check fails if it failed anywhere.
    fn finish(&self) -> Result<(usize, usize)> {
        let mine = self.shmem.malloc::<i32>(self.failed.len())?;
        let all = self.shmem.malloc::<i32>(self.failed.len())?;
        mine.copy_from_host(&self.failed)?;
        let world = self.shmem.team_world();
        world.all_reduce(&all, &mine, ReduceOp::Max, self.shmem.stream())?;
        sync(self.shmem.stream())?;
        let all = all.to_vec()?;
        for (name, f) in self.names.iter().zip(&all) {
            if *f != 0 && self.shmem.my_pe() == 0 {
                eprintln!("failed: {name}");
            }
        }
        let failed = all.iter().filter(|f| **f != 0).count();
        Ok((all.len() - failed, failed))
    }
}

/// Messages of `lens` from every PE to the next through one channel each (a loopback on
/// one PE), the receives made `delay` after the sends (so with `depth` below the number of
/// messages the producer must wait for credit), each into its own region.
fn ring_messages(
    shmem: &Nvshmem,
    seed: u64,
    max_len: usize,
    depth: usize,
    lens: &[usize],
    delay: Duration,
) -> Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let ring = (0..n)
        .map(|i| {
            Channel::<u32>::new(
                shmem,
                ChannelConfig::new(i, (i + 1) % n, max_len).depth(depth),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let (out, inc) = (&ring[me], &ring[(me + n - 1) % n]);
    let prev = (me + n - 1) % n;
    let message =
        |pe: usize, k: usize| random_words(seed ^ ((pe as u64) << 32) ^ k as u64, lens[k]);
    // Every message's source stays allocated until its send has run (symmetric, so that a
    // view can be taken of its first elements; every PE allocates alike).
    let sources = lens
        .iter()
        .enumerate()
        .map(|(k, _)| {
            let b = shmem.calloc::<u32>(max_len)?;
            let mut words = message(me, k);
            words.resize(max_len, 0);
            b.copy_from_host(&words)?;
            Ok(b)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut dsts = (0..lens.len())
        .map(|_| {
            let b = shmem.alloc_device::<u32>(max_len)?;
            b.copy_from_host(&vec![FILL; max_len])?;
            Ok(b)
        })
        .collect::<Result<Vec<DeviceBuffer<u32>>>>()?;
    let (send_stream, recv_stream) = (shmem.new_stream()?, shmem.new_stream()?);
    for (k, src) in sources.iter().enumerate() {
        out.send(&src.view(..lens[k]), &send_stream)?;
    }
    std::thread::sleep(delay);
    let mut last = 0;
    for (k, dst) in dsts.iter_mut().enumerate() {
        inc.recv(dst, &recv_stream)?;
        if k == lens.len() - 1 {
            last = inc.last_len(&recv_stream)?;
        }
    }
    sync(&send_stream)?;
    sync(&recv_stream)?;
    for (k, dst) in dsts.iter().enumerate() {
        compare(
            &format!("message {k} from PE {prev}"),
            &dst.to_vec()?,
            &message(prev, k),
            FILL,
        )?;
    }
    if last != lens[lens.len() - 1] {
        return fail(format!(
            "last_len is {last}, the last message had {}",
            lens[lens.len() - 1]
        ));
    }
    Ok(())
}

/// The pipeline: PE 0 feeds `batches` micro-batches into stage 0, stage i (on PE i) pushes
/// to stage i + 1, and the last stage's output drains back to PE 0. `mode` picks the stage's
/// device functions (pipeline_stage.cu). Returns, on PE 0, the wall time from the stage's
/// launch to the last micro-batch drained.
fn pipeline(shmem: &Nvshmem, seed: u64, mode: u32, batches: usize) -> Result<Duration> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let max_len = 3000;
    let depth = 3;
    // feed: PE 0 -> stage 0; link i: stage i -> stage i + 1; drain: the last stage -> PE 0.
    let feed = Channel::<u32>::new(shmem, ChannelConfig::new(0, 0, max_len).depth(depth))?;
    let links = (0..n - 1)
        .map(|i| Channel::<u32>::new(shmem, ChannelConfig::new(i, i + 1, max_len).depth(depth)))
        .collect::<Result<Vec<_>>>()?;
    let drain = Channel::<u32>::new(shmem, ChannelConfig::new(n - 1, 0, max_len).depth(depth))?;
    let input = if me == 0 { &feed } else { &links[me - 1] };
    let output = if me == n - 1 { &drain } else { &links[me] };
    let lens: Vec<usize> = (0..batches).map(|k| 1 + (k * 977 + 13) % max_len).collect();

    let module = Module::load(shmem, &kernels::PIPELINE_STAGE)?;
    let stage = module.function("pipeline_stage")?;
    let stage_buf = shmem.alloc_device::<u32>(max_len)?;
    let stage_stream = shmem.new_stream()?;
    let threads = match mode {
        1 => 32,
        2 => 1,
        _ => 256,
    };
    let mut args = KernelArgs::new();
    args.value(input.handle())
        .value(output.handle())
        .device_ptr(stage_buf.addr())
        .value(max_len as u32)
        .value(batches as u32)
        .value(me as u32)
        .value(mode);
    // PE 0's micro-batches and output buffers, ready before the clock starts.
    let batch = |k: usize| random_words(seed ^ k as u64, lens[k]);
    let mut sources = Vec::new();
    let mut outs = Vec::new();
    if me == 0 {
        for (k, &len) in lens.iter().enumerate() {
            let b = shmem.alloc_device::<u32>(len)?;
            b.copy_from_host(&batch(k))?;
            sources.push(b);
            let o = shmem.alloc_device::<u32>(max_len)?;
            o.copy_from_host(&vec![FILL; max_len])?;
            outs.push(o);
        }
    }
    shmem.barrier_all()?;
    let start = Instant::now();
    // SAFETY: the arguments match pipeline_stage's parameters; the channels and the buffer
    // outlive the kernel, which is waited for below.
    unsafe { stage.launch(grid(1, threads), &stage_stream, &mut args)? };

    let mut result = Ok(());
    let mut elapsed = Duration::ZERO;
    if me == 0 {
        let (feed_stream, drain_stream) = (shmem.new_stream()?, shmem.new_stream()?);
        for src in &sources {
            feed.send(src, &feed_stream)?;
        }
        for dst in outs.iter_mut() {
            drain.recv(dst, &drain_stream)?;
        }
        sync(&feed_stream)?;
        sync(&drain_stream)?;
        // Host enqueues included: the wall time of the whole hand-off chain.
        elapsed = start.elapsed();
        for (k, out) in outs.iter().enumerate() {
            let want: Vec<u32> = batch(k)
                .into_iter()
                .map(|x| (0..n as u32).fold(x, stage_op))
                .collect();
            result = result.and(compare(
                &format!("micro-batch {k}"),
                &out.to_vec()?,
                &want,
                FILL,
            ));
        }
    }
    sync(&stage_stream)?;
    // A stage whose wait gave up left the reason in its channels.
    input.check()?;
    output.check()?;
    result.map(|()| elapsed)
}

/// try_recv: nothing waiting is `false` without a receive; a message that has arrived is
/// `true` and received.
fn try_recv(shmem: &Nvshmem, seed: u64) -> Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let ring = (0..n)
        .map(|i| Channel::<u32>::new(shmem, ChannelConfig::new(i, (i + 1) % n, 64).depth(2)))
        .collect::<Result<Vec<_>>>()?;
    let (out, inc) = (&ring[me], &ring[(me + n - 1) % n]);
    let stream = shmem.stream();
    let mut dst = shmem.alloc_device::<u32>(64)?;
    dst.copy_from_host(&vec![FILL; 64])?;
    if inc.try_recv(&mut dst, stream)? {
        return fail("try_recv received before anything was sent".into());
    }
    shmem.barrier_all()?;
    let src = shmem.alloc_device::<u32>(64)?;
    src.copy_from_host(&random_words(seed ^ me as u64, 64))?;
    out.send(&src, stream)?;
    sync(stream)?;
    // The sends are complete everywhere (the barrier includes a quiet).
    shmem.barrier_all()?;
    if !inc.try_recv(&mut dst, stream)? {
        return fail("try_recv found no message after the sender finished".into());
    }
    sync(stream)?;
    compare(
        "try_recv",
        &dst.to_vec()?,
        &random_words(seed ^ ((me + n - 1) % n) as u64, 64),
        FILL,
    )?;
    if inc.try_recv(&mut dst, stream)? {
        return fail("try_recv received a second message when one was sent".into());
    }
    Ok(())
}

/// Sends and receives captured in CUDA graphs, replayed with new data: each replay moves the
/// next messages.
fn graph_replay(shmem: &Nvshmem, seed: u64) -> Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let (len, per_graph) = (1000, 3);
    let ring = (0..n)
        .map(|i| Channel::<u32>::new(shmem, ChannelConfig::new(i, (i + 1) % n, len).depth(2)))
        .collect::<Result<Vec<_>>>()?;
    let (out, inc) = (&ring[me], &ring[(me + n - 1) % n]);
    let srcs = (0..per_graph)
        .map(|_| shmem.alloc_device::<u32>(len))
        .collect::<Result<Vec<_>>>()?;
    let mut dsts = (0..per_graph)
        .map(|_| shmem.alloc_device::<u32>(len))
        .collect::<Result<Vec<_>>>()?;
    let (send_stream, recv_stream) = (shmem.new_stream()?, shmem.new_stream()?);
    let sends = capture(&send_stream, || {
        srcs.iter().try_for_each(|s| out.send(s, &send_stream))
    })?;
    let recvs = capture(&recv_stream, || {
        dsts.iter_mut().try_for_each(|d| inc.recv(d, &recv_stream))
    })?;
    // Capturing ran nothing: try_recv during a capture is refused.
    cuda(
        "cuStreamBeginCapture",
        recv_stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
    )?;
    let refused = inc.try_recv(&mut dsts[0], &recv_stream);
    let _ = cuda(
        "cuStreamEndCapture",
        recv_stream.end_capture(CUgraphInstantiate_flags(0)),
    );
    if refused.is_ok() {
        return fail("try_recv during a capture was accepted".into());
    }
    let prev = (me + n - 1) % n;
    for replay in 0..3u64 {
        let words = |pe: usize, k: usize| {
            random_words(seed ^ (replay << 40) ^ ((pe as u64) << 20) ^ k as u64, len)
        };
        for (k, s) in srcs.iter().enumerate() {
            s.copy_from_host(&words(me, k))?;
        }
        for d in &dsts {
            d.copy_from_host(&vec![FILL; len])?;
        }
        // The fills are done on every PE before any replay sends.
        shmem.barrier_all()?;
        cuda("cuGraphLaunch", sends.launch())?;
        cuda("cuGraphLaunch", recvs.launch())?;
        sync(&send_stream)?;
        sync(&recv_stream)?;
        for (k, d) in dsts.iter().enumerate() {
            compare(
                &format!("replay {replay}, message {k}"),
                &d.to_vec()?,
                &words(prev, k),
                FILL,
            )?;
        }
        // Everyone has read its messages before the sources are refilled.
        shmem.barrier_all()?;
    }
    Ok(())
}

/// Each wrong use is the documented error, on the PE that makes it, and nothing is sent.
fn errors(shmem: &Nvshmem) -> Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let expect = |what: &str, r: Result<()>, ok: fn(&Error) -> bool| -> Result<()> {
        match r {
            Err(e) if ok(&e) => Ok(()),
            Err(e) => fail(format!("{what}: unexpected error {e}")),
            Ok(()) => fail(format!("{what} was accepted")),
        }
    };
    expect(
        "a producer out of range",
        Channel::<u32>::new(shmem, ChannelConfig::new(n, 0, 8).depth(2)).map(drop),
        |e| matches!(e, Error::PeOutOfRange { .. }),
    )?;
    expect(
        "a channel of no slots",
        Channel::<u32>::new(shmem, ChannelConfig::new(0, 0, 8).depth(0)).map(drop),
        |e| e.to_string().contains("at least one slot"),
    )?;
    let ch = Channel::<u32>::new(shmem, ChannelConfig::new(0, n - 1, 16).depth(2))?;
    let big = shmem.calloc::<u32>(17)?;
    let mut small = shmem.alloc_device::<u32>(15)?;
    let stream = shmem.stream();
    if me == 0 {
        expect("a message larger than a slot", ch.send(&big, stream), |e| {
            e.to_string().contains("larger than the channel's slots")
        })?;
    } else {
        expect(
            "a send on the consumer",
            ch.send(&big.view(..4), stream),
            |e| matches!(e, Error::WrongPe { expected: 0, .. }),
        )?;
    }
    if me == n - 1 {
        expect(
            "a receive buffer smaller than max_len",
            ch.recv(&mut small, stream),
            |e| {
                matches!(
                    e,
                    Error::Length {
                        expected: 16,
                        got: 15,
                        ..
                    }
                )
            },
        )?;
    } else {
        expect(
            "a receive on the producer",
            ch.recv(&mut small, stream),
            |e| matches!(e, Error::WrongPe { .. }),
        )?;
    }
    Ok(())
}

/// The bound of the checks of a peer that does not come.
const SHORT_BOUND: Duration = Duration::from_secs(2);
/// What a wait that gives up may take beyond its bound (the first look at the clock, a
/// launch, a synchronisation).
const SLACK: Duration = Duration::from_secs(2);

/// `r` is the channel's timeout of a wait for PE `pe` at `site`, for message `message`.
fn expect_timeout<V: std::fmt::Debug>(
    what: &str,
    r: Result<V>,
    pe: usize,
    site: ChannelWait,
    message: u64,
) -> Result<()> {
    match r {
        Err(Error::ChannelTimeout {
            waited_for,
            site: s,
            message: m,
            ..
        }) if (waited_for, s, m) == (pe, site, message) => Ok(()),
        Err(e) => fail(format!(
            "{what}: {e}; expected a timeout of a wait for PE {pe} ({site:?}, message #{message})"
        )),
        Ok(v) => fail(format!("{what} returned {v:?}; expected a timeout")),
    }
}

/// `took` is the bound, give or take the slack.
fn within_bound(what: &str, took: Duration) -> Result<()> {
    if took < SHORT_BOUND.mul_f64(0.9) || took > SHORT_BOUND + SLACK {
        return fail(format!(
            "{what} took {took:.2?}; the bound is {SHORT_BOUND:?}"
        ));
    }
    Ok(())
}

/// A receive whose producer never sends gives up within the bound with the error that names
/// the producer, takes nothing, and every later call fails at once; the channel then drops at
/// once on every PE.
fn recv_without_sender(shmem: &Nvshmem) -> Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let (producer, consumer) = (0, n - 1);
    let config = ChannelConfig::new(producer, consumer, 64).timeout(SHORT_BOUND);
    let ch = Channel::<u32>::new(shmem, config)?;
    let on_consumer = || -> Result<()> {
        let stream = shmem.new_stream()?;
        let mut dst = shmem.alloc_device::<u32>(64)?;
        dst.copy_from_host(&vec![FILL; 64])?;
        let began = Instant::now();
        ch.recv(&mut dst, &stream)?;
        let waited = ch.last_len(&stream);
        let took = began.elapsed();
        expect_timeout("last_len", waited, producer, ChannelWait::Message, 0)?;
        within_bound("the receive", took)?;
        let began = Instant::now();
        let message = ChannelWait::Message;
        expect_timeout(
            "recv after",
            ch.recv(&mut dst, &stream),
            producer,
            message,
            0,
        )?;
        let tried = ch.try_recv(&mut dst, &stream);
        expect_timeout("try_recv after", tried, producer, message, 0)?;
        expect_timeout("check", ch.check(), producer, message, 0)?;
        if began.elapsed() > Duration::from_millis(200) {
            return fail(format!(
                "the calls after the timeout took {:.2?}: they must fail at once",
                began.elapsed()
            ));
        }
        compare("the receive that gave up", &dst.to_vec()?, &[], FILL)
    };
    let outcome = if me == consumer {
        on_consumer()
    } else {
        ch.check()
    };
    shmem.barrier_all()?;
    let began = Instant::now();
    drop(ch);
    if began.elapsed() > SHORT_BOUND {
        return fail(format!("the drop took {:.2?}", began.elapsed()));
    }
    outcome
}

/// A receive with no sender, then a drop at once: the drop waits for the receive to give up
/// (within the bound), not for ever, frees the channel on every PE, and the runtime goes on.
fn drop_while_receiving(shmem: &Nvshmem) -> Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let config = ChannelConfig::new(0, n - 1, 64).timeout(SHORT_BOUND);
    let ch = Channel::<u32>::new(shmem, config)?;
    let stream = shmem.new_stream()?;
    let mut dst = shmem.alloc_device::<u32>(64)?;
    if me == n - 1 {
        ch.recv(&mut dst, &stream)?;
    }
    let began = Instant::now();
    drop(ch);
    let took = began.elapsed();
    // Twice the bound and a second, as the drop waits at most (the peers wait in its free for
    // the consumer's).
    if took > 2 * SHORT_BOUND + Duration::from_secs(1) + SLACK {
        return fail(format!("the drop took {took:.2?}"));
    }
    // Not stranded: a collective allocation still works.
    shmem.calloc::<u32>(16)?.free()
}

/// A send into a full channel whose consumer does not receive gives up within the bound with
/// the error that names the consumer, and later calls fail at once; the messages sent before it
/// are intact, and the consumer still receives them.
fn send_into_full_channel(shmem: &Nvshmem, seed: u64) -> Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let (producer, consumer, depth, len) = (0, n - 1, 2, 64);
    let config = ChannelConfig::new(producer, consumer, len)
        .depth(depth)
        .timeout(SHORT_BOUND);
    let ch = Channel::<u32>::new(shmem, config)?;
    let message = |k: usize| random_words(seed ^ k as u64, len);
    let stream = shmem.new_stream()?;
    let on_producer = || -> Result<()> {
        let srcs = (0..=depth)
            .map(|k| {
                let b = shmem.alloc_device::<u32>(len)?;
                b.copy_from_host(&message(k))?;
                Ok(b)
            })
            .collect::<Result<Vec<_>>>()?;
        let began = Instant::now();
        for src in &srcs {
            ch.send(src, &stream)?;
        }
        sync(&stream)?;
        within_bound("the send into a full channel", began.elapsed())?;
        let slot = ChannelWait::Slot;
        expect_timeout("check", ch.check(), consumer, slot, depth as u64)?;
        let began = Instant::now();
        expect_timeout(
            "send after",
            ch.send(&srcs[0], &stream),
            consumer,
            slot,
            depth as u64,
        )?;
        if began.elapsed() > Duration::from_millis(200) {
            return fail(format!(
                "a send after the timeout took {:.2?}",
                began.elapsed()
            ));
        }
        Ok(())
    };
    let sent = if me == producer {
        on_producer()
    } else {
        Ok(())
    };
    shmem.barrier_all()?;
    // The messages before the one that gave up are there (on another PE than the producer's,
    // whose waits on the channel have stopped).
    let received = if me == consumer && consumer != producer {
        (|| -> Result<()> {
            let mut dst = shmem.alloc_device::<u32>(len)?;
            for k in 0..depth {
                dst.copy_from_host(&vec![FILL; len])?;
                ch.recv(&mut dst, &stream)?;
                sync(&stream)?;
                ch.check()?;
                compare(&format!("message {k}"), &dst.to_vec()?, &message(k), FILL)?;
            }
            if ch.try_recv(&mut dst, &stream)? {
                return fail("a message that was never sent arrived".into());
            }
            Ok(())
        })()
    } else {
        Ok(())
    };
    shmem.barrier_all()?;
    sent.and(received)
}

/// Two threads send on one channel at once, each on a stream of its own, and two receive at
/// once on theirs: every message arrives once and intact, and each sender's in the order sent.
fn concurrent_ends(shmem: &Nvshmem, seed: u64) -> Result<()> {
    const THREADS: u32 = 2;
    const PER_THREAD: u32 = 48;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let (producer, consumer, max_len) = (0, n - 1, 20_000);
    // A message lost to a race is a timeout, not a hang.
    let config = ChannelConfig::new(producer, consumer, max_len)
        .depth(3)
        .timeout(Duration::from_secs(20));
    let ch = Channel::<u32>::new(shmem, config)?;
    // Message k of sender t: its sender and number, then random words; from one word to
    // several blocks' worth.
    let message = |t: u32, k: u32| {
        let len = 2 + (k as usize * 7919 + t as usize * 3517) % (max_len - 1);
        let mut words = vec![t, k];
        words.extend(random_words(seed ^ ((t as u64) << 32) ^ k as u64, len - 2));
        words
    };
    // Every thread of this PE starts its calls at once (after its set-up, failed or not).
    let threads = THREADS as usize * (usize::from(me == producer) + usize::from(me == consumer));
    let start = std::sync::Barrier::new(threads);
    let send = |t: u32| -> Result<()> {
        let srcs = (0..PER_THREAD)
            .map(|k| {
                let words = message(t, k);
                let b = shmem.alloc_device::<u32>(words.len())?;
                b.copy_from_host(&words)?;
                Ok(b)
            })
            .collect::<Result<Vec<_>>>();
        let stream = shmem.new_stream();
        start.wait();
        let (srcs, stream) = (srcs?, stream?);
        for src in &srcs {
            ch.send(src, &stream)?;
        }
        sync(&stream)?;
        ch.check()
    };
    let receive = || -> Result<Vec<Vec<u32>>> {
        let dsts = (0..PER_THREAD)
            .map(|_| {
                let b = shmem.alloc_device::<u32>(max_len)?;
                b.copy_from_host(&vec![FILL; max_len])?;
                Ok(b)
            })
            .collect::<Result<Vec<_>>>();
        let stream = shmem.new_stream();
        start.wait();
        let (mut dsts, stream) = (dsts?, stream?);
        for dst in dsts.iter_mut() {
            ch.recv(dst, &stream)?;
        }
        sync(&stream)?;
        ch.check()?;
        dsts.iter().map(|d| d.to_vec()).collect()
    };
    let (send, receive) = (&send, &receive);
    let (sent, received) = std::thread::scope(|s| {
        let senders: Vec<_> = (0..THREADS)
            .filter(|_| me == producer)
            .map(|t| s.spawn(move || send(t)))
            .collect();
        let receivers: Vec<_> = (0..THREADS)
            .filter(|_| me == consumer)
            .map(|_| s.spawn(receive))
            .collect();
        let sent = senders
            .into_iter()
            .try_for_each(|h| h.join().expect("a sending thread panicked"));
        let received = receivers
            .into_iter()
            .map(|h| h.join().expect("a receiving thread panicked"))
            .collect::<Result<Vec<_>>>();
        (sent, received)
    });
    sent?;
    let received = received?;
    if me != consumer {
        return Ok(());
    }
    let mut seen = vec![vec![false; PER_THREAD as usize]; THREADS as usize];
    for (r, got) in received.iter().enumerate() {
        let mut next = [0u32; THREADS as usize];
        for buf in got {
            let (t, k) = (buf[0], buf[1]);
            if t >= THREADS || k >= PER_THREAD {
                return fail(format!(
                    "receiver {r} got a message headed ({t:#x}, {k:#x}): not one that was sent"
                ));
            }
            if std::mem::replace(&mut seen[t as usize][k as usize], true) {
                return fail(format!("message {k} of sender {t} arrived twice"));
            }
            if k < next[t as usize] {
                return fail(format!(
                    "receiver {r} got message {k} of sender {t} after message {}",
                    next[t as usize] - 1
                ));
            }
            next[t as usize] = k + 1;
            compare(
                &format!("message {k} of sender {t}"),
                buf,
                &message(t, k),
                FILL,
            )?;
        }
    }
    Ok(())
}

fn main() {
    let shmem = match Nvshmem::init() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pipeline: {e}");
            std::process::exit(2);
        }
    };
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    if me == 0 {
        println!(
            "pipeline: {n} PEs; {}",
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    let mut c = Checks {
        shmem: shmem.clone(),
        names: Vec::new(),
        failed: Vec::new(),
    };
    let none = Duration::ZERO;
    c.run("one message of every small length, and empty ones", |s| {
        ring_messages(
            s,
            1,
            64,
            4,
            &(0..=64).chain([0, 1, 63]).collect::<Vec<_>>(),
            none,
        )
    });
    c.run("messages up to 4 MiB (multi-block)", |s| {
        ring_messages(
            s,
            2,
            1 << 20,
            2,
            &[1 << 20, (1 << 20) - 5, 65_537, 3, 1 << 20],
            none,
        )
    });
    c.run(
        "depth 2, 24 messages, consumer 50 ms late (flow control)",
        |s| {
            ring_messages(
                s,
                3,
                1000,
                2,
                &(0..24).map(|k| 1000 - k * 17).collect::<Vec<_>>(),
                Duration::from_millis(50),
            )
        },
    );
    c.run("multi-block messages with the consumer late", |s| {
        ring_messages(s, 4, 300_000, 2, &[300_000; 6], Duration::from_millis(50))
    });
    c.run("try_recv", |s| try_recv(s, 5));
    c.run("graph replay", |s| graph_replay(s, 6));
    c.run("errors", errors);
    c.run(
        "a receive with no sender gives up within the bound",
        recv_without_sender,
    );
    c.run(
        "a drop while a receive waits for no sender",
        drop_while_receiving,
    );
    c.run(
        "a send into a full channel gives up within the bound",
        |s| send_into_full_channel(s, 7),
    );
    c.run("two threads at each end, on streams of their own", |s| {
        concurrent_ends(s, 8)
    });
    for (mode, name) in [(0, "block"), (1, "warp"), (2, "thread"), (3, "block, peek")] {
        c.run(&format!("pipeline of {n} stages, {name} functions"), |s| {
            let t = pipeline(s, 100 + mode as u64, mode, 64)?;
            if s.my_pe() == 0 {
                println!(
                    "  pipeline ({name}): 64 micro-batches through {n} stages in {:.2} ms",
                    t.as_secs_f64() * 1e3
                );
            }
            Ok(())
        });
    }
    match c.finish() {
        Ok((passed, failed)) => {
            if me == 0 {
                println!("{passed} passed, {failed} failed");
            }
            std::process::exit((failed > 0) as i32);
        }
        Err(e) => {
            eprintln!("pipeline: PE {me}: {e}");
            std::process::exit(2);
        }
    }
}
