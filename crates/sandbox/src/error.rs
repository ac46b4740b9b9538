//! Stripe's error envelope, `{"error":{"type":..,"code":..,"message":..}}`,
//! used for every non-2xx answer the sandbox gives.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::response::StoredResponse;

/// An error answer: an HTTP status plus the body of Stripe's envelope.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    status: StatusCode,
    // Boxed: errors travel through many `Result`s and the body is large.
    body: Box<ErrorBody>,
}

#[derive(Debug, Clone, Serialize)]
struct ErrorBody {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decline_code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    param: Option<String>,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    charge: Option<String>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: &'a ErrorBody,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: Box::new(ErrorBody {
                kind,
                code: None,
                decline_code: None,
                param: None,
                message: message.into(),
                charge: None,
            }),
        }
    }

    /// 400 `invalid_request_error`; add a Stripe error code with
    /// [`ApiError::with_code`] where Stripe has one.
    pub(crate) fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 401: no usable API key.
    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
    }

    /// 401 for a key that is not the configured secret key, with Stripe's
    /// message and the key redacted to its last four characters.
    pub(crate) fn invalid_api_key(key: &str) -> Self {
        Self::unauthorized(format!("Invalid API Key provided: {}", redact(key)))
    }

    /// 403: a restricted key without the permission this endpoint needs.
    pub(crate) fn permission_denied(key: &str, path: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            format!(
                "The provided key '{}' does not have the required permissions for this \
                 endpoint ({path}) on account 'acct_sandbox'.",
                redact(key)
            ),
        )
    }

    /// 429 `rate_limit`, as Stripe's rate limiter answers (type
    /// `invalid_request_error`): nothing was done or saved.
    pub(crate) fn rate_limited() -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "invalid_request_error",
            "Request rate limit exceeded. Learn more about rate limits here \
             https://stripe.com/docs/rate-limits (injected by payments-sandbox).",
        )
        .with_code("rate_limit")
    }

    /// 404 for a URL the sandbox does not serve.
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    /// 405 for a known URL with the wrong method.
    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            message,
        )
    }

    /// 402 `card_error`: the card network declined the charge.
    pub(crate) fn card_declined(
        code: &'static str,
        decline_code: &'static str,
        message: &'static str,
        charge_id: String,
    ) -> Self {
        let mut error = Self::new(StatusCode::PAYMENT_REQUIRED, "card_error", message);
        error.body.code = Some(code);
        error.body.decline_code = Some(decline_code);
        error.body.charge = Some(charge_id);
        error
    }

    /// 409: another request with the same idempotency key is being processed.
    pub(crate) fn idempotency_in_progress() -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "idempotency_error",
            "There is currently another in-progress request using this Idempotent Key \
             (that probably means you submitted twice, and the other request is still going \
             through): another request with the same key is in progress. Please try again later.",
        )
    }

    /// 400: the idempotency key was first used with other parameters.
    pub(crate) fn idempotency_mismatch() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "idempotency_error",
            "Keys for idempotent requests can only be used with the same parameters they were \
             first used with. Try using a key other than the one you used if you meant to \
             execute a different request.",
        )
    }

    /// 500 `api_error`: something went wrong on the provider's side; nothing
    /// was charged.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "api_error", message)
    }

    pub(crate) fn with_code(mut self, code: &'static str) -> Self {
        self.body.code = Some(code);
        self
    }

    pub(crate) fn with_param(mut self, param: impl Into<String>) -> Self {
        self.body.param = Some(param.into());
        self
    }

    /// The exact response, ready to be stored for idempotent replay.
    pub(crate) fn to_stored(&self) -> StoredResponse {
        StoredResponse::json(self.status, &Envelope { error: &self.body })
    }
}

/// A key as Stripe shows it in errors: its kind and mode (`sk_test_`),
/// stars, and its last four characters (none of a short key).
fn redact(key: &str) -> String {
    let prefix_len = key.match_indices('_').nth(1).map_or(0, |(at, _)| at + 1);
    let (prefix, rest) = key.split_at(prefix_len);
    let rest: Vec<char> = rest.chars().collect();
    let shown = if rest.len() > 8 { 4 } else { 0 };
    let tail: String = rest[rest.len() - shown..].iter().collect();
    format!("{prefix}{}{tail}", "*".repeat(rest.len() - shown))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.to_stored().into_response()
    }
}
