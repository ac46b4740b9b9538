//! Prometheus metrics: the process-wide recorder, `GET /metrics`, and the
//! middleware that counts every request by route (the matched pattern, so a
//! charge id never becomes a label), method and status.
//!
//! | metric | labels | recorded in |
//! |---|---|---|
//! | `payments_http_requests_total` | route, method, status | here |
//! | `payments_http_request_duration_seconds` | route, method | here |
//! | `payments_idempotent_replays_total` | | routes |
//! | `payments_idempotency_conflicts_total` (409) | | error |
//! | `payments_idempotency_key_reused_total` (422) | | error |
//! | `payments_keyless_requests_total` | mode | routes |
//! | `payments_provider_request_duration_seconds` | outcome | payments-gateway |
//! | `payments_provider_outcomes_total` | outcome | payments-gateway |
//! | `payments_lease_takeovers_total` | | payments-domain |
//! | `payments_reaper_records_total` | result | payments-jobs |
//! | `payments_pruned_records_total` | | payments-jobs |

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

pub use payments_jobs::telemetry::handle;

/// `GET /metrics`: Prometheus text format.
pub async fn metrics() -> Response {
    payments_jobs::telemetry::render()
}

/// Counts and times every request.
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    // Bounded label values: a client can send any method token, and each
    // new one would be a new time series.
    let method = match *request.method() {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    };
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("payments_http_requests_total", "route" => route.clone(), "method" => method, "status" => status)
        .increment(1);
    metrics::histogram!("payments_http_request_duration_seconds", "route" => route, "method" => method)
        .record(started.elapsed().as_secs_f64());
    response
}
