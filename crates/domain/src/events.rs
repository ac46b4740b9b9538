//! Events: every change of a charge, refund or hold, told to the merchant.
//!
//! Each change writes its event in the same database transaction (a
//! transactional outbox): there is no change without its event and no
//! event without its change, whatever crashes when. An event's id is
//! derived from its object's id and the transition, so a change re-made
//! after the database lost its last writes (the object's id is derived
//! too, [`crate::derive`]) writes the same event id again, and a receiver
//! that deduplicates by id ships once. `created` is the database's clock.
//!
//! Types are named as Stripe names them where Stripe has the transition
//! (`charge.succeeded`, `charge.failed`, `charge.captured`,
//! `charge.expired`, `refund.failed`); the others are `<object>.<status>`
//! after the change (`docs/webhooks.md` lists them all).

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::charge::{Charge, ChargeStatus, InvalidRequest};
use crate::hold::HoldAction;
use crate::idempotency::StoredResponse;
use crate::list::Page;
use crate::provider::ProviderObject;
use crate::refund::Refund;
use crate::store::{Operation, Outcome};

/// The shape of the objects events carry. It changes when their shapes
/// change (holds, disputes); a receiver can tell by it.
pub const API_VERSION: &str = "2026-12-01";

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    /// A charge captured when made succeeded.
    ChargeSucceeded,
    /// A hold was authorized: `requires_capture`.
    ChargeRequiresCapture,
    ChargeFailed,
    /// A hold was captured (in full or in part).
    ChargeCaptured,
    /// A hold was released by a cancel.
    ChargeCanceled,
    /// A hold lapsed uncaptured.
    ChargeExpired,
    /// The provider's outcome could not be learned: abandoned for
    /// reconciliation.
    ChargeUnknown,
    RefundSucceeded,
    RefundFailed,
    /// Accepted by the provider, to settle later.
    RefundPending,
    RefundUnknown,
    /// The provider made an operation of ours that has no row here.
    OrphanFound,
    /// A cardholder disputed a charge (or asked about it: an inquiry,
    /// `warning_*`), as the provider's webhook told.
    ChargeDisputeCreated,
    /// The disputed amount was taken back (a dispute, not an inquiry).
    ChargeDisputeFundsWithdrawn,
    /// A dispute changed (its status, amount, evidence deadline).
    ChargeDisputeUpdated,
    /// A dispute ended: won, lost, withdrawn (`warning_closed`), prevented.
    ChargeDisputeClosed,
}

impl EventType {
    pub const ALL: [Self; 16] = [
        Self::ChargeSucceeded,
        Self::ChargeRequiresCapture,
        Self::ChargeFailed,
        Self::ChargeCaptured,
        Self::ChargeCanceled,
        Self::ChargeExpired,
        Self::ChargeUnknown,
        Self::RefundSucceeded,
        Self::RefundFailed,
        Self::RefundPending,
        Self::RefundUnknown,
        Self::OrphanFound,
        Self::ChargeDisputeCreated,
        Self::ChargeDisputeFundsWithdrawn,
        Self::ChargeDisputeUpdated,
        Self::ChargeDisputeClosed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ChargeSucceeded => "charge.succeeded",
            Self::ChargeRequiresCapture => "charge.requires_capture",
            Self::ChargeFailed => "charge.failed",
            Self::ChargeCaptured => "charge.captured",
            Self::ChargeCanceled => "charge.canceled",
            Self::ChargeExpired => "charge.expired",
            Self::ChargeUnknown => "charge.unknown",
            Self::RefundSucceeded => "refund.succeeded",
            Self::RefundFailed => "refund.failed",
            Self::RefundPending => "refund.pending",
            Self::RefundUnknown => "refund.unknown",
            Self::OrphanFound => "orphan.found",
            Self::ChargeDisputeCreated => "charge.dispute.created",
            Self::ChargeDisputeFundsWithdrawn => "charge.dispute.funds_withdrawn",
            Self::ChargeDisputeUpdated => "charge.dispute.updated",
            Self::ChargeDisputeClosed => "charge.dispute.closed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The types' names, for an error message.
    pub fn names() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

/// An event to write in the transaction of its change. The store adds
/// `created` (its clock) and [`API_VERSION`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub id: String,
    pub event_type: EventType,
    /// The charge's, refund's or orphan's id.
    pub object_id: String,
    /// The object as the API shows it after the change (JSON).
    pub data: String,
}

impl NewEvent {
    /// The event of `event_type` about the object `object_id`, shown as
    /// `data`; its id derived from both.
    pub fn new(event_type: EventType, object_id: &str, data: String) -> Self {
        Self {
            id: event_id(object_id, event_type),
            event_type,
            object_id: object_id.to_owned(),
            data,
        }
    }

    /// The event of `event_type` about `object_id` in the state `state`:
    /// for an object that goes through one transition several times (a
    /// dispute updated from one status to another), its id derived from
    /// the state reached too.
    pub fn keyed(event_type: EventType, object_id: &str, state: &str, data: String) -> Self {
        Self {
            id: event_id(&format!("{object_id}/{state}"), event_type),
            event_type,
            object_id: object_id.to_owned(),
            data,
        }
    }

    /// The event of an operation's change by `outcome`, or `None` when
    /// the change is none a merchant sees (still pending; a capture or
    /// cancel that failed and gave the hold back; a capture in doubt,
    /// whose hold stays as it was until it is known).
    pub fn of(operation: &Operation, outcome: &Outcome) -> Option<Self> {
        Self::shown_as(operation, outcome, None)
    }

    /// [`NewEvent::of`] the change `answer` answers: a 201's body is the
    /// object as the change left it (the charge, refund or hold the answer
    /// was rendered from), so it is the event's data as it is, not
    /// rendered a second time on the request's path.
    pub fn answered(
        operation: &Operation,
        outcome: &Outcome,
        answer: &StoredResponse,
    ) -> Option<Self> {
        let shown = (answer.status == 201).then_some(answer.body.as_str());
        Self::shown_as(operation, outcome, shown)
    }

    /// The event, its data `shown` when the caller has it rendered.
    fn shown_as(operation: &Operation, outcome: &Outcome, shown: Option<&str>) -> Option<Self> {
        // The object after the change, rendered only when not shown.
        let render = |object_id: &str, event_type, after: &dyn Fn() -> String| {
            let data = shown.map_or_else(after, str::to_owned);
            Some(Self::new(event_type, object_id, data))
        };
        match (operation, outcome) {
            (Operation::Charge(charge), Outcome::Charge(o)) => {
                let event_type = match o.status {
                    ChargeStatus::Succeeded => EventType::ChargeSucceeded,
                    ChargeStatus::RequiresCapture => EventType::ChargeRequiresCapture,
                    ChargeStatus::Failed => EventType::ChargeFailed,
                    ChargeStatus::Unknown => EventType::ChargeUnknown,
                    _ => return None,
                };
                let after = || {
                    let after = Charge {
                        status: o.status,
                        gateway_charge_id: o.gateway_charge_id.clone(),
                        decline_code: o.decline_code.clone(),
                        capture_before: o.capture_before.or(charge.capture_before),
                        ..charge.clone()
                    };
                    after.to_json()
                };
                render(&charge.id, event_type, &after)
            }
            (Operation::Refund(refund), Outcome::Refund(o)) => {
                let event_type = match o.status {
                    ChargeStatus::Succeeded => EventType::RefundSucceeded,
                    ChargeStatus::Failed => EventType::RefundFailed,
                    ChargeStatus::Pending => EventType::RefundPending,
                    ChargeStatus::Unknown => EventType::RefundUnknown,
                    _ => return None,
                };
                let after = || {
                    let after = Refund {
                        status: o.status,
                        gateway_refund_id: o.gateway_refund_id.clone(),
                        failure_code: o.failure_code.clone(),
                        amount_cents: o.amount_cents,
                        ..refund.clone()
                    };
                    after.to_json()
                };
                render(&refund.id, event_type, &after)
            }
            (Operation::Capture(capture), Outcome::Capture(o)) => {
                let (event_type, status) = match (o.status, o.action) {
                    (ChargeStatus::Succeeded, HoldAction::Capture) => {
                        (EventType::ChargeCaptured, ChargeStatus::Succeeded)
                    }
                    (ChargeStatus::Succeeded, HoldAction::Cancel) => {
                        (EventType::ChargeCanceled, ChargeStatus::Canceled)
                    }
                    (ChargeStatus::Failed, _) if o.hold_lapsed => {
                        (EventType::ChargeExpired, ChargeStatus::Expired)
                    }
                    _ => return None,
                };
                let after = || capture.hold_after(status).to_json();
                render(&capture.charge_id, event_type, &after)
            }
            // An outcome is always of its own operation.
            _ => None,
        }
    }

    /// A charge's event, the charge shown as it is after the change.
    pub fn of_charge(event_type: EventType, charge: &Charge) -> Self {
        Self::new(event_type, &charge.id, charge.to_json())
    }

    /// An orphan found: the provider's object, as reconciliation read it.
    pub fn orphan_found(object: &ProviderObject) -> Self {
        #[derive(serde::Serialize)]
        struct View<'a> {
            object: &'static str,
            kind: &'static str,
            provider_id: &'a str,
            operation_id: &'a str,
            amount_cents: i64,
            currency: &'a str,
            status: &'a str,
            provider_created: i64,
        }
        let view = View {
            object: "orphan",
            kind: object.kind.as_str(),
            provider_id: &object.provider_id,
            operation_id: &object.operation_id,
            amount_cents: object.amount_cents,
            currency: &object.currency,
            status: &object.status,
            provider_created: object.created,
        };
        let data = serde_json::to_string(&view).expect("an orphan view always serialises");
        Self::new(EventType::OrphanFound, &object.provider_id, data)
    }
}

/// `evt_` and 32 hex digits of SHA-256 over the object's id and the
/// transition: the same change of the same object always has the same id.
pub fn event_id(object_id: &str, event_type: EventType) -> String {
    let mut hash = Sha256::new();
    hash.update(b"payments/event\0");
    hash.update(object_id.as_bytes());
    hash.update(b"\0");
    hash.update(event_type.as_str().as_bytes());
    format!("evt_{}", hex::encode(&hash.finalize()[..16]))
}

/// Whether `id` has the shape of an event id.
pub fn is_event_id(id: &str) -> bool {
    id.strip_prefix("evt_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: String,
    pub event_type: String,
    pub object_id: String,
    pub api_version: String,
    /// When its change was committed, by the database's clock.
    pub created: DateTime<Utc>,
    /// The object after the change (JSON, as written).
    pub data: String,
}

impl Event {
    /// The event as the API shows it and webhooks deliver it: the same
    /// bytes on every attempt.
    pub fn to_json(&self) -> String {
        let text = |s: &str| serde_json::to_string(s).expect("a string always serialises");
        format!(
            "{{\"id\":{},\"object\":\"event\",\"type\":{},\"api_version\":{},\"created\":{},\
             \"data\":{{\"object\":{}}}}}",
            text(&self.id),
            text(&self.event_type),
            text(&self.api_version),
            self.created.timestamp(),
            self.data
        )
    }
}

/// A parsed `GET /api/events` query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    pub page: Page,
    pub event_type: Option<EventType>,
    /// `created[gte]` and `created[lt]`, Unix seconds.
    pub created_gte: Option<DateTime<Utc>>,
    pub created_lt: Option<DateTime<Utc>>,
}

impl EventQuery {
    /// From the query string's pairs: the page, `type`, `created[gte]`,
    /// `created[lt]`; anything else is refused.
    pub fn parse(pairs: &[(String, String)]) -> Result<Self, InvalidRequest> {
        let mut event_type = None;
        let (mut created_gte, mut created_lt) = (None, None);
        let page = crate::list::parse_page_with(pairs, |name, value| {
            match name {
                "type" => {
                    let parsed = EventType::parse(value).ok_or_else(|| {
                        InvalidRequest::param(
                            "type",
                            format!("type must be one of {}", EventType::names()),
                        )
                    })?;
                    event_type = Some(parsed);
                }
                "created[gte]" => created_gte = Some(crate::list::unix_seconds(name, value)?),
                "created[lt]" => created_lt = Some(crate::list::unix_seconds(name, value)?),
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(Self {
            page,
            event_type,
            created_gte,
            created_lt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_a_function_of_the_object_and_the_transition() {
        let a = event_id("ch_1", EventType::ChargeSucceeded);
        assert_eq!(a, event_id("ch_1", EventType::ChargeSucceeded));
        assert_ne!(a, event_id("ch_1", EventType::ChargeFailed));
        assert_ne!(a, event_id("ch_2", EventType::ChargeSucceeded));
        assert!(is_event_id(&a), "{a}");
        assert!(!is_event_id("evt_xyz"));
    }

    #[test]
    fn every_type_parses_back() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
        }
        assert_eq!(EventType::parse("charge.pending"), None);
    }

    #[test]
    fn an_event_renders_its_data_as_written() {
        let event = Event {
            id: "evt_1".into(),
            event_type: "charge.succeeded".into(),
            object_id: "ch_1".into(),
            api_version: API_VERSION.into(),
            created: DateTime::from_timestamp(1_700_000_000, 0).expect("a valid time"),
            data: r#"{"id":"ch_1"}"#.into(),
        };
        let json: serde_json::Value =
            serde_json::from_str(&event.to_json()).expect("an event renders as JSON");
        assert_eq!(json["object"], "event");
        assert_eq!(json["type"], "charge.succeeded");
        assert_eq!(json["created"], 1_700_000_000);
        assert_eq!(json["data"]["object"]["id"], "ch_1");
    }

    #[test]
    fn the_query_takes_type_and_created_and_refuses_others() {
        let pairs = |q: &[(&str, &str)]| {
            q.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>()
        };
        let q = EventQuery::parse(&pairs(&[
            ("type", "charge.failed"),
            ("created[gte]", "1700000000"),
            ("limit", "5"),
        ]))
        .expect("a valid query");
        assert_eq!(q.event_type, Some(EventType::ChargeFailed));
        assert_eq!(q.page.limit, 5);
        let bad = EventQuery::parse(&pairs(&[("type", "charge.nope")])).expect_err("refused");
        assert_eq!(bad.param.as_deref(), Some("type"));
        let bad = EventQuery::parse(&pairs(&[("status", "x")])).expect_err("refused");
        assert_eq!(bad.param.as_deref(), Some("status"));
    }
}
