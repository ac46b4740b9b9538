//! A database put back from a copy taken before the payment, as a
//! point-in-time restore or a promoted asynchronous replica leaves it,
//! with the real binaries: SQLite's files (the database, `-wal` and `-shm`
//! together, the server stopped), PostgreSQL's database recreated from a
//! template copy, MariaDB's `mariadb-dump` loaded back. The client retries
//! with its key against the restored server: the same charge, one provider
//! charge. (`http::lost_tail` covers the other cases with a copy of the
//! rows.)

use payments_tests::{Backend, Process, TestDb, backend_tests, charge_body, run_binary};
use serde_json::Value;

use crate::{api_env, mint, post, sandbox_json};

/// The API on `db`, after its migrations.
async fn api(db: &TestDb, sandbox: &Process) -> Process {
    Process::start("payments-api", &[], &api_env(db, sandbox, &[])).await
}

async fn a_restored_database_charges_once(backend: Backend) {
    let Some(db) = TestDb::new(backend, 1).await else {
        return;
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let (ok, _, stderr) =
        run_binary("payments-api", &["migrate"], &[("DATABASE_URL", &db.url)]).await;
    assert!(ok, "migrate failed: {stderr}");
    let copy = db.copy().await;

    let first_api = api(&db, &sandbox).await;
    let token = mint("cus_restore").await;
    let key = uuid::Uuid::new_v4().to_string();
    let body = charge_body(6100, "tok_visa");
    let first = post(&first_api, &token, &key, &body).await;
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    first_api.stop().await.unwrap();

    db.restore(copy).await;
    let restored = api(&db, &sandbox).await;
    let listed: Value = reqwest::Client::new()
        .get(format!("{}/api/charges", restored.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["data"],
        serde_json::json!([]),
        "the charge was lost with the restore"
    );

    let retry = post(&restored, &token, &key, &body).await;
    assert_eq!(retry.status(), 201);
    assert!(retry.headers().get("idempotent-replay").is_none());
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(retry["id"], first["id"], "the same charge");
    assert_eq!(retry["gateway_charge_id"], first["gateway_charge_id"]);
    let charged: Value = sandbox_json(&sandbox, "/_sandbox/charges").await;
    let charged = charged["data"].as_array().unwrap();
    assert_eq!(
        charged.len(),
        1,
        "charged once at the provider: {charged:?}"
    );
    restored.stop().await.unwrap();
}

backend_tests!(a_restored_database_charges_once);
