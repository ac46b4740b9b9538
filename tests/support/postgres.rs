//! A real PostgreSQL for tests, one fresh database per test.
//!
//! The store's behaviour under races (unique violations, aborted transactions,
//! serialization failures) is what the payments server relies on to take money
//! exactly once, and no fake reproduces it. So tests talk to a real server, and
//! each test gets its own empty database, so tests can run in parallel without
//! seeing each other's rows.
//!
//! Where the server comes from, in order:
//! 1. `TEST_POSTGRES_URL` (for example `postgres://postgres@127.0.0.1:5432/postgres`):
//!    an existing server, used as the admin connection. CI and developers who
//!    already run PostgreSQL set it. `payments-bench` skips this step
//!    ([`throwaway_admin_url`]): its figures must come from a known server.
//! 2. Otherwise one throwaway cluster per test process, started on first use
//!    from the installed server binaries ([`binaries_dir`]) in a temp dir, on a
//!    free port, tuned for speed over durability (`fsync=off`). It is started
//!    synchronously with `std::process::Command` behind a [`OnceLock`] rather
//!    than from async code, because every `#[tokio::test]` has its own runtime
//!    and a cluster owned by one runtime would die with that test.
//! 3. Neither: the backend is skipped with a reason ([`Skip`]), and
//!    [`skip_or_panic`] turns the skip into a failure when
//!    `REQUIRE_ALL_BACKENDS=1`, so CI cannot pass by silently testing nothing.
//!
//! Cleanup of the throwaway cluster: the Rust test harness exits without
//! running destructors of statics, so nothing in this process can stop the
//! server. Instead a detached `sh` watchdog polls `kill -0 <test pid>` once a
//! second and, when the test process is gone (finished, panicked or killed),
//! stops the cluster with `pg_ctl stop -m immediate` and deletes its temp dir.
//!
//! `initdb` and `pg_ctl` refuse to run as root, so a root test process (CI, a
//! container) runs them through `runuser -u postgres --` (or `nobody` where the
//! server package did not create a `postgres` user) in a temp dir owned by
//! that user.

pub use super::throwaway::Skip;
use super::throwaway::{
    self, both_streams, effective_uid_is_root, free_port, make_temp_dir, redact, shell_quote,
    with_database,
};
use std::fmt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// Names an existing server to use instead of a throwaway cluster.
const URL_VAR: &str = "TEST_POSTGRES_URL";
/// Ports can be taken between probing and the server binding them.
const START_ATTEMPTS: usize = 4;

/// The throwaway cluster, started at most once per test process.
static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The admin URL of the server tests use, or why PostgreSQL is skipped.
/// Starts the throwaway cluster on first call (this blocks for a second or two).
///
/// # Errors
/// [`Skip`] when `TEST_POSTGRES_URL` is unset and no server binaries are installed.
///
/// # Panics
/// When the server binaries exist but the cluster cannot be started: that is
/// a broken machine, not a missing backend, and must not pass as a skip.
pub fn admin_url() -> Result<String, Skip> {
    if let Some(url) = std::env::var(URL_VAR).ok().filter(|url| !url.is_empty()) {
        return Ok(url);
    }
    throwaway_admin_url()
}

/// The admin URL of this process's throwaway cluster, started on first call,
/// whatever `TEST_POSTGRES_URL` says: for figures that must come from a known
/// server configuration (`payments-bench`), not from a developer's server.
///
/// # Errors
/// [`Skip`] when no server binaries are installed.
///
/// # Panics
/// As [`admin_url`], when the binaries exist but the cluster cannot start.
pub fn throwaway_admin_url() -> Result<String, Skip> {
    match CLUSTER.get_or_init(Cluster::start) {
        Cluster::Running { admin_url } => Ok(admin_url.clone()),
        Cluster::Unavailable(skip) => Err(skip.clone()),
        Cluster::Broken(why) => panic!("throwaway PostgreSQL could not be started: {why}"),
    }
}

/// Prints `SKIPPED postgres: <reason>` to stderr, or panics when
/// `REQUIRE_ALL_BACKENDS=1` (CI sets it so a missing backend fails loudly).
///
/// # Panics
/// When `REQUIRE_ALL_BACKENDS=1`.
pub fn skip_or_panic(skip: &Skip) {
    throwaway::skip_or_panic("postgres", "PostgreSQL", skip);
}

/// The directory holding `initdb` and `pg_ctl`: `pg_config --bindir` if that
/// directory has `initdb`, else the highest `/usr/lib/postgresql/<version>/bin`
/// with `initdb` (Debian and Ubuntu keep the server off `PATH`), else the
/// directory `initdb` on `PATH` resolves to (symlinks followed, since `pg_ctl`
/// sits beside the real file).
pub fn binaries_dir() -> Option<PathBuf> {
    from_pg_config()
        .or_else(highest_debian_bindir)
        .or_else(initdb_on_path)
}

/// A fresh, empty database for one test, dropped (with `WITH (FORCE)`, so open
/// pools do not block it) when the guard is dropped.
pub struct TestDatabase {
    /// Connection URL of this database.
    pub url: String,
    /// Database name, `payments_test_<uuid>`.
    pub name: String,
    admin_url: String,
}

impl fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestDatabase")
            .field("url", &redact(&self.url))
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Creates `payments_test_<uuid>` on the server from [`admin_url`].
///
/// # Errors
/// [`Skip`] when there is no PostgreSQL to test against (see [`admin_url`]).
///
/// # Panics
/// On real errors (a configured server that refuses connections, a failing
/// `CREATE DATABASE`): this is a test helper, and only "no backend here" is a
/// [`Skip`].
pub async fn create_database() -> Result<TestDatabase, Skip> {
    // Blocks the calling runtime thread while the cluster starts (first call
    // only); other tests wait on the `OnceLock` either way.
    let admin_url = admin_url()?;
    let name = format!("payments_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&admin_url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", redact(&admin_url)));
    // Identifiers cannot be bound as parameters; the name is ours (a uuid).
    sqlx::raw_sql(AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name} failed: {e}"));
    // Errors closing a connection we no longer need do not matter.
    let _ = admin.close().await;
    Ok(TestDatabase {
        url: with_database(&admin_url, &name),
        name,
        admin_url,
    })
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop is synchronous and usually runs inside the test's runtime,
        // where blocking on another future panics. A fresh thread has no
        // runtime, so it can build its own and block on the drop.
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let dropper = std::thread::Builder::new()
            .name(format!("drop {name}"))
            .spawn(move || drop_database(&admin_url, &name));
        if let Ok(handle) = dropper {
            // A failed drop leaves a stray database, not a wrong test result.
            let _ = handle.join();
        }
    }
}

/// Best effort: never panics, because it runs inside `Drop`.
fn drop_database(admin_url: &str, name: &str) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        let Ok(mut admin) = PgConnection::connect(admin_url).await else {
            return;
        };
        let sql = format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#);
        let _ = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut admin).await;
        let _ = admin.close().await;
    });
}

/// The outcome of starting the throwaway cluster, computed once per process.
enum Cluster {
    Running { admin_url: String },
    Unavailable(Skip),
    Broken(String),
}

impl Cluster {
    fn start() -> Self {
        let Some(bindir) = binaries_dir() else {
            return Self::Unavailable(Skip(format!(
                "{URL_VAR} is not set and no PostgreSQL server binaries were found \
                 (looked for initdb via `pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH)"
            )));
        };
        let began = Instant::now();
        match start_cluster(&bindir) {
            Ok((admin_url, dir)) => {
                eprintln!(
                    "postgres: throwaway cluster {} in {} started in {} ms",
                    admin_url,
                    dir.display(),
                    began.elapsed().as_millis()
                );
                Self::Running { admin_url }
            }
            Err(why) => Self::Broken(why),
        }
    }
}

/// Runs `initdb` and `pg_ctl start`; returns the admin URL and the temp dir.
fn start_cluster(bindir: &Path) -> Result<(String, PathBuf), String> {
    let run_as = if effective_uid_is_root() {
        Some(unprivileged_user())
    } else {
        None
    };
    let dir = make_temp_dir("payments-pg")?;
    let data = dir.join("data");
    // Spawned before anything can fail, so even a half-started cluster is
    // cleaned up when this process exits.
    spawn_watchdog(bindir, &dir, &data, run_as)?;
    if let Some(user) = run_as {
        run(Command::new("chown").arg(user).arg(&dir), "chown")?;
    }

    run(
        server_command(bindir, "initdb", run_as, &dir)
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            // The caller's LANG may name a locale that is not generated here,
            // which makes initdb fail; tests do not depend on collation.
            .arg("--no-locale"),
        &match run_as {
            // The usual cause of failure here is a TMPDIR under /root.
            Some(user) => format!("initdb (as {user}, who needs access to {})", dir.display()),
            None => "initdb".to_owned(),
        },
    )?;

    // Speed over durability, in the configuration file rather than on the
    // command line, so `ALTER SYSTEM` can turn durability back on
    // (`payments-bench` measures a durable server).
    let mut conf = std::fs::OpenOptions::new()
        .append(true)
        .open(data.join("postgresql.conf"))
        .map_err(|e| format!("opening postgresql.conf: {e}"))?;
    std::io::Write::write_all(
        &mut conf,
        b"\n# payments tests: speed over durability\nfsync = off\n\
          synchronous_commit = off\nfull_page_writes = off\n",
    )
    .map_err(|e| format!("writing postgresql.conf: {e}"))?;
    drop(conf);

    let log = dir.join("log");
    let mut failures = Vec::new();
    for _ in 0..START_ATTEMPTS {
        let port = free_port()?;
        let options = format!(
            "-k {} -p {port} -c listen_addresses=127.0.0.1 -c max_connections=300",
            shell_quote(&dir)
        );
        let started = run(
            server_command(bindir, "pg_ctl", run_as, &dir)
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-o", &options, "start"])
                // Keep the server out of the terminal's process group, so a
                // Ctrl-C reaches the watchdog's cleanup instead of the server.
                .process_group(0),
            "pg_ctl start",
        );
        match started {
            Ok(()) => {
                let admin_url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
                return Ok((admin_url, dir));
            }
            Err(why) => failures.push(format!("port {port}: {why}")),
        }
    }
    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
    Err(format!(
        "{}\nserver log ({}):\n{server_log}",
        failures.join("\n"),
        log.display()
    ))
}

/// `pg_config --bindir`, when that directory has the server (with only the
/// client library installed it does not).
fn from_pg_config() -> Option<PathBuf> {
    let output = Command::new("pg_config").arg("--bindir").output().ok()?;
    if !output.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    dir.join("initdb").is_file().then_some(dir)
}

/// The highest-versioned `/usr/lib/postgresql/<version>/bin` with `initdb`,
/// comparing versions numerically (`9.6` < `10` < `15`).
fn highest_debian_bindir() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry
                .file_name()
                .to_str()?
                .split('.')
                .map(|part| part.parse::<u32>().ok())
                .collect::<Option<Vec<u32>>>()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, bin)| bin)
}

fn initdb_on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("initdb"))
        .find(|initdb| initdb.is_file())
        .and_then(|initdb| std::fs::canonicalize(initdb).ok())
        .and_then(|initdb| initdb.parent().map(Path::to_path_buf))
}

/// The server package creates `postgres`; `nobody` exists everywhere else.
fn unprivileged_user() -> &'static str {
    let has_postgres = Command::new("id")
        .args(["-u", "postgres"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if has_postgres { "postgres" } else { "nobody" }
}

/// A PostgreSQL program, run as `user` through `runuser` when we are root.
/// It runs in `cwd` because the caller's directory may be unreadable to `user`.
fn server_command(bindir: &Path, program: &str, user: Option<&str>, cwd: &Path) -> Command {
    let program = bindir.join(program);
    let mut command = match user {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--"]).arg(program);
            command
        }
        None => Command::new(program),
    };
    command.current_dir(cwd).stdin(Stdio::null());
    command
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command.output().map_err(|e| {
        let program = Path::new(command.get_program()).display();
        format!("{what}: cannot run {program}: {e}")
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            output.status,
            both_streams(&output)
        ))
    }
}

/// Starts the process that stops the cluster and removes `dir` once this
/// test process has exited.
fn spawn_watchdog(
    bindir: &Path,
    dir: &Path,
    data: &Path,
    run_as: Option<&str>,
) -> Result<(), String> {
    let pg_ctl = shell_quote(&bindir.join("pg_ctl"));
    let stop = match run_as {
        Some(user) => format!("runuser -u {user} -- {pg_ctl}"),
        None => pg_ctl,
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done\n\
         cd / && {stop} -D {data} stop -m immediate\n\
         rm -rf {dir}\n",
        pid = std::process::id(),
        data = shell_quote(data),
        dir = shell_quote(dir),
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
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

#[cfg(test)]
mod tests {
    use super::{redact, with_database};

    #[test]
    fn with_database_replaces_only_the_path() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "t1"),
            "postgres://postgres@127.0.0.1:5432/t1"
        );
        assert_eq!(
            with_database("postgresql://u:p@[::1]:5433/db?sslmode=disable", "t1"),
            "postgresql://u:p@[::1]:5433/t1?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://localhost", "t1"),
            "postgres://localhost/t1"
        );
    }

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("postgres://u:secret@host:5432/db?x=1"),
            "postgres://u:***@host:5432/db?x=1"
        );
        assert_eq!(redact("postgres://u@host/db"), "postgres://u@host/db");
    }
}
