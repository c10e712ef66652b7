//! Agreement between PEs through NVSHMEM itself: barriers, sums and extremes of host values,
//! gathering small records, and broadcasting bytes from PE 0.

use crate::error::{BenchError, CudaExt, Guard, Result};
use crate::stats::Summary;
use nvshmem::{sys, Nvshmem, ReduceOp, SymmetricBuffer, Team};

/// Values per PE that [`Coord::reduce`] and [`Coord::gather`] take.
pub const SLOTS: usize = 8;
/// Bytes that [`Coord::broadcast_bytes`] takes.
pub const BYTES: usize = 256;

/// Symmetric scratch for host-driven agreement. Every method is collective: all PEs call it in
/// the same order.
///
/// The reductions run on a private copy of the world team: an NVSHMEM collective on the world
/// team may still be in flight on the benchmark stream when PEs agree on its outcome, and two
/// collectives on one team must not overlap.
pub struct Coord {
    shmem: Nvshmem,
    team: Guard<Team>,
    /// `[0, SLOTS)` source, `[SLOTS, 2 SLOTS)` reduction result, then `SLOTS` per PE gathered.
    words: Guard<SymmetricBuffer<u64>>,
    /// `[0, BYTES)` source, `[BYTES, 2 BYTES)` broadcast result.
    bytes: Guard<SymmetricBuffer<u8>>,
}

impl Coord {
    pub fn new(shmem: &Nvshmem) -> Result<Self> {
        let n = shmem.n_pes();
        let team = shmem.team_world().split_strided(0, 1, n)?.ok_or_else(|| {
            BenchError::new("splitting a copy of the world team left this PE out")
        })?;
        let team = Guard::new(team);
        let words = Guard::new(shmem.calloc::<u64>(SLOTS * (2 + shmem.n_pes()))?);
        let bytes = Guard::new(shmem.calloc::<u8>(2 * BYTES)?);
        Ok(Coord {
            shmem: shmem.clone(),
            team,
            words,
            bytes,
        })
    }

    /// `nvshmem_barrier_all` from the host: every PE has arrived and its earlier NVSHMEM
    /// operations are complete. Work queued on streams is not waited for.
    pub fn barrier(&self) -> Result<()> {
        self.shmem
            .context()
            .bind_to_thread()
            .cuda("cuCtxSetCurrent")?;
        unsafe { sys::nvshmem_barrier_all() };
        Ok(())
    }

    /// Element-wise reduction of up to [`SLOTS`] values over all PEs.
    pub fn reduce(&self, op: ReduceOp, values: &[u64]) -> Result<Vec<u64>> {
        let n = values.len();
        if n == 0 || n > SLOTS {
            return Err(BenchError::new(format!(
                "Coord::reduce takes 1 to {SLOTS} values, got {n}"
            )));
        }
        self.words.view(0..n).copy_from_host(values)?;
        let (src, dst) = (self.words.view(0..n), self.words.view(SLOTS..SLOTS + n));
        self.team.all_reduce(dst, src, op, self.shmem.stream())?;
        // to_vec synchronises the same stream first.
        Ok(self.words.view(SLOTS..SLOTS + n).to_vec()?)
    }

    /// Sum of one value over all PEs.
    pub fn sum(&self, value: u64) -> Result<u64> {
        Ok(self.reduce(ReduceOp::Sum, &[value])?[0])
    }

    /// Element-wise sums over all PEs.
    pub fn sums(&self, values: &[u64]) -> Result<Vec<u64>> {
        self.reduce(ReduceOp::Sum, values)
    }

    /// Whether every PE passed the same value.
    pub fn all_equal(&self, value: u64) -> Result<bool> {
        let r = self.reduce(ReduceOp::Max, &[value, !value])?;
        // max(!v) = !min(v)
        Ok(r[0] == !r[1])
    }

    /// Every PE's `SLOTS` values, in PE order.
    pub fn gather(&self, values: &[u64; SLOTS]) -> Result<Vec<[u64; SLOTS]>> {
        let n_pes = self.shmem.n_pes();
        self.words.view(0..SLOTS).copy_from_host(values)?;
        let dst = self.words.view(2 * SLOTS..(2 + n_pes) * SLOTS);
        self.team
            .all_gather(dst, self.words.view(0..SLOTS), self.shmem.stream())?;
        let all = self.words.view(2 * SLOTS..(2 + n_pes) * SLOTS).to_vec()?;
        Ok(all
            .chunks_exact(SLOTS)
            .map(|c| {
                let mut a = [0u64; SLOTS];
                a.copy_from_slice(c);
                a
            })
            .collect())
    }

    /// PE 0's `data` (up to [`BYTES`]; the other PEs pass the same length) on every PE.
    pub fn broadcast_bytes(&self, data: &[u8]) -> Result<Vec<u8>> {
        let n = data.len();
        if n == 0 || n > BYTES {
            return Err(BenchError::new(format!(
                "Coord::broadcast_bytes takes 1 to {BYTES} bytes, got {n}"
            )));
        }
        self.bytes.view(0..n).copy_from_host(data)?;
        let (src, dst) = (self.bytes.view(0..n), self.bytes.view(BYTES..BYTES + n));
        self.team.broadcast(dst, src, 0, self.shmem.stream())?;
        if self.shmem.my_pe() == 0 {
            // The root's own destination need not be written; it has the data anyway.
            self.shmem
                .stream()
                .synchronize()
                .cuda("cuStreamSynchronize")?;
            return Ok(data.to_vec());
        }
        Ok(self.bytes.view(BYTES..BYTES + n).to_vec()?)
    }
}

impl Coord {
    /// Every PE's summary of its samples (none where it timed nothing), in PE order.
    pub fn gather_summaries(&self, mine: Option<Summary>) -> Result<Vec<Option<Summary>>> {
        let mut words = [0u64; SLOTS];
        if let Some(s) = mine {
            let v = [s.n as f64, s.median, s.mean, s.min, s.max, s.p10, s.p90];
            for (w, x) in words.iter_mut().zip(v) {
                *w = x.to_bits();
            }
        }
        Ok(self
            .gather(&words)?
            .iter()
            .map(|w| {
                let f = |i: usize| f64::from_bits(w[i]);
                (f(0) >= 1.0).then(|| Summary {
                    n: f(0) as usize,
                    median: f(1),
                    mean: f(2),
                    min: f(3),
                    max: f(4),
                    p10: f(5),
                    p90: f(6),
                })
            })
            .collect())
    }
}
