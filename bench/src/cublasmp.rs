//! The cuBLASMp baseline of the tp test: NVIDIA's distributed GEMMs with the communication
//! overlapped (all-gather + GEMM, GEMM + reduce-scatter, GEMM + all-reduce), loaded at run
//! time from `libcublasmp.so.0`.
//!
//! Release 0.7 is the one that runs beside this crate: it is built on NVSHMEM, joins the
//! NVSHMEM this process already started rather than starting its own, and takes NCCL 2.28.
//! Releases 0.8 and later moved to NCCL's symmetric memory and need NCCL 2.29.
//!
//! Its overlapped algorithms need the workspace in symmetric memory: on ordinary device
//! memory it quietly falls back to running the GEMM and the communication one after the
//! other. So the workspace comes from NVSHMEM's symmetric heap here, and every algorithm is
//! named rather than left to the library's default: its default GEMM + all-reduce uses
//! NVLink multicast, which this project keeps off, so that one runs as `NO_OVERLAP`.

use crate::error::{BenchError, Guard, Result};
use cudarc::driver::CudaStream;
use libloading::Library;
use nvshmem::{Nvshmem, SymmetricBuffer};
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// The file name the library is loaded by (the `nvidia-cublasmp-cu13` wheel's).
pub const LIBRARY: &str = "libcublasmp.so.0";

/// The release this baseline is written for: 0.7.x (`CUBLASMP_VERSION` = major·1000 +
/// minor·100 + patch).
const VERSION: std::ops::Range<c_int> = 700..800;

type Status = c_int;
type Handle = *mut c_void;
type Grid = *mut c_void;
type MatrixDesc = *mut c_void;
type MatmulDesc = *mut c_void;
type Stream = *mut c_void;

/// `cudaDataType_t` CUDA_R_16BF.
const BF16: c_int = 14;
/// `cublasComputeType_t` CUBLAS_COMPUTE_32F.
const COMPUTE_32F: c_int = 68;
/// `cublasOperation_t`.
const OP_N: c_int = 0;
const OP_T: c_int = 1;
/// `cublasMpGridLayout_t`.
const GRID_COL_MAJOR: c_int = 0;
const GRID_ROW_MAJOR: c_int = 1;
/// `cublasMpMatmulDescriptorAttribute_t`.
const ATTR_TRANSA: c_int = 0;
const ATTR_TRANSB: c_int = 1;
const ATTR_ALGO_TYPE: c_int = 3;
const ATTR_EPILOGUE: c_int = 5;
/// `cublasMpMatmulAlgoType_t`.
const ALGO_SPLIT_P2P: c_int = 1;
const ALGO_NO_OVERLAP: c_int = 5;
/// `cublasMpMatmulEpilogue_t` CUBLASMP_MATMUL_EPILOGUE_ALLREDUCE.
const EPILOGUE_ALLREDUCE: c_int = 1;

/// The entry points used, resolved once.
struct Api {
    create: unsafe extern "C" fn(*mut Handle, Stream) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    stream_set: unsafe extern "C" fn(Handle, Stream) -> Status,
    get_version: unsafe extern "C" fn(*mut c_int) -> Status,
    grid_create: unsafe extern "C" fn(i64, i64, c_int, *mut c_void, *mut Grid) -> Status,
    grid_destroy: unsafe extern "C" fn(Grid) -> Status,
    #[allow(clippy::type_complexity)]
    matrix_create: unsafe extern "C" fn(
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        c_int,
        Grid,
        *mut MatrixDesc,
    ) -> Status,
    matrix_destroy: unsafe extern "C" fn(MatrixDesc) -> Status,
    matmul_create: unsafe extern "C" fn(*mut MatmulDesc, c_int) -> Status,
    matmul_destroy: unsafe extern "C" fn(MatmulDesc) -> Status,
    matmul_set: unsafe extern "C" fn(MatmulDesc, c_int, *const c_void, usize) -> Status,
    #[allow(clippy::type_complexity)]
    buffer_size: unsafe extern "C" fn(
        Handle,
        MatmulDesc,
        i64,
        i64,
        i64,
        *const c_void,
        *const c_void,
        i64,
        i64,
        MatrixDesc,
        *const c_void,
        i64,
        i64,
        MatrixDesc,
        *const c_void,
        *const c_void,
        i64,
        i64,
        MatrixDesc,
        *mut c_void,
        i64,
        i64,
        MatrixDesc,
        *mut usize,
        *mut usize,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    matmul: unsafe extern "C" fn(
        Handle,
        MatmulDesc,
        i64,
        i64,
        i64,
        *const c_void,
        *const c_void,
        i64,
        i64,
        MatrixDesc,
        *const c_void,
        i64,
        i64,
        MatrixDesc,
        *const c_void,
        *const c_void,
        i64,
        i64,
        MatrixDesc,
        *mut c_void,
        i64,
        i64,
        MatrixDesc,
        *mut c_void,
        usize,
        *mut c_void,
        usize,
    ) -> Status,
}

/// The name of a `cublasMpStatus_t`.
fn status_name(s: Status) -> &'static str {
    match s {
        0 => "CUBLASMP_STATUS_SUCCESS",
        1 => "CUBLASMP_STATUS_NOT_INITIALIZED",
        2 => "CUBLASMP_STATUS_ALLOCATION_FAILED",
        3 => "CUBLASMP_STATUS_INVALID_VALUE",
        4 => "CUBLASMP_STATUS_ARCHITECTURE_MISMATCH",
        5 => "CUBLASMP_STATUS_EXECUTION_FAILED",
        6 => "CUBLASMP_STATUS_INTERNAL_ERROR",
        7 => "CUBLASMP_STATUS_NOT_SUPPORTED",
        _ => "an unknown cuBLASMp status",
    }
}

fn check(call: &str, s: Status) -> std::result::Result<(), String> {
    match s {
        0 => Ok(()),
        _ => Err(format!(
            "{call} failed: {} ({s}); run with CUBLASMP_LOG_LEVEL=5 for cuBLASMp's explanation",
            status_name(s)
        )),
    }
}

/// Fail early, with a fix, when the library cannot be loaded or is another release; its
/// release as `major.minor.patch` when it can.
pub fn check_library() -> Result<String> {
    load().map(|(_, _, version)| version_text(version))
}

/// A symbol of the library as the field's function type.
///
/// # Safety
/// `T` is the type cublasmp.h 0.7 declares for `name`.
unsafe fn get<T: Copy>(lib: &Library, name: &str) -> Result<T> {
    let symbol = format!("{name}\0");
    lib.get::<T>(symbol.as_bytes())
        .map(|s| *s)
        .map_err(|e| BenchError::new(format!("{LIBRARY} has no {name}: {e}")))
}

/// The entry points by name, once: `ENTRY_POINTS` for the test against the wheel's library,
/// `resolve` for the loader.
macro_rules! entry_points {
    ($($field:ident: $name:literal),* $(,)?) => {
        #[cfg(test)]
        const ENTRY_POINTS: &[&str] = &[$($name),*];

        fn resolve(lib: &Library) -> Result<Api> {
            // SAFETY: each field's type is the one cublasmp.h 0.7 declares for its name.
            Ok(Api { $($field: unsafe { get(lib, $name)? }),* })
        }
    };
}

entry_points! {
    create: "cublasMpCreate",
    destroy: "cublasMpDestroy",
    stream_set: "cublasMpStreamSet",
    get_version: "cublasMpGetVersion",
    grid_create: "cublasMpGridCreate",
    grid_destroy: "cublasMpGridDestroy",
    matrix_create: "cublasMpMatrixDescriptorCreate",
    matrix_destroy: "cublasMpMatrixDescriptorDestroy",
    matmul_create: "cublasMpMatmulDescriptorCreate",
    matmul_destroy: "cublasMpMatmulDescriptorDestroy",
    matmul_set: "cublasMpMatmulDescriptorAttributeSet",
    buffer_size: "cublasMpMatmul_bufferSize",
    matmul: "cublasMpMatmul",
}

/// The library, its entry points and its `CUBLASMP_VERSION` (0.7.x, checked).
fn load() -> Result<(Library, Api, c_int)> {
    // SAFETY: loading runs the library's initialisers, which only set up its own state.
    let lib = unsafe { Library::new(LIBRARY) }.map_err(|e| {
        // libloading keeps the loader's own words (which file was missing) in the source.
        let why = std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string());
        BenchError::new(format!(
            "cuBLASMp could not be loaded ({why}). Run `make setup` (it installs \
             nvidia-cublasmp-cu13 0.7) and launch through scripts/nvshmrun, which puts its \
             folder on LD_LIBRARY_PATH, or add that folder yourself, or leave cuBLASMp out \
             with --impls ours,nvshmem,nccl,nccl-symm"
        ))
    })?;
    let api = resolve(&lib)?;
    let mut version = 0;
    // SAFETY: writes one int.
    check("cublasMpGetVersion", unsafe {
        (api.get_version)(&mut version)
    })
    .map_err(BenchError::new)?;
    if !VERSION.contains(&version) {
        return Err(BenchError::new(format!(
            "{LIBRARY} reports CUBLASMP_VERSION {version}; the cublasmp baseline needs 0.7 \
             (700 to 799; 0.8 and later need NCCL 2.29): `make setup` installs \
             nvidia-cublasmp-cu13 0.7, or leave it out with --impls ours,nvshmem,nccl,nccl-symm"
        )));
    }
    Ok((lib, api, version))
}

/// `CUBLASMP_VERSION` of a 0.x release below 0.10 as `major.minor.patch`.
pub fn version_text(v: c_int) -> String {
    format!("{}.{}.{}", v / 1000, (v / 100) % 10, v % 100)
}

/// cuBLASMp on this PE: a handle on one stream and the two process grids over the PEs (a
/// column of them and a row of them), on an NCCL communicator of every PE, rank = PE.
pub struct CublasMp {
    api: Api,
    handle: Handle,
    /// `PEs × 1`: a matrix split by rows.
    by_rows: Grid,
    /// `1 × PEs`: a matrix split by columns.
    by_columns: Grid,
    n_pes: usize,
    _lib: Library,
}

impl CublasMp {
    /// Collective over all PEs (the grids are made together).
    ///
    /// # Safety
    /// `nccl_comm` is a live NCCL communicator of every PE, rank = PE, that outlives this.
    pub unsafe fn new(comm: *mut c_void, n_pes: usize, stream: &CudaStream) -> Result<Self> {
        let (lib, api, _) = load()?;
        let mut handle = std::ptr::null_mut();
        check(
            "cublasMpCreate",
            (api.create)(&mut handle, stream.cu_stream() as Stream),
        )
        .map_err(BenchError::new)?;
        let p = n_pes as i64;
        let mut by_rows = std::ptr::null_mut();
        let mut by_columns = std::ptr::null_mut();
        let made = check(
            "cublasMpGridCreate",
            (api.grid_create)(p, 1, GRID_COL_MAJOR, comm, &mut by_rows),
        )
        .and_then(|_| {
            check(
                "cublasMpGridCreate",
                (api.grid_create)(1, p, GRID_ROW_MAJOR, comm, &mut by_columns),
            )
        });
        let mp = CublasMp {
            api,
            handle,
            by_rows,
            by_columns,
            n_pes,
            _lib: lib,
        };
        made.map_err(BenchError::new)?;
        Ok(mp)
    }
}

impl Drop for CublasMp {
    fn drop(&mut self) {
        // SAFETY: made by `new`; the plans borrow `self`, so none is left.
        unsafe {
            for grid in [self.by_columns, self.by_rows] {
                if !grid.is_null() {
                    (self.api.grid_destroy)(grid);
                }
            }
            (self.api.destroy)(self.handle);
        }
    }
}

/// Which of cuBLASMp's tensor-parallel GEMMs, in row-major terms `Y = X Wᵀ` over `p` PEs
/// with `W` `N × K`:
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// All-gather + GEMM (column-parallel, sequence parallel input): each PE holds `M / p`
    /// rows of X and `N / p` rows of W, and gets `Y[:, its N / p]` for all M rows.
    AllGather,
    /// GEMM + reduce-scatter (row-parallel, sequence parallel output): each PE holds
    /// `X[:, its K / p]` and `W[:, its K / p]`, and gets its `M / p` rows of Y, summed.
    ReduceScatter,
    /// GEMM + all-reduce (row-parallel, replicated output): the same operands, and every PE
    /// gets all of Y, summed. Without overlap (see the module's documentation).
    AllReduce,
}

impl Kind {
    fn algorithm(self) -> c_int {
        match self {
            Kind::AllGather | Kind::ReduceScatter => ALGO_SPLIT_P2P,
            Kind::AllReduce => ALGO_NO_OVERLAP,
        }
    }
}

/// The global sizes of one GEMM: `Y` is `m × n`, the reduction `k` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// One cuBLASMp GEMM of fixed sizes: its descriptors and workspace.
pub struct Plan<'a> {
    mp: &'a CublasMp,
    kind: Kind,
    /// cuBLAS's (column-major) sizes: `Yᵀ = W Xᵀ`, `N × M`, reduction K.
    cm: (i64, i64, i64),
    a: MatrixDesc,
    b: MatrixDesc,
    d: MatrixDesc,
    desc: MatmulDesc,
    /// Freed collectively, so kept by a [`Guard`]: leaked when a PE fails.
    workspace: Option<Guard<SymmetricBuffer<u8>>>,
    host: Mutex<Vec<u8>>,
}

/// The descriptor arguments of a matrix: global rows and columns, block rows and columns,
/// local leading dimension (column-major), and which grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    rows: usize,
    cols: usize,
    block_rows: usize,
    block_cols: usize,
    ld: usize,
    by_rows: bool,
}

/// The layouts of A = W (`K × N` column-major), B = X (`K × M`) and D = Y (`N × M`) for
/// `kind` over `p` PEs, in row-major `Y[M, N] = X[M, K] W[N, K]ᵀ` terms. TN format: A is
/// transposed. The block sizes follow cuBLASMp's rules for TN: A's block rows equal B's, A's
/// block columns equal D's block rows, and B's block columns equal D's.
fn layouts(kind: Kind, dims: Dims, p: usize) -> [Layout; 3] {
    let Dims { m, n, k } = dims;
    let l = |rows, cols, block_rows, block_cols, ld, by_rows| Layout {
        rows,
        cols,
        block_rows,
        block_cols,
        ld,
        by_rows,
    };
    match kind {
        // W and X split by columns (their rows in row-major terms), Y split by rows.
        Kind::AllGather => [
            l(k, n, k, n / p, k, false),
            l(k, m, k, m / p, k, false),
            l(n, m, n / p, m / p, n / p, true),
        ],
        // W and X split along K, Y by columns (its tokens).
        Kind::ReduceScatter => [
            l(k, n, k / p, n, k / p, true),
            l(k, m, k / p, m / p, k / p, true),
            l(n, m, n, m / p, n, false),
        ],
        // The same, with Y whole on every PE: cuBLASMp states it as p copies side by side.
        Kind::AllReduce => [
            l(k, n, k / p, n, k / p, true),
            l(k, m, k / p, m, k / p, true),
            l(n, m * p, n, m, n, false),
        ],
    }
}

/// Calls `$f` (`cublasMpMatmul` or its `_bufferSize`, which share their leading
/// parameters) with a plan's handle, descriptor, sizes, `alpha` 1 and `beta` 0, operands
/// `(w, x, y)` at (1, 1) with no C, then `$tail`.
macro_rules! with_operands {
    ($plan:expr, $f:ident, ($w:expr, $x:expr, $y:expr), $($tail:expr),+) => {{
        let plan = $plan;
        let (m, n, k) = plan.cm;
        let (alpha, beta) = (1.0f32, 0.0f32);
        (plan.mp.api.$f)(
            plan.mp.handle,
            plan.desc,
            m,
            n,
            k,
            &alpha as *const f32 as *const c_void,
            $w as *const c_void,
            1,
            1,
            plan.a,
            $x as *const c_void,
            1,
            1,
            plan.b,
            &beta as *const f32 as *const c_void,
            std::ptr::null(),
            1,
            1,
            std::ptr::null_mut(),
            $y as *mut c_void,
            1,
            1,
            plan.d,
            $($tail),+
        )
    }};
}

impl<'a> Plan<'a> {
    /// The descriptors, and the workspace from the symmetric heap: collective, sizes equal
    /// on every PE (checked by the caller with [`Plan::workspace_bytes`] before it is
    /// allocated). `dims` are global; each must divide by the PEs where `kind` splits it.
    pub fn new(mp: &'a CublasMp, kind: Kind, dims: Dims) -> std::result::Result<Self, String> {
        let p = mp.n_pes;
        let splits: &[(&str, usize)] = match kind {
            Kind::AllGather => &[("M", dims.m), ("N", dims.n)],
            Kind::ReduceScatter => &[("M", dims.m), ("K", dims.k)],
            Kind::AllReduce => &[("K", dims.k)],
        };
        if let Some((name, v)) = splits.iter().find(|(_, v)| v % p != 0 || *v == 0) {
            return Err(format!(
                "cuBLASMp {kind:?}: {name} = {v} does not divide among {p} PEs"
            ));
        }
        let mut plan = Plan {
            mp,
            kind,
            cm: (dims.n as i64, dims.m as i64, dims.k as i64),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            desc: std::ptr::null_mut(),
            workspace: None,
            host: Mutex::new(Vec::new()),
        };
        let api = &mp.api;
        for (slot, lay) in [&mut plan.a, &mut plan.b, &mut plan.d]
            .into_iter()
            .zip(layouts(kind, dims, p))
        {
            let grid = match lay.by_rows {
                true => mp.by_rows,
                false => mp.by_columns,
            };
            // SAFETY: writes one descriptor; the grid is live.
            check("cublasMpMatrixDescriptorCreate", unsafe {
                (api.matrix_create)(
                    lay.rows as i64,
                    lay.cols as i64,
                    lay.block_rows as i64,
                    lay.block_cols as i64,
                    0,
                    0,
                    lay.ld as i64,
                    BF16,
                    grid,
                    slot,
                )
            })?;
        }
        // SAFETY: writes one descriptor, then sets attributes of the sizes given.
        unsafe {
            check(
                "cublasMpMatmulDescriptorCreate",
                (api.matmul_create)(&mut plan.desc, COMPUTE_32F),
            )?;
            let set = |attr: c_int, v: c_int| {
                check(
                    "cublasMpMatmulDescriptorAttributeSet",
                    (api.matmul_set)(
                        plan.desc,
                        attr,
                        &v as *const c_int as *const c_void,
                        std::mem::size_of::<c_int>(),
                    ),
                )
            };
            set(ATTR_TRANSA, OP_T)?;
            set(ATTR_TRANSB, OP_N)?;
            set(ATTR_ALGO_TYPE, kind.algorithm())?;
            if kind == Kind::AllReduce {
                set(ATTR_EPILOGUE, EPILOGUE_ALLREDUCE)?;
            }
        }
        Ok(plan)
    }

    /// The device and host workspace cuBLASMp asks for, for these operands.
    pub fn workspace_bytes(
        &self,
        w: u64,
        x: u64,
        y: u64,
    ) -> std::result::Result<(usize, usize), String> {
        let (mut device, mut host) = (0usize, 0usize);
        // SAFETY: the descriptors are live; the pointers are only recorded.
        check("cublasMpMatmul_bufferSize", unsafe {
            with_operands!(self, buffer_size, (w, x, y), &mut device, &mut host)
        })?;
        Ok((device, host))
    }

    /// Takes the workspace: `device` bytes from the symmetric heap (collective), `host`
    /// bytes of host memory.
    pub fn set_workspace(&mut self, shmem: &Nvshmem, device: usize, host: usize) -> Result<()> {
        self.workspace = Some(Guard::new(shmem.malloc::<u8>(device.max(1))?));
        *self.host.lock().unwrap_or_else(|e| e.into_inner()) = vec![0u8; host];
        Ok(())
    }

    /// The device workspace taken, in bytes (0 before [`Plan::set_workspace`]).
    pub fn workspace_len(&self) -> usize {
        self.workspace.as_ref().map_or(0, |w| w.num_bytes())
    }

    /// Enqueues `Y = X Wᵀ` with the communication of `self.kind` on `stream`: `w`, `x` and
    /// `y` are this PE's pieces, laid out as [`Kind`] says.
    ///
    /// # Safety
    /// The pointers hold this PE's pieces of the sizes the plan was made for, and stay valid
    /// until the stream (or the graph it is captured into) has run.
    pub unsafe fn enqueue(
        &self,
        y: u64,
        x: u64,
        w: u64,
        stream: &CudaStream,
    ) -> std::result::Result<(), String> {
        let api = &self.mp.api;
        let work = self
            .workspace
            .as_ref()
            .ok_or_else(|| format!("cuBLASMp {:?}: no workspace", self.kind))?;
        check(
            "cublasMpStreamSet",
            (api.stream_set)(self.mp.handle, stream.cu_stream() as Stream),
        )?;
        let mut host = self.host.lock().unwrap_or_else(|e| e.into_inner());
        check(
            "cublasMpMatmul",
            with_operands!(
                self,
                matmul,
                (w, x, y),
                work.addr() as *mut c_void,
                work.num_bytes(),
                host.as_mut_ptr() as *mut c_void,
                host.len()
            ),
        )
    }
}

impl Drop for Plan<'_> {
    fn drop(&mut self) {
        let api = &self.mp.api;
        // SAFETY: made by `new` (null where it stopped early).
        unsafe {
            if !self.desc.is_null() {
                (api.matmul_destroy)(self.desc);
            }
            for d in [self.d, self.b, self.a] {
                if !d.is_null() {
                    (api.matrix_destroy)(d);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_keep_the_tn_block_rules() {
        let dims = Dims {
            m: 512,
            n: 384,
            k: 256,
        };
        for kind in [Kind::AllGather, Kind::ReduceScatter, Kind::AllReduce] {
            for p in [1, 2, 4, 8] {
                let [a, b, d] = layouts(kind, dims, p);
                assert_eq!(a.block_rows, b.block_rows, "{kind:?} p={p}");
                assert_eq!(a.block_cols, d.block_rows, "{kind:?} p={p}");
                assert_eq!(b.block_cols, d.block_cols, "{kind:?} p={p}");
                // Global A is K × N, B is K × M (transposed operands).
                assert_eq!((a.rows, a.cols), (dims.k, dims.n));
                assert_eq!(b.rows, dims.k);
            }
        }
    }

    #[test]
    fn layouts_give_each_pe_its_piece() {
        let dims = Dims {
            m: 512,
            n: 384,
            k: 256,
        };
        let p = 4;
        // All-gather: X's M / p rows and W's N / p rows in, all M rows of N / p features out.
        let [a, b, d] = layouts(Kind::AllGather, dims, p);
        assert_eq!((a.block_cols, a.ld, a.by_rows), (384 / 4, 256, false));
        assert_eq!((b.block_cols, b.ld), (512 / 4, 256));
        assert_eq!((d.block_rows, d.ld, d.by_rows), (384 / 4, 384 / 4, true));
        // Reduce-scatter: K / p of each operand in, M / p rows of Y out.
        let [a, b, d] = layouts(Kind::ReduceScatter, dims, p);
        assert_eq!((a.block_rows, a.ld, a.by_rows), (256 / 4, 256 / 4, true));
        assert_eq!((b.block_rows, b.ld), (256 / 4, 256 / 4));
        assert_eq!((d.block_cols, d.ld, d.by_rows), (512 / 4, 384, false));
        // All-reduce: all of Y out, stated as p copies.
        let [_, b, d] = layouts(Kind::AllReduce, dims, p);
        assert_eq!(b.block_cols, 512);
        assert_eq!((d.cols, d.block_cols), (512 * 4, 512));
    }

    #[test]
    fn algorithms_are_named_and_avoid_multicast() {
        assert_eq!(Kind::AllGather.algorithm(), ALGO_SPLIT_P2P);
        assert_eq!(Kind::ReduceScatter.algorithm(), ALGO_SPLIT_P2P);
        assert_eq!(Kind::AllReduce.algorithm(), ALGO_NO_OVERLAP);
    }

    /// The wheel's library, as `make setup` installs it into the checkout's `.venv`.
    fn wheel_library() -> std::path::PathBuf {
        let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib");
        let found = std::fs::read_dir(&venv).ok().and_then(|dirs| {
            dirs.flatten()
                .map(|d| {
                    d.path()
                        .join("site-packages/nvidia/cublasmp/cu13/lib")
                        .join(LIBRARY)
                })
                .find(|p| p.is_file())
        });
        found.unwrap_or_else(|| {
            panic!(
                "no {LIBRARY} under {}: run `make setup` (it installs nvidia-cublasmp-cu13)",
                venv.display()
            )
        })
    }

    #[test]
    fn every_entry_point_is_exported_by_the_pinned_release() {
        use object::{Object, ObjectSymbol};
        let path = wheel_library();
        let data = std::fs::read(&path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let exported: std::collections::HashSet<&str> = file
            .dynamic_symbols()
            .filter(|s| s.is_definition())
            .filter_map(|s| s.name().ok())
            .collect();
        let missing: Vec<&&str> = ENTRY_POINTS
            .iter()
            .filter(|n| !exported.contains(**n))
            .collect();
        assert!(
            missing.is_empty(),
            "{}: missing {missing:?}",
            path.display()
        );
        assert_eq!(ENTRY_POINTS.len(), 13);
        // The release: the header beside it says 0.7.
        let cu13 = path.parent().and_then(|lib| lib.parent()).unwrap();
        let header = cu13.join("include/cublasmp.h");
        let text = std::fs::read_to_string(&header).unwrap();
        assert!(
            text.contains("#define CUBLASMP_VER_MINOR 7"),
            "{}",
            header.display()
        );
        assert!(text.contains("#define CUBLASMP_VER_MAJOR 0"));
    }

    #[test]
    fn statuses_and_versions_read_well() {
        assert_eq!(status_name(7), "CUBLASMP_STATUS_NOT_SUPPORTED");
        assert!(check("x", 3).unwrap_err().contains("INVALID_VALUE"));
        assert!(check("x", 0).is_ok());
        assert_eq!(version_text(700), "0.7.0");
        assert_eq!(version_text(712), "0.7.12");
        assert!(VERSION.contains(&700) && !VERSION.contains(&800));
    }
}
