//! Records the git commit the binaries are built from, for `--version` and
//! `payments_build_info`: `PAYMENTS_GIT_COMMIT` when set (an image built from
//! a tarball without `.git`), else `git rev-parse --short HEAD`, else
//! `unknown` (no git, or not a checkout).
//!
//! Re-runs only when HEAD moves (a commit, a checkout), not on every build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn watch(path: &Path) {
    // A path that does not exist would make cargo re-run this every build.
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PAYMENTS_GIT_COMMIT");
    let commit = std::env::var("PAYMENTS_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PAYMENTS_GIT_COMMIT={}", commit.trim());

    // HEAD (per worktree) names the branch; the branch's ref (loose, or in
    // packed-refs, in the common directory) names the commit.
    let (Some(git_dir), Some(common)) = (
        git(&["rev-parse", "--absolute-git-dir"]),
        git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]),
    ) else {
        return;
    };
    let (git_dir, common) = (PathBuf::from(git_dir), PathBuf::from(common));
    watch(&git_dir.join("HEAD"));
    watch(&common.join("packed-refs"));
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(&common.join(branch));
    }
}
