//! PostgreSQL under Patroni: a primary, a synchronous standby, HAProxy in
//! front, and the primary's machine dying under load.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use payments_tests::patroni::{Patroni, timeline};
use payments_tests::{Backend, Process, TestDb};
use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::load::{Load, replica, sandbox};

/// Operations in the failover load.
const FAILOVER_OPS: usize = 1200;

async fn count(url: &str, sql: &'static str) -> i64 {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar(sql)
        .fetch_one(&mut conn)
        .await
        .expect("count")
}

/// The primary node (Patroni and PostgreSQL) killed with SIGKILL while
/// requests are in flight, under a load of distinct and repeated keys
/// through two replicas on HAProxy's address: Patroni promotes the
/// synchronous standby (a new leader, a new timeline), the replicas'
/// pools reconnect without a restart, and at the end no operation was
/// charged twice, no acknowledged charge was lost (each 201's charge and
/// record are on the new primary), and every operation finished with its
/// retries. The jobs runner on the same address goes on working after the
/// failover too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_primary_killed_under_load_loses_and_doubles_nothing() {
    let stack: &'static Patroni = match Patroni::start() {
        Ok(stack) => Box::leak(Box::new(stack)),
        Err(skip) => {
            payments_tests::skip_or_panic("patroni", &skip);
            return;
        }
    };
    let db = TestDb::on_server(Backend::Postgres, Some(stack.url.clone()), 2).await;
    let sandbox = sandbox("30").await;
    let replicas = [
        replica(&db.url, &sandbox).await,
        replica(&db.url, &sandbox).await,
    ];
    let jobs_env = [
        ("DATABASE_URL", db.url.as_str()),
        ("GATEWAY_URL", sandbox.url.as_str()),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("REAP_EVERY", "1s"),
        ("DATABASE_ACQUIRE_TIMEOUT", "2s"),
    ];
    let (mut jobs, _jobs_stdout) = Process::spawn("payments-jobs", &["run"], &jobs_env);
    let old_leader = stack.leader().expect("a leader");
    let old_timeline = timeline(&stack.url).await.expect("timeline");

    let load = Load::start(
        replicas.iter().map(|r| r.url.clone()).collect(),
        FAILOVER_OPS,
        12,
    );
    load.until_completed(FAILOVER_OPS / 4).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while load.in_flight(0) + load.in_flight(1) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let in_flight = load.in_flight(0) + load.in_flight(1);
    let killed_at = Instant::now();
    stack.kill_node(old_leader);
    assert!(
        in_flight > 0,
        "requests were in flight when the primary died"
    );
    let new_leader = stack.new_leader(old_leader).await.expect("a failover");
    let promoted_after = killed_at.elapsed();
    // Patroni holds the lock a moment before PostgreSQL leaves recovery.
    let new_url = stack.nodes[new_leader].url("postgres");
    let mut new_timeline = timeline(&new_url).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while new_timeline.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        new_timeline = timeline(&new_url).await;
    }
    let new_timeline = new_timeline.expect("the new primary's timeline");
    assert!(
        new_timeline > old_timeline,
        "{old_timeline} -> {new_timeline}"
    );
    let rejoin = stack
        .rejoin(old_leader)
        .await
        .expect("the old primary rejoins");
    let report = load.finish().await;
    crate::load::report(&format!(
        "patroni failover: {in_flight} requests in flight; node{} promoted {} ms after the kill \
         (timeline {old_timeline} -> {new_timeline}); old primary rejoined as sync standby in \
         {} ms; answers {:?}; replays {}; longest time with no success {} ms",
        new_leader + 1,
        promoted_after.as_millis(),
        rejoin.as_millis(),
        report.answers,
        report.replays,
        report.longest_gap.as_millis()
    ));
    let acknowledged = report.assert_exactly_once(FAILOVER_OPS, &sandbox).await;
    // On the new primary itself, not through HAProxy.
    let primary = stack.nodes[new_leader].url(db.url.rsplit('/').next().expect("db name"));
    let mut conn = PgConnection::connect(&primary).await.expect("connect");
    let rows: HashSet<String> = sqlx::query_scalar(
        "SELECT c.id FROM charges c JOIN idempotent_requests r ON r.charge_id = c.id \
         WHERE r.state = 'complete' AND r.response_status = 201 AND c.status = 'succeeded'",
    )
    .fetch_all(&mut conn)
    .await
    .expect("charges")
    .into_iter()
    .collect();
    assert!(
        acknowledged.is_subset(&rows),
        "{} acknowledged charges lost in the failover",
        acknowledged.difference(&rows).count()
    );

    // The jobs runner's pool reconnected too: a record stuck now is reaped.
    let body = json!({"amount_cents": 4900, "currency": "GBP", "card_token": "tok_visa"});
    db.stuck_request(
        "stuck-after-failover",
        "cus_jobs",
        &body,
        Duration::from_secs(120),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let reaped = "SELECT COUNT(*) FROM idempotent_requests \
                  WHERE idempotency_key = 'stuck-after-failover' AND state = 'complete'";
    while count(&primary, reaped).await == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        count(&primary, reaped).await,
        1,
        "the jobs runner reaped after the failover:\n{}",
        jobs.log()
    );
    let _ = jobs.terminate(Duration::from_secs(10)).await;
}
