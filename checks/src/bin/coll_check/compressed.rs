//! The compressed all-reduce: every format, f32 and bf16 data, odd lengths, in place, with
//! error feedback over several calls and in a replayed graph, against the CPU model bit for
//! bit (`nvshmem::collectives::compressed::model`) and against the exact sum within the
//! model's bound, element by element; and the calls it must refuse.

use nvshmem::collectives::compressed::{model, Modelled};
use nvshmem::collectives::{CollectivesConfig, Compression};
use nvshmem::{bf16, Collectives, Element, Error, Nvshmem, Result};
use nvshmem_checks::graph::capture;

use crate::harness::{cuda, expect_err, sync, Checker};
use crate::reference::Rng;

pub(crate) const FORMATS: [Compression; 4] = [
    Compression::Fp16,
    Compression::Bf16,
    Compression::Int8 { block: 128 },
    Compression::Fp8E4M3 { block: 32 },
];

/// The largest call of these checks.
pub(crate) const MAX_LEN: usize = (1 << 20) + 3;

/// An element type the compressed all-reduce takes, as the model sees it.
pub(crate) trait Gradient: Element {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    /// What rounding the output to this type adds to the bound.
    fn output_loss(v: f32) -> f64;
}

impl Gradient for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn output_loss(_: f32) -> f64 {
        0.0
    }
}

impl Gradient for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn output_loss(v: f32) -> f64 {
        2f64.powi(-8) * (v as f64).abs()
    }
}

/// Every PE's input of case `seed`: blocks of very different magnitudes, so that the block
/// scales matter.
fn gradients<T: Gradient>(seed: u64, n_pes: usize, len: usize) -> Vec<Vec<T>> {
    (0..n_pes)
        .map(|pe| {
            let mut rng = Rng::new(seed, pe);
            (0..len)
                .map(|i| {
                    let magnitude = [1e-3, 0.5, 4.0, 300.0][(i / 97 + pe) % 4];
                    T::from_f32(rng.unit() * magnitude)
                })
                .collect()
        })
        .collect()
}

fn as_f32<T: Gradient>(all: &[Vec<T>]) -> Vec<Vec<f32>> {
    all.iter()
        .map(|x| x.iter().map(|v| v.to_f32()).collect())
        .collect()
}

/// `got` must be the model's output bit for bit (NaN for NaN), and within its bound of the
/// exact sum.
fn compare<T: Gradient>(what: &str, got: &[T], m: &Modelled) -> Result<()> {
    let want: Vec<T> = m.out.iter().map(|&v| T::from_f32(v)).collect();
    let same = |a: T, b: T| {
        a.to_f32().to_bits() == b.to_f32().to_bits() || (a.to_f32().is_nan() && b.to_f32().is_nan())
    };
    if let Some(i) = (0..want.len()).find(|&i| !same(got[i], want[i])) {
        let wrong = (0..want.len()).filter(|&i| !same(got[i], want[i])).count();
        return Err(Error::InvalidArgument(format!(
            "{what}: {wrong} of {} elements differ from the model, first at {i}: got {}, want {}",
            want.len(),
            got[i].to_f32(),
            want[i].to_f32()
        )));
    }
    for (i, g) in got.iter().enumerate().take(want.len()) {
        let (y, bound) = (g.to_f32(), m.bound[i] + T::output_loss(m.out[i]));
        let err = (y as f64 - m.exact[i]).abs();
        if y.is_finite() && err > bound {
            return Err(Error::InvalidArgument(format!(
                "{what}: element {i} is {y}, {err:e} from the exact sum {}, over its bound \
                 {bound:e}",
                m.exact[i]
            )));
        }
    }
    Ok(())
}

/// One call of `len` elements: out of place (or in place), checked.
pub(crate) fn call<T: Gradient>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    c: Compression,
    len: usize,
    in_place: bool,
    poison: Option<usize>,
) -> Result<()> {
    let mut all = gradients::<T>(seed, shmem.n_pes(), len);
    if let Some(i) = poison {
        all[shmem.n_pes() - 1][i] = T::from_f32(f32::INFINITY);
    }
    let src = shmem.alloc_device::<T>(len)?;
    src.copy_from_host(&all[shmem.my_pe()])?;
    let dst = match in_place {
        true => None,
        false => Some(shmem.alloc_device::<T>(len)?),
    };
    let out = dst.as_ref().unwrap_or(&src);
    coll.all_reduce_compressed(out, &src, c, None, shmem.stream())?;
    sync(shmem)?;
    compare(
        &format!("{c}, {len}"),
        &out.to_vec()?,
        &model(c, &as_f32(&all), None),
    )
}

/// `calls` calls with error feedback, then a graph of two such calls replayed `replays`
/// times: outputs and feedback against the model's after each step.
fn with_feedback<T: Gradient>(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    c: Compression,
    len: usize,
    (calls, replays): (usize, usize),
) -> Result<()> {
    let (me, n) = (shmem.my_pe(), shmem.n_pes());
    let all = gradients::<T>(seed, n, len);
    let inputs = as_f32(&all);
    let src = shmem.alloc_device::<T>(len)?;
    src.copy_from_host(&all[me])?;
    let dst = shmem.alloc_device::<T>(len)?;
    let mut fb = shmem.alloc_device::<f32>(c.feedback_len(len, n))?;
    fb.copy_from_host(&vec![0.0; fb.len()])?;
    let mut carried = vec![vec![0f32; c.feedback_len(len, n)]; n];
    let check = |step: &str, got: &[T], fb: &[f32], m: &Modelled, carried: &[Vec<f32>]| {
        compare(&format!("{c}, {len}, {step}"), got, m)?;
        match (0..fb.len()).find(|&i| fb[i].to_bits() != carried[me][i].to_bits()) {
            Some(i) => Err(Error::InvalidArgument(format!(
                "{c}, {len}, {step}: feedback element {i} is {}, the model's {}",
                fb[i], carried[me][i]
            ))),
            None => Ok(()),
        }
    };
    for k in 0..calls {
        coll.all_reduce_compressed(&dst, &src, c, Some(&mut fb), shmem.stream())?;
        sync(shmem)?;
        let m = model(c, &inputs, Some(&mut carried));
        check(
            &format!("call {k}"),
            &dst.to_vec()?,
            &fb.to_vec()?,
            &m,
            &carried,
        )?;
    }
    let stream = shmem.new_stream()?;
    let graph = capture(&stream, || {
        coll.all_reduce_compressed(&dst, &src, c, Some(&mut fb), &stream)?;
        coll.all_reduce_compressed(&dst, &src, c, Some(&mut fb), &stream)
    })?;
    let mut m = None;
    for _ in 0..replays {
        cuda("cuGraphLaunch", graph.launch())?;
        for _ in 0..2 {
            m = Some(model(c, &inputs, Some(&mut carried)));
        }
    }
    cuda("cuStreamSynchronize", stream.synchronize())?;
    let m = m.expect("at least one replay");
    check("graph replays", &dst.to_vec()?, &fb.to_vec()?, &m, &carried)
}

/// What the compressed all-reduce refuses, on every PE alike.
fn refusals(shmem: &Nvshmem, coll: &Collectives, plain: &Collectives) -> Result<()> {
    let n = shmem.n_pes();
    let x = shmem.alloc_device::<f32>(1000)?;
    let s = shmem.stream();
    let invalid = |e: &Error| matches!(e, Error::InvalidArgument(_));
    expect_err(
        plain.all_reduce_compressed(&x, &x, Compression::Fp16, None, s),
        "a compressed call with no compressed workspace",
        invalid,
    )?;
    let big = shmem.alloc_device::<f32>(MAX_LEN * 2)?;
    expect_err(
        coll.all_reduce_compressed(&big, &big, Compression::Fp16, None, s),
        "a call larger than the workspace",
        invalid,
    )?;
    expect_err(
        coll.all_reduce_compressed(&x, &x, Compression::Int8 { block: 0 }, None, s),
        "a block of 0",
        invalid,
    )?;
    let h = shmem.alloc_device::<bf16>(1000)?;
    expect_err(
        coll.all_reduce_compressed(&h, &h, Compression::Bf16, None, s),
        "bf16 data in bf16",
        invalid,
    )?;
    let i = shmem.alloc_device::<i32>(1000)?;
    expect_err(
        coll.all_reduce_compressed(&i, &i, Compression::Fp16, None, s),
        "i32 data",
        |e| matches!(e, Error::TypeMismatch { .. }),
    )?;
    let mut short = shmem.alloc_device::<f32>(1000)?;
    expect_err(
        coll.all_reduce_compressed(&x, &x, Compression::Fp16, Some(&mut short), s),
        "feedback of the input's length only",
        |e| matches!(e, Error::Length { .. }),
    )?;
    let y = shmem.alloc_device::<f32>(999)?;
    expect_err(
        coll.all_reduce_compressed(&y, &x, Compression::Fp16, None, s),
        "an output of another length",
        |e| matches!(e, Error::Length { .. }),
    )?;
    // Still sound: a call after the refusals.
    call::<f32>(
        shmem,
        coll,
        99,
        Compression::Int8 { block: 64 },
        4096 * n + 5,
        false,
        None,
    )
}

/// A `Collectives` (collective) whose workspace holds compressed calls of `bytes`
/// ([`Compression::workspace_bytes`]).
pub(crate) fn with_compressed_bytes(shmem: &Nvshmem, bytes: usize) -> Result<Collectives> {
    let mut config = CollectivesConfig::for_pes(shmem.n_pes());
    config.workspace.compressed_bytes = bytes;
    Collectives::with_config(shmem, config)
}

/// A `Collectives` with room for every format of [`FORMATS`] up to [`MAX_LEN`] elements.
pub(crate) fn with_room(shmem: &Nvshmem) -> Result<Collectives> {
    let n = shmem.n_pes();
    let bytes = FORMATS.iter().map(|f| f.workspace_bytes(MAX_LEN, n)).max();
    with_compressed_bytes(shmem, bytes.unwrap_or(0))
}

pub(crate) fn checks(c: &mut Checker, plain: &Collectives) {
    let shmem = c.shmem.clone();
    let n = shmem.n_pes();
    let coll = match with_room(&shmem) {
        Ok(coll) => coll,
        Err(e) => {
            c.check(
                "compressed: a Collectives with a compressed workspace",
                |_, _| Err(e),
            );
            return;
        }
    };
    for f in FORMATS {
        for len in [1, 5, 1001, 4099 * n + 7, MAX_LEN] {
            c.check(&format!("compressed {f} f32, {len}"), |s, seed| {
                call::<f32>(s, &coll, seed, f, len, false, None)
            });
            if f != Compression::Bf16 {
                c.check(&format!("compressed {f} bf16, {len}"), |s, seed| {
                    call::<bf16>(s, &coll, seed, f, len, len % 2 == 1, None)
                });
            }
        }
        c.check(&format!("compressed {f} f32 in place"), |s, seed| {
            call::<f32>(s, &coll, seed, f, 30_011, true, None)
        });
        c.check(
            &format!("compressed {f}, error feedback and graph"),
            |s, seed| with_feedback::<f32>(s, &coll, seed, f, 20_003, (3, 2)),
        );
    }
    c.check(
        "compressed int8 bf16, error feedback and graph",
        |s, seed| {
            with_feedback::<bf16>(
                s,
                &coll,
                seed,
                Compression::Int8 { block: 256 },
                9_001,
                (2, 2),
            )
        },
    );
    for f in [
        Compression::Int8 { block: 8 },
        Compression::Fp8E4M3 { block: 8 },
    ] {
        c.check(
            &format!("compressed {f}, an infinite input spoils its block"),
            |s, seed| call::<f32>(s, &coll, seed, f, 1000, false, Some(13)),
        );
    }
    c.check("compressed: refused calls", |s, _| {
        refusals(s, &coll, plain)
    });
}
