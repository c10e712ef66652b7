//! The model of the PEs that runs a schedule in random interleavings, puts landing late.

use super::{kernel_program, splitmix64, Op};
use crate::Layout;

/// Run the ring all-gather `calls.len()` times on a model of `layout.n_pes()` PEs, PE
/// `p` with `blocks[p]` blocks; `calls[k][p]` is PE `p`'s input to call `k`. Returns
/// every PE's buffer as its kernel returns, for each call.
///
/// Blocks take turns in an order drawn from `seed`; a put's data and signal land at a
/// later random moment, its source read only then (the worst a non-blocking put may do).
/// A PE's kernel returns when its blocks are done and its own puts have landed (the
/// closing quiet). Between calls, as in the kernel's opening barrier, everything in
/// flight lands. Fails on a deadlock, a chunk written twice in one call, a write into a
/// PE's own slot, or data reaching a PE after its kernel returned.
pub fn simulate<T: Copy + Default>(
    layout: &Layout,
    blocks: &[usize],
    calls: &[Vec<Vec<T>>],
    seed: u64,
) -> Result<Vec<Vec<Vec<T>>>, String> {
    simulate_with(layout, blocks, calls, seed, kernel_program)
}

/// [`simulate`] with another schedule than the kernel's, to see the model catch
/// mistakes.
pub fn simulate_with<T: Copy + Default>(
    layout: &Layout,
    blocks: &[usize],
    calls: &[Vec<Vec<T>>],
    seed: u64,
    program: fn(&Layout, usize, usize, usize) -> Vec<Op>,
) -> Result<Vec<Vec<Vec<T>>>, String> {
    let n = layout.n_pes();
    if blocks.len() != n || blocks.contains(&0) {
        return Err(format!("need a non-zero block count for each of {n} PEs"));
    }
    let mut rng = seed;
    let mut data = vec![vec![T::default(); layout.total_elems()]; n];
    let mut signals = vec![vec![0u64; layout.signal_count()]; n];
    let mut results = Vec::new();
    for (k, inputs) in calls.iter().enumerate() {
        let epoch = k as u64 + 1;
        if inputs.len() != n {
            return Err(format!("call {k} has inputs for {} PEs", inputs.len()));
        }
        for (pe, input) in inputs.iter().enumerate() {
            if input.len() != layout.elems_per_pe() {
                return Err(format!("input of PE {pe} has {} elements", input.len()));
            }
            data[pe][layout.slot(pe)].copy_from_slice(input);
        }
        // (pe, program, next op)
        let mut actors: Vec<(usize, Vec<Op>, usize)> = (0..n)
            .flat_map(|pe| (0..blocks[pe]).map(move |b| (pe, b)))
            .map(|(pe, b)| (pe, program(layout, pe, b, blocks[pe]), 0))
            .collect();
        // (sending PE, slot, chunk)
        let mut in_flight: Vec<(usize, usize, usize)> = Vec::new();
        let mut returned: Vec<Option<Vec<T>>> = vec![None; n];
        loop {
            // Kernels that return now: blocks done, own puts landed.
            for pe in 0..n {
                let busy = actors
                    .iter()
                    .any(|(p, ops, pc)| *p == pe && *pc < ops.len())
                    || in_flight.iter().any(|(from, _, _)| *from == pe);
                if returned[pe].is_none() && !busy {
                    returned[pe] = Some(data[pe].clone());
                }
            }
            let runnable: Vec<usize> = (0..actors.len())
                .filter(|&a| {
                    let (pe, ops, pc) = &actors[a];
                    match ops.get(*pc) {
                        None => false,
                        Some(Op::Put { .. }) => true,
                        Some(&Op::Wait { slot, c }) => {
                            signals[*pe][layout.signal_index(slot, c)] >= epoch
                        }
                    }
                })
                .collect();
            if runnable.is_empty() && in_flight.is_empty() {
                if let Some((pe, ops, pc)) = actors.iter().find(|(_, ops, pc)| *pc < ops.len()) {
                    return Err(format!(
                        "call {k}: deadlock, PE {pe} stuck at {:?}",
                        ops[*pc]
                    ));
                }
                break;
            }
            // Either deliver a put or let a block take its next step.
            let pick = splitmix64(&mut rng) as usize % (runnable.len() + in_flight.len());
            if pick >= runnable.len() {
                let (from, slot, c) = in_flight.swap_remove(pick - runnable.len());
                let to = (from + 1) % n;
                if slot == to {
                    return Err(format!("call {k}: PE {from} overwrote PE {to}'s own slot"));
                }
                if returned[to].is_some() {
                    return Err(format!(
                        "call {k}: chunk {c} of slot {slot} reached PE {to} after its kernel returned"
                    ));
                }
                let sig = layout.signal_index(slot, c);
                if signals[to][sig] >= epoch {
                    return Err(format!(
                        "call {k}: chunk {c} of slot {slot} reached PE {to} twice"
                    ));
                }
                let range = layout.chunk(slot, c);
                let chunk = data[from][range.clone()].to_vec();
                data[to][range].copy_from_slice(&chunk);
                signals[to][sig] = epoch;
            } else {
                let actor = &mut actors[runnable[pick]];
                if let Op::Put { slot, c } = actor.1[actor.2] {
                    in_flight.push((actor.0, slot, c));
                }
                actor.2 += 1;
            }
        }
        results.push(
            returned
                .into_iter()
                .map(|d| d.unwrap_or_default())
                .collect(),
        );
    }
    Ok(results)
}
