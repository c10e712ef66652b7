//! coll: the shared Collectives, called in turns by the collective threads.

use crate::coll_calls::{count, expected, inputs, Call, Op};
use crate::common::{lock, FILL_F32, FILL_I32};
use crate::outcome::{fail, same, Fail, Outcome};
use crate::roles::{Env, Worker};
use crate::stream_copy::{download, upload};
use crate::tally::Kind;
use crate::world::CollBufs;
use nvshmem::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BroadcastAlgo, CudaStream, ReduceAlgo, ReduceOp,
    ReduceScatterAlgo,
};
use std::sync::{Arc, Condvar, Mutex};

/// Whose turn it is among the collective threads: call `k` is made by thread `k % threads`,
/// so every PE makes the same calls in the same order.
pub(crate) struct Turns {
    /// The next call, and whether the calls have stopped.
    state: Mutex<(u64, bool)>,
    moved: Condvar,
}

impl Turns {
    pub(crate) fn new() -> Self {
        Turns {
            state: Mutex::new((0, false)),
            moved: Condvar::new(),
        }
    }

    /// Wait until call `k` may be made; `false` once the calls have stopped.
    fn wait_for(&self, k: u64) -> bool {
        let mut s = lock(&self.state);
        while !s.1 && s.0 != k {
            s = self.moved.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        !s.1
    }

    /// Call `k` is launched (or failed): the next may be made, unless `stop`.
    fn pass(&self, k: u64, stop: bool) {
        let mut s = lock(&self.state);
        s.0 = k + 1;
        s.1 |= stop;
        self.moved.notify_all();
    }

    pub(crate) fn stop(&self) {
        lock(&self.state).1 = true;
        self.moved.notify_all();
    }
}

pub(crate) fn collectives(w: &Worker, j: usize) {
    let env = w.env;
    let own = match j {
        0 => None,
        _ => match w.new_stream() {
            Some(s) => Some(s),
            None => return env.turns.stop(),
        },
    };
    let stream = own.as_ref().unwrap_or(env.shmem.stream());
    let bufs = &env.world.coll_bufs[j];
    let mut k = j as u64;
    loop {
        w.doing(format!("waiting for the turn of call {k}"));
        if !env.turns.wait_for(k) {
            break;
        }
        let call = Call::at(env, k);
        w.doing(format!("call {k}: {:?}, {} per PE", call.op, call.m));
        if !make_call(w, stream, bufs, &call) {
            break;
        }
        k += env.plan.colls as u64;
    }
}

/// Make `call` (this thread's turn), pass the turn on once it is launched, check it. Whether
/// the calls go on.
fn make_call(w: &Worker, stream: &Arc<CudaStream>, bufs: &CollBufs, call: &Call) -> bool {
    let env = w.env;
    let launched = write_inputs(w, stream, bufs, call)
        .and_then(|()| launch(env, stream, bufs, call).map_err(Fail::from));
    if let Op::Vote = call.op {
        // The turn waits for the outcome: every thread of every PE stops after this call.
        let vote = launched.and_then(|()| read_vote(env, stream, bufs));
        let stop = !matches!(vote, Ok(false));
        env.turns.pass(call.k, stop);
        w.record(Kind::Vote, vote.map(|_| ()));
        return !stop;
    }
    let go_on = launched.is_ok();
    env.turns.pass(call.k, !go_on);
    let checked = launched.and_then(|()| check_call(env, stream, bufs, call));
    w.record(call.kind(), checked);
    go_on
}

/// This PE's inputs into the source, and the fill into the destination, on `stream`.
fn write_inputs(w: &Worker, stream: &Arc<CudaStream>, bufs: &CollBufs, call: &Call) -> Outcome {
    let env = w.env;
    let (src_len, dst_len) = call.lens(env.n);
    match call.op {
        Op::Vote => upload(stream, bufs.src.view(..1), &[i32::from(w.time_up())]),
        Op::AllReduce { float: true, .. } => {
            let x: Vec<f32> = inputs(env, call.k, env.me, src_len)
                .into_iter()
                .map(|v| v as f32)
                .collect();
            upload(stream, bufs.src_f.view(..src_len), &x)?;
            if call.in_place() {
                return Ok(());
            }
            upload(stream, bufs.dst_f.view(..dst_len), &vec![FILL_F32; dst_len])
        }
        _ => {
            upload(
                stream,
                bufs.src.view(..src_len),
                &inputs(env, call.k, env.me, src_len),
            )?;
            if call.in_place() {
                return Ok(());
            }
            upload(stream, bufs.dst.view(..dst_len), &vec![FILL_I32; dst_len])
        }
    }
}

fn launch(
    env: &Env,
    stream: &Arc<CudaStream>,
    bufs: &CollBufs,
    call: &Call,
) -> nvshmem::Result<()> {
    let coll = &env.world.coll;
    let (src_len, dst_len) = call.lens(env.n);
    let src = bufs.src.view(..src_len);
    let dst = if call.in_place() {
        src
    } else {
        bufs.dst.view(..dst_len)
    };
    match call.op {
        Op::AllReduce {
            op, float: true, ..
        } => {
            let src = bufs.src_f.view(..src_len);
            let dst = if call.in_place() {
                src
            } else {
                bufs.dst_f.view(..dst_len)
            };
            coll.all_reduce(dst, src, op, AllReduceAlgo::Auto, stream)
        }
        Op::AllReduce { op, .. } => coll.all_reduce(dst, src, op, AllReduceAlgo::Auto, stream),
        Op::AllGather => coll.all_gather(dst, src, AllGatherAlgo::Auto, stream),
        Op::ReduceScatter(op) => coll.reduce_scatter(dst, src, op, ReduceScatterAlgo::Auto, stream),
        Op::Reduce { op, root } => coll.reduce(dst, src, op, root, ReduceAlgo::Auto, stream),
        Op::Broadcast { root, .. } => coll.broadcast(dst, src, root, BroadcastAlgo::Auto, stream),
        Op::AllToAll => coll.all_to_all(dst, src, AllToAllAlgo::Auto, stream),
        Op::AllToAllV => {
            let send: Vec<usize> = (0..env.n).map(|q| count(env, call, env.me, q)).collect();
            let recv: Vec<usize> = (0..env.n).map(|p| count(env, call, p, env.me)).collect();
            coll.all_to_all_v(dst, &recv, src, &send, stream)
        }
        Op::Vote => coll.all_reduce(dst, src, ReduceOp::Max, AllReduceAlgo::Auto, stream),
    }
}

/// Whether any PE's time is up (the vote's all-reduce).
fn read_vote(env: &Env, stream: &Arc<CudaStream>, bufs: &CollBufs) -> Outcome<bool> {
    let vote = download(stream, bufs.dst.view(..1))?[0];
    env.world.coll.check()?;
    match vote {
        0 => Ok(false),
        1 => Ok(true),
        other => fail(format!(
            "the vote's all-reduce (max of 0s and 1s) gave {other}"
        )),
    }
}

/// The destination after `call`, against what it must hold; a wait that gave up first.
fn check_call(env: &Env, stream: &Arc<CudaStream>, bufs: &CollBufs, call: &Call) -> Outcome {
    let (src_len, dst_len) = call.lens(env.n);
    let len = if call.in_place() { src_len } else { dst_len };
    let what = format!("call {} ({:?}, {} per PE)", call.k, call.op, call.m);
    let want = expected(env, call);
    if let Op::AllReduce { float: true, .. } = call.op {
        let view = if call.in_place() {
            bufs.src_f.view(..len)
        } else {
            bufs.dst_f.view(..len)
        };
        let got = download(stream, view)?;
        env.world.coll.check()?;
        // Bit for bit: integers sum exactly in f32.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        return same(&what, &bits(&got), &bits(&want));
    }
    let view = if call.in_place() {
        bufs.src.view(..len)
    } else {
        bufs.dst.view(..len)
    };
    let got = download(stream, view)?;
    env.world.coll.check()?;
    same(&what, &got, &want)
}
