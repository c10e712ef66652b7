//! Random data and CPU references: every PE can rebuild every other PE's input of a check.

use nvshmem_checks::splitmix;

use nvshmem::{bf16, f16, AtomicInteger, Element, ReduceOp};
use splitmix::{SplitMix64, GOLDEN};

/// The random values of one check on one PE (splitmix64, seeded by the check and the PE).
pub(crate) struct Rng(SplitMix64);

impl Rng {
    pub(crate) fn new(seed: u64, pe: usize) -> Self {
        let state = seed ^ (pe as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
        Rng(SplitMix64(state.wrapping_add(GOLDEN)))
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo) as u64 + 1)) as i64
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// FNV-1a of a check's name: its seed.
pub(crate) fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    })
}

/// What the random values are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Sums, minima and maxima: small enough that no sum over PEs overflows.
    Arith,
    /// Products: values whose product over PEs stays in range.
    Prod,
    /// Any bit pattern (floats: as `Arith`).
    Bits,
}

impl Kind {
    pub(crate) fn for_op(op: ReduceOp) -> Kind {
        match op {
            ReduceOp::Prod => Kind::Prod,
            op if op.is_bitwise() => Kind::Bits,
            _ => Kind::Arith,
        }
    }
}

/// The element types under test, with what the reference needs.
pub(crate) trait Num: Element {
    /// Relative rounding error of one operation; 0 for integers, which compare exactly.
    const EPS: f64;
    fn gen(rng: &mut Rng, kind: Kind) -> Self;
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
    /// The reduction of `vals` as NVSHMEM computes it (integers wrap; floats exactly, rounded
    /// once).
    fn reference(op: ReduceOp, vals: &[Self]) -> Self;
}

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const EPS: f64 = 0.0;
            fn gen(rng: &mut Rng, kind: Kind) -> Self {
                let signed = <$t>::MIN != 0;
                let bits = <$t>::BITS;
                match kind {
                    Kind::Bits => rng.next() as $t,
                    Kind::Arith => {
                        let span = 1i64 << (bits - 5).min(40);
                        if signed { rng.int(-span, span) as $t } else { rng.int(0, span) as $t }
                    }
                    Kind::Prod => {
                        let magnitude = if bits == 8 && signed { 1 } else { rng.int(1, 2) };
                        if signed && rng.next() & 1 == 1 { (-magnitude) as $t } else { magnitude as $t }
                    }
                }
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn reference(op: ReduceOp, vals: &[Self]) -> Self {
                vals.iter()
                    .copied()
                    .reduce(|a, b| match op {
                        ReduceOp::Sum => a.wrapping_add(b),
                        ReduceOp::Prod => a.wrapping_mul(b),
                        ReduceOp::Min => a.min(b),
                        ReduceOp::Max => a.max(b),
                        ReduceOp::And => a & b,
                        ReduceOp::Or => a | b,
                        ReduceOp::Xor => a ^ b,
                    })
                    .unwrap_or_default()
            }
        }
    )*};
}

int_num!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_num {
    ($t:ty, $eps:expr, to = $to:expr, from = $from:expr) => {
        impl Num for $t {
            const EPS: f64 = $eps;
            fn gen(rng: &mut Rng, kind: Kind) -> Self {
                let x = match kind {
                    Kind::Prod => {
                        let m = 0.5 + 1.5 * rng.unit();
                        if rng.next() & 1 == 1 {
                            -m
                        } else {
                            m
                        }
                    }
                    _ => 2.0 * rng.unit() - 1.0,
                };
                Self::from_f64(x)
            }
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(x: f64) -> Self {
                ($from)(x)
            }
            fn reference(op: ReduceOp, vals: &[Self]) -> Self {
                let xs = vals.iter().map(|v| v.to_f64());
                Self::from_f64(match op {
                    ReduceOp::Sum => xs.sum(),
                    ReduceOp::Prod => xs.product(),
                    ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
                    ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                    _ => f64::NAN,
                })
            }
        }
    };
}

float_num!(
    f32,
    f32::EPSILON as f64,
    to = |v: f32| v as f64,
    from = |x: f64| x as f32
);
float_num!(f64, f64::EPSILON, to = |v: f64| v, from = |x: f64| x);
float_num!(
    f16,
    1.0 / 1024.0,
    to = |v: f16| v.to_f64(),
    from = f16::from_f64
);
float_num!(
    bf16,
    1.0 / 128.0,
    to = |v: bf16| v.to_f64(),
    from = bf16::from_f64
);

/// Whether `got` is `want` up to the rounding a reduction of `vals` may do in any order.
pub(crate) fn agrees<T: Num>(op: ReduceOp, got: T, want: T, vals: &[T]) -> bool {
    if T::EPS == 0.0 || matches!(op, ReduceOp::Min | ReduceOp::Max) {
        return got == want;
    }
    let n = vals.len() as f64;
    let tol = match op {
        ReduceOp::Sum => 2.0 * T::EPS * n * vals.iter().map(|v| v.to_f64().abs()).sum::<f64>(),
        _ => 2.0 * T::EPS * n * want.to_f64().abs(),
    };
    (got.to_f64() - want.to_f64()).abs() <= tol
}

/// PE `pe`'s input of a check.
pub(crate) fn data<T: Num>(seed: u64, pe: usize, len: usize, kind: Kind) -> Vec<T> {
    let mut rng = Rng::new(seed, pe);
    (0..len).map(|_| T::gen(&mut rng, kind)).collect()
}

/// The all-ones value of an atomic integer type.
pub(crate) trait Ones: Num + AtomicInteger {
    fn ones() -> Self;
}

macro_rules! ones {
    ($($t:ty),*) => {$(impl Ones for $t { fn ones() -> Self { !0 } })*};
}

ones!(i32, i64, u32, u64);

/// `x` as a (small) value of `T`.
pub(crate) fn small<T: Num>(x: usize) -> T {
    T::from_f64(x as f64)
}

pub(crate) fn as_u64<T: Num>(x: T) -> u64 {
    x.to_f64() as u64
}
