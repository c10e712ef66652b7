//! The harness: the context every check gets, the named checks with their watchdog and
//! tally, and the helpers that turn outcomes into results.

use crate::data::seed_of;
use crate::Result;
use nvshmem::{CudaStream, Element, Error, Nvshmem, ReduceOp, SymmetricBuffer, Team};
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A check that runs longer than this is taken to hang: the PE reports it and aborts.
const CHECK_TIME_LIMIT: Duration = Duration::from_secs(30);

/// Element-by-element equality, reporting how many differ and the first.
pub(crate) fn same<T: PartialEq + Debug>(what: &str, got: &[T], want: &[T]) -> Result {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, expected {}", got.len(), want.len()).into());
    }
    let mut bad = (0..got.len()).filter(|&i| got[i] != want[i]);
    if let Some(i) = bad.next() {
        let count = 1 + bad.count();
        return Err(format!(
            "{what}: {count} of {} elements wrong; first at {i}: got {:?}, expected {:?}",
            got.len(),
            got[i],
            want[i]
        )
        .into());
    }
    Ok(())
}

pub(crate) fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// `r` must be an error that `expected` accepts.
pub(crate) fn refused<T: Debug>(
    what: &str,
    r: nvshmem::Result<T>,
    expected: fn(&Error) -> bool,
) -> Result {
    match r {
        Ok(v) => Err(format!("{what}: accepted (returned {v:?}), expected an error").into()),
        Err(e) if expected(&e) => Ok(()),
        Err(e) => Err(format!("{what}: refused with the wrong error: {e}").into()),
    }
}

pub(crate) fn pe_error(e: &Error) -> bool {
    matches!(e, Error::PeOutOfRange { .. })
}

pub(crate) fn length_error(e: &Error) -> bool {
    matches!(e, Error::Length { .. })
}

pub(crate) fn argument_error(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument(_))
}

pub(crate) fn index_error(e: &Error) -> bool {
    matches!(e, Error::IndexOutOfRange { .. })
}

pub(crate) fn type_error(e: &Error) -> bool {
    matches!(e, Error::TypeMismatch { .. })
}

pub(crate) fn overlap_error(e: &Error) -> bool {
    matches!(e, Error::Overlap { .. })
}

/// Collects the problems of a check that must go on to the end (its later steps are collective,
/// so returning early would leave the other PEs waiting).
#[derive(Default)]
pub(crate) struct Problems(Vec<String>);

impl Problems {
    pub(crate) fn note(&mut self, r: Result) {
        if let Err(e) = r {
            self.0.push(e.to_string());
        }
    }

    pub(crate) fn done(self) -> Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0.join("; ").into())
        }
    }
}

pub(crate) struct Ctx {
    pub(crate) shmem: Nvshmem,
    pub(crate) world: Team,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) me: usize,
    pub(crate) n: usize,
    pub(crate) left: usize,
    pub(crate) right: usize,
}

impl Ctx {
    pub(crate) fn new(shmem: Nvshmem) -> Result<Self> {
        let (me, n) = (shmem.my_pe(), shmem.n_pes());
        Ok(Ctx {
            world: shmem.team_world(),
            stream: shmem.new_stream()?,
            me,
            n,
            left: (me + n - 1) % n,
            right: (me + 1) % n,
            shmem,
        })
    }

    /// Wait for the check's stream.
    pub(crate) fn sync(&self) -> Result {
        self.stream
            .synchronize()
            .map_err(|e| format!("cuStreamSynchronize: {e:?}"))?;
        Ok(())
    }

    /// A symmetric buffer holding `data` (collective: same length on every PE).
    pub(crate) fn upload<T: Element>(&self, data: &[T]) -> Result<SymmetricBuffer<T>> {
        let buf = self.shmem.malloc::<T>(data.len())?;
        buf.copy_from_host(data)?;
        Ok(buf)
    }

    /// A zeroed symmetric buffer, zeroed on every PE before any PE goes on to write into it
    /// (collective).
    pub(crate) fn zeros<T: Element>(&self, len: usize) -> Result<SymmetricBuffer<T>> {
        let buf = self.shmem.calloc::<T>(len)?;
        self.shmem.barrier_all()?;
        Ok(buf)
    }

    /// The even PEs, as a team (`None` on odd PEs). Collective.
    pub(crate) fn evens(&self) -> Result<Option<Team>> {
        Ok(self.world.split_strided(0, 2, self.n.div_ceil(2))?)
    }
}

pub(crate) struct Harness<'c> {
    pub(crate) ctx: &'c Ctx,
    pub(crate) verbose: bool,
    pub(crate) names: Vec<String>,
    pub(crate) failed: Vec<u32>,
    pub(crate) current: Arc<Mutex<(String, Instant)>>,
}

impl<'c> Harness<'c> {
    pub(crate) fn new(ctx: &'c Ctx, verbose: bool) -> Self {
        let current = Arc::new(Mutex::new(("start-up".to_string(), Instant::now())));
        let watched = current.clone();
        let me = ctx.me;
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(250));
            let (name, since) = watched.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if since.elapsed() > CHECK_TIME_LIMIT {
                eprintln!(
                    "[PE {me}] check `{name}` still running after {} s: taking it as hung, aborting",
                    CHECK_TIME_LIMIT.as_secs()
                );
                // Not exit(): its handlers would tear down CUDA and NVSHMEM under the check,
                // which keeps running, failing on every call. Abort stops every thread at once.
                std::process::abort();
            }
        });
        Harness {
            ctx,
            verbose,
            names: Vec::new(),
            failed: Vec::new(),
            current,
        }
    }

    /// Run one named check; `f` gets the check's seed.
    pub(crate) fn check(&mut self, name: impl Into<String>, f: impl FnOnce(u64) -> Result) {
        let name = name.into();
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = (name.clone(), Instant::now());
        let outcome = catch_unwind(AssertUnwindSafe(|| f(seed_of(&name))));
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(panic) => Some(match panic.downcast_ref::<String>() {
                Some(s) => format!("panicked: {s}"),
                None => match panic.downcast_ref::<&str>() {
                    Some(s) => format!("panicked: {s}"),
                    None => "panicked".to_string(),
                },
            }),
        };
        match &failure {
            Some(msg) => eprintln!("[PE {}] FAIL {name}: {msg}", self.ctx.me),
            None if self.verbose && self.ctx.me == 0 => eprintln!("ok   {name}"),
            None => {}
        }
        // Keep the PEs in step between checks.
        if let Err(e) = self.ctx.shmem.barrier_all() {
            eprintln!("[PE {}] barrier after {name} failed: {e}", self.ctx.me);
        }
        self.names.push(name);
        self.failed.push(failure.is_some() as u32);
    }

    /// Sum the failures over PEs; returns (passed, failed) counted over checks.
    pub(crate) fn finish(self) -> Result<(usize, usize)> {
        let c = self.ctx;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) =
            ("the final tally".into(), Instant::now());
        let mine = c.upload(&self.failed)?;
        let all = c.shmem.malloc::<u32>(self.failed.len())?;
        c.world.all_reduce(&all, &mine, ReduceOp::Sum, &c.stream)?;
        c.sync()?;
        let totals = all.to_vec()?;
        if c.me == 0 {
            for (name, pes) in self.names.iter().zip(&totals).filter(|(_, &t)| t > 0) {
                eprintln!("FAILED {name} (on {pes} of {} PEs)", c.n);
            }
        }
        let failed = totals.iter().filter(|&&t| t > 0).count();
        Ok((totals.len() - failed, failed))
    }
}
