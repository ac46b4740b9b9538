//! What the bench asks of its databases beyond the tests' [`TestDb`]: the
//! versions for the machine facts, the expired records the `prune` scenario
//! seeds (and counts afterwards), and PostgreSQL's durability.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use payments_tests::{Backend, TestDb};
use sqlx::{AssertSqlSafe, Connection, PgConnection, SqliteConnection};

/// Rows per statement when seeding SQLite, each batch its own transaction.
const SQLITE_SEED_BATCH: u64 = 50_000;

/// A stored 201 body of the shape and size (~330 bytes) the API stores for a
/// `payments-load` charge; `n` makes it unique.
fn body_sql(n: &str) -> String {
    format!(
        r#"'{{"id":"ch_seed' || {n} || '","customer_id":"cus_seed","amount_cents":100,"currency":"GBP","status":"succeeded","description":"payments-load new","metadata":{{"load_op":"new-' || {n} || '","load_run":"load-0123456789abcdef0123456789abcdef"}},"gateway_charge_id":"ch_whF4sGDcKVkjbo1t4xc9syZW","created_at":"2026-01-01T00:00:00.000Z"}}'"#
    )
}

/// `rows` complete records past their expiry, written straight to the
/// table (no charges: `idempotent_requests` has no foreign key to them, and
/// the pruner never reads them). Returns how long it took.
pub async fn seed_expired(db: &TestDb, rows: u64) -> Result<Duration> {
    let started = Instant::now();
    let columns = "idempotency_key, route, customer_id, request_hash, state, lease_token, \
                   locked_until, charge_id, response_status, response_body, \
                   response_content_type, response_location, created_at, completed_at, expires_at";
    let values = |hash: &str, times: &str| {
        format!(
            "SELECT 'seed-' || n, 'POST /api/charges', 'cus_seed', {hash}, 'complete', NULL, NULL, \
             'ch_seed' || n, 201, {}, 'application/json', '/api/charges/ch_seed' || n, {times}",
            body_sql("n")
        )
    };
    if db.backend == Backend::Postgres {
        let mut pg = PgConnection::connect(&db.url).await?;
        let rows = i64::try_from(rows).context("BENCH_PRUNE_ROWS is too large")?;
        let select = values(
            "md5(n::text) || md5((n + 1)::text)",
            "now() - interval '48 hours', now() - interval '48 hours', now() - interval '24 hours'",
        );
        let sql = format!(
            "INSERT INTO idempotent_requests ({columns}) {select} \
             FROM generate_series(1, $1::bigint) AS n"
        );
        let seeded = sqlx::query(AssertSqlSafe(sql))
            .bind(rows)
            .execute(&mut pg)
            .await;
        seeded.context("seeding expired records")?;
        // As autovacuum would before long: plans on a table that just grew
        // by a million rows.
        sqlx::raw_sql("ANALYZE idempotent_requests")
            .execute(&mut pg)
            .await?;
        let _ = pg.close().await;
        return Ok(started.elapsed());
    }
    let mut sqlite = SqliteConnection::connect(&db.url).await?;
    let (now, day) = (chrono::Utc::now().timestamp_millis(), 24 * 3600 * 1000);
    let select = values("lower(hex(randomblob(32)))", "?3, ?3, ?4");
    let sql = format!(
        "WITH RECURSIVE seq(n) AS (SELECT ?1 UNION ALL SELECT n + 1 FROM seq WHERE n < ?2) \
         INSERT INTO idempotent_requests ({columns}) {select} FROM seq"
    );
    let mut first: u64 = 1;
    while first <= rows {
        let last = (first + SQLITE_SEED_BATCH - 1).min(rows);
        let mut tx = sqlite.begin().await?;
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
    sqlx::raw_sql("ANALYZE").execute(&mut sqlite).await?;
    let _ = sqlite.close().await;
    Ok(started.elapsed())
}

/// Complete records past their expiry (what the pruner deletes).
pub async fn count_prunable(db: &TestDb) -> Result<u64> {
    let sql =
        "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'complete' AND expires_at <= ";
    let n: i64 = if db.backend == Backend::Postgres {
        let mut pg = PgConnection::connect(&db.url).await?;
        let count = sqlx::query_scalar(AssertSqlSafe(format!("{sql}now()")));
        count.fetch_one(&mut pg).await?
    } else {
        let mut sqlite = SqliteConnection::connect(&db.url).await?;
        let count = sqlx::query_scalar(AssertSqlSafe(format!("{sql}?1")));
        let now = chrono::Utc::now().timestamp_millis();
        count.bind(now).fetch_one(&mut sqlite).await?
    };
    u64::try_from(n).map_err(|e| anyhow!("a negative count: {e}"))
}

/// A one-value query of ours on a PostgreSQL connection of its own.
pub async fn pg_one(url: &str, sql: &str) -> Result<String> {
    let mut pg = PgConnection::connect(url)
        .await
        .context("connecting to PostgreSQL")?;
    let value = sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .fetch_one(&mut pg)
        .await;
    let _ = pg.close().await;
    value.with_context(|| sql.to_owned())
}

/// `sqlite_version()` of the SQLite the workspace links (sqlx's bundled
/// one, as the API uses).
pub async fn sqlite_version() -> Result<String> {
    let mut db = SqliteConnection::connect("sqlite::memory:").await?;
    let version = sqlx::query_scalar("SELECT sqlite_version()")
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
    let mut admin = PgConnection::connect(admin_url).await?;
    // One statement each: ALTER SYSTEM runs outside a transaction block.
    for setting in ["fsync", "synchronous_commit", "full_page_writes"] {
        // Settings cannot be bound; both names and values are ours.
        let sql = format!("ALTER SYSTEM SET {setting} = {value}");
        let set = sqlx::raw_sql(AssertSqlSafe(sql.clone()))
            .execute(&mut admin)
            .await;
        set.context(sql)?;
    }
    let reload = sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut admin)
        .await;
    reload.context("pg_reload_conf()")?;
    let _ = admin.close().await;
    // The reload is asynchronous: wait until a new session sees it.
    for _ in 0..50 {
        if pg_one(admin_url, "SHOW fsync").await? == value {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(anyhow!("fsync did not become {value} after a reload"))
}
