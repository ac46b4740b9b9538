//! # payments-tests support
//!
//! What every test needs and none should write twice:
//! - [`TestDb`]: a fresh database for one test on a named [`Backend`]:
//!   a temp SQLite file, or a new database on PostgreSQL ([`postgres`]) or
//!   MariaDB ([`mysql`]), found or started as [`throwaway`] says. It opens
//!   the real `Store` and can count rows behind it.
//! - [`spawn_app`]: the real API router on 127.0.0.1:0 in front of a real
//!   sandbox over HTTP, with typed helpers (`post_charge`, `sandbox_charges`).
//! - [`backend_tests!`]: runs one async test body once per backend.
//! - [`Process`]: a real binary of the workspace as a child process
//!   ([`binary`] builds it when it is missing or stale).
#![allow(clippy::unwrap_used)]

pub mod galera;
pub mod mysql;
pub mod patroni;
pub mod postgres;
mod throwaway;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use payments_api::auth::{mint_hs256, mint_hs256_scoped};
use payments_api::config::{Cli, KeyMode};
use payments_api::{AppState, serve};
use payments_app::Provider;
use payments_app::settings::SANDBOX_SECRET_KEY;
use payments_domain::service::ChargeService;
use payments_domain::store::Store;
use payments_sandbox::{SandboxConfig, SandboxHandle};
use payments_store::{DatabaseUrl, MySqlStore, PoolSettings, PostgresStore, SqliteStore};
use serde_json::Value;
use throwaway::{Engine, TestDatabase};
pub use throwaway::{Skip, skip_or_panic};

/// A database backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    /// PostgreSQL with `default_transaction_isolation = serializable`, as a
    /// distributed SQL engine (CockroachDB, YugabyteDB) runs every transaction.
    PostgresSerializable,
    /// MySQL or MariaDB (InnoDB).
    Mysql,
    /// A three-node MariaDB Galera cluster ([`galera::Galera::shared`]):
    /// the store on node 1, racers spread over the nodes ([`TestDb::racer`]).
    Galera,
}

impl Backend {
    /// `sqlite`, `postgres`, `postgres_serializable`, `mysql`: as the tests
    /// of [`backend_tests!`] are named.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::PostgresSerializable => "postgres_serializable",
            Self::Mysql => "mysql",
            Self::Galera => "galera",
        }
    }

    fn engine(self) -> Option<Engine> {
        match self {
            Self::Sqlite => None,
            Self::Postgres | Self::PostgresSerializable => Some(Engine::Postgres),
            Self::Mysql | Self::Galera => Some(Engine::Mysql),
        }
    }

    /// The admin URL of the server this backend's databases go on.
    fn admin_url(self) -> Option<Result<String, throwaway::Skip>> {
        match self {
            Self::Galera => Some(galera::Galera::shared().map(|cluster| cluster.urls[0].clone())),
            other => other.engine().map(Engine::admin_url),
        }
    }
}

/// Runs `$name` (an `async fn(Backend)`) as one test per backend:
/// `name::sqlite`, `name::postgres` and `name::mysql`; with `all;` first
/// (the store's conformance suite), also `name::postgres_serializable` and
/// `name::galera`; with `serializable;`, `name::postgres_serializable` only.
#[macro_export]
macro_rules! backend_tests {
    (serializable; $($name:ident),* $(,)?) => {$(
        mod $name {
            $crate::backend_test!($name, sqlite, Sqlite);
            $crate::backend_test!($name, postgres, Postgres);
            $crate::backend_test!($name, postgres_serializable, PostgresSerializable);
            $crate::backend_test!($name, mysql, Mysql);
        }
    )*};
    (all; $($name:ident),* $(,)?) => {$(
        mod $name {
            $crate::backend_test!($name, sqlite, Sqlite);
            $crate::backend_test!($name, postgres, Postgres);
            $crate::backend_test!($name, postgres_serializable, PostgresSerializable);
            $crate::backend_test!($name, mysql, Mysql);
            $crate::backend_test!($name, galera, Galera);
        }
    )*};
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            $crate::backend_test!($name, sqlite, Sqlite);
            $crate::backend_test!($name, postgres, Postgres);
            $crate::backend_test!($name, mysql, Mysql);
        }
    )*};
}

/// Runs `$name` (an `async fn(Backend)`) once on each backend reached over
/// a network connection: `name::postgres` and `name::mysql`. For what
/// SQLite cannot have: a second host with another clock, a connection to
/// lose.
#[macro_export]
macro_rules! network_backend_tests {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            $crate::backend_test!($name, postgres, Postgres);
            $crate::backend_test!($name, mysql, Mysql);
        }
    )*};
}

/// One test of [`backend_tests!`].
#[macro_export]
macro_rules! backend_test {
    ($name:ident, $test:ident, $backend:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            super::$name($crate::Backend::$backend).await;
        }
    };
}

enum Guard {
    Sqlite(PathBuf),
    Server(TestDatabase),
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Guard::Sqlite(path) = self {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

enum Concrete {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
    Mysql(MySqlStore),
}

fn database_url(url: &str) -> DatabaseUrl {
    url.parse::<DatabaseUrl>().expect("a test database's URL")
}

/// A copy of a test's database ([`TestDb::copy`]).
#[derive(Debug)]
pub struct DbCopy(String);

/// `path` with `suffix` after its file name (`-wal`, `-shm`).
fn with_suffix(path: &std::path::Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// The tables a lost tail takes rows from, parents first.
const LOST_TAIL_TABLES: [&str; 3] = ["idempotent_requests", "charges", "refunds"];

/// One test's own database, migrated, with its `Store`.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    store: Arc<dyn Store>,
    /// The database on every node of a cluster (else `url` alone), and a
    /// store on each.
    pub node_urls: Vec<String>,
    racers: Vec<Arc<dyn Store>>,
    concrete: Concrete,
    guard: Guard,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb").field("url", &self.url).finish()
    }
}

impl TestDb {
    /// A fresh database, or `None` when the backend is unavailable here (the
    /// skip is printed, and is a failure under `REQUIRE_ALL_BACKENDS=1`).
    pub async fn new(backend: Backend, pool_size: u32) -> Option<Self> {
        Self::with_write_batch(backend, pool_size, payments_store::DEFAULT_WRITE_BATCH).await
    }

    /// [`TestDb::new`] with SQLite's group commit set (`SQLITE_WRITE_BATCH`;
    /// 1: off). Other backends ignore it.
    pub async fn with_write_batch(
        backend: Backend,
        pool_size: u32,
        write_batch: u32,
    ) -> Option<Self> {
        let admin_url = match backend.admin_url() {
            None => None,
            Some(Ok(url)) => Some(url),
            Some(Err(skip)) => {
                throwaway::skip_or_panic(backend.name(), &skip);
                return None;
            }
        };
        let cluster = (backend == Backend::Galera)
            .then(|| galera::Galera::shared().expect("the shared cluster"));
        Some(Self::build(backend, admin_url, pool_size, cluster, write_batch).await)
    }

    /// A fresh database on the server of `admin_url` (for SQLite, `None`: a
    /// temp file), for a caller that chose the server itself
    /// (`payments-bench`).
    pub async fn on_server(backend: Backend, admin_url: Option<String>, pool_size: u32) -> Self {
        let cluster = (backend == Backend::Galera)
            .then(|| galera::Galera::shared().expect("the shared cluster"));
        let batch = payments_store::DEFAULT_WRITE_BATCH;
        Self::build(backend, admin_url, pool_size, cluster, batch).await
    }

    /// A fresh database on a Galera cluster of the caller's own.
    pub async fn on_cluster(cluster: &galera::Galera, pool_size: u32) -> Self {
        let admin_url = Some(cluster.urls[0].clone());
        let batch = payments_store::DEFAULT_WRITE_BATCH;
        Self::build(Backend::Galera, admin_url, pool_size, Some(cluster), batch).await
    }

    async fn build(
        backend: Backend,
        admin_url: Option<String>,
        pool_size: u32,
        cluster: Option<&galera::Galera>,
        write_batch: u32,
    ) -> Self {
        let pool = PoolSettings {
            max_connections: pool_size,
            acquire_timeout: Duration::from_secs(30),
            write_batch,
        };
        let server = match (backend.engine(), admin_url) {
            (Some(engine), Some(admin_url)) => Some(TestDatabase::create(engine, admin_url).await),
            (None, None) => None,
            _ => panic!(
                "{}: an admin URL for a server, none for SQLite",
                backend.name()
            ),
        };
        if let (Backend::PostgresSerializable, Some(db)) = (backend, &server) {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
            let sql = format!(
                "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'serializable'",
                db.name
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .expect("make the database serializable");
        }
        let (url, guard) = match server {
            Some(db) => (db.url.clone(), Guard::Server(db)),
            None => {
                let name = format!("payments-test-{}.db", uuid::Uuid::new_v4().simple());
                let path = std::env::temp_dir().join(name);
                (format!("sqlite://{}", path.display()), Guard::Sqlite(path))
            }
        };
        let (concrete, store): (Concrete, Arc<dyn Store>) = match backend {
            Backend::Sqlite => {
                let store = SqliteStore::connect(&database_url(&url), &pool)
                    .await
                    .expect("open sqlite");
                (Concrete::Sqlite(store.clone()), Arc::new(store))
            }
            Backend::Postgres | Backend::PostgresSerializable => {
                let store = PostgresStore::connect(&database_url(&url), &pool)
                    .await
                    .expect("open postgres");
                if backend == Backend::PostgresSerializable {
                    let level: String = sqlx::query_scalar("SHOW transaction_isolation")
                        .fetch_one(store.pool())
                        .await
                        .expect("isolation");
                    assert_eq!(level, "serializable", "every transaction runs serializable");
                }
                (Concrete::Postgres(store.clone()), Arc::new(store))
            }
            Backend::Mysql | Backend::Galera => {
                let store = MySqlStore::connect(&database_url(&url), &pool)
                    .await
                    .expect("open mysql");
                (Concrete::Mysql(store.clone()), Arc::new(store))
            }
        };
        store.migrate().await.expect("migrate");
        let (mut node_urls, mut racers) = (vec![url.clone()], vec![store.clone()]);
        if let (Some(cluster), Guard::Server(db)) = (cluster, &guard) {
            for admin_url in &cluster.urls[1..] {
                let node_url = throwaway::with_database(admin_url, &db.name);
                // The database was created on node 1; the other nodes apply
                // the DDL a moment later, and a connect names it.
                let mut attempts = 0;
                let store = loop {
                    match MySqlStore::connect(&database_url(&node_url), &pool).await {
                        Ok(store) => break store,
                        Err(e) if attempts < 100 && e.to_string().contains("1049") => {
                            attempts += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("open a galera node: {e}"),
                    }
                };
                assert_eq!(
                    store.cluster(),
                    Some("galera"),
                    "the store knows the cluster"
                );
                node_urls.push(node_url);
                racers.push(Arc::new(store));
            }
            // Every pool's connections open before a race starts, so that
            // no node's racers are late by their connects.
            let mut warm = tokio::task::JoinSet::new();
            for store in &racers {
                for _ in 0..pool_size {
                    let store = store.clone();
                    warm.spawn(async move { store.ready().await.expect("ready") });
                }
            }
            warm.join_all().await;
        }
        Self {
            url,
            backend,
            store,
            node_urls,
            racers,
            concrete,
            guard,
        }
    }

    /// Where it is, without a password: the SQLite file or the database name.
    pub fn describe(&self) -> String {
        match &self.guard {
            Guard::Sqlite(path) => path.display().to_string(),
            Guard::Server(db) => format!("database {}", db.name),
        }
    }

    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// On a cluster, the certification failures and brute-force aborts
    /// its nodes have counted so far: what rises when two nodes' writes
    /// really conflicted. `None` elsewhere.
    pub async fn cluster_conflicts(&self) -> Option<u64> {
        if self.backend != Backend::Galera {
            return None;
        }
        let cluster = galera::Galera::shared().expect("the cluster this database is on");
        Some(
            cluster.counter("wsrep_local_cert_failures").await
                + cluster.counter("wsrep_local_bf_aborts").await,
        )
    }

    /// The store racer `i` uses: on a cluster, node `i mod 3`'s, so racers
    /// are spread over the nodes; elsewhere the one store.
    pub fn racer(&self, i: usize) -> Arc<dyn Store> {
        self.racers[i % self.racers.len()].clone()
    }

    /// Runs a `SELECT COUNT(*) ...` written with `?` placeholders (SQLite,
    /// MySQL) and with `$n` (PostgreSQL), binding `args` as text.
    pub async fn count(&self, q_sql: &'static str, pg_sql: &'static str, args: &[&str]) -> i64 {
        match &self.concrete {
            Concrete::Mysql(s) => {
                let mut q = sqlx::query_scalar::<_, i64>(q_sql);
                for a in args {
                    q = q.bind(*a);
                }
                q.fetch_one(s.pool()).await.expect("count")
            }
            Concrete::Sqlite(s) => {
                let mut q = sqlx::query_scalar::<_, i64>(q_sql);
                for a in args {
                    q = q.bind(*a);
                }
                q.fetch_one(s.pool()).await.expect("count")
            }
            Concrete::Postgres(s) => {
                let mut q = sqlx::query_scalar::<_, i64>(pg_sql);
                for a in args {
                    q = q.bind(*a);
                }
                q.fetch_one(s.pool()).await.expect("count")
            }
        }
    }

    /// Rows in `charges`.
    pub async fn charges(&self) -> i64 {
        self.count(
            "SELECT COUNT(*) FROM charges",
            "SELECT COUNT(*) FROM charges",
            &[],
        )
        .await
    }

    /// The SQLite store, on that backend.
    pub fn sqlite(&self) -> Option<&SqliteStore> {
        match &self.concrete {
            Concrete::Sqlite(store) => Some(store),
            _ => None,
        }
    }

    /// The PostgreSQL store, on that backend.
    pub fn postgres(&self) -> Option<&PostgresStore> {
        match &self.concrete {
            Concrete::Postgres(store) => Some(store),
            _ => None,
        }
    }

    /// Rows in `refunds` with this status (any status when empty).
    pub async fn refunds_with_status(&self, status: &str) -> i64 {
        self.count(
            "SELECT COUNT(*) FROM refunds WHERE status = ? OR ? = ''",
            "SELECT COUNT(*) FROM refunds WHERE status = $1 OR $2 = ''",
            &[status, status],
        )
        .await
    }

    /// Rows in `charges` with this status.
    pub async fn charges_with_status(&self, status: &str) -> i64 {
        self.count(
            "SELECT COUNT(*) FROM charges WHERE status = ?",
            "SELECT COUNT(*) FROM charges WHERE status = $1",
            &[status],
        )
        .await
    }

    /// Records for `key` in `state` with this stored status (`None`: no status).
    pub async fn records_for_key(&self, key: &str, state: &str, status: Option<u16>) -> i64 {
        let status = status.map(|s| s.to_string()).unwrap_or_default();
        self.count(
            "SELECT COUNT(*) FROM idempotent_requests WHERE idempotency_key = ? AND state = ? \
             AND COALESCE(CAST(response_status AS CHAR), '') = ?",
            "SELECT COUNT(*) FROM idempotent_requests WHERE idempotency_key = $1 AND state = $2 \
             AND COALESCE(CAST(response_status AS TEXT), '') = $3",
            &[key, state, status.as_str()],
        )
        .await
    }

    /// A request stuck in progress, as a crashed API process leaves it:
    /// claimed `ago` with a lease that ended 1 s after the claim, its
    /// pending charge never sent or never answered. Returns (record id,
    /// charge id).
    pub async fn stuck_request(
        &self,
        key: &str,
        customer: &str,
        body: &Value,
        ago: Duration,
    ) -> (i64, String) {
        use payments_domain::charge::{Charge, ChargeRequest, CustomerId};
        use payments_domain::idempotency::{CHARGES_ROUTE, IdempotencyKey, RequestFingerprint};
        use payments_domain::store::{Claim, ClaimOutcome, NewLease, Operation};
        let request = ChargeRequest::from_json(body, i64::MAX).expect("valid body");
        let charge = Charge::pending(&CustomerId::parse(customer).expect("customer"), &request);
        let claim = Claim {
            key: IdempotencyKey::parse(key).expect("key"),
            route: CHARGES_ROUTE,
            customer: CustomerId::parse(customer).expect("customer"),
            fingerprint: RequestFingerprint::of(body),
            lease: NewLease::new(Duration::from_secs(1)),
            ttl: Duration::from_secs(24 * 3600),
            operation: Operation::Charge(charge),
            read_first: true,
            hold_margin: Duration::ZERO,
        };
        let stuck = match self.store.claim(&claim).await.expect("claim") {
            ClaimOutcome::Claimed {
                record_id,
                operation,
            } => (record_id.0, operation.id().to_owned()),
            other => panic!("key {key} not claimed: {other:?}"),
        };
        if !ago.is_zero() {
            self.age(Some(key), ago).await;
        }
        stuck
    }

    /// A copy of the whole database as a backup takes it, for
    /// [`TestDb::restore`]: SQLite's file with its `-wal` and `-shm` (no
    /// process may be writing: stop the API first); PostgreSQL's database
    /// as a template of a new one (its sessions are ended first);
    /// MariaDB's `mariadb-dump`. This store's own pool must not be used
    /// after a restore on SQLite (its connections keep the old files).
    pub async fn copy(&self) -> DbCopy {
        let copy = DbCopy(format!("{}_copy", uuid::Uuid::new_v4().simple()));
        match &self.guard {
            Guard::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let (from, to) = (with_suffix(path, suffix), self.copy_path(&copy, suffix));
                    if from.exists() {
                        std::fs::copy(&from, &to).expect("copy the SQLite file");
                    }
                }
            }
            Guard::Server(db) if self.backend.engine() == Some(throwaway::Engine::Postgres) => {
                db.end_sessions().await;
                db.admin(&format!(
                    r#"CREATE DATABASE "{}" TEMPLATE "{}""#,
                    copy.0, db.name
                ))
                .await;
            }
            Guard::Server(db) => {
                let mut dump =
                    db.mysql_client("mariadb-dump", &["--single-transaction", "--routines"]);
                let out = dump.output().expect("run mariadb-dump");
                assert!(
                    out.status.success(),
                    "mariadb-dump: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                std::fs::write(self.copy_path(&copy, ".sql"), out.stdout).expect("keep the dump");
            }
        }
        copy
    }

    /// Puts `copy` back in place of the database: every write since it was
    /// taken is gone, as after a point-in-time restore or the promotion of
    /// a replica that had not received them. The API must be stopped.
    pub async fn restore(&self, copy: DbCopy) {
        match &self.guard {
            Guard::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let (from, to) = (self.copy_path(&copy, suffix), with_suffix(path, suffix));
                    // A rename: the old files' open handles keep the old ones.
                    match from.exists() {
                        true => std::fs::rename(&from, &to).expect("restore the SQLite file"),
                        false => drop(std::fs::remove_file(&to)),
                    }
                }
            }
            Guard::Server(db) if self.backend.engine() == Some(throwaway::Engine::Postgres) => {
                db.admin(&format!(r#"DROP DATABASE "{}" WITH (FORCE)"#, db.name))
                    .await;
                db.admin(&format!(
                    r#"CREATE DATABASE "{}" TEMPLATE "{}""#,
                    db.name, copy.0
                ))
                .await;
                db.admin(&format!(r#"DROP DATABASE "{}""#, copy.0)).await;
            }
            Guard::Server(db) => {
                let dump = self.copy_path(&copy, ".sql");
                let input = std::fs::File::open(&dump).expect("the dump");
                let mut load = db.mysql_client("mariadb", &[]);
                let out = load.stdin(input).output().expect("run mariadb");
                assert!(
                    out.status.success(),
                    "mariadb < dump: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let _ = std::fs::remove_file(dump);
            }
        }
    }

    /// Where a copy's file is kept (beside the SQLite file, or in the
    /// temp directory).
    fn copy_path(&self, copy: &DbCopy, suffix: &str) -> PathBuf {
        let dir = match &self.guard {
            Guard::Sqlite(path) => path
                .parent()
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir),
            Guard::Server(_) => std::env::temp_dir(),
        };
        dir.join(format!("{}{suffix}", copy.0))
    }

    /// Copies the rows of every money table (records, charges, refunds)
    /// aside, in the same database, for [`TestDb::lose_tail`].
    pub async fn snapshot(&self) {
        for table in LOST_TAIL_TABLES {
            let sql = format!("CREATE TABLE lost_tail_{table} AS SELECT * FROM {table}");
            self.execute(&sql, &sql, &sql).await;
        }
    }

    /// Puts the rows [`TestDb::snapshot`] copied back, as a database that
    /// lost its last writes shows them (a promoted asynchronous replica, a
    /// Galera node that crashed ahead of the cluster, a point-in-time
    /// restore): everything written since is gone. The rows only: a
    /// PostgreSQL identity sequence keeps its place (a record id is never
    /// reused), which nothing relies on. The server must hold no copy in
    /// memory (`AppOptions::replay_cache` false).
    pub async fn lose_tail(&self) {
        for table in LOST_TAIL_TABLES.iter().rev() {
            let sql = format!("DELETE FROM {table}");
            self.execute(&sql, &sql, &sql).await;
        }
        for table in LOST_TAIL_TABLES {
            let copy = format!("INSERT INTO {table} SELECT * FROM lost_tail_{table}");
            let pg = if table == "idempotent_requests" {
                format!(
                    "INSERT INTO {table} OVERRIDING SYSTEM VALUE SELECT * FROM lost_tail_{table}"
                )
            } else {
                copy.clone()
            };
            self.execute(&copy, &pg, &copy).await;
            let drop = format!("DROP TABLE lost_tail_{table}");
            self.execute(&drop, &drop, &drop).await;
        }
    }

    /// Runs backend-specific SQL that returns no rows; returns rows affected.
    /// The SQL is the test's own, never input.
    pub async fn execute(&self, sqlite_sql: &str, pg_sql: &str, mysql_sql: &str) -> u64 {
        let sql = |sql: &str| sqlx::AssertSqlSafe(sql.to_owned());
        match &self.concrete {
            Concrete::Mysql(s) => sqlx::query(sql(mysql_sql))
                .execute(s.pool())
                .await
                .expect("execute")
                .rows_affected(),
            Concrete::Sqlite(s) => sqlx::query(sql(sqlite_sql))
                .execute(s.pool())
                .await
                .expect("execute")
                .rows_affected(),
            Concrete::Postgres(s) => sqlx::query(sql(pg_sql))
                .execute(s.pool())
                .await
                .expect("execute")
                .rows_affected(),
        }
    }

    /// Moves time for the records of `key` (every record when `None`) and
    /// their charges or refunds by ageing their rows: every stored time
    /// (`created_at`, `locked_until`, `completed_at`, `expires_at`; a charge's
    /// or refund's `created_at`, `updated_at` and `provider_called_at`)
    /// moves `by` into the past, so the database's own
    /// clock sees them that much older. The one way tests move time.
    /// Returns the records aged.
    pub async fn age(&self, key: Option<&str>, by: Duration) -> u64 {
        let scope = match key {
            // Keys in tests are the tests' own (UUIDs or plain words).
            Some(key) => {
                assert!(!key.contains('\''), "a test key: {key}");
                format!("idempotency_key = '{key}'")
            }
            None => "1 = 1".to_owned(),
        };
        let records = ["created_at", "locked_until", "completed_at", "expires_at"];
        let operations = ["created_at", "updated_at", "provider_called_at"];
        let ms = by.as_millis();
        let shift = |columns: &[&str], minus: &str| {
            columns
                .iter()
                .map(|c| format!("{c} = {c} - {minus}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        // A charge's record, or a refund's or capture's (not its charge).
        let sql = |minus: String| {
            [
                format!(
                    "UPDATE charges SET {} WHERE id IN (SELECT charge_id FROM \
                     idempotent_requests WHERE {scope} AND refund_id IS NULL)",
                    shift(&operations, &minus)
                ),
                format!(
                    "UPDATE refunds SET {} WHERE id IN \
                     (SELECT refund_id FROM idempotent_requests WHERE {scope})",
                    shift(&operations, &minus)
                ),
                // A capture's or cancel's record names it where a refund's
                // names the refund.
                format!(
                    "UPDATE captures SET {} WHERE id IN \
                     (SELECT refund_id FROM idempotent_requests WHERE {scope})",
                    shift(&operations, &minus)
                ),
                format!(
                    "UPDATE idempotent_requests SET {} WHERE {scope}",
                    shift(&records, &minus)
                ),
            ]
        };
        let sqlite = sql(ms.to_string());
        let pg = sql(format!("interval '{ms} milliseconds'"));
        let my = sql(format!("INTERVAL {} MICROSECOND", ms * 1000));
        let mut records_aged = 0;
        for i in 0..sqlite.len() {
            records_aged = self.execute(&sqlite[i], &pg[i], &my[i]).await;
        }
        records_aged
    }

    /// Runs backend-specific SQL over the text protocol (MySQL refuses
    /// `CREATE TRIGGER` as a prepared statement). The SQL is the test's own.
    pub async fn execute_raw(&self, sqlite_sql: &str, pg_sql: &str, mysql_sql: &str) {
        let sql = |sql: &str| sqlx::AssertSqlSafe(sql.to_owned());
        match &self.concrete {
            Concrete::Mysql(s) => drop(
                sqlx::raw_sql(sql(mysql_sql))
                    .execute(s.pool())
                    .await
                    .expect("execute"),
            ),
            Concrete::Sqlite(s) => drop(
                sqlx::raw_sql(sql(sqlite_sql))
                    .execute(s.pool())
                    .await
                    .expect("execute"),
            ),
            Concrete::Postgres(s) => drop(
                sqlx::raw_sql(sql(pg_sql))
                    .execute(s.pool())
                    .await
                    .expect("execute"),
            ),
        }
    }

    /// Moves time for every event and webhook delivery by ageing their
    /// rows `by` into the past (their creation, next attempt and lease),
    /// as [`TestDb::age`] does for records.
    pub async fn age_outbox(&self, by: Duration) {
        let sql = |minus: String| {
            let shift = |columns: &[&str]| {
                columns
                    .iter()
                    .map(|c| format!("{c} = {c} - {minus}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            [
                format!("UPDATE events SET {}", shift(&["created_at"])),
                format!(
                    "UPDATE webhook_deliveries SET {}",
                    shift(&["created_at", "next_attempt_at", "locked_until"])
                ),
                format!(
                    "UPDATE provider_events SET {}",
                    shift(&["received_at", "updated_at"])
                ),
            ]
        };
        let ms = by.as_millis();
        let sqlite = sql(ms.to_string());
        let pg = sql(format!("interval '{ms} milliseconds'"));
        let my = sql(format!("INTERVAL {} MICROSECOND", ms * 1000));
        for i in 0..sqlite.len() {
            self.execute(&sqlite[i], &pg[i], &my[i]).await;
        }
    }

    /// Holds a lock that blocks every write to `idempotent_requests` for
    /// `hold`, from its own connection, as a long migration or a busy
    /// writer would. Returns once the lock is held; the task ends when it
    /// is released.
    pub async fn hold_write_lock(&self, hold: Duration) -> tokio::task::JoinHandle<()> {
        let (locked, is_locked) = tokio::sync::oneshot::channel();
        let task = match &self.concrete {
            Concrete::Sqlite(s) => {
                let pool = s.pool().clone();
                tokio::spawn(async move {
                    let mut conn = pool.acquire().await.expect("connection");
                    sqlx::query("BEGIN IMMEDIATE")
                        .execute(&mut *conn)
                        .await
                        .expect("lock");
                    let _ = locked.send(());
                    tokio::time::sleep(hold).await;
                    sqlx::query("COMMIT")
                        .execute(&mut *conn)
                        .await
                        .expect("unlock");
                })
            }
            Concrete::Postgres(s) => {
                let pool = s.pool().clone();
                tokio::spawn(async move {
                    let mut tx = pool.begin().await.expect("begin");
                    sqlx::query("LOCK TABLE idempotent_requests IN EXCLUSIVE MODE")
                        .execute(&mut *tx)
                        .await
                        .expect("lock");
                    let _ = locked.send(());
                    tokio::time::sleep(hold).await;
                    tx.commit().await.expect("unlock");
                })
            }
            Concrete::Mysql(s) => {
                let pool = s.pool().clone();
                tokio::spawn(async move {
                    let mut conn = pool.acquire().await.expect("connection");
                    sqlx::query("LOCK TABLES idempotent_requests WRITE")
                        .execute(&mut *conn)
                        .await
                        .expect("lock");
                    let _ = locked.send(());
                    tokio::time::sleep(hold).await;
                    sqlx::query("UNLOCK TABLES")
                        .execute(&mut *conn)
                        .await
                        .expect("unlock");
                })
            }
        };
        is_locked.await.expect("the lock was taken");
        task
    }

    /// Ends every other connection to this test's database from the server
    /// side, as a database restart or a failover does to a pool. Returns
    /// how many were ended. PostgreSQL and MySQL only.
    pub async fn drop_connections(&self) -> u64 {
        use sqlx::Connection;
        // From a connection of its own, so every pooled one is ended.
        match &self.concrete {
            Concrete::Postgres(_) => {
                let mut conn = sqlx::PgConnection::connect(&self.url)
                    .await
                    .expect("connect");
                let ended: Vec<bool> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .fetch_all(&mut conn)
                .await
                .expect("terminate");
                ended.iter().filter(|e| **e).count() as u64
            }
            Concrete::Mysql(_) => {
                let url = self.url.replacen("mariadb://", "mysql://", 1);
                let mut conn = sqlx::MySqlConnection::connect(&url).await.expect("connect");
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT ID FROM information_schema.PROCESSLIST \
                     WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
                )
                .fetch_all(&mut conn)
                .await
                .expect("processlist");
                for id in &ids {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                        .execute(&mut conn)
                        .await;
                }
                ids.len() as u64
            }
            Concrete::Sqlite(_) => panic!("SQLite has no connection to drop"),
        }
    }

    /// Rows in `idempotent_requests`.
    pub async fn records(&self) -> i64 {
        self.count(
            "SELECT COUNT(*) FROM idempotent_requests",
            "SELECT COUNT(*) FROM idempotent_requests",
            &[],
        )
        .await
    }
}

/// The secret test apps verify provider webhooks with (GATEWAY_WEBHOOK_SECRET).
pub const TEST_WEBHOOK_SECRET: &str = "whsec_test_0123456789abcdef0123456789";

/// The HS256 secret test apps verify tokens with.
pub const TEST_SECRET: &str = "test-secret-0123456789abcdef0123456789";

/// How a test app is set up.
#[derive(Debug, Clone)]
pub struct AppOptions {
    pub pool_size: u32,
    pub gateway_timeout: Duration,
    pub lease: Duration,
    pub ttl: Duration,
    pub sandbox: SandboxConfig,
    pub key_mode: KeyMode,
    /// The server's header, body and idle timeouts.
    pub http: payments_api::server::HttpTimeouts,
    /// Replays answered from memory (`REPLAY_CACHE_MB`, on by default). A
    /// test that ages records by SQL turns it off: a copy's lifetime is the
    /// TTL the database reported, which aging shortens behind its back.
    pub replay_cache: bool,
    /// `RATE_LIMIT_PER_MINUTE` and `RATE_LIMIT_BURST`: off (0) unless a
    /// test sets it, set explicitly so the default never throttles a test;
    /// `None`: the server's defaults, as a new deployment has them.
    pub rate_limit: Option<(u32, u32)>,
    /// `PROVIDER_MAX_PROCESSING`; `None`: its default.
    pub provider_max_processing: Option<Duration>,
    /// `SQLITE_WRITE_BATCH`: SQLite's group commit (1: off).
    pub sqlite_write_batch: u32,
    /// `REFUNDS_BY_CUSTOMER`: off, as by default.
    pub refunds_by_customer: bool,
    /// `BACKOFFICE_RATE_LIMIT_PER_MINUTE` and `_BURST`; `None`: off, as
    /// by default.
    pub backoffice_rate_limit: Option<(u32, u32)>,
    /// `HOLD_CAPTURE_MARGIN`; `None`: its default (1 h).
    pub hold_capture_margin: Option<Duration>,
    /// The sandbox sends its webhooks to the app's `POST /webhooks/provider`,
    /// signed with [`TEST_WEBHOOK_SECRET`] (GATEWAY_WEBHOOK_SECRET). Off by
    /// default: most tests want no traffic they did not ask for.
    pub provider_webhooks: bool,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            pool_size: 5,
            gateway_timeout: Duration::from_secs(5),
            lease: Duration::from_secs(10),
            ttl: Duration::from_secs(24 * 3600),
            sandbox: SandboxConfig::default(),
            key_mode: KeyMode::Required,
            http: payments_api::server::HttpTimeouts::default(),
            replay_cache: true,
            rate_limit: Some((0, 0)),
            provider_max_processing: None,
            sqlite_write_batch: payments_store::DEFAULT_WRITE_BATCH,
            refunds_by_customer: false,
            backoffice_rate_limit: None,
            hold_capture_margin: None,
            provider_webhooks: false,
        }
    }
}

impl AppOptions {
    /// The defaults, with a provider that takes `latency_ms` per charge.
    pub fn slow_provider(latency_ms: u64) -> Self {
        Self {
            sandbox: SandboxConfig {
                latency_ms,
                ..SandboxConfig::default()
            },
            ..Self::default()
        }
    }
}

/// The real API in front of a real sandbox, both on loopback.
pub struct TestApp {
    pub base_url: String,
    /// The router `base_url` serves, for [`TestApp::oneshot`].
    pub router: axum::Router,
    pub service: Arc<ChargeService>,
    pub sandbox: SandboxHandle,
    pub db: TestDb,
    pub http: reqwest::Client,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl std::fmt::Debug for TestApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApp")
            .field("base_url", &self.base_url)
            .finish()
    }
}

/// The back office's audience (`JWT_BACKOFFICE_AUDIENCE`) of every test app.
pub const BACK_OFFICE_AUDIENCE: &str = "payments-backoffice";

/// With `TEST_APP_LOG=1`, the in-process apps' log lines go to stderr (as
/// `payments-api` writes them; `RUST_LOG` filters, `--nocapture` shows a
/// passing test's): what a 500 in a test was, for instance. Off by default.
fn show_app_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if std::env::var("TEST_APP_LOG").is_ok_and(|v| v == "1") {
        ONCE.call_once(|| payments_app::init_logging(payments_app::settings::LogFormat::Text));
    }
}

/// Starts the sandbox, a fresh database and the API, assembled as
/// `payments-api` assembles itself (`payments_app::assemble`,
/// `AppState::new`) from the default settings and `options`; `None` if the
/// backend is unavailable here.
pub async fn spawn_app(backend: Backend, options: AppOptions) -> Option<TestApp> {
    show_app_logs();
    let db =
        TestDb::with_write_batch(backend, options.pool_size, options.sqlite_write_batch).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base_url = format!("http://{}", listener.local_addr().expect("addr"));
    let mut sandbox_config = options.sandbox.clone();
    if options.provider_webhooks {
        sandbox_config.webhook_url = Some(format!("{base_url}/webhooks/provider"));
        sandbox_config.webhook_secret = TEST_WEBHOOK_SECRET.to_owned();
    }
    let sandbox = SandboxHandle::start(sandbox_config)
        .await
        .expect("start sandbox");
    let mut settings = Cli::try_parse_from([
        "payments-api",
        "--jwt-hs256-secret",
        TEST_SECRET,
        "--database-url",
        &db.url,
        "--jwt-backoffice-audience",
        BACK_OFFICE_AUDIENCE,
    ])
    .expect("the test settings parse")
    .settings;
    settings.refunds_by_customer = options.refunds_by_customer;
    settings.gateway_webhook_secret = Some(TEST_WEBHOOK_SECRET.into());
    settings.core.gateway.gateway_timeout = options.gateway_timeout;
    settings.core.gateway.lease = options.lease;
    if let Some(processing) = options.provider_max_processing {
        settings.core.gateway.provider_max_processing = processing;
    }
    settings.core.charges.idempotency_ttl = options.ttl;
    settings.idempotency_key_mode = options.key_mode;
    settings.http = options.http;
    if !options.replay_cache {
        settings.core.charges.replay_cache_mb = 0;
    }
    if let Some(limit) = options.rate_limit {
        (
            settings.core.charges.rate_limit_per_minute,
            settings.core.charges.rate_limit_burst,
        ) = limit;
    }
    if let Some(limit) = options.backoffice_rate_limit {
        (
            settings.core.charges.backoffice_rate_limit_per_minute,
            settings.core.charges.backoffice_rate_limit_burst,
        ) = limit;
    }
    if let Some(margin) = options.hold_capture_margin {
        settings.core.charges.hold_capture_margin = margin;
    }
    let provider = Provider::Remote {
        url: sandbox.url(),
        secret_key: SANDBOX_SECRET_KEY.into(),
    };
    let app = payments_app::assemble(db.store(), &settings.core, provider)
        .await
        .expect("assemble the app");
    let state = AppState::new(&settings, app.service.clone()).expect("the app's state");
    let router = payments_api::router(state.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, state, async move {
        let _ = stopped.await;
    }));
    Some(TestApp {
        base_url,
        router,
        service: app.service,
        sandbox,
        db,
        http: reqwest::Client::new(),
        _stop: stop,
    })
}

/// `GET url` with `token` as its bearer: the answer's JSON body.
pub async fn get_json(url: &str, token: &str) -> Value {
    reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("a JSON body")
}

/// A valid charge body.
pub fn charge_body(amount_cents: i64, card_token: &str) -> String {
    format!(r#"{{"amount_cents":{amount_cents},"currency":"GBP","card_token":"{card_token}"}}"#)
}

/// A query string's pairs, as the API's extractor hands them to the
/// domain's parsers (`ChargeQuery::parse`, `EventQuery::parse`).
pub fn query_pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Every row of a keyset-paged list, newest first: `page` reads a page of
/// at most 101 after the cursor it is given (`None`: the first), `id`
/// names a row, pages of 100.
pub async fn all_pages<T>(
    mut page: impl AsyncFnMut(Vec<(String, String)>) -> Vec<T>,
    id: impl Fn(&T) -> String,
) -> Vec<T> {
    let mut rows: Vec<T> = Vec::new();
    loop {
        let mut pairs = query_pairs(&[("limit", "100")]);
        if let Some(last) = rows.last() {
            pairs.push(("starting_after".to_owned(), id(last)));
        }
        let mut found = page(pairs).await;
        let more = found.len() > 100;
        found.truncate(100);
        rows.extend(found);
        if !more {
            return rows;
        }
    }
}

/// Every event in `store`, newest first.
pub async fn all_events(store: &Arc<dyn Store>) -> Vec<payments_domain::events::Event> {
    use payments_domain::events::EventQuery;
    let page = async |pairs: Vec<(String, String)>| {
        let query = EventQuery::parse(&pairs).expect("a valid page");
        store.list_events(&query).await.expect("events")
    };
    all_pages(page, |e| e.id.clone()).await
}

/// Every customer's charges in `store`, newest first.
pub async fn all_charges(store: &Arc<dyn Store>) -> Vec<payments_domain::charge::Charge> {
    use payments_domain::list::ChargeQuery;
    let page = async |pairs: Vec<(String, String)>| {
        let query = ChargeQuery::parse(&pairs).expect("a valid page");
        store.list_charges(None, &query).await.expect("charges")
    };
    all_pages(page, |c| c.id.clone()).await
}

/// A fresh idempotency key.
pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// An answer: its status, headers and JSON body (`Null` when not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    /// A response received over HTTP.
    pub async fn of(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("read the body");
        Self {
            status,
            headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }
}

impl TestApp {
    /// `request` through the app's router in process (`Router::oneshot`):
    /// no socket, for tests of what the HTTP layer refuses.
    pub async fn oneshot(&self, request: axum::http::Request<axum::body::Body>) -> Answer {
        use tower::ServiceExt;
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("the router is infallible");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("read the body");
        Answer {
            status,
            headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    /// A bearer token for `customer`.
    pub fn token(&self, customer: &str) -> String {
        mint_hs256(TEST_SECRET, customer, Duration::from_secs(3600)).expect("token")
    }

    /// A back-office token (of [`BACK_OFFICE_AUDIENCE`]) for `subject`
    /// with `scopes` (space-separated).
    pub fn back_office_token(&self, subject: &str, scopes: &str) -> String {
        let scopes: Vec<String> = scopes.split(' ').map(str::to_owned).collect();
        let ttl = Duration::from_secs(3600);
        mint_hs256_scoped(
            TEST_SECRET,
            subject,
            &scopes,
            Some(BACK_OFFICE_AUDIENCE),
            ttl,
        )
        .expect("token")
    }

    /// `POST /api/charges/{charge_id}/refunds` with `token`.
    pub async fn post_refund_with(
        &self,
        token: &str,
        charge_id: &str,
        key: &str,
        body: &Value,
    ) -> Answer {
        let response = self
            .http
            .post(format!("{}/api/charges/{charge_id}/refunds", self.base_url))
            .bearer_auth(token)
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .expect("request");
        Answer::of(response).await
    }

    /// `GET {path_and_query}` with `token`.
    pub async fn get_with(&self, token: &str, path_and_query: &str) -> Answer {
        let response = self
            .http
            .get(format!("{}{path_and_query}", self.base_url))
            .bearer_auth(token)
            .send()
            .await
            .expect("request");
        Answer::of(response).await
    }

    /// `POST /api/charges` as `customer`, with an optional key and a raw body.
    pub async fn post_charge(
        &self,
        customer: &str,
        key: Option<&str>,
        body: &str,
    ) -> reqwest::Response {
        self.post_charge_with(&self.http, customer, key, body)
            .await
            .expect("request")
    }

    /// The same through a caller's client (e.g. one with a short timeout).
    pub async fn post_charge_with(
        &self,
        client: &reqwest::Client,
        customer: &str,
        key: Option<&str>,
        body: &str,
    ) -> reqwest::Result<reqwest::Response> {
        let mut request = client
            .post(format!("{}/api/charges", self.base_url))
            .bearer_auth(self.token(customer))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send().await
    }

    /// `POST /api/charges/{charge_id}/refunds` as the back-office subject
    /// `subject` (with `refunds:write`), with a key: refunds are the back
    /// office's.
    pub async fn post_refund(
        &self,
        subject: &str,
        charge_id: &str,
        key: &str,
        body: &Value,
    ) -> Answer {
        let token = self.back_office_token(subject, "refunds:write");
        self.post_refund_with(&token, charge_id, key, body).await
    }

    /// A back-office refund of `amount_cents` of `charge_id`, under a new
    /// key, asserted refused: 400 `refund_exceeds_charge`.
    pub async fn assert_refund_does_not_fit(&self, charge_id: &str, amount_cents: i64) {
        let body = serde_json::json!({ "amount_cents": amount_cents });
        let more = self
            .post_refund("ops_1", charge_id, &new_key(), &body)
            .await;
        assert_eq!(more.status, 400, "{}", more.body);
        assert_eq!(more.body["error"]["code"], "refund_exceeds_charge");
    }

    /// `GET {path_and_query}` as `customer`.
    pub async fn get_as(&self, customer: &str, path_and_query: &str) -> Answer {
        self.get_with(&self.token(customer), path_and_query).await
    }

    /// A charge made for `customer` (201 asserted): its JSON.
    pub async fn charge_json(&self, customer: &str, body: &str) -> Value {
        let response = self.post_charge(customer, Some(&new_key()), body).await;
        let answer = Answer::of(response).await;
        assert_eq!(answer.status, 201, "{}", answer.body);
        answer.body
    }

    /// Every refund the sandbox recorded.
    pub async fn sandbox_refunds(&self) -> Vec<Value> {
        self.sandbox_list("/_sandbox/refunds").await
    }

    /// What the sandbox's succeeded refunds add up to, in minor units.
    pub async fn sandbox_refunded(&self) -> i64 {
        let refunds = self.sandbox_refunds().await;
        let succeeded = refunds.iter().filter(|r| r["status"] == "succeeded");
        succeeded.filter_map(|r| r["amount"].as_i64()).sum()
    }

    /// What the sandbox really charged (status `succeeded`).
    pub async fn sandbox_charges(&self) -> Vec<Value> {
        self.sandbox_attempts()
            .await
            .into_iter()
            .filter(|c| c["status"] == "succeeded")
            .collect()
    }

    /// Every charge the sandbox recorded, declined ones too.
    pub async fn sandbox_attempts(&self) -> Vec<Value> {
        self.sandbox_list("/_sandbox/charges").await
    }

    /// The sandbox's log of `/v1` calls, oldest first, as `METHOD /path`.
    pub async fn sandbox_requests(&self) -> Vec<String> {
        let seen = self.sandbox_list("/_sandbox/requests").await;
        let line = |r: &Value| format!("{} {}", r["method"].as_str()?, r["path"].as_str()?).into();
        seen.iter().filter_map(line).collect()
    }

    /// The `data` of one of the sandbox's `GET /_sandbox/...` lists.
    async fn sandbox_list(&self, path: &str) -> Vec<Value> {
        self.sandbox_get(path).await["data"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `GET {path}` at the sandbox, as JSON.
    pub async fn sandbox_get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.sandbox.url()))
            .send()
            .await
            .expect("the sandbox answers")
            .json()
            .await
            .expect("json")
    }

    /// `GET /metrics`: the Prometheus text (asserting a 200 in text/plain).
    pub async fn metrics_text(&self) -> String {
        let response = self
            .http
            .get(format!("{}/metrics", self.base_url))
            .send()
            .await
            .expect("metrics");
        assert_eq!(response.status(), 200);
        let text_plain = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/plain"));
        assert!(text_plain, "metrics are Prometheus text");
        response.text().await.expect("metrics text")
    }

    /// The sandbox's counters (`requests`, `in_flight`, `max_in_flight`, `charges`).
    pub async fn sandbox_stats(&self) -> Value {
        self.sandbox_get("/_sandbox/stats").await
    }

    /// `POST {path}` at the sandbox with a JSON body: its answer.
    pub async fn sandbox_post(&self, path: &str, body: &Value) -> Answer {
        let response = self
            .http
            .post(format!("{}{path}", self.sandbox.url()))
            .json(body)
            .send()
            .await
            .expect("the sandbox answers");
        Answer::of(response).await
    }

    /// Replaces the sandbox's config with `config`, its webhooks still
    /// sent to this app ([`AppOptions::provider_webhooks`]).
    pub async fn configure_sandbox_webhooks(&self, mut config: Value) {
        config["webhook_url"] = Value::from(format!("{}/webhooks/provider", self.base_url));
        config["webhook_secret"] = Value::from(TEST_WEBHOOK_SECRET);
        self.configure_sandbox(config).await;
    }

    /// The sandbox's webhook log (`GET /_sandbox/webhooks`).
    pub async fn sandbox_webhooks(&self) -> Vec<Value> {
        self.sandbox_list("/_sandbox/webhooks").await
    }

    /// Waits (at most `within`, polling) until every webhook the sandbox
    /// made has been delivered and nothing is in flight at it; false when
    /// that did not happen in time.
    pub async fn webhooks_delivered(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let hooks = self.sandbox_webhooks().await;
            if hooks.iter().all(|h| h["delivered"] == true) {
                // Twice in a row, apart: nothing started meanwhile.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let again = self.sandbox_webhooks().await;
                if again.len() == hooks.len() && again.iter().all(|h| h["delivered"] == true) {
                    return true;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Replaces the sandbox's fault injection.
    pub async fn configure_sandbox(&self, config: Value) {
        let status = self
            .http
            .post(format!("{}/_sandbox/config", self.sandbox.url()))
            .json(&config)
            .send()
            .await
            .expect("sandbox config")
            .status();
        assert!(status.is_success(), "sandbox config refused: {status}");
    }
}

/// A real binary of this workspace, started as a child process and killed
/// when dropped, with a clean environment (`PATH`, `RUST_LOG=info` and what
/// the caller passes: a developer's `DATABASE_URL` cannot leak in). Its
/// stderr goes to a log: a temp file removed with it, or a file the caller
/// names and keeps (`payments-bench` does, in `target/bench/`).
pub struct Process {
    child: Option<tokio::process::Child>,
    /// What the binary printed on its "listening on" line.
    pub url: String,
    log: PathBuf,
    keep_log: bool,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process").field("url", &self.url).finish()
    }
}

/// The path of a workspace binary of this build's profile: beside the test
/// executable's `deps/` directory (or beside `payments-bench`).
///
/// `cargo test` builds only the binaries of the package under test, so a test
/// of `payments-tests` cannot count on `payments-api` being there, or being
/// the current code. `make test` builds them all first (`cargo build
/// --workspace --bins`); then this costs one walk of the sources' times per
/// test process. Without make (a bare `cargo test --workspace`, one test run
/// from an editor), a binary that is missing or older than a file of
/// `crates/`, `migrations/` or the manifests is built here: once per test
/// process (a `OnceLock`; cargo's lock on the target directory serialises
/// test processes building at once), with the command `make test` runs, so
/// the features and artifacts are the same and nothing is built twice. A
/// binary cargo then finds current although older than a source (one it does
/// not depend on) gets its time set to now, so the next test process does
/// not ask cargo again. If it is still missing after the build (a target
/// layout this cannot see), the test stops and says to run `make test`.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("target dir");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target dir");
    }
    let path = dir.join(name);
    if stale(&path) {
        if let Err(why) = BUILT.get_or_init(|| build_binaries(dir)) {
            panic!("{why}");
        }
        // Cargo has just built it or found it current (a binary that does
        // not depend on the newer source): say so to the next test process.
        let file = std::fs::File::open(&path);
        let touched = file.and_then(|file| file.set_modified(std::time::SystemTime::now()));
        let shown = path.display();
        assert!(
            touched.is_ok(),
            "{shown} is missing after the build: run `make test`"
        );
    }
    path
}

/// Missing, or older than the newest file of the workspace's sources.
fn stale(binary: &Path) -> bool {
    static NEWEST: std::sync::OnceLock<std::time::SystemTime> = std::sync::OnceLock::new();
    let newest = NEWEST.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut paths = ["crates", "migrations", "Cargo.toml", "Cargo.lock"]
            .map(|p| root.join(p))
            .to_vec();
        // The binaries carry the commit (`--version`): a new commit makes
        // them stale, as it reruns payments-app's build script.
        paths.extend(git_head_files(&root));
        let mut newest = std::time::SystemTime::UNIX_EPOCH;
        while let Some(path) = paths.pop() {
            match std::fs::read_dir(&path) {
                Ok(entries) => paths.extend(entries.flatten().map(|entry| entry.path())),
                Err(_) => newest = newest.max(modified(&path).unwrap_or(newest)),
            }
        }
        newest
    });
    modified(binary).is_none_or(|built| built < *newest)
}

/// HEAD and the ref it names (loose or packed), when `root` is a git checkout.
fn git_head_files(root: &Path) -> Vec<PathBuf> {
    let git = |args: &[&str]| {
        let output = std::process::Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        let text = String::from_utf8(output.stdout).ok()?;
        Some(text.trim().to_owned()).filter(|t| !t.is_empty())
    };
    let (Some(dir), Some(common)) = (
        git(&["rev-parse", "--absolute-git-dir"]),
        git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]),
    ) else {
        return Vec::new();
    };
    let mut files = vec![
        Path::new(&dir).join("HEAD"),
        Path::new(&common).join("packed-refs"),
    ];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        files.push(Path::new(&common).join(branch));
    }
    files
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path)
        .and_then(|meta| meta.modified())
        .ok()
}

/// `cargo build --workspace --bins` for the profile of `dir` (`debug`,
/// `release`, or a custom one), into the target directory above it.
fn build_binaries(dir: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let mut command = std::process::Command::new(cargo);
    command.args(["build", "--workspace", "--bins", "--target-dir"]);
    command.arg(dir.parent().expect("target dir"));
    command.current_dir(env!("CARGO_MANIFEST_DIR"));
    match dir.file_name().and_then(|p| p.to_str()) {
        Some("debug") => {}
        Some("release") => {
            command.arg("--release");
        }
        Some(profile) => {
            command.args(["--profile", profile]);
        }
        None => {
            return Err(format!(
                "{} names no profile: run `make test`",
                dir.display()
            ));
        }
    }
    let line = "payments-tests: a binary is missing or older than the sources: \
                running `cargo build --workspace --bins` once (`make test` does it first)\n";
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    match command.status() {
        Ok(status) if status.success() => Ok(()),
        outcome => Err(format!(
            "`cargo build --workspace --bins`: {outcome:?}: run `make test`"
        )),
    }
}

impl Process {
    /// Starts `name` with `args` and `env` (stdout drained by the caller,
    /// stderr to a temp log), without waiting for anything.
    pub fn spawn(
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (Process, tokio::process::ChildStdout) {
        Self::spawn_logged(name, args, env, None).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Process::spawn`], with its log at `log` (kept) when given.
    pub fn spawn_logged(
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
        log: Option<PathBuf>,
    ) -> Result<(Process, tokio::process::ChildStdout), String> {
        let keep_log = log.is_some();
        let log = log.unwrap_or_else(|| {
            let file = format!("{name}-{}.log", uuid::Uuid::new_v4().simple());
            std::env::temp_dir().join(file)
        });
        let stderr =
            std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let mut command = tokio::process::Command::new(binary(name));
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env(RATE_LIMIT_OFF.0, RATE_LIMIT_OFF.1)
            .env(BACK_OFFICE.0, BACK_OFFICE.1)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("starting {name}: {e}"))?;
        let stdout = child.stdout.take().expect("stdout");
        let child = Some(child);
        let url = String::new();
        Ok((
            Process {
                child,
                url,
                log,
                keep_log,
            },
            stdout,
        ))
    }

    /// Starts `name` and waits for the line `<name> listening on <url>` on
    /// its stdout.
    pub async fn start(name: &str, args: &[&str], env: &[(&str, &str)]) -> Process {
        let started = Process::try_start(name, args, env, None).await;
        started.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Process::start`], with its log at `log` (kept) when given; an error
    /// with the log when the line does not come within 60 s.
    pub async fn try_start(
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
        log: Option<PathBuf>,
    ) -> Result<Process, String> {
        use tokio::io::AsyncBufReadExt;
        let (mut process, stdout) = Process::spawn_logged(name, args, env, log)?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let prefix = format!("{name} listening on ");
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix(&prefix) {
                    return Some(url.trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let Some(url) = url else {
            return Err(format!("{name} did not start:\n{}", process.log()));
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        process.url = url;
        Ok(process)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().and_then(|c| c.id()).unwrap_or_default()
    }

    /// Waits up to 10 s for every one of `needles` to appear in the log.
    pub async fn wait_for_log(&self, needles: &[&str]) -> bool {
        for _ in 0..500 {
            let log = self.log();
            if needles.iter().all(|n| log.contains(n)) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Waits up to `within` for the exit status; kills the process if it
    /// takes longer.
    pub async fn wait(&mut self, within: Duration) -> Result<std::process::ExitStatus, String> {
        let child = self.child.as_mut().expect("an owned process");
        match tokio::time::timeout(within, child.wait()).await {
            Ok(status) => status.map_err(|e| e.to_string()),
            Err(_) => {
                let _ = child.kill().await;
                Err(format!("still running after {within:?}; killed"))
            }
        }
    }

    /// Sends SIGTERM and waits up to `within` for the exit status.
    pub async fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("an owned process");
        let pid = child.id().expect("running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        tokio::time::timeout(within, child.wait())
            .await
            .expect("exited in time")
            .expect("exit status")
    }

    /// SIGKILL and reap; an error if it had exited on its own, as a server
    /// should not.
    pub async fn stop(mut self) -> Result<(), String> {
        let child = self.child.as_mut().expect("an owned process");
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited on its own ({status}):\n{}", self.log()));
        }
        child.kill().await.map_err(|e| e.to_string())
    }

    /// `POST /api/charges` to this API process.
    pub async fn post_charge(
        &self,
        token: &str,
        key: &str,
        body: &str,
    ) -> reqwest::Result<reqwest::Response> {
        reqwest::Client::new()
            .post(format!("{}/api/charges", self.url))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await
    }

    /// A handle with only the URL of a process owned elsewhere.
    pub fn detached(url: String) -> Process {
        let log = PathBuf::new();
        Process {
            child: None,
            url,
            log,
            keep_log: true,
        }
    }

    /// Everything the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as a crash would.
    pub async fn kill(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill().await;
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
            if !self.keep_log {
                let _ = std::fs::remove_file(&self.log);
            }
        }
    }
}

/// A clock offset for a process run under libfaketime (Debian's
/// `faketime`): the process sees the wall clock `offset` away from the
/// real one, while its monotonic clock (tokio's timers) stays real.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skew {
    /// Signed seconds.
    pub secs: i64,
}

impl Skew {
    pub const AHEAD_2H: Skew = Skew { secs: 2 * 3600 };
    pub const BEHIND_2H: Skew = Skew { secs: -2 * 3600 };

    /// The environment that makes a process run with this skew, or `None`
    /// when libfaketime is not installed (printed as a skip; a failure under
    /// `REQUIRE_ALL_BACKENDS=1`, which CI sets after installing it).
    pub fn env(self) -> Option<Vec<(&'static str, String)>> {
        let library = ["x86_64-linux-gnu", "aarch64-linux-gnu"]
            .iter()
            .map(|arch| PathBuf::from(format!("/usr/lib/{arch}/faketime/libfaketimeMT.so.1")))
            .find(|path| path.exists());
        let Some(library) = library else {
            let skip = "no libfaketimeMT.so.1 (apt-get install faketime)";
            throwaway::skip_or_panic("clock skew", &throwaway::Skip(skip.into()));
            return None;
        };
        Some(vec![
            ("LD_PRELOAD", library.display().to_string()),
            ("FAKETIME", format!("{:+}s", self.secs)),
            // Faking the monotonic clock can hang tokio's timers.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
            // Read FAKETIME once, not on every clock call.
            ("FAKETIME_NO_CACHE", "0".to_owned()),
        ])
    }

    /// Whether `seen` (a time as a skewed process reported it) is this skew
    /// away from the real clock, within a minute.
    pub fn shows_in(self, seen: chrono::DateTime<chrono::Utc>) -> bool {
        let off = (seen - chrono::Utc::now()).num_seconds();
        (off - self.secs).abs() < 60
    }
}

impl Process {
    /// Starts `name` (a server that prints its listening line) under
    /// `skew`, and checks that it really runs on the skewed clock and
    /// answers: its `Date` header on `GET /healthz` must be `skew` away.
    /// `None` when libfaketime is unavailable.
    pub async fn start_skewed(
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
        skew: Skew,
    ) -> Option<Process> {
        let fake = skew.env()?;
        let mut all: Vec<(&str, &str)> = env.to_vec();
        all.extend(fake.iter().map(|(k, v)| (*k, v.as_str())));
        let process = Process::start(name, args, &all).await;
        let health = reqwest::get(format!("{}/healthz", process.url))
            .await
            .expect("a skewed process answers");
        assert_eq!(health.status(), 200, "{}", process.log());
        let date = health
            .headers()
            .get("date")
            .and_then(|d| d.to_str().ok())
            .and_then(|d| chrono::DateTime::parse_from_rfc2822(d).ok())
            .expect("a Date header");
        assert!(
            skew.shows_in(date.to_utc()),
            "{name} under FAKETIME={:+}s answered with Date {date}: libfaketime is not in effect",
            skew.secs
        );
        Some(process)
    }
}

/// Runs a workspace binary under `skew` to completion: (exit success,
/// stdout, stderr), after checking that its log lines carry the skewed
/// time. `None` when libfaketime is unavailable.
pub async fn run_binary_skewed(
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    skew: Skew,
) -> Option<(bool, String, String)> {
    let fake = skew.env()?;
    let mut all: Vec<(&str, &str)> = env.to_vec();
    all.extend(fake.iter().map(|(k, v)| (*k, v.as_str())));
    let (ok, stdout, stderr) = run_binary(name, args, &all).await;
    let stamp = stderr
        .lines()
        .find_map(|line| line.split_whitespace().next())
        .and_then(|first| chrono::DateTime::parse_from_rfc3339(first).ok())
        .unwrap_or_else(|| panic!("{name} logged no timestamped line:\n{stderr}"));
    assert!(
        skew.shows_in(stamp.to_utc()),
        "{name} under FAKETIME={:+}s logged at {stamp}: libfaketime is not in effect",
        skew.secs
    );
    Some((ok, stdout, stderr))
}

/// Tests set the rate limit explicitly: every process a test starts has it
/// off, unless the test's own environment sets `RATE_LIMIT_PER_MINUTE`
/// (applied after this), so that no test is throttled by the default.
pub const RATE_LIMIT_OFF: (&str, &str) = ("RATE_LIMIT_PER_MINUTE", "0");

/// Every process a test starts knows the back office's audience, as test
/// apps do ([`BACK_OFFICE_AUDIENCE`]), unless the test's own environment
/// sets `JWT_BACKOFFICE_AUDIENCE`.
pub const BACK_OFFICE: (&str, &str) = ("JWT_BACKOFFICE_AUDIENCE", BACK_OFFICE_AUDIENCE);

/// Runs a workspace binary to completion: (exit success, stdout, stderr).
pub async fn run_binary(name: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = tokio::process::Command::new(binary(name));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env(RATE_LIMIT_OFF.0, RATE_LIMIT_OFF.1)
        .env(BACK_OFFICE.0, BACK_OFFICE.1);
    for (k, v) in env {
        command.env(k, v);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("binary finished in time")
        .expect("run binary");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `n` tasks, `task(i)` each, started together (behind a barrier, so
/// they really race); their results, in order.
pub async fn at_once<T, F, Fut>(n: usize, task: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, work) = (barrier.clone(), task(i));
            tokio::spawn(async move {
                barrier.wait().await;
                work.await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(n);
    for task in tasks {
        results.push(task.await.expect("a racing task"));
    }
    results
}

/// `n` back-office refunds of `amount_cents` of `charge_id` at once, each
/// under its own key, by `subject(i)`: how many were made (201); every
/// other is asserted a 400 `refund_exceeds_charge`.
pub async fn parallel_refunds(
    app: &Arc<TestApp>,
    charge_id: &str,
    n: usize,
    amount_cents: i64,
    subject: impl Fn(usize) -> String,
) -> usize {
    let answers = at_once(n, |i| {
        let (app, id, subject) = (app.clone(), charge_id.to_owned(), subject(i));
        async move {
            let body = serde_json::json!({ "amount_cents": amount_cents });
            app.post_refund(&subject, &id, &new_key(), &body).await
        }
    })
    .await;
    let mut made = 0;
    for answer in answers {
        match answer.status {
            201 => made += 1,
            400 => assert_eq!(answer.body["error"]["code"], "refund_exceeds_charge"),
            other => panic!("{other}: {}", answer.body),
        }
    }
    made
}
