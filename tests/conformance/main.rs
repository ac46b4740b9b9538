//! The Store conformance suite: the same behaviour, over real connections,
//! on every backend. Time is the database's: lease and expiry cases move it
//! by ageing rows ([`TestDb::age`]), never by sleeping or by passing a clock
//! in. Every race is a real race: N tasks on a multi-threaded runtime
//! against one database.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use payments_domain::charge::{Charge, ChargeRequest, ChargeStatus, CustomerId};
use payments_domain::events::{EventType, NewEvent, event_id};
use payments_domain::idempotency::{
    CHARGES_ROUTE, IdempotencyKey, IdempotencyRecord, JSON, LeaseToken, REFUNDS_ROUTE, RecordId,
    RecordState, RequestFingerprint, StoredResponse,
};
use payments_domain::refund::{Refund, RefundRequest};
use payments_domain::store::{
    ChargeOutcome, Claim, ClaimAge, ClaimOutcome, Finish, FinishOutcome, NewLease, Operation,
    Outcome, RefundOutcome, Store, StoreError,
};
use payments_tests::{Backend, TestDb, backend_tests, query_pairs};
use serde_json::{Value, json};

mod inbox;

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
        operation: Operation::Charge(Charge::pending(&customer_id, &request)),
        read_first: true,
        hold_margin: Duration::ZERO,
    }
}

/// The pending charge a claim carries.
fn charge_of(c: &Claim) -> &Charge {
    match &c.operation {
        Operation::Charge(charge) => charge,
        other => panic!("not a charge's claim: {other:?}"),
    }
}

/// A charge's outcome.
fn charge_outcome(o: &Outcome) -> &ChargeOutcome {
    match o {
        Outcome::Charge(o) => o,
        other => panic!("not a charge's outcome: {other:?}"),
    }
}

fn finish(c: &Claim, record_id: RecordId, token: &LeaseToken, marker: &str) -> Finish {
    let outcome = Outcome::Charge(ChargeOutcome {
        charge_id: charge_of(c).id.clone(),
        status: ChargeStatus::Succeeded,
        gateway_charge_id: Some(marker.to_owned()),
        decline_code: None,
        capture_before: None,
    });
    Finish {
        record_id,
        lease_token: token.clone(),
        state: RecordState::Complete,
        event: NewEvent::of(&c.operation, &outcome),
        outcome,
        response: StoredResponse {
            status: 201,
            body: format!(r#"{{"winner":"{marker}"}}"#),
            content_type: JSON.to_owned(),
            location: Some(format!("/api/charges/{}", charge_of(c).id)),
        },
    }
}

async fn claimed(store: &Arc<dyn Store>, c: &Claim) -> RecordId {
    match store.claim(c).await.unwrap() {
        ClaimOutcome::Claimed { record_id, .. } => record_id,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn existing(outcome: ClaimOutcome) -> IdempotencyRecord {
    match outcome {
        ClaimOutcome::Existing(record) => *record,
        other => panic!("expected the existing record, got {other:?}"),
    }
}

async fn db(backend: Backend) -> Option<TestDb> {
    TestDb::new(backend, 8).await
}

/// PostgreSQL's lane: a claim or finish that completed keeps its connection
/// for the next one instead of sending it back through sqlx's ping. It
/// keeps at most half of the pool, so the other half still serves every
/// other statement, and once the charges stop it gives everything back
/// within two sweeps (2 x 100 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lane_keeps_at_most_half_the_pool_and_gives_it_back() {
    for backend in [Backend::Postgres, Backend::PostgresSerializable] {
        let Some(db) = TestDb::new(backend, 4).await else {
            continue;
        };
        let (store, pg) = (db.store(), db.postgres().unwrap());
        let charges = (0..16).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let c = claim(&format!("lane-{i}"), "cus_lane", &body(100 + i));
                let record_id = claimed(&store, &c).await;
                let done = finish(&c, record_id, &c.lease.token, "ok");
                assert_eq!(store.finish(&done).await.unwrap(), FinishOutcome::Finished);
            })
        });
        for charge in charges.collect::<Vec<_>>() {
            charge.await.unwrap();
        }
        let kept = pg.lane_kept().expect("a pool of 4 has a lane");
        assert!((1..=2).contains(&kept), "{backend:?}: {kept} kept");
        // The half the lane cannot keep is the pool's, at once.
        let pool = pg.pool();
        let free = tokio::time::timeout(Duration::from_secs(5), async {
            (pool.acquire().await.unwrap(), pool.acquire().await.unwrap())
        });
        drop(free.await.expect("two connections free beside the lane"));
        // And the rest comes back when the lane has been idle.
        let all = tokio::time::timeout(Duration::from_secs(5), async {
            let mut all = Vec::new();
            for _ in 0..4 {
                all.push(pool.acquire().await.unwrap());
            }
            all
        });
        assert_eq!(
            all.await.expect("the lane gave its connections back").len(),
            4
        );
        assert_eq!(pg.lane_kept(), Some(0), "{backend:?}");
    }
}

/// N tasks claim one key at once: exactly one wins, one record and one
/// charge exist, every loser sees the winner's record. On a cluster the
/// race must really reach certification; whether one round's writes
/// overlap is up to the scheduler (on a loaded host they can run one after
/// another), so the race is run again with a fresh key, every round held
/// to the same rules, until a round has conflicted (at most
/// `CLUSTER_ROUNDS` rounds).
async fn concurrent_claims_have_one_winner(backend: Backend) {
    const CLUSTER_ROUNDS: usize = 8;
    let Some(db) = db(backend).await else { return };
    let start = db.cluster_conflicts().await;
    let mut round = 0;
    loop {
        round += 1;
        let before = db.cluster_conflicts().await;
        claim_race(&db, &format!("race-key-{round}"), round).await;
        match (before, db.cluster_conflicts().await) {
            (Some(before), Some(after)) if after <= before && round < CLUSTER_ROUNDS => continue,
            _ => break,
        }
    }
    if let (Some(start), Some(end)) = (start, db.cluster_conflicts().await) {
        assert!(
            end > start,
            "claims on three nodes really conflicted at certification \
             ({start} -> {end} in {round} rounds)"
        );
    }
}

/// One round of [`concurrent_claims_have_one_winner`]: the `round`th key
/// raced; every earlier round's record and charge are still there.
async fn claim_race(db: &TestDb, key: &str, round: usize) {
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let store = db.racer(i);
            let barrier = barrier.clone();
            let mut c = claim(key, &format!("cus_{}", i % 2), &body(100));
            // Half skip the read before the write, so that their writes
            // really race (on a cluster, into certification conflicts)
            // rather than finding the winner's record by reading.
            c.read_first = i % 4 < 2;
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
            other => panic!("a fresh key's charge is never {other:?}"),
        }
    }
    assert_eq!(winners, 1, "exactly one claimer wins");
    record_ids.dedup();
    assert_eq!(record_ids.len(), 1, "everyone saw the same record");
    let round = i64::try_from(round).unwrap();
    assert_eq!(db.records().await, round);
    assert_eq!(
        db.charges().await,
        round,
        "losers' charges were rolled back"
    );
    assert_eq!(db.charges_with_status("pending").await, round);
}

/// Many finishers with the lease token race: exactly one completes the
/// record; the record holds the winner's response and the charge its outcome.
async fn concurrent_finishers_have_one_winner(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let c = claim("finish-key", "cus_1", &body(100));
    let record_id = claimed(&store, &c).await;
    let conflicts = db.cluster_conflicts().await;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let store = db.racer(i);
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
    if let (Some(before), Some(after)) = (conflicts, db.cluster_conflicts().await) {
        assert!(
            after > before,
            "finishes on three nodes really conflicted ({before} -> {after})"
        );
    }
    let winner = &winners[0];
    let record = store.record(record_id).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Complete);
    assert_eq!(record.response.as_ref(), Some(&winner.response));
    assert_eq!(record.lease, None, "a complete record holds no lease");
    assert!(record.completed_at.is_some());
    let charge = store.charge(&charge_of(&c).id).await.unwrap().unwrap();
    assert_eq!(charge.status, ChargeStatus::Succeeded);
    assert_eq!(
        charge.gateway_charge_id,
        charge_outcome(&winner.outcome).gateway_charge_id
    );
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
        .map(|i| {
            let store = db.racer(i);
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

/// Reapers racing over many expired records, on a cluster spread over its
/// nodes: every record is leased by exactly one of them. Each racer claims
/// until nothing is left, under a lease no run of this test can outlive
/// (an hour), so a record leased twice can only be two holders at once:
/// the fencing the reaper relies on, not a lease that ran out.
async fn expired_records_are_leased_by_one_reaper_each(backend: Backend) {
    const RECORDS: usize = 40;
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let mut ids = std::collections::BTreeSet::new();
    for i in 0..RECORDS {
        let key = format!("reap-race-{i}");
        ids.insert(claimed(&store, &claim(&key, "cus_1", &body(100))).await);
    }
    db.age(None, secs(60)).await;
    let conflicts = db.cluster_conflicts().await;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let store = db.racer(i);
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let mut taken = Vec::new();
                let lease = NewLease::new(secs(3600));
                while let Some(record) = store
                    .claim_expired(&lease, ClaimAge::Under(LIMIT))
                    .await
                    .unwrap()
                {
                    assert_eq!(
                        record.lease.as_ref().map(|l| l.token.as_str()),
                        Some(lease.token.as_str()),
                        "the record comes back under the claimer's lease"
                    );
                    taken.push(record.id);
                }
                taken
            })
        })
        .collect();
    let mut taken = Vec::new();
    for t in tasks {
        taken.extend(t.await.unwrap());
    }
    taken.sort();
    let leased_twice: Vec<_> = taken.windows(2).filter(|w| w[0] == w[1]).collect();
    assert!(
        leased_twice.is_empty(),
        "records leased twice: {leased_twice:?}"
    );
    assert_eq!(
        taken.into_iter().collect::<std::collections::BTreeSet<_>>(),
        ids,
        "every expired record was leased"
    );
    if let (Some(before), Some(after)) = (conflicts, db.cluster_conflicts().await) {
        assert!(
            after > before,
            "reapers on three nodes really conflicted at certification ({before} -> {after})"
        );
    }
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
    let ClaimOutcome::Claimed {
        record_id,
        operation,
    } = store.claim(&c).await.unwrap()
    else {
        panic!("a fresh key is claimed")
    };
    let Operation::Charge(charge) = *operation else {
        panic!("a charge")
    };
    let record = store.record(record_id).await.unwrap().unwrap();
    let lease = record.lease.clone().unwrap();
    let ms = |d: chrono::TimeDelta| d.num_milliseconds();
    let lease_ms = ms(lease.until - record.created_at);
    // Each expression reads the clock as it runs, in an order the database
    // chooses, and is truncated to milliseconds: one read a moment before
    // `created_at`'s can land on the millisecond below it.
    assert!((9_999..10_050).contains(&lease_ms), "{record:?}");
    let ttl_ms = ms(record.expires_at - record.created_at);
    assert!((3_599_999..3_600_050).contains(&ttl_ms), "{record:?}");
    assert_eq!(charge.created_at, record.created_at);
    let stored = store.charge(&charge.id).await.unwrap().unwrap();
    assert_eq!(stored, charge, "the claim returns the charge as stored");
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
        .map(|i| {
            let store = db.racer(i);
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
    assert_eq!(record.charge_id, charge_of(winner).id);
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
    abandon.outcome = Outcome::Charge(ChargeOutcome {
        status: ChargeStatus::Unknown,
        gateway_charge_id: None,
        ..charge_outcome(&abandon.outcome).clone()
    });
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
            .claim(&claim("owned-key", "cus_2", &body(50)))
            .await
            .unwrap(),
    );
    assert!(live.lease_live);
    check(&live);

    // In progress, expired lease.
    db.age(Some("owned-key"), secs(20)).await;
    let expired = existing(
        store
            .claim(&claim("owned-key", "cus_2", &body(50)))
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
            .claim(&claim("owned-key", "cus_2", &body(50)))
            .await
            .unwrap(),
    );
    assert_eq!(complete.state, RecordState::Complete);
    check(&complete);
    // A claim told not to read first still finds it, at the write.
    let mut unread = claim("owned-key", "cus_2", &body(50));
    unread.read_first = false;
    let found = existing(store.claim(&unread).await.unwrap());
    assert_eq!((found.id, found.state), (record_id, RecordState::Complete));
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
    let ClaimOutcome::Claimed { operation, .. } = store.claim(&c).await.unwrap() else {
        panic!("claimed")
    };
    let stored = store.charge(&charge_of(&c).id).await.unwrap().unwrap();
    assert_eq!(Operation::Charge(stored.clone()), *operation);
    assert_eq!(
        Charge {
            created_at: charge_of(&c).created_at,
            updated_at: charge_of(&c).updated_at,
            ..stored
        },
        *charge_of(&c),
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
        capture_before: None,
    };
    let settles = |outcome: ChargeOutcome| {
        let outcome = Outcome::Charge(outcome);
        let event = NewEvent::of(&Operation::Charge(keyless.clone()), &outcome);
        let store = store.clone();
        async move { store.settle(&outcome, event.as_ref()).await.unwrap() }
    };
    assert!(settles(settled.clone()).await);
    // Its event, written with it.
    let failed = event_id(&keyless.id, EventType::ChargeFailed);
    let event = store
        .event(&failed)
        .await
        .unwrap()
        .expect("the settlement's event");
    assert_eq!(event.event_type, "charge.failed");
    let read = store.charge(&keyless.id).await.unwrap().unwrap();
    assert_eq!(read.status, ChargeStatus::Failed);
    assert_eq!(read.decline_code.as_deref(), Some("generic_decline"));
    // Settled once: a second settlement changes nothing.
    let again = ChargeOutcome {
        status: ChargeStatus::Unknown,
        ..settled.clone()
    };
    assert!(!settles(again).await);
    let unknown = event_id(&keyless.id, EventType::ChargeUnknown);
    assert_eq!(
        store.event(&unknown).await.unwrap(),
        None,
        "no change, no event"
    );
    assert_eq!(
        store.charge(&keyless.id).await.unwrap().unwrap().status,
        ChargeStatus::Failed
    );
    let missing = ChargeOutcome {
        charge_id: "ch_missing".to_owned(),
        ..settled
    };
    assert!(!settles(missing).await);
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
    assert_eq!(in_flight.charge_id, charge_of(&c).id);
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
    let charge = store.charge(&charge_of(&c).id).await.unwrap().unwrap();
    assert_eq!(charge.status, ChargeStatus::Succeeded);
    assert_eq!(charge.gateway_charge_id.as_deref(), Some("gw_known"));

    // A second finish under the same (now spent) lease changes nothing.
    let again = finish(&c, record_id, &c.lease.token, "gw_again");
    assert_eq!(store.finish(&again).await.unwrap(), FinishOutcome::Lost);
    let charge = store.charge(&charge_of(&c).id).await.unwrap().unwrap();
    assert_eq!(charge.gateway_charge_id.as_deref(), Some("gw_known"));
    assert_eq!(db.records().await, 3);
    assert_eq!(db.charges().await, 3, "the retries wrote no charge");
}

/// What one store (on a cluster, one node) acknowledged, the next read
/// through another (another node) shows at once: the finished record, as a
/// retry's claim reads it, and the settled charge. On Galera this is what
/// `wsrep_sync_wait` buys; with the default, a retry on the second node saw
/// the key in flight and the charge pending.
async fn acknowledged_writes_are_read_at_once_everywhere(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let (first, second) = (db.racer(0), db.racer(1));
    for i in 0..50 {
        let c = claim(&format!("seen-{i}"), "cus_1", &body(100));
        let record_id = claimed(&first, &c).await;
        let done = finish(&c, record_id, &c.lease.token, "gw_seen");
        assert_eq!(first.finish(&done).await.unwrap(), FinishOutcome::Finished);
        let retry = existing(second.claim(&c).await.unwrap());
        assert_eq!(
            (retry.state, retry.response.as_ref()),
            (RecordState::Complete, Some(&done.response)),
            "round {i}: the retry is a replay"
        );
        let charge = second.charge(&charge_of(&c).id).await.unwrap().unwrap();
        assert_eq!(charge.status, ChargeStatus::Succeeded, "round {i}");
    }
}

/// A succeeded charge of `amount` for `cus_1`, as a finished claim leaves it.
async fn succeeded_charge(store: &Arc<dyn Store>, key: &str, amount: i64) -> Charge {
    let c = claim(key, "cus_1", &body(amount));
    let record_id = claimed(store, &c).await;
    let f = finish(&c, record_id, &c.lease.token, "ch_provider");
    assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
    store.charge(&charge_of(&c).id).await.unwrap().unwrap()
}

/// A claim to refund `amount` (`None`: what is left) of `charge`.
fn refund_claim(key: &str, charge: &Charge, amount: Option<i64>) -> Claim {
    let body = match amount {
        Some(amount) => json!({"amount_cents": amount}),
        None => json!({}),
    };
    let request = RefundRequest::from_json(&body, 1_000_000).unwrap();
    let customer = CustomerId::parse(&charge.customer_id).unwrap();
    Claim {
        key: IdempotencyKey::parse(key).unwrap(),
        route: REFUNDS_ROUTE,
        customer: customer.clone(),
        fingerprint: RequestFingerprint::of(&json!({"charge_id": charge.id, "b": body})),
        lease: NewLease::new(LEASE),
        ttl: TTL,
        operation: Operation::Refund(Refund::pending(
            &payments_domain::scope::Actor::customer(customer.clone()),
            charge,
            &request,
        )),
        read_first: true,
        hold_margin: Duration::ZERO,
    }
}

/// The refund a won claim made.
fn claimed_refund(outcome: ClaimOutcome) -> (RecordId, Refund) {
    match outcome {
        ClaimOutcome::Claimed {
            record_id,
            operation,
        } => match *operation {
            Operation::Refund(refund) => (record_id, refund),
            other => panic!("a refund claim made {other:?}"),
        },
        other => panic!("expected a claimed refund, got {other:?}"),
    }
}

/// The answer a refused refund stored: what was left to refund.
fn refusal_left(outcome: &ClaimOutcome) -> Option<i64> {
    let ClaimOutcome::Refused(answer) = outcome else {
        return None;
    };
    assert_eq!(answer.status, 400);
    let body: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(body["error"]["code"], "refund_exceeds_charge");
    body["error"]["refundable_amount_cents"].as_i64()
}

/// A finish writes its event in its transaction; a finish that lost its
/// lease writes none; events list newest first, by type and by page.
async fn events_are_written_with_their_change_only(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let mut ids = Vec::new();
    for key in ["ev-1", "ev-2", "ev-3"] {
        let c = claim(key, "cus_events", &body(500));
        let record_id = claimed(&store, &c).await;
        let f = finish(&c, record_id, &c.lease.token, "ch_gw_events");
        assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
        // Finished again, under a lease that is gone: nothing changes, and
        // no second event is written (the first stands, once).
        assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Lost);
        ids.push(charge_of(&c).id.clone());
    }
    let id = event_id(&ids[0], EventType::ChargeSucceeded);
    let event = store.event(&id).await.unwrap().expect("the finish's event");
    assert_eq!(event.event_type, "charge.succeeded");
    assert_eq!(event.object_id, ids[0]);
    let shown: Value = serde_json::from_str(&event.to_json()).unwrap();
    assert_eq!(shown["data"]["object"]["id"], ids[0].as_str());
    assert_eq!(shown["data"]["object"]["status"], "succeeded");
    assert_eq!(shown["data"]["object"]["gateway_charge_id"], "ch_gw_events");
    let now = store.now().await.unwrap();
    assert!(
        (now - event.created).num_seconds().abs() < 60,
        "the database's clock"
    );

    // A claim that is never finished has no event.
    let pending = claim("ev-pending", "cus_events", &body(500));
    claimed(&store, &pending).await;
    let query = |pairs: &[(&str, &str)]| {
        payments_domain::events::EventQuery::parse(&query_pairs(pairs)).unwrap()
    };
    let all = store.list_events(&query(&[])).await.unwrap();
    assert_eq!(all.len(), 3, "one event per finished change: {all:?}");
    let listed: Vec<&str> = all.iter().map(|e| e.object_id.as_str()).collect();
    assert!(!listed.contains(&charge_of(&pending).id.as_str()));
    let page = store.list_events(&query(&[("limit", "1")])).await.unwrap();
    assert_eq!(page.len(), 2, "limit + 1");
    let after = store
        .list_events(&query(&[("limit", "5"), ("starting_after", &page[0].id)]))
        .await
        .unwrap();
    assert_eq!(after.len(), 2);
    assert!(after.iter().all(|e| e.id != page[0].id));
    let failed = store
        .list_events(&query(&[("type", "charge.failed")]))
        .await
        .unwrap();
    assert!(failed.is_empty());
    let later = store
        .list_events(&query(&[(
            "created[gte]",
            &(now.timestamp() + 120).to_string(),
        )]))
        .await
        .unwrap();
    assert!(later.is_empty());
}

/// Dispatch makes one delivery per endpoint that wants the event; two
/// runners never lease the same delivery; a failure is retried, then given
/// up after the window; a re-send makes it pending again; pruning keeps
/// every event with a delivery still to make.
async fn deliveries_are_leased_once_retried_given_up_and_resent(backend: Backend) {
    use payments_domain::store::AttemptRecorded;
    use payments_domain::webhook::{Attempted, DeliveryState, Endpoint};
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let endpoint = |url: &str, types: &[EventType]| Endpoint {
        url: url.to_owned(),
        secrets: vec!["whsec_conformance_secret_0123456789".to_owned()],
        types: types.iter().copied().collect(),
    };
    let endpoints = [
        endpoint("https://all.example/hook", &[]),
        endpoint("https://refunds.example/hook", &[EventType::RefundFailed]),
    ];
    for key in ["dl-1", "dl-2", "dl-3", "dl-4"] {
        let c = claim(key, "cus_deliveries", &body(700));
        let record_id = claimed(&store, &c).await;
        store
            .finish(&finish(&c, record_id, &c.lease.token, "ch_gw"))
            .await
            .unwrap();
    }
    assert_eq!(store.dispatch_events(&endpoints, 100).await.unwrap(), 4);
    assert_eq!(
        store.dispatch_events(&endpoints, 100).await.unwrap(),
        0,
        "dispatched once"
    );

    // Two runners at once: every delivery leased by one of them.
    let lease = || NewLease::new(secs(30));
    let runner = |i: usize| {
        let store = db.racer(i);
        tokio::spawn(async move { store.claim_deliveries(&NewLease::new(secs(30)), 3).await })
    };
    let (a, b) = (runner(0), runner(1));
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    // On Galera `SKIP LOCKED` holds on one node only: two runners on two
    // nodes can select the same rows, and the one whose leases found them
    // taken comes back short (never with another's). The next claim takes
    // what it left. Elsewhere the two leave nothing.
    let rest = store.claim_deliveries(&lease(), 10).await.unwrap();
    if backend != Backend::Galera {
        assert!(
            rest.is_empty(),
            "two runners at once lease every one: {rest:?}"
        );
    }
    let mut leased: Vec<String> = a
        .iter()
        .chain(&b)
        .chain(&rest)
        .map(|d| d.id.clone())
        .collect();
    leased.sort();
    leased.dedup();
    assert_eq!(
        leased.len(),
        4,
        "4 deliveries (the refunds endpoint wants none): {a:?} {b:?} {rest:?}"
    );
    assert_eq!(a.len() + b.len() + rest.len(), 4, "none leased twice");
    assert!(
        a.iter()
            .chain(&b)
            .chain(&rest)
            .all(|d| d.endpoint == "https://all.example/hook")
    );
    assert!(
        store
            .claim_deliveries(&lease(), 10)
            .await
            .unwrap()
            .is_empty(),
        "all leased"
    );

    let deliveries: Vec<_> = a.into_iter().chain(b).chain(rest).collect();
    let token = |d: &payments_domain::webhook::Delivery| d.lease_token.clone().unwrap();
    let failed = |retry_in: Duration, give_up_after: Duration| Attempted::Failed {
        status: Some(500),
        error: "answered 500".to_owned(),
        retry_in,
        give_up_after,
    };
    let delivered = Attempted::Delivered { status: 200 };
    let (d0, d1, d2) = (&deliveries[0], &deliveries[1], &deliveries[2]);
    assert_eq!(
        store
            .attempted(&d0.id, &token(d0), &delivered)
            .await
            .unwrap(),
        AttemptRecorded::Delivered
    );
    assert_eq!(
        store
            .attempted(&d0.id, &token(d0), &delivered)
            .await
            .unwrap(),
        AttemptRecorded::Lost
    );
    let day = secs(86_400);
    assert_eq!(
        store
            .attempted(&d1.id, &token(d1), &failed(secs(0), day))
            .await
            .unwrap(),
        AttemptRecorded::Retrying
    );
    // Retried at once (no backoff here): due again, attempts counted.
    let again = store.claim_deliveries(&lease(), 10).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].id.as_str(), again[0].attempts),
        (d1.id.as_str(), 1)
    );
    // Older than its window: given up.
    db.age_outbox(secs(2 * 86_400)).await;
    assert_eq!(
        store
            .attempted(&again[0].id, &token(&again[0]), &failed(secs(60), day))
            .await
            .unwrap(),
        AttemptRecorded::GaveUp
    );
    let failed_list = store.deliveries(DeliveryState::Failed, 10).await.unwrap();
    assert_eq!(failed_list.len(), 1);
    assert_eq!(failed_list[0].last_status, Some(500));
    assert_eq!(failed_list[0].attempts, 2);

    // Pruning with a retention of one day: the delivered event goes; the
    // failed one, the leased ones and the ones retrying stay.
    let before = store.list_events(&events_page()).await.unwrap().len();
    let pruned = store.prune_events(day, 100).await.unwrap();
    assert_eq!((pruned.events, pruned.deliveries), (1, 1));
    let left = store.list_events(&events_page()).await.unwrap();
    assert_eq!(left.len(), before - 1);
    assert!(left.iter().all(|e| e.id != d0.event.id));
    assert!(store.oldest_undelivered().await.unwrap().unwrap() >= day);

    // A re-send of every failed delivery: pending from now, attempts reset.
    assert_eq!(store.resend(None, &endpoints).await.unwrap(), 1);
    assert!(
        store
            .deliveries(DeliveryState::Failed, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let resent = store.claim_deliveries(&lease(), 10).await.unwrap();
    assert!(
        resent.iter().any(|d| d.id == d1.id && d.attempts == 0),
        "{resent:?}"
    );
    // One event re-sent by id, to an endpoint it had no delivery to as well.
    let wider = [
        endpoint("https://all.example/hook", &[]),
        endpoint("https://late.example/hook", &[]),
    ];
    assert_eq!(
        store.resend(Some(&d2.event.id), &wider).await.unwrap(),
        1,
        "d2 is leased: only the new one"
    );
    assert_eq!(
        store
            .resend(Some("evt_00000000000000000000000000000000"), &wider)
            .await
            .unwrap(),
        0
    );
}

fn events_page() -> payments_domain::events::EventQuery {
    payments_domain::events::EventQuery::parse(&query_pairs(&[("limit", "100")])).unwrap()
}

/// A refund's outcome at the provider (its provider id `re_p_` and ours:
/// provider refund ids are unique here), failed with `failure` when
/// `status` is failed.
fn refund_outcome(refund: &Refund, status: ChargeStatus, failure: &str) -> Outcome {
    Outcome::Refund(RefundOutcome {
        refund_id: refund.id.clone(),
        charge_id: refund.charge_id.clone(),
        amount_cents: refund.amount_cents,
        status,
        gateway_refund_id: Some(format!("re_p_{}", refund.id)),
        failure_code: (status == ChargeStatus::Failed).then(|| failure.to_owned()),
    })
}

/// Finishes a claimed refund with `status`.
fn refund_finish(record_id: RecordId, c: &Claim, refund: &Refund, status: ChargeStatus) -> Finish {
    let outcome = refund_outcome(refund, status, "declined");
    Finish {
        record_id,
        lease_token: c.lease.token.clone(),
        state: RecordState::Complete,
        event: NewEvent::of(&Operation::Refund(refund.clone()), &outcome),
        outcome,
        response: StoredResponse {
            status: 201,
            body: refund.to_json(),
            content_type: JSON.to_owned(),
            location: Some(refund.location()),
        },
    }
}

/// Twenty refunds of 30% race on one charge with distinct keys: the
/// reservation, a conditional update in each claim's transaction, lets
/// exactly three in; the other seventeen are refused with what is left
/// (10%), stored, and replayed to their retries.
async fn concurrent_refunds_never_exceed_the_charge(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    // Three rounds, so a check-then-act store would be caught by the
    // interleaving it needs in at least one of them.
    for round in 0..3 {
        let charge = succeeded_charge(&store, &format!("refund-race-charge-{round}"), 1000).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(20));
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let (store, barrier) = (db.racer(i), barrier.clone());
                let c = refund_claim(&format!("refund-race-{round}-{i}"), &charge, Some(300));
                tokio::spawn(async move {
                    barrier.wait().await;
                    (store.claim(&c).await.unwrap(), c)
                })
            })
            .collect();
        let (mut made, mut refused) = (Vec::new(), 0);
        for t in tasks {
            let (outcome, c) = t.await.unwrap();
            match refusal_left(&outcome) {
                Some(left) => {
                    assert_eq!(left, 100, "what is left after three refunds of 300");
                    refused += 1;
                    // The refusal is the key's final answer.
                    let again = existing(store.claim(&c).await.unwrap());
                    assert_eq!(again.state, RecordState::Complete);
                    assert_eq!(again.response.as_ref().map(|r| r.status), Some(400));
                    assert_eq!(again.refund_id, None, "a refused refund made no refund");
                }
                None => made.push(claimed_refund(outcome)),
            }
        }
        assert_eq!((made.len(), refused), (3, 17));
        for (_, refund) in &made {
            assert_eq!(refund.amount_cents, 300);
            let stored = store.refund(&refund.id).await.unwrap().unwrap();
            assert_eq!(&stored, refund, "the claim returns the refund as stored");
            assert_eq!(stored.gateway_charge_id.as_deref(), Some("ch_provider"));
        }
    }
    assert_eq!(db.refunds_with_status("").await, 9);
    assert_eq!(db.refunds_with_status("pending").await, 9);
}

/// A refund's outcome moves its charge: a success adds to
/// `amount_refunded`, a failure gives its reservation back (so a new refund
/// fits again), an unknown one keeps it; a default amount takes what is
/// left, and nothing once nothing is.
async fn refund_outcomes_move_the_reservation(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let charge = succeeded_charge(&store, "refund-life-charge", 1000).await;
    let refund = |key: &str, amount| {
        let (store, c) = (store.clone(), refund_claim(key, &charge, amount));
        async move {
            let outcome = store.claim(&c).await.unwrap();
            (outcome, c)
        }
    };
    // 400 succeeds.
    let (outcome, c) = refund("r-ok", Some(400)).await;
    let (record_id, ok) = claimed_refund(outcome);
    let f = refund_finish(record_id, &c, &ok, ChargeStatus::Succeeded);
    assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
    let read = store.charge(&charge.id).await.unwrap().unwrap();
    assert_eq!(read.amount_refunded, 400);
    assert_eq!(read.status, ChargeStatus::Succeeded);
    assert_eq!(
        store.refund(&ok.id).await.unwrap().unwrap().status,
        ChargeStatus::Succeeded
    );
    // The rest (600, by default) fails: its reservation comes back.
    let (outcome, c) = refund("r-fail", None).await;
    let (record_id, failed) = claimed_refund(outcome);
    assert_eq!(
        failed.amount_cents, 600,
        "a default refund takes what is left"
    );
    let (outcome, _) = refund("r-none-left", Some(1)).await;
    assert_eq!(refusal_left(&outcome), Some(0));
    let f = refund_finish(record_id, &c, &failed, ChargeStatus::Failed);
    assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
    let read = store.refund(&failed.id).await.unwrap().unwrap();
    assert_eq!(
        (read.status, read.failure_code.as_deref()),
        (ChargeStatus::Failed, Some("declined"))
    );
    // Abandoned (unknown): the 600 stay reserved.
    let (outcome, c) = refund("r-unknown", None).await;
    let (record_id, unknown) = claimed_refund(outcome);
    assert_eq!(unknown.amount_cents, 600);
    let mut f = refund_finish(record_id, &c, &unknown, ChargeStatus::Unknown);
    f.state = RecordState::Abandoned;
    assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
    let (outcome, _) = refund("r-after-unknown", None).await;
    assert_eq!(
        refusal_left(&outcome),
        Some(0),
        "an unknown refund keeps its reservation"
    );
    let read = store.charge(&charge.id).await.unwrap().unwrap();
    assert_eq!(
        read.amount_refunded, 400,
        "only succeeded refunds count as refunded"
    );
    // The same key on the charge route and on the refund route: two
    // independent operations.
    let on_charges = claim("r-ok", "cus_1", &body(100));
    assert!(matches!(
        store.claim(&on_charges).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

/// The ids of `unsettled`'s charges and refunds, in its order.
async fn unsettled_ids(store: &Arc<dyn Store>, limit: u32) -> (Vec<String>, Vec<String>) {
    let (mut charges, mut refunds) = (Vec::new(), Vec::new());
    for u in store.unsettled(secs(60), limit).await.unwrap() {
        match u.operation {
            Operation::Charge(c) => charges.push(c.id),
            Operation::Refund(r) => refunds.push(r.id),
            Operation::Capture(c) => panic!("a capture unsettled: {c:?}"),
        }
    }
    (charges, refunds)
}

/// A charge abandoned with its outcome unknown: its id.
async fn unknown_charge(store: &Arc<dyn Store>, key: &str) -> String {
    let c = claim(key, "cus_1", &body(100));
    let record_id = claimed(store, &c).await;
    let mut f = finish(&c, record_id, &c.lease.token, "unused");
    f.state = RecordState::Abandoned;
    if let Outcome::Charge(o) = &mut f.outcome {
        (o.status, o.gateway_charge_id) = (ChargeStatus::Unknown, None);
    }
    assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
    charge_of(&c).id.clone()
}

/// `unsettled` reads unknown charges and refunds, and refunds pending at
/// the provider (finished `pending` with its id), never one still in
/// progress; at most `limit` of each, least recently looked at first: an
/// operation stamped by `looked_at` goes behind every other.
async fn unsettled_reads_the_least_recently_looked_at_first(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let mut charges = Vec::new();
    for i in 0..3 {
        charges.push(unknown_charge(&store, &format!("unsettled-{i}")).await);
    }
    let (first_two, _) = unsettled_ids(&store, 2).await;
    assert_eq!(first_two, charges[..2]);
    let looked = |id: &String| {
        let store = store.clone();
        let id = id.clone();
        async move {
            let charge = store.charge(&id).await.unwrap().unwrap();
            store.looked_at(&Operation::Charge(charge)).await.unwrap();
        }
    };
    looked(&charges[0]).await;
    assert_eq!(unsettled_ids(&store, 2).await.0, charges[1..]);
    looked(&charges[1]).await;
    looked(&charges[2]).await;
    assert_eq!(
        unsettled_ids(&store, 3).await.0,
        charges,
        "looked at longest ago first"
    );
    let unchanged = store.charge(&charges[0]).await.unwrap().unwrap();
    assert_eq!(
        unchanged.status,
        ChargeStatus::Unknown,
        "looking changes nothing else"
    );

    let charge = succeeded_charge(&store, "unsettled-refunded", 1000).await;
    let claim_refund = |key: &str| {
        let (store, c) = (store.clone(), refund_claim(key, &charge, Some(100)));
        async move {
            let (record_id, refund) = claimed_refund(store.claim(&c).await.unwrap());
            (record_id, refund, c)
        }
    };
    let (record_id, unknown, c) = claim_refund("unsettled-r-unknown").await;
    let mut f = refund_finish(record_id, &c, &unknown, ChargeStatus::Unknown);
    f.state = RecordState::Abandoned;
    assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
    let (record_id, pending, c) = claim_refund("unsettled-r-pending").await;
    let f = refund_finish(record_id, &c, &pending, ChargeStatus::Pending);
    assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
    let (_, in_progress, _) = claim_refund("unsettled-r-in-progress").await;
    let (_, refunds) = unsettled_ids(&store, 10).await;
    assert_eq!(refunds, [unknown.id.clone(), pending.id.clone()]);
    assert!(
        !refunds.contains(&in_progress.id),
        "in progress: the reaper's"
    );
    store
        .looked_at(&Operation::Refund(unknown.clone()))
        .await
        .unwrap();
    assert_eq!(unsettled_ids(&store, 1).await.1, [pending.id]);
}

/// Reconciliation settles a refund pending at the provider like an
/// unknown one (a success adds to `amount_refunded`, a failure gives its
/// reservation back) but leaves its complete record's stored 201 as it
/// was; only once.
async fn reconcile_settles_a_refund_pending_at_the_provider(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let charge = succeeded_charge(&store, "pending-refunded", 1000).await;
    let mut finished = Vec::new();
    for key in ["pending-ok", "pending-canceled"] {
        let c = refund_claim(key, &charge, Some(400));
        let (record_id, refund) = claimed_refund(store.claim(&c).await.unwrap());
        let f = refund_finish(record_id, &c, &refund, ChargeStatus::Pending);
        assert_eq!(store.finish(&f).await.unwrap(), FinishOutcome::Finished);
        finished.push((c, refund, f.response));
    }
    let left = store
        .claim(&refund_claim("pending-over", &charge, Some(201)))
        .await;
    assert_eq!(
        refusal_left(&left.unwrap()),
        Some(200),
        "pending refunds stay reserved"
    );
    let answer = StoredResponse {
        status: 201,
        body: "{\"settled\":true}".to_owned(),
        content_type: JSON.to_owned(),
        location: None,
    };
    for ((c, refund, stored), status) in finished
        .iter()
        .zip([ChargeStatus::Succeeded, ChargeStatus::Failed])
    {
        let outcome = refund_outcome(refund, status, "canceled");
        let event = NewEvent::of(&Operation::Refund(refund.clone()), &outcome);
        let event = event.as_ref();
        assert!(
            store
                .reconcile(&outcome, event, &answer, TTL)
                .await
                .unwrap()
        );
        assert!(
            !store
                .reconcile(&outcome, event, &answer, TTL)
                .await
                .unwrap(),
            "settled once"
        );
        let written = store.event(&event.unwrap().id).await.unwrap();
        assert!(written.is_some(), "the reconciliation's event");
        let read = store.refund(&refund.id).await.unwrap().unwrap();
        assert_eq!(read.status, status);
        let record = existing(store.claim(c).await.unwrap());
        assert_eq!(record.state, RecordState::Complete);
        assert_eq!(
            record.response.as_ref(),
            Some(stored),
            "the stored 201 stays"
        );
    }
    let read = store.charge(&charge.id).await.unwrap().unwrap();
    assert_eq!(read.amount_refunded, 400);
    let left = store
        .claim(&refund_claim("pending-rest", &charge, Some(601)))
        .await;
    assert_eq!(
        refusal_left(&left.unwrap()),
        Some(600),
        "the canceled 400 came back"
    );
    assert_eq!(unsettled_ids(&store, 10).await, (vec![], vec![]));
}

/// On PostgreSQL with 100,000 charges for one customer (and others'
/// around them), after `ANALYZE`: the first page and a deep page of
/// `GET /api/charges` are each one index range scan of
/// `charges_customer_created`, with no sort, reading at most `limit + 1`
/// rows. The plan is PostgreSQL's own (`EXPLAIN ANALYZE`) of the store's
/// statement with the values bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_page_is_one_index_range_scan_on_postgres() {
    let Some(db) = TestDb::new(Backend::Postgres, 4).await else {
        return;
    };
    let seed = |customer: &str, n: u32| {
        format!(
            "INSERT INTO charges (id, customer_id, amount_cents, currency, card_token, metadata, \
             status, provider_key, created_at, updated_at) \
             SELECT '{customer}_' || lpad(g::text, 7, '0'), '{customer}', 100, 'GBP', 'tok_visa', \
             jsonb_build_object('order_id', 'o-' || g), 'succeeded', '{customer}_pk_' || g, \
             timestamptz '2026-01-01' + g * interval '1 second', timestamptz '2026-01-01' \
             FROM generate_series(1, {n}) g"
        )
    };
    for (customer, n) in [
        ("cus_big", 100_000),
        ("cus_before", 5_000),
        ("cus_zafter", 5_000),
    ] {
        assert_eq!(db.execute("", &seed(customer, n), "").await, u64::from(n));
    }
    db.execute("", "ANALYZE charges", "").await;
    let pg = db.postgres().expect("a PostgreSQL store");
    let customer = CustomerId::parse("cus_big").unwrap();
    let pairs = |q: &[(&str, &str)]| -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let queries = [
        pairs(&[]),
        pairs(&[("limit", "100")]),
        pairs(&[("starting_after", "cus_big_0050000")]),
        pairs(&[("ending_before", "cus_big_0000100"), ("limit", "10")]),
    ];
    // One customer's list, and the back office's list of everyone's.
    let lists = [
        (Some(&customer), "charges_customer_created"),
        (None, "charges_created"),
    ];
    for ((owner, index), query) in lists
        .into_iter()
        .flat_map(|list| queries.iter().map(move |q| (list, q)))
    {
        let query = payments_domain::list::ChargeQuery::parse(query).unwrap();
        let plan = pg.explain_list_charges(owner, &query).await.unwrap();
        let text = plan.join("\n");
        let scans: Vec<&String> = plan.iter().filter(|l| l.contains("Index Scan")).collect();
        assert!(
            scans.iter().any(|l| l.contains(&format!("{index} "))),
            "an index scan of {index}:\n{text}"
        );
        assert!(!text.contains("Sort"), "no sort:\n{text}");
        assert!(!text.contains("Seq Scan"), "no sequential scan:\n{text}");
        let main = scans
            .iter()
            .find(|l| l.contains(&format!("{index} ")))
            .unwrap();
        let actual = main.split("actual").nth(1).unwrap();
        let rows: u64 = actual
            .split("rows=")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let limit = u64::from(query.page.limit);
        assert!(
            rows <= limit + 1,
            "{rows} rows read for a page of {limit}:\n{text}"
        );
    }
}

/// A customer id compares byte for byte on every backend: `cus_victim `
/// (a trailing space, which MariaDB's `utf8mb4_bin`, a PAD SPACE
/// collation, compared equal to `cus_victim`) is another customer, who sees
/// none of `cus_victim`'s charges, by no filter. The store is asked
/// directly: authentication refuses such an id before it reaches a store.
/// Ids are read back exactly as written, trailing spaces included.
async fn customer_ids_compare_exactly(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let order = json!({"amount_cents": 100, "currency": "GBP", "card_token": "tok_visa",
        "metadata": {"order": "42"}});
    let mut victim_claim = claim("victim-key", "cus_victim", &order);
    if let Operation::Charge(charge) = &mut victim_claim.operation {
        // As the service stores it, for `?idempotency_key=`.
        charge.idempotency_key = Some("victim-key".to_owned());
    }
    claimed(&store, &victim_claim).await;
    let query =
        |q: &[(&str, &str)]| payments_domain::list::ChargeQuery::parse(&query_pairs(q)).unwrap();
    let filters = [
        query(&[]),
        query(&[("idempotency_key", "victim-key")]),
        query(&[("metadata[order]", "42")]),
        query(&[("status", "pending")]),
    ];
    let victim = CustomerId::parse("cus_victim").unwrap();
    for filter in &filters {
        let own = store.list_charges(Some(&victim), filter).await.unwrap();
        assert_eq!(own.len(), 1, "the owner sees its charge: {filter:?}");
    }
    for other in ["cus_victim ", "cus_victim   ", "CUS_VICTIM"] {
        let other = CustomerId::unvalidated_for_tests(other);
        for filter in &filters {
            let seen = store.list_charges(Some(&other), filter).await.unwrap();
            assert!(
                seen.is_empty(),
                "{other:?} sees {:?} of cus_victim's charges with {filter:?}: {seen:?}",
                seen.len()
            );
        }
    }
    // A padded id is kept as written, and sees only its own.
    let padded = CustomerId::unvalidated_for_tests("cus_padded ");
    let request = ChargeRequest::from_json(&body(200), 1_000_000).unwrap();
    let mut padded_claim = claim("padded-key", "cus_padded", &body(200));
    padded_claim.customer = padded.clone();
    padded_claim.operation = Operation::Charge(Charge::pending(&padded, &request));
    claimed(&store, &padded_claim).await;
    let charge = store
        .charge(&charge_of(&padded_claim).id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(charge.customer_id, "cus_padded ");
    let record = store
        .record_by_key(&padded_claim.key, CHARGES_ROUTE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.customer_id, "cus_padded ");
    let listed = store
        .list_charges(Some(&padded), &query(&[]))
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|c| &c.id).collect::<Vec<_>>(),
        [&charge.id]
    );
    // Everyone's list (the back office's) has both, newest first.
    let everyone = store.list_charges(None, &query(&[])).await.unwrap();
    assert_eq!(
        everyone.iter().map(|c| &c.customer_id).collect::<Vec<_>>(),
        ["cus_padded ", "cus_victim"]
    );
    let unpadded = CustomerId::parse("cus_padded").unwrap();
    assert!(
        store
            .list_charges(Some(&unpadded), &query(&[]))
            .await
            .unwrap()
            .is_empty()
    );
}

backend_tests!(
    all;
    customer_ids_compare_exactly,
    acknowledged_writes_are_read_at_once_everywhere,
    known_keys_are_answered_from_their_record,
    concurrent_claims_have_one_winner,
    concurrent_finishers_have_one_winner,
    takeover_only_after_expiry_and_only_once,
    expired_records_are_leased_by_one_reaper_each,
    records_past_the_key_retention_are_never_taken_to_redrive,
    released_lease_is_taken_over_at_once,
    deadlines_are_computed_by_the_database,
    expired_record_is_reclaimed_once,
    prune_deletes_only_expired_final_answers,
    existing_records_carry_owner_and_fingerprint,
    keys_are_scoped_per_route,
    charges_round_trip,
    concurrent_refunds_never_exceed_the_charge,
    refund_outcomes_move_the_reservation,
    unsettled_reads_the_least_recently_looked_at_first,
    reconcile_settles_a_refund_pending_at_the_provider,
    events_are_written_with_their_change_only,
    deliveries_are_leased_once_retried_given_up_and_resent,
);

/// SQLite's group commit: concurrent claims and finishes share commits,
/// and a write that fails inside a batch is rolled back alone. One finish
/// among 40 names a charge that does not exist (its record's update
/// succeeds, then the invariant check fails): its record is still in
/// progress afterwards, while the 39 others, committed in the same
/// batches, are finished with their charges settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_batches_roll_back_a_failing_write_alone() {
    let Some(db) = db(Backend::Sqlite).await else {
        return;
    };
    let sqlite = db.sqlite().expect("a SQLite store");
    let store = db.store();
    let before = sqlite.write_batches().expect("SQLite batches its writes");
    let claims: Vec<Claim> = (0..40)
        .map(|i| claim(&format!("batch-{i}"), "cus_batch", &body(100 + i)))
        .collect();
    let claiming: Vec<_> = claims
        .iter()
        .map(|c| {
            let (store, c) = (store.clone(), c.clone());
            tokio::spawn(async move { claimed(&store, &c).await })
        })
        .collect();
    let mut records = Vec::new();
    for task in claiming {
        records.push(task.await.unwrap());
    }
    let bad = 17;
    let finishing = claims.iter().zip(&records).enumerate().map(|(i, (c, id))| {
        let store = store.clone();
        let mut f = finish(c, *id, &c.lease.token, &format!("ch_batch_{i}"));
        if i == bad {
            let Outcome::Charge(outcome) = &mut f.outcome else {
                unreachable!()
            };
            outcome.charge_id = "ch_does_not_exist".into();
        }
        tokio::spawn(async move { store.finish(&f).await })
    });
    let finishing: Vec<_> = finishing.collect();
    let mut finished = Vec::new();
    for task in finishing {
        finished.push(task.await.unwrap());
    }

    for (i, outcome) in finished.iter().enumerate() {
        if i == bad {
            assert!(
                matches!(outcome, Err(StoreError::Invariant(_))),
                "{outcome:?}"
            );
        } else {
            assert_eq!(
                outcome.as_ref().ok(),
                Some(&FinishOutcome::Finished),
                "finish {i}"
            );
        }
    }
    let failed = store.record(records[bad]).await.unwrap().unwrap();
    assert_eq!(
        failed.state,
        RecordState::InProgress,
        "the failing finish rolled back"
    );
    assert!(failed.response.is_none());
    assert_eq!(db.charges_with_status("succeeded").await, 39);
    assert_eq!(db.charges_with_status("pending").await, 1);
    let (batches, writes) = sqlite.write_batches().unwrap();
    let (batches, writes) = (batches - before.0, writes - before.1);
    assert!(
        writes > batches,
        "some commit carried more than one write: {writes} in {batches} commits"
    );
}
