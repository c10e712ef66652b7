//! Discovery against made-up install trees: what wins, where it walks, and what the errors
//! say. Nothing here reads or changes the process environment.

mod common;

use common::{fake_cuda, fake_nvshmem, venv_nvidia, Scratch};
use nvshmem_build::{Error, KernelBuilder, Probe, Source, Version};
use std::path::Path;

const V345: Version = Version {
    major: 3,
    minor: 4,
    patch: 5,
};

#[test]
fn nvshmem_home_wins_over_the_project_venv() {
    let tmp = Scratch::new("home-wins");
    let home = tmp.join("opt/nvshmem-3.3.9");
    fake_nvshmem(&home, (3, 3, 9));
    let project = tmp.join("project");
    fake_nvshmem(&venv_nvidia(&project).join("nvshmem"), (3, 4, 5));

    let probe = Probe::isolated()
        .start_dir(&project)
        .var("NVSHMEM_HOME", &home);
    let found = probe.find_nvshmem().unwrap();
    assert_eq!(found.source, Source::EnvVar("NVSHMEM_HOME"));
    assert_eq!(found.version, "3.3.9".parse().unwrap());
    assert_eq!(found.include_dir, home.join("include"));
    assert_eq!(found.host_lib, home.join("lib/libnvshmem_host.so.3"));
    assert_eq!(found.device_lib, home.join("lib/libnvshmem_device.a"));

    // Without it, the .venv is used.
    let found = Probe::isolated()
        .start_dir(&project)
        .find_nvshmem()
        .unwrap();
    assert_eq!(found.source, Source::ProjectVenv(venv_nvidia(&project)));
    assert_eq!(found.version, V345);

    // An empty NVSHMEM_HOME counts as unset.
    let found = Probe::isolated()
        .start_dir(&project)
        .var("NVSHMEM_HOME", "")
        .find_nvshmem()
        .unwrap();
    assert_eq!(found.version, V345);
}

#[test]
fn the_venv_is_found_by_walking_up_from_the_start_dir() {
    let tmp = Scratch::new("walk-up");
    let project = tmp.join("project");
    let nvidia = venv_nvidia(&project);
    fake_nvshmem(&nvidia.join("nvshmem"), (3, 4, 5));
    fake_cuda(&nvidia.join("cu13"), 13000);
    let deep = project.join("crates/user/src/bin");
    std::fs::create_dir_all(&deep).unwrap();

    let probe = Probe::isolated().start_dir(&deep);
    let nvshmem = probe.find_nvshmem().unwrap();
    assert_eq!(nvshmem.source, Source::ProjectVenv(nvidia.clone()));
    assert_eq!(nvshmem.lib_dir, nvidia.join("nvshmem/lib"));
    let cuda = probe.find_cuda().unwrap();
    assert_eq!(cuda.source, Source::ProjectVenv(nvidia.clone()));
    assert_eq!(cuda.nvcc, nvidia.join("cu13/bin/nvcc"));
    assert_eq!(cuda.nvlink, nvidia.join("cu13/bin/nvlink"));
    assert_eq!(cuda.version.map(|v| (v.major, v.minor)), Some((13, 0)));

    // A directory beside the project sees nothing.
    let beside = tmp.join("elsewhere");
    std::fs::create_dir_all(&beside).unwrap();
    assert!(matches!(
        Probe::isolated().start_dir(&beside).find_nvshmem(),
        Err(Error::NvshmemNotFound { .. })
    ));
}

#[test]
fn cuda_home_and_nvcc_win_over_the_venv() {
    let tmp = Scratch::new("cuda-home");
    let project = tmp.join("project");
    fake_cuda(&venv_nvidia(&project).join("cu13"), 13000);
    let home = tmp.join("cuda-12.8");
    fake_cuda(&home, 12080);

    let cuda = Probe::isolated()
        .start_dir(&project)
        .var("CUDA_HOME", &home)
        .find_cuda()
        .unwrap();
    assert_eq!(cuda.source, Source::EnvVar("CUDA_HOME"));
    assert_eq!(cuda.nvcc, home.join("bin/nvcc"));
    assert_eq!(cuda.version.map(|v| (v.major, v.minor)), Some((12, 8)));

    let cuda = Probe::isolated()
        .start_dir(&project)
        .var("CUDA_HOME", tmp.join("nowhere"))
        .var("NVCC", home.join("bin/nvcc"))
        .find_cuda()
        .unwrap();
    assert_eq!(cuda.source, Source::EnvVar("NVCC"));

    // A CUDA_HOME without a compiler is an error, not a reason to look elsewhere.
    let e = Probe::isolated()
        .start_dir(&project)
        .var("CUDA_HOME", tmp.join("nowhere"))
        .find_cuda()
        .unwrap_err();
    assert!(matches!(e, Error::CudaIncomplete { .. }), "{e:?}");
    assert!(e.to_string().contains("CUDA_HOME"), "{e}");
}

#[test]
fn nothing_found_says_where_it_looked_and_what_to_do() {
    let tmp = Scratch::new("nothing");
    let probe = Probe::isolated().start_dir(tmp.path()).system_paths(
        vec![(tmp.join("usr/include"), tmp.join("usr/lib"))],
        vec![tmp.join("cuda")],
    );

    let e = probe.find_nvshmem().unwrap_err();
    assert!(matches!(e, Error::NvshmemNotFound { .. }), "{e:?}");
    let text = e.to_string();
    for needle in ["NVSHMEM_HOME", "CUDA_HOME", "make setup", "usr/include"] {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }

    let e = probe.find_cuda().unwrap_err();
    assert!(matches!(e, Error::NvccNotFound { .. }), "{e:?}");
    let text = e.to_string();
    for needle in [
        "nvcc",
        "NVSHMEM_HOME",
        "CUDA_HOME",
        "make setup",
        "cuda/bin/nvcc",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }
}

#[test]
fn an_nvshmem_home_that_is_not_an_install_is_an_error_not_a_fallback() {
    let tmp = Scratch::new("incomplete");
    let project = tmp.join("project");
    fake_nvshmem(&venv_nvidia(&project).join("nvshmem"), (3, 4, 5));
    let not_install = tmp.join("just-a-dir");
    std::fs::create_dir_all(&not_install).unwrap();

    let e = Probe::isolated()
        .start_dir(&project)
        .var("NVSHMEM_HOME", &not_install)
        .find_nvshmem()
        .unwrap_err();
    match &e {
        Error::NvshmemIncomplete { root, missing } => {
            assert_eq!(root, &not_install);
            assert_eq!(missing, &not_install.join("include/nvshmem.h"));
        }
        other => panic!("expected NvshmemIncomplete, got {other:?}"),
    }
    assert!(e.to_string().contains("NVSHMEM_HOME"), "{e}");

    // Headers but no device library: named precisely.
    let partial = tmp.join("partial");
    fake_nvshmem(&partial, (3, 4, 5));
    std::fs::remove_file(partial.join("lib/libnvshmem_device.a")).unwrap();
    match Probe::isolated()
        .var("NVSHMEM_HOME", &partial)
        .find_nvshmem()
    {
        Err(Error::NvshmemIncomplete { missing, .. }) => {
            assert_eq!(missing, partial.join("lib/libnvshmem_device.a"))
        }
        other => panic!("expected NvshmemIncomplete, got {other:?}"),
    }
}

#[test]
fn unversioned_host_library_names_are_accepted() {
    let tmp = Scratch::new("unversioned");
    let root = tmp.join("nvshmem");
    fake_nvshmem(&root, (3, 4, 5));
    std::fs::rename(
        root.join("lib/libnvshmem_host.so.3"),
        root.join("lib/libnvshmem_host.so"),
    )
    .unwrap();
    let found = Probe::isolated()
        .var("NVSHMEM_HOME", &root)
        .find_nvshmem()
        .unwrap();
    assert_eq!(found.host_lib_file_name(), "libnvshmem_host.so");
}

/// A probe that looks like the build script of a crate depending on `nvshmem`.
fn dependent_probe(tmp: &Scratch) -> Probe {
    let nvshmem = tmp.join("venv-nvshmem");
    fake_nvshmem(&nvshmem, (3, 4, 5));
    let cuda = tmp.join("venv-cu13");
    fake_cuda(&cuda, 13000);
    Probe::isolated()
        .var("DEP_NVSHMEM_RS_INCLUDE", nvshmem.join("include"))
        .var("DEP_NVSHMEM_RS_LIB_DIR", nvshmem.join("lib"))
        .var("DEP_NVSHMEM_RS_VERSION", "3.4.5")
        .var("DEP_NVSHMEM_RS_NVCC", cuda.join("bin/nvcc"))
}

#[test]
fn dependents_build_against_the_metadata_toolchain() {
    let tmp = Scratch::new("metadata");
    let probe = dependent_probe(&tmp);
    let b = KernelBuilder::from_links_metadata_in(&probe, "nvshmem_rs", "nvshmem").unwrap();
    let (cuda, nvshmem) = b.toolchain();
    assert_eq!(nvshmem.source, Source::Metadata);
    assert_eq!(nvshmem.version, V345);
    assert_eq!(
        nvshmem.device_lib,
        tmp.join("venv-nvshmem/lib/libnvshmem_device.a")
    );
    assert_eq!(cuda.source, Source::Metadata);
    assert_eq!(cuda.nvcc, tmp.join("venv-cu13/bin/nvcc"));

    // The headers the dependency exports reach the compiler's include path.
    let headers = tmp.join("nvshmem-crate/kernels/include");
    let with_headers = probe.clone().var("DEP_NVSHMEM_RS_HEADERS", &headers);
    let b = KernelBuilder::from_links_metadata_in(&with_headers, "nvshmem_rs", "nvshmem").unwrap();
    let arch = nvshmem_build::Arch::parse("sm_90").unwrap();
    let cmd = b.compile_command(Path::new("k.cu"), &arch, Path::new("k.o"));
    let include = format!("-I{}", headers.display());
    assert!(
        cmd.get_args().any(|a| a.to_str() == Some(include.as_str())),
        "{cmd:?} lacks {include}"
    );

    // CUDA_HOME still picks the compiler.
    let other = tmp.join("cuda-13.1");
    fake_cuda(&other, 13010);
    let b = KernelBuilder::from_links_metadata_in(
        &probe.clone().var("CUDA_HOME", &other),
        "nvshmem_rs",
        "nvshmem",
    )
    .unwrap();
    assert_eq!(b.toolchain().0.nvcc, other.join("bin/nvcc"));

    // An NVSHMEM_HOME of the same release is fine.
    let same = tmp.join("same-release");
    fake_nvshmem(&same, (3, 4, 5));
    KernelBuilder::from_links_metadata_in(
        &probe.clone().var("NVSHMEM_HOME", &same),
        "nvshmem_rs",
        "nvshmem",
    )
    .unwrap();
}

#[test]
fn a_different_nvshmem_home_is_a_mismatch() {
    let tmp = Scratch::new("mismatch");
    let older = tmp.join("nvshmem-3.3.9");
    fake_nvshmem(&older, (3, 3, 9));
    let probe = dependent_probe(&tmp).var("NVSHMEM_HOME", &older);
    let e = KernelBuilder::from_links_metadata_in(&probe, "nvshmem_rs", "nvshmem").unwrap_err();
    assert!(matches!(e, Error::NvshmemMismatch { .. }), "{e:?}");
    let text = e.to_string();
    for needle in [
        "wrong NVSHMEM",
        "NVSHMEM_HOME",
        "3.3.9",
        "3.4.5",
        "libnvshmem_device.a",
        "cargo clean",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }
}

#[test]
fn headers_changed_since_the_dependency_was_built_are_a_mismatch() {
    let tmp = Scratch::new("stale");
    let probe = dependent_probe(&tmp).var("DEP_NVSHMEM_RS_VERSION", "3.4.4");
    let e = KernelBuilder::from_links_metadata_in(&probe, "nvshmem_rs", "nvshmem").unwrap_err();
    assert!(matches!(e, Error::NvshmemMismatch { .. }), "{e:?}");
    assert!(e.to_string().contains("3.4.4"), "{e}");
}

#[test]
fn missing_metadata_says_to_add_the_dependency() {
    let e = KernelBuilder::from_links_metadata_in(&Probe::isolated(), "nvshmem_rs", "nvshmem")
        .unwrap_err();
    match &e {
        Error::MissingMetadata { var, crate_name } => {
            assert_eq!(var, "DEP_NVSHMEM_RS_INCLUDE");
            assert_eq!(crate_name, "nvshmem");
        }
        other => panic!("expected MissingMetadata, got {other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("[dependencies]") && text.contains("from_env"),
        "{text}"
    );

    // Metadata naming a place that no longer holds NVSHMEM.
    let tmp = Scratch::new("gone");
    let probe = Probe::isolated()
        .var("DEP_NVSHMEM_RS_INCLUDE", tmp.join("gone/include"))
        .var("DEP_NVSHMEM_RS_LIB_DIR", tmp.join("gone/lib"));
    assert!(matches!(
        KernelBuilder::from_links_metadata_in(&probe, "nvshmem_rs", "nvshmem"),
        Err(Error::NvshmemIncomplete { .. })
    ));
}
