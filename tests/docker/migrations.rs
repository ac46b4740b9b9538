//! A migration that has landed is never edited: a database that applied it
//! keeps its checksum, and sqlx refuses to start on it once the file
//! differs ("migration N was previously applied but has been modified").
//! `migrations/landed.sha256` holds every migration file's SHA-256; a new
//! migration gets its line when it is added.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::{read, root};

/// `migrations/landed.sha256`: path -> hex SHA-256.
fn landed() -> BTreeMap<String, String> {
    read("migrations/landed.sha256")
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (sum, path) = line.split_once("  ").unwrap();
            (path.to_owned(), sum.to_owned())
        })
        .collect()
}

#[test]
fn every_migration_is_as_it_landed() {
    let landed = landed();
    let mut files = Vec::new();
    for backend in std::fs::read_dir(root().join("migrations")).unwrap() {
        let backend = backend.unwrap().path();
        if !backend.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&backend).unwrap() {
            let path = file.unwrap().path();
            let relative = path
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            files.push(relative);
        }
    }
    files.sort();
    assert!(files.len() >= 30, "the migrations were found: {files:?}");
    for file in &files {
        let sum = hex::encode(Sha256::digest(read(file).as_bytes()));
        match landed.get(file) {
            None => {
                panic!("{file} is not in migrations/landed.sha256: add `{sum}  {file}` (sha256sum)")
            }
            Some(expected) => assert_eq!(
                expected, &sum,
                "{file} was edited after it landed: a database that applied it would be \
                 refused; put the change in a new migration and restore this one"
            ),
        }
    }
    let gone: Vec<&String> = landed.keys().filter(|f| !files.contains(f)).collect();
    assert!(gone.is_empty(), "landed migrations were removed: {gone:?}");
}
