//! PostgreSQL, for production. The claim uses `INSERT .. ON CONFLICT DO
//! NOTHING RETURNING` rather than catching a unique violation, because a
//! failed statement aborts the whole Postgres transaction; under READ
//! COMMITTED the insert waits for a concurrent claimer to commit or roll
//! back, and the following SELECT sees its committed row.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

use super::rows::{ChargeRow, RecordRow, metadata_json, record_columns};
use super::{
    ChargeOutcome, Claim, ClaimOutcome, Finish, FinishOutcome, PoolSettings, Store, StoreError,
    retrying, settle_claim,
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
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
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
    sqlx::query(
        "INSERT INTO charges (id, customer_id, amount_cents, currency, card_token, description, \
         metadata, status, provider_key, gateway_charge_id, decline_code, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12, $13)",
    )
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
    .execute(e)
    .await?;
    Ok(())
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

async fn record_by_key(
    tx: &mut Transaction<'_, Postgres>,
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
    .fetch_optional(&mut **tx)
    .await?;
    row.map(IdempotencyRecord::try_from).transpose()
}

impl PostgresStore {
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
                let Some(existing) = record_by_key(&mut tx, &c.key, &c.route).await? else {
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

    async fn try_finish(&self, f: &Finish) -> Result<FinishOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        let completed = sqlx::query(
            "UPDATE idempotent_requests SET state = 'complete', response_status = $1, \
             response_body = $2, response_content_type = $3, response_location = $4, \
             completed_at = $5, lease_token = NULL, locked_until = NULL \
             WHERE id = $6 AND state = 'in_progress' AND lease_token = $7",
        )
        .bind(i32::from(f.response.status))
        .bind(&f.response.body)
        .bind(&f.response.content_type)
        .bind(&f.response.location)
        .bind(f.outcome.at)
        .bind(f.record_id)
        .bind(&f.lease_token)
        .execute(&mut *tx)
        .await?;
        if completed.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(FinishOutcome::Lost);
        }
        update_charge(&mut *tx, &f.outcome).await?;
        tx.commit().await?;
        Ok(FinishOutcome::Finished)
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
