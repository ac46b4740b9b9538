//! A finished JSON answer kept as bytes, so an idempotent replay sends back
//! exactly what the first request got.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The header Stripe adds to a response served from its idempotency store.
pub(crate) const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// A status and a JSON body, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) body: Bytes,
}

impl StoredResponse {
    pub(crate) fn json(status: StatusCode, value: &impl Serialize) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => Self {
                status,
                body: Bytes::from(body),
            },
            // Our own types always serialise; if one ever does not, say so in
            // the envelope rather than panicking inside a connection.
            Err(error) => {
                tracing::error!(%error, "serialising a response failed");
                Self {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    body: Bytes::from_static(
                        br#"{"error":{"type":"api_error","message":"The sandbox failed to serialise its response."}}"#,
                    ),
                }
            }
        }
    }

    /// The stored answer with `Idempotent-Replayed: true`.
    pub(crate) fn replayed(self) -> Response {
        let mut response = self.into_response();
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        response
    }
}

impl IntoResponse for StoredResponse {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}
