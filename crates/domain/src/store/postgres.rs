//! PostgreSQL, for production. The claim uses `INSERT .. ON CONFLICT DO
//! NOTHING RETURNING` rather than catching a unique violation, because a
//! failed statement aborts the whole Postgres transaction; under READ
//! COMMITTED the insert waits for a concurrent claimer to commit or roll
//! back, and the following SELECT sees its committed row.
//!
//! The common cases are one statement each, so one round trip instead of
//! four or five (`BEGIN`, the writes, `COMMIT`; see `docs/benchmarks.md`):
//! a claim reads the key and returns its record, or, for a new key, inserts
//! the record and its charge with writable CTEs; a finish updates the
//! record and its charge the same way. A statement is its own transaction,
//! so both rows change together or not at all. Only a record past its TTL,
//! or one committed by a racer after the statement's snapshot, goes to the
//! transaction that reads the row and may reclaim it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgConnectOptions};
use sqlx::query::Query;
use sqlx::{FromRow, PgPool, Postgres, Row};

use super::rows::{ChargeRow, RecordRow, metadata_json, record_columns};
use super::{
    ChargeOutcome, Claim, ClaimOutcome, Finish, FinishOutcome, PoolSettings, Store, StoreError,
    known_key, retrying, settle_claim,
};
use crate::charge::Charge;
use crate::idempotency::{IdempotencyRecord, Lease, RecordState};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

type Ts = DateTime<Utc>;

/// A `Store` on a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    pub async fn connect(url: &str, settings: &PoolSettings) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse()?;
        let pool = settings
            .options(settings.max_connections)
            .connect_with(options.application_name("payments"))
            .await?;
        Ok(Self { pool })
    }

    /// The pool, for tests and tools that count rows.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

async fn insert_charge<'e>(
    e: impl sqlx::Executor<'e, Database = Postgres>,
    c: &Charge,
) -> Result<(), StoreError> {
    bind_charge(
        sqlx::query(concat!(
            "INSERT INTO charges (",
            charge_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12, $13)"
        )),
        c,
    )
    .execute(e)
    .await?;
    Ok(())
}

/// The columns of a new `charges` row, in [`bind_charge`] order.
macro_rules! charge_columns {
    () => {
        "id, customer_id, amount_cents, currency, card_token, description, metadata, status, \
         provider_key, gateway_charge_id, decline_code, created_at, updated_at"
    };
}
use charge_columns;

/// Binds a new charge's 13 columns (metadata as text, for a `::jsonb` cast).
fn bind_charge<'q>(
    query: Query<'q, Postgres, PgArguments>,
    c: &'q Charge,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(&c.id)
        .bind(&c.customer_id)
        .bind(c.amount_cents)
        .bind(&c.currency)
        .bind(c.card_token.as_str())
        .bind(&c.description)
        .bind(metadata_json(c))
        .bind(c.status.as_str())
        .bind(&c.provider_key)
        .bind(&c.gateway_charge_id)
        .bind(&c.decline_code)
        .bind(c.created_at)
        .bind(c.updated_at)
}

async fn update_charge<'e>(
    e: impl sqlx::Executor<'e, Database = Postgres>,
    o: &ChargeOutcome,
) -> Result<(), StoreError> {
    let updated = sqlx::query(
        "UPDATE charges SET status = $1, gateway_charge_id = $2, decline_code = $3, \
         updated_at = $4 WHERE id = $5",
    )
    .bind(o.status.as_str())
    .bind(&o.gateway_charge_id)
    .bind(&o.decline_code)
    .bind(o.at)
    .bind(&o.charge_id)
    .execute(e)
    .await?;
    if updated.rows_affected() != 1 {
        return Err(StoreError::NotFound(format!("charge {}", o.charge_id)));
    }
    Ok(())
}

async fn record_by_key<'e>(
    e: impl sqlx::Executor<'e, Database = Postgres>,
    key: &str,
    route: &str,
) -> Result<Option<IdempotencyRecord>, StoreError> {
    let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
        "SELECT ",
        record_columns!(),
        " FROM idempotent_requests WHERE idempotency_key = $1 AND route = $2"
    ))
    .bind(key)
    .bind(route)
    .fetch_optional(e)
    .await?;
    row.map(IdempotencyRecord::try_from).transpose()
}

impl PostgresStore {
    /// The common claim in one statement: a known key's record comes back
    /// and nothing is attempted (a plain index read: half the cost of an
    /// insert that conflicts); a fresh key inserts the record and its
    /// pending charge (writable CTEs, atomic as any statement), the unique
    /// index arbitrating as ever. `None` when the key exists but this
    /// statement's snapshot cannot see it (a concurrent claimer committed
    /// while the insert waited for it).
    async fn claim_or_read(&self, c: &Claim) -> Result<Option<ClaimOutcome>, StoreError> {
        let query = sqlx::query(concat!(
            "WITH existing AS ( \
               SELECT ",
            record_columns!(),
            " FROM idempotent_requests WHERE idempotency_key = $1 AND route = $2), \
             claimed AS ( \
               INSERT INTO idempotent_requests (idempotency_key, route, customer_id, \
                 request_hash, state, lease_token, locked_until, charge_id, created_at, \
                 expires_at) \
               SELECT $1, $2, $3, $4, 'in_progress', $5, $6, $7, $8, $9 \
               WHERE NOT EXISTS (SELECT 1 FROM existing) \
               ON CONFLICT (idempotency_key, route) DO NOTHING RETURNING ",
            record_columns!(),
            "), charge AS ( \
               INSERT INTO charges (",
            charge_columns!(),
            ") SELECT $10, $11, $12, $13, $14, $15, $16::jsonb, $17, $18, $19, $20, $21, $22 \
               FROM claimed) \
             SELECT true AS claimed, ",
            record_columns!(),
            " FROM claimed \
             UNION ALL \
             SELECT false, ",
            record_columns!(),
            " FROM existing"
        ))
        .bind(&c.key)
        .bind(&c.route)
        .bind(&c.customer_id)
        .bind(&c.request_hash)
        .bind(&c.lease.token)
        .bind(c.lease.until)
        .bind(&c.charge.id)
        .bind(c.now)
        .bind(c.expires_at);
        let row = bind_charge(query, &c.charge)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let claimed: bool = row.try_get("claimed")?;
        let record = IdempotencyRecord::try_from(RecordRow::<Ts>::from_row(&row)?)?;
        Ok(Some(if claimed {
            ClaimOutcome::Claimed {
                record_id: record.id,
            }
        } else {
            ClaimOutcome::Existing(Box::new(record))
        }))
    }

    /// One claim attempt: `Ok(None)` when the row it saw changed under it
    /// (reclaimed by someone else, or pruned between the insert and the read).
    async fn try_claim(&self, c: &Claim) -> Result<Option<ClaimOutcome>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let inserted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
             state, lease_token, locked_until, charge_id, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, 'in_progress', $5, $6, $7, $8, $9) \
             ON CONFLICT (idempotency_key, route) DO NOTHING RETURNING id",
        )
        .bind(&c.key)
        .bind(&c.route)
        .bind(&c.customer_id)
        .bind(&c.request_hash)
        .bind(&c.lease.token)
        .bind(c.lease.until)
        .bind(&c.charge.id)
        .bind(c.now)
        .bind(c.expires_at)
        .fetch_optional(&mut *tx)
        .await?;
        let record_id = match inserted {
            Some(id) => id,
            None => {
                let Some(existing) = record_by_key(&mut *tx, &c.key, &c.route).await? else {
                    return Ok(None);
                };
                if existing.state != RecordState::Complete || !existing.is_expired(c.now) {
                    tx.rollback().await?;
                    return Ok(Some(ClaimOutcome::Existing(Box::new(existing))));
                }
                // Past its TTL the record behaves as absent: reclaim it, but
                // only if it is still the expired record we read.
                let reclaimed = sqlx::query(
                    "UPDATE idempotent_requests SET customer_id = $1, request_hash = $2, \
                     state = 'in_progress', lease_token = $3, locked_until = $4, charge_id = $5, \
                     response_status = NULL, response_body = NULL, response_content_type = NULL, \
                     response_location = NULL, created_at = $6, completed_at = NULL, \
                     expires_at = $7 \
                     WHERE id = $8 AND state = 'complete' AND expires_at <= $6",
                )
                .bind(&c.customer_id)
                .bind(&c.request_hash)
                .bind(&c.lease.token)
                .bind(c.lease.until)
                .bind(&c.charge.id)
                .bind(c.now)
                .bind(c.expires_at)
                .bind(existing.id)
                .execute(&mut *tx)
                .await?;
                if reclaimed.rows_affected() != 1 {
                    return Ok(None);
                }
                existing.id
            }
        };
        insert_charge(&mut *tx, &c.charge).await?;
        tx.commit().await?;
        Ok(Some(ClaimOutcome::Claimed { record_id }))
    }

    /// The record (only under this lease) and its charge, in one statement.
    async fn try_finish(&self, f: &Finish) -> Result<FinishOutcome, StoreError> {
        let o = &f.outcome;
        let (finished, settled): (i64, i64) = sqlx::query_as(
            "WITH done AS ( \
               UPDATE idempotent_requests SET state = 'complete', response_status = $1, \
                 response_body = $2, response_content_type = $3, response_location = $4, \
                 completed_at = $5, lease_token = NULL, locked_until = NULL \
               WHERE id = $6 AND state = 'in_progress' AND lease_token = $7 \
               RETURNING charge_id), \
             settled AS ( \
               UPDATE charges SET status = $8, gateway_charge_id = $9, decline_code = $10, \
                 updated_at = $5 \
               FROM done WHERE charges.id = done.charge_id AND charges.id = $11 \
               RETURNING charges.id) \
             SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM settled)",
        )
        .bind(i32::from(f.response.status))
        .bind(&f.response.body)
        .bind(&f.response.content_type)
        .bind(&f.response.location)
        .bind(o.at)
        .bind(f.record_id)
        .bind(&f.lease_token)
        .bind(o.status.as_str())
        .bind(&o.gateway_charge_id)
        .bind(&o.decline_code)
        .bind(&o.charge_id)
        .fetch_one(&self.pool)
        .await?;
        match (finished, settled) {
            (0, _) => Ok(FinishOutcome::Lost),
            (1, 1) => Ok(FinishOutcome::Finished),
            // The claim writes a record and its charge together and charges
            // are never deleted, so this is a broken invariant: say so loudly.
            _ => Err(StoreError::Other(format!(
                "record {} completed but its charge {} was not updated",
                f.record_id, o.charge_id
            ))),
        }
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(MIGRATOR.run(&self.pool).await?)
    }

    async fn ready(&self) -> Result<(), StoreError> {
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&self.pool)
                .await?;
        super::check_migrations(&MIGRATOR, &applied)
    }

    async fn claim(&self, c: &Claim) -> Result<ClaimOutcome, StoreError> {
        match retrying(|| self.claim_or_read(c)).await? {
            Some(claimed @ ClaimOutcome::Claimed { .. }) => return Ok(claimed),
            Some(ClaimOutcome::Existing(record)) => {
                if let Some(known) = known_key(Some(*record), c.now) {
                    return Ok(known);
                }
            }
            None => {}
        }
        // Past its TTL, or not yet visible: the transaction that reads the
        // row as it is now, and reclaims it if it is still expired.
        settle_claim(&c.key, || self.try_claim(c)).await
    }

    async fn take_over(
        &self,
        record_id: i64,
        expected_token: &str,
        lease: &Lease,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        retrying(|| async {
            let done = sqlx::query(
                "UPDATE idempotent_requests SET lease_token = $1, locked_until = $2 \
                 WHERE id = $3 AND state = 'in_progress' AND lease_token = $4 AND locked_until <= $5",
            )
            .bind(&lease.token)
            .bind(lease.until)
            .bind(record_id)
            .bind(expected_token)
            .bind(now)
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn release(
        &self,
        record_id: i64,
        lease_token: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        retrying(|| async {
            let done = sqlx::query(
                "UPDATE idempotent_requests SET locked_until = $1 \
                 WHERE id = $2 AND state = 'in_progress' AND lease_token = $3",
            )
            .bind(now)
            .bind(record_id)
            .bind(lease_token)
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn finish(&self, f: &Finish) -> Result<FinishOutcome, StoreError> {
        retrying(|| self.try_finish(f)).await
    }

    async fn insert_charge(&self, charge: &Charge) -> Result<(), StoreError> {
        insert_charge(&self.pool, charge).await
    }

    async fn settle_charge(&self, outcome: &ChargeOutcome) -> Result<(), StoreError> {
        retrying(|| update_charge(&self.pool, outcome)).await
    }

    async fn claim_expired(
        &self,
        now: DateTime<Utc>,
        lease: &Lease,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        // SKIP LOCKED: a second reaper passes over the row the first one is
        // taking instead of queueing behind it; the outer conditions re-check
        // the row as it is once locked.
        retrying(|| async {
            let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
                "UPDATE idempotent_requests SET lease_token = $1, locked_until = $2 \
                 WHERE id = (SELECT id FROM idempotent_requests \
                             WHERE state = 'in_progress' AND locked_until <= $3 \
                             ORDER BY locked_until LIMIT 1 FOR UPDATE SKIP LOCKED) \
                   AND state = 'in_progress' AND locked_until <= $3 \
                 RETURNING ",
                record_columns!()
            ))
            .bind(&lease.token)
            .bind(lease.until)
            .bind(now)
            .fetch_optional(&self.pool)
            .await?;
            row.map(IdempotencyRecord::try_from).transpose()
        })
        .await
    }

    async fn expired_in_progress(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<IdempotencyRecord>, StoreError> {
        let rows: Vec<RecordRow<Ts>> = sqlx::query_as(concat!(
            "SELECT ",
            record_columns!(),
            " FROM idempotent_requests WHERE state = 'in_progress' AND locked_until <= $1 \
             ORDER BY locked_until LIMIT $2"
        ))
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(IdempotencyRecord::try_from).collect()
    }

    async fn prune(&self, now: DateTime<Utc>, batch: u32) -> Result<u64, StoreError> {
        retrying(|| async {
            let done = sqlx::query(
                "DELETE FROM idempotent_requests WHERE id IN \
                 (SELECT id FROM idempotent_requests \
                  WHERE state = 'complete' AND expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
            )
            .bind(now)
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected())
        })
        .await
    }

    async fn count_prunable(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'complete' AND expires_at <= $1",
        )
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(n).unwrap_or_default())
    }

    async fn record(&self, record_id: i64) -> Result<Option<IdempotencyRecord>, StoreError> {
        let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
            "SELECT ",
            record_columns!(),
            " FROM idempotent_requests WHERE id = $1"
        ))
        .bind(record_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(IdempotencyRecord::try_from).transpose()
    }

    async fn charge(&self, charge_id: &str) -> Result<Option<Charge>, StoreError> {
        let row: Option<ChargeRow<Ts>> = sqlx::query_as(
            "SELECT id, customer_id, amount_cents, currency, card_token, description, \
             metadata::text AS metadata, status, provider_key, gateway_charge_id, decline_code, \
             created_at, updated_at FROM charges WHERE id = $1",
        )
        .bind(charge_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(Charge::try_from).transpose()
    }
}
