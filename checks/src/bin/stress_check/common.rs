//! The run's sizes, limits, fills and hash tags, the seeded hash every PE rebuilds data
//! from, and small helpers every role uses.

use nvshmem_checks::splitmix::{mix, SplitMix64};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// An operation that lasts longer than this is taken for a hang.
pub(crate) const OP_LIMIT: Duration = Duration::from_secs(60);
/// How long our collectives wait for a peer before the call fails: shorter than `OP_LIMIT`,
/// so that a collective that cannot finish is the library's error, not the watchdog's.
pub(crate) const COLL_TIMEOUT: Duration = Duration::from_secs(30);
/// Elements of a PE's block in a collective call, at most (16 KiB of i32).
pub(crate) const COLL_MAX: usize = 4096;
/// Every this many calls, the collective threads vote on stopping.
pub(crate) const VOTE_EVERY: u64 = 8;
/// Words of a mixer's slot on every PE.
pub(crate) const SLOT: usize = 512;
/// Pages a pool user holds at once, at most.
pub(crate) const MAX_BATCH: usize = 8;
/// Bytes of a page: not a multiple of the gather's 4 KiB pieces, so every page ends short.
pub(crate) const PAGE_BYTES: usize = 4096 + 48;
/// Bytes of a page of the allocator's short-lived pools.
pub(crate) const CHURN_PAGE: usize = 256;
/// Words of the allocator's short-lived channels' messages, at most.
pub(crate) const CHURN_MAX: usize = 1024;
/// Words of the largest message of the ring, and its slots per channel.
pub(crate) const CHAN_MAX: usize = 3000;
pub(crate) const CHAN_DEPTH: usize = 3;
/// Symmetric buffers the allocator keeps at once, at most.
pub(crate) const MAX_LIVE: usize = 8;
/// The top bit of a flag's value: its sender's last round.
pub(crate) const STOP: u64 = 1 << 63;

/// What a buffer holds before a call that must not touch it (or a message that is shorter).
pub(crate) const FILL_I32: i32 = 0x5EED_F00D;
pub(crate) const FILL_F32: f32 = -1.5e30;
pub(crate) const FILL_U32: u32 = 0xDEAD_BEEF;

/// What a hash is of, so that no two kinds of data look alike.
pub(crate) const TAG_ALLOC: u64 = 1;
pub(crate) const TAG_CHURN: u64 = 2;
pub(crate) const TAG_PAGE: u64 = 3;
pub(crate) const TAG_RMA: u64 = 4;
pub(crate) const TAG_FLAG: u64 = 5;
pub(crate) const TAG_CALL: u64 = 6;
pub(crate) const TAG_COUNTS: u64 = 7;
pub(crate) const TAG_CHAN: u64 = 8;
pub(crate) const TAG_MIX: u64 = 9;
pub(crate) const TAG_TP: u64 = 10;

/// A hash of `parts` under `seed`: any PE can rebuild what any other wrote.
pub(crate) fn hash(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(seed, |h, &p| mix(h ^ p))
}

/// A number below `n` from `rng`.
pub(crate) fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
