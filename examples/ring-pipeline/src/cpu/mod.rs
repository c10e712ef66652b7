//! The algorithm on the CPU: the expected result, and a model of the kernel that runs every
//! PE's blocks in an arbitrary interleaving with puts landing late.

mod model;
mod schedule;

pub use model::{simulate, simulate_with};
pub use schedule::{kernel_program, Op};

/// What every PE holds after the all-gather: the inputs one after the other.
pub fn reference<T: Copy>(inputs: &[Vec<T>]) -> Vec<T> {
    inputs.iter().flatten().copied().collect()
}

/// One step of the SplitMix64 generator.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
