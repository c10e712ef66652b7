//! Hello from every PE: initialise NVSHMEM, register the embedded ring kernel, pass a block of
//! data one step round the ring of PEs, and check it arrived.
//!
//! ```text
//! make run EXAMPLE=hello NP=4
//! mpiexec -np 4 target/release/examples/hello
//! ```

use nvshmem::kernels::Ring;
use nvshmem::Nvshmem;

const N: usize = 1 << 16;

fn main() {
    if let Err(e) = run() {
        eprintln!("hello: {e}");
        std::process::exit(1);
    }
}

fn pattern(pe: usize, i: usize) -> i32 {
    (pe as i32) * 1_000_003 + i as i32 * 7 + 1
}

fn run() -> nvshmem::Result<()> {
    let shmem = Nvshmem::init()?;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let src = shmem.malloc::<i32>(N)?;
    let dst = shmem.calloc::<i32>(N)?;
    let flag = shmem.calloc::<u64>(1)?;
    src.copy_from_host(&(0..N).map(|i| pattern(me, i)).collect::<Vec<_>>())?;

    let ring = Ring::new(&shmem)?;
    ring.put(&dst, &src, &flag, shmem.stream())?;
    shmem.stream().synchronize().map_err(|e| nvshmem::Error::Cuda { call: "cuStreamSynchronize", source: e })?;

    let prev = (me + n - 1) % n;
    let got = dst.to_vec()?;
    let bad = (0..N).filter(|&i| got[i] != pattern(prev, i)).count();
    let info = shmem.info()?;
    println!(
        "hello from PE {me} of {n} on GPU {} ({}): received {N} ints from PE {prev}: {}",
        info.device,
        info.device_name,
        if bad == 0 { "ok".to_string() } else { format!("{bad} WRONG") }
    );
    if me == 0 {
        println!("{info}");
    }
    if bad != 0 {
        return Err(nvshmem::Error::InvalidArgument(format!("{bad} elements wrong on PE {me}")));
    }
    Ok(())
}
