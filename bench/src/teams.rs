//! Our collectives over teams (`--team-size N`): each PE's row of N PEs (a 2-D split of the
//! world: PEs 0..N, N..2N, ...) with a `Collectives` over it, every team's calls at once.
//! A row of a team is timed and checked on the team's own data, numbered in the team.

use crate::error::{BenchError, Result};
use crate::report::Results;
use crate::Progress;
use nvshmem::{Collectives, CollectivesConfig, Nvshmem, Team};

/// This PE's place in its team: its number there, the team's size, its first world PE (which
/// the team's data keys mix in, so that data crossing between teams shows), and the teams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub me: usize,
    pub n: usize,
    pub first: usize,
    pub teams: usize,
}

impl Place {
    /// The rows' variant: `teams of N (T at once)`.
    pub fn variant(&self) -> String {
        format!("teams of {} ({} at once)", self.n, self.teams)
    }
}

/// The team and our collectives over it, for the collective tests.
pub struct TeamRun {
    collectives: Collectives,
    place: Place,
    _team: Team,
}

impl TeamRun {
    /// This PE's row of `size` PEs (collective over the world). The other implementations'
    /// rows are left out, with a note.
    pub fn new(shmem: &Nvshmem, size: usize, results: &mut Results, p: &Progress) -> Result<Self> {
        let n = shmem.n_pes();
        if size == 0 || !n.is_multiple_of(size) {
            return Err(BenchError::new(format!(
                "--team-size {size}: give a team size that divides the PE count ({n})"
            )));
        }
        let team = shmem.team_world().split_2d(size)?.0;
        let team = team.ok_or_else(|| BenchError::new("this PE is in no row of the split"))?;
        let collectives =
            Collectives::with_team(shmem, Some(&team), CollectivesConfig::for_pes(size))?;
        let place = Place {
            me: collectives.my_pe().unwrap_or(0),
            n: size,
            first: collectives.world_pe(0)?,
            teams: n / size,
        };
        let note = format!(
            "--team-size {size}: our collectives over {} teams of {size} PEs at once; NCCL and \
             NVSHMEM rows are left out",
            place.teams
        );
        p.say(&note);
        results.notes.push(note);
        Ok(TeamRun {
            collectives,
            place,
            _team: team,
        })
    }

    pub fn collectives(&self) -> &Collectives {
        &self.collectives
    }

    pub fn place(&self) -> Place {
        self.place
    }
}
