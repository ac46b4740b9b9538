//! The idempotency contract of `POST /api/charges`.

use std::time::Duration;

use payments_sandbox::SandboxConfig;
use payments_tests::{AppOptions, Backend, backend_tests, charge_body, new_key, spawn_app};
use serde_json::{Value, json};

fn slow(latency_ms: u64) -> AppOptions {
    AppOptions {
        sandbox: SandboxConfig {
            latency_ms,
            ..SandboxConfig::default()
        },
        ..AppOptions::default()
    }
}

/// 20 parallel requests with one key: only 201 or 409, the 409s say
/// `request_in_progress` with `Retry-After`, one charge at the provider and
/// one row in the database.
async fn parallel_requests_with_one_key_charge_once(backend: Backend) {
    let Some(app) = spawn_app(backend, slow(300)).await else {
        return;
    };
    let app = std::sync::Arc::new(app);
    let key = new_key();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            let key = key.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let r = app
                    .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
                    .await;
                let status = r.status().as_u16();
                let retry_after = r
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned());
                let body: Value = r.json().await.unwrap();
                (status, retry_after, body)
            })
        })
        .collect();
    let mut created = 0;
    let mut conflicts = 0;
    for t in tasks {
        let (status, retry_after, body) = t.await.unwrap();
        match status {
            201 => created += 1,
            409 => {
                conflicts += 1;
                assert_eq!(body["error"]["code"], "request_in_progress");
                assert_eq!(retry_after.as_deref(), Some("2"));
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert!(created >= 1);
    assert!(
        conflicts >= 1,
        "with a 300 ms provider, concurrent duplicates see the lease"
    );
    assert_eq!(
        app.sandbox_charges().await.len(),
        1,
        "one charge at the provider"
    );
    assert_eq!(app.db.charges().await, 1, "one charges row");
    assert_eq!(app.db.charges_with_status("succeeded").await, 1);
}

/// A sequential retry replays the first answer byte for byte.
async fn sequential_retry_replays_byte_for_byte(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let key = new_key();
    let body = r#"{"amount_cents": 4900, "currency": "GBP", "card_token": "tok_visa", "description": "tea", "metadata": {"order": "42"}}"#;
    let first = app.post_charge("cus_1", Some(&key), body).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replay").is_none());
    assert!(first.headers().get("idempotent-replayed").is_none());
    let location = first.headers()["location"].to_str().unwrap().to_owned();
    let first_bytes = first.bytes().await.unwrap();
    let charge: Value = serde_json::from_slice(&first_bytes).unwrap();
    assert_eq!(
        location,
        format!("/api/charges/{}", charge["id"].as_str().unwrap())
    );
    assert_eq!(charge["status"], "succeeded");
    assert_eq!(charge["amount_cents"], 4900);
    assert_eq!(charge["currency"], "GBP");
    assert_eq!(charge["customer_id"], "cus_1");
    assert_eq!(charge["metadata"], json!({"order": "42"}));
    assert!(
        charge["gateway_charge_id"]
            .as_str()
            .unwrap()
            .starts_with("ch_")
    );

    for _ in 0..3 {
        let again = app.post_charge("cus_1", Some(&key), body).await;
        assert_eq!(again.status(), 201);
        assert_eq!(again.headers()["idempotent-replay"], "true");
        // Stripe's name too, which its SDKs read.
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.headers()["location"].to_str().unwrap(), location);
        assert_eq!(again.headers()["content-type"], "application/json");
        assert_eq!(
            again.bytes().await.unwrap(),
            first_bytes,
            "byte-identical replay"
        );
    }
    // The charge reads back as it was returned.
    let read = app
        .http
        .get(format!("{}{location}", app.base_url))
        .bearer_auth(app.token("cus_1"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    assert_eq!(read.bytes().await.unwrap(), first_bytes);
    assert_eq!(app.sandbox_charges().await.len(), 1);
    assert_eq!(app.db.charges().await, 1);
}

/// The same key with another body is refused with 422 and charges nothing.
async fn same_key_other_body_is_refused(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let key = new_key();
    assert_eq!(
        app.post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
            .await
            .status(),
        201
    );
    let other = app
        .post_charge("cus_1", Some(&key), &charge_body(5000, "tok_visa"))
        .await;
    assert_eq!(other.status(), 422);
    let body: Value = other.json().await.unwrap();
    assert_eq!(body["error"]["code"], "idempotency_key_reused");
    assert_eq!(app.sandbox_charges().await.len(), 1);
    assert_eq!(app.db.charges().await, 1);
    assert_eq!(app.db.records().await, 1);
}

/// Key order and whitespace do not make a different request.
async fn reordered_json_is_a_replay(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let key = new_key();
    let first = app
        .post_charge("cus_1", Some(&key), r#"{"amount_cents":4900,"currency":"GBP","card_token":"tok_visa","metadata":{"a":"1","b":"2"}}"#)
        .await;
    assert_eq!(first.status(), 201);
    let reordered = app
        .post_charge(
            "cus_1",
            Some(&key),
            "{\n  \"metadata\": {\"b\": \"2\", \"a\": \"1\"},\n  \"card_token\": \"tok_visa\",\n  \"currency\": \"GBP\",\n  \"amount_cents\": 4900\n}",
        )
        .await;
    assert_eq!(reordered.status(), 201);
    assert_eq!(reordered.headers()["idempotent-replay"], "true");
    assert_eq!(app.sandbox_charges().await.len(), 1);
}

/// A key first used by another customer is a 422 that reveals nothing of
/// the first use, whether that use is complete or still in flight.
async fn another_customers_key_reveals_nothing(backend: Backend) {
    let Some(app) = spawn_app(backend, slow(400)).await else {
        return;
    };
    let app = std::sync::Arc::new(app);
    let key = new_key();
    let first = {
        let app = app.clone();
        let key = key.clone();
        tokio::spawn(async move {
            app.post_charge("cus_owner", Some(&key), &charge_body(4900, "tok_visa"))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    // In flight: not a 409 (that would tell the key is in use), a 422.
    let during = app
        .post_charge("cus_thief", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(during.status(), 422);
    let first = first.await.unwrap();
    assert_eq!(first.status(), 201);
    let charge: Value = first.json().await.unwrap();
    let after = app
        .post_charge("cus_thief", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(after.status(), 422);
    assert!(after.headers().get("location").is_none());
    let text = after.text().await.unwrap();
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"]["code"], "idempotency_key_reused");
    assert!(!text.contains(charge["id"].as_str().unwrap()));
    assert!(!text.contains("cus_owner"));
    assert!(!text.contains("4900"));
    // The thief cannot read the charge either.
    let read = app
        .http
        .get(format!(
            "{}/api/charges/{}",
            app.base_url,
            charge["id"].as_str().unwrap()
        ))
        .bearer_auth(app.token("cus_thief"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 404);
    assert_eq!(app.sandbox_charges().await.len(), 1);
    assert_eq!(app.db.charges().await, 1);
}

/// A decline is a final answer: 402 with the decline code, stored and replayed.
async fn decline_is_stored_and_replayed(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let key = new_key();
    let body = charge_body(4900, "tok_chargeDeclinedInsufficientFunds");
    let first = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(first.status(), 402);
    let first_bytes = first.bytes().await.unwrap();
    let error: Value = serde_json::from_slice(&first_bytes).unwrap();
    assert_eq!(error["error"]["code"], "card_declined");
    assert_eq!(error["error"]["decline_code"], "insufficient_funds");
    let again = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(again.status(), 402);
    assert_eq!(again.headers()["idempotent-replay"], "true");
    assert_eq!(again.bytes().await.unwrap(), first_bytes);
    assert_eq!(
        app.sandbox_attempts().await.len(),
        1,
        "the provider saw one attempt"
    );
    assert_eq!(app.sandbox_charges().await.len(), 0);
    assert_eq!(app.db.charges_with_status("failed").await, 1);
}

/// The provider charges and the connection drops before the answer: 503,
/// the key stays recoverable, and the retry gets 201 with one charge.
async fn dropped_provider_answer_is_recovered_by_retry(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    app.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let key = new_key();
    let body = charge_body(4900, "tok_visa");
    let first = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(first.status(), 503);
    assert_eq!(first.headers()["retry-after"], "2");
    let error: Value = first.json().await.unwrap();
    assert_eq!(error["error"]["code"], "gateway_unavailable");
    assert_eq!(
        app.sandbox_charges().await.len(),
        1,
        "the provider did charge"
    );
    assert_eq!(app.db.charges_with_status("pending").await, 1);

    app.configure_sandbox(json!({})).await;
    let retry = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(retry.status(), 201);
    assert!(
        retry.headers().get("idempotent-replay").is_none(),
        "the first final answer"
    );
    let charge: Value = retry.json().await.unwrap();
    assert_eq!(charge["status"], "succeeded");
    let at_provider = app.sandbox_charges().await;
    assert_eq!(at_provider.len(), 1, "the re-drive did not charge again");
    assert_eq!(at_provider[0]["id"], charge["gateway_charge_id"]);
    assert_eq!(app.db.charges().await, 1);
    assert_eq!(app.db.charges_with_status("succeeded").await, 1);
    let replay = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(replay.headers()["idempotent-replay"], "true");
}

/// A provider error a retry recovers from is an unknown outcome; once it
/// passes, the retry with the same key charges exactly once. At Stripe
/// that is a 429 from its rate limiter (answered before the idempotency
/// layer, saved nowhere), not a 500, which is saved and replayed under the
/// key (`provider::a_replayed_provider_error_is_not_redriven`).
async fn provider_errors_are_retryable(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    app.configure_sandbox(json!({"rate_limit_rate": 1.0})).await;
    let key = new_key();
    let body = charge_body(1200, "tok_mastercard");
    for _ in 0..3 {
        assert_eq!(
            app.post_charge("cus_1", Some(&key), &body).await.status(),
            503
        );
    }
    assert_eq!(app.sandbox_charges().await.len(), 0);
    app.configure_sandbox(json!({})).await;
    assert_eq!(
        app.post_charge("cus_1", Some(&key), &body).await.status(),
        201
    );
    assert_eq!(
        app.post_charge("cus_1", Some(&key), &body).await.status(),
        201
    );
    assert_eq!(app.sandbox_charges().await.len(), 1);
    assert_eq!(app.db.charges().await, 1);
}

/// Different keys are different charges, even with the same body.
async fn different_keys_are_different_charges(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let body = charge_body(300, "tok_visa");
    for _ in 0..3 {
        assert_eq!(
            app.post_charge("cus_1", Some(&new_key()), &body)
                .await
                .status(),
            201
        );
    }
    assert_eq!(app.sandbox_charges().await.len(), 3);
    assert_eq!(app.db.charges().await, 3);
}

/// A charge body in `currency`.
fn in_currency(currency: &str) -> String {
    format!(r#"{{"amount_cents":4900,"currency":"{currency}","card_token":"tok_visa"}}"#)
}

/// Lower case is Stripe's: `gbp` is accepted, stored and answered `GBP`,
/// and the same key then sent with `GBP` or `Gbp` is the same request, a
/// byte-for-byte replay, not a 422. Its refunds are in `GBP` too.
async fn currency_case_is_one_request(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let key = new_key();
    let first = app
        .post_charge("cus_1", Some(&key), &in_currency("gbp"))
        .await;
    assert_eq!(first.status(), 201);
    let first_bytes = first.bytes().await.unwrap();
    let charge: Value = serde_json::from_slice(&first_bytes).unwrap();
    assert_eq!(charge["currency"], "GBP", "{charge}");
    for other_case in ["GBP", "Gbp", "gbp"] {
        let again = app
            .post_charge("cus_1", Some(&key), &in_currency(other_case))
            .await;
        assert_eq!(again.status(), 201, "{other_case}");
        assert_eq!(again.headers()["idempotent-replay"], "true", "{other_case}");
        assert_eq!(again.bytes().await.unwrap(), first_bytes, "{other_case}");
    }
    // Another currency under the key is another request.
    let usd = app
        .post_charge("cus_1", Some(&key), &in_currency("usd"))
        .await;
    assert_eq!(usd.status(), 422);
    let id = charge["id"].as_str().unwrap();
    let read = app.get_as("cus_1", &format!("/api/charges/{id}")).await;
    assert_eq!(read.body["currency"], "GBP");
    let refund = app
        .post_refund("cus_1", id, &new_key(), &json!({"amount_cents": 100}))
        .await;
    assert_eq!(refund.status, 201, "{}", refund.body);
    assert_eq!(refund.body["currency"], "GBP");
    assert_eq!(
        app.sandbox_charges().await.len(),
        1,
        "one charge at the provider"
    );
    assert_eq!(app.db.charges().await, 1, "one charges row");
}

/// The same, racing: one key sent at once in three cases is one charge,
/// each answer a 201 or a 409 (never a 422), and a retry then replays it.
async fn currency_case_racing_is_one_charge(backend: Backend) {
    let Some(app) = spawn_app(backend, slow(300)).await else {
        return;
    };
    let app = std::sync::Arc::new(app);
    let key = new_key();
    let cases = ["gbp", "GBP", "Gbp", "gbp", "GBP", "Gbp"];
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(cases.len()));
    let tasks: Vec<_> = cases
        .iter()
        .map(|currency| {
            let (app, key, barrier) = (app.clone(), key.clone(), barrier.clone());
            let body = in_currency(currency);
            tokio::spawn(async move {
                barrier.wait().await;
                let r = app.post_charge("cus_1", Some(&key), &body).await;
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        match task.await.unwrap() {
            (201, charge) => {
                assert_eq!(charge["currency"], "GBP");
                created += 1;
            }
            (409, body) => assert_eq!(body["error"]["code"], "request_in_progress"),
            (status, body) => panic!("unexpected {status}: {body}"),
        }
    }
    assert!(created >= 1);
    let retry = app
        .post_charge("cus_1", Some(&key), &in_currency("gBp"))
        .await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replay"], "true");
    assert_eq!(
        app.sandbox_charges().await.len(),
        1,
        "one charge at the provider"
    );
    assert_eq!(app.db.charges().await, 1, "one charges row");
    assert_eq!(app.db.records().await, 1);
}

backend_tests!(
    currency_case_is_one_request,
    currency_case_racing_is_one_charge,
);

backend_tests!(
    parallel_requests_with_one_key_charge_once,
    sequential_retry_replays_byte_for_byte,
    same_key_other_body_is_refused,
    reordered_json_is_a_replay,
    another_customers_key_reveals_nothing,
    decline_is_stored_and_replayed,
    dropped_provider_answer_is_recovered_by_retry,
    provider_errors_are_retryable,
    different_keys_are_different_charges,
);

/// A card token the provider does not know is the provider refusing the
/// request (Stripe's 400 `invalid_request_error`), not a declined card:
/// a stored 400 `provider_rejected_request` with the provider's code and
/// message, final (nothing was charged, a retry would get the same
/// answer), never a 402 `card_declined` and never a 503 loop.
async fn a_request_the_provider_rejects_is_final_and_not_a_decline(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let key = new_key();
    let body = charge_body(4900, "tok_doesNotExist");
    let first = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(first.status(), 400);
    assert!(
        first.headers().get("retry-after").is_none(),
        "final: no retry"
    );
    let error: Value = first.json().await.unwrap();
    assert_eq!(
        error["error"]["code"], "provider_rejected_request",
        "{error}"
    );
    assert_eq!(error["error"]["provider_code"], "resource_missing");
    assert!(error["error"].get("decline_code").is_none(), "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("No such token"),
        "the provider's message: {message}"
    );
    let charge_id = error["error"]["charge_id"].as_str().unwrap();
    let again = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(again.status(), 400);
    assert_eq!(again.headers()["idempotent-replay"], "true");
    let replayed: Value = again.json().await.unwrap();
    assert_eq!(replayed, error, "the stored answer, replayed");
    assert_eq!(app.db.charges_with_status("failed").await, 1);
    assert_eq!(app.db.charges().await, 1);
    let read = app
        .get_as("cus_1", &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(read.body["status"], "failed", "{}", read.body);
    assert_eq!(app.sandbox_charges().await.len(), 0);
    assert_eq!(app.sandbox_stats().await["requests"], 1, "called once");
}

/// An amount below the provider's minimum for its currency is refused up
/// front: 400 `invalid_request` on `amount_cents`, nothing stored, the
/// provider never called; the same key then works with a valid amount.
async fn an_amount_below_the_providers_minimum_is_refused_up_front(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let key = new_key();
    let below = r#"{"amount_cents":49,"currency":"USD","card_token":"tok_visa"}"#;
    let refused = app.post_charge("cus_1", Some(&key), below).await;
    assert_eq!(refused.status(), 400);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "invalid_request");
    assert_eq!(error["error"]["param"], "amount_cents");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at least 50 for USD")
    );
    assert_eq!(app.db.charges().await, 0);
    assert_eq!(app.db.records().await, 0);
    assert_eq!(app.sandbox_stats().await["requests"], 0);
    let at = r#"{"amount_cents":50,"currency":"USD","card_token":"tok_visa"}"#;
    assert_eq!(app.post_charge("cus_1", Some(&key), at).await.status(), 201);
}

/// A 503 says why the outcome is unknown: a timeout, a dropped connection
/// or a provider error, each with the same code and the same advice.
async fn an_unknown_outcome_says_why(backend: Backend) {
    let Some(app) = spawn_app(
        backend,
        AppOptions {
            gateway_timeout: Duration::from_secs(1),
            ..AppOptions::default()
        },
    )
    .await
    else {
        return;
    };
    let cases = [
        (json!({"latency_ms": 2500}), "did not answer in time"),
        (
            json!({"drop_after_charge": true}),
            "connection to the payment provider was lost",
        ),
        (json!({"error_rate": 1.0}), "answered with an error"),
    ];
    for (config, says) in cases {
        app.configure_sandbox(config.clone()).await;
        let answer = app
            .post_charge("cus_1", Some(&new_key()), &charge_body(4900, "tok_visa"))
            .await;
        assert_eq!(answer.status(), 503, "{config}");
        assert_eq!(answer.headers()["retry-after"], "2");
        let error: Value = answer.json().await.unwrap();
        assert_eq!(error["error"]["code"], "gateway_unavailable");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{config}: {message}");
        assert!(message.contains("same idempotency key"), "{message}");
    }
}

backend_tests!(
    a_request_the_provider_rejects_is_final_and_not_a_decline,
    an_amount_below_the_providers_minimum_is_refused_up_front,
    an_unknown_outcome_says_why,
);
