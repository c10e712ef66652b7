//! What each block of `ring_allgather` does, as a list of waits and puts.

use crate::Layout;

/// One thing a block of the kernel does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `nvshmem_signal_wait_until(signals[slot, c], GE, epoch)`.
    Wait { slot: usize, c: usize },
    /// `nvshmemx_putmem_signal_nbi_block` of chunk `c` of `slot` to the next PE.
    Put { slot: usize, c: usize },
}

/// What block `block` of `blocks` on PE `me` does, in order, as `ring_allgather` does it.
pub fn kernel_program(layout: &Layout, me: usize, block: usize, blocks: usize) -> Vec<Op> {
    let n = layout.n_pes();
    let mut ops = Vec::new();
    if n == 1 {
        return ops;
    }
    let chunks = layout.chunks_per_slot();
    for step in 0..n - 1 {
        let slot = layout.slot_sent(me, step);
        for c in (block..chunks).step_by(blocks) {
            if step > 0 {
                ops.push(Op::Wait { slot, c });
            }
            ops.push(Op::Put { slot, c });
        }
    }
    let last = (me + 1) % n;
    for c in (block..chunks).step_by(blocks) {
        ops.push(Op::Wait { slot: last, c });
    }
    ops
}
