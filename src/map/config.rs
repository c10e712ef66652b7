//! What a map's sizes and arguments must satisfy, without a GPU, and the results of its
//! operations.

use crate::abi;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::memory::DeviceMemory;

/// Keys from this word up are reserved (empty, removed and being-written slots): inserting,
/// looking up or removing one is an error from the host and [`MapStatus::Reserved`] in a
/// batch or a kernel.
// bindgen reads the all-ones literals as small negative numbers: widened with their sign,
// they are the words again.
pub const FIRST_RESERVED_KEY: u64 = abi::MAP_FIRST_RESERVED_KEY as u64;
/// The key word of a slot never used.
pub(crate) const EMPTY_KEY: u64 = abi::MAP_EMPTY_KEY as u64;
/// Bytes of a value at most.
pub const MAX_VALUE_BYTES: usize = abi::MAP_MAX_VALUE_BYTES as usize;
const VALUE_ALIGN: usize = abi::MAP_VALUE_ALIGN as usize;
const MAX_SLOTS: usize = abi::MAP_MAX_SLOTS as usize;

const _: () = {
    assert!(EMPTY_KEY == u64::MAX);
    assert!(abi::MAP_REMOVED_KEY as u64 == u64::MAX - 1);
    assert!(abi::MAP_BUSY_KEY as u64 == FIRST_RESERVED_KEY);
    assert!(FIRST_RESERVED_KEY == u64::MAX - 2);
};

/// The sizes of a [`SymmetricMap`](super::SymmetricMap).
///
/// ```
/// let config = nvshmem::map::MapConfig::new(1 << 16, 1024);
/// assert_eq!((config.slots_per_pe, config.value_bytes), (65536, 1024));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MapConfig {
    /// Slots on every PE: the keys a PE can own.
    pub slots_per_pe: usize,
    /// Bytes of every value: a positive multiple of 16, at most [`MAX_VALUE_BYTES`].
    pub value_bytes: usize,
}

impl MapConfig {
    /// `slots_per_pe` slots of `value_bytes`-byte values on every PE.
    pub fn new(slots_per_pe: usize, value_bytes: usize) -> Self {
        MapConfig {
            slots_per_pe,
            value_bytes,
        }
    }
}

/// What an operation did: the codes batches write (`status[i]`) and `nvshmem_rs/map.cuh`
/// returns.
///
/// ```
/// use nvshmem::map::MapStatus;
/// assert_eq!(MapStatus::from_code(1), Some(MapStatus::Absent));
/// assert_eq!(MapStatus::Full.code(), 3);
/// assert_eq!(MapStatus::from_code(99), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapStatus {
    /// The insert stored the value, the lookup copied it, the remove removed the key
    /// (`MAP_DONE`).
    Done,
    /// The key is not in the map (lookup, remove; `MAP_ABSENT`).
    Absent,
    /// The key is in the map already; the insert changed nothing (`MAP_EXISTS`).
    Exists,
    /// Every slot of the key's owner is taken; the insert changed nothing (`MAP_FULL`).
    Full,
    /// The key is a reserved word ([`FIRST_RESERVED_KEY`] and up); nothing was done
    /// (`MAP_RESERVED`).
    Reserved,
    /// A kernel's value was larger than the map's values; nothing was done
    /// (`MAP_TOO_LARGE`).
    TooLarge,
}

impl MapStatus {
    const ALL: [MapStatus; 6] = [
        MapStatus::Done,
        MapStatus::Absent,
        MapStatus::Exists,
        MapStatus::Full,
        MapStatus::Reserved,
        MapStatus::TooLarge,
    ];

    /// The code kernels use (`MAP_DONE` ... `MAP_TOO_LARGE` of `nvshmem_rs/map.h`).
    pub const fn code(self) -> u32 {
        match self {
            MapStatus::Done => abi::MAP_DONE,
            MapStatus::Absent => abi::MAP_ABSENT,
            MapStatus::Exists => abi::MAP_EXISTS,
            MapStatus::Full => abi::MAP_FULL,
            MapStatus::Reserved => abi::MAP_RESERVED,
            MapStatus::TooLarge => abi::MAP_TOO_LARGE,
        }
    }

    /// The status of a code, or `None` for a code no operation writes.
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.code() == code)
    }

    /// The status in the low half of a word a kernel wrote (the host's single-key calls).
    pub(crate) fn from_word(word: u64) -> Result<Self> {
        let code = word as u32;
        Self::from_code(code).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a map kernel wrote status {code}, which no operation writes (a kernel of \
                 another build of nvshmem_rs/map.cuh?)"
            ))
        })
    }
}

/// How one PE's slots are used ([`SymmetricMap::occupancy`](super::SymmetricMap::occupancy)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MapOccupancy {
    /// Slots holding a key.
    pub keys: usize,
    /// Slots of removed keys (taken again by later inserts).
    pub removed: usize,
    /// Slots an insert is writing now.
    pub busy: usize,
    /// Slots never used since the map was built or cleared.
    pub empty: usize,
}

/// The PE of `n_pes` that owns `key`: the high half of the hash `nvshmem_rs/map.cuh` places
/// keys by (SplitMix64's finaliser), modulo the PEs.
pub(crate) fn owner(key: u64, n_pes: usize) -> usize {
    let mut h = key;
    h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^= h >> 31;
    ((h >> 32) % n_pes as u64) as usize
}

/// The bytes of one PE's values, after checking the sizes.
pub(crate) fn check_sizes(slots_per_pe: usize, value_bytes: usize) -> Result<usize> {
    if slots_per_pe == 0 || slots_per_pe > MAX_SLOTS {
        return Err(Error::InvalidArgument(format!(
            "a map of {slots_per_pe} slots per PE: MapConfig::slots_per_pe must be 1 to {MAX_SLOTS}"
        )));
    }
    if value_bytes == 0 || !value_bytes.is_multiple_of(VALUE_ALIGN) || value_bytes > MAX_VALUE_BYTES
    {
        return Err(Error::InvalidArgument(format!(
            "a map of {value_bytes}-byte values: MapConfig::value_bytes must be a positive \
             multiple of {VALUE_ALIGN}, at most {MAX_VALUE_BYTES} (round it up and pad the values)"
        )));
    }
    slots_per_pe.checked_mul(value_bytes).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "a map of {slots_per_pe} slots of {value_bytes} bytes overflows usize"
        ))
    })
}

/// An error for a reserved key.
pub(crate) fn check_key(key: u64) -> Result<()> {
    if key >= FIRST_RESERVED_KEY {
        return Err(Error::InvalidArgument(format!(
            "key {key:#x} is reserved (keys from {FIRST_RESERVED_KEY:#x} up mark empty, removed \
             and busy slots); map it to another key"
        )));
    }
    Ok(())
}

/// The keys of a batch, after checking that `status` holds one code per key and `values`
/// (named `what`, when the operation has values) one value per key.
pub(crate) fn check_batch<T: Element>(
    keys: &impl DeviceMemory<u64>,
    status: &impl DeviceMemory<u32>,
    values: Option<(&str, &dyn DeviceMemory<T>)>,
    value_bytes: usize,
) -> Result<usize> {
    let n = keys.device_len();
    if n > u32::MAX as usize {
        return Err(Error::InvalidArgument(format!(
            "a batch of {n} keys: at most {} at once",
            u32::MAX
        )));
    }
    if status.device_len() != n {
        return Err(Error::InvalidArgument(format!(
            "a batch of {n} keys with {} status codes: pass one u32 per key",
            status.device_len()
        )));
    }
    if let Some((what, values)) = values {
        let bytes = values.device_len() * std::mem::size_of::<T>();
        if bytes != n * value_bytes {
            return Err(Error::InvalidArgument(format!(
                "a batch of {n} keys with a {what} of {bytes} bytes: it must hold {n} values of \
                 {value_bytes} bytes ({} bytes)",
                n * value_bytes
            )));
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        assert_eq!(check_sizes(10, 64).unwrap(), 640);
        for (slots, bytes) in [(0, 64), (10, 0), (10, 24), (10, MAX_VALUE_BYTES + 16)] {
            let err = check_sizes(slots, bytes).unwrap_err().to_string();
            assert!(err.contains("MapConfig::"), "{err}");
        }
        assert!(check_sizes(MAX_SLOTS + 1, 16).is_err());
        assert_eq!(check_sizes(1, MAX_VALUE_BYTES).unwrap(), MAX_VALUE_BYTES);
    }

    #[test]
    fn the_three_largest_keys_are_reserved() {
        assert!(check_key(0).is_ok());
        assert!(check_key(u64::MAX - 3).is_ok());
        for key in [u64::MAX - 2, u64::MAX - 1, u64::MAX] {
            let err = check_key(key).unwrap_err().to_string();
            assert!(err.contains("reserved"), "{err}");
        }
    }

    #[test]
    fn statuses_round_trip_through_their_codes() {
        for (code, status) in MapStatus::ALL.into_iter().enumerate() {
            assert_eq!(status.code(), code as u32);
            assert_eq!(MapStatus::from_code(code as u32), Some(status));
            // The host reads the low half of a word whose high half is not written.
            assert_eq!(
                MapStatus::from_word(0xDEAD_BEEF << 32 | code as u64).unwrap(),
                status
            );
        }
        assert!(MapStatus::from_word(6).is_err());
    }

    #[test]
    fn owners_spread_keys_evenly() {
        // Consecutive keys (ids handed out in order) over 4 PEs: within 2% of a quarter each.
        let mut counts = [0usize; 4];
        for key in 0..100_000u64 {
            counts[owner(key, 4)] += 1;
        }
        for c in counts {
            assert!((24_500..=25_500).contains(&c), "{counts:?}");
        }
        assert!((0..1000).all(|k| owner(k, 1) == 0));
        // Key 0 hashes to 0, so PE 0 owns it whatever the number of PEs.
        assert_eq!(owner(0, 7), 0);
    }

    #[test]
    fn the_handle_matches_the_header() {
        // Two pointers, the value size, then the slots and the PEs.
        assert_eq!(std::mem::size_of::<abi::nvshmem_rs_map>(), 40);
        assert_eq!(std::mem::align_of::<abi::nvshmem_rs_map>(), 8);
    }
}
