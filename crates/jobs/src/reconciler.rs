//! Reconciliation: charges and refunds whose provider outcome is `unknown`
//! (abandoned by the reaper or the key-retention guard, or keyless calls
//! that timed out) are looked up at the provider by the id every call
//! carried in its metadata, and settled by what the provider's records
//! say. Found: `succeeded` or `failed`. Not found once the search lag
//! (`RECONCILE_SEARCH_LAG`, from the last provider call, by the database's
//! clock) has passed: nothing moved, `charge_not_made`. Calls made before
//! they carried the id are never concluded "not made": they are listed for
//! a person. An abandoned request's stored `request_abandoned` is replaced
//! by the real answer, so the client's retry with its original key gets it.
//!
//! Refunds the provider answered `pending` (answered 201 `pending` to the
//! client, their amount still reserved) are polled by the provider's id on
//! every pass until final: `succeeded`, or `failed`/`canceled` (failed, the
//! reservation released). Their stored 201 stays.
//!
//! A pass reads at most `batch` charges and `batch` refunds, least recently
//! looked at first: each one it looks at and cannot settle is stamped
//! (by the database's clock) and goes behind the others, so those that need
//! a person never hide the ones behind them, and every unsettled operation
//! is looked at within a bounded number of passes.
//!
//! Each pass then looks for orphans: the provider's charges and refunds of
//! the last `RECONCILE_ORPHAN_WINDOW` (past the same lag) that name one of
//! our operations with no row here, money moved with no record (a
//! database that lost its last writes, a client that never retried). Each
//! is recorded and logged `ORPHAN` once, counted in `payments_orphans`, and
//! settled when its operation has a row again.
//!
//! Each pass also applies again the provider webhooks recorded `waiting`
//! (an event naming an operation of ours that had no row yet): those whose
//! row is here now are applied ([`ChargeService::apply_waiting`]).
//!
//! Two reconcilers at once settle each operation once: the settlement is
//! guarded by the operation still being `unknown` (or pending).

use std::sync::Arc;
use std::time::Duration;

use payments_domain::service::{ChargeService, Decision, OrphanReport, WaitingReport};
use payments_domain::store::StoreError;

use crate::progress::{Progress, ProgressSettings};

/// How a reconciler works.
#[derive(Debug, Clone)]
pub struct ReconcilerSettings {
    /// How long after a provider call its object may still be missing from
    /// the provider's search (Stripe's: usually under a minute, at worst
    /// longer during outages).
    pub search_lag: Duration,
    /// Charges, and refunds, one pass looks at most.
    pub batch: u32,
    /// How far back a pass reads the provider's charges and refunds for
    /// orphans ([`ChargeService::find_orphans`]); zero: no search.
    pub orphan_window: Duration,
    /// How a long pass reports its progress (operations looked up).
    pub progress: ProgressSettings,
}

/// What one pass did (or, in a dry run, would do).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    pub succeeded: u64,
    pub failed: u64,
    pub not_made: u64,
    /// Settled by another reconciler between this one's read and its write.
    pub already_settled: u64,
    pub lagging: u64,
    pub needs_person: u64,
    pub lookup_failed: u64,
    /// Refunds still pending at the provider, left for the next pass.
    pub pending: u64,
    /// The orphan search's findings.
    pub orphans: OrphanReport,
    /// Provider webhooks applied again (none in a dry run).
    pub waiting: WaitingReport,
}

impl ReconcileReport {
    /// Operations settled by this pass.
    pub fn settled(&self) -> u64 {
        self.succeeded + self.failed + self.not_made
    }

    fn count(&mut self, decision: &Decision, applied: bool) {
        let slot = match decision {
            Decision::Settle { .. } if !applied => &mut self.already_settled,
            Decision::Settle { .. } => match decision.label() {
                "succeeded" => &mut self.succeeded,
                "not_made" => &mut self.not_made,
                _ => &mut self.failed,
            },
            Decision::Lagging => &mut self.lagging,
            Decision::NeedsPerson => &mut self.needs_person,
            Decision::LookupFailed(_) => &mut self.lookup_failed,
            Decision::Pending => &mut self.pending,
        };
        *slot += 1;
    }
}

/// Settles unknown outcomes from the provider's records.
#[derive(Debug, Clone)]
pub struct Reconciler {
    service: Arc<ChargeService>,
    settings: ReconcilerSettings,
}

impl Reconciler {
    pub fn new(service: Arc<ChargeService>, settings: ReconcilerSettings) -> Self {
        Self { service, settings }
    }

    /// One pass over the unsettled operations.
    pub async fn try_run_once(&self) -> Result<ReconcileReport, StoreError> {
        self.pass(true).await
    }

    /// What a pass would decide, changing nothing (every decision logged).
    pub async fn dry_run(&self) -> Result<ReconcileReport, StoreError> {
        self.pass(false).await
    }

    async fn pass(&self, apply: bool) -> Result<ReconcileReport, StoreError> {
        let store = self.service.store();
        // The lag runs from when the provider could last have acted on the
        // last call: its send time plus the provider's own time.
        let acts_within = self.service.policy().provider_acts_within;
        let lag = acts_within.saturating_add(self.settings.search_lag);
        let unsettled = store.unsettled(lag, self.settings.batch).await?;
        let mut report = ReconcileReport::default();
        let mut progress = Progress::start("reconcile", self.settings.progress);
        progress.set_total(Some(unsettled.len() as u64));
        for (done, operation) in (1u64..).zip(&unsettled) {
            if apply {
                let reconciled = self.service.reconcile(operation).await;
                let (decision, applied) = match reconciled {
                    Ok(reconciled) => reconciled,
                    Err(e) => {
                        progress.finish();
                        return Err(e);
                    }
                };
                report.count(&decision, applied);
            } else {
                let decision = self.service.reconciliation(operation).await;
                tracing::info!(
                    operation = operation.operation.id(),
                    decision = decision.label(),
                    "dry run: would decide"
                );
                report.count(&decision, true);
            }
            progress.update(done);
        }
        progress.finish();
        // Orphans are looked for past the same lag: a provider object
        // younger than it may belong to a claim whose client is retrying.
        if !self.settings.orphan_window.is_zero() {
            let window = self.settings.orphan_window;
            report.orphans = self.service.find_orphans(window, lag, apply).await?;
        }
        if apply {
            report.waiting = self.service.apply_waiting(self.settings.batch).await?;
        }
        // Each count its own field, so a JSON log can be queried by it.
        let orphans = report.orphans;
        tracing::info!(
            succeeded = report.succeeded,
            failed = report.failed,
            not_made = report.not_made,
            already_settled = report.already_settled,
            lagging = report.lagging,
            needs_person = report.needs_person,
            lookup_failed = report.lookup_failed,
            pending = report.pending,
            orphans_seen = orphans.seen,
            orphans_new = orphans.new,
            orphans_settled = orphans.settled,
            orphans_open = orphans.open,
            orphans_lookup_failed = orphans.lookup_failed,
            provider_events_retried = report.waiting.tried,
            provider_events_applied = report.waiting.done,
            dry_run = !apply,
            "reconcile pass"
        );
        Ok(report)
    }
}
