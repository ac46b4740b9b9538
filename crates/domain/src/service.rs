//! The idempotency state machine (`docs/design-decisions.md` gives the why).
//!
//! 1. Claim: the record and a pending charge in one transaction; the unique
//!    index on (key, route) decides who is first.
//! 2. Existing key: other owner or body -> 422; complete -> replay; live
//!    lease -> 409; expired lease -> take over (compare-and-set) and re-drive.
//! 3. Provider call with no transaction or pooled connection held, under the
//!    provider key stored on the charge.
//! 4. Finish: charge and record in one transaction, guarded by the lease
//!    token; a loser answers with the stored response only while the record
//!    still holds its own charge, and otherwise settles its own charge row
//!    and answers 409.
//! 5. Unknown outcome: release the lease, answer 503, keep the key recoverable.
//!
//! A record claimed longer ago than the provider's key retention minus a
//! margin is never re-driven: the provider may have forgotten its key, and
//! a re-drive would be a second, real charge. It is abandoned without a
//! provider call. Every such age, lease and expiry is the database's.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::answers::{self, AnswerCache};
use crate::charge::{Charge, ChargeRequest, ChargeStatus, CustomerId, InvalidRequest};
use crate::derive::Derivation;
use crate::envelope::ErrorEnvelope;
use crate::idempotency::{
    CHARGES_ROUTE, IdempotencyKey, IdempotencyRecord, JSON, LeaseToken, REFUNDS_ROUTE, RecordId,
    RecordState, RequestFingerprint, StoredResponse,
};
use crate::limits::{RATE_LIMITED_TOTAL, RateLimit};
use crate::list::{self, ChargeQuery, Cursor, List};
use crate::provider::{
    CreatedWindow, Doubt, Expected, Gateway, Lookup, OperationKind, ProviderChargeRequest,
    ProviderOutcome, ProviderRefundRequest,
};
use crate::refund::{Refund, RefundRequest};
use crate::scope::{Actor, Denied, Role, Scope};
use crate::store::{
    ChargeOutcome, Claim, ClaimAge, ClaimOutcome, Finish, FinishOutcome, NewLease, Operation,
    Outcome, RefundOutcome, Store, StoreError, Unsettled,
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
pub const NOT_MADE: [&str; 2] = ["charge_not_made", "refund_not_made"];

/// The code of the stored 400 answer when the provider refused the request
/// itself (Stripe's `invalid_request_error`).
pub const PROVIDER_REJECTED: &str = "provider_rejected_request";

/// Allowance for the difference between the provider's clock (its
/// objects' `created`) and the database's, on each side of the window a
/// charge is looked for in the provider's list.
pub const PROVIDER_CLOCK_MARGIN: Duration = Duration::from_secs(5 * 60);

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

    /// `POST /api/charges` with an idempotency key.
    // The key is on the caller's span (the API's request span); repeating it
    // here would print it twice on every line.
    #[tracing::instrument(skip_all, fields(customer = %actor.subject()))]
    pub async fn create_charge(
        &self,
        actor: &Actor,
        key: &IdempotencyKey,
        body: &Value,
    ) -> Result<Reply, ChargeError> {
        actor.may_charge()?;
        let request = ChargeRequest::from_json(body, self.policy.max_amount_cents)?;
        let fingerprinted = request.fingerprinted(body);
        let mut charge = Charge::pending(actor.subject(), &request);
        charge.idempotency_key = Some(key.as_str().to_owned());
        let operation = Operation::Charge(charge);
        self.start(actor, key, CHARGES_ROUTE, &fingerprinted, operation)
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
        let operation = Operation::Refund(Refund::pending(actor, &charge, &request));
        self.start(actor, key, REFUNDS_ROUTE, &fingerprinted, operation)
            .await
    }

    /// Steps 1 and 2 for any operation: claim the key with the pending
    /// operation, then drive it, or answer from the record someone else has.
    /// `fingerprinted` is what the request's fingerprint is taken over: the
    /// body in its canonical form, with the path's charge for a refund.
    async fn start(
        &self,
        actor: &Actor,
        key: &IdempotencyKey,
        route: &'static str,
        fingerprinted: &Value,
        operation: Operation,
    ) -> Result<Reply, ChargeError> {
        let customer = actor.subject();
        let fingerprint = RequestFingerprint::of(fingerprinted);
        let mut claim = Claim {
            key: key.clone(),
            route,
            customer: customer.clone(),
            fingerprint,
            lease: NewLease::new(self.policy.lease),
            ttl: self.policy.ttl,
            operation,
            read_first: true,
        };
        if let Some(record) = self.remembered(key, route) {
            return self
                .resume(record, customer, fingerprinted, &fingerprint)
                .await;
        }
        let sent = std::time::Instant::now();
        let mut generation = 0;
        claim.derive(&self.policy.derivation, generation);
        loop {
            match self.store.claim(&claim).await? {
                // The key was used before, by an operation whose record
                // has expired: this is a new one, of the first generation
                // not made yet.
                ClaimOutcome::GenerationTaken => {
                    generation = self.first_free_generation(&mut claim, generation).await?;
                    tracing::debug!(generation, "a key reused after its record expired");
                }
                ClaimOutcome::Claimed {
                    record_id,
                    operation,
                } => {
                    tracing::debug!(%record_id, operation = operation.id(), "claimed");
                    self.admit(actor, route, record_id, &claim.lease.token, &operation)
                        .await?;
                    return self
                        .drive(
                            record_id,
                            &claim.lease.token,
                            *operation,
                            OnUnknown::ReleaseLease,
                        )
                        .await;
                }
                ClaimOutcome::Existing(record) => {
                    self.remember(&record, sent);
                    return self
                        .resume(*record, customer, fingerprinted, &fingerprint)
                        .await;
                }
                ClaimOutcome::Refused(response) => {
                    metrics::counter!(REFUNDS_TOTAL, "outcome" => "exceeds_charge").increment(1);
                    tracing::info!(status = response.status, "refund does not fit; stored");
                    return Ok(Reply {
                        response,
                        replayed: false,
                    });
                }
            }
        }
    }

    /// The first generation after `taken` whose operation was not made
    /// (its derived id is no charge or refund yet), the claim derived for it.
    async fn first_free_generation(
        &self,
        claim: &mut Claim,
        taken: u32,
    ) -> Result<u32, StoreError> {
        for generation in taken + 1..MAX_GENERATIONS {
            claim.derive(&self.policy.derivation, generation);
            let operation = &claim.operation;
            if !self.is_a_row(operation.kind(), operation.id()).await? {
                return Ok(generation);
            }
        }
        Err(StoreError::Invariant(format!(
            "idempotency key {:?} has {MAX_GENERATIONS} generations on {}",
            claim.key, claim.route
        )))
    }

    /// Whether our charge (or refund) `id` has its row.
    async fn is_a_row(&self, kind: OperationKind, id: &str) -> Result<bool, StoreError> {
        Ok(match kind {
            OperationKind::Charge => self.store.charge(id).await?.is_some(),
            OperationKind::Refund => self.store.refund(id).await?.is_some(),
        })
    }

    /// Finds orphans: charges and refunds the provider made within the
    /// last `window` (up to `lag` ago, by the database's clock) that name
    /// one of our operations, which has no row here. Money moved with no
    /// record of it: a database that lost its last writes, and a client
    /// that never came back with its key. Each is recorded (and logged
    /// `ORPHAN`) once; it is settled when its operation has a row again
    /// (its client's retry adopted the provider's object). Operations
    /// younger than `lag` are left alone: their client may be retrying.
    /// With `apply` false, nothing is written (a dry run logs what it
    /// would record).
    pub async fn find_orphans(
        &self,
        window: Duration,
        lag: Duration,
        apply: bool,
    ) -> Result<OrphanReport, StoreError> {
        let now = self.store.now().await?.timestamp();
        let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        let created = CreatedWindow {
            from: now.saturating_sub(seconds(window)),
            to: now.saturating_sub(seconds(lag)),
        };
        let mut report = OrphanReport::default();
        if created.to < created.from {
            return Ok(report);
        }
        for kind in [OperationKind::Charge, OperationKind::Refund] {
            let objects = match self.gateway.list_ours(kind, created).await {
                Ok(objects) => objects,
                Err(reason) => {
                    tracing::warn!(kind = kind.as_str(), %reason, "orphan search: the provider's list could not be read");
                    report.lookup_failed += 1;
                    continue;
                }
            };
            for object in objects {
                report.seen += 1;
                let known = self.is_a_row(kind, &object.operation_id).await?;
                if known || (apply && !self.store.record_orphan(&object).await?) {
                    continue;
                }
                report.new += 1;
                tracing::error!(
                    kind = kind.as_str(),
                    provider_id = %object.provider_id,
                    operation_id = %object.operation_id,
                    amount_cents = object.amount_cents,
                    currency = %object.currency,
                    status = %object.status,
                    provider_created = object.created,
                    dry_run = !apply,
                    "ORPHAN: the provider made this {} for one of our operations, which has no row \
                     here; adopt it (its client retries with its key) or refund it \
                     (docs/operations.md)",
                    kind.as_str()
                );
            }
        }
        if apply {
            report.settled = self.store.settle_orphans().await?;
        }
        let open = self.store.open_orphans(MAX_OPEN_ORPHANS).await?;
        report.open = open.len() as u64;
        for kind in [OperationKind::Charge, OperationKind::Refund] {
            let n = open.iter().filter(|o| o.object.kind == kind).count();
            metrics::gauge!(ORPHANS, "kind" => kind.as_str()).set(n as f64);
        }
        Ok(report)
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
            Role::Customer => self.rate_limit.as_ref(),
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

    /// A copy of the complete record of (key, route), if one is held: the
    /// owner and fingerprint checks then run on it as on the stored one.
    fn remembered(&self, key: &IdempotencyKey, route: &str) -> Option<IdempotencyRecord> {
        let answers = self.answers.as_ref()?;
        let found = answers.get(key.as_str(), route);
        let result = if found.is_some() { "hit" } else { "miss" };
        metrics::counter!(REPLAY_CACHE_TOTAL, "result" => result).increment(1);
        found.map(|record| (*record).clone())
    }

    /// Keeps a copy of a complete record read by a query sent at `sent`,
    /// for as long as [`answers::lifetime`] allows.
    fn remember(&self, record: &IdempotencyRecord, sent: std::time::Instant) {
        if let (Some(answers), Some(lifetime)) = (&self.answers, answers::lifetime(record, sent)) {
            answers.insert(Arc::new(record.clone()), lifetime);
        }
    }

    /// The charge `charge_id`, whoever's it is.
    async fn charge(&self, charge_id: &str) -> Result<Option<Charge>, StoreError> {
        // An id no charge can have is not looked up.
        if !crate::charge::is_charge_id(charge_id) {
            return Ok(None);
        }
        self.store.charge(charge_id).await
    }

    /// The charge, if `actor` may read it: its own, or any with
    /// `charges:read_all`; `None` also for a charge out of reach.
    pub async fn charge_for(
        &self,
        actor: &Actor,
        charge_id: &str,
    ) -> Result<Option<Charge>, ChargeError> {
        actor.may_read()?;
        Ok(self
            .charge(charge_id)
            .await?
            .filter(|c| actor.reads(&c.customer_id)))
    }

    /// `GET /api/charges`: a page of the caller's charges; with
    /// `charges:read_all`, of the customer `customer=` names, or without
    /// it of every customer. A cursor must name a charge of that list.
    pub async fn list_charges(
        &self,
        actor: &Actor,
        query: &[(String, String)],
    ) -> Result<List<Charge>, ChargeError> {
        actor.may_read()?;
        // Authorisation first: a token that may not name a customer is
        // told so before anything about its query.
        if !actor.reads_all() && query.iter().any(|(name, _)| name == "customer") {
            return Err(Denied(Scope::ChargesReadAll).into());
        }
        let query = ChargeQuery::parse(query)?;
        let owner = match (&query.customer, actor.reads_all()) {
            (Some(customer), true) => Some(customer),
            (Some(_), false) => return Err(Denied(Scope::ChargesReadAll).into()),
            (None, true) => None,
            (None, false) => Some(actor.subject()),
        };
        if let Some(cursor) = &query.page.cursor
            && self
                .charge(cursor.id())
                .await?
                .is_none_or(|c| owner.is_some_and(|o| c.customer_id != o.as_str()))
        {
            return Err(no_such(cursor, "charge").into());
        }
        let rows = self.store.list_charges(owner, &query).await?;
        Ok(List::from_rows(
            rows,
            &query.page,
            "/api/charges".to_owned(),
        ))
    }

    /// `GET /api/charges/{id}/refunds`: a page of a readable charge's
    /// refunds; a charge out of reach is not found.
    pub async fn list_refunds(
        &self,
        actor: &Actor,
        charge_id: &str,
        query: &[(String, String)],
    ) -> Result<List<Refund>, ChargeError> {
        let page = list::parse_page(query)?;
        let charge = self
            .charge_for(actor, charge_id)
            .await?
            .ok_or(ChargeError::ChargeNotFound)?;
        if let Some(cursor) = &page.cursor {
            let refund = self.store.refund(cursor.id()).await?;
            if refund.is_none_or(|r| r.charge_id != charge.id) {
                return Err(no_such(cursor, "refund of this charge").into());
            }
        }
        let rows = self.store.list_refunds(&charge.id, &page).await?;
        let url = format!("{}/refunds", charge.location());
        Ok(List::from_rows(rows, &page, url))
    }

    /// The refund, if `actor` may read it (as its charge); `None` also
    /// for a refund out of reach.
    pub async fn refund_for(
        &self,
        actor: &Actor,
        refund_id: &str,
    ) -> Result<Option<Refund>, ChargeError> {
        actor.may_read()?;
        if !crate::charge::is_refund_id(refund_id) {
            return Ok(None);
        }
        Ok(self
            .store
            .refund(refund_id)
            .await?
            .filter(|r| actor.reads(&r.customer_id)))
    }

    /// Step 2: someone already has this key.
    async fn resume(
        &self,
        record: IdempotencyRecord,
        customer: &CustomerId,
        body: &Value,
        fingerprint: &RequestFingerprint,
    ) -> Result<Reply, ChargeError> {
        // Records written before the fingerprint ignored null optional
        // fields hold the first version: a retry across the upgrade still
        // matches. Each comparison runs in constant time; the first version
        // is hashed only when it differs from the current one (the body has
        // `null` fields), which depends on the caller's own body alone.
        let current = record.matches(customer.as_str(), fingerprint);
        let first = if RequestFingerprint::drops_nulls(body) {
            record.matches(customer.as_str(), &RequestFingerprint::of_v1(body))
        } else {
            current
        };
        if !(current | first) {
            tracing::info!(
                record_id = %record.id,
                "key reused with another body or customer"
            );
            return Err(ChargeError::KeyReused);
        }
        match (record.state, &record.response) {
            (state, Some(response)) if state.is_answered() => {
                tracing::debug!(record_id = %record.id, status = response.status, "replay");
                Ok(Reply {
                    response: response.clone(),
                    replayed: true,
                })
            }
            (state, _) if state.is_answered() => Err(StoreError::Invariant(format!(
                "answered record {} has no stored response",
                record.id
            ))
            .into()),
            _ if record.lease_live => Err(ChargeError::InProgress),
            _ => self.take_over(&record).await,
        }
    }

    /// An in-progress record whose lease expired (its driver crashed, or
    /// released it on an unknown outcome): take it over and re-drive it, or,
    /// when it was claimed too long ago for the provider to remember its key,
    /// take it over only to abandon it. Both are compare-and-sets with the
    /// age guard in the statement; losing either means another driver has it.
    async fn take_over(&self, record: &IdempotencyRecord) -> Result<Reply, ChargeError> {
        // An in-progress record always has a token (release keeps it); one
        // without can match no compare-and-set, so another driver has it.
        let Some(expected) = record.lease.as_ref().map(|l| &l.token) else {
            return Err(ChargeError::InProgress);
        };
        let lease = NewLease::new(self.policy.lease);
        let limit = self.policy.redrive_limit;
        if self
            .store
            .take_over(record.id, expected, &lease, ClaimAge::Under(limit))
            .await?
        {
            metrics::counter!(LEASE_TAKEOVERS_TOTAL).increment(1);
            let operation = self.store.operation(record).await?;
            tracing::info!(record_id = %record.id, operation = operation.id(), "took over expired lease; re-driving");
            self.store.provider_called(&operation).await?;
            return self
                .drive(record.id, &lease.token, operation, OnUnknown::ReleaseLease)
                .await;
        }
        // Only a record the database already measured as that old is worth
        // the second attempt; the statement checks the age again.
        if record.age >= limit
            && self
                .store
                .take_over(record.id, expected, &lease, ClaimAge::AtLeast(limit))
                .await?
        {
            let operation = self.store.operation(record).await?;
            log_abandoned(
                record.id,
                &operation,
                None,
                "past the provider's key retention",
                "claimed longer ago than the provider's key retention allows a re-drive; marked \
                 unknown, reconcile it with the provider",
            );
            metrics::counter!(ABANDONED_TOTAL, "reason" => "key_retention").increment(1);
            return self
                .abandon(
                    record.id,
                    &lease.token,
                    &operation,
                    "past the provider's key retention",
                )
                .await;
        }
        // Another retry or the reaper took it first.
        Err(ChargeError::InProgress)
    }

    /// Steps 3-5: call the provider with no database resource held, then
    /// finish under the lease; on an unknown outcome, `on_unknown` says
    /// whether the lease ends now. Used by the API and by the reaper.
    pub async fn drive(
        &self,
        record_id: RecordId,
        lease_token: &LeaseToken,
        operation: Operation,
        on_unknown: OnUnknown,
    ) -> Result<Reply, ChargeError> {
        let outcome = match &operation {
            Operation::Charge(charge) => {
                let request = ProviderChargeRequest::from(charge);
                self.gateway.create_charge(&request).await
            }
            Operation::Refund(refund) => match ProviderRefundRequest::of(refund) {
                Some(request) => self.gateway.create_refund(&request).await,
                // A succeeded charge always has the provider's id.
                None => ProviderOutcome::Declined {
                    code: "charge_not_at_provider".to_owned(),
                    decline_code: None,
                    message: "the charge has no provider id to refund".to_owned(),
                    provider_id: None,
                },
            },
        };
        let (outcome, response) = match settle(&operation, outcome) {
            Ok(settled) => settled,
            // The provider answers this key the same way to every call (an
            // object that does not match the operation, or an error it saved
            // under the key): no re-drive can learn more, so it is abandoned
            // now, for reconciliation (and, for a mismatch, a person).
            Err((doubt @ (Doubt::Mismatch | Doubt::ReplayedError), reason)) => {
                let why = match doubt {
                    Doubt::Mismatch => "provider_mismatch",
                    _ => "replayed_error",
                };
                log_abandoned(
                    record_id,
                    &operation,
                    Some(doubt.as_str()),
                    &reason,
                    "the provider answers this operation's key the same way to every call (an \
                     answer that does not match it, or an error it saved); no re-drive can learn \
                     more, marked unknown for reconciliation",
                );
                metrics::counter!(ABANDONED_TOTAL, "reason" => why).increment(1);
                return self
                    .abandon(record_id, lease_token, &operation, &reason)
                    .await;
            }
            // The provider holds this key's operation with other
            // parameters: the client changed its body after we lost our
            // record of its first request. This request made nothing; its
            // claim is undone so that the first body's retry derives the
            // same operation again and adopts what the provider made.
            Err((Doubt::KeyReused, reason)) => {
                tracing::warn!(
                    %record_id,
                    operation = operation.id(),
                    %reason,
                    "the provider holds this key's operation with other parameters; the claim \
                     is undone and answered 422 (reconcile finds the provider's operation)"
                );
                self.store
                    .forget(record_id, lease_token, &operation)
                    .await?;
                return Err(ChargeError::KeyReused);
            }
            Err((doubt, reason)) => {
                tracing::warn!(%record_id, operation = operation.id(), doubt = doubt.as_str(), %reason, ?on_unknown, "provider outcome unknown");
                if on_unknown == OnUnknown::ReleaseLease {
                    self.store.release(record_id, lease_token).await?;
                }
                if doubt == Doubt::InFlight {
                    // The provider is still working on our key now: its
                    // search lag restarts from this answer. Failing that,
                    // it runs from this call's send, stamped before it,
                    // which GATEWAY_TIMEOUT in the lag covers.
                    if let Err(e) = self.store.provider_called(&operation).await {
                        tracing::warn!(%record_id, operation = operation.id(), error = %e, "stamping the in-flight answer failed");
                    }
                }
                return Err(ChargeError::ProviderUnavailable { doubt, reason });
            }
        };
        let finish = Finish {
            record_id,
            lease_token: lease_token.clone(),
            state: RecordState::Complete,
            outcome,
            response,
        };
        self.complete(finish).await
    }

    /// Gives up on a request whose provider outcome is unknown: the record
    /// becomes `abandoned` with the answer `500 request_abandoned` (replayed
    /// to the client, never reclaimed nor pruned) and the charge `unknown`,
    /// for reconciliation against the provider's records. Under the lease,
    /// like any finish.
    pub async fn abandon(
        &self,
        record_id: RecordId,
        lease_token: &LeaseToken,
        operation: &Operation,
        reason: &str,
    ) -> Result<Reply, ChargeError> {
        tracing::debug!(%record_id, operation = operation.id(), reason, "abandoning");
        let mut envelope = ErrorEnvelope::new(
            ABANDONED,
            "the payment provider's outcome could not be determined; the operation is \
             being reconciled, do not retry it with a new key",
        );
        let outcome = match operation {
            Operation::Charge(charge) => {
                envelope.error.charge_id = Some(charge.id.clone());
                Outcome::Charge(ChargeOutcome {
                    charge_id: charge.id.clone(),
                    status: ChargeStatus::Unknown,
                    gateway_charge_id: None,
                    decline_code: None,
                })
            }
            Operation::Refund(refund) => {
                envelope.error.charge_id = Some(refund.charge_id.clone());
                envelope.error.refund_id = Some(refund.id.clone());
                Outcome::Refund(refund_outcome(refund, ChargeStatus::Unknown))
            }
        };
        let finish = Finish {
            record_id,
            lease_token: lease_token.clone(),
            state: RecordState::Abandoned,
            outcome,
            response: StoredResponse {
                status: 500,
                body: envelope.to_json(),
                content_type: JSON.to_owned(),
                location: None,
            },
        };
        self.complete(finish).await
    }

    /// Step 4: the guarded finish. A loser answers from the record only
    /// while it still holds the loser's own charge (another driver of the
    /// same operation finished it). Otherwise the record has moved on, to a
    /// new operation after a TTL reclaim, possibly another customer's: the
    /// loser settles its own charge row with the outcome it holds (the
    /// money moved or it did not) and answers 409, never that operation's
    /// response.
    async fn complete(&self, finish: Finish) -> Result<Reply, ChargeError> {
        let record_id = finish.record_id;
        let operation_id = finish.outcome.id();
        match self.store.finish(&finish).await? {
            FinishOutcome::Finished => {
                if let Outcome::Refund(refund) = &finish.outcome {
                    let outcome = refund.status.as_str();
                    metrics::counter!(REFUNDS_TOTAL, "outcome" => outcome).increment(1);
                }
                tracing::info!(%record_id, operation = operation_id, status = finish.response.status, state = finish.state.as_str(), "finished");
                Ok(Reply {
                    response: finish.response,
                    replayed: false,
                })
            }
            FinishOutcome::Lost => match self.store.record(record_id).await? {
                Some(
                    ref record @ IdempotencyRecord {
                        state,
                        response: Some(ref response),
                        ..
                    },
                ) if state.is_answered() && record.operation_id() == operation_id => {
                    tracing::info!(
                        %record_id,
                        operation = operation_id,
                        "another driver finished this operation first; answering with its response"
                    );
                    Ok(Reply {
                        response: response.clone(),
                        replayed: true,
                    })
                }
                Some(ref record) if record.operation_id() == operation_id => {
                    tracing::info!(
                        %record_id,
                        operation = operation_id,
                        "another driver holds this operation; leaving it to that driver"
                    );
                    Err(ChargeError::InProgress)
                }
                other => {
                    let settled = self.store.settle(&finish.outcome).await?;
                    tracing::warn!(
                        %record_id,
                        operation = operation_id,
                        now_holds = ?other.as_ref().map(IdempotencyRecord::operation_id),
                        status = finish.outcome.status().as_str(),
                        settled,
                        "lost the record to another operation; settled this one on its own"
                    );
                    Err(ChargeError::InProgress)
                }
            },
        }
    }

    /// What the provider's records say of an operation whose outcome is
    /// unknown, looked up by the id its calls carried, or of a refund the
    /// provider answered `pending`, by the provider's id; changes nothing.
    pub async fn reconciliation(&self, unsettled: &Unsettled) -> Decision {
        let lookup = match &unsettled.operation {
            Operation::Charge(charge) => {
                let expected = Expected::of_charge(charge);
                self.gateway.find_charge(&charge.id, &expected).await
            }
            // A refund the provider answered `pending` has its id: polled by
            // it. Not finding an id the provider gave is never "not made".
            Operation::Refund(
                refund @ Refund {
                    status: ChargeStatus::Pending,
                    gateway_refund_id: Some(id),
                    ..
                },
            ) => match self
                .gateway
                .retrieve_refund(id, &Expected::of_refund(refund))
                .await
            {
                Lookup::NotFound => Lookup::Unknown {
                    reason: format!(
                        "the provider does not know its refund {id}, which it answered pending"
                    ),
                },
                found => found,
            },
            Operation::Refund(refund) => match &refund.gateway_charge_id {
                Some(charge) => {
                    let expected = Expected::of_refund(refund);
                    self.gateway
                        .find_refund(charge, &refund.id, &expected)
                        .await
                }
                None => Lookup::NotFound,
            },
        };
        match lookup {
            Lookup::Found(ProviderOutcome::Pending { .. }) => Decision::Pending,
            Lookup::Found(found) => match settle(&unsettled.operation, found) {
                Ok((outcome, answer)) => Decision::Settle { outcome, answer },
                Err((_, reason)) => Decision::LookupFailed(reason),
            },
            Lookup::Unknown { reason } => Decision::LookupFailed(reason),
            Lookup::NotFound => match unsettled.lag_passed {
                None => Decision::NeedsPerson,
                Some(false) => Decision::Lagging,
                Some(true) => self.confirmed_not_made(&unsettled.operation).await,
            },
        }
    }

    /// A charge Search does not show, its lag past, is looked for once more
    /// in the provider's charge list (Search can lag by far more than its
    /// usual minute during an outage), among the charges created from its
    /// first call to when the provider could last have acted on its last
    /// one, with a clock margin each side. Only a whole read that does not
    /// find it concludes "not made". A refund's lookup is already a list.
    async fn confirmed_not_made(&self, operation: &Operation) -> Decision {
        let Operation::Charge(charge) = operation else {
            return not_made(operation);
        };
        let margin = chrono::Duration::from_std(PROVIDER_CLOCK_MARGIN).unwrap_or_default();
        let acts_within = chrono::Duration::from_std(self.policy.provider_acts_within)
            .unwrap_or(chrono::Duration::MAX);
        // The last provider call was sent before the charge was last
        // written (made unknown).
        let latest = charge
            .updated_at
            .checked_add_signed(acts_within)
            .and_then(|t| t.checked_add_signed(margin))
            .map_or(i64::MAX, |t| t.timestamp().saturating_add(1));
        let created = CreatedWindow {
            from: charge
                .created_at
                .checked_sub_signed(margin)
                .map_or(0, |t| t.timestamp()),
            to: latest,
        };
        let expected = Expected::of_charge(charge);
        match self
            .gateway
            .find_charge_listed(&charge.id, created, &expected)
            .await
        {
            Lookup::NotFound => not_made(operation),
            Lookup::Found(found) => match settle(operation, found) {
                Ok((outcome, answer)) => Decision::Settle { outcome, answer },
                Err((_, reason)) => Decision::LookupFailed(reason),
            },
            Lookup::Unknown { reason } => Decision::LookupFailed(format!(
                "Search does not show it, and the charge list could not confirm that: {reason}"
            )),
        }
    }

    /// Looks the operation up and, when the provider's records decide it,
    /// settles it and replaces its abandoned answer (kept a TTL from now);
    /// otherwise stamps it as looked at, so the next passes read the others
    /// first. The decision, and whether this caller applied it (false:
    /// another reconciler settled the operation first, or there was nothing
    /// to do).
    pub async fn reconcile(&self, unsettled: &Unsettled) -> Result<(Decision, bool), StoreError> {
        let decision = self.reconciliation(unsettled).await;
        let applied = match &decision {
            Decision::Settle { outcome, answer } => {
                self.store
                    .reconcile(outcome, answer, self.policy.ttl)
                    .await?
            }
            _ => {
                self.store.looked_at(&unsettled.operation).await?;
                false
            }
        };
        let operation = match unsettled.operation {
            Operation::Charge(_) => "charge",
            Operation::Refund(_) => "refund",
        };
        let label = decision.label();
        if applied || !matches!(decision, Decision::Settle { .. }) {
            metrics::counter!(RECONCILED_TOTAL, "operation" => operation, "outcome" => label)
                .increment(1);
        }
        match &decision {
            Decision::Settle { .. } if applied => tracing::warn!(
                operation = unsettled.operation.id(),
                outcome = label,
                "RECONCILED: settled from the provider's records; its abandoned answer replaced"
            ),
            Decision::Settle { .. } => tracing::info!(
                operation = unsettled.operation.id(),
                "already settled by another reconciler"
            ),
            Decision::NeedsPerson => tracing::error!(
                operation = unsettled.operation.id(),
                "NEEDS A PERSON: outcome unknown and its provider calls carried no id to find it by"
            ),
            Decision::LookupFailed(reason) => tracing::warn!(
                operation = unsettled.operation.id(),
                %reason,
                "reconciliation lookup failed; left for the next pass"
            ),
            Decision::Lagging => tracing::info!(
                operation = unsettled.operation.id(),
                "not found yet, within the search lag; left for the next pass"
            ),
            Decision::Pending => tracing::info!(
                operation = unsettled.operation.id(),
                "still pending at the provider; left for the next pass"
            ),
        }
        Ok((decision, applied))
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
        match settle(&Operation::Charge(charge.clone()), outcome) {
            Ok((outcome, response)) => {
                self.store.settle(&outcome).await?;
                Ok(Reply {
                    response,
                    replayed: false,
                })
            }
            Err((doubt, reason)) => {
                tracing::error!(charge_id = %charge.id, doubt = doubt.as_str(), %reason, "keyless charge outcome unknown; marked unknown for reconciliation");
                self.store
                    .settle(&Outcome::Charge(ChargeOutcome {
                        charge_id: charge.id.clone(),
                        status: ChargeStatus::Unknown,
                        gateway_charge_id: None,
                        decline_code: None,
                    }))
                    .await?;
                Err(ChargeError::ProviderUnavailable { doubt, reason })
            }
        }
    }
}

/// An operation the provider has no record of, its search lag past:
/// nothing moved. Failed, with `charge_not_made` or `refund_not_made`
/// (a refund's reservation is released), and the answer 502 saying so: a
/// new request with a new key may be made.
fn not_made(operation: &Operation) -> Decision {
    let message = "the payment provider has no record of this operation: nothing was \
                   charged or refunded, and a new request with a new idempotency key may be made";
    let (outcome, mut envelope) = match operation {
        Operation::Charge(charge) => {
            let mut envelope = ErrorEnvelope::new(NOT_MADE[0], message);
            envelope.error.charge_id = Some(charge.id.clone());
            let outcome = Outcome::Charge(ChargeOutcome {
                charge_id: charge.id.clone(),
                status: ChargeStatus::Failed,
                gateway_charge_id: None,
                decline_code: Some(NOT_MADE[0].to_owned()),
            });
            (outcome, envelope)
        }
        Operation::Refund(refund) => {
            let mut envelope = ErrorEnvelope::new(NOT_MADE[1], message);
            envelope.error.refund_id = Some(refund.id.clone());
            let mut outcome = refund_outcome(refund, ChargeStatus::Failed);
            outcome.failure_code = Some(NOT_MADE[1].to_owned());
            (Outcome::Refund(outcome), envelope)
        }
    };
    if let Outcome::Refund(o) = &outcome {
        envelope.error.charge_id = Some(o.charge_id.clone());
    }
    let answer = StoredResponse {
        status: 502,
        body: envelope.to_json(),
        content_type: JSON.to_owned(),
        location: None,
    };
    Decision::Settle { outcome, answer }
}

/// A cursor that names no object the caller may page from.
fn no_such(cursor: &Cursor, what: &str) -> InvalidRequest {
    InvalidRequest {
        param: Some(cursor.param().to_owned()),
        message: format!("no such {what}: {:?}", cursor.id()),
    }
}

/// A final provider answer as the operation's new state and the stored
/// response: a charge's 201 or 402 `card_declined`, a refund's 201 (also
/// when the provider answered it `pending`) or 402 `refund_failed`, a
/// charge's 400 `provider_rejected_request`; `Err` with the doubt and the
/// reason when the outcome is unknown.
fn settle(
    operation: &Operation,
    outcome: ProviderOutcome,
) -> Result<(Outcome, StoredResponse), (Doubt, String)> {
    match operation {
        Operation::Charge(charge) => settle_charge(charge, outcome),
        Operation::Refund(refund) => settle_refund(refund, outcome),
    }
}

fn settle_charge(
    charge: &Charge,
    outcome: ProviderOutcome,
) -> Result<(Outcome, StoredResponse), (Doubt, String)> {
    // A card charge is final when the provider answers; one it calls
    // pending is in doubt, re-driven and reconciled like any other.
    if let ProviderOutcome::Pending { provider_id } = &outcome {
        let reason = format!("the provider's charge {provider_id} is pending, not final");
        return Err((Doubt::ProviderError, reason));
    }
    let mut charge = charge.clone();
    let final_ = Final::of(outcome)?;
    charge.status = final_.status;
    charge.gateway_charge_id = final_.provider_id;
    let response = match final_.refusal {
        None => created(charge.to_json(), charge.location()),
        Some(Refusal::Declined { code, message }) => {
            charge.decline_code = Some(code);
            let mut envelope = ErrorEnvelope::new("card_declined", message);
            envelope.error.decline_code = charge.decline_code.clone();
            envelope.error.charge_id = Some(charge.id.clone());
            refused(&envelope)
        }
        Some(Refusal::Rejected { code, message }) => {
            charge.decline_code = Some(code.clone());
            rejected(code, &message, &charge.id)
        }
    };
    let outcome = Outcome::Charge(ChargeOutcome {
        charge_id: charge.id,
        status: charge.status,
        gateway_charge_id: charge.gateway_charge_id,
        decline_code: charge.decline_code,
    });
    Ok((outcome, response))
}

fn settle_refund(
    refund: &Refund,
    outcome: ProviderOutcome,
) -> Result<(Outcome, StoredResponse), (Doubt, String)> {
    let mut refund = refund.clone();
    let final_ = Final::of(outcome)?;
    refund.status = final_.status;
    refund.gateway_refund_id = final_.provider_id;
    let response = match final_.refusal {
        None => created(refund.to_json(), refund.location()),
        // A refund the provider refuses outright (`charge_already_refunded`)
        // or fails is the same answer to the caller: the refund failed,
        // with the provider's reason. Neither says anything about a card.
        Some(Refusal::Declined { code, message } | Refusal::Rejected { code, message }) => {
            refund.failure_code = Some(code);
            let mut envelope = ErrorEnvelope::new("refund_failed", message);
            envelope.error.decline_code = refund.failure_code.clone();
            envelope.error.charge_id = Some(refund.charge_id.clone());
            envelope.error.refund_id = Some(refund.id.clone());
            refused(&envelope)
        }
    };
    let status = refund.status;
    Ok((Outcome::Refund(refund_outcome(&refund, status)), response))
}

/// A final provider answer, whichever operation it answers: the status, the
/// provider's id, and for a refusal its kind, code and message.
struct Final {
    status: ChargeStatus,
    provider_id: Option<String>,
    refusal: Option<Refusal>,
}

/// Why a final answer is not a success.
enum Refusal {
    /// The card was declined or the refund failed: the decline code, else
    /// the error code.
    Declined { code: String, message: String },
    /// The provider refused the request itself: its error code.
    Rejected { code: String, message: String },
}

impl Final {
    /// `Err` with the doubt and the reason when the outcome is unknown.
    fn of(outcome: ProviderOutcome) -> Result<Self, (Doubt, String)> {
        Ok(match outcome {
            ProviderOutcome::Succeeded { provider_id } => Self {
                status: ChargeStatus::Succeeded,
                provider_id: Some(provider_id),
                refusal: None,
            },
            ProviderOutcome::Declined {
                code,
                decline_code,
                message,
                provider_id,
            } => Self {
                status: ChargeStatus::Failed,
                provider_id,
                refusal: Some(Refusal::Declined {
                    code: decline_code.unwrap_or(code),
                    message,
                }),
            },
            ProviderOutcome::Rejected { code, message } => Self {
                status: ChargeStatus::Failed,
                provider_id: None,
                refusal: Some(Refusal::Rejected { code, message }),
            },
            // Accepted: answered 201 `pending`, its amount still reserved.
            ProviderOutcome::Pending { provider_id } => Self {
                status: ChargeStatus::Pending,
                provider_id: Some(provider_id),
                refusal: None,
            },
            ProviderOutcome::Unknown { doubt, reason } => return Err((doubt, reason)),
        })
    }
}

/// A refund's outcome as its row will record it.
fn refund_outcome(refund: &Refund, status: ChargeStatus) -> RefundOutcome {
    RefundOutcome {
        refund_id: refund.id.clone(),
        charge_id: refund.charge_id.clone(),
        amount_cents: refund.amount_cents,
        status,
        gateway_refund_id: refund.gateway_refund_id.clone(),
        failure_code: refund.failure_code.clone(),
    }
}

/// 201 with the created object and where to read it back.
fn created(body: String, location: String) -> StoredResponse {
    StoredResponse {
        status: 201,
        body,
        content_type: JSON.to_owned(),
        location: Some(location),
    }
}

/// 400 `provider_rejected_request`: the provider refused the charge request
/// itself (its `code`, e.g. `resource_missing`, and its message). Final and
/// stored: the same call would get the same answer, and nothing was made.
/// A 4xx, because what the provider refused is the request the client sent
/// (a card token it does not know): every client already treats a 400 as
/// final, where a 5xx would be retried into replays of the same answer.
fn rejected(code: String, message: &str, charge_id: &str) -> StoredResponse {
    let mut envelope = ErrorEnvelope::new(
        PROVIDER_REJECTED,
        format!(
            "the payment provider rejected the request: {}. Nothing was charged; fix the \
             request and send it with a new idempotency key",
            message.trim_end_matches('.')
        ),
    );
    envelope.error.provider_code = Some(code);
    envelope.error.charge_id = Some(charge_id.to_owned());
    StoredResponse {
        status: 400,
        body: envelope.to_json(),
        content_type: JSON.to_owned(),
        location: None,
    }
}

/// 402: the provider refused the operation.
fn refused(envelope: &ErrorEnvelope) -> StoredResponse {
    StoredResponse {
        status: 402,
        body: envelope.to_json(),
        content_type: JSON.to_owned(),
        location: None,
    }
}

/// The one `ABANDONED:` log line (error), whoever abandons: what reconciling
/// the operation by hand needs, in fields of their own (the provider key to
/// search the provider by, the amount and currency to match its object).
/// `what` follows `ABANDONED: ` in the message.
pub fn log_abandoned(
    record_id: RecordId,
    operation: &Operation,
    doubt: Option<&str>,
    reason: &str,
    what: &str,
) {
    let (customer_id, provider_key, amount_cents, currency) = match operation {
        Operation::Charge(c) => (&c.customer_id, &c.provider_key, c.amount_cents, &c.currency),
        Operation::Refund(r) => (&r.customer_id, &r.provider_key, r.amount_cents, &r.currency),
    };
    tracing::error!(
        %record_id,
        operation = operation.id(),
        kind = operation.kind().as_str(),
        customer_id = %customer_id,
        provider_key = %provider_key,
        amount_cents,
        currency = %currency,
        doubt,
        reason,
        "ABANDONED: {what}"
    );
}
