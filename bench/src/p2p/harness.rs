//! What every point-to-point measurement shares: who talks to whom, fresh data before it,
//! the checks and the record after it.

use super::P2p;
use crate::data::{self, Mismatch};
use crate::error::{BenchError, CudaExt, Result};
use crate::report::{Record, Results, Status};
use crate::stats;
use nvshmem::module::{Function, KernelArgs, Module};
use nvshmem::{sys, LaunchConfig};

impl P2p<'_> {
    /// The PE that starts each exchange (PE 0, but in the bandwidth matrix).
    pub(super) fn from(&self) -> usize {
        self.from.get()
    }

    /// The PE it talks to (`--peer`, but in the bandwidth matrix).
    pub(super) fn peer(&self) -> usize {
        self.peer.get()
    }

    pub(super) fn is_initiator(&self) -> bool {
        self.me == self.from()
    }

    pub(super) fn is_target(&self) -> bool {
        self.me == self.peer()
    }

    /// The PE this one talks to (the initiator <-> the peer).
    pub(super) fn other(&self) -> usize {
        if self.is_initiator() {
            self.peer()
        } else {
            self.from()
        }
    }

    pub(super) fn raw_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    pub(super) fn bind(&self) -> Result<()> {
        self.shmem
            .context()
            .bind_to_thread()
            .cuda("cuCtxSetCurrent")
    }

    fn module(&self) -> Result<&Module> {
        self.module
            .ok_or_else(|| BenchError::new("the point-to-point kernels (bench_p2p) are not loaded"))
    }

    pub(super) fn function(&self, name: &str) -> Result<Function> {
        Ok(self.module()?.function(name)?)
    }

    pub(super) fn say_series(&self, results: &Results, test: &str, variant: &str) {
        let recs: Vec<&Record> = results
            .records
            .iter()
            .filter(|r| r.test == test && (variant.is_empty() || r.variant == variant))
            .collect();
        let failed = recs.iter().filter(|r| r.status == Status::Failed).count();
        let best_time = recs
            .iter()
            .filter_map(|r| r.median_us())
            .fold(f64::INFINITY, f64::min);
        let best_bw = recs.iter().filter_map(|r| r.algbw_gbs).fold(0.0, f64::max);
        self.progress.say(format!(
            "p2p {test}{}{}: {} sizes, best {:.2} us, peak {:.2} GB/s{}",
            if variant.is_empty() { "" } else { " " },
            variant,
            recs.len(),
            best_time,
            best_bw,
            if failed > 0 {
                format!(", {failed} FAILED")
            } else {
                String::new()
            }
        ));
    }

    /// Fresh random source bytes on every PE and a zeroed destination, then a barrier.
    pub(super) fn prepare(&self, key: u64, bytes: usize) -> Result<()> {
        self.prepare_put(key, bytes, bytes)
    }

    /// As [`P2p::prepare`], with the first `zero` bytes of the destination zeroed (the slots
    /// a put-bandwidth test writes).
    pub(super) fn prepare_put(&self, key: u64, bytes: usize, zero: usize) -> Result<()> {
        self.src
            .view(0..bytes)
            .copy_from_host(&data::bytes(key, self.me, bytes))?;
        self.zero_dst_and_sync(zero)
    }

    /// For a get test: fresh random words over the first `used` bytes of every PE's source
    /// region (made on the GPU, `data::bytes_at` on the host), a zeroed destination, a barrier.
    pub(super) fn prepare_get(&self, key: u64, bytes: usize, used: usize) -> Result<()> {
        self.bind()?;
        let f = self.function(super::FILL_KERNEL)?;
        let words = used / 8;
        let mut args = KernelArgs::new();
        args.value(self.src.addr())
            .value(words)
            .value(data::pe_base(key, self.me));
        let cfg = LaunchConfig {
            grid_dim: (words.div_ceil(256).clamp(1, 1024) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches bench_fill_random(uint64_t*, size_t, uint64_t); `used` <= the source
        // buffer's length (Slots never exceeds the region).
        unsafe { f.launch(cfg, self.stream, &mut args)? };
        self.zero_dst_and_sync(bytes)
    }

    /// Zero the first `len` bytes of the destination, wait for the stream, then for every PE.
    fn zero_dst_and_sync(&self, len: usize) -> Result<()> {
        self.bind()?;
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.dst.addr(),
                0,
                len,
                self.stream.cu_stream(),
            )
        }
        .cuda("cuMemsetD8Async")?;
        self.stream.synchronize().cuda("cuStreamSynchronize")?;
        self.coord.barrier()
    }

    /// Compare the last repetition's bytes with `from`'s source: for a get, `dst[..bytes]`
    /// against `from`'s region at `offset`; for a put, `dst[offset..]` against its message.
    pub(super) fn check_slot(
        &self,
        key: u64,
        from: usize,
        get: bool,
        offset: usize,
        bytes: usize,
    ) -> Result<Mismatch> {
        let (at, want) = if get {
            (0, data::bytes_at(key, from, offset, bytes))
        } else {
            (offset, data::bytes(key, from, bytes))
        };
        let got = self.dst.view(at..at + bytes).to_vec()?;
        Ok(data::compare_plain(&got, &want))
    }

    /// Wait for this PE's stream, then for every PE.
    pub(super) fn finish(&self) -> Result<()> {
        self.stream.synchronize().cuda("cuStreamSynchronize")?;
        self.coord.barrier()
    }

    /// Compare this PE's destination with `from`'s source bytes.
    pub(super) fn check_dst(&self, key: u64, from: usize, bytes: usize) -> Result<Mismatch> {
        let got = self.dst.view(0..bytes).to_vec()?;
        Ok(data::compare_plain(&got, &data::bytes(key, from, bytes)))
    }

    /// Sum mismatches over all PEs into a status.
    pub(super) fn agree(&self, local: Mismatch) -> Result<(Status, String)> {
        let totals = self.coord.sums(&[local.count, (local.count > 0) as u64])?;
        if totals[0] == 0 {
            Ok((Status::Ok, "ok".into()))
        } else {
            Ok((
                Status::Failed,
                format!(
                    "{} wrong values on {} PE(s); this PE: {}",
                    totals[0],
                    totals[1],
                    local.describe()
                ),
            ))
        }
    }

    /// Kernel-measured times of launches `warm..warm+n` in microseconds per repetition,
    /// divided by `div` (2 for one way of a round trip). PE 0 only; empty elsewhere.
    pub(super) fn kernel_samples(
        &self,
        warm: usize,
        n: usize,
        inner: usize,
        div: f64,
    ) -> Result<Vec<f64>> {
        if !self.is_initiator() {
            return Ok(Vec::new());
        }
        let ns = self.times.view(warm..warm + n).to_vec()?;
        Ok(ns
            .iter()
            .map(|&t| t as f64 / inner as f64 / div / 1e3)
            .collect())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(
        &self,
        test: &str,
        variant: &str,
        mode: &str,
        dtype: &str,
        bytes: usize,
        samples: &[f64],
        directions: f64,
        check: (Status, String),
    ) -> Record {
        let time_us = stats::summarize(samples);
        let bw = time_us.map(|t| stats::algbw_gbs(bytes as f64 * directions, t.median));
        Record {
            test: test.into(),
            variant: variant.into(),
            implementation: if test.starts_with("nccl") {
                "nccl"
            } else {
                "nvshmem"
            }
            .into(),
            mode: mode.into(),
            dtype: dtype.into(),
            bytes,
            count: bytes,
            n_pes: self.shmem.n_pes(),
            time_us,
            algbw_gbs: bw,
            busbw_gbs: bw,
            status: check.0,
            check: check.1,
            tp: None,
            pipeline: None,
            hybrid: None,
        }
    }

    pub(super) fn times_ptr(&self, slot: usize) -> u64 {
        self.times.addr() + 8 * slot as u64
    }

    /// The arguments every ping-pong kernel ends with: whether this PE starts the exchange,
    /// the untimed and timed rounds of one launch (`inner` timed), and where launch `s` keeps
    /// its time.
    pub(super) fn pingpong_rounds(&self, args: &mut KernelArgs, inner: usize, s: usize) {
        args.value(self.is_initiator() as i32)
            .value(super::layout::inner_warmup(inner) as i32)
            .value(inner as i32)
            .value(self.times_ptr(s));
    }

    /// After a ping-pong: this PE's destination against the other end's source, where this
    /// PE took part (`active`); nothing to compare elsewhere.
    pub(super) fn check_pingpong(&self, active: bool, key: u64, bytes: usize) -> Result<Mismatch> {
        match active {
            true => self.check_dst(key, self.other(), bytes),
            false => Ok(Mismatch::default()),
        }
    }

    pub(super) fn one_block(threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_stream_offsets_match_the_whole_stream() {
        let k = data::key(9, &[1]);
        let whole = data::bytes(k, 3, 4096);
        assert_eq!(data::bytes_at(k, 3, 256, 100), whole[256..356].to_vec());
        assert_eq!(data::bytes_at(k, 3, 0, 13), whole[..13].to_vec());
    }
}
