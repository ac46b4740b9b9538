//! MySQL 8.0+ and MariaDB 10.6+ (InnoDB), for teams whose database is
//! MySQL. Only syntax both share: no `RETURNING`, no `ON CONFLICT`.
//!
//! The claim is a plain `INSERT` whose duplicate-key error (number 1062,
//! recognised by the driver's error kind: SQLSTATE 23000 alone also covers
//! other violations) means "someone has this key". InnoDB rolls back only
//! the failed statement, so the transaction reads the existing row next. No
//! `INSERT IGNORE`: it would turn every other error into a warning too.
//! Sessions run at READ COMMITTED (each statement sees the latest committed
//! rows and InnoDB takes no gap locks), and deadlocks (1213, SQLSTATE
//! 40001) are retried.
//!
//! On a MariaDB Galera cluster (`wsrep_on` is `ON`), every session sets
//! `wsrep_sync_wait = 1`: a node applies the writes other nodes committed
//! before it answers a read (`SELECT`, `BEGIN`), so a key's record, a replay
//! and a charge read on one node show what another node acknowledged.
//! Writes need no wait: certification at commit aborts the later of two
//! conflicting write sets with a deadlock (1213), which [`crate::run`]
//! retries. The store then reports the cluster
//! ([`payments_domain::store::Store::cluster`]): the migrator's `GET_LOCK`
//! is refused by some Galera releases and per node on the others, so it
//! serialises nothing there.
//!
//! Time: `SYSDATE(3)`, the time when the expression runs (`NOW()` would be
//! the statement's start, before any lock wait), with the session time zone
//! at UTC. `SYSDATE` is not safe for statement-based replication; MySQL and
//! MariaDB replicate row images by default, and Galera requires them.

use sqlx::mysql::{MySqlConnectOptions, MySqlQueryResult};
use sqlx::{Executor, Row};

use crate::dialect::Dialect;
use crate::{DatabaseUrl, PoolSettings, SqlStore, classify};
use payments_domain::store::StoreError;

/// MySQL's and MariaDB's dialect.
#[derive(Debug)]
pub struct MySql;

impl Dialect for MySql {
    type Db = sqlx::MySql;
    type Ts = chrono::DateTime<chrono::Utc>;
    const NOW: &'static str = "SYSDATE(3)";
    const RETURNING: bool = false;
    const DELETE_LIMIT: bool = true;
    const MIGRATOR: &'static sqlx::migrate::Migrator = &sqlx::migrate!("../../migrations/mysql");

    fn interval(param: &str) -> String {
        format!("INTERVAL ({param} * 1000) MICROSECOND")
    }

    fn at_ms(param: &str) -> String {
        // Not FROM_UNIXTIME: MariaDB's ends in 2038.
        format!("(CAST('1970-01-01' AS DATETIME(6)) + INTERVAL ({param} * 1000) MICROSECOND)")
    }

    fn json_text(column: &str, key: &str) -> String {
        format!("JSON_UNQUOTE(JSON_EXTRACT({column}, CONCAT('$.\"', {key}, '\"')))")
    }

    /// `VARBINARY`: the driver reads bytes as text only from a column
    /// with a character set (sqlx refuses `String` for the `binary`
    /// collation), so the bytes, UTF-8 as written, are named as such.
    fn customer_id(column: &str) -> String {
        format!("CONVERT({column} USING utf8mb4) AS customer_id")
    }

    fn ms_since(column: &str) -> String {
        format!(
            "TIMESTAMPDIFF(MICROSECOND, {column}, {}) DIV 1000",
            Self::NOW
        )
    }

    /// The driver asks for `CLIENT_FOUND_ROWS`: rows matched, not changed.
    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }

    fn placeholder(_: usize) -> String {
        "?".to_owned()
    }
}

/// A `Store` on a MySQL or MariaDB database.
pub type MySqlStore = SqlStore<MySql>;

impl MySqlStore {
    pub async fn connect(url: &DatabaseUrl, settings: &PoolSettings) -> Result<Self, StoreError> {
        let url = url.expose().replacen("mariadb://", "mysql://", 1);
        let options: MySqlConnectOptions = url.parse().map_err(classify)?;
        let at = crate::address(options.get_socket(), options.get_host(), options.get_port());
        crate::reach(&options, "MySQL/MariaDB", at).await?;
        let pool = settings
            .options(settings.max_connections)
            .after_connect(|conn: &mut sqlx::MySqlConnection, _| {
                Box::pin(async move {
                    // DATETIME columns hold UTC; SYSDATE answers in the
                    // session's time zone.
                    conn.execute("SET SESSION time_zone = '+00:00'").await?;
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    if galera(conn).await? {
                        conn.execute("SET SESSION wsrep_sync_wait = 1").await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(classify)?;
        let mut conn = pool.acquire().await.map_err(classify)?;
        let on_galera = galera(&mut conn).await.map_err(classify)?;
        drop(conn);
        let store = Self::new(pool.clone(), pool);
        Ok(if on_galera {
            store.on_cluster("galera")
        } else {
            store
        })
    }
}

/// Whether the server is a Galera node: MariaDB's `wsrep_on` is `ON` (MySQL
/// has no such variable; a MariaDB without Galera says `OFF`).
async fn galera(conn: &mut sqlx::MySqlConnection) -> Result<bool, sqlx::Error> {
    let row = sqlx::query("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
        .fetch_optional(conn)
        .await?;
    Ok(match row {
        Some(row) => row.try_get::<String, _>(1)?.eq_ignore_ascii_case("ON"),
        None => false,
    })
}
