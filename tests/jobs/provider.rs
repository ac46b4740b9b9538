//! Issue 23, section 3, with the jobs: a provider error saved and replayed
//! under our key (item 3.4), a refused secret key (3.6), and the pinned
//! `Stripe-Version` on posts and lookups (3.7).

use crate::{aged, reaper, reconcile};
use std::time::Duration;

use payments_jobs::reaper::ReapReport;
use payments_jobs::reconciler::ReconcileReport;
use payments_tests::{Backend, TestApp, backend_tests, charge_body, new_key, spawn_app};
use serde_json::{Value, json};

fn body() -> Value {
    json!({"amount_cents": 4900, "currency": "GBP", "card_token": "tok_visa"})
}

/// POST requests the sandbox served, replays included.
async fn provider_posts(app: &TestApp) -> u64 {
    app.sandbox_stats().await["requests"].as_u64().unwrap()
}

/// Item 3.4 end to end: the provider answers a charge 500 and saves it
/// under the key (503 to the client); the client's retry re-drives and
/// gets the replayed 500, so the charge is abandoned (500
/// `request_abandoned`); neither more retries nor the reaper call the
/// provider a third time; reconciliation settles it (never charged:
/// `charge_not_made`), and the provider's charge count stays 0.
async fn a_charge_answered_500_is_abandoned_then_reconciled(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    app.configure_sandbox(json!({"error_rate": 1.0})).await;
    let key = new_key();
    let body = charge_body(4900, "tok_visa");
    assert_eq!(
        app.post_charge("cus_1", Some(&key), &body).await.status(),
        503
    );
    app.configure_sandbox(json!({})).await;
    let retry = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(retry.status(), 500);
    let error: Value = retry.json().await.unwrap();
    assert_eq!(error["error"]["code"], "request_abandoned");
    assert_eq!(
        provider_posts(&app).await,
        2,
        "the first call and one re-drive"
    );
    assert_eq!(
        app.post_charge("cus_1", Some(&key), &body).await.status(),
        500
    );
    app.db.age(Some(&key), Duration::from_secs(3600)).await;
    assert_eq!(reaper(&app).try_run_once().await.unwrap().total(), 0);
    assert_eq!(
        provider_posts(&app).await,
        2,
        "never re-driven a third time"
    );

    let report = reconcile(&app, Duration::from_secs(60)).await;
    assert_eq!(
        report,
        ReconcileReport {
            not_made: 1,
            ..ReconcileReport::default()
        }
    );
    let settled = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(settled.status(), 502);
    let error: Value = settled.json().await.unwrap();
    assert_eq!(error["error"]["code"], "charge_not_made");
    assert_eq!(app.sandbox_charges().await.len(), 0);
    assert_eq!(provider_posts(&app).await, 2);
}

/// Item 3.4, the reaper: a record nobody retried after the provider's 500
/// is re-driven once, gets the replayed 500 and is abandoned at once, well
/// inside `abandon_after`; no later pass calls the provider.
async fn the_reaper_abandons_on_a_replayed_error_at_once(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    app.configure_sandbox(json!({"error_rate": 1.0})).await;
    let key = new_key();
    app.db
        .stuck_request(&key, "cus_1", &body(), Duration::from_secs(60))
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
    app.configure_sandbox(json!({})).await;
    app.db.age(Some(&key), Duration::from_secs(60)).await;
    let second = reaper.try_run_once().await.unwrap();
    assert_eq!(
        second,
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
    app.db.age(Some(&key), Duration::from_secs(60)).await;
    assert_eq!(reaper.try_run_once().await.unwrap().total(), 0);
    assert_eq!(provider_posts(&app).await, 2);
    assert_eq!(app.sandbox_charges().await.len(), 0);
}

/// Item 3.6, the reaper: a refused secret key says nothing about the
/// charge, so even past `abandon_after` the record is left in progress
/// (its charge pending); once the key is accepted, the next pass charges
/// it exactly once.
async fn the_reaper_never_abandons_on_a_refused_key(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    app.configure_sandbox(json!({"secret_key": "sk_test_rotated"}))
        .await;
    let key = new_key();
    app.db
        .stuck_request(&key, "cus_1", &body(), Duration::from_secs(20 * 60))
        .await;
    let reaper = reaper(&app);
    let refused = reaper.try_run_once().await.unwrap();
    assert_eq!(
        refused,
        ReapReport {
            left: 1,
            ..ReapReport::default()
        }
    );
    assert_eq!(app.db.records_for_key(&key, "in_progress", None).await, 1);
    assert_eq!(app.db.charges_with_status("pending").await, 1);
    app.configure_sandbox(json!({})).await;
    app.db.age(Some(&key), Duration::from_secs(60)).await;
    let fixed = reaper.try_run_once().await.unwrap();
    assert_eq!(
        fixed,
        ReapReport {
            reaped: 1,
            ..ReapReport::default()
        }
    );
    assert_eq!(app.db.records_for_key(&key, "complete", Some(201)).await, 1);
    assert_eq!(app.sandbox_charges().await.len(), 1);
}

/// Item 3.7: every provider call, posts and the reconciler's lookups,
/// carries the pinned `Stripe-Version`, the setting's default.
async fn every_provider_call_pins_the_stripe_version(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_1", &charge_body(4900, "tok_visa"))
        .await;
    let refund = app
        .post_refund(
            "cus_1",
            charge["id"].as_str().unwrap(),
            &new_key(),
            &json!({"amount_cents": 100}),
        )
        .await;
    assert_eq!(refund.status, 201, "{}", refund.body);
    // An abandoned charge, for the reconciler to look up.
    app.configure_sandbox(json!({"rate_limit_rate": 1.0})).await;
    let key = new_key();
    let body = charge_body(4900, "tok_visa");
    assert_eq!(
        app.post_charge("cus_1", Some(&key), &body).await.status(),
        503
    );
    app.configure_sandbox(json!({})).await;
    crate::abandon_by_age(&app, &key, &body).await;
    reconcile(&app, Duration::from_secs(60)).await;

    let paths = app.sandbox_requests().await;
    for call in [
        "POST /v1/charges",
        "POST /v1/refunds",
        "GET /v1/charges/search",
    ] {
        assert!(paths.iter().any(|p| p == call), "{call} not in {paths:?}");
    }
    let seen = app.sandbox_get("/_sandbox/requests").await;
    for request in seen["data"].as_array().unwrap() {
        assert_eq!(request["stripe_version"], "2026-09-30.endive", "{request}");
    }
}

backend_tests!(
    a_charge_answered_500_is_abandoned_then_reconciled,
    the_reaper_abandons_on_a_replayed_error_at_once,
    the_reaper_never_abandons_on_a_refused_key,
    every_provider_call_pins_the_stripe_version,
);
