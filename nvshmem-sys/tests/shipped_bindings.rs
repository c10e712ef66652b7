//! The bindings shipped for builds without NVSHMEM (docs.rs: `DOCS_RS` set, src/bindings/)
//! are exactly what bindgen generates from the pinned release's headers in a normal build.

use std::path::{Path, PathBuf};

/// What build.rs generated in this build.
const GENERATED_PATH: &str = concat!(env!("OUT_DIR"), "/bindings.rs");
const GENERATED: &str = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));

fn shipped_path() -> PathBuf {
    let v = nvshmem_build::PINNED_NVSHMEM;
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "src/bindings/nvshmem_{}_{}_{}.rs",
        v.major, v.minor, v.patch
    ))
}

#[test]
fn the_shipped_bindings_are_what_bindgen_generates_for_the_pinned_release() {
    let pinned = nvshmem_build::PINNED_NVSHMEM.to_string();
    let path = shipped_path();
    let shipped = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}. nvshmem-sys ships the bindings of the pinned NVSHMEM {pinned} for \
             docs.rs; build against {pinned} and copy {GENERATED_PATH} there",
            path.display()
        )
    });
    if nvshmem_sys::BUILD_HOST_LIB.is_empty() {
        eprintln!(
            "skipped the comparison: this is a DOCS_RS build, whose bindings are the shipped ones"
        );
        return;
    }
    if nvshmem_sys::BUILD_VERSION != pinned {
        eprintln!(
            "skipped the comparison: this build bound NVSHMEM {} ({}), and the shipped bindings \
             are those of the pinned {pinned}; `make setup`'s .venv (or NVSHMEM_HOME at {pinned}) \
             compares them",
            nvshmem_sys::BUILD_VERSION,
            nvshmem_sys::BUILD_HOST_LIB
        );
        return;
    }
    if shipped == GENERATED {
        return;
    }
    let (line, ours, theirs) = shipped
        .lines()
        .map(Some)
        .chain(std::iter::repeat(None))
        .zip(GENERATED.lines().map(Some).chain(std::iter::repeat(None)))
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| (i + 1, a.unwrap_or("(end)"), b.unwrap_or("(end)")))
        .unwrap_or((0, "(same lines)", "(different line ends)"));
    panic!(
        "{} is not what bindgen generated in this build from NVSHMEM {pinned}, first at line \
         {line}:\n  shipped:   {ours}\n  generated: {theirs}\nAfter a change to build.rs, \
         bindgen or the pinned release, ship the new bindings:\n  cp {GENERATED_PATH} {}",
        path.display(),
        path.display()
    );
}

#[test]
fn only_the_pinned_release_is_shipped() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bindings");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [shipped_path()],
        "src/bindings/ holds the bindings of the pinned NVSHMEM {} only (build.rs reads \
         that file when DOCS_RS is set)",
        nvshmem_build::PINNED_NVSHMEM
    );
}
