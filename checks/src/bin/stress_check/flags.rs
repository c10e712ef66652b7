//! ping and pong: flags set by other threads and other PEs.

use crate::common::{hash, STOP, TAG_FLAG};
use crate::outcome::{fail, Outcome};
use crate::roles::{Env, Worker};
use crate::tally::Kind;
use crate::world::{LOCAL_PING, LOCAL_PONG, PING, PING_DATA, PING_SRC, PONG, PONG_DATA, PONG_SRC};
use nvshmem::{Cmp, SignalOp};

/// How a flag travels, by round.
#[derive(Clone, Copy, Debug)]
enum Route {
    P,
    Put,
    AtomicSet,
    SignalOp,
    PutSignal,
}

fn route(k: u64) -> Route {
    [
        Route::P,
        Route::Put,
        Route::AtomicSet,
        Route::SignalOp,
        Route::PutSignal,
    ][(k % 5) as usize]
}

/// One side's words: where its flag and its payload land, and its source word.
struct Words {
    flag: usize,
    data: usize,
    src: usize,
}

const PING_WORDS: Words = Words {
    flag: PING,
    data: PING_DATA,
    src: PING_SRC,
};
const PONG_WORDS: Words = Words {
    flag: PONG,
    data: PONG_DATA,
    src: PONG_SRC,
};

/// The payload PE `from` sends with its flag of round `k` when it goes by `put_signal`.
fn payload(env: &Env, from: usize, k: u64) -> u64 {
    hash(env.seed, &[TAG_FLAG, from as u64, k])
}

/// Set `to.flag` on PE `pe` to `v` by `route` (with `put_signal`, `data` into `to.data`
/// first); complete when it returns.
fn send_flag(w: &Worker, to: &Words, v: u64, data: u64, pe: usize, route: Route) -> Outcome {
    let (sh, f) = (w.env.shmem, &w.env.world.flags);
    let src = f.view(to.src..=to.src);
    match route {
        Route::P => {
            sh.p(f, to.flag, v, pe)?;
            sh.quiet()?;
        }
        Route::Put => {
            src.copy_from_host(&[v])?;
            sh.put(f.view(to.flag..=to.flag), src, pe)?;
            sh.quiet()?;
        }
        Route::AtomicSet => sh.atomic_set(f, to.flag, v, pe)?,
        Route::SignalOp => sh.signal_op(f, to.flag, v, SignalOp::Set, pe)?,
        Route::PutSignal => {
            src.copy_from_host(&[data])?;
            let dest = f.view(to.data..=to.data);
            sh.put_signal(dest, src, f, to.flag, v, SignalOp::Set, pe)?;
        }
    }
    Ok(())
}

/// Wait until this PE's flag word `at` reaches round `k` (`wait_until` and `signal_wait_until`
/// by turns); its value, which may carry `STOP`.
fn await_flag(w: &Worker, at: usize, k: u64) -> Outcome<u64> {
    let (sh, f) = (w.env.shmem, &w.env.world.flags);
    if k.is_multiple_of(2) {
        sh.wait_until(f, at, Cmp::Ge, k)?;
        Ok(sh.signal_fetch(f, at)?)
    } else {
        Ok(sh.signal_wait_until(f, at, Cmp::Ge, k)?)
    }
}

/// This PE's word `at`, read from the host: it must be `want`.
fn word_is(w: &Worker, at: usize, want: u64, what: &str) -> Outcome {
    let got = w.env.shmem.g(&w.env.world.flags, at, w.env.me)?;
    if got != want {
        return fail(format!("{what}: {got:#x}, expected {want:#x}"));
    }
    Ok(())
}

pub(crate) fn ping(w: &Worker) {
    let env = w.env;
    let next = env.next();
    for k in 1u64.. {
        let last = w.time_up();
        let v = k | if last { STOP } else { 0 };
        w.doing(format!(
            "round {k}: flag to PE {next} by {:?}, and its answer",
            route(k)
        ));
        let remote = w.record(Kind::FlagRemote, ping_remote(w, k, v, next));
        w.doing(format!("round {k}: flag to this PE's pong, and its answer"));
        let local = w.record(Kind::FlagLocal, ping_local(w, v));
        if last || !remote || !local {
            break;
        }
    }
}

fn ping_remote(w: &Worker, k: u64, v: u64, next: usize) -> Outcome {
    let env = w.env;
    let r = route(k);
    send_flag(w, &PING_WORDS, v, payload(env, env.me, k), next, r)?;
    let answer = await_flag(w, PONG, k)?;
    if answer != v {
        return fail(format!(
            "PE {next} answered round {k} with {answer:#x}, expected {v:#x}"
        ));
    }
    if let Route::PutSignal = r {
        word_is(w, PONG_DATA, payload(env, next, k), "the answer's payload")?;
    }
    Ok(())
}

fn ping_local(w: &Worker, v: u64) -> Outcome {
    let (sh, f) = (w.env.shmem, &w.env.world.flags);
    f.view(LOCAL_PING..=LOCAL_PING).copy_from_host(&[v])?;
    sh.wait_until(f, LOCAL_PONG, Cmp::Eq, v)?;
    Ok(())
}

/// Answers the previous PE's ping and this PE's, each until its last round.
pub(crate) fn pong(w: &Worker) {
    let prev = w.env.prev();
    let (mut remote, mut local) = (true, true);
    let mut k = 0;
    while remote || local {
        k += 1;
        if remote {
            w.doing(format!("round {k}: waiting for PE {prev}'s flag"));
            match pong_remote(w, k, prev) {
                Ok(v) => remote = w.record(Kind::FlagRemote, Ok(())) && (v & STOP) == 0,
                Err(f) => {
                    w.record(Kind::FlagRemote, Err(f));
                    return;
                }
            }
        }
        if local {
            w.doing(format!("round {k}: waiting for this PE's ping"));
            match pong_local(w, k) {
                Ok(v) => local = w.record(Kind::FlagLocal, Ok(())) && (v & STOP) == 0,
                Err(f) => {
                    w.record(Kind::FlagLocal, Err(f));
                    return;
                }
            }
        }
    }
}

fn pong_remote(w: &Worker, k: u64, prev: usize) -> Outcome<u64> {
    let env = w.env;
    let v = await_flag(w, PING, k)?;
    if v & !STOP != k {
        return fail(format!("PE {prev}'s flag of round {k} is {v:#x}"));
    }
    let r = route(k);
    if let Route::PutSignal = r {
        word_is(w, PING_DATA, payload(env, prev, k), "the flag's payload")?;
    }
    w.doing(format!("round {k}: answering PE {prev} by {r:?}"));
    send_flag(w, &PONG_WORDS, v, payload(env, env.me, k), prev, r)?;
    Ok(v)
}

fn pong_local(w: &Worker, k: u64) -> Outcome<u64> {
    let (sh, f) = (w.env.shmem, &w.env.world.flags);
    sh.wait_until(f, LOCAL_PING, Cmp::Ge, k)?;
    let v = f.view(LOCAL_PING..=LOCAL_PING).to_vec()?[0];
    if v & !STOP != k {
        return fail(format!("this PE's flag of round {k} is {v:#x}"));
    }
    f.view(LOCAL_PONG..=LOCAL_PONG).copy_from_host(&[v])?;
    Ok(v)
}
