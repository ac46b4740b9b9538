//! Clock skew: a second API replica, and the jobs, on hosts whose clocks are
//! two hours ahead of or behind the database's (libfaketime), against one
//! database. Every decision about ownership and existence is the
//! database's, so a skewed host changes nothing: no key is reclaimed early,
//! no live lease is taken over, no fresh record is pruned, no deadline it
//! writes is wrong.
//!
//! The key TTL (1 h) and the sandbox's key retention (1 h) are shorter than
//! the skew, so a test cannot pass because the provider deduplicated a
//! second call: the provider's request count is checked as well.
//!
//! PostgreSQL and MariaDB only: SQLite is a file read by the process that
//! writes it, so its clock is that process's clock, and one SQLite database
//! has one host. The last test here, the key-retention guard through the
//! binaries' own settings, runs on every backend.

use std::time::Duration;

use payments_api::config::DEV_JWT_SECRET;
use payments_tests::{Backend, Process, Skew, TestDb, charge_body, new_key, run_binary_skewed};
use serde_json::{Value, json};

/// The database, a sandbox, a replica on the real clock and one on `skew`.
struct Replicas {
    db: TestDb,
    sandbox: Process,
    api: Process,
    skewed: Process,
    skew: Skew,
}

fn api_env<'a>(db: &'a TestDb, sandbox: &'a Process) -> Vec<(&'a str, &'a str)> {
    // These tests age records by SQL: no copies in memory.
    let extra = [("IDEMPOTENCY_TTL", "1h"), ("REPLAY_CACHE_MB", "0")];
    super::api_env(db, sandbox, &extra)
}

async fn replicas(backend: Backend, skew: Skew) -> Option<Replicas> {
    let db = TestDb::new(backend, 2).await?;
    let sandbox = Process::start(
        "payments-sandbox",
        &["--listen", "127.0.0.1:0", "--key-retention-secs", "3600"],
        &[],
    )
    .await;
    let env = api_env(&db, &sandbox);
    let api = Process::start("payments-api", &[], &env).await;
    let skewed = Process::start_skewed("payments-api", &[], &env, skew).await?;
    Some(Replicas {
        db,
        sandbox,
        api,
        skewed,
        skew,
    })
}

/// A token both replicas accept: no `iat`, and an expiry hours away on
/// either clock.
fn token(customer: &str) -> String {
    payments_api::auth::mint_hs256(DEV_JWT_SECRET, customer, Duration::from_secs(4 * 3600)).unwrap()
}

impl Replicas {
    async fn post(&self, api: &Process, key: &str) -> (u16, Value) {
        let r = api
            .post_charge(&token("cus_skew"), key, &charge_body(4900, "tok_visa"))
            .await
            .unwrap();
        let replay = r.headers().contains_key("idempotent-replay");
        let status = r.status().as_u16();
        let mut body: Value = r.json().await.unwrap();
        body["replayed"] = json!(replay);
        (status, body)
    }

    /// Starts a charge on `api` whose provider call takes 3 s, and returns
    /// once it is in flight.
    async fn in_flight(&self, api: &Process, key: &str) -> tokio::task::JoinHandle<u16> {
        self.configure_sandbox(json!({"latency_ms": 3000, "key_retention_secs": 3600}))
            .await;
        let (url, key) = (api.url.clone(), key.to_owned());
        let first = tokio::spawn(async move {
            let api = Process::detached(url);
            api.post_charge(&token("cus_skew"), &key, &charge_body(4900, "tok_visa"))
                .await
                .unwrap()
                .status()
                .as_u16()
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        first
    }

    async fn configure_sandbox(&self, config: Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/_sandbox/config", self.sandbox.url))
            .json(&config)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }

    async fn sandbox(&self, path: &str) -> Value {
        reqwest::get(format!("{}{path}", self.sandbox.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn provider_requests(&self) -> u64 {
        self.sandbox("/_sandbox/stats").await["requests"]
            .as_u64()
            .unwrap()
    }

    async fn provider_charges(&self) -> usize {
        self.sandbox("/_sandbox/charges").await["data"]
            .as_array()
            .unwrap()
            .len()
    }

    /// `payments-jobs <job> --once` on a host with the skewed clock.
    async fn job(&self, job: &str) -> String {
        let (ok, _, stderr) = run_binary_skewed(
            "payments-jobs",
            &[job, "--once"],
            &[
                ("DATABASE_URL", &self.db.url),
                ("GATEWAY_URL", &self.sandbox.url),
                ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
                ("IDEMPOTENCY_TTL", "1h"),
            ],
            self.skew,
        )
        .await
        .expect("libfaketime was found for the replica");
        assert!(ok, "{job} --once failed:\n{stderr}");
        stderr
    }
}

/// A replica two hours ahead sees a key completed a moment ago as past its
/// 1 h TTL by its own clock: it must replay it, not charge again.
async fn ahead_replica_replays_a_fresh_key(backend: Backend) {
    let Some(r) = replicas(backend, Skew::AHEAD_2H).await else {
        return;
    };
    let key = new_key();
    let (status, first) = r.post(&r.api, &key).await;
    assert_eq!(status, 201, "{first}");
    let (status, retry) = r.post(&r.skewed, &key).await;
    assert_eq!(status, 201, "{retry}");
    assert_eq!(retry["replayed"], true, "{retry}");
    assert_eq!(retry["id"], first["id"]);
    assert_eq!(r.provider_charges().await, 1);
    assert_eq!(r.db.charges().await, 1);
}

/// A replica two hours ahead sees a live 30 s lease as long expired: its
/// retries must get 409, never take the call over and re-drive it.
async fn ahead_replica_never_takes_over_a_live_lease(backend: Backend) {
    let Some(r) = replicas(backend, Skew::AHEAD_2H).await else {
        return;
    };
    let key = new_key();
    let first = r.in_flight(&r.api, &key).await;
    for _ in 0..3 {
        let (status, body) = r.post(&r.skewed, &key).await;
        assert_eq!(status, 409, "{body}");
    }
    assert_eq!(first.await.unwrap(), 201);
    assert_eq!(r.provider_requests().await, 1, "one provider call");
    assert_eq!(r.provider_charges().await, 1);
}

/// A replica two hours behind writes deadlines from the database's clock:
/// the record it completes is not already past its TTL for everyone else,
/// and the lease it takes is not already over.
async fn behind_replica_writes_deadlines_that_hold(backend: Backend) {
    let Some(r) = replicas(backend, Skew::BEHIND_2H).await else {
        return;
    };
    let key = new_key();
    let (status, first) = r.post(&r.skewed, &key).await;
    assert_eq!(status, 201, "{first}");
    let (status, retry) = r.post(&r.api, &key).await;
    assert_eq!(status, 201, "{retry}");
    assert_eq!(retry["replayed"], true, "{retry}");
    assert_eq!(r.provider_charges().await, 1);

    // A lease taken by the slow-clock replica.
    let slow_key = new_key();
    let skewed_first = r.in_flight(&r.skewed, &slow_key).await;
    let (status, body) = r.post(&r.api, &slow_key).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(skewed_first.await.unwrap(), 201);
    assert_eq!(r.provider_requests().await, 2, "one call per key");
    assert_eq!(r.provider_charges().await, 2);
}

/// The jobs on a host two hours ahead: the pruner keeps a record completed
/// a moment ago, and the reaper leaves a live lease alone.
async fn ahead_jobs_keep_fresh_records_and_live_leases(backend: Backend) {
    let Some(r) = replicas(backend, Skew::AHEAD_2H).await else {
        return;
    };
    let key = new_key();
    let (status, _) = r.post(&r.api, &key).await;
    assert_eq!(status, 201);
    let log = r.job("prune").await;
    assert_eq!(r.db.records().await, 1, "a fresh record was pruned:\n{log}");
    let (status, retry) = r.post(&r.api, &key).await;
    assert_eq!((status, &retry["replayed"]), (201, &json!(true)), "{retry}");

    let slow_key = new_key();
    let first = r.in_flight(&r.api, &slow_key).await;
    let log = r.job("reap").await;
    assert_eq!(first.await.unwrap(), 201, "{log}");
    assert_eq!(r.provider_requests().await, 2, "no re-drive:\n{log}");
    assert_eq!(r.provider_charges().await, 2);
}

/// The jobs on a host two hours behind still do their work when the
/// database says it is due: a released lease is reaped, and a record past
/// its TTL is pruned.
async fn behind_jobs_still_reap_and_prune(backend: Backend) {
    let Some(r) = replicas(backend, Skew::BEHIND_2H).await else {
        return;
    };
    let done = new_key();
    let (status, _) = r.post(&r.api, &done).await;
    assert_eq!(status, 201);
    r.db.age(Some(&done), Duration::from_secs(3600 + 60)).await;

    // A fault a re-drive recovers from (a 429 is saved nowhere; a 500
    // would be replayed under the key and abandoned).
    r.configure_sandbox(json!({"rate_limit_rate": 1.0})).await;
    let unknown = new_key();
    let (status, body) = r.post(&r.api, &unknown).await;
    assert_eq!(status, 503, "{body}");
    r.configure_sandbox(json!({})).await;

    let log = r.job("reap").await;
    assert_eq!(
        r.db.records_for_key(&unknown, "complete", Some(201)).await,
        1,
        "the released lease was not reaped:\n{log}"
    );
    let log = r.job("prune").await;
    assert_eq!(
        r.db.records_for_key(&done, "complete", Some(201)).await,
        0,
        "the expired record was not pruned:\n{log}"
    );
}

payments_tests::network_backend_tests!(
    ahead_replica_replays_a_fresh_key,
    ahead_replica_never_takes_over_a_live_lease,
    behind_replica_writes_deadlines_that_hold,
    ahead_jobs_keep_fresh_records_and_live_leases,
    behind_jobs_still_reap_and_prune,
);

/// The key-retention guard through the real binaries and their settings:
/// with `PROVIDER_KEY_RETENTION=2h` and `PROVIDER_KEY_MARGIN=1h`, a request
/// the provider charged (its answer lost) and then forgot, retried 90
/// minutes later, is abandoned without a provider call, by the API for the
/// client's retry and by `payments-jobs reap --once` for one nobody retried.
/// Every backend: this is the guard, not clock skew.
async fn binaries_never_redrive_past_the_key_retention(backend: Backend) {
    let Some(db) = TestDb::new(backend, 2).await else {
        return;
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let retention = [
        ("PROVIDER_KEY_RETENTION", "2h"),
        ("PROVIDER_KEY_MARGIN", "1h"),
        ("IDEMPOTENCY_TTL", "1h"),
    ];
    let mut env = api_env(&db, &sandbox);
    env.extend(retention);
    let api = Process::start("payments-api", &[], &env).await;
    let r = Replicas {
        db,
        skewed: Process::detached(api.url.clone()),
        api,
        sandbox,
        skew: Skew { secs: 0 },
    };
    r.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let (retried, forgotten) = (new_key(), new_key());
    for key in [&retried, &forgotten] {
        let (status, body) = r.post(&r.api, key).await;
        assert_eq!(status, 503, "{body}");
    }
    // The provider forgets every key now; a re-drive would charge again.
    r.configure_sandbox(json!({"key_retention_secs": 0})).await;
    r.db.age(None, Duration::from_secs(90 * 60)).await;

    let (status, body) = r.post(&r.api, &retried).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "request_abandoned");
    let mut jobs_env = vec![
        ("DATABASE_URL", r.db.url.as_str()),
        ("GATEWAY_URL", r.sandbox.url.as_str()),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("ABANDON_AFTER", "15m"),
    ];
    jobs_env.extend(retention);
    let (ok, _, log) =
        payments_tests::run_binary("payments-jobs", &["reap", "--once"], &jobs_env).await;
    assert!(ok, "{log}");
    assert!(log.contains("abandoned=1"), "{log}");
    assert_eq!(
        r.provider_requests().await,
        2,
        "no re-drive reached the provider"
    );
    assert_eq!(r.provider_charges().await, 2);
    assert_eq!(r.db.charges_with_status("unknown").await, 2);
    assert_eq!(
        r.db.records_for_key(&forgotten, "abandoned", Some(500))
            .await,
        1
    );
}

payments_tests::backend_tests!(binaries_never_redrive_past_the_key_retention);
