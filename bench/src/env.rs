//! The environment header: where and with what the numbers were taken.

use crate::coord::{Coord, SLOTS};
use crate::error::{CudaExt, Result};
use cudarc::driver::result as cu;
use cudarc::driver::sys as cusys;
use cudarc::driver::sys::CUdevice_attribute as Attr;
use nvshmem::Nvshmem;
use serde::Serialize;
use std::fmt::Write as _;

#[derive(Debug, Clone, Serialize)]
pub struct PeInfo {
    pub pe: usize,
    pub node_pe: usize,
    pub host: String,
    pub device: usize,
    pub pci_bus_id: String,
    pub sm: String,
    pub sms: u32,
    pub memory_gib: f64,
    /// PEs whose memory this PE can load/store directly (nvshmem_ptr != NULL).
    pub ldst_peers: Vec<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub pci_bus_id: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PeerLink {
    pub from: usize,
    pub to: usize,
    /// cuDeviceCanAccessPeer.
    pub can_access: bool,
    /// CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK (lower is faster).
    pub performance_rank: i32,
    /// CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED.
    pub native_atomics: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub unix_time: u64,
    pub command_line: String,
    pub host: String,
    pub n_pes: usize,
    pub n_hosts: usize,
    pub nvshmem_version: String,
    pub nvshmem_built_against: String,
    pub nccl_version: Option<String>,
    /// cuBLASMp's release, when the tp test's cublasmp column runs.
    pub cublasmp_version: Option<String>,
    pub cuda_driver_api: String,
    pub nvidia_driver: String,
    pub cudarc_cuda_api: String,
    pub symmetric_heap_bytes: String,
    /// GPUs visible on PE 0's host.
    pub gpus: Vec<GpuInfo>,
    pub pes: Vec<PeInfo>,
    pub peer_access: Vec<PeerLink>,
    /// `nvidia-smi topo -m` on PE 0's host, when available.
    pub topology: Option<String>,
    pub variables: Vec<(String, String)>,
}

fn host_name() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

fn nvidia_driver() -> String {
    if let Ok(text) = std::fs::read_to_string("/proc/driver/nvidia/version") {
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul ..."
        if let Some(line) = text.lines().next() {
            // The first dotted number: open and proprietary modules word the line differently
            // ("Kernel Module  580.65.06", "Open Kernel Module for x86_64  580.159.04").
            if let Some(v) = driver_version_in(line) {
                return v;
            }
        }
    }
    run_nvidia_smi(&["--query-gpu=driver_version", "--format=csv,noheader"])
        .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
        .unwrap_or_else(|| "unknown".into())
}

fn driver_version_in(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_string)
}

fn run_nvidia_smi(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn driver_cuda_version() -> String {
    let mut v = 0;
    let r = unsafe { cusys::cuDriverGetVersion(&mut v) };
    if r != cusys::CUresult::CUDA_SUCCESS {
        return "unknown".into();
    }
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn pci_bus_id(dev: cusys::CUdevice) -> String {
    let mut buf = [0 as std::ffi::c_char; 32];
    let r = unsafe { cusys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) };
    if r != cusys::CUresult::CUDA_SUCCESS {
        return "?".into();
    }
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn attribute(dev: cusys::CUdevice, attr: Attr) -> i32 {
    unsafe { cu::device::get_attribute(dev, attr) }.unwrap_or(-1)
}

fn interesting_variable(name: &str) -> bool {
    name.starts_with("NVSHMEM_")
        || name.starts_with("NCCL_")
        || matches!(
            name,
            "CUDA_VISIBLE_DEVICES"
                | "CUDA_DEVICE_MAX_CONNECTIONS"
                | "CUDA_MODULE_LOADING"
                | "NVIDIA_VISIBLE_DEVICES"
        )
}

/// The variables that change how NVSHMEM, NCCL and CUDA behave, sorted.
pub fn relevant_variables(all: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = all.filter(|(k, _)| interesting_variable(k)).collect();
    v.sort();
    v
}

/// Collective: every PE contributes its GPU and reachability; PE 0 adds what it sees locally.
pub fn collect(
    shmem: &Nvshmem,
    coord: &Coord,
    probe: &nvshmem::SymmetricBuffer<u64>,
    nccl_version: Option<String>,
    cublasmp_version: Option<String>,
) -> Result<Environment> {
    let n = shmem.n_pes();
    let ctx = shmem.context();
    let dev = ctx.cu_device();
    let host = host_name();
    let host_hash = crate::data::hash_bytes(host.as_bytes());
    let mut reach = 0u64;
    for pe in 0..n.min(64) {
        if probe.peer_ptr(pe)?.is_some() {
            reach |= 1 << pe;
        }
    }
    let (major, minor) = ctx.compute_capability().cuda("cuDeviceGetAttribute")?;
    let pci_domain = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID).max(0) as u64;
    let pci_bus = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID).max(0) as u64;
    let pci_dev = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID).max(0) as u64;
    let sms = attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).max(0) as u64;
    let mem_mib = (ctx.total_mem().unwrap_or(0) >> 20) as u64;
    let mine: [u64; SLOTS] = [
        shmem.device_ordinal() as u64,
        shmem.node_pe() as u64,
        host_hash,
        (pci_domain << 32) | (pci_bus << 8) | pci_dev,
        reach,
        sms,
        (major * 10 + minor) as u64,
        mem_mib,
    ];
    let all = coord.gather(&mine)?;

    let mut hosts: Vec<u64> = all.iter().map(|r| r[2]).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let pes = all
        .iter()
        .enumerate()
        .map(|(pe, r)| PeInfo {
            pe,
            node_pe: r[1] as usize,
            host: if r[2] == host_hash {
                host.clone()
            } else {
                format!("host #{:x}", r[2] & 0xffff)
            },
            device: r[0] as usize,
            pci_bus_id: format!(
                "{:04x}:{:02x}:{:02x}.0",
                r[3] >> 32,
                (r[3] >> 8) & 0xff,
                r[3] & 0xff
            ),
            sm: format!("sm_{}", r[6]),
            sms: r[5] as u32,
            memory_gib: r[7] as f64 / 1024.0,
            ldst_peers: (0..n.min(64)).filter(|p| r[4] & (1 << p) != 0).collect(),
        })
        .collect();

    // GPUs and peer access as seen on this host (PE 0's is the one reported).
    let count = cu::device::get_count().cuda("cuDeviceGetCount")?.max(0) as usize;
    let mut gpus = Vec::new();
    let mut handles = Vec::new();
    for ordinal in 0..count {
        let d = cu::device::get(ordinal as i32).cuda("cuDeviceGet")?;
        handles.push(d);
        gpus.push(GpuInfo {
            ordinal,
            name: cu::device::get_name(d).unwrap_or_else(|_| "?".into()),
            pci_bus_id: pci_bus_id(d),
        });
    }
    let mut peer_access = Vec::new();
    for (i, &a) in handles.iter().enumerate() {
        for (j, &b) in handles.iter().enumerate() {
            if i == j {
                continue;
            }
            let mut can = 0;
            let mut rank = -1;
            let mut atomics = 0;
            unsafe {
                let _ = cusys::cuDeviceCanAccessPeer(&mut can, a, b);
                let _ = cusys::cuDeviceGetP2PAttribute(
                    &mut rank,
                    cusys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
                    a,
                    b,
                );
                let _ = cusys::cuDeviceGetP2PAttribute(
                    &mut atomics,
                    cusys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                    a,
                    b,
                );
            }
            peer_access.push(PeerLink {
                from: i,
                to: j,
                can_access: can != 0,
                performance_rank: rank,
                native_atomics: atomics != 0,
            });
        }
    }
    let topology = if shmem.my_pe() == 0 {
        run_nvidia_smi(&["topo", "-m"])
    } else {
        None
    };

    Ok(Environment {
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        host,
        n_pes: n,
        n_hosts: hosts.len(),
        nvshmem_version: shmem.version(),
        nvshmem_built_against: nvshmem::sys::BUILD_VERSION.to_string(),
        nccl_version,
        cublasmp_version,
        cuda_driver_api: driver_cuda_version(),
        nvidia_driver: nvidia_driver(),
        cudarc_cuda_api: "13.0".into(),
        symmetric_heap_bytes: std::env::var("NVSHMEM_SYMMETRIC_SIZE")
            .unwrap_or_else(|_| "default".into()),
        gpus,
        pes,
        peer_access,
        topology,
        variables: relevant_variables(std::env::vars()),
    })
}

impl Environment {
    /// The header printed before the results.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# NVSHMEM vs NCCL benchmark");
        let _ = writeln!(s, "command      : {}", self.command_line);
        let _ = writeln!(s, "unix time    : {}", self.unix_time);
        let _ = writeln!(
            s,
            "host         : {} ({} PEs on {} host(s))",
            self.host, self.n_pes, self.n_hosts
        );
        let _ = writeln!(
            s,
            "NVSHMEM      : {} (built against {})",
            self.nvshmem_version, self.nvshmem_built_against
        );
        let _ = writeln!(
            s,
            "NCCL         : {}",
            self.nccl_version.as_deref().unwrap_or("not used")
        );
        if let Some(v) = &self.cublasmp_version {
            let _ = writeln!(s, "cuBLASMp     : {v}");
        }
        let _ = writeln!(
            s,
            "CUDA         : driver API {} (NVIDIA driver {}), bindings for CUDA {}",
            self.cuda_driver_api, self.nvidia_driver, self.cudarc_cuda_api
        );
        let _ = writeln!(
            s,
            "symmetric heap (NVSHMEM_SYMMETRIC_SIZE): {}",
            self.symmetric_heap_bytes
        );
        let _ = writeln!(s, "GPUs on {}:", self.host);
        for g in &self.gpus {
            let _ = writeln!(s, "  GPU {}: {} ({})", g.ordinal, g.name, g.pci_bus_id);
        }
        let _ = writeln!(s, "PEs:");
        for p in &self.pes {
            let _ = writeln!(
                s,
                "  PE {:>3}: {} node PE {}, GPU {} ({}, {}, {} SMs, {:.0} GiB); load/store to PEs {:?}",
                p.pe, p.host, p.node_pe, p.device, p.pci_bus_id, p.sm, p.sms, p.memory_gib, p.ldst_peers
            );
        }
        if !self.gpus.is_empty() {
            let _ = writeln!(
                s,
                "peer access on {} (cuDeviceCanAccessPeer Y/N / P2P performance rank / A = native atomics):",
                self.host
            );
            let mut line = String::from("        ");
            for g in &self.gpus {
                let _ = write!(line, "{:>9}", format!("GPU{}", g.ordinal));
            }
            let _ = writeln!(s, "{line}");
            for a in &self.gpus {
                let mut line = format!("  GPU{:<3} ", a.ordinal);
                for b in &self.gpus {
                    let cell = if a.ordinal == b.ordinal {
                        "-".to_string()
                    } else {
                        self.peer_access
                            .iter()
                            .find(|l| l.from == a.ordinal && l.to == b.ordinal)
                            .map(|l| {
                                format!(
                                    "{}/{}{}",
                                    if l.can_access { "Y" } else { "N" },
                                    l.performance_rank,
                                    if l.native_atomics { "/A" } else { "" }
                                )
                            })
                            .unwrap_or_else(|| "?".into())
                    };
                    let _ = write!(line, "{cell:>9}");
                }
                let _ = writeln!(s, "{line}");
            }
        }
        match &self.topology {
            Some(t) => {
                let _ = writeln!(s, "nvidia-smi topo -m (NV# = NVLink):");
                for l in t.lines().filter(|l| !l.trim().is_empty()) {
                    let _ = writeln!(s, "  {l}");
                }
            }
            None => {
                let _ = writeln!(s, "nvidia-smi topo -m: not available");
            }
        }
        let _ = writeln!(s, "environment:");
        if self.variables.is_empty() {
            let _ = writeln!(s, "  (no NVSHMEM_*, NCCL_* or CUDA_VISIBLE_DEVICES set)");
        }
        for (k, v) in &self.variables {
            let _ = writeln!(s, "  {k}={v}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn driver_versions_are_read_from_both_module_wordings() {
        let open =
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build";
        let closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 2025";
        assert_eq!(
            super::driver_version_in(open).as_deref(),
            Some("580.159.04")
        );
        assert_eq!(
            super::driver_version_in(closed).as_deref(),
            Some("580.65.06")
        );
    }

    use super::*;

    #[test]
    fn only_relevant_variables_are_kept_sorted() {
        let vars = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("NCCL_DEBUG".to_string(), "WARN".to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), "0,1".to_string()),
            ("NVSHMEM_SYMMETRIC_SIZE".to_string(), "2G".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ];
        let kept = relevant_variables(vars.into_iter());
        let names: Vec<&str> = kept.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "CUDA_VISIBLE_DEVICES",
                "NCCL_DEBUG",
                "NVSHMEM_SYMMETRIC_SIZE"
            ]
        );
    }

    #[test]
    fn the_header_shows_versions_matrix_and_variables() {
        let env = Environment {
            unix_time: 1,
            command_line: "bench --quick".into(),
            host: "node1".into(),
            n_pes: 2,
            n_hosts: 1,
            nvshmem_version: "3.4.5".into(),
            nvshmem_built_against: "3.4.5".into(),
            nccl_version: Some("2.28.9".into()),
            cublasmp_version: Some("0.7.0".into()),
            cuda_driver_api: "13.0".into(),
            nvidia_driver: "580.65.06".into(),
            cudarc_cuda_api: "13.0".into(),
            symmetric_heap_bytes: "1G".into(),
            gpus: vec![
                GpuInfo {
                    ordinal: 0,
                    name: "GPU A".into(),
                    pci_bus_id: "0000:01:00.0".into(),
                },
                GpuInfo {
                    ordinal: 1,
                    name: "GPU B".into(),
                    pci_bus_id: "0000:02:00.0".into(),
                },
            ],
            pes: vec![],
            peer_access: vec![
                PeerLink {
                    from: 0,
                    to: 1,
                    can_access: true,
                    performance_rank: 0,
                    native_atomics: true,
                },
                PeerLink {
                    from: 1,
                    to: 0,
                    can_access: false,
                    performance_rank: 1,
                    native_atomics: false,
                },
            ],
            topology: None,
            variables: vec![("NCCL_DEBUG".into(), "WARN".into())],
        };
        let text = env.render();
        for needle in [
            "3.4.5",
            "2.28.9",
            "cuBLASMp     : 0.7.0",
            "580.65.06",
            "GPU B",
            "Y/0/A",
            "N/1",
            "NCCL_DEBUG=WARN",
        ] {
            assert!(text.contains(needle), "header lacks {needle}:\n{text}");
        }
    }
}
