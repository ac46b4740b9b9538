//! Refunds: the request a charge's owner sends, validated once at the edge,
//! and the refund row recorded before, during and after the provider call.
//!
//! A refund is its own idempotent operation (its record's route is
//! [`crate::idempotency::REFUNDS_ROUTE`]), driven through the same state
//! machine as a charge. Its amount is reserved on the charge in its claim's
//! transaction, so the refunds of a charge that are pending, succeeded or
//! unknown never add up to more than the charge.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::charge::{AmountCents, Charge, ChargeStatus, InvalidRequest, metadata};
use crate::envelope::ErrorEnvelope;
use crate::idempotency::StoredResponse;
use crate::scope::{Actor, Role};
use crate::time;

/// A refund moves through the same four states as a charge.
pub type RefundStatus = ChargeStatus;

/// Why a refund was asked for: Stripe's three reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    RequestedByCustomer,
    Duplicate,
    Fraudulent,
}

impl RefundReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequestedByCustomer => "requested_by_customer",
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "requested_by_customer" => Self::RequestedByCustomer,
            "duplicate" => Self::Duplicate,
            "fraudulent" => Self::Fraudulent,
            _ => return None,
        })
    }
}

/// A valid `POST /api/charges/{id}/refunds` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRequest {
    /// `None`: what is left to refund, resolved when the amount is reserved.
    pub amount: Option<AmountCents>,
    pub reason: Option<RefundReason>,
    pub metadata: BTreeMap<String, String>,
}

impl RefundRequest {
    /// Validates a parsed JSON body; unknown fields are refused.
    pub fn from_json(body: &Value, max_amount_cents: i64) -> Result<Self, InvalidRequest> {
        let object = body
            .as_object()
            .ok_or_else(|| InvalidRequest::body("the request body must be a JSON object"))?;
        const FIELDS: [&str; 3] = ["amount_cents", "reason", "metadata"];
        if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(InvalidRequest::param(
                unknown,
                format!("unknown field {unknown:?}"),
            ));
        }
        let amount = match object.get("amount_cents") {
            None | Some(Value::Null) => None,
            Some(v) => Some(AmountCents::parse(v, max_amount_cents)?),
        };
        let reason = match object.get("reason") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_str().and_then(RefundReason::parse).ok_or_else(|| {
                InvalidRequest::param(
                    "reason",
                    "reason must be one of requested_by_customer, duplicate, fraudulent",
                )
            })?),
        };
        let metadata = match object.get("metadata") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(m)) => metadata(m)?,
            Some(_) => {
                return Err(InvalidRequest::param(
                    "metadata",
                    "metadata must be an object of string values",
                ));
            }
        };
        Ok(Self {
            amount,
            reason,
            metadata,
        })
    }
}

/// Who asked for a refund: the token's subject and its role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestedBy {
    pub subject: String,
    pub role: Role,
}

impl RequestedBy {
    pub fn of(actor: &Actor) -> Self {
        Self {
            subject: actor.subject().as_str().to_owned(),
            role: actor.role(),
        }
    }
}

/// A refund as recorded in the `refunds` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    pub id: String,
    pub charge_id: String,
    /// The charge's customer (who may read the refund), whoever asked.
    pub customer_id: String,
    pub requested_by: RequestedBy,
    /// What is refunded; 0 in a claim that asked for "what is left", until
    /// the store reserves it and returns the refund as stored.
    pub amount_cents: i64,
    pub currency: String,
    pub reason: Option<RefundReason>,
    pub metadata: BTreeMap<String, String>,
    pub status: RefundStatus,
    /// The idempotency key sent to the provider; see [`Refund::provider_key_for`].
    pub provider_key: String,
    /// The provider's id for the charge refunded (the provider call names it).
    pub gateway_charge_id: Option<String>,
    pub gateway_refund_id: Option<String>,
    pub failure_code: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Refund {
    /// A new `pending` refund of `charge`, not stored yet (its times are the
    /// epoch until the store stamps them with the database's clock).
    pub fn pending(actor: &Actor, charge: &Charge, request: &RefundRequest) -> Self {
        let id = format!("re_{}", uuid::Uuid::now_v7().simple());
        Self {
            provider_key: Self::provider_key_for(&id),
            id,
            charge_id: charge.id.clone(),
            customer_id: charge.customer_id.clone(),
            requested_by: RequestedBy::of(actor),
            amount_cents: request.amount.map_or(0, AmountCents::get),
            currency: charge.currency.clone(),
            reason: request.reason,
            metadata: request.metadata.clone(),
            status: RefundStatus::Pending,
            gateway_charge_id: charge.gateway_charge_id.clone(),
            gateway_refund_id: None,
            failure_code: None,
            created_at: DateTime::UNIX_EPOCH,
            updated_at: DateTime::UNIX_EPOCH,
        }
    }

    /// The provider key of a refund made before keys were derived, from its
    /// id; a claim's refund gets a derived id and key instead
    /// ([`crate::store::Claim::derive`]).
    pub fn provider_key_for(refund_id: &str) -> String {
        format!("payments-refund-{refund_id}")
    }

    pub fn location(&self) -> String {
        format!("/api/refunds/{}", self.id)
    }

    /// The public JSON representation (201 bodies and the GET routes).
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct View<'a> {
            id: &'a str,
            object: &'static str,
            charge_id: &'a str,
            amount_cents: i64,
            currency: &'a str,
            status: RefundStatus,
            reason: Option<RefundReason>,
            metadata: &'a BTreeMap<String, String>,
            gateway_refund_id: Option<&'a str>,
            failure_code: Option<&'a str>,
            requested_by: &'a RequestedBy,
            created_at: String,
        }
        let view = View {
            id: &self.id,
            object: "refund",
            charge_id: &self.charge_id,
            amount_cents: self.amount_cents,
            currency: &self.currency,
            status: self.status,
            reason: self.reason,
            metadata: &self.metadata,
            gateway_refund_id: self.gateway_refund_id.as_deref(),
            failure_code: self.failure_code.as_deref(),
            requested_by: &self.requested_by,
            created_at: time::rfc3339(self.created_at),
        };
        serde_json::to_string(&view).expect("a refund view always serialises")
    }

    /// The final answer to a refund that does not fit in what is left of
    /// its charge: stored and replayed like any final answer, so the same
    /// key always gets it; a new refund needs a new key.
    pub fn exceeds_charge(charge_id: &str, refundable_cents: i64) -> StoredResponse {
        let mut envelope = ErrorEnvelope::new(
            "refund_exceeds_charge",
            format!(
                "the refund is larger than what is left to refund of the charge \
                 ({refundable_cents} in minor units)"
            ),
        );
        envelope.error.charge_id = Some(charge_id.to_owned());
        envelope.error.refundable_amount_cents = Some(refundable_cents);
        envelope.stored(400)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<RefundRequest, InvalidRequest> {
        RefundRequest::from_json(&v, 1_000_000)
    }

    #[test]
    fn every_field_is_optional() {
        let r = parse(json!({})).expect("valid");
        assert_eq!((r.amount, r.reason), (None, None));
        let r = parse(json!({"amount_cents": 300, "reason": "duplicate", "metadata": {"t": "1"}}))
            .expect("valid");
        assert_eq!(r.amount.map(AmountCents::get), Some(300));
        assert_eq!(r.reason, Some(RefundReason::Duplicate));
    }

    #[test]
    fn names_the_bad_param() {
        let param = |v| parse(v).err().and_then(|e| e.param);
        assert_eq!(
            param(json!({"amount_cents": 0})).as_deref(),
            Some("amount_cents")
        );
        assert_eq!(
            param(json!({"amount_cents": "5"})).as_deref(),
            Some("amount_cents")
        );
        assert_eq!(param(json!({"reason": "bored"})).as_deref(), Some("reason"));
        assert_eq!(param(json!({"reason": 1})).as_deref(), Some("reason"));
        assert_eq!(
            param(json!({"metadata": {"k": 1}})).as_deref(),
            Some("metadata[k]")
        );
        assert_eq!(param(json!({"charge": "ch_1"})).as_deref(), Some("charge"));
        assert!(parse(json!([1])).is_err());
    }

    #[test]
    fn the_refusal_names_what_is_left() {
        let answer = Refund::exceeds_charge("ch_1", 700);
        assert_eq!(answer.status, 400);
        let body: Value = serde_json::from_str(&answer.body).expect("JSON");
        assert_eq!(body["error"]["code"], "refund_exceeds_charge");
        assert_eq!(body["error"]["refundable_amount_cents"], 700);
    }
}
