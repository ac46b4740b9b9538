//! What the figures were measured on: CPU, memory, kernel, toolchain,
//! database versions, the commit, the date, and how busy the machine was.
//! Every fact is best effort: one that cannot be read says so instead of
//! failing the bench.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

const UNKNOWN: &str = "unknown";

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory: String,
    pub kernel: String,
    pub rustc: String,
    pub postgres: String,
    pub sqlite: String,
    pub git: String,
    pub date: String,
    /// `/proc/loadavg` when the bench started: other work on the machine
    /// skews every figure.
    pub load_average: String,
}

impl Machine {
    /// The facts that need no database; `postgres` and `sqlite` are filled
    /// in by the caller.
    pub fn collect(root: &Path) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "model name").then(|| value.trim().to_owned())
            })
            .unwrap_or_else(|| UNKNOWN.to_owned());
        let cpus = cpuinfo
            .lines()
            .filter(|line| {
                line.split(':')
                    .next()
                    .is_some_and(|k| k.trim() == "processor")
            })
            .count();
        Self {
            cpu_model,
            cpus,
            memory: memory(),
            kernel: output("uname", &["-r"], None).unwrap_or_else(|| UNKNOWN.to_owned()),
            rustc: output("rustc", &["--version"], None).unwrap_or_else(|| UNKNOWN.to_owned()),
            postgres: UNKNOWN.to_owned(),
            sqlite: UNKNOWN.to_owned(),
            git: git(root),
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            load_average: std::fs::read_to_string("/proc/loadavg")
                .ok()
                .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|| UNKNOWN.to_owned()),
        }
    }
}

/// `MemTotal` of `/proc/meminfo`, in GiB.
fn memory() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let kb: f64 = info
                .lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some(format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        })
        .unwrap_or_else(|| UNKNOWN.to_owned())
}

/// The short commit, with `-dirty` when tracked files differ from it (other
/// than the markdown the bench itself rewrites).
fn git(root: &Path) -> String {
    let Some(commit) = output("git", &["rev-parse", "--short", "HEAD"], Some(root)) else {
        return UNKNOWN.to_owned();
    };
    let dirty = output(
        "git",
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":(exclude)docs/benchmarks.md",
        ],
        Some(root),
    )
    .is_some_and(|status| !status.is_empty());
    if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    }
}

/// A command's trimmed stdout, if it ran and succeeded.
fn output(program: &str, args: &[&str], dir: Option<&Path>) -> Option<String> {
    let mut command = Command::new(program);
    command.args(args);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let out = command.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
