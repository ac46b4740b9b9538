//! Issue 23, section 3: provider answers read as Stripe documents them,
//! through the real router and the real sandbox.

use serde_json::{Value, json};

use payments_tests::{Answer, AppOptions, Backend, backend_tests, charge_body, new_key, spawn_app};

/// Item 3.4: a provider 500 is saved under the provider key and replayed
/// to every call with it, as at Stripe. The first 500 is an unknown outcome
/// (503); the client's retry re-drives and gets the replayed 500, so the
/// operation is abandoned to reconciliation (500 `request_abandoned`), and
/// no later retry calls the provider again.
async fn a_replayed_provider_error_is_not_redriven(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    app.configure_sandbox(json!({"error_rate": 1.0})).await;
    let key = new_key();
    let body = charge_body(1200, "tok_mastercard");
    let first = Answer::of(app.post_charge("cus_1", Some(&key), &body).await).await;
    assert_eq!(first.status, 503, "{}", first.body);
    assert_eq!(app.sandbox_stats().await["requests"], 1);
    // The provider is healthy again; its saved 500 is not.
    app.configure_sandbox(json!({})).await;
    let retry = Answer::of(app.post_charge("cus_1", Some(&key), &body).await).await;
    assert_eq!(retry.status, 500, "{}", retry.body);
    assert_eq!(retry.body["error"]["code"], "request_abandoned");
    assert_eq!(app.sandbox_stats().await["requests"], 2);
    for _ in 0..3 {
        let later = app.post_charge("cus_1", Some(&key), &body).await;
        assert_eq!(later.status(), 500);
        assert_eq!(later.headers()["idempotent-replay"], "true");
    }
    assert_eq!(
        app.sandbox_stats().await["requests"],
        2,
        "never re-driven a third time"
    );
    assert_eq!(
        app.db.records_for_key(&key, "abandoned", Some(500)).await,
        1
    );
    assert_eq!(app.db.charges_with_status("unknown").await, 1);
    assert_eq!(app.sandbox_charges().await.len(), 0);
}

/// Whether key-refused outcomes of `call` were counted (the series exists
/// at 0 from the start).
async fn key_refused(app: &payments_tests::TestApp, call: &str) -> bool {
    app.metrics_text().await.lines().any(|line| {
        line.starts_with("payments_provider_outcomes_total{")
            && line.contains(r#"outcome="key_refused""#)
            && line.contains(&format!(r#"call="{call}""#))
            && line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v > 0.0)
    })
}

/// Item 3.6: the provider refusing our secret key (401; 403 for a
/// restricted key) is a configuration error: 500 `provider_misconfigured`,
/// no `Retry-After`, nothing stored, the charge or refund left as it was
/// (pending, its refund's reservation held), counted in the provider
/// outcomes; once the provider accepts the key, the same Idempotency-Key
/// succeeds with exactly one provider charge or refund.
async fn a_refused_secret_key_is_a_configuration_error(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let paid = app
        .charge_json("cus_1", &charge_body(5000, "tok_visa"))
        .await;
    let paid_id = paid["id"].as_str().unwrap();
    let key = new_key();
    let body = charge_body(1200, "tok_visa");
    let refund_key = new_key();
    let refund = json!({"amount_cents": 700});
    for config in [
        json!({"secret_key": "sk_test_rotated"}),
        json!({"secret_key": "sk_test_rotated", "restricted_key": "sk_test_sandbox"}),
    ] {
        app.configure_sandbox(config.clone()).await;
        let charge = Answer::of(app.post_charge("cus_1", Some(&key), &body).await).await;
        let refunded = app
            .post_refund("cus_1", paid_id, &refund_key, &refund)
            .await;
        for answer in [&charge, &refunded] {
            assert_eq!(answer.status, 500, "{config}: {}", answer.body);
            assert_eq!(answer.body["error"]["code"], "provider_misconfigured");
            assert!(answer.headers.get("retry-after").is_none(), "{config}");
            assert!(
                answer.headers.get("idempotent-replay").is_none(),
                "{config}"
            );
        }
        assert_eq!(app.db.records_for_key(&key, "in_progress", None).await, 1);
        assert_eq!(
            app.db
                .records_for_key(&refund_key, "in_progress", None)
                .await,
            1
        );
        assert_eq!(app.db.charges_with_status("pending").await, 1);
        assert_eq!(app.db.refunds_with_status("pending").await, 1);
    }
    // The reservation is held: a second refund of what is left fits only
    // beside it (5000 - 700 = 4300).
    app.configure_sandbox(json!({})).await;
    let too_much = app
        .post_refund("cus_1", paid_id, &new_key(), &json!({"amount_cents": 4301}))
        .await;
    assert_eq!(too_much.status, 400, "{}", too_much.body);
    assert_eq!(too_much.body["error"]["code"], "refund_exceeds_charge");
    assert!(key_refused(&app, "charges").await && key_refused(&app, "refunds").await);

    let charged = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(charged.status(), 201);
    let refunded = app
        .post_refund("cus_1", paid_id, &refund_key, &refund)
        .await;
    assert_eq!(refunded.status, 201, "{}", refunded.body);
    assert_eq!(
        app.sandbox_charges().await.len(),
        2,
        "the paid one and this one"
    );
    assert_eq!(app.sandbox_refunds().await.len(), 1);
    let charge: Value = charged.json().await.unwrap();
    assert_eq!(charge["status"], "succeeded");
}

backend_tests!(
    a_replayed_provider_error_is_not_redriven,
    a_refused_secret_key_is_a_configuration_error,
);
