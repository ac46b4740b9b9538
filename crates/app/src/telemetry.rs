//! The process-wide Prometheus recorder, shared by `payments-jobs` (which
//! serves it on `--metrics-addr`) and `payments-api` (on `GET /metrics`),
//! and [`METRICS`]: every metric either binary exports, with its kind, its
//! `# HELP` text and its known label values.
//!
//! [`install`] describes each metric and registers its known series at
//! zero, so a dashboard reads 0, not "No data", before the first event; and
//! sets [`BUILD_INFO`]. Names are constants: those recorded in
//! payments-domain, payments-gateway and payments-store are theirs; the
//! API's and the jobs' own are defined here (neither crate is below this
//! one) and re-exported where they are recorded
//! (`payments_api::telemetry`, `payments_jobs::{pruner, reaper}`).

use std::future::Future;
use std::sync::OnceLock;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use payments_domain::limits::RATE_LIMITED_TOTAL;
use payments_domain::service::{
    ABANDONED_TOTAL, CAPTURES_TOTAL, HOLDS, LEASE_TAKEOVERS_TOTAL, ORPHANS, PROVIDER_EVENTS_OPEN,
    PROVIDER_EVENTS_TOTAL, RECONCILED_TOTAL, REFUNDS_TOTAL, REPLAY_CACHE_TOTAL,
};
use payments_gateway::{
    PROVIDER_MISMATCH_TOTAL, PROVIDER_OUTCOMES_TOTAL, PROVIDER_REQUEST_DURATION_SECONDS,
};
use payments_store::WRITE_BATCH_SIZE;

/// Requests by `route` (the matched pattern), `method` and `status`.
pub const HTTP_REQUESTS_TOTAL: &str = "payments_http_requests_total";
/// Request latency by `route` and `method`.
pub const HTTP_REQUEST_DURATION_SECONDS: &str = "payments_http_request_duration_seconds";
/// Requests answered from a stored record.
pub const IDEMPOTENT_REPLAYS_TOTAL: &str = "payments_idempotent_replays_total";
/// 409s: the key's first request is still in progress.
pub const IDEMPOTENCY_CONFLICTS_TOTAL: &str = "payments_idempotency_conflicts_total";
/// 422s: the key was reused with another request.
pub const IDEMPOTENCY_KEY_REUSED_TOTAL: &str = "payments_idempotency_key_reused_total";
/// Charges sent without an Idempotency-Key, by the server's `mode`.
pub const KEYLESS_REQUESTS_TOTAL: &str = "payments_keyless_requests_total";
/// The reaper's records, by `result`.
pub const REAPER_RECORDS_TOTAL: &str = "payments_reaper_records_total";
/// Records the pruner deleted.
pub const PRUNED_RECORDS_TOTAL: &str = "payments_pruned_records_total";
/// Holds the jobs runner marked `expired`.
pub const EXPIRED_HOLDS_TOTAL: &str = "payments_expired_holds_total";
/// Webhook delivery attempts by `outcome` (delivered, retrying, failed:
/// given up, lost: another runner took the lease).
pub const WEBHOOK_DELIVERIES_TOTAL: &str = "payments_webhook_deliveries_total";
/// How long ago the oldest event still to deliver was created.
pub const WEBHOOK_OLDEST_UNDELIVERED_SECONDS: &str = "payments_webhook_oldest_undelivered_seconds";
/// Always 1, labelled with the binary's `version` and git `commit`.
pub const BUILD_INFO: &str = "payments_build_info";

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    /// Read as `_bucket`, `_sum` and `_count`.
    Histogram,
    Gauge,
}

/// Which series of a metric exist before its first event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    /// One, without labels.
    One,
    /// One per combination of these labels' values (a closed set, each
    /// value one the recording code writes).
    Each(&'static [(&'static str, &'static [&'static str])]),
    /// None: the label values are only known at the event (a route and a
    /// status), so each series appears with its first event.
    OnFirstEvent,
}

/// Which binary records a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// `payments-api` (which also runs the jobs with `--with-jobs`).
    Api,
    /// `payments-jobs`.
    Jobs,
}

/// One exported metric.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    /// The `# HELP` text.
    pub help: &'static str,
    pub series: Series,
    /// Registered by `payments-jobs` too (not only by `payments-api`).
    pub in_jobs: bool,
}

const PROVIDER_LABELS: &[(&str, &[&str])] = &[
    (
        "outcome",
        &[
            "succeeded",
            "declined",
            "rejected",
            "pending",
            "unknown",
            "key_refused",
            "replayed_error",
            "key_reused",
        ],
    ),
    ("call", &["charges", "refunds"]),
];

/// Every metric the binaries export, with its `# HELP` text and the
/// label values its recording code writes (kept in step with it by hand:
/// a value missing here only shows up on its first event).
pub const METRICS: &[Metric] = &[
    Metric {
        name: HTTP_REQUESTS_TOTAL,
        kind: Kind::Counter,
        help: "HTTP requests answered, by route (the matched pattern), method and status.",
        series: Series::OnFirstEvent,
        in_jobs: false,
    },
    Metric {
        name: HTTP_REQUEST_DURATION_SECONDS,
        kind: Kind::Histogram,
        help: "HTTP request latency in seconds, by route and method.",
        series: Series::OnFirstEvent,
        in_jobs: false,
    },
    Metric {
        name: IDEMPOTENT_REPLAYS_TOTAL,
        kind: Kind::Counter,
        help: "Requests answered from the stored record of their idempotency key (replays).",
        series: Series::One,
        in_jobs: false,
    },
    Metric {
        name: IDEMPOTENCY_CONFLICTS_TOTAL,
        kind: Kind::Counter,
        help: "409 answers: the key's first request was still in progress.",
        series: Series::One,
        in_jobs: false,
    },
    Metric {
        name: IDEMPOTENCY_KEY_REUSED_TOTAL,
        kind: Kind::Counter,
        help: "422 answers: an idempotency key reused with another request.",
        series: Series::One,
        in_jobs: false,
    },
    Metric {
        name: KEYLESS_REQUESTS_TOTAL,
        kind: Kind::Counter,
        help: "Charges sent without an Idempotency-Key, by the server's mode (required: refused).",
        series: Series::Each(&[("mode", &["required", "optional"])]),
        in_jobs: false,
    },
    Metric {
        name: PROVIDER_OUTCOMES_TOTAL,
        kind: Kind::Counter,
        help: "Provider calls by call (charges, refunds) and outcome (succeeded, declined, \
               rejected, unknown; key_refused: our secret key refused, replayed_error: an \
               error the provider saved under the key, replayed; key_reused: the provider \
               holds the key's operation with other parameters).",
        series: Series::Each(PROVIDER_LABELS),
        in_jobs: true,
    },
    Metric {
        name: PROVIDER_REQUEST_DURATION_SECONDS,
        kind: Kind::Histogram,
        help: "Provider call latency in seconds, by call and outcome.",
        series: Series::Each(PROVIDER_LABELS),
        in_jobs: true,
    },
    Metric {
        name: PROVIDER_MISMATCH_TOTAL,
        kind: Kind::Counter,
        help: "Provider charges and refunds that do not show what the operation asked for \
               (amount, currency, paid, captured), by call (charges, refunds: our POST's \
               answer; find_charge, find_refund: reconciliation's lookups). Each is left \
               unknown for a person.",
        series: Series::Each(&[(
            "call",
            &["charges", "refunds", "find_charge", "find_refund"],
        )]),
        in_jobs: true,
    },
    Metric {
        name: LEASE_TAKEOVERS_TOTAL,
        kind: Kind::Counter,
        help: "Expired leases taken over to re-drive a charge or refund.",
        series: Series::One,
        in_jobs: true,
    },
    Metric {
        name: ABANDONED_TOTAL,
        kind: Kind::Counter,
        help: "Requests abandoned with their outcome unknown, by reason (reaper, key_retention, \
               provider_mismatch, replayed_error).",
        series: Series::Each(&[(
            "reason",
            &[
                "reaper",
                "key_retention",
                "provider_mismatch",
                "replayed_error",
            ],
        )]),
        in_jobs: true,
    },
    Metric {
        name: REFUNDS_TOTAL,
        kind: Kind::Counter,
        help: "Refunds by outcome (succeeded, failed, unknown, exceeds_charge; pending: \
               answered 201 pending, settled later by reconciliation).",
        series: Series::Each(&[(
            "outcome",
            &[
                "succeeded",
                "failed",
                "unknown",
                "exceeds_charge",
                "pending",
            ],
        )]),
        in_jobs: true,
    },
    Metric {
        name: CAPTURES_TOTAL,
        kind: Kind::Counter,
        help: "Captures and cancels of holds by action (capture, cancel) and outcome \
               (succeeded, failed, unknown; refused: a stored 400, the hold captured, canceled \
               or lapsing; busy: a 409, another capture or cancel holds it).",
        series: Series::Each(&[
            ("action", &["capture", "cancel"]),
            (
                "outcome",
                &["succeeded", "failed", "unknown", "refused", "busy"],
            ),
        ]),
        in_jobs: true,
    },
    Metric {
        name: HOLDS,
        kind: Kind::Gauge,
        help: "Charges made as holds by status (requires_capture, succeeded once captured, \
               canceled, expired; pending, unknown and failed before authorization); set by \
               each expire pass of payments-jobs.",
        series: Series::Each(&[(
            "status",
            &["requires_capture", "succeeded", "canceled", "expired"],
        )]),
        in_jobs: true,
    },
    Metric {
        name: WEBHOOK_DELIVERIES_TOTAL,
        kind: Kind::Counter,
        help: "Webhook delivery attempts by outcome: delivered (2xx), retrying (anything else, \
               tried again with backoff), failed (given up after WEBHOOK_RETRY_FOR; re-send with \
               payments-jobs webhooks --resend), lost (its lease ran out and another runner \
               took it).",
        series: Series::Each(&[("outcome", &["delivered", "retrying", "failed", "lost"])]),
        in_jobs: true,
    },
    Metric {
        name: WEBHOOK_OLDEST_UNDELIVERED_SECONDS,
        kind: Kind::Gauge,
        help: "How long ago the oldest event with a delivery still to make was created (0: \
               none); set by each deliver pass of payments-jobs.",
        series: Series::One,
        in_jobs: true,
    },
    Metric {
        name: EXPIRED_HOLDS_TOTAL,
        kind: Kind::Counter,
        help: "Holds the jobs runner marked expired: lapsed uncaptured (capture_before passed, \
               by the database's clock).",
        series: Series::One,
        in_jobs: true,
    },
    Metric {
        name: RECONCILED_TOTAL,
        kind: Kind::Counter,
        help: "Reconciliations by operation (charge, refund, capture, cancel) and outcome \
               (settled: succeeded, failed, not_made; left: lagging, needs_person, \
               lookup_failed, pending).",
        series: Series::Each(&[
            ("operation", &["charge", "refund", "capture", "cancel"]),
            (
                "outcome",
                &[
                    "succeeded",
                    "failed",
                    "not_made",
                    "lagging",
                    "needs_person",
                    "lookup_failed",
                    "pending",
                ],
            ),
        ]),
        in_jobs: true,
    },
    Metric {
        name: REPLAY_CACHE_TOTAL,
        kind: Kind::Counter,
        help: "Replays looked up in the in-memory answer cache first, by result (hit, miss).",
        series: Series::Each(&[("result", &["hit", "miss"])]),
        in_jobs: true,
    },
    Metric {
        name: RATE_LIMITED_TOTAL,
        kind: Kind::Counter,
        help: "New charges and refunds refused with 429: their customer was over \
               RATE_LIMIT_PER_MINUTE (per replica), by route.",
        series: Series::Each(&[(
            "route",
            &[
                payments_domain::idempotency::CHARGES_ROUTE,
                payments_domain::idempotency::REFUNDS_ROUTE,
                payments_domain::idempotency::CAPTURES_ROUTE,
                payments_domain::idempotency::CANCELS_ROUTE,
            ],
        )]),
        in_jobs: false,
    },
    Metric {
        name: REAPER_RECORDS_TOTAL,
        kind: Kind::Counter,
        help: "Records the reaper took over, by result (reaped, abandoned, finished_by_other, \
               left, failed).",
        series: Series::Each(&[(
            "result",
            &["reaped", "abandoned", "finished_by_other", "left", "failed"],
        )]),
        in_jobs: true,
    },
    Metric {
        name: PRUNED_RECORDS_TOTAL,
        kind: Kind::Counter,
        help: "Expired complete idempotency records the pruner deleted.",
        series: Series::One,
        in_jobs: true,
    },
    Metric {
        name: WRITE_BATCH_SIZE,
        kind: Kind::Histogram,
        help: "Claims and finishes per committed SQLite transaction (group commit; SQLite only).",
        series: Series::One,
        in_jobs: true,
    },
    Metric {
        name: ORPHANS,
        kind: Kind::Gauge,
        help: "Provider charges and refunds naming one of our operations with no row here \
               (money moved with no record: a database that lost its last writes), not \
               settled yet, by kind; set by each reconcile pass. Runbook: docs/operations.md.",
        series: Series::Each(&[("kind", &["charge", "refund"])]),
        in_jobs: true,
    },
    Metric {
        name: PROVIDER_EVENTS_TOTAL,
        kind: Kind::Counter,
        help: "Provider webhooks (POST /webhooks/provider) by outcome: applied, ignored (none \
               of ours), waiting (names an operation of ours with no row yet; applied again by \
               the reconcile pass), needs_person, duplicate (applied before), unreadable (the \
               provider could not be read: 503, delivered again), store_error, rejected (a bad \
               signature).",
        series: Series::Each(&[(
            "outcome",
            &[
                "applied",
                "ignored",
                "waiting",
                "needs_person",
                "duplicate",
                "unreadable",
                "store_error",
                "rejected",
            ],
        )]),
        in_jobs: true,
    },
    Metric {
        name: PROVIDER_EVENTS_OPEN,
        kind: Kind::Gauge,
        help: "Provider webhooks recorded waiting or needs_person, by state; set by each \
               reconcile pass. Alert on needs_person above 0 (docs/operations.md).",
        series: Series::Each(&[("state", &["waiting", "needs_person"])]),
        in_jobs: true,
    },
    Metric {
        name: BUILD_INFO,
        kind: Kind::Gauge,
        help: "Always 1: the binary's version and the git commit it was built from.",
        series: Series::OnFirstEvent,
        in_jobs: true,
    },
];

/// The git commit the binaries were built from (`git rev-parse --short
/// HEAD` at build time, or `PAYMENTS_GIT_COMMIT`), `unknown` outside a
/// checkout.
pub const GIT_COMMIT: &str = env!("PAYMENTS_GIT_COMMIT");

/// `--version`'s text for a binary at `version`: `0.1.0 (abc1234)`.
pub fn version(version: &str) -> String {
    format!("{version} ({GIT_COMMIT})")
}

/// Latency buckets, in seconds: from a replay (~1 ms) to a slow provider (30 s).
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
];

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// The recorder, installed on first use. Metrics recorded before it is
/// installed are dropped, so binaries call [`install`] at start-up.
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

/// Installs the recorder ([`handle`]), then gives every metric `binary`
/// exports its `# HELP` text and registers its known series at zero, and
/// sets [`BUILD_INFO`] for `version` (the binary's) and [`GIT_COMMIT`].
/// Calling it again is harmless.
pub fn install(
    binary: Binary,
    version: &'static str,
) -> Result<&'static PrometheusHandle, &'static str> {
    let handle = handle()?;
    for metric in METRICS
        .iter()
        .filter(|m| binary == Binary::Api || m.in_jobs)
    {
        register(metric);
    }
    metrics::gauge!(BUILD_INFO, "version" => version, "commit" => GIT_COMMIT).set(1.0);
    Ok(handle)
}

/// Describes `metric` and registers its known series (a counter at 0, a
/// histogram with no observation).
fn register(metric: &Metric) {
    let (name, help) = (metric.name, metric.help);
    match metric.kind {
        Kind::Counter => metrics::describe_counter!(name, help),
        Kind::Histogram => metrics::describe_histogram!(name, help),
        Kind::Gauge => metrics::describe_gauge!(name, help),
    }
    let sets = match metric.series {
        Series::One => vec![Vec::new()],
        Series::Each(labels) => label_sets(labels),
        Series::OnFirstEvent => Vec::new(),
    };
    for labels in sets {
        match metric.kind {
            Kind::Counter => metrics::counter!(name, labels).increment(0),
            // Registered, the exporter shows it with empty buckets.
            Kind::Histogram => drop(metrics::histogram!(name, labels)),
            // A gauge's known series start at 0 (none so far).
            Kind::Gauge => metrics::gauge!(name, labels).set(0.0),
        }
    }
}

/// Every combination of the labels' values.
fn label_sets(labels: &[(&'static str, &'static [&'static str])]) -> Vec<Vec<metrics::Label>> {
    let mut sets = vec![Vec::new()];
    for &(key, values) in labels {
        sets = sets
            .into_iter()
            .flat_map(|set: Vec<metrics::Label>| {
                values.iter().map(move |&value| {
                    let mut set = set.clone();
                    set.push(metrics::Label::new(key, value));
                    set
                })
            })
            .collect();
    }
    sets
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_combination_of_known_labels_is_a_series() {
        let sets = label_sets(PROVIDER_LABELS);
        // 8 outcomes x 2 calls.
        assert_eq!(sets.len(), 16);
        let first: Vec<(&str, &str)> = sets[0].iter().map(|l| (l.key(), l.value())).collect();
        assert_eq!(first, [("outcome", "succeeded"), ("call", "charges")]);
        assert_eq!(label_sets(&[]), vec![Vec::new()]);
    }

    #[test]
    fn names_are_unique_and_help_is_written() {
        let mut names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len());
        assert!(METRICS.iter().all(|m| m.name.starts_with("payments_")));
        assert!(METRICS.iter().all(|m| m.help.ends_with('.')));
    }

    #[test]
    fn the_version_carries_the_commit() {
        assert!(!GIT_COMMIT.is_empty());
        assert_eq!(version("1.2.3"), format!("1.2.3 ({GIT_COMMIT})"));
    }
}
