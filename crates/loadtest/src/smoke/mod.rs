//! `payments-smoke`: a post-deploy check that proves idempotency from the
//! outside, against a running server.
//!
//! Safe to run repeatedly against staging: every run uses fresh keys, small
//! amounts on a sandbox test card (`tok_visa`, 100 minor units by default),
//! and tags each charge with `metadata.smoke_run = <run id>` and
//! `metadata.smoke_check = <check name>`, so its charges can be found. A run
//! starts three operations (two charges and a refund; four if the server
//! serves keyless requests), so it fits the
//! server's default per-customer burst three times over; beyond it, a 429
//! `rate_limited` is waited out (`Retry-After`, at most two minutes per
//! request) and noted on its check, never judged a failure: the server
//! stored nothing for it.
//!
//! The checks, in order (see [`Check`]):
//! 1. `concurrent_same_key`: two concurrent requests with one key make one
//!    charge (201 + 409, or 201 + a replayed 201 of the same charge).
//! 2. `sequential_replay`: a retry of a completed key is 201 with
//!    `Idempotent-Replay: true` and the first body byte for byte.
//! 3. `key_reuse_other_body`: that key with another amount is 422
//!    `idempotency_key_reused`.
//! 4. `missing_key`: no key is 400 `idempotency_key_missing` (a 201 means the
//!    server is in `optional` rollout mode: a pass with a note, or a failure
//!    with [`Config::require_key`]).
//! 5. `refund_once`: two concurrent refunds of half of check 2's charge
//!    under one key make one refund, which the charge then counts.
//! 6. `list_finds_charge`: `GET /api/charges?idempotency_key=` finds the
//!    charge that key made.
//! 7. `one_row_per_key` (with [`Config::database_url`]): exactly one
//!    `charges` row for each keyed operation.
//!
//! [`run`] is the whole smoke; the binary only parses flags and prints the
//! [`Report`].

mod checks;
mod database;
mod report;

use std::time::Duration;

use payments_client::{Client, ClientError};
use secrecy::{ExposeSecret, SecretString};

pub use report::{Check, CheckResult, EXIT_ERROR, EXIT_FAILED, EXIT_PASSED, Report, Skipped};

use crate::tool::{self, PreflightError};

/// What to smoke-test and how.
#[derive(Debug, Clone)]
pub struct Config {
    pub base_url: String,
    /// A bearer token for a test customer.
    pub token: SecretString,
    /// A back-office token with `refunds:write` and `charges:capture`, for
    /// the refund and capture checks; `None`: the customer's token refunds
    /// (a server with `REFUNDS_BY_CUSTOMER`; any other answers 403), and
    /// the capture check is skipped.
    pub back_office_token: Option<SecretString>,
    /// The server's database (`sqlite:`, `postgres://`, `mysql://`), for
    /// `one_row_per_key`; `None` skips that check.
    pub database_url: Option<SecretString>,
    /// Fail `missing_key` when the server serves keyless requests.
    pub require_key: bool,
    /// One request's timeout.
    pub timeout: Duration,
    pub amount_cents: i64,
    pub currency: String,
    pub card_token: String,
}

impl Config {
    /// 100 GBP minor units on `tok_visa`, 30 s per request, no database.
    pub fn new(base_url: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            token: SecretString::from(token.into()),
            back_office_token: None,
            database_url: None,
            require_key: false,
            timeout: Duration::from_secs(30),
            amount_cents: 100,
            currency: "GBP".to_owned(),
            card_token: "tok_visa".to_owned(),
        }
    }
}

/// Why the smoke could not run at all (exit status [`EXIT_ERROR`]), as
/// opposed to a check that ran and failed.
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The server is unreachable or refused the token.
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    #[error("unsupported database URL scheme {0:?}: use sqlite:, postgres:// or mysql://")]
    UnsupportedDatabase(String),
    #[error("cannot use the database: {0}")]
    Database(#[source] sqlx::Error),
}

/// Runs every check once and reports. `Err` only when the smoke could not
/// run: a bad URL, an unreachable server or database, a refused token.
pub async fn run(config: &Config) -> Result<Report, SmokeError> {
    let client = Client::builder(&config.base_url, config.token.expose_secret())
        .attempt_timeout(config.timeout)
        .deadline(config.timeout.max(Duration::from_secs(30)))
        .max_attempts(10)
        .backoff(Duration::from_millis(100), Duration::from_secs(2))
        .build()?;
    let run_id = format!("smoke-{}", uuid::Uuid::new_v4().simple());

    // Before any charge: the database opens and its `charges` table answers.
    let mut database = match &config.database_url {
        Some(url) => {
            let mut db = database::connect(url.expose_secret()).await?;
            database::rows_of_run(&mut db, &run_id)
                .await
                .map_err(SmokeError::Database)?;
            Some(db)
        }
        None => None,
    };
    tool::preflight(&client, "ch_smoke_preflight").await?;
    let back_office = match &config.back_office_token {
        Some(token) => {
            let back_office = client.with_token(token.expose_secret());
            tool::preflight(&back_office, "ch_smoke_preflight").await?;
            back_office
        }
        None => client.clone(),
    };

    let run = checks::Run {
        id: run_id.clone(),
        client,
        back_office,
        config: config.clone(),
        waited: Default::default(),
    };
    let mut results = Vec::new();
    let concurrent = checks::concurrent_same_key(&run).await;
    results.push(concurrent.result);
    let sequential = checks::sequential_replay(&run).await;
    results.push(sequential.result);
    results.push(checks::key_reuse_other_body(&run, sequential.completed.clone()).await);
    results.push(checks::missing_key(&run).await);
    results.extend(checks::refund_once_and_find(&run, sequential.completed).await);
    let mut skipped = Vec::new();
    // Captures are the back office's alone (no setting lets customers).
    match &config.back_office_token {
        Some(_) => results.push(checks::authorize_capture(&run).await),
        None => skipped.push(Skipped {
            name: Check::AuthorizeCapture,
            reason: "no --back-office-token given: captures are the back office's \
                     (charges:capture)"
                .to_owned(),
        }),
    }
    let mut results: Vec<CheckResult> = results.into_iter().map(|r| run.noted(r)).collect();

    match &mut database {
        Some(db) => {
            let expected = vec![
                (Check::ConcurrentSameKey, concurrent.charge_ids),
                (Check::SequentialReplay, sequential.charge_ids),
            ];
            results.push(match database::rows_of_run(db, &run_id).await {
                Ok(rows) => {
                    let (passed, detail) = database::one_row_per_key(&rows, &expected);
                    if passed {
                        CheckResult::pass(Check::OneRowPerKey, detail)
                    } else {
                        CheckResult::fail(Check::OneRowPerKey, detail)
                    }
                }
                Err(e) => CheckResult::fail(Check::OneRowPerKey, format!("query failed: {e}")),
            });
        }
        None => skipped.push(Skipped {
            name: Check::OneRowPerKey,
            reason: "no --database-url given".to_owned(),
        }),
    }
    Ok(Report::new(
        run_id,
        run.client.base_url().to_owned(),
        results,
        skipped,
    ))
}
