//! MariaDB Galera: three primaries. The store's own races run on the
//! cluster in the conformance suite (`galera` tests); here the real
//! binaries run as replicas on different nodes, a claim is lost on every
//! node on purpose, and a node dies under load.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use payments_api::config::DEV_JWT_SECRET;
use payments_tests::galera::Galera;
use payments_tests::{Backend, Process, TestDb, charge_body, new_key};
use serde_json::{Value, json};
use sqlx::{Connection, MySqlConnection};

use crate::load::{Load, api_env, replica, sandbox, sandbox_json};

/// The status of a replica's `GET /readyz`.
async fn readyz(api: &Process) -> u16 {
    let answer = reqwest::get(format!("{}/readyz", api.url)).await;
    answer.expect("the replica answers").status().as_u16()
}

/// A connection to one node whose reads (and deletes) first apply every
/// write set the cluster ordered before them, as the store's do.
async fn node(url: &str) -> MySqlConnection {
    let mut conn = MySqlConnection::connect(url).await.expect("connect");
    sqlx::query("SET SESSION wsrep_sync_wait = 3")
        .execute(&mut conn)
        .await
        .expect("wsrep_sync_wait");
    conn
}

/// The charge ids in `charges` on one node.
async fn charge_ids(url: &str) -> HashSet<String> {
    let mut conn = node(url).await;
    sqlx::query_scalar::<_, String>("SELECT id FROM charges")
        .fetch_all(&mut conn)
        .await
        .expect("charges")
        .into_iter()
        .collect()
}

/// Two replicas on two nodes, 20 concurrent requests with one key sent
/// alternately to them: one charge at the provider and in the database,
/// and each replica's retry right after is a replay of the same charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_on_two_nodes_take_one_charge() {
    let Some(db) = TestDb::new(Backend::Galera, 2).await else {
        return;
    };
    let sandbox = sandbox("300").await;
    let apis = std::sync::Arc::new([
        replica(&db.node_urls[0], &sandbox).await,
        replica(&db.node_urls[1], &sandbox).await,
    ]);
    let token = payments_api::auth::mint_hs256(DEV_JWT_SECRET, "cus_two", Duration::from_secs(600))
        .expect("token");
    let key = new_key();
    let body = charge_body(4900, "tok_visa");
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (apis, token, key, body, barrier) = (
                apis.clone(),
                token.clone(),
                key.clone(),
                body.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                let response = apis[i % 2].post_charge(&token, &key, &body).await;
                response.expect("an answer").status().as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.expect("task"));
    }
    assert!(
        statuses.iter().all(|s| matches!(s, 201 | 409)),
        "{statuses:?}"
    );
    assert!(statuses.contains(&201), "{statuses:?}");
    let charges = sandbox_json(&sandbox, "/_sandbox/charges").await;
    assert_eq!(
        charges["data"].as_array().map(Vec::len),
        Some(1),
        "{charges}"
    );
    let mut ids = HashSet::new();
    for api in apis.iter() {
        let replay = api.post_charge(&token, &key, &body).await.expect("answer");
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replay"], "true");
        let charge: Value = replay.json().await.expect("json");
        ids.insert(charge["id"].as_str().expect("id").to_owned());
    }
    assert_eq!(ids.len(), 1, "both replicas replay the same charge");
    for url in &db.node_urls {
        assert_eq!(charge_ids(url).await, ids, "one charge row on every node");
    }
}

/// Sends `name` (`-STOP`, `-CONT`) to process `pid`.
fn signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([name, &pid.to_string()])
        .status();
    assert!(sent.is_ok_and(|s| s.success()), "kill {name} {pid}");
}

/// What a node that lost an operation's last writes shows, made on
/// purpose: its record (by `key`) and its charge (`charge_id`) deleted in
/// one transaction on the node at `url`. Galera replicates the delete, so
/// the claim is gone on every node.
async fn lose_operation(url: &str, key: &str, charge_id: &str) {
    let mut conn = node(url).await;
    let mut tx = conn.begin().await.expect("begin");
    let records = sqlx::query("DELETE FROM idempotent_requests WHERE idempotency_key = ?")
        .bind(key)
        .execute(&mut *tx)
        .await
        .expect("delete the record")
        .rows_affected();
    let charges = sqlx::query("DELETE FROM charges WHERE id = ?")
        .bind(charge_id)
        .execute(&mut *tx)
        .await
        .expect("delete the charge")
        .rows_affected();
    tx.commit().await.expect("commit");
    assert_eq!((records, charges), (1, 1), "the operation's rows, deleted");
}

/// How many rows of the operation (its record, its charge) one node holds.
async fn operation_rows(url: &str, key: &str, charge_id: &str) -> (i64, i64) {
    let mut conn = node(url).await;
    let records =
        sqlx::query_scalar("SELECT COUNT(*) FROM idempotent_requests WHERE idempotency_key = ?")
            .bind(key)
            .fetch_one(&mut conn)
            .await
            .expect("records");
    let charges = sqlx::query_scalar("SELECT COUNT(*) FROM charges WHERE id = ?")
        .bind(charge_id)
        .fetch_one(&mut conn)
        .await
        .expect("charges");
    (records, charges)
}

/// The provider's charges, oldest first, each as (its id, the charge id
/// its `metadata[payments_charge_id]` carries).
async fn provider_charge_ids(sandbox: &Process) -> Vec<(String, String)> {
    let made = sandbox_json(sandbox, "/_sandbox/charges").await;
    let made = made["data"].as_array().cloned().unwrap_or_default();
    made.iter()
        .map(|c| {
            let field = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (field(&c["id"]), field(&c["metadata"]["payments_charge_id"]))
        })
        .collect()
}

/// A claim lost on every node on purpose, as a node that crashed ahead of
/// the cluster loses it (issue 24), twice:
///
/// - before the answer: node 1's replica is stopped (SIGSTOP) while its
///   provider call is in flight; once the provider has the charge, the
///   operation's record and charge are deleted on node 2 (the delete
///   replicates to every node); resumed, the replica finds its record gone
///   and answers 409;
/// - after the answer: a 201 from node 1's replica, then the same delete.
///
/// Each time the client retries with its key through node 3's replica: a
/// new claim, which derives the same charge id and provider key, so the
/// provider answers from its idempotency record: 201 with the charge id the
/// provider's charge carries in `metadata[payments_charge_id]` and that
/// charge's id as `gateway_charge_id`, one provider charge per operation,
/// one charge row per operation on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_lost_on_every_node_is_charged_once() {
    let Some(db) = TestDb::new(Backend::Galera, 2).await else {
        return;
    };
    // Slow enough that node 1's replica is stopped with its call in flight.
    let sandbox = sandbox("1500").await;
    let first = replica(&db.node_urls[0], &sandbox).await;
    let other = replica(&db.node_urls[2], &sandbox).await;
    let token =
        payments_api::auth::mint_hs256(DEV_JWT_SECRET, "cus_lost_claim", Duration::from_secs(600))
            .expect("token");
    let body = charge_body(4900, "tok_visa");
    // The retry through node 3: 201, a new claim (not a replay), the
    // provider's charge `made`.
    let retried = |key: String, made: (String, String)| {
        let (other, token, body) = (&other, &token, &body);
        async move {
            let retry = other
                .post_charge(token, &key, body)
                .await
                .expect("an answer");
            assert_eq!(retry.status(), 201, "the retry charges");
            assert!(!retry.headers().contains_key("idempotent-replay"));
            let charge: Value = retry.json().await.expect("json");
            assert_eq!(
                charge["id"],
                made.1.as_str(),
                "the operation the provider made: {charge}"
            );
            assert_eq!(charge["gateway_charge_id"], made.0.as_str(), "{charge}");
            assert_eq!(charge["status"], "succeeded", "{charge}");
        }
    };

    // Lost before the answer.
    let key = new_key();
    let sent = {
        let (api, token, key, body) = (
            Process::detached(first.url.clone()),
            token.clone(),
            key.clone(),
            body.clone(),
        );
        tokio::spawn(async move { api.post_charge(&token, &key, &body).await })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while sandbox_json(&sandbox, "/_sandbox/stats").await["in_flight"] != 1 {
        assert!(Instant::now() < deadline, "no provider call in flight");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    signal(first.pid(), "-STOP");
    let deadline = Instant::now() + Duration::from_secs(30);
    let made = loop {
        let made = provider_charge_ids(&sandbox).await;
        if !made.is_empty() || Instant::now() >= deadline {
            break made;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(made.len(), 1, "the provider made the charge");
    let before_answer = made[0].clone();
    lose_operation(&db.node_urls[1], &key, &before_answer.1).await;
    for url in &db.node_urls {
        let rows = operation_rows(url, &key, &before_answer.1).await;
        assert_eq!(rows, (0, 0), "the claim is gone on every node");
    }
    signal(first.pid(), "-CONT");
    let answer = sent.await.expect("the task").expect("an answer");
    let status = answer.status();
    let text = answer.text().await.unwrap_or_default();
    assert_eq!(
        status,
        409,
        "the replica that lost its record answers 409: {text}\n{}",
        first.log()
    );
    assert!(
        first
            .wait_for_log(&["lost the record to another operation"])
            .await,
        "{}",
        first.log()
    );
    retried(key.clone(), before_answer.clone()).await;
    let made = provider_charge_ids(&sandbox).await;
    assert_eq!(made, std::slice::from_ref(&before_answer), "one charge");
    let stats = sandbox_json(&sandbox, "/_sandbox/stats").await;
    assert_eq!(
        stats["requests"], 2,
        "the retry asked the provider again: {stats}"
    );

    // Lost after the answer.
    let key = new_key();
    let answered = first
        .post_charge(&token, &key, &body)
        .await
        .expect("an answer");
    assert_eq!(answered.status(), 201);
    let answered: Value = answered.json().await.expect("json");
    let after_answer = (
        answered["gateway_charge_id"]
            .as_str()
            .expect("gateway id")
            .to_owned(),
        answered["id"].as_str().expect("id").to_owned(),
    );
    lose_operation(&db.node_urls[1], &key, &after_answer.1).await;
    retried(key.clone(), after_answer.clone()).await;
    assert_eq!(
        provider_charge_ids(&sandbox).await,
        [before_answer.clone(), after_answer.clone()],
        "one provider charge per operation"
    );
    // Later retries replay it, on either replica.
    for api in [&first, &other] {
        let replay = api
            .post_charge(&token, &key, &body)
            .await
            .expect("an answer");
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replay"], "true");
        let charge: Value = replay.json().await.expect("json");
        assert_eq!(charge["id"], after_answer.1.as_str());
    }
    let ids = HashSet::from([before_answer.1, after_answer.1]);
    for url in &db.node_urls {
        assert_eq!(
            charge_ids(url).await,
            ids,
            "one charge row per operation on every node"
        );
    }
}

/// The lease the cluster tests give their reapers: longer than any pass
/// can run (`run_binary` stops a binary after 60 s, and the stalled reaper
/// below is stopped after as long), so no lease a pass takes can lapse
/// before the pass ends, however long the loaded machine stalls it. A lease
/// that lapses is handed on by design (the record is driven again, under
/// the same provider key): with the default `LEASE` of 30 s a stalled pass
/// made one of 50 records be driven twice (51 provider calls, 50 charges,
/// issue 23). With this lease a record driven twice can only be two reapers
/// holding its lease at once, which certification must prevent.
const REAP_LEASE: &str = "10m";
/// The reapers' provider timeout: shorter than the lease (as the settings
/// require) and longer than the stalled reaper's stop.
const REAP_GATEWAY_TIMEOUT: &str = "2m";

/// A reaper's environment: `url`'s node, the sandbox, [`REAP_LEASE`].
fn reaper_env<'a>(url: &'a str, sandbox: &'a str) -> [(&'static str, &'a str); 5] {
    [
        ("DATABASE_URL", url),
        ("GATEWAY_URL", sandbox),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("LEASE", REAP_LEASE),
        ("GATEWAY_TIMEOUT", REAP_GATEWAY_TIMEOUT),
    ]
}

/// The records a `reap --once` log says its pass reaped.
fn reaped(log: &str) -> Option<u64> {
    let pass = log.lines().find(|line| line.contains("reap pass"))?;
    let count = pass
        .split_whitespace()
        .find_map(|w| w.strip_prefix("reaped="))?;
    count.parse().ok()
}

/// `records` charges stuck in progress on `db`, claimed two minutes ago.
async fn stuck_records(db: &TestDb, records: usize) {
    for i in 0..records {
        let body = json!({"amount_cents": 4900, "currency": "GBP", "card_token": "tok_visa"});
        db.stuck_request(
            &format!("stuck-{i}"),
            &format!("cus_{i}"),
            &body,
            Duration::from_secs(120),
        )
        .await;
    }
}

/// Two `payments-jobs reap --once` on two nodes over 50 stuck records:
/// certification lets one take each record, so the provider gets 50 calls
/// and the two passes reaped 50 records between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reapers_on_two_nodes_drive_each_record_once() {
    let Some(db) = TestDb::new(Backend::Galera, 4).await else {
        return;
    };
    let sandbox = sandbox("20").await;
    stuck_records(&db, 50).await;
    let reap = |url: String| {
        let sandbox = sandbox.url.clone();
        async move {
            let env = reaper_env(&url, &sandbox);
            payments_tests::run_binary("payments-jobs", &["reap", "--once"], &env).await
        }
    };
    let (a, b) = tokio::join!(reap(db.node_urls[0].clone()), reap(db.node_urls[2].clone()));
    assert!(a.0, "reaper on node 1:\n{}", a.2);
    assert!(b.0, "reaper on node 3:\n{}", b.2);
    let logs = format!("reaper on node 1:\n{}\nreaper on node 3:\n{}", a.2, b.2);
    let stats = sandbox_json(&sandbox, "/_sandbox/stats").await;
    assert_eq!(
        stats["requests"], 50,
        "no record was driven twice: {stats}\n{logs}"
    );
    let charges = sandbox_json(&sandbox, "/_sandbox/charges").await;
    assert_eq!(charges["data"].as_array().map(Vec::len), Some(50));
    assert_eq!(db.charges_with_status("succeeded").await, 50);
    let both = reaped(&a.2).zip(reaped(&b.2)).map(|(a, b)| a + b);
    assert_eq!(both, Some(50), "each record reaped by one pass:\n{logs}");
}

/// A reaper stalled in the middle of its pass for longer than the default
/// lease: stopped (SIGSTOP) while it waits on a provider call, and the rows
/// aged by 60 s meanwhile (the database's clock moved on, not slept). The
/// other node's reaper leaves the record it holds alone, since
/// [`REAP_LEASE`] outlives the stall, and drives the other 49; the stalled
/// one, resumed, finishes its record. 50 records, 50 provider calls. With
/// the default lease (30 s) the second reaper drives that record again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_reaper_keeps_its_record_for_its_lease() {
    let Some(db) = TestDb::new(Backend::Galera, 4).await else {
        return;
    };
    // Slow enough that the stop lands while the call is in flight.
    let sandbox = sandbox("5000").await;
    stuck_records(&db, 50).await;
    let mut stalled = tokio::process::Command::new(payments_tests::binary("payments-jobs"));
    stalled
        .args(["reap", "--once"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(reaper_env(&db.node_urls[0], &sandbox.url))
        // One worker: when its call is in flight, it holds one record and
        // no transaction is open.
        .env("REAP_CONCURRENCY", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut stalled = stalled.spawn().expect("start the reaper on node 1");
    let pid = stalled.id().expect("its pid");
    let signal = |name: &str| signal(pid, name);
    let deadline = Instant::now() + Duration::from_secs(60);
    while sandbox_json(&sandbox, "/_sandbox/stats").await["in_flight"] != 1 {
        let exited = stalled.try_wait().expect("the reaper's status").is_some();
        if exited || Instant::now() >= deadline {
            let _ = stalled.start_kill();
            let output = stalled.wait_with_output().await.expect("its output");
            let log = String::from_utf8_lossy(&output.stderr);
            let stats = sandbox_json(&sandbox, "/_sandbox/stats").await;
            panic!("no provider call in flight (exited: {exited}) {stats}:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    signal("-STOP");
    let config = reqwest::Client::new()
        .post(format!("{}/_sandbox/config", sandbox.url))
        .json(&json!({"latency_ms": 0}))
        .send()
        .await;
    assert!(
        config.is_ok_and(|r| r.status().is_success()),
        "sandbox config"
    );
    db.age(None, Duration::from_secs(60)).await;
    let held = db
        .count(
            "SELECT COUNT(*) FROM idempotent_requests \
             WHERE state = 'in_progress' AND locked_until > SYSDATE(3)",
            "unused: Galera only",
            &[],
        )
        .await;
    assert_eq!(held, 1, "the stalled reaper's lease outlives a 60 s stall");
    let env = reaper_env(&db.node_urls[2], &sandbox.url);
    let other = payments_tests::run_binary("payments-jobs", &["reap", "--once"], &env).await;
    signal("-CONT");
    let stalled = tokio::time::timeout(Duration::from_secs(60), stalled.wait_with_output())
        .await
        .expect("the resumed reaper finished in time")
        .expect("its output");
    let stalled_log = String::from_utf8_lossy(&stalled.stderr);
    let logs = format!(
        "reaper on node 1:\n{stalled_log}\nreaper on node 3:\n{}",
        other.2
    );
    assert!(stalled.status.success() && other.0, "{logs}");
    let stats = sandbox_json(&sandbox, "/_sandbox/stats").await;
    assert_eq!(
        stats["requests"], 50,
        "no record was driven twice: {stats}\n{logs}"
    );
    assert_eq!(db.charges_with_status("succeeded").await, 50, "{logs}");
    assert_eq!(reaped(&other.2), Some(49), "{logs}");
    assert_eq!(reaped(&stalled_log), Some(1), "{logs}");
}

/// On Galera no process migrates at start: a server on an empty database
/// refuses to start, naming the fix; `payments-api migrate` against one
/// node migrates (without the lock Galera does not serialise), once, for
/// every node; then servers start on the other nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_once_from_payments_api_migrate() {
    let cluster = match Galera::shared() {
        Ok(cluster) => cluster,
        Err(skip) => {
            payments_tests::skip_or_panic("galera", &skip);
            return;
        }
    };
    let name = format!("payments_migrate_{}", uuid::Uuid::new_v4().simple());
    let mut admin = MySqlConnection::connect(&cluster.urls[0])
        .await
        .expect("admin");
    let create = format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(&mut admin)
        .await
        .expect("create the database");
    let urls = cluster.database_urls(&name);
    // Node 1 ran the DDL; the others apply it a moment later, and a server
    // started on one before then fails for want of the database, not for
    // its schema (issue 23: seen once while proving the suite).
    for url in &urls {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match MySqlConnection::connect(url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    break;
                }
                Err(e) if e.to_string().contains("1049") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("the new database on every node: {e}"),
            }
        }
    }
    let api = |url: &str, args: &'static [&'static str]| {
        let url = url.to_owned();
        async move {
            let env = api_env(&url, "http://127.0.0.1:9");
            let (ok, _, log) = payments_tests::run_binary("payments-api", args, &env).await;
            (ok, log)
        }
    };
    let (ok, log) = api(&urls[1], &[]).await;
    assert!(
        !ok,
        "a server started on an unmigrated Galera database:\n{log}"
    );
    assert!(
        log.contains("galera") && log.contains("payments-api migrate"),
        "the refusal names the cluster and the fix:\n{log}"
    );
    let (ok, log) = api(&urls[0], &["migrate"]).await;
    assert!(ok, "payments-api migrate on node 1:\n{log}");
    let server = Process::start(
        "payments-api",
        &[],
        &api_env(&urls[2], "http://127.0.0.1:9"),
    )
    .await;
    assert_eq!(readyz(&server).await, 200, "a replica on node 3 is ready");
    let mut applied = Vec::new();
    for url in &urls {
        let mut conn = MySqlConnection::connect(url).await.expect("a node");
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success")
            .fetch_one(&mut conn)
            .await
            .expect("migrations");
        applied.push(count);
    }
    assert!(
        applied[0] > 0 && applied.iter().all(|n| *n == applied[0]),
        "{applied:?}"
    );
    let drop = format!("DROP DATABASE `{name}`");
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
        .execute(&mut admin)
        .await;
}

/// Operations in the node-kill load.
const KILL_OPS: usize = 1200;

/// A node killed with SIGKILL while requests are in flight on it, under a
/// load of distinct and repeated keys through three replicas (one per
/// node): the other replicas keep answering, the node rejoins, and at the
/// end no operation was charged twice, every operation finished with its
/// retries, and every acknowledged charge is on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_under_load_loses_and_doubles_nothing() {
    let cluster: &'static Galera = match Galera::start() {
        Ok(cluster) => Box::leak(Box::new(cluster)),
        Err(skip) => {
            payments_tests::skip_or_panic("galera", &skip);
            return;
        }
    };
    let db = TestDb::on_cluster(cluster, 2).await;
    let sandbox = sandbox("30").await;
    let mut replicas = Vec::new();
    for url in &db.node_urls {
        replicas.push(replica(url, &sandbox).await);
    }
    let load = Load::start(
        replicas.iter().map(|r| r.url.clone()).collect(),
        KILL_OPS,
        12,
    );
    load.until_completed(KILL_OPS / 4).await;
    // Wait for requests in flight on the third node's replica, then kill
    // the node under them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while load.in_flight(2) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let in_flight = load.in_flight(2);
    cluster.kill(2);
    let killed_at = (Instant::now(), load.completed());
    assert!(in_flight > 0, "requests were in flight on the node killed");
    // The dead node's replica: not ready (a balancer takes it out), and a
    // request gets 503 with Retry-After and no driver text.
    let dead = &replicas[2];
    assert_eq!(
        readyz(dead).await,
        503,
        "the replica of the dead node is not ready"
    );
    let token =
        payments_api::auth::mint_hs256(DEV_JWT_SECRET, "cus_dead", Duration::from_secs(600))
            .expect("token");
    let answer = dead
        .post_charge(&token, &new_key(), &charge_body(4900, "tok_visa"))
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 503);
    assert!(answer.headers().contains_key("retry-after"));
    let body: Value = answer.json().await.expect("json");
    assert_eq!(body["error"]["code"], "service_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    for driver_text in ["WSREP", "expected to read", "os error", "refused", "pool"] {
        assert!(!message.contains(driver_text), "{message}");
    }
    load.until_completed(killed_at.1 + KILL_OPS / 4).await;
    let during_outage = load.completed() - killed_at.1;
    let rejoin = cluster.rejoin(2).await.expect("the node rejoins");
    // Its pool reaches the node again by itself: no restart.
    let deadline = Instant::now() + Duration::from_secs(30);
    while readyz(dead).await != 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(readyz(dead).await, 200, "the replica is ready again");
    let report = load.finish().await;
    let made = crate::load::provider_charges(&sandbox).await;
    crate::load::report(&format!(
        "galera node kill: {KILL_OPS} operations; {in_flight} requests in flight on the node; \
         {during_outage} operations finished while it was down ({} s); rejoined in {} ms; \
         provider charges {made} (double charges {}); answers {:?}; replays {}; \
         longest time with no success {} ms",
        killed_at.0.elapsed().as_secs(),
        rejoin.as_millis(),
        made.saturating_sub(KILL_OPS),
        report.answers,
        report.replays,
        report.longest_gap.as_millis()
    ));
    let acknowledged = report.assert_exactly_once(KILL_OPS, &sandbox).await;
    for (n, url) in db.node_urls.iter().enumerate() {
        let rows = charge_ids(url).await;
        assert!(
            acknowledged.is_subset(&rows),
            "node {}: {} acknowledged charges missing",
            n + 1,
            acknowledged.difference(&rows).count()
        );
        assert_eq!(
            rows.len(),
            KILL_OPS,
            "node {}: no charge row without its 201",
            n + 1
        );
    }
}
