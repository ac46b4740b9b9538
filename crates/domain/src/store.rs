//! The `Store` port: what the charge service needs from persistence. The
//! backends (SQLite, PostgreSQL, MySQL/MariaDB) live in the `payments-store`
//! crate; `docs/architecture.md` says where each one differs.
//!
//! Time is the database's. No method takes the caller's `now`: every
//! comparison that decides who owns a record or whether it still exists
//! (lease expiry, takeover, TTL reclaim, the reaper's and the pruner's
//! choices) is made in SQL against the database's clock, and every stored
//! time is computed there when the row is written. Application hosts'
//! clocks differ; they never decide. Tests move time by ageing rows.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::charge::{Charge, ChargeStatus, CustomerId};
use crate::derive::Derivation;
use crate::events::{Event, EventQuery, NewEvent};
use crate::hold::{Capture, HoldAction};
use crate::idempotency::{
    IdempotencyKey, IdempotencyRecord, LeaseToken, RecordId, RecordState, RequestFingerprint,
    StoredResponse,
};
use crate::inbox::{Change, Dispute, InboxState, Local, Recorded};
use crate::list::{ChargeQuery, Page};
use crate::provider::{OperationKind, ProviderObject};
use crate::refund::{Refund, RefundStatus};
use crate::webhook::{Attempted, Delivery, DeliveryState, Endpoint};

/// A backend's error, boxed: the domain knows no database driver.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a backend can fail with. The driver's error is kept as the source
/// (and its message is part of this one's, for logs that print one line).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A unique constraint other than the claim's arbitration was violated.
    #[error("unique constraint violated: {0}")]
    Conflict(#[source] BoxError),
    /// A serialization failure or deadlock: the transaction was rolled back
    /// and may succeed if run again (the store retries it).
    #[error("transaction conflict: {0}")]
    Retryable(#[source] BoxError),
    /// The database could not be reached or dropped the connection: a
    /// retry later may succeed (the API answers 503 with `Retry-After`).
    #[error("database unavailable: {0}")]
    Unavailable(#[source] BoxError),
    /// The database is misconfigured or failed.
    #[error("database error: {0}")]
    Database(#[source] BoxError),
    /// What the database holds breaks an invariant of this program (a row
    /// the caller relies on is missing, a value cannot be decoded).
    #[error("{0}")]
    Invariant(String),
}

/// A lease to take: a fresh token, held for `duration` from the database's
/// clock at the moment the row is written, so a claim that waited for a
/// lock, or a record taken late in a reaper's pass, still gets all of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLease {
    pub token: LeaseToken,
    pub duration: Duration,
}

impl NewLease {
    pub fn new(duration: Duration) -> Self {
        Self {
            token: LeaseToken::generate(),
            duration,
        }
    }
}

/// Which in-progress records a takeover may take, by how long ago they were
/// claimed (by the database's clock). Re-drives take only records
/// `Under` the provider's key retention minus the margin; records `AtLeast`
/// that old are taken only to be abandoned, without a provider call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAge {
    Under(Duration),
    AtLeast(Duration),
}

/// What a keyed request drives: a charge, a refund of one, or a capture
/// or cancel of a hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    Charge(Charge),
    Refund(Refund),
    Capture(Capture),
}

impl Operation {
    /// The charge's, refund's or capture's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Charge(c) => &c.id,
            Self::Refund(r) => &r.id,
            Self::Capture(c) => &c.id,
        }
    }

    /// What it is, in logs and metrics: `charge`, `refund`, `capture` or
    /// `cancel`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Charge(_) => OperationKind::Charge.as_str(),
            Self::Refund(_) => OperationKind::Refund.as_str(),
            Self::Capture(c) => c.action.as_str(),
        }
    }
}

impl Claim {
    /// The claim's operation under the id and provider key that
    /// `derivation` gives its generation `generation`: a function of the
    /// customer, the route, the client's key (and a refund's charge), never
    /// of a row, so a retry after the database lost the claim derives the
    /// same ones ([`crate::derive`]).
    pub fn derive(&mut self, derivation: &Derivation, generation: u32) {
        let (customer, route, key) = (self.customer.as_str(), self.route, self.key.as_str());
        let (id, provider_key, ids) = match &mut self.operation {
            Operation::Charge(c) => (
                &mut c.id,
                &mut c.provider_key,
                derivation.charge(customer, route, key, generation),
            ),
            Operation::Refund(r) => {
                let ids = derivation.refund(&r.charge_id, customer, route, key, generation);
                (&mut r.id, &mut r.provider_key, ids)
            }
            Operation::Capture(c) => {
                let what = (c.action.as_str(), c.action.id_prefix());
                let parts = [c.charge_id.as_str(), customer, route, key];
                let ids = derivation.on_charge(what, parts, generation);
                (&mut c.id, &mut c.provider_key, ids)
            }
        };
        *id = ids.id;
        *provider_key = ids.provider_key;
    }
}

/// A request to claim a key: the record to insert and the pending
/// operation that goes in the same transaction.
#[derive(Debug, Clone)]
pub struct Claim {
    pub key: IdempotencyKey,
    pub route: &'static str,
    pub customer: CustomerId,
    pub fingerprint: RequestFingerprint,
    pub lease: NewLease,
    /// How long the key is remembered once claimed.
    pub ttl: Duration,
    /// The pending charge, or refund (its amount 0 for "what is left"), or
    /// capture or cancel; the store sets its timestamps. A refund's amount
    /// is reserved on its charge in the same transaction; a capture or
    /// cancel takes its hold there ([`Claim::hold_margin`]).
    pub operation: Operation,
    /// A capture's claim takes its hold only while the hold lapses more
    /// than this from the database's now (`HOLD_CAPTURE_MARGIN`); a cancel
    /// only before it lapses.
    pub hold_margin: Duration,
    /// Whether the store looks for the key's record before writing, to
    /// answer a known key without a write. The service always does (true);
    /// false goes straight to the write, which the conformance suite uses to
    /// race claims whose writes really conflict (on a cluster, at
    /// certification). Only a shortcut either way: a record that appeared
    /// since is still found by the write, which the unique index arbitrates.
    pub read_first: bool,
}

/// A provider charge or refund that names one of our operations, with no
/// row here (`payments-jobs reconcile`, `docs/operations.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub object: ProviderObject,
    /// When a reconcile pass first found it, by the database's clock.
    pub found_at: DateTime<Utc>,
}

/// The result of a claim.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    /// This caller inserted (or reclaimed an expired) record and holds the
    /// lease; the operation is as stored, with the database's timestamps
    /// (and a refund's amount as reserved).
    Claimed {
        record_id: RecordId,
        operation: Box<Operation>,
    },
    /// Someone else has this key; the caller decides from the record.
    Existing(Box<IdempotencyRecord>),
    /// The operation's id (derived for its generation, see
    /// [`crate::derive`]) is already a charge or refund: the key was used
    /// before, by an operation whose record has expired. Nothing was
    /// written; the caller claims again with the next free generation.
    GenerationTaken,
    /// A refund that does not fit in what is left of its charge, or a
    /// capture or cancel of a hold already captured, canceled or lapsed:
    /// nothing was made, and the record was stored complete with this
    /// answer ([`Refund::exceeds_charge`], [`Capture::refusal`]), replayed
    /// to every retry.
    Refused(StoredResponse),
    /// A capture or cancel of a hold another capture or cancel holds while
    /// its outcome is pending (it may yet fail and give the hold back):
    /// nothing was written, the claim was undone, and the answer is a 409
    /// that is not stored.
    HoldBusy,
}

/// What the provider said about a charge, as the `charges` row records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeOutcome {
    pub charge_id: String,
    pub status: ChargeStatus,
    pub gateway_charge_id: Option<String>,
    pub decline_code: Option<String>,
    /// An authorized hold's lapse ([`Charge::capture_before`]).
    pub capture_before: Option<DateTime<Utc>>,
}

/// What the provider said about a refund. Its charge's reservation follows:
/// a succeeded refund adds to `amount_refunded`, a failed one gives its
/// amount back, a pending or unknown one keeps it reserved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundOutcome {
    pub refund_id: String,
    pub charge_id: String,
    pub amount_cents: i64,
    pub status: RefundStatus,
    pub gateway_refund_id: Option<String>,
    pub failure_code: Option<String>,
}

/// What the provider said about a capture or cancel of a hold. Its hold
/// follows: a succeeded capture makes it `succeeded` with the amount
/// captured, a succeeded cancel `canceled`; a failed one gives the hold
/// back (`requires_capture`, or `expired` when `hold_lapsed`); a pending
/// or unknown one keeps it taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureOutcome {
    pub capture_id: String,
    pub action: HoldAction,
    pub charge_id: String,
    pub amount_cents: i64,
    pub status: ChargeStatus,
    pub gateway_id: Option<String>,
    pub failure_code: Option<String>,
    /// A failure because the hold lapsed at the provider.
    pub hold_lapsed: bool,
}

/// The outcome of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Charge(ChargeOutcome),
    Refund(RefundOutcome),
    Capture(CaptureOutcome),
}

impl Outcome {
    /// The charge's, refund's or capture's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Charge(c) => &c.charge_id,
            Self::Refund(r) => &r.refund_id,
            Self::Capture(c) => &c.capture_id,
        }
    }

    pub fn status(&self) -> ChargeStatus {
        match self {
            Self::Charge(c) => c.status,
            Self::Refund(r) => r.status,
            Self::Capture(c) => c.status,
        }
    }

    /// Settled by reconciliation as never made at the provider.
    pub fn is_not_made(&self) -> bool {
        let code = match self {
            Self::Charge(c) => c.decline_code.as_deref(),
            Self::Refund(r) => r.failure_code.as_deref(),
            Self::Capture(c) => c.failure_code.as_deref(),
        };
        code.is_some_and(|code| crate::service::NOT_MADE.contains(&code))
    }
}

/// The final outcome of an operation, written with its record in one
/// transaction: the record becomes `state` (complete, or abandoned).
#[derive(Debug, Clone)]
pub struct Finish {
    pub record_id: RecordId,
    pub lease_token: LeaseToken,
    pub state: RecordState,
    pub outcome: Outcome,
    pub response: StoredResponse,
    /// The change's event, written in the same transaction
    /// ([`NewEvent::of`]).
    pub event: Option<NewEvent>,
}

/// A provider event's application: its `provider_events` row and the
/// changes it makes, in one transaction ([`crate::inbox`]).
#[derive(Debug, Clone)]
pub struct Application {
    pub record: Recorded,
    pub changes: Vec<Change>,
    /// How long an operation's rewritten answer is kept (the TTL), as
    /// [`Store::reconcile`] keeps it.
    pub keep_for: Duration,
}

/// What [`Store::apply_provider_event`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Recorded, and every change made.
    Applied,
    /// The event was recorded already (not waiting): nothing was written.
    Duplicate,
    /// A change's guard failed (the local state moved since it was read,
    /// or another application created the same refund or dispute):
    /// nothing was written; plan again.
    Stale,
}

/// What one [`Store::prune_events`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunedEvents {
    pub events: u64,
    pub deliveries: u64,
    /// Provider events (the inbox's) applied or ignored.
    pub provider_events: u64,
}

/// What an attempt's record did to its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptRecorded {
    Delivered,
    /// To be tried again.
    Retrying,
    /// Its retry window is over: `failed`, until re-sent.
    GaveUp,
    /// The delivery was not under this lease any more (another runner took
    /// it after the lease ran out): nothing recorded.
    Lost,
}

/// A charge or refund whose provider outcome is unknown, or a refund
/// pending at the provider, as reconciliation reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsettled {
    pub operation: Operation,
    /// Whether its last provider call was sent longer ago than the search
    /// lag, by the database's clock; `None` when the call was made before
    /// calls named the operation in their metadata (it cannot be found by
    /// it, so "not found" proves nothing).
    pub lag_passed: Option<bool>,
}

/// Whether this finisher was the one that completed the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishOutcome {
    Finished,
    /// The record was not in progress under this lease token any more.
    Lost,
}

/// Persistence for idempotency records and charges.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Applies this backend's missing migrations. Safe to run from several
    /// processes at once, except on a cluster named by [`Store::cluster`].
    async fn migrate(&self) -> Result<(), StoreError>;

    /// The value stored under `name` in the database's settings, storing
    /// `value` first if there is none: the first writer's value stands,
    /// and every later caller gets it back to compare with its own.
    async fn pin_setting(&self, name: &str, value: &str) -> Result<String, StoreError>;

    /// The multi-primary cluster this store is on (`"galera"`), where
    /// concurrent `migrate` calls are not serialised (the migrator's lock,
    /// MySQL's `GET_LOCK`, is refused there or held per node): migrations
    /// then run once,
    /// from `payments-api migrate` against one node.
    fn cluster(&self) -> Option<&'static str> {
        None
    }

    /// Reachable, and every migration this build knows is applied; with
    /// one writer (SQLite), that writer can commit again after a failure.
    async fn ready(&self) -> Result<(), StoreError>;

    /// Inserts the record (`in_progress`) and its pending operation in one
    /// transaction; a refund first reserves its amount on its charge, by a
    /// conditional update, or is refused ([`ClaimOutcome::Refused`]). The unique index on (key, route) arbitrates: a loser gets
    /// the existing record. A complete record past `expires_at` is treated
    /// as absent and reclaimed by a conditional update; an in-progress or
    /// abandoned one never is.
    ///
    /// A key already known (a replay, a duplicate in flight) is answered
    /// without writing or taking a lock: it is the common retry, and on
    /// SQLite a write lock would queue it behind every new charge.
    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError>;

    /// Takes over an in-progress record whose lease has expired, by
    /// compare-and-set on the expected lease token, if it was claimed
    /// `age` ago (the guard is in the statement). True if this caller won.
    async fn take_over(
        &self,
        record_id: RecordId,
        expected_token: &LeaseToken,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<bool, StoreError>;

    /// The database's clock now.
    async fn now(&self) -> Result<DateTime<Utc>, StoreError>;

    /// Records a provider object with no operation row here as an orphan,
    /// found now (the database's clock), with its `orphan.found` event in
    /// the same transaction; false if it is recorded already.
    async fn record_orphan(&self, object: &ProviderObject) -> Result<bool, StoreError>;

    /// Marks settled every open orphan whose operation has its row again
    /// (its client's retry adopted it); how many.
    async fn settle_orphans(&self) -> Result<u64, StoreError>;

    /// The orphans not settled, oldest found first (at most `limit`).
    async fn open_orphans(&self, limit: u32) -> Result<Vec<Orphan>, StoreError>;

    /// Undoes a claim under its lease, as if its request had never come:
    /// the record and its still `pending` charge or refund are deleted (a
    /// refund's reservation given back), in one transaction. For a claim
    /// the provider refused as another operation's key
    /// ([`crate::provider::Doubt::KeyReused`]): its derived id must be free
    /// again for the retry with the first body. False when the lease is no
    /// longer this caller's (nothing is deleted).
    async fn forget(
        &self,
        record_id: RecordId,
        lease_token: &LeaseToken,
        operation: &Operation,
    ) -> Result<bool, StoreError>;

    /// Ends the lease now (outcome unknown), keeping the record in progress
    /// so a retry or the reaper can take it over at once.
    async fn release(
        &self,
        record_id: RecordId,
        lease_token: &LeaseToken,
    ) -> Result<bool, StoreError>;

    /// Completes (or abandons) the record and updates its charge or refund
    /// (and a refund's charge) in one transaction, guarded by `state = 'in_progress' AND lease_token = mine`.
    async fn finish(&self, finish: &Finish) -> Result<FinishOutcome, StoreError>;

    /// Inserts a charge with no idempotency record: the keyless requests of
    /// `IDEMPOTENCY_KEY_MODE=optional`, which nothing protects. Returns it
    /// as stored, with the database's timestamps.
    async fn insert_charge(&self, charge: &Charge) -> Result<Charge, StoreError>;

    /// Records the outcome of a charge or refund still `pending`, outside a
    /// finish: a keyless charge, or the operation of a driver that lost its
    /// record. False when it is not pending (another driver settled it) or
    /// absent.
    /// The change's `event` is written in the same transaction.
    async fn settle(&self, outcome: &Outcome, event: Option<&NewEvent>)
    -> Result<bool, StoreError>;

    /// Charges and refunds in `unknown`, and refunds `pending` at the
    /// provider (it answered `pending` and gave its id), at most `limit` of
    /// each, with whether `search_lag` has passed since their last provider
    /// call. Least recently looked at first: by when reconciliation last
    /// looked at each ([`Store::looked_at`]), else when it last changed, so
    /// operations a pass cannot settle go behind the others and every one
    /// is read within a bounded number of passes.
    async fn unsettled(
        &self,
        search_lag: Duration,
        limit: u32,
    ) -> Result<Vec<Unsettled>, StoreError>;

    /// Stamps an unsettled operation with the database's time as
    /// reconciliation looks at it and leaves it unsettled (lagging, for a
    /// person, a failed lookup, still pending): [`Store::unsettled`] then
    /// reads it after those looked at or unsettled before now.
    async fn looked_at(&self, operation: &Operation) -> Result<(), StoreError>;

    /// Settles an operation still `unknown` (or a refund still `pending` at
    /// the provider) with what the provider's records say (a refund's
    /// charge follows, as in a finish) and, in the same transaction,
    /// replaces its abandoned record's stored answer
    /// (`500 request_abandoned`) with `answer`, the record then complete and
    /// kept `keep_for` from now. The only rewrite of a stored answer there
    /// is: guarded by the operation being `unknown` and the record
    /// `abandoned`; a pending refund's record is complete, and its stored
    /// `201` stays. False when the operation was no longer unsettled
    /// (another reconciler settled it).
    /// The change's `event` is written in the same transaction.
    async fn reconcile(
        &self,
        outcome: &Outcome,
        event: Option<&NewEvent>,
        answer: &StoredResponse,
        keep_for: Duration,
    ) -> Result<bool, StoreError>;

    /// Stamps the operation with the database's time as its provider call
    /// is sent again (a takeover's re-drive); a claim stamps it itself.
    async fn provider_called(&self, operation: &Operation) -> Result<(), StoreError>;

    /// Takes over the in-progress record whose lease expired longest ago
    /// among those claimed `age` ago, giving it `lease`; `None` when there
    /// is none. Several reapers at once never get the same record (a
    /// conditional update under the row lock, `FOR UPDATE SKIP LOCKED`
    /// where the backend has it).
    async fn claim_expired(
        &self,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;

    /// In-progress records whose lease has expired, oldest lease first,
    /// changing nothing (the reaper's dry run).
    async fn expired_in_progress(&self, limit: u32) -> Result<Vec<IdempotencyRecord>, StoreError>;

    /// Deletes at most `batch` complete records past `expires_at` in one
    /// short statement; returns how many. Never in-progress or abandoned
    /// records, never charges.
    async fn prune(&self, batch: u32) -> Result<u64, StoreError>;

    /// Rows the pruner deletes per statement unless told otherwise.
    fn default_prune_batch(&self) -> u32 {
        5000
    }

    /// The shortest rest a bulk writer (the pruner) should take between
    /// batches so that the API's writes get in. Zero where writers do not
    /// block each other's rows.
    fn batch_pause_floor(&self) -> Duration {
        Duration::ZERO
    }

    /// How many complete records are past `expires_at` (the pruner's dry run).
    async fn count_prunable(&self) -> Result<u64, StoreError>;

    /// A record by id.
    async fn record(&self, record_id: RecordId) -> Result<Option<IdempotencyRecord>, StoreError>;

    /// The record of (key, route), if there is one; writes nothing.
    async fn record_by_key(
        &self,
        key: &IdempotencyKey,
        route: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;

    /// A charge by id.
    async fn charge(&self, charge_id: &str) -> Result<Option<Charge>, StoreError>;

    /// A refund by id.
    async fn refund(&self, refund_id: &str) -> Result<Option<Refund>, StoreError>;

    /// A capture or cancel by id, with its hold as it was when taken.
    async fn capture(&self, capture_id: &str) -> Result<Option<Capture>, StoreError>;

    /// Marks at most `batch` holds whose `capture_before` has passed by the
    /// database's clock `expired`, each with its `charge.expired` event, in
    /// one transaction; how many. Never a hold a capture or cancel has
    /// taken (its outcome decides).
    async fn expire_holds(&self, batch: u32) -> Result<u64, StoreError>;

    /// Holds by status (`requires_capture`, `succeeded` once captured,
    /// `canceled`, `expired`), for the holds gauge.
    async fn count_holds(&self) -> Result<Vec<(ChargeStatus, u64)>, StoreError>;

    /// A page of a customer's charges matching the query's filters: at most
    /// `limit + 1` (the extra one says there are more), newest first, or
    /// oldest first after an `ending_before` cursor. The cursor's charge
    /// must exist (the caller checks it is the customer's). `customer`
    /// `None`: every customer's charges (the back office's list).
    async fn list_charges(
        &self,
        customer: Option<&CustomerId>,
        query: &ChargeQuery,
    ) -> Result<Vec<Charge>, StoreError>;

    /// A page of a charge's refunds, as [`Store::list_charges`] pages.
    async fn list_refunds(&self, charge_id: &str, page: &Page) -> Result<Vec<Refund>, StoreError>;

    /// An event by id.
    async fn event(&self, event_id: &str) -> Result<Option<Event>, StoreError>;

    /// A page of events matching the query, as [`Store::list_charges`]
    /// pages (newest first, at most `limit + 1`). The cursor's event must
    /// exist (the caller checks).
    async fn list_events(&self, query: &EventQuery) -> Result<Vec<Event>, StoreError>;

    /// Makes the deliveries of at most `batch` events not dispatched yet,
    /// one per endpoint that wants each, and marks them dispatched, in one
    /// transaction (several runners at once take different events); how
    /// many events. With no endpoints, events are only marked.
    async fn dispatch_events(&self, endpoints: &[Endpoint], batch: u32) -> Result<u64, StoreError>;

    /// Leases at most `batch` pending deliveries that are due and not
    /// leased (or whose lease ran out), by the database's clock, with their
    /// events; several runners at once never get the same one.
    async fn claim_deliveries(
        &self,
        lease: &NewLease,
        batch: u32,
    ) -> Result<Vec<Delivery>, StoreError>;

    /// Records an attempt's end under its lease.
    async fn attempted(
        &self,
        delivery_id: &str,
        lease_token: &LeaseToken,
        attempt: &Attempted,
    ) -> Result<AttemptRecorded, StoreError>;

    /// Deliveries in `state`, most recently changed first (at most `limit`).
    async fn deliveries(
        &self,
        state: DeliveryState,
        limit: u32,
    ) -> Result<Vec<Delivery>, StoreError>;

    /// Sends again: every failed delivery (`event_id` `None`), or every
    /// delivery of one event, whatever its state, and to each of
    /// `endpoints` that wants it and has none; each pending from now with
    /// a new retry window. How many deliveries.
    async fn resend(
        &self,
        event_id: Option<&str>,
        endpoints: &[Endpoint],
    ) -> Result<u64, StoreError>;

    /// Deletes at most `batch` delivered deliveries of events created
    /// `retention` ago or longer, then at most `batch` of those events left
    /// with no delivery, in short statements. Never an event with a pending
    /// or failed delivery, never one not dispatched. Then at most `batch`
    /// provider events received `retention` ago or longer that were applied
    /// or ignored (never one waiting or left for a person): the provider
    /// redelivers for days, not for the retention, and an event applied
    /// again would find nothing left to change.
    async fn prune_events(
        &self,
        retention: Duration,
        batch: u32,
    ) -> Result<PrunedEvents, StoreError>;

    /// How long ago the oldest event with a delivery still to make (or not
    /// dispatched yet) was created, by the database's clock.
    async fn oldest_undelivered(&self) -> Result<Option<Duration>, StoreError>;

    /// The state a provider event was recorded in, if it was.
    async fn provider_event(&self, event_id: &str) -> Result<Option<InboxState>, StoreError>;

    /// Records the provider event and makes its changes in one
    /// transaction: the event's unique id arbitrates duplicates (one
    /// recorded `waiting` may be recorded again), each change is guarded
    /// by the state it was planned from ([`Applied::Stale`]), and each
    /// change writes its events.
    async fn apply_provider_event(&self, application: &Application) -> Result<Applied, StoreError>;

    /// Provider events open (recorded `waiting` or `needs_person`), least
    /// recently tried first (at most `limit`).
    async fn open_provider_events(&self, limit: u32) -> Result<Vec<Recorded>, StoreError>;

    /// Provider events recorded per state, for the gauge.
    async fn count_provider_events(&self) -> Result<Vec<(InboxState, u64)>, StoreError>;

    /// One of our charges as a provider event is applied to: with whether
    /// a capture or cancel holds its hold, every refund and every dispute.
    async fn inbox_local(&self, charge_id: &str) -> Result<Option<Local>, StoreError>;

    /// A dispute by (our) id.
    async fn dispute(&self, dispute_id: &str) -> Result<Option<Dispute>, StoreError>;

    /// A charge's disputes, oldest first.
    async fn disputes_of(&self, charge_id: &str) -> Result<Vec<Dispute>, StoreError>;

    /// A page of disputes, as [`Store::list_charges`] pages; only those
    /// not closed when `open_only`.
    async fn list_disputes(&self, page: &Page, open_only: bool)
    -> Result<Vec<Dispute>, StoreError>;

    /// The operation a record drives: its refund, else its charge.
    async fn operation(&self, record: &IdempotencyRecord) -> Result<Operation, StoreError> {
        let missing = |what: &str, id: &str| {
            StoreError::Invariant(format!(
                "the {what} {id} of record {} is missing",
                record.id
            ))
        };
        Ok(match &record.refund_id {
            Some(id) if HoldAction::of_id(id).is_some() => Operation::Capture(
                self.capture(id)
                    .await?
                    .ok_or_else(|| missing("capture", id))?,
            ),
            Some(id) => Operation::Refund(
                self.refund(id)
                    .await?
                    .ok_or_else(|| missing("refund", id))?,
            ),
            None => Operation::Charge(
                self.charge(&record.charge_id)
                    .await?
                    .ok_or_else(|| missing("charge", &record.charge_id))?,
            ),
        })
    }
}
