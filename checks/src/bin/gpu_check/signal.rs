//! Signals.

use crate::data::*;
use crate::harness::*;
use crate::Result;
use nvshmem::{Cmp, SignalOp};

#[derive(Clone, Copy, Debug)]
enum SigMode {
    Blocking,
    Nbi,
    OnStream,
    NbiOnStream,
}

/// Every PE puts its data into the next PE with a signal, and waits for its own.
fn check_put_signal<T: Num>(c: &Ctx, seed: u64, len: usize, mode: SigMode) -> Result {
    let (sh, s) = (&c.shmem, &c.stream);
    let src = c.upload(&data::<T>(seed, c.me, len, Kind::Bits))?;
    let dst = c.zeros::<T>(len)?;
    let sig = c.zeros::<u64>(3)?;
    // Set: the value names the sender; Add: the sum of one add is its value.
    let value = 1000 + c.me as u64;
    let expect = 1000 + c.left as u64;
    let mut p = Problems::default();
    match mode {
        SigMode::Blocking => {
            sh.put_signal(&dst, &src, &sig, 1, value, SignalOp::Set, c.right)?;
            let seen = sh.signal_wait_until(&sig, 1, Cmp::Eq, expect)?;
            p.note(ensure(seen == expect, || {
                format!("signal_wait_until returned {seen}")
            }));
        }
        SigMode::Nbi => {
            sh.put_signal_nbi(&dst, &src, &sig, 1, value, SignalOp::Add, c.right)?;
            let seen = sh.signal_wait_until(&sig, 1, Cmp::Ge, expect)?;
            p.note(ensure(seen == expect, || {
                format!("signal_wait_until returned {seen}")
            }));
            sh.quiet()?;
        }
        SigMode::OnStream => {
            sh.put_signal_on_stream(&dst, &src, &sig, 1, value, SignalOp::Set, c.right, s)?;
            sh.signal_wait_until_on_stream(&sig, 1, Cmp::Eq, expect, s)?;
            c.sync()?;
        }
        SigMode::NbiOnStream => {
            sh.put_signal_nbi_on_stream(&dst, &src, &sig, 1, value, SignalOp::Add, c.right, s)?;
            sh.signal_wait_until_on_stream(&sig, 1, Cmp::Ne, 0, s)?;
            sh.quiet_on_stream(s)?;
            c.sync()?;
        }
    }
    p.note(same(
        "data behind the signal",
        &dst.to_vec()?,
        &data::<T>(seed, c.left, len, Kind::Bits),
    ));
    p.note(same("signals", &sig.to_vec()?, &[0, expect, 0]));
    p.note(ensure(sh.signal_fetch(&sig, 1)? == expect, || {
        "signal_fetch".into()
    }));
    p.done()
}

pub(crate) fn checks(h: &mut Harness) {
    let c = h.ctx;
    for (mode, name) in [
        (SigMode::Blocking, "put_signal"),
        (SigMode::Nbi, "put_signal_nbi"),
        (SigMode::OnStream, "put_signal_on_stream"),
        (SigMode::NbiOnStream, "put_signal_nbi_on_stream"),
    ] {
        h.check(format!("{name}<float> of 300000"), |seed| {
            check_put_signal::<f32>(c, seed, 300_000, mode)
        });
        h.check(format!("{name}<uint16> of 7"), |seed| {
            check_put_signal::<u16>(c, seed, 7, mode)
        });
    }

    for on_stream in [false, true] {
        let name = if on_stream {
            "signal_op_on_stream"
        } else {
            "signal_op"
        };
        h.check(name, |_| {
            let (sh, s) = (&c.shmem, &c.stream);
            let sig = c.zeros::<u64>(3)?;
            let total = (c.n * (c.n + 1) / 2) as u64;
            let from_left = 5000 + c.left as u64;
            for pe in 0..c.n {
                if on_stream {
                    sh.signal_op_on_stream(&sig, 0, c.me as u64 + 1, SignalOp::Add, pe, s)?;
                } else {
                    sh.signal_op(&sig, 0, c.me as u64 + 1, SignalOp::Add, pe)?;
                }
            }
            if on_stream {
                sh.signal_op_on_stream(&sig, 1, 5000 + c.me as u64, SignalOp::Set, c.right, s)?;
                sh.signal_wait_until_on_stream(&sig, 0, Cmp::Eq, total, s)?;
                sh.signal_wait_until_on_stream(&sig, 1, Cmp::Eq, from_left, s)?;
                c.sync()?;
            } else {
                sh.signal_op(&sig, 1, 5000 + c.me as u64, SignalOp::Set, c.right)?;
                sh.signal_wait_until(&sig, 0, Cmp::Eq, total)?;
                sh.signal_wait_until(&sig, 1, Cmp::Eq, from_left)?;
            }
            let got: Vec<u64> = (0..3)
                .map(|i| sh.signal_fetch(&sig, i))
                .collect::<nvshmem::Result<_>>()?;
            same("signals", &got, &[total, from_left, 0])
        });
    }

    for on_stream in [false, true] {
        let name = if on_stream {
            "signal_wait_until_on_stream: every Cmp"
        } else {
            "signal_wait_until: every Cmp"
        };
        h.check(name, |_| {
            let (sh, s) = (&c.shmem, &c.stream);
            let sig = c.zeros::<u64>(1)?;
            sh.signal_op(&sig, 0, 10, SignalOp::Set, c.me)?;
            // Each comparison holds for the value 10, so none may wait.
            let cases = [
                (Cmp::Eq, 10),
                (Cmp::Ne, 9),
                (Cmp::Gt, 9),
                (Cmp::Ge, 10),
                (Cmp::Ge, 3),
                (Cmp::Lt, 11),
                (Cmp::Le, 10),
                (Cmp::Le, 12),
            ];
            for (cmp, v) in cases {
                ensure(cmp.holds(10, v), || {
                    format!("{cmp:?} {v} does not hold for 10")
                })?;
                if on_stream {
                    sh.signal_wait_until_on_stream(&sig, 0, cmp, v, s)?;
                } else {
                    let seen = sh.signal_wait_until(&sig, 0, cmp, v)?;
                    ensure(seen == 10, || format!("{cmp:?}: returned {seen}"))?;
                }
            }
            if on_stream {
                c.sync()?;
            }
            Ok(())
        });
    }
}
