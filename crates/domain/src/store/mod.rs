//! The `Store` port and its backends.
//!
//! Each backend keeps its own SQL and migrations (`migrations/<backend>`);
//! what they share lives here: the trait, the error type, the one function
//! that recognises a unique violation, and the row types (generic over how a
//! backend stores a timestamp).
//!
//! Time is the database's. No method takes the caller's `now`: every
//! comparison that decides who owns a record or whether it still exists
//! (lease expiry, takeover, TTL reclaim, the reaper's and the pruner's
//! choices) is made in SQL against the database's clock, and every stored
//! time (`created_at`, `locked_until`, `completed_at`, `expires_at`; a
//! charge's `created_at` and `updated_at`) is computed there when the row is
//! written, as the database's current time (not its transaction's start)
//! plus an interval. Application hosts' clocks differ; they never decide.
//! Tests move time by ageing rows.

mod mysql;
mod postgres;
mod rows;
mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::charge::{Charge, ChargeStatus};
use crate::idempotency::{IdempotencyRecord, RecordState, StoredResponse};

pub use mysql::MySqlStore;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// What a backend can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A unique constraint other than the claim's arbitration was violated.
    #[error("unique constraint violated: {0}")]
    Conflict(String),
    /// A row the caller relies on is missing (e.g. the charge of a record).
    #[error("not found: {0}")]
    NotFound(String),
    /// A serialization failure or deadlock: the transaction was rolled back
    /// and may succeed if run again (see [`retrying`]).
    #[error("transaction conflict, retry: {0}")]
    Retryable(String),
    /// The database could not be reached or dropped the connection: a
    /// retry later may succeed (the API answers 503 with `Retry-After`).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The database is misconfigured or failed.
    #[error("database error: {0}")]
    Other(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if is_unique_violation(&e) {
            StoreError::Conflict(e.to_string())
        } else if is_retryable(&e) {
            StoreError::Retryable(e.to_string())
        } else if is_unavailable(&e) {
            StoreError::Unavailable(e.to_string())
        } else {
            StoreError::Other(e.to_string())
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError::Other(format!("migration failed: {e}"))
    }
}

/// "Someone has this key": recognised by the driver's error kind (Postgres
/// 23505, SQLite 2067/1555, MySQL error number 1062), never by message text.
pub fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// A transaction the database rolled back to keep its isolation promise,
/// which will likely succeed when run again: SQLSTATE 40001 (PostgreSQL's
/// serialization failure under SERIALIZABLE, MySQL's deadlock 1213, and
/// what CockroachDB and YugabyteDB send for any conflict) and 40P01
/// (PostgreSQL's deadlock).
pub fn is_retryable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

/// The connection, not the statement, failed: an I/O error (a dropped or
/// reset connection), a pool that could not hand out a connection in time,
/// or a server refusing work while it shuts down or starts (SQLSTATE class
/// 08, connection exception; 57P01-57P03, PostgreSQL's admin shutdown,
/// crash shutdown and cannot-connect-now).
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

/// How often a transaction that failed with a retryable conflict is run.
const RETRY_ATTEMPTS: u32 = 10;

/// Runs `op` until it does not fail with [`StoreError::Retryable`], at most
/// [`RETRY_ATTEMPTS`] times, with a short jittered backoff so racers spread.
pub(crate) async fn retrying<T, F, Fut>(mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Err(StoreError::Retryable(reason)) if attempt < RETRY_ATTEMPTS => {
                let backoff_ms =
                    (1u64 << attempt.min(6)) + u64::from(uuid::Uuid::new_v4().as_bytes()[0] % 8);
                tracing::debug!(attempt, %reason, backoff_ms, "retrying a conflicted transaction");
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Runs one backend's claim attempt until it settles: again when the row it
/// saw changed under it (`Ok(None)`, at most [`CLAIM_ATTEMPTS`] times), and
/// from scratch on a retryable conflict (under SERIALIZABLE a racing claimer
/// fails with 40001 instead of seeing the winner's row; run again, it does).
pub(crate) async fn settle_claim<F, Fut>(key: &str, attempt: F) -> Result<ClaimOutcome, StoreError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Option<ClaimOutcome>, StoreError>>,
{
    let attempt = &attempt;
    retrying(move || async move {
        for _ in 0..CLAIM_ATTEMPTS {
            if let Some(outcome) = attempt().await? {
                return Ok(outcome);
            }
        }
        Err(StoreError::Other(format!(
            "claim of key {key:?} did not settle after {CLAIM_ATTEMPTS} attempts"
        )))
    })
    .await
}

/// What a claim answers from a record it found without writing: the record,
/// unless it is complete and past its TTL by the database's clock (then it
/// is to be reclaimed, under a write) or absent. A record whose answer is
/// not final (in progress, or abandoned) is never reclaimed.
pub(crate) fn known_key(record: Option<IdempotencyRecord>) -> Option<ClaimOutcome> {
    record
        .filter(|r| !r.reclaimable())
        .map(|r| ClaimOutcome::Existing(Box::new(r)))
}

/// A duration as whole milliseconds for SQL, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// A lease to take: a fresh token, held for `duration` from the database's
/// clock at the moment the row is written, so a claim that waited for a
/// lock, or a record taken late in a reaper's pass, still gets all of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLease {
    pub token: String,
    pub duration: Duration,
}

impl NewLease {
    pub fn new(duration: Duration) -> Self {
        Self {
            token: uuid::Uuid::new_v4().simple().to_string(),
            duration,
        }
    }
}

/// Which in-progress records a takeover may take, by how long ago they were
/// claimed (by the database's clock). Re-drives take only records
/// `Under` the provider's key retention minus the margin; records `AtLeast`
/// that old are taken only to be abandoned, without a provider call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAge {
    Under(Duration),
    AtLeast(Duration),
}

/// A request to claim a key: the record to insert and the pending charge
/// that goes in the same transaction.
#[derive(Debug, Clone)]
pub struct Claim {
    pub key: String,
    pub route: String,
    pub customer_id: String,
    pub request_hash: String,
    pub lease: NewLease,
    /// How long the key is remembered once claimed.
    pub ttl: Duration,
    /// The pending charge; the store sets its timestamps.
    pub charge: Charge,
}

/// The result of a claim.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    /// This caller inserted (or reclaimed an expired) record and holds the
    /// lease; the charge is as stored, with the database's timestamps.
    Claimed { record_id: i64, charge: Box<Charge> },
    /// Someone else has this key; the caller decides from the record.
    Existing(Box<IdempotencyRecord>),
}

/// What the provider said about a charge, as the `charges` row records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeOutcome {
    pub charge_id: String,
    pub status: ChargeStatus,
    pub gateway_charge_id: Option<String>,
    pub decline_code: Option<String>,
}

/// The final outcome of a charge, written with its record in one
/// transaction: the record becomes `state` (complete, or abandoned).
#[derive(Debug, Clone)]
pub struct Finish {
    pub record_id: i64,
    pub lease_token: String,
    pub state: RecordState,
    pub outcome: ChargeOutcome,
    pub response: StoredResponse,
}

/// Whether this finisher was the one that completed the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishOutcome {
    Finished,
    /// The record was not in progress under this lease token any more.
    Lost,
}

/// Persistence for idempotency records and charges.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Applies this backend's migrations.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Reachable, and every migration this build knows is applied.
    async fn ready(&self) -> Result<(), StoreError>;

    /// Inserts the record (`in_progress`) and its pending charge in one
    /// transaction. The unique index on (key, route) arbitrates: a loser gets
    /// the existing record. A complete record past `expires_at` is treated
    /// as absent and reclaimed by a conditional update; an in-progress or
    /// abandoned one never is.
    ///
    /// A key already known (a replay, a duplicate in flight) is answered
    /// without writing or taking a lock: it is the common retry, and on
    /// SQLite a write lock would queue it behind every new charge.
    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError>;

    /// Takes over an in-progress record whose lease has expired, by
    /// compare-and-set on the expected lease token, if it was claimed
    /// `age` ago (the guard is in the statement). True if this caller won.
    async fn take_over(
        &self,
        record_id: i64,
        expected_token: &str,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<bool, StoreError>;

    /// Ends the lease now (outcome unknown), keeping the record in progress
    /// so a retry or the reaper can take it over at once.
    async fn release(&self, record_id: i64, lease_token: &str) -> Result<bool, StoreError>;

    /// Completes (or abandons) the record and updates its charge in one
    /// transaction, guarded by `state = 'in_progress' AND lease_token = mine`.
    async fn finish(&self, finish: &Finish) -> Result<FinishOutcome, StoreError>;

    /// Inserts a charge with no idempotency record: the keyless requests of
    /// `IDEMPOTENCY_KEY_MODE=optional`, which nothing protects. Returns it
    /// as stored, with the database's timestamps.
    async fn insert_charge(&self, charge: &Charge) -> Result<Charge, StoreError>;

    /// Records the outcome of a charge still `pending`, outside a finish: a
    /// keyless charge, or the charge of a driver that lost its record. False
    /// when the charge is not pending (another driver settled it) or absent.
    async fn settle_charge(&self, outcome: &ChargeOutcome) -> Result<bool, StoreError>;

    /// Takes over the in-progress record whose lease expired longest ago
    /// among those claimed `age` ago, giving it `lease`; `None` when there
    /// is none. Several reapers at once never get the same record (a
    /// conditional update under the row lock, `FOR UPDATE SKIP LOCKED`
    /// where the backend has it).
    async fn claim_expired(
        &self,
        lease: &NewLease,
        age: ClaimAge,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;

    /// In-progress records whose lease has expired, oldest lease first,
    /// changing nothing (the reaper's dry run).
    async fn expired_in_progress(&self, limit: u32) -> Result<Vec<IdempotencyRecord>, StoreError>;

    /// Deletes at most `batch` complete records past `expires_at` in one
    /// short statement; returns how many. Never in-progress or abandoned
    /// records, never charges.
    async fn prune(&self, batch: u32) -> Result<u64, StoreError>;

    /// Rows the pruner deletes per statement unless told otherwise.
    fn default_prune_batch(&self) -> u32 {
        5000
    }

    /// The shortest rest a bulk writer (the pruner) should take between
    /// batches so that the API's writes get in. Zero where writers do not
    /// block each other's rows.
    fn batch_pause_floor(&self) -> Duration {
        Duration::ZERO
    }

    /// How many complete records are past `expires_at` (the pruner's dry run).
    async fn count_prunable(&self) -> Result<u64, StoreError>;

    /// A record by id.
    async fn record(&self, record_id: i64) -> Result<Option<IdempotencyRecord>, StoreError>;

    /// A charge by id.
    async fn charge(&self, charge_id: &str) -> Result<Option<Charge>, StoreError>;
}

/// Pool settings shared by the backends.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
        }
    }
}

/// A pooled connection idle longer than this is pinged before use.
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(30);

impl PoolSettings {
    /// The pool options every backend starts from, with `max` connections.
    ///
    /// sqlx pings every connection before handing it out, by default: one
    /// more round trip per statement, three per charge. Only a connection
    /// that sat idle for [`PING_IF_IDLE_FOR`] (long enough for a server
    /// restart or a middlebox to have dropped it) is pinged here, and a
    /// failed ping replaces it. A busy connection that breaks fails its
    /// statement, which the request answers as an error to retry with the
    /// same key.
    pub(crate) fn options<DB: sqlx::Database>(&self, max: u32) -> sqlx::pool::PoolOptions<DB> {
        sqlx::pool::PoolOptions::new()
            .max_connections(max)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
    }
}

/// Opens the backend named by the URL's scheme: `sqlite:`, `postgres://`
/// (`postgresql://`) or `mysql://` (`mariadb://`). Does not migrate.
pub async fn connect(url: &str, pool: &PoolSettings) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url, pool).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::connect(url, pool).await?))
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        Ok(Arc::new(MySqlStore::connect(url, pool).await?))
    } else {
        Err(StoreError::Other(format!(
            "unsupported DATABASE_URL scheme in {:?}: use sqlite:, postgres:// or mysql://",
            redact(url)
        )))
    }
}

/// A URL with its password replaced, for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Claims loop at most this often when the row they saw changes under them
/// (reclaimed by another caller, or pruned between the insert and the read).
const CLAIM_ATTEMPTS: usize = 5;

/// `ready()`'s migration check: every migration this build embeds is applied.
fn check_migrations(migrator: &sqlx::migrate::Migrator, applied: &[i64]) -> Result<(), StoreError> {
    let missing: Vec<i64> = migrator
        .iter()
        .map(|m| m.version)
        .filter(|v| !applied.contains(v))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(StoreError::Other(format!(
            "migrations not applied: {missing:?} (run `payments-api migrate`)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://data/p.db"), "sqlite://data/p.db");
    }
}
