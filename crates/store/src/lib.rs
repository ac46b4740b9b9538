//! The backends of the domain's [`Store`] port: SQLite (the embedded
//! default), PostgreSQL and MySQL/MariaDB. Each statement is written once,
//! in [`sql`], against a small [`Dialect`]; the backends' own files hold
//! their connection settings and the few places where behaviour truly
//! differs (the table in `docs/architecture.md`).
//!
//! Time is the database's: every time that decides who owns a record or
//! whether it exists is computed in SQL, never read from this host.

mod batch;
mod dialect;
mod lane;
mod mysql;
mod postgres;
mod rows;
mod sql;
mod sqlite;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use payments_domain::store::{BoxError, Store, StoreError};

pub use batch::{BATCH_BUCKETS, WRITE_BATCH_SIZE};
pub use dialect::Dialect;
pub use mysql::{MySql, MySqlStore};
pub use postgres::{Postgres, PostgresStore};
pub use sql::SqlStore;
pub use sqlite::{Sqlite, SqliteStore};

/// Which backend a [`DatabaseUrl`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Sqlite,
    Postgres,
    MySql,
}

/// A database URL: `sqlite:`, `postgres://` (`postgresql://`) or
/// `mysql://` (`mariadb://`). Its `Debug` and `Display` hide the password,
/// so it can be logged and kept in settings that are printed.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    url: String,
    kind: BackendKind,
}

impl std::str::FromStr for DatabaseUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        let kind = match url.split_once(':').map_or("", |(scheme, _)| scheme) {
            "sqlite" => BackendKind::Sqlite,
            "postgres" | "postgresql" => BackendKind::Postgres,
            "mysql" | "mariadb" => BackendKind::MySql,
            _ => {
                return Err(format!(
                    "unsupported database URL {:?}: use sqlite:, postgres:// or mysql:// (mariadb://)",
                    redact(url)
                ));
            }
        };
        Ok(Self {
            url: url.to_owned(),
            kind,
        })
    }
}

impl DatabaseUrl {
    /// The URL with its password, for the driver only.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// The database file of a `sqlite:` URL, as the driver reads it;
    /// `None` for an in-memory database (`sqlite::memory:`, `mode=memory`),
    /// a URL that names no file, and the other backends.
    pub fn sqlite_file(&self) -> Option<std::path::PathBuf> {
        use std::str::FromStr;
        if self.kind != BackendKind::Sqlite {
            return None;
        }
        let rest = self
            .url
            .trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:");
        let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
        let in_memory = database == ":memory:"
            || url::form_urlencoded::parse(params.as_bytes())
                .any(|(name, value)| name == "mode" && value == "memory");
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url).ok()?;
        let file = options.get_filename();
        (!in_memory && !file.as_os_str().is_empty()).then(|| file.to_owned())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.url))
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}

/// A URL with its password replaced.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.into()
        }
        _ => url.to_owned(),
    }
}

/// Pool settings shared by the backends.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    /// SQLite: the most claims and finishes one transaction commits
    /// together (group commit); 1 commits each on its own. Other backends
    /// have many writers and ignore it.
    pub write_batch: u32,
}

/// [`PoolSettings::write_batch`]'s default: what queues behind one commit
/// at the concurrency a server sees is well under it (docs/benchmarks.md),
/// so it only bounds the wait of a batch's first caller.
pub const DEFAULT_WRITE_BATCH: u32 = 64;

/// A pooled connection idle longer than this is pinged before use.
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(30);

impl PoolSettings {
    /// The pool options every backend starts from, with `max` connections.
    ///
    /// sqlx pings every connection before handing it out, by default: one
    /// more round trip per statement. Here only a connection idle for
    /// [`PING_IF_IDLE_FOR`] (long enough for a restart or a middlebox to
    /// drop it) is pinged; a busy one that breaks fails its statement, an
    /// error the client retries with the same key.
    pub(crate) fn options<DB: sqlx::Database>(&self, max: u32) -> sqlx::pool::PoolOptions<DB> {
        sqlx::pool::PoolOptions::new()
            .max_connections(max)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| Box::pin(ping_if_idle(conn, meta)))
    }
}

/// The check before a pooled connection is handed out: a ping, when it has
/// been idle for [`PING_IF_IDLE_FOR`].
pub(crate) async fn ping_if_idle<C: sqlx::Connection>(
    conn: &mut C,
    meta: sqlx::pool::PoolConnectionMetadata,
) -> Result<bool, sqlx::Error> {
    if meta.idle_for >= PING_IF_IDLE_FOR {
        conn.ping().await?;
    }
    Ok(true)
}

/// One connection of the server's own, before a pool is built on it: a
/// server that cannot be reached is said at once, by address ("connection
/// refused at 127.0.0.1:5432"), where the pool would retry until its
/// acquire timeout and say only "pool timed out while waiting for an open
/// connection". Any other failure (a refused password, a missing database)
/// is the driver's own error, at once too.
pub(crate) async fn reach<O: sqlx::ConnectOptions>(
    options: &O,
    backend: &str,
    address: String,
) -> Result<(), StoreError>
where
    O::Connection: Sized,
{
    use sqlx::Connection;
    match options.connect().await {
        Ok(conn) => {
            // Only a probe: its close is no one's business.
            let _ = conn.close().await;
            Ok(())
        }
        Err(sqlx::Error::Io(e)) => {
            let what = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                _ => e.to_string(),
            };
            Err(StoreError::Unavailable(
                format!("cannot connect to {backend}: {what} at {address} ({e})").into(),
            ))
        }
        Err(e) => Err(classify(e)),
    }
}

/// `host:port`, or the Unix socket's path, of a server's connect options.
fn address(socket: Option<&std::path::PathBuf>, host: &str, port: u16) -> String {
    match socket {
        Some(path) => path.display().to_string(),
        None => format!("{host}:{port}"),
    }
}

/// Opens the backend the URL names. Does not migrate.
pub async fn connect(url: &DatabaseUrl, pool: &PoolSettings) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match url.kind {
        BackendKind::Sqlite => Arc::new(SqliteStore::connect(url, pool).await?),
        BackendKind::Postgres => Arc::new(PostgresStore::connect(url, pool).await?),
        BackendKind::MySql => Arc::new(MySqlStore::connect(url, pool).await?),
    })
}

/// What a statement failed with, inside this crate: the driver's error, or
/// rows that break an invariant. [`classify`] turns it into a
/// [`StoreError`] at the port.
#[derive(Debug)]
pub(crate) enum Error {
    Sql(sqlx::Error),
    Invariant(String),
    /// A transaction read back a row it had just written and did not find
    /// its own write: the database rolled the transaction back under it
    /// without the statement that followed failing (seen on Galera, where
    /// a replicated write set aborts a local transaction that holds its
    /// rows). Whatever the transaction did is not to be trusted; it is run
    /// again, like a deadlock.
    WriteLost(String),
    /// The claim's operation id (derived for its generation) is already a
    /// charge or refund: the claim's transaction is rolled back and the
    /// port answers `ClaimOutcome::GenerationTaken`.
    GenerationTaken,
}

impl Error {
    /// The error as a claim's: a unique violation of the operation's row
    /// means its generation is taken.
    pub(crate) fn generation_taken(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Database(db) if db.is_unique_violation() => Error::GenerationTaken,
            e => Error::Sql(e),
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Sql(e)
    }
}

/// The port's error for a driver error, by the driver's error kind and
/// SQLSTATE, never by message text:
/// - a unique violation (PostgreSQL 23505, SQLite 2067/1555, MySQL 1062);
/// - retryable: 40001 (PostgreSQL's serialization failure, MySQL's deadlock
///   1213), 40P01 (PostgreSQL's deadlock) and MySQL's lock wait timeout
///   1205 (SQLSTATE HY000, so by its number: on Galera it also ends a local
///   transaction that a replicated write set failed to abort; the whole
///   transaction is rolled back and run again);
/// - unavailable: the connection, not the statement, failed (I/O, pool
///   timeout, TLS; SQLSTATE class 08, which covers a Galera node not yet
///   synced, MariaDB's 1047 with 08S01; PostgreSQL's 57P01-57P03, a server
///   shutting down or starting; 25006, a write reaching a standby, as when
///   a primary is demoted under an open pool).
pub(crate) fn classify(e: impl Into<Error>) -> StoreError {
    let e = match e.into() {
        Error::Invariant(what) => return StoreError::Invariant(what),
        Error::WriteLost(what) => {
            tracing::warn!(%what, "a transaction lost its own write without an error; running it again");
            return StoreError::Retryable(what.into());
        }
        Error::GenerationTaken => {
            return StoreError::Invariant("a claim's generation was taken".into());
        }
        Error::Sql(e) => e,
    };
    let code = match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            return StoreError::Conflict(e.into());
        }
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    let lock_wait_timeout = matches!(&e, sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|m| m.number() == 1205));
    let unavailable = matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
    ) || code
        .as_deref()
        .is_some_and(|c| c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "25006"));
    let boxed: BoxError = e.into();
    match code.as_deref() {
        Some("40001" | "40P01") => StoreError::Retryable(boxed),
        _ if lock_wait_timeout => StoreError::Retryable(boxed),
        _ if unavailable => StoreError::Unavailable(boxed),
        _ => StoreError::Database(boxed),
    }
}

/// How often an operation that failed with a retryable conflict is run.
/// With [`backoff`], the retries wait about 0.7 s in all: with a thousand
/// provider events applied at once on serializable PostgreSQL, a refund's
/// transaction used up ten attempts on a loaded CI machine (a 500), and
/// runs here took finishes racing their own webhooks to the seventh or
/// eighth.
const RETRY_ATTEMPTS: u32 = 16;

/// The wait before running an operation again after its `attempt`-th
/// conflict: uniform in [base/2, 3 base/2) for a base of 2^attempt ms
/// (at most 64): racers that collided spread out instead of colliding
/// again at the same instant.
fn backoff(attempt: u32) -> Duration {
    let base = 1u64 << attempt.min(6);
    let random = u64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or_default(),
    );
    Duration::from_millis(base / 2 + random % base)
}

/// Runs one store operation to its end at the port: again while it fails
/// with a serialization failure or deadlock (at most [`RETRY_ATTEMPTS`]
/// times, with a short jittered backoff so racers spread), its error
/// classified. Every operation is one transaction, or one statement, so
/// running it again is safe. The only place the store retries.
pub(crate) async fn run<T, F, Fut>(mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut attempt = 1;
    loop {
        match op().await.map_err(classify) {
            Err(StoreError::Retryable(reason)) if attempt < RETRY_ATTEMPTS => {
                let wait = backoff(attempt);
                tracing::debug!(attempt, %reason, backoff_ms = wait.as_millis(), op = std::any::type_name::<F>(), "retrying a conflicted transaction");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// A duration as whole milliseconds for SQL, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

#[cfg(test)]
mod tests {
    use super::{DatabaseUrl, redact};

    #[test]
    fn backoffs_spread_around_a_base_that_doubles_up_to_64_ms() {
        for attempt in 1..super::RETRY_ATTEMPTS {
            let base = 1u128 << attempt.min(6);
            for _ in 0..50 {
                let wait = super::backoff(attempt).as_millis();
                assert!(
                    wait >= base / 2 && wait < base * 3 / 2,
                    "{attempt}: {wait} ms"
                );
            }
        }
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact("mysql://u:s@cret@h:3306/db?x=1"),
            "mysql://u:***@h:3306/db?x=1"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://data/p@1.db"), "sqlite://data/p@1.db");
        let url = "postgres://u:secret@h/db"
            .parse::<DatabaseUrl>()
            .expect("valid");
        assert!(!format!("{url} {url:?}").contains("secret"));
    }

    #[test]
    fn refuses_unknown_schemes_without_the_password() {
        let err = "oracle://u:secret@h/db"
            .parse::<DatabaseUrl>()
            .expect_err("refused");
        assert!(err.contains("oracle://u:***@h/db"), "{err}");
    }

    #[test]
    fn names_the_sqlite_file_only_for_a_file() {
        let file = |url: &str| url.parse::<DatabaseUrl>().expect("valid").sqlite_file();
        let path = |p: &str| Some(std::path::PathBuf::from(p));
        assert_eq!(file("sqlite://data/payments.db"), path("data/payments.db"));
        assert_eq!(
            file("sqlite:data/payments.db?mode=rwc"),
            path("data/payments.db")
        );
        assert_eq!(file("sqlite:///tmp/p%20q.db"), path("/tmp/p q.db"));
        for none in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://?mode=memory",
            "sqlite://data/p.db?mode=memory",
            "sqlite://",
            "sqlite://data/p.db?mode=nonsense",
            "postgres://u@h/db",
            "mysql://u@h/db",
        ] {
            assert_eq!(file(none), None, "{none}");
        }
    }
}
