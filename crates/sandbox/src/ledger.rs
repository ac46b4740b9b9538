//! What happened at the "card network": every charge made or attempted,
//! every refund, every capture of a hold, every dispute, and request
//! counters. Tests read
//! them to count provider-side effects; `POST /v1/refunds`,
//! `POST /v1/charges/{id}/capture`, `GET /v1/refunds` and
//! `GET /v1/charges/search` read and change them too.
//!
//! # Holds
//!
//! A charge made with `capture=false` and approved is a hold: `captured:
//! false`, `amount_captured: 0`, and a deadline (its `capture_before`,
//! `created` plus the config's `hold_expiry_seconds`). Until then it takes
//! one capture ([`Ledger::capture`]) of at most its amount; what is not
//! captured is released, shown as Stripe shows it, in `amount_refunded`
//! (no refund object). A refund of a hold not captured releases it whole
//! (a refund object, `refunded: true`, still `captured: false`). A hold
//! that reaches its deadline uncaptured has lapsed: nothing is written,
//! every read shows it released ([`Charge::as_of`]), a capture is refused
//! as expired and a refund as already refunded. Being worked out from the
//! deadline and the clock, a lapse reads the same across a restart.
//!
//! Charges are kept whole (metadata, refunded amount, creation time in
//! milliseconds) because refunds and searches answer with Stripe's charge
//! object. A load run makes a few hundred thousand of them, so a charge is
//! kept lean: metadata in a sorted boxed slice rather than a `BTreeMap`
//! (whose first node alone is over 500 bytes), and no second copy for
//! `GET /_sandbox/charges`, whose lines are built when asked for.
//!
//! A charge has at most one dispute (`disputes`), as at Stripe; while it is
//! open and the charge not refundable (a chargeback, not an inquiry), a
//! refund is refused.
//!
//! With a ledger file (`journal`), every change is written to it before it
//! is made here: a change the file refused is not made, and its request is
//! answered 500. The file is read back through [`Books`]' `replay_*`
//! methods, which rebuild what a charge has refunded from its refunds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use rand::Rng;
use rand::distr::Alphanumeric;
use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize};

use crate::config::{RefundStatus, SandboxConfig};
use crate::disputes::{Dispute, DisputeChange, DisputeRefusal, DisputeRequest};
use crate::journal::{Journal, JournalError, Line};
use crate::network::{self, Decline};
use crate::params::{CaptureRequest, ChargeRequest, CreatedRange, REFUND_REASONS, RefundRequest};

/// A charge's final state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ChargeStatus {
    Succeeded,
    Failed,
}

/// Stripe's `metadata`: string pairs, sorted by key, serialised as a JSON
/// object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Metadata(Box<[(String, String)]>);

impl Metadata {
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(entry, _)| entry.as_str().cmp(key))
            .ok()
            .and_then(|index| self.0.get(index))
            .map(|(_, value)| value.as_str())
    }
}

impl From<BTreeMap<String, String>> for Metadata {
    fn from(map: BTreeMap<String, String>) -> Self {
        // A BTreeMap iterates in key order: the slice is sorted.
        Self(map.into_iter().collect())
    }
}

impl Serialize for Metadata {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        BTreeMap::<String, String>::deserialize(deserializer).map(Self::from)
    }
}

/// Reads back one of the sandbox's own `&'static str` values: `None` for
/// null, an error for a value the sandbox never writes.
pub(crate) fn one_of<'de, D: Deserializer<'de>>(
    deserializer: D,
    known: impl IntoIterator<Item = &'static str>,
) -> Result<Option<&'static str>, D::Error> {
    let Some(value) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    known
        .into_iter()
        .find(|known| *known == value)
        .map(Some)
        .ok_or_else(|| D::Error::custom(format!("unknown value {value:?}")))
}

fn failure_code<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'static str>, D::Error> {
    one_of(d, network::failure_codes())
}

fn failure_message<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'static str>, D::Error> {
    one_of(d, network::failure_messages())
}

fn refund_reason<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'static str>, D::Error> {
    one_of(d, REFUND_REASONS)
}

/// `&'static str` under another name, for the fields that are not read
/// back as written (`object`, which each type knows) or through [`one_of`]:
/// serde's derive borrows a field spelled `&str` or `Option<&str>` from its
/// input, which a ledger file line cannot lend.
pub(crate) type Known = &'static str;

fn charge_object() -> Known {
    "charge"
}

fn refund_object() -> Known {
    "refund"
}

/// Stripe's `payment_method_details` of a card charge, `{"type": "card",
/// "card": {..}}`: for a hold, the card's `capture_before` (the sandbox's
/// subset). The type, always `card`, is written, not kept; read back, it
/// is ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct PaymentMethodDetails {
    #[serde(default)]
    card: CardDetails,
}

impl Serialize for PaymentMethodDetails {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "card")?;
        map.serialize_entry("card", &self.card)?;
        map.end()
    }
}

/// `payment_method_details.card`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct CardDetails {
    /// A hold's deadline (Unix seconds): uncaptured by then, it is
    /// released. Left out for a charge captured when made, a failed one,
    /// and a hold made with `send_capture_before` off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capture_before: Option<u64>,
}

/// How a hold is made, from the config of the request that makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldTerms {
    /// Seconds from its creation to its deadline (`hold_expiry_seconds`).
    pub(crate) expiry_secs: u64,
    /// Whether its answers show the deadline (`send_capture_before`).
    pub(crate) show_deadline: bool,
}

impl HoldTerms {
    pub(crate) fn of(config: &SandboxConfig) -> Self {
        Self {
            expiry_secs: config.hold_expiry_seconds,
            show_deadline: config.send_capture_before,
        }
    }
}

/// Stripe's charge object (the subset the gateway reads, plus a few fields
/// a Stripe client expects to see). Read back from the ledger file as it is
/// written there: the wire object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Charge {
    pub(crate) id: String,
    #[serde(skip_deserializing, default = "charge_object")]
    object: Known,
    pub(crate) amount: u64,
    /// What was captured: `amount` for a charge captured when made, what
    /// its capture took for a hold (0 until then), 0 for a failed charge.
    /// Rebuilt from the ledger file's lines, like `amount_refunded`.
    #[serde(default)]
    pub(crate) amount_captured: u64,
    /// What the charge's refunds add up to, plus what a hold's capture
    /// left uncaptured (released), or the whole amount of a hold released
    /// or lapsed; never more than `amount`.
    pub(crate) amount_refunded: u64,
    pub(crate) currency: String,
    pub(crate) status: ChargeStatus,
    paid: bool,
    /// Captured when made, or a hold since captured.
    pub(crate) captured: bool,
    /// Fully refunded, or a hold released.
    pub(crate) refunded: bool,
    /// Disputed, ever (Stripe's flag stays once the dispute is closed).
    /// Rebuilt from the ledger file's dispute lines; absent from a file
    /// written before disputes.
    #[serde(default)]
    pub(crate) disputed: bool,
    livemode: bool,
    /// The token, echoed (Stripe returns a card object here).
    source: String,
    description: Option<String>,
    pub(crate) metadata: Metadata,
    /// Unix seconds.
    pub(crate) created: u64,
    /// Unix milliseconds, for the search index's lag; not on the wire (the
    /// ledger file has it beside the charge).
    #[serde(skip)]
    pub(crate) created_ms: u64,
    /// A card, with a hold's `capture_before` when shown. Absent from a
    /// ledger file written before holds: the default, a card.
    #[serde(default)]
    payment_method_details: PaymentMethodDetails,
    /// A hold's deadline (Unix seconds), whether its answers show it or
    /// not; `None` for any other charge. Not on the wire (the ledger file
    /// has it beside the charge).
    #[serde(skip)]
    pub(crate) capture_deadline: Option<u64>,
    #[serde(deserialize_with = "failure_code")]
    pub(crate) failure_code: Option<Known>,
    #[serde(deserialize_with = "failure_message")]
    failure_message: Option<Known>,
}

impl Charge {
    /// A new charge with a fresh `ch_` id; `decline` makes it a failed one.
    /// An approved charge asked not to be captured is a hold, made on
    /// `terms`.
    pub(crate) fn new(request: ChargeRequest, decline: Option<Decline>, terms: HoldTerms) -> Self {
        let succeeded = decline.is_none();
        let captured = succeeded && request.capture;
        let created_ms = unix_now_ms();
        let created = created_ms / 1000;
        let capture_deadline =
            (succeeded && !captured).then(|| created.saturating_add(terms.expiry_secs));
        Self {
            id: object_id("ch"),
            object: charge_object(),
            amount: request.amount,
            amount_captured: if captured { request.amount } else { 0 },
            amount_refunded: 0,
            currency: request.currency,
            status: if succeeded {
                ChargeStatus::Succeeded
            } else {
                ChargeStatus::Failed
            },
            paid: succeeded,
            captured,
            refunded: false,
            disputed: false,
            livemode: false,
            source: request.source,
            description: request.description,
            metadata: request.metadata.into(),
            created,
            created_ms,
            payment_method_details: PaymentMethodDetails {
                card: CardDetails {
                    capture_before: capture_deadline.filter(|_| terms.show_deadline),
                },
            },
            capture_deadline,
            failure_code: decline.map(|decline| decline.code),
            failure_message: decline.map(|decline| decline.message),
        }
    }

    /// Made as a hold (whatever happened to it since).
    fn is_hold(&self) -> bool {
        self.capture_deadline.is_some()
    }

    /// A hold neither captured nor released (by a refund): a refund of it
    /// is a release.
    fn held(&self) -> bool {
        self.is_hold() && !self.captured && !self.refunded
    }

    /// A hold that reached its deadline at `now_ms` still held: released.
    fn lapsed(&self, now_ms: u64) -> bool {
        self.held()
            && self
                .capture_deadline
                .is_some_and(|deadline| now_ms >= deadline.saturating_mul(1000))
    }

    /// When a hold lapses (lapsed or not): its deadline, or its creation
    /// for a hold made with no time to be captured. `None` for any other
    /// charge.
    fn lapse_ms(&self) -> Option<u64> {
        self.capture_deadline
            .map(|deadline| deadline.saturating_mul(1000).max(self.created_ms))
    }

    /// The charge as it reads at `now_ms`: a lapsed hold shows released
    /// (`refunded`, its whole amount in `amount_refunded`, still not
    /// captured), as Stripe shows an uncaptured charge it refunded.
    pub(crate) fn as_of(&self, now_ms: u64) -> Charge {
        let mut charge = self.clone();
        if charge.lapsed(now_ms) {
            charge.amount_refunded = charge.amount;
            charge.refunded = true;
        }
        charge
    }

    /// The amount a capture of `requested` (all of it when `None`) takes,
    /// or why the charge cannot take it. The deadline is checked against
    /// `now_ms` when given (a capture read back from the ledger file was
    /// checked when it was made).
    fn capturable(
        &self,
        requested: Option<u64>,
        now_ms: Option<u64>,
    ) -> Result<u64, CaptureRefusal> {
        if self.status == ChargeStatus::Failed {
            return Err(CaptureRefusal::ChargeFailed);
        }
        if self.captured {
            return Err(CaptureRefusal::AlreadyCaptured);
        }
        if self.refunded {
            return Err(CaptureRefusal::AlreadyRefunded);
        }
        if now_ms.is_some_and(|now_ms| self.lapsed(now_ms)) {
            return Err(CaptureRefusal::Expired);
        }
        let amount = requested.unwrap_or(self.amount);
        if amount > self.amount {
            return Err(CaptureRefusal::TooLarge {
                requested: amount,
                held: self.amount,
            });
        }
        Ok(amount)
    }

    /// Captures `amount` (checked) of the hold and releases the rest,
    /// which Stripe counts in `amount_refunded`.
    fn take_capture(&mut self, amount: u64) {
        self.captured = true;
        self.amount_captured = amount;
        let released = self.amount.saturating_sub(amount);
        self.amount_refunded = self.amount_refunded.saturating_add(released);
        self.refunded = self.amount_refunded == self.amount;
    }

    /// Whether the search index has caught up with the charge at `now_ms`,
    /// given its lag.
    fn searchable(&self, now_ms: u64, lag_ms: u64) -> bool {
        now_ms.saturating_sub(self.created_ms) >= lag_ms
    }
}

/// Stripe's refund object. The sandbox's refunds are made with the
/// configured `refund_status` (`succeeded` unless told otherwise); a
/// pending one is settled later by [`Ledger::settle_refund`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Refund {
    pub(crate) id: String,
    #[serde(skip_deserializing, default = "refund_object")]
    object: Known,
    pub(crate) amount: u64,
    /// The refunded charge's id.
    pub(crate) charge: String,
    pub(crate) currency: String,
    pub(crate) status: RefundStatus,
    /// Why a `failed` refund failed (Stripe's `failure_reason`); null
    /// otherwise.
    pub(crate) failure_reason: Option<String>,
    #[serde(deserialize_with = "refund_reason")]
    pub(crate) reason: Option<Known>,
    metadata: Metadata,
    /// Unix seconds.
    pub(crate) created: u64,
}

/// One capture of a hold: a line of `GET /_sandbox/captures` and of the
/// ledger file. A capture replayed under its idempotency key is not
/// another one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Capture {
    /// The captured charge's id.
    pub(crate) charge: String,
    /// Minor units captured.
    pub(crate) amount: u64,
    pub(crate) idempotency_key: Option<String>,
    /// Unix seconds.
    pub(crate) created: u64,
}

/// Why the ledger refused a capture; `captures` turns it into Stripe's
/// error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CaptureRefusal {
    /// No charge has this id.
    NoSuchCharge,
    /// The charge failed: nothing is held.
    ChargeFailed,
    /// Captured already (when made, or by an earlier capture).
    AlreadyCaptured,
    /// The hold was released by a refund.
    AlreadyRefunded,
    /// The hold reached its deadline uncaptured.
    Expired,
    /// More than the charge's amount.
    TooLarge { requested: u64, held: u64 },
    /// The ledger file could not be written: nothing was captured.
    NotRecorded(String),
}

/// Why the ledger refused a refund; `refunds` turns it into Stripe's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RefundRefusal {
    /// No charge has this id.
    NoSuchCharge,
    /// The charge failed: there is nothing to give back.
    ChargeFailed,
    /// Every minor unit was refunded already (or the hold was released, or
    /// lapsed).
    AlreadyRefunded,
    /// More than is left to refund.
    TooLarge { requested: u64, unrefunded: u64 },
    /// Part of a hold not captured: a hold is released whole.
    PartialRelease { requested: u64, held: u64 },
    /// The charge has an open dispute that does not let it be refunded (a
    /// chargeback: the money is with the card's bank already).
    Disputed,
    /// The ledger file could not be written: nothing was refunded.
    NotRecorded(String),
}

/// A refund made, and its charge as it stands right after (for the
/// `charge.refunded` event).
#[derive(Debug, Clone)]
pub(crate) struct Refunded {
    pub(crate) refund: Refund,
    pub(crate) charge: Charge,
}

/// Why a refund's status could not be set (`POST /_sandbox/refunds/{id}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SettleRefusal {
    /// No refund has this id.
    NoSuchRefund,
    /// It is final already, with this status (a `succeeded` one can still
    /// fail; nothing else changes a final refund).
    AlreadyFinal(RefundStatus),
    /// A `succeeded` refund that released a hold cannot fail: nothing went
    /// back to a card.
    Release,
    /// The status asked for is not a final one.
    NotFinal(RefundStatus),
    /// The ledger file could not be written: nothing was changed.
    NotRecorded(String),
}

/// The refund's failure reason when it fails with none given.
pub(crate) const DEFAULT_FAILURE_REASON: &str = "unknown";

/// `GET /v1/charges?starting_after=` named a charge the sandbox does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoSuchCharge;

/// Why `GET /v1/refunds` or `GET /v1/disputes` has no page to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListRefusal {
    /// `charge=` named a charge the sandbox does not know.
    NoSuchCharge,
    /// `starting_after=` named nothing of the list.
    NotInList,
}

/// A page of a list or a search, newest first.
#[derive(Debug, Clone)]
pub(crate) struct Page<T> {
    pub(crate) data: Vec<T>,
    /// More matched than the page holds.
    pub(crate) has_more: bool,
}

impl<T> Page<T> {
    /// The first `limit` of `matches` (newest first), and whether there were
    /// more.
    fn of(matches: impl Iterator<Item = T>, limit: usize) -> Self {
        let mut data: Vec<T> = matches.take(limit.saturating_add(1)).collect();
        let has_more = data.len() > limit;
        data.truncate(limit);
        Self { data, has_more }
    }
}

/// An object of a charge's list (a refund, a dispute): what a page of it
/// is cut by.
pub(crate) trait OfCharge {
    fn id(&self) -> &str;
    fn charge(&self) -> &str;
    /// Unix seconds.
    fn created(&self) -> u64;
}

impl OfCharge for Refund {
    fn id(&self) -> &str {
        &self.id
    }
    fn charge(&self) -> &str {
        &self.charge
    }
    fn created(&self) -> u64 {
        self.created
    }
}

impl OfCharge for crate::disputes::Dispute {
    fn id(&self) -> &str {
        &self.id
    }
    fn charge(&self) -> &str {
        &self.charge
    }
    fn created(&self) -> u64 {
        self.created
    }
}

/// A page of `items` (newest first): only `charge`'s if given (which must
/// exist), within `created`, from just after `starting_after` (which must
/// be in the list), as Stripe pages a list.
fn list_page<'a, T: OfCharge + Clone + 'a>(
    books: &Books,
    items: impl Iterator<Item = &'a T>,
    charge: Option<&str>,
    created: CreatedRange,
    limit: usize,
    starting_after: Option<&str>,
) -> Result<Page<T>, ListRefusal> {
    if charge.is_some_and(|charge| !books.has_charge(charge)) {
        return Err(ListRefusal::NoSuchCharge);
    }
    let mut matches = items.filter(|item| charge.is_none_or(|charge| item.charge() == charge));
    if let Some(cursor) = starting_after
        && !matches.by_ref().any(|item| item.id() == cursor)
    {
        return Err(ListRefusal::NotInList);
    }
    let matches = matches.filter(|item| created.contains(item.created()));
    Ok(Page::of(matches.cloned(), limit))
}

/// A Stripe-style id: `prefix`, an underscore, 24 alphanumerics.
pub(crate) fn object_id(prefix: &str) -> String {
    let suffix: String = rand::rng()
        .sample_iter(Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    format!("{prefix}_{suffix}")
}

pub(crate) fn unix_now_ms() -> u64 {
    // A clock before 1970 is not worth failing a charge over.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

/// One line of `GET /_sandbox/charges`, as the charge reads now.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChargeRecord {
    id: String,
    amount: u64,
    currency: String,
    status: ChargeStatus,
    captured: bool,
    amount_captured: u64,
    amount_refunded: u64,
    failure_code: Option<&'static str>,
    idempotency_key: Option<String>,
    metadata: Metadata,
    created: u64,
}

/// One line of `GET /_sandbox/refunds`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RefundRecord {
    id: String,
    charge: String,
    amount: u64,
    currency: String,
    status: RefundStatus,
    reason: Option<&'static str>,
    idempotency_key: Option<String>,
    created: u64,
}

/// `GET /_sandbox/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Stats {
    /// Requests to `POST /v1/charges`, `POST /v1/refunds` and
    /// `POST /v1/charges/{id}/capture`.
    pub(crate) requests: u64,
    pub(crate) in_flight: u64,
    pub(crate) max_in_flight: u64,
    pub(crate) charges: u64,
    pub(crate) refunds: u64,
    /// Captures made (not their replays).
    pub(crate) captures: u64,
    /// Disputes opened.
    pub(crate) disputes: u64,
}

#[derive(Debug)]
struct ChargeEntry {
    charge: Charge,
    idempotency_key: Option<String>,
}

#[derive(Debug)]
struct RefundEntry {
    refund: Refund,
    idempotency_key: Option<String>,
}

/// Charges, refunds, captures and disputes under one lock, so that a
/// refund's or a capture's check against its charge (and its dispute) and
/// its record are one critical section.
#[derive(Debug, Default)]
pub(crate) struct Books {
    /// Oldest first.
    charges: Vec<ChargeEntry>,
    /// Oldest first.
    refunds: Vec<RefundEntry>,
    /// Oldest first.
    captures: Vec<Capture>,
    /// Oldest first, as they stand now; at most one per charge.
    disputes: Vec<Dispute>,
}

impl Books {
    /// Newest first: a refund is nearly always for a recent charge, so the
    /// scan stops early. A charge id index would cost ~80 bytes per charge
    /// for the rare lookup of an old or unknown id (about a millisecond
    /// across a few hundred thousand charges).
    fn charge_mut(&mut self, id: &str) -> Option<&mut Charge> {
        self.charges
            .iter_mut()
            .rev()
            .map(|entry| &mut entry.charge)
            .find(|charge| charge.id == id)
    }

    fn has_charge(&self, id: &str) -> bool {
        self.charges.iter().rev().any(|entry| entry.charge.id == id)
    }

    /// How many charges, refunds and captures.
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        (self.charges.len(), self.refunds.len(), self.captures.len())
    }

    /// How many disputes.
    pub(crate) fn dispute_count(&self) -> usize {
        self.disputes.len()
    }

    /// The open dispute of `charge` that keeps it from being refunded.
    fn blocks_refunds(&self, charge: &str) -> bool {
        self.disputes
            .iter()
            .rev()
            .any(|dispute| dispute.charge == charge && dispute.blocks_refunds())
    }

    /// Every charge, then every capture, then every refund, then every
    /// dispute as it stands, as ledger file lines, oldest first: what
    /// [`Self::replay_charge`], [`Self::replay_capture`],
    /// [`Self::replay_refund`] and [`Self::replay_dispute`] read back. A
    /// hold is either captured or released, never both, so captures before
    /// refunds keeps each charge's story in order; a dispute is checked
    /// only against its charge's capture, and a refund replayed is not
    /// checked against disputes (it was when it was made).
    pub(crate) fn lines(&self) -> impl Iterator<Item = Line<'_>> {
        let charges = self.charges.iter().map(|entry| Line::Charge {
            charge: &entry.charge,
            created_ms: entry.charge.created_ms,
            capture_deadline: entry.charge.capture_deadline,
            idempotency_key: entry.idempotency_key.as_deref(),
        });
        let captures = self.captures.iter().map(Line::Capture);
        let refunds = self.refunds.iter().map(|entry| Line::Refund {
            refund: &entry.refund,
            idempotency_key: entry.idempotency_key.as_deref(),
        });
        let disputes = self.disputes.iter().map(Line::Dispute);
        charges.chain(captures).chain(refunds).chain(disputes)
    }

    /// A charge read back from the ledger file, as it was made (`None` as
    /// `capture_deadline`: not a hold, as in every file written before
    /// holds). What it had captured and refunded is rebuilt from the
    /// capture and refund lines that follow it.
    pub(crate) fn replay_charge(
        &mut self,
        mut charge: Charge,
        created_ms: u64,
        capture_deadline: Option<u64>,
        idempotency_key: Option<String>,
    ) {
        charge.created_ms = created_ms;
        charge.capture_deadline = capture_deadline;
        charge.captured = charge.status == ChargeStatus::Succeeded && capture_deadline.is_none();
        charge.amount_captured = if charge.captured { charge.amount } else { 0 };
        charge.amount_refunded = 0;
        charge.refunded = false;
        charge.disputed = false;
        self.charges.push(ChargeEntry {
            charge,
            idempotency_key,
        });
    }

    /// A capture read back from the ledger file, applied as a new one
    /// would be (the deadline aside: it was checked when the capture was
    /// made). Refused when its charge is unknown or could not have taken
    /// it: the file is not one the sandbox wrote.
    pub(crate) fn replay_capture(&mut self, capture: Capture) -> Result<(), String> {
        let charge = self.charge_mut(&capture.charge).ok_or_else(|| {
            format!(
                "a capture of charge {}, which no earlier line made",
                capture.charge
            )
        })?;
        let amount = charge
            .capturable(Some(capture.amount), None)
            .map_err(|refusal| {
                format!(
                    "charge {} cannot take a capture of {}: {refusal:?}",
                    capture.charge, capture.amount
                )
            })?;
        charge.take_capture(amount);
        self.captures.push(capture);
        Ok(())
    }

    /// A refund read back from the ledger file, with its status as written;
    /// it counts against its charge as a new one would. Refused when its
    /// charge is unknown or it would take the charge's refunds past its
    /// amount: the file is not one the sandbox wrote.
    pub(crate) fn replay_refund(
        &mut self,
        refund: Refund,
        idempotency_key: Option<String>,
    ) -> Result<(), String> {
        let charge = self.charge_mut(&refund.charge).ok_or_else(|| {
            format!(
                "refund {} is of charge {}, which no earlier line made",
                refund.id, refund.charge
            )
        })?;
        if refund.status.holds_amount() {
            let unrefunded = charge.amount.saturating_sub(charge.amount_refunded);
            let partial_release = charge.held() && refund.amount != charge.amount;
            if charge.status == ChargeStatus::Failed
                || refund.amount > unrefunded
                || partial_release
            {
                return Err(format!(
                    "refund {} takes {} from charge {}, which has {unrefunded} left",
                    refund.id, refund.amount, refund.charge
                ));
            }
            hold(charge, refund.amount);
        }
        self.refunds.push(RefundEntry {
            refund,
            idempotency_key,
        });
        Ok(())
    }

    /// A dispute read back from the ledger file, as it stood when the line
    /// was written: opened (or, compacted, as it stands). Refused when its
    /// charge is unknown, could not be disputed, or has a dispute already:
    /// the file is not one the sandbox wrote.
    pub(crate) fn replay_dispute(&mut self, dispute: Dispute) -> Result<(), String> {
        if let Some(other) = self.disputes.iter().find(|d| d.charge == dispute.charge) {
            return Err(format!(
                "dispute {} is of charge {}, which dispute {} disputes already",
                dispute.id, dispute.charge, other.id
            ));
        }
        let charge = self.charge_mut(&dispute.charge).ok_or_else(|| {
            format!(
                "dispute {} is of charge {}, which no earlier line made",
                dispute.id, dispute.charge
            )
        })?;
        if charge.status != ChargeStatus::Succeeded || !charge.captured {
            return Err(format!(
                "dispute {} is of charge {}, which was never captured",
                dispute.id, dispute.charge
            ));
        }
        charge.disputed = true;
        self.disputes.push(dispute);
        Ok(())
    }

    /// A dispute's change read back from the ledger file: the dispute as
    /// it stood after it. Refused when no earlier line opened it (for the
    /// same charge), or it was closed already.
    pub(crate) fn replay_dispute_update(&mut self, changed: Dispute) -> Result<(), String> {
        let current = self
            .disputes
            .iter_mut()
            .rev()
            .find(|dispute| dispute.id == changed.id && dispute.charge == changed.charge)
            .ok_or_else(|| {
                format!(
                    "a change of dispute {}, which no earlier line opened",
                    changed.id
                )
            })?;
        if current.status.is_closed() {
            return Err(format!(
                "a change of dispute {}, which was closed already",
                changed.id
            ));
        }
        *current = changed;
        Ok(())
    }

    /// A settlement read back from the ledger file.
    pub(crate) fn replay_settlement(
        &mut self,
        id: &str,
        status: RefundStatus,
        failure_reason: Option<String>,
    ) -> Result<(), String> {
        self.settle(id, status, failure_reason, || Ok(()))
            .map(drop)
            .map_err(|refusal| format!("refund {id} cannot be settled {status:?}: {refusal:?}"))
    }

    /// Settles a `pending` or `requires_action` refund with a final
    /// `status`, or fails a `succeeded` one (Stripe's refund that fails
    /// days later, the card closed); a failed or canceled one gives its
    /// amount back to the charge. A release of a hold cannot fail.
    /// `record` runs once every check passed, before the change.
    fn settle(
        &mut self,
        id: &str,
        status: RefundStatus,
        failure_reason: Option<String>,
        record: impl FnOnce() -> Result<(), SettleRefusal>,
    ) -> Result<Refund, SettleRefusal> {
        if !status.is_final() {
            return Err(SettleRefusal::NotFinal(status));
        }
        let Books {
            charges, refunds, ..
        } = self;
        let refund = refunds
            .iter_mut()
            .rev()
            .map(|entry| &mut entry.refund)
            .find(|refund| refund.id == id)
            .ok_or(SettleRefusal::NoSuchRefund)?;
        let fails_later =
            refund.status == RefundStatus::Succeeded && status == RefundStatus::Failed;
        if refund.status.is_final() && !fails_later {
            return Err(SettleRefusal::AlreadyFinal(refund.status));
        }
        if fails_later {
            // A hold's release is the only refund of a charge never
            // captured (a released hold takes no capture afterwards).
            let released = charges
                .iter()
                .rev()
                .map(|entry| &entry.charge)
                .find(|charge| charge.id == refund.charge)
                .is_some_and(|charge| charge.is_hold() && !charge.captured);
            if released {
                return Err(SettleRefusal::Release);
            }
        }
        record()?;
        refund.status = status;
        refund.failure_reason = (status == RefundStatus::Failed)
            .then(|| failure_reason.unwrap_or_else(|| DEFAULT_FAILURE_REASON.to_owned()));
        let settled = refund.clone();
        if !status.holds_amount()
            && let Some(charge) = self.charge_mut(&settled.charge)
        {
            charge.amount_refunded = charge.amount_refunded.saturating_sub(settled.amount);
            charge.refunded = charge.amount_refunded == charge.amount;
        }
        Ok(settled)
    }
}

/// What a refund of `requested` (`None`: all that is left) of `charge`
/// takes at `now_ms`, and the status it is made with; or why the charge
/// cannot take it. A hold not captured is released: whole, `succeeded`.
fn refundable(
    charge: &Charge,
    requested: Option<u64>,
    status: RefundStatus,
    now_ms: u64,
) -> Result<(u64, RefundStatus), RefundRefusal> {
    if charge.status == ChargeStatus::Failed {
        return Err(RefundRefusal::ChargeFailed);
    }
    if charge.lapsed(now_ms) {
        return Err(RefundRefusal::AlreadyRefunded);
    }
    if charge.held() {
        let amount = requested.unwrap_or(charge.amount);
        if amount != charge.amount {
            return Err(RefundRefusal::PartialRelease {
                requested: amount,
                held: charge.amount,
            });
        }
        return Ok((amount, RefundStatus::Succeeded));
    }
    let unrefunded = charge.amount.saturating_sub(charge.amount_refunded);
    if unrefunded == 0 {
        return Err(RefundRefusal::AlreadyRefunded);
    }
    let amount = requested.unwrap_or(unrefunded);
    if amount > unrefunded {
        return Err(RefundRefusal::TooLarge {
            requested: amount,
            unrefunded,
        });
    }
    Ok((amount, status))
}

/// Counts `amount` (checked against what is left) as refunded.
fn hold(charge: &mut Charge, amount: u64) {
    charge.amount_refunded = charge.amount_refunded.saturating_add(amount);
    charge.refunded = charge.amount_refunded == charge.amount;
}

/// The charges, the refunds and the request counters.
///
/// A std mutex, not a tokio one: it is never held across an `.await`, and
/// every critical section is a push, a scan or a copy (and, with a ledger
/// file, the write of one line, which keeps the file in the books' order).
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    books: Mutex<Books>,
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// The ledger file; `None`: in memory only.
    journal: Option<Arc<Journal>>,
}

impl Ledger {
    /// The books read back from a ledger file, which every change is
    /// written to from now on.
    pub(crate) fn restored(books: Books, journal: Arc<Journal>) -> Self {
        Self {
            books: Mutex::new(books),
            journal: Some(journal),
            ..Self::default()
        }
    }

    /// Writes `line` to the ledger file, if there is one.
    fn write(&self, line: &Line<'_>) -> Result<(), JournalError> {
        match &self.journal {
            Some(journal) => journal.append(line),
            None => Ok(()),
        }
    }

    /// Counts a charge or refund request and marks it in flight until the
    /// guard drops, however the handling ends (answer, error, client gone).
    pub(crate) fn begin_request(self: &Arc<Self>) -> InFlight {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight {
            ledger: Arc::clone(self),
        }
    }

    /// Records the charge, unless the ledger file refused it.
    pub(crate) fn record(
        &self,
        charge: Charge,
        idempotency_key: Option<String>,
    ) -> Result<(), JournalError> {
        let mut books = self.lock();
        self.write(&Line::Charge {
            charge: &charge,
            created_ms: charge.created_ms,
            capture_deadline: charge.capture_deadline,
            idempotency_key: idempotency_key.as_deref(),
        })?;
        books.charges.push(ChargeEntry {
            charge,
            idempotency_key,
        });
        Ok(())
    }

    /// Refunds `request.amount` (or what is left) of the charge, unless that
    /// would take its refunds past its amount, with the refund `status`
    /// (a failed or canceled one refunds nothing; a pending one counts
    /// against the charge until it fails). The check and the record are
    /// one critical section, so concurrent refunds can never add up to more
    /// than the charge, whatever the caller checked before.
    ///
    /// A refund of a hold not captured releases it, whole and at once
    /// (`succeeded`, whatever `status`); a lapsed hold is released already.
    /// After a capture, what is left is what was captured.
    ///
    /// A charge with an open dispute that is not refundable (a chargeback)
    /// is refused, `Disputed`, before anything else about it is looked at.
    pub(crate) fn refund(
        &self,
        request: RefundRequest,
        idempotency_key: Option<String>,
        status: RefundStatus,
    ) -> Result<Refunded, RefundRefusal> {
        let mut books = self.lock();
        // A disputed charge exists and succeeded: the order of the checks
        // makes no difference to an unknown or failed charge.
        if books.blocks_refunds(&request.charge) {
            return Err(RefundRefusal::Disputed);
        }
        let now_ms = unix_now_ms();
        let charge = books
            .charge_mut(&request.charge)
            .ok_or(RefundRefusal::NoSuchCharge)?;
        let (amount, status) = refundable(charge, request.amount, status, now_ms)?;
        // Everything that could fail comes before the first change.
        let refund = Refund {
            id: object_id("re"),
            object: refund_object(),
            amount,
            charge: request.charge,
            currency: request.currency.unwrap_or_else(|| charge.currency.clone()),
            status,
            failure_reason: (status == RefundStatus::Failed)
                .then(|| DEFAULT_FAILURE_REASON.to_owned()),
            reason: request.reason,
            metadata: request.metadata.into(),
            created: now_ms / 1000,
        };
        self.write(&Line::Refund {
            refund: &refund,
            idempotency_key: idempotency_key.as_deref(),
        })
        .map_err(|error| RefundRefusal::NotRecorded(error.to_string()))?;
        if status.holds_amount() {
            hold(charge, amount);
        }
        let charge = charge.as_of(now_ms);
        books.refunds.push(RefundEntry {
            refund: refund.clone(),
            idempotency_key,
        });
        Ok(Refunded { refund, charge })
    }

    /// Opens a dispute of the charge `charge_id` (`request` validated), as
    /// the card's bank does, unless the charge cannot be disputed (unknown,
    /// failed, not captured, disputed already, less left than asked). The
    /// check and the record are one critical section. The dispute, and the
    /// charge as it stands after (`disputed: true`).
    pub(crate) fn open_dispute(
        &self,
        charge_id: &str,
        request: DisputeRequest,
    ) -> Result<(Dispute, Charge), DisputeRefusal> {
        let mut books = self.lock();
        if let Some(other) = books.disputes.iter().find(|d| d.charge == charge_id) {
            return Err(DisputeRefusal::AlreadyDisputed(other.id.clone()));
        }
        let now_ms = unix_now_ms();
        let charge = books
            .charge_mut(charge_id)
            .ok_or(DisputeRefusal::NoSuchCharge)?;
        if charge.status != ChargeStatus::Succeeded || !charge.captured {
            return Err(DisputeRefusal::NotCaptured);
        }
        let unrefunded = charge.amount.saturating_sub(charge.amount_refunded);
        let amount = match request.amount {
            Some(amount) if amount > charge.amount_captured => {
                return Err(DisputeRefusal::TooLarge {
                    requested: amount,
                    captured: charge.amount_captured,
                });
            }
            Some(amount) => amount,
            None if unrefunded == 0 => return Err(DisputeRefusal::NothingLeft),
            None => unrefunded,
        };
        let dispute = Dispute::open(
            object_id("dp"),
            charge,
            amount,
            request.reason,
            request.inquiry,
            now_ms / 1000,
        );
        self.write(&Line::Dispute(&dispute))
            .map_err(|error| DisputeRefusal::NotRecorded(error.to_string()))?;
        charge.disputed = true;
        let charge = charge.as_of(now_ms);
        books.disputes.push(dispute.clone());
        Ok((dispute, charge))
    }

    /// Moves the dispute `id` as `change` asks, unless it is closed or
    /// cannot move that way ([`Dispute::changed`]). The dispute as it stood
    /// before, and as it stands after.
    pub(crate) fn change_dispute(
        &self,
        id: &str,
        change: DisputeChange,
    ) -> Result<(Dispute, Dispute), DisputeRefusal> {
        let mut books = self.lock();
        let dispute = books
            .disputes
            .iter_mut()
            .rev()
            .find(|dispute| dispute.id == id)
            .ok_or(DisputeRefusal::NoSuchDispute)?;
        let changed = dispute.changed(change, unix_now_ms() / 1000)?;
        self.write(&Line::DisputeUpdate(&changed))
            .map_err(|error| DisputeRefusal::NotRecorded(error.to_string()))?;
        let before = std::mem::replace(dispute, changed.clone());
        Ok((before, changed))
    }

    /// The dispute `id`, as it stands now.
    pub(crate) fn dispute_by_id(&self, id: &str) -> Option<Dispute> {
        self.lock()
            .disputes
            .iter()
            .rev()
            .find(|dispute| dispute.id == id)
            .cloned()
    }

    /// Every dispute, oldest first.
    pub(crate) fn disputes(&self) -> Vec<Dispute> {
        self.lock().disputes.clone()
    }

    /// Disputes newest first, only `charge`'s if given (which must exist),
    /// within `created`, from just after the dispute `starting_after`
    /// (which must be in the list), as Stripe pages a list.
    pub(crate) fn dispute_page(
        &self,
        charge: Option<&str>,
        created: CreatedRange,
        limit: usize,
        starting_after: Option<&str>,
    ) -> Result<Page<Dispute>, ListRefusal> {
        let books = self.lock();
        let disputes = books.disputes.iter().rev();
        list_page(&books, disputes, charge, created, limit, starting_after)
    }

    /// The holds that lapsed by `now_ms` (their deadline, or their
    /// creation, at or after `since_ms`) and that `fresh` accepts, as they
    /// read now: what `charge.expired` announces. A scan of every charge,
    /// made only while webhooks are on.
    pub(crate) fn lapsed_holds(
        &self,
        since_ms: u64,
        now_ms: u64,
        mut fresh: impl FnMut(&str) -> bool,
    ) -> Vec<Charge> {
        self.lock()
            .charges
            .iter()
            .map(|entry| &entry.charge)
            .filter(|charge| {
                charge.lapsed(now_ms)
                    && charge.lapse_ms().is_some_and(|lapse| lapse >= since_ms)
                    && fresh(&charge.id)
            })
            .map(|charge| charge.as_of(now_ms))
            .collect()
    }

    /// Captures `request.amount` (or all) of the hold `charge_id` and
    /// releases the rest, unless the charge cannot take it (failed, captured
    /// already, released, lapsed, or less than asked). The check and the
    /// record are one critical section, so of concurrent captures exactly
    /// one is made, whatever their callers checked before. The charge as
    /// it stands after.
    pub(crate) fn capture(
        &self,
        charge_id: &str,
        request: CaptureRequest,
        idempotency_key: Option<String>,
    ) -> Result<Charge, CaptureRefusal> {
        let mut books = self.lock();
        let now_ms = unix_now_ms();
        let charge = books
            .charge_mut(charge_id)
            .ok_or(CaptureRefusal::NoSuchCharge)?;
        let amount = charge.capturable(request.amount, Some(now_ms))?;
        let capture = Capture {
            charge: charge.id.clone(),
            amount,
            idempotency_key,
            created: now_ms / 1000,
        };
        self.write(&Line::Capture(&capture))
            .map_err(|error| CaptureRefusal::NotRecorded(error.to_string()))?;
        charge.take_capture(amount);
        let captured = charge.clone();
        books.captures.push(capture);
        Ok(captured)
    }

    /// The charge `id`, as it stands now.
    pub(crate) fn charge_by_id(&self, id: &str) -> Option<Charge> {
        let now_ms = unix_now_ms();
        self.lock()
            .charges
            .iter()
            .map(|entry| &entry.charge)
            .find(|charge| charge.id == id)
            .map(|charge| charge.as_of(now_ms))
    }

    /// The refund `id`, as it stands now.
    pub(crate) fn refund_by_id(&self, id: &str) -> Option<Refund> {
        self.lock()
            .refunds
            .iter()
            .rev()
            .map(|entry| &entry.refund)
            .find(|refund| refund.id == id)
            .cloned()
    }

    /// Settles a `pending` or `requires_action` refund with a final
    /// `status`, as the provider does later (Stripe's test helpers): a
    /// failed or canceled one gives its amount back to the charge. The
    /// refund's idempotent answer stays what it was.
    pub(crate) fn settle_refund(
        &self,
        id: &str,
        status: RefundStatus,
        failure_reason: Option<String>,
    ) -> Result<Refund, SettleRefusal> {
        let line = Line::Settled {
            refund: id,
            status,
            failure_reason: failure_reason.as_deref(),
        };
        let record = || {
            self.write(&line)
                .map_err(|error| SettleRefusal::NotRecorded(error.to_string()))
        };
        self.lock()
            .settle(id, status, failure_reason.clone(), record)
    }

    /// Refunds newest first, only `charge`'s if given (which must exist),
    /// from just after the refund `starting_after` (which must be in the
    /// list), as Stripe pages a list.
    pub(crate) fn refund_page(
        &self,
        charge: Option<&str>,
        created: CreatedRange,
        limit: usize,
        starting_after: Option<&str>,
    ) -> Result<Page<Refund>, ListRefusal> {
        let books = self.lock();
        let refunds = books.refunds.iter().rev().map(|entry| &entry.refund);
        list_page(&books, refunds, charge, created, limit, starting_after)
    }

    /// Charges created within `created`, newest first, from the one after
    /// `starting_after` (which must exist) on.
    pub(crate) fn charge_page(
        &self,
        created: CreatedRange,
        starting_after: Option<&str>,
        limit: usize,
    ) -> Result<Page<Charge>, NoSuchCharge> {
        let now_ms = unix_now_ms();
        let books = self.lock();
        let newest_first = books.charges.iter().rev().map(|entry| &entry.charge);
        let skip = match starting_after {
            None => 0,
            Some(id) => {
                newest_first
                    .clone()
                    .position(|charge| charge.id == id)
                    .ok_or(NoSuchCharge)?
                    + 1
            }
        };
        let matches = newest_first
            .skip(skip)
            .filter(|charge| created.contains(charge.created))
            .map(|charge| charge.as_of(now_ms));
        Ok(Page::of(matches, limit))
    }

    /// Charges with `metadata[key] == value` that the search index, `lag_ms`
    /// behind, already shows; newest first.
    pub(crate) fn search(&self, key: &str, value: &str, lag_ms: u64, limit: usize) -> Page<Charge> {
        let now_ms = unix_now_ms();
        let books = self.lock();
        let matches = books
            .charges
            .iter()
            .rev()
            .map(|entry| &entry.charge)
            .filter(|charge| charge.metadata.get(key) == Some(value))
            .filter(|charge| charge.searchable(now_ms, lag_ms))
            .map(|charge| charge.as_of(now_ms));
        Page::of(matches, limit)
    }

    /// Every charge, oldest first, as it reads now.
    pub(crate) fn charges(&self) -> Vec<ChargeRecord> {
        let now_ms = unix_now_ms();
        self.lock()
            .charges
            .iter()
            .map(|entry| {
                let charge = entry.charge.as_of(now_ms);
                ChargeRecord {
                    id: charge.id,
                    amount: charge.amount,
                    currency: charge.currency,
                    status: charge.status,
                    captured: charge.captured,
                    amount_captured: charge.amount_captured,
                    amount_refunded: charge.amount_refunded,
                    failure_code: charge.failure_code,
                    idempotency_key: entry.idempotency_key.clone(),
                    metadata: charge.metadata,
                    created: charge.created,
                }
            })
            .collect()
    }

    /// Every capture made, oldest first.
    pub(crate) fn captures(&self) -> Vec<Capture> {
        self.lock().captures.clone()
    }

    /// Every refund, oldest first.
    pub(crate) fn refunds(&self) -> Vec<RefundRecord> {
        self.lock()
            .refunds
            .iter()
            .map(|entry| RefundRecord {
                id: entry.refund.id.clone(),
                charge: entry.refund.charge.clone(),
                amount: entry.refund.amount,
                currency: entry.refund.currency.clone(),
                status: entry.refund.status,
                reason: entry.refund.reason,
                idempotency_key: entry.idempotency_key.clone(),
                created: entry.refund.created,
            })
            .collect()
    }

    pub(crate) fn stats(&self) -> Stats {
        let books = self.lock();
        let (charges, refunds, captures) = books.counts();
        let disputes = books.dispute_count();
        drop(books);
        Stats {
            requests: self.requests.load(Ordering::SeqCst),
            in_flight: self.in_flight.load(Ordering::SeqCst),
            max_in_flight: self.max_in_flight.load(Ordering::SeqCst),
            charges: charges as u64,
            refunds: refunds as u64,
            captures: captures as u64,
            disputes: disputes as u64,
        }
    }

    /// Forgets charges, refunds, captures and counters. Requests still in flight stay
    /// counted (their guards will decrement), so the high-water mark
    /// restarts there. With a ledger file, the file is replaced by an empty
    /// one first; if that fails, nothing is forgotten.
    pub(crate) fn reset(&self) -> Result<(), JournalError> {
        let mut books = self.lock();
        if let Some(journal) = &self.journal {
            journal.restart()?;
        }
        *books = Books::default();
        self.requests.store(0, Ordering::SeqCst);
        self.max_in_flight
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Books> {
        // A panic inside a critical section leaves the books valid: a refund
        // changes its charge only after every check passed, then pushes.
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Marks one charge request in flight; decrements on drop.
#[derive(Debug)]
pub(crate) struct InFlight {
    ledger: Arc<Ledger>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.ledger.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::disputes::DisputeStatus;

    #[test]
    fn in_flight_guard_tracks_the_high_water_mark() {
        let ledger = Arc::new(Ledger::default());
        let first = ledger.begin_request();
        let second = ledger.begin_request();
        drop(first);
        drop(second);
        let third = ledger.begin_request();
        let stats = ledger.stats();
        assert_eq!(
            (stats.requests, stats.in_flight, stats.max_in_flight),
            (3, 1, 2)
        );
        drop(third);
        assert_eq!(ledger.stats().in_flight, 0);
    }

    #[test]
    fn ids_look_like_stripe_ids() {
        for prefix in ["ch", "re"] {
            let id = object_id(prefix);
            assert_eq!(id.len(), 27);
            assert!(id.starts_with(&format!("{prefix}_")));
            assert!(id[3..].chars().all(|c| c.is_ascii_alphanumeric()));
        }
    }

    const WEEK: HoldTerms = HoldTerms {
        expiry_secs: 604_800,
        show_deadline: true,
    };

    fn made(amount: u64, decline: Option<Decline>, capture: bool, terms: HoldTerms) -> Charge {
        Charge::new(
            ChargeRequest {
                amount,
                currency: "gbp".into(),
                source: "tok_visa".into(),
                description: None,
                metadata: BTreeMap::from([("order".into(), "42".into())]),
                capture,
            },
            decline,
            terms,
        )
    }

    fn charge(amount: u64, decline: Option<Decline>) -> Charge {
        made(amount, decline, true, WEEK)
    }

    /// A hold of `amount` on `terms`, recorded; its id.
    fn held_charge(ledger: &Ledger, amount: u64, terms: HoldTerms) -> String {
        let hold = made(amount, None, false, terms);
        let id = hold.id.clone();
        assert!(ledger.record(hold, None).is_ok());
        id
    }

    fn capture_of(amount: Option<u64>) -> CaptureRequest {
        CaptureRequest { amount }
    }

    /// How many of 20 threads, let go at once, found `attempt` true.
    fn race(attempt: impl Fn() -> bool + Sync) -> usize {
        let start = std::sync::Barrier::new(20);
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..20)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        attempt()
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|thread| thread.join())
                .filter(|joined| matches!(joined, Ok(true)))
                .count()
        })
    }

    /// What `ledger` refuses a capture of `charge` with, and then a
    /// refund of it, neither of them saying an amount.
    fn refusals(ledger: &Ledger, charge: &str) -> (Option<CaptureRefusal>, Option<RefundRefusal>) {
        (
            ledger.capture(charge, capture_of(None), None).err(),
            ledger
                .refund(refund_of(charge, None), None, RefundStatus::Succeeded)
                .err(),
        )
    }

    const DECLINE: Decline = Decline {
        code: "card_declined",
        decline_code: "generic_decline",
        message: "Your card was declined.",
    };

    #[test]
    fn a_hold_is_made_uncaptured_with_its_deadline() {
        let hold = made(1000, None, false, WEEK);
        assert!(hold.status == ChargeStatus::Succeeded && hold.paid && !hold.captured);
        assert_eq!(hold.amount_captured, 0);
        assert_eq!(hold.capture_deadline, Some(hold.created + 604_800));
        assert_eq!(
            hold.payment_method_details.card.capture_before,
            hold.capture_deadline
        );
        let hidden = made(
            1000,
            None,
            false,
            HoldTerms {
                show_deadline: false,
                ..WEEK
            },
        );
        assert!(hidden.capture_deadline.is_some());
        assert_eq!(hidden.payment_method_details.card.capture_before, None);
        let captured = charge(1000, None);
        assert!(captured.captured && captured.amount_captured == 1000);
        assert_eq!(captured.capture_deadline, None);
        let declined = made(1000, Some(DECLINE), false, WEEK);
        assert!(!declined.captured && declined.amount_captured == 0);
        assert_eq!(declined.capture_deadline, None);
    }

    #[test]
    fn a_hold_takes_one_capture_and_releases_the_rest() {
        let ledger = Ledger::default();
        let id = held_charge(&ledger, 1000, WEEK);
        let captured = ledger.capture(&id, capture_of(Some(600)), Some("c1".into()));
        assert!(captured.is_ok_and(|charge| charge.captured
            && charge.amount_captured == 600
            && charge.amount_refunded == 400
            && !charge.refunded));
        assert_eq!(
            ledger.capture(&id, capture_of(None), None).err(),
            Some(CaptureRefusal::AlreadyCaptured)
        );
        // What is left to refund is what was captured.
        assert_eq!(
            ledger
                .refund(refund_of(&id, Some(601)), None, RefundStatus::Succeeded)
                .err(),
            Some(RefundRefusal::TooLarge {
                requested: 601,
                unrefunded: 600
            })
        );
        let rest = ledger.refund(refund_of(&id, None), None, RefundStatus::Succeeded);
        assert!(rest.is_ok_and(|made| made.refund.amount == 600));
        assert!(
            ledger
                .charge_by_id(&id)
                .is_some_and(|charge| charge.refunded
                    && charge.captured
                    && charge.amount_refunded == 1000)
        );
        assert_eq!(
            ledger.captures(),
            [Capture {
                charge: id,
                amount: 600,
                idempotency_key: Some("c1".into()),
                created: ledger.captures().first().map_or(0, |c| c.created),
            }]
        );
        assert_eq!(ledger.stats().captures, 1);
    }

    #[test]
    fn concurrent_captures_make_exactly_one() {
        let ledger = Ledger::default();
        let id = held_charge(&ledger, 1000, WEEK);
        let made = race(|| ledger.capture(&id, capture_of(Some(100)), None).is_ok());
        assert_eq!(made, 1);
        assert_eq!(ledger.captures().len(), 1);
    }

    #[test]
    fn a_refund_releases_a_hold_whole_and_it_is_never_captured() {
        let ledger = Ledger::default();
        let id = held_charge(&ledger, 1000, WEEK);
        assert_eq!(
            ledger
                .refund(refund_of(&id, Some(500)), None, RefundStatus::Succeeded)
                .err(),
            Some(RefundRefusal::PartialRelease {
                requested: 500,
                held: 1000
            })
        );
        // A release is at once, whatever the configured refund status.
        let released = ledger.refund(refund_of(&id, Some(1000)), None, RefundStatus::Pending);
        assert!(released.is_ok_and(
            |made| made.refund.amount == 1000 && made.refund.status == RefundStatus::Succeeded
        ));
        assert!(
            ledger
                .charge_by_id(&id)
                .is_some_and(|charge| charge.refunded
                    && !charge.captured
                    && charge.amount_refunded == 1000
                    && charge.amount_captured == 0)
        );
        assert_eq!(
            refusals(&ledger, &id),
            (
                Some(CaptureRefusal::AlreadyRefunded),
                Some(RefundRefusal::AlreadyRefunded)
            )
        );
        assert!(ledger.captures().is_empty());
    }

    #[test]
    fn a_lapsed_hold_reads_released_and_takes_nothing() {
        let ledger = Ledger::default();
        let lapsed = held_charge(
            &ledger,
            1000,
            HoldTerms {
                expiry_secs: 0,
                show_deadline: true,
            },
        );
        for charge in [
            ledger.charge_by_id(&lapsed),
            ledger.search("order", "42", 0, 1).data.first().cloned(),
        ] {
            assert!(charge.is_some_and(|charge| charge.refunded
                && !charge.captured
                && charge.amount_refunded == 1000));
        }
        assert_eq!(
            refusals(&ledger, &lapsed),
            (
                Some(CaptureRefusal::Expired),
                Some(RefundRefusal::AlreadyRefunded)
            )
        );
        // The other refusals.
        let declined = made(1000, Some(DECLINE), false, WEEK);
        let declined_id = declined.id.clone();
        assert!(ledger.record(declined, None).is_ok());
        let captured = charge(1000, None);
        let captured_id = captured.id.clone();
        assert!(ledger.record(captured, None).is_ok());
        let held = held_charge(&ledger, 1000, WEEK);
        for (id, amount, refusal) in [
            (declined_id.as_str(), None, CaptureRefusal::ChargeFailed),
            (&captured_id, None, CaptureRefusal::AlreadyCaptured),
            ("ch_nope", None, CaptureRefusal::NoSuchCharge),
            (
                &held,
                Some(1001),
                CaptureRefusal::TooLarge {
                    requested: 1001,
                    held: 1000,
                },
            ),
        ] {
            assert_eq!(
                ledger.capture(id, capture_of(amount), None).err(),
                Some(refusal)
            );
        }
        assert!(ledger.captures().is_empty());
    }

    /// `charge`, through its ledger file line and back.
    fn reread(charge: &Charge) -> Result<Charge, serde_json::Error> {
        serde_json::from_value(serde_json::to_value(charge)?)
    }

    #[test]
    fn replayed_books_rebuild_captures_and_releases() -> Result<(), serde_json::Error> {
        let ledger = Ledger::default();
        let partly = held_charge(&ledger, 1000, WEEK);
        let released = held_charge(&ledger, 700, WEEK);
        let lapsed = held_charge(
            &ledger,
            500,
            HoldTerms {
                expiry_secs: 0,
                show_deadline: false,
            },
        );
        assert!(ledger.capture(&partly, capture_of(Some(600)), None).is_ok());
        assert!(
            ledger
                .refund(refund_of(&partly, Some(100)), None, RefundStatus::Succeeded)
                .is_ok()
        );
        assert!(
            ledger
                .refund(refund_of(&released, None), None, RefundStatus::Succeeded)
                .is_ok()
        );

        // What `LedgerFile::open` does with the lines it reads.
        let mut books = Books::default();
        {
            let live = ledger.lock();
            for entry in &live.charges {
                let charge = reread(&entry.charge)?;
                books.replay_charge(
                    charge,
                    entry.charge.created_ms,
                    entry.charge.capture_deadline,
                    None,
                );
            }
            for capture in &live.captures {
                assert_eq!(books.replay_capture(capture.clone()), Ok(()));
            }
            for entry in &live.refunds {
                assert_eq!(books.replay_refund(entry.refund.clone(), None), Ok(()));
            }
        }
        let now_ms = unix_now_ms();
        let state = |books: &mut Books, id: &str| {
            books.charge_mut(id).map(|charge| {
                let charge = charge.as_of(now_ms);
                (
                    charge.captured,
                    charge.amount_captured,
                    charge.amount_refunded,
                    charge.refunded,
                )
            })
        };
        assert_eq!(state(&mut books, &partly), Some((true, 600, 500, false)));
        assert_eq!(state(&mut books, &released), Some((false, 0, 700, true)));
        assert_eq!(state(&mut books, &lapsed), Some((false, 0, 500, true)));
        assert_eq!(books.counts(), (3, 2, 1));

        // A capture the charge could not have taken: not a file the sandbox wrote.
        let again = Capture {
            charge: partly.clone(),
            amount: 1,
            idempotency_key: None,
            created: 1,
        };
        assert!(
            books
                .replay_capture(again)
                .is_err_and(|error| error.contains("AlreadyCaptured"))
        );
        let orphan = Capture {
            charge: "ch_nope".into(),
            amount: 1,
            idempotency_key: None,
            created: 1,
        };
        assert!(books.replay_capture(orphan).is_err());
        Ok(())
    }

    #[test]
    fn a_charge_from_before_holds_reads_as_captured_when_made() -> Result<(), serde_json::Error> {
        // A version 1 ledger file's charge: no amount_captured, no
        // payment_method_details, no deadline beside it.
        let old = json!({"id": "ch_old", "amount": 4900, "amount_refunded": 100,
            "currency": "gbp", "status": "succeeded", "paid": true, "captured": true,
            "refunded": false, "livemode": false, "source": "tok_visa", "description": null,
            "metadata": {}, "created": 1_700_000_000, "failure_code": null,
            "failure_message": null});
        let mut books = Books::default();
        books.replay_charge(serde_json::from_value(old)?, 1_700_000_000_000, None, None);
        let charge = books.charge_mut("ch_old").map(|charge| charge.clone());
        let wire = serde_json::to_value(charge.as_ref().map(|charge| charge.as_of(0)))?;
        assert_eq!(
            (
                &wire["captured"],
                &wire["amount_captured"],
                &wire["amount_refunded"]
            ),
            (&json!(true), &json!(4900), &json!(0))
        );
        assert_eq!(
            wire["payment_method_details"],
            json!({"type": "card", "card": {}})
        );
        Ok(())
    }

    /// A ledger holding one captured charge of `amount`; its id.
    fn paid(amount: u64) -> (Ledger, String) {
        let ledger = Ledger::default();
        let made = charge(amount, None);
        let id = made.id.clone();
        assert!(ledger.record(made, None).is_ok());
        (ledger, id)
    }

    fn refund_of(charge: &str, amount: Option<u64>) -> RefundRequest {
        RefundRequest {
            charge: charge.into(),
            amount,
            reason: None,
            metadata: BTreeMap::new(),
            currency: None,
        }
    }

    #[test]
    fn refunds_never_exceed_the_charge() {
        let (ledger, id) = paid(1000);

        let first = ledger.refund(refund_of(&id, Some(600)), None, RefundStatus::Succeeded);
        assert!(first.is_ok_and(|made| made.refund.amount == 600 && made.refund.currency == "gbp"));
        assert_eq!(
            ledger
                .refund(refund_of(&id, Some(401)), None, RefundStatus::Succeeded)
                .err(),
            Some(RefundRefusal::TooLarge {
                requested: 401,
                unrefunded: 400
            })
        );
        // No amount: what is left.
        let rest = ledger.refund(
            refund_of(&id, None),
            Some("k".into()),
            RefundStatus::Succeeded,
        );
        assert!(rest.is_ok_and(|made| made.refund.amount == 400));
        assert_eq!(
            ledger
                .refund(refund_of(&id, None), None, RefundStatus::Succeeded)
                .err(),
            Some(RefundRefusal::AlreadyRefunded)
        );
        let found = ledger.search("order", "42", 0, 10);
        assert!(
            found
                .data
                .first()
                .is_some_and(|charge| charge.amount_refunded == 1000 && charge.refunded)
        );
        assert_eq!(ledger.stats().refunds, 2);
        assert_eq!(ledger.refunds().len(), 2);
    }

    #[test]
    fn concurrent_refunds_add_up_to_at_most_the_charge() {
        let (ledger, id) = paid(1000);
        let made = race(|| {
            ledger
                .refund(refund_of(&id, Some(300)), None, RefundStatus::Succeeded)
                .is_ok()
        });
        assert_eq!(made, 3);
        assert_eq!(ledger.stats().refunds, 3);
    }

    #[test]
    fn unknown_and_failed_charges_are_not_refunded() {
        let ledger = Ledger::default();
        let declined = charge(1000, Some(DECLINE));
        let id = declined.id.clone();
        assert!(ledger.record(declined, None).is_ok());
        assert_eq!(
            ledger
                .refund(refund_of(&id, None), None, RefundStatus::Succeeded)
                .err(),
            Some(RefundRefusal::ChargeFailed)
        );
        assert_eq!(
            ledger
                .refund(refund_of("ch_nope", None), None, RefundStatus::Succeeded)
                .err(),
            Some(RefundRefusal::NoSuchCharge)
        );
        assert_eq!(
            ledger
                .refund_page(Some("ch_nope"), CreatedRange::default(), 10, None)
                .err(),
            Some(ListRefusal::NoSuchCharge)
        );
        assert_eq!(ledger.stats().refunds, 0);
    }

    #[test]
    fn search_lags_and_pages_newest_first() {
        let ledger = Ledger::default();
        let ids: Vec<String> = (0..3)
            .map(|_| {
                let made = charge(100, None);
                let id = made.id.clone();
                assert!(ledger.record(made, None).is_ok());
                id
            })
            .collect();
        assert!(ledger.search("order", "42", 60_000, 10).data.is_empty());
        assert!(ledger.search("order", "43", 0, 10).data.is_empty());
        let page = ledger.search("order", "42", 0, 2);
        let found: Vec<&str> = page.data.iter().map(|charge| charge.id.as_str()).collect();
        assert_eq!(found, [ids[2].as_str(), ids[1].as_str()]);
        assert!(page.has_more);
        assert!(!ledger.search("order", "42", 0, 3).has_more);
    }

    #[test]
    fn a_succeeded_refund_fails_later_but_a_release_never_does() {
        let (ledger, id) = paid(1000);
        let whole = ledger.refund(refund_of(&id, None), None, RefundStatus::Succeeded);
        let Ok(Refunded { refund, charge }) = whole else {
            panic!("the refund was refused: {whole:?}");
        };
        assert!(charge.refunded && charge.amount_refunded == 1000);
        let failed = ledger.settle_refund(
            &refund.id,
            RefundStatus::Failed,
            Some("expired_or_canceled_card".into()),
        );
        assert!(
            failed.is_ok_and(|refund| refund.status == RefundStatus::Failed
                && refund.failure_reason.as_deref() == Some("expired_or_canceled_card"))
        );
        assert!(
            ledger
                .charge_by_id(&id)
                .is_some_and(|charge| !charge.refunded && charge.amount_refunded == 0)
        );
        // Failed is final; succeeded can only fail, not be canceled.
        assert_eq!(
            ledger
                .settle_refund(&refund.id, RefundStatus::Succeeded, None)
                .err(),
            Some(SettleRefusal::AlreadyFinal(RefundStatus::Failed))
        );
        let again = ledger.refund(refund_of(&id, Some(100)), None, RefundStatus::Succeeded);
        let Ok(Refunded { refund: again, .. }) = again else {
            panic!("the charge has its amount back: {again:?}");
        };
        assert_eq!(
            ledger
                .settle_refund(&again.id, RefundStatus::Canceled, None)
                .err(),
            Some(SettleRefusal::AlreadyFinal(RefundStatus::Succeeded))
        );
        // A hold's release cannot fail: the hold would be capturable again.
        let held = held_charge(&ledger, 500, WEEK);
        let release = ledger.refund(refund_of(&held, None), None, RefundStatus::Succeeded);
        let Ok(Refunded {
            refund: release, ..
        }) = release
        else {
            panic!("the release was refused: {release:?}");
        };
        assert_eq!(
            ledger
                .settle_refund(&release.id, RefundStatus::Failed, None)
                .err(),
            Some(SettleRefusal::Release)
        );
    }

    fn dispute_of(amount: Option<u64>, inquiry: bool) -> DisputeRequest {
        DisputeRequest {
            amount,
            reason: "fraudulent",
            inquiry,
        }
    }

    fn to(status: DisputeStatus) -> DisputeChange {
        DisputeChange {
            status,
            is_charge_refundable: None,
        }
    }

    #[test]
    fn a_chargeback_blocks_refunds_until_it_closes_and_an_inquiry_never_does() {
        let (ledger, id) = paid(1000);
        let inquiry = ledger.open_dispute(&id, dispute_of(None, true));
        let Ok((inquiry, disputed)) = inquiry else {
            panic!("the inquiry was refused: {inquiry:?}");
        };
        assert!(disputed.disputed && inquiry.amount == 1000);
        assert_eq!(
            ledger.open_dispute(&id, dispute_of(None, false)).err(),
            Some(DisputeRefusal::AlreadyDisputed(inquiry.id.clone()))
        );
        let refund = ledger.refund(refund_of(&id, Some(100)), None, RefundStatus::Succeeded);
        assert!(refund.is_ok(), "an inquiry leaves the charge refundable");
        let escalated = ledger.change_dispute(&inquiry.id, to(DisputeStatus::NeedsResponse));
        assert!(escalated.is_ok_and(|(before, after)| before.status
            == DisputeStatus::WarningNeedsResponse
            && after.status == DisputeStatus::NeedsResponse));
        assert_eq!(
            ledger
                .refund(refund_of(&id, Some(100)), None, RefundStatus::Succeeded)
                .err(),
            Some(RefundRefusal::Disputed)
        );
        assert!(
            ledger
                .change_dispute(&inquiry.id, to(DisputeStatus::Lost))
                .is_ok()
        );
        assert!(
            ledger
                .refund(refund_of(&id, Some(100)), None, RefundStatus::Succeeded)
                .is_ok()
        );
        assert_eq!(
            ledger
                .change_dispute(&inquiry.id, to(DisputeStatus::Won))
                .err(),
            Some(DisputeRefusal::Closed(DisputeStatus::Lost))
        );
        assert!(
            ledger
                .charge_by_id(&id)
                .is_some_and(|charge| charge.disputed && charge.amount_refunded == 200)
        );
        assert_eq!(ledger.stats().disputes, 1);
    }

    #[test]
    fn only_a_captured_charge_is_disputed_and_for_at_most_what_it_took() {
        let ledger = Ledger::default();
        let declined = charge(1000, Some(DECLINE));
        let declined_id = declined.id.clone();
        assert!(ledger.record(declined, None).is_ok());
        let held = held_charge(&ledger, 1000, WEEK);
        for id in [declined_id.as_str(), &held] {
            assert_eq!(
                ledger.open_dispute(id, dispute_of(None, false)).err(),
                Some(DisputeRefusal::NotCaptured)
            );
        }
        assert_eq!(
            ledger
                .open_dispute("ch_nope", dispute_of(None, false))
                .err(),
            Some(DisputeRefusal::NoSuchCharge)
        );
        assert!(ledger.capture(&held, capture_of(Some(600)), None).is_ok());
        assert_eq!(
            ledger
                .open_dispute(&held, dispute_of(Some(601), false))
                .err(),
            Some(DisputeRefusal::TooLarge {
                requested: 601,
                captured: 600
            })
        );
        assert!(
            ledger
                .refund(refund_of(&held, Some(100)), None, RefundStatus::Succeeded)
                .is_ok()
        );
        // What is left: captured 600, refunded 100.
        let left = ledger.open_dispute(&held, dispute_of(None, false));
        assert!(left.is_ok_and(|(dispute, _)| dispute.amount == 500));
        let refunded = charge(300, None);
        let refunded_id = refunded.id.clone();
        assert!(ledger.record(refunded, None).is_ok());
        assert!(
            ledger
                .refund(refund_of(&refunded_id, None), None, RefundStatus::Succeeded)
                .is_ok()
        );
        assert_eq!(
            ledger
                .open_dispute(&refunded_id, dispute_of(None, false))
                .err(),
            Some(DisputeRefusal::NothingLeft)
        );
        assert!(
            ledger
                .open_dispute(&refunded_id, dispute_of(Some(300), true))
                .is_ok()
        );
    }

    #[test]
    fn replayed_books_rebuild_disputes_and_refunds_failed_later() {
        let (ledger, id) = paid(1000);
        let made = ledger.refund(refund_of(&id, Some(400)), None, RefundStatus::Succeeded);
        let Ok(Refunded { refund, .. }) = made else {
            panic!("the refund was refused: {made:?}");
        };
        assert!(
            ledger
                .settle_refund(&refund.id, RefundStatus::Failed, None)
                .is_ok()
        );
        let opened = ledger.open_dispute(&id, dispute_of(None, false));
        let Ok((dispute, _)) = opened else {
            panic!("the dispute was refused: {opened:?}");
        };
        assert!(
            ledger
                .change_dispute(&dispute.id, to(DisputeStatus::UnderReview))
                .is_ok()
        );

        // What `LedgerFile::open` does with the compacted lines.
        let mut books = Books::default();
        {
            let live = ledger.lock();
            for entry in &live.charges {
                books.replay_charge(
                    entry.charge.clone(),
                    entry.charge.created_ms,
                    entry.charge.capture_deadline,
                    None,
                );
            }
            for entry in &live.refunds {
                assert_eq!(books.replay_refund(entry.refund.clone(), None), Ok(()));
            }
            for dispute in &live.disputes {
                assert_eq!(books.replay_dispute(dispute.clone()), Ok(()));
            }
            assert!(
                books.replay_dispute(dispute.clone()).is_err(),
                "a second one"
            );
        }
        let charge = books.charge_mut(&id).map(|charge| charge.clone());
        assert!(charge.is_some_and(|charge| charge.disputed && charge.amount_refunded == 0));
        assert!(books.blocks_refunds(&id));
        assert_eq!(books.dispute_count(), 1);
        // The append-only lines: a settlement of a succeeded refund, and a
        // dispute's change.
        let mut books = Books::default();
        {
            let live = ledger.lock();
            for entry in &live.charges {
                books.replay_charge(entry.charge.clone(), 0, None, None);
            }
        }
        let mut succeeded = refund.clone();
        succeeded.status = RefundStatus::Succeeded;
        succeeded.failure_reason = None;
        assert_eq!(books.replay_refund(succeeded, None), Ok(()));
        assert_eq!(
            books.replay_settlement(&refund.id, RefundStatus::Failed, None),
            Ok(())
        );
        assert_eq!(books.replay_dispute(dispute.clone()), Ok(()));
        let lost = dispute.changed(to(DisputeStatus::Lost), 1);
        let Ok(lost) = lost else {
            panic!("a chargeback can be lost: {lost:?}");
        };
        assert_eq!(books.replay_dispute_update(lost.clone()), Ok(()));
        assert!(
            books.replay_dispute_update(lost).is_err(),
            "a change of a closed dispute"
        );
        assert!(!books.blocks_refunds(&id));
    }

    #[test]
    fn lapsed_holds_are_found_once_each_from_when_they_lapsed() {
        let ledger = Ledger::default();
        let lapsed = held_charge(
            &ledger,
            1000,
            HoldTerms {
                expiry_secs: 0,
                show_deadline: true,
            },
        );
        let _live = held_charge(&ledger, 1000, WEEK);
        let now = unix_now_ms();
        let found = ledger.lapsed_holds(0, now, |_| true);
        let ids: Vec<&str> = found.iter().map(|charge| charge.id.as_str()).collect();
        assert_eq!(ids, [lapsed.as_str()]);
        assert!(
            found
                .iter()
                .all(|charge| charge.refunded && !charge.captured)
        );
        assert!(ledger.lapsed_holds(0, now, |id| id != lapsed).is_empty());
        // Lapsed before webhooks were on.
        assert!(ledger.lapsed_holds(now + 1, now + 1, |_| true).is_empty());
    }

    #[test]
    fn metadata_is_a_sorted_map() -> Result<(), serde_json::Error> {
        let metadata = Metadata::from(BTreeMap::from([
            ("b".to_owned(), "2".to_owned()),
            ("a".to_owned(), "1".to_owned()),
        ]));
        assert_eq!(
            (metadata.get("a"), metadata.get("b")),
            (Some("1"), Some("2"))
        );
        assert_eq!(metadata.get("c"), None);
        assert_eq!(serde_json::to_string(&metadata)?, r#"{"a":"1","b":"2"}"#);
        Ok(())
    }
}
