//! Teams: ordered subsets of PEs that collectives and synchronisation run over, and
//! NVSHMEM's own collectives over them ([`collectives`]).

pub mod collectives;

use crate::error::{Error, Result};
use crate::runtime::{host_call, Nvshmem};
use nvshmem_sys as sys;

/// A team of PEs. The predefined teams (world, shared, node) live as long as the runtime;
/// teams made by splitting are destroyed when dropped. Dropping one is collective over the
/// team: its PEs agree first, within `NVSHMEM_RS_TIMEOUT`. A PE that does not come leaves the
/// team undestroyed on the others, with a logged message, and strands their runtime (as a
/// barrier that gives up does) instead of hanging them.
///
/// ```no_run
/// # fn main() -> nvshmem::Result<()> {
/// let shmem = nvshmem::Nvshmem::init()?;
/// // The even PEs.
/// let world = shmem.team_world();
/// if let Some(evens) = world.split_strided(0, 2, (shmem.n_pes() + 1) / 2)? {
///     println!("PE {} is {} of {} evens", shmem.my_pe(), evens.my_pe().unwrap(), evens.n_pes());
/// }
/// # Ok(()) }
/// ```
pub struct Team {
    handle: sys::nvshmem_team_t,
    owned: bool,
    shmem: Nvshmem,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Team({}, {} PEs)", self.handle, self.n_pes())
    }
}

impl Nvshmem {
    /// All PEs.
    pub fn team_world(&self) -> Team {
        self.predefined(sys::NVSHMEM_TEAM_WORLD)
    }

    /// The PEs that share memory with this one (load/store reachable).
    pub fn team_shared(&self) -> Team {
        self.predefined(sys::NVSHMEM_TEAM_SHARED)
    }

    /// The PEs on this node.
    pub fn team_node(&self) -> Team {
        self.predefined(sys::NVSHMEMX_TEAM_NODE)
    }

    fn predefined(&self, handle: i32) -> Team {
        Team {
            handle,
            owned: false,
            shmem: self.clone(),
        }
    }
}

impl Team {
    /// The raw `nvshmem_team_t`, for kernels and FFI.
    pub fn handle(&self) -> sys::nvshmem_team_t {
        self.handle
    }

    /// The runtime.
    pub fn runtime(&self) -> &Nvshmem {
        &self.shmem
    }

    /// This PE's number in the team, `None` if it is not a member.
    pub fn my_pe(&self) -> Option<usize> {
        let _host = host_call();
        let pe = unsafe { sys::nvshmem_team_my_pe(self.handle) };
        (pe >= 0).then_some(pe as usize)
    }

    /// Number of PEs in the team.
    pub fn n_pes(&self) -> usize {
        let _host = host_call();
        unsafe { sys::nvshmem_team_n_pes(self.handle) }.max(0) as usize
    }

    /// The number in `dst` of this team's PE `pe`, `None` if it is not in `dst`.
    pub fn translate_pe(&self, pe: usize, dst: &Team) -> Result<Option<usize>> {
        self.check_pe(pe)?;
        let _host = host_call();
        let t = unsafe { sys::nvshmem_team_translate_pe(self.handle, pe as i32, dst.handle) };
        Ok((t >= 0).then_some(t as usize))
    }

    /// The world-team number of this team's PE `pe`.
    pub fn world_pe(&self, pe: usize) -> Result<usize> {
        self.translate_pe(pe, &self.shmem.team_world())?
            .ok_or_else(|| Error::InvalidArgument(format!("team PE {pe} has no world PE")))
    }

    /// Wait for every PE of the team, within the runtime's wait limit (the runtime's own
    /// bounded sync, not NVSHMEM's `nvshmem_team_sync`); `what` names the call in errors.
    pub(crate) fn sync_members(&self, what: &str) -> Result<()> {
        self.shmem.team_sync(self.handle, &self.members()?, what)
    }

    /// The team's PEs, as world PEs.
    fn members(&self) -> Result<Vec<usize>> {
        (0..self.n_pes()).map(|pe| self.world_pe(pe)).collect()
    }

    pub(crate) fn check_pe(&self, pe: usize) -> Result<i32> {
        let n = self.n_pes();
        if pe >= n {
            return Err(Error::PeOutOfRange { pe, n_pes: n });
        }
        Ok(pe as i32)
    }

    /// Split off the PEs `start, start + stride, ...` (`size` of them, numbered in this team).
    /// Collective over this team; PEs outside the new team get `None`.
    pub fn split_strided(&self, start: usize, stride: usize, size: usize) -> Result<Option<Team>> {
        let n = self.n_pes();
        if !strided_fits(start, stride, size, n) {
            return Err(Error::InvalidArgument(format!(
                "split_strided(start {start}, stride {stride}, size {size}) does not fit a team of {n} PEs"
            )));
        }
        let _host = self.shmem.host_call()?;
        let mut new = sys::NVSHMEM_TEAM_INVALID;
        let status = unsafe {
            sys::nvshmem_team_split_strided(
                self.handle,
                start as i32,
                stride as i32,
                size as i32,
                std::ptr::null(),
                0,
                &mut new,
            )
        };
        crate::error::check("nvshmem_team_split_strided", status)?;
        Ok(self.owned_team(new))
    }

    /// Split into a 2-D grid with rows of `x_range` PEs: returns this PE's row team (x) and
    /// column team (y). Collective over this team.
    pub fn split_2d(&self, x_range: usize) -> Result<(Option<Team>, Option<Team>)> {
        let x_range = x_range_arg(x_range)?;
        let _host = self.shmem.host_call()?;
        let (mut x, mut y) = (sys::NVSHMEM_TEAM_INVALID, sys::NVSHMEM_TEAM_INVALID);
        let status = unsafe {
            sys::nvshmem_team_split_2d(
                self.handle,
                x_range,
                std::ptr::null(),
                0,
                &mut x,
                std::ptr::null(),
                0,
                &mut y,
            )
        };
        crate::error::check("nvshmem_team_split_2d", status)?;
        Ok((self.owned_team(x), self.owned_team(y)))
    }

    fn owned_team(&self, handle: i32) -> Option<Team> {
        (handle != sys::NVSHMEM_TEAM_INVALID).then(|| Team {
            handle,
            owned: true,
            shmem: self.shmem.clone(),
        })
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let pe = Some(self.shmem.my_pe());
        let leave = |e: Error| {
            if !matches!(e, Error::Stranded(_)) {
                crate::diag::warn_pe!(pe, "leaving team {} undestroyed: {e}", self.handle);
            }
        };
        // A kernel may still use the team (its collectives on a stream): wait for the GPU
        // first. Destroying is NVSHMEM's clean-up of the team's state, which the other members'
        // collectives on the team still write into: the members then agree, with a bound, and
        // a member whose wait failed (a stream being captured, a sticky error) refuses, so that
        // every member leaves the team in place, its handle taken, rather than some destroying
        // it and others not. A member that does not come leaves it in place on the others.
        let gpu_wait = match self.shmem.quiesce() {
            Err(e @ Error::Stranded(_)) => return leave(e),
            waited => waited,
        };
        if let Err(e) = &gpu_wait {
            crate::diag::warn_pe!(pe, "team {} cannot wait for the GPU: {e}", self.handle);
        }
        let members = match self.members() {
            Ok(members) => members,
            Err(e) => return leave(e),
        };
        match self.shmem.team_verdict(
            self.handle,
            &members,
            "dropping the team",
            gpu_wait.is_err(),
        ) {
            Err(e) => return leave(e),
            Ok(true) => {
                crate::diag::warn_pe!(
                    pe,
                    "leaving team {} undestroyed on every member: a member could not wait for its \
                     GPU (a stream being captured into a CUDA graph, or a sticky error; see its \
                     log). Drop teams while no stream of the context is being captured",
                    self.handle
                );
                return;
            }
            Ok(false) => {}
        }
        if let Err(e) = self.shmem.team_syncs_end(self.handle) {
            return leave(e);
        }
        let Ok(_host) = self.shmem.host_call() else {
            return;
        };
        unsafe { sys::nvshmem_team_destroy(self.handle) };
    }
}

/// `split_2d`'s row length as NVSHMEM takes it: at least 1, and an `i32` (a larger one
/// would wrap to a negative length).
fn x_range_arg(x_range: usize) -> Result<i32> {
    match i32::try_from(x_range) {
        Ok(x) if x >= 1 => Ok(x),
        _ => Err(Error::InvalidArgument(format!(
            "split_2d(x_range {x_range}): give a row length from 1 to {}",
            i32::MAX
        ))),
    }
}

/// Whether PEs `start, start + stride, ...` (`size` of them) are all in a team of `n`
/// (without overflow: huge arguments do not fit, they do not wrap).
fn strided_fits(start: usize, stride: usize, size: usize, n: usize) -> bool {
    let last = (size.checked_sub(1))
        .and_then(|k| k.checked_mul(stride))
        .and_then(|span| span.checked_add(start));
    stride != 0 && last.is_some_and(|last| last < n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_2d_row_lengths_do_not_wrap() {
        assert_eq!(x_range_arg(1).unwrap(), 1);
        assert_eq!(x_range_arg(i32::MAX as usize).unwrap(), i32::MAX);
        for bad in [0, i32::MAX as usize + 1, 1 << 32, usize::MAX] {
            let e = x_range_arg(bad).unwrap_err();
            assert!(e.to_string().contains("row length"), "{e}");
        }
    }

    #[test]
    fn strided_splits_fit_without_overflow() {
        assert!(strided_fits(0, 2, 2, 4));
        assert!(strided_fits(1, 2, 2, 4));
        assert!(!strided_fits(1, 2, 3, 4));
        assert!(!strided_fits(0, 0, 1, 4));
        assert!(!strided_fits(0, 1, 0, 4));
        // These wrapped to a small number before.
        assert!(!strided_fits(1, usize::MAX, 2, 4));
        assert!(!strided_fits(usize::MAX, 1, 1, 4));
        assert!(!strided_fits(3, 1 << 62, 5, 4));
    }
}
