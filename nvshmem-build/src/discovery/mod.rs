//! Finding NVSHMEM, the CUDA compiler and libclang: the variable that names an install, then
//! the project's `.venv`, then the Python environment, then the system.

mod libclang;
mod release;

pub use libclang::{is_libclang_file_name, libclang_in, Libclang, LIBCLANG_WHEEL};

use crate::Error;
use libclang::system_libclang_dirs;
use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Variables that change what discovery finds; build scripts re-run when they change.
pub const DISCOVERY_VARS: &[&str] = &[
    "NVSHMEM_HOME",
    "CUDA_HOME",
    "NVCC",
    "LIBCLANG_PATH",
    "PYTHON",
    "PATH",
    "CC",
    SEARCH_VAR,
    DOCS_RS_VAR,
];

/// Set by docs.rs for its builds (`DOCS_RS=1`), which have no NVSHMEM, CUDA compiler or
/// libclang: while it is set, nothing is looked for ([`Probe::docs_rs`], [`crate::docs_rs`]),
/// `nvshmem-sys` binds the headers of [`PINNED_NVSHMEM`] from the file it ships and links
/// nothing, and the kernel pipeline compiles nothing ([`KernelBuilder`](crate::KernelBuilder)).
pub const DOCS_RS_VAR: &str = "DOCS_RS";

/// The NVSHMEM release `make setup` installs (`nvidia-nvshmem-cu13==3.4.5`), whose
/// bindings `nvshmem-sys` ships for builds without NVSHMEM (docs.rs). The crates build
/// against 3.4.5 to 3.8.0.
pub const PINNED_NVSHMEM: Version = Version {
    major: 3,
    minor: 4,
    patch: 5,
};

/// Where discovery looks after the variables that name an install (`NVSHMEM_HOME`,
/// `CUDA_HOME`, `NVCC`, `LIBCLANG_PATH`): a comma-separated subset of `venv`, `python` and
/// `system`, in that order (default: all three). `NVSHMEM_BUILD_SEARCH=venv` builds only
/// with what `make setup` installed, which is how CI proves that the setup installs
/// everything.
pub const SEARCH_VAR: &str = "NVSHMEM_BUILD_SEARCH";

/// The places [`SEARCH_VAR`] can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Search {
    /// A `.venv` made by `make setup` above the package.
    pub venv: bool,
    /// The packages of the Python that `PYTHON` (or `python3` on `PATH`) runs.
    pub python: bool,
    /// Standard system locations, and `nvcc` on `PATH`.
    pub system: bool,
}

impl Search {
    /// Everywhere: the default.
    pub const ALL: Search = Search {
        venv: true,
        python: true,
        system: true,
    };
}

impl std::str::FromStr for Search {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let mut search = Search {
            venv: false,
            python: false,
            system: false,
        };
        for place in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match place {
                "venv" => search.venv = true,
                "python" => search.python = true,
                "system" => search.system = true,
                "none" => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "{SEARCH_VAR}={s}: `{other}` is not a place discovery knows; use a \
                         comma-separated subset of venv, python, system (or none)"
                    )))
                }
            }
        }
        Ok(search)
    }
}

/// A `major.minor.patch` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Major release.
    pub major: u32,
    /// Minor release.
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl std::str::FromStr for Version {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::Invalid(format!("`{s}` is not a major.minor.patch version"));
        let mut parts = s
            .trim()
            .split('.')
            .map(|p| p.parse::<u32>().map_err(|_| bad()));
        let v = Version {
            major: parts.next().ok_or_else(bad)??,
            minor: parts.next().unwrap_or(Ok(0))?,
            patch: parts.next().unwrap_or(Ok(0))?,
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(v)
    }
}

/// Where an install was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An environment variable (`NVSHMEM_HOME`, `CUDA_HOME`, `NVCC`).
    EnvVar(&'static str),
    /// The `links` metadata of the `nvshmem` crate (what it was built against).
    Metadata,
    /// A `.venv` made by `make setup`, found by walking up from the package directory.
    ProjectVenv(PathBuf),
    /// The Python package `nvidia.nvshmem` / `nvidia.cu13` of the `python3` on `PATH`.
    PythonPackage,
    /// `nvcc` on `PATH`.
    Path,
    /// A standard system location.
    System,
    /// Nothing: [`DOCS_RS_VAR`] is set, and this is a stand-in with empty paths
    /// ([`NvshmemInstall::docs_rs`], [`CudaToolkit::docs_rs`]).
    DocsRs,
}

/// An NVSHMEM installation: headers, the host library and the device library.
#[derive(Debug, Clone)]
pub struct NvshmemInstall {
    /// The folder holding `nvshmem.h`.
    pub include_dir: PathBuf,
    /// The folder holding the host and device libraries.
    pub lib_dir: PathBuf,
    /// `libnvshmem_host.so.3` (pip wheels ship only the versioned name) or `libnvshmem_host.so`.
    pub host_lib: PathBuf,
    /// `libnvshmem_device.a`, linked into every cubin by `nvlink`.
    pub device_lib: PathBuf,
    /// From `non_abi/nvshmem_version.h`.
    pub version: Version,
    /// Where it was found.
    pub source: Source,
}

impl NvshmemInstall {
    /// Check the layout under `include_dir`/`lib_dir` and read the version.
    pub fn at(include_dir: &Path, lib_dir: &Path, source: Source) -> Result<Self, Error> {
        let root = include_dir.parent().unwrap_or(include_dir).to_path_buf();
        let missing = |p: PathBuf| Error::NvshmemIncomplete {
            root: root.clone(),
            missing: p,
        };
        let header = include_dir.join("nvshmem.h");
        if !header.is_file() {
            return Err(missing(header));
        }
        let host_lib = ["libnvshmem_host.so.3", "libnvshmem_host.so"]
            .iter()
            .map(|n| lib_dir.join(n))
            .find(|p| p.is_file())
            .ok_or_else(|| missing(lib_dir.join("libnvshmem_host.so.3")))?;
        let device_lib = lib_dir.join("libnvshmem_device.a");
        if !device_lib.is_file() {
            return Err(missing(device_lib));
        }
        let version_h = include_dir.join("non_abi").join("nvshmem_version.h");
        let text = std::fs::read_to_string(&version_h).map_err(|_| missing(version_h.clone()))?;
        let field = |name: &str| {
            text.lines()
                .filter_map(|l| l.trim().strip_prefix("#define "))
                .filter_map(|l| l.strip_prefix(name))
                .find_map(|rest| rest.trim().parse::<u32>().ok())
                .ok_or_else(|| missing(version_h.clone()))
        };
        let version = Version {
            major: field("NVSHMEM_VENDOR_MAJOR_VERSION")?,
            minor: field("NVSHMEM_VENDOR_MINOR_VERSION")?,
            patch: field("NVSHMEM_VENDOR_PATCH_VERSION")?,
        };
        Ok(NvshmemInstall {
            include_dir: include_dir.to_path_buf(),
            lib_dir: lib_dir.to_path_buf(),
            host_lib,
            device_lib,
            version,
            source,
        })
    }

    /// The stand-in for a docs.rs build ([`DOCS_RS_VAR`]): empty paths, the given release,
    /// [`Source::DocsRs`]. Nothing is ever compiled or linked against it.
    pub fn docs_rs(version: Version) -> Self {
        NvshmemInstall {
            include_dir: PathBuf::new(),
            lib_dir: PathBuf::new(),
            host_lib: PathBuf::new(),
            device_lib: PathBuf::new(),
            version,
            source: Source::DocsRs,
        }
    }

    /// Whether this is the docs.rs stand-in ([`NvshmemInstall::docs_rs`]).
    pub fn is_docs_rs(&self) -> bool {
        self.source == Source::DocsRs
    }

    /// The release each part of the install says it is: the headers (`version`), the host
    /// library (its `nvshmemi_host_lib_version`, or the `NVSHMEM vX.Y.Z` banner it prints when
    /// its symbol table is stripped) and the device library (the `nvshmemi_device_lib_version`
    /// its init code hands the host library, which refuses another release at run time).
    /// `None` where a library says nothing readable.
    pub fn releases(&self) -> Result<Releases, Error> {
        if self.is_docs_rs() {
            return Ok(Releases {
                headers: self.version,
                host_lib: Some(self.version),
                device_lib: Some(self.version),
            });
        }
        Ok(Releases {
            headers: self.version,
            host_lib: release::host_library_release(&self.host_lib)?,
            device_lib: release::device_library_release(&self.device_lib)?,
        })
    }

    /// Check that the headers, the host library and the device library are one release
    /// ([`releases`](Self::releases)): the device library is linked into every cubin, and the
    /// host library that runs them, and the bindings generated from the headers, must be of
    /// the same release. [`Error::NvshmemReleaseMismatch`] says which file is which release;
    /// [`Error::NvshmemReleaseUnknown`] names a library that does not say.
    ///
    /// `nvshmem-sys`'s build script checks the NVSHMEM it finds; crates that depend on it
    /// read that install from its `links` metadata.
    /// [`KernelBuilder::from_env`](crate::KernelBuilder::from_env) checks what it finds too.
    pub fn check_release(&self) -> Result<Releases, Error> {
        let releases = self.releases()?;
        let host = releases
            .host_lib
            .ok_or_else(|| Error::NvshmemReleaseUnknown {
                library: self.host_lib.clone(),
                looked_for: "the `nvshmemi_host_lib_version` symbol or an `NVSHMEM vX.Y.Z` string"
                    .into(),
            })?;
        let device = releases
            .device_lib
            .ok_or_else(|| Error::NvshmemReleaseUnknown {
                library: self.device_lib.clone(),
                looked_for: "the `nvshmemi_device_lib_version` symbol in any member".into(),
            })?;
        if host != self.version || device != self.version {
            return Err(Error::NvshmemReleaseMismatch {
                version_header: self.include_dir.join("non_abi").join("nvshmem_version.h"),
                headers: self.version,
                host_lib: self.host_lib.clone(),
                host,
                device_lib: self.device_lib.clone(),
                device,
            });
        }
        Ok(releases)
    }

    /// An install rooted at `root` (`root/include`, `root/lib`).
    pub fn at_root(root: &Path, source: Source) -> Result<Self, Error> {
        Self::at(&root.join("include"), &root.join("lib"), source)
    }

    /// The file name to link: the versioned name when that is all there is.
    pub fn host_lib_file_name(&self) -> String {
        self.host_lib
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// The release each part of an NVSHMEM install says it is ([`NvshmemInstall::releases`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Releases {
    /// The headers' (`non_abi/nvshmem_version.h`), which is [`NvshmemInstall::version`].
    pub headers: Version,
    /// The host library's, if it says.
    pub host_lib: Option<Version>,
    /// The device library's, if it says.
    pub device_lib: Option<Version>,
}

/// A CUDA compiler with its device linker and headers.
#[derive(Debug, Clone)]
pub struct CudaToolkit {
    /// The compiler.
    pub nvcc: PathBuf,
    /// The device linker beside it.
    pub nvlink: PathBuf,
    /// `include/` and, where present, `include/cccl` (CUDA 13 keeps `nv/target` there).
    pub include_dirs: Vec<PathBuf>,
    /// From `CUDA_VERSION` in `cuda.h`, when the header is there.
    pub version: Option<Version>,
    /// Where it was found.
    pub source: Source,
}

impl CudaToolkit {
    /// A toolkit given its `nvcc`; the root is the directory above `bin/`.
    pub fn from_nvcc(nvcc: &Path, source: Source) -> Result<Self, Error> {
        let bin = nvcc.parent().unwrap_or(Path::new("."));
        let root = bin.parent().unwrap_or(bin).to_path_buf();
        if !nvcc.is_file() {
            return Err(Error::CudaIncomplete {
                root,
                missing: nvcc.to_path_buf(),
            });
        }
        let nvlink = bin.join("nvlink");
        if !nvlink.is_file() {
            return Err(Error::CudaIncomplete {
                root,
                missing: nvlink,
            });
        }
        let include = root.join("include");
        let mut include_dirs = vec![include.clone()];
        if include.join("cccl").is_dir() {
            include_dirs.push(include.join("cccl"));
        }
        let version = std::fs::read_to_string(include.join("cuda.h"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .filter_map(|l| l.trim().strip_prefix("#define CUDA_VERSION"))
                    .find_map(|v| v.trim().parse::<u32>().ok())
            })
            .map(|v| Version {
                major: v / 1000,
                minor: (v % 1000) / 10,
                patch: 0,
            });
        Ok(CudaToolkit {
            nvcc: nvcc.to_path_buf(),
            nvlink,
            include_dirs,
            version,
            source,
        })
    }
}

impl CudaToolkit {
    /// The stand-in for a docs.rs build ([`DOCS_RS_VAR`]): empty paths, [`Source::DocsRs`].
    pub fn docs_rs() -> Self {
        CudaToolkit {
            nvcc: PathBuf::new(),
            nvlink: PathBuf::new(),
            include_dirs: Vec::new(),
            version: None,
            source: Source::DocsRs,
        }
    }

    /// The static CUDA runtime (`libcudart_static.a`) beside the compiler: `lib64/` of a
    /// toolkit, `lib/` of the `nvidia-cuda-runtime` wheel.
    pub fn static_runtime(&self) -> Result<PathBuf, Error> {
        let bin = self.nvcc.parent().unwrap_or(Path::new("."));
        let root = bin.parent().unwrap_or(bin);
        let candidates = [
            "lib64",
            "lib",
            "targets/x86_64-linux/lib",
            "targets/sbsa-linux/lib",
        ];
        candidates
            .iter()
            .map(|d| root.join(d).join("libcudart_static.a"))
            .find(|p| p.is_file())
            .ok_or_else(|| Error::CudaIncomplete {
                root: root.to_path_buf(),
                missing: root.join("lib64/libcudart_static.a"),
            })
    }
}

/// Where and how to look. [`Probe::from_env`] is what build scripts want; the other
/// constructors exist so discovery can be tested against made-up trees.
#[derive(Debug, Clone)]
pub struct Probe {
    vars: HashMap<String, OsString>,
    start_dir: Option<PathBuf>,
    python: Option<OsString>,
    system_nvshmem: Vec<(PathBuf, PathBuf)>,
    system_cuda: Vec<PathBuf>,
    system_libclang: Vec<PathBuf>,
}

impl Probe {
    /// Look with the process environment, from `CARGO_MANIFEST_DIR` (or the current
    /// directory) upwards, with `python3` (or `$PYTHON`) and the standard system paths.
    ///
    /// Inside a build script (`OUT_DIR` set) this also tells cargo to re-run the script when
    /// a discovery variable changes.
    pub fn from_env() -> Self {
        if std::env::var_os("OUT_DIR").is_some() {
            for v in DISCOVERY_VARS {
                println!("cargo:rerun-if-env-changed={v}");
            }
        }
        let mut vars: HashMap<String, OsString> = DISCOVERY_VARS
            .iter()
            .filter_map(|k| std::env::var_os(k).map(|v| (k.to_string(), v)))
            .collect();
        // `links` metadata of direct dependencies (DEP_NVSHMEM_RS_INCLUDE...), which cargo
        // sets for build scripts; read by `KernelBuilder::from_links_metadata`.
        vars.extend(std::env::vars_os().filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            k.starts_with("DEP_").then_some((k, v))
        }));
        let start_dir = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::current_dir().ok());
        let python = Some(
            vars.get("PYTHON")
                .cloned()
                .unwrap_or_else(|| OsString::from("python3")),
        );
        let arch_lib = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
        let mut system_nvshmem = vec![
            (
                PathBuf::from("/usr/local/nvshmem/include"),
                PathBuf::from("/usr/local/nvshmem/lib"),
            ),
            (
                PathBuf::from("/opt/nvidia/nvshmem/include"),
                PathBuf::from("/opt/nvidia/nvshmem/lib"),
            ),
        ];
        // Debian/Ubuntu packages split headers and libraries by CUDA major version.
        for cuda in ["13", "12"] {
            system_nvshmem.push((
                PathBuf::from(format!("/usr/include/nvshmem_{cuda}")),
                PathBuf::from(format!("{arch_lib}/nvshmem/{cuda}")),
            ));
        }
        Probe {
            vars,
            start_dir,
            python,
            system_nvshmem,
            system_cuda: vec![PathBuf::from("/usr/local/cuda")],
            system_libclang: system_libclang_dirs(&arch_lib),
        }
    }

    /// Look nowhere but where the builder methods say: no variables, no Python, no system.
    pub fn isolated() -> Self {
        Probe {
            vars: HashMap::new(),
            start_dir: None,
            python: None,
            system_nvshmem: Vec::new(),
            system_cuda: Vec::new(),
            system_libclang: Vec::new(),
        }
    }

    /// Set a variable as if it were in the environment: a discovery variable
    /// (`NVSHMEM_HOME`, `CUDA_HOME`, `NVCC`, `PATH`...) or `links` metadata
    /// (`DEP_NVSHMEM_RS_INCLUDE`...).
    pub fn var(mut self, name: &str, value: impl Into<OsString>) -> Self {
        self.vars.insert(name.to_string(), value.into());
        self
    }

    /// Walk up from `dir` looking for a `.venv` made by `make setup`.
    pub fn start_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.start_dir = Some(dir.into());
        self
    }

    /// Also ask this Python for the `nvidia.*` wheels (`None`: don't).
    pub fn python(mut self, python: Option<OsString>) -> Self {
        self.python = python;
        self
    }

    /// Replace the system locations for NVSHMEM (`(include, lib)` pairs) and CUDA (roots).
    pub fn system_paths(mut self, nvshmem: Vec<(PathBuf, PathBuf)>, cuda: Vec<PathBuf>) -> Self {
        self.system_nvshmem = nvshmem;
        self.system_cuda = cuda;
        self
    }

    /// Replace the system folders searched for libclang.
    pub fn system_libclang_dirs(mut self, dirs: Vec<PathBuf>) -> Self {
        self.system_libclang = dirs;
        self
    }

    /// Where to look after the variables that name an install ([`SEARCH_VAR`]).
    pub fn search(&self) -> Result<Search, Error> {
        match self.get_var(SEARCH_VAR) {
            Some(v) => v.to_string_lossy().parse(),
            None => Ok(Search::ALL),
        }
    }

    /// Whether this is a docs.rs build ([`DOCS_RS_VAR`] set and not empty): then nothing is
    /// looked for, nothing is compiled and nothing is linked.
    pub fn docs_rs(&self) -> bool {
        self.get_var(DOCS_RS_VAR).is_some()
    }

    /// A variable as this probe sees it (`None` when unset or empty).
    pub fn get_var(&self, name: &str) -> Option<&OsString> {
        self.vars.get(name).filter(|v| !v.is_empty())
    }

    fn path_var(&self, name: &str) -> Option<PathBuf> {
        self.get_var(name).map(PathBuf::from)
    }

    /// `site-packages/nvidia` directories of `.venv`s in `start_dir` and its ancestors.
    fn venv_nvidia_dirs(&self) -> Vec<PathBuf> {
        self.venv_site_packages()
            .into_iter()
            .map(|p| p.join("nvidia"))
            .filter(|p| p.is_dir())
            .collect()
    }

    /// `site-packages` directories of `.venv`s in `start_dir` and its ancestors, nearest
    /// first.
    fn venv_site_packages(&self) -> Vec<PathBuf> {
        let Some(start) = &self.start_dir else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for dir in start.ancestors() {
            let lib = dir.join(".venv").join("lib");
            let Ok(entries) = std::fs::read_dir(&lib) else {
                continue;
            };
            let mut pythons: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
                })
                .collect();
            pythons.sort();
            found.extend(
                pythons
                    .into_iter()
                    .map(|p| p.join("site-packages"))
                    .filter(|p| p.is_dir()),
            );
        }
        found
    }

    /// Ask Python where a package lives (`nvidia.nvshmem`, `nvidia.cu13`...).
    fn python_package_dir(&self, package: &str, search: Search) -> Option<PathBuf> {
        if !search.python {
            return None;
        }
        let python = self.python.as_ref()?;
        let script = format!("import {package} as m; print(list(m.__path__)[0])");
        let out = Command::new(python).args(["-c", &script]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        dir.is_dir().then_some(dir)
    }

    /// Find NVSHMEM: `NVSHMEM_HOME`, the project's `.venv`, `nvidia.nvshmem`, system paths.
    ///
    /// A `NVSHMEM_HOME` that does not hold NVSHMEM is an error, not a reason to look
    /// elsewhere: the user asked for that one.
    pub fn find_nvshmem(&self) -> Result<NvshmemInstall, Error> {
        if let Some(home) = self.path_var("NVSHMEM_HOME") {
            return NvshmemInstall::at_root(&home, Source::EnvVar("NVSHMEM_HOME"));
        }
        let search = self.search()?;
        let mut looked_in = vec!["NVSHMEM_HOME (unset)".to_string()];
        for nvidia in self.venv_nvidia_dirs().into_iter().filter(|_| search.venv) {
            let root = nvidia.join("nvshmem");
            if let Ok(found) = NvshmemInstall::at_root(&root, Source::ProjectVenv(nvidia.clone())) {
                return Ok(found);
            }
            looked_in.push(root.display().to_string());
        }
        if self.start_dir.is_some() && search.venv {
            looked_in.push("no .venv with nvidia/nvshmem above the package".to_string());
        }
        if let Some(root) = self.python_package_dir("nvidia.nvshmem", search) {
            if let Ok(found) = NvshmemInstall::at_root(&root, Source::PythonPackage) {
                return Ok(found);
            }
            looked_in.push(root.display().to_string());
        } else if self.python.is_some() && search.python {
            looked_in.push("Python package nvidia.nvshmem (not installed)".to_string());
        }
        for (include, lib) in self.system_nvshmem.iter().filter(|_| search.system) {
            if let Ok(found) = NvshmemInstall::at(include, lib, Source::System) {
                return Ok(found);
            }
            looked_in.push(include.display().to_string());
        }
        Err(Error::NvshmemNotFound { looked_in })
    }

    /// Find nvcc: `NVCC`, `CUDA_HOME`, the project's `.venv`, `nvidia.cu13`, `PATH`,
    /// `/usr/local/cuda`.
    pub fn find_cuda(&self) -> Result<CudaToolkit, Error> {
        if let Some(nvcc) = self.path_var("NVCC") {
            return CudaToolkit::from_nvcc(&nvcc, Source::EnvVar("NVCC"));
        }
        if let Some(home) = self.path_var("CUDA_HOME") {
            return CudaToolkit::from_nvcc(
                &home.join("bin").join("nvcc"),
                Source::EnvVar("CUDA_HOME"),
            );
        }
        let search = self.search()?;
        let mut looked_in = vec!["NVCC, CUDA_HOME (unset)".to_string()];
        // CUDA 13 wheels install under nvidia/cu13; CUDA 12 ones under nvidia/cuda_nvcc.
        let wheel_roots = ["cu13", "cuda_nvcc"];
        for nvidia in self.venv_nvidia_dirs().into_iter().filter(|_| search.venv) {
            for sub in wheel_roots {
                let nvcc = nvidia.join(sub).join("bin").join("nvcc");
                if let Ok(found) =
                    CudaToolkit::from_nvcc(&nvcc, Source::ProjectVenv(nvidia.clone()))
                {
                    return Ok(found);
                }
                looked_in.push(nvcc.display().to_string());
            }
        }
        for package in ["nvidia.cu13", "nvidia.cuda_nvcc"] {
            if let Some(root) = self.python_package_dir(package, search) {
                if let Ok(found) =
                    CudaToolkit::from_nvcc(&root.join("bin").join("nvcc"), Source::PythonPackage)
                {
                    return Ok(found);
                }
            }
        }
        if let Some(path) = self.vars.get("PATH").filter(|_| search.system) {
            for dir in std::env::split_paths(path) {
                let nvcc = dir.join("nvcc");
                if nvcc.is_file() {
                    if let Ok(found) = CudaToolkit::from_nvcc(&nvcc, Source::Path) {
                        return Ok(found);
                    }
                }
            }
            looked_in.push("PATH".to_string());
        }
        for root in self.system_cuda.iter().filter(|_| search.system) {
            let nvcc = root.join("bin").join("nvcc");
            if let Ok(found) = CudaToolkit::from_nvcc(&nvcc, Source::System) {
                return Ok(found);
            }
            looked_in.push(nvcc.display().to_string());
        }
        Err(Error::NvccNotFound { looked_in })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        assert_eq!(
            "3.4.5".parse::<Version>().unwrap(),
            Version {
                major: 3,
                minor: 4,
                patch: 5
            }
        );
        assert_eq!("13".parse::<Version>().unwrap().major, 13);
        assert!("3.x".parse::<Version>().is_err());
        assert!("1.2.3.4".parse::<Version>().is_err());
    }
}
