//! The pruner: deletes complete records past `expires_at`, in batches of a
//! bounded size, each its own short statement and transaction, so it never
//! holds locks for long nor keeps one long transaction open while the API is
//! claiming keys. It never deletes in-progress or abandoned records and
//! never touches `charges`. What has expired is decided in SQL by the
//! database's clock, whatever the clock of the host it runs on.
//!
//! Between batches it pauses: by default as long as the last batch took, so
//! it holds the database at most half the time, and at least the store's
//! [`Store::batch_pause_floor`]. On SQLite this is what lets the API write
//! at all while a large backlog is pruned: SQLite's lock is not fair, and a
//! writer in another process that finds it taken sleeps in the busy handler
//! (1, 2, 5, 10 ms ... up to 100 ms at a time) while a pruner that never
//! pauses takes the lock straight back (see `docs/benchmarks.md`).
//!
//! A long pass logs its progress (rows deleted, rate, time left against
//! the dry run's count, taken once the first report is due) every
//! `--progress-every`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payments_domain::store::{PrunedEvents, Store, StoreError};

use crate::progress::{Progress, ProgressSettings};

/// Records the pruner deleted (a metric name, defined and described with the
/// others in `payments_app::telemetry`).
pub use payments_app::telemetry::PRUNED_RECORDS_TOTAL;

/// What one pruner pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PruneReport {
    pub deleted: u64,
    pub batches: u64,
    /// Events deleted (past EVENT_RETENTION, every delivery made).
    pub events_deleted: u64,
    /// Provider events deleted (received EVENT_RETENTION ago, applied or
    /// ignored).
    pub provider_events_deleted: u64,
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

/// How long the pruner rests between batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// As long as the last batch took, at least the store's floor (the
    /// default).
    AsLongAsTheBatch,
    Fixed(Duration),
}

/// Deletes expired complete records.
#[derive(Debug, Clone)]
pub struct Pruner {
    store: Arc<dyn Store>,
    batch: u32,
    pause: Pause,
    progress: ProgressSettings,
    /// How long events are kept; `None`: events are not pruned.
    event_retention: Option<Duration>,
}

impl Pruner {
    /// `batch` rows per statement, or the store's
    /// [`Store::default_prune_batch`].
    pub fn new(store: Arc<dyn Store>, batch: Option<u32>) -> Self {
        let batch = batch.unwrap_or_else(|| store.default_prune_batch());
        Self {
            store,
            batch: batch.max(1),
            pause: Pause::AsLongAsTheBatch,
            progress: ProgressSettings::default(),
            event_retention: None,
        }
    }

    /// Prunes events too, `retention` after they were created (never one
    /// with a delivery still to make).
    pub fn with_event_retention(mut self, retention: Duration) -> Self {
        self.event_retention = Some(retention);
        self
    }

    /// How a long pass reports its progress.
    pub fn with_progress(mut self, progress: ProgressSettings) -> Self {
        self.progress = progress;
        self
    }

    pub fn with_pause(mut self, pause: Pause) -> Self {
        self.pause = pause;
        self
    }

    /// Deletes everything expired, one batch at a time.
    pub async fn try_run_once(&self) -> Result<PruneReport, StoreError> {
        let started = Instant::now();
        let mut report = PruneReport::default();
        let mut progress = Progress::start("prune", self.progress);
        loop {
            let batch_started = Instant::now();
            let deleted = match self.store.prune(self.batch).await {
                Ok(deleted) => deleted,
                Err(e) => {
                    progress.finish();
                    return Err(e);
                }
            };
            metrics::counter!(PRUNED_RECORDS_TOTAL).increment(deleted);
            report.deleted += deleted;
            report.batches += 1;
            if deleted < u64::from(self.batch) {
                break;
            }
            if progress.wants_total() {
                // What is left, as the dry run counts it: an estimate, as
                // rows keep expiring meanwhile.
                let left = self.store.count_prunable().await;
                if let Err(e) = &left {
                    tracing::warn!(error = %e, "counting the rows left to prune failed");
                }
                progress.set_total(left.ok().map(|left| report.deleted + left));
            }
            progress.update(report.deleted);
            self.rest(batch_started).await;
        }
        progress.finish();
        if let Some(retention) = self.event_retention {
            let pruned = self.prune_events(retention).await?;
            report.events_deleted = pruned.events;
            report.provider_events_deleted = pruned.provider_events;
        }
        report.elapsed = started.elapsed();
        tracing::info!(
            deleted = report.deleted,
            events_deleted = report.events_deleted,
            provider_events_deleted = report.provider_events_deleted,
            batches = report.batches,
            elapsed_ms = report.elapsed.as_millis() as u64,
            rows_per_sec = report.rate().round() as u64,
            "prune pass"
        );
        Ok(report)
    }

    /// Deletes the events past their retention whose deliveries are all
    /// made, and the provider events done with, one batch at a time, with
    /// the same pauses; the totals.
    async fn prune_events(&self, retention: Duration) -> Result<PrunedEvents, StoreError> {
        let mut deleted = PrunedEvents::default();
        loop {
            let batch_started = Instant::now();
            let pruned = self.store.prune_events(retention, self.batch).await?;
            deleted.events += pruned.events;
            deleted.deliveries += pruned.deliveries;
            deleted.provider_events += pruned.provider_events;
            // An event goes once all its deliveries have: with several
            // endpoints a full batch of deliveries frees fewer events, and
            // the pass goes on while any statement had more to do.
            let batch = u64::from(self.batch);
            if [pruned.events, pruned.deliveries, pruned.provider_events]
                .iter()
                .all(|n| *n < batch)
            {
                return Ok(deleted);
            }
            self.rest(batch_started).await;
        }
    }

    /// The rest between batches, which lets the API's transactions in.
    async fn rest(&self, batch_started: Instant) {
        let pause = match self.pause {
            Pause::AsLongAsTheBatch => batch_started.elapsed().max(self.store.batch_pause_floor()),
            Pause::Fixed(pause) => pause,
        };
        if pause.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(pause).await;
        }
    }

    /// How many rows a pass would delete now, changing nothing.
    pub async fn dry_run(&self) -> Result<PruneReport, StoreError> {
        let report = PruneReport {
            would_delete: self.store.count_prunable().await?,
            ..PruneReport::default()
        };
        tracing::info!(would_delete = report.would_delete, "prune dry run");
        Ok(report)
    }
}
