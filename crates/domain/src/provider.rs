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
    /// False for a hold: the provider authorizes the card and captures
    /// later (`capture=false`), answering [`ProviderOutcome::Authorized`].
    pub capture: bool,
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
            capture: charge.capture,
        }
    }
}

/// One capture of a hold (Stripe's `POST /v1/charges/{id}/capture` with
/// `amount`), under the provider key derived from our capture. The
/// provider captures `amount_cents` and releases the rest of the hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCaptureRequest {
    pub idempotency_key: String,
    /// Our charge's id: the provider's charge names it in its metadata.
    pub charge_id: String,
    /// The provider's id of the charge held.
    pub gateway_charge_id: String,
    pub amount_cents: i64,
    /// The charge's currency (ISO 4217, upper case); not sent, checked.
    pub currency: String,
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
    /// The charge's currency (ISO 4217, upper case). Not sent: the provider
    /// refunds in the charge's currency; its answer is checked against it.
    pub currency: String,
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
            currency: refund.currency.clone(),
            reason: refund.reason,
            metadata: refund.metadata.clone(),
        })
    }
}

/// What a provider object must show to be the one our operation asked for:
/// its amount and currency. A charge or refund that shows anything else is
/// never taken for ours as asked, whatever its status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub amount_cents: i64,
    /// ISO 4217, upper case (the provider's lower case matches it).
    pub currency: String,
    /// A charge asked not to be captured (a hold): its success shows
    /// `paid` and `captured: false` ([`ProviderOutcome::Authorized`]).
    /// False for every other charge and for refunds.
    pub hold: bool,
}

impl Expected {
    /// What the charge asked for.
    pub fn of_charge(charge: &Charge) -> Self {
        Self {
            amount_cents: charge.amount_cents,
            currency: charge.currency.clone(),
            hold: !charge.capture,
        }
    }

    /// What the refund asked for, in its charge's currency.
    pub fn of_refund(refund: &Refund) -> Self {
        Self {
            amount_cents: refund.amount_cents,
            currency: refund.currency.clone(),
            hold: false,
        }
    }

    /// What a capture of `amount_cents` of a charge in `currency` must
    /// show: the charge captured, `amount_captured` that amount.
    pub fn of_capture(amount_cents: i64, currency: &str) -> Self {
        Self {
            amount_cents,
            currency: currency.to_owned(),
            hold: false,
        }
    }
}

/// Every provider answer is one of these. `Succeeded`, `Declined` and
/// `Rejected` are final; `Pending` is accepted but not final yet (a refund
/// the provider settles later); anything that leaves the outcome in doubt
/// is `Unknown`, and the same call is re-driven later with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderOutcome {
    /// The provider's id of the charge or refund.
    Succeeded {
        provider_id: String,
    },
    /// A hold: the card was approved and the amount is held, not captured
    /// (a charge made with `capture=false`). `capture_before` (Unix
    /// seconds, the provider's clock) is when the provider releases it
    /// uncaptured, when the provider says.
    Authorized {
        provider_id: String,
        capture_before: Option<i64>,
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
    /// The provider accepted the operation and settles it later (a Stripe
    /// refund `pending` or `requires_action`): not an outage and nothing to
    /// re-drive. Reconciliation polls it by its id until it is final.
    Pending {
        provider_id: String,
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
    /// (a 5xx, a 429).
    ProviderError,
    /// The provider answered that an earlier call under the same key is
    /// still running there (Stripe's 409 `idempotency_error`): it may still
    /// make the charge or refund. Never a reason to give up on the
    /// operation; the time of this answer restarts its search lag.
    InFlight,
    /// The provider's object does not show what the operation asked for
    /// (another amount or currency, a charge not paid or not captured).
    /// The same call gets the same answer: it is left for a person.
    Mismatch,
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
    /// The provider holds our key's operation with other parameters
    /// (Stripe's 400 `idempotency_error`). Keys are derived from the
    /// client's key, so this is the client's key reused with another body
    /// after we lost our record of its first request: that first operation
    /// was made (reconciliation finds it as an orphan, and the client's
    /// retry with its first body adopts it). Answered 422, not stored.
    KeyReused,
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
            Self::InFlight => {
                "the payment provider is still processing this operation, so the outcome is not \
                 known yet; retry with the same idempotency key, which never charges twice"
            }
            Self::Mismatch => {
                "the payment provider's answer does not match this request (amount, currency or \
                 capture), so the outcome is unknown; it is left for a person to reconcile, do \
                 not retry it with a new key"
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
            Self::KeyReused => {
                "this idempotency key was already used with a different request at the payment \
                 provider; retry with the original request body, or use a new key for a new \
                 payment"
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
            Self::InFlight => "in_flight",
            Self::Mismatch => "mismatch",
            Self::ReplayedError => "replayed_error",
            Self::KeyRefused => "key_refused",
            Self::KeyReused => "key_reused",
        }
    }
}

/// What the provider's records say of one of our operations, looked up by
/// the id our calls carried in their metadata (reconciliation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The provider has it, with a final status, or still
    /// [`ProviderOutcome::Pending`].
    Found(ProviderOutcome),
    /// No object carries our id (yet: a search index lags).
    NotFound,
    /// The lookup failed, or what it found is not final: try later.
    Unknown { reason: String },
}

/// Bounds on the provider's `created` time of an object, in Unix seconds,
/// both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatedWindow {
    pub from: i64,
    pub to: i64,
}

/// Which of our operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OperationKind {
    Charge,
    Refund,
}

impl OperationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "charge" => Some(Self::Charge),
            "refund" => Some(Self::Refund),
            _ => None,
        }
    }
}

/// A charge or refund at the provider whose metadata names one of our
/// operations (`metadata[payments_charge_id]`, `payments_refund_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderObject {
    pub kind: OperationKind,
    /// The provider's id.
    pub provider_id: String,
    /// Ours, from its metadata.
    pub operation_id: String,
    pub amount_cents: i64,
    /// ISO 4217, upper case.
    pub currency: String,
    /// The provider's status (`succeeded`, `failed`, `pending`, ...).
    pub status: String,
    /// When the provider made it: Unix seconds, its clock.
    pub created: i64,
}

/// A charge as the provider shows it now, with every refund and dispute
/// of it: what a provider webhook is applied from, whatever the event's
/// own snapshot said ([`crate::inbox`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCharge {
    pub id: String,
    /// Ours, from `metadata[payments_charge_id]`; `None`: a charge made
    /// elsewhere (none of ours).
    pub operation_id: Option<String>,
    pub amount_cents: i64,
    /// ISO 4217, upper case.
    pub currency: String,
    /// Stripe's `status`: `succeeded`, `pending` or `failed`.
    pub status: String,
    pub captured: bool,
    /// What a hold's capture took (Stripe's `amount_captured`).
    pub amount_captured: i64,
    /// Released uncaptured, or refunded in full (Stripe's `refunded`).
    pub refunded: bool,
    pub refunds: Vec<ProviderRefund>,
    pub disputes: Vec<ProviderDispute>,
}

/// One refund of a [`ProviderCharge`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderRefund {
    pub id: String,
    /// Ours, from `metadata[payments_refund_id]`: one of our refunds, or
    /// the release of one of our cancels.
    pub operation_id: Option<String>,
    pub amount_cents: i64,
    /// Stripe's refund `status`: `pending`, `requires_action`,
    /// `succeeded`, `failed` or `canceled`.
    pub status: String,
    /// Stripe's `reason`; `expired_uncaptured_charge` for a hold released
    /// when it lapsed.
    pub reason: Option<String>,
    pub failure_reason: Option<String>,
}

/// One dispute of a [`ProviderCharge`], as Stripe shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderDispute {
    pub id: String,
    pub amount_cents: i64,
    /// ISO 4217, upper case.
    pub currency: String,
    /// Stripe's statuses: `warning_needs_response`, `warning_under_review`,
    /// `warning_closed`, `needs_response`, `under_review`, `won`, `lost`,
    /// `prevented`.
    pub status: String,
    pub reason: String,
    /// `is_charge_refundable`: whether the charge may still be refunded.
    pub refundable: bool,
    /// `evidence_details.due_by` (Unix seconds, the provider's clock).
    pub evidence_due_by: Option<i64>,
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
    /// Search API, which lags behind the provider's writes). Found only if it
    /// shows what was `expected`; otherwise `Unknown`.
    async fn find_charge(&self, charge_id: &str, expected: &Expected) -> Lookup;

    /// The same, read from the provider's charge list (Stripe's
    /// `GET /v1/charges`, which does not lag as its Search may) among the
    /// charges created within `created` (Unix seconds, both ends included),
    /// every page of it. `NotFound` only once the last page was read; a
    /// failed or incomplete read is `Unknown`; found only if it shows what
    /// was `expected`.
    async fn find_charge_listed(
        &self,
        charge_id: &str,
        created: CreatedWindow,
        expected: &Expected,
    ) -> Lookup;

    /// The provider's refund of `gateway_charge_id` whose metadata names our
    /// `refund_id` (Stripe's refund list of the charge, every page of it:
    /// Stripe's Search API has no refunds). `NotFound` only after the last
    /// page; found only if it shows what was `expected`.
    async fn find_refund(
        &self,
        gateway_charge_id: &str,
        refund_id: &str,
        expected: &Expected,
    ) -> Lookup;

    /// Captures `amount_cents` of a held charge (or replays the capture
    /// made under the same key). `Succeeded` (its id the provider's
    /// charge) only when the answer shows the charge captured with
    /// `amount_captured` equal to the amount; `Rejected` when the provider
    /// refuses the capture (`charge_already_captured`,
    /// `charge_expired_for_capture`, `charge_already_refunded`); never
    /// fails, like `create_charge`.
    async fn capture_charge(&self, request: &ProviderCaptureRequest) -> ProviderOutcome;

    /// Whether the held charge `gateway_charge_id` was captured as
    /// `expected` (Stripe's `GET /v1/charges/{id}`): `Found(Succeeded)`
    /// when it shows `captured` with `amount_captured` the expected
    /// amount; `Found(Rejected)` with code `charge_expired_for_capture`
    /// when it was released uncaptured (`refunded`: it lapsed, or was
    /// released); `NotFound` while it is still held uncaptured; `Unknown`
    /// when it was captured with another amount or the read failed.
    async fn find_capture(&self, gateway_charge_id: &str, expected: &Expected) -> Lookup;

    /// The provider's refund `gateway_refund_id` (Stripe's
    /// `GET /v1/refunds/{id}`): how reconciliation polls a refund the
    /// provider answered `pending` until it is final. `NotFound` when the
    /// provider does not know the id; found final only if it shows what was
    /// `expected`.
    async fn retrieve_refund(&self, gateway_refund_id: &str, expected: &Expected) -> Lookup;

    /// The provider's charge `gateway_charge_id` as it is now, with every
    /// page of its refunds and disputes (Stripe's `GET /v1/charges/{id}`,
    /// `GET /v1/refunds?charge=`, `GET /v1/disputes?charge=`). `Ok(None)`
    /// when the provider does not know the id; `Err` unless every read
    /// was whole.
    async fn provider_charge(
        &self,
        gateway_charge_id: &str,
    ) -> Result<Option<ProviderCharge>, String>;

    /// The provider's charge `gateway_charge_id` (Stripe's
    /// `GET /v1/charges/{id}`), judged as reconciliation judges a charge it
    /// found: final only if it shows what was `expected`; `NotFound` when
    /// the provider does not know the id.
    async fn retrieve_charge(&self, gateway_charge_id: &str, expected: &Expected) -> Lookup;

    /// Every charge (or refund) the provider made within `created`, among
    /// those whose metadata names one of our operations (Stripe's
    /// `GET /v1/charges`, `GET /v1/refunds`, every page). `Err` unless the
    /// whole list was read.
    async fn list_ours(
        &self,
        kind: OperationKind,
        created: CreatedWindow,
    ) -> Result<Vec<ProviderObject>, String>;
}
