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
//! then copies the fetched value back and waits for it. The kernel also writes back a token
//! that changes with every call, so a launch that did not run (or did not recognise the
//! operation) is reported as an error instead of returning a stale value.
//!
//! So each call costs a kernel launch and a stream synchronisation (some microseconds), and
//! calls on one runtime are serialised. The kernel module is loaded on the first call.

use crate::buffer::SymmetricView;
use crate::element::{AtomicElement, AtomicInteger, DataType};
use crate::error::{CudaResultExt, Error, Result};
use crate::kernels::ATOMICS;
use crate::rma::check_index;
use crate::runtime::Nvshmem;
use cudarc::driver::{result as cu, sys as cusys, CudaStream};
use nvshmem_sys as sys;
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// The operations of `host_amo` in `kernels/atomics.cu` (its `AMO_*` codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub(crate) enum AmoOp {
    Fetch = 0,
    Set = 1,
    Swap = 2,
    CompareSwap = 3,
    FetchAdd = 4,
    Add = 5,
    FetchInc = 6,
    Inc = 7,
    FetchAnd = 8,
    FetchOr = 9,
    FetchXor = 10,
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

/// The atomics kernel of one runtime, loaded and registered with NVSHMEM, with its stream and
/// a device buffer for its result (`[fetched bits, token]`).
///
/// Kept in the runtime and dropped by it before NVSHMEM is finalised (it holds no handle on
/// the runtime, which would keep the runtime alive).
pub(crate) struct HostAmo {
    module: cusys::CUmodule,
    func: cusys::CUfunction,
    result: cusys::CUdeviceptr,
    stream: Arc<CudaStream>,
    /// The token of the last launch; never 0, which the kernel writes on failure.
    token: u64,
}

// SAFETY: the handles are driver objects usable from any thread with the context current;
// the runtime keeps this behind a mutex and makes the context current before each use.
unsafe impl Send for HostAmo {}

const RESULT_BYTES: usize = 2 * std::mem::size_of::<u64>();

impl HostAmo {
    /// Load the image of `kernels/atomics.cu` for this PE's GPU and register it.
    fn load(shmem: &Nvshmem) -> Result<Self> {
        let (major, minor) = shmem
            .context()
            .compute_capability()
            .during("cuDeviceGetAttribute")?;
        let image = ATOMICS.image_for(major, minor)?;
        let stream = shmem.new_stream()?;
        shmem.enter()?;
        // The loader reads the ELF image in place: give it 8-byte aligned storage.
        let mut words = vec![0u64; image.bytes.len().div_ceil(8) + 1];
        // SAFETY: `words` holds at least `image.bytes.len()` bytes and does not overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                image.bytes.as_ptr(),
                words.as_mut_ptr() as *mut u8,
                image.bytes.len(),
            )
        };
        // SAFETY: `words` is a complete, aligned image that outlives the call.
        let module = unsafe { cu::module::load_data(words.as_ptr() as *const c_void) }
            .map_err(|e| Error::Module(format!("cuModuleLoadData(atomics) failed: {e:?}")))?;
        // SAFETY: `module` was just loaded in the current context.
        let status = unsafe { sys::nvshmemx_cumodule_init(module as sys::CUmodule) };
        if status != 0 {
            // SAFETY: nothing else refers to the module.
            unsafe {
                let _ = cu::module::unload(module);
            }
            return Err(Error::Module(format!(
                "nvshmemx_cumodule_init(atomics) returned {status}: the kernels must be linked \
                 against the libnvshmem_device.a of the NVSHMEM release running ({}); \
                 NVSHMEM_DEBUG=WARN shows NVSHMEM's own explanation",
                shmem.version()
            )));
        }
        // From here on, dropping `amo` undoes what was done.
        let mut amo = HostAmo {
            module,
            func: std::ptr::null_mut(),
            result: 0,
            stream,
            token: 0,
        };
        let name = CString::new("host_amo").expect("no NUL");
        // SAFETY: the module is loaded and `name` is NUL-terminated.
        amo.func = unsafe { cu::module::get_function(module, name) }
            .map_err(|e| Error::Module(format!("no kernel host_amo in atomics: {e:?}")))?;
        // SAFETY: a plain device allocation, freed on drop.
        amo.result = unsafe { cu::malloc_sync(RESULT_BYTES) }.during("cuMemAlloc")?;
        Ok(amo)
    }

    /// Launch `host_amo` for one operation and wait for its result: the fetched bits.
    /// The context must be current.
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
        // The parameters of host_amo(int op, int type, void *dest, uint64_t value_bits,
        // uint64_t cond_bits, int pe, uint64_t token, uint64_t *result), in order.
        let mut op_code: i32 = op.code();
        let mut ty = ty;
        let mut dest = dest;
        let mut value = value;
        let mut cond = cond;
        let mut pe = pe;
        let mut token = self.token;
        let mut result = self.result;
        let mut params: [*mut c_void; 8] = [
            &mut op_code as *mut i32 as *mut c_void,
            &mut ty as *mut i32 as *mut c_void,
            &mut dest as *mut u64 as *mut c_void,
            &mut value as *mut u64 as *mut c_void,
            &mut cond as *mut u64 as *mut c_void,
            &mut pe as *mut i32 as *mut c_void,
            &mut token as *mut u64 as *mut c_void,
            &mut result as *mut u64 as *mut c_void,
        ];
        shmem.enter()?;
        let s = self.stream.cu_stream();
        // SAFETY: the parameters match host_amo's; `dest` is an element of a symmetric buffer
        // (checked by the caller) and `result` holds two u64.
        unsafe { cu::launch_kernel(self.func, (1, 1, 1), (1, 1, 1), 0, s, &mut params) }
            .map_err(|e| Error::Module(format!("launch of host_amo failed: {e:?}")))?;
        let mut out = [0u64; 2];
        // SAFETY: `result` holds two u64; `out` outlives the copy, which the synchronisation
        // below waits for.
        unsafe { cu::memcpy_dtoh_async(&mut out, self.result, s) }.during("cuMemcpyDtoHAsync")?;
        self.stream.synchronize().during("cuStreamSynchronize")?;
        if out[1] != self.token {
            return Err(Error::Module(format!(
                "host_amo did not complete {op:?} (type code {ty}) on PE {pe}: it reported \
                 token {}, expected {}",
                out[1], self.token
            )));
        }
        Ok(out[0])
    }
}

impl Drop for HostAmo {
    fn drop(&mut self) {
        // The runtime made its context current. Nothing of ours may still run on the GPU.
        let _ = self.stream.synchronize();
        // SAFETY: no launch of the module is in flight, and nothing refers to it any more.
        unsafe {
            if self.result != 0 {
                let _ = cu::free_sync(self.result);
            }
            sys::nvshmemx_cumodule_finalize(self.module as sys::CUmodule);
            let _ = cu::module::unload(self.module);
        }
    }
}

impl Nvshmem {
    /// The address of element `index` of `view` and the PE, checked.
    fn atomic_target<T: AtomicElement>(
        &self,
        view: SymmetricView<'_, T>,
        index: usize,
        pe: usize,
    ) -> Result<(*mut T, i32)> {
        self.check_same_runtime(view.runtime(), "the atomic's buffer")?;
        let pe = self.check_pe(pe)?;
        check_index(index, view.len())?;
        self.enter()?;
        // SAFETY: index < len.
        Ok((unsafe { view.as_ptr().add(index) }, pe))
    }

    /// Run `op` on `dest` of PE `pe` in the atomics kernel and return the fetched value (the
    /// type's zero value for operations that fetch nothing).
    fn amo<T: AtomicElement>(
        &self,
        op: AmoOp,
        dest: *mut T,
        value: u64,
        cond: u64,
        pe: i32,
    ) -> Result<T> {
        let ty = amo_type_code(T::DTYPE).ok_or_else(|| {
            Error::InvalidArgument(format!("no remote atomics on {}", T::NVSHMEM_NAME))
        })?;
        if !op.applies_to(T::DTYPE) {
            return Err(Error::InvalidArgument(format!(
                "{op:?} is not defined on {}",
                T::NVSHMEM_NAME
            )));
        }
        let mut slot = self.rt.host_amo.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(HostAmo::load(self)?);
        }
        let amo = slot.as_mut().expect("loaded above");
        let bits = amo.run(self, op, ty, dest as u64, value, cond, pe)?;
        Ok(T::from_amo_bits(bits))
    }

    /// Atomically read `buf[index]` on PE `pe`.
    pub fn atomic_fetch<'a, T: AtomicElement>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::Fetch, ptr, 0, 0, pe)
    }

    /// Atomically write `value` to `buf[index]` on PE `pe`.
    pub fn atomic_set<'a, T: AtomicElement>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::Set, ptr, value.to_amo_bits(), 0, pe)
            .map(|_: T| ())
    }

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
    pub fn atomic_swap<'a, T: AtomicElement>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::Swap, ptr, value.to_amo_bits(), 0, pe)
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
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(
            AmoOp::CompareSwap,
            ptr,
            value.to_amo_bits(),
            cond.to_amo_bits(),
            pe,
        )
    }

    /// Atomically add `value` to `buf[index]` on PE `pe`; returns the old value.
    pub fn atomic_fetch_add<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::FetchAdd, ptr, value.to_amo_bits(), 0, pe)
    }

    /// Atomically add `value` to `buf[index]` on PE `pe`.
    pub fn atomic_add<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::Add, ptr, value.to_amo_bits(), 0, pe)
            .map(|_: T| ())
    }

    /// Atomically add one to `buf[index]` on PE `pe`; returns the old value.
    pub fn atomic_fetch_inc<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::FetchInc, ptr, 0, 0, pe)
    }

    /// Atomically add one to `buf[index]` on PE `pe`.
    pub fn atomic_inc<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        pe: usize,
    ) -> Result<()> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::Inc, ptr, 0, 0, pe).map(|_: T| ())
    }

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
    pub fn atomic_fetch_and<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::FetchAnd, ptr, value.to_amo_bits(), 0, pe)
    }

    /// Atomically `buf[index] |= value` on PE `pe`; returns the old value.
    pub fn atomic_fetch_or<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::FetchOr, ptr, value.to_amo_bits(), 0, pe)
    }

    /// Atomically `buf[index] ^= value` on PE `pe`; returns the old value.
    pub fn atomic_fetch_xor<'a, T: AtomicInteger>(
        &self,
        buf: impl Into<SymmetricView<'a, T>>,
        index: usize,
        value: T,
        pe: usize,
    ) -> Result<T> {
        let (ptr, pe) = self.atomic_target(buf.into(), index, pe)?;
        self.amo(AmoOp::FetchXor, ptr, value.to_amo_bits(), 0, pe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_codes_match_the_kernel() {
        let source = include_str!("../kernels/atomics.cu");
        let names = [
            "AMO_FETCH",
            "AMO_SET",
            "AMO_SWAP",
            "AMO_COMPARE_SWAP",
            "AMO_FETCH_ADD",
            "AMO_ADD",
            "AMO_FETCH_INC",
            "AMO_INC",
            "AMO_FETCH_AND",
            "AMO_FETCH_OR",
            "AMO_FETCH_XOR",
        ];
        for (i, (op, name)) in AmoOp::ALL.iter().zip(names).enumerate() {
            assert_eq!(op.code(), i as i32, "{op:?}");
            let line = format!("{name} = {i},");
            assert!(source.contains(&line), "kernels/atomics.cu lacks `{line}`");
        }
    }

    #[test]
    fn type_codes_are_the_data_type_tags_the_kernel_knows() {
        let source = include_str!("../kernels/atomics.cu");
        for (t, name, code) in [
            (DataType::I32, "TYPE_I32", 2),
            (DataType::I64, "TYPE_I64", 3),
            (DataType::U32, "TYPE_U32", 6),
            (DataType::U64, "TYPE_U64", 7),
            (DataType::F32, "TYPE_F32", 8),
            (DataType::F64, "TYPE_F64", 9),
        ] {
            assert_eq!(amo_type_code(t), Some(code), "{t:?}");
            let line = format!("{name} = {code},");
            assert!(source.contains(&line), "kernels/atomics.cu lacks `{line}`");
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
