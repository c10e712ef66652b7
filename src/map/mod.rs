//! A hash map in symmetric memory: 8-byte keys and values of a fixed size, spread over the
//! PEs (a key's owner by its hash), with inserts, lookups and removes from the host (single
//! keys, or batches on a stream) and from kernels (`nvshmem_rs/map.cuh`, by a thread, a warp
//! or a block). For parameter and embedding caches: a kernel on any PE reads a value of any
//! PE in a few NVLink round trips.
//!
//! Every PE holds `slots_per_pe` slots, each a key word and a value of `value_bytes`. A key
//! lives on the PE its hash names, in the first free slot from a home slot its hash names
//! (open addressing with linear probing). Three key words are reserved (from
//! [`FIRST_RESERVED_KEY`] up): empty, removed, and being written.
//!
//! # Memory ordering
//! - **Values before keys**: an insert claims a free slot with an NVSHMEM compare-and-swap,
//!   writes the value, completes it at the owner, and only then stores the key. A lookup
//!   reads the key (with acquire semantics) before the value. So a lookup that finds a key
//!   copies its whole value.
//! - **Different keys at once**: inserts, lookups and removes of different keys may run at
//!   the same time from any PEs, threads and kernels.
//! - **One key, one at a time**: operations on one key are the program's to order. Two
//!   inserts of one key at once may store it twice; a lookup while its key is removed (and
//!   the slot taken by another insert) may copy a value being overwritten. Calls on one
//!   stream, kernels one after another, a barrier or a signal order them.
//! - A remove leaves a mark that later inserts reuse; a slot never becomes empty again. A
//!   map whose owners saw many distinct keys fills up: [`clear`](SymmetricMap::clear) it.
//!
//! Full owners, absent keys and keys already present are results ([`MapStatus`]), not
//! errors. Bad input from the host (a reserved key, a value larger than `value_bytes`, a
//! batch whose buffers do not match) is an [`Error`].
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use nvshmem::map::{MapConfig, MapStatus, SymmetricMap};
//! let shmem = nvshmem::Nvshmem::init()?;
//! // 4096 slots of 64-byte values on every PE (collective).
//! let map = SymmetricMap::new(&shmem, MapConfig::new(4096, 64))?;
//! let me = shmem.my_pe() as u64;
//! assert_eq!(map.insert(me, &[me as u8; 64])?, MapStatus::Done);
//! shmem.barrier_all()?;
//! // Every PE's key, wherever it lives.
//! for pe in 0..shmem.n_pes() as u64 {
//!     assert_eq!(map.get(pe)?, Some(vec![pe as u8; 64]));
//! }
//! # Ok(()) }
//! ```

mod config;

pub use crate::abi::nvshmem_rs_map as MapHandle;
pub use config::{MapConfig, MapOccupancy, MapStatus, FIRST_RESERVED_KEY, MAX_VALUE_BYTES};

use crate::cubins::MAP;
use crate::element::Element;
use crate::error::{CudaResultExt, Error, Result};
use crate::memory::{round_trip, DeviceMemory, SetUp, SymmetricBuffer};
use crate::module::{grid, Function, KernelArgs, Module};
use crate::runtime::Nvshmem;
use config::{check_batch, check_key, check_sizes, owner, EMPTY_KEY};
use cudarc::driver::{result as cu, CudaStream};
use std::sync::Arc;

/// Threads of a block of the batched kernels.
const THREADS: u32 = 256;
/// Values from this size up are copied by a block per key, smaller ones by a warp.
const BLOCK_VALUE_BYTES: usize = 4096;
/// Blocks a batched kernel runs at most (its warps or blocks then take several keys).
const MAX_BLOCKS: usize = 2048;
/// Words after the keys that hold this PE's sizes, for the PEs to compare at construction.
const SIZE_WORDS: usize = 2;

/// A hash map in symmetric memory over every PE. See the [module documentation](self) for
/// the layout and the memory-ordering rules.
///
/// Building, [`clear`](Self::clear) and dropping are collective; everything else is not.
/// Host calls are `&self` and may be made from any thread.
pub struct SymmetricMap {
    kernels: Kernels,
    /// The stream of the host calls that wait (single keys, occupancy).
    stream: Arc<CudaStream>,
    /// The key words, then this PE's sizes (`SIZE_WORDS`).
    keys: SymmetricBuffer<u64>,
    values: SymmetricBuffer<u8>,
    slots_per_pe: usize,
    value_bytes: usize,
    shmem: Nvshmem,
}

struct Kernels {
    insert_warps: Function,
    insert_blocks: Function,
    lookup_warps: Function,
    lookup_blocks: Function,
    remove_warps: Function,
    count: Function,
}

impl std::fmt::Debug for SymmetricMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SymmetricMap({} slots of {}-byte values per PE, {} PEs)",
            self.slots_per_pe,
            self.value_bytes,
            self.shmem.n_pes()
        )
    }
}

/// Which batched operation.
#[derive(Clone, Copy)]
enum Op {
    Insert,
    Lookup,
}

impl SymmetricMap {
    /// A map of `slots_per_pe` slots of `value_bytes`-byte values on every PE, all empty
    /// (collective: every PE passes the same sizes, or every PE gets
    /// [`Error::CollectiveMismatch`]). `value_bytes` is a positive multiple of 16, at most
    /// [`MAX_VALUE_BYTES`].
    pub fn new(shmem: &Nvshmem, config: MapConfig) -> Result<Self> {
        let MapConfig {
            slots_per_pe,
            value_bytes,
        } = config;
        let region = check_sizes(slots_per_pe, value_bytes)?;
        let module = Module::load(shmem, &MAP)?;
        let kernels = Kernels {
            insert_warps: module.function("map_insert_warps")?,
            insert_blocks: module.function("map_insert_blocks")?,
            lookup_warps: module.function("map_lookup_warps")?,
            lookup_blocks: module.function("map_lookup_blocks")?,
            remove_warps: module.function("map_remove_warps")?,
            count: module.function("map_count_slots")?,
        };
        let stream = shmem.new_stream()?;
        let keys = shmem.malloc::<u64>(slots_per_pe + SIZE_WORDS)?;
        let values = shmem.malloc_aligned::<u8>(256, region)?;
        let sizes = [slots_per_pe as u64, value_bytes as u64];
        let mut init = vec![EMPTY_KEY; slots_per_pe];
        init.extend_from_slice(&sizes);
        keys.copy_from_host(&init)?;
        // No PE inserts into a PE whose keys are not empty yet.
        shmem.set_up_barrier(SetUp::SymmetricMap)?;
        let map = SymmetricMap {
            kernels,
            stream,
            keys,
            values,
            slots_per_pe,
            value_bytes,
            shmem: shmem.clone(),
        };
        // Equal allocations do not make equal maps (64 slots of 32 bytes, 32 of 64): every
        // PE compares every PE's sizes, so all fail alike.
        for pe in 0..shmem.n_pes() {
            let theirs = [
                shmem.atomic_fetch(&map.keys, slots_per_pe, pe)?,
                shmem.atomic_fetch(&map.keys, slots_per_pe + 1, pe)?,
            ];
            if theirs != sizes {
                return Err(Error::CollectiveMismatch(format!(
                    "SymmetricMap::new on PE {} has (slots_per_pe, value_bytes) = {:?} and on \
                     PE {pe} {:?}; build the map with the same sizes on every PE",
                    shmem.my_pe(),
                    sizes,
                    theirs
                )));
            }
        }
        Ok(map)
    }

    /// Slots each PE holds.
    pub fn slots_per_pe(&self) -> usize {
        self.slots_per_pe
    }

    /// Bytes of a value.
    pub fn value_bytes(&self) -> usize {
        self.value_bytes
    }

    /// Keys the whole map holds at most (every PE's slots); an owner fills before that when
    /// the keys' hashes favour it.
    pub fn capacity(&self) -> usize {
        self.slots_per_pe * self.shmem.n_pes()
    }

    /// The PE that holds `key` (the one its hash names), as kernels' `map_owner` computes
    /// it: work that reads a key may run where it lives.
    pub fn owner_of(&self, key: u64) -> usize {
        owner(key, self.shmem.n_pes())
    }

    /// The runtime.
    pub fn runtime(&self) -> &Nvshmem {
        &self.shmem
    }

    /// The map as kernels take it (by value: `KernelArgs::value(map.handle())`, a
    /// `nvshmem_rs_map` parameter for the functions of `nvshmem_rs/map.cuh`).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// # let shmem = nvshmem::Nvshmem::init()?;
    /// # let module = nvshmem::module::Module::from_file(&shmem, "my_kernels.cubin")?;
    /// use nvshmem::map::{MapConfig, SymmetricMap};
    /// use nvshmem::module::{grid, KernelArgs};
    /// let map = SymmetricMap::new(&shmem, MapConfig::new(1024, 256))?;
    /// // extern "C" __global__ void my_kernel(nvshmem_rs_map map, const uint64_t *keys)
    /// let kernel = module.function("my_kernel")?;
    /// let keys = shmem.alloc_device::<u64>(32)?;
    /// let mut args = KernelArgs::new();
    /// args.value(map.handle()).device_ptr(keys.addr());
    /// // SAFETY: the arguments match the kernel's parameters.
    /// unsafe { kernel.launch(grid(1, 32), shmem.stream(), &mut args)? };
    /// # Ok(()) }
    /// ```
    pub fn handle(&self) -> MapHandle {
        MapHandle {
            keys: self.keys.as_ptr(),
            values: self.values.as_ptr() as *mut std::os::raw::c_char,
            value_bytes: self.value_bytes as u64,
            slots: self.slots_per_pe as u32,
            my_pe: self.shmem.my_pe() as i32,
            n_pes: self.shmem.n_pes() as i32,
        }
    }

    /// Insert `key` with `value` (at most `value_bytes` bytes; the rest of the slot's value
    /// is zeros), on whichever PE owns it; waits. [`MapStatus::Done`], or
    /// [`MapStatus::Exists`] (the key is there: nothing changes; remove it first to replace
    /// its value) or [`MapStatus::Full`] (its owner has no free slot).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// # let shmem = nvshmem::Nvshmem::init()?;
    /// use nvshmem::map::{MapConfig, MapStatus, SymmetricMap};
    /// let map = SymmetricMap::new(&shmem, MapConfig::new(1024, 16))?;
    /// if shmem.my_pe() == 0 {
    ///     assert_eq!(map.insert(7, b"seven")?, MapStatus::Done);
    ///     assert_eq!(map.insert(7, b"again")?, MapStatus::Exists);
    ///     assert_eq!(&map.get(7)?.unwrap()[..5], b"seven");
    ///     assert!(map.remove(7)? && map.get(7)?.is_none());
    ///     // The three largest words are reserved.
    ///     assert!(map.insert(u64::MAX, b"no").is_err());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn insert(&self, key: u64, value: &[u8]) -> Result<MapStatus> {
        check_key(key)?;
        if value.len() > self.value_bytes {
            return Err(Error::InvalidArgument(format!(
                "a value of {} bytes for key {key}: this map's values hold {} bytes (MapConfig::value_bytes)",
                value.len(),
                self.value_bytes
            )));
        }
        // The key and a word of padding, then the value in whole words (16-byte aligned).
        let mut input = vec![key, 0];
        input.extend(
            value
                .chunks(8)
                .map(|c| {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    u64::from_le_bytes(w)
                })
                .chain(std::iter::repeat(0))
                .take(self.value_bytes / 8),
        );
        let out = round_trip(&self.shmem, &self.stream, &input, 1, |base, out| {
            self.launch(Op::Insert, base + 16, base, out, 1, &self.stream)
        })?;
        MapStatus::from_word(out[0])
    }

    /// The value of `key` (`value_bytes` bytes), or `None` when it is not in the map; waits.
    pub fn get(&self, key: u64) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let words = self.value_bytes / 8;
        // The status word, a word of padding, then the value (16-byte aligned).
        let out = round_trip(
            &self.shmem,
            &self.stream,
            &[key, 0],
            2 + words,
            |base, out| self.launch(Op::Lookup, out + 16, base, out, 1, &self.stream),
        )?;
        match MapStatus::from_word(out[0])? {
            MapStatus::Done => Ok(Some(
                out[2..].iter().flat_map(|w| w.to_le_bytes()).collect(),
            )),
            _ => Ok(None),
        }
    }

    /// Remove `key`: whether it was in the map; waits. Nothing may still be reading its
    /// value (see the module documentation).
    pub fn remove(&self, key: u64) -> Result<bool> {
        check_key(key)?;
        let out = round_trip(&self.shmem, &self.stream, &[key], 1, |keys, out| {
            self.launch_remove(keys, out, 1, &self.stream)
        })?;
        Ok(MapStatus::from_word(out[0])? == MapStatus::Done)
    }

    /// Insert `keys[i]` with value `i` of `values` (`value_bytes` bytes each, so `values`
    /// holds `keys.len() × value_bytes` bytes) on `stream`; `status[i]` gets the
    /// [`MapStatus`] code of each ([`MapStatus::from_code`]). No host work but the launch, so
    /// it can be captured in a CUDA graph. A reserved key gets [`MapStatus::Reserved`].
    pub fn insert_batch<T: Element>(
        &self,
        keys: &impl DeviceMemory<u64>,
        values: &impl DeviceMemory<T>,
        status: &impl DeviceMemory<u32>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.batch(Op::Insert, values, keys, status, stream)
    }

    /// Copy the value of `keys[i]` to value `i` of `dst` (`keys.len() × value_bytes` bytes)
    /// on `stream`; `status[i]` gets [`MapStatus::Done`] or [`MapStatus::Absent`] (that value
    /// of `dst` is left as it was). Graph-capturable, as [`insert_batch`](Self::insert_batch).
    pub fn lookup_batch<T: Element>(
        &self,
        dst: &impl DeviceMemory<T>,
        keys: &impl DeviceMemory<u64>,
        status: &impl DeviceMemory<u32>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.batch(Op::Lookup, dst, keys, status, stream)
    }

    /// A checked batched insert or lookup: `values` are the values to insert or the lookup's
    /// destination.
    fn batch<T: Element>(
        &self,
        op: Op,
        values: &impl DeviceMemory<T>,
        keys: &impl DeviceMemory<u64>,
        status: &impl DeviceMemory<u32>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let what = match op {
            Op::Insert => "values",
            Op::Lookup => "lookup destination",
        };
        let n = check_batch(keys, status, Some((what, values)), self.value_bytes)?;
        let (values, keys) = (values.device_addr(stream), keys.device_addr(stream));
        self.launch(op, values, keys, status.device_addr(stream), n, stream)
    }

    /// Remove every key of `keys` on `stream`; `status[i]` gets [`MapStatus::Done`] or
    /// [`MapStatus::Absent`]. Graph-capturable.
    pub fn remove_batch(
        &self,
        keys: &impl DeviceMemory<u64>,
        status: &impl DeviceMemory<u32>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let n = check_batch::<u64>(keys, status, None, 0)?;
        self.launch_remove(
            keys.device_addr(stream),
            status.device_addr(stream),
            n,
            stream,
        )
    }

    /// How PE `pe`'s slots are used now (read with atomics while other PEs may change them).
    pub fn occupancy(&self, pe: usize) -> Result<MapOccupancy> {
        let pe32 = self.shmem.check_pe(pe)?;
        let handle = self.handle();
        let counts = round_trip(&self.shmem, &self.stream, &[], 4, |_, counts| {
            let mut args = KernelArgs::new();
            args.value(handle).value(pe32).device_ptr(counts);
            // SAFETY: map_count_slots(nvshmem_rs_map, int32_t, uint64_t *): 4 words.
            unsafe {
                self.kernels
                    .count
                    .launch(grid(1, 1024), &self.stream, &mut args)
            }
        })?;
        Ok(MapOccupancy {
            keys: counts[0] as usize,
            removed: counts[1] as usize,
            busy: counts[2] as usize,
            empty: counts[3] as usize,
        })
    }

    /// Empty the map on every PE (collective: every PE calls, after its last use of the map;
    /// nothing may use it until every PE has returned).
    pub fn clear(&self) -> Result<()> {
        self.shmem.barrier_all()?;
        self.shmem.bind_context()?;
        // SAFETY: this PE's own key words; the stream is waited for below.
        unsafe {
            cu::memset_d8_async(
                self.keys.as_ptr() as u64,
                0xFF,
                8 * self.slots_per_pe,
                self.stream.cu_stream(),
            )
        }
        .during("cuMemsetD8Async")?;
        self.stream.synchronize().during("cuStreamSynchronize")?;
        self.shmem.barrier_all()
    }

    /// Launch a batched insert or lookup of `n` keys at `keys`, values at `values`.
    fn launch(
        &self,
        op: Op,
        values: u64,
        keys: u64,
        status: u64,
        n: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let by_block = self.value_bytes >= BLOCK_VALUE_BYTES;
        let kernel = match (op, by_block) {
            (Op::Insert, false) => &self.kernels.insert_warps,
            (Op::Insert, true) => &self.kernels.insert_blocks,
            (Op::Lookup, false) => &self.kernels.lookup_warps,
            (Op::Lookup, true) => &self.kernels.lookup_blocks,
        };
        let mut args = KernelArgs::new();
        args.value(self.handle());
        match op {
            Op::Insert => args.device_ptr(keys).device_ptr(values),
            Op::Lookup => args.device_ptr(values).device_ptr(keys),
        };
        args.value(n as u32).device_ptr(status);
        let per_block = if by_block { 1 } else { THREADS as usize / 32 };
        let blocks = n.div_ceil(per_block).min(MAX_BLOCKS) as u32;
        // SAFETY: the kernels' parameters (map, keys and values or dst and keys, n, status);
        // the callers checked that keys, values and status hold n entries.
        unsafe { kernel.launch(grid(blocks, THREADS), stream, &mut args) }
    }

    fn launch_remove(
        &self,
        keys: u64,
        status: u64,
        n: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let blocks = n.div_ceil(THREADS as usize / 32).min(MAX_BLOCKS) as u32;
        let mut args = KernelArgs::new();
        args.value(self.handle())
            .device_ptr(keys)
            .value(n as u32)
            .device_ptr(status);
        // SAFETY: map_remove_warps(nvshmem_rs_map, const uint64_t *, uint32_t, uint32_t *);
        // keys and status hold n entries.
        unsafe {
            self.kernels
                .remove_warps
                .launch(grid(blocks, THREADS), stream, &mut args)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_is_send_and_sync() {
        // Host calls are `&self` from any thread (the crate's promise for every type).
        fn check<T: Send + Sync>() {}
        check::<SymmetricMap>();
    }
}
