//! # payments-bench: `make bench`
//!
//! The release `payments-api` in front of the release `payments-sandbox`,
//! driven by the `payments-load` library through the scenarios
//! `tests/bench/template.md` describes, on a fresh SQLite file and a fresh
//! database on PostgreSQL (the tests' throwaway cluster made durable), with
//! the pgbench ceiling; written to `docs/benchmarks.md` (the raw reports and
//! logs in `target/bench/`).
//!
//! Exits 1 when a load run was incorrect or a process failed, 2 when the
//! bench could not run; a missed target is reported, not a failure. The
//! processes and databases are the tests' [`Process`] and [`TestDb`]: every
//! child is killed and every database dropped on every exit path.

mod chart;
mod database;
mod machine;
mod markdown;
mod results;
mod settings;

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use payments_loadtest::load::{self, Config, Marker, Report, Scenario};
use payments_tests::{
    BACK_OFFICE_AUDIENCE, Backend, Process, TestDb, postgres::throwaway_admin_url,
};
use serde_json::Value;

use machine::{CpuPerOp, Processes, Snapshot};
use results::{BackendResults, CacheFull, Prune, Slow};
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

static STARTED: LazyLock<Instant> = LazyLock::new(Instant::now);

/// A progress line on stderr, with the time since the start.
macro_rules! progress {
    ($($message:tt)*) => {{
        let elapsed = STARTED.elapsed().as_secs_f64();
        eprintln!("[bench {elapsed:>7.1}s] {}", format_args!($($message)*));
    }};
}

#[tokio::main]
async fn main() -> ExitCode {
    LazyLock::force(&STARTED);
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
    // The throwaway cluster (it blocks, so off the runtime's threads), never
    // `TEST_POSTGRES_URL`.
    let (pg_admin, postgres) = if backends.contains(&Backend::Postgres) {
        progress!("starting the throwaway PostgreSQL cluster");
        let url = tokio::task::spawn_blocking(throwaway_admin_url).await?;
        let url = url.map_err(|skip| anyhow!("PostgreSQL is unavailable: {skip}"))?;
        // The tests' cluster trades durability for speed; a payments database
        // never runs that way.
        database::make_durable(&url).await?;
        let version = database::pg_one(&url, "SELECT version()").await?;
        (Some(url), version)
    } else {
        (None, "not used".to_owned())
    };
    let pg_pid = server_pid(Backend::Postgres, pg_admin.as_deref()).await?;
    let (mysql_admin, mariadb) = if backends.contains(&Backend::Mysql) {
        progress!("starting the throwaway MariaDB");
        let url = tokio::task::spawn_blocking(payments_tests::mysql::throwaway_admin_url).await?;
        let url = url.map_err(|skip| anyhow!("MariaDB is unavailable: {skip}"))?;
        let version = database::make_mysql_durable(&url).await?;
        (Some(url), version)
    } else {
        (None, "not used".to_owned())
    };
    let mysql_pid = server_pid(Backend::Mysql, mysql_admin.as_deref()).await?;
    let machine = machine::facts(&root, postgres, mariadb, sqlite);
    progress!("machine: {machine:?}");

    let log = Some(out_dir.join("sandbox.log"));
    let listen = ["--listen", "127.0.0.1:0"];
    let sandbox = Process::try_start("payments-sandbox", &listen, &[], log).await;
    let sandbox = sandbox.map_err(anyhow::Error::msg)?;
    let day = Duration::from_secs(86_400);
    let token = payments_api::auth::mint_hs256(JWT_SECRET, "cus_load", day);
    let token = token.map_err(|e| anyhow!("minting the bench's token: {e}"))?;
    // The back office's, for `refund`'s refunds and `capture`'s captures: of
    // the audience every API the tests' `Process` starts is told.
    let scopes = ["refunds:write", "charges:capture"].map(str::to_owned);
    let audience = Some(BACK_OFFICE_AUDIENCE);
    let back_office =
        payments_api::auth::mint_hs256_scoped(JWT_SECRET, "ops_load", &scopes, audience, day);
    let back_office =
        back_office.map_err(|e| anyhow!("minting the bench's back-office token: {e}"))?;
    let mut bench = Bench {
        settings,
        out_dir,
        sandbox,
        token,
        back_office,
        pg_admin,
        mysql_admin,
        pg_pid,
        mysql_pid,
        machine,
        chart_name: String::new(),
        backends: Vec::new(),
        failures: Vec::new(),
    };
    for backend in bench.settings.backends.clone() {
        bench.backend(backend).await;
    }
    let sandbox = std::mem::replace(&mut bench.sandbox, Process::detached(String::new()));
    if let Err(e) = sandbox.stop().await {
        bench.fail("sandbox", e);
    }

    let out = root.join(&bench.settings.out);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if let Some(svg) = chart::render(&bench.backends) {
        let path = out.with_extension("svg");
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        bench.chart_name = name.unwrap_or_default();
    }
    let existing = std::fs::read_to_string(&out).ok();
    let text = markdown::render(&bench, &markdown::kept_analysis(existing.as_deref()))?;
    std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    progress!("wrote {}", out.display());
    Ok(bench.failures.is_empty())
}

/// A load run's report and, when it was counted, its CPU per operation.
type Counted = (Report, Option<CpuPerOp>);

/// What every step shares, and what they measured (for the markdown).
#[derive(Debug)]
struct Bench {
    settings: Settings,
    out_dir: PathBuf,
    sandbox: Process,
    /// The customer's (`cus_load`).
    token: String,
    /// The back office's, with `refunds:write` and `charges:capture`.
    back_office: String,
    pg_admin: Option<String>,
    mysql_admin: Option<String>,
    /// The main processes of the bench's PostgreSQL and MariaDB servers.
    pg_pid: Option<u32>,
    mysql_pid: Option<u32>,
    /// The chart's file name, beside the markdown (empty: none drawn).
    chart_name: String,
    /// The machine's facts, as read at the start.
    machine: Vec<(&'static str, String)>,
    backends: Vec<BackendResults>,
    /// Why the bench exits non-zero: incorrect reports, failed processes.
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

    /// A fresh, migrated database: a SQLite file, or on the PostgreSQL or
    /// MariaDB server.
    async fn database(&self, backend: Backend) -> TestDb {
        // There is a server whenever its backend is one of the backends.
        let admin = match backend {
            Backend::Postgres => self.pg_admin.clone(),
            Backend::Mysql => self.mysql_admin.clone(),
            _ => None,
        };
        let db = TestDb::on_server(backend, admin, 1).await;
        progress!("{}: {}", backend.name(), db.describe());
        db
    }

    /// Every selected scenario on one backend: what went wrong is in
    /// `failures`, what was measured in `backends`.
    async fn backend(&mut self, backend: Backend) {
        let mut results = BackendResults::default();
        let name = backend.name();
        results.backend = name;
        let db = self.database(backend).await;
        if self.settings.runs_on("ceiling", backend) {
            let charges = self.settings.ceiling_charges;
            progress!("sqlite ceiling: {charges} charges, one writer, no batching");
            let ceiling = database::sqlite_ceiling(charges).await;
            results.ceiling = self.keep("sqlite ceiling", ceiling);
            progress!("sqlite ceiling: {:?}", results.ceiling.map(|c| c.rate()));
        }
        if self.settings.runs_on("pgbench", backend) {
            // On a fresh database of its own: its rows stay out of `new`'s.
            let own = self.database(Backend::Postgres).await;
            let (clients, seconds) = (self.settings.concurrency, self.settings.pgbench_seconds);
            progress!("pgbench: {clients} clients, {seconds} s");
            let log = self.out_dir.join("pgbench.log");
            let ceiling = database::pgbench(&own, clients, seconds, log).await;
            results.pgbench = self.keep("pgbench", ceiling);
            progress!("pgbench: {:?}", results.pgbench);
        }
        // The outbox's cost is in the figures: events are delivered while
        // the scenarios run (the processes stop when dropped).
        let webhooks = self.start_webhooks(&db).await;
        let _webhooks = self.keep(&format!("{name} webhooks"), webhooks);
        self.main_group(&db, &mut results).await;
        if self.settings.runs_on("slow", backend) {
            let slow = self.slow(&db).await;
            results.slow = self.keep(&format!("{name} slow"), slow);
        }
        if self.settings.runs_on("prune", backend) {
            let prune = self.prune(&db).await;
            results.prune = self.keep(&format!("{name} prune"), prune);
        }
        self.backends.push(results);
    }

    /// `new`, `health`, `replay`, `cache`, `storm`, `refund`, `capture` and
    /// `list` on one API process.
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
        let new = Scenario::New {
            requests: s.new_requests,
            concurrency: s.concurrency,
        };
        let refund = Scenario::Refund {
            charges: s.refund_charges,
            per_charge: s.refund_per_charge,
            concurrency: s.concurrency,
        };
        let capture = Scenario::Capture {
            holds: s.capture_holds,
            concurrency: s.concurrency,
        };
        let health = Scenario::Health {
            requests: s.health_requests,
            concurrency: s.replay_concurrency,
        };
        let cache = Scenario::Replay {
            keys: s.cache_keys,
            requests: s.cache_keys * 2,
            concurrency: s.replay_concurrency,
        };
        let mut scenarios = vec![
            ("new", new),
            ("health", health),
            ("replay", replay),
            ("cache", cache),
            ("storm", storm),
            ("refund", refund),
            ("capture", capture),
        ];
        let backend = db.backend;
        scenarios.retain(|(label, _)| s.runs_on(label, backend));
        if scenarios.is_empty() && !s.runs_on("list", backend) {
            return;
        }
        let name = db.backend.name();
        let api = self.start_api(db, s.pool, "main").await;
        let Some(api) = self.keep(&format!("{name}: starting payments-api"), api) else {
            return;
        };
        for (label, scenario) in scenarios {
            // Every run is timed in CPU per operation too; `new` and
            // `replay` after a warm-up (the others make their own charges
            // first, outside the measured part).
            self.warm_up(db, label, &api, &scenario).await;
            let processes = self.processes(&api, backend);
            let run = self
                .counted_runs(db, label, &api, scenario, processes)
                .await;
            let Some((report, cpu, metrics)) = self.keep(&format!("{name} {label}"), run) else {
                continue;
            };
            let (hits, misses) = (
                delta(&metrics, "payments_replay_cache_total{result=\"hit\"}"),
                delta(&metrics, "payments_replay_cache_total{result=\"miss\"}"),
            );
            match label {
                "new" => {
                    results.new_cpu = cpu;
                    results.batches = batches(&metrics);
                    results.new = Some(report);
                }
                "health" => {
                    results.health_cpu = cpu;
                    results.health = Some(report);
                }
                "replay" => {
                    results.replay_cpu = cpu;
                    results.replay_cache = hits.zip(misses);
                    results.replay = Some(report);
                }
                "cache" => {
                    let status = format!("/proc/{}/status", api.pid());
                    results.cache = Some(CacheFull {
                        report,
                        hits: hits.unwrap_or_default(),
                        misses: misses.unwrap_or_default(),
                        rss_kb: machine::proc_kb(&status, "VmRSS:"),
                        hwm_kb: machine::proc_kb(&status, "VmHWM:"),
                    });
                }
                "refund" => {
                    results.refund_cpu = cpu;
                    results.refund = Some(report);
                }
                "capture" => {
                    results.capture_cpu = cpu;
                    results.capture = Some(report);
                }
                _ => {
                    let requests = self.sandbox_requests().await;
                    results.storm_provider_requests = self.keep("sandbox stats", requests);
                    results.storm = Some(report);
                }
            }
        }
        if s.runs_on("list", backend) {
            let processes = self.processes(&api, backend);
            let list = self.list(db, &api, processes).await;
            if let Some((first, deep)) = self.keep(&format!("{name} list"), list) {
                results.list_cpu = (first.1, deep.1);
                results.list = Some((first.0, deep.0));
            }
        }
        if let Err(e) = api.stop().await {
            self.fail(&format!("{name}: payments-api"), e);
        }
    }

    /// `list`: the bench's customer gets `BENCH_LIST_ROWS` more charges,
    /// then its first page and a deep one (after the middle charge) are
    /// each read `BENCH_LIST_REQUESTS` times.
    async fn list(
        &mut self,
        db: &TestDb,
        api: &Process,
        processes: Processes,
    ) -> Result<(Counted, Counted)> {
        let s = self.settings.clone();
        progress!(
            "{} list: seeding {} charges",
            db.backend.name(),
            s.list_rows
        );
        let middle = database::seed_charges(db, "cus_load", s.list_rows).await;
        let page = |starting_after| Scenario::List {
            requests: s.list_requests,
            concurrency: s.concurrency,
            limit: 20,
            starting_after,
        };
        let first = self.counted_runs(db, "list-first", api, page(None), processes);
        let (first, first_cpu, _) = first.await?;
        let deep = page(Some(middle));
        let (deep, deep_cpu, _) = self
            .counted_runs(db, "list-deep", api, deep, processes)
            .await?;
        Ok(((first, first_cpu), (deep, deep_cpu)))
    }

    /// The release API on a free loopback port, in front of the sandbox.
    async fn start_api(&self, db: &TestDb, pool: u64, label: &str) -> Result<Process> {
        let name = db.backend.name();
        let log = self.out_dir.join(format!("{name}-api-{label}.log"));
        let pool = pool.to_string();
        let batch = self.settings.sqlite_write_batch.to_string();
        let cache = self.settings.replay_cache_mb.to_string();
        let rate = self.settings.rate_limit_per_minute.to_string();
        let env = [
            ("SQLITE_WRITE_BATCH", batch.as_str()),
            ("REPLAY_CACHE_MB", cache.as_str()),
            ("RATE_LIMIT_PER_MINUTE", rate.as_str()),
            ("RATE_LIMIT_BURST", rate.as_str()),
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

    /// `BENCH_WEBHOOK_ENDPOINTS` receivers, and a `payments-jobs deliver`
    /// that delivers every event to each of them, on `db`.
    async fn start_webhooks(&self, db: &TestDb) -> Result<Vec<Process>> {
        let secret = "whsec_bench_0123456789abcdefghij";
        let mut processes = Vec::new();
        let mut endpoints = Vec::new();
        for _ in 0..self.settings.webhook_endpoints {
            let args = ["--listen", "127.0.0.1:0", "--secret", secret];
            let receiver = Process::try_start("payments-receiver", &args, &[], None).await;
            let receiver = receiver.map_err(anyhow::Error::msg)?;
            endpoints.push(serde_json::json!({"url": receiver.url, "secret": secret}));
            processes.push(receiver);
        }
        if endpoints.is_empty() {
            return Ok(processes);
        }
        let name = db.backend.name();
        let endpoints = serde_json::Value::from(endpoints).to_string();
        let env = [
            ("DATABASE_URL", db.url.as_str()),
            ("WEBHOOK_ENDPOINTS", endpoints.as_str()),
            ("DELIVER_EVERY", "1s"),
            ("RUST_LOG", "warn"),
        ];
        let log = self.out_dir.join(format!("{name}-jobs-deliver.log"));
        let (jobs, _stdout) = Process::spawn_logged("payments-jobs", &["deliver"], &env, Some(log))
            .map_err(anyhow::Error::msg)?;
        progress!(
            "{name}: payments-jobs deliver to {} endpoint(s)",
            processes.len()
        );
        processes.push(jobs);
        Ok(processes)
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
        let run = self.load_counted(db, label, api, scenario, cap, None);
        Ok(run.await?.0)
    }

    /// `scenario` run `BENCH_CPU_RUNS` times (once for `storm` and `cache`,
    /// not counted), each counted: the last run's report, each process's
    /// median CPU per operation over the runs, and the API's metrics
    /// before and after the last run. A failed run ends it.
    async fn counted_runs(
        &mut self,
        db: &TestDb,
        label: &str,
        api: &Process,
        scenario: Scenario,
        processes: Processes,
    ) -> Result<(Report, Option<CpuPerOp>, (String, String))> {
        let runs = match label {
            "storm" | "cache" => 1,
            _ => self.settings.cpu_runs.max(1),
        };
        let (cap, counted) = (self.settings.run_cap, Some(processes));
        let mut cpus = Vec::new();
        for _ in 1..runs {
            let load = self.load_counted(db, label, api, scenario.clone(), cap, counted);
            cpus.extend(load.await?.1);
        }
        let metrics_before = scrape(api).await;
        let (report, cpu) = self
            .load_counted(db, label, api, scenario, cap, counted)
            .await?;
        let metrics = (metrics_before, scrape(api).await);
        cpus.extend(cpu);
        Ok((report, CpuPerOp::median(&cpus), metrics))
    }

    /// [`Bench::load`], and with `processes`, the CPU time each of them
    /// spent per operation of the run's measured part ([`Marker`]: `new`'s
    /// charges, `replay`'s re-sends, not their setup nor the counting after
    /// them): `/proc` read at its start and its end. The figure is in the
    /// JSON too, as `cpu`.
    async fn load_counted(
        &mut self,
        db: &TestDb,
        label: &str,
        api: &Process,
        scenario: Scenario,
        cap: Duration,
        processes: Option<Processes>,
    ) -> Result<Counted> {
        let name = db.backend.name();
        let what = format!("{name} {label}");
        progress!("{what}: {scenario:?}");
        let mut config = Config::new(api.url.clone(), self.token.clone(), scenario);
        config.back_office_token = Some(self.back_office.clone().into());
        config.sandbox_url = Some(self.sandbox.url.clone());
        config.database_url = Some(db.url.clone().into());
        config.duration = cap;
        if let Scenario::Slow { .. } = config.scenario {
            config.timeout = self.settings.slow_timeout;
        }
        // The bench owns the sandbox: a reset makes its counters this run's.
        config.reset_sandbox = true;
        let snapshots = Arc::new(Mutex::new(Vec::new()));
        if let Some(processes) = processes {
            let snapshots = snapshots.clone();
            config.marker = Some(Marker::new(move |_| {
                let snapshot = Snapshot::take(&processes);
                let mut snapshots = snapshots.lock().unwrap_or_else(PoisonError::into_inner);
                snapshots.push(snapshot);
            }));
        }
        let report = load::run(&config).await;
        let report = report.with_context(|| format!("{what}: the load run could not run"))?;
        let snapshots = snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let cpu = match (snapshots.as_slice(), counted_operations(&report)) {
            ([start, end], Some(operations)) => start.per_op(end, operations),
            _ => None,
        };
        let mut json = serde_json::to_value(&report)?;
        if let Some(cpu) = cpu {
            json["cpu"] = serde_json::to_value(cpu)?;
            json["cpu"]["warmup"] = self.settings.warmup.into();
        }
        let json_path = self.out_dir.join(format!("{name}-{label}.json"));
        let written = std::fs::write(&json_path, serde_json::to_string_pretty(&json)?);
        written.with_context(|| format!("writing {}", json_path.display()))?;
        eprint!("{}", report.to_text());
        if let Some(cpu) = cpu {
            let us = cpu.us;
            progress!(
                "{what}: CPU per operation over {} in {:.1} s: API {:.0} µs, database {:.0}, \
                 sandbox {:.0}, load {:.0}",
                cpu.operations,
                cpu.secs,
                us.api,
                us.database,
                us.sandbox,
                us.load
            );
        }
        if !report.correct {
            let violations = report.violations.join("; ");
            self.fail(&what, format!("INCORRECT: {violations}"));
        }
        Ok((report, cpu))
    }

    /// `BENCH_WARMUP` operations of `scenario` (`new`, `replay`) on `api`,
    /// measured nowhere (its JSON is `<backend>-<label>-warmup.json`), so
    /// that the run after it meets a warm server: connections open, caches
    /// and allocator filled, code paged in.
    async fn warm_up(&mut self, db: &TestDb, label: &str, api: &Process, scenario: &Scenario) {
        let requests = self.settings.warmup;
        if requests == 0 {
            return;
        }
        let warm = match *scenario {
            Scenario::New { concurrency, .. } => Scenario::New {
                requests,
                concurrency,
            },
            Scenario::Replay {
                keys, concurrency, ..
            } => Scenario::Replay {
                keys,
                requests,
                concurrency,
            },
            _ => return,
        };
        let label = format!("{label}-warmup");
        let run = self
            .load(db, &label, api, warm, self.settings.run_cap)
            .await;
        self.keep(&format!("{} {label}", db.backend.name()), run);
    }

    /// The processes a run on `backend` against `api` is charged with.
    fn processes(&self, api: &Process, backend: Backend) -> Processes {
        Processes {
            api: api.pid(),
            sandbox: self.sandbox.pid(),
            database: match backend {
                Backend::Postgres => self.pg_pid,
                Backend::Mysql => self.mysql_pid,
                _ => None,
            },
        }
    }

    /// Provider charge requests since the last reset (`/_sandbox/stats`).
    async fn sandbox_requests(&self) -> Result<u64> {
        let url = format!("{}/_sandbox/stats", self.sandbox.url);
        let stats = reqwest::get(url).await?.error_for_status()?;
        let stats: Value = stats.json().await?;
        let requests = stats["requests"].as_u64();
        requests.ok_or_else(|| anyhow!("no `requests` in the sandbox's stats: {stats}"))
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
        let status = format!("/proc/{}/status", api.pid());
        let (vm_hwm_kb, log) = (machine::proc_kb(&status, "VmHWM:"), api.log());
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
        let (cap, concurrency) = (s.prune_seconds, s.concurrency);
        let scenario = || Scenario::New {
            requests: PRUNE_REQUESTS,
            concurrency,
        };
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
}

/// The API's `/metrics` text, empty when it cannot be read (the figures
/// that need it are then missing, not wrong).
async fn scrape(api: &Process) -> String {
    let text = async {
        reqwest::get(format!("{}/metrics", api.url))
            .await?
            .text()
            .await
    };
    text.await.unwrap_or_default()
}

/// A sample's value in Prometheus text: the line `series value`.
fn sample(text: &str, series: &str) -> Option<f64> {
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '));
    line?.trim().parse().ok()
}

/// How much `series` grew between two scrapes (a series first seen in the
/// second grew from 0).
fn delta((before, after): &(String, String), series: &str) -> Option<u64> {
    let after = sample(after, series)?;
    let before = sample(before, series).unwrap_or(0.0);
    Some((after - before).max(0.0) as u64)
}

/// The group commit's batches between two scrapes, per bucket of the
/// size histogram: (`le` bound, batches of at most that size but more than
/// the previous bound). `None` when the API batched nothing (not SQLite).
fn batches(metrics: &(String, String)) -> Option<Vec<(String, u64)>> {
    let name = payments_store::WRITE_BATCH_SIZE;
    let mut bounds: Vec<String> = payments_store::BATCH_BUCKETS
        .iter()
        .map(|b| b.to_string())
        .collect();
    bounds.push("+Inf".into());
    let mut below = 0;
    let mut out = Vec::new();
    for bound in bounds {
        let cumulative = delta(metrics, &format!("{name}_bucket{{le=\"{bound}\"}}"))?;
        out.push((bound, cumulative.saturating_sub(below)));
        below = cumulative;
    }
    (below > 0).then_some(out)
}

/// The operations a run's CPU is divided by: `new`'s charges (answered
/// 201), the requests of every other scenario's measured part; `None` for a
/// scenario the bench does not count.
fn counted_operations(report: &Report) -> Option<u64> {
    match report.scenario {
        "new" => Some(report.operations.charged),
        // Many requests per key, and provider calls held open: no one
        // operation to charge the CPU to.
        "storm" | "slow" => None,
        // The measured part's own stream: `replay`, `refund`, `capture`,
        // `list`, `health`.
        scenario => Some(report.stream(scenario)?.requests),
    }
}

/// The main process of the bench's server for `backend`, if it has one
/// (`admin`).
async fn server_pid(backend: Backend, admin: Option<&str>) -> Result<Option<u32>> {
    let Some(admin) = admin else {
        return Ok(None);
    };
    let pid = database::server_pid(backend, admin).await;
    let pid = pid.with_context(|| format!("finding the {} server's process", backend.name()))?;
    progress!("{}: server pid {pid}", backend.name());
    Ok(Some(pid))
}
