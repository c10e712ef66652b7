//! The agreement of collective allocation, in every build: before each symmetric allocation
//! and free, every PE publishes what it is about to do (`[kind, sequence, bytes, alignment]`)
//! and whether its heap can take it, through the runtime's bounded exchange
//! (src/runtime/exchange.rs). A PE that differs is named in an error, and a refusal by any PE
//! is an error on every PE, instead of a hang, a corrupted heap or a job that NVSHMEM takes
//! down. It costs a few puts and host reads per allocation and free.
//!
//! A runtime service ([`Nvshmem::with_service`]): made on the first allocation, which every
//! PE makes at the same point, and freed before NVSHMEM is finalised.

use crate::error::{Error, HeapLimit, Result};
use crate::runtime::{DuringWait, Exchanged, Nvshmem, FINALIZE_KIND};

/// What a PE is about to do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum CheckKind {
    Alloc = 1,
    Free = 2,
    /// Not an allocation: the runtime's last exchange, before it finalises.
    Finalize = FINALIZE_KIND as isize,
    /// Not an allocation: the end of a collective constructor ([`SetUp`] in the record's
    /// bytes word), where every PE's symmetric memory must be ready before any PE writes to
    /// its peers.
    SetUp = 4,
}

/// The points where every PE waits for the others through the runtime's exchange, outside
/// allocation: the ends of collective constructors, and the host barriers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum SetUp {
    Collectives = 1,
    #[cfg_attr(not(feature = "tp"), allow(dead_code))]
    TpExchange = 2,
    PagePool = 3,
    /// The launch limits every PE's GPU allows, gathered by `Collectives::new`.
    CollectivesGrid = 4,
    /// `Nvshmem::barrier_all` and `sync_all`.
    BarrierAll = 5,
    SyncAll = 6,
    /// Every PE zeroed its copy of a `calloc` buffer.
    Zeroed = 7,
    SymmetricMap = 8,
    /// Every PE's team, gathered by `Collectives::with_team`.
    CollectivesTeam = 9,
    /// The feedback every PE's `GradientSync` keeps, gathered to size it alike.
    GradientSync = 10,
    /// Which members every PE reaches by loads and stores, gathered by `Collectives::new`.
    CollectivesReach = 11,
}

impl SetUp {
    fn name(code: u64) -> &'static str {
        match code {
            1 => "Collectives::new",
            2 => "a tensor-parallel layer's exchange",
            3 => "PagePool::new",
            4 => "Collectives::new's launch limits",
            5 => "a barrier_all",
            6 => "a sync_all",
            7 => "a calloc's zeroing",
            8 => "SymmetricMap::new",
            9 => "Collectives::with_team's teams",
            10 => "GradientSync::new",
            11 => "Collectives::new's reach",
            _ => "a constructor",
        }
    }
}

/// Why a PE cannot go through with what it proposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// An allocation its heap cannot take ([`super::heap::refusal`]).
    Heap(HeapLimit),
    /// A free whose wait for the GPU failed, with the driver's error code: a kernel may still
    /// use the buffer (a stream of the context being captured, a sticky error), so no PE
    /// frees it.
    GpuWait(u32),
}

/// What a PE publishes: what it is about to do (the words that must agree), then whether it
/// refuses it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Proposal {
    pub(crate) kind: CheckKind,
    /// The allocation's sequence number for a free; `None` for a new allocation.
    pub(crate) seq: Option<u64>,
    pub(crate) bytes: usize,
    pub(crate) align: usize,
    /// This PE's verdict.
    pub(crate) refused: Option<Refusal>,
    /// The bytes in use (an allocation), or the value the end of a constructor gathers.
    pub(crate) in_use: usize,
}

/// Where a record holds the value a constructor's end gathers.
pub(crate) const GATHERED_WORD: usize = 6;

/// Words each PE publishes: kind, sequence, bytes, alignment (these must agree), then the
/// refusal's code and value, the bytes in use, and where this PE's newest allocation sits
/// (which must agree too: [`PLACED_WORD`]; the runtime's records are `RECORD_WORDS` wide).
const WORDS: usize = crate::runtime::RECORD_WORDS;
/// The words every PE must publish alike.
const AGREED: usize = 4;
/// Where a record holds its PE's newest allocation: the offset from the runtime's first
/// symmetric allocation, plus one (0: none yet).
const PLACED_WORD: usize = 7;

fn encode(refusal: Option<Refusal>) -> [u64; 2] {
    match refusal {
        None => [0, 0],
        Some(Refusal::Heap(HeapLimit::SymmetricSize(v))) => [1, v as u64],
        Some(Refusal::Heap(HeapLimit::MaxMemoryPerGpu(v))) => [2, v as u64],
        Some(Refusal::Heap(HeapLimit::GpuMemory(v))) => [3, v as u64],
        Some(Refusal::GpuWait(code)) => [4, code as u64],
    }
}

fn decode(code: u64, value: u64) -> Option<Refusal> {
    let v = value as usize;
    match code {
        1 => Some(Refusal::Heap(HeapLimit::SymmetricSize(v))),
        2 => Some(Refusal::Heap(HeapLimit::MaxMemoryPerGpu(v))),
        3 => Some(Refusal::Heap(HeapLimit::GpuMemory(v))),
        4 => Some(Refusal::GpuWait(value as u32)),
        _ => None,
    }
}

/// The sequence of this PE's allocations, and where the newest sits in its heap.
pub(crate) struct AllocCheck {
    next_seq: u64,
    /// [`PLACED_WORD`] of this PE's records.
    placed: u64,
}

impl AllocCheck {
    /// A check from the first allocation on (every PE makes it at the same point).
    pub(crate) fn new(_shmem: &Nvshmem) -> Result<Self> {
        Ok(AllocCheck {
            next_seq: 0,
            placed: 0,
        })
    }

    /// The allocation just agreed landed `offset` bytes into this PE's heap (from the
    /// runtime's first allocation). Every PE's next record says so, and the PEs compare: the
    /// same calls on every PE place every buffer at the same offset, which is what makes a
    /// put to a peer's copy land in that copy.
    pub(crate) fn note_placed(&mut self, offset: u64) {
        self.placed = offset.wrapping_add(1);
    }

    /// Exchange what every PE is about to do; fail if they differ or if any PE's heap refuses.
    /// Returns the sequence number of the allocation (a new one for `Alloc`, the given one for
    /// `Free`).
    pub(crate) fn agree(&mut self, shmem: &Nvshmem, p: Proposal) -> Result<u64> {
        self.agree_all(shmem, p).map(|(seq, _)| seq)
    }

    /// [`agree`](Self::agree), with every PE's record (`WORDS` each, in PE order).
    pub(crate) fn agree_all(&mut self, shmem: &Nvshmem, p: Proposal) -> Result<(u64, Vec<u64>)> {
        let seq = p.seq.unwrap_or(self.next_seq);
        let [code, value] = encode(p.refused);
        let mine = [
            p.kind as u64,
            seq,
            p.bytes as u64,
            p.align as u64,
            code,
            value,
            p.in_use as u64,
            self.placed,
        ];
        crate::runtime::check_not_stranded()?;
        let _host = shmem.host_call()?;
        let noun = match p.kind {
            CheckKind::Alloc => "allocation",
            CheckKind::Free => "free of allocation",
            CheckKind::Finalize => "finalize",
            CheckKind::SetUp => SetUp::name(p.bytes as u64),
        };
        let described = match p.kind {
            CheckKind::SetUp => format!("the end of {noun}"),
            _ => format!("{noun} #{seq} of {} bytes", p.bytes),
        };
        let what = || format!("the agreement on {described}");
        // An allocation keeps the host library through the wait: its heap check's verdict
        // holds only while no other thread takes GPU memory (device allocations take the
        // lock too). A free, a constructor's end or finalize lets it go, so that this
        // process's other threads can launch and copy what a peer may be waiting for.
        let during_wait = match p.kind {
            CheckKind::Alloc => DuringWait::Keep,
            _ => DuringWait::LetGo,
        };
        let all = match shmem.exchange(&mine, shmem.wait_limit(), during_wait, what)? {
            Exchanged::All(all) => all,
            Exchanged::GaveUp(missing) => {
                return Err(Error::CollectiveMismatch(format!(
                    "{described}: PE {missing} did not reach it within {:?} \
                     (NVSHMEM_RS_TIMEOUT): a PE skipped a collective call (an allocation, a \
                     free, a constructor), or stopped; this process cannot go on",
                    shmem.wait_limit().unwrap_or_default()
                )));
            }
        };
        if let Some(msg) = describe_mismatch(shmem.my_pe(), &all) {
            return Err(Error::CollectiveMismatch(msg));
        }
        if let Some(msg) = describe_misplacement(shmem.my_pe(), &all) {
            // Every later put to a peer's copy may land in another buffer there.
            crate::runtime::strand(msg.clone());
            return Err(Error::CollectiveMismatch(msg));
        }
        if let Some(e) = first_refusal(&all) {
            return Err(e);
        }
        if p.kind == CheckKind::Alloc {
            self.next_seq += 1;
        }
        Ok((seq, all))
    }
}

/// The refusal of the lowest PE that refused, as every PE reports it.
fn first_refusal(all: &[u64]) -> Option<Error> {
    all.chunks(WORDS)
        .enumerate()
        .find_map(|(pe, r)| match decode(r[4], r[5])? {
            Refusal::Heap(limit) => Some(Error::HeapExhausted {
                requested: r[2] as usize,
                in_use: r[6] as usize,
                pe,
                limit,
            }),
            Refusal::GpuWait(code) => Some(Error::FreeRefused {
                pe,
                seq: r[1],
                bytes: r[2] as usize,
                driver_error: code,
            }),
        })
}

/// Compare where each PE's newest allocation sits; `None` when all agree.
fn describe_misplacement(my_pe: usize, all: &[u64]) -> Option<String> {
    let placed: Vec<u64> = all.chunks(WORDS).map(|r| r[PLACED_WORD]).collect();
    let pe = placed.iter().position(|&p| p != placed[0])?;
    let show = |p: u64| match p {
        0 => "nowhere (none yet)".to_string(),
        p => format!("at offset {:#x}", p - 1),
    };
    Some(format!(
        "the symmetric heaps are out of step: the newest allocation sits {} on PE 0 and {} on \
         PE {pe} (seen from PE {my_pe}), so a put to a peer's copy may land in another \
         buffer. Something allocated or freed symmetric memory on some PEs only (a direct \
         NVSHMEM call, say); this process cannot go on",
        show(placed[0]),
        show(placed[pe])
    ))
}

/// Compare what each PE published; `None` when all agree.
fn describe_mismatch(my_pe: usize, all: &[u64]) -> Option<String> {
    let records: Vec<&[u64]> = all.chunks(WORDS).map(|r| &r[..AGREED]).collect();
    let first = records.first()?;
    let pe = records.iter().position(|r| r != first)?;
    let show = |r: &[u64]| {
        let what = match r[0] {
            k if k == CheckKind::Alloc as u64 => "allocation",
            k if k == CheckKind::Finalize as u64 => return "its finalize".to_string(),
            k if k == CheckKind::SetUp as u64 => {
                return format!("the end of {}", SetUp::name(r[2]));
            }
            _ => "free of allocation",
        };
        let align = if r[3] != 0 {
            format!(", aligned to {}", r[3])
        } else {
            String::new()
        };
        format!("{what} #{} of {} bytes{align}", r[1], r[2])
    };
    Some(format!(
        "PE 0 is doing {} while PE {pe} is doing {} (seen from PE {my_pe}); every PE must \
         allocate and free symmetric buffers in the same order with the same sizes",
        show(first),
        show(records[pe])
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_by_any_pe_is_the_lowest_refusing_pe_s_error_everywhere() {
        let mut all = vec![1, 0, 4096, 0, 0, 0, 64, 0];
        all.extend([1, 0, 4096, 0, 3, 1 << 20, 128, 0]);
        all.extend([1, 0, 4096, 0, 1, 1 << 30, 256, 0]);
        assert_eq!(describe_mismatch(0, &all), None);
        match first_refusal(&all) {
            Some(Error::HeapExhausted {
                requested: 4096,
                in_use: 128,
                pe: 1,
                limit: HeapLimit::GpuMemory(1048576),
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(first_refusal(&all[..WORDS]).is_none());
        for limit in [
            HeapLimit::SymmetricSize(7),
            HeapLimit::MaxMemoryPerGpu(8),
            HeapLimit::GpuMemory(9),
        ] {
            let [c, v] = encode(Some(Refusal::Heap(limit)));
            assert_eq!(decode(c, v), Some(Refusal::Heap(limit)));
        }
        let [c, v] = encode(Some(Refusal::GpuWait(900)));
        assert_eq!(decode(c, v), Some(Refusal::GpuWait(900)));
        assert_eq!(decode(0, 0), None);
    }

    #[test]
    fn a_free_that_one_pe_cannot_make_is_refused_on_every_pe() {
        // PE 1's wait for its GPU failed (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900): every
        // PE reads the same records, so every PE returns the same refusal and none frees.
        let [c, v] = encode(Some(Refusal::GpuWait(900)));
        let all = [2, 7, 4096, 0, 0, 0, 0, 0, 2, 7, 4096, 0, c, v, 0, 0];
        assert_eq!(describe_mismatch(0, &all), None);
        match first_refusal(&all) {
            Some(Error::FreeRefused {
                pe: 1,
                seq: 7,
                bytes: 4096,
                driver_error: 900,
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn agreeing_pes_pass_the_allocation_check() {
        let all = [
            1, 3, 4096, 0, 0, 0, 0, 0, 1, 3, 4096, 0, 0, 0, 0, 0, 1, 3, 4096, 0, 0, 0, 0, 0,
        ];
        assert_eq!(describe_mismatch(0, &all), None);
    }

    #[test]
    fn a_pe_allocating_another_size_is_named() {
        let all = [
            1, 3, 4096, 0, 0, 0, 0, 0, 1, 3, 4096, 0, 0, 0, 0, 0, 1, 3, 8192, 0, 0, 0, 0, 0,
        ];
        let msg = describe_mismatch(1, &all).unwrap();
        assert!(
            msg.contains("PE 2 is doing allocation #3 of 8192 bytes"),
            "{msg}"
        );
        assert!(
            msg.contains("PE 0 is doing allocation #3 of 4096 bytes"),
            "{msg}"
        );
    }

    #[test]
    fn heaps_out_of_step_are_named() {
        let at = |placed| [1, 3, 4096, 0, 0, 0, 0, placed];
        let same: Vec<u64> = [at(0x101), at(0x101), at(0x101)].concat();
        assert_eq!(describe_misplacement(0, &same), None);
        let apart: Vec<u64> = [at(0x101), at(0x101), at(0x201)].concat();
        let msg = describe_misplacement(1, &apart).unwrap();
        assert!(
            msg.contains("at offset 0x100 on PE 0 and at offset 0x200 on PE 2 (seen from PE 1)"),
            "{msg}"
        );
        let first: Vec<u64> = [at(0), at(0x41)].concat();
        let msg = describe_misplacement(0, &first).unwrap();
        assert!(msg.contains("sits nowhere (none yet) on PE 0"), "{msg}");
    }

    #[test]
    fn a_pe_freeing_out_of_order_is_named() {
        let all = [2, 0, 64, 0, 0, 0, 0, 0, 2, 1, 128, 0, 0, 0, 0, 0];
        let msg = describe_mismatch(0, &all).unwrap();
        assert!(msg.contains("free of allocation #1 of 128 bytes"), "{msg}");
    }

    #[test]
    fn a_pe_allocating_while_another_frees_is_named() {
        let all = [1, 5, 64, 0, 0, 0, 0, 0, 2, 4, 64, 0, 0, 0, 0, 0];
        assert!(describe_mismatch(0, &all)
            .unwrap()
            .contains("PE 1 is doing free of allocation #4"));
    }

    #[test]
    fn a_pe_ending_another_constructor_is_named() {
        let (k, c, p) = (
            CheckKind::SetUp as u64,
            SetUp::Collectives as u64,
            SetUp::PagePool as u64,
        );
        let all = [k, 0, c, 0, 0, 0, 0, 0, k, 0, p, 0, 0, 0, 0, 0];
        let msg = describe_mismatch(1, &all).unwrap();
        assert!(
            msg.contains(
                "PE 0 is doing the end of Collectives::new while PE 1 is doing the end of \
                 PagePool::new"
            ),
            "{msg}"
        );
        let same = [k, 0, c, 0, 0, 0, 0, 0, k, 0, c, 0, 0, 0, 0, 0];
        assert!(describe_mismatch(0, &same).is_none());
    }

    #[test]
    fn a_pe_finalizing_while_another_frees_is_named() {
        let all = [2, 4, 64, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0];
        let msg = describe_mismatch(0, &all).unwrap();
        assert!(
            msg.contains(
                "PE 0 is doing free of allocation #4 of 64 bytes while PE 1 is doing its finalize"
            ),
            "{msg}"
        );
        let done = [3, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0];
        assert!(describe_mismatch(1, &done).is_none());
    }
}
