//! cudarc and nvshmem in one program, as a crate built on candle or burn would mix them: the
//! program's own cudarc context becomes the PE's, cudarc allocates and runs a kernel, our
//! all-reduce sums across the PEs on cudarc's stream, cudarc copies the result back, and a
//! channel hands a cudarc slice to the next PE straight from and into cudarc's memory.
//!
//! ```text
//! make run EXAMPLE=cudarc_interop NP=4
//! nvshmemrun -np 4 target/release/examples/cudarc_interop
//! ```
//!
//! Every PE starts from `x[i] = i % 1024`, cudarc's kernel makes it `(pe + 1) x[i] + pe`,
//! and the sum over the PEs (exact in f32 for up to 180 PEs) and what came from the previous
//! PE are checked on the host. Prints `1 passed, 0 failed` on PE 0 (or the first difference)
//! and exits non-zero on failure.

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::cudarc::driver::sys::CUdevice_attribute::{
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as CC_MAJOR,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as CC_MINOR,
};
use nvshmem::cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use nvshmem::cudarc::nvrtc::Ptx;
use nvshmem::{AllReduceAlgo, Collectives, InitOptions, Nvshmem, ReduceOp};

/// The cudarc kernel (examples/kernels/affine.cu).
mod kernels {
    include!(concat!(env!("OUT_DIR"), "/examples/kernels.rs"));
}

const N: usize = 1 << 20;

fn main() {
    match run() {
        Ok(0) => println!("cudarc_interop: 1 passed, 0 failed"),
        Ok(_) => {}
        Err(e) => {
            eprintln!("cudarc_interop: {e}");
            println!("cudarc_interop: 0 passed, 1 failed");
            std::process::exit(1);
        }
    }
}

/// The GPU of this process by its rank on the node, as the launchers number them: a
/// program that made its context before NVSHMEM starts picks the device itself.
fn local_rank() -> usize {
    [
        "MPI_LOCALRANKID",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "SLURM_LOCALID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
    .unwrap_or(0)
}

fn run() -> Result<usize, Box<dyn std::error::Error>> {
    // The program's context and stream, made with cudarc before NVSHMEM starts.
    let ctx = CudaContext::new(local_rank() % CudaContext::device_count()? as usize)?;
    let stream = ctx.new_stream()?;
    let shmem = Nvshmem::init_with(InitOptions::new().context(ctx.clone()))?;
    let (pe, n_pes) = (shmem.my_pe(), shmem.n_pes());

    // cudarc's memory and kernel.
    let start: Vec<f32> = (0..N).map(|i| (i % 1024) as f32).collect();
    let mut x = stream.clone_htod(&start)?;
    let (major, minor) = (ctx.attribute(CC_MAJOR)?, ctx.attribute(CC_MINOR)?);
    let cubin = kernels::AFFINE.image_for(major, minor)?;
    let module = ctx.load_module(Ptx::from_binary(cubin.bytes.to_vec()))?;
    let affine = module.load_function("affine")?;
    let (a, b, n) = ((pe + 1) as f32, pe as f32, N as u64);
    let mut launch = stream.launch_builder(&affine);
    launch.arg(&mut x).arg(&a).arg(&b).arg(&n);
    unsafe { launch.launch(LaunchConfig::for_num_elems(N as u32)) }?;

    // Into symmetric memory with cudarc's copy (our buffers are cudarc's DevicePtrMut), the
    // all-reduce on cudarc's stream, and back out with cudarc (our buffers are DevicePtr).
    let coll = Collectives::new(&shmem)?;
    let mut sum = shmem.malloc::<f32>(N)?;
    stream.memcpy_dtod(&x, &mut sum)?;
    coll.all_reduce(&sum, &sum, ReduceOp::Sum, AllReduceAlgo::Auto, &stream)?;
    let got = stream.clone_dtoh(&sum)?;

    // The sum over p of (p + 1) v + p is v n (n + 1) / 2 + n (n - 1) / 2.
    let n = n_pes as f64;
    let want = |i: usize| ((i % 1024) as f64 * n * (n + 1.0) / 2.0 + n * (n - 1.0) / 2.0) as f32;
    if let Some(i) = (0..N).find(|&i| got[i] != want(i)) {
        return Err(format!("PE {pe}: sum[{i}] = {}, expected {}", got[i], want(i)).into());
    }

    // cudarc's slices are device memory to our calls: PE p sends its x to PE p + 1.
    let ring: Vec<Channel<f32>> = (0..n_pes)
        .map(|p| Channel::new(&shmem, ChannelConfig::new(p, (p + 1) % n_pes, N)))
        .collect::<nvshmem::Result<_>>()?;
    let mut from_prev = stream.alloc_zeros::<f32>(N)?;
    ring[pe].send(&x, &stream)?;
    ring[(pe + n_pes - 1) % n_pes].recv(&mut from_prev, &stream)?;
    let prev = (pe + n_pes - 1) % n_pes;
    let got = stream.clone_dtoh(&from_prev)?;
    let want = |i: usize| ((prev + 1) * (i % 1024) + prev) as f32;
    if let Some(i) = (0..N).find(|&i| got[i] != want(i)) {
        return Err(format!(
            "PE {pe}: from PE {prev}[{i}] = {}, expected {}",
            got[i],
            want(i)
        )
        .into());
    }
    shmem.barrier_all()?;
    Ok(pe)
}
