//! Reconciliation never starves (issue 23, section 2): a pass reads at most
//! a batch of unsettled charges (and of refunds), and those it cannot settle
//! (they need a person) must not come first on every pass, hiding the ones
//! behind them for ever. Every unsettled operation is looked at within
//! ceil(unsettled / batch) passes.

use crate::aged;
use std::time::Duration;

use payments_jobs::reconciler::{Reconciler, ReconcilerSettings};
use payments_tests::{Backend, TestApp, backend_tests, charge_body, new_key, spawn_app};
use serde_json::{Value, json};

const BATCH: u32 = 2;
/// Operations that need a person, in front of the one that can be settled.
const IN_FRONT: u32 = 3;

/// A charge abandoned with its outcome unknown: the provider answered as
/// `sandbox` says (503), then the record was aged past the re-drive limit
/// and retried, which abandons it (500).
async fn abandoned_charge(app: &TestApp, sandbox: Value) {
    let key = new_key();
    let body = charge_body(4900, "tok_visa");
    app.configure_sandbox(sandbox).await;
    let first = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(first.status(), 503);
    app.configure_sandbox(json!({})).await;
    app.db
        .age(Some(&key), Duration::from_secs(23 * 3600 + 1800))
        .await;
    let again = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(again.status(), 500);
}

/// A refund of 100 abandoned the same way.
async fn abandoned_refund(app: &TestApp, charge_id: &str, sandbox: Value) {
    let key = new_key();
    let body = json!({"amount_cents": 100});
    app.configure_sandbox(sandbox).await;
    let first = app.post_refund("cus_1", charge_id, &key, &body).await;
    assert_eq!(first.status, 503, "{}", first.body);
    app.configure_sandbox(json!({})).await;
    app.db
        .age(Some(&key), Duration::from_secs(23 * 3600 + 1800))
        .await;
    let again = app.post_refund("cus_1", charge_id, &key, &body).await;
    assert_eq!(again.status, 500, "{}", again.body);
}

/// Batch 2; three charges and three refunds that need a person (their calls
/// named nothing to find them by), older than one charge and one refund
/// the provider did make. The two behind are settled within
/// ceil(4 / 2) = 2 passes; the six in front stay unknown.
async fn operations_a_pass_cannot_settle_do_not_hide_the_rest(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_1", &charge_body(10_000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().unwrap();
    for _ in 0..IN_FRONT {
        abandoned_charge(&app, json!({"error_rate": 1.0})).await;
        abandoned_refund(&app, charge_id, json!({"error_rate": 1.0})).await;
    }
    // Their calls named nothing: not finding them proves nothing.
    for table in ["charges", "refunds"] {
        let sql = format!("UPDATE {table} SET provider_called_at = NULL WHERE status = 'unknown'");
        assert_eq!(app.db.execute(&sql, &sql, &sql).await, u64::from(IN_FRONT));
    }
    // Behind them: made at the provider, its answer lost.
    abandoned_charge(&app, json!({"drop_after_charge": true})).await;
    abandoned_refund(&app, charge_id, json!({"drop_after_charge": true})).await;
    assert_eq!(app.db.charges_with_status("unknown").await, 4);
    assert_eq!(app.db.refunds_with_status("unknown").await, 4);

    let reconciler = Reconciler::new(
        app.service.clone(),
        ReconcilerSettings {
            search_lag: Duration::ZERO,
            batch: BATCH,
            progress: payments_jobs::progress::ProgressSettings::default(),
            // Orphans have their own tests (`orphans.rs`).
            orphan_window: Duration::ZERO,
        },
    );
    let bound = (IN_FRONT + 1).div_ceil(BATCH);
    let mut reports = Vec::new();
    for _ in 0..bound {
        reports.push(reconciler.try_run_once().await.unwrap());
    }
    let settled: u64 = reports.iter().map(|r| r.succeeded).sum();
    assert_eq!(
        (
            settled,
            app.db.charges_with_status("succeeded").await,
            app.db.refunds_with_status("succeeded").await
        ),
        (2, 2, 1),
        "the charge and the refund behind {IN_FRONT} that need a person are settled within \
         {bound} passes of {BATCH}: {reports:?}"
    );
    assert_eq!(
        app.db.charges_with_status("unknown").await,
        i64::from(IN_FRONT)
    );
    assert_eq!(
        app.db.refunds_with_status("unknown").await,
        i64::from(IN_FRONT)
    );
    let needs_person: u64 = reports.iter().map(|r| r.needs_person).sum();
    assert_eq!(
        needs_person,
        2 * u64::from(IN_FRONT),
        "each looked at once: {reports:?}"
    );
}

backend_tests!(operations_a_pass_cannot_settle_do_not_hide_the_rest);
