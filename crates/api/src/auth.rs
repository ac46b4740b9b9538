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
