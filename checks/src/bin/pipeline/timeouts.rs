//! The bound on every wait of a channel: a receive with no sender, a drop while a receive
//! waits, and a send into a full channel each give up in time with the error naming the peer.

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::{ChannelWait, Error, Nvshmem, Result};
use std::time::{Duration, Instant};

use crate::harness::{compare, fail, random_words, sync, FILL};

/// The bound of the checks of a peer that does not come.
pub(crate) const SHORT_BOUND: Duration = Duration::from_secs(2);
/// What a wait that gives up may take beyond its bound (the first look at the clock, a
/// launch, a synchronisation).
pub(crate) const SLACK: Duration = Duration::from_secs(2);

/// `r` is the channel's timeout of a wait for PE `pe` at `site`, for message `message`.
pub(crate) fn expect_timeout<V: std::fmt::Debug>(
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
pub(crate) fn within_bound(what: &str, took: Duration) -> Result<()> {
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
pub(crate) fn recv_without_sender(shmem: &Nvshmem) -> Result<()> {
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
pub(crate) fn drop_while_receiving(shmem: &Nvshmem) -> Result<()> {
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
pub(crate) fn send_into_full_channel(shmem: &Nvshmem, seed: u64) -> Result<()> {
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
