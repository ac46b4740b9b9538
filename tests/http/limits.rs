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
        rate_limit: Some((1, BURST)),
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

/// An app with `options` and one charge of 5,000 made for `cus_r`: its id.
async fn app_with_a_charge(
    backend: Backend,
    options: AppOptions,
) -> Option<(payments_tests::TestApp, String)> {
    let app = spawn_app(backend, options).await?;
    let charge = app
        .charge_json("cus_r", &charge_body(5000, "tok_visa"))
        .await;
    let id = charge["id"].as_str().unwrap().to_owned();
    Some((app, id))
}

/// A customer's refunds (`REFUNDS_BY_CUSTOMER`) count against its own
/// rate, as its charges do. The back office has a rate of its own
/// (`BACKOFFICE_RATE_LIMIT_*`): a customer over its rate does not stop the
/// back office refunding, and the back office over its rate is a 429 too.
/// Without that setting the back office is not limited.
async fn refunds_count_against_their_callers_rate(backend: Backend) {
    let options = AppOptions {
        rate_limit: Some((1, 2)),
        backoffice_rate_limit: Some((1, 1)),
        refunds_by_customer: true,
        ..AppOptions::default()
    };
    let Some((app, id)) = app_with_a_charge(backend, options).await else {
        return;
    };
    let id = id.as_str();
    let part = json!({"amount_cents": 1000});
    let customer = app.token("cus_r");
    // The charge took one of the burst of 2, the first refund the other.
    let first = app.post_refund_with(&customer, id, &new_key(), &part).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.body["requested_by"]["role"], "customer");
    let second = app.post_refund_with(&customer, id, &new_key(), &part).await;
    assert_eq!(second.status, 429, "{}", second.body);
    assert_eq!(second.body["error"]["code"], "rate_limited");
    // The back office's own burst of 1.
    let office = app.post_refund("ops_r", id, &new_key(), &part).await;
    assert_eq!(office.status, 201, "{}", office.body);
    let over = app.post_refund("ops_r", id, &new_key(), &part).await;
    assert_eq!(
        (over.status, over.body["error"]["code"].as_str()),
        (429, Some("rate_limited"))
    );
    assert_eq!(app.sandbox_refunds().await.len(), 2);

    // By default the back office is not limited.
    let options = AppOptions {
        rate_limit: Some((1, 1)),
        ..AppOptions::default()
    };
    let Some((app, id)) = app_with_a_charge(backend, options).await else {
        return;
    };
    for _ in 0..4 {
        let refund = app.post_refund("ops_r", &id, &new_key(), &part).await;
        assert_eq!(refund.status, 201, "{}", refund.body);
    }
}

/// Twenty concurrent first attempts of one new key are one operation: one
/// unit of the customer's budget, whichever attempt's claim wins. The
/// others find its record (409 while it is in flight, or its replay), none
/// is a 429, and the budget left is the burst less one. On a server that
/// counts each attempt before the claim arbitrates (check, then act), the
/// attempts spend the whole burst and most of them get 429.
async fn concurrent_attempts_of_one_key_spend_one_unit(backend: Backend) {
    const ATTEMPTS: usize = 20;
    const SMALL_BURST: u32 = 3;
    let options = AppOptions {
        // The provider takes 1 s: every attempt arrives while the first
        // is in flight.
        sandbox: SandboxConfig {
            latency_ms: 1000,
            ..SandboxConfig::default()
        },
        rate_limit: Some((1, SMALL_BURST)),
        // Every attempt reaches the database, where the claim decides.
        replay_cache: false,
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    let app = Arc::new(app);
    let key = new_key();
    let body = charge_body(2500, "tok_visa");
    let barrier = Arc::new(tokio::sync::Barrier::new(ATTEMPTS));
    let attempts: Vec<_> = (0..ATTEMPTS)
        .map(|_| {
            let (app, key, body, barrier) =
                (app.clone(), key.clone(), body.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let answer = app.post_charge("cus_eager", Some(&key), &body).await;
                let status = answer.status().as_u16();
                let replayed = answer.headers().contains_key("idempotent-replay");
                let body: Value = answer.json().await.unwrap_or(Value::Null);
                (status, replayed, body)
            })
        })
        .collect();
    let (mut made, mut replays) = (Vec::new(), Vec::new());
    let mut in_flight = 0;
    for attempt in attempts {
        let (status, replayed, body) = attempt.await.unwrap();
        match status {
            201 if !replayed => made.push(body["id"].as_str().unwrap().to_owned()),
            201 => replays.push(body["id"].as_str().unwrap().to_owned()),
            409 => in_flight += 1,
            other => panic!("attempt answered {other}, expected 201 or 409: {body}"),
        }
    }
    assert_eq!(made.len(), 1, "one attempt made the charge: {made:?}");
    assert!(
        replays.iter().all(|id| *id == made[0]),
        "{replays:?} replay {made:?}"
    );
    assert!(in_flight > 0, "the others met it in flight");
    assert_eq!(app.sandbox_charges().await.len(), 1);
    assert_eq!(app.db.charges().await, 1);

    // One unit spent: the burst has SMALL_BURST - 1 left, then a 429.
    for n in 1..SMALL_BURST {
        let next = app.post_charge("cus_eager", Some(&new_key()), &body).await;
        assert_eq!(next.status(), 201, "new operation {n} of the burst left");
    }
    let over = app.post_charge("cus_eager", Some(&new_key()), &body).await;
    assert_eq!(over.status(), 429, "the burst is spent");
    assert_eq!(app.sandbox_charges().await.len(), SMALL_BURST as usize);
    assert_eq!(app.db.charges().await, i64::from(SMALL_BURST));
    assert_eq!(
        app.db.records().await,
        i64::from(SMALL_BURST),
        "the 429 stored nothing"
    );
}

backend_tests!(
    a_burst_from_one_customer_is_cut_at_its_limit,
    concurrent_attempts_of_one_key_spend_one_unit,
    refunds_count_against_their_callers_rate,
);
