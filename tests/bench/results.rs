//! What a bench run measured on each backend, for the markdown: each
//! scenario's load [`Report`] plus what the bench measured around it.

use payments_loadtest::load::Report;

use crate::database::{Ceiling, Pgbench};
use crate::machine::CpuPerOp;

#[derive(Debug, Default)]
pub struct BackendResults {
    /// `sqlite`, `postgres`.
    pub backend: &'static str,
    /// PostgreSQL only: the ceiling, run just before `new`.
    pub pgbench: Option<Pgbench>,
    /// SQLite only: the one-writer ceiling, run just before `new`.
    pub ceiling: Option<Ceiling>,
    /// SQLite: during `new`, how many committed transactions carried each
    /// number of claims and finishes (`le` bucket bound, batches).
    pub batches: Option<Vec<(String, u64)>>,
    /// `GET /healthz` on the same API, at `replay`'s concurrency.
    pub health: Option<Report>,
    /// CPU per `/healthz` read, by process: the floor a request costs.
    pub health_cpu: Option<CpuPerOp>,
    pub new: Option<Report>,
    /// CPU per charge over `new`'s charges, by process.
    pub new_cpu: Option<CpuPerOp>,
    pub replay: Option<Report>,
    /// CPU per re-send over `replay`'s re-sends (not its setup), by process.
    pub replay_cpu: Option<CpuPerOp>,
    /// The replay cache during `replay`: hits and misses.
    pub replay_cache: Option<(u64, u64)>,
    /// PostgreSQL only: more keys than the cache holds, each replayed twice.
    pub cache: Option<CacheFull>,
    pub storm: Option<Report>,
    /// Charge requests the sandbox received during `storm` (after a
    /// reset): every provider call, retries and re-drives included.
    pub storm_provider_requests: Option<u64>,
    pub refund: Option<Report>,
    /// CPU per refund over `refund`'s refunds (not the charges made first).
    pub refund_cpu: Option<CpuPerOp>,
    pub capture: Option<Report>,
    /// CPU per capture over `capture`'s captures (not the holds made first).
    pub capture_cpu: Option<CpuPerOp>,
    /// `list`: the first page and a deep one, of `BENCH_LIST_ROWS` more.
    pub list: Option<(Report, Report)>,
    /// CPU per read of the first page and of the deep one.
    pub list_cpu: (Option<CpuPerOp>, Option<CpuPerOp>),
    pub slow: Option<Slow>,
    pub prune: Option<Prune>,
}

/// The replay cache filled past its size.
#[derive(Debug)]
pub struct CacheFull {
    pub report: Report,
    /// Hits and misses during the run.
    pub hits: u64,
    pub misses: u64,
    /// The API's RSS after the run (`VmRSS`) and its peak (`VmHWM`), kB.
    pub rss_kb: Option<u64>,
    pub hwm_kb: Option<u64>,
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
