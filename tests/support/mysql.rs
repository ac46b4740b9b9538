//! A real MySQL (MariaDB) for tests, one fresh database per test.
//!
//! The store's behaviour under races (duplicate keys, deadlocks, lock waits,
//! InnoDB's gap locks) is what the payments server relies on to take money
//! exactly once, and no fake reproduces it. So tests talk to a real server, and
//! each test gets its own empty database, so tests can run in parallel without
//! seeing each other's rows.
//!
//! Where the server comes from, in order:
//! 1. `TEST_MYSQL_URL` (for example `mysql://root@127.0.0.1:3306/mysql`): an
//!    existing server, used as the admin connection. CI and developers who
//!    already run MySQL or MariaDB set it.
//! 2. Otherwise one throwaway MariaDB per test process, started on first use
//!    from the installed binaries ([`binaries`]) in a temp dir, on a free port,
//!    tuned for speed over durability (no redo-log flush per commit, no
//!    doublewrite, no binary log). It is started synchronously with
//!    `std::process::Command` behind a [`OnceLock`] rather than from async
//!    code, because every `#[tokio::test]` has its own runtime and a server
//!    owned by one runtime would die with that test.
//! 3. Neither: the backend is skipped with a reason ([`Skip`]), and
//!    [`skip_or_panic`] turns the skip into a failure when
//!    `REQUIRE_ALL_BACKENDS=1`, so CI cannot pass by silently testing nothing.
//!
//! The throwaway server's `root` has no password and logs in over TCP from
//! 127.0.0.1: `mariadb-install-db` is told to create the historical
//! passwordless root (`--auth-root-authentication-method=normal`) instead of
//! the default socket-only one, and readiness is checked with the same
//! `root@127.0.0.1` connection the tests use.
//!
//! Cleanup of the throwaway server: the Rust test harness exits without
//! running destructors of statics, so nothing in this process can stop the
//! server. Instead a detached `sh` watchdog polls `kill -0 <test pid>` once a
//! second and, when the test process is gone (finished, panicked or killed),
//! kills an install still running (it has a process group of its own), sends
//! the server SIGTERM (SIGKILL if it is still alive 5 s later) and deletes the
//! temp dir. Only pids recorded in that dir are signalled, so a MariaDB the
//! machine runs itself is never touched.
//!
//! `mariadbd` refuses to run as root unless told `--user=root`, so a root test
//! process (CI, a container) passes `--user=mysql` where the server package
//! created that user, with the temp dir owned by it, and `--user=root`
//! elsewhere.

pub use super::throwaway::Skip;
use super::throwaway::{
    self, both_streams, effective_uid_is_root, free_port, make_temp_dir, redact, shell_quote,
    with_database,
};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Connection, MySqlConnection};

/// Names an existing server to use instead of a throwaway one.
const URL_VAR: &str = "TEST_MYSQL_URL";
/// Ports can be taken between probing and the server binding them.
const START_ATTEMPTS: usize = 4;
/// How long a started server may take to answer `SELECT 1`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Bounds the work `Drop` does, so an unreachable server cannot hang a test.
const DROP_TIMEOUT: Duration = Duration::from_secs(30);

/// Binary names, current first: MariaDB 10.5 renamed the `mysql*` programs
/// and keeps the old names only as optional symlinks.
const INSTALL_DB_NAMES: [&str; 2] = ["mariadb-install-db", "mysql_install_db"];
const SERVER_NAMES: [&str; 2] = ["mariadbd", "mysqld"];
/// Searched after `PATH`: the server lives in `sbin`, which is often not on
/// `PATH`, and tarball installs live under `/usr/local/mysql`.
const EXTRA_DIRS: [&str; 4] = [
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/mysql/bin",
];

/// InnoDB settings given to both the install and the server, so the server
/// does not resize the redo log it was installed with. Durability is traded
/// for speed: a crash loses the last second of commits, and the data is
/// thrown away anyway.
const INNODB_OPTIONS: [&str; 4] = [
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=32M",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-doublewrite=0",
];
/// Server settings on top of [`INNODB_OPTIONS`]. `--skip-name-resolve` keeps
/// DNS out of every connect (and makes `root@127.0.0.1` the account that
/// matches); parallel tests each open a pool, hence the connection limit.
const SERVER_OPTIONS: [&str; 4] = [
    "--bind-address=127.0.0.1",
    "--skip-name-resolve",
    "--skip-log-bin",
    "--max-connections=500",
];

/// The throwaway server, started at most once per test process.
static SERVER: OnceLock<Server> = OnceLock::new();

/// The admin URL of the server tests use, or why MySQL is skipped.
/// Starts the throwaway server on first call (this blocks for about a second
/// on an idle machine, most of it `mariadb-install-db` creating the system
/// tables).
///
/// # Errors
/// [`Skip`] when `TEST_MYSQL_URL` is unset and no server binaries are installed.
///
/// # Panics
/// When the server binaries exist but the server cannot be started: that is
/// a broken machine, not a missing backend, and must not pass as a skip.
pub fn admin_url() -> Result<String, Skip> {
    if let Some(url) = std::env::var(URL_VAR).ok().filter(|url| !url.is_empty()) {
        return Ok(url);
    }
    match SERVER.get_or_init(Server::start) {
        Server::Running { admin_url } => Ok(admin_url.clone()),
        Server::Unavailable(skip) => Err(skip.clone()),
        Server::Broken(why) => panic!("throwaway MariaDB could not be started: {why}"),
    }
}

/// Prints `SKIPPED mysql: <reason>` to stderr, or panics when
/// `REQUIRE_ALL_BACKENDS=1` (CI sets it so a missing backend fails loudly).
///
/// # Panics
/// When `REQUIRE_ALL_BACKENDS=1`.
pub fn skip_or_panic(skip: &Skip) {
    throwaway::skip_or_panic("mysql", "MySQL", skip);
}

/// The programs that create a data directory and run the server, as
/// `(install_db, server)`: `mariadb-install-db` and `mariadbd` (else the old
/// names `mysql_install_db` and `mysqld`), each the first executable found on
/// `PATH`, then in `/usr/bin`, `/usr/sbin`, `/usr/local/bin` and
/// `/usr/local/mysql/bin`. `None` when either is missing (a client-only
/// install has neither).
pub fn binaries() -> Option<(PathBuf, PathBuf)> {
    let dirs = search_dirs();
    let install_db = find_program(&dirs, &INSTALL_DB_NAMES)?;
    let server = find_program(&dirs, &SERVER_NAMES)?;
    Some((install_db, server))
}

/// A fresh, empty database for one test (`utf8mb4`, binary collation),
/// dropped when the guard is dropped, after ending any sessions still using
/// it, like PostgreSQL's `DROP DATABASE ... WITH (FORCE)`.
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
/// [`Skip`] when there is no MySQL to test against (see [`admin_url`]).
///
/// # Panics
/// On real errors (a configured server that refuses connections, a failing
/// `CREATE DATABASE`): this is a test helper, and only "no backend here" is a
/// [`Skip`].
pub async fn create_database() -> Result<TestDatabase, Skip> {
    // Blocks the calling runtime thread while the server starts (first call
    // only); other tests wait on the `OnceLock` either way.
    let admin_url = admin_url()?;
    let name = format!("payments_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = MySqlConnection::connect(&admin_url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", redact(&admin_url)));
    // Identifiers cannot be bound as parameters; the name is ours (a uuid).
    // A binary collation compares keys byte for byte, as the other backends do.
    let sql = format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin");
    sqlx::raw_sql(AssertSqlSafe(sql))
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
        // A timeout only leaves the database behind.
        let _ = tokio::time::timeout(DROP_TIMEOUT, async {
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
            let sql = format!("DROP DATABASE IF EXISTS `{name}`");
            let _ = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut admin).await;
            let _ = admin.close().await;
        })
        .await;
    });
}

/// The outcome of starting the throwaway server, computed once per process.
enum Server {
    Running { admin_url: String },
    Unavailable(Skip),
    Broken(String),
}

impl Server {
    fn start() -> Self {
        let Some((install_db, server)) = binaries() else {
            return Self::Unavailable(Skip(format!(
                "{URL_VAR} is not set and no MariaDB server binaries were found \
                 (looked for {} and {} on PATH and in {})",
                INSTALL_DB_NAMES.join("/"),
                SERVER_NAMES.join("/"),
                EXTRA_DIRS.join(", ")
            )));
        };
        let began = Instant::now();
        match start_server(&install_db, &server) {
            Ok((admin_url, dir)) => {
                eprintln!(
                    "mysql: throwaway server {} in {} started in {} ms",
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

/// Runs the install and starts the server; returns the admin URL and the
/// temp dir.
fn start_server(install_db: &Path, server: &Path) -> Result<(String, PathBuf), String> {
    let run_as = if effective_uid_is_root() {
        Some(server_user())
    } else {
        None
    };
    let dir = make_temp_dir("payments-mysql")?;
    let data = dir.join("data");
    let pids = Pids::in_dir(&dir);
    // Spawned before anything can fail, so even a half-started server is
    // cleaned up when this process exits.
    spawn_watchdog(&dir, &pids)?;
    if let Some(user) = run_as.filter(|user| *user != "root") {
        run(Command::new("chown").arg(user).arg(&dir), "chown")?;
    }

    let mut install = Command::new(install_db);
    // `--no-defaults` must come first; it keeps the machine's `my.cnf` (its
    // datadir, socket and port) out of the throwaway server.
    install.arg("--no-defaults");
    if let Some(user) = run_as {
        install.arg(format!("--user={user}"));
    }
    // `--tmpdir`: the server would otherwise use `TMPDIR`, which need not be
    // writable by the `mysql` user.
    install
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", dir.display()))
        .args(install_flags(install_db))
        .args(INNODB_OPTIONS)
        .current_dir(&dir)
        .stdin(Stdio::null());
    run_recorded(
        &mut install,
        &pids.install,
        &match run_as {
            // The usual cause of failure here is a TMPDIR under /root.
            Some(user) if user != "root" => format!(
                "{} (as {user}, who needs access to {})",
                install_db.display(),
                dir.display()
            ),
            _ => install_db.display().to_string(),
        },
    )?;

    let log = dir.join("mysqld.log");
    let mut failures = Vec::new();
    for _ in 0..START_ATTEMPTS {
        let port = free_port()?;
        let admin_url = format!("mysql://root@127.0.0.1:{port}/mysql");
        let mut command = Command::new(server);
        command.arg("--no-defaults");
        if let Some(user) = run_as {
            command.arg(format!("--user={user}"));
        }
        command
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", dir.display()))
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", pids.server.display()))
            .arg(format!("--port={port}"))
            .args(SERVER_OPTIONS)
            .args(INNODB_OPTIONS)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(append(&log)?)
            .stderr(append(&log)?)
            // Keep the server out of the terminal's process group, so a
            // Ctrl-C reaches the watchdog's cleanup instead of the server.
            .process_group(0);
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", server.display()))?;
        // The server writes its own pid file only once it is up; until then
        // the watchdog stops it by this one. A failed write only loses that.
        let _ = std::fs::write(&pids.spawned, child.id().to_string());
        let (why, retry) = match wait_until_ready(&mut child, port, &admin_url) {
            Ok(()) => return Ok((admin_url, dir)),
            // Most likely the port was taken meanwhile: try another.
            Err(NotReady::Exited(status)) => (format!("server exited ({status})"), true),
            Err(NotReady::Failed(why)) => {
                let _ = child.kill();
                let _ = child.wait();
                (why, false)
            }
        };
        // The pid of a dead server may be reused: the watchdog must not find it.
        let _ = std::fs::remove_file(&pids.spawned);
        let _ = std::fs::remove_file(&pids.server);
        failures.push(format!("port {port}: {why}"));
        if !retry {
            break;
        }
    }
    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
    Err(format!(
        "{}\nserver log ({}):\n{server_log}",
        failures.join("\n"),
        log.display()
    ))
}

/// `--skip-name-resolve` and `--force` spare the install a DNS lookup of the
/// host name (root's grants then name IP addresses only). The other two are
/// given only when `--help` lists them: MariaDB before 10.4 has neither, and
/// there root is passwordless anyway.
fn install_flags(install_db: &Path) -> Vec<&'static str> {
    let help = Command::new(install_db)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .map(|output| both_streams(&output))
        .unwrap_or_default();
    let mut flags = vec!["--skip-name-resolve", "--force"];
    for (name, flag) in [
        (
            "--auth-root-authentication-method",
            "--auth-root-authentication-method=normal",
        ),
        ("--skip-test-db", "--skip-test-db"),
    ] {
        if help.contains(name) {
            flags.push(flag);
        }
    }
    flags
}

/// Why a spawned server did not become ready.
enum NotReady {
    /// It exited by itself, typically because its port was taken.
    Exited(ExitStatus),
    /// It is running but unusable, or the wait timed out.
    Failed(String),
}

/// Polls until `SELECT 1` works as root over TCP, the server exits, or
/// [`READY_TIMEOUT`] passes.
fn wait_until_ready(child: &mut Child, port: u16, admin_url: &str) -> Result<(), NotReady> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last_error = "no TCP connection yet".to_owned();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Err(NotReady::Exited(status)),
            Ok(None) => {}
            Err(e) => return Err(NotReady::Failed(format!("cannot watch the server: {e}"))),
        }
        // A bare TCP connect is cheap; a login needs a runtime and a thread.
        if TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok() {
            match probe(admin_url) {
                Probe::Ready => return Ok(()),
                Probe::NotYet(why) => last_error = why,
                Probe::Refused(why) => {
                    return Err(NotReady::Failed(format!(
                        "the server refused root@127.0.0.1 without a password: {why}"
                    )));
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(NotReady::Failed(format!(
                "not ready after {} s (last error: {last_error})",
                READY_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The answer to one login and `SELECT 1`.
enum Probe {
    Ready,
    /// Worth retrying: the server is still starting.
    NotYet(String),
    /// The server answered with an error (wrong account, say): retrying is
    /// pointless.
    Refused(String),
}

/// Logs in with the admin URL, as the tests will, on its own thread and
/// runtime because the caller may be inside a test's runtime.
fn probe(admin_url: &str) -> Probe {
    let admin_url = admin_url.to_owned();
    let prober = std::thread::Builder::new()
        .name("mysql probe".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => return Probe::Refused(format!("cannot build a runtime: {e}")),
            };
            runtime.block_on(async {
                let login = async {
                    let mut connection = MySqlConnection::connect(&admin_url).await?;
                    let one: i64 = sqlx::query_scalar("SELECT 1")
                        .fetch_one(&mut connection)
                        .await?;
                    let _ = connection.close().await;
                    Ok::<i64, sqlx::Error>(one)
                };
                match tokio::time::timeout(Duration::from_secs(5), login).await {
                    Ok(Ok(1)) => Probe::Ready,
                    Ok(Ok(other)) => Probe::Refused(format!("SELECT 1 returned {other}")),
                    Ok(Err(sqlx::Error::Database(e))) => Probe::Refused(e.to_string()),
                    Ok(Err(e)) => Probe::NotYet(e.to_string()),
                    Err(_) => Probe::NotYet("login timed out".to_owned()),
                }
            })
        });
    match prober {
        Ok(handle) => handle
            .join()
            .unwrap_or_else(|_| Probe::Refused("the probe panicked".to_owned())),
        Err(e) => Probe::Refused(format!("cannot start a probe thread: {e}")),
    }
}

/// `PATH`, then [`EXTRA_DIRS`].
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    dirs.extend(EXTRA_DIRS.iter().map(PathBuf::from));
    dirs
}

/// The first of `names` that is an executable file in one of `dirs`, trying
/// each name in every directory before the next name.
fn find_program(dirs: &[PathBuf], names: &[&str]) -> Option<PathBuf> {
    names.iter().find_map(|name| {
        dirs.iter().map(|dir| dir.join(name)).find(|path| {
            std::fs::metadata(path)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The server package creates `mysql`; without it a root test process runs
/// the server as root, which `mariadbd` allows only when told so explicitly.
fn server_user() -> &'static str {
    let has_mysql = Command::new("id")
        .args(["-u", "mysql"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if has_mysql { "mysql" } else { "root" }
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|e| cannot_run(command, what, &e))?;
    succeeded(&output, what)
}

/// [`run`] in a process group of its own whose id is in `pid_file` while it
/// runs, so the watchdog can kill it with all its children: a killed test
/// process does not stop `mariadb-install-db`, and its bootstrap server
/// would go on writing into the dir the watchdog is deleting.
fn run_recorded(command: &mut Command, pid_file: &Path, what: &str) -> Result<(), String> {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| cannot_run(command, what, &e))?;
    // A failed write only leaves the group running a little longer.
    let _ = std::fs::write(pid_file, child.id().to_string());
    let output = child.wait_with_output();
    // Its id may be reused once it has exited.
    let _ = std::fs::remove_file(pid_file);
    let output = output.map_err(|e| format!("{what}: cannot wait for it: {e}"))?;
    succeeded(&output, what)
}

fn cannot_run(command: &Command, what: &str, e: &std::io::Error) -> String {
    let program = Path::new(command.get_program()).display();
    format!("{what}: cannot run {program}: {e}")
}

fn succeeded(output: &Output, what: &str) -> Result<(), String> {
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            output.status,
            both_streams(output)
        ))
    }
}

/// The server log, opened for appending: every start attempt adds to it.
fn append(log: &Path) -> Result<File, String> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("cannot open {}: {e}", log.display()))
}

/// The pid files the watchdog reads, all in the temp dir.
struct Pids {
    /// Process group of a running `mariadb-install-db`, written by us.
    install: PathBuf,
    /// Written by the server once it is up.
    server: PathBuf,
    /// The server's pid, written by us as soon as it is spawned.
    spawned: PathBuf,
}

impl Pids {
    fn in_dir(dir: &Path) -> Self {
        Self {
            install: dir.join("install.pid"),
            server: dir.join("mysqld.pid"),
            spawned: dir.join("spawned.pid"),
        }
    }
}

/// Starts the process that, once this test process has exited, kills an
/// unfinished install, stops the server and removes `dir`.
fn spawn_watchdog(dir: &Path, pids: &Pids) -> Result<(), String> {
    // A SIGKILLed install needs a moment to die before its files can be
    // deleted; the second `rm` catches a file it created meanwhile.
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done\n\
         install=$(cat {install} 2>/dev/null)\n\
         case $install in\n\
         ''|*[!0-9]*) ;;\n\
         *) kill -KILL -$install 2>/dev/null; sleep 1 ;;\n\
         esac\n\
         server=$(cat {server} 2>/dev/null || cat {spawned} 2>/dev/null)\n\
         case $server in\n\
         ''|*[!0-9]*) ;;\n\
         *) kill -TERM $server 2>/dev/null\n\
            for i in 1 2 3 4 5 6 7 8 9 10; do\n\
              kill -0 $server 2>/dev/null || break\n\
              sleep 0.5\n\
            done\n\
            kill -KILL $server 2>/dev/null ;;\n\
         esac\n\
         rm -rf {dir} || {{ sleep 1; rm -rf {dir}; }}\n",
        pid = std::process::id(),
        install = shell_quote(&pids.install),
        server = shell_quote(&pids.server),
        spawned = shell_quote(&pids.spawned),
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
            with_database("mysql://root@127.0.0.1:3306/mysql", "t1"),
            "mysql://root@127.0.0.1:3306/t1"
        );
        assert_eq!(
            with_database("mysql://u:p@[::1]:3307/db?ssl-mode=disabled", "t1"),
            "mysql://u:p@[::1]:3307/t1?ssl-mode=disabled"
        );
        assert_eq!(
            with_database("mysql://localhost", "t1"),
            "mysql://localhost/t1"
        );
    }

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("mysql://u:secret@host:3306/db?x=1"),
            "mysql://u:***@host:3306/db?x=1"
        );
        assert_eq!(redact("mysql://u@host/db"), "mysql://u@host/db");
    }
}
