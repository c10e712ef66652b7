//! Many inserts at once: every PE's batch into every owner, with heavy probing, then inserts
//! of new keys while lookups of the first keys run on another stream.

use nvshmem::map::{MapConfig, MapStatus, SymmetricMap};
use nvshmem::Nvshmem;

use nvshmem_checks::tally::{e, Outcome};

use crate::batch::{self, all_are, check_values, key_of, statuses, values_of};
use crate::host::occupancy_is;

const SLOTS: usize = 2048;
/// Keys each PE inserts: about this many land on each owner, 83% of its slots.
const MINE: usize = 1700;
const BYTES: usize = 32;

/// Every PE inserts MINE keys at once into owners 83% full: every insert is `Done`, every
/// owner holds the keys the hash gives it, and every PE reads every key's value.
pub(crate) fn crowded_inserts(shmem: &Nvshmem) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let map = SymmetricMap::new(shmem, MapConfig::new(SLOTS, BYTES)).map_err(e)?;
    let mine: Vec<u64> = (0..MINE).map(|i| key_of(6, me, i)).collect();
    let all: Vec<u64> = (0..n)
        .flat_map(|p| (0..MINE).map(move |i| key_of(6, p, i)))
        .collect();
    let got = batch::insert(shmem, &map, &mine, &values_of(&mine, 0, BYTES))?;
    all_are("crowded insert", &got, MapStatus::Done)?;
    shmem.barrier_all().map_err(e)?;
    occupancy_is(&map, |pe| {
        all.iter().filter(|&&k| map.owner_of(k) == pe).count()
    })?;
    let (found, bytes) = batch::lookup(shmem, &map, &all, 0)?;
    check_values(
        "lookup of every PE's keys",
        &all,
        &found,
        &bytes,
        |_| Some(0),
        0,
        BYTES,
    )?;
    shmem.barrier_all().map_err(e)?;
    Ok(())
}

/// Lookups of keys present while other keys are inserted (different keys at once, as the
/// ordering rules allow): the lookups see the first keys' values, the inserts all succeed.
pub(crate) fn lookups_during_inserts(shmem: &Nvshmem) -> Outcome {
    const FIRST: usize = 600;
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let map = SymmetricMap::new(shmem, MapConfig::new(SLOTS, BYTES)).map_err(e)?;
    let first: Vec<u64> = (0..FIRST).map(|i| key_of(7, me, i)).collect();
    all_are(
        "first insert",
        &batch::insert(shmem, &map, &first, &values_of(&first, 0, BYTES))?,
        MapStatus::Done,
    )?;
    shmem.barrier_all().map_err(e)?;

    let every_first: Vec<u64> = (0..n)
        .flat_map(|p| (0..FIRST).map(move |i| key_of(7, p, i)))
        .collect();
    let second: Vec<u64> = (0..FIRST).map(|i| key_of(8, me, i)).collect();
    let side = shmem.new_stream().map_err(e)?;
    let ins_keys = shmem.alloc_device::<u64>(FIRST).map_err(e)?;
    let ins_values = shmem.alloc_device::<u8>(FIRST * BYTES).map_err(e)?;
    let ins_status = shmem.alloc_device::<u32>(FIRST).map_err(e)?;
    ins_keys.copy_from_host(&second).map_err(e)?;
    ins_values
        .copy_from_host(&values_of(&second, 1, BYTES))
        .map_err(e)?;
    let look_keys = shmem.alloc_device::<u64>(every_first.len()).map_err(e)?;
    let look_dst = shmem
        .alloc_device::<u8>(every_first.len() * BYTES)
        .map_err(e)?;
    let look_status = shmem.alloc_device::<u32>(every_first.len()).map_err(e)?;
    look_keys.copy_from_host(&every_first).map_err(e)?;
    // Both batches in flight at once, on two streams, on every PE.
    map.insert_batch(&ins_keys, &ins_values, &ins_status, &side)
        .map_err(e)?;
    map.lookup_batch(&look_dst, &look_keys, &look_status, shmem.stream())
        .map_err(e)?;
    side.synchronize().map_err(|err| format!("{err:?}"))?;
    shmem
        .stream()
        .synchronize()
        .map_err(|err| format!("{err:?}"))?;
    all_are(
        "inserts beside lookups",
        &statuses(&ins_status.to_vec().map_err(e)?)?,
        MapStatus::Done,
    )?;
    let found = statuses(&look_status.to_vec().map_err(e)?)?;
    check_values(
        "lookups beside inserts",
        &every_first,
        &found,
        &look_dst.to_vec().map_err(e)?,
        |_| Some(0),
        0,
        BYTES,
    )?;
    shmem.barrier_all().map_err(e)?;
    let every_second: Vec<u64> = (0..n)
        .flat_map(|p| (0..FIRST).map(move |i| key_of(8, p, i)))
        .collect();
    let (found, bytes) = batch::lookup(shmem, &map, &every_second, 0)?;
    check_values(
        "the keys inserted beside lookups",
        &every_second,
        &found,
        &bytes,
        |_| Some(1),
        0,
        BYTES,
    )?;
    shmem.barrier_all().map_err(e)?;
    Ok(())
}
