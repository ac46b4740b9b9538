//! A bounded load of charges through API replicas, driven by a correct
//! client: each operation has its own key and is retried with that key
//! (on 409, 503 or a lost connection, at the next replica, as a load
//! balancer would) until it has its 201. One operation in four is sent
//! twice at once, to two replicas, so repeated keys race too.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use payments_api::config::DEV_JWT_SECRET;
use payments_tests::{Process, charge_body};
use serde_json::Value;

/// Attempts per request before the load gives up on it (a failure).
const MAX_ATTEMPTS: usize = 400;
/// Between two attempts of one request.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// One attempt's limit: longer than the server's own timeouts, so a hang
/// shows as `timeout` in the report.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(20);

/// Prints a test's figures past the test harness's capture, so that
/// `make test` and CI logs show them for a passing test too.
pub fn report(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// An operation that ended in a 201: what its client holds, and what it
/// would retry with.
#[derive(Debug, Clone)]
pub struct Acknowledged {
    pub key: String,
    pub body: String,
    /// The charge id of its 201.
    pub charge: String,
    /// The provider's charge id of its 201 (`gateway_charge_id`).
    pub gateway: String,
    /// Which replica it was first sent to.
    first: usize,
}

/// A request's end: a 201's charge id and provider charge id, or why not.
pub type Answered = Result<(String, String), String>;

/// What the load saw.
#[derive(Debug, Default)]
pub struct Report {
    /// Each operation's charge id, in operation order.
    pub charges: Vec<String>,
    /// Answers by status (`201`, `409`, `503`, ...) and transport errors
    /// (`connection`, `timeout`).
    pub answers: BTreeMap<String, usize>,
    /// Operations that did not end in a 201 with one charge id, and why.
    pub failures: Vec<String>,
    /// 201s that were replays.
    pub replays: usize,
    /// The longest time during which no request succeeded: what clients
    /// saw of a failover.
    pub longest_gap: Duration,
}

struct Inner {
    replicas: Vec<String>,
    token: String,
    http: reqwest::Client,
    ops: usize,
    next: AtomicUsize,
    completed: AtomicUsize,
    in_flight: Vec<AtomicUsize>,
    answers: Mutex<BTreeMap<String, usize>>,
    successes: Mutex<Vec<Instant>>,
    replays: AtomicUsize,
    acknowledged: Mutex<Vec<Acknowledged>>,
}

/// A load running in the background.
pub struct Load {
    inner: Arc<Inner>,
    workers: tokio::task::JoinSet<Vec<(usize, Result<String, String>)>>,
}

impl Load {
    /// Starts `ops` operations through `replicas` (base URLs), `workers` at
    /// a time.
    pub fn start(replicas: Vec<String>, ops: usize, workers: usize) -> Self {
        let token = payments_api::auth::mint_hs256(
            DEV_JWT_SECRET,
            "cus_cluster",
            Duration::from_secs(3600),
        )
        .expect("a token");
        let inner = Arc::new(Inner {
            in_flight: replicas.iter().map(|_| AtomicUsize::new(0)).collect(),
            replicas,
            token,
            http: reqwest::Client::new(),
            ops,
            next: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            answers: Mutex::default(),
            successes: Mutex::default(),
            replays: AtomicUsize::new(0),
            acknowledged: Mutex::default(),
        });
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..workers {
            let inner = inner.clone();
            set.spawn(async move {
                let mut done = Vec::new();
                loop {
                    let op = inner.next.fetch_add(1, Ordering::Relaxed);
                    if op >= inner.ops {
                        return done;
                    }
                    done.push((op, inner.operation(op).await));
                    inner.completed.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        Self {
            inner,
            workers: set,
        }
    }

    /// Waits until `n` operations have finished (or all have).
    pub async fn until_completed(&self, n: usize) {
        let n = n.min(self.inner.ops);
        while self.inner.completed.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Operations finished so far.
    pub fn completed(&self) -> usize {
        self.inner.completed.load(Ordering::Relaxed)
    }

    /// Requests waiting for an answer from replica `i` right now.
    pub fn in_flight(&self, i: usize) -> usize {
        self.inner.in_flight[i].load(Ordering::Relaxed)
    }

    /// The operations acknowledged (answered 201) so far.
    pub fn acknowledged(&self) -> Vec<Acknowledged> {
        self.inner
            .acknowledged
            .lock()
            .expect("acknowledged")
            .clone()
    }

    /// `op`'s client retrying it with its key, as a client does that was
    /// told to or lost its answer: sent until a 201, its charge id and
    /// provider charge id.
    pub fn retry(&self, op: &Acknowledged) -> tokio::task::JoinHandle<Answered> {
        let (inner, op) = (self.inner.clone(), op.clone());
        tokio::spawn(async move { inner.request(&op.key, &op.body, op.first).await })
    }

    /// Waits for every operation and reports.
    pub async fn finish(self) -> Report {
        let mut results: Vec<(usize, Result<String, String>)> = self
            .workers
            .join_all()
            .await
            .into_iter()
            .flatten()
            .collect();
        results.sort_by_key(|(op, _)| *op);
        let mut report = Report::default();
        for (op, result) in results {
            match result {
                Ok(charge) => report.charges.push(charge),
                Err(why) => report.failures.push(format!("operation {op}: {why}")),
            }
        }
        report.answers = self.inner.answers.lock().expect("answers").clone();
        report.replays = self.inner.replays.load(Ordering::Relaxed);
        let mut successes = self.inner.successes.lock().expect("successes").clone();
        successes.sort();
        report.longest_gap = successes
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        report
    }
}

impl Report {
    /// What every node-loss test asserts: every operation ended in a 201
    /// with its own charge, no answer was a 500 or a hang, and the provider
    /// made exactly one charge per operation. The acknowledged charge ids.
    pub async fn assert_exactly_once(&self, ops: usize, sandbox: &Process) -> HashSet<String> {
        assert!(self.failures.is_empty(), "{:#?}", self.failures);
        assert!(
            !self.answers.contains_key("500") && !self.answers.contains_key("timeout"),
            "no 500 and no hang while a node died: {:?}",
            self.answers
        );
        let acknowledged: HashSet<String> = self.charges.iter().cloned().collect();
        assert_eq!(acknowledged.len(), ops, "one charge per operation");
        assert_eq!(
            provider_charges(sandbox).await,
            ops,
            "no operation charged twice at the provider"
        );
        acknowledged
    }
}

/// A replica's environment: the database `url` (one node), the provider
/// at `gateway`.
pub fn api_env<'a>(url: &'a str, gateway: &'a str) -> [(&'static str, &'a str); 6] {
    [
        ("DATABASE_URL", url),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("GATEWAY_URL", gateway),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("JWT_HS256_SECRET", DEV_JWT_SECRET),
        // A replica whose node is gone answers 503 after this, not after
        // the default 10 s.
        ("DATABASE_ACQUIRE_TIMEOUT", "2s"),
    ]
}

/// `payments-api` on the database `url` (one node), charging at `sandbox`.
pub async fn replica(url: &str, sandbox: &Process) -> Process {
    Process::start("payments-api", &[], &api_env(url, &sandbox.url)).await
}

/// The sandbox provider as a process, taking `latency_ms` per call.
pub async fn sandbox(latency_ms: &str) -> Process {
    Process::start(
        "payments-sandbox",
        &["--listen", "127.0.0.1:0", "--latency-ms", latency_ms],
        &[],
    )
    .await
}

/// How many charges the provider made (`GET /_sandbox/charges`): one per
/// operation when nothing was charged twice.
pub async fn provider_charges(sandbox: &Process) -> usize {
    let made = sandbox_json(sandbox, "/_sandbox/charges").await;
    made["data"].as_array().map_or(0, Vec::len)
}

/// `GET path` on the sandbox, as JSON.
pub async fn sandbox_json(sandbox: &Process, path: &str) -> Value {
    reqwest::get(format!("{}{path}", sandbox.url))
        .await
        .expect("the sandbox answers")
        .json()
        .await
        .expect("json")
}

impl Inner {
    /// One operation: its key, sent once, or twice at once to two
    /// replicas; both must end with the same charge.
    async fn operation(&self, op: usize) -> Result<String, String> {
        let key = uuid::Uuid::new_v4().to_string();
        let body = charge_body(1000 + (op % 500) as i64, "tok_visa");
        let (charge, gateway) = if !op.is_multiple_of(4) {
            self.request(&key, &body, op).await?
        } else {
            let (a, b) = tokio::join!(
                self.request(&key, &body, op),
                self.request(&key, &body, op + 1)
            );
            let (a, b) = (a?, b?);
            if a != b {
                return Err(format!("one key, two charges: {a:?} and {b:?}"));
            }
            a
        };
        let acknowledged = Acknowledged {
            key,
            body,
            charge: charge.clone(),
            gateway,
            first: op,
        };
        let mut all = self.acknowledged.lock().expect("acknowledged");
        all.push(acknowledged);
        Ok(charge)
    }

    /// Sends until a 201, starting at replica `first`: the charge's id and
    /// its provider charge id.
    async fn request(&self, key: &str, body: &str, first: usize) -> Answered {
        for attempt in 0..MAX_ATTEMPTS {
            let replica = (first + attempt) % self.replicas.len();
            self.in_flight[replica].fetch_add(1, Ordering::Relaxed);
            let sent = self
                .http
                .post(format!("{}/api/charges", self.replicas[replica]))
                .bearer_auth(&self.token)
                .header("content-type", "application/json")
                .header("idempotency-key", key)
                .body(body.to_owned())
                .timeout(ATTEMPT_TIMEOUT)
                .send()
                .await;
            let answer = match sent {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let replay = response.headers().contains_key("idempotent-replay");
                    let text = response.text().await.unwrap_or_default();
                    Ok((status, replay, text))
                }
                Err(e) if e.is_timeout() => Err("timeout"),
                Err(_) => Err("connection"),
            };
            self.in_flight[replica].fetch_sub(1, Ordering::Relaxed);
            let label = match &answer {
                Ok((status, ..)) => status.to_string(),
                Err(kind) => (*kind).to_owned(),
            };
            *self
                .answers
                .lock()
                .expect("answers")
                .entry(label)
                .or_default() += 1;
            match answer {
                Ok((201, replay, text)) => {
                    self.successes
                        .lock()
                        .expect("successes")
                        .push(Instant::now());
                    if replay {
                        self.replays.fetch_add(1, Ordering::Relaxed);
                    }
                    let charge: serde_json::Value = serde_json::from_str(&text)
                        .map_err(|e| format!("a 201 that is not JSON ({e}): {text}"))?;
                    let field = |name: &str| {
                        charge[name]
                            .as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| format!("a 201 without {name}: {text}"))
                    };
                    return Ok((field("id")?, field("gateway_charge_id")?));
                }
                Ok((409 | 503, ..)) | Err(_) => tokio::time::sleep(RETRY_PAUSE).await,
                Ok((status, _, text)) => return Err(format!("{status}: {text}")),
            }
        }
        Err(format!("no 201 after {MAX_ATTEMPTS} attempts"))
    }
}
