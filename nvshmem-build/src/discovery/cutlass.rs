//! Finding CUTLASS's C++ headers (CUTLASS 3.x and CuTe, for kernels built for `sm_90a`):
//! `CUTLASS_HOME`, the project's `.venv` (the `nvidia-cutlass` wheel that `make setup`
//! installs ships the headers under `cutlass_library/source/include`), the Python package
//! `cutlass_library`, then system include folders.

use super::{Probe, Source, Version};
use crate::Error;
use std::path::{Path, PathBuf};

/// The wheel `make setup` installs for CUTLASS's headers (installed with `--no-deps`: only
/// the headers are used, not its Python tools).
pub const CUTLASS_WHEEL: &str = "nvidia-cutlass==4.2.0.0";

/// The oldest CUTLASS our kernels build with (the release whose `KernelHardwareInfo` carries
/// `max_active_clusters`, which they set).
pub const CUTLASS_MIN_VERSION: Version = Version {
    major: 4,
    minor: 0,
    patch: 0,
};

/// Where the wheel keeps the headers, below its package folder.
const WHEEL_INCLUDE: &str = "source/include";

/// CUTLASS's headers.
#[derive(Debug, Clone)]
pub struct Cutlass {
    /// The folder holding `cutlass/` and `cute/`.
    pub include_dir: PathBuf,
    /// From `cutlass/version.h`.
    pub version: Version,
    /// Where it was found.
    pub source: Source,
}

impl Cutlass {
    /// CUTLASS at `root`: a checkout or install (`root/include/cute`), the wheel's package
    /// folder (`root/source/include`), the folder of the wheel's packages
    /// (`root/cutlass_library/source/include`), or the include folder itself.
    pub fn at(root: &Path, source: Source) -> Result<Self, Error> {
        let candidates = [
            root.join("include"),
            root.join(WHEEL_INCLUDE),
            root.join("cutlass_library").join(WHEEL_INCLUDE),
            root.to_path_buf(),
        ];
        let Some(include_dir) = candidates
            .into_iter()
            .find(|d| d.join("cute").join("tensor.hpp").is_file())
        else {
            return Err(Error::CutlassIncomplete {
                root: root.to_path_buf(),
                missing: root.join("include/cute/tensor.hpp"),
            });
        };
        let version_h = include_dir.join("cutlass").join("version.h");
        let text = std::fs::read_to_string(&version_h).map_err(|_| Error::CutlassIncomplete {
            root: root.to_path_buf(),
            missing: version_h.clone(),
        })?;
        let define = |name: &str| {
            text.lines().find_map(|l| {
                let rest = l.trim().strip_prefix("#define")?.trim_start();
                rest.strip_prefix(name)?.trim().parse::<u32>().ok()
            })
        };
        let (Some(major), Some(minor)) = (define("CUTLASS_MAJOR"), define("CUTLASS_MINOR")) else {
            return Err(Error::CutlassIncomplete {
                root: root.to_path_buf(),
                missing: version_h,
            });
        };
        let version = Version {
            major,
            minor,
            patch: define("CUTLASS_PATCH").unwrap_or(0),
        };
        if version < CUTLASS_MIN_VERSION {
            return Err(Error::CutlassTooOld {
                include_dir,
                version,
            });
        }
        Ok(Cutlass {
            include_dir,
            version,
            source,
        })
    }
}

impl Probe {
    /// Find CUTLASS's headers: `CUTLASS_HOME`, the project's `.venv`, the Python package
    /// `cutlass_library`, then `/usr/local/include` and `/usr/include` (or the folders given
    /// to [`system_cutlass_dirs`](Self::system_cutlass_dirs)).
    ///
    /// A `CUTLASS_HOME` that does not hold CUTLASS is an error, not a reason to look
    /// elsewhere.
    pub fn find_cutlass(&self) -> Result<Cutlass, Error> {
        if let Some(home) = self.get_var("CUTLASS_HOME") {
            return Cutlass::at(Path::new(home), Source::EnvVar("CUTLASS_HOME"));
        }
        let search = self.search()?;
        let mut looked_in = vec!["CUTLASS_HOME (unset)".to_string()];
        let mut too_old = None;
        let mut consider = |found: Result<Cutlass, Error>, place: String| match found {
            Ok(c) => Some(c),
            Err(e @ Error::CutlassTooOld { .. }) => {
                too_old.get_or_insert(e);
                None
            }
            Err(_) => {
                looked_in.push(place);
                None
            }
        };
        for site in self
            .venv_site_packages()
            .into_iter()
            .filter(|_| search.venv)
        {
            let package = site.join("cutlass_library");
            let place = package.display().to_string();
            let source = Source::ProjectVenv(site.clone());
            if let Some(c) = consider(Cutlass::at(&package, source), place) {
                return Ok(c);
            }
        }
        if let Some(package) = self.python_package_dir("cutlass_library", search) {
            let place = package.display().to_string();
            if let Some(c) = consider(Cutlass::at(&package, Source::PythonPackage), place) {
                return Ok(c);
            }
        }
        for dir in self.system_cutlass.iter().filter(|_| search.system) {
            let place = dir.display().to_string();
            if let Some(c) = consider(Cutlass::at(dir, Source::System), place) {
                return Ok(c);
            }
        }
        Err(too_old.unwrap_or(Error::CutlassNotFound { looked_in }))
    }
}
