//! What every `/v1` request goes through first, as at Stripe, where
//! authentication comes before anything else: the request is recorded
//! (method, path and `Stripe-Version`, for `GET /_sandbox/requests`), then
//! its secret key is checked against the configured one. A key that is not
//! the configured secret key is answered 401 and the configured restricted
//! key 403; neither touches the idempotency keys, so the same request with
//! the right key is processed as new.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::ApiError;
use crate::processing;
use crate::state::AppState;

/// How many requests the log keeps (the newest).
pub(crate) const KEPT: usize = 1000;

/// One `/v1` request as it arrived.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct RequestSeen {
    pub(crate) method: String,
    pub(crate) path: String,
    /// The `Stripe-Version` header, if sent.
    pub(crate) stripe_version: Option<String>,
}

/// The last [`KEPT`] `/v1` requests, oldest first.
#[derive(Debug, Default)]
pub(crate) struct RequestLog {
    seen: Mutex<VecDeque<RequestSeen>>,
}

impl RequestLog {
    fn lock(&self) -> MutexGuard<'_, VecDeque<RequestSeen>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, seen: RequestSeen) {
        let mut log = self.lock();
        if log.len() >= KEPT {
            log.pop_front();
        }
        log.push_back(seen);
    }

    pub(crate) fn all(&self) -> Vec<RequestSeen> {
        self.lock().iter().cloned().collect()
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }
}

/// The middleware on every `/v1` route.
pub(crate) async fn check(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    state.requests.record(RequestSeen {
        method: request.method().to_string(),
        path: path.clone(),
        stripe_version: request
            .headers()
            .get("stripe-version")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
    });
    let config = state.config();
    if let Some(secret) = &config.secret_key {
        let key = match processing::api_key(request.headers()) {
            Ok(key) => key,
            Err(error) => return error.into_response(),
        };
        if config.restricted_key.as_deref() == Some(key.as_str()) {
            tracing::warn!(%path, "restricted key without permission: answering 403");
            return ApiError::permission_denied(&key, &path).into_response();
        }
        if key != *secret {
            tracing::warn!(%path, "not the configured secret key: answering 401");
            return ApiError::invalid_api_key(&key).into_response();
        }
    }
    next.run(request).await
}
