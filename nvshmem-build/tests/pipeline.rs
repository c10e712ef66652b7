//! The kernel pipeline with stand-in `nvcc`/`nvlink` scripts that log their arguments and
//! write placeholder outputs: what is run, where the cubins go, the generated Rust module, and
//! how failures are reported. Runs without a CUDA toolchain.

#![cfg(unix)]

mod common;

use common::{fake_nvshmem, write, Scratch};
use nvshmem_build::{CudaToolkit, Error, KernelBuilder, NvshmemInstall, Probe, Source};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Writing an executable while another thread forks can make the later exec fail with
/// "text file busy"; tests here write and run their scripts one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A tool that appends its arguments to `calls.log` beside it and writes `-o`'s file.
const TOOL: &str = r#"#!/bin/sh
out=""
prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out="$a"; fi
  prev="$a"
done
echo "$(basename "$0") $*" >> "$(dirname "$0")/calls.log"
printf 'placeholder cubin' > "$out"
"#;

/// An nvcc that fails like nvcc does, naming the last argument (the source) and a line.
const FAILING_NVCC: &str = r#"#!/bin/sh
for a in "$@"; do src="$a"; done
echo "$src(3): error: identifier \"oops\" is undefined" >&2
echo "1 error detected in the compilation of \"$src\"." >&2
exit 2
"#;

fn executable(path: &Path, text: &str) {
    write(path, text);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

struct Toolchain {
    tmp: Scratch,
    cuda: CudaToolkit,
    nvshmem: NvshmemInstall,
}

impl Toolchain {
    fn new(tag: &str, nvcc: &str) -> Toolchain {
        let tmp = Scratch::new(tag);
        executable(&tmp.join("cuda/bin/nvcc"), nvcc);
        executable(&tmp.join("cuda/bin/nvlink"), TOOL);
        fake_nvshmem(&tmp.join("nvshmem"), (3, 4, 5));
        let cuda =
            CudaToolkit::from_nvcc(&tmp.join("cuda/bin/nvcc"), Source::EnvVar("NVCC")).unwrap();
        let nvshmem =
            NvshmemInstall::at_root(&tmp.join("nvshmem"), Source::EnvVar("NVSHMEM_HOME")).unwrap();
        Toolchain { tmp, cuda, nvshmem }
    }

    fn builder(&self) -> KernelBuilder {
        KernelBuilder::new(self.cuda.clone(), self.nvshmem.clone())
            .unwrap()
            .archs(["sm_90"])
            .unwrap()
            .out_dir(self.tmp.join("out"))
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.tmp.join("cuda/bin/calls.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    fn kernels(&self, names: &[&str]) -> PathBuf {
        let dir = self.tmp.join("kernels");
        for n in names {
            write(&dir.join(n), "extern \"C\" __global__ void k() {}\n");
        }
        write(&dir.join("common.cuh"), "// a header, not a source\n");
        dir
    }
}

#[test]
fn every_source_is_compiled_and_linked_for_every_arch() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tc = Toolchain::new("pipeline", TOOL);
    let dir = tc.kernels(&["ring.cu", "halo-1d.cu"]);
    let built = tc
        .builder()
        .archs(["sm_90", "sm_100a", "90"])
        .unwrap()
        .source_dir(&dir)
        .unwrap()
        .flag("-DCHUNK=64")
        .build()
        .unwrap();

    // Sorted by file name; headers are not sources.
    let names: Vec<&str> = built.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["halo-1d", "ring"]);
    let ring = built.get("ring").unwrap();
    assert_eq!(ring.const_name(), "RING");
    assert_eq!(built.get("halo-1d").unwrap().const_name(), "HALO_1D");
    let sm90 = ring.cubin("sm_90").unwrap();
    assert_eq!(sm90, tc.tmp.join("out/cubins/ring.sm_90.linked.cubin"));
    assert!(sm90.is_file());
    assert!(ring.cubin("100a").unwrap().is_file());
    assert!(ring.cubin("sm_80").is_none());

    let calls = tc.calls();
    assert_eq!(calls.len(), 8, "{calls:#?}");
    let compile = calls
        .iter()
        .find(|c| c.starts_with("nvcc") && c.contains("sm_100a") && c.ends_with("ring.cu"))
        .expect("nvcc call for ring.cu on sm_100a");
    for needle in [
        "-gencode=arch=compute_100a,code=sm_100a",
        "-rdc=true",
        "-cubin",
        "-DCHUNK=64",
        &format!("-I{}", tc.nvshmem.include_dir.display()),
        &format!("-I{}", dir.display()),
    ] {
        assert!(
            compile.contains(needle),
            "`{needle}` missing from {compile}"
        );
    }
    let link = calls
        .iter()
        .find(|c| c.starts_with("nvlink") && c.contains("ring.sm_90.cubin"))
        .expect("nvlink call for ring on sm_90");
    assert!(link.contains("-arch=sm_90"), "{link}");
    assert!(
        link.contains(&tc.nvshmem.device_lib.display().to_string()),
        "{link}"
    );
    // A filter leaves files out.
    let only_ring = tc
        .builder()
        .source_dir_where(&dir, |p| p.ends_with("ring.cu"))
        .unwrap()
        .build()
        .unwrap();
    let names: Vec<&str> = only_ring.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["ring"]);
}

#[test]
fn the_rust_module_embeds_every_cubin() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tc = Toolchain::new("module", TOOL);
    let dir = tc.kernels(&["ring_allgather.cu", "2shot.cu"]);
    let built = tc
        .builder()
        .archs(["sm_90", "sm_100"])
        .unwrap()
        .source_dir(&dir)
        .unwrap()
        .build()
        .unwrap();
    let text = built.rust_module();
    let cubin = |stem: &str, arch: &str| {
        format!(
            "include_bytes!({:?})",
            tc.tmp
                .join(format!("out/cubins/{stem}.{arch}.linked.cubin"))
                .display()
                .to_string()
        )
    };
    for needle in [
        "pub const RING_ALLGATHER: ::nvshmem::module::CubinSet = ::nvshmem::module::CubinSet::new(\"ring_allgather\"",
        "pub const _2SHOT: ::nvshmem::module::CubinSet",
        "::nvshmem::module::CubinImage { capability: 90, arch_specific: false, bytes: ",
        "::nvshmem::module::CubinImage { capability: 100, arch_specific: false, bytes: ",
        &cubin("ring_allgather", "sm_90"),
        &cubin("ring_allgather", "sm_100"),
        &cubin("2shot", "sm_90"),
        "&::nvshmem::module::Aligned(*include_bytes!(",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }

    // Written where asked, and with another crate path when asked.
    let path = built.write_rust_module("kernels.rs").unwrap();
    assert_eq!(path, tc.tmp.join("out/kernels.rs"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    let inside = tc
        .builder()
        .rust_path("crate")
        .source_dir(&dir)
        .unwrap()
        .build()
        .unwrap();
    assert!(inside
        .rust_module()
        .contains("pub const RING_ALLGATHER: crate::module::CubinSet"));
}

#[test]
fn compile_errors_carry_the_compiler_output() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tc = Toolchain::new("failing", FAILING_NVCC);
    let dir = tc.kernels(&["broken.cu"]);
    let e = tc.builder().source_dir(&dir).unwrap().build().unwrap_err();
    let Error::Compile {
        what,
        command,
        output,
    } = &e
    else {
        panic!("expected Error::Compile, got {e:?}");
    };
    assert!(
        what.contains("broken.cu") && what.contains("sm_90"),
        "{what}"
    );
    assert!(
        command.contains("nvcc") && command.contains("-rdc=true"),
        "{command}"
    );
    assert!(output.contains("broken.cu(3): error"), "{output}");
    let text = e.to_string();
    assert!(
        text.contains("broken.cu(3): error") && text.contains("compiling"),
        "{text}"
    );
}

#[test]
fn bad_inputs_are_refused_before_anything_runs() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tc = Toolchain::new("inputs", TOOL);

    let e = tc.builder().build().unwrap_err();
    assert!(e.to_string().contains("no CUDA source files"), "{e}");

    let dir = tc.kernels(&["all-reduce.cu", "all_reduce.cu"]);
    let e = tc.builder().source_dir(&dir).unwrap().build().unwrap_err();
    assert!(e.to_string().contains("ALL_REDUCE"), "{e}");

    let e = tc
        .builder()
        .source_dir(tc.tmp.join("no-such-dir"))
        .unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");

    let e = tc
        .builder()
        .source(tc.tmp.join("missing.cu"))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("missing.cu"), "{e}");

    assert!(tc.builder().archs(["sm_60"]).is_err());
    assert!(tc.builder().archs(Vec::<&str>::new()).is_err());

    let no_out = KernelBuilder::new(tc.cuda.clone(), tc.nvshmem.clone()).unwrap();
    if std::env::var_os("OUT_DIR").is_none() {
        let e = no_out
            .source(dir.join("all_reduce.cu"))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("out_dir"), "{e}");
    }
    assert!(tc.calls().is_empty(), "{:?}", tc.calls());
}

#[test]
fn a_compiler_that_cannot_start_is_a_spawn_error() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tc = Toolchain::new("spawn", TOOL);
    // Present (so discovery accepts it) but not executable.
    std::fs::set_permissions(&tc.cuda.nvcc, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dir = tc.kernels(&["k.cu"]);
    let e = tc.builder().source_dir(&dir).unwrap().build().unwrap_err();
    assert!(matches!(e, Error::Spawn { .. }), "{e:?}");
    assert!(e.to_string().contains("make setup"), "{e}");
}

#[test]
fn whole_programs_are_compiled_without_rdc_and_linked_with_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tc = Toolchain::new("whole", TOOL);
    let dir = tc.kernels(&["gemm.cu"]);
    let built = tc
        .builder()
        .archs(["sm_90a"])
        .unwrap()
        .whole_program()
        .source(dir.join("gemm.cu"))
        .build()
        .unwrap();
    let calls = tc.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert!(
        calls[0].contains("-gencode=arch=compute_90a,code=sm_90a"),
        "{}",
        calls[0]
    );
    assert!(
        calls[0].contains("-cubin") && !calls[0].contains("-rdc"),
        "{}",
        calls[0]
    );
    let cubin = built.get("gemm").unwrap().cubin("sm_90a").unwrap();
    assert_eq!(cubin, tc.tmp.join("out/cubins/gemm.sm_90a.cubin"));
    // An sm_90a image runs on compute capability 9.0 only: the module says so.
    let text = built.rust_module();
    assert!(
        text.contains("CubinImage { capability: 90, arch_specific: true, bytes: "),
        "{text}"
    );
}

#[test]
fn host_libraries_are_compiled_position_independent_and_archived() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tc = Toolchain::new("host", TOOL);
    let dir = tc.kernels(&["params.cu"]);
    // Without the static CUDA runtime the toolkit is incomplete for host code.
    let e = tc
        .builder()
        .build_host_library("gemm_params", &[dir.join("params.cu")])
        .unwrap_err();
    assert!(matches!(e, Error::CudaIncomplete { .. }), "{e}");
    assert!(e.to_string().contains("libcudart_static.a"), "{e}");
    write(&tc.tmp.join("cuda/lib64/libcudart_static.a"), "!<arch>\n");
    let lib = tc
        .builder()
        .archs(["sm_90a"])
        .unwrap()
        .flag("-DNDEBUG")
        .build_host_library("gemm_params", &[dir.join("params.cu")])
        .unwrap();
    assert_eq!(lib.path, tc.tmp.join("out/host/libgemm_params.a"));
    assert_eq!(
        lib.cuda_runtime,
        tc.tmp.join("cuda/lib64/libcudart_static.a")
    );
    let calls = tc.calls();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    for needle in [
        "-c",
        "-Xcompiler -fPIC",
        "-DNDEBUG",
        "compute_90a",
        "params.cu",
    ] {
        assert!(
            calls[0].contains(needle),
            "`{needle}` missing from {}",
            calls[0]
        );
    }
    assert!(
        !calls[0].contains("-cubin") && !calls[0].contains("-rdc"),
        "{}",
        calls[0]
    );
    assert!(
        calls[1].starts_with("nvcc --lib -o") && calls[1].contains("libgemm_params.a"),
        "{}",
        calls[1]
    );
    // Names that would not survive `-l static=...` are refused.
    assert!(tc
        .builder()
        .build_host_library("bad name", &[dir.join("params.cu")])
        .is_err());
}

#[test]
fn a_docs_rs_build_compiles_nothing_and_declares_every_set_empty() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tc = Toolchain::new("docs-rs", TOOL);
    let dir = tc.kernels(&["ring.cu", "halo.cu"]);
    // What a dependent's build script sees on docs.rs: DOCS_RS, and from the dependency's
    // own docs.rs build no more than its release.
    let probe = Probe::isolated()
        .var("DOCS_RS", "1")
        .var("DEP_NVSHMEM_RS_VERSION", "3.8.0");
    let builder = KernelBuilder::from_links_metadata_in(&probe, "nvshmem_rs", "nvshmem").unwrap();
    assert!(builder.is_docs_rs());
    assert_eq!(builder.toolchain().1.version.to_string(), "3.8.0");
    assert_eq!(builder.toolchain().1.source, Source::DocsRs);
    let builder = builder
        .out_dir(tc.tmp.join("out"))
        .source_dir(&dir)
        .unwrap();
    let built = builder.build().unwrap();
    let names: Vec<&str> = built.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["halo", "ring"]);
    assert!(built.kernels.iter().all(|k| k.cubins.is_empty()));
    let text = built.rust_module();
    for needle in [
        "const __NVSHMEM_IMAGES_RING: &[::nvshmem::module::CubinImage] = &[];",
        "pub const RING: ::nvshmem::module::CubinSet = ::nvshmem::module::CubinSet::new(\"ring\"",
        "pub const HALO: ::nvshmem::module::CubinSet",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
    assert!(!text.contains("include_bytes!"), "{text}");
    let host = builder
        .build_host_library("params", &[dir.join("ring.cu")])
        .unwrap();
    assert!(host.path.as_os_str().is_empty());
    assert!(tc.calls().is_empty(), "{:?}", tc.calls());

    // Without the dependency's release: the pinned one.
    let alone = Probe::isolated().var("DOCS_RS", "1");
    let b = KernelBuilder::from_links_metadata_in(&alone, "nvshmem_rs", "nvshmem").unwrap();
    assert_eq!(b.toolchain().1.version, nvshmem_build::PINNED_NVSHMEM);
    // An empty DOCS_RS is no docs.rs build.
    let empty = Probe::isolated().var("DOCS_RS", "");
    assert!(!empty.docs_rs());
    assert!(KernelBuilder::from_links_metadata_in(&empty, "nvshmem_rs", "nvshmem").is_err());
}
