//! What the checks share: keys and values every PE can rebuild, and the batched calls with
//! their buffers, run and waited for on the runtime's stream.

use nvshmem::map::{MapStatus, SymmetricMap, FIRST_RESERVED_KEY};
use nvshmem::Nvshmem;

use nvshmem_checks::splitmix::{mix, SplitMix64};
use nvshmem_checks::tally::{e, sync, Outcome};

/// Key `i` of PE `pe` in the set named `tag`: distinct for distinct (tag, pe, i), never
/// reserved.
pub(crate) fn key_of(tag: u64, pe: usize, i: usize) -> u64 {
    let k = mix(tag ^ mix(((pe as u64) << 32) | i as u64));
    if k >= FIRST_RESERVED_KEY {
        k - 3
    } else {
        k
    }
}

/// The value `key` holds in round `round`: `bytes` random bytes.
pub(crate) fn value_of(key: u64, round: u64, bytes: usize) -> Vec<u8> {
    let mut rng = SplitMix64(mix(key ^ mix(round)));
    let mut out = Vec::with_capacity(bytes + 8);
    while out.len() < bytes {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(bytes);
    out
}

/// Every key's value in round `round`, end to end.
pub(crate) fn values_of(keys: &[u64], round: u64, bytes: usize) -> Vec<u8> {
    keys.iter()
        .flat_map(|&k| value_of(k, round, bytes))
        .collect()
}

/// The statuses of the codes a batch or a kernel wrote.
pub(crate) fn statuses(codes: &[u32]) -> Result<Vec<MapStatus>, String> {
    codes
        .iter()
        .map(|&c| MapStatus::from_code(c).ok_or_else(|| format!("status code {c}")))
        .collect()
}

/// `keys` inserted with `values` by `insert_batch`: each key's status.
pub(crate) fn insert(
    shmem: &Nvshmem,
    map: &SymmetricMap,
    keys: &[u64],
    values: &[u8],
) -> Result<Vec<MapStatus>, String> {
    let k = shmem.alloc_device::<u64>(keys.len()).map_err(e)?;
    let v = shmem.alloc_device::<u8>(values.len()).map_err(e)?;
    let s = shmem.alloc_device::<u32>(keys.len()).map_err(e)?;
    k.copy_from_host(keys).map_err(e)?;
    v.copy_from_host(values).map_err(e)?;
    map.insert_batch(&k, &v, &s, shmem.stream()).map_err(e)?;
    sync(shmem)?;
    statuses(&s.to_vec().map_err(e)?)
}

/// `keys` looked up by `lookup_batch` into a buffer filled with `fill` first: each key's
/// status and the buffer.
pub(crate) fn lookup(
    shmem: &Nvshmem,
    map: &SymmetricMap,
    keys: &[u64],
    fill: u8,
) -> Result<(Vec<MapStatus>, Vec<u8>), String> {
    let k = shmem.alloc_device::<u64>(keys.len()).map_err(e)?;
    let d = shmem
        .alloc_device::<u8>(keys.len() * map.value_bytes())
        .map_err(e)?;
    let s = shmem.alloc_device::<u32>(keys.len()).map_err(e)?;
    k.copy_from_host(keys).map_err(e)?;
    d.copy_from_host(&vec![fill; d.len()]).map_err(e)?;
    map.lookup_batch(&d, &k, &s, shmem.stream()).map_err(e)?;
    sync(shmem)?;
    Ok((statuses(&s.to_vec().map_err(e)?)?, d.to_vec().map_err(e)?))
}

/// `keys` removed by `remove_batch`: each key's status.
pub(crate) fn remove(
    shmem: &Nvshmem,
    map: &SymmetricMap,
    keys: &[u64],
) -> Result<Vec<MapStatus>, String> {
    let k = shmem.alloc_device::<u64>(keys.len()).map_err(e)?;
    let s = shmem.alloc_device::<u32>(keys.len()).map_err(e)?;
    k.copy_from_host(keys).map_err(e)?;
    map.remove_batch(&k, &s, shmem.stream()).map_err(e)?;
    sync(shmem)?;
    statuses(&s.to_vec().map_err(e)?)
}

/// Every status is `want`, or the first that is not.
pub(crate) fn all_are(what: &str, got: &[MapStatus], want: MapStatus) -> Outcome {
    match got.iter().position(|&s| s != want) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: {} of {} statuses are not {want:?}; the first, #{i}, is {:?}",
            got.iter().filter(|&&s| s != want).count(),
            got.len(),
            got[i]
        )),
    }
}

/// The values looked up for `keys` (status `Done`) are their round-`round` values, and the
/// others (status `Absent`) were left as `fill`.
pub(crate) fn check_values(
    what: &str,
    keys: &[u64],
    got: &[MapStatus],
    bytes: &[u8],
    round: impl Fn(u64) -> Option<u64>,
    fill: u8,
    value_bytes: usize,
) -> Outcome {
    for (i, &key) in keys.iter().enumerate() {
        let at = &bytes[i * value_bytes..(i + 1) * value_bytes];
        let (want_status, want) = match round(key) {
            Some(r) => (MapStatus::Done, value_of(key, r, value_bytes)),
            None => (MapStatus::Absent, vec![fill; value_bytes]),
        };
        if got[i] != want_status {
            return Err(format!(
                "{what}: key #{i} ({key:#x}): {:?}, expected {want_status:?}",
                got[i]
            ));
        }
        if let Some(b) = at.iter().zip(&want).position(|(g, w)| g != w) {
            return Err(format!(
                "{what}: key #{i} ({key:#x}): byte {b} of its value is {:#04x}, expected {:#04x}",
                at[b], want[b]
            ));
        }
    }
    Ok(())
}
