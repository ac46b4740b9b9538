//! The jobs: the reaper and the pruner against real databases and the real
//! sandbox, and `payments-jobs` as a process.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use payments_jobs::reaper::{Reaper, ReaperSettings};
use payments_jobs::reconciler::{ReconcileReport, Reconciler, ReconcilerSettings};
use payments_tests::{AppOptions, TestApp};

mod holds;
mod lag;
mod orphans;
mod pending_refunds;
mod provider;
mod pruner;
mod reaper;
mod reconcile_in_turn;
mod reconciler;
mod runner;
mod webhooks;

/// The app these tests run: they age records by SQL, which shortens a
/// record's TTL behind the back of a copy in memory, so no replay cache.
fn aged() -> AppOptions {
    AppOptions {
        replay_cache: false,
        ..AppOptions::default()
    }
}

/// A reaper with `payments-jobs`' defaults: a 10 s lease, abandoned after
/// 15 minutes, 500 a pass, 4 at once.
fn reaper(app: &TestApp) -> Reaper {
    Reaper::new(
        app.service.clone(),
        ReaperSettings {
            lease: Duration::from_secs(10),
            abandon_after: Duration::from_secs(15 * 60),
            batch: 500,
            concurrency: 4,
        },
    )
}

/// A reconciler with this search lag, 100 operations a pass.
fn reconciler(app: &TestApp, search_lag: Duration) -> Reconciler {
    Reconciler::new(
        app.service.clone(),
        ReconcilerSettings {
            search_lag,
            batch: 100,
            progress: payments_jobs::progress::ProgressSettings::default(),
            // Orphans have their own tests (`orphans.rs`).
            orphan_window: Duration::ZERO,
        },
    )
}

/// What a reconciler pass reports that settled `succeeded` operations as
/// succeeded and `not_made` as never made, and did nothing else.
fn settled(succeeded: u64, not_made: u64) -> ReconcileReport {
    ReconcileReport {
        succeeded,
        not_made,
        ..ReconcileReport::default()
    }
}

/// Ages the record of `cus_1`'s charge under `key` past the re-drive
/// limit; its retry with `body` is then abandoned without a provider call
/// (500, asserted), as the key-retention guard does.
async fn abandon_by_age(app: &TestApp, key: &str, body: &str) {
    let past = Duration::from_secs(23 * 3600 + 1800);
    app.db.age(Some(key), past).await;
    let retry = app.post_charge("cus_1", Some(key), body).await;
    assert_eq!(retry.status(), 500);
}

/// One reconciler pass with this search lag.
async fn reconcile(app: &TestApp, search_lag: Duration) -> ReconcileReport {
    reconciler(app, search_lag).try_run_once().await.unwrap()
}
