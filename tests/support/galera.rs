//! A throwaway three-node MariaDB Galera cluster on loopback, for the
//! cluster tests (`docs/scaling.md`).
//!
//! Every node has its own temp dir (datadir, socket, pid file, error log)
//! and four loopback ports: client, group (`gmcast.listen_addr`), IST and
//! SST. The settings are one template, `galera.cnf` beside this file, with a
//! comment per line. Node 1 is installed by `mariadb-install-db` and
//! bootstraps the cluster (`--wsrep-new-cluster`); nodes 2 and 3 start from
//! a copy of its fresh datadir, join, and receive a full state transfer
//! (rsync). The cluster is ready when every node says `wsrep_cluster_size =
//! 3`, `wsrep_ready = ON` and `Synced`.
//!
//! [`Galera::shared`] is one cluster per test process (the suite's);
//! [`Galera::start`] a cluster of the caller's own, for a test that kills
//! nodes. `TEST_GALERA_URLS` (three admin URLs, comma-separated) names an
//! existing cluster for the shared one instead. Without the binaries
//! (`mariadbd`, the Galera library, `rsync`) the tests are skipped, and fail
//! under `REQUIRE_ALL_BACKENDS=1`, as for the single servers.
//!
//! Cleanup is the single servers' watchdog: when the test process is gone,
//! every node's pid (and any rsync daemon under the dir) is killed and the
//! dir deleted.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection, Row};

use super::mysql::{append, binaries, install_flags, run_recorded};
use super::throwaway::{Skip, free_port, prepare, run, shell_quote, spawn_watchdog};

/// The node template (placeholders `@NAME@`).
const TEMPLATE: &str = include_str!("galera.cnf");
/// Where Debian's `galera-4` (and other distributions') put the library.
const PROVIDERS: [&str; 4] = [
    "/usr/lib/galera/libgalera_smm.so",
    "/usr/lib/galera-4/libgalera_smm.so",
    "/usr/lib64/galera-4/libgalera_smm.so",
    "/usr/lib/libgalera_smm.so",
];
/// Nodes in a cluster.
pub const NODES: usize = 3;
/// How long a node may take to be `Synced` (a joiner's full state transfer
/// included).
const SYNC_TIMEOUT: Duration = Duration::from_secs(120);
/// Starts tried: ports can be taken between probing and binding.
const START_ATTEMPTS: usize = 3;

/// One node: its ports, its dir and its running server.
#[derive(Debug)]
pub struct Node {
    pub port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

impl Node {
    /// `mysql://root@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }
}

/// A running cluster (or an existing one, from `TEST_GALERA_URLS`, which
/// cannot be killed or restarted).
#[derive(Debug)]
pub struct Galera {
    /// Each node's admin URL.
    pub urls: Vec<String>,
    nodes: Vec<Node>,
    server: PathBuf,
}

impl Galera {
    /// The suite's cluster, started on the first call (15-40 s).
    ///
    /// # Panics
    /// When the binaries exist but the cluster cannot be started.
    pub fn shared() -> Result<&'static Galera, Skip> {
        static SHARED: OnceLock<Result<Galera, Skip>> = OnceLock::new();
        SHARED
            .get_or_init(|| match std::env::var("TEST_GALERA_URLS") {
                Ok(urls) if !urls.is_empty() => Ok(Galera {
                    urls: urls.split(',').map(str::to_owned).collect(),
                    nodes: Vec::new(),
                    server: PathBuf::new(),
                }),
                _ => Self::start(),
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// A new cluster of the caller's own.
    ///
    /// # Panics
    /// When the binaries exist but the cluster cannot be started.
    pub fn start() -> Result<Galera, Skip> {
        let (install_db, server, provider) = programs()?;
        let began = Instant::now();
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&install_db, &server, &provider) {
                Ok(cluster) => {
                    eprintln!(
                        "galera: throwaway cluster on ports {:?} started in {} ms",
                        cluster.nodes.iter().map(|n| n.port).collect::<Vec<_>>(),
                        began.elapsed().as_millis()
                    );
                    return Ok(cluster);
                }
                Err(why) => failures.push(why),
            }
        }
        panic!(
            "the throwaway Galera cluster failed to start:\n{}",
            failures.join("\n---\n")
        );
    }

    fn try_start(install_db: &Path, server: &Path, provider: &Path) -> Result<Galera, String> {
        let (run_as, dir, _) = prepare("payments-galera", "mysql", "root")?;
        spawn_watchdog(&cleanup(&dir))?;
        // Root runs the nodes as `mysql` (rsync state transfer runs its
        // daemon as the server's user, who must own the datadir); anyone
        // else runs them as themselves.
        let user = match run_as {
            Some(user) => user.to_owned(),
            None => whoami()?,
        };
        let user = user.as_str();
        let ports: Vec<[u16; 4]> = (0..NODES)
            .map(|_| Ok([free_port()?, free_port()?, free_port()?, free_port()?]))
            .collect::<Result<_, String>>()?;
        let peers = ports
            .iter()
            .map(|p| format!("127.0.0.1:{}", p[1]))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for (i, [port, group, ist, sst]) in ports.iter().enumerate() {
            let node_dir = dir.join(format!("node{}", i + 1));
            std::fs::create_dir_all(node_dir.join("tmp"))
                .map_err(|e| format!("cannot create {}: {e}", node_dir.display()))?;
            let config = TEMPLATE
                .replace("@USER@", user)
                .replace("@DIR@", &node_dir.display().to_string())
                .replace("@PORT@", &port.to_string())
                .replace("@GROUP_PORT@", &group.to_string())
                .replace("@IST_PORT@", &ist.to_string())
                .replace("@SST_PORT@", &sst.to_string())
                .replace("@PEERS@", &peers)
                .replace("@PROVIDER@", &provider.display().to_string())
                .replace("@N@", &(i + 1).to_string());
            std::fs::write(node_dir.join("node.cnf"), config)
                .map_err(|e| format!("cannot write node.cnf: {e}"))?;
            nodes.push(Node {
                port: *port,
                dir: node_dir,
                child: Mutex::new(None),
            });
        }
        // One install; the joiners start from copies and are overwritten
        // by their state transfer.
        let first = &nodes[0].dir;
        let mut install = Command::new(install_db);
        install
            .arg("--no-defaults")
            .arg(format!("--user={user}"))
            .arg(format!("--datadir={}", first.join("data").display()))
            .arg(format!("--tmpdir={}", first.join("tmp").display()))
            .args(install_flags(install_db))
            .args([
                "--innodb-log-file-size=32M",
                "--innodb-buffer-pool-size=64M",
            ])
            .current_dir(first)
            .stdin(Stdio::null());
        if run_as.is_some() {
            run(Command::new("chown").arg("-R").arg(user).arg(&dir), "chown")?;
        }
        run_recorded(&mut install, &dir.join("install.pid"), "mariadb-install-db")?;
        for node in &nodes[1..] {
            run(
                Command::new("cp")
                    .arg("-a")
                    .arg(first.join("data"))
                    .arg(node.dir.join("data")),
                "copy the datadir",
            )?;
        }
        let cluster = Galera {
            urls: nodes.iter().map(|n| n.url("mysql")).collect(),
            nodes,
            server: server.to_owned(),
        };
        cluster.spawn(0, true)?;
        cluster.wait_synced(0, 1)?;
        // One joiner at a time: a second joiner would wait for a donor anyway.
        for n in 1..NODES {
            cluster.spawn(n, false)?;
            cluster.wait_synced(n, n + 1)?;
        }
        Ok(cluster)
    }

    /// Starts node `n` (0-based), bootstrapping a new cluster or joining.
    fn spawn(&self, n: usize, bootstrap: bool) -> Result<(), String> {
        let node = &self.nodes[n];
        let log = node.dir.join("stdout.log");
        let mut command = Command::new(&self.server);
        command.arg(format!(
            "--defaults-file={}",
            node.dir.join("node.cnf").display()
        ));
        if bootstrap {
            command.arg("--wsrep-new-cluster");
        }
        command
            .current_dir(&node.dir)
            .stdin(Stdio::null())
            .stdout(append(&log)?)
            .stderr(append(&log)?)
            .process_group(0);
        let child = command
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.server.display()))?;
        // For the watchdog, until the server writes its own pid file.
        let _ = std::fs::write(node.dir.join("spawned.pid"), child.id().to_string());
        *node.child.lock().expect("node lock") = Some(child);
        Ok(())
    }

    /// Waits until node `n` is `Synced`, ready, in a cluster of `size`.
    fn wait_synced(&self, n: usize, size: usize) -> Result<(), String> {
        let node = &self.nodes[n];
        let deadline = Instant::now() + SYNC_TIMEOUT;
        let mut last;
        loop {
            if let Some(child) = node.child.lock().expect("node lock").as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "node {} exited ({status}); its error log:\n{}",
                    n + 1,
                    tail(&node.dir.join("error.log"))
                ));
            }
            match blocking(status(self.urls[n].clone())) {
                Ok(s) => {
                    let synced = s.get("wsrep_cluster_size").map(String::as_str)
                        == Some(&size.to_string())
                        && s.get("wsrep_ready").map(String::as_str) == Some("ON")
                        && s.get("wsrep_local_state_comment").map(String::as_str) == Some("Synced");
                    if synced {
                        return Ok(());
                    }
                    last = format!("{s:?}");
                }
                Err(e) => last = e,
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "node {} not synced after {} s (last: {last}); its error log:\n{}",
                    n + 1,
                    SYNC_TIMEOUT.as_secs(),
                    tail(&node.dir.join("error.log"))
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills node `n` (0-based) with SIGKILL: no shutdown, as a machine dies.
    pub fn kill(&self, n: usize) {
        let node = &self.nodes[n];
        if let Some(mut child) = node.child.lock().expect("node lock").take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `n` again and waits until it has rejoined and synced.
    pub async fn rejoin(&'static self, n: usize) -> Result<Duration, String> {
        tokio::task::spawn_blocking(move || {
            let began = Instant::now();
            self.spawn(n, false)?;
            self.wait_synced(n, NODES)?;
            Ok(began.elapsed())
        })
        .await
        .map_err(|e| format!("rejoin: {e}"))?
    }

    /// The database `name` on each node.
    pub fn database_urls(&self, name: &str) -> Vec<String> {
        let url = |admin: &String| super::throwaway::with_database(admin, name);
        self.urls.iter().map(url).collect()
    }

    /// Node `n`'s `SHOW GLOBAL STATUS LIKE 'wsrep%'`.
    pub async fn status(&self, n: usize) -> Result<HashMap<String, String>, String> {
        status(self.urls[n].clone()).await
    }

    /// A wsrep counter summed over the nodes that answer (for example
    /// `wsrep_local_cert_failures`, `wsrep_local_bf_aborts`).
    pub async fn counter(&self, name: &str) -> u64 {
        let mut total = 0;
        for n in 0..self.urls.len() {
            if let Ok(s) = self.status(n).await {
                total += s.get(name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
        total
    }
}

/// `mariadb-install-db`, `mariadbd` and the Galera library, or why not.
fn programs() -> Result<(PathBuf, PathBuf, PathBuf), Skip> {
    let (install_db, server) = binaries().ok_or_else(|| {
        Skip("no mariadb-install-db and mariadbd (apt-get install mariadb-server galera-4)".into())
    })?;
    let provider = PROVIDERS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Skip(format!(
                "no Galera library in {PROVIDERS:?} (apt-get install galera-4)"
            ))
        })?;
    let rsync = Command::new("rsync")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !rsync.is_ok_and(|s| s.success()) {
        return Err(Skip(
            "no rsync, which state transfers need (apt-get install rsync)".into(),
        ));
    }
    Ok((install_db, server, provider))
}

/// This process's user name.
fn whoami() -> Result<String, String> {
    let output = Command::new("id")
        .arg("-un")
        .output()
        .map_err(|e| format!("id -un: {e}"))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The watchdog's cleanup: every node (by the pid it wrote, else the one we
/// spawned), then anything still running from the dir (an rsync daemon of a
/// state transfer), then the dir.
fn cleanup(dir: &Path) -> String {
    let dir = shell_quote(dir);
    format!(
        "for node in {dir}/node*; do\n\
           for f in \"$node/mysqld.pid\" \"$node/spawned.pid\"; do\n\
             pid=$(cat \"$f\" 2>/dev/null)\n\
             case $pid in ''|*[!0-9]*) ;; *) kill -KILL $pid 2>/dev/null ;; esac\n\
           done\n\
         done\n\
         install=$(cat {dir}/install.pid 2>/dev/null)\n\
         case $install in ''|*[!0-9]*) ;; *) kill -KILL -$install 2>/dev/null ;; esac\n\
         sleep 1\n\
         pkill -KILL -f {dir}/ 2>/dev/null\n\
         rm -rf {dir} || {{ sleep 1; rm -rf {dir}; }}\n"
    )
}

/// The last lines of a log, for a failure message.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// `SHOW GLOBAL STATUS LIKE 'wsrep%'` on one connection of its own.
async fn status(url: String) -> Result<HashMap<String, String>, String> {
    let query = async {
        let mut conn = MySqlConnection::connect(&url).await?;
        let rows = sqlx::query("SHOW GLOBAL STATUS LIKE 'wsrep%'")
            .fetch_all(&mut conn)
            .await?;
        let _ = conn.close().await;
        rows.iter()
            .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?)))
            .collect::<Result<HashMap<_, _>, sqlx::Error>>()
    };
    match tokio::time::timeout(Duration::from_secs(5), query).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// Runs `future` to completion on a runtime of its own, on a thread of its
/// own: the harness is synchronous and may be called inside a test's runtime.
fn blocking<T: Send + 'static>(
    future: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
) -> Result<T, String> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot build a runtime: {e}"))?
            .block_on(future)
    })
    .join()
    .unwrap_or_else(|_| Err("the status thread panicked".to_owned()))
}
