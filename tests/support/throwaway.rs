//! What the throwaway PostgreSQL and MariaDB servers of the tests share:
//! running as root, temp dirs, free ports, quoting for the cleanup
//! watchdog's shell, and per-test database URLs.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

/// A URL with its password hidden, for messages.
pub(crate) fn redact(url: &str) -> String {
    payments_store::DatabaseUrl::parse(url).map_or_else(|_| url.to_owned(), |u| u.to_string())
}

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

/// Prints `SKIPPED <label>: <reason>` to stderr, or panics when
/// `REQUIRE_ALL_BACKENDS=1` (CI sets it so a missing backend fails loudly).
pub(crate) fn skip_or_panic(label: &str, name: &str, skip: &Skip) {
    if std::env::var(REQUIRE_VAR).is_ok_and(|value| value == "1") {
        panic!("{name} is unavailable but {REQUIRE_VAR}=1: {skip}");
    }
    eprintln!("SKIPPED {label}: {skip}");
}

/// `id -u` rather than `geteuid()`: the workspace forbids `unsafe` and the
/// tests do not otherwise need libc.
pub(crate) fn effective_uid_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.status.success() && out.stdout.trim_ascii() == b"0")
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

/// `<temp>/payments-pg-<pid>-<nanos>`, created fresh (never reused).
pub(crate) fn make_temp_dir(prefix: &str) -> Result<PathBuf, String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}
