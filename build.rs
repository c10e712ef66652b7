//! Compiles `kernels/*.cu` into linked cubins (one per architecture) and embeds them, and
//! turns `kernels/abi.h`, the definitions the kernels and the Rust side share, into Rust.
//! The tensor-parallel layers' kernels (`kernels/tp.cu`) are built only with the `tp`
//! feature.
//!
//! On docs.rs (`DOCS_RS` set: no NVSHMEM, nvcc or libclang) nothing is compiled: the cubin
//! constants are declared empty, and `abi.rs` is the copy shipped in src/abi/generated.rs.

use nvshmem_build::{fail, Error, KernelBuilder, Probe};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

fn main() {
    // The NVSHMEM that nvshmem-sys found and bound, so host and device libraries match.
    // kernels/include holds the device headers users' kernels include (nvshmem_rs/*.cuh).
    let builder = KernelBuilder::from_links_metadata("NVSHMEM", "nvshmem-sys")
        .and_then(|b| b.export_headers("kernels/include"))
        .unwrap_or_else(|e| fail(&e));
    let tp = std::env::var_os("CARGO_FEATURE_TP").is_some();
    let built = builder
        .clone()
        .rust_path("crate")
        .source_dir_where("kernels", |p| {
            tp || p.file_name() != Some(OsStr::new("tp.cu"))
        })
        .and_then(|b| b.build())
        .unwrap_or_else(|e| fail(&e));
    let cubins = out_dir().join("cubins.rs");
    std::fs::write(&cubins, built.rust_module()).unwrap_or_else(|source| {
        fail(&Error::Io {
            path: cubins,
            source,
        })
    });
    // Kernels of the examples, built like a user's (they include nvshmem_rs/*.cuh) and
    // embedded only by the examples that include $OUT_DIR/examples/kernels.rs. The package
    // leaves them out (Cargo.toml), so crates that depend on us do not compile them.
    if Path::new("examples/kernels").is_dir() {
        builder
            .clone()
            .source_dir("examples/kernels")
            .and_then(|b| b.out_dir(out_dir().join("examples")).build())
            .and_then(|b| b.write_rust_module("kernels.rs"))
            .unwrap_or_else(|e| fail(&e));
    }
    built.emit_rpath();
    if builder.is_docs_rs() {
        copy_shipped_abi().unwrap_or_else(|e| fail(&e));
    } else {
        generate_abi().unwrap_or_else(|e| fail(&e));
    }
    // For crates that depend on us and build their own kernels (DEP_NVSHMEM_RS_*).
    builder.emit_links_metadata();
    println!("cargo:rerun-if-changed=build.rs");
}

/// `$OUT_DIR/abi.rs` from `kernels/abi.h` (included by src/abi.rs).
fn generate_abi() -> Result<(), Error> {
    let header = PathBuf::from("kernels/abi.h");
    let clang_args = Probe::from_env().prepare_bindgen()?;
    let bindings = bindgen::Builder::default()
        .header(header.display().to_string())
        .clang_args(clang_args)
        .clang_arg("-Ikernels/include")
        // Plain `//` comments become the Rust items' docs (the channel's layout is public).
        .clang_arg("-fparse-all-comments")
        .allowlist_file(".*/(abi|nvshmem_rs/[a-z_]+)\\.h")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .derive_partialeq(true)
        .derive_eq(true)
        .layout_tests(true)
        .generate_comments(true)
        // Formatted in-process, not by whichever rustfmt is on PATH: the same output
        // everywhere, so tests/shipped_abi.rs can compare the shipped copy with it.
        .formatter(bindgen::Formatter::Prettyplease)
        .generate()
        .map_err(|e| Error::Bindgen {
            header: header.clone(),
            message: e.to_string(),
        })?;
    let path = out_dir().join("abi.rs");
    bindings
        .write_to_file(&path)
        .map_err(|source| Error::Io { path, source })?;
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed=kernels/include");
    Ok(())
}

/// The copy of `abi.rs` shipped for docs.rs builds, which have no libclang
/// (`tests/shipped_abi.rs` keeps it equal to what bindgen generates).
const SHIPPED_ABI: &str = "src/abi/generated.rs";

/// docs.rs: `$OUT_DIR/abi.rs` from the shipped copy.
fn copy_shipped_abi() -> Result<(), Error> {
    let path = out_dir().join("abi.rs");
    std::fs::copy(SHIPPED_ABI, &path).map_err(|source| Error::Io {
        path: PathBuf::from(SHIPPED_ABI),
        source,
    })?;
    println!("cargo:rerun-if-changed={SHIPPED_ABI}");
    Ok(())
}

fn out_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"))
}
