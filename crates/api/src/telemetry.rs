//! Prometheus metrics: the process-wide recorder, `GET /metrics`, the
//! middleware that counts every request by route (the matched pattern, so a
//! charge id never becomes a label), method and status, and every metric's
//! name ([`COUNTERS`], [`HISTOGRAMS`], [`GAUGES`]: `tests/docker` checks the
//! Grafana dashboard and the docs against them). Each metric's kind, `# HELP`
//! text and known label values are in [`payments_app::telemetry::METRICS`],
//! which registers them at start (a test here keeps the two lists in step).
//! Each name is a constant of the crate that records it (the API's and the
//! jobs' are defined in payments-app, below both, and re-exported):
//!
//! | metric | labels | recorded in |
//! |---|---|---|
//! | [`HTTP_REQUESTS_TOTAL`] | route, method, status | here |
//! | [`HTTP_REQUEST_DURATION_SECONDS`] | route, method | here |
//! | [`IDEMPOTENT_REPLAYS_TOTAL`] | | routes |
//! | [`IDEMPOTENCY_CONFLICTS_TOTAL`] (409) | | error |
//! | [`IDEMPOTENCY_KEY_REUSED_TOTAL`] (422) | | error |
//! | [`KEYLESS_REQUESTS_TOTAL`] | mode | routes |
//! | [`PROVIDER_REQUEST_DURATION_SECONDS`] | outcome | payments-gateway |
//! | [`PROVIDER_OUTCOMES_TOTAL`] | outcome | payments-gateway |
//! | [`PROVIDER_MISMATCH_TOTAL`] | call | payments-gateway |
//! | [`LEASE_TAKEOVERS_TOTAL`] | | payments-domain |
//! | [`ABANDONED_TOTAL`] | reason | payments-domain, payments-jobs |
//! | [`REFUNDS_TOTAL`] | outcome | payments-domain |
//! | [`CAPTURES_TOTAL`] | action, outcome | payments-domain |
//! | [`HOLDS`] (gauge) | status | payments-jobs |
//! | [`EXPIRED_HOLDS_TOTAL`] | | payments-jobs |
//! | [`RECONCILED_TOTAL`] | operation, outcome | payments-domain (run by payments-jobs) |
//! | [`ORPHANS`] (gauge) | kind | payments-domain (set by payments-jobs) |
//! | [`PROVIDER_EVENTS_TOTAL`] | outcome | payments-domain, payments-api |
//! | [`PROVIDER_EVENTS_OPEN`] (gauge) | state | payments-domain (set by payments-jobs) |
//! | [`REPLAY_CACHE_TOTAL`] | result | payments-domain |
//! | [`RATE_LIMITED_TOTAL`] (429) | route | payments-domain |
//! | [`REAPER_RECORDS_TOTAL`] | result | payments-jobs |
//! | [`PRUNED_RECORDS_TOTAL`] | | payments-jobs |
//! | [`WEBHOOK_DELIVERIES_TOTAL`] | outcome | payments-jobs |
//! | [`WEBHOOK_OLDEST_UNDELIVERED_SECONDS`] (gauge) | | payments-jobs |
//! | [`WRITE_BATCH_SIZE`] (SQLite) | | payments-store |
//! | [`BUILD_INFO`] (gauge, always 1) | version, commit | payments-app |

use std::collections::HashMap;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use payments_app::telemetry::Binary;
use payments_domain::limits::RATE_LIMITED_TOTAL;
use payments_domain::service::{
    ABANDONED_TOTAL, CAPTURES_TOTAL, HOLDS, LEASE_TAKEOVERS_TOTAL, ORPHANS, PROVIDER_EVENTS_OPEN,
    PROVIDER_EVENTS_TOTAL, RECONCILED_TOTAL, REFUNDS_TOTAL, REPLAY_CACHE_TOTAL,
};
use payments_gateway::{
    PROVIDER_MISMATCH_TOTAL, PROVIDER_OUTCOMES_TOTAL, PROVIDER_REQUEST_DURATION_SECONDS,
};
use payments_jobs::deliverer::{WEBHOOK_DELIVERIES_TOTAL, WEBHOOK_OLDEST_UNDELIVERED_SECONDS};
use payments_jobs::pruner::PRUNED_RECORDS_TOTAL;
use payments_jobs::reaper::REAPER_RECORDS_TOTAL;
use payments_store::WRITE_BATCH_SIZE;

pub use payments_app::telemetry::{
    BUILD_INFO, EXPIRED_HOLDS_TOTAL, HTTP_REQUEST_DURATION_SECONDS, HTTP_REQUESTS_TOTAL,
    IDEMPOTENCY_CONFLICTS_TOTAL, IDEMPOTENCY_KEY_REUSED_TOTAL, IDEMPOTENT_REPLAYS_TOTAL,
    KEYLESS_REQUESTS_TOTAL, handle,
};

/// Every counter the binaries export.
pub const COUNTERS: [&str; 19] = [
    HTTP_REQUESTS_TOTAL,
    IDEMPOTENT_REPLAYS_TOTAL,
    IDEMPOTENCY_CONFLICTS_TOTAL,
    IDEMPOTENCY_KEY_REUSED_TOTAL,
    KEYLESS_REQUESTS_TOTAL,
    PROVIDER_OUTCOMES_TOTAL,
    PROVIDER_MISMATCH_TOTAL,
    LEASE_TAKEOVERS_TOTAL,
    ABANDONED_TOTAL,
    REFUNDS_TOTAL,
    RECONCILED_TOTAL,
    REPLAY_CACHE_TOTAL,
    RATE_LIMITED_TOTAL,
    REAPER_RECORDS_TOTAL,
    PRUNED_RECORDS_TOTAL,
    CAPTURES_TOTAL,
    EXPIRED_HOLDS_TOTAL,
    WEBHOOK_DELIVERIES_TOTAL,
    PROVIDER_EVENTS_TOTAL,
];

/// Every histogram (read as `_bucket`, `_sum` and `_count`).
pub const HISTOGRAMS: [&str; 3] = [
    HTTP_REQUEST_DURATION_SECONDS,
    PROVIDER_REQUEST_DURATION_SECONDS,
    WRITE_BATCH_SIZE,
];

/// Every gauge.
pub const GAUGES: [&str; 5] = [
    BUILD_INFO,
    ORPHANS,
    PROVIDER_EVENTS_OPEN,
    HOLDS,
    WEBHOOK_OLDEST_UNDELIVERED_SECONDS,
];

/// Installs the recorder with the API's metrics registered
/// ([`payments_app::telemetry::install`]).
pub fn install() -> Result<(), &'static str> {
    payments_app::telemetry::install(Binary::Api, env!("CARGO_PKG_VERSION")).map(drop)
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics() -> Response {
    payments_app::telemetry::render()
}

/// The handles of one route's series: its duration histogram per method,
/// its counter per (method, status).
#[derive(Default)]
struct RouteSeries {
    durations: Vec<(&'static str, metrics::Histogram)>,
    counts: Vec<((&'static str, u16), metrics::Counter)>,
}

/// Every route's handles, made on a route's first request: a lookup in the
/// recorder hashes and allocates each label per call (2.6% of a replay's
/// CPU in issue 31's profile). Routes are the matched patterns and
/// "unmatched", methods a fixed list, statuses the few the server answers:
/// the map stays small.
static SERIES: std::sync::LazyLock<std::sync::RwLock<HashMap<String, RouteSeries>>> =
    std::sync::LazyLock::new(Default::default);

/// The counter and the histogram of (route, method, status).
fn series(
    route: &str,
    method: &'static str,
    status: u16,
) -> (metrics::Counter, metrics::Histogram) {
    let found = |all: &HashMap<String, RouteSeries>| {
        let series = all.get(route)?;
        let count = series.counts.iter().find(|(k, _)| *k == (method, status))?;
        let duration = series.durations.iter().find(|(m, _)| *m == method)?;
        Some((count.1.clone(), duration.1.clone()))
    };
    if let Some(handles) = found(&SERIES.read().unwrap_or_else(|p| p.into_inner())) {
        return handles;
    }
    let mut all = SERIES.write().unwrap_or_else(|p| p.into_inner());
    let series = all.entry(route.to_owned()).or_default();
    if !series.durations.iter().any(|(m, _)| *m == method) {
        let histogram = metrics::histogram!(HTTP_REQUEST_DURATION_SECONDS, "route" => route.to_owned(), "method" => method);
        series.durations.push((method, histogram));
    }
    if !series.counts.iter().any(|(k, _)| *k == (method, status)) {
        let counter = metrics::counter!(HTTP_REQUESTS_TOTAL, "route" => route.to_owned(), "method" => method, "status" => status.to_string());
        series.counts.push(((method, status), counter));
    }
    found(&all).unwrap_or_else(|| (metrics::Counter::noop(), metrics::Histogram::noop()))
}

/// Counts and times every request.
pub async fn track(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
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
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let (count, duration) = series(route, method, response.status().as_u16());
    count.increment(1);
    duration.record(started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use payments_app::telemetry::{Kind, METRICS};

    /// What payments-app registers and what the docs and dashboard are
    /// checked against are the same metrics.
    #[test]
    fn the_lists_match_the_registered_metrics() {
        let of = |kind| {
            let mut names: Vec<&str> = METRICS
                .iter()
                .filter(|m| m.kind == kind)
                .map(|m| m.name)
                .collect();
            names.sort_unstable();
            names
        };
        let sorted = |list: &[&'static str]| {
            let mut list = list.to_vec();
            list.sort_unstable();
            list
        };
        assert_eq!(of(Kind::Counter), sorted(&COUNTERS));
        assert_eq!(of(Kind::Histogram), sorted(&HISTOGRAMS));
        assert_eq!(of(Kind::Gauge), sorted(&GAUGES));
    }
}
