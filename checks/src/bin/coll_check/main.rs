//! GPU checks of our device collectives (kernels/collectives.cu), on random data against a
//! CPU reference computed exactly as the kernels do (PE order, f32 accumulation), so results
//! must match bit for bit on every PE.
//!
//! ```text
//! scripts/nvshmrun -np 4 target/release/coll_check
//! ```
//! Prints `N passed, M failed` on PE 0 and exits non-zero if anything failed.
//!
//! With `--soak SECONDS`, runs random calls instead until the time is up: every collective,
//! algorithm, type, size, in and out of place, on the runtime's stream, alternating streams
//! and graph replays, each checked; the PEs draw the same arguments from one seed, so they
//! agree without talking. Prints the operations done, the failures (0), and this PE's free
//! device memory and symmetric heap in use at the start and the end (which must match).

use nvshmem::{
    bf16, f16, AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, Collectives,
    CollectivesConfig, DataType, Element, Error, Nvshmem, ReduceAlgo, ReduceOp, ReduceScatterAlgo,
    Result, SymmetricBuffer,
};
use std::time::{Duration, Instant};

use nvshmem_checks::graph;
use nvshmem_checks::splitmix;

use graph::capture;

use splitmix::{SplitMix64, GOLDEN};

/// The random values of one check on one PE (splitmix64, seeded by the check and the PE).
struct Rng(SplitMix64);

impl Rng {
    fn new(check: u64, pe: usize) -> Self {
        Rng(SplitMix64(
            check.wrapping_mul(GOLDEN) ^ (pe as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
        ))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Every all-reduce algorithm that takes i32 (all but `Auto` and the sentinel paths).
const INT_ALGOS: [AllReduceAlgo; 5] = [
    AllReduceAlgo::LowLatency,
    AllReduceAlgo::LowLatencyTwoShot,
    AllReduceAlgo::OneShot,
    AllReduceAlgo::TwoShot,
    AllReduceAlgo::Bandwidth,
];

/// A type our all-reduce supports, with the kernel's arithmetic on the CPU.
trait Reducible: Element {
    type Acc: Copy;
    fn random(rng: &mut Rng) -> Self;
    fn to_acc(self) -> Self::Acc;
    fn from_acc(a: Self::Acc) -> Self;
    fn apply(op: ReduceOp, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn bits(self) -> u64;
    /// The element with every bit set (a NaN in the float types).
    fn all_ones() -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! float_like {
    ($t:ty, $to:expr, $from:expr, $bits:expr) => {
        impl Reducible for $t {
            type Acc = f32;
            fn random(rng: &mut Rng) -> Self {
                $from(rng.unit() * 4.0)
            }
            fn to_acc(self) -> f32 {
                $to(self)
            }
            fn from_acc(a: f32) -> Self {
                $from(a)
            }
            fn apply(op: ReduceOp, a: f32, b: f32) -> f32 {
                match op {
                    ReduceOp::Sum => a + b,
                    ReduceOp::Max => a.max(b),
                    _ => a.min(b),
                }
            }
            fn bits(self) -> u64 {
                $bits(self)
            }
            fn all_ones() -> Self {
                Self::from_bits(!0)
            }
            fn is_nan(self) -> bool {
                $to(self).is_nan()
            }
        }
    };
}

float_like!(f32, |v: f32| v, |a: f32| a, |v: f32| v.to_bits() as u64);
float_like!(
    f16,
    |v: f16| v.to_f32(),
    f16::from_f32,
    |v: f16| v.to_bits() as u64
);
float_like!(
    bf16,
    |v: bf16| v.to_f32(),
    bf16::from_f32,
    |v: bf16| v.to_bits() as u64
);

impl Reducible for i32 {
    type Acc = i32;
    fn random(rng: &mut Rng) -> Self {
        (rng.next() % 2001) as i32 - 1000
    }
    fn to_acc(self) -> i32 {
        self
    }
    fn from_acc(a: i32) -> Self {
        a
    }
    fn apply(op: ReduceOp, a: i32, b: i32) -> i32 {
        match op {
            ReduceOp::Sum => a.wrapping_add(b),
            ReduceOp::Max => a.max(b),
            _ => a.min(b),
        }
    }
    fn bits(self) -> u64 {
        self as u32 as u64
    }
    fn all_ones() -> Self {
        -1
    }
    fn is_nan(self) -> bool {
        false
    }
}

struct Checker {
    shmem: Nvshmem,
    passed: usize,
    failed: usize,
    seq: u64,
}

impl Checker {
    /// Run one named check on every PE; it fails if it fails on any PE.
    fn check(&mut self, name: &str, f: impl FnOnce(&Nvshmem, u64) -> Result<()>) {
        self.seq += 1;
        let mine = match f(&self.shmem, self.seq) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("PE {}: FAIL {name}: {e}", self.shmem.my_pe());
                if matches!(e, Error::Cuda { .. }) {
                    // A kernel fault leaves the context unusable and peers waiting: stop all.
                    eprintln!(
                        "PE {}: CUDA context lost, aborting the run",
                        self.shmem.my_pe()
                    );
                    std::process::exit(3);
                }
                1
            }
        };
        match any_pe(&self.shmem, mine) {
            Ok(0) => self.passed += 1,
            Ok(_) => {
                self.failed += 1;
                if self.shmem.my_pe() == 0 {
                    println!("FAIL {name}");
                }
            }
            Err(e) => {
                eprintln!(
                    "PE {}: cannot combine results of {name}: {e}",
                    self.shmem.my_pe()
                );
                self.failed += 1;
            }
        }
    }
}

/// Sum of a per-PE count over all PEs, through NVSHMEM's own reduction (not our kernels).
fn any_pe(shmem: &Nvshmem, mine: i32) -> Result<i32> {
    let buf = shmem.malloc::<i32>(2)?;
    buf.view(..1).copy_from_host(&[mine])?;
    shmem
        .team_world()
        .all_reduce(buf.view(1..), buf.view(..1), ReduceOp::Sum, shmem.stream())?;
    Ok(buf.to_vec()?[1])
}

fn sync(shmem: &Nvshmem) -> Result<()> {
    shmem.stream().synchronize().map_err(|source| Error::Cuda {
        call: "cuStreamSynchronize",
        source,
    })
}

fn inputs<T: Reducible>(seed: u64, n_pes: usize, n: usize) -> Vec<Vec<T>> {
    (0..n_pes)
        .map(|pe| {
            let mut rng = Rng::new(seed, pe);
            (0..n).map(|_| T::random(&mut rng)).collect()
        })
        .collect()
}

/// A new symmetric buffer holding each of `data`: the inputs of calls made back to back.
fn uploaded<'a>(
    shmem: &Nvshmem,
    data: impl IntoIterator<Item = &'a [f32]>,
) -> Result<Vec<SymmetricBuffer<f32>>> {
    data.into_iter()
        .map(|x| {
            let b = shmem.malloc::<f32>(x.len())?;
            b.copy_from_host(x)?;
            Ok(b)
        })
        .collect()
}

/// `count` new zeroed symmetric buffers of `len` elements: the outputs of such calls.
fn zeroed(shmem: &Nvshmem, count: usize, len: usize) -> Result<Vec<SymmetricBuffer<f32>>> {
    (0..count).map(|_| shmem.calloc::<f32>(len)).collect()
}

fn reference<T: Reducible>(op: ReduceOp, all: &[Vec<T>]) -> Vec<T> {
    (0..all[0].len())
        .map(|i| {
            let mut a = all[0][i].to_acc();
            for pe in &all[1..] {
                a = T::apply(op, a, pe[i].to_acc());
            }
            T::from_acc(a)
        })
        .collect()
}

fn compare<T: Reducible>(what: &str, got: &[T], want: &[T]) -> Result<()> {
    if let Some(i) = (0..want.len()).find(|&i| got[i].bits() != want[i].bits()) {
        let wrong = (0..want.len())
            .filter(|&i| got[i].bits() != want[i].bits())
            .count();
        return Err(Error::InvalidArgument(format!(
            "{what}: {wrong} of {} elements differ, first at {i}: got {:?}, want {:?}",
            want.len(),
            got[i],
            want[i]
        )));
    }
    Ok(())
}

fn all_reduce_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    op: ReduceOp,
    algo: AllReduceAlgo,
    n: usize,
    in_place: bool,
) -> Result<()> {
    let me = shmem.my_pe();
    let all = inputs::<T>(seed, shmem.n_pes(), n);
    let want = reference(op, &all);
    let src = shmem.malloc::<T>(n)?;
    src.copy_from_host(&all[me])?;
    let dst = if in_place {
        None
    } else {
        let d = shmem.malloc::<T>(n)?;
        // Poison the output so an unwritten element shows.
        d.copy_from_host(&vec![
            T::from_acc(T::random(&mut Rng::new(999, me)).to_acc());
            n
        ])?;
        Some(d)
    };
    let out: &SymmetricBuffer<T> = dst.as_ref().unwrap_or(&src);
    coll.all_reduce(out, &src, op, algo, shmem.stream())?;
    sync(shmem)?;
    compare("all_reduce", &out.to_vec()?, &want)
}

/// Each PE's block of the reduced inputs: `src` is `n_pes` blocks of `n`.
fn reduce_scatter_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (op, algo): (ReduceOp, ReduceScatterAlgo),
    n: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let all = inputs::<T>(seed, np, n * np);
    let want = reference(op, &all)[me * n..(me + 1) * n].to_vec();
    let src = shmem.malloc::<T>(n * np)?;
    src.copy_from_host(&all[me])?;
    let dst = shmem.malloc::<T>(n)?;
    // Poison the output so an unwritten element shows.
    dst.copy_from_host(&vec![
        T::from_acc(T::random(&mut Rng::new(999, me)).to_acc());
        n
    ])?;
    coll.reduce_scatter(&dst, &src, op, algo, shmem.stream())?;
    sync(shmem)?;
    compare("reduce_scatter", &dst.to_vec()?, &want)
}

/// Reduce-scatters back to back on one stream, then one captured in a graph and replayed:
/// each must leave its own result.
fn reduce_scatter_repeated(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: ReduceScatterAlgo,
    n: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let rounds: Vec<Vec<Vec<f32>>> = (0..3)
        .map(|r| inputs::<f32>(seed + r, np, n * np))
        .collect();
    let srcs = uploaded(shmem, rounds.iter().map(|all| &all[me][..]))?;
    let dsts = zeroed(shmem, 3, n)?;
    for (s, d) in srcs.iter().zip(&dsts) {
        coll.reduce_scatter(d, s, ReduceOp::Sum, algo, shmem.stream())?;
    }
    sync(shmem)?;
    let want = |r: usize| reference(ReduceOp::Sum, &rounds[r])[me * n..(me + 1) * n].to_vec();
    // A mismatch is reported after the graph part, which every PE must run (its replays wait
    // for every PE).
    let mut found = Ok(());
    for (r, d) in dsts.iter().enumerate() {
        found = found.and(compare(
            &format!("back-to-back reduce_scatter {r}"),
            &d.to_vec()?,
            &want(r),
        ));
    }
    let stream = shmem.new_stream()?;
    let graph = capture(&stream, || {
        coll.reduce_scatter(&dsts[0], &srcs[0], ReduceOp::Sum, algo, &stream)
    })?;
    for r in [1, 2] {
        srcs[0].copy_from_host(&rounds[r][me])?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        found = found.and(compare(
            &format!("graph replay of reduce_scatter {r}"),
            &dsts[0].to_vec()?,
            &want(r),
        ));
    }
    found
}

/// Every PE's input of case `seed` (`len` elements each); this PE's in a new symmetric
/// buffer; and a new output of as many elements filled with other random data, which an
/// element the call does not write keeps: `(all, src, dst, that data)`.
#[allow(clippy::type_complexity)]
fn operands<T: Reducible>(
    shmem: &Nvshmem,
    seed: u64,
    len: usize,
) -> Result<(Vec<Vec<T>>, SymmetricBuffer<T>, SymmetricBuffer<T>, Vec<T>)> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let all = inputs::<T>(seed, np, len);
    let src = shmem.malloc::<T>(len)?;
    src.copy_from_host(&all[me])?;
    let poison = inputs::<T>(seed ^ 0xD57, np, len).swap_remove(me);
    let dst = shmem.malloc::<T>(len)?;
    dst.copy_from_host(&poison)?;
    Ok((all, src, dst, poison))
}

/// `dst = op over PEs of src` on `root` (`dst` is `src` itself when `in_place`); on the
/// other PEs `dst` must keep what it held.
fn reduce_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (op, root, in_place): (ReduceOp, usize, bool),
    n: usize,
) -> Result<()> {
    let me = shmem.my_pe();
    let (all, src, dst, poison) = operands::<T>(shmem, seed, n)?;
    let dst = if in_place { &src } else { &dst };
    coll.reduce(dst, &src, op, root, ReduceAlgo::Auto, shmem.stream())?;
    sync(shmem)?;
    let want = match (me == root, in_place) {
        (true, _) => reference(op, &all),
        (false, true) => all[me].clone(),
        (false, false) => poison,
    };
    compare("reduce", &dst.to_vec()?, &want)
}

/// `dst = src on root` on every PE (`dst` is `src` itself when `in_place`).
fn broadcast_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (algo, root, in_place): (BroadcastAlgo, usize, bool),
    n: usize,
) -> Result<()> {
    let (all, src, dst, _) = operands::<T>(shmem, seed, n)?;
    let dst = if in_place { &src } else { &dst };
    coll.broadcast(dst, &src, root, algo, shmem.stream())?;
    sync(shmem)?;
    compare("broadcast", &dst.to_vec()?, &all[root])
}

/// Block `me` of every PE's input, in PE order: what this PE's all-to-all output must be.
fn all_to_all_want<T: Reducible>(all: &[Vec<T>], me: usize, block: usize) -> Vec<T> {
    all.iter()
        .flat_map(|src| src[me * block..(me + 1) * block].iter().copied())
        .collect()
}

fn all_to_all_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllToAllAlgo,
    block: usize,
) -> Result<()> {
    let me = shmem.my_pe();
    let (all, src, dst, _) = operands::<T>(shmem, seed, block * shmem.n_pes())?;
    coll.all_to_all(&dst, &src, algo, shmem.stream())?;
    sync(shmem)?;
    compare(
        "all_to_all",
        &dst.to_vec()?,
        &all_to_all_want(&all, me, block),
    )
}

/// Broadcasts from every root and all-to-alls, back to back on one stream with the same
/// buffers and no host synchronisation, then an all-to-all captured in a graph and replayed
/// on new inputs: each must leave its own result.
fn movement_repeated(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (algo, a2a): (BroadcastAlgo, AllToAllAlgo),
    block: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let n = block * np;
    let rounds: Vec<Vec<Vec<f32>>> = (0..np as u64 + 2)
        .map(|r| inputs::<f32>(seed + r, np, n))
        .collect();
    let srcs = uploaded(shmem, rounds.iter().map(|all| &all[me][..]))?;
    // One output per round, each written by a broadcast from root r and then, in the same
    // buffer's second half of the rounds, by an all-to-all.
    let dsts = zeroed(shmem, rounds.len(), n)?;
    let s = shmem.stream();
    for (r, (src, dst)) in srcs.iter().zip(&dsts).enumerate() {
        if r < np {
            coll.broadcast(dst, src, r, algo, s)?;
        } else {
            coll.all_to_all(dst, src, a2a, s)?;
        }
    }
    sync(shmem)?;
    let want = |r: usize| match r < np {
        true => rounds[r][r].clone(),
        false => all_to_all_want(&rounds[r], me, block),
    };
    let mut found = Ok(());
    for (r, d) in dsts.iter().enumerate() {
        found = found.and(compare(
            &format!("back-to-back call {r}"),
            &d.to_vec()?,
            &want(r),
        ));
    }
    // Every PE runs the graph part whatever it found (its replays wait for every PE).
    let stream = shmem.new_stream()?;
    let last = rounds.len() - 1;
    let graph = capture(&stream, || {
        coll.all_to_all(&dsts[0], &srcs[0], a2a, &stream)
    })?;
    for r in [last - 1, last] {
        srcs[0].copy_from_host(&rounds[r][me])?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        found = found.and(compare(
            &format!("graph replay of all_to_all {r}"),
            &dsts[0].to_vec()?,
            &all_to_all_want(&rounds[r], me, block),
        ));
    }
    found
}

/// `calls` broadcasts from `root` back to back, each into an output of its own, with no host
/// synchronisation in between, the other PEs enqueueing theirs 20 ms late: the root must not
/// run ahead into staging its peers have not read yet.
fn broadcast_burst(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    (algo, root, calls): (BroadcastAlgo, usize, usize),
    n: usize,
) -> Result<()> {
    let np = shmem.n_pes();
    let rounds: Vec<Vec<f32>> = (0..calls as u64)
        .map(|r| inputs::<f32>(seed + r, np, n).swap_remove(root))
        .collect();
    let srcs = uploaded(shmem, rounds.iter().map(|x| &x[..]))?;
    let dsts = zeroed(shmem, calls, n)?;
    sync(shmem)?;
    if shmem.my_pe() != root {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (src, dst) in srcs.iter().zip(&dsts) {
        coll.broadcast(dst, src, root, algo, shmem.stream())?;
    }
    sync(shmem)?;
    let mut found = Ok(());
    for (r, d) in dsts.iter().enumerate() {
        found = found.and(compare(&format!("broadcast {r}"), &d.to_vec()?, &rounds[r]));
    }
    found
}

/// Broadcasts between all-reduces, back to back with no host synchronisation: a one-shot
/// all-reduce (staging of one epoch parity; the bandwidth one around the relay, whose round
/// flags it shares), a broadcast from a rotating root, a low-latency all-reduce (lines of the
/// other parity), `rounds` times. A broadcast that let a PE run ahead into the next call
/// would let it overwrite staging or lines a peer still reads.
fn broadcast_between_reductions(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: BroadcastAlgo,
    (rounds, n): (usize, usize),
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let data: Vec<Vec<Vec<f32>>> = (0..3 * rounds as u64)
        .map(|r| inputs::<f32>(seed + r, np, n))
        .collect();
    let bufs = uploaded(shmem, data.iter().map(|all| &all[me][..]))?;
    let outs = zeroed(shmem, bufs.len(), n)?;
    let s = shmem.stream();
    let sum = |i: usize, a: AllReduceAlgo| coll.all_reduce(&outs[i], &bufs[i], ReduceOp::Sum, a, s);
    // The relay's round flags are the bandwidth all-reduce's: it goes between those.
    let first = match algo {
        BroadcastAlgo::Relay => AllReduceAlgo::Bandwidth,
        _ => AllReduceAlgo::OneShot,
    };
    for r in 0..rounds {
        sum(3 * r, first)?;
        coll.broadcast(&outs[3 * r + 1], &bufs[3 * r + 1], r % np, algo, s)?;
        sum(3 * r + 2, AllReduceAlgo::LowLatency)?;
    }
    sync(shmem)?;
    let mut found = Ok(());
    for (i, out) in outs.iter().enumerate() {
        let want = match i % 3 {
            1 => data[i][(i / 3) % np].clone(),
            _ => reference(ReduceOp::Sum, &data[i]),
        };
        found = found.and(compare(&format!("call {i}"), &out.to_vec()?, &want));
    }
    found
}

/// A random count matrix, the same on every PE: `c[p][q]` elements go from PE `p` to PE `q`,
/// up to `max` (zeros included).
fn count_matrix(seed: u64, np: usize, max: usize) -> Vec<Vec<usize>> {
    let mut rng = Rng::new(seed ^ 0xC0C0, 0);
    (0..np)
        .map(|_| {
            (0..np)
                .map(|_| (rng.next() % (max as u64 + 1)) as usize)
                .collect()
        })
        .collect()
}

/// What PE `me` must receive in an all-to-all-v of `c`, where `all[p]` is PE `p`'s input.
fn all_to_all_v_want<T: Reducible>(all: &[Vec<T>], c: &[Vec<usize>], me: usize) -> Vec<T> {
    (0..c.len())
        .flat_map(|p| {
            let from: usize = c[p][..me].iter().sum();
            all[p][from..from + c[p][me]].iter().copied()
        })
        .collect()
}

/// Two all-to-all-v calls with different random counts back to back on one stream, then
/// the first captured in a graph and replayed on new inputs. Elements of `dst` past what this
/// PE receives must keep their poison.
fn all_to_all_v_case(shmem: &Nvshmem, coll: &Collectives, seed: u64, max: usize) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let mats = [count_matrix(seed, np, max), count_matrix(seed + 1, np, max)];
    let cap = max * np + 5;
    let rounds: Vec<Vec<Vec<f32>>> = (0..4)
        .map(|r| inputs::<f32>(seed + 7 * r, np, cap))
        .collect();
    let poison = inputs::<f32>(seed ^ 0xD57, np, cap)[me].clone();
    let srcs = (0..2)
        .map(|r| {
            let b = shmem.malloc::<f32>(cap)?;
            b.copy_from_host(&rounds[r][me])?;
            Ok(b)
        })
        .collect::<Result<Vec<_>>>()?;
    let dsts = (0..2)
        .map(|_| {
            let b = shmem.malloc::<f32>(cap)?;
            b.copy_from_host(&poison)?;
            Ok(b)
        })
        .collect::<Result<Vec<_>>>()?;
    let counts = |c: &[Vec<usize>]| {
        let send = c[me].clone();
        let recv: Vec<usize> = (0..np).map(|p| c[p][me]).collect();
        (send, recv)
    };
    for ((mat, dst), src) in mats.iter().zip(&dsts).zip(&srcs) {
        let (send, recv) = counts(mat);
        coll.all_to_all_v(dst, &recv, src, &send, shmem.stream())?;
    }
    sync(shmem)?;
    let want = |r: usize, data: usize| {
        let mut w = all_to_all_v_want(&rounds[data], &mats[r], me);
        let got = w.len();
        w.extend_from_slice(&poison[got..]);
        w
    };
    let mut found = Ok(());
    for (r, dst) in dsts.iter().enumerate() {
        found = found.and(compare(
            &format!("all_to_all_v {r}"),
            &dst.to_vec()?,
            &want(r, r),
        ));
    }
    let stream = shmem.new_stream()?;
    let (send, recv) = counts(&mats[0]);
    let graph = capture(&stream, || {
        coll.all_to_all_v(&dsts[0], &recv, &srcs[0], &send, &stream)
    })?;
    for data in [2, 3] {
        srcs[0].copy_from_host(&rounds[data][me])?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        found = found.and(compare(
            &format!("graph replay of all_to_all_v on inputs {data}"),
            &dsts[0].to_vec()?,
            &want(0, data),
        ));
    }
    found
}

/// The last PE expects one element more from PE 0 than PE 0 sends: on a Collectives of its
/// own (a mismatch leaves it unusable), both must report the pair, and nothing may land in
/// the last PE's output from PE 0.
fn all_to_all_v_mismatch(shmem: &Nvshmem, seed: u64) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let coll = Collectives::new(shmem)?;
    let c = count_matrix(seed, np, 9);
    let send = c[me].clone();
    let mut recv: Vec<usize> = (0..np).map(|p| c[p][me]).collect();
    if me == np - 1 {
        recv[0] += 1;
    }
    let cap = 9 * np + 1;
    let src = shmem.malloc::<f32>(cap)?;
    src.copy_from_host(&inputs::<f32>(seed, np, cap)[me])?;
    let poison = inputs::<f32>(seed ^ 0xD57, np, cap)[me].clone();
    let dst = shmem.malloc::<f32>(cap)?;
    dst.copy_from_host(&poison)?;
    coll.all_to_all_v(&dst, &recv, &src, &send, shmem.stream())?;
    sync(shmem)?;
    let involved = me == 0 || me == np - 1;
    match (coll.check(), involved) {
        (Err(Error::CollectiveMismatch(msg)), true) => {
            let pair = format!(
                "PE 0 sends {} elements to PE {}, which expects {}",
                c[0][np - 1],
                np - 1,
                c[0][np - 1] + 1
            );
            if !msg.contains(&pair) {
                return Err(Error::InvalidArgument(format!(
                    "the mismatch says: {msg}; expected: {pair}"
                )));
            }
        }
        (Ok(()), false) => {}
        (other, _) => {
            return Err(Error::InvalidArgument(format!(
                "PE {me} (involved: {involved}) got {other:?} after mismatched counts"
            )))
        }
    }
    if me == np - 1 {
        // PE 0's block is the first: nothing of it may have landed.
        let got = dst.to_vec()?;
        compare(
            "the receiver's block from PE 0",
            &got[..recv[0]],
            &poison[..recv[0]],
        )?;
    }
    Ok(())
}

fn all_gather_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllGatherAlgo,
    n: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let all = inputs::<T>(seed, np, n);
    let src = shmem.malloc::<T>(n)?;
    src.copy_from_host(&all[me])?;
    let dst = shmem.calloc::<T>(n * np)?;
    coll.all_gather(&dst, &src, algo, shmem.stream())?;
    sync(shmem)?;
    let want: Vec<T> = all.concat();
    compare("all_gather", &dst.to_vec()?, &want)
}

/// Low-latency all-gathers of `n` bf16 per PE, a block that is not a multiple of 8 bytes
/// (by output words on more than 2 PEs, lines stored in pieces on 2): four back to back on
/// one stream, each on inputs and into an output of its own (so that lines left set, or
/// taken by the wrong call, show), then two captured in a graph and replayed on new inputs.
fn all_gather_words_repeated(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    n: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let algo = AllGatherAlgo::LowLatency;
    let calls = 4;
    let srcs = (0..calls)
        .map(|_| shmem.malloc::<bf16>(n))
        .collect::<Result<Vec<_>>>()?;
    let dsts = (0..calls)
        .map(|_| shmem.calloc::<bf16>(n * np))
        .collect::<Result<Vec<_>>>()?;
    let fill = |seed: u64| -> Result<Vec<Vec<bf16>>> {
        let all: Vec<_> = (0..calls as u64)
            .map(|c| inputs::<bf16>(seed + c, np, n))
            .collect();
        for (src, mine) in srcs.iter().zip(&all) {
            src.copy_from_host(&mine[me])?;
        }
        Ok(all.into_iter().map(|a| a.concat()).collect())
    };
    let want = fill(seed)?;
    let s = shmem.stream();
    for (dst, src) in dsts.iter().zip(&srcs) {
        coll.all_gather(dst, src, algo, s)?;
    }
    sync(shmem)?;
    let mut found = Ok(());
    for (c, (dst, want)) in dsts.iter().zip(&want).enumerate() {
        found = found.and(compare(
            &format!("back-to-back all_gather {c}"),
            &dst.to_vec()?,
            want,
        ));
    }
    let stream = shmem.new_stream()?;
    let graph = capture(&stream, || {
        coll.all_gather(&dsts[0], &srcs[0], algo, &stream)?;
        coll.all_gather(&dsts[1], &srcs[1], algo, &stream)
    })?;
    for round in [1u64, 2] {
        let want = fill(seed + 100 * round)?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        for c in 0..2 {
            found = found.and(compare(
                &format!("graph replay {round} of all_gather {c}"),
                &dsts[c].to_vec()?,
                &want[c],
            ));
        }
    }
    found
}

/// All-gathers chained back to back on one stream (each call gathers the blocks the call
/// before it gathered, shifted by one PE, so a call that reads its input early, or writes a
/// peer's output before that peer is done with it, shows), then one captured in a graph and
/// replayed on new inputs.
fn all_gather_repeated(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllGatherAlgo,
    n: usize,
) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let all = inputs::<f32>(seed, np, n);
    let bufs = zeroed(shmem, 4, n * np)?;
    let src = shmem.malloc::<f32>(n)?;
    src.copy_from_host(&all[me])?;
    let s = shmem.stream();
    coll.all_gather(&bufs[0], &src, algo, s)?;
    // Round r gathers block (me + 1) % np of round r - 1's output: PE p's block of round r
    // is PE p + r's input.
    let next = (me + 1) % np;
    for r in 1..bufs.len() {
        let from = bufs[r - 1].view(next * n..(next + 1) * n);
        coll.all_gather(&bufs[r], from, algo, s)?;
    }
    sync(shmem)?;
    let mut found = Ok(());
    for (r, b) in bufs.iter().enumerate() {
        let want: Vec<f32> = (0..np).flat_map(|p| all[(p + r) % np].clone()).collect();
        found = found.and(compare(
            &format!("chained all_gather {r}"),
            &b.to_vec()?,
            &want,
        ));
    }
    let stream = shmem.new_stream()?;
    let graph = capture(&stream, || coll.all_gather(&bufs[0], &src, algo, &stream))?;
    for round in [1u64, 2] {
        let fresh = inputs::<f32>(seed + round, np, n);
        src.copy_from_host(&fresh[me])?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        found = found.and(compare(
            &format!("graph replay of all_gather {round}"),
            &bufs[0].to_vec()?,
            &fresh.concat(),
        ));
    }
    found
}

/// Repeated in-place sums with no host synchronisation between calls: after the first, every
/// PE holds the same data, so each further call multiplies it by n_pes. A peer reading or
/// writing a buffer too early would show as a wrong multiple.
fn back_to_back<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algos: &[AllReduceAlgo],
    n: usize,
    rounds: usize,
) -> Result<()> {
    let all = inputs::<T>(seed, shmem.n_pes(), n);
    let x = shmem.malloc::<T>(n)?;
    x.copy_from_host(&all[shmem.my_pe()])?;
    for r in 0..rounds {
        coll.all_reduce(
            &x,
            &x,
            ReduceOp::Sum,
            algos[r % algos.len()],
            shmem.stream(),
        )?;
    }
    sync(shmem)?;
    let want = summed_again(reference(ReduceOp::Sum, &all), shmem.n_pes(), rounds - 1);
    compare("back-to-back all_reduce", &x.to_vec()?, &want)
}

/// Calls alternating between two streams, each on its own buffer, with no host
/// synchronisation: the Collectives orders a call on a new stream after the last one (they
/// share the epoch, flags and staging; run at once, they would take each other's data).
fn two_streams<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllReduceAlgo,
    n: usize,
    rounds: usize,
) -> Result<()> {
    let streams = [shmem.new_stream()?, shmem.new_stream()?];
    let inputs: Vec<Vec<Vec<T>>> = (0..2)
        .map(|k| inputs::<T>(seed + k, shmem.n_pes(), n))
        .collect();
    let bufs = [shmem.malloc::<T>(n)?, shmem.malloc::<T>(n)?];
    for (b, all) in bufs.iter().zip(&inputs) {
        b.copy_from_host(&all[shmem.my_pe()])?;
    }
    for r in 0..2 * rounds {
        let k = r % 2;
        coll.all_reduce(&bufs[k], &bufs[k], ReduceOp::Sum, algo, &streams[k])?;
    }
    for (k, s) in streams.iter().enumerate() {
        s.synchronize().map_err(|source| Error::Cuda {
            call: "cuStreamSynchronize",
            source,
        })?;
        let want = summed_again(
            reference(ReduceOp::Sum, &inputs[k]),
            shmem.n_pes(),
            rounds - 1,
        );
        compare(&format!("stream {k}"), &bufs[k].to_vec()?, &want)?;
    }
    Ok(())
}

/// `times` more sums of `x` held by every one of `n_pes` PEs, as the kernels compute them.
fn summed_again<T: Reducible>(mut x: Vec<T>, n_pes: usize, times: usize) -> Vec<T> {
    for _ in 0..times {
        x = reference(ReduceOp::Sum, &vec![x; n_pes]);
    }
    x
}

/// Capture calls in a CUDA graph and replay it: the epoch lives in device memory, so each
/// replay is a new call.
fn graph_replay<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllReduceAlgo,
    n: usize,
) -> Result<()> {
    let all = inputs::<T>(seed, shmem.n_pes(), n);
    let x = shmem.malloc::<T>(n)?;
    let y = shmem.malloc::<T>(n)?;
    x.copy_from_host(&all[shmem.my_pe()])?;
    let stream = shmem.new_stream()?;
    // x -> y -> x: two calls per replay, out of place both ways.
    let graph = capture(&stream, || {
        coll.all_reduce(&y, &x, ReduceOp::Sum, algo, &stream)
            .and_then(|_| coll.all_reduce(&x, &y, ReduceOp::Sum, algo, &stream))
    })?;
    let replays = 3;
    for _ in 0..replays {
        cuda("cuGraphLaunch", graph.launch())?;
    }
    cuda("cuStreamSynchronize", stream.synchronize())?;
    let want = summed_again(
        reference(ReduceOp::Sum, &all),
        shmem.n_pes(),
        2 * replays - 1,
    );
    compare("graph replay", &x.to_vec()?, &want)
}

/// Free device memory on this PE's GPU.
fn free_memory(shmem: &Nvshmem) -> Result<usize> {
    shmem
        .context()
        .bind_to_thread()
        .map_err(|source| Error::Cuda {
            call: "cuCtxSetCurrent",
            source,
        })?;
    let (free, _) = cuda(
        "cuMemGetInfo",
        nvshmem::cudarc::driver::result::mem_get_info(),
    )?;
    Ok(free)
}

/// Random checked calls until `time` is up (see the module's documentation).
fn soak(shmem: &Nvshmem, coll: &Collectives, time: Duration) -> bool {
    let me = shmem.my_pe();
    // Every kernel once first: CUDA loads a kernel's code on its first launch, which takes
    // device memory that stays.
    let warm = (|| -> Result<()> {
        for algo in AllReduceAlgo::ALL {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                all_reduce_case::<f32>(shmem, coll, 1, op, algo, 1000, false)?;
                all_reduce_case::<bf16>(shmem, coll, 2, op, algo, 1000, false)?;
                all_reduce_case::<f16>(shmem, coll, 3, op, algo, 1000, false)?;
                if algo.takes(DataType::I32) {
                    all_reduce_case::<i32>(shmem, coll, 4, op, algo, 1000, false)?;
                }
            }
        }
        for algo in AllGatherAlgo::ALL {
            all_gather_case::<i32>(shmem, coll, 5, algo, 1000)?;
        }
        two_streams::<i32>(shmem, coll, 6, AllReduceAlgo::OneShot, 1000, 2)?;
        graph_replay::<f32>(shmem, coll, 7, AllReduceAlgo::OneShot, 1000)?;
        for algo in ReduceScatterAlgo::ALL {
            reduce_scatter_case::<f32>(shmem, coll, 8, (ReduceOp::Sum, algo), 1000)?;
        }
        reduce_case::<f32>(shmem, coll, 12, (ReduceOp::Sum, 0, false), 1000)?;
        for algo in BroadcastAlgo::ALL {
            broadcast_case::<f32>(shmem, coll, 9, (algo, 0, false), 1000)?;
        }
        for algo in AllToAllAlgo::ALL {
            all_to_all_case::<f32>(shmem, coll, 10, algo, 1000)?;
        }
        all_to_all_v_case(shmem, coll, 11, 100)
    })();
    if let Err(e) = warm {
        eprintln!("PE {me}: soak: the warm-up failed: {e}");
        return false;
    }
    // The driver grows its own pools (streams, graphs) over the first calls: memory is
    // taken as the start after the first tenth of the run (30 s at most) of random calls.
    let settle = (time / 10).min(Duration::from_secs(30));
    let mut start = None;
    // The same seed on every PE: the same arguments, in the same order.
    let mut rng = Rng::new(0x50a4, 0);
    let began = Instant::now();
    let (mut ops, mut failures, mut k) = (0u64, 0u64, 0u64);
    let reduce_algos = AllReduceAlgo::ALL;
    let gather_algos = AllGatherAlgo::ALL;
    let ops_of = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
    // Decided by PE 0's clock and shared, so every PE stops after the same call.
    let mut go_on = true;
    while go_on {
        k += 1;
        let pick = |r: &mut Rng, n: usize| (r.next() % n as u64) as usize;
        // Log-uniform sizes from 1 to 2^20 elements; a few larger ones.
        let n = if pick(&mut rng, 50) == 0 {
            (4 << 20) + pick(&mut rng, 4096)
        } else {
            1 + (rng.next() % (1u64 << pick(&mut rng, 21))) as usize
        };
        let op = ops_of[pick(&mut rng, 3)];
        let in_place = pick(&mut rng, 2) == 1;
        let kind = pick(&mut rng, 24);
        let mut algo = reduce_algos[pick(&mut rng, reduce_algos.len())];
        // The paths with a part of the workspace take small inputs only: Auto beyond 64 Ki
        // elements (the smallest such part holds 256 KiB on 8 PEs).
        let bounded = !matches!(
            algo,
            AllReduceAlgo::Auto | AllReduceAlgo::TwoShot | AllReduceAlgo::Bandwidth
        );
        if bounded && n > 1 << 16 {
            algo = AllReduceAlgo::Auto;
        }
        let seed = 0x50a4_0000 + k;
        let (what, r) = match kind {
            0..=9 => {
                let r = match pick(&mut rng, 4) {
                    0 if algo.takes(DataType::I32) => {
                        all_reduce_case::<i32>(shmem, coll, seed, op, algo, n, in_place)
                    }
                    0 | 1 => all_reduce_case::<f32>(shmem, coll, seed, op, algo, n, in_place),
                    2 => all_reduce_case::<bf16>(shmem, coll, seed, op, algo, n, in_place),
                    _ => all_reduce_case::<f16>(shmem, coll, seed, op, algo, n, in_place),
                };
                (
                    format!("all_reduce {algo:?} {op:?} n={n} in_place={in_place}"),
                    r,
                )
            }
            10..=14 => {
                let mut g = gather_algos[pick(&mut rng, gather_algos.len())];
                let n = n.min(1 << 18);
                if g == AllGatherAlgo::LowLatency && n > 1 << 16 {
                    g = AllGatherAlgo::Auto;
                }
                let r = match pick(&mut rng, 3) {
                    0 => all_gather_case::<i32>(shmem, coll, seed, g, n),
                    1 => all_gather_case::<bf16>(shmem, coll, seed, g, n),
                    _ => all_gather_case::<f32>(shmem, coll, seed, g, n),
                };
                (format!("all_gather {g:?} n={n}"), r)
            }
            15..=16 => {
                let algo = if algo.takes(DataType::I32) {
                    algo
                } else {
                    AllReduceAlgo::Auto
                };
                let rounds = 1 + pick(&mut rng, 8);
                let n = n.min(1 << 16);
                (
                    format!("two streams {algo:?} n={n} x{rounds}"),
                    two_streams::<i32>(shmem, coll, seed, algo, n, rounds),
                )
            }
            17..=18 => {
                let n = n.min(1 << 16);
                (
                    format!("graph replay {algo:?} n={n}"),
                    graph_replay::<f32>(shmem, coll, seed, algo, n),
                )
            }
            20 if pick(&mut rng, 2) == 0 => {
                let case = (op, pick(&mut rng, shmem.n_pes()), in_place);
                let r = match pick(&mut rng, 2) {
                    0 => reduce_case::<bf16>(shmem, coll, seed, case, n),
                    _ => reduce_case::<i32>(shmem, coll, seed, case, n),
                };
                (format!("reduce {case:?} n={n}"), r)
            }
            20 => {
                let n = n.min(1 << 18);
                let mut a = ReduceScatterAlgo::ALL[pick(&mut rng, ReduceScatterAlgo::ALL.len())];
                if a == ReduceScatterAlgo::LowLatency && 4 * n > ll_limit(coll) {
                    a = ReduceScatterAlgo::Auto;
                }
                let case = (op, a);
                let r = match pick(&mut rng, 4) {
                    0 => reduce_scatter_case::<i32>(shmem, coll, seed, case, n),
                    1 => reduce_scatter_case::<bf16>(shmem, coll, seed, case, n),
                    2 => reduce_scatter_case::<f16>(shmem, coll, seed, case, n),
                    _ => reduce_scatter_case::<f32>(shmem, coll, seed, case, n),
                };
                (format!("reduce_scatter {case:?} n={n}"), r)
            }
            21 => {
                let mut b = BroadcastAlgo::ALL[pick(&mut rng, BroadcastAlgo::ALL.len())];
                if b == BroadcastAlgo::OneShot && 4 * n > coll.workspace().staging_slot_bytes
                    || matches!(
                        b,
                        BroadcastAlgo::LowLatency | BroadcastAlgo::LowLatencyRelay
                    ) && 4 * n > ll_limit(coll)
                {
                    b = BroadcastAlgo::Auto;
                }
                let case = (b, pick(&mut rng, shmem.n_pes()), in_place);
                let r = match pick(&mut rng, 2) {
                    0 => broadcast_case::<bf16>(shmem, coll, seed, case, n),
                    _ => broadcast_case::<f32>(shmem, coll, seed, case, n),
                };
                (format!("broadcast {case:?} n={n}"), r)
            }
            22 => {
                let block = n.min(1 << 16);
                let mut a = AllToAllAlgo::ALL[pick(&mut rng, AllToAllAlgo::ALL.len())];
                if a == AllToAllAlgo::OneShot && 4 * block > coll.workspace().staging_slot_bytes
                    || a == AllToAllAlgo::LowLatency && 4 * block > ll_limit(coll)
                {
                    a = AllToAllAlgo::Auto;
                }
                let r = match pick(&mut rng, 2) {
                    0 => all_to_all_case::<bf16>(shmem, coll, seed, a, block),
                    _ => all_to_all_case::<f32>(shmem, coll, seed, a, block),
                };
                (format!("all_to_all {a:?} block={block}"), r)
            }
            23 => {
                let max = n.min(1 << 14);
                (
                    format!("all_to_all_v counts up to {max}"),
                    all_to_all_v_case(shmem, coll, seed, max),
                )
            }
            _ => {
                let algos = [
                    reduce_algos[1 + pick(&mut rng, reduce_algos.len() - 1)],
                    algo,
                ];
                let algos: Vec<AllReduceAlgo> = algos
                    .into_iter()
                    .map(|a| {
                        if a.takes(DataType::I32) {
                            a
                        } else {
                            AllReduceAlgo::OneShot
                        }
                    })
                    .collect();
                let n = n.min(1 << 15);
                let rounds = 2 + pick(&mut rng, 10);
                (
                    format!("back-to-back {algos:?} n={n} x{rounds}"),
                    back_to_back::<i32>(shmem, coll, seed, &algos, n, rounds),
                )
            }
        };
        ops += 1;
        let mut fatal = false;
        if let Err(e) = r {
            failures += 1;
            eprintln!("PE {me}: soak FAIL {what}: {e}");
            // A lost context or a peer that never came: every PE stops at this call.
            fatal = matches!(e, Error::Cuda { .. } | Error::Timeout { .. });
        }
        // After every call, so that every PE stops at the same one. PE 0's clock decides
        // when the start is taken and when to stop; any PE can stop the run.
        let settled = start.is_some() || (me == 0 && began.elapsed() >= settle);
        let done = fatal || (me == 0 && began.elapsed() >= time + settle);
        let votes = any_pe(shmem, i32::from(settled) * 2 + i32::from(done) * 1024).unwrap_or(1024);
        if start.is_none() && votes % 1024 >= 2 {
            start = Some((free_memory(shmem), shmem.heap_in_use(), ops, Instant::now()));
        }
        go_on = votes < 1024;
    }
    let Some((free_start, heap_start, ops_before, measured_from)) = start else {
        eprintln!("PE {me}: soak: stopped before the warm-up ended");
        return false;
    };
    let start = (free_start, heap_start);
    let ops = ops - ops_before;
    let failed_pes = any_pe(shmem, i32::from(failures > 0)).unwrap_or(-1);
    let end = (free_memory(shmem), shmem.heap_in_use());
    let memory_kept = matches!((&start.0, &end.0), (Ok(a), Ok(b)) if a == b) && start.1 == end.1;
    println!(
        "PE {me}: soak: {ops} operations in {:.0} s (after {:.0} s of warm-up), {failures} \
         failures; free device memory {:?} -> {:?} bytes, symmetric heap in use {} -> {} bytes{}",
        measured_from.elapsed().as_secs_f64(),
        (measured_from - began).as_secs_f64(),
        start.0.as_ref().ok(),
        end.0.as_ref().ok(),
        start.1,
        end.1,
        if memory_kept { "" } else { " (CHANGED)" }
    );
    failures == 0 && failed_pes == 0 && memory_kept
}

/// Words with every bit set (what the sentinel path's empty buffers hold) in the input: the
/// call must not wait for them forever, and they must reduce as the NaN they are. Elsewhere
/// the result is exact.
fn sentinel_bits_case<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    algo: AllReduceAlgo,
    op: ReduceOp,
) -> Result<()> {
    let (me, np, n) = (shmem.my_pe(), shmem.n_pes(), 4099);
    let mut all = inputs::<T>(seed, np, n);
    // Whole 32-bit words of set bits (two elements of a 16-bit type): some at the same place
    // on every PE, some on one PE only.
    let per_word = 4 / std::mem::size_of::<T>();
    for (pe, x) in all.iter_mut().enumerate() {
        for w in (0..n / per_word).step_by(97).chain([pe * 13 + 5]) {
            x[w * per_word..(w + 1) * per_word].fill(T::all_ones());
        }
    }
    let want = reference(op, &all);
    let buf = shmem.malloc::<T>(n)?;
    buf.copy_from_host(&all[me])?;
    coll.all_reduce(&buf, &buf, op, algo, shmem.stream())?;
    sync(shmem)?;
    let got = buf.to_vec()?;
    // NaN payloads may differ between this CPU and the GPU; NaN must stay NaN.
    let bad = (0..n)
        .filter(|&i| {
            if want[i].is_nan() {
                !got[i].is_nan()
            } else {
                got[i].bits() != want[i].bits()
            }
        })
        .count();
    if bad > 0 {
        return Err(Error::InvalidArgument(format!(
            "sentinel bits: {bad} of {n} elements wrong"
        )));
    }
    Ok(())
}

fn cuda<T>(
    call: &'static str,
    r: std::result::Result<T, nvshmem::cudarc::driver::DriverError>,
) -> Result<T> {
    r.map_err(|source| Error::Cuda { call, source })
}

/// The largest input per destination that the low-latency paths take in `coll`'s lines.
fn ll_limit(coll: &Collectives) -> usize {
    (coll.workspace().lines_slot_bytes - 16) / 2
}

/// `r` must be the error `expected` accepts.
fn expect_err(r: Result<()>, what: &str, expected: fn(&Error) -> bool) -> Result<()> {
    match r {
        Err(e) if expected(&e) => Ok(()),
        Err(e) => Err(Error::InvalidArgument(format!(
            "{what} was refused with the wrong error: {e}"
        ))),
        Ok(()) => Err(Error::InvalidArgument(format!("{what} was accepted"))),
    }
}

fn main() {
    // The list above is the table's, not a second one kept by hand.
    let takes_i32: Vec<AllReduceAlgo> = AllReduceAlgo::ALL
        .into_iter()
        .filter(|&a| a != AllReduceAlgo::Auto && a.takes(DataType::I32))
        .collect();
    assert_eq!(INT_ALGOS.to_vec(), takes_i32, "INT_ALGOS is out of date");
    let shmem = match Nvshmem::init() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("coll_check: {e}");
            std::process::exit(2);
        }
    };
    let coll = match Collectives::new(&shmem) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("coll_check: PE {}: {e}", shmem.my_pe());
            std::process::exit(2);
        }
    };
    if shmem.my_pe() == 0 {
        println!(
            "coll_check: {} PEs; {}",
            shmem.n_pes(),
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--soak") {
        let seconds: f64 = args
            .get(at + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                eprintln!("coll_check: --soak takes the seconds to run");
                std::process::exit(2)
            });
        let ok = soak(&shmem, &coll, Duration::from_secs_f64(seconds));
        drop(coll);
        drop(shmem);
        std::process::exit(if ok { 0 } else { 1 });
    }
    let mut c = Checker {
        shmem: shmem.clone(),
        passed: 0,
        failed: 0,
        seq: 0,
    };
    let sizes = [1usize, 7, 8, 13, 1000, 4099, 65536 + 3, 300_001];
    // Every algorithm of the table, `Auto` last.
    let algos = AllReduceAlgo::ALL
        .iter()
        .cycle()
        .skip(1)
        .take(AllReduceAlgo::ALL.len());
    for &algo in algos {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for (i, &n) in sizes.iter().enumerate() {
                // The low-latency path takes up to 1 MiB (twice that in staging).
                let low_latency = matches!(
                    algo,
                    AllReduceAlgo::Sentinel
                        | AllReduceAlgo::LowLatency
                        | AllReduceAlgo::LowLatencyTwoShot
                );
                if low_latency && n > 100_000 {
                    continue;
                }
                let in_place = i % 2 == 1;
                let tag = format!("all_reduce {algo:?} {op:?} n={n} in_place={in_place}");
                c.check(&format!("{tag} f32"), |s, seed| {
                    all_reduce_case::<f32>(s, &coll, seed, op, algo, n, in_place)
                });
                c.check(&format!("{tag} bf16"), |s, seed| {
                    all_reduce_case::<bf16>(s, &coll, seed, op, algo, n, in_place)
                });
                c.check(&format!("{tag} f16"), |s, seed| {
                    all_reduce_case::<f16>(s, &coll, seed, op, algo, n, in_place)
                });
                if !algo.takes(DataType::I32) {
                    continue;
                }
                c.check(&format!("{tag} i32"), |s, seed| {
                    all_reduce_case::<i32>(s, &coll, seed, op, algo, n, in_place)
                });
            }
        }
    }
    for n in [4usize << 20, 16 << 20] {
        c.check(&format!("all_reduce Auto Sum n={n} bf16"), |s, seed| {
            all_reduce_case::<bf16>(s, &coll, seed, ReduceOp::Sum, AllReduceAlgo::Auto, n, false)
        });
    }
    // The bandwidth path over many rounds of its chunk ring (each block reuses its slots).
    let many_rounds = (16 << 20) + 5;
    for (op, in_place) in [(ReduceOp::Sum, false), (ReduceOp::Max, true)] {
        let tag = format!("all_reduce Bandwidth {op:?} n={many_rounds} in_place={in_place}");
        c.check(&format!("{tag} f32"), |s, seed| {
            all_reduce_case::<f32>(
                s,
                &coll,
                seed,
                op,
                AllReduceAlgo::Bandwidth,
                many_rounds,
                in_place,
            )
        });
        c.check(&format!("{tag} bf16"), |s, seed| {
            all_reduce_case::<bf16>(
                s,
                &coll,
                seed,
                op,
                AllReduceAlgo::Bandwidth,
                many_rounds,
                in_place,
            )
        });
    }
    for &algo in AllGatherAlgo::ALL
        .iter()
        .cycle()
        .skip(1)
        .take(AllGatherAlgo::ALL.len())
    {
        for n in [1usize, 3, 1000, 4097, 65_537, 200_000] {
            c.check(&format!("all_gather {algo:?} n={n} f32"), |s, seed| {
                all_gather_case::<f32>(s, &coll, seed, algo, n)
            });
            c.check(&format!("all_gather {algo:?} n={n} bf16"), |s, seed| {
                all_gather_case::<bf16>(s, &coll, seed, algo, n)
            });
            c.check(&format!("all_gather {algo:?} n={n} i32"), |s, seed| {
                all_gather_case::<i32>(s, &coll, seed, algo, n)
            });
        }
    }
    // Every algorithm, type and operator. Pull: blocks of 16-byte multiples go by vectors,
    // the others element by element; low-latency: blocks off an 8-byte boundary (n odd for
    // 4-byte types, n % 4 != 0 for 2-byte ones) are cut from aligned words. A low-latency call
    // too large for its lines must be refused, not overrun them.
    let ll = ll_limit(&coll);
    for algo in ReduceScatterAlgo::ALL {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for n in [1usize, 3, 8, 1000, 4099, 65_536, 300_001] {
                let case = (op, algo);
                let tag = format!("reduce_scatter {algo:?} {op:?} n={n}");
                if algo == ReduceScatterAlgo::LowLatency && 2 * n > ll {
                    c.check(&format!("{tag} bf16 refused"), |s, seed| {
                        expect_err(
                            reduce_scatter_case::<bf16>(s, &coll, seed, case, n),
                            "a low-latency reduce-scatter larger than its lines",
                            |e| matches!(e, Error::InvalidArgument(_)),
                        )
                    });
                    continue;
                }
                c.check(&format!("{tag} bf16"), |s, seed| {
                    reduce_scatter_case::<bf16>(s, &coll, seed, case, n)
                });
                c.check(&format!("{tag} f16"), |s, seed| {
                    reduce_scatter_case::<f16>(s, &coll, seed, case, n)
                });
                if 4 * n <= ll || algo != ReduceScatterAlgo::LowLatency {
                    c.check(&format!("{tag} f32"), |s, seed| {
                        reduce_scatter_case::<f32>(s, &coll, seed, case, n)
                    });
                    c.check(&format!("{tag} i32"), |s, seed| {
                        reduce_scatter_case::<i32>(s, &coll, seed, case, n)
                    });
                }
            }
        }
    }
    c.check("reduce_scatter Auto Sum n=4M bf16", |s, seed| {
        reduce_scatter_case::<bf16>(
            s,
            &coll,
            seed,
            (ReduceOp::Sum, ReduceScatterAlgo::Auto),
            4 << 20,
        )
    });
    for algo in [ReduceScatterAlgo::LowLatency, ReduceScatterAlgo::Pull] {
        c.check(
            &format!("reduce_scatter {algo:?} back to back and in a graph"),
            |s, seed| reduce_scatter_repeated(s, &coll, seed, algo, 4096 + 8),
        );
    }
    // The reduce to every root, in place and not, every type and operator.
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        for n in [1usize, 3, 1000, 4099, 300_001] {
            for root in 0..shmem.n_pes() {
                let case = (op, root, root % 2 == 1);
                let tag = format!("reduce {op:?} root {root} in place {} n={n}", case.2);
                c.check(&format!("{tag} f32"), |s, seed| {
                    reduce_case::<f32>(s, &coll, seed, case, n)
                });
                c.check(&format!("{tag} bf16"), |s, seed| {
                    reduce_case::<bf16>(s, &coll, seed, case, n)
                });
            }
            c.check(&format!("reduce {op:?} root 0 n={n} f16"), |s, seed| {
                reduce_case::<f16>(s, &coll, seed, (op, 0, false), n)
            });
            c.check(&format!("reduce {op:?} root 0 n={n} i32"), |s, seed| {
                reduce_case::<i32>(s, &coll, seed, (op, 0, false), n)
            });
        }
    }
    // The broadcast from every root, in place and not, and the all-to-all: every algorithm
    // at odd sizes (unaligned blocks included); an explicit one-shot too large for its
    // staging slot must be refused, not overrun it.
    let slot = coll.workspace().staging_slot_bytes;
    for algo in BroadcastAlgo::ALL {
        // The relay also at a size of many rounds per block, and a tail.
        let large = (algo == BroadcastAlgo::Relay).then_some(3_000_017);
        for n in [1usize, 3, 1000, 4097, 65_537, 300_001]
            .into_iter()
            .chain(large)
        {
            let lines = matches!(
                algo,
                BroadcastAlgo::LowLatency | BroadcastAlgo::LowLatencyRelay
            );
            let too_large = algo == BroadcastAlgo::OneShot && 4 * n > slot || lines && 4 * n > ll;
            for root in 0..shmem.n_pes() {
                let case = (algo, root, root % 2 == 1);
                let name = format!("broadcast {algo:?} root {root} in place {} n={n}", case.2);
                c.check(&format!("{name} f32"), |s, seed| match too_large {
                    true => expect_err(
                        broadcast_case::<f32>(s, &coll, seed, case, n),
                        "a one-shot broadcast larger than its staging slot",
                        |e| matches!(e, Error::InvalidArgument(_)),
                    ),
                    false => broadcast_case::<f32>(s, &coll, seed, case, n),
                });
            }
            if !too_large || 2 * n <= ll && lines {
                c.check(
                    &format!("broadcast {algo:?} root 0 n={n} bf16"),
                    |s, seed| broadcast_case::<bf16>(s, &coll, seed, (algo, 0, false), n),
                );
            }
        }
    }
    for algo in AllToAllAlgo::ALL {
        for block in [1usize, 3, 1000, 4097, 65_537, 300_001] {
            if algo == AllToAllAlgo::OneShot && 4 * block > slot {
                continue;
            }
            if algo == AllToAllAlgo::LowLatency && 4 * block > ll {
                c.check(
                    &format!("all_to_all {algo:?} block={block} f32 refused"),
                    |s, seed| {
                        expect_err(
                            all_to_all_case::<f32>(s, &coll, seed, algo, block),
                            "a low-latency all-to-all larger than its lines",
                            |e| matches!(e, Error::InvalidArgument(_)),
                        )
                    },
                );
                continue;
            }
            c.check(
                &format!("all_to_all {algo:?} block={block} f32"),
                |s, seed| all_to_all_case::<f32>(s, &coll, seed, algo, block),
            );
            c.check(
                &format!("all_to_all {algo:?} block={block} bf16"),
                |s, seed| all_to_all_case::<bf16>(s, &coll, seed, algo, block),
            );
        }
    }
    for (algo, a2a) in [
        (BroadcastAlgo::LowLatency, AllToAllAlgo::LowLatency),
        (BroadcastAlgo::OneShot, AllToAllAlgo::OneShot),
        (BroadcastAlgo::Push, AllToAllAlgo::Push),
        (BroadcastAlgo::CopyEngine, AllToAllAlgo::CopyEngine),
        (BroadcastAlgo::Relay, AllToAllAlgo::Auto),
        (BroadcastAlgo::LowLatencyRelay, AllToAllAlgo::LowLatency),
    ] {
        c.check(
            &format!("broadcast {algo:?} and all_to_all {a2a:?} back to back and in a graph"),
            |s, seed| movement_repeated(s, &coll, seed, (algo, a2a), 1000 + 3),
        );
    }
    for algo in [
        BroadcastAlgo::LowLatency,
        BroadcastAlgo::OneShot,
        BroadcastAlgo::CopyEngine,
        BroadcastAlgo::Relay,
        BroadcastAlgo::LowLatencyRelay,
    ] {
        for root in [0, shmem.n_pes() - 1] {
            c.check(
                &format!("broadcast {algo:?} from {root}, 64 back to back with late peers"),
                |s, seed| broadcast_burst(s, &coll, seed, (algo, root, 64), 1000 + 1),
            );
        }
    }
    for algo in [
        BroadcastAlgo::LowLatency,
        BroadcastAlgo::CopyEngine,
        BroadcastAlgo::Relay,
        BroadcastAlgo::LowLatencyRelay,
    ] {
        c.check(
            &format!("broadcast {algo:?} between all-reduces, back to back"),
            |s, seed| broadcast_between_reductions(s, &coll, seed, algo, (32, 1000 + 1)),
        );
    }
    for max in [0usize, 1, 5, 1000, 70_001] {
        c.check(
            &format!("all_to_all_v counts up to {max}, back to back and in a graph"),
            |s, seed| all_to_all_v_case(s, &coll, seed, max),
        );
    }
    c.check(
        "all_to_all_v with counts that disagree",
        all_to_all_v_mismatch,
    );
    for algo in AllGatherAlgo::ALL {
        c.check(
            &format!("all_gather {algo:?} chained back to back and in a graph"),
            |s, seed| all_gather_repeated(s, &coll, seed, algo, 4096 + 4),
        );
    }
    // Blocks of 2, 6 and 8194 bytes: one output word over every PE's block (up to 4 PEs),
    // words over two blocks, and lines of a block all off an 8-byte boundary.
    for n in [1usize, 3, 4097] {
        c.check(
            &format!("all_gather LowLatency n={n} bf16 off 8 bytes, back to back and in a graph"),
            |s, seed| all_gather_words_repeated(s, &coll, seed, n),
        );
    }
    c.check("all_gather Auto n=8M bf16", |s, seed| {
        all_gather_case::<bf16>(s, &coll, seed, AllGatherAlgo::Auto, 8 << 20)
    });
    // Low-latency readers take a line whose tag matches the call: a new workspace must not
    // hold lines of an earlier one (the heap hands the freed space back out).
    c.check(
        "new Collectives after a dropped one: low-latency, fresh data",
        |s, seed| {
            for round in 0..3 {
                let fresh = Collectives::new(s)?;
                // Two calls: both parities of the staging.
                for _ in 0..2 {
                    all_reduce_case::<i32>(
                        s,
                        &fresh,
                        seed + round,
                        ReduceOp::Sum,
                        AllReduceAlgo::LowLatency,
                        4099,
                        false,
                    )?;
                }
            }
            Ok(())
        },
    );
    c.check("back-to-back low-latency x20", |s, seed| {
        back_to_back::<i32>(s, &coll, seed, &[AllReduceAlgo::LowLatency], 4096, 20)
    });
    c.check("back-to-back low-latency two-shot x20", |s, seed| {
        back_to_back::<i32>(
            s,
            &coll,
            seed,
            &[AllReduceAlgo::LowLatencyTwoShot],
            50_001,
            20,
        )
    });
    c.check("back-to-back one-shot x20", |s, seed| {
        back_to_back::<i32>(s, &coll, seed, &[AllReduceAlgo::OneShot], 4096, 20)
    });
    c.check("back-to-back two-shot x20", |s, seed| {
        back_to_back::<i32>(s, &coll, seed, &[AllReduceAlgo::TwoShot], 100_000, 20)
    });
    c.check("back-to-back bandwidth, many rounds, x8", |s, seed| {
        back_to_back::<i32>(s, &coll, seed, &[AllReduceAlgo::Bandwidth], 6 << 20, 8)
    });
    c.check("back-to-back bandwidth x20", |s, seed| {
        back_to_back::<i32>(s, &coll, seed, &[AllReduceAlgo::Bandwidth], 1 << 20, 20)
    });
    // Every algorithm after every other, repeatedly, in place: a call that read data left
    // from the call before it would be off by a factor.
    for rep in 0..4 {
        c.check(&format!("back-to-back mixed x24 #{rep}"), |s, seed| {
            back_to_back::<i32>(s, &coll, seed, &INT_ALGOS, 50_000, 24)
        });
    }
    // The sentinel path refills its buffers for the call two on: every algorithm after it,
    // and it after every other, in floating point (it takes no i32).
    c.check("back-to-back sentinel x20", |s, seed| {
        back_to_back::<f32>(s, &coll, seed, &[AllReduceAlgo::Sentinel], 50_001, 20)
    });
    c.check("back-to-back sentinel two-shot x20", |s, seed| {
        back_to_back::<f32>(
            s,
            &coll,
            seed,
            &[AllReduceAlgo::SentinelTwoShot],
            50_001,
            20,
        )
    });
    for rep in 0..2 {
        c.check(
            &format!("back-to-back mixed with sentinel x25 #{rep}"),
            |s, seed| {
                back_to_back::<bf16>(
                    s,
                    &coll,
                    seed,
                    &[
                        AllReduceAlgo::Sentinel,
                        AllReduceAlgo::LowLatency,
                        AllReduceAlgo::Sentinel,
                        AllReduceAlgo::LowLatencyTwoShot,
                        AllReduceAlgo::OneShot,
                        AllReduceAlgo::SentinelTwoShot,
                        AllReduceAlgo::TwoShot,
                        AllReduceAlgo::SentinelTwoShot,
                        AllReduceAlgo::Sentinel,
                        AllReduceAlgo::Bandwidth,
                    ],
                    30_000,
                    25,
                )
            },
        );
    }
    for algo in [AllReduceAlgo::Sentinel, AllReduceAlgo::SentinelTwoShot] {
        c.check(
            &format!("{algo:?}: inputs with the sentinel's bits arrive"),
            |s, seed| {
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                    sentinel_bits_case::<f32>(s, &coll, seed, algo, op)?;
                    sentinel_bits_case::<f16>(s, &coll, seed, algo, op)?;
                    sentinel_bits_case::<bf16>(s, &coll, seed, algo, op)?;
                }
                Ok(())
            },
        );
    }
    for algo in INT_ALGOS {
        c.check(&format!("graph replay {algo:?}"), |s, seed| {
            graph_replay::<i32>(s, &coll, seed, algo, 20_000)
        });
    }
    for algo in [AllReduceAlgo::Sentinel, AllReduceAlgo::SentinelTwoShot] {
        c.check(&format!("graph replay {algo:?}"), |s, seed| {
            graph_replay::<f32>(s, &coll, seed, algo, 20_000)
        });
    }
    c.check("graph replay Bandwidth, many rounds", |s, seed| {
        graph_replay::<i32>(s, &coll, seed, AllReduceAlgo::Bandwidth, 5 << 20)
    });
    for algo in [
        AllReduceAlgo::LowLatency,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::Bandwidth,
    ] {
        c.check(
            &format!("two streams alternating, {algo:?} x2x8"),
            |s, seed| two_streams::<i32>(s, &coll, seed, algo, 30_001, 8),
        );
    }
    c.check(
        "cooperative launches: every algorithm, eager and in a graph",
        |s, seed| {
            let mut config = CollectivesConfig::for_pes(s.n_pes());
            config.cooperative_launch = true;
            let coop = Collectives::with_config(s, config)?;
            for algo in AllReduceAlgo::ALL {
                all_reduce_case::<f32>(s, &coop, seed, ReduceOp::Sum, algo, 20_011, false)?;
            }
            for algo in AllGatherAlgo::ALL {
                all_gather_case::<bf16>(s, &coop, seed, algo, 5_003)?;
            }
            graph_replay::<f32>(s, &coop, seed, AllReduceAlgo::Auto, 20_011)
        },
    );
    // Flag values and low-latency tags derive from the call counter: calls around the points
    // where 32-bit tags wrapped (and a counter's low 32 bits are 0) still give right results.
    for start in [(1u64 << 32) - 3, (1 << 33) - 2] {
        c.check(
            &format!("epoch from {start:#x}: every algorithm, 6 calls each"),
            |s, seed| {
                let fresh = Collectives::new(s)?;
                fresh.set_epoch_for_test(start)?;
                for k in 0..6 {
                    for algo in INT_ALGOS {
                        all_reduce_case::<i32>(
                            s,
                            &fresh,
                            seed + k,
                            ReduceOp::Sum,
                            algo,
                            20_011,
                            false,
                        )?;
                    }
                    all_reduce_case::<f32>(
                        s,
                        &fresh,
                        seed + k,
                        ReduceOp::Max,
                        AllReduceAlgo::Sentinel,
                        4099,
                        k % 2 == 1,
                    )?;
                    all_reduce_case::<bf16>(
                        s,
                        &fresh,
                        seed + k,
                        ReduceOp::Sum,
                        AllReduceAlgo::SentinelTwoShot,
                        30_001,
                        false,
                    )?;
                    all_gather_case::<i32>(s, &fresh, seed + k, AllGatherAlgo::LowLatency, 1000)?;
                    all_gather_case::<i32>(s, &fresh, seed + k, AllGatherAlgo::Bandwidth, 5000)?;
                }
                Ok(())
            },
        );
    }
    // A low-latency line is zeroed once taken. Tags repeat every 2^32 calls: a call exactly
    // 2^32 calls after another of the same size would find that call's lines, with its tag,
    // where a line is not zeroed. PE 0 reads while PE 1 holds back its second call.
    c.check(
        "low-latency: a call 2^32 calls on takes no line of the first",
        |s, seed| {
            let fresh = Collectives::new(s)?;
            let start = 5u64 << 32;
            for (k, epoch) in [start, start + (1 << 32)].into_iter().enumerate() {
                // Calls at epochs epoch + 1 and epoch + 2: the same tags and parities both times.
                fresh.set_epoch_for_test(epoch)?;
                if s.my_pe() == 1 && k == 1 {
                    std::thread::sleep(Duration::from_millis(200));
                }
                let seed = seed + k as u64;
                all_reduce_case::<i32>(
                    s,
                    &fresh,
                    seed,
                    ReduceOp::Sum,
                    AllReduceAlgo::LowLatency,
                    60_000,
                    false,
                )?;
                all_reduce_case::<i32>(
                    s,
                    &fresh,
                    seed,
                    ReduceOp::Sum,
                    AllReduceAlgo::LowLatencyTwoShot,
                    60_000,
                    false,
                )?;
            }
            Ok(())
        },
    );
    // A PE that skips a call: the others give up after the configured bound, say which PE
    // they waited for, and refuse every later call.
    if shmem.n_pes() >= 2 {
        for algo in [
            AllReduceAlgo::LowLatency,
            AllReduceAlgo::Sentinel,
            AllReduceAlgo::OneShot,
            AllReduceAlgo::Bandwidth,
        ] {
            c.check(&format!("timeout: PE 1 skips a {algo:?} call"), |s, _| {
                let mut config = CollectivesConfig::for_pes(s.n_pes());
                config.timeout = Some(Duration::from_millis(500));
                // The kernels' own bound (the per-call agreement would catch the skip first).
                config.check_calls = false;
                let bounded = Collectives::with_config(s, config)?;
                let n = if algo == AllReduceAlgo::Bandwidth {
                    1 << 20
                } else {
                    4096
                };
                let x = s.calloc::<f32>(n)?;
                let y = s.malloc::<f32>(n)?;
                s.barrier_all()?;
                let outcome = if s.my_pe() == 1 {
                    // Skips the call: the call's own checks pass, nothing runs.
                    bounded.check()
                } else {
                    let began = Instant::now();
                    bounded.all_reduce(&y, &x, ReduceOp::Sum, algo, s.stream())?;
                    sync(s)?;
                    let took = began.elapsed();
                    match (
                        bounded.check(),
                        bounded.all_reduce(&y, &x, ReduceOp::Sum, algo, s.stream()),
                    ) {
                        (Err(Error::Timeout { waited_for: 1, .. }), Err(Error::Timeout { .. }))
                            if took < Duration::from_secs(10) =>
                        {
                            Ok(())
                        }
                        (first, later) => Err(Error::InvalidArgument(format!(
                            "after {took:?}: check gave {first:?}, the next call {later:?}; \
                             expected a timeout waiting for PE 1, then the same"
                        ))),
                    }
                };
                // Every PE drops its Collectives (collective frees) and goes on.
                drop(bounded);
                outcome
            });
        }
    }
    c.check("errors: length, type, op, overlap, staging", |s, _| {
        let a = s.malloc::<f32>(64)?;
        let b = s.malloc::<f32>(32)?;
        let st = s.stream();
        expect_err(
            coll.all_reduce(&b, &a, ReduceOp::Sum, AllReduceAlgo::Auto, st),
            "length mismatch",
            |e| matches!(e, Error::Length { .. }),
        )?;
        expect_err(
            coll.all_reduce(&a, &a, ReduceOp::Xor, AllReduceAlgo::Auto, st),
            "xor",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        let u = s.malloc::<u64>(64)?;
        expect_err(
            coll.all_reduce(&u, &u, ReduceOp::Sum, AllReduceAlgo::Auto, st),
            "u64",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        expect_err(
            coll.all_reduce(
                a.view(16..48),
                a.view(0..32),
                ReduceOp::Sum,
                AllReduceAlgo::Auto,
                st,
            ),
            "overlap",
            |e| matches!(e, Error::Overlap { .. }),
        )?;
        expect_err(
            coll.all_reduce(
                b.view(..),
                a.view(1..33),
                ReduceOp::Sum,
                AllReduceAlgo::Auto,
                st,
            ),
            "misaligned view",
            |e| matches!(e, Error::Misaligned { align: 16, .. }),
        )?;
        expect_err(
            coll.all_gather(&b, &a, AllGatherAlgo::Auto, st),
            "all_gather length",
            |e| matches!(e, Error::Length { .. }),
        )?;
        // The source must be n_pes blocks of the destination's length.
        let wrong = s.malloc::<f32>(32 * s.n_pes() + 4)?;
        expect_err(
            coll.reduce_scatter(&b, &wrong, ReduceOp::Sum, ReduceScatterAlgo::Auto, st),
            "reduce_scatter length",
            |e| matches!(e, Error::Length { .. }),
        )?;
        expect_err(
            coll.reduce_scatter(u.view(..32), &u, ReduceOp::Sum, ReduceScatterAlgo::Auto, st),
            "reduce_scatter of u64 (and overlapping)",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        // Lengths that fit, buffers that overlap: refused for the overlap on any PE count.
        let whole = s.malloc::<f32>(16 * s.n_pes())?;
        expect_err(
            coll.reduce_scatter(
                whole.view(..16),
                &whole,
                ReduceOp::Sum,
                ReduceScatterAlgo::Auto,
                st,
            ),
            "reduce_scatter overlap",
            |e| matches!(e, Error::Overlap { .. }),
        )?;
        expect_err(
            coll.reduce(&b, &b, ReduceOp::Sum, s.n_pes(), ReduceAlgo::Auto, st),
            "reduce root out of range",
            |e| matches!(e, Error::PeOutOfRange { .. }),
        )?;
        expect_err(
            coll.reduce(&u, &u, ReduceOp::Sum, 0, ReduceAlgo::Auto, st),
            "reduce of u64",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        expect_err(
            coll.broadcast(&b, &a, s.n_pes(), BroadcastAlgo::Auto, st),
            "broadcast root out of range",
            |e| matches!(e, Error::PeOutOfRange { .. }),
        )?;
        expect_err(
            coll.broadcast(&b, a.view(..16), 0, BroadcastAlgo::Auto, st),
            "broadcast length",
            |e| matches!(e, Error::Length { .. }),
        )?;
        expect_err(
            coll.all_to_all(&b, a.view(..16), AllToAllAlgo::Auto, st),
            "all_to_all length",
            |e| matches!(e, Error::Length { .. }),
        )?;
        let wide = s.malloc::<f32>(64 * s.n_pes())?;
        let (left, right) = (
            wide.view(..32 * s.n_pes()),
            wide.view(16..16 + 32 * s.n_pes()),
        );
        expect_err(
            coll.all_to_all(right, left, AllToAllAlgo::Auto, st),
            "all_to_all overlap",
            |e| matches!(e, Error::Overlap { .. }),
        )?;
        let ints = s.malloc::<i32>(64)?;
        expect_err(
            coll.all_reduce(&ints, &ints, ReduceOp::Sum, AllReduceAlgo::Sentinel, st),
            "sentinel all-reduce of i32",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        let big = s.malloc::<f32>(16 << 20)?;
        expect_err(
            coll.all_reduce(&big, &big, ReduceOp::Sum, AllReduceAlgo::Sentinel, st),
            "sentinel beyond its buffers",
            |e| matches!(e, Error::InvalidArgument(_)),
        )?;
        expect_err(
            coll.all_reduce(
                &ints,
                &ints,
                ReduceOp::Sum,
                AllReduceAlgo::SentinelTwoShot,
                st,
            ),
            "sentinel two-shot of i32",
            |e| matches!(e, Error::TypeMismatch { .. }),
        )?;
        expect_err(
            coll.all_reduce(
                &big,
                &big,
                ReduceOp::Sum,
                AllReduceAlgo::SentinelTwoShot,
                st,
            ),
            "sentinel two-shot beyond its buffers",
            |e| matches!(e, Error::InvalidArgument(_)),
        )?;
        expect_err(
            coll.all_reduce(&big, &big, ReduceOp::Sum, AllReduceAlgo::OneShot, st),
            "one-shot beyond staging",
            |e| matches!(e, Error::InvalidArgument(_)),
        )
    });
    if shmem.my_pe() == 0 {
        println!("{} passed, {} failed", c.passed, c.failed);
    }
    drop(coll);
    let failed = c.failed;
    drop(c);
    drop(shmem);
    std::process::exit(if failed > 0 { 1 } else { 0 });
}
