//! MySQL 8.0+ and MariaDB 10.6+ (InnoDB), for teams whose database is
//! MySQL. Only syntax both share: no `RETURNING`, no `ON CONFLICT`.
//!
//! The claim is a plain `INSERT` whose duplicate-key error (number 1062,
//! recognised by the driver's error kind: SQLSTATE 23000 alone also covers
//! other violations) means "someone has this key". InnoDB rolls back only the
//! failed statement, so the transaction reads the existing row next. No
//! `INSERT IGNORE`: it would turn every other error into a warning too.
//! Sessions run at READ COMMITTED (each statement sees the latest committed
//! rows and InnoDB takes no gap locks), and deadlocks (1213, SQLSTATE 40001)
//! are retried.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Executor, MySql, MySqlPool};

use super::rows::{ChargeRow, RecordRow, metadata_json, record_columns};
use super::{
    ChargeOutcome, Claim, ClaimOutcome, Finish, FinishOutcome, PoolSettings, Store, StoreError,
    is_unique_violation, known_key, retrying, settle_claim,
};
use crate::charge::Charge;
use crate::idempotency::{IdempotencyRecord, Lease, RecordState};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/mysql");

type Ts = DateTime<Utc>;

/// A `Store` on a MySQL or MariaDB database.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
}

impl MySqlStore {
    pub async fn connect(url: &str, settings: &PoolSettings) -> Result<Self, StoreError> {
        let url = url.replacen("mariadb://", "mysql://", 1);
        // The driver sets the session time zone to UTC, which DATETIME
        // columns rely on.
        let options: MySqlConnectOptions = url.parse()?;
        let pool = settings
            .options::<MySql>(settings.max_connections)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        Ok(Self { pool })
    }

    /// The pool, for tests and tools that count rows.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
}

async fn insert_charge<'e>(
    e: impl sqlx::Executor<'e, Database = MySql>,
    c: &Charge,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO charges (id, customer_id, amount_cents, currency, card_token, description, \
         metadata, status, provider_key, gateway_charge_id, decline_code, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
    e: impl sqlx::Executor<'e, Database = MySql>,
    o: &ChargeOutcome,
) -> Result<(), StoreError> {
    let updated = sqlx::query(
        "UPDATE charges SET status = ?, gateway_charge_id = ?, decline_code = ?, updated_at = ? \
         WHERE id = ?",
    )
    .bind(o.status.as_str())
    .bind(&o.gateway_charge_id)
    .bind(&o.decline_code)
    .bind(o.at)
    .bind(&o.charge_id)
    .execute(e)
    .await?;
    // The driver asks for FOUND_ROWS: this counts matched rows, as elsewhere.
    if updated.rows_affected() != 1 {
        return Err(StoreError::NotFound(format!("charge {}", o.charge_id)));
    }
    Ok(())
}

async fn record_by_key<'e>(
    e: impl sqlx::Executor<'e, Database = MySql>,
    key: &str,
    route: &str,
) -> Result<Option<IdempotencyRecord>, StoreError> {
    let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
        "SELECT ",
        record_columns!(),
        " FROM idempotent_requests WHERE idempotency_key = ? AND route = ?"
    ))
    .bind(key)
    .bind(route)
    .fetch_optional(e)
    .await?;
    row.map(IdempotencyRecord::try_from).transpose()
}

async fn record_by_id<'e>(
    e: impl sqlx::Executor<'e, Database = MySql>,
    record_id: i64,
) -> Result<Option<IdempotencyRecord>, StoreError> {
    let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
        "SELECT ",
        record_columns!(),
        " FROM idempotent_requests WHERE id = ?"
    ))
    .bind(record_id)
    .fetch_optional(e)
    .await?;
    row.map(IdempotencyRecord::try_from).transpose()
}

impl MySqlStore {
    /// One claim attempt: `Ok(None)` when the row it saw changed under it
    /// (reclaimed by someone else, or pruned between the insert and the read).
    async fn try_claim(&self, c: &Claim) -> Result<Option<ClaimOutcome>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
             state, lease_token, locked_until, charge_id, created_at, expires_at) \
             VALUES (?, ?, ?, ?, 'in_progress', ?, ?, ?, ?, ?)",
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
        .execute(&mut *tx)
        .await;
        let record_id = match inserted {
            Ok(done) => i64::try_from(done.last_insert_id())
                .map_err(|_| StoreError::Other("record id out of range".to_owned()))?,
            Err(e) if is_unique_violation(&e) => {
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
                    "UPDATE idempotent_requests SET customer_id = ?, request_hash = ?, \
                     state = 'in_progress', lease_token = ?, locked_until = ?, charge_id = ?, \
                     response_status = NULL, response_body = NULL, response_content_type = NULL, \
                     response_location = NULL, created_at = ?, completed_at = NULL, expires_at = ? \
                     WHERE id = ? AND state = 'complete' AND expires_at <= ?",
                )
                .bind(&c.customer_id)
                .bind(&c.request_hash)
                .bind(&c.lease.token)
                .bind(c.lease.until)
                .bind(&c.charge.id)
                .bind(c.now)
                .bind(c.expires_at)
                .bind(existing.id)
                .bind(c.now)
                .execute(&mut *tx)
                .await?;
                if reclaimed.rows_affected() != 1 {
                    return Ok(None);
                }
                existing.id
            }
            Err(e) => return Err(e.into()),
        };
        insert_charge(&mut *tx, &c.charge).await?;
        tx.commit().await?;
        Ok(Some(ClaimOutcome::Claimed { record_id }))
    }

    async fn try_finish(&self, f: &Finish) -> Result<FinishOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        let completed = sqlx::query(
            "UPDATE idempotent_requests SET state = 'complete', response_status = ?, \
             response_body = ?, response_content_type = ?, response_location = ?, \
             completed_at = ?, lease_token = NULL, locked_until = NULL \
             WHERE id = ? AND state = 'in_progress' AND lease_token = ?",
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

    async fn try_claim_expired(
        &self,
        now: DateTime<Utc>,
        lease: &Lease,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        // No UPDATE .. RETURNING here: lock one candidate (SKIP LOCKED, so a
        // second reaper takes another), lease it, read it back.
        let mut tx = self.pool.begin().await?;
        let id: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM idempotent_requests WHERE state = 'in_progress' AND locked_until <= ? \
             ORDER BY locked_until LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(id) = id else {
            tx.rollback().await?;
            return Ok(None);
        };
        sqlx::query(
            "UPDATE idempotent_requests SET lease_token = ?, locked_until = ? WHERE id = ?",
        )
        .bind(&lease.token)
        .bind(lease.until)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let record = record_by_id(&mut *tx, id).await?;
        tx.commit().await?;
        Ok(record)
    }
}

#[async_trait]
impl Store for MySqlStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(MIGRATOR.run(&self.pool).await?)
    }

    async fn ready(&self) -> Result<(), StoreError> {
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = 1")
                .fetch_all(&self.pool)
                .await?;
        super::check_migrations(&MIGRATOR, &applied)
    }

    async fn claim(&self, c: &Claim) -> Result<ClaimOutcome, StoreError> {
        // A known key is read outside any transaction: no failed insert, no
        // gap lock.
        if let Some(known) = known_key(record_by_key(&self.pool, &c.key, &c.route).await?, c.now) {
            return Ok(known);
        }
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
                "UPDATE idempotent_requests SET lease_token = ?, locked_until = ? \
                 WHERE id = ? AND state = 'in_progress' AND lease_token = ? AND locked_until <= ?",
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
                "UPDATE idempotent_requests SET locked_until = ? \
                 WHERE id = ? AND state = 'in_progress' AND lease_token = ?",
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
        retrying(|| self.try_claim_expired(now, lease)).await
    }

    async fn expired_in_progress(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<IdempotencyRecord>, StoreError> {
        let rows: Vec<RecordRow<Ts>> = sqlx::query_as(concat!(
            "SELECT ",
            record_columns!(),
            " FROM idempotent_requests WHERE state = 'in_progress' AND locked_until <= ? \
             ORDER BY locked_until LIMIT ?"
        ))
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(IdempotencyRecord::try_from).collect()
    }

    async fn prune(&self, now: DateTime<Utc>, batch: u32) -> Result<u64, StoreError> {
        // Single-table DELETE .. LIMIT: both MySQL and MariaDB have it, and
        // neither allows a LIMIT subquery on the table being deleted from.
        retrying(|| async {
            let done = sqlx::query(
                "DELETE FROM idempotent_requests WHERE state = 'complete' AND expires_at <= ? \
                 LIMIT ?",
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
            "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'complete' AND expires_at <= ?",
        )
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(n).unwrap_or_default())
    }

    async fn record(&self, record_id: i64) -> Result<Option<IdempotencyRecord>, StoreError> {
        record_by_id(&self.pool, record_id).await
    }

    async fn charge(&self, charge_id: &str) -> Result<Option<Charge>, StoreError> {
        let row: Option<ChargeRow<Ts>> = sqlx::query_as(
            "SELECT id, customer_id, amount_cents, currency, card_token, description, metadata, \
             status, provider_key, gateway_charge_id, decline_code, created_at, updated_at \
             FROM charges WHERE id = ?",
        )
        .bind(charge_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(Charge::try_from).transpose()
    }
}
