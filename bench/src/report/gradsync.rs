//! The gradient-sync table: a row per size of f32 gradients, the time of each
//! implementation, the int8 row's effective bandwidth, and each compressed row's speed-up
//! over our plain f32 all-reduce and NCCL's.

use super::table::{bw_cell, sizes_of, speedup, time_cell, Table};
use super::Record;
use crate::cli::format_size;
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
