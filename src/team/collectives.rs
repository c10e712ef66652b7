//! NVSHMEM's own collectives over a [`Team`], enqueued on a CUDA stream: all-reduce,
//! reduce-scatter, all-gather (NVSHMEM's fcollect), broadcast and all-to-all.
//!
//! Every PE of the team calls the same collective with the same lengths (and root); the call
//! returns once the work is enqueued, and the results are in `dst` for the work after it on
//! the stream. Sources and destinations are symmetric views (a `&SymmetricBuffer` converts).
//! Lengths are checked against the team's size before anything is enqueued:
//!
//! | collective | `src.len()` | `dst.len()` |
//! |---|---|---|
//! | [`all_reduce`](Team::all_reduce) | `n` | `n` |
//! | [`reduce_scatter`](Team::reduce_scatter) | `n * team.n_pes()` | `n` |
//! | [`all_gather`](Team::all_gather) (`fcollect`) | `n` | `n * team.n_pes()` |
//! | [`broadcast`](Team::broadcast) | `n` | `n` |
//! | [`all_to_all`](Team::all_to_all) | `n * team.n_pes()` | `n * team.n_pes()` |
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::ReduceOp;
//! let shmem = nvshmem::Nvshmem::init()?;
//! let world = shmem.team_world();
//! let stream = shmem.new_stream()?;
//! let src = shmem.malloc::<f32>(1 << 20)?;
//! let sum = shmem.malloc::<f32>(1 << 20)?;
//! src.copy_from_host(&vec![1.0; 1 << 20])?;
//! world.all_reduce(&sum, &src, ReduceOp::Sum, &stream)?;
//! stream.synchronize().unwrap();
//! assert_eq!(sum.to_vec()?[0], shmem.n_pes() as f32);
//! # Ok(()) }
//! ```

use super::Team;
use crate::element::{bitwise_on_float, Element, Exchange, ReduceOp, Reduction};
use crate::error::{check, Error, Result};
use crate::memory::{check_len, SymmetricView};
use cudarc::driver::CudaStream;
use nvshmem_sys as sys;
use std::sync::Arc;

/// The variable that sizes NVSHMEM's reduction scratch.
pub const REDUCE_SCRATCH_VARIABLE: &str = "NVSHMEM_REDUCE_SCRATCH_SIZE";
/// NVSHMEM's reduction scratch in bytes when the variable is not set.
pub const REDUCE_SCRATCH_DEFAULT: usize = 1 << 19;

/// The bytes of reduction scratch that `NVSHMEM_REDUCE_SCRATCH_SIZE` (`value`; `None`: not
/// set) gives, read as NVSHMEM reads sizes: a number, possibly with a fraction, then
/// optionally a K, M, G or T multiplier (powers of 1024; what follows it is ignored), rounded
/// up. `None` for a value NVSHMEM would not take.
pub fn reduce_scratch_bytes(value: Option<&str>) -> Option<usize> {
    let Some(text) = value else {
        return Some(REDUCE_SCRATCH_DEFAULT);
    };
    let text = text.trim_start();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, rest) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let shift = match rest.chars().next() {
        None => 0,
        Some('k' | 'K') => 10,
        Some('m' | 'M') => 20,
        Some('g' | 'G') => 30,
        Some('t' | 'T') => 40,
        Some(_) => return None,
    };
    let bytes = (value * (1u64 << shift) as f64).ceil();
    (bytes.is_finite() && bytes <= usize::MAX as f64).then_some(bytes as usize)
}

/// The largest reduce-scatter input (bytes per PE) NVSHMEM's on-stream reduce-scatter takes
/// with `scratch` bytes of reduction scratch on `n_pes` PEs: it stages the whole input in
/// half of the scratch, and stops the kernel when it does not fit (a team of one only
/// copies).
pub fn reduce_scatter_max_bytes(scratch: usize, n_pes: usize) -> usize {
    if n_pes <= 1 {
        usize::MAX
    } else {
        scratch / 2
    }
}

/// A reduce-scatter of `bytes` of input on `n_pes` PEs refused, with what to set, where
/// NVSHMEM would stop the kernel (this PE's `NVSHMEM_REDUCE_SCRATCH_SIZE`).
pub(crate) fn check_reduce_scatter_scratch(bytes: usize, n_pes: usize) -> Result<()> {
    let value = std::env::var(REDUCE_SCRATCH_VARIABLE).ok();
    let Some(scratch) = reduce_scratch_bytes(value.as_deref()) else {
        return Err(Error::InvalidArgument(format!(
            "{REDUCE_SCRATCH_VARIABLE}={} is not a size NVSHMEM reads (a number, then K, M, G \
             or T)",
            value.unwrap_or_default()
        )));
    };
    let max = reduce_scatter_max_bytes(scratch, n_pes);
    if bytes > max {
        return Err(Error::InvalidArgument(format!(
            "a reduce-scatter of {bytes} input bytes per PE: NVSHMEM's stages the whole input \
             in half of its reduction scratch ({scratch} bytes here) and would stop the kernel; \
             set {REDUCE_SCRATCH_VARIABLE} to at least {} on every PE (NVSHMEM reserves it for \
             each of NVSHMEM_MAX_TEAMS teams), or all-reduce instead",
            2 * bytes
        )));
    }
    Ok(())
}

/// Pointers and raw handles of a checked collective call.
struct Call<T> {
    team: sys::nvshmem_team_t,
    dst: *mut T,
    src: *const T,
    stream: sys::cudaStream_t,
}

impl Team {
    /// The one path of the team collectives: check that the views (which must not overlap,
    /// unless `in_place` allows them to be the same) and the stream belong to this team's
    /// runtime, skip an empty call, then issue `call` with the per-PE count `n` and check
    /// its status (reported as `name`).
    #[allow(clippy::too_many_arguments)]
    fn collective<T: Element>(
        &self,
        name: &'static str,
        dst: &SymmetricView<'_, T>,
        src: &SymmetricView<'_, T>,
        n: usize,
        in_place: bool,
        stream: &Arc<CudaStream>,
        call: impl FnOnce(&Call<T>, usize) -> Result<i32>,
    ) -> Result<()> {
        check_overlap(name, dst, src, in_place)?;
        let shmem = self.runtime();
        shmem.check_same_runtime(dst.runtime(), "the destination")?;
        shmem.check_same_runtime(src.runtime(), "the source")?;
        let c = Call {
            team: self.handle(),
            dst: dst.as_ptr(),
            src: src.as_ptr() as *const T,
            stream: shmem.raw_stream(stream)?,
        };
        if n == 0 {
            return Ok(());
        }
        let _host = shmem.host_call()?;
        check(name, call(&c, n)?)
    }

    /// `dst[i] = op(src[i] of every PE of the team)`, enqueued on `stream`. `dst` and
    /// `src` have the same length; they may be the same view (in place) but must not
    /// otherwise overlap. Bitwise operators are refused for floating-point types.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::ReduceOp;
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let stream = shmem.new_stream()?;
    /// let flags = shmem.malloc::<u32>(16)?;
    /// // In place: OR the flags of every PE on this node.
    /// shmem.team_node().all_reduce(&flags, &flags, ReduceOp::Or, &stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        check_op::<T>(op)?;
        let n = all_reduce_count(dst.len(), src.len())?;
        let kind = Reduction::AllReduce;
        self.collective(kind.call(op), &dst, &src, n, true, stream, |c, n| unsafe {
            T::reduction_on_stream(kind, op, c.team, c.dst, c.src, n, c.stream)
        })
    }

    /// Reduce across the team, then scatter: PE `i` of the team gets
    /// `dst[j] = op(src[i * n + j] of every PE)` with `n = dst.len()`; `src` holds
    /// `n * team.n_pes()` elements. Enqueued on `stream`.
    ///
    /// NVSHMEM stages the whole of `src` in its reduction scratch space and stops the kernel
    /// if it does not fit: a `src` over half of `NVSHMEM_REDUCE_SCRATCH_SIZE` (512 KiB unless
    /// set; set it alike on every PE) is refused with [`Error::InvalidArgument`] first. Use
    /// [`all_reduce`](Self::all_reduce) for larger inputs.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::ReduceOp;
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let world = shmem.team_world();
    /// let stream = shmem.new_stream()?;
    /// let src = shmem.malloc::<i64>(256 * world.n_pes())?;
    /// let mine = shmem.malloc::<i64>(256)?;
    /// world.reduce_scatter(&mine, &src, ReduceOp::Max, &stream)?;
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        check_op::<T>(op)?;
        let n = reduce_scatter_count(dst.len(), src.len(), self.n_pes())?;
        check_reduce_scatter_scratch(src.num_bytes(), self.n_pes())?;
        let kind = Reduction::ReduceScatter;
        self.collective(kind.call(op), &dst, &src, n, false, stream, |c, n| unsafe {
            T::reduction_on_stream(kind, op, c.team, c.dst, c.src, n, c.stream)
        })
    }

    /// Concatenate the `src` of every PE of the team, in team order, into `dst` on every PE:
    /// `dst[i * n .. (i + 1) * n]` is PE `i`'s `src`, with `n = src.len()`. Enqueued on
    /// `stream`. (NVSHMEM's `fcollect`.)
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let world = shmem.team_world();
    /// let stream = shmem.new_stream()?;
    /// let mine = shmem.malloc::<u8>(1000)?;
    /// let all = shmem.malloc::<u8>(1000 * world.n_pes())?;
    /// world.all_gather(&all, &mine, &stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_gather<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.exchange(Exchange::Fcollect, dst.into(), src.into(), stream)
    }

    /// Copy `src` of the team's PE `root` into `dst` on every PE of the team, enqueued on
    /// `stream`. `dst` and `src` have the same length.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let stream = shmem.new_stream()?;
    /// let params = shmem.malloc::<f32>(4096)?;
    /// let copy = shmem.malloc::<f32>(4096)?;
    /// shmem.team_world().broadcast(&copy, &params, 0, &stream)?;
    /// # Ok(()) }
    /// ```
    pub fn broadcast<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        let n = broadcast_count(dst.len(), src.len(), root, self.n_pes())?;
        let name = "nvshmemx_TYPENAME_broadcast_on_stream";
        self.collective(name, &dst, &src, n, true, stream, |c, n| unsafe {
            Ok(T::broadcast_on_stream(
                c.team,
                c.dst,
                c.src,
                n,
                root as i32,
                c.stream,
            ))
        })
    }

    /// Exchange blocks between all PEs of the team: with `n = src.len() / team.n_pes()`,
    /// block `j` of `src` on PE `i` (`src[j * n .. (j + 1) * n]`) lands in block `i` of
    /// `dst` on PE `j`. Both views hold `n * team.n_pes()` elements. Enqueued on `stream`.
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let world = shmem.team_world();
    /// let stream = shmem.new_stream()?;
    /// let out = shmem.malloc::<i32>(64 * world.n_pes())?;
    /// let inbox = shmem.malloc::<i32>(64 * world.n_pes())?;
    /// world.all_to_all(&inbox, &out, &stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_to_all<'a, T: Element>(
        &self,
        dst: impl Into<SymmetricView<'a, T>>,
        src: impl Into<SymmetricView<'a, T>>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.exchange(Exchange::Alltoall, dst.into(), src.into(), stream)
    }

    /// An fcollect or an all-to-all: their counts differ, the rest is the same.
    fn exchange<T: Element>(
        &self,
        kind: Exchange,
        dst: SymmetricView<'_, T>,
        src: SymmetricView<'_, T>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (n, name) = match kind {
            Exchange::Fcollect => (
                fcollect_count(dst.len(), src.len(), self.n_pes())?,
                "nvshmemx_TYPENAME_fcollect_on_stream",
            ),
            Exchange::Alltoall => (
                alltoall_count(dst.len(), src.len(), self.n_pes())?,
                "nvshmemx_TYPENAME_alltoall_on_stream",
            ),
        };
        self.collective(name, &dst, &src, n, false, stream, |c, n| unsafe {
            Ok(T::exchange_on_stream(
                kind, c.team, c.dst, c.src, n, c.stream,
            ))
        })
    }
}

/// Refuse bitwise operators on floating-point types.
fn check_op<T: Element>(op: ReduceOp) -> Result<()> {
    if op.is_bitwise() && !T::IS_INTEGER {
        return Err(bitwise_on_float::<T>(op));
    }
    Ok(())
}

/// Source and destination must not overlap, except (where `same_ok`) by being the same view.
pub(crate) fn check_overlap<T: Element>(
    what: &'static str,
    dst: &SymmetricView<'_, T>,
    src: &SymmetricView<'_, T>,
    same_ok: bool,
) -> Result<()> {
    let d = (dst.as_ptr() as usize, dst.num_bytes());
    let s = (src.as_ptr() as usize, src.num_bytes());
    if overlap_is_allowed(d, s, same_ok) {
        Ok(())
    } else {
        Err(Error::Overlap { what })
    }
}

/// `(address, bytes)` ranges: disjoint, or (with `same_ok`) identical.
pub(crate) fn overlap_is_allowed(a: (usize, usize), b: (usize, usize), same_ok: bool) -> bool {
    let disjoint = a.1 == 0 || b.1 == 0 || a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0;
    disjoint || (same_ok && a == b)
}

/// Elements per PE of an all-reduce: the lengths must match.
pub(crate) fn all_reduce_count(dest_len: usize, src_len: usize) -> Result<usize> {
    let what = "all_reduce destination (must match the source)";
    check_len(what, src_len, dest_len)?;
    Ok(dest_len)
}

/// Elements per PE of a reduce-scatter (`dest_len`): the source holds `dest_len * n_pes`.
pub(crate) fn reduce_scatter_count(dest_len: usize, src_len: usize, n_pes: usize) -> Result<usize> {
    let what = "reduce_scatter source (destination length times the team's PEs)";
    check_len(what, times(dest_len, n_pes)?, src_len)?;
    Ok(dest_len)
}

/// Elements per PE of an fcollect (`src_len`): the destination holds `src_len * n_pes`.
pub(crate) fn fcollect_count(dest_len: usize, src_len: usize, n_pes: usize) -> Result<usize> {
    let what = "all_gather destination (source length times the team's PEs)";
    check_len(what, times(src_len, n_pes)?, dest_len)?;
    Ok(src_len)
}

/// Elements per PE pair of an all-to-all: equal lengths that divide by `n_pes`.
pub(crate) fn alltoall_count(dest_len: usize, src_len: usize, n_pes: usize) -> Result<usize> {
    check_len(
        "all_to_all destination (must match the source)",
        src_len,
        dest_len,
    )?;
    if n_pes == 0 || !src_len.is_multiple_of(n_pes) {
        return Err(Error::InvalidArgument(format!(
            "all_to_all: {src_len} elements do not split into equal blocks for {n_pes} PEs"
        )));
    }
    Ok(src_len / n_pes)
}

/// Elements of a broadcast: equal lengths and a root inside the team.
pub(crate) fn broadcast_count(
    dest_len: usize,
    src_len: usize,
    root: usize,
    n_pes: usize,
) -> Result<usize> {
    if root >= n_pes {
        return Err(Error::PeOutOfRange { pe: root, n_pes });
    }
    check_len(
        "broadcast destination (must match the source)",
        src_len,
        dest_len,
    )?;
    Ok(src_len)
}

fn times(len: usize, n_pes: usize) -> Result<usize> {
    if n_pes == 0 {
        return Err(Error::InvalidArgument("the team has no PEs".into()));
    }
    len.checked_mul(n_pes).ok_or_else(|| {
        Error::InvalidArgument(format!("{len} elements times {n_pes} PEs overflows usize"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reduce_scratch_is_read_as_nvshmem_reads_sizes() {
        assert_eq!(reduce_scratch_bytes(None), Some(512 << 10));
        assert_eq!(reduce_scratch_bytes(Some("1048576")), Some(1 << 20));
        assert_eq!(reduce_scratch_bytes(Some("64M")), Some(64 << 20));
        assert_eq!(reduce_scratch_bytes(Some("2g")), Some(2 << 30));
        assert_eq!(reduce_scratch_bytes(Some("512k")), Some(512 << 10));
        assert_eq!(reduce_scratch_bytes(Some("1T")), Some(1 << 40));
        // A fraction is rounded up; what follows the multiplier is ignored.
        assert_eq!(reduce_scratch_bytes(Some("0.5m")), Some(512 << 10));
        assert_eq!(reduce_scratch_bytes(Some(".5m")), Some(512 << 10));
        assert_eq!(reduce_scratch_bytes(Some("1.5")), Some(2));
        assert_eq!(reduce_scratch_bytes(Some("20kk")), Some(20 << 10));
        assert_eq!(reduce_scratch_bytes(Some("16MiB")), Some(16 << 20));
        assert_eq!(reduce_scratch_bytes(Some(" 8M")), Some(8 << 20));
        for bad in ["", "M", "12X", "12 M", "-1", "1.2.3"] {
            assert_eq!(reduce_scratch_bytes(Some(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn a_reduce_scatter_over_half_the_scratch_is_refused_with_the_variable() {
        // This test's process does not set the variable: the default 512 KiB.
        if std::env::var_os(REDUCE_SCRATCH_VARIABLE).is_some() {
            return;
        }
        assert!(check_reduce_scatter_scratch(256 << 10, 4).is_ok());
        let e = check_reduce_scatter_scratch((256 << 10) + 1, 4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(REDUCE_SCRATCH_VARIABLE) && e.contains("524290"),
            "{e}"
        );
        assert!(check_reduce_scatter_scratch(usize::MAX, 1).is_ok());
    }

    #[test]
    fn nvshmem_reduce_scatter_fits_half_the_scratch() {
        // The default 512 KiB: inputs up to 256 KiB per PE.
        let max = reduce_scatter_max_bytes(REDUCE_SCRATCH_DEFAULT, 8);
        assert_eq!(max, 256 << 10);
        assert_eq!(reduce_scatter_max_bytes(1 << 30, 2), 512 << 20);
        assert_eq!(reduce_scatter_max_bytes(0, 4), 0);
        // One PE copies, whatever the scratch.
        assert_eq!(reduce_scatter_max_bytes(0, 1), usize::MAX);
    }

    #[test]
    fn all_reduce_needs_equal_lengths() {
        assert_eq!(all_reduce_count(7, 7).unwrap(), 7);
        assert_eq!(all_reduce_count(0, 0).unwrap(), 0);
        assert!(matches!(
            all_reduce_count(7, 8),
            Err(Error::Length {
                expected: 8,
                got: 7,
                ..
            })
        ));
    }

    #[test]
    fn reduce_scatter_source_is_destination_times_pes() {
        assert_eq!(reduce_scatter_count(10, 40, 4).unwrap(), 10);
        assert!(matches!(
            reduce_scatter_count(10, 39, 4),
            Err(Error::Length {
                expected: 40,
                got: 39,
                ..
            })
        ));
        // The other way round is an fcollect, not a reduce-scatter.
        assert!(reduce_scatter_count(40, 10, 4).is_err());
        assert!(reduce_scatter_count(usize::MAX, 1, 2).is_err());
        assert!(reduce_scatter_count(1, 0, 0).is_err());
    }

    #[test]
    fn fcollect_destination_is_source_times_pes() {
        assert_eq!(fcollect_count(12, 3, 4).unwrap(), 3);
        assert_eq!(fcollect_count(0, 0, 4).unwrap(), 0);
        assert!(matches!(
            fcollect_count(11, 3, 4),
            Err(Error::Length {
                expected: 12,
                got: 11,
                ..
            })
        ));
        assert!(fcollect_count(3, 12, 4).is_err());
    }

    #[test]
    fn alltoall_needs_equal_lengths_divisible_by_pes() {
        assert_eq!(alltoall_count(12, 12, 4).unwrap(), 3);
        assert_eq!(alltoall_count(12, 12, 1).unwrap(), 12);
        assert!(matches!(
            alltoall_count(12, 8, 4),
            Err(Error::Length { .. })
        ));
        assert!(matches!(
            alltoall_count(10, 10, 4),
            Err(Error::InvalidArgument(_))
        ));
        assert!(alltoall_count(0, 0, 0).is_err());
    }

    #[test]
    fn broadcast_root_must_be_in_the_team() {
        assert_eq!(broadcast_count(5, 5, 3, 4).unwrap(), 5);
        assert!(matches!(
            broadcast_count(5, 5, 4, 4),
            Err(Error::PeOutOfRange { pe: 4, n_pes: 4 })
        ));
        assert!(matches!(
            broadcast_count(5, 6, 0, 4),
            Err(Error::Length { .. })
        ));
    }

    #[test]
    fn overlapping_views_are_refused_unless_identical_and_allowed() {
        assert!(overlap_is_allowed((0, 16), (16, 16), false));
        assert!(overlap_is_allowed((32, 16), (0, 16), false));
        assert!(!overlap_is_allowed((0, 16), (8, 16), false));
        assert!(!overlap_is_allowed((0, 16), (0, 16), false));
        assert!(overlap_is_allowed((0, 16), (0, 16), true));
        assert!(!overlap_is_allowed((0, 16), (0, 8), true));
        assert!(overlap_is_allowed((0, 0), (0, 8), false));
    }

    #[test]
    fn bitwise_operators_are_for_integers_only() {
        assert!(check_op::<f32>(ReduceOp::Sum).is_ok());
        assert!(matches!(
            check_op::<f32>(ReduceOp::And),
            Err(Error::TypeMismatch { .. })
        ));
        assert!(check_op::<half::bf16>(ReduceOp::Xor).is_err());
        assert!(check_op::<u8>(ReduceOp::Xor).is_ok());
        assert!(check_op::<i64>(ReduceOp::Or).is_ok());
    }
}
