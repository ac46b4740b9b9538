//! Issue 23, section 3, through the real binaries: where `GATEWAY_URL` may
//! point (item 3.5), a provider that refuses our secret key (3.6), and the
//! pinned `Stripe-Version` (3.7).

use payments_tests::{Backend, Process, TestDb, backend_tests, charge_body, run_binary};
use serde_json::Value;

use crate::{api_env, mint, post, sandbox_json};

/// Item 3.5: plain http to a host that is not loopback would send the
/// secret key in clear: both binaries refuse to start, naming GATEWAY_URL;
/// plain http to loopback starts.
#[tokio::test]
async fn plain_http_to_a_remote_provider_is_refused_at_start() {
    for url in ["http://api.stripe.com", "http://10.0.0.7:12111"] {
        let env = [
            ("DATABASE_URL", "sqlite::memory:"),
            ("LISTEN_ADDR", "127.0.0.1:0"),
            (
                "JWT_HS256_SECRET",
                "a-test-secret-of-at-least-32-bytes-0123",
            ),
            ("GATEWAY_URL", url),
            ("GATEWAY_SECRET_KEY", "sk_live_x"),
        ];
        let (ok, _, stderr) = run_binary("payments-api", &[], &env).await;
        assert!(!ok, "payments-api started with {url}");
        assert!(
            stderr.contains("GATEWAY_URL must be https (plain http only on loopback)"),
            "payments-api, {url}:\n{stderr}"
        );
        let (ok, _, stderr) = run_binary("payments-jobs", &["reap", "--once"], &env[..]).await;
        assert!(!ok, "payments-jobs started with {url}");
        assert!(
            stderr.contains("GATEWAY_URL must be https (plain http only on loopback)"),
            "payments-jobs, {url}:\n{stderr}"
        );
    }
    // Loopback http is accepted: a pass over an empty database succeeds.
    let env = [
        ("DATABASE_URL", "sqlite::memory:"),
        ("GATEWAY_URL", "http://127.0.0.1:9"),
        ("GATEWAY_SECRET_KEY", "sk_test_x"),
    ];
    let (ok, _, stderr) = run_binary("payments-jobs", &["reap", "--once"], &env).await;
    assert!(ok, "loopback http refused: {stderr}");
}

/// Items 3.6 and 3.7: the sandbox accepts only its `--secret-key`; the API
/// started with another key answers 500 `provider_misconfigured` (no
/// `Retry-After`, not stored), logs the refusal loudly, and leaves the
/// operation claimable; restarted with the right key, the same
/// Idempotency-Key charges exactly once. Every provider call carried the
/// `GATEWAY_STRIPE_VERSION` it was started with.
async fn a_refused_secret_key_then_the_fixed_one(backend: Backend) {
    let Some(db) = TestDb::new(backend, 1).await else {
        return;
    };
    let sandbox = Process::start(
        "payments-sandbox",
        &["--listen", "127.0.0.1:0", "--secret-key", "sk_test_right"],
        &[],
    )
    .await;
    let (ok, _, stderr) =
        run_binary("payments-api", &["migrate"], &[("DATABASE_URL", &db.url)]).await;
    assert!(ok, "migrate failed: {stderr}");
    let version = ("GATEWAY_STRIPE_VERSION", "2024-06-20");
    let wrong = [("GATEWAY_SECRET_KEY", "sk_test_wrong"), version];
    let api = Process::start("payments-api", &[], &api_env(&db, &sandbox, &wrong)).await;
    let token = mint("cus_key").await;
    let key = uuid::Uuid::new_v4().to_string();
    let body = charge_body(4900, "tok_visa");
    for _ in 0..2 {
        let refused = post(&api, &token, &key, &body).await;
        assert_eq!(refused.status(), 500);
        assert!(refused.headers().get("retry-after").is_none());
        assert!(refused.headers().get("idempotent-replay").is_none());
        let error: Value = refused.json().await.unwrap();
        assert_eq!(error["error"]["code"], "provider_misconfigured", "{error}");
    }
    assert_eq!(db.records_for_key(&key, "in_progress", None).await, 1);
    assert_eq!(db.charges_with_status("pending").await, 1);
    assert!(
        api.wait_for_log(&["PROVIDER REFUSED OUR SECRET KEY"]).await,
        "no loud log:\n{}",
        api.log()
    );
    api.stop().await.unwrap();

    let right = [("GATEWAY_SECRET_KEY", "sk_test_right"), version];
    let api = Process::start("payments-api", &[], &api_env(&db, &sandbox, &right)).await;
    let charged = post(&api, &token, &key, &body).await;
    assert_eq!(charged.status(), 201);
    assert!(charged.headers().get("idempotent-replay").is_none());
    let charges = sandbox_json(&sandbox, "/_sandbox/charges").await;
    assert_eq!(charges["data"].as_array().unwrap().len(), 1);
    assert_eq!(db.charges_with_status("succeeded").await, 1);

    let seen = sandbox_json(&sandbox, "/_sandbox/requests").await;
    let seen = seen["data"].as_array().unwrap();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for request in seen {
        assert_eq!(request["stripe_version"], "2024-06-20", "{request}");
    }
}

backend_tests!(a_refused_secret_key_then_the_fixed_one);

/// Section 5 of issue 25: a `GATEWAY_URL` on a closed port is said loudly
/// at start (WARN, naming GATEWAY_URL and why), while the server still
/// starts and reports ready: readiness does not depend on the provider, so
/// an outage does not take every replica out of the balancer. A provider
/// that answers is said too, and raises no warning.
#[tokio::test]
async fn an_unreachable_provider_is_named_at_start_and_readiness_stays() {
    let Some(db) = TestDb::new(Backend::Sqlite, 1).await else {
        panic!("SQLite is always available");
    };
    let closed = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", probe.local_addr().unwrap().port())
    };
    let closed_env = [
        ("DATABASE_URL", db.url.as_str()),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("GATEWAY_URL", closed.as_str()),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("JWT_HS256_SECRET", payments_api::config::DEV_JWT_SECRET),
    ];
    let api = Process::start("payments-api", &[], &closed_env).await;
    assert!(
        api.wait_for_log(&["PROVIDER UNREACHABLE AT START"]).await,
        "no warning:\n{}",
        api.log()
    );
    let warning = api
        .log()
        .lines()
        .find(|l| l.contains("PROVIDER UNREACHABLE AT START"))
        .unwrap()
        .to_owned();
    assert!(
        warning.contains("WARN") && warning.contains("GATEWAY_URL") && warning.contains(&closed),
        "{warning}"
    );
    let ready = reqwest::get(format!("{}/readyz", api.url)).await.unwrap();
    assert_eq!(
        ready.status(),
        200,
        "readiness does not depend on the provider"
    );
    drop(api);

    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let env = api_env(&db, &sandbox, &[]);
    let api = Process::start("payments-api", &[], &env).await;
    assert!(
        api.wait_for_log(&["the provider answers"]).await,
        "{}",
        api.log()
    );
    assert!(!api.log().contains("PROVIDER UNREACHABLE"), "{}", api.log());
    let requests = sandbox_json(&sandbox, "/_sandbox/requests").await;
    assert_eq!(
        requests["data"].as_array().map(Vec::len),
        Some(0),
        "the probe is no provider call: {requests}"
    );
}
