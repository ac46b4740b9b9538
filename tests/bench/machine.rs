//! What the figures were measured on, best effort (a fact that cannot be
//! read says so); and where a run's CPU went ([`Snapshot`], [`CpuPerOp`]):
//! user + system time of the API, the database server (the bench's own:
//! its main process and its children, not every `postgres` on the machine),
//! the sandbox and the load generator (this process), per operation of a
//! run's measured part. On this machine they all share the same cores,
//! which explains the ratio to the pgbench ceiling; and CPU time per
//! operation, unlike throughput, does not depend on how much of the cores
//! other work on the machine left the bench.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde::Serialize;

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
/// every architecture it supports: a reading is good to 10 ms.
const TICKS_PER_SEC: f64 = 100.0;

/// A figure for each process the bench counts CPU for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PerProcess<T> {
    /// `payments-api` (SQLite runs inside it).
    pub api: T,
    /// The database server: its main process and its children (PostgreSQL's
    /// backends, alive or exited); 0 on SQLite.
    pub database: T,
    /// `payments-sandbox`, the provider.
    pub sandbox: T,
    /// The load generator: this process.
    pub load: T,
}

impl PerProcess<f64> {
    pub fn total(&self) -> f64 {
        self.api + self.database + self.sandbox + self.load
    }
}

/// The processes whose CPU time a run is charged with, by pid.
#[derive(Debug, Clone, Copy)]
pub struct Processes {
    pub api: u32,
    pub sandbox: u32,
    /// The database server's main process (PostgreSQL's postmaster,
    /// `mariadbd`): `None` on SQLite.
    pub database: Option<u32>,
}

/// User + system CPU ticks so far of each of the [`Processes`], and when
/// they were read.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    ticks: PerProcess<u64>,
    at: Instant,
}

impl Snapshot {
    pub fn take(processes: &Processes) -> Self {
        let table = ProcessTable::read();
        let ticks = PerProcess {
            api: table.own(processes.api),
            database: processes.database.map_or(0, |pid| table.tree(pid)),
            sandbox: table.own(processes.sandbox),
            load: table.own(std::process::id()),
        };
        Self {
            ticks,
            at: Instant::now(),
        }
    }

    /// What each process spent from `self` to `later`, per operation, when
    /// `operations` ran between the two.
    pub fn per_op(&self, later: &Snapshot, operations: u64) -> Option<CpuPerOp> {
        let us = |earlier: u64, later: u64| {
            let spent = later.saturating_sub(earlier) as f64;
            spent * 1e6 / TICKS_PER_SEC / operations as f64
        };
        let (a, b) = (self.ticks, later.ticks);
        (operations > 0).then(|| CpuPerOp {
            operations,
            runs: 1,
            secs: later.at.duration_since(self.at).as_secs_f64(),
            us: PerProcess {
                api: us(a.api, b.api),
                database: us(a.database, b.database),
                sandbox: us(a.sandbox, b.sandbox),
                load: us(a.load, b.load),
            },
        })
    }
}

/// CPU time (user + system) per operation over a run's measured part, as
/// the bench reports it and adds to the run's JSON (`cpu`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuPerOp {
    /// Operations between the two snapshots (charges, replays).
    pub operations: u64,
    /// Wall time between the two snapshots.
    pub secs: f64,
    /// µs per operation, by process.
    #[serde(rename = "us_per_op")]
    pub us: PerProcess<f64>,
    /// The runs it is the median of (1 for one run's own figure).
    pub runs: usize,
}

impl CpuPerOp {
    /// Each process's median over `runs` (the upper one of an even count),
    /// and the median run's operations and time; `None` for no runs.
    pub fn median(runs: &[CpuPerOp]) -> Option<CpuPerOp> {
        let median = |figure: fn(&CpuPerOp) -> f64| {
            let mut figures: Vec<f64> = runs.iter().map(figure).collect();
            figures.sort_by(f64::total_cmp);
            figures[figures.len() / 2]
        };
        let mut by_secs: Vec<&CpuPerOp> = runs.iter().collect();
        by_secs.sort_by(|a, b| a.secs.total_cmp(&b.secs));
        let middle = by_secs.get(runs.len() / 2)?;
        Some(CpuPerOp {
            operations: middle.operations,
            secs: middle.secs,
            us: PerProcess {
                api: median(|c| c.us.api),
                database: median(|c| c.us.database),
                sandbox: median(|c| c.us.sandbox),
                load: median(|c| c.us.load),
            },
            runs: runs.len(),
        })
    }
}

/// Each live process's parent and CPU ticks, read from `/proc/<pid>/stat`
/// at one moment (a process that cannot be read counts 0).
struct ProcessTable(HashMap<u32, Stat>);

#[derive(Debug, Clone, Copy, Default)]
struct Stat {
    ppid: u32,
    /// utime + stime: the process's own, all its threads.
    own: u64,
    /// cutime + cstime: its children's that exited and were waited for.
    reaped: u64,
}

impl ProcessTable {
    fn read() -> Self {
        let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
        let pids = entries.filter_map(|entry| entry.file_name().to_str()?.parse().ok());
        let stats = pids.filter_map(|pid: u32| Some((pid, stat(&pid.to_string())?)));
        Self(stats.collect())
    }

    fn own(&self, pid: u32) -> u64 {
        self.0.get(&pid).map_or(0, |s| s.own)
    }

    /// `pid`, its children that exited and its live descendants: the whole
    /// server, however many backends came and went (a child's time moves to
    /// its parent's `reaped` when it exits, so it is counted once either way).
    fn tree(&self, pid: u32) -> u64 {
        let Some(root) = self.0.get(&pid) else {
            return 0;
        };
        let children = self.0.iter().filter(|(_, s)| s.ppid == pid);
        let children: u64 = children.map(|(child, _)| self.tree(*child)).sum();
        root.own + root.reaped + children
    }
}

/// `/proc/<pid>/stat`'s ppid (field 4), utime + stime (14, 15) and cutime +
/// cstime (16, 17); the command name in parentheses may hold spaces, so
/// fields are counted from the closing one.
fn stat(pid: &str) -> Option<Stat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, fields) = stat.rsplit_once(')')?;
    let fields: Vec<u64> = fields
        .split_whitespace()
        .skip(1)
        .take(14)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let field = |n: usize| fields.get(n - 4).copied().unwrap_or(0);
    Some(Stat {
        ppid: u32::try_from(field(4)).unwrap_or(0),
        own: field(14) + field(15),
        reaped: field(16) + field(17),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_each_process_own() {
        let run = |api, database, secs| CpuPerOp {
            operations: 100,
            secs,
            us: PerProcess {
                api,
                database,
                sandbox: 1.0,
                load: 2.0,
            },
            runs: 1,
        };
        let runs = [
            run(500.0, 900.0, 3.0),
            run(400.0, 1100.0, 1.0),
            run(450.0, 1000.0, 2.0),
        ];
        let median = CpuPerOp::median(&runs).expect("three runs have a median");
        assert_eq!(median.us.api, 450.0);
        assert_eq!(median.us.database, 1000.0);
        assert_eq!((median.secs, median.runs), (2.0, 3));
        assert_eq!(CpuPerOp::median(&[]), None);
    }

    #[test]
    fn this_process_has_a_cpu_time() {
        // Spend some CPU so the count is not zero at 100 Hz.
        let spin = |x: u64, i: u64| x.wrapping_add(std::hint::black_box(i * i));
        let x = (0..50_000_000u64).fold(0u64, spin);
        assert!(x > 0);
        let me = stat("self").expect("this process's stat");
        assert!(me.own > 0);
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
        assert!(stat("not-a-pid").is_none());
    }

    #[test]
    fn a_tree_keeps_the_time_of_its_children_that_exited() {
        let me = std::process::id();
        let before = ProcessTable::read();
        // A child that spends CPU, then is waited for.
        let busy = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";
        let status = Command::new("sh").args(["-c", busy]).status();
        let status = status.expect("sh runs");
        assert!(status.success());
        let after = ProcessTable::read();
        let reaped = after.0[&me].reaped - before.0[&me].reaped;
        assert!(reaped > 0, "the child's time is its parent's now");
        assert!(after.tree(me) >= before.tree(me) + reaped);
        assert_eq!(after.tree(u32::MAX), 0);
    }
}
