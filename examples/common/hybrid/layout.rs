//! The hybrid example's layout: `tp x pp x dp` PEs, where PE `(d · pp + s) · tp + t` is group
//! PE `t` of stage `s` of replica `d`, its teams, and the channels between neighbouring
//! stages. Included with `#[path]`.

use nvshmem::channel::{Channel, ChannelConfig};
use nvshmem::tp::TensorParallel;
use nvshmem::{bf16, Collectives, CollectivesConfig, Error, Nvshmem, Result};

/// The layout, and this PE's place in it.
#[derive(Clone, Copy)]
pub struct Layout {
    pub tp: usize,
    pub pp: usize,
    pub dp: usize,
    pub t: usize,
    pub s: usize,
    pub d: usize,
}

impl Layout {
    /// `--tp N --pp N` from the command line (2 and 2 by default, 1 where 2 does not divide
    /// what is left of the PEs); the replicas take the rest. `blocks` must divide into the stages, `ffn` into the groups.
    pub fn from_args(
        shmem: &Nvshmem,
        blocks: usize,
        ffn: usize,
    ) -> std::result::Result<Self, String> {
        let n = shmem.n_pes();
        let args: Vec<String> = std::env::args().collect();
        let arg = |name: &str, default: usize| match args.iter().position(|a| a == name) {
            Some(i) => args
                .get(i + 1)
                .and_then(|v| v.parse().ok())
                .ok_or(format!("{name} takes a number")),
            None => Ok(default),
        };
        let tp: usize = arg("--tp", if n.is_multiple_of(2) { 2 } else { 1 })?.max(1);
        let pp: usize = arg("--pp", if n.is_multiple_of(2 * tp) { 2 } else { 1 })?.max(1);
        Self::new(shmem, (tp, pp), blocks, ffn)
    }

    /// `tp x pp` groups and stages; the replicas take the rest of the PEs.
    pub fn new(
        shmem: &Nvshmem,
        (tp, pp): (usize, usize),
        blocks: usize,
        ffn: usize,
    ) -> std::result::Result<Self, String> {
        let (me, n) = (shmem.my_pe(), shmem.n_pes());
        if tp * pp == 0
            || !n.is_multiple_of(tp * pp)
            || !blocks.is_multiple_of(pp)
            || !ffn.is_multiple_of(tp)
        {
            return Err(format!(
                "--tp {tp} --pp {pp} on {n} PEs: tp x pp must divide the PE count, pp the {blocks} blocks"
            ));
        }
        let (t, s, d) = (me % tp, me / tp % pp, me / (tp * pp));
        Ok(Layout {
            tp,
            pp,
            dp: n / (tp * pp),
            t,
            s,
            d,
        })
    }

    /// The PE of group PE `t` of stage `s` of replica `d`.
    pub fn pe(&self, d: usize, s: usize, t: usize) -> usize {
        (d * self.pp + s) * self.tp + t
    }
}

/// What runs on this PE's teams: its tensor-parallel group (a row of `tp` PEs), the
/// collectives of its replicas (a column of rows of `tp · pp` PEs: the same stage and group
/// PE), and a group of this PE alone for the single-GPU run.
pub struct Groups {
    pub tp: TensorParallel,
    pub dp: Collectives,
    pub one: TensorParallel,
}

impl Groups {
    /// Collective over the world.
    pub fn new(shmem: &Nvshmem, at: Layout) -> Result<Self> {
        let world = shmem.team_world();
        let none = || Error::InvalidArgument("this PE is in no row of a split".into());
        let group = world.split_2d(at.tp)?.0.ok_or_else(none)?;
        let replicas = world.split_2d(at.tp * at.pp)?.1;
        let alone = world.split_2d(1)?.0.ok_or_else(none)?;
        let mut config = CollectivesConfig::for_pes(at.dp);
        config.max_blocks = Some(32); // the sync runs beside the weight gradients' GEMMs
        Ok(Groups {
            tp: TensorParallel::with_team(shmem, &group)?,
            dp: Collectives::with_team(shmem, replicas.as_ref(), config)?,
            one: TensorParallel::with_team(shmem, &alone)?,
        })
    }
}

/// Every channel between neighbouring stages, from stage `s` to `s + 1` (activations) and
/// back (gradients), between the same group PE of the same replica.
pub struct Pipes {
    forward: Vec<Channel<bf16>>,
    backward: Vec<Channel<bf16>>,
    at: Layout,
}

impl Pipes {
    /// Collective: every PE makes every channel, in one order.
    pub fn new(shmem: &Nvshmem, at: Layout, len: usize) -> Result<Self> {
        let (mut forward, mut backward) = (Vec::new(), Vec::new());
        for (d, s, t) in Self::keys(at) {
            let (a, b) = (at.pe(d, s, t), at.pe(d, s + 1, t));
            forward.push(Channel::new(shmem, ChannelConfig::new(a, b, len))?);
            backward.push(Channel::new(shmem, ChannelConfig::new(b, a, len))?);
        }
        Ok(Pipes {
            forward,
            backward,
            at,
        })
    }

    fn keys(at: Layout) -> impl Iterator<Item = (usize, usize, usize)> {
        let (tp, pp) = (at.tp, at.pp);
        (0..at.dp).flat_map(move |d| (0..pp - 1).flat_map(move |s| (0..tp).map(move |t| (d, s, t))))
    }

    /// This PE's channels between stage `s` and `s + 1`: activations, gradients.
    pub fn between(&self, s: usize) -> (&Channel<bf16>, &Channel<bf16>) {
        let key = (self.at.d, s, self.at.t);
        let i = Self::keys(self.at)
            .position(|k| k == key)
            .expect("a channel of this PE");
        (&self.forward[i], &self.backward[i])
    }

    /// Every channel's fault record (a wait that gave up on the GPU shows here).
    pub fn check(&self) -> Result<()> {
        self.forward
            .iter()
            .chain(&self.backward)
            .try_for_each(|c| c.check())
    }
}
