//! The production PostgreSQL stack, throwaway, on loopback: one `etcd`
//! member, two PostgreSQL nodes managed by Patroni with synchronous
//! replication, and HAProxy sending one address to whichever node Patroni
//! says is the primary (`docs/scaling.md`). [`Patroni::start_with`]
//! [`Replication::Asynchronous`] starts the same stack with
//! `synchronous_mode: false`, for the test that shows what asynchronous
//! replication loses.
//!
//! The settings are two templates beside this file, `patroni.yml` and
//! `haproxy.cfg`, with a comment on each choice. Node 1 bootstraps and
//! becomes the leader; node 2 clones it and becomes the synchronous (or
//! asynchronous) standby. The stack is ready when the cluster shows a
//! leader and that standby and HAProxy's address has led to the primary
//! ten times in a row (HAProxy counts a server up until its first check
//! fails).
//!
//! Patroni and PostgreSQL refuse to run as root: a root test process runs
//! Patroni as `postgres` (by uid and gid, so the pid is Patroni's own).
//! Cleanup is the throwaway servers' watchdog: Patroni, every postmaster
//! (by `postmaster.pid`), a WAL sender stopped by
//! [`Patroni::stop_wal_sender`], etcd and HAProxy are killed and the dir
//! deleted.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

use super::mysql::append;
use super::throwaway::{Skip, free_port, prepare, run, shell_quote, spawn_watchdog};

const PATRONI_TEMPLATE: &str = include_str!("patroni.yml");
const HAPROXY_TEMPLATE: &str = include_str!("haproxy.cfg");
/// How long the stack may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// One PostgreSQL node and its Patroni.
#[derive(Debug)]
pub struct PgNode {
    pub name: String,
    pub pg_port: u16,
    pub rest_port: u16,
    dir: PathBuf,
    patroni: Mutex<Option<Child>>,
}

impl PgNode {
    /// The node's own PostgreSQL, not through HAProxy.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.pg_port)
    }

    /// What its Patroni (and PostgreSQL, through it) logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("patroni.log")).unwrap_or_default()
    }

    /// The HTTP status of `GET path` on this node's Patroni REST API.
    pub fn rest_status(&self, path: &str) -> Option<u16> {
        http_get(self.rest_port, path).map(|(status, _)| status)
    }
}

/// How the primary ships its commits to the standby (Patroni's
/// `synchronous_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_mode: true`: a commit returns once the standby has
    /// flushed it, and only that standby is promoted. The tested setting.
    Synchronous,
    /// `synchronous_mode: false`: a commit returns at once; the standby
    /// may be promoted without the last acknowledged commits.
    Asynchronous,
}

impl Replication {
    /// The Patroni REST path that answers 200 on this mode's standby.
    fn standby_path(self) -> &'static str {
        match self {
            Replication::Synchronous => "/sync",
            Replication::Asynchronous => "/async",
        }
    }

    fn standby(self) -> &'static str {
        match self {
            Replication::Synchronous => "sync standby",
            Replication::Asynchronous => "async standby",
        }
    }
}

/// A running stack.
#[derive(Debug)]
pub struct Patroni {
    /// HAProxy's address: the primary's `postgres` database.
    pub url: String,
    pub nodes: Vec<PgNode>,
    pub replication: Replication,
    user: Option<(u32, u32)>,
}

impl Patroni {
    /// Starts etcd, the two nodes (synchronous replication) and HAProxy.
    ///
    /// # Panics
    /// When the programs exist but the stack cannot be started.
    pub fn start() -> Result<Patroni, Skip> {
        Self::start_with(Replication::Synchronous)
    }

    /// [`Patroni::start`] with the replication mode given.
    ///
    /// # Panics
    /// When the programs exist but the stack cannot be started.
    pub fn start_with(replication: Replication) -> Result<Patroni, Skip> {
        let programs = programs()?;
        let began = Instant::now();
        match Self::try_start(&programs, replication) {
            Ok(stack) => {
                eprintln!(
                    "patroni: throwaway stack ({}) behind {} started in {} ms",
                    replication.standby(),
                    stack.url,
                    began.elapsed().as_millis()
                );
                Ok(stack)
            }
            Err(why) => panic!("the throwaway Patroni stack failed to start:\n{why}"),
        }
    }

    fn try_start(bin_dir: &Path, replication: Replication) -> Result<Patroni, String> {
        let (run_as, dir, _) = prepare("payments-patroni", "postgres", "nobody")?;
        spawn_watchdog(&cleanup(&dir))?;
        let user = match run_as {
            Some(user) => Some((id(user, "-u")?, id(user, "-g")?)),
            None => None,
        };
        if let Some(user) = run_as {
            run(Command::new("chown").arg(user).arg(&dir), "chown")?;
        }
        let (etcd_port, etcd_peer, haproxy_port) = (free_port()?, free_port()?, free_port()?);
        let etcd_dir = dir.join("etcd");
        let log = dir.join("etcd.log");
        let etcd = Command::new("etcd")
            .args(["--name", "etcd", "--data-dir"])
            .arg(&etcd_dir)
            .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"
            ))
            .arg(format!(
                "--initial-cluster=etcd=http://127.0.0.1:{etcd_peer}"
            ))
            .stdin(Stdio::null())
            .stdout(append(&log)?)
            .stderr(append(&log)?)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot run etcd: {e}"))?;
        let _ = std::fs::write(dir.join("etcd.pid"), etcd.id().to_string());
        wait_until("etcd answers", Duration::from_secs(30), || {
            http_get(etcd_port, "/health").is_some_and(|(status, _)| status == 200)
        })?;

        let mut nodes = Vec::new();
        for i in 1..=2 {
            let (pg_port, rest_port) = (free_port()?, free_port()?);
            let name = format!("node{i}");
            let node_dir = dir.join(&name);
            std::fs::create_dir(&node_dir)
                .map_err(|e| format!("cannot create {}: {e}", node_dir.display()))?;
            let config = PATRONI_TEMPLATE
                .replace("@NAME@", &name)
                .replace(
                    "@SYNCHRONOUS_MODE@",
                    match replication {
                        Replication::Synchronous => "true",
                        Replication::Asynchronous => "false",
                    },
                )
                .replace("@REST_PORT@", &rest_port.to_string())
                .replace("@PG_PORT@", &pg_port.to_string())
                .replace("@ETCD_PORT@", &etcd_port.to_string())
                .replace("@DIR@", &node_dir.display().to_string())
                .replace("@BIN_DIR@", &bin_dir.display().to_string());
            std::fs::write(node_dir.join("patroni.yml"), config)
                .map_err(|e| format!("cannot write patroni.yml: {e}"))?;
            if let Some(user) = run_as {
                run(
                    Command::new("chown").args(["-R", user]).arg(&node_dir),
                    "chown",
                )?;
            }
            nodes.push(PgNode {
                name,
                pg_port,
                rest_port,
                dir: node_dir,
                patroni: Mutex::new(None),
            });
        }
        let stack = Patroni {
            url: format!("postgres://postgres@127.0.0.1:{haproxy_port}/postgres"),
            nodes,
            replication,
            user,
        };
        // Node 1 first, so that it is the leader.
        stack.spawn(0)?;
        wait_until("node 1 leads", START_TIMEOUT, || {
            stack.nodes[0].rest_status("/primary") == Some(200)
        })?;
        stack.spawn(1)?;
        let standby = format!("node 2 is the {}", replication.standby());
        wait_until(&standby, START_TIMEOUT, || {
            stack.nodes[1].rest_status(replication.standby_path()) == Some(200)
        })?;

        let servers: String = stack
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "    server {} 127.0.0.1:{} check port {}\n",
                    n.name, n.pg_port, n.rest_port
                )
            })
            .collect();
        let config = HAPROXY_TEMPLATE
            .replace("@DIR@", &dir.display().to_string())
            .replace("@PORT@", &haproxy_port.to_string())
            .replace("@SERVERS@", &servers);
        std::fs::write(dir.join("haproxy.cfg"), config)
            .map_err(|e| format!("cannot write haproxy.cfg: {e}"))?;
        // `-D`: HAProxy daemonises and writes its pid file.
        run(
            Command::new("haproxy")
                .arg("-D")
                .arg("-f")
                .arg(dir.join("haproxy.cfg")),
            "haproxy",
        )?;
        let mut in_a_row = 0;
        wait_until("HAProxy leads to the primary", START_TIMEOUT, || {
            in_a_row = if blocking_is_primary(&stack.url) {
                in_a_row + 1
            } else {
                0
            };
            in_a_row >= 10
        })?;
        Ok(stack)
    }

    /// Starts node `n`'s Patroni (which starts its PostgreSQL).
    fn spawn(&self, n: usize) -> Result<(), String> {
        let node = &self.nodes[n];
        let log = node.dir.join("patroni.log");
        let mut command = Command::new("patroni");
        command
            .arg(node.dir.join("patroni.yml"))
            .env("HOME", &node.dir)
            .current_dir(&node.dir)
            .stdin(Stdio::null())
            .stdout(append(&log)?)
            .stderr(append(&log)?)
            .process_group(0);
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot run patroni: {e}"))?;
        let _ = std::fs::write(node.dir.join("patroni.pid"), child.id().to_string());
        *node.patroni.lock().expect("node lock") = Some(child);
        Ok(())
    }

    /// The node whose Patroni holds the leader lock, if one does.
    pub fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.rest_status("/primary") == Some(200))
    }

    /// Kills node `n` as a machine dies: its Patroni and its PostgreSQL
    /// with SIGKILL (PostgreSQL alone would be restarted in place by
    /// Patroni, not failed over), and a WAL sender of its stopped by
    /// [`Patroni::stop_wal_sender`] (it outlives its postmaster, and its
    /// socket and shared memory with it).
    pub fn kill_node(&self, n: usize) {
        let node = &self.nodes[n];
        let stopped = node.dir.join(STOPPED_PID);
        if let Ok(pid) = std::fs::read_to_string(&stopped) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            let _ = std::fs::remove_file(&stopped);
        }
        if let Some(mut child) = node.patroni.lock().expect("node lock").take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let pid_file = node.dir.join("data/postmaster.pid");
        if let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|text| text.lines().next().map(str::to_owned))
        {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    }

    /// Starts node `n` again: it rejoins as a standby (rewound by
    /// `pg_rewind` if it diverged). Waits until it is the sync standby (the
    /// async one under [`Replication::Asynchronous`]) and the leader streams
    /// to it (Patroni calls a running replica async before it streams).
    pub async fn rejoin(&'static self, n: usize) -> Result<Duration, String> {
        tokio::task::spawn_blocking(move || {
            let began = Instant::now();
            self.spawn(n)?;
            let path = self.replication.standby_path();
            let rejoined = format!("the node rejoins as {}", self.replication.standby());
            wait_until(&rejoined, START_TIMEOUT, || {
                self.nodes[n].rest_status(path) == Some(200)
            })?;
            let node = &self.nodes[n];
            let streams = format!("the leader streams to {}", node.name);
            wait_until(&streams, START_TIMEOUT, || {
                let leader = self.leader().map(|l| self.nodes[l].url("postgres"));
                leader.is_some_and(|url| blocking_streams_to(&url, &node.name))
            })?;
            Ok(began.elapsed())
        })
        .await
        .map_err(|e| format!("rejoin: {e}"))?
    }

    /// Waits for a leader other than `old`; its index.
    pub async fn new_leader(&'static self, old: usize) -> Result<usize, String> {
        tokio::task::spawn_blocking(move || {
            let mut leader = None;
            wait_until("a new leader", START_TIMEOUT, || {
                leader = self.leader().filter(|l| *l != old);
                leader.is_some()
            })?;
            leader.ok_or_else(|| "no leader".to_owned())
        })
        .await
        .map_err(|e| format!("new leader: {e}"))?
    }
}

impl Patroni {
    /// Stops the primary (node `n`) shipping WAL: its one WAL sender,
    /// once streaming, is stopped with SIGSTOP. The primary goes on
    /// committing (with asynchronous replication, acknowledging too); from
    /// here on its commits exist on its own disk only, and a standby
    /// promoted after its death lacks every one of them. The sender stays
    /// stopped until [`Patroni::kill_node`] kills it. Its pid.
    pub async fn stop_wal_sender(&self, n: usize) -> Result<u32, String> {
        let node = &self.nodes[n];
        let url = node.url("postgres");
        let deadline = Instant::now() + Duration::from_secs(30);
        let pid = loop {
            let mut conn = PgConnection::connect(&url)
                .await
                .map_err(|e| format!("connect to {}: {e}", node.name))?;
            let pids: Vec<i32> =
                sqlx::query_scalar("SELECT pid FROM pg_stat_replication WHERE state = 'streaming'")
                    .fetch_all(&mut conn)
                    .await
                    .map_err(|e| format!("pg_stat_replication: {e}"))?;
            let _ = conn.close().await;
            match pids[..] {
                [pid] => break pid,
                _ if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                _ => return Err(format!("{} streams to {} standbys", node.name, pids.len())),
            }
        };
        let pid = u32::try_from(pid).map_err(|e| format!("pid {pid}: {e}"))?;
        // Written first: the watchdog kills it if the test dies meanwhile.
        std::fs::write(node.dir.join(STOPPED_PID), pid.to_string())
            .map_err(|e| format!("cannot write {STOPPED_PID}: {e}"))?;
        let stopped = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status();
        match stopped {
            Ok(status) if status.success() => Ok(pid),
            outcome => Err(format!("kill -STOP {pid}: {outcome:?}")),
        }
    }
}

/// In a node's dir: the pid of its WAL sender stopped by
/// [`Patroni::stop_wal_sender`].
const STOPPED_PID: &str = "walsender-stopped.pid";

/// The timeline the primary at `url` writes WAL on (the first eight hex
/// digits of its current WAL file's name; `pg_control_checkpoint()` would
/// show the new timeline only after the next checkpoint).
pub async fn timeline(url: &str) -> Result<i64, sqlx::Error> {
    let mut conn = PgConnection::connect(url).await?;
    let timeline = sqlx::query_scalar(
        "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8",
    )
    .fetch_one(&mut conn)
    .await;
    let _ = conn.close().await;
    timeline
}

/// PostgreSQL's server programs, and `patroni`, `etcd`, `haproxy`, or why not.
fn programs() -> Result<PathBuf, Skip> {
    let bin_dir = super::postgres::binaries_dir()
        .ok_or_else(|| Skip("no PostgreSQL server binaries (apt-get install postgresql)".into()))?;
    for program in ["patroni", "etcd", "haproxy"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {program}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Err(Skip(format!(
                "no {program} (apt-get install patroni etcd-server haproxy)"
            )));
        }
    }
    Ok(bin_dir)
}

/// `id -u user` or `id -g user`.
fn id(user: &str, flag: &str) -> Result<u32, String> {
    let output = Command::new("id")
        .args([flag, user])
        .output()
        .map_err(|e| format!("id {flag} {user}: {e}"))?;
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("id {flag} {user}: {e}"))
}

/// The watchdog's cleanup: HAProxy, each Patroni, stopped WAL sender and
/// postmaster, etcd, then anything still running in the dir, then the dir.
fn cleanup(dir: &Path) -> String {
    let dir = shell_quote(dir);
    format!(
        "for f in {dir}/haproxy.pid {dir}/node*/patroni.pid {dir}/node*/{STOPPED_PID} {dir}/etcd.pid; do\n\
           pid=$(cat \"$f\" 2>/dev/null)\n\
           case $pid in ''|*[!0-9]*) ;; *) kill -KILL $pid 2>/dev/null ;; esac\n\
         done\n\
         for f in {dir}/node*/data/postmaster.pid; do\n\
           pid=$(head -1 \"$f\" 2>/dev/null)\n\
           case $pid in ''|*[!0-9]*) ;; *) kill -KILL $pid 2>/dev/null ;; esac\n\
         done\n\
         sleep 1\n\
         pkill -KILL -f {dir}/ 2>/dev/null\n\
         rm -rf {dir} || {{ sleep 1; rm -rf {dir}; }}\n"
    )
}

/// Polls `done` every 200 ms until it holds or `within` passes.
fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() >= deadline {
            return Err(format!("{what}: not after {} s", within.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// `GET path` on 127.0.0.1:`port` over HTTP/1.0: the status and the body.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// Whether `url` leads to a primary (`pg_is_in_recovery()` is false), on a
/// runtime of its own: the harness is synchronous.
fn blocking_is_primary(url: &str) -> bool {
    blocking_check(url, "SELECT NOT pg_is_in_recovery()", None)
}

/// Whether the primary at `url` streams WAL to the standby `name`.
fn blocking_streams_to(url: &str, name: &str) -> bool {
    let sql = "SELECT EXISTS (SELECT 1 FROM pg_stat_replication \
               WHERE application_name = $1 AND state = 'streaming')";
    blocking_check(url, sql, Some(name))
}

/// Whether the one-boolean query `sql` (binding `arg` if given) answers
/// true at `url`, within 3 s, on a runtime of its own.
fn blocking_check(url: &str, sql: &'static str, arg: Option<&str>) -> bool {
    let (url, arg) = (url.to_owned(), arg.map(str::to_owned));
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return false;
        };
        runtime.block_on(async {
            let check = async {
                let mut conn = PgConnection::connect(&url).await?;
                let mut query = sqlx::query_scalar::<_, bool>(sql);
                if let Some(arg) = &arg {
                    query = query.bind(arg);
                }
                let answer = query.fetch_one(&mut conn).await?;
                let _ = conn.close().await;
                Ok::<bool, sqlx::Error>(answer)
            };
            matches!(
                tokio::time::timeout(Duration::from_secs(3), check).await,
                Ok(Ok(true))
            )
        })
    })
    .join()
    .unwrap_or(false)
}
