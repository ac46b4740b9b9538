//! What a bench run measured, kept whole for `target/bench/summary.json` and
//! the markdown: the machine, the settings, per backend each scenario's
//! load [`Report`] plus what the bench measured around it, and the failures.

use payments_loadtest::load::Report;
use serde::Serialize;

use crate::machine::{Machine, PerCharge};
use crate::pgbench::Pgbench;
use crate::settings::Knob;

#[derive(Debug, Serialize)]
pub struct Results {
    pub machine: Machine,
    pub knobs: Vec<Knob>,
    /// Knobs away from their defaults (`NAME=value`).
    pub changed: Vec<String>,
    pub api: ApiSetup,
    /// Where PostgreSQL came from.
    pub postgres_server: String,
    pub pgbench: Option<Pgbench>,
    pub backends: Vec<BackendResults>,
    /// Why the bench exits non-zero: incorrect reports, failed processes.
    pub failures: Vec<String>,
    pub elapsed_secs: f64,
}

/// How the API was run.
#[derive(Debug, Clone, Serialize)]
pub struct ApiSetup {
    pub pool: u32,
    pub slow_pool: u32,
    pub gateway_timeout: &'static str,
    pub lease: &'static str,
    pub log_level: String,
}

#[derive(Debug, Default, Serialize)]
pub struct BackendResults {
    /// `sqlite`, `postgres`.
    pub backend: &'static str,
    pub database: String,
    pub new: Option<Report>,
    /// CPU per charge during `new`, by process.
    pub new_cpu: Option<PerCharge>,
    pub replay: Option<Report>,
    pub storm: Option<Storm>,
    pub slow: Option<Slow>,
    pub prune: Option<Prune>,
    /// PostgreSQL only: pgbench and `new` again with the commit flush off.
    pub fsync_off: Option<FsyncOff>,
}

/// The ceiling and `new` on the same cluster with `fsync`,
/// `synchronous_commit` and `full_page_writes` off (the tests' settings):
/// the database then costs only CPU, so the ratio shows the server's own
/// cost per charge at its starkest.
#[derive(Debug, Serialize)]
pub struct FsyncOff {
    pub pgbench: Pgbench,
    pub new: Report,
}

#[derive(Debug, Serialize)]
pub struct Storm {
    pub report: Report,
    /// `POST /v1/charges` the sandbox received during the run (`/_sandbox/stats`
    /// after a reset): every provider call, retries and re-drives included.
    pub provider_requests: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Slow {
    pub report: Report,
    /// `VmHWM` of the API (fresh for this scenario) after the run, kB.
    pub vm_hwm_kb: Option<u64>,
    /// The highest `VmRSS` sampled every 250 ms during the run, kB.
    pub rss_max_kb: Option<u64>,
    /// Log lines of the API naming a pool acquire timeout.
    pub pool_timeouts: u64,
    /// Log lines of the API at ERROR level.
    pub error_lines: u64,
    pub provider_requests: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Prune {
    pub seeded: u64,
    pub seed_secs: f64,
    pub baseline: Report,
    pub with_prune: Report,
    /// From spawning `payments-jobs prune --once` to its exit.
    pub prune_wall_secs: f64,
    pub prune_ok: bool,
    /// From the pruner's `prune pass` log line.
    pub deleted: Option<u64>,
    pub batches: Option<u64>,
    pub prune_elapsed_ms: Option<u64>,
    /// The pruner was still running when the `new` run ended.
    pub overlapped_whole_run: bool,
    /// Seconds of the `new` run during which the pruner ran.
    pub overlap_secs: f64,
    pub run_secs: f64,
    /// Expired complete records left after the pass.
    pub remaining: Option<u64>,
}

/// p99 of a stream, µs.
pub fn p99(report: &Report, name: &str) -> Option<u64> {
    report.stream(name)?.latency_us.map(|l| l.p99)
}

/// Answers with a 5xx status on every stream of a report.
pub fn server_errors(report: &Report) -> u64 {
    report
        .streams
        .iter()
        .flat_map(|s| s.statuses.iter())
        .filter(|(status, _)| **status >= 500)
        .map(|(_, n)| *n)
        .sum()
}
