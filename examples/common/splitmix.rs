//! splitmix64 (Steele, Lea and Flood), the one small random generator of the GPU checks and
//! the benchmark: counter-based, so any PE can rebuild any other PE's data from a seed.
//! Included with `#[path]` by the programs that use it.

#![allow(dead_code)]

/// The generator's increment (2^64 divided by the golden ratio).
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output for state `z`: a good 64-bit mix of `z`.
pub fn mix(z: u64) -> u64 {
    let mut z = z.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator: `next` returns `mix` of its state, then steps the state.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let out = mix(self.0);
        self.0 = self.0.wrapping_add(GOLDEN);
        out
    }
}
