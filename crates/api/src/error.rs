//! One error type for the HTTP layer: every error answer is the envelope
//! `{"error":{"code","message","param"?}}` with a stable code. Internal
//! details are logged once here and never sent.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use payments_domain::charge::InvalidRequest;
use payments_domain::envelope::ErrorEnvelope;
use payments_domain::provider::Doubt;
use payments_domain::scope::{Denied, Scope};
use payments_domain::service::{ChargeError, RETRY_AFTER_SECS};
use payments_domain::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A bearer token was sent but refused: `WWW-Authenticate: Bearer
    /// error="invalid_token"` (RFC 6750).
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// A token that verifies but whose `sub` is not a customer id (it has
    /// whitespace at an end, or a control character): 401 with
    /// `WWW-Authenticate: Bearer error="invalid_token"`, and a message
    /// that says why (never the subject itself).
    #[error(
        "the bearer token's subject (sub) is not a valid customer id: {}",
        payments_domain::charge::CustomerId::RULE
    )]
    InvalidSubject,
    /// No bearer token was sent: `WWW-Authenticate: Bearer`, without an
    /// error code (RFC 6750 section 3.1).
    #[error("a bearer token is required")]
    NoCredentials,
    /// A valid token without the scope the request needs: 403 with
    /// `WWW-Authenticate: Bearer error="insufficient_scope", scope="..."`
    /// (RFC 6750 section 3.1). Nothing was read or stored.
    #[error("this token lacks the scope {0} this request needs")]
    InsufficientScope(Scope),
    /// Carries the client guide's URL for the message.
    #[error(
        "the Idempotency-Key header is required: generate one key per payment and reuse it on every retry; see {0}"
    )]
    KeyMissing(String),
    #[error("{0}")]
    KeyInvalid(String),
    #[error("{}", .0.message)]
    Invalid(InvalidRequest),
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    /// The body is larger than the route takes (the bytes it takes).
    #[error("the request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// A provider webhook whose `Stripe-Signature` does not verify with
    /// GATEWAY_WEBHOOK_SECRET (unsigned, tampered, stale, another secret):
    /// nothing was read or changed.
    #[error("the Stripe-Signature header does not verify: {0}")]
    InvalidSignature(String),
    /// A verified provider event that could not be applied now (the
    /// provider's charge could not be read, the database failed): 503, so
    /// the provider delivers it again.
    #[error("the provider event could not be applied now; deliver it again")]
    ProviderEventNotApplied(String),
    #[error("not found")]
    NotFound,
    /// A refund of a charge that has not succeeded; not stored.
    #[error("a charge that is {0} cannot be refunded")]
    NotRefundable(&'static str),
    /// A capture or cancel of a charge that is no hold that can be (yet);
    /// not stored.
    #[error("a charge that is {0} is not a hold that can be captured or canceled")]
    NotCapturable(&'static str),
    /// Another capture or cancel of the hold is pending; not stored.
    #[error(
        "another capture or cancel of this hold is in progress; retry later (it may fail and give the hold back)"
    )]
    HoldBusy,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("this idempotency key was already used with a different request")]
    KeyReused,
    #[error("a request with this idempotency key is still in progress; retry later")]
    InProgress,
    /// Over the customer's rate of new operations; the wait, rounded up to
    /// whole seconds, goes in `Retry-After`.
    #[error(
        "too many new payments from this customer; retry after {0} seconds (the same idempotency key is safe to reuse: nothing was stored)"
    )]
    RateLimited(u64),
    /// The provider's outcome is unknown; the message says why (a timeout,
    /// a dropped connection, ...).
    #[error("{}", .0.message())]
    GatewayUnavailable(Doubt),
    /// The provider refused our secret key (401/403): a configuration
    /// error, answered 500 `provider_misconfigured` without `Retry-After`
    /// and never stored; the operation stays as it was.
    #[error("{}", Doubt::KeyRefused.message())]
    ProviderMisconfigured,
    /// The database could not be reached (a dropped connection, a pool
    /// timeout, a server restarting). Nothing half-done is visible to a
    /// retry with the same key; the driver's text goes to the log only.
    #[error("the service is temporarily unavailable; retry with the same idempotency key")]
    DatabaseUnavailable(String),
    #[error("the request body did not arrive in time")]
    RequestTimeout,
    /// `/readyz`: the detail goes to the log only.
    #[error("not ready")]
    NotReady(String),
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Unauthorized | Self::InvalidSubject | Self::NoCredentials => {
                (StatusCode::UNAUTHORIZED, "unauthorized")
            }
            Self::InsufficientScope(_) => (StatusCode::FORBIDDEN, "insufficient_scope"),
            Self::KeyMissing(_) => (StatusCode::BAD_REQUEST, "idempotency_key_missing"),
            Self::KeyInvalid(_) => (StatusCode::BAD_REQUEST, "idempotency_key_invalid"),
            Self::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            Self::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::InvalidSignature(_) => (StatusCode::BAD_REQUEST, "invalid_signature"),
            Self::ProviderEventNotApplied(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "provider_event_not_applied",
            ),
            Self::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Self::NotRefundable(_) => (StatusCode::BAD_REQUEST, "charge_not_refundable"),
            Self::NotCapturable(_) => (StatusCode::BAD_REQUEST, "charge_not_capturable"),
            Self::HoldBusy => (StatusCode::CONFLICT, "hold_in_use"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::KeyReused => (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused"),
            Self::InProgress => (StatusCode::CONFLICT, "request_in_progress"),
            Self::RateLimited(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Self::GatewayUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "gateway_unavailable"),
            Self::ProviderMisconfigured => {
                (StatusCode::INTERNAL_SERVER_ERROR, "provider_misconfigured")
            }
            Self::DatabaseUnavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable")
            }
            Self::RequestTimeout => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            Self::NotReady(_) => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        }
    }
}

impl From<ChargeError> for ApiError {
    fn from(e: ChargeError) -> Self {
        match e {
            ChargeError::Invalid(invalid) => Self::Invalid(invalid),
            ChargeError::KeyReused => Self::KeyReused,
            ChargeError::InProgress => Self::InProgress,
            ChargeError::RateLimited { retry_after } => {
                // Whole seconds, rounded up: a client that waits as told is
                // admitted.
                let secs = retry_after.as_millis().div_ceil(1000).max(1);
                Self::RateLimited(u64::try_from(secs).unwrap_or(u64::MAX))
            }
            ChargeError::ProviderUnavailable {
                doubt: Doubt::KeyRefused,
                ..
            } => Self::ProviderMisconfigured,
            ChargeError::ProviderUnavailable { doubt, .. } => Self::GatewayUnavailable(doubt),
            ChargeError::Denied(denied) => denied.into(),
            ChargeError::ChargeNotFound => Self::NotFound,
            ChargeError::NotRefundable(status) => Self::NotRefundable(status.as_str()),
            ChargeError::NotCapturable(status) => Self::NotCapturable(status.as_str()),
            ChargeError::HoldBusy => Self::HoldBusy,
            ChargeError::Store(e) => e.into(),
        }
    }
}

impl From<Denied> for ApiError {
    fn from(Denied(scope): Denied) -> Self {
        Self::InsufficientScope(scope)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => Self::DatabaseUnavailable(e.to_string()),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        // On the request's line (its span), whatever the cause.
        tracing::Span::current().record("error_code", code);
        match &self {
            Self::InProgress => {
                metrics::counter!(crate::telemetry::IDEMPOTENCY_CONFLICTS_TOTAL).increment(1)
            }
            Self::KeyReused => {
                metrics::counter!(crate::telemetry::IDEMPOTENCY_KEY_REUSED_TOTAL).increment(1)
            }
            Self::Internal(detail) => tracing::error!(%detail, "internal error"),
            Self::DatabaseUnavailable(detail) => {
                tracing::error!(%detail, "database unavailable; answered 503")
            }
            Self::NotReady(detail) => tracing::warn!(%detail, "not ready"),
            Self::InvalidSignature(detail) => {
                metrics::counter!(
                    payments_domain::service::PROVIDER_EVENTS_TOTAL,
                    "outcome" => "rejected"
                )
                .increment(1);
                tracing::warn!(%detail, "provider webhook refused: its signature does not verify");
            }
            // Expected: the provider's outcome is unknown, the client
            // retries with its key after Retry-After (the service logged
            // why, with the operation).
            Self::GatewayUnavailable(doubt) => tracing::warn!(
                code,
                doubt = doubt.as_str(),
                "provider unavailable; answered 503 with Retry-After"
            ),
            _ => {}
        }
        let param = match &self {
            Self::Invalid(invalid) => invalid.param.clone(),
            _ => None,
        };
        let body = ErrorEnvelope::new(code, self.to_string())
            .with_param(param)
            .to_json();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(
            self,
            Self::InProgress
                | Self::HoldBusy
                | Self::GatewayUnavailable(_)
                | Self::DatabaseUnavailable(_)
                | Self::ProviderEventNotApplied(_)
        ) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if let Self::RateLimited(secs) = self {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        match self {
            Self::Unauthorized | Self::InvalidSubject => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(r#"Bearer error="invalid_token""#),
                );
            }
            Self::NoCredentials => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::InsufficientScope(scope) => {
                let challenge = format!(r#"Bearer error="insufficient_scope", scope="{scope}""#);
                if let Ok(v) = HeaderValue::from_str(&challenge) {
                    headers.insert(header::WWW_AUTHENTICATE, v);
                }
            }
            _ => {}
        }
        response
    }
}
