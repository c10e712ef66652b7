//! Generates the bindings over the NVSHMEM host API and links `libnvshmem_host.so.3`.
//!
//! Only functions that the host library really exports are bound: the headers also declare
//! device functions and static inline wrappers (`nvshmem_init` exits the process on error),
//! which a Rust caller must not reach.

use nvshmem_build::{fail, CudaToolkit, Error, NvshmemInstall, Probe};
use object::{Object, ObjectSymbol};
use std::path::PathBuf;

fn main() {
    let probe = Probe::from_env();
    let nvshmem = probe.find_nvshmem().unwrap_or_else(|e| fail(&e));
    let cuda = probe.find_cuda().unwrap_or_else(|e| fail(&e));
    let clang_args = probe.prepare_bindgen().unwrap_or_else(|e| fail(&e));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));

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
    println!("cargo:rerun-if-changed=build.rs");
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
