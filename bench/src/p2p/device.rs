//! Device-initiated tests: p/g and put/get latency, put-with-signal ping-pong, put/get
//! bandwidth over CTA counts.

use super::layout::{g_expected, inner_warmup, p_expected, Slots, G_SLOTS, G_STRIDE, P_SLOTS};
use super::{
    bw_variant, latency_kernel, signal_kernel, P2p, Scope, K_BW, K_G, K_P, K_RMA, K_SIGNAL,
};
use super::{GET_BW_KERNEL, G_KERNEL, PUT_BW_KERNEL, P_KERNEL};
use crate::cli::format_size;
use crate::data::{self, Mismatch};
use crate::error::{CudaExt, Result};
use crate::report::{Record, Results};
use crate::timing::{self, Timer};
use nvshmem::module::KernelArgs;
use nvshmem::{sys, LaunchConfig};

impl P2p<'_> {
    /// nvshmem_uint32_p + quiet and nvshmem_uint32_g latency, one thread.
    pub(super) fn p_and_g(&self, results: &mut Results) -> Result<()> {
        timing::step("p2p p and g latency");
        let (warm, launches) = self.cfg.iters_for(4);
        let inner = self.cfg.inner_for(4);
        let inner_warm = inner_warmup(inner);
        let total = inner_warm + inner;
        let words = self.words.addr();

        // p: PE 0 writes token + i into the target's words[i % 32].
        let key = data::key(self.cfg.seed, &[K_P]);
        let token = data::word(key, 0, 0) as u32;
        self.words.copy_from_host(&[0u32; 2 * P_SLOTS])?;
        self.coord.barrier()?;
        if self.is_initiator() {
            let f = self.function(P_KERNEL)?;
            for s in 0..warm + launches {
                let mut args = KernelArgs::new();
                args.value(words)
                    .value(self.peer() as i32)
                    .value(token)
                    .value(inner_warm as i32)
                    .value(inner as i32)
                    .value(self.times_ptr(s));
                // SAFETY: matches bench_p_latency(uint32_t*, int, uint32_t, int, int, u64*);
                // words holds 64 u32 on every PE, times warmup + iters + 1 u64.
                unsafe { f.launch(Self::one_block(1), self.stream, &mut args)? };
            }
        }
        self.finish()?;
        let local = if self.is_target() {
            let got = self.words.view(0..P_SLOTS).to_vec()?;
            data::compare_plain(&got, &p_expected(token, total))
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        let samples = self.kernel_samples(warm, launches, inner, 1.0)?;
        results.push(self.record("p", "thread", "device", "u32", 4, &samples, 1.0, check));

        // g: PE 0 reads the target's gwords[g_index(i)], each read's address depending on the
        // previous read's value, and sums them.
        let key = data::key(self.cfg.seed, &[K_G]);
        self.gwords
            .copy_from_host(&data::words32(key, self.me, G_SLOTS * G_STRIDE))?;
        self.gsum.copy_from_host(&[0])?;
        self.coord.barrier()?;
        if self.is_initiator() {
            let f = self.function(G_KERNEL)?;
            for s in 0..warm + launches {
                let mut args = KernelArgs::new();
                args.value(self.gwords.addr())
                    .value(self.peer() as i32)
                    .value(inner_warm as i32)
                    .value(inner as i32)
                    .value(self.gsum.addr())
                    .value(self.times_ptr(s));
                // SAFETY: matches bench_g_latency(const uint32_t*, int, int, int, u64*, u64*).
                unsafe { f.launch(Self::one_block(1), self.stream, &mut args)? };
            }
        }
        self.finish()?;
        let local = if self.is_initiator() {
            let got = self.gsum.to_vec()?;
            let want = g_expected(&data::words32(key, self.peer(), G_SLOTS * G_STRIDE), total);
            data::compare_plain(&got, &[want])
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        let samples = self.kernel_samples(warm, launches, inner, 1.0)?;
        results.push(self.record("g", "thread", "device", "u32", 4, &samples, 1.0, check));
        self.progress.say(format!(
            "p2p p/g: p {:.2} us, g {:.2} us",
            results.records[results.records.len() - 2]
                .median_us()
                .unwrap_or(f64::NAN),
            results.records[results.records.len() - 1]
                .median_us()
                .unwrap_or(f64::NAN)
        ));
        Ok(())
    }

    /// put + quiet (or blocking get) of `bytes`, repeated in one kernel, at `scope`.
    pub(super) fn rma_latency(&self, get: bool, scope: Scope, bytes: usize) -> Result<Record> {
        timing::step(format!(
            "p2p {} latency, {} scope, {}",
            if get { "get" } else { "put" },
            scope.name(),
            format_size(bytes)
        ));
        let (warm, launches) = self.cfg.iters_for(bytes);
        let inner = self.cfg.inner_for(bytes);
        let key = data::key(
            self.cfg.seed,
            &[K_RMA, get as u64, scope as u64, bytes as u64],
        );
        let per_launch = inner_warmup(inner) + inner;
        let total = (warm + launches) * per_launch;
        let slots = Slots::new(bytes, self.src.len());
        if get {
            self.prepare_get(key, bytes, slots.used_bytes(total))?;
        } else {
            self.prepare(key, bytes)?;
        }
        if self.is_initiator() {
            let f = self.function(&latency_kernel(get, scope))?;
            let cfg = Self::one_block(scope.threads(self.cfg.block_threads));
            for s in 0..warm + launches {
                let mut args = KernelArgs::new();
                // put: dst on the peer <- local src; get: local dst <- slots of src on the peer.
                args.value(self.dst.addr()).value(self.src.addr());
                if get {
                    args.value(slots.slot_bytes)
                        .value(slots.nslots)
                        .value(s * per_launch);
                }
                args.value(bytes)
                    .value(self.peer() as i32)
                    .value(inner_warmup(inner) as i32)
                    .value(inner as i32)
                    .value(self.times_ptr(s));
                // SAFETY: matches bench_put_latency_*(void*, const void*, size_t, int, int, int,
                // u64*) and bench_get_latency_*(void*, const char*, size_t, size_t, size_t,
                // size_t, int, int, int, u64*); both buffers hold at least `bytes` bytes on
                // every PE and the slots lie within the source buffer.
                unsafe { f.launch(cfg, self.stream, &mut args)? };
            }
        }
        self.finish()?;
        let local = match (get, self.is_initiator(), self.is_target()) {
            (false, _, true) => self.check_dst(key, self.from(), bytes)?,
            // The last repetition's slot.
            (true, true, _) => {
                self.check_slot(key, self.peer(), true, slots.offset(total - 1), bytes)?
            }
            _ => Mismatch::default(),
        };
        let check = self.agree(local)?;
        let samples = self.kernel_samples(warm, launches, inner, 1.0)?;
        Ok(self.record(
            if get { "get" } else { "put" },
            scope.name(),
            "device",
            "bytes",
            bytes,
            &samples,
            1.0,
            check,
        ))
    }

    /// Put-with-signal ping-pong between PE 0 and the peer; one way = round trip / 2.
    pub(super) fn signal_pingpong(&self, scope: Scope, bytes: usize) -> Result<Record> {
        timing::step(format!(
            "p2p put-with-signal ping-pong, {} scope, {}",
            scope.name(),
            format_size(bytes)
        ));
        let (warm, launches) = self.cfg.iters_for(bytes);
        let inner = self.cfg.inner_for(bytes);
        let key = data::key(self.cfg.seed, &[K_SIGNAL, scope as u64, bytes as u64]);
        self.prepare(key, bytes)?;
        let active = self.is_initiator() || self.is_target();
        let f = if active {
            Some(self.function(&signal_kernel(scope))?)
        } else {
            None
        };
        let cfg = Self::one_block(scope.threads(self.cfg.block_threads));
        for s in 0..warm + launches {
            // The signal must be 0 on both sides before either kernel starts.
            self.bind()?;
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    self.sig.addr(),
                    0,
                    8,
                    self.stream.cu_stream(),
                )
            }
            .cuda("cuMemsetD8Async")?;
            unsafe { sys::nvshmemx_barrier_all_on_stream(self.raw_stream()) };
            if let Some(f) = &f {
                let mut args = KernelArgs::new();
                args.value(self.dst.addr())
                    .value(self.src.addr())
                    .value(bytes)
                    .value(self.sig.addr())
                    .value(self.other() as i32);
                self.pingpong_rounds(&mut args, inner, s);
                // SAFETY: matches bench_put_signal_pingpong_*(void*, const void*, size_t,
                // uint64_t*, int, int, int, int, u64*); the two PEs wait on each other, so the
                // launch must be co-resident.
                unsafe { f.launch_collective(cfg, self.stream, &mut args)? };
            }
        }
        self.finish()?;
        let local = self.check_pingpong(active, key, bytes)?;
        let check = self.agree(local)?;
        let samples = self.kernel_samples(warm, launches, inner, 2.0)?;
        Ok(self.record(
            "put_signal_pingpong",
            scope.name(),
            "device",
            "bytes",
            bytes,
            &samples,
            1.0,
            check,
        ))
    }

    /// Device put/get bandwidth: `ctas` blocks, the message repeated inside the kernel.
    pub(super) fn bandwidth(
        &self,
        timer: &mut Timer,
        get: bool,
        bidir: bool,
        ctas: u32,
        bytes: usize,
    ) -> Result<Record> {
        timing::step(format!(
            "p2p {} bandwidth {}, {ctas} CTAs, {}",
            if get { "get" } else { "put" },
            if bidir { "both ways" } else { "one way" },
            format_size(bytes)
        ));
        let (warm, launches) = self.cfg.iters_for(bytes);
        let reps = self.cfg.bw_reps_for(bytes);
        let key = data::key(
            self.cfg.seed,
            &[K_BW, get as u64, bidir as u64, ctas as u64, bytes as u64],
        );
        let total = (warm + launches) * reps;
        let slots = Slots::new(bytes, self.src.len().min(self.dst.len()));
        if get {
            self.prepare_get(key, bytes, slots.used_bytes(total))?;
        } else {
            self.prepare_put(key, bytes, slots.used_bytes(total))?;
        }
        let active = self.is_initiator() || (bidir && self.is_target());
        let f = if active {
            Some(self.function(if get { GET_BW_KERNEL } else { PUT_BW_KERNEL })?)
        } else {
            None
        };
        let cfg = LaunchConfig {
            grid_dim: (ctas, 1, 1),
            block_dim: (self.cfg.block_threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let raw = self.raw_stream();
        let samples = timer.time_each(
            self.stream,
            warm + launches,
            reps,
            |_| {
                if bidir {
                    // Both directions start together.
                    self.bind()?;
                    unsafe { sys::nvshmemx_barrier_all_on_stream(raw) };
                }
                Ok(())
            },
            |launch| match &f {
                Some(f) => {
                    let mut args = KernelArgs::new();
                    args.value(self.dst.addr())
                        .value(self.src.addr())
                        .value(slots.slot_bytes)
                        .value(slots.nslots)
                        .value(launch * reps)
                        .value(bytes)
                        .value(self.other() as i32)
                        .value(reps as i32);
                    // SAFETY: matches bench_{put,get}_bw(char*, const char*, size_t, size_t,
                    // size_t, size_t, int, int); the slots lie within both buffers on every PE.
                    unsafe { f.launch(cfg, self.stream, &mut args)? };
                    Ok(())
                }
                None => Ok(()),
            },
        )?;
        self.finish()?;
        // put: the target receives PE 0's bytes (and PE 0 the target's when both ways) in the
        // last repetition's slot; get: PE 0 fetches the target's bytes (and the target PE
        // 0's when both ways) from the last repetition's slot.
        let receives = match get {
            false => self.is_target() || (bidir && self.is_initiator()),
            true => self.is_initiator() || (bidir && self.is_target()),
        };
        let local = if receives {
            self.check_slot(key, self.other(), get, slots.offset(total - 1), bytes)?
        } else {
            Mismatch::default()
        };
        let check = self.agree(local)?;
        let samples = if self.is_initiator() {
            samples[warm..].to_vec()
        } else {
            Vec::new()
        };
        let dirs = if bidir { 2.0 } else { 1.0 };
        Ok(self.record(
            if get { "get_bw" } else { "put_bw" },
            &bw_variant(bidir, ctas),
            "device",
            "bytes",
            bytes,
            &samples,
            dirs,
            check,
        ))
    }
}
