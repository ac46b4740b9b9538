//! Exactly once across time: the provider's key retention, records whose
//! outcome is unresolved, leases counted from the claim, and a finish that
//! lost its record. Time moves by ageing rows ([`TestDb::age`]), so the
//! database's own clock sees them older; nothing here sleeps for hours.
//!
//! [`TestDb::age`]: payments_tests::TestDb::age

use std::sync::Arc;
use std::time::Duration;

use payments_sandbox::SandboxConfig;
use payments_tests::{
    AppOptions, Backend, TestApp, backend_tests, charge_body, new_key, spawn_app,
};

/// The app these tests run: they age records by SQL, which shortens a
/// record's TTL behind the back of a copy in memory, so no replay cache.
fn aged() -> AppOptions {
    AppOptions {
        replay_cache: false,
        ..AppOptions::default()
    }
}
use serde_json::{Value, json};

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

/// `n` requests with `key` at once as `customer`: (status, body) each.
async fn storm(app: &Arc<TestApp>, n: usize, customer: &str, key: &str) -> Vec<(u16, Value)> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (app, barrier) = (app.clone(), barrier.clone());
            let (customer, key) = (customer.to_owned(), key.to_owned());
            tokio::spawn(async move {
                barrier.wait().await;
                let r = app
                    .post_charge(&customer, Some(&key), &charge_body(4900, "tok_visa"))
                    .await;
                (r.status().as_u16(), r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// A charge by `customer` with `key`, sent in its own task: (status,
/// `Retry-After`, body).
fn spawn_post(
    app: &Arc<TestApp>,
    customer: &str,
    key: &str,
) -> tokio::task::JoinHandle<(u16, Option<String>, Value)> {
    let (app, customer, key) = (app.clone(), customer.to_owned(), key.to_owned());
    tokio::spawn(async move {
        let r = app
            .post_charge(&customer, Some(&key), &charge_body(4900, "tok_visa"))
            .await;
        let retry_after = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (r.status().as_u16(), retry_after, r.json().await.unwrap())
    })
}

/// The provider charged, the answer was lost (503, the record stays in
/// progress), and the provider then forgets every key: a retry that
/// re-drove the old provider key now would make a second, real charge.
async fn charged_then_forgotten(app: &TestApp, customer: &str, key: &str) {
    app.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let first = app
        .post_charge(customer, Some(key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(first.status(), 503);
    app.configure_sandbox(json!({"key_retention_secs": 0}))
        .await;
    assert_eq!(app.sandbox_charges().await.len(), 1);
}

/// Defect 1: a record claimed longer ago than the provider's key retention
/// minus the margin (24 h - 1 h) is never re-driven. The retries that find
/// it (eight at once) abandon it without a provider call: they answer the
/// stored 500 `request_abandoned`, or 409 while one of them abandons it.
async fn a_record_past_the_key_retention_is_abandoned_not_redriven(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let app = Arc::new(app);
    let key = new_key();
    charged_then_forgotten(&app, "cus_1", &key).await;
    app.db.age(Some(&key), 23 * HOUR + 30 * MINUTE).await;

    let answers = storm(&app, 8, "cus_1", &key).await;
    let mut abandoned = 0;
    for (status, body) in &answers {
        match status {
            500 => {
                assert_eq!(body["error"]["code"], "request_abandoned", "{body}");
                abandoned += 1;
            }
            409 => assert_eq!(body["error"]["code"], "request_in_progress", "{body}"),
            other => panic!("a record past the key retention answered {other}: {body}"),
        }
    }
    assert!(abandoned >= 1, "{answers:?}");
    let stats = app.sandbox_stats().await;
    assert_eq!(
        stats["requests"], 1,
        "no provider call after the first: {stats}"
    );
    assert_eq!(app.sandbox_charges().await.len(), 1, "charged once");
    assert_eq!(app.db.charges().await, 1);
    assert_eq!(app.db.charges_with_status("unknown").await, 1);
    let later = app
        .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(later.status(), 500);
    assert_eq!(later.headers()["idempotent-replay"], "true");
}

/// Defect 2: expiry frees only a final answer. An abandoned record (the
/// money may have moved) past its TTL is replayed to every retry, never
/// reclaimed by a new operation and never pruned; neither is a record still
/// in progress past its TTL.
async fn unresolved_records_outlive_their_ttl(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let app = Arc::new(app);
    let key = new_key();
    app.configure_sandbox(json!({"error_rate": 1.0})).await;
    let first = app
        .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(first.status(), 503);
    // The reaper gives up on it past --abandon-after (15 min).
    app.db.age(Some(&key), 20 * MINUTE).await;
    let reaped = crate::reap_once(&app).await;
    assert_eq!(reaped.abandoned, 1, "{reaped:?}");
    // A healthy provider, and a day later: a new charge would now succeed.
    app.configure_sandbox(json!({})).await;
    app.db.age(Some(&key), 25 * HOUR).await;

    for (status, body) in storm(&app, 8, "cus_1", &key).await {
        assert_eq!(status, 500, "{body}");
        assert_eq!(body["error"]["code"], "request_abandoned");
    }
    let stuck = new_key();
    app.db
        .stuck_request(
            &stuck,
            "cus_2",
            &json!({"amount_cents": 100, "currency": "GBP", "card_token": "tok_visa"}),
            48 * HOUR,
        )
        .await;
    let pruned = crate::prune_once(&app).await;
    assert_eq!(pruned, 0, "nothing unresolved is pruned");
    assert_eq!(app.db.records().await, 2);
    assert_eq!(app.sandbox_charges().await.len(), 0, "no new charge");
    assert_eq!(app.db.charges().await, 2);
}

/// Defect 4: a lease starts when the claim is made, after its own waits. A
/// claim that waited 8 s for a table lock owns its whole 10 s lease: while
/// its provider call runs (6 s), retries 3 s after the lock was released
/// get 409 and never re-drive the call.
async fn a_claim_that_waited_for_a_lock_owns_its_whole_lease(backend: Backend) {
    let Some(app) = spawn_app(
        backend,
        AppOptions {
            lease: Duration::from_secs(10),
            gateway_timeout: Duration::from_secs(9),
            sandbox: SandboxConfig {
                latency_ms: 6000,
                ..SandboxConfig::default()
            },
            ..aged()
        },
    )
    .await
    else {
        return;
    };
    let app = Arc::new(app);
    let key = new_key();
    let lock = app.db.hold_write_lock(Duration::from_secs(8)).await;
    let first = spawn_post(&app, "cus_1", &key);
    lock.await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (status, body) in storm(&app, 4, "cus_1", &key).await {
        assert_eq!(status, 409, "the claim's lease was cut short: {body}");
    }
    let (status, _, body) = first.await.unwrap();
    assert_eq!(status, 201, "{body}");
    let stats = app.sandbox_stats().await;
    assert_eq!(stats["requests"], 1, "one provider call: {stats}");
    assert_eq!(app.db.charges().await, 1);
}

/// Defect 5: a driver whose finish lost answers from the record only while
/// the record still holds its own charge. Here, while customer A's call is
/// in flight, its lease expires, A's retry finishes the record, the key
/// passes its TTL and customer B reclaims it with a charge of its own; A's
/// first driver then loses its finish and must answer 409, never B's
/// charge, after settling its own charge row with the outcome it holds.
async fn a_lost_finish_never_answers_with_another_operation(backend: Backend) {
    let Some(app) = spawn_app(
        backend,
        AppOptions {
            ttl: HOUR,
            sandbox: SandboxConfig {
                latency_ms: 2000,
                ..SandboxConfig::default()
            },
            ..aged()
        },
    )
    .await
    else {
        return;
    };
    let app = Arc::new(app);
    let key = new_key();
    let first = {
        let (app, key) = (app.clone(), key.clone());
        tokio::spawn(async move {
            let r = app
                .post_charge("cus_a", Some(&key), &charge_body(4900, "tok_visa"))
                .await;
            let retry_after = r.headers().get("retry-after").cloned();
            (
                r.status().as_u16(),
                retry_after,
                r.json::<Value>().await.unwrap(),
            )
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The provider answers at once from now on, and has forgotten A's key,
    // so A's retry can finish while A's first call is still in flight.
    app.configure_sandbox(json!({"key_retention_secs": 0}))
        .await;
    app.db.age(Some(&key), 2 * HOUR).await;
    let retry = app
        .post_charge("cus_a", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(retry.status(), 201);
    let a_charge: Value = retry.json().await.unwrap();
    // Past its TTL, the completed key is B's to reclaim.
    let b = app
        .post_charge("cus_b", Some(&key), &charge_body(100, "tok_visa"))
        .await;
    assert_eq!(b.status(), 201);
    let b_charge: Value = b.json().await.unwrap();
    assert_eq!(b_charge["customer_id"], "cus_b");

    let (status, retry_after, body) = first.await.unwrap();
    assert_ne!(
        body["customer_id"], "cus_b",
        "A was answered with B's charge"
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "request_in_progress");
    assert!(retry_after.is_some());
    // A's own charge row holds what the provider said.
    assert_eq!(a_charge["status"], "succeeded");
    assert_eq!(app.db.charges_with_status("succeeded").await, 2);
    assert_eq!(app.db.charges_with_status("pending").await, 0);
}

backend_tests!(
    serializable;
    a_record_past_the_key_retention_is_abandoned_not_redriven,
    unresolved_records_outlive_their_ttl,
    a_claim_that_waited_for_a_lock_owns_its_whole_lease,
    a_lost_finish_never_answers_with_another_operation,
);
