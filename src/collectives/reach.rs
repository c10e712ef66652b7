//! Which members of a team reach each other by loads and stores (one node's NVLink or PCIe
//! peer access: a non-null `nvshmem_ptr`), classified once when a [`Collectives`] is made.
//! Our kernels need every member reachable; on any other team the calls go through NVSHMEM's
//! own team collectives, which run over any transport NVSHMEM has (across nodes too).
//!
//! [`Collectives`]: super::Collectives

use std::fmt;

/// How the members of a [`Collectives`](super::Collectives)' team reach each other
/// ([`Collectives::reach`](super::Collectives::reach)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Every member reaches every other: our kernels run the calls.
    Flat,
    /// The members fall into load/store domains of `size` consecutive team PEs each (the
    /// rows of [`Team::split_2d`](crate::Team::split_2d)`(size)`: a node each, or as many as
    /// [`CollectivesConfig::domain_size`](super::CollectivesConfig::domain_size) forces).
    /// NVSHMEM's team collectives run the calls.
    Domains {
        /// Team PEs per domain.
        size: usize,
    },
    /// The members reach each other in another pattern. NVSHMEM's team collectives run the
    /// calls.
    Scattered,
}

impl Reach {
    /// Whether our kernels run the calls (every member reaches every other).
    pub fn is_flat(self) -> bool {
        self == Reach::Flat
    }
}

impl fmt::Display for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reach::Flat => f.write_str("flat: every PE load/store reachable, our kernels"),
            Reach::Domains { size } => write!(
                f,
                "load/store domains of {size} PEs: NVSHMEM's team collectives"
            ),
            Reach::Scattered => f.write_str(
                "PEs reachable by loads and stores in no pattern of equal domains: NVSHMEM's \
                 team collectives",
            ),
        }
    }
}

/// What member `me` reports: whether the members it reaches (`reached[p]`, by team PE),
/// within its domain of `forced` consecutive team PEs (none: the team), are exactly a block
/// of consecutive team PEs that starts at a multiple of its size, a size that divides the
/// team's; above that bit, the size. The same reports from every member make a partition
/// into equal domains.
pub(crate) fn report(me: usize, reached: &[bool], forced: Option<usize>) -> u64 {
    let n = reached.len();
    let f = forced.unwrap_or(n).clamp(1, n.max(1));
    let domain: Vec<usize> = (0..n)
        .filter(|&p| (p == me || reached[p]) && p / f == me / f)
        .collect();
    let size = domain.len();
    let start = me.checked_div(size).map_or(0, |b| b * size);
    let block =
        size > 0 && n.is_multiple_of(size) && domain.iter().copied().eq(start..start + size);
    u64::from(block) | (size as u64) << 1
}

/// The team's reach from every member's [`report`] (in team order).
pub(crate) fn classify(reports: &[u64]) -> Reach {
    let n = reports.len() as u64;
    let Some(&first) = reports.first() else {
        return Reach::Flat;
    };
    let size = first >> 1;
    if first & 1 == 0 || reports.iter().any(|&r| r != first) {
        Reach::Scattered
    } else if size == n {
        Reach::Flat
    } else {
        Reach::Domains {
            size: size as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reach of `n` team PEs where PE `p` reaches `q` when `reaches(p, q)`.
    fn reach_of(n: usize, forced: Option<usize>, reaches: impl Fn(usize, usize) -> bool) -> Reach {
        let reports: Vec<u64> = (0..n)
            .map(|p| {
                let row: Vec<bool> = (0..n).map(|q| reaches(p, q)).collect();
                report(p, &row, forced)
            })
            .collect();
        classify(&reports)
    }

    #[test]
    fn one_node_is_flat_and_nodes_of_equal_size_are_domains() {
        assert_eq!(reach_of(4, None, |_, _| true), Reach::Flat);
        assert_eq!(reach_of(1, None, |_, _| false), Reach::Flat);
        // Two nodes of 4 (PEs 0-3 and 4-7).
        let nodes = |p: usize, q: usize| p / 4 == q / 4;
        assert_eq!(reach_of(8, None, nodes), Reach::Domains { size: 4 });
        // Nothing reachable but itself: domains of one.
        assert_eq!(reach_of(3, None, |p, q| p == q), Reach::Domains { size: 1 });
    }

    #[test]
    fn a_forced_domain_size_splits_a_node() {
        assert_eq!(
            reach_of(4, Some(2), |_, _| true),
            Reach::Domains { size: 2 }
        );
        assert_eq!(
            reach_of(2, Some(1), |_, _| true),
            Reach::Domains { size: 1 }
        );
        // No larger than the hardware's, and the team's size at most.
        let nodes = |p: usize, q: usize| p / 2 == q / 2;
        assert_eq!(reach_of(4, Some(4), nodes), Reach::Domains { size: 2 });
        assert_eq!(reach_of(4, Some(8), |_, _| true), Reach::Flat);
    }

    #[test]
    fn unequal_or_interleaved_domains_are_scattered() {
        // Nodes of 3 and 1.
        assert_eq!(
            reach_of(4, None, |p, q| (p < 3) == (q < 3)),
            Reach::Scattered
        );
        // Even and odd PEs on two nodes: not consecutive.
        assert_eq!(reach_of(4, None, |p, q| p % 2 == q % 2), Reach::Scattered);
        // A forced size that does not divide the team.
        assert_eq!(reach_of(5, Some(2), |_, _| true), Reach::Scattered);
        // One PE that sees less than the others.
        assert_eq!(reach_of(4, None, |p, q| p != 3 || q == 3), Reach::Scattered);
    }

    #[test]
    fn reports_say_the_size_and_whether_it_is_a_block() {
        assert_eq!(report(1, &[true, true, true, true], Some(2)), 1 | 2 << 1);
        // PE 1 reaching PEs 1 and 2: a pair that does not start at a multiple of 2.
        assert_eq!(report(1, &[false, true, true, false], None), 2 << 1);
        assert!(Reach::Flat.is_flat() && !Reach::Scattered.is_flat());
        assert!(Reach::Domains { size: 2 }
            .to_string()
            .contains("domains of 2 PEs"));
    }
}
