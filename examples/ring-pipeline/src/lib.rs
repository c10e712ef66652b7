//! An all-gather by ring pipelining, as a crate of its own on top of `nvshmem`: its kernel
//! (`kernels/ring_allgather.cu`) is compiled by `build.rs` with `nvshmem-build`, embedded
//! here, and driven by the safe wrapper [`RingAllGather`].
//!
//! Every PE contributes `elems_per_pe` elements; afterwards every PE holds all contributions,
//! PE `p`'s in slot `p` of the output. Each slot is cut into chunks that travel round the
//! ring of PEs one hop per step, forwarded with put-with-signal as soon as they arrive, so
//! later chunks are still arriving while earlier ones move on. [`cpu`] has the same
//! algorithm as a CPU model, used by the tests.
//!
//! ```no_run
//! # fn main() -> nvshmem::Result<()> {
//! use ring_pipeline::RingAllGather;
//! let shmem = nvshmem::Nvshmem::init()?;
//! let mut ag = RingAllGather::<u32>::new(&shmem, 1 << 20, 1 << 14)?; // collective
//! ag.input().copy_from_host(&vec![shmem.my_pe() as u32; 1 << 20])?;
//! ag.run()?; // collective
//! let all = ag.output().to_vec()?; // n_pes << 20 elements, PE p's in slot p
//! # let _ = all;
//! # Ok(()) }
//! ```

mod layout;
mod ring_all_gather;

pub mod cpu;

pub use layout::Layout;
pub use ring_all_gather::RingAllGather;

/// The linked cubins of `kernels/*.cu`, one constant per file (`RING_ALLGATHER`).
pub mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// The kernel's entry point in [`kernels::RING_ALLGATHER`].
pub const KERNEL: &str = "ring_allgather";

/// Deterministic pseudo-random contributions, so any PE can compute any PE's input.
pub fn random_input(seed: u64, trial: u64, pe: usize, len: usize) -> Vec<u32> {
    let mut state = seed
        ^ trial.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (pe as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..len)
        .map(|_| (cpu::splitmix64(&mut state) >> 32) as u32)
        .collect()
}
