//! Whether NVSHMEM will find a way to every PE, asked before it sets up its GPU side. That
//! set-up (on the first call that needs it) prints "Unable to initialize any transports" and
//! exits the process when some PE is reachable neither by load/store (NVLink, PCIe peer
//! access) nor by a network transport; asked first, the start returns an error instead.
//!
//! The verdict errs on the side of starting: where a transport may work (UCX, libfabric, an
//! InfiniBand device with its library) NVSHMEM is left to try.

use super::parse_bool;
use std::ffi::CStr;

/// What decides whether every PE is reachable from this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reach {
    pub(crate) n_pes: usize,
    pub(crate) node_n_pes: usize,
    /// `NVSHMEM_DISABLE_P2P`: no load/store between the GPUs of a node.
    pub(crate) p2p_disabled: bool,
    /// The GPUs of this node's PEs that this PE's GPU cannot map (no peer access), as
    /// `(node PE, CUDA device)`, where known.
    pub(crate) unmapped: Vec<(usize, usize)>,
    /// Why no network transport can start, or `None` when one may.
    pub(crate) no_network: Option<String>,
}

/// The transport NVSHMEM uses between nodes by default.
const DEFAULT_REMOTE: &str = "ibrc";

/// Why the network transport `NVSHMEM_REMOTE_TRANSPORT` (`remote`) cannot start here, or
/// `None` when it may. `ib_devices`: whether `/sys/class/infiniband` lists a device;
/// `verbs`: whether `libibverbs.so.1` loads.
pub(crate) fn network_problem(
    remote: Option<&str>,
    ib_devices: bool,
    verbs: bool,
) -> Option<String> {
    let name = remote.map_or(DEFAULT_REMOTE.to_string(), |r| {
        r.trim().to_ascii_lowercase()
    });
    let shown = match remote {
        Some(_) => format!("NVSHMEM_REMOTE_TRANSPORT={name}"),
        None => format!("NVSHMEM_REMOTE_TRANSPORT={name} (the default)"),
    };
    match name.as_str() {
        "none" => Some(format!("{shown} turns network transports off")),
        "ibrc" | "ibgda" | "ibdevx" if !ib_devices => Some(format!(
            "{shown} needs an InfiniBand or RoCE device, and /sys/class/infiniband lists none"
        )),
        "ibrc" | "ibgda" | "ibdevx" if !verbs => Some(format!(
            "{shown} needs libibverbs.so.1 (rdma-core), which does not load"
        )),
        _ => None,
    }
}

/// The error text when some PE is reachable by no transport, or `None` when every PE may be.
pub(crate) fn transport_problem(r: &Reach) -> Option<String> {
    if r.n_pes <= 1 {
        return None;
    }
    let mut needs_network = Vec::new();
    if r.n_pes > r.node_n_pes {
        needs_network.push(format!(
            "{} of the {} PEs run on other nodes",
            r.n_pes - r.node_n_pes,
            r.n_pes
        ));
    }
    if r.node_n_pes > 1 && r.p2p_disabled {
        needs_network
            .push("NVSHMEM_DISABLE_P2P turns off load/store between this node's GPUs".to_string());
    } else if let Some(&(pe, device)) = r.unmapped.first() {
        needs_network.push(format!(
            "this GPU has no peer access to GPU {device} of node PE {pe} (no NVLink or PCIe \
             peer-to-peer path)"
        ));
    }
    let why_not = r.no_network.as_ref()?;
    if needs_network.is_empty() {
        return None;
    }
    Some(format!(
        "NVSHMEM would find no transport to some PEs and exit the process: {}, and {why_not}. \
         Run one PE per GPU on GPUs with peer access (unset NVSHMEM_DISABLE_P2P), or set \
         NVSHMEM_REMOTE_TRANSPORT to a network transport this machine has (ibrc, ibgda, ucx, \
         libfabric). Across nodes, NVSHMEM's host API and team collectives work, and this \
         crate's Collectives call NVSHMEM's where PEs are not load/store reachable",
        needs_network.join("; ")
    ))
}

/// `NVSHMEM_DISABLE_P2P` as NVSHMEM reads it.
pub(crate) fn p2p_disabled(var: impl Fn(&str) -> Option<String>) -> bool {
    var("NVSHMEM_DISABLE_P2P")
        .and_then(|v| parse_bool(&v))
        .unwrap_or(false)
}

/// Why no network transport can start on this machine, from its environment.
pub(crate) fn network_problem_here() -> Option<String> {
    let remote = std::env::var("NVSHMEM_REMOTE_TRANSPORT").ok();
    let ib_devices = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    network_problem(
        remote.as_deref(),
        ib_devices,
        library_loads(c"libibverbs.so.1"),
    )
}

/// Whether the dynamic loader can load `name`.
fn library_loads(name: &CStr) -> bool {
    extern "C" {
        fn dlopen(filename: *const std::ffi::c_char, flags: i32) -> *mut std::ffi::c_void;
        fn dlclose(handle: *mut std::ffi::c_void) -> i32;
    }
    const RTLD_LAZY: i32 = 1;
    // SAFETY: a NUL-terminated name; the handle is closed at once.
    unsafe {
        let handle = dlopen(name.as_ptr(), RTLD_LAZY);
        if handle.is_null() {
            return false;
        }
        dlclose(handle);
    }
    true
}

/// The node PEs whose GPU `ordinal` cannot map, when every PE of the node picks its GPU by
/// its node rank (the default): `(node PE, device)`.
pub(crate) fn unmapped_peers(
    ordinal: usize,
    node_n_pes: usize,
    device_count: usize,
) -> Vec<(usize, usize)> {
    use cudarc::driver::{result::device, sys};
    let Ok(me) = device::get(ordinal as i32) else {
        return Vec::new();
    };
    (0..node_n_pes)
        .map(|pe| (pe, pe % device_count))
        .filter(|&(_, d)| d != ordinal)
        .filter(|&(_, d)| {
            let Ok(peer) = device::get(d as i32) else {
                return false;
            };
            let mut can = 0;
            // SAFETY: two valid device handles and an out-parameter.
            let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, me, peer) };
            r == sys::CUresult::CUDA_SUCCESS && can == 0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_node(n: usize) -> Reach {
        Reach {
            n_pes: n,
            node_n_pes: n,
            p2p_disabled: false,
            unmapped: Vec::new(),
            no_network: network_problem(None, false, false),
        }
    }

    #[test]
    fn gpus_with_peer_access_need_no_network() {
        assert_eq!(transport_problem(&one_node(4)), None);
        assert_eq!(transport_problem(&one_node(1)), None);
    }

    #[test]
    fn p2p_off_without_a_network_is_refused_naming_both_variables() {
        let r = Reach {
            p2p_disabled: true,
            ..one_node(2)
        };
        let text = transport_problem(&r).expect("refused");
        assert!(text.contains("NVSHMEM_DISABLE_P2P turns off"), "{text}");
        assert!(
            text.contains("NVSHMEM_REMOTE_TRANSPORT=ibrc (the default) needs an InfiniBand"),
            "{text}"
        );
        // One PE alone needs no transport at all.
        let alone = Reach {
            p2p_disabled: true,
            ..one_node(1)
        };
        assert_eq!(transport_problem(&alone), None);
    }

    #[test]
    fn gpus_without_peer_access_are_named() {
        let r = Reach {
            unmapped: vec![(1, 1)],
            ..one_node(2)
        };
        let text = transport_problem(&r).expect("refused");
        assert!(
            text.contains("no peer access to GPU 1 of node PE 1"),
            "{text}"
        );
    }

    #[test]
    fn other_nodes_need_a_network_transport() {
        let r = Reach {
            n_pes: 8,
            node_n_pes: 4,
            p2p_disabled: false,
            unmapped: Vec::new(),
            no_network: network_problem(Some("none"), true, true),
        };
        let text = transport_problem(&r).expect("refused");
        assert!(text.contains("4 of the 8 PEs run on other nodes"), "{text}");
        assert!(
            text.contains("NVSHMEM_REMOTE_TRANSPORT=none turns"),
            "{text}"
        );
    }

    #[test]
    fn a_network_that_may_work_is_left_to_nvshmem() {
        assert_eq!(network_problem(None, true, true), None);
        assert_eq!(network_problem(Some("UCX"), false, false), None);
        assert_eq!(network_problem(Some("libfabric"), false, false), None);
        assert!(network_problem(Some("ibgda"), true, false)
            .unwrap()
            .contains("libibverbs.so.1"));
        let r = Reach {
            p2p_disabled: true,
            no_network: network_problem(None, true, true),
            ..one_node(2)
        };
        assert_eq!(transport_problem(&r), None);
    }

    #[test]
    fn nvshmem_reads_p2p_off_as_a_boolean() {
        let env = |v: &'static str| move |_: &str| Some(v.to_string());
        assert!(p2p_disabled(env("1")));
        assert!(p2p_disabled(env("true")));
        assert!(!p2p_disabled(env("0")));
        assert!(!p2p_disabled(|_: &str| None));
    }
}
