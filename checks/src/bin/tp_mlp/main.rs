//! GPU checks of the tensor-parallel layers (`nvshmem::tp`), then a short timing table.
//!
//! ```text
//! scripts/nvshmrun -np 2 target/release/tp_mlp --test all
//! scripts/nvshmrun -np 4 target/release/tp_mlp --test mlp --shape 70b --m 1,128,2048
//! ```
//! `--test all|column|row|mlp|gemm|breakdown` (several with commas), `--shape 8b|70b|HIDDEN,FFN` (the
//! large shape checked against the unsharded product on one GPU and timed; 8b by default),
//! `--m LIST` (its token counts), `--iters N` (timed graph replays per row), `--no-timing`.
//! `--rounds N` makes every fused exchange N rounds (`ScheduleThresholds::fused_exchange_gemms`
//! N × the PE count, `fused_mlp_rounds` 0). `gemm`
//! checks the local GEMM paths (`GemmPath::CublasLt` and `Decode`) against f64
//! sums and times them on this PE's shard of the shape for each `--m`: ours (the decode
//! kernels up to 16 tokens, the CUTLASS kernel above) against cuBLASLt. `breakdown` (timing
//! only, not part of `all`) splits the sequential MLP's time for each `--m`: its GEMMs alone,
//! its GEMMs then an 8-byte all-reduce (which waits for the slowest PE's GEMMs), the
//! all-reduce of its output alone, and the MLP.
//!
//! Every layer is checked on random bf16 data: small and odd shapes against an f64 CPU
//! reference, the large shape against the unsharded GEMMs on this GPU (themselves checked
//! against f64 sums on sampled elements). Replicated
//! outputs must be bitwise identical on every PE. Prints `N passed, M failed` on PE 0 and
//! exits non-zero if anything failed.
//!
//! Tolerance: every output goes through bf16 (2^-8 relative spacing) at least once, and the
//! layers round intermediate values to bf16 (the GEMM outputs, each PE's partial product,
//! SiLU(gate)·up) where the reference rounds the same values from f64 sums, which can fall on
//! the other side of a bf16 rounding boundary than the GPU's f32 sums. So an element may
//! differ from the reference by 2^-7 of its own magnitude plus 2^-7 of the output's root mean
//! square (the scale at which cancellation leaves a small element carrying its inputs'
//! rounding), and, in the MLP, by 2^-7 of its largest term act_j·down_ij (one intermediate
//! that rounded the other way moves act_j by up to 2^-7 of itself); a row-parallel output
//! likewise by 2^-7 of its largest partial product (a partial product that rounded the other
//! way moves the sum by one bf16 spacing of itself, which may exceed the sum's own). A wrong shard, a missing
//! PE or swapped gate and up projections miss by the order of the RMS itself. Against the
//! unsharded product on one GPU (the large shape), which rounds no partial product, the layers'
//! rounding of each PE's partial product (2^-9 of each, which need not cancel as their sum
//! does) is allowed as well: 2^-6 of magnitude plus RMS.
//!
//! Where the reference rounds exactly where a layer rounds (the column- and row-parallel
//! layers: the output, and each PE's partial product), a GPU element differs from the
//! reference's bf16 only when its f32 sum falls on the other side of a rounding boundary
//! than the f64 sum, which is rare (about 1 element in 10^4 on these shapes): so at most 1% of
//! the elements may differ at all. A GEMM that rounds more often than that (split-K parts
//! added up in bf16, seen in cuBLASLt at m = 16, n = 48, k = 9: 29% of the elements) fails.

use nvshmem::cudarc::driver::sys::CUevent_flags;
use nvshmem::cudarc::driver::{CudaGraph, CudaStream};
use nvshmem::tp::{
    shard_range, take_cols, take_rows, ColumnInput, ColumnParallelLinear, GemmPath, LinearShape,
    MlpShape, RowOutput, RowParallelLinear, Schedule, SequenceParallelMlp, TensorParallel, TpMlp,
    DECODE_MAX_TOKENS, FUSED_DECODE_MAX_TOKENS, FUSED_EXCHANGE_TOKENS,
};
use nvshmem::{
    bf16, AllGatherAlgo, AllReduceAlgo, DeviceBuffer, Error, Nvshmem, ReduceOp, SymmetricBuffer,
};
use std::sync::Arc;

use nvshmem_checks::graph;
use nvshmem_checks::splitmix;

use splitmix::{SplitMix64, GOLDEN};

type Outcome = Result<(), String>;

fn text(e: Error) -> String {
    e.to_string()
}

// ---- command line -------------------------------------------------------------------------

struct Args {
    column: bool,
    row: bool,
    mlp: bool,
    gemm: bool,
    breakdown: bool,
    hidden: usize,
    ffn: usize,
    shape_name: String,
    ms: Vec<usize>,
    iters: usize,
    timing: bool,
    verbose: bool,
    rounds: Option<usize>,
}

const USAGE: &str =
    "usage: tp_mlp [--test all|column|row|mlp|gemm|breakdown[,..]] [--shape 8b|70b|HIDDEN,FFN] \
                     [--m LIST] [--iters N] [--rounds N] [--no-timing] [--verbose]";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        column: true,
        row: true,
        mlp: true,
        gemm: true,
        breakdown: false,
        hidden: 4096,
        ffn: 14336,
        shape_name: "8b".into(),
        ms: vec![1, 16, 128, 512],
        iters: 50,
        timing: true,
        verbose: false,
        rounds: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value; {USAGE}"));
        match flag.as_str() {
            "--test" => {
                let v = value()?;
                (a.column, a.row, a.mlp, a.gemm) = (false, false, false, false);
                for t in v.split(',') {
                    match t {
                        "all" => (a.column, a.row, a.mlp, a.gemm) = (true, true, true, true),
                        "column" => a.column = true,
                        "row" => a.row = true,
                        "mlp" => a.mlp = true,
                        "gemm" => a.gemm = true,
                        "breakdown" => a.breakdown = true,
                        _ => return Err(format!("unknown test {t:?}; {USAGE}")),
                    }
                }
            }
            "--shape" => {
                let v = value()?;
                (a.hidden, a.ffn) = match v.as_str() {
                    "8b" => (4096, 14336),
                    "70b" => (8192, 28672),
                    _ => {
                        let parts: Vec<_> =
                            v.split(',').map(|s| s.trim().parse::<usize>()).collect();
                        match parts.as_slice() {
                            [Ok(h), Ok(f)] if *h > 0 && *f > 0 => (*h, *f),
                            _ => {
                                return Err(format!(
                                    "--shape {v:?}: 8b, 70b or HIDDEN,FFN; {USAGE}"
                                ))
                            }
                        }
                    }
                };
                a.shape_name = v;
            }
            "--m" => {
                let v = value()?;
                a.ms = v
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .map_err(|_| format!("--m {v:?}: a list of token counts"))
                    })
                    .collect::<Result<_, _>>()?;
                if a.ms.is_empty() || a.ms.contains(&0) {
                    return Err(format!("--m {v:?}: token counts are positive"));
                }
            }
            "--iters" => {
                a.iters = value()?
                    .parse()
                    .map_err(|_| format!("--iters: a number; {USAGE}"))?;
                a.iters = a.iters.max(5);
            }
            "--rounds" => {
                let v = value()?;
                let t = v
                    .parse()
                    .map_err(|_| format!("--rounds {v:?}: a number; {USAGE}"))?;
                a.rounds = Some(t);
            }
            "--no-timing" => a.timing = false,
            "--verbose" => a.verbose = true,
            "--help" | "-h" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {flag:?}; {USAGE}")),
        }
    }
    Ok(a)
}

// ---- data and references ------------------------------------------------------------------

/// Random values of one check: the same on every PE for the same seed.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(SplitMix64(seed.wrapping_mul(GOLDEN) ^ 0x5EED))
    }
    /// Uniform in [-scale, scale), as bf16.
    fn bf16s(&mut self, n: usize, scale: f32) -> Vec<bf16> {
        (0..n)
            .map(|_| {
                let u = (self.0.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                bf16::from_f32(u * scale)
            })
            .collect()
    }
}

/// A weight of `rows × cols` scaled so that products with unit inputs stay near 1.
fn weight(rng: &mut Rng, rows: usize, cols: usize) -> Vec<bf16> {
    rng.bf16s(rows * cols, (3.0 / cols as f32).sqrt())
}

fn round_bf16(v: f64) -> f64 {
    bf16::from_f64(v).to_f64()
}

/// `x · wᵀ` in f64: `x` is `m × k`, `w` is `n × k`.
fn matmul(x: &[bf16], w: &[bf16], m: usize, n: usize, k: usize) -> Vec<f64> {
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let wf: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] = (0..k).map(|l| xf[i * k + l] * wf[j * k + l]).sum();
        }
    }
    y
}

/// The row-parallel product as the layer computes it: each PE's partial product rounded to
/// bf16, then summed; and for each element its largest partial product (in magnitude).
fn row_parallel(
    x: &[bf16],
    w: &[bf16],
    m: usize,
    n: usize,
    k: usize,
    n_pes: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; m * n];
    let mut largest = vec![0.0f64; m * n];
    for pe in 0..n_pes {
        let r = shard_range(k, pe, n_pes);
        let part = matmul(
            &take_cols(x, k, r.clone()),
            &take_cols(w, k, r.clone()),
            m,
            n,
            r.len(),
        );
        for ((acc, big), p) in y.iter_mut().zip(&mut largest).zip(part) {
            *acc += round_bf16(p);
            *big = big.max(p.abs());
        }
    }
    (y, largest)
}

fn silu_times(g: f64, u: f64) -> f64 {
    g / (1.0 + (-g).exp()) * u
}

/// The MLP as the layers compute it, rounding where they round, and for each output its
/// largest term |act_j · down_ij| (see the tolerance).
fn mlp_reference(
    x: &[bf16],
    (gate, up, down): (&[bf16], &[bf16], &[bf16]),
    m: usize,
    hidden: usize,
    ffn: usize,
    n_pes: usize,
) -> (Vec<f64>, Vec<f64>) {
    let g = matmul(x, gate, m, ffn, hidden);
    let u = matmul(x, up, m, ffn, hidden);
    let act: Vec<bf16> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| bf16::from_f64(silu_times(round_bf16(g), round_bf16(u))))
        .collect();
    let largest_term = (0..m * hidden)
        .map(|e| {
            let (i, o) = (e / hidden, e % hidden);
            (0..ffn)
                .map(|j| (act[i * ffn + j].to_f64() * down[o * ffn + j].to_f64()).abs())
                .fold(0.0, f64::max)
        })
        .collect();
    (
        row_parallel(&act, down, m, hidden, ffn, n_pes).0,
        largest_term,
    )
}

/// `got` against `want` within the tolerance the module documentation justifies, for a
/// `want` that rounds where the layer rounds: then nearly every element must also have
/// exactly `want`'s bf16 bits (see the module documentation).
fn compare(what: &str, got: &[bf16], want: &[f64]) -> Outcome {
    compare_row(what, got, (want, &[]))
}

/// [`compare`] for a row-parallel output, whose elements may also differ by 2^-7 of their
/// largest partial product (`terms`, see the module documentation).
fn compare_row(what: &str, got: &[bf16], (want, terms): (&[f64], &[f64])) -> Outcome {
    compare_with(what, got, want, terms, 1.0 / 128.0)?;
    let off = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g.to_bits() != bf16::from_f64(**w).to_bits())
        .count();
    if off > (got.len() / 100).max(1) {
        return Err(format!(
            "{what}: {off} of {} elements are not the bf16 nearest to the reference (at most \
             1% may differ, by f32 against f64 sums)",
            got.len()
        ));
    }
    Ok(())
}

/// `got` against the unsharded product on one GPU, which rounds no partial product: 2^-6
/// (see the module documentation).
fn compare_unsharded(what: &str, got: &[bf16], want: &[f64]) -> Outcome {
    compare_with(what, got, want, &[], 1.0 / 64.0)
}

/// `y = x · wᵀ` from one GPU GEMM (a reference for the layers) against f64 sums on 512
/// elements picked at random: within 2^-7 of each element plus the sampled RMS, as
/// [`compare`] (the large shapes are too large to recompute whole on the CPU).
fn sampled(
    what: &str,
    y: &[bf16],
    x: &[bf16],
    w: &[bf16],
    shape: LinearShape,
    seed: u64,
) -> Outcome {
    let LinearShape { m, n, k } = shape;
    let mut pick = SplitMix64(seed ^ 0x5A3F);
    let picked: Vec<usize> = (0..512)
        .map(|_| (pick.next_u64() % (m * n) as u64) as usize)
        .collect();
    let want: Vec<f64> = picked
        .iter()
        .map(|&e| {
            let (i, j) = (e / n, e % n);
            (0..k)
                .map(|l| x[i * k + l].to_f64() * w[j * k + l].to_f64())
                .sum()
        })
        .collect();
    let got: Vec<bf16> = picked.iter().map(|&e| y[e]).collect();
    compare_with(what, &got, &want, &[], 1.0 / 128.0)
        .map_err(|e| format!("{e} (among 512 sampled elements)"))
}

/// [`compare`] with relative tolerance `scale`, each element also allowed `scale` of its
/// `largest_term` (empty: none).
fn compare_with(
    what: &str,
    got: &[bf16],
    want: &[f64],
    largest_term: &[f64],
    scale: f64,
) -> Outcome {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    if want.is_empty() {
        return Ok(());
    }
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g.to_f64() - w).abs();
        // A NaN output counts as infinitely wrong.
        let term = largest_term.get(i).copied().unwrap_or(0.0);
        let ratio = match err / (scale * (w.abs() + rms + term)) {
            r if r.is_nan() => f64::INFINITY,
            r => r,
        };
        if ratio > worst.0 {
            worst = (ratio, i);
        }
    }
    if worst.0 > 1.0 {
        let i = worst.1;
        return Err(format!(
            "{what}: element {i} is {} where {} was expected (error {:.1}x the tolerance; \
             output RMS {rms:.3e})",
            got[i], want[i], worst.0
        ));
    }
    Ok(())
}

fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

// ---- the checks ---------------------------------------------------------------------------

/// Every schedule is checked. Overlapped overlaps a sequence-parallel column layer's
/// all-gather and is sequential elsewhere; Fused runs the fused decode kernel up to
/// `FUSED_DECODE_MAX_TOKENS` tokens (where the output's rows are whole lines) and is
/// sequential above, at these sizes; Auto, with the default thresholds, is sequential at
/// these sizes (`sequence_parallel_auto` checks its choice).
const SCHEDULES: [Schedule; 4] = [
    Schedule::Sequential,
    Schedule::Overlapped,
    Schedule::Fused,
    Schedule::Auto,
];

struct Checks {
    shmem: Nvshmem,
    tp: TensorParallel,
    stream: Arc<CudaStream>,
    verbose: bool,
    names: Vec<String>,
    failed: Vec<i32>,
}

impl Checks {
    fn run(&mut self, name: String, f: impl FnOnce(&Self, u64) -> Outcome) {
        let seed = name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
        });
        let outcome = f(self, seed);
        match &outcome {
            Err(e) => eprintln!("[PE {}] FAIL {name}: {e}", self.shmem.my_pe()),
            Ok(()) if self.verbose && self.shmem.my_pe() == 0 => eprintln!("ok   {name}"),
            Ok(()) => {}
        }
        if let Err(e) = self.shmem.barrier_all() {
            eprintln!("[PE {}] barrier after {name}: {e}", self.shmem.my_pe());
        }
        self.names.push(name);
        self.failed.push(outcome.is_err() as i32);
    }

    /// The checks that failed on any PE, and how many passed.
    fn finish(&self) -> Result<(usize, usize), Error> {
        let mine = self.shmem.malloc::<i32>(self.failed.len())?;
        let all = self.shmem.malloc::<i32>(self.failed.len())?;
        mine.copy_from_host(&self.failed)?;
        self.tp.collectives().all_reduce(
            &all,
            &mine,
            ReduceOp::Sum,
            nvshmem::AllReduceAlgo::Auto,
            &self.stream,
        )?;
        sync(&self.stream)?;
        let totals = all.to_vec()?;
        if self.shmem.my_pe() == 0 {
            for (name, pes) in self.names.iter().zip(&totals).filter(|(_, &t)| t > 0) {
                eprintln!("FAILED {name} (on {pes} of {} PEs)", self.shmem.n_pes());
            }
        }
        let failed = totals.iter().filter(|&&t| t > 0).count();
        Ok((totals.len() - failed, failed))
    }

    fn me(&self) -> usize {
        self.shmem.my_pe()
    }

    fn n(&self) -> usize {
        self.shmem.n_pes()
    }

    fn symmetric(&self, data: &[bf16]) -> Result<SymmetricBuffer<bf16>, String> {
        let b = self.shmem.malloc::<bf16>(data.len()).map_err(text)?;
        b.copy_from_host(data).map_err(text)?;
        Ok(b)
    }

    fn device(&self, data: &[bf16]) -> Result<DeviceBuffer<bf16>, String> {
        let b = self.shmem.alloc_device::<bf16>(data.len()).map_err(text)?;
        b.copy_from_host(data).map_err(text)?;
        Ok(b)
    }

    /// Every PE's `y` must have the same bits: each PE's hash, all-gathered.
    fn identical(&self, what: &str, y: &[bf16]) -> Outcome {
        let hash = y.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, v| {
            (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01B3)
        });
        let mine = self.shmem.malloc::<u64>(1).map_err(text)?;
        let all = self.shmem.malloc::<u64>(self.n()).map_err(text)?;
        mine.copy_from_host(&[hash]).map_err(text)?;
        self.tp
            .collectives()
            .all_gather(&all, &mine, AllGatherAlgo::Auto, &self.stream)
            .map_err(text)?;
        sync(&self.stream).map_err(text)?;
        let hashes = all.to_vec().map_err(text)?;
        match hashes.iter().position(|&h| h != hashes[0]) {
            None => Ok(()),
            Some(pe) => Err(format!("{what}: PE {pe}'s output differs from PE 0's")),
        }
    }
}

fn sync(stream: &CudaStream) -> Result<(), Error> {
    stream.synchronize().map_err(|source| Error::Cuda {
        call: "cuStreamSynchronize",
        source,
    })
}

/// Column-parallel, replicated input: this PE's columns of `x · wᵀ`.
fn column_replicated(c: &Checks, seed: u64, (m, k, n): (usize, usize, usize)) -> Outcome {
    let mut rng = Rng::new(seed);
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let layer = ColumnParallelLinear::new(&c.tp, k, n, ColumnInput::Replicated, m).map_err(text)?;
    layer.load_weight(&w).map_err(text)?;
    let xs = c.symmetric(&x)?;
    let y = c
        .shmem
        .alloc_device::<bf16>(m * layer.local_out_features())
        .map_err(text)?;
    layer.forward(&y, &xs, &c.stream).map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let want = take_cols(&matmul(&x, &w, m, n, k), n, shard_range(n, c.me(), c.n()));
    compare("column-parallel output", &y.to_vec().map_err(text)?, &want)
}

/// Column-parallel, sequence-parallel input: each PE gives `per_pe` rows.
fn column_sequence(
    c: &Checks,
    seed: u64,
    (per_pe, k, n): (usize, usize, usize),
    schedule: Schedule,
) -> Outcome {
    let mut rng = Rng::new(seed);
    let m = per_pe * c.n();
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let layer =
        ColumnParallelLinear::new(&c.tp, k, n, ColumnInput::SequenceParallel, m).map_err(text)?;
    layer.load_weight(&w).map_err(text)?;
    let mine = c.symmetric(&take_rows(&x, k, c.me() * per_pe..(c.me() + 1) * per_pe))?;
    let y = c
        .shmem
        .alloc_device::<bf16>(m * layer.local_out_features())
        .map_err(text)?;
    layer
        .forward_with(&y, &mine, schedule, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let want = take_cols(&matmul(&x, &w, m, n, k), n, shard_range(n, c.me(), c.n()));
    compare(
        "sequence-parallel output",
        &y.to_vec().map_err(text)?,
        &want,
    )
}

/// One fused layer call as [`fused_exchange`] drives it, over three inputs in input slots
/// 0..3 and nine output slots.
struct FusedIo<'a> {
    /// Enqueue layer `l`'s (0 or 1, built alike) call in a schedule on input slot `i` into
    /// output slot `o`, on the checks' stream.
    call: &'a dyn Fn(usize, usize, usize, Schedule) -> Result<(), Error>,
    /// Output slot `o`.
    read: &'a dyn Fn(usize) -> Result<Vec<bf16>, String>,
    /// Fill output slot `o` with NaN.
    poison: &'a dyn Fn(usize) -> Outcome,
    /// Copy input `i`'s data into input slot 0.
    reload: &'a dyn Fn(usize) -> Outcome,
    /// Check the output of input `i` against the f64 reference.
    check: &'a dyn Fn(usize, &[bf16]) -> Outcome,
}

/// The checks every fused exchange ([`Schedule::Fused`] of the sequence-parallel layers)
/// must pass: each input's output against the f64 reference, with the PEs after the first
/// arriving late (their chunks reach PE 0 while its GEMM runs: with no wait, PE 0 would use
/// the previous call's); calls back to back on one stream, alternating between two layers
/// (each with its own flags) and each followed by an all-reduce, so that every chunk's
/// credit comes round before the next call writes; sequential and fused calls mixed on one
/// layer, back to back; and a captured call replayed on new
/// inputs. Each gives what the same call made alone gives, bit for bit.
fn fused_exchange(c: &Checks, io: &FusedIo) -> Outcome {
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

/// Device buffers of `len` elements, `count` of them.
fn outputs(c: &Checks, count: usize, len: usize) -> Result<Vec<DeviceBuffer<bf16>>, String> {
    (0..count)
        .map(|_| c.shmem.alloc_device::<bf16>(len).map_err(text))
        .collect()
}

/// The fused all-gather + GEMM (sequence-parallel input), `per_pe` rows per PE, through
/// [`fused_exchange`]. With `skew`, PE 0's outputs start 2 bytes past a 16-byte boundary,
/// so that its GEMMs take other cuBLASLt kernels than its peers' in the same exchange.
fn column_fused(
    c: &Checks,
    seed: u64,
    (per_pe, k, nn): (usize, usize, usize),
    skew: bool,
) -> Outcome {
    let mut rng = Rng::new(seed);
    let m = per_pe * c.n();
    let w = weight(&mut rng, nn, k);
    let tp = c.tp.clone();
    let build = || -> Result<ColumnParallelLinear, String> {
        let layer = ColumnParallelLinear::new(&tp, k, nn, ColumnInput::SequenceParallel, m)
            .map_err(text)?;
        layer.load_weight(&w).map_err(text)?;
        Ok(layer)
    };
    let layers = [build()?, build()?];
    let cols = shard_range(nn, c.me(), c.n());
    let (out, w_mine) = (cols.len(), take_rows(&w, k, cols));
    let mine_of = |x: &[bf16]| take_rows(x, k, c.me() * per_pe..(c.me() + 1) * per_pe);
    let inputs: Vec<Vec<bf16>> = (0..3).map(|_| rng.bf16s(m * k, 1.0)).collect();
    let xs: Vec<_> = inputs
        .iter()
        .map(|x| c.symmetric(&mine_of(x)))
        .collect::<Result<_, _>>()?;
    // Symmetric (allocated alike on every PE: room for the widest shard and the skew).
    let ys: Vec<_> = (0..9)
        .map(|_| {
            c.shmem
                .malloc::<bf16>(m * nn.div_ceil(c.n()) + 1)
                .map_err(text)
        })
        .collect::<Result<_, _>>()?;
    let at = usize::from(skew && c.me() == 0);
    let y = |o: usize| ys[o].view(at..at + m * out);
    fused_exchange(
        c,
        &FusedIo {
            call: &|l, i, o, schedule| layers[l].forward_with(&y(o), &xs[i], schedule, &c.stream),
            read: &|o| y(o).to_vec().map_err(text),
            poison: &|o| y(o).copy_from_host(&vec![bf16::NAN; m * out]).map_err(text),
            reload: &|i| xs[0].copy_from_host(&mine_of(&inputs[i])).map_err(text),
            check: &|i, got| {
                let want = matmul(&inputs[i], &w_mine, m, out, k);
                compare("fused sequence-parallel column output", got, &want)
            },
        },
    )
}

/// Two row-parallel layers built alike (`m` tokens at most, `k → n` features, `output`),
/// their full weight, and three random inputs with this PE's columns of each on the device.
struct RowCase {
    w: Vec<bf16>,
    layers: [RowParallelLinear; 2],
    inputs: Vec<Vec<bf16>>,
    xs: Vec<DeviceBuffer<bf16>>,
}

fn row_case(
    c: &Checks,
    tp: &TensorParallel,
    seed: u64,
    (m, k, n): (usize, usize, usize),
    output: RowOutput,
) -> Result<RowCase, String> {
    let mut rng = Rng::new(seed);
    let w = weight(&mut rng, n, k);
    let build = || -> Result<RowParallelLinear, String> {
        let layer = RowParallelLinear::with_output(tp, k, n, output, m).map_err(text)?;
        layer.load_weight(&w).map_err(text)?;
        Ok(layer)
    };
    let layers = [build()?, build()?];
    let inputs: Vec<Vec<bf16>> = (0..3).map(|_| rng.bf16s(m * k, 1.0)).collect();
    let local = layers[0].local_in_features();
    let xs = inputs
        .iter()
        .map(|x| c.device(&take_cols(x, k, local.clone())))
        .collect::<Result<_, _>>()?;
    Ok(RowCase {
        w,
        layers,
        inputs,
        xs,
    })
}

/// What [`row_exchange`] checks each output with: the input, the output, the spare slot.
type RowCheck<'a> = &'a dyn Fn(usize, &[bf16], &SymmetricBuffer<bf16>) -> Outcome;

/// [`fused_exchange`] of a [`RowCase`] (`k` input features), outputs of `len` elements
/// (ten: the exchange's nine and a spare, slot 9, for `check`).
fn row_exchange(c: &Checks, case: &RowCase, k: usize, len: usize, check: RowCheck) -> Outcome {
    let ys: Vec<_> = (0..10)
        .map(|_| c.shmem.malloc::<bf16>(len).map_err(text))
        .collect::<Result<_, _>>()?;
    let local = case.layers[0].local_in_features();
    let (xs, s) = (&case.xs, &c.stream);
    fused_exchange(
        c,
        &FusedIo {
            call: &|l, i, o, schedule| case.layers[l].forward_with(&ys[o], &xs[i], schedule, s),
            read: &|o| ys[o].to_vec().map_err(text),
            poison: &|o| ys[o].copy_from_host(&vec![bf16::NAN; len]).map_err(text),
            reload: &|i| {
                xs[0]
                    .copy_from_host(&take_cols(&case.inputs[i], k, local.clone()))
                    .map_err(text)
            },
            check: &|i, got| check(i, got, &ys[9]),
        },
    )
}

/// `spare` holds what layer 0 of `case` gives input `i` in the sequential schedule with the
/// decode GEMM (the fused kernels' own; `Auto` may have measured cuBLASLt faster), and it
/// must be `got`, bit for bit.
fn same_as_sequential(
    c: &Checks,
    case: &RowCase,
    i: usize,
    got: &[bf16],
    spare: &SymmetricBuffer<bf16>,
) -> Outcome {
    let layer = &case.layers[0];
    let shape = LinearShape {
        m: case.inputs[i].len() / layer.in_features(),
        n: layer.out_features(),
        k: layer.local_in_features().len(),
    };
    c.tp.gemm()
        .set_auto_path(shape, GemmPath::Decode)
        .map_err(text)?;
    case.layers[0]
        .forward_with(spare, &case.xs[i], Schedule::Sequential, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    if bits(&spare.to_vec().map_err(text)?) != bits(got) {
        return Err("the fused and sequential schedules differ".into());
    }
    Ok(())
}

/// The checks' layers, with the fused exchanges in `rounds` rounds where given.
fn with_rounds(c: &Checks, rounds: Option<usize>) -> TensorParallel {
    match rounds {
        Some(r) => {
            let mut t = *c.tp.thresholds();
            (t.fused_exchange_gemms, t.fused_mlp_rounds) = (r * c.shmem.n_pes(), 0);
            c.tp.clone().with_thresholds(t)
        }
        None => c.tp.clone(),
    }
}

/// The fused forms of the row-parallel layer ([`Schedule::Fused`]: the decode kernel, and
/// from 512 tokens per PE the GEMM + all-reduce, in `rounds` rounds where given), through
/// [`fused_exchange`] (whose all-reduces between calls share the fused kernel's epoch and
/// lines); each output also the same on every PE, and up to `DECODE_MAX_TOKENS` tokens bit for
/// bit what the sequential schedule gives (the same decode GEMM, the same order of the sum
/// over PEs).
fn row_fused(
    c: &Checks,
    seed: u64,
    (m, k, n): (usize, usize, usize),
    rounds: Option<usize>,
) -> Outcome {
    let case = row_case(
        c,
        &with_rounds(c, rounds),
        seed,
        (m, k, n),
        RowOutput::Replicated,
    )?;
    // The fused forms where they take the call, the sequential schedule elsewhere.
    let fuses = (m <= FUSED_DECODE_MAX_TOKENS && n % 4 == 0)
        || (c.n() > 1 && m % c.n() == 0 && m / c.n() >= FUSED_EXCHANGE_TOKENS);
    let want_schedule = if fuses {
        Schedule::Fused
    } else {
        Schedule::Sequential
    };
    let resolved = case.layers[0].resolved_schedule(Schedule::Fused, m);
    if resolved != want_schedule {
        return Err(format!(
            "Fused at m={m} n={n} runs {resolved:?}, not {want_schedule:?}"
        ));
    }
    row_exchange(c, &case, k, m * n, &|i, got, spare| {
        let (want, terms) = row_parallel(&case.inputs[i], &case.w, m, n, k, c.n());
        compare_row("fused row-parallel output", got, (&want, &terms))?;
        c.identical("fused row-parallel output", got)?;
        match m <= DECODE_MAX_TOKENS {
            true => same_as_sequential(c, &case, i, got, spare),
            false => Ok(()),
        }
    })
}

/// The fused GEMM + reduce-scatter (sequence-parallel output), `per_pe` rows per PE, in
/// `rounds` rounds where given, through [`fused_exchange`] (below 512 rows per PE it is the
/// sequential schedule); and bit for bit what the sequential schedule gives where both
/// multiply by the decode kernel.
fn row_reduce_scatter_fused(
    c: &Checks,
    seed: u64,
    (per_pe, k, n): (usize, usize, usize),
    rounds: Option<usize>,
) -> Outcome {
    let m = per_pe * c.n();
    let case = row_case(
        c,
        &with_rounds(c, rounds),
        seed,
        (m, k, n),
        RowOutput::SequenceParallel,
    )?;
    let mine = c.me() * per_pe * n..(c.me() + 1) * per_pe * n;
    row_exchange(c, &case, k, per_pe * n, &|i, got, spare| {
        let (want, terms) = row_parallel(&case.inputs[i], &case.w, m, n, k, c.n());
        let mine = (&want[mine.clone()], &terms[mine.clone()]);
        compare_row("fused reduce-scatter output", got, mine)?;
        match m <= DECODE_MAX_TOKENS {
            true => same_as_sequential(c, &case, i, got, spare),
            false => Ok(()),
        }
    })
}

/// Row-parallel with an all-reduce: the whole product, identical on every PE.
fn row_all_reduce(
    c: &Checks,
    seed: u64,
    (m, k, n): (usize, usize, usize),
    schedule: Schedule,
) -> Outcome {
    let mut rng = Rng::new(seed);
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let layer = RowParallelLinear::new(&c.tp, k, n, m).map_err(text)?;
    layer.load_weight(&w).map_err(text)?;
    let xs = c.device(&take_cols(&x, k, layer.local_in_features()))?;
    let y = c.shmem.malloc::<bf16>(m * n).map_err(text)?;
    layer
        .forward_with(&y, &xs, schedule, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let got = y.to_vec().map_err(text)?;
    let (want, terms) = row_parallel(&x, &w, m, n, k, c.n());
    compare_row("row-parallel output", &got, (&want, &terms))?;
    c.identical("row-parallel output", &got)
}

/// Row-parallel with a reduce-scatter: this PE's `per_pe` rows of the whole product.
fn row_reduce_scatter(c: &Checks, seed: u64, (per_pe, k, n): (usize, usize, usize)) -> Outcome {
    let mut rng = Rng::new(seed);
    let m = per_pe * c.n();
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let layer = RowParallelLinear::with_output(&c.tp, k, n, RowOutput::SequenceParallel, m)
        .map_err(text)?;
    layer.load_weight(&w).map_err(text)?;
    let xs = c.device(&take_cols(&x, k, layer.local_in_features()))?;
    let y = c.shmem.malloc::<bf16>(per_pe * n).map_err(text)?;
    layer.forward(&y, &xs, &c.stream).map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let (all, terms) = row_parallel(&x, &w, m, n, k, c.n());
    let rows = c.me() * per_pe * n..(c.me() + 1) * per_pe * n;
    compare_row(
        "row-parallel reduce-scatter output",
        &y.to_vec().map_err(text)?,
        (&all[rows.clone()], &terms[rows]),
    )?;
    // Tokens that do not share equally are refused on every PE.
    if c.n() > 1 {
        let odd = c.device(&vec![bf16::ZERO; (m - 1) * layer.local_in_features().len()])?;
        match layer.forward(&y, &odd, &c.stream) {
            Err(Error::InvalidArgument(msg)) if msg.contains("equally") => {}
            other => return Err(format!("{} tokens over {} PEs: {other:?}", m - 1, c.n())),
        }
    }
    Ok(())
}

struct MlpData {
    x: Vec<bf16>,
    gate: Vec<bf16>,
    up: Vec<bf16>,
    down: Vec<bf16>,
}

fn mlp_data(seed: u64, m: usize, hidden: usize, ffn: usize) -> MlpData {
    let mut rng = Rng::new(seed);
    MlpData {
        x: rng.bf16s(m * hidden, 1.0),
        gate: weight(&mut rng, ffn, hidden),
        up: weight(&mut rng, ffn, hidden),
        down: weight(&mut rng, hidden, ffn),
    }
}

fn mlp_small(
    c: &Checks,
    seed: u64,
    (m, hidden, ffn): (usize, usize, usize),
    schedule: Schedule,
) -> Outcome {
    let d = mlp_data(seed, m, hidden, ffn);
    let mlp = TpMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: m,
        },
    )
    .map_err(text)?;
    mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
    let x = c.device(&d.x)?;
    let y = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
    mlp.forward_with(&y, &x, schedule, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let got = y.to_vec().map_err(text)?;
    let (want, term) = mlp_reference(&d.x, (&d.gate, &d.up, &d.down), m, hidden, ffn, c.n());
    // Every PE reaches the collective check, whatever its own comparison found.
    let compared = compare_with("MLP output", &got, &want, &term, 1.0 / 128.0);
    compared.and(c.identical("MLP output", &got))
}

/// The sequence-parallel MLP, `per_pe` tokens per PE: this PE's rows of the reference.
fn mlp_sequence_parallel(
    c: &Checks,
    seed: u64,
    (per_pe, hidden, ffn): (usize, usize, usize),
    schedule: Schedule,
) -> Outcome {
    let m = per_pe * c.n();
    let d = mlp_data(seed, m, hidden, ffn);
    let mlp = SequenceParallelMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: m,
        },
    )
    .map_err(text)?;
    mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
    let rows = c.me() * per_pe..(c.me() + 1) * per_pe;
    let x = c.symmetric(&take_rows(&d.x, hidden, rows.clone()))?;
    let y = c.shmem.malloc::<bf16>(per_pe * hidden).map_err(text)?;
    mlp.forward_with(&y, &x, schedule, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let (want, term) = mlp_reference(&d.x, (&d.gate, &d.up, &d.down), m, hidden, ffn, c.n());
    let mine = rows.start * hidden..rows.end * hidden;
    compare_with(
        "sequence-parallel MLP output",
        &y.to_vec().map_err(text)?,
        &want[mine.clone()],
        &term[mine],
        1.0 / 128.0,
    )
}

/// `Schedule::Auto` in the sequence-parallel MLP, `per_pe` tokens per PE, with the group's
/// fused and overlapped thresholds at `per_pe` tokens' elements (fused), the fused one a
/// token above (overlapped), and both a token above (sequential): bit for bit the output of
/// the schedule it stands for, each checked against the reference.
fn sequence_parallel_auto(
    c: &Checks,
    seed: u64,
    (per_pe, hidden, ffn): (usize, usize, usize),
) -> Outcome {
    let m = per_pe * c.n();
    let d = mlp_data(seed, m, hidden, ffn);
    let rows = c.me() * per_pe..(c.me() + 1) * per_pe;
    let x = c.symmetric(&take_rows(&d.x, hidden, rows.clone()))?;
    let y = c.shmem.malloc::<bf16>(per_pe * hidden).map_err(text)?;
    let run = |tp: &TensorParallel, schedule: Schedule| -> Result<Vec<bf16>, String> {
        let mlp = SequenceParallelMlp::new(
            tp,
            MlpShape {
                hidden,
                ffn,
                max_tokens: m,
            },
        )
        .map_err(text)?;
        mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
        mlp.forward_with(&y, &x, schedule, &c.stream)
            .map_err(text)?;
        sync(&c.stream).map_err(text)?;
        y.to_vec().map_err(text)
    };
    // The group's thresholds with fused and overlapped from these tokens per PE.
    let at = |fused: usize, overlapped: usize| {
        let mut t = *c.tp.thresholds();
        t.fused_sequence_min_elements = fused * hidden;
        t.overlapped_sequence_min_elements = overlapped * hidden;
        c.tp.clone().with_thresholds(t)
    };
    let overlap = Schedule::Overlapped;
    let fused = run(&c.tp, Schedule::Fused)?;
    let sequential = run(&c.tp, Schedule::Sequential)?;
    let overlapped = run(&c.tp, overlap)?;
    let auto_fused = run(&at(per_pe, per_pe), Schedule::Auto)?;
    let auto_overlapped = run(&at(per_pe + 1, per_pe), Schedule::Auto)?;
    let auto_sequential = run(&at(per_pe + 1, per_pe + 1), Schedule::Auto)?;
    let (want, term) = mlp_reference(&d.x, (&d.gate, &d.up, &d.down), m, hidden, ffn, c.n());
    let mine = rows.start * hidden..rows.end * hidden;
    compare_with(
        "the fused sequence-parallel MLP",
        &fused,
        &want[mine.clone()],
        &term[mine.clone()],
        1.0 / 128.0,
    )?;
    if bits(&auto_fused) != bits(&fused) {
        return Err("Auto at its threshold differs from Fused".into());
    }
    compare_with(
        "the overlapped sequence-parallel MLP",
        &overlapped,
        &want[mine.clone()],
        &term[mine],
        1.0 / 128.0,
    )?;
    if bits(&auto_overlapped) != bits(&overlapped) {
        return Err("Auto between its thresholds differs from Overlapped".into());
    }
    if bits(&auto_sequential) != bits(&sequential) {
        return Err("Auto below its thresholds differs from Sequential".into());
    }
    if c.verbose && bits(&fused) == bits(&sequential) {
        println!("  (the fused and sequential outputs are the same bits here)");
    }
    Ok(())
}

/// The unsharded MLP on this GPU: full gate/up GEMM, SiLU·up, full down GEMM.
fn mlp_unsharded(
    c: &Checks,
    d: &MlpData,
    m: usize,
    hidden: usize,
    ffn: usize,
) -> Result<Vec<bf16>, String> {
    let gemm = c.tp.gemm();
    let mut gate_up = d.gate.clone();
    gate_up.extend_from_slice(&d.up);
    let (w1, w2) = (c.device(&gate_up)?, c.device(&d.down)?);
    let x = c.device(&d.x)?;
    let gu = c.shmem.alloc_device::<bf16>(m * 2 * ffn).map_err(text)?;
    let act = c.shmem.alloc_device::<bf16>(m * ffn).map_err(text)?;
    let y = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
    let s = &c.stream;
    gemm.linear(
        &gu,
        &x,
        &w1,
        LinearShape {
            m,
            n: 2 * ffn,
            k: hidden,
        },
        s,
    )
    .map_err(text)?;
    c.tp.silu_mul(&act, &gu, m, s).map_err(text)?;
    gemm.linear(
        &y,
        &act,
        &w2,
        LinearShape {
            m,
            n: hidden,
            k: ffn,
        },
        s,
    )
    .map_err(text)?;
    sync(s).map_err(text)?;
    y.to_vec().map_err(text)
}

/// The large shape: the MLP against the unsharded MLP on this GPU, and the column and row
/// layers of its sizes against single GEMMs.
fn large(
    c: &Checks,
    seed: u64,
    m: usize,
    hidden: usize,
    ffn: usize,
    which: (bool, bool, bool),
) -> Outcome {
    let d = mlp_data(seed, m, hidden, ffn);
    let f64s = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let s = &c.stream;
    // Each part runs on every PE whatever an earlier part found (they allocate symmetric
    // memory and call collectives); the first failure is reported.
    let mut outcome: Outcome = Ok(());
    if which.0 {
        let column = || -> Outcome {
            // Column: the gate projection alone.
            let layer = ColumnParallelLinear::new(&c.tp, hidden, ffn, ColumnInput::Replicated, m)
                .map_err(text)?;
            layer.load_weight(&d.gate).map_err(text)?;
            let (xs, w) = (c.symmetric(&d.x)?, c.device(&d.gate)?);
            let y = c
                .shmem
                .alloc_device::<bf16>(m * layer.local_out_features())
                .map_err(text)?;
            let full = c.shmem.alloc_device::<bf16>(m * ffn).map_err(text)?;
            layer.forward(&y, &xs, s).map_err(text)?;
            c.tp.gemm()
                .linear(
                    &full,
                    &xs,
                    &w,
                    LinearShape {
                        m,
                        n: ffn,
                        k: hidden,
                    },
                    s,
                )
                .map_err(text)?;
            sync(s).map_err(text)?;
            let full = full.to_vec().map_err(text)?;
            let shape = LinearShape {
                m,
                n: ffn,
                k: hidden,
            };
            sampled("the unsharded gate GEMM", &full, &d.x, &d.gate, shape, seed)?;
            let want = f64s(&take_cols(&full, ffn, shard_range(ffn, c.me(), c.n())));
            compare(
                "column-parallel vs unsharded",
                &y.to_vec().map_err(text)?,
                &want,
            )?;
            if !m.is_multiple_of(c.n()) {
                return Ok(());
            }
            // Sequence parallel, fused: the same product from this PE's share of the tokens.
            let per_pe = m / c.n();
            let layer =
                ColumnParallelLinear::new(&c.tp, hidden, ffn, ColumnInput::SequenceParallel, m)
                    .map_err(text)?;
            layer.load_weight(&d.gate).map_err(text)?;
            let mine = c.symmetric(&take_rows(
                &d.x,
                hidden,
                c.me() * per_pe..(c.me() + 1) * per_pe,
            ))?;
            layer
                .forward_with(&y, &mine, Schedule::Fused, s)
                .map_err(text)?;
            sync(s).map_err(text)?;
            compare_unsharded(
                "fused sequence-parallel column vs unsharded",
                &y.to_vec().map_err(text)?,
                &want,
            )
        };
        outcome = outcome.and(column());
    }
    if which.1 {
        let row = || -> Outcome {
            // Row: the down projection alone, on the input x widened to ffn features.
            let mut rng = Rng::new(seed ^ 1);
            let x = rng.bf16s(m * ffn, 1.0);
            let layer = RowParallelLinear::new(&c.tp, ffn, hidden, m).map_err(text)?;
            layer.load_weight(&d.down).map_err(text)?;
            let xs = c.device(&take_cols(&x, ffn, layer.local_in_features()))?;
            let (xf, w) = (c.device(&x)?, c.device(&d.down)?);
            let y = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
            let full = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
            layer.forward(&y, &xs, s).map_err(text)?;
            c.tp.gemm()
                .linear(
                    &full,
                    &xf,
                    &w,
                    LinearShape {
                        m,
                        n: hidden,
                        k: ffn,
                    },
                    s,
                )
                .map_err(text)?;
            sync(s).map_err(text)?;
            let got = y.to_vec().map_err(text)?;
            let full = full.to_vec().map_err(text)?;
            let shape = LinearShape {
                m,
                n: hidden,
                k: ffn,
            };
            sampled("the unsharded down GEMM", &full, &x, &d.down, shape, seed)?;
            let compared = compare_unsharded("row-parallel vs unsharded", &got, &f64s(&full));
            compared.and(c.identical("row-parallel output", &got))
        };
        outcome = outcome.and(row());
    }
    if which.2 {
        let mlp = || -> Outcome {
            let mlp = TpMlp::new(
                &c.tp,
                MlpShape {
                    hidden,
                    ffn,
                    max_tokens: m,
                },
            )
            .map_err(text)?;
            mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
            let x = c.device(&d.x)?;
            let want = f64s(&mlp_unsharded(c, &d, m, hidden, ffn)?);
            let mut found: Outcome = Ok(());
            for schedule in [Schedule::Sequential, Schedule::Fused] {
                let y = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
                mlp.forward_with(&y, &x, schedule, s).map_err(text)?;
                sync(s).map_err(text)?;
                let got = y.to_vec().map_err(text)?;
                let compared =
                    compare_unsharded(&format!("MLP ({schedule:?}) vs unsharded"), &got, &want);
                found = found.and(compared).and(c.identical("MLP output", &got));
            }
            if !m.is_multiple_of(c.n()) {
                return found;
            }
            // Sequence parallel: this PE's rows of the same outputs.
            let per_pe = m / c.n();
            let sp = SequenceParallelMlp::new(
                &c.tp,
                MlpShape {
                    hidden,
                    ffn,
                    max_tokens: m,
                },
            )
            .map_err(text)?;
            sp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
            let rows = c.me() * per_pe..(c.me() + 1) * per_pe;
            let x = c.symmetric(&take_rows(&d.x, hidden, rows.clone()))?;
            let mine = &want[rows.start * hidden..rows.end * hidden];
            for schedule in [Schedule::Sequential, Schedule::Fused] {
                let y = c.shmem.malloc::<bf16>(per_pe * hidden).map_err(text)?;
                sp.forward_with(&y, &x, schedule, s).map_err(text)?;
                sync(s).map_err(text)?;
                found = found.and(compare_unsharded(
                    &format!("sequence-parallel MLP ({schedule:?}) vs unsharded"),
                    &y.to_vec().map_err(text)?,
                    mine,
                ));
            }
            found
        };
        outcome = outcome.and(mlp());
    }
    outcome
}

/// [`graph::capture`], its error as the checks' text.
fn capture(
    stream: &Arc<CudaStream>,
    op: impl FnOnce() -> Result<(), Error>,
) -> Result<CudaGraph, String> {
    graph::capture(stream, op).map_err(text)
}

/// A captured forward replayed on new inputs gives what an eager call gives, bit for bit;
/// calls back to back (no host wait between), on one stream or alternating between two, each
/// give their own result.
fn mlp_graph_and_back_to_back(
    c: &Checks,
    seed: u64,
    (m, hidden, ffn): (usize, usize, usize),
) -> Outcome {
    let d = mlp_data(seed, m, hidden, ffn);
    let mlp = TpMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: m,
        },
    )
    .map_err(text)?;
    mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
    let mut rng = Rng::new(seed ^ 2);
    let inputs: Vec<Vec<bf16>> = (0..3).map(|_| rng.bf16s(m * hidden, 1.0)).collect();
    // Eager, one at a time.
    let mut eager = Vec::new();
    for x in &inputs {
        let (x, y) = (
            c.device(x)?,
            c.shmem.malloc::<bf16>(m * hidden).map_err(text)?,
        );
        mlp.forward(&y, &x, &c.stream).map_err(text)?;
        sync(&c.stream).map_err(text)?;
        eager.push(bits(&y.to_vec().map_err(text)?));
    }
    // Back to back on one stream.
    let xs: Vec<_> = inputs
        .iter()
        .map(|x| c.device(x))
        .collect::<Result<_, _>>()?;
    let ys: Vec<_> = (0..3)
        .map(|_| c.shmem.malloc::<bf16>(m * hidden).map_err(text))
        .collect::<Result<_, _>>()?;
    for (x, y) in xs.iter().zip(&ys) {
        mlp.forward(y, x, &c.stream).map_err(text)?;
    }
    sync(&c.stream).map_err(text)?;
    for (i, y) in ys.iter().enumerate() {
        if bits(&y.to_vec().map_err(text)?) != eager[i] {
            return Err(format!(
                "back-to-back call {i} differs from the same call made alone"
            ));
        }
    }
    // Back to back, alternating between two streams: the calls share the MLP's scratch and
    // the group's GEMM workspace, so each must wait for the last on the device.
    let other = c.shmem.new_stream().map_err(text)?;
    let ys2: Vec<_> = (0..3)
        .map(|_| c.shmem.malloc::<bf16>(m * hidden).map_err(text))
        .collect::<Result<_, _>>()?;
    for round in 0..2 {
        for (i, (x, y)) in xs.iter().zip(&ys2).enumerate() {
            let stream = if (i + round) % 2 == 0 {
                &c.stream
            } else {
                &other
            };
            mlp.forward(y, x, stream).map_err(text)?;
        }
    }
    sync(&c.stream).map_err(text)?;
    sync(&other).map_err(text)?;
    for (i, y) in ys2.iter().enumerate() {
        if bits(&y.to_vec().map_err(text)?) != eager[i] {
            return Err(format!(
                "call {i} on alternating streams differs from the same call made alone"
            ));
        }
    }
    // A graph of one forward, replayed with each input copied into its input buffer.
    let (x, y) = (&xs[0], &ys[0]);
    let graph = capture(&c.stream, || mlp.forward(y, x, &c.stream))?;
    for (i, input) in inputs.iter().enumerate().rev() {
        x.copy_from_host(input).map_err(text)?;
        graph.launch().map_err(|e| format!("cuGraphLaunch: {e}"))?;
        sync(&c.stream).map_err(text)?;
        if bits(&y.to_vec().map_err(text)?) != eager[i] {
            return Err(format!(
                "graph replay on input {i} differs from the eager call"
            ));
        }
    }
    Ok(())
}

/// Bad arguments are errors that say what is wrong, on every PE alike.
fn errors(c: &Checks, _seed: u64) -> Outcome {
    let expect = |what: &str, r: Result<(), Error>, want: fn(&Error) -> bool| -> Outcome {
        match r {
            Err(e) if want(&e) => Ok(()),
            Err(e) => Err(format!("{what}: the wrong error: {e}")),
            Ok(()) => Err(format!("{what}: accepted")),
        }
    };
    let (hidden, ffn, m) = (64, 32 * c.n(), 4);
    let mlp = TpMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: m,
        },
    )
    .map_err(text)?;
    let x = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
    let big = c
        .shmem
        .alloc_device::<bf16>((m + 1) * hidden)
        .map_err(text)?;
    let y = c.shmem.malloc::<bf16>((m + 1) * hidden).map_err(text)?;
    let length = |e: &Error| matches!(e, Error::Length { .. });
    let argument = |e: &Error| matches!(e, Error::InvalidArgument(_));
    expect(
        "a gate weight of the wrong size",
        mlp.load_weights(&[bf16::ZERO; 3], &[], &[]),
        length,
    )?;
    expect(
        "an output of the wrong length",
        mlp.forward(&y, &x, &c.stream),
        length,
    )?;
    expect(
        "more tokens than max_tokens",
        mlp.forward(&y, &big, &c.stream),
        argument,
    )?;
    let ragged = c.shmem.alloc_device::<bf16>(hidden + 1).map_err(text)?;
    expect(
        "an input that is not whole rows",
        mlp.forward(y.view(..hidden), &ragged, &c.stream),
        argument,
    )?;
    let too_narrow = RowParallelLinear::new(&c.tp, c.n() - 1, 8, 1).map(|_| ());
    expect("fewer input features than PEs", too_narrow, argument)?;
    Ok(())
}

/// `y = x · wᵀ` by `path` against f64 sums, with [`compare`]'s tolerance and exactness.
fn gemm_case(c: &Checks, seed: u64, shape: LinearShape, path: GemmPath) -> Outcome {
    let LinearShape { m, n, k } = shape;
    let mut rng = Rng::new(seed);
    let (x, w) = (rng.bf16s(m * k, 1.0), weight(&mut rng, n, k));
    let (xd, wd) = (c.device(&x)?, c.device(&w)?);
    let y = c.device(&rng.bf16s(m * n, 1.0))?; // poisoned: every element must be written
    c.tp.gemm()
        .linear_with(&y, &xd, &wd, shape, path, &c.stream)
        .map_err(text)?;
    sync(&c.stream).map_err(text)?;
    let got = y.to_vec().map_err(text)?;
    compare("GEMM output", &got, &matmul(&x, &w, m, n, k))?;
    // Twice more, back to back on the stream: the same bits (both paths are deterministic).
    let again = c.device(&rng.bf16s(m * n, 1.0))?;
    for out in [&y, &again] {
        c.tp.gemm()
            .linear_with(out, &xd, &wd, shape, path, &c.stream)
            .map_err(text)?;
    }
    sync(&c.stream).map_err(text)?;
    for out in [&y, &again] {
        if bits(&out.to_vec().map_err(text)?) != bits(&got) {
            return Err("a GEMM called again gave other bits".into());
        }
    }
    Ok(())
}

/// After [`Gemm::calibrate`], `GemmPath::Auto` takes the decode kernel or cuBLASLt by the
/// measurement (the same bits as that path), our decode kernel for sizes not measured and
/// cuBLASLt past 16 tokens, whose measured algorithms agree with its heuristic's first choice
/// within the tolerance and give the same bits call after call; a weight of the wrong length
/// is refused.
fn gemm_calibrated(c: &Checks, seed: u64) -> Outcome {
    let mut rng = Rng::new(seed);
    let gemm = c.tp.gemm();
    for (n, k) in [(1000, 4096), (129, 1000)] {
        let w = c.device(&weight(&mut rng, n, k))?;
        gemm.calibrate(&w, n, k, DECODE_MAX_TOKENS).map_err(text)?;
        for m in [1, 9, DECODE_MAX_TOKENS] {
            let shape = LinearShape { m, n, k };
            let path = gemm.auto_path(shape);
            if !matches!(path, GemmPath::Decode | GemmPath::CublasLt) {
                return Err(format!("m={m} n={n} k={k}: Auto takes {path:?}"));
            }
            let x = c.device(&rng.bf16s(m * k, 1.0))?;
            let mut outs = Vec::new();
            for p in [GemmPath::Auto, path] {
                let y = c.device(&rng.bf16s(m * n, 1.0))?;
                gemm.linear_with(&y, &x, &w, shape, p, &c.stream)
                    .map_err(text)?;
                sync(&c.stream).map_err(text)?;
                outs.push(bits(&y.to_vec().map_err(text)?));
            }
            if outs[0] != outs[1] {
                return Err(format!(
                    "m={m} n={n} k={k}: Auto's output differs from {path:?}'s"
                ));
            }
        }
        let past = LinearShape {
            m: DECODE_MAX_TOKENS + 1,
            n,
            k,
        };
        if gemm.auto_path(past) != GemmPath::CublasLt {
            return Err("past 16 tokens Auto must take cuBLASLt".into());
        }
    }
    // cuBLASLt's measured algorithms (calibrated up to 128 tokens) give the product that its
    // heuristic's first choice gives, within the tolerance, and the same bits call after call.
    let (n, k) = (1000, 4096);
    let w = c.device(&weight(&mut rng, n, k))?;
    gemm.calibrate(&w, n, k, 128).map_err(text)?;
    for m in [17, 100, 128] {
        let shape = LinearShape { m, n, k };
        let x = c.device(&rng.bf16s(m * k, 1.0))?;
        let mut outs = Vec::new();
        for p in [
            GemmPath::CublasLtHeuristic,
            GemmPath::CublasLt,
            GemmPath::CublasLt,
        ] {
            let y = c.device(&rng.bf16s(m * n, 1.0))?;
            gemm.linear_with(&y, &x, &w, shape, p, &c.stream)
                .map_err(text)?;
            sync(&c.stream).map_err(text)?;
            outs.push(y.to_vec().map_err(text)?);
        }
        let reference: Vec<f64> = outs[0].iter().map(|v| v.to_f64()).collect();
        compare_unsharded(
            &format!("m={m} n={n} k={k}: tuned cuBLASLt"),
            &outs[1],
            &reference,
        )?;
        if bits(&outs[1]) != bits(&outs[2]) {
            return Err(format!(
                "m={m} n={n} k={k}: tuned cuBLASLt gave other bits again"
            ));
        }
    }
    let unmeasured = LinearShape { m: 4, n: 77, k: 91 };
    if gemm.auto_path(unmeasured) != GemmPath::Decode {
        return Err("sizes never measured must take the decode kernel".into());
    }
    // A choice set by hand stands, and calibrating again leaves it.
    let pinned = LinearShape {
        m: 3,
        n: 129,
        k: 1000,
    };
    for path in [GemmPath::CublasLt, GemmPath::Decode] {
        gemm.set_auto_path(pinned, path).map_err(text)?;
        let w = c.device(&weight(&mut rng, 129, 1000))?;
        gemm.calibrate(&w, 129, 1000, DECODE_MAX_TOKENS)
            .map_err(text)?;
        if gemm.auto_path(pinned) != path {
            return Err(format!("set_auto_path({path:?}) did not stand"));
        }
    }
    for (m, path) in [
        (DECODE_MAX_TOKENS + 1, GemmPath::CublasLt),
        (0, GemmPath::Decode),
        (4, GemmPath::CublasLtHeuristic),
    ] {
        let shape = LinearShape { m, n: 8, k: 8 };
        match gemm.set_auto_path(shape, path) {
            Err(Error::InvalidArgument(_)) => {}
            other => return Err(format!("set_auto_path(m={m}, {path:?}): {other:?}")),
        }
    }
    let short = c.device(&[bf16::ONE; 10])?;
    match gemm.calibrate(&short, 4, 4, 8) {
        Err(Error::Length { .. }) => Ok(()),
        Err(e) => Err(format!("a short weight: the wrong error: {e}")),
        Ok(()) => Err("a short weight was accepted".into()),
    }
}

/// This PE's GEMMs of the MLP shape (gate/up, then down) for each token count, by cuBLASLt
/// (the algorithm calibration measured fastest), by our decode kernel (up to
/// [`DECODE_MAX_TOKENS`] tokens; larger token counts are skipped) and by cuBLASLt with its
/// heuristic's first choice, in CUDA graphs: time, TFLOP/s and the weight's bytes per second.
/// Each timed output is checked bit for bit against an eager call, and the other paths
/// against cuBLASLt within the tolerance.
fn gemm_timing(c: &Checks, a: &Args) -> Outcome {
    let f = shard_range(a.ffn, c.me(), c.n()).len();
    let shapes = [("gate/up", 2 * f, a.hidden), ("down", a.hidden, f)];
    if c.me() == 0 {
        println!(
            "\nGEMMs of this PE's MLP shard ({} over {} PEs), bf16, CUDA graphs, {} replays, PE 0; us: median [p10, p90]; TFLOP/s; GB/s of weight read",
            a.shape_name,
            c.n(),
            a.iters
        );
        println!(
            "{:>8} {:>5} {:>6} {:>6} {:>24} {:>7} {:>6} {:>8} {:>24} {:>7} {:>6} {:>8} {:>8} {:>24} {:>8}",
            "GEMM",
            "M",
            "N",
            "K",
            "cuBLASLt",
            "TFLOP/s",
            "GB/s",
            "ours",
            "",
            "TFLOP/s",
            "GB/s",
            "speed-up",
            "Auto",
            "cuBLASLt, heuristic's",
            "tuned"
        );
    }
    let mut rng = Rng::new(0x6e33);
    for (name, n, k) in shapes {
        let w = c.device(&rng.bf16s(n * k, 0.05))?;
        // What GemmPath::Auto takes on this GPU, as the layers measure it.
        let most = a.ms.iter().copied().max().unwrap_or(0);
        let started = std::time::Instant::now();
        c.tp.gemm().calibrate(&w, n, k, most).map_err(text)?;
        if c.me() == 0 {
            println!(
                "{name}: calibrated up to {most} tokens in {:.0} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        for &m in &a.ms {
            if m > DECODE_MAX_TOKENS {
                continue;
            }
            let ours = GemmPath::Decode;
            let x = c.device(&rng.bf16s(m * k, 1.0))?;
            let ys = [
                c.shmem.alloc_device::<bf16>(m * n).map_err(text)?,
                c.shmem.alloc_device::<bf16>(m * n).map_err(text)?,
                c.shmem.alloc_device::<bf16>(m * n).map_err(text)?,
            ];
            let shape = LinearShape { m, n, k };
            let paths = [GemmPath::CublasLt, ours, GemmPath::CublasLtHeuristic];
            let mut eager = Vec::new();
            for (y, path) in ys.iter().zip(paths) {
                c.tp.gemm()
                    .linear_with(y, &x, &w, shape, path, &c.stream)
                    .map_err(text)?;
                sync(&c.stream).map_err(text)?;
                eager.push(y.to_vec().map_err(text)?);
            }
            let reference: Vec<f64> = eager[0].iter().map(|v| v.to_f64()).collect();
            for (path, got) in paths.iter().zip(&eager).skip(1) {
                compare_unsharded(
                    &format!("{name} m={m}: {path:?} against cuBLASLt"),
                    got,
                    &reference,
                )?;
            }
            let mut cells = Vec::new();
            for ((y, path), want) in ys.iter().zip(paths).zip(&eager) {
                let graph = capture(&c.stream, || {
                    c.tp.gemm().linear_with(y, &x, &w, shape, path, &c.stream)
                })?;
                let (med, p10, p90) = median(time_graph(c, &graph, a.iters)?);
                if bits(&y.to_vec().map_err(text)?) != bits(want) {
                    return Err(format!(
                        "{name} m={m} {path:?}: a timed output differs from the eager one"
                    ));
                }
                let gbs = (n * k * 2) as f64 / (med * 1e3);
                let tflops = shape.flops() / (med * 1e6);
                cells.push((med, format!("{med:.1} [{p10:.1}, {p90:.1}]"), tflops, gbs));
            }
            if c.me() == 0 {
                println!(
                    "{name:>8} {m:>5} {n:>6} {k:>6} {:>24} {:>7.0} {:>6.0} {:>8} {:>24} {:>7.0} {:>6.0} {:>7.2}x {:>8} {:>24} {:>7.2}x",
                    cells[0].1,
                    cells[0].2,
                    cells[0].3,
                    format!("{ours:?}"),
                    cells[1].1,
                    cells[1].2,
                    cells[1].3,
                    cells[0].0 / cells[1].0,
                    format!("{:?}", c.tp.gemm().auto_path(shape)),
                    cells[2].1,
                    cells[2].0 / cells[0].0
                );
            }
        }
    }
    Ok(())
}

// ---- timing -------------------------------------------------------------------------------

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// Graph replays of `graph` timed with CUDA events, after a warm-up: microseconds each.
fn time_graph(c: &Checks, graph: &CudaGraph, iters: usize) -> Result<Vec<f64>, String> {
    let ctx = c.shmem.context();
    let ev = |_| {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| format!("cuEventCreate: {e}"))
    };
    let events: Vec<_> = (0..=iters).map(ev).collect::<Result<_, _>>()?;
    for _ in 0..5 {
        graph.launch().map_err(|e| format!("cuGraphLaunch: {e}"))?;
    }
    // Every PE starts its timed replays together.
    sync(&c.stream).map_err(text)?;
    c.shmem.barrier_all().map_err(text)?;
    events[0]
        .record(&c.stream)
        .map_err(|e| format!("cuEventRecord: {e}"))?;
    for e in &events[1..] {
        graph.launch().map_err(|e| format!("cuGraphLaunch: {e}"))?;
        e.record(&c.stream)
            .map_err(|e| format!("cuEventRecord: {e}"))?;
    }
    sync(&c.stream).map_err(text)?;
    events
        .windows(2)
        .map(|w| {
            w[0].elapsed_ms(&w[1])
                .map(|ms| ms as f64 * 1e3)
                .map_err(|e| format!("cuEventElapsedTime: {e}"))
        })
        .collect()
}

/// The MLP in a CUDA graph against its local GEMMs and kernel alone (no all-reduce), for
/// each token count, on fresh data; every timed output is checked bit for bit against an
/// eager call on the same data.
fn timing(c: &Checks, a: &Args) -> Outcome {
    let (hidden, ffn) = (a.hidden, a.ffn);
    let max_m = *a.ms.iter().max().expect("a non-empty --m");
    let d = mlp_data(0x7135, 0, hidden, ffn);
    let mlp = TpMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: max_m,
        },
    )
    .map_err(text)?;
    mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
    let f = mlp.down().local_in_features().len();
    let (gemm, s) = (c.tp.gemm(), &c.stream);
    if c.me() == 0 {
        println!(
            "\nMLP {} (hidden {hidden}, ffn {ffn}), TP {}, bf16, CUDA graphs, {} replays in 5 alternating blocks, PE 0; \
             us: median [p10, p90]",
            a.shape_name,
            c.n(),
            a.iters
        );
        println!(
            "{:>6} {:>26} {:>26} {:>9} {:>26} {:>9} {:>13}",
            "M", "compute-only", "sequential", "overhead", "fused", "overhead", "TFLOP/s/GPU"
        );
    }
    let mut rng = Rng::new(0x7136);
    for &m in &a.ms {
        let x = c.device(&rng.bf16s(m * hidden, 1.0))?;
        let y = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
        let gu = c.shmem.alloc_device::<bf16>(m * 2 * f).map_err(text)?;
        let act = c.shmem.alloc_device::<bf16>(m * f).map_err(text)?;
        let partial = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
        // The local work of one forward call: what no schedule can go below.
        let compute = || -> Result<(), Error> {
            gemm.linear(
                &gu,
                &x,
                mlp.gate_up().weight(),
                LinearShape {
                    m,
                    n: 2 * f,
                    k: hidden,
                },
                s,
            )?;
            c.tp.silu_mul(&act, &gu, m, s)?;
            gemm.linear(
                &partial,
                &act,
                mlp.down().weight(),
                LinearShape { m, n: hidden, k: f },
                s,
            )
        };
        mlp.forward_with(&y, &x, Schedule::Sequential, s)
            .map_err(text)?;
        compute().map_err(text)?;
        sync(s).map_err(text)?;
        let (eager, eager_partial) = (
            bits(&y.to_vec().map_err(text)?),
            bits(&partial.to_vec().map_err(text)?),
        );
        // The fused schedule, into its own output, where it has a form of its own (the
        // decode kernel; the GEMM + all-reduce in rounds): elsewhere it is the sequential
        // schedule again.
        let mut others = Vec::new();
        if mlp.down().resolved_schedule(Schedule::Fused, m) == Schedule::Fused {
            others.push(Schedule::Fused);
        }
        let mut outs = Vec::new();
        for &schedule in &others {
            let y2 = c.shmem.malloc::<bf16>(m * hidden).map_err(text)?;
            mlp.forward_with(&y2, &x, schedule, s).map_err(text)?;
            sync(s).map_err(text)?;
            let eager = bits(&y2.to_vec().map_err(text)?);
            outs.push((y2, eager));
        }
        let mut graphs = vec![
            capture(s, compute)?,
            capture(s, || mlp.forward_with(&y, &x, Schedule::Sequential, s))?,
        ];
        for (&schedule, (y2, _)) in others.iter().zip(&outs) {
            graphs.push(capture(s, || mlp.forward_with(y2, &x, schedule, s))?);
        }
        // In alternating blocks, so that clock and power drift fall on all alike.
        let mut times = vec![Vec::new(); graphs.len()];
        let rounds = 5;
        for _ in 0..rounds {
            for (g, t) in graphs.iter().zip(&mut times) {
                t.extend(time_graph(c, g, a.iters.div_ceil(rounds))?);
            }
        }
        let mut same = bits(&y.to_vec().map_err(text)?) == eager
            && bits(&partial.to_vec().map_err(text)?) == eager_partial;
        for (y2, eager) in &outs {
            same &= bits(&y2.to_vec().map_err(text)?) == *eager;
        }
        if !same {
            return Err(format!(
                "M={m}: the timed graphs' output differs from the eager call"
            ));
        }
        let t: Vec<_> = times.into_iter().map(median).collect();
        let tc = t[0];
        let best = t[1..].iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
        let flops = 6.0 * m as f64 * hidden as f64 * ffn as f64 / c.n() as f64;
        let cell = |(med, p10, p90): (f64, f64, f64)| format!("{med:.1} [{p10:.1}, {p90:.1}]");
        let with_overhead = |x: Option<&(f64, f64, f64)>| match x {
            Some(&x) => format!("{:>26} {:>8.1}%", cell(x), (x.0 - tc.0) / tc.0 * 100.0),
            None => format!("{:>26} {:>9}", "-", "-"),
        };
        if c.me() == 0 {
            println!(
                "{m:>6} {:>26} {} {} {:>13.1}",
                cell(tc),
                with_overhead(t.get(1)),
                with_overhead(t.get(2)),
                flops / best * 1e-6
            );
        }
    }
    Ok(())
}

/// Time each of `calls` (enqueued on the checks' stream, each into its own output, which
/// `read(i)` returns) in CUDA graphs, in 5 alternating blocks, after checking that every
/// timed graph's output is its eager call's, bit for bit. Cells: median [p10, p90] in µs.
fn time_calls(
    c: &Checks,
    iters: usize,
    calls: &[&dyn Fn() -> Result<(), Error>],
    read: &dyn Fn(usize) -> Result<Vec<bf16>, String>,
) -> Result<Vec<String>, String> {
    let s = &c.stream;
    let mut eager = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        call().map_err(text)?;
        sync(s).map_err(text)?;
        eager.push(bits(&read(i)?));
    }
    let graphs: Vec<_> = calls
        .iter()
        .map(|call| capture(s, call))
        .collect::<Result<_, _>>()?;
    let mut times = vec![Vec::new(); graphs.len()];
    for _ in 0..5 {
        for (g, t) in graphs.iter().zip(&mut times) {
            t.extend(time_graph(c, g, iters.div_ceil(5))?);
        }
    }
    for (i, want) in eager.iter().enumerate() {
        if bits(&read(i)?) != *want {
            return Err(format!(
                "timed graph {i}'s output differs from its eager call"
            ));
        }
    }
    let cell = |(med, p10, p90): (f64, f64, f64)| format!("{med:.1} [{p10:.1}, {p90:.1}]");
    Ok(times.into_iter().map(|v| cell(median(v))).collect())
}

/// Where the sequential MLP's time over its GEMMs goes: the GEMMs alone; the GEMMs then an
/// all-reduce of 8 bytes, which ends when the slowest PE's GEMMs have (so its excess over the
/// GEMMs is the PEs' spread plus one small all-reduce); the all-reduce of the output alone;
/// and the sequential MLP. Where the MLP costs more than the second and third together, the
/// all-reduce runs slower after the GEMMs than alone. Every timed output checked.
fn breakdown(c: &Checks, a: &Args) -> Outcome {
    let (hidden, ffn) = (a.hidden, a.ffn);
    let max_m = *a.ms.iter().max().expect("a non-empty --m");
    let d = mlp_data(0x7137, 0, hidden, ffn);
    let mlp = TpMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: max_m,
        },
    )
    .map_err(text)?;
    mlp.load_weights(&d.gate, &d.up, &d.down).map_err(text)?;
    let f = mlp.down().local_in_features().len();
    let (gemm, s, coll) = (c.tp.gemm(), &c.stream, c.tp.collectives());
    if c.me() == 0 {
        println!(
            "\nMLP {} (hidden {hidden}, ffn {ffn}), TP {}, sequential schedule, where the time \
             goes; CUDA graphs, {} replays in 5 alternating blocks, PE 0; us: median [p10, p90]",
            a.shape_name,
            c.n(),
            a.iters
        );
        println!(
            "{:>6} {:>26} {:>26} {:>26} {:>26}",
            "M", "GEMMs alone", "GEMMs + 8 B all-reduce", "all-reduce alone", "sequential MLP"
        );
    }
    let mut rng = Rng::new(0x7138);
    let sync_in = c.shmem.calloc::<bf16>(4).map_err(text)?;
    let sync_out = c.shmem.malloc::<bf16>(4).map_err(text)?;
    for &m in &a.ms {
        let x = c.device(&rng.bf16s(m * hidden, 1.0))?;
        let gu = c.shmem.alloc_device::<bf16>(m * 2 * f).map_err(text)?;
        let act = c.shmem.alloc_device::<bf16>(m * f).map_err(text)?;
        let partials: Vec<_> = (0..2)
            .map(|_| c.shmem.malloc::<bf16>(m * hidden))
            .collect::<Result<_, _>>()
            .map_err(text)?;
        let ys: Vec<_> = (0..2)
            .map(|_| c.shmem.malloc::<bf16>(m * hidden))
            .collect::<Result<_, _>>()
            .map_err(text)?;
        let compute = |partial: &SymmetricBuffer<bf16>| -> Result<(), Error> {
            let shape = LinearShape {
                m,
                n: 2 * f,
                k: hidden,
            };
            gemm.linear(&gu, &x, mlp.gate_up().weight(), shape, s)?;
            c.tp.silu_mul(&act, &gu, m, s)?;
            let shape = LinearShape { m, n: hidden, k: f };
            gemm.linear(partial, &act, mlp.down().weight(), shape, s)
        };
        // The all-reduce alone sums the partial products the first call leaves.
        compute(&partials[1]).map_err(text)?;
        let alone = || compute(&partials[0]);
        let then_sync = || {
            compute(&partials[1])?;
            coll.all_reduce(&sync_out, &sync_in, ReduceOp::Sum, AllReduceAlgo::Auto, s)
        };
        let reduce =
            || coll.all_reduce(&ys[0], &partials[1], ReduceOp::Sum, AllReduceAlgo::Auto, s);
        let forward = || mlp.forward_with(&ys[1], &x, Schedule::Sequential, s);
        let read = |i: usize| {
            match i {
                0 => partials[0].to_vec(),
                1 => partials[1].to_vec(),
                i => ys[i - 2].to_vec(),
            }
            .map_err(text)
        };
        let cells = time_calls(c, a.iters, &[&alone, &then_sync, &reduce, &forward], &read)?;
        if bits(&ys[0].to_vec().map_err(text)?) != bits(&ys[1].to_vec().map_err(text)?) {
            return Err(format!(
                "M={m}: the all-reduce of the GEMMs' output differs from the MLP's"
            ));
        }
        if c.me() == 0 {
            println!(
                "{m:>6} {:>26} {:>26} {:>26} {:>26}",
                cells[0], cells[1], cells[2], cells[3]
            );
        }
    }
    Ok(())
}

/// The sequence-parallel layers in each schedule against their local GEMM alone: the
/// gate/up projection (all-gather + GEMM; the GEMM alone as `Auto` picks it) and the down
/// projection (GEMM + reduce-scatter). Every timed output checked.
fn sequence_parallel_timing(c: &Checks, a: &Args) -> Outcome {
    let (hidden, ffn, n) = (a.hidden, a.ffn, c.n());
    let ms: Vec<usize> = a.ms.iter().copied().filter(|m| m % n == 0).collect();
    let Some(&max_m) = ms.iter().max() else {
        return Ok(());
    };
    let mut rng = Rng::new(0x7137);
    let column = ColumnParallelLinear::merged(
        &c.tp,
        hidden,
        &[ffn, ffn],
        ColumnInput::SequenceParallel,
        max_m,
    )
    .map_err(text)?;
    let row =
        RowParallelLinear::with_output(&c.tp, ffn, hidden, RowOutput::SequenceParallel, max_m)
            .map_err(text)?;
    for w in [column.weight(), row.weight()] {
        w.copy_from_host(&rng.bf16s(w.len(), 0.02)).map_err(text)?;
    }
    let (out, f) = (column.local_out_features(), row.local_in_features().len());
    let s = &c.stream;
    let header = |what: String, columns: &[&str]| {
        if c.me() == 0 {
            println!(
                "\n{what}, TP {n}, bf16, CUDA graphs, {} replays in 5 alternating blocks, PE 0; \
                 us: median [p10, p90]",
                a.iters
            );
            print!("{:>6}", "M");
            columns.iter().for_each(|h| print!(" {h:>26}"));
            println!();
        }
    };
    let line = |m: usize, cells: &[String]| {
        if c.me() == 0 {
            print!("{m:>6}");
            cells.iter().for_each(|t| print!(" {t:>26}"));
            println!();
        }
    };
    let schedules = [Schedule::Sequential, Schedule::Overlapped, Schedule::Fused];
    header(
        format!(
            "Sequence-parallel gate/up {} (hidden {hidden} -> {out} features per PE)",
            a.shape_name
        ),
        &["GEMM alone (Auto)", "sequential", "overlapped", "fused"],
    );
    for &m in &ms {
        let x = c.symmetric(&rng.bf16s(m / n * hidden, 1.0))?;
        let all = c.device(&rng.bf16s(m * hidden, 1.0))?;
        let shape = LinearShape {
            m,
            n: out,
            k: hidden,
        };
        let ys = outputs(c, 4, m * out)?;
        let (ys, all, x, column) = (&ys, &all, &x, &column);
        let g0 = || c.tp.gemm().linear(&ys[0], all, column.weight(), shape, s);
        let layer = |i: usize| move || column.forward_with(&ys[i], x, schedules[i - 1], s);
        let (l1, l2, l3) = (layer(1), layer(2), layer(3));
        let calls: Vec<&dyn Fn() -> Result<(), Error>> = vec![&g0, &l1, &l2, &l3];
        let read = |i: usize| ys[i].to_vec().map_err(text);
        line(m, &time_calls(c, a.iters, &calls, &read)?);
    }
    header(
        format!(
            "Sequence-parallel down {} ({f} features per PE -> hidden {hidden})",
            a.shape_name
        ),
        &["GEMM alone (Auto)", "sequential", "fused"],
    );
    for &m in &ms {
        let x = c.device(&rng.bf16s(m * f, 1.0))?;
        let partial = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
        let ys: Vec<_> = (0..2)
            .map(|_| c.shmem.malloc::<bf16>(m / n * hidden).map_err(text))
            .collect::<Result<_, _>>()?;
        let shape = LinearShape { m, n: hidden, k: f };
        let g = || c.tp.gemm().linear(&partial, &x, row.weight(), shape, s);
        let seq = || row.forward_with(&ys[0], &x, Schedule::Sequential, s);
        let fused = || row.forward_with(&ys[1], &x, Schedule::Fused, s);
        let read = |i: usize| match i {
            0 => partial.to_vec().map_err(text),
            i => ys[i - 1].to_vec().map_err(text),
        };
        line(m, &time_calls(c, a.iters, &[&g, &seq, &fused], &read)?);
    }
    let mlp = SequenceParallelMlp::new(
        &c.tp,
        MlpShape {
            hidden,
            ffn,
            max_tokens: max_m,
        },
    )
    .map_err(text)?;
    for (w, from) in [
        (mlp.gate_up().weight(), column.weight()),
        (mlp.down().weight(), row.weight()),
    ] {
        w.copy_from_host(&from.to_vec().map_err(text)?)
            .map_err(text)?;
    }
    header(
        format!(
            "Sequence-parallel MLP {} (hidden {hidden}, ffn {ffn})",
            a.shape_name
        ),
        &["compute-only", "sequential", "overlapped", "fused"],
    );
    for &m in &ms {
        let x = c.symmetric(&rng.bf16s(m / n * hidden, 1.0))?;
        let all = c.device(&rng.bf16s(m * hidden, 1.0))?;
        let gu = c.shmem.alloc_device::<bf16>(m * out).map_err(text)?;
        let act = c.shmem.alloc_device::<bf16>(m * f).map_err(text)?;
        let partial = c.shmem.alloc_device::<bf16>(m * hidden).map_err(text)?;
        let ys: Vec<_> = (0..3)
            .map(|_| c.shmem.malloc::<bf16>(m / n * hidden).map_err(text))
            .collect::<Result<_, _>>()?;
        // The local work of one call over every token: what no schedule can go below.
        let compute = || -> Result<(), Error> {
            let gemm = c.tp.gemm();
            gemm.linear(
                &gu,
                &all,
                mlp.gate_up().weight(),
                LinearShape {
                    m,
                    n: out,
                    k: hidden,
                },
                s,
            )?;
            c.tp.silu_mul(&act, &gu, m, s)?;
            gemm.linear(
                &partial,
                &act,
                mlp.down().weight(),
                LinearShape { m, n: hidden, k: f },
                s,
            )
        };
        let (ys, x, mlp) = (&ys, &x, &mlp);
        let call = |i: usize| move || mlp.forward_with(&ys[i], x, schedules[i], s);
        let (l0, l1, l2) = (call(0), call(1), call(2));
        let read = |i: usize| match i {
            0 => partial.to_vec().map_err(text),
            i => ys[i - 1].to_vec().map_err(text),
        };
        line(
            m,
            &time_calls(c, a.iters, &[&compute, &l0, &l1, &l2], &read)?,
        );
    }
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tp_mlp: {e}");
            std::process::exit(2);
        }
    };
    let shmem = match Nvshmem::init() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tp_mlp: {e}");
            std::process::exit(2);
        }
    };
    let tp = match TensorParallel::new(&shmem) {
        Ok(t) => match args.rounds {
            Some(r) => {
                let mut thresholds = *t.thresholds();
                thresholds.fused_exchange_gemms = r * shmem.n_pes();
                thresholds.fused_mlp_rounds = 0;
                t.with_thresholds(thresholds)
            }
            None => t,
        },
        Err(e) => {
            eprintln!("tp_mlp: PE {}: {e}", shmem.my_pe());
            std::process::exit(2);
        }
    };
    let n = shmem.n_pes();
    if shmem.my_pe() == 0 {
        println!(
            "tp_mlp: {n} PEs; {}",
            shmem.info().map(|i| i.to_string()).unwrap_or_default()
        );
    }
    let mut c = Checks {
        stream: shmem.stream().clone(),
        shmem,
        tp,
        verbose: args.verbose,
        names: Vec::new(),
        failed: Vec::new(),
    };
    // (m, k, n): odd token counts, features that are not multiples of 128 (nor of 8, where
    // cuBLASLt takes 2-byte aligned rows), every PE holding at least one feature.
    let small = [
        (1, 64, 96),
        (3, 200, 328),
        (127, 136, 40 * n),
        (16, 129, 8 * n + 3),
    ];
    if args.column {
        for s in small {
            c.run(
                format!("column replicated m={} k={} n={}", s.0, s.1, s.2),
                |c, seed| column_replicated(c, seed, s),
            );
        }
        for schedule in SCHEDULES {
            for (per_pe, k, nn) in [(1, 64, 96), (3, 200, 328), (16, 129, 8 * n + 3)] {
                c.run(
                    format!(
                        "column sequence-parallel {per_pe} rows per PE k={k} n={nn} {schedule:?}"
                    ),
                    |c, seed| column_sequence(c, seed, (per_pe, k, nn), schedule),
                );
            }
        }
    }
    if args.column {
        // The fused all-gather + GEMM: below FUSED_EXCHANGE_TOKENS rows per PE (sequential),
        // from there a GEMM per PE's rows, with shard widths of odd lengths too.
        let big = 2048usize.div_ceil(n) + 6;
        for s in [
            (3, 200, 328),
            (16, 136, 64 * n),
            (FUSED_EXCHANGE_TOKENS + 3, 136, 64 * n),
            (big, 136, 512 * n),
            (big, 264, 16 * n + 5),
        ] {
            c.run(
                format!(
                    "column fused {} rows per PE k={} n={}: back to back, two layers, graph replay",
                    s.0, s.1, s.2
                ),
                |c, seed| column_fused(c, seed, s, false),
            );
        }
        let s = (big, 136, 512 * n);
        c.run(
            format!(
                "column fused {} rows per PE k={} n={}, PE 0's output misaligned: back to back, two layers, graph replay",
                s.0, s.1, s.2
            ),
            |c, seed| column_fused(c, seed, s, true),
        );
    }
    if args.row {
        for schedule in SCHEDULES {
            for (m, k, nn) in small {
                // Row-parallel shards the input features: swap the roles of k and n.
                let s = (m, nn, k);
                c.run(
                    format!("row all-reduce m={} k={} n={} {schedule:?}", s.0, s.1, s.2),
                    |c, seed| row_all_reduce(c, seed, s, schedule),
                );
            }
        }
    }
    if args.row {
        // The fused decode kernel: one token (16-byte rows, the vector path), the most tokens
        // it takes with rows of an odd length (the element path), odd token counts and a
        // partial task (36 features: two tasks and a quarter). The widest give a block
        // several tasks (1057 and 1321 of 16 features on a grid of 2 blocks per SM, a
        // partial last one), whose sums it sends and takes back task by task. Where the
        // kernel does not take the call (an output width that is no multiple of 4, more
        // than FUSED_DECODE_MAX_TOKENS tokens) Fused is the sequential schedule.
        for s in [
            (1, 512 * n, 1032),
            (FUSED_DECODE_MAX_TOKENS, 520 * n + 3, 96),
            (5, 136 * n, 36),
            (7, 264 * n + 5, 40),
            (3, 64 * n, 16900),
            (FUSED_DECODE_MAX_TOKENS, 64 * n, 21124),
            (5, 136 * n, 33),
            (11, 512 * n, 72),
            (DECODE_MAX_TOKENS, 256 * n, 1030),
        ] {
            c.run(
                format!(
                    "row fused m={} k={} n={}: graph replay, back to back",
                    s.0, s.1, s.2
                ),
                |c, seed| row_fused(c, seed, s, None),
            );
        }
        // From 512 tokens per PE, the fused GEMM + all-reduce (odd widths: the sums' element
        // path), in one round and in rounds of 512 rows and odd sizes; tokens that the PEs do
        // not share equally go sequentially.
        for (s, rounds) in [
            ((FUSED_EXCHANGE_TOKENS * n, 64 * n, 520), None),
            ((515 * n, 136 * n, 33), None),
            ((1024 * n, 64 * n, 520), Some(2)),
            ((1539 * n, 72 * n, 33), Some(3)),
            ((FUSED_EXCHANGE_TOKENS * n + 1, 64 * n, 72), Some(4)),
        ] {
            let per_round = rounds.map_or(String::new(), |r| format!(" in {r} rounds"));
            c.run(
                format!(
                    "row fused m={} k={} n={}{per_round}: graph replay, back to back",
                    s.0, s.1, s.2
                ),
                |c, seed| row_fused(c, seed, s, rounds),
            );
        }
        for s in [(1, 96, 64), (3, 328, 200), (16, 129, 8 * n + 3)] {
            c.run(
                format!("row reduce-scatter {} rows per PE k={} n={}", s.0, s.1, s.2),
                |c, seed| row_reduce_scatter(c, seed, s),
            );
        }
        // The fused GEMM + reduce-scatter, from 512 tokens per PE (odd widths; below, the
        // sequential schedule, bit for bit where both use the decode kernel), in one round
        // and in 3 (the sums' element path).
        for (s, rounds) in [
            ((1, 96 * n, 64), None),
            ((3, 328, 200), None),
            ((512, 64 * n, 520), None),
            ((515, 136 * n, 33), None),
            ((1539, 72 * n, 33), Some(3)),
        ] {
            let per_round = rounds.map_or(String::new(), |r| format!(" in {r} rounds"));
            c.run(
                format!(
                    "row reduce-scatter fused {} rows per PE k={} n={}{per_round}: back to back, two layers, graph replay",
                    s.0, s.1, s.2
                ),
                |c, seed| row_reduce_scatter_fused(c, seed, s, rounds),
            );
        }
    }
    if args.mlp {
        for s in [
            (1, 64, 8 * n),
            (3, 96, 200),
            (127, 136, 328),
            (16, 200, 16 * n + 5),
        ] {
            for schedule in SCHEDULES {
                c.run(
                    format!("mlp m={} hidden={} ffn={} {schedule:?}", s.0, s.1, s.2),
                    |c, seed| mlp_small(c, seed, s, schedule),
                );
            }
        }
        for s in [(1, 64, 8 * n), (3, 96, 200), (16, 200, 16 * n + 5)] {
            for schedule in SCHEDULES {
                c.run(
                    format!(
                        "sequence-parallel mlp {} rows per PE hidden={} ffn={} {schedule:?}",
                        s.0, s.1, s.2
                    ),
                    |c, seed| mlp_sequence_parallel(c, seed, s, schedule),
                );
            }
        }
        // From FUSED_EXCHANGE_TOKENS per PE both exchanges fuse.
        let s = (
            2048usize.div_ceil(n).max(FUSED_EXCHANGE_TOKENS) + 2,
            136,
            64 * n,
        );
        c.run(
            format!(
                "sequence-parallel mlp {} rows per PE hidden={} ffn={}: Auto at and below its threshold",
                s.0, s.1, s.2
            ),
            |c, seed| sequence_parallel_auto(c, seed, s),
        );
        c.run(
            "mlp graph replay and back-to-back calls".into(),
            |c, seed| mlp_graph_and_back_to_back(c, seed, (64, 256, 512 * n)),
        );
        c.run("errors name the bad argument".into(), errors);
    }
    if args.gemm {
        // Both paths on odd shapes: k not a multiple of 8 (the decode kernel's scalar path),
        // one row, the most rows the decode kernel takes, and the shard shapes of the 8B MLP.
        for (m, n, k) in [
            (1, 129, 35),
            (3, 64, 200),
            (8, 1000, 4096),
            (5, 33, 4100),
            (2, 7, 9),
            (9, 1000, 4096),
            (13, 33, 4100),
            (DECODE_MAX_TOKENS, 129, 1000),
            (DECODE_MAX_TOKENS, 64, 35),
            // k that ends mid-step (not a multiple of 64, nor of a block's 512 per pass),
            // with rows past n and tokens past 8 in the last tile.
            (12, 30, 4104),
            (3, 17, 520),
        ] {
            for path in [GemmPath::Decode, GemmPath::CublasLt] {
                c.run(format!("gemm {path:?} m={m} n={n} k={k}"), |c, seed| {
                    gemm_case(c, seed, LinearShape { m, n, k }, path)
                });
            }
        }
        c.run(
            "gemm Auto takes the path calibrate recorded".into(),
            gemm_calibrated,
        );
        if args.timing {
            c.run("gemm timing (every timed output checked)".into(), |c, _| {
                gemm_timing(c, &args)
            });
        }
    }
    let which = (args.column, args.row, args.mlp);
    if which != (false, false, false) {
        for &m in &args.ms {
            c.run(
                format!(
                    "{} shape (hidden {}, ffn {}) m={m} against the unsharded GEMMs",
                    args.shape_name, args.hidden, args.ffn
                ),
                |c, seed| large(c, seed, m, args.hidden, args.ffn, which),
            );
        }
    }
    if args.timing && (args.column || args.row) {
        c.run(
            "sequence-parallel timing (every timed output checked)".into(),
            |c, _| sequence_parallel_timing(c, &args),
        );
    }
    if args.timing && args.mlp {
        c.run("timing (every timed output checked)".into(), |c, _| {
            timing(c, &args)
        });
    }
    if args.timing && args.breakdown {
        c.run(
            "overhead breakdown (every timed output checked)".into(),
            |c, _| breakdown(c, &args),
        );
    }
    match c.finish() {
        Ok((passed, failed)) => {
            if c.me() == 0 {
                println!("{passed} passed, {failed} failed");
            }
            std::process::exit(if failed == 0 { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("tp_mlp: PE {}: the final tally failed: {e}", c.me());
            std::process::exit(1);
        }
    }
}
