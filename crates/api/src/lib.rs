//! # payments-api
//!
//! The HTTP face of the payments server; `openapi.yaml` is its contract.
//!
//! # Layout
//!
//! - [`config`]: flags and environment variables, validated at start-up.
//! - [`auth`]: bearer JWTs; the `Customer` extractor.
//! - [`jwks`]: an identity provider's signing keys (JWT_JWKS_URL), fetched,
//!   cached and refreshed.
//! - [`extract`]: the `Idempotency-Key` header and the JSON body, with
//!   rejections in our error envelope.
//! - [`routes`]: thin handlers.
//! - [`error`]: `ApiError`, the one error type, and its envelope.
//! - [`telemetry`]: Prometheus metrics and `GET /metrics`.
//! - [`server`]: the HTTP/1.1 connection loop with header, body and idle
//!   timeouts.
//! - [`router`] and [`serve`]: wiring, middleware, graceful shutdown; tests
//!   bind port 0 and call them directly.
#![forbid(unsafe_code)]

pub mod auth;
pub mod config;
pub mod error;
pub mod extract;
pub mod jwks;
pub mod provider_webhooks;
pub mod routes;
pub mod server;
pub mod telemetry;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, Request, Response, StatusCode};
use axum::routing::{get, post};
use payments_domain::envelope::ErrorEnvelope;
use payments_domain::service::ChargeService;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use crate::auth::Authenticator;
use crate::config::KeyMode;

/// Shared by every handler: the domain service, the token verifier and
/// whether keys are required.
#[derive(Debug, Clone)]
pub struct AppState {
    pub service: Arc<ChargeService>,
    pub auth: Arc<Authenticator>,
    pub key_mode: KeyMode,
    /// Linked from keyless answers (400 in `required` mode, a `Warning` header in `optional`).
    pub client_guide_url: Arc<str>,
    /// Header, body and idle timeouts of the server.
    pub http: server::HttpTimeouts,
    /// `REFUNDS_BY_CUSTOMER`: customers refund their own charges.
    pub refunds_by_customer: bool,
    /// GATEWAY_WEBHOOK_SECRET's secrets (the in-process sandbox's when it
    /// is the provider); `None`: provider webhooks are not taken.
    pub provider_webhook_secrets: Option<Arc<[secrecy::SecretString]>>,
}

impl AppState {
    /// The state `settings` describe, over `service`: what `payments-api`
    /// serves and the tests' `spawn_app` builds alike.
    pub fn new(
        settings: &config::Settings,
        service: Arc<ChargeService>,
    ) -> Result<Self, config::ConfigError> {
        let rules = settings.jwt_rules()?;
        if !rules.back_office.is_configured() {
            tracing::info!(
                "no JWT_BACKOFFICE_AUDIENCE or JWT_BACKOFFICE_ISSUER: no token is the back \
                 office's, and back-office scopes (refunds:write, charges:read_all) count in none"
            );
        }
        if settings.refunds_by_customer {
            tracing::warn!("REFUNDS_BY_CUSTOMER: customers may refund their own charges");
        }
        let auth = Authenticator::with_rules(&settings.jwt_key()?, rules)?;
        Ok(Self {
            service,
            auth: Arc::new(auth),
            key_mode: settings.idempotency_key_mode,
            client_guide_url: settings.client_guide_url.as_str().into(),
            http: settings.http,
            refunds_by_customer: settings.refunds_by_customer,
            provider_webhook_secrets: settings.provider_webhook_secrets()?.map(Into::into),
        })
    }
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The application: routes, the 16 KiB body limit, request ids (taken from
/// `X-Request-Id` or generated, echoed back, and on every log line of the
/// request), and panics turned into a 500 envelope.
pub fn router(state: AppState) -> Router {
    if let Err(e) = telemetry::install() {
        tracing::warn!(error = %e, "metrics recorder unavailable; /metrics will answer 500");
    }
    // Every answer is one INFO line with its status, and an error's code
    // on its span (`error_code`). tower-http's own failure line (ERROR
    // for any 5xx) is off: a provider blip answered 503 with Retry-After
    // is expected, not an error. Errors are logged by their cause where
    // they are answered (`ApiError::into_response`): a database outage and
    // unexpected failures at ERROR, a provider outage at WARN.
    let trace = TraceLayer::new_for_http()
        .on_response(DefaultOnResponse::new().level(tracing::Level::INFO))
        .on_failure(())
        .make_span_with(|request: &Request<_>| {
            let request_id = request
                .headers()
                .get(&REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-");
            tracing::info_span!(
                "request",
                request_id,
                method = %request.method(),
                path = %request.uri().path(),
                subject = tracing::field::Empty,
                role = tracing::field::Empty,
                idempotency_key = tracing::field::Empty,
                replayed = tracing::field::Empty,
                error_code = tracing::field::Empty,
            )
        });
    let key_ttl = axum::middleware::map_response_with_state(state.clone(), with_key_ttl);
    Router::new()
        .route(
            "/api/charges",
            post(routes::create_charge)
                .layer(key_ttl.clone())
                .get(routes::list_charges),
        )
        .route("/api/charges/{id}", get(routes::get_charge))
        .route(
            "/api/charges/{id}/refunds",
            post(routes::create_refund)
                .layer(key_ttl.clone())
                .get(routes::list_refunds),
        )
        .route(
            "/api/charges/{id}/capture",
            post(routes::capture_charge).layer(key_ttl.clone()),
        )
        .route(
            "/api/charges/{id}/cancel",
            post(routes::cancel_charge).layer(key_ttl),
        )
        .route("/api/refunds/{id}", get(routes::get_refund))
        .route("/api/events", get(routes::list_events))
        .route("/api/disputes", get(routes::list_disputes))
        .route(
            routes::PROVIDER_WEBHOOKS,
            post(routes::provider_webhook)
                .layer(DefaultBodyLimit::max(extract::WEBHOOK_MAX_BODY_BYTES)),
        )
        .route("/api/events/{id}", get(routes::get_event))
        .route("/", get(routes::index))
        .route(routes::OPENAPI, get(routes::openapi))
        .route(routes::HEALTHZ, get(routes::healthz))
        .route(routes::READYZ, get(routes::readyz))
        .route(routes::METRICS, get(telemetry::metrics))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn(telemetry::track))
        .layer(DefaultBodyLimit::max(extract::MAX_BODY_BYTES))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(trace)
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

/// How long this server remembers an idempotency key, in seconds
/// (`IDEMPOTENCY_TTL`), on every answer to a charge or a refund, whatever
/// its status: apps cannot reach `/readyz`, and they decide from it how
/// long a saved payment may still be resumed with its key.
pub const KEY_TTL_HEADER: HeaderName = HeaderName::from_static("idempotency-key-ttl");

async fn with_key_ttl(
    axum::extract::State(state): axum::extract::State<AppState>,
    mut response: axum::response::Response,
) -> axum::response::Response {
    let ttl = state.service.policy().ttl.as_secs();
    response
        .headers_mut()
        .insert(KEY_TTL_HEADER, axum::http::HeaderValue::from(ttl));
    response
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response<axum::body::Body> {
    tracing::error!("handler panicked");
    let body = ErrorEnvelope::new("internal_error", "internal error").to_json();
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Serves until `shutdown` resolves, then drains in-flight requests, with
/// the state's header, body and idle timeouts.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let timeouts = state.http;
    server::run(listener, router(state), timeouts, shutdown).await
}
