//! Provider webhooks in (`POST /webhooks/provider`): the provider tells of
//! money that moved where this server did not see it (a refund made in its
//! dashboard, a dispute, a refund that failed days later, the outcome of an
//! operation left unknown). Consuming them is the idempotency problem on
//! the receiving side:
//!
//! - each provider event id is recorded under a unique index in the
//!   transaction of its effect ([`Recorded`]), so a duplicate delivery, or
//!   two at once, applies it once;
//! - events arrive in no promised order, so an event is never applied from
//!   its own snapshot: the charge it is about is read again from the
//!   provider ([`crate::provider::ProviderCharge`]) and the local state is
//!   brought to it ([`plan`]); every change is guarded by the local state it
//!   was planned from, so two events about one charge applied at once
//!   change it once (the loser plans again).
//!
//! `docs/architecture.md` ("Provider webhooks in") has the rules.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::charge::{Charge, ChargeStatus, InvalidRequest};
use crate::events::{EventType, NewEvent};
use crate::hold::HoldAction;
use crate::idempotency::StoredResponse;
use crate::provider::{ProviderCharge, ProviderDispute, ProviderRefund};
use crate::refund::{Refund, RefundReason, RequestedBy};
use crate::scope::Role;
use crate::store::Outcome;
use crate::time;

/// The subject a refund made at the provider is recorded as requested by.
pub const PROVIDER_SUBJECT: &str = "provider";

/// Stripe's reason on the refund that releases a hold that lapsed.
pub const LAPSED_RELEASE: &str = "expired_uncaptured_charge";

/// The longest provider event id or type kept (Stripe's are far shorter).
const MAX_FIELD: usize = 255;

/// A provider event, as much of it as the server reads: the id it is
/// recorded under, its type, and the provider charge it is about. The rest
/// of its snapshot is not trusted (it may be older than what is applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderEvent {
    pub id: String,
    pub event_type: String,
    /// The provider charge the event is about: the charge itself, or the
    /// charge of the refund or dispute it shows. `None`: an object that is
    /// about no charge.
    pub charge: Option<String>,
}

impl ProviderEvent {
    /// Reads a (verified) body: `id`, `type` and `data.object`.
    pub fn parse(body: &[u8]) -> Result<Self, InvalidRequest> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| InvalidRequest::body(format!("the body is not JSON: {e}")))?;
        let text = |name: &str| {
            value
                .get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty() && s.len() <= MAX_FIELD && s.is_ascii())
                .map(str::to_owned)
                .ok_or_else(|| {
                    InvalidRequest::param(name, format!("an event needs a {name} (a short string)"))
                })
        };
        let (id, event_type) = (text("id")?, text("type")?);
        let object = value
            .get("data")
            .and_then(|d| d.get("object"))
            .filter(|o| o.is_object())
            .ok_or_else(|| InvalidRequest::param("data", "an event needs a data.object"))?;
        let field = |name: &str| object.get(name).and_then(Value::as_str);
        let charge = match field("object") {
            Some("charge") => field("id"),
            Some("refund" | "dispute") => field("charge"),
            _ => None,
        };
        Ok(Self {
            id,
            event_type,
            charge: charge
                .filter(|id| crate::charge::is_object_id(id))
                .map(str::to_owned),
        })
    }

    /// Whether its type is one the server applies: a charge's, a refund's
    /// or a dispute's (`charge.*`, `refund.*`). Any other is acknowledged
    /// and ignored.
    pub fn is_handled(&self) -> bool {
        self.event_type.starts_with("charge.") || self.event_type.starts_with("refund.")
    }
}

/// What became of a provider event, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InboxState {
    /// Its charge was brought to the provider's state.
    Applied,
    /// None of ours (a type not handled, a charge made elsewhere).
    Ignored,
    /// It names one of our operations that has no row here yet (an orphan
    /// of a lost tail, or a charge still being made): what could be applied
    /// was, and the jobs runner applies it again until nothing waits.
    Waiting,
    /// Applied as far as it could be; the rest is for a person (`detail`).
    NeedsPerson,
}

impl InboxState {
    /// Applied again (by the jobs runner, or a redelivery) until it is
    /// applied: waiting for its row, or left for a person (the conflict
    /// may resolve itself, as when a refund in flight settles).
    pub fn is_open(self) -> bool {
        matches!(self, Self::Waiting | Self::NeedsPerson)
    }

    pub const ALL: [Self; 4] = [
        Self::Applied,
        Self::Ignored,
        Self::Waiting,
        Self::NeedsPerson,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Ignored => "ignored",
            Self::Waiting => "waiting",
            Self::NeedsPerson => "needs_person",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }
}

/// The `provider_events` row an application writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub event_id: String,
    pub event_type: String,
    pub gateway_charge_id: Option<String>,
    pub state: InboxState,
    pub detail: Option<String>,
}

/// A dispute of one of our charges, as the provider last showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispute {
    /// Ours, derived from the provider's ([`local_id`]).
    pub id: String,
    pub gateway_dispute_id: String,
    pub charge_id: String,
    pub amount_cents: i64,
    pub currency: String,
    /// Stripe's status.
    pub status: String,
    pub reason: String,
    /// The provider's `is_charge_refundable`.
    pub refundable: bool,
    /// When evidence is due, the provider's clock (Unix seconds).
    pub evidence_due_by: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Stripe's dispute statuses that end it.
pub const CLOSED: [&str; 4] = ["won", "lost", "warning_closed", "prevented"];

/// Whether a dispute in `status` is over.
pub fn is_closed(status: &str) -> bool {
    CLOSED.contains(&status)
}

/// An inquiry (Stripe's `warning_*`): no money was withdrawn, and a refund
/// is the usual answer to one.
pub fn is_inquiry(status: &str) -> bool {
    status.starts_with("warning_")
}

impl Dispute {
    /// The local dispute of `charge` the provider's `d` is, new, made at
    /// `now`.
    fn of(charge: &Charge, d: &ProviderDispute, now: DateTime<Utc>) -> Self {
        Self {
            id: local_id("dp_", &d.id),
            gateway_dispute_id: d.id.clone(),
            charge_id: charge.id.clone(),
            amount_cents: d.amount_cents,
            currency: d.currency.clone(),
            status: d.status.clone(),
            reason: d.reason.clone(),
            refundable: d.refundable,
            evidence_due_by: d.evidence_due_by,
            created_at: now,
            updated_at: now,
        }
    }

    /// Whether it forbids refunding its charge: the provider says the
    /// charge is not refundable, and the dispute is not won or withdrawn
    /// (a lost dispute's money is already back with the cardholder).
    pub fn blocks_refunds(&self) -> bool {
        !self.refundable && !matches!(self.status.as_str(), "won" | "warning_closed" | "prevented")
    }

    /// The public JSON representation (`GET /api/disputes`, a charge's
    /// `dispute`, the events).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.view()).expect("a dispute view always serialises")
    }

    /// The view [`Dispute::to_json`] writes.
    pub fn view(&self) -> impl Serialize + '_ {
        #[derive(Serialize)]
        struct View<'a> {
            id: &'a str,
            object: &'static str,
            charge_id: &'a str,
            gateway_dispute_id: &'a str,
            amount_cents: i64,
            currency: &'a str,
            status: &'a str,
            reason: &'a str,
            is_charge_refundable: bool,
            evidence_due_by: Option<String>,
            created_at: String,
        }
        View {
            id: &self.id,
            object: "dispute",
            charge_id: &self.charge_id,
            gateway_dispute_id: &self.gateway_dispute_id,
            amount_cents: self.amount_cents,
            currency: &self.currency,
            status: &self.status,
            reason: &self.reason,
            is_charge_refundable: self.refundable,
            evidence_due_by: self
                .evidence_due_by
                .and_then(|s| DateTime::from_timestamp(s, 0))
                .map(time::rfc3339),
            created_at: time::rfc3339(self.created_at),
        }
    }

    /// The answer to a refund refused because of it: stored and replayed
    /// like [`Refund::exceeds_charge`].
    pub fn refuses_refund(charge_id: &str) -> StoredResponse {
        let mut envelope = crate::envelope::ErrorEnvelope::new(
            "charge_disputed",
            "the charge is disputed and the payment provider says it may not be refunded \
             while the dispute stands; answer the dispute instead",
        );
        envelope.error.charge_id = Some(charge_id.to_owned());
        envelope.stored(400)
    }
}

/// `prefix` and 32 hex digits of SHA-256 over the provider's id: the same
/// provider object always has the same local id, so two applications that
/// race to create it collide on the primary key as well as on the
/// provider id's unique index.
pub fn local_id(prefix: &str, provider_id: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"payments/provider-object\0");
    hash.update(prefix.as_bytes());
    hash.update(b"\0");
    hash.update(provider_id.as_bytes());
    format!("{prefix}{}", hex::encode(&hash.finalize()[..16]))
}

/// The local state of one of our charges an event is applied to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    pub charge: Charge,
    /// Whether a capture or cancel of ours holds the hold now.
    pub hold_taken: bool,
    pub refunds: Vec<Refund>,
    pub disputes: Vec<Dispute>,
    /// The database's clock when this was read: what a refund or dispute
    /// made or changed from it is dated (its row, and its event's data).
    pub now: DateTime<Utc>,
}

/// One change to the local state, each guarded in the store by the state
/// it was planned from: when the guard fails, the whole application is
/// rolled back and planned again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A refund made at the provider that is none of ours (its dashboard):
    /// inserted (its provider id UNIQUE), its amount reserved on the charge
    /// and, succeeded, refunded; whether or not it fits.
    ProviderRefund { refund: Refund, event: NewEvent },
    /// One of our refunds that had succeeded failed (or was canceled) at
    /// the provider since: failed, its amount given back. Guarded by
    /// `status = 'succeeded'`.
    RefundFailedLater {
        refund: Refund,
        failure_code: String,
        event: NewEvent,
    },
    /// A hold no operation of ours holds, captured or released at the
    /// provider (its dashboard, or its lapse). Guarded by the hold still
    /// requiring capture and not taken.
    Hold {
        charge_id: String,
        status: ChargeStatus,
        amount_captured: Option<i64>,
        event: NewEvent,
    },
    /// A dispute, new (`previous` `None`) or changed since `previous`.
    Dispute {
        dispute: Dispute,
        previous: Option<Dispute>,
        events: Vec<NewEvent>,
    },
    /// An operation of ours left unknown (or a refund pending at the
    /// provider) that the provider shows final: settled with the same
    /// guarded rewrite of its stored answer that reconciliation makes.
    Settle {
        outcome: Outcome,
        answer: StoredResponse,
        event: Option<NewEvent>,
    },
}

/// What [`plan`] found: the changes, the operations to settle from the
/// provider's records, and what is left waiting or for a person.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// Our refunds the provider shows and we hold unsettled: each settled
    /// by the reconciliation of its provider refund (by id).
    pub to_settle: Vec<(Refund, String)>,
    /// Whether the local charge is unknown and the provider's charge
    /// should settle it.
    pub settle_charge: bool,
    /// Provider objects naming an operation of ours with no row here.
    pub waiting: Vec<String>,
    /// What a person must look at.
    pub for_person: Vec<String>,
}

impl Plan {
    /// The state the event is recorded in.
    pub fn state(&self) -> InboxState {
        if !self.for_person.is_empty() {
            InboxState::NeedsPerson
        } else if !self.waiting.is_empty() {
            InboxState::Waiting
        } else {
            InboxState::Applied
        }
    }

    /// What the record's `detail` says.
    pub fn detail(&self) -> Option<String> {
        let mut lines: Vec<String> = self.for_person.clone();
        lines.extend(self.waiting.iter().map(|w| format!("waiting: {w}")));
        (!lines.is_empty()).then(|| lines.join("; "))
    }
}

/// The changes that bring `local` to what the provider shows (`provider`).
/// Pure: the service reads both, and the store applies the result.
pub fn plan(local: &Local, provider: &ProviderCharge) -> Plan {
    let mut plan = Plan {
        settle_charge: local.charge.status == ChargeStatus::Unknown,
        ..Plan::default()
    };
    if local.charge.status == ChargeStatus::Pending {
        // Still being made: its driver (a retry, the reaper) finishes it.
        plan.waiting
            .push(format!("charge {} is still being made", local.charge.id));
        return plan;
    }
    plan_hold(local, provider, &mut plan);
    plan_refunds(local, provider, &mut plan);
    plan_disputes(local, provider, &mut plan);
    plan
}

/// A hold captured or released at the provider with no operation of ours.
fn plan_hold(local: &Local, provider: &ProviderCharge, plan: &mut Plan) {
    let charge = &local.charge;
    if charge.status != ChargeStatus::RequiresCapture || local.hold_taken {
        if charge.is_hold()
            && matches!(
                charge.status,
                ChargeStatus::Canceled | ChargeStatus::Expired
            )
            && provider.captured
        {
            plan.for_person.push(format!(
                "the hold {} is {} here but the provider captured {}",
                charge.id,
                charge.status.as_str(),
                provider.amount_captured
            ));
        }
        return;
    }
    let (status, event_type, captured) = if provider.captured {
        let amount = provider.amount_captured;
        (
            ChargeStatus::Succeeded,
            EventType::ChargeCaptured,
            Some(amount),
        )
    } else if provider.refunded {
        let lapsed = provider
            .refunds
            .iter()
            .any(|r| r.reason.as_deref() == Some(LAPSED_RELEASE));
        if lapsed {
            (ChargeStatus::Expired, EventType::ChargeExpired, None)
        } else {
            (ChargeStatus::Canceled, EventType::ChargeCanceled, None)
        }
    } else {
        return;
    };
    let after = Charge {
        status,
        amount_captured: captured.or(charge.amount_captured),
        ..charge.clone()
    };
    plan.changes.push(Change::Hold {
        charge_id: charge.id.clone(),
        status,
        amount_captured: captured,
        event: NewEvent::of_charge(event_type, &after),
    });
}

/// Our refunds brought to the provider's, and the provider's that are none
/// of ours created.
fn plan_refunds(local: &Local, provider: &ProviderCharge, plan: &mut Plan) {
    let charge = &local.charge;
    let mut partial_release_seen = false;
    for r in &provider.refunds {
        let ours = r.operation_id.as_deref();
        if let Some(id) = ours
            && HoldAction::of_id(id).is_some()
        {
            // The release of one of our cancels: the cancel's own flow.
            continue;
        }
        let known = local.refunds.iter().find(|l| {
            Some(l.id.as_str()) == ours || l.gateway_refund_id.as_deref() == Some(r.id.as_str())
        });
        match (known, ours) {
            (Some(refund), _) => follow_refund(refund, r, plan),
            (None, Some(id)) => plan
                .waiting
                .push(format!("the provider's refund {} of our refund {id}", r.id)),
            (None, None) if r.reason.as_deref() == Some(LAPSED_RELEASE) => {}
            (None, None)
                if !partial_release_seen
                    && charge.is_hold()
                    && charge.status == ChargeStatus::Succeeded
                    && r.amount_cents == charge.released_cents()
                    && r.amount_cents > 0 =>
            {
                // What a partial capture left uncaptured, released.
                partial_release_seen = true;
            }
            (None, None) => provider_refund(local, provider, r, plan),
        }
    }
}

/// One of our refunds (or one created here from the provider's) follows
/// the provider's: settled when unknown or pending there, failed when it
/// failed after it succeeded.
fn follow_refund(refund: &Refund, r: &ProviderRefund, plan: &mut Plan) {
    let settled_there = matches!(r.status.as_str(), "succeeded" | "failed" | "canceled");
    match refund.status {
        ChargeStatus::Unknown if settled_there => {
            plan.to_settle.push((refund.clone(), r.id.clone()))
        }
        ChargeStatus::Pending if refund.gateway_refund_id.is_some() && settled_there => {
            plan.to_settle.push((refund.clone(), r.id.clone()));
        }
        ChargeStatus::Succeeded if matches!(r.status.as_str(), "failed" | "canceled") => {
            let failure_code = r.failure_reason.clone().unwrap_or_else(|| r.status.clone());
            let after = Refund {
                status: ChargeStatus::Failed,
                failure_code: Some(failure_code.clone()),
                gateway_refund_id: Some(r.id.clone()),
                ..refund.clone()
            };
            plan.changes.push(Change::RefundFailedLater {
                refund: refund.clone(),
                failure_code,
                event: NewEvent::new(EventType::RefundFailed, &refund.id, after.to_json()),
            });
        }
        _ => {}
    }
}

/// A refund made at the provider that is none of ours: created here, with
/// actor `provider`, when it fits beside the refunds this server holds.
/// One that does not fit conflicts with a reservation here (a refund of
/// ours in flight, which the provider will refuse: the money is gone):
/// it is left for a person and not created, since the charge cannot show
/// more refunded than it took; the event stays open and is applied again
/// by each reconcile pass, which settles the refund in flight first.
fn provider_refund(local: &Local, provider: &ProviderCharge, r: &ProviderRefund, plan: &mut Plan) {
    let charge = &local.charge;
    let status = match r.status.as_str() {
        "succeeded" => ChargeStatus::Succeeded,
        "pending" | "requires_action" => ChargeStatus::Pending,
        "failed" | "canceled" => ChargeStatus::Failed,
        other => {
            plan.for_person.push(format!(
                "the provider's refund {} of {} has a status this server does not know: {other:?}",
                r.id, charge.id
            ));
            return;
        }
    };
    let id = local_id("re_", &r.id);
    let refund = Refund {
        provider_key: format!("provider-{}", r.id),
        id,
        charge_id: charge.id.clone(),
        customer_id: charge.customer_id.clone(),
        requested_by: RequestedBy {
            subject: PROVIDER_SUBJECT.to_owned(),
            role: Role::Provider,
        },
        amount_cents: r.amount_cents,
        currency: charge.currency.clone(),
        reason: r.reason.as_deref().and_then(RefundReason::parse),
        metadata: Default::default(),
        status,
        gateway_charge_id: Some(provider.id.clone()),
        gateway_refund_id: Some(r.id.clone()),
        failure_code: (status == ChargeStatus::Failed)
            .then(|| r.failure_reason.clone().unwrap_or_else(|| r.status.clone())),
        created_at: local.now,
        updated_at: local.now,
    };
    let holding: Vec<&Refund> = local
        .refunds
        .iter()
        .filter(|l| l.status.holds_refund())
        .collect();
    let reserved: i64 = holding.iter().map(|l| l.amount_cents).sum();
    if status != ChargeStatus::Failed && reserved + r.amount_cents > charge.captured_cents() {
        let in_flight: Vec<&str> = holding
            .iter()
            .filter(|l| l.status != ChargeStatus::Succeeded)
            .map(|l| l.id.as_str())
            .collect();
        plan.for_person.push(format!(
            "the provider's refund {} of {} for {} does not fit: {} of {} captured is already \
             refunded or reserved here (in flight: {}); not recorded until it fits",
            r.id,
            charge.id,
            r.amount_cents,
            reserved,
            charge.captured_cents(),
            if in_flight.is_empty() {
                "none: this server and the provider disagree".to_owned()
            } else {
                in_flight.join(", ")
            }
        ));
        return;
    }
    let event_type = match status {
        ChargeStatus::Succeeded => EventType::RefundSucceeded,
        ChargeStatus::Pending => EventType::RefundPending,
        _ => EventType::RefundFailed,
    };
    let event = NewEvent::new(event_type, &refund.id, refund.to_json());
    plan.changes.push(Change::ProviderRefund { refund, event });
}

/// Each dispute the provider shows, created or brought up to date, with
/// the events a merchant expects: created, funds withdrawn (a dispute, not
/// an inquiry), updated, closed.
fn plan_disputes(local: &Local, provider: &ProviderCharge, plan: &mut Plan) {
    for d in &provider.disputes {
        let previous = local
            .disputes
            .iter()
            .find(|l| l.gateway_dispute_id == d.id)
            .cloned();
        let mut dispute = Dispute::of(&local.charge, d, local.now);
        if let Some(p) = &previous {
            // Applications read the provider at different moments: one
            // that read it before another's change committed must not take
            // the dispute back (a status only moves forward).
            if rank(&d.status) < rank(&p.status) {
                continue;
            }
            if (
                p.status.as_str(),
                p.amount_cents,
                p.refundable,
                p.evidence_due_by,
            ) == (
                d.status.as_str(),
                d.amount_cents,
                d.refundable,
                d.evidence_due_by,
            ) {
                continue;
            }
            dispute.id.clone_from(&p.id);
            dispute.created_at = p.created_at;
        }
        let data = dispute.to_json();
        // Created, funds withdrawn and closed happen once each; an update
        // once per state the dispute is seen in (a new amount or evidence
        // deadline with the same status is another update).
        let state = format!(
            "{}:{}:{}:{:?}",
            dispute.status, dispute.amount_cents, dispute.refundable, dispute.evidence_due_by
        );
        let event = |t: EventType| {
            let key = match t {
                EventType::ChargeDisputeUpdated => state.as_str(),
                _ => dispute.status.as_str(),
            };
            NewEvent::keyed(t, &dispute.id, key, data.clone())
        };
        let mut events = Vec::new();
        let was = previous.as_ref().map(|p| p.status.as_str());
        if was.is_none() {
            events.push(event(EventType::ChargeDisputeCreated));
        }
        let withdrawn_before = was.is_some_and(|s| !is_inquiry(s));
        if !is_inquiry(&dispute.status) && !withdrawn_before && dispute.status != "prevented" {
            events.push(event(EventType::ChargeDisputeFundsWithdrawn));
        }
        if is_closed(&dispute.status) {
            events.push(event(EventType::ChargeDisputeClosed));
        } else if was.is_some() {
            events.push(event(EventType::ChargeDisputeUpdated));
        }
        plan.changes.push(Change::Dispute {
            dispute,
            previous,
            events,
        });
    }
}

/// Where a dispute's status stands in its life: an inquiry, a dispute
/// (an inquiry may become one, never the reverse), under review, over.
fn rank(status: &str) -> u8 {
    match status {
        "warning_needs_response" => 0,
        "warning_under_review" => 1,
        "under_review" => 3,
        s if is_closed(s) => 4,
        _ => 2,
    }
}

/// A charge's status that keeps a refund's amount reserved.
trait HoldsRefund {
    fn holds_refund(self) -> bool;
}

impl HoldsRefund for ChargeStatus {
    fn holds_refund(self) -> bool {
        matches!(
            self,
            ChargeStatus::Pending | ChargeStatus::Succeeded | ChargeStatus::Unknown
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::charge::CardToken;
    use std::collections::BTreeMap;

    fn charge(status: ChargeStatus, amount: i64) -> Charge {
        Charge {
            id: "ch_local".into(),
            customer_id: "cus_1".into(),
            amount_cents: amount,
            currency: "GBP".into(),
            card_token: CardToken::parse("tok_visa").expect("a token"),
            description: None,
            metadata: BTreeMap::new(),
            status,
            provider_key: "k".into(),
            gateway_charge_id: Some("ch_provider".into()),
            decline_code: None,
            amount_refunded: 0,
            idempotency_key: Some("key".into()),
            capture: true,
            amount_captured: None,
            capture_before: None,
            created_at: DateTime::UNIX_EPOCH,
            updated_at: DateTime::UNIX_EPOCH,
        }
    }

    fn local(charge: Charge) -> Local {
        Local {
            charge,
            hold_taken: false,
            refunds: Vec::new(),
            disputes: Vec::new(),
            now: DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default(),
        }
    }

    fn provider(amount: i64) -> ProviderCharge {
        ProviderCharge {
            id: "ch_provider".into(),
            operation_id: Some("ch_local".into()),
            amount_cents: amount,
            currency: "GBP".into(),
            status: "succeeded".into(),
            captured: true,
            amount_captured: amount,
            refunded: false,
            refunds: Vec::new(),
            disputes: Vec::new(),
        }
    }

    fn refund_at_provider(id: &str, amount: i64, ours: Option<&str>) -> ProviderRefund {
        ProviderRefund {
            id: id.into(),
            operation_id: ours.map(str::to_owned),
            amount_cents: amount,
            status: "succeeded".into(),
            reason: None,
            failure_reason: None,
        }
    }

    #[test]
    fn parse_reads_the_charge_of_each_kind_of_object() {
        let event = |object: Value| {
            let body =
                serde_json::json!({"id": "evt_1", "type": "t.x", "data": {"object": object}});
            ProviderEvent::parse(body.to_string().as_bytes()).expect("an event")
        };
        let charge = serde_json::json!({"object": "charge", "id": "ch_1"});
        assert_eq!(event(charge).charge.as_deref(), Some("ch_1"));
        let refund = serde_json::json!({"object": "refund", "id": "re_1", "charge": "ch_2"});
        assert_eq!(event(refund).charge.as_deref(), Some("ch_2"));
        let dispute = serde_json::json!({"object": "dispute", "id": "dp_1", "charge": "ch_3"});
        assert_eq!(event(dispute).charge.as_deref(), Some("ch_3"));
        assert_eq!(
            event(serde_json::json!({"object": "customer", "id": "cus_1"})).charge,
            None
        );
        let hostile = serde_json::json!({"object": "charge", "id": "ch_1'; DROP"});
        assert_eq!(event(hostile).charge, None);
        for bad in [
            &b"{"[..],
            b"[]",
            br#"{"id":"evt_1"}"#,
            br#"{"id":"evt_1","type":"x"}"#,
        ] {
            assert!(
                ProviderEvent::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_dashboard_refund_is_created_once_and_ours_are_matched_first() {
        let mut l = local(charge(ChargeStatus::Succeeded, 1000));
        let mut p = provider(1000);
        p.refunds.push(refund_at_provider("re_dash", 300, None));
        let plan = plan(&l, &p);
        let [Change::ProviderRefund { refund, event }] = plan.changes.as_slice() else {
            panic!("one dashboard refund expected: {plan:?}");
        };
        assert_eq!(refund.requested_by.role, Role::Provider);
        assert_eq!(refund.amount_cents, 300);
        assert_eq!(refund.id, local_id("re_", "re_dash"));
        assert_eq!(event.event_type, EventType::RefundSucceeded);
        assert_eq!(plan.state(), InboxState::Applied);
        // Once created here, the same provider refund changes nothing.
        l.refunds.push(refund.clone());
        assert_eq!(super::plan(&l, &p).changes, Vec::new());
        // Our own refund, its provider id not recorded yet (the webhook
        // came before our finish): matched by its metadata, not created.
        let mut ours = refund.clone();
        ours.id = "re_ours".into();
        ours.gateway_refund_id = None;
        ours.status = ChargeStatus::Pending;
        let l = Local {
            refunds: vec![ours],
            ..local(charge(ChargeStatus::Succeeded, 1000))
        };
        let mut p = provider(1000);
        p.refunds
            .push(refund_at_provider("re_x", 300, Some("re_ours")));
        assert_eq!(super::plan(&l, &p), Plan::default());
    }

    #[test]
    fn releases_of_holds_are_not_dashboard_refunds() {
        // A hold captured in part: the rest released as a refund.
        let mut c = charge(ChargeStatus::Succeeded, 1000);
        (c.capture, c.amount_captured) = (false, Some(600));
        let mut p = provider(1000);
        p.amount_captured = 600;
        p.refunds.push(refund_at_provider("re_release", 400, None));
        assert_eq!(plan(&local(c.clone()), &p).changes, Vec::new());
        // A second refund of 400 is a real one.
        p.refunds.push(refund_at_provider("re_dash", 400, None));
        assert_eq!(plan(&local(c), &p).changes.len(), 1);
        // A lapse's release, and a cancel's (named by our cancel's id).
        let mut c = charge(ChargeStatus::Expired, 1000);
        (c.capture, c.amount_captured) = (false, Some(0));
        let mut p = provider(1000);
        (p.captured, p.refunded) = (false, true);
        let mut lapse = refund_at_provider("re_lapse", 1000, None);
        lapse.reason = Some(LAPSED_RELEASE.into());
        p.refunds.push(lapse);
        assert_eq!(plan(&local(c.clone()), &p).changes, Vec::new());
        p.refunds = vec![refund_at_provider("re_c", 1000, Some("cn_0123"))];
        c.status = ChargeStatus::Canceled;
        assert_eq!(plan(&local(c), &p).changes, Vec::new());
    }

    #[test]
    fn a_refund_that_does_not_fit_beside_one_in_flight_waits_with_a_person() {
        let mut l = local(charge(ChargeStatus::Succeeded, 1000));
        l.refunds
            .push(refund_local("re_a", 800, ChargeStatus::Unknown));
        let mut p = provider(1000);
        p.refunds.push(refund_at_provider("re_dash", 300, None));
        let waiting = plan(&l, &p);
        assert_eq!(waiting.changes, Vec::new(), "the charge cannot show 1100");
        assert_eq!(waiting.state(), InboxState::NeedsPerson);
        assert!(waiting.state().is_open(), "applied again");
        let detail = waiting.detail().expect("it says why");
        assert!(detail.contains("in flight: re_a"), "{detail}");
        // Ours failed at the provider (there was no room): it fits now.
        l.refunds[0].status = ChargeStatus::Failed;
        let applied = plan(&l, &p);
        assert_eq!(applied.state(), InboxState::Applied);
        assert!(matches!(
            applied.changes.as_slice(),
            [Change::ProviderRefund { refund, .. }] if refund.amount_cents == 300
        ));
    }

    fn refund_local(id: &str, amount: i64, status: ChargeStatus) -> Refund {
        Refund {
            id: id.into(),
            charge_id: "ch_local".into(),
            customer_id: "cus_1".into(),
            requested_by: RequestedBy {
                subject: "office".into(),
                role: Role::BackOffice,
            },
            amount_cents: amount,
            currency: "GBP".into(),
            reason: None,
            metadata: BTreeMap::new(),
            status,
            provider_key: format!("pk-{id}"),
            gateway_charge_id: Some("ch_provider".into()),
            gateway_refund_id: None,
            failure_code: None,
            created_at: DateTime::UNIX_EPOCH,
            updated_at: DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_refund_that_fails_after_it_succeeded_gives_its_amount_back() {
        let mut l = local(charge(ChargeStatus::Succeeded, 1000));
        l.refunds
            .push(refund_local("re_a", 500, ChargeStatus::Succeeded));
        let mut p = provider(1000);
        let mut failed = refund_at_provider("re_pa", 500, Some("re_a"));
        failed.status = "failed".into();
        failed.failure_reason = Some("expired_or_canceled_card".into());
        p.refunds.push(failed);
        let plan = plan(&l, &p);
        let [
            Change::RefundFailedLater {
                failure_code,
                event,
                ..
            },
        ] = plan.changes.as_slice()
        else {
            panic!("a failed-later change expected: {plan:?}");
        };
        assert_eq!(failure_code, "expired_or_canceled_card");
        assert_eq!(event.event_type, EventType::RefundFailed);
        // An unknown one is settled from the provider's records instead.
        l.refunds[0].status = ChargeStatus::Unknown;
        assert_eq!(super::plan(&l, &p).to_settle.len(), 1);
    }

    #[test]
    fn a_hold_captured_or_released_at_the_provider_follows_unless_we_hold_it() {
        let mut c = charge(ChargeStatus::RequiresCapture, 1000);
        (c.capture, c.amount_captured) = (false, Some(0));
        let mut p = provider(1000);
        p.amount_captured = 700;
        let plan1 = plan(&local(c.clone()), &p);
        let [
            Change::Hold {
                status,
                amount_captured,
                event,
                ..
            },
        ] = plan1.changes.as_slice()
        else {
            panic!("a hold change expected: {plan1:?}");
        };
        assert_eq!(
            (*status, *amount_captured),
            (ChargeStatus::Succeeded, Some(700))
        );
        assert_eq!(event.event_type, EventType::ChargeCaptured);
        let taken = Local {
            hold_taken: true,
            ..local(c.clone())
        };
        assert_eq!(
            plan(&taken, &p).changes,
            Vec::new(),
            "our capture's outcome decides"
        );
        (p.captured, p.refunded, p.amount_captured) = (false, true, 0);
        let mut lapse = refund_at_provider("re_lapse", 1000, None);
        lapse.reason = Some(LAPSED_RELEASE.into());
        p.refunds.push(lapse);
        let plan2 = plan(&local(c), &p);
        assert!(
            matches!(
                plan2.changes.as_slice(),
                [Change::Hold {
                    status: ChargeStatus::Expired,
                    ..
                }]
            ),
            "{plan2:?}"
        );
    }

    #[test]
    fn disputes_are_created_then_followed_with_their_events() {
        let mut l = local(charge(ChargeStatus::Succeeded, 1000));
        let mut p = provider(1000);
        let mut d = ProviderDispute {
            id: "dp_p".into(),
            amount_cents: 1000,
            currency: "GBP".into(),
            status: "warning_needs_response".into(),
            reason: "fraudulent".into(),
            refundable: true,
            evidence_due_by: None,
        };
        p.disputes.push(d.clone());
        let types = |plan: &Plan| -> Vec<&'static str> {
            plan.changes
                .iter()
                .flat_map(|c| match c {
                    Change::Dispute { events, .. } => {
                        events.iter().map(|e| e.event_type.as_str()).collect()
                    }
                    _ => Vec::new(),
                })
                .collect()
        };
        let first = plan(&l, &p);
        assert_eq!(types(&first), ["charge.dispute.created"]);
        let Change::Dispute { dispute, .. } = &first.changes[0] else {
            panic!("a dispute")
        };
        assert!(
            !dispute.blocks_refunds(),
            "an inquiry leaves the charge refundable"
        );
        l.disputes.push(dispute.clone());
        assert_eq!(
            plan(&l, &p),
            Plan::default(),
            "the same state changes nothing"
        );
        (d.status, d.refundable) = ("needs_response".into(), false);
        p.disputes = vec![d.clone()];
        let escalated = plan(&l, &p);
        assert_eq!(
            types(&escalated),
            ["charge.dispute.funds_withdrawn", "charge.dispute.updated"]
        );
        let Change::Dispute { dispute, .. } = &escalated.changes[0] else {
            panic!("a dispute")
        };
        assert!(dispute.blocks_refunds());
        l.disputes = vec![dispute.clone()];
        // The amount changes, the status does not: another update, with an
        // id of its own (one per state the dispute is seen in).
        let update_id = |plan: &Plan| match &plan.changes[..] {
            [Change::Dispute { events, .. }] => events
                .iter()
                .find(|e| e.event_type == EventType::ChargeDisputeUpdated)
                .map(|e| e.id.clone()),
            _ => None,
        };
        let escalated_update = update_id(&escalated);
        d.amount_cents = 600;
        p.disputes = vec![d.clone()];
        let smaller = plan(&l, &p);
        assert_eq!(types(&smaller), ["charge.dispute.updated"]);
        assert!(update_id(&smaller).is_some());
        assert_ne!(update_id(&smaller), escalated_update);
        let Change::Dispute { dispute, .. } = &smaller.changes[0] else {
            panic!("a dispute")
        };
        l.disputes = vec![dispute.clone()];
        d.status = "lost".into();
        p.disputes = vec![d];
        assert_eq!(types(&plan(&l, &p)), ["charge.dispute.closed"]);
        // A provider read older than what was applied never takes it back.
        let Change::Dispute { dispute, .. } = &plan(&l, &p).changes[0] else {
            panic!("a dispute")
        };
        assert_eq!(dispute.status, "lost");
        l.disputes = vec![dispute.clone()];
        let mut stale = p.clone();
        stale.disputes[0].status = "needs_response".into();
        assert_eq!(plan(&l, &stale), Plan::default());
        // Closed before its creation was seen: both, in order.
        let fresh = local(charge(ChargeStatus::Succeeded, 1000));
        assert_eq!(
            types(&plan(&fresh, &p)),
            [
                "charge.dispute.created",
                "charge.dispute.funds_withdrawn",
                "charge.dispute.closed"
            ]
        );
    }

    #[test]
    fn a_charge_still_being_made_waits() {
        let plan = plan(&local(charge(ChargeStatus::Pending, 1000)), &provider(1000));
        assert_eq!(plan.state(), InboxState::Waiting);
        assert!(plan.changes.is_empty());
    }
}
