//! Issue 23, section 3, first point: a refund the provider answers for
//! another amount is never a success.

use payments_tests::{AppOptions, Backend, backend_tests, charge_body, new_key, spawn_app};
use serde_json::json;

use crate::observability::metric;

/// The provider answers 200 `succeeded` for 300 to a refund of 400: the
/// refund is abandoned at once as unknown (`500 request_abandoned`, the
/// same to a retry, with no second provider call), its 400 stays reserved,
/// and `payments_provider_mismatch_total` rises.
async fn a_refund_answered_with_another_amount_is_never_a_success(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_1", &charge_body(1000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().unwrap();
    let before = metric(&app, "payments_provider_mismatch_total").await;
    app.configure_sandbox(json!({"answer_amount_override": 300}))
        .await;
    let key = new_key();
    let body = json!({"amount_cents": 400});

    let answer = app.post_refund("cus_1", charge_id, &key, &body).await;
    assert_ne!(
        answer.status, 201,
        "a refund of 300 taken for 400: {}",
        answer.body
    );
    assert_eq!(
        (answer.status, answer.body["error"]["code"].as_str()),
        (500, Some("request_abandoned")),
        "{}",
        answer.body
    );
    assert_eq!(app.db.refunds_with_status("unknown").await, 1);
    let after = metric(&app, "payments_provider_mismatch_total").await;
    assert!(
        after >= before + 1.0,
        "mismatches went from {before} to {after}"
    );

    app.configure_sandbox(json!({})).await;
    let retry = app.post_refund("cus_1", charge_id, &key, &body).await;
    assert_eq!(retry.status, 500, "{}", retry.body);
    assert_eq!(retry.headers["idempotent-replay"], "true");
    assert_eq!(app.sandbox_refunds().await.len(), 1, "one provider call");
    app.assert_refund_does_not_fit(charge_id, 700).await;
}

backend_tests!(a_refund_answered_with_another_amount_is_never_a_success);
