//! SQLite, the embedded default. WAL with `synchronous = FULL` (a committed
//! charge survives power loss), and a busy timeout so writers in other
//! processes (`payments-jobs`, a second server) queue instead of failing.
//!
//! One writer: SQLite has one write lock. Writers sharing the reader pool
//! would each take it and, finding it taken, sleep and poll in the busy
//! handler: throughput drops and the tail grows to the handler's back-off.
//! So every write goes through a pool of one connection, where writers
//! queue in order and the next starts the moment the last commits; reads
//! use the pool and never wait for it (WAL). A transaction that reads
//! before it writes starts with `BEGIN IMMEDIATE`, taking the lock up
//! front, so it cannot fail with `SQLITE_BUSY_SNAPSHOT` when another write
//! commits between its read and its write; a single write statement takes
//! the lock when it starts. Claims and finishes are committed in batches
//! through that connection (group commit, [`crate::batch`]): one fsync for
//! every claim and finish that queued behind the last commit.
//!
//! A transaction SQLite rolls back itself (a full disk, an I/O error, a
//! trigger's `RAISE(ROLLBACK)`) makes the driver's `ROLLBACK` fail ("no
//! transaction is active"), and the driver then still counts the
//! transaction open: every later `BEGIN` on that connection would fail. So
//! the writer is checked before it is handed out: a connection still
//! counting a transaction is closed and replaced (whichever write left it
//! so, batched or not), and the writer is marked failing until a probe
//! write succeeds ([`payments_domain::store::Store::ready`]).
//!
//! Time: the clock of the process that opens the file, so one SQLite
//! database has one clock. Times are integer Unix milliseconds.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteQueryResult, SqliteSynchronous};

use crate::dialect::Dialect;
use crate::sql::WriterHealth;
use crate::{DatabaseUrl, PoolSettings, SqlStore, classify, ping_if_idle};
use payments_domain::store::StoreError;

/// SQLite's dialect.
#[derive(Debug)]
pub struct Sqlite;

impl Dialect for Sqlite {
    type Db = sqlx::Sqlite;
    type Ts = i64;
    const NOW: &'static str = "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)";
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    const SKIP_LOCKED: &'static str = "";
    const FOR_UPDATE: &'static str = "";
    const SINGLE_WRITER: bool = true;
    const MIGRATOR: &'static sqlx::migrate::Migrator = &sqlx::migrate!("../../migrations/sqlite");

    fn interval(param: &str) -> String {
        param.to_owned()
    }

    fn at_ms(param: &str) -> String {
        param.to_owned()
    }

    fn json_text(column: &str, key: &str) -> String {
        format!("json_extract({column}, '$.\"' || {key} || '\"')")
    }

    fn ms_since(column: &str) -> String {
        format!("({} - {column})", Self::NOW)
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
}

/// A `Store` on one SQLite database file.
pub type SqliteStore = SqlStore<Sqlite>;

impl SqliteStore {
    pub async fn connect(url: &DatabaseUrl, settings: &PoolSettings) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url.expose())
            .map_err(classify)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        // `None` for an in-memory database (sqlx names it after a file
        // that does not exist, so the file's absence says nothing there).
        let file = url.sqlite_file();
        // A typo in DATABASE_URL would otherwise start on a new, empty
        // database without a word: say where one was created.
        let new = file.as_ref().is_some_and(|f| !f.exists());
        if let Some(dir) = file.as_ref().and_then(|f| f.parent())
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(|e| classify(sqlx::Error::from(e)))?;
        }
        if let Some(file) = file.as_ref().filter(|_| new) {
            let path = std::path::absolute(file).unwrap_or_else(|_| file.clone());
            tracing::warn!(
                path = %path.display(),
                "no SQLite database at DATABASE_URL's path: creating a new, empty one; if a \
                 database was expected there, check the path"
            );
        }
        let health = Arc::new(WriterHealth::default());
        let replaces = health.clone();
        let writer = settings
            .options(1)
            .before_acquire(move |conn, meta| {
                let health = replaces.clone();
                Box::pin(async move {
                    if sqlx::Connection::is_in_transaction(conn) {
                        tracing::error!(
                            "the SQLite writer is still inside a transaction that SQLite rolled \
                             back itself (a full disk, an I/O error): the connection is replaced"
                        );
                        health.failed();
                        return Ok(false);
                    }
                    ping_if_idle(conn, meta).await
                })
            })
            .connect_with(options.clone())
            .await
            .map_err(classify)?;
        let pool = settings
            .options(settings.max_connections)
            .connect_with(options)
            .await
            .map_err(classify)?;
        Ok(Self::new(pool, writer)
            .batched(settings.write_batch)
            .watched(health))
    }
}
