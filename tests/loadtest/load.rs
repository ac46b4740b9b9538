//! `payments-load` at small scale against the real API, sandbox and SQLite:
//! every scenario must end correct, with the charges counted at the sandbox
//! and in the database equal to the operations answered 201. Counts and
//! statuses only: benchmarks are not tests, so nothing here asserts a time.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use payments_loadtest::load::{
    self, Config, EXIT_CORRECT, EXIT_ERROR, LoadError, Mark, Marker, Report, Scenario, StoppedBy,
};
use payments_tests::{AppOptions, Backend, TestApp, spawn_app};

use super::{non_idempotent_server, run_tool, sqlite_app};

fn config_for(app: &TestApp, scenario: Scenario) -> Config {
    let mut config = Config::new(&app.base_url, app.token("cus_load"), scenario);
    let back_office = app.back_office_token("ops_load", "refunds:write charges:capture");
    config.back_office_token = Some(back_office.into());
    config.sandbox_url = Some(app.sandbox.url());
    config.database_url = Some(app.db.url.clone().into());
    config.timeout = Duration::from_secs(10);
    config.duration = Duration::from_secs(60);
    config
}

fn statuses(report: &Report, stream: &str) -> Vec<(u16, u64)> {
    let stream = report
        .stream(stream)
        .unwrap_or_else(|| panic!("no stream {stream}"));
    stream.statuses.iter().map(|(s, n)| (*s, *n)).collect()
}

fn assert_correct(report: &Report) {
    println!("{}", report.to_text());
    assert!(report.correct, "{}", report.to_text());
    assert_eq!(report.violations_total, 0);
    assert_eq!(report.exit_code(), EXIT_CORRECT);
    assert_eq!(report.operations.unfinished, 0);
    assert_eq!(report.operations.charged_twice, 0);
    for stream in &report.streams {
        assert!(
            stream.statuses.keys().all(|s| *s < 500),
            "{}: a 5xx: {:?}",
            stream.name,
            stream.statuses
        );
    }
}

/// The charges the sandbox and the database really hold, counted by the
/// test itself rather than by the load generator.
async fn real_counts(app: &TestApp) -> (usize, i64) {
    (
        app.sandbox_charges().await.len(),
        app.db.charges_with_status("succeeded").await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_charges_once_per_request() {
    let app = sqlite_app(AppOptions::default()).await;
    let scenario = Scenario::New {
        requests: 50,
        concurrency: 8,
    };

    let report = load::run(&config_for(&app, scenario)).await.unwrap();

    assert_correct(&report);
    assert_eq!(report.operations.started, 50);
    assert_eq!(report.operations.charged, 50);
    assert_eq!(report.charges.provider, Some(50));
    assert_eq!(report.charges.database, Some(50));
    assert_eq!(report.charges.provider_unmatched, Some(0));
    assert_eq!(report.charges.database_unmatched, Some(0));
    let charge = report.stream("charge").unwrap();
    assert_eq!(charge.statuses.get(&201), Some(&50));
    assert!(charge.latency_us.is_some());
    assert_eq!(real_counts(&app).await, (50, 50));
}

/// `refund`: every refund made once, at the provider and in the database,
/// and each charge refunded in full by its parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refunds_once_per_operation() {
    let app = sqlite_app(AppOptions::default()).await;
    let scenario = Scenario::Refund {
        charges: 10,
        per_charge: 2,
        concurrency: 4,
    };

    let report = load::run(&config_for(&app, scenario)).await.unwrap();

    assert_correct(&report);
    assert_eq!(report.operations.charged, 10);
    assert_eq!(statuses(&report, "refund"), [(201, 20)]);
    assert_eq!(app.sandbox_refunds().await.len(), 20);
    assert_eq!(app.db.refunds_with_status("succeeded").await, 20);
    let page = app.get_as("cus_load", "/api/charges?limit=100").await;
    let refunded = page.body["data"].as_array().unwrap();
    assert!(
        refunded
            .iter()
            .all(|c| c["amount_refunded"] == c["amount_cents"])
    );
}

/// `capture`: every hold captured once, in full, at the provider and in the
/// database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn captures_once_per_hold() {
    let app = sqlite_app(AppOptions::default()).await;
    let scenario = Scenario::Capture {
        holds: 10,
        concurrency: 4,
    };

    let report = load::run(&config_for(&app, scenario)).await.unwrap();

    assert_correct(&report);
    assert_eq!(report.operations.charged, 10);
    assert_eq!(statuses(&report, "capture"), [(201, 10)]);
    assert_eq!(report.charges.provider, Some(10));
    assert_eq!(report.charges.database, Some(10));
    // One capture per hold, of all of it.
    let captures = app.sandbox_get("/_sandbox/captures").await["data"]
        .as_array()
        .cloned()
        .unwrap();
    let held: std::collections::BTreeSet<&str> = captures
        .iter()
        .map(|c| c["charge"].as_str().unwrap())
        .collect();
    assert_eq!((captures.len(), held.len()), (10, 10), "{captures:?}");
    assert!(captures.iter().all(|c| c["amount"] == 100), "{captures:?}");
    assert_eq!(app.db.charges_with_status("succeeded").await, 10);
    let page = app.get_as("cus_load", "/api/charges?limit=100").await;
    let charges = page.body["data"].as_array().unwrap();
    assert!(charges.iter().all(|c| c["status"] == "succeeded"
        && c["amount_captured"] == c["amount_cents"]
        && c["amount_released"] == 0));
}

/// Captures are the back office's alone: without its token `capture` does
/// not start (exit 2, naming the flag) and nothing is authorized.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capture_needs_a_back_office_token() {
    let app = sqlite_app(AppOptions::default()).await;
    let mut config = config_for(
        &app,
        Scenario::Capture {
            holds: 2,
            concurrency: 1,
        },
    );
    config.back_office_token = None;

    let refused = load::run(&config).await.unwrap_err();

    assert!(matches!(refused, LoadError::Usage(_)), "{refused:?}");
    assert!(
        refused.to_string().contains("--back-office-token"),
        "{refused}"
    );
    let token = app.token("cus_load");
    let (code, stdout, stderr) = load_binary(&[
        "--base-url",
        &app.base_url,
        "--token",
        &token,
        "capture",
        "--holds",
        "2",
        "--concurrency",
        "1",
    ])
    .await;
    assert_eq!(code, i32::from(EXIT_ERROR), "{stdout}{stderr}");
    assert!(stderr.contains("--back-office-token"), "{stderr}");
    assert!(
        app.sandbox_attempts().await.is_empty(),
        "nothing authorized"
    );
}

/// `list`: reads of a page, every answer 200; no charges made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_reads_pages() {
    let app = sqlite_app(AppOptions::default()).await;
    let made = load::run(&config_for(
        &app,
        Scenario::New {
            requests: 30,
            concurrency: 4,
        },
    ))
    .await
    .unwrap();
    assert_correct(&made);
    let page = app.get_as("cus_load", "/api/charges?limit=10").await;
    let cursor = page.body["data"][9]["id"].as_str().unwrap().to_owned();
    let scenario = Scenario::List {
        requests: 40,
        concurrency: 4,
        limit: 10,
        starting_after: Some(cursor),
    };

    let report = load::run(&config_for(&app, scenario)).await.unwrap();

    assert_correct(&report);
    assert_eq!(statuses(&report, "list"), [(200, 40)]);
    assert_eq!(report.operations.started, 0);
    assert_eq!(real_counts(&app).await, (30, 30));
}

/// `health`: reads of `GET /healthz`, every answer 200, nothing charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_reads_the_liveness_probe() {
    let app = sqlite_app(AppOptions::default()).await;
    let scenario = Scenario::Health {
        requests: 40,
        concurrency: 4,
    };

    let report = load::run(&config_for(&app, scenario)).await.unwrap();

    assert_correct(&report);
    assert_eq!(statuses(&report, "health"), [(200, 40)]);
    assert_eq!(report.operations.started, 0);
    assert_eq!(real_counts(&app).await, (0, 0));
}

/// The database count reads `metadata` as text on every backend (JSONB on
/// PostgreSQL, TEXT on SQLite and MySQL).
async fn database_count(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return; // Skipped (and said so) by the support crate.
    };
    let scenario = Scenario::New {
        requests: 10,
        concurrency: 4,
    };

    let report = load::run(&config_for(&app, scenario)).await.unwrap();

    assert_correct(&report);
    assert_eq!(report.charges.database, Some(10));
    assert_eq!(report.charges.database_unmatched, Some(0));
    assert!(report.charges.database_other.is_empty());
}

payments_tests::backend_tests!(database_count);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_duration_caps_a_run_and_its_charges_still_add_up() {
    let app = sqlite_app(AppOptions::default()).await;
    let scenario = Scenario::New {
        requests: 1_000_000,
        concurrency: 4,
    };
    let mut config = config_for(&app, scenario);
    config.duration = Duration::from_secs(1);

    let report = load::run(&config).await.unwrap();

    assert_correct(&report);
    assert_eq!(report.stopped_by, StoppedBy::Duration);
    let started = report.operations.started;
    assert!(started > 0 && started < 1_000_000, "{started}");
    assert_eq!(report.operations.charged, started);
    assert_eq!(report.charges.provider, Some(started));
    assert_eq!(report.charges.database, Some(started));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_answers_every_request_from_the_store() {
    let app = sqlite_app(AppOptions::default()).await;
    let scenario = Scenario::Replay {
        keys: 5,
        requests: 100,
        concurrency: 8,
    };
    // The measured part is marked once each way, in order.
    let marks = Arc::new(Mutex::new(Vec::new()));
    let mut config = config_for(&app, scenario);
    let seen = marks.clone();
    config.marker = Some(Marker::new(move |mark| seen.lock().unwrap().push(mark)));

    let report = load::run(&config).await.unwrap();

    assert_correct(&report);
    assert_eq!(*marks.lock().unwrap(), [Mark::Start, Mark::End]);
    assert_eq!(statuses(&report, "replay"), [(201, 100)]);
    assert_eq!(report.stream("replay").unwrap().replays, 100);
    // The five setup charges, and nothing more.
    assert_eq!(report.operations.charged, 5);
    assert_eq!(report.charges.provider, Some(5));
    assert_eq!(report.charges.database, Some(5));
    assert_eq!(real_counts(&app).await, (5, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_charges_each_key_once() {
    // A provider slow enough that the storm overlaps the first attempt
    // (the 409 path); correctness does not depend on it.
    let app = sqlite_app(AppOptions::slow_provider(100)).await;
    let scenario = Scenario::Storm {
        keys: 5,
        per_key: 20,
        concurrency: 1,
    };

    let report = load::run(&config_for(&app, scenario)).await.unwrap();

    assert_correct(&report);
    let storm = report.stream("storm").unwrap();
    assert_eq!(storm.requests, 100);
    assert!(
        storm.statuses.keys().all(|s| [201, 409].contains(s)),
        "{:?}",
        storm.statuses
    );
    assert!(storm.transport_errors.is_empty(), "{storm:?}");
    // Every key's retry after the storm ended 201.
    assert_eq!(report.operations.charged, 5);
    assert_eq!(report.stream("final").unwrap().statuses.get(&201), Some(&5));
    assert_eq!(report.charges.provider, Some(5));
    assert_eq!(report.charges.provider_keys_charged_twice, Some(0));
    assert_eq!(report.charges.database, Some(5));
    assert_eq!(real_counts(&app).await, (5, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_provider_every_charge_ends_201_once_and_probes_are_measured() {
    let app = sqlite_app(AppOptions::default()).await;
    let scenario = Scenario::Slow {
        in_flight: 20,
        provider_latency: Duration::from_secs(1),
        probe_concurrency: 2,
        probe_keys: 3,
        probe_interval: Duration::from_millis(10),
    };

    let report = load::run(&config_for(&app, scenario)).await.unwrap();

    assert_correct(&report);
    // All 20 in-flight operations ended 201, each exactly once.
    assert_eq!(statuses(&report, "operation"), [(201, 20)]);
    assert_eq!(report.operations.charged, 23, "20 in flight + 3 probe keys");
    assert_eq!(report.charges.provider, Some(23));
    assert_eq!(report.charges.database, Some(23));
    assert_eq!(real_counts(&app).await, (23, 23));
    // The probes ran meanwhile, and their latencies were recorded apart.
    for name in ["probe_replay", "probe_get"] {
        let probe = report.stream(name).unwrap();
        assert!(probe.answered > 0, "{name}: {probe:?}");
        assert!(probe.latency_us.is_some(), "{name}");
        assert!(probe.disallowed.is_empty(), "{name}: {probe:?}");
    }
    assert_eq!(
        report.stream("probe_replay").unwrap().replays,
        report.stream("probe_replay").unwrap().answered
    );
    // The sandbox's latency is back to 0.
    let config = app.sandbox_get("/_sandbox/config").await;
    assert_eq!(config["latency_ms"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_provider_past_the_gateway_timeout_retries_503_to_one_charge() {
    // The incident's shape: the provider outlasts the server's gateway
    // timeout, so every first attempt is 503 and the retry (same key)
    // re-drives the same provider call.
    let app = sqlite_app(AppOptions {
        gateway_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let scenario = Scenario::Slow {
        in_flight: 10,
        provider_latency: Duration::from_secs(1),
        probe_concurrency: 1,
        probe_keys: 1,
        probe_interval: Duration::from_millis(50),
    };

    let report = load::run(&config_for(&app, scenario)).await.unwrap();

    println!("{}", report.to_text());
    assert!(report.correct, "{}", report.to_text());
    let charge = report.stream("charge").unwrap();
    assert!(
        charge.statuses.get(&503).is_some_and(|n| *n >= 10),
        "{charge:?}"
    );
    assert_eq!(statuses(&report, "operation"), [(201, 10)]);
    assert_eq!(report.charges.provider, Some(11));
    assert_eq!(report.charges.database, Some(11));
    assert_eq!(real_counts(&app).await, (11, 11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_charges_every_replay_is_incorrect() {
    // Replays are fresh 201s: the load generator must call that incorrect.
    let (url, _) = non_idempotent_server(Duration::ZERO).await;
    let scenario = Scenario::Replay {
        keys: 2,
        requests: 10,
        concurrency: 2,
    };

    let report = load::run(&Config::new(&url, "any", scenario))
        .await
        .unwrap();

    println!("{}", report.to_text());
    assert!(!report.correct);
    assert_eq!(report.exit_code(), 1);
    assert_eq!(report.violations_total, 10, "{:?}", report.violations);
    assert!(report.violations[0].contains("without Idempotent-Replay"));
}

/// Runs the real `payments-load` binary: (exit code, stdout, stderr).
async fn load_binary(args: &[&str]) -> (i32, String, String) {
    run_tool("payments-load", args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_binary_reports_json_and_refuses_other_hosts() {
    let app = sqlite_app(AppOptions::default()).await;
    let token = app.token("cus_load");
    let sandbox = app.sandbox.url();

    let (code, stdout, stderr) = load_binary(&[
        "--base-url",
        &app.base_url,
        "--token",
        &token,
        "--sandbox-url",
        &sandbox,
        "--database-url",
        &app.db.url,
        "new",
        "--requests",
        "20",
        "--concurrency",
        "4",
        "--duration",
        "30s",
        "--json",
    ])
    .await;
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["correct"], true, "{stdout}");
    assert_eq!(json["scenario"], "new");
    assert_eq!(json["operations"]["charged"], 20);
    assert_eq!(json["charges"]["provider"], 20);
    assert_eq!(json["charges"]["database"], 20);
    assert_eq!(json["streams"][0]["statuses"]["201"], 20);
    assert!(json["streams"][0]["latency_us"]["p99"].as_u64().is_some());
    assert_eq!(app.sandbox_charges().await.len(), 20);

    // Not this machine: refused before any request.
    for (flag, url) in [
        ("--base-url", "http://10.1.2.3:8080"),
        ("--sandbox-url", "http://sandbox.example.com:12111"),
    ] {
        let mut args = vec!["--base-url", app.base_url.as_str(), "--token", &token];
        if flag == "--base-url" {
            args[1] = url;
        } else {
            args.extend([flag, url]);
        }
        args.extend(["new", "--requests", "1", "--json"]);
        let (code, stdout, stderr) = load_binary(&args).await;
        assert_eq!(
            code,
            i32::from(EXIT_ERROR),
            "{flag} {url}: {stdout}{stderr}"
        );
        assert!(stderr.contains("refused"), "{stderr}");
        let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(json["correct"], false);
    }
    assert_eq!(
        app.sandbox_charges().await.len(),
        20,
        "nothing more charged"
    );
}
