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

/// Every provider answer is one of these. Only `Succeeded` and `Declined`
/// are final; anything that leaves the outcome in doubt is `Unknown`, and
/// the same call is re-driven later with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderOutcome {
    /// The provider's id of the charge or refund.
    Succeeded {
        provider_id: String,
    },
    Declined {
        code: String,
        decline_code: Option<String>,
        message: String,
        provider_id: Option<String>,
    },
    Unknown {
        reason: String,
    },
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
