//! Our CUTLASS GEMM for Hopper: `y = x · wᵀ` in bf16 with f32 accumulation, by CUTLASS 3's
//! TMA warp-specialised cooperative kernel, persistent over 128 × 256 output tiles with
//! clusters of two (`kernels/gemm`, built for `sm_90a` only).
//!
//! CUTLASS's own host code, compiled into the crate (`kernels/gemm/gemm_sm90_params.cu`),
//! fills the kernel's parameter block: the TMA descriptors of `x`, `w` and `y` and the tile
//! schedule. The kernel is then launched from its cubin like every other kernel of the crate,
//! through [`Function::launch_with`]. A block is prepared once per set of addresses and shape
//! and reused, so repeated calls (a layer's forward) cost only the launch.

use crate::abi::{self, GemmLaunch, GemmProblem};
use crate::cubins::GEMM_SM90;
use crate::error::{Error, Result};
use crate::module::{Function, KernelArgs, LaunchOptions, Module};
use crate::runtime::Nvshmem;
use cudarc::driver::{sys as cusys, CudaStream, LaunchConfig};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

extern "C" {
    /// `sizeof(Kernel::Params)` as the host code sees it.
    fn nvshmem_rs_gemm_sm90_params_size() -> usize;
    /// Fill `params` and `launch` for `problem`; a `GemmStatus`.
    fn nvshmem_rs_gemm_sm90_prepare(
        encode: *const c_void,
        problem: *const GemmProblem,
        params: *mut c_void,
        params_size: usize,
        launch: *mut GemmLaunch,
    ) -> c_int;
}

/// The kernel's name in `gemm_sm90.cu`.
const KERNEL: &str = "linear_bf16_sm90";

/// Prepared parameter blocks kept per GEMM object; beyond this many the cache starts over
/// (a layer reuses a few; a caller cycling through many buffers re-encodes).
const MAX_PREPARED: usize = 256;

/// Tiles the persistent schedule visits as a group from [`SWIZZLE_TOKENS`] tokens on, so that
/// the clusters running at once share their rows of `x` and `w` in L2 (below, one tile at a
/// time). Measured on one H100 (`tp_mlp --test gemm`, the Llama-3 8B MLP shard of TP 2)
/// against cuBLASLt: 8192 × 14336 × 4096 at 0.86x with groups of 1, 0.94x with 2, 0.97x
/// with 4 and 0.98x with 8; at 2048 tokens 0.98 to 0.99x with any group; below 2048 groups of
/// 8 halve the speed (1024 × 14336 × 4096: 0.90x with 1, 0.45x with 8).
const SWIZZLE: i32 = 8;
/// Tokens from which the schedule groups tiles by [`SWIZZLE`].
const SWIZZLE_TOKENS: usize = 2048;

/// Elements of `x`, `w` and `y` per 16 bytes: TMA needs every row to start on 16 bytes.
pub(crate) const ALIGN_ELEMENTS: usize = 8;

/// Rows of `x` that arrive while the GEMM runs (`GemmWait` in kernels/abi.h): `x`'s rows
/// come in chunks of `rows_per_chunk`, and row 0 of the call is row `row_offset` of the chunk
/// numbering. A tile waits, before it loads its rows, until the flag `ready[c]` (a `u64`) of
/// every chunk `c < chunks` they touch is at least `want`, `own_chunk`'s excepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ChunkWait {
    pub(crate) ready: u64,
    pub(crate) want: u64,
    pub(crate) rows_per_chunk: usize,
    pub(crate) row_offset: usize,
    pub(crate) chunks: usize,
    pub(crate) own_chunk: usize,
}

/// One GEMM as the parameter block depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Problem {
    x: u64,
    w: u64,
    y: u64,
    m: usize,
    n: usize,
    k: usize,
    ldy: usize,
    wait: Option<ChunkWait>,
}

impl Problem {
    /// The problem of one [`CutlassGemm::linear`] call.
    fn of(
        y: u64,
        ldy: usize,
        x: u64,
        w: u64,
        (m, n, k): (usize, usize, usize),
        wait: Option<ChunkWait>,
    ) -> Self {
        Problem {
            x,
            w,
            y,
            m,
            n,
            k,
            ldy,
            wait,
        }
    }
}

/// A parameter block ready to launch.
struct Prepared {
    params: Vec<u8>,
    cfg: LaunchConfig,
    cluster: [u32; 3],
}

/// The loaded kernel with what its calls need.
pub(crate) struct CutlassGemm {
    function: Function,
    /// `cuTensorMapEncodeTiled` of the loaded driver, for the host code.
    encode: usize,
    sm_count: i32,
    max_active_clusters: i32,
    params_size: usize,
    prepared: Mutex<HashMap<Problem, Arc<Prepared>>>,
}

/// Why `problem` cannot run on our kernel, if it cannot: TMA needs 16-byte aligned rows and
/// addresses, and the host code takes `int` extents.
fn unsupported(p: &Problem) -> Option<String> {
    let bytes = std::mem::size_of::<half::bf16>() as u64;
    if p.k % ALIGN_ELEMENTS != 0 || p.ldy % ALIGN_ELEMENTS != 0 {
        return Some(format!(
            "rows of x and w ({} elements) and of y ({} elements apart) must be multiples of \
             {ALIGN_ELEMENTS} elements (16 bytes) for TMA",
            p.k, p.ldy
        ));
    }
    if (p.x | p.w | p.y) % (ALIGN_ELEMENTS as u64 * bytes) != 0 {
        return Some(format!(
            "x, w and y must start on 16-byte boundaries for TMA (x at {:#x}, w at {:#x}, y at \
             {:#x})",
            p.x, p.w, p.y
        ));
    }
    let max = i32::MAX as usize;
    if p.m > max || p.n > max || p.k > max {
        return Some(format!(
            "extents up to {max} (m = {}, n = {}, k = {})",
            p.m, p.n, p.k
        ));
    }
    None
}

impl CutlassGemm {
    /// Load the kernel on this PE's GPU. Fails on a GPU other than compute capability 9.0
    /// (the cubin is `sm_90a`), or when the crate was built without sm_90.
    pub(crate) fn load(shmem: &Nvshmem) -> Result<Self> {
        let module = Module::load(shmem, &GEMM_SM90)?;
        let function = module.function(KERNEL)?;
        // SAFETY: a pure function of the compiled types.
        let params_size = unsafe { nvshmem_rs_gemm_sm90_params_size() };
        if let Some(sizes) = function.param_sizes() {
            if sizes != [params_size] {
                return Err(Error::Module {
                    module: GEMM_SM90.name().into(),
                    message: format!(
                        "{KERNEL} takes parameters of {sizes:?} bytes, but the host code that \
                         prepares them writes {params_size}: the cubin and the crate's host \
                         library were built from different sources; rebuild the crate"
                    ),
                    source: None,
                });
            }
        }
        // SAFETY: only looks the symbol up; the driver library is already loaded.
        let encode = unsafe {
            cusys::culib()
                .get::<unsafe extern "C" fn()>(b"cuTensorMapEncodeTiled\0")
                .map(|f| *f as usize)
        }
        .map_err(|e| Error::Module {
            module: GEMM_SM90.name().into(),
            message: format!(
                "the CUDA driver has no cuTensorMapEncodeTiled ({e}): TMA needs a driver for \
                 CUDA 12.0 or later"
            ),
            source: None,
        })?;
        let mut launch = GemmLaunch::default();
        // The block, cluster and shared memory do not depend on the problem: prepare a
        // one-tile problem on made-up (aligned) addresses to read them. Encoding reads no
        // memory.
        let probe = Problem {
            x: 1 << 20,
            w: 2 << 20,
            y: 3 << 20,
            m: 1,
            n: 8,
            k: 8,
            ldy: 8,
            wait: None,
        };
        let mut params = vec![0u8; params_size];
        prepare(encode, &probe, 1, 0, &mut params, &mut launch)?;
        function.set_max_dynamic_shared_memory(launch.shared_mem_bytes)?;
        let cfg = LaunchConfig {
            grid_dim: (launch.cluster[0], launch.cluster[1], launch.cluster[2]),
            block_dim: (launch.block[0], launch.block[1], launch.block[2]),
            shared_mem_bytes: launch.shared_mem_bytes,
        };
        let max_active_clusters = function.max_active_clusters(cfg, launch.cluster)?;
        if max_active_clusters == 0 {
            return Err(Error::Module {
                module: GEMM_SM90.name().into(),
                message: format!(
                    "not one cluster of {KERNEL} ({:?} blocks of {:?} threads, {} bytes of shared \
                     memory each) fits on this GPU; is it shared with a CUDA MPS limit below a \
                     cluster's SMs?",
                    launch.cluster, launch.block, launch.shared_mem_bytes
                ),
                source: None,
            });
        }
        Ok(CutlassGemm {
            function,
            encode,
            sm_count: shmem.sm_count()? as i32,
            max_active_clusters: max_active_clusters as i32,
            params_size,
            prepared: Mutex::new(HashMap::new()),
        })
    }

    /// `y = x · wᵀ` on `stream`, `y`'s rows `ldy` elements apart; with `wait`, each tile
    /// first waits for its rows of `x` to arrive.
    ///
    /// # Safety
    /// `x` must hold `m × k`, `w` `n × k` and `y` `(m - 1) × ldy + n` bf16 elements of this
    /// PE's GPU, valid until the call has run on `stream`; `m`, `n` and `k` are not zero.
    /// `wait`'s flags must be device memory that something sets before the kernel could wait
    /// for ever (a kernel that waits holds its SMs).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn linear(
        &self,
        y: u64,
        ldy: usize,
        x: u64,
        w: u64,
        (m, n, k): (usize, usize, usize),
        wait: Option<ChunkWait>,
        stream: &CudaStream,
    ) -> Result<()> {
        let problem = Problem::of(y, ldy, x, w, (m, n, k), wait);
        if let Some(why) = unsupported(&problem) {
            return Err(Error::InvalidArgument(format!(
                "our CUTLASS GEMM cannot take y ({m} × {n}) = x ({m} × {k}) · wᵀ: {why}; use \
                 GemmPath::Auto or GemmPath::CublasLt"
            )));
        }
        let prepared = self.prepared(problem)?;
        let mut args = KernelArgs::new();
        args.bytes(&prepared.params);
        let options = LaunchOptions {
            cluster: Some(prepared.cluster),
            ..LaunchOptions::default()
        };
        self.function
            .launch_with(prepared.cfg, options, stream, &mut args)
    }

    /// Whether [`linear`](Self::linear) takes this call (TMA's alignment rules).
    pub(crate) fn takes(
        &self,
        y: u64,
        ldy: usize,
        x: u64,
        w: u64,
        mnk: (usize, usize, usize),
    ) -> bool {
        unsupported(&Problem::of(y, ldy, x, w, mnk, None)).is_none()
    }

    /// The parameter block of `problem`, prepared on first use.
    fn prepared(&self, problem: Problem) -> Result<Arc<Prepared>> {
        let mut cache = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(&problem) {
            return Ok(p.clone());
        }
        let mut params = vec![0u8; self.params_size];
        let mut launch = GemmLaunch::default();
        prepare(
            self.encode,
            &problem,
            self.sm_count,
            self.max_active_clusters,
            &mut params,
            &mut launch,
        )?;
        let prepared = Arc::new(Prepared {
            params,
            cfg: LaunchConfig {
                grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
                block_dim: (launch.block[0], launch.block[1], launch.block[2]),
                shared_mem_bytes: launch.shared_mem_bytes,
            },
            cluster: launch.cluster,
        });
        if cache.len() >= MAX_PREPARED {
            cache.clear();
        }
        cache.insert(problem, prepared.clone());
        Ok(prepared)
    }
}

/// Run the host code for `problem`: the parameter block into `params`, the launch shape into
/// `launch`.
fn prepare(
    encode: usize,
    problem: &Problem,
    sm_count: i32,
    max_active_clusters: i32,
    params: &mut [u8],
    launch: &mut GemmLaunch,
) -> Result<()> {
    let raw = GemmProblem {
        x: problem.x,
        w: problem.w,
        y: problem.y,
        m: problem.m as i64,
        n: problem.n as i64,
        k: problem.k as i64,
        ldy: problem.ldy as i64,
        sm_count,
        max_active_clusters,
        swizzle: if problem.m >= SWIZZLE_TOKENS {
            SWIZZLE
        } else {
            1
        },
        // Waiting GEMMs walk along N first, so the first tiles are those of the first rows:
        // the rows that are here already.
        raster: match problem.wait {
            Some(_) => abi::GEMM_RASTER_ALONG_N as i32,
            None => abi::GEMM_RASTER_HEURISTIC as i32,
        },
        wait: problem
            .wait
            .map_or(abi::GemmWait::default(), |w| abi::GemmWait {
                ready: w.ready,
                want: w.want,
                rows_per_chunk: w.rows_per_chunk as i64,
                row_offset: w.row_offset as i64,
                chunks: w.chunks as i32,
                own_chunk: w.own_chunk as i32,
            }),
    };
    // SAFETY: `encode` is the driver's cuTensorMapEncodeTiled (or, in tests, a function of
    // its signature); the buffers are valid for the sizes given.
    let status = unsafe {
        nvshmem_rs_gemm_sm90_prepare(
            encode as *const c_void,
            &raw,
            params.as_mut_ptr() as *mut c_void,
            params.len(),
            launch,
        )
    } as u32;
    let why = match status {
        abi::GEMM_OK => return Ok(()),
        abi::GEMM_PARAMS_TOO_SMALL => {
            format!("a parameter block of {} bytes is too small", params.len())
        }
        abi::GEMM_UNSUPPORTED => "CUTLASS's can_implement refused the problem".to_string(),
        abi::GEMM_NEEDS_WORKSPACE => "the kernel asks for a workspace".to_string(),
        abi::GEMM_ENCODE_FAILED => format!(
            "cuTensorMapEncodeTiled returned CUresult {}",
            launch.encode_status
        ),
        other => format!("unknown status {other}"),
    };
    Err(Error::InvalidArgument(format!(
        "preparing our CUTLASS GEMM for y ({} × {}, rows {} apart) = x ({} × {}) · wᵀ: {why}",
        problem.m, problem.n, problem.ldy, problem.m, problem.k
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Calls of the stand-in encoder, and the last one's global dimensions and strides.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    static FAIL: AtomicUsize = AtomicUsize::new(0);
    /// An encoded descriptor: its address, global dimensions and strides.
    type Encoded = (u64, Vec<u64>, Vec<u64>);
    static LAST: Mutex<Vec<Encoded>> = Mutex::new(Vec::new());

    /// cuTensorMapEncodeTiled's signature: records what CUTLASS asks for and writes a
    /// recognisable descriptor (the address in its first word).
    #[allow(clippy::too_many_arguments)]
    unsafe extern "C" fn fake_encode(
        map: *mut u64,
        _dtype: c_int,
        rank: u32,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        _box: *const u32,
        _element_strides: *const u32,
        _interleave: c_int,
        _swizzle: c_int,
        _promotion: c_int,
        _fill: c_int,
    ) -> c_int {
        CALLS.fetch_add(1, Ordering::SeqCst);
        let rank = rank as usize;
        let dims = std::slice::from_raw_parts(dims, rank).to_vec();
        let strides = std::slice::from_raw_parts(strides, rank.saturating_sub(1)).to_vec();
        LAST.lock().unwrap().push((address as u64, dims, strides));
        *map = address as u64;
        if FAIL.load(Ordering::SeqCst) != 0 {
            1 // CUDA_ERROR_INVALID_VALUE
        } else {
            0
        }
    }

    fn problem(m: usize, n: usize, k: usize, ldy: usize) -> Problem {
        Problem {
            x: 0x10_0000,
            w: 0x20_0000,
            y: 0x30_0000,
            m,
            n,
            k,
            ldy,
            wait: None,
        }
    }

    // One test, so the stand-in encoder's records are not shared between threads.
    #[test]
    fn the_host_code_prepares_blocks_that_match_the_problem() {
        let encode = fake_encode as *const () as usize;
        // SAFETY: a pure function.
        let size = unsafe { nvshmem_rs_gemm_sm90_params_size() };
        assert!(size > 3 * 128 && size < 4096, "{size}");
        let mut params = vec![0u8; size];
        let mut launch = GemmLaunch::default();
        let p = problem(1000, 4096, 512, 4104);
        LAST.lock().unwrap().clear();
        prepare(encode, &p, 132, 66, &mut params, &mut launch).unwrap();
        // Three descriptors: x (k × m), w (k × n) and y (n × m, rows ldy apart), innermost
        // first, strides in bytes.
        let calls = LAST.lock().unwrap().clone();
        let find = |addr: u64| calls.iter().find(|c| c.0 == addr).cloned();
        let (_, dims, strides) = find(p.x).expect("x was encoded");
        assert_eq!(
            (dims[0], dims[1], strides[0]),
            (512, 1000, 1024),
            "{dims:?} {strides:?}"
        );
        let (_, dims, strides) = find(p.w).expect("w was encoded");
        assert_eq!(
            (dims[0], dims[1], strides[0]),
            (512, 4096, 1024),
            "{dims:?} {strides:?}"
        );
        let (_, dims, strides) = find(p.y).expect("y was encoded");
        assert_eq!(
            (dims[0], dims[1], strides[0]),
            (4096, 1000, 8208),
            "{dims:?} {strides:?}"
        );
        // The descriptors are in the block.
        for addr in [p.x, p.w, p.y] {
            let found = params
                .chunks_exact(8)
                .any(|c| u64::from_le_bytes(c.try_into().unwrap()) == addr);
            assert!(found, "descriptor of {addr:#x} not in the parameter block");
        }
        // Persistent: at most one block per SM of those given (132), in whole clusters, 384
        // threads (a producer and two consumer warp groups), more than the 48 KiB of static
        // shared memory.
        let blocks = launch.grid[0] * launch.grid[1] * launch.grid[2];
        assert!((64..=132).contains(&blocks), "{:?}", launch.grid);
        assert_eq!(launch.cluster, [2, 1, 1]);
        assert_eq!(launch.grid[0] % 2, 0);
        assert_eq!(launch.block, [384, 1, 1]);
        assert!(launch.shared_mem_bytes > 48 << 10 && launch.shared_mem_bytes <= 227 << 10);

        // What a waiting GEMM waits for lands in the block whole, once; a plain GEMM's block
        // has no such record (its flag address is 0: no waits).
        let wait = ChunkWait {
            ready: 0x40_0000,
            want: 0x1234_5678_9abc,
            rows_per_chunk: 1030,
            row_offset: 2060,
            chunks: 3,
            own_chunk: 2,
        };
        let mut record = Vec::new();
        record.extend_from_slice(&wait.ready.to_le_bytes());
        record.extend_from_slice(&wait.want.to_le_bytes());
        record.extend_from_slice(&1030i64.to_le_bytes());
        record.extend_from_slice(&2060i64.to_le_bytes());
        record.extend_from_slice(&3i32.to_le_bytes());
        record.extend_from_slice(&2i32.to_le_bytes());
        assert_eq!(record.len(), std::mem::size_of::<abi::GemmWait>());
        let count = |block: &[u8]| block.windows(record.len()).filter(|w| *w == record).count();
        assert_eq!(count(&params), 0);
        let waiting = Problem {
            wait: Some(wait),
            ..p
        };
        let mut waiting_params = vec![0u8; size];
        prepare(encode, &waiting, 132, 66, &mut waiting_params, &mut launch).unwrap();
        assert_eq!(
            count(&waiting_params),
            1,
            "the wait record is not in the block"
        );

        // A block too small is refused before anything is written.
        let mut small = vec![0u8; size - 1];
        let e = prepare(encode, &p, 132, 66, &mut small, &mut launch).unwrap_err();
        assert!(e.to_string().contains("too small"), "{e}");
        // Rows that TMA cannot address: refused by CUTLASS, and by our own check first.
        let odd = problem(64, 64, 12, 64);
        let e = prepare(encode, &odd, 132, 66, &mut params, &mut launch).unwrap_err();
        assert!(e.to_string().contains("can_implement"), "{e}");
        assert!(unsupported(&odd).unwrap().contains("multiples of 8"));
        assert!(unsupported(&problem(64, 64, 16, 72)).is_none());
        assert!(unsupported(&problem(64, 64, 16, 68)).is_some());
        let misaligned = Problem {
            y: 0x30_0008,
            ..problem(64, 64, 16, 64)
        };
        assert!(unsupported(&misaligned).unwrap().contains("16-byte"));
        // A driver that refuses a descriptor is an error naming its code, not a silent block.
        FAIL.store(1, Ordering::SeqCst);
        let e = prepare(encode, &p, 132, 66, &mut params, &mut launch).unwrap_err();
        FAIL.store(0, Ordering::SeqCst);
        assert!(e.to_string().contains("CUresult 1"), "{e}");
        assert!(CALLS.load(Ordering::SeqCst) >= 6);
    }
}
