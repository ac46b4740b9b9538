//! Webhooks out: the merchant's endpoints, what one delivery attempt is,
//! and the [`WebhookSender`] port that makes it (an HTTP client with an
//! address guard, `payments_gateway::webhook`). The jobs runner delivers (`payments-jobs deliver`).

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::events::{Event, EventType};
use crate::idempotency::LeaseToken;

/// The longest endpoint URL (it is part of a delivery's key).
pub const MAX_URL_LEN: usize = 500;

/// A merchant's endpoint: where events go, the secrets their signatures
/// are made with (each signs: several during a rotation), and the types it
/// wants (empty: all).
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
    pub secrets: Vec<String>,
    pub types: BTreeSet<EventType>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .field("secrets", &self.secrets.len())
            .field("types", &self.types)
            .finish()
    }
}

impl Endpoint {
    /// Whether it wants events of `event_type`.
    pub fn wants(&self, event_type: &str) -> bool {
        self.types.is_empty() || self.types.iter().any(|t| t.as_str() == event_type)
    }

    /// The types it wants, as stored names (empty: all).
    pub fn type_names(&self) -> Vec<&'static str> {
        self.types.iter().map(|t| t.as_str()).collect()
    }
}

/// A delivery's id: `dlv_` and 32 hex digits over its event and endpoint.
pub fn delivery_id(event_id: &str, url: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"payments/delivery\0");
    hash.update(event_id.as_bytes());
    hash.update(b"\0");
    hash.update(url.as_bytes());
    format!("dlv_{}", hex::encode(&hash.finalize()[..16]))
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryState {
    /// To be attempted (again) at its next attempt's time.
    Pending,
    /// An attempt was answered 2xx.
    Delivered,
    /// Every attempt failed for the whole retry window; re-sent by hand.
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Delivered, Self::Failed]
            .into_iter()
            .find(|state| state.as_str() == s)
    }
}

/// One delivery of one event to one endpoint, as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: String,
    pub endpoint: String,
    pub state: DeliveryState,
    /// Attempts made so far.
    pub attempts: u32,
    /// The lease a runner holds while it attempts it.
    pub lease_token: Option<LeaseToken>,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub event: Event,
}

/// How an attempt ended, as the store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempted {
    /// Answered 2xx within the timeout.
    Delivered { status: u16 },
    /// Anything else: tried again `retry_in` from now, unless the delivery
    /// was made `give_up_after` ago or longer (by the database's clock),
    /// then `failed`.
    Failed {
        status: Option<u16>,
        error: String,
        retry_in: Duration,
        give_up_after: Duration,
    },
}

/// What the receiver said to one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// It answered with this status (2xx: delivered).
    Answered(u16),
    /// No answer: refused address, connection error, timeout.
    NoAnswer(String),
}

/// The HTTP client that makes attempts.
#[async_trait]
pub trait WebhookSender: Send + Sync + std::fmt::Debug {
    /// POSTs `body` to `url` with the `Payments-Signature` header
    /// `signature`; never follows a redirect.
    async fn send(&self, url: &str, body: &str, signature: &str) -> Sent;
}

/// The backoff before attempt `attempts + 1`: exponential from `base`,
/// capped at `cap`, with full jitter over its upper half (`jitter` in
/// [0, 1)), so endpoints that failed together do not all come back at once.
pub fn backoff(attempts: u32, base: Duration, cap: Duration, jitter: f64) -> Duration {
    let exp = base.saturating_mul(2u32.saturating_pow(attempts.saturating_sub(1).min(30)));
    let full = exp.min(cap);
    full / 2 + full.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
}

/// A delivery's jitter for its attempt `attempts`, in [0, 1): a function
/// of both, so deliveries that failed together spread out, and a test can
/// know it.
pub fn jitter(delivery_id: &str, attempts: u32) -> f64 {
    let mut hash = Sha256::new();
    hash.update(delivery_id.as_bytes());
    hash.update(attempts.to_be_bytes());
    let digest = hash.finalize();
    let bits = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    f64::from(bits) / (f64::from(u32::MAX) + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_jitters_within_the_upper_half() {
        let (base, cap) = (Duration::from_secs(30), Duration::from_secs(3600));
        assert_eq!(backoff(1, base, cap, 0.0), Duration::from_secs(15));
        assert_eq!(backoff(1, base, cap, 0.999_999).as_secs(), 29);
        assert_eq!(backoff(3, base, cap, 0.0), Duration::from_secs(60));
        assert_eq!(backoff(40, base, cap, 0.0), Duration::from_secs(1800));
        assert!(backoff(40, base, cap, 0.999) <= cap);
    }

    #[test]
    fn an_endpoint_without_types_wants_all() {
        let mut endpoint = Endpoint {
            url: "https://example.com/hook".into(),
            secrets: vec!["whsec_x".into()],
            types: BTreeSet::new(),
        };
        assert!(endpoint.wants("charge.succeeded"));
        endpoint.types.insert(EventType::RefundFailed);
        assert!(!endpoint.wants("charge.succeeded"));
        assert!(endpoint.wants("refund.failed"));
        assert!(!format!("{endpoint:?}").contains("whsec_x"));
    }

    #[test]
    fn delivery_ids_differ_by_endpoint() {
        assert_ne!(
            delivery_id("evt_1", "https://a"),
            delivery_id("evt_1", "https://b")
        );
        assert_eq!(delivery_id("evt_1", "https://a").len(), 36);
    }
}
