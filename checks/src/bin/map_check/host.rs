//! The host API: single keys, batches, removes and the reuse of their slots, full owners,
//! bad input, and lookups captured in a CUDA graph.

use nvshmem::map::{MapConfig, MapStatus, SymmetricMap, FIRST_RESERVED_KEY, MAX_VALUE_BYTES};
use nvshmem::{Error, Nvshmem};

use nvshmem_checks::graph::capture;
use nvshmem_checks::tally::{e, expect_err, sync, Outcome};

use crate::batch::{self, all_are, check_values, key_of, value_of, values_of};

/// Every PE's slots hold the keys the model puts there: `owned(pe)` keys, none being
/// written, and the counts add up to the slots.
pub(crate) fn occupancy_is(map: &SymmetricMap, owned: impl Fn(usize) -> usize) -> Outcome {
    for pe in 0..map.runtime().n_pes() {
        let o = map.occupancy(pe).map_err(e)?;
        if o.keys != owned(pe) || o.busy != 0 || o.keys + o.removed + o.empty != map.slots_per_pe()
        {
            return Err(format!(
                "PE {pe}'s slots: {o:?}, expected {} keys of {} slots and none busy",
                owned(pe),
                map.slots_per_pe()
            ));
        }
    }
    Ok(())
}

/// Keys of `all` that `pe` owns.
fn owned_by(map: &SymmetricMap, all: &[u64], pe: usize) -> usize {
    all.iter().filter(|&&k| map.owner_of(k) == pe).count()
}

/// Single keys from the host: insert (values shorter than the slot read back zero-padded),
/// an insert of a present key, every PE's keys from every PE, an absent key, a remove
/// seen by every PE, and the owners the host computes.
pub(crate) fn single_keys(shmem: &Nvshmem) -> Outcome {
    const BYTES: usize = 48;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let map = SymmetricMap::new(shmem, MapConfig::new(256, BYTES)).map_err(e)?;
    let padded = |key: u64, i: usize| {
        let mut v = value_of(key, 0, BYTES - i % 3);
        v.resize(BYTES, 0);
        v
    };
    for i in 0..8 {
        let key = key_of(1, me, i);
        let status = map
            .insert(key, &value_of(key, 0, BYTES - i % 3))
            .map_err(e)?;
        let again = map.insert(key, &[1]).map_err(e)?;
        if (status, again) != (MapStatus::Done, MapStatus::Exists) {
            return Err(format!("insert of key {i}: {status:?}, then {again:?}"));
        }
    }
    shmem.barrier_all().map_err(e)?;
    for pe in 0..n {
        for i in 0..8 {
            let key = key_of(1, pe, i);
            if map.get(key).map_err(e)? != Some(padded(key, i)) {
                return Err(format!("key {i} of PE {pe} does not read back"));
            }
        }
    }
    if map.get(key_of(1, n + 5, 0)).map_err(e)?.is_some() {
        return Err("a key never inserted was found".into());
    }
    let all: Vec<u64> = (0..n)
        .flat_map(|p| (0..8).map(move |i| key_of(1, p, i)))
        .collect();
    occupancy_is(&map, |pe| owned_by(&map, &all, pe))?;
    shmem.barrier_all().map_err(e)?;
    let first = key_of(1, me, 0);
    let (removed, again) = (map.remove(first).map_err(e)?, map.remove(first).map_err(e)?);
    if (removed, again) != (true, false) {
        return Err(format!("remove, then remove again: {removed}, {again}"));
    }
    shmem.barrier_all().map_err(e)?;
    for pe in 0..n {
        if map.get(key_of(1, pe, 0)).map_err(e)?.is_some() {
            return Err(format!("PE {pe}'s removed key is still found"));
        }
    }
    shmem.barrier_all().map_err(e)?;
    Ok(())
}

/// Batches: every PE inserts its keys at once, looks up every PE's keys and absent ones,
/// removes half of its keys, and inserts them again with new values in the removed slots.
pub(crate) fn batches(shmem: &Nvshmem) -> Outcome {
    const BYTES: usize = 96;
    const MINE: usize = 300;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let map = SymmetricMap::new(shmem, MapConfig::new(1024, BYTES)).map_err(e)?;
    let mine: Vec<u64> = (0..MINE).map(|i| key_of(2, me, i)).collect();
    let all: Vec<u64> = (0..n)
        .flat_map(|p| (0..MINE).map(move |i| key_of(2, p, i)))
        .collect();
    // Every PE's keys, then keys nobody inserted, in an order that mixes the owners.
    let mut asked: Vec<u64> = all.clone();
    asked.extend((0..40).map(|i| key_of(2, n, i)));
    asked.sort_unstable_by_key(|&k| k.rotate_left(17));
    let removed = |key: u64| (0..n).any(|p| (0..MINE / 2).any(|i| key_of(2, p, i) == key));
    let inserted = |key: u64| all.contains(&key);

    all_are(
        "insert",
        &batch::insert(shmem, &map, &mine, &values_of(&mine, 0, BYTES))?,
        MapStatus::Done,
    )?;
    shmem.barrier_all().map_err(e)?;
    let (got, bytes) = batch::lookup(shmem, &map, &asked, 0xA5)?;
    check_values(
        "lookup",
        &asked,
        &got,
        &bytes,
        |k| inserted(k).then_some(0),
        0xA5,
        BYTES,
    )?;
    occupancy_is(&map, |pe| owned_by(&map, &all, pe))?;
    let again = batch::insert(shmem, &map, &mine, &values_of(&mine, 9, BYTES))?;
    all_are("insert of present keys", &again, MapStatus::Exists)?;
    shmem.barrier_all().map_err(e)?;

    all_are(
        "remove",
        &batch::remove(shmem, &map, &mine[..MINE / 2])?,
        MapStatus::Done,
    )?;
    all_are(
        "remove again",
        &batch::remove(shmem, &map, &mine[..MINE / 2])?,
        MapStatus::Absent,
    )?;
    shmem.barrier_all().map_err(e)?;
    let (got, bytes) = batch::lookup(shmem, &map, &asked, 0x5A)?;
    check_values(
        "lookup after removes",
        &asked,
        &got,
        &bytes,
        |k| (inserted(k) && !removed(k)).then_some(0),
        0x5A,
        BYTES,
    )?;
    shmem.barrier_all().map_err(e)?;

    let back = &mine[..MINE / 2];
    all_are(
        "insert of removed keys",
        &batch::insert(shmem, &map, back, &values_of(back, 1, BYTES))?,
        MapStatus::Done,
    )?;
    shmem.barrier_all().map_err(e)?;
    let (got, bytes) = batch::lookup(shmem, &map, &asked, 0)?;
    check_values(
        "lookup after inserting again",
        &asked,
        &got,
        &bytes,
        |k| inserted(k).then_some(removed(k) as u64),
        0,
        BYTES,
    )?;
    // Each insert took the first free slot of its chain: a removed slot wherever one came
    // before the first empty one, so no owner holds more marks than keys it lost.
    occupancy_is(&map, |pe| owned_by(&map, &all, pe))?;
    shmem.barrier_all().map_err(e)?;
    Ok(())
}

/// Owners of 16 slots, sent about 40 keys each from every PE at once: each holds exactly 16
/// (or all it was sent), the other inserts say `Full`, and lookups find exactly the keys
/// stored, with their values. Then `clear` empties every owner, and inserts succeed again.
pub(crate) fn full_owners(shmem: &Nvshmem) -> Outcome {
    const SLOTS: usize = 16;
    const BYTES: usize = 16;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let map = SymmetricMap::new(shmem, MapConfig::new(SLOTS, BYTES)).map_err(e)?;
    let mine: Vec<u64> = (0..40).map(|i| key_of(3, me, i)).collect();
    let all: Vec<u64> = (0..n)
        .flat_map(|p| (0..40).map(move |i| key_of(3, p, i)))
        .collect();
    let got = batch::insert(shmem, &map, &mine, &values_of(&mine, 0, BYTES))?;
    for (key, status) in mine.iter().zip(&got) {
        let crowded = owned_by(&map, &all, map.owner_of(*key)) > SLOTS;
        let fine = match status {
            MapStatus::Done => true,
            MapStatus::Full => crowded,
            _ => false,
        };
        if !fine {
            return Err(format!(
                "key {key:#x}: {status:?} (its owner was sent more than {SLOTS}: {crowded})"
            ));
        }
    }
    shmem.barrier_all().map_err(e)?;
    occupancy_is(&map, |pe| owned_by(&map, &all, pe).min(SLOTS))?;
    let (found, bytes) = batch::lookup(shmem, &map, &all, 0)?;
    for pe in 0..n {
        let stored = all
            .iter()
            .zip(&found)
            .filter(|(k, s)| map.owner_of(**k) == pe && **s == MapStatus::Done)
            .count();
        if stored != owned_by(&map, &all, pe).min(SLOTS) {
            return Err(format!("{stored} keys of PE {pe} found"));
        }
    }
    let stored: Vec<u64> = all
        .iter()
        .zip(&found)
        .filter(|(_, s)| **s == MapStatus::Done)
        .map(|(k, _)| *k)
        .collect();
    let values: Vec<u8> = all
        .iter()
        .zip(&found)
        .enumerate()
        .filter(|(_, (_, s))| **s == MapStatus::Done)
        .flat_map(|(i, _)| bytes[i * BYTES..(i + 1) * BYTES].to_vec())
        .collect();
    check_values(
        "values in full owners",
        &stored,
        &vec![MapStatus::Done; stored.len()],
        &values,
        |_| Some(0),
        0,
        BYTES,
    )?;
    // Cleared on every PE, the owners take keys again.
    map.clear().map_err(e)?;
    occupancy_is(&map, |_| 0)?;
    let again = batch::insert(shmem, &map, &mine[..4], &values_of(&mine[..4], 1, BYTES))?;
    all_are("inserts after clear", &again, MapStatus::Done)?;
    shmem.barrier_all().map_err(e)?;
    Ok(())
}

/// Bad input: sizes, reserved keys and values too large from the host are errors; reserved
/// keys in a batch get `Reserved`; batches whose buffers do not match are errors; PEs that
/// disagree on the sizes all get `CollectiveMismatch`.
pub(crate) fn bad_input(shmem: &Nvshmem) -> Outcome {
    let me = shmem.my_pe();
    let invalid = |err: &Error| matches!(err, Error::InvalidArgument(_));
    for (slots, bytes) in [(0, 64), (16, 24), (16, 0), (16, MAX_VALUE_BYTES + 16)] {
        let what = format!("a map of {slots} slots of {bytes} bytes");
        expect_err(
            &what,
            SymmetricMap::new(shmem, MapConfig::new(slots, bytes)),
            invalid,
        )?;
    }
    let map = SymmetricMap::new(shmem, MapConfig::new(64, 32)).map_err(e)?;
    for key in [FIRST_RESERVED_KEY, u64::MAX - 1, u64::MAX] {
        expect_err(
            "a reserved key's insert",
            map.insert(key, &[0; 32]),
            invalid,
        )?;
        expect_err("a reserved key's get", map.get(key), invalid)?;
        expect_err("a reserved key's remove", map.remove(key), invalid)?;
    }
    expect_err("a value of 33 bytes", map.insert(1, &[0; 33]), invalid)?;
    let keys = [
        key_of(5, me, 0),
        u64::MAX,
        key_of(5, me, 1),
        FIRST_RESERVED_KEY,
    ];
    let got = batch::insert(shmem, &map, &keys, &[7; 4 * 32])?;
    let want = [
        MapStatus::Done,
        MapStatus::Reserved,
        MapStatus::Done,
        MapStatus::Reserved,
    ];
    let (found, _) = batch::lookup(shmem, &map, &keys, 0)?;
    let removed = batch::remove(shmem, &map, &keys)?;
    if got != want || found != want || removed != want {
        return Err(format!(
            "a batch with reserved keys: {got:?}, {found:?}, {removed:?}"
        ));
    }
    let k = shmem.alloc_device::<u64>(4).map_err(e)?;
    let s3 = shmem.alloc_device::<u32>(3).map_err(e)?;
    let s4 = shmem.alloc_device::<u32>(4).map_err(e)?;
    let v = shmem.alloc_device::<u8>(4 * 32 - 16).map_err(e)?;
    let v4 = shmem.alloc_device::<f32>(32).map_err(e)?;
    let stream = shmem.stream();
    expect_err(
        "3 status codes for 4 keys",
        map.remove_batch(&k, &s3, stream),
        invalid,
    )?;
    expect_err(
        "values 16 bytes short",
        map.insert_batch(&k, &v, &s4, stream),
        invalid,
    )?;
    expect_err(
        "a lookup buffer 16 bytes short",
        map.lookup_batch(&v, &k, &s4, stream),
        invalid,
    )?;
    // 32 f32 are 128 bytes: 4 values of 32 bytes, in elements of another type.
    k.copy_from_host(&[11, 12, 13, 14]).map_err(e)?;
    map.lookup_batch(&v4, &k, &s4, stream).map_err(e)?;
    sync(shmem)?;
    shmem.barrier_all().map_err(e)?;
    if shmem.n_pes() > 1 {
        let mismatched = SymmetricMap::new(shmem, MapConfig::new(32 + me, 16));
        expect_err("sizes that differ between PEs", mismatched, |err| {
            matches!(err, Error::CollectiveMismatch(_))
        })?;
    }
    Ok(())
}

/// Lookups captured in a CUDA graph and replayed: the second replay sees the values
/// inserted after the first.
pub(crate) fn graph(shmem: &Nvshmem) -> Outcome {
    const BYTES: usize = 64;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let map = SymmetricMap::new(shmem, MapConfig::new(128, BYTES)).map_err(e)?;
    let asked: Vec<u64> = (0..n)
        .flat_map(|p| (0..8).map(move |i| key_of(4, p, i)))
        .collect();
    let k = shmem.alloc_device::<u64>(asked.len()).map_err(e)?;
    let d = shmem.alloc_device::<u8>(asked.len() * BYTES).map_err(e)?;
    let s = shmem.alloc_device::<u32>(asked.len()).map_err(e)?;
    k.copy_from_host(&asked).map_err(e)?;
    let stream = shmem.stream();
    let g = capture(stream, || map.lookup_batch(&d, &k, &s, stream)).map_err(e)?;
    let replay = |round: Option<u64>| -> Outcome {
        d.copy_from_host(&vec![0xEE; d.len()]).map_err(e)?;
        g.launch()
            .map_err(|err| format!("cuGraphLaunch: {err:?}"))?;
        sync(shmem)?;
        let got = batch::statuses(&s.to_vec().map_err(e)?)?;
        check_values(
            "graph replay",
            &asked,
            &got,
            &d.to_vec().map_err(e)?,
            |_| round,
            0xEE,
            BYTES,
        )
    };
    replay(None)?;
    shmem.barrier_all().map_err(e)?;
    let mine: Vec<u64> = (0..8).map(|i| key_of(4, me, i)).collect();
    all_are(
        "insert",
        &batch::insert(shmem, &map, &mine, &values_of(&mine, 3, BYTES))?,
        MapStatus::Done,
    )?;
    shmem.barrier_all().map_err(e)?;
    replay(Some(3))?;
    shmem.barrier_all().map_err(e)?;
    Ok(())
}
