//! The bench's databases: a fresh one per backend (a SQLite file in a temp
//! dir, a new database on the PostgreSQL server), the versions for the
//! machine facts, and the expired records the `prune` scenario seeds.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use reqwest::Url;
use sqlx::{AssertSqlSafe, Connection, PgConnection, SqliteConnection};

use crate::settings::Backend;

/// Rows per statement when seeding SQLite, each batch its own transaction.
const SQLITE_SEED_BATCH: u64 = 50_000;

/// A stored 201 body of the shape and size (~330 bytes) the API stores for a
/// `payments-load` charge; `n` makes it unique.
fn body_sql(n: &str) -> String {
    format!(
        r#"'{{"id":"ch_seed' || {n} || '","customer_id":"cus_seed","amount_cents":100,"currency":"GBP","status":"succeeded","description":"payments-load new","metadata":{{"load_op":"new-' || {n} || '","load_run":"load-0123456789abcdef0123456789abcdef"}},"gateway_charge_id":"ch_whF4sGDcKVkjbo1t4xc9syZW","created_at":"2026-01-01T00:00:00.000Z"}}'"#
    )
}

/// One backend's database for the bench.
#[derive(Debug)]
pub struct BenchDb {
    pub backend: Backend,
    pub url: String,
    /// PostgreSQL: the admin URL and the database name, to drop it.
    pg: Option<(String, String)>,
    /// SQLite: the temp dir holding the file.
    dir: Option<PathBuf>,
}

impl BenchDb {
    /// A fresh SQLite file in a new temp dir.
    pub fn sqlite() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "payments-bench-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let url = format!("sqlite://{}", dir.join("bench.db").display());
        Ok(Self {
            backend: Backend::Sqlite,
            url,
            pg: None,
            dir: Some(dir),
        })
    }

    /// `CREATE DATABASE payments_bench_<label>_<uuid>` on the server of
    /// `admin_url`.
    pub async fn postgres(admin_url: &str, label: &str) -> Result<Self> {
        let name = format!("payments_bench_{label}_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(admin_url)
            .await
            .context("connecting to PostgreSQL")?;
        // Identifiers cannot be bound; the name is ours.
        sqlx::raw_sql(AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
            .execute(&mut admin)
            .await
            .with_context(|| format!("CREATE DATABASE {name}"))?;
        let _ = admin.close().await;
        let mut url = Url::parse(admin_url).context("parsing the PostgreSQL URL")?;
        url.set_path(&name);
        Ok(Self {
            backend: Backend::Postgres,
            url: url.to_string(),
            pg: Some((admin_url.to_owned(), name)),
            dir: None,
        })
    }

    /// Where it is, without a password.
    pub fn describe(&self) -> String {
        match (&self.pg, &self.dir) {
            (Some((_, name)), _) => format!("database {name}"),
            (_, Some(dir)) => format!("{}", dir.join("bench.db").display()),
            _ => self.url.clone(),
        }
    }

    /// Drops the PostgreSQL database or removes the SQLite dir (best effort).
    pub async fn drop_now(mut self) {
        if let Some((admin_url, name)) = self.pg.take()
            && let Ok(mut admin) = PgConnection::connect(&admin_url).await
        {
            let sql = format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#);
            let _ = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut admin).await;
            let _ = admin.close().await;
        }
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// `rows` complete records past their expiry, written straight to the
    /// table (no charges: `idempotent_requests` has no foreign key to them,
    /// and the pruner never reads them). Returns how long it took.
    pub async fn seed_expired(&self, rows: u64) -> Result<Duration> {
        let started = Instant::now();
        match self.backend {
            Backend::Postgres => {
                let mut db = PgConnection::connect(&self.url).await?;
                let rows = i64::try_from(rows).context("BENCH_PRUNE_ROWS is too large")?;
                let sql = format!(
                    "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, \
                     request_hash, state, lease_token, locked_until, charge_id, response_status, \
                     response_body, response_content_type, response_location, created_at, \
                     completed_at, expires_at) \
                     SELECT 'seed-' || n, 'POST /api/charges', 'cus_seed', \
                     md5(n::text) || md5((n + 1)::text), 'complete', NULL, NULL, 'ch_seed' || n, \
                     201, {body}, 'application/json', '/api/charges/ch_seed' || n, \
                     now() - interval '48 hours', now() - interval '48 hours', \
                     now() - interval '24 hours' \
                     FROM generate_series(1, $1::bigint) AS n",
                    body = body_sql("n")
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(rows)
                    .execute(&mut db)
                    .await
                    .context("seeding expired records")?;
                // As autovacuum would before long: plans on a table that
                // just grew by a million rows.
                sqlx::raw_sql("ANALYZE idempotent_requests")
                    .execute(&mut db)
                    .await?;
                let _ = db.close().await;
            }
            Backend::Sqlite => {
                let mut db = SqliteConnection::connect(&self.url).await?;
                let now = chrono::Utc::now().timestamp_millis();
                let day = 24 * 3600 * 1000;
                let sql = format!(
                    "WITH RECURSIVE seq(n) AS (SELECT ?1 UNION ALL SELECT n + 1 FROM seq WHERE n < ?2) \
                     INSERT INTO idempotent_requests (idempotency_key, route, customer_id, \
                     request_hash, state, lease_token, locked_until, charge_id, response_status, \
                     response_body, response_content_type, response_location, created_at, \
                     completed_at, expires_at) \
                     SELECT 'seed-' || n, 'POST /api/charges', 'cus_seed', \
                     lower(hex(randomblob(32))), 'complete', NULL, NULL, 'ch_seed' || n, 201, \
                     {body}, 'application/json', '/api/charges/ch_seed' || n, ?3, ?3, ?4 FROM seq",
                    body = body_sql("n")
                );
                let mut first: u64 = 1;
                while first <= rows {
                    let last = (first + SQLITE_SEED_BATCH - 1).min(rows);
                    let mut tx = db.begin().await?;
                    sqlx::query(AssertSqlSafe(sql.clone()))
                        .bind(i64::try_from(first)?)
                        .bind(i64::try_from(last)?)
                        .bind(now - 2 * day)
                        .bind(now - day)
                        .execute(&mut *tx)
                        .await
                        .context("seeding expired records")?;
                    tx.commit().await?;
                    first = last + 1;
                }
                sqlx::raw_sql("ANALYZE").execute(&mut db).await?;
                let _ = db.close().await;
            }
        }
        Ok(started.elapsed())
    }

    /// Complete records past their expiry (what the pruner deletes).
    pub async fn count_prunable(&self) -> Result<u64> {
        let n: i64 = match self.backend {
            Backend::Postgres => {
                let mut db = PgConnection::connect(&self.url).await?;
                sqlx::query_scalar(
                    "SELECT COUNT(*) FROM idempotent_requests \
                     WHERE state = 'complete' AND expires_at <= now()",
                )
                .fetch_one(&mut db)
                .await?
            }
            Backend::Sqlite => {
                let mut db = SqliteConnection::connect(&self.url).await?;
                sqlx::query_scalar(
                    "SELECT COUNT(*) FROM idempotent_requests \
                     WHERE state = 'complete' AND expires_at <= ?1",
                )
                .bind(chrono::Utc::now().timestamp_millis())
                .fetch_one(&mut db)
                .await?
            }
        };
        u64::try_from(n).map_err(|e| anyhow!("a negative count: {e}"))
    }
}

/// `SELECT version()` on the server.
pub async fn postgres_version(admin_url: &str) -> Result<String> {
    let mut db = PgConnection::connect(admin_url).await?;
    let version: String = sqlx::query_scalar("SELECT version()")
        .fetch_one(&mut db)
        .await?;
    let _ = db.close().await;
    Ok(version)
}

/// `sqlite_version()` of the SQLite the workspace links (sqlx's bundled
/// one, as the API uses).
pub async fn sqlite_version() -> Result<String> {
    let mut db = SqliteConnection::connect("sqlite::memory:").await?;
    let version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&mut db)
        .await?;
    let _ = db.close().await;
    Ok(version)
}

/// Makes the server of `admin_url` flush every commit to disk (`fsync`,
/// `synchronous_commit`, `full_page_writes` on), as production runs, or
/// not. All three take effect on a reload; no restart.
pub async fn set_durable(admin_url: &str, durable: bool) -> Result<()> {
    let value = if durable { "on" } else { "off" };
    let mut admin = PgConnection::connect(admin_url)
        .await
        .context("connecting to PostgreSQL")?;
    for setting in ["fsync", "synchronous_commit", "full_page_writes"] {
        // Settings cannot be bound; both names and values are ours.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER SYSTEM SET {setting} = {value}"
        )))
        .execute(&mut admin)
        .await
        .with_context(|| format!("ALTER SYSTEM SET {setting} = {value}"))?;
    }
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut admin)
        .await
        .context("pg_reload_conf()")?;
    // The reload is asynchronous: wait until a new session sees it.
    for _ in 0..50 {
        let mut check = PgConnection::connect(admin_url).await?;
        let fsync: String = sqlx::query_scalar("SHOW fsync")
            .fetch_one(&mut check)
            .await?;
        let _ = check.close().await;
        if fsync == value {
            let _ = admin.close().await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(anyhow!("fsync did not become {value} after a reload"))
}
