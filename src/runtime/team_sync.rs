//! A bounded synchronisation of the PEs of any team, from the host: what `barrier(team)`,
//! `sync(team)` and a team's drop use in place of NVSHMEM's `nvshmem_team_sync`, which waits
//! without a bound under the host library's lock.
//!
//! Symmetric words allocated with the runtime's exchange (so at init, on every PE), per
//! team handle: a staging word and a tag per world PE. A sync of a team is a round, counted
//! from 1 per handle alike on every member: a member puts the round into its tag on every
//! member, then reads its own tags until every member's has reached the round (a member's
//! puts land in order on one stream, so its tag only grows). A member that gives up cannot
//! tell a late PE from one that skipped the call (whose rounds would then run one behind for
//! ever), so it strands the runtime, as the world's bounded barrier does. The PEs of a
//! destroyed team clear their tags after its last round (every member's last put has landed
//! by then), so a new team on the same handle starts from round 1.

use super::exchange::{poll_tags, RelaxedCapture};
use super::Nvshmem;
use crate::error::{CudaResultExt, Error, Result};
use cudarc::driver::{CudaContext, CudaStream};
use nvshmem_sys as sys;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Team handles NVSHMEM hands out unless `NVSHMEM_MAX_TEAMS` says otherwise: its default from
/// 3.5 on (32 before).
const DEFAULT_MAX_TEAMS: usize = 128;

/// Set in a member's tag with the round it refused (`team_verdict`): rounds stay far below it.
const REFUSED: u64 = 1 << 63;

/// The handles a runtime syncs teams for: `NVSHMEM_MAX_TEAMS`, as NVSHMEM reads it.
pub(crate) fn max_teams() -> usize {
    max_teams_from(std::env::var("NVSHMEM_MAX_TEAMS").ok().as_deref())
}

/// [`max_teams`] for the variable's value `value`: a positive count, else the default.
fn max_teams_from(value: Option<&str>) -> usize {
    value
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(DEFAULT_MAX_TEAMS)
}

/// Symmetric words the team syncs of `n_pes` need.
pub(crate) fn words(n_pes: usize) -> usize {
    max_teams() * (1 + n_pes)
}

pub(crate) struct TeamSyncs {
    /// `words(n_pes)` zeroed symmetric words: per handle, `[staging][tag per world PE]`.
    base: u64,
    n_pes: usize,
    my_pe: usize,
    /// Per handle: the rounds this PE has begun. Held through a sync, so that one team's
    /// syncs from several threads of this process take their rounds one at a time.
    rounds: Vec<Mutex<u64>>,
    /// The puts, and the reads of this PE's tags: streams of their own, so that they wait for
    /// nothing else on the GPU.
    puts: Arc<CudaStream>,
    reads: Arc<CudaStream>,
}

impl TeamSyncs {
    /// # Safety
    /// `base` is symmetric, holds [`words`]`(n_pes)` zeroed words on every PE, and outlives
    /// this value.
    pub(crate) unsafe fn new(
        base: u64,
        ctx: &Arc<CudaContext>,
        my_pe: usize,
        n_pes: usize,
    ) -> Result<Self> {
        Ok(TeamSyncs {
            base,
            n_pes,
            my_pe,
            rounds: (0..max_teams()).map(|_| Mutex::new(0)).collect(),
            puts: ctx.new_stream().during("cuStreamCreate")?,
            reads: ctx.new_stream().during("cuStreamCreate")?,
        })
    }

    /// The staging word of `handle`, then its tags.
    fn slot(&self, handle: usize) -> (u64, u64) {
        slot_of(self.base, self.n_pes, handle)
    }

    fn rounds_of(&self, handle: i32) -> Result<&Mutex<u64>> {
        usize::try_from(handle)
            .ok()
            .and_then(|h| self.rounds.get(h))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "team handle {handle} is outside the {} teams this runtime syncs: set \
                     NVSHMEM_MAX_TEAMS alike for every PE before the start",
                    self.rounds.len()
                ))
            })
    }
}

/// Where `handle`'s staging word and tags start in the words at `base`, for `n_pes`.
fn slot_of(base: u64, n_pes: usize, handle: usize) -> (u64, u64) {
    let at = base + (handle * (1 + n_pes) * 8) as u64;
    (at, at + 8)
}

impl Nvshmem {
    /// Wait until every PE of the team `handle` (its world PEs `members`, this one among
    /// them) has called this, within the runtime's wait limit. `what` names the call in the
    /// error of a PE that does not come.
    pub(crate) fn team_sync(&self, handle: i32, members: &[usize], what: &str) -> Result<()> {
        self.team_verdict(handle, members, what, false).map(|_| ())
    }

    /// [`team_sync`](Self::team_sync), where each member also says whether it `refuses` what
    /// the sync is for: whether any member refused, the same on every member. A round with a
    /// refusal is the handle's last (the team stays as it is).
    pub(crate) fn team_verdict(
        &self,
        handle: i32,
        members: &[usize],
        what: &str,
        refuses: bool,
    ) -> Result<bool> {
        super::check_not_stranded()?;
        // Another thread's capture in the default mode would make CUDA refuse the sync's
        // copies here, and the members would wait for this PE until their bound.
        let _relaxed = RelaxedCapture::new()?;
        let syncs = &self.rt.team_syncs;
        let mut rounds = super::lock_letting_go(syncs.rounds_of(handle)?);
        let (staging, tags) = syncs.slot(handle as usize);
        *rounds += 1;
        let round = *rounds;
        // Kept until this PE's own tag has landed: the copy from it runs before that put.
        self.bind_context()?;
        let mut word = self.rt.pinned.take(1)?;
        let mut seen = self.rt.pinned.take(syncs.n_pes)?;
        {
            let _host = self.host_call()?;
            let put = syncs.puts.cu_stream();
            let mine = tags + (syncs.my_pe * 8) as u64;
            word.as_mut_slice()[0] = round | if refuses { REFUSED } else { 0 };
            // SAFETY: this PE's staging word, then puts of it into this PE's tag of the same
            // handle on every member, in stream order.
            unsafe {
                word.write_to(staging, 8, put)?;
                for &pe in members {
                    sys::nvshmemx_putmem_on_stream(
                        mine as *mut c_void,
                        staging as *const c_void,
                        8,
                        pe as i32,
                        put as sys::cudaStream_t,
                    );
                }
            }
        }
        let limit = self.wait_limit();
        // The wait reads this PE's memory only: no NVSHMEM call, so the host library goes to
        // this process's other threads meanwhile (a peer may wait for their work first).
        let missing = super::without_host_library(|| {
            poll_tags(&syncs.reads, &mut seen, tags, syncs.n_pes, limit, |seen| {
                members
                    .iter()
                    .copied()
                    .find(|&pe| seen[pe] & !REFUSED < round)
            })
        });
        let Ok(Some(pe)) = missing else {
            let refused = members
                .iter()
                .any(|&pe| seen.as_mut_slice()[pe] & REFUSED != 0);
            if missing.is_err() {
                // Copies may still be queued: neither buffer goes back to the pool.
                std::mem::forget((word, seen));
            }
            return missing.map(|_| refused);
        };
        std::mem::forget((word, seen));
        let why = format!(
            "{what} on team {handle} (PEs {members:?}): PE {pe} did not reach it within {:?} \
             (NVSHMEM_RS_TIMEOUT) on PE {}: a PE of the team skipped the call or stopped; this \
             process cannot go on with the others",
            limit.unwrap_or_default(),
            self.my_pe()
        );
        super::strand(why.clone());
        Err(Error::CollectiveMismatch(why))
    }

    /// After a team's last sync (its drop's), with no sync of it left on any member: clear
    /// this PE's tags of `handle`, so that a team made later on the same handle starts from
    /// round 1.
    pub(crate) fn team_syncs_end(&self, handle: i32) -> Result<()> {
        let syncs = &self.rt.team_syncs;
        let mut rounds = super::lock_letting_go(syncs.rounds_of(handle)?);
        let (_, tags) = syncs.slot(handle as usize);
        // SAFETY: this PE's tags of the handle; every member's last put has landed (each
        // member's last round was seen whole here).
        unsafe { self.zero_and_wait(&syncs.reads, tags, syncs.n_pes * 8) }?;
        *rounds = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_team_count_is_nvshmems_variable_or_its_default() {
        assert_eq!(max_teams_from(None), DEFAULT_MAX_TEAMS);
        assert_eq!(max_teams_from(Some(" 40 ")), 40);
        for bad in ["0", "-3", "many", ""] {
            assert_eq!(max_teams_from(Some(bad)), DEFAULT_MAX_TEAMS, "{bad}");
        }
    }

    #[test]
    fn every_handle_has_its_own_words_inside_the_allocation() {
        let (base, n) = (1 << 20, 8);
        let end = base + (max_teams() * (1 + n) * 8) as u64;
        assert_eq!(words(n), max_teams() * (1 + n));
        let mut last_tag_end = base;
        for h in 0..max_teams() {
            let (staging, tags) = slot_of(base, n, h);
            assert_eq!(
                staging, last_tag_end,
                "handle {h} starts where the last ended"
            );
            assert_eq!(tags, staging + 8);
            last_tag_end = tags + 8 * n as u64;
        }
        assert_eq!(last_tag_end, end);
    }
}
