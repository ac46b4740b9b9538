//! What a bench run measured, whole, for `target/bench/summary.json` and the
//! markdown: per backend each scenario's load [`Report`] plus what the bench
//! measured around it.

use payments_loadtest::load::Report;
use serde::Serialize;

use crate::database::Pgbench;
use crate::machine::PerCharge;
use crate::settings::Knob;

#[derive(Debug, Serialize)]
pub struct Results {
    pub machine: Vec<(&'static str, String)>,
    pub knobs: Vec<Knob>,
    /// Knobs away from their defaults (`NAME=value`).
    pub changed: Vec<String>,
    /// Where PostgreSQL came from.
    pub postgres_server: String,
    pub pgbench: Option<Pgbench>,
    pub backends: Vec<BackendResults>,
    /// Why the bench exits non-zero: incorrect reports, failed processes.
    pub failures: Vec<String>,
    pub elapsed_secs: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct BackendResults {
    /// `sqlite`, `postgres`.
    pub backend: &'static str,
    pub new: Option<Report>,
    /// CPU per charge during `new`, by process.
    pub new_cpu: Option<PerCharge>,
    pub replay: Option<Report>,
    pub storm: Option<Report>,
    /// Charge requests the sandbox received during `storm` (after a
    /// reset): every provider call, retries and re-drives included.
    pub storm_provider_requests: Option<u64>,
    pub slow: Option<Slow>,
    pub prune: Option<Prune>,
    /// PostgreSQL only: the ceiling and `new` again with `fsync`,
    /// `synchronous_commit` and `full_page_writes` off (the tests'
    /// settings), where the database costs only CPU.
    pub fsync_off: Option<(Pgbench, Report)>,
}

#[derive(Debug, Serialize)]
pub struct Slow {
    pub report: Report,
    /// `VmHWM` (peak RSS) of the API, fresh for this scenario, kB.
    pub vm_hwm_kb: Option<u64>,
    /// The API's log lines naming a pool acquire timeout.
    pub pool_timeouts: u64,
    /// The API's log lines at ERROR level.
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
    /// The fields of the pruner's `prune pass` log line (`deleted`,
    /// `batches`, `elapsed_ms`).
    pub pass: serde_json::Value,
    /// Seconds of the `new` run during which the pruner ran, of `run_secs`.
    pub overlap_secs: f64,
    pub run_secs: f64,
    /// Expired complete records left after the pass.
    pub remaining: i64,
}
