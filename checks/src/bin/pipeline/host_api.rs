//! The host API of a channel: messages of every size round a ring of PEs, flow control with a
//! late consumer, `try_recv`, CUDA graph replay and the errors of wrong uses.

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use nvshmem::{DeviceBuffer, Error, Nvshmem, Result};
use std::time::Duration;

use nvshmem_checks::graph::capture;

use crate::harness::{compare, cuda, fail, random_words, sync, FILL};

/// Messages of `lens` from every PE to the next through one channel each (a loopback on
/// one PE), the receives made `delay` after the sends (so with `depth` below the number of
/// messages the producer must wait for credit), each into its own region.
pub(crate) fn ring_messages(
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

/// try_recv: nothing waiting is `false` without a receive; a message that has arrived is
/// `true` and received.
pub(crate) fn try_recv(shmem: &Nvshmem, seed: u64) -> Result<()> {
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
pub(crate) fn graph_replay(shmem: &Nvshmem, seed: u64) -> Result<()> {
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
pub(crate) fn errors(shmem: &Nvshmem) -> Result<()> {
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
