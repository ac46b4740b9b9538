//! The pruner: deletes complete records past `expires_at`, in batches of a
//! bounded size, each its own short statement and transaction, so it never
//! holds locks for long nor keeps one long transaction open while the API is
//! claiming keys. It never deletes in-progress records and never touches
//! `charges`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use payments_domain::store::{Store, StoreError};

/// What one pruner pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PruneReport {
    pub deleted: u64,
    pub batches: u64,
    pub elapsed: Duration,
    /// Dry run: rows a pass would delete.
    pub would_delete: u64,
}

impl PruneReport {
    /// Rows deleted per second.
    pub fn rate(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.deleted as f64 / secs
        } else {
            0.0
        }
    }
}

/// Deletes expired complete records.
#[derive(Debug, Clone)]
pub struct Pruner {
    store: Arc<dyn Store>,
    batch: u32,
}

impl Pruner {
    pub fn new(store: Arc<dyn Store>, batch: u32) -> Self {
        Self {
            store,
            batch: batch.max(1),
        }
    }

    /// Deletes everything expired at `now`, one batch at a time.
    pub async fn try_run_once(&self, now: DateTime<Utc>) -> Result<PruneReport, StoreError> {
        let started = Instant::now();
        let mut report = PruneReport::default();
        loop {
            let deleted = self.store.prune(now, self.batch).await?;
            metrics::counter!("payments_pruned_records_total").increment(deleted);
            report.deleted += deleted;
            report.batches += 1;
            if deleted < u64::from(self.batch) {
                break;
            }
            // Let the API's transactions in between batches.
            tokio::task::yield_now().await;
        }
        report.elapsed = started.elapsed();
        tracing::info!(
            deleted = report.deleted,
            batches = report.batches,
            elapsed_ms = report.elapsed.as_millis() as u64,
            rows_per_sec = report.rate().round() as u64,
            "prune pass"
        );
        Ok(report)
    }

    /// How many rows a pass at `now` would delete, changing nothing.
    pub async fn dry_run(&self, now: DateTime<Utc>) -> Result<PruneReport, StoreError> {
        let report = PruneReport {
            would_delete: self.store.count_prunable(now).await?,
            ..PruneReport::default()
        };
        tracing::info!(would_delete = report.would_delete, "prune dry run");
        Ok(report)
    }
}
