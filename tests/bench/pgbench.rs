//! The ceiling: `tests/bench/charge.sql` (the SQL of one new charge, as
//! `crates/store/src/sql.rs` runs it on PostgreSQL) under pgbench, on a fresh
//! migrated database of the same server, with as many clients as the `new`
//! scenario's concurrency. The API's new charges/s divided by this tps says
//! how much of the database's capacity the server's own work leaves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;

/// What pgbench measured.
#[derive(Debug, Clone, Serialize)]
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

/// pgbench beside the server binaries (`initdb`'s directory), else on `PATH`.
pub fn program() -> PathBuf {
    payments_tests::postgres::binaries_dir()
        .map(|dir| dir.join("pgbench"))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("pgbench"))
}

/// Runs the script against `url` (a libpq URI) for `seconds` with `clients`
/// clients on 2 threads; its output goes to `log`.
pub async fn run(
    script: &Path,
    url: &str,
    clients: u64,
    seconds: u64,
    log: PathBuf,
) -> Result<Pgbench> {
    let threads = clients.min(2);
    let (c, j, t) = (
        clients.to_string(),
        threads.to_string(),
        seconds.to_string(),
    );
    let mut pgbench = tokio::process::Command::new(program());
    pgbench.args(["-n", "-M", "prepared", "-f"]).arg(script);
    pgbench
        .args(["-c", &c, "-j", &j, "-T", &t, url])
        .env("PGCONNECT_TIMEOUT", "10");
    let run = pgbench.kill_on_drop(true).output();
    let within = Duration::from_secs(seconds + 120);
    let out = tokio::time::timeout(within, run)
        .await
        .context("pgbench did not finish")??;
    let output = String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned();
    std::fs::write(&log, &output).with_context(|| format!("writing {}", log.display()))?;
    if !out.status.success() {
        bail!("pgbench failed ({}):\n{output}", out.status);
    }
    let tps = field(&output, "tps = ")
        .ok_or_else(|| anyhow!("no `tps = ` line in pgbench's output:\n{output}"))
        .and_then(|tps| tps.parse::<f64>().context("pgbench's tps"))?;
    let number = |prefix| field(&output, prefix).and_then(|v| v.parse().ok());
    Ok(Pgbench {
        clients,
        threads,
        seconds,
        tps,
        latency_avg_ms: field(&output, "latency average = ").and_then(|v| v.parse().ok()),
        transactions: number("number of transactions actually processed: "),
        failed: number("number of failed transactions: "),
    })
}

/// The first word after `prefix` on the line that starts with it.
fn field<'a>(output: &'a str, prefix: &str) -> Option<&'a str> {
    output
        .lines()
        .find_map(|line| line.trim().strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next())
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn reads_pgbench_15_output() {
        let out = "number of transactions actually processed: 8672\n\
                   number of failed transactions: 0 (0.000%)\n\
                   latency average = 1.381 ms\n\
                   initial connection time = 11.278 ms\n\
                   tps = 2897.070157 (without initial connection time)\n";
        assert_eq!(field(out, "tps = "), Some("2897.070157"));
        assert_eq!(field(out, "latency average = "), Some("1.381"));
        assert_eq!(
            field(out, "number of transactions actually processed: "),
            Some("8672")
        );
        assert_eq!(field(out, "number of failed transactions: "), Some("0"));
    }
}
