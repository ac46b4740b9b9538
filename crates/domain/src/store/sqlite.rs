//! SQLite, the embedded default. WAL with `synchronous = FULL` (a committed
//! charge survives power loss), a busy timeout so writers queue instead of
//! failing, and every write inside `BEGIN IMMEDIATE`: it takes the write lock
//! up front, so a writer waits in the busy handler instead of failing with
//! `SQLITE_BUSY_SNAPSHOT` when another write commits between its read and its
//! write, and two claims never deadlock upgrading a read lock.
//!
//! Time: SQLite's clock is the clock of the process that opens the file, so
//! one SQLite database has one clock (every process on it runs on one host).
//! Times are integer Unix milliseconds, `now!()` below.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::rows::{ChargeRow, RecordRow, Timestamp, metadata_json, record_columns};
use super::{
    ChargeOutcome, Claim, ClaimAge, ClaimOutcome, Finish, FinishOutcome, NewLease, PoolSettings,
    Store, StoreError, is_unique_violation, known_key, millis,
};
use crate::charge::Charge;
use crate::idempotency::IdempotencyRecord;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

type Ts = i64;

/// The database's current time in the columns' unit (Unix milliseconds),
/// when the statement runs.
macro_rules! now {
    () => {
        "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)"
    };
}

/// What the database's clock says of a record as it is read.
macro_rules! record_clock {
    () => {
        concat!(
            ", (locked_until IS NOT NULL AND locked_until > ",
            now!(),
            ") AS lease_live, (expires_at <= ",
            now!(),
            ") AS expired, (",
            now!(),
            " - created_at) AS age_ms"
        )
    };
}

/// The takeover guard on a record's age, with its bound milliseconds.
fn age_guard(age: ClaimAge) -> (&'static str, i64) {
    match age {
        ClaimAge::Under(d) => (concat!(" AND created_at > ", now!(), " - ?"), millis(d)),
        ClaimAge::AtLeast(d) => (concat!(" AND created_at <= ", now!(), " - ?"), millis(d)),
    }
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

/// Inserts a charge stamped `at` (a time the database gave), and returns it
/// as stored.
async fn insert_charge<'e>(
    e: impl sqlx::Executor<'e, Database = Sqlite>,
    c: &Charge,
    at: Ts,
) -> Result<Charge, StoreError> {
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
    .bind(at)
    .bind(at)
    .execute(e)
    .await?;
    let at = at.decode()?;
    Ok(Charge {
        created_at: at,
        updated_at: at,
        ..c.clone()
    })
}

async fn update_charge<'e>(
    e: impl sqlx::Executor<'e, Database = Sqlite>,
    o: &ChargeOutcome,
    pending_only: bool,
) -> Result<u64, StoreError> {
    // Outside a finish, only a charge still pending is settled.
    let sql = concat!(
        "UPDATE charges SET status = ?, gateway_charge_id = ?, decline_code = ?, updated_at = ",
        now!(),
        " WHERE id = ?",
        " AND (NOT ? OR status = 'pending')"
    );
    let updated = sqlx::query(sql)
        .bind(o.status.as_str())
        .bind(&o.gateway_charge_id)
        .bind(&o.decline_code)
        .bind(&o.charge_id)
        .bind(pending_only)
        .execute(e)
        .await?;
    Ok(updated.rows_affected())
}

async fn record_by_key<'e>(
    e: impl sqlx::Executor<'e, Database = Sqlite>,
    key: &str,
    route: &str,
) -> Result<Option<IdempotencyRecord>, StoreError> {
    let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
        "SELECT ",
        record_columns!(),
        record_clock!(),
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
        if let Some(known) = known_key(record_by_key(&self.pool, &c.key, &c.route).await?) {
            return Ok(known);
        }
        // The write lock is held from BEGIN IMMEDIATE to commit, so inside
        // this transaction nobody else can insert, reclaim or prune the key;
        // the times below are taken after the wait for it.
        let mut tx = self.write_tx().await?;
        let inserted: Result<(i64, Ts), sqlx::Error> = sqlx::query_as(concat!(
            "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
             state, lease_token, locked_until, charge_id, created_at, expires_at) \
             VALUES (?, ?, ?, ?, 'in_progress', ?, ",
            now!(),
            " + ?, ?, ",
            now!(),
            ", ",
            now!(),
            " + ?) RETURNING id, created_at"
        ))
        .bind(&c.key)
        .bind(&c.route)
        .bind(&c.customer_id)
        .bind(&c.request_hash)
        .bind(&c.lease.token)
        .bind(millis(c.lease.duration))
        .bind(&c.charge.id)
        .bind(millis(c.ttl))
        .fetch_one(&mut *tx)
        .await;
        let (record_id, at) = match inserted {
            Ok(row) => row,
            Err(e) if is_unique_violation(&e) => {
                let existing = record_by_key(&mut *tx, &c.key, &c.route)
                    .await?
                    .ok_or_else(|| StoreError::Other("claimed key vanished".to_owned()))?;
                if !existing.reclaimable() {
                    tx.rollback().await?;
                    return Ok(ClaimOutcome::Existing(Box::new(existing)));
                }
                // Past its TTL with a final answer the record behaves as
                // absent: reclaim it.
                let reclaimed: Option<Ts> = sqlx::query_scalar(concat!(
                    "UPDATE idempotent_requests SET customer_id = ?, request_hash = ?, \
                     state = 'in_progress', lease_token = ?, locked_until = ",
                    now!(),
                    " + ?, charge_id = ?, response_status = NULL, response_body = NULL, \
                     response_content_type = NULL, response_location = NULL, created_at = ",
                    now!(),
                    ", completed_at = NULL, expires_at = ",
                    now!(),
                    " + ? WHERE id = ? AND state = 'complete' AND expires_at <= ",
                    now!(),
                    " RETURNING created_at"
                ))
                .bind(&c.customer_id)
                .bind(&c.request_hash)
                .bind(&c.lease.token)
                .bind(millis(c.lease.duration))
                .bind(&c.charge.id)
                .bind(millis(c.ttl))
                .bind(existing.id)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(at) = reclaimed else {
                    return Err(StoreError::Other(
                        "expired record changed under the write lock".to_owned(),
                    ));
                };
                (existing.id, at)
            }
            Err(e) => return Err(e.into()),
        };
        let charge = insert_charge(&mut *tx, &c.charge, at).await?;
        tx.commit().await?;
        Ok(ClaimOutcome::Claimed {
            record_id,
            charge: Box::new(charge),
        })
    }

    async fn take_over(
        &self,
        record_id: i64,
        expected_token: &str,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<bool, StoreError> {
        let (guard, age_ms) = age_guard(age);
        let sql = format!(
            concat!(
                "UPDATE idempotent_requests SET lease_token = ?, locked_until = ",
                now!(),
                " + ? WHERE id = ? AND state = 'in_progress' AND lease_token = ? \
                 AND locked_until <= ",
                now!(),
                "{}"
            ),
            guard
        );
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&lease.token)
            .bind(millis(lease.duration))
            .bind(record_id)
            .bind(expected_token)
            .bind(age_ms)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, record_id: i64, lease_token: &str) -> Result<bool, StoreError> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(concat!(
            "UPDATE idempotent_requests SET locked_until = ",
            now!(),
            " WHERE id = ? AND state = 'in_progress' AND lease_token = ?"
        ))
        .bind(record_id)
        .bind(lease_token)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn finish(&self, f: &Finish) -> Result<FinishOutcome, StoreError> {
        let mut tx = self.write_tx().await?;
        let completed = sqlx::query(concat!(
            "UPDATE idempotent_requests SET state = ?, response_status = ?, \
             response_body = ?, response_content_type = ?, response_location = ?, \
             completed_at = ",
            now!(),
            ", lease_token = NULL, locked_until = NULL \
             WHERE id = ? AND state = 'in_progress' AND lease_token = ?"
        ))
        .bind(f.state.as_str())
        .bind(i32::from(f.response.status))
        .bind(&f.response.body)
        .bind(&f.response.content_type)
        .bind(&f.response.location)
        .bind(f.record_id)
        .bind(&f.lease_token)
        .execute(&mut *tx)
        .await?;
        if completed.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(FinishOutcome::Lost);
        }
        if update_charge(&mut *tx, &f.outcome, false).await? != 1 {
            return Err(StoreError::NotFound(format!(
                "charge {}",
                f.outcome.charge_id
            )));
        }
        tx.commit().await?;
        Ok(FinishOutcome::Finished)
    }

    async fn insert_charge(&self, charge: &Charge) -> Result<Charge, StoreError> {
        let mut tx = self.write_tx().await?;
        let at: Ts = sqlx::query_scalar(concat!("SELECT ", now!()))
            .fetch_one(&mut *tx)
            .await?;
        let charge = insert_charge(&mut *tx, charge, at).await?;
        tx.commit().await?;
        Ok(charge)
    }

    async fn settle_charge(&self, outcome: &ChargeOutcome) -> Result<bool, StoreError> {
        let mut tx = self.write_tx().await?;
        let settled = update_charge(&mut *tx, outcome, true).await?;
        tx.commit().await?;
        Ok(settled > 0)
    }

    async fn claim_expired(
        &self,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let (guard, age_ms) = age_guard(age);
        let sql = format!(
            concat!(
                "UPDATE idempotent_requests SET lease_token = ?, locked_until = ",
                now!(),
                " + ? WHERE id = (SELECT id FROM idempotent_requests \
                 WHERE state = 'in_progress' AND locked_until <= ",
                now!(),
                "{} ORDER BY locked_until LIMIT 1) RETURNING ",
                record_columns!(),
                record_clock!()
            ),
            guard
        );
        let mut tx = self.write_tx().await?;
        let row: Option<RecordRow<Ts>> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(&lease.token)
            .bind(millis(lease.duration))
            .bind(age_ms)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        row.map(IdempotencyRecord::try_from).transpose()
    }

    async fn expired_in_progress(&self, limit: u32) -> Result<Vec<IdempotencyRecord>, StoreError> {
        let rows: Vec<RecordRow<Ts>> = sqlx::query_as(concat!(
            "SELECT ",
            record_columns!(),
            record_clock!(),
            " FROM idempotent_requests WHERE state = 'in_progress' AND locked_until <= ",
            now!(),
            " ORDER BY locked_until LIMIT ?"
        ))
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

    async fn prune(&self, batch: u32) -> Result<u64, StoreError> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(concat!(
            "DELETE FROM idempotent_requests WHERE id IN \
             (SELECT id FROM idempotent_requests \
              WHERE state = 'complete' AND expires_at <= ",
            now!(),
            " LIMIT ?)"
        ))
        .bind(i64::from(batch))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn count_prunable(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(concat!(
            "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'complete' AND expires_at <= ",
            now!()
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(n).unwrap_or_default())
    }

    async fn record(&self, record_id: i64) -> Result<Option<IdempotencyRecord>, StoreError> {
        let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
            "SELECT ",
            record_columns!(),
            record_clock!(),
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
