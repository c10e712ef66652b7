//! What a channel takes in memory, and the checks of its arguments: plain arithmetic, tested
//! without a GPU.

use crate::abi::{CHANNEL_LL_MAX_BYTES, CHANNEL_READY_LL, CHANNEL_SLOT_ALIGN, CHANNEL_WORDS};
use crate::element::Element;
use crate::error::{Error, Result};

/// Bytes of a message each block of the send and receive kernels moves: larger messages are
/// cut across more blocks (up to 64), so they go at NVLink's bandwidth rather
/// than one SM's.
pub const SEND_BLOCK_BYTES: u64 = 32 << 10;

/// Blocks of the send and receive kernels at most.
const MAX_BLOCKS: u64 = 64;

/// The blocks that move a message of `bytes` bytes.
pub(crate) fn blocks_for(bytes: u64) -> u32 {
    bytes.div_ceil(SEND_BLOCK_BYTES).clamp(1, MAX_BLOCKS) as u32
}

/// Threads per block for a message of `bytes` bytes: a small block for a message a few
/// vectors long, which starts and synchronises faster (measured 0.3 µs a hand-off at 512 B),
/// and a full one otherwise, whose loads in flight a larger message needs.
pub(crate) fn threads_for(bytes: u64) -> u32 {
    if bytes <= SMALL_MESSAGE_BYTES {
        128
    } else {
        512
    }
}

/// Messages up to this size move with [`threads_for`]'s small block.
const SMALL_MESSAGE_BYTES: u64 = 1 << 10;

/// The shape of a channel: its ends and its slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLayout {
    /// The PE that sends.
    pub producer: usize,
    /// The PE that receives.
    pub consumer: usize,
    /// Elements a message holds at most.
    pub max_len: usize,
    /// Slots.
    pub depth: usize,
    /// Bytes of a slot: `max_len` elements, rounded up to `CHANNEL_SLOT_ALIGN`.
    pub slot_bytes: usize,
    /// Data bytes of an LL slot: the largest message, at most `CHANNEL_LL_MAX_BYTES`,
    /// rounded up to 8 (an LL slot takes twice as many).
    pub ll_bytes: usize,
}

impl ChannelLayout {
    /// The layout of a channel of `T` between PEs of a job of `n_pes`, or the error that says
    /// which argument is wrong.
    pub fn new<T: Element>(
        producer: usize,
        consumer: usize,
        n_pes: usize,
        max_len: usize,
        depth: usize,
    ) -> Result<Self> {
        for pe in [producer, consumer] {
            if pe >= n_pes {
                return Err(Error::PeOutOfRange { pe, n_pes });
            }
        }
        if max_len == 0 || depth == 0 {
            return Err(Error::InvalidArgument(format!(
                "a channel needs at least one slot of at least one element (max_len {max_len}, \
                 depth {depth})"
            )));
        }
        if depth > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "a channel of {depth} slots: at most {} are possible",
                u32::MAX
            )));
        }
        // A ready word carries a message's length in 31 bits (the 32nd says how it came), and
        // a kernel may push a whole slot.
        let most = CHANNEL_READY_LL as usize - CHANNEL_SLOT_ALIGN as usize;
        if max_len.saturating_mul(size_of::<T>()) > most {
            return Err(Error::InvalidArgument(format!(
                "a channel's messages of {max_len} elements of {} bytes: at most {most} bytes \
                 (send larger data in several messages)",
                size_of::<T>(),
            )));
        }
        let align = CHANNEL_SLOT_ALIGN as usize;
        let slot_bytes = max_len
            .checked_mul(size_of::<T>())
            .and_then(|b| b.checked_next_multiple_of(align))
            .filter(|b| b.checked_mul(depth).is_some())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a channel of {depth} slots of {max_len} elements of {} bytes does not fit \
                     in memory",
                    size_of::<T>()
                ))
            })?;
        let ll_bytes = (max_len * size_of::<T>())
            .min(CHANNEL_LL_MAX_BYTES as usize)
            .next_multiple_of(8);
        // The LL slots follow the slots.
        if (slot_bytes + 2 * ll_bytes).checked_mul(depth).is_none() {
            return Err(Error::InvalidArgument(format!(
                "a channel of {depth} slots of {max_len} elements of {} bytes does not fit in \
                 memory",
                size_of::<T>()
            )));
        }
        Ok(ChannelLayout {
            producer,
            consumer,
            max_len,
            depth,
            slot_bytes,
            ll_bytes,
        })
    }

    /// Bytes of symmetric memory the slots take on every PE: `depth` slots, then `depth` LL
    /// slots.
    pub fn slots_bytes(&self) -> usize {
        (self.slot_bytes + 2 * self.ll_bytes) * self.depth
    }

    /// A push rewrites its whole LL slot on one visit of the slot in this many: a line is then
    /// never older than 2^31 messages (`depth`, if more), and its tag (the low 32 bits of a
    /// message number) never the current message's.
    pub fn ll_clean_every(&self) -> u64 {
        ((1u64 << 31) / self.depth as u64).max(1)
    }

    /// Where the LL slots start in the slots' memory.
    pub fn ll_offset(&self) -> usize {
        self.slot_bytes * self.depth
    }

    /// Words of the control block: a ready word per slot, then the channel's counters.
    pub fn ctrl_words(&self) -> usize {
        self.depth + CHANNEL_WORDS as usize
    }

    /// A send of `len` elements from PE `me`.
    pub fn check_send(&self, me: usize, len: usize) -> Result<()> {
        if me != self.producer {
            return Err(Error::WrongPe {
                what: "Channel::send (the producer's end)",
                pe: me,
                expected: self.producer,
            });
        }
        if len > self.max_len {
            return Err(Error::InvalidArgument(format!(
                "a message of {len} elements is larger than the channel's slots of {} elements; \
                 split it, or make the channel with a larger max_len",
                self.max_len
            )));
        }
        Ok(())
    }

    /// A receive into `len` elements on PE `me`.
    pub fn check_recv(&self, me: usize, len: usize) -> Result<()> {
        if me != self.consumer {
            return Err(Error::WrongPe {
                what: "Channel::recv (the consumer's end)",
                pe: me,
                expected: self.consumer,
            });
        }
        if len < self.max_len {
            return Err(Error::Length {
                what: "the receive buffer must hold the channel's largest message (max_len)",
                expected: self.max_len,
                got: len,
            });
        }
        Ok(())
    }
}

/// The tag of message `seq` in a ready word: the low 32 bits of `seq + 1` (see
/// `nvshmem_rs_channel::ready` in kernels/include/nvshmem_rs/channel.h).
pub(crate) fn message_tag(seq: u64) -> u32 {
    seq.wrapping_add(1) as u32
}

/// The tag a ready word carries (its high 32 bits; the low 31 are the message's length, and
/// the 32nd is `CHANNEL_READY_LL`).
pub(crate) fn ready_tag(word: u64) -> u32 {
    (word >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// The word the producer writes for message `seq` of `bytes` bytes (channel.cuh's
    /// `ready_word`).
    fn ready_word(seq: u64, bytes: u32, ll: bool) -> u64 {
        let ll = if ll { CHANNEL_READY_LL } else { 0 };
        (u64::from(message_tag(seq)) << 32) | u64::from(bytes | ll)
    }

    #[test]
    fn a_ready_word_tells_its_message_from_the_one_a_round_before() {
        for depth in [1u64, 2, 7, u64::from(u32::MAX)] {
            for seq in [0u64, 1, 5, (1 << 32) - 2, (1 << 32) - 1, 1 << 32, 3 << 40] {
                let word = ready_word(seq, 100, seq % 2 == 0);
                assert_eq!(ready_tag(word), message_tag(seq));
                assert_eq!(word as u32 & !CHANNEL_READY_LL, 100);
                // What the slot held before: message seq - depth, or nothing (a zero word).
                let before = match seq.checked_sub(depth) {
                    Some(old) => ready_word(old, 8, old % 3 == 0),
                    None => 0,
                };
                assert_ne!(
                    ready_tag(before),
                    message_tag(seq),
                    "seq {seq} depth {depth}"
                );
            }
        }
    }

    #[test]
    fn slots_are_rounded_to_their_alignment() {
        let l = ChannelLayout::new::<bf16>(0, 1, 2, 3, 4).unwrap();
        assert_eq!((l.slot_bytes, l.ll_bytes), (16, 8));
        // 4 slots of 16 bytes, then 4 LL slots of one line.
        assert_eq!((l.slots_bytes(), l.ll_offset()), (128, 64));
        assert_eq!(l.ctrl_words(), 4 + CHANNEL_WORDS as usize);
        let l = ChannelLayout::new::<f32>(1, 1, 2, 1024, 2).unwrap();
        assert_eq!((l.slot_bytes, l.ll_bytes), (4096, 4096));
        assert_eq!(l.slots_bytes(), 2 * (4096 + 8192));
        let l = ChannelLayout::new::<f64>(0, 0, 1, 3, 1).unwrap();
        assert_eq!((l.slot_bytes, l.ll_bytes), (32, 24));
    }

    #[test]
    fn no_ll_line_grows_old_enough_for_its_tag_to_come_round() {
        // A line is rewritten at least once a period of visits of its slot (`every` × `depth`
        // messages). The first rewrite, at the period's last visit, comes before message
        // 2^32 - 1, whose tag (0) the zeroed slots hold: the same bound.
        for depth in [
            1usize,
            2,
            3,
            7,
            1000,
            (1 << 31) - 1,
            1 << 31,
            u32::MAX as usize,
        ] {
            let l = ChannelLayout::new::<u8>(0, 1, 2, 8, depth).unwrap();
            let every = l.ll_clean_every();
            assert!(every >= 1, "depth {depth}");
            let oldest = every * depth as u64;
            assert!(
                oldest < 1 << 32,
                "depth {depth}: lines up to {oldest} messages old"
            );
        }
        assert_eq!(
            ChannelLayout::new::<u8>(0, 1, 2, 8, 2)
                .unwrap()
                .ll_clean_every(),
            1 << 30
        );
    }

    #[test]
    fn ll_slots_hold_the_largest_small_message_in_lines_of_8_bytes() {
        // Larger messages go as they are: the LL slots stop at CHANNEL_LL_MAX_BYTES.
        let l = ChannelLayout::new::<u8>(0, 1, 2, 16 << 20, 2).unwrap();
        assert_eq!(l.ll_bytes, CHANNEL_LL_MAX_BYTES as usize);
        assert_eq!(l.ll_offset(), 2 * (16 << 20));
        assert_eq!(l.slots_bytes(), 2 * ((16 << 20) + 2 * 4096));
        for (len, ll) in [(1, 8), (8, 8), (9, 16), (4095, 4096), (4097, 4096)] {
            assert_eq!(
                ChannelLayout::new::<u8>(0, 1, 2, len, 3).unwrap().ll_bytes,
                ll
            );
        }
    }

    #[test]
    fn bad_shapes_and_pes_are_errors() {
        assert!(matches!(
            ChannelLayout::new::<f32>(2, 0, 2, 8, 2),
            Err(Error::PeOutOfRange { pe: 2, n_pes: 2 })
        ));
        assert!(matches!(
            ChannelLayout::new::<f32>(0, 5, 4, 8, 2),
            Err(Error::PeOutOfRange { pe: 5, n_pes: 4 })
        ));
        for (len, depth) in [(0, 2), (8, 0)] {
            let e = ChannelLayout::new::<f32>(0, 1, 2, len, depth).unwrap_err();
            assert!(e.to_string().contains("at least one slot"), "{e}");
        }
        // A ready word holds a message's length in 31 bits, and a slot's length too.
        let e = ChannelLayout::new::<f64>(0, 1, 2, usize::MAX / 4, 2).unwrap_err();
        assert!(e.to_string().contains("at most 2147483632 bytes"), "{e}");
        let e = ChannelLayout::new::<u8>(0, 1, 2, (1 << 31) - 15, 2).unwrap_err();
        assert!(e.to_string().contains("at most 2147483632 bytes"), "{e}");
        let l = ChannelLayout::new::<u8>(0, 1, 2, (1 << 31) - 16, 2).unwrap();
        assert!(l.slot_bytes < CHANNEL_READY_LL as usize);
    }

    #[test]
    fn each_end_is_used_from_its_pe_with_a_message_that_fits() {
        let l = ChannelLayout::new::<f32>(0, 1, 2, 100, 2).unwrap();
        l.check_send(0, 100).unwrap();
        l.check_send(0, 0).unwrap();
        let e = l.check_send(0, 101).unwrap_err();
        assert!(e.to_string().contains("101 elements is larger"), "{e}");
        assert!(matches!(
            l.check_send(1, 10),
            Err(Error::WrongPe {
                pe: 1,
                expected: 0,
                ..
            })
        ));
        l.check_recv(1, 100).unwrap();
        l.check_recv(1, 1000).unwrap();
        assert!(matches!(
            l.check_recv(1, 99),
            Err(Error::Length {
                expected: 100,
                got: 99,
                ..
            })
        ));
        assert!(matches!(
            l.check_recv(0, 100),
            Err(Error::WrongPe {
                pe: 0,
                expected: 1,
                ..
            })
        ));
        // A loopback channel has both ends on one PE.
        let l = ChannelLayout::new::<f32>(0, 0, 1, 4, 1).unwrap();
        l.check_send(0, 4).unwrap();
        l.check_recv(0, 4).unwrap();
    }

    #[test]
    fn small_messages_take_a_small_block() {
        assert_eq!(threads_for(0), 128);
        assert_eq!(threads_for(1024), 128);
        assert_eq!(threads_for(1025), 512);
        assert_eq!(threads_for(16 << 20), 512);
    }

    #[test]
    fn large_messages_spread_over_blocks() {
        assert_eq!(blocks_for(0), 1);
        assert_eq!(blocks_for(4096), 1);
        assert_eq!(blocks_for(SEND_BLOCK_BYTES), 1);
        assert_eq!(blocks_for(SEND_BLOCK_BYTES + 1), 2);
        assert_eq!(blocks_for(256 << 10), 8);
        assert_eq!(blocks_for(16 << 20), 64);
        assert_eq!(blocks_for(u64::MAX), 64);
    }
}
