//! A user's kernels (checks/kernels/map_device.cu) on the map through
//! `nvshmem_rs/map.cuh`: the thread, warp and block forms of insert, lookup and remove, and
//! bad input as statuses.

use nvshmem::map::{MapConfig, MapStatus, SymmetricMap};
use nvshmem::module::{grid, Function, KernelArgs, Module};
use nvshmem::{DeviceBuffer, Nvshmem};

use nvshmem_checks::kernels;
use nvshmem_checks::tally::{e, sync, Outcome};

use crate::batch::{all_are, key_of, statuses};

/// Keys each form (thread, warp, block) handles.
const PER_FORM: usize = 6;
const KEYS: usize = 3 * PER_FORM;
/// Not a multiple of a warp's 512-byte vectors: the copies end with a short round.
const BYTES: usize = 1040;

/// Byte `i` of the value a kernel stores for `key` (`device_value` in map_device.cu); the
/// warp form stores all but the last 3 bytes, which read back as zeros.
fn device_value(key: u64, i: usize, form: usize) -> u8 {
    if form == 1 && i >= BYTES - 3 {
        return 0;
    }
    key.wrapping_mul(131)
        .wrapping_add(i as u64 * 7)
        .wrapping_add(key >> 17) as u8
}

/// Launch `f(map, keys, PER_FORM, buffer, status)` (`buffer` left out for a remove) with one
/// block per form, and wait: the statuses.
fn launch(
    shmem: &Nvshmem,
    f: &Function,
    map: &SymmetricMap,
    keys: &DeviceBuffer<u64>,
    buffer: Option<&DeviceBuffer<u8>>,
    status: &DeviceBuffer<u32>,
) -> Result<Vec<MapStatus>, String> {
    let mut args = KernelArgs::new();
    args.value(map.handle())
        .device_ptr(keys.addr())
        .value(PER_FORM as u32);
    if let Some(b) = buffer {
        args.device_ptr(b.addr());
    }
    args.device_ptr(status.addr());
    // SAFETY: map_device_insert and map_device_lookup take (nvshmem_rs_map, const uint64_t *,
    // uint32_t, char *, uint32_t *), map_device_remove the same without the buffer; every
    // buffer holds KEYS entries.
    unsafe { f.launch(grid(3, 128), shmem.stream(), &mut args) }.map_err(e)?;
    sync(shmem)?;
    statuses(&status.to_vec().map_err(e)?)
}

/// Every PE's kernel inserts its keys by the three forms; every PE's kernel reads the next
/// PE's keys by the three forms and checks the bytes; the next PE's kernel removes them and
/// they are gone; bad input gives its statuses.
pub(crate) fn device_side(shmem: &Nvshmem) -> Outcome {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let map = SymmetricMap::new(shmem, MapConfig::new(256, BYTES)).map_err(e)?;
    let module = Module::load(shmem, &kernels::MAP_DEVICE).map_err(e)?;
    let function = |name| module.function(name).map_err(e);
    let (insert, lookup) = (
        function("map_device_insert")?,
        function("map_device_lookup")?,
    );
    let (remove, bad) = (function("map_device_remove")?, function("map_device_bad")?);
    let keys = shmem.alloc_device::<u64>(KEYS).map_err(e)?;
    let status = shmem.alloc_device::<u32>(KEYS).map_err(e)?;
    let buffer = shmem.alloc_device::<u8>(KEYS * BYTES).map_err(e)?;
    let mine: Vec<u64> = (0..KEYS).map(|i| key_of(9, me, i)).collect();
    keys.copy_from_host(&mine).map_err(e)?;
    let got = launch(shmem, &insert, &map, &keys, Some(&buffer), &status)?;
    all_are("kernel inserts", &got, MapStatus::Done)?;
    shmem.barrier_all().map_err(e)?;

    let next = (me + 1) % n;
    let theirs: Vec<u64> = (0..KEYS).map(|i| key_of(9, next, i)).collect();
    keys.copy_from_host(&theirs).map_err(e)?;
    buffer
        .copy_from_host(&vec![0xCC; KEYS * BYTES])
        .map_err(e)?;
    let got = launch(shmem, &lookup, &map, &keys, Some(&buffer), &status)?;
    all_are("kernel lookups", &got, MapStatus::Done)?;
    let got = buffer.to_vec().map_err(e)?;
    for (k, &key) in theirs.iter().enumerate() {
        // The value was stored by the form of its index on PE `next`.
        let form = k / PER_FORM;
        if let Some(i) = (0..BYTES).find(|&i| got[k * BYTES + i] != device_value(key, i, form)) {
            return Err(format!(
                "key {k} of PE {next}: byte {i} is {:#04x}, expected {:#04x}",
                got[k * BYTES + i],
                device_value(key, i, form)
            ));
        }
    }
    shmem.barrier_all().map_err(e)?;

    // This PE removes the next PE's keys, each form a third; then nobody finds them.
    let got = launch(shmem, &remove, &map, &keys, None, &status)?;
    all_are("kernel removes", &got, MapStatus::Done)?;
    let got = launch(shmem, &remove, &map, &keys, None, &status)?;
    all_are("kernel removes again", &got, MapStatus::Absent)?;
    shmem.barrier_all().map_err(e)?;
    if map.occupancy(me).map_err(e)?.keys != 0 {
        return Err(format!(
            "PE {me} still holds keys after every key was removed"
        ));
    }

    let mut args = KernelArgs::new();
    args.value(map.handle())
        .value(key_of(9, me, KEYS))
        .device_ptr(buffer.addr())
        .device_ptr(status.addr());
    // SAFETY: map_device_bad(nvshmem_rs_map, uint64_t, char *, uint32_t *): the buffer
    // holds a value and more, status 4 codes of KEYS.
    unsafe { bad.launch(grid(1, 64), shmem.stream(), &mut args) }.map_err(e)?;
    sync(shmem)?;
    let got = statuses(&status.to_vec().map_err(e)?)?;
    let want = [
        MapStatus::TooLarge,
        MapStatus::Reserved,
        MapStatus::Reserved,
        MapStatus::Reserved,
    ];
    if got[..4] != want {
        return Err(format!(
            "bad input in a kernel: {:?}, expected {want:?}",
            &got[..4]
        ));
    }
    if map.get(key_of(9, me, KEYS)).map_err(e)?.is_some() {
        return Err("a value too large was stored".into());
    }
    shmem.barrier_all().map_err(e)?;
    Ok(())
}
