//! # payments-bench: `make bench`
//!
//! The release `payments-api` in front of the release `payments-sandbox`,
//! driven by the `payments-load` library through the scenarios
//! `tests/bench/template.md` describes, on a fresh SQLite file and a fresh
//! database on PostgreSQL (the tests' throwaway cluster made durable, or
//! `BENCH_POSTGRES_URL`), with the pgbench ceiling; written to
//! `docs/benchmarks.md` (the raw reports and logs in `target/bench/`).
//!
//! Exits 1 when a load run was incorrect or a process failed, 2 when the
//! bench could not run; a missed target is reported, not a failure. The
//! processes and databases are the tests' [`Process`] and [`TestDb`]: every
//! child is killed and every database dropped on every exit path.

mod database;
mod machine;
mod markdown;
mod results;
mod settings;

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use payments_loadtest::load::{self, Config, Report, Scenario};
use payments_tests::{Backend, Process, TestDb};
use serde_json::Value;

use database::Pgbench;
use machine::Snapshot;
use results::{BackendResults, Prune, Results, Slow};
use settings::{SLOW_POOL, Settings};

/// The bench's own JWT secret (at least 32 bytes); the API is given the same.
const JWT_SECRET: &str = "payments-bench-jwt-secret-for-loopback-only";
/// Longer than the slowest provider answer (18 s in `slow`), so the server
/// completes the first call instead of answering 503 and re-driving it.
const GATEWAY_TIMEOUT: &str = "30s";
/// Longer than the gateway timeout, as the server requires.
const LEASE: &str = "60s";
/// `prune`'s `new` runs are bounded by time; this is only their upper bound.
const PRUNE_REQUESTS: u64 = 10_000_000;
/// How long the pruner may take at most.
const PRUNE_CAP: Duration = Duration::from_secs(1800);

static STARTED: OnceLock<Instant> = OnceLock::new();

/// A progress line on stderr, with the time since the start.
macro_rules! progress {
    ($($message:tt)*) => {{
        let elapsed = STARTED.get_or_init(Instant::now).elapsed().as_secs_f64();
        eprintln!("[bench {elapsed:>7.1}s] {}", format_args!($($message)*));
    }};
}

#[tokio::main]
async fn main() -> ExitCode {
    STARTED.get_or_init(Instant::now);
    // Dropping `bench` on a signal drops every child and database guard.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    let outcome = tokio::select! {
        outcome = bench() => outcome,
        Ok(()) = tokio::signal::ctrl_c() => Err(anyhow!("interrupted by SIGINT")),
        Some(()) = async { term.as_mut().ok()?.recv().await } => Err(anyhow!("interrupted by SIGTERM")),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("payments-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The whole bench; `Ok(false)` when something failed but the results were
/// still written.
async fn bench() -> Result<bool> {
    let settings = Settings::from_env()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // `target/bench`, beside the release binaries' `target/release`.
    let exe = std::env::current_exe()?;
    let out_dir = exe.ancestors().nth(2).context("no target dir")?;
    let out_dir = out_dir.join("bench");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let (backends, scenarios) = (&settings.backends, &settings.scenarios);
    let changed = settings.changed().join(" ");
    progress!("backends {backends:?}, scenarios {scenarios:?}, changed: {changed}");

    let sqlite = database::sqlite_version().await?;
    let (pg_admin, postgres_server) = if backends.contains(&Backend::Postgres) {
        let (url, what) = postgres_admin(&settings).await?;
        (Some(url), what)
    } else {
        (None, "not used".to_owned())
    };
    let postgres = match &pg_admin {
        Some(url) => database::pg_one(url, "SELECT version()").await?,
        None => "not used".to_owned(),
    };
    let machine = machine::facts(&root, postgres, sqlite);
    progress!("machine: {machine:?}");

    let log = Some(out_dir.join("sandbox.log"));
    let listen = ["--listen", "127.0.0.1:0"];
    let sandbox = Process::try_start("payments-sandbox", &listen, &[], log).await;
    let sandbox = sandbox.map_err(anyhow::Error::msg)?;
    let day = Duration::from_secs(86_400);
    let token = payments_api::auth::mint_hs256(JWT_SECRET, "cus_load", day);
    let token = token.map_err(|e| anyhow!("minting the bench's token: {e}"))?;
    let mut bench = Bench {
        settings,
        root,
        out_dir,
        sandbox,
        token,
        pg_admin,
        pgbench: None,
        failures: Vec::new(),
    };
    let mut backends = Vec::new();
    for backend in bench.settings.backends.clone() {
        backends.push(bench.backend(backend).await);
    }
    let sandbox = std::mem::replace(&mut bench.sandbox, Process::detached(String::new()));
    if let Err(e) = sandbox.stop().await {
        bench.fail("sandbox", e);
    }

    let results = Results {
        machine,
        knobs: bench.settings.knobs.clone(),
        changed: bench.settings.changed(),
        postgres_server,
        pgbench: bench.pgbench.take(),
        backends,
        failures: bench.failures.clone(),
        elapsed_secs: STARTED.get_or_init(Instant::now).elapsed().as_secs_f64(),
    };
    bench.write(&results)?;
    Ok(results.failures.is_empty())
}

/// `BENCH_POSTGRES_URL`, else the throwaway cluster (started here; it
/// blocks, so off the runtime's threads) made durable. Never
/// `TEST_POSTGRES_URL`.
async fn postgres_admin(settings: &Settings) -> Result<(String, String)> {
    if let Some(url) = &settings.postgres_url {
        return Ok((url.clone(), "the server of `BENCH_POSTGRES_URL`".to_owned()));
    }
    progress!("starting the throwaway PostgreSQL cluster");
    let url = tokio::task::spawn_blocking(payments_tests::postgres::throwaway_admin_url).await?;
    let url = url.map_err(|skip| anyhow!("PostgreSQL is unavailable: {skip}"))?;
    // The tests' cluster trades durability for speed; a payments database
    // never runs that way.
    database::set_durable(&url, true).await?;
    let what = "a throwaway cluster started the way the tests start theirs (initdb in a temp \
                dir, a free port, `max_connections=300`, other settings at their defaults), \
                then made durable as production runs: `fsync`, `synchronous_commit` and \
                `full_page_writes` on (the tests run it with all three off, for speed)";
    Ok((url, what.to_owned()))
}

/// What every step shares.
#[derive(Debug)]
struct Bench {
    settings: Settings,
    root: PathBuf,
    out_dir: PathBuf,
    sandbox: Process,
    token: String,
    pg_admin: Option<String>,
    pgbench: Option<Pgbench>,
    failures: Vec<String>,
}

impl Bench {
    /// Records a failure: the bench goes on, and exits 1.
    fn fail(&mut self, what: &str, why: impl Display) {
        progress!("FAILED {what}: {why:#}");
        self.failures.push(format!("{what}: {why:#}"));
    }

    /// `Some` on success; a failure is recorded.
    fn keep<T>(&mut self, what: &str, result: Result<T>) -> Option<T> {
        result.map_err(|e| self.fail(what, e)).ok()
    }

    /// A fresh, migrated database: a SQLite file, or on the PostgreSQL server.
    async fn database(&self, backend: Backend) -> Result<TestDb> {
        let admin = match backend {
            Backend::Sqlite => None,
            _ => Some(self.pg_admin.clone().context("no PostgreSQL server")?),
        };
        let db = TestDb::on_server(backend, admin, 1).await;
        progress!("{}: {}", backend.name(), db.describe());
        Ok(db)
    }

    /// Every selected scenario on one backend: what went wrong is in
    /// `failures`, what was measured in the result.
    async fn backend(&mut self, backend: Backend) -> BackendResults {
        let mut results = BackendResults::default();
        let name = backend.name();
        results.backend = name;
        let db = self.database(backend).await;
        let Some(db) = self.keep(&format!("{name}: creating the database"), db) else {
            return results;
        };
        let postgres = backend == Backend::Postgres;
        if postgres && self.settings.runs("pgbench") {
            let ceiling = self.pgbench("pgbench").await;
            self.pgbench = self.keep("pgbench", ceiling);
        }
        self.main_group(&db, &mut results).await;
        if self.settings.runs("slow") {
            let slow = self.slow(&db).await;
            results.slow = self.keep(&format!("{name} slow"), slow);
        }
        if self.settings.runs("prune") {
            let prune = self.prune(&db).await;
            results.prune = self.keep(&format!("{name} prune"), prune);
        }
        let throwaway = self.settings.postgres_url.is_none();
        if postgres && self.settings.runs("fsync-off") && throwaway {
            let fsync_off = self.fsync_off().await;
            results.fsync_off = self.keep("postgres fsync-off", fsync_off);
        }
        results
    }

    /// `new`, `replay` and `storm` on one API process.
    async fn main_group(&mut self, db: &TestDb, results: &mut BackendResults) {
        let s = self.settings.clone();
        let replay = Scenario::Replay {
            keys: s.replay_keys,
            requests: s.replay_requests,
            concurrency: s.replay_concurrency,
        };
        let storm = Scenario::Storm {
            keys: s.storm_keys,
            per_key: s.storm_per_key,
            concurrency: s.storm_concurrency,
        };
        let scenarios = [
            ("new", new(s.new_requests, &s)),
            ("replay", replay),
            ("storm", storm),
        ];
        let mut scenarios = scenarios.into_iter().filter(|(label, _)| s.runs(label));
        let Some(first) = scenarios.next() else {
            return;
        };
        let name = db.backend.name();
        let api = self.start_api(db, s.pool, "main").await;
        let Some(api) = self.keep(&format!("{name}: starting payments-api"), api) else {
            return;
        };
        for (label, scenario) in [first].into_iter().chain(scenarios) {
            let before = Snapshot::take(api.pid(), self.sandbox.pid());
            let report = self.load(db, label, &api, scenario, s.run_cap).await;
            let after = Snapshot::take(api.pid(), self.sandbox.pid());
            let Some(report) = self.keep(&format!("{name} {label}"), report) else {
                continue;
            };
            match label {
                "new" => {
                    results.new_cpu = before.per_charge(&after, report.operations.charged);
                    results.new = Some(report);
                }
                "replay" => results.replay = Some(report),
                _ => {
                    let requests = self.sandbox_requests().await;
                    results.storm_provider_requests = self.keep("sandbox stats", requests);
                    results.storm = Some(report);
                }
            }
        }
        if let Err(e) = api.stop().await {
            self.fail(&format!("{name}: payments-api"), e);
        }
    }

    /// The release API on a free loopback port, in front of the sandbox.
    async fn start_api(&self, db: &TestDb, pool: u64, label: &str) -> Result<Process> {
        let name = db.backend.name();
        let log = self.out_dir.join(format!("{name}-api-{label}.log"));
        let pool = pool.to_string();
        let env = [
            ("DATABASE_URL", db.url.as_str()),
            ("DATABASE_MAX_CONNECTIONS", &pool),
            ("LISTEN_ADDR", "127.0.0.1:0"),
            ("GATEWAY_URL", &self.sandbox.url),
            ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
            ("GATEWAY_TIMEOUT", GATEWAY_TIMEOUT),
            ("LEASE", LEASE),
            ("WITH_JOBS", "false"),
            ("JWT_HS256_SECRET", JWT_SECRET),
            ("RUST_LOG", &self.settings.log_level),
        ];
        let api = Process::try_start("payments-api", &["serve"], &env, Some(log)).await;
        let api = api.map_err(anyhow::Error::msg)?;
        progress!("{name}: payments-api (pool {pool}) on {}", api.url);
        Ok(api)
    }

    /// One load run against `api`, capped at `cap`, its JSON kept as
    /// `target/bench/<backend>-<label>.json`. An incorrect report is a
    /// failure of the bench but still returned, to be written down.
    async fn load(
        &mut self,
        db: &TestDb,
        label: &str,
        api: &Process,
        scenario: Scenario,
        cap: Duration,
    ) -> Result<Report> {
        let name = db.backend.name();
        progress!("{name} {label}: {scenario:?}");
        let mut config = Config::new(api.url.clone(), self.token.clone(), scenario);
        config.sandbox_url = Some(self.sandbox.url.clone());
        config.database_url = Some(db.url.clone().into());
        config.duration = cap;
        if let Scenario::Slow { .. } = config.scenario {
            config.timeout = self.settings.slow_timeout;
        }
        // The bench owns the sandbox: a reset makes its counters this run's.
        config.reset_sandbox = true;
        let report = load::run(&config).await;
        let report =
            report.with_context(|| format!("{name} {label}: the load run could not run"))?;
        let json = self.out_dir.join(format!("{name}-{label}.json"));
        let written = std::fs::write(&json, report.to_json());
        written.with_context(|| format!("writing {}", json.display()))?;
        eprint!("{}", report.to_text());
        if !report.correct {
            let violations = report.violations.join("; ");
            self.fail(
                &format!("{name} {label}"),
                format!("INCORRECT: {violations}"),
            );
        }
        Ok(report)
    }

    /// Provider charge requests since the last reset (`/_sandbox/stats`).
    async fn sandbox_requests(&self) -> Result<u64> {
        let url = format!("{}/_sandbox/stats", self.sandbox.url);
        let stats = reqwest::get(url).await?.error_for_status()?;
        let stats: Value = stats.json().await?;
        let requests = stats["requests"].as_u64();
        requests.ok_or_else(|| anyhow!("no `requests` in the sandbox's stats: {stats}"))
    }

    /// The pgbench ceiling on its own fresh, migrated database, its output
    /// in `target/bench/<label>.log`.
    async fn pgbench(&self, label: &str) -> Result<Pgbench> {
        let db = self.database(Backend::Postgres).await?;
        let (clients, seconds) = (self.settings.concurrency, self.settings.pgbench_seconds);
        progress!("{label}: {clients} clients, {seconds} s");
        let log = self.out_dir.join(format!("{label}.log"));
        let ceiling = database::pgbench(&db, clients, seconds, log).await?;
        progress!("{label}: {ceiling:?}");
        Ok(ceiling)
    }

    /// The throwaway cluster with the commit flush off (as the tests run
    /// it): the pgbench ceiling, then `new` on a fresh database; durable
    /// again afterwards, whatever happened.
    async fn fsync_off(&mut self) -> Result<(Pgbench, Report)> {
        let admin = self.pg_admin.clone().context("no PostgreSQL server")?;
        database::set_durable(&admin, false).await?;
        let measured = async {
            let pgbench = self.pgbench("pgbench-fsync-off").await?;
            let db = self.database(Backend::Postgres).await?;
            let s = self.settings.clone();
            let api = self.start_api(&db, s.pool, "fsync-off").await?;
            let scenario = new(s.new_requests, &s);
            let new = self.load(&db, "new-fsync-off", &api, scenario, s.run_cap);
            let new = new.await;
            api.stop().await.map_err(anyhow::Error::msg)?;
            Ok((pgbench, new?))
        };
        let measured = measured.await;
        database::set_durable(&admin, true).await?;
        measured
    }

    /// `slow` on a fresh API with a pool of exactly 10.
    async fn slow(&mut self, db: &TestDb) -> Result<Slow> {
        let s = self.settings.clone();
        let api = self.start_api(db, SLOW_POOL, "slow").await?;
        let scenario = Scenario::Slow {
            in_flight: s.slow_in_flight,
            provider_latency: s.slow_latency,
            probe_concurrency: s.slow_probe_concurrency,
            probe_keys: s.slow_probe_keys,
            probe_interval: s.slow_probe_interval,
        };
        // Two provider latencies (the first call, then the retries'
        // replays) plus setup and backoff.
        let cap = s.slow_latency * 2 + Duration::from_secs(60);
        let report = self.load(db, "slow", &api, scenario, cap).await;
        let (vm_hwm_kb, log) = (vm_hwm_kb(api.pid()), api.log());
        let provider_requests = self.sandbox_requests().await.ok();
        api.stop().await.map_err(anyhow::Error::msg)?;
        let count = |matches: fn(&str) -> bool| log.lines().filter(|l| matches(l)).count() as u64;
        let pool_timeouts = count(|line| {
            let line = line.to_ascii_lowercase();
            line.contains("pool timed out") || line.contains("pooltimedout")
        });
        Ok(Slow {
            report: report?,
            vm_hwm_kb,
            pool_timeouts,
            error_lines: count(|line| line.contains("ERROR")),
            provider_requests,
        })
    }

    /// `prune`: seed expired records, then `new` without and with the
    /// pruner running from a separate process.
    async fn prune(&mut self, db: &TestDb) -> Result<Prune> {
        let (s, name) = (self.settings.clone(), db.backend.name());
        progress!("{name} prune: seeding {} expired records", s.prune_rows);
        let seeding = Instant::now();
        database::seed_expired(db, s.prune_rows).await;
        let seed_secs = seeding.elapsed().as_secs_f64();
        let api = self.start_api(db, s.pool, "prune").await?;
        let (cap, scenario) = (s.prune_seconds, || new(PRUNE_REQUESTS, &s));
        let baseline = self.load(db, "prune-baseline", &api, scenario(), cap);
        let baseline = baseline.await?;
        let env = [("DATABASE_URL", db.url.as_str()), ("LOG_FORMAT", "json")];
        let log = Some(self.out_dir.join(format!("{name}-prune.log")));
        let spawned = Process::spawn_logged("payments-jobs", &["prune", "--once"], &env, log);
        let (mut pruner, _stdout) = spawned.map_err(anyhow::Error::msg)?;
        let started = Instant::now();
        let pruned = async { (pruner.wait(PRUNE_CAP).await, started.elapsed()) };
        let run = async {
            let with = self.load(db, "prune-with", &api, scenario(), cap).await;
            (with, started.elapsed())
        };
        let ((with_prune, run_ended), (status, prune_ended)) = tokio::join!(run, pruned);
        api.stop().await.map_err(anyhow::Error::msg)?;
        let prune_ok = status.as_ref().is_ok_and(|s| s.success());
        if !prune_ok {
            let what = format!("{name} prune: payments-jobs prune --once");
            self.fail(&what, format!("{status:?}; its log is {name}-prune.log"));
        }
        let remaining = database::count_prunable(db).await;
        if remaining > 0 {
            let what = format!("{name} prune");
            self.fail(&what, format!("{remaining} expired records were left"));
        }
        // The `fields` of the pruner's `prune pass` JSON log line.
        let log = pruner.log();
        let mut events = log.lines().filter_map(|l| serde_json::from_str(l).ok());
        let pass = events.find(|event: &Value| event["fields"]["message"] == "prune pass");
        Ok(Prune {
            seeded: s.prune_rows,
            seed_secs,
            baseline,
            with_prune: with_prune?,
            prune_wall_secs: prune_ended.as_secs_f64(),
            prune_ok,
            pass: pass.map(|pass| pass["fields"].clone()).unwrap_or_default(),
            overlap_secs: prune_ended.min(run_ended).as_secs_f64(),
            run_secs: run_ended.as_secs_f64(),
            remaining,
        })
    }

    /// `target/bench/summary.json` and the markdown.
    fn write(&self, results: &Results) -> Result<()> {
        let summary = self.out_dir.join("summary.json");
        let json = serde_json::to_string_pretty(results)?;
        std::fs::write(&summary, json).with_context(|| format!("writing {}", summary.display()))?;
        let out = self.root.join(&self.settings.out);
        let existing = std::fs::read_to_string(&out).ok();
        let text = markdown::render(results, &markdown::kept_analysis(existing.as_deref()))?;
        std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
        progress!("wrote {} and {}", out.display(), summary.display());
        Ok(())
    }
}

/// `new`: `requests` fresh keys, `BENCH_CONCURRENCY` at a time.
fn new(requests: u64, s: &Settings) -> Scenario {
    let concurrency = s.concurrency;
    Scenario::New {
        requests,
        concurrency,
    }
}

/// The peak RSS of `pid` so far (`VmHWM` of `/proc/<pid>/status`), kB.
fn vm_hwm_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = status.lines().find_map(|line| line.strip_prefix("VmHWM:"));
    kb?.trim().trim_end_matches(" kB").parse().ok()
}
