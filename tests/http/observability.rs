//! Metrics and the rollout mode, as ops and client teams see them.

use std::sync::Arc;

use payments_api::config::KeyMode;
use payments_sandbox::SandboxConfig;
use payments_tests::{
    AppOptions, Backend, TestApp, backend_tests, charge_body, new_key, spawn_app,
};
use serde_json::Value;

/// The sum of every sample of `name` (all label sets) in `/metrics`.
pub(crate) async fn metric(app: &TestApp, name: &str) -> f64 {
    let text = app.metrics_text().await;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// After a replay, a 409, a 422 and a keyless request, each counter went up.
/// (Counters are process-wide and other tests run alongside: deltas are
/// at least what this test caused.)
async fn metrics_count_replays_conflicts_and_keyless_requests(backend: Backend) {
    let options = AppOptions {
        sandbox: SandboxConfig {
            latency_ms: 400,
            ..SandboxConfig::default()
        },
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    let app = Arc::new(app);
    let names = [
        "payments_idempotent_replays_total",
        "payments_idempotency_conflicts_total",
        "payments_idempotency_key_reused_total",
        "payments_keyless_requests_total",
        "payments_http_requests_total",
        "payments_provider_outcomes_total",
    ];
    let mut before = Vec::new();
    for n in names {
        before.push(metric(&app, n).await);
    }
    let key = new_key();
    let first = {
        let (app, key) = (app.clone(), key.clone());
        tokio::spawn(async move {
            app.post_charge("cus_m", Some(&key), &charge_body(100, "tok_visa"))
                .await
                .status()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    assert_eq!(
        app.post_charge("cus_m", Some(&key), &charge_body(100, "tok_visa"))
            .await
            .status(),
        409
    );
    assert_eq!(first.await.unwrap(), 201);
    assert_eq!(
        app.post_charge("cus_m", Some(&key), &charge_body(100, "tok_visa"))
            .await
            .status(),
        201
    );
    assert_eq!(
        app.post_charge("cus_m", Some(&key), &charge_body(101, "tok_visa"))
            .await
            .status(),
        422
    );
    assert_eq!(
        app.post_charge("cus_m", None, &charge_body(100, "tok_visa"))
            .await
            .status(),
        400
    );
    for (n, was) in names.iter().zip(before) {
        let now = metric(&app, n).await;
        assert!(now >= was + 1.0, "{n} went from {was} to {now}");
    }
    let text = app.metrics_text().await;
    assert!(
        text.contains(r#"route="/api/charges/{id}""#) || text.contains(r#"route="/api/charges""#),
        "requests are labelled by route pattern"
    );
    assert!(
        text.contains("payments_provider_request_duration_seconds_bucket"),
        "provider latency histogram"
    );
}

/// `optional`: a keyless request is served, and its answer warns that keys
/// will be required, linking the client guide. `required`: 400 with the link.
async fn rollout_mode_warns_then_requires(backend: Backend) {
    let optional = AppOptions {
        key_mode: KeyMode::Optional,
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, optional).await else {
        return;
    };
    let served = app
        .post_charge("cus_r", None, &charge_body(100, "tok_visa"))
        .await;
    assert_eq!(served.status(), 201);
    let warning = served.headers()["warning"].to_str().unwrap().to_owned();
    assert!(warning.starts_with("299 - \""), "{warning}");
    assert!(
        warning.contains("Idempotency-Key will be required") && warning.contains("client-guide"),
        "{warning}"
    );
    let keyed = app
        .post_charge("cus_r", Some(&new_key()), &charge_body(100, "tok_visa"))
        .await;
    assert!(keyed.headers().get("warning").is_none());

    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let refused = app
        .post_charge("cus_r", None, &charge_body(100, "tok_visa"))
        .await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "idempotency_key_missing");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("client-guide")
    );
    assert_eq!(app.db.charges().await, 0);
}

backend_tests!(
    metrics_count_replays_conflicts_and_keyless_requests,
    rollout_mode_warns_then_requires,
);

/// Every answer to a charge or a refund, whatever its status, says how
/// long the server remembers keys (`Idempotency-Key-TTL`, seconds): the
/// client guide's resume window follows from it, and apps cannot reach
/// `/readyz`. The TTL here is the test app's, 2 h, not the default.
#[tokio::test]
async fn every_charge_and_refund_answer_states_the_key_ttl() {
    let options = AppOptions {
        ttl: std::time::Duration::from_secs(2 * 3600),
        ..AppOptions::default()
    };
    let app = spawn_app(Backend::Sqlite, options)
        .await
        .expect("SQLite is always available");
    let ttl_of = |headers: &reqwest::header::HeaderMap| {
        headers
            .get("idempotency-key-ttl")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let expected = Some("7200".to_owned());
    let key = new_key();
    let body = charge_body(4900, "tok_visa");
    let created = app.post_charge("cus_ttl", Some(&key), &body).await;
    assert_eq!(created.status(), 201);
    assert_eq!(ttl_of(created.headers()), expected, "201");
    let charge: Value = created.json().await.unwrap();
    let replay = app.post_charge("cus_ttl", Some(&key), &body).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(ttl_of(replay.headers()), expected, "replay");
    let reused = app
        .post_charge("cus_ttl", Some(&key), &charge_body(5000, "tok_visa"))
        .await;
    assert_eq!(reused.status(), 422);
    assert_eq!(ttl_of(reused.headers()), expected, "422");
    let invalid = app.post_charge("cus_ttl", Some(&new_key()), "{}").await;
    assert_eq!(invalid.status(), 400);
    assert_eq!(ttl_of(invalid.headers()), expected, "400");
    let declined = app
        .post_charge(
            "cus_ttl",
            Some(&new_key()),
            &charge_body(4900, "tok_chargeDeclined"),
        )
        .await;
    assert_eq!(declined.status(), 402);
    assert_eq!(ttl_of(declined.headers()), expected, "402");
    let unauthenticated = reqwest::Client::new()
        .post(format!("{}/api/charges", app.base_url))
        .header("idempotency-key", new_key())
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);
    assert_eq!(ttl_of(unauthenticated.headers()), expected, "401");
    let id = charge["id"].as_str().unwrap();
    let refund = app
        .post_refund(
            "ops_ttl",
            id,
            &new_key(),
            &serde_json::json!({"amount_cents": 100}),
        )
        .await;
    assert_eq!(refund.status, 201);
    assert_eq!(ttl_of(&refund.headers), expected, "refund 201");
    let too_much = app
        .post_refund(
            "ops_ttl",
            id,
            &new_key(),
            &serde_json::json!({"amount_cents": 999_999}),
        )
        .await;
    assert_eq!(too_much.status, 400);
    assert_eq!(ttl_of(&too_much.headers), expected, "refund 400");
    let customers = app
        .post_refund_with(
            &app.token("cus_ttl"),
            id,
            &new_key(),
            &serde_json::json!({}),
        )
        .await;
    assert_eq!(customers.status, 403);
    assert_eq!(ttl_of(&customers.headers), expected, "refund 403");
}
