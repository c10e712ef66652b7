//! The harness: named checks run on every PE and tallied, and the helpers the checks share
//! (host synchronisation, buffers, comparison with the reference, expected errors).

use nvshmem::{Collectives, Error, Nvshmem, ReduceOp, Result, SymmetricBuffer};

use crate::reference::{inputs, Reducible};

pub(crate) struct Checker {
    pub(crate) shmem: Nvshmem,
    pub(crate) passed: usize,
    pub(crate) failed: usize,
    pub(crate) seq: u64,
    /// Only the checks whose name holds this run (the same on every PE).
    pub(crate) only: Option<String>,
}

impl Checker {
    /// Run one named check on every PE; it fails if it fails on any PE.
    pub(crate) fn check(&mut self, name: &str, f: impl FnOnce(&Nvshmem, u64) -> Result<()>) {
        self.seq += 1;
        if self
            .only
            .as_ref()
            .is_some_and(|only| !name.contains(only.as_str()))
        {
            return;
        }
        let mine = match f(&self.shmem, self.seq) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("PE {}: FAIL {name}: {e}", self.shmem.my_pe());
                if matches!(e, Error::Cuda { .. }) {
                    // A kernel fault leaves the context unusable and peers waiting: stop all.
                    eprintln!(
                        "PE {}: CUDA context lost, aborting the run",
                        self.shmem.my_pe()
                    );
                    std::process::exit(3);
                }
                1
            }
        };
        match any_pe(&self.shmem, mine) {
            Ok(0) => self.passed += 1,
            Ok(_) => {
                self.failed += 1;
                if self.shmem.my_pe() == 0 {
                    println!("FAIL {name}");
                }
            }
            Err(e) => {
                eprintln!(
                    "PE {}: cannot combine results of {name}: {e}",
                    self.shmem.my_pe()
                );
                self.failed += 1;
            }
        }
    }
}

/// Sum of a per-PE count over all PEs, through NVSHMEM's own reduction (not our kernels).
pub(crate) fn any_pe(shmem: &Nvshmem, mine: i32) -> Result<i32> {
    let buf = shmem.malloc::<i32>(2)?;
    buf.view(..1).copy_from_host(&[mine])?;
    shmem
        .team_world()
        .all_reduce(buf.view(1..), buf.view(..1), ReduceOp::Sum, shmem.stream())?;
    Ok(buf.to_vec()?[1])
}

pub(crate) fn sync(shmem: &Nvshmem) -> Result<()> {
    shmem.stream().synchronize().map_err(|source| Error::Cuda {
        call: "cuStreamSynchronize",
        source,
    })
}

/// A new symmetric buffer holding each of `data`: the inputs of calls made back to back.
pub(crate) fn uploaded<'a>(
    shmem: &Nvshmem,
    data: impl IntoIterator<Item = &'a [f32]>,
) -> Result<Vec<SymmetricBuffer<f32>>> {
    data.into_iter()
        .map(|x| {
            let b = shmem.malloc::<f32>(x.len())?;
            b.copy_from_host(x)?;
            Ok(b)
        })
        .collect()
}

/// `count` new zeroed symmetric buffers of `len` elements: the outputs of such calls.
pub(crate) fn zeroed(
    shmem: &Nvshmem,
    count: usize,
    len: usize,
) -> Result<Vec<SymmetricBuffer<f32>>> {
    (0..count).map(|_| shmem.calloc::<f32>(len)).collect()
}

/// This PE's number in `coll`'s team and the team's size (the world's for
/// `Collectives::new`): the numbers a call's inputs and results are laid out by.
pub(crate) fn place(coll: &Collectives) -> Result<(usize, usize)> {
    coll.check()?;
    Ok((coll.my_pe().unwrap_or(0), coll.n_pes()))
}

/// Every team PE's input of case `seed` (`len` elements each); this PE's in a new symmetric
/// buffer; and a new output of as many elements filled with other random data, which an
/// element the call does not write keeps: `(all, src, dst, that data)`.
#[allow(clippy::type_complexity)]
pub(crate) fn operands<T: Reducible>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    len: usize,
) -> Result<(Vec<Vec<T>>, SymmetricBuffer<T>, SymmetricBuffer<T>, Vec<T>)> {
    let (me, np) = place(coll)?;
    let all = inputs::<T>(seed, np, len);
    let src = shmem.malloc::<T>(len)?;
    src.copy_from_host(&all[me])?;
    let poison = inputs::<T>(seed ^ 0xD57, np, len).swap_remove(me);
    let dst = shmem.malloc::<T>(len)?;
    dst.copy_from_host(&poison)?;
    Ok((all, src, dst, poison))
}

pub(crate) fn compare<T: Reducible>(what: &str, got: &[T], want: &[T]) -> Result<()> {
    if let Some(i) = (0..want.len()).find(|&i| got[i].bits() != want[i].bits()) {
        let wrong = (0..want.len())
            .filter(|&i| got[i].bits() != want[i].bits())
            .count();
        return Err(Error::InvalidArgument(format!(
            "{what}: {wrong} of {} elements differ, first at {i}: got {:?}, want {:?}",
            want.len(),
            got[i],
            want[i]
        )));
    }
    Ok(())
}

pub(crate) fn cuda<T>(
    call: &'static str,
    r: std::result::Result<T, nvshmem::cudarc::driver::DriverError>,
) -> Result<T> {
    r.map_err(|source| Error::Cuda { call, source })
}

/// The largest input per destination that the low-latency paths take in `coll`'s lines.
pub(crate) fn ll_limit(coll: &Collectives) -> usize {
    (coll.workspace().lines_slot_bytes - 16) / 2
}

/// `r` must be the error `expected` accepts.
pub(crate) fn expect_err(r: Result<()>, what: &str, expected: fn(&Error) -> bool) -> Result<()> {
    match r {
        Err(e) if expected(&e) => Ok(()),
        Err(e) => Err(Error::InvalidArgument(format!(
            "{what} was refused with the wrong error: {e}"
        ))),
        Ok(()) => Err(Error::InvalidArgument(format!("{what} was accepted"))),
    }
}
