//! The docs run the binaries `make run` built, never `cargo run`: a
//! `cargo run -p X` compiles X again (features unify differently per
//! package), minutes on a laptop. Every `target/debug/NAME` they name is a
//! binary of the workspace.

use std::path::PathBuf;

use crate::{read, root, workspace};

/// README.md, docs/*.md, every crate's README.md and every client package's
/// (clients/*/README.md), relative to the root.
pub(crate) fn markdown() -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    for dir in ["docs", "crates", "clients"] {
        let entries = std::fs::read_dir(root().join(dir)).unwrap();
        for entry in entries.map(|e| e.unwrap().path()) {
            let candidate: PathBuf = if entry.is_dir() {
                entry.join("README.md")
            } else {
                entry
            };
            if candidate.extension().is_some_and(|e| e == "md") && candidate.is_file() {
                let relative = candidate.strip_prefix(root()).unwrap();
                files.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    files
}

#[test]
fn the_docs_run_the_built_binaries() {
    let (_, bins) = workspace();
    let files = markdown();
    assert!(files.iter().any(|f| f == "docs/operations.md"), "{files:?}");
    for file in files {
        let text = read(&file);
        for (n, line) in (1..).zip(text.lines()) {
            assert!(
                !line.contains("cargo run"),
                "{file}:{n} runs `cargo run` (it compiles again); name the built binary: {line}"
            );
            for named in line.split("target/debug/").skip(1) {
                let name: String = named
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                // `target/debug/` alone names the directory.
                let named_binary = name.is_empty() || bins.contains_key(&name);
                assert!(named_binary, "{file}:{n}: no binary {name:?}: {line}");
            }
        }
    }
}

/// The README and the loadtest README name every check `payments-smoke`
/// runs: a staging pipeline's reader learns there what a FAIL line means.
#[test]
fn the_readmes_list_every_smoke_check() {
    for file in ["README.md", "crates/loadtest/README.md"] {
        let text = read(file);
        for check in payments_loadtest::smoke::Check::ALL {
            let name = format!("`{}`", check.name());
            assert!(
                text.contains(&name),
                "{file} does not list the smoke check {name}"
            );
        }
    }
}
