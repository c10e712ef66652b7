//! What every check shares: seeded random words, error helpers, the comparison of a received
//! buffer, and the runner that tallies the checks over every PE.

use nvshmem::{CudaStream, Error, Nvshmem, ReduceOp, Result};

use nvshmem_checks::splitmix;

/// Random words, seeded by the check and the PE.
pub(crate) fn random_words(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = splitmix::SplitMix64(seed);
    (0..len).map(|_| rng.next_u64() as u32).collect()
}

pub(crate) fn cuda<T>(
    call: &'static str,
    r: std::result::Result<T, nvshmem::cudarc::driver::DriverError>,
) -> Result<T> {
    r.map_err(|source| Error::Cuda { call, source })
}

pub(crate) fn sync(stream: &CudaStream) -> Result<()> {
    cuda("cuStreamSynchronize", stream.synchronize())
}

pub(crate) fn fail(what: String) -> Result<()> {
    Err(Error::InvalidArgument(what))
}

/// `got[..want.len()]` is `want`, and the rest is still `fill`.
pub(crate) fn compare(what: &str, got: &[u32], want: &[u32], fill: u32) -> Result<()> {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want.get(i).copied().unwrap_or(fill)) {
        let expected = want.get(i).copied().unwrap_or(fill);
        return fail(format!(
            "{what}: element {i} of {} is {:#x}, expected {expected:#x} (message of {})",
            got.len(),
            got[i],
            want.len()
        ));
    }
    Ok(())
}

pub(crate) const FILL: u32 = 0xDEAD_BEEF;

pub(crate) struct Checks {
    pub(crate) shmem: Nvshmem,
    pub(crate) names: Vec<String>,
    pub(crate) failed: Vec<i32>,
}

impl Checks {
    pub(crate) fn run(&mut self, name: &str, f: impl FnOnce(&Nvshmem) -> Result<()>) {
        let outcome = f(&self.shmem);
        if let Err(e) = &outcome {
            eprintln!("[PE {}] FAIL {name}: {e}", self.shmem.my_pe());
        }
        if let Err(e) = self.shmem.barrier_all() {
            eprintln!("[PE {}] barrier after {name}: {e}", self.shmem.my_pe());
        }
        self.names.push(name.to_string());
        self.failed.push(outcome.is_err() as i32);
    }

    /// (passed, failed) over every PE: a check fails if it failed anywhere.
    pub(crate) fn finish(&self) -> Result<(usize, usize)> {
        let mine = self.shmem.malloc::<i32>(self.failed.len())?;
        let all = self.shmem.malloc::<i32>(self.failed.len())?;
        mine.copy_from_host(&self.failed)?;
        let world = self.shmem.team_world();
        world.all_reduce(&all, &mine, ReduceOp::Max, self.shmem.stream())?;
        sync(self.shmem.stream())?;
        let all = all.to_vec()?;
        for (name, f) in self.names.iter().zip(&all) {
            if *f != 0 && self.shmem.my_pe() == 0 {
                eprintln!("failed: {name}");
            }
        }
        let failed = all.iter().filter(|f| **f != 0).count();
        Ok((all.len() - failed, failed))
    }
}
