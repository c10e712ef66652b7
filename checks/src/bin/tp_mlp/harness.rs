//! The harness: each check run by name on every PE, its failures tallied over the PEs, the
//! buffers and collectives the checks share, and the timing of CUDA graphs.

use nvshmem::cudarc::driver::sys::CUevent_flags;
use nvshmem::cudarc::driver::{CudaGraph, CudaStream};
use nvshmem::tp::{Schedule, TensorParallel};
use nvshmem::{bf16, AllGatherAlgo, DeviceBuffer, Error, Nvshmem, ReduceOp, SymmetricBuffer};
use std::sync::Arc;

use nvshmem_checks::graph;

use crate::reference::bits;

pub type Outcome = Result<(), String>;

pub fn text(e: Error) -> String {
    e.to_string()
}

/// Every schedule is checked. Overlapped overlaps a sequence-parallel column layer's
/// all-gather and is sequential elsewhere; Fused runs the fused decode kernel up to
/// `FUSED_DECODE_MAX_TOKENS` tokens (where the output's rows are whole lines) and is
/// sequential above, at these sizes; Auto, with the default thresholds, is sequential at
/// these sizes (`sequence_parallel_auto` checks its choice).
pub const SCHEDULES: [Schedule; 4] = [
    Schedule::Sequential,
    Schedule::Overlapped,
    Schedule::Fused,
    Schedule::Auto,
];

/// The group the checks run on, and each check's name and whether it failed on this PE.
pub struct Checks {
    pub shmem: Nvshmem,
    pub tp: TensorParallel,
    pub stream: Arc<CudaStream>,
    pub verbose: bool,
    names: Vec<String>,
    failed: Vec<i32>,
}

impl Checks {
    pub fn new(shmem: Nvshmem, tp: TensorParallel, verbose: bool) -> Self {
        Checks {
            stream: shmem.stream().clone(),
            shmem,
            tp,
            verbose,
            names: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Run check `name` on every PE: each group on data of its own (its seed mixes in the
    /// group's first world PE), so that data crossing between groups shows.
    pub fn run(&mut self, name: String, f: impl FnOnce(&Self, u64) -> Outcome) {
        let first = self.tp.collectives().world_pe(0).unwrap_or(0) as u64;
        let seed = name.bytes().fold(0xCBF2_9CE4_8422_2325u64 ^ first, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
        });
        let outcome = f(self, seed);
        match &outcome {
            Err(e) => eprintln!("[PE {}] FAIL {name}: {e}", self.shmem.my_pe()),
            Ok(()) if self.verbose && self.shmem.my_pe() == 0 => eprintln!("ok   {name}"),
            Ok(()) => {}
        }
        if let Err(e) = self.shmem.barrier_all() {
            eprintln!("[PE {}] barrier after {name}: {e}", self.shmem.my_pe());
        }
        self.names.push(name);
        self.failed.push(outcome.is_err() as i32);
    }

    /// The checks that failed on any PE of the world (NVSHMEM's own reduction, whatever the
    /// groups), and how many passed.
    pub fn finish(&self) -> Result<(usize, usize), Error> {
        let mine = self.shmem.malloc::<i32>(self.failed.len())?;
        let all = self.shmem.malloc::<i32>(self.failed.len())?;
        mine.copy_from_host(&self.failed)?;
        self.shmem
            .team_world()
            .all_reduce(&all, &mine, ReduceOp::Sum, &self.stream)?;
        sync(&self.stream)?;
        let totals = all.to_vec()?;
        if self.shmem.my_pe() == 0 {
            for (name, pes) in self.names.iter().zip(&totals).filter(|(_, &t)| t > 0) {
                eprintln!("FAILED {name} (on {pes} of {} PEs)", self.shmem.n_pes());
            }
        }
        let failed = totals.iter().filter(|&&t| t > 0).count();
        Ok((totals.len() - failed, failed))
    }

    /// This PE's place in its group.
    pub fn me(&self) -> usize {
        self.tp.my_pe()
    }

    /// The group's PEs.
    pub fn n(&self) -> usize {
        self.tp.n_pes()
    }

    pub fn symmetric(&self, data: &[bf16]) -> Result<SymmetricBuffer<bf16>, String> {
        let b = self.shmem.malloc::<bf16>(data.len()).map_err(text)?;
        b.copy_from_host(data).map_err(text)?;
        Ok(b)
    }

    pub fn device(&self, data: &[bf16]) -> Result<DeviceBuffer<bf16>, String> {
        let b = self.shmem.alloc_device::<bf16>(data.len()).map_err(text)?;
        b.copy_from_host(data).map_err(text)?;
        Ok(b)
    }

    /// Every PE of the group's `y` must have the same bits: each PE's hash, all-gathered.
    pub fn identical(&self, what: &str, y: &[bf16]) -> Outcome {
        let hash = y.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, v| {
            (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01B3)
        });
        let mine = self.shmem.malloc::<u64>(1).map_err(text)?;
        let all = self.shmem.malloc::<u64>(self.n()).map_err(text)?;
        mine.copy_from_host(&[hash]).map_err(text)?;
        self.tp
            .collectives()
            .all_gather(&all, &mine, AllGatherAlgo::Auto, &self.stream)
            .map_err(text)?;
        sync(&self.stream).map_err(text)?;
        let hashes = all.to_vec().map_err(text)?;
        match hashes.iter().position(|&h| h != hashes[0]) {
            None => Ok(()),
            Some(pe) => Err(format!(
                "{what}: group PE {pe}'s output differs from group PE 0's"
            )),
        }
    }
}

pub fn sync(stream: &CudaStream) -> Result<(), Error> {
    stream.synchronize().map_err(|source| Error::Cuda {
        call: "cuStreamSynchronize",
        source,
    })
}

/// [`graph::capture`], its error as the checks' text.
pub fn capture(
    stream: &Arc<CudaStream>,
    op: impl FnOnce() -> Result<(), Error>,
) -> Result<CudaGraph, String> {
    graph::capture(stream, op).map_err(text)
}

pub fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// Graph replays of `graph` timed with CUDA events, after a warm-up: microseconds each.
pub fn time_graph(c: &Checks, graph: &CudaGraph, iters: usize) -> Result<Vec<f64>, String> {
    let ctx = c.shmem.context();
    let ev = |_| {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| format!("cuEventCreate: {e}"))
    };
    let events: Vec<_> = (0..=iters).map(ev).collect::<Result<_, _>>()?;
    for _ in 0..5 {
        graph.launch().map_err(|e| format!("cuGraphLaunch: {e}"))?;
    }
    // Every PE starts its timed replays together.
    sync(&c.stream).map_err(text)?;
    c.shmem.barrier_all().map_err(text)?;
    events[0]
        .record(&c.stream)
        .map_err(|e| format!("cuEventRecord: {e}"))?;
    for e in &events[1..] {
        graph.launch().map_err(|e| format!("cuGraphLaunch: {e}"))?;
        e.record(&c.stream)
            .map_err(|e| format!("cuEventRecord: {e}"))?;
    }
    sync(&c.stream).map_err(text)?;
    events
        .windows(2)
        .map(|w| {
            w[0].elapsed_ms(&w[1])
                .map(|ms| ms as f64 * 1e3)
                .map_err(|e| format!("cuEventElapsedTime: {e}"))
        })
        .collect()
}

/// Time each of `calls` (enqueued on the checks' stream, each into its own output, which
/// `read(i)` returns) in CUDA graphs, in 5 alternating blocks, after checking that every
/// timed graph's output is its eager call's, bit for bit. Cells: median [p10, p90] in µs.
pub fn time_calls(
    c: &Checks,
    iters: usize,
    calls: &[&dyn Fn() -> Result<(), Error>],
    read: &dyn Fn(usize) -> Result<Vec<bf16>, String>,
) -> Result<Vec<String>, String> {
    let s = &c.stream;
    let mut eager = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        call().map_err(text)?;
        sync(s).map_err(text)?;
        eager.push(bits(&read(i)?));
    }
    let graphs: Vec<_> = calls
        .iter()
        .map(|call| capture(s, call))
        .collect::<Result<_, _>>()?;
    let mut times = vec![Vec::new(); graphs.len()];
    for _ in 0..5 {
        for (g, t) in graphs.iter().zip(&mut times) {
            t.extend(time_graph(c, g, iters.div_ceil(5))?);
        }
    }
    for (i, want) in eager.iter().enumerate() {
        if bits(&read(i)?) != *want {
            return Err(format!(
                "timed graph {i}'s output differs from its eager call"
            ));
        }
    }
    let cell = |(med, p10, p90): (f64, f64, f64)| format!("{med:.1} [{p10:.1}, {p90:.1}]");
    Ok(times.into_iter().map(|v| cell(median(v))).collect())
}
