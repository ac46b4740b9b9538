//! The Store conformance suite: the same behaviour, over real connections,
//! on every backend. Time is passed in (`now`), so lease and expiry cases
//! run without sleeping. Every race is a real race: N tasks on a
//! multi-threaded runtime against one database.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use payments_domain::charge::{Charge, ChargeRequest, ChargeStatus, CustomerId};
use payments_domain::idempotency::{
    CHARGES_ROUTE, JSON, Lease, RecordState, RequestFingerprint, StoredResponse,
};
use payments_domain::store::{ChargeOutcome, Claim, ClaimOutcome, Finish, FinishOutcome, Store};
use payments_domain::time;
use payments_tests::{Backend, TestDb, backend_tests};
use serde_json::{Value, json};

const RACERS: usize = 16;

fn body(amount: i64) -> Value {
    json!({"amount_cents": amount, "currency": "GBP", "card_token": "tok_visa"})
}

fn claim(key: &str, customer: &str, body: &Value, now: DateTime<Utc>) -> Claim {
    let request = ChargeRequest::from_json(body, 1_000_000).unwrap();
    let customer_id = CustomerId::parse(customer).unwrap();
    Claim {
        key: key.to_owned(),
        route: CHARGES_ROUTE.to_owned(),
        customer_id: customer.to_owned(),
        request_hash: RequestFingerprint::of(body).to_hex(),
        lease: Lease::new(time::after(now, Duration::from_secs(10))),
        expires_at: time::after(now, Duration::from_secs(3600)),
        now,
        charge: Charge::pending(&customer_id, &request, now),
    }
}

fn finish(c: &Claim, record_id: i64, token: &str, now: DateTime<Utc>, marker: &str) -> Finish {
    Finish {
        record_id,
        lease_token: token.to_owned(),
        outcome: ChargeOutcome {
            charge_id: c.charge.id.clone(),
            status: ChargeStatus::Succeeded,
            gateway_charge_id: Some(marker.to_owned()),
            decline_code: None,
            at: now,
        },
        response: StoredResponse {
            status: 201,
            body: format!(r#"{{"winner":"{marker}"}}"#),
            content_type: JSON.to_owned(),
            location: Some(format!("/api/charges/{}", c.charge.id)),
        },
    }
}

async fn claimed(store: &Arc<dyn Store>, c: &Claim) -> i64 {
    match store.claim(c).await.unwrap() {
        ClaimOutcome::Claimed { record_id } => record_id,
        ClaimOutcome::Existing(r) => panic!("expected a claim, got existing {r:?}"),
    }
}

async fn db(backend: Backend) -> Option<TestDb> {
    TestDb::new(backend, 8).await
}

/// N tasks claim one key at once: exactly one wins, one record and one
/// charge exist, every loser sees the winner's record.
async fn concurrent_claims_have_one_winner(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let now = time::now();
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let store = store.clone();
            let barrier = barrier.clone();
            let c = claim("race-key", &format!("cus_{}", i % 2), &body(100), now);
            tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&c).await.unwrap()
            })
        })
        .collect();
    let mut winners = 0;
    let mut record_ids = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            ClaimOutcome::Claimed { record_id } => {
                winners += 1;
                record_ids.push(record_id);
            }
            ClaimOutcome::Existing(r) => {
                assert_eq!(r.state, RecordState::InProgress);
                record_ids.push(r.id);
            }
        }
    }
    assert_eq!(winners, 1, "exactly one claimer wins");
    record_ids.dedup();
    assert_eq!(record_ids.len(), 1, "everyone saw the same record");
    assert_eq!(db.records().await, 1);
    assert_eq!(db.charges().await, 1, "losers' charges were rolled back");
    assert_eq!(db.charges_with_status("pending").await, 1);
}

/// Many finishers with the lease token race: exactly one completes the
/// record; the record holds the winner's response and the charge its outcome.
async fn concurrent_finishers_have_one_winner(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let now = time::now();
    let c = claim("finish-key", "cus_1", &body(100), now);
    let record_id = claimed(&store, &c).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let store = store.clone();
            let barrier = barrier.clone();
            let f = finish(&c, record_id, &c.lease.token, now, &format!("gw_{i}"));
            tokio::spawn(async move {
                barrier.wait().await;
                (store.finish(&f).await.unwrap(), f)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tasks {
        let (outcome, f) = t.await.unwrap();
        if outcome == FinishOutcome::Finished {
            winners.push(f);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one finisher wins");
    let winner = &winners[0];
    let record = store.record(record_id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Complete);
    assert_eq!(record.response.as_ref(), Some(&winner.response));
    assert_eq!(record.lease, None, "a complete record holds no lease");
    let charge = store.charge(&c.charge.id).await.unwrap().unwrap();
    assert_eq!(charge.status, ChargeStatus::Succeeded);
    assert_eq!(charge.gateway_charge_id, winner.outcome.gateway_charge_id);
    // A finisher with a wrong token, or after completion, loses.
    let late = finish(&c, record_id, "not-the-token", now, "gw_late");
    assert_eq!(store.finish(&late).await.unwrap(), FinishOutcome::Lost);
}

/// A lease is taken over only once it has expired, and only by one of
/// several racers; the old holder can no longer finish.
async fn takeover_only_after_expiry_and_only_once(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let t0 = time::now();
    let c = claim("lease-key", "cus_1", &body(100), t0);
    let record_id = claimed(&store, &c).await;
    let early = time::after(t0, Duration::from_secs(5));
    let fresh = Lease::new(time::after(early, Duration::from_secs(10)));
    assert!(
        !store
            .take_over(record_id, &c.lease.token, &fresh, early)
            .await
            .unwrap(),
        "a live lease is never taken over"
    );
    let late = time::after(t0, Duration::from_secs(11));
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let store = store.clone();
            let barrier = barrier.clone();
            let expected = c.lease.token.clone();
            let lease = Lease::new(time::after(late, Duration::from_secs(10)));
            tokio::spawn(async move {
                barrier.wait().await;
                let won = store
                    .take_over(record_id, &expected, &lease, late)
                    .await
                    .unwrap();
                won.then_some(lease)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tasks {
        if let Some(lease) = t.await.unwrap() {
            winners.push(lease);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one racer takes the lease over");
    let new_lease = &winners[0];
    let record = store.record(record_id).await.unwrap().unwrap();
    assert_eq!(record.lease.as_ref(), Some(new_lease));
    // The old holder lost its lease: its finish and its release do nothing.
    assert!(
        !store
            .release(record_id, &c.lease.token, late)
            .await
            .unwrap()
    );
    let stale = finish(&c, record_id, &c.lease.token, late, "gw_stale");
    assert_eq!(store.finish(&stale).await.unwrap(), FinishOutcome::Lost);
    let current = finish(&c, record_id, &new_lease.token, late, "gw_new");
    assert_eq!(
        store.finish(&current).await.unwrap(),
        FinishOutcome::Finished
    );
}

/// Releasing a lease (unknown outcome) keeps the record in progress and
/// lets the next caller take it over at once.
async fn released_lease_is_taken_over_at_once(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let t0 = time::now();
    let c = claim("release-key", "cus_1", &body(100), t0);
    let record_id = claimed(&store, &c).await;
    assert!(store.release(record_id, &c.lease.token, t0).await.unwrap());
    let record = store.record(record_id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::InProgress);
    assert!(!record.lease_is_live(t0));
    let lease = Lease::new(time::after(t0, Duration::from_secs(10)));
    assert!(
        store
            .take_over(record_id, &c.lease.token, &lease, t0)
            .await
            .unwrap()
    );
    assert_eq!(db.charges_with_status("pending").await, 1);
}

/// A complete record past `expires_at` behaves as absent: one of several
/// racers reclaims it with its own body and customer; an in-progress one
/// is never reclaimed, whatever its age.
async fn expired_record_is_reclaimed_once(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let t0 = time::now();
    let first = claim("old-key", "cus_1", &body(100), t0);
    let record_id = claimed(&store, &first).await;
    let done = finish(&first, record_id, &first.lease.token, t0, "gw_first");
    assert_eq!(store.finish(&done).await.unwrap(), FinishOutcome::Finished);

    // Before expiry: the existing record, with the first owner and body.
    let before = time::after(t0, Duration::from_secs(3599));
    match store
        .claim(&claim("old-key", "cus_2", &body(200), before))
        .await
        .unwrap()
    {
        ClaimOutcome::Existing(r) => {
            assert_eq!(r.state, RecordState::Complete);
            assert_eq!(r.customer_id, "cus_1");
        }
        other => panic!("expected existing, got {other:?}"),
    }

    let later = time::after(t0, Duration::from_secs(7200));
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let store = store.clone();
            let barrier = barrier.clone();
            let c = claim("old-key", "cus_2", &body(200), later);
            tokio::spawn(async move {
                barrier.wait().await;
                (store.claim(&c).await.unwrap(), c)
            })
        })
        .collect();
    let mut reclaimed = Vec::new();
    for t in tasks {
        if let (ClaimOutcome::Claimed { record_id }, c) = t.await.unwrap() {
            reclaimed.push((record_id, c));
        }
    }
    assert_eq!(
        reclaimed.len(),
        1,
        "exactly one racer reclaims the expired key"
    );
    let (id, winner) = &reclaimed[0];
    let record = store.record(*id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::InProgress);
    assert_eq!(record.customer_id, "cus_2");
    assert_eq!(record.charge_id, winner.charge.id);
    assert_eq!(record.response, None);
    assert_eq!(db.records().await, 1);
    assert_eq!(
        db.charges().await,
        2,
        "the old charge is kept; one new charge"
    );

    // An in-progress record far past its expiry is still in progress.
    let ancient = time::after(later, Duration::from_secs(100_000));
    match store
        .claim(&claim("old-key", "cus_3", &body(300), ancient))
        .await
        .unwrap()
    {
        ClaimOutcome::Existing(r) => assert_eq!(r.state, RecordState::InProgress),
        other => panic!("an in-progress record must not be reclaimed: {other:?}"),
    }
}

/// Every path that returns an existing record returns its owner and
/// fingerprint, so the owner/body check runs on each: complete, in progress
/// with a live lease, in progress with an expired lease.
async fn existing_records_carry_owner_and_fingerprint(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let t0 = time::now();
    let original = body(100);
    let mine = RequestFingerprint::of(&original);
    let reordered: Value =
        serde_json::from_str(r#"{"card_token":"tok_visa","currency":"GBP","amount_cents":100}"#)
            .unwrap();
    let other_body = RequestFingerprint::of(&body(101));

    let check = |r: &payments_domain::idempotency::IdempotencyRecord| {
        assert!(r.matches("cus_1", &mine));
        assert!(r.matches("cus_1", &RequestFingerprint::of(&reordered)));
        assert!(!r.matches("cus_2", &mine), "another customer never matches");
        assert!(
            !r.matches("cus_1", &other_body),
            "another body never matches"
        );
    };

    // In progress, live lease.
    let c = claim("owned-key", "cus_1", &original, t0);
    let record_id = claimed(&store, &c).await;
    let ClaimOutcome::Existing(live) = store
        .claim(&claim("owned-key", "cus_2", &body(5), t0))
        .await
        .unwrap()
    else {
        panic!("expected existing")
    };
    assert!(live.lease_is_live(t0));
    check(&live);

    // In progress, expired lease.
    let late = time::after(t0, Duration::from_secs(20));
    let ClaimOutcome::Existing(expired) = store
        .claim(&claim("owned-key", "cus_2", &body(5), late))
        .await
        .unwrap()
    else {
        panic!("expected existing")
    };
    assert!(!expired.lease_is_live(late));
    check(&expired);

    // Complete.
    let done = finish(&c, record_id, &c.lease.token, t0, "gw");
    assert_eq!(store.finish(&done).await.unwrap(), FinishOutcome::Finished);
    let ClaimOutcome::Existing(complete) = store
        .claim(&claim("owned-key", "cus_2", &body(5), late))
        .await
        .unwrap()
    else {
        panic!("expected existing")
    };
    assert_eq!(complete.state, RecordState::Complete);
    check(&complete);
    assert_eq!(
        db.charges().await,
        1,
        "no losing claim left a charge behind"
    );
}

/// The same key on another route is another record.
async fn keys_are_scoped_per_route(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let now = time::now();
    let a = claim("shared-key", "cus_1", &body(100), now);
    let mut b = claim("shared-key", "cus_1", &body(100), now);
    b.route = "POST /api/refunds".to_owned();
    let ra = claimed(&store, &a).await;
    let rb = claimed(&store, &b).await;
    assert_ne!(ra, rb);
    assert_eq!(db.records().await, 2);
}

/// What a claim stores round-trips through the backend unchanged.
async fn charges_round_trip(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let now = time::now();
    let with_extras = json!({"amount_cents": 4900, "currency": "JPY", "card_token": "tok_visa",
        "description": "tea ☕", "metadata": {"order": "42", "z": "last"}});
    let c = claim("rt-key", "cus_1", &with_extras, now);
    claimed(&store, &c).await;
    let stored = store.charge(&c.charge.id).await.unwrap().unwrap();
    assert_eq!(stored, c.charge);
    assert_eq!(store.charge("ch_missing").await.unwrap(), None);

    // Keyless charges (rollout mode) are inserted and settled directly.
    let customer = CustomerId::parse("cus_2").unwrap();
    let request = ChargeRequest::from_json(&body(700), 1_000_000).unwrap();
    let keyless = Charge::pending(&customer, &request, now);
    store.insert_charge(&keyless).await.unwrap();
    let settled = ChargeOutcome {
        charge_id: keyless.id.clone(),
        status: ChargeStatus::Failed,
        gateway_charge_id: Some("ch_gw".to_owned()),
        decline_code: Some("generic_decline".to_owned()),
        at: now,
    };
    store.settle_charge(&settled).await.unwrap();
    let read = store.charge(&keyless.id).await.unwrap().unwrap();
    assert_eq!(read.status, ChargeStatus::Failed);
    assert_eq!(read.decline_code.as_deref(), Some("generic_decline"));
    let missing = ChargeOutcome {
        charge_id: "ch_missing".to_owned(),
        ..settled
    };
    assert!(store.settle_charge(&missing).await.is_err());
    store.ready().await.unwrap();
}

/// A known key is answered from its record, in progress or complete, for
/// this (key, route) only, and writes nothing; a finish settles the record
/// and its charge together, once.
async fn known_keys_are_answered_from_their_record(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let now = time::now();
    let existing = |outcome: ClaimOutcome| match outcome {
        ClaimOutcome::Existing(record) => *record,
        ClaimOutcome::Claimed { record_id } => panic!("claimed again as {record_id}"),
    };
    let c = claim("known-key", "cus_1", &body(100), now);
    let record_id = claimed(&store, &c).await;
    let retry = claim("known-key", "cus_1", &body(100), now);
    let in_flight = existing(store.claim(&retry).await.unwrap());
    assert_eq!(in_flight.id, record_id);
    assert_eq!(in_flight.state, RecordState::InProgress);
    assert_eq!(in_flight.charge_id, c.charge.id);
    assert!(in_flight.lease_is_live(now));
    let mut other_route = claim("known-key", "cus_1", &body(100), now);
    other_route.route = "POST /api/refunds".to_owned();
    assert_ne!(claimed(&store, &other_route).await, record_id);
    let other_case = claim("KNOWN-KEY", "cus_1", &body(100), now);
    assert_ne!(
        claimed(&store, &other_case).await,
        record_id,
        "keys are compared byte for byte"
    );

    let done = finish(&c, record_id, &c.lease.token, now, "gw_known");
    assert_eq!(store.finish(&done).await.unwrap(), FinishOutcome::Finished);
    let complete = existing(store.claim(&retry).await.unwrap());
    assert_eq!(complete.state, RecordState::Complete);
    assert_eq!(complete.response, Some(done.response.clone()));
    let charge = store.charge(&c.charge.id).await.unwrap().unwrap();
    assert_eq!(charge.status, ChargeStatus::Succeeded);
    assert_eq!(charge.gateway_charge_id.as_deref(), Some("gw_known"));

    // A second finish under the same (now spent) lease changes nothing.
    let again = finish(&c, record_id, &c.lease.token, now, "gw_again");
    assert_eq!(store.finish(&again).await.unwrap(), FinishOutcome::Lost);
    let charge = store.charge(&c.charge.id).await.unwrap().unwrap();
    assert_eq!(charge.gateway_charge_id.as_deref(), Some("gw_known"));
    assert_eq!(db.records().await, 3);
    assert_eq!(db.charges().await, 3, "the retries wrote no charge");
}

backend_tests!(
    serializable;
    known_keys_are_answered_from_their_record,
    concurrent_claims_have_one_winner,
    concurrent_finishers_have_one_winner,
    takeover_only_after_expiry_and_only_once,
    released_lease_is_taken_over_at_once,
    expired_record_is_reclaimed_once,
    existing_records_carry_owner_and_fingerprint,
    keys_are_scoped_per_route,
    charges_round_trip,
);
