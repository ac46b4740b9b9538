//! Handlers: extract, call the domain, map the result. Nothing else.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use payments_domain::service::Reply;
use serde_json::json;
use tracing::Instrument;

use crate::AppState;
use crate::auth::Customer;
use crate::config::KeyMode;
use crate::error::ApiError;
use crate::extract::{ChargeIdPath, JsonBody, KeyHeader};

/// `POST /api/charges`.
pub async fn create_charge(
    State(state): State<AppState>,
    Customer(customer): Customer,
    KeyHeader(key): KeyHeader,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let service = state.service.clone();
    let keyless = key.is_none();
    if let Some(key) = &key {
        tracing::Span::current().record("idempotency_key", key.as_str());
    } else {
        let mode = match state.key_mode {
            KeyMode::Required => "required",
            KeyMode::Optional => "optional",
        };
        metrics::counter!(crate::telemetry::KEYLESS_REQUESTS_TOTAL, "mode" => mode).increment(1);
        tracing::warn!(customer = %customer, mode, "request without an Idempotency-Key");
        if state.key_mode == KeyMode::Required {
            return Err(ApiError::KeyMissing(state.client_guide_url.to_string()));
        }
    }
    // Spawned, so a client that gives up mid-call never cancels a charge
    // half-way: the outcome is stored and its retry gets the replay.
    let work = async move {
        match key {
            Some(key) => service.create_charge(&customer, &key, &body).await,
            None => service.create_unprotected_charge(&customer, &body).await,
        }
    };
    let reply = tokio::spawn(work.instrument(tracing::Span::current()))
        .await
        .map_err(|e| ApiError::Internal(format!("charge task failed: {e}")))??;
    if reply.replayed {
        // On the request's own line rather than a line of its own: a replay
        // is the cheapest request there is, and a log line costs more.
        tracing::Span::current().record("replayed", true);
    }
    let mut response = reply_response(reply);
    if keyless {
        // Rollout mode: tell the client, in a header its logs will show,
        // that this request was unprotected and keys become mandatory.
        let warning = format!(
            "299 - \"Idempotency-Key will be required; see {}\"",
            state.client_guide_url
        );
        if let Ok(v) = HeaderValue::from_str(&warning) {
            response.headers_mut().insert(header::WARNING, v);
        }
    }
    Ok(response)
}

/// A stored answer, byte for byte, with its content type and location.
fn reply_response(reply: Reply) -> Response {
    let stored = reply.response;
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&stored.content_type) {
        headers.insert(header::CONTENT_TYPE, v);
    }
    if let Some(Ok(v)) = stored.location.as_deref().map(HeaderValue::from_str) {
        headers.insert(header::LOCATION, v);
    }
    if reply.replayed {
        metrics::counter!(crate::telemetry::IDEMPOTENT_REPLAYS_TOTAL).increment(1);
        headers.insert("idempotent-replay", HeaderValue::from_static("true"));
    }
    response
}

/// `GET /api/charges/{id}`: the owner's charge, else 404.
pub async fn get_charge(
    State(state): State<AppState>,
    Customer(customer): Customer,
    ChargeIdPath(id): ChargeIdPath,
) -> Result<Response, ApiError> {
    let charge = state
        .service
        .charge_for(&customer, &id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        charge.to_json(),
    )
        .into_response())
}

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz`: the database answers and every migration is applied.
pub async fn readyz(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    state
        .service
        .store()
        .ready()
        .await
        .map_err(|e| ApiError::NotReady(e.to_string()))?;
    // The database's own error text stays in the log: it can name hosts,
    // users and schema, and /readyz is often reachable from outside.
    Ok(Json(json!({"status": "ready"})))
}

pub async fn not_found() -> ApiError {
    ApiError::NotFound
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
