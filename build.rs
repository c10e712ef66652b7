//! Compiles `kernels/*.cu` into linked cubins (one per architecture) and embeds them, and
//! turns `kernels/abi.h`, the definitions the kernels and the Rust side share, into Rust.
//! The tensor-parallel layers' kernels (`kernels/tp.cu`) are built only with the `tp`
//! feature.

use nvshmem_build::{emit_rpath, fail, Error, KernelBuilder, Probe};
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
    emit_rpath(&built.nvshmem.lib_dir);
    generate_abi().unwrap_or_else(|e| fail(&e));
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

fn out_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"))
}
