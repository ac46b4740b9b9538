//! The per-customer rate of new operations (card testing): a burst from one
//! customer is cut at its limit with 429 `rate_limited` + `Retry-After`,
//! storing and charging nothing; a request whose key already has a record
//! (a 409, a replay, a 422) is never limited, and another customer is not
//! affected.

use std::sync::Arc;

use payments_sandbox::SandboxConfig;
use payments_tests::{AppOptions, Backend, backend_tests, charge_body, new_key, spawn_app};
use serde_json::{Value, json};

use crate::observability::metric;

/// Burst 5, then one a minute: nothing refills during the test.
const BURST: u32 = 5;

async fn a_burst_from_one_customer_is_cut_at_its_limit(backend: Backend) {
    let options = AppOptions {
        // The provider takes 3 s, so the first charge is still in flight
        // while the burst is answered.
        sandbox: SandboxConfig {
            latency_ms: 3000,
            ..SandboxConfig::default()
        },
        rate_limit: (1, BURST),
        // Replays then reach the database, where the limit is decided.
        replay_cache: false,
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    let app = Arc::new(app);
    let limited_before = metric(&app, "payments_rate_limited_total").await;
    let body = charge_body(4900, "tok_visa");
    let first_key = new_key();
    let first = {
        let (app, key, body) = (app.clone(), first_key.clone(), body.clone());
        tokio::spawn(async move { app.post_charge("cus_tester", Some(&key), &body).await })
    };
    // Wait until the first charge holds its key (its record is written).
    for _ in 0..200 {
        if app.db.records().await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        app.db.records().await,
        1,
        "the first charge claimed its key"
    );

    // 12 new charges at once: BURST - 1 admitted, the rest refused.
    let burst: Vec<_> = (0..12)
        .map(|_| {
            let (app, body) = (app.clone(), body.clone());
            tokio::spawn(async move {
                let answer = app.post_charge("cus_tester", Some(&new_key()), &body).await;
                let status = answer.status().as_u16();
                let retry_after = answer
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                let body: Value = answer.json().await.unwrap_or(Value::Null);
                (status, retry_after, body)
            })
        })
        .collect();
    // Meanwhile, over the limit: the first key in flight is a 409, not a 429.
    let again = app.post_charge("cus_tester", Some(&first_key), &body).await;
    assert_eq!(again.status(), 409, "a key with a record is never limited");

    let mut admitted = 0;
    let mut refused = 0;
    for answer in burst {
        let (status, retry_after, body) = answer.await.unwrap();
        match status {
            201 => admitted += 1,
            429 => {
                refused += 1;
                assert_eq!(body["error"]["code"], "rate_limited", "{body}");
                let wait = retry_after.expect("Retry-After on a 429");
                assert!((1..=60).contains(&wait), "Retry-After {wait}");
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!((admitted, refused), (BURST - 1, 12 - (BURST - 1)));
    assert_eq!(first.await.unwrap().status(), 201);

    // The refused stored and charged nothing.
    assert_eq!(app.db.records().await, i64::from(BURST));
    assert_eq!(app.db.charges().await, i64::from(BURST));
    assert_eq!(app.sandbox_charges().await.len(), BURST as usize);

    // Still over the limit: the replay and the 422 are answered as always,
    // and a new key is refused.
    let replay = app.post_charge("cus_tester", Some(&first_key), &body).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replay"], "true");
    let other_body = charge_body(5000, "tok_visa");
    let reused = app
        .post_charge("cus_tester", Some(&first_key), &other_body)
        .await;
    assert_eq!(reused.status(), 422);
    let new = app.post_charge("cus_tester", Some(&new_key()), &body).await;
    assert_eq!(new.status(), 429);

    // Another customer is not affected.
    let other = app.post_charge("cus_other", Some(&new_key()), &body).await;
    assert_eq!(other.status(), 201);
    assert_eq!(app.sandbox_charges().await.len(), BURST as usize + 1);

    let limited = metric(&app, "payments_rate_limited_total").await - limited_before;
    assert!(limited >= 9.0, "counted: {limited}");
}

/// Refunds are new operations too, under the same per-customer rate.
async fn refunds_count_against_the_same_rate(backend: Backend) {
    let options = AppOptions {
        rate_limit: (1, 2),
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    let charge = app
        .charge_json("cus_r", &charge_body(3000, "tok_visa"))
        .await;
    let id = charge["id"].as_str().unwrap();
    let part = json!({"amount_cents": 1000});
    // The charge took one of the burst of 2, the first refund the other.
    let first = app.post_refund("cus_r", id, &new_key(), &part).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let second = app.post_refund("cus_r", id, &new_key(), &part).await;
    assert_eq!(second.status, 429, "{}", second.body);
    assert_eq!(second.body["error"]["code"], "rate_limited");
    assert_eq!(app.sandbox_refunds().await.len(), 1);
}

backend_tests!(
    a_burst_from_one_customer_is_cut_at_its_limit,
    refunds_count_against_the_same_rate,
);
