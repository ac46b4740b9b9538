//! SQLite, the embedded default. WAL with `synchronous = FULL` (a committed
//! charge survives power loss), a busy timeout so writers queue instead of
//! failing, and every write inside `BEGIN IMMEDIATE`: it takes the write lock
//! up front, so a writer waits in the busy handler instead of failing with
//! `SQLITE_BUSY_SNAPSHOT` when another write commits between its read and its
//! write, and two claims never deadlock upgrading a read lock.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::rows::{ChargeRow, RecordRow, Timestamp, metadata_json, record_columns};
use super::{
    ChargeOutcome, Claim, ClaimOutcome, Finish, FinishOutcome, PoolSettings, Store, StoreError,
    is_unique_violation, known_key,
};
use crate::charge::Charge;
use crate::idempotency::{IdempotencyRecord, Lease, RecordState};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

type Ts = i64;

fn ts(t: DateTime<Utc>) -> Ts {
    Ts::encode(t)
}

/// A `Store` on one SQLite database file.
///
/// SQLite has one writer at a time. Writers sharing the reader pool would
/// each take `BEGIN IMMEDIATE` and, finding the lock taken, sleep and poll in
/// the busy handler: throughput drops and the tail grows to the busy
/// handler's back-off. So every write goes through `writer`, a pool of one
/// connection, where waiting writers queue in order and the next starts the
/// moment the last commits. Reads use `pool` and never wait for the writer
/// (WAL). The busy timeout stays for writers in other processes
/// (`payments-jobs`, a second server).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: SqlitePool,
}

impl SqliteStore {
    pub async fn connect(url: &str, settings: &PoolSettings) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(10));
        if let Some(dir) = options.get_filename().parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Other(format!("cannot create {}: {e}", dir.display())))?;
        }
        let writer = settings.options(1).connect_with(options.clone()).await?;
        let pool = settings
            .options(settings.max_connections)
            .connect_with(options)
            .await?;
        Ok(Self { pool, writer })
    }

    /// The pool, for tests and tools that count rows.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn write_tx(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }
}

async fn insert_charge<'e>(
    e: impl sqlx::Executor<'e, Database = Sqlite>,
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
    .bind(ts(c.created_at))
    .bind(ts(c.updated_at))
    .execute(e)
    .await?;
    Ok(())
}

async fn update_charge<'e>(
    e: impl sqlx::Executor<'e, Database = Sqlite>,
    o: &ChargeOutcome,
) -> Result<(), StoreError> {
    let updated = sqlx::query(
        "UPDATE charges SET status = ?, gateway_charge_id = ?, decline_code = ?, updated_at = ? \
         WHERE id = ?",
    )
    .bind(o.status.as_str())
    .bind(&o.gateway_charge_id)
    .bind(&o.decline_code)
    .bind(ts(o.at))
    .bind(&o.charge_id)
    .execute(e)
    .await?;
    if updated.rows_affected() != 1 {
        return Err(StoreError::NotFound(format!("charge {}", o.charge_id)));
    }
    Ok(())
}

async fn record_by_key<'e>(
    e: impl sqlx::Executor<'e, Database = Sqlite>,
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

#[async_trait]
impl Store for SqliteStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(MIGRATOR.run(&self.writer).await?)
    }

    async fn ready(&self) -> Result<(), StoreError> {
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = 1")
                .fetch_all(&self.pool)
                .await?;
        super::check_migrations(&MIGRATOR, &applied)
    }

    async fn claim(&self, c: &Claim) -> Result<ClaimOutcome, StoreError> {
        // A known key is read on the reader pool, without the write lock.
        if let Some(known) = known_key(record_by_key(&self.pool, &c.key, &c.route).await?, c.now) {
            return Ok(known);
        }
        // The write lock is held from BEGIN IMMEDIATE to commit, so inside
        // this transaction nobody else can insert, reclaim or prune the key.
        let mut tx = self.write_tx().await?;
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
        .bind(ts(c.lease.until))
        .bind(&c.charge.id)
        .bind(ts(c.now))
        .bind(ts(c.expires_at))
        .execute(&mut *tx)
        .await;
        let record_id = match inserted {
            Ok(done) => done.last_insert_rowid(),
            Err(e) if is_unique_violation(&e) => {
                let existing = record_by_key(&mut *tx, &c.key, &c.route)
                    .await?
                    .ok_or_else(|| StoreError::Other("claimed key vanished".to_owned()))?;
                if existing.state != RecordState::Complete || !existing.is_expired(c.now) {
                    tx.rollback().await?;
                    return Ok(ClaimOutcome::Existing(Box::new(existing)));
                }
                // Past its TTL the record behaves as absent: reclaim it.
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
                .bind(ts(c.lease.until))
                .bind(&c.charge.id)
                .bind(ts(c.now))
                .bind(ts(c.expires_at))
                .bind(existing.id)
                .bind(ts(c.now))
                .execute(&mut *tx)
                .await?;
                if reclaimed.rows_affected() != 1 {
                    return Err(StoreError::Other(
                        "expired record changed under the write lock".to_owned(),
                    ));
                }
                existing.id
            }
            Err(e) => return Err(e.into()),
        };
        insert_charge(&mut *tx, &c.charge).await?;
        tx.commit().await?;
        Ok(ClaimOutcome::Claimed { record_id })
    }

    async fn take_over(
        &self,
        record_id: i64,
        expected_token: &str,
        lease: &Lease,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(
            "UPDATE idempotent_requests SET lease_token = ?, locked_until = ? \
             WHERE id = ? AND state = 'in_progress' AND lease_token = ? AND locked_until <= ?",
        )
        .bind(&lease.token)
        .bind(ts(lease.until))
        .bind(record_id)
        .bind(expected_token)
        .bind(ts(now))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(
        &self,
        record_id: i64,
        lease_token: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(
            "UPDATE idempotent_requests SET locked_until = ? \
             WHERE id = ? AND state = 'in_progress' AND lease_token = ?",
        )
        .bind(ts(now))
        .bind(record_id)
        .bind(lease_token)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn finish(&self, f: &Finish) -> Result<FinishOutcome, StoreError> {
        let mut tx = self.write_tx().await?;
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
        .bind(ts(f.outcome.at))
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

    async fn insert_charge(&self, charge: &Charge) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        insert_charge(&mut *tx, charge).await?;
        Ok(tx.commit().await?)
    }

    async fn settle_charge(&self, outcome: &ChargeOutcome) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        update_charge(&mut *tx, outcome).await?;
        Ok(tx.commit().await?)
    }

    async fn claim_expired(
        &self,
        now: DateTime<Utc>,
        lease: &Lease,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let mut tx = self.write_tx().await?;
        let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
            "UPDATE idempotent_requests SET lease_token = ?, locked_until = ? \
             WHERE id = (SELECT id FROM idempotent_requests \
                         WHERE state = 'in_progress' AND locked_until <= ? \
                         ORDER BY locked_until LIMIT 1) \
             RETURNING ",
            record_columns!()
        ))
        .bind(&lease.token)
        .bind(ts(lease.until))
        .bind(ts(now))
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        row.map(IdempotencyRecord::try_from).transpose()
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
        .bind(ts(now))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(IdempotencyRecord::try_from).collect()
    }

    /// A batch holds SQLite's only write lock, and the API's writes queue
    /// behind it: 250 rows hold it for about 2 ms (see `docs/benchmarks.md`).
    fn default_prune_batch(&self) -> u32 {
        250
    }

    /// SQLite's lock is not fair: a writer in another process (the API,
    /// while `payments-jobs` prunes) that finds it taken sleeps in the busy
    /// handler, 1, 2, 5, 10, 15, 20, 25 ms ... (at most 100 ms) between
    /// attempts. A writer held up by a short batch tries again within a few
    /// milliseconds; a rest of 25 ms is sure to contain that attempt.
    fn batch_pause_floor(&self) -> std::time::Duration {
        std::time::Duration::from_millis(25)
    }

    async fn prune(&self, now: DateTime<Utc>, batch: u32) -> Result<u64, StoreError> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(
            "DELETE FROM idempotent_requests WHERE id IN \
             (SELECT id FROM idempotent_requests \
              WHERE state = 'complete' AND expires_at <= ? LIMIT ?)",
        )
        .bind(ts(now))
        .bind(i64::from(batch))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn count_prunable(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'complete' AND expires_at <= ?",
        )
        .bind(ts(now))
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(n).unwrap_or_default())
    }

    async fn record(&self, record_id: i64) -> Result<Option<IdempotencyRecord>, StoreError> {
        let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
            "SELECT ",
            record_columns!(),
            " FROM idempotent_requests WHERE id = ?"
        ))
        .bind(record_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(IdempotencyRecord::try_from).transpose()
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
