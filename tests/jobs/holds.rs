//! Holds whose capture or cancel ended unknown (issue 27): the client's
//! retry with its key re-drives the same provider call, the reaper
//! finishes one nobody retries, and reconciliation settles one abandoned,
//! from the provider's charge; the expirer marks lapsed holds `expired`.

use crate::{aged, reaper, reconcile, settled};
use std::time::Duration;

use payments_domain::charge::ChargeStatus;
use payments_jobs::expirer::Expirer;
use payments_tests::{Answer, Backend, TestApp, backend_tests, new_key, spawn_app};
use serde_json::{Value, json};

/// A hold of 1000 for `cus_1`: its id and the provider's.
async fn hold(app: &TestApp) -> (String, String) {
    let body = json!({"amount_cents": 1000, "currency": "GBP", "card_token": "tok_visa", "capture": false});
    let response = app
        .post_charge("cus_1", Some(&new_key()), &body.to_string())
        .await;
    let answer = Answer::of(response).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let id = |field: &str| answer.body[field].as_str().unwrap().to_owned();
    (id("id"), id("gateway_charge_id"))
}

/// `POST /api/charges/{id}/{action}` by the back office under `key`.
async fn act(app: &TestApp, action: &str, charge_id: &str, key: &str, body: &Value) -> Answer {
    let response = app
        .http
        .post(format!("{}/api/charges/{charge_id}/{action}", app.base_url))
        .bearer_auth(app.back_office_token("ops_1", "charges:capture"))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    Answer::of(response).await
}

async fn sandbox_captures(app: &TestApp, gateway_id: &str) -> usize {
    let all = app.sandbox_get("/_sandbox/captures").await;
    let all = all["data"].as_array().cloned().unwrap_or_default();
    all.iter().filter(|c| c["charge"] == gateway_id).count()
}

async fn status_of(app: &TestApp, charge_id: &str) -> Value {
    let read = app
        .get_as("cus_1", &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(read.status, 200, "{}", read.body);
    read.body
}

/// A capture the provider made but whose answer was lost: 503 with
/// `Retry-After`, the hold kept taken (a capture with another key is a
/// 409); the retry with the same key re-sends the same provider call,
/// which the provider answers from its record: 201, one capture.
async fn a_lost_capture_answer_is_retried_into_one_capture(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let (id, gateway_id) = hold(&app).await;
    let key = new_key();
    let body = json!({"amount_cents": 700});
    let lost = unanswered(
        &app,
        "capture",
        &id,
        &key,
        &body,
        json!({"drop_after_charge": true}),
    )
    .await;
    assert!(lost.headers.contains_key("retry-after"));
    let other = act(&app, "capture", &id, &new_key(), &json!({})).await;
    assert_eq!(
        (other.status, other.body["error"]["code"].as_str()),
        (409, Some("hold_in_use")),
        "{}",
        other.body
    );
    let retry = act(&app, "capture", &id, &key, &body).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert_eq!(retry.body["amount_captured"], 700);
    assert_eq!(sandbox_captures(&app, &gateway_id).await, 1);
    assert_eq!(status_of(&app, &id).await["status"], "succeeded");
}

/// A capture whose client never came back after its 503: the reaper
/// takes the expired lease and re-drives the same provider call (one
/// capture); the client's later retry replays the 201.
async fn the_reaper_finishes_a_capture_nobody_retried(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let (id, gateway_id) = hold(&app).await;
    let key = new_key();
    let dropped = json!({"drop_after_charge": true});
    unanswered(&app, "cancel", &id, &key, &json!({}), dropped).await;
    let report = reaper(&app).try_run_once().await.unwrap();
    assert_eq!(report.reaped, 1, "{report:?}");
    assert_eq!(status_of(&app, &id).await["status"], "canceled");
    let released = app.sandbox_refunds().await;
    assert_eq!(
        released
            .iter()
            .filter(|r| r["charge"] == gateway_id)
            .count(),
        1
    );
    let retry = act(&app, "cancel", &id, &key, &json!({})).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert_eq!(retry.body["status"], "canceled");
    assert_eq!(sandbox_captures(&app, &gateway_id).await, 0);
}

/// A capture abandoned with its outcome unknown (claimed too long ago to
/// re-drive) keeps its hold taken; reconciliation reads the provider's
/// charge, finds it captured, settles the capture and the hold, and the
/// client's retry gets the real 201. One abandoned that never reached the
/// provider is settled "not made" and gives the hold back.
async fn reconciliation_settles_unknown_captures(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let (id, gateway_id) = hold(&app).await;
    let key = new_key();
    abandon(&app, &id, &key, json!({"drop_after_charge": true})).await;
    assert_eq!(status_of(&app, &id).await["status"], "requires_capture");
    let busy = act(&app, "capture", &id, &new_key(), &json!({})).await;
    assert_eq!(busy.status, 409, "{}", busy.body);
    let report = reconcile(&app, Duration::ZERO).await;
    assert_eq!(report, settled(1, 0));
    let charge = status_of(&app, &id).await;
    assert_eq!(
        (&charge["status"], &charge["amount_captured"]),
        (&json!("succeeded"), &json!(1000))
    );
    let retry = act(&app, "capture", &id, &key, &json!({})).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert_eq!(sandbox_captures(&app, &gateway_id).await, 1);

    // Never made: the provider refused every call (a 500 each time).
    let (id, gateway_id) = hold(&app).await;
    let key = new_key();
    abandon(&app, &id, &key, json!({"error_rate": 1.0})).await;
    let report = reconcile(&app, Duration::ZERO).await;
    assert_eq!(report, settled(0, 1));
    assert_eq!(status_of(&app, &id).await["status"], "requires_capture");
    let retry = act(&app, "capture", &id, &key, &json!({})).await;
    assert_eq!(
        (retry.status, retry.body["error"]["code"].as_str()),
        (502, Some("capture_not_made"))
    );
    let fresh = act(&app, "capture", &id, &new_key(), &json!({})).await;
    assert_eq!(fresh.status, 201, "{}", fresh.body);
    assert_eq!(sandbox_captures(&app, &gateway_id).await, 1);
}

/// `action` under `key` with the sandbox as `sandbox` says, which leaves
/// its outcome unknown: 503 (asserted); the sandbox is then restored.
async fn unanswered(
    app: &TestApp,
    action: &str,
    charge_id: &str,
    key: &str,
    body: &Value,
    sandbox: Value,
) -> Answer {
    app.configure_sandbox(sandbox).await;
    let lost = act(app, action, charge_id, key, body).await;
    assert_eq!(lost.status, 503, "{}", lost.body);
    app.configure_sandbox(json!({})).await;
    lost
}

/// A capture under `key` whose call ended unknown (the sandbox as
/// configured), then aged past the re-drive limit and retried: abandoned
/// without a provider call (500 `request_abandoned`, capture `unknown`).
async fn abandon(app: &TestApp, charge_id: &str, key: &str, sandbox: Value) {
    unanswered(app, "capture", charge_id, key, &json!({}), sandbox).await;
    app.db
        .age(Some(key), Duration::from_secs(23 * 3600 + 1800))
        .await;
    let abandoned = act(app, "capture", charge_id, key, &json!({})).await;
    assert_eq!(abandoned.status, 500, "{}", abandoned.body);
    assert_eq!(app.db.records_for_key(key, "abandoned", Some(500)).await, 1);
}

/// The expirer marks a lapsed hold `expired` (the database's clock) and
/// counts holds by status; a second pass marks nothing.
async fn the_expirer_marks_lapsed_holds(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    app.configure_sandbox(json!({"hold_expiry_seconds": 1}))
        .await;
    let (lapsing, _) = hold(&app).await;
    app.configure_sandbox(json!({})).await;
    let (lasting, _) = hold(&app).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let expirer = Expirer::new(app.db.store());
    let report = expirer.try_run_once().await.unwrap();
    assert_eq!(report.expired, 1);
    let count = |status| {
        report
            .holds
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    };
    assert_eq!(count(ChargeStatus::Expired), 1);
    assert_eq!(count(ChargeStatus::RequiresCapture), 1);
    assert_eq!(status_of(&app, &lapsing).await["status"], "expired");
    assert_eq!(
        status_of(&app, &lasting).await["status"],
        "requires_capture"
    );
    assert_eq!(expirer.try_run_once().await.unwrap().expired, 0);
}

backend_tests!(
    a_lost_capture_answer_is_retried_into_one_capture,
    the_reaper_finishes_a_capture_nobody_retried,
    reconciliation_settles_unknown_captures,
    the_expirer_marks_lapsed_holds,
);
