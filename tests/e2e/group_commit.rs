//! SQLite's group commit, killed: `payments-api` SIGKILLed while batches of
//! more than one claim or finish are being committed. Every request
//! answered before the kill is on disk afterwards, and each request's
//! writes are all there or all absent: a record with its charge, a finished
//! record with its settled charge, never half of either.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use payments_api::config::DEV_JWT_SECRET;
use payments_tests::{Backend, Process, TestDb, charge_body};
use serde_json::Value;
use sqlx::Row;
use tokio::sync::Mutex;

/// Clients sending charges at once: enough to queue several behind a commit.
const CLIENTS: usize = 48;
/// Bound on each client's requests, whatever happens to the kill.
const PER_CLIENT: usize = 400;

/// A record as found after the kill: its state and stored status, its
/// charge's id and status.
type OnDisk = (String, Option<i64>, Option<String>, Option<String>);

/// From `/metrics`: batches committed, and those that carried one caller.
fn batches(metrics: &str) -> Option<(u64, u64)> {
    let value = |prefix: &str| {
        let line = metrics.lines().find(|l| l.starts_with(prefix))?;
        line.rsplit(' ')
            .next()?
            .parse::<f64>()
            .ok()
            .map(|v| v as u64)
    };
    let count = value("payments_sqlite_write_batch_size_count")?;
    let single = value("payments_sqlite_write_batch_size_bucket{le=\"1\"}")?;
    Some((count, single))
}

#[tokio::test]
async fn a_kill_9_mid_batch_loses_no_answered_charge_and_splits_no_request() {
    let Some(db) = TestDb::new(Backend::Sqlite, 1).await else {
        return;
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let extra = [("SQLITE_WRITE_BATCH", "64"), ("RUST_LOG", "warn")];
    let env = super::api_env(&db, &sandbox, &extra);
    let mut api = Process::start("payments-api", &[], &env).await;
    let token =
        payments_api::auth::mint_hs256(DEV_JWT_SECRET, "cus_batch", Duration::from_secs(600))
            .expect("a token");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    // Every 201 a client got: its key and charge id.
    let answered: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (client, url, token) = (client.clone(), api.url.clone(), token.clone());
        let (answered, stop) = (answered.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut cut = 0;
            for _ in 0..PER_CLIENT {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let key = uuid::Uuid::new_v4().to_string();
                let sent = client
                    .post(format!("{url}/api/charges"))
                    .bearer_auth(&token)
                    .header("Idempotency-Key", &key)
                    .header("Content-Type", "application/json")
                    .body(charge_body(100, "tok_visa"))
                    .send()
                    .await;
                let Ok(response) = sent else {
                    cut += 1;
                    continue;
                };
                if response.status() != 201 {
                    continue;
                }
                // A 201 whose body was cut by the kill was not answered.
                if let Ok(charge) = response.json::<Value>().await {
                    let id = charge["id"].as_str().unwrap().to_owned();
                    answered.lock().await.insert(key, id);
                }
            }
            cut
        }));
    }

    // Kill once batches of more than one are being committed: the last
    // two scrapes, the second taken just before the kill, both show more.
    let mut multi = Vec::new();
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let text = client.get(format!("{}/metrics", api.url)).send().await;
        let text = text.unwrap().text().await.unwrap();
        if let Some((count, single)) = batches(&text) {
            multi.push(count - single);
        }
        let grew = multi.len() >= 2 && multi[multi.len() - 1] > multi[multi.len() - 2];
        if grew && answered.lock().await.len() >= 300 {
            break;
        }
    }
    // Clients send nothing new; what they sent is in flight, and cut.
    stop.store(true, Ordering::Relaxed);
    api.kill().await;
    let mut cut = 0;
    for client in clients {
        cut += client.await.unwrap();
    }
    let answered = answered.lock().await.clone();
    let n = multi.len();
    assert!(
        n >= 2 && multi[n - 1] > multi[n - 2],
        "batches of more than one were committed right up to the kill: {multi:?}"
    );
    assert!(
        cut >= 2,
        "requests were in flight when the process died: {cut} cut"
    );
    assert!(answered.len() >= 300, "{} answered", answered.len());

    let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(check, "ok");
    // Every answered charge: its record complete with the 201, its charge
    // settled.
    let rows = sqlx::query(
        "SELECT r.idempotency_key, r.state, r.response_status, c.id, c.status \
         FROM idempotent_requests r LEFT JOIN charges c ON c.id = r.charge_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let on_disk: HashMap<String, OnDisk> = rows
        .iter()
        .map(|r| {
            let key: String = r.get(0);
            (key, (r.get(1), r.get(2), r.get(3), r.get(4)))
        })
        .collect();
    for (key, charge) in &answered {
        let found = on_disk.get(key);
        let expected = (
            "complete".to_owned(),
            Some(201),
            Some(charge.clone()),
            Some("succeeded".to_owned()),
        );
        assert_eq!(found, Some(&expected), "answered key {key}");
    }
    // Every request, answered or not: both of its claim's rows or neither,
    // and a record is complete exactly when its charge is settled.
    for (key, (state, status, charge, charge_status)) in &on_disk {
        assert!(charge.is_some(), "record {key} without its charge");
        let settled = charge_status.as_deref() != Some("pending");
        let complete = state == "complete";
        assert_eq!(
            complete, settled,
            "record {key}: {state} {status:?}, charge {charge_status:?}"
        );
    }
    let orphans: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM charges c WHERE NOT EXISTS \
         (SELECT 1 FROM idempotent_requests r WHERE r.charge_id = c.id)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(orphans, 0, "charges without their record");
    let in_progress = on_disk.values().filter(|v| v.0 == "in_progress").count();
    eprintln!(
        "group commit kill: {} answered, {} on disk ({in_progress} in progress), {cut} cut, \
         multi-caller batches {multi:?}",
        answered.len(),
        on_disk.len()
    );
    pool.close().await;

    // The database opens again and answers a retry of an answered key.
    let api = Process::start("payments-api", &[], &env).await;
    let (key, charge) = answered.iter().next().unwrap();
    let replay = api
        .post_charge(&token, key, &charge_body(100, "tok_visa"))
        .await
        .unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replay"], "true");
    let body: Value = replay.json().await.unwrap();
    assert_eq!(body["id"].as_str(), Some(charge.as_str()));
}
