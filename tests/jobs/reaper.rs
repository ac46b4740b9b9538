//! The reaper finishes what nobody else will, with the provider's real outcome.

use crate::{aged, reaper};
use std::sync::Arc;
use std::time::Duration;

use payments_jobs::reaper::{ReapReport, Reaper, ReaperSettings};
use payments_tests::{AppOptions, Backend, backend_tests, charge_body, new_key, spawn_app};

use serde_json::{Value, json};

fn body(token: &str) -> Value {
    json!({"amount_cents": 4900, "currency": "GBP", "card_token": token})
}

fn ago(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// An expired lease is re-driven and finished with the provider's real
/// outcome: a charge the provider never saw is made once; a charge the
/// provider made before the answer was lost is replayed, not made again.
async fn expired_leases_are_finished_with_the_real_outcome(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    // Crashed before the provider call.
    let never_sent = new_key();
    app.db
        .stuck_request(&never_sent, "cus_1", &body("tok_visa"), ago(60))
        .await;
    // The provider charged, the answer was lost, the client never retried.
    app.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let lost_answer = new_key();
    let first = app
        .post_charge("cus_2", Some(&lost_answer), &charge_body(700, "tok_visa"))
        .await;
    assert_eq!(first.status(), 503);
    app.configure_sandbox(json!({})).await;
    assert_eq!(app.sandbox_charges().await.len(), 1);

    let report = reaper(&app).try_run_once().await.unwrap();
    assert_eq!(
        report,
        ReapReport {
            reaped: 2,
            ..ReapReport::default()
        }
    );
    assert_eq!(
        app.db
            .records_for_key(&never_sent, "complete", Some(201))
            .await,
        1
    );
    assert_eq!(
        app.db
            .records_for_key(&lost_answer, "complete", Some(201))
            .await,
        1
    );
    assert_eq!(
        app.sandbox_charges().await.len(),
        2,
        "one charge each, none twice"
    );
    assert_eq!(app.db.charges_with_status("succeeded").await, 2);
    // The client's late retry gets the reaper's answer.
    let retry = app
        .post_charge("cus_2", Some(&lost_answer), &charge_body(700, "tok_visa"))
        .await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replay"], "true");
    // Nothing left to do.
    let again = reaper(&app).try_run_once().await.unwrap();
    assert_eq!(again.total(), 0);
}

/// A request whose driver still holds its lease is left alone.
async fn live_leases_are_left_alone(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let key = new_key();
    app.db
        .stuck_request(&key, "cus_1", &body("tok_visa"), ago(0))
        .await;
    // Its lease runs until 1 s after the claim, by the database's clock.
    let report = reaper(&app).try_run_once().await.unwrap();
    assert_eq!(report.total(), 0);
    assert_eq!(app.db.records_for_key(&key, "in_progress", None).await, 1);
    assert_eq!(
        app.sandbox_stats().await["requests"],
        0,
        "the provider was not called"
    );
}

/// A decline is a final outcome: the record finishes as 402.
async fn declines_finish_as_402(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let key = new_key();
    app.db
        .stuck_request(
            &key,
            "cus_1",
            &body("tok_chargeDeclinedExpiredCard"),
            ago(60),
        )
        .await;
    let report = reaper(&app).try_run_once().await.unwrap();
    assert_eq!(report.reaped, 1);
    assert_eq!(app.db.records_for_key(&key, "complete", Some(402)).await, 1);
    assert_eq!(app.db.charges_with_status("failed").await, 1);
    let replay = app
        .post_charge(
            "cus_1",
            Some(&key),
            &serde_json::to_string(&body("tok_chargeDeclinedExpiredCard")).unwrap(),
        )
        .await;
    assert_eq!(replay.status(), 402);
    let error: Value = replay.json().await.unwrap();
    assert_eq!(error["error"]["decline_code"], "expired_card");
}

/// Provider down: the record is left as it is (pending charge, still in
/// progress), retried on later passes, and abandoned only past
/// `abandon_after`: 500 request_abandoned, charge unknown. The fault is
/// one a re-drive could recover from (a 429, saved nowhere); a 500 is
/// saved and replayed, and abandoned at once
/// (`provider::the_reaper_abandons_on_a_replayed_error_at_once`).
async fn unreachable_provider_is_abandoned_only_after_the_threshold(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    app.configure_sandbox(json!({"rate_limit_rate": 1.0})).await;
    let key = new_key();
    app.db
        .stuck_request(&key, "cus_1", &body("tok_visa"), ago(60))
        .await;
    let reaper = reaper(&app);

    let first = reaper.try_run_once().await.unwrap();
    assert_eq!(
        first,
        ReapReport {
            left: 1,
            ..ReapReport::default()
        }
    );
    assert_eq!(app.db.records_for_key(&key, "in_progress", None).await, 1);
    assert_eq!(app.db.charges_with_status("pending").await, 1);
    // The reaper kept its lease: a pass before it ends does nothing.
    assert_eq!(reaper.try_run_once().await.unwrap().total(), 0);
    // A later pass, still inside abandon_after: tried again, left again.
    app.db.age(Some(&key), ago(600)).await;
    assert_eq!(reaper.try_run_once().await.unwrap().left, 1);

    app.db.age(Some(&key), ago(6 * 60)).await;
    let late = reaper.try_run_once().await.unwrap();
    assert_eq!(
        late,
        ReapReport {
            abandoned: 1,
            ..ReapReport::default()
        }
    );
    assert_eq!(
        app.db.records_for_key(&key, "abandoned", Some(500)).await,
        1
    );
    assert_eq!(app.db.charges_with_status("unknown").await, 1);
    assert_eq!(app.sandbox_charges().await.len(), 0);
    let replay = app
        .post_charge(
            "cus_1",
            Some(&key),
            &serde_json::to_string(&body("tok_visa")).unwrap(),
        )
        .await;
    assert_eq!(replay.status(), 500);
    let error: Value = replay.json().await.unwrap();
    assert_eq!(error["error"]["code"], "request_abandoned");
}

/// `--dry-run` reports and changes nothing.
async fn dry_run_changes_nothing(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    for _ in 0..3 {
        app.db
            .stuck_request(&new_key(), "cus_1", &body("tok_visa"), ago(3600))
            .await;
    }
    let report = reaper(&app).dry_run().await.unwrap();
    assert_eq!(
        report,
        ReapReport {
            would_reap: 3,
            ..ReapReport::default()
        }
    );
    assert_eq!(app.db.charges_with_status("pending").await, 3);
    assert_eq!(app.sandbox_stats().await["requests"], 0);
    // The dry run did not take the leases: a real pass still finds all three.
    assert_eq!(reaper(&app).try_run_once().await.unwrap().reaped, 3);
}

/// Two reapers started together on 50 expired records: each record is
/// driven once and finished once; the provider sees 50 calls, 50 charges.
async fn two_reapers_process_nothing_twice(backend: Backend) {
    let Some(app) = spawn_app(
        backend,
        AppOptions {
            pool_size: 8,
            ..aged()
        },
    )
    .await
    else {
        return;
    };
    app.configure_sandbox(json!({"latency_ms": 20})).await;
    for i in 0..50 {
        app.db
            .stuck_request(
                &format!("stuck-{i}"),
                &format!("cus_{i}"),
                &body("tok_visa"),
                ago(120),
            )
            .await;
    }
    let (a, b) = (Arc::new(reaper(&app)), Arc::new(reaper(&app)));
    let (ra, rb) = tokio::join!(a.try_run_once(), b.try_run_once());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.reaped + rb.reaped, 50, "{ra:?} {rb:?}");
    assert_eq!(ra.left + rb.left + ra.failed + rb.failed, 0);
    let stats = app.sandbox_stats().await;
    assert_eq!(stats["requests"], 50, "no record was driven twice: {stats}");
    assert_eq!(app.sandbox_charges().await.len(), 50);
    assert_eq!(app.db.charges_with_status("succeeded").await, 50);
    assert_eq!(
        app.db
            .count(
                "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'complete' AND response_status = 201",
                "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'complete' AND response_status = 201",
                &[]
            )
            .await,
        50
    );
}

/// Defect 1, the reaper's side: a record claimed longer ago than the
/// provider's key retention minus the margin is abandoned without a
/// provider call; re-driving it would charge again at a provider that has
/// forgotten the key.
async fn records_past_the_key_retention_are_abandoned_without_a_call(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    app.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let key = new_key();
    let first = app
        .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(first.status(), 503);
    app.configure_sandbox(json!({"key_retention_secs": 0}))
        .await;
    app.db
        .age(Some(&key), Duration::from_secs(23 * 3600 + 1800))
        .await;
    let report = reaper(&app).try_run_once().await.unwrap();
    assert_eq!(
        report,
        ReapReport {
            abandoned: 1,
            ..ReapReport::default()
        }
    );
    let stats = app.sandbox_stats().await;
    assert_eq!(stats["requests"], 1, "no provider call: {stats}");
    assert_eq!(app.sandbox_charges().await.len(), 1);
    assert_eq!(app.db.charges_with_status("unknown").await, 1);
    let replay = app
        .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(replay.status(), 500);
    assert_eq!(replay.headers()["idempotent-replay"], "true");
}

/// Defect 4, the reaper's side: each lease starts when its record is taken,
/// not when the pass began. Reaper A takes four expired records one at a
/// time (1 s provider calls, 2 s leases), so its pass outlasts the lease:
/// it takes the fourth about 3 s in. Reaper B starts 3.5 s in, when only
/// that one is in progress, and must leave it alone. Every record is driven
/// once and finished once, and nothing is left in progress.
async fn a_pass_longer_than_the_lease_finishes_every_record_once(backend: Backend) {
    let Some(app) = spawn_app(
        backend,
        AppOptions {
            lease: Duration::from_secs(2),
            gateway_timeout: Duration::from_millis(1500),
            ..aged()
        },
    )
    .await
    else {
        return;
    };
    app.configure_sandbox(json!({"latency_ms": 1000})).await;
    for i in 0..4 {
        app.db
            .stuck_request(
                &format!("long-pass-{i}"),
                "cus_1",
                &body("tok_visa"),
                ago(60),
            )
            .await;
    }
    let one_at_a_time = || {
        Reaper::new(
            app.service.clone(),
            ReaperSettings {
                lease: Duration::from_secs(2),
                abandon_after: Duration::from_secs(15 * 60),
                batch: 500,
                concurrency: 1,
            },
        )
    };
    let (a, b) = (one_at_a_time(), one_at_a_time());
    let late_b = async {
        tokio::time::sleep(Duration::from_millis(3500)).await;
        b.try_run_once().await
    };
    let (ra, rb) = tokio::join!(a.try_run_once(), late_b);
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let stats = app.sandbox_stats().await;
    assert_eq!(
        stats["requests"], 4,
        "each record driven once: {stats} {ra:?} {rb:?}"
    );
    assert_eq!(ra.reaped + rb.reaped, 4, "{ra:?} {rb:?}");
    assert_eq!(
        ra.left + rb.left + ra.failed + rb.failed,
        0,
        "{ra:?} {rb:?}"
    );
    assert_eq!(app.sandbox_charges().await.len(), 4);
    assert_eq!(app.db.charges_with_status("succeeded").await, 4);
    for i in 0..4 {
        let key = format!("long-pass-{i}");
        assert_eq!(app.db.records_for_key(&key, "complete", Some(201)).await, 1);
    }
}

/// The reaper's counts say what happened: when another driver finishes
/// the operation while the reaper's call is in flight (here the reaper's
/// 1 s lease ran out under a 2 s provider call and the client's retry took
/// over), the pass counts it as finished by another driver, not reaped.
async fn a_record_finished_by_another_driver_is_counted_as_such(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let app = Arc::new(app);
    app.configure_sandbox(json!({"latency_ms": 2000})).await;
    let key = new_key();
    app.db
        .stuck_request(&key, "cus_1", &body("tok_visa"), ago(60))
        .await;
    let short_lease = Reaper::new(
        app.service.clone(),
        ReaperSettings {
            lease: Duration::from_secs(1),
            abandon_after: Duration::from_secs(15 * 60),
            batch: 500,
            concurrency: 1,
        },
    );
    let pass = tokio::spawn(async move { short_lease.try_run_once().await });
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // The provider answers at once now, and processes the retry anew.
    app.configure_sandbox(json!({"key_retention_secs": 0}))
        .await;
    let retry = app
        .post_charge(
            "cus_1",
            Some(&key),
            &serde_json::to_string(&body("tok_visa")).unwrap(),
        )
        .await;
    assert_eq!(retry.status(), 201);
    let report = pass.await.unwrap().unwrap();
    assert_eq!(
        report,
        ReapReport {
            finished_by_other: 1,
            ..ReapReport::default()
        }
    );
    assert_eq!(app.db.records_for_key(&key, "complete", Some(201)).await, 1);
}

backend_tests!(
    a_record_finished_by_another_driver_is_counted_as_such,
    records_past_the_key_retention_are_abandoned_without_a_call,
    a_pass_longer_than_the_lease_finishes_every_record_once,
    expired_leases_are_finished_with_the_real_outcome,
    live_leases_are_left_alone,
    declines_finish_as_402,
    unreachable_provider_is_abandoned_only_after_the_threshold,
    dry_run_changes_nothing,
    two_reapers_process_nothing_twice,
);
