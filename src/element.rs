//! The element types NVSHMEM moves and reduces, and the typed host entry points for each.
//!
//! NVSHMEM has one C function per type and operation (`nvshmem_float_p`,
//! `nvshmemx_int32_sum_reduce_on_stream`...). The traits here map a Rust type to its
//! functions once, so the safe API can be generic.

use crate::error::{Error, Result};
use nvshmem_sys as sys;
use sys::cudaStream_t;

/// The type tag passed to our kernels (must match `kernels/common.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DataType {
    I8 = 0,
    I16 = 1,
    I32 = 2,
    I64 = 3,
    U8 = 4,
    U16 = 5,
    U32 = 6,
    U64 = 7,
    F32 = 8,
    F64 = 9,
    F16 = 10,
    BF16 = 11,
}

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    /// Bitwise, integers only.
    And,
    /// Bitwise, integers only.
    Or,
    /// Bitwise, integers only.
    Xor,
}

impl ReduceOp {
    /// All operators, arithmetic first.
    pub const ALL: [ReduceOp; 7] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::And,
        ReduceOp::Or,
        ReduceOp::Xor,
    ];

    /// Whether the operator is bitwise (defined for integer types only).
    pub fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::And | ReduceOp::Or | ReduceOp::Xor)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A plain value type that lives in the symmetric heap: `u8`..`u64`, `i8`..`i64`, `f32`,
/// `f64`, [`half::f16`] and [`half::bf16`].
///
/// # Safety
/// Implemented only in this crate, for types whose every bit pattern is valid.
pub unsafe trait Element:
    sealed::Sealed + Copy + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static
{
    /// NVSHMEM's name for the type (`float`, `bfloat16`, `int32`...).
    const NVSHMEM_NAME: &'static str;
    /// Tag for our kernels.
    const DTYPE: DataType;
    /// Whether bitwise reductions apply.
    const IS_INTEGER: bool;

    #[doc(hidden)]
    unsafe fn p(dest: *mut Self, value: Self, pe: i32);
    #[doc(hidden)]
    unsafe fn g(src: *const Self, pe: i32) -> Self;
    #[doc(hidden)]
    unsafe fn p_on_stream(dest: *mut Self, value: Self, pe: i32, stream: cudaStream_t);
    #[doc(hidden)]
    unsafe fn g_on_stream(src: *const Self, pe: i32, stream: cudaStream_t) -> Self;
    #[doc(hidden)]
    unsafe fn reduce_on_stream(
        op: ReduceOp,
        team: i32,
        dest: *mut Self,
        src: *const Self,
        n: usize,
        stream: cudaStream_t,
    ) -> Result<i32>;
    #[doc(hidden)]
    unsafe fn reducescatter_on_stream(
        op: ReduceOp,
        team: i32,
        dest: *mut Self,
        src: *const Self,
        n: usize,
        stream: cudaStream_t,
    ) -> Result<i32>;
    #[doc(hidden)]
    unsafe fn fcollect_on_stream(
        team: i32,
        dest: *mut Self,
        src: *const Self,
        n: usize,
        stream: cudaStream_t,
    ) -> i32;
    #[doc(hidden)]
    unsafe fn broadcast_on_stream(
        team: i32,
        dest: *mut Self,
        src: *const Self,
        n: usize,
        root: i32,
        stream: cudaStream_t,
    ) -> i32;
    #[doc(hidden)]
    unsafe fn alltoall_on_stream(
        team: i32,
        dest: *mut Self,
        src: *const Self,
        n: usize,
        stream: cudaStream_t,
    ) -> i32;
}

/// Types with host-side remote atomics: fetch, set and swap (`i32`, `i64`, `u32`, `u64`,
/// `f32`, `f64`).
///
/// The atomics run in a kernel (see [`crate::atomic`]), which takes each operand as the bits
/// of an unsigned integer of the type's width; these convert to and from those bits.
pub trait AtomicElement: Element {
    /// The value's bits, zero-extended to 64.
    #[doc(hidden)]
    fn to_amo_bits(self) -> u64;
    /// The value whose bits are the low bytes of `bits` (the rest is ignored).
    #[doc(hidden)]
    fn from_amo_bits(bits: u64) -> Self;
}

/// Integer types with the full set of remote atomics (`i32`, `i64`, `u32`, `u64`).
pub trait AtomicInteger: AtomicElement {
    #[doc(hidden)]
    unsafe fn wait_until_on_stream(ivar: *mut Self, cmp: i32, value: Self, stream: cudaStream_t);
}

fn unsupported<T: Element>(op: ReduceOp) -> Error {
    Error::InvalidArgument(format!(
        "{op:?} is a bitwise reduction and {} is not an integer type",
        T::NVSHMEM_NAME
    ))
}

// `$ffi` is the C type; `half::f16`/`bf16` and the C `__half`/`__nv_bfloat16` are both one
// u16, so pointers cast and values convert through the bits.
macro_rules! element {
    ($t:ty, $ffi:ty, $name:ident, $dtype:ident, $int:tt, to = $to:expr, from = $from:expr) => {
        impl sealed::Sealed for $t {}
        unsafe impl Element for $t {
            const NVSHMEM_NAME: &'static str = stringify!($name);
            const DTYPE: DataType = DataType::$dtype;
            const IS_INTEGER: bool = $int;

            unsafe fn p(dest: *mut Self, value: Self, pe: i32) {
                paste::paste! { sys::[<nvshmem_ $name _p>](dest as *mut $ffi, ($to)(value), pe) }
            }
            unsafe fn g(src: *const Self, pe: i32) -> Self {
                paste::paste! { ($from)(sys::[<nvshmem_ $name _g>](src as *const $ffi, pe)) }
            }
            unsafe fn p_on_stream(dest: *mut Self, value: Self, pe: i32, stream: cudaStream_t) {
                paste::paste! { sys::[<nvshmemx_ $name _p_on_stream>](dest as *mut $ffi, ($to)(value), pe, stream) }
            }
            unsafe fn g_on_stream(src: *const Self, pe: i32, stream: cudaStream_t) -> Self {
                paste::paste! { ($from)(sys::[<nvshmemx_ $name _g_on_stream>](src as *const $ffi, pe, stream)) }
            }
            unsafe fn reduce_on_stream(op: ReduceOp, team: i32, dest: *mut Self, src: *const Self, n: usize, stream: cudaStream_t) -> Result<i32> {
                let (d, s) = (dest as *mut $ffi, src as *const $ffi);
                paste::paste! {
                    Ok(match op {
                        ReduceOp::Sum => sys::[<nvshmemx_ $name _sum_reduce_on_stream>](team, d, s, n, stream),
                        ReduceOp::Prod => sys::[<nvshmemx_ $name _prod_reduce_on_stream>](team, d, s, n, stream),
                        ReduceOp::Min => sys::[<nvshmemx_ $name _min_reduce_on_stream>](team, d, s, n, stream),
                        ReduceOp::Max => sys::[<nvshmemx_ $name _max_reduce_on_stream>](team, d, s, n, stream),
                        _ => element!(@bitwise $int, $name, reduce, op, team, d, s, n, stream),
                    })
                }
            }
            unsafe fn reducescatter_on_stream(op: ReduceOp, team: i32, dest: *mut Self, src: *const Self, n: usize, stream: cudaStream_t) -> Result<i32> {
                let (d, s) = (dest as *mut $ffi, src as *const $ffi);
                paste::paste! {
                    Ok(match op {
                        ReduceOp::Sum => sys::[<nvshmemx_ $name _sum_reducescatter_on_stream>](team, d, s, n, stream),
                        ReduceOp::Prod => sys::[<nvshmemx_ $name _prod_reducescatter_on_stream>](team, d, s, n, stream),
                        ReduceOp::Min => sys::[<nvshmemx_ $name _min_reducescatter_on_stream>](team, d, s, n, stream),
                        ReduceOp::Max => sys::[<nvshmemx_ $name _max_reducescatter_on_stream>](team, d, s, n, stream),
                        _ => element!(@bitwise $int, $name, reducescatter, op, team, d, s, n, stream),
                    })
                }
            }
            unsafe fn fcollect_on_stream(team: i32, dest: *mut Self, src: *const Self, n: usize, stream: cudaStream_t) -> i32 {
                paste::paste! { sys::[<nvshmemx_ $name _fcollect_on_stream>](team, dest as *mut $ffi, src as *const $ffi, n, stream) }
            }
            unsafe fn broadcast_on_stream(team: i32, dest: *mut Self, src: *const Self, n: usize, root: i32, stream: cudaStream_t) -> i32 {
                paste::paste! { sys::[<nvshmemx_ $name _broadcast_on_stream>](team, dest as *mut $ffi, src as *const $ffi, n, root, stream) }
            }
            unsafe fn alltoall_on_stream(team: i32, dest: *mut Self, src: *const Self, n: usize, stream: cudaStream_t) -> i32 {
                paste::paste! { sys::[<nvshmemx_ $name _alltoall_on_stream>](team, dest as *mut $ffi, src as *const $ffi, n, stream) }
            }
        }
    };
    (@bitwise true, $name:ident, $kind:ident, $op:expr, $team:expr, $d:expr, $s:expr, $n:expr, $stream:expr) => {
        paste::paste! {
            match $op {
                ReduceOp::And => sys::[<nvshmemx_ $name _and_ $kind _on_stream>]($team, $d, $s, $n, $stream),
                ReduceOp::Or => sys::[<nvshmemx_ $name _or_ $kind _on_stream>]($team, $d, $s, $n, $stream),
                _ => sys::[<nvshmemx_ $name _xor_ $kind _on_stream>]($team, $d, $s, $n, $stream),
            }
        }
    };
    (@bitwise false, $name:ident, $kind:ident, $op:expr, $team:expr, $d:expr, $s:expr, $n:expr, $stream:expr) => {
        return Err(unsupported::<Self>($op))
    };
}

macro_rules! plain {
    ($t:ty, $name:ident, $dtype:ident, $int:tt) => {
        element!(
            $t,
            $t,
            $name,
            $dtype,
            $int,
            to = |v: $t| v,
            from = |v: $t| v
        );
    };
}

plain!(i8, int8, I8, true);
plain!(i16, int16, I16, true);
plain!(i32, int32, I32, true);
plain!(i64, int64, I64, true);
plain!(u8, uint8, U8, true);
plain!(u16, uint16, U16, true);
plain!(u32, uint32, U32, true);
plain!(u64, uint64, U64, true);
plain!(f32, float, F32, false);
plain!(f64, double, F64, false);
element!(
    half::f16,
    sys::half,
    half,
    F16,
    false,
    to = |v: half::f16| sys::half { __x: v.to_bits() },
    from = |v: sys::half| half::f16::from_bits(v.__x)
);
element!(
    half::bf16,
    sys::__nv_bfloat16,
    bfloat16,
    BF16,
    false,
    to = |v: half::bf16| sys::__nv_bfloat16 { __x: v.to_bits() },
    from = |v: sys::__nv_bfloat16| half::bf16::from_bits(v.__x)
);

macro_rules! atomic {
    ($t:ty, to = $to:expr, from = $from:expr) => {
        impl AtomicElement for $t {
            fn to_amo_bits(self) -> u64 {
                ($to)(self)
            }
            fn from_amo_bits(bits: u64) -> Self {
                ($from)(bits)
            }
        }
    };
}

macro_rules! atomic_integer {
    ($t:ty, $name:ident, to = $to:expr, from = $from:expr) => {
        atomic!($t, to = $to, from = $from);
        impl AtomicInteger for $t {
            unsafe fn wait_until_on_stream(ivar: *mut Self, cmp: i32, value: Self, stream: cudaStream_t) {
                paste::paste! { sys::[<nvshmemx_ $name _wait_until_on_stream>](ivar, cmp, value, stream) }
            }
        }
    };
}

atomic_integer!(
    i32,
    int32,
    to = |v: i32| v as u32 as u64,
    from = |b: u64| b as u32 as i32
);
atomic_integer!(i64, int64, to = |v: i64| v as u64, from = |b: u64| b as i64);
atomic_integer!(
    u32,
    uint32,
    to = |v: u32| v as u64,
    from = |b: u64| b as u32
);
atomic_integer!(u64, uint64, to = |v: u64| v, from = |b: u64| b);
atomic!(
    f32,
    to = |v: f32| v.to_bits() as u64,
    from = |b: u64| f32::from_bits(b as u32)
);
atomic!(
    f64,
    to = |v: f64| v.to_bits(),
    from = |b: u64| f64::from_bits(b)
);

#[cfg(test)]
mod tests {
    use super::*;

    fn name<T: Element>() -> &'static str {
        T::NVSHMEM_NAME
    }

    #[test]
    fn every_plain_type_maps_to_its_nvshmem_name_and_tag() {
        assert_eq!(name::<f32>(), "float");
        assert_eq!(name::<half::bf16>(), "bfloat16");
        assert_eq!(name::<half::f16>(), "half");
        assert_eq!(name::<u64>(), "uint64");
        assert_eq!(<i16 as Element>::DTYPE as u32, 1);
        assert_eq!(<half::bf16 as Element>::DTYPE as u32, 11);
        fn is_integer<T: Element>() -> bool {
            T::IS_INTEGER
        }
        assert!(is_integer::<u8>() && is_integer::<i64>());
        assert!(!is_integer::<f64>() && !is_integer::<half::bf16>());
    }

    #[test]
    fn bitwise_reductions_on_floats_are_refused_before_any_call() {
        for op in [ReduceOp::And, ReduceOp::Or, ReduceOp::Xor] {
            // The bitwise arm returns before touching NVSHMEM, so null pointers are fine here.
            let r = unsafe {
                <f32 as Element>::reduce_on_stream(
                    op,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    1,
                    std::ptr::null_mut(),
                )
            };
            assert!(
                matches!(r, Err(Error::InvalidArgument(_))),
                "{op:?} accepted for f32"
            );
            let r = unsafe {
                <half::bf16 as Element>::reducescatter_on_stream(
                    op,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    1,
                    std::ptr::null_mut(),
                )
            };
            assert!(r.is_err());
        }
        assert!(ReduceOp::Xor.is_bitwise() && !ReduceOp::Max.is_bitwise());
    }

    #[test]
    fn half_types_share_the_c_layout() {
        assert_eq!(
            std::mem::size_of::<half::f16>(),
            std::mem::size_of::<sys::half>()
        );
        assert_eq!(
            std::mem::size_of::<half::bf16>(),
            std::mem::size_of::<sys::__nv_bfloat16>()
        );
    }

    #[test]
    fn atomic_operands_travel_as_zero_extended_bits() {
        assert_eq!((-1i32).to_amo_bits(), 0xFFFF_FFFF);
        assert_eq!(i32::from_amo_bits(0xFFFF_FFFF), -1);
        assert_eq!(i32::from_amo_bits(0xDEAD_BEEF_8000_0000), i32::MIN);
        assert_eq!((-2i64).to_amo_bits(), u64::MAX - 1);
        assert_eq!(i64::from_amo_bits(u64::MAX), -1);
        assert_eq!(u32::MAX.to_amo_bits(), 0xFFFF_FFFF);
        assert_eq!(u32::from_amo_bits(0x1_0000_0002), 2);
        assert_eq!(u64::from_amo_bits(u64::MAX.to_amo_bits()), u64::MAX);
        assert_eq!((-1.5f32).to_amo_bits(), (-1.5f32).to_bits() as u64);
        assert_eq!(f32::from_amo_bits(2.5f32.to_bits() as u64), 2.5);
        assert_eq!(f64::from_amo_bits((-0.25f64).to_amo_bits()), -0.25);
        assert!(f32::from_amo_bits(f32::NAN.to_amo_bits()).is_nan());
    }
}
