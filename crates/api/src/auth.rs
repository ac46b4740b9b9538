//! Bearer JWT authentication: `sub` is the customer id. HS256 with a shared
//! secret, RS256 or ES256 with the issuer's public key, or the RS256 and
//! ES256 keys of an identity provider's JWK set ([`crate::jwks`]).
//!
//! A token is accepted when its signature verifies with the configured
//! algorithm (with a JWK set: the token's `kid` names the key, and the key
//! decides the algorithm; the header's `alg` must be that one), `exp` is present and not past, `exp` is at most
//! [`JwtRules::max_lifetime`] ahead, `nbf` (when present) is not in the
//! future, `iat` (when present) is not in the future, and, when configured,
//! `iss` equals the issuer and `aud` contains the audience. Clock checks allow
//! [`JwtRules::leeway`]. The reason for a refusal is logged at info level; the
//! token never is.
//!
//! A token that was accepted is remembered ([`Verified`]) by its SHA-256,
//! never its text, for at most [`VERIFIED_FOR`] and never past its `exp`:
//! an app sends the same token with every request, and its next request
//! then skips the signature and the claims' parse (8% of a replay's CPU in
//! issue 31's profile). What it remembered is the verdict of the same
//! checks on the same bytes with the same key, so it changes nothing a
//! client can see: with a JWK set the verdict holds only while the set
//! still holds the very key that verified it (a refresh that drops or
//! replaces the key drops it too), and a token within its leeway past
//! `exp` is verified again, not remembered. Refused tokens are never
//! remembered: each refusal is checked and logged.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use std::marker::PhantomData;

use payments_domain::charge::CustomerId;
use payments_domain::scope::{Actor, Denied, Role, Scopes};
use serde::{Deserialize, Serialize};

use crate::AppState;
use secrecy::ExposeSecret;

use crate::config::{ConfigError, JwtKey};
use crate::error::ApiError;
use crate::jwks::{Jwks, VerifyingKey};

/// What `mint_hs256` signs.
#[derive(Debug, Serialize)]
struct MintedClaims<'a> {
    sub: &'a str,
    exp: u64,
    /// Space-separated, when any were asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<&'a str>,
}

/// `aud`: one audience, or several (RFC 7519 section 4.1.3).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum AudClaim {
    One(String),
    Many(Vec<String>),
}

impl AudClaim {
    fn contains(&self, audience: &str) -> bool {
        match self {
            Self::One(one) => one == audience,
            Self::Many(many) => many.iter().any(|a| a == audience),
        }
    }
}

/// `scp`, as identity providers write it: an array of names (Microsoft's
/// access tokens, Okta) or a space-separated string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ScpClaim {
    Names(Vec<String>),
    Words(String),
}

/// Who a verified token speaks for (`sub`), whether it is a back-office
/// token ([`BackOffice`]), and the scopes it carries that this server knows
/// ([`Scopes`]: from `scope` and `scp` together, others ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub subject: CustomerId,
    pub role: Role,
    pub scopes: Scopes,
}

/// What a token is read as. Every field is optional so that a missing claim
/// is reported by the validation (`missing exp`) rather than as malformed
/// JSON; the registered claims the validation checks (`exp`, `nbf`, `iss`,
/// `aud`) are read by jsonwebtoken itself.
#[derive(Debug, Deserialize)]
struct Claims {
    sub: Option<String>,
    /// NumericDate: an integer or a float.
    exp: Option<f64>,
    iat: Option<f64>,
    /// RFC 8693 / RFC 9068: space-separated scope names.
    scope: Option<String>,
    scp: Option<ScpClaim>,
    /// Read to tell a back-office token; the validation checks them too.
    aud: Option<AudClaim>,
    iss: Option<String>,
}

impl Claims {
    /// The scopes of `scope` and `scp` that this server knows.
    fn scopes(&self) -> Scopes {
        let scope = self
            .scope
            .as_deref()
            .map(Scopes::from_claim)
            .unwrap_or_default();
        let scp = match &self.scp {
            Some(ScpClaim::Names(names)) => Scopes::from_names(names.iter().map(String::as_str)),
            Some(ScpClaim::Words(words)) => Scopes::from_claim(words),
            None => Scopes::default(),
        };
        scope.union(scp)
    }
}

/// How tokens are validated besides their signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtRules {
    /// `exp` may be at most this far ahead of now: a token valid for a year
    /// is refused.
    pub max_lifetime: Duration,
    /// Clock-skew allowance for `exp`, `nbf` and `iat`.
    pub leeway: Duration,
    /// When set, `iss` is required and must equal it.
    pub issuer: Option<String>,
    /// When set, `aud` is required and must contain it (or the back
    /// office's audience). When unset, `aud` is not checked (identity
    /// providers always send one).
    pub audience: Option<String>,
    /// What makes a token the back office's.
    pub back_office: BackOffice,
}

/// A back-office token is one of this audience and this issuer (each when
/// set; at least one must be, else no token is): only then are back-office
/// scopes honoured ([`payments_domain::scope::BACK_OFFICE`]). A public
/// client can ask the identity provider for any scope of the API it is
/// allowed; it cannot get a token of an audience it is not allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackOffice {
    /// `JWT_BACKOFFICE_AUDIENCE`: `aud` must contain it.
    pub audience: Option<String>,
    /// `JWT_BACKOFFICE_ISSUER`: `iss` must equal it.
    pub issuer: Option<String>,
}

impl BackOffice {
    /// Whether any token can be the back office's.
    pub fn is_configured(&self) -> bool {
        self.audience.is_some() || self.issuer.is_some()
    }

    /// The role of a token with these `aud` and `iss`.
    fn role_of(&self, aud: Option<&AudClaim>, iss: Option<&str>) -> Role {
        let audience = self
            .audience
            .as_deref()
            .is_none_or(|want| aud.is_some_and(|aud| aud.contains(want)));
        let issuer = self.issuer.as_deref().is_none_or(|want| iss == Some(want));
        if self.is_configured() && audience && issuer {
            Role::BackOffice
        } else {
            Role::Customer
        }
    }
}

/// `JWT_MAX_LIFETIME`'s default: the default ttl of `payments-api token`.
pub const DEFAULT_MAX_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
/// `JWT_LEEWAY`'s default.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);

impl Default for JwtRules {
    fn default() -> Self {
        Self {
            max_lifetime: DEFAULT_MAX_LIFETIME,
            leeway: DEFAULT_LEEWAY,
            issuer: None,
            audience: None,
            back_office: BackOffice::default(),
        }
    }
}

/// Verifies bearer tokens.
#[derive(Clone)]
pub struct Authenticator {
    keys: Keys,
    /// The rules as jsonwebtoken checks them; `algorithms` is set per key.
    validation: Validation,
    rules: JwtRules,
    verified: Verified,
}

/// How long an accepted token is remembered at most.
pub const VERIFIED_FOR: Duration = Duration::from_secs(300);

/// Tokens accepted recently, by the SHA-256 of their text (see the module's
/// documentation): at most [`VERIFIED_FOR`], and 16 MiB of entries.
#[derive(Clone)]
struct Verified(moka::sync::Cache<[u8; 32], Arc<Accepted>>);

/// What an accepted token was accepted as, and until when that holds.
#[derive(Debug)]
struct Accepted {
    principal: Principal,
    /// `exp` in seconds since the epoch: remembered until then only.
    exp: f64,
    /// With a JWK set, the key that verified it (and its `kid`): it holds
    /// while the set holds that very key.
    key: Option<(String, Arc<VerifyingKey>)>,
}

impl Verified {
    fn new() -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(16 << 20)
            .weigher(|_, accepted: &Arc<Accepted>| {
                let kid = accepted.key.as_ref().map_or(0, |(kid, _)| kid.len());
                u32::try_from(256 + accepted.principal.subject.as_str().len() + kid)
                    .unwrap_or(u32::MAX)
            })
            .time_to_live(VERIFIED_FOR)
            .build();
        Self(cache)
    }

    fn digest(token: &str) -> [u8; 32] {
        use sha2::Digest;
        sha2::Sha256::digest(token.as_bytes()).into()
    }

    /// The principal `token` was accepted as, if that still holds at `now`
    /// (seconds since the epoch) with `keys`.
    fn get(&self, digest: &[u8; 32], keys: &Keys, now: f64) -> Option<Principal> {
        let accepted = self.0.get(digest)?;
        let key_held = match (&accepted.key, keys) {
            (None, Keys::Static(_)) => true,
            (Some((kid, key)), Keys::Jwks(jwks)) => jwks.holds(kid, key),
            _ => false,
        };
        (key_held && now < accepted.exp).then(|| accepted.principal.clone())
    }
}

/// Where the verifying key comes from.
#[derive(Clone)]
enum Keys {
    /// One key, one algorithm.
    Static(VerifyingKey),
    /// The token's `kid` picks one of the identity provider's keys.
    Jwks(Arc<Jwks>),
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("Authenticator");
        match &self.keys {
            Keys::Static(key) => debug.field("algorithm", &key.algorithm),
            Keys::Jwks(jwks) => debug.field("jwks", jwks),
        };
        debug.field("rules", &self.rules).finish()
    }
}

impl Authenticator {
    /// An authenticator with the default [`JwtRules`].
    pub fn new(key: &JwtKey) -> Result<Self, ConfigError> {
        Self::with_rules(key, JwtRules::default())
    }

    /// An authenticator with the configured rules. With a JWK set nothing is
    /// fetched yet: see [`Self::jwks`].
    pub fn with_rules(key: &JwtKey, rules: JwtRules) -> Result<Self, ConfigError> {
        let keys = match key {
            JwtKey::Hs256(secret) => Keys::Static(VerifyingKey {
                key: DecodingKey::from_secret(secret.expose_secret().as_bytes())
                    .map_err(|e| ConfigError(format!("JWT_HS256_SECRET: {e}")))?,
                algorithm: Algorithm::HS256,
            }),
            JwtKey::Rs256(pem) => Keys::Static(VerifyingKey {
                key: DecodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| {
                    ConfigError(format!(
                        "JWT_RS256_PUBLIC_KEY is not an RSA public key PEM: {e}"
                    ))
                })?,
                algorithm: Algorithm::RS256,
            }),
            JwtKey::Es256(pem) => Keys::Static(VerifyingKey {
                key: DecodingKey::from_ec_pem(pem.as_bytes()).map_err(|e| {
                    ConfigError(format!(
                        "JWT_ES256_PUBLIC_KEY is not an EC public key PEM: {e}"
                    ))
                })?,
                algorithm: Algorithm::ES256,
            }),
            JwtKey::Jwks(settings) => Keys::Jwks(Arc::new(Jwks::new(settings.clone())?)),
        };
        // Only the key's algorithm is accepted (set per token in `decode`).
        let mut validation = Validation::new(Algorithm::HS256);
        validation.algorithms.clear();
        validation.leeway = rules.leeway.as_secs();
        validation.validate_exp = true;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        let back_office = &rules.back_office;
        if let Some(issuer) = &rules.issuer {
            // A back-office issuer is served by the same keys.
            let issuers: Vec<&String> = [Some(issuer), back_office.issuer.as_ref()]
                .into_iter()
                .flatten()
                .collect();
            validation.set_issuer(&issuers);
            required.push("iss");
        }
        match &rules.audience {
            Some(audience) => {
                let audiences: Vec<&String> = [Some(audience), back_office.audience.as_ref()]
                    .into_iter()
                    .flatten()
                    .collect();
                validation.set_audience(&audiences);
                validation.validate_aud = true;
                required.push("aud");
            }
            // jsonwebtoken refuses every token with an `aud` when no audience
            // is configured; identity providers always send one.
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        Ok(Self {
            keys,
            validation,
            rules,
            verified: Verified::new(),
        })
    }

    /// The JWK set cache, when keys come from JWT_JWKS_URL: `payments-api`
    /// fetches it before serving and keeps it fresh ([`Jwks::start`]).
    pub fn jwks(&self) -> Option<&Arc<Jwks>> {
        match &self.keys {
            Keys::Jwks(jwks) => Some(jwks),
            Keys::Static(_) => None,
        }
    }

    /// Who a bearer token speaks for, and its scopes. A refusal is logged at
    /// info level with its reason, never with the token.
    pub async fn verify(&self, token: &str) -> Result<Principal, ApiError> {
        let digest = Verified::digest(token);
        if let Some(principal) = self.verified.get(&digest, &self.keys, now_secs()) {
            return Ok(principal);
        }
        let checked = match &self.keys {
            Keys::Static(key) => self.check_with(token, key),
            Keys::Jwks(jwks) => self.check_jwks(token, jwks).await,
        };
        let checked = checked.map(|accepted| {
            let principal = accepted.principal.clone();
            self.verified.0.insert(digest, Arc::new(accepted));
            principal
        });
        checked.map_err(|reason| {
            tracing::info!(reason, "bearer token refused");
            if reason == INVALID_SUB {
                ApiError::InvalidSubject
            } else {
                ApiError::Unauthorized
            }
        })
    }

    /// With a JWK set: the key the token's `kid` names, whose algorithm must
    /// be the header's `alg`; then the checks of every key.
    async fn check_jwks(&self, token: &str, jwks: &Jwks) -> Result<Accepted, &'static str> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| reason(e.kind()))?;
        // Before any lookup: no fetch for a token no key could verify.
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256) {
            return Err("wrong algorithm");
        }
        // Even when the set holds a single key: a kid-less token would
        // otherwise work until the provider's first rotation.
        let kid = header.kid.as_deref().ok_or("no kid")?;
        let key = jwks.key(kid).await?;
        if key.algorithm != header.alg {
            return Err("wrong algorithm");
        }
        let accepted = self.check_with(token, &key)?;
        Ok(Accepted {
            key: Some((kid.to_owned(), key)),
            ..accepted
        })
    }

    /// Who the token speaks for, or why it is refused, with `key`.
    fn check_with(&self, token: &str, key: &VerifyingKey) -> Result<Accepted, &'static str> {
        let mut validation = self.validation.clone();
        validation.algorithms = vec![key.algorithm];
        let data = jsonwebtoken::decode::<Claims>(token, &key.key, &validation)
            .map_err(|e| reason(e.kind()))?;
        let claims = data.claims;
        let now = now_secs();
        let leeway = self.rules.leeway.as_secs_f64();
        // Present: `exp` is a required claim of the validation.
        let exp = claims.exp.ok_or("missing exp")?;
        if exp - now > self.rules.max_lifetime.as_secs_f64() + leeway {
            return Err("lifetime too long");
        }
        // jsonwebtoken does not check `iat`.
        if claims.iat.is_some_and(|iat| iat > now + leeway) {
            return Err("issued in the future");
        }
        let scopes = claims.scopes();
        let role = self
            .rules
            .back_office
            .role_of(claims.aud.as_ref(), claims.iss.as_deref());
        let sub = claims.sub.ok_or("missing sub")?;
        let subject = CustomerId::parse(&sub).map_err(|_| INVALID_SUB)?;
        Ok(Accepted {
            principal: Principal {
                subject,
                role,
                scopes,
            },
            exp,
            key: None,
        })
    }

    /// The static key's verdict, for the unit tests.
    #[cfg(test)]
    fn check_principal(&self, token: &str) -> Result<Principal, &'static str> {
        match &self.keys {
            Keys::Static(key) => self.check_with(token, key).map(|a| a.principal),
            Keys::Jwks(_) => Err("a JWK set needs verify"),
        }
    }

    /// The static key's customer, for the unit tests.
    #[cfg(test)]
    fn check(&self, token: &str) -> Result<CustomerId, &'static str> {
        self.check_principal(token).map(|p| p.subject)
    }
}

/// Now, in seconds since the epoch, as the token's time claims count.
fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The reason for a token whose signature and claims are valid but whose
/// `sub` is not a customer id ([`CustomerId::RULE`]): answered with its own
/// message, since the client cannot fix it by retrying.
const INVALID_SUB: &str = "invalid sub";

/// A short, fixed reason for the log: never the token or a claim's value.
fn reason(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ExpiredSignature => "expired",
        ErrorKind::ImmatureSignature => "not yet valid",
        ErrorKind::InvalidSignature => "bad signature",
        ErrorKind::InvalidAlgorithm => "wrong algorithm",
        ErrorKind::InvalidAudience => "wrong audience",
        ErrorKind::InvalidIssuer => "wrong issuer",
        ErrorKind::MissingRequiredClaim(claim) => match claim.as_str() {
            "exp" => "missing exp",
            "sub" => "missing sub",
            "iss" => "missing iss",
            "aud" => "missing aud",
            _ => "missing claim",
        },
        ErrorKind::InvalidClaimFormat(claim) => match claim.as_str() {
            "exp" => "malformed exp",
            "nbf" => "malformed nbf",
            "iss" => "malformed iss",
            "aud" => "malformed aud",
            _ => "malformed claim",
        },
        // The header's or the claims' JSON.
        ErrorKind::InvalidToken
        | ErrorKind::Base64(_)
        | ErrorKind::Utf8(_)
        | ErrorKind::Json(_) => "malformed token",
        _ => "invalid token",
    }
}

/// Mints an HS256 token for development (`payments-api token`) and tests.
///
/// No `iat`: API replicas whose clocks run behind the minting host's would
/// see it in the future and refuse the token.
pub fn mint_hs256(secret: &str, customer: &str, ttl: Duration) -> Result<String, ConfigError> {
    mint_hs256_scoped(secret, customer, &[], None, ttl)
}

/// [`mint_hs256`], with a `scope` claim of `scopes` (space-separated, as
/// given: names this server does not know are kept, and ignored when read)
/// and, when given, an `aud` (the back office's audience makes a
/// back-office token).
pub fn mint_hs256_scoped(
    secret: &str,
    subject: &str,
    scopes: &[String],
    audience: Option<&str>,
    ttl: Duration,
) -> Result<String, ConfigError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let claims = MintedClaims {
        sub: subject,
        exp: (now + ttl).as_secs(),
        scope: (!scopes.is_empty()).then(|| scopes.join(" ")),
        aud: audience,
    };
    let key = EncodingKey::from_secret(secret.as_bytes())
        .map_err(|e| ConfigError(format!("JWT_HS256_SECRET: {e}")))?;
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key)
        .map_err(|e| ConfigError(format!("cannot sign token: {e}")))
}

/// What a route needs of its caller ([`Caller`]).
pub trait Access {
    fn check(actor: &Actor) -> Result<(), Denied>;
}

/// `POST /api/charges`: `charges:write`.
#[derive(Debug)]
pub struct Charging;
/// The reads: `charges:read` or `charges:read_all`.
#[derive(Debug)]
pub struct Reading;
/// `POST /api/charges/{id}/refunds`: `refunds:write`.
#[derive(Debug)]
pub struct Refunding;
/// `POST /api/charges/{id}/capture` and `/cancel`: `charges:capture`.
#[derive(Debug)]
pub struct Capturing;
/// `GET /api/events` and `/api/events/{id}`: `events:read`.
#[derive(Debug)]
pub struct ReadingEvents;
/// `GET /api/disputes`: `disputes:read`.
#[derive(Debug)]
pub struct ReadingDisputes;

impl Access for ReadingDisputes {
    fn check(actor: &Actor) -> Result<(), Denied> {
        actor.may_read_disputes()
    }
}

impl Access for ReadingEvents {
    fn check(actor: &Actor) -> Result<(), Denied> {
        actor.may_read_events()
    }
}

impl Access for Capturing {
    fn check(actor: &Actor) -> Result<(), Denied> {
        actor.may_capture()
    }
}

impl Access for Charging {
    fn check(actor: &Actor) -> Result<(), Denied> {
        actor.may_charge()
    }
}

impl Access for Reading {
    fn check(actor: &Actor) -> Result<(), Denied> {
        actor.may_read()
    }
}

impl Access for Refunding {
    fn check(actor: &Actor) -> Result<(), Denied> {
        actor.may_refund()
    }
}

/// The authenticated caller, allowed what the route needs (`A`). Rejects
/// with 401 `unauthorized` and a `WWW-Authenticate: Bearer` challenge
/// (RFC 6750) for a missing or bad token, and with 403
/// `insufficient_scope` for a token without the route's scope: an
/// extractor, so before the body is read and anything is stored.
#[derive(Debug)]
pub struct Caller<A>(pub Actor, pub PhantomData<A>);

impl<A: Access> FromRequestParts<AppState> for Caller<A> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(value) = parts.headers.get(AUTHORIZATION) else {
            tracing::info!(reason = "no credentials", "bearer token refused");
            return Err(ApiError::NoCredentials);
        };
        let Some((scheme, token)) = value.to_str().ok().and_then(|v| v.split_once(' ')) else {
            tracing::info!(reason = "malformed authorization", "bearer token refused");
            return Err(ApiError::Unauthorized);
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            // RFC 6750 section 3.1: an unsupported authentication method is
            // answered like no credentials, without an error code.
            tracing::info!(reason = "not a bearer token", "bearer token refused");
            return Err(ApiError::NoCredentials);
        }
        let principal = state.auth.verify(token.trim()).await?;
        let actor = Actor::new(
            principal.subject,
            principal.role,
            principal.scopes,
            state.refunds_by_customer,
        );
        let span = tracing::Span::current();
        span.record("subject", actor.subject().as_str());
        span.record("role", actor.role().as_str());
        A::check(&actor).inspect_err(|denied| {
            tracing::info!(scope = %denied.0, "insufficient scope; answered 403");
        })?;
        Ok(Caller(actor, PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIVATE: &str = include_str!("../tests/fixtures/jwt-rs256-private.pem");
    const PUBLIC: &str = include_str!("../tests/fixtures/jwt-rs256-public.pem");
    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn now() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default()
    }

    fn rs256_token(sub: &str, exp: u64) -> String {
        let key = EncodingKey::from_rsa_pem(PRIVATE.as_bytes()).expect("test key");
        jsonwebtoken::encode(
            &Header::new(Algorithm::RS256),
            &MintedClaims {
                sub,
                exp,
                scope: None,
                aud: None,
            },
            &key,
        )
        .expect("sign")
    }

    fn hs256(claims: serde_json::Value) -> String {
        let key = EncodingKey::from_secret(SECRET.as_bytes()).expect("key");
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).expect("sign")
    }

    fn in_an_hour() -> u64 {
        (now() + 3600) as u64
    }

    fn hs_auth(rules: JwtRules) -> Authenticator {
        Authenticator::with_rules(&JwtKey::Hs256(SECRET.into()), rules).expect("secret")
    }

    #[test]
    fn rs256_tokens_verify_with_the_public_key() {
        let auth = Authenticator::new(&JwtKey::Rs256(PUBLIC.to_owned())).expect("public key");
        let customer = auth
            .check(&rs256_token("cus_rs", in_an_hour()))
            .expect("valid");
        assert_eq!(customer.as_str(), "cus_rs");
        assert_eq!(
            auth.check(&rs256_token("cus_rs", 1_000)).err(),
            Some("expired")
        );
        // An HS256 token signed with the public key text is the classic
        // algorithm-confusion forgery: refused.
        let forged = mint_hs256(PUBLIC, "cus_rs", Duration::from_secs(60)).expect("sign");
        assert_eq!(auth.check(&forged).err(), Some("wrong algorithm"));
        assert!(Authenticator::new(&JwtKey::Rs256("-----BEGIN nonsense".into())).is_err());
    }

    #[test]
    fn es256_tokens_verify_with_the_public_key() {
        const EC_PRIVATE: &str = include_str!("../tests/fixtures/jwt-es256-private.pem");
        const EC_PUBLIC: &str = include_str!("../tests/fixtures/jwt-es256-public.pem");
        let auth = Authenticator::new(&JwtKey::Es256(EC_PUBLIC.to_owned())).expect("public key");
        let key = EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()).expect("test key");
        let claims = MintedClaims {
            sub: "cus_es",
            exp: in_an_hour(),
            scope: None,
            aud: None,
        };
        let token =
            jsonwebtoken::encode(&Header::new(Algorithm::ES256), &claims, &key).expect("sign");
        assert_eq!(auth.check(&token).expect("valid").as_str(), "cus_es");
        assert_eq!(
            auth.check(&rs256_token("cus_es", in_an_hour())).err(),
            Some("wrong algorithm")
        );
        let forged = mint_hs256(EC_PUBLIC, "cus_es", Duration::from_secs(60)).expect("sign");
        assert_eq!(auth.check(&forged).err(), Some("wrong algorithm"));
        assert!(Authenticator::new(&JwtKey::Es256(PUBLIC.to_owned())).is_err());
        assert!(Authenticator::new(&JwtKey::Rs256(EC_PUBLIC.to_owned())).is_err());
    }

    /// An accepted token is remembered, never past its `exp` (leeway 0
    /// here: jsonwebtoken itself refuses it a second after); a refused one
    /// is not remembered.
    #[tokio::test]
    async fn accepted_tokens_are_remembered_until_their_exp_and_refused_ones_never() {
        let auth = hs_auth(JwtRules {
            leeway: Duration::ZERO,
            ..JwtRules::default()
        });
        let exp = now() + 1;
        let token = hs256(serde_json::json!({"sub": "cus_once", "exp": exp}));
        let digest = Verified::digest(&token);
        let first = auth.verify(&token).await.expect("valid");
        assert!(auth.verified.0.get(&digest).is_some(), "remembered");
        assert_eq!(auth.verify(&token).await.expect("remembered"), first);
        // Past `exp`: refused, though it is still in the cache.
        let past = UNIX_EPOCH + Duration::from_secs(exp as u64 + 1) + Duration::from_millis(200);
        tokio::time::sleep(past.duration_since(SystemTime::now()).unwrap_or_default()).await;
        assert!(auth.verified.0.get(&digest).is_some(), "still cached");
        assert!(auth.verify(&token).await.is_err(), "refused past exp");

        let forged = mint_hs256(
            "another-secret-another-secret-xx",
            "cus_x",
            Duration::from_secs(60),
        )
        .expect("sign");
        assert!(auth.verify(&forged).await.is_err());
        assert!(auth.verify(&forged).await.is_err());
        assert!(auth.verified.0.get(&Verified::digest(&forged)).is_none());
    }

    #[test]
    fn hs256_tokens_verify_with_the_secret_only() {
        let auth = Authenticator::new(&JwtKey::Hs256(SECRET.into())).expect("secret");
        let token = mint_hs256(SECRET, "cus_hs", Duration::from_secs(60)).expect("sign");
        assert_eq!(auth.check(&token).expect("valid").as_str(), "cus_hs");
        let other = mint_hs256(
            "another-secret-another-secret-xx",
            "cus_hs",
            Duration::from_secs(60),
        )
        .expect("sign");
        assert_eq!(auth.check(&other).err(), Some("bad signature"));
        assert_eq!(auth.check("not.a.jwt").err(), Some("malformed token"));
        assert!(
            auth.check(&rs256_token("cus_hs", in_an_hour())).is_err(),
            "wrong algorithm"
        );
        let empty_sub = mint_hs256(SECRET, "", Duration::from_secs(60)).expect("sign");
        assert_eq!(auth.check(&empty_sub).err(), Some("invalid sub"));
    }

    #[test]
    fn subjects_with_whitespace_at_an_end_or_control_characters_are_refused() {
        let auth = Authenticator::new(&JwtKey::Hs256(SECRET.into())).expect("secret");
        for sub in [
            "cus_1 ",
            " cus_1",
            "cus_1\t",
            "cus_1\u{a0}",
            "cus\u{0}1",
            "cus\u{7f}1",
        ] {
            let token = mint_hs256(SECRET, sub, Duration::from_secs(60)).expect("sign");
            assert_eq!(auth.check(&token).err(), Some(INVALID_SUB), "{sub:?}");
        }
        let inner = mint_hs256(SECRET, "cus 1", Duration::from_secs(60)).expect("sign");
        assert_eq!(auth.check(&inner).expect("valid").as_str(), "cus 1");
    }

    #[test]
    fn the_default_token_ttl_fits_the_default_lifetime() {
        let auth = hs_auth(JwtRules::default());
        let day = mint_hs256(SECRET, "cus_day", Duration::from_secs(24 * 3600)).expect("sign");
        assert!(auth.check(&day).is_ok());
        let year =
            mint_hs256(SECRET, "cus_year", Duration::from_secs(365 * 24 * 3600)).expect("sign");
        assert_eq!(auth.check(&year).err(), Some("lifetime too long"));
    }

    #[test]
    fn time_claims_are_checked_with_the_leeway() {
        let auth = hs_auth(JwtRules::default());
        let t = now();
        let check = |claims: serde_json::Value| auth.check(&hs256(claims));
        assert!(check(serde_json::json!({"sub": "c", "exp": t + 60})).is_ok());
        assert_eq!(
            check(serde_json::json!({"sub": "c"})).err(),
            Some("missing exp")
        );
        assert_eq!(
            check(serde_json::json!({"exp": t + 60})).err(),
            Some("missing sub")
        );
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": t - 120})).err(),
            Some("expired")
        );
        // Within the 30 s leeway.
        assert!(check(serde_json::json!({"sub": "c", "exp": t - 10})).is_ok());
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": t + 600, "nbf": t + 300})).err(),
            Some("not yet valid")
        );
        assert!(check(serde_json::json!({"sub": "c", "exp": t + 600, "nbf": t + 10})).is_ok());
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": t + 600, "iat": t + 300})).err(),
            Some("issued in the future")
        );
        assert!(check(serde_json::json!({"sub": "c", "exp": t + 600, "iat": t + 10})).is_ok());
        assert!(check(serde_json::json!({"sub": "c", "exp": (t + 600) as f64 + 0.5})).is_ok());
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": "soon"})).err(),
            Some("malformed token")
        );

        let strict = hs_auth(JwtRules {
            leeway: Duration::ZERO,
            max_lifetime: Duration::from_secs(300),
            ..JwtRules::default()
        });
        let check = |claims: serde_json::Value| strict.check(&hs256(claims));
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": t - 10})).err(),
            Some("expired")
        );
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": t + 600})).err(),
            Some("lifetime too long")
        );
    }

    #[test]
    fn issuer_and_audience_are_checked_when_configured() {
        let t = now();
        let open = hs_auth(JwtRules::default());
        // Identity providers always send `aud`: accepted when none is configured.
        let with_aud = hs256(serde_json::json!({"sub": "c", "exp": t + 60, "aud": "anything"}));
        assert!(open.check(&with_aud).is_ok());
        let with_auds = hs256(serde_json::json!({"sub": "c", "exp": t + 60, "aud": ["a", "b"]}));
        assert!(open.check(&with_auds).is_ok());

        let strict = hs_auth(JwtRules {
            issuer: Some("https://idp.example".into()),
            audience: Some("payments".into()),
            ..JwtRules::default()
        });
        let check = |claims: serde_json::Value| strict.check(&hs256(claims));
        let iss = "https://idp.example";
        assert!(
            check(serde_json::json!({"sub": "c", "exp": t + 60, "iss": iss, "aud": "payments"}))
                .is_ok()
        );
        assert!(
            check(serde_json::json!({"sub": "c", "exp": t + 60, "iss": iss, "aud": ["other", "payments"]}))
                .is_ok()
        );
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": t + 60, "iss": iss, "aud": "other"})).err(),
            Some("wrong audience")
        );
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": t + 60, "iss": "https://evil.example", "aud": "payments"}))
                .err(),
            Some("wrong issuer")
        );
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": t + 60, "aud": "payments"})).err(),
            Some("missing iss")
        );
        assert_eq!(
            check(serde_json::json!({"sub": "c", "exp": t + 60, "iss": iss})).err(),
            Some("missing aud")
        );
    }

    #[test]
    fn scopes_are_read_from_scope_and_scp_and_unknown_ones_ignored() {
        let auth = hs_auth(JwtRules::default());
        let scopes = |claims: serde_json::Value| {
            auth.check_principal(&hs256(claims))
                .map(|p| p.scopes.to_string())
        };
        let exp = in_an_hour();
        let base = |extra: serde_json::Value| {
            let mut claims = serde_json::json!({"sub": "cus_s", "exp": exp});
            if let (Some(c), Some(e)) = (claims.as_object_mut(), extra.as_object()) {
                c.extend(e.clone());
            }
            claims
        };
        assert_eq!(scopes(base(serde_json::json!({}))), Ok(String::new()));
        assert_eq!(
            scopes(base(
                serde_json::json!({"scope": "openid profile refunds:write"})
            )),
            Ok("refunds:write".to_owned())
        );
        assert_eq!(
            scopes(base(
                serde_json::json!({"scp": ["charges:read_all", "email"]})
            )),
            Ok("charges:read_all".to_owned())
        );
        assert_eq!(
            scopes(base(
                serde_json::json!({"scp": "charges:write charges:read"})
            )),
            Ok("charges:write charges:read".to_owned())
        );
        assert_eq!(
            scopes(base(
                serde_json::json!({"scope": "charges:write", "scp": ["events:read"]})
            )),
            Ok("charges:write events:read".to_owned())
        );
        // A scope claim of another type is a malformed token, as any claim.
        assert_eq!(
            scopes(base(serde_json::json!({"scope": 7}))),
            Err("malformed token")
        );
    }

    #[test]
    fn minted_tokens_carry_their_scopes() {
        let auth = hs_auth(JwtRules::default());
        let scoped = ["refunds:write".to_owned(), "openid".to_owned()];
        let token = mint_hs256_scoped(SECRET, "ops_bob", &scoped, None, Duration::from_secs(600))
            .expect("minted");
        let principal = auth.check_principal(&token).expect("valid");
        assert_eq!(principal.subject.as_str(), "ops_bob");
        assert_eq!(principal.role, Role::Customer, "no back office configured");
        assert_eq!(principal.scopes.to_string(), "refunds:write");
        let plain = mint_hs256(SECRET, "cus_p", Duration::from_secs(600)).expect("minted");
        assert!(
            auth.check_principal(&plain)
                .expect("valid")
                .scopes
                .is_empty()
        );
    }

    #[test]
    fn the_back_office_is_a_token_of_its_audience_or_issuer() {
        let office = |audience: Option<&str>, issuer: Option<&str>| JwtRules {
            back_office: BackOffice {
                audience: audience.map(str::to_owned),
                issuer: issuer.map(str::to_owned),
            },
            ..JwtRules::default()
        };
        let role = |auth: &Authenticator, claims: serde_json::Value| {
            let mut claims = claims;
            claims["sub"] = "ops_bob".into();
            claims["exp"] = in_an_hour().into();
            auth.check_principal(&hs256(claims)).map(|p| p.role)
        };
        use serde_json::json;
        let by_audience = hs_auth(office(Some("payments-backoffice"), None));
        assert_eq!(
            role(&by_audience, json!({"aud": "payments-backoffice"})),
            Ok(Role::BackOffice)
        );
        assert_eq!(
            role(
                &by_audience,
                json!({"aud": ["payments", "payments-backoffice"]})
            ),
            Ok(Role::BackOffice)
        );
        assert_eq!(
            role(&by_audience, json!({"aud": "payments"})),
            Ok(Role::Customer)
        );
        assert_eq!(role(&by_audience, json!({})), Ok(Role::Customer));
        let by_issuer = hs_auth(office(None, Some("https://staff.idp")));
        assert_eq!(
            role(&by_issuer, json!({"iss": "https://staff.idp"})),
            Ok(Role::BackOffice)
        );
        assert_eq!(
            role(&by_issuer, json!({"iss": "https://idp"})),
            Ok(Role::Customer)
        );
        // Both set: both must match.
        let both = hs_auth(office(
            Some("payments-backoffice"),
            Some("https://staff.idp"),
        ));
        assert_eq!(
            role(&both, json!({"aud": "payments-backoffice"})),
            Ok(Role::Customer)
        );
        assert_eq!(
            role(
                &both,
                json!({"aud": "payments-backoffice", "iss": "https://staff.idp"})
            ),
            Ok(Role::BackOffice)
        );
        // Nothing configured: nobody.
        let none = hs_auth(JwtRules::default());
        assert_eq!(
            role(&none, json!({"aud": "payments-backoffice"})),
            Ok(Role::Customer)
        );
        // With JWT_AUDIENCE, a back-office token of its own audience is
        // accepted besides customers' tokens; a third audience is not.
        let strict = hs_auth(JwtRules {
            audience: Some("payments".into()),
            ..office(Some("payments-backoffice"), None)
        });
        assert_eq!(
            role(&strict, json!({"aud": "payments"})),
            Ok(Role::Customer)
        );
        assert_eq!(
            role(&strict, json!({"aud": "payments-backoffice"})),
            Ok(Role::BackOffice)
        );
        assert_eq!(
            role(&strict, json!({"aud": "other"})),
            Err("wrong audience")
        );
    }
}
