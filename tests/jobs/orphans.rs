//! Orphans: charges and refunds the provider made for one of our
//! operations that has no row here (the database lost its last writes and
//! the client never came back). `payments-jobs reconcile` finds each past
//! the search lag, records it once, counts it in `payments_orphans`, and
//! settles it when the client's retry adopts the provider's object.

use std::time::Duration;

use payments_jobs::reconciler::{ReconcileReport, Reconciler, ReconcilerSettings};
use payments_tests::{
    AppOptions, Backend, TestApp, backend_tests, charge_body, new_key, spawn_app,
};
use serde_json::json;

const CUSTOMER: &str = "cus_orphan";

/// A pass's lag counts from when the provider could last act on a call:
/// GATEWAY_TIMEOUT + PROVIDER_MAX_PROCESSING (here 2 s) + the search lag.
async fn app(backend: Backend) -> Option<TestApp> {
    let options = AppOptions {
        replay_cache: false,
        gateway_timeout: Duration::from_secs(1),
        provider_max_processing: Some(Duration::from_secs(1)),
        ..AppOptions::default()
    };
    spawn_app(backend, options).await
}

/// Past the 2 s every pass's lag starts with (whole seconds at the
/// provider).
async fn past_the_provider_window() {
    tokio::time::sleep(Duration::from_secs(4)).await;
}

/// One reconcile pass that looks for orphans over the last hour, with
/// this search lag (no unknown operations to settle here).
async fn pass(app: &TestApp, search_lag: Duration) -> ReconcileReport {
    let reconciler = Reconciler::new(
        app.service.clone(),
        ReconcilerSettings {
            search_lag,
            batch: 100,
            progress: payments_jobs::progress::ProgressSettings::default(),
            orphan_window: Duration::from_secs(3600),
        },
    );
    reconciler.try_run_once().await.unwrap()
}

/// What `payments_orphans{kind}` says now.
async fn gauge(app: &TestApp, kind: &str) -> String {
    let needle = format!("payments_orphans{{kind=\"{kind}\"}} ");
    let text = app.metrics_text().await;
    text.lines()
        .find_map(|line| line.strip_prefix(&needle))
        .unwrap_or("absent")
        .to_owned()
}

/// A charge lost with the database's tail, whose client never retries: an
/// orphan once the lag has passed (not before), recorded once, settled
/// when the client does come back.
async fn a_lost_charge_is_found_as_an_orphan_and_settled_by_its_retry(backend: Backend) {
    let Some(app) = app(backend).await else {
        return;
    };
    // A charge whose row stays is never an orphan.
    let kept = app
        .post_charge(CUSTOMER, Some(&new_key()), &charge_body(300, "tok_visa"))
        .await;
    assert_eq!(kept.status(), 201);
    app.db.snapshot().await;
    let key = new_key();
    let body = charge_body(4200, "tok_visa");
    assert_eq!(
        app.post_charge(CUSTOMER, Some(&key), &body).await.status(),
        201
    );
    app.db.lose_tail().await;

    // The lag still hides it: its client may be retrying right now.
    let hidden = pass(&app, Duration::from_secs(3600)).await;
    assert_eq!(hidden.orphans.seen, 0, "{hidden:?}");
    assert_eq!(hidden.orphans.new, 0, "{hidden:?}");

    past_the_provider_window().await;
    let found = pass(&app, Duration::ZERO).await;
    assert_eq!(
        found.orphans.seen, 2,
        "both provider charges are ours: {found:?}"
    );
    assert_eq!(found.orphans.new, 1, "{found:?}");
    assert_eq!(found.orphans.open, 1, "{found:?}");
    assert_eq!(gauge(&app, "charge").await, "1");
    let open = app.db.store().open_orphans(10).await.unwrap();
    let provider = &app.sandbox_charges().await[1];
    assert_eq!(open.len(), 1);
    let orphan = &open[0].object;
    assert_eq!(orphan.provider_id, provider["id"].as_str().unwrap());
    assert_eq!(
        orphan.operation_id,
        provider["metadata"]["payments_charge_id"].as_str().unwrap()
    );
    assert_eq!(
        (orphan.amount_cents, orphan.currency.as_str()),
        (4200, "GBP")
    );

    // Recorded once.
    let again = pass(&app, Duration::ZERO).await;
    assert_eq!((again.orphans.new, again.orphans.open), (0, 1), "{again:?}");

    // The client comes back: its retry adopts the provider's charge, and
    // the next pass settles the orphan.
    let retry = app.post_charge(CUSTOMER, Some(&key), &body).await;
    assert_eq!(retry.status(), 201);
    let settled = pass(&app, Duration::ZERO).await;
    assert_eq!(
        (settled.orphans.settled, settled.orphans.open),
        (1, 0),
        "{settled:?}"
    );
    assert_eq!(gauge(&app, "charge").await, "0");
    assert_eq!(
        app.sandbox_charges().await.len(),
        2,
        "no charge was made by any of this"
    );
}

/// A refund lost with the tail is an orphan of its own kind.
async fn a_lost_refund_is_found_as_an_orphan(backend: Backend) {
    let Some(app) = app(backend).await else {
        return;
    };
    let charged = app
        .charge_json(CUSTOMER, &charge_body(5000, "tok_visa"))
        .await;
    let charge_id = charged["id"].as_str().unwrap();
    app.db.snapshot().await;
    let refunded = app
        .post_refund(
            CUSTOMER,
            charge_id,
            &new_key(),
            &json!({ "amount_cents": 1500 }),
        )
        .await;
    assert_eq!(refunded.status, 201, "{:?}", refunded.body);
    app.db.lose_tail().await;

    past_the_provider_window().await;
    let found = pass(&app, Duration::ZERO).await;
    assert_eq!(found.orphans.new, 1, "{found:?}");
    let open = app.db.store().open_orphans(10).await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].object.kind.as_str(), "refund");
    assert_eq!(
        open[0].object.operation_id,
        refunded.body["id"].as_str().unwrap()
    );
    assert_eq!(open[0].object.amount_cents, 1500);
    assert_eq!(gauge(&app, "refund").await, "1");
}

backend_tests!(
    serializable;
    a_lost_charge_is_found_as_an_orphan_and_settled_by_its_retry,
    a_lost_refund_is_found_as_an_orphan,
);
