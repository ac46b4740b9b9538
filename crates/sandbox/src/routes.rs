//! The router: the Stripe subset under `/v1`, the sandbox's own control
//! endpoints under `/_sandbox`, and JSON errors for everything else.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::SandboxConfig;
use crate::disputes::json_body;
use crate::error::ApiError;
use crate::state::AppState;
use crate::webhooks::RedeliverRefusal;
use crate::{access, captures, charges, disputes, processing, refunds, search};

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
        .route("/v1/disputes", get(disputes::list_disputes))
        .route("/v1/disputes/{id}", get(disputes::retrieve_dispute))
        // Every `/v1` route above: recorded, then the secret key checked.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::check,
        ))
        .route("/_sandbox/config", get(get_config).post(set_config))
        .route("/_sandbox/charges", get(list_charges))
        .route(
            "/_sandbox/charges/{id}/refunds",
            post(refunds::dashboard_refund),
        )
        .route(
            "/_sandbox/charges/{id}/disputes",
            post(disputes::open_dispute),
        )
        .route("/_sandbox/refunds", get(list_refunds))
        .route("/_sandbox/refunds/{id}", post(refunds::settle_refund))
        .route("/_sandbox/disputes", get(disputes::list_all))
        .route("/_sandbox/disputes/{id}", post(disputes::change_dispute))
        .route("/_sandbox/webhooks", get(list_webhooks))
        .route("/_sandbox/webhooks/redeliver", post(redeliver))
        .route("/_sandbox/events/{id}", get(retrieve_event))
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

/// Replaces the whole config, but for where webhooks go: `webhook_url` and
/// `webhook_secret` are the wiring (set at start, or by the API for its
/// in-process sandbox), not a fault, so a body that leaves them out keeps
/// them (`"webhook_url": null` turns events off). The body is read as
/// bytes and parsed here so that a bad body gets the error envelope, not
/// axum's plain-text rejection.
async fn set_config(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<SandboxConfig>, ApiError> {
    let invalid = |error: serde_json::Error| {
        ApiError::invalid_request(format!("Invalid sandbox config: {error}"))
    };
    let body = body.map_err(|rejection| {
        ApiError::invalid_request(format!("The request body could not be read: {rejection}"))
    })?;
    let mut fields: Value = serde_json::from_slice(&body).map_err(invalid)?;
    if let Value::Object(fields) = &mut fields {
        let current = state.config();
        fields
            .entry("webhook_url")
            .or_insert_with(|| json!(current.webhook_url));
        fields
            .entry("webhook_secret")
            .or_insert_with(|| json!(current.webhook_secret));
    }
    let config: SandboxConfig = serde_json::from_value(fields).map_err(invalid)?;
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

async fn list_webhooks(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "data": state.webhooks.records() }))
}

/// `GET /_sandbox/events/{id}`: the event's JSON, byte for byte as sent.
async fn retrieve_event(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = processing::path_id(path)?;
    let body = state.webhooks.event_body(&id).ok_or_else(|| {
        ApiError::not_found(format!("No such event: '{id}'"))
            .with_code("resource_missing")
            .with_param("id")
    })?;
    let mut response = (StatusCode::OK, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// The body of `POST /_sandbox/webhooks/redeliver`; optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Redeliver {
    event_id: Option<String>,
}

/// `POST /_sandbox/webhooks/redeliver` with `{"event_id"?: "evt_.."}`:
/// sends every event kept (or that one) once more, in the background, to
/// the current `webhook_url`; answers `{"data": ["evt_..", ..]}`, the
/// events sent again. 400 without a `webhook_url`, 404 for an unknown
/// event.
async fn redeliver(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body: Redeliver = json_body(body, Some(Redeliver::default()), "redelivery")?;
    let ids = state
        .webhooks
        .redeliver(&state.config(), body.event_id.as_deref())
        .map_err(|refusal| match refusal {
            RedeliverRefusal::Off => {
                ApiError::invalid_request("No webhook_url is configured: there is nowhere to send.")
                    .with_param("webhook_url")
            }
            RedeliverRefusal::NoSuchEvent => ApiError::not_found(format!(
                "No such event: '{}'",
                body.event_id.as_deref().unwrap_or_default()
            ))
            .with_code("resource_missing")
            .with_param("event_id"),
        })?;
    Ok(Json(json!({ "data": ids })))
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
    tracing::info!(
        "sandbox reset: charges, refunds, captures, disputes, keys, counters and webhook \
         events cleared"
    );
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
