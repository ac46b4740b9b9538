//! Bearer JWT authentication: `sub` is the customer id. HS256 with a shared
//! secret, or RS256 with the issuer's public key.

use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use payments_domain::charge::CustomerId;
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::config::{ConfigError, JwtKey};
use crate::error::ApiError;

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
}

/// Verifies bearer tokens.
#[derive(Clone)]
pub struct Authenticator {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("algorithms", &self.validation.algorithms)
            .finish()
    }
}

impl Authenticator {
    pub fn new(key: &JwtKey) -> Result<Self, ConfigError> {
        let (key, algorithm) = match key {
            JwtKey::Hs256(secret) => (
                DecodingKey::from_secret(secret.as_bytes())
                    .map_err(|e| ConfigError(format!("JWT_HS256_SECRET: {e}")))?,
                Algorithm::HS256,
            ),
            JwtKey::Rs256(pem) => (
                DecodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| {
                    ConfigError(format!(
                        "JWT_RS256_PUBLIC_KEY is not an RSA public key PEM: {e}"
                    ))
                })?,
                Algorithm::RS256,
            ),
        };
        // `exp` is required; only the configured algorithm is accepted.
        let validation = Validation::new(algorithm);
        Ok(Self { key, validation })
    }

    /// The customer a bearer token speaks for.
    pub fn verify(&self, token: &str) -> Result<CustomerId, ApiError> {
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|e| {
                tracing::debug!(error = %e, "rejected bearer token");
                ApiError::Unauthorized
            })?;
        CustomerId::parse(&data.claims.sub).map_err(|_| ApiError::Unauthorized)
    }
}

/// Mints an HS256 token for development (`payments-api token`) and tests.
pub fn mint_hs256(secret: &str, customer: &str, ttl: Duration) -> Result<String, ConfigError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let claims = Claims {
        sub: customer.to_owned(),
        exp: (now + ttl).as_secs(),
    };
    let key = EncodingKey::from_secret(secret.as_bytes())
        .map_err(|e| ConfigError(format!("JWT_HS256_SECRET: {e}")))?;
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key)
        .map_err(|e| ConfigError(format!("cannot sign token: {e}")))
}

/// The authenticated customer. Rejects with 401 `unauthorized`.
#[derive(Debug, Clone)]
pub struct Customer(pub CustomerId);

impl FromRequestParts<AppState> for Customer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or(ApiError::Unauthorized)?;
        state.auth.verify(token).map(Customer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIVATE: &str = include_str!("../tests/fixtures/jwt-rs256-private.pem");
    const PUBLIC: &str = include_str!("../tests/fixtures/jwt-rs256-public.pem");
    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn rs256_token(sub: &str, exp: u64) -> String {
        let key = EncodingKey::from_rsa_pem(PRIVATE.as_bytes()).expect("test key");
        jsonwebtoken::encode(
            &Header::new(Algorithm::RS256),
            &Claims {
                sub: sub.into(),
                exp,
            },
            &key,
        )
        .expect("sign")
    }

    fn in_an_hour() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() + 3600)
            .unwrap_or_default()
    }

    #[test]
    fn rs256_tokens_verify_with_the_public_key() {
        let auth = Authenticator::new(&JwtKey::Rs256(PUBLIC.to_owned())).expect("public key");
        let customer = auth
            .verify(&rs256_token("cus_rs", in_an_hour()))
            .expect("valid");
        assert_eq!(customer.as_str(), "cus_rs");
        assert!(
            auth.verify(&rs256_token("cus_rs", 1_000)).is_err(),
            "expired"
        );
        // An HS256 token signed with the public key text is the classic
        // algorithm-confusion forgery: refused.
        let forged = mint_hs256(PUBLIC, "cus_rs", Duration::from_secs(60)).expect("sign");
        assert!(auth.verify(&forged).is_err());
        assert!(Authenticator::new(&JwtKey::Rs256("-----BEGIN nonsense".into())).is_err());
    }

    #[test]
    fn hs256_tokens_verify_with_the_secret_only() {
        let auth = Authenticator::new(&JwtKey::Hs256(SECRET.to_owned())).expect("secret");
        let token = mint_hs256(SECRET, "cus_hs", Duration::from_secs(60)).expect("sign");
        assert_eq!(auth.verify(&token).expect("valid").as_str(), "cus_hs");
        let other = mint_hs256(
            "another-secret-another-secret-xx",
            "cus_hs",
            Duration::from_secs(60),
        )
        .expect("sign");
        assert!(auth.verify(&other).is_err());
        assert!(auth.verify("not.a.jwt").is_err());
        assert!(
            auth.verify(&rs256_token("cus_hs", in_an_hour())).is_err(),
            "wrong algorithm"
        );
        let empty_sub = mint_hs256(SECRET, "", Duration::from_secs(60)).expect("sign");
        assert!(auth.verify(&empty_sub).is_err());
    }
}
