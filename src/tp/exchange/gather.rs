//! The sequence-parallel column layer's fused all-gather + GEMM: each PE's rows go to every
//! peer by the copy engines, a flag following each copy, while this PE multiplies its own
//! rows; then it multiplies each peer's rows once that peer's flag is up.

use super::flags::ChunkFlags;
use crate::error::{CudaResultExt, Result};
use crate::tp::join;
use cudarc::driver::{result, CudaStream};
use std::sync::Arc;

/// One fused all-gather + GEMM call of `rows` tokens per PE.
pub(in crate::tp) struct GatherCall<'a> {
    pub flags: &'a ChunkFlags,
    /// Where the gathered rows lie on every PE, as mapped here.
    pub gathered: &'a [u64],
    /// The copy stream.
    pub pusher: &'a Arc<CudaStream>,
    pub stream: &'a Arc<CudaStream>,
    /// Tokens per PE.
    pub rows: usize,
    /// Bytes of one row of the input and of the output.
    pub row_bytes: (usize, usize),
}

impl GatherCall<'_> {
    /// Gathers `x` (this PE's rows) to every peer and multiplies every PE's rows into `y`,
    /// by `gemm(y_rows, x_rows, rows)` on the call's stream.
    ///
    /// # Safety
    /// `x` holds this PE's rows and `y` every PE's rows of output; the gathered buffer holds
    /// every PE's rows on every PE.
    pub(in crate::tp) unsafe fn run(
        &self,
        y: u64,
        x: u64,
        gemm: impl Fn(u64, u64, usize) -> Result<()>,
    ) -> Result<()> {
        let (flags, stream, pusher, rows) = (self.flags, self.stream, self.pusher, self.rows);
        let me = flags.me();
        let (in_row, out_row) = self.row_bytes;
        let bytes = rows * in_row;
        let mine = (me * bytes) as u64;
        flags.open(stream)?;
        // This PE's rows to every peer, one after another on the copy stream after what
        // `stream` holds (the input and the credits). Every peer's flag is raised even after
        // a failure, so that no peer waits for ever (its output is then wrong, and this call
        // returns the error).
        let mut sent = join(pusher, stream);
        for peer in flags.peers() {
            sent = sent.and_then(|()| {
                flags.take_credit(pusher, peer)?;
                let to = self.gathered[peer] + mine;
                result::memcpy_dtod_async(to, x, bytes, pusher.cu_stream())
                    .during("cuMemcpyDtoDAsync")
            });
            sent = sent.and(flags.raise(pusher, peer));
        }
        let at = |pe: usize| {
            let first = pe * rows;
            let x_rows = self.gathered[me] + (first * in_row) as u64;
            (y + (first * out_row) as u64, x_rows)
        };
        let multiply = || -> Result<()> {
            gemm(at(me).0, x, rows)?;
            flags.peers().try_for_each(|peer| {
                flags.wait_from(stream, peer)?;
                let (y_rows, x_rows) = at(peer);
                gemm(y_rows, x_rows, rows)
            })
        };
        // Closed even after a failure, and the copy stream joined: what follows on `stream`
        // may overwrite `x`, and a capture stays whole.
        let ran = sent.and_then(|()| multiply()).and(flags.close(stream));
        ran.and(join(stream, pusher)).and(flags.watch(stream))
    }
}
