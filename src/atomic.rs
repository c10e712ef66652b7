//! Remote atomic operations from the host on one element of a symmetric buffer.
//!
//! Fetch, set and swap work on every [`AtomicElement`] type (`i32`, `i64`, `u32`, `u64`,
//! `f32`, `f64`); compare-and-swap, add, increment and the bitwise fetch operations on the
//! [`AtomicInteger`] types (`i32`, `i64`, `u32`, `u64`). Each call names the element by buffer
//! (or view) and index, and the PE whose copy it updates; the operations that return a value
//! return the element's value just before the update. Atomics on the same element from
//! different PEs are atomic with respect to each other.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! let shmem = nvshmem::Nvshmem::init()?;
//! let ticket = shmem.calloc::<u64>(1)?;
//! // Every PE takes a distinct ticket from the counter on PE 0.
//! let mine = shmem.atomic_fetch_inc(&ticket, 0, 0)?;
//! assert!(mine < shmem.n_pes() as u64);
//! shmem.barrier_all()?;
//! assert_eq!(shmem.atomic_fetch(&ticket, 0, 0)?, shmem.n_pes() as u64);
//! # Ok(()) }
//! ```
//!
//! # How they run
//!
//! NVSHMEM 3.4's host-initiated atomics (`nvshmem_int32_atomic_fetch_add` called from the CPU,
//! and the rest of that family) do not act on PEs reached over P2P (NVLink or PCIe peer
//! access): the target is left unchanged and the fetching ones return 0. A safe API must not
//! return wrong values silently, so these methods do not call them. Each call instead launches
//! `host_amo` of `kernels/atomics.cu` (one thread) on a stream of this runtime's own, where
//! NVSHMEM's device-side atomic does the operation over whichever transport reaches the PE,
//! then copies the fetched value back and waits for it. The kernel is a runtime service: it
//! is loaded on the first call and unloaded before NVSHMEM is finalised. The kernel also writes back a token
//! that changes with every call, so a launch that did not run (or did not recognise the
//! operation) is reported as an error instead of returning a stale value.
//!
//! So each call costs a kernel launch and a stream synchronisation (some microseconds), and
//! calls on one runtime are serialised.

use crate::abi;
use crate::cubins::ATOMICS;
use crate::element::{AtomicElement, AtomicInteger, DataType};
use crate::error::{CudaResultExt, Error, Result};
use crate::memory::SymmetricView;
use crate::module::{grid, Function, KernelArgs, Module};
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, sys as cusys, CudaStream};
use std::sync::Arc;

/// The operations of `host_amo` (the `AmoOp` codes of `kernels/abi.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub(crate) enum AmoOp {
    Fetch = abi::AMO_FETCH,
    Set = abi::AMO_SET,
    Swap = abi::AMO_SWAP,
    CompareSwap = abi::AMO_COMPARE_SWAP,
    FetchAdd = abi::AMO_FETCH_ADD,
    Add = abi::AMO_ADD,
    FetchInc = abi::AMO_FETCH_INC,
    Inc = abi::AMO_INC,
    FetchAnd = abi::AMO_FETCH_AND,
    FetchOr = abi::AMO_FETCH_OR,
    FetchXor = abi::AMO_FETCH_XOR,
}

impl AmoOp {
    /// Every operation, in code order.
    #[cfg(test)]
    const ALL: [AmoOp; 11] = [
        AmoOp::Fetch,
        AmoOp::Set,
        AmoOp::Swap,
        AmoOp::CompareSwap,
        AmoOp::FetchAdd,
        AmoOp::Add,
        AmoOp::FetchInc,
        AmoOp::Inc,
        AmoOp::FetchAnd,
        AmoOp::FetchOr,
        AmoOp::FetchXor,
    ];

    /// The code the kernel takes.
    fn code(self) -> i32 {
        self as i32
    }

    /// Whether the operation is defined on elements of type `t`: fetch, set and swap on every
    /// atomic type, the rest on integers only.
    fn applies_to(self, t: DataType) -> bool {
        amo_type_code(t).is_some()
            && (matches!(self, AmoOp::Fetch | AmoOp::Set | AmoOp::Swap)
                || !matches!(t, DataType::F32 | DataType::F64))
    }
}

/// The type code `host_amo` takes (the [`DataType`] tag), for the types it handles.
fn amo_type_code(t: DataType) -> Option<i32> {
    match t {
        DataType::I32
        | DataType::I64
        | DataType::U32
        | DataType::U64
        | DataType::F32
        | DataType::F64 => Some(t as u32 as i32),
        _ => None,
    }
}

/// One atomic operation as a method: its documentation, whether it returns the old value
/// (`fetch`) or nothing (`update`), the element trait it needs, whether it takes a `value`,
/// and its `AmoOp`.
macro_rules! atomic {
    (@returns fetch) => { T };
    (@returns update) => { () };
    (@keep fetch, $old:expr) => { $old };
    (@keep update, $old:expr) => { { let _: T = $old; } };
    ($(#[$doc:meta])* $kind:ident $name:ident<$bound:ident> $(($value:ident))? => $op:ident) => {
        $(#[$doc])*
        pub fn $name<'a, T: $bound>(
            &self,
            buf: impl Into<SymmetricView<'a, T>>,
            index: usize,
            $($value: T,)?
            pe: usize,
        ) -> Result<atomic!(@returns $kind)> {
            let bits = 0 $(| $value.to_amo_bits())?;
            let old = self.amo(AmoOp::$op, buf.into(), index, bits, 0, pe)?;
            Ok(atomic!(@keep $kind, old))
        }
    };
}

/// Make the runtime's atomics service now (at start: see `Nvshmem::load_services`).
pub(crate) fn load_service(shmem: &Nvshmem) -> Result<()> {
    shmem.with_service(HostAmo::load, |_| Ok(()))
}

/// The atomics kernel of one runtime (a runtime service), with its stream and a device
/// buffer for its result (`[fetched bits, token]`).
pub(crate) struct HostAmo {
    kernel: Function,
    result: cusys::CUdeviceptr,
    stream: Arc<CudaStream>,
    /// The token of the last launch; never 0, which the kernel writes on failure.
    token: u64,
}

// SAFETY: the result pointer is device memory this value owns; the runtime keeps the
// service behind a lock and every use makes the context current.
unsafe impl Send for HostAmo {}

const RESULT_BYTES: usize = 2 * std::mem::size_of::<u64>();

impl HostAmo {
    /// Load `kernels/atomics.cu` for this PE's GPU (without holding the runtime, whose
    /// service this is) and allocate the result buffer.
    fn load(shmem: &Nvshmem) -> Result<Self> {
        let kernel = Module::load_for_service(shmem, &ATOMICS)?.function("host_amo")?;
        let stream = shmem.new_stream()?;
        shmem.bind_context()?;
        // SAFETY: a plain device allocation, freed on drop.
        let result = unsafe { cu::malloc_sync(RESULT_BYTES) }.during("cuMemAlloc")?;
        Ok(HostAmo {
            kernel,
            result,
            stream,
            token: 0,
        })
    }

    /// Launch `host_amo` for one operation and wait for its result: the fetched bits.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        shmem: &Nvshmem,
        op: AmoOp,
        ty: i32,
        dest: u64,
        value: u64,
        cond: u64,
        pe: i32,
    ) -> Result<u64> {
        self.token = self.token.wrapping_add(1).max(1);
        // host_amo(int op, int type, void *dest, uint64_t value_bits, uint64_t cond_bits,
        // int pe, uint64_t token, uint64_t *result)
        let mut args = KernelArgs::new();
        args.value(op.code())
            .value(ty)
            .device_ptr(dest)
            .value(value)
            .value(cond)
            .value(pe)
            .value(self.token)
            .device_ptr(self.result);
        // SAFETY: the arguments match host_amo's parameters; `dest` is an element of a
        // symmetric buffer (checked by the caller) and `result` holds two u64.
        unsafe { self.kernel.launch(grid(1, 1), &self.stream, &mut args)? };
        shmem.bind_context()?;
        let s = self.stream.cu_stream();
        let mut pinned = shmem.rt.pinned.take(2)?;
        // SAFETY: `result` holds two u64; the buffer outlives the copy, which the
        // synchronisation below waits for.
        unsafe { pinned.read_from(self.result, 16, s) }?;
        self.stream.synchronize().during("cuStreamSynchronize")?;
        let out = [pinned.as_mut_slice()[0], pinned.as_mut_slice()[1]];
        if out[1] != self.token {
            return Err(Error::Module {
                module: ATOMICS.name().to_string(),
                message: format!(
                    "host_amo did not complete {op:?} (type code {ty}) on PE {pe}: it reported \
                     token {}, expected {}",
                    out[1], self.token
                ),
                source: None,
            });
        }
        Ok(out[0])
    }
}

impl Drop for HostAmo {
    fn drop(&mut self) {
        // The runtime made its context current. Nothing of ours may still run on the GPU.
        let _ = self.stream.synchronize();
        // A stranded runtime's GPU never becomes idle, and cuMemFree waits for it: leak.
        if self.result != 0 && crate::runtime::check_not_stranded().is_ok() {
            // SAFETY: no launch uses the buffer any more.
            unsafe {
                let _ = cu::free_sync(self.result);
            }
        }
    }
}

impl Nvshmem {
    /// Run `op` on element `index` of `view` on PE `pe` in the atomics kernel and return the
    /// fetched value (the type's zero value for operations that fetch nothing).
    fn amo<T: AtomicElement>(
        &self,
        op: AmoOp,
        view: SymmetricView<'_, T>,
        index: usize,
        value: u64,
        cond: u64,
        pe: usize,
    ) -> Result<T> {
        self.check_same_runtime(view.runtime(), "the atomic's buffer")?;
        let pe = self.check_pe(pe)?;
        let dest = view.element_ptr(self, "the atomic's buffer", index)?;
        let type_mismatch = |expected| Error::TypeMismatch {
            what: format!("the atomic {op:?}"),
            expected,
            got: T::NVSHMEM_NAME.to_string(),
        };
        let ty = amo_type_code(T::DTYPE)
            .ok_or_else(|| type_mismatch("i32, i64, u32, u64, f32 or f64"))?;
        if !op.applies_to(T::DTYPE) {
            return Err(type_mismatch("i32, i64, u32 or u64"));
        }
        let bits = self.with_service(HostAmo::load, |amo| {
            amo.run(self, op, ty, dest as u64, value, cond, pe)
        })?;
        Ok(T::from_amo_bits(bits))
    }

    atomic! {
        /// Atomically read `buf[index]` on PE `pe`.
        fetch atomic_fetch<AtomicElement> => Fetch
    }

    atomic! {
        /// Atomically write `value` to `buf[index]` on PE `pe`.
        update atomic_set<AtomicElement>(value) => Set
    }

    atomic! {
        /// Atomically replace `buf[index]` on PE `pe` with `value`; returns the old value.
        ///
        /// ```no_run
        /// # fn main() -> nvshmem::Result<()> {
        /// let shmem = nvshmem::Nvshmem::init()?;
        /// let x = shmem.calloc::<f64>(1)?;
        /// let old = shmem.atomic_swap(&x, 0, 2.5, 0)?;
        /// # let _ = old;
        /// # Ok(()) }
        /// ```
        fetch atomic_swap<AtomicElement>(value) => Swap
    }

    /// Atomically set `buf[index]` on PE `pe` to `value` if it equals `cond`; returns the old
    /// value (equal to `cond` when the swap happened).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let lock = shmem.calloc::<i64>(1)?;
    /// // Take a lock on PE 0 that holds 0 when free.
    /// let me = shmem.my_pe() as i64 + 1;
    /// while shmem.atomic_compare_swap(&lock, 0, 0, me, 0)? != 0 {}
    /// // ... and release it.
    /// shmem.atomic_set(&lock, 0, 0, 0)?;
    /// # Ok(()) }
    /// ```
    pub fn atomic_compare_swap<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        cond: T,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (value, cond) = (value.to_amo_bits(), cond.to_amo_bits());
        self.amo(AmoOp::CompareSwap, buf.into(), index, value, cond, pe)
    }

    atomic! {
        /// Atomically add `value` to `buf[index]` on PE `pe`; returns the old value.
        fetch atomic_fetch_add<AtomicInteger>(value) => FetchAdd
    }

    atomic! {
        /// Atomically add `value` to `buf[index]` on PE `pe`.
        update atomic_add<AtomicInteger>(value) => Add
    }

    atomic! {
        /// Atomically add one to `buf[index]` on PE `pe`; returns the old value.
        fetch atomic_fetch_inc<AtomicInteger> => FetchInc
    }

    atomic! {
        /// Atomically add one to `buf[index]` on PE `pe`.
        update atomic_inc<AtomicInteger> => Inc
    }

    atomic! {
        /// Atomically `buf[index] &= value` on PE `pe`; returns the old value.
        ///
        /// ```no_run
        /// # fn main() -> nvshmem::Result<()> {
        /// let shmem = nvshmem::Nvshmem::init()?;
        /// let mask = shmem.malloc::<u32>(1)?;
        /// mask.copy_from_host(&[u32::MAX])?;
        /// shmem.barrier_all()?;
        /// // Clear our bit on PE 0.
        /// shmem.atomic_fetch_and(&mask, 0, !(1u32 << shmem.my_pe()), 0)?;
        /// # Ok(()) }
        /// ```
        fetch atomic_fetch_and<AtomicInteger>(value) => FetchAnd
    }

    atomic! {
        /// Atomically `buf[index] |= value` on PE `pe`; returns the old value.
        fetch atomic_fetch_or<AtomicInteger>(value) => FetchOr
    }

    atomic! {
        /// Atomically `buf[index] ^= value` on PE `pe`; returns the old value.
        fetch atomic_fetch_xor<AtomicInteger>(value) => FetchXor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_codes_are_distinct_and_come_from_the_shared_header() {
        let header = include_str!("../kernels/abi.h");
        let kernel = include_str!("../kernels/atomics.cu");
        assert!(kernel.contains("#include \"abi.h\""));
        let mut codes: Vec<i32> = AmoOp::ALL.iter().map(|op| op.code()).collect();
        codes.dedup();
        assert_eq!(codes, (0..11).collect::<Vec<_>>());
        for (op, code) in [
            (AmoOp::Fetch, 0),
            (AmoOp::CompareSwap, 3),
            (AmoOp::FetchXor, 10),
        ] {
            assert_eq!(op.code(), code);
        }
        assert!(header.contains("AMO_FETCH_XOR = 10,"));
    }

    #[test]
    fn type_codes_are_the_data_type_tags_the_kernel_knows() {
        for (t, code) in [
            (DataType::I32, 2),
            (DataType::I64, 3),
            (DataType::U32, 6),
            (DataType::U64, 7),
            (DataType::F32, 8),
            (DataType::F64, 9),
        ] {
            assert_eq!(amo_type_code(t), Some(code), "{t:?}");
        }
        for t in [
            DataType::I8,
            DataType::I16,
            DataType::U8,
            DataType::U16,
            DataType::F16,
            DataType::BF16,
        ] {
            assert_eq!(amo_type_code(t), None, "{t:?}");
        }
    }

    #[test]
    fn floats_have_fetch_set_and_swap_only() {
        for op in AmoOp::ALL {
            for t in [DataType::I32, DataType::I64, DataType::U32, DataType::U64] {
                assert!(op.applies_to(t), "{op:?} on {t:?}");
            }
            let float_op = matches!(op, AmoOp::Fetch | AmoOp::Set | AmoOp::Swap);
            assert_eq!(op.applies_to(DataType::F32), float_op, "{op:?}");
            assert_eq!(op.applies_to(DataType::F64), float_op, "{op:?}");
            assert!(!op.applies_to(DataType::BF16) && !op.applies_to(DataType::U8));
        }
    }

    #[test]
    fn the_element_types_map_to_their_codes() {
        fn code<T: AtomicElement>() -> Option<i32> {
            amo_type_code(T::DTYPE)
        }
        assert_eq!(code::<i32>(), Some(2));
        assert_eq!(code::<i64>(), Some(3));
        assert_eq!(code::<u32>(), Some(6));
        assert_eq!(code::<u64>(), Some(7));
        assert_eq!(code::<f32>(), Some(8));
        assert_eq!(code::<f64>(), Some(9));
    }
}
