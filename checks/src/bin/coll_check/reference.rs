//! The random inputs of every check and the CPU references they are compared with, computed
//! as the kernels compute them (PE order, f32 accumulation).

use nvshmem::{bf16, f16, Element, ReduceOp};
use nvshmem_checks::splitmix::{SplitMix64, GOLDEN};

/// The random values of one check on one PE (splitmix64, seeded by the check and the PE).
pub(crate) struct Rng(SplitMix64);

impl Rng {
    pub(crate) fn new(check: u64, pe: usize) -> Self {
        Rng(SplitMix64(
            check.wrapping_mul(GOLDEN) ^ (pe as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
        ))
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A type our all-reduce supports, with the kernel's arithmetic on the CPU.
pub(crate) trait Reducible: Element {
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

pub(crate) fn inputs<T: Reducible>(seed: u64, n_pes: usize, n: usize) -> Vec<Vec<T>> {
    (0..n_pes)
        .map(|pe| {
            let mut rng = Rng::new(seed, pe);
            (0..n).map(|_| T::random(&mut rng)).collect()
        })
        .collect()
}

pub(crate) fn reference<T: Reducible>(op: ReduceOp, all: &[Vec<T>]) -> Vec<T> {
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

/// `times` more sums of `x` held by every one of `n_pes` PEs, as the kernels compute them.
pub(crate) fn summed_again<T: Reducible>(mut x: Vec<T>, n_pes: usize, times: usize) -> Vec<T> {
    for _ in 0..times {
        x = reference(ReduceOp::Sum, &vec![x; n_pes]);
    }
    x
}

/// Block `me` of every PE's input, in PE order: what this PE's all-to-all output must be.
pub(crate) fn all_to_all_want<T: Reducible>(all: &[Vec<T>], me: usize, block: usize) -> Vec<T> {
    all.iter()
        .flat_map(|src| src[me * block..(me + 1) * block].iter().copied())
        .collect()
}

/// A random count matrix, the same on every PE: `c[p][q]` elements go from PE `p` to PE `q`,
/// up to `max` (zeros included).
pub(crate) fn count_matrix(seed: u64, np: usize, max: usize) -> Vec<Vec<usize>> {
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
pub(crate) fn all_to_all_v_want<T: Reducible>(
    all: &[Vec<T>],
    c: &[Vec<usize>],
    me: usize,
) -> Vec<T> {
    (0..c.len())
        .flat_map(|p| {
            let from: usize = c[p][..me].iter().sum();
            all[p][from..from + c[p][me]].iter().copied()
        })
        .collect()
}
