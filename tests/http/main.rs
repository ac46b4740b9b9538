//! HTTP tests: the real router on loopback, in front of the real sandbox
//! over HTTP, on each backend. Provider-side charges are counted at the
//! sandbox, database-side charges in the test's own database.
#![allow(clippy::unwrap_used)]

mod events;
mod hardening;
mod holds;
mod idempotency;
mod incident;
mod index;
mod lifecycle;
mod limits;
mod lost_tail;
mod mismatch;
mod observability;
mod provider;
mod provider_webhooks;
mod roles;
mod time;
mod validation;

/// One reaper pass over the app's database, as `payments-jobs reap --once`
/// runs it with the default settings.
async fn reap_once(app: &payments_tests::TestApp) -> payments_jobs::reaper::ReapReport {
    use payments_jobs::reaper::{Reaper, ReaperSettings};
    let reaper = Reaper::new(
        app.service.clone(),
        ReaperSettings {
            lease: std::time::Duration::from_secs(10),
            abandon_after: std::time::Duration::from_secs(15 * 60),
            batch: 500,
            concurrency: 4,
        },
    );
    reaper.try_run_once().await.unwrap()
}

/// One pruner pass over the app's database; returns the rows deleted.
async fn prune_once(app: &payments_tests::TestApp) -> u64 {
    let pruner = payments_jobs::pruner::Pruner::new(app.db.store(), None);
    pruner.try_run_once().await.unwrap().deleted
}
