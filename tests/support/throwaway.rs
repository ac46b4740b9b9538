//! A real server for tests, one fresh database per test: what PostgreSQL
//! ([`super::postgres`]) and MariaDB ([`super::mysql`]) share. Each module
//! supplies only what differs: how to find and start its server, and its
//! SQL.
//!
//! The store's behaviour under races is what the payments server relies on
//! to take money exactly once, and no fake reproduces it. So tests talk to a
//! real server, and each test gets its own empty database, so tests can run
//! in parallel without seeing each other's rows.
//!
//! Where the server comes from, in order:
//! 1. `TEST_POSTGRES_URL` / `TEST_MYSQL_URL` (for example
//!    `postgres://postgres@127.0.0.1:5432/postgres`): an existing server,
//!    used as the admin connection.
//! 2. Otherwise one throwaway server per test process, started on first use
//!    from the installed server binaries in a temp dir, on a free port, tuned
//!    for speed over durability. It is started synchronously behind a
//!    [`OnceLock`] rather than from async code, because every `#[tokio::test]`
//!    has its own runtime and a server owned by one runtime would die with
//!    that test.
//! 3. Neither: the test reports itself skipped ([`skip_or_panic`] prints
//!    `SKIPPED: postgres: ...` past the test harness's capture), and passes;
//!    under `REQUIRE_ALL_BACKENDS=1` (`make test`, CI) it fails instead, so a
//!    run cannot pass by silently testing nothing.
//!
//! Cleanup: the Rust test harness exits without running destructors of
//! statics, so nothing in this process can stop the server. Instead a
//! detached `sh` watchdog polls `kill -0 <test pid>` once a second and, when
//! the test process is gone (finished, panicked or killed), stops the server
//! and deletes its temp dir.
//!
//! The servers refuse to run as root, so a root test process (CI, a
//! container) runs them as the user their package created (`postgres`,
//! `mysql`), with the temp dir owned by that user.

use std::io::Write as _;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A URL with its password hidden, for messages.
pub(crate) fn redact(url: &str) -> String {
    url.parse::<payments_store::DatabaseUrl>()
        .map_or_else(|_| url.to_owned(), |u| u.to_string())
}
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, PgConnection};

/// Why a backend's tests are skipped: no server was configured and none can
/// be started on this machine.
#[derive(Debug, Clone)]
pub struct Skip(pub String);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skip {}

/// When `1`, a missing backend fails the test instead of skipping it.
const REQUIRE_VAR: &str = "REQUIRE_ALL_BACKENDS";

/// Reports the calling test skipped for want of `what` (`postgres`, `clock
/// skew`): `SKIPPED: <what>: <reason> (<test>)` on stderr, written past the
/// test harness's capture so a passing test still shows it; `scripts/
/// test-summary` counts these lines. Panics instead when
/// `REQUIRE_ALL_BACKENDS=1`.
pub fn skip_or_panic(what: &str, skip: &Skip) {
    if std::env::var(REQUIRE_VAR).is_ok_and(|value| value == "1") {
        panic!(
            "{what} is unavailable and {REQUIRE_VAR}=1 (`make test` and CI set it; \
             REQUIRE_ALL_BACKENDS=0 skips instead): {skip}"
        );
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let line = format!("SKIPPED: {what}: {skip} ({test})\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// A backend with a throwaway server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    Postgres,
    Mysql,
}

/// The outcome of starting a throwaway server, computed once per process.
#[derive(Debug)]
pub(crate) enum Server {
    Running(String),
    Unavailable(Skip),
    Broken(String),
}

impl Engine {
    /// `postgres`, `mysql`: the backend's name in skip lines and logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Mysql => "mysql",
        }
    }

    fn url_var(self) -> &'static str {
        match self {
            Self::Postgres => "TEST_POSTGRES_URL",
            Self::Mysql => "TEST_MYSQL_URL",
        }
    }

    /// The admin URL of the server tests use: the engine's `TEST_*_URL`,
    /// else the throwaway server (started on the first call, which blocks
    /// for a second or two).
    ///
    /// # Errors
    /// [`Skip`] when the variable is unset and no server binaries are installed.
    ///
    /// # Panics
    /// When the binaries exist but the server cannot be started: that is a
    /// broken machine, not a missing backend, and must not pass as a skip.
    pub fn admin_url(self) -> Result<String, Skip> {
        match std::env::var(self.url_var()) {
            Ok(url) if !url.is_empty() => Ok(url),
            _ => self.throwaway_admin_url().map_err(|skip| {
                let var = self.url_var();
                Skip(format!("no server (set {var}, or install one: {skip})"))
            }),
        }
    }

    /// The throwaway server's admin URL, whatever `TEST_*_URL` says.
    pub fn throwaway_admin_url(self) -> Result<String, Skip> {
        static POSTGRES: OnceLock<Server> = OnceLock::new();
        static MYSQL: OnceLock<Server> = OnceLock::new();
        let (cell, start): (_, fn() -> Server) = match self {
            Self::Postgres => (&POSTGRES, super::postgres::start),
            Self::Mysql => (&MYSQL, super::mysql::start),
        };
        match cell.get_or_init(start) {
            Server::Running(admin_url) => Ok(admin_url.clone()),
            Server::Unavailable(skip) => Err(skip.clone()),
            Server::Broken(why) => panic!("the throwaway {} server failed: {why}", self.label()),
        }
    }
}

/// What a server's start gave: its admin URL and temp dir, or why it failed.
pub(crate) fn started(
    engine: Engine,
    began: Instant,
    outcome: Result<(String, PathBuf), String>,
) -> Server {
    match outcome {
        Ok((admin_url, dir)) => {
            eprintln!(
                "{}: throwaway server {admin_url} in {} started in {} ms",
                engine.label(),
                dir.display(),
                began.elapsed().as_millis()
            );
            Server::Running(admin_url)
        }
        Err(why) => Server::Broken(why),
    }
}

/// A fresh, empty database for one test, dropped when the guard is dropped,
/// after ending any session still using it.
pub struct TestDatabase {
    /// Connection URL of this database.
    pub url: String,
    /// Database name, `payments_test_<uuid>`.
    pub name: String,
    admin_url: String,
    engine: Engine,
}

impl std::fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDatabase")
            .field("url", &redact(&self.url))
            .finish_non_exhaustive()
    }
}

/// Bounds the work `Drop` does, so an unreachable server cannot hang a test.
const DROP_TIMEOUT: Duration = Duration::from_secs(30);

impl TestDatabase {
    /// Creates `payments_test_<uuid>` on the server of `admin_url`
    /// (PostgreSQL: UTF-8; MySQL: `utf8mb4` with a binary collation, which
    /// compares keys byte for byte as the other backends do).
    ///
    /// # Panics
    /// On real errors (a server that refuses connections, a failing `CREATE
    /// DATABASE`): only "no backend here" is a [`Skip`], and that is the
    /// caller's to find out.
    pub(crate) async fn create(engine: Engine, admin_url: String) -> Self {
        let name = format!("payments_test_{}", uuid::Uuid::new_v4().simple());
        // Identifiers cannot be bound as parameters; the name is ours (a uuid).
        let sql = match engine {
            Engine::Postgres => format!(r#"CREATE DATABASE "{name}""#),
            Engine::Mysql => {
                format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
            }
        };
        let created = match engine {
            Engine::Postgres => execute::<PgConnection>(&admin_url, &sql).await,
            Engine::Mysql => execute::<MySqlConnection>(&admin_url, &sql).await,
        };
        created.unwrap_or_else(|e| panic!("{sql} on {}: {e}", redact(&admin_url)));
        let url = with_database(&admin_url, &name);
        Self {
            url,
            name,
            admin_url,
            engine,
        }
    }

    /// Runs one statement of ours on the server's admin connection.
    pub(crate) async fn admin(&self, sql: &str) {
        let done = match self.engine {
            Engine::Postgres => execute::<PgConnection>(&self.admin_url, sql).await,
            Engine::Mysql => execute::<MySqlConnection>(&self.admin_url, sql).await,
        };
        done.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Ends every other session on this PostgreSQL database (a template
    /// must have none).
    pub(crate) async fn end_sessions(&self) {
        let sql = format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            self.name
        );
        self.admin(&sql).await;
    }

    /// `program` (`mariadb`, `mariadb-dump`) pointed at this database with
    /// the admin URL's host, port and user (its password in `MYSQL_PWD`).
    pub(crate) fn mysql_client(&self, program: &str, args: &[&str]) -> std::process::Command {
        let url = reqwest::Url::parse(&self.admin_url).expect("the admin URL");
        let mut command = std::process::Command::new(program);
        command
            .arg(format!("--host={}", url.host_str().unwrap_or("127.0.0.1")))
            .arg(format!("--port={}", url.port().unwrap_or(3306)))
            .arg(format!("--user={}", url.username()))
            .args(args)
            .arg(&self.name);
        if let Some(password) = url.password() {
            command.env("MYSQL_PWD", password);
        }
        command
    }

    /// Best effort: never panics, because it runs inside `Drop`.
    async fn drop_database(engine: Engine, admin_url: &str, name: &str) {
        let sql = match engine {
            // `WITH (FORCE)`: open pools do not block it.
            Engine::Postgres => {
                let sql = format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#);
                let _ = execute::<PgConnection>(admin_url, &sql).await;
                return;
            }
            Engine::Mysql => format!("DROP DATABASE IF EXISTS `{name}`"),
        };
        let Ok(mut admin) = MySqlConnection::connect(admin_url).await else {
            return;
        };
        // MySQL has no `WITH (FORCE)`. A session still in the database (a
        // pool not yet closed, a transaction a panicking test left open)
        // holds metadata locks that make `DROP DATABASE` wait for up to
        // `lock_wait_timeout` (a day by default), so end those sessions.
        // `CAST`: the column is signed in MariaDB, unsigned in MySQL.
        let sessions: Vec<i64> = sqlx::query_scalar(
            "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST \
             WHERE DB = ? AND ID <> CONNECTION_ID()",
        )
        .bind(name)
        .fetch_all(&mut admin)
        .await
        .unwrap_or_default();
        for id in sessions {
            // Fails harmlessly for a session that has just ended.
            let kill = format!("KILL CONNECTION {id}");
            let _ = sqlx::raw_sql(AssertSqlSafe(kill)).execute(&mut admin).await;
        }
        let _ = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut admin).await;
        let _ = admin.close().await;
    }
}

/// Runs one statement of ours on a connection of its own.
async fn execute<C>(url: &str, sql: &str) -> Result<(), sqlx::Error>
where
    C: Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    let mut connection = C::connect(url).await?;
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(&mut connection)
        .await?;
    // Errors closing a connection we no longer need do not matter.
    let _ = connection.close().await;
    Ok(())
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop is synchronous and usually runs inside the test's runtime,
        // where blocking on another future panics. A fresh thread has no
        // runtime, so it can build its own and block on the drop.
        let (engine, admin_url, name) = (self.engine, self.admin_url.clone(), self.name.clone());
        let dropper = std::thread::Builder::new()
            .name(format!("drop {name}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                if let Ok(runtime) = runtime {
                    // A timeout only leaves the database behind.
                    let drop = Self::drop_database(engine, &admin_url, &name);
                    let _ =
                        runtime.block_on(async { tokio::time::timeout(DROP_TIMEOUT, drop).await });
                }
            });
        if let Ok(handle) = dropper {
            // A failed drop leaves a stray database, not a wrong test result.
            let _ = handle.join();
        }
    }
}

/// `id -u` rather than `geteuid()`: the workspace forbids `unsafe` and the
/// tests do not otherwise need libc.
fn effective_uid_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.status.success() && out.stdout.trim_ascii() == b"0")
}

/// A throwaway server's setting out: the user to run it as when this
/// process is root (`preferred`, the account its package creates, else
/// `fallback`), a fresh temp dir `<prefix>-<pid>-<nanos>` and the path of its
/// `data` directory.
pub(crate) type Prepared = (Option<&'static str>, PathBuf, PathBuf);

pub(crate) fn prepare(
    prefix: &str,
    preferred: &'static str,
    fallback: &'static str,
) -> Result<Prepared, String> {
    let user = if user_exists(preferred) {
        preferred
    } else {
        fallback
    };
    let dir = make_temp_dir(prefix)?;
    let data = dir.join("data");
    Ok((effective_uid_is_root().then_some(user), dir, data))
}

/// Whether this machine has the account `user` (a server package creates one).
fn user_exists(user: &str) -> bool {
    let mut id = Command::new("id");
    id.args(["-u", user])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    id.status().is_ok_and(|status| status.success())
}

pub(crate) fn both_streams(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
    .trim()
    .to_owned()
}

/// Runs `command` to completion; its output is the error's when it fails.
pub(crate) fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|e| cannot_run(command, what, &e))?;
    succeeded(&output, what)
}

pub(crate) fn cannot_run(command: &Command, what: &str, e: &std::io::Error) -> String {
    let program = Path::new(command.get_program()).display();
    format!("{what}: cannot run {program}: {e}")
}

pub(crate) fn succeeded(output: &Output, what: &str) -> Result<(), String> {
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}): {}",
        output.status,
        both_streams(output)
    ))
}

/// Starts the detached watchdog that waits for this test process to exit,
/// then runs `cleanup` (a shell script).
pub(crate) fn spawn_watchdog(cleanup: &str) -> Result<(), String> {
    let pid = std::process::id();
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done\n{cleanup}"
        ))
        // Inherited pipes would keep a caller reading our output (`cargo test
        // | tee`) waiting until the watchdog exits.
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C on the test run must not kill it.
        .process_group(0)
        .spawn()
        .map(drop)
        .map_err(|e| format!("cannot start the cleanup watchdog: {e}"))
}

/// A port that was free a moment ago; the caller retries if it is taken by
/// the time the server binds it.
pub(crate) fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// Single-quotes a path for `sh` (also used inside `pg_ctl -o`, which goes
/// through a shell).
pub(crate) fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// `admin_url` with its database (the URL path) replaced by `name`, keeping
/// the query string (`?sslmode=...`).
pub(crate) fn with_database(admin_url: &str, name: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (admin_url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

/// `<temp>/<prefix>-<pid>-<nanos>`, created fresh (never reused).
fn make_temp_dir(prefix: &str) -> Result<PathBuf, String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::{redact, with_database};

    #[test]
    fn with_database_replaces_only_the_path() {
        for scheme in ["postgres", "mysql"] {
            let url = |rest: &str| format!("{scheme}://{rest}");
            let cases = [
                ("root@127.0.0.1:5432/postgres", "root@127.0.0.1:5432/t1"),
                (
                    "u:p@[::1]:5433/db?sslmode=disable",
                    "u:p@[::1]:5433/t1?sslmode=disable",
                ),
                ("localhost", "localhost/t1"),
            ];
            for (admin, test) in cases {
                assert_eq!(with_database(&url(admin), "t1"), url(test));
            }
        }
    }

    #[test]
    fn redact_hides_only_the_password() {
        for scheme in ["postgres", "mysql"] {
            let url = |rest: &str| format!("{scheme}://{rest}");
            assert_eq!(
                redact(&url("u:secret@host:5432/db?x=1")),
                url("u:***@host:5432/db?x=1")
            );
            assert_eq!(redact(&url("u@host/db")), url("u@host/db"));
        }
    }
}
