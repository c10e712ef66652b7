//! The gradient-sync table: a row per size of f32 gradients, the time of each
//! implementation, the int8 row's effective bandwidth, and each compressed row's speed-up
//! over our plain f32 all-reduce and NCCL's; and the model table: per model and bucket
//! size, the whole sync, the step with the sync overlapped, and the communication it exposes.

use super::table::{bw_cell, by_variant, fmt_us, sizes_of, speedup, time_cell, Table};
use super::Record;
use crate::cli::format_size;
use crate::gradsync::step::{StepImpl, STEP_TEST};
use crate::gradsync::{GradImpl, GRADSYNC_TEST};

pub fn gradsync_tables(records: &[Record]) -> Vec<Table> {
    let sel: Vec<&Record> = records.iter().filter(|r| r.test == GRADSYNC_TEST).collect();
    let Some(first) = sel.first() else {
        return Vec::new();
    };
    let impls: Vec<GradImpl> = GradImpl::ALL
        .into_iter()
        .filter(|i| sel.iter().any(|r| r.implementation == i.name()))
        .collect();
    let compressed: Vec<GradImpl> = impls
        .iter()
        .copied()
        .filter(|i| matches!(i, GradImpl::Compressed(_)))
        .collect();
    let mut headers = vec!["f32 bytes".to_string()];
    headers.extend(impls.iter().map(|i| format!("{} us", i.name())));
    headers.extend(compressed.iter().map(|i| format!("{} GB/s", i.name())));
    for base in [GradImpl::Ours, GradImpl::NcclF32] {
        if impls.contains(&base) {
            headers.extend(
                compressed
                    .iter()
                    .map(|i| format!("{} vs {}", i.name(), base.name())),
            );
        }
    }
    let rows = sizes_of(sel.iter().copied())
        .into_iter()
        .map(|bytes| {
            let get = |i: GradImpl| {
                sel.iter()
                    .copied()
                    .find(|r| r.bytes == bytes && r.implementation == i.name())
            };
            let mut row = vec![format_size(bytes)];
            row.extend(impls.iter().map(|&i| time_cell(get(i))));
            row.extend(compressed.iter().map(|&i| bw_cell(get(i), false)));
            for base in [GradImpl::Ours, GradImpl::NcclF32] {
                if impls.contains(&base) {
                    row.extend(compressed.iter().map(|&i| speedup(get(i), get(base))));
                }
            }
            row
        })
        .collect();
    vec![Table {
        title: format!(
            "gradient sync: compressed all-reduce of f32 gradients, {} PEs (CUDA graphs)",
            first.n_pes
        ),
        headers,
        rows,
        footer: vec![
            "us = median per call ± half the p10-p90 range; GB/s = f32 bytes / median \
             time; \"X vs Y\" = time of Y / time of X; ! = check failed"
                .into(),
        ],
    }]
}

/// The model table: a row per model and bucket size (`variant`), `compute` and `one call`
/// taken from the model's own rows (the same `bytes`).
pub fn step_tables(records: &[Record]) -> Vec<Table> {
    let groups = by_variant(records, |r| r.test == STEP_TEST);
    let Some((_, first)) = groups.first() else {
        return Vec::new();
    };
    let n_pes = first[0].n_pes;
    let of = |rows: &[&'_ Record], i: StepImpl| -> Option<Record> {
        rows.iter()
            .find(|r| r.implementation == i.name())
            .map(|r| (*r).clone())
    };
    let model_row = |bytes: usize, i: StepImpl| {
        records
            .iter()
            .find(|r| r.test == STEP_TEST && r.bytes == bytes && r.implementation == i.name())
    };
    let us = |r: Option<&Record>| r.and_then(|r| r.median_us());
    let mut rows = Vec::new();
    for (variant, recs) in &groups {
        let Some(sync) = of(recs, StepImpl::SyncOurs) else {
            continue;
        };
        let bytes = sync.bytes;
        let compute = model_row(bytes, StepImpl::Compute);
        let one = model_row(bytes, StepImpl::OneCall);
        let (step, step_nccl) = (of(recs, StepImpl::StepOurs), of(recs, StepImpl::StepNccl));
        let sync_nccl = of(recs, StepImpl::SyncNccl);
        let exposed = |s: Option<&Record>| match (us(s), us(compute)) {
            (Some(a), Some(c)) => Some(a - c),
            _ => None,
        };
        let cell = |v: Option<f64>| v.map_or("-".into(), fmt_us);
        let share = match (exposed(step.as_ref()), us(step.as_ref())) {
            (Some(e), Some(t)) if t > 0.0 => format!("{:.1}%", 100.0 * e / t),
            _ => "-".into(),
        };
        let floor = match (us(Some(&sync)), us(one)) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        rows.push(vec![
            variant.to_string(),
            time_cell(Some(&sync)),
            time_cell(sync_nccl.as_ref()),
            speedup(Some(&sync), sync_nccl.as_ref()),
            time_cell(one),
            floor,
            time_cell(compute),
            time_cell(step.as_ref()),
            time_cell(step_nccl.as_ref()),
            cell(exposed(step.as_ref())),
            share,
            cell(exposed(step_nccl.as_ref())),
        ]);
    }
    let headers = [
        "model",
        "sync ours us",
        "sync nccl us",
        "ours vs nccl",
        "one call us",
        "sync / one call",
        "compute us",
        "step ours us",
        "step nccl us",
        "exposed ours us",
        "exposed / step",
        "exposed nccl us",
    ];
    vec![Table {
        title: format!(
            "gradient sync of a model: bf16 linear layers data-parallel on {n_pes} PEs (CUDA graphs)"
        ),
        headers: headers.iter().map(|h| h.to_string()).collect(),
        rows,
        footer: vec![
            "sync = every bucket summed, no GEMM; one call = one all-reduce of all the \
             gradients; step = forward and backward GEMMs with each bucket summed on a side \
             stream once written; exposed = step - compute (the GEMMs alone)"
                .into(),
        ],
    }]
}
