//! docs/environment.md lists every environment variable the crates read, and only those:
//! the variable names in the sources (string literals outside tests) and the table's first
//! column must be the same set.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The Rust sources of the published crates and their build scripts.
fn sources() -> Vec<PathBuf> {
    let mut files = vec![
        PathBuf::from("build.rs"),
        PathBuf::from("nvshmem-sys/build.rs"),
    ];
    for dir in ["src", "nvshmem-build/src", "nvshmem-sys/src"] {
        collect(&Path::new(ROOT).join(dir), &mut files);
    }
    files
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether a string literal names a variable a user sets: not one cargo sets for build
/// scripts, not one of NVSHMEM's header macros (`NVSHMEM_VENDOR_*`), not a `links` name
/// (`NVSHMEM_RS`, read as `DEP_NVSHMEM_RS_*`), and not one our build scripts hand to the
/// compiler (`NVSHMEM_SYS_*`, read with `env!`).
fn is_user_variable(name: &str) -> bool {
    let prefixed = ["NVSHMEM_", "CUDA_", "LIBCLANG_"]
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len());
    let bare = ["NVCC", "PYTHON", "PATH", "CC", "DOCS_RS"].contains(&name);
    let ours = name == "NVSHMEM_RS"
        || name.starts_with("NVSHMEM_VENDOR_")
        || name.starts_with("NVSHMEM_SYS_");
    (prefixed || bare) && !ours
}

/// Variable names among the string literals of `text`, up to its test module.
fn variables_in(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut names = BTreeSet::new();
    for piece in code.split('"').skip(1).step_by(2) {
        let looks_like_name = !piece.is_empty()
            && piece
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if looks_like_name && is_user_variable(piece) {
            names.insert(piece.to_string());
        }
    }
    names
}

/// The first column of the tables of docs/environment.md.
fn documented() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/environment.md")).unwrap();
    doc.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_variable_read_is_documented_and_every_documented_one_is_read() {
    let mut read = BTreeSet::new();
    for file in sources() {
        let path = Path::new(ROOT).join(&file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        read.extend(variables_in(&text));
    }
    let documented = documented();
    let undocumented: Vec<_> = read.difference(&documented).collect();
    let unread: Vec<_> = documented.difference(&read).collect();
    assert!(
        undocumented.is_empty() && unread.is_empty(),
        "docs/environment.md is out of date: read but not documented {undocumented:?}; \
         documented but not read {unread:?}"
    );
}

#[test]
fn the_scan_finds_names_and_skips_the_rest() {
    let text = r#"let a = var("NVSHMEM_RS_TIMEOUT"); let b = "OUT_DIR"; let c = "PATH";
        let d = "NVSHMEM_VENDOR_MAJOR_VERSION"; let e = "nvshmem_malloc";
        #[cfg(test)] mod tests { const X: &str = "NVSHMEM_DEBUG"; }"#;
    let found: Vec<_> = variables_in(text).into_iter().collect();
    assert_eq!(found, ["NVSHMEM_RS_TIMEOUT", "PATH"]);
}
