//! What the figures were measured on: CPU, memory, kernel, toolchain,
//! database versions, the commit, the date, and how busy the machine was.
//! Every fact is best effort: one that cannot be read says so instead of
//! failing the bench.
//!
//! And where a run's CPU went ([`Snapshot`]): user + system time of the API,
//! the sandbox, the load generator (this process) and the PostgreSQL server
//! processes, read from `/proc` before and after, divided by the charges
//! made. It explains the ratio to the pgbench ceiling: on this machine every
//! one of them shares the same cores.

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
        let read = |path| std::fs::read_to_string(path).unwrap_or_default();
        let (cpuinfo, meminfo, loadavg) = (
            read("/proc/cpuinfo"),
            read("/proc/meminfo"),
            read("/proc/loadavg"),
        );
        let field = |key: &str| {
            let fields = cpuinfo.lines().filter_map(|line| line.split_once(':'));
            fields
                .filter(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().to_owned())
                .collect::<Vec<_>>()
        };
        let mem_kb = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"));
        let mem_kb = mem_kb.and_then(|kb| kb.trim().trim_end_matches(" kB").parse::<f64>().ok());
        let unknown = |fact: Option<String>| fact.unwrap_or_else(|| UNKNOWN.to_owned());
        // The short commit, with `-dirty` when tracked files differ from it
        // (other than the markdown the bench itself rewrites).
        let status = [
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":(exclude)docs/benchmarks.md",
        ];
        let dirty = output("git", &status, root).is_some_and(|status| !status.is_empty());
        let commit = output("git", &["rev-parse", "--short", "HEAD"], root);
        let git = commit.map(|c| if dirty { format!("{c}-dirty") } else { c });
        Self {
            cpu_model: unknown(field("model name").into_iter().next()),
            cpus: field("processor").len(),
            memory: unknown(mem_kb.map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))),
            kernel: unknown(output("uname", &["-r"], root)),
            rustc: unknown(output("rustc", &["--version"], root)),
            postgres: UNKNOWN.to_owned(),
            sqlite: UNKNOWN.to_owned(),
            git: unknown(git),
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            load_average: loadavg
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// A command's trimmed stdout, if it ran and succeeded.
fn output(program: &str, args: &[&str], dir: &Path) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    out.status.success().then_some(stdout)
}

/// Linux reports `/proc/<pid>/stat` times in USER_HZ, 100 per second on
/// every architecture it supports.
const TICKS_PER_SEC: u64 = 100;

/// CPU ticks so far.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    api: u64,
    sandbox: u64,
    load: u64,
    postgres: u64,
}

/// CPU time per charge, µs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PerCharge {
    pub api_us: f64,
    pub sandbox_us: f64,
    pub load_us: f64,
    /// Every process named `postgres` on the machine (SQLite runs inside
    /// the API).
    pub postgres_us: f64,
    pub charges: u64,
}

impl Snapshot {
    pub fn take(api: u32, sandbox: u32) -> Self {
        Self {
            api: ticks(&api.to_string()).unwrap_or(0),
            sandbox: ticks(&sandbox.to_string()).unwrap_or(0),
            load: ticks("self").unwrap_or(0),
            postgres: postgres_ticks(),
        }
    }

    /// From `self` to `later`, over `charges`.
    pub fn per_charge(&self, later: &Snapshot, charges: u64) -> Option<PerCharge> {
        if charges == 0 {
            return None;
        }
        let us = |before: u64, after: u64| {
            after.saturating_sub(before) as f64 * 1e6 / TICKS_PER_SEC as f64 / charges as f64
        };
        Some(PerCharge {
            api_us: us(self.api, later.api),
            sandbox_us: us(self.sandbox, later.sandbox),
            load_us: us(self.load, later.load),
            postgres_us: us(self.postgres, later.postgres),
            charges,
        })
    }
}

/// utime + stime of `/proc/<pid>/stat` (fields 14 and 15; the command name
/// in parentheses may hold spaces, so count from the closing one).
fn ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn postgres_ticks() -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "postgres")
        })
        .filter_map(|pid| ticks(&pid))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_cpu_time() {
        // Spend some CPU so the count is not zero at 100 Hz.
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(ticks("self").is_some_and(|t| t > 0));
        assert_eq!(ticks("not-a-pid"), None);
    }
}
