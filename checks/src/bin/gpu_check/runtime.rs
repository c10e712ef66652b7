//! Runtime, teams and memory.

use crate::data::*;
use crate::harness::*;
use nvshmem::{Error, Nvshmem, UniqueId};

pub(crate) fn checks(h: &mut Harness) {
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
            |e| matches!(e, Error::AlreadyInitialized),
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
        ensure(al.addr() % 4096 == 0 && al.len() == 300, || {
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
            a.runtime().my_pe() == c.me && a.addr() == a.as_ptr() as u64,
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
            length_error,
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
