//! NVSHMEM's host library runs at `NVSHMEM_THREAD_SERIALIZED`: no two threads may be inside it
//! at once. The crate's types are `Send + Sync`, so every host call it makes must hold the
//! process-wide lock (`HostCall`, taken by `host_call()`). Checked here on the source: each
//! direct call into NVSHMEM (`sys::nvshmem*(..)`, and the element types' typed entry points)
//! sits in a function that takes the guard, or in a closure handed to a helper that does.

use std::path::{Path, PathBuf};

fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
    out.sort();
    out
}

/// A function of a source text: its name and the byte range of its body.
struct FnSpan {
    name: String,
    body: std::ops::Range<usize>,
}

/// Every `fn` with a body (braces matched; the crate's strings keep theirs balanced).
fn functions(text: &str) -> Vec<FnSpan> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find("fn ") {
        let start = at + i;
        at = start + 3;
        let word_start =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        if !word_start {
            continue;
        }
        let name: String = text[start + 3..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // The body starts at the first `{` before any `;` (a declaration has none).
        let rest = &text[start..];
        let (Some(open), semi) = (rest.find('{'), rest.find(';')) else {
            continue;
        };
        if semi.is_some_and(|s| s < open) {
            continue;
        }
        let open = start + open;
        let mut depth = 0usize;
        let mut end = None;
        for (k, &b) in bytes[open..].iter().enumerate() {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + k + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        if let Some(end) = end {
            out.push(FnSpan {
                name,
                body: open..end,
            });
        }
    }
    out
}

/// Where NVSHMEM is called directly: `sys::nvshmem...(` and the typed entry points of
/// `Element` (`T::p(`, `T::reduction_on_stream(`, ...), which wrap such calls.
fn call_sites(text: &str) -> Vec<(usize, String)> {
    const TYPED: &[&str] = &[
        "T::p(",
        "T::g(",
        "T::p_on_stream(",
        "T::g_on_stream(",
        "T::reduction_on_stream(",
        "T::exchange_on_stream(",
        "T::broadcast_on_stream(",
        "T::wait_until_on_stream(",
    ];
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find("sys::nvshmem") {
        let start = at + i;
        let name: String = text[start + 5..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        at = start + 5 + name.len();
        if text[at..].starts_with('(') {
            out.push((start, name));
        }
    }
    for pattern in TYPED {
        let mut at = 0;
        while let Some(i) = text[at..].find(pattern) {
            out.push((at + i, pattern.trim_end_matches('(').to_string()));
            at += i + pattern.len();
        }
    }
    out
}

/// Whether, at the end of `before` (a function body up to a call), a guard is held: bound to
/// a name (`let _host = ...host_call(...)`; `let _ =` drops it at once) in a block that is
/// still open.
fn holds_guard(before: &str) -> bool {
    let Some(at) = before.rfind("host_call(") else {
        return false;
    };
    let line_start = before[..at].rfind('\n').map_or(0, |i| i + 1);
    let statement = before[line_start..at].trim_start();
    let named = statement.strip_prefix("let ").is_some_and(|rest| {
        rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            && !rest.starts_with("_ ")
            && !rest.starts_with("_=")
    });
    // The guard's block closes where the depth falls below the guard's.
    let mut depth = 0i64;
    for c in before[at..].chars() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => {}
        }
    }
    named
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

#[test]
fn every_nvshmem_host_call_holds_the_host_library() {
    let mut unguarded = Vec::new();
    let mut checked = 0;
    for path in sources() {
        let rel = path
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .display()
            .to_string();
        // element.rs defines the typed entry points (unsafe; their callers are checked).
        if rel.ends_with("element.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let fns = functions(&text);
        // Helpers that run a closure they are given under the guard: those that take it, and
        // (to a fixed point) those that hand the closure on to such a helper.
        let takes_closure = |f: &FnSpan| {
            text[..f.body.start].rfind("fn ").is_some_and(|s| {
                let sig = &text[s..f.body.start];
                sig.contains("impl FnOnce") || sig.contains("impl Fn")
            })
        };
        let calls = |body: &str, helpers: &[&str]| {
            helpers
                .iter()
                .any(|h| body.contains(&format!(".{h}(")) || body.contains(&format!(" {h}(")))
        };
        let mut guarded_helpers: Vec<&str> = Vec::new();
        loop {
            let before = guarded_helpers.len();
            for f in &fns {
                let body = &text[f.body.clone()];
                if takes_closure(f)
                    && !guarded_helpers.contains(&f.name.as_str())
                    && (body.contains("host_call(") || calls(body, &guarded_helpers))
                {
                    guarded_helpers.push(&f.name);
                }
            }
            if guarded_helpers.len() == before {
                break;
            }
        }
        for (at, name) in call_sites(&text) {
            checked += 1;
            // The innermost function around the call.
            let Some(f) = fns
                .iter()
                .filter(|f| f.body.contains(&at))
                .min_by_key(|f| f.body.len())
            else {
                unguarded.push(format!(
                    "{rel}:{}: {name} outside any function",
                    line_of(&text, at)
                ));
                continue;
            };
            let body = &text[f.body.clone()];
            let guarded = holds_guard(&text[f.body.start..at]) || calls(body, &guarded_helpers);
            if !guarded {
                unguarded.push(format!(
                    "{rel}:{}: {name} in fn {} without a HostCall",
                    line_of(&text, at),
                    f.name
                ));
            }
        }
    }
    assert!(
        checked > 40,
        "only {checked} NVSHMEM calls found: is the scan broken?"
    );
    assert!(
        unguarded.is_empty(),
        "NVSHMEM host calls made without the host library's lock (take `let _host = \
         shmem.host_call()?` first):\n{}",
        unguarded.join("\n")
    );
}

#[test]
fn the_scan_finds_an_unguarded_call() {
    let text = "fn bad(&self) -> i32 {\n    unsafe { sys::nvshmem_my_pe() }\n}\n\
                fn good(&self) -> i32 {\n    let _host = self.host_call()?;\n    unsafe { sys::nvshmem_n_pes() }\n}\n";
    let fns = functions(text);
    assert_eq!(
        fns.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["bad", "good"]
    );
    let sites = call_sites(text);
    assert_eq!(sites.len(), 2);
    let in_fn = |at: usize| fns.iter().find(|f| f.body.contains(&at)).unwrap();
    assert_eq!(in_fn(sites[0].0).name, "bad");
    assert!(!text[in_fn(sites[0].0).body.clone()].contains("host_call("));
    assert!(text[in_fn(sites[1].0).body.clone()].contains("host_call("));
}

#[test]
fn a_guard_must_be_named_and_still_in_scope() {
    assert!(holds_guard(
        "{\n    let _host = self.host_call()?;\n    unsafe { "
    ));
    assert!(holds_guard(
        "{\n    let host = host_call();\n    { unsafe { "
    ));
    // Dropped at once.
    assert!(!holds_guard(
        "{\n    let _ = self.host_call();\n    unsafe { "
    ));
    assert!(!holds_guard("{\n    self.host_call()?;\n    unsafe { "));
    // Its block has closed.
    assert!(!holds_guard(
        "{\n    {\n        let _host = host_call();\n    }\n    unsafe { "
    ));
    assert!(!holds_guard("{\n    unsafe { "));
}
