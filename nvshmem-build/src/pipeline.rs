//! The kernel pipeline: `nvcc -rdc=true -cubin`, then `nvlink` with `libnvshmem_device.a`,
//! one linked cubin per source file and architecture.

use crate::discovery::{
    CudaToolkit, NvshmemInstall, Probe, Source, Version, DOCS_RS_VAR, PINNED_NVSHMEM,
};
use crate::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Variable that overrides the architectures kernels are built for (`sm_90,sm_100`).
pub const ARCHS_VAR: &str = "NVSHMEM_RS_CUDA_ARCHS";
/// Architectures built when nothing else is asked for: Hopper.
pub const DEFAULT_ARCHS: &[&str] = &["sm_90"];

/// One GPU architecture, such as `sm_90` or `sm_90a`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arch {
    /// Compute capability times ten (90 for 9.0).
    pub capability: u32,
    /// The architecture-specific suffix (`a` in `sm_90a`), if any.
    pub suffix: String,
}

impl Arch {
    /// Parse `sm_90`, `sm_90a`, `compute_90` or `90`.
    pub fn parse(s: &str) -> Result<Arch, Error> {
        let t = s.trim();
        let t = t
            .strip_prefix("sm_")
            .or_else(|| t.strip_prefix("compute_"))
            .unwrap_or(t);
        let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
        let suffix = &t[digits.len()..];
        match digits.parse::<u32>() {
            Ok(capability) if capability >= 70 && matches!(suffix, "" | "a" | "f") => Ok(Arch {
                capability,
                suffix: suffix.to_string(),
            }),
            _ => Err(Error::Invalid(format!(
                "`{s}` is not a CUDA architecture NVSHMEM supports; write sm_90, sm_90a or 90 \
                 (in {ARCHS_VAR}, separate several with commas)"
            ))),
        }
    }

    /// Parse a comma, semicolon or space separated list.
    pub fn parse_list(s: &str) -> Result<Vec<Arch>, Error> {
        let mut archs = Vec::new();
        for part in s
            .split(|c: char| c == ',' || c == ';' || c.is_whitespace())
            .filter(|p| !p.is_empty())
        {
            let arch = Arch::parse(part)?;
            if !archs.contains(&arch) {
                archs.push(arch);
            }
        }
        if archs.is_empty() {
            return Err(Error::Invalid(format!("{ARCHS_VAR} names no architecture")));
        }
        Ok(archs)
    }

    /// `sm_90a`.
    pub fn sm(&self) -> String {
        format!("sm_{}{}", self.capability, self.suffix)
    }

    /// Whether the code runs only on GPUs of exactly this capability (`sm_90a`: WGMMA, TMA
    /// multicast, `setmaxnreg`), not on later ones of the same major version.
    pub fn is_specific(&self) -> bool {
        self.suffix == "a"
    }

    fn compute(&self) -> String {
        format!("compute_{}{}", self.capability, self.suffix)
    }
}

/// A source file compiled for each requested architecture.
#[derive(Debug, Clone)]
pub struct BuiltKernel {
    /// The file stem: `allreduce` for `allreduce.cu`.
    pub name: String,
    /// The source file.
    pub source: PathBuf,
    /// One linked cubin per architecture, lowest first.
    pub cubins: Vec<(Arch, PathBuf)>,
}

impl BuiltKernel {
    /// The name of the constant [`BuiltKernels::write_rust_module`] gives this file
    /// (`ALL_REDUCE` for `all-reduce.cu`).
    pub fn const_name(&self) -> String {
        const_name(&self.name)
    }

    /// The linked cubin for `arch` (`sm_90`, `90`...), if it was built.
    pub fn cubin(&self, arch: &str) -> Option<&Path> {
        let arch = Arch::parse(arch).ok()?;
        self.cubins
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(_, p)| p.as_path())
    }
}

/// The output of [`KernelBuilder::build`].
#[derive(Debug, Clone)]
pub struct BuiltKernels {
    /// One per source file.
    pub kernels: Vec<BuiltKernel>,
    /// The NVSHMEM whose device library is linked into every cubin.
    pub nvshmem: NvshmemInstall,
    out_dir: PathBuf,
    rust_path: String,
}

impl BuiltKernels {
    /// The kernel built from the source file with this stem (`ring` for `ring.cu`).
    pub fn get(&self, name: &str) -> Option<&BuiltKernel> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// The directory the cubins and the Rust module are written to.
    pub fn out_dir(&self) -> &Path {
        &self.out_dir
    }

    /// What a build script does with the result: [`write_rust_module`](Self::write_rust_module)
    /// into `file_name`, then [`emit_rpath`](Self::emit_rpath). Returns the module's path.
    pub fn emit(&self, file_name: &str) -> Result<PathBuf, Error> {
        let path = self.write_rust_module(file_name)?;
        self.emit_rpath();
        Ok(path)
    }

    /// Give the calling package's binaries, tests and examples an rpath to the NVSHMEM host
    /// library these kernels were linked against (see [`crate::emit_rpath`]). Nothing in a
    /// docs.rs build.
    pub fn emit_rpath(&self) {
        if !self.nvshmem.is_docs_rs() {
            crate::emit_rpath(&self.nvshmem.lib_dir);
        }
    }

    /// Write a Rust file into the output directory with one `CubinSet` constant per source
    /// file (`ALLREDUCE` for `allreduce.cu`), the cubins embedded with `include_bytes!`.
    /// Include it with `include!(concat!(env!("OUT_DIR"), "/kernels.rs"))`.
    pub fn write_rust_module(&self, file_name: &str) -> Result<PathBuf, Error> {
        let path = self.out_dir.join(file_name);
        std::fs::write(&path, self.rust_module()).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    /// The text [`write_rust_module`](Self::write_rust_module) writes: per source file, one
    /// hidden constant per cubin (the bytes, 16-byte aligned so ELF readers can parse them in
    /// place), then the public `CubinSet` constant.
    pub fn rust_module(&self) -> String {
        let p = &self.rust_path;
        let mut out =
            String::from("// Generated by nvshmem-build: linked cubins of this crate's kernels.\n");
        for k in &self.kernels {
            let name = const_name(&k.name);
            let mut images = Vec::new();
            for (arch, file) in &k.cubins {
                let bytes = format!("__NVSHMEM_CUBIN_{name}_{}", arch.sm().to_ascii_uppercase());
                out.push_str(&format!(
                    "#[doc(hidden)]\n#[allow(dead_code)]\nconst {bytes}: &{p}::module::Aligned<[u8]> = \
                     &{p}::module::Aligned(*include_bytes!({:?}));\n",
                    file.display().to_string()
                ));
                images.push(format!(
                    "{p}::module::CubinImage {{ capability: {}, arch_specific: {}, bytes: &{bytes}.0 }}",
                    arch.capability,
                    arch.is_specific()
                ));
            }
            out.push_str(&format!(
                "#[doc(hidden)]\n#[allow(dead_code)]\nconst __NVSHMEM_IMAGES_{name}: &[{p}::module::CubinImage] = &[{}];\n",
                images.join(", ")
            ));
            out.push_str(&format!(
                "/// Linked cubins of `{}`.\n#[allow(dead_code)]\npub const {name}: {p}::module::CubinSet = \
                 {p}::module::CubinSet::new({:?}, __NVSHMEM_IMAGES_{name});\n",
                k.source.display(),
                k.name,
            ));
        }
        out
    }
}

fn const_name(stem: &str) -> String {
    let mut s: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// The `links` metadata key (as cargo passes it on, upper case) under which a crate passes its exported header directories
/// (`DEP_<LINKS>_HEADERS`, a path list) to the kernels of crates that depend on it.
const HEADERS_KEY: &str = "HEADERS";

/// Compiles CUDA C files that call NVSHMEM device functions into linked cubins.
///
/// In a docs.rs build ([`DOCS_RS_VAR`] set) the constructors that discover the toolchain
/// ([`from_env`](Self::from_env), [`from_nvshmem_dependency`](Self::from_nvshmem_dependency),
/// [`from_links_metadata`](Self::from_links_metadata)) look for nothing and return a
/// builder over stand-ins ([`NvshmemInstall::docs_rs`]); its [`build`](Self::build) compiles
/// nothing and returns every source with no cubins, so the Rust module it writes declares
/// the same `CubinSet` constants, empty, and the crate's documentation builds unchanged.
/// [`build_host_library`](Self::build_host_library) compiles nothing and links nothing.
#[derive(Debug, Clone)]
pub struct KernelBuilder {
    cuda: CudaToolkit,
    nvshmem: NvshmemInstall,
    archs: Vec<Arch>,
    sources: Vec<PathBuf>,
    include_dirs: Vec<PathBuf>,
    /// Header directories passed on to dependent crates' kernels ([`Self::export_headers`]).
    exported_headers: Vec<PathBuf>,
    flags: Vec<String>,
    /// Compile without `-rdc` and link nothing ([`Self::whole_program`]).
    whole_program: bool,
    out_dir: Option<PathBuf>,
    rust_path: String,
}

impl KernelBuilder {
    /// A builder for the given toolchain. Architectures come from `NVSHMEM_RS_CUDA_ARCHS`
    /// when set, else `sm_90`; the output directory is `OUT_DIR`.
    pub fn new(cuda: CudaToolkit, nvshmem: NvshmemInstall) -> Result<Self, Error> {
        if std::env::var_os("OUT_DIR").is_some() {
            println!("cargo:rerun-if-env-changed={ARCHS_VAR}");
        }
        let archs = match std::env::var(ARCHS_VAR) {
            Ok(list) => Arch::parse_list(&list)?,
            Err(_) => DEFAULT_ARCHS
                .iter()
                .map(|a| Arch::parse(a))
                .collect::<Result<_, _>>()?,
        };
        Ok(KernelBuilder {
            cuda,
            nvshmem,
            archs,
            sources: Vec::new(),
            include_dirs: Vec::new(),
            exported_headers: Vec::new(),
            flags: vec!["-O3".into(), "-std=c++17".into(), "-lineinfo".into()],
            whole_program: false,
            out_dir: std::env::var_os("OUT_DIR").map(PathBuf::from),
            rust_path: "::nvshmem".into(),
        })
    }

    /// Find NVSHMEM and nvcc the usual way ([`Probe::from_env`]), and check that the
    /// NVSHMEM found is one release throughout ([`NvshmemInstall::check_release`]).
    pub fn from_env() -> Result<Self, Error> {
        let probe = Probe::from_env();
        if probe.docs_rs() {
            return Self::docs_rs(PINNED_NVSHMEM);
        }
        let nvshmem = probe.find_nvshmem()?;
        nvshmem.check_release()?;
        Self::new(probe.find_cuda()?, nvshmem)
    }

    /// The builder of a docs.rs build: stand-ins for the toolchain, nothing compiled.
    fn docs_rs(version: Version) -> Result<Self, Error> {
        Self::new(CudaToolkit::docs_rs(), NvshmemInstall::docs_rs(version))
    }

    /// Whether this builder is a docs.rs build's ([`DOCS_RS_VAR`]), which compiles nothing.
    pub fn is_docs_rs(&self) -> bool {
        self.nvshmem.is_docs_rs()
    }

    /// For a crate that depends on `nvshmem`: build against exactly the NVSHMEM (and nvcc)
    /// that `nvshmem` was built with, read from its `links` metadata
    /// (`DEP_NVSHMEM_RS_INCLUDE`, `DEP_NVSHMEM_RS_LIB_DIR`, `DEP_NVSHMEM_RS_VERSION`,
    /// `DEP_NVSHMEM_RS_NVCC`), which cargo passes to the build scripts of crates that list
    /// `nvshmem` under `[dependencies]`.
    ///
    /// `NVCC`/`CUDA_HOME` still choose the compiler. An `NVSHMEM_HOME` naming a different
    /// NVSHMEM release is an error ([`Error::NvshmemMismatch`]): cubins must link the device
    /// library of the host library that will run them.
    pub fn from_nvshmem_dependency() -> Result<Self, Error> {
        Self::from_links_metadata("NVSHMEM_RS", "nvshmem")
    }

    /// Like [`from_nvshmem_dependency`](Self::from_nvshmem_dependency), for the metadata of
    /// the direct dependency whose `links` key is `links` (`NVSHMEM` for `nvshmem-sys`).
    pub fn from_links_metadata(links: &str, crate_name: &str) -> Result<Self, Error> {
        Self::from_links_metadata_in(&Probe::from_env(), links, crate_name)
    }

    /// [`from_links_metadata`](Self::from_links_metadata) with the variables of `probe`
    /// instead of the process environment (`DEP_<LINKS>_*`, `NVSHMEM_HOME`, `NVCC`,
    /// `CUDA_HOME`; see [`Probe::var`]).
    pub fn from_links_metadata_in(
        probe: &Probe,
        links: &str,
        crate_name: &str,
    ) -> Result<Self, Error> {
        let key = |k: &str| format!("DEP_{}_{k}", links.to_ascii_uppercase().replace('-', "_"));
        let dep = |k: &str| probe.get_var(&key(k)).map(PathBuf::from);
        if probe.docs_rs() {
            // The dependency's docs.rs build passes on only its release, if that.
            let version = probe
                .get_var(&key("VERSION"))
                .and_then(|v| v.to_str()?.parse::<Version>().ok())
                .unwrap_or(PINNED_NVSHMEM);
            return Self::docs_rs(version);
        }
        let missing = |k: &str| Error::MissingMetadata {
            var: key(k),
            crate_name: crate_name.to_string(),
        };
        let include = dep("INCLUDE").ok_or_else(|| missing("INCLUDE"))?;
        let lib = dep("LIB_DIR").ok_or_else(|| missing("LIB_DIR"))?;
        let nvshmem = NvshmemInstall::at(&include, &lib, Source::Metadata)?;
        let root = |i: &NvshmemInstall| {
            i.include_dir
                .parent()
                .unwrap_or(&i.include_dir)
                .to_path_buf()
        };
        // The headers must still be the release the dependency was built against.
        if let Some(built) = probe
            .get_var(&key("VERSION"))
            .and_then(|v| v.to_str()?.parse::<Version>().ok())
        {
            if built != nvshmem.version {
                return Err(Error::NvshmemMismatch {
                    requested_by: format!("the headers now at {}", include.display()),
                    requested: nvshmem.version,
                    requested_at: root(&nvshmem),
                    built,
                    built_at: root(&nvshmem),
                    crate_name: crate_name.to_string(),
                });
            }
        }
        if let Some(home) = probe.get_var("NVSHMEM_HOME") {
            let asked = NvshmemInstall::at_root(Path::new(home), Source::EnvVar("NVSHMEM_HOME"))?;
            if asked.version != nvshmem.version {
                return Err(Error::NvshmemMismatch {
                    requested_by: "NVSHMEM_HOME".into(),
                    requested: asked.version,
                    requested_at: PathBuf::from(home),
                    built: nvshmem.version,
                    built_at: root(&nvshmem),
                    crate_name: crate_name.to_string(),
                });
            }
        }
        let explicit_cuda = probe.get_var("NVCC").is_some() || probe.get_var("CUDA_HOME").is_some();
        let cuda = match dep("NVCC") {
            Some(nvcc) if !explicit_cuda => CudaToolkit::from_nvcc(&nvcc, Source::Metadata)?,
            _ => probe.find_cuda()?,
        };
        let mut builder = Self::new(cuda, nvshmem)?;
        // Headers the dependency ships for its users' kernels (`nvshmem_rs/channel.cuh`).
        if let Some(headers) = probe.get_var(&key(HEADERS_KEY)) {
            builder.include_dirs.extend(std::env::split_paths(headers));
        }
        Ok(builder)
    }

    /// Put the headers in `dir` on this build's include path and on the include path of
    /// every crate that builds kernels against this one
    /// ([`from_links_metadata`](Self::from_links_metadata) reads them back from
    /// `DEP_<LINKS>_HEADERS`), so its users can `#include` the device headers this crate
    /// ships. Takes effect in the metadata printed by
    /// [`emit_links_metadata`](Self::emit_links_metadata).
    pub fn export_headers(mut self, dir: impl AsRef<Path>) -> Result<Self, Error> {
        let dir = dir.as_ref();
        let absolute = dir.canonicalize().map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        self.include_dirs.push(absolute.clone());
        self.exported_headers.push(absolute);
        Ok(self)
    }

    /// Print the `links` metadata that [`from_links_metadata`](Self::from_links_metadata)
    /// reads, so crates depending on the caller can build kernels against the same toolchain.
    pub fn emit_links_metadata(&self) {
        if self.is_docs_rs() {
            println!("cargo:version={}", self.nvshmem.version);
            return;
        }
        println!("cargo:include={}", self.nvshmem.include_dir.display());
        println!("cargo:lib_dir={}", self.nvshmem.lib_dir.display());
        println!("cargo:version={}", self.nvshmem.version);
        println!("cargo:nvcc={}", self.cuda.nvcc.display());
        if let Ok(dirs) = std::env::join_paths(&self.exported_headers) {
            if !self.exported_headers.is_empty() {
                println!("cargo:headers={}", dirs.to_string_lossy());
            }
        }
    }

    /// The architectures this builder compiles for.
    pub fn arch_list(&self) -> &[Arch] {
        &self.archs
    }

    /// The toolchain this builder uses.
    pub fn toolchain(&self) -> (&CudaToolkit, &NvshmemInstall) {
        (&self.cuda, &self.nvshmem)
    }

    /// Build for these architectures instead (`sm_90`, `sm_90a`, `100`...).
    pub fn archs<I, S>(mut self, archs: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.archs.clear();
        for a in archs {
            let arch = Arch::parse(a.as_ref())?;
            if !self.archs.contains(&arch) {
                self.archs.push(arch);
            }
        }
        if self.archs.is_empty() {
            return Err(Error::Invalid("no architecture given".into()));
        }
        Ok(self)
    }

    /// Add one `.cu` file.
    pub fn source(mut self, path: impl AsRef<Path>) -> Self {
        self.sources.push(path.as_ref().to_path_buf());
        self
    }

    /// Add every `.cu` file in `dir` (sorted), and its headers to the include path.
    pub fn source_dir(self, dir: impl AsRef<Path>) -> Result<Self, Error> {
        self.source_dir_where(dir, |_| true)
    }

    /// [`source_dir`](Self::source_dir) with only the `.cu` files for which `keep` is true
    /// (a crate whose features leave some kernels out).
    pub fn source_dir_where(
        mut self,
        dir: impl AsRef<Path>,
        keep: impl Fn(&Path) -> bool,
    ) -> Result<Self, Error> {
        let dir = dir.as_ref();
        let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "cu") && keep(p))
            .collect();
        files.sort();
        if std::env::var_os("OUT_DIR").is_some() {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
        self.sources.extend(files);
        self.include_dirs.push(dir.to_path_buf());
        Ok(self)
    }

    /// Add an include directory.
    pub fn include_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.include_dirs.push(dir.as_ref().to_path_buf());
        self
    }

    /// Pass an extra flag to nvcc (`-DUSE_X`, `-G`...).
    pub fn flag(mut self, flag: impl Into<String>) -> Self {
        self.flags.push(flag.into());
        self
    }

    /// Compile each source as a whole program (`nvcc -cubin` without `-rdc=true`) and link
    /// nothing into it: for kernels that call no NVSHMEM device function and need all of
    /// ptxas. With `-rdc=true` ptxas ignores `setmaxnreg` and serialises `wgmma` (its
    /// C7504 and C7509 notes), which costs a Hopper GEMM much of its speed.
    pub fn whole_program(mut self) -> Self {
        self.whole_program = true;
        self
    }

    /// Write cubins here instead of `OUT_DIR`.
    pub fn out_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.out_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The path of the `nvshmem` crate in generated code (`::nvshmem`; `crate` inside it).
    pub fn rust_path(mut self, path: impl Into<String>) -> Self {
        self.rust_path = path.into();
        self
    }

    /// The nvcc command for one source and architecture (exposed for tests and logs).
    pub fn compile_command(&self, source: &Path, arch: &Arch, object: &Path) -> Command {
        let mut cmd = Command::new(&self.cuda.nvcc);
        cmd.arg(format!(
            "-gencode=arch={},code={}",
            arch.compute(),
            arch.sm()
        ))
        .args(if self.whole_program {
            &["-cubin"][..]
        } else {
            &["-rdc=true", "-cubin"][..]
        })
        .args(&self.flags)
        .arg(format!("-I{}", self.nvshmem.include_dir.display()));
        for dir in &self.include_dirs {
            cmd.arg(format!("-I{}", dir.display()));
        }
        cmd.arg("-o").arg(object).arg(source);
        cmd
    }

    /// The nvlink command that links NVSHMEM's device library into a cubin.
    pub fn link_command(&self, arch: &Arch, object: &Path, linked: &Path) -> Command {
        let mut cmd = Command::new(&self.cuda.nvlink);
        cmd.arg(format!("-arch={}", arch.sm()))
            .arg(object)
            .arg(&self.nvshmem.device_lib)
            .arg("-o")
            .arg(linked);
        cmd
    }

    /// Compile and link every source for every architecture, in parallel.
    pub fn build(&self) -> Result<BuiltKernels, Error> {
        if self.sources.is_empty() {
            return Err(Error::Invalid(
                "no CUDA source files to build: add .cu files to the kernel directory, or name them with source()"
                    .into(),
            ));
        }
        // Cubins are named after the file stem, and so are the generated constants.
        let mut seen = std::collections::HashMap::new();
        for src in &self.sources {
            let stem = src
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if let Some(other) = seen.insert(const_name(&stem), src) {
                return Err(Error::Invalid(format!(
                    "{} and {} would both become the constant {}; rename one of them",
                    other.display(),
                    src.display(),
                    const_name(&stem)
                )));
            }
        }
        let (out_dir, cubin_dir) = self.output_dir("cubins")?;
        let in_build_script = std::env::var_os("OUT_DIR").is_some();
        if self.is_docs_rs() {
            println!(
                "nvshmem-build: {DOCS_RS_VAR} is set: {} CUDA sources not compiled; their \
                 CubinSet constants hold no cubins (documentation only)",
                self.sources.len()
            );
        }
        let jobs: Vec<(usize, Arch)> = (0..self.sources.len())
            .filter(|_| !self.is_docs_rs())
            .flat_map(|i| self.archs.iter().map(move |a| (i, a.clone())))
            .collect();
        let workers = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(jobs.len());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Result<(usize, Arch, PathBuf), Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    s.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some((i, arch)) = jobs.get(j) else { break };
                            done.push(
                                self.build_one(&self.sources[*i], arch, &cubin_dir)
                                    .map(|p| (*i, arch.clone(), p)),
                            );
                        }
                        done
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("kernel build worker panicked"))
                .collect()
        });
        let mut kernels: Vec<BuiltKernel> = self
            .sources
            .iter()
            .map(|src| {
                if in_build_script {
                    println!("cargo:rerun-if-changed={}", src.display());
                }
                BuiltKernel {
                    name: src
                        .file_stem()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned(),
                    source: src.clone(),
                    cubins: Vec::new(),
                }
            })
            .collect();
        for r in results {
            let (i, arch, path) = r?;
            kernels[i].cubins.push((arch, path));
        }
        for k in &mut kernels {
            k.cubins.sort_by_key(|(a, _)| a.capability);
        }
        Ok(BuiltKernels {
            kernels,
            nvshmem: self.nvshmem.clone(),
            out_dir,
            rust_path: self.rust_path.clone(),
        })
    }

    /// The output directory and its sub-directory `sub`, made if missing.
    fn output_dir(&self, sub: &str) -> Result<(PathBuf, PathBuf), Error> {
        let out_dir = self.out_dir.clone().ok_or_else(|| {
            Error::Invalid(
                "no output directory: OUT_DIR is unset outside build scripts; call out_dir()"
                    .into(),
            )
        })?;
        let dir = out_dir.join(sub);
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        Ok((out_dir, dir))
    }

    fn build_one(&self, source: &Path, arch: &Arch, dir: &Path) -> Result<PathBuf, Error> {
        if !source.is_file() {
            return Err(Error::Io {
                path: source.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "CUDA source not found"),
            });
        }
        let stem = source.file_stem().unwrap_or_default().to_string_lossy();
        let object = dir.join(format!("{stem}.{}.cubin", arch.sm()));
        let linked = dir.join(format!("{stem}.{}.linked.cubin", arch.sm()));
        run(
            self.compile_command(source, arch, &object),
            format!("compiling {} for {}", source.display(), arch.sm()),
        )?;
        if self.whole_program {
            return Ok(object);
        }
        run(
            self.link_command(arch, &object, &linked),
            format!(
                "linking {} for {} with {} (NVSHMEM {})",
                source.display(),
                arch.sm(),
                self.nvshmem.device_lib.display(),
                self.nvshmem.version
            ),
        )?;
        Ok(linked)
    }
}

/// Host code compiled by nvcc into a static library ([`KernelBuilder::build_host_library`]):
/// the CUTLASS host code that prepares a kernel's parameters (TMA descriptors, tile
/// schedules), so that the kernel itself is launched like any other, from its cubin.
#[derive(Debug, Clone)]
pub struct HostLibrary {
    /// The name to link (`lib<name>.a`).
    pub name: String,
    /// The archive; empty in a docs.rs build, which compiles and links nothing.
    pub path: PathBuf,
    /// The static CUDA runtime (`libcudart_static.a`) the host code refers to: nvcc's host
    /// code registers its (empty) device image with it, and CUTLASS's helpers call it.
    pub cuda_runtime: PathBuf,
}

impl HostLibrary {
    /// Print the cargo lines that link the library into the calling package, with the
    /// static CUDA runtime and the C++ and system libraries it needs. Nothing in a docs.rs
    /// build.
    pub fn emit_link(&self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let dir = |p: &Path| p.parent().unwrap_or(Path::new(".")).display().to_string();
        println!("cargo:rustc-link-search=native={}", dir(&self.path));
        println!("cargo:rustc-link-lib=static={}", self.name);
        println!("cargo:rustc-link-search=native={}", dir(&self.cuda_runtime));
        println!("cargo:rustc-link-lib=static=cudart_static");
        for lib in ["stdc++", "dl", "rt", "pthread"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
}

impl KernelBuilder {
    /// The nvcc command that compiles one source as host code (an object with
    /// position-independent code, for a static library).
    pub fn host_compile_command(&self, source: &Path, object: &Path) -> Command {
        let arch = &self.archs[0];
        let mut cmd = Command::new(&self.cuda.nvcc);
        cmd.arg(format!(
            "-gencode=arch={},code={}",
            arch.compute(),
            arch.sm()
        ))
        .args(["-c", "-Xcompiler", "-fPIC"])
        .args(&self.flags)
        .arg(format!("-I{}", self.nvshmem.include_dir.display()));
        for dir in &self.include_dirs {
            cmd.arg(format!("-I{}", dir.display()));
        }
        cmd.arg("-o").arg(object).arg(source);
        cmd
    }

    /// Compile `sources` as host code with this builder's flags and include folders (nvcc
    /// `-c`, in parallel) and archive them into `lib<name>.a` in the output directory. Link
    /// the result with [`HostLibrary::emit_link`].
    pub fn build_host_library<P: AsRef<Path>>(
        &self,
        name: &str,
        sources: &[P],
    ) -> Result<HostLibrary, Error> {
        if sources.is_empty()
            || name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(Error::Invalid(format!(
                "a host library needs sources and a name of letters, digits and `_`, not {name:?}"
            )));
        }
        if self.is_docs_rs() {
            return Ok(HostLibrary {
                name: name.to_string(),
                path: PathBuf::new(),
                cuda_runtime: PathBuf::new(),
            });
        }
        let cuda_runtime = self.cuda.static_runtime()?;
        let (_, dir) = self.output_dir("host")?;
        let objects: Vec<PathBuf> = sources
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let stem = s.as_ref().file_stem().unwrap_or_default().to_string_lossy();
                dir.join(format!("{name}.{i}.{stem}.o"))
            })
            .collect();
        let results: Vec<Result<(), Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = sources
                .iter()
                .zip(&objects)
                .map(|(src, obj)| {
                    let src = src.as_ref();
                    if std::env::var_os("OUT_DIR").is_some() {
                        println!("cargo:rerun-if-changed={}", src.display());
                    }
                    scope.spawn(move || {
                        run(
                            self.host_compile_command(src, obj),
                            format!("compiling {} as host code", src.display()),
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("host compile worker panicked"))
                .collect()
        });
        results.into_iter().collect::<Result<Vec<()>, Error>>()?;
        let path = dir.join(format!("lib{name}.a"));
        let _ = std::fs::remove_file(&path);
        let mut archive = Command::new(&self.cuda.nvcc);
        archive.arg("--lib").arg("-o").arg(&path).args(&objects);
        run(archive, format!("archiving {}", path.display()))?;
        Ok(HostLibrary {
            name: name.to_string(),
            path,
            cuda_runtime,
        })
    }
}

fn run(mut cmd: Command, what: String) -> Result<(), Error> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd.output().map_err(|source| Error::Spawn {
        program: PathBuf::from(cmd.get_program()),
        source,
    })?;
    if out.status.success() {
        return Ok(());
    }
    let mut output = String::from_utf8_lossy(&out.stderr).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stdout));
    if output.trim().is_empty() {
        output = format!("(no output; {})", out.status);
    }
    Err(Error::Compile {
        what,
        command: shown,
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_arches() {
        let a = Arch::parse("sm_90a").unwrap();
        assert_eq!(
            (a.capability, a.suffix.as_str(), a.sm()),
            (90, "a", "sm_90a".to_string())
        );
        assert_eq!(Arch::parse("100").unwrap().sm(), "sm_100");
        assert_eq!(Arch::parse("compute_90").unwrap().compute(), "compute_90");
        let list = Arch::parse_list("sm_90, sm_100;120 90").unwrap();
        assert_eq!(
            list.iter().map(|a| a.capability).collect::<Vec<_>>(),
            vec![90, 100, 120]
        );
        for bad in ["", "sm_", "sm_60", "gfx90a", "sm_90x"] {
            assert!(Arch::parse_list(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn const_names_are_identifiers() {
        assert_eq!(const_name("all-reduce"), "ALL_REDUCE");
        assert_eq!(const_name("2shot"), "_2SHOT");
    }
}
