//! The pipeline itself: one persistent stage kernel per PE (pipeline_stage.cu), fed and
//! drained by PE 0, its output checked against the stages' transforms on the CPU.

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::module::{grid, KernelArgs, Module};
use nvshmem::{Nvshmem, Result};
use std::time::{Duration, Instant};

use nvshmem_checks::kernels;

use crate::harness::{compare, random_words, sync, FILL};

/// What stage `s` does to each element (`stage_op` in pipeline_stage.cu).
pub(crate) fn stage_op(x: u32, s: u32) -> u32 {
    x.wrapping_mul(3).wrapping_add(s + 1)
}

/// The pipeline: PE 0 feeds `batches` micro-batches into stage 0, stage i (on PE i) pushes
/// to stage i + 1, and the last stage's output drains back to PE 0. `mode` picks the stage's
/// device functions (pipeline_stage.cu). Returns, on PE 0, the wall time from the stage's
/// launch to the last micro-batch drained.
///
/// With `clean_every`, the stages' pushes rewrite their whole LL slot that often (in visits of
/// the slot) instead of once in 2^31 messages, so that the rewrite is checked.
pub(crate) fn pipeline(
    shmem: &Nvshmem,
    seed: u64,
    mode: u32,
    batches: usize,
    clean_every: Option<u64>,
) -> Result<Duration> {
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
    let (mut there, mut back) = (input.handle(), output.handle());
    if let Some(every) = clean_every {
        (there.ll_clean_every, back.ll_clean_every) = (every, every);
    }
    let mut args = KernelArgs::new();
    args.value(there)
        .value(back)
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
