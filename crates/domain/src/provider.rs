//! The port to the payment provider. The adapter (crate `payments-gateway`)
//! speaks HTTP; the domain only sees a request and one of three outcomes.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::charge::Charge;
use crate::refund::{Refund, RefundReason};

/// One charge call, carrying the provider idempotency key derived from our
/// charge, so a re-drive is the same call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderChargeRequest {
    pub idempotency_key: String,
    /// Our charge's id, sent as `metadata[payments_charge_id]` so that
    /// reconciliation can find the provider's charge by it.
    pub charge_id: String,
    pub amount_cents: i64,
    /// ISO 4217, upper case; the adapter converts to the wire form.
    pub currency: String,
    pub card_token: String,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

impl From<&Charge> for ProviderChargeRequest {
    fn from(charge: &Charge) -> Self {
        Self {
            idempotency_key: charge.provider_key.clone(),
            charge_id: charge.id.clone(),
            amount_cents: charge.amount_cents,
            currency: charge.currency.clone(),
            card_token: charge.card_token.as_str().to_owned(),
            description: charge.description.clone(),
            metadata: charge.metadata.clone(),
        }
    }
}

/// One refund call (Stripe's `POST /v1/refunds`), under the provider key
/// derived from our refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderRefundRequest {
    pub idempotency_key: String,
    /// Our refund's id, sent as `metadata[payments_refund_id]`.
    pub refund_id: String,
    /// The provider's id of the charge refunded.
    pub gateway_charge_id: String,
    pub amount_cents: i64,
    pub reason: Option<RefundReason>,
    pub metadata: BTreeMap<String, String>,
}

impl ProviderRefundRequest {
    /// `None` when the charge has no provider id: it was never charged.
    pub fn of(refund: &Refund) -> Option<Self> {
        Some(Self {
            idempotency_key: refund.provider_key.clone(),
            refund_id: refund.id.clone(),
            gateway_charge_id: refund.gateway_charge_id.clone()?,
            amount_cents: refund.amount_cents,
            reason: refund.reason,
            metadata: refund.metadata.clone(),
        })
    }
}

/// Every provider answer is one of these. `Succeeded`, `Declined` and
/// `Rejected` are final; anything that leaves the outcome in doubt is
/// `Unknown`, and the same call is re-driven later with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderOutcome {
    /// The provider's id of the charge or refund.
    Succeeded {
        provider_id: String,
    },
    /// The card was declined, or the refund failed.
    Declined {
        code: String,
        decline_code: Option<String>,
        message: String,
        provider_id: Option<String>,
    },
    /// The provider refused the request itself (Stripe's
    /// `invalid_request_error`: an unknown card token, an amount below its
    /// minimum). Nothing was made, and the same call gets the same answer;
    /// it says nothing about the card.
    Rejected {
        code: String,
        message: String,
    },
    Unknown {
        doubt: Doubt,
        reason: String,
    },
}

/// Why a provider call's outcome is unknown: what the 503 tells the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doubt {
    /// No answer within the gateway timeout: the call may be running still.
    Timeout,
    /// The connection was lost after the request was sent, before the
    /// whole answer arrived: the call may have been made.
    Dropped,
    /// No connection could be made: the request was not sent.
    Unreachable,
    /// The provider answered, with an error or something unreadable
    /// (a 5xx, a 429, our own call still running there).
    ProviderError,
    /// The provider replayed an error it saved under our key (Stripe saves
    /// and replays a 500 for the key's retention, `Idempotent-Replayed:
    /// true`): a re-drive under the same key can never learn more, so the
    /// operation is abandoned to reconciliation instead.
    ReplayedError,
    /// The provider refused our secret key (401, or 403 for a restricted
    /// key without permission): a configuration error. It says nothing
    /// about an earlier call under the same key, so the operation stays as
    /// it was, and the same key works once the secret key is fixed.
    KeyRefused,
}

impl Doubt {
    /// One sentence for the client, ending in what to do.
    pub fn message(self) -> &'static str {
        match self {
            Self::Timeout => {
                "the payment provider did not answer in time, so the outcome is unknown; \
                 retry with the same idempotency key, which never charges twice"
            }
            Self::Dropped => {
                "the connection to the payment provider was lost before its answer arrived, \
                 so the outcome is unknown; retry with the same idempotency key, which never \
                 charges twice"
            }
            Self::Unreachable => {
                "the payment provider could not be reached; retry with the same idempotency key"
            }
            Self::ProviderError => {
                "the payment provider answered with an error, so the outcome is unknown; retry \
                 with the same idempotency key, which never charges twice"
            }
            Self::ReplayedError => {
                "the payment provider repeats the error it gave for this operation, so the \
                 outcome is unknown and is being reconciled; do not retry it with a new key"
            }
            Self::KeyRefused => {
                "the payment provider refused this server's credentials: a configuration \
                 error on our side, nothing was done by this attempt; the same idempotency key \
                 works once it is fixed, do not retry it with a new key"
            }
        }
    }

    /// Its label in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Dropped => "dropped",
            Self::Unreachable => "unreachable",
            Self::ProviderError => "provider_error",
            Self::ReplayedError => "replayed_error",
            Self::KeyRefused => "key_refused",
        }
    }
}

/// What the provider's records say of one of our operations, looked up by
/// the id our calls carried in their metadata (reconciliation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The provider has it, with a final status.
    Found(ProviderOutcome),
    /// No object carries our id (yet: a search index lags).
    NotFound,
    /// The lookup failed, or what it found is not final: try later.
    Unknown { reason: String },
}

/// The payment provider.
#[async_trait]
pub trait Gateway: Send + Sync + std::fmt::Debug {
    /// Creates (or, for a key the provider has seen, replays) a charge.
    /// Never fails: failures are `ProviderOutcome::Unknown`.
    async fn create_charge(&self, request: &ProviderChargeRequest) -> ProviderOutcome;

    /// Creates (or replays) a refund; `Declined` when the provider refused
    /// it or it failed. Never fails, like `create_charge`.
    async fn create_refund(&self, request: &ProviderRefundRequest) -> ProviderOutcome;

    /// The provider's charge whose metadata names our `charge_id` (Stripe's
    /// Search API, which lags behind the provider's writes).
    async fn find_charge(&self, charge_id: &str) -> Lookup;

    /// The provider's refund of `gateway_charge_id` whose metadata names our
    /// `refund_id` (Stripe's refund list of the charge: Stripe's Search API
    /// has no refunds).
    async fn find_refund(&self, gateway_charge_id: &str, refund_id: &str) -> Lookup;
}
