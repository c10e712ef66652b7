//! NCCL send/recv: ping-pong latency and bandwidth one way and both ways.

use super::{P2p, K_NCCL};
use crate::cli::format_size;
use crate::data::{self, Mismatch};
use crate::error::{BenchError, Result};
use crate::nccl::Nccl;
use crate::report::Record;
use crate::timing::{self, Timer};

impl P2p<'_> {
    fn nccl(&self) -> Result<&Nccl> {
        self.nccl
            .ok_or_else(|| BenchError::new("NCCL is not initialised"))
    }

    /// NCCL send/recv ping-pong; one way = round trip / 2.
    pub(super) fn nccl_pingpong(&self, timer: &mut Timer, bytes: usize) -> Result<Record> {
        timing::step(format!("p2p NCCL ping-pong, {}", format_size(bytes)));
        let nccl = self.nccl()?;
        let (warm, iters) = self.cfg.iters_for(bytes);
        let key = data::key(self.cfg.seed, &[K_NCCL, 0, bytes as u64]);
        self.prepare(key, bytes)?;
        let (src, dst, other) = (self.src.addr(), self.dst.addr(), self.other());
        let mut samples = Vec::new();
        if self.is_initiator() {
            samples = timer.time_each(
                self.stream,
                warm + iters,
                1,
                |_| Ok(()),
                |_| unsafe {
                    nccl.send(src, bytes, other, self.stream)?;
                    nccl.recv(dst, bytes, other, self.stream)
                },
            )?;
            samples = samples[warm..].iter().map(|t| t / 2.0).collect();
        } else if self.is_target() {
            timer.time_each(
                self.stream,
                warm + iters,
                1,
                |_| Ok(()),
                |_| unsafe {
                    nccl.recv(dst, bytes, other, self.stream)?;
                    nccl.send(src, bytes, other, self.stream)
                },
            )?;
        }
        self.finish()?;
        let active = self.is_initiator() || self.is_target();
        let local = if active {
            self.check_dst(key, other, bytes)?
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        Ok(self.record(
            "nccl_pingpong",
            "",
            "stream",
            "bytes",
            bytes,
            &samples,
            1.0,
            check,
        ))
    }

    /// NCCL send/recv bandwidth, one way or both ways (grouped send + recv).
    pub(super) fn nccl_bandwidth(
        &self,
        timer: &mut Timer,
        bidir: bool,
        bytes: usize,
    ) -> Result<Record> {
        timing::step(format!(
            "p2p NCCL send/recv bandwidth {}, {}",
            if bidir { "both ways" } else { "one way" },
            format_size(bytes)
        ));
        let nccl = self.nccl()?;
        let (warm, iters) = self.cfg.iters_for(bytes);
        let key = data::key(self.cfg.seed, &[K_NCCL, 1 + bidir as u64, bytes as u64]);
        self.prepare(key, bytes)?;
        let (src, dst, other) = (self.src.addr(), self.dst.addr(), self.other());
        let n = warm + iters;
        let mut samples = Vec::new();
        if self.is_initiator() || self.is_target() {
            let sender = self.is_initiator();
            let t = timer.time_each(
                self.stream,
                n,
                1,
                |_| Ok(()),
                |_| unsafe {
                    if bidir {
                        nccl.send_recv(src, dst, bytes, other, self.stream)
                    } else if sender {
                        nccl.send(src, bytes, other, self.stream)
                    } else {
                        nccl.recv(dst, bytes, other, self.stream)
                    }
                },
            )?;
            if sender {
                samples = t[warm..].to_vec();
            }
        }
        self.finish()?;
        let receives = self.is_target() || (bidir && self.is_initiator());
        let local = if receives {
            self.check_dst(key, other, bytes)?
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        let variant = if bidir { "bidir" } else { "uni" };
        let dirs = if bidir { 2.0 } else { 1.0 };
        Ok(self.record(
            "nccl_sendrecv_bw",
            variant,
            "stream",
            "bytes",
            bytes,
            &samples,
            dirs,
            check,
        ))
    }
}
