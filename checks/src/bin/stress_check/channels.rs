//! send and recv: the ring of channels.

use crate::common::{hash, CHAN_MAX, FILL_U32, TAG_CHAN};
use crate::outcome::{same, Fail};
use crate::roles::{Env, Worker};
use crate::stream_copy::{download, upload};
use crate::tally::Kind;
use nvshmem_checks::splitmix::mix;

/// Message `m` of PE `from`: its number, whether it is the last, its length, then words.
fn message(env: &Env, from: usize, m: u64, last: bool) -> Vec<u32> {
    let base = hash(env.seed, &[TAG_CHAN, from as u64, m]);
    let len = 3 + (base % (CHAN_MAX as u64 - 2)) as usize;
    let mut words = vec![m as u32, u32::from(last), len as u32];
    words.extend((3..len as u64).map(|i| mix(base ^ i) as u32));
    words
}

pub(crate) fn sender(w: &Worker) {
    let env = w.env;
    let Some(stream) = w.new_stream() else {
        return;
    };
    let (ch, next) = (&env.world.ring[env.me], env.next());
    for m in 0u64.. {
        let last = w.time_up();
        let words = message(env, env.me, m, last);
        w.doing(format!("message {m} ({} words) to PE {next}", words.len()));
        let sent = upload(&stream, env.world.chan_src.view(..words.len()), &words).and_then(|()| {
            ch.send(&env.world.chan_src.view(..words.len()), &stream)?;
            // One message in flight from here: the send waits on the GPU for a free slot.
            stream.synchronize().map_err(Fail::from)
        });
        if !w.record(Kind::Send, sent) || last {
            break;
        }
    }
}

pub(crate) fn receiver(w: &Worker) {
    let env = w.env;
    let Some(stream) = w.new_stream() else {
        return;
    };
    let prev = env.prev();
    let ch = &env.world.ring[prev];
    for m in 0u64.. {
        w.doing(format!("message {m} from PE {prev}"));
        let got =
            upload(&stream, env.world.chan_dst.view(..), &[FILL_U32; CHAN_MAX]).and_then(|()| {
                ch.recv(&mut env.world.chan_dst.view(..), &stream)?;
                download(&stream, env.world.chan_dst.view(..))
            });
        let words = match got {
            Ok(words) => words,
            Err(f) => {
                w.record(Kind::Recv, Err(f));
                return;
            }
        };
        // Data errors are counted and the ring goes on; the header says when it ends.
        let last = words[1] == 1;
        let mut want = message(env, prev, m, last);
        want.resize(CHAN_MAX, FILL_U32);
        w.record(
            Kind::Recv,
            same(&format!("message {m} from PE {prev}"), &words, &want),
        );
        if last {
            break;
        }
    }
}
