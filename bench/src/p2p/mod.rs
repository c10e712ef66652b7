//! Point-to-point: device-initiated p/g, put/get, put-with-signal ping-pong and channel
//! ping-pong between persistent kernels (kernels in kernels/bench_p2p.cu), device bandwidth
//! over CTA counts, host-initiated and on-stream RMA, and NCCL send/recv. PE 0 talks to `--peer`; the other PEs only join barriers and checks.

mod channel;
mod device;
mod harness;
mod host;
mod layout;
pub mod matrix;
mod sendrecv;

use crate::cli::Config;
use crate::coord::Coord;
use crate::error::{Guard, Result};
use crate::nccl::Nccl;
use crate::report::Results;
use crate::timing::Timer;
use crate::Progress;
use cudarc::driver::CudaStream;
use layout::{region_len, G_SLOTS, G_STRIDE, P_SLOTS};
use nvshmem::module::Module;
use nvshmem::{Nvshmem, SymmetricBuffer};
use std::cell::Cell;
use std::sync::Arc;

/// Work-group scope of a device operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Thread,
    Warp,
    Block,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Thread, Scope::Warp, Scope::Block];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Thread => "thread",
            Scope::Warp => "warp",
            Scope::Block => "block",
        }
    }

    fn threads(self, block_threads: u32) -> u32 {
        match self {
            Scope::Thread => 1,
            Scope::Warp => 32,
            Scope::Block => block_threads,
        }
    }
}

// The kernels of kernels/bench_p2p.cu, by what they measure.
const P_KERNEL: &str = "bench_p_latency";
const G_KERNEL: &str = "bench_g_latency";
const PUT_BW_KERNEL: &str = "bench_put_bw";
const GET_BW_KERNEL: &str = "bench_get_bw";
const FILL_KERNEL: &str = "bench_fill_random";
const PUT_ALL_BW_KERNEL: &str = "bench_put_all_bw";

/// The kernel of put (or get) latency at `scope`.
fn latency_kernel(get: bool, scope: Scope) -> String {
    let op = if get { "get" } else { "put" };
    format!("bench_{op}_latency_{}", scope.name())
}

/// The kernel of the put-with-signal ping-pong at `scope`.
fn signal_kernel(scope: Scope) -> String {
    format!("bench_put_signal_pingpong_{}", scope.name())
}

/// The kernel of the channel ping-pong between persistent kernels at `scope`.
fn channel_kernel(scope: Scope) -> String {
    format!("bench_channel_pingpong_{}", scope.name())
}

/// Every kernel the tests look up.
#[cfg(test)]
fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = [
        P_KERNEL,
        G_KERNEL,
        PUT_BW_KERNEL,
        GET_BW_KERNEL,
        FILL_KERNEL,
        PUT_ALL_BW_KERNEL,
    ]
    .map(String::from)
    .into();
    for scope in Scope::ALL {
        names.extend([latency_kernel(false, scope), latency_kernel(true, scope)]);
        names.extend([signal_kernel(scope), channel_kernel(scope)]);
    }
    names
}

// Keys of the random data of each test.
const K_P: u64 = 1;
const K_G: u64 = 2;
const K_RMA: u64 = 3;
const K_SIGNAL: u64 = 4;
const K_BW: u64 = 5;
const K_HOST: u64 = 6;
const K_NCCL: u64 = 7;
const K_CHANNEL: u64 = 8;

/// Device-side state of the point-to-point tests (all PEs allocate it).
pub struct P2p<'a> {
    shmem: &'a Nvshmem,
    coord: &'a Coord,
    cfg: &'a Config,
    stream: &'a Arc<CudaStream>,
    module: Option<&'a Module>,
    nccl: Option<&'a Nccl>,
    progress: &'a Progress,
    me: usize,
    /// Who talks: PE 0 and `--peer`, every ordered pair in turn in the bandwidth matrix.
    from: Cell<usize>,
    peer: Cell<usize>,
    src: Guard<SymmetricBuffer<u8>>,
    dst: Guard<SymmetricBuffer<u8>>,
    sig: Guard<SymmetricBuffer<u64>>,
    times: Guard<SymmetricBuffer<u64>>,
    words: Guard<SymmetricBuffer<u32>>,
    gsum: Guard<SymmetricBuffer<u64>>,
    /// The `g` kernel's 8 MiB of scattered words.
    gwords: Guard<SymmetricBuffer<u32>>,
}

/// Run the selected point-to-point tests (collective over all PEs).
#[allow(clippy::too_many_arguments)]
pub fn run(
    shmem: &Nvshmem,
    coord: &Coord,
    cfg: &Config,
    stream: &Arc<CudaStream>,
    module: Option<&Module>,
    nccl: Option<&Nccl>,
    progress: &Progress,
    timer: &mut Timer,
    results: &mut Results,
) -> Result<()> {
    let max_bytes = cfg.max_size().max(64);
    let p = P2p {
        shmem,
        coord,
        cfg,
        stream,
        module,
        nccl,
        progress,
        me: shmem.my_pe(),
        from: Cell::new(0),
        peer: Cell::new(cfg.peer),
        src: Guard::new(shmem.malloc::<u8>(region_len(max_bytes))?),
        dst: Guard::new(shmem.calloc::<u8>(region_len(max_bytes))?),
        sig: Guard::new(shmem.calloc::<u64>(8)?),
        times: Guard::new(shmem.calloc::<u64>(cfg.warmup + cfg.iters + 1)?),
        words: Guard::new(shmem.calloc::<u32>(2 * P_SLOTS)?),
        gsum: Guard::new(shmem.calloc::<u64>(1)?),
        gwords: Guard::new(shmem.calloc::<u32>(G_SLOTS * G_STRIDE)?),
    };
    let t = cfg.tests;
    if t.p2p_latency {
        p.p_and_g(results)?;
        for get in [false, true] {
            for scope in Scope::ALL {
                for &bytes in &cfg.lat_sizes {
                    results.push(p.rma_latency(get, scope, bytes)?);
                }
                p.say_series(results, if get { "get" } else { "put" }, scope.name());
            }
        }
    }
    if t.p2p_signal {
        for scope in Scope::ALL {
            for &bytes in &cfg.lat_sizes {
                results.push(p.signal_pingpong(scope, bytes)?);
            }
            p.say_series(results, "put_signal_pingpong", scope.name());
        }
        for scope in Scope::ALL {
            for &bytes in &cfg.lat_sizes {
                results.push(p.channel_pingpong(scope, bytes)?);
            }
            p.say_series(results, "channel_pingpong_device", scope.name());
        }
    }
    if (t.p2p_signal || t.sendrecv) && nccl.is_some() {
        for &bytes in &cfg.lat_sizes {
            results.push(p.nccl_pingpong(timer, bytes)?);
        }
        p.say_series(results, "nccl_pingpong", "");
    }
    if t.p2p_bw {
        for get in [false, true] {
            for bidir in [false, true] {
                for &ctas in &cfg.ctas {
                    for &bytes in &cfg.sizes {
                        results.push(p.bandwidth(timer, get, bidir, ctas, bytes)?);
                    }
                    p.say_series(
                        results,
                        if get { "get_bw" } else { "put_bw" },
                        &bw_variant(bidir, ctas),
                    );
                }
            }
        }
    }
    if (t.p2p_bw || t.sendrecv) && nccl.is_some() {
        for bidir in [false, true] {
            for &bytes in &cfg.sizes {
                results.push(p.nccl_bandwidth(timer, bidir, bytes)?);
            }
            p.say_series(
                results,
                "nccl_sendrecv_bw",
                if bidir { "bidir" } else { "uni" },
            );
        }
    }
    if t.p2p_matrix {
        matrix::run(&p, timer, results)?;
    }
    if t.p2p_host {
        for test in ["host_put", "host_get", "stream_put", "stream_get"] {
            for &bytes in &cfg.lat_sizes {
                results.push(p.host_latency(timer, test, bytes)?);
            }
            p.say_series(results, test, "");
        }
    }
    Ok(())
}

fn bw_variant(bidir: bool, ctas: u32) -> String {
    format!("{} ctas={ctas}", if bidir { "bidir" } else { "uni" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cubin_has_exactly_the_kernels_the_tests_look_up() {
        crate::cubin_set::check_set(&crate::kernels::BENCH_P2P, &kernel_names());
    }

    #[test]
    fn scopes_pick_thread_counts() {
        assert_eq!(Scope::Thread.threads(512), 1);
        assert_eq!(Scope::Warp.threads(512), 32);
        assert_eq!(Scope::Block.threads(256), 256);
        assert_eq!(bw_variant(true, 8), "bidir ctas=8");
    }
}
