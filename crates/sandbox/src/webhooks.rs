//! Stripe's webhooks: an event for what happens at the sandbox, sent to the
//! configured endpoint (`webhook_url`), signed, retried, and disturbed the
//! way a network and Stripe's at-least-once delivery disturb them.
//!
//! # Events
//!
//! An event is Stripe's event object, `{"id": "evt_..", "object": "event",
//! "api_version": "2024-06-20", "created", "data": {"object": ..},
//! "livemode": false, "pending_webhooks": 1, "request": {"id": null,
//! "idempotency_key": ..}, "type": ..}`, its `data.object` the object as it
//! stood right after the change (a charge, a refund, a dispute).
//! `request.idempotency_key` is the key of the `/v1` request that caused
//! it, as at Stripe (null for the sandbox's own changes: a dashboard
//! refund, a dispute, a lapse); `request.id` is always null (the sandbox
//! has no request ids). Events are made only while a `webhook_url` is set:
//! with none, nothing is made, kept or sent, so a load run without
//! webhooks costs nothing here.
//!
//! # Delivery
//!
//! Each event is a `POST` of its JSON to the endpoint with `Content-Type:
//! application/json` and `Stripe-Signature: t=<unix seconds>,v1=<hex
//! HMAC-SHA256 of "{t}.{body}" keyed with webhook_secret>` (signed by
//! `payments_client::webhook::sign`, so the sandbox and a Rust receiver
//! share one implementation; `t` is the moment of each attempt). Delivery
//! runs on spawned tasks, never on the path of the request that made the
//! event: the request answers without waiting. An attempt answered 2xx
//! delivers the event; one answered otherwise, failing to connect or
//! timing out (10 s) is followed by another after 200 ms, doubling, at
//! most 5 s apart, up to `webhook_max_attempts` in all. At most
//! [`MAX_IN_FLIGHT`] sends are in flight at once, across every event.
//!
//! Where an event goes and how it is signed (`webhook_url`,
//! `webhook_secret`), when it is first sent (`webhook_delay_ms`,
//! `webhook_shuffle_ms`), how long a lost attempt waits
//! (`webhook_redeliver_ms`) and how many attempts it gets are fixed when it
//! is made. What the network does to an attempt (`webhook_drop_rate`,
//! `webhook_duplicate`) is read when the attempt is made, as a network's
//! faults are of the moment: a test can lose a first attempt and let the
//! next one through.
//!
//! # Records
//!
//! Every event made and each of its attempts is kept in memory for
//! `GET /_sandbox/webhooks` (the newest [`KEPT_EVENTS`]), `GET
//! /_sandbox/events/{id}` and `POST /_sandbox/webhooks/redeliver`. Records
//! and pending deliveries are in memory only: a restart forgets them (a
//! ledger file keeps none), and `POST /_sandbox/reset` forgets them and
//! stops the deliveries still pending, as does the sandbox stopping.
//!
//! # Lapsed holds
//!
//! A hold's lapse is worked out from its deadline when read (`ledger`), so
//! nothing happens at the moment it lapses. While a `webhook_url` is set, a
//! ticker looks every [`EXPIRY_TICK`] for holds that lapsed since webhooks
//! were turned on (or the sandbox started) and announces each once,
//! `charge.expired`, keeping the ids it announced in memory.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use axum::body::Bytes;
use rand::Rng;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::config::SandboxConfig;
use crate::ledger::{Ledger, object_id, unix_now_ms};
use crate::processing::injected_error;

/// The API version the events are rendered in, as Stripe names it.
pub(crate) const API_VERSION: &str = "2024-06-20";

/// The header that carries the signature, as Stripe names it.
pub(crate) const SIGNATURE_HEADER: &str = "Stripe-Signature";

/// Stripe's user agent for webhook deliveries.
const USER_AGENT: &str = "Stripe/1.0 (+https://stripe.com/docs/webhooks)";

/// How long one send may take, connecting included.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The wait after a first failed attempt; doubled after each failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Sends in flight at once, across every event (each copy of a duplicate
/// counts).
pub(crate) const MAX_IN_FLIGHT: usize = 32;

/// Events kept for `GET /_sandbox/webhooks`, the newest. An event dropped
/// from the records is still delivered; its attempts are just not shown.
pub(crate) const KEPT_EVENTS: usize = 10_000;

/// How often lapsed holds are looked for, while webhooks are on.
pub(crate) const EXPIRY_TICK: Duration = Duration::from_millis(500);

/// What became of one send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub(crate) enum Attempt {
    /// The endpoint answered with this status.
    Answered {
        status: u16,
        /// The second copy of a duplicated attempt.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
    },
    /// No answer: the connection failed or timed out.
    Failed {
        error: String,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
    },
    /// Lost in the network (`webhook_drop_rate`): not sent at all.
    Dropped { dropped: bool },
}

impl Attempt {
    fn delivered(&self) -> bool {
        matches!(self, Self::Answered { status, .. } if (200..300).contains(status))
    }

    /// The same, as the second copy of a duplicated attempt.
    fn into_duplicate(self) -> Self {
        match self {
            Self::Answered { status, .. } => Self::Answered {
                status,
                duplicate: true,
            },
            Self::Failed { error, .. } => Self::Failed {
                error,
                duplicate: true,
            },
            dropped @ Self::Dropped { .. } => dropped,
        }
    }
}

/// An event made, with its attempts so far.
#[derive(Debug)]
struct EventEntry {
    id: String,
    kind: &'static str,
    /// The id of the object in `data.object`.
    object_id: String,
    /// Unix seconds.
    created: u64,
    /// The event's JSON, exactly as sent.
    body: Bytes,
    attempts: Mutex<Vec<Attempt>>,
    delivered: AtomicBool,
}

impl EventEntry {
    fn record(&self, attempts: impl IntoIterator<Item = Attempt>) {
        let mut recorded = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        for attempt in attempts {
            if attempt.delivered() {
                self.delivered.store(true, Ordering::SeqCst);
            }
            recorded.push(attempt);
        }
    }

    fn view(&self) -> EventRecord {
        EventRecord {
            id: self.id.clone(),
            kind: self.kind,
            object_id: self.object_id.clone(),
            created: self.created,
            attempts: self
                .attempts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            delivered: self.delivered.load(Ordering::SeqCst),
        }
    }
}

/// One line of `GET /_sandbox/webhooks`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct EventRecord {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    object_id: String,
    created: u64,
    attempts: Vec<Attempt>,
    /// An attempt was answered 2xx.
    delivered: bool,
}

/// Stripe's event object, as sent.
#[derive(Debug, Serialize)]
struct Event<'a> {
    id: &'a str,
    object: &'static str,
    api_version: &'static str,
    created: u64,
    data: EventData<'a>,
    livemode: bool,
    pending_webhooks: u32,
    request: EventRequest<'a>,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Debug, Serialize)]
struct EventData<'a> {
    object: &'a Value,
}

/// The API request that caused the event.
#[derive(Debug, Serialize)]
struct EventRequest<'a> {
    id: Option<&'a str>,
    idempotency_key: Option<&'a str>,
}

/// How an event is delivered, fixed when it is made.
#[derive(Debug, Clone)]
struct Plan {
    url: String,
    secret: String,
    /// Before the first attempt: the delay and the shuffle's draw.
    first_wait: Duration,
    /// After a lost attempt.
    redeliver: Duration,
    max_attempts: u32,
}

impl Plan {
    fn of(config: &SandboxConfig) -> Option<Self> {
        let url = config.webhook_url.clone()?;
        let shuffle = match config.webhook_shuffle_ms {
            0 => 0,
            most => rand::rng().random_range(0..=most),
        };
        Some(Self {
            url,
            secret: config.webhook_secret.clone(),
            first_wait: Duration::from_millis(config.webhook_delay_ms.saturating_add(shuffle)),
            redeliver: Duration::from_millis(config.webhook_redeliver_ms),
            max_attempts: config.webhook_max_attempts.max(1),
        })
    }
}

/// Why `POST /_sandbox/webhooks/redeliver` sent nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RedeliverRefusal {
    /// No `webhook_url` to send to.
    Off,
    /// No event has this id (or it is no longer kept).
    NoSuchEvent,
}

/// The events made, their deliveries, and the lapsed holds announced.
#[derive(Debug)]
pub(crate) struct Webhooks {
    /// The live config, for the faults read at each attempt.
    config: Arc<RwLock<SandboxConfig>>,
    /// Oldest first, at most [`KEPT_EVENTS`].
    events: Mutex<VecDeque<Arc<EventEntry>>>,
    /// Built on first use: building can fail (no TLS roots), and a sandbox
    /// that never sends a webhook should not fail for it.
    client: OnceLock<Result<reqwest::Client, String>>,
    in_flight: Semaphore,
    /// Bumped by a reset and at shutdown: a delivery of an older
    /// generation stops before its next attempt.
    generation: AtomicU64,
    /// The sandbox stopped: no more events are made.
    closed: AtomicBool,
    /// The holds whose lapse was announced (`charge.expired`).
    expired: Mutex<HashSet<String>>,
}

impl Webhooks {
    pub(crate) fn new(config: Arc<RwLock<SandboxConfig>>) -> Self {
        Self {
            config,
            events: Mutex::default(),
            client: OnceLock::new(),
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            generation: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            expired: Mutex::default(),
        }
    }

    /// Whether events are made under `config`.
    pub(crate) fn on(&self, config: &SandboxConfig) -> bool {
        config.webhook_url.is_some() && !self.closed.load(Ordering::SeqCst)
    }

    /// Makes an event of `kind` about `object` (as it stands now), if
    /// webhooks are on in `config` (the config of the change), and sends it
    /// in the background. `idempotency_key`: the key of the `/v1` request
    /// that caused it.
    pub(crate) fn emit(
        self: &Arc<Self>,
        config: &SandboxConfig,
        idempotency_key: Option<&str>,
        kind: &'static str,
        object: &impl Serialize,
    ) {
        if !self.on(config) {
            return;
        }
        let Some(plan) = Plan::of(config) else {
            return;
        };
        let object = match serde_json::to_value(object) {
            Ok(object) => object,
            Err(error) => {
                tracing::error!(%error, kind, "an event's object did not serialise: not sent");
                return;
            }
        };
        let id = object_id("evt");
        let created = unix_now_ms() / 1000;
        let event = Event {
            id: &id,
            object: "event",
            api_version: API_VERSION,
            created,
            data: EventData { object: &object },
            livemode: false,
            pending_webhooks: 1,
            request: EventRequest {
                id: None,
                idempotency_key,
            },
            kind,
        };
        let body = match serde_json::to_vec(&event) {
            Ok(body) => Bytes::from(body),
            Err(error) => {
                tracing::error!(%error, kind, "an event did not serialise: not sent");
                return;
            }
        };
        let entry = Arc::new(EventEntry {
            object_id: object["id"].as_str().unwrap_or_default().to_owned(),
            id,
            kind,
            created,
            body,
            attempts: Mutex::default(),
            delivered: AtomicBool::new(false),
        });
        {
            let mut events = self.events();
            if events.len() >= KEPT_EVENTS {
                events.pop_front();
            }
            events.push_back(Arc::clone(&entry));
        }
        tracing::debug!(event = %entry.id, kind, object = %entry.object_id, "event made");
        let generation = self.generation.load(Ordering::SeqCst);
        self.spawn(Arc::clone(self).deliver(entry, plan, generation));
    }

    /// Runs `task` on the runtime; a sandbox always has one (its handlers
    /// run on it), so without one the event is only logged.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(task)),
            Err(error) => tracing::error!(%error, "no runtime to deliver an event on"),
        }
    }

    fn events(&self) -> MutexGuard<'_, VecDeque<Arc<EventEntry>>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every event kept, oldest first, with its attempts.
    pub(crate) fn records(&self) -> Vec<EventRecord> {
        self.events().iter().map(|entry| entry.view()).collect()
    }

    /// The event `id`'s JSON, as sent.
    pub(crate) fn event_body(&self, id: &str) -> Option<Bytes> {
        self.events()
            .iter()
            .rev()
            .find(|entry| entry.id == id)
            .map(|entry| entry.body.clone())
    }

    /// Sends every event kept (or only `id`) once more, now, to the
    /// current `webhook_url` with the current secret, whatever became of
    /// it before: one attempt each (two with `webhook_duplicate`), never
    /// lost, never retried. Returns their ids, oldest first.
    pub(crate) fn redeliver(
        self: &Arc<Self>,
        config: &SandboxConfig,
        id: Option<&str>,
    ) -> Result<Vec<String>, RedeliverRefusal> {
        let url = config.webhook_url.clone().ok_or(RedeliverRefusal::Off)?;
        let chosen: Vec<Arc<EventEntry>> = self
            .events()
            .iter()
            .filter(|entry| id.is_none_or(|id| entry.id == id))
            .cloned()
            .collect();
        if id.is_some() && chosen.is_empty() {
            return Err(RedeliverRefusal::NoSuchEvent);
        }
        let generation = self.generation.load(Ordering::SeqCst);
        let ids = chosen.iter().map(|entry| entry.id.clone()).collect();
        for entry in chosen {
            let webhooks = Arc::clone(self);
            let (url, secret) = (url.clone(), config.webhook_secret.clone());
            let duplicate = config.webhook_duplicate;
            self.spawn(async move {
                if !webhooks.cancelled(generation) {
                    webhooks.attempt(&entry, &url, &secret, duplicate).await;
                }
            });
        }
        Ok(ids)
    }

    /// Forgets every event and announced lapse, and stops the deliveries
    /// still pending (`POST /_sandbox/reset`).
    pub(crate) fn reset(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.events().clear();
        self.expired().clear();
    }

    /// The sandbox stopped: no more events, and pending deliveries stop
    /// before their next attempt.
    pub(crate) fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    fn cancelled(&self, generation: u64) -> bool {
        self.generation.load(Ordering::SeqCst) != generation
    }

    fn expired(&self) -> MutexGuard<'_, HashSet<String>> {
        self.expired.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `webhook_drop_rate` and `webhook_duplicate`, now.
    fn network_faults(&self) -> (f64, bool) {
        let config = self.config.read().unwrap_or_else(PoisonError::into_inner);
        (config.webhook_drop_rate, config.webhook_duplicate)
    }

    /// The event's attempts, as `plan` says, until one is delivered.
    async fn deliver(self: Arc<Self>, entry: Arc<EventEntry>, plan: Plan, generation: u64) {
        if !plan.first_wait.is_zero() {
            tokio::time::sleep(plan.first_wait).await;
        }
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1..=plan.max_attempts {
            if self.cancelled(generation) {
                return;
            }
            let (drop_rate, duplicate) = self.network_faults();
            let wait = if injected_error(drop_rate) {
                tracing::debug!(event = %entry.id, attempt, "fault injection: webhook lost");
                entry.record([Attempt::Dropped { dropped: true }]);
                plan.redeliver
            } else if self
                .attempt(&entry, &plan.url, &plan.secret, duplicate)
                .await
            {
                return;
            } else {
                let wait = backoff;
                backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
                wait
            };
            if attempt < plan.max_attempts {
                tokio::time::sleep(wait).await;
            }
        }
        if !self.cancelled(generation) {
            tracing::warn!(
                event = %entry.id,
                kind = entry.kind,
                attempts = plan.max_attempts,
                url = %plan.url,
                "webhook not delivered: giving up"
            );
        }
    }

    /// One attempt (two sends at once with `duplicate`), recorded; whether
    /// it delivered the event.
    async fn attempt(&self, entry: &EventEntry, url: &str, secret: &str, duplicate: bool) -> bool {
        let attempts = if duplicate {
            let (first, second) = tokio::join!(
                self.send(url, secret, &entry.body),
                self.send(url, secret, &entry.body)
            );
            vec![first, second.into_duplicate()]
        } else {
            vec![self.send(url, secret, &entry.body).await]
        };
        let delivered = attempts.iter().any(Attempt::delivered);
        tracing::debug!(event = %entry.id, ?attempts, "webhook attempt");
        entry.record(attempts);
        delivered
    }

    /// One `POST`, signed now, within the global cap of sends in flight.
    async fn send(&self, url: &str, secret: &str, body: &Bytes) -> Attempt {
        let failed = |error: String| Attempt::Failed {
            error,
            duplicate: false,
        };
        // The semaphore is never closed.
        let Ok(_permit) = self.in_flight.acquire().await else {
            return failed("the sandbox is stopping".to_owned());
        };
        let client = match self.client() {
            Ok(client) => client,
            Err(error) => return failed(error),
        };
        let timestamp = i64::try_from(unix_now_ms() / 1000).unwrap_or(i64::MAX);
        let signature = payments_client::webhook::sign(&[secret], timestamp, body);
        let sent = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) => Attempt::Answered {
                status: response.status().as_u16(),
                duplicate: false,
            },
            Err(error) => failed(error_chain(&error)),
        }
    }

    fn client(&self) -> Result<&reqwest::Client, String> {
        self.client
            .get_or_init(|| {
                // No proxy: the endpoint is nearly always the payments API
                // on this machine or network, and a proxy from the
                // environment would only get in the way.
                reqwest::Client::builder()
                    .timeout(ATTEMPT_TIMEOUT)
                    .user_agent(USER_AGENT)
                    .no_proxy()
                    .build()
                    .map_err(|error| {
                        format!(
                            "the sandbox cannot make an HTTP client: {}",
                            error_chain(&error)
                        )
                    })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Announces each hold that lapses while webhooks are on, once
    /// (`charge.expired`), looking every [`EXPIRY_TICK`] until the sandbox
    /// stops. A hold that lapsed while they were off (or before the
    /// sandbox started) is not announced when they are turned on.
    pub(crate) async fn watch_expiries(self: Arc<Self>, ledger: Arc<Ledger>) {
        let mut ticker = tokio::time::interval(EXPIRY_TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The last moment webhooks were seen off.
        let mut off_at = unix_now_ms();
        loop {
            ticker.tick().await;
            if self.closed.load(Ordering::SeqCst) {
                return;
            }
            let now_ms = unix_now_ms();
            let config = {
                let config = self.config.read().unwrap_or_else(PoisonError::into_inner);
                // Off, the usual case: no copy, no scan.
                self.on(&config).then(|| config.clone())
            };
            let Some(config) = config else {
                off_at = now_ms;
                continue;
            };
            let lapsed = {
                let mut expired = self.expired();
                let lapsed = ledger.lapsed_holds(off_at, now_ms, |id| !expired.contains(id));
                expired.extend(lapsed.iter().map(|charge| charge.id.clone()));
                lapsed
            };
            for charge in &lapsed {
                self.emit(&config, None, "charge.expired", charge);
            }
        }
    }
}

/// An error with its causes, `outer: inner: ...`: reqwest's own message
/// says only which request failed.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_read_as_the_brief_says() -> Result<(), serde_json::Error> {
        let attempts = [
            Attempt::Answered {
                status: 200,
                duplicate: false,
            },
            Attempt::Answered {
                status: 500,
                duplicate: false,
            }
            .into_duplicate(),
            Attempt::Failed {
                error: "refused".into(),
                duplicate: false,
            },
            Attempt::Dropped { dropped: true },
        ];
        assert_eq!(
            serde_json::to_value(&attempts)?,
            serde_json::json!([{"status": 200}, {"status": 500, "duplicate": true},
                {"error": "refused"}, {"dropped": true}])
        );
        let delivered: Vec<bool> = attempts.iter().map(Attempt::delivered).collect();
        assert_eq!(delivered, [true, false, false, false]);
        Ok(())
    }

    #[test]
    fn a_plan_only_with_a_url_and_its_first_wait_within_delay_and_shuffle() {
        assert!(Plan::of(&SandboxConfig::default()).is_none());
        let config = SandboxConfig {
            webhook_url: Some("http://127.0.0.1:9/hooks".into()),
            webhook_delay_ms: 100,
            webhook_shuffle_ms: 50,
            ..SandboxConfig::default()
        };
        for _ in 0..100 {
            let wait = Plan::of(&config).map(|plan| plan.first_wait.as_millis());
            assert!(
                wait.is_some_and(|wait| (100..=150).contains(&wait)),
                "{wait:?}"
            );
        }
    }
}
