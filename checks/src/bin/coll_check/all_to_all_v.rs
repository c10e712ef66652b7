//! The all-to-all-v: random count matrices back to back and in a graph, and counts that
//! disagree between sender and receiver.

use nvshmem::{Collectives, Error, Nvshmem, Result};

use nvshmem_checks::graph::capture;

use crate::harness::{compare, cuda, place, sync, Checker};
use crate::reference::{all_to_all_v_want, count_matrix, inputs};

/// Two all-to-all-v calls with different random counts back to back on one stream, then
/// the first captured in a graph and replayed on new inputs. Elements of `dst` past what this
/// PE receives must keep their poison.
pub(crate) fn all_to_all_v_case(
    shmem: &Nvshmem,
    coll: &Collectives,
    seed: u64,
    max: usize,
) -> Result<()> {
    let (me, np) = place(coll)?;
    let mats = [count_matrix(seed, np, max), count_matrix(seed + 1, np, max)];
    let cap = max * np + 5;
    let rounds: Vec<Vec<Vec<f32>>> = (0..4)
        .map(|r| inputs::<f32>(seed + 7 * r, np, cap))
        .collect();
    let poison = inputs::<f32>(seed ^ 0xD57, np, cap)[me].clone();
    let srcs = (0..2)
        .map(|r| {
            let b = shmem.malloc::<f32>(cap)?;
            b.copy_from_host(&rounds[r][me])?;
            Ok(b)
        })
        .collect::<Result<Vec<_>>>()?;
    let dsts = (0..2)
        .map(|_| {
            let b = shmem.malloc::<f32>(cap)?;
            b.copy_from_host(&poison)?;
            Ok(b)
        })
        .collect::<Result<Vec<_>>>()?;
    let counts = |c: &[Vec<usize>]| {
        let send = c[me].clone();
        let recv: Vec<usize> = (0..np).map(|p| c[p][me]).collect();
        (send, recv)
    };
    for ((mat, dst), src) in mats.iter().zip(&dsts).zip(&srcs) {
        let (send, recv) = counts(mat);
        coll.all_to_all_v(dst, &recv, src, &send, shmem.stream())?;
    }
    sync(shmem)?;
    let want = |r: usize, data: usize| {
        let mut w = all_to_all_v_want(&rounds[data], &mats[r], me);
        let got = w.len();
        w.extend_from_slice(&poison[got..]);
        w
    };
    let mut found = Ok(());
    for (r, dst) in dsts.iter().enumerate() {
        found = found.and(compare(
            &format!("all_to_all_v {r}"),
            &dst.to_vec()?,
            &want(r, r),
        ));
    }
    let stream = shmem.new_stream()?;
    let (send, recv) = counts(&mats[0]);
    let graph = capture(&stream, || {
        coll.all_to_all_v(&dsts[0], &recv, &srcs[0], &send, &stream)
    })?;
    for data in [2, 3] {
        srcs[0].copy_from_host(&rounds[data][me])?;
        cuda("cuGraphLaunch", graph.launch())?;
        cuda("cuStreamSynchronize", stream.synchronize())?;
        found = found.and(compare(
            &format!("graph replay of all_to_all_v on inputs {data}"),
            &dsts[0].to_vec()?,
            &want(0, data),
        ));
    }
    found
}

/// The last PE expects one element more from PE 0 than PE 0 sends: on a Collectives of its
/// own (a mismatch leaves it unusable), both must report the pair, and nothing may land in
/// the last PE's output from PE 0.
fn all_to_all_v_mismatch(shmem: &Nvshmem, seed: u64) -> Result<()> {
    let (me, np) = (shmem.my_pe(), shmem.n_pes());
    let coll = Collectives::new(shmem)?;
    let c = count_matrix(seed, np, 9);
    let send = c[me].clone();
    let mut recv: Vec<usize> = (0..np).map(|p| c[p][me]).collect();
    if me == np - 1 {
        recv[0] += 1;
    }
    let cap = 9 * np + 1;
    let src = shmem.malloc::<f32>(cap)?;
    src.copy_from_host(&inputs::<f32>(seed, np, cap)[me])?;
    let poison = inputs::<f32>(seed ^ 0xD57, np, cap)[me].clone();
    let dst = shmem.malloc::<f32>(cap)?;
    dst.copy_from_host(&poison)?;
    coll.all_to_all_v(&dst, &recv, &src, &send, shmem.stream())?;
    sync(shmem)?;
    let involved = me == 0 || me == np - 1;
    match (coll.check(), involved) {
        (Err(Error::CollectiveMismatch(msg)), true) => {
            let pair = format!(
                "PE 0 sends {} elements to PE {}, which expects {}",
                c[0][np - 1],
                np - 1,
                c[0][np - 1] + 1
            );
            if !msg.contains(&pair) {
                return Err(Error::InvalidArgument(format!(
                    "the mismatch says: {msg}; expected: {pair}"
                )));
            }
        }
        (Ok(()), false) => {}
        (other, _) => {
            return Err(Error::InvalidArgument(format!(
                "PE {me} (involved: {involved}) got {other:?} after mismatched counts"
            )))
        }
    }
    if me == np - 1 {
        // PE 0's block is the first: nothing of it may have landed.
        let got = dst.to_vec()?;
        compare(
            "the receiver's block from PE 0",
            &got[..recv[0]],
            &poison[..recv[0]],
        )?;
    }
    Ok(())
}

/// Counts up to each bound, then counts that disagree.
pub(crate) fn checks(c: &mut Checker, coll: &Collectives) {
    for max in [0usize, 1, 5, 1000, 70_001] {
        c.check(
            &format!("all_to_all_v counts up to {max}, back to back and in a graph"),
            |s, seed| all_to_all_v_case(s, coll, seed, max),
        );
    }
    c.check(
        "all_to_all_v with counts that disagree",
        all_to_all_v_mismatch,
    );
}
