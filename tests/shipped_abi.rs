//! The copy of the generated `abi.rs` shipped for builds without libclang (docs.rs:
//! `DOCS_RS` set, src/abi/generated.rs) is exactly what bindgen generates from kernels/abi.h
//! in a normal build.

use std::path::Path;

/// What build.rs generated in this build.
const GENERATED_PATH: &str = concat!(env!("OUT_DIR"), "/abi.rs");
const GENERATED: &str = include_str!(concat!(env!("OUT_DIR"), "/abi.rs"));

#[test]
fn the_shipped_abi_is_what_bindgen_generates_from_abi_h() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/abi/generated.rs");
    let shipped =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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
        "{} is not what bindgen generated in this build from kernels/abi.h, first at line \
         {line}:\n  shipped:   {ours}\n  generated: {theirs}\nAfter a change to kernels/abi.h, \
         its headers or build.rs, ship the new file (generated with {}, what `make setup` \
         installs):\n  cp {GENERATED_PATH} {}",
        path.display(),
        nvshmem_build::LIBCLANG_WHEEL,
        path.display()
    );
}
