//! The router: the Stripe subset under `/v1`, the sandbox's own control
//! endpoints under `/_sandbox`, and JSON errors for everything else.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{Method, Uri};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::config::SandboxConfig;
use crate::error::ApiError;
use crate::state::AppState;
use crate::{access, captures, charges, refunds, search};

/// Every route the sandbox serves.
pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/v1/charges",
            post(charges::create_charge).get(charges::list_charges),
        )
        .route("/v1/charges/search", get(search::search_charges))
        .route("/v1/charges/{id}", get(charges::retrieve_charge))
        .route("/v1/charges/{id}/capture", post(captures::capture_charge))
        .route(
            "/v1/refunds",
            post(refunds::create_refund).get(refunds::list_refunds),
        )
        .route("/v1/refunds/{id}", get(refunds::retrieve_refund))
        // Every `/v1` route above: recorded, then the secret key checked.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::check,
        ))
        .route("/_sandbox/config", get(get_config).post(set_config))
        .route("/_sandbox/charges", get(list_charges))
        .route("/_sandbox/refunds", get(list_refunds))
        .route("/_sandbox/refunds/{id}", post(refunds::settle_refund))
        .route("/_sandbox/captures", get(captures::list_captures))
        .route("/_sandbox/stats", get(stats))
        .route("/_sandbox/requests", get(list_requests))
        .route("/_sandbox/reset", post(reset))
        .route("/healthz", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn get_config(State(state): State<AppState>) -> Json<SandboxConfig> {
    Json(state.config())
}

/// Replaces the whole config. The body is read as bytes and parsed here so
/// that a bad body gets the error envelope, not axum's plain-text rejection.
async fn set_config(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<SandboxConfig>, ApiError> {
    let body = body.map_err(|rejection| {
        ApiError::invalid_request(format!("The request body could not be read: {rejection}"))
    })?;
    let config: SandboxConfig = serde_json::from_slice(&body)
        .map_err(|error| ApiError::invalid_request(format!("Invalid sandbox config: {error}")))?;
    config.validate().map_err(|invalid| {
        ApiError::invalid_request(invalid.message.clone()).with_param(invalid.field)
    })?;
    tracing::info!(?config, "sandbox config replaced");
    state.set_config(config.clone());
    Ok(Json(config))
}

async fn list_charges(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "data": state.ledger.charges() }))
}

async fn list_refunds(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "data": state.ledger.refunds() }))
}

async fn list_requests(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "data": state.requests.all() }))
}

async fn stats(State(state): State<AppState>) -> Json<Value> {
    Json(json!(state.ledger.stats()))
}

async fn reset(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    state
        .reset()
        .map_err(|error| ApiError::internal(format!("The sandbox was not reset: {error}")))?;
    tracing::info!("sandbox reset: charges, refunds, captures, keys and counters cleared");
    Ok(Json(json!({ "status": "ok" })))
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!(
        "Unrecognized request URL ({method}: {}).",
        uri.path()
    ))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(format!(
        "Method {method} is not allowed for {}.",
        uri.path()
    ))
}
