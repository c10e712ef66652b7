//! Generates the bindings over the NVSHMEM host API and links `libnvshmem_host.so.3`.
//!
//! Only functions that the host library really exports are bound: the headers also declare
//! device functions and static inline wrappers (`nvshmem_init` exits the process on error),
//! which a Rust caller must not reach.
//!
//! On docs.rs (`DOCS_RS` set), which has no NVSHMEM, CUDA compiler or libclang, the bindings
//! are the ones shipped in src/bindings/ for the pinned release, and nothing is linked.

use nvshmem_build::{fail, CudaToolkit, Error, NvshmemInstall, Probe, PINNED_NVSHMEM};
use object::{Object, ObjectSymbol};
use std::path::{Path, PathBuf};

fn main() {
    let probe = Probe::from_env();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    println!("cargo:rerun-if-changed=build.rs");
    if probe.docs_rs() {
        docs_rs(&out).unwrap_or_else(|e| fail(&e));
        return;
    }
    let nvshmem = probe.find_nvshmem().unwrap_or_else(|e| fail(&e));
    // Headers, host library and device library of one release, or a message saying which.
    nvshmem.check_release().unwrap_or_else(|e| fail(&e));
    let cuda = probe.find_cuda().unwrap_or_else(|e| fail(&e));
    let clang_args = probe.prepare_bindgen().unwrap_or_else(|e| fail(&e));

    let exported = exported_functions(&nvshmem).unwrap_or_else(|e| fail(&e));
    let bindings = generate(&nvshmem, &cuda, &clang_args, &exported).unwrap_or_else(|e| fail(&e));
    let path = out.join("bindings.rs");
    bindings.write_to_file(&path).unwrap_or_else(|source| {
        fail(&Error::Io {
            path: path.clone(),
            source,
        })
    });

    let lib_name = nvshmem.host_lib_file_name();
    println!(
        "cargo:rustc-link-search=native={}",
        nvshmem.lib_dir.display()
    );
    if lib_name.ends_with(".so") {
        println!("cargo:rustc-link-lib=dylib=nvshmem_host");
    } else {
        // The pip wheel ships only the versioned name, which `-l` cannot spell.
        println!("cargo:rustc-link-lib=dylib:+verbatim={lib_name}");
    }
    nvshmem_build::emit_rpath(&nvshmem.lib_dir);

    // `links` metadata, read by dependents as DEP_NVSHMEM_*.
    println!("cargo:include={}", nvshmem.include_dir.display());
    println!("cargo:lib_dir={}", nvshmem.lib_dir.display());
    println!("cargo:host_lib={}", nvshmem.host_lib.display());
    println!("cargo:device_lib={}", nvshmem.device_lib.display());
    println!("cargo:version={}", nvshmem.version);
    println!("cargo:nvcc={}", cuda.nvcc.display());
    println!("cargo:rustc-env=NVSHMEM_SYS_VERSION={}", nvshmem.version);
    println!(
        "cargo:rustc-env=NVSHMEM_SYS_HOST_LIB={}",
        nvshmem.host_lib.display()
    );
}

/// The bindings bindgen generates from the pinned release's headers, as shipped
/// (`src/bindings/nvshmem_3_4_5.rs`; `tests/shipped_bindings.rs` keeps them equal).
fn shipped_bindings() -> PathBuf {
    let v = PINNED_NVSHMEM;
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo");
    Path::new(&manifest)
        .join("src/bindings")
        .join(format!("nvshmem_{}_{}_{}.rs", v.major, v.minor, v.patch))
}

/// docs.rs: the shipped bindings, the pinned release, no library.
fn docs_rs(out: &Path) -> Result<(), Error> {
    let shipped = shipped_bindings();
    let path = out.join("bindings.rs");
    std::fs::copy(&shipped, &path).map_err(|source| Error::Io {
        path: shipped.clone(),
        source,
    })?;
    println!("cargo:rerun-if-changed={}", shipped.display());
    println!("cargo:version={PINNED_NVSHMEM}");
    println!("cargo:rustc-env=NVSHMEM_SYS_VERSION={PINNED_NVSHMEM}");
    println!("cargo:rustc-env=NVSHMEM_SYS_HOST_LIB=");
    println!(
        "nvshmem-sys: DOCS_RS is set: bindings of NVSHMEM {PINNED_NVSHMEM} from {}, nothing \
         linked (documentation only)",
        shipped.display()
    );
    Ok(())
}

/// Names of the `nvshmem_*`/`nvshmemx_*` functions in the host library's dynamic symbol table.
fn exported_functions(nvshmem: &NvshmemInstall) -> Result<Vec<String>, Error> {
    let lib = &nvshmem.host_lib;
    let data = std::fs::read(lib).map_err(|source| Error::Io {
        path: lib.clone(),
        source,
    })?;
    let not_nvshmem = |why: String| {
        Error::Invalid(format!(
            "{} is not the NVSHMEM 3 host library ({why}); point NVSHMEM_HOME at an NVSHMEM 3 \
             install, or unset it to use `make setup`'s .venv",
            lib.display()
        ))
    };
    let file = object::File::parse(&*data).map_err(|e| not_nvshmem(e.to_string()))?;
    let mut names: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
        .filter_map(|s| s.name().ok())
        // Versioned names look like `nvshmem_malloc@@NVSHMEM` in some readers.
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .filter(|n| n.starts_with("nvshmem_") || n.starts_with("nvshmemx_"))
        .collect();
    names.sort();
    names.dedup();
    if names.len() < 500 {
        return Err(not_nvshmem(format!(
            "it exports only {} NVSHMEM functions",
            names.len()
        )));
    }
    Ok(names)
}

fn generate(
    nvshmem: &NvshmemInstall,
    cuda: &CudaToolkit,
    clang_args: &[String],
    exported: &[String],
) -> Result<bindgen::Bindings, Error> {
    let mut builder = bindgen::Builder::default()
        .header_contents(
            "wrapper.hpp",
            "#include <nvshmem.h>\n#include <nvshmemx.h>\n",
        )
        // The 3.x headers parse only as C++.
        .clang_args(["-x", "c++", "-std=c++17", "-DNVSHMEM_HOSTLIB_ONLY"])
        .clang_arg(format!("-I{}", nvshmem.include_dir.display()))
        .allowlist_type("nvshmem.*|NVSHMEM.*")
        .allowlist_var("nvshmem.*|NVSHMEM.*")
        // The init flags (NVSHMEMX_INIT_WITH_UNIQUEID...) are an enum the header calls `flags`.
        .allowlist_type("flags")
        .allowlist_recursively(true)
        .derive_default(true)
        .derive_debug(true)
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .layout_tests(true)
        .generate_comments(false)
        // Formatted in-process, not by whichever rustfmt is on PATH, so the output is the
        // same everywhere and the shipped copy can be compared with it.
        .formatter(bindgen::Formatter::Prettyplease)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for dir in &cuda.include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    // What libclang needs besides (the C compiler's builtin headers for the PyPI wheel's).
    builder = builder.clang_args(clang_args);
    for name in exported {
        builder = builder.allowlist_function(format!("^{name}$"));
    }
    builder.generate().map_err(|e| Error::Bindgen {
        header: nvshmem.include_dir.join("nvshmem.h"),
        message: e.to_string(),
    })
}
