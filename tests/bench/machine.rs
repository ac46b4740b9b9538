//! What the figures were measured on, best effort (a fact that cannot be
//! read says so); and where a run's CPU went ([`Snapshot`]): user + system
//! time of the API, the sandbox, the load generator (this process) and the
//! database server's processes (PostgreSQL's, MariaDB's), per charge. On this machine they all share
//! the same cores, which explains the ratio to the pgbench ceiling.

use std::path::Path;
use std::process::Command;

/// The machine's facts as the markdown lists them, `commit` and `date` last.
pub fn facts(
    root: &Path,
    postgres: String,
    mariadb: String,
    sqlite: String,
) -> Vec<(&'static str, String)> {
    let read = |path| std::fs::read_to_string(path).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = |key: &str| {
        let fields = cpuinfo.lines().filter_map(|line| line.split_once(':'));
        let values = fields.filter(|(k, _)| k.trim() == key);
        values.map(|(_, v)| v.trim().to_owned()).collect::<Vec<_>>()
    };
    let model = cpu("model name").into_iter().next().unwrap_or_default();
    let memory = proc_kb("/proc/meminfo", "MemTotal:");
    let memory = memory.map(|kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0));
    let loadavg = read("/proc/loadavg");
    let load: Vec<&str> = loadavg.split_whitespace().take(3).collect();
    let (now, load) = (chrono::Utc::now(), load.join(" "));
    // A command line's output, if it succeeded.
    let run = |command: &str| {
        let mut words = command.split(' ');
        let mut command = Command::new(words.next()?);
        let out = command.args(words).current_dir(root).output();
        let out = out.ok().filter(|out| out.status.success())?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    // `-dirty` when tracked files differ from the commit (other than the
    // markdown the bench itself rewrites).
    let status = "git status --porcelain --untracked-files=no -- . :(exclude)docs/benchmarks.md";
    let dirty = run(status).filter(|s| !s.is_empty()).map(|_| "-dirty");
    let commit = run("git rev-parse --short HEAD").map(|c| c + dirty.unwrap_or_default());
    let facts = [
        ("CPU", Some(format!("{} x {model}", cpu("processor").len()))),
        ("memory", memory),
        ("kernel", run("uname -r")),
        // Other work on the machine skews every figure.
        ("load average at start", Some(load)),
        ("rustc", run("rustc --version")),
        ("PostgreSQL", Some(postgres)),
        ("MariaDB", Some(mariadb)),
        ("SQLite", Some(sqlite)),
        ("commit", commit),
        ("date", Some(now.format("%Y-%m-%d %H:%M UTC").to_string())),
    ];
    let unknown = |(name, fact): (_, Option<_>)| (name, fact.unwrap_or("unknown".into()));
    facts.map(unknown).to_vec()
}

/// The `key` line of a `/proc` file that counts in kB (`/proc/meminfo`,
/// `/proc/<pid>/status`), kB.
pub fn proc_kb(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let kb = text.lines().find_map(|line| line.strip_prefix(key));
    kb?.trim().trim_end_matches(" kB").parse().ok()
}

/// Linux reports `/proc/<pid>/stat` times in USER_HZ, 100 per second on
/// every architecture it supports.
const TICKS_PER_SEC: f64 = 100.0;

/// CPU ticks so far: the API, the sandbox, this process (the load
/// generator), and every database server process on the machine: named
/// `postgres`, `mariadbd` or `mysqld` (SQLite runs inside the API).
#[derive(Debug, Clone, Copy)]
pub struct Snapshot([u64; 4]);

impl Snapshot {
    pub fn take(api: u32, sandbox: u32) -> Self {
        let [api, sandbox] = [api, sandbox].map(|pid| ticks(&pid.to_string()));
        let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
        let pids = entries.filter_map(|entry| entry.file_name().into_string().ok());
        let postgres = pids.filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"));
            comm.is_ok_and(|comm| matches!(comm.trim(), "postgres" | "mariadbd" | "mysqld"))
        });
        let postgres = postgres.map(|pid| ticks(&pid)).sum();
        Self([api, sandbox, ticks("self"), postgres])
    }

    /// CPU time per charge from `self` to `later`, µs, by process in the
    /// same order.
    pub fn per_charge(&self, later: &Snapshot, charges: u64) -> Option<[f64; 4]> {
        let us = |i: usize| {
            let spent = later.0[i].saturating_sub(self.0[i]) as f64;
            spent * 1e6 / TICKS_PER_SEC / charges as f64
        };
        (charges > 0).then(|| std::array::from_fn(us))
    }
}

/// utime + stime of `/proc/<pid>/stat` (fields 14 and 15; the command name
/// in parentheses may hold spaces, so count from the closing one), 0 when
/// it cannot be read.
fn ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields = stat.rsplit_once(')').map_or("", |(_, fields)| fields);
    let mut fields = fields.split_whitespace().skip(11);
    let mut next = || fields.next().map_or(0, |f| f.parse().unwrap_or(0));
    next() + next()
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
