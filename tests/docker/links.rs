//! A link checker over the README, `docs/` and every crate's README:
//! every internal link names a file of the repository (never one outside
//! it), and every `#anchor` into Markdown names one of its headings, as
//! GitHub renders them. External links are not fetched (CI has no
//! internet).

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

use crate::docs::markdown;
use crate::{read, root};

/// The anchors GitHub gives `text`'s headings: each heading's text, lower
/// case, with every character but letters, digits, `-`, `_` and spaces
/// dropped and spaces made `-`; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new_ext(text, Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let Some(h) = heading.take() else { continue };
                let slug: String = h
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect();
                let mut unique = slug.clone();
                let mut n = 0;
                while found.contains(&unique) {
                    n += 1;
                    unique = format!("{slug}-{n}");
                }
                found.insert(unique);
            }
            _ => {}
        }
    }
    found
}

/// Every link and image destination in `text`, with its line number.
fn links(text: &str) -> Vec<(usize, String)> {
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    Parser::new_ext(text, Options::ENABLE_TABLES)
        .into_offset_iter()
        .filter_map(|(event, range)| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some((line_of(range.start), dest_url.into_string()))
            }
            _ => None,
        })
        .collect()
}

/// `relative` joined to `dir`, `..` resolved, or `None` if it leaves the
/// repository.
fn resolve(dir: &Path, relative: &str) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    for component in dir.join(relative).components() {
        match component {
            Component::ParentDir => {
                if !path.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => path.push(other),
        }
    }
    Some(path)
}

#[test]
fn internal_links_and_anchors_resolve() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in markdown() {
        let dir = Path::new(&file)
            .parent()
            .unwrap_or(Path::new(""))
            .to_owned();
        for (line, dest) in links(&read(&file)) {
            if dest.contains("://") || dest.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = dest.split_once('#').unwrap_or((&dest, ""));
            let target = if path.is_empty() {
                Some(PathBuf::from(&file))
            } else {
                resolve(&dir, path)
            };
            let Some(target) = target else {
                broken.push(format!("{file}:{line}: {dest} leaves the repository"));
                continue;
            };
            if !root().join(&target).exists() {
                broken.push(format!("{file}:{line}: {dest}: no {}", target.display()));
                continue;
            }
            let is_markdown = target.extension().is_some_and(|e| e == "md");
            if !anchor.is_empty() && is_markdown {
                let known = anchors(&read(&target.to_string_lossy()));
                if !known.contains(anchor) {
                    broken.push(format!(
                        "{file}:{line}: {dest}: {} has no heading #{anchor}",
                        target.display()
                    ));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} internal links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let text = "# Reconciliation: an unknown charge or refund\n\n## `make run`, twice\n\n\
                ## Twice\n\n## Twice\n\n```\n# not a heading\n```\n";
    let found = anchors(text);
    let expected: BTreeSet<String> = [
        "reconciliation-an-unknown-charge-or-refund",
        "make-run-twice",
        "twice",
        "twice-1",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(found, expected);
}

#[test]
fn a_link_out_of_the_repository_is_caught() {
    assert_eq!(resolve(Path::new("docs"), "../../shared/DESIGN.md"), None);
    assert_eq!(
        resolve(Path::new("docs"), "../README.md"),
        Some(PathBuf::from("README.md"))
    );
    let found = links("see [the design](../x.md#top) and `[not](a-link.md)`\n");
    assert_eq!(found, vec![(1, "../x.md#top".to_owned())]);
}
