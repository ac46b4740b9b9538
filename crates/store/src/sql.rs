//! Every statement of the store, written once (in [`Statements::render`]),
//! and the one implementation of the `Store` port over them. The only
//! branches on the [`Dialect`] are where behaviour truly differs:
//! PostgreSQL's one-statement claim and finish, MySQL's duplicate-key claim,
//! read-back (no `RETURNING`) and `DELETE .. LIMIT`, SQLite's single writer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::charge::CustomerId;
use payments_domain::charge::{Charge, ChargeStatus};
use payments_domain::events::{Event, EventQuery, NewEvent};
use payments_domain::hold::{Capture, HoldAction, HoldState};
use payments_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, LeaseToken, RecordId, RecordState, StoredResponse,
};
use payments_domain::inbox::{Dispute, InboxState, Local, Recorded};
use payments_domain::list::{ChargeQuery, Cursor, Page};
use payments_domain::provider::{OperationKind, ProviderObject};
use payments_domain::refund::Refund;
use payments_domain::store::{
    Application, Applied, AttemptRecorded, CaptureOutcome, ChargeOutcome, Claim, ClaimAge,
    ClaimOutcome, Finish, FinishOutcome, NewLease, Operation, Orphan, Outcome, PrunedEvents, Store,
    StoreError, Unsettled,
};
use payments_domain::webhook::{Attempted, Delivery, DeliveryState, Endpoint};
use sqlx::migrate::Migrate;
use sqlx::query::Query;
use sqlx::{
    AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool,
    Row, Transaction, Type,
};

use crate::batch::{Batcher, BoxFut};
use crate::dialect::Dialect;
use crate::lane::Lane;
use crate::rows::{CaptureRow, ChargeRow, RecordRow, RefundRow, decode, stored_status};
use crate::{Error, millis, run};

/// The columns of a new `charges` row, in the order `charge_values` binds
/// them, then its three times (created, updated, provider called: one).
const CHARGE_COLUMNS: &str = "id, customer_id, amount_cents, currency, card_token, description, \
     metadata, status, provider_key, gateway_charge_id, decline_code, idempotency_key, hold, \
     created_at, updated_at, provider_called_at";

/// A `charges` row as `ChargeRow` reads it.
const CHARGE_ROW: &str = "id, {customer_id customer_id}, amount_cents, currency, card_token, \
     description, {metadata metadata}, status, provider_key, gateway_charge_id, decline_code, \
     amount_refunded, idempotency_key, hold, amount_captured, capture_before, created_at, \
     updated_at";

/// A `captures` row (`k`) as `CaptureRow` reads it, with its charge's (`c`)
/// provider id.
const CAPTURE_ROW: &str = "k.id, k.action, k.charge_id, {customer_id k.customer_id}, \
     k.requested_by, k.requested_by_role, k.amount_cents, k.currency, k.status, k.provider_key, \
     c.gateway_charge_id, k.gateway_id, k.failure_code, k.created_at, k.updated_at";

/// The columns of a new `captures` row, in the order `capture_values`
/// binds them, then its three times.
const CAPTURE_COLUMNS: &str = "id, action, charge_id, customer_id, requested_by, \
     requested_by_role, amount_cents, currency, status, provider_key, created_at, updated_at, \
     provider_called_at";

/// The three tables of operations, by [`table_of`].
const OPERATION_TABLES: [&str; 3] = ["charges", "refunds", "captures"];

/// Which of [`OPERATION_TABLES`] holds `operation`.
fn table_of(operation: &Operation) -> usize {
    match operation {
        Operation::Charge(_) => 0,
        Operation::Refund(_) => 1,
        Operation::Capture(_) => 2,
    }
}

/// A refund fits in what was captured: all of a charge captured when made
/// (`amount_captured` NULL), a hold's captured amount.
const CAPTURED: &str = "COALESCE(amount_captured, amount_cents)";
/// A charge whose money was taken: captured when made, or a captured hold.
const REFUNDABLE: &str = "status = 'succeeded' AND (hold IS NULL OR hold = 'captured')";

/// A `refunds` row (`r`) as `RefundRow` reads it, with its charge's (`c`)
/// provider id.
const REFUND_ROW: &str = "r.id, r.charge_id, {customer_id r.customer_id}, r.amount_cents, \
     r.currency, r.reason, {metadata r.metadata}, r.status, r.provider_key, c.gateway_charge_id, \
     r.gateway_refund_id, r.failure_code, r.requested_by, r.requested_by_role, r.created_at, \
     r.updated_at";

/// Which charges or refunds a settlement may change, by their status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// Any: a finish, which the record's lease already makes exclusive.
    Any,
    /// Only one still `pending`: a driver that lost its record, a keyless charge.
    Pending,
    /// Only one still `unknown`, or `pending` at the provider (it answered
    /// `pending` with its id, `provider_id`: a refund): reconciliation.
    Unsettled,
}

impl Guard {
    const ALL: [Guard; 3] = [Guard::Any, Guard::Pending, Guard::Unsettled];

    /// The condition on a row whose provider id column is `provider_id`.
    fn condition(self, provider_id: &str) -> String {
        match self {
            Self::Any => String::new(),
            Self::Pending => " AND status = 'pending'".to_owned(),
            Self::Unsettled => format!(
                " AND (status = 'unknown' OR (status = 'pending' AND {provider_id} IS NOT NULL))"
            ),
        }
    }
}

/// The three kinds of list page: the newest, after a cursor, before one.
fn page_index(page: &Page) -> usize {
    match page.cursor {
        None => 0,
        Some(Cursor::After(_)) => 1,
        Some(Cursor::Before(_)) => 2,
    }
}

/// The keyset condition and order of each kind of page over `alias`'s
/// `(created_at, id)` in `table`: the cursor's position is read from its
/// row, in the same statement.
fn keyset(alias: &str, table: &str) -> [(String, &'static str); 3] {
    let cursor = |op| {
        format!(
            " AND ({alias}.created_at, {alias}.id) {op} \
             (SELECT created_at, id FROM {table} WHERE id = {{p}})"
        )
    };
    [
        (String::new(), "DESC"),
        (cursor("<"), "DESC"),
        (cursor(">"), "ASC"),
    ]
}

/// The columns of a new `refunds` row, in the order `refund_values` binds
/// them, then its three times.
const REFUND_COLUMNS: &str = "id, charge_id, customer_id, amount_cents, currency, reason, \
     metadata, status, provider_key, requested_by, requested_by_role, created_at, updated_at, \
     provider_called_at";

/// A refund the provider answered `pending` (with its id), which
/// reconciliation polls until it is final.
const PENDING_AT_PROVIDER: &str = "(r.status = 'pending' AND r.gateway_refund_id IS NOT NULL)";

/// Reconciliation's order: least recently looked at (or, never looked at,
/// unsettled) first, so that what a pass cannot settle goes behind the rest.
const LEAST_RECENTLY_LOOKED_AT: &str = "ORDER BY COALESCE(looked_at, updated_at), id";
const LEAST_RECENTLY_LOOKED_AT_R: &str = "ORDER BY COALESCE(r.looked_at, r.updated_at), r.id";

/// The columns a claim writes to a new `idempotent_requests` row.
const NEW_RECORD_COLUMNS: &str = "idempotency_key, route, customer_id, request_hash, state, \
     lease_token, locked_until, charge_id, refund_id, created_at, expires_at";

/// Claims loop at most this often when the row they saw changes under them
/// (reclaimed by another caller, or pruned between the insert and the read).
const CLAIM_ATTEMPTS: usize = 5;

/// The statements, rendered once for a dialect when a store is opened.
#[derive(Debug)]
pub(crate) struct Statements {
    record_by_key: String,
    record_by_id: String,
    expired_in_progress: String,
    insert_record: String,
    stamp_by_key: String,
    reclaim: String,
    insert_claimed_charge: String,
    insert_claimed_refund: String,
    insert_claimed_capture: String,
    take_hold: String,
    hold_state: String,
    hold_follows: String,
    settle_capture: [String; 3],
    unsettled_captures: String,
    capture: String,
    count_holds: String,
    refundable: String,
    reserve: String,
    refuse_record: String,
    insert_charge: String,
    charge_created_at: String,
    take_over: String,
    release: String,
    finish_record: String,
    settle: [String; 3],
    settle_refund: [String; 3],
    rewrite_abandoned: [String; 2],
    unsettled_charges: String,
    unsettled_refunds: String,
    refunded: String,
    unreserve: String,
    provider_called: [String; 3],
    looked_at: [String; 3],
    claim_expired: String,
    candidate: String,
    lease_by_id: String,
    prune: String,
    count_prunable: String,
    charge: String,
    refund: String,
    /// One customer's pages, then every customer's.
    list_charges: [[String; 3]; 2],
    list_refunds: [String; 3],
    applied_migrations: String,
    now: String,
    insert_orphan: String,
    settle_orphans: String,
    open_orphans: String,
    forget_record: String,
    forget_operation: [String; 3],
    insert_setting: String,
    setting: String,
    claim_or_read: Option<String>,
    finish_one: Option<String>,
    write_probe: Option<String>,
    outbox: outbox::OutboxStatements,
    inbox: inbox::InboxStatements,
}

impl Statements {
    /// Each statement in the dialect's words; `{..}` are the dialect's
    /// pieces (see [`crate::dialect::render`]).
    fn render<D: Dialect>() -> Self {
        let r = crate::dialect::render::<D>;
        let finish = |also: &str| {
            format!(
                "UPDATE idempotent_requests SET state = $1, response_status = $2, \
                 response_body = $3, response_content_type = $4, response_location = $5, \
                 completed_at = {{now}}, lease_token = NULL, locked_until = NULL{also} \
                 WHERE id = $6 AND state = 'in_progress' AND lease_token = $7"
            )
        };
        let finish_record = finish("");
        let lease = "UPDATE idempotent_requests SET lease_token = $1, locked_until = {now} + {ms}";
        // What a takeover may take: a lease expired, and claimed less than
        // the bound milliseconds ago (the flag bound true) or not (false).
        let expired = "state = 'in_progress' AND locked_until <= {now} \
            AND (created_at > {now} - {ms}) = {p}";
        let pick = format!(
            "SELECT id FROM idempotent_requests WHERE {expired} \
             ORDER BY locked_until LIMIT 1{{skip_locked}}"
        );
        let prunable = "state = 'complete' AND expires_at <= {now}";
        Self {
            record_by_key: r("SELECT {record} FROM idempotent_requests \
                WHERE idempotency_key = $1 AND route = $2"),
            record_by_id: r("SELECT {record} FROM idempotent_requests WHERE id = $1"),
            expired_in_progress: r("SELECT {record} FROM idempotent_requests \
                WHERE state = 'in_progress' AND locked_until <= {now} \
                ORDER BY locked_until LIMIT $1"),
            insert_record: r(&format!(
                "INSERT INTO idempotent_requests ({NEW_RECORD_COLUMNS}) VALUES ({{new_record}}){}",
                if D::RETURNING {
                    " ON CONFLICT (idempotency_key, route) DO NOTHING RETURNING id, created_at"
                } else {
                    ""
                }
            )),
            // Our own row only: a claim that does not find its lease token
            // lost its write (see `Error::WriteLost`).
            stamp_by_key: r("SELECT id, created_at FROM idempotent_requests \
                WHERE idempotency_key = $1 AND route = $2 AND lease_token = $3"),
            // Past its TTL with a final answer a record behaves as absent:
            // reclaimed, but only if it still is that record.
            reclaim: r(&format!(
                "UPDATE idempotent_requests SET customer_id = $1, request_hash = $2, \
                 state = 'in_progress', lease_token = $3, locked_until = {{now}} + {{ms}}, \
                 charge_id = $5, refund_id = $6, response_status = NULL, response_body = NULL, \
                 response_content_type = NULL, response_location = NULL, \
                 created_at = {{now}}, completed_at = NULL, expires_at = {{now}} + {{ms}} \
                 WHERE id = $8 AND {prunable}{{returning id, created_at}}"
            )),
            insert_claimed_charge: r(&format!(
                "INSERT INTO charges ({CHARGE_COLUMNS}) SELECT {{charge}}, created_at, \
                 created_at, created_at FROM idempotent_requests WHERE id = $14"
            )),
            insert_claimed_capture: r(&format!(
                "INSERT INTO captures ({CAPTURE_COLUMNS}) SELECT {{capture}}, created_at, \
                 created_at, created_at FROM idempotent_requests WHERE id = $11"
            )),
            // The guard that makes a capture against a cancel (or a second
            // capture) impossible, whatever was read: the hold is taken by
            // the one operation that finds it authorized, free, and (for a
            // capture) lapsing later than the margin from the database's now.
            take_hold: r(
                "UPDATE charges SET hold_action = $1, updated_at = {now} WHERE id = $2 \
                AND status = 'succeeded' AND hold = 'requires_capture' \
                AND hold_action IS NULL AND capture_before > {now} + {ms}",
            ),
            // Why a hold could not be taken, its row locked.
            hold_state: r(&format!(
                "SELECT status, hold, hold_action, {} AS lapses_later FROM charges \
                 WHERE id = $2{{for_update}}",
                D::flag("capture_before > {now} + {ms}")
            )),
            // A capture's or cancel's charge follows its outcome; only the
            // operation that took the hold gives it back.
            hold_follows: r(
                "UPDATE charges SET hold = $1, amount_captured = COALESCE($2, amount_captured), \
                hold_action = NULL, updated_at = {now} WHERE id = $3 AND hold_action = $4",
            ),
            settle_capture: Guard::ALL.map(|guard| {
                r(&format!(
                    "UPDATE captures SET status = $1, gateway_id = $2, \
                     failure_code = $3, updated_at = {{now}} WHERE id = $4{}",
                    guard.condition("NULL")
                ))
            }),
            unsettled_captures: r(&format!(
                "SELECT {CAPTURE_ROW}, {} AS lag_passed \
                 FROM captures k JOIN charges c ON c.id = k.charge_id \
                 WHERE k.status = 'unknown' ORDER BY COALESCE(k.looked_at, k.updated_at), k.id \
                 LIMIT {{p}}",
                D::flag("k.provider_called_at <= {now} - {ms}")
            )),
            capture: r(&format!(
                "SELECT {CAPTURE_ROW} FROM captures k JOIN charges c ON c.id = k.charge_id \
                 WHERE k.id = $1"
            )),
            count_holds: r("SELECT status, hold, COUNT(*) FROM charges \
                WHERE hold IS NOT NULL GROUP BY status, hold"),
            insert_claimed_refund: r(&format!(
                "INSERT INTO refunds ({REFUND_COLUMNS}) SELECT {{refund}}, created_at, \
                 created_at, created_at FROM idempotent_requests WHERE id = $12"
            )),
            // What is left to refund, the row locked for the reservation.
            refundable: r(&format!(
                "SELECT {CAPTURED} - amount_reserved FROM charges \
                WHERE id = $1 AND {REFUNDABLE}{{for_update}}"
            )),
            // The guard that makes an over-refund impossible, whatever was read.
            // ... and no dispute forbids it (`inbox::BLOCKS_REFUNDS`).
            reserve: r(&format!(
                "UPDATE charges SET amount_reserved = amount_reserved + $1 \
                WHERE id = $2 AND {REFUNDABLE} AND amount_reserved + $3 <= {CAPTURED} \
                AND NOT EXISTS (SELECT 1 FROM disputes \
                  WHERE disputes.charge_id = charges.id AND {})",
                inbox::BLOCKS_REFUNDS
            )),
            refuse_record: r(&finish(", refund_id = NULL")),
            // One reading of the clock for both times.
            insert_charge: r(&format!(
                "INSERT INTO charges ({CHARGE_COLUMNS}) SELECT {{charge}}, at, at, at \
                 FROM (SELECT {{now}} AS at) AS clock{{returning created_at}}"
            )),
            charge_created_at: r("SELECT created_at FROM charges WHERE id = $1"),
            take_over: r(&format!(
                "{lease} WHERE id = $3 AND lease_token = $4 AND {expired}"
            )),
            release: r("UPDATE idempotent_requests SET locked_until = {now} \
                WHERE id = $1 AND state = 'in_progress' AND lease_token = $2"),
            // Outside a finish, only a charge still pending is settled.
            settle: Guard::ALL.map(|guard| {
                r(&format!(
                    "UPDATE charges SET status = $1, gateway_charge_id = $2, \
                     decline_code = $3, capture_before = COALESCE({{at_ms}}, capture_before), \
                     updated_at = {{now}} WHERE id = $5{}",
                    guard.condition("gateway_charge_id")
                ))
            }),
            settle_refund: Guard::ALL.map(|guard| {
                r(&format!(
                    "UPDATE refunds SET status = $1, gateway_refund_id = $2, \
                     failure_code = $3, updated_at = {{now}} WHERE id = $4{}",
                    guard.condition("gateway_refund_id")
                ))
            }),
            // The abandoned answer of a reconciled operation becomes its
            // real one, kept a full TTL from now (the record may be past
            // its expiry: the client's retry must still find it).
            rewrite_abandoned: ["charge_id = $8 AND refund_id IS NULL", "refund_id = $8"].map(
                |op| {
                    r(&format!(
                        "UPDATE idempotent_requests SET state = $1, response_status = $2, \
                         response_body = $3, response_content_type = $4, \
                         response_location = $5, completed_at = {{now}}, \
                         expires_at = {{now}} + {{ms}} WHERE state = $7 AND {op}"
                    ))
                },
            ),
            unsettled_charges: r(&format!(
                "SELECT {CHARGE_ROW}, {} AS lag_passed FROM charges \
                 WHERE status = 'unknown' {LEAST_RECENTLY_LOOKED_AT} LIMIT {{p}}",
                D::flag("provider_called_at <= {now} - {ms}")
            )),
            unsettled_refunds: r(&format!(
                "SELECT {REFUND_ROW}, {} AS lag_passed \
                 FROM refunds r JOIN charges c ON c.id = r.charge_id \
                 WHERE (r.status = 'unknown' OR {PENDING_AT_PROVIDER}) \
                 {LEAST_RECENTLY_LOOKED_AT_R} LIMIT {{p}}",
                D::flag("r.provider_called_at <= {now} - {ms}")
            )),
            refunded: r(
                "UPDATE charges SET amount_refunded = amount_refunded + $1, \
                updated_at = {now} WHERE id = $2",
            ),
            unreserve: r(
                "UPDATE charges SET amount_reserved = amount_reserved - $1, \
                updated_at = {now} WHERE id = $2",
            ),
            provider_called: OPERATION_TABLES.map(|table| {
                r(&format!(
                    "UPDATE {table} SET provider_called_at = {{now}} WHERE id = $1"
                ))
            }),
            looked_at: OPERATION_TABLES.map(|table| {
                r(&format!(
                    "UPDATE {table} SET looked_at = {{now}} WHERE id = $1"
                ))
            }),
            // The candidate is picked, then re-checked as it is once locked.
            claim_expired: r(&format!(
                "{lease} WHERE id = ({pick}) AND {expired} RETURNING {{record}}"
            )),
            candidate: r(&pick),
            lease_by_id: r(&format!("{lease} WHERE id = $3")),
            prune: r(&if D::DELETE_LIMIT {
                format!("DELETE FROM idempotent_requests WHERE {prunable} LIMIT $1")
            } else {
                format!(
                    "DELETE FROM idempotent_requests WHERE id IN (SELECT id \
                     FROM idempotent_requests WHERE {prunable} LIMIT $1{{skip_locked}})"
                )
            }),
            count_prunable: r(&format!(
                "SELECT COUNT(*) FROM idempotent_requests WHERE {prunable}"
            )),
            charge: r(&format!("SELECT {CHARGE_ROW} FROM charges WHERE id = $1")),
            refund: r(&format!(
                "SELECT {REFUND_ROW} FROM refunds r JOIN charges c ON c.id = r.charge_id \
                 WHERE r.id = $1"
            )),
            // Every filter is bound, NULL when not given; the index on
            // (customer_id, created_at, id) gives the order of one
            // customer's list, the one on (created_at, id) of everyone's
            // (the back office's, with no `customer_id = ` condition).
            list_charges: [true, false].map(|one_customer| {
                let owner = if one_customer {
                    "customer_id = {p}"
                } else {
                    "TRUE"
                };
                keyset("c", "charges").map(|(after, order)| {
                    r(&format!(
                        "SELECT {CHARGE_ROW} FROM charges c WHERE {owner}{after} \
                         AND ({{p}} IS NULL OR status = {{p}}) \
                         AND ({{p}} IS NULL OR (CASE WHEN status = 'succeeded' \
                           THEN COALESCE(hold, 'captured') ELSE 'captured' END) = {{p}}) \
                         AND ({{p}} IS NULL OR created_at >= {{at_ms}}) \
                         AND ({{p}} IS NULL OR created_at < {{at_ms}}) \
                         AND ({{p}} IS NULL OR {{json_text metadata}} = {{p}}) \
                         AND ({{p}} IS NULL OR idempotency_key = {{p}}) \
                         ORDER BY created_at {order}, id {order} LIMIT {{p}}"
                    ))
                })
            }),
            list_refunds: keyset("r", "refunds").map(|(after, order)| {
                r(&format!(
                    "SELECT {REFUND_ROW} FROM refunds r JOIN charges c ON c.id = r.charge_id \
                     WHERE r.charge_id = {{p}}{after} \
                     ORDER BY r.created_at {order}, r.id {order} LIMIT {{p}}"
                ))
            }),
            applied_migrations: r("SELECT version FROM _sqlx_migrations WHERE success = TRUE"),
            // A known key's record comes back and nothing is attempted; a
            // fresh key inserts the record and its pending charge (the
            // charge takes the record's `created_at`). No row: the key
            // exists but this statement's snapshot cannot see it.
            now: r("SELECT {now}"),
            insert_orphan: r(
                "INSERT INTO orphans (provider_id, kind, operation_id, amount_cents, \
                currency, status, provider_created, found_at) \
                VALUES ($1, $2, $3, $4, $5, $6, $7, {now})",
            ),
            // An orphan is settled once its operation has a row again.
            settle_orphans: r(
                "UPDATE orphans SET settled_at = {now} WHERE settled_at IS NULL \
                AND ((kind = 'charge' AND EXISTS (SELECT 1 FROM charges c \
                      WHERE c.id = orphans.operation_id)) \
                  OR (kind = 'refund' AND EXISTS (SELECT 1 FROM refunds r \
                      WHERE r.id = orphans.operation_id)))",
            ),
            open_orphans: r(
                "SELECT provider_id, kind, operation_id, amount_cents, currency, \
                status, provider_created, found_at FROM orphans WHERE settled_at IS NULL \
                ORDER BY found_at, provider_id LIMIT $1",
            ),
            forget_record: r("DELETE FROM idempotent_requests \
                WHERE id = $1 AND state = 'in_progress' AND lease_token = $2"),
            forget_operation: OPERATION_TABLES.map(|table| {
                r(&format!(
                    "DELETE FROM {table} WHERE id = $1 AND status = 'pending'"
                ))
            }),
            insert_setting: r("INSERT INTO settings (name, value) VALUES ($1, $2)"),
            setting: r("SELECT value FROM settings WHERE name = $1"),
            claim_or_read: D::ONE_STATEMENT.then(|| {
                r(&format!(
                    "WITH existing AS (SELECT {{record}} FROM idempotent_requests \
                       WHERE idempotency_key = $1 AND route = $2), \
                     claimed AS (INSERT INTO idempotent_requests ({NEW_RECORD_COLUMNS}) \
                       SELECT {{new_record}} WHERE NOT EXISTS (SELECT 1 FROM existing) \
                       ON CONFLICT (idempotency_key, route) DO NOTHING RETURNING {{record}}), \
                     charge AS (INSERT INTO charges ({CHARGE_COLUMNS}) \
                       SELECT {{charge}}, created_at, created_at, created_at FROM claimed) \
                     SELECT true AS claimed, * FROM claimed \
                     UNION ALL SELECT false, * FROM existing"
                ))
            }),
            // The record (only under this lease), its charge and the
            // charge's event together.
            finish_one: D::ONE_STATEMENT.then(|| {
                r(&format!(
                    "WITH done AS ({finish_record} RETURNING charge_id), \
                     settled AS (UPDATE charges SET status = $8, gateway_charge_id = $9, \
                       decline_code = $10, capture_before = COALESCE({{at_ms}}, capture_before), \
                       updated_at = {{now}} FROM done \
                       WHERE charges.id = done.charge_id AND charges.id = $12 \
                       RETURNING charges.id), \
                     event AS (INSERT INTO events (id, type, object_id, api_version, \
                       created_at, data) SELECT $13, $14, $15, $16, {{now}}, $17 FROM settled \
                       ON CONFLICT (id) DO NOTHING) \
                     SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM settled)"
                ))
            }),
            finish_record: r(&finish_record),
            // SQLite's readiness while its writer is failing: a committed
            // write that changes nothing (the row keeps its values), to a
            // row every migrated database has.
            outbox: outbox::OutboxStatements::render::<D>(),
            inbox: inbox::InboxStatements::render::<D>(),
            write_probe: D::SINGLE_WRITER.then(|| {
                r("UPDATE _sqlx_migrations SET success = success \
                   WHERE version = (SELECT MAX(version) FROM _sqlx_migrations)")
            }),
        }
    }
}

/// A `Store` on one SQL database: a pool for reads, and the pool writes go
/// through (the same pool, except on SQLite: one connection).
pub struct SqlStore<D: Dialect> {
    pool: Pool<D::Db>,
    writer: Pool<D::Db>,
    sql: Arc<Statements>,
    cluster: Option<&'static str>,
    /// SQLite: claims and finishes committed in batches (group commit).
    batch: Option<Batcher<D::Db>>,
    /// SQLite: whether its writer failed (see [`WriterHealth`]).
    writer_health: Arc<WriterHealth>,
    /// SQLite's batches: the events of their finishes, written by the batch
    /// in one statement.
    deferred: Option<Arc<outbox::DeferredEvents>>,
    /// PostgreSQL: connections kept between one-statement claims and
    /// finishes, which go back without sqlx's ping (see [`crate::lane`]).
    lane: Option<Arc<Lane<D::Db>>>,
}

/// Whether the writer connection was found inside a transaction that
/// SQLite had rolled back itself (so it was replaced), and no readiness
/// probe's write has committed since: the store is not ready meanwhile.
#[derive(Debug, Default)]
pub(crate) struct WriterHealth {
    failing: AtomicBool,
}

impl WriterHealth {
    pub(crate) fn failed(&self) {
        self.failing.store(true, Ordering::Release);
    }

    fn failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    fn restored(&self) {
        self.failing.store(false, Ordering::Release);
    }
}

impl<D: Dialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            writer: self.writer.clone(),
            sql: self.sql.clone(),
            cluster: self.cluster,
            batch: self.batch.clone(),
            writer_health: self.writer_health.clone(),
            deferred: self.deferred.clone(),
            lane: self.lane.clone(),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("dialect", &std::any::type_name::<D>())
            .field("pool", &self.pool)
            .finish()
    }
}

impl<D: Dialect> SqlStore<D> {
    pub(crate) fn new(pool: Pool<D::Db>, writer: Pool<D::Db>) -> Self {
        Self {
            pool,
            writer,
            sql: Arc::new(Statements::render::<D>()),
            cluster: None,
            batch: None,
            writer_health: Arc::default(),
            deferred: None,
            lane: None,
        }
    }

    /// The same store, its one-statement claims and finishes on a lane of
    /// its pool of `max_connections` (none when the pool is too small).
    pub(crate) fn with_lane(self, max_connections: u32) -> Self {
        Self {
            lane: Lane::over(&self.pool, max_connections),
            ..self
        }
    }

    /// The same store, its writer's failures reported to `health`.
    pub(crate) fn watched(self, health: Arc<WriterHealth>) -> Self {
        Self {
            writer_health: health,
            ..self
        }
    }

    /// The same store, on the multi-primary cluster `name`.
    pub(crate) fn on_cluster(self, name: &'static str) -> Self {
        Self {
            cluster: Some(name),
            ..self
        }
    }

    /// SQLite's group commit so far: batches committed, and the claims and
    /// finishes they carried (`None` when writes are not batched).
    pub fn write_batches(&self) -> Option<(u64, u64)> {
        self.batch.as_ref().map(Batcher::committed)
    }

    pub(crate) fn lane(&self) -> Option<&Lane<D::Db>> {
        self.lane.as_deref()
    }

    /// The pool, for tests and tools that count rows.
    pub fn pool(&self) -> &Pool<D::Db> {
        &self.pool
    }
}

type Q<'q, D> = Query<'q, <D as Dialect>::Db, <<D as Dialect>::Db as Database>::Arguments>;

/// A charge as stored: both its times the database's `at`.
fn stored(charge: &Charge, at: DateTime<Utc>) -> Charge {
    Charge {
        created_at: at,
        updated_at: at,
        ..charge.clone()
    }
}

/// A won claim: its record, and its operation as stored (stamped with the
/// record's time; a refund with the amount reserved).
fn claimed(record_id: RecordId, operation: Operation) -> ClaimOutcome {
    let operation = Box::new(operation);
    ClaimOutcome::Claimed {
        record_id,
        operation,
    }
}

/// A refund as stored by its claim.
fn stored_refund(refund: &Refund, amount_cents: i64, at: DateTime<Utc>) -> Refund {
    Refund {
        amount_cents,
        created_at: at,
        updated_at: at,
        ..refund.clone()
    }
}

/// The driver capabilities the generic code needs, written once.
macro_rules! sql_impl {
    ($(#[$attr:meta])* $($port:ident for)? { $($body:tt)* }) => {
        $(#[$attr])*
        // The bounds name this crate's row types; every dialect's store
        // meets them.
        #[allow(private_bounds)]
        impl<D: Dialect> $($port for)? SqlStore<D>
        where
            for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
            <D::Db as Database>::Connection: Migrate,
            <D::Db as Database>::Arguments: IntoArguments<D::Db>,
            for<'a> &'a str: Encode<'a, D::Db> + Type<D::Db>,
            for<'a> String: Encode<'a, D::Db> + Decode<'a, D::Db> + Type<D::Db>,
            for<'a> Option<String>: Encode<'a, D::Db> + Type<D::Db>,
            for<'a> i64: Encode<'a, D::Db> + Decode<'a, D::Db> + Type<D::Db>,
            for<'a> i32: Encode<'a, D::Db> + Type<D::Db>,
            for<'a> bool: Encode<'a, D::Db> + Decode<'a, D::Db> + Type<D::Db>,
            for<'a> D::Ts: Decode<'a, D::Db> + Type<D::Db>,
            for<'r> RecordRow<D::Ts>: FromRow<'r, <D::Db as Database>::Row>,
            for<'r> ChargeRow<D::Ts>: FromRow<'r, <D::Db as Database>::Row>,
            for<'r> RefundRow<D::Ts>: FromRow<'r, <D::Db as Database>::Row>,
            for<'a> Option<&'a str>: Encode<'a, D::Db> + Type<D::Db>,
            for<'a> Option<i64>: Encode<'a, D::Db> + Decode<'a, D::Db> + Type<D::Db>,
            usize: ColumnIndex<<D::Db as Database>::Row>,
            for<'a> &'a str: ColumnIndex<<D::Db as Database>::Row>,
        {
            $($body)*
        }
    };
}

mod inbox;
mod outbox;

sql_impl! {{
    /// The same store, its claims and finishes committed in batches of at
    /// most `most` (see [`crate::batch`]); 1 commits each on its own.
    pub(crate) fn batched(self, most: u32) -> Self {
        let most = usize::try_from(most).unwrap_or(usize::MAX);
        let sql = self.sql.outbox.insert_deferred.clone().filter(|_| most > 1);
        let deferred = sql.map(|sql| Arc::new(outbox::DeferredEvents::new(sql)));
        let batch = deferred.clone().map(|deferred| {
            Batcher::start(self.writer.clone(), D::BEGIN_WRITE, most, deferred)
        });
        Self { batch, deferred, ..self }
    }

    fn q<'q>(sql: &'q str) -> Q<'q, D> {
        sqlx::query(AssertSqlSafe(sql))
    }

    async fn begin_write(&self) -> Result<Transaction<'static, D::Db>, Error> {
        Ok(self.writer.begin_with(D::BEGIN_WRITE).await?)
    }

    fn record(row: &<D::Db as Database>::Row) -> Result<IdempotencyRecord, Error> {
        IdempotencyRecord::try_from(RecordRow::<D::Ts>::from_row(row)?)
    }

    /// The record a query returns, if any.
    async fn read_record<'e>(
        e: impl Executor<'e, Database = D::Db>,
        q: Q<'_, D>,
    ) -> Result<Option<IdempotencyRecord>, Error> {
        q.fetch_optional(e).await?.as_ref().map(Self::record).transpose()
    }

    /// The statement `sql` with the claim's key and route bound.
    fn keyed<'q>(sql: &'q str, c: &'q Claim) -> Q<'q, D> {
        Self::keyed_by(sql, c.key.as_str(), c.route)
    }

    /// `sql` with a key and a route bound.
    fn keyed_by<'q>(sql: &'q str, key: &'q str, route: &'q str) -> Q<'q, D> {
        Self::q(sql).bind(key).bind(route)
    }

    /// A new record's nine values (`{new_record}` in `Statements::render`).
    fn new_record<'q>(q: Q<'q, D>, c: &'q Claim) -> Q<'q, D> {
        Self::claimant(q.bind(c.key.as_str()).bind(c.route), c)
    }

    /// The twelve values of a new charge, in [`CHARGE_COLUMNS`] order.
    fn charge_values<'q>(q: Q<'q, D>, c: &'q Charge) -> Q<'q, D> {
        let metadata = serde_json::to_string(&c.metadata)
            .expect("metadata is a JSON object with string keys, which always serialises");
        q.bind(c.id.as_str())
            .bind(c.customer_id.as_str())
            .bind(c.amount_cents)
            .bind(c.currency.as_str())
            .bind(c.card_token.as_str())
            .bind(&c.description)
            .bind(metadata)
            .bind(c.status.as_str())
            .bind(c.provider_key.as_str())
            .bind(&c.gateway_charge_id)
            .bind(&c.decline_code)
            .bind(&c.idempotency_key)
            .bind(c.is_hold().then_some(crate::rows::hold::REQUIRES_CAPTURE))
    }

    /// The ten values of a new capture or cancel, in [`CAPTURE_COLUMNS`]
    /// order.
    fn capture_values<'q>(q: Q<'q, D>, k: &'q Capture) -> Q<'q, D> {
        q.bind(k.id.as_str())
            .bind(k.action.as_str())
            .bind(k.charge_id.as_str())
            .bind(k.customer_id.as_str())
            .bind(k.requested_by.subject.as_str())
            .bind(k.requested_by.role.as_str())
            .bind(k.amount_cents)
            .bind(k.currency.as_str())
            .bind(k.status.as_str())
            .bind(k.provider_key.as_str())
    }

    /// The nine values of a new refund of `amount_cents`, in
    /// [`REFUND_COLUMNS`] order.
    fn refund_values<'q>(q: Q<'q, D>, r: &'q Refund, amount_cents: i64) -> Q<'q, D> {
        let metadata = serde_json::to_string(&r.metadata)
            .expect("metadata is a JSON object with string keys, which always serialises");
        q.bind(r.id.as_str())
            .bind(r.charge_id.as_str())
            .bind(r.customer_id.as_str())
            .bind(amount_cents)
            .bind(r.currency.as_str())
            .bind(r.reason.map(|reason| reason.as_str()))
            .bind(metadata)
            .bind(r.status.as_str())
            .bind(r.provider_key.as_str())
            .bind(r.requested_by.subject.as_str())
            .bind(r.requested_by.role.as_str())
    }

    /// A final answer and the record's new state, for `finish_record` and
    /// `refuse_record`; the record's id and lease token follow.
    fn answer<'q>(sql: &'q str, state: RecordState, response: &'q StoredResponse) -> Q<'q, D> {
        Self::q(sql)
            .bind(state.as_str())
            .bind(i32::from(response.status))
            .bind(&response.body)
            .bind(&response.content_type)
            .bind(&response.location)
    }

    /// The statement `sql` with a new lease's token and duration bound.
    fn leased<'q>(sql: &'q str, lease: &'q NewLease) -> Q<'q, D> {
        Self::q(sql).bind(lease.token.as_str()).bind(millis(lease.duration))
    }

    /// What a claim writes to a record it inserts or reclaims: its
    /// customer, fingerprint, lease, charge and refund, and the key's TTL.
    fn claimant<'q>(q: Q<'q, D>, c: &'q Claim) -> Q<'q, D> {
        let (charge_id, refund_id) = match &c.operation {
            Operation::Charge(charge) => (charge.id.as_str(), None),
            Operation::Refund(refund) => (refund.charge_id.as_str(), Some(refund.id.as_str())),
            Operation::Capture(capture) => (capture.charge_id.as_str(), Some(capture.id.as_str())),
        };
        q.bind(c.customer.as_str())
            .bind(c.fingerprint.to_hex())
            .bind(c.lease.token.as_str())
            .bind(millis(c.lease.duration))
            .bind(charge_id)
            .bind(refund_id)
            .bind(millis(c.ttl))
    }

    /// Runs a write that stamps a row with the database's time, and returns
    /// the stamp: from `RETURNING` where the backend has it, otherwise read
    /// back by `read` on the same connection. `None` when no row was written.
    async fn stamped<O>(
        conn: &mut <D::Db as Database>::Connection,
        write: Q<'_, D>,
        read: Q<'_, D>,
    ) -> Result<Option<O>, Error>
    where
        O: for<'r> FromRow<'r, <D::Db as Database>::Row>,
    {
        let row = if D::RETURNING {
            write.fetch_optional(&mut *conn).await?
        } else if D::rows_affected(&write.execute(&mut *conn).await?) == 0 {
            None
        } else {
            // The write took a row; reading it back must find it.
            let read = read.fetch_optional(&mut *conn).await?;
            Some(read.ok_or_else(|| Error::WriteLost("a written row was not read back".into()))?)
        };
        Ok(row.map(|r| O::from_row(&r)).transpose()?)
    }

    /// One claim attempt in a transaction (a batch's savepoint, on
    /// SQLite): `Ok(None)` when the row it saw changed under it (reclaimed
    /// by someone else, or pruned between the insert and the read).
    async fn try_claim(&self, c: &Claim) -> Result<Option<ClaimOutcome>, Error> {
        let (store, c) = (self.clone(), c.clone());
        self.in_write_tx(move |conn| Box::pin(async move { store.claim_in(conn, &c).await })).await
    }

    /// Runs `work`'s statements in a write transaction: a batch's savepoint
    /// when SQLite batches its writes (committed with the batch), else a
    /// transaction of its own, committed when `work` succeeds.
    async fn in_write_tx<T, F>(&self, work: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut <D::Db as Database>::Connection) -> BoxFut<'c, Result<T, Error>>
            + Send
            + 'static,
    {
        if let Some(batch) = &self.batch {
            return batch.run(work).await;
        }
        let mut tx = self.begin_write().await?;
        let outcome = work(&mut tx).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    /// A claim attempt's statements, in the caller's transaction; an error
    /// leaves it to be rolled back.
    async fn claim_in(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        c: &Claim,
    ) -> Result<Option<ClaimOutcome>, Error> {
        let insert = Self::new_record(Self::q(&self.sql.insert_record), c);
        let stamp = || Self::keyed(&self.sql.stamp_by_key, c).bind(c.lease.token.as_str());
        // Without ON CONFLICT (MySQL), a duplicate key is the error; InnoDB
        // rolls back only the failed statement.
        let inserted: Option<(i64, D::Ts)> = match Self::stamped(conn, insert, stamp()).await {
            Err(Error::Sql(sqlx::Error::Database(e))) if e.is_unique_violation() => None,
            other => other?,
        };
        let (record_id, at) = match inserted {
            Some(row) => row,
            None => {
                let by_key = Self::keyed(&self.sql.record_by_key, c);
                let Some(existing) = Self::read_record(&mut *conn, by_key).await? else {
                    return Ok(None);
                };
                if !existing.reclaimable() {
                    return Ok(Some(ClaimOutcome::Existing(Box::new(existing))));
                }
                let reclaim = Self::claimant(Self::q(&self.sql.reclaim), c).bind(existing.id.0);
                match Self::stamped(conn, reclaim, stamp()).await? {
                    Some(row) => row,
                    None => return Ok(None),
                }
            }
        };
        let (record_id, at) = (RecordId(record_id), decode(at)?);
        let operation = match &c.operation {
            Operation::Charge(charge) => {
                Self::charge_values(Self::q(&self.sql.insert_claimed_charge), charge)
                    .bind(record_id.0)
                    .execute(&mut *conn)
                    .await
                    .map_err(Error::generation_taken)?;
                Operation::Charge(stored(charge, at))
            }
            Operation::Refund(refund) => {
                let Some(amount) = self.reserve(conn, refund).await? else {
                    let answer = self.refusal(conn, refund).await?;
                    let refuse = Self::answer(&self.sql.refuse_record, RecordState::Complete, &answer);
                    refuse.bind(record_id.0).bind(c.lease.token.as_str()).execute(&mut *conn).await?;
                    return Ok(Some(ClaimOutcome::Refused(answer)));
                };
                Self::refund_values(Self::q(&self.sql.insert_claimed_refund), refund, amount)
                    .bind(record_id.0)
                    .execute(&mut *conn)
                    .await
                    .map_err(Error::generation_taken)?;
                Operation::Refund(stored_refund(refund, amount, at))
            }
            Operation::Capture(capture) => {
                let margin = match capture.action {
                    HoldAction::Capture => c.hold_margin,
                    HoldAction::Cancel => Duration::ZERO,
                };
                let take = Self::q(&self.sql.take_hold).bind(capture.id.as_str()).bind(capture.charge_id.as_str());
                if D::rows_affected(&take.bind(millis(margin)).execute(&mut *conn).await?) != 1 {
                    return self.hold_refused(conn, c, capture, record_id, margin).await.map(Some);
                }
                Self::capture_values(Self::q(&self.sql.insert_claimed_capture), capture)
                    .bind(record_id.0)
                    .execute(&mut *conn)
                    .await
                    .map_err(Error::generation_taken)?;
                let mut stored = capture.clone();
                (stored.created_at, stored.updated_at) = (at, at);
                Operation::Capture(stored)
            }
        };
        Ok(Some(claimed(record_id, operation)))
    }

    /// Why the hold of a capture or cancel could not be taken, decided on
    /// its row locked: another operation holds it (the claim is undone,
    /// [`ClaimOutcome::HoldBusy`]), or it is captured, canceled or lapsing
    /// (the record is stored complete with the refusal).
    async fn hold_refused(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        c: &Claim,
        capture: &Capture,
        record_id: RecordId,
        margin: Duration,
    ) -> Result<ClaimOutcome, Error> {
        use crate::rows::hold;
        let state = Self::q(&self.sql.hold_state).bind(millis(margin)).bind(capture.charge_id.as_str());
        let row = state.fetch_optional(&mut *conn).await?.ok_or_else(|| {
            Error::Invariant(format!("the hold {} of capture {} is missing", capture.charge_id, capture.id))
        })?;
        let status: String = row.try_get(0)?;
        let held: Option<String> = row.try_get(1)?;
        let taken: Option<String> = row.try_get(2)?;
        let open = row.try_get::<Option<i64>, _>(3)?.unwrap_or(0) != 0;
        let refusal = match (status.as_str(), held.as_deref()) {
            ("succeeded", None | Some(hold::CAPTURED)) => Some(HoldState::Captured),
            ("succeeded", Some(hold::CANCELED)) => Some(HoldState::Canceled),
            ("succeeded", Some(hold::EXPIRED)) => Some(HoldState::Expired),
            ("succeeded", Some(hold::REQUIRES_CAPTURE)) if taken.is_none() && !open => {
                Some(HoldState::Expired)
            }
            _ => None,
        };
        let Some(refusal) = refusal else {
            let forget = Self::q(&self.sql.forget_record).bind(record_id.0).bind(c.lease.token.as_str());
            forget.execute(&mut *conn).await?;
            return Ok(ClaimOutcome::HoldBusy);
        };
        let answer = Capture::refusal(&capture.charge_id, refusal);
        let refuse = Self::answer(&self.sql.refuse_record, RecordState::Complete, &answer);
        refuse.bind(record_id.0).bind(c.lease.token.as_str()).execute(&mut *conn).await?;
        Ok(ClaimOutcome::Refused(answer))
    }

    /// Why a refund's reservation was refused: a dispute forbids refunding
    /// its charge, or it does not fit in what is left.
    async fn refusal(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        refund: &Refund,
    ) -> Result<StoredResponse, Error> {
        let disputed = Self::q(&self.sql.inbox.disputed).bind(refund.charge_id.as_str());
        if Self::count(&disputed.fetch_one(&mut *conn).await?, 0)? > 0 {
            return Ok(payments_domain::inbox::Dispute::refuses_refund(&refund.charge_id));
        }
        let left = self.refundable(conn, refund).await?;
        Ok(Refund::exceeds_charge(&refund.charge_id, left))
    }

    /// What is left to refund of the refund's charge, its row locked
    /// (`FOR UPDATE`; SQLite's writer holds the only lock).
    async fn refundable(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        refund: &Refund,
    ) -> Result<i64, Error> {
        let row = Self::q(&self.sql.refundable).bind(refund.charge_id.as_str());
        let row = row.fetch_optional(&mut *conn).await?.ok_or_else(|| {
            Error::Invariant(format!("charge {} is not refundable", refund.charge_id))
        })?;
        Ok(row.try_get::<i64, _>(0)?.max(0))
    }

    /// Reserves the refund's amount (what is left, when it asked for 0) on
    /// its charge, by a conditional update: the amount, or `None` when it
    /// does not fit.
    async fn reserve(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        refund: &Refund,
    ) -> Result<Option<i64>, Error> {
        let amount = match refund.amount_cents {
            0 => self.refundable(conn, refund).await?,
            asked => asked,
        };
        let reserve = Self::q(&self.sql.reserve).bind(amount).bind(refund.charge_id.as_str());
        let reserved = D::rows_affected(&reserve.bind(amount).execute(&mut *conn).await?);
        Ok((amount > 0 && reserved == 1).then_some(amount))
    }

    /// PostgreSQL's claim in one statement. `None` when the key exists but
    /// the statement's snapshot cannot see it (a racer committed while the
    /// insert waited).
    async fn claim_or_read(
        &self,
        sql: &str,
        c: &Claim,
        charge: &Charge,
    ) -> Result<Option<ClaimOutcome>, Error> {
        let q = Self::charge_values(Self::new_record(Self::keyed(sql, c), c), charge);
        let row = match &self.lane {
            Some(lane) => {
                let (mut conn, taken_at) = lane.acquire().await?;
                let row = q.fetch_optional(&mut *conn).await;
                if row.is_ok() {
                    lane.keep(conn, taken_at);
                }
                row
            }
            None => q.fetch_optional(&self.pool).await,
        };
        let Some(row) = row.map_err(Error::generation_taken)? else {
            return Ok(None);
        };
        let record = Self::record(&row)?;
        Ok(Some(if row.try_get::<bool, _>("claimed")? {
            claimed(record.id, Operation::Charge(stored(charge, record.created_at)))
        } else {
            ClaimOutcome::Existing(Box::new(record))
        }))
    }

    async fn claim(&self, c: &Claim) -> Result<ClaimOutcome, Error> {
        // A known key is answered without writing or taking a lock.
        let found = match (&self.sql.claim_or_read, &c.operation) {
            (Some(sql), Operation::Charge(charge)) => match self.claim_or_read(sql, c, charge).await? {
                Some(ClaimOutcome::Existing(record)) => Some(*record),
                Some(claimed) => return Ok(claimed),
                None => None,
            },
            _ if !c.read_first => None,
            _ => Self::read_record(&self.pool, Self::keyed(&self.sql.record_by_key, c)).await?,
        };
        if let Some(record) = found.filter(|r| !r.reclaimable()) {
            return Ok(ClaimOutcome::Existing(Box::new(record)));
        }
        for _ in 0..CLAIM_ATTEMPTS {
            if let Some(outcome) = self.try_claim(c).await? {
                return Ok(outcome);
            }
        }
        Err(Error::Invariant(format!(
            "claim of key {:?} did not settle after {CLAIM_ATTEMPTS} attempts",
            c.key
        )))
    }

    /// Column `i` of `row`, a count.
    fn count(row: &<D::Db as Database>::Row, i: usize) -> Result<u64, Error> {
        let n: i64 = row.try_get(i)?;
        Ok(u64::try_from(n).expect("a count is never negative"))
    }

    fn settle<'q>(q: Q<'q, D>, o: &'q ChargeOutcome) -> Q<'q, D> {
        // An authorized hold is `succeeded` in the `status` column; its
        // `hold` column (set when it was made) says it requires capture.
        let (status, _) = stored_status(o.status);
        q.bind(status)
            .bind(&o.gateway_charge_id)
            .bind(&o.decline_code)
            .bind(o.capture_before.map(|t| t.timestamp_millis()))
            .bind(o.charge_id.as_str())
    }

    async fn finish(&self, f: &Finish) -> Result<FinishOutcome, Error> {
        if let (Some(sql), Outcome::Charge(outcome), Some(event)) = (&self.sql.finish_one, &f.outcome, &f.event) {
            let q = Self::event_values(Self::settle(Self::finishing(sql, f), outcome), event);
            let row = match &self.lane {
                Some(lane) => {
                    let (mut conn, taken_at) = lane.acquire().await?;
                    let row = q.fetch_one(&mut *conn).await?;
                    lane.keep(conn, taken_at);
                    row
                }
                None => q.fetch_one(&self.pool).await?,
            };
            return Self::finished(f, Self::count(&row, 0)?, Self::count(&row, 1)?);
        }
        let (store, f) = (self.clone(), f.clone());
        self.in_write_tx(move |conn| Box::pin(async move { store.finish_in(conn, &f).await })).await
    }

    /// `finish_record` or `finish_one` with the finish's answer, record
    /// and lease bound.
    fn finishing<'q>(sql: &'q str, f: &'q Finish) -> Q<'q, D> {
        Self::answer(sql, f.state, &f.response).bind(f.record_id.0).bind(f.lease_token.as_str())
    }

    /// A finish's statements, in the caller's transaction; an error leaves
    /// it to be rolled back.
    async fn finish_in(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        f: &Finish,
    ) -> Result<FinishOutcome, Error> {
        let done = Self::finishing(&self.sql.finish_record, f).execute(&mut *conn).await?;
        let finished = D::rows_affected(&done);
        let settled = if finished == 1 {
            self.settle_in(conn, &f.outcome, Guard::Any).await?
        } else {
            0
        };
        match (settled, &f.event, &self.deferred) {
            (1, Some(event), Some(deferred)) => deferred.defer(event),
            (1, Some(event), None) => self.insert_event_in(conn, event).await?,
            _ => {}
        }
        Self::finished(f, finished, settled)
    }

    /// What a finish that changed `finished` records and `settled`
    /// operations means.
    fn finished(f: &Finish, finished: u64, settled: u64) -> Result<FinishOutcome, Error> {
        match (finished, settled) {
            (0, _) => Ok(FinishOutcome::Lost),
            (1, 1) => Ok(FinishOutcome::Finished),
            // A claim writes a record and its operation together and
            // neither charges nor refunds are deleted, so this is a broken
            // invariant: say so loudly.
            _ => Err(Error::Invariant(format!(
                "record {} completed but its operation {} was not updated",
                f.record_id,
                f.outcome.id()
            ))),
        }
    }

    /// Writes an outcome to its charge or refund (as `guard` allows); a refund's charge follows: a success is added to
    /// `amount_refunded`, a failure's reservation is given back. How many
    /// charges or refunds changed.
    async fn settle_in(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        outcome: &Outcome,
        guard: Guard,
    ) -> Result<u64, Error> {
        let o = match outcome {
            Outcome::Charge(o) => {
                let q = Self::settle(Self::q(&self.sql.settle[guard as usize]), o);
                return Ok(D::rows_affected(&q.execute(&mut *conn).await?));
            }
            Outcome::Capture(o) => return self.settle_capture_in(conn, o, guard).await,
            Outcome::Refund(o) => o,
        };
        let q = Self::q(&self.sql.settle_refund[guard as usize])
            .bind(o.status.as_str())
            .bind(&o.gateway_refund_id)
            .bind(&o.failure_code)
            .bind(o.refund_id.as_str());
        let settled = D::rows_affected(&q.execute(&mut *conn).await?);
        let charge = match o.status {
            ChargeStatus::Succeeded => Some(&self.sql.refunded),
            ChargeStatus::Failed => Some(&self.sql.unreserve),
            _ => None,
        };
        if let Some(sql) = charge.filter(|_| settled == 1) {
            let q = Self::q(sql).bind(o.amount_cents).bind(o.charge_id.as_str());
            if D::rows_affected(&q.execute(&mut *conn).await?) != 1 {
                return Err(Error::Invariant(format!(
                    "refund {} settled but its charge {} is missing",
                    o.refund_id, o.charge_id
                )));
            }
        }
        Ok(settled)
    }

    /// Settles an operation (as `guard` allows) with its event, and
    /// replaces its abandoned record's answer with `answer`, kept
    /// `keep_for` from now, in the caller's transaction; false when the
    /// operation was not settled (nothing else is written).
    pub(super) async fn reconcile_in(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        outcome: &Outcome,
        event: Option<&NewEvent>,
        answer: &StoredResponse,
        keep_for: Duration,
        guard: Guard,
    ) -> Result<bool, Error> {
        let rewrite = &self.sql.rewrite_abandoned[usize::from(!matches!(outcome, Outcome::Charge(_)))];
        if self.settle_in(conn, outcome, guard).await? == 0 {
            return Ok(false);
        }
        if let Some(event) = event {
            self.insert_event_in(&mut *conn, event).await?;
        }
        let q = Self::answer(rewrite, RecordState::Complete, answer).bind(millis(keep_for));
        q.bind(RecordState::Abandoned.as_str()).bind(outcome.id()).execute(&mut *conn).await?;
        Ok(true)
    }

    /// A capture's or cancel's outcome, and its hold following it.
    async fn settle_capture_in(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        o: &CaptureOutcome,
        guard: Guard,
    ) -> Result<u64, Error> {
        use crate::rows::hold;
        let q = Self::q(&self.sql.settle_capture[guard as usize])
            .bind(o.status.as_str())
            .bind(&o.gateway_id)
            .bind(&o.failure_code)
            .bind(o.capture_id.as_str());
        let settled = D::rows_affected(&q.execute(&mut *conn).await?);
        let follows = match (o.status, o.action) {
            (ChargeStatus::Succeeded, HoldAction::Capture) => Some((hold::CAPTURED, Some(o.amount_cents))),
            (ChargeStatus::Succeeded, HoldAction::Cancel) => Some((hold::CANCELED, None)),
            (ChargeStatus::Failed, _) if o.hold_lapsed => Some((hold::EXPIRED, None)),
            (ChargeStatus::Failed, _) => Some((hold::REQUIRES_CAPTURE, None)),
            _ => None,
        };
        if let Some((held, captured)) = follows.filter(|_| settled == 1) {
            let q = Self::q(&self.sql.hold_follows).bind(held).bind(captured);
            let q = q.bind(o.charge_id.as_str()).bind(o.capture_id.as_str());
            if D::rows_affected(&q.execute(&mut *conn).await?) != 1 {
                return Err(Error::Invariant(format!(
                    "{} {} settled but its hold {} was not taken by it",
                    o.action.as_str(), o.capture_id, o.charge_id
                )));
            }
        }
        Ok(settled)
    }

    /// The statement that reads a page of charges for `query`.
    pub fn list_charges_sql(&self, customer: Option<&CustomerId>, query: &ChargeQuery) -> &str {
        &self.sql.list_charges[usize::from(customer.is_none())][page_index(&query.page)]
    }

    /// `sql` (the list statement, or an `EXPLAIN` of it) with a page's
    /// values bound: the customer, the cursor, each filter (NULL when not
    /// given) and `limit + 1`.
    pub(crate) fn list_charges_query<'q>(sql: &'q str, customer: Option<&'q CustomerId>, query: &'q ChargeQuery) -> Q<'q, D> {
        let (page, f) = (&query.page, &query.filter);
        let (status, hold) = f.status.map(stored_status).unzip();
        let hold = hold.map(|hold| hold.unwrap_or(crate::rows::hold::CAPTURED));
        let ms = |t: Option<DateTime<Utc>>| t.map(|t| t.timestamp_millis());
        let (gte, lt) = (ms(f.created_gte), ms(f.created_lt));
        let (key, value) = f.metadata.as_ref().map(|(k, v)| (k.as_str(), v.as_str())).unzip();
        let idempotency_key = f.idempotency_key.as_deref();
        let mut q = Self::q(sql);
        if let Some(customer) = customer {
            q = q.bind(customer.as_str());
        }
        if let Some(cursor) = &page.cursor {
            q = q.bind(cursor.id());
        }
        let q = q.bind(status).bind(status).bind(hold).bind(hold);
        let q = q.bind(gte).bind(gte).bind(lt).bind(lt);
        let q = q.bind(key).bind(key).bind(value).bind(idempotency_key).bind(idempotency_key);
        q.bind(i64::from(page.limit) + 1)
    }

    /// A capture read with its hold.
    async fn capture_of(&self, row: CaptureRow<D::Ts>) -> Result<Capture, Error> {
        let q = Self::q(&self.sql.charge).bind(row.charge_id());
        let hold = q.fetch_optional(&self.pool).await?.ok_or_else(|| {
            Error::Invariant(format!("the hold {} of a capture is missing", row.charge_id()))
        })?;
        row.with_hold(Charge::try_from(ChargeRow::<D::Ts>::from_row(&hold)?)?)
    }

    /// A single-statement write, on the writer; how many rows it changed.
    async fn write(&self, q: Q<'_, D>) -> Result<u64, Error> {
        Ok(D::rows_affected(&q.execute(&self.writer).await?))
    }
}}

/// An age guard's bound in milliseconds, and whether a record must be
/// younger than it.
fn age_guard(age: ClaimAge) -> (i64, bool) {
    match age {
        ClaimAge::Under(d) => (millis(d), true),
        ClaimAge::AtLeast(d) => (millis(d), false),
    }
}

sql_impl! {#[async_trait] Store for {
    async fn migrate(&self) -> Result<(), StoreError> {
        if self.cluster.is_none() {
            return run(|| async { Ok(D::MIGRATOR.run(&self.writer).await.map_err(sqlx::Error::from)?) }).await;
        }
        // The caller is the one migrator (`payments-api migrate`): no lock.
        let mut migrator = sqlx::migrate::Migrator::with_migrations(D::MIGRATOR.iter().cloned().collect());
        migrator.set_locking(false);
        run(|| async { Ok(migrator.run(&self.writer).await.map_err(sqlx::Error::from)?) }).await
    }

    async fn pin_setting(&self, name: &str, value: &str) -> Result<String, StoreError> {
        run(|| async {
            // A unique violation is another process's value standing.
            match Self::q(&self.sql.insert_setting).bind(name).bind(value).execute(&self.writer).await {
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {}
                other => drop(other?),
            }
            let row = Self::q(&self.sql.setting).bind(name).fetch_one(&self.writer).await?;
            Ok(row.try_get::<String, _>(0)?)
        })
        .await
    }

    fn cluster(&self) -> Option<&'static str> {
        self.cluster
    }

    async fn ready(&self) -> Result<(), StoreError> {
        let applied: Vec<i64> = run(|| async {
            let rows = Self::q(&self.sql.applied_migrations).fetch_all(&self.pool).await?;
            Ok(rows.iter().map(|r| r.try_get::<i64, _>(0)).collect::<Result<_, _>>()?)
        })
        .await?;
        let missing: Vec<i64> = D::MIGRATOR
            .iter()
            .map(|m| m.version)
            .filter(|v| !applied.contains(v))
            .collect();
        if !missing.is_empty() {
            return Err(StoreError::Invariant(format!(
                "migrations not applied: {missing:?} (run `payments-api migrate`)"
            )));
        }
        let Some(probe) = &self.sql.write_probe else {
            return Ok(());
        };
        // SQLite's one writer: taking it runs its check (a connection left
        // in a transaction SQLite rolled back is replaced, and the writer
        // marked failing); while failing, ready only once a write commits.
        run(|| async {
            let writer = self.writer.acquire().await?;
            drop(writer);
            Ok(())
        })
        .await?;
        if self.writer_health.failing() {
            run(|| self.write(Self::q(probe))).await?;
            self.writer_health.restored();
            tracing::info!("the SQLite writer commits again");
        }
        Ok(())
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError> {
        run(|| async {
            match self.claim(claim).await {
                Err(Error::GenerationTaken) => Ok(ClaimOutcome::GenerationTaken),
                other => other,
            }
        })
        .await
    }

    async fn take_over(
        &self,
        record_id: RecordId,
        expected_token: &LeaseToken,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<bool, StoreError> {
        let (age_ms, under) = age_guard(age);
        run(|| {
            let q = Self::leased(&self.sql.take_over, lease).bind(record_id.0);
            self.write(q.bind(expected_token.as_str()).bind(age_ms).bind(under))
        })
        .await
        .map(|n| n == 1)
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        run(|| async {
            let row = Self::q(&self.sql.now).fetch_one(&self.pool).await?;
            decode(row.try_get::<D::Ts, _>(0)?)
        })
        .await
    }

    async fn record_orphan(&self, o: &ProviderObject) -> Result<bool, StoreError> {
        run(|| async {
            let mut tx = self.begin_write().await?;
            let q = Self::q(&self.sql.insert_orphan)
                .bind(o.provider_id.as_str())
                .bind(o.kind.as_str())
                .bind(o.operation_id.as_str())
                .bind(o.amount_cents)
                .bind(o.currency.as_str())
                .bind(o.status.as_str())
                .bind(o.created);
            match q.execute(&mut *tx).await {
                Ok(_) => {}
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    tx.rollback().await?;
                    return Ok(false);
                }
                Err(e) => return Err(e.into()),
            }
            self.insert_event_in(&mut *tx, &NewEvent::orphan_found(o)).await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn settle_orphans(&self) -> Result<u64, StoreError> {
        run(|| self.write(Self::q(&self.sql.settle_orphans))).await
    }

    async fn open_orphans(&self, limit: u32) -> Result<Vec<Orphan>, StoreError> {
        run(|| async {
            let rows = Self::q(&self.sql.open_orphans).bind(i64::from(limit)).fetch_all(&self.pool).await?;
            rows.iter()
                .map(|row| {
                    let kind: String = row.try_get(1)?;
                    let kind = OperationKind::parse(&kind)
                        .ok_or_else(|| Error::Invariant(format!("unknown orphan kind {kind:?}")))?;
                    Ok(Orphan {
                        object: ProviderObject {
                            kind,
                            provider_id: row.try_get(0)?,
                            operation_id: row.try_get(2)?,
                            amount_cents: row.try_get(3)?,
                            currency: row.try_get(4)?,
                            status: row.try_get(5)?,
                            created: row.try_get(6)?,
                        },
                        found_at: decode(row.try_get::<D::Ts, _>(7)?)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn forget(
        &self,
        record_id: RecordId,
        token: &LeaseToken,
        operation: &Operation,
    ) -> Result<bool, StoreError> {
        let table = table_of(operation);
        run(|| async {
            let mut tx = self.begin_write().await?;
            let record = Self::q(&self.sql.forget_record).bind(record_id.0).bind(token.as_str());
            if D::rows_affected(&record.execute(&mut *tx).await?) == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            let row = Self::q(&self.sql.forget_operation[table]).bind(operation.id());
            let deleted = D::rows_affected(&row.execute(&mut *tx).await?);
            if let (Operation::Refund(refund), 1) = (operation, deleted) {
                let q = Self::q(&self.sql.unreserve).bind(refund.amount_cents).bind(refund.charge_id.as_str());
                q.execute(&mut *tx).await?;
            }
            // A capture or cancel undone gives its hold back.
            if let (Operation::Capture(capture), 1) = (operation, deleted) {
                let q = Self::q(&self.sql.hold_follows).bind(crate::rows::hold::REQUIRES_CAPTURE).bind(None::<i64>);
                q.bind(capture.charge_id.as_str()).bind(capture.id.as_str()).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn release(&self, record_id: RecordId, token: &LeaseToken) -> Result<bool, StoreError> {
        run(|| self.write(Self::q(&self.sql.release).bind(record_id.0).bind(token.as_str())))
            .await
            .map(|n| n == 1)
    }

    async fn finish(&self, finish: &Finish) -> Result<FinishOutcome, StoreError> {
        run(|| self.finish(finish)).await
    }

    async fn insert_charge(&self, charge: &Charge) -> Result<Charge, StoreError> {
        run(|| async {
            let mut conn = self.writer.acquire().await?;
            let write = Self::charge_values(Self::q(&self.sql.insert_charge), charge);
            let read = Self::q(&self.sql.charge_created_at).bind(charge.id.as_str());
            let (at,): (D::Ts,) = Self::stamped(&mut conn, write, read)
                .await?
                .ok_or_else(|| Error::Invariant(format!("charge {} was not inserted", charge.id)))?;
            Ok(stored(charge, decode(at)?))
        })
        .await
    }

    async fn settle(&self, outcome: &Outcome, event: Option<&NewEvent>) -> Result<bool, StoreError> {
        run(|| async {
            let mut tx = self.begin_write().await?;
            let settled = self.settle_in(&mut *tx, outcome, Guard::Pending).await?;
            if let (1, Some(event)) = (settled, event) {
                self.insert_event_in(&mut *tx, event).await?;
            }
            tx.commit().await?;
            Ok(settled > 0)
        })
        .await
    }

    async fn unsettled(&self, search_lag: Duration, limit: u32) -> Result<Vec<Unsettled>, StoreError> {
        let (lag, limit) = (millis(search_lag), i64::from(limit));
        run(|| async {
            let lag_passed = |row: &<D::Db as Database>::Row| -> Result<Option<bool>, Error> {
                Ok(row.try_get::<Option<i64>, _>("lag_passed")?.map(|n| n != 0))
            };
            let mut found = Vec::new();
            let charges = Self::q(&self.sql.unsettled_charges).bind(lag).bind(limit);
            for row in charges.fetch_all(&self.pool).await? {
                let charge = Charge::try_from(ChargeRow::<D::Ts>::from_row(&row)?)?;
                found.push(Unsettled { operation: Operation::Charge(charge), lag_passed: lag_passed(&row)? });
            }
            let refunds = Self::q(&self.sql.unsettled_refunds).bind(lag).bind(limit);
            for row in refunds.fetch_all(&self.pool).await? {
                let refund = Refund::try_from(RefundRow::<D::Ts>::from_row(&row)?)?;
                found.push(Unsettled { operation: Operation::Refund(refund), lag_passed: lag_passed(&row)? });
            }
            let captures = Self::q(&self.sql.unsettled_captures).bind(lag).bind(limit);
            for row in captures.fetch_all(&self.pool).await? {
                let capture = self.capture_of(CaptureRow::<D::Ts>::from_row(&row)?).await?;
                found.push(Unsettled { operation: Operation::Capture(capture), lag_passed: lag_passed(&row)? });
            }
            Ok(found)
        })
        .await
    }

    async fn reconcile(
        &self,
        outcome: &Outcome,
        event: Option<&NewEvent>,
        answer: &StoredResponse,
        keep_for: Duration,
    ) -> Result<bool, StoreError> {
        run(|| async {
            let mut tx = self.begin_write().await?;
            if !self.reconcile_in(&mut tx, outcome, event, answer, keep_for, Guard::Unsettled).await? {
                tx.rollback().await?;
                return Ok(false);
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn looked_at(&self, operation: &Operation) -> Result<(), StoreError> {
        let sql = &self.sql.looked_at[table_of(operation)];
        run(|| self.write(Self::q(sql).bind(operation.id()))).await.map(drop)
    }

    async fn provider_called(&self, operation: &Operation) -> Result<(), StoreError> {
        let sql = &self.sql.provider_called[table_of(operation)];
        run(|| self.write(Self::q(sql).bind(operation.id()))).await.map(drop)
    }

    async fn claim_expired(
        &self,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let (age_ms, under) = age_guard(age);
        run(|| async {
            if D::RETURNING {
                let q = Self::leased(&self.sql.claim_expired, lease).bind(age_ms).bind(under);
                return Self::read_record(&self.writer, q.bind(age_ms).bind(under)).await;
            }
            // No UPDATE .. RETURNING: lock one candidate (SKIP LOCKED, so a
            // second reaper takes another), lease it, read it back.
            let mut tx = self.begin_write().await?;
            let candidate = Self::q(&self.sql.candidate).bind(age_ms).bind(under);
            let Some(row) = candidate.fetch_optional(&mut *tx).await? else {
                tx.rollback().await?;
                return Ok(None);
            };
            let id: i64 = row.try_get(0)?;
            Self::leased(&self.sql.lease_by_id, lease).bind(id).execute(&mut *tx).await?;
            let by_id = Self::q(&self.sql.record_by_id).bind(id);
            let record = Self::read_record(&mut *tx, by_id).await?;
            // Ours, or the transaction was rolled back under us.
            let ours = |r: &IdempotencyRecord| r.lease.as_ref().is_some_and(|l| l.token == lease.token);
            if !record.as_ref().is_some_and(ours) {
                return Err(Error::WriteLost(format!("record {id} did not come back under its new lease")));
            }
            tx.commit().await?;
            Ok(record)
        })
        .await
    }

    async fn expired_in_progress(&self, limit: u32) -> Result<Vec<IdempotencyRecord>, StoreError> {
        run(|| async {
            let rows = Self::q(&self.sql.expired_in_progress)
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
            rows.iter().map(Self::record).collect()
        })
        .await
    }

    async fn prune(&self, batch: u32) -> Result<u64, StoreError> {
        run(|| self.write(Self::q(&self.sql.prune).bind(i64::from(batch)))).await
    }

    // SQLite: a batch holds the only write lock, and the API's writes queue
    // behind it; 250 rows hold it for about 2 ms (docs/benchmarks.md).
    fn default_prune_batch(&self) -> u32 {
        if D::SINGLE_WRITER { 250 } else { 5000 }
    }

    // SQLite's lock is not fair: a writer in another process that finds it
    // taken sleeps in the busy handler (1, 2, 5, 10, 15, 20, 25 ms ...); a
    // 25 ms rest between batches is sure to contain its next attempt.
    fn batch_pause_floor(&self) -> Duration {
        Duration::from_millis(if D::SINGLE_WRITER { 25 } else { 0 })
    }

    async fn count_prunable(&self) -> Result<u64, StoreError> {
        run(|| async {
            let row = Self::q(&self.sql.count_prunable).fetch_one(&self.pool).await?;
            Self::count(&row, 0)
        })
        .await
    }

    async fn record(&self, record_id: RecordId) -> Result<Option<IdempotencyRecord>, StoreError> {
        run(|| Self::read_record(&self.pool, Self::q(&self.sql.record_by_id).bind(record_id.0)))
            .await
    }

    async fn record_by_key(
        &self,
        key: &IdempotencyKey,
        route: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        run(|| Self::read_record(&self.pool, Self::keyed_by(&self.sql.record_by_key, key.as_str(), route)))
            .await
    }

    async fn charge(&self, charge_id: &str) -> Result<Option<Charge>, StoreError> {
        run(|| async {
            let row = Self::q(&self.sql.charge).bind(charge_id).fetch_optional(&self.pool).await?;
            row.map(|row| Charge::try_from(ChargeRow::<D::Ts>::from_row(&row)?)).transpose()
        })
        .await
    }

    async fn list_charges(
        &self,
        customer: Option<&CustomerId>,
        query: &ChargeQuery,
    ) -> Result<Vec<Charge>, StoreError> {
        let sql = self.list_charges_sql(customer, query);
        run(|| async {
            let rows = Self::list_charges_query(sql, customer, query).fetch_all(&self.pool).await?;
            rows.iter().map(|row| Charge::try_from(ChargeRow::<D::Ts>::from_row(row)?)).collect()
        })
        .await
    }

    async fn list_refunds(&self, charge_id: &str, page: &Page) -> Result<Vec<Refund>, StoreError> {
        run(|| async {
            let mut q = Self::q(&self.sql.list_refunds[page_index(page)]).bind(charge_id);
            if let Some(cursor) = &page.cursor {
                q = q.bind(cursor.id());
            }
            let rows = q.bind(i64::from(page.limit) + 1).fetch_all(&self.pool).await?;
            rows.iter().map(|row| Refund::try_from(RefundRow::<D::Ts>::from_row(row)?)).collect()
        })
        .await
    }

    async fn capture(&self, capture_id: &str) -> Result<Option<Capture>, StoreError> {
        run(|| async {
            let row = Self::q(&self.sql.capture).bind(capture_id).fetch_optional(&self.pool).await?;
            match row {
                Some(row) => Ok(Some(self.capture_of(CaptureRow::<D::Ts>::from_row(&row)?).await?)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn expire_holds(&self, batch: u32) -> Result<u64, StoreError> {
        run(|| self.expire_lapsed(batch)).await
    }

    async fn event(&self, event_id: &str) -> Result<Option<Event>, StoreError> {
        run(|| self.read_event(event_id)).await
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<Event>, StoreError> {
        run(|| self.read_events(query)).await
    }

    async fn dispatch_events(&self, endpoints: &[Endpoint], batch: u32) -> Result<u64, StoreError> {
        run(|| self.dispatch(endpoints, batch)).await
    }

    async fn claim_deliveries(&self, lease: &NewLease, batch: u32) -> Result<Vec<Delivery>, StoreError> {
        run(|| self.claim_due(lease, batch)).await
    }

    async fn attempted(
        &self,
        delivery_id: &str,
        lease_token: &LeaseToken,
        attempt: &Attempted,
    ) -> Result<AttemptRecorded, StoreError> {
        run(|| self.record_attempt(delivery_id, lease_token, attempt)).await
    }

    async fn deliveries(&self, state: DeliveryState, limit: u32) -> Result<Vec<Delivery>, StoreError> {
        run(|| self.deliveries_in(state, limit)).await
    }

    async fn resend(&self, event_id: Option<&str>, endpoints: &[Endpoint]) -> Result<u64, StoreError> {
        run(|| self.send_again(event_id, endpoints)).await
    }

    async fn prune_events(&self, retention: Duration, batch: u32) -> Result<PrunedEvents, StoreError> {
        run(|| self.prune_old_events(retention, batch)).await
    }

    async fn oldest_undelivered(&self) -> Result<Option<Duration>, StoreError> {
        run(|| self.oldest_age()).await
    }

    async fn provider_event(&self, event_id: &str) -> Result<Option<InboxState>, StoreError> {
        run(|| self.inbox_state(event_id)).await
    }

    async fn apply_provider_event(&self, application: &Application) -> Result<Applied, StoreError> {
        run(|| self.apply(application)).await
    }

    async fn open_provider_events(&self, limit: u32) -> Result<Vec<Recorded>, StoreError> {
        run(|| self.waiting_events(limit)).await
    }

    async fn count_provider_events(&self) -> Result<Vec<(InboxState, u64)>, StoreError> {
        run(|| self.count_inbox()).await
    }

    async fn inbox_local(&self, charge_id: &str) -> Result<Option<Local>, StoreError> {
        run(|| self.local_of(charge_id)).await
    }

    async fn dispute(&self, dispute_id: &str) -> Result<Option<Dispute>, StoreError> {
        run(|| self.read_dispute(dispute_id)).await
    }

    async fn disputes_of(&self, charge_id: &str) -> Result<Vec<Dispute>, StoreError> {
        run(|| self.charge_disputes(charge_id)).await
    }

    async fn list_disputes(&self, page: &Page, open_only: bool) -> Result<Vec<Dispute>, StoreError> {
        run(|| self.read_disputes(page, open_only)).await
    }

    async fn count_holds(&self) -> Result<Vec<(ChargeStatus, u64)>, StoreError> {
        run(|| async {
            let rows = Self::q(&self.sql.count_holds).fetch_all(&self.pool).await?;
            let mut counts = Vec::new();
            for row in &rows {
                let (status, held): (String, Option<String>) = (row.try_get(0)?, row.try_get(1)?);
                // Holds not authorized (pending, failed, unknown) count
                // under their status.
                let shown = crate::rows::shown_status(&status, held.as_deref())
                    .ok_or_else(|| Error::Invariant(format!("unknown hold {status:?} {held:?}")))?;
                counts.push((shown, Self::count(row, 2)?));
            }
            Ok(counts)
        })
        .await
    }

    async fn refund(&self, refund_id: &str) -> Result<Option<Refund>, StoreError> {
        run(|| async {
            let row = Self::q(&self.sql.refund).bind(refund_id).fetch_optional(&self.pool).await?;
            row.map(|row| Refund::try_from(RefundRow::<D::Ts>::from_row(&row)?)).transpose()
        })
        .await
    }
}}
