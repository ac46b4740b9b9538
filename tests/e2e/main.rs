//! Black-box tests: the real `payments-api` and `payments-sandbox` binaries,
//! configured through their environment as a user would, driven over HTTP.
#![allow(clippy::unwrap_used)]

mod auth;
mod cache;
mod dev_sandbox;
mod group_commit;
mod mismatch;
mod outbox;
mod provider;
mod restore;
mod skew;
mod watch;

use payments_api::config::DEV_JWT_SECRET;
use payments_tests::{Backend, Process, TestDb, backend_tests, charge_body, run_binary};
use serde_json::Value;

/// `make run`'s configuration in a fresh data directory, removed when
/// dropped: SQLite in the directory (the sandbox's ledger beside it), the
/// API and its in-process sandbox on free loopback ports, the development
/// JWT secret and the back office's audience.
struct MakeRun {
    dir: std::path::PathBuf,
    database_url: String,
}

impl MakeRun {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "payments-e2e-run-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let database_url = format!("sqlite://{}/payments.db", dir.display());
        Self { dir, database_url }
    }

    /// The environment `make run` gives the API, then `extra`.
    fn env<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut env = vec![
            ("DATABASE_URL", self.database_url.as_str()),
            ("LISTEN_ADDR", "127.0.0.1:0"),
            ("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"),
            ("JWT_HS256_SECRET", DEV_JWT_SECRET),
            (
                "JWT_BACKOFFICE_AUDIENCE",
                payments_tests::BACK_OFFICE_AUDIENCE,
            ),
        ];
        env.extend_from_slice(extra);
        env
    }

    /// The API started with [`MakeRun::env`].
    async fn start(&self, extra: &[(&str, &str)]) -> Process {
        Process::start("payments-api", &[], &self.env(extra)).await
    }
}

impl Drop for MakeRun {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn post(api: &Process, token: &str, key: &str, body: &str) -> reqwest::Response {
    api.post_charge(token, key, body).await.unwrap()
}

/// What every API process of these tests is started with: the test's
/// database, a free loopback port, the sandbox as the provider and the
/// development JWT secret; then `extra`.
fn api_env<'a>(
    db: &'a TestDb,
    sandbox: &'a Process,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("DATABASE_URL", db.url.as_str()),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("GATEWAY_URL", sandbox.url.as_str()),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("JWT_HS256_SECRET", DEV_JWT_SECRET),
    ];
    env.extend_from_slice(extra);
    env
}

/// The sum of the samples in `api`'s `/metrics` of the series that start
/// with `prefix` (a name and `{`) and carry `label` (`key="value"`).
async fn metric_sum(api: &Process, prefix: &str, label: &str) -> f64 {
    let url = format!("{}/metrics", api.url);
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    let series = text
        .lines()
        .filter(|l| l.starts_with(prefix) && l.contains(label));
    series
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `GET {path}` at the sandbox, as JSON.
async fn sandbox_json(sandbox: &Process, path: &str) -> Value {
    reqwest::get(format!("{}{path}", sandbox.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn mint(customer: &str) -> String {
    let (ok, stdout, stderr) = run_binary(
        "payments-api",
        &["token", "--customer", customer],
        &[("JWT_HS256_SECRET", DEV_JWT_SECRET)],
    )
    .await;
    assert!(ok, "token failed: {stderr}");
    stdout.trim().to_owned()
}

/// A development token of the back office (`payments-api token
/// --audience`, the audience every test process is given) for `subject`,
/// refunding, capturing and reading any customer's charges, events and
/// disputes.
async fn mint_back_office(subject: &str) -> String {
    let (ok, stdout, stderr) = run_binary(
        "payments-api",
        &[
            "token",
            "--subject",
            subject,
            "--scope",
            "refunds:write charges:capture charges:read_all events:read disputes:read",
            "--audience",
            payments_tests::BACK_OFFICE_AUDIENCE,
        ],
        &[("JWT_HS256_SECRET", DEV_JWT_SECRET)],
    )
    .await;
    assert!(ok, "token failed: {stderr}");
    stdout.trim().to_owned()
}

/// The README's session: sandbox and API as separate processes; mint a
/// token, charge, retry (replay), reuse the key with another amount (422);
/// the customer's refund refused (403), the back office's made under the
/// same key (201, replayed), and the back office's list of that customer.
async fn readme_session_against_the_real_binaries(backend: Backend) {
    let Some(db) = TestDb::new(backend, 1).await else {
        return;
    };
    let sandbox = Process::start(
        "payments-sandbox",
        &["--listen", "127.0.0.1:0", "--latency-ms", "50"],
        &[],
    )
    .await;
    let (ok, _, stderr) =
        run_binary("payments-api", &["migrate"], &[("DATABASE_URL", &db.url)]).await;
    assert!(ok, "migrate failed: {stderr}");
    let api = Process::start(
        "payments-api",
        &[],
        &[
            ("DATABASE_URL", &db.url),
            ("LISTEN_ADDR", "127.0.0.1:0"),
            ("GATEWAY_URL", &sandbox.url),
            ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
            ("JWT_HS256_SECRET", DEV_JWT_SECRET),
        ],
    )
    .await;
    let token = mint("cus_readme").await;
    let key = uuid::Uuid::new_v4().to_string();
    let first = post(&api, &token, &key, &charge_body(4900, "tok_visa")).await;
    assert_eq!(first.status(), 201);
    let first_body = first.text().await.unwrap();
    let retry = post(&api, &token, &key, &charge_body(4900, "tok_visa")).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replay"], "true");
    assert_eq!(retry.text().await.unwrap(), first_body);
    let reused = post(&api, &token, &key, &charge_body(5000, "tok_visa")).await;
    assert_eq!(reused.status(), 422);
    let charges: Value = sandbox_json(&sandbox, "/_sandbox/charges").await;
    assert_eq!(charges["data"].as_array().unwrap().len(), 1);
    assert_eq!(db.charges_with_status("succeeded").await, 1);

    let ready = reqwest::get(format!("{}/readyz", api.url)).await.unwrap();
    assert_eq!(ready.status(), 200);
    // The server writes its lines a burst at a time: wait for the replay's.
    assert!(api.wait_for_log(&["replayed=true"]).await, "{}", api.log());
    let log = api.log();
    assert!(log.contains("request_id"), "request ids are logged");
    // One line per replay: its request line says so.
    let replayed: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("replayed=true"))
        .collect();
    assert_eq!(replayed.len(), 1, "only the replay is marked:\n{log}");
    assert!(
        replayed[0].contains(&key) && replayed[0].contains("status=201"),
        "{}",
        replayed[0]
    );
    assert!(!log.contains('\u{1b}'), "no colour codes in a log file");

    let charge_id = serde_json::from_str::<Value>(&first_body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let staff = mint_back_office("ops_readme").await;
    let refund_key = uuid::Uuid::new_v4().to_string();
    let refund = |token: &str| {
        reqwest::Client::new()
            .post(format!("{}/api/charges/{charge_id}/refunds", api.url))
            .bearer_auth(token)
            .header("idempotency-key", &refund_key)
            .json(&serde_json::json!({"amount_cents": 1500, "reason": "requested_by_customer"}))
            .send()
    };
    let own = refund(&token).await.unwrap();
    assert_eq!(own.status(), 403);
    assert_eq!(
        own.headers()["www-authenticate"],
        r#"Bearer error="insufficient_scope", scope="refunds:write""#
    );
    let made = refund(&staff).await.unwrap();
    assert_eq!(made.status(), 201);
    let made: Value = made.json().await.unwrap();
    assert_eq!(
        made["requested_by"],
        serde_json::json!({"subject": "ops_readme", "role": "back_office"})
    );
    let again = refund(&staff).await.unwrap();
    assert_eq!(again.headers()["idempotent-replay"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), made);
    let url = format!("{}/api/charges?customer=cus_readme", api.url);
    let listed = payments_tests::get_json(&url, &staff).await;
    assert_eq!(listed["data"][0]["amount_refunded"], 1500, "{listed}");
    let refunds: Value = sandbox_json(&sandbox, "/_sandbox/refunds").await;
    assert_eq!(refunds["data"].as_array().unwrap().len(), 1);

    // 7. A hold, a partial capture (the rest released), a refund of the
    // captured part.
    let hold_body =
        r#"{"amount_cents": 10000, "currency": "GBP", "card_token": "tok_visa", "capture": false}"#;
    let hold = post(&api, &token, &uuid::Uuid::new_v4().to_string(), hold_body).await;
    assert_eq!(hold.status(), 201);
    let hold: Value = hold.json().await.unwrap();
    assert_eq!(hold["status"], "requires_capture", "{hold}");
    assert!(hold["capture_before"].is_string());
    let hold_id = hold["id"].as_str().unwrap();
    let capture_key = uuid::Uuid::new_v4().to_string();
    let capture = || {
        reqwest::Client::new()
            .post(format!("{}/api/charges/{hold_id}/capture", api.url))
            .bearer_auth(&staff)
            .header("idempotency-key", &capture_key)
            .json(&serde_json::json!({"amount_cents": 6000}))
            .send()
    };
    let captured = capture().await.unwrap();
    assert_eq!(captured.status(), 201);
    let captured: Value = captured.json().await.unwrap();
    assert_eq!(
        (
            &captured["status"],
            &captured["amount_captured"],
            &captured["amount_released"]
        ),
        (
            &serde_json::json!("succeeded"),
            &serde_json::json!(6000),
            &serde_json::json!(4000)
        )
    );
    let again = capture().await.unwrap();
    assert_eq!(again.headers()["idempotent-replay"], "true");
    let refunded = reqwest::Client::new()
        .post(format!("{}/api/charges/{hold_id}/refunds", api.url))
        .bearer_auth(&staff)
        .header("idempotency-key", uuid::Uuid::new_v4().to_string())
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(refunded.status(), 201);
    assert_eq!(
        refunded.json::<Value>().await.unwrap()["amount_cents"],
        6000
    );
    let captures: Value = sandbox_json(&sandbox, "/_sandbox/captures").await;
    assert_eq!(captures["data"][0]["amount"], 6000, "{captures}");
    assert_eq!(captures["data"].as_array().unwrap().len(), 1);
}

backend_tests!(readme_session_against_the_real_binaries);

/// With GATEWAY_URL unset the API starts its own sandbox and says loudly
/// that no real money moves; `make run` relies on this.
#[tokio::test]
async fn embedded_sandbox_mode_serves_and_warns() {
    let run = MakeRun::new();
    let api = run.start(&[]).await;
    assert!(api.log().contains("NO REAL MONEY MOVES"), "{}", api.log());
    // With the sandbox the jobs run in-process: the first passes run at start.
    assert!(
        api.wait_for_log(&["reap pass", "prune pass"]).await,
        "the reaper and pruner run in-process:\n{}",
        api.log()
    );
    let token = mint("cus_embedded").await;
    let key = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        post(&api, &token, &key, &charge_body(100, "tok_visa"))
            .await
            .status(),
        201
    );
    let declined = post(
        &api,
        &token,
        &uuid::Uuid::new_v4().to_string(),
        &charge_body(100, "tok_chargeDeclined"),
    )
    .await;
    assert_eq!(declined.status(), 402);
    drop(api);
}

/// Dangerous or inconsistent settings stop the server before it serves,
/// with a message that names the setting.
#[tokio::test]
async fn bad_configuration_is_refused_at_start() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "JWT_HS256_SECRET"),
        (
            &[
                ("JWT_HS256_SECRET", DEV_JWT_SECRET),
                ("LEASE", "5s"),
                ("GATEWAY_TIMEOUT", "10s"),
            ],
            "LEASE",
        ),
        (
            &[("JWT_HS256_SECRET", DEV_JWT_SECRET), ("LEASE", "five")],
            "five",
        ),
        (
            &[
                ("JWT_HS256_SECRET", DEV_JWT_SECRET),
                ("GATEWAY_URL", "https://api.stripe.example"),
                ("GATEWAY_SECRET_KEY", "sk_live_x"),
            ],
            "development",
        ),
        (
            &[
                ("JWT_HS256_SECRET", DEV_JWT_SECRET),
                ("DATABASE_URL", "mongodb://x"),
            ],
            "unsupported",
        ),
        (
            &[
                ("JWT_HS256_SECRET", "0123456789abcdef0123456789abcdef-x"),
                ("GATEWAY_URL", "https://api.stripe.example"),
                ("GATEWAY_SECRET_KEY", "sk_test_x"),
            ],
            "PROVIDER_KEY_SECRET must be set with a real GATEWAY_URL",
        ),
        (
            &[
                ("JWT_HS256_SECRET", "0123456789abcdef0123456789abcdef-x"),
                ("GATEWAY_URL", "https://api.stripe.example"),
                ("GATEWAY_SECRET_KEY", "sk_test_x"),
                ("PROVIDER_KEY_SECRET", "short"),
            ],
            "PROVIDER_KEY_SECRET must be at least 32 bytes",
        ),
        (
            &[
                ("JWT_HS256_SECRET", DEV_JWT_SECRET),
                ("SQLITE_WRITE_BATCH", "0"),
            ],
            "SQLITE_WRITE_BATCH must be at least 1",
        ),
        (
            &[
                ("JWT_HS256_SECRET", DEV_JWT_SECRET),
                ("RATE_LIMIT_PER_MINUTE", "30"),
                ("RATE_LIMIT_BURST", "0"),
            ],
            "RATE_LIMIT_BURST must be at least 1",
        ),
        (
            &[
                ("JWT_HS256_SECRET", DEV_JWT_SECRET),
                ("BACKOFFICE_RATE_LIMIT_PER_MINUTE", "30"),
                ("BACKOFFICE_RATE_LIMIT_BURST", "0"),
            ],
            "BACKOFFICE_RATE_LIMIT_BURST must be at least 1",
        ),
        (
            &[
                ("JWT_HS256_SECRET", DEV_JWT_SECRET),
                ("JWT_AUDIENCE", "payments"),
                ("JWT_BACKOFFICE_AUDIENCE", "payments"),
            ],
            "must differ from JWT_AUDIENCE",
        ),
    ];
    for (env, needle) in cases {
        let mut env = env.to_vec();
        env.push(("LISTEN_ADDR", "127.0.0.1:0"));
        env.push(("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"));
        if !env.iter().any(|(k, _)| *k == "DATABASE_URL") {
            env.push(("DATABASE_URL", "sqlite::memory:"));
        }
        let (ok, _, stderr) = run_binary("payments-api", &[], &env).await;
        assert!(!ok, "{env:?} must be refused");
        assert!(
            stderr.contains(needle),
            "{env:?}: expected {needle:?} in:\n{stderr}"
        );
    }
}

/// A database server that is not listening is said at once, by address,
/// by both binaries: "connection refused at HOST:PORT", not "pool timed out
/// while waiting for an open connection" after the acquire timeout (30 s
/// here, so the old behaviour fails on its message).
#[tokio::test]
async fn a_database_that_refuses_connections_is_named_at_once() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    for (scheme, backend) in [("postgres", "PostgreSQL"), ("mysql", "MySQL/MariaDB")] {
        let url = format!("{scheme}://root@127.0.0.1:{port}/payments");
        let env = [
            ("DATABASE_URL", url.as_str()),
            ("DATABASE_ACQUIRE_TIMEOUT", "30s"),
            ("JWT_HS256_SECRET", DEV_JWT_SECRET),
            ("LISTEN_ADDR", "127.0.0.1:0"),
            ("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"),
        ];
        let expected =
            format!("cannot connect to {backend}: connection refused at 127.0.0.1:{port}");
        for (binary, args) in [
            ("payments-api", &[][..]),
            ("payments-jobs", &["prune", "--once"][..]),
        ] {
            let (ok, _, stderr) = run_binary(binary, args, &env).await;
            assert!(!ok, "{binary} started on {url}");
            assert!(
                stderr.contains(&expected),
                "{binary}: expected {expected:?} in:\n{stderr}"
            );
            assert!(!stderr.contains("pool timed out"), "{binary}:\n{stderr}");
        }
    }
}

/// A typo in a SQLite path creates a new, empty database: the server says
/// so, with the absolute path, once (not when it finds the file).
#[tokio::test]
async fn a_new_sqlite_database_is_announced_with_its_path() {
    let dir = std::env::temp_dir().join(format!("payments-new-{}", uuid::Uuid::new_v4().simple()));
    let file = dir.join("typo").join("payments.db");
    let url = format!("sqlite://{}", file.display());
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"),
        ("JWT_HS256_SECRET", DEV_JWT_SECRET),
    ];
    let needle = "no SQLite database at DATABASE_URL's path: creating a new, empty one";
    let first = Process::start("payments-api", &[], &env).await;
    let log = first.log();
    let shown = file.display().to_string();
    assert!(log.contains(needle) && log.contains(&shown), "{log}");
    first.stop().await.unwrap();
    let again = Process::start("payments-api", &[], &env).await;
    assert!(!again.log().contains(needle), "{}", again.log());
    again.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
    // An in-memory database is new by nature: no file, no warning (sqlx
    // names it after a file that does not exist).
    let memory = [
        ("DATABASE_URL", "sqlite::memory:"),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"),
        ("JWT_HS256_SECRET", DEV_JWT_SECRET),
    ];
    let in_memory = Process::start("payments-api", &[], &memory).await;
    assert!(!in_memory.log().contains(needle), "{}", in_memory.log());
    in_memory.stop().await.unwrap();
}

/// Two API processes on one database, concurrent same-key requests sent
/// alternately to both: the database arbitrates, one charge.
async fn two_api_processes_share_one_database(backend: Backend) {
    let Some(db) = TestDb::new(backend, 1).await else {
        return;
    };
    let sandbox = Process::start(
        "payments-sandbox",
        &["--listen", "127.0.0.1:0", "--latency-ms", "300"],
        &[],
    )
    .await;
    let env = api_env(&db, &sandbox, &[]);
    let apis = std::sync::Arc::new([
        Process::start("payments-api", &[], &env).await,
        Process::start("payments-api", &[], &env).await,
    ]);
    let token = mint("cus_two").await;
    let key = uuid::Uuid::new_v4().to_string();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (apis, token, key, barrier) =
                (apis.clone(), token.clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                post(&apis[i % 2], &token, &key, &charge_body(4900, "tok_visa"))
                    .await
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 409),
        "{statuses:?}"
    );
    assert!(statuses.contains(&201));
    let charges: Value = sandbox_json(&sandbox, "/_sandbox/charges").await;
    assert_eq!(
        charges["data"].as_array().unwrap().len(),
        1,
        "one charge at the provider"
    );
    assert_eq!(db.charges().await, 1, "one charges row");
    // Both processes replay the same answer afterwards.
    for api in apis.iter() {
        let replay = post(api, &token, &key, &charge_body(4900, "tok_visa")).await;
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replay"], "true");
    }
}

backend_tests!(two_api_processes_share_one_database);

/// SIGTERM drains: a charge in flight when the signal arrives completes
/// with its 201, then the process exits 0.
#[tokio::test]
async fn sigterm_drains_in_flight_requests() {
    let Some(db) = TestDb::new(Backend::Sqlite, 1).await else {
        return;
    };
    let sandbox = Process::start(
        "payments-sandbox",
        &["--listen", "127.0.0.1:0", "--latency-ms", "1000"],
        &[],
    )
    .await;
    let mut api = Process::start(
        "payments-api",
        &[],
        &[
            ("DATABASE_URL", &db.url),
            ("LISTEN_ADDR", "127.0.0.1:0"),
            ("GATEWAY_URL", &sandbox.url),
            ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
            ("JWT_HS256_SECRET", DEV_JWT_SECRET),
        ],
    )
    .await;
    let token = mint("cus_drain").await;
    let in_flight = {
        let (url, token) = (api.url.clone(), token.clone());
        tokio::spawn(async move {
            Process::detached(url)
                .post_charge(
                    &token,
                    &uuid::Uuid::new_v4().to_string(),
                    &charge_body(100, "tok_visa"),
                )
                .await
                .map(|r| r.status().as_u16())
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let status = api.terminate(std::time::Duration::from_secs(10)).await;
    assert_eq!(
        in_flight.await.unwrap().unwrap(),
        201,
        "the in-flight charge completed"
    );
    assert!(status.success(), "{status}");
    assert_eq!(db.charges_with_status("succeeded").await, 1);
}

/// Issue 26, first step: `payments-api token` mints a development token for
/// a subject that is not a customer, carrying scopes in a `scope` claim,
/// which the server accepts; a scope this server does not know is refused
/// by name (a typo would otherwise mint a token without it).
#[tokio::test]
async fn development_tokens_carry_scopes() {
    let secret = [("JWT_HS256_SECRET", DEV_JWT_SECRET)];
    let (ok, stdout, stderr) = run_binary(
        "payments-api",
        &[
            "token",
            "--subject",
            "ops_bob",
            "--scope",
            "refunds:write charges:read_all",
        ],
        &secret,
    )
    .await;
    assert!(ok, "{stderr}");
    let token = stdout.trim();
    let claims = jsonwebtoken::decode::<Value>(
        token,
        &jsonwebtoken::DecodingKey::from_secret(DEV_JWT_SECRET.as_bytes()).expect("key"),
        &jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256),
    )
    .expect("a token signed with the development secret")
    .claims;
    assert_eq!(claims["sub"], "ops_bob");
    assert_eq!(claims["scope"], "refunds:write charges:read_all");

    let (ok, _, stderr) = run_binary(
        "payments-api",
        &["token", "--customer", "cus_a", "--scope", "refund:write"],
        &secret,
    )
    .await;
    assert!(!ok);
    assert!(
        stderr.contains(r#"--scope "refund:write" is not one of this server's"#),
        "{stderr}"
    );

    // The server accepts the scoped token.
    let env = [
        ("DATABASE_URL", "sqlite::memory:"),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"),
        ("JWT_HS256_SECRET", DEV_JWT_SECRET),
    ];
    let api = Process::start("payments-api", &[], &env).await;
    let listed = reqwest::Client::new()
        .get(format!("{}/api/charges", api.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    api.stop().await.unwrap();
}
