//! Data-parallel gradient sync: every parameter's gradient in one symmetric buffer, cut into
//! buckets, each all-reduced on a side stream as soon as the backward pass has written it,
//! so that the communication runs under the rest of the backward pass.
//!
//! A step: the backward pass writes each parameter's gradient into [`GradientSync::grad`]
//! and calls [`ready`](GradientSync::ready) after it on its stream, last layer first; a
//! bucket whose parameters are all ready is all-reduced at once on the side stream (it waits,
//! on the device, for what the backward stream held when the bucket filled).
//! [`wait`](GradientSync::wait) makes the backward stream wait for every bucket's sum. No
//! host synchronisation anywhere, so a whole step can be captured in a CUDA graph.

use crate::collectives::algo::type_and_op;
use crate::collectives::{AllReduceAlgo, Collectives, Compression};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::{SetUp, SymmetricBuffer, SymmetricView};
use crate::order::join;
use crate::runtime::Nvshmem;
use cudarc::driver::CudaStream;
use std::ops::Range;
use std::sync::Arc;

/// The bucket size of PyTorch's DistributedDataParallel, the default here.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// How a [`GradientSync`] cuts and sums the gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GradSyncConfig {
    /// Bytes of gradient per bucket, at least: a bucket takes parameters (from the last one
    /// back) until it holds this much; a parameter is never split.
    pub bucket_bytes: usize,
    /// All-reduce each bucket compressed ([`Collectives::all_reduce_compressed`], with error
    /// feedback kept here), for f32 and bf16 gradients; `None`: summed exactly as
    /// [`Collectives::all_reduce`] sums.
    pub compression: Option<Compression>,
}

impl GradSyncConfig {
    /// Buckets of `bucket_bytes`, summed exactly (no compression).
    ///
    /// ```
    /// let config = nvshmem::GradSyncConfig::buckets_of(4 << 20);
    /// assert_eq!((config.bucket_bytes, config.compression), (4 << 20, None));
    /// ```
    pub fn buckets_of(bucket_bytes: usize) -> Self {
        GradSyncConfig {
            bucket_bytes,
            compression: None,
        }
    }
}

impl Default for GradSyncConfig {
    fn default() -> Self {
        GradSyncConfig::buckets_of(DEFAULT_BUCKET_BYTES)
    }
}

/// Where each parameter's gradient sits (element ranges, each on 16 bytes) and how many
/// elements the buffer holds.
fn layout(param_lens: &[usize], elem_bytes: usize) -> (Vec<Range<usize>>, usize) {
    let per16 = (16 / elem_bytes).max(1);
    let mut at = 0;
    let ranges = param_lens
        .iter()
        .map(|&n| {
            let r = at..at + n;
            at += n.div_ceil(per16) * per16;
            r
        })
        .collect();
    (ranges, at)
}

/// The buckets (ranges of parameter indices) in the order the backward pass fills them: from
/// the last parameter back, each taking parameters until it holds `bucket_bytes`.
fn buckets(param_lens: &[usize], elem_bytes: usize, bucket_bytes: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut hi, mut bytes) = (param_lens.len(), 0usize);
    for i in (0..param_lens.len()).rev() {
        bytes += param_lens[i] * elem_bytes;
        if bytes >= bucket_bytes || i == 0 {
            out.push(i..hi);
            (hi, bytes) = (i, 0);
        }
    }
    out
}

/// The elements of the gradient buffer that the parameters `ps` span (zeros between them).
fn span(params: &[Range<usize>], ps: &Range<usize>) -> Range<usize> {
    params[ps.start].start..params[ps.end - 1].end
}

/// One bucket: its parameters, its elements of the gradient buffer, and its part of the
/// error feedback (compressed).
#[derive(Debug, Clone)]
struct Bucket {
    params: Range<usize>,
    elems: Range<usize>,
    feedback: Range<usize>,
}

/// Bucketed, overlapped data-parallel gradient sync over the PEs of its [`Collectives`]'
/// team (every PE for [`Collectives::new`], the data-parallel replicas for
/// [`Collectives::with_team`]; see the module [`grad_sync`](self)): after a step every PE
/// of the team holds the sum of the team's gradients, the same bits on each. Divide by the
/// team's PE count in the update (fold it into the learning rate) to average.
///
/// Creating one is collective over the world (it allocates symmetric memory), with the same
/// parameters on every PE. The PEs of a team make the same calls in the same order.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// use nvshmem::grad_sync::{GradSyncConfig, GradientSync};
/// use nvshmem::{bf16, Collectives};
/// let shmem = nvshmem::Nvshmem::init()?;
/// let coll = Collectives::new(&shmem)?;
/// let params = [4096 * 4096, 4096, 4096 * 4096, 4096];
/// let config = GradSyncConfig::buckets_of(8 << 20);
/// let mut sync = GradientSync::<bf16>::new(&shmem, &coll, &params, config)?;
/// let stream = shmem.stream();
/// for p in (0..params.len()).rev() {
///     // ... the backward pass writes the gradient of parameter p into sync.grad(p) ...
///     sync.ready(p, stream)?;
/// }
/// sync.wait(stream)?; // stream's later work sees every PE's summed gradients
/// # Ok(()) }
/// ```
pub struct GradientSync<'c, T: Element> {
    coll: &'c Collectives,
    grads: SymmetricBuffer<T>,
    params: Vec<Range<usize>>,
    buckets: Vec<Bucket>,
    bucket_of: Vec<usize>,
    compression: Option<Compression>,
    feedback: Option<SymmetricBuffer<f32>>,
    side: Arc<CudaStream>,
    /// This step: parameters not yet ready per bucket (0: the bucket went), and which are.
    waiting: Vec<usize>,
    marked: Vec<bool>,
}

impl<'c, T: Element> GradientSync<'c, T> {
    /// Gradients for parameters of `param_lens` elements (in the forward order), summed by
    /// `coll` (collective): f32, f16, bf16 or i32, or f32 and bf16 with a compression. With a
    /// compression, `coll`'s workspace must hold its largest bucket:
    /// [`compressed_workspace_bytes`](Self::compressed_workspace_bytes).
    pub fn new(
        shmem: &Nvshmem,
        coll: &'c Collectives,
        param_lens: &[usize],
        config: GradSyncConfig,
    ) -> Result<Self> {
        if config.bucket_bytes == 0 {
            return Err(Error::InvalidArgument(
                "GradSyncConfig::bucket_bytes must be at least 1 (25 MiB is the default)".into(),
            ));
        }
        match config.compression {
            Some(c) => c.check(T::DTYPE)?,
            None => {
                type_and_op::<T>(ReduceOp::Sum, "gradient sync", "all_reduce")?;
            }
        }
        let n = coll.n_pes();
        let elem = std::mem::size_of::<T>();
        let (params, total) = layout(param_lens, elem);
        let mut bucket_of = vec![0; param_lens.len()];
        let mut fb_at = 0;
        let mut out = Vec::new();
        for (b, ps) in buckets(param_lens, elem, config.bucket_bytes)
            .into_iter()
            .enumerate()
        {
            bucket_of[ps.clone()].fill(b);
            let elems = span(&params, &ps);
            let fb = config
                .compression
                .map_or(0, |c| c.feedback_len(elems.len(), n));
            out.push(Bucket {
                params: ps,
                elems,
                feedback: fb_at..fb_at + fb,
            });
            fb_at += fb;
        }
        if let Some(c) = config.compression {
            let need = Self::compressed_workspace_bytes(param_lens, config, n);
            let have = coll.workspace().compressed_bytes;
            if need > have {
                return Err(Error::InvalidArgument(format!(
                    "a GradientSync with {c} buckets needs {need} bytes of compressed \
                     workspace, the Collectives has {have}: set \
                     CollectivesConfig::workspace.compressed_bytes to \
                     GradientSync::compressed_workspace_bytes"
                )));
            }
        }
        let grads = shmem.calloc::<T>(total.max(1))?;
        let feedback = match config.compression {
            // The feedback's length depends on the team's size: every PE allocates the
            // largest (the allocation is symmetric over the world).
            Some(_) => {
                let all = shmem.set_up_gather(SetUp::GradientSync, fb_at as u64)?;
                let room = all.into_iter().max().unwrap_or(0) as usize;
                Some(shmem.calloc::<f32>(room.max(1))?)
            }
            None => None,
        };
        let waiting = out.iter().map(|b| b.params.len()).collect();
        Ok(GradientSync {
            coll,
            grads,
            marked: vec![false; params.len()],
            params,
            buckets: out,
            bucket_of,
            compression: config.compression,
            feedback,
            side: shmem.new_stream()?,
            waiting,
        })
    }

    /// The [`Workspace::compressed_bytes`](crate::collectives::Workspace::compressed_bytes)
    /// a sync of these parameters with `config`'s compression needs on `n_pes` PEs (0
    /// without one).
    pub fn compressed_workspace_bytes(
        param_lens: &[usize],
        config: GradSyncConfig,
        n_pes: usize,
    ) -> usize {
        // A compression the type cannot take needs nothing (`new` refuses it).
        let Some(c) = config.compression.filter(|c| c.check(T::DTYPE).is_ok()) else {
            return 0;
        };
        let elem = std::mem::size_of::<T>();
        let (params, _) = layout(param_lens, elem);
        buckets(param_lens, elem, config.bucket_bytes.max(1))
            .into_iter()
            .map(|ps| c.workspace_bytes(span(&params, &ps).len(), n_pes))
            .max()
            .unwrap_or(0)
    }

    /// Where the backward pass writes parameter `p`'s gradient (and where its sum is after
    /// [`wait`](Self::wait)).
    pub fn grad(&self, p: usize) -> SymmetricView<'_, T> {
        self.grads.view(self.params[p].clone())
    }

    /// Every gradient, end to end (each parameter's on 16 bytes, zeros between).
    pub fn grads(&self) -> &SymmetricBuffer<T> {
        &self.grads
    }

    /// The buckets, as ranges of parameter indices, in the order the backward pass fills
    /// them (the last parameters first).
    pub fn buckets(&self) -> Vec<Range<usize>> {
        self.buckets.iter().map(|b| b.params.clone()).collect()
    }

    /// The stream the buckets are summed on.
    pub fn side_stream(&self) -> &Arc<CudaStream> {
        &self.side
    }

    /// Parameter `p`'s gradient is complete once `stream`'s work so far is done. When this
    /// completes its bucket, the bucket is all-reduced on the side stream after that work.
    pub fn ready(&mut self, p: usize, stream: &Arc<CudaStream>) -> Result<()> {
        self.mark(p)?;
        let b = self.bucket_of[p];
        self.waiting[b] -= 1;
        if self.waiting[b] == 0 {
            join(&self.side, stream)?;
            self.launch(&[b])?;
        }
        Ok(())
    }

    /// Every parameter not yet ready is, after `stream`'s work so far: the buckets left are
    /// all-reduced together (grouped calls, [`Collectives::all_reduce_group`], unless
    /// compressed). With no [`ready`](Self::ready) before it, this is the whole sync at
    /// once, as after a backward pass that did not overlap it.
    pub fn ready_all(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let left: Vec<usize> = (0..self.buckets.len())
            .filter(|&b| self.waiting[b] > 0)
            .collect();
        self.marked.fill(true);
        for &b in &left {
            self.waiting[b] = 0;
        }
        if left.is_empty() {
            return Ok(());
        }
        join(&self.side, stream)?;
        self.launch(&left)
    }

    /// `stream` waits, on the device, for every bucket's sum; the step ends, and the next
    /// one starts with no parameter ready. An `Err` if a parameter was never marked ready.
    pub fn wait(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        if let Some(p) = self.marked.iter().position(|&m| !m) {
            return Err(Error::InvalidArgument(format!(
                "GradientSync::wait: parameter {p}'s gradient was never marked ready this \
                 step (call ready for every parameter, or ready_all)"
            )));
        }
        join(stream, &self.side)?;
        self.marked.fill(false);
        for (w, b) in self.waiting.iter_mut().zip(&self.buckets) {
            *w = b.params.len();
        }
        Ok(())
    }

    /// [`ready_all`](Self::ready_all) then [`wait`](Self::wait): every gradient summed, with
    /// no overlap.
    pub fn sync(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.ready_all(stream)?;
        self.wait(stream)
    }

    fn mark(&mut self, p: usize) -> Result<()> {
        match self.marked.get(p) {
            None => Err(Error::InvalidArgument(format!(
                "GradientSync::ready: parameter {p} of {}",
                self.params.len()
            ))),
            Some(true) => Err(Error::InvalidArgument(format!(
                "GradientSync::ready: parameter {p} is already ready this step (wait ends a \
                 step)"
            ))),
            Some(false) => {
                self.marked[p] = true;
                Ok(())
            }
        }
    }

    /// All-reduce buckets `bs` on the side stream (which already waits for their data).
    fn launch(&self, bs: &[usize]) -> Result<()> {
        let side = &self.side;
        match (self.compression, self.feedback.as_ref()) {
            (Some(c), Some(fb)) => {
                for &b in bs {
                    let bucket = &self.buckets[b];
                    let view = self.grads.view(bucket.elems.clone());
                    let mut carry = fb.view(bucket.feedback.clone());
                    self.coll
                        .all_reduce_compressed(&view, &view, c, Some(&mut carry), side)?;
                }
                Ok(())
            }
            _ => {
                let views: Vec<SymmetricView<'_, T>> = bs
                    .iter()
                    .map(|&b| self.grads.view(self.buckets[b].elems.clone()))
                    .collect();
                self.coll
                    .all_reduce_group(&views, &views, ReduceOp::Sum, AllReduceAlgo::Auto, side)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_fill_from_the_last_parameter_back() {
        // 4-byte elements (40, 120, 20, 80 and 4 bytes), buckets of at least 100 bytes.
        let lens = [10, 30, 5, 20, 1];
        assert_eq!(buckets(&lens, 4, 100), [2..5, 1..2, 0..1]);
        // One bucket when it all fits; one per parameter when each is large enough.
        assert_eq!(buckets(&lens, 4, 1 << 20), vec![0..lens.len()]);
        assert_eq!(buckets(&lens, 4, 1), [4..5, 3..4, 2..3, 1..2, 0..1]);
        assert!(buckets(&[], 4, 100).is_empty());
        // Every parameter in exactly one bucket.
        for bytes in [1, 7, 40, 120, 300] {
            let mut all: Vec<usize> = buckets(&lens, 2, bytes).into_iter().flatten().collect();
            all.sort();
            assert_eq!(all, (0..lens.len()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn gradients_sit_on_16_bytes() {
        let (ranges, total) = layout(&[3, 8, 1], 2);
        assert_eq!(ranges, [0..3, 8..16, 16..17]);
        assert_eq!(total, 24);
        let (ranges, total) = layout(&[5, 4], 4);
        assert_eq!(ranges, [0..5, 8..12]);
        assert_eq!(total, 12);
    }
}
