//! A 1F1B pipeline step: one stage per PE, micro-batches' activations handed forward and
//! their gradients back through channels, in the order `nvshmem::pipeline::OneFOneB` gives
//! each stage. Every stage is the layer `y = a x + b` (examples/kernels/affine.cu) with a
//! loss of `|y|² / 2` at the end, so the outputs and input gradients are checked exactly on
//! the host. `bench --tests pipeline` runs MLP stages this way and times them against NCCL.
//!
//! ```text
//! nvshmemrun -np 4 target/release/examples/pipeline_1f1b
//! ```

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::module::{KernelArgs, Module};
use nvshmem::pipeline::{OneFOneB, Step};
use nvshmem::{DeviceBuffer, LaunchConfig, Nvshmem};

/// The layer's kernel (examples/kernels/affine.cu).
mod kernels {
    include!(concat!(env!("OUT_DIR"), "/examples/kernels.rs"));
}

/// Elements of a micro-batch, and micro-batches per step.
const LEN: usize = 4096;
const MICRO_BATCHES: usize = 8;

/// Stage `s`'s layer: `y = a x + b`.
fn layer(s: usize) -> (f32, f32) {
    (1.0 + 0.25 * s as f32, s as f32)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("pipeline_1f1b: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let shmem = Nvshmem::init()?;
    let (me, p) = (shmem.my_pe(), shmem.n_pes());
    let stream = shmem.stream();
    let schedule = OneFOneB::new(p, MICRO_BATCHES)?;

    // Collective: every PE makes every channel, in one order. Activations go from stage s to
    // s + 1 (channel 2 s), gradients back (channel 2 s + 1); one slot each way is enough.
    let mut channels = Vec::new();
    for s in 0..p - 1 {
        channels.push(Channel::<f32>::new(
            &shmem,
            ChannelConfig::new(s, s + 1, LEN),
        )?);
        channels.push(Channel::<f32>::new(
            &shmem,
            ChannelConfig::new(s + 1, s, LEN),
        )?);
    }
    let module = Module::load(&shmem, &kernels::AFFINE)?;
    let affine = module.function("affine")?;
    let (a, b) = layer(me);
    let apply = |buf: &DeviceBuffer<f32>, a: f32, b: f32| -> nvshmem::Result<()> {
        let mut args = KernelArgs::new();
        args.value(buf.addr()).value(a).value(b).value(LEN as u64);
        // SAFETY: affine(float *x, float a, float b, uint64_t n) over the buffer's LEN floats.
        unsafe { affine.launch(LaunchConfig::for_num_elems(LEN as u32), stream, &mut args) }
    };

    // Each micro-batch's input, output, output gradient and input gradient on this stage.
    let bufs = || (0..MICRO_BATCHES).map(|_| shmem.alloc_device::<f32>(LEN));
    let mut x: Vec<DeviceBuffer<f32>> = bufs().collect::<nvshmem::Result<_>>()?;
    let mut y: Vec<DeviceBuffer<f32>> = bufs().collect::<nvshmem::Result<_>>()?;
    let mut gy: Vec<DeviceBuffer<f32>> = bufs().collect::<nvshmem::Result<_>>()?;
    let mut gx: Vec<DeviceBuffer<f32>> = bufs().collect::<nvshmem::Result<_>>()?;
    let input = |i: usize| (0..LEN).map(move |j| i as f32 + j as f32 / LEN as f32);
    if me == 0 {
        for (i, xi) in x.iter().enumerate() {
            xi.copy_from_host(&input(i).collect::<Vec<_>>())?;
        }
    }

    let last = me + 1 == p;
    for step in schedule.steps(me)? {
        match step {
            Step::RecvActivation(i) => channels[2 * (me - 1)].recv(&mut x[i], stream)?,
            Step::Forward(i) => {
                stream.memcpy_dtod(&x[i], &mut y[i])?;
                apply(&y[i], a, b)?;
            }
            Step::SendActivation(i) => channels[2 * me].send(&y[i], stream)?,
            Step::RecvGradient(i) => channels[2 * me + 1].recv(&mut gy[i], stream)?,
            Step::Backward(i) => {
                // dy/dx = a; the last stage's output gradient is its output.
                stream.memcpy_dtod(if last { &y[i] } else { &gy[i] }, &mut gx[i])?;
                apply(&gx[i], a, 0.0)?;
            }
            Step::SendGradient(i) => channels[2 * (me - 1) + 1].send(&gx[i], stream)?,
        }
    }
    stream.synchronize()?;
    for c in &channels {
        c.check()?; // a wait that gave up on the GPU shows here
    }

    // The host's step, in the GPU's arithmetic (a fused multiply-add per layer).
    let mut wrong = 0;
    for i in 0..MICRO_BATCHES {
        let forward: Vec<Vec<f32>> = (0..=p)
            .scan(input(i).collect::<Vec<f32>>(), |v, s| {
                let out = v.clone();
                if s < p {
                    let (a, b) = layer(s);
                    v.iter_mut().for_each(|e| *e = a.mul_add(*e, b));
                }
                Some(out)
            })
            .collect();
        let mut grad = forward[p].clone();
        for s in (me..p).rev() {
            grad.iter_mut().for_each(|e| *e *= layer(s).0);
        }
        let count =
            |got: Vec<f32>, want: &[f32]| got.iter().zip(want).filter(|(g, w)| g != w).count();
        wrong += count(y[i].to_vec()?, &forward[me + 1]);
        wrong += count(gx[i].to_vec()?, &grad);
    }
    let passed = usize::from(wrong == 0);
    println!(
        "pipeline_1f1b: stage {me}/{p}: {} steps, {wrong} wrong elements: {passed} passed, {} failed",
        schedule.steps(me)?.len(),
        1 - passed
    );
    shmem.barrier_all()?;
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
