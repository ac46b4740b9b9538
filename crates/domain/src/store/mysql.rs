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
//!
//! Time: `SYSDATE(3)`, the time when the expression runs (`NOW()` would be
//! the statement's start, before any lock wait), at millisecond precision
//! like every time the API prints, with the session time zone at UTC.
//! `SYSDATE` is not safe for statement-based replication; MySQL and
//! MariaDB replicate row images by default, and Galera requires them.

use async_trait::async_trait;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Executor, MySql, MySqlPool};

use super::rows::{ChargeRow, RecordRow, metadata_json, record_columns};
use super::{
    ChargeOutcome, Claim, ClaimAge, ClaimOutcome, Finish, FinishOutcome, NewLease, PoolSettings,
    Store, StoreError, is_unique_violation, known_key, millis, retrying, settle_claim,
};
use crate::charge::Charge;
use crate::idempotency::IdempotencyRecord;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/mysql");

type Ts = chrono::DateTime<chrono::Utc>;

/// The database's current time when the expression runs.
macro_rules! now {
    () => {
        "SYSDATE(3)"
    };
}

/// `now!()` plus the next bound parameter, in milliseconds.
macro_rules! now_plus {
    () => {
        concat!(now!(), " + INTERVAL (? * 1000) MICROSECOND")
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
            ") AS expired, TIMESTAMPDIFF(MICROSECOND, created_at, ",
            now!(),
            ") DIV 1000 AS age_ms"
        )
    };
}

/// The takeover guard on a record's age, with its bound milliseconds.
fn age_guard(age: ClaimAge) -> (&'static str, i64) {
    match age {
        ClaimAge::Under(d) => (
            concat!(
                " AND created_at > ",
                now!(),
                " - INTERVAL (? * 1000) MICROSECOND"
            ),
            millis(d),
        ),
        ClaimAge::AtLeast(d) => (
            concat!(
                " AND created_at <= ",
                now!(),
                " - INTERVAL (? * 1000) MICROSECOND"
            ),
            millis(d),
        ),
    }
}

/// A `Store` on a MySQL or MariaDB database.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
}

impl MySqlStore {
    pub async fn connect(url: &str, settings: &PoolSettings) -> Result<Self, StoreError> {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let options: MySqlConnectOptions = url.parse()?;
        let pool = settings
            .options::<MySql>(settings.max_connections)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    // DATETIME columns hold UTC; SYSDATE answers in the
                    // session's time zone.
                    conn.execute("SET SESSION time_zone = '+00:00'").await?;
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

/// Inserts a charge stamped `at` (a time the database gave), and returns it
/// as stored.
async fn insert_charge<'e>(
    e: impl sqlx::Executor<'e, Database = MySql>,
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
    Ok(Charge {
        created_at: at,
        updated_at: at,
        ..c.clone()
    })
}

async fn update_charge<'e>(
    e: impl sqlx::Executor<'e, Database = MySql>,
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
    // MySQL: the driver asks for FOUND_ROWS, so this counts matched rows.
    Ok(updated.rows_affected())
}

async fn record_by_key<'e>(
    e: impl sqlx::Executor<'e, Database = MySql>,
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

async fn record_by_id<'e>(
    e: impl sqlx::Executor<'e, Database = MySql>,
    record_id: i64,
) -> Result<Option<IdempotencyRecord>, StoreError> {
    let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
        "SELECT ",
        record_columns!(),
        record_clock!(),
        " FROM idempotent_requests WHERE id = ?"
    ))
    .bind(record_id)
    .fetch_optional(e)
    .await?;
    row.map(IdempotencyRecord::try_from).transpose()
}

async fn created_at<'e>(
    e: impl sqlx::Executor<'e, Database = MySql>,
    record_id: i64,
) -> Result<Ts, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT created_at FROM idempotent_requests WHERE id = ?")
            .bind(record_id)
            .fetch_one(e)
            .await?,
    )
}

impl MySqlStore {
    /// One claim attempt: `Ok(None)` when the row it saw changed under it
    /// (reclaimed by someone else, or pruned between the insert and the read).
    async fn try_claim(&self, c: &Claim) -> Result<Option<ClaimOutcome>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(concat!(
            "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
             state, lease_token, locked_until, charge_id, created_at, expires_at) \
             VALUES (?, ?, ?, ?, 'in_progress', ?, ",
            now_plus!(),
            ", ?, ",
            now!(),
            ", ",
            now_plus!(),
            ")"
        ))
        .bind(&c.key)
        .bind(&c.route)
        .bind(&c.customer_id)
        .bind(&c.request_hash)
        .bind(&c.lease.token)
        .bind(millis(c.lease.duration))
        .bind(&c.charge.id)
        .bind(millis(c.ttl))
        .execute(&mut *tx)
        .await;
        let record_id = match inserted {
            Ok(done) => i64::try_from(done.last_insert_id())
                .map_err(|_| StoreError::Other("record id out of range".to_owned()))?,
            Err(e) if is_unique_violation(&e) => {
                let Some(existing) = record_by_key(&mut *tx, &c.key, &c.route).await? else {
                    return Ok(None);
                };
                if !existing.reclaimable() {
                    tx.rollback().await?;
                    return Ok(Some(ClaimOutcome::Existing(Box::new(existing))));
                }
                // Past its TTL with a final answer the record behaves as
                // absent: reclaim it, but only if it still is that record.
                let reclaimed = sqlx::query(concat!(
                    "UPDATE idempotent_requests SET customer_id = ?, request_hash = ?, \
                     state = 'in_progress', lease_token = ?, locked_until = ",
                    now_plus!(),
                    ", charge_id = ?, response_status = NULL, response_body = NULL, \
                     response_content_type = NULL, response_location = NULL, created_at = ",
                    now!(),
                    ", completed_at = NULL, expires_at = ",
                    now_plus!(),
                    " WHERE id = ? AND state = 'complete' AND expires_at <= ",
                    now!()
                ))
                .bind(&c.customer_id)
                .bind(&c.request_hash)
                .bind(&c.lease.token)
                .bind(millis(c.lease.duration))
                .bind(&c.charge.id)
                .bind(millis(c.ttl))
                .bind(existing.id)
                .execute(&mut *tx)
                .await?;
                if reclaimed.rows_affected() != 1 {
                    return Ok(None);
                }
                existing.id
            }
            Err(e) => return Err(e.into()),
        };
        let at = created_at(&mut *tx, record_id).await?;
        let charge = insert_charge(&mut *tx, &c.charge, at).await?;
        tx.commit().await?;
        Ok(Some(ClaimOutcome::Claimed {
            record_id,
            charge: Box::new(charge),
        }))
    }

    async fn try_finish(&self, f: &Finish) -> Result<FinishOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
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

    async fn try_claim_expired(
        &self,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        // No UPDATE .. RETURNING here: lock one candidate (SKIP LOCKED, so a
        // second reaper takes another), lease it, read it back.
        let (guard, age_ms) = age_guard(age);
        let select = format!(
            concat!(
                "SELECT id FROM idempotent_requests WHERE state = 'in_progress' \
                 AND locked_until <= ",
                now!(),
                "{} ORDER BY locked_until LIMIT 1 FOR UPDATE SKIP LOCKED"
            ),
            guard
        );
        let mut tx = self.pool.begin().await?;
        let id: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(select))
            .bind(age_ms)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(id) = id else {
            tx.rollback().await?;
            return Ok(None);
        };
        sqlx::query(concat!(
            "UPDATE idempotent_requests SET lease_token = ?, locked_until = ",
            now_plus!(),
            " WHERE id = ?"
        ))
        .bind(&lease.token)
        .bind(millis(lease.duration))
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
        if let Some(known) = known_key(record_by_key(&self.pool, &c.key, &c.route).await?) {
            return Ok(known);
        }
        settle_claim(&c.key, || self.try_claim(c)).await
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
                now_plus!(),
                " WHERE id = ? AND state = 'in_progress' AND lease_token = ? \
                 AND locked_until <= ",
                now!(),
                "{}"
            ),
            guard
        );
        retrying(|| async {
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(&lease.token)
                .bind(millis(lease.duration))
                .bind(record_id)
                .bind(expected_token)
                .bind(age_ms)
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn release(&self, record_id: i64, lease_token: &str) -> Result<bool, StoreError> {
        retrying(|| async {
            let done = sqlx::query(concat!(
                "UPDATE idempotent_requests SET locked_until = ",
                now!(),
                " WHERE id = ? AND state = 'in_progress' AND lease_token = ?"
            ))
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

    async fn insert_charge(&self, charge: &Charge) -> Result<Charge, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let at: Ts = sqlx::query_scalar(concat!("SELECT ", now!()))
            .fetch_one(&mut *conn)
            .await?;
        insert_charge(&mut *conn, charge, at).await
    }

    async fn settle_charge(&self, outcome: &ChargeOutcome) -> Result<bool, StoreError> {
        retrying(|| async { Ok(update_charge(&self.pool, outcome, true).await? > 0) }).await
    }

    async fn claim_expired(
        &self,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        retrying(|| self.try_claim_expired(lease, age)).await
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

    async fn prune(&self, batch: u32) -> Result<u64, StoreError> {
        // Single-table DELETE .. LIMIT: both MySQL and MariaDB have it, and
        // neither allows a LIMIT subquery on the table being deleted from.
        retrying(|| async {
            let done = sqlx::query(concat!(
                "DELETE FROM idempotent_requests WHERE state = 'complete' AND expires_at <= ",
                now!(),
                " LIMIT ?"
            ))
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected())
        })
        .await
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
