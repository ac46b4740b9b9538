//! Bearer tokens against the real `payments-api` binary: which tokens are
//! accepted under which JWT_* settings, the RFC 6750 challenge on every 401,
//! the reason in the log (never the token); keys from an identity provider's
//! JWK set (a JWKS server on loopback, keys generated per run): rotation,
//! ES256, unknown keys, the refresh rate limit, algorithm confusion; and the
//! start-up refusals of a GATEWAY_URL that hides its host or a development
//! secret next to a real provider.
//!
//! The probe is `GET /api/charges/ch_x`: 404 for an authenticated caller
//! (no such charge), 401 otherwise.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
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

/// An API process that verifies tokens with JWT_HS256_SECRET and `settings`.
async fn start(settings: &[(&str, &str)]) -> Api {
    let mut env = vec![("JWT_HS256_SECRET", SECRET)];
    env.extend_from_slice(settings);
    start_keyless(&env).await
}

/// An API process with no JWT key but the one in `settings`.
async fn start_keyless(settings: &[(&str, &str)]) -> Api {
    let dir = std::env::temp_dir().join(format!(
        "payments-e2e-auth-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let url = format!("sqlite://{}/payments.db", dir.display());
    let mut env = vec![
        ("DATABASE_URL", url.as_str()),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"),
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

// ---------------------------------------------------------------------------
// JWT_JWKS_URL: an identity provider's JWK set.

/// A signing key of the test "identity provider", generated once per run.
struct TestKey {
    kid: &'static str,
    algorithm: Algorithm,
    private: EncodingKey,
    /// The public half as the provider publishes it.
    jwk: Value,
}

impl TestKey {
    fn new(kid: &'static str, algorithm: Algorithm, private: EncodingKey) -> Self {
        let mut jwk = Jwk::from_encoding_key(&private, algorithm).expect("a public JWK");
        jwk.common.key_id = Some(kid.to_owned());
        jwk.common.public_key_use = Some(PublicKeyUse::Signature);
        let jwk = serde_json::to_value(jwk).expect("JSON");
        Self {
            kid,
            algorithm,
            private,
            jwk,
        }
    }

    /// RSA 3072 (rsa's default size), RS256.
    fn rsa(kid: &'static str) -> Self {
        use rsa::Generate as _;
        use rsa::pkcs1::EncodeRsaPrivateKey as _;
        let private = rsa::PrivateKey::generate();
        let der = private.to_pkcs1_der().expect("PKCS#1 DER");
        Self::new(
            kid,
            Algorithm::RS256,
            EncodingKey::from_rsa_der(der.as_bytes()),
        )
    }

    /// P-256, ES256.
    fn p256(kid: &'static str) -> Self {
        use p256::elliptic_curve::Generate as _;
        use p256::pkcs8::EncodePrivateKey as _;
        let private = p256::SecretKey::generate();
        let der = private.to_pkcs8_der().expect("PKCS#8 DER");
        Self::new(
            kid,
            Algorithm::ES256,
            EncodingKey::from_ec_der(der.as_bytes()),
        )
    }

    /// A token for `claims` with this key's algorithm and `kid`.
    fn sign(&self, claims: &Value) -> String {
        self.sign_as(self.algorithm, Some(self.kid), claims)
    }

    /// A token with this key's signature under any header.
    fn sign_as(&self, algorithm: Algorithm, kid: Option<&str>, claims: &Value) -> String {
        let header = Header {
            kid: kid.map(str::to_owned),
            ..Header::new(algorithm)
        };
        jsonwebtoken::encode(&header, claims, &self.private).expect("sign")
    }
}

/// The provider's keys: two RSA keys (the current one and its successor)
/// and a P-256 key.
struct ProviderKeys {
    a: TestKey,
    b: TestKey,
    ec: TestKey,
}

static KEYS: LazyLock<ProviderKeys> = LazyLock::new(|| ProviderKeys {
    a: TestKey::rsa("a"),
    b: TestKey::rsa("b"),
    ec: TestKey::p256("ec"),
});

/// A JWKS endpoint on loopback: serves the keys last published (or 503 while
/// failing), and counts the requests it answers.
struct JwksServer {
    url: String,
    set: Arc<Mutex<Value>>,
    failing: Arc<AtomicBool>,
    fetches: Arc<AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl JwksServer {
    async fn start(keys: &[&TestKey]) -> Self {
        let set = Arc::new(Mutex::new(Self::jwk_set(keys)));
        let failing = Arc::new(AtomicBool::new(false));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (s, f, n) = (set.clone(), failing.clone(), fetches.clone());
        let app = axum::Router::new().route(
            "/.well-known/jwks.json",
            axum::routing::get(move || async move {
                n.fetch_add(1, Ordering::SeqCst);
                if f.load(Ordering::SeqCst) {
                    return Err(axum::http::StatusCode::SERVICE_UNAVAILABLE);
                }
                Ok(axum::Json(s.lock().unwrap().clone()))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/.well-known/jwks.json",
            listener.local_addr().unwrap()
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            url,
            set,
            failing,
            fetches,
            _stop: stop,
        }
    }

    fn jwk_set(keys: &[&TestKey]) -> Value {
        json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() })
    }

    /// From now on the set holds exactly `keys`.
    fn publish(&self, keys: &[&TestKey]) {
        *self.set.lock().unwrap() = Self::jwk_set(keys);
    }

    fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// Waits (up to 30 s) until the set has been requested `n` times.
    async fn wait_for_fetches(&self, n: usize) {
        for _ in 0..1500 {
            if self.fetches() >= n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the JWK set was fetched {} times, not {n}", self.fetches());
    }
}

/// An API process whose keys come from `jwks`, with `settings`.
async fn start_jwks(jwks: &JwksServer, settings: &[(&str, &str)]) -> Api {
    let mut env = vec![("JWT_JWKS_URL", jwks.url.as_str())];
    env.extend_from_slice(settings);
    start_keyless(&env).await
}

fn claims(sub: &str) -> Value {
    json!({"sub": sub, "exp": now() + 600, "iat": now(), "iss": ISSUER, "aud": AUDIENCE})
}

/// A token with an unknown `kid` makes the server fetch the set again: the
/// provider's next key is accepted as soon as it is published, and a known
/// `kid` costs no fetch. Issuer and audience are checked as with any key.
#[tokio::test]
async fn a_new_kid_is_fetched_on_first_sight() {
    let keys = &*KEYS;
    let jwks = JwksServer::start(&[&keys.a]).await;
    let api = start_jwks(
        &jwks,
        &[
            ("JWT_JWKS_MIN_REFRESH", "0s"),
            ("JWT_ISSUER", ISSUER),
            ("JWT_AUDIENCE", AUDIENCE),
        ],
    )
    .await;
    // Fetched once, before serving.
    assert_eq!(jwks.fetches(), 1);
    accepted(&api, &keys.a.sign(&claims("cus_a")), "a token of key a").await;
    assert_eq!(jwks.fetches(), 1, "a known kid needs no fetch");

    // The provider publishes its next key; the first token signed with it
    // brings it in.
    jwks.publish(&[&keys.a, &keys.b]);
    let b = keys.b.sign(&claims("cus_b"));
    accepted(&api, &b, "a token of the new key b").await;
    assert_eq!(jwks.fetches(), 2, "one fetch for the unknown kid");
    accepted(
        &api,
        &keys.a.sign(&claims("cus_a")),
        "key a, still published",
    )
    .await;
    accepted(&api, &b, "key b again").await;
    assert_eq!(jwks.fetches(), 2);

    let mut other_audience = claims("cus_b");
    other_audience["aud"] = json!("another-api");
    let other_audience = keys.b.sign(&other_audience);
    refused(&api, &other_audience, "wrong audience", "key b, wrong aud").await;
    assert!(
        api.process
            .wait_for_log(&["JWKS keys loaded", r#"kids=["a", "b"]"#])
            .await,
        "{}",
        api.process.log()
    );
    assert_no_token_in_log(&api, &[&b, &other_audience]);
}

/// The provider rotates: it publishes key b and drops key a. After the next
/// scheduled refresh (JWT_JWKS_REFRESH, 1 s here) key a's tokens are refused
/// and key b's accepted.
#[tokio::test]
async fn a_key_the_provider_drops_is_refused_after_the_next_refresh() {
    let keys = &*KEYS;
    let jwks = JwksServer::start(&[&keys.a]).await;
    let api = start_jwks(
        &jwks,
        &[("JWT_JWKS_REFRESH", "1s"), ("JWT_JWKS_MIN_REFRESH", "1s")],
    )
    .await;
    let a = keys.a.sign(&claims("cus_a"));
    accepted(&api, &a, "key a before the rotation").await;

    jwks.publish(&[&keys.b]);
    // A fetch that started after the publication has finished once the
    // next one starts (fetches never overlap).
    let seen = jwks.fetches();
    jwks.wait_for_fetches(seen + 2).await;
    refused(&api, &a, "unknown key", "key a after the rotation").await;
    accepted(
        &api,
        &keys.b.sign(&claims("cus_b")),
        "key b after the rotation",
    )
    .await;
    assert_no_token_in_log(&api, &[&a]);
}

/// An ES256 (P-256) key of the set verifies ES256 tokens.
#[tokio::test]
async fn es256_keys_of_the_set_verify_es256_tokens() {
    let keys = &*KEYS;
    let jwks = JwksServer::start(&[&keys.a, &keys.ec]).await;
    let api = start_jwks(&jwks, &[]).await;
    accepted(&api, &keys.ec.sign(&claims("cus_ec")), "an ES256 token").await;
    accepted(&api, &keys.a.sign(&claims("cus_rs")), "an RS256 token").await;
}

/// Tokens no published key signed are refused with the challenge: an
/// unknown `kid`, a known `kid` over another key's signature, no `kid`.
#[tokio::test]
async fn tokens_of_unknown_keys_are_refused() {
    let keys = &*KEYS;
    let jwks = JwksServer::start(&[&keys.a]).await;
    let api = start_jwks(&jwks, &[("JWT_JWKS_MIN_REFRESH", "0s")]).await;
    let unknown = keys.b.sign(&claims("cus_x"));
    refused(&api, &unknown, "unknown key", "a kid the set does not hold").await;
    let forged = keys
        .b
        .sign_as(Algorithm::RS256, Some("a"), &claims("cus_x"));
    refused(&api, &forged, "bad signature", "kid a, signed by key b").await;
    // Even with a single key in the set (see docs/design-decisions.md).
    let kidless = keys.a.sign_as(Algorithm::RS256, None, &claims("cus_x"));
    refused(&api, &kidless, "no kid", "a token without kid").await;
    let expired = keys.a.sign(&json!({"sub": "cus_x", "exp": now() - 3600}));
    refused(&api, &expired, "expired", "an expired token of key a").await;
    assert_no_token_in_log(&api, &[&unknown, &forged, &kidless, &expired]);
}

/// 50 tokens with made-up `kid`s at once: each is refused, and the
/// provider sees at most one more fetch than the one at start (the default
/// JWT_JWKS_MIN_REFRESH is 30 s).
#[tokio::test]
async fn a_flood_of_unknown_kids_cannot_hammer_the_provider() {
    let keys = &*KEYS;
    let jwks = JwksServer::start(&[&keys.a]).await;
    let api = start_jwks(&jwks, &[]).await;
    assert_eq!(jwks.fetches(), 1);
    let client = reqwest::Client::new();
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let kid = uuid::Uuid::new_v4().to_string();
        let token = keys
            .a
            .sign_as(Algorithm::RS256, Some(&kid), &claims("cus_flood"));
        let request = client
            .get(format!("{}/api/charges/ch_x", api.process.url))
            .bearer_auth(token);
        flood.spawn(async move {
            let response = request.send().await.unwrap();
            let challenge = response.headers().get("www-authenticate").cloned();
            (response.status().as_u16(), challenge)
        });
    }
    while let Some(answer) = flood.join_next().await {
        let (status, challenge) = answer.unwrap();
        assert_eq!(status, 401);
        assert_eq!(
            challenge.as_ref().map(|v| v.to_str().unwrap()),
            Some(r#"Bearer error="invalid_token""#)
        );
    }
    let fetches = jwks.fetches();
    assert!(fetches <= 2, "50 unknown kids caused {fetches} fetches");
    // The real key still works.
    accepted(
        &api,
        &keys.a.sign(&claims("cus_a")),
        "key a after the flood",
    )
    .await;
}

/// The algorithm comes from the key, never from the token's header alone:
/// an HS256 token "signed" with the RSA key's public modulus, an ES256
/// header over an RSA key's `kid` (and the reverse), and `alg: none`.
#[tokio::test]
async fn the_key_decides_the_algorithm() {
    let keys = &*KEYS;
    let jwks = JwksServer::start(&[&keys.a, &keys.ec]).await;
    let api = start_jwks(&jwks, &[]).await;
    let modulus = keys.a.jwk["n"].as_str().unwrap();
    let hmac = EncodingKey::from_secret(modulus.as_bytes()).unwrap();
    let header = Header {
        kid: Some("a".into()),
        ..Header::new(Algorithm::HS256)
    };
    let confused = jsonwebtoken::encode(&header, &claims("cus_x"), &hmac).unwrap();
    refused(&api, &confused, "wrong algorithm", "HS256 over an RSA key").await;
    let es_over_rsa = keys
        .ec
        .sign_as(Algorithm::ES256, Some("a"), &claims("cus_x"));
    refused(&api, &es_over_rsa, "wrong algorithm", "ES256 with kid a").await;
    let rs_over_ec = keys
        .a
        .sign_as(Algorithm::RS256, Some("ec"), &claims("cus_x"));
    refused(&api, &rs_over_ec, "wrong algorithm", "RS256 with kid ec").await;
    // `{"alg":"none","kid":"a"}`, base64url, over the claims of a real token.
    let payload = confused.split('.').nth(1).unwrap();
    let none = format!("eyJhbGciOiJub25lIiwia2lkIjoiYSJ9.{payload}.");
    refused(&api, &none, "malformed token", "alg none").await;
    assert_eq!(jwks.fetches(), 1, "no fetch for any of them");
    assert_no_token_in_log(&api, &[&confused, &es_over_rsa, &rs_over_ec]);
}

/// The provider is down when the server starts: it serves anyway, warns,
/// refuses tokens, and accepts them once a fetch succeeds.
#[tokio::test]
async fn the_server_starts_without_keys_and_takes_them_when_they_come() {
    let keys = &*KEYS;
    let jwks = JwksServer::start(&[&keys.a]).await;
    jwks.fail(true);
    let api = start_jwks(&jwks, &[("JWT_JWKS_MIN_REFRESH", "0s")]).await;
    assert!(
        api.process.log().contains("no JWKS keys yet"),
        "{}",
        api.process.log()
    );
    let a = keys.a.sign(&claims("cus_a"));
    refused(&api, &a, "no JWKS keys", "a token before any key").await;
    let ready = reqwest::get(format!("{}/readyz", api.process.url))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "readiness does not wait for keys");
    jwks.fail(false);
    // The server keeps trying (every second here).
    assert!(
        api.process.wait_for_log(&["JWKS keys loaded"]).await,
        "the keys never came:\n{}",
        api.process.log()
    );
    accepted(&api, &a, "the token once the provider answers").await;
}

/// JWT_JWKS_URL with another key source, or over plain http to another
/// host, stops the server before it serves.
#[tokio::test]
async fn jwks_settings_are_checked_at_start() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[
                ("JWT_JWKS_URL", "https://idp.example/jwks"),
                ("JWT_HS256_SECRET", SECRET),
            ],
            "JWT_HS256_SECRET, JWT_JWKS_URL",
        ),
        (
            &[("JWT_JWKS_URL", "http://idp.example/jwks")],
            "must be https",
        ),
        (&[("JWT_JWKS_URL", "ftp://127.0.0.1/jwks")], "http(s)"),
        (
            &[
                ("JWT_JWKS_URL", "https://idp.example/jwks"),
                ("JWT_JWKS_MIN_REFRESH", "1h"),
            ],
            "JWT_JWKS_MIN_REFRESH",
        ),
    ];
    for (settings, needle) in cases {
        let mut env = vec![
            ("DATABASE_URL", "sqlite::memory:"),
            ("LISTEN_ADDR", "127.0.0.1:0"),
        ];
        env.extend_from_slice(settings);
        let (ok, _, stderr) = run_binary("payments-api", &[], &env).await;
        assert!(!ok, "{settings:?} must be refused");
        assert!(
            stderr.contains(needle),
            "{settings:?}: expected {needle:?} in:\n{stderr}"
        );
    }
}

/// An identity provider's JWKS URL answers directly. A redirect (here to
/// the real set on the same loopback host, which the configured-URL check
/// would have passed) is a fetch error logged with its target, and never
/// followed: only the configured URL is checked, so a followed redirect
/// could lead to plain http or to another host.
#[tokio::test]
async fn a_redirect_from_the_jwks_url_is_not_followed() {
    let keys = &*KEYS;
    let set = JwksServer::jwk_set(&[&keys.a]);
    let real_fetches = Arc::new(AtomicUsize::new(0));
    let n = real_fetches.clone();
    let app = axum::Router::new()
        .route(
            "/.well-known/jwks.json",
            axum::routing::get(|| async {
                (
                    axum::http::StatusCode::FOUND,
                    [(axum::http::header::LOCATION, "/moved/jwks.json")],
                )
            }),
        )
        .route(
            "/moved/jwks.json",
            axum::routing::get(move || async move {
                n.fetch_add(1, Ordering::SeqCst);
                axum::Json(set.clone())
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/.well-known/jwks.json",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let api = start_keyless(&[("JWT_JWKS_URL", url.as_str())]).await;
    let logged = api
        .process
        .wait_for_log(&["JWKS fetch failed", "/moved/jwks.json"])
        .await;
    assert!(
        logged,
        "the redirect is not logged with its target:\n{}",
        api.process.log()
    );
    let a = keys.a.sign(&claims("cus_a"));
    refused(
        &api,
        &a,
        "no JWKS keys",
        "a token whose set sits behind a redirect",
    )
    .await;
    assert_eq!(
        real_fetches.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
}

/// Scopes from an identity provider's tokens, end to end (issue 26): the
/// customers' API audience charges with `scope`; its tokens cannot refund,
/// even naming `refunds:write` in `scp`; the back office's audience
/// (JWT_BACKOFFICE_AUDIENCE), same issuer and keys, refunds that customer's
/// charge and lists it with `customer=`. A token of the back office's
/// audience from another issuer is refused.
#[tokio::test]
async fn scoped_jwks_tokens_act_by_role() {
    const BACK_OFFICE: &str = "payments-backoffice";
    let keys = &*KEYS;
    let jwks = JwksServer::start(&[&keys.a]).await;
    let api = start_jwks(
        &jwks,
        &[
            ("JWT_ISSUER", ISSUER),
            ("JWT_AUDIENCE", AUDIENCE),
            ("JWT_BACKOFFICE_AUDIENCE", BACK_OFFICE),
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", api.process.url);
    let mut customer = claims("cus_alice");
    customer["scope"] = json!("openid profile charges:write charges:read");
    let customer = keys.a.sign(&customer);
    let charged = http
        .post(url("/api/charges"))
        .bearer_auth(&customer)
        .header("idempotency-key", "jwks-charge")
        .json(&json!({"amount_cents": 2000, "currency": "GBP", "card_token": "tok_visa"}))
        .send()
        .await
        .unwrap();
    assert_eq!(charged.status(), 201);
    let charge: Value = charged.json().await.unwrap();
    let refund_url = url(&format!(
        "/api/charges/{}/refunds",
        charge["id"].as_str().unwrap()
    ));
    let refund = |token: String, key: &'static str| {
        let request = http
            .post(&refund_url)
            .bearer_auth(token)
            .header("idempotency-key", key)
            .json(&json!({"amount_cents": 500}));
        async move {
            let response = request.send().await.unwrap();
            let challenge = response
                .headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap().to_owned());
            (
                response.status().as_u16(),
                challenge,
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let mut asking = claims("cus_alice");
    asking["scp"] = json!(["refunds:write"]);
    let (status, challenge, body) = refund(keys.a.sign(&asking), "jwks-refund").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("insufficient_scope"))
    );
    assert_eq!(
        challenge.as_deref(),
        Some(r#"Bearer error="insufficient_scope", scope="refunds:write""#)
    );

    let mut office = claims("ops_bob");
    office["aud"] = json!(BACK_OFFICE);
    office["scp"] = json!("refunds:write charges:read_all");
    let office = keys.a.sign(&office);
    let (status, _, body) = refund(office.clone(), "jwks-refund").await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body["requested_by"],
        json!({"subject": "ops_bob", "role": "back_office"})
    );
    let listed = payments_tests::get_json(&url("/api/charges?customer=cus_alice"), &office).await;
    assert_eq!(listed["data"][0]["amount_refunded"], 500, "{listed}");

    let mut elsewhere = claims("ops_eve");
    elsewhere["aud"] = json!(BACK_OFFICE);
    elsewhere["iss"] = json!("https://other.example");
    elsewhere["scope"] = json!("refunds:write");
    refused(
        &api,
        &keys.a.sign(&elsewhere),
        "wrong issuer",
        "another issuer",
    )
    .await;
    assert!(
        api.process
            .wait_for_log(&["insufficient scope; answered 403", "scope=refunds:write"])
            .await,
        "{}",
        api.process.log()
    );
    assert_no_token_in_log(&api, &[&customer, &office]);
}
