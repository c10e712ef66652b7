//! Device-initiated all-reduce and all-gather over NVLink (our kernels). In progress: the
//! signatures are final, the bodies land with kernels/collectives.cu.

use crate::buffer::SymmetricBuffer;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::runtime::Nvshmem;
use cudarc::driver::CudaStream;

/// All-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllReduceAlgo {
    /// Chosen by size and PE count.
    Auto,
    /// Every PE pushes its input to every peer, then reduces locally (small messages).
    OneShot,
    /// Reduce-scatter, then all-gather (medium messages).
    TwoShot,
    /// Pull-based reduce-scatter and push all-gather over all SMs (large messages).
    Bandwidth,
}

/// All-gather algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllGatherAlgo {
    /// Chosen by size and PE count.
    Auto,
    /// One-shot push with signals (small messages).
    OneShot,
    /// Push over all SMs (large messages).
    Bandwidth,
}

/// Our all-reduce and all-gather kernels over the world team.
pub struct Collectives {
    _shmem: Nvshmem,
}

impl Collectives {
    /// Load the kernels and allocate their symmetric workspace (collective).
    pub fn new(shmem: &Nvshmem) -> Result<Self> {
        Ok(Collectives { _shmem: shmem.clone() })
    }

    /// `dst[i] = op(src[i] on every PE)`; `src` and `dst` may be the same buffer.
    pub fn all_reduce<T: Element>(&self, _op: ReduceOp, _src: &SymmetricBuffer<T>, _dst: &SymmetricBuffer<T>, _algo: AllReduceAlgo, _stream: &CudaStream) -> Result<()> {
        Err(Error::InvalidArgument("all_reduce: not yet implemented".into()))
    }

    /// `dst[pe * n .. (pe + 1) * n] = src on PE pe`, with `n = src.len()`.
    pub fn all_gather<T: Element>(&self, _src: &SymmetricBuffer<T>, _dst: &SymmetricBuffer<T>, _algo: AllGatherAlgo, _stream: &CudaStream) -> Result<()> {
        Err(Error::InvalidArgument("all_gather: not yet implemented".into()))
    }
}
