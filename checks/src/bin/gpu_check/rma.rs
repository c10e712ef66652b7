//! Put and get.

use crate::data::*;
use crate::harness::*;
use crate::Result;
use nvshmem::{bf16, f16};

#[derive(Clone, Copy, Debug)]
enum Mode {
    Blocking,
    Nbi,
    OnStream,
    NbiOnStream,
}

const MODES: [Mode; 4] = [Mode::Blocking, Mode::Nbi, Mode::OnStream, Mode::NbiOnStream];

fn put_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Blocking => "put",
        Mode::Nbi => "put_nbi",
        Mode::OnStream => "put_on_stream",
        Mode::NbiOnStream => "put_nbi_on_stream",
    }
}

fn get_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Blocking => "get",
        Mode::Nbi => "get_nbi",
        Mode::OnStream => "get_on_stream",
        Mode::NbiOnStream => "get_nbi_on_stream",
    }
}

/// Every PE puts `src[2..len]` into `dst[off..]` on the next PE.
fn check_put<T: Num>(c: &Ctx, seed: u64, len: usize, mode: Mode) -> Result {
    let (sh, s) = (&c.shmem, &c.stream);
    let src = c.upload(&data::<T>(seed, c.me, len, Kind::Bits))?;
    let dst = c.zeros::<T>(len + 8)?;
    let (off, m) = (1 + mode as usize, len - 2);
    let (d, from) = (dst.view(off..off + m), src.view(2..len));
    match mode {
        Mode::Blocking => {
            sh.put(d, from, c.right)?;
            sh.quiet()?;
            sh.barrier_all()?;
        }
        Mode::Nbi => {
            sh.put_nbi(d, from, c.right)?;
            sh.quiet()?;
            sh.barrier_all()?;
        }
        Mode::OnStream => {
            sh.put_on_stream(d, from, c.right, s)?;
            sh.barrier_all_on_stream(s)?;
            c.sync()?;
        }
        Mode::NbiOnStream => {
            sh.put_nbi_on_stream(d, from, c.right, s)?;
            sh.quiet_on_stream(s)?;
            sh.barrier_all_on_stream(s)?;
            c.sync()?;
        }
    }
    let sent = data::<T>(seed, c.left, len, Kind::Bits);
    let mut want = vec![T::default(); len + 8];
    want[off..off + m].copy_from_slice(&sent[2..]);
    same("destination", &dst.to_vec()?, &want)
}

/// Every PE gets `src[2..len]` of the next PE into its own `dst[off..]`.
fn check_get<T: Num>(c: &Ctx, seed: u64, len: usize, mode: Mode) -> Result {
    let (sh, s) = (&c.shmem, &c.stream);
    let src = c.upload(&data::<T>(seed, c.me, len, Kind::Bits))?;
    let dst = c.zeros::<T>(len + 8)?;
    sh.barrier_all()?; // every source is in place
    let (off, m) = (1 + mode as usize, len - 2);
    let (d, from) = (dst.view(off..off + m), src.view(2..len));
    match mode {
        Mode::Blocking => sh.get(d, from, c.right)?,
        Mode::Nbi => {
            sh.get_nbi(d, from, c.right)?;
            sh.quiet()?;
        }
        Mode::OnStream => {
            sh.get_on_stream(d, from, c.right, s)?;
            c.sync()?;
        }
        Mode::NbiOnStream => {
            sh.get_nbi_on_stream(d, from, c.right, s)?;
            sh.quiet_on_stream(s)?;
            c.sync()?;
        }
    }
    let read = data::<T>(seed, c.right, len, Kind::Bits);
    let mut want = vec![T::default(); len + 8];
    want[off..off + m].copy_from_slice(&read[2..]);
    same("destination", &dst.to_vec()?, &want)
}

/// Every PE writes its `K` values into its slots on every PE with `p`.
fn check_p<T: Num>(c: &Ctx, seed: u64, on_stream: bool) -> Result {
    const K: usize = 3;
    let (sh, s) = (&c.shmem, &c.stream);
    let dst = c.zeros::<T>(c.n * K)?;
    let mine = data::<T>(seed, c.me, K, Kind::Bits);
    for pe in 0..c.n {
        for (j, &v) in mine.iter().enumerate() {
            if on_stream {
                sh.p_on_stream(&dst, c.me * K + j, v, pe, s)?;
            } else {
                sh.p(&dst, c.me * K + j, v, pe)?;
            }
        }
    }
    if on_stream {
        sh.quiet_on_stream(s)?;
        sh.barrier_all_on_stream(s)?;
        c.sync()?;
    } else {
        sh.barrier_all()?;
    }
    let want: Vec<T> = (0..c.n)
        .flat_map(|q| data::<T>(seed, q, K, Kind::Bits))
        .collect();
    same("slots", &dst.to_vec()?, &want)
}

/// Every PE reads every PE's `K` values with `g`.
fn check_g<T: Num>(c: &Ctx, seed: u64, on_stream: bool) -> Result {
    const K: usize = 3;
    let (sh, s) = (&c.shmem, &c.stream);
    let src = c.upload(&data::<T>(seed, c.me, K, Kind::Bits))?;
    sh.barrier_all()?;
    let mut got = Vec::with_capacity(c.n * K);
    for pe in 0..c.n {
        for j in 0..K {
            got.push(if on_stream {
                sh.g_on_stream(&src, j, pe, s)?
            } else {
                sh.g(&src, j, pe)?
            });
        }
    }
    let want: Vec<T> = (0..c.n)
        .flat_map(|q| data::<T>(seed, q, K, Kind::Bits))
        .collect();
    same("values read", &got, &want)
}

fn rma_for<T: Num>(h: &mut Harness, len: usize) {
    let c = h.ctx;
    let t = T::NVSHMEM_NAME;
    for mode in MODES {
        h.check(format!("{}<{t}> of {len}", put_name(mode)), |seed| {
            check_put::<T>(c, seed, len, mode)
        });
        h.check(format!("{}<{t}> of {len}", get_name(mode)), |seed| {
            check_get::<T>(c, seed, len, mode)
        });
    }
    h.check(format!("p<{t}>"), |seed| check_p::<T>(c, seed, false));
    h.check(format!("p_on_stream<{t}>"), |seed| {
        check_p::<T>(c, seed, true)
    });
    h.check(format!("g<{t}>"), |seed| check_g::<T>(c, seed, false));
    h.check(format!("g_on_stream<{t}>"), |seed| {
        check_g::<T>(c, seed, true)
    });
}

pub(crate) fn checks(h: &mut Harness) {
    rma_for::<u8>(h, 65_539);
    rma_for::<i32>(h, 100_003);
    rma_for::<f64>(h, 262_147); // 2 MiB
    rma_for::<bf16>(h, 1_001);
    rma_for::<i16>(h, 17);
    rma_for::<f16>(h, 5);
}
