//! What the bench asks of its databases beyond the tests' [`TestDb`]: the
//! versions, the expired records `prune` seeds, PostgreSQL's durability,
//! and the pgbench ceiling: `tests/bench/charge.sql` (one new charge, as
//! `crates/store/src/sql.rs` runs it on PostgreSQL) on a fresh migrated
//! database, with as many clients as `new` has concurrency. The API's new
//! charges/s divided by its tps says how much of the database's capacity
//! the server's own work leaves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use payments_tests::{Backend, TestDb};
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, PgConnection, SqliteConnection};

/// Rows per statement when seeding SQLite, each its own transaction.
const SQLITE_SEED_BATCH: u64 = 50_000;

/// A stored 201 body of the shape and size (~330 bytes) the API stores for a
/// `payments-load` charge, unique by `n`.
const BODY: &str = r#"'{"id":"ch_seed' || n || '","customer_id":"cus_seed","amount_cents":100,"currency":"GBP","status":"succeeded","description":"payments-load new","metadata":{"load_op":"new-' || n || '","load_run":"load-0123456789abcdef0123456789abcdef"},"gateway_charge_id":"ch_whF4sGDcKVkjbo1t4xc9syZW","created_at":"2026-01-01T00:00:00.000Z"}'"#;

/// `rows` complete records past their expiry, written straight to the
/// table (no charges: `idempotent_requests` has no foreign key to them, and
/// the pruner never reads them).
pub async fn seed_expired(db: &TestDb, rows: u64) {
    let select = |hash: &str, times: &str| {
        format!(
            "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
             state, lease_token, locked_until, charge_id, response_status, response_body, \
             response_content_type, response_location, created_at, completed_at, expires_at) \
             SELECT 'seed-' || n, 'POST /api/charges', 'cus_seed', {hash}, 'complete', NULL, \
             NULL, 'ch_seed' || n, 201, {BODY}, 'application/json', \
             '/api/charges/ch_seed' || n, {times}"
        )
    };
    // The bench runs no MySQL.
    if db.backend == Backend::Postgres {
        let hash = "md5(n::text) || md5((n + 1)::text)";
        let ago = |hours| format!("now() - interval '{hours} hours'");
        let select = select(hash, &[ago(48), ago(48), ago(24)].join(", "));
        let sql = format!("{select} FROM generate_series(1, {rows}) AS n");
        db.execute("", &sql, "").await;
    } else {
        let (now, day) = (chrono::Utc::now().timestamp_millis(), 24 * 3600 * 1000);
        let times = format!("{}, {}, {}", now - 2 * day, now - 2 * day, now - day);
        let select = select("lower(hex(randomblob(32)))", &times);
        sqlite_rows(db, rows, &select).await;
    }
    // As autovacuum would before long: plans on a table that just grew.
    let analyze = "ANALYZE idempotent_requests";
    db.execute(analyze, analyze, "").await;
}

/// `rows` succeeded charges of `customer` (ids `ch_<customer>_0000000001`
/// up: a charge's prefix, or the API takes the cursor for no charge; one
/// second apart, older than any the API makes), for `list`'s pages;
/// returns the id in the middle, a deep page's cursor.
pub async fn seed_charges(db: &TestDb, customer: &str, rows: u64) -> String {
    // `padded`: n, ten digits wide (as the returned cursor is).
    let select = |padded: &str, at: &str| {
        format!(
            "INSERT INTO charges (id, customer_id, amount_cents, currency, card_token, \
             metadata, status, provider_key, created_at, updated_at) \
             SELECT 'ch_{customer}_' || {padded}, '{customer}', 100, 'GBP', 'tok_visa', '{{}}', \
             'succeeded', '{customer}_pk_' || n, {at}, {at}"
        )
    };
    if db.backend == Backend::Postgres {
        let at = "timestamptz '2020-01-01' + n * interval '1 second'";
        let padded = select("lpad(n::text, 10, '0')", at);
        let sql = format!("{padded} FROM generate_series(1, {rows}) AS n");
        db.execute("", &sql, "").await;
    } else {
        let at = "1577836800000 + n * 1000";
        let padded = select("substr('000000000' || n, -10)", at);
        sqlite_rows(db, rows, &padded).await;
    }
    let analyze = "ANALYZE charges";
    db.execute(analyze, analyze, "").await;
    format!("ch_{customer}_{:010}", rows / 2)
}

/// `insert` (an `INSERT .. SELECT` of `n`) for n = 1..=rows on SQLite, in
/// batches of [`SQLITE_SEED_BATCH`] (it has no `generate_series`).
async fn sqlite_rows(db: &TestDb, rows: u64, insert: &str) {
    for first in (1..=rows).step_by(SQLITE_SEED_BATCH as usize) {
        let last = (first + SQLITE_SEED_BATCH - 1).min(rows);
        let sql = format!(
            "WITH RECURSIVE seq(n) AS (SELECT {first} UNION ALL SELECT n + 1 FROM seq \
             WHERE n < {last}) {insert} FROM seq"
        );
        db.execute(&sql, "", "").await;
    }
}

/// Complete records past their expiry (what the pruner deletes).
pub async fn count_prunable(db: &TestDb) -> i64 {
    let sqlite = "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'complete' \
                  AND expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)";
    let postgres = "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'complete' \
                    AND expires_at <= now()";
    db.count(sqlite, postgres, &[]).await
}

/// A one-value query of ours on a PostgreSQL connection of its own.
pub async fn pg_one(url: &str, sql: &str) -> Result<String> {
    let mut pg = PgConnection::connect(url).await?;
    let value = sqlx::query_scalar(AssertSqlSafe(sql.to_owned()));
    let value = value.fetch_one(&mut pg).await;
    value.with_context(|| sql.to_owned())
}

/// The version of the SQLite the workspace links (sqlx's bundled one).
pub async fn sqlite_version() -> Result<String> {
    let mut db = SqliteConnection::connect("sqlite::memory:").await?;
    let version = sqlx::query_scalar("SELECT sqlite_version()");
    Ok(version.fetch_one(&mut db).await?)
}

/// Makes the server of `admin_url` flush every commit to disk (`fsync`,
/// `synchronous_commit`, `full_page_writes` on), as production runs. All
/// three take effect on a reload.
pub async fn make_durable(admin_url: &str) -> Result<()> {
    let mut admin = PgConnection::connect(admin_url).await?;
    // One statement each: ALTER SYSTEM runs outside a transaction block.
    for setting in ["fsync", "synchronous_commit", "full_page_writes"] {
        let sql = format!("ALTER SYSTEM SET {setting} = on");
        let set = sqlx::raw_sql(AssertSqlSafe(sql.clone()));
        set.execute(&mut admin).await.context(sql)?;
    }
    let reload = sqlx::query("SELECT pg_reload_conf()");
    reload.execute(&mut admin).await?;
    // The reload is asynchronous: wait until a new session sees it.
    for _ in 0..50 {
        if pg_one(admin_url, "SHOW fsync").await? == "on" {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(anyhow!("fsync did not come on after a reload"))
}

/// What pgbench measured.
#[derive(Debug)]
pub struct Pgbench {
    pub clients: u64,
    pub threads: u64,
    pub seconds: u64,
    /// `tps = X (without initial connection time)`.
    pub tps: f64,
    pub latency_avg_ms: Option<f64>,
    pub transactions: Option<u64>,
    pub failed: Option<u64>,
}

/// pgbench (beside the server binaries, else on `PATH`) running
/// `tests/bench/charge.sql` against `db` for `seconds` with `clients`
/// clients on up to 2 threads; its output goes to `log`.
pub async fn pgbench(db: &TestDb, clients: u64, seconds: u64, log: PathBuf) -> Result<Pgbench> {
    let dir = payments_tests::postgres::binaries_dir();
    let program = dir.map(|d| d.join("pgbench")).filter(|p| p.is_file());
    let mut command = tokio::process::Command::new(program.unwrap_or_else(|| "pgbench".into()));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/charge.sql");
    command.args(["-n", "-M", "prepared", "-f"]).arg(script);
    let threads = clients.min(2);
    let [c, j, t] = [clients, threads, seconds].map(|n| n.to_string());
    command.args(["-c", &c, "-j", &j, "-T", &t, &db.url]);
    command.env("PGCONNECT_TIMEOUT", "10").kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(seconds + 120), command.output()).await;
    let out = out.context("pgbench did not finish")??;
    let output = String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned();
    std::fs::write(&log, &output).with_context(|| format!("writing {}", log.display()))?;
    let status = out.status;
    ensure!(status.success(), "pgbench failed ({status}):\n{output}");
    let tps = field(&output, "tps = ");
    Ok(Pgbench {
        clients,
        threads,
        seconds,
        tps: tps.with_context(|| format!("no `tps = ` in pgbench's output:\n{output}"))?,
        latency_avg_ms: field(&output, "latency average = "),
        transactions: field(&output, "number of transactions actually processed: "),
        failed: field(&output, "number of failed transactions: "),
    })
}

/// The first word after `prefix` on the line that starts with it.
fn field<T: std::str::FromStr>(output: &str, prefix: &str) -> Option<T> {
    let mut lines = output.lines();
    let rest = lines.find_map(|line| line.trim().strip_prefix(prefix))?;
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_pgbench_15_output() {
        let out = "number of transactions actually processed: 8672\n\
                   number of failed transactions: 0 (0.000%)\n\
                   latency average = 1.381 ms\n\
                   tps = 2897.070157 (without initial connection time)\n";
        let field = |prefix| super::field::<f64>(out, prefix);
        assert_eq!(field("tps = "), Some(2897.070157));
        assert_eq!(field("latency average = "), Some(1.381));
        let transactions = "number of transactions actually processed: ";
        assert_eq!(field(transactions), Some(8672.0));
        assert_eq!(field("number of failed transactions: "), Some(0.0));
    }
}

/// MariaDB made durable as production runs it: the redo log flushed at
/// every commit (the tests' server flushes once a second), and a buffer
/// pool that holds the bench's tables. Its version.
pub async fn make_mysql_durable(admin_url: &str) -> Result<String> {
    let mut admin = MySqlConnection::connect(admin_url).await?;
    for sql in [
        "SET GLOBAL innodb_flush_log_at_trx_commit = 1",
        "SET GLOBAL innodb_buffer_pool_size = 268435456",
    ] {
        sqlx::raw_sql(sql).execute(&mut admin).await.context(sql)?;
    }
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut admin)
        .await?;
    Ok(format!("MariaDB {version}"))
}

/// What the one-writer loop measured on SQLite.
#[derive(Debug, Clone, Copy)]
pub struct Ceiling {
    pub charges: u64,
    pub secs: f64,
}

impl Ceiling {
    pub fn rate(&self) -> f64 {
        self.charges as f64 / self.secs.max(f64::EPSILON)
    }
}

/// SQLite's one-writer ceiling: a fresh file opened by the store as the
/// server opens it (WAL, `synchronous=FULL`), with one connection for
/// writes and group commit off (`write_batch` 1), and one loop that runs
/// the store's own claim (the record and its charge, one transaction) and
/// finish (the two updates, another), `charges` times, one after another.
pub async fn sqlite_ceiling(charges: u64) -> Result<Ceiling> {
    use payments_domain::charge::{Charge, ChargeRequest, ChargeStatus, CustomerId};
    use payments_domain::idempotency::{
        CHARGES_ROUTE, IdempotencyKey, RecordState, RequestFingerprint, StoredResponse,
    };
    use payments_domain::store::{
        ChargeOutcome, Claim, ClaimOutcome, Finish, NewLease, Operation, Outcome,
    };
    use payments_store::{DatabaseUrl, PoolSettings, SqliteStore};

    let dir = std::env::temp_dir().join(format!("payments-ceiling-{}", uuid::Uuid::new_v4()));
    let url: DatabaseUrl = format!("sqlite://{}/ceiling.db", dir.display())
        .parse()
        .map_err(|e: String| anyhow!(e))?;
    let settings = PoolSettings {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(30),
        write_batch: 1,
    };
    let store = SqliteStore::connect(&url, &settings).await?;
    payments_domain::store::Store::migrate(&store).await?;
    let customer = CustomerId::parse("cus_ceiling").map_err(|e| anyhow!("{e:?}"))?;
    let body =
        serde_json::json!({"amount_cents": 100, "currency": "GBP", "card_token": "tok_visa"});
    let request = ChargeRequest::from_json(&body, 1_000_000).map_err(|e| anyhow!("{e:?}"))?;
    let started = std::time::Instant::now();
    for n in 0..charges {
        let charge = Charge::pending(&customer, &request);
        let claim = Claim {
            key: IdempotencyKey::parse(&format!("ceiling-{n}")).map_err(|e| anyhow!("{e:?}"))?,
            route: CHARGES_ROUTE,
            customer: customer.clone(),
            fingerprint: RequestFingerprint::of(&body),
            lease: NewLease::new(Duration::from_secs(60)),
            ttl: Duration::from_secs(86_400),
            operation: Operation::Charge(charge.clone()),
            read_first: true,
            hold_margin: Duration::ZERO,
        };
        let store: &dyn payments_domain::store::Store = &store;
        let ClaimOutcome::Claimed { record_id, .. } = store.claim(&claim).await? else {
            anyhow::bail!("ceiling: key {n} was not claimed");
        };
        let outcome = Outcome::Charge(ChargeOutcome {
            charge_id: charge.id.clone(),
            status: ChargeStatus::Succeeded,
            gateway_charge_id: Some("ch_ceiling".into()),
            decline_code: None,
            capture_before: None,
        });
        let finish = Finish {
            record_id,
            lease_token: claim.lease.token.clone(),
            state: RecordState::Complete,
            // The event the API writes with the same finish.
            event: payments_domain::events::NewEvent::of(&claim.operation, &outcome),
            outcome,
            // A stored 201 of the size the API stores.
            response: StoredResponse {
                status: 201,
                body: BODY.replace("' || n || '", &n.to_string()),
                content_type: "application/json".into(),
                location: Some(format!("/api/charges/{}", charge.id)),
            },
        };
        store.finish(&finish).await?;
    }
    let secs = started.elapsed().as_secs_f64();
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Ceiling { charges, secs })
}

/// The main process of the database server behind `admin_url`, whose CPU
/// (with its children's) the bench counts as the database's: PostgreSQL's
/// postmaster (the parent of the backend this connection talks to), or
/// MariaDB's `mariadbd` (its pid file). Other servers on the machine (a
/// shared one on 5432, other sessions' throwaway clusters) stay out.
pub async fn server_pid(backend: Backend, admin_url: &str) -> Result<u32> {
    let pid = match backend {
        Backend::Postgres => {
            let mut pg = PgConnection::connect(admin_url).await?;
            let backend_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut pg)
                .await?;
            // Read while the backend is alive: its parent is the postmaster.
            let status = std::fs::read_to_string(format!("/proc/{backend_pid}/status"));
            let status = status.context("the backend's /proc status")?;
            let ppid = status.lines().find_map(|line| line.strip_prefix("PPid:"));
            ppid.context("no PPid")?.trim().parse()?
        }
        Backend::Mysql => {
            let mut admin = MySqlConnection::connect(admin_url).await?;
            let file: String = sqlx::query_scalar("SELECT @@pid_file")
                .fetch_one(&mut admin)
                .await?;
            let pid = std::fs::read_to_string(&file).with_context(|| file.clone())?;
            pid.trim()
                .parse()
                .with_context(|| format!("{file}: {pid:?}"))?
        }
        other => anyhow::bail!("the bench runs no {} server", other.name()),
    };
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let expected = ["postgres", "mariadbd", "mysqld"];
    ensure!(
        expected.contains(&comm.trim()),
        "pid {pid} is {comm:?}, not a database server"
    );
    Ok(pid)
}
