//! What the figures were measured on, best effort (a fact that cannot be
//! read says so); and where a run's CPU went ([`Snapshot`]): user + system
//! time of the API, the sandbox, the load generator (this process) and the
//! PostgreSQL server processes, per charge. On this machine they all share
//! the same cores, which explains the ratio to the pgbench ceiling.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

/// The machine's facts as the markdown lists them, `commit` and `date` last.
pub fn facts(root: &Path, postgres: String, sqlite: String) -> Vec<(&'static str, String)> {
    let read = |path| std::fs::read_to_string(path).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = |key: &str| {
        let fields = cpuinfo.lines().filter_map(|line| line.split_once(':'));
        let values = fields.filter(|(k, _)| k.trim() == key);
        values.map(|(_, v)| v.trim().to_owned()).collect::<Vec<_>>()
    };
    let model = cpu("model name").into_iter().next().unwrap_or_default();
    let meminfo = read("/proc/meminfo");
    let mem_kb = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"));
    let mem_kb = mem_kb.and_then(|kb| kb.trim().trim_end_matches(" kB").parse::<f64>().ok());
    let memory = mem_kb.map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0));
    let loadavg = read("/proc/loadavg");
    let load: Vec<&str> = loadavg.split_whitespace().take(3).collect();
    let (now, load) = (chrono::Utc::now(), load.join(" "));
    let run = |program: &str, args: &[&str]| {
        let out = Command::new(program).args(args).current_dir(root).output();
        let out = out.ok().filter(|out| out.status.success())?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    // `-dirty` when tracked files differ from the commit (other than the
    // markdown the bench itself rewrites).
    let exclude = ":(exclude)docs/benchmarks.md";
    let status = [
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        exclude,
    ];
    let dirty = if run("git", &status).is_some_and(|s| !s.is_empty()) {
        "-dirty"
    } else {
        ""
    };
    let commit = run("git", &["rev-parse", "--short", "HEAD"]).map(|c| c + dirty);
    let facts = [
        ("CPU", Some(format!("{} x {model}", cpu("processor").len()))),
        ("memory", memory),
        ("kernel", run("uname", &["-r"])),
        // Other work on the machine skews every figure.
        ("load average at start", Some(load)),
        ("rustc", run("rustc", &["--version"])),
        ("PostgreSQL", Some(postgres)),
        ("SQLite", Some(sqlite)),
        ("commit", commit),
        ("date", Some(now.format("%Y-%m-%d %H:%M UTC").to_string())),
    ];
    let unknown = |(name, fact): (_, Option<_>)| (name, fact.unwrap_or("unknown".into()));
    facts.map(unknown).to_vec()
}

/// Linux reports `/proc/<pid>/stat` times in USER_HZ, 100 per second on
/// every architecture it supports.
const TICKS_PER_SEC: f64 = 100.0;

/// CPU ticks so far: the API, the sandbox, this process, PostgreSQL.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot([u64; 4]);

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
        let [api, sandbox] = [api, sandbox].map(|pid| ticks(&pid.to_string()));
        Self([api, sandbox, ticks("self"), postgres_ticks()])
    }

    /// From `self` to `later`, over `charges`.
    pub fn per_charge(&self, later: &Snapshot, charges: u64) -> Option<PerCharge> {
        let us = |i: usize| {
            let spent = later.0[i].saturating_sub(self.0[i]) as f64;
            spent * 1e6 / TICKS_PER_SEC / charges as f64
        };
        (charges > 0).then(|| PerCharge {
            api_us: us(0),
            sandbox_us: us(1),
            load_us: us(2),
            postgres_us: us(3),
            charges,
        })
    }
}

/// utime + stime of `/proc/<pid>/stat` (fields 14 and 15; the command name
/// in parentheses may hold spaces, so count from the closing one), 0 when
/// it cannot be read.
fn ticks(pid: &str) -> u64 {
    stat_ticks(pid).unwrap_or(0)
}

fn stat_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let mut next = || fields.next()?.parse::<u64>().ok();
    Some(next()? + next()?)
}

fn postgres_ticks() -> u64 {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    let pids = entries.filter_map(|entry| entry.file_name().into_string().ok());
    let postgres = pids.filter(|pid| {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"));
        comm.is_ok_and(|comm| comm.trim() == "postgres")
    });
    postgres.map(|pid| ticks(&pid)).sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_a_cpu_time() {
        // Spend some CPU so the count is not zero at 100 Hz.
        let x = (0..50_000_000u64).fold(0u64, |x, i| x.wrapping_add(i * i));
        assert!(x > 0);
        assert!(super::ticks("self") > 0);
        assert_eq!(super::ticks("not-a-pid"), 0);
    }
}
