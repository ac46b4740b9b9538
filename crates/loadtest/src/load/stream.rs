//! One stream of requests (`charge`, `replay`, `probe_get`, ...): an HDR
//! latency histogram in microseconds, the statuses it got, its transport
//! errors, and the statuses the scenario allows on it.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::time::Instant;

/// The longest latency the histogram tells apart: one hour, in microseconds.
/// Anything longer is recorded as one hour.
const HIGHEST_US: u64 = 3_600_000_000;
/// Three significant digits: 1 µs resolution up to 1 ms, 1 ms up to 1 s.
const SIGNIFICANT_DIGITS: u8 = 3;

/// Why a request got no HTTP answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TransportError {
    /// No answer within the per-request timeout.
    Timeout,
    /// The connection could not be opened.
    Connect,
    /// Anything else in transit (reset, closed, bad framing).
    Other,
    /// Still running when the run stopped (the duration cap plus the drain);
    /// the load generator gave up, not the server.
    Cancelled,
}

impl TransportError {
    pub(crate) fn of(e: &reqwest::Error) -> Self {
        if e.is_timeout() {
            Self::Timeout
        } else if e.is_connect() {
            Self::Connect
        } else {
            Self::Other
        }
    }

    const fn name(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Connect => "connect",
            Self::Other => "other",
            Self::Cancelled => "cancelled",
        }
    }
}

/// A stream's counters. Shared by every task of the stream behind a std
/// mutex: it is never held across an `.await` and each critical section is
/// a histogram increment. One histogram per task would cost ~200 KB each,
/// too much for 1,000 tasks in flight.
#[derive(Debug)]
pub(crate) struct Stream {
    name: &'static str,
    allowed: &'static [u16],
    data: Mutex<Data>,
}

#[derive(Debug)]
struct Data {
    latency_us: Histogram<u64>,
    statuses: BTreeMap<u16, u64>,
    transport: BTreeMap<TransportError, u64>,
    replays: u64,
    first_start: Option<Instant>,
    last_end: Option<Instant>,
}

impl Stream {
    /// A stream on which `allowed` are the statuses the contract permits
    /// in this scenario; any other status is a violation.
    pub(crate) fn new(
        name: &'static str,
        allowed: &'static [u16],
    ) -> Result<Self, hdrhistogram::CreationError> {
        let latency_us = Histogram::new_with_bounds(1, HIGHEST_US, SIGNIFICANT_DIGITS)?;
        Ok(Self {
            name,
            allowed,
            data: Mutex::new(Data {
                latency_us,
                statuses: BTreeMap::new(),
                transport: BTreeMap::new(),
                replays: 0,
                first_start: None,
                last_end: None,
            }),
        })
    }

    /// An answered request: its status, whether it was a replay, and how
    /// long it took from sending to the last byte of the body.
    pub(crate) fn answered(&self, started: Instant, status: u16, replayed: bool) {
        let now = Instant::now();
        let mut data = self.lock();
        data.latency_us.saturating_record(micros(now - started));
        *data.statuses.entry(status).or_default() += 1;
        data.replays += u64::from(replayed);
        data.span(started, now);
    }

    /// A request without an answer. Not in the latency histogram: its
    /// "latency" is the timeout, which says nothing about the server.
    pub(crate) fn failed(&self, started: Instant, error: TransportError) {
        let now = Instant::now();
        let mut data = self.lock();
        *data.transport.entry(error).or_default() += 1;
        data.span(started, now);
    }

    pub(crate) fn report(&self) -> StreamReport {
        let data = self.lock();
        let answered: u64 = data.statuses.values().sum();
        let requests = answered + data.transport.values().sum::<u64>();
        let elapsed = match (data.first_start, data.last_end) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        };
        let throughput = if elapsed.is_zero() {
            0.0
        } else {
            requests as f64 / elapsed.as_secs_f64()
        };
        let h = &data.latency_us;
        let latency_us = (answered > 0).then(|| Latency {
            p50: h.value_at_quantile(0.50),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
            mean: h.mean().round() as u64,
        });
        let disallowed = data
            .statuses
            .iter()
            .filter(|(status, _)| !self.allowed.contains(status))
            .map(|(status, n)| (*status, *n))
            .collect();
        StreamReport {
            name: self.name.to_owned(),
            requests,
            answered,
            elapsed_secs: round3(elapsed.as_secs_f64()),
            throughput_rps: round3(throughput),
            latency_us,
            statuses: data.statuses.clone(),
            replays: data.replays,
            transport_errors: data
                .transport
                .iter()
                .map(|(e, n)| (e.name().to_owned(), *n))
                .collect(),
            allowed: self.allowed.to_vec(),
            disallowed,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Data> {
        // A panic mid-increment leaves counters that are still usable.
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Data {
    fn span(&mut self, started: Instant, ended: Instant) {
        self.first_start = Some(self.first_start.map_or(started, |f| f.min(started)));
        self.last_end = Some(self.last_end.map_or(ended, |l| l.max(ended)));
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Latency percentiles of the answered requests, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub p50: u64,
    pub p95: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: u64,
}

/// What one stream saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamReport {
    pub name: String,
    /// Requests sent, answered or not.
    pub requests: u64,
    /// Requests that got an HTTP status.
    pub answered: u64,
    /// From the first request's start to the last one's end.
    pub elapsed_secs: f64,
    /// `requests / elapsed_secs`.
    pub throughput_rps: f64,
    /// `None` when nothing was answered.
    pub latency_us: Option<Latency>,
    /// Every status and how often it came ("errors by status" included).
    pub statuses: BTreeMap<u16, u64>,
    /// Answers carrying `Idempotent-Replay: true`.
    pub replays: u64,
    /// Requests without an answer, by kind: `timeout`, `connect`, `other`,
    /// `cancelled`.
    pub transport_errors: BTreeMap<String, u64>,
    /// The statuses this scenario permits on this stream.
    pub allowed: Vec<u16>,
    /// Statuses outside `allowed`, and how often: each is a violation.
    pub disallowed: BTreeMap<u16, u64>,
}

/// One count a report shows for a stream: `label` (a status, `replays`, or
/// a transport error's kind), how often, and whether the scenario forbids it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Count {
    pub label: String,
    pub n: u64,
    pub forbidden: bool,
}

impl StreamReport {
    /// The answers by status, then the replays among them (if any).
    pub fn answer_counts(&self) -> Vec<Count> {
        let mut counts: Vec<Count> = self
            .statuses
            .iter()
            .map(|(status, n)| Count {
                label: status.to_string(),
                n: *n,
                forbidden: self.disallowed.contains_key(status),
            })
            .collect();
        if self.replays > 0 {
            counts.push(Count {
                label: "replays".to_owned(),
                n: self.replays,
                forbidden: false,
            });
        }
        counts
    }

    /// The requests that got no answer, by kind.
    pub fn unanswered_counts(&self) -> Vec<Count> {
        self.transport_errors
            .iter()
            .map(|(kind, n)| Count {
                label: kind.clone(),
                n: *n,
                forbidden: false,
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn counts_statuses_replays_and_percentiles() {
        let stream = Stream::new("charge", &[201, 409]).unwrap();
        let t0 = Instant::now();
        for _ in 0..99 {
            stream.answered(t0, 201, false);
        }
        stream.answered(t0, 409, true);
        stream.answered(t0, 500, false);
        stream.failed(t0, TransportError::Timeout);
        let report = stream.report();
        assert_eq!(report.requests, 102);
        assert_eq!(report.answered, 101);
        assert_eq!(report.statuses.get(&201), Some(&99));
        assert_eq!(report.replays, 1);
        assert_eq!(report.transport_errors.get("timeout"), Some(&1));
        assert_eq!(report.disallowed, BTreeMap::from([(500, 1)]));
        let latency = report.latency_us.unwrap();
        assert!(latency.p50 >= 1 && latency.p50 <= latency.max);
    }

    #[test]
    fn an_empty_stream_has_no_latency() {
        let report = Stream::new("probe_get", &[200]).unwrap().report();
        assert_eq!((report.requests, report.latency_us), (0, None));
        assert_eq!(report.throughput_rps, 0.0);
    }
}
