//! One release throughout an NVSHMEM install: the headers, the host library and the device
//! library must agree, and a mix says which file is which release. The libraries here are
//! small stand-ins built with the C compiler (`CC`, else `cc`), holding what the real ones
//! hold: the host library's `nvshmemi_host_lib_version` (or its `NVSHMEM vX.Y.Z` banner) and
//! the device library's `nvshmemi_device_lib_version` in an archive member.

#![cfg(unix)]

mod common;

use common::{fake_nvshmem, write, Scratch};
use nvshmem_build::{Error, NvshmemInstall, Probe, Source, Version};
use std::path::Path;
use std::process::Command;

fn v(s: &str) -> Version {
    s.parse().unwrap()
}

/// Run a tool; `false` when it cannot start (no C compiler on this machine).
fn run(program: &str, args: &[&str], dir: &Path) -> bool {
    match Command::new(program).args(args).current_dir(dir).output() {
        Ok(out) => {
            assert!(
                out.status.success(),
                "{program} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            true
        }
        Err(e) => {
            eprintln!("skipped: cannot run {program} ({e}); the stand-in libraries need it");
            false
        }
    }
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// `lib/libnvshmem_host.so.3` under `root`, built from `source`.
fn host_lib(root: &Path, source: &str) -> bool {
    let dir = root.join("lib");
    write(&dir.join("host.c"), source);
    let ok = run(
        &cc(),
        &["-shared", "-fPIC", "-o", "libnvshmem_host.so.3", "host.c"],
        &dir,
    );
    std::fs::remove_file(dir.join("host.c")).unwrap();
    ok
}

/// The host library as NVIDIA builds it: its release in `nvshmemi_host_lib_version`.
fn host_lib_of(root: &Path, release: (i32, i32, i32)) -> bool {
    host_lib(
        root,
        &format!(
            "int nvshmemi_host_lib_version[3] = {{{}, {}, {}}};\n",
            release.0, release.1, release.2
        ),
    )
}

/// `lib/libnvshmem_device.a` under `root`: an object without the version, then the init
/// object with its file-local `nvshmemi_device_lib_version`.
fn device_lib_of(root: &Path, release: (i32, i32, i32)) -> bool {
    let dir = root.join("lib");
    write(&dir.join("transfer.c"), "int nvshmemi_transfer = 1;\n");
    write(
        &dir.join("init.c"),
        &format!(
            "__attribute__((used)) static const int version[3] \
             __asm__(\"_ZL27nvshmemi_device_lib_version\") = {{{}, {}, {}}};\n\
             int nvshmemi_init(void) {{ return version[0]; }}\n",
            release.0, release.1, release.2
        ),
    );
    let _ = std::fs::remove_file(dir.join("libnvshmem_device.a"));
    let ok = run(&cc(), &["-c", "-fPIC", "transfer.c", "init.c"], &dir)
        && run(
            "ar",
            &["rcs", "libnvshmem_device.a", "transfer.o", "init.o"],
            &dir,
        );
    for f in ["transfer.c", "init.c", "transfer.o", "init.o"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    ok
}

/// An install whose headers, host library and device library are these releases; `None`
/// when the stand-ins cannot be built here.
fn install(
    tmp: &Scratch,
    name: &str,
    headers: (u32, u32, u32),
    host: (i32, i32, i32),
    device: (i32, i32, i32),
) -> Option<NvshmemInstall> {
    let root = tmp.join(name);
    fake_nvshmem(&root, headers);
    (host_lib_of(&root, host) && device_lib_of(&root, device))
        .then(|| NvshmemInstall::at_root(&root, Source::EnvVar("NVSHMEM_HOME")).unwrap())
}

#[test]
fn one_release_throughout_passes() {
    let tmp = Scratch::new("release-same");
    let Some(nvshmem) = install(&tmp, "nvshmem", (3, 8, 0), (3, 8, 0), (3, 8, 0)) else {
        return;
    };
    let releases = nvshmem.check_release().unwrap();
    assert_eq!(releases.headers, v("3.8.0"));
    assert_eq!(releases.host_lib, Some(v("3.8.0")));
    assert_eq!(releases.device_lib, Some(v("3.8.0")));
}

#[test]
fn a_host_library_of_another_release_is_named_with_both_releases() {
    let tmp = Scratch::new("release-host");
    let Some(nvshmem) = install(&tmp, "nvshmem", (3, 4, 5), (3, 8, 0), (3, 4, 5)) else {
        return;
    };
    let e = nvshmem.check_release().unwrap_err();
    let Error::NvshmemReleaseMismatch {
        headers,
        host_lib,
        host,
        device_lib,
        device,
        ..
    } = &e
    else {
        panic!("expected NvshmemReleaseMismatch, got {e:?}");
    };
    assert_eq!(*headers, v("3.4.5"));
    assert_eq!((host_lib, *host), (&nvshmem.host_lib, v("3.8.0")));
    assert_eq!((device_lib, *device), (&nvshmem.device_lib, v("3.4.5")));
    let text = e.to_string();
    for needle in [
        "mixes releases",
        "the host library (",
        &format!("{}) is NVSHMEM 3.8.0", nvshmem.host_lib.display()),
        &format!("{}) is NVSHMEM 3.4.5", nvshmem.device_lib.display()),
        "nvshmem_version.h) are NVSHMEM 3.4.5",
        "nvidia-nvshmem-cu13==",
        "make setup",
        "NVSHMEM_HOME",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }
}

#[test]
fn a_device_library_of_another_release_is_a_mismatch() {
    let tmp = Scratch::new("release-device");
    let Some(nvshmem) = install(&tmp, "nvshmem", (3, 8, 0), (3, 8, 0), (3, 7, 2)) else {
        return;
    };
    let e = nvshmem.check_release().unwrap_err();
    assert!(matches!(e, Error::NvshmemReleaseMismatch { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("libnvshmem_device.a) is NVSHMEM 3.7.2"),
        "{text}"
    );
}

#[test]
fn a_stripped_host_library_is_read_from_its_banner() {
    let tmp = Scratch::new("release-banner");
    let root = tmp.join("nvshmem");
    fake_nvshmem(&root, (3, 6, 5));
    let banner = "__attribute__((used)) const char *nvshmemi_banner(void) \
                  { return \"NVSHMEM v3.6.5\"; }\n";
    if !(host_lib(&root, banner) && device_lib_of(&root, (3, 6, 5))) {
        return;
    }
    let nvshmem = NvshmemInstall::at_root(&root, Source::EnvVar("NVSHMEM_HOME")).unwrap();
    assert_eq!(nvshmem.check_release().unwrap().host_lib, Some(v("3.6.5")));
}

#[test]
fn a_library_that_does_not_say_its_release_is_an_error_naming_it() {
    let tmp = Scratch::new("release-unknown");
    let root = tmp.join("nvshmem");
    fake_nvshmem(&root, (3, 4, 5));
    if !host_lib(&root, "int nvshmem_my_pe(void) { return 0; }\n") {
        return;
    }
    let nvshmem = NvshmemInstall::at_root(&root, Source::EnvVar("NVSHMEM_HOME")).unwrap();
    let e = nvshmem.check_release().unwrap_err();
    assert!(matches!(e, Error::NvshmemReleaseUnknown { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&nvshmem.host_lib.display().to_string())
            && text.contains("nvshmemi_host_lib_version")
            && text.contains("NVSHMEM_HOME"),
        "{text}"
    );
    // Made-up files (not ELF at all) say nothing either.
    let made_up = tmp.join("made-up");
    fake_nvshmem(&made_up, (3, 4, 5));
    let nvshmem = NvshmemInstall::at_root(&made_up, Source::EnvVar("NVSHMEM_HOME")).unwrap();
    let releases = nvshmem.releases().unwrap();
    assert_eq!((releases.host_lib, releases.device_lib), (None, None));
}

#[test]
fn the_nvshmem_this_build_found_is_one_release() {
    // What the build scripts found: the pinned wheel in CI, NVSHMEM_HOME when set.
    let probe = Probe::from_env();
    let Ok(nvshmem) = probe.find_nvshmem() else {
        eprintln!("skipped: no NVSHMEM found here");
        return;
    };
    let releases = nvshmem.check_release().unwrap();
    assert_eq!(releases.host_lib, Some(nvshmem.version));
    assert_eq!(releases.device_lib, Some(nvshmem.version));
}
