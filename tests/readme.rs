//! README.md and the Makefile cannot drift apart: the quick start names real targets, scripts
//! and examples, and the pinned wheels are the same everywhere they are written down.
//! (`scripts/readme-quickstart`, run by CI, runs the quick start itself.)

use std::collections::BTreeSet;
use std::path::Path;

fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of the first ```sh block after `heading`.
fn sh_block(readme: &str, heading: &str) -> Vec<String> {
    let after = &readme[readme
        .find(heading)
        .unwrap_or_else(|| panic!("README.md has no `{heading}`"))..];
    let start = after.find("```sh\n").expect("a ```sh block") + "```sh\n".len();
    let body = &after[start..];
    body[..body.find("```").expect("a closed block")]
        .lines()
        .map(str::to_string)
        .collect()
}

/// The command of a line, without its comment.
fn command(line: &str) -> &str {
    line.split(" #").next().unwrap_or("").trim()
}

fn makefile_targets(makefile: &str) -> BTreeSet<String> {
    makefile
        .lines()
        .filter(|l| !l.starts_with(['\t', '#', ' ']))
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, rest)| !rest.starts_with('=') && !name.contains(['$', ' ', '=']))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// `name==version` pins in a Makefile variable (continued lines included).
fn makefile_pins(makefile: &str, var: &str) -> Vec<String> {
    let start = makefile
        .find(&format!("{var} :="))
        .unwrap_or_else(|| panic!("Makefile has no {var}"));
    let mut pins = Vec::new();
    for line in makefile[start..].lines() {
        pins.extend(
            line.split_whitespace()
                .filter(|w| w.contains("=="))
                .map(str::to_string),
        );
        if !line.trim_end().ends_with('\\') {
            break;
        }
    }
    pins
}

/// The source of `target/release/<program>`: an example, a check or the bench.
fn program_source(program: &str) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match program.strip_prefix("examples/") {
        Some(example) => root.join(format!("examples/{example}.rs")),
        None if program == "bench" => root.join("bench/src/main.rs"),
        None => root.join(format!("checks/src/bin/{program}/main.rs")),
    }
}

#[test]
fn the_quick_start_runs_make_test_and_names_real_targets_scripts_and_examples() {
    let readme = read("README.md");
    let targets = makefile_targets(&read("Makefile"));
    for t in ["setup", "build", "test", "run", "check", "bench"] {
        assert!(targets.contains(t), "Makefile lacks `{t}` ({targets:?})");
    }
    let block = sh_block(&readme, "## Quick start");
    let first = block.first().map(|l| command(l)).unwrap_or("");
    assert_eq!(
        first, "make test",
        "the quick start must start with the test command"
    );
    let mut gpu_lines = 0;
    for line in &block {
        let cmd = command(line);
        let words: Vec<&str> = cmd.split_whitespace().collect();
        if words.first() == Some(&"make") {
            let target = words[1];
            assert!(targets.contains(target), "`{cmd}`: no target {target}");
        }
        for w in &words {
            if let Some(program) = w.strip_prefix("target/release/") {
                assert!(
                    program_source(program).is_file(),
                    "`{cmd}`: no program {program}"
                );
            }
            if w.starts_with("scripts/") {
                assert!(
                    Path::new(env!("CARGO_MANIFEST_DIR")).join(w).is_file(),
                    "`{cmd}`: no {w}"
                );
            }
        }
        let needs_gpu = line.contains("# GPUs:");
        gpu_lines += needs_gpu as usize;
        // What needs a GPU says so; what doesn't must not.
        let gpu_commands = ["make bench", "make check", "make run", "nvshmemrun"];
        assert_eq!(
            gpu_commands.iter().any(|g| cmd.starts_with(g)),
            needs_gpu,
            "`{line}`: GPU commands, and only they, carry `# GPUs:`"
        );
    }
    assert!(gpu_lines >= 3, "the quick start lists the GPU commands");
}

#[test]
fn the_readme_pip_line_pins_what_make_setup_installs() {
    let makefile = read("Makefile");
    let mut make: Vec<String> = ["CUDA_WHEELS", "NVSHMEM_WHEELS", "OTHER_WHEELS"]
        .iter()
        .flat_map(|v| makefile_pins(&makefile, v))
        .collect();
    make.sort();
    let block = sh_block(&read("README.md"), "## Depending on the crates");
    let pip = block
        .iter()
        .find(|l| l.contains("pip install"))
        .expect("a pip install line");
    let mut readme: Vec<String> = pip
        .split_whitespace()
        .filter(|w| w.contains("=="))
        .map(str::to_string)
        .collect();
    readme.sort();
    assert_eq!(
        readme, make,
        "README's pip line and the Makefile's wheels differ"
    );
    // The libclang that nvshmem-build's error messages tell users to install.
    assert!(
        make.iter().any(|w| w == nvshmem_build::LIBCLANG_WHEEL),
        "Makefile does not pin {}",
        nvshmem_build::LIBCLANG_WHEEL
    );
    // The release whose bindings nvshmem-sys ships for docs.rs.
    let nvshmem = format!("nvidia-nvshmem-cu13=={}", nvshmem_build::PINNED_NVSHMEM);
    assert!(
        make.contains(&nvshmem),
        "Makefile does not pin {nvshmem} (nvshmem_build::PINNED_NVSHMEM)"
    );
}
