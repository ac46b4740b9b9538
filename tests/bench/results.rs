//! What a bench run measured on each backend, for the markdown: each
//! scenario's load [`Report`] plus what the bench measured around it.

use payments_loadtest::load::Report;

use crate::database::Pgbench;

#[derive(Debug, Default)]
pub struct BackendResults {
    /// `sqlite`, `postgres`.
    pub backend: &'static str,
    /// PostgreSQL only: the ceiling, run just before `new`.
    pub pgbench: Option<Pgbench>,
    pub new: Option<Report>,
    /// CPU per charge during `new`, µs: the API, the sandbox, the load
    /// generator, PostgreSQL (see [`crate::machine::Snapshot`]).
    pub new_cpu: Option<[f64; 4]>,
    pub replay: Option<Report>,
    pub storm: Option<Report>,
    /// Charge requests the sandbox received during `storm` (after a
    /// reset): every provider call, retries and re-drives included.
    pub storm_provider_requests: Option<u64>,
    pub refund: Option<Report>,
    /// `list`: the first page and a deep one, of `BENCH_LIST_ROWS` more.
    pub list: Option<(Report, Report)>,
    pub slow: Option<Slow>,
    pub prune: Option<Prune>,
}

#[derive(Debug)]
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

#[derive(Debug)]
pub struct Prune {
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
