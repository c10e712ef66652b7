//! Our collectives in a few calls: an all-reduce, an all-gather, a broadcast and an all-to-all,
//! each checked against what every PE can compute on its own.
//!
//! ```text
//! nvshmemrun -np 4 target/release/examples/all_reduce
//! ```

use nvshmem::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Collectives, Nvshmem, ReduceOp,
};

/// Elements of each PE's block.
const N: usize = 1 << 14;

fn main() {
    if let Err(e) = run() {
        eprintln!("all_reduce: {e}");
        std::process::exit(1);
    }
}

fn run() -> nvshmem::Result<()> {
    let shmem = Nvshmem::init()?;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let stream = shmem.stream();
    let coll = Collectives::new(&shmem)?;
    let mut wrong = 0;

    // All-reduce: PE p contributes p + 1 everywhere, so every element sums to n (n + 1) / 2.
    let x = shmem.malloc::<i32>(N)?;
    x.copy_from_host(&vec![me as i32 + 1; N])?;
    coll.all_reduce(&x, &x, ReduceOp::Sum, AllReduceAlgo::Auto, stream)?;
    let sum = (n * (n + 1) / 2) as i32;
    wrong += x.to_vec()?.iter().filter(|&&v| v != sum).count();

    // All-gather: block p of the output is PE p's input.
    let all = shmem.malloc::<i32>(N * n)?;
    x.copy_from_host(&vec![me as i32; N])?;
    coll.all_gather(&all, &x, AllGatherAlgo::Auto, stream)?;
    let got = all.to_vec()?;
    wrong += (0..N * n).filter(|&i| got[i] != (i / N) as i32).count();

    // Broadcast from the last PE, in place.
    let root = n - 1;
    x.copy_from_host(&vec![if me == root { 42 } else { -1 }; N])?;
    coll.broadcast(&x, &x, root, BroadcastAlgo::Auto, stream)?;
    wrong += x.to_vec()?.iter().filter(|&&v| v != 42).count();

    // All-to-all: PE p sends block q (holding p * n + q) to PE q.
    let src = shmem.malloc::<i32>(N * n)?;
    let dst = shmem.malloc::<i32>(N * n)?;
    let blocks: Vec<i32> = (0..N * n).map(|i| (me * n + i / N) as i32).collect();
    src.copy_from_host(&blocks)?;
    coll.all_to_all(&dst, &src, AllToAllAlgo::Auto, stream)?;
    let got = dst.to_vec()?;
    wrong += (0..N * n)
        .filter(|&i| got[i] != ((i / N) * n + me) as i32)
        .count();

    // A peer's fault shows here, not as garbage in the checks above.
    coll.check()?;
    println!(
        "all_reduce: PE {me}/{n}: all-reduce, all-gather, broadcast and all-to-all of {N} \
         elements per PE: {wrong} wrong elements"
    );
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
