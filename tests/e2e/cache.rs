//! Replays from memory: a copy of a completed answer serves retries with no
//! database round trip, and never outlives its record.

use std::time::Duration;

use payments_tests::{Backend, Process, TestDb, backend_tests, charge_body, new_key};
use serde_json::Value;

use super::{api_env, mint, post};

/// The TTL of these tests' keys: a copy lives this less the one-minute
/// margin, about 5 s.
const TTL_SECS: u64 = 65;

/// `payments_replay_cache_total{result="hit"}` on a replica.
async fn hits(api: &Process) -> u64 {
    crate::metric_sum(api, "payments_replay_cache_total{", r#"result="hit""#).await as u64
}

async fn answer(response: reqwest::Response) -> (u16, bool, Value) {
    let status = response.status().as_u16();
    let replay = response.headers().contains_key("idempotent-replay");
    (status, replay, response.json().await.unwrap())
}

/// Two replicas on one database. A retry on replica B is read from the
/// database once, then answered from B's memory (a hit, the same bytes).
/// Once the record has expired by the database's clock and the key has
/// been reclaimed on replica A with another body, B answers the new
/// operation, never its old copy: the copy's lifetime was the record's
/// remaining TTL less a minute.
async fn replays_come_from_memory_until_their_record_expires(backend: Backend) {
    let Some(db) = TestDb::new(backend, 2).await else {
        return;
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let ttl = format!("{TTL_SECS}s");
    let env = api_env(
        &db,
        &sandbox,
        &[
            ("IDEMPOTENCY_TTL", ttl.as_str()),
            ("ALLOW_SHORT_TTL", "true"),
        ],
    );
    let (a, b) = (
        Process::start("payments-api", &[], &env).await,
        Process::start("payments-api", &[], &env).await,
    );
    let token = mint("cus_cache").await;
    let key = new_key();
    let (first_body, second_body) = (charge_body(4900, "tok_visa"), charge_body(5100, "tok_visa"));

    let (status, replay, first) = answer(post(&a, &token, &key, &first_body).await).await;
    assert_eq!((status, replay), (201, false));
    let before = hits(&b).await;
    let (status, replay, read) = answer(post(&b, &token, &key, &first_body).await).await;
    assert_eq!(
        (status, replay, &read),
        (201, true, &first),
        "read from the database"
    );
    assert_eq!(hits(&b).await, before, "the first retry on B is not a hit");
    let (status, replay, remembered) = answer(post(&b, &token, &key, &first_body).await).await;
    assert_eq!((status, replay, &remembered), (201, true, &first));
    assert_eq!(
        hits(&b).await,
        before + 1,
        "the second retry on B is answered from memory"
    );
    // The owner and fingerprint checks run on the copy too.
    let (status, _, reused) = answer(post(&b, &token, &key, &second_body).await).await;
    assert_eq!(status, 422, "{reused}");

    // Past the record's expiry by the database's clock (plus a second).
    tokio::time::sleep(Duration::from_secs(TTL_SECS + 1)).await;
    let (status, replay, second) = answer(post(&a, &token, &key, &second_body).await).await;
    assert_eq!(
        (status, replay),
        (201, false),
        "the expired key is reclaimed: {second}"
    );
    assert_ne!(second["id"], first["id"]);
    let (status, replay, now) = answer(post(&b, &token, &key, &second_body).await).await;
    assert_eq!(
        (status, replay, &now),
        (201, true, &second),
        "B answers the new operation"
    );
    let (status, _, old) = answer(post(&b, &token, &key, &first_body).await).await;
    assert_eq!(status, 422, "the old body is another request now: {old}");
}

backend_tests!(replays_come_from_memory_until_their_record_expires);
