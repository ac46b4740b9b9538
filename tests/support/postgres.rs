//! The throwaway PostgreSQL cluster of the tests (see [`super::throwaway`]
//! for what every backend shares: `TEST_POSTGRES_URL`, the skip, the
//! watchdog).
//!
//! The cluster comes from the installed server binaries ([`binaries_dir`]):
//! `initdb` in a temp dir, then `pg_ctl start` on a free port with
//! `fsync=off`. `initdb` and `pg_ctl` refuse to run as root, so a root test
//! process runs them through `runuser -u postgres --` (or `nobody` where the
//! server package did not create a `postgres` user). The watchdog stops it
//! with `pg_ctl stop -m immediate`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::throwaway::{
    Engine, Server, free_port, prepare, run, shell_quote, spawn_watchdog, started,
};
pub use super::throwaway::{Skip, TestDatabase};

/// Ports can be taken between probing and the server binding them.
const START_ATTEMPTS: usize = 4;

/// The admin URL of this process's throwaway cluster, started on first call,
/// whatever `TEST_POSTGRES_URL` says: for figures that must come from a known
/// server configuration (`payments-bench`), not from a developer's server.
///
/// # Errors
/// [`Skip`] when no server binaries are installed.
///
/// # Panics
/// When the binaries exist but the cluster cannot start.
pub fn throwaway_admin_url() -> Result<String, Skip> {
    Engine::Postgres.throwaway_admin_url()
}

/// Starts the throwaway cluster (once per process, from [`Engine`]).
pub(crate) fn start() -> Server {
    let Some(bindir) = binaries_dir() else {
        return Server::Unavailable(Skip(
            "no initdb found via `pg_config --bindir`, /usr/lib/postgresql/*/bin or PATH \
             (apt-get install postgresql)"
                .into(),
        ));
    };
    started(Engine::Postgres, Instant::now(), start_cluster(&bindir))
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

/// Runs `initdb` and `pg_ctl start`; returns the admin URL and the temp dir.
fn start_cluster(bindir: &Path) -> Result<(String, PathBuf), String> {
    // The server package creates `postgres`; `nobody` exists everywhere else.
    let (run_as, dir, data) = prepare("payments-pg", "postgres", "nobody")?;
    // Spawned before anything can fail, so even a half-started cluster is
    // cleaned up when this process exits.
    let pg_ctl = shell_quote(&bindir.join("pg_ctl"));
    let stop = match run_as {
        Some(user) => format!("runuser -u {user} -- {pg_ctl}"),
        None => pg_ctl,
    };
    let (data_q, dir_q) = (shell_quote(&data), shell_quote(&dir));
    spawn_watchdog(&format!(
        "cd / && {stop} -D {data_q} stop -m immediate\nrm -rf {dir_q}\n"
    ))?;
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
