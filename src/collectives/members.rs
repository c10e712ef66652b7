//! The PEs a [`Collectives`](super::Collectives) runs over: its team's members as world PEs,
//! in team order, and this PE's number among them. Calls number PEs in the team (a root, a
//! block of an all-gather); only the mapping of a peer's memory and the messages that name a
//! PE use world numbers.

use crate::abi;
use crate::error::{Error, Result};
use crate::runtime::Nvshmem;
use crate::team::Team;

/// A team's members, seen from one PE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Members {
    /// World PE of each team PE.
    world: Vec<usize>,
    /// This PE's number in the team; `None` outside it.
    me: Option<usize>,
    /// This PE's world number.
    my_world: usize,
    /// Whether the team is the world, in order (messages then need no team numbers).
    whole: bool,
}

impl Members {
    /// Every PE.
    pub(crate) fn world(shmem: &Nvshmem) -> Self {
        Self::from_list((0..shmem.n_pes()).collect(), shmem.my_pe(), shmem.n_pes())
    }

    /// No PE: this PE is outside the team.
    pub(crate) fn outside(shmem: &Nvshmem) -> Self {
        Self::from_list(Vec::new(), shmem.my_pe(), shmem.n_pes())
    }

    /// `team`'s members (`None`, or a team without this PE: this PE is outside).
    pub(crate) fn of_team(shmem: &Nvshmem, team: Option<&Team>) -> Result<Self> {
        let Some(team) = team else {
            return Ok(Self::outside(shmem));
        };
        shmem.check_same_runtime(team.runtime(), "the team")?;
        let world = (0..team.n_pes())
            .map(|pe| team.world_pe(pe))
            .collect::<Result<Vec<_>>>()?;
        let members = Self::from_list(world, shmem.my_pe(), shmem.n_pes());
        members.stride()?;
        Ok(members)
    }

    fn from_list(world: Vec<usize>, my_world: usize, n_world: usize) -> Self {
        let me = world.iter().position(|&w| w == my_world);
        let whole = world.len() == n_world && world.iter().enumerate().all(|(i, &w)| i == w);
        Members {
            world,
            me,
            my_world,
            whole,
        }
    }

    /// PEs in the team (0 outside it).
    pub(crate) fn n(&self) -> usize {
        self.world.len()
    }

    /// This PE's number in the team, or the error every call outside it returns.
    pub(crate) fn me(&self) -> Result<usize> {
        self.me.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "PE {} is not a member of this Collectives' team: it took part in making it \
                 (the workspace is allocated on every PE), but only the team's PEs call it",
                self.my_world
            ))
        })
    }

    /// Whether this PE is in the team.
    pub(crate) fn is_member(&self) -> bool {
        self.me.is_some()
    }

    /// This PE's world number.
    pub(crate) fn my_world(&self) -> usize {
        self.my_world
    }

    /// The world PE of team PE `pe`.
    pub(crate) fn world_pe(&self, pe: usize) -> usize {
        self.world[pe]
    }

    /// The world PEs, in team order.
    pub(crate) fn world_pes(&self) -> &[usize] {
        &self.world
    }

    /// Team PE `pe` as messages name it: its world number, and its team number unless the
    /// team is the world.
    pub(crate) fn name(&self, pe: usize) -> String {
        match self.world.get(pe) {
            Some(&w) if !self.whole => format!("PE {w} (team PE {pe})"),
            Some(&w) => format!("PE {w}"),
            None => format!("team PE {pe}"),
        }
    }

    /// The first member and the distance between members, in world PEs: the form the
    /// kernels take (`CollTeam`). Every team NVSHMEM makes has it; another is refused.
    fn stride(&self) -> Result<(usize, usize)> {
        let (Some(&start), n) = (self.world.first(), self.world.len()) else {
            return Ok((0, 1));
        };
        let stride = match self.world.get(1) {
            Some(&next) if next > start => next - start,
            Some(_) => 0,
            None => 1,
        };
        if stride == 0 || (0..n).any(|p| self.world[p] != start + p * stride) {
            return Err(Error::InvalidArgument(format!(
                "a team of world PEs {:?}: our collectives take teams whose PEs are evenly \
                 spaced in world order (as split_strided and split_2d make them)",
                self.world
            )));
        }
        Ok((start, stride))
    }

    /// The team as the kernels read it from the control words.
    pub(crate) fn ctrl_team(&self) -> abi::CollTeam {
        let (start, stride) = self.stride().unwrap_or((self.my_world, 1));
        abi::CollTeam {
            me: self.me.unwrap_or(0) as i32,
            npes: self.n() as i32,
            start: start as i32,
            stride: stride as i32,
        }
    }

    /// A hash of the members (0 outside the team), which every member publishes at
    /// construction: members that passed different teams are told so.
    pub(crate) fn hash(&self) -> u64 {
        if !self.is_member() {
            return 0;
        }
        self.world.iter().fold(0xcbf2_9ce4_8422_2325, |h, &w| {
            (h ^ w as u64).wrapping_mul(0x0100_0000_01b3)
        }) | 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strided_team_numbers_its_members_and_names_them_both_ways() {
        let m = Members::from_list(vec![1, 3], 3, 4);
        assert_eq!((m.n(), m.me().unwrap(), m.world_pe(0)), (2, 1, 1));
        assert_eq!(m.stride().unwrap(), (1, 2));
        assert_eq!(m.name(0), "PE 1 (team PE 0)");
        let t = m.ctrl_team();
        assert_eq!((t.me, t.npes, t.start, t.stride), (1, 2, 1, 2));
    }

    #[test]
    fn the_world_names_pes_by_their_world_number() {
        let m = Members::from_list(vec![0, 1, 2], 2, 3);
        assert_eq!(m.name(1), "PE 1");
        assert_eq!(m.stride().unwrap(), (0, 1));
        // The same PEs out of order are not the world.
        let shuffled = Members::from_list(vec![1, 0, 2], 2, 3);
        assert_eq!(shuffled.name(1), "PE 0 (team PE 1)");
    }

    #[test]
    fn an_outsider_is_told_it_is_not_a_member() {
        let m = Members::from_list(vec![0, 2], 1, 4);
        let e = m.me().unwrap_err().to_string();
        assert!(e.contains("PE 1 is not a member"), "{e}");
        assert_eq!(m.hash(), Members::from_list(vec![], 1, 4).hash());
        assert_ne!(Members::from_list(vec![0, 2], 0, 4).hash(), 0);
    }

    #[test]
    fn unevenly_spaced_members_are_refused() {
        for world in [vec![0, 1, 3], vec![2, 1], vec![1, 1]] {
            let e = Members::from_list(world, 1, 4).stride().unwrap_err();
            assert!(e.to_string().contains("evenly spaced"), "{e}");
        }
        assert_eq!(Members::from_list(vec![2], 2, 4).stride().unwrap(), (2, 1));
    }

    #[test]
    fn members_of_different_teams_hash_apart() {
        let a = Members::from_list(vec![0, 1], 0, 4).hash();
        let b = Members::from_list(vec![0, 2], 0, 4).hash();
        let same = Members::from_list(vec![0, 1], 1, 4).hash();
        assert_ne!(a, b);
        assert_eq!(a, same);
    }
}
