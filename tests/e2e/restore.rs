//! A database put back from a copy taken before the payments, as a
//! point-in-time restore or a promoted asynchronous replica leaves it,
//! with the real binaries: SQLite's files (the database, `-wal` and `-shm`
//! together, the server stopped), PostgreSQL's database recreated from a
//! template copy, MariaDB's `mariadb-dump` loaded back. Between the copy
//! and the restore: a charge answered 201, a charge whose answer was
//! dropped (503), a refund, and ten charges at once. The clients retry
//! with their keys against the restored server: each gets its first
//! operation back (the same ids), and the provider made each once.

use payments_tests::{Backend, Process, TestDb, backend_tests, charge_body, run_binary};
use serde_json::{Value, json};

use crate::{api_env, mint, mint_back_office, post, sandbox_json};

/// The API on `db`, after its migrations.
async fn api(db: &TestDb, sandbox: &Process) -> Process {
    Process::start("payments-api", &[], &api_env(db, sandbox, &[])).await
}

fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `POST /api/charges/{charge}/refunds` with `key`: status and body.
async fn refund(api: &Process, token: &str, charge: &str, key: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/api/charges/{charge}/refunds", api.url))
        .bearer_auth(token)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A charge's status and body.
async fn charge(api: &Process, token: &str, key: &str, body: &str) -> (u16, Value) {
    let response = post(api, token, key, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Ten charges with distinct keys at once.
async fn ten_at_once(api: &Process, token: &str, keys: &[String]) -> Vec<(u16, Value)> {
    let tasks: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let (url, token, key) = (api.url.clone(), token.to_owned(), key.clone());
            tokio::spawn(async move {
                let response = reqwest::Client::new()
                    .post(format!("{url}/api/charges"))
                    .bearer_auth(token)
                    .header("idempotency-key", key)
                    .header("content-type", "application/json")
                    .body(charge_body(200 + i as i64, "tok_visa"))
                    .send()
                    .await
                    .unwrap();
                let status = response.status().as_u16();
                (status, response.json().await.unwrap_or(Value::Null))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

async fn a_restored_database_makes_every_operation_once(backend: Backend) {
    let Some(db) = TestDb::new(backend, 1).await else {
        return;
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let (ok, _, stderr) =
        run_binary("payments-api", &["migrate"], &[("DATABASE_URL", &db.url)]).await;
    assert!(ok, "migrate failed: {stderr}");
    let token = mint("cus_restore").await;
    let office = mint_back_office("ops_restore").await;

    // A charge the copy holds, to refund after it.
    let first_api = api(&db, &sandbox).await;
    let (status, kept) = charge(
        &first_api,
        &token,
        &new_key(),
        &charge_body(9000, "tok_visa"),
    )
    .await;
    assert_eq!(status, 201, "{kept}");
    let kept_id = kept["id"].as_str().unwrap().to_owned();
    first_api.stop().await.unwrap();
    let copy = db.copy().await;

    let api_before = api(&db, &sandbox).await;
    let answered = (new_key(), charge_body(6100, "tok_visa"));
    let (status, answered_first) = charge(&api_before, &token, &answered.0, &answered.1).await;
    assert_eq!(status, 201, "{answered_first}");
    let set = |drop: bool| json!({ "drop_after_charge": drop });
    let config = |c: Value| {
        let url = format!("{}/_sandbox/config", sandbox.url);
        async move {
            reqwest::Client::new()
                .post(url)
                .json(&c)
                .send()
                .await
                .unwrap()
        }
    };
    assert!(config(set(true)).await.status().is_success());
    let dropped = (new_key(), charge_body(6200, "tok_visa"));
    let (status, body) = charge(&api_before, &token, &dropped.0, &dropped.1).await;
    assert_eq!(status, 503, "the answer was dropped: {body}");
    assert!(config(set(false)).await.status().is_success());
    let refund_key = new_key();
    let refund_body = json!({ "amount_cents": 2500 });
    let (status, refund_first) =
        refund(&api_before, &office, &kept_id, &refund_key, &refund_body).await;
    assert_eq!(status, 201, "{refund_first}");
    let keys: Vec<String> = (0..10).map(|_| new_key()).collect();
    let ten_first = ten_at_once(&api_before, &token, &keys).await;
    assert!(
        ten_first.iter().all(|(status, _)| *status == 201),
        "{ten_first:?}"
    );
    api_before.stop().await.unwrap();

    db.restore(copy).await;
    let restored = api(&db, &sandbox).await;
    let listed = payments_tests::get_json(&format!("{}/api/charges", restored.url), &token).await;
    let listed = listed["data"].as_array().unwrap();
    assert_eq!(
        listed.len(),
        1,
        "only the charge the copy holds: {listed:?}"
    );

    let (status, retry) = charge(&restored, &token, &answered.0, &answered.1).await;
    assert_eq!(status, 201, "{retry}");
    assert_eq!(retry["id"], answered_first["id"], "the same charge");
    assert_eq!(
        retry["gateway_charge_id"],
        answered_first["gateway_charge_id"]
    );
    let (status, retry) = charge(&restored, &token, &dropped.0, &dropped.1).await;
    assert_eq!(status, 201, "the dropped charge, answered at last: {retry}");
    let (status, retry) = refund(&restored, &office, &kept_id, &refund_key, &refund_body).await;
    assert_eq!(status, 201, "{retry}");
    assert_eq!(retry["id"], refund_first["id"], "the same refund");
    assert_eq!(
        retry["gateway_refund_id"],
        refund_first["gateway_refund_id"]
    );
    let ten_retried = ten_at_once(&restored, &token, &keys).await;
    for ((_, first), (status, retry)) in ten_first.iter().zip(&ten_retried) {
        assert_eq!(*status, 201, "{retry}");
        assert_eq!(retry["id"], first["id"]);
        assert_eq!(retry["gateway_charge_id"], first["gateway_charge_id"]);
    }

    // The provider made each operation once: the kept charge, the
    // answered one, the dropped one and ten; one refund.
    let charged = sandbox_json(&sandbox, "/_sandbox/charges").await;
    let charged = charged["data"].as_array().unwrap();
    assert_eq!(charged.len(), 13, "charged once each at the provider");
    let refunded = sandbox_json(&sandbox, "/_sandbox/refunds").await;
    assert_eq!(
        refunded["data"].as_array().unwrap().len(),
        1,
        "refunded once"
    );
    restored.stop().await.unwrap();
}

/// Every process of one database derives under one secret: the first to
/// start pins its fingerprint; an API replica or a jobs runner with another
/// `PROVIDER_KEY_SECRET` refuses to start, naming both fingerprints.
async fn another_provider_key_secret_is_refused_at_start(backend: Backend) {
    let Some(db) = TestDb::new(backend, 1).await else {
        return;
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let first = api(&db, &sandbox).await;
    first.stop().await.unwrap();
    let other = [(
        "PROVIDER_KEY_SECRET",
        "another-secret-another-secret-0123456789",
    )];
    for binary in ["payments-api", "payments-jobs"] {
        let args: &[&str] = if binary == "payments-jobs" {
            &["reap", "--once"]
        } else {
            &[]
        };
        let (ok, _, stderr) = run_binary(binary, args, &api_env(&db, &sandbox, &other)).await;
        assert!(!ok, "{binary} must refuse another secret");
        assert!(
            stderr.contains("PROVIDER_KEY_SECRET is not the secret this database's operations were derived under"),
            "{binary}: {stderr}"
        );
    }
    // The secret it was started with still serves.
    api(&db, &sandbox).await.stop().await.unwrap();
}

backend_tests!(
    a_restored_database_makes_every_operation_once,
    another_provider_key_secret_is_refused_at_start,
);
