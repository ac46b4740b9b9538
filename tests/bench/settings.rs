//! Every knob of the bench: an environment variable with a default, read
//! once at start. The knobs are also listed, with this run's values, in the
//! generated markdown, so a figure is never separated from its settings.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;

/// The pool the `slow` scenario runs with, whatever `BENCH_POOL` says: the
/// incident it reproduces had exactly 10 connections.
pub const SLOW_POOL: u32 = 10;

/// The scenarios, in the order they run on each backend.
pub const SCENARIOS: [&str; 7] = [
    "pgbench",
    "new",
    "replay",
    "storm",
    "slow",
    "prune",
    "fsync-off",
];

/// A database backend of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

impl FromStr for Backend {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "sqlite" => Ok(Self::Sqlite),
            "postgres" => Ok(Self::Postgres),
            other => bail!("unknown backend {other:?} (known: sqlite, postgres)"),
        }
    }
}

/// One knob as the markdown lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Knob {
    pub name: &'static str,
    pub default: String,
    pub value: String,
    pub doc: &'static str,
}

/// The bench's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub backends: Vec<Backend>,
    pub scenarios: BTreeSet<String>,
    pub new_requests: u64,
    pub concurrency: u64,
    pub pool: u32,
    pub replay_keys: u64,
    pub replay_requests: u64,
    pub replay_concurrency: u64,
    pub storm_keys: u64,
    pub storm_per_key: u64,
    pub storm_concurrency: u64,
    pub slow_in_flight: u64,
    pub slow_latency: Duration,
    pub slow_timeout: Duration,
    pub slow_probe_concurrency: u64,
    pub slow_probe_keys: u64,
    pub slow_probe_interval: Duration,
    pub prune_rows: u64,
    pub prune_seconds: Duration,
    pub pgbench_seconds: u64,
    pub run_cap: Duration,
    pub log_level: String,
    pub out: PathBuf,
    /// `BENCH_POSTGRES_URL`: an admin URL to use instead of the throwaway
    /// cluster. Never `TEST_POSTGRES_URL`.
    pub postgres_url: Option<String>,
    pub knobs: Vec<Knob>,
}

impl Settings {
    pub fn from_env() -> Result<Self> {
        let mut k = Reader::default();
        let backends = k.text(
            "BENCH_BACKENDS",
            "sqlite,postgres",
            "backends, comma-separated",
        );
        let scenarios = k.text(
            "BENCH_SCENARIOS",
            &SCENARIOS.join(","),
            "scenarios to run, comma-separated",
        );
        let settings = Self {
            backends: list(&backends)
                .map(str::parse)
                .collect::<Result<BTreeSet<Backend>>>()
                .context("BENCH_BACKENDS")?
                .into_iter()
                .collect(),
            scenarios: list(&scenarios)
                .map(|s| {
                    if SCENARIOS.contains(&s) {
                        Ok(s.to_owned())
                    } else {
                        bail!("unknown scenario {s:?} (known: {})", SCENARIOS.join(", "))
                    }
                })
                .collect::<Result<_>>()
                .context("BENCH_SCENARIOS")?,
            new_requests: k.number("BENCH_NEW_REQUESTS", 20_000, "`new`: charges")?,
            concurrency: k.number(
                "BENCH_CONCURRENCY",
                16,
                "`new` (and `prune`) concurrency; pgbench clients",
            )?,
            pool: k.number(
                "BENCH_POOL",
                10,
                "the API's pool size (`slow` always uses 10)",
            )?,
            replay_keys: k.number("BENCH_REPLAY_KEYS", 100, "`replay`: keys")?,
            replay_requests: k.number("BENCH_REPLAY_REQUESTS", 100_000, "`replay`: requests")?,
            replay_concurrency: k.number(
                "BENCH_REPLAY_CONCURRENCY",
                32,
                "`replay`: concurrency",
            )?,
            storm_keys: k.number("BENCH_STORM_KEYS", 50, "`storm`: keys")?,
            storm_per_key: k.number(
                "BENCH_STORM_PER_KEY",
                100,
                "`storm`: concurrent requests per key",
            )?,
            storm_concurrency: k.number(
                "BENCH_STORM_CONCURRENCY",
                2,
                "`storm`: keys stormed at once",
            )?,
            slow_in_flight: k.number(
                "BENCH_SLOW_IN_FLIGHT",
                1_000,
                "`slow`: charges in flight at once",
            )?,
            slow_latency: k.duration(
                "BENCH_SLOW_LATENCY",
                "18s",
                "`slow`: the provider's latency",
            )?,
            slow_timeout: k.duration(
                "BENCH_SLOW_TIMEOUT",
                "10s",
                "`slow`: the client's per-attempt timeout (then it retries the same key)",
            )?,
            slow_probe_concurrency: k.number(
                "BENCH_SLOW_PROBE_CONCURRENCY",
                4,
                "`slow`: probes replaying and reading completed charges",
            )?,
            slow_probe_keys: k.number(
                "BENCH_SLOW_PROBE_KEYS",
                20,
                "`slow`: completed keys probed",
            )?,
            slow_probe_interval: k.duration(
                "BENCH_SLOW_PROBE_INTERVAL",
                "10ms",
                "`slow`: pause between a probe's rounds",
            )?,
            prune_rows: k.number(
                "BENCH_PRUNE_ROWS",
                1_000_000,
                "`prune`: expired records seeded",
            )?,
            prune_seconds: k.duration(
                "BENCH_PRUNE_SECONDS",
                "5s",
                "`prune`: length of each `new` run (without, then with the pruner); \
                 at most the pruner's time, so the pruner covers the run",
            )?,
            pgbench_seconds: k.number(
                "BENCH_PGBENCH_SECONDS",
                20,
                "pgbench ceiling: seconds (`-T`)",
            )?,
            run_cap: k.duration(
                "BENCH_RUN_CAP",
                "300s",
                "hard cap on one load run (`slow`: latency x 2 + 60 s)",
            )?,
            log_level: k.text(
                "BENCH_RUST_LOG",
                "info",
                "the API's RUST_LOG (`info` as shipped: per-request lines to a file)",
            ),
            out: PathBuf::from(k.text(
                "BENCH_OUT",
                "docs/benchmarks.md",
                "the markdown written (relative to the workspace)",
            )),
            postgres_url: k.optional(
                "BENCH_POSTGRES_URL",
                "an existing PostgreSQL (admin URL) instead of the throwaway cluster",
            ),
            knobs: Vec::new(),
        };
        if settings.backends.is_empty() {
            bail!("BENCH_BACKENDS names no backend");
        }
        if settings.pool == 0 || settings.concurrency == 0 {
            bail!("BENCH_POOL and BENCH_CONCURRENCY must be at least 1");
        }
        Ok(Self {
            knobs: k.knobs,
            ..settings
        })
    }

    pub fn runs(&self, scenario: &str) -> bool {
        self.scenarios.contains(scenario)
    }

    /// Knobs whose value is not the default, as `NAME=value`.
    pub fn changed(&self) -> Vec<String> {
        self.knobs
            .iter()
            // Where things are, not how big the runs are.
            .filter(|k| !matches!(k.name, "BENCH_POSTGRES_URL" | "BENCH_OUT"))
            .filter(|k| k.value != k.default)
            .map(|k| format!("{}={}", k.name, k.value))
            .collect()
    }
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// Reads knobs and remembers each one for the markdown.
#[derive(Debug, Default)]
struct Reader {
    knobs: Vec<Knob>,
}

impl Reader {
    fn raw(&mut self, name: &'static str, default: &str, doc: &'static str) -> String {
        let value = std::env::var(name)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_owned());
        self.knobs.push(Knob {
            name,
            default: default.to_owned(),
            value: value.clone(),
            doc,
        });
        value
    }

    fn text(&mut self, name: &'static str, default: &str, doc: &'static str) -> String {
        self.raw(name, default, doc)
    }

    fn optional(&mut self, name: &'static str, doc: &'static str) -> Option<String> {
        let value = self.raw(name, "", doc);
        // The URL may carry a password: the markdown only says it was set.
        if let Some(knob) = self.knobs.last_mut()
            && !value.is_empty()
        {
            knob.value = "(set)".to_owned();
        }
        (!value.is_empty()).then_some(value)
    }

    fn number<T>(&mut self, name: &'static str, default: T, doc: &'static str) -> Result<T>
    where
        T: FromStr + ToString,
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        let value = self.raw(name, &default.to_string(), doc);
        value
            .replace('_', "")
            .parse()
            .with_context(|| format!("{name}={value:?} is not a whole number"))
    }

    fn duration(
        &mut self,
        name: &'static str,
        default: &str,
        doc: &'static str,
    ) -> Result<Duration> {
        let value = self.raw(name, default, doc);
        humantime::parse_duration(&value)
            .with_context(|| format!("{name}={value:?} is not a duration (e.g. 1500ms, 18s, 2m)"))
    }
}
