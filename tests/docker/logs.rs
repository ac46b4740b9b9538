//! The log lines `docs/operations.md` documents are the lines the code
//! writes: each documented message is found in a `tracing` call in the
//! crates, and the fields the table names are exactly the fields that call
//! writes (its format arguments aside). A runbook that searches for
//! `charge_id=` on a line that carries `operation=` finds nothing at 3 a.m.

use std::collections::BTreeSet;
use std::path::Path;

use crate::{read, root};

/// One `tracing::<level>!(...)` call: its message literal and its fields.
#[derive(Debug)]
struct Call {
    at: String,
    message: String,
    fields: BTreeSet<String>,
}

/// Every `.rs` file under `dir`, relative to the root.
fn sources(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(root().join(dir)).unwrap() {
        let path = entry.unwrap().path();
        let relative = path.strip_prefix(root()).unwrap().to_owned();
        if path.is_dir() {
            sources(&relative, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(relative.to_string_lossy().into_owned());
        }
    }
}

/// The top-level arguments of the macro call whose `(` is at `text[0]`,
/// split at commas outside brackets and string literals.
fn arguments(text: &str) -> Vec<String> {
    let (mut args, mut current) = (Vec::new(), String::new());
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for c in text.chars() {
        if in_string {
            current.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                current.push(c);
            }
            '(' | '[' | '{' => {
                depth += 1;
                if depth > 1 {
                    current.push(c);
                }
            }
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    args.push(current.trim().to_owned());
                    return args.into_iter().filter(|a| !a.is_empty()).collect();
                }
                current.push(c);
            }
            ',' if depth == 1 => args.push(std::mem::take(&mut current).trim().to_owned()),
            _ => current.push(c),
        }
    }
    panic!("unclosed macro call: {text:.80}");
}

/// A string literal's text: escapes and line continuations resolved.
fn literal(arg: &str) -> String {
    let inner = &arg[1..arg.len() - 1];
    let (mut out, mut chars) = (String::new(), inner.chars().peekable());
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\n') => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
            }
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// A field argument's name: `name = expr`, `%name`, `?name` or `name`.
fn field(arg: &str) -> Option<String> {
    let name: String = arg
        .trim_start_matches(['%', '?'])
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    let rest = arg.trim_start_matches(['%', '?'])[name.len()..].trim_start();
    let is_field =
        !name.is_empty() && (rest.is_empty() || (rest.starts_with('=') && !rest.starts_with("==")));
    is_field.then_some(name)
}

/// Every `tracing::` event in the crates.
fn calls() -> Vec<Call> {
    let mut files = Vec::new();
    sources(Path::new("crates"), &mut files);
    let mut calls = Vec::new();
    for file in files {
        let text = read(&file);
        for level in ["error", "warn", "info", "debug"] {
            let needle = format!("tracing::{level}!");
            for (at, _) in text.match_indices(&needle) {
                let args = arguments(&text[at + needle.len()..]);
                let Some(message) = args.iter().position(|a| a.starts_with('"')) else {
                    continue;
                };
                let line = text[..at].matches('\n').count() + 1;
                calls.push(Call {
                    at: format!("{file}:{line}"),
                    message: literal(&args[message]),
                    fields: args[..message].iter().filter_map(|a| field(a)).collect(),
                });
            }
        }
    }
    calls
}

/// Whether `documented` (cut at `...` when it ends so) is `written`, where
/// a `{...}` of the code stands for one word, or for the rest when last.
fn matches(documented: &str, written: &str) -> bool {
    let (documented, cut) = match documented.split_once("...") {
        Some((head, _)) => (head.trim_end(), true),
        None => (documented, false),
    };
    let (d, w): (Vec<&str>, Vec<&str>) = (
        documented.split_whitespace().collect(),
        written.split_whitespace().collect(),
    );
    // A message that is all placeholders (`"{error:#}"`) says nothing.
    if w.iter().all(|x| x.starts_with('{') && x.ends_with('}')) {
        return false;
    }
    for (i, word) in d.iter().enumerate() {
        match w.get(i) {
            Some(x) if i > 0 && x.starts_with('{') && x.ends_with('}') && i + 1 == w.len() => {
                return true;
            }
            Some(x) if x == word => {}
            Some(x) if x.contains('{') => {
                let (before, _) = x.split_once('{').unwrap_or((x, ""));
                let after = x.rsplit_once('}').map_or("", |(_, a)| a);
                if !(word.starts_with(before) && word.ends_with(after)) {
                    return false;
                }
            }
            _ => return false,
        }
    }
    cut || d.len() == w.len()
}

/// The `## Log lines` table of docs/operations.md: each documented message
/// with the fields its row names.
fn documented() -> Vec<(String, BTreeSet<String>)> {
    let text = read("docs/operations.md");
    let section = text
        .split("\n## Log lines\n")
        .nth(1)
        .expect("docs/operations.md has a `## Log lines` section");
    let mut rows = Vec::new();
    for line in section.lines().take_while(|l| !l.starts_with("## ")) {
        let Some(first) = line.strip_prefix("| ").and_then(|l| l.split(" | ").next()) else {
            continue;
        };
        let mut quoted: Vec<&str> = first.split('`').collect();
        quoted.retain(|_| true);
        for (i, part) in quoted.iter().enumerate() {
            if i % 2 == 0 {
                continue;
            }
            let words: Vec<&str> = part.split_whitespace().collect();
            if !words.is_empty() && words.iter().all(|w| w.ends_with('=')) {
                if let Some((_, fields)) = rows.last_mut() {
                    let fields: &mut BTreeSet<String> = fields;
                    fields.extend(words.iter().map(|w| w.trim_end_matches('=').to_owned()));
                }
            } else {
                rows.push((part.to_string(), BTreeSet::new()));
            }
        }
    }
    rows
}

#[test]
fn the_documented_log_lines_carry_the_documented_fields() {
    let calls = calls();
    assert!(
        calls.len() > 100,
        "only {} tracing calls found",
        calls.len()
    );
    let rows = documented();
    assert!(
        rows.len() > 25,
        "only {} documented lines found",
        rows.len()
    );
    let mut wrong = Vec::new();
    for (message, fields) in &rows {
        let found: Vec<&Call> = calls
            .iter()
            .filter(|c| matches(message, &c.message))
            .collect();
        if found.is_empty() {
            wrong.push(format!("`{message}`: no tracing call writes it"));
        }
        for call in found {
            if &call.fields != fields {
                wrong.push(format!(
                    "`{message}` ({}): documented {:?}, written {:?}",
                    call.at, fields, call.fields
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/operations.md's log lines:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_call_is_read_as_tracing_reads_it() {
    let text = r#"(
        record_id = %record.id,
        %reason,
        ?doubt,
        amount_cents,
        kind = kind.as_str(),
        "ABANDONED: a \"b\", c \
         d {what}",
        x = 1
    );"#;
    let args = arguments(text);
    assert_eq!(args.len(), 7, "{args:?}");
    assert_eq!(literal(&args[5]), r#"ABANDONED: a "b", c d {what}"#);
    let fields: Vec<String> = args[..5].iter().filter_map(|a| field(a)).collect();
    assert_eq!(
        fields,
        ["record_id", "reason", "doubt", "amount_cents", "kind"]
    );
    assert!(matches(
        "ABANDONED: a \"b\", c d e f ...",
        &literal(&args[5])
    ));
    assert!(matches("reap pass", "reap pass"));
    assert!(!matches("reap pass", "reap pass done"));
    assert!(matches("reap ...", "reap pass done"));
    assert!(matches("made this charge for us", "made this {} for us"));
    assert!(!matches("anything at all", "{error:#}"));
}
