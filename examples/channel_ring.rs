//! A pipeline through channels: PE 0 feeds micro-batches to PE 1, each later PE adds its
//! number and hands them on, and the last PE sends them back to PE 0, which checks them.
//!
//! ```text
//! nvshmemrun -np 4 target/release/examples/channel_ring
//! ```

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::Nvshmem;

/// Elements of a micro-batch, and micro-batches.
const LEN: usize = 1 << 12;
const BATCHES: usize = 16;

fn main() {
    if let Err(e) = run() {
        eprintln!("channel_ring: {e}");
        std::process::exit(1);
    }
}

fn run() -> nvshmem::Result<()> {
    let shmem = Nvshmem::init()?;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let stream = shmem.stream();
    // One channel per link of the ring, made on every PE in the same order (collective).
    let links: Vec<Channel<f32>> = (0..n)
        .map(|i| Channel::new(&shmem, ChannelConfig::new(i, (i + 1) % n, LEN).depth(4)))
        .collect::<nvshmem::Result<_>>()?;
    let (inbox, outbox) = (&links[(me + n - 1) % n], &links[me]);

    let mut batch = shmem.calloc::<f32>(LEN)?;
    let mut wrong = 0;
    for b in 0..BATCHES {
        if me == 0 {
            // The source: batch b holds b everywhere. Send it, then take it back.
            batch.copy_from_host(&vec![b as f32; LEN])?;
            outbox.send(&batch, stream)?;
            inbox.recv(&mut batch, stream)?;
            // PEs 1 .. n - 1 added 1 + 2 + ... + (n - 1).
            let want = (b + n * (n - 1) / 2) as f32;
            wrong += batch.to_vec()?.iter().filter(|&&v| v != want).count();
        } else {
            // A stage: receive, add this PE's number, hand on.
            inbox.recv(&mut batch, stream)?;
            let mut data = batch.to_vec()?;
            data.iter_mut().for_each(|v| *v += me as f32);
            batch.copy_from_host(&data)?;
            outbox.send(&batch, stream)?;
        }
    }
    stream.synchronize()?;
    // A wait that gave up on the GPU shows here, not as garbage above.
    inbox.check()?;
    outbox.check()?;
    match me {
        0 => println!(
            "channel_ring: PE 0/{n}: {BATCHES} batches of {LEN} floats round the ring: \
             {wrong} wrong elements"
        ),
        _ => println!("channel_ring: PE {me}/{n}: added {me} to {BATCHES} batches"),
    }
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
