//! The checks every fused exchange must pass, shared by the column- and row-parallel layers.

use nvshmem::tp::Schedule;
use nvshmem::{bf16, Error, ReduceOp};

use crate::harness::{capture, sync, text, Checks, Outcome};
use crate::reference::bits;

/// One fused layer call as [`fused_exchange`] drives it, over three inputs in input slots
/// 0..3 and nine output slots.
pub struct FusedIo<'a> {
    /// Enqueue layer `l`'s (0 or 1, built alike) call in a schedule on input slot `i` into
    /// output slot `o`, on the checks' stream.
    pub call: &'a dyn Fn(usize, usize, usize, Schedule) -> Result<(), Error>,
    /// Output slot `o`.
    pub read: &'a dyn Fn(usize) -> Result<Vec<bf16>, String>,
    /// Fill output slot `o` with NaN.
    pub poison: &'a dyn Fn(usize) -> Outcome,
    /// Copy input `i`'s data into input slot 0.
    pub reload: &'a dyn Fn(usize) -> Outcome,
    /// Check the output of input `i` against the f64 reference.
    pub check: &'a dyn Fn(usize, &[bf16]) -> Outcome,
}

/// The checks every fused exchange ([`Schedule::Fused`] of the sequence-parallel layers)
/// must pass: each input's output against the f64 reference, with the PEs after the first
/// arriving late (their chunks reach PE 0 while its GEMM runs: with no wait, PE 0 would use
/// the previous call's); calls back to back on one stream, alternating between two layers
/// (each with its own flags) and each followed by an all-reduce, so that every chunk's
/// credit comes round before the next call writes; sequential and fused calls mixed on one
/// layer, back to back; and a captured call replayed on new
/// inputs. Each gives what the same call made alone gives, bit for bit.
pub fn fused_exchange(c: &Checks, io: &FusedIo) -> Outcome {
    let s = &c.stream;
    let mut want = Vec::new();
    for i in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(20 * c.me() as u64));
        (io.call)(0, i, i, Schedule::Fused).map_err(text)?;
        sync(s).map_err(text)?;
        let got = (io.read)(i)?;
        (io.check)(i, &got)?;
        want.push(bits(&got));
    }
    let (ar_src, ar_dst) = (
        c.shmem.malloc::<f32>(1000).map_err(text)?,
        c.shmem.malloc::<f32>(1000).map_err(text)?,
    );
    ar_src
        .copy_from_host(&vec![(c.me() + 1) as f32; 1000])
        .map_err(text)?;
    let order = [0, 1, 2, 2, 1, 0];
    for o in 3..3 + order.len() {
        (io.poison)(o)?;
    }
    for (call, &i) in order.iter().enumerate() {
        (io.call)(call % 2, i, 3 + call, Schedule::Fused).map_err(text)?;
        c.tp.collectives()
            .all_reduce(
                &ar_dst,
                &ar_src,
                ReduceOp::Sum,
                nvshmem::AllReduceAlgo::Auto,
                s,
            )
            .map_err(text)?;
    }
    sync(s).map_err(text)?;
    for (call, &i) in order.iter().enumerate() {
        if bits(&(io.read)(3 + call)?) != want[i] {
            return Err(format!(
                "back-to-back call {call} (input {i}) differs from the same call made alone"
            ));
        }
    }
    let total = (c.n() * (c.n() + 1) / 2) as f32;
    if ar_dst.to_vec().map_err(text)?.iter().any(|&v| v != total) {
        return Err(format!(
            "the all-reduces between fused calls did not all give {total}"
        ));
    }
    // Schedules mixed on one layer, back to back: a fused call after a sequential one must
    // not write into a peer's buffer while that peer's sequential GEMM still reads it.
    let mixed = [
        (Schedule::Sequential, 1),
        (Schedule::Fused, 2),
        (Schedule::Sequential, 0),
        (Schedule::Fused, 1),
    ];
    for o in 3..3 + mixed.len() {
        (io.poison)(o)?;
    }
    for (call, &(schedule, i)) in mixed.iter().enumerate() {
        (io.call)(0, i, 3 + call, schedule).map_err(text)?;
    }
    sync(s).map_err(text)?;
    for (call, &(schedule, i)) in mixed.iter().enumerate() {
        let got = (io.read)(3 + call)?;
        match schedule {
            Schedule::Fused if bits(&got) != want[i] => {
                return Err(format!(
                    "fused call {call} (input {i}) after a sequential one differs from the \
                     same call made alone"
                ))
            }
            Schedule::Fused => {}
            _ => (io.check)(i, &got)?,
        }
    }
    // A graph of one call, replayed with each input copied into its input slot.
    let graph = capture(s, || (io.call)(1, 0, 0, Schedule::Fused))?;
    for i in (0..3).rev() {
        (io.reload)(i)?;
        (io.poison)(0)?;
        graph.launch().map_err(|e| format!("cuGraphLaunch: {e}"))?;
        sync(s).map_err(text)?;
        if bits(&(io.read)(0)?) != want[i] {
            return Err(format!(
                "graph replay on input {i} differs from the eager call"
            ));
        }
    }
    Ok(())
}
