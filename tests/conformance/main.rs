//! The Store conformance suite: the same behaviour, over real connections,
//! on every backend. Time is the database's: lease and expiry cases move it
//! by ageing rows ([`TestDb::age`]), never by sleeping or by passing a clock
//! in. Every race is a real race: N tasks on a multi-threaded runtime
//! against one database.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use payments_domain::charge::{Charge, ChargeRequest, ChargeStatus, CustomerId};
use payments_domain::idempotency::{
    CHARGES_ROUTE, IdempotencyKey, IdempotencyRecord, JSON, LeaseToken, RecordId, RecordState,
    RequestFingerprint, StoredResponse,
};
use payments_domain::store::{
    ChargeOutcome, Claim, ClaimAge, ClaimOutcome, Finish, FinishOutcome, NewLease, Store,
};
use payments_tests::{Backend, TestDb, backend_tests};
use serde_json::{Value, json};

const RACERS: usize = 16;
const LEASE: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(3600);
/// The re-drive limit these tests use: 24 h key retention - 1 h margin.
const LIMIT: Duration = Duration::from_secs(23 * 3600);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn body(amount: i64) -> Value {
    json!({"amount_cents": amount, "currency": "GBP", "card_token": "tok_visa"})
}

fn claim(key: &str, customer: &str, body: &Value) -> Claim {
    let request = ChargeRequest::from_json(body, 1_000_000).unwrap();
    let customer_id = CustomerId::parse(customer).unwrap();
    Claim {
        key: IdempotencyKey::parse(key).unwrap(),
        route: CHARGES_ROUTE,
        customer: customer_id.clone(),
        fingerprint: RequestFingerprint::of(body),
        lease: NewLease::new(LEASE),
        ttl: TTL,
        charge: Charge::pending(&customer_id, &request),
    }
}

fn finish(c: &Claim, record_id: RecordId, token: &LeaseToken, marker: &str) -> Finish {
    Finish {
        record_id,
        lease_token: token.clone(),
        state: RecordState::Complete,
        outcome: ChargeOutcome {
            charge_id: c.charge.id.clone(),
            status: ChargeStatus::Succeeded,
            gateway_charge_id: Some(marker.to_owned()),
            decline_code: None,
        },
        response: StoredResponse {
            status: 201,
            body: format!(r#"{{"winner":"{marker}"}}"#),
            content_type: JSON.to_owned(),
            location: Some(format!("/api/charges/{}", c.charge.id)),
        },
    }
}

async fn claimed(store: &Arc<dyn Store>, c: &Claim) -> RecordId {
    match store.claim(c).await.unwrap() {
        ClaimOutcome::Claimed { record_id, .. } => record_id,
        ClaimOutcome::Existing(r) => panic!("expected a claim, got existing {r:?}"),
    }
}

fn existing(outcome: ClaimOutcome) -> IdempotencyRecord {
    match outcome {
        ClaimOutcome::Existing(record) => *record,
        ClaimOutcome::Claimed { record_id, .. } => panic!("claimed again as {record_id}"),
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
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let store = store.clone();
            let barrier = barrier.clone();
            let c = claim("race-key", &format!("cus_{}", i % 2), &body(100));
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
            ClaimOutcome::Claimed { record_id, .. } => {
                winners += 1;
                record_ids.push(record_id);
            }
            ClaimOutcome::Existing(r) => {
                assert_eq!(r.state, RecordState::InProgress);
                assert!(r.lease_live);
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
    let c = claim("finish-key", "cus_1", &body(100));
    let record_id = claimed(&store, &c).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let store = store.clone();
            let barrier = barrier.clone();
            let f = finish(&c, record_id, &c.lease.token, &format!("gw_{i}"));
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
    assert!(record.completed_at.is_some());
    let charge = store.charge(&c.charge.id).await.unwrap().unwrap();
    assert_eq!(charge.status, ChargeStatus::Succeeded);
    assert_eq!(charge.gateway_charge_id, winner.outcome.gateway_charge_id);
    // A finisher with a wrong token, or after completion, loses.
    let late = finish(
        &c,
        record_id,
        &LeaseToken::from_stored("not-the-token".to_owned()),
        "gw_late",
    );
    assert_eq!(store.finish(&late).await.unwrap(), FinishOutcome::Lost);
}

/// A lease is taken over only once it has expired by the database's clock,
/// and only by one of several racers; the old holder can no longer finish.
async fn takeover_only_after_expiry_and_only_once(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let c = claim("lease-key", "cus_1", &body(100));
    let record_id = claimed(&store, &c).await;
    assert!(
        !store
            .take_over(
                record_id,
                &c.lease.token,
                &NewLease::new(LEASE),
                ClaimAge::Under(LIMIT)
            )
            .await
            .unwrap(),
        "a live lease is never taken over"
    );
    db.age(Some("lease-key"), secs(11)).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let store = store.clone();
            let barrier = barrier.clone();
            let expected = c.lease.token.clone();
            let lease = NewLease::new(LEASE);
            tokio::spawn(async move {
                barrier.wait().await;
                let won = store
                    .take_over(record_id, &expected, &lease, ClaimAge::Under(LIMIT))
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
    assert_eq!(
        record.lease.as_ref().map(|l| l.token.as_str()),
        Some(new_lease.token.as_str())
    );
    assert!(record.lease_live, "the new lease runs from the takeover");
    // The old holder lost its lease: its finish and its release do nothing.
    assert!(!store.release(record_id, &c.lease.token).await.unwrap());
    let stale = finish(&c, record_id, &c.lease.token, "gw_stale");
    assert_eq!(store.finish(&stale).await.unwrap(), FinishOutcome::Lost);
    let current = finish(&c, record_id, &new_lease.token, "gw_new");
    assert_eq!(
        store.finish(&current).await.unwrap(),
        FinishOutcome::Finished
    );
}

/// The guard on the provider's key retention is part of the takeover
/// statements: a record claimed longer ago than the limit is not taken over
/// for a re-drive, not by an API retry (`take_over`) nor by a reaper
/// (`claim_expired`), even with the right token and an expired lease; it is
/// taken only to be abandoned (`ClaimAge::AtLeast`), once.
async fn records_past_the_key_retention_are_never_taken_to_redrive(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let c = claim("old-in-flight", "cus_1", &body(100));
    let record_id = claimed(&store, &c).await;
    db.age(Some("old-in-flight"), LIMIT + secs(60)).await;
    let record = store.record(record_id).await.unwrap().unwrap();
    assert!(!record.lease_live);
    assert!(
        record.age >= LIMIT,
        "the database measures the age: {record:?}"
    );
    let redrive = NewLease::new(LEASE);
    assert!(
        !store
            .take_over(record_id, &c.lease.token, &redrive, ClaimAge::Under(LIMIT))
            .await
            .unwrap(),
        "no re-drive past the limit"
    );
    assert_eq!(
        store
            .claim_expired(&redrive, ClaimAge::Under(LIMIT))
            .await
            .unwrap(),
        None,
        "the reaper's re-drive claim passes over it too"
    );
    // Just inside the limit, the same statements take it.
    let young = claim("young-in-flight", "cus_1", &body(100));
    let young_id = claimed(&store, &young).await;
    db.age(Some("young-in-flight"), LIMIT - secs(60)).await;
    let taken = store
        .claim_expired(&NewLease::new(LEASE), ClaimAge::Under(LIMIT))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.id, young_id);
    assert!(taken.lease_live);
    // Taken to be abandoned: once.
    let abandon = NewLease::new(LEASE);
    assert!(
        store
            .take_over(
                record_id,
                &c.lease.token,
                &abandon,
                ClaimAge::AtLeast(LIMIT)
            )
            .await
            .unwrap()
    );
    assert!(
        !store
            .take_over(
                record_id,
                &c.lease.token,
                &abandon,
                ClaimAge::AtLeast(LIMIT)
            )
            .await
            .unwrap()
    );
}

/// Releasing a lease (unknown outcome) keeps the record in progress and
/// lets the next caller take it over at once.
async fn released_lease_is_taken_over_at_once(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let c = claim("release-key", "cus_1", &body(100));
    let record_id = claimed(&store, &c).await;
    assert!(store.release(record_id, &c.lease.token).await.unwrap());
    let record = store.record(record_id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::InProgress);
    assert!(!record.lease_live);
    assert!(
        store
            .take_over(
                record_id,
                &c.lease.token,
                &NewLease::new(LEASE),
                ClaimAge::Under(LIMIT)
            )
            .await
            .unwrap()
    );
    assert_eq!(db.charges_with_status("pending").await, 1);
}

/// Every stored time is the database's: the lease and the TTL are counted
/// from the database's clock when the row is written (each expression reads
/// it as it runs, so they may differ by a millisecond or so from
/// `created_at`), and the stored charge carries the record's `created_at`.
async fn deadlines_are_computed_by_the_database(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let c = claim("clock-key", "cus_1", &body(100));
    let ClaimOutcome::Claimed { record_id, charge } = store.claim(&c).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    let record = store.record(record_id).await.unwrap().unwrap();
    let lease = record.lease.clone().unwrap();
    let ms = |d: chrono::TimeDelta| d.num_milliseconds();
    let lease_ms = ms(lease.until - record.created_at);
    assert!((10_000..10_050).contains(&lease_ms), "{record:?}");
    let ttl_ms = ms(record.expires_at - record.created_at);
    assert!((3_600_000..3_600_050).contains(&ttl_ms), "{record:?}");
    assert_eq!(charge.created_at, record.created_at);
    let stored = store.charge(&charge.id).await.unwrap().unwrap();
    assert_eq!(stored, *charge, "the claim returns the charge as stored");
    assert_eq!(
        record.created_at.timestamp_subsec_micros() % 1000,
        0,
        "milliseconds"
    );
    assert!(record.age < secs(60));
    assert!(record.lease_live && !record.expired);
}

/// A complete record past `expires_at` behaves as absent: one of several
/// racers reclaims it with its own body and customer. A record whose
/// outcome is not final (in progress, or abandoned) is never reclaimed,
/// whatever its age.
async fn expired_record_is_reclaimed_once(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let first = claim("old-key", "cus_1", &body(100));
    let record_id = claimed(&store, &first).await;
    let done = finish(&first, record_id, &first.lease.token, "gw_first");
    assert_eq!(store.finish(&done).await.unwrap(), FinishOutcome::Finished);

    // Before expiry: the existing record, with the first owner and body.
    let r = existing(
        store
            .claim(&claim("old-key", "cus_2", &body(200)))
            .await
            .unwrap(),
    );
    assert_eq!(r.state, RecordState::Complete);
    assert_eq!(r.customer_id, "cus_1");
    assert!(!r.expired);

    db.age(Some("old-key"), 2 * TTL).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let store = store.clone();
            let barrier = barrier.clone();
            let c = claim("old-key", "cus_2", &body(200));
            tokio::spawn(async move {
                barrier.wait().await;
                (store.claim(&c).await.unwrap(), c)
            })
        })
        .collect();
    let mut reclaimed = Vec::new();
    for t in tasks {
        if let (ClaimOutcome::Claimed { record_id, .. }, c) = t.await.unwrap() {
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
    assert!(record.lease_live && !record.expired, "times start afresh");
    assert_eq!(db.records().await, 1);
    assert_eq!(
        db.charges().await,
        2,
        "the old charge is kept; one new charge"
    );

    // An in-progress record far past its expiry is still in progress.
    db.age(Some("old-key"), 100 * TTL).await;
    let r = existing(
        store
            .claim(&claim("old-key", "cus_3", &body(300)))
            .await
            .unwrap(),
    );
    assert_eq!(
        r.state,
        RecordState::InProgress,
        "in progress is never reclaimed"
    );

    // An abandoned record past its expiry is replayed, never reclaimed.
    let lost = claim("abandoned-key", "cus_1", &body(100));
    let lost_id = claimed(&store, &lost).await;
    let mut abandon = finish(&lost, lost_id, &lost.lease.token, "unused");
    abandon.state = RecordState::Abandoned;
    abandon.outcome.status = ChargeStatus::Unknown;
    abandon.outcome.gateway_charge_id = None;
    abandon.response.status = 500;
    assert_eq!(
        store.finish(&abandon).await.unwrap(),
        FinishOutcome::Finished
    );
    db.age(Some("abandoned-key"), 100 * TTL).await;
    for customer in ["cus_1", "cus_9"] {
        let r = existing(
            store
                .claim(&claim("abandoned-key", customer, &body(100)))
                .await
                .unwrap(),
        );
        assert_eq!(r.state, RecordState::Abandoned);
        assert!(r.expired);
        assert_eq!(r.response.as_ref().map(|r| r.status), Some(500));
    }
    assert_eq!(db.charges_with_status("unknown").await, 1);
}

/// The pruner deletes complete records past their TTL by the database's
/// clock, in batches, and nothing else: not a fresh record, not one in
/// progress, not an abandoned one, never a charge.
async fn prune_deletes_only_expired_final_answers(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let finished = |key: &'static str, state: RecordState| {
        let store = store.clone();
        async move {
            let c = claim(key, "cus_1", &body(100));
            let id = claimed(&store, &c).await;
            let mut f = finish(&c, id, &c.lease.token, key);
            f.state = state;
            assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
        }
    };
    for key in ["done-1", "done-2", "done-3"] {
        finished(key, RecordState::Complete).await;
        db.age(Some(key), 2 * TTL).await;
    }
    finished("fresh", RecordState::Complete).await;
    finished("abandoned", RecordState::Abandoned).await;
    db.age(Some("abandoned"), 2 * TTL).await;
    store
        .claim(&claim("in-flight", "cus_1", &body(100)))
        .await
        .unwrap();
    db.age(Some("in-flight"), 2 * TTL).await;

    assert_eq!(store.count_prunable().await.unwrap(), 3);
    assert_eq!(store.prune(2).await.unwrap(), 2);
    assert_eq!(store.prune(2).await.unwrap(), 1);
    assert_eq!(store.prune(2).await.unwrap(), 0);
    assert_eq!(
        db.records().await,
        3,
        "fresh, abandoned and in-flight remain"
    );
    assert_eq!(db.charges().await, 6, "charges are never pruned");
}

/// Every path that returns an existing record returns its owner and
/// fingerprint, so the owner/body check runs on each: complete, in progress
/// with a live lease, in progress with an expired lease.
async fn existing_records_carry_owner_and_fingerprint(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let original = body(100);
    let mine = RequestFingerprint::of(&original);
    let reordered: Value =
        serde_json::from_str(r#"{"card_token":"tok_visa","currency":"GBP","amount_cents":100}"#)
            .unwrap();
    let other_body = RequestFingerprint::of(&body(101));

    let check = |r: &IdempotencyRecord| {
        assert!(r.matches("cus_1", &mine));
        assert!(r.matches("cus_1", &RequestFingerprint::of(&reordered)));
        assert!(!r.matches("cus_2", &mine), "another customer never matches");
        assert!(
            !r.matches("cus_1", &other_body),
            "another body never matches"
        );
    };

    // In progress, live lease.
    let c = claim("owned-key", "cus_1", &original);
    let record_id = claimed(&store, &c).await;
    let live = existing(
        store
            .claim(&claim("owned-key", "cus_2", &body(5)))
            .await
            .unwrap(),
    );
    assert!(live.lease_live);
    check(&live);

    // In progress, expired lease.
    db.age(Some("owned-key"), secs(20)).await;
    let expired = existing(
        store
            .claim(&claim("owned-key", "cus_2", &body(5)))
            .await
            .unwrap(),
    );
    assert!(!expired.lease_live);
    check(&expired);

    // Complete.
    let done = finish(&c, record_id, &c.lease.token, "gw");
    assert_eq!(store.finish(&done).await.unwrap(), FinishOutcome::Finished);
    let complete = existing(
        store
            .claim(&claim("owned-key", "cus_2", &body(5)))
            .await
            .unwrap(),
    );
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
    let a = claim("shared-key", "cus_1", &body(100));
    let mut b = claim("shared-key", "cus_1", &body(100));
    b.route = "POST /api/refunds";
    let ra = claimed(&store, &a).await;
    let rb = claimed(&store, &b).await;
    assert_ne!(ra, rb);
    assert_eq!(db.records().await, 2);
}

/// What a claim stores round-trips through the backend unchanged; a
/// charge is settled outside a finish only while it is pending.
async fn charges_round_trip(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let with_extras = json!({"amount_cents": 4900, "currency": "JPY", "card_token": "tok_visa",
        "description": "tea ☕", "metadata": {"order": "42", "z": "last"}});
    let c = claim("rt-key", "cus_1", &with_extras);
    let ClaimOutcome::Claimed { charge, .. } = store.claim(&c).await.unwrap() else {
        panic!("claimed")
    };
    let stored = store.charge(&c.charge.id).await.unwrap().unwrap();
    assert_eq!(stored, *charge);
    assert_eq!(
        Charge {
            created_at: c.charge.created_at,
            updated_at: c.charge.updated_at,
            ..stored
        },
        c.charge,
        "everything but the database's timestamps is as sent"
    );
    assert_eq!(store.charge("ch_missing").await.unwrap(), None);

    // Keyless charges (rollout mode) are inserted and settled directly.
    let customer = CustomerId::parse("cus_2").unwrap();
    let request = ChargeRequest::from_json(&body(700), 1_000_000).unwrap();
    let keyless = store
        .insert_charge(&Charge::pending(&customer, &request))
        .await
        .unwrap();
    assert_eq!(
        store.charge(&keyless.id).await.unwrap().as_ref(),
        Some(&keyless)
    );
    let settled = ChargeOutcome {
        charge_id: keyless.id.clone(),
        status: ChargeStatus::Failed,
        gateway_charge_id: Some("ch_gw".to_owned()),
        decline_code: Some("generic_decline".to_owned()),
    };
    assert!(store.settle_charge(&settled).await.unwrap());
    let read = store.charge(&keyless.id).await.unwrap().unwrap();
    assert_eq!(read.status, ChargeStatus::Failed);
    assert_eq!(read.decline_code.as_deref(), Some("generic_decline"));
    // Settled once: a second settlement changes nothing.
    let again = ChargeOutcome {
        status: ChargeStatus::Unknown,
        ..settled.clone()
    };
    assert!(!store.settle_charge(&again).await.unwrap());
    assert_eq!(
        store.charge(&keyless.id).await.unwrap().unwrap().status,
        ChargeStatus::Failed
    );
    let missing = ChargeOutcome {
        charge_id: "ch_missing".to_owned(),
        ..settled
    };
    assert!(!store.settle_charge(&missing).await.unwrap());
    store.ready().await.unwrap();
}

/// A known key is answered from its record, in progress or complete, for
/// this (key, route) only, and writes nothing; a finish settles the record
/// and its charge together, once.
async fn known_keys_are_answered_from_their_record(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let c = claim("known-key", "cus_1", &body(100));
    let record_id = claimed(&store, &c).await;
    let retry = claim("known-key", "cus_1", &body(100));
    let in_flight = existing(store.claim(&retry).await.unwrap());
    assert_eq!(in_flight.id, record_id);
    assert_eq!(in_flight.state, RecordState::InProgress);
    assert_eq!(in_flight.charge_id, c.charge.id);
    assert!(in_flight.lease_live);
    let mut other_route = claim("known-key", "cus_1", &body(100));
    other_route.route = "POST /api/refunds";
    assert_ne!(claimed(&store, &other_route).await, record_id);
    let other_case = claim("KNOWN-KEY", "cus_1", &body(100));
    assert_ne!(
        claimed(&store, &other_case).await,
        record_id,
        "keys are compared byte for byte"
    );

    let done = finish(&c, record_id, &c.lease.token, "gw_known");
    assert_eq!(store.finish(&done).await.unwrap(), FinishOutcome::Finished);
    let complete = existing(store.claim(&retry).await.unwrap());
    assert_eq!(complete.state, RecordState::Complete);
    assert_eq!(complete.response, Some(done.response.clone()));
    let charge = store.charge(&c.charge.id).await.unwrap().unwrap();
    assert_eq!(charge.status, ChargeStatus::Succeeded);
    assert_eq!(charge.gateway_charge_id.as_deref(), Some("gw_known"));

    // A second finish under the same (now spent) lease changes nothing.
    let again = finish(&c, record_id, &c.lease.token, "gw_again");
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
    records_past_the_key_retention_are_never_taken_to_redrive,
    released_lease_is_taken_over_at_once,
    deadlines_are_computed_by_the_database,
    expired_record_is_reclaimed_once,
    prune_deletes_only_expired_final_answers,
    existing_records_carry_owner_and_fingerprint,
    keys_are_scoped_per_route,
    charges_round_trip,
);
