//! The reaper: recovers in-progress requests whose lease expired (a crashed
//! API process, a client that never came back after a 503) with the
//! provider's real outcome.
//!
//! It takes each record over exactly as an API retry would (a conditional
//! update on the lease; `FOR UPDATE SKIP LOCKED` on PostgreSQL), so an API
//! retry and a reaper, or two reapers, never drive one record at once, then
//! re-drives the provider call under the charge's stored provider key: a
//! provider that already charged replays that charge instead of charging
//! again. Provider unreachable: the record keeps the reaper's lease until it
//! expires and the next pass tries again. Only past `abandon_after` does the
//! reaper give up and mark it for reconciliation, and never on the
//! provider's answer that our key is still in flight there.
//!
//! A record claimed longer ago than the provider's key retention minus the
//! margin is never re-driven (the provider may have forgotten the key, and
//! would charge again): the reaper takes it over only to abandon it, without
//! a provider call. Which records are due, and how old they are, is the
//! database's clock's to say; each lease starts when its record is taken.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use payments_domain::idempotency::IdempotencyRecord;
use payments_domain::provider::Doubt;
use payments_domain::service::{
    ABANDONED_TOTAL, ChargeError, ChargeService, OnUnknown, log_abandoned,
};
use payments_domain::store::{ClaimAge, NewLease, Operation, Store, StoreError};
use payments_domain::time;

/// The reaper's records, by `result` (a metric name, defined and described
/// with the others in `payments_app::telemetry`).
pub use payments_app::telemetry::REAPER_RECORDS_TOTAL;

/// What one reaper pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReapReport {
    /// Finished with the provider's real outcome (201 or 402).
    pub reaped: u64,
    /// Given up on: `500 request_abandoned`, charge `unknown` (past
    /// `abandon_after` with the provider unreachable, or claimed too long
    /// ago to re-drive).
    pub abandoned: u64,
    /// Finished by another driver (an API retry) while the reaper drove it.
    pub finished_by_other: u64,
    /// Provider still unreachable or still processing our key, or another
    /// driver holds the record now; left for the next pass or that driver.
    pub left: u64,
    /// Failed for another reason (database error, missing charge).
    pub failed: u64,
    /// Dry run: records a pass would take over.
    pub would_reap: u64,
}

impl ReapReport {
    pub fn total(&self) -> u64 {
        self.reaped
            + self.abandoned
            + self.finished_by_other
            + self.left
            + self.failed
            + self.would_reap
    }
}

/// How the reaper works.
#[derive(Debug, Clone)]
pub struct ReaperSettings {
    pub lease: Duration,
    pub abandon_after: Duration,
    /// Records one pass handles at most.
    pub batch: u32,
    /// Provider calls at once.
    pub concurrency: u32,
}

/// Re-drives expired in-progress records.
#[derive(Debug, Clone)]
pub struct Reaper {
    service: Arc<ChargeService>,
    settings: ReaperSettings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    Reaped,
    Abandoned,
    FinishedByOther,
    Left,
    Failed,
}

impl ReapReport {
    /// Counts one record's outcome; its name for the metric's label.
    fn count(&mut self, handled: Handled) -> &'static str {
        let (count, name) = match handled {
            Handled::Reaped => (&mut self.reaped, "reaped"),
            Handled::Abandoned => (&mut self.abandoned, "abandoned"),
            Handled::FinishedByOther => (&mut self.finished_by_other, "finished_by_other"),
            Handled::Left => (&mut self.left, "left"),
            Handled::Failed => (&mut self.failed, "failed"),
        };
        *count += 1;
        name
    }
}

impl Reaper {
    pub fn new(service: Arc<ChargeService>, settings: ReaperSettings) -> Self {
        Self { service, settings }
    }

    fn store(&self) -> &Arc<dyn Store> {
        self.service.store()
    }

    /// The age past which a record is abandoned, never re-driven.
    fn redrive_limit(&self) -> Duration {
        self.service.policy().redrive_limit
    }

    /// One pass: takes over and re-drives (or abandons) up to `batch`
    /// records whose lease expired, `concurrency` at a time.
    pub async fn try_run_once(&self) -> Result<ReapReport, StoreError> {
        let started = std::time::Instant::now();
        let taken = Arc::new(AtomicU64::new(0));
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..self.settings.concurrency.max(1) {
            let reaper = self.clone();
            let taken = taken.clone();
            workers.spawn(async move { reaper.work(&taken).await });
        }
        let mut report = ReapReport::default();
        let mut first_error = None;
        while let Some(joined) = workers.join_next().await {
            match joined {
                Ok(Ok(part)) => {
                    report.reaped += part.reaped;
                    report.abandoned += part.abandoned;
                    report.finished_by_other += part.finished_by_other;
                    report.left += part.left;
                    report.failed += part.failed;
                }
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error
                        .get_or_insert(StoreError::Invariant(format!("reaper task failed: {e}")));
                }
            }
        }
        tracing::info!(
            reaped = report.reaped,
            abandoned = report.abandoned,
            finished_by_other = report.finished_by_other,
            left = report.left,
            failed = report.failed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "reap pass"
        );
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// One worker: take a record, drive it, repeat, until the batch is used
    /// up or nothing is left to take. Records too old to re-drive are taken
    /// first, each only to be abandoned.
    async fn work(&self, taken: &AtomicU64) -> Result<ReapReport, StoreError> {
        let mut report = ReapReport::default();
        let limit = self.redrive_limit();
        while taken.fetch_add(1, Ordering::SeqCst) < u64::from(self.settings.batch) {
            let lease = NewLease::new(self.settings.lease);
            let handled = if let Some(record) = self
                .store()
                .claim_expired(&lease, ClaimAge::AtLeast(limit))
                .await?
            {
                self.abandon_stale(&record, &lease).await
            } else if let Some(record) = self
                .store()
                .claim_expired(&lease, ClaimAge::Under(limit))
                .await?
            {
                self.redrive(&record, &lease).await
            } else {
                break;
            };
            let result = report.count(handled);
            metrics::counter!(REAPER_RECORDS_TOTAL, "result" => result).increment(1);
        }
        Ok(report)
    }

    /// The charge or refund the record drives.
    async fn operation_of(&self, record: &IdempotencyRecord) -> Option<Operation> {
        match self.store().operation(record).await {
            Ok(operation) => Some(operation),
            Err(e) => {
                tracing::error!(record_id = %record.id, error = %e, "reading the record's operation failed");
                None
            }
        }
    }

    /// A record claimed longer ago than the provider's key retention allows
    /// a re-drive: abandoned without a provider call.
    async fn abandon_stale(&self, record: &IdempotencyRecord, lease: &NewLease) -> Handled {
        let Some(operation) = self.operation_of(record).await else {
            return Handled::Failed;
        };
        let reason = "claimed longer ago than the provider's key retention allows a re-drive";
        self.give_up(record, lease, &operation, reason).await
    }

    async fn redrive(&self, record: &IdempotencyRecord, lease: &NewLease) -> Handled {
        let Some(operation) = self.operation_of(record).await else {
            return Handled::Failed;
        };
        let id = operation.id().to_owned();
        if let Err(e) = self.store().provider_called(&operation).await {
            tracing::error!(record_id = %record.id, operation = %id, error = %e, "stamping the provider call failed");
            return Handled::Failed;
        }
        let drive = self
            .service
            .drive(
                record.id,
                &lease.token,
                operation.clone(),
                OnUnknown::KeepLease,
            )
            .await;
        match drive {
            Ok(reply) if reply.replayed => {
                tracing::info!(
                    record_id = %record.id,
                    operation = %id,
                    status = reply.response.status,
                    "finished by another driver while the reaper drove it"
                );
                Handled::FinishedByOther
            }
            // The only fresh 500 a drive answers is its abandonment: the
            // provider replayed an error saved under the key.
            Ok(reply) if reply.response.status == 500 => {
                tracing::error!(
                    record_id = %record.id,
                    operation = %id,
                    "the provider replays a saved error: abandoned at once, for reconciliation"
                );
                Handled::Abandoned
            }
            Ok(reply) => {
                tracing::info!(
                    record_id = %record.id,
                    operation = %id,
                    key = %record.key,
                    status = reply.response.status,
                    "reaped: finished with the provider's outcome"
                );
                Handled::Reaped
            }
            // The provider is still processing our key: it may yet make the
            // charge or refund, so this is never a reason to give up, however
            // old the record (the key-retention guard still applies).
            Err(ChargeError::ProviderUnavailable {
                doubt: Doubt::InFlight,
                reason,
            }) => {
                tracing::warn!(record_id = %record.id, operation = %id, %reason, "the provider is still processing this key; left for the next pass, never abandoned for it");
                Handled::Left
            }
            // Our secret key is refused: a configuration error that says
            // nothing of the operation. Never abandoned for it; the record
            // waits, lease kept, until the key is fixed.
            Err(ChargeError::ProviderUnavailable {
                doubt: Doubt::KeyRefused,
                reason,
            }) => {
                tracing::error!(record_id = %record.id, operation = %id, %reason, "PROVIDER REFUSED OUR SECRET KEY: fix GATEWAY_SECRET_KEY; left as it is, never abandoned for this");
                Handled::Left
            }
            Err(ChargeError::ProviderUnavailable { reason, .. }) => {
                // The record's age is the database's, read when it was taken.
                if record.age < self.settings.abandon_after {
                    tracing::warn!(record_id = %record.id, operation = %id, %reason, "provider unreachable; left for the next pass");
                    return Handled::Left;
                }
                let reason = format!("provider unreachable past --abandon-after: {reason}");
                self.give_up(record, lease, &operation, &reason).await
            }
            // The provider holds the key's operation with other
            // parameters: the claim was undone (`ChargeService::drive`).
            Err(ChargeError::KeyReused) => {
                tracing::warn!(record_id = %record.id, operation = %id, "the provider holds this key's operation with other parameters: the claim was undone; reconcile finds the provider's operation");
                Handled::Abandoned
            }
            // Another driver took the record over, or it moved on.
            Err(ChargeError::InProgress) => {
                tracing::info!(record_id = %record.id, operation = %id, "another driver holds the record now; left to it");
                Handled::Left
            }
            Err(e) => {
                tracing::error!(record_id = %record.id, operation = %id, error = %e, "re-drive failed");
                Handled::Failed
            }
        }
    }

    /// Abandons a record the reaper holds: `500 request_abandoned`, its
    /// charge or refund `unknown`, and a loud log line for whoever
    /// reconciles it.
    async fn give_up(
        &self,
        record: &IdempotencyRecord,
        lease: &NewLease,
        operation: &Operation,
        reason: &str,
    ) -> Handled {
        match self
            .service
            .abandon(record.id, &lease.token, operation, reason)
            .await
        {
            Ok(reply) if !reply.replayed => {
                log_abandoned(
                    record.id,
                    operation,
                    None,
                    reason,
                    "provider outcome unknown; marked unknown, reconcile it with the provider",
                );
                metrics::counter!(ABANDONED_TOTAL, "reason" => "reaper").increment(1);
                Handled::Abandoned
            }
            Ok(_) => Handled::FinishedByOther,
            Err(ChargeError::InProgress) => Handled::Left,
            Err(e) => {
                tracing::error!(record_id = %record.id, error = %e, "abandoning failed");
                Handled::Failed
            }
        }
    }

    /// What a pass would do now, changing nothing.
    pub async fn dry_run(&self) -> Result<ReapReport, StoreError> {
        dry_run(self.store(), &self.settings, self.redrive_limit()).await
    }
}

/// What a reaper pass with `settings` would do now, changing nothing: it
/// only reads the database, so it needs no provider (`payments-jobs reap
/// --dry-run` without `GATEWAY_URL`). Records claimed `redrive_limit` ago
/// or longer would be abandoned, not re-driven.
pub async fn dry_run(
    store: &Arc<dyn Store>,
    settings: &ReaperSettings,
    redrive_limit: Duration,
) -> Result<ReapReport, StoreError> {
    let records = store.expired_in_progress(settings.batch).await?;
    for r in &records {
        tracing::info!(
            record_id = %r.id,
            operation = r.operation_id(),
            key = %r.key,
            claimed_at = %time::rfc3339(r.created_at),
            age_secs = r.age.as_secs(),
            action = if r.age >= redrive_limit { "abandon (past the key retention)" } else { "re-drive" },
            abandon_if_unreachable = r.age >= settings.abandon_after,
            "dry run: would take over"
        );
    }
    let report = ReapReport {
        would_reap: records.len() as u64,
        ..ReapReport::default()
    };
    tracing::info!(would_reap = report.would_reap, "reap dry run");
    Ok(report)
}
