//! Row types shared by the backends, generic over how a backend stores a
//! timestamp (SQLite: integer Unix milliseconds; PostgreSQL: `timestamptz`),
//! so the mapping to domain types is written once.

use chrono::{DateTime, Utc};

use payments_domain::charge::{CardToken, Charge, ChargeStatus};
use payments_domain::hold::{Capture, HoldAction};
use payments_domain::idempotency::{
    IdempotencyRecord, JSON, Lease, LeaseToken, RecordId, RecordState, StoredResponse,
};
use payments_domain::refund::{Refund, RefundReason, RequestedBy};
use payments_domain::scope::Role;

use crate::Error;

/// A backend's timestamp column type.
pub trait Timestamp: Sized + Send + Unpin + std::fmt::Debug + 'static {
    /// The time, or `None` when it is out of range.
    fn utc(&self) -> Option<DateTime<Utc>>;
}

/// A stored time as UTC.
pub(crate) fn decode<T: Timestamp>(t: T) -> Result<DateTime<Utc>, Error> {
    t.utc()
        .ok_or_else(|| Error::Invariant(format!("timestamp out of range: {t:?}")))
}

impl Timestamp for i64 {
    fn utc(&self) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp_millis(*self)
    }
}

impl Timestamp for DateTime<Utc> {
    fn utc(&self) -> Option<DateTime<Utc>> {
        Some(*self)
    }
}

/// The columns of `idempotent_requests`, in `RecordRow` order (a template:
/// `{customer_id ..}` is the dialect's); `{record}` adds `lease_live`, `expired`, `age_ms` and `ttl_left_ms`, computed by the
/// database.
pub(crate) const RECORD_COLUMNS: &str = "id, idempotency_key, route, {customer_id customer_id}, \
    request_hash, state, lease_token, locked_until, charge_id, refund_id, response_status, \
    response_body, response_content_type, response_location, created_at, completed_at, expires_at";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RecordRow<T> {
    id: i64,
    idempotency_key: String,
    route: String,
    customer_id: String,
    request_hash: String,
    state: String,
    lease_token: Option<String>,
    locked_until: Option<T>,
    charge_id: String,
    refund_id: Option<String>,
    response_status: Option<i32>,
    response_body: Option<String>,
    response_content_type: Option<String>,
    response_location: Option<String>,
    created_at: T,
    completed_at: Option<T>,
    expires_at: T,
    lease_live: i64,
    expired: i64,
    age_ms: i64,
    ttl_left_ms: i64,
}

impl<T: Timestamp> TryFrom<RecordRow<T>> for IdempotencyRecord {
    type Error = Error;

    fn try_from(r: RecordRow<T>) -> Result<Self, Error> {
        let state = RecordState::parse(&r.state)
            .ok_or_else(|| Error::Invariant(format!("unknown record state {:?}", r.state)))?;
        let lease = match (r.lease_token, r.locked_until) {
            (Some(token), Some(until)) => Some(Lease {
                token: LeaseToken::from_stored(token),
                until: decode(until)?,
            }),
            _ => None,
        };
        let response = match (r.response_status, r.response_body) {
            (Some(status), Some(body)) => Some(StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| Error::Invariant(format!("bad stored status {status}")))?,
                body,
                content_type: r.response_content_type.unwrap_or_else(|| JSON.to_owned()),
                location: r.response_location,
            }),
            _ => None,
        };
        Ok(IdempotencyRecord {
            id: RecordId(r.id),
            key: r.idempotency_key,
            route: r.route,
            customer_id: r.customer_id,
            request_hash: r.request_hash,
            state,
            lease,
            charge_id: r.charge_id,
            refund_id: r.refund_id,
            response,
            created_at: decode(r.created_at)?,
            completed_at: r.completed_at.map(decode).transpose()?,
            expires_at: decode(r.expires_at)?,
            lease_live: r.lease_live != 0,
            expired: r.expired != 0,
            age: std::time::Duration::from_millis(u64::try_from(r.age_ms).unwrap_or(0)),
            ttl_left: std::time::Duration::from_millis(u64::try_from(r.ttl_left_ms).unwrap_or(0)),
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ChargeRow<T> {
    id: String,
    customer_id: String,
    amount_cents: i64,
    currency: String,
    card_token: String,
    description: Option<String>,
    metadata: String,
    status: String,
    provider_key: String,
    gateway_charge_id: Option<String>,
    decline_code: Option<String>,
    amount_refunded: i64,
    idempotency_key: Option<String>,
    hold: Option<String>,
    amount_captured: Option<i64>,
    capture_before: Option<T>,
    created_at: T,
    updated_at: T,
}

/// A charge's `hold` column: where a hold is.
pub(crate) mod hold {
    pub(crate) const REQUIRES_CAPTURE: &str = "requires_capture";
    pub(crate) const CAPTURED: &str = "captured";
    pub(crate) const CANCELED: &str = "canceled";
    pub(crate) const EXPIRED: &str = "expired";
}

/// The status a charge shows: its `status`, except a hold's once it was
/// authorized (`succeeded`), which shows where the hold is unless
/// captured.
pub(crate) fn shown_status(status: &str, hold: Option<&str>) -> Option<ChargeStatus> {
    let status = ChargeStatus::parse(status)?;
    Some(match (status, hold) {
        (ChargeStatus::Succeeded, Some(hold::REQUIRES_CAPTURE)) => ChargeStatus::RequiresCapture,
        (ChargeStatus::Succeeded, Some(hold::CANCELED)) => ChargeStatus::Canceled,
        (ChargeStatus::Succeeded, Some(hold::EXPIRED)) => ChargeStatus::Expired,
        (ChargeStatus::Succeeded, Some(hold::CAPTURED) | None) => ChargeStatus::Succeeded,
        (ChargeStatus::Succeeded, Some(_)) => return None,
        (other, _) => other,
    })
}

/// A status filter as the `status` and `hold` columns hold it: the
/// `status` column's value, and the `hold` the charge must have (`Some`)
/// or must not have as one of the shown ones (`None`).
pub(crate) fn stored_status(shown: ChargeStatus) -> (&'static str, Option<&'static str>) {
    match shown {
        ChargeStatus::RequiresCapture => ("succeeded", Some(hold::REQUIRES_CAPTURE)),
        ChargeStatus::Canceled => ("succeeded", Some(hold::CANCELED)),
        ChargeStatus::Expired => ("succeeded", Some(hold::EXPIRED)),
        other => (other.as_str(), None),
    }
}

impl<T: Timestamp> TryFrom<ChargeRow<T>> for Charge {
    type Error = Error;

    fn try_from(r: ChargeRow<T>) -> Result<Self, Error> {
        let bad = |what: &str| Error::Invariant(format!("charge {}: bad {what}", r.id));
        Ok(Charge {
            status: shown_status(&r.status, r.hold.as_deref()).ok_or_else(|| bad("status"))?,
            capture: r.hold.is_none(),
            amount_captured: r.amount_captured,
            capture_before: r.capture_before.map(decode).transpose()?,
            metadata: serde_json::from_str(&r.metadata).map_err(|_| bad("metadata"))?,
            card_token: CardToken::parse(&r.card_token).map_err(|_| bad("card token"))?,
            created_at: decode(r.created_at)?,
            updated_at: decode(r.updated_at)?,
            id: r.id,
            customer_id: r.customer_id,
            amount_cents: r.amount_cents,
            currency: r.currency,
            description: r.description,
            provider_key: r.provider_key,
            gateway_charge_id: r.gateway_charge_id,
            decline_code: r.decline_code,
            amount_refunded: r.amount_refunded,
            idempotency_key: r.idempotency_key,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RefundRow<T> {
    id: String,
    charge_id: String,
    customer_id: String,
    amount_cents: i64,
    currency: String,
    reason: Option<String>,
    metadata: String,
    status: String,
    provider_key: String,
    gateway_charge_id: Option<String>,
    gateway_refund_id: Option<String>,
    failure_code: Option<String>,
    /// NULL in a refund made before roles (or by a server from before
    /// them, during a rollout): only a charge's customer refunded then.
    requested_by: Option<String>,
    requested_by_role: Option<String>,
    created_at: T,
    updated_at: T,
}

impl<T: Timestamp> TryFrom<RefundRow<T>> for Refund {
    type Error = Error;

    fn try_from(r: RefundRow<T>) -> Result<Self, Error> {
        let bad = |what: &str| Error::Invariant(format!("refund {}: bad {what}", r.id));
        let reason = r.reason.as_deref().map(RefundReason::parse);
        Ok(Refund {
            status: ChargeStatus::parse(&r.status).ok_or_else(|| bad("status"))?,
            reason: reason
                .map(|reason| reason.ok_or_else(|| bad("reason")))
                .transpose()?,
            metadata: serde_json::from_str(&r.metadata).map_err(|_| bad("metadata"))?,
            requested_by: RequestedBy {
                role: match r.requested_by_role.as_deref() {
                    None => Role::Customer,
                    Some(role) => Role::parse(role).ok_or_else(|| bad("requested_by_role"))?,
                },
                subject: r.requested_by.unwrap_or_else(|| r.customer_id.clone()),
            },
            created_at: decode(r.created_at)?,
            updated_at: decode(r.updated_at)?,
            id: r.id,
            charge_id: r.charge_id,
            customer_id: r.customer_id,
            amount_cents: r.amount_cents,
            currency: r.currency,
            provider_key: r.provider_key,
            gateway_charge_id: r.gateway_charge_id,
            gateway_refund_id: r.gateway_refund_id,
            failure_code: r.failure_code,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct CaptureRow<T> {
    id: String,
    action: String,
    charge_id: String,
    customer_id: String,
    requested_by: String,
    requested_by_role: String,
    amount_cents: i64,
    currency: String,
    status: String,
    provider_key: String,
    gateway_charge_id: Option<String>,
    gateway_id: Option<String>,
    failure_code: Option<String>,
    created_at: T,
    updated_at: T,
}

impl<T: Timestamp> CaptureRow<T> {
    /// The capture, with its hold (`hold`, read on its own).
    pub(crate) fn with_hold(self, hold: Charge) -> Result<Capture, Error> {
        let r = self;
        let bad = |what: &str| Error::Invariant(format!("capture {}: bad {what}", r.id));
        Ok(Capture {
            action: HoldAction::parse(&r.action).ok_or_else(|| bad("action"))?,
            status: ChargeStatus::parse(&r.status).ok_or_else(|| bad("status"))?,
            requested_by: RequestedBy {
                role: Role::parse(&r.requested_by_role).ok_or_else(|| bad("requested_by_role"))?,
                subject: r.requested_by,
            },
            hold: Box::new(hold),
            created_at: decode(r.created_at)?,
            updated_at: decode(r.updated_at)?,
            id: r.id,
            charge_id: r.charge_id,
            customer_id: r.customer_id,
            amount_cents: r.amount_cents,
            currency: r.currency,
            provider_key: r.provider_key,
            gateway_charge_id: r.gateway_charge_id,
            gateway_id: r.gateway_id,
            failure_code: r.failure_code,
        })
    }

    pub(crate) fn charge_id(&self) -> &str {
        &self.charge_id
    }
}
