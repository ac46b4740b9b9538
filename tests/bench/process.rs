//! The bench's child processes: the release binaries beside this one
//! (`payments-sandbox`, `payments-api`, `payments-jobs`) and pgbench.
//!
//! Every child is a [`Child`] guard that kills it when dropped, so every exit
//! path (an error, a panic, Ctrl-C handled in `main`) leaves nothing running.
//! Children get a clean environment (`PATH`, `RUST_LOG` and what the caller
//! passes), so a developer's `DATABASE_URL` or `GATEWAY_URL` cannot leak in,
//! and write stdout and stderr to a log file the caller names.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long a server may take to print its "listening on" line.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The directory of this executable: `target/release` under `make bench`,
/// where `cargo build --release --workspace --bins` put the other binaries.
pub fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating payments-bench")?;
    exe.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("{} has no parent directory", exe.display()))
}

/// A workspace binary beside this one, which must exist.
pub fn workspace_binary(name: &str) -> Result<PathBuf> {
    let path = bin_dir()?.join(name);
    if !path.is_file() {
        bail!(
            "{} is missing: build the release binaries first \
             (`cargo build --release --workspace --bins`; `make bench` does)",
            path.display()
        );
    }
    Ok(path)
}

/// A running child process, killed when dropped.
#[derive(Debug)]
pub struct Child {
    name: String,
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
    /// What a server printed on its `<name> listening on <url>` line.
    pub url: String,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct Command {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
}

impl Command {
    /// `program`, logging stdout and stderr to `log` (truncated).
    pub fn new(name: &str, program: PathBuf, log: PathBuf) -> Self {
        Self {
            name: name.to_owned(),
            program,
            args: Vec::new(),
            env: Vec::new(),
            log,
        }
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    fn build(&self, stdout: Stdio) -> Result<tokio::process::Command> {
        std::fs::File::create(&self.log)
            .with_context(|| format!("creating {}", self.log.display()))?;
        let log = self.append_to_log()?;
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            // Plain logs: they are read back (pool timeouts, the pruner's pass).
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .kill_on_drop(true);
        for (key, value) in &self.env {
            command.env(key, value);
        }
        Ok(command)
    }

    /// A handle on the log in append mode, so stdout and stderr never write
    /// over each other.
    fn append_to_log(&self) -> Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))
    }

    /// Starts a server and waits for its `<name> listening on <url>` line.
    pub async fn serve(self) -> Result<Child> {
        let mut command = self.build(Stdio::piped())?;
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("{}: no stdout pipe", self.name))?;
        let mut child = Child::new(&self, child)?;
        let mut lines = BufReader::new(stdout).lines();
        let prefix = format!("{} listening on ", self.name);
        let found = tokio::time::timeout(START_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix(&prefix) {
                    return Some(url.trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let Some(url) = found else {
            let status = child.child.try_wait().ok().flatten();
            bail!(
                "{} did not start (exit status: {}); its log {}:\n{}",
                self.name,
                status.map_or_else(|| "still running".to_owned(), |s| s.to_string()),
                self.log.display(),
                tail(&child.log(), 40)
            );
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        child.url = url;
        Ok(child)
    }

    /// Starts a program whose stdout also goes to the log.
    pub fn spawn(self) -> Result<Child> {
        let mut command = self.build(Stdio::null())?;
        command.stdout(self.append_to_log()?);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))?;
        Child::new(&self, child)
    }

    /// Runs a program to completion within `within`; fails on a non-zero
    /// exit, with the log's tail.
    pub async fn run(self, within: Duration) -> Result<String> {
        let name = self.name.clone();
        let mut child = self.spawn()?;
        let status = child.wait(within).await?;
        let log = child.log();
        if !status.success() {
            bail!("{name} failed ({status}):\n{}", tail(&log, 40));
        }
        Ok(log)
    }
}

impl Child {
    fn new(command: &Command, child: tokio::process::Child) -> Result<Self> {
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("{} exited at once", command.name))?;
        Ok(Self {
            name: command.name.clone(),
            child,
            pid,
            log: command.log.clone(),
            url: String::new(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Everything the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `within` for the exit status; kills the process if it
    /// takes longer.
    pub async fn wait(&mut self, within: Duration) -> Result<ExitStatus> {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.with_context(|| format!("waiting for {}", self.name)),
            Err(_) => {
                let _ = self.child.kill().await;
                bail!(
                    "{} did not finish within {}; killed",
                    self.name,
                    humantime::format_duration(within)
                )
            }
        }
    }

    /// Kills the process (SIGKILL) and reaps it; an error if it had already
    /// exited, since a server is not supposed to.
    pub async fn stop(mut self) -> Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!(
                "{} had exited on its own ({status}); log tail:\n{}",
                self.name,
                tail(&self.log(), 40)
            );
        }
        self.child
            .kill()
            .await
            .with_context(|| format!("stopping {}", self.name))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Best effort: the process may be gone already.
        let _ = self.child.start_kill();
    }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A field of `/proc/<pid>/status` in kB (`VmRSS`, `VmHWM`).
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}
