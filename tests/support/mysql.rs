//! The throwaway MariaDB of the tests (see [`super::throwaway`] for what
//! every backend shares: `TEST_MYSQL_URL`, the skip, the watchdog).
//!
//! The server comes from the installed binaries ([`binaries`]):
//! `mariadb-install-db` in a temp dir, then `mariadbd` on a free port, tuned
//! for speed over durability (no redo-log flush per commit, no doublewrite,
//! no binary log). Its `root` has no password and logs in over TCP from
//! 127.0.0.1: the install is told to create the historical passwordless root
//! (`--auth-root-authentication-method=normal`) instead of the default
//! socket-only one, and readiness is checked with the same `root@127.0.0.1`
//! connection the tests use.
//!
//! The watchdog kills an install still running (it has a process group of
//! its own), sends the server SIGTERM (SIGKILL if it is still alive 5 s
//! later) and deletes the temp dir. Only pids recorded in that dir are
//! signalled, so a MariaDB the machine runs itself is never touched.
//! `mariadbd` refuses to run as root unless told `--user=root`, so a root
//! test process passes `--user=mysql` where the server package created that
//! user, with the temp dir owned by it, and `--user=root` elsewhere.

use std::fs::{File, OpenOptions};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection};

use super::throwaway::{
    Engine, Server, both_streams, cannot_run, free_port, prepare, run, shell_quote, spawn_watchdog,
    started, succeeded,
};
pub use super::throwaway::{Skip, TestDatabase};

/// The admin URL of this process's throwaway server, started on first call,
/// whatever `TEST_MYSQL_URL` says: for figures that must come from a known
/// server configuration (`payments-bench`).
///
/// # Errors
/// [`Skip`] when no server binaries are installed.
///
/// # Panics
/// When the binaries exist but the server cannot start.
pub fn throwaway_admin_url() -> Result<String, Skip> {
    Engine::Mysql.throwaway_admin_url()
}

/// Ports can be taken between probing and the server binding them.
const START_ATTEMPTS: usize = 4;
/// How long a started server may take to answer `SELECT 1`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

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

/// Starts the throwaway server (once per process, from [`Engine`]).
pub(crate) fn start() -> Server {
    let Some((install_db, server)) = binaries() else {
        return Server::Unavailable(Skip(format!(
            "no {} and {} on PATH or in {} (apt-get install mariadb-server)",
            INSTALL_DB_NAMES.join("/"),
            SERVER_NAMES.join("/"),
            EXTRA_DIRS.join(", ")
        )));
    };
    started(
        Engine::Mysql,
        Instant::now(),
        start_server(&install_db, &server),
    )
}

/// Runs the install and starts the server; returns the admin URL and the
/// temp dir.
fn start_server(install_db: &Path, server: &Path) -> Result<(String, PathBuf), String> {
    // Without a `mysql` account, root runs the server as root, which
    // `mariadbd` allows only when told so explicitly.
    let (run_as, dir, data) = prepare("payments-mysql", "mysql", "root")?;
    let pids = Pids::in_dir(&dir);
    // Spawned before anything can fail, so even a half-started server is
    // cleaned up when this process exits.
    spawn_watchdog(&pids.cleanup(&dir))?;
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
pub(crate) fn install_flags(install_db: &Path) -> Vec<&'static str> {
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

/// [`run`] in a process group of its own whose id is in `pid_file` while it
/// runs, so the watchdog can kill it with all its children: a killed test
/// process does not stop `mariadb-install-db`, and its bootstrap server
/// would go on writing into the dir the watchdog is deleting.
pub(crate) fn run_recorded(
    command: &mut Command,
    pid_file: &Path,
    what: &str,
) -> Result<(), String> {
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

/// The server log, opened for appending: every start attempt adds to it.
pub(crate) fn append(log: &Path) -> Result<File, String> {
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
    /// The watchdog's cleanup: kill an unfinished install, stop the server
    /// and remove `dir`. A SIGKILLed install needs a moment to die before its
    /// files can be deleted; the second `rm` catches a file it created meanwhile.
    fn cleanup(&self, dir: &Path) -> String {
        format!(
            "install=$(cat {install} 2>/dev/null)\n\
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
            install = shell_quote(&self.install),
            server = shell_quote(&self.server),
            spawned = shell_quote(&self.spawned),
            dir = shell_quote(dir),
        )
    }
}
