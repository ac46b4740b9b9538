//! The inbox: provider events recorded in the transaction of their
//! effects (dashboard refunds, refunds failing later, holds captured or
//! released at the provider, disputes, late outcomes), each change guarded
//! by the state it was planned from; and the reads that plan them
//! (`payments_domain::inbox`). Each statement written once, as in
//! [`super::Statements`].

use std::time::Duration;

use payments_domain::charge::{Charge, ChargeStatus};
use payments_domain::inbox::{Change, Dispute, InboxState, Local, Recorded};
use payments_domain::list::Page;
use payments_domain::refund::Refund;
use payments_domain::store::{Application, Applied};
// The bounds `sql_impl!` writes name these.
use sqlx::migrate::Migrate;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Row, Type};

use super::{Guard, REFUND_ROW, SqlStore, keyset, page_index};
use crate::Error;
use crate::dialect::Dialect;
use crate::rows::{ChargeRow, RecordRow, RefundRow, decode, hold};

/// A `disputes` row (`d`) as [`SqlStore::dispute_of`] reads it.
const DISPUTE_ROW: &str = "d.id, d.gateway_dispute_id, d.charge_id, d.amount_cents, d.currency, \
     d.status, d.reason, d.refundable, d.evidence_due_by, d.created_at, d.updated_at";

/// A dispute that is over (Stripe's closed statuses, as
/// `payments_domain::inbox::CLOSED`).
const CLOSED: &str = "status IN ('won', 'lost', 'warning_closed', 'prevented')";

/// A dispute that forbids refunding its charge, as
/// `Dispute::blocks_refunds` says: the provider says the charge is not
/// refundable, and the dispute is not won or withdrawn.
pub(super) const BLOCKS_REFUNDS: &str =
    "refundable = 0 AND status NOT IN ('won', 'warning_closed', 'prevented')";

/// The inbox's statements, rendered once for a dialect.
/// A provider event applied again until it is applied: one waiting for
/// its row, or one left for a person (its conflict may be gone).
const OPEN: &str = "state IN ('waiting', 'needs_person')";

#[derive(Debug)]
pub(crate) struct InboxStatements {
    state: String,
    insert: String,
    again: String,
    waiting: String,
    count: String,
    hold_action: String,
    refunds_of: String,
    insert_refund: String,
    refund_reserved: String,
    refund_failed: String,
    given_back: String,
    hold_at_provider: String,
    insert_dispute: String,
    update_dispute: String,
    dispute: String,
    disputes_of: String,
    list_disputes: [String; 3],
    pub(super) disputed: String,
    pub(super) prune: String,
}

impl InboxStatements {
    pub(super) fn render<D: Dialect>() -> Self {
        let r = crate::dialect::render::<D>;
        Self {
            state: r("SELECT state FROM provider_events WHERE id = $1"),
            insert: r(
                "INSERT INTO provider_events (id, type, gateway_charge_id, state, detail, \
                received_at, updated_at) VALUES ($1, $2, $3, $4, $5, {now}, {now})",
            ),
            // An open event (waiting, or for a person) is applied again
            // (by the jobs runner, or a redelivery): only while it is open.
            again: r(&format!(
                "UPDATE provider_events SET state = $1, detail = $2, updated_at = {{now}} \
                WHERE id = $3 AND {OPEN}"
            )),
            waiting: r(&format!(
                "SELECT id, type, gateway_charge_id, state, detail FROM provider_events \
                WHERE {OPEN} ORDER BY updated_at, id LIMIT $1"
            )),
            count: r("SELECT state, COUNT(*) FROM provider_events GROUP BY state"),
            hold_action: r("SELECT hold_action FROM charges WHERE id = $1"),
            refunds_of: r(&format!(
                "SELECT {REFUND_ROW} FROM refunds r JOIN charges c ON c.id = r.charge_id \
                 WHERE r.charge_id = $1 ORDER BY r.created_at, r.id"
            )),
            // The provider's refund id is UNIQUE: a second application
            // that creates it fails, and plans again.
            insert_refund: r(
                "INSERT INTO refunds (id, charge_id, customer_id, amount_cents, \
                currency, reason, metadata, status, provider_key, requested_by, \
                requested_by_role, gateway_refund_id, failure_code, created_at, updated_at) \
                VALUES ({refund}, $12, $13, {at_ms}, {at_ms})",
            ),
            // Money the provider moved is recorded whether or not it fits.
            refund_reserved: r(
                "UPDATE charges SET amount_reserved = amount_reserved + $1, \
                amount_refunded = amount_refunded + $2, updated_at = {now} WHERE id = $3",
            ),
            refund_failed: r("UPDATE refunds SET status = 'failed', failure_code = $1, \
                gateway_refund_id = COALESCE(gateway_refund_id, $2), updated_at = {now} \
                WHERE id = $3 AND status = 'succeeded'"),
            given_back: r(
                "UPDATE charges SET amount_refunded = amount_refunded - $1, \
                amount_reserved = amount_reserved - $2, updated_at = {now} WHERE id = $3",
            ),
            hold_at_provider: r("UPDATE charges SET hold = $1, \
                amount_captured = COALESCE($2, amount_captured), updated_at = {now} \
                WHERE id = $3 AND status = 'succeeded' AND hold = 'requires_capture' \
                AND hold_action IS NULL"),
            insert_dispute: r("INSERT INTO disputes (id, gateway_dispute_id, charge_id, \
                amount_cents, currency, status, reason, refundable, evidence_due_by, \
                created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, {at_ms}, {at_ms})"),
            update_dispute: r(
                "UPDATE disputes SET amount_cents = $1, status = $2, reason = $3, \
                refundable = $4, evidence_due_by = $5, updated_at = {at_ms} \
                WHERE id = $7 AND status = $8 AND amount_cents = $9 AND refundable = $10",
            ),
            dispute: r(&format!(
                "SELECT {DISPUTE_ROW} FROM disputes d WHERE d.id = $1"
            )),
            disputes_of: r(&format!(
                "SELECT {DISPUTE_ROW} FROM disputes d WHERE d.charge_id = $1 \
                 ORDER BY d.created_at, d.id"
            )),
            list_disputes: keyset("d", "disputes").map(|(after, order)| {
                r(&format!(
                    "SELECT {DISPUTE_ROW} FROM disputes d WHERE TRUE{after} \
                     AND ({{p}} = 0 OR NOT (d.{CLOSED})) \
                     ORDER BY d.created_at {order}, d.id {order} LIMIT {{p}}"
                ))
            }),
            disputed: r(&format!(
                "SELECT COUNT(*) FROM disputes WHERE charge_id = $1 AND {BLOCKS_REFUNDS}"
            )),
            // Done with: applied or ignored, received `retention` ago.
            prune: r(&{
                let done = "state IN ('applied', 'ignored') AND received_at <= {now} - {ms}";
                if D::DELETE_LIMIT {
                    format!("DELETE FROM provider_events WHERE {done} LIMIT $2")
                } else {
                    format!(
                        "DELETE FROM provider_events WHERE id IN (SELECT id \
                         FROM provider_events WHERE {done} LIMIT $2{{skip_locked}})"
                    )
                }
            }),
        }
    }
}

sql_impl! {{
    fn inbox(&self) -> &InboxStatements {
        &self.sql.inbox
    }

    /// Deletes at most `batch` provider events done with (applied or
    /// ignored) received `retention_ms` ago or longer.
    pub(super) async fn prune_done(&self, retention_ms: i64, batch: i64) -> Result<u64, Error> {
        self.write(Self::q(&self.inbox().prune).bind(retention_ms).bind(batch)).await
    }

    /// A dispute read as [`DISPUTE_ROW`] lists it.
    fn dispute_of(row: &<D::Db as Database>::Row) -> Result<Dispute, Error> {
        Ok(Dispute {
            id: row.try_get(0)?,
            gateway_dispute_id: row.try_get(1)?,
            charge_id: row.try_get(2)?,
            amount_cents: row.try_get(3)?,
            currency: row.try_get(4)?,
            status: row.try_get(5)?,
            reason: row.try_get(6)?,
            refundable: row.try_get::<i64, _>(7)? != 0,
            evidence_due_by: row.try_get(8)?,
            created_at: decode(row.try_get::<D::Ts, _>(9)?)?,
            updated_at: decode(row.try_get::<D::Ts, _>(10)?)?,
        })
    }

    fn recorded_of(row: &<D::Db as Database>::Row) -> Result<Recorded, Error> {
        let state: String = row.try_get(3)?;
        Ok(Recorded {
            event_id: row.try_get(0)?,
            event_type: row.try_get(1)?,
            gateway_charge_id: row.try_get(2)?,
            state: InboxState::parse(&state)
                .ok_or_else(|| Error::Invariant(format!("unknown provider event state {state:?}")))?,
            detail: row.try_get(4)?,
        })
    }

    pub(super) async fn inbox_state(&self, event_id: &str) -> Result<Option<InboxState>, Error> {
        let row = Self::q(&self.inbox().state).bind(event_id).fetch_optional(&self.pool).await?;
        let Some(row) = row else { return Ok(None) };
        let state: String = row.try_get(0)?;
        InboxState::parse(&state)
            .map(Some)
            .ok_or_else(|| Error::Invariant(format!("unknown provider event state {state:?}")))
    }

    pub(super) async fn waiting_events(&self, limit: u32) -> Result<Vec<Recorded>, Error> {
        let q = Self::q(&self.inbox().waiting).bind(i64::from(limit));
        q.fetch_all(&self.pool).await?.iter().map(Self::recorded_of).collect()
    }

    pub(super) async fn count_inbox(&self) -> Result<Vec<(InboxState, u64)>, Error> {
        let rows = Self::q(&self.inbox().count).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let state: String = row.try_get(0)?;
                let state = InboxState::parse(&state).ok_or_else(|| {
                    Error::Invariant(format!("unknown provider event state {state:?}"))
                })?;
                Ok((state, Self::count(row, 1)?))
            })
            .collect()
    }

    pub(super) async fn local_of(&self, charge_id: &str) -> Result<Option<Local>, Error> {
        let row = Self::q(&self.sql.charge).bind(charge_id).fetch_optional(&self.pool).await?;
        let Some(row) = row else { return Ok(None) };
        let charge = Charge::try_from(ChargeRow::<D::Ts>::from_row(&row)?)?;
        let taken = Self::q(&self.inbox().hold_action).bind(charge_id).fetch_one(&self.pool).await?;
        let hold_taken = taken.try_get::<Option<String>, _>(0)?.is_some();
        let refunds = Self::q(&self.inbox().refunds_of).bind(charge_id).fetch_all(&self.pool).await?;
        let refunds = refunds
            .iter()
            .map(|row| Refund::try_from(RefundRow::<D::Ts>::from_row(row)?))
            .collect::<Result<_, _>>()?;
        let now = decode(Self::q(&self.sql.now).fetch_one(&self.pool).await?.try_get::<D::Ts, _>(0)?)?;
        Ok(Some(Local { charge, hold_taken, refunds, disputes: self.charge_disputes(charge_id).await?, now }))
    }

    pub(super) async fn read_dispute(&self, dispute_id: &str) -> Result<Option<Dispute>, Error> {
        let row = Self::q(&self.inbox().dispute).bind(dispute_id).fetch_optional(&self.pool).await?;
        row.as_ref().map(Self::dispute_of).transpose()
    }

    pub(super) async fn charge_disputes(&self, charge_id: &str) -> Result<Vec<Dispute>, Error> {
        let rows = Self::q(&self.inbox().disputes_of).bind(charge_id).fetch_all(&self.pool).await?;
        rows.iter().map(Self::dispute_of).collect()
    }

    pub(super) async fn read_disputes(&self, page: &Page, open_only: bool) -> Result<Vec<Dispute>, Error> {
        let mut q = Self::q(&self.inbox().list_disputes[page_index(page)]);
        if let Some(cursor) = &page.cursor {
            q = q.bind(cursor.id());
        }
        let q = q.bind(i64::from(open_only)).bind(i64::from(page.limit) + 1);
        q.fetch_all(&self.pool).await?.iter().map(Self::dispute_of).collect()
    }

    /// Records the event and makes its changes, in one transaction.
    pub(super) async fn apply(&self, a: &Application) -> Result<Applied, Error> {
        let mut tx = self.begin_write().await?;
        let r = &a.record;
        let again = Self::q(&self.inbox().again).bind(r.state.as_str()).bind(&r.detail);
        if D::rows_affected(&again.bind(r.event_id.as_str()).execute(&mut *tx).await?) == 0 {
            let insert = Self::q(&self.inbox().insert)
                .bind(r.event_id.as_str())
                .bind(r.event_type.as_str())
                .bind(&r.gateway_charge_id)
                .bind(r.state.as_str())
                .bind(&r.detail);
            match insert.execute(&mut *tx).await {
                Ok(_) => {}
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    tx.rollback().await?;
                    return Ok(Applied::Duplicate);
                }
                Err(e) => return Err(e.into()),
            }
        }
        for change in &a.changes {
            match self.change_in(&mut tx, change, a.keep_for).await {
                Ok(true) => {}
                Ok(false) => {
                    tx.rollback().await?;
                    return Ok(Applied::Stale);
                }
                Err(Error::Sql(sqlx::Error::Database(e))) if e.is_unique_violation() => {
                    tx.rollback().await?;
                    return Ok(Applied::Stale);
                }
                Err(e) => return Err(e),
            }
        }
        tx.commit().await?;
        Ok(Applied::Applied)
    }

    /// One change in the caller's transaction; false when its guard found
    /// the state it was planned from changed.
    async fn change_in(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        change: &Change,
        keep_for: Duration,
    ) -> Result<bool, Error> {
        let s = self.inbox();
        let events = match change {
            Change::ProviderRefund { refund, event } => {
                let q = Self::refund_values(Self::q(&s.insert_refund), refund, refund.amount_cents);
                let q = q.bind(&refund.gateway_refund_id).bind(&refund.failure_code);
                let q = q.bind(refund.created_at.timestamp_millis()).bind(refund.updated_at.timestamp_millis());
                q.execute(&mut *conn).await?;
                let (reserved, refunded) = match refund.status {
                    ChargeStatus::Failed => (0, 0),
                    ChargeStatus::Succeeded => (refund.amount_cents, refund.amount_cents),
                    _ => (refund.amount_cents, 0),
                };
                let q = Self::q(&s.refund_reserved).bind(reserved).bind(refunded);
                q.bind(refund.charge_id.as_str()).execute(&mut *conn).await?;
                std::slice::from_ref(event)
            }
            Change::RefundFailedLater { refund, failure_code, event } => {
                let q = Self::q(&s.refund_failed).bind(failure_code.as_str());
                let q = q.bind(&refund.gateway_refund_id).bind(refund.id.as_str());
                if D::rows_affected(&q.execute(&mut *conn).await?) != 1 {
                    return Ok(false);
                }
                let amount = refund.amount_cents;
                let q = Self::q(&s.given_back).bind(amount).bind(amount);
                q.bind(refund.charge_id.as_str()).execute(&mut *conn).await?;
                std::slice::from_ref(event)
            }
            Change::Hold { charge_id, status, amount_captured, event } => {
                let (_, held) = crate::rows::stored_status(*status);
                let q = Self::q(&s.hold_at_provider).bind(held.unwrap_or(hold::CAPTURED));
                let q = q.bind(*amount_captured).bind(charge_id.as_str());
                if D::rows_affected(&q.execute(&mut *conn).await?) != 1 {
                    return Ok(false);
                }
                std::slice::from_ref(event)
            }
            Change::Dispute { dispute: d, previous, events } => {
                let refundable = i64::from(d.refundable);
                let changed = match previous {
                    None => {
                        let q = Self::q(&s.insert_dispute)
                            .bind(d.id.as_str())
                            .bind(d.gateway_dispute_id.as_str())
                            .bind(d.charge_id.as_str())
                            .bind(d.amount_cents)
                            .bind(d.currency.as_str())
                            .bind(d.status.as_str())
                            .bind(d.reason.as_str())
                            .bind(refundable)
                            .bind(d.evidence_due_by)
                            .bind(d.created_at.timestamp_millis())
                            .bind(d.updated_at.timestamp_millis());
                        D::rows_affected(&q.execute(&mut *conn).await?)
                    }
                    Some(p) => {
                        let q = Self::q(&s.update_dispute)
                            .bind(d.amount_cents)
                            .bind(d.status.as_str())
                            .bind(d.reason.as_str())
                            .bind(refundable)
                            .bind(d.evidence_due_by)
                            .bind(d.updated_at.timestamp_millis())
                            .bind(p.id.as_str())
                            .bind(p.status.as_str())
                            .bind(p.amount_cents)
                            .bind(i64::from(p.refundable));
                        D::rows_affected(&q.execute(&mut *conn).await?)
                    }
                };
                if changed != 1 {
                    return Ok(false);
                }
                events.as_slice()
            }
            Change::Settle { outcome, answer, event } => {
                return self.reconcile_in(conn, outcome, event.as_ref(), answer, keep_for, Guard::Unsettled).await;
            }
        };
        for event in events {
            self.insert_event_in(&mut *conn, event).await?;
        }
        Ok(true)
    }
}}
