//! The identity provider's signing keys (`JWT_JWKS_URL`): a JWK set fetched
//! over HTTP, kept in memory, refreshed on a schedule and when a token names
//! a `kid` the set does not hold.
//!
//! - **Start-up**: `payments-api` fetches the set once before it serves. If
//!   that fails it serves anyway, logs a warning and keeps trying every
//!   [`JwksSettings::min_refresh`] (at least a second); tokens are refused
//!   (401) until a fetch succeeds. Readiness is unaffected.
//! - **Schedule**: every [`JwksSettings::refresh`]; after a failed fetch, the
//!   next one comes after `min_refresh`. A failed fetch keeps the keys of the
//!   last good one; a successful fetch replaces them all (a key the provider
//!   dropped is dropped here).
//! - **Unknown `kid`**: one fetch, then the lookup again. Fetches are
//!   serialised: tokens that arrive while one is in flight wait for it and
//!   share its result; and none starts within `min_refresh` of the previous
//!   one, so a flood of tokens with made-up `kid`s costs the provider at most
//!   one request per `min_refresh`.
//! - **Which keys**: RS256 (`kty: RSA`) and ES256 (`kty: EC`, `crv: P-256`)
//!   keys with a `kid`. The algorithm is the key's `alg`, or follows from its
//!   type when `alg` is absent; a key whose `alg` is anything else, or whose
//!   `use` is not `sig` (or whose `key_ops` lack `verify`), is ignored.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, KeyOperations, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::time::Instant;

use crate::config::{ConfigError, JwksSettings};

/// The largest JWK set read: providers publish a few keys, a few KiB.
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The shortest wait before retrying a failed fetch, whatever
/// `JWT_JWKS_MIN_REFRESH` says (it may be 0 in tests).
const MIN_RETRY: Duration = Duration::from_secs(1);

/// A public key and the one algorithm it verifies.
#[derive(Clone)]
pub struct VerifyingKey {
    pub key: DecodingKey,
    pub algorithm: Algorithm,
}

impl std::fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyingKey")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// The usable keys of one fetched set, by `kid`.
type KeySet = BTreeMap<String, Arc<VerifyingKey>>;

/// The JWK set cache. Share it in an `Arc`.
pub struct Jwks {
    settings: JwksSettings,
    client: reqwest::Client,
    keys: RwLock<Arc<KeySet>>,
    /// Held for the whole of a fetch, so fetches never overlap and a caller
    /// that waits here shares the fetch in flight. Holds when the last fetch
    /// started.
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
    /// Fetches finished: a caller that sees it change while it waits for
    /// `last_fetch` takes the answer of the fetch it waited for.
    fetches: AtomicU64,
}

impl std::fmt::Debug for Jwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwks")
            .field("settings", &self.settings)
            .field("kids", &self.current().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Why a fetch failed, for the log.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("answered {0}")]
    Status(reqwest::StatusCode),
    #[error(
        "answered {status} redirecting to {location:?}; redirects are not followed: set JWT_JWKS_URL to the URL that answers"
    )]
    Redirect {
        status: reqwest::StatusCode,
        location: String,
    },
    #[error("the answer is larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("not a JWK set: {0}")]
    Json(#[from] serde_json::Error),
}

impl Jwks {
    /// An empty cache; nothing is fetched until [`Self::refresh`] or a token.
    pub fn new(settings: JwksSettings) -> Result<Self, ConfigError> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .https_only(settings.url.scheme() == "https")
            // Only the configured URL was checked (https, or http on
            // loopback), and an identity provider's JWKS URL answers
            // directly: a redirect is a fetch error, logged with its target,
            // never followed (to plain http, or to another host).
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("payments/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ConfigError(format!("JWT_JWKS_URL: cannot build an HTTP client: {e}")))?;
        Ok(Self {
            settings,
            client,
            keys: RwLock::new(Arc::new(KeySet::new())),
            last_fetch: tokio::sync::Mutex::new(None),
            fetches: AtomicU64::new(0),
        })
    }

    /// The key named `kid`: from the cache, or after one fetch (shared with
    /// concurrent callers, and skipped within `min_refresh` of the last
    /// fetch). `Err` is the reason for the log.
    pub async fn key(&self, kid: &str) -> Result<Arc<VerifyingKey>, &'static str> {
        if let Some(key) = self.current().get(kid) {
            return Ok(Arc::clone(key));
        }
        let seen = self.fetches.load(Ordering::Acquire);
        {
            let mut last = self.last_fetch.lock().await;
            // A fetch finished while we waited: its answer is the one we
            // would get. Or one started recently: the cool-down.
            let shared = self.fetches.load(Ordering::Acquire) != seen;
            let cooling = last.is_some_and(|at| at.elapsed() < self.settings.min_refresh);
            if !shared && !cooling {
                *last = Some(Instant::now());
                self.fetch_and_store().await;
            }
        }
        match self.current().get(kid) {
            Some(key) => Ok(Arc::clone(key)),
            None if self.current().is_empty() => Err("no JWKS keys"),
            None => Err("unknown key"),
        }
    }

    /// Fetches the set now (after any fetch in flight). Whether it succeeded.
    pub async fn refresh(&self) -> bool {
        let mut last = self.last_fetch.lock().await;
        *last = Some(Instant::now());
        self.fetch_and_store().await
    }

    /// Fetches the set, then keeps it fresh in the background until the
    /// returned task is aborted. Serving goes on whether the first fetch
    /// succeeds or not.
    pub async fn start(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let mut ok = self.refresh().await;
        if !ok {
            tracing::warn!(
                url = %self.settings.url,
                "no JWKS keys yet: every bearer token is refused (401) until a fetch succeeds; \
                 retrying"
            );
        }
        let jwks = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let wait = if ok {
                    jwks.settings.refresh
                } else {
                    jwks.settings
                        .min_refresh
                        .clamp(MIN_RETRY, jwks.settings.refresh.max(MIN_RETRY))
                };
                tokio::time::sleep(wait).await;
                ok = jwks.refresh().await;
            }
        })
    }

    /// Whether the set holds `key` itself under `kid` now: a refresh makes
    /// every key anew, so a key dropped, replaced or merely fetched again
    /// is not held.
    pub fn holds(&self, kid: &str, key: &Arc<VerifyingKey>) -> bool {
        self.current()
            .get(kid)
            .is_some_and(|held| Arc::ptr_eq(held, key))
    }

    fn current(&self) -> Arc<KeySet> {
        let keys = self
            .keys
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&keys)
    }

    /// One fetch; on success the cache holds exactly the set's usable keys.
    /// Called with `last_fetch` held.
    async fn fetch_and_store(&self) -> bool {
        let fetched = self.fetch().await;
        self.fetches.fetch_add(1, Ordering::Release);
        let set = match fetched {
            Ok(set) => set,
            Err(e) => {
                tracing::warn!(url = %self.settings.url, error = %e,
                    "JWKS fetch failed; keeping the keys of the last good fetch");
                return false;
            }
        };
        let keys = Arc::new(usable_keys(&set));
        let previous = {
            let mut current = self
                .keys
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            std::mem::replace(&mut *current, Arc::clone(&keys))
        };
        // Logged once the keys are in use.
        if !keys.keys().eq(previous.keys()) {
            let kids: Vec<&str> = keys.keys().map(String::as_str).collect();
            let ignored = set.keys.len().saturating_sub(keys.len());
            tracing::info!(url = %self.settings.url, ?kids, ignored, "JWKS keys loaded");
        }
        if keys.is_empty() {
            tracing::warn!(url = %self.settings.url,
                "the JWK set holds no usable RS256 or ES256 signing key: every token is refused");
        }
        true
    }

    async fn fetch(&self) -> Result<JwkSet, FetchError> {
        let mut response = self
            .client
            .get(self.settings.url.clone())
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await?;
        if response.status().is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            return Err(FetchError::Redirect {
                status: response.status(),
                location,
            });
        }
        if !response.status().is_success() {
            return Err(FetchError::Status(response.status()));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(FetchError::TooLarge);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(FetchError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(serde_json::from_slice(&body)?)
    }
}

/// The keys of `set` a token may be verified with, by `kid`. The first of
/// two keys with one `kid` wins.
fn usable_keys(set: &JwkSet) -> KeySet {
    let mut keys = KeySet::new();
    for jwk in &set.keys {
        match usable(jwk) {
            Ok((kid, key)) => {
                keys.entry(kid).or_insert_with(|| Arc::new(key));
            }
            Err(reason) => {
                tracing::debug!(kid = jwk.common.key_id.as_deref(), reason, "JWK ignored");
            }
        }
    }
    keys
}

/// A JWK's `kid` and key, or why it is ignored.
fn usable(jwk: &Jwk) -> Result<(String, VerifyingKey), &'static str> {
    let kid = jwk.common.key_id.clone().ok_or("no kid")?;
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|u| *u != PublicKeyUse::Signature)
    {
        return Err("not a signing key (use)");
    }
    if jwk
        .common
        .key_operations
        .as_ref()
        .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
    {
        return Err("not a verifying key (key_ops)");
    }
    let algorithm = match (&jwk.algorithm, jwk.common.key_algorithm) {
        (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
        (AlgorithmParameters::EllipticCurve(ec), None | Some(KeyAlgorithm::ES256))
            if ec.curve == EllipticCurve::P256 =>
        {
            Algorithm::ES256
        }
        _ => return Err("neither an RS256 nor an ES256 key"),
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|_| "malformed key")?;
    Ok((kid, VerifyingKey { key, algorithm }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(keys: serde_json::Value) -> JwkSet {
        serde_json::from_value(serde_json::json!({ "keys": keys })).expect("a JWK set")
    }

    // Public values from RFC 7517 appendix A.1 (shortened `n` is fine:
    // nothing is verified here).
    const N: &str = "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw";
    const X: &str = "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU";
    const Y: &str = "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0";

    #[test]
    fn only_rs256_and_p256_signing_keys_with_a_kid_are_used() {
        let keys = usable_keys(&set(serde_json::json!([
            {"kid": "rsa", "kty": "RSA", "n": N, "e": "AQAB"},
            {"kid": "rsa-alg", "kty": "RSA", "alg": "RS256", "use": "sig", "n": N, "e": "AQAB"},
            {"kid": "ec", "kty": "EC", "crv": "P-256", "x": X, "y": Y},
            {"kid": "ec-alg", "kty": "EC", "crv": "P-256", "alg": "ES256", "x": X, "y": Y},
            {"kty": "RSA", "n": N, "e": "AQAB"},
            {"kid": "enc", "kty": "RSA", "use": "enc", "n": N, "e": "AQAB"},
            {"kid": "ops", "kty": "RSA", "key_ops": ["encrypt"], "n": N, "e": "AQAB"},
            {"kid": "ps", "kty": "RSA", "alg": "PS256", "n": N, "e": "AQAB"},
            {"kid": "rsa-as-ec", "kty": "RSA", "alg": "ES256", "n": N, "e": "AQAB"},
            {"kid": "p384", "kty": "EC", "crv": "P-384", "x": X, "y": Y},
            {"kid": "hmac", "kty": "oct", "k": "c2VjcmV0"},
            {"kid": "okp", "kty": "OKP", "crv": "Ed25519", "x": X},
            {"kid": "odd", "kty": "something-new"}
        ])));
        let algorithms: Vec<(&str, Algorithm)> = keys
            .iter()
            .map(|(kid, key)| (kid.as_str(), key.algorithm))
            .collect();
        assert_eq!(
            algorithms,
            [
                ("ec", Algorithm::ES256),
                ("ec-alg", Algorithm::ES256),
                ("rsa", Algorithm::RS256),
                ("rsa-alg", Algorithm::RS256),
            ]
        );
    }

    #[test]
    fn the_first_key_of_a_kid_wins() {
        let keys = usable_keys(&set(serde_json::json!([
            {"kid": "k", "kty": "EC", "crv": "P-256", "x": X, "y": Y},
            {"kid": "k", "kty": "RSA", "n": N, "e": "AQAB"}
        ])));
        assert_eq!(keys.len(), 1);
        assert_eq!(keys["k"].algorithm, Algorithm::ES256);
    }
}
