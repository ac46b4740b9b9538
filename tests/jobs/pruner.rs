//! The pruner keeps the key table small without touching what matters.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payments_jobs::pruner::Pause;
use payments_jobs::pruner::Pruner;
use payments_tests::{
    AppOptions, Backend, TestDb, backend_tests, charge_body, new_key, run_binary, spawn_app,
};

const EXPIRED: i64 = 100_000;

/// The digits 0-9 as a derived table: MySQL and MariaDB share no row
/// generator (no generate_series, differing recursion limits), but both
/// can cross-join this.
macro_rules! digits {
    () => {
        "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL \
         SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL \
         SELECT 8 UNION ALL SELECT 9)"
    };
}

/// `n` (at most 100,000) complete records named `<prefix>-<i>`, claimed two
/// days ago and expired a day ago, written in bulk.
async fn seed_expired(db: &TestDb, prefix: &str, n: i64) {
    let sqlite = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n}) \
         INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
         state, charge_id, response_status, response_body, response_content_type, created_at, \
         completed_at, expires_at) \
         SELECT '{prefix}-' || i, 'POST /api/charges', 'cus_old', \
         '0000000000000000000000000000000000000000000000000000000000000000', 'complete', \
         'ch_{prefix}_' || i, 201, '{{}}', 'application/json', \
         CAST(strftime('%s','now') AS INTEGER) * 1000 - 172800000, \
         CAST(strftime('%s','now') AS INTEGER) * 1000 - 172800000, \
         CAST(strftime('%s','now') AS INTEGER) * 1000 - 86400000 FROM n"
    );
    let postgres = format!(
        "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
         state, charge_id, response_status, response_body, response_content_type, created_at, \
         completed_at, expires_at) \
         SELECT '{prefix}-' || i, 'POST /api/charges', 'cus_old', repeat('0', 64), 'complete', \
         'ch_{prefix}_' || i, 201, '{{}}', 'application/json', now() - interval '2 days', \
         now() - interval '2 days', now() - interval '1 day' FROM generate_series(1, {n}) i"
    );
    let mysql = format!(
        concat!(
            "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
             state, charge_id, response_status, response_body, response_content_type, created_at, \
             completed_at, expires_at) \
             SELECT CONCAT('{prefix}-', n), 'POST /api/charges', 'cus_old', REPEAT('0', 64), \
             'complete', CONCAT('ch_{prefix}_', n), 201, '{{}}', 'application/json', \
             NOW(6) - INTERVAL 2 DAY, NOW(6) - INTERVAL 2 DAY, NOW(6) - INTERVAL 1 DAY \
             FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 1 AS n FROM ",
            digits!(),
            " a, ",
            digits!(),
            " b, ",
            digits!(),
            " c, ",
            digits!(),
            " e, ",
            digits!(),
            " f) nums WHERE n <= {n}"
        ),
        prefix = prefix,
        n = n
    );
    db.execute(&sqlite, &postgres, &mysql).await;
}

/// 100,000 expired complete records, fresh ones, and in-progress ones past
/// their expiry: one pass deletes exactly the expired complete ones, in
/// batches, touches no charge, and new charges keep succeeding meanwhile.
async fn prune_deletes_only_expired_complete_records(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let app = Arc::new(app);
    // Expired complete records (claimed two days ago), 100 charges, and 25
    // in-progress records past their expiry, all written in bulk.
    seed_expired(&app.db, "expired", EXPIRED).await;
    app.db
        .execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 25) \
             INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
             state, lease_token, locked_until, charge_id, created_at, expires_at) \
             SELECT 'stuck-' || i, 'POST /api/charges', 'cus_old', \
             '0000000000000000000000000000000000000000000000000000000000000000', 'in_progress', \
             'token', 0, 'ch_stuck_' || i, 0, 1 FROM n",
            "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
             state, lease_token, locked_until, charge_id, created_at, expires_at) \
             SELECT 'stuck-' || i, 'POST /api/charges', 'cus_old', repeat('0', 64), 'in_progress', \
             'token', now() - interval '3 days', 'ch_stuck_' || i, now() - interval '3 days', \
             now() - interval '2 days' FROM generate_series(1, 25) i",
            concat!(
                "INSERT INTO idempotent_requests (idempotency_key, route, customer_id, request_hash, \
                 state, lease_token, locked_until, charge_id, created_at, expires_at) \
                 SELECT CONCAT('stuck-', n), 'POST /api/charges', 'cus_old', REPEAT('0', 64), \
                 'in_progress', 'token', NOW(6) - INTERVAL 3 DAY, CONCAT('ch_stuck_', n), \
                 NOW(6) - INTERVAL 3 DAY, NOW(6) - INTERVAL 2 DAY \
                 FROM (SELECT a.d + 10 * b.d + 1 AS n FROM ",
                digits!(), " a, ", digits!(), " b) nums WHERE n <= 25"
            ),
        )
        .await;
    for _ in 0..100 {
        assert_eq!(
            app.post_charge("cus_new", Some(&new_key()), &charge_body(100, "tok_visa"))
                .await
                .status(),
            201
        );
    }
    assert_eq!(app.db.records().await, EXPIRED + 25 + 100);
    let charges_before = app.db.charges().await;

    let pruner = Pruner::new(app.db.store(), Some(5_000));
    let dry = pruner.dry_run().await.unwrap();
    assert_eq!(dry.would_delete, EXPIRED as u64);
    assert_eq!(
        app.db.records().await,
        EXPIRED + 25 + 100,
        "the dry run deleted nothing"
    );

    // Charges keep succeeding while the pruner runs.
    let charging = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..20 {
                statuses.push(
                    app.post_charge("cus_live", Some(&new_key()), &charge_body(100, "tok_visa"))
                        .await
                        .status()
                        .as_u16(),
                );
            }
            statuses
        })
    };
    let started = Instant::now();
    let report = pruner.try_run_once().await.unwrap();
    let elapsed = started.elapsed();
    let statuses = charging.await.unwrap();
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");
    eprintln!(
        "{backend:?}: pruned {} rows in {} batches in {:.2?} ({:.0} rows/s)",
        report.deleted,
        report.batches,
        elapsed,
        report.deleted as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(report.deleted, EXPIRED as u64);
    assert!(report.batches >= 20, "bounded batches of 5,000");
    assert_eq!(
        app.db.records().await,
        25 + 100 + 20,
        "fresh and in-progress records remain"
    );
    assert_eq!(
        app.db
            .count(
                "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'in_progress'",
                "SELECT COUNT(*) FROM idempotent_requests WHERE state = 'in_progress'",
                &[]
            )
            .await,
        25
    );
    assert_eq!(
        app.db.charges().await,
        charges_before + 20,
        "no charge was deleted"
    );
    // A second pass finds nothing.
    assert_eq!(pruner.try_run_once().await.unwrap().deleted, 0);
}

/// Unconfigured, the store decides the batch: 250 rows on SQLite, where a
/// batch holds the only write lock, 5,000 elsewhere. A configured pause is
/// taken between every two batches.
async fn pruner_batches_and_rests_as_configured(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let store = app.db.store();
    seed_expired(&app.db, "default", 600).await;
    let report = Pruner::new(store.clone(), None)
        .try_run_once()
        .await
        .unwrap();
    assert_eq!(report.deleted, 600);
    let batches = if backend == Backend::Sqlite { 3 } else { 1 };
    assert_eq!(report.batches, batches, "{backend:?}: 600 rows");

    seed_expired(&app.db, "paused", 600).await;
    let pause = Duration::from_millis(40);
    let started = Instant::now();
    let report = Pruner::new(store, Some(200))
        .with_pause(Pause::Fixed(pause))
        .try_run_once()
        .await
        .unwrap();
    assert_eq!((report.deleted, report.batches), (600, 4));
    // Three full batches, each followed by a rest; the fourth finds nothing.
    assert!(started.elapsed() >= pause * 3, "{:?}", started.elapsed());
}

/// `payments-jobs prune` on a backlog logs its progress: rows done of the
/// estimated total (the dry run's count), the rate and the time left.
/// `PROGRESS_EVERY=0s` reports after every batch; 600 rows in batches of
/// 100 are six.
async fn a_long_prune_logs_its_progress(backend: Backend) {
    let Some(db) = TestDb::new(backend, 2).await else {
        return;
    };
    seed_expired(&db, "backlog", 600).await;
    let env = [
        ("DATABASE_URL", db.url.as_str()),
        ("PRUNE_BATCH", "100"),
        ("PRUNE_PAUSE", "0s"),
        ("PROGRESS_EVERY", "0s"),
    ];
    let (ok, _, stderr) = run_binary("payments-jobs", &["prune", "--once"], &env).await;
    assert!(ok, "{stderr}");
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" progress "))
        .collect();
    assert_eq!(progress.len(), 6, "{stderr}");
    for (line, done) in progress.iter().zip((100..).step_by(100)) {
        for field in [
            "job=\"prune\"".to_owned(),
            format!("done={done} "),
            "total=600 ".to_owned(),
            "rows_per_sec=".to_owned(),
            "eta=".to_owned(),
        ] {
            assert!(line.contains(&field), "no {field} in {line}");
        }
    }
    assert!(stderr.contains("prune pass deleted=600"), "{stderr}");
}

/// An applied provider event with no changes.
fn provider_event(id: &str) -> payments_domain::store::Application {
    use payments_domain::inbox::{InboxState, Recorded};
    payments_domain::store::Application {
        record: Recorded {
            event_id: id.to_owned(),
            event_type: "charge.updated".to_owned(),
            gateway_charge_id: None,
            state: InboxState::Applied,
            detail: None,
        },
        changes: vec![],
        keep_for: Duration::from_secs(86_400),
    }
}

/// Events past EVENT_RETENTION delivered to two endpoints: one pass
/// prunes them all, in batches of 4, although a full batch of deliveries
/// frees only two events, and every provider event applied that long ago,
/// however many more batches they take; an event with a delivery still
/// pending stays.
async fn one_pass_prunes_every_old_event_delivered_to_several_endpoints(backend: Backend) {
    use payments_domain::store::NewLease;
    use payments_domain::webhook::{Attempted, Endpoint};
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let store = app.db.store();
    for _ in 0..11 {
        let charged = app
            .post_charge("cus_1", Some(&new_key()), &charge_body(700, "tok_visa"))
            .await;
        assert_eq!(charged.status(), 201);
    }
    let endpoint = |url: &str| Endpoint {
        url: url.to_owned(),
        secrets: vec!["whsec_pruner_test_0123456789abcdef".to_owned()],
        types: Default::default(),
    };
    let endpoints = [
        endpoint("https://a.example/hook"),
        endpoint("https://b.example/hook"),
    ];
    assert_eq!(store.dispatch_events(&endpoints, 100).await.unwrap(), 11);
    let leased = store
        .claim_deliveries(&NewLease::new(Duration::from_secs(60)), 100)
        .await
        .unwrap();
    assert_eq!(leased.len(), 22);
    // Every delivery made, but one: its event stays.
    for delivery in leased.iter().skip(1) {
        let token = delivery.lease_token.clone().unwrap();
        let delivered = Attempted::Delivered { status: 200 };
        store
            .attempted(&delivery.id, &token, &delivered)
            .await
            .unwrap();
    }
    // And 30 provider events applied: more batches than the events need.
    for i in 0..30 {
        let applied = store
            .apply_provider_event(&provider_event(&format!("evt_provider_{i}")))
            .await
            .unwrap();
        assert_eq!(applied, payments_domain::store::Applied::Applied);
    }
    app.db.age_outbox(Duration::from_secs(2 * 86_400)).await;
    let report = Pruner::new(store.clone(), Some(4))
        .with_pause(Pause::Fixed(Duration::ZERO))
        .with_event_retention(Duration::from_secs(86_400))
        .try_run_once()
        .await
        .unwrap();
    assert_eq!(report.events_deleted, 10, "{report:?}");
    assert_eq!(report.provider_events_deleted, 30, "{report:?}");
    let left = payments_tests::all_events(&store).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, leased[0].event.id);
}

backend_tests!(
    prune_deletes_only_expired_complete_records,
    pruner_batches_and_rests_as_configured,
    a_long_prune_logs_its_progress,
    one_pass_prunes_every_old_event_delivered_to_several_endpoints,
);
