//! PostgreSQL, for production.
//!
//! The claim uses `INSERT .. ON CONFLICT DO NOTHING RETURNING` rather than
//! catching a unique violation, because a failed statement aborts the whole
//! PostgreSQL transaction; under READ COMMITTED the insert waits for a
//! concurrent claimer to commit or roll back, and the following read sees
//! its committed row.
//!
//! A claim and a finish are one statement each (writable CTEs): one round
//! trip instead of four or five (`BEGIN`, the writes, `COMMIT`; see
//! `docs/benchmarks.md`). Only a record past its TTL, or one a racer
//! committed after the statement's snapshot, goes to the transaction that
//! reads the row and may reclaim it.
//!
//! Time: `clock_timestamp()` (when the expression runs, not the
//! transaction's start as `now()` would be), to the millisecond. Under READ
//! COMMITTED an UPDATE that waited for a row lock re-evaluates its
//! conditions and its SET list afterwards, so a lease it writes starts when
//! the write happens.

use sqlx::postgres::{PgConnectOptions, PgQueryResult};

use crate::dialect::Dialect;
use crate::{DatabaseUrl, PoolSettings, SqlStore, classify};
use payments_domain::store::StoreError;

/// PostgreSQL's dialect.
#[derive(Debug)]
pub struct Postgres;

impl Dialect for Postgres {
    type Db = sqlx::Postgres;
    type Ts = chrono::DateTime<chrono::Utc>;
    const NOW: &'static str = "date_trunc('milliseconds', clock_timestamp())";
    const METADATA: &'static str = "metadata::text AS metadata";
    const ONE_STATEMENT: bool = true;
    const MIGRATOR: &'static sqlx::migrate::Migrator = &sqlx::migrate!("../../migrations/postgres");

    fn interval(param: &str) -> String {
        format!("({param}::float8 * interval '1 millisecond')")
    }

    fn ms_since(column: &str) -> String {
        format!(
            "(EXTRACT(EPOCH FROM ({} - {column})) * 1000)::int8",
            Self::NOW
        )
    }

    fn flag(condition: &str) -> String {
        format!("({condition})::int::int8")
    }

    fn json(param: &str) -> String {
        format!("{param}::jsonb")
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }
}

/// A `Store` on a PostgreSQL database.
pub type PostgresStore = SqlStore<Postgres>;

impl PostgresStore {
    pub async fn connect(url: &DatabaseUrl, settings: &PoolSettings) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.expose().parse().map_err(classify)?;
        let pool = settings
            .options(settings.max_connections)
            .connect_with(options.application_name("payments"))
            .await
            .map_err(classify)?;
        Ok(Self::new(pool.clone(), pool))
    }
}
