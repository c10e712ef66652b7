//! Pipeline schedules: the order in which one stage of a pipeline runs its micro-batches'
//! forward and backward passes and hands activations and gradients to its neighbours.
//!
//! [`OneFOneB`] is the schedule of PipeDream-flush and Megatron-LM ("one forward, one
//! backward"): each stage runs a few forwards to fill the pipeline, then alternates one
//! forward with one backward, then drains the backwards. It idles as little as the GPipe
//! schedule, `(p - 1) / (m + p - 1)` of the step with `p` stages and `m` micro-batches of
//! equal cost, but keeps at most `p - stage` micro-batches' activations at once instead of
//! `m`.
//!
//! The steps name what to send and receive; the [`channel`](crate::channel)s carry it. A
//! channel of one slot in each direction between neighbours is enough: sends wait only for
//! a free slot, and the schedule never sends into a full channel that its peer will drain
//! only later. Transports whose sends wait for the matching receive (NCCL's send/recv)
//! need each send grouped with the receive that follows it, as Megatron-LM does.
//!
//! ```
//! use nvshmem::pipeline::{OneFOneB, Step};
//! // 4 stages, 8 micro-batches: stage 1 fills with 2 forwards, then alternates.
//! let schedule = OneFOneB::new(4, 8)?;
//! let steps = schedule.steps(1)?;
//! assert_eq!(&steps[..4], &[
//!     Step::RecvActivation(0), Step::Forward(0), Step::SendActivation(0),
//!     Step::RecvActivation(1),
//! ]);
//! assert_eq!(schedule.warmup(1), 2);
//! assert!((schedule.ideal_bubble() - 3.0 / 11.0).abs() < 1e-12);
//! # Ok::<(), nvshmem::Error>(())
//! ```

use crate::error::{Error, Result};

/// One thing a stage does, for micro-batch `.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Receive the micro-batch's activations from the stage before (not on the first stage).
    RecvActivation(usize),
    /// Run the stage's forward pass on the micro-batch.
    Forward(usize),
    /// Send the forward pass's output to the stage after (not on the last stage).
    SendActivation(usize),
    /// Receive the gradient of the stage's output from the stage after (not on the last
    /// stage, which computes it from the loss).
    RecvGradient(usize),
    /// Run the stage's backward pass on the micro-batch.
    Backward(usize),
    /// Send the gradient of the stage's input to the stage before (not on the first stage).
    SendGradient(usize),
}

impl Step {
    /// The micro-batch the step is for.
    pub fn micro_batch(self) -> usize {
        match self {
            Step::RecvActivation(i)
            | Step::Forward(i)
            | Step::SendActivation(i)
            | Step::RecvGradient(i)
            | Step::Backward(i)
            | Step::SendGradient(i) => i,
        }
    }

    /// Whether the step hands data to or from a neighbour.
    pub fn is_transfer(self) -> bool {
        !matches!(self, Step::Forward(_) | Step::Backward(_))
    }
}

/// The one-forward-one-backward schedule of `stages` stages over `micro_batches`
/// micro-batches per step (see the [module](self) documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneFOneB {
    stages: usize,
    micro_batches: usize,
}

impl OneFOneB {
    /// The schedule; [`Error::InvalidArgument`] when either count is 0.
    pub fn new(stages: usize, micro_batches: usize) -> Result<Self> {
        if stages == 0 || micro_batches == 0 {
            return Err(Error::InvalidArgument(format!(
                "a 1F1B schedule needs at least one stage and one micro-batch \
                 (got {stages} stages, {micro_batches} micro-batches)"
            )));
        }
        Ok(OneFOneB {
            stages,
            micro_batches,
        })
    }

    /// Stages of the pipeline.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// Micro-batches per step.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Forwards `stage` runs before its first backward, beyond the one that the first
    /// backward follows: `stages - stage - 1`, at most the micro-batches.
    pub fn warmup(&self, stage: usize) -> usize {
        (self.stages.saturating_sub(stage + 1)).min(self.micro_batches)
    }

    /// The most micro-batches whose activations `stage` keeps at once (forward done,
    /// backward not yet): what it must have buffers for.
    pub fn in_flight(&self, stage: usize) -> usize {
        (self.warmup(stage) + 1).min(self.micro_batches)
    }

    /// The fraction of a step each stage idles when every forward and every backward costs
    /// the same on every stage and hand-offs cost nothing: `(p - 1) / (m + p - 1)`.
    pub fn ideal_bubble(&self) -> f64 {
        let p = self.stages as f64;
        (p - 1.0) / (self.micro_batches as f64 + p - 1.0)
    }

    /// The steps of `stage` (0 is the first) in order; [`Error::InvalidArgument`] for a
    /// stage outside the pipeline.
    pub fn steps(&self, stage: usize) -> Result<Vec<Step>> {
        if stage >= self.stages {
            return Err(Error::InvalidArgument(format!(
                "stage {stage} of a pipeline of {} stages",
                self.stages
            )));
        }
        let (first, last) = (stage == 0, stage + 1 == self.stages);
        let forward = |i: usize, out: &mut Vec<Step>| {
            if !first {
                out.push(Step::RecvActivation(i));
            }
            out.push(Step::Forward(i));
            if !last {
                out.push(Step::SendActivation(i));
            }
        };
        let backward = |i: usize, out: &mut Vec<Step>| {
            if !last {
                out.push(Step::RecvGradient(i));
            }
            out.push(Step::Backward(i));
            if !first {
                out.push(Step::SendGradient(i));
            }
        };
        let m = self.micro_batches;
        let warmup = self.warmup(stage);
        let mut out = Vec::with_capacity(6 * m);
        for i in 0..warmup {
            forward(i, &mut out);
        }
        for k in 0..m - warmup {
            forward(warmup + k, &mut out);
            backward(k, &mut out);
        }
        for k in m - warmup..m {
            backward(k, &mut out);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Runs every stage's steps against channels of `depth` slots (a send waits for a free
    /// slot, a receive for a message), checking that each receive gets the micro-batch it
    /// names; `false` when no stage can move and some are not done.
    fn completes(s: &OneFOneB, depth: usize) -> bool {
        let p = s.stages();
        let steps: Vec<Vec<Step>> = (0..p).map(|st| s.steps(st).unwrap()).collect();
        let mut pc = vec![0usize; p];
        // act[s]: stage s to s + 1; grad[s]: stage s + 1 to s.
        let mut act: Vec<VecDeque<usize>> = vec![VecDeque::new(); p];
        let mut grad: Vec<VecDeque<usize>> = vec![VecDeque::new(); p];
        loop {
            let mut moved = false;
            for st in 0..p {
                while let Some(&step) = steps[st].get(pc[st]) {
                    let done = match step {
                        Step::Forward(_) | Step::Backward(_) => true,
                        Step::SendActivation(i) if act[st].len() < depth => {
                            act[st].push_back(i);
                            true
                        }
                        Step::SendGradient(i) if grad[st - 1].len() < depth => {
                            grad[st - 1].push_back(i);
                            true
                        }
                        Step::RecvActivation(i) => match act[st - 1].pop_front() {
                            Some(got) => {
                                assert_eq!(got, i, "stage {st} received the wrong activation");
                                true
                            }
                            None => false,
                        },
                        Step::RecvGradient(i) => match grad[st].pop_front() {
                            Some(got) => {
                                assert_eq!(got, i, "stage {st} received the wrong gradient");
                                true
                            }
                            None => false,
                        },
                        _ => false,
                    };
                    if !done {
                        break;
                    }
                    pc[st] += 1;
                    moved = true;
                }
            }
            if (0..p).all(|st| pc[st] == steps[st].len()) {
                return act.iter().chain(&grad).all(VecDeque::is_empty);
            }
            if !moved {
                return false;
            }
        }
    }

    /// The step time of the schedule when a forward takes `f` and a backward `b` on every
    /// stage and messages arrive at once (unbounded channels).
    fn makespan(s: &OneFOneB, f: f64, b: f64) -> f64 {
        let p = s.stages();
        let steps: Vec<Vec<Step>> = (0..p).map(|st| s.steps(st).unwrap()).collect();
        let (mut pc, mut clock) = (vec![0usize; p], vec![0.0f64; p]);
        let mut act: Vec<VecDeque<f64>> = vec![VecDeque::new(); p];
        let mut grad: Vec<VecDeque<f64>> = vec![VecDeque::new(); p];
        while (0..p).any(|st| pc[st] < steps[st].len()) {
            for st in 0..p {
                while let Some(&step) = steps[st].get(pc[st]) {
                    match step {
                        Step::Forward(_) => clock[st] += f,
                        Step::Backward(_) => clock[st] += b,
                        Step::SendActivation(_) => act[st].push_back(clock[st]),
                        Step::SendGradient(_) => grad[st - 1].push_back(clock[st]),
                        Step::RecvActivation(_) => match act[st - 1].pop_front() {
                            Some(t) => clock[st] = clock[st].max(t),
                            None => break,
                        },
                        Step::RecvGradient(_) => match grad[st].pop_front() {
                            Some(t) => clock[st] = clock[st].max(t),
                            None => break,
                        },
                    }
                    pc[st] += 1;
                }
            }
        }
        clock.into_iter().fold(0.0, f64::max)
    }

    #[test]
    fn every_stage_runs_each_micro_batch_once_each_way_in_order() {
        for p in 1..=6 {
            for m in 1..=9 {
                let s = OneFOneB::new(p, m).unwrap();
                for st in 0..p {
                    let steps = s.steps(st).unwrap();
                    let of = |pick: fn(Step) -> bool| -> Vec<usize> {
                        steps
                            .iter()
                            .filter(|x| pick(**x))
                            .map(|x| x.micro_batch())
                            .collect()
                    };
                    let all: Vec<usize> = (0..m).collect();
                    assert_eq!(of(|x| matches!(x, Step::Forward(_))), all);
                    assert_eq!(of(|x| matches!(x, Step::Backward(_))), all);
                    let sends = of(|x| matches!(x, Step::SendActivation(_)));
                    assert_eq!(sends, if st + 1 < p { all.clone() } else { vec![] });
                    let grads = of(|x| matches!(x, Step::SendGradient(_)));
                    assert_eq!(grads, if st > 0 { all.clone() } else { vec![] });
                    // A micro-batch's backward comes after its forward, and at most
                    // `in_flight` forwards are waiting for their backward at any time.
                    let (mut open, mut most) = (0usize, 0usize);
                    for x in &steps {
                        match x {
                            Step::Forward(_) => open += 1,
                            Step::Backward(_) => open -= 1,
                            _ => {}
                        }
                        most = most.max(open);
                    }
                    assert_eq!(most, s.in_flight(st), "p {p} m {m} stage {st}");
                }
            }
        }
    }

    #[test]
    fn channels_of_one_slot_never_deadlock() {
        for p in 1..=8 {
            for m in 1..=12 {
                let s = OneFOneB::new(p, m).unwrap();
                for depth in 1..=3 {
                    assert!(completes(&s, depth), "p {p} m {m} depth {depth}");
                }
            }
        }
    }

    #[test]
    fn the_step_takes_m_plus_p_minus_1_forwards_and_backwards() {
        for p in 1..=6 {
            for m in 1..=10 {
                let s = OneFOneB::new(p, m).unwrap();
                for (f, b) in [(1.0, 1.0), (1.0, 2.0), (3.0, 5.0)] {
                    let t = makespan(&s, f, b);
                    let ideal = (m + p - 1) as f64 * (f + b);
                    assert!((t - ideal).abs() < 1e-9, "p {p} m {m}: {t} vs {ideal}");
                    let busy = m as f64 * (f + b);
                    assert!((1.0 - busy / t - s.ideal_bubble()).abs() < 1e-12);
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(OneFOneB::new(0, 4).is_err());
        assert!(OneFOneB::new(4, 0).is_err());
        assert!(OneFOneB::new(4, 4).unwrap().steps(4).is_err());
        assert_eq!(OneFOneB::new(4, 2).unwrap().warmup(0), 2);
        assert_eq!(OneFOneB::new(4, 2).unwrap().in_flight(0), 2);
    }
}
