//! The buffers of one token count: the input, the local work's scratch and every
//! implementation's output.

use super::TpImpl;
use crate::cli::TpLayout;
use crate::error::{Guard, Result};
use half::bf16;
use nvshmem::{DeviceBuffer, Nvshmem, SymmetricBuffer};

/// The local work's buffers: gate and up (`M × 2f`), SiLU(gate)·up (`M × f`) and the down
/// projection (`M × hidden`).
pub(super) struct Scratch {
    pub(super) gu: Guard<DeviceBuffer<bf16>>,
    pub(super) act: Guard<DeviceBuffer<bf16>>,
    pub(super) out: Guard<DeviceBuffer<bf16>>,
}

/// The input and each implementation's buffers, for one token count.
pub(super) struct Buffers {
    /// Every token (`M × hidden`).
    pub(super) x: Guard<DeviceBuffer<bf16>>,
    /// Sequence parallel: this PE's tokens (`M / PEs × hidden`).
    pub(super) mine: Option<Guard<SymmetricBuffer<bf16>>>,
    /// compute-only's: its output is `out`, this PE's partial product.
    pub(super) compute: Scratch,
    /// cublas-only's, the same.
    pub(super) cublas: Option<Scratch>,
    /// cublas+nccl's local work, and the all-reduced output (sequence parallel: this PE's
    /// reduce-scattered rows).
    pub(super) nccl: Option<(Scratch, Guard<DeviceBuffer<bf16>>)>,
    /// Sequence parallel, cublas+nccl's all-gathered input (`M × hidden`).
    pub(super) nccl_gathered: Option<Guard<DeviceBuffer<bf16>>>,
    /// cublas+ours's output (TpMlp keeps its own scratch).
    pub(super) ours: Option<Guard<SymmetricBuffer<bf16>>>,
    /// overlapped's output.
    pub(super) overlapped: Option<Guard<SymmetricBuffer<bf16>>>,
    /// fused's output.
    pub(super) fused: Option<Guard<SymmetricBuffer<bf16>>>,
    /// cublasmp's gate and up, SiLU(gate)·up, and output (this PE's rows in sequence
    /// parallelism).
    pub(super) cublasmp: Option<Scratch>,
}

impl Buffers {
    /// Allocates symmetric memory when cublas+ours is in `active`, or in sequence
    /// parallelism: collective.
    pub(super) fn new(
        shmem: &Nvshmem,
        active: &[TpImpl],
        layout: TpLayout,
        m: usize,
        f: usize,
        hidden: usize,
    ) -> Result<Self> {
        let sequence = layout == TpLayout::Sequence;
        // The output of each forward: every token, or this PE's.
        let out_len = match sequence {
            true => m / shmem.n_pes() * hidden,
            false => m * hidden,
        };
        let dev = |len: usize| -> Result<Guard<DeviceBuffer<bf16>>> {
            Ok(Guard::new(shmem.alloc_device::<bf16>(len)?))
        };
        let scratch = || -> Result<Scratch> {
            Ok(Scratch {
                gu: dev(m * 2 * f)?,
                act: dev(m * f)?,
                out: dev(m * hidden)?,
            })
        };
        // The collective allocations first: a PE that then fails a local one leaves no other
        // PE waiting in a collective one.
        let mine = match sequence {
            true => Some(Guard::new(shmem.malloc::<bf16>(out_len)?)),
            false => None,
        };
        let output = |imp| -> Result<_> {
            Ok(match active.contains(&imp) {
                true => Some(Guard::new(shmem.malloc::<bf16>(out_len)?)),
                false => None,
            })
        };
        let ours = output(TpImpl::CublasOurs)?;
        let overlapped = output(TpImpl::Overlapped)?;
        let fused = output(TpImpl::Fused)?;
        let nccl = active.contains(&TpImpl::CublasNccl);
        let cublasmp = match active.contains(&TpImpl::Cublasmp) {
            true => Some(Scratch {
                gu: dev(m * 2 * f)?,
                act: dev(m * f)?,
                out: dev(out_len)?,
            }),
            false => None,
        };
        Ok(Buffers {
            x: dev(m * hidden)?,
            mine,
            compute: scratch()?,
            cublas: match active.contains(&TpImpl::CublasOnly) {
                true => Some(scratch()?),
                false => None,
            },
            nccl: match nccl {
                true => Some((scratch()?, dev(out_len)?)),
                false => None,
            },
            nccl_gathered: match nccl && sequence {
                true => Some(dev(m * hidden)?),
                false => None,
            },
            ours,
            overlapped,
            fused,
            cublasmp,
        })
    }

    /// Where `imp` leaves its output: device address and bytes.
    pub(super) fn output(&self, imp: TpImpl) -> Option<(u64, usize)> {
        match imp {
            TpImpl::ComputeOnly => Some((self.compute.out.addr(), self.compute.out.num_bytes())),
            TpImpl::CublasOnly => self
                .cublas
                .as_ref()
                .map(|s| (s.out.addr(), s.out.num_bytes())),
            TpImpl::CublasNccl => self
                .nccl
                .as_ref()
                .map(|(_, out)| (out.addr(), out.num_bytes())),
            TpImpl::CublasOurs => self.ours.as_ref().map(|y| (y.addr(), y.num_bytes())),
            TpImpl::Overlapped => self.overlapped.as_ref().map(|y| (y.addr(), y.num_bytes())),
            TpImpl::Fused => self.fused.as_ref().map(|y| (y.addr(), y.num_bytes())),
            TpImpl::Cublasmp => self
                .cublasmp
                .as_ref()
                .map(|s| (s.out.addr(), s.out.num_bytes())),
        }
    }

    /// `imp`'s output (the stream must be idle).
    pub(super) fn read(&self, imp: TpImpl) -> Result<Vec<bf16>> {
        let out = match imp {
            TpImpl::ComputeOnly => Some(self.compute.out.to_vec()?),
            TpImpl::CublasOnly => self.cublas.as_ref().map(|s| s.out.to_vec()).transpose()?,
            TpImpl::CublasNccl => self.nccl.as_ref().map(|(_, o)| o.to_vec()).transpose()?,
            TpImpl::CublasOurs => self.ours.as_ref().map(|y| y.to_vec()).transpose()?,
            TpImpl::Overlapped => self.overlapped.as_ref().map(|y| y.to_vec()).transpose()?,
            TpImpl::Fused => self.fused.as_ref().map(|y| y.to_vec()).transpose()?,
            TpImpl::Cublasmp => self.cublasmp.as_ref().map(|s| s.out.to_vec()).transpose()?,
        };
        Ok(out.unwrap_or_default())
    }
}
