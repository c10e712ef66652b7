//! The device-side hand-off: a persistent kernel on PE 0 and one on the peer exchanging
//! messages through `nvshmem_rs/channel.cuh` (`bench_channel_pingpong_*` in
//! kernels/bench_p2p.cu), no host between the rounds. It is the floor of a pipeline stage
//! fused into a user's kernel, beside `Channel::send`/`recv` from the host (the `channel`
//! test) and put-with-signal.

use super::{channel_kernel, P2p, Scope, K_CHANNEL};
use crate::cli::format_size;
use crate::data;
use crate::error::{Guard, Result};
use crate::report::{Record, Status};
use crate::timing;
use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::module::KernelArgs;

impl P2p<'_> {
    /// Ping-pong of `bytes` between PE 0 and the peer, each end one kernel of `scope`; one PE
    /// alone hands messages to itself through one channel.
    pub(super) fn channel_pingpong(&self, scope: Scope, bytes: usize) -> Result<Record> {
        timing::step(format!(
            "p2p channel ping-pong on the device, {} scope, {}",
            scope.name(),
            format_size(bytes)
        ));
        let (warm, launches) = self.cfg.iters_for(bytes);
        let inner = self.cfg.inner_for(bytes);
        let key = data::key(self.cfg.seed, &[K_CHANNEL, scope as u64, bytes as u64]);
        self.prepare(key, bytes)?;
        // Collective: every PE makes both channels. A loopback uses `there` both ways (a
        // kernel that pushed to itself pops its own message).
        let max_len = bytes.max(1);
        let there = Guard::new(Channel::<u8>::new(
            self.shmem,
            ChannelConfig::new(0, self.peer(), max_len),
        )?);
        let back = Guard::new(Channel::<u8>::new(
            self.shmem,
            ChannelConfig::new(self.peer(), 0, max_len),
        )?);
        let back_handle = match self.peer() == 0 {
            true => there.handle(),
            false => back.handle(),
        };
        let active = self.is_initiator() || self.is_target();
        if active {
            let f = self.function(&channel_kernel(scope))?;
            let cfg = Self::one_block(scope.threads(self.cfg.block_threads));
            for s in 0..warm + launches {
                let mut args = KernelArgs::new();
                args.value(there.handle())
                    .value(back_handle)
                    .value(self.dst.addr())
                    .value(self.src.addr())
                    .value(bytes as u64);
                self.pingpong_rounds(&mut args, inner, s);
                // SAFETY: matches bench_channel_pingpong_*(nvshmem_rs_channel,
                // nvshmem_rs_channel, void*, const void*, uint64_t, int, int, int, u64*); src
                // and dst hold `bytes`; the two ends wait on each other, so each launch must be
                // resident whole.
                unsafe { f.launch_collective(cfg, self.stream, &mut args)? };
            }
        }
        self.finish()?;
        // A wait that gave up left its kernel's time at 0: the channels say so.
        let fault = there.check().and(back.check()).err();
        let mut local = self.check_pingpong(active, key, bytes)?;
        if let Some(e) = &fault {
            local.count += 1;
            local
                .first
                .get_or_insert((0, e.to_string(), "no fault".into()));
        }
        let check = self.agree(local)?;
        let samples = match check.0 {
            Status::Ok => self.kernel_samples(warm, launches, inner, 2.0)?,
            _ => Vec::new(),
        };
        let mut record = self.record(
            "channel_pingpong_device",
            scope.name(),
            "device",
            "bytes",
            bytes,
            &samples,
            1.0,
            check,
        );
        record.implementation = "ours".into();
        Ok(record)
    }
}
