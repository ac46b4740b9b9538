//! `payments-jobs` as ops run it: real processes, real crashes.

use std::time::Duration;

use payments_api::config::DEV_JWT_SECRET;
use payments_tests::{Backend, Process, TestDb, backend_tests, charge_body, new_key, run_binary};
use serde_json::Value;

async fn sandbox_json(sandbox: &Process, path: &str) -> Value {
    reqwest::get(format!("{}{path}", sandbox.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn api(db: &TestDb, sandbox: &Process) -> Process {
    Process::start(
        "payments-api",
        &[],
        &[
            ("DATABASE_URL", &db.url),
            ("LISTEN_ADDR", "127.0.0.1:0"),
            ("GATEWAY_URL", &sandbox.url),
            ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
            ("GATEWAY_TIMEOUT", "3s"),
            ("LEASE", "4s"),
            ("JWT_HS256_SECRET", DEV_JWT_SECRET),
        ],
    )
    .await
}

/// `payments-jobs` with `args` against the test's database and sandbox;
/// asserts it exited 0 and returns its log.
async fn jobs(db: &TestDb, sandbox: &Process, args: &[&str]) -> String {
    let env = [
        ("DATABASE_URL", db.url.as_str()),
        ("GATEWAY_URL", &sandbox.url),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("GATEWAY_TIMEOUT", "3s"),
        ("LEASE", "4s"),
    ];
    let (ok, _, stderr) = run_binary("payments-jobs", args, &env).await;
    assert!(ok, "payments-jobs {args:?} failed:\n{stderr}");
    stderr
}

async fn reap_once(db: &TestDb, sandbox: &Process) {
    let stderr = jobs(db, sandbox, &["reap", "--once"]).await;
    assert!(stderr.contains("reap pass"), "{stderr}");
}

async fn post(api: &Process, key: &str) -> reqwest::Result<reqwest::Response> {
    let token =
        payments_api::auth::mint_hs256(DEV_JWT_SECRET, "cus_crash", Duration::from_secs(600))
            .unwrap();
    api.post_charge(&token, key, &charge_body(4900, "tok_visa"))
        .await
}

/// `kill -9` of the API while the provider call is in flight, no client
/// retry: after the lease expires, `payments-jobs reap --once` finishes the
/// record with the provider's real outcome, and the card was charged once.
async fn crash_mid_call_is_recovered_by_the_reaper(backend: Backend) {
    let Some(db) = TestDb::new(backend, 2).await else {
        return;
    };
    let sandbox = Process::start(
        "payments-sandbox",
        &["--listen", "127.0.0.1:0", "--latency-ms", "1500"],
        &[],
    )
    .await;
    let mut api = api(&db, &sandbox).await;
    let key = new_key();
    let request = {
        let api_url = api.url.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let api = Process::detached(api_url);
            post(&api, &key).await.map(|r| r.status())
        })
    };
    // Wait until the provider call is in flight, then crash.
    let mut in_flight = false;
    for _ in 0..100 {
        if sandbox_json(&sandbox, "/_sandbox/stats").await["in_flight"] == 1 {
            in_flight = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(in_flight, "the provider call never started");
    api.kill().await;
    assert!(request.await.unwrap().is_err(), "the client got no answer");
    assert_eq!(db.records_for_key(&key, "in_progress", None).await, 1);

    // The lease (4 s) expires; the provider finished its 1.5 s charge long before.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    reap_once(&db, &sandbox).await;
    assert_charged_once(&db, &sandbox, &key).await;
    assert_eq!(db.charges().await, 1);
}

/// The key's record answers 201, from the one charge the provider made.
async fn assert_charged_once(db: &TestDb, sandbox: &Process, key: &str) {
    assert_eq!(db.records_for_key(key, "complete", Some(201)).await, 1);
    let charges = sandbox_json(sandbox, "/_sandbox/charges").await;
    assert_eq!(
        charges["data"].as_array().map(Vec::len),
        Some(1),
        "{charges}"
    );
    assert_eq!(db.charges_with_status("succeeded").await, 1);
}

/// The provider charges and drops the connection; the client gets 503 and
/// never comes back: the reaper finishes it with that one charge.
async fn dropped_answer_is_recovered_by_the_reaper(backend: Backend) {
    let Some(db) = TestDb::new(backend, 2).await else {
        return;
    };
    let sandbox = Process::start(
        "payments-sandbox",
        &["--listen", "127.0.0.1:0", "--drop-after-charge"],
        &[],
    )
    .await;
    let api = api(&db, &sandbox).await;
    let key = new_key();
    assert_eq!(post(&api, &key).await.unwrap().status(), 503);
    assert_eq!(db.records_for_key(&key, "in_progress", None).await, 1);
    reap_once(&db, &sandbox).await;
    assert_charged_once(&db, &sandbox, &key).await;
}

/// `payments-jobs reconcile --dry-run` and `--once` run as processes and
/// report their pass.
async fn reconcile_runs_as_a_process(backend: Backend) {
    let Some(db) = TestDb::new(backend, 2).await else {
        return;
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let dry = jobs(&db, &sandbox, &["reconcile", "--dry-run"]).await;
    assert!(
        dry.contains("reconcile pass") && dry.contains("dry_run=true"),
        "{dry}"
    );
    let once = jobs(&db, &sandbox, &["reconcile", "--once"]).await;
    assert!(
        once.contains("reconcile pass") && once.contains("dry_run=false"),
        "{once}"
    );
    // Its counts are fields of their own, as docs/operations.md lists them.
    for field in [
        "succeeded=0",
        "needs_person=0",
        "orphans_new=0",
        "orphans_open=0",
    ] {
        assert!(once.contains(field), "no {field} in {once}");
    }
}

/// `payments-jobs run` exits 0 within a few seconds of SIGTERM.
async fn run_stops_cleanly_on_sigterm(backend: Backend) {
    let Some(db) = TestDb::new(backend, 2).await else {
        return;
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let (mut jobs, _stdout) = Process::spawn(
        "payments-jobs",
        &["run"],
        &[
            ("DATABASE_URL", &db.url),
            ("GATEWAY_URL", &sandbox.url),
            ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
            ("REAP_EVERY", "200ms"),
        ],
    );
    assert!(
        jobs.wait_for_log(&["reap pass"]).await,
        "no pass ran:\n{}",
        jobs.log()
    );
    let status = jobs.terminate(Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}

backend_tests!(
    crash_mid_call_is_recovered_by_the_reaper,
    dropped_answer_is_recovered_by_the_reaper,
    reconcile_runs_as_a_process,
    run_stops_cleanly_on_sigterm,
);

/// Refused settings, named in the message.
#[tokio::test]
async fn bad_job_settings_are_refused() {
    let base = [
        ("DATABASE_URL", "sqlite::memory:"),
        ("GATEWAY_URL", "http://127.0.0.1:9"),
        ("GATEWAY_SECRET_KEY", "k"),
    ];
    for (args, needle) in [
        (&["reap", "--once", "--abandon-after=10s"][..], "LEASE"),
        // 23 h + the 1 h margin reaches the 24 h key retention.
        (
            &["reap", "--once", "--abandon-after=23h"][..],
            "PROVIDER_KEY_RETENTION",
        ),
        (
            &["reap", "--once", "--provider-key-margin=30s"][..],
            "LEASE + GATEWAY_TIMEOUT",
        ),
    ] {
        let (ok, _, stderr) = run_binary("payments-jobs", args, &base).await;
        assert!(!ok && stderr.contains(needle), "{args:?}: {stderr}");
    }
    let (ok, _, stderr) = run_binary(
        "payments-jobs",
        &["reap", "--once"],
        &[("DATABASE_URL", "sqlite::memory:")],
    )
    .await;
    assert!(!ok && stderr.contains("GATEWAY_URL"), "{stderr}");
    // The reconciler's dry run asks the provider: it needs one too, and says why.
    let (ok, _, stderr) = run_binary(
        "payments-jobs",
        &["reconcile", "--dry-run"],
        &[("DATABASE_URL", "sqlite::memory:")],
    )
    .await;
    assert!(
        !ok && stderr.contains("GATEWAY_URL") && stderr.contains("dry run"),
        "{stderr}"
    );
    // The pruner alone needs no provider.
    let (ok, _, stderr) = run_binary(
        "payments-jobs",
        &["prune", "--once"],
        &[("DATABASE_URL", "sqlite::memory:")],
    )
    .await;
    assert!(ok, "{stderr}");
}

/// A SQLite database file for a test that runs only on SQLite.
async fn sqlite_db() -> TestDb {
    TestDb::new(Backend::Sqlite, 2)
        .await
        .expect("SQLite is always there")
}

/// `payments-jobs reap --dry-run` only reads the database: it needs no
/// GATEWAY_URL, lists what a pass would take over, and changes nothing.
#[tokio::test]
async fn reap_dry_run_needs_no_gateway() {
    let db = sqlite_db().await;
    // An in-progress record whose lease expired long ago.
    db.execute(
        "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
         state, lease_token, locked_until, charge_id, created_at, expires_at) \
         VALUES ('stuck-1', 'POST /api/charges', 'cus_old', \
         '0000000000000000000000000000000000000000000000000000000000000000', 'in_progress', \
         'token', 0, 'ch_stuck_1', 0, 1)",
        "",
        "",
    )
    .await;
    let env = [("DATABASE_URL", db.url.as_str())];
    let (ok, _, stderr) = run_binary("payments-jobs", &["reap", "--dry-run"], &env).await;
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("dry run: would take over") && stderr.contains("would_reap=1"),
        "{stderr}"
    );
    assert_eq!(db.records_for_key("stuck-1", "in_progress", None).await, 1);
}

/// The address `payments-jobs` logged it serves /metrics on.
fn metrics_addr(log: &str) -> String {
    let line = log.lines().find(|l| l.contains("serving /metrics"));
    let addr = line.and_then(|l| l.split("addr=").nth(1));
    addr.map(|a| a.trim().to_owned())
        .unwrap_or_else(|| panic!("no metrics address in:\n{log}"))
}

/// `payments-jobs run` with METRICS_ADDR serves /metrics: the jobs' own
/// series, described and at zero from the start, and the build info.
#[tokio::test]
async fn run_serves_metrics() {
    let db = sqlite_db().await;
    let (mut jobs, _stdout) = Process::spawn(
        "payments-jobs",
        &["run"],
        &[
            ("DATABASE_URL", &db.url),
            // Nothing to reap or reconcile: no provider call is made.
            ("GATEWAY_URL", "http://127.0.0.1:9"),
            ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
            // Port 0: a free port, read back from the log.
            ("METRICS_ADDR", "127.0.0.1:0"),
        ],
    );
    assert!(
        jobs.wait_for_log(&["serving /metrics"]).await,
        "no /metrics:\n{}",
        jobs.log()
    );
    let addr = metrics_addr(&jobs.log());
    let response = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    for line in [
        "# HELP payments_reaper_records_total ",
        "payments_reaper_records_total{result=\"reaped\"} ",
        "# HELP payments_pruned_records_total ",
        "payments_pruned_records_total ",
        "# HELP payments_reconciled_total ",
        "# HELP payments_build_info ",
        "payments_build_info{version=\"",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "no {line:?} in:\n{text}"
        );
    }
    let build = format!("commit=\"{}\"}} 1", payments_app::telemetry::GIT_COMMIT);
    assert!(text.contains(&build), "no {build} in:\n{text}");
    // The API's own metrics are not the jobs'.
    assert!(
        !text.contains("payments_idempotent_replays_total"),
        "{text}"
    );
    let status = jobs.terminate(Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}

/// A METRICS_ADDR that cannot be bound stops `run` at start, saying so.
#[tokio::test]
async fn a_taken_metrics_addr_is_a_start_error() {
    let db = sqlite_db().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let env = [
        ("DATABASE_URL", db.url.as_str()),
        ("GATEWAY_URL", "http://127.0.0.1:9"),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("METRICS_ADDR", &addr),
    ];
    let (ok, _, stderr) = run_binary("payments-jobs", &["run"], &env).await;
    assert!(!ok, "started with {addr} taken:\n{stderr}");
    assert!(
        stderr.contains(&format!("binding METRICS_ADDR {addr}")),
        "{stderr}"
    );
    drop(taken);
}

/// An `IDEMPOTENCY_TTL` below 1 h stops `payments-api` and `payments-jobs`
/// alike before they start (clients are told how long keys are remembered
/// and resume for that long), unless `ALLOW_SHORT_TTL=true`, which is for
/// tests and says so in a warning at start.
#[tokio::test]
async fn a_short_ttl_is_refused_unless_allowed_for_tests() {
    let short = [
        ("DATABASE_URL", "sqlite::memory:"),
        ("IDEMPOTENCY_TTL", "5s"),
    ];
    let (ok, _, stderr) = run_binary("payments-jobs", &["prune", "--once"], &short).await;
    assert!(
        !ok && stderr.contains("IDEMPOTENCY_TTL (5s) must be at least 1h")
            && stderr.contains("ALLOW_SHORT_TTL"),
        "payments-jobs: {stderr}"
    );
    let api = [
        ("DATABASE_URL", "sqlite::memory:"),
        ("IDEMPOTENCY_TTL", "5s"),
        ("JWT_HS256_SECRET", "0123456789abcdef0123456789abcdef-jobs"),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"),
    ];
    let (ok, _, stderr) = run_binary("payments-api", &[], &api).await;
    assert!(
        !ok && stderr.contains("IDEMPOTENCY_TTL (5s) must be at least 1h"),
        "payments-api: {stderr}"
    );
    let allowed = [
        ("DATABASE_URL", "sqlite::memory:"),
        ("IDEMPOTENCY_TTL", "2m"),
        ("ALLOW_SHORT_TTL", "true"),
    ];
    let (ok, stdout, stderr) = run_binary("payments-jobs", &["prune", "--once"], &allowed).await;
    assert!(ok, "allowed for tests: {stderr}");
    let log = format!("{stdout}{stderr}");
    assert!(
        log.contains("WARN") && log.contains("ALLOW_SHORT_TTL") && log.contains("For tests only"),
        "the warning at start: {log}"
    );
}
