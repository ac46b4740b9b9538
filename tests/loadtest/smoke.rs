//! `payments-smoke` against the real API (it must pass) and against a
//! deliberately non-idempotent stand-in (it must fail), as a library call
//! and as the real binary.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use payments_api::config::KeyMode;
use payments_loadtest::smoke::{self, Check, Config};
use payments_tests::{AppOptions, Backend, TestApp, spawn_app};

use super::{non_idempotent_server, run_tool, sqlite_app};

const ALL_CHECKS: [Check; 8] = Check::ALL;

fn config_for(app: &TestApp) -> Config {
    let mut config = Config::new(&app.base_url, app.token("cus_smoke"));
    config.back_office_token = Some(back_office(app).into());
    config.database_url = Some(app.db.url.clone().into());
    config.timeout = Duration::from_secs(10);
    config
}

/// The back office's token the refund and capture checks act with.
fn back_office(app: &TestApp) -> String {
    app.back_office_token("ops_smoke", "refunds:write charges:capture")
}

/// Runs the real `payments-smoke` binary: (exit code, stdout, stderr).
async fn smoke_binary(args: &[&str]) -> (i32, String, String) {
    run_tool("payments-smoke", args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passes_against_the_real_server() {
    let app = sqlite_app(AppOptions::default()).await;

    let report = smoke::run(&config_for(&app)).await.unwrap();
    println!("{}", report.to_text());

    assert!(report.passed, "{}", report.to_text());
    let names: Vec<Check> = report.checks.iter().map(|c| c.name).collect();
    assert_eq!(names, ALL_CHECKS);
    assert!(report.skipped.is_empty());
    let db = report.check(Check::OneRowPerKey).unwrap();
    assert!(
        db.detail.contains("concurrent_same_key: 1 row(s)"),
        "{}",
        db.detail
    );
    // One charge per keyed operation (the refund check refunds
    // sequential_replay's), and the hold; the keyless request was refused;
    // one refund for the two refund requests, one capture for the two
    // capture requests.
    assert_eq!(app.db.charges().await, 3);
    assert_eq!(app.sandbox_charges().await.len(), 3);
    assert_eq!(app.sandbox_refunds().await.len(), 1);
    assert_eq!(app.db.refunds_with_status("succeeded").await, 1);
    let captures = app.sandbox_get("/_sandbox/captures").await;
    assert_eq!(captures["data"].as_array().map(Vec::len), Some(1));
    let capture = report.check(Check::AuthorizeCapture).unwrap();
    assert!(
        capture.detail.contains("captured once"),
        "{}",
        capture.detail
    );
}

/// Refunds are the back office's: without a back-office token the refund
/// check fails, saying which flag it needs, and nothing is refunded; with
/// `REFUNDS_BY_CUSTOMER` the customer's token refunds and the run passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_refund_check_needs_a_back_office_token_unless_customers_refund() {
    let app = sqlite_app(AppOptions::default()).await;
    let mut config = config_for(&app);
    config.back_office_token = None;
    let report = smoke::run(&config).await.unwrap();
    assert!(!report.passed, "{}", report.to_text());
    let refund = report.check(Check::RefundOnce).unwrap();
    assert!(!refund.passed);
    assert!(
        refund.detail.contains("--back-office-token"),
        "{}",
        refund.detail
    );
    assert!(app.sandbox_refunds().await.is_empty());

    let app = sqlite_app(AppOptions {
        refunds_by_customer: true,
        ..AppOptions::default()
    })
    .await;
    let mut config = config_for(&app);
    config.back_office_token = None;
    let report = smoke::run(&config).await.unwrap();
    assert!(report.passed, "{}", report.to_text());
    assert_eq!(app.sandbox_refunds().await.len(), 1);
    // Captures are the back office's alone: skipped, saying why.
    let skipped: Vec<Check> = report.skipped.iter().map(|s| s.name).collect();
    assert!(skipped.contains(&Check::AuthorizeCapture), "{skipped:?}");
}

/// A staging pipeline retries its smoke job: five runs in a row as one
/// customer, against a server with the default per-customer rate limit
/// (30 a minute, bursts of 10), all pass. Each run starts four operations;
/// past the burst, the smoke waits out the 429s (nothing stored) instead of
/// failing on them, and the server's budget is spent once per operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passes_five_times_in_a_row_against_the_default_rate_limit() {
    const RUNS: usize = 5;
    let app = sqlite_app(AppOptions {
        rate_limit: None,
        ..AppOptions::default()
    })
    .await;
    for run in 1..=RUNS {
        let report = smoke::run(&config_for(&app)).await.unwrap();
        println!("run {run}:\n{}", report.to_text());
        assert!(report.passed, "run {run}: {}", report.to_text());
        assert_eq!(report.checks.len(), ALL_CHECKS.len(), "run {run}");
    }
    // Two charges and a hold a run; one refund and one capture.
    assert_eq!(app.sandbox_charges().await.len(), 3 * RUNS);
    assert_eq!(app.db.charges().await, 3 * RUNS as i64);
    assert_eq!(app.sandbox_refunds().await.len(), RUNS);
    let captures = app.sandbox_get("/_sandbox/captures").await;
    assert_eq!(captures["data"].as_array().map(Vec::len), Some(RUNS));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passes_through_the_409_path_with_a_slow_provider() {
    let app = sqlite_app(AppOptions::slow_provider(400)).await;

    let report = smoke::run(&config_for(&app)).await.unwrap();

    assert!(report.passed, "{}", report.to_text());
    let concurrent = report.check(Check::ConcurrentSameKey).unwrap();
    assert!(
        concurrent.detail.contains("409 request_in_progress")
            && concurrent.detail.contains("replayed"),
        "the second request arrives while the first holds the key: {}",
        concurrent.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn optional_key_mode_passes_with_a_note_unless_keys_are_required() {
    let app = sqlite_app(AppOptions {
        key_mode: KeyMode::Optional,
        ..Default::default()
    })
    .await;
    let mut config = Config::new(&app.base_url, app.token("cus_smoke"));
    config.back_office_token = Some(back_office(&app).into());

    let lenient = smoke::run(&config).await.unwrap();
    println!("{}", lenient.to_text());
    assert!(lenient.passed, "{}", lenient.to_text());
    let missing = lenient.check(Check::MissingKey).unwrap();
    assert!(missing.detail.contains("optional"), "{}", missing.detail);
    assert!(missing.note.is_some());
    assert_eq!(lenient.skipped[0].name, Check::OneRowPerKey);

    config.require_key = true;
    let strict = smoke::run(&config).await.unwrap();
    assert!(!strict.passed);
    let failed: Vec<Check> = strict.failed().map(|c| c.name).collect();
    assert_eq!(failed, [Check::MissingKey]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fails_against_a_server_that_charges_every_request() {
    let (url, charges) = non_idempotent_server(Duration::from_millis(50)).await;

    let report = smoke::run(&Config::new(&url, "any-token")).await.unwrap();
    println!("{}", report.to_text());

    assert!(!report.passed, "{}", report.to_text());
    let concurrent = report.check(Check::ConcurrentSameKey).unwrap();
    assert!(!concurrent.passed);
    assert!(
        concurrent.detail.contains("two charges for one key"),
        "{}",
        concurrent.detail
    );
    let sequential = report.check(Check::SequentialReplay).unwrap();
    assert!(!sequential.passed);
    assert!(
        sequential.detail.contains("charged twice"),
        "{}",
        sequential.detail
    );
    assert!(!report.check(Check::KeyReuseOtherBody).unwrap().passed);
    // Two concurrent + two sequential + one reuse + one keyless + the
    // refund check's charge.
    assert_eq!(charges.load(Ordering::SeqCst), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_binary_exits_0_1_or_2_and_speaks_json() {
    // A correct server, with the database check: exit 0 and a JSON report.
    let app = sqlite_app(AppOptions::default()).await;
    let token = app.token("cus_smoke");
    let office = back_office(&app);
    let (code, stdout, stderr) = smoke_binary(&[
        "--base-url",
        &app.base_url,
        "--token",
        &token,
        "--back-office-token",
        &office,
        "--database-url",
        &app.db.url,
        "--json",
    ])
    .await;
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["passed"], true);
    let checks = json["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ALL_CHECKS.map(Check::name));
    assert!(
        checks
            .iter()
            .all(|c| c["passed"] == true && c["detail"].is_string())
    );

    // A server that charges every request: exit 1, the failures named.
    let (url, _) = non_idempotent_server(Duration::from_millis(50)).await;
    let (code, stdout, _) = smoke_binary(&["--base-url", &url, "--token", "t"]).await;
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("FAIL  concurrent_same_key"), "{stdout}");
    assert!(stdout.contains("FAIL  sequential_replay"), "{stdout}");
    assert!(stdout.contains("FAILED: "), "{stdout}");

    // Nothing listening: exit 2, nothing charged.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let (code, stdout, stderr) =
        smoke_binary(&["--base-url", &closed_url, "--token", "t", "--json"]).await;
    assert_eq!(code, 2, "stderr: {stderr}");
    assert!(stderr.contains("cannot reach"), "{stderr}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&stdout).unwrap()["passed"],
        false
    );

    // A refused token, and a database that does not exist: exit 2.
    let (code, _, stderr) = smoke_binary(&["--base-url", &app.base_url, "--token", "bad"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    let missing_db = format!(
        "sqlite://{}/no-such-dir/x.db",
        std::env::temp_dir().display()
    );
    let (code, _, stderr) = smoke_binary(&[
        "--base-url",
        &app.base_url,
        "--token",
        &token,
        "--database-url",
        &missing_db,
    ])
    .await;
    assert_eq!(code, 2, "{stderr}");

    // Bad usage: exit 2.
    let (code, _, _) = smoke_binary(&["--base-url", &app.base_url]).await;
    assert_eq!(code, 2);
}

/// The database check on every backend (PostgreSQL's `metadata` is JSONB).
async fn one_row_per_key_on(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let report = smoke::run(&config_for(&app)).await.unwrap();
    assert!(report.passed, "{backend:?}: {}", report.to_text());
    assert!(report.check(Check::OneRowPerKey).unwrap().passed);
}

payments_tests::backend_tests!(one_row_per_key_on);
