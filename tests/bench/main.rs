//! # payments-bench: `make bench`
//!
//! Measures the release binaries on this machine and writes
//! `docs/benchmarks.md` (plus the raw reports in `target/bench/`): the
//! machine's facts; then per backend (a fresh SQLite file; a fresh database
//! on the throwaway PostgreSQL cluster, or on `BENCH_POSTGRES_URL`), with the
//! release `payments-api` in front of the release `payments-sandbox` and the
//! `payments-load` library, the scenarios `tests/bench/template.md` describes
//! (on PostgreSQL first the pgbench ceiling, `tests/bench/charge.sql`); then
//! the markdown, the targets judged from the figures and the hand-written
//! analysis kept.
//!
//! The exit status is 1 when a load run was incorrect (the charges do not
//! add up, a status its scenario forbids) or a process failed, 2 when the
//! bench could not run at all; a missed performance target is reported, not
//! a failure. The processes and databases are the tests' own
//! ([`payments_tests::Process`], [`payments_tests::TestDb`]): every child is
//! killed and every database dropped on every exit path.
//!
//! # Layout
//! - `settings`: the `BENCH_*` knobs.
//! - `machine`: the facts, and CPU per charge.
//! - `database`: versions, seeding for `prune`, durability.
//! - `pgbench`: the ceiling.
//! - `results`: what was measured, as `summary.json` has it.
//! - `markdown`: `docs/benchmarks.md`.

mod database;
mod machine;
mod markdown;
mod pgbench;
mod results;
mod settings;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use payments_loadtest::load::{self, Config, Report, Scenario};
use payments_tests::{Backend, Process, TestDb};
use tokio::sync::watch;

use machine::{Machine, Snapshot};
use results::{ApiSetup, BackendResults, FsyncOff, Prune, Results, Slow, Storm};
use settings::{SLOW_POOL, Settings};

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
/// A load run: its scenario, duration cap and per-attempt timeout.
type Run = (Scenario, Duration, Duration);
/// How often the API's RSS is sampled during `slow`.
const RSS_EVERY: Duration = Duration::from_millis(250);

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
        Ok(()) = tokio::signal::ctrl_c() => Err(anyhow!("interrupted by SIGINT; children stopped")),
        Some(()) = async { term.as_mut().ok()?.recv().await } => {
            Err(anyhow!("interrupted by SIGTERM; children stopped"))
        }
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
    let started = Instant::now();
    let settings = Settings::from_env()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // `target/bench`, beside the release binaries' `target/release`.
    let exe = std::env::current_exe()?;
    let out_dir = exe
        .ancestors()
        .nth(2)
        .context("no target dir")?
        .join("bench");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let changed = settings.changed();
    let backends: Vec<&str> = settings.backends.iter().map(|b| b.name()).collect();
    let (scenarios, knobs) = (&settings.scenarios, changed.join(" "));
    progress!("payments-bench: backends {backends:?}, scenarios {scenarios:?}, changed: {knobs}");

    let mut machine = Machine::collect(&root);
    machine.sqlite = database::sqlite_version()
        .await
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let (pg_admin, postgres_server) = if settings.backends.contains(&Backend::Postgres) {
        let (url, what) = postgres_admin(&settings).await?;
        machine.postgres = database::pg_one(&url, "SELECT version()").await?;
        (Some(url), what)
    } else {
        (None, "not used".to_owned())
    };
    progress!("machine: {machine:?}");

    let log = Some(out_dir.join("sandbox.log"));
    let listen = ["--listen", "127.0.0.1:0"];
    let sandbox = Process::try_start("payments-sandbox", &listen, &[], log).await;
    let sandbox = sandbox.map_err(anyhow::Error::msg)?;
    progress!("sandbox on {}", sandbox.url);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let token = payments_api::auth::mint_hs256(JWT_SECRET, CUSTOMER, Duration::from_secs(86_400))
        .map_err(|e| anyhow!("minting the bench's token: {e}"))?;
    let mut bench = Bench {
        settings,
        root,
        out_dir,
        sandbox,
        http,
        token,
        pg_admin,
        pgbench: None,
        failures: Vec::new(),
    };
    bench
        .sandbox_call("config", Some(serde_json::json!({"latency_ms": 0})))
        .await?;

    let mut backends = Vec::new();
    for backend in bench.settings.backends.clone() {
        backends.push(bench.backend(backend).await);
    }
    let sandbox = std::mem::replace(&mut bench.sandbox, Process::detached(String::new()));
    if let Err(e) = sandbox.stop().await {
        bench.fail("sandbox", &anyhow!(e));
    }

    let s = &bench.settings;
    let results = Results {
        machine,
        knobs: s.knobs.clone(),
        changed,
        api: ApiSetup {
            pool: s.pool,
            slow_pool: SLOW_POOL,
            gateway_timeout: GATEWAY_TIMEOUT,
            lease: LEASE,
            log_level: s.log_level.clone(),
        },
        postgres_server,
        pgbench: bench.pgbench.take(),
        backends,
        failures: bench.failures.clone(),
        elapsed_secs: started.elapsed().as_secs_f64(),
    };
    bench.write(&results)?;
    if results.failures.is_empty() {
        progress!("done: every load run was correct");
        return Ok(true);
    }
    progress!("done, with {} failure(s):", results.failures.len());
    for failure in &results.failures {
        eprintln!("  - {}", failure.lines().next().unwrap_or_default());
    }
    Ok(false)
}

/// `BENCH_POSTGRES_URL`, else the throwaway cluster (started here; it
/// blocks, so off the runtime's threads). Never `TEST_POSTGRES_URL`.
async fn postgres_admin(settings: &Settings) -> Result<(String, String)> {
    if let Some(url) = &settings.postgres_url {
        return Ok((url.clone(), "the server of `BENCH_POSTGRES_URL`".to_owned()));
    }
    progress!("starting the throwaway PostgreSQL cluster");
    let url = tokio::task::spawn_blocking(payments_tests::postgres::throwaway_admin_url)
        .await?
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

/// What every step shares.
#[derive(Debug)]
struct Bench {
    settings: Settings,
    root: PathBuf,
    out_dir: PathBuf,
    sandbox: Process,
    http: reqwest::Client,
    token: String,
    pg_admin: Option<String>,
    pgbench: Option<pgbench::Pgbench>,
    failures: Vec<String>,
}

impl Bench {
    fn fail(&mut self, what: &str, e: &anyhow::Error) {
        progress!("FAILED {what}: {e:#}");
        self.failures.push(format!("{what}: {e:#}"));
    }

    /// `Some` on success; a failure is recorded and the bench goes on.
    fn keep<T>(&mut self, what: &str, result: Result<T>) -> Option<T> {
        result.map_err(|e| self.fail(what, &e)).ok()
    }

    /// A fresh, migrated database: a SQLite file, or on the PostgreSQL server.
    async fn database(&self, backend: Backend) -> Result<TestDb> {
        let admin = match backend {
            Backend::Sqlite => None,
            _ => Some(self.pg_admin.clone().context("no PostgreSQL server")?),
        };
        Ok(TestDb::on_server(backend, admin, 1).await)
    }

    /// Every selected scenario on one backend. Never fails: what went wrong
    /// is in `failures`, what was measured in the result.
    async fn backend(&mut self, backend: Backend) -> BackendResults {
        let name = backend.name();
        let mut results = BackendResults {
            backend: name,
            ..BackendResults::default()
        };
        let db = self.database(backend).await;
        let Some(db) = self.keep(&format!("{name}: creating the database"), db) else {
            return results;
        };
        results.database = db.describe();
        progress!("{name}: {}", results.database);
        if backend == Backend::Postgres && self.settings.runs("pgbench") {
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
        if backend == Backend::Postgres && self.settings.runs("fsync-off") && throwaway {
            let fsync_off = self.fsync_off().await;
            results.fsync_off = self.keep("postgres fsync-off", fsync_off);
        }
        results
    }

    /// `new`, `replay` and `storm` on one API process.
    async fn main_group(&mut self, db: &TestDb, results: &mut BackendResults) {
        let s = self.settings.clone();
        if !["new", "replay", "storm"]
            .iter()
            .any(|scenario| s.runs(scenario))
        {
            return;
        }
        let name = db.backend.name();
        let api = self.start_api(db, s.pool, "main").await;
        let Some(api) = self.keep(&format!("{name}: starting payments-api"), api) else {
            return;
        };
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
        for (label, scenario) in scenarios.into_iter().filter(|(label, _)| s.runs(label)) {
            let before = Snapshot::take(api.pid(), self.sandbox.pid());
            let report = self
                .load(db, label, &api, (scenario, s.run_cap, CLIENT_TIMEOUT))
                .await;
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
                    let provider_requests = self.sandbox_requests().await;
                    let provider_requests = self.keep("sandbox stats", provider_requests);
                    results.storm = Some(Storm {
                        report,
                        provider_requests,
                    });
                }
            }
        }
        let stopped = stop(api, "payments-api").await;
        self.keep(&format!("{name}: payments-api"), stopped);
    }

    /// The release API on a free loopback port, in front of the sandbox.
    async fn start_api(&self, db: &TestDb, pool: u32, label: &str) -> Result<Process> {
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
        progress!(
            "{name}: payments-api (pool {pool}) on {}, pid {}",
            api.url,
            api.pid()
        );
        Ok(api)
    }

    /// One load run against `api` (its scenario, duration cap and
    /// per-attempt timeout), its JSON kept as
    /// `target/bench/<backend>-<label>.json`. An incorrect report is a
    /// failure of the bench but still returned, to be written down.
    async fn load(&mut self, db: &TestDb, label: &str, api: &Process, run: Run) -> Result<Report> {
        let (scenario, duration, timeout) = run;
        let name = db.backend.name();
        progress!("{name} {label}: {scenario:?}");
        let mut config = Config::new(api.url.clone(), self.token.clone(), scenario);
        config.sandbox_url = Some(self.sandbox.url.clone());
        config.database_url = Some(db.url.clone());
        config.duration = duration;
        config.timeout = timeout;
        // The bench owns the sandbox: a reset makes its counters this run's.
        config.reset_sandbox = true;
        let report = load::run(&config).await;
        let report =
            report.with_context(|| format!("{name} {label}: the load run could not run"))?;
        let json = self.out_dir.join(format!("{name}-{label}.json"));
        std::fs::write(&json, report.to_json())
            .with_context(|| format!("writing {}", json.display()))?;
        for line in report.to_text().lines() {
            eprintln!("    {line}");
        }
        if !report.correct {
            let violations = report.violations.join("; ");
            self.failures
                .push(format!("{name} {label}: INCORRECT: {violations}"));
        }
        Ok(report)
    }

    /// `POST /_sandbox/<path>` with a body, or `GET` without one.
    async fn sandbox_call(
        &self,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value> {
        let url = format!("{}/_sandbox/{path}", self.sandbox.url);
        let request = match body {
            Some(body) => self.http.post(url).json(&body),
            None => self.http.get(url),
        };
        let response = request
            .send()
            .await
            .and_then(reqwest::Response::error_for_status);
        let response = response.with_context(|| format!("the sandbox's {path}"))?;
        Ok(response.json().await.unwrap_or_default())
    }

    /// Provider charge requests since the last reset (`/_sandbox/stats`).
    async fn sandbox_requests(&self) -> Result<u64> {
        let stats = self.sandbox_call("stats", None).await?;
        let requests = stats["requests"].as_u64();
        requests.ok_or_else(|| anyhow!("no `requests` in the sandbox's stats: {stats}"))
    }

    /// The pgbench ceiling on its own fresh, migrated database, its output
    /// in `target/bench/<label>.log`.
    async fn pgbench(&self, label: &str) -> Result<pgbench::Pgbench> {
        let db = self.database(Backend::Postgres).await?;
        let s = &self.settings;
        let clients = s.concurrency;
        let program = pgbench::program();
        let program = program.display();
        progress!(
            "pgbench ceiling: {clients} clients, {} s ({program})",
            s.pgbench_seconds
        );
        let script = self.root.join("tests/bench/charge.sql");
        let log = self.out_dir.join(format!("{label}.log"));
        let ceiling = pgbench::run(&script, &db.url, clients, s.pgbench_seconds, log).await?;
        let (tps, latency, failed) = (ceiling.tps, ceiling.latency_avg_ms, ceiling.failed);
        progress!("pgbench: {tps:.0} tps, latency avg {latency:?} ms, failed {failed:?}");
        Ok(ceiling)
    }

    /// The throwaway cluster with the commit flush off (as the tests run
    /// it): the pgbench ceiling, then `new` on a fresh database; durable
    /// again afterwards, whatever happened.
    async fn fsync_off(&mut self) -> Result<FsyncOff> {
        let admin = self.pg_admin.clone().context("no PostgreSQL server")?;
        progress!("postgres fsync-off: fsync, synchronous_commit, full_page_writes off");
        database::set_durable(&admin, false).await?;
        let measured = async {
            let pgbench = self.pgbench("pgbench-fsync-off").await?;
            let db = self.database(Backend::Postgres).await?;
            let s = self.settings.clone();
            let api = self.start_api(&db, s.pool, "fsync-off").await?;
            let run = (new(s.new_requests, &s), s.run_cap, CLIENT_TIMEOUT);
            let new = self.load(&db, "new-fsync-off", &api, run).await;
            stop(api, "payments-api (fsync-off)").await?;
            Ok::<_, anyhow::Error>(FsyncOff { pgbench, new: new? })
        }
        .await;
        let restored = database::set_durable(&admin, true).await;
        let measured = measured?;
        restored?;
        Ok(measured)
    }

    /// `slow` on a fresh API with a pool of exactly 10, sampling its RSS.
    async fn slow(&mut self, db: &TestDb) -> Result<Slow> {
        let s = self.settings.clone();
        let api = self.start_api(db, SLOW_POOL, "slow").await?;
        let pid = api.pid();
        let (done, stopped) = watch::channel(false);
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
            .load(db, "slow", &api, (scenario, cap, s.slow_timeout))
            .await;
        let _ = done.send(true);
        let rss_max_kb = sampler.await.ok().flatten();
        let vm_hwm_kb = status_kb(pid, "VmHWM");
        let log = api.log();
        let provider_requests = self.sandbox_requests().await.ok();
        stop(api, "payments-api (slow)").await?;
        let report = report?;
        let count = |matches: fn(&str) -> bool| log.lines().filter(|l| matches(l)).count() as u64;
        let pool_timeouts = count(|line| {
            let line = line.to_ascii_lowercase();
            line.contains("pool timed out") || line.contains("pooltimedout")
        });
        let error_lines = count(|line| line.contains("ERROR"));
        progress!(
            "slow: VmHWM {vm_hwm_kb:?} kB, max VmRSS {rss_max_kb:?} kB, pool timeouts {pool_timeouts}"
        );
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
    async fn prune(&mut self, db: &TestDb) -> Result<Prune> {
        let s = self.settings.clone();
        let name = db.backend.name();
        progress!("{name} prune: seeding {} expired records", s.prune_rows);
        let seed = database::seed_expired(db, s.prune_rows).await?;
        progress!("{name} prune: seeded in {:.1} s", seed.as_secs_f64());
        let api = self.start_api(db, s.pool, "prune").await?;
        let run = || (new(PRUNE_REQUESTS, &s), s.prune_seconds, CLIENT_TIMEOUT);
        let baseline = self.load(db, "prune-baseline", &api, run()).await?;

        // The pruner's own tuning knobs pass through, for experiments.
        let tuning: Vec<(&str, String)> = ["PRUNE_BATCH", "PRUNE_PAUSE"]
            .into_iter()
            .filter_map(|key| Some((key, std::env::var(key).ok()?)))
            .collect();
        let mut env = vec![("DATABASE_URL", db.url.as_str()), ("LOG_FORMAT", "json")];
        env.extend(tuning.iter().map(|(k, v)| (*k, v.as_str())));
        let log = Some(self.out_dir.join(format!("{name}-prune.log")));
        let spawned = Process::spawn_logged("payments-jobs", &["prune", "--once"], &env, log);
        let (mut pruner, _stdout) = spawned.map_err(anyhow::Error::msg)?;
        let prune_started = Instant::now();
        progress!(
            "{name} prune: payments-jobs prune --once, pid {}",
            pruner.pid()
        );
        let prune_done = async { (pruner.wait(PRUNE_CAP).await, Instant::now()) };
        let load_started = Instant::now();
        let run = async {
            let with = self.load(db, "prune-with", &api, run()).await;
            (with, Instant::now())
        };
        let ((with_prune, load_ended), (status, prune_ended)) = tokio::join!(run, prune_done);
        let with_prune = with_prune?;
        stop(api, "payments-api (prune)").await?;
        let prune_ok = status.as_ref().is_ok_and(|s| s.success());
        let log = pruner.log();
        let pass = prune_pass(&log);
        if !prune_ok {
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            let why = format!("{status:?}:\n{}", tail.join("\n"));
            self.failures
                .push(format!("{name} prune: payments-jobs prune --once {why}"));
        }
        let remaining = database::count_prunable(db).await.ok();
        if let Some(left) = remaining.filter(|n| *n > 0) {
            let failure = format!("{name} prune: {left} expired records were left after the pass");
            self.failures.push(failure);
        }
        let overlap = prune_ended
            .min(load_ended)
            .saturating_duration_since(load_started);
        let pass_field = |key: &str| pass.as_ref().and_then(|p| p[key].as_u64());
        let prune = Prune {
            seeded: s.prune_rows,
            seed_secs: seed.as_secs_f64(),
            baseline,
            with_prune,
            prune_wall_secs: prune_ended
                .saturating_duration_since(prune_started)
                .as_secs_f64(),
            prune_ok,
            deleted: pass_field("deleted"),
            batches: pass_field("batches"),
            prune_elapsed_ms: pass_field("elapsed_ms"),
            overlapped_whole_run: prune_ended >= load_ended,
            overlap_secs: overlap.as_secs_f64(),
            run_secs: load_ended
                .saturating_duration_since(load_started)
                .as_secs_f64(),
            remaining,
        };
        progress!(
            "{name} prune: pruner {:.1} s, deleted {:?}, overlapped the whole run: {}",
            prune.prune_wall_secs,
            prune.deleted,
            prune.overlapped_whole_run
        );
        Ok(prune)
    }

    /// `target/bench/summary.json` and the markdown.
    fn write(&self, results: &Results) -> Result<()> {
        let summary = self.out_dir.join("summary.json");
        let json = serde_json::to_string_pretty(results).context("encoding the summary")?;
        std::fs::write(&summary, json).with_context(|| format!("writing {}", summary.display()))?;
        let out = self.root.join(&self.settings.out);
        let existing = std::fs::read_to_string(&out).ok();
        let analysis = markdown::kept_analysis(existing.as_deref());
        let text = markdown::render(results, &analysis)?;
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
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

/// Kills a server that should still be running.
async fn stop(process: Process, what: &str) -> Result<()> {
    process.stop().await.map_err(|e| anyhow!("{what}: {e}"))
}

/// The `fields` of the pruner's `prune pass` JSON log line.
fn prune_pass(log: &str) -> Option<serde_json::Value> {
    let events = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok());
    let mut passes = events.filter(|event| event["fields"]["message"] == "prune pass");
    passes.next().map(|event| event["fields"].clone())
}

/// A field of `/proc/<pid>/status` in kB (`VmRSS`, `VmHWM`).
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))?;
    line.split_whitespace().next()?.parse().ok()
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
