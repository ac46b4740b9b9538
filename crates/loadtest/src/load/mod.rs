//! `payments-load`: a load generator for a running payments API on this
//! machine, which measures and, above all, counts: at the end of every run
//! the charges the provider (the sandbox) made and the `charges` rows the
//! database holds must equal the operations that got a final 201.
//!
//! # Layout
//! - this module: [`Config`], [`Scenario`] (also the binary's subcommands),
//!   [`run`] (checks, the scenario, then the accounting) and [`LoadError`].
//! - `target`: loopback only; any other host is refused before a request.
//! - `operation`: one logical charge (key and body fixed before the first
//!   attempt), single attempts timed into a stream, the correct retry loop,
//!   and what the answers named ([`Report::operations`]).
//! - [`Marker`]: tells a caller where a run's measured part starts and ends.
//! - `stream`: per-stream HDR histogram (µs), statuses, transport errors.
//! - `scenarios`: `new`, `replay`, `storm`, `slow`, `refund`, `capture`,
//!   `list`, `health`.
//! - `sandbox`, `database`: the two counts.
//! - `report`: [`Report`], as a table or JSON, and the exit statuses.
//!
//! # Bounds
//! Every run is bounded by its work (`requests`, `keys`, `in_flight`) and by
//! [`Config::duration`], a cap on the whole run, setup included: after it
//! no operation, attempt, retry or probe starts, and attempts still in
//! flight get [`Config::drain`] to finish before they are cancelled. An
//! operation left without a final answer makes the run incorrect: its
//! charge cannot be reconciled.
//!
//! # What "charged during this run" means
//! At the sandbox: the successful charges it lists at the end that it did
//! not list at the start (or all of them after `POST /_sandbox/reset`, only
//! with [`Config::reset_sandbox`]); the sandbox must not serve anyone else
//! meanwhile. In the database: the `succeeded` rows whose `metadata.load_run`
//! is this run's id, which every request carries.

mod database;
mod operation;
mod report;
mod sandbox;
mod scenarios;
mod stream;
mod target;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use payments_client::{ChargeQuery, Client, ClientError, RetryPolicy};
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;
use tokio::time::Instant;

pub use report::{
    Charges, EXIT_CORRECT, EXIT_ERROR, EXIT_INCORRECT, Operations, Report, StoppedBy,
};
pub use stream::{Count, Latency, StreamReport};

use crate::tool::{self, PreflightError};
use operation::{OpRecord, Read, Run, Violations};
use sandbox::Sandbox;

/// What to run, and the `payments-load` subcommand that says it: the first
/// line of each variant is its `--help`, each field a flag with the binary's
/// default. Counts are at least 1 (the flags and [`run`] refuse 0).
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum Scenario {
    /// Every request a fresh key.
    ///
    /// `requests` operations, each a fresh key, `concurrency` at a time.
    #[command(long_about = None)]
    New {
        /// Operations in all.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        requests: u64,
        /// Operations at a time.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
    /// Completed keys re-sent round-robin: every answer must be a replay.
    ///
    /// `keys` charges made first, then `requests` re-sends of their exact
    /// keys and bodies, round-robin, `concurrency` at a time. Every answer
    /// must be the stored 201 with `Idempotent-Replay: true`.
    #[command(long_about = None)]
    Replay {
        /// Charges made first, then re-sent.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
        keys: u64,
        /// Re-sends in all.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        requests: u64,
        /// Requests at a time.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
    /// Many concurrent requests per key: one charge per key, only 201/409.
    ///
    /// For each of `keys` keys, `per_key` requests with that key and body
    /// released at once (`concurrency` keys at a time); only 201 and 409 are
    /// allowed, and a retry after the storm must end 201.
    #[command(long_about = None)]
    Storm {
        /// Keys, one after another (`--concurrency` at a time).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
        keys: u64,
        /// Requests per key, released at once.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        per_key: u64,
        /// Keys stormed at a time.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
    /// A slow provider: many charges in flight, replays and GETs measured
    /// meanwhile.
    ///
    /// The sandbox's latency set to `provider_latency`, `in_flight` charges
    /// started at once, each a correct retry loop until 201, while
    /// `probe_concurrency` probes re-send `probe_keys` completed keys and
    /// `GET` their charges, pausing `probe_interval` between rounds. Needs
    /// [`Config::sandbox_url`]; the latency is set back to 0 at the end.
    #[command(long_about = None)]
    Slow {
        /// The sandbox's latency during the run (set back to 0 at the end).
        #[arg(long, default_value = "18s", value_parser = humantime::parse_duration)]
        provider_latency: Duration,
        /// Charges started at once, each retried with its key until 201.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        in_flight: u64,
        /// Probes at a time, each a replay then a GET of a completed charge.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
        probe_concurrency: u64,
        /// Completed charges made first for the probes.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        probe_keys: u64,
        /// Each probe's pause between rounds, so probes measure latency
        /// rather than add load of their own.
        #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
        probe_interval: Duration,
    },
    /// Refunds, each its own operation: every one made once.
    ///
    /// `charges` charges made first; then each is refunded in `per_charge`
    /// equal parts, every refund its own key driven by the retry loop,
    /// `concurrency` at a time. Every refund must end 201, naming one
    /// refund; with a sandbox, it must hold exactly the refunds answered.
    #[command(long_about = None)]
    Refund {
        /// Charges made first, then refunded.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        charges: u64,
        /// Refunds of each charge (equal parts of it).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
        per_charge: u64,
        /// Operations at a time.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
    /// Captures of holds, each its own operation: every one made once.
    ///
    /// `holds` holds authorized first (`"capture": false`); then each is
    /// captured in full by the back office, every capture its own key driven
    /// by the client's retry loop, `concurrency` at a time. Needs
    /// [`Config::back_office_token`]. Every capture must end 201 with the
    /// charge `succeeded` and all of it captured; with a sandbox, it must
    /// hold exactly one capture per hold captured.
    #[command(long_about = None)]
    Capture {
        /// Holds authorized first, then captured.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        holds: u64,
        /// Operations at a time.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
    /// Reads of one page of `GET /api/charges`, timed: every answer 200.
    ///
    /// `requests` reads of a page of `limit` (after `starting_after` when
    /// given: a deep page), `concurrency` at a time. Makes no charges: run
    /// it on a customer that has them.
    #[command(long_about = None)]
    List {
        /// Reads in all.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        requests: u64,
        /// Reads at a time.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
        /// Charges per page (1-100).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100))]
        limit: u32,
        /// A charge id of the customer's: the page after it.
        #[arg(long)]
        starting_after: Option<String>,
    },
    /// Reads of `GET /healthz`, timed: what the server answers with no work
    /// behind the answer, the ceiling a replay is measured against.
    ///
    /// `requests` reads, `concurrency` at a time; every answer 200.
    #[command(long_about = None)]
    Health {
        /// Reads in all.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        requests: u64,
        /// Reads at a time.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
}

impl Scenario {
    pub fn name(&self) -> &'static str {
        match self {
            Self::New { .. } => "new",
            Self::Replay { .. } => "replay",
            Self::Storm { .. } => "storm",
            Self::Slow { .. } => "slow",
            Self::Refund { .. } => "refund",
            Self::Capture { .. } => "capture",
            Self::List { .. } => "list",
            Self::Health { .. } => "health",
        }
    }

    fn settings(&self) -> serde_json::Value {
        match self {
            Self::New {
                requests,
                concurrency,
            } => json!({"requests": requests, "concurrency": concurrency}),
            Self::Replay {
                keys,
                requests,
                concurrency,
            } => json!({"keys": keys, "requests": requests, "concurrency": concurrency}),
            Self::Storm {
                keys,
                per_key,
                concurrency,
            } => json!({"keys": keys, "per_key": per_key, "concurrency": concurrency}),
            Self::Slow {
                in_flight,
                provider_latency,
                probe_concurrency,
                probe_keys,
                probe_interval,
            } => json!({
                "in_flight": in_flight,
                "provider_latency_ms": provider_latency.as_millis() as u64,
                "probe_concurrency": probe_concurrency,
                "probe_keys": probe_keys,
                "probe_interval_ms": probe_interval.as_millis() as u64,
            }),
            Self::Refund {
                charges,
                per_charge,
                concurrency,
            } => json!({"charges": charges, "per_charge": per_charge, "concurrency": concurrency}),
            Self::Capture { holds, concurrency } => {
                json!({"holds": holds, "concurrency": concurrency})
            }
            Self::List {
                requests,
                concurrency,
                limit,
                starting_after,
            } => json!({"requests": requests, "concurrency": concurrency, "limit": limit,
                "starting_after": starting_after}),
            Self::Health {
                requests,
                concurrency,
            } => json!({"requests": requests, "concurrency": concurrency}),
        }
    }

    fn validate(&self) -> Result<(), LoadError> {
        let counts: &[(&str, u64)] = match self {
            Self::New {
                requests,
                concurrency,
            } => &[("requests", *requests), ("concurrency", *concurrency)],
            Self::Replay {
                keys,
                requests,
                concurrency,
            } => &[
                ("keys", *keys),
                ("requests", *requests),
                ("concurrency", *concurrency),
            ],
            Self::Storm {
                keys,
                per_key,
                concurrency,
            } => &[
                ("keys", *keys),
                ("per-key", *per_key),
                ("concurrency", *concurrency),
            ],
            Self::Slow {
                in_flight,
                probe_concurrency,
                probe_keys,
                ..
            } => &[
                ("in-flight", *in_flight),
                ("probe-concurrency", *probe_concurrency),
                ("probe-keys", *probe_keys),
            ],
            Self::Refund {
                charges,
                per_charge,
                concurrency,
            } => &[
                ("charges", *charges),
                ("per-charge", *per_charge),
                ("concurrency", *concurrency),
            ],
            Self::Capture { holds, concurrency } => {
                &[("holds", *holds), ("concurrency", *concurrency)]
            }
            Self::List {
                requests,
                concurrency,
                ..
            }
            | Self::Health {
                requests,
                concurrency,
            } => &[("requests", *requests), ("concurrency", *concurrency)],
        };
        match counts.iter().find(|(_, n)| *n == 0) {
            Some((name, _)) => Err(LoadError::Usage(format!("--{name} must be at least 1"))),
            None => Ok(()),
        }
    }
}

/// A run's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The API; loopback only.
    pub base_url: String,
    /// A bearer token for a test customer.
    pub token: SecretString,
    /// A back-office token with `refunds:write` and `charges:capture`, for
    /// `refund`'s refunds and `capture`'s captures; `None`: the customer's
    /// token refunds (`REFUNDS_BY_CUSTOMER`), and `capture` cannot run.
    pub back_office_token: Option<SecretString>,
    /// The sandbox provider behind the API, to count its charges and (for
    /// `slow`) set its latency; loopback only.
    pub sandbox_url: Option<String>,
    /// The API's database (`sqlite:`, `postgres://`, `mysql://`), to count
    /// this run's `charges` rows.
    pub database_url: Option<SecretString>,
    pub scenario: Scenario,
    /// A hard cap on the whole run, setup included. Default 60 s.
    pub duration: Duration,
    /// How long attempts in flight at the cap may finish. Default 5 s.
    pub drain: Duration,
    /// One attempt's timeout (retried with the same key). Default 30 s.
    pub timeout: Duration,
    /// `POST /_sandbox/reset` before the run. Default false.
    pub reset_sandbox: bool,
    /// Every charge's amount, GBP minor units, on `tok_visa`. Default 100.
    pub amount_cents: i64,
    /// Told where the run's measured part starts and ends. Default none.
    pub marker: Option<Marker>,
}

/// An edge of a run's measured part: the scenario's own requests (`new`'s
/// charges, `replay`'s re-sends, `refund`'s refunds, `capture`'s captures,
/// ...), after its setup (the preflight, the sandbox's reset and count, the
/// charges a `replay`, `refund` or `slow` makes first, the holds of
/// `capture`) and before the accounting (the counts at the sandbox and in
/// the database).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// The first of the scenario's own requests is about to be sent.
    Start,
    /// The last of them has its answer (or was cancelled at the cap).
    End,
}

/// A callback given each [`Mark`] of a run, once, in order, on the run's
/// task: so that a caller can read counters (CPU time, a server's metrics)
/// around exactly the requests the scenario is about, and not around its
/// setup or accounting. It should be quick: the run waits for it. A run
/// that stops before its measured part (a setup that charged nothing to
/// re-send, an error) gives no mark, or only [`Mark::Start`].
#[derive(Clone)]
pub struct Marker(Arc<dyn Fn(Mark) + Send + Sync>);

impl Marker {
    pub fn new(mark: impl Fn(Mark) + Send + Sync + 'static) -> Self {
        Self(Arc::new(mark))
    }
}

impl fmt::Debug for Marker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Marker(..)")
    }
}

impl Config {
    pub fn new(base_url: impl Into<String>, token: impl Into<String>, scenario: Scenario) -> Self {
        Self {
            base_url: base_url.into(),
            token: SecretString::from(token.into()),
            back_office_token: None,
            sandbox_url: None,
            database_url: None,
            scenario,
            duration: Duration::from_secs(60),
            drain: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
            reset_sandbox: false,
            amount_cents: 100,
            marker: None,
        }
    }
}

/// Why a run could not start or finish (exit status [`EXIT_ERROR`]), as
/// opposed to a run that ended incorrect.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{flag} {url:?} refused: {reason} (payments-load only targets this machine)")]
    NotLoopback {
        flag: &'static str,
        url: String,
        reason: String,
    },
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The server is unreachable or refused the token.
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    #[error("the sandbox: {0}")]
    Sandbox(String),
    #[error("cannot use the database: {0}")]
    Database(String),
    #[error("unsupported database URL scheme {0:?}: use sqlite:, postgres:// or mysql://")]
    UnsupportedDatabase(String),
    #[error("could not encode a request: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("internal error: {0}")]
    Internal(String),
}

/// Runs `config.scenario` and counts. `Err` only when the run could not
/// start (a refused URL, an unreachable server, sandbox or database, a
/// refused token) or lost the sandbox mid-run; anything the server did wrong
/// is in the [`Report`].
pub async fn run(config: &Config) -> Result<Report, LoadError> {
    config.scenario.validate()?;
    target::require_loopback("--base-url", &config.base_url)?;
    let sandbox = match &config.sandbox_url {
        Some(url) => Some(Sandbox::new(
            target::require_loopback("--sandbox-url", url)?,
            config.timeout,
        )?),
        None => None,
    };
    if sandbox.is_none() {
        if let Scenario::Slow { .. } = config.scenario {
            return Err(LoadError::Usage(
                "the slow scenario sets the provider's latency: it needs --sandbox-url".into(),
            ));
        }
        if config.reset_sandbox {
            return Err(LoadError::Usage(
                "--reset-sandbox needs --sandbox-url".into(),
            ));
        }
    }
    if let (Scenario::Capture { .. }, None) = (&config.scenario, &config.back_office_token) {
        return Err(LoadError::Usage(
            "the capture scenario captures as the back office: it needs --back-office-token \
             (LOAD_BACK_OFFICE_TOKEN), a token with charges:capture"
                .into(),
        ));
    }
    let retry = RetryPolicy {
        // Only the deadline ends a retry loop.
        max_attempts: u32::MAX,
        deadline: config.duration,
        backoff_base: Duration::from_millis(100),
        backoff_cap: Duration::from_secs(5),
    };
    // Its own retry loop (`capture`'s) retries as the load generator's does.
    let client = Client::builder(&config.base_url, config.token.expose_secret())
        .attempt_timeout(config.timeout)
        .retry_policy(retry)
        .build()?;
    let run_id = format!("load-{}", uuid::Uuid::new_v4().simple());

    // Everything is reachable before anything is charged.
    tool::preflight(&client, "ch_load_preflight").await?;
    let back_office = match &config.back_office_token {
        Some(token) => {
            let back_office = client.with_token(token.expose_secret());
            tool::preflight(&back_office, "ch_load_preflight").await?;
            back_office
        }
        None => client.clone(),
    };
    let mut database = match &config.database_url {
        Some(url) => {
            let mut db = database::connect(url.expose_secret()).await?;
            database::rows_of_run(&mut db, &run_id)
                .await
                .map_err(|e| LoadError::Database(e.to_string()))?;
            Some(db)
        }
        None => None,
    };
    let before = match &sandbox {
        Some(sandbox) if config.reset_sandbox => {
            sandbox.reset().await?;
            Some(BTreeSet::new())
        }
        Some(sandbox) => Some(sandbox.succeeded_ids().await?),
        None => None,
    };

    let started = Instant::now();
    let run = Arc::new(Run {
        id: run_id.clone(),
        client,
        back_office,
        deadline: started + config.duration,
        drain: config.drain,
        timeout: config.timeout,
        retry,
        amount_cents: config.amount_cents,
        marker: config.marker.clone(),
        violations: Violations::default(),
    });
    let outcome = match config.scenario {
        Scenario::New {
            requests,
            concurrency,
        } => scenarios::new_charges(&run, requests, concurrency).await?,
        Scenario::Replay {
            keys,
            requests,
            concurrency,
        } => scenarios::replay(&run, keys, requests, concurrency).await?,
        Scenario::Storm {
            keys,
            per_key,
            concurrency,
        } => scenarios::storm(&run, keys, per_key, concurrency).await?,
        Scenario::Slow {
            in_flight,
            provider_latency,
            probe_concurrency,
            probe_keys,
            probe_interval,
        } => {
            let settings = scenarios::Slow {
                in_flight,
                provider_latency,
                probe_concurrency,
                probe_keys,
                probe_interval,
            };
            // Checked above: `slow` has a sandbox.
            let Some(sandbox) = &sandbox else {
                return Err(LoadError::Internal("slow without a sandbox".into()));
            };
            scenarios::slow(&run, sandbox, settings).await?
        }
        Scenario::Refund {
            charges,
            per_charge,
            concurrency,
        } => scenarios::refunds(&run, sandbox.as_ref(), charges, per_charge, concurrency).await?,
        Scenario::Capture { holds, concurrency } => {
            scenarios::captures(&run, sandbox.as_ref(), holds, concurrency).await?
        }
        Scenario::List {
            requests,
            concurrency,
            limit,
            ref starting_after,
        } => {
            let query = ChargeQuery {
                limit: Some(limit),
                starting_after: starting_after.clone(),
                ..ChargeQuery::default()
            };
            scenarios::reads(&run, Read::Page(Box::new(query)), requests, concurrency).await?
        }
        Scenario::Health {
            requests,
            concurrency,
        } => scenarios::reads(&run, Read::Health, requests, concurrency).await?,
    };
    let elapsed = started.elapsed();

    let operations = operations(&outcome.ops);
    let named_charges: BTreeSet<&str> = outcome
        .ops
        .iter()
        .flat_map(|op| op.charge_ids.iter().map(String::as_str))
        .collect();
    let named_provider: BTreeSet<&str> = outcome
        .ops
        .iter()
        .flat_map(|op| op.gateway_ids.iter().map(String::as_str))
        .collect();
    let mut charges = Charges {
        answered: operations.charged,
        sandbox_reset: config.reset_sandbox,
        ..Charges::default()
    };
    if let (Some(sandbox), Some(before)) = (&sandbox, &before) {
        match sandbox.charged_since(before).await {
            Ok(count) => {
                charges.provider = Some(count.ids.len() as u64);
                charges.provider_unmatched = Some(
                    count
                        .ids
                        .iter()
                        .filter(|id| !named_provider.contains(id.as_str()))
                        .count() as u64,
                );
                charges.provider_keys_charged_twice = Some(count.keys_charged_twice.len() as u64);
            }
            Err(e) => run
                .violations
                .push(format!("could not count the provider's charges: {e}")),
        }
    }
    if let Some(db) = &mut database {
        match database::rows_of_run(db, &run_id).await {
            Ok(rows) => {
                charges.database = Some(rows.succeeded.len() as u64);
                charges.database_unmatched = Some(
                    rows.succeeded
                        .iter()
                        .filter(|id| !named_charges.contains(id.as_str()))
                        .count() as u64,
                );
                charges.database_other = rows.other;
            }
            Err(e) => run
                .violations
                .push(format!("could not count the database's charges: {e}")),
        }
    }
    let (violations, violations_total) = run.violations.take();
    let report = Report {
        run_id,
        scenario: config.scenario.name(),
        base_url: config.base_url.clone(),
        settings: config.scenario.settings(),
        elapsed_secs: (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        stopped_by: if outcome.completed {
            StoppedBy::Completed
        } else {
            StoppedBy::Duration
        },
        streams: outcome.streams.iter().map(|s| s.report()).collect(),
        operations,
        charges,
        correct: false,
        violations,
        violations_total,
    };
    Ok(report.judge())
}

fn operations(ops: &[OpRecord]) -> Operations {
    let mut counted = Operations {
        started: ops.len() as u64,
        ..Operations::default()
    };
    for op in ops {
        if op.charged() {
            counted.charged += 1;
        } else if op.unfinished() {
            counted.unfinished += 1;
        } else {
            counted.not_charged += 1;
        }
        counted.charged_twice += u64::from(op.charged_twice());
    }
    counted
}
