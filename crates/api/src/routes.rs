//! Handlers: extract, call the domain, map the result. Nothing else.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use payments_domain::charge::Charge;
use payments_domain::events::Event;
use payments_domain::hold::HoldAction;
use payments_domain::idempotency::IdempotencyKey;
use payments_domain::inbox::{Dispute, ProviderEvent};
use payments_domain::refund::Refund;
use payments_domain::service::InboxError;
use payments_domain::service::{ChargeError, Reply};
use serde_json::json;
use tracing::Instrument;

use crate::AppState;
use crate::auth::{
    Caller, Capturing, Charging, Reading, ReadingDisputes, ReadingEvents, Refunding,
};
use crate::config::KeyMode;
use crate::error::ApiError;
use crate::extract::{IdPath, JsonBody, KeyHeader, QueryPairs, RawBody};

/// `POST /api/charges`.
pub async fn create_charge(
    State(state): State<AppState>,
    Caller(actor, _): Caller<Charging>,
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
        tracing::warn!(customer = %actor.subject(), mode, "request without an Idempotency-Key");
        if state.key_mode == KeyMode::Required {
            return Err(ApiError::KeyMissing(state.client_guide_url.to_string()));
        }
    }
    let mut response = match key {
        Some(key) => {
            let attempt = service.prepare_charge(&actor, body)?;
            // A replay the cache holds is answered here: no task, no database.
            if let Some(answer) = service.replay_charge(&actor, &key, &attempt) {
                return Ok(answered(answer?));
            }
            spawned(async move { service.charge_attempt(&actor, &key, attempt).await }).await?
        }
        None => {
            spawned(async move { service.create_unprotected_charge(&actor, &body).await }).await?
        }
    };
    if keyless {
        // Rollout mode: tell the client, in a header its logs will show,
        // that this request was unprotected and keys become mandatory.
        // RFC 9111 obsoletes `Warning`, but HTTP clients and proxies still
        // pass it through and log it; the real signal for the server's owner
        // is the `payments_keyless_requests_total` counter.
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

/// `POST /api/charges/{id}/refunds`: the key is always required.
pub async fn create_refund(
    State(state): State<AppState>,
    Caller(actor, _): Caller<Refunding>,
    KeyHeader(key): KeyHeader,
    IdPath(charge_id): IdPath,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let (key, service) = (required(&state, key)?, state.service.clone());
    let work = async move { service.create_refund(&actor, &key, &charge_id, &body).await };
    spawned(work).await
}

/// The key a route always requires (on the request's span), else 400
/// `idempotency_key_missing`.
fn required(state: &AppState, key: Option<IdempotencyKey>) -> Result<IdempotencyKey, ApiError> {
    let key = key.ok_or_else(|| ApiError::KeyMissing(state.client_guide_url.to_string()))?;
    tracing::Span::current().record("idempotency_key", key.as_str());
    Ok(key)
}

/// `POST /api/charges/{id}/capture`: the key is always required.
pub async fn capture_charge(
    state: State<AppState>,
    caller: Caller<Capturing>,
    key: KeyHeader,
    charge_id: IdPath,
    body: JsonBody,
) -> Result<Response, ApiError> {
    act_on_hold(HoldAction::Capture, state, caller, key, charge_id, body).await
}

/// `POST /api/charges/{id}/cancel`: the key is always required.
pub async fn cancel_charge(
    state: State<AppState>,
    caller: Caller<Capturing>,
    key: KeyHeader,
    charge_id: IdPath,
    body: JsonBody,
) -> Result<Response, ApiError> {
    act_on_hold(HoldAction::Cancel, state, caller, key, charge_id, body).await
}

async fn act_on_hold(
    action: HoldAction,
    State(state): State<AppState>,
    Caller(actor, _): Caller<Capturing>,
    KeyHeader(key): KeyHeader,
    IdPath(charge_id): IdPath,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let (key, service) = (required(&state, key)?, state.service.clone());
    let work = async move {
        service
            .act_on_hold(&actor, &key, &charge_id, action, &body)
            .await
    };
    spawned(work).await
}

/// Runs a money-moving operation on a task of its own, so a client that
/// gives up mid-call never cancels it half-way: the outcome is stored and
/// its retry gets the replay.
async fn spawned(
    work: impl Future<Output = Result<Reply, ChargeError>> + Send + 'static,
) -> Result<Response, ApiError> {
    let reply = tokio::spawn(work.instrument(tracing::Span::current()))
        .await
        .map_err(|e| ApiError::Internal(format!("operation task failed: {e}")))??;
    Ok(answered(reply))
}

/// The response to an operation's answer, a replay marked on the request's
/// span.
fn answered(reply: Reply) -> Response {
    if reply.replayed {
        // On the request's own line rather than a line of its own: a replay
        // is the cheapest request there is, and a log line costs more.
        tracing::Span::current().record("replayed", true);
    }
    reply_response(reply)
}

/// Marks a replayed answer (the design's name).
pub const REPLAY_HEADER: &str = "idempotent-replay";
/// Marks a replayed answer (Stripe's name, which its SDKs read).
pub const STRIPE_REPLAY_HEADER: &str = "idempotent-replayed";

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
        // The design's name, and Stripe's: its SDKs read `Idempotent-Replayed`,
        // so a client written against Stripe sees replays without changes.
        headers.insert(REPLAY_HEADER, HeaderValue::from_static("true"));
        headers.insert(STRIPE_REPLAY_HEADER, HeaderValue::from_static("true"));
    }
    response
}

/// `GET /api/charges/{id}`: a charge within the caller's reach, else 404;
/// with its latest dispute (`dispute`) when it has one.
pub async fn get_charge(
    State(state): State<AppState>,
    Caller(actor, _): Caller<Reading>,
    IdPath(id): IdPath,
) -> Result<Response, ApiError> {
    let charge = state.service.charge_for(&actor, &id).await?;
    let charge = charge.ok_or(ApiError::NotFound)?;
    let disputes = state.service.disputes_of(&charge).await?;
    Ok(json(match disputes.last() {
        None => charge.to_json(),
        Some(dispute) => charge.to_json_with("dispute", &dispute.view()),
    }))
}

/// `GET /api/disputes`: a page of disputes, open ones unless `status=all`
/// (`disputes:read`).
pub async fn list_disputes(
    State(state): State<AppState>,
    Caller(actor, _): Caller<ReadingDisputes>,
    QueryPairs(query): QueryPairs,
) -> Result<Response, ApiError> {
    let list = state.service.list_disputes(&actor, &query).await?;
    Ok(json(list.to_json(Dispute::to_json)))
}

/// The provider's signature header (Stripe's).
pub const PROVIDER_SIGNATURE: &str = "stripe-signature";

/// `POST /webhooks/provider`: a provider event, authenticated by its
/// `Stripe-Signature` (no token): applied once, answered 200; a duplicate
/// answered 200 too; one that could not be applied now 503, so the
/// provider delivers it again.
pub async fn provider_webhook(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    let Some(secrets) = &state.provider_webhook_secrets else {
        tracing::warn!("a provider webhook arrived but GATEWAY_WEBHOOK_SECRET is not set");
        return Err(ApiError::NotFound);
    };
    let mut lines = headers.get_all(PROVIDER_SIGNATURE).iter();
    let header = match (lines.next(), lines.next()) {
        (Some(line), None) => line.to_str().map_err(|_| {
            ApiError::InvalidSignature("the header is not visible ASCII".to_owned())
        })?,
        (None, _) => {
            return Err(ApiError::InvalidSignature(
                "no Stripe-Signature header".into(),
            ));
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::InvalidSignature(
                "more than one Stripe-Signature header".into(),
            ));
        }
    };
    crate::provider_webhooks::verify_any(secrets, header, &body)?;
    let event = ProviderEvent::parse(&body).map_err(ApiError::Invalid)?;
    let service = state.service.clone();
    let work = async move { service.receive_provider_event(&event).await };
    let received = tokio::spawn(work.instrument(tracing::Span::current()))
        .await
        .map_err(|e| ApiError::Internal(format!("provider event task failed: {e}")))?;
    match received {
        Ok(received) => {
            Ok(Json(json!({"received": true, "outcome": received.label()})).into_response())
        }
        Err(InboxError::Store(e)) => Err(e.into()),
        Err(e) => Err(ApiError::ProviderEventNotApplied(e.to_string())),
    }
}

/// `GET /api/refunds/{id}`: a refund within the caller's reach, else 404.
pub async fn get_refund(
    State(state): State<AppState>,
    Caller(actor, _): Caller<Reading>,
    IdPath(id): IdPath,
) -> Result<Response, ApiError> {
    let refund = state.service.refund_for(&actor, &id).await?;
    Ok(json(refund.ok_or(ApiError::NotFound)?.to_json()))
}

/// `GET /api/charges`: a page of the caller's charges (with
/// `charges:read_all`: of `customer=`, or of everyone).
pub async fn list_charges(
    State(state): State<AppState>,
    Caller(actor, _): Caller<Reading>,
    QueryPairs(query): QueryPairs,
) -> Result<Response, ApiError> {
    let list = state.service.list_charges(&actor, &query).await?;
    Ok(json(list.to_json(Charge::to_json)))
}

/// `GET /api/charges/{id}/refunds`: a page of a readable charge's refunds.
pub async fn list_refunds(
    State(state): State<AppState>,
    Caller(actor, _): Caller<Reading>,
    IdPath(charge_id): IdPath,
    QueryPairs(query): QueryPairs,
) -> Result<Response, ApiError> {
    let list = state
        .service
        .list_refunds(&actor, &charge_id, &query)
        .await?;
    Ok(json(list.to_json(Refund::to_json)))
}

/// `GET /api/events`: a page of events, newest first (`events:read`).
pub async fn list_events(
    State(state): State<AppState>,
    Caller(actor, _): Caller<ReadingEvents>,
    QueryPairs(query): QueryPairs,
) -> Result<Response, ApiError> {
    let list = state.service.list_events(&actor, &query).await?;
    Ok(json(list.to_json(Event::to_json)))
}

/// `GET /api/events/{id}`: one event (`events:read`), else 404.
pub async fn get_event(
    State(state): State<AppState>,
    Caller(actor, _): Caller<ReadingEvents>,
    IdPath(id): IdPath,
) -> Result<Response, ApiError> {
    let event = state.service.event_for(&actor, &id).await?;
    Ok(json(event.ok_or(ApiError::NotFound)?.to_json()))
}

fn json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

// The paths of the endpoints that need no token, as routed and as `GET /`
// links them.
/// `GET /healthz`.
pub const HEALTHZ: &str = "/healthz";
/// `GET /readyz`.
pub const READYZ: &str = "/readyz";
/// `GET /metrics`.
pub const METRICS: &str = "/metrics";
/// `GET /openapi.yaml`.
pub const OPENAPI: &str = "/openapi.yaml";
/// `POST /webhooks/provider`: the provider's webhooks (signed, no token).
pub const PROVIDER_WEBHOOKS: &str = "/webhooks/provider";

/// The HTTP contract, the repository's `openapi.yaml`, compiled in so the
/// binary stands alone (the Docker build copies it next to the crates).
pub const OPENAPI_YAML: &str = include_str!("../../../openapi.yaml");

/// `GET /`: what this server is, and where to look next.
pub async fn index() -> Json<serde_json::Value> {
    Json(json!({
        "name": env!("CARGO_PKG_NAME"),
        "version": env!("CARGO_PKG_VERSION"),
        "links": {
            "healthz": HEALTHZ,
            "readyz": READYZ,
            "metrics": METRICS,
            "openapi": OPENAPI,
        },
    }))
}

/// `GET /openapi.yaml`: the contract.
pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI_YAML).into_response()
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
