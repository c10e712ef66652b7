//! libclang discovery against made-up trees: only the names bindgen loads are taken, the
//! order is LIBCLANG_PATH, .venv, Python, system, and the errors say what to run.

mod common;

use common::{fake_lib, write, Scratch};
use nvshmem_build::{Error, Probe, Search, Source, LIBCLANG_WHEEL, SEARCH_VAR};
use std::path::{Path, PathBuf};

/// The `site-packages` of a `.venv` in `project`, as `make setup` makes it.
fn venv_site(project: &Path) -> PathBuf {
    project.join(".venv/lib/python3.11/site-packages")
}

#[test]
fn libclang_cpp_alone_is_not_libclang() {
    // What Debian's clang-14 runtime leaves without libclang-dev: the bug that let
    // `make setup` skip installing libclang.
    let tmp = Scratch::new("only-cpp");
    let system = tmp.join("usr/lib/llvm-14/lib");
    fake_lib(&system.join("libclang-cpp.so.14"));
    fake_lib(&tmp.join("usr/lib/x86_64-linux-gnu/libclang-cpp.so.14"));
    let probe = Probe::isolated()
        .system_libclang_dirs(vec![system.clone(), tmp.join("usr/lib/x86_64-linux-gnu")]);
    let e = probe.find_libclang().unwrap_err();
    assert!(matches!(e, Error::LibclangNotFound { .. }), "{e:?}");
    let text = e.to_string();
    for needle in [
        "libclang-cpp is a different library",
        "make setup",
        LIBCLANG_WHEEL,
        "LIBCLANG_PATH",
        "llvm-14/lib",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }
    // One paragraph: no line breaks, no backtrace.
    assert!(!text.contains('\n'), "{text}");

    // The same folder with the real names is taken, newest first.
    for name in [
        "libclang.so",
        "libclang.so.1",
        "libclang-14.so.1",
        "libclang-14.so",
    ] {
        fake_lib(&system.join(name));
        let found = probe.find_libclang().unwrap();
        assert_eq!(found.source, Source::System);
        assert!(
            found.path.starts_with(&system),
            "{name}: {}",
            found.path.display()
        );
        let taken = found.path.file_name().unwrap().to_str().unwrap().to_owned();
        assert_ne!(taken, "libclang-cpp.so.14");
    }
    let found = probe.find_libclang().unwrap();
    assert_eq!(found.path, system.join("libclang-14.so.1"));
}

#[test]
fn the_order_is_libclang_path_then_venv_then_system() {
    let tmp = Scratch::new("libclang-order");
    let project = tmp.join("project");
    let wheel = venv_site(&project).join("clang/native/libclang.so");
    fake_lib(&wheel);
    let system = tmp.join("usr/lib/llvm-18/lib");
    fake_lib(&system.join("libclang.so.18"));
    let named = tmp.join("opt/llvm/lib/libclang-17.so");
    fake_lib(&named);
    let probe = Probe::isolated()
        .start_dir(project.join("crates/user"))
        .system_libclang_dirs(vec![system.clone()]);

    let found = probe
        .clone()
        .var("LIBCLANG_PATH", &named)
        .find_libclang()
        .unwrap();
    assert_eq!(found.source, Source::EnvVar("LIBCLANG_PATH"));
    assert_eq!(found.path, named);
    // A folder works too.
    let found = probe
        .clone()
        .var("LIBCLANG_PATH", named.parent().unwrap())
        .find_libclang()
        .unwrap();
    assert_eq!(found.path, named);

    let found = probe.find_libclang().unwrap();
    assert_eq!(found.source, Source::ProjectVenv(venv_site(&project)));
    assert_eq!(found.path, wheel);

    std::fs::remove_file(&wheel).unwrap();
    let found = probe.find_libclang().unwrap();
    assert_eq!(found.source, Source::System);
    assert_eq!(found.path, system.join("libclang.so.18"));
}

#[test]
fn a_libclang_path_without_libclang_is_an_error_not_a_fallback() {
    let tmp = Scratch::new("libclang-path-bad");
    let system = tmp.join("usr/lib");
    fake_lib(&system.join("libclang.so"));
    let cpp = tmp.join("llvm/lib/libclang-cpp.so.14");
    fake_lib(&cpp);
    for named in [
        cpp.clone(),
        cpp.parent().unwrap().to_path_buf(),
        tmp.join("nowhere"),
    ] {
        let e = Probe::isolated()
            .system_libclang_dirs(vec![system.clone()])
            .var("LIBCLANG_PATH", &named)
            .find_libclang()
            .unwrap_err();
        assert!(matches!(e, Error::LibclangNotFound { .. }), "{e:?}");
        assert!(
            e.to_string()
                .contains(&format!("LIBCLANG_PATH={}", named.display())),
            "{e}"
        );
    }
}

#[test]
fn search_venv_hides_the_system() {
    // CI builds with NVSHMEM_BUILD_SEARCH=venv: a libclang only the system has must not count.
    let tmp = Scratch::new("search-venv");
    let project = tmp.join("project");
    std::fs::create_dir_all(venv_site(&project)).unwrap();
    let system = tmp.join("usr/lib");
    fake_lib(&system.join("libclang.so.14"));
    let probe = Probe::isolated()
        .start_dir(&project)
        .system_libclang_dirs(vec![system.clone()]);
    assert_eq!(probe.find_libclang().unwrap().source, Source::System);

    let hermetic = probe.clone().var(SEARCH_VAR, "venv");
    let e = hermetic.find_libclang().unwrap_err();
    assert!(matches!(e, Error::LibclangNotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("clang/native"), "{e}");

    fake_lib(&venv_site(&project).join("clang/native/libclang.so"));
    assert!(matches!(
        hermetic.find_libclang().unwrap().source,
        Source::ProjectVenv(_)
    ));

    // The same switch hides system NVSHMEM and nvcc.
    assert!(matches!(
        hermetic.find_nvshmem(),
        Err(Error::NvshmemNotFound { .. })
    ));
}

#[test]
fn search_places_parse_and_bad_ones_are_named() {
    let s: Search = "venv, python".parse().unwrap();
    assert!(s.venv && s.python && !s.system);
    let s: Search = "none".parse().unwrap();
    assert!(!s.venv && !s.python && !s.system);
    let e = Probe::isolated()
        .var(SEARCH_VAR, "venv,usr")
        .find_libclang()
        .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("`usr`"), "{e}");
}

#[test]
fn a_file_that_does_not_load_is_unusable_with_its_path() {
    let tmp = Scratch::new("libclang-broken");
    let lib = tmp.join("lib/libclang.so");
    fake_lib(&lib);
    let found = Probe::isolated()
        .var("LIBCLANG_PATH", &lib)
        .find_libclang()
        .unwrap();
    let e = found.check_loads().unwrap_err();
    match &e {
        Error::LibclangUnusable { path, reason } => {
            assert_eq!(path, &lib);
            assert!(reason.contains("does not load"), "{reason}");
        }
        other => panic!("expected LibclangUnusable, got {other:?}"),
    }
    assert!(e.to_string().contains("make setup"), "{e}");
}

#[test]
fn builtin_headers_come_from_the_c_compiler_only_when_libclang_has_none() {
    let tmp = Scratch::new("builtin-headers");
    // Like Debian: lib/clang/14.0.6/include/stddef.h beside the library.
    let llvm = tmp.join("llvm-14/lib");
    fake_lib(&llvm.join("libclang.so.1"));
    write(&llvm.join("clang/14.0.6/include/stddef.h"), "");
    // Like the wheel: the library alone.
    let wheel = tmp.join("site-packages/clang/native/libclang.so");
    fake_lib(&wheel);
    // A C compiler that names its builtin headers.
    let gcc_include = tmp.join("gcc/12/include");
    write(&gcc_include.join("stddef.h"), "");
    let cc = tmp.join("bin/cc");
    write(&cc, &format!("#!/bin/sh\necho {}\n", gcc_include.display()));
    make_executable(&cc);

    let probe = Probe::isolated().var("CC", &cc);
    let debian = probe
        .clone()
        .var("LIBCLANG_PATH", &llvm)
        .find_libclang()
        .unwrap();
    assert_eq!(
        debian.resource_include(),
        Some(llvm.join("clang/14.0.6/include"))
    );
    assert_eq!(probe.clang_builtin_include(&debian).unwrap(), None);

    let wheel = probe
        .clone()
        .var("LIBCLANG_PATH", &wheel)
        .find_libclang()
        .unwrap();
    assert_eq!(wheel.resource_include(), None);
    assert_eq!(
        probe.clang_builtin_include(&wheel).unwrap(),
        Some(gcc_include)
    );

    // A compiler that names nothing useful: an error that says to install gcc or set CC.
    let bad_cc = tmp.join("bin/bad-cc");
    write(&bad_cc, "#!/bin/sh\necho include\n");
    make_executable(&bad_cc);
    let e = probe
        .clone()
        .var("CC", &bad_cc)
        .clang_builtin_include(&wheel)
        .unwrap_err();
    assert!(matches!(e, Error::LibclangUnusable { .. }), "{e:?}");
    assert!(e.to_string().contains("set CC"), "{e}");
}

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn the_real_libclang_here_loads_and_has_builtin_headers() {
    // What the nvshmem-sys build script does, with the environment of this test run.
    let probe = Probe::from_env();
    let libclang = match probe.find_libclang() {
        Ok(l) => l,
        Err(e @ Error::LibclangNotFound { .. }) => {
            eprintln!("note: skipped, no libclang here (run `make setup`): {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    libclang.check_loads().unwrap();
    let include = probe
        .clang_builtin_include(&libclang)
        .unwrap()
        .or_else(|| libclang.resource_include())
        .expect("some builtin headers");
    assert!(include.join("stddef.h").is_file(), "{}", include.display());
}
