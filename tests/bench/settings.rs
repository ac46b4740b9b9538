//! Every knob of the bench: an environment variable with a default, read
//! once at start and listed with this run's value in the markdown, so a
//! figure is never separated from its settings.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use payments_tests::Backend;

/// The pool the `slow` scenario runs with, whatever `BENCH_POOL` says: the
/// incident it reproduces had exactly 10 connections.
pub const SLOW_POOL: u64 = 10;

/// The scenarios, in the order they run on each backend.
const SCENARIOS: &str =
    "pgbench,ceiling,new,health,replay,cache,storm,refund,capture,list,slow,prune";

/// The scenarios MariaDB runs: the hot path, new and replayed.
pub const MYSQL_SCENARIOS: [&str; 3] = ["new", "health", "replay"];

/// One knob as the markdown lists it.
#[derive(Debug, Clone)]
pub struct Knob {
    pub name: &'static str,
    pub default: &'static str,
    pub value: String,
    pub doc: &'static str,
}

/// Declares [`Settings`], a field per knob: its type, how it is parsed, its
/// variable, default and what it sets, in the order the markdown lists them.
macro_rules! knobs {
    ($($field:ident: $type:ty = $parse:ident($name:literal, $default:expr), $doc:literal;)*) => {
        #[derive(Debug, Clone)]
        pub struct Settings {
            $(pub $field: $type,)*
            pub knobs: Vec<Knob>,
        }

        impl Settings {
            pub fn from_env() -> Result<Self> {
                let mut knobs = Vec::new();
                $(let $field = read(&mut knobs, $name, $default, $doc, $parse)?;)*
                Ok(Self { $($field,)* knobs })
            }
        }
    };
}

knobs! {
    backends: Vec<Backend> = backends("BENCH_BACKENDS", "sqlite,postgres,mysql"), "backends, comma-separated (`mysql`: the throwaway MariaDB, `new`, `health` and `replay` only)";
    scenarios: BTreeSet<String> = scenarios("BENCH_SCENARIOS", SCENARIOS), "scenarios to run, comma-separated";
    new_requests: u64 = count("BENCH_NEW_REQUESTS", "20000"), "`new`: charges";
    concurrency: u64 = count("BENCH_CONCURRENCY", "16"), "`new` (and `prune`) concurrency; pgbench clients";
    pool: u64 = count("BENCH_POOL", "10"), "the API's pool size (`slow` always uses 10)";
    sqlite_write_batch: u64 = count("BENCH_SQLITE_WRITE_BATCH", "64"), "the API's `SQLITE_WRITE_BATCH` (group commit; 1: off)";
    replay_cache_mb: u64 = number("BENCH_REPLAY_CACHE_MB", "32"), "the API's `REPLAY_CACHE_MB` (the replay cache; 0: off)";
    rate_limit_per_minute: u64 = number("BENCH_RATE_LIMIT_PER_MINUTE", "100000000"), "the API's `RATE_LIMIT_PER_MINUTE`, and its `RATE_LIMIT_BURST` too: on, and too high to refuse any of the load, so its cost is in the figures (0: off)";
    ceiling_charges: u64 = count("BENCH_CEILING_CHARGES", "20000"), "`ceiling` (SQLite): charges claimed and finished by the one-writer loop";
    health_requests: u64 = count("BENCH_HEALTH_REQUESTS", "100000"), "`health`: reads of `/healthz`, at `replay`'s concurrency";
    cache_keys: u64 = count("BENCH_CACHE_KEYS", "50000"), "`cache` (PostgreSQL): keys charged, then each replayed twice, more than the default replay cache holds";
    replay_keys: u64 = count("BENCH_REPLAY_KEYS", "100"), "`replay`: keys";
    replay_requests: u64 = count("BENCH_REPLAY_REQUESTS", "100000"), "`replay`: requests";
    replay_concurrency: u64 = count("BENCH_REPLAY_CONCURRENCY", "32"), "`replay`: concurrency";
    cpu_runs: u64 = count("BENCH_CPU_RUNS", "3"), "every counted scenario (`new`, `health`, `replay`, `refund`, `capture`, both `list` pages): runs of it on the same API; the CPU per operation is each process's median over them, the tables the last run's";
    warmup: u64 = number("BENCH_WARMUP", "1000"), "`new` and `replay`: operations of the same scenario run first on the same API, measured nowhere, so that the figures (and the CPU per operation) are a warm server's (0: none)";
    storm_keys: u64 = count("BENCH_STORM_KEYS", "50"), "`storm`: keys";
    storm_per_key: u64 = count("BENCH_STORM_PER_KEY", "100"), "`storm`: concurrent requests per key";
    storm_concurrency: u64 = count("BENCH_STORM_CONCURRENCY", "2"), "`storm`: keys stormed at once";
    refund_charges: u64 = count("BENCH_REFUND_CHARGES", "1000"), "`refund`: charges made, then refunded";
    refund_per_charge: u64 = count("BENCH_REFUND_PER_CHARGE", "2"), "`refund`: refunds of each charge";
    capture_holds: u64 = count("BENCH_CAPTURE_HOLDS", "1000"), "`capture`: holds authorized, then each captured in full";
    list_rows: u64 = count("BENCH_LIST_ROWS", "1000000"), "`list`: charges seeded for the customer listed";
    list_requests: u64 = count("BENCH_LIST_REQUESTS", "5000"), "`list`: reads of each page (the first, and a deep one)";
    slow_in_flight: u64 = count("BENCH_SLOW_IN_FLIGHT", "1000"), "`slow`: charges in flight at once";
    slow_latency: Duration = duration("BENCH_SLOW_LATENCY", "18s"), "`slow`: the provider's latency";
    slow_timeout: Duration = duration("BENCH_SLOW_TIMEOUT", "10s"), "`slow`: the client's per-attempt timeout (then it retries the same key)";
    slow_probe_concurrency: u64 = count("BENCH_SLOW_PROBE_CONCURRENCY", "4"), "`slow`: probes replaying and reading completed charges";
    slow_probe_keys: u64 = count("BENCH_SLOW_PROBE_KEYS", "20"), "`slow`: completed keys probed";
    slow_probe_interval: Duration = duration("BENCH_SLOW_PROBE_INTERVAL", "10ms"), "`slow`: pause between a probe's rounds";
    prune_rows: u64 = count("BENCH_PRUNE_ROWS", "1000000"), "`prune`: expired records seeded";
    prune_seconds: Duration = duration("BENCH_PRUNE_SECONDS", "5s"), "`prune`: length of each `new` run (without, then with the pruner); at most the pruner's time, so the pruner covers the run";
    pgbench_seconds: u64 = count("BENCH_PGBENCH_SECONDS", "20"), "pgbench ceiling: seconds (`-T`)";
    run_cap: Duration = duration("BENCH_RUN_CAP", "300s"), "hard cap on one load run (`slow`: latency x 2 + 60 s)";
    webhook_endpoints: u64 = number("BENCH_WEBHOOK_ENDPOINTS", "1"), "webhook endpoints configured (each a `payments-receiver`), delivered to by a `payments-jobs deliver` beside the API while its scenarios run, so the outbox's cost is in the figures (0: none)";
    log_level: String = text("BENCH_RUST_LOG", "info"), "the API's RUST_LOG (`info` as shipped: per-request lines to a file)";
    out: String = text("BENCH_OUT", "docs/benchmarks.md"), "the markdown written (relative to the workspace)";
}

/// Reads a knob (its default when unset or blank), records it for the
/// markdown and parses it.
fn read<T>(
    knobs: &mut Vec<Knob>,
    name: &'static str,
    default: &'static str,
    doc: &'static str,
    parse: fn(&str) -> Result<T>,
) -> Result<T> {
    let set = std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let value = set.map_or(default.into(), |v| v.trim().to_owned());
    let parsed = parse(&value).with_context(|| format!("{name}={value:?}"));
    knobs.push(Knob {
        name,
        default,
        value,
        doc,
    });
    parsed
}

/// Counts, sizes and seconds: at least 1, as `payments-load` requires.
fn count(value: &str) -> Result<u64> {
    let n = value.replace('_', "").parse::<u64>();
    let n = n.context("not a whole number")?;
    ensure!(n > 0, "must be at least 1");
    Ok(n)
}

/// A size that may be 0 (a feature turned off).
fn number(value: &str) -> Result<u64> {
    value
        .replace('_', "")
        .parse::<u64>()
        .context("not a whole number")
}

fn duration(value: &str) -> Result<Duration> {
    humantime::parse_duration(value).context("not a duration (e.g. 1500ms, 18s, 2m)")
}

fn text(value: &str) -> Result<String> {
    Ok(value.to_owned())
}

fn list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn backends(value: &str) -> Result<Vec<Backend>> {
    let known = [Backend::Sqlite, Backend::Postgres, Backend::Mysql];
    if let Some(other) = list(value).find(|n| !known.iter().any(|b| b.name() == *n)) {
        bail!("unknown backend {other:?} (known: sqlite, postgres, mysql)");
    }
    let named = |b: &Backend| list(value).any(|n| n == b.name());
    let named: Vec<Backend> = known.into_iter().filter(named).collect();
    ensure!(!named.is_empty(), "names no backend");
    Ok(named)
}

fn scenarios(value: &str) -> Result<BTreeSet<String>> {
    if let Some(other) = list(value).find(|s| !list(SCENARIOS).any(|known| known == *s)) {
        bail!("unknown scenario {other:?} (known: {SCENARIOS})");
    }
    Ok(list(value).map(str::to_owned).collect())
}

impl Settings {
    pub fn runs(&self, scenario: &str) -> bool {
        self.scenarios.contains(scenario)
    }

    /// Whether `scenario` runs on `backend`: `ceiling` on SQLite,
    /// `pgbench` and `cache` on PostgreSQL, MariaDB only the hot path.
    pub fn runs_on(&self, scenario: &str, backend: Backend) -> bool {
        let on = match scenario {
            "ceiling" => backend == Backend::Sqlite,
            "pgbench" | "cache" => backend == Backend::Postgres,
            _ => backend != Backend::Mysql || MYSQL_SCENARIOS.contains(&scenario),
        };
        on && self.runs(scenario)
    }

    /// Knobs whose value is not the default, as `NAME=value`, but for where
    /// the markdown goes (not how big the runs are).
    pub fn changed(&self) -> Vec<String> {
        let changed = self.knobs.iter().filter(|k| k.value != k.default);
        let sized = changed.filter(|k| k.name != "BENCH_OUT");
        sized.map(|k| format!("{}={}", k.name, k.value)).collect()
    }
}
