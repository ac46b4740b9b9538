//! The outbox: events written in the transaction of their change, their
//! reads (`GET /api/events`), and webhook deliveries (dispatch, leases,
//! attempts, re-sends, pruning). Each statement written once, as in
//! [`super::Statements`].

use std::time::Duration;

use payments_domain::charge::Charge;
use payments_domain::events::{API_VERSION, Event, EventQuery, EventType, NewEvent};
use payments_domain::idempotency::LeaseToken;
use payments_domain::store::{AttemptRecorded, NewLease, PrunedEvents};
use payments_domain::webhook::{Attempted, Delivery, DeliveryState, Endpoint, delivery_id};
// The bounds `sql_impl!` writes name these.
use sqlx::migrate::Migrate;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Row, Type};

use super::{Q, SqlStore, keyset, page_index};
use crate::dialect::Dialect;
use crate::rows::{ChargeRow, RecordRow, RefundRow, decode};
use crate::{Error, millis};

/// An `events` row (`e`) as [`SqlStore::event_of`] reads it.
const EVENT_ROW: &str = "e.id, e.type, e.object_id, e.api_version, e.created_at, e.data";

/// A `webhook_deliveries` row (`d`) with its event (`e`), as
/// [`SqlStore::delivery_of`] reads it.
const DELIVERY_ROW: &str = "d.id, d.endpoint, d.state, d.attempts, d.lease_token, \
     d.next_attempt_at, d.last_status, d.last_error, d.created_at, \
     e.id, e.type, e.object_id, e.api_version, e.created_at, e.data";

/// A delivery that is due and not leased (or whose lease ran out).
const DUE: &str = "state = 'pending' AND next_attempt_at <= {now} \
     AND (locked_until IS NULL OR locked_until <= {now})";

/// A lapsed hold that no capture or cancel has taken.
const LAPSED: &str = "hold = 'requires_capture' AND status = 'succeeded' \
     AND hold_action IS NULL AND capture_before <= {now}";

/// The outbox's statements, rendered once for a dialect.
#[derive(Debug)]
pub(crate) struct OutboxStatements {
    pub(super) insert_event: String,
    event: String,
    list_events: [String; 3],
    undispatched: String,
    insert_delivery: String,
    mark_dispatched: String,
    due: String,
    lease: String,
    leased: String,
    delivered: String,
    give_up: String,
    retry: String,
    in_state: String,
    resend_failed: String,
    resend_event: String,
    prune_deliveries: String,
    prune_events: String,
    oldest: [String; 2],
    lapsed: String,
    expire_one: String,
    /// SQLite's group commit: a batch's deferred events in one statement,
    /// from a JSON array of `[id, type, object_id, data]`.
    pub(super) insert_deferred: Option<String>,
}

impl OutboxStatements {
    pub(super) fn render<D: Dialect>() -> Self {
        let r = crate::dialect::render::<D>;
        let resend = "UPDATE webhook_deliveries SET state = 'pending', attempts = 0, \
            next_attempt_at = {now}, created_at = {now}, updated_at = {now}, \
            lease_token = NULL, locked_until = NULL WHERE ";
        let prunable_event = "created_at <= {now} - {ms} AND dispatched_at IS NOT NULL \
            AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = events.id)";
        let old_delivered = "state = 'delivered' AND event_id IN \
            (SELECT id FROM events WHERE created_at <= {now} - {ms})";
        Self {
            insert_event: r(
                "INSERT INTO events (id, type, object_id, api_version, created_at, \
                data) VALUES ($1, $2, $3, $4, {now}, $5){ignore_duplicate id}",
            ),
            event: r(&format!("SELECT {EVENT_ROW} FROM events e WHERE e.id = $1")),
            // Every filter bound, NULL when not given.
            list_events: keyset("e", "events").map(|(after, order)| {
                r(&format!(
                    "SELECT {EVENT_ROW} FROM events e WHERE TRUE{after} \
                     AND ({{p}} IS NULL OR e.type = {{p}}) \
                     AND ({{p}} IS NULL OR e.created_at >= {{at_ms}}) \
                     AND ({{p}} IS NULL OR e.created_at < {{at_ms}}) \
                     ORDER BY e.created_at {order}, e.id {order} LIMIT {{p}}"
                ))
            }),
            undispatched: r("SELECT id, type FROM events WHERE dispatched_at IS NULL \
                ORDER BY created_at LIMIT $1{skip_locked}"),
            // Counted only when made (MySQL counts a duplicate key's row as
            // matched); the conflict clause covers a race to make it.
            insert_delivery: r(
                "INSERT INTO webhook_deliveries (id, event_id, endpoint, state, \
                attempts, next_attempt_at, created_at, updated_at) \
                SELECT $1, $2, $3, 'pending', 0, {now}, {now}, {now} FROM (SELECT 1 AS one) AS one \
                WHERE NOT EXISTS (SELECT 1 FROM webhook_deliveries WHERE id = $4)\
                {ignore_duplicate id}",
            ),
            mark_dispatched: r("UPDATE events SET dispatched_at = {now} WHERE id = $1"),
            due: r(&format!(
                "SELECT id FROM webhook_deliveries WHERE {DUE} \
                 ORDER BY next_attempt_at LIMIT $1{{skip_locked}}"
            )),
            lease: r(&format!(
                "UPDATE webhook_deliveries SET lease_token = $1, locked_until = {{now}} + {{ms}} \
                 WHERE id = $3 AND {DUE}"
            )),
            leased: r(&format!(
                "SELECT {DELIVERY_ROW} FROM webhook_deliveries d \
                 JOIN events e ON e.id = d.event_id WHERE d.lease_token = $1"
            )),
            delivered: r("UPDATE webhook_deliveries SET state = 'delivered', \
                attempts = attempts + 1, last_status = $1, last_error = NULL, \
                lease_token = NULL, locked_until = NULL, updated_at = {now} \
                WHERE id = $2 AND lease_token = $3"),
            give_up: r("UPDATE webhook_deliveries SET state = 'failed', \
                attempts = attempts + 1, last_status = $1, last_error = $2, \
                lease_token = NULL, locked_until = NULL, updated_at = {now} \
                WHERE id = $3 AND lease_token = $4 AND created_at <= {now} - {ms}"),
            retry: r("UPDATE webhook_deliveries SET attempts = attempts + 1, \
                last_status = $1, last_error = $2, lease_token = NULL, locked_until = NULL, \
                next_attempt_at = {now} + {ms}, updated_at = {now} \
                WHERE id = $4 AND lease_token = $5"),
            in_state: r(&format!(
                "SELECT {DELIVERY_ROW} FROM webhook_deliveries d \
                 JOIN events e ON e.id = d.event_id WHERE d.state = $1 \
                 ORDER BY d.updated_at DESC, d.id LIMIT $2"
            )),
            resend_failed: r(&format!("{resend}state = 'failed'")),
            // Not one a runner is attempting right now.
            resend_event: r(&format!(
                "{resend}event_id = $1 AND (locked_until IS NULL OR locked_until <= {{now}})"
            )),
            prune_deliveries: r(&if D::DELETE_LIMIT {
                format!("DELETE FROM webhook_deliveries WHERE {old_delivered} LIMIT $2")
            } else {
                format!(
                    "DELETE FROM webhook_deliveries WHERE id IN (SELECT id \
                     FROM webhook_deliveries WHERE {old_delivered} LIMIT $2)"
                )
            }),
            prune_events: r(&if D::DELETE_LIMIT {
                format!("DELETE FROM events WHERE {prunable_event} LIMIT $2")
            } else {
                format!(
                    "DELETE FROM events WHERE id IN (SELECT id FROM events \
                     WHERE {prunable_event} LIMIT $2{{skip_locked}})"
                )
            }),
            oldest: [
                format!(
                    "SELECT {} FROM events WHERE dispatched_at IS NULL",
                    D::ms_since("MIN(created_at)")
                ),
                format!(
                    "SELECT {} FROM webhook_deliveries d JOIN events e ON e.id = d.event_id \
                     WHERE d.state = 'pending'",
                    D::ms_since("MIN(e.created_at)")
                ),
            ]
            .map(|sql| r(&sql)),
            lapsed: r(&format!(
                "SELECT id FROM charges WHERE {LAPSED} ORDER BY capture_before \
                 LIMIT $1{{skip_locked}}"
            )),
            expire_one: r(&format!(
                "UPDATE charges SET hold = 'expired', updated_at = {{now}} \
                 WHERE id = $1 AND {LAPSED}"
            )),
            insert_deferred: D::SINGLE_WRITER.then(|| {
                r(
                    "INSERT INTO events (id, type, object_id, api_version, created_at, data) \
                   SELECT value ->> 0, value ->> 1, value ->> 2, $1, {now}, value ->> 3 \
                   FROM json_each($2) WHERE TRUE{ignore_duplicate id}",
                )
            }),
        }
    }
}

/// The events of the finishes in a SQLite write batch, written by the
/// batch in one statement before it commits ([`crate::batch::BeforeCommit`]):
/// in the same transaction as their changes, with one round trip to
/// SQLite's worker thread for the batch instead of one per finish.
#[derive(Debug)]
pub(crate) struct DeferredEvents {
    events: std::sync::Mutex<Vec<NewEvent>>,
    sql: String,
}

impl DeferredEvents {
    /// Written by `sql` (`insert_deferred`).
    pub(crate) fn new(sql: String) -> Self {
        Self {
            events: std::sync::Mutex::default(),
            sql,
        }
    }

    /// The event of a change the batch in progress made.
    pub(crate) fn defer(&self, event: &NewEvent) {
        self.lock().push(event.clone());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<NewEvent>> {
        // A panic while holding it leaves a list that is still a list.
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<DB: Database> crate::batch::BeforeCommit<DB> for DeferredEvents
where
    for<'c> &'c mut <DB as Database>::Connection: Executor<'c, Database = DB>,
    <DB as Database>::Arguments: IntoArguments<DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> String: Encode<'a, DB> + Type<DB>,
{
    fn begin(&self) {
        self.lock().clear();
    }

    fn run<'c>(
        &'c self,
        conn: &'c mut <DB as Database>::Connection,
    ) -> crate::batch::BoxFut<'c, Result<(), Error>> {
        let events = std::mem::take(&mut *self.lock());
        Box::pin(async move {
            if events.is_empty() {
                return Ok(());
            }
            let rows: Vec<[&str; 4]> = events
                .iter()
                .map(|e| {
                    [
                        e.id.as_str(),
                        e.event_type.as_str(),
                        e.object_id.as_str(),
                        e.data.as_str(),
                    ]
                })
                .collect();
            let rows = serde_json::to_string(&rows).expect("an array of strings always serialises");
            let q = sqlx::query(sqlx::AssertSqlSafe(self.sql.as_str()))
                .bind(API_VERSION)
                .bind(rows);
            q.execute(&mut *conn).await?;
            Ok(())
        })
    }
}

sql_impl! {{
    fn outbox(&self) -> &OutboxStatements {
        &self.sql.outbox
    }

    /// Writes `event` in the caller's transaction (an event already
    /// written, the same change re-made, is left as it is).
    pub(super) async fn insert_event_in(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        event: &NewEvent,
    ) -> Result<(), Error> {
        Self::event_values(Self::q(&self.outbox().insert_event), event).execute(&mut *conn).await?;
        Ok(())
    }

    /// The five values of a new event, in `insert_event`'s order.
    pub(super) fn event_values<'q>(q: Q<'q, D>, event: &'q NewEvent) -> Q<'q, D> {
        q.bind(event.id.as_str())
            .bind(event.event_type.as_str())
            .bind(event.object_id.as_str())
            .bind(API_VERSION)
            .bind(event.data.as_str())
    }

    /// An event read from columns `at..at + 6` of `row`.
    fn event_of(row: &<D::Db as Database>::Row, at: usize) -> Result<Event, Error> {
        Ok(Event {
            id: row.try_get(at)?,
            event_type: row.try_get(at + 1)?,
            object_id: row.try_get(at + 2)?,
            api_version: row.try_get(at + 3)?,
            created: decode(row.try_get::<D::Ts, _>(at + 4)?)?,
            data: row.try_get(at + 5)?,
        })
    }

    /// A delivery read as [`DELIVERY_ROW`] lists it.
    fn delivery_of(row: &<D::Db as Database>::Row) -> Result<Delivery, Error> {
        let state: String = row.try_get(2)?;
        let state = DeliveryState::parse(&state)
            .ok_or_else(|| Error::Invariant(format!("unknown delivery state {state:?}")))?;
        let attempts: i64 = row.try_get(3)?;
        let status: Option<i64> = row.try_get(6)?;
        Ok(Delivery {
            id: row.try_get(0)?,
            endpoint: row.try_get(1)?,
            state,
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
            lease_token: row.try_get::<Option<String>, _>(4)?.map(LeaseToken::from_stored),
            next_attempt_at: decode(row.try_get::<D::Ts, _>(5)?)?,
            last_status: status.and_then(|s| u16::try_from(s).ok()),
            last_error: row.try_get(7)?,
            created_at: decode(row.try_get::<D::Ts, _>(8)?)?,
            event: Self::event_of(row, 9)?,
        })
    }

    pub(super) async fn read_event(&self, event_id: &str) -> Result<Option<Event>, Error> {
        let row = Self::q(&self.outbox().event).bind(event_id).fetch_optional(&self.pool).await?;
        row.map(|row| Self::event_of(&row, 0)).transpose()
    }

    pub(super) async fn read_events(&self, query: &EventQuery) -> Result<Vec<Event>, Error> {
        let page = &query.page;
        let mut q = Self::q(&self.outbox().list_events[page_index(page)]);
        if let Some(cursor) = &page.cursor {
            q = q.bind(cursor.id());
        }
        let event_type = query.event_type.map(EventType::as_str);
        let ms = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.timestamp_millis());
        let (gte, lt) = (ms(query.created_gte), ms(query.created_lt));
        let q = q.bind(event_type).bind(event_type).bind(gte).bind(gte).bind(lt).bind(lt);
        let rows = q.bind(i64::from(page.limit) + 1).fetch_all(&self.pool).await?;
        rows.iter().map(|row| Self::event_of(row, 0)).collect()
    }

    /// The deliveries of `event_id` (of `event_type`) to each endpoint
    /// that wants it, in the caller's transaction.
    async fn insert_deliveries_in(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        event_id: &str,
        event_type: &str,
        endpoints: &[Endpoint],
    ) -> Result<u64, Error> {
        let mut made = 0;
        for endpoint in endpoints.iter().filter(|e| e.wants(event_type)) {
            let id = delivery_id(event_id, &endpoint.url);
            let q = Self::q(&self.outbox().insert_delivery).bind(id.as_str()).bind(event_id);
            let q = q.bind(endpoint.url.as_str()).bind(id.as_str());
            made += D::rows_affected(&q.execute(&mut *conn).await?);
        }
        Ok(made)
    }

    pub(super) async fn dispatch(&self, endpoints: &[Endpoint], batch: u32) -> Result<u64, Error> {
        let mut tx = self.begin_write().await?;
        let rows = Self::q(&self.outbox().undispatched).bind(i64::from(batch)).fetch_all(&mut *tx).await?;
        for row in &rows {
            let (id, event_type): (String, String) = (row.try_get(0)?, row.try_get(1)?);
            self.insert_deliveries_in(&mut *tx, &id, &event_type, endpoints).await?;
            Self::q(&self.outbox().mark_dispatched).bind(id.as_str()).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(rows.len() as u64)
    }

    pub(super) async fn claim_due(&self, lease: &NewLease, batch: u32) -> Result<Vec<Delivery>, Error> {
        let mut tx = self.begin_write().await?;
        let due = Self::q(&self.outbox().due).bind(i64::from(batch)).fetch_all(&mut *tx).await?;
        for row in &due {
            let id: String = row.try_get(0)?;
            Self::leased(&self.outbox().lease, lease).bind(id).execute(&mut *tx).await?;
        }
        let leased = Self::q(&self.outbox().leased).bind(lease.token.as_str()).fetch_all(&mut *tx).await?;
        tx.commit().await?;
        leased.iter().map(Self::delivery_of).collect()
    }

    pub(super) async fn record_attempt(
        &self,
        id: &str,
        token: &LeaseToken,
        attempt: &Attempted,
    ) -> Result<AttemptRecorded, Error> {
        let status = |s: Option<u16>| s.map(i64::from);
        match attempt {
            Attempted::Delivered { status: s } => {
                let q = Self::q(&self.outbox().delivered).bind(i64::from(*s)).bind(id).bind(token.as_str());
                Ok(match self.write(q).await? {
                    0 => AttemptRecorded::Lost,
                    _ => AttemptRecorded::Delivered,
                })
            }
            Attempted::Failed { status: s, error, retry_in, give_up_after } => {
                let error: String = error.chars().take(500).collect();
                let q = Self::q(&self.outbox().give_up).bind(status(*s)).bind(error.as_str());
                let q = q.bind(id).bind(token.as_str()).bind(millis(*give_up_after));
                if self.write(q).await? == 1 {
                    return Ok(AttemptRecorded::GaveUp);
                }
                let q = Self::q(&self.outbox().retry).bind(status(*s)).bind(error.as_str());
                let q = q.bind(millis(*retry_in)).bind(id).bind(token.as_str());
                Ok(match self.write(q).await? {
                    0 => AttemptRecorded::Lost,
                    _ => AttemptRecorded::Retrying,
                })
            }
        }
    }

    pub(super) async fn deliveries_in(&self, state: DeliveryState, limit: u32) -> Result<Vec<Delivery>, Error> {
        let q = Self::q(&self.outbox().in_state).bind(state.as_str()).bind(i64::from(limit));
        q.fetch_all(&self.pool).await?.iter().map(Self::delivery_of).collect()
    }

    pub(super) async fn send_again(&self, event_id: Option<&str>, endpoints: &[Endpoint]) -> Result<u64, Error> {
        let Some(event_id) = event_id else {
            return self.write(Self::q(&self.outbox().resend_failed)).await;
        };
        let Some(event) = self.read_event(event_id).await? else {
            return Ok(0);
        };
        let mut tx = self.begin_write().await?;
        let again = Self::q(&self.outbox().resend_event).bind(event_id).execute(&mut *tx).await?;
        let made = self.insert_deliveries_in(&mut *tx, event_id, &event.event_type, endpoints).await?;
        tx.commit().await?;
        Ok(D::rows_affected(&again) + made)
    }

    pub(super) async fn prune_old_events(&self, retention: Duration, batch: u32) -> Result<PrunedEvents, Error> {
        let (ms, batch) = (millis(retention), i64::from(batch));
        let deliveries = self.write(Self::q(&self.outbox().prune_deliveries).bind(ms).bind(batch)).await?;
        let events = self.write(Self::q(&self.outbox().prune_events).bind(ms).bind(batch)).await?;
        let provider_events = self.prune_done(ms, batch).await?;
        Ok(PrunedEvents {
            events,
            deliveries,
            provider_events,
        })
    }

    pub(super) async fn oldest_age(&self) -> Result<Option<Duration>, Error> {
        let mut oldest: Option<i64> = None;
        for sql in &self.outbox().oldest {
            let row = Self::q(sql).fetch_one(&self.pool).await?;
            let age: Option<i64> = row.try_get(0)?;
            oldest = oldest.max(age);
        }
        Ok(oldest.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    /// Marks lapsed holds `expired`, each with its event, in one
    /// transaction.
    pub(super) async fn expire_lapsed(&self, batch: u32) -> Result<u64, Error> {
        let mut tx = self.begin_write().await?;
        let lapsed = Self::q(&self.outbox().lapsed).bind(i64::from(batch)).fetch_all(&mut *tx).await?;
        let mut expired = 0;
        for row in &lapsed {
            let id: String = row.try_get(0)?;
            let q = Self::q(&self.outbox().expire_one).bind(id.as_str());
            if D::rows_affected(&q.execute(&mut *tx).await?) != 1 {
                continue;
            }
            let row = Self::q(&self.sql.charge).bind(id.as_str()).fetch_one(&mut *tx).await?;
            let charge = Charge::try_from(ChargeRow::<D::Ts>::from_row(&row)?)?;
            self.insert_event_in(&mut *tx, &NewEvent::of_charge(EventType::ChargeExpired, &charge)).await?;
            expired += 1;
        }
        tx.commit().await?;
        Ok(expired)
    }
}}
