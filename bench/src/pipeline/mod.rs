//! The 1F1B pipeline (`--tests pipeline`): one stage per PE, each an MLP block forward and
//! backward (block.rs), `--pipe-micro-batches` micro-batches per step in the order of
//! `nvshmem::pipeline::OneFOneB`, activations forward and gradients back
//! - `ours`: through `nvshmem::channel::Channel`s (two slots each way between neighbours);
//! - `nccl`: through NCCL send/recv, each send grouped with the receive after it (as
//!   Megatron-LM does: a lone send waits for its receiver, which may be sending too);
//! - `local`: through a local copy of what the single-GPU run handed to this stage (the same
//!   steps and bytes with no neighbour: the stage's compute, which sets the bubble and the
//!   exposed communication of the others).
//!
//! A step is one CUDA graph per PE, timed by replays. After the replays every transport's
//! outputs, input gradients and weight gradients must equal a single-GPU run of every stage
//! bit for bit (reference.rs), and each stage's block is checked against the CPU first.

mod block;
mod reference;

use crate::cli::{Config, Impl};
use crate::coord::Coord;
use crate::data::{self, Mismatch};
use crate::error::{BenchError, CudaExt, Guard, Result};
use crate::nccl::Nccl;
use crate::report::{PipelineFigures, Record, Results, Status};
use crate::stats;
use crate::timing::{self, Timer};
use crate::Progress;
use block::{Block, Kernels};
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::pipeline::{OneFOneB, Step};
use nvshmem::{DeviceBuffer, Nvshmem};
use reference::Expected;
use std::sync::Arc;

/// The `test` of the pipeline rows.
pub const PIPELINE_TEST: &str = "pipeline";
/// Slots of each channel: one is enough for 1F1B (nvshmem::pipeline's tests); the second
/// lets a stage send its next activation before its neighbour has taken the last.
pub const CHANNEL_DEPTH: usize = 2;
/// Data key of the stages' weights (`data::key`).
const K_WEIGHTS: u64 = 51;

pub struct Ctx<'a> {
    pub shmem: &'a Nvshmem,
    pub coord: &'a Coord,
    pub cfg: &'a Config,
    pub stream: &'a Arc<CudaStream>,
    pub nccl: Option<&'a Nccl>,
    pub progress: &'a Progress,
}

/// The sizes of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Tokens per micro-batch.
    pub tokens: usize,
    pub micro_batches: usize,
    pub hidden: usize,
    pub ffn: usize,
}

/// How a stage hands data to its neighbours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Local,
    Ours,
    Nccl,
}

impl Transport {
    pub const ALL: [Transport; 3] = [Transport::Local, Transport::Ours, Transport::Nccl];

    pub fn name(self) -> &'static str {
        match self {
            Transport::Local => "local",
            Transport::Ours => "ours",
            Transport::Nccl => "nccl",
        }
    }
}

/// The steps of a stage as NCCL must enqueue them: each send together with the receive right
/// after it, every other step alone.
pub fn nccl_groups(steps: &[Step]) -> Vec<Vec<Step>> {
    let sends = |s: &Step| matches!(s, Step::SendActivation(_) | Step::SendGradient(_));
    let mut out = Vec::new();
    let mut k = 0;
    while k < steps.len() {
        let pair = sends(&steps[k])
            && steps
                .get(k + 1)
                .is_some_and(|s| s.is_transfer() && !sends(s));
        let n = if pair { 2 } else { 1 };
        out.push(steps[k..k + n].to_vec());
        k += n;
    }
    out
}

/// This PE's buffers for one step: each micro-batch's input, ReLU output, output, output
/// gradient and input gradient (the backward needs the first two), a scratch, and a sink for
/// the local transport's sends.
struct Activations {
    x: Vec<DeviceBuffer<bf16>>,
    a: Vec<DeviceBuffer<bf16>>,
    y: Vec<DeviceBuffer<bf16>>,
    gy: Vec<DeviceBuffer<bf16>>,
    gx: Vec<DeviceBuffer<bf16>>,
    ga: DeviceBuffer<bf16>,
    sink: DeviceBuffer<bf16>,
}

impl Activations {
    fn new(shmem: &Nvshmem, shape: Shape) -> Result<Self> {
        let (m, h, f) = (shape.tokens, shape.hidden, shape.ffn);
        let many = |len: usize| -> Result<Vec<DeviceBuffer<bf16>>> {
            (0..shape.micro_batches)
                .map(|_| Ok(shmem.alloc_device::<bf16>(len)?))
                .collect()
        };
        Ok(Activations {
            x: many(m * h)?,
            a: many(m * f)?,
            y: many(m * h)?,
            gy: many(m * h)?,
            gx: many(m * h)?,
            ga: shmem.alloc_device::<bf16>(m * f)?,
            sink: shmem.alloc_device::<bf16>(m * h)?,
        })
    }
}

/// The channels of this PE's stage (of all those every PE made, in one order).
struct Links<'a> {
    act_in: Option<&'a Channel<bf16>>,
    act_out: Option<&'a Channel<bf16>>,
    grad_in: Option<&'a Channel<bf16>>,
    grad_out: Option<&'a Channel<bf16>>,
}

/// What one step on this PE needs.
struct Stage<'a> {
    me: usize,
    last: bool,
    shape: Shape,
    stream: &'a Arc<CudaStream>,
    lt: &'a block::Lt,
    kernels: &'a Kernels,
    block: &'a mut Block,
    acts: &'a mut Activations,
    expected: &'a Expected,
    links: &'a Links<'a>,
    nccl: Option<&'a Nccl>,
}

impl Stage<'_> {
    fn bytes(&self) -> usize {
        self.shape.tokens * self.shape.hidden * std::mem::size_of::<bf16>()
    }

    /// Enqueue one step of the schedule over `transport`: the weight gradients zeroed, then
    /// every step in order.
    fn enqueue(&mut self, transport: Transport, steps: &[Step]) -> Result<()> {
        self.block.zero_grads(self.stream)?;
        if transport == Transport::Nccl {
            let nccl = self
                .nccl
                .ok_or_else(|| BenchError::new("NCCL is not initialised"))?;
            for group in nccl_groups(steps) {
                if group[0].is_transfer() {
                    nccl.group(|| {
                        for &s in &group {
                            self.nccl_transfer(nccl, s)?;
                        }
                        Ok(())
                    })?;
                } else {
                    self.compute(group[0])?;
                }
            }
            return Ok(());
        }
        for &s in steps {
            match (s.is_transfer(), transport) {
                (false, _) => self.compute(s)?,
                (true, Transport::Ours) => self.channel_transfer(s)?,
                _ => self.local_transfer(s)?,
            }
        }
        Ok(())
    }

    fn compute(&mut self, step: Step) -> Result<()> {
        let m = self.shape.tokens;
        let acts = &mut *self.acts;
        match step {
            Step::Forward(i) => {
                self.block
                    .forward(self.lt, m, &acts.x[i], &mut acts.a[i], &mut acts.y[i])
            }
            Step::Backward(i) => {
                // The last stage's output gradient is its output (the loss |y|²/2).
                let gy = if self.last { &acts.y[i] } else { &acts.gy[i] };
                self.block.backward(
                    self.lt,
                    self.kernels,
                    m,
                    gy,
                    &acts.x[i],
                    &acts.a[i],
                    &mut acts.ga,
                    &mut acts.gx[i],
                )
            }
            _ => Err(BenchError::new(format!("{step:?} is not a compute step"))),
        }
    }

    fn channel_transfer(&mut self, step: Step) -> Result<()> {
        let missing = || BenchError::new(format!("stage {} has no channel for {step:?}", self.me));
        let l = self.links;
        let acts = &mut *self.acts;
        match step {
            Step::RecvActivation(i) => l
                .act_in
                .ok_or_else(missing)?
                .recv(&mut acts.x[i], self.stream)?,
            Step::SendActivation(i) => l
                .act_out
                .ok_or_else(missing)?
                .send(&acts.y[i], self.stream)?,
            Step::RecvGradient(i) => l
                .grad_in
                .ok_or_else(missing)?
                .recv(&mut acts.gy[i], self.stream)?,
            Step::SendGradient(i) => l
                .grad_out
                .ok_or_else(missing)?
                .send(&acts.gx[i], self.stream)?,
            _ => return Err(BenchError::new(format!("{step:?} is not a transfer"))),
        }
        Ok(())
    }

    fn nccl_transfer(&self, nccl: &Nccl, step: Step) -> Result<()> {
        let (acts, bytes, s) = (&*self.acts, self.bytes(), self.stream);
        let (prev, next) = (self.me.wrapping_sub(1), self.me + 1);
        // SAFETY: every buffer holds `bytes` bytes and outlives the graph it is captured in.
        unsafe {
            match step {
                Step::RecvActivation(i) => nccl.recv(acts.x[i].addr(), bytes, prev, s),
                Step::SendActivation(i) => nccl.send(acts.y[i].addr(), bytes, next, s),
                Step::RecvGradient(i) => nccl.recv(acts.gy[i].addr(), bytes, next, s),
                Step::SendGradient(i) => nccl.send(acts.gx[i].addr(), bytes, prev, s),
                _ => Err(BenchError::new(format!("{step:?} is not a transfer"))),
            }
        }
    }

    /// What the neighbour would have handed over, copied from the single-GPU run; what would
    /// go to it, copied to a sink.
    fn local_transfer(&mut self, step: Step) -> Result<()> {
        let n = self.shape.tokens * self.shape.hidden;
        let (acts, e, s) = (&mut *self.acts, self.expected, self.stream);
        match step {
            Step::RecvActivation(i) => block::copy(s, &e.act_in[i], &mut acts.x[i], n),
            Step::RecvGradient(i) => block::copy(s, &e.grad_in[i], &mut acts.gy[i], n),
            Step::SendActivation(i) => block::copy(s, &acts.y[i], &mut acts.sink, n),
            Step::SendGradient(i) => block::copy(s, &acts.gx[i], &mut acts.sink, n),
            _ => Err(BenchError::new(format!("{step:?} is not a transfer"))),
        }
    }

    /// This PE's outputs against the single-GPU run's, bit for bit.
    fn check(&self) -> Result<Mismatch> {
        let download = reference::download;
        let e = self.expected;
        let parts = [
            ("outputs", download(&self.acts.y)?, &e.y),
            ("input gradients", download(&self.acts.gx)?, &e.gx),
            ("w1 gradient", self.block.dw1.to_vec()?, &e.dw1),
            ("w2 gradient", self.block.dw2.to_vec()?, &e.dw2),
        ];
        for (name, got, want) in parts {
            let mut m = data::compare_elems(&got, want);
            if let Some(first) = m.first.as_mut() {
                first.1 = format!("{} (in the {name})", first.1);
                return Ok(m);
            }
        }
        Ok(Mismatch::default())
    }
}

pub fn run(ctx: &Ctx, timer: &mut Timer, results: &mut Results) -> Result<()> {
    let (shmem, cfg, stream) = (ctx.shmem, ctx.cfg, ctx.stream);
    let (me, p) = (shmem.my_pe(), shmem.n_pes());
    let schedule = OneFOneB::new(p, cfg.pipe_micro_batches)?;
    let steps = schedule.steps(me)?;
    let transports: Vec<Transport> = Transport::ALL
        .into_iter()
        .filter(|t| match t {
            Transport::Nccl => p > 1 && cfg.has_impl(Impl::Nccl) && ctx.nccl.is_some(),
            _ => true,
        })
        .collect();
    if p == 1 {
        results
            .notes
            .push("pipeline: one PE is one stage with no hand-offs; run with 2 PEs or more".into());
    }
    timing::step("pipeline: loading kernels and weights");
    let kernels = Kernels::load(shmem)?;
    let lt = block::Lt::new(shmem, stream)?;
    let (hidden, ffn) = (cfg.pipe_hidden, cfg.pipe_ffn);
    let mut blocks = (0..p)
        .map(|s| {
            let key = data::key(cfg.seed, &[K_WEIGHTS, s as u64]);
            Block::new(shmem, &kernels, stream, (hidden, ffn), key)
        })
        .collect::<Result<Vec<_>>>()?;
    // The block against the CPU, at the fewest tokens (the CPU's products cost tokens x
    // hidden x ffn each), on every PE for its own stage.
    let m0 = cfg.pipe_tokens.iter().copied().min().unwrap_or(1);
    let cpu =
        reference::check_block_on_cpu(shmem, &kernels, &lt, stream, &mut blocks[me], m0, cfg.seed)?;
    let cpu_failed = ctx.coord.sum(cpu.is_some() as u64)?;
    if let Some(why) = &cpu {
        ctx.progress.say(format!("pipeline: PE {me}: {why}"));
    }
    for &tokens in &cfg.pipe_tokens {
        let shape = Shape {
            tokens,
            micro_batches: cfg.pipe_micro_batches,
            hidden,
            ffn,
        };
        timing::step(format!("pipeline: single-GPU run, {tokens} tokens"));
        let expected = reference::single_gpu(
            shmem,
            &kernels,
            &lt,
            stream,
            &mut blocks,
            me,
            shape,
            cfg.seed,
        )?;
        let mut acts = Activations::new(shmem, shape)?;
        // The first stage's inputs are the step's; nothing sends them.
        if me == 0 {
            for (x, e) in acts.x.iter_mut().zip(&expected.act_in) {
                block::copy(stream, e, x, tokens * hidden)?;
            }
        }
        // Collective: every PE makes every channel, in one order.
        let mut channels = Vec::new();
        for s in 0..p.saturating_sub(1) {
            for (from, to) in [(s, s + 1), (s + 1, s)] {
                let c = ChannelConfig::new(from, to, tokens * hidden).depth(CHANNEL_DEPTH);
                channels.push(Guard::new(Channel::<bf16>::new(shmem, c)?));
            }
        }
        let channel = |i: Option<usize>| i.and_then(|i| channels.get(i)).map(|c| &**c);
        let links = Links {
            act_in: channel(me.checked_sub(1).map(|s| 2 * s)),
            act_out: channel((me + 1 < p).then_some(2 * me)),
            grad_in: channel((me + 1 < p).then_some(2 * me + 1)),
            grad_out: channel(me.checked_sub(1).map(|s| 2 * s + 1)),
        };
        let mut stage = Stage {
            me,
            last: me + 1 == p,
            shape,
            stream,
            lt: &lt,
            kernels: &kernels,
            block: &mut blocks[me],
            acts: &mut acts,
            expected: &expected,
            links: &links,
            nccl: ctx.nccl,
        };
        let mut rows = Vec::new();
        let mut medians = Vec::new();
        for &t in &transports {
            timing::step(format!("pipeline: {} tokens over {}", tokens, t.name()));
            let (record, per_pe) = measure(ctx, timer, &mut stage, t, &steps, cpu_failed)?;
            medians.push((t, per_pe));
            rows.push(record);
        }
        fill_figures(&mut rows, &medians, &schedule);
        let said: Vec<String> = rows
            .iter()
            .map(|r| {
                let t = r
                    .median_us()
                    .map(|t| format!("{t:.1}us"))
                    .unwrap_or_default();
                format!("{} {t} {}", r.implementation, r.check)
            })
            .collect();
        ctx.progress
            .say(format!("pipeline {tokens} tokens: {}", said.join(", ")));
        results.records.extend(rows);
        stream.synchronize().cuda("cuStreamSynchronize")?;
        ctx.coord.barrier()?;
    }
    Ok(())
}

/// Capture one step over `transport`, replay it, check the last replay's results; the
/// record (the summary of the slowest PE) and every PE's median.
fn measure(
    ctx: &Ctx,
    timer: &mut Timer,
    stage: &mut Stage,
    transport: Transport,
    steps: &[Step],
    cpu_failed: u64,
) -> Result<(Record, Vec<f64>)> {
    let stream = ctx.stream;
    let captured = timing::capture(stream, 1, || {
        stage.enqueue(transport, steps).map_err(|e| e.to_string())
    });
    // Every PE's graph waits for its neighbours': launch only where all were captured.
    let failed = ctx.coord.sum(captured.is_err() as u64)?;
    let mut samples = Vec::new();
    let mut problem = None;
    match (&captured, failed) {
        (Ok(graph), 0) => {
            for _ in 0..ctx.cfg.warmup.max(2) {
                graph.launch().cuda("cuGraphLaunch")?;
            }
            samples = timer.time_each(
                stream,
                ctx.cfg.iters,
                1,
                |_| Ok(()),
                |_| graph.launch().cuda("cuGraphLaunch"),
            )?;
        }
        (Err(e), _) => problem = Some(e.clone()),
        (Ok(_), _) => problem = Some("graph capture failed on another PE".into()),
    }
    stream.synchronize().cuda("cuStreamSynchronize")?;
    ctx.coord.barrier()?;
    let mismatch = match problem {
        None => stage.check()?,
        Some(_) => Mismatch::default(),
    };
    let totals = ctx
        .coord
        .sums(&[mismatch.count, (mismatch.count > 0) as u64])?;
    let (status, check) = if let Some(p) = problem {
        (Status::Failed, p)
    } else if cpu_failed > 0 {
        (
            Status::Failed,
            format!("the MLP block disagrees with the CPU on {cpu_failed} PE(s)"),
        )
    } else if totals[0] > 0 {
        (
            Status::Failed,
            format!(
                "{} elements differ from the single-GPU run on {} PE(s); this PE: {}",
                totals[0],
                totals[1],
                mismatch.describe()
            ),
        )
    } else {
        (Status::Ok, "ok".into())
    };
    let mine = stats::summarize(&samples);
    let summaries = ctx.coord.gather_summaries(mine)?;
    let medians = summaries
        .iter()
        .map(|s| s.map_or(f64::NAN, |s| s.median))
        .collect();
    // The slowest PE's samples: the step ends with it.
    let slowest = summaries
        .iter()
        .flatten()
        .max_by(|a, b| a.median.total_cmp(&b.median))
        .copied();
    let shape = stage.shape;
    let record = Record {
        test: PIPELINE_TEST.into(),
        variant: variant(shape, ctx.shmem.n_pes()),
        implementation: transport.name().into(),
        mode: "graph".into(),
        dtype: "bf16".into(),
        bytes: stage.bytes(),
        count: shape.tokens * shape.hidden,
        n_pes: ctx.shmem.n_pes(),
        time_us: slowest,
        algbw_gbs: None,
        busbw_gbs: None,
        status,
        check,
        tp: None,
        pipeline: Some(PipelineFigures {
            stages: ctx.shmem.n_pes(),
            micro_batches: shape.micro_batches,
            tokens: shape.tokens,
            hidden: shape.hidden,
            ffn: shape.ffn,
            ..PipelineFigures::default()
        }),
        hybrid: None,
    };
    Ok((record, medians))
}

/// The report's variant of a configuration.
pub fn variant(shape: Shape, stages: usize) -> String {
    format!(
        "{stages} stages, {} micro-batches, hidden {}, ffn {}",
        shape.micro_batches, shape.hidden, shape.ffn
    )
}

/// The figures of one configuration's rows from every PE's median per transport. A stage's
/// busy time is its `local` step (its compute and the copies of its hand-offs); with free
/// hand-offs the schedule would take the slowest stage's busy time x (m + p - 1) / m, and
/// each stage would idle the ideal bubble.
fn fill_figures(rows: &mut [Record], medians: &[(Transport, Vec<f64>)], schedule: &OneFOneB) {
    let of = |t: Transport| medians.iter().find(|(x, _)| *x == t).map(|(_, v)| v);
    let slowest = |v: &[f64]| v.iter().copied().filter(|x| x.is_finite()).reduce(f64::max);
    let busy = of(Transport::Local).cloned().unwrap_or_default();
    let compute = slowest(&busy);
    let (m, p) = (schedule.micro_batches(), schedule.stages());
    let ideal_step = compute.map(|c| c * (m + p - 1) as f64 / m as f64);
    let nccl = of(Transport::Nccl).and_then(|v| slowest(v));
    for (row, (t, per_pe)) in rows.iter_mut().zip(medians) {
        let Some(fig) = row.pipeline.as_mut() else {
            continue;
        };
        fig.ideal_bubble_percent = 100.0 * schedule.ideal_bubble();
        fig.compute_us = compute;
        fig.ideal_step_us = ideal_step;
        let Some(step) = slowest(per_pe).filter(|_| *t != Transport::Local) else {
            continue;
        };
        fig.bubble_percent = mean_bubble_percent(&busy, per_pe);
        fig.exposed_us = ideal_step.map(|ideal| step - ideal);
        fig.handoffs_per_s = Some(schedule_handoffs(schedule) as f64 / step * 1e6);
        fig.speedup_vs_nccl = nccl.map(|n| n / step);
    }
}

/// The stages' mean idle share of their step, in percent: 1 - busy / step on each PE.
pub fn mean_bubble_percent(busy: &[f64], steps: &[f64]) -> Option<f64> {
    let shares: Vec<f64> = busy
        .iter()
        .zip(steps)
        .filter(|(b, s)| b.is_finite() && s.is_finite() && **s > 0.0)
        .map(|(b, s)| 100.0 * (1.0 - b / s))
        .collect();
    (!shares.is_empty()).then(|| shares.iter().sum::<f64>() / shares.len() as f64)
}

/// Hand-offs in one step: each micro-batch's activation and gradient across every boundary.
pub fn schedule_handoffs(schedule: &OneFOneB) -> usize {
    2 * schedule.micro_batches() * (schedule.stages() - 1)
}

#[cfg(test)]
/// NCCL's send/recv as a rendezvous: a transfer completes once both its ends are at a
/// group that posts it, and a group once all its transfers have. `false` when no stage
/// can move and some are not done.
pub fn rendezvous_completes(p: usize, m: usize, group: fn(&[Step]) -> Vec<Vec<Step>>) -> bool {
    let s = OneFOneB::new(p, m).unwrap();
    let groups: Vec<Vec<Vec<Step>>> = (0..p).map(|st| group(&s.steps(st).unwrap())).collect();
    // A transfer as (from, to, micro-batch, is a gradient).
    let posted = |st: usize, g: &[Step]| -> Vec<(usize, usize, usize, bool)> {
        g.iter()
            .filter_map(|x| match *x {
                Step::SendActivation(i) => Some((st, st + 1, i, false)),
                Step::RecvActivation(i) => Some((st - 1, st, i, false)),
                Step::SendGradient(i) => Some((st, st - 1, i, true)),
                Step::RecvGradient(i) => Some((st + 1, st, i, true)),
                _ => None,
            })
            .collect()
    };
    let mut pc = vec![0usize; p];
    let mut done = std::collections::HashSet::new();
    loop {
        let mut moved = false;
        let current: Vec<Vec<(usize, usize, usize, bool)>> = (0..p)
            .map(|st| groups[st].get(pc[st]).map_or(vec![], |g| posted(st, g)))
            .collect();
        for st in 0..p {
            for t in &current[st] {
                let peer = if t.0 == st { t.1 } else { t.0 };
                if current[peer].contains(t) && done.insert(*t) {
                    moved = true;
                }
            }
        }
        for st in 0..p {
            if pc[st] < groups[st].len() && current[st].iter().all(|t| done.contains(t)) {
                pc[st] += 1;
                moved = true;
            }
        }
        if (0..p).all(|st| pc[st] == groups[st].len()) {
            return true;
        }
        if !moved {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cubin_has_exactly_the_kernels_the_stages_launch() {
        crate::cubin_set::check_set(
            &crate::kernels::PIPELINE,
            &block::KERNEL_NAMES.map(String::from),
        );
    }

    #[test]
    fn nccl_groups_pair_each_send_with_the_receive_after_it() {
        let s = OneFOneB::new(4, 8).unwrap();
        let g = nccl_groups(&s.steps(1).unwrap());
        assert!(g.iter().all(|x| x.len() <= 2));
        assert!(g.contains(&vec![Step::SendActivation(2), Step::RecvGradient(0)]));
        assert!(g.contains(&vec![Step::SendGradient(0), Step::RecvActivation(3)]));
        // Nothing lost or reordered.
        let flat: Vec<Step> = g.concat();
        assert_eq!(flat, s.steps(1).unwrap());
    }

    #[test]
    fn schedule_handoffs_count_both_directions() {
        assert_eq!(schedule_handoffs(&OneFOneB::new(4, 8).unwrap()), 48);
        assert_eq!(schedule_handoffs(&OneFOneB::new(1, 8).unwrap()), 0);
    }

    #[test]
    fn the_bubble_is_the_idle_share_of_each_step() {
        let b = mean_bubble_percent(&[75.0, 50.0], &[100.0, 100.0]).unwrap();
        assert!((b - 37.5).abs() < 1e-12);
        // A PE that timed nothing is left out.
        let b = mean_bubble_percent(&[75.0, f64::NAN], &[100.0, 100.0]).unwrap();
        assert!((b - 25.0).abs() < 1e-12);
        assert!(mean_bubble_percent(&[], &[]).is_none());
    }

    #[test]
    fn grouped_nccl_transfers_never_deadlock() {
        for p in 1..=6 {
            for m in 1..=10 {
                assert!(rendezvous_completes(p, m, nccl_groups), "p {p} m {m}");
            }
        }
        // The check can fail: each transfer alone deadlocks (stage 0 sends its second
        // activation while stage 1 sends its first gradient).
        let alone = |steps: &[Step]| steps.iter().map(|s| vec![*s]).collect();
        assert!(!rendezvous_completes(2, 2, alone));
    }
}
