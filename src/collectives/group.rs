//! The grouped all-reduce: many buffers reduced by one launch, as NCCL users group calls
//! between `ncclGroupStart` and `ncclGroupEnd`.
//!
//! Small buffers (a model's gradient buckets, the layers' norms and biases) each cost a
//! launch and a handshake when all-reduced one by one, more than moving their bytes. A
//! group puts up to [`GROUP_MAX`] of them in one kernel: one-shot (every input pushed into
//! each peer's staging slot end to end, one handshake, each PE reduces) or two-shot
//! (each PE reduces its part of every buffer from every PE's source, between two barriers).

use super::agree::{Collective, Record};
use super::algo::{self, AllReduceAlgo, ALL_REDUCE_ROWS};
use super::plan::all_reduce_plan;
use super::{check_overlap, Collectives, Launch, Planned, Work};
use crate::abi;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::{check_len, SymmetricView};
use crate::module::{grid, Function, KernelArgs, Module};
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// The buffers one launch of a grouped all-reduce takes; a longer group takes several.
pub const GROUP_MAX: usize = abi::COLL_GROUP_MAX as usize;

/// The group kernels' algorithms, in their table's order.
const ALGOS: [AllReduceAlgo; 2] = [AllReduceAlgo::OneShot, AllReduceAlgo::TwoShot];

/// The entry points of the grouped all-reduce: `oneshot_allreduce_group_f32_sum`.
pub(super) fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for a in ALGOS {
        for t in 0..algo::TYPES.len() {
            for o in 0..algo::OPS.len() {
                names.push(kernel_name(a, t, o));
            }
        }
    }
    names
}

fn kernel_name(a: AllReduceAlgo, t: usize, o: usize) -> String {
    format!(
        "{}_allreduce_group_{}_{}",
        row_of(a).kernel,
        algo::TYPES[t].1,
        algo::OPS[o].1
    )
}

fn row_of(a: AllReduceAlgo) -> &'static algo::Row<AllReduceAlgo> {
    ALL_REDUCE_ROWS
        .iter()
        .find(|r| r.algo == a)
        .expect("one-shot and two-shot have rows")
}

/// The group kernels by algorithm, type and operator.
pub(super) struct GroupKernels(Vec<Function>);

impl GroupKernels {
    pub(super) fn load(module: &Module) -> Result<Self> {
        kernel_names()
            .iter()
            .map(|n| module.function(n))
            .collect::<Result<Vec<_>>>()
            .map(GroupKernels)
    }

    fn get(&self, a: AllReduceAlgo, t: usize, o: usize) -> &Function {
        let a = ALGOS
            .iter()
            .position(|&x| x == a)
            .expect("a group algorithm");
        &self.0[(a * algo::TYPES.len() + t) * algo::OPS.len() + o]
    }
}

/// How a group's buffers are launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Batch {
    /// Buffers (their indices) in one launch of the group kernel of `algo`, each at its
    /// offset in the staging slot (one-shot).
    Group {
        algo: AllReduceAlgo,
        members: Vec<usize>,
        offsets: Vec<usize>,
    },
    /// A buffer above the two-shot's limit: an all-reduce of its own (`Auto`).
    Single(usize),
}

/// Where `Auto` sends a group's buffers: the limits of the one-shot and two-shot all-reduce
/// (`Thresholds::oneshot_max_bytes`, `twoshot_max_bytes`) and the staging slot, in bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) oneshot: usize,
    pub(super) twoshot: usize,
    pub(super) slot: usize,
}

/// The launches of a group of buffers of `bytes` each (per PE). `Auto`: a group whose
/// buffers all fit one one-shot all-reduce together goes one-shot; any other takes the
/// two-shot, except each buffer above the two-shot's limit, which gets an all-reduce of its
/// own (after the groups). `OneShot` packs every buffer into the staging slot (one larger
/// is an `Err`); `TwoShot` takes any. Each launch holds up to [`GROUP_MAX`] buffers. Empty
/// buffers are left out. The same on every PE for the same lengths.
pub(super) fn batches(bytes: &[usize], algo: AllReduceAlgo, limits: Limits) -> Result<Vec<Batch>> {
    let staged = |b: usize| b.div_ceil(16) * 16;
    let all: usize = bytes.iter().map(|&b| staged(b)).sum();
    let (kind, room, own_above) = match algo {
        AllReduceAlgo::Auto if all <= limits.oneshot.min(limits.slot) => {
            (AllReduceAlgo::OneShot, limits.slot, usize::MAX)
        }
        AllReduceAlgo::Auto => (AllReduceAlgo::TwoShot, usize::MAX, limits.twoshot),
        AllReduceAlgo::OneShot => (AllReduceAlgo::OneShot, limits.slot, usize::MAX),
        AllReduceAlgo::TwoShot => (AllReduceAlgo::TwoShot, usize::MAX, usize::MAX),
        a => {
            return Err(Error::InvalidArgument(format!(
                "a grouped all-reduce takes Auto, OneShot or TwoShot, not {a}"
            )))
        }
    };
    let slot = limits.slot;
    let (mut out, mut singles) = (Vec::new(), Vec::new());
    let (mut members, mut offsets, mut used) = (Vec::new(), Vec::new(), 0usize);
    for (k, &b) in bytes.iter().enumerate() {
        if b == 0 {
            continue;
        }
        let staged = staged(b);
        if b > own_above {
            singles.push(Batch::Single(k));
            continue;
        }
        if kind == AllReduceAlgo::OneShot && staged > room {
            return Err(Error::InvalidArgument(format!(
                "buffer {k} of the OneShot group ({b} bytes) exceeds the staging slot \
                 ({slot} bytes): use Auto (it takes the two-shot for larger groups), or a \
                 larger CollectivesConfig::workspace"
            )));
        }
        let full =
            members.len() == GROUP_MAX || (kind == AllReduceAlgo::OneShot && used + staged > room);
        if full {
            out.push(Batch::Group {
                algo: kind,
                members: std::mem::take(&mut members),
                offsets: std::mem::take(&mut offsets),
            });
            used = 0;
        }
        members.push(k);
        offsets.push(if kind == AllReduceAlgo::OneShot {
            used
        } else {
            0
        });
        used += staged;
    }
    if !members.is_empty() {
        out.push(Batch::Group {
            algo: kind,
            members,
            offsets,
        });
    }
    out.extend(singles);
    Ok(out)
}

/// A hash of a group's buffers (where each sits, and its length), for the call records:
/// PEs that pass different groups disagree on their first call.
fn fold(parts: impl Iterator<Item = (i64, usize)>) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (at, len) in parts {
        for x in [at as u64, len as u64] {
            h = (h ^ x).wrapping_mul(0x0000_0100_0000_01b3);
            h ^= h >> 29;
        }
    }
    h as i64
}

impl Collectives {
    /// `dst[k][i] = op over PEs of src[k][i]` for every buffer `k`: the all-reduce of each
    /// pair, with small buffers reduced together, up to [`GROUP_MAX`] per launch.
    ///
    /// Takes the types and operators of [`all_reduce`](Self::all_reduce). `dst[k]` and
    /// `src[k]` have the same length (any, per `k`) and may be the same buffer; no buffer
    /// may otherwise overlap another's destination. Every PE passes the same lengths in the
    /// same order. `Auto` takes the one-shot when every buffer fits one one-shot all-reduce
    /// together, the two-shot otherwise, and gives each buffer above the two-shot's limit
    /// (`Thresholds::twoshot_max_bytes`) an all-reduce of its own. `OneShot` and `TwoShot`
    /// put every buffer in launches of that algorithm. Each launch is one call (agreed, in
    /// order, capturable in a CUDA graph).
    ///
    /// ```no_run
    /// # fn main() -> nvshmem::Result<()> {
    /// use nvshmem::{AllReduceAlgo, Collectives, ReduceOp};
    /// let shmem = nvshmem::Nvshmem::init()?;
    /// let coll = Collectives::new(&shmem)?;
    /// let grads = shmem.malloc::<f32>(3 * 4096)?;
    /// let bias = shmem.malloc::<f32>(96)?;
    /// let views = [grads.view(..4096), grads.view(4096..), bias.view(..)];
    /// coll.all_reduce_group(&views, &views, ReduceOp::Sum, AllReduceAlgo::Auto, shmem.stream())?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_group<'a, T: Element>(
        &self,
        dst: &[SymmetricView<'a, T>],
        src: &[SymmetricView<'a, T>],
        op: ReduceOp,
        algo: AllReduceAlgo,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let planned = self
            .check()
            .and_then(|()| self.plan_group(dst, src, op, algo));
        let (batches, (t, o)) = match planned {
            Ok(p) => p,
            // Said to the other PEs too, so that none waits for this one's first call.
            Err(e) => return self.call(|| Err(e), stream),
        };
        let (dst_hash, src_hash) = (self.group_fold(dst), self.group_fold(src));
        for batch in batches {
            match batch {
                Batch::Single(k) => {
                    self.all_reduce(dst[k], src[k], op, AllReduceAlgo::Auto, stream)?
                }
                Batch::Group {
                    algo,
                    members,
                    offsets,
                } => {
                    let plan = || {
                        let mut group = abi::Group {
                            entry: [abi::GroupEntry::default(); GROUP_MAX],
                            count: members.len() as u32,
                        };
                        let (mut before, mut len, mut bytes) = (0usize, 0usize, 0usize);
                        for (slot, (&k, &off)) in members.iter().zip(&offsets).enumerate() {
                            group.entry[slot] = abi::GroupEntry {
                                src: src[k].as_ptr() as u64,
                                dst: dst[k].as_ptr() as u64,
                                n: src[k].len() as u64,
                                off: off as u64,
                                before: before as u64,
                            };
                            before += src[k].num_bytes() / 16;
                            len += src[k].len();
                            bytes += src[k].num_bytes().div_ceil(16) * 16;
                        }
                        let row = ALL_REDUCE_ROWS
                            .iter()
                            .position(|r| r.algo == algo)
                            .expect("a row");
                        let record = Record::Call {
                            collective: Collective::AllReduceGroup,
                            dtype: T::DTYPE,
                            op: Some(op),
                            row,
                            len,
                            dst: dst_hash,
                            src: src_hash,
                            root: Some(members.len()),
                        };
                        let p = all_reduce_plan(algo, bytes, &self.dims);
                        let mut args = KernelArgs::new();
                        args.value(group)
                            .device_ptr(self.ctrl.addr())
                            .device_ptr(self.flags.addr())
                            .device_ptr(self.staging.addr())
                            .value(self.dims.staging_slot_bytes);
                        Ok(Planned {
                            record,
                            launch: Some(Work::Kernel(Launch {
                                function: self.group.get(algo, t, o),
                                grid: grid(p.blocks, p.threads),
                                args,
                            })),
                        })
                    };
                    self.call(plan, stream)?;
                }
            }
        }
        Ok(())
    }

    /// Check a group on this PE, and plan its launches.
    #[allow(clippy::type_complexity)]
    fn plan_group<T: Element>(
        &self,
        dst: &[SymmetricView<'_, T>],
        src: &[SymmetricView<'_, T>],
        op: ReduceOp,
        algo: AllReduceAlgo,
    ) -> Result<(Vec<Batch>, (usize, usize))> {
        let to = algo::type_and_op::<T>(op, "grouped all-reduce", "all_reduce")?;
        check_len(
            "all_reduce_group destinations (one per source)",
            src.len(),
            dst.len(),
        )?;
        for (d, s) in dst.iter().zip(src) {
            self.check_view(s, "an all_reduce_group source")?;
            self.check_view(d, "an all_reduce_group destination")?;
            check_len("all_reduce_group destination", s.len(), d.len())?;
        }
        for (k, d) in dst.iter().enumerate() {
            for (j, s) in src.iter().enumerate() {
                check_overlap(
                    "all_reduce_group (a destination and a source)",
                    d,
                    s,
                    k == j,
                )?;
            }
            for e in &dst[k + 1..] {
                check_overlap("all_reduce_group (two destinations)", d, e, false)?;
            }
        }
        let bytes: Vec<usize> = src.iter().map(|s| s.num_bytes()).collect();
        let limits = Limits {
            oneshot: self.thresholds.oneshot_max_bytes,
            twoshot: self.thresholds.twoshot_max_bytes,
            slot: self.dims.staging_slot_bytes,
        };
        Ok((batches(&bytes, algo, limits)?, to))
    }

    /// [`fold`] of a group's buffers, named by where they sit in the symmetric heap.
    fn group_fold<T: Element>(&self, views: &[SymmetricView<'_, T>]) -> i64 {
        let base = self.ctrl.addr();
        fold(
            views
                .iter()
                .map(|v| ((v.as_ptr() as u64).wrapping_sub(base) as i64, v.len())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(b: &Batch) -> Vec<usize> {
        match b {
            Batch::Group { members, .. } => members.clone(),
            Batch::Single(k) => vec![*k],
        }
    }

    fn limits(oneshot: usize, twoshot: usize, slot: usize) -> Limits {
        Limits {
            oneshot,
            twoshot,
            slot,
        }
    }

    #[test]
    fn auto_goes_one_shot_when_the_group_fits_and_two_shot_otherwise() {
        // 100, 40 and 600 bytes stage as 112 + 48 + 608 = 768: one one-shot launch, each at
        // its place in the slot; the empty buffer nowhere.
        let b = batches(
            &[100, 0, 40, 600],
            AllReduceAlgo::Auto,
            limits(1 << 10, 1 << 20, 4 << 20),
        );
        let one_shot = Batch::Group {
            algo: AllReduceAlgo::OneShot,
            members: vec![0, 2, 3],
            offsets: vec![0, 112, 160],
        };
        assert_eq!(b.unwrap(), vec![one_shot]);
        // More than the one-shot takes: the two-shot, and a buffer above its limit alone,
        // after the group.
        let bytes = [100, 0, 1 << 20, 40, 600, 2 << 20];
        let b = batches(
            &bytes,
            AllReduceAlgo::Auto,
            limits(1 << 10, 1 << 20, 4 << 20),
        );
        assert_eq!(
            b.unwrap(),
            vec![
                Batch::Group {
                    algo: AllReduceAlgo::TwoShot,
                    members: vec![0, 2, 3, 4],
                    offsets: vec![0; 4],
                },
                Batch::Single(5),
            ]
        );
    }

    #[test]
    fn launches_hold_at_most_group_max_buffers_and_their_room() {
        let bytes = vec![16; 2 * GROUP_MAX + 3];
        let b = batches(&bytes, AllReduceAlgo::TwoShot, limits(0, 0, 0)).unwrap();
        let sizes: Vec<usize> = b.iter().map(|b| members(b).len()).collect();
        assert_eq!(sizes, [GROUP_MAX, GROUP_MAX, 3]);
        // Room for 3 buffers of 48 bytes per launch.
        let b = batches(&[48; 7], AllReduceAlgo::OneShot, limits(0, 0, 150)).unwrap();
        let all: Vec<Vec<usize>> = b.iter().map(members).collect();
        assert_eq!(all, [vec![0, 1, 2], vec![3, 4, 5], vec![6]]);
        // Every buffer once, in order.
        let flat: Vec<usize> = all.concat();
        assert_eq!(flat, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn what_a_group_cannot_take_is_an_err() {
        let e = batches(&[64, 4096], AllReduceAlgo::OneShot, limits(0, 0, 1024)).unwrap_err();
        assert!(e.to_string().contains("buffer 1"), "{e}");
        let e = batches(&[64], AllReduceAlgo::LowLatency, limits(0, 0, 1024)).unwrap_err();
        assert!(e.to_string().contains("Auto, OneShot or TwoShot"), "{e}");
    }

    #[test]
    fn folds_tell_groups_apart() {
        let a = fold([(0, 10), (64, 20)].into_iter());
        assert_ne!(a, fold([(0, 10), (64, 21)].into_iter()));
        assert_ne!(a, fold([(64, 20), (0, 10)].into_iter()));
        assert_ne!(a, fold([(0, 10)].into_iter()));
    }

    #[test]
    fn every_entry_point_is_named_once() {
        let names = kernel_names();
        assert_eq!(names.len(), 2 * 4 * 3);
        assert!(names.contains(&"twoshot_allreduce_group_bf16_max".to_string()));
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
    }
}
