//! The port to the payment provider. The adapter (crate `payments-gateway`)
//! speaks HTTP; the domain only sees a request and one of three outcomes.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::charge::Charge;

/// One charge call, carrying the provider idempotency key derived from our
/// charge, so a re-drive is the same call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderChargeRequest {
    pub idempotency_key: String,
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
            amount_cents: charge.amount_cents,
            currency: charge.currency.clone(),
            card_token: charge.card_token.as_str().to_owned(),
            description: charge.description.clone(),
            metadata: charge.metadata.clone(),
        }
    }
}

/// Every provider answer is one of these. Only `Succeeded` and `Declined`
/// are final; anything that leaves the outcome in doubt is `Unknown`, and
/// the same call is re-driven later with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderOutcome {
    Succeeded {
        provider_charge_id: String,
    },
    Declined {
        code: String,
        decline_code: Option<String>,
        message: String,
        provider_charge_id: Option<String>,
    },
    Unknown {
        reason: String,
    },
}

/// The payment provider.
#[async_trait]
pub trait Gateway: Send + Sync + std::fmt::Debug {
    /// Creates (or, for a key the provider has seen, replays) a charge.
    /// Never fails: failures are `ProviderOutcome::Unknown`.
    async fn create_charge(&self, request: &ProviderChargeRequest) -> ProviderOutcome;
}
