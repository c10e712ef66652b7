//! A check program's tally: checks run one after another on every PE, each a name and an
//! outcome, and the count of those that passed everywhere.

use nvshmem::{Error, Nvshmem};

/// A check's outcome: what went wrong, as text.
pub type Outcome = Result<(), String>;

/// An error as a check's failure text.
pub fn e(err: Error) -> String {
    err.to_string()
}

/// Wait for the runtime's stream.
pub fn sync(shmem: &Nvshmem) -> Outcome {
    shmem
        .stream()
        .synchronize()
        .map_err(|err| format!("cuStreamSynchronize: {err:?}"))
}

/// Whether `r` is the error `want` describes.
pub fn expect_err<T: std::fmt::Debug>(
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

/// The checks run so far on this PE.
pub struct Checks {
    /// The runtime of the checks.
    pub shmem: Nvshmem,
    /// Every check's name, in order.
    pub names: Vec<String>,
    /// 1 where the check failed on this PE.
    pub failed: Vec<i32>,
}

impl Checks {
    /// No checks run yet.
    pub fn new(shmem: &Nvshmem) -> Self {
        Checks {
            shmem: shmem.clone(),
            names: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Run check `name`, then wait for every PE.
    pub fn run(&mut self, name: &str, f: impl FnOnce() -> Outcome) {
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
    pub fn finish(&self) -> nvshmem::Result<(usize, usize)> {
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
