//! The MLP of either layout, the full weights for the reference, and each token count's
//! fresh random data.

use super::TP_TEST;
use crate::cli::{Config, TpShape};
use crate::data;
use crate::error::{Guard, Result};
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem::tp::{ColumnParallelLinear, RowParallelLinear, Schedule, SequenceParallelMlp, TpMlp};
use nvshmem::{DeviceBuffer, SymmetricBuffer};
use std::sync::Arc;

/// The MLP of one layout.
pub(super) enum Mlp {
    Replicated(TpMlp),
    Sequence(SequenceParallelMlp),
}

impl Mlp {
    pub(super) fn gate_up(&self) -> &ColumnParallelLinear {
        match self {
            Mlp::Replicated(m) => m.gate_up(),
            Mlp::Sequence(m) => m.gate_up(),
        }
    }

    pub(super) fn down(&self) -> &RowParallelLinear {
        match self {
            Mlp::Replicated(m) => m.down(),
            Mlp::Sequence(m) => m.down(),
        }
    }

    /// What a forward of `m` tokens in `schedule` runs: the down projection's schedule
    /// (replicated), the gate/up projection's (sequence parallel, where it overlaps).
    pub(super) fn resolved(&self, schedule: Schedule, m: usize) -> Schedule {
        match self {
            Mlp::Replicated(mlp) => mlp.down().resolved_schedule(schedule, m),
            Mlp::Sequence(mlp) => mlp.gate_up().resolved_schedule(schedule, m),
        }
    }

    pub(super) fn load_weights(
        &self,
        gate: &[bf16],
        up: &[bf16],
        down: &[bf16],
    ) -> nvshmem::Result<()> {
        match self {
            Mlp::Replicated(m) => m.load_weights(gate, up, down),
            Mlp::Sequence(m) => m.load_weights(gate, up, down),
        }
    }

    /// One forward into `y`: from every token (`x`) or this PE's (`mine`), by layout.
    pub(super) fn forward(
        &self,
        y: &SymmetricBuffer<bf16>,
        (x, mine): (&DeviceBuffer<bf16>, Option<&SymmetricBuffer<bf16>>),
        schedule: Schedule,
        stream: &Arc<CudaStream>,
    ) -> Result<(), String> {
        match self {
            Mlp::Replicated(m) => m.forward_with(y, x, schedule, stream),
            Mlp::Sequence(m) => {
                let mine = mine.ok_or("the sequence-parallel MLP has no input of its own")?;
                m.forward_with(y, mine, schedule, stream)
            }
        }
        .map_err(|e| e.to_string())
    }
}

/// The full (unsharded) weights on this GPU, for the reference.
pub(super) struct Weights {
    /// gate's `ffn` rows, then up's: `2 ffn × hidden`.
    pub(super) gate_up: Guard<DeviceBuffer<bf16>>,
    /// `hidden × ffn`.
    pub(super) down: Guard<DeviceBuffer<bf16>>,
}

/// Fresh random data of one token count, the same on every PE.
pub(super) struct Data {
    /// gate's `ffn` rows, then up's (`2 ffn × hidden`), uniform in ±sqrt(3 / hidden).
    pub(super) gate_up: Vec<bf16>,
    /// `hidden × ffn`, uniform in ±sqrt(3 / ffn).
    pub(super) down: Vec<bf16>,
    /// `M × hidden`, uniform in [-1, 1).
    pub(super) x: Vec<bf16>,
}

pub(super) fn fresh_data(cfg: &Config, shape: &TpShape, m: usize, threads: usize) -> Data {
    let (hidden, ffn) = (shape.hidden, shape.ffn);
    let key = |part: u64| {
        data::key(
            cfg.seed,
            &[
                data::hash_bytes(TP_TEST.as_bytes()),
                hidden as u64,
                ffn as u64,
                m as u64,
                part,
            ],
        )
    };
    let scale = |in_features: usize| (3.0 / in_features as f64).sqrt() as f32;
    Data {
        gate_up: data::uniform_bf16(key(0), 2 * ffn * hidden, scale(hidden), threads),
        down: data::uniform_bf16(key(1), hidden * ffn, scale(ffn), threads),
        x: data::uniform_bf16(key(2), m * hidden, 1.0, threads),
    }
}
