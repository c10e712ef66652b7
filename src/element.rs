//! The element types NVSHMEM moves and reduces, and the typed host entry points for each.
//!
//! NVSHMEM has one C function per type and operation (`nvshmem_float_p`,
//! `nvshmemx_int32_sum_reduce_on_stream`...). The crate-private traits in `ffi` map a
//! Rust type to its functions once, so the safe API can be generic while only this crate
//! can call them.

use crate::abi;
use crate::error::{Error, Result};
use nvshmem_sys as sys;
use sys::cudaStream_t;

/// An element type, as our kernels take it (the `TypeTag` codes of `kernels/abi.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DataType {
    /// `i8`
    I8 = abi::TYPE_I8,
    /// `i16`
    I16 = abi::TYPE_I16,
    /// `i32`
    I32 = abi::TYPE_I32,
    /// `i64`
    I64 = abi::TYPE_I64,
    /// `u8`
    U8 = abi::TYPE_U8,
    /// `u16`
    U16 = abi::TYPE_U16,
    /// `u32`
    U32 = abi::TYPE_U32,
    /// `u64`
    U64 = abi::TYPE_U64,
    /// `f32`
    F32 = abi::TYPE_F32,
    /// `f64`
    F64 = abi::TYPE_F64,
    /// [`half::f16`]
    F16 = abi::TYPE_F16,
    /// [`half::bf16`]
    BF16 = abi::TYPE_BF16,
}

impl DataType {
    /// Whether the type is `f32`, `f16` or `bf16` (or `f64`).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
        )
    }
}

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `a + b`
    Sum,
    /// `a * b`
    Prod,
    /// The smaller.
    Min,
    /// The larger.
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

/// The typed NVSHMEM entry points of each element type: crate-private supertraits of the
/// public element traits, so that the safe API can call them and nothing outside can.
pub(crate) mod ffi {
    use super::{ReduceOp, Result};
    use nvshmem_sys::cudaStream_t;

    /// The two exchanges of NVSHMEM's team collectives that move data without reducing it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Exchange {
        /// `nvshmemx_<type>_fcollect_on_stream`
        Fcollect,
        /// `nvshmemx_<type>_alltoall_on_stream`
        Alltoall,
    }

    /// The two reductions of NVSHMEM's team collectives.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Reduction {
        /// `nvshmemx_<type>_<op>_reduce_on_stream`
        AllReduce,
        /// `nvshmemx_<type>_<op>_reducescatter_on_stream`
        ReduceScatter,
    }

    impl Reduction {
        /// The name of the NVSHMEM call for `op`, with `TYPENAME` for the element type.
        pub fn call(self, op: ReduceOp) -> &'static str {
            macro_rules! names {
                ($kind:literal) => {
                    match op {
                        ReduceOp::Sum => concat!("nvshmemx_TYPENAME_sum_", $kind, "_on_stream"),
                        ReduceOp::Prod => concat!("nvshmemx_TYPENAME_prod_", $kind, "_on_stream"),
                        ReduceOp::Min => concat!("nvshmemx_TYPENAME_min_", $kind, "_on_stream"),
                        ReduceOp::Max => concat!("nvshmemx_TYPENAME_max_", $kind, "_on_stream"),
                        ReduceOp::And => concat!("nvshmemx_TYPENAME_and_", $kind, "_on_stream"),
                        ReduceOp::Or => concat!("nvshmemx_TYPENAME_or_", $kind, "_on_stream"),
                        ReduceOp::Xor => concat!("nvshmemx_TYPENAME_xor_", $kind, "_on_stream"),
                    }
                };
            }
            match self {
                Reduction::AllReduce => names!("reduce"),
                Reduction::ReduceScatter => names!("reducescatter"),
            }
        }
    }

    /// Typed RMA and collectives of one element type.
    pub trait ElementFfi: Sized {
        unsafe fn p(dst: *mut Self, value: Self, pe: i32);
        unsafe fn g(src: *const Self, pe: i32) -> Self;
        unsafe fn p_on_stream(dst: *mut Self, value: Self, pe: i32, stream: cudaStream_t);
        unsafe fn g_on_stream(src: *const Self, pe: i32, stream: cudaStream_t) -> Self;
        /// `nvshmemx_<type>_<op>_<kind>_on_stream`: an all-reduce or a reduce-scatter.
        unsafe fn reduction_on_stream(
            kind: Reduction,
            op: ReduceOp,
            team: i32,
            dst: *mut Self,
            src: *const Self,
            n: usize,
            stream: cudaStream_t,
        ) -> Result<i32>;
        /// `nvshmemx_<type>_<kind>_on_stream`: an fcollect or an all-to-all.
        unsafe fn exchange_on_stream(
            kind: Exchange,
            team: i32,
            dst: *mut Self,
            src: *const Self,
            n: usize,
            stream: cudaStream_t,
        ) -> i32;
        unsafe fn broadcast_on_stream(
            team: i32,
            dst: *mut Self,
            src: *const Self,
            n: usize,
            root: i32,
            stream: cudaStream_t,
        ) -> i32;
    }

    /// The atomics' operands as the bits of an unsigned integer of the type's width (the
    /// helper kernel takes them so, see [`crate::atomic`]).
    pub trait AtomicBits: Sized {
        /// The value's bits, zero-extended to 64.
        fn to_amo_bits(self) -> u64;
        /// The value whose bits are the low bytes of `bits` (the rest is ignored).
        fn from_amo_bits(bits: u64) -> Self;
    }

    /// The typed on-stream wait of one integer type.
    pub trait WaitFfi: Sized {
        unsafe fn wait_until_on_stream(
            ivar: *mut Self,
            cmp: i32,
            value: Self,
            stream: cudaStream_t,
        );
    }
}

pub(crate) use ffi::{Exchange, Reduction};

/// A plain value type that lives in the symmetric heap: `u8`..`u64`, `i8`..`i64`, `f32`,
/// `f64`, [`half::f16`] and [`half::bf16`].
///
/// # Safety
/// Implemented only in this crate (its supertrait is crate-private), for types whose every
/// bit pattern is valid.
#[allow(private_bounds)]
pub unsafe trait Element:
    ffi::ElementFfi + Copy + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static
{
    /// NVSHMEM's name for the type (`float`, `bfloat16`, `int32`...).
    const NVSHMEM_NAME: &'static str;
    /// Tag for our kernels.
    const DTYPE: DataType;
    /// Whether bitwise reductions apply.
    const IS_INTEGER: bool;
}

/// Types with host-side remote atomics: fetch, set and swap (`i32`, `i64`, `u32`, `u64`,
/// `f32`, `f64`).
#[allow(private_bounds)]
pub trait AtomicElement: Element + ffi::AtomicBits {}

/// Integer types with the full set of remote atomics (`i32`, `i64`, `u32`, `u64`).
#[allow(private_bounds)]
pub trait AtomicInteger: AtomicElement + ffi::WaitFfi + PartialOrd {}

/// A bitwise operator on a type that is not an integer.
pub(crate) fn bitwise_on_float<T: Element>(op: ReduceOp) -> Error {
    Error::TypeMismatch {
        what: format!("the {op:?} reduction"),
        expected: "an integer type",
        got: T::NVSHMEM_NAME.to_string(),
    }
}

// `$ffi` is the C type; `half::f16`/`bf16` and the C `__half`/`__nv_bfloat16` are both one
// u16, so pointers cast and values convert through the bits.
macro_rules! element {
    ($t:ty, $ffi:ty, $name:ident, $dtype:ident, $int:tt, to = $to:expr, from = $from:expr) => {
        unsafe impl Element for $t {
            const NVSHMEM_NAME: &'static str = stringify!($name);
            const DTYPE: DataType = DataType::$dtype;
            const IS_INTEGER: bool = $int;
        }
        impl ffi::ElementFfi for $t {
            unsafe fn p(dst: *mut Self, value: Self, pe: i32) {
                paste::paste! { sys::[<nvshmem_ $name _p>](dst as *mut $ffi, ($to)(value), pe) }
            }
            unsafe fn g(src: *const Self, pe: i32) -> Self {
                paste::paste! { ($from)(sys::[<nvshmem_ $name _g>](src as *const $ffi, pe)) }
            }
            unsafe fn p_on_stream(dst: *mut Self, value: Self, pe: i32, stream: cudaStream_t) {
                paste::paste! { sys::[<nvshmemx_ $name _p_on_stream>](dst as *mut $ffi, ($to)(value), pe, stream) }
            }
            unsafe fn g_on_stream(src: *const Self, pe: i32, stream: cudaStream_t) -> Self {
                paste::paste! { ($from)(sys::[<nvshmemx_ $name _g_on_stream>](src as *const $ffi, pe, stream)) }
            }
            unsafe fn reduction_on_stream(kind: Reduction, op: ReduceOp, team: i32, dst: *mut Self, src: *const Self, n: usize, stream: cudaStream_t) -> Result<i32> {
                match kind {
                    Reduction::AllReduce => element!(@reduction $int, $name, reduce, $ffi, op, team, dst, src, n, stream),
                    Reduction::ReduceScatter => element!(@reduction $int, $name, reducescatter, $ffi, op, team, dst, src, n, stream),
                }
            }
            unsafe fn exchange_on_stream(kind: Exchange, team: i32, dst: *mut Self, src: *const Self, n: usize, stream: cudaStream_t) -> i32 {
                let (d, s) = (dst as *mut $ffi, src as *const $ffi);
                paste::paste! {
                    match kind {
                        Exchange::Fcollect => sys::[<nvshmemx_ $name _fcollect_on_stream>](team, d, s, n, stream),
                        Exchange::Alltoall => sys::[<nvshmemx_ $name _alltoall_on_stream>](team, d, s, n, stream),
                    }
                }
            }
            unsafe fn broadcast_on_stream(team: i32, dst: *mut Self, src: *const Self, n: usize, root: i32, stream: cudaStream_t) -> i32 {
                paste::paste! { sys::[<nvshmemx_ $name _broadcast_on_stream>](team, dst as *mut $ffi, src as *const $ffi, n, root, stream) }
            }
        }
    };
    // `nvshmemx_<type>_<op>_<kind>_on_stream` for `op`: kind is reduce or reducescatter.
    (@reduction $int:tt, $name:ident, $kind:ident, $ffi:ty, $op:expr, $team:expr, $dst:expr, $src:expr, $n:expr, $stream:expr) => {{
        let (d, s) = ($dst as *mut $ffi, $src as *const $ffi);
        paste::paste! {
            Ok(match $op {
                ReduceOp::Sum => sys::[<nvshmemx_ $name _sum_ $kind _on_stream>]($team, d, s, $n, $stream),
                ReduceOp::Prod => sys::[<nvshmemx_ $name _prod_ $kind _on_stream>]($team, d, s, $n, $stream),
                ReduceOp::Min => sys::[<nvshmemx_ $name _min_ $kind _on_stream>]($team, d, s, $n, $stream),
                ReduceOp::Max => sys::[<nvshmemx_ $name _max_ $kind _on_stream>]($team, d, s, $n, $stream),
                _ => element!(@bitwise $int, $name, $kind, $op, $team, d, s, $n, $stream),
            })
        }
    }};
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
        return Err(bitwise_on_float::<Self>($op))
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
        impl AtomicElement for $t {}
        impl ffi::AtomicBits for $t {
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
        impl AtomicInteger for $t {}
        impl ffi::WaitFfi for $t {
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
    use super::ffi::{AtomicBits, ElementFfi};
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
                <f32 as ElementFfi>::reduction_on_stream(
                    Reduction::AllReduce,
                    op,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    1,
                    std::ptr::null_mut(),
                )
            };
            assert!(
                matches!(r, Err(Error::TypeMismatch { .. })),
                "{op:?} accepted for f32"
            );
            let r = unsafe {
                <half::bf16 as ElementFfi>::reduction_on_stream(
                    Reduction::ReduceScatter,
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
    fn failed_calls_name_the_operation() {
        for op in ReduceOp::ALL {
            let name = format!("{op:?}").to_lowercase();
            assert!(Reduction::AllReduce
                .call(op)
                .contains(&format!("_{name}_reduce_")));
            assert!(Reduction::ReduceScatter
                .call(op)
                .contains(&format!("_{name}_reducescatter_")));
        }
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
