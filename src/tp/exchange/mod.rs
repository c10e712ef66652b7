//! The fused exchanges of [`Schedule::Fused`](super::Schedule::Fused), from
//! [`FUSED_EXCHANGE_TOKENS`] tokens per PE: the copy engines move chunks of rows between the
//! PEs beside the GEMMs, each chunk raising a flag when it lands ([`flags`]): the
//! sequence-parallel all-gather + GEMM ([`gather`]) and the row-parallel GEMM +
//! reduce-scatter or + all-reduce in rounds ([`rounds`]).

mod flags;
mod gather;
mod rounds;
mod watch;

pub(super) use flags::{peer_bases, stream_memops, ChunkFlags};
pub(super) use gather::GatherCall;
pub(super) use rounds::{produce_rows, Produce, RoundsCall};

/// Tokens per PE from which a layer has a fused exchange: each PE's rows make GEMMs of their
/// own, each of which reads the whole weight, so only where those GEMMs are compute-bound
/// (Hopper does about 200-300 bf16 flops per byte of memory traffic, a GEMM of `m` tokens
/// about `m` per byte of weight).
pub const FUSED_EXCHANGE_TOKENS: usize = 512;
