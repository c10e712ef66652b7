//! How one call is launched: its grid, how much of the workspace it may use, and its
//! by-value parameter. Pure arithmetic, tested on the CPU.

use super::algo::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, ReduceAlgo, ReduceScatterAlgo,
};
use crate::abi;

/// Blocks a call launches at most (the epoch and the flags have a copy per block index).
pub(crate) const MAX_BLOCKS: usize = abi::COLL_MAX_BLOCKS as usize;
/// The bandwidth all-reduce's chunk ring per source PE (slots x blocks x chunk) fits in this
/// much of a staging slot.
pub(crate) const BW_STAGING_BYTES: usize = 6 << 20;
/// Threads per block of the bandwidth all-reduce; it runs up to two blocks per SM, so that
/// one block's flag handshake overlaps another's copies.
pub(crate) const BW_THREADS: u32 = 256;
pub(crate) const BW_BLOCKS_PER_SM: usize = 2;
/// Chunk slots per block and source. From three on, a block pushes its next round's chunks
/// before it waits for the current round's (measured on 4 H200s with the same 8 KiB chunks:
/// 1-3% faster than two slots at 64-256 MiB, 2-5% on 2 H200s; four slots no faster).
const BW_SLOTS: usize = 3;
/// Smallest chunk, in 16-byte vectors: below it, fewer blocks are launched.
const BW_MIN_CHUNK_VECS: usize = 256;
/// Threads per block of the two-shot all-reduce and the bandwidth all-gather, and the
/// vectors each thread handles at once (`UNROLL` in the kernels).
const THREADS: u32 = abi::COLL_MAX_THREADS;
const UNROLL: usize = abi::COLL_UNROLL as usize;
/// One-shot grid: small blocks over many SMs spread the pushes (measured on 4 H200s,
/// 128 x 128 beat 64 x 512 by 0.4 to 1.5 us from 64 KiB to 512 KiB).
const ONESHOT_MAX_BLOCKS: usize = 128;
const ONESHOT_THREADS: u32 = 128;
/// Low-latency lines hold 8 bytes of data each; smaller blocks spread them over more SMs.
pub(crate) const LL_THREADS: u32 = 128;
/// From this many lines (or sentinel vectors) on, on more than 2 PEs, low-latency blocks may
/// be as small as a warp, so that more SMs share the lines. Measured on 4 H200s: the
/// all-gather of 32 and 64 KiB took 3.22 and 3.29-3.30 us against 3.27-3.28 and 3.41-3.44
/// with 128-thread blocks, the all-to-all 3.39-3.40 and 3.47 against 3.44-3.46 and 3.59-3.62.
/// Below it warp-sized blocks lost (one block of 32 threads: 2.80 us for the 8-byte
/// all-reduce against 2.60), and so did they on 2 PEs (16 KiB 0.04-0.07 us slower).
const LL_SPREAD_LINES: usize = 1024;
/// The least low-latency block from LL_SPREAD_LINES on.
const LL_SPREAD_THREADS: usize = 32;
/// Largest low-latency block.
pub(crate) const LL_MAX_THREADS: usize = abi::COLL_MAX_THREADS as usize;

/// The sizes a plan is made from: this GPU's (agreed by every PE) and the workspace's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) n_pes: usize,
    /// SMs (the smallest over PEs).
    pub(crate) sm_count: usize,
    /// Bandwidth all-reduce blocks that are resident at once on every PE.
    pub(crate) bandwidth_max_blocks: usize,
    pub(crate) staging_slot_bytes: usize,
    pub(crate) lines_slot_bytes: usize,
    pub(crate) sentinel_slot_bytes: usize,
    /// The compressed all-reduce's quantised input, at most.
    pub(crate) compressed_bytes: usize,
}

/// The by-value parameter of a call (`Params` says which kind its kernel takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extra {
    /// Nothing (or the peer table, for kernels that take one).
    None,
    /// The bandwidth all-reduce's chunking.
    Plan(abi::BandwidthPlan),
    /// The broadcast's root PE.
    Root(i32),
    /// The relay broadcast's segment size (16-byte vectors) and root PE.
    Relay { chunk_vecs: u32, root: i32 },
}

/// One call's launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallPlan {
    pub(crate) blocks: u32,
    pub(crate) threads: u32,
    /// The largest input (bytes per PE) the algorithm's part of the workspace holds.
    pub(crate) limit: usize,
    pub(crate) extra: Extra,
}

/// The plan of an all-reduce of `bytes` per PE (`algo` is not `Auto`).
pub(crate) fn all_reduce_plan(algo: AllReduceAlgo, bytes: usize, d: &Dims) -> CallPlan {
    let nvec = bytes / 16;
    let max_blocks = d.sm_count.min(MAX_BLOCKS);
    let plain = |(blocks, threads): (u32, u32), limit| CallPlan {
        blocks,
        threads,
        limit,
        extra: Extra::None,
    };
    match algo {
        AllReduceAlgo::Sentinel => plain(
            ll_grid(bytes.div_ceil(16), max_blocks, d.n_pes),
            d.sentinel_slot_bytes,
        ),
        AllReduceAlgo::SentinelTwoShot => plain(
            ll_grid(bytes.div_ceil(16), max_blocks, d.n_pes),
            sentinel_twoshot_max_input(d.sentinel_slot_bytes, d.n_pes),
        ),
        AllReduceAlgo::LowLatency => plain(
            ll_grid(bytes.div_ceil(8), max_blocks, d.n_pes),
            ll_max_input(d.lines_slot_bytes),
        ),
        AllReduceAlgo::LowLatencyTwoShot => plain(
            ll_grid(bytes.div_ceil(8).div_ceil(d.n_pes), max_blocks, d.n_pes),
            ll_twoshot_max_input(d.lines_slot_bytes, d.n_pes),
        ),
        AllReduceAlgo::OneShot => plain(
            (
                blocks_for(nvec, ONESHOT_THREADS as usize, ONESHOT_MAX_BLOCKS),
                ONESHOT_THREADS,
            ),
            d.staging_slot_bytes,
        ),
        AllReduceAlgo::TwoShot => plain(
            (
                blocks_for(
                    nvec.div_ceil(d.n_pes),
                    THREADS as usize * UNROLL,
                    max_blocks,
                ),
                THREADS,
            ),
            usize::MAX,
        ),
        AllReduceAlgo::Bandwidth | AllReduceAlgo::Auto => {
            let (blocks, plan) = bandwidth_plan(nvec, d.n_pes, d.bandwidth_max_blocks);
            CallPlan {
                blocks,
                threads: BW_THREADS,
                limit: bandwidth_max_input(blocks, plan, d.n_pes),
                extra: Extra::Plan(plan),
            }
        }
    }
}

/// The plan of an all-gather of `bytes` per PE (`algo` is not `Auto`).
pub(crate) fn all_gather_plan(algo: AllGatherAlgo, bytes: usize, d: &Dims) -> CallPlan {
    let nvec = bytes.div_ceil(16);
    let (grid, limit) = match algo {
        AllGatherAlgo::LowLatency => (
            ll_grid(bytes.div_ceil(8), d.sm_count, d.n_pes),
            ll_max_input(d.lines_slot_bytes),
        ),
        AllGatherAlgo::OneShot => (
            (
                blocks_for(nvec, ONESHOT_THREADS as usize, ONESHOT_MAX_BLOCKS),
                ONESHOT_THREADS,
            ),
            d.staging_slot_bytes,
        ),
        // The copy-engine path launches no kernel of this shape (see `copies`).
        AllGatherAlgo::Bandwidth | AllGatherAlgo::Auto | AllGatherAlgo::CopyEngine => (
            (
                blocks_for(nvec, THREADS as usize * UNROLL, d.sm_count.min(MAX_BLOCKS)),
                THREADS,
            ),
            usize::MAX,
        ),
    };
    CallPlan {
        blocks: grid.0,
        threads: grid.1,
        limit,
        extra: Extra::None,
    }
}

/// The plan of the low-latency all-gather by output words, which takes the low-latency
/// all-gathers on more than 2 PEs that fit its lines: a thread takes each 8 bytes of the
/// output, and a PE sends the words its block overlaps (one more than its lines at most).
/// Measured on 4 H200s against the all-gather by lines: 0.03-0.4 us faster from 8 B to
/// 256 KiB (32 KiB: 2.99 us against 3.18-3.19), and with blocks off 8 bytes cut without a
/// branch, 0.2-0.3 us faster for blocks of 6 to 12 bytes; on 2 PEs, where a thread of the
/// all-gather by lines already takes one peer's line, it was up to 0.5 us slower. `None`
/// for every other all-gather.
pub(crate) fn all_gather_words_plan(
    algo: AllGatherAlgo,
    bytes: usize,
    d: &Dims,
) -> Option<CallPlan> {
    let (limit, total) = (
        ll_max_input(d.lines_slot_bytes).saturating_sub(8),
        bytes * d.n_pes,
    );
    // The kernel finds a word's blocks in 32-bit arithmetic.
    let fits = bytes <= limit && total <= u32::MAX as usize;
    (algo == AllGatherAlgo::LowLatency && d.n_pes > 2 && fits).then(|| {
        let (blocks, threads) = ll_grid(total.div_ceil(8), d.sm_count, d.n_pes);
        CallPlan {
            blocks,
            threads,
            limit,
            extra: Extra::None,
        }
    })
}

/// The plan of a reduce-scatter of `bytes` per PE out (`algo` is not `Auto`): the pull
/// algorithm's grid is the two-shot all-reduce's over its part; the low-latency one takes a
/// line of every block per thread.
pub(crate) fn reduce_scatter_plan(algo: ReduceScatterAlgo, bytes: usize, d: &Dims) -> CallPlan {
    let nvec = bytes.div_ceil(16);
    match algo {
        ReduceScatterAlgo::LowLatency => ll_plan(bytes, d, Extra::None),
        ReduceScatterAlgo::Pull | ReduceScatterAlgo::Auto => CallPlan {
            blocks: blocks_for(nvec, THREADS as usize * UNROLL, d.sm_count.min(MAX_BLOCKS)),
            threads: THREADS,
            limit: usize::MAX,
            extra: Extra::None,
        },
    }
}

/// The plan of a low-latency call that sends `bytes` per destination: a line of each per
/// thread, and room for them in a lines slot.
fn ll_plan(bytes: usize, d: &Dims, extra: Extra) -> CallPlan {
    ll_plan_on(ll_grid(bytes.div_ceil(8), d.sm_count, d.n_pes), d, extra)
}

/// `ll_plan` on a grid chosen by the caller.
fn ll_plan_on((blocks, threads): (u32, u32), d: &Dims, extra: Extra) -> CallPlan {
    CallPlan {
        blocks,
        threads,
        limit: ll_max_input(d.lines_slot_bytes),
        extra,
    }
}

/// The largest input of `bytes` per destination whose lines (16 bytes for 8 of data) fit a
/// lines slot of `slot_bytes`.
pub(crate) fn ll_max_input(slot_bytes: usize) -> usize {
    (slot_bytes - 16) / 2
}

/// The grid and limit of a one-shot (through staging) or push (straight into the outputs)
/// move of `bytes` per destination, the rest of the broadcast's and all-to-all's plans.
fn move_plan(oneshot: bool, bytes: usize, d: &Dims, extra: Extra) -> CallPlan {
    let nvec = bytes.div_ceil(16);
    let (blocks, threads, limit) = if oneshot {
        let blocks = blocks_for(nvec, ONESHOT_THREADS as usize, ONESHOT_MAX_BLOCKS);
        (blocks, ONESHOT_THREADS, d.staging_slot_bytes)
    } else {
        let blocks = blocks_for(nvec, THREADS as usize * UNROLL, d.sm_count.min(MAX_BLOCKS));
        (blocks, THREADS, usize::MAX)
    };
    CallPlan {
        blocks,
        threads,
        limit,
        extra,
    }
}

/// The grid of a copy of `bytes` by the SMs (the push's).
pub(crate) fn copy_grid(bytes: usize, d: &Dims) -> (u32, u32) {
    let p = move_plan(false, bytes, d, Extra::None);
    (p.blocks, p.threads)
}

/// The plan of a broadcast of `bytes` from `root` (`algo` is not `Auto`).
pub(crate) fn broadcast_plan(algo: BroadcastAlgo, bytes: usize, root: usize, d: &Dims) -> CallPlan {
    match algo {
        BroadcastAlgo::LowLatency | BroadcastAlgo::LowLatencyRelay => ll_plan_on(
            ll_grid_from(bytes.div_ceil(8), d.sm_count, LL_THREADS as usize),
            d,
            Extra::Root(root as i32),
        ),
        BroadcastAlgo::Relay => relay_plan(bytes, root, d),
        _ => move_plan(
            algo == BroadcastAlgo::OneShot,
            bytes,
            d,
            Extra::Root(root as i32),
        ),
    }
}

/// Rounds a relay broadcast aims for, and segment sizes (16-byte vectors). A relay forwards a
/// round behind the root, so more rounds shorten the pipeline's fill; but every round ends
/// with a system-scope release of the root's stores and a flag each relay waits for. Measured
/// on 4 H200s (graph replays), us at 1 / 2 / 4 / 8 / 32 / 64 MiB, by the rounds aimed for and
/// the segments' bounds: 4 rounds of 4 to 32 KiB, 15.9 / 22.0 / 28.0 / 40.2 / 114.9 / 209.9;
/// 8 rounds of 8 to 64 KiB, 14.9 / 19.6 / 27.2 / 42.7 / 117.5 / 223.9; 32 rounds of 4 to
/// 32 KiB, 18.2 / 21.9 / 33.7 / 57.2 / - / 213.9. These bounds (4 rounds of 8 to 32 KiB),
/// in a later run: 14.95 / 19.55 / 26.52 / 40.66 / 113.4 / 207.2. At 256 MiB, 31 or 62 rounds
/// made no difference (776 and 772 us).
const RELAY_ROUNDS: usize = 4;
const RELAY_MIN_CHUNK_VECS: usize = 512;
const RELAY_MAX_CHUNK_VECS: usize = 2048;
/// Fewest rounds: below `RELAY_MIN_ROUNDS` segments of the smallest size per block, fewer
/// blocks are launched.
const RELAY_MIN_ROUNDS: usize = 2;

/// The plan of a relay broadcast of `bytes`: one 512-thread block per SM (all resident, as
/// the blocks' barriers need), at least `RELAY_MIN_ROUNDS` rounds, and segments that make
/// about `RELAY_ROUNDS` of them.
fn relay_plan(bytes: usize, root: usize, d: &Dims) -> CallPlan {
    let nvec = bytes / 16;
    let blocks = blocks_for(
        nvec,
        RELAY_MIN_CHUNK_VECS * RELAY_MIN_ROUNDS,
        d.sm_count.min(MAX_BLOCKS),
    );
    let blocks_n = blocks as usize;
    // RELAY_ROUNDS where the segments' bounds allow, then segments evened out over the
    // rounds (no short last round).
    let rounds = nvec
        .div_ceil(blocks_n * RELAY_MAX_CHUNK_VECS)
        .max(RELAY_ROUNDS.min(nvec / (blocks_n * RELAY_MIN_CHUNK_VECS)))
        .max(1);
    let chunk_vecs = nvec.div_ceil(blocks_n * rounds).max(1);
    // Rounds stay below the round bits of the flag values (terabytes).
    let max_rounds = (1usize << abi::COLL_ROUND_BITS) - 2;
    CallPlan {
        blocks,
        threads: THREADS,
        limit: max_rounds
            .saturating_mul(RELAY_MAX_CHUNK_VECS * blocks_n)
            .saturating_mul(16),
        extra: Extra::Relay {
            chunk_vecs: chunk_vecs as u32,
            root: root as i32,
        },
    }
}

/// The plan of an all-to-all with counts: one grid whatever the counts, which differ between
/// PEs (blocks pair up with the same block index on every PE). The counts follow the common
/// parameters (the caller appends them: too large to copy around in a plan).
pub(crate) fn all_to_all_v_plan(d: &Dims) -> CallPlan {
    CallPlan {
        blocks: d.sm_count.clamp(1, MAX_BLOCKS) as u32,
        threads: THREADS,
        limit: usize::MAX,
        extra: Extra::None,
    }
}

/// The plan of an all-to-all of `bytes` per block (`algo` is not `Auto`).
pub(crate) fn all_to_all_plan(algo: AllToAllAlgo, bytes: usize, d: &Dims) -> CallPlan {
    match algo {
        AllToAllAlgo::LowLatency => ll_plan(bytes, d, Extra::None),
        _ => move_plan(algo == AllToAllAlgo::OneShot, bytes, d, Extra::None),
    }
}

/// The plan of a reduce of `bytes` to `root` (`algo` is not `Auto`): the pull of the
/// reduce-scatter, the root reading all of it.
pub(crate) fn reduce_plan(algo: ReduceAlgo, bytes: usize, root: usize, d: &Dims) -> CallPlan {
    let nvec = bytes.div_ceil(16);
    match algo {
        ReduceAlgo::Pull | ReduceAlgo::Auto => CallPlan {
            blocks: blocks_for(nvec, THREADS as usize * UNROLL, d.sm_count.min(MAX_BLOCKS)),
            threads: THREADS,
            limit: usize::MAX,
            extra: Extra::Root(root as i32),
        },
    }
}

/// Blocks and plan of a bandwidth all-reduce over `nvec` vectors: enough blocks for chunks of
/// at least `BW_MIN_CHUNK_VECS`, up to `max_blocks`, and chunks that fill the ring (measured
/// on 4 H200s at 256 MiB: two 256-thread blocks per SM with 8 KiB chunks beat one 512-thread
/// block per SM with 16 to 64 KiB chunks by 2 to 16%, and three or four blocks per SM).
pub(crate) fn bandwidth_plan(
    nvec: usize,
    n_pes: usize,
    max_blocks: usize,
) -> (u32, abi::BandwidthPlan) {
    let part = nvec.div_ceil(n_pes.max(1));
    let blocks = blocks_for(part, BW_MIN_CHUNK_VECS, max_blocks.clamp(1, MAX_BLOCKS));
    let plan = abi::BandwidthPlan {
        chunk_vecs: (BW_STAGING_BYTES / 16 / (BW_SLOTS * blocks as usize)) as u32,
        slots: BW_SLOTS as u32,
    };
    (blocks, plan)
}

/// The largest bandwidth all-reduce input whose rounds fit the round bits of its flag values
/// (`COLL_ROUND_BITS`: fewer than 2^20 - 1 rounds, terabytes).
pub(crate) fn bandwidth_max_input(blocks: u32, plan: abi::BandwidthPlan, n_pes: usize) -> usize {
    let max_rounds = (1usize << abi::COLL_ROUND_BITS) - 2;
    let cap = plan.chunk_vecs as usize * blocks as usize;
    max_rounds
        .saturating_mul(cap)
        .saturating_mul(n_pes.max(1))
        .saturating_mul(16)
}

/// A team of `n_pes` PEs' slot in a region of `slot_bytes` per PE of the largest team
/// (`room` PEs): the region shared among the team's PEs, in 16-byte units (every slot starts
/// aligned), never less than `slot_bytes`. A limit that grows with the slot (a one-shot's
/// input) is then at least the largest team's; one that grows with slot × PEs (a
/// two-shot's) is too where `n_pes` divides `room`, and within 16 bytes a slot otherwise.
pub(crate) fn team_slot_bytes(slot_bytes: usize, room: usize, n_pes: usize) -> usize {
    let shared = slot_bytes.saturating_mul(room) / n_pes.max(1) / 16 * 16;
    shared.max(slot_bytes)
}

/// Staging slot that a low-latency two-shot of `bytes` needs: one line (16 bytes for 8 of
/// data) per line of a part, in each half.
pub(crate) fn ll_twoshot_slot_bytes(bytes: usize, n_pes: usize) -> usize {
    2 * 16 * bytes.div_ceil(8).div_ceil(n_pes.max(1))
}

/// The largest low-latency two-shot input whose parts fit half of a `slot_bytes` slot.
pub(crate) fn ll_twoshot_max_input(slot_bytes: usize, n_pes: usize) -> usize {
    slot_bytes / 32 * n_pes.max(1) * 8
}

/// Sentinel slot that a sentinel two-shot of `bytes` needs: a part's 16-byte vectors in each
/// half.
pub(crate) fn sentinel_twoshot_slot_bytes(bytes: usize, n_pes: usize) -> usize {
    2 * 16 * bytes.div_ceil(16).div_ceil(n_pes.max(1))
}

/// The largest sentinel two-shot input whose parts fit half of a `slot_bytes` slot.
pub(crate) fn sentinel_twoshot_max_input(slot_bytes: usize, n_pes: usize) -> usize {
    slot_bytes / 32 * n_pes.max(1) * 16
}

/// Low-latency grid for `lines` lines (or sentinel vectors) on `n_pes` PEs, one per thread
/// where possible, one block per SM at most: 128-thread blocks, or on more than 2 PEs from
/// `LL_SPREAD_LINES` lines on blocks as small as a warp; where that leaves more than a block's
/// lines per SM, larger blocks, so that every line still has its own thread (measured on 2
/// H200s at 256 KiB: 4.01 us against 4.97 with 128 threads).
pub(crate) fn ll_grid(lines: usize, max_blocks: usize, n_pes: usize) -> (u32, u32) {
    let least = match n_pes > 2 && lines >= LL_SPREAD_LINES {
        true => LL_SPREAD_THREADS,
        false => LL_THREADS as usize,
    };
    ll_grid_from(lines, max_blocks, least)
}

/// `ll_grid` with blocks of at least `least` threads at every size. The low-latency broadcast
/// keeps 128: spread like the others, it lost up to 0.16 us from 16 to 64 KiB on 2 PEs.
fn ll_grid_from(lines: usize, max_blocks: usize, least: usize) -> (u32, u32) {
    let max_blocks = max_blocks.clamp(1, MAX_BLOCKS);
    let threads = lines
        .div_ceil(max_blocks)
        .next_multiple_of(32)
        .clamp(least, LL_MAX_THREADS);
    (blocks_for(lines, threads, max_blocks), threads as u32)
}

/// Grid size for `work` units of `per_block` each, between 1 and `max`.
pub(crate) fn blocks_for(work: usize, per_block: usize, max: usize) -> u32 {
    work.div_ceil(per_block).clamp(1, max) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_smaller_team_s_slots_hold_what_the_largest_team_s_hold() {
        assert_eq!(team_slot_bytes(1 << 20, 4, 4), 1 << 20);
        assert_eq!(team_slot_bytes(1 << 20, 4, 2), 2 << 20);
        assert_eq!(team_slot_bytes(1 << 20, 3, 2), 3 << 19);
        // Never below the slot, 16-byte aligned above it, inside the region.
        assert_eq!(team_slot_bytes(1000, 3, 2), 1488);
        assert_eq!(team_slot_bytes(1000, 3, 3), 1000);
        let twoshot = |slot: usize, n: usize| slot / 32 * n * 16;
        for (slot, room, n) in [
            (4096, 8, 3),
            (16 << 20, 5, 3),
            (2 << 20, 2, 1),
            (1 << 20, 8, 4),
        ] {
            let s = team_slot_bytes(slot, room, n);
            assert!(
                s >= slot && s.is_multiple_of(16) && s * n <= slot * room,
                "{slot} {room} {n}"
            );
            let (team, largest) = (twoshot(s, n), twoshot(slot, room));
            match room % n {
                0 => assert_eq!(team, largest, "{slot} {room} {n}"),
                _ => assert!(team + 16 * n >= largest, "{slot} {room} {n}"),
            }
        }
    }

    /// Rounds a bandwidth all-reduce of `nvec` vectors takes (as the kernel counts them).
    fn bandwidth_rounds(nvec: usize, n_pes: usize, blocks: u32, plan: abi::BandwidthPlan) -> usize {
        let cap = plan.chunk_vecs as usize * blocks as usize;
        nvec.div_ceil(n_pes.max(1)).div_ceil(cap.max(1)).max(1)
    }

    #[test]
    fn low_latency_all_gathers_on_more_than_2_pes_go_by_output_words() {
        let dims = |n_pes| Dims {
            n_pes,
            sm_count: 132,
            bandwidth_max_blocks: 264,
            staging_slot_bytes: 6 << 20,
            lines_slot_bytes: 1 << 20,
            sentinel_slot_bytes: 1 << 20,
            compressed_bytes: 0,
        };
        let (d, ll) = (dims(4), AllGatherAlgo::LowLatency);
        // 2 PEs, and the other algorithms, keep the all-gather by lines.
        assert!(all_gather_words_plan(ll, 6, &dims(2)).is_none());
        assert!(all_gather_words_plan(AllGatherAlgo::OneShot, 6, &d).is_none());
        // A thread per output word: 2 bytes on 4 PEs are one word; 8 KiB + 2 are 4097, and
        // 8 KiB (32 KiB out) 4096, where the lines took 1024 threads.
        let p = all_gather_words_plan(ll, 2, &d).unwrap();
        assert_eq!((p.blocks, p.threads), (1, 128));
        let p = all_gather_words_plan(ll, 8194, &d).unwrap();
        assert_eq!((p.blocks, p.threads), ll_grid(4097, 132, 4));
        let p = all_gather_words_plan(ll, 8192, &d).unwrap();
        assert_eq!((p.blocks, p.threads), (128, 32));
        assert_eq!(all_gather_plan(ll, 8192, &d).blocks, 32);
        // A PE sends one word more than its lines at most: the limit leaves room for it.
        let limit = ll_max_input(d.lines_slot_bytes) - 8;
        assert_eq!(p.limit, limit);
        let last = limit - limit % 8 - 2;
        assert!(all_gather_words_plan(ll, last, &d).is_some());
        assert!(all_gather_words_plan(ll, last + 16, &d).is_none());
        assert!(((last - 1) / 8 + 2) * 16 <= d.lines_slot_bytes);
    }

    #[test]
    fn relay_broadcast_takes_few_rounds_of_bounded_segments() {
        let d = Dims {
            n_pes: 4,
            sm_count: 132,
            bandwidth_max_blocks: 264,
            staging_slot_bytes: 6 << 20,
            lines_slot_bytes: 1 << 20,
            sentinel_slot_bytes: 1 << 20,
            compressed_bytes: 0,
        };
        // (bytes, blocks, segment vectors, rounds as the kernel counts them)
        for (bytes, blocks, chunk, rounds) in [
            (0, 1, 1, 0),
            (100, 1, 6, 1),
            (1 << 20, 64, 512, 2),
            (2 << 20, 128, 512, 2),
            (3 << 20, 132, 745, 2),
            (8 << 20, 132, 993, 4),
            (64 << 20, 132, 1986, 16),
            (256 << 20, 132, 2018, 63),
        ] {
            let p = broadcast_plan(BroadcastAlgo::Relay, bytes, 3, &d);
            let Extra::Relay { chunk_vecs, root } = p.extra else {
                panic!("{:?}", p.extra)
            };
            let nvec = bytes / 16;
            let got = nvec.div_ceil(chunk_vecs as usize * p.blocks as usize);
            assert_eq!(
                (p.blocks, chunk_vecs, got, root),
                (blocks, chunk, rounds, 3),
                "{bytes}"
            );
            assert_eq!(p.threads, THREADS);
            assert!(bytes <= p.limit);
        }
    }

    #[test]
    fn low_latency_two_shot_limit_matches_its_staging() {
        for n in 1..=16 {
            for bytes in [1, 7, 8, 9, 4096, 4097, 100_001, 1 << 20, 3 << 20] {
                let need = ll_twoshot_slot_bytes(bytes, n);
                let slot = need.div_ceil(256) * 256;
                // Fits exactly when its parts fit half the slot.
                assert!(bytes <= ll_twoshot_max_input(slot, n), "{bytes} {n}");
                let part_lines = bytes.div_ceil(8).div_ceil(n);
                assert!(part_lines * 16 <= slot / 2, "{bytes} {n}");
                // One line of a part more does not fit.
                let over = ll_twoshot_max_input(slot, n) + 1;
                assert!(over.div_ceil(8).div_ceil(n) * 16 > slot / 2, "{bytes} {n}");
            }
        }
    }

    #[test]
    fn low_latency_limit_fits_a_destination_in_its_lines_slot() {
        for slot in [256, 4096, 2 << 20, 3 << 20] {
            let most = ll_max_input(slot);
            // One line of 16 bytes for every 8 bytes of input (the last one padded).
            assert!(most.div_ceil(8) * 16 <= slot, "{slot}");
            assert!((most + 8 + 1).div_ceil(8) * 16 > slot - 16, "{slot}");
            let d = Dims {
                n_pes: 4,
                sm_count: 132,
                bandwidth_max_blocks: 264,
                staging_slot_bytes: 6 << 20,
                lines_slot_bytes: slot,
                sentinel_slot_bytes: 1 << 20,
                compressed_bytes: 0,
            };
            assert_eq!(
                reduce_scatter_plan(ReduceScatterAlgo::LowLatency, 8, &d).limit,
                most
            );
            let b = broadcast_plan(BroadcastAlgo::LowLatency, 4096, 3, &d);
            assert_eq!((b.limit, b.extra), (most, Extra::Root(3)));
            assert_eq!(all_to_all_plan(AllToAllAlgo::LowLatency, 1, &d).limit, most);
        }
        // A thread per line: 1 MiB of lines over 132 SMs takes 512-thread blocks.
        assert_eq!(ll_grid((1 << 20) / 8, 132, 4), (132, 512));
    }

    #[test]
    fn sentinel_two_shot_limit_matches_its_buffers() {
        for n in 1..=16 {
            for bytes in [1, 15, 16, 17, 4096, 4097, 100_001, 1 << 20, 3 << 20] {
                let slot = sentinel_twoshot_slot_bytes(bytes, n).div_ceil(256) * 256;
                assert!(bytes <= sentinel_twoshot_max_input(slot, n), "{bytes} {n}");
                assert!(
                    bytes.div_ceil(16).div_ceil(n) * 16 <= slot / 2,
                    "{bytes} {n}"
                );
                let over = sentinel_twoshot_max_input(slot, n) + 1;
                assert!(over.div_ceil(16).div_ceil(n) * 16 > slot / 2, "{bytes} {n}");
            }
        }
    }

    #[test]
    fn bandwidth_rings_fit_the_staging_slot() {
        for n_pes in [1, 2, 4, 8] {
            for nvec in [0, 1, 255, 4096, 1 << 20, 1 << 24] {
                for max_blocks in [1, 64, 132, 256] {
                    let (blocks, plan) = bandwidth_plan(nvec, n_pes, max_blocks);
                    let blocks = blocks as usize;
                    assert!(blocks >= 1 && blocks <= max_blocks.min(MAX_BLOCKS));
                    assert!(plan.slots >= 1 && plan.chunk_vecs >= 1);
                    let ring = plan.slots as usize * blocks * plan.chunk_vecs as usize * 16;
                    assert!(ring <= BW_STAGING_BYTES, "{nvec} {n_pes} {max_blocks}");
                }
            }
        }
        // Small parts use few blocks, large ones all of them.
        assert_eq!(bandwidth_plan(4096, 4, 132).0, 4);
        let (blocks, plan) = bandwidth_plan(1 << 24, 4, 264);
        assert_eq!((blocks, plan.chunk_vecs, plan.slots), (264, 496, 3));
    }

    #[test]
    fn bandwidth_rounds_stay_below_the_round_bits_of_the_flags() {
        for n_pes in [1, 2, 4, 8] {
            for max_blocks in [1, 132, 264] {
                let (blocks, plan) = bandwidth_plan(1 << 30, n_pes, max_blocks);
                let limit = bandwidth_max_input(blocks, plan, n_pes);
                // Terabytes per PE at least: never a limit on a GPU's memory.
                assert!(limit >= 1 << 40, "{limit}");
                let rounds = bandwidth_rounds(limit / 16, n_pes, blocks, plan);
                assert!(rounds < (1 << abi::COLL_ROUND_BITS) - 1, "{rounds}");
            }
        }
        let (blocks, plan) = bandwidth_plan(1 << 24, 4, 264);
        assert_eq!(bandwidth_rounds(1 << 24, 4, blocks, plan), 33);
    }

    #[test]
    fn low_latency_grids_give_each_line_a_thread_while_they_can() {
        for n_pes in [2, 4, 8] {
            for max_blocks in [1, 66, 132, 512] {
                for lines in [
                    1,
                    31,
                    128,
                    1024,
                    4096,
                    16_896,
                    16_897,
                    40_000,
                    67_584,
                    1 << 20,
                ] {
                    let (blocks, threads) = ll_grid(lines, max_blocks, n_pes);
                    let (blocks, threads) = (blocks as usize, threads as usize);
                    assert!(blocks >= 1 && blocks <= max_blocks, "{lines} {max_blocks}");
                    let least = match n_pes > 2 && lines >= LL_SPREAD_LINES {
                        true => LL_SPREAD_THREADS,
                        false => LL_THREADS as usize,
                    };
                    assert!((least..=LL_MAX_THREADS).contains(&threads));
                    assert_eq!(threads % 32, 0);
                    if lines <= max_blocks * LL_MAX_THREADS {
                        assert!(blocks * threads >= lines, "{lines} {max_blocks}");
                    } else {
                        assert_eq!((blocks, threads), (max_blocks, LL_MAX_THREADS));
                    }
                }
            }
        }
        // Few lines keep 128-thread blocks; on 4 PEs from 1024 lines, blocks of a warp or
        // more over every SM; from 16 384 lines, 128 threads or more again.
        assert_eq!(ll_grid(512, 132, 4), (4, 128));
        assert_eq!(ll_grid(1023, 132, 4), (8, 128));
        assert_eq!(ll_grid(1024, 132, 4), (32, 32));
        assert_eq!(ll_grid(8192, 132, 4), (128, 64));
        assert_eq!(ll_grid(16_384, 132, 4), (128, 128));
        assert_eq!(ll_grid(32_768, 132, 4), (128, 256));
        // 2 PEs keep 128-thread blocks, as does the broadcast.
        assert_eq!(ll_grid(1024, 132, 2), (8, 128));
        assert_eq!(ll_grid(8192, 132, 2), (64, 128));
        assert_eq!(ll_grid_from(2048, 132, LL_THREADS as usize), (16, 128));
    }

    #[test]
    fn grids_stay_within_limits() {
        assert_eq!(blocks_for(0, 512, 64), 1);
        assert_eq!(blocks_for(513, 512, 64), 2);
        assert_eq!(blocks_for(1 << 30, 512, 132), 132);
    }

    #[test]
    fn plans_launch_what_the_previous_dispatch_did() {
        let d = Dims {
            n_pes: 4,
            sm_count: 132,
            bandwidth_max_blocks: 264,
            staging_slot_bytes: 6 << 20,
            lines_slot_bytes: 6 << 20,
            sentinel_slot_bytes: 1 << 20,
            compressed_bytes: 0,
        };
        // 256 KiB: the sentinel paths take one vector per thread.
        let p = all_reduce_plan(AllReduceAlgo::SentinelTwoShot, 256 << 10, &d);
        assert_eq!((p.blocks, p.threads), ll_grid(16_384, 132, 4));
        assert_eq!(p.limit, sentinel_twoshot_max_input(1 << 20, 4));
        let p = all_reduce_plan(AllReduceAlgo::OneShot, 64 << 10, &d);
        assert_eq!((p.blocks, p.threads, p.limit), (32, 128, 6 << 20));
        // 8 MiB: a quarter per PE, 2048 vectors per 512-thread block.
        let p = all_reduce_plan(AllReduceAlgo::TwoShot, 8 << 20, &d);
        assert_eq!((p.blocks, p.threads, p.limit), (64, 512, usize::MAX));
        let p = all_reduce_plan(AllReduceAlgo::Bandwidth, 256 << 20, &d);
        assert_eq!((p.blocks, p.threads), (264, BW_THREADS));
        assert!(matches!(p.extra, Extra::Plan(plan) if plan.chunk_vecs == 496));
        let p = all_gather_plan(AllGatherAlgo::LowLatency, 4096, &d);
        assert_eq!((p.blocks, p.threads), ll_grid(512, 132, 4));
        assert_eq!(p.limit, ((6 << 20) - 16) / 2);
        // 16 KiB: the all-to-all's 2048 lines go in warp-sized blocks, the broadcast's in
        // 128-thread ones.
        let p = all_to_all_plan(AllToAllAlgo::LowLatency, 16 << 10, &d);
        assert_eq!((p.blocks, p.threads), (64, 32));
        let p = broadcast_plan(BroadcastAlgo::LowLatency, 16 << 10, 3, &d);
        assert_eq!((p.blocks, p.threads), (16, 128));
        assert!(matches!(p.extra, Extra::Root(3)));
        assert_eq!(p.limit, ((6 << 20) - 16) / 2);
    }
}
