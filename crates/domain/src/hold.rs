//! Holds: a charge authorized with `"capture": false`, then captured (in
//! full or in part) or canceled (released) by the back office.
//!
//! A capture and a cancel are each their own idempotent operation (routes
//! [`crate::idempotency::CAPTURES_ROUTE`] and
//! [`crate::idempotency::CANCELS_ROUTE`]), driven through the same state
//! machine as charges and refunds. Which one acts on a hold is decided in
//! its claim's transaction, by a conditional update on the charge (the
//! hold is taken by the one operation that finds it `requires_capture`
//! and free, and within its margin of lapsing): never check-then-act. The
//! others get a 409 while it is pending, and the stored refusals once it
//! is final ([`Capture::refusal`]).

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::charge::{AmountCents, Charge, ChargeStatus, InvalidRequest};
use crate::envelope::ErrorEnvelope;
use crate::idempotency::{CANCELS_ROUTE, CAPTURES_ROUTE, StoredResponse};
use crate::refund::RequestedBy;
use crate::scope::Actor;

/// What an operation on a hold does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HoldAction {
    /// Takes some or all of the held amount; the rest is released.
    Capture,
    /// Releases the whole hold (on Stripe's Charges API, a refund of the
    /// uncaptured charge).
    Cancel,
}

impl HoldAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Capture => "capture",
            Self::Cancel => "cancel",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "capture" => Some(Self::Capture),
            "cancel" => Some(Self::Cancel),
            _ => None,
        }
    }

    /// Its record's route.
    pub fn route(self) -> &'static str {
        match self {
            Self::Capture => CAPTURES_ROUTE,
            Self::Cancel => CANCELS_ROUTE,
        }
    }

    /// The prefix of its ids: `cp_` or `cn_`.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Self::Capture => "cp_",
            Self::Cancel => "cn_",
        }
    }

    /// The action whose ids `id` has the prefix of.
    pub fn of_id(id: &str) -> Option<Self> {
        [Self::Capture, Self::Cancel]
            .into_iter()
            .find(|action| id.starts_with(action.id_prefix()))
    }
}

/// A valid capture (`{"amount_cents"?}`) or cancel (`{}`) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRequest {
    pub action: HoldAction,
    /// `None`: all of the hold.
    pub amount: Option<AmountCents>,
}

impl HoldRequest {
    /// Validates a parsed JSON body; unknown fields are refused, and a
    /// cancel takes none.
    pub fn from_json(
        action: HoldAction,
        body: &Value,
        max_amount_cents: i64,
    ) -> Result<Self, InvalidRequest> {
        let object = body
            .as_object()
            .ok_or_else(|| InvalidRequest::body("the request body must be a JSON object"))?;
        let fields: &[&str] = match action {
            HoldAction::Capture => &["amount_cents"],
            HoldAction::Cancel => &[],
        };
        if let Some(unknown) = object.keys().find(|k| !fields.contains(&k.as_str())) {
            return Err(InvalidRequest::param(
                unknown,
                format!("unknown field {unknown:?}"),
            ));
        }
        let amount = match object.get("amount_cents") {
            None | Some(Value::Null) => None,
            Some(v) => Some(AmountCents::parse(v, max_amount_cents)?),
        };
        Ok(Self { action, amount })
    }

    /// What it takes of `charge`, checked against the authorized amount
    /// (which never changes): `Err` for more than was authorized.
    pub fn amount_of(&self, charge: &Charge) -> Result<i64, InvalidRequest> {
        let Some(amount) = self.amount.map(AmountCents::get) else {
            return Ok(charge.amount_cents);
        };
        if amount > charge.amount_cents {
            return Err(InvalidRequest::param(
                "amount_cents",
                format!(
                    "amount_cents must be at most the authorized amount ({})",
                    charge.amount_cents
                ),
            ));
        }
        Ok(amount)
    }
}

/// A capture or a cancel of a hold, as recorded in the `captures` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    pub id: String,
    pub action: HoldAction,
    pub charge_id: String,
    /// The charge's customer, whoever asked.
    pub customer_id: String,
    pub requested_by: RequestedBy,
    /// What a capture takes; for a cancel, the whole hold released.
    pub amount_cents: i64,
    pub currency: String,
    pub status: ChargeStatus,
    /// The idempotency key sent to the provider (derived, like a refund's).
    pub provider_key: String,
    /// The provider's id for the charge held (the provider call names it).
    pub gateway_charge_id: Option<String>,
    /// The provider's object: the charge captured, or the refund that
    /// released the hold.
    pub gateway_id: Option<String>,
    pub failure_code: Option<String>,
    /// The hold as it was when this operation took it: what its answer
    /// shows, changed by the outcome.
    pub hold: Box<Charge>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Capture {
    /// A new `pending` operation on `hold`, not stored yet (its id and
    /// provider key come from the claim's derivation).
    pub fn pending(actor: &Actor, hold: &Charge, request: &HoldRequest, amount: i64) -> Self {
        Self {
            id: String::new(),
            action: request.action,
            charge_id: hold.id.clone(),
            customer_id: hold.customer_id.clone(),
            requested_by: RequestedBy::of(actor),
            amount_cents: amount,
            currency: hold.currency.clone(),
            status: ChargeStatus::Pending,
            provider_key: String::new(),
            gateway_charge_id: hold.gateway_charge_id.clone(),
            gateway_id: None,
            failure_code: None,
            hold: Box::new(hold.clone()),
            created_at: DateTime::UNIX_EPOCH,
            updated_at: DateTime::UNIX_EPOCH,
        }
    }

    /// The hold as this operation leaves it when it is `status`: captured
    /// (`succeeded`, with the amount captured), canceled, expired, or
    /// still `requires_capture`.
    pub fn hold_after(&self, status: ChargeStatus) -> Charge {
        let mut hold = (*self.hold).clone();
        hold.status = status;
        if status == ChargeStatus::Succeeded {
            hold.amount_captured = Some(self.amount_cents);
        }
        hold
    }

    /// The stored, final answer to a capture or cancel of a hold that is
    /// no longer `requires_capture`: 400 `charge_already_captured`,
    /// `charge_canceled` or `hold_expired` (also for a hold within its
    /// margin of lapsing, which is refused before the provider is called).
    pub fn refusal(charge_id: &str, status: HoldState) -> StoredResponse {
        let (code, message) = match status {
            HoldState::Captured => (
                "charge_already_captured",
                "the charge has been captured already; a capture or cancel needs a hold that \
                 requires capture",
            ),
            HoldState::Canceled => (
                "charge_canceled",
                "the hold has been canceled (released); it can no longer be captured",
            ),
            HoldState::Expired => (
                "hold_expired",
                "the hold has lapsed, or is too close to lapsing for a capture to reach the \
                 payment provider in time; authorize a new charge",
            ),
        };
        let mut envelope = ErrorEnvelope::new(code, message);
        envelope.error.charge_id = Some(charge_id.to_owned());
        envelope.stored(400)
    }
}

/// Why a hold cannot be taken by a new capture or cancel, for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldState {
    Captured,
    Canceled,
    /// Lapsed, or within the capture margin of lapsing.
    Expired,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_capture_takes_an_amount_and_a_cancel_nothing() {
        let capture = HoldRequest::from_json(HoldAction::Capture, &json!({}), 1000);
        assert_eq!(capture.map(|r| r.amount), Ok(None));
        let partial = HoldRequest::from_json(HoldAction::Capture, &json!({"amount_cents": 5}), 9);
        assert_eq!(partial.map(|r| r.amount.map(AmountCents::get)), Ok(Some(5)));
        let param = |action, body| {
            HoldRequest::from_json(action, &body, 1000)
                .err()
                .and_then(|e| e.param)
        };
        assert_eq!(
            param(HoldAction::Cancel, json!({"amount_cents": 5})).as_deref(),
            Some("amount_cents")
        );
        assert_eq!(
            param(HoldAction::Capture, json!({"amount_cents": 0})).as_deref(),
            Some("amount_cents")
        );
        assert_eq!(
            param(HoldAction::Capture, json!({"amount": 5})).as_deref(),
            Some("amount")
        );
        assert!(HoldRequest::from_json(HoldAction::Cancel, &json!([]), 1000).is_err());
    }

    #[test]
    fn ids_name_their_action() {
        assert_eq!(HoldAction::of_id("cp_00"), Some(HoldAction::Capture));
        assert_eq!(HoldAction::of_id("cn_00"), Some(HoldAction::Cancel));
        assert_eq!(HoldAction::of_id("re_00"), None);
    }
}
