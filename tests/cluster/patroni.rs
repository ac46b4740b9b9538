//! PostgreSQL under Patroni: a primary, a standby, HAProxy in front, and
//! the primary's machine dying under load. With synchronous replication
//! (the tested setting) nothing acknowledged is lost; with asynchronous
//! replication and the last commits kept from the standby on purpose,
//! acknowledged charges are lost by the promotion, and each comes back,
//! the same charge, through its client's retry with its key.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use payments_tests::patroni::{Patroni, Replication, timeline};
use payments_tests::{Backend, Process, TestDb};
use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::load::{Acknowledged, Load, api_env, provider_charges, sandbox};

/// Operations in the failover load.
const FAILOVER_OPS: usize = 1200;
/// Asynchronous run: operations the load finishes after the primary stopped
/// shipping WAL and before it is killed. Their commits are on the dying
/// primary only. Few, so that the standby stays within
/// `maximum_lag_on_failover` (1 MiB) and Patroni promotes it.
const UNSHIPPED_OPS: usize = 20;

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
/// record are on the new primary, right after the promotion and at the
/// end), and every operation finished with its retries. The jobs runner on
/// the same address goes on working after the failover too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_primary_killed_under_load_loses_and_doubles_nothing() {
    the_primary_killed_under_load(Replication::Synchronous).await;
}

/// The same failover with `synchronous_mode: false`, and a loss forced:
/// before the kill the primary's WAL sender is stopped (SIGSTOP), so the
/// primary goes on acknowledging charges the standby never receives, and
/// the promoted standby lacks them. Right after the promotion, at least one
/// charge answered 201 before the kill is missing on the new primary (its
/// claim gone, or its finish); each such operation's client retries with
/// its key and gets 201 with the same charge id (derived from the
/// operation, `docs/design-decisions.md`), and the provider, asked again
/// under the same provider key, answers from its idempotency record:
/// provider charges == operations, no double charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asynchronous_replication_loses_acknowledged_charges_and_retries_restore_them() {
    the_primary_killed_under_load(Replication::Asynchronous).await;
}

/// The charge ids on the database at `url`: every one, and those answered
/// (record complete with 201, charge succeeded).
async fn charges_on(url: &str) -> (HashSet<String>, HashSet<String>) {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    let all: HashSet<String> = sqlx::query_scalar("SELECT id FROM charges")
        .fetch_all(&mut conn)
        .await
        .expect("charges")
        .into_iter()
        .collect();
    let answered = sqlx::query_scalar(
        "SELECT c.id FROM charges c JOIN idempotent_requests r ON r.charge_id = c.id \
         WHERE r.state = 'complete' AND r.response_status = 201 AND c.status = 'succeeded'",
    )
    .fetch_all(&mut conn)
    .await
    .expect("charges")
    .into_iter()
    .collect();
    let _ = conn.close().await;
    (all, answered)
}

/// Bytes of WAL the primary at `url` wrote past what it sent its standby.
async fn unshipped_wal(url: &str) -> i64 {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    let bytes = sqlx::query_scalar(
        "SELECT COALESCE(MAX(pg_wal_lsn_diff(pg_current_wal_lsn(), sent_lsn)), 0)::int8 \
         FROM pg_stat_replication",
    )
    .fetch_one(&mut conn)
    .await
    .expect("pg_stat_replication");
    let _ = conn.close().await;
    bytes
}

/// The failover test, with `replication` between the nodes.
async fn the_primary_killed_under_load(replication: Replication) {
    let stack: &'static Patroni = match Patroni::start_with(replication) {
        Ok(stack) => Box::leak(Box::new(stack)),
        Err(skip) => {
            payments_tests::skip_or_panic("patroni", &skip);
            return;
        }
    };
    let db = TestDb::on_server(Backend::Postgres, Some(stack.url.clone()), 2).await;
    let db_name = db.url.rsplit('/').next().expect("db name").to_owned();
    let sandbox = sandbox("30").await;
    let mut env = api_env(&db.url, &sandbox.url).to_vec();
    if replication == Replication::Asynchronous {
        // No copies of answers in memory: a lost charge's retry must reach
        // the database, as after a replica's restart. With copies, a retry
        // at the replica holding one is answered from it (the same charge,
        // so nothing for the client to see) and the database stays without
        // the charge (`docs/scaling.md`).
        env.push(("REPLAY_CACHE_MB", "0"));
    }
    let replicas = [
        Process::start("payments-api", &[], &env).await,
        Process::start("payments-api", &[], &env).await,
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
    if replication == Replication::Asynchronous {
        // From here on the primary's commits stay on its own disk.
        stack
            .stop_wal_sender(old_leader)
            .await
            .expect("the primary's WAL sender stopped");
        load.until_completed(load.completed() + UNSHIPPED_OPS).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while load.in_flight(0) + load.in_flight(1) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let unshipped = unshipped_wal(&stack.nodes[old_leader].url("postgres")).await;
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

    // Right after the promotion, before any client retried them: the
    // operations acknowledged so far (every one whose commit was on the old
    // primary: the kill was ~10 s ago), read first, then the new primary's
    // rows (written since the promotion or shipped before the kill), on
    // the node itself, not through HAProxy.
    let primary = stack.nodes[new_leader].url(&db_name);
    let acknowledged_then = load.acknowledged();
    let (rows_then, answered_then) = charges_on(&primary).await;
    let lost: Vec<Acknowledged> = acknowledged_then
        .iter()
        .filter(|op| !answered_then.contains(&op.charge))
        .cloned()
        .collect();
    let claims_lost = lost
        .iter()
        .filter(|op| !rows_then.contains(&op.charge))
        .count();
    match replication {
        Replication::Synchronous => assert!(
            lost.is_empty(),
            "{} of {} acknowledged charges lost in the failover ({claims_lost} with their claim)",
            lost.len(),
            acknowledged_then.len()
        ),
        Replication::Asynchronous => assert!(
            !lost.is_empty(),
            "the promoted standby lacks no acknowledged charge ({} acknowledged, {unshipped} \
             bytes of WAL not shipped): the loss was not forced",
            acknowledged_then.len()
        ),
    }
    // Each lost operation's client retries with its key (a client that
    // learnt of the failover, or that never read its answer).
    let retries: Vec<_> = lost.iter().map(|op| load.retry(op)).collect();

    let rejoin = stack
        .rejoin(old_leader)
        .await
        .expect("the old primary rejoins");
    // Patroni's line for it (3.0): the old primary's own commits past the
    // fork, the lost ones, were rewound away.
    let rewound = stack.nodes[old_leader].log().contains("running pg_rewind");
    let report = load.finish().await;
    let mut retried = Vec::new();
    for retry in retries {
        retried.push(retry.await.expect("a retry's task"));
    }
    let restored = lost
        .iter()
        .zip(&retried)
        .filter(|(op, answered)| *answered == &Ok((op.charge.clone(), op.gateway.clone())))
        .count();
    let made = provider_charges(&sandbox).await;
    crate::load::report(&format!(
        "patroni failover ({}): {FAILOVER_OPS} operations; {in_flight} requests in flight; \
         {unshipped} bytes of WAL not shipped at the kill; node{} promoted {} ms after the kill \
         (timeline {old_timeline} -> {new_timeline}); {} of {} acknowledged charges missing on \
         the new primary ({claims_lost} with their claim), {restored} restored by their \
         client's retry with the same charge id and provider charge id; provider charges {made} (double charges {}); \
         old primary rejoined (streaming; pg_rewind: {rewound}) in {} ms; answers {:?}; replays {}; longest time with no \
         success {} ms",
        match replication {
            Replication::Synchronous => "synchronous",
            Replication::Asynchronous => "asynchronous",
        },
        new_leader + 1,
        promoted_after.as_millis(),
        lost.len(),
        acknowledged_then.len(),
        made.saturating_sub(FAILOVER_OPS),
        rejoin.as_millis(),
        report.answers,
        report.replays,
        report.longest_gap.as_millis()
    ));
    for (op, answered) in lost.iter().zip(&retried) {
        assert_eq!(
            answered,
            &Ok((op.charge.clone(), op.gateway.clone())),
            "the retry of a lost charge answers 201 with its charge id and provider charge id \
             (key {})",
            op.key
        );
    }
    if replication == Replication::Asynchronous {
        assert!(
            rewound,
            "the old primary, ahead of the new one, was rewound:\n{}",
            stack.nodes[old_leader].log()
        );
    }
    let acknowledged = report.assert_exactly_once(FAILOVER_OPS, &sandbox).await;
    // Every 201's charge and record on the new primary now, the restored
    // ones too.
    let (_, answered) = charges_on(&primary).await;
    assert!(
        acknowledged.is_subset(&answered),
        "{} acknowledged charges missing on the new primary at the end",
        acknowledged.difference(&answered).count()
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
