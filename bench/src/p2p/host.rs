//! Host-initiated and on-stream put/get latency.

use super::{P2p, K_HOST};
use crate::cli::format_size;
use crate::data::{self, Mismatch};
use crate::error::Result;
use crate::report::Record;
use crate::timing::{self, Timer};
use nvshmem::sys;

impl P2p<'_> {
    /// Host-initiated (`host_*`, host clock) and on-stream (`stream_*`, CUDA events) RMA.
    pub(super) fn host_latency(
        &self,
        timer: &mut Timer,
        test: &str,
        bytes: usize,
    ) -> Result<Record> {
        timing::step(format!("p2p {test}, {}", format_size(bytes)));
        let (warm, iters) = self.cfg.iters_for(bytes);
        let key = data::key(
            self.cfg.seed,
            &[K_HOST, data::hash_bytes(test.as_bytes()), bytes as u64],
        );
        self.prepare(key, bytes)?;
        let dst = self.dst.as_ptr() as *mut std::ffi::c_void;
        let src = self.src.as_ptr() as *const std::ffi::c_void;
        let peer = self.peer() as i32;
        let raw = self.raw_stream();
        let mut samples = Vec::new();
        if self.is_initiator() {
            self.bind()?;
            let n = warm + iters;
            samples = match test {
                "host_put" => timing::time_host(n, || {
                    unsafe {
                        sys::nvshmem_putmem(dst, src, bytes, peer);
                        sys::nvshmem_quiet();
                    }
                    Ok(())
                })?,
                "host_get" => timing::time_host(n, || {
                    unsafe { sys::nvshmem_getmem(dst, src, bytes, peer) };
                    Ok(())
                })?,
                "stream_put" => timer.time_each(
                    self.stream,
                    n,
                    1,
                    |_| Ok(()),
                    |_| {
                        unsafe {
                            sys::nvshmemx_putmem_on_stream(dst, src, bytes, peer, raw);
                            sys::nvshmemx_quiet_on_stream(raw);
                        }
                        Ok(())
                    },
                )?,
                _ => timer.time_each(
                    self.stream,
                    n,
                    1,
                    |_| Ok(()),
                    |_| {
                        unsafe { sys::nvshmemx_getmem_on_stream(dst, src, bytes, peer, raw) };
                        Ok(())
                    },
                )?,
            };
            samples.drain(..warm);
        }
        self.finish()?;
        let local = match (test.ends_with("get"), self.is_initiator(), self.is_target()) {
            (false, _, true) => self.check_dst(key, self.from(), bytes)?,
            (true, true, _) => self.check_dst(key, self.peer(), bytes)?,
            _ => Mismatch::default(),
        };
        let check = self.agree(local)?;
        let mode = if test.starts_with("host") {
            "host"
        } else {
            "stream"
        };
        Ok(self.record(test, "", mode, "bytes", bytes, &samples, 1.0, check))
    }
}
