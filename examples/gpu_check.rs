//! GPU check of the host API: every public host function, run on every PE with random data and
//! compared with a reference computed on the CPU.
//!
//! ```text
//! make check
//! mpiexec -np 4 target/release/examples/gpu_check [--verbose]
//! ```
//!
//! Every PE runs the same named checks in the same order. A check's random input on PE `p` comes
//! from a generator seeded with the check's name and `p`, so each PE can rebuild what every
//! other PE sent and compute the expected result itself. A check fails on a PE when it returns
//! an error, finds a wrong value or panics; the PE says which and carries on. At the end the
//! failures are summed over PEs (with this crate's all-reduce) and PE 0 prints
//! `N passed, M failed`, where a check counts as failed if it failed on any PE. The exit status
//! is 1 when anything failed.

use nvshmem::{
    bf16, f16, AtomicInteger, Cmp, CudaStream, Element, Error, Nvshmem, ReduceOp, SignalOp,
    SymmetricBuffer, Team, UniqueId,
};
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a check returns: any error (from NVSHMEM, CUDA or a wrong value) is a failure.
type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A check that runs longer than this is taken to hang: the PE reports it and aborts.
const CHECK_TIME_LIMIT: Duration = Duration::from_secs(30);

/// The most attempts any retry loop makes before it reports a failure.
const MAX_ATTEMPTS: usize = 10_000;

fn main() {
    let code = match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpu_check: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn run() -> Result<i32> {
    let verbose = std::env::args()
        .skip(1)
        .any(|a| a == "-v" || a == "--verbose");
    let shmem = Nvshmem::init()?;
    let ctx = Ctx::new(shmem)?;
    let mut h = Harness::new(&ctx, verbose);

    runtime_checks(&mut h);
    rma_checks(&mut h);
    signal_checks(&mut h);
    atomic_checks(&mut h);
    sync_checks(&mut h);
    collective_checks(&mut h);
    error_checks(&mut h);

    let (passed, failed) = h.finish()?;
    if ctx.me == 0 {
        println!("{passed} passed, {failed} failed");
    }
    drop(ctx);
    Ok(if failed > 0 { 1 } else { 0 })
}

// ---------------------------------------------------------------------------------------------
// Random data and CPU references.

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, pe: usize) -> Self {
        let mut r = Rng(seed ^ (pe as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next();
        r
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo) as u64 + 1)) as i64
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// FNV-1a of a check's name: its seed.
fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    })
}

/// What the random values are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Sums, minima and maxima: small enough that no sum over PEs overflows.
    Arith,
    /// Products: values whose product over PEs stays in range.
    Prod,
    /// Any bit pattern (floats: as `Arith`).
    Bits,
}

impl Kind {
    fn for_op(op: ReduceOp) -> Kind {
        match op {
            ReduceOp::Prod => Kind::Prod,
            op if op.is_bitwise() => Kind::Bits,
            _ => Kind::Arith,
        }
    }
}

/// The element types under test, with what the reference needs.
trait Num: Element {
    /// Relative rounding error of one operation; 0 for integers, which compare exactly.
    const EPS: f64;
    fn gen(rng: &mut Rng, kind: Kind) -> Self;
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
    /// The reduction of `vals` as NVSHMEM computes it (integers wrap; floats exactly, rounded
    /// once).
    fn reference(op: ReduceOp, vals: &[Self]) -> Self;
}

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const EPS: f64 = 0.0;
            fn gen(rng: &mut Rng, kind: Kind) -> Self {
                let signed = <$t>::MIN != 0;
                let bits = <$t>::BITS;
                match kind {
                    Kind::Bits => rng.next() as $t,
                    Kind::Arith => {
                        let span = 1i64 << (bits - 5).min(40);
                        if signed { rng.int(-span, span) as $t } else { rng.int(0, span) as $t }
                    }
                    Kind::Prod => {
                        let magnitude = if bits == 8 && signed { 1 } else { rng.int(1, 2) };
                        if signed && rng.next() & 1 == 1 { (-magnitude) as $t } else { magnitude as $t }
                    }
                }
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn reference(op: ReduceOp, vals: &[Self]) -> Self {
                vals.iter()
                    .copied()
                    .reduce(|a, b| match op {
                        ReduceOp::Sum => a.wrapping_add(b),
                        ReduceOp::Prod => a.wrapping_mul(b),
                        ReduceOp::Min => a.min(b),
                        ReduceOp::Max => a.max(b),
                        ReduceOp::And => a & b,
                        ReduceOp::Or => a | b,
                        ReduceOp::Xor => a ^ b,
                    })
                    .unwrap_or_default()
            }
        }
    )*};
}

int_num!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_num {
    ($t:ty, $eps:expr, to = $to:expr, from = $from:expr) => {
        impl Num for $t {
            const EPS: f64 = $eps;
            fn gen(rng: &mut Rng, kind: Kind) -> Self {
                let x = match kind {
                    Kind::Prod => {
                        let m = 0.5 + 1.5 * rng.unit();
                        if rng.next() & 1 == 1 {
                            -m
                        } else {
                            m
                        }
                    }
                    _ => 2.0 * rng.unit() - 1.0,
                };
                Self::from_f64(x)
            }
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(x: f64) -> Self {
                ($from)(x)
            }
            fn reference(op: ReduceOp, vals: &[Self]) -> Self {
                let xs = vals.iter().map(|v| v.to_f64());
                Self::from_f64(match op {
                    ReduceOp::Sum => xs.sum(),
                    ReduceOp::Prod => xs.product(),
                    ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
                    ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                    _ => f64::NAN,
                })
            }
        }
    };
}

float_num!(
    f32,
    f32::EPSILON as f64,
    to = |v: f32| v as f64,
    from = |x: f64| x as f32
);
float_num!(f64, f64::EPSILON, to = |v: f64| v, from = |x: f64| x);
float_num!(
    f16,
    1.0 / 1024.0,
    to = |v: f16| v.to_f64(),
    from = f16::from_f64
);
float_num!(
    bf16,
    1.0 / 128.0,
    to = |v: bf16| v.to_f64(),
    from = bf16::from_f64
);

/// Whether `got` is `want` up to the rounding a reduction of `vals` may do in any order.
fn agrees<T: Num>(op: ReduceOp, got: T, want: T, vals: &[T]) -> bool {
    if T::EPS == 0.0 || matches!(op, ReduceOp::Min | ReduceOp::Max) {
        return got == want;
    }
    let n = vals.len() as f64;
    let tol = match op {
        ReduceOp::Sum => 2.0 * T::EPS * n * vals.iter().map(|v| v.to_f64().abs()).sum::<f64>(),
        _ => 2.0 * T::EPS * n * want.to_f64().abs(),
    };
    (got.to_f64() - want.to_f64()).abs() <= tol
}

/// PE `pe`'s input of a check.
fn data<T: Num>(seed: u64, pe: usize, len: usize, kind: Kind) -> Vec<T> {
    let mut rng = Rng::new(seed, pe);
    (0..len).map(|_| T::gen(&mut rng, kind)).collect()
}

/// Element-by-element equality, reporting how many differ and the first.
fn same<T: PartialEq + Debug>(what: &str, got: &[T], want: &[T]) -> Result {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, expected {}", got.len(), want.len()).into());
    }
    let mut bad = (0..got.len()).filter(|&i| got[i] != want[i]);
    if let Some(i) = bad.next() {
        let count = 1 + bad.count();
        return Err(format!(
            "{what}: {count} of {} elements wrong; first at {i}: got {:?}, expected {:?}",
            got.len(),
            got[i],
            want[i]
        )
        .into());
    }
    Ok(())
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result {
    if cond {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// `r` must be an error that `expected` accepts.
fn refused<T: Debug>(what: &str, r: nvshmem::Result<T>, expected: fn(&Error) -> bool) -> Result {
    match r {
        Ok(v) => Err(format!("{what}: accepted (returned {v:?}), expected an error").into()),
        Err(e) if expected(&e) => Ok(()),
        Err(e) => Err(format!("{what}: refused with the wrong error: {e}").into()),
    }
}

fn pe_error(e: &Error) -> bool {
    matches!(e, Error::PeOutOfRange { .. })
}

fn length_error(e: &Error) -> bool {
    matches!(e, Error::Length { .. })
}

fn argument_error(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument(_))
}

/// Collects the problems of a check that must go on to the end (its later steps are collective,
/// so returning early would leave the other PEs waiting).
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn note(&mut self, r: Result) {
        if let Err(e) = r {
            self.0.push(e.to_string());
        }
    }

    fn done(self) -> Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0.join("; ").into())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The harness.

struct Ctx {
    shmem: Nvshmem,
    world: Team,
    stream: Arc<CudaStream>,
    me: usize,
    n: usize,
    left: usize,
    right: usize,
}

impl Ctx {
    fn new(shmem: Nvshmem) -> Result<Self> {
        let (me, n) = (shmem.my_pe(), shmem.n_pes());
        Ok(Ctx {
            world: shmem.team_world(),
            stream: shmem.new_stream()?,
            me,
            n,
            left: (me + n - 1) % n,
            right: (me + 1) % n,
            shmem,
        })
    }

    /// Wait for the check's stream.
    fn sync(&self) -> Result {
        self.stream
            .synchronize()
            .map_err(|e| format!("cuStreamSynchronize: {e:?}"))?;
        Ok(())
    }

    /// A symmetric buffer holding `data` (collective: same length on every PE).
    fn upload<T: Element>(&self, data: &[T]) -> Result<SymmetricBuffer<T>> {
        let buf = self.shmem.malloc::<T>(data.len())?;
        buf.copy_from_host(data)?;
        Ok(buf)
    }

    /// A zeroed symmetric buffer, zeroed on every PE before any PE goes on to write into it
    /// (collective).
    fn zeros<T: Element>(&self, len: usize) -> Result<SymmetricBuffer<T>> {
        let buf = self.shmem.calloc::<T>(len)?;
        self.shmem.barrier_all()?;
        Ok(buf)
    }

    /// The even PEs, as a team (`None` on odd PEs). Collective.
    fn evens(&self) -> Result<Option<Team>> {
        Ok(self.world.split_strided(0, 2, self.n.div_ceil(2))?)
    }
}

struct Harness<'c> {
    ctx: &'c Ctx,
    verbose: bool,
    names: Vec<String>,
    failed: Vec<u32>,
    current: Arc<Mutex<(String, Instant)>>,
}

impl<'c> Harness<'c> {
    fn new(ctx: &'c Ctx, verbose: bool) -> Self {
        let current = Arc::new(Mutex::new(("start-up".to_string(), Instant::now())));
        let watched = current.clone();
        let me = ctx.me;
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(250));
            let (name, since) = watched.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if since.elapsed() > CHECK_TIME_LIMIT {
                eprintln!(
                    "[PE {me}] check `{name}` still running after {} s: taking it as hung, aborting",
                    CHECK_TIME_LIMIT.as_secs()
                );
                // Not exit(): its handlers would tear down CUDA and NVSHMEM under the check,
                // which keeps running, failing on every call. Abort stops every thread at once.
                std::process::abort();
            }
        });
        Harness {
            ctx,
            verbose,
            names: Vec::new(),
            failed: Vec::new(),
            current,
        }
    }

    /// Run one named check; `f` gets the check's seed.
    fn check(&mut self, name: impl Into<String>, f: impl FnOnce(u64) -> Result) {
        let name = name.into();
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = (name.clone(), Instant::now());
        let outcome = catch_unwind(AssertUnwindSafe(|| f(seed_of(&name))));
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(panic) => Some(match panic.downcast_ref::<String>() {
                Some(s) => format!("panicked: {s}"),
                None => match panic.downcast_ref::<&str>() {
                    Some(s) => format!("panicked: {s}"),
                    None => "panicked".to_string(),
                },
            }),
        };
        match &failure {
            Some(msg) => eprintln!("[PE {}] FAIL {name}: {msg}", self.ctx.me),
            None if self.verbose && self.ctx.me == 0 => eprintln!("ok   {name}"),
            None => {}
        }
        // Keep the PEs in step between checks.
        if let Err(e) = self.ctx.shmem.barrier_all() {
            eprintln!("[PE {}] barrier after {name} failed: {e}", self.ctx.me);
        }
        self.names.push(name);
        self.failed.push(failure.is_some() as u32);
    }

    /// Sum the failures over PEs; returns (passed, failed) counted over checks.
    fn finish(self) -> Result<(usize, usize)> {
        let c = self.ctx;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) =
            ("the final tally".into(), Instant::now());
        let mine = c.upload(&self.failed)?;
        let all = c.shmem.malloc::<u32>(self.failed.len())?;
        c.world.all_reduce(ReduceOp::Sum, &all, &mine, &c.stream)?;
        c.sync()?;
        let totals = all.to_vec()?;
        if c.me == 0 {
            for (name, pes) in self.names.iter().zip(&totals).filter(|(_, &t)| t > 0) {
                eprintln!("FAILED {name} (on {pes} of {} PEs)", c.n);
            }
        }
        let failed = totals.iter().filter(|&&t| t > 0).count();
        Ok((totals.len() - failed, failed))
    }
}

// ---------------------------------------------------------------------------------------------
// Runtime, teams and memory.

fn runtime_checks(h: &mut Harness) {
    let c = h.ctx;
    h.check("init, info and version", |_| {
        let info = c.shmem.info()?;
        ensure(info.my_pe == c.me && info.n_pes == c.n, || {
            format!("info says PE {}/{}", info.my_pe, info.n_pes)
        })?;
        ensure(
            info.node_pe < info.node_n_pes && info.node_n_pes <= c.n,
            || format!("node PE {}/{}", info.node_pe, info.node_n_pes),
        )?;
        ensure(info.device == c.shmem.device_ordinal(), || {
            "device ordinal differs".into()
        })?;
        ensure(c.shmem.version() == nvshmem::sys::BUILD_VERSION, || {
            format!("running {}", c.shmem.version())
        })?;
        let (a, b, p) = nvshmem::runtime::library_version();
        ensure(format!("{a}.{b}.{p}") == c.shmem.version(), || {
            "library_version disagrees".into()
        })?;
        ensure(info.to_string().contains(&info.device_name), || {
            "Display lacks the device".into()
        })?;
        ensure(
            c.shmem.context().ordinal() == c.shmem.device_ordinal(),
            || "context on another GPU".into(),
        )?;
        refused("a second init", Nvshmem::init().map(|_| ()), |e| {
            matches!(e, Error::AlreadyInitialized)
        })
    });

    h.check("unique ID round trip", |_| {
        // A launcher-started process cannot make an ID (NVSHMEM would crash); the real
        // unique-ID start is exercised by `hello --uid-file`. Here: PE 0's bytes, handed
        // round as a launcher-free program would, survive the round trip.
        refused(
            "UniqueId::new after init",
            UniqueId::new().map(|_| ()),
            |e| matches!(e, Error::InvalidArgument(_)),
        )?;
        let mut rng = Rng::new(0x1d, 0);
        let local: Vec<u8> = (0..UniqueId::SIZE).map(|_| rng.next() as u8).collect();
        let src = c.upload(&local)?;
        let dst = c.zeros::<u8>(UniqueId::SIZE)?;
        c.world.broadcast(&dst, &src, 0, &c.stream)?;
        c.sync()?;
        let received = dst.to_vec()?;
        same(
            "to_bytes(from_bytes(b))",
            &UniqueId::from_bytes(&local)?.to_bytes(),
            &local[..],
        )?;
        same(
            "received ID",
            &UniqueId::from_bytes(&received)?.to_bytes(),
            &received[..],
        )?;
        if c.me == 0 {
            same("broadcast of PE 0's ID", &received, &local)?;
        }
        refused(
            "a short ID",
            UniqueId::from_bytes(&local[1..]),
            length_error,
        )
    });

    h.check("teams: world, shared, node, translate_pe", |_| {
        let (world, shared, node) = (&c.world, c.shmem.team_shared(), c.shmem.team_node());
        ensure(world.n_pes() == c.n && world.my_pe() == Some(c.me), || {
            format!("{world:?}")
        })?;
        let sp = shared.my_pe().ok_or("not in the shared team")?;
        ensure(sp < shared.n_pes() && shared.n_pes() <= c.n, || {
            format!("{shared:?}")
        })?;
        ensure(
            node.n_pes() == c.shmem.node_n_pes() && node.my_pe() == Some(c.shmem.node_pe()),
            || format!("{node:?}"),
        )?;
        ensure(
            world.translate_pe(c.me, &node)? == Some(c.shmem.node_pe()),
            || "world -> node".into(),
        )?;
        ensure(node.world_pe(c.shmem.node_pe())? == c.me, || {
            "node -> world".into()
        })?;
        ensure(shared.world_pe(sp)? == c.me, || "shared -> world".into())?;
        refused(
            "translate_pe of PE n",
            world.translate_pe(c.n, &node),
            pe_error,
        )?;
        refused("world_pe of PE n", node.world_pe(node.n_pes()), pe_error)
    });

    h.check("teams: split_strided", |_| {
        let mut p = Problems::default();
        let evens = c.evens()?;
        match (&evens, c.me % 2) {
            (Some(t), 0) => {
                p.note(ensure(
                    t.my_pe() == Some(c.me / 2) && t.n_pes() == c.n.div_ceil(2),
                    || format!("{t:?}"),
                ));
                for k in 0..t.n_pes() {
                    p.note(
                        t.world_pe(k)
                            .map_err(Into::into)
                            .and_then(|w| ensure(w == 2 * k, || format!("even {k} is PE {w}"))),
                    );
                }
                p.note(ensure(
                    matches!(c.world.translate_pe(c.me, t), Ok(Some(x)) if x == c.me / 2),
                    || "world -> evens".into(),
                ));
            }
            (None, 1) => {}
            _ => p.note(Err(format!("membership wrong: {}", evens.is_some()).into())),
        }
        p.note(refused(
            "a split past the end",
            c.world.split_strided(0, 2, c.n + 1),
            argument_error,
        ));
        p.note(refused(
            "a split of stride 0",
            c.world.split_strided(0, 0, 1),
            argument_error,
        ));
        p.done()
    });

    h.check("teams: split_2d", |_| {
        let (x, y) = c.world.split_2d(2)?;
        let x = x.ok_or("no row team")?;
        let y = y.ok_or("no column team")?;
        let row_len = 2.min(c.n - 2 * (c.me / 2));
        let col_len = (0..c.n).filter(|p| p % 2 == c.me % 2).count();
        ensure(x.my_pe() == Some(c.me % 2) && x.n_pes() == row_len, || {
            format!("row {x:?}")
        })?;
        ensure(y.my_pe() == Some(c.me / 2) && y.n_pes() == col_len, || {
            format!("column {y:?}")
        })?;
        ensure(y.world_pe(0)? == c.me % 2, || "column's first PE".into())?;
        refused("split_2d(0)", c.world.split_2d(0), argument_error)
    });

    h.check("malloc, calloc, malloc_aligned, host copies", |seed| {
        let sh = &c.shmem;
        let big = 1 << 20;
        let a = sh.malloc::<f32>(big)?;
        let z = sh.calloc::<u64>(777)?;
        let al = sh.malloc_aligned::<u16>(4096, 300)?;
        let empty = sh.malloc::<u8>(0)?;
        same("calloc", &z.to_vec()?, &vec![0u64; 777])?;
        ensure(al.device_ptr() % 4096 == 0 && al.len() == 300, || {
            format!("{al:?} not aligned")
        })?;
        ensure(empty.is_empty() && empty.to_vec()?.is_empty(), || {
            "empty buffer".into()
        })?;
        let x = data::<f32>(seed, c.me, big, Kind::Arith);
        a.copy_from_host(&x)?;
        same("round trip", &a.to_vec()?, &x)?;
        ensure(
            a.len() == big && a.num_bytes() == 4 * big && !a.is_empty(),
            || "sizes".into(),
        )?;
        ensure(
            a.runtime().my_pe() == c.me && a.device_ptr() == a.as_ptr() as u64,
            || "pointers".into(),
        )?;
        let y = data::<u16>(seed ^ 1, c.me, 300, Kind::Bits);
        al.copy_from_host(&y)?;
        let mut back = vec![0u16; 300];
        al.copy_to_host(&mut back)?;
        same("aligned round trip", &back, &y)?;
        refused(
            "malloc_aligned(3)",
            sh.malloc_aligned::<u32>(3, 10),
            argument_error,
        )?;
        refused(
            "a short host source",
            a.copy_from_host(&x[1..]),
            length_error,
        )?;
        refused(
            "a long host destination",
            al.copy_to_host(&mut vec![0u16; 301]),
            length_error,
        )?;
        // Freeing is collective: the same order on every PE, here the order the drops of an
        // early return would take.
        empty.free()?;
        al.free()?;
        z.free()?;
        a.free()?;
        Ok(())
    });

    h.check("views and peer pointers", |seed| {
        let buf = c.upload(&data::<i32>(seed, c.me, 1000, Kind::Bits))?;
        let x = buf.to_vec()?;
        let v = buf.view(100..200);
        ensure(
            v.len() == 100 && !v.is_empty() && v.as_ptr() == unsafe { buf.as_ptr().add(100) },
            || "view geometry".into(),
        )?;
        same("view contents", &v.to_vec()?, &x[100..200])?;
        same("inclusive view", &buf.view(..=9).to_vec()?, &x[..10])?;
        let fresh = data::<i32>(seed ^ 7, c.me, 100, Kind::Bits);
        v.copy_from_host(&fresh)?;
        let mut want = x.clone();
        want[100..200].copy_from_slice(&fresh);
        same("write through a view", &buf.to_vec()?, &want)?;
        let mut part = vec![0; 100];
        v.copy_to_host(&mut part)?;
        same("view copy_to_host", &part, &fresh)?;
        refused(
            "a view past the end",
            buf.try_view(990..1001).map(|v| v.len()),
            argument_error,
        )?;
        ensure(
            buf.try_view(1000..).map(|v| v.is_empty()).unwrap_or(false),
            || "empty view at the end".into(),
        )?;
        let shared = c.shmem.team_shared();
        for pe in 0..c.n {
            // PEs of the shared team are load/store reachable; others may or may not be.
            let p = buf.peer_ptr(pe)?;
            let in_shared = c.world.translate_pe(pe, &shared)?.is_some();
            ensure(p.is_some() || !in_shared, || {
                format!("no peer_ptr to PE {pe} of the shared team")
            })?;
        }
        ensure(v.peer_ptr(c.me)?.is_some(), || {
            "no pointer to our own view".into()
        })?;
        refused("peer_ptr(n)", buf.peer_ptr(c.n), pe_error)
    });
}

// ---------------------------------------------------------------------------------------------
// Put and get.

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
    let (sh, s) = (&c.shmem, &*c.stream);
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
    let (sh, s) = (&c.shmem, &*c.stream);
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
    let (sh, s) = (&c.shmem, &*c.stream);
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
    let (sh, s) = (&c.shmem, &*c.stream);
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

fn rma_checks(h: &mut Harness) {
    rma_for::<u8>(h, 65_539);
    rma_for::<i32>(h, 100_003);
    rma_for::<f64>(h, 262_147); // 2 MiB
    rma_for::<bf16>(h, 1_001);
    rma_for::<i16>(h, 17);
    rma_for::<f16>(h, 5);
}

// ---------------------------------------------------------------------------------------------
// Signals.

#[derive(Clone, Copy, Debug)]
enum SigMode {
    Blocking,
    Nbi,
    OnStream,
    NbiOnStream,
}

/// Every PE puts its data into the next PE with a signal, and waits for its own.
fn check_put_signal<T: Num>(c: &Ctx, seed: u64, len: usize, mode: SigMode) -> Result {
    let (sh, s) = (&c.shmem, &*c.stream);
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

fn signal_checks(h: &mut Harness) {
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
            let (sh, s) = (&c.shmem, &*c.stream);
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
            let (sh, s) = (&c.shmem, &*c.stream);
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

// ---------------------------------------------------------------------------------------------
// Atomics.

/// The all-ones value of an atomic integer type.
trait Ones: Num + AtomicInteger {
    fn ones() -> Self;
}

macro_rules! ones {
    ($($t:ty),*) => {$(impl Ones for $t { fn ones() -> Self { !0 } })*};
}

ones!(i32, i64, u32, u64);

fn small<T: Num>(x: usize) -> T {
    T::from_f64(x as f64)
}

fn as_u64<T: Num>(x: T) -> u64 {
    x.to_f64() as u64
}

/// Every PE adds and increments counters on PE 0; the fetched values must be a consistent
/// order of the updates.
fn check_add_inc<T: Ones>(c: &Ctx) -> Result {
    let sh = &c.shmem;
    let buf = c.zeros::<T>(4)?;
    let mut p = Problems::default();
    let fetched_add = sh.atomic_fetch_add(&buf, 0, small::<T>(c.me + 1), 0)?;
    sh.atomic_add(&buf, 1, small::<T>(2), 0)?;
    let ticket = sh.atomic_fetch_inc(&buf, 2, 0)?;
    sh.atomic_inc(&buf, 3, 0)?;
    sh.quiet()?;
    sh.barrier_all()?;
    let finals: Vec<T> = (0..4)
        .map(|i| sh.atomic_fetch(&buf, i, 0))
        .collect::<nvshmem::Result<_>>()?;
    let n = c.n;
    p.note(same(
        "counters on PE 0",
        &finals,
        &[small(n * (n + 1) / 2), small(2 * n), small(n), small(n)],
    ));
    // Everyone's fetched values, gathered.
    let mine = c.upload(&[as_u64(fetched_add), as_u64(ticket)])?;
    let all = sh.malloc::<u64>(2 * n)?;
    c.world.fcollect(&all, &mine, &c.stream)?;
    c.sync()?;
    let all = all.to_vec()?;
    let mut tickets: Vec<u64> = all.chunks(2).map(|x| x[1]).collect();
    tickets.sort_unstable();
    p.note(same(
        "fetch_inc tickets",
        &tickets,
        &(0..n as u64).collect::<Vec<_>>(),
    ));
    // Ordered by what they saw, the fetch-adds must chain: each saw the previous plus its add.
    let mut adds: Vec<(u64, usize)> = all.chunks(2).map(|x| x[0]).zip(0..n).collect();
    adds.sort_unstable();
    let mut expect = 0;
    for (seen, pe) in adds {
        p.note(ensure(seen == expect, || {
            format!("PE {pe}'s fetch_add saw {seen}, expected {expect}")
        }));
        expect = seen + pe as u64 + 1;
    }
    p.done()
}

/// One PE wins a compare-and-swap race on PE 0; then every PE increments with a CAS loop.
fn check_compare_swap<T: Ones>(c: &Ctx) -> Result {
    let sh = &c.shmem;
    let buf = c.zeros::<T>(1)?;
    let mut p = Problems::default();
    let old = sh.atomic_compare_swap(&buf, 0, small::<T>(0), small::<T>(c.me + 1), 0)?;
    let mine = c.upload(&[as_u64(old)])?;
    let all = sh.malloc::<u64>(c.n)?;
    c.world.fcollect(&all, &mine, &c.stream)?;
    c.sync()?;
    let olds = all.to_vec()?;
    let winners: Vec<usize> = (0..c.n).filter(|&q| olds[q] == 0).collect();
    let winner = winners.first().copied().unwrap_or(0);
    p.note(ensure(winners.len() == 1, || {
        format!("{} PEs won the swap", winners.len())
    }));
    for (q, &o) in olds.iter().enumerate() {
        if q != winner {
            p.note(ensure(o == winner as u64 + 1, || {
                format!("PE {q} saw {o}, winner was PE {winner}")
            }));
        }
    }
    sh.barrier_all()?;
    const ROUNDS: usize = 3;
    for round in 0..ROUNDS {
        // Bounded: a CAS that never succeeds is a failure, not a hang. `?` stops at the first
        // error.
        let mut done = false;
        for _ in 0..MAX_ATTEMPTS {
            let cur = sh.atomic_fetch(&buf, 0, 0)?;
            let next = small::<T>(as_u64(cur) as usize + 1);
            if sh.atomic_compare_swap(&buf, 0, cur, next, 0)? == cur {
                done = true;
                break;
            }
        }
        if !done {
            return Err(format!(
                "CAS increment round {round} did not succeed in {MAX_ATTEMPTS} attempts"
            )
            .into());
        }
    }
    sh.quiet()?;
    sh.barrier_all()?;
    let end = as_u64(sh.atomic_fetch(&buf, 0, 0)?);
    p.note(ensure(end == (winner + 1 + ROUNDS * c.n) as u64, || {
        format!("after the CAS loops: {end}")
    }));
    p.done()
}

/// Whether `x` is `init` combined by `op` with some subset of `others`.
fn from_some_subset<T: Num>(op: ReduceOp, init: T, others: &[T], x: T) -> bool {
    if others.len() > 16 {
        return true; // too many subsets to try
    }
    (0u32..1 << others.len()).any(|mask| {
        let mut v = vec![init];
        v.extend(
            others
                .iter()
                .enumerate()
                .filter(|(i, _)| mask >> i & 1 == 1)
                .map(|(_, &o)| o),
        );
        T::reference(op, &v) == x
    })
}

/// Every PE ANDs, ORs and XORs a random value into PE 0's words; what each fetched must be the
/// start value combined with some of the other PEs' values.
fn check_bitwise<T: Ones>(c: &Ctx, seed: u64) -> Result {
    let sh = &c.shmem;
    let buf = c.upload(&[T::ones(), T::default(), T::default()])?;
    sh.barrier_all()?;
    let v = |q: usize| data::<T>(seed, q, 3, Kind::Bits);
    let mine = v(c.me);
    let fetched = [
        sh.atomic_fetch_and(&buf, 0, mine[0], 0)?,
        sh.atomic_fetch_or(&buf, 1, mine[1], 0)?,
        sh.atomic_fetch_xor(&buf, 2, mine[2], 0)?,
    ];
    sh.quiet()?;
    sh.barrier_all()?;
    let all: Vec<Vec<T>> = (0..c.n).map(v).collect();
    let ops = [
        (ReduceOp::And, T::ones()),
        (ReduceOp::Or, T::default()),
        (ReduceOp::Xor, T::default()),
    ];
    let mut p = Problems::default();
    let got: Vec<T> = (0..3)
        .map(|i| sh.atomic_fetch(&buf, i, 0))
        .collect::<nvshmem::Result<_>>()?;
    for (i, &(op, init)) in ops.iter().enumerate() {
        let everyone: Vec<T> = std::iter::once(init)
            .chain(all.iter().map(|x| x[i]))
            .collect();
        let want = T::reference(op, &everyone);
        p.note(ensure(got[i] == want, || {
            format!("{op:?}: PE 0 holds {:?}, expected {want:?}", got[i])
        }));
        let others: Vec<T> = (0..c.n).filter(|&q| q != c.me).map(|q| all[q][i]).collect();
        p.note(ensure(
            from_some_subset(op, init, &others, fetched[i]),
            || {
                format!(
                    "{op:?}: fetched {:?}, which no order of the updates explains",
                    fetched[i]
                )
            },
        ));
    }
    p.done()
}

/// Every PE sets, reads and swaps a slot on the next PE.
fn check_set_fetch_swap<T: Num + nvshmem::AtomicElement>(c: &Ctx, seed: u64) -> Result {
    let sh = &c.shmem;
    let buf = c.zeros::<T>(c.n)?;
    let v = |q: usize| data::<T>(seed, q, 2, Kind::Arith);
    let (mine, theirs) = (v(c.me), v(c.left));
    let mut p = Problems::default();
    sh.atomic_set(&buf, c.me, mine[0], c.right)?;
    sh.quiet()?;
    sh.barrier_all()?;
    p.note(ensure(buf.to_vec()?[c.left] == theirs[0], || {
        "atomic_set did not land".into()
    }));
    p.note(ensure(
        sh.atomic_fetch(&buf, c.me, c.right)? == mine[0],
        || "remote atomic_fetch".into(),
    ));
    p.note(ensure(
        sh.atomic_fetch(&buf, c.left, c.me)? == theirs[0],
        || "local atomic_fetch".into(),
    ));
    sh.barrier_all()?;
    let old = sh.atomic_swap(&buf, c.me, mine[1], c.right)?;
    p.note(ensure(old == mine[0], || {
        format!("atomic_swap returned {old:?}, expected {:?}", mine[0])
    }));
    sh.quiet()?;
    sh.barrier_all()?;
    let now = buf.to_vec()?;
    p.note(ensure(now[c.left] == theirs[1], || {
        format!("after swap: {:?}, expected {:?}", now[c.left], theirs[1])
    }));
    p.note(ensure(
        now.iter()
            .enumerate()
            .all(|(i, x)| i == c.left || *x == T::default()),
        || "stray writes".into(),
    ));
    p.done()
}

fn atomic_for<T: Ones>(h: &mut Harness) {
    let c = h.ctx;
    let t = T::NVSHMEM_NAME;
    h.check(format!("atomic_fetch_add/add/fetch_inc/inc<{t}>"), |_| {
        check_add_inc::<T>(c)
    });
    h.check(format!("atomic_compare_swap<{t}>"), |_| {
        check_compare_swap::<T>(c)
    });
    h.check(format!("atomic_fetch_and/or/xor<{t}>"), |seed| {
        check_bitwise::<T>(c, seed)
    });
}

fn atomic_checks(h: &mut Harness) {
    atomic_for::<i32>(h);
    atomic_for::<i64>(h);
    atomic_for::<u32>(h);
    atomic_for::<u64>(h);
    let c = h.ctx;
    h.check("atomic_set/fetch/swap<float>", |seed| {
        check_set_fetch_swap::<f32>(c, seed)
    });
    h.check("atomic_set/fetch/swap<double>", |seed| {
        check_set_fetch_swap::<f64>(c, seed)
    });
    h.check("atomic_set/fetch/swap<int32>", |seed| {
        check_set_fetch_swap::<i32>(c, seed)
    });
    h.check("atomic_set/fetch/swap<uint64>", |seed| {
        check_set_fetch_swap::<u64>(c, seed)
    });
}

// ---------------------------------------------------------------------------------------------
// Ordering and synchronisation.

/// How the PEs in `members` (world numbers) are brought in step after writing to each other.
#[derive(Clone, Copy, Debug)]
enum Step {
    BarrierAll,
    Barrier,
    SyncAll,
    Sync,
    BarrierAllOnStream,
    BarrierOnStream,
    SyncAllOnStream,
    SyncOnStream,
}

/// Every member writes `me + 1` into its slot on every member, then the members step together
/// with `step` (over `team` where it takes one) and check every slot.
fn check_step(c: &Ctx, team: Option<&Team>, step: Step) -> Result {
    let (sh, s) = (&c.shmem, &*c.stream);
    let buf = c.zeros::<u32>(c.n)?;
    let members: Vec<usize> = match team {
        Some(t) => (0..t.n_pes())
            .map(|k| t.world_pe(k))
            .collect::<nvshmem::Result<_>>()?,
        None => (0..c.n).collect(),
    };
    let on_stream = matches!(
        step,
        Step::BarrierAllOnStream
            | Step::BarrierOnStream
            | Step::SyncAllOnStream
            | Step::SyncOnStream
    );
    for &pe in &members {
        if on_stream {
            sh.p_on_stream(&buf, c.me, c.me as u32 + 1, pe, s)?;
        } else {
            sh.p(&buf, c.me, c.me as u32 + 1, pe)?;
        }
    }
    let team_or_world = team.unwrap_or(&c.world);
    match step {
        Step::BarrierAll => sh.barrier_all()?,
        Step::Barrier => sh.barrier(team_or_world)?,
        Step::SyncAll => {
            sh.quiet()?;
            sh.sync_all()?;
        }
        Step::Sync => {
            sh.quiet()?;
            sh.sync(team_or_world)?;
        }
        Step::BarrierAllOnStream => sh.barrier_all_on_stream(s)?,
        Step::BarrierOnStream => sh.barrier_on_stream(team_or_world, s)?,
        Step::SyncAllOnStream => {
            sh.quiet_on_stream(s)?;
            sh.sync_all_on_stream(s)?;
        }
        Step::SyncOnStream => {
            sh.quiet_on_stream(s)?;
            sh.sync_on_stream(team_or_world, s)?;
        }
    }
    c.sync()?;
    let got = buf.to_vec()?;
    let want: Vec<u32> = (0..c.n)
        .map(|q| {
            if members.contains(&q) {
                q as u32 + 1
            } else {
                0
            }
        })
        .collect();
    same("slots", &got, &want)
}

/// `wait_until` (or its stream form) for every comparison, on a value the previous PE wrote.
fn check_wait_until<T: Ones>(c: &Ctx, on_stream: bool) -> Result {
    let (sh, s) = (&c.shmem, &*c.stream);
    let ivar = c.zeros::<T>(2)?;
    let expect = small::<T>(c.left + 1);
    if on_stream {
        sh.p_on_stream(&ivar, 1, small::<T>(c.me + 1), c.right, s)?;
        sh.quiet_on_stream(s)?;
    } else {
        sh.p(&ivar, 1, small::<T>(c.me + 1), c.right)?;
        sh.quiet()?;
    }
    let cases = [
        (Cmp::Eq, expect),
        (Cmp::Ne, small::<T>(0)),
        (Cmp::Gt, small::<T>(0)),
        (Cmp::Ge, expect),
        (Cmp::Lt, small::<T>(c.left + 2)),
        (Cmp::Le, expect),
    ];
    for (cmp, v) in cases {
        if on_stream {
            sh.wait_until_on_stream(&ivar, 1, cmp, v, s)?;
        } else {
            sh.wait_until(&ivar, 1, cmp, v)?;
        }
    }
    c.sync()?;
    same("wait variables", &ivar.to_vec()?, &[T::default(), expect])
}

fn sync_checks(h: &mut Harness) {
    let c = h.ctx;
    h.check("quiet and fence", |_| {
        let sh = &c.shmem;
        let buf = c.zeros::<i32>(2)?;
        sh.p(&buf, 0, 1, c.right)?;
        sh.fence()?;
        sh.p(&buf, 1, 2, c.right)?;
        sh.quiet()?;
        sh.barrier_all()?;
        same("values", &buf.to_vec()?, &[1, 2])
    });
    for step in [
        Step::BarrierAll,
        Step::SyncAll,
        Step::BarrierAllOnStream,
        Step::SyncAllOnStream,
    ] {
        h.check(format!("{step:?} after p to all PEs"), |_| {
            check_step(c, None, step)
        });
    }
    for step in [
        Step::Barrier,
        Step::Sync,
        Step::BarrierOnStream,
        Step::SyncOnStream,
    ] {
        h.check(format!("{step:?} over the world team"), |_| {
            check_step(c, Some(&c.world), step)
        });
        h.check(format!("{step:?} over the node team"), |_| {
            check_step(c, Some(&c.shmem.team_node()), step)
        });
        h.check(format!("{step:?} over the even PEs"), |_| {
            let evens = c.evens()?;
            match &evens {
                Some(t) => check_step(c, Some(t), step),
                // Odd PEs still allocate, as the check's allocation is collective.
                None => c.zeros::<u32>(c.n).map(|_| ()),
            }
        });
    }
    h.check("wait_until<int32>", |_| check_wait_until::<i32>(c, false));
    h.check("wait_until<int64>", |_| check_wait_until::<i64>(c, false));
    h.check("wait_until<uint32>", |_| check_wait_until::<u32>(c, false));
    h.check("wait_until<uint64>", |_| check_wait_until::<u64>(c, false));
    h.check("wait_until_on_stream<int32>", |_| {
        check_wait_until::<i32>(c, true)
    });
    h.check("wait_until_on_stream<uint64>", |_| {
        check_wait_until::<u64>(c, true)
    });
}

// ---------------------------------------------------------------------------------------------
// Collectives.

/// All-reduce of every applicable operator over `team` (world numbers `members`).
fn check_all_reduce<T: Num>(
    c: &Ctx,
    seed: u64,
    len: usize,
    team: &Team,
    members: &[usize],
) -> Result {
    let sh = &c.shmem;
    let src = sh.malloc::<T>(len)?;
    let dst = sh.malloc::<T>(len)?;
    let mut p = Problems::default();
    for (k, op) in ReduceOp::ALL.into_iter().enumerate() {
        if op.is_bitwise() && !T::IS_INTEGER {
            continue;
        }
        let seed = seed ^ ((k as u64 + 1) << 56);
        let kind = Kind::for_op(op);
        src.copy_from_host(&data::<T>(seed, c.me, len, kind))?;
        team.all_reduce(op, &dst, &src, &c.stream)?;
        c.sync()?;
        let got = dst.to_vec()?;
        let inputs: Vec<Vec<T>> = members
            .iter()
            .map(|&q| data::<T>(seed, q, len, kind))
            .collect();
        let mut column = vec![T::default(); members.len()];
        let mut bad = 0;
        let mut first = None;
        for i in 0..len {
            for (slot, x) in column.iter_mut().zip(&inputs) {
                *slot = x[i];
            }
            let want = T::reference(op, &column);
            if !agrees(op, got[i], want, &column) {
                bad += 1;
                first.get_or_insert(format!("first at {i}: got {:?}, expected {want:?}", got[i]));
            }
        }
        if let Some(first) = first {
            p.note(Err(format!("{op:?}: {bad} of {len} wrong; {first}").into()));
        }
        // Nobody overwrites its source while another PE may still read it.
        sh.barrier_all()?;
    }
    p.done()
}

fn check_all_reduce_world<T: Num>(c: &Ctx, seed: u64, len: usize) -> Result {
    check_all_reduce::<T>(c, seed, len, &c.world, &(0..c.n).collect::<Vec<_>>())
}

fn check_reduce_scatter<T: Num>(c: &Ctx, seed: u64, per_pe: usize) -> Result {
    let sh = &c.shmem;
    let n = c.n;
    let src = sh.malloc::<T>(per_pe * n)?;
    let dst = sh.malloc::<T>(per_pe)?;
    let mut p = Problems::default();
    for (k, op) in ReduceOp::ALL.into_iter().enumerate() {
        if op.is_bitwise() && !T::IS_INTEGER {
            continue;
        }
        let seed = seed ^ ((k as u64 + 1) << 56);
        let kind = Kind::for_op(op);
        src.copy_from_host(&data::<T>(seed, c.me, per_pe * n, kind))?;
        c.world.reduce_scatter(op, &dst, &src, &c.stream)?;
        c.sync()?;
        let got = dst.to_vec()?;
        let inputs: Vec<Vec<T>> = (0..n)
            .map(|q| data::<T>(seed, q, per_pe * n, kind))
            .collect();
        let mut bad = Vec::new();
        for i in 0..per_pe {
            let column: Vec<T> = inputs.iter().map(|x| x[c.me * per_pe + i]).collect();
            let want = T::reference(op, &column);
            if !agrees(op, got[i], want, &column) {
                bad.push(format!("at {i}: got {:?}, expected {want:?}", got[i]));
            }
        }
        if let Some(first) = bad.first() {
            p.note(Err(format!(
                "{op:?}: {} of {per_pe} wrong; first {first}",
                bad.len()
            )
            .into()));
        }
        sh.barrier_all()?;
    }
    p.done()
}

fn check_fcollect<T: Num>(
    c: &Ctx,
    seed: u64,
    per_pe: usize,
    team: &Team,
    members: &[usize],
    alias: bool,
) -> Result {
    let src = c.upload(&data::<T>(seed, c.me, per_pe, Kind::Bits))?;
    // Sized for the world: team sizes may differ between PEs (node teams), allocations may not.
    let dst = c.zeros::<T>(per_pe * c.n)?;
    let used = dst.view(..per_pe * members.len());
    if alias {
        team.all_gather(used, &src, &c.stream)?;
    } else {
        team.fcollect(used, &src, &c.stream)?;
    }
    c.sync()?;
    let want: Vec<T> = members
        .iter()
        .flat_map(|&q| data::<T>(seed, q, per_pe, Kind::Bits))
        .collect();
    same("gathered", &used.to_vec()?, &want)
}

fn check_broadcast<T: Num>(c: &Ctx, seed: u64, len: usize, root: usize) -> Result {
    let src = c.upload(&data::<T>(seed, c.me, len, Kind::Bits))?;
    let dst = c.zeros::<T>(len)?;
    c.world.broadcast(&dst, &src, root, &c.stream)?;
    c.sync()?;
    same(
        "received",
        &dst.to_vec()?,
        &data::<T>(seed, root, len, Kind::Bits),
    )
}

fn check_alltoall<T: Num>(c: &Ctx, seed: u64, per_pair: usize) -> Result {
    let n = c.n;
    let src = c.upload(&data::<T>(seed, c.me, per_pair * n, Kind::Bits))?;
    let dst = c.zeros::<T>(per_pair * n)?;
    c.world.alltoall(&dst, &src, &c.stream)?;
    c.sync()?;
    let want: Vec<T> = (0..n)
        .flat_map(|q| {
            data::<T>(seed, q, per_pair * n, Kind::Bits)[c.me * per_pair..(c.me + 1) * per_pair]
                .to_vec()
        })
        .collect();
    same("received blocks", &dst.to_vec()?, &want)
}

fn collective_checks(h: &mut Harness) {
    let c = h.ctx;
    h.check("all_reduce<int8>", |seed| {
        check_all_reduce_world::<i8>(c, seed, 4099)
    });
    h.check("all_reduce<int16>", |seed| {
        check_all_reduce_world::<i16>(c, seed, 4099)
    });
    h.check("all_reduce<int32>", |seed| {
        check_all_reduce_world::<i32>(c, seed, 4099)
    });
    h.check("all_reduce<int64>", |seed| {
        check_all_reduce_world::<i64>(c, seed, 4099)
    });
    h.check("all_reduce<uint8>", |seed| {
        check_all_reduce_world::<u8>(c, seed, 4099)
    });
    h.check("all_reduce<uint16>", |seed| {
        check_all_reduce_world::<u16>(c, seed, 4099)
    });
    h.check("all_reduce<uint32>", |seed| {
        check_all_reduce_world::<u32>(c, seed, 4099)
    });
    h.check("all_reduce<uint64>", |seed| {
        check_all_reduce_world::<u64>(c, seed, 4099)
    });
    h.check("all_reduce<float>", |seed| {
        check_all_reduce_world::<f32>(c, seed, 4099)
    });
    h.check("all_reduce<double>", |seed| {
        check_all_reduce_world::<f64>(c, seed, 4099)
    });
    h.check("all_reduce<half>", |seed| {
        check_all_reduce_world::<f16>(c, seed, 4099)
    });
    h.check("all_reduce<bfloat16>", |seed| {
        check_all_reduce_world::<bf16>(c, seed, 4099)
    });
    h.check("all_reduce<float> of 1 Mi elements", |seed| {
        check_all_reduce_world::<f32>(c, seed, 1 << 20)
    });
    h.check("all_reduce<int32> in place", |seed| {
        let x = data::<i32>(seed, c.me, 1000, Kind::Arith);
        let buf = c.upload(&x)?;
        c.world.all_reduce(ReduceOp::Sum, &buf, &buf, &c.stream)?;
        c.sync()?;
        let want: Vec<i32> = (0..1000)
            .map(|i| {
                (0..c.n)
                    .map(|q| data::<i32>(seed, q, 1000, Kind::Arith)[i])
                    .sum()
            })
            .collect();
        same("sums", &buf.to_vec()?, &want)
    });
    h.check("all_reduce<int64> over the even PEs", |seed| {
        let evens = c.evens()?;
        match &evens {
            Some(t) => {
                let members: Vec<usize> = (0..c.n).step_by(2).collect();
                check_all_reduce::<i64>(c, seed, 513, t, &members)
            }
            None => {
                // The allocations are collective over the world; match them.
                let _src = c.shmem.malloc::<i64>(513)?;
                let _dst = c.shmem.malloc::<i64>(513)?;
                for _ in 0..ReduceOp::ALL.len() {
                    c.shmem.barrier_all()?;
                }
                Ok(())
            }
        }
    });

    h.check("reduce_scatter<int32>", |seed| {
        check_reduce_scatter::<i32>(c, seed, 257)
    });
    h.check("reduce_scatter<uint64>", |seed| {
        check_reduce_scatter::<u64>(c, seed, 100)
    });
    h.check("reduce_scatter<int8>", |seed| {
        check_reduce_scatter::<i8>(c, seed, 64)
    });
    h.check("reduce_scatter<float>", |seed| {
        check_reduce_scatter::<f32>(c, seed, 257)
    });
    h.check("reduce_scatter<bfloat16>", |seed| {
        check_reduce_scatter::<bf16>(c, seed, 130)
    });
    h.check("reduce_scatter<double>", |seed| {
        check_reduce_scatter::<f64>(c, seed, 33)
    });

    let world: Vec<usize> = (0..c.n).collect();
    h.check("fcollect<uint8>", |seed| {
        check_fcollect::<u8>(c, seed, 1001, &c.world, &world, false)
    });
    h.check("fcollect<int64>", |seed| {
        check_fcollect::<i64>(c, seed, 4097, &c.world, &world, false)
    });
    h.check("fcollect<double>", |seed| {
        check_fcollect::<f64>(c, seed, 65_536, &c.world, &world, false)
    });
    h.check("fcollect<half>", |seed| {
        check_fcollect::<f16>(c, seed, 333, &c.world, &world, false)
    });
    h.check("all_gather<int16>", |seed| {
        check_fcollect::<i16>(c, seed, 999, &c.world, &world, true)
    });
    h.check("fcollect<uint32> over the node team", |seed| {
        let node = c.shmem.team_node();
        let members: Vec<usize> = (0..node.n_pes())
            .map(|k| node.world_pe(k))
            .collect::<nvshmem::Result<_>>()?;
        check_fcollect::<u32>(c, seed, 100, &node, &members, false)
    });

    let last = c.n - 1;
    h.check("broadcast<int16> from PE 0", |seed| {
        check_broadcast::<i16>(c, seed, 1001, 0)
    });
    h.check("broadcast<float> from the last PE", |seed| {
        check_broadcast::<f32>(c, seed, 70_001, last)
    });
    h.check("broadcast<bfloat16> from the last PE", |seed| {
        check_broadcast::<bf16>(c, seed, 77, last)
    });
    h.check("broadcast<uint64> from PE 0", |seed| {
        check_broadcast::<u64>(c, seed, 4096, 0)
    });

    h.check("alltoall<int32>", |seed| {
        check_alltoall::<i32>(c, seed, 513)
    });
    h.check("alltoall<double>", |seed| {
        check_alltoall::<f64>(c, seed, 1000)
    });
    h.check("alltoall<uint16>", |seed| check_alltoall::<u16>(c, seed, 7));
    h.check("alltoall<bfloat16>", |seed| {
        check_alltoall::<bf16>(c, seed, 64)
    });
}

// ---------------------------------------------------------------------------------------------
// Errors: every one of these must come back as an error, before NVSHMEM is called (no PE waits).

fn error_checks(h: &mut Harness) {
    let c = h.ctx;
    let n = c.n;
    h.check("errors: RMA", |_| {
        let sh = &c.shmem;
        let (a, b) = (c.zeros::<i32>(8)?, c.zeros::<i32>(9)?);
        let s = &*c.stream;
        let mut p = Problems::default();
        p.note(refused("put to PE n", sh.put(&a, &a, n), pe_error));
        p.note(refused(
            "put_nbi of unequal lengths",
            sh.put_nbi(&a, &b, 0),
            length_error,
        ));
        p.note(refused(
            "put_on_stream to PE n",
            sh.put_on_stream(&a, &a, n, s),
            pe_error,
        ));
        p.note(refused(
            "put_nbi_on_stream of unequal lengths",
            sh.put_nbi_on_stream(&b, &a, 0, s),
            length_error,
        ));
        p.note(refused(
            "get from PE n + 3",
            sh.get(&a, &a, n + 3),
            pe_error,
        ));
        p.note(refused(
            "get_nbi of unequal lengths",
            sh.get_nbi(&b, &a, 0),
            length_error,
        ));
        p.note(refused(
            "get_on_stream of unequal lengths",
            sh.get_on_stream(&a, &b, 0, s),
            length_error,
        ));
        p.note(refused(
            "get_nbi_on_stream from PE n",
            sh.get_nbi_on_stream(&a, &a, n, s),
            pe_error,
        ));
        p.note(refused("p past the end", sh.p(&a, 8, 1, 0), argument_error));
        p.note(refused("p to PE n", sh.p(&a, 0, 1, n), pe_error));
        p.note(refused(
            "g past the end",
            sh.g(a.view(2..4), 2, 0),
            argument_error,
        ));
        p.note(refused("g from PE n", sh.g(&a, 0, n), pe_error));
        p.note(refused(
            "p_on_stream past the end",
            sh.p_on_stream(&b, 9, 1, 0, s),
            argument_error,
        ));
        p.note(refused(
            "g_on_stream from PE n",
            sh.g_on_stream(&b, 0, n, s),
            pe_error,
        ));
        // Empty transfers are fine and do nothing.
        p.note(
            sh.put(a.view(0..0), b.view(9..), c.right)
                .map_err(Into::into),
        );
        p.note(
            sh.get_on_stream(a.view(8..), b.view(0..0), c.right, s)
                .map_err(Into::into),
        );
        p.done()
    });

    h.check("errors: signals", |_| {
        let sh = &c.shmem;
        let (a, b) = (c.zeros::<u8>(16)?, c.zeros::<u8>(15)?);
        let sig = c.zeros::<u64>(2)?;
        let s = &*c.stream;
        let mut p = Problems::default();
        p.note(refused(
            "put_signal to PE n",
            sh.put_signal(&a, &a, &sig, 0, 1, SignalOp::Set, n),
            pe_error,
        ));
        p.note(refused(
            "put_signal with signal 2 of 2",
            sh.put_signal(&a, &a, &sig, 2, 1, SignalOp::Set, 0),
            argument_error,
        ));
        p.note(refused(
            "put_signal_nbi of unequal lengths",
            sh.put_signal_nbi(&a, &b, &sig, 0, 1, SignalOp::Add, 0),
            length_error,
        ));
        p.note(refused(
            "put_signal_on_stream to PE n",
            sh.put_signal_on_stream(&a, &a, &sig, 0, 1, SignalOp::Add, n, s),
            pe_error,
        ));
        p.note(refused(
            "put_signal_nbi_on_stream with signal 5",
            sh.put_signal_nbi_on_stream(&a, &a, &sig, 5, 1, SignalOp::Add, 0, s),
            argument_error,
        ));
        p.note(refused(
            "signal_op to PE n",
            sh.signal_op(&sig, 0, 1, SignalOp::Add, n),
            pe_error,
        ));
        p.note(refused(
            "signal_op_on_stream with signal 2",
            sh.signal_op_on_stream(&sig, 2, 1, SignalOp::Set, 0, s),
            argument_error,
        ));
        p.note(refused(
            "signal_wait_until with signal 2",
            sh.signal_wait_until(&sig, 2, Cmp::Eq, 0),
            argument_error,
        ));
        p.note(refused(
            "signal_wait_until_on_stream with signal 3",
            sh.signal_wait_until_on_stream(&sig, 3, Cmp::Eq, 0, s),
            argument_error,
        ));
        p.note(refused(
            "signal_fetch of signal 2",
            sh.signal_fetch(&sig, 2),
            argument_error,
        ));
        p.done()
    });

    h.check("errors: atomics and waits", |_| {
        let sh = &c.shmem;
        let a = c.zeros::<u64>(4)?;
        let f = c.zeros::<f32>(4)?;
        let s = &*c.stream;
        let mut p = Problems::default();
        p.note(refused(
            "atomic_fetch from PE n",
            sh.atomic_fetch(&a, 0, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_set past the end",
            sh.atomic_set(&f, 4, 1.0, 0),
            argument_error,
        ));
        p.note(refused(
            "atomic_swap on PE n",
            sh.atomic_swap(&f, 0, 1.0, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_compare_swap past the end",
            sh.atomic_compare_swap(&a, 4, 0, 1, 0),
            argument_error,
        ));
        p.note(refused(
            "atomic_fetch_add on PE n",
            sh.atomic_fetch_add(&a, 0, 1, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_add past the end",
            sh.atomic_add(a.view(1..), 3, 1, 0),
            argument_error,
        ));
        p.note(refused(
            "atomic_fetch_inc on PE n",
            sh.atomic_fetch_inc(&a, 0, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_inc past the end",
            sh.atomic_inc(&a, 9, 0),
            argument_error,
        ));
        p.note(refused(
            "atomic_fetch_and on PE n",
            sh.atomic_fetch_and(&a, 0, 1, n),
            pe_error,
        ));
        p.note(refused(
            "atomic_fetch_or past the end",
            sh.atomic_fetch_or(&a, 4, 1, 0),
            argument_error,
        ));
        p.note(refused(
            "atomic_fetch_xor on PE n",
            sh.atomic_fetch_xor(&a, 0, 1, n),
            pe_error,
        ));
        p.note(refused(
            "wait_until past the end",
            sh.wait_until(&a, 4, Cmp::Eq, 0),
            argument_error,
        ));
        p.note(refused(
            "wait_until_on_stream past the end",
            sh.wait_until_on_stream(&a, 4, Cmp::Eq, 0, s),
            argument_error,
        ));
        p.done()
    });

    h.check("errors: collectives", |_| {
        let w = &c.world;
        let s = &*c.stream;
        let f = c.zeros::<f32>(4 * n)?;
        let g = c.zeros::<f32>(4 * n + 1)?;
        let small = c.zeros::<f32>(4)?;
        let mut p = Problems::default();
        for op in [ReduceOp::And, ReduceOp::Or, ReduceOp::Xor] {
            p.note(refused(
                "a bitwise all_reduce of f32",
                w.all_reduce(op, &f, g.view(..4 * n), s),
                argument_error,
            ));
            p.note(refused(
                "a bitwise reduce_scatter of f32",
                w.reduce_scatter(op, &small, &f, s),
                argument_error,
            ));
        }
        p.note(refused(
            "all_reduce of unequal lengths",
            w.all_reduce(ReduceOp::Sum, &f, &g, s),
            length_error,
        ));
        p.note(refused(
            "reduce_scatter with a short source",
            w.reduce_scatter(ReduceOp::Sum, &small, g.view(..4 * n - 1), s),
            length_error,
        ));
        p.note(refused(
            "fcollect into a short destination",
            w.fcollect(f.view(1..), &small, s),
            length_error,
        ));
        p.note(refused(
            "all_gather into a long destination",
            w.all_gather(&g, &small, s),
            length_error,
        ));
        p.note(refused(
            "fcollect within one buffer",
            w.fcollect(f.view(..), f.view(..4), s),
            |e| length_error(e) || argument_error(e),
        ));
        p.note(refused(
            "alltoall of unequal lengths",
            w.alltoall(&f, &g, s),
            length_error,
        ));
        // (With one PE the lengths divide, and the overlap is refused instead.)
        p.note(refused(
            "alltoall not divisible by n_pes",
            w.alltoall(&g, &g, s),
            argument_error,
        ));
        p.note(refused(
            "broadcast from PE n",
            w.broadcast(&f, g.view(1..), n, s),
            pe_error,
        ));
        p.note(refused(
            "broadcast of unequal lengths",
            w.broadcast(&f, &g, 0, s),
            length_error,
        ));
        p.done()
    });
}
