//! Refunds the provider does not settle at once (issue 23, section 3): a
//! refund answered `pending` or `requires_action` is accepted, not an
//! outage. It is answered 201 `pending`, stored and replayed byte for byte,
//! its amount stays reserved on the charge, and reconciliation polls it at
//! the provider until it is final: `succeeded`, or `failed`/`canceled`
//! (the refund failed, its reservation released). A refund the provider
//! answers `canceled` is final at once: 402 `refund_failed`.

use crate::reconcile;
use std::time::Duration;

use payments_jobs::reconciler::ReconcileReport;
use payments_tests::{
    AppOptions, Backend, TestApp, backend_tests, charge_body, new_key, spawn_app,
};
use serde_json::{Value, json};

/// A refund's raw answer: status, whether it was a replay, and the body as
/// sent (to compare replays byte for byte).
struct Raw {
    status: u16,
    replayed: bool,
    body: String,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

async fn refund(app: &TestApp, charge_id: &str, key: &str, body: &Value) -> Raw {
    let response = app
        .http
        .post(format!("{}/api/charges/{charge_id}/refunds", app.base_url))
        .bearer_auth(app.back_office_token("ops_1", "refunds:write"))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replay")
        .is_some_and(|v| v == "true");
    Raw {
        status,
        replayed,
        body: response.text().await.unwrap(),
    }
}

/// Settles the sandbox's refund `id` as the provider later would.
async fn settle_at_provider(app: &TestApp, id: &str, status: &str) {
    let response = app
        .http
        .post(format!("{}/_sandbox/refunds/{id}", app.sandbox.url()))
        .json(&json!({"status": status}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
}

/// A succeeded charge of `amount` for `cus_1`: its id.
async fn paid(app: &TestApp, amount: i64) -> String {
    let charge = app
        .charge_json("cus_1", &charge_body(amount, "tok_visa"))
        .await;
    charge["id"].as_str().unwrap().to_owned()
}

async fn refund_status(app: &TestApp, refund_id: &str) -> Value {
    let read = app
        .get_as("cus_1", &format!("/api/refunds/{refund_id}"))
        .await;
    assert_eq!(read.status, 200, "{}", read.body);
    read.body
}

async fn amount_refunded(app: &TestApp, charge_id: &str) -> Value {
    let read = app
        .get_as("cus_1", &format!("/api/charges/{charge_id}"))
        .await;
    read.body["amount_refunded"].clone()
}

/// `pending` at the provider: 201 `pending`, stored (replayed byte for
/// byte), the amount still reserved (a refund of more than the rest is
/// refused, naming the rest); reconciliation leaves it while the provider
/// says pending, and marks it succeeded once the provider does, the 201
/// staying as it was.
async fn a_pending_refund_is_201_pending_and_reconciled_when_it_succeeds(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge_id = paid(&app, 1000).await;
    app.configure_sandbox(json!({"refund_status": "pending"}))
        .await;
    let key = new_key();
    let body = json!({"amount_cents": 400});
    let first = refund(&app, &charge_id, &key, &body).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let created = first.json();
    assert_eq!(created["status"], "pending");
    let provider = app.sandbox_refunds().await;
    assert_eq!(provider.len(), 1, "refunded once at the provider");
    assert_eq!(created["gateway_refund_id"], provider[0]["id"]);
    let refund_id = created["id"].as_str().unwrap().to_owned();
    let replay = refund(&app, &charge_id, &key, &body).await;
    assert_eq!((replay.status, replay.replayed), (201, true));
    assert_eq!(replay.body, first.body, "replayed byte for byte");

    // The 400 stay reserved: 600 are left, so 700 do not fit.
    let over = refund(&app, &charge_id, &new_key(), &json!({"amount_cents": 700})).await;
    assert_eq!(over.status, 400, "{}", over.body);
    assert_eq!(over.json()["error"]["code"], "refund_exceeds_charge");
    assert_eq!(over.json()["error"]["refundable_amount_cents"], 600);
    assert_eq!(app.sandbox_refunds().await.len(), 1);

    // Still pending at the provider: left as it is.
    assert_eq!(
        reconcile(&app, Duration::from_secs(60)).await,
        ReconcileReport {
            pending: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(refund_status(&app, &refund_id).await["status"], "pending");
    assert_eq!(app.db.refunds_with_status("pending").await, 1);
    assert_eq!(amount_refunded(&app, &charge_id).await, 0);

    let gateway_refund_id = created["gateway_refund_id"].as_str().unwrap();
    settle_at_provider(&app, gateway_refund_id, "succeeded").await;
    let report = reconcile(&app, Duration::from_secs(60)).await;
    assert_eq!(
        report,
        ReconcileReport {
            succeeded: 1,
            ..ReconcileReport::default()
        }
    );
    let settled = refund_status(&app, &refund_id).await;
    assert_eq!(settled["status"], "succeeded");
    assert_eq!(settled["gateway_refund_id"], gateway_refund_id);
    assert_eq!(amount_refunded(&app, &charge_id).await, 400);
    let replay = refund(&app, &charge_id, &key, &body).await;
    assert_eq!(
        (replay.status, replay.body.as_str()),
        (201, first.body.as_str()),
        "the stored 201 stays"
    );
    assert_eq!(
        reconcile(&app, Duration::from_secs(60)).await,
        ReconcileReport::default(),
        "nothing left"
    );
}

/// `requires_action` at the provider, then canceled there: 201 `pending`
/// with the whole charge reserved, then failed (`canceled`) with its
/// reservation released, so a new refund of the whole charge succeeds.
async fn a_pending_refund_the_provider_cancels_fails_and_releases_its_reservation(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge_id = paid(&app, 1000).await;
    app.configure_sandbox(json!({"refund_status": "requires_action"}))
        .await;
    let key = new_key();
    let first = refund(&app, &charge_id, &key, &json!({})).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let created = first.json();
    assert_eq!(
        (&created["status"], &created["amount_cents"]),
        (&json!("pending"), &json!(1000))
    );
    let refund_id = created["id"].as_str().unwrap().to_owned();
    let nothing_left = refund(&app, &charge_id, &new_key(), &json!({"amount_cents": 1})).await;
    assert_eq!(nothing_left.status, 400, "{}", nothing_left.body);
    assert_eq!(nothing_left.json()["error"]["refundable_amount_cents"], 0);

    assert_eq!(
        reconcile(&app, Duration::from_secs(60)).await,
        ReconcileReport {
            pending: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(refund_status(&app, &refund_id).await["status"], "pending");

    settle_at_provider(
        &app,
        created["gateway_refund_id"].as_str().unwrap(),
        "canceled",
    )
    .await;
    let report = reconcile(&app, Duration::from_secs(60)).await;
    assert_eq!(
        report,
        ReconcileReport {
            failed: 1,
            ..ReconcileReport::default()
        }
    );
    let failed = refund_status(&app, &refund_id).await;
    assert_eq!(
        (&failed["status"], &failed["failure_code"]),
        (&json!("failed"), &json!("canceled"))
    );
    assert_eq!(amount_refunded(&app, &charge_id).await, 0);
    let replay = refund(&app, &charge_id, &key, &json!({})).await;
    assert_eq!((replay.status, replay.body), (201, first.body));

    // Released: the whole charge can be refunded again.
    app.configure_sandbox(json!({})).await;
    let again = refund(&app, &charge_id, &new_key(), &json!({})).await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(
        (&again.json()["status"], &again.json()["amount_cents"]),
        (&json!("succeeded"), &json!(1000))
    );
    assert_eq!(amount_refunded(&app, &charge_id).await, 1000);
}

/// A refund the provider answers `canceled` is final at once: a stored 402
/// `refund_failed`, replayed, the refund failed and its reservation
/// released (the whole charge can still be refunded).
async fn a_refund_answered_canceled_is_a_final_402(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge_id = paid(&app, 1000).await;
    app.configure_sandbox(json!({"refund_status": "canceled"}))
        .await;
    let key = new_key();
    let body = json!({"amount_cents": 400});
    let first = refund(&app, &charge_id, &key, &body).await;
    assert_eq!(first.status, 402, "{}", first.body);
    let error = first.json();
    assert_eq!(error["error"]["code"], "refund_failed");
    assert_eq!(error["error"]["decline_code"], "canceled");
    let replay = refund(&app, &charge_id, &key, &body).await;
    assert_eq!((replay.status, replay.replayed), (402, true));
    assert_eq!(replay.body, first.body);
    assert_eq!(app.db.refunds_with_status("failed").await, 1);
    assert_eq!(
        app.sandbox_refunds().await.len(),
        1,
        "one call, not re-driven"
    );

    app.configure_sandbox(json!({})).await;
    let whole = refund(&app, &charge_id, &new_key(), &json!({})).await;
    assert_eq!(whole.status, 201, "{}", whole.body);
    assert_eq!(whole.json()["amount_cents"], 1000, "the 400 were released");
}

backend_tests!(
    a_pending_refund_is_201_pending_and_reconciled_when_it_succeeds,
    a_pending_refund_the_provider_cancels_fails_and_releases_its_reservation,
    a_refund_answered_canceled_is_a_final_402,
);
