//! What happened at the "card network": every charge made or attempted, and
//! request counters. Tests read both to count provider-side effects.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use rand::Rng;
use rand::distr::Alphanumeric;
use serde::Serialize;

use crate::network::Decline;
use crate::params::ChargeRequest;

/// A charge's final state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ChargeStatus {
    Succeeded,
    Failed,
}

/// Stripe's charge object (the subset the gateway reads, plus a few fields
/// a Stripe client expects to see).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Charge {
    pub(crate) id: String,
    object: &'static str,
    pub(crate) amount: u64,
    pub(crate) currency: String,
    pub(crate) status: ChargeStatus,
    paid: bool,
    captured: bool,
    livemode: bool,
    /// The token, echoed (Stripe returns a card object here).
    source: String,
    description: Option<String>,
    metadata: BTreeMap<String, String>,
    /// Unix seconds.
    pub(crate) created: u64,
    pub(crate) failure_code: Option<&'static str>,
    failure_message: Option<&'static str>,
}

impl Charge {
    /// A new charge with a fresh `ch_` id; `decline` makes it a failed one.
    pub(crate) fn new(request: ChargeRequest, decline: Option<Decline>) -> Self {
        let succeeded = decline.is_none();
        Self {
            id: charge_id(),
            object: "charge",
            amount: request.amount,
            currency: request.currency,
            status: if succeeded {
                ChargeStatus::Succeeded
            } else {
                ChargeStatus::Failed
            },
            paid: succeeded,
            captured: succeeded,
            livemode: false,
            source: request.source,
            description: request.description,
            metadata: request.metadata,
            created: unix_now(),
            failure_code: decline.map(|decline| decline.code),
            failure_message: decline.map(|decline| decline.message),
        }
    }
}

fn charge_id() -> String {
    let suffix: String = rand::rng()
        .sample_iter(Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    format!("ch_{suffix}")
}

fn unix_now() -> u64 {
    // A clock before 1970 is not worth failing a charge over.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_secs())
        .unwrap_or_default()
}

/// One line of `GET /_sandbox/charges`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChargeRecord {
    id: String,
    amount: u64,
    currency: String,
    status: ChargeStatus,
    failure_code: Option<&'static str>,
    idempotency_key: Option<String>,
    created: u64,
}

/// `GET /_sandbox/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Stats {
    pub(crate) requests: u64,
    pub(crate) in_flight: u64,
    pub(crate) max_in_flight: u64,
    pub(crate) charges: u64,
}

/// The charges list and the request counters.
///
/// A std mutex, not a tokio one: it is never held across an `.await`, and
/// every critical section is a push or a clone.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    charges: Mutex<Vec<ChargeRecord>>,
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

impl Ledger {
    /// Counts a charge request and marks it in flight until the guard drops,
    /// however the handling ends (answer, error, client gone).
    pub(crate) fn begin_request(self: &Arc<Self>) -> InFlight {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight {
            ledger: Arc::clone(self),
        }
    }

    pub(crate) fn record(&self, charge: &Charge, idempotency_key: Option<String>) {
        let record = ChargeRecord {
            id: charge.id.clone(),
            amount: charge.amount,
            currency: charge.currency.clone(),
            status: charge.status,
            failure_code: charge.failure_code,
            idempotency_key,
            created: charge.created,
        };
        self.lock_charges().push(record);
    }

    /// Every charge, oldest first.
    pub(crate) fn charges(&self) -> Vec<ChargeRecord> {
        self.lock_charges().clone()
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            requests: self.requests.load(Ordering::SeqCst),
            in_flight: self.in_flight.load(Ordering::SeqCst),
            max_in_flight: self.max_in_flight.load(Ordering::SeqCst),
            charges: self.lock_charges().len() as u64,
        }
    }

    /// Forgets charges and counters. Requests still in flight stay counted
    /// (their guards will decrement), so the high-water mark restarts there.
    pub(crate) fn reset(&self) {
        self.lock_charges().clear();
        self.requests.store(0, Ordering::SeqCst);
        self.max_in_flight
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    fn lock_charges(&self) -> std::sync::MutexGuard<'_, Vec<ChargeRecord>> {
        // A panic while pushing leaves the list valid; keep serving.
        self.charges.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Marks one charge request in flight; decrements on drop.
#[derive(Debug)]
pub(crate) struct InFlight {
    ledger: Arc<Ledger>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.ledger.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_guard_tracks_the_high_water_mark() {
        let ledger = Arc::new(Ledger::default());
        let first = ledger.begin_request();
        let second = ledger.begin_request();
        drop(first);
        drop(second);
        let third = ledger.begin_request();
        let stats = ledger.stats();
        assert_eq!(
            (stats.requests, stats.in_flight, stats.max_in_flight),
            (3, 1, 2)
        );
        drop(third);
        assert_eq!(ledger.stats().in_flight, 0);
    }

    #[test]
    fn charge_ids_look_like_stripe_ids() {
        let id = charge_id();
        assert_eq!(id.len(), 27);
        assert!(id.starts_with("ch_"));
        assert!(id[3..].chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
