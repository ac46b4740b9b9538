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
//!
//! Time: `clock_timestamp()` (the time when the expression runs, not the
//! transaction's start as `now()` would be), truncated to milliseconds like
//! every time the API prints. Under READ COMMITTED an UPDATE that waited for
//! a row lock re-evaluates its conditions and its SET list afterwards, so a
//! lease it writes starts when the write happens.

use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgConnectOptions};
use sqlx::query::Query;
use sqlx::{FromRow, PgPool, Postgres, Row};

use super::rows::{ChargeRow, RecordRow, metadata_json, record_columns};
use super::{
    ChargeOutcome, Claim, ClaimAge, ClaimOutcome, Finish, FinishOutcome, NewLease, PoolSettings,
    Store, StoreError, known_key, millis, retrying, settle_claim,
};
use crate::charge::Charge;
use crate::idempotency::IdempotencyRecord;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

type Ts = chrono::DateTime<chrono::Utc>;

/// The database's current time when the expression runs.
macro_rules! now {
    () => {
        "date_trunc('milliseconds', clock_timestamp())"
    };
}

/// `$n` milliseconds as an interval.
macro_rules! ms {
    ($n:literal) => {
        concat!("($", $n, "::float8 * interval '1 millisecond')")
    };
}

/// What the database's clock says of a record as it is read.
macro_rules! record_clock {
    () => {
        concat!(
            ", (locked_until IS NOT NULL AND locked_until > ",
            now!(),
            ")::int::int8 AS lease_live, (expires_at <= ",
            now!(),
            ")::int::int8 AS expired, (EXTRACT(EPOCH FROM (",
            now!(),
            " - created_at)) * 1000)::int8 AS age_ms"
        )
    };
}

/// The takeover guard on a record's age, comparing with `$n` milliseconds.
macro_rules! age_guard {
    ($n:literal) => {
        [
            concat!(" AND created_at > ", now!(), " - ", ms!($n)),
            concat!(" AND created_at <= ", now!(), " - ", ms!($n)),
        ]
    };
}

/// Which of an `age_guard!` pair applies, and its milliseconds.
fn pick(guards: [&'static str; 2], age: ClaimAge) -> (&'static str, i64) {
    match age {
        ClaimAge::Under(d) => (guards[0], millis(d)),
        ClaimAge::AtLeast(d) => (guards[1], millis(d)),
    }
}

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

/// The columns of a new `charges` row: [`bind_charge`]'s eleven, then the
/// two timestamps.
macro_rules! charge_columns {
    () => {
        "id, customer_id, amount_cents, currency, card_token, description, metadata, status, \
         provider_key, gateway_charge_id, decline_code, created_at, updated_at"
    };
}

/// Binds a new charge's first eleven columns (metadata as text, for a
/// `::jsonb` cast); the timestamps are the statement's.
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
}

/// Inserts a charge stamped `at` (a time the database gave), and returns it
/// as stored.
async fn insert_charge<'e>(
    e: impl sqlx::Executor<'e, Database = Postgres>,
    c: &Charge,
    at: Ts,
) -> Result<Charge, StoreError> {
    bind_charge(
        sqlx::query(concat!(
            "INSERT INTO charges (",
            charge_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12, $12)"
        )),
        c,
    )
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
    e: impl sqlx::Executor<'e, Database = Postgres>,
    o: &ChargeOutcome,
    pending_only: bool,
) -> Result<u64, StoreError> {
    // Outside a finish, only a charge still pending is settled.
    let sql = concat!(
        "UPDATE charges SET status = $1, gateway_charge_id = $2, decline_code = $3, \
         updated_at = ",
        now!(),
        " WHERE id = $4",
        " AND (NOT $5 OR status = 'pending')"
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
    e: impl sqlx::Executor<'e, Database = Postgres>,
    key: &str,
    route: &str,
) -> Result<Option<IdempotencyRecord>, StoreError> {
    let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
        "SELECT ",
        record_columns!(),
        record_clock!(),
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
    /// pending charge (writable CTEs, atomic as any statement; the charge
    /// takes the record's `created_at`), the unique index arbitrating as
    /// ever. `None` when the key exists but this statement's snapshot cannot
    /// see it (a concurrent claimer committed while the insert waited).
    async fn claim_or_read(&self, c: &Claim) -> Result<Option<ClaimOutcome>, StoreError> {
        let query = sqlx::query(concat!(
            "WITH existing AS ( \
               SELECT ",
            record_columns!(),
            record_clock!(),
            " FROM idempotent_requests WHERE idempotency_key = $1 AND route = $2), \
             claimed AS ( \
               INSERT INTO idempotent_requests (idempotency_key, route, customer_id, \
                 request_hash, state, lease_token, locked_until, charge_id, created_at, \
                 expires_at) \
               SELECT $1, $2, $3, $4, 'in_progress', $5, ",
            now!(),
            " + ",
            ms!("6"),
            ", $7, ",
            now!(),
            ", ",
            now!(),
            " + ",
            ms!("8"),
            " WHERE NOT EXISTS (SELECT 1 FROM existing) \
               ON CONFLICT (idempotency_key, route) DO NOTHING RETURNING ",
            record_columns!(),
            record_clock!(),
            "), charge AS ( \
               INSERT INTO charges (",
            charge_columns!(),
            ") SELECT $9, $10, $11, $12, $13, $14, $15::jsonb, $16, $17, $18, $19, \
               created_at, created_at FROM claimed) \
             SELECT true AS claimed, * FROM claimed \
             UNION ALL \
             SELECT false, * FROM existing"
        ))
        .bind(&c.key)
        .bind(&c.route)
        .bind(&c.customer_id)
        .bind(&c.request_hash)
        .bind(&c.lease.token)
        .bind(millis(c.lease.duration))
        .bind(&c.charge.id)
        .bind(millis(c.ttl));
        let row = bind_charge(query, &c.charge)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let claimed: bool = row.try_get("claimed")?;
        let record = IdempotencyRecord::try_from(RecordRow::<Ts>::from_row(&row)?)?;
        Ok(Some(if claimed {
            ClaimOutcome::Claimed {
                record_id: record.id,
                charge: Box::new(Charge {
                    created_at: record.created_at,
                    updated_at: record.created_at,
                    ..c.charge.clone()
                }),
            }
        } else {
            ClaimOutcome::Existing(Box::new(record))
        }))
    }

    /// One claim attempt: `Ok(None)` when the row it saw changed under it
    /// (reclaimed by someone else, or pruned between the insert and the read).
    async fn try_claim(&self, c: &Claim) -> Result<Option<ClaimOutcome>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let inserted: Option<(i64, Ts)> = sqlx::query_as(concat!(
            "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
             state, lease_token, locked_until, charge_id, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, 'in_progress', $5, ",
            now!(),
            " + ",
            ms!("6"),
            ", $7, ",
            now!(),
            ", ",
            now!(),
            " + ",
            ms!("8"),
            ") ON CONFLICT (idempotency_key, route) DO NOTHING RETURNING id, created_at"
        ))
        .bind(&c.key)
        .bind(&c.route)
        .bind(&c.customer_id)
        .bind(&c.request_hash)
        .bind(&c.lease.token)
        .bind(millis(c.lease.duration))
        .bind(&c.charge.id)
        .bind(millis(c.ttl))
        .fetch_optional(&mut *tx)
        .await?;
        let (record_id, at) = match inserted {
            Some(row) => row,
            None => {
                let Some(existing) = record_by_key(&mut *tx, &c.key, &c.route).await? else {
                    return Ok(None);
                };
                if !existing.reclaimable() {
                    tx.rollback().await?;
                    return Ok(Some(ClaimOutcome::Existing(Box::new(existing))));
                }
                // Past its TTL with a final answer the record behaves as
                // absent: reclaim it, but only if it still is that record.
                let reclaimed: Option<Ts> = sqlx::query_scalar(concat!(
                    "UPDATE idempotent_requests SET customer_id = $1, request_hash = $2, \
                     state = 'in_progress', lease_token = $3, locked_until = ",
                    now!(),
                    " + ",
                    ms!("4"),
                    ", charge_id = $5, response_status = NULL, response_body = NULL, \
                     response_content_type = NULL, response_location = NULL, created_at = ",
                    now!(),
                    ", completed_at = NULL, expires_at = ",
                    now!(),
                    " + ",
                    ms!("6"),
                    " WHERE id = $7 AND state = 'complete' AND expires_at <= ",
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
                    return Ok(None);
                };
                (existing.id, at)
            }
        };
        let charge = insert_charge(&mut *tx, &c.charge, at).await?;
        tx.commit().await?;
        Ok(Some(ClaimOutcome::Claimed {
            record_id,
            charge: Box::new(charge),
        }))
    }

    /// The record (only under this lease) and its charge, in one statement.
    async fn try_finish(&self, f: &Finish) -> Result<FinishOutcome, StoreError> {
        let o = &f.outcome;
        let (finished, settled): (i64, i64) = sqlx::query_as(concat!(
            "WITH done AS ( \
               UPDATE idempotent_requests SET state = $1, response_status = $2, \
                 response_body = $3, response_content_type = $4, response_location = $5, \
                 completed_at = ",
            now!(),
            ", lease_token = NULL, locked_until = NULL \
               WHERE id = $6 AND state = 'in_progress' AND lease_token = $7 \
               RETURNING charge_id), \
             settled AS ( \
               UPDATE charges SET status = $8, gateway_charge_id = $9, decline_code = $10, \
                 updated_at = ",
            now!(),
            " FROM done WHERE charges.id = done.charge_id AND charges.id = $11 \
               RETURNING charges.id) \
             SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM settled)"
        ))
        .bind(f.state.as_str())
        .bind(i32::from(f.response.status))
        .bind(&f.response.body)
        .bind(&f.response.content_type)
        .bind(&f.response.location)
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
                if let Some(known) = known_key(Some(*record)) {
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
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<bool, StoreError> {
        let (guard, age_ms) = pick(age_guard!("5"), age);
        let sql = format!(
            concat!(
                "UPDATE idempotent_requests SET lease_token = $1, locked_until = ",
                now!(),
                " + ",
                ms!("2"),
                " WHERE id = $3 AND state = 'in_progress' AND lease_token = $4 \
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
                " WHERE id = $1 AND state = 'in_progress' AND lease_token = $2"
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
        // One reading of the clock for both timestamps.
        let at: Ts = bind_charge(
            sqlx::query(concat!(
                "INSERT INTO charges (",
                charge_columns!(),
                ") SELECT $1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, at, at \
                 FROM (SELECT ",
                now!(),
                " AS at) AS clock RETURNING created_at"
            )),
            charge,
        )
        .fetch_one(&self.pool)
        .await?
        .try_get("created_at")?;
        Ok(Charge {
            created_at: at,
            updated_at: at,
            ..charge.clone()
        })
    }

    async fn settle_charge(&self, outcome: &ChargeOutcome) -> Result<bool, StoreError> {
        retrying(|| async { Ok(update_charge(&self.pool, outcome, true).await? > 0) }).await
    }

    async fn claim_expired(
        &self,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        // SKIP LOCKED: a second reaper passes over the row the first one is
        // taking instead of queueing behind it; the outer conditions re-check
        // the row as it is once locked.
        let (guard, age_ms) = pick(age_guard!("3"), age);
        let sql = format!(
            concat!(
                "UPDATE idempotent_requests SET lease_token = $1, locked_until = ",
                now!(),
                " + ",
                ms!("2"),
                " WHERE id = (SELECT id FROM idempotent_requests \
                             WHERE state = 'in_progress' AND locked_until <= ",
                now!(),
                "{guard} ORDER BY locked_until LIMIT 1 FOR UPDATE SKIP LOCKED) \
                   AND state = 'in_progress' AND locked_until <= ",
                now!(),
                "{guard} RETURNING ",
                record_columns!(),
                record_clock!()
            ),
            guard = guard
        );
        retrying(|| async {
            let row: Option<RecordRow<Ts>> = sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))
                .bind(&lease.token)
                .bind(millis(lease.duration))
                .bind(age_ms)
                .fetch_optional(&self.pool)
                .await?;
            row.map(IdempotencyRecord::try_from).transpose()
        })
        .await
    }

    async fn expired_in_progress(&self, limit: u32) -> Result<Vec<IdempotencyRecord>, StoreError> {
        let rows: Vec<RecordRow<Ts>> = sqlx::query_as(concat!(
            "SELECT ",
            record_columns!(),
            record_clock!(),
            " FROM idempotent_requests WHERE state = 'in_progress' AND locked_until <= ",
            now!(),
            " ORDER BY locked_until LIMIT $1"
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(IdempotencyRecord::try_from).collect()
    }

    async fn prune(&self, batch: u32) -> Result<u64, StoreError> {
        retrying(|| async {
            let done = sqlx::query(concat!(
                "DELETE FROM idempotent_requests WHERE id IN \
                 (SELECT id FROM idempotent_requests \
                  WHERE state = 'complete' AND expires_at <= ",
                now!(),
                " LIMIT $1 FOR UPDATE SKIP LOCKED)"
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
        let row: Option<RecordRow<Ts>> = sqlx::query_as(concat!(
            "SELECT ",
            record_columns!(),
            record_clock!(),
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
