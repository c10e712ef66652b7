//! The documentation reads as a guide, not a log: the README's first screen says how to
//! install, test and run, and no sentence of the README or of docs/ (outside docs/history/,
//! the dated record of trials) runs over 40 words. Examples are short (150 lines a file at
//! most); the check programs and the bench are cut into modules of 800 lines at most.

use std::path::{Path, PathBuf};

const MAX_WORDS: usize = 40;
/// The README's first screen.
const FIRST_LINES: usize = 40;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The prose of a Markdown file, one string per sentence: code blocks, tables, headings and
/// images are left out; wrapped lines are joined; each list item is its own paragraph.
fn sentences(markdown: &str) -> Vec<String> {
    let mut paragraphs = Vec::new();
    let mut para: Vec<&str> = Vec::new();
    let mut in_code = false;
    let flush = |para: &mut Vec<&str>, out: &mut Vec<String>| {
        if !para.is_empty() {
            out.push(para.join(" "));
            para.clear();
        }
    };
    for line in markdown.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_code = !in_code;
            flush(&mut para, &mut paragraphs);
            continue;
        }
        if in_code {
            continue;
        }
        if t.is_empty() || t.starts_with('|') || t.starts_with('#') || t.starts_with("![") {
            flush(&mut para, &mut paragraphs);
            continue;
        }
        let item = t
            .strip_prefix("- ")
            .or_else(|| t.strip_prefix("* "))
            .or_else(|| {
                let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                (digits > 0)
                    .then(|| t[digits..].strip_prefix(". "))
                    .flatten()
            });
        match item {
            Some(rest) => {
                flush(&mut para, &mut paragraphs);
                para.push(rest);
            }
            None => para.push(t),
        }
    }
    flush(&mut para, &mut paragraphs);
    // A sentence ends at `.`, `!` or `?` before a space and a capital, a code span, a
    // parenthesis, a link or emphasis.
    let mut out = Vec::new();
    for p in paragraphs {
        let words: Vec<&str> = p.split_whitespace().collect();
        let mut start = 0;
        for i in 0..words.len() {
            let ends = words[i].ends_with(['.', '!', '?']);
            let next_starts = words
                .get(i + 1)
                .is_some_and(|w| w.starts_with(|c: char| c.is_uppercase() || "`([*".contains(c)));
            if ends && next_starts || i + 1 == words.len() {
                out.push(words[start..=i].join(" "));
                start = i + 1;
            }
        }
    }
    out
}

/// README.md and every Markdown file under docs/, but not docs/history/.
fn guide_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let docs = root().join("docs");
    for entry in std::fs::read_dir(&docs).expect("docs/") {
        let path = entry.expect("an entry of docs/").path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files.sort();
    files
}

#[test]
fn no_sentence_of_the_readme_or_the_guide_runs_over_40_words() {
    let mut long = Vec::new();
    for file in guide_files() {
        let text = std::fs::read_to_string(&file).expect("a readable file");
        for s in sentences(&text) {
            let n = s.split_whitespace().count();
            if n > MAX_WORDS {
                let name = file.strip_prefix(root()).unwrap_or(&file).display();
                long.push(format!("{name}: {n} words: {s}"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "sentences over {MAX_WORDS} words (cut them, or move a table of figures out of the \
         prose):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_readme_first_screen_says_how_to_install_test_and_run() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let first: Vec<&str> = readme.lines().take(FIRST_LINES).collect();
    let has = |what: &str| first.iter().any(|l| l.contains(what));
    for what in ["make test", "make bench", "pip install", "cargo add"] {
        assert!(
            has(what),
            "README.md's first {FIRST_LINES} lines lack `{what}`"
        );
    }
}

/// Every `.rs` file under `dir` with more than `max` lines, as `path: lines`.
fn longer_than(dir: &str, max: usize) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() && !path.ends_with("target") {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join(dir), &mut files);
    assert!(!files.is_empty(), "no .rs file under {dir}");
    files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).ok()?.lines().count();
            (lines > max).then(|| format!("{}: {lines}", f.display()))
        })
        .collect()
}

#[test]
fn examples_are_short_and_the_programs_are_cut_into_modules() {
    let long = longer_than("examples", 150);
    assert!(
        long.is_empty(),
        "examples over 150 lines:\n{}",
        long.join("\n")
    );
    for dir in ["checks", "bench"] {
        let long = longer_than(dir, 800);
        assert!(
            long.is_empty(),
            "files over 800 lines:\n{}",
            long.join("\n")
        );
    }
}

#[test]
fn the_sentence_counter_finds_long_sentences_and_skips_code_and_tables() {
    let long = vec!["word"; 41].join(" ");
    let text = format!(
        "# Title\n\nShort one. Another `code` here.\n\n```sh\n{long}\n```\n\n| {long} |\n\n- {long}.\n"
    );
    let found = sentences(&text);
    assert_eq!(found[0], "Short one.");
    assert_eq!(found[1], "Another `code` here.");
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(found[2].split_whitespace().count(), 41);
}
