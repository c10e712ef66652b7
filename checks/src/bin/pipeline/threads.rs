//! Several threads at each end of one channel at once, each on a stream of its own.

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::{Nvshmem, Result};
use std::time::Duration;

use crate::harness::{compare, fail, random_words, sync, FILL};

/// Two threads send on one channel at once, each on a stream of its own, and two receive at
/// once on theirs: every message arrives once and intact, and each sender's in the order sent.
pub(crate) fn concurrent_ends(shmem: &Nvshmem, seed: u64) -> Result<()> {
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
