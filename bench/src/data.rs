//! Test data: counter-based random values (any PE can compute any other PE's input without
//! communication), CPU references, and comparisons.

use cudarc::nccl::sys::ncclDataType_t;
use half::bf16;
use nvshmem::Element;

#[path = "../../examples/common/splitmix.rs"]
mod splitmix;

pub use splitmix::mix;

/// A key for one test case from the seed and the case's coordinates.
pub fn key(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(mix(seed), |acc, &p| mix(acc ^ p))
}

/// FNV-1a, then mixed.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    mix(h)
}

/// The per-PE base of the random words of case `key`.
pub fn pe_base(key: u64, pe: usize) -> u64 {
    mix(key ^ (pe as u64).wrapping_mul(0xd6e8_feb8_6659_fd93))
}

/// The random word number `i` of PE `pe` in case `key`.
pub fn word(key: u64, pe: usize, i: usize) -> u64 {
    mix(pe_base(key, pe).wrapping_add(i as u64))
}

/// Largest |k| of the values k/4 we generate for `n_pes` PEs: every partial sum of up to
/// `n_pes` values then has |sum| <= 256 quarter units, exactly representable in bf16 (8
/// significant bits) and f32, so sums are exact in any reduction order.
pub fn unit_range(n_pes: usize) -> i32 {
    (256 / n_pes.max(1)).max(1) as i32
}

/// Random integer in [-range, range] for element `i` of PE `pe`.
#[cfg(test)]
pub fn units(key: u64, pe: usize, i: usize, range: i32) -> i32 {
    units_at(pe_base(key, pe), i, range)
}

/// [`units`] from a precomputed [`pe_base`].
fn units_at(base: u64, i: usize, range: i32) -> i32 {
    let span = (2 * range + 1) as u64;
    (mix(base.wrapping_add(i as u64)) % span) as i32 - range
}

/// The element types of the collective benchmarks.
pub trait BenchElem: Element {
    const NAME: &'static str;
    const NCCL: ncclDataType_t;
    /// The value `k / 4`.
    fn from_quarters(k: i32) -> Self;
    /// The bits, for exact comparison (NaN-safe).
    fn bits(self) -> u64;
    fn to_f64(self) -> f64;
}

impl BenchElem for f32 {
    const NAME: &'static str = "f32";
    const NCCL: ncclDataType_t = ncclDataType_t::ncclFloat32;
    fn from_quarters(k: i32) -> Self {
        k as f32 * 0.25
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl BenchElem for bf16 {
    const NAME: &'static str = "bf16";
    const NCCL: ncclDataType_t = ncclDataType_t::ncclBfloat16;
    fn from_quarters(k: i32) -> Self {
        bf16::from_f32(k as f32 * 0.25)
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}

/// Fill `out` in parallel: `f(start, chunk)` fills the chunk that begins at element `start`.
pub fn par_fill<T: Send>(out: &mut [T], threads: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let threads = threads.max(1);
    if threads == 1 || out.len() < 1 << 16 {
        f(0, out);
        return;
    }
    let chunk = out.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (i, piece) in out.chunks_mut(chunk).enumerate() {
            let f = &f;
            s.spawn(move || f(i * chunk, piece));
        }
    });
}

/// This PE's `len` input values of case `key`: element `i` is `k / 4` with `k` =
/// [`units`]`(key, me, i, range)`.
fn pe_input<T: BenchElem>(key: u64, me: usize, len: usize, range: i32, threads: usize) -> Vec<T> {
    let mine = pe_base(key, me);
    let mut input = vec![T::default(); len];
    par_fill(&mut input, threads, |start, chunk| {
        for (j, x) in chunk.iter_mut().enumerate() {
            *x = T::from_quarters(units_at(mine, start + j, range));
        }
    });
    input
}

/// The sums over every PE of their input elements `offset .. offset + len` (exact: see
/// [`unit_range`]).
fn pe_sums<T: BenchElem>(
    key: u64,
    n_pes: usize,
    offset: usize,
    len: usize,
    range: i32,
    threads: usize,
) -> Vec<T> {
    let bases: Vec<u64> = (0..n_pes).map(|pe| pe_base(key, pe)).collect();
    let mut sums = vec![T::default(); len];
    par_fill(&mut sums, threads, |start, chunk| {
        for (j, x) in chunk.iter_mut().enumerate() {
            let i = offset + start + j;
            let sum: i32 = bases.iter().map(|&b| units_at(b, i, range)).sum();
            *x = T::from_quarters(sum);
        }
    });
    sums
}

/// This PE's all-reduce input and the expected sum, `count` elements each.
pub fn allreduce_case<T: BenchElem>(
    key: u64,
    me: usize,
    n_pes: usize,
    count: usize,
    threads: usize,
) -> (Vec<T>, Vec<T>) {
    let range = unit_range(n_pes);
    let input = pe_input(key, me, count, range, threads);
    let expected = pe_sums(key, n_pes, 0, count, range, threads);
    (input, expected)
}

/// This PE's reduce-scatter input (`n_pes * count` elements: one block of `count` for every
/// PE) and the expected output: block `me` summed over every PE (`count` elements). The input
/// is the all-reduce input of `n_pes * count` elements, and the output that all-reduce's
/// block `me`.
pub fn reducescatter_case<T: BenchElem>(
    key: u64,
    me: usize,
    n_pes: usize,
    count: usize,
    threads: usize,
) -> (Vec<T>, Vec<T>) {
    let range = unit_range(n_pes);
    let input = pe_input(key, me, n_pes * count, range, threads);
    let expected = pe_sums(key, n_pes, me * count, count, range, threads);
    (input, expected)
}

/// This PE's all-gather input (`count` elements) and the expected output (`n_pes * count`).
pub fn allgather_case<T: BenchElem>(
    key: u64,
    me: usize,
    n_pes: usize,
    count: usize,
    threads: usize,
) -> (Vec<T>, Vec<T>) {
    let range = unit_range(n_pes);
    let bases: Vec<u64> = (0..n_pes).map(|pe| pe_base(key, pe)).collect();
    let mut expected = vec![T::default(); count * n_pes];
    par_fill(&mut expected, threads, |start, chunk| {
        for (j, x) in chunk.iter_mut().enumerate() {
            let idx = start + j;
            *x = T::from_quarters(units_at(bases[idx / count], idx % count, range));
        }
    });
    let input = expected[me * count..(me + 1) * count].to_vec();
    (input, expected)
}

/// This PE's broadcast input (`count` elements, its own random data: only PE `root`'s is
/// sent) and the expected output: PE `root`'s input.
pub fn broadcast_case<T: BenchElem>(
    key: u64,
    me: usize,
    root: usize,
    count: usize,
    threads: usize,
) -> (Vec<T>, Vec<T>) {
    let range = unit_range(1);
    let input = pe_input(key, me, count, range, threads);
    let expected = pe_input(key, root, count, range, threads);
    (input, expected)
}

/// This PE's all-to-all input (`n_pes` blocks of `count`: block `q` for PE `q`) and the
/// expected output: block `me` of every PE's input, in PE order.
pub fn alltoall_case<T: BenchElem>(
    key: u64,
    me: usize,
    n_pes: usize,
    count: usize,
    threads: usize,
) -> (Vec<T>, Vec<T>) {
    let range = unit_range(1);
    let input = pe_input(key, me, n_pes * count, range, threads);
    let bases: Vec<u64> = (0..n_pes).map(|pe| pe_base(key, pe)).collect();
    let mut expected = vec![T::default(); count * n_pes];
    par_fill(&mut expected, threads, |start, chunk| {
        for (j, x) in chunk.iter_mut().enumerate() {
            let idx = start + j;
            let (from, i) = (idx / count, idx % count);
            *x = T::from_quarters(units_at(bases[from], me * count + i, range));
        }
    });
    (input, expected)
}

/// `len` bf16 values uniform in [-scale, scale) (before rounding to bf16) of case `key`, the
/// same on every PE: value `i` comes from the random word `i` of PE 0's stream, whichever PE
/// asks, so the PEs agree on data without communicating.
pub fn uniform_bf16(key: u64, len: usize, scale: f32, threads: usize) -> Vec<bf16> {
    let base = pe_base(key, 0);
    let mut out = vec![bf16::ZERO; len];
    par_fill(&mut out, threads, |start, chunk| {
        for (j, x) in chunk.iter_mut().enumerate() {
            // The top 24 bits: a multiple of 2^-23 in [-1, 1).
            let w = mix(base.wrapping_add((start + j) as u64));
            let u = (w >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            *x = bf16::from_f32(u * scale);
        }
    });
    out
}

/// Compare with a tolerance: element `i` passes when `|got - expected| <= rel * (|expected| +
/// rms(expected))`, the root mean square taken over the whole of `expected` (a NaN never
/// passes).
pub fn compare_close(got: &[bf16], expected: &[bf16], rel: f64) -> Mismatch {
    let rms = if expected.is_empty() {
        0.0
    } else {
        (expected.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / expected.len() as f64).sqrt()
    };
    compare_with(
        got,
        expected,
        "elements",
        |g, e| {
            let e = e.to_f64();
            (g.to_f64() - e).abs() <= rel * (e.abs() + rms)
        },
        |v| format!("{}", v.to_f64()),
    )
}

/// `len` random bytes of PE `pe` in case `key`.
pub fn bytes(key: u64, pe: usize, len: usize) -> Vec<u8> {
    bytes_at(key, pe, 0, len)
}

/// `len` bytes of [`bytes`]'s stream starting at byte `offset` (a multiple of 8), i.e.
/// `bytes(key, pe, offset + len)[offset..]` without the prefix; what `bench_fill_random`
/// writes on the GPU.
pub fn bytes_at(key: u64, pe: usize, offset: usize, len: usize) -> Vec<u8> {
    assert_eq!(offset % 8, 0, "bytes_at offsets are whole words");
    let base = pe_base(key, pe).wrapping_add((offset / 8) as u64);
    let mut out = vec![0u8; len];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let w = mix(base.wrapping_add(i as u64)).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
    out
}

/// `n` random u32 of PE `pe` in case `key`.
pub fn words32(key: u64, pe: usize, n: usize) -> Vec<u32> {
    (0..n).map(|i| word(key, pe, i) as u32).collect()
}

/// The result of comparing an output with its reference.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mismatch {
    /// Number of differing elements.
    pub count: u64,
    /// The first difference: index, got, expected (as text).
    pub first: Option<(usize, String, String)>,
}

impl Mismatch {
    pub fn describe(&self) -> String {
        match &self.first {
            None => "ok".into(),
            Some((i, got, exp)) => format!(
                "{} wrong, first at element {i}: got {got}, expected {exp}",
                self.count
            ),
        }
    }
}

/// Compare element by element, by bits.
pub fn compare_elems<T: BenchElem>(got: &[T], expected: &[T]) -> Mismatch {
    compare_with(
        got,
        expected,
        "elements",
        |g, e| g.bits() == e.bits(),
        |v| format!("{}", v.to_f64()),
    )
}

/// Compare plain values (bytes, words).
pub fn compare_plain<T: PartialEq + std::fmt::Debug>(got: &[T], expected: &[T]) -> Mismatch {
    compare_with(got, expected, "values", |g, e| g == e, |v| format!("{v:?}"))
}

/// Count the positions where `same` fails and describe the first with `show`; a length
/// difference counts as at least one mismatch (`unit` names what the lengths count).
fn compare_with<T>(
    got: &[T],
    expected: &[T],
    unit: &str,
    same: impl Fn(&T, &T) -> bool,
    show: impl Fn(&T) -> String,
) -> Mismatch {
    let mut m = Mismatch::default();
    if got.len() != expected.len() {
        m.count = got.len().abs_diff(expected.len()).max(1) as u64;
        m.first = Some((
            got.len().min(expected.len()),
            format!("{} {unit}", got.len()),
            format!("{} {unit}", expected.len()),
        ));
        return m;
    }
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        if !same(g, e) {
            if m.first.is_none() {
                m.first = Some((i, show(g), show(e)));
            }
            m.count += 1;
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_words_are_deterministic_and_distinct() {
        let k = key(1, &[2, 3]);
        assert_eq!(k, key(1, &[2, 3]));
        assert_ne!(k, key(1, &[3, 2]));
        assert_ne!(word(k, 0, 0), word(k, 1, 0));
        assert_ne!(word(k, 0, 0), word(k, 0, 1));
        assert_eq!(bytes(k, 2, 13), bytes(k, 2, 13));
        assert_eq!(bytes(k, 2, 13)[..8], bytes(k, 2, 8)[..]);
        assert_eq!(words32(k, 1, 4).len(), 4);
    }

    #[test]
    fn units_stay_in_range() {
        let r = unit_range(8);
        assert_eq!(r, 32);
        assert_eq!(unit_range(1), 256);
        assert_eq!(unit_range(1000), 1);
        let k = key(7, &[]);
        let v: Vec<i32> = (0..10_000).map(|i| units(k, 3, i, r)).collect();
        assert!(v.iter().all(|x| x.abs() <= r));
        assert!(v.contains(&r) && v.contains(&-r));
    }

    #[test]
    fn allreduce_reference_is_exact_in_bf16() {
        let k = key(5, &[1]);
        let n = 8;
        let (input, expected) = allreduce_case::<bf16>(k, 3, n, 1000, 2);
        assert_eq!(input.len(), 1000);
        for i in 0..1000 {
            let sum: i32 = (0..n).map(|pe| units(k, pe, i, unit_range(n))).sum();
            assert_eq!(expected[i].to_f64(), sum as f64 / 4.0);
            assert_eq!(
                input[i].to_f64(),
                units(k, 3, i, unit_range(n)) as f64 / 4.0
            );
        }
        // Summing the bf16 inputs in any order in bf16 gives the reference exactly.
        let inputs: Vec<Vec<bf16>> = (0..n)
            .map(|pe| allreduce_case::<bf16>(k, pe, n, 1000, 1).0)
            .collect();
        for i in 0..1000 {
            let fwd = inputs.iter().fold(bf16::from_f32(0.0), |a, v| a + v[i]);
            let rev = inputs
                .iter()
                .rev()
                .fold(bf16::from_f32(0.0), |a, v| a + v[i]);
            assert_eq!(fwd.to_bits(), expected[i].to_bits());
            assert_eq!(rev.to_bits(), expected[i].to_bits());
        }
    }

    #[test]
    fn reducescatter_reference_is_this_pes_block_summed_in_pe_order() {
        let k = key(13, &[3]);
        for (n, count) in [(8, 1000), (3, 257), (1, 64)] {
            let inputs: Vec<Vec<bf16>> = (0..n)
                .map(|pe| reducescatter_case::<bf16>(k, pe, n, count, 1).0)
                .collect();
            let (_, all) = allreduce_case::<bf16>(k, 0, n, n * count, 2);
            for me in 0..n {
                let (input, expected) = reducescatter_case::<bf16>(k, me, n, count, 3);
                assert_eq!(input.len(), n * count);
                assert_eq!(expected.len(), count);
                assert_eq!(input, allreduce_case::<bf16>(k, me, n, n * count, 1).0);
                assert_eq!(expected, all[me * count..(me + 1) * count]);
                // What our kernel computes: block `me` of every PE added in PE order in f32,
                // rounded once.
                for j in 0..count {
                    let acc = inputs
                        .iter()
                        .fold(0.0f32, |a, v| a + v[me * count + j].to_f64() as f32);
                    assert_eq!(bf16::from_f32(acc).to_bits(), expected[j].to_bits());
                }
            }
        }
        let (input, expected) = reducescatter_case::<f32>(k, 1, 4, 70_000, 4);
        assert_eq!(input, allreduce_case::<f32>(k, 1, 4, 4 * 70_000, 1).0);
        assert_eq!(
            expected,
            allreduce_case::<f32>(k, 0, 4, 4 * 70_000, 4).1[70_000..140_000]
        );
    }

    #[test]
    fn allgather_reference_concatenates_inputs() {
        let k = key(9, &[2]);
        let (n, count) = (4, 70_000);
        let (input, expected) = allgather_case::<f32>(k, 2, n, count, 3);
        assert_eq!(expected.len(), n * count);
        assert_eq!(&expected[2 * count..3 * count], &input[..]);
        for pe in 0..n {
            let (theirs, _) = allreduce_case::<f32>(k, pe, n, count, 1);
            assert_eq!(&expected[pe * count..(pe + 1) * count], &theirs[..]);
        }
    }

    #[test]
    fn broadcast_and_alltoall_cases_agree_with_every_pe_s_input() {
        let (k, n, count) = (key(3, &[9]), 3, 5);
        let (_, want) = broadcast_case::<f32>(k, 1, 2, count, 2);
        assert_eq!(want, broadcast_case::<f32>(k, 2, 2, count, 1).0);
        for me in 0..n {
            let (_, expected) = alltoall_case::<f32>(k, me, n, count, 2);
            for from in 0..n {
                let (theirs, _) = alltoall_case::<f32>(k, from, n, count, 1);
                assert_eq!(
                    &expected[from * count..(from + 1) * count],
                    &theirs[me * count..(me + 1) * count]
                );
            }
        }
    }

    #[test]
    fn parallel_fill_matches_serial() {
        let mut a = vec![0u64; 200_000];
        let mut b = vec![0u64; 200_000];
        par_fill(&mut a, 1, |s, c| {
            c.iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = word(1, 0, s + j))
        });
        par_fill(&mut b, 7, |s, c| {
            c.iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = word(1, 0, s + j))
        });
        assert_eq!(a, b);
    }

    #[test]
    fn uniform_values_are_shared_by_every_pe_and_stay_in_range() {
        let k = key(11, &[4]);
        let a = uniform_bf16(k, 100_000, 0.5, 1);
        assert_eq!(
            a,
            uniform_bf16(k, 100_000, 0.5, 7),
            "threads change nothing"
        );
        assert_ne!(a, uniform_bf16(key(11, &[5]), 100_000, 0.5, 1));
        assert!(a.iter().all(|v| v.to_f64().abs() <= 0.5));
        let mean = a.iter().map(|v| v.to_f64()).sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / a.len() as f64;
        // Uniform in [-s, s): mean 0, variance s^2 / 3.
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 0.25 / 3.0).abs() < 0.002, "{var}");
        assert!(a.iter().any(|v| v.to_f64() < -0.49) && a.iter().any(|v| v.to_f64() > 0.49));
    }

    #[test]
    fn close_comparison_scales_with_the_element_and_the_rms() {
        let b = |v: f32| bf16::from_f32(v);
        let expected = [b(1.0), b(-1.0), b(0.0), b(1.0)];
        // rms 0.866; tolerance 1/64 * (|e| + rms): 0.0292 at ±1, 0.0135 at 0.
        let good = [b(1.02), b(-0.98), b(0.0117), b(1.0)];
        assert_eq!(compare_close(&good, &expected, 1.0 / 64.0).count, 0);
        let bad = [b(1.04), b(-1.0), b(0.0156), b(f32::NAN)];
        let m = compare_close(&bad, &expected, 1.0 / 64.0);
        assert_eq!(m.count, 3);
        assert_eq!(m.first.as_ref().map(|f| f.0), Some(0));
        assert_eq!(compare_close(&bad[..2], &expected, 1.0).count, 2);
        assert_eq!(compare_close(&[], &[], 1.0 / 64.0).count, 0);
    }

    #[test]
    fn comparisons_count_and_locate_differences() {
        let e = [1.0f32, 2.0, 3.0];
        assert_eq!(compare_elems(&e, &e).count, 0);
        let m = compare_elems(&[1.0f32, 5.0, f32::NAN], &e);
        assert_eq!(m.count, 2);
        assert_eq!(m.first, Some((1, "5".into(), "2".into())));
        assert!(m.describe().contains("first at element 1"));
        assert_eq!(compare_elems(&[1.0f32], &e).count, 2);
        let p = compare_plain(&[1u8, 2, 3], &[1u8, 2, 4]);
        assert_eq!((p.count, p.first.unwrap().0), (1, 2));
        assert_eq!(compare_plain::<u8>(&[], &[]).describe(), "ok");
    }
}
