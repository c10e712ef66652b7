//! How long a channel's waits may last: the bound as its kernels count it, and how long a drop
//! waits for the channel's own kernels. Plain arithmetic, tested without a GPU.

use std::time::Duration;

/// Nanoseconds in a unit of the kernels' clock (`wait_units` in channel.h): 2^20, about a
/// millisecond, so that a 32-bit count covers 52 days.
const UNIT_NS: u128 = 1 << 20;

/// The bound `limit` as the kernels count it (the handle's `wait_units`): whole units,
/// rounded up, at least one; 0 (no bound) for `None` and for a bound longer than 2^32 units
/// (about 52 days, so `Duration::MAX` is no bound).
pub(crate) fn wait_units(limit: Option<Duration>) -> u32 {
    limit.map_or(0, |l| {
        u32::try_from(l.as_nanos().div_ceil(UNIT_NS).max(1)).unwrap_or(0)
    })
}

/// The bound the kernels keep for `limit`: `None` where they keep none.
pub(crate) fn in_effect(limit: Option<Duration>) -> Option<Duration> {
    limit.filter(|_| wait_units(limit) != 0)
}

/// How long a drop waits for the channel's own kernels before it gives up on them: a kernel
/// waiting when the channel is dropped gives up within the bound (and those queued behind it
/// at their first look at the clock, after a millisecond), so twice the bound and a second
/// leave room for work queued before them. `None` without a bound.
pub(crate) fn drain_limit(limit: Option<Duration>) -> Option<Duration> {
    in_effect(limit).map(|l| l.saturating_mul(2).saturating_add(Duration::from_secs(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_round_up_to_whole_units() {
        assert_eq!(wait_units(None), 0);
        // Shorter than a unit is still a bound, of one unit.
        assert_eq!(wait_units(Some(Duration::ZERO)), 1);
        assert_eq!(wait_units(Some(Duration::from_nanos(1))), 1);
        assert_eq!(wait_units(Some(Duration::from_nanos(1 << 20))), 1);
        assert_eq!(wait_units(Some(Duration::from_nanos((1 << 20) + 1))), 2);
        // 2 s is 1907.3 units.
        assert_eq!(wait_units(Some(Duration::from_secs(2))), 1908);
        assert_eq!(wait_units(Some(Duration::from_secs(600))), 572_205);
    }

    #[test]
    fn bounds_past_the_count_are_none() {
        let most = Duration::from_nanos(u32::MAX as u64 * (1 << 20));
        assert_eq!(wait_units(Some(most)), u32::MAX);
        assert_eq!(wait_units(Some(most + Duration::from_nanos(1))), 0);
        assert_eq!(wait_units(Some(Duration::MAX)), 0);
        assert_eq!(in_effect(Some(Duration::MAX)), None);
        assert_eq!(in_effect(Some(most)), Some(most));
        assert_eq!(in_effect(None), None);
    }

    #[test]
    fn a_drop_waits_twice_the_bound_and_a_second() {
        assert_eq!(
            drain_limit(Some(Duration::from_secs(2))),
            Some(Duration::from_secs(5))
        );
        assert_eq!(drain_limit(None), None);
        assert_eq!(drain_limit(Some(Duration::MAX)), None);
        let most = Duration::from_nanos(u32::MAX as u64 * (1 << 20));
        assert!(drain_limit(Some(most)).unwrap() > most);
    }
}
