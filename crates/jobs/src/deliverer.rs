//! The deliverer: events to the merchant's endpoints, at least once,
//! signed, with backoff (`payments-jobs deliver`, and inside `run` and
//! `payments-api --with-jobs`).
//!
//! A pass first dispatches: every event not dispatched yet gets one
//! delivery per endpoint that wants it, in one transaction with marking it
//! dispatched, so an event is never skipped nor dispatched twice (an event
//! committed late is still found: dispatch reads a flag, not a cursor over
//! time). It then leases the deliveries that are due (several runners at
//! once lease different ones, `SKIP LOCKED`), POSTs each with its
//! `Payments-Signature`, and records the attempt under its lease: 2xx is
//! delivered; anything else is retried with exponential backoff and jitter
//! until the delivery is `WEBHOOK_RETRY_FOR` old (by the database's clock),
//! then failed (a metric and an error log) until re-sent
//! (`payments-jobs webhooks --resend`).
//!
//! A runner killed mid-attempt leaves its lease to run out: another runner
//! (or the same, restarted) attempts the delivery again under the same
//! event id. The lease outlasts the delivery timeout, so a slow attempt is
//! never attempted twice at once.

use std::sync::Arc;
use std::time::Duration;

use payments_domain::store::{AttemptRecorded, NewLease, Store, StoreError};
use payments_domain::webhook::{
    Attempted, Delivery, DeliveryState, Endpoint, Sent, WebhookSender, backoff, jitter,
};
use tokio::task::JoinSet;

pub use payments_app::telemetry::{WEBHOOK_DELIVERIES_TOTAL, WEBHOOK_OLDEST_UNDELIVERED_SECONDS};

/// Events one dispatch transaction takes.
const DISPATCH_BATCH: u32 = 500;
/// Dispatch and lease rounds one pass makes at most, so a pass ends even
/// while events keep coming.
const MAX_ROUNDS: usize = 100;

/// How the deliverer works.
#[derive(Debug, Clone)]
pub struct DelivererSettings {
    pub endpoints: Vec<Endpoint>,
    /// How long a runner holds a delivery while it attempts it: longer than
    /// the sender's timeout.
    pub lease: Duration,
    /// How long a delivery is retried before it is given up.
    pub retry_for: Duration,
    /// The first retry's delay, doubled per attempt up to `backoff_max`.
    pub backoff: Duration,
    pub backoff_max: Duration,
    /// Deliveries leased at a time.
    pub batch: u32,
    /// Attempts in flight at once.
    pub concurrency: usize,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeliverReport {
    /// Events given their deliveries.
    pub dispatched: u64,
    pub delivered: u64,
    /// Attempts that failed and will be retried.
    pub retrying: u64,
    /// Deliveries given up on by this pass.
    pub failed: u64,
    /// Attempts whose lease another runner had taken meanwhile.
    pub lost: u64,
}

impl DeliverReport {
    /// Rows worked on.
    pub fn total(&self) -> u64 {
        self.dispatched + self.delivered + self.retrying + self.failed
    }

    fn count(&mut self, recorded: AttemptRecorded) {
        let (field, outcome) = match recorded {
            AttemptRecorded::Delivered => (&mut self.delivered, "delivered"),
            AttemptRecorded::Retrying => (&mut self.retrying, "retrying"),
            AttemptRecorded::GaveUp => (&mut self.failed, "failed"),
            AttemptRecorded::Lost => (&mut self.lost, "lost"),
        };
        *field += 1;
        metrics::counter!(WEBHOOK_DELIVERIES_TOTAL, "outcome" => outcome).increment(1);
    }
}

/// Delivers events to the configured endpoints.
#[derive(Debug, Clone)]
pub struct Deliverer {
    store: Arc<dyn Store>,
    sender: Arc<dyn WebhookSender>,
    settings: Arc<DelivererSettings>,
}

impl Deliverer {
    pub fn new(
        store: Arc<dyn Store>,
        sender: Arc<dyn WebhookSender>,
        settings: DelivererSettings,
    ) -> Self {
        Self {
            store,
            sender,
            settings: Arc::new(settings),
        }
    }

    /// Dispatches what is new, then attempts what is due, then sets the
    /// oldest undelivered event's age.
    pub async fn try_run_once(&self) -> Result<DeliverReport, StoreError> {
        let mut report = DeliverReport::default();
        for _ in 0..MAX_ROUNDS {
            let dispatched = self
                .store
                .dispatch_events(&self.settings.endpoints, DISPATCH_BATCH)
                .await?;
            report.dispatched += dispatched;
            if dispatched < u64::from(DISPATCH_BATCH) {
                break;
            }
        }
        for _ in 0..MAX_ROUNDS {
            let lease = NewLease::new(self.settings.lease);
            let due = self
                .store
                .claim_deliveries(&lease, self.settings.batch)
                .await?;
            let leased = due.len();
            let mut attempts = JoinSet::new();
            for delivery in due {
                if attempts.len() >= self.settings.concurrency.max(1)
                    && let Some(done) = attempts.join_next().await
                {
                    report.count(flatten(done)?);
                }
                let me = self.clone();
                attempts.spawn(async move { me.attempt(delivery).await });
            }
            while let Some(done) = attempts.join_next().await {
                report.count(flatten(done)?);
            }
            if leased < self.settings.batch as usize {
                break;
            }
        }
        self.oldest().await?;
        if report.failed > 0 {
            tracing::error!(
                failed = report.failed,
                "WEBHOOKS GIVEN UP: deliveries failed for WEBHOOK_RETRY_FOR; re-send them with \
                 `payments-jobs webhooks --resend` once the receiver is back (docs/operations.md)"
            );
        }
        if report.total() > 0 {
            tracing::info!(?report, "deliver pass");
        }
        Ok(report)
    }

    /// Sets the gauge of the oldest event still to deliver; changes nothing.
    pub async fn oldest(&self) -> Result<Option<Duration>, StoreError> {
        let oldest = self.store.oldest_undelivered().await?;
        let seconds = oldest.map_or(0.0, |age| age.as_secs_f64());
        metrics::gauge!(WEBHOOK_OLDEST_UNDELIVERED_SECONDS).set(seconds);
        Ok(oldest)
    }

    /// One attempt of a leased delivery, recorded under its lease.
    async fn attempt(&self, delivery: Delivery) -> Result<AttemptRecorded, StoreError> {
        let Some(token) = delivery.lease_token.clone() else {
            return Err(StoreError::Invariant(format!(
                "delivery {} was leased without a token",
                delivery.id
            )));
        };
        let attempt = match self
            .settings
            .endpoints
            .iter()
            .find(|e| e.url == delivery.endpoint)
        {
            // Removed from WEBHOOK_ENDPOINTS since: given up at once, listed
            // with the failed ones.
            None => Attempted::Failed {
                status: None,
                error: "the endpoint is no longer in WEBHOOK_ENDPOINTS".to_owned(),
                retry_in: self.settings.backoff_max,
                give_up_after: Duration::ZERO,
            },
            Some(endpoint) => self.send(endpoint, &delivery).await,
        };
        let recorded = self.store.attempted(&delivery.id, &token, &attempt).await?;
        let (event, endpoint) = (&delivery.event.id, &delivery.endpoint);
        match (&attempt, recorded) {
            (_, AttemptRecorded::Delivered) => {
                tracing::debug!(event, endpoint, "webhook delivered");
            }
            (Attempted::Failed { status, error, .. }, AttemptRecorded::GaveUp) => {
                tracing::error!(event, endpoint, ?status, %error, attempts = delivery.attempts + 1, "webhook given up");
            }
            (Attempted::Failed { status, error, .. }, _) => {
                tracing::warn!(event, endpoint, ?status, %error, attempts = delivery.attempts + 1, "webhook attempt failed; retried later");
            }
            _ => {}
        }
        Ok(recorded)
    }

    /// POSTs the event, signed with each of the endpoint's secrets.
    async fn send(&self, endpoint: &Endpoint, delivery: &Delivery) -> Attempted {
        let body = delivery.event.to_json();
        // The signature's time is this host's: the receiver compares it
        // with its own clock to refuse a replayed capture of the request.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let secrets: Vec<&str> = endpoint.secrets.iter().map(String::as_str).collect();
        let signature = payments_client::webhook::sign(&secrets, now, body.as_bytes());
        let sent = self.sender.send(&endpoint.url, &body, &signature).await;
        let attempts = delivery.attempts + 1;
        let retry_in = backoff(
            attempts,
            self.settings.backoff,
            self.settings.backoff_max,
            jitter(&delivery.id, attempts),
        );
        let failed = |status, error| Attempted::Failed {
            status,
            error,
            retry_in,
            give_up_after: self.settings.retry_for,
        };
        match sent {
            Sent::Answered(status) if (200..300).contains(&status) => {
                Attempted::Delivered { status }
            }
            Sent::Answered(status) => failed(Some(status), format!("answered {status}")),
            Sent::NoAnswer(why) => failed(None, why),
        }
    }

    /// Deliveries in `state`, for `payments-jobs webhooks`.
    pub async fn list(
        &self,
        state: DeliveryState,
        limit: u32,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.store.deliveries(state, limit).await
    }

    /// Sends again every failed delivery, or every delivery of one event.
    pub async fn resend(&self, event_id: Option<&str>) -> Result<u64, StoreError> {
        self.store.resend(event_id, &self.settings.endpoints).await
    }
}

/// An attempt task's result; a task that panicked is an invariant broken.
fn flatten(
    done: Result<Result<AttemptRecorded, StoreError>, tokio::task::JoinError>,
) -> Result<AttemptRecorded, StoreError> {
    done.map_err(|e| StoreError::Invariant(format!("a delivery attempt failed: {e}")))?
}
