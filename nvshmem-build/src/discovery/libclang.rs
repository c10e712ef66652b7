//! Finding libclang, which bindgen loads to parse the NVSHMEM headers.
//!
//! Only the names bindgen (through clang-sys) loads count: `libclang.so`, `libclang-N.so`,
//! `libclang.so.N` and `libclang-N.so.M`. `libclang-cpp.so.N` is clang's C++ API, a different
//! library that bindgen cannot use, and is never taken.

use super::{Probe, Search, Source};
use crate::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The version of the `libclang` wheel that `make setup` installs.
pub const LIBCLANG_WHEEL: &str = "libclang==18.1.1";

/// A libclang shared library that bindgen can load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Libclang {
    /// The library file; hand it to bindgen as `LIBCLANG_PATH` (a file path is allowed).
    pub path: PathBuf,
    /// Where it was found.
    pub source: Source,
}

/// Whether bindgen would load a file of this name as libclang.
///
/// ```
/// use nvshmem_build::is_libclang_file_name;
/// assert!(is_libclang_file_name("libclang.so"));
/// assert!(is_libclang_file_name("libclang-18.so"));
/// assert!(is_libclang_file_name("libclang.so.1"));
/// assert!(is_libclang_file_name("libclang-14.so.14.0.6"));
/// assert!(!is_libclang_file_name("libclang-cpp.so.14")); // clang's C++ API
/// assert!(!is_libclang_file_name("libclang.a"));
/// ```
pub fn is_libclang_file_name(name: &str) -> bool {
    let is_version = |v: &str| {
        !v.is_empty()
            && v.split('.')
                .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
    };
    if name == "libclang.so" {
        return true;
    }
    if let Some(v) = name.strip_prefix("libclang.so.") {
        return is_version(v);
    }
    let Some(rest) = name.strip_prefix("libclang-") else {
        return false;
    };
    match rest.split_once(".so") {
        Some((v, "")) => is_version(v),
        Some((v, suffix)) => is_version(v) && suffix.strip_prefix('.').is_some_and(is_version),
        None => false,
    }
}

/// The version numbers in a libclang file name, for picking the newest in a folder
/// (`libclang.so` has none and sorts first).
fn name_version(name: &str) -> Vec<u32> {
    name.trim_start_matches("libclang")
        .split(['-', '.'])
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The newest libclang in `dir`, by the names bindgen loads.
pub fn libclang_in(dir: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            (is_libclang_file_name(&name) && e.path().is_file()).then_some((name, e.path()))
        })
        .max_by(|(a, _), (b, _)| name_version(a).cmp(&name_version(b)).then(b.cmp(a)))
        .map(|(_, path)| path)
}

/// Standard system folders for libclang: LLVM's own (newest release first), then the
/// multiarch and plain library folders.
pub(super) fn system_libclang_dirs(arch_lib: &str) -> Vec<PathBuf> {
    let mut llvm: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let major = name.strip_prefix("llvm-")?.parse().ok()?;
                    Some((major, e.path().join("lib")))
                })
                .collect()
        })
        .unwrap_or_default();
    llvm.sort_by_key(|(major, _)| std::cmp::Reverse(*major));
    let mut dirs: Vec<PathBuf> = llvm.into_iter().map(|(_, d)| d).collect();
    dirs.extend(
        [arch_lib, "/usr/lib64", "/usr/lib", "/usr/local/lib"]
            .iter()
            .map(PathBuf::from),
    );
    dirs
}

impl Libclang {
    /// Check that the library loads and is clang's C API, so that bindgen's own load cannot
    /// fail later with a panic.
    pub fn check_loads(&self) -> Result<(), Error> {
        let unusable = |reason: String| Error::LibclangUnusable {
            path: self.path.clone(),
            reason,
        };
        // SAFETY: loading runs the library's initialisers; libclang's only set up LLVM's
        // global state, as they do when bindgen loads it.
        let lib = unsafe { libloading::Library::new(&self.path) }
            .map_err(|e| unusable(format!("it does not load ({e})")))?;
        // SAFETY: only the symbol's presence is checked; it is never called.
        unsafe { lib.get::<unsafe extern "C" fn()>(b"clang_createIndex\0") }
            .map(|_| ())
            .map_err(|_| unusable("it has no clang_createIndex: it is not clang's C API".into()))
    }

    /// Clang's resource folder beside the library (`lib/clang/N/include` with `stddef.h`),
    /// which libclang finds on its own. The PyPI wheel has none.
    pub fn resource_include(&self) -> Option<PathBuf> {
        let real = self
            .path
            .canonicalize()
            .unwrap_or_else(|_| self.path.clone());
        let lib_dir = real.parent()?;
        let versions = std::fs::read_dir(lib_dir.join("clang")).ok()?;
        versions
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("include"))
            .find(|inc| inc.join("stddef.h").is_file())
    }
}

impl Probe {
    /// Find libclang for bindgen: `LIBCLANG_PATH` (the file or its folder), the project's
    /// `.venv` (the `libclang` wheel that `make setup` installs), the `clang` package of the
    /// Python that `PYTHON` or `python3` runs, then system folders; narrowed by
    /// [`SEARCH_VAR`](super::SEARCH_VAR).
    ///
    /// A `LIBCLANG_PATH` that holds no libclang is an error, not a reason to look elsewhere.
    pub fn find_libclang(&self) -> Result<Libclang, Error> {
        if let Some(named) = self.path_var("LIBCLANG_PATH") {
            let path = if named.is_dir() {
                libclang_in(&named)
            } else {
                let name = named.file_name().and_then(|n| n.to_str()).unwrap_or("");
                (named.is_file() && is_libclang_file_name(name)).then(|| named.clone())
            };
            return path
                .map(|path| Libclang {
                    path,
                    source: Source::EnvVar("LIBCLANG_PATH"),
                })
                .ok_or(Error::LibclangNotFound {
                    looked_in: vec![format!("LIBCLANG_PATH={}", named.display())],
                });
        }
        let search: Search = self.search()?;
        let mut looked_in = vec!["LIBCLANG_PATH (unset)".to_string()];
        if search.venv {
            let sites = self.venv_site_packages();
            if sites.is_empty() && self.start_dir.is_some() {
                looked_in.push("no .venv above the package".to_string());
            }
            for site in sites {
                let native = site.join("clang").join("native");
                if let Some(path) = libclang_in(&native) {
                    return Ok(Libclang {
                        path,
                        source: Source::ProjectVenv(site),
                    });
                }
                looked_in.push(native.display().to_string());
            }
        }
        if let Some(clang) = self.python_package_dir("clang", search) {
            if let Some(path) = libclang_in(&clang.join("native")) {
                return Ok(Libclang {
                    path,
                    source: Source::PythonPackage,
                });
            }
            looked_in.push(clang.join("native").display().to_string());
        } else if self.python.is_some() && search.python {
            looked_in.push("Python package clang (not installed)".to_string());
        }
        for dir in self.system_libclang.iter().filter(|_| search.system) {
            if let Some(path) = libclang_in(dir) {
                return Ok(Libclang {
                    path,
                    source: Source::System,
                });
            }
            looked_in.push(dir.display().to_string());
        }
        Err(Error::LibclangNotFound { looked_in })
    }

    /// Get bindgen ready in this build script: find libclang ([`find_libclang`]), check
    /// that it loads, point bindgen at it (by setting `LIBCLANG_PATH` for this process,
    /// which bindgen reads when it loads libclang), and return the clang arguments it needs
    /// besides the caller's: `-isystem` with the C compiler's builtin headers when libclang
    /// has none of its own. Call it before the first `bindgen::Builder::generate`, while the
    /// build script is still single-threaded.
    ///
    /// [`find_libclang`]: Self::find_libclang
    pub fn prepare_bindgen(&self) -> Result<Vec<String>, Error> {
        let libclang = self.find_libclang()?;
        libclang.check_loads()?;
        let builtin = self.clang_builtin_include(&libclang)?;
        std::env::set_var("LIBCLANG_PATH", &libclang.path);
        Ok(builtin
            .map(|dir| vec!["-isystem".to_string(), dir.display().to_string()])
            .unwrap_or_default())
    }

    /// The folder of compiler builtin headers (`stddef.h`, `limits.h`...) to give bindgen
    /// with `-isystem` when `libclang` has no resource folder of its own (the PyPI wheel):
    /// the C compiler's (`$CC`, else `cc`, which Rust needs anyway to link). `None` when
    /// libclang brings its own.
    pub fn clang_builtin_include(&self, libclang: &Libclang) -> Result<Option<PathBuf>, Error> {
        if libclang.resource_include().is_some() {
            return Ok(None);
        }
        let cc = self.get_var("CC").cloned().unwrap_or_else(|| "cc".into());
        let out = Command::new(&cc)
            .arg("-print-file-name=include")
            .output()
            .map_err(|source| Error::Spawn {
                program: PathBuf::from(&cc),
                source,
            })?;
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && dir.join("stddef.h").is_file() {
            Ok(Some(dir))
        } else {
            Err(Error::LibclangUnusable {
                path: libclang.path.clone(),
                reason: format!(
                    "it has no builtin headers (lib/clang/N/include) and `{} \
                     -print-file-name=include` names no folder with stddef.h; install gcc, or \
                     set CC to a C compiler",
                    cc.to_string_lossy()
                ),
            })
        }
    }
}
