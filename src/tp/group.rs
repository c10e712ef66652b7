//! [`TensorParallel`]: what every layer of one tensor-parallel group shares.

use super::decode::{self, FusedDecode};
use super::exchange::stream_memops;
use super::norm;
use super::train::TrainKernels;
use super::{Gemm, ScheduleThresholds};
use crate::collectives::{Collectives, CollectivesConfig};
use crate::cubins::TP;
use crate::error::{Error, Result};
use crate::memory::DeviceMemory;
use crate::module::{grid, Function, KernelArgs, LaunchOptions, Module};
use crate::runtime::Nvshmem;
use crate::team::Team;
use cudarc::driver::CudaStream;
use half::bf16;
use std::sync::Arc;

/// The kernels of the tensor-parallel cubin that the layers look up (kernels/tp.cu).
pub fn kernel_names() -> [&'static str; 9] {
    [
        super::train::SILU_MUL_BACKWARD,
        super::train::RMSNORM_BACKWARD,
        SILU_MUL,
        SUM_SLABS,
        super::gemm::DECODE_KERNELS[0],
        super::gemm::DECODE_KERNELS[1],
        decode::KERNEL,
        norm::FUSED_KERNEL,
        norm::KERNEL,
    ]
}

const SILU_MUL: &str = "silu_mul_bf16";
const SUM_SLABS: &str = "sum_slabs_bf16";

/// What every layer of one tensor-parallel group shares: the runtime, the collectives, the
/// cuBLASLt handle and the element-wise kernels. Cheap to clone.
///
/// The layers of a group share one cuBLASLt workspace, and its overlapped and fused calls
/// share a second stream and a copy stream, so a group orders its calls: a call on another
/// stream than the last one waits for it on the device, and calls from several threads do
/// not interleave. The PEs must still make the calls that communicate in the same order.
/// Give work that should run at the same time a group of its own.
#[derive(Clone)]
pub struct TensorParallel {
    inner: Arc<Inner>,
    thresholds: ScheduleThresholds,
}

/// The residual add and RMSNorm after an all-reduce: fused with it, and alone (norm.rs).
pub(super) struct NormKernels {
    pub(super) fused: Function,
    pub(super) alone: Function,
}

struct Inner {
    shmem: Nvshmem,
    collectives: Arc<Collectives>,
    gemm: Gemm,
    silu_mul: Function,
    sum_slabs: Function,
    fused_decode: FusedDecode,
    norm: NormKernels,
    sms: u32,
    /// The backward pass's kernels.
    train: TrainKernels,
    /// This PE's place in the group.
    me: usize,
    /// Where overlapped schedules communicate.
    side: Arc<CudaStream>,
    /// The fused exchanges' copy stream, where the GPU takes the stream memory operations
    /// they signal with.
    pusher: Option<Arc<CudaStream>>,
}

impl TensorParallel {
    /// A group over every PE with a new [`Collectives`] of the default configuration
    /// (collective).
    pub fn new(shmem: &Nvshmem) -> Result<Self> {
        Self::with_collectives(shmem, Arc::new(Collectives::new(shmem)?))
    }

    /// A group over `team`'s PEs, with a new [`Collectives`] over it of the default
    /// configuration for its size (collective over the world). Every PE passes its own
    /// group's team, the groups all of one size (the rows of
    /// [`Team::split_2d`], say): layers allocate symmetric memory, so
    /// every PE builds the same layers, each group sharding over its own PEs.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::tp::TensorParallel;
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// // Two groups of 2 PEs on 4 GPUs: PEs 0 and 1, PEs 2 and 3.
    /// let (pair, _) = shmem.team_world().split_2d(2)?;
    /// let pair = pair.expect("every PE is in a row");
    /// let tp = TensorParallel::with_team(&shmem, &pair)?;
    /// assert_eq!(tp.n_pes(), 2);
    /// # Ok(()) }
    /// ```
    pub fn with_team(shmem: &Nvshmem, team: &Team) -> Result<Self> {
        let config = CollectivesConfig::for_pes(team.n_pes());
        let collectives = Collectives::with_team(shmem, Some(team), config)?;
        Self::with_collectives(shmem, Arc::new(collectives))
    }

    /// A group over the PEs of `collectives`' team (every PE for [`Collectives::new`]) that
    /// communicates through it (other code may share it: its calls are ordered by stream as
    /// usual). Its thresholds are [`ScheduleThresholds::for_pes`] of the group's PE count.
    /// Refused on a PE outside that team.
    pub fn with_collectives(shmem: &Nvshmem, collectives: Arc<Collectives>) -> Result<Self> {
        let me = collectives.my_pe().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "PE {} is not in the team of these Collectives: a tensor-parallel group is made \
                 on its team's PEs, and every PE must be in a group (split the world so that \
                 each is)",
                shmem.my_pe()
            ))
        })?;
        let module = Module::load(shmem, &TP)?;
        let gemm = Gemm::with_module(shmem, &module)?;
        let sms = shmem.sm_count()?;
        let fused_decode = FusedDecode::load(&module, &collectives, sms)?;
        let n = collectives.n_pes();
        let pusher = match stream_memops(shmem)? {
            true => Some(shmem.new_stream()?),
            false => None,
        };
        Ok(TensorParallel {
            inner: Arc::new(Inner {
                silu_mul: module.function(SILU_MUL)?,
                sum_slabs: module.function(SUM_SLABS)?,
                side: shmem.new_stream()?,
                pusher,
                shmem: shmem.clone(),
                collectives,
                gemm,
                fused_decode,
                norm: NormKernels {
                    fused: module.function(norm::FUSED_KERNEL)?,
                    alone: module.function(norm::KERNEL)?,
                },
                sms,
                train: TrainKernels::load(&module)?,
                me,
            }),
            thresholds: ScheduleThresholds::for_pes(n),
        })
    }

    /// This group with `thresholds` for [`Schedule::Auto`](super::Schedule::Auto). Layers take the thresholds of
    /// the group they are built from; every PE must set the same.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::tp::{ScheduleThresholds, TensorParallel};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let mut thresholds = ScheduleThresholds::for_pes(shmem.n_pes());
    /// thresholds.fused_sequence_min_elements = 2048 * 4096;
    /// let tp = TensorParallel::new(&shmem)?.with_thresholds(thresholds);
    /// # Ok(()) }
    /// ```
    pub fn with_thresholds(mut self, thresholds: ScheduleThresholds) -> Self {
        self.thresholds = thresholds;
        self
    }

    /// The thresholds of [`Schedule::Auto`](super::Schedule::Auto).
    pub fn thresholds(&self) -> &ScheduleThresholds {
        &self.thresholds
    }

    /// The runtime.
    pub fn runtime(&self) -> &Nvshmem {
        &self.inner.shmem
    }

    /// The collectives the layers communicate through.
    pub fn collectives(&self) -> &Collectives {
        &self.inner.collectives
    }

    /// The GEMMs the layers compute with.
    pub fn gemm(&self) -> &Gemm {
        &self.inner.gemm
    }

    /// Enqueue one layer call on `stream` after the group's last call (the layers share the
    /// GEMM workspace, their scratch and the side streams), with no other thread's call in
    /// between; the call's own GEMMs take the same order.
    pub(in crate::tp) fn ordered<R>(
        &self,
        stream: &Arc<CudaStream>,
        enqueue: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        self.inner.gemm.order.run(
            &self.inner.shmem,
            stream,
            "a tensor-parallel layer's call",
            enqueue,
        )
    }

    /// PEs in the group.
    pub fn n_pes(&self) -> usize {
        self.inner.collectives.n_pes()
    }

    /// This PE's place in the group.
    pub fn my_pe(&self) -> usize {
        self.inner.me
    }

    /// The stream on which overlapped schedules communicate.
    pub(super) fn side(&self) -> &Arc<CudaStream> {
        &self.inner.side
    }

    /// The fused exchanges' copy stream, whose copies to the peers run one after another
    /// (next PE first: side by side they shared the links badly); `None` where the GPU lacks
    /// 64-bit stream memory operations (the same on every PE of one node).
    pub(super) fn pusher(&self) -> Option<&Arc<CudaStream>> {
        self.inner.pusher.as_ref()
    }

    /// The fused decode kernel.
    pub(super) fn fused_decode(&self) -> &FusedDecode {
        &self.inner.fused_decode
    }

    pub(super) fn inner_norm(&self) -> &NormKernels {
        &self.inner.norm
    }

    pub(super) fn train(&self) -> &TrainKernels {
        &self.inner.train
    }

    /// SMs of this PE's GPU.
    pub(super) fn sm_count(&self) -> u32 {
        self.inner.sms
    }

    /// `out[r][j] = silu(gu[r][j]) * gu[r][f + j]`, in f32 rounded once to bf16: `gu` holds
    /// `tokens` rows of gate features then as many up features (`tokens × 2f`), `out` is
    /// `tokens × f`, both row-major. The kernel between [`TpMlp`](super::TpMlp)'s GEMMs, for MLPs built
    /// from the parts. It is launched with programmatic stream serialization: it waits for
    /// the kernel before it on `stream` and lets the next one start its launch, so that a
    /// decode GEMM after it ([`GemmPath::Decode`](super::GemmPath::Decode)) starts at once.
    pub fn silu_mul(
        &self,
        out: &impl DeviceMemory<bf16>,
        gu: &impl DeviceMemory<bf16>,
        tokens: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let f = out.device_len().checked_div(tokens).unwrap_or(0);
        if out.device_len() != tokens * f || gu.device_len() != 2 * tokens * f {
            return Err(Error::InvalidArgument(format!(
                "silu_mul of {tokens} tokens: the output has {} elements and the gate/up input \
                 {}; they must be tokens × f and tokens × 2f",
                out.device_len(),
                gu.device_len()
            )));
        }
        // SAFETY: the lengths were checked.
        unsafe {
            self.silu_mul_raw(
                out.device_addr(stream),
                gu.device_addr(stream),
                tokens,
                f,
                stream,
            )
        }
    }

    /// [`silu_mul`](Self::silu_mul) on addresses.
    ///
    /// # Safety
    /// Both must hold that many elements of this PE's GPU until the kernel has run.
    pub(crate) unsafe fn silu_mul_raw(
        &self,
        out: u64,
        gu: u64,
        m: usize,
        f: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        // As the kernel chooses its path (tp.cu).
        let vectors = f.is_multiple_of(8) && (gu | out).is_multiple_of(16);
        let work = if vectors { m * f / 8 } else { m * f };
        if work == 0 {
            return Ok(());
        }
        let mut args = KernelArgs::new();
        args.device_ptr(gu)
            .device_ptr(out)
            .value(m as u64)
            .value(f as u64);
        // Programmatic: it waits for the kernel before it, then lets the next one (the down
        // projection's decode GEMM or fused decode kernel) start its launch (kernels/tp.cu).
        let options = LaunchOptions {
            programmatic: true,
            ..LaunchOptions::default()
        };
        self.inner
            .silu_mul
            .launch_with(self.spread(work), options, stream, &mut args)
    }

    /// `dst[i] = Σ over s < slabs of slab s's element i` for `i < len`, where slab `s` is
    /// `src + s × stride` except slab `own.0`, which is `own.1` (a PE's own partial product
    /// where its GEMM left it), in f32 in slab order, rounded once to bf16 (as the
    /// reduce-scatter of our collectives sums the PEs' values).
    ///
    /// # Safety
    /// `src` holds `(slabs - 1) × stride + len`, `own.1` and `dst` `len` elements of this
    /// PE's GPU until the kernel has run, with `stride >= len`.
    pub(crate) unsafe fn sum_slabs_raw(
        &self,
        dst: u64,
        (src, own): (u64, (usize, u64)),
        (len, slabs, stride): (usize, usize, usize),
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let work = if len % 8 == 0 { len / 8 } else { len };
        let mut args = KernelArgs::new();
        args.device_ptr(src)
            .device_ptr(own.1)
            .device_ptr(dst)
            .value(len as u64)
            .value(slabs as u32)
            .value(stride as u64)
            .value(own.0 as u32);
        self.inner
            .sum_slabs
            .launch(self.spread(work), stream, &mut args)
    }

    /// A grid for `work` independent pieces of 256 threads' work, at most 8 blocks per SM.
    fn spread(&self, work: usize) -> cudarc::driver::LaunchConfig {
        let threads = 256;
        grid(
            work.div_ceil(threads).min(self.inner.sms as usize * 8) as u32,
            threads as u32,
        )
    }
}
