//! # payments-bench: `make bench`
//!
//! Measures the release binaries on this machine and writes
//! `docs/benchmarks.md` (plus the raw reports in `target/bench/`):
//!
//! 1. Machine facts (CPU, memory, kernel, rustc, PostgreSQL and SQLite
//!    versions, commit, date).
//! 2. The release `payments-sandbox` on a free loopback port.
//! 3. Per backend (a fresh SQLite file; a fresh database on the throwaway
//!    PostgreSQL cluster, or on `BENCH_POSTGRES_URL`), with the release
//!    `payments-api` and the `payments-load` library: `new`, `replay`,
//!    `storm`, `slow` (pool of 10, peak RSS, pool timeouts) and `prune`
//!    (a million expired records, `new` without and with
//!    `payments-jobs prune --once`). On PostgreSQL, first the pgbench
//!    ceiling: `tests/bench/charge.sql`, the SQL of one new charge.
//! 4. The markdown, with the targets judged from the figures and the
//!    hand-written analysis kept.
//!
//! The exit status is 1 when a load run was incorrect (the charges do not
//! add up, a status its scenario forbids) or a process failed, 2 when the
//! bench could not run at all; a missed performance target is reported, not
//! a failure. Every child is killed on every exit path ([`process::Child`]).
//!
//! # Layout
//! - `settings`: the `BENCH_*` knobs.
//! - `process`: child processes as kill-on-drop guards.
//! - `machine`: the facts.
//! - `database`: fresh databases, versions, seeding for `prune`.
//! - `pgbench`: the ceiling.
//! - `results`: what was measured, as `summary.json` has it.
//! - `markdown`: `docs/benchmarks.md`.

mod cpu;
mod database;
mod machine;
mod markdown;
mod pgbench;
mod process;
mod results;
mod settings;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use payments_loadtest::load::{self, Config, Report, Scenario};
use tokio::sync::watch;

use database::BenchDb;
use machine::Machine;
use process::{Child, Command, status_kb, workspace_binary};
use results::{ApiSetup, BackendResults, Prune, Results, Slow, Storm};
use settings::{Backend, SLOW_POOL, Settings};

/// The bench's own JWT secret (at least 32 bytes); the API is given the same.
const JWT_SECRET: &str = "payments-bench-jwt-secret-for-loopback-only";
const CUSTOMER: &str = "cus_load";
/// Longer than the slowest provider answer of any scenario (18 s in `slow`),
/// so the server completes the first call instead of answering 503 and
/// re-driving it.
const GATEWAY_TIMEOUT: &str = "30s";
/// Longer than the gateway timeout, as the server requires: a retry must not
/// take over a provider call still in flight.
const LEASE: &str = "60s";
/// The client's per-attempt timeout outside `slow`.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// `prune`'s `new` runs are bounded by time; this is only their upper bound.
const PRUNE_REQUESTS: u64 = 10_000_000;
/// How long the pruner may take at most.
const PRUNE_CAP: Duration = Duration::from_secs(1800);
/// How often the API's RSS is sampled during `slow`.
const RSS_EVERY: Duration = Duration::from_millis(250);

static STARTED: OnceLock<Instant> = OnceLock::new();

/// A progress line on stderr, with the time since the start.
fn progress(message: &str) {
    let elapsed = STARTED.get_or_init(Instant::now).elapsed();
    eprintln!("[bench {:>7.1}s] {message}", elapsed.as_secs_f64());
}

#[tokio::main]
async fn main() -> ExitCode {
    STARTED.get_or_init(Instant::now);
    // Dropping `bench` on a signal drops every child guard, which kills it.
    let outcome = tokio::select! {
        outcome = bench() => outcome,
        signal = interrupted() => Err(anyhow!("interrupted by {signal}; children stopped")),
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

async fn interrupted() -> &'static str {
    let int = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = int => "SIGINT",
        () = term => "SIGTERM",
    }
}

/// The whole bench; `Ok(false)` when something failed but the results were
/// still written.
async fn bench() -> Result<bool> {
    let started = Instant::now();
    let settings = Settings::from_env()?;
    let root = workspace_root();
    let bin = Binaries {
        api: workspace_binary("payments-api")?,
        sandbox: workspace_binary("payments-sandbox")?,
        jobs: workspace_binary("payments-jobs")?,
    };
    let out_dir = process::bin_dir()?
        .parent()
        .map(|target| target.join("bench"))
        .ok_or_else(|| anyhow!("the binaries' directory has no parent"))?;
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let changed = settings.changed();
    progress(&format!(
        "payments-bench: backends {:?}, scenarios {:?}{}",
        settings
            .backends
            .iter()
            .map(|b| b.name())
            .collect::<Vec<_>>(),
        settings.scenarios,
        if changed.is_empty() {
            String::new()
        } else {
            format!(", changed: {}", changed.join(" "))
        }
    ));

    let mut machine = Machine::collect(&root);
    machine.sqlite = database::sqlite_version()
        .await
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let needs_postgres = settings.backends.contains(&Backend::Postgres);
    let (pg_admin, postgres_server) = if needs_postgres {
        let (url, what) = postgres_admin(&settings).await?;
        machine.postgres = database::postgres_version(&url)
            .await
            .context("asking PostgreSQL its version")?;
        (Some(url), what)
    } else {
        (None, "not used".to_owned())
    };
    progress(&format!(
        "machine: {} x {}, {}, kernel {}, {}, {}, SQLite {}, commit {}, load {}",
        machine.cpus,
        machine.cpu_model,
        machine.memory,
        machine.kernel,
        machine.rustc,
        machine.postgres.split(" on ").next().unwrap_or_default(),
        machine.sqlite,
        machine.git,
        machine.load_average
    ));

    let sandbox = Command::new(
        "payments-sandbox",
        bin.sandbox.clone(),
        out_dir.join("sandbox.log"),
    )
    .args(["--listen", "127.0.0.1:0"])
    .serve()
    .await?;
    progress(&format!("sandbox on {}", sandbox.url));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let token = payments_api::auth::mint_hs256(JWT_SECRET, CUSTOMER, Duration::from_secs(86_400))
        .map_err(|e| anyhow!("minting the bench's token: {e}"))?;
    let mut bench = Bench {
        settings,
        root,
        out_dir,
        bin,
        sandbox_url: sandbox.url.clone(),
        sandbox_pid: sandbox.pid(),
        http,
        token,
        pg_admin,
        pgbench: None,
        failures: Vec::new(),
    };
    bench
        .sandbox_config(serde_json::json!({"latency_ms": 0}))
        .await?;

    let mut backends = Vec::new();
    for backend in bench.settings.backends.clone() {
        backends.push(bench.backend(backend).await);
    }
    if let Err(e) = sandbox.stop().await {
        bench.fail("sandbox", &e);
    }

    let results = Results {
        machine,
        knobs: bench.settings.knobs.clone(),
        changed,
        api: ApiSetup {
            pool: bench.settings.pool,
            slow_pool: SLOW_POOL,
            gateway_timeout: GATEWAY_TIMEOUT,
            lease: LEASE,
            log_level: bench.settings.log_level.clone(),
        },
        postgres_server,
        pgbench: bench.pgbench.take(),
        backends,
        failures: bench.failures.clone(),
        elapsed_secs: started.elapsed().as_secs_f64(),
    };
    bench.write(&results)?;
    if results.failures.is_empty() {
        progress("done: every load run was correct");
        Ok(true)
    } else {
        progress(&format!(
            "done, with {} failure(s):",
            results.failures.len()
        ));
        for failure in &results.failures {
            eprintln!("  - {}", failure.lines().next().unwrap_or_default());
        }
        Ok(false)
    }
}

/// `tests/..`: where `tests/bench/charge.sql` and `docs/` are.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `BENCH_POSTGRES_URL`, else the throwaway cluster (started here; it
/// blocks, so off the runtime's threads). Never `TEST_POSTGRES_URL`.
async fn postgres_admin(settings: &Settings) -> Result<(String, String)> {
    if let Some(url) = &settings.postgres_url {
        return Ok((url.clone(), "the server of `BENCH_POSTGRES_URL`".to_owned()));
    }
    progress("starting the throwaway PostgreSQL cluster");
    let url = tokio::task::spawn_blocking(payments_tests::postgres::throwaway_admin_url)
        .await
        .context("starting the throwaway PostgreSQL cluster")?
        .map_err(|skip| anyhow!("PostgreSQL is unavailable: {skip}"))?;
    // The tests' cluster trades durability for speed; a payments database
    // never runs that way, so the bench measures it durable.
    database::set_durable(&url, true).await?;
    Ok((
        url,
        "a throwaway cluster started the way the tests start theirs (initdb in a temp \
         dir, a free port, `max_connections=300`, other settings at their defaults), \
         then made durable as production runs: `fsync`, `synchronous_commit` and \
         `full_page_writes` on (the tests run it with all three off, for speed)"
            .to_owned(),
    ))
}

#[derive(Debug)]
struct Binaries {
    api: PathBuf,
    sandbox: PathBuf,
    jobs: PathBuf,
}

/// What every step shares.
#[derive(Debug)]
struct Bench {
    settings: Settings,
    root: PathBuf,
    out_dir: PathBuf,
    bin: Binaries,
    sandbox_url: String,
    sandbox_pid: u32,
    http: reqwest::Client,
    token: String,
    pg_admin: Option<String>,
    pgbench: Option<pgbench::Pgbench>,
    failures: Vec<String>,
}

impl Bench {
    fn fail(&mut self, what: &str, e: &anyhow::Error) {
        progress(&format!("FAILED {what}: {e:#}"));
        self.failures.push(format!("{what}: {e:#}"));
    }

    /// `Some` on success; a failure is recorded and the bench goes on.
    fn keep<T>(&mut self, what: &str, result: Result<T>) -> Option<T> {
        result.map_err(|e| self.fail(what, &e)).ok()
    }

    /// Every selected scenario on one backend. Never fails: what went wrong
    /// is in `failures`, what was measured in the result.
    async fn backend(&mut self, backend: Backend) -> BackendResults {
        let name = backend.name();
        let mut results = BackendResults::new(backend);
        let db = match backend {
            Backend::Sqlite => BenchDb::sqlite(),
            Backend::Postgres => match &self.pg_admin {
                Some(admin) => BenchDb::postgres(admin, "api").await,
                None => Err(anyhow!("no PostgreSQL server")),
            },
        };
        let Some(db) = self.keep(&format!("{name}: creating the database"), db) else {
            return results;
        };
        results.database = db.describe();
        progress(&format!("{name}: {}", results.database));
        let migrated = self.migrate(&db).await;
        if self.keep(&format!("{name}: migrate"), migrated).is_some() {
            if backend == Backend::Postgres && self.settings.runs("pgbench") {
                let ceiling = self.pgbench().await;
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
            if backend == Backend::Postgres
                && self.settings.runs("fsync-off")
                && self.settings.postgres_url.is_none()
            {
                let fsync_off = self.fsync_off().await;
                results.fsync_off = self.keep("postgres fsync-off", fsync_off);
            }
        }
        db.drop_now().await;
        results
    }

    /// `new`, `replay` and `storm` on one API process.
    async fn main_group(&mut self, db: &BenchDb, results: &mut BackendResults) {
        let s = self.settings.clone();
        if !(s.runs("new") || s.runs("replay") || s.runs("storm")) {
            return;
        }
        let name = db.backend.name();
        let api = self.start_api(db, s.pool, "main").await;
        let Some(api) = self.keep(&format!("{name}: starting payments-api"), api) else {
            return;
        };
        if s.runs("new") {
            let scenario = Scenario::New {
                requests: s.new_requests,
                concurrency: s.concurrency,
            };
            let before = cpu::Snapshot::take(api.pid(), self.sandbox_pid);
            let report = self
                .load(db, "new", &api, scenario, s.run_cap, CLIENT_TIMEOUT)
                .await;
            let after = cpu::Snapshot::take(api.pid(), self.sandbox_pid);
            results.new = self.keep(&format!("{name} new"), report);
            results.new_cpu = results
                .new
                .as_ref()
                .and_then(|r| before.per_charge(&after, r.operations.charged));
        }
        if s.runs("replay") {
            let scenario = Scenario::Replay {
                keys: s.replay_keys,
                requests: s.replay_requests,
                concurrency: s.replay_concurrency,
            };
            let report = self
                .load(db, "replay", &api, scenario, s.run_cap, CLIENT_TIMEOUT)
                .await;
            results.replay = self.keep(&format!("{name} replay"), report);
        }
        if s.runs("storm") {
            let scenario = Scenario::Storm {
                keys: s.storm_keys,
                per_key: s.storm_per_key,
                concurrency: s.storm_concurrency,
            };
            let report = self
                .load(db, "storm", &api, scenario, s.run_cap, CLIENT_TIMEOUT)
                .await;
            if let Some(report) = self.keep(&format!("{name} storm"), report) {
                let provider_requests = self.sandbox_requests().await;
                results.storm = Some(Storm {
                    report,
                    provider_requests: self.keep("sandbox stats", provider_requests),
                });
            }
        }
        let stopped = api.stop().await;
        self.keep(&format!("{name}: payments-api"), stopped);
    }

    /// `payments-api migrate`.
    async fn migrate(&self, db: &BenchDb) -> Result<()> {
        Command::new(
            "payments-api",
            self.bin.api.clone(),
            self.out_dir
                .join(format!("{}-migrate.log", db.backend.name())),
        )
        .args(["migrate"])
        .env("DATABASE_URL", &db.url)
        .run(Duration::from_secs(120))
        .await
        .map(drop)
    }

    /// The release API on a free loopback port, in front of the sandbox.
    async fn start_api(&self, db: &BenchDb, pool: u32, label: &str) -> Result<Child> {
        let log = self
            .out_dir
            .join(format!("{}-api-{label}.log", db.backend.name()));
        let api = Command::new("payments-api", self.bin.api.clone(), log)
            .args(["serve"])
            .env("DATABASE_URL", &db.url)
            .env("DATABASE_MAX_CONNECTIONS", pool.to_string())
            .env("LISTEN_ADDR", "127.0.0.1:0")
            .env("GATEWAY_URL", &self.sandbox_url)
            .env("GATEWAY_SECRET_KEY", "sk_test_sandbox")
            .env("GATEWAY_TIMEOUT", GATEWAY_TIMEOUT)
            .env("LEASE", LEASE)
            .env("WITH_JOBS", "false")
            .env("JWT_HS256_SECRET", JWT_SECRET)
            .env("RUST_LOG", &self.settings.log_level)
            .serve()
            .await?;
        progress(&format!(
            "{}: payments-api (pool {pool}) on {}, pid {}",
            db.backend.name(),
            api.url,
            api.pid()
        ));
        Ok(api)
    }

    /// One load run against `api`, its JSON kept as
    /// `target/bench/<backend>-<label>.json`. An incorrect report is a
    /// failure of the bench but still returned, to be written down.
    async fn load(
        &mut self,
        db: &BenchDb,
        label: &str,
        api: &Child,
        scenario: Scenario,
        duration: Duration,
        timeout: Duration,
    ) -> Result<Report> {
        let name = db.backend.name();
        progress(&format!("{name} {label}: {scenario:?}"));
        let mut config = Config::new(api.url.clone(), self.token.clone(), scenario);
        config.sandbox_url = Some(self.sandbox_url.clone());
        config.database_url = Some(db.url.clone());
        config.duration = duration;
        config.timeout = timeout;
        // The bench owns the sandbox: a reset makes its counters this run's.
        config.reset_sandbox = true;
        let report = load::run(&config)
            .await
            .with_context(|| format!("{name} {label}: the load run could not run"))?;
        let json = self.out_dir.join(format!("{name}-{label}.json"));
        std::fs::write(&json, report.to_json())
            .with_context(|| format!("writing {}", json.display()))?;
        for line in report.to_text().lines() {
            eprintln!("    {line}");
        }
        if !report.correct {
            self.failures.push(format!(
                "{name} {label}: INCORRECT: {}",
                report.violations.join("; ")
            ));
        }
        Ok(report)
    }

    async fn sandbox_config(&self, config: serde_json::Value) -> Result<()> {
        self.http
            .post(format!("{}/_sandbox/config", self.sandbox_url))
            .json(&config)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .context("configuring the sandbox")?;
        Ok(())
    }

    /// Provider charge requests since the last reset (`/_sandbox/stats`).
    async fn sandbox_requests(&self) -> Result<u64> {
        let stats: serde_json::Value = self
            .http
            .get(format!("{}/_sandbox/stats", self.sandbox_url))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .context("reading the sandbox's stats")?
            .json()
            .await
            .context("the sandbox's stats")?;
        stats["requests"]
            .as_u64()
            .ok_or_else(|| anyhow!("no `requests` in the sandbox's stats: {stats}"))
    }

    /// The pgbench ceiling on its own fresh, migrated database.
    async fn pgbench(&mut self) -> Result<pgbench::Pgbench> {
        self.pgbench_on("pgbench").await
    }

    /// The pgbench ceiling, its output in `target/bench/<label>.log`.
    async fn pgbench_on(&self, label: &str) -> Result<pgbench::Pgbench> {
        let admin = self
            .pg_admin
            .clone()
            .ok_or_else(|| anyhow!("no PostgreSQL server"))?;
        let db = BenchDb::postgres(&admin, "pgbench").await?;
        let s = &self.settings;
        progress(&format!(
            "pgbench ceiling: {} clients, {} s ({})",
            s.concurrency,
            s.pgbench_seconds,
            pgbench::program().display()
        ));
        let outcome = async {
            self.migrate(&db).await?;
            pgbench::run(
                &self.root.join("tests/bench/charge.sql"),
                &db.url,
                s.concurrency,
                s.pgbench_seconds,
                self.out_dir.join(format!("{label}.log")),
            )
            .await
        }
        .await;
        db.drop_now().await;
        if let Ok(p) = &outcome {
            progress(&format!(
                "pgbench: {:.0} tps, latency avg {:?} ms, failed {:?}",
                p.tps, p.latency_avg_ms, p.failed
            ));
        }
        outcome
    }

    /// The throwaway cluster with the commit flush off (as the tests run
    /// it): the pgbench ceiling, then `new` on a fresh database; durable
    /// again afterwards, whatever happened.
    async fn fsync_off(&mut self) -> Result<results::FsyncOff> {
        let admin = self
            .pg_admin
            .clone()
            .ok_or_else(|| anyhow!("no PostgreSQL server"))?;
        progress("postgres fsync-off: fsync, synchronous_commit, full_page_writes off");
        database::set_durable(&admin, false).await?;
        let measured = async {
            let ceiling = self.pgbench_on("pgbench-fsync-off").await?;
            let db = BenchDb::postgres(&admin, "fsync_off").await?;
            let run = async {
                self.migrate(&db).await?;
                let api = self.start_api(&db, self.settings.pool, "fsync-off").await?;
                let scenario = Scenario::New {
                    requests: self.settings.new_requests,
                    concurrency: self.settings.concurrency,
                };
                let report = self
                    .load(
                        &db,
                        "new-fsync-off",
                        &api,
                        scenario,
                        self.settings.run_cap,
                        CLIENT_TIMEOUT,
                    )
                    .await;
                api.stop().await.context("payments-api (fsync-off)")?;
                report
            }
            .await;
            db.drop_now().await;
            Ok::<_, anyhow::Error>(results::FsyncOff {
                pgbench: ceiling,
                new: run?,
            })
        }
        .await;
        let restored = database::set_durable(&admin, true).await;
        let measured = measured?;
        restored?;
        Ok(measured)
    }

    /// `slow` on a fresh API with a pool of exactly 10, sampling its RSS.
    async fn slow(&mut self, db: &BenchDb) -> Result<Slow> {
        let s = self.settings.clone();
        let api = self.start_api(db, SLOW_POOL, "slow").await?;
        let pid = api.pid();
        let (stop, stopped) = watch::channel(false);
        let sampler = tokio::spawn(sample_rss(pid, stopped));
        let scenario = Scenario::Slow {
            in_flight: s.slow_in_flight,
            provider_latency: s.slow_latency,
            probe_concurrency: s.slow_probe_concurrency,
            probe_keys: s.slow_probe_keys,
            probe_interval: s.slow_probe_interval,
        };
        // Two provider latencies (the first call, then the retries' replays)
        // plus setup and backoff.
        let cap = s.slow_latency * 2 + Duration::from_secs(60);
        let report = self
            .load(db, "slow", &api, scenario, cap, s.slow_timeout)
            .await;
        let _ = stop.send(true);
        let rss_max_kb = sampler.await.ok().flatten();
        let vm_hwm_kb = status_kb(pid, "VmHWM");
        let log = api.log();
        let provider_requests = self.sandbox_requests().await.ok();
        api.stop().await.context("payments-api (slow)")?;
        let report = report?;
        let pool_timeouts = log
            .lines()
            .filter(|line| {
                let line = line.to_ascii_lowercase();
                line.contains("pool timed out") || line.contains("pooltimedout")
            })
            .count() as u64;
        let error_lines = log.lines().filter(|l| l.contains("ERROR")).count() as u64;
        progress(&format!(
            "slow: VmHWM {vm_hwm_kb:?} kB, max VmRSS {rss_max_kb:?} kB, pool timeouts {pool_timeouts}"
        ));
        Ok(Slow {
            report,
            vm_hwm_kb,
            rss_max_kb,
            pool_timeouts,
            error_lines,
            provider_requests,
        })
    }

    /// `prune`: seed expired records, then `new` without and with the pruner.
    async fn prune(&mut self, db: &BenchDb) -> Result<Prune> {
        let s = self.settings.clone();
        let name = db.backend.name();
        progress(&format!(
            "{name} prune: seeding {} expired records",
            s.prune_rows
        ));
        let seed = db.seed_expired(s.prune_rows).await?;
        progress(&format!(
            "{name} prune: seeded in {:.1} s",
            seed.as_secs_f64()
        ));
        let api = self.start_api(db, s.pool, "prune").await?;
        let scenario = || Scenario::New {
            requests: PRUNE_REQUESTS,
            concurrency: s.concurrency,
        };
        let baseline = self
            .load(
                db,
                "prune-baseline",
                &api,
                scenario(),
                s.prune_seconds,
                CLIENT_TIMEOUT,
            )
            .await?;

        let pruner = Command::new(
            "payments-jobs",
            self.bin.jobs.clone(),
            self.out_dir.join(format!("{name}-prune.log")),
        )
        .args(["prune", "--once"])
        .env("DATABASE_URL", &db.url)
        .env("LOG_FORMAT", "json");
        // The pruner's own tuning knobs pass through, for experiments.
        let pruner = ["PRUNE_BATCH", "PRUNE_PAUSE"]
            .into_iter()
            .filter_map(|key| Some((key, std::env::var(key).ok()?)))
            .fold(pruner, |command, (key, value)| command.env(key, value));
        let mut pruner = pruner.spawn()?;
        let prune_started = Instant::now();
        progress(&format!(
            "{name} prune: payments-jobs prune --once, pid {}",
            pruner.pid()
        ));
        let prune_done = async {
            let status = pruner.wait(PRUNE_CAP).await;
            (status, Instant::now())
        };
        let load_started = Instant::now();
        let run = async {
            let report = self
                .load(
                    db,
                    "prune-with",
                    &api,
                    scenario(),
                    s.prune_seconds,
                    CLIENT_TIMEOUT,
                )
                .await;
            (report, Instant::now())
        };
        let ((with_prune, load_ended), (status, prune_ended)) = tokio::join!(run, prune_done);
        let with_prune = with_prune?;
        api.stop().await.context("payments-api (prune)")?;
        let prune_ok = status.as_ref().is_ok_and(|s| s.success());
        let pass = prune_pass(&pruner.log());
        if !prune_ok {
            let why = match &status {
                Ok(status) => format!("exited {status}"),
                Err(e) => format!("{e:#}"),
            };
            self.failures.push(format!(
                "{name} prune: payments-jobs prune --once {why}:\n{}",
                process::tail(&pruner.log(), 20)
            ));
        }
        let remaining = db.count_prunable().await.ok();
        if remaining.is_some_and(|n| n > 0) {
            self.failures.push(format!(
                "{name} prune: {} expired records were left after the pass",
                remaining.unwrap_or_default()
            ));
        }
        let overlap = prune_ended
            .min(load_ended)
            .saturating_duration_since(load_started);
        let prune = Prune {
            seeded: s.prune_rows,
            seed_secs: seed.as_secs_f64(),
            baseline,
            with_prune,
            prune_wall_secs: prune_ended
                .saturating_duration_since(prune_started)
                .as_secs_f64(),
            prune_ok,
            deleted: pass.as_ref().and_then(|p| p["deleted"].as_u64()),
            batches: pass.as_ref().and_then(|p| p["batches"].as_u64()),
            prune_elapsed_ms: pass.as_ref().and_then(|p| p["elapsed_ms"].as_u64()),
            overlapped_whole_run: prune_ended >= load_ended,
            overlap_secs: overlap.as_secs_f64(),
            run_secs: load_ended
                .saturating_duration_since(load_started)
                .as_secs_f64(),
            remaining,
        };
        progress(&format!(
            "{name} prune: pruner {:.1} s, deleted {:?}, overlapped the whole run: {}",
            prune.prune_wall_secs, prune.deleted, prune.overlapped_whole_run
        ));
        Ok(prune)
    }

    /// `target/bench/summary.json` and the markdown.
    fn write(&self, results: &Results) -> Result<()> {
        let summary = self.out_dir.join("summary.json");
        let json = serde_json::to_string_pretty(results).context("encoding the summary")?;
        std::fs::write(&summary, json).with_context(|| format!("writing {}", summary.display()))?;
        let out = if self.settings.out.is_absolute() {
            self.settings.out.clone()
        } else {
            self.root.join(&self.settings.out)
        };
        let existing = std::fs::read_to_string(&out).ok();
        let analysis = markdown::kept_analysis(existing.as_deref());
        let text = markdown::render(results, &self.settings, &analysis);
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
        progress(&format!(
            "wrote {} and {}",
            out.display(),
            summary.display()
        ));
        Ok(())
    }
}

/// The `fields` of the pruner's `prune pass` JSON log line.
fn prune_pass(log: &str) -> Option<serde_json::Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|event| event["fields"]["message"] == "prune pass")
        .map(|event| event["fields"].clone())
}

/// The highest `VmRSS` of `pid`, sampled until `stop` changes.
async fn sample_rss(pid: u32, mut stop: watch::Receiver<bool>) -> Option<u64> {
    let mut max = None;
    loop {
        if let Some(kb) = status_kb(pid, "VmRSS") {
            max = Some(max.map_or(kb, |m: u64| m.max(kb)));
        }
        tokio::select! {
            () = tokio::time::sleep(RSS_EVERY) => {}
            _ = stop.changed() => break,
        }
    }
    max
}
