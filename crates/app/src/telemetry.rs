//! The process-wide Prometheus recorder, shared by `payments-jobs` (which
//! serves it on `--metrics-addr`) and `payments-api` (on `GET /metrics`).
//! Metric names are constants of the crates that record them, listed in
//! `payments_api::telemetry`.

use std::future::Future;
use std::sync::OnceLock;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets, in seconds: from a replay (~1 ms) to a slow provider (30 s).
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
];

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// The recorder, installed on first use. Metrics recorded before it is
/// installed are dropped, so binaries call this at start-up.
pub fn handle() -> Result<&'static PrometheusHandle, &'static str> {
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .and_then(|b| {
                    let batch = Matcher::Full(payments_store::WRITE_BATCH_SIZE.to_owned());
                    b.set_buckets_for_metric(batch, payments_store::BATCH_BUCKETS)
                })
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(String::as_str)
}

/// The Prometheus text answer, or 500 when no recorder could be installed.
pub fn render() -> axum::response::Response {
    match handle() {
        Ok(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "application/json")],
            format!(r#"{{"error":{{"code":"internal_error","message":"metrics recorder: {e}"}}}}"#),
        )
            .into_response(),
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown`: the jobs' own
/// scrape target when they run outside the API.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let _ = handle();
    let app = axum::Router::new().route("/metrics", axum::routing::get(|| async { render() }));
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
