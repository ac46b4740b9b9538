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
//! reaper give up and mark it for reconciliation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use payments_domain::idempotency::{IdempotencyRecord, Lease};
use payments_domain::service::{ChargeError, ChargeService, OnUnknown};
use payments_domain::store::{Store, StoreError};
use payments_domain::time;

/// What one reaper pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReapReport {
    /// Finished with the provider's real outcome (201 or 402).
    pub reaped: u64,
    /// Given up on: `500 request_abandoned`, charge `unknown`.
    pub abandoned: u64,
    /// Provider still unreachable; left for the next pass.
    pub left: u64,
    /// Failed for another reason (database error, missing charge).
    pub failed: u64,
    /// Dry run: records a pass would take over.
    pub would_reap: u64,
}

impl ReapReport {
    pub fn total(&self) -> u64 {
        self.reaped + self.abandoned + self.left + self.failed + self.would_reap
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
    Left,
    Failed,
}

impl Reaper {
    pub fn new(service: Arc<ChargeService>, settings: ReaperSettings) -> Self {
        Self { service, settings }
    }

    fn store(&self) -> &Arc<dyn Store> {
        self.service.store()
    }

    /// One pass at `now`: takes over and re-drives up to `batch` records
    /// whose lease expired, `concurrency` at a time.
    pub async fn try_run_once(&self, now: DateTime<Utc>) -> Result<ReapReport, StoreError> {
        let started = std::time::Instant::now();
        let taken = Arc::new(AtomicU64::new(0));
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..self.settings.concurrency.max(1) {
            let reaper = self.clone();
            let taken = taken.clone();
            workers.spawn(async move { reaper.work(now, &taken).await });
        }
        let mut report = ReapReport::default();
        let mut first_error = None;
        while let Some(joined) = workers.join_next().await {
            match joined {
                Ok(Ok(part)) => {
                    report.reaped += part.reaped;
                    report.abandoned += part.abandoned;
                    report.left += part.left;
                    report.failed += part.failed;
                }
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error
                        .get_or_insert(StoreError::Other(format!("reaper task failed: {e}")));
                }
            }
        }
        tracing::info!(
            reaped = report.reaped,
            abandoned = report.abandoned,
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

    /// One worker: claim, re-drive, repeat, until the batch is used up or
    /// nothing is left to take.
    async fn work(&self, now: DateTime<Utc>, taken: &AtomicU64) -> Result<ReapReport, StoreError> {
        let mut report = ReapReport::default();
        while taken.fetch_add(1, Ordering::SeqCst) < u64::from(self.settings.batch) {
            let lease = Lease::new(time::after(now, self.settings.lease));
            let Some(record) = self.store().claim_expired(now, &lease).await? else {
                break;
            };
            let handled = self.handle(&record, &lease, now).await;
            let result = match handled {
                Handled::Reaped => {
                    report.reaped += 1;
                    "reaped"
                }
                Handled::Abandoned => {
                    report.abandoned += 1;
                    "abandoned"
                }
                Handled::Left => {
                    report.left += 1;
                    "left"
                }
                Handled::Failed => {
                    report.failed += 1;
                    "failed"
                }
            };
            metrics::counter!("payments_reaper_records_total", "result" => result).increment(1);
        }
        Ok(report)
    }

    async fn handle(
        &self,
        record: &IdempotencyRecord,
        lease: &Lease,
        now: DateTime<Utc>,
    ) -> Handled {
        let charge = match self.store().charge(&record.charge_id).await {
            Ok(Some(charge)) => charge,
            Ok(None) => {
                tracing::error!(record_id = record.id, charge_id = %record.charge_id, "record's charge is missing");
                return Handled::Failed;
            }
            Err(e) => {
                tracing::error!(record_id = record.id, error = %e, "reading the charge failed");
                return Handled::Failed;
            }
        };
        let drive = self
            .service
            .drive(
                record.id,
                &lease.token,
                charge.clone(),
                OnUnknown::KeepLease,
            )
            .await;
        match drive {
            Ok(reply) => {
                tracing::info!(
                    record_id = record.id,
                    charge_id = %charge.id,
                    key = %record.key,
                    status = reply.response.status,
                    "reaped: finished with the provider's outcome"
                );
                Handled::Reaped
            }
            Err(ChargeError::ProviderUnavailable(reason)) => {
                if time::after(record.created_at, self.settings.abandon_after) > now {
                    tracing::warn!(record_id = record.id, charge_id = %charge.id, %reason, "provider unreachable; left for the next pass");
                    return Handled::Left;
                }
                match self.service.abandon(record.id, &lease.token, &charge).await {
                    Ok(reply) if !reply.replayed => {
                        tracing::error!(
                            record_id = record.id,
                            charge_id = %charge.id,
                            provider_key = %charge.provider_key,
                            customer_id = %charge.customer_id,
                            amount_cents = charge.amount_cents,
                            currency = %charge.currency,
                            %reason,
                            "ABANDONED: provider outcome unknown past --abandon-after; charge marked unknown, reconcile it with the provider"
                        );
                        Handled::Abandoned
                    }
                    // Someone else finished it meanwhile.
                    Ok(_) => Handled::Reaped,
                    Err(e) => {
                        tracing::error!(record_id = record.id, error = %e, "abandoning failed");
                        Handled::Failed
                    }
                }
            }
            // An API retry took the record over meanwhile: it is in hand.
            Err(ChargeError::InProgress) => Handled::Left,
            Err(e) => {
                tracing::error!(record_id = record.id, charge_id = %charge.id, error = %e, "re-drive failed");
                Handled::Failed
            }
        }
    }

    /// What a pass at `now` would do, changing nothing.
    pub async fn dry_run(&self, now: DateTime<Utc>) -> Result<ReapReport, StoreError> {
        let records = self
            .store()
            .expired_in_progress(now, self.settings.batch)
            .await?;
        for r in &records {
            let abandon = time::after(r.created_at, self.settings.abandon_after) <= now;
            tracing::info!(
                record_id = r.id,
                charge_id = %r.charge_id,
                key = %r.key,
                claimed_at = %time::rfc3339(r.created_at),
                abandon_if_unreachable = abandon,
                "dry run: would re-drive"
            );
        }
        let report = ReapReport {
            would_reap: records.len() as u64,
            ..ReapReport::default()
        };
        tracing::info!(would_reap = report.would_reap, "reap dry run");
        Ok(report)
    }
}
