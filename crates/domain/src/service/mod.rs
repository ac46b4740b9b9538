//! `ChargeService`: the operations the API and the jobs call, each checked
//! against its caller's rights ([`crate::scope::Actor`]), and the types
//! they answer with. By concern:
//!
//! - `machine`: the idempotency state machine, claim to finish (the file
//!   to read first; `docs/design-decisions.md` gives the why);
//! - `reads`: a charge or refund within the caller's reach, and the lists;
//! - `reconcile`: settling unknown outcomes from the provider's records,
//!   and finding orphans.

mod inbox;
mod machine;
mod reads;
mod reconcile;

pub use inbox::{InboxError, PROVIDER_EVENTS_OPEN, PROVIDER_EVENTS_TOTAL, Received, WaitingReport};

pub use machine::log_abandoned;
use machine::{capture_outcome, refund_outcome, settle};

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::answers::{self, AnswerCache};
use crate::charge::{Charge, ChargeRequest, ChargeStatus, CustomerId, InvalidRequest};
use crate::derive::Derivation;
use crate::envelope::ErrorEnvelope;
use crate::events::{Event, EventQuery, NewEvent};
use crate::hold::HoldState;
use crate::hold::{Capture, HoldAction, HoldRequest};
use crate::idempotency::{
    CHARGES_ROUTE, IdempotencyKey, IdempotencyRecord, JSON, LeaseToken, REFUNDS_ROUTE, RecordId,
    RecordState, RequestFingerprint, StoredResponse,
};
use crate::limits::{RATE_LIMITED_TOTAL, RateLimit};
use crate::list::{self, ChargeQuery, Cursor, List};
use crate::provider::{
    CreatedWindow, Doubt, Expected, Gateway, Lookup, OperationKind, ProviderCaptureRequest,
    ProviderChargeRequest, ProviderOutcome, ProviderRefundRequest,
};
use crate::refund::{Refund, RefundRequest};
use crate::scope::{Actor, Denied, Role, Scope};
use crate::store::{
    CaptureOutcome, ChargeOutcome, Claim, ClaimAge, ClaimOutcome, Finish, FinishOutcome, NewLease,
    Operation, Outcome, RefundOutcome, Store, StoreError, Unsettled,
};

/// Counts the expired leases taken over to re-drive a charge (a metric name,
/// with the others in `payments_api::telemetry`).
pub const LEASE_TAKEOVERS_TOTAL: &str = "payments_lease_takeovers_total";
/// Counts the abandoned records, by `reason`: `key_retention` and
/// `replayed_error` (the provider replays an error saved under the key)
/// here, `reaper` in `payments-jobs`.
pub const ABANDONED_TOTAL: &str = "payments_abandoned_total";

/// Counts refunds by final `outcome`: `succeeded`, `failed` (the provider
/// refused it), `unknown` (abandoned), `exceeds_charge` (refused here:
/// it did not fit in what was left of its charge) and `pending` (answered
/// 201 `pending`: the provider settles it later, reconciliation polls it).
pub const REFUNDS_TOTAL: &str = "payments_refunds_total";

/// Counts captures and cancels of holds by `action` (`capture`, `cancel`)
/// and final `outcome`: `succeeded`, `failed` (the provider refused it;
/// the hold is given back, or lapsed), `unknown` (abandoned), `refused`
/// (a stored 400 before the provider: the hold was captured, canceled or
/// lapsing) and `busy` (a 409: another capture or cancel holds it).
pub const CAPTURES_TOTAL: &str = "payments_captures_total";
/// Holds by `status` (a gauge, set by `payments-jobs`).
pub const HOLDS: &str = "payments_holds";

/// Counts reconciliations by `operation` (`charge`, `refund`) and `outcome`:
/// settled as `succeeded`, `failed` or `not_made`, or left as `lagging`,
/// `needs_person`, `lookup_failed` or `pending` (a refund still pending at
/// the provider).
pub const RECONCILED_TOTAL: &str = "payments_reconciled_total";
/// Open orphans by `kind` (a gauge): provider objects naming one of our
/// operations with no row here ([`ChargeService::find_orphans`]).
pub const ORPHANS: &str = "payments_orphans";
/// Replays looked up in memory first, by `result`: `hit` (answered with no
/// database round trip) or `miss`.
pub const REPLAY_CACHE_TOTAL: &str = "payments_replay_cache_total";

/// Seconds a client should wait before retrying a 409 or 503.
pub const RETRY_AFTER_SECS: u64 = 2;

/// The numbers the state machine runs on.
#[derive(Debug, Clone)]
pub struct Policy {
    /// How long a claimer owns an in-progress request. Must outlast the
    /// provider timeout, or a live call could be taken over and re-driven.
    pub lease: Duration,
    /// How long a key is remembered (24 h).
    pub ttl: Duration,
    /// The largest amount accepted, in minor units.
    pub max_amount_cents: i64,
    /// The provider's key retention minus the margin: a record claimed
    /// longer ago than this is never re-driven, only abandoned.
    pub redrive_limit: Duration,
    /// How long after a provider call was sent the provider may still act
    /// on it: `GATEWAY_TIMEOUT` (we wait at most that) plus
    /// `PROVIDER_MAX_PROCESSING` (it may go on after we stop waiting).
    /// Reconciliation counts its search lag from the end of it.
    pub provider_acts_within: Duration,
    /// What keyed operations' ids and provider keys are derived under
    /// (`PROVIDER_KEY_SECRET`, [`crate::derive`]).
    pub derivation: Derivation,
    /// How long a hold lasts when the provider does not say
    /// (`HOLD_EXPIRY`): its authorization's time plus this.
    pub hold_expiry: Duration,
    /// A capture is refused (400 `hold_expired`, before the provider is
    /// called) once its hold lapses within this (`HOLD_CAPTURE_MARGIN`).
    pub hold_capture_margin: Duration,
}

/// The open orphans a search counts at most (the gauge saturates there).
const MAX_OPEN_ORPHANS: u32 = 10_000;

/// The most generations one (customer, route, key) may take: a key reused
/// after expiry once a day for years stays far below it.
const MAX_GENERATIONS: u32 = 100_000;

/// Why a charge or refund request got no stored answer. None of these is
/// stored: the client may fix the request or wait, and retry with the same
/// key.
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    /// Same key with another body, or a key first used by another customer.
    #[error("this idempotency key was already used with a different request")]
    KeyReused,
    /// The first attempt still holds its lease.
    #[error("a request with this idempotency key is still in progress")]
    InProgress,
    /// The provider's outcome is unknown; the key stays claimed and the
    /// next retry (or the reaper) re-drives the same provider call.
    #[error("the payment provider's outcome is unknown ({}): {reason}", .doubt.as_str())]
    ProviderUnavailable { doubt: Doubt, reason: String },
    /// The customer started more new operations than its rate allows;
    /// `retry_after` is when the next would be admitted. Not stored.
    #[error("too many new operations from this customer")]
    RateLimited { retry_after: Duration },
    /// The token lacks the scope the operation needs: 403
    /// `insufficient_scope`, checked before anything is read or stored.
    #[error(transparent)]
    Denied(#[from] Denied),
    /// The charge to refund does not exist or is out of the caller's reach.
    #[error("no such charge")]
    ChargeNotFound,
    /// The charge to refund has not succeeded (yet): it may, by
    /// reconciliation, so this is not stored.
    #[error("a charge that is {} cannot be refunded", .0.as_str())]
    NotRefundable(ChargeStatus),
    /// The charge to capture or cancel is no hold that can be (yet): its
    /// authorization is still unknown or pending, it failed, or it was
    /// made to be captured at once. Not stored.
    #[error("a charge that is {} is not a hold that can be captured or canceled", .0.as_str())]
    NotCapturable(ChargeStatus),
    /// Another capture or cancel of the hold is pending: it may yet fail
    /// and give the hold back, so this 409 is not stored.
    #[error("another capture or cancel of this hold is in progress")]
    HoldBusy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a driver does with its lease when the provider's outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnknown {
    /// End the lease now, so the client's retry takes over at once (the API).
    ReleaseLease,
    /// Keep it until it expires, so the next pass retries (the reaper, which
    /// would otherwise take the same record straight back).
    KeepLease,
}

/// The code of the stored answer of an abandoned request.
pub const ABANDONED: &str = "request_abandoned";

/// What reconciliation makes of one unsettled operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The provider's records say what happened: settle it, and answer its
    /// abandoned request with this.
    Settle {
        outcome: Outcome,
        answer: StoredResponse,
    },
    /// Not found, but the provider's search may not show it yet.
    Lagging,
    /// Not found, and its provider calls did not name it (made before they
    /// did): not finding it proves nothing, a person must look.
    NeedsPerson,
    /// The lookup failed, or found nothing final: try again later.
    LookupFailed(String),
    /// The provider has the refund and says it is still pending: polled
    /// again on the next pass.
    Pending,
}

impl Decision {
    /// Its `outcome` label in [`RECONCILED_TOTAL`] and the logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Settle { outcome, .. } if outcome.is_not_made() => "not_made",
            Self::Settle { outcome, .. } => outcome.status().as_str(),
            Self::Lagging => "lagging",
            Self::NeedsPerson => "needs_person",
            Self::LookupFailed(_) => "lookup_failed",
            Self::Pending => "pending",
        }
    }
}

/// The decline code of an operation reconciliation found was never made.
pub const NOT_MADE: [&str; 4] = [
    "charge_not_made",
    "refund_not_made",
    "capture_not_made",
    "cancel_not_made",
];

/// The code of the stored 400 answer when the provider refused the request
/// itself (Stripe's `invalid_request_error`).
pub const PROVIDER_REJECTED: &str = "provider_rejected_request";

/// Allowance for the difference between the provider's clock (its
/// objects' `created`) and the database's, on each side of the window a
/// charge is looked for in the provider's list.
pub const PROVIDER_CLOCK_MARGIN: Duration = Duration::from_secs(5 * 60);

/// A charge request checked and fingerprinted ([`ChargeService::prepare_charge`]),
/// before its key is looked up.
#[derive(Debug)]
pub struct ChargeAttempt {
    request: ChargeRequest,
    fingerprinted: Value,
    fingerprint: RequestFingerprint,
}

/// A final answer: fresh, or replayed from the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub response: StoredResponse,
    pub replayed: bool,
}

/// What one orphan search found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrphanReport {
    /// Provider objects naming one of our operations, in the window.
    pub seen: u64,
    /// Orphans recorded by this search (logged `ORPHAN`).
    pub new: u64,
    /// Orphans whose operation has its row again.
    pub settled: u64,
    /// Orphans not settled, after this search.
    pub open: u64,
    /// Lists that could not be read to their end (charges, refunds).
    pub lookup_failed: u64,
}

/// Charges, exactly once per (key, route).
#[derive(Debug, Clone)]
pub struct ChargeService {
    store: Arc<dyn Store>,
    gateway: Arc<dyn Gateway>,
    policy: Policy,
    answers: Option<Arc<dyn AnswerCache>>,
    rate_limit: Option<Arc<dyn RateLimit>>,
    back_office_rate_limit: Option<Arc<dyn RateLimit>>,
}

impl ChargeService {
    pub fn new(store: Arc<dyn Store>, gateway: Arc<dyn Gateway>, policy: Policy) -> Self {
        Self {
            store,
            gateway,
            policy,
            answers: None,
            rate_limit: None,
            back_office_rate_limit: None,
        }
    }

    /// The same service, admitting each customer's new operations at
    /// `limit`'s rate ([`crate::limits`]).
    pub fn with_rate_limit(self, limit: Arc<dyn RateLimit>) -> Self {
        Self {
            rate_limit: Some(limit),
            ..self
        }
    }

    /// The same service, admitting each back-office subject's new
    /// operations at `limit`'s rate (`BACK_OFFICE_RATE_LIMIT_PER_MINUTE`);
    /// without it the back office is not limited.
    pub fn with_back_office_rate_limit(mut self, limit: Arc<dyn RateLimit>) -> Self {
        self.back_office_rate_limit = Some(limit);
        self
    }

    /// The same service, answering replays from `answers` when it holds
    /// them ([`crate::answers`]).
    pub fn with_answers(self, answers: Arc<dyn AnswerCache>) -> Self {
        Self {
            answers: Some(answers),
            ..self
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// `POST /api/charges` with an idempotency key: [`Self::prepare_charge`],
    /// [`Self::replay_charge`], else [`Self::charge_attempt`].
    pub async fn create_charge(
        &self,
        actor: &Actor,
        key: &IdempotencyKey,
        body: Value,
    ) -> Result<Reply, ChargeError> {
        let attempt = self.prepare_charge(actor, body)?;
        match self.replay_charge(actor, key, &attempt) {
            Some(answer) => answer,
            None => self.charge_attempt(actor, key, attempt).await,
        }
    }

    /// A charge request checked (the caller may charge, the body is valid)
    /// and fingerprinted; nothing is read or written.
    pub fn prepare_charge(&self, actor: &Actor, body: Value) -> Result<ChargeAttempt, ChargeError> {
        actor.may_charge()?;
        let request = ChargeRequest::from_json(&body, self.policy.max_amount_cents)?;
        let fingerprinted = match request.fingerprinted(&body) {
            std::borrow::Cow::Owned(canonical) => canonical,
            std::borrow::Cow::Borrowed(_) => body,
        };
        let fingerprint = RequestFingerprint::of(&fingerprinted);
        Ok(ChargeAttempt {
            request,
            fingerprinted,
            fingerprint,
        })
    }

    /// The answer to `attempt` when the replay cache holds its key (a
    /// replay, 422 for another body or customer): no database and no task,
    /// so the API answers it where it stands. `None`: not held, it is
    /// [`Self::charge_attempt`]'s.
    pub fn replay_charge(
        &self,
        actor: &Actor,
        key: &IdempotencyKey,
        attempt: &ChargeAttempt,
    ) -> Option<Result<Reply, ChargeError>> {
        let (fingerprinted, fingerprint) = (&attempt.fingerprinted, &attempt.fingerprint);
        self.replay_cached(
            key,
            CHARGES_ROUTE,
            actor.subject(),
            fingerprinted,
            fingerprint,
        )
    }

    /// The rest of `POST /api/charges` for a prepared attempt the replay
    /// cache did not answer: claim, call the provider, finish.
    // The key is on the caller's span (the API's request span); repeating it
    // here would print it twice on every line.
    #[tracing::instrument(skip_all, fields(customer = %actor.subject()))]
    pub async fn charge_attempt(
        &self,
        actor: &Actor,
        key: &IdempotencyKey,
        attempt: ChargeAttempt,
    ) -> Result<Reply, ChargeError> {
        let mut charge = Charge::pending(actor.subject(), &attempt.request);
        charge.idempotency_key = Some(key.as_str().to_owned());
        let (fingerprinted, fingerprint) = (&attempt.fingerprinted, attempt.fingerprint);
        let operation = Operation::Charge(charge);
        self.claim_and_drive(
            actor,
            key,
            CHARGES_ROUTE,
            fingerprinted,
            fingerprint,
            operation,
        )
        .await
    }

    /// `POST /api/charges/{id}/refunds` with an idempotency key, by the
    /// back office (any customer's charge) or, with `REFUNDS_BY_CUSTOMER`,
    /// by the charge's customer. A token without `refunds:write` is denied
    /// before anything is read; a charge out of reach is not found, and
    /// one that has not succeeded cannot be refunded: no answer of these
    /// is stored (reconciliation can still settle the charge).
    #[tracing::instrument(skip_all, fields(requested_by = %actor.subject(), role = %actor.role(), charge_id = %charge_id))]
    pub async fn create_refund(
        &self,
        actor: &Actor,
        key: &IdempotencyKey,
        charge_id: &str,
        body: &Value,
    ) -> Result<Reply, ChargeError> {
        actor.may_refund()?;
        let request = RefundRequest::from_json(body, self.policy.max_amount_cents)?;
        let charge = self
            .charge(charge_id)
            .await?
            .filter(|c| actor.refunds(&c.customer_id))
            .ok_or(ChargeError::ChargeNotFound)?;
        if charge.status != ChargeStatus::Succeeded {
            return Err(ChargeError::NotRefundable(charge.status));
        }
        // The fingerprint covers the path's charge as well as the body: the
        // same key sent to refund another charge is a 422, never a replay.
        // A valid body has no field of that name.
        // So does the role: a back-office subject and a customer that share
        // a name never share a record (a customer's refunds keep the
        // fingerprint they had before roles).
        let mut fingerprinted = body.clone();
        if let Value::Object(fields) = &mut fingerprinted {
            fields.insert("charge_id".to_owned(), Value::from(charge_id));
            if actor.role() == Role::BackOffice {
                fields.insert(
                    "requested_by_role".to_owned(),
                    Value::from(Role::BackOffice.as_str()),
                );
            }
        }
        let operation = || Operation::Refund(Refund::pending(actor, &charge, &request));
        self.start(actor, key, REFUNDS_ROUTE, &fingerprinted, operation)
            .await
    }

    /// `POST /api/charges/{id}/capture` and `/cancel` with an idempotency
    /// key, by the back office (`charges:capture`). A charge out of reach is
    /// not found; one that is no hold that can be (its authorization still
    /// pending or unknown, failed, or a charge captured when made, which is
    /// a stored `charge_already_captured` from the claim) is refused
    /// without a claim. Which capture or cancel takes the hold is decided
    /// in the claim's transaction ([`crate::hold`]).
    #[tracing::instrument(skip_all, fields(requested_by = %actor.subject(), role = %actor.role(), charge_id = %charge_id, action = action.as_str()))]
    pub async fn act_on_hold(
        &self,
        actor: &Actor,
        key: &IdempotencyKey,
        charge_id: &str,
        action: HoldAction,
        body: &Value,
    ) -> Result<Reply, ChargeError> {
        actor.may_capture()?;
        let request = HoldRequest::from_json(action, body, self.policy.max_amount_cents)?;
        let charge = self
            .charge(charge_id)
            .await?
            .ok_or(ChargeError::ChargeNotFound)?;
        match charge.status {
            ChargeStatus::Pending | ChargeStatus::Unknown | ChargeStatus::Failed => {
                return Err(ChargeError::NotCapturable(charge.status));
            }
            _ => {}
        }
        let amount = match action {
            HoldAction::Capture => request.amount_of(&charge)?,
            HoldAction::Cancel => charge.amount_cents,
        };
        // The fingerprint covers the path's charge, as a refund's does.
        let mut fingerprinted = body.clone();
        if let Value::Object(fields) = &mut fingerprinted {
            fields.insert("charge_id".to_owned(), Value::from(charge_id));
        }
        let operation = || Operation::Capture(Capture::pending(actor, &charge, &request, amount));
        self.start(actor, key, action.route(), &fingerprinted, operation)
            .await
    }

    /// Charges a won claim to its customer's rate ([`crate::limits`]):
    /// only the attempt whose claim created the record gets here, so one
    /// operation costs one unit however many attempts race for its key
    /// (the others found the record: a 409, a replay or a 422). Over the
    /// rate, the claim is undone under its lease, as if the request had
    /// never come (the provider was not called), and answered 429.
    async fn admit(
        &self,
        actor: &Actor,
        route: &'static str,
        record_id: RecordId,
        lease_token: &LeaseToken,
        operation: &Operation,
    ) -> Result<(), ChargeError> {
        let Some(limit) = self.rate_limit_of(actor) else {
            return Ok(());
        };
        let Err(retry_after) = limit.admit(actor.subject()) else {
            return Ok(());
        };
        self.store.forget(record_id, lease_token, operation).await?;
        Err(self.limited(route, retry_after))
    }

    /// The rate `actor`'s new operations are admitted at: customers' or
    /// the back office's.
    fn rate_limit_of(&self, actor: &Actor) -> Option<&Arc<dyn RateLimit>> {
        match actor.role() {
            Role::Customer | Role::Provider => self.rate_limit.as_ref(),
            Role::BackOffice => self.back_office_rate_limit.as_ref(),
        }
    }

    /// The refusal of a request over its customer's rate, counted.
    fn limited(&self, route: &'static str, retry_after: Duration) -> ChargeError {
        metrics::counter!(RATE_LIMITED_TOTAL, "route" => route).increment(1);
        tracing::info!(
            route,
            retry_after_ms = retry_after.as_millis() as u64,
            "over the customer's rate; answered 429"
        );
        ChargeError::RateLimited { retry_after }
    }

    /// The complete record of (key, route), if one is held: the
    /// owner and fingerprint checks then run on it as on the stored one.
    fn remembered(&self, key: &IdempotencyKey, route: &str) -> Option<Arc<IdempotencyRecord>> {
        let answers = self.answers.as_ref()?;
        let found = answers.get(key.as_str(), route);
        let result = if found.is_some() { "hit" } else { "miss" };
        metrics::counter!(REPLAY_CACHE_TOTAL, "result" => result).increment(1);
        found
    }

    /// Keeps a copy of a complete record read by a query sent at `sent`,
    /// for as long as [`answers::lifetime`] allows.
    fn remember(&self, record: &IdempotencyRecord, sent: std::time::Instant) {
        if let (Some(answers), Some(lifetime)) = (&self.answers, answers::lifetime(record, sent)) {
            answers.insert(Arc::new(record.clone()), lifetime);
        }
    }

    /// `POST /api/charges` without a key, in `IDEMPOTENCY_KEY_MODE=optional`
    /// (rollout): served with no protection at all. A retry of this request
    /// is a second charge; an unknown outcome leaves the charge `unknown`
    /// for reconciliation, since no retry can resolve it.
    #[tracing::instrument(skip_all, fields(customer = %actor.subject()))]
    pub async fn create_unprotected_charge(
        &self,
        actor: &Actor,
        body: &Value,
    ) -> Result<Reply, ChargeError> {
        actor.may_charge()?;
        let request = ChargeRequest::from_json(body, self.policy.max_amount_cents)?;
        // Always a new operation: there is no key to have a record.
        if let Some(limit) = self.rate_limit_of(actor) {
            limit
                .admit(actor.subject())
                .map_err(|retry_after| self.limited(CHARGES_ROUTE, retry_after))?;
        }
        let charge = Charge::pending(actor.subject(), &request);
        tracing::warn!(charge_id = %charge.id, "charge without an Idempotency-Key: a retry would charge again");
        let charge = self.store.insert_charge(&charge).await?;
        let outcome = self
            .gateway
            .create_charge(&ProviderChargeRequest::from(&charge))
            .await;
        let operation = self.with_hold_expiry(Operation::Charge(charge.clone()));
        match settle(&operation, outcome) {
            Ok((outcome, response)) => {
                let event = NewEvent::answered(&operation, &outcome, &response);
                self.store.settle(&outcome, event.as_ref()).await?;
                Ok(Reply {
                    response,
                    replayed: false,
                })
            }
            Err((doubt, reason)) => {
                tracing::error!(charge_id = %charge.id, doubt = doubt.as_str(), %reason, "keyless charge outcome unknown; marked unknown for reconciliation");
                let outcome = Outcome::Charge(ChargeOutcome {
                    charge_id: charge.id.clone(),
                    status: ChargeStatus::Unknown,
                    gateway_charge_id: None,
                    decline_code: None,
                    capture_before: None,
                });
                let event = NewEvent::of(&operation, &outcome);
                self.store.settle(&outcome, event.as_ref()).await?;
                Err(ChargeError::ProviderUnavailable { doubt, reason })
            }
        }
    }
}
