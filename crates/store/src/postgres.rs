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

use payments_domain::charge::CustomerId;
use payments_domain::list::ChargeQuery;
use sqlx::Row;

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
    const ONE_STATEMENT: bool = true;
    const MIGRATOR: &'static sqlx::migrate::Migrator = &sqlx::migrate!("../../migrations/postgres");

    fn interval(param: &str) -> String {
        format!("({param}::float8 * interval '1 millisecond')")
    }

    fn at_ms(param: &str) -> String {
        format!("to_timestamp({param}::float8 / 1000)")
    }

    fn json_text(column: &str, key: &str) -> String {
        format!("({column} ->> {key}::text)")
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

    fn metadata(column: &str) -> String {
        format!("{column}::text AS metadata")
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
    /// PostgreSQL's own plan of the page `query` reads, run
    /// (`EXPLAIN (ANALYZE, BUFFERS)`, text lines): how an operator, or a
    /// test, sees that a page is one index range scan.
    pub async fn explain_list_charges(
        &self,
        customer: Option<&CustomerId>,
        query: &ChargeQuery,
    ) -> Result<Vec<String>, StoreError> {
        let sql = format!(
            "EXPLAIN (ANALYZE, BUFFERS) {}",
            self.list_charges_sql(customer, query)
        );
        let rows = Self::list_charges_query(&sql, customer, query)
            .fetch_all(self.pool())
            .await
            .map_err(classify)?;
        rows.iter()
            .map(|row| row.try_get::<String, _>(0).map_err(classify))
            .collect()
    }

    /// How many connections the lane keeps now (`None`: no lane, the pool
    /// has fewer than two connections), for tests.
    pub fn lane_kept(&self) -> Option<usize> {
        self.lane().map(|lane| lane.kept())
    }

    pub async fn connect(url: &DatabaseUrl, settings: &PoolSettings) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.expose().parse().map_err(classify)?;
        let at = crate::address(options.get_socket(), options.get_host(), options.get_port());
        crate::reach(&options, "PostgreSQL", at).await?;
        let pool = settings
            .options(settings.max_connections)
            .connect_with(options.application_name("payments"))
            .await
            .map_err(classify)?;
        Ok(Self::new(pool.clone(), pool).with_lane(settings.max_connections))
    }
}
