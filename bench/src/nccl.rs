//! The NCCL baseline through cudarc's NCCL bindings: one communicator over all PEs, made from
//! a unique id that PE 0 broadcasts through NVSHMEM.

use crate::coord::Coord;
use crate::error::{BenchError, CudaExt, Result};
use cudarc::driver::CudaStream;
use cudarc::nccl::result::{self as nr, NcclError};
use cudarc::nccl::sys as ns;
use nvshmem::Nvshmem;
use std::ffi::{c_void, CStr};

/// Fail early, with a fix, when libnccl.so cannot be loaded.
pub fn check_library() -> Result<()> {
    if unsafe { ns::is_culib_present() } {
        return Ok(());
    }
    Err(BenchError::new(
        "NCCL could not be loaded: cudarc looks for libnccl.so (the NCCL wheel ships only \
         libnccl.so.2). Run through scripts/nvshmrun, which puts a libnccl.so link on \
         LD_LIBRARY_PATH (after `make setup`), or add a directory with libnccl.so to \
         LD_LIBRARY_PATH, or leave NCCL out with --impls ours,nvshmem",
    ))
}

/// NCCL's version as `major.minor.patch`.
pub fn version() -> Result<String> {
    let v = nr::get_nccl_version().map_err(|e| nccl_error("ncclGetVersion", e))?;
    Ok(if v >= 10000 {
        format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, (v / 100) % 10, v % 100)
    })
}

fn error_text(e: &NcclError) -> String {
    let p = unsafe { ns::ncclGetErrorString(e.0) };
    if p.is_null() {
        format!("{:?}", e.0)
    } else {
        format!(
            "{:?} ({})",
            e.0,
            unsafe { CStr::from_ptr(p) }.to_string_lossy()
        )
    }
}

pub fn nccl_error(call: &str, e: NcclError) -> BenchError {
    BenchError::new(format!(
        "{call} failed: {}; run with NCCL_DEBUG=WARN for NCCL's explanation",
        error_text(&e)
    ))
}

/// The same, as text (for failures that are reported rather than fatal).
pub fn nccl_error_text(call: &str, e: NcclError) -> String {
    format!("{call} failed: {}", error_text(&e))
}

/// A communicator over all PEs, rank = PE.
pub struct Nccl {
    comm: ns::ncclComm_t,
    n_pes: usize,
}

impl Nccl {
    /// Collective over all PEs.
    pub fn new(shmem: &Nvshmem, coord: &Coord) -> Result<Self> {
        const ID: usize = 128;
        let mine = if shmem.my_pe() == 0 {
            let id = nr::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
            id.internal.iter().map(|&c| c as u8).collect::<Vec<u8>>()
        } else {
            vec![0u8; ID]
        };
        let bytes = coord.broadcast_bytes(&mine)?;
        let mut id = ns::ncclUniqueId { internal: [0; ID] };
        for (dst, &b) in id.internal.iter_mut().zip(&bytes) {
            *dst = b as std::ffi::c_char;
        }
        shmem.context().bind_to_thread().cuda("cuCtxSetCurrent")?;
        let mut comm: ns::ncclComm_t = std::ptr::null_mut();
        unsafe { nr::comm_init_rank(&mut comm, shmem.n_pes() as i32, id, shmem.my_pe() as i32) }
            .map_err(|e| nccl_error("ncclCommInitRank", e))?;
        Ok(Nccl {
            comm,
            n_pes: shmem.n_pes(),
        })
    }

    /// The communicator of the ranks that pass the same `color`, ranked by `key`
    /// (`ncclCommSplit`). Collective over this communicator.
    pub fn split(&self, color: usize, key: usize) -> Result<Self> {
        let mut comm: ns::ncclComm_t = std::ptr::null_mut();
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| BenchError::new("a split's colour or key is too large"))
        };
        // cudarc's `result::comm_split` is built for CUDA 12.2-12.5 only: the raw call.
        // SAFETY: this communicator is alive; a null configuration takes the parent's.
        let r = unsafe {
            ns::ncclCommSplit(
                self.comm,
                int(color)?,
                int(key)?,
                &mut comm,
                std::ptr::null_mut(),
            )
        };
        if r != ns::ncclResult_t::ncclSuccess {
            return Err(nccl_error("ncclCommSplit", NcclError(r)));
        }
        // Owned from here, so that an error below destroys it.
        let mut split = Nccl { comm, n_pes: 0 };
        // SAFETY: the communicator just made.
        let n = unsafe { nr::comm_count(comm) }.map_err(|e| nccl_error("ncclCommCount", e))?;
        split.n_pes = n as usize;
        Ok(split)
    }

    /// The number of ranks.
    pub fn n_ranks(&self) -> usize {
        self.n_pes
    }

    /// The raw communicator, for libraries that run on it (cuBLASMp); valid while `self`
    /// lives.
    pub fn comm(&self) -> ns::ncclComm_t {
        self.comm
    }

    fn stream(stream: &CudaStream) -> ns::cudaStream_t {
        stream.cu_stream() as ns::cudaStream_t
    }

    /// Sum all-reduce of `count` elements.
    ///
    /// # Safety
    /// `src` and `dst` must be device buffers of `count` elements of `dtype`.
    pub unsafe fn all_reduce(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        dtype: ns::ncclDataType_t,
        stream: &CudaStream,
    ) -> Result<(), String> {
        nr::all_reduce(
            src as *const c_void,
            dst as *mut c_void,
            count,
            dtype,
            ns::ncclRedOp_t::ncclSum,
            self.comm,
            Self::stream(stream),
        )
        .map(|_| ())
        .map_err(|e| nccl_error_text("ncclAllReduce", e))
    }

    /// All-gather of `count` elements per PE into `dst` (`count * PEs` elements).
    ///
    /// # Safety
    /// `src` must hold `count` and `dst` `count * PEs` elements of `dtype`.
    pub unsafe fn all_gather(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        dtype: ns::ncclDataType_t,
        stream: &CudaStream,
    ) -> Result<(), String> {
        nr::all_gather(
            src as *const c_void,
            dst as *mut c_void,
            count,
            dtype,
            self.comm,
            Self::stream(stream),
        )
        .map(|_| ())
        .map_err(|e| nccl_error_text("ncclAllGather", e))
    }

    /// Sum reduce-scatter: `src` holds a block of `count` elements for every PE, and PE `p`
    /// gets block `p` summed over every PE into `dst` (`count` elements).
    ///
    /// # Safety
    /// `src` must hold `count * PEs` and `dst` `count` elements of `dtype`.
    pub unsafe fn reduce_scatter(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        dtype: ns::ncclDataType_t,
        stream: &CudaStream,
    ) -> Result<(), String> {
        nr::reduce_scatter(
            src as *const c_void,
            dst as *mut c_void,
            count,
            dtype,
            ns::ncclRedOp_t::ncclSum,
            self.comm,
            Self::stream(stream),
        )
        .map(|_| ())
        .map_err(|e| nccl_error_text("ncclReduceScatter", e))
    }

    /// Broadcast `count` elements from `root`'s `src` into every PE's `dst`.
    ///
    /// # Safety
    /// `src` and `dst` must hold `count` elements of `dtype`.
    pub unsafe fn broadcast(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        dtype: ns::ncclDataType_t,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), String> {
        nr::broadcast(
            src as *const c_void,
            dst as *mut c_void,
            count,
            dtype,
            root as i32,
            self.comm,
            Self::stream(stream),
        )
        .map(|_| ())
        .map_err(|e| nccl_error_text("ncclBroadcast", e))
    }

    /// All-to-all of blocks of `block_bytes`: one send and one receive per PE in one group,
    /// as NCCL's documentation writes it (NCCL has no all-to-all call).
    ///
    /// # Safety
    /// `src` and `dst` must hold `block_bytes * PEs` bytes.
    pub unsafe fn all_to_all(
        &self,
        src: u64,
        dst: u64,
        block_bytes: usize,
        stream: &CudaStream,
    ) -> Result<(), String> {
        nr::group_start().map_err(|e| nccl_error_text("ncclGroupStart", e))?;
        let mut queued = Ok(());
        for p in 0..self.n_pes {
            let offset = (p * block_bytes) as u64;
            queued = queued
                .and(self.send(src + offset, block_bytes, p, stream))
                .and(self.recv(dst + offset, block_bytes, p, stream));
        }
        let ended = nr::group_end()
            .map(|_| ())
            .map_err(|e| nccl_error_text("ncclGroupEnd", e));
        queued.map_err(|e| e.to_string())?;
        ended
    }

    /// Send `bytes` bytes to `peer`.
    ///
    /// # Safety
    /// `src` must be a device buffer of at least `bytes` bytes.
    pub unsafe fn send(
        &self,
        src: u64,
        bytes: usize,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        nr::send(
            src as *const c_void,
            bytes,
            ns::ncclDataType_t::ncclUint8,
            peer as i32,
            self.comm,
            Self::stream(stream),
        )
        .map(|_| ())
        .map_err(|e| nccl_error("ncclSend", e))
    }

    /// Receive `bytes` bytes from `peer`.
    ///
    /// # Safety
    /// `dst` must be a device buffer of at least `bytes` bytes.
    pub unsafe fn recv(
        &self,
        dst: u64,
        bytes: usize,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        nr::recv(
            dst as *mut c_void,
            bytes,
            ns::ncclDataType_t::ncclUint8,
            peer as i32,
            self.comm,
            Self::stream(stream),
        )
        .map(|_| ())
        .map_err(|e| nccl_error("ncclRecv", e))
    }

    /// Send to and receive from `peer` at once (one NCCL group).
    ///
    /// # Safety
    /// As for [`send`](Self::send) and [`recv`](Self::recv).
    pub unsafe fn send_recv(
        &self,
        src: u64,
        dst: u64,
        bytes: usize,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        self.group(|| {
            let sent = self.send(src, bytes, peer, stream);
            let received = self.recv(dst, bytes, peer, stream);
            sent.and(received)
        })
    }

    /// The sends and receives that `ops` enqueues as one NCCL group: they start together,
    /// so none waits for its peer alone while that peer waits for another of them.
    pub fn group(&self, ops: impl FnOnce() -> Result<()>) -> Result<()> {
        nr::group_start().map_err(|e| nccl_error("ncclGroupStart", e))?;
        let queued = ops();
        nr::group_end().map_err(|e| nccl_error("ncclGroupEnd", e))?;
        queued
    }
}

/// `NCCL_WIN_COLL_SYMMETRIC` (nccl.h, 2.27 and later): a window every rank registers at the
/// same offset of its `ncclMemAlloc` memory, which NCCL's symmetric kernels require.
const NCCL_WIN_COLL_SYMMETRIC: i32 = 0x01;

/// Device memory from `ncclMemAlloc`, registered with the communicator as a symmetric window.
/// Made and dropped collectively (every rank, same order, same size).
pub struct SymmetricWindow<'a> {
    nccl: &'a Nccl,
    ptr: *mut c_void,
    win: ns::ncclWindow_t,
}

impl Nccl {
    /// A symmetric window of `bytes` bytes (collective). An error when this NCCL has no
    /// windows (before 2.27) or refuses the registration.
    pub fn symmetric_window(&self, bytes: usize) -> Result<SymmetricWindow<'_>, String> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-parameters of plain calls; the memory is freed by the window's drop.
        unsafe {
            let r = ns::ncclMemAlloc(&mut ptr, bytes.max(1));
            if r != ns::ncclResult_t::ncclSuccess {
                return Err(nccl_error_text("ncclMemAlloc", NcclError(r)));
            }
            let mut win: ns::ncclWindow_t = std::ptr::null_mut();
            let r = ns::ncclCommWindowRegister(
                self.comm,
                ptr,
                bytes.max(1),
                &mut win,
                NCCL_WIN_COLL_SYMMETRIC,
            );
            if r != ns::ncclResult_t::ncclSuccess {
                let _ = ns::ncclMemFree(ptr);
                return Err(nccl_error_text("ncclCommWindowRegister", NcclError(r)));
            }
            Ok(SymmetricWindow {
                nccl: self,
                ptr,
                win,
            })
        }
    }
}

impl SymmetricWindow<'_> {
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for SymmetricWindow<'_> {
    fn drop(&mut self) {
        // SAFETY: the window and memory of this value, no longer used (every operation on
        // them was waited for).
        unsafe {
            let _ = ns::ncclCommWindowDeregister(self.nccl.comm, self.win);
            let _ = ns::ncclMemFree(self.ptr);
        }
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        unsafe {
            let _ = nr::comm_destroy(self.comm);
        }
    }
}
