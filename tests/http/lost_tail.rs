//! Exactly once when the database loses its last writes: the rows written
//! since a copy was taken are gone (a promoted asynchronous replica, a
//! Galera node that crashed ahead of the cluster, a point-in-time restore),
//! the provider still has what it made, and the client retries with its
//! key. The retry derives the same operation id and provider key
//! (`crates/domain/src/derive.rs`), so the provider answers from its own
//! idempotency record: one charge or refund at the provider, and the
//! retry's answer carries the first answer's ids.

use std::time::Duration;

use payments_sandbox::SandboxConfig;
use payments_tests::{
    Answer, AppOptions, Backend, TestApp, backend_tests, charge_body, new_key, spawn_app,
};
use serde_json::{Value, json};

const CUSTOMER: &str = "cus_lost_tail";

/// No copy of an answer in memory: a promoted replica's process has none.
async fn app(backend: Backend, sandbox: SandboxConfig) -> Option<TestApp> {
    let options = AppOptions {
        replay_cache: false,
        sandbox,
        ..AppOptions::default()
    };
    spawn_app(backend, options).await
}

async fn charge(app: &TestApp, key: &str, amount_cents: i64) -> Answer {
    let body = charge_body(amount_cents, "tok_visa");
    Answer::of(app.post_charge(CUSTOMER, Some(key), &body).await).await
}

/// `retry` answers 201 with `first`'s charge: its id and the provider's.
fn assert_same_charge(retry: &Answer, first: &Answer, what: &str) {
    assert_eq!(retry.status, 201, "{what}: {:?}", retry.body);
    assert_eq!(retry.body["id"], first.body["id"], "{what}");
    assert_eq!(
        retry.body["gateway_charge_id"], first.body["gateway_charge_id"],
        "{what}"
    );
}

/// Our charge ids the provider's charges carry, one per provider charge.
async fn provider_charge_ids(app: &TestApp) -> Vec<String> {
    let mut ids: Vec<String> = app
        .sandbox_charges()
        .await
        .iter()
        .map(|c| {
            c["metadata"]["payments_charge_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    ids.sort();
    ids
}

/// A charge answered 201, then lost with the database's tail: the retry
/// answers 201 with the same charge id and provider charge id, and the
/// provider made one charge.
async fn a_charge_lost_with_the_tail_is_made_once(backend: Backend) {
    let Some(app) = app(backend, SandboxConfig::default()).await else {
        return;
    };
    app.db.snapshot().await;
    let key = new_key();
    let first = charge(&app, &key, 1500).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    app.db.lose_tail().await;
    assert_eq!(
        app.db.charges().await,
        0,
        "the charge was lost with the tail"
    );
    assert_eq!(app.db.records().await, 0, "and so was its record");

    let retry = charge(&app, &key, 1500).await;
    assert_same_charge(&retry, &first, "the same charge, not a new one");
    assert_eq!(retry.body["status"], "succeeded");
    assert_eq!(
        app.sandbox_charges().await.len(),
        1,
        "charged once at the provider"
    );
    assert_eq!(app.db.charges().await, 1);
    // The provider's replay was adopted only as the charge reads now.
    let gateway_id = first.body["gateway_charge_id"].as_str().unwrap();
    assert!(
        app.sandbox_requests()
            .await
            .contains(&format!("GET /v1/charges/{gateway_id}")),
        "the replayed charge was re-read"
    );
    // And the retry's record is what later retries replay.
    let again = charge(&app, &key, 1500).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.headers["idempotent-replay"], "true");
    assert_eq!(again.body["id"], first.body["id"]);
}

/// The first answer was lost too (the provider charged, then the
/// connection dropped: 503), and then the database's tail: the retry is
/// the one answer the client gets, for the one provider charge.
async fn a_dropped_answer_then_a_lost_tail_is_made_once(backend: Backend) {
    let dropping = SandboxConfig {
        drop_after_charge: true,
        ..SandboxConfig::default()
    };
    let Some(app) = app(backend, dropping).await else {
        return;
    };
    app.db.snapshot().await;
    let key = new_key();
    let first = charge(&app, &key, 2500).await;
    assert_eq!(first.status, 503, "{:?}", first.body);
    assert_eq!(
        app.sandbox_charges().await.len(),
        1,
        "the provider did charge"
    );
    app.db.lose_tail().await;
    app.configure_sandbox(json!({ "drop_after_charge": false }))
        .await;

    let retry = charge(&app, &key, 2500).await;
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    assert_eq!(
        app.sandbox_charges().await.len(),
        1,
        "charged once at the provider"
    );
    let provider = &app.sandbox_charges().await[0];
    assert_eq!(retry.body["gateway_charge_id"], provider["id"]);
    assert_eq!(
        retry.body["id"], provider["metadata"]["payments_charge_id"],
        "the retry is the operation the provider made"
    );
}

/// After a lost tail, the client sends its key with another body: our
/// record of the first body is gone, but the provider holds the key's
/// operation with the first body's parameters (Stripe's 400
/// `idempotency_error`). The answer is 422, nothing is stored, no second
/// charge; the first body's retry then adopts the provider's charge.
async fn another_body_after_a_lost_tail_is_refused_and_the_first_is_adopted(backend: Backend) {
    let Some(app) = app(backend, SandboxConfig::default()).await else {
        return;
    };
    app.db.snapshot().await;
    let key = new_key();
    let first = charge(&app, &key, 1200).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    app.db.lose_tail().await;

    let other = charge(&app, &key, 1300).await;
    assert_eq!(other.status, 422, "{:?}", other.body);
    assert_eq!(other.body["error"]["code"], "idempotency_key_reused");
    assert!(other.headers.get("idempotent-replay").is_none());
    assert_eq!(app.db.records().await, 0, "nothing stored");
    assert_eq!(app.db.charges().await, 0, "no charge left behind");
    assert_eq!(app.sandbox_charges().await.len(), 1, "no second charge");
    // Not stored: the same request is refused the same way again.
    assert_eq!(charge(&app, &key, 1300).await.status, 422);

    let retry = charge(&app, &key, 1200).await;
    assert_same_charge(
        &retry,
        &first,
        "the first body adopts the provider's charge",
    );
    assert_eq!(app.sandbox_charges().await.len(), 1);
}

/// A refund answered 201, then lost with the tail (its charge stays): the
/// retry refunds once, under the same refund id.
async fn a_refund_lost_with_the_tail_is_made_once(backend: Backend) {
    let Some(app) = app(backend, SandboxConfig::default()).await else {
        return;
    };
    let charged = charge(&app, &new_key(), 5000).await;
    assert_eq!(charged.status, 201);
    let charge_id = charged.body["id"].as_str().unwrap().to_owned();
    app.db.snapshot().await;
    let key = new_key();
    let body = json!({ "amount_cents": 2000 });
    let first = app.post_refund(CUSTOMER, &charge_id, &key, &body).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    app.db.lose_tail().await;
    assert_eq!(
        app.db.refunds_with_status("succeeded").await,
        0,
        "lost with the tail"
    );

    let retry = app.post_refund(CUSTOMER, &charge_id, &key, &body).await;
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    assert_eq!(retry.body["id"], first.body["id"], "the same refund");
    assert_eq!(
        retry.body["gateway_refund_id"],
        first.body["gateway_refund_id"]
    );
    let refunds = app.sandbox_refunds().await;
    assert_eq!(
        refunds.len(),
        1,
        "refunded once at the provider: {refunds:?}"
    );
    let charge = app
        .get_as(CUSTOMER, &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(charge.body["amount_refunded"], 2000);
}

/// The same for a refund: another amount under the key after a lost tail
/// is refused 422, its reservation given back; the first amount's retry
/// adopts the provider's refund.
async fn another_refund_body_after_a_lost_tail_is_refused(backend: Backend) {
    let Some(app) = app(backend, SandboxConfig::default()).await else {
        return;
    };
    let charged = charge(&app, &new_key(), 5000).await;
    let charge_id = charged.body["id"].as_str().unwrap().to_owned();
    app.db.snapshot().await;
    let key = new_key();
    let asked = json!({ "amount_cents": 2000 });
    let first = app.post_refund(CUSTOMER, &charge_id, &key, &asked).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    app.db.lose_tail().await;

    let other = json!({ "amount_cents": 4500 });
    let refused = app.post_refund(CUSTOMER, &charge_id, &key, &other).await;
    assert_eq!(refused.status, 422, "{:?}", refused.body);
    assert_eq!(app.db.refunds_with_status("pending").await, 0);
    // Its 4,500 reservation was given back: locally the whole 5,000 is
    // refundable again (the lost 2,000 refund is not known here until its
    // client retries it), so a refund of 5,000 passes our check, and the
    // provider, which knows its own refund, refuses it: the money cannot
    // move twice even while our books lack the lost refund.
    let whole = json!({ "amount_cents": 5000 });
    let all = app
        .post_refund(CUSTOMER, &charge_id, &new_key(), &whole)
        .await;
    assert_eq!(all.status, 402, "{:?}", all.body);
    assert_eq!(all.body["error"]["decline_code"], "amount_too_large");

    let retry = app.post_refund(CUSTOMER, &charge_id, &key, &asked).await;
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    assert_eq!(retry.body["id"], first.body["id"]);
    assert_eq!(app.sandbox_refunds().await.len(), 1, "refunded once");
}

/// Ten operations at once, lost together, retried together: ten provider
/// charges, each retry answered with its first answer's ids.
async fn ten_operations_lost_at_once_are_each_made_once(backend: Backend) {
    let Some(app) = app(backend, SandboxConfig::default()).await else {
        return;
    };
    let app = std::sync::Arc::new(app);
    app.db.snapshot().await;
    let keys: Vec<String> = (0..10).map(|_| new_key()).collect();
    let all = |keys: Vec<String>| {
        let app = app.clone();
        async move {
            let tasks: Vec<_> = keys
                .into_iter()
                .enumerate()
                .map(|(i, key)| {
                    let app = app.clone();
                    tokio::spawn(async move { charge(&app, &key, 100 + i as i64).await })
                })
                .collect();
            let mut answers = Vec::new();
            for t in tasks {
                answers.push(t.await.unwrap());
            }
            answers
        }
    };
    let first = all(keys.clone()).await;
    assert!(first.iter().all(|a| a.status == 201), "{first:?}");
    app.db.lose_tail().await;
    let retried = all(keys).await;
    for (a, b) in first.iter().zip(&retried) {
        assert_same_charge(b, a, "each retry is its first answer's charge");
    }
    assert_eq!(
        app.sandbox_charges().await.len(),
        10,
        "one provider charge each"
    );
    let mut ids: Vec<String> = first
        .iter()
        .map(|a| a.body["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    assert_eq!(provider_charge_ids(&app).await, ids);
}

/// Ten requests at once reusing one expired key: every one of them finds
/// the first generation taken and moves to the second, and the record's
/// reclaim lets one through: one new payment, one new provider charge;
/// the others get 409 or the new payment's replay.
async fn ten_reuses_of_an_expired_key_at_once_make_one_new_payment(backend: Backend) {
    let Some(app) = app(backend, SandboxConfig::default()).await else {
        return;
    };
    let app = std::sync::Arc::new(app);
    let key = new_key();
    let first = charge(&app, &key, 800).await;
    assert_eq!(first.status, 201);
    app.db.age(Some(&key), Duration::from_secs(25 * 3600)).await;
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (app, key) = (app.clone(), key.clone());
            tokio::spawn(async move { charge(&app, &key, 800).await })
        })
        .collect();
    let mut new_ids = std::collections::BTreeSet::new();
    for task in tasks {
        let answer = task.await.unwrap();
        assert!(matches!(answer.status, 201 | 409), "{:?}", answer.body);
        if answer.status == 201 {
            new_ids.insert(answer.body["id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(new_ids.len(), 1, "one new payment: {new_ids:?}");
    assert!(!new_ids.contains(first.body["id"].as_str().unwrap()));
    assert_eq!(
        app.sandbox_charges().await.len(),
        2,
        "one new provider charge"
    );
    assert_eq!(app.db.charges().await, 2);
}

/// A key reused after its record expired is a new payment, with a new
/// provider charge, while the provider still remembers the old key; and
/// that second generation, lost with the tail, is made once too.
async fn a_key_reused_after_expiry_is_a_new_payment_even_after_a_lost_tail(backend: Backend) {
    let Some(app) = app(backend, SandboxConfig::default()).await else {
        return;
    };
    let key = new_key();
    let first = charge(&app, &key, 700).await;
    assert_eq!(first.status, 201);
    // Past its 24 h TTL: the key is free again (the provider's own key
    // retention is not simulated past here: it still remembers).
    app.db.age(Some(&key), Duration::from_secs(25 * 3600)).await;
    app.db.snapshot().await;
    let second = charge(&app, &key, 700).await;
    assert_eq!(second.status, 201, "{:?}", second.body);
    assert!(second.headers.get("idempotent-replay").is_none());
    assert_ne!(second.body["id"], first.body["id"], "a new payment");
    assert_ne!(
        second.body["gateway_charge_id"],
        first.body["gateway_charge_id"]
    );
    assert_eq!(app.sandbox_charges().await.len(), 2);

    app.db.lose_tail().await;
    assert_eq!(
        app.db.charges().await,
        1,
        "the first generation survived the loss"
    );
    let retry = charge(&app, &key, 700).await;
    assert_same_charge(&retry, &second, "the second generation again");
    assert_eq!(app.sandbox_charges().await.len(), 2, "no third charge");
}

/// A record stored before provider keys were derived keeps the key it
/// stored: a takeover re-drives with it, never with a derived one.
async fn a_stored_provider_key_of_the_old_format_is_re_driven_as_stored(backend: Backend) {
    let Some(app) = app(backend, SandboxConfig::default()).await else {
        return;
    };
    let key = new_key();
    let body: Value = serde_json::from_str(&charge_body(900, "tok_visa")).unwrap();
    // A claim as the server before this change made it: a random charge
    // id and `payments-charge-<id>`, its lease long over.
    let (_, charge_id) = app
        .db
        .stuck_request(&key, CUSTOMER, &body, Duration::from_secs(60))
        .await;
    let retry = charge(&app, &key, 900).await;
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    assert_eq!(retry.body["id"], charge_id.as_str());
    let attempts = app.sandbox_attempts().await;
    let keys: Vec<&str> = attempts
        .iter()
        .filter_map(|a| a["idempotency_key"].as_str())
        .collect();
    assert_eq!(
        keys,
        [format!("payments-charge-{charge_id}")],
        "{attempts:?}"
    );
}

backend_tests!(
    serializable;
    a_charge_lost_with_the_tail_is_made_once,
    a_dropped_answer_then_a_lost_tail_is_made_once,
    another_body_after_a_lost_tail_is_refused_and_the_first_is_adopted,
    a_refund_lost_with_the_tail_is_made_once,
    another_refund_body_after_a_lost_tail_is_refused,
    ten_operations_lost_at_once_are_each_made_once,
    a_key_reused_after_expiry_is_a_new_payment_even_after_a_lost_tail,
    ten_reuses_of_an_expired_key_at_once_make_one_new_payment,
    a_stored_provider_key_of_the_old_format_is_re_driven_as_stored,
);
