//! Issue 23, "not made while the provider is still working": a provider that
//! goes on processing after we stop waiting is never concluded "not made"
//! before it has had `PROVIDER_MAX_PROCESSING` to act, its answer that our
//! key is still in flight never abandons the operation, and a Search miss is
//! confirmed with the provider's charge list before anything is concluded.

use crate::reconcile;
use std::time::{Duration, Instant};

use payments_jobs::reaper::{Reaper, ReaperSettings};
use payments_jobs::reconciler::ReconcileReport;
use payments_sandbox::SandboxConfig;
use payments_tests::{
    AppOptions, Backend, TestApp, backend_tests, charge_body, new_key, run_binary, spawn_app,
};
use serde_json::json;

/// A provider that answers `latency_ms` after each call, behind a gateway
/// that waits `timeout_ms`; the provider may act `processing` after that.
/// No replay cache: the tests age records by SQL.
fn slow(latency_ms: u64, timeout_ms: u64, processing: Duration) -> AppOptions {
    AppOptions {
        gateway_timeout: Duration::from_millis(timeout_ms),
        sandbox: SandboxConfig {
            latency_ms,
            ..SandboxConfig::default()
        },
        replay_cache: false,
        provider_max_processing: Some(processing),
        ..AppOptions::default()
    }
}

/// Ages the key's record (only the record: its charge keeps the time of
/// its provider call) past the re-drive limit, so the next retry abandons
/// it without a provider call, as the key-retention guard does.
async fn age_record_only(app: &TestApp, key: &str) {
    let secs = 23 * 3600 + 1800;
    let aged = app
        .db
        .execute(
            &format!(
                "UPDATE idempotent_requests SET created_at = created_at - {} \
                 WHERE idempotency_key = '{key}'",
                secs * 1000
            ),
            &format!(
                "UPDATE idempotent_requests SET created_at = created_at - \
                 interval '{secs} seconds' WHERE idempotency_key = '{key}'"
            ),
            &format!(
                "UPDATE idempotent_requests SET created_at = created_at - \
                 INTERVAL {secs} SECOND WHERE idempotency_key = '{key}'"
            ),
        )
        .await;
    assert_eq!(aged, 1);
}

/// Waits until the sandbox has made `n` charges (it goes on after the
/// gateway stopped waiting); false if it did not within 20 s.
async fn provider_made(app: &TestApp, n: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if app.sandbox_charges().await.len() >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The audit's reproduction, scaled down: the provider takes longer than
/// the gateway waits, the operation is abandoned while the provider is
/// still working, and reconciliation runs with a search lag shorter than
/// the provider's latency. Nothing is concluded "not made" before the
/// provider has made the charge; once it has, reconciliation finds it
/// `succeeded`, the client's retry with its key gets the 201, and the
/// provider charged once.
async fn a_charge_the_provider_is_still_making_is_never_concluded_not_made(backend: Backend) {
    // The provider acts 4 s after the call, 3.7 s after we stopped waiting:
    // within PROVIDER_MAX_PROCESSING (5 s). The 4 s leave room for a pass
    // before it acts on a busy machine.
    let Some(app) = spawn_app(backend, slow(4000, 300, Duration::from_secs(5))).await else {
        return;
    };
    let key = new_key();
    let body = charge_body(4900, "tok_visa");
    let first = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(first.status(), 503, "the gateway stopped waiting");
    age_record_only(&app, &key).await;
    let abandoned = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(abandoned.status(), 500);
    assert_eq!(app.db.charges_with_status("unknown").await, 1);

    // While the provider is still working, every pass leaves it unknown.
    let mut passes_before_made = 0;
    // A pass the provider's charge overlapped may already have found it.
    let mut overlapping = ReconcileReport::default();
    while app.sandbox_charges().await.is_empty() {
        let report = reconcile(&app, Duration::from_millis(200)).await;
        if !app.sandbox_charges().await.is_empty() {
            overlapping = report;
            break;
        }
        passes_before_made += 1;
        assert_eq!(
            (report.not_made, report.settled()),
            (0, 0),
            "concluded while the provider was still making the charge: {report:?}"
        );
        assert_eq!(app.db.charges_with_status("unknown").await, 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        passes_before_made > 0,
        "no pass ran before the provider acted"
    );
    assert!(provider_made(&app, 1).await);

    let report = reconcile(&app, Duration::from_millis(200)).await;
    assert_eq!(
        (
            overlapping.succeeded + report.succeeded,
            overlapping.not_made + report.not_made,
            overlapping.failed + report.failed,
        ),
        (1, 0, 0),
        "found succeeded once the provider made it: {overlapping:?} then {report:?}"
    );
    assert_eq!(app.db.charges_with_status("succeeded").await, 1);
    let retry = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(retry.status(), 201);
    let charge: serde_json::Value = retry.json().await.unwrap();
    assert_eq!(charge["status"], "succeeded");
    let provider = app.sandbox_charges().await;
    assert_eq!(provider.len(), 1, "charged once: {provider:?}");
    assert_eq!(charge["gateway_charge_id"], provider[0]["id"]);
}

/// The reaper's re-drive while the provider is still processing the first
/// call gets Stripe's 409 (our key in flight): with `abandon_after` at zero,
/// where any other failure abandons at once, the record is left in
/// progress on every such pass, its lag restarted, and once the provider
/// has made the charge the next pass finishes it with that charge.
async fn an_in_flight_answer_is_never_abandoned_by_the_reaper(backend: Backend) {
    let Some(app) = spawn_app(backend, slow(4000, 300, Duration::from_secs(5))).await else {
        return;
    };
    let reaper = Reaper::new(
        app.service.clone(),
        ReaperSettings {
            lease: Duration::from_millis(400),
            abandon_after: Duration::ZERO,
            batch: 10,
            concurrency: 1,
        },
    );
    let key = new_key();
    let body = charge_body(4900, "tok_visa");
    let first = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(first.status(), 503, "the gateway stopped waiting");
    // Its call an hour old by the database's clock (the record too, well
    // inside the re-drive limit).
    app.db.age(Some(&key), Duration::from_secs(3600)).await;

    let mut in_flight_passes = 0;
    let mut reaped = 0;
    while app.sandbox_charges().await.is_empty() {
        let report = reaper.try_run_once().await.unwrap();
        if !app.sandbox_charges().await.is_empty() {
            // The provider made it during this pass, which may have
            // finished it already.
            assert_eq!(report.abandoned, 0, "{report:?}");
            reaped += report.reaped;
            break;
        }
        assert_eq!(
            report.abandoned, 0,
            "abandoned while the provider was still processing its key: {report:?}"
        );
        if report.left == 1 {
            in_flight_passes += 1;
            assert_eq!(app.db.records_for_key(&key, "in_progress", None).await, 1);
            assert_eq!(app.db.charges_with_status("pending").await, 1);
            // The lag restarted: the call's stamp moved past the hour-old
            // times it was aged with (a pending charge's `updated_at` is
            // its claim's).
            let sql = "SELECT COUNT(*) FROM charges WHERE provider_called_at > updated_at";
            let recent = app.db.count(sql, sql, &[]).await;
            assert_eq!(recent, 1, "the in-flight answer restarts the lag");
        }
        // Past the reaper's lease before the next pass.
        tokio::time::sleep(Duration::from_millis(450)).await;
    }
    assert!(in_flight_passes > 0, "no pass met the key in flight");
    assert!(provider_made(&app, 1).await);

    let deadline = Instant::now() + Duration::from_secs(10);
    while reaped == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(450)).await;
        let report = reaper.try_run_once().await.unwrap();
        assert_eq!((report.abandoned, report.failed), (0, 0), "{report:?}");
        reaped += report.reaped;
    }
    assert_eq!(reaped, 1, "finished with the provider's charge");
    assert_eq!(app.db.records_for_key(&key, "complete", Some(201)).await, 1);
    assert_eq!(app.db.charges_with_status("succeeded").await, 1);
    let retry = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(app.sandbox_charges().await.len(), 1, "charged once");
}

/// Search can lag by far more than the search lag (Stripe: up to an hour
/// in an outage). A charge the provider made, which Search does not show,
/// is found in the provider's charge list, past a full page of newer
/// charges, and settled `succeeded`, never "not made".
async fn a_search_miss_is_confirmed_with_the_charge_list(backend: Backend) {
    let Some(app) = spawn_app(
        backend,
        AppOptions {
            replay_cache: false,
            ..AppOptions::default()
        },
    )
    .await
    else {
        return;
    };
    let key = new_key();
    let body = charge_body(4900, "tok_visa");
    app.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let first = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(first.status(), 503, "charged, the answer lost");
    app.configure_sandbox(json!({"search_lag_ms": 3_600_000}))
        .await;
    crate::abandon_by_age(&app, &key, &body).await;
    // More than a page of newer charges at the provider, others' calls.
    for i in 0..120 {
        let made = app
            .http
            .post(format!("{}/v1/charges", app.sandbox.url()))
            .bearer_auth("sk_test_sandbox")
            .form(&[
                ("amount", "100"),
                ("currency", "gbp"),
                ("source", "tok_visa"),
                ("metadata[payments_charge_id]", &format!("ch_other{i}")),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(made.status(), 200);
    }

    let report = reconcile(&app, Duration::ZERO).await;
    assert_eq!(
        report,
        ReconcileReport {
            succeeded: 1,
            ..ReconcileReport::default()
        },
        "a charge Search misses but the list shows is not \"not made\""
    );
    let retry = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(retry.status(), 201);
    let charge: serde_json::Value = retry.json().await.unwrap();
    let ours: Vec<_> = app
        .sandbox_charges()
        .await
        .into_iter()
        .filter(|c| c["amount"] == 4900)
        .collect();
    assert_eq!(ours.len(), 1, "charged once");
    assert_eq!(charge["gateway_charge_id"], ours[0]["id"]);
}

backend_tests!(
    a_charge_the_provider_is_still_making_is_never_concluded_not_made,
    an_in_flight_answer_is_never_abandoned_by_the_reaper,
    a_search_miss_is_confirmed_with_the_charge_list,
);

/// `payments-jobs` refuses to start with a search lag shorter than the
/// time the provider may still act, naming both settings.
#[tokio::test]
async fn a_search_lag_below_the_provider_max_processing_is_refused_at_start() {
    let base = [
        ("DATABASE_URL", "sqlite::memory:"),
        ("GATEWAY_URL", "http://127.0.0.1:9"),
        ("GATEWAY_SECRET_KEY", "k"),
    ];
    for args in [
        &["reconcile", "--once", "--reconcile-search-lag=0s"][..],
        &[
            "reconcile",
            "--once",
            "--reconcile-search-lag=1m",
            "--provider-max-processing=2m",
        ],
    ] {
        let (ok, _, stderr) = run_binary("payments-jobs", args, &base).await;
        assert!(
            !ok && stderr.contains("RECONCILE_SEARCH_LAG")
                && stderr.contains("PROVIDER_MAX_PROCESSING"),
            "{args:?}: {stderr}"
        );
    }
    let mut env = base.to_vec();
    env.extend([
        ("RECONCILE_SEARCH_LAG", "30s"),
        ("PROVIDER_MAX_PROCESSING", "1m"),
    ]);
    let (ok, _, stderr) = run_binary("payments-jobs", &["reconcile", "--once"], &env).await;
    assert!(
        !ok && stderr.contains("RECONCILE_SEARCH_LAG")
            && stderr.contains("PROVIDER_MAX_PROCESSING"),
        "{stderr}"
    );
}

/// The gateway's list confirmation against the sandbox: it finds our
/// charge however far Search lags, only inside the `created` window, and
/// a failed read is never taken for "not found".
#[tokio::test]
async fn the_charge_list_lookup_finds_in_its_window_and_a_failed_read_concludes_nothing() {
    use payments_domain::provider::{CreatedWindow, Expected, Gateway, Lookup, ProviderOutcome};
    use payments_gateway::HttpGateway;

    let sandbox = payments_sandbox::SandboxHandle::start(SandboxConfig {
        search_lag_ms: 3_600_000,
        ..SandboxConfig::default()
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let mut made = None;
    for id in ["ch_ours", "ch_newer"] {
        let charge: serde_json::Value = http
            .post(format!("{}/v1/charges", sandbox.url()))
            .bearer_auth("sk_test_sandbox")
            .form(&[
                ("amount", "100"),
                ("currency", "gbp"),
                ("source", "tok_visa"),
                ("metadata[payments_charge_id]", id),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        made.get_or_insert(charge);
    }
    let ours = made.unwrap();
    let created = ours["created"].as_i64().unwrap();
    let gateway =
        HttpGateway::new(&sandbox.url(), "sk_test_sandbox", Duration::from_secs(5)).unwrap();
    let expected = Expected {
        amount_cents: 100,
        currency: "GBP".to_owned(),
        hold: false,
    };
    assert_eq!(
        gateway.find_charge("ch_ours", &expected).await,
        Lookup::NotFound,
        "Search lags"
    );
    let around = CreatedWindow {
        from: created - 300,
        to: created + 300,
    };
    assert_eq!(
        gateway
            .find_charge_listed("ch_ours", around, &expected)
            .await,
        Lookup::Found(ProviderOutcome::Succeeded {
            provider_id: ours["id"].as_str().unwrap().to_owned()
        })
    );
    let before = CreatedWindow {
        from: created - 600,
        to: created - 1,
    };
    assert_eq!(
        gateway
            .find_charge_listed("ch_ours", before, &expected)
            .await,
        Lookup::NotFound
    );
    // A read the provider refuses (here our key) concludes nothing.
    let refused = HttpGateway::new(&sandbox.url(), "", Duration::from_secs(5)).unwrap();
    assert!(
        matches!(
            refused
                .find_charge_listed("ch_ours", around, &expected)
                .await,
            Lookup::Unknown { .. }
        ),
        "a failed read is not \"not found\""
    );
}
