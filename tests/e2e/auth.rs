//! Bearer tokens against the real `payments-api` binary: which tokens are
//! accepted under which JWT_* settings, the RFC 6750 challenge on every 401,
//! the reason in the log (never the token); and the start-up refusals of a
//! GATEWAY_URL that hides its host or a development secret next to a real
//! provider.
//!
//! The probe is `GET /api/charges/ch_x`: 404 for an authenticated caller
//! (no such charge), 401 otherwise.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use payments_api::config::DEV_JWT_SECRET;
use payments_tests::{Process, run_binary};
use serde_json::{Value, json};

const SECRET: &str = "e2e-auth-secret-0123456789abcdef0123456789";
const ISSUER: &str = "https://idp.example";
const AUDIENCE: &str = "payments-api";

/// An API process with its own SQLite database and sandbox.
struct Api {
    process: Process,
    dir: PathBuf,
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start(settings: &[(&str, &str)]) -> Api {
    let dir = std::env::temp_dir().join(format!(
        "payments-e2e-auth-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let url = format!("sqlite://{}/payments.db", dir.display());
    let mut env = vec![
        ("DATABASE_URL", url.as_str()),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"),
        ("JWT_HS256_SECRET", SECRET),
        ("WITH_JOBS", "false"),
    ];
    env.extend_from_slice(settings);
    let process = Process::start("payments-api", &[], &env).await;
    Api { process, dir }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap()
}

fn sign(claims: &Value, secret: &str) -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &key,
    )
    .unwrap()
}

fn token(claims: Value) -> String {
    sign(&claims, SECRET)
}

/// What the probe answered: status, `WWW-Authenticate`, body.
struct Answer {
    status: u16,
    challenge: Option<String>,
    body: Value,
}

async fn probe(api: &Api, authorization: Option<&str>) -> Answer {
    let mut request = reqwest::Client::new().get(format!("{}/api/charges/ch_x", api.process.url));
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        challenge,
        body,
    }
}

async fn accepted(api: &Api, token: &str, what: &str) {
    let answer = probe(api, Some(&format!("Bearer {token}"))).await;
    assert_eq!(
        answer.status, 404,
        "{what} must be accepted: {}",
        answer.body
    );
    assert_eq!(answer.challenge, None, "{what}");
}

/// Refused with 401, the envelope, the `invalid_token` challenge, and
/// `reason` on an INFO line of the log.
async fn refused(api: &Api, token: &str, reason: &str, what: &str) {
    let answer = probe(api, Some(&format!("Bearer {token}"))).await;
    assert_eq!(
        answer.status, 401,
        "{what} must be refused: {}",
        answer.body
    );
    assert_eq!(answer.body["error"]["code"], "unauthorized", "{what}");
    assert_eq!(
        answer.challenge.as_deref(),
        Some(r#"Bearer error="invalid_token""#),
        "{what}"
    );
    let needle = format!(r#"reason="{reason}""#);
    let logged = api.process.wait_for_log(&[&needle]).await;
    let log = api.process.log();
    assert!(logged, "{what}: {needle} not logged:\n{log}");
    assert!(
        log.lines()
            .any(|line| line.contains(&needle) && line.contains("INFO")),
        "{what}: {needle} not at info level:\n{log}"
    );
}

fn assert_no_token_in_log(api: &Api, tokens: &[&str]) {
    let log = api.process.log();
    for token in tokens {
        // The whole token, and its signature alone.
        let signature = token.rsplit('.').next().unwrap();
        assert!(
            !log.contains(token) && !log.contains(signature),
            "a token reached the log:\n{log}"
        );
    }
}

/// Default settings: `exp` required and at most 24 h ahead, `nbf` and `iat`
/// not in the future, 30 s leeway, `aud` and `iss` not checked.
#[tokio::test]
async fn tokens_are_validated_with_the_default_rules() {
    let api = start(&[]).await;
    let t = now();

    // `payments-api token` (24 h by default) is accepted.
    let (ok, minted, stderr) = run_binary(
        "payments-api",
        &["token", "--customer", "cus_cli"],
        &[("JWT_HS256_SECRET", SECRET)],
    )
    .await;
    assert!(ok, "token failed: {stderr}");
    let minted = minted.trim().to_owned();
    accepted(&api, &minted, "a `payments-api token` token").await;

    let valid = token(json!({"sub": "cus_a", "exp": t + 600}));
    accepted(&api, &valid, "a valid token").await;
    let with_aud = token(
        json!({"sub": "cus_a", "exp": t + 600, "aud": "some-client-id",
        "iss": "https://any.example", "iat": t, "nbf": t}),
    );
    accepted(&api, &with_aud, "an identity provider's token with aud").await;
    let within_leeway = token(json!({"sub": "cus_a", "exp": t - 5}));
    accepted(&api, &within_leeway, "a token expired within the leeway").await;

    let cases = [
        (
            token(json!({"sub": "cus_a", "exp": t - 300})),
            "expired",
            "an expired token",
        ),
        (
            token(json!({"sub": "cus_a", "exp": t + 600, "nbf": t + 300})),
            "not yet valid",
            "nbf in the future",
        ),
        (
            token(json!({"sub": "cus_a", "exp": t + 600, "iat": t + 300})),
            "issued in the future",
            "iat in the future",
        ),
        (
            token(json!({"sub": "cus_a", "exp": t + 365 * 24 * 3600})),
            "lifetime too long",
            "a token valid for a year",
        ),
        (
            token(json!({"sub": "cus_a"})),
            "missing exp",
            "a token without exp",
        ),
        (
            token(json!({"exp": t + 600})),
            "missing sub",
            "a token without sub",
        ),
        (
            sign(&json!({"sub": "cus_a", "exp": t + 600}), DEV_JWT_SECRET),
            "bad signature",
            "a token signed with another secret",
        ),
    ];
    for (bad, reason, what) in &cases {
        refused(&api, bad, reason, what).await;
    }
    refused(&api, "not-a-jwt", "malformed token", "garbage").await;

    // No credentials at all: the bare challenge (RFC 6750 section 3.1).
    let none = probe(&api, None).await;
    assert_eq!(none.status, 401);
    assert_eq!(none.body["error"]["code"], "unauthorized");
    assert_eq!(none.challenge.as_deref(), Some("Bearer"));
    assert!(
        api.process
            .wait_for_log(&[r#"reason="no credentials""#])
            .await
    );

    let mut tokens: Vec<&str> = cases.iter().map(|(t, _, _)| t.as_str()).collect();
    tokens.extend([valid.as_str(), with_aud.as_str(), minted.as_str()]);
    assert_no_token_in_log(&api, &tokens);
}

/// JWT_MAX_LIFETIME and JWT_LEEWAY are settings.
#[tokio::test]
async fn max_lifetime_and_leeway_are_settings() {
    let api = start(&[("JWT_MAX_LIFETIME", "1h"), ("JWT_LEEWAY", "0s")]).await;
    let t = now();
    accepted(
        &api,
        &token(json!({"sub": "cus_a", "exp": t + 1800})),
        "30 min ahead",
    )
    .await;
    let two_hours = token(json!({"sub": "cus_a", "exp": t + 7200}));
    refused(
        &api,
        &two_hours,
        "lifetime too long",
        "2 h ahead of a 1 h limit",
    )
    .await;
    let just_expired = token(json!({"sub": "cus_a", "exp": t - 5}));
    refused(&api, &just_expired, "expired", "expired 5 s ago, no leeway").await;
    assert_no_token_in_log(&api, &[&two_hours, &just_expired]);
}

/// With JWT_ISSUER and JWT_AUDIENCE set, `iss` must equal the issuer and
/// `aud` must contain the audience.
#[tokio::test]
async fn issuer_and_audience_are_checked_when_set() {
    let api = start(&[("JWT_ISSUER", ISSUER), ("JWT_AUDIENCE", AUDIENCE)]).await;
    let t = now();
    let claims = |iss: Option<&str>, aud: Option<Value>| {
        let mut claims = json!({"sub": "cus_idp", "exp": t + 600, "iat": t});
        if let Some(iss) = iss {
            claims["iss"] = json!(iss);
        }
        if let Some(aud) = aud {
            claims["aud"] = aud;
        }
        token(claims)
    };
    accepted(
        &api,
        &claims(Some(ISSUER), Some(json!(AUDIENCE))),
        "right iss and aud",
    )
    .await;
    accepted(
        &api,
        &claims(Some(ISSUER), Some(json!(["another-api", AUDIENCE]))),
        "aud containing the audience",
    )
    .await;
    let cases = [
        (
            claims(Some(ISSUER), Some(json!("another-api"))),
            "wrong audience",
            "wrong aud",
        ),
        (
            claims(Some(ISSUER), Some(json!(["another-api", "a-third"]))),
            "wrong audience",
            "aud list without the audience",
        ),
        (
            claims(Some("https://evil.example"), Some(json!(AUDIENCE))),
            "wrong issuer",
            "wrong iss",
        ),
        (claims(Some(ISSUER), None), "missing aud", "no aud"),
        (claims(None, Some(json!(AUDIENCE))), "missing iss", "no iss"),
    ];
    for (bad, reason, what) in &cases {
        refused(&api, bad, reason, what).await;
    }
    let tokens: Vec<&str> = cases.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_no_token_in_log(&api, &tokens);
}

/// A GATEWAY_URL whose host is hidden (user info, a backslash) is refused,
/// and so are the development JWT secret and the sandbox's key next to a
/// real host.
#[tokio::test]
async fn gateway_urls_that_hide_the_host_or_meet_dev_secrets_are_refused() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            DEV_JWT_SECRET,
            r"https://a.example\@localhost",
            "sk_live_x",
            "backslash",
        ),
        (
            SECRET,
            r"https://a.example\@localhost",
            "sk_live_x",
            "GATEWAY_URL",
        ),
        (
            DEV_JWT_SECRET,
            "https://user:pass@localhost",
            "sk_live_x",
            "user info",
        ),
        (
            DEV_JWT_SECRET,
            "https://api.example.com",
            "sk_live_x",
            "development",
        ),
        (
            DEV_JWT_SECRET,
            "https://localhost.example.com",
            "sk_live_x",
            "development",
        ),
        (
            SECRET,
            "https://api.example.com",
            "sk_test_sandbox",
            "sandbox",
        ),
        (SECRET, "ftp://localhost", "sk_live_x", "http"),
    ];
    for (secret, url, key, needle) in cases {
        let env = [
            ("DATABASE_URL", "sqlite::memory:"),
            ("LISTEN_ADDR", "127.0.0.1:0"),
            ("JWT_HS256_SECRET", *secret),
            ("GATEWAY_URL", *url),
            ("GATEWAY_SECRET_KEY", *key),
        ];
        let (ok, _, stderr) = run_binary("payments-api", &[], &env).await;
        assert!(!ok, "{url} with {secret}/{key} must be refused");
        assert!(
            stderr.contains(needle),
            "{url}: expected {needle:?} in:\n{stderr}"
        );
    }
}
