//! Hello from every PE: initialise NVSHMEM, pass a block of data one step round the ring of
//! PEs with a put-with-signal on a stream, wait for our own, and check it arrived.
//!
//! ```text
//! make run EXAMPLE=hello NP=4
//! mpiexec -np 4 target/release/examples/hello
//! mpiexec -np 4 target/release/examples/hello --uid-file /tmp/hello.uid   # unique-ID start
//! ```
//!
//! With `--uid-file`, NVSHMEM starts without the launcher's PMI: rank 0 makes a `UniqueId`
//! and writes it to the (new) file, the other ranks read it, and every rank calls
//! `init_with_unique_id`. Only the rank and size come from the launcher's environment, as a
//! program with its own launcher would hand them out.

use nvshmem::{Cmp, Error, InitOptions, Nvshmem, SignalOp, UniqueId};
use std::path::Path;
use std::time::{Duration, Instant};

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

/// Rank and size as MPICH/hydra, Open MPI or Slurm hand them to each process.
fn launcher_rank_and_size() -> Option<(usize, usize)> {
    let var = |k: &str| std::env::var(k).ok()?.parse::<usize>().ok();
    [
        ("PMI_RANK", "PMI_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ]
    .iter()
    .find_map(|(r, s)| Some((var(r)?, var(s)?)))
}

fn init_with_uid_file(path: &Path) -> nvshmem::Result<Nvshmem> {
    let (rank, size) = launcher_rank_and_size().ok_or_else(|| {
        Error::InvalidArgument(
            "--uid-file needs PMI_RANK/PMI_SIZE (or the Open MPI / Slurm equivalents)".into(),
        )
    })?;
    let io = |e: std::io::Error| Error::InvalidArgument(format!("{}: {e}", path.display()));
    let id = if rank == 0 {
        let id = UniqueId::new()?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, id.to_bytes()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        id
    } else {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match std::fs::read(path) {
                Ok(bytes) if bytes.len() == UniqueId::SIZE => break UniqueId::from_bytes(&bytes)?,
                _ if Instant::now() > deadline => {
                    return Err(Error::InvalidArgument(format!(
                        "no unique ID in {} after 60 s",
                        path.display()
                    )))
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    };
    Nvshmem::init_with_unique_id(rank, size, &id, InitOptions::new())
}

fn run() -> nvshmem::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let uid_file = args
        .windows(2)
        .find(|w| w[0] == "--uid-file")
        .map(|w| w[1].clone());
    let shmem = match &uid_file {
        Some(path) => init_with_uid_file(Path::new(path))?,
        None => Nvshmem::init()?,
    };
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let src = shmem.malloc::<i32>(N)?;
    let dst = shmem.calloc::<i32>(N)?;
    let flag = shmem.calloc::<u64>(1)?;
    src.copy_from_host(&(0..N).map(|i| pattern(me, i)).collect::<Vec<_>>())?;

    // Our block into the next PE's `dst`, then its flag; then wait for the previous PE's.
    let stream = shmem.stream();
    shmem.put_signal_on_stream(&dst, &src, &flag, 0, 1, SignalOp::Set, (me + 1) % n, stream)?;
    shmem.signal_wait_until_on_stream(&flag, 0, Cmp::Eq, 1, stream)?;
    stream.synchronize().map_err(|e| nvshmem::Error::Cuda {
        call: "cuStreamSynchronize",
        source: e,
    })?;

    let prev = (me + n - 1) % n;
    let got = dst.to_vec()?;
    let bad = (0..N).filter(|&i| got[i] != pattern(prev, i)).count();
    let info = shmem.info()?;
    println!(
        "hello from PE {me} of {n} on GPU {} ({}): received {N} ints from PE {prev}: {}",
        info.device,
        info.device_name,
        if bad == 0 {
            "ok".to_string()
        } else {
            format!("{bad} WRONG")
        }
    );
    if me == 0 {
        let start = if uid_file.is_some() {
            "unique-ID bootstrap"
        } else {
            "launcher bootstrap"
        };
        println!("{info} ({start})");
    }
    if bad != 0 {
        return Err(nvshmem::Error::InvalidArgument(format!(
            "{bad} elements wrong on PE {me}"
        )));
    }
    Ok(())
}
