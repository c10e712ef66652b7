//! The algorithm without a GPU: the layout arithmetic, the reference, and the kernel's
//! schedule on a CPU model of the PEs.

use ring_pipeline::{cpu, random_input, Layout};

#[test]
fn layouts_cut_slots_into_chunks() {
    let l = Layout::new(4, 10, 4).unwrap();
    assert_eq!(
        (l.chunks_per_slot(), l.total_elems(), l.signal_count()),
        (3, 40, 12)
    );
    assert_eq!(l.slot(2), 20..30);
    assert_eq!(l.chunk(2, 0), 20..24);
    assert_eq!(l.chunk(2, 2), 28..30); // the short last chunk
    assert_eq!(l.signal_index(3, 2), 11);
    // Step 0 sends the own slot, then the one received from the previous PE.
    assert_eq!(
        (0..3).map(|s| l.slot_sent(1, s)).collect::<Vec<_>>(),
        [1, 0, 3]
    );
    // Chunks cover every slot exactly.
    for slot in 0..4 {
        let covered: Vec<usize> = (0..l.chunks_per_slot())
            .flat_map(|c| l.chunk(slot, c))
            .collect();
        assert_eq!(covered, l.slot(slot).collect::<Vec<_>>());
    }
    assert_eq!(Layout::new(2, 5, 100).unwrap().chunk_elems(), 5);
    assert!(Layout::new(0, 5, 1).is_err());
    assert!(Layout::new(2, 0, 1).is_err());
    assert!(Layout::new(2, 5, 0).is_err());
    assert!(Layout::new(3, usize::MAX / 2, 1).is_err());
}

#[test]
fn the_reference_is_every_input_in_pe_order() {
    let inputs = vec![vec![1, 2], vec![3, 4], vec![5, 6]];
    assert_eq!(cpu::reference(&inputs), [1, 2, 3, 4, 5, 6]);
    // Every PE can compute every PE's random input; they differ by PE, trial and seed.
    assert_eq!(random_input(7, 0, 1, 100), random_input(7, 0, 1, 100));
    assert_ne!(random_input(7, 0, 1, 100), random_input(7, 0, 2, 100));
    assert_ne!(random_input(7, 0, 1, 100), random_input(7, 1, 1, 100));
    assert_ne!(random_input(7, 0, 1, 100), random_input(8, 0, 1, 100));
}

/// The kernel's schedule, run on modelled PEs in many interleavings, gathers everything,
/// never deadlocks, never writes a chunk twice or into a PE's own slot, and works again on
/// the same buffers and signals in the next call.
#[test]
fn the_ring_pipeline_gathers_every_slot_on_every_pe() {
    let mut seed = 0x5eed;
    for n in 1..=8usize {
        for (elems, chunk) in [(1, 1), (7, 3), (16, 4), (33, 5), (10, 100)] {
            let layout = Layout::new(n, elems, chunk).unwrap();
            for blocks in [vec![1; n], vec![3; n], (0..n).map(|p| 1 + p % 4).collect()] {
                let calls: Vec<Vec<Vec<u32>>> = (0..3u64)
                    .map(|trial| {
                        (0..n)
                            .map(|pe| random_input(seed, trial, pe, elems))
                            .collect()
                    })
                    .collect();
                let results = cpu::simulate(&layout, &blocks, &calls, seed)
                    .unwrap_or_else(|e| panic!("{n} PEs, {elems}/{chunk}, blocks {blocks:?}: {e}"));
                for (k, per_pe) in results.iter().enumerate() {
                    let want = cpu::reference(&calls[k]);
                    for (pe, got) in per_pe.iter().enumerate() {
                        assert_eq!(
                            got, &want,
                            "{n} PEs, {elems}/{chunk}, blocks {blocks:?}, call {k}, PE {pe}"
                        );
                    }
                }
                seed = cpu::splitmix64(&mut seed);
            }
        }
    }
}

/// Whether the model notices that `program` is not a correct all-gather, in some
/// interleaving of 3 or 4 PEs.
fn caught(program: fn(&Layout, usize, usize, usize) -> Vec<cpu::Op>) -> bool {
    (3..=4usize).any(|n| {
        let layout = Layout::new(n, 12, 4).unwrap();
        (0..50u64).any(|seed| {
            let calls: Vec<Vec<Vec<u32>>> = (0..2u64)
                .map(|trial| (0..n).map(|pe| random_input(seed, trial, pe, 12)).collect())
                .collect();
            match cpu::simulate_with(&layout, &vec![2; n], &calls, seed, program) {
                Err(_) => true,
                Ok(results) => results.iter().zip(&calls).any(|(per_pe, inputs)| {
                    per_pe.iter().any(|got| got != &cpu::reference(inputs))
                }),
            }
        })
    })
}

#[test]
fn the_model_catches_broken_schedules() {
    // The kernel's own schedule passes this check...
    assert!(!caught(cpu::kernel_program));
    // ...forwarding chunks without waiting for them does not,
    assert!(caught(|l, me, b, g| {
        cpu::kernel_program(l, me, b, g)
            .into_iter()
            .filter(|op| matches!(op, cpu::Op::Put { .. }))
            .collect()
    }));
    // nor does returning before the last slot has arrived,
    assert!(caught(|l, me, b, g| {
        let mut ops = cpu::kernel_program(l, me, b, g);
        while matches!(ops.last(), Some(cpu::Op::Wait { .. })) {
            ops.pop();
        }
        ops
    }));
    // nor sending round the ring the wrong way.
    assert!(caught(|l, me, b, g| {
        let n = l.n_pes();
        cpu::kernel_program(l, me, b, g)
            .into_iter()
            .map(|op| match op {
                cpu::Op::Put { slot, c } => cpu::Op::Put {
                    slot: (2 * me + n - slot) % n,
                    c,
                },
                other => other,
            })
            .collect()
    }));

    // Inputs of the wrong length are refused, as are zero blocks.
    let layout = Layout::new(2, 4, 2).unwrap();
    assert!(cpu::simulate(&layout, &[1, 1], &[vec![vec![0u32; 3], vec![0; 4]]], 1).is_err());
    assert!(cpu::simulate(&layout, &[1, 0], &[vec![vec![0u32; 4], vec![0; 4]]], 1).is_err());
}
