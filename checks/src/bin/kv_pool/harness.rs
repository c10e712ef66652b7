//! What every check shares: the pages' contents, their comparison, error helpers, and the
//! runner that tallies the checks over every PE.

use nvshmem::{Error, Nvshmem};

use nvshmem_checks::splitmix::{mix, SplitMix64};

use crate::PAGE_BYTES;

pub(crate) type Outcome = Result<(), String>;

/// The contents of page `index` of PE `pe` as written by PE `writer` in round `round`.
pub(crate) fn pattern(round: u64, writer: usize, pe: u32, index: u32) -> Vec<u8> {
    let seed = mix(round ^ mix(writer as u64 ^ mix(((pe as u64) << 32) | index as u64)));
    let mut rng = SplitMix64(seed);
    let mut out = Vec::with_capacity(PAGE_BYTES);
    while out.len() < PAGE_BYTES {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(PAGE_BYTES);
    out
}

/// Where `got` first differs from `want`, as text.
pub(crate) fn compare(what: &str, got: &[u8], want: &[u8]) -> Outcome {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: {} bytes differ, first at byte {i} (page {}, offset {}): got {:#04x}, expected {:#04x}",
            got.iter().zip(want).filter(|(g, w)| g != w).count(),
            i / PAGE_BYTES,
            i % PAGE_BYTES,
            got[i],
            want[i]
        )),
    }
}

pub(crate) fn e(err: Error) -> String {
    err.to_string()
}

pub(crate) fn sync(shmem: &Nvshmem) -> Outcome {
    shmem
        .stream()
        .synchronize()
        .map_err(|err| format!("cuStreamSynchronize: {err:?}"))
}

/// Whether `r` is the error `want` describes.
pub(crate) fn expect_err<T: std::fmt::Debug>(
    what: &str,
    r: nvshmem::Result<T>,
    want: impl Fn(&Error) -> bool,
) -> Outcome {
    match r {
        Err(err) if want(&err) => Ok(()),
        Err(err) => Err(format!("{what}: wrong error: {err}")),
        Ok(v) => Err(format!("{what}: succeeded ({v:?}), expected an error")),
    }
}

pub(crate) struct Checks {
    pub(crate) shmem: Nvshmem,
    pub(crate) names: Vec<String>,
    pub(crate) failed: Vec<i32>,
}

impl Checks {
    pub(crate) fn run(&mut self, name: &str, f: impl FnOnce() -> Outcome) {
        let outcome = f();
        if let Err(err) = &outcome {
            eprintln!("[PE {}] FAIL {name}: {err}", self.shmem.my_pe());
        }
        if let Err(err) = self.shmem.barrier_all() {
            eprintln!("[PE {}] barrier after {name}: {err}", self.shmem.my_pe());
        }
        self.names.push(name.to_string());
        self.failed.push(outcome.is_err() as i32);
    }

    /// How many checks passed and failed on every PE (a check fails if it failed anywhere).
    pub(crate) fn finish(&self) -> nvshmem::Result<(usize, usize)> {
        let counts = self.shmem.calloc::<i32>(self.failed.len())?;
        for (i, _) in self.failed.iter().enumerate().filter(|(_, &f)| f != 0) {
            self.shmem.atomic_add(&counts, i, 1, 0)?;
        }
        self.shmem.barrier_all()?;
        let totals = counts.to_vec()?;
        if self.shmem.my_pe() == 0 {
            for (name, pes) in self.names.iter().zip(&totals).filter(|(_, &t)| t > 0) {
                eprintln!("FAILED {name} (on {pes} of {} PEs)", self.shmem.n_pes());
            }
        }
        let failed = totals.iter().filter(|&&t| t > 0).count();
        Ok((totals.len() - failed, failed))
    }
}
