//! The shape ARCHITECTURE.md describes, checked: the modules of src/ import each other
//! without a cycle, and the code cites files that exist.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `dir` (relative to the checkout) whose name ends in one of `exts`.
fn files(dir: &str, exts: &[&str]) -> Vec<PathBuf> {
    fn walk(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, exts, out);
            } else if exts
                .iter()
                .any(|x| path.to_string_lossy().ends_with(&format!(".{x}")))
            {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join(dir), exts, &mut out);
    out.sort();
    out
}

/// The top-level module of src/ a file belongs to (`memory` for src/memory/view.rs).
fn top_module(file: &Path) -> String {
    let rel = file.strip_prefix(root().join("src")).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The top-level modules a source text names through `crate::` (in `use` lines and paths).
fn crate_references(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.insert(name);
        }
        // `use crate::{a, b::c}`: every name in the braces.
        if let Some(list) = after.strip_prefix('{') {
            let end = list.find('}').unwrap_or(0);
            for item in list[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        }
        rest = after;
    }
    found
}

/// The module graph of src/: module -> the other top-level modules it imports.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files("src", &["rs"]) {
        let module = top_module(&file);
        if module == "lib" {
            continue; // the crate root only declares and re-exports
        }
        // Imports are code: comments (doc links included) do not count.
        let text: String = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let deps = graph.entry(module.clone()).or_default();
        deps.extend(crate_references(&text).into_iter().filter(|m| *m != module));
    }
    graph
}

/// A cycle through `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// The modules of src/ in ARCHITECTURE.md's order: each may import only those before it.
const LAYERS: [&str; 23] = [
    "error",
    "diag",
    "abi",
    "runtime",
    "order",
    "element",
    "memory",
    "team",
    "rma",
    "signal",
    "sync",
    "module",
    "cubins",
    "atomic",
    "collectives",
    "grad_sync",
    "tp",
    "channel",
    "pool",
    "map",
    "pipeline",
    "start",
    "lib",
];

#[test]
fn the_modules_of_src_import_only_the_layers_below_them() {
    let graph = module_graph();
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    for (module, deps) in &graph {
        let r = rank(module).unwrap_or_else(|| panic!("src/{module} is not in LAYERS"));
        for d in deps {
            let rd = rank(d).unwrap_or_else(|| panic!("{module} imports {d}, not in LAYERS"));
            assert!(
                rd < r,
                "{module} imports {d}, which ARCHITECTURE.md puts above it"
            );
        }
    }
    // Every layer is listed in ARCHITECTURE.md, in this order.
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let start = text.find("the safe API").expect("the layers of nvshmem");
    let end = start
        + text[start..]
            .find("\nkernels/")
            .expect("the kernels after them");
    let doc = &text[start..end];
    let mut at = 0;
    let word_at = |text: &str, i: usize, w: &str| {
        let before = text[..i].chars().next_back();
        let after = text[i + w.len()..].chars().next();
        matches!(before, Some(' ' | ',')) && matches!(after, Some(' ' | ',' | '\n'))
    };
    for layer in &LAYERS[..LAYERS.len() - 1] {
        let found = doc[at..]
            .match_indices(layer)
            .map(|(i, _)| at + i)
            .find(|&i| word_at(doc, i, layer))
            .unwrap_or_else(|| {
                panic!("ARCHITECTURE.md does not list {layer} after the ones above")
            });
        at = found;
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle in src/: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let edge = |g: &mut BTreeMap<String, BTreeSet<String>>, a: &str, b: &str| {
        g.entry(a.into()).or_default().insert(b.into());
    };
    edge(&mut graph, "atomic", "module");
    edge(&mut graph, "module", "memory");
    edge(&mut graph, "memory", "runtime");
    assert_eq!(find_cycle(&graph), None);
    edge(&mut graph, "runtime", "atomic");
    let cycle = find_cycle(&graph).expect("a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 5);
    let refs = crate_references("use crate::error::{Error, Result};\nuse crate::{abi, memory::X};\nlet x = crate::runtime::f();");
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        ["abi", "error", "memory", "runtime"]
    );
}

/// Paths like `kernels/abi.h` or `src/memory/view.rs` that a text names.
fn cited_paths(text: &str) -> Vec<String> {
    const ROOTS: [&str; 10] = [
        "src/",
        "kernels/",
        "docs/",
        "scripts/",
        "examples/",
        "checks/",
        "bench/",
        "tests/",
        "nvshmem-build/",
        "nvshmem-sys/",
    ];
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let mut found = Vec::new();
    for (i, _) in text.char_indices() {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| path_char(c) || c == '$') {
            continue;
        }
        if let Some(r) = ROOTS.iter().find(|r| text[i..].starts_with(**r)) {
            let len = text[i..]
                .find(|c: char| !path_char(c))
                .unwrap_or(text.len() - i);
            let path = text[i..i + len].trim_end_matches(['.', '-']);
            if path.len() > r.len() && !text[i + len..].starts_with('*') {
                found.push(path.to_string());
            }
        }
    }
    found
}

#[test]
fn code_cites_files_that_exist() {
    let mut sources = Vec::new();
    for dir in [
        "src",
        "kernels",
        "nvshmem-build/src",
        "nvshmem-sys/src",
        "examples",
        "checks",
        "bench",
    ] {
        sources.extend(files(dir, &["rs", "cu", "cuh", "h"]));
    }
    sources.extend(
        ["build.rs", "nvshmem-sys/build.rs", "ARCHITECTURE.md"]
            .iter()
            .map(|f| root().join(f)),
    );
    let mut missing = Vec::new();
    for file in &sources {
        // A path may be relative to the checkout or to the file's own crate.
        let crate_dir = file
            .ancestors()
            .find(|d| d.join("Cargo.toml").is_file())
            .unwrap_or(root());
        let text = std::fs::read_to_string(file).unwrap();
        for path in cited_paths(&text) {
            if !root().join(&path).exists() && !crate_dir.join(&path).exists() {
                missing.push(format!("{}: {path}", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "cited but missing:\n{}",
        missing.join("\n")
    );
}

#[test]
fn cited_paths_are_found_in_text() {
    let text = "see kernels/abi.h, and src/memory/view.rs: (kernels/*.cu) $OUT_DIR/kernels.rs";
    assert_eq!(cited_paths(text), ["kernels/abi.h", "src/memory/view.rs"]);
}
