//! Extractors whose rejections are `ApiError`, so bad input always gets the
//! envelope: the `Idempotency-Key` header and the JSON body.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use payments_domain::charge::InvalidRequest;
use payments_domain::idempotency::IdempotencyKey;
use serde_json::Value;

use crate::AppState;
use crate::error::ApiError;

/// Request bodies larger than this get 413.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The largest provider webhook taken (`POST /webhooks/provider`): real
/// events, with their objects' metadata, are larger than the API's bodies.
pub const WEBHOOK_MAX_BODY_BYTES: usize = 256 * 1024;

/// The `Idempotency-Key` header, if sent: exactly one line, 1-255 visible
/// ASCII characters, bare or as a quoted structured-header string.
#[derive(Debug)]
pub struct KeyHeader(pub Option<IdempotencyKey>);

impl<S: Send + Sync> FromRequestParts<S> for KeyHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        key_from_headers(&parts.headers).map(KeyHeader)
    }
}

fn key_from_headers(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::KeyInvalid(
            "send exactly one Idempotency-Key header".into(),
        ));
    }
    let text = value.to_str().map_err(|_| {
        ApiError::KeyInvalid("Idempotency-Key must be 1-255 visible ASCII characters".into())
    })?;
    IdempotencyKey::parse(text)
        .map(Some)
        .map_err(|e| ApiError::KeyInvalid(e.to_string()))
}

/// The `{id}` of `/api/charges/{id}` or `/api/refunds/{id}`; an
/// undecodable segment is a 400 in our envelope rather than axum's
/// plain-text rejection.
#[derive(Debug)]
pub struct IdPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for IdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(id)| IdPath(id))
            .map_err(|rejection| {
                ApiError::Invalid(InvalidRequest {
                    param: Some("id".to_owned()),
                    message: format!("invalid id: {rejection}"),
                })
            })
    }
}

/// The query string's `name=value` pairs, in order, decoded; the domain
/// parses them (and refuses unknown ones).
#[derive(Debug)]
pub struct QueryPairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryPairs {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(pairs)| QueryPairs(pairs))
            .map_err(|rejection| {
                ApiError::Invalid(InvalidRequest::body(format!(
                    "the query string could not be read: {rejection}"
                )))
            })
    }
}

/// A JSON body: `Content-Type: application/json` (else 415), at most
/// [`MAX_BODY_BYTES`] (else 413), all of it within `HTTP_BODY_READ_TIMEOUT`
/// (else 408: a client that trickles its body cannot hold a connection and
/// a task), syntactically valid JSON (else 400).
#[derive(Debug)]
pub struct JsonBody(pub Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        if !is_json(req.headers()) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let read = Bytes::from_request(req, state);
        let bytes = tokio::time::timeout(state.http.http_body_read_timeout, read)
            .await
            .map_err(|_| ApiError::RequestTimeout)?;
        let bytes = bytes.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(MAX_BODY_BYTES)
            } else {
                ApiError::Invalid(InvalidRequest::body(format!(
                    "could not read the request body: {rejection}"
                )))
            }
        })?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::Invalid(InvalidRequest::body(format!(
                "the request body is not valid JSON: {e}"
            )))
        })
    }
}

/// A provider webhook's raw body, as signed: at most
/// [`WEBHOOK_MAX_BODY_BYTES`] (else 413), all of it within
/// `HTTP_BODY_READ_TIMEOUT` (else 408). Its content type is not checked:
/// the signature is what is trusted.
#[derive(Debug)]
pub struct RawBody(pub Bytes);

impl FromRequest<AppState> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let read = Bytes::from_request(req, state);
        let bytes = tokio::time::timeout(state.http.http_body_read_timeout, read)
            .await
            .map_err(|_| ApiError::RequestTimeout)?;
        bytes.map(RawBody).map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(WEBHOOK_MAX_BODY_BYTES)
            } else {
                ApiError::Invalid(InvalidRequest::body(format!(
                    "could not read the request body: {rejection}"
                )))
            }
        })
    }
}

/// `application/json`, with or without parameters such as `charset=utf-8`.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn two_key_lines_are_refused() {
        let mut headers = HeaderMap::new();
        headers.append("idempotency-key", HeaderValue::from_static("a"));
        assert!(key_from_headers(&headers).is_ok());
        headers.append("idempotency-key", HeaderValue::from_static("a"));
        assert!(matches!(
            key_from_headers(&headers),
            Err(ApiError::KeyInvalid(_))
        ));
    }

    #[test]
    fn json_content_types() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(v));
            is_json(&h)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(!with("text/plain"));
        assert!(!is_json(&HeaderMap::new()));
    }
}
