//! Holds (issue 27): a charge authorized with `"capture": false`, captured
//! in full or in part, or canceled, by the back office; each capture and
//! cancel exactly once, also against each other, decided in the claim's
//! transaction. Provider-side captures and releases are counted at the
//! sandbox, database-side ones in the test's database.

use std::sync::Arc;

use payments_tests::{
    Answer, AppOptions, Backend, TestApp, at_once, backend_tests, new_key, parallel_refunds,
    spawn_app,
};
use serde_json::{Value, json};

/// A hold of `amount` for `customer`: the 201's body (asserted).
async fn authorize(app: &TestApp, customer: &str, amount: i64) -> Value {
    let body = json!({
        "amount_cents": amount,
        "currency": "GBP",
        "card_token": "tok_visa",
        "capture": false,
    });
    let response = app
        .post_charge(customer, Some(&new_key()), &body.to_string())
        .await;
    let answer = Answer::of(response).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    assert_eq!(answer.body["status"], "requires_capture", "{}", answer.body);
    answer.body
}

/// `POST /api/charges/{id}/{action}` as the back-office subject `subject`
/// (with `charges:capture`).
async fn act(
    app: &TestApp,
    action: &str,
    subject: &str,
    charge_id: &str,
    key: &str,
    body: &Value,
) -> Answer {
    let token = app.back_office_token(subject, "charges:capture");
    act_with(app, &token, action, charge_id, Some(key), body).await
}

async fn act_with(
    app: &TestApp,
    token: &str,
    action: &str,
    charge_id: &str,
    key: Option<&str>,
    body: &Value,
) -> Answer {
    let mut request = app
        .http
        .post(format!("{}/api/charges/{charge_id}/{action}", app.base_url))
        .bearer_auth(token)
        .json(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    Answer::of(request.send().await.expect("request")).await
}

/// The captures the sandbox made of `gateway_charge_id`.
async fn sandbox_captures(app: &TestApp, gateway_charge_id: &str) -> Vec<Value> {
    let all = app.sandbox_get("/_sandbox/captures").await;
    let all = all["data"].as_array().cloned().unwrap_or_default();
    all.into_iter()
        .filter(|c| c["charge"] == gateway_charge_id)
        .collect()
}

/// The releases (refunds of the uncaptured charge) the sandbox made.
async fn sandbox_releases(app: &TestApp, gateway_charge_id: &str) -> usize {
    let refunds = app.sandbox_refunds().await;
    refunds
        .iter()
        .filter(|r| r["charge"] == gateway_charge_id)
        .count()
}

/// The captures (or cancels) in the database with `status`.
async fn captures_with(app: &TestApp, action: &str, status: &str) -> i64 {
    app.db
        .count(
            "SELECT COUNT(*) FROM captures WHERE action = ? AND status = ?",
            "SELECT COUNT(*) FROM captures WHERE action = $1 AND status = $2",
            &[action, status],
        )
        .await
}

fn code(answer: &Answer) -> Option<&str> {
    answer.body["error"]["code"].as_str()
}

/// The whole flow: authorize, a refund refused while nothing is captured,
/// a partial capture (the rest shown released), its replay, refunds up to
/// the captured part and no further; and every refusal around it: a
/// customer's token, no key, more than authorized, a charge that is no
/// hold, another key once captured.
async fn authorize_capture_in_part_and_refund_the_captured_part(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let hold = authorize(&app, "cus_alice", 1000).await;
    let id = hold["id"].as_str().unwrap();
    let gateway_id = hold["gateway_charge_id"].as_str().unwrap();
    assert_eq!(
        (
            &hold["captured"],
            &hold["amount_captured"],
            &hold["amount_cents"]
        ),
        (&json!(false), &json!(0), &json!(1000))
    );
    assert!(hold["capture_before"].is_string(), "{hold}");
    assert!(sandbox_captures(&app, gateway_id).await.is_empty());

    let mut counted = Vec::new();
    for series in [
        r#"payments_captures_total{action="capture",outcome="succeeded"}"#,
        r#"payments_captures_total{action="capture",outcome="refused"}"#,
        r#"payments_captures_total{action="cancel",outcome="refused"}"#,
    ] {
        counted.push((series, sample(&app, series).await));
    }

    // Nothing captured, nothing to refund: refused, not stored.
    let early = app.post_refund("ops_bob", id, &new_key(), &json!({})).await;
    assert_eq!(
        (early.status, code(&early)),
        (400, Some("charge_not_refundable"))
    );

    // A customer cannot capture, even its own hold; no key; too much; no
    // such charge. Nothing stored: the key works afterwards.
    let key = new_key();
    let office = app.back_office_token("ops_bob", "charges:capture");
    let too_much = json!({"amount_cents": 1001});
    for (token, charge, key, body, expected) in [
        (
            app.token("cus_alice"),
            id,
            Some(&key),
            json!({}),
            (403, "insufficient_scope"),
        ),
        (
            office.clone(),
            id,
            None,
            json!({}),
            (400, "idempotency_key_missing"),
        ),
        (
            office.clone(),
            id,
            Some(&key),
            too_much,
            (400, "invalid_request"),
        ),
        (
            office,
            "ch_nothere",
            Some(&key),
            json!({}),
            (404, "not_found"),
        ),
    ] {
        let refused = act_with(
            &app,
            &token,
            "capture",
            charge,
            key.map(String::as_str),
            &body,
        )
        .await;
        let seen = (refused.status, code(&refused));
        assert_eq!(seen, (expected.0, Some(expected.1)), "{}", refused.body);
        if expected.1 == "invalid_request" {
            assert_eq!(refused.body["error"]["param"], "amount_cents");
        }
    }
    assert!(sandbox_captures(&app, gateway_id).await.is_empty());

    // The same key, fixed: a partial capture; the rest is released.
    let part = json!({"amount_cents": 600});
    let captured = act(&app, "capture", "ops_bob", id, &key, &part).await;
    assert_eq!(captured.status, 201, "{}", captured.body);
    let charge = &captured.body;
    assert_eq!(charge["id"], *id);
    assert_eq!(charge["status"], "succeeded");
    assert_eq!(
        (
            &charge["captured"],
            &charge["amount_captured"],
            &charge["amount_released"]
        ),
        (&json!(true), &json!(600), &json!(400))
    );
    assert_eq!(charge["amount_refunded"], 0, "released, not refunded");
    let replay = act(&app, "capture", "ops_bob", id, &key, &part).await;
    assert_eq!((replay.status, &replay.body), (201, &captured.body));
    assert_eq!(
        replay
            .headers
            .get("idempotent-replay")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    let captures = sandbox_captures(&app, gateway_id).await;
    assert_eq!(captures.len(), 1);
    assert_eq!(captures[0]["amount"], 600);
    let read = app.get_as("cus_alice", &format!("/api/charges/{id}")).await;
    assert_eq!(read.body["status"], "succeeded");
    assert_eq!(read.body["amount_captured"], 600);

    // Another key, once captured: a stored, final 400, also for a cancel.
    for action in ["capture", "cancel"] {
        refused(&app, action, id, "charge_already_captured").await;
    }
    assert_eq!(sandbox_captures(&app, gateway_id).await.len(), 1);
    assert_eq!(sandbox_releases(&app, gateway_id).await, 0);

    // Refunds fit in what was captured.
    let all = app.post_refund("ops_bob", id, &new_key(), &json!({})).await;
    assert_eq!(all.status, 201, "{}", all.body);
    assert_eq!(all.body["amount_cents"], 600);
    let more = app
        .post_refund("ops_bob", id, &new_key(), &json!({"amount_cents": 1}))
        .await;
    assert_eq!(
        (more.status, code(&more)),
        (400, Some("refund_exceeds_charge"))
    );

    // Counted: one capture succeeded, two refusals stored. (Counters are
    // process-wide and other tests run alongside: each went up by at
    // least this test's.)
    for (series, was) in &counted {
        let now = sample(&app, series).await;
        assert!(now >= was + 1.0, "{series} went from {was} to {now}");
    }

    // A charge captured when made is no hold: captured already.
    let plain = app
        .charge_json("cus_alice", &payments_tests::charge_body(500, "tok_visa"))
        .await;
    assert_eq!(plain["captured"], true);
    let plain_id = plain["id"].as_str().unwrap();
    let capture = act(&app, "capture", "ops_bob", plain_id, &new_key(), &json!({})).await;
    assert_eq!(
        (capture.status, code(&capture)),
        (400, Some("charge_already_captured"))
    );
    // A cancel takes no amount.
    let bad = act(
        &app,
        "cancel",
        "ops_bob",
        id,
        &new_key(),
        &json!({"amount_cents": 5}),
    )
    .await;
    assert_eq!((bad.status, code(&bad)), (400, Some("invalid_request")));
}

/// A cancel releases the whole hold, once; then a capture with another key
/// is a stored `charge_canceled`, and nothing can be refunded.
async fn a_cancel_releases_the_hold(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let hold = authorize(&app, "cus_alice", 800).await;
    let id = hold["id"].as_str().unwrap();
    let gateway_id = hold["gateway_charge_id"].as_str().unwrap();
    let key = new_key();
    let canceled = act(&app, "cancel", "ops_bob", id, &key, &json!({})).await;
    assert_eq!(canceled.status, 201, "{}", canceled.body);
    assert_eq!(canceled.body["status"], "canceled");
    assert_eq!(
        (
            &canceled.body["captured"],
            &canceled.body["amount_released"]
        ),
        (&json!(false), &json!(800))
    );
    let replay = act(&app, "cancel", "ops_bob", id, &key, &json!({})).await;
    assert_eq!((replay.status, &replay.body), (201, &canceled.body));
    assert_eq!(sandbox_releases(&app, gateway_id).await, 1);
    for action in ["capture", "cancel"] {
        refused(&app, action, id, "charge_canceled").await;
    }
    let refund = app.post_refund("ops_bob", id, &new_key(), &json!({})).await;
    assert_eq!(
        (refund.status, code(&refund)),
        (400, Some("charge_not_refundable"))
    );
    assert!(sandbox_captures(&app, gateway_id).await.is_empty());
    assert_eq!(sandbox_releases(&app, gateway_id).await, 1);
    assert_eq!(captures_with(&app, "cancel", "succeeded").await, 1);
    let listed = app
        .get_as("cus_alice", "/api/charges?status=canceled")
        .await;
    assert_eq!(listed.body["data"][0]["id"], *id, "{}", listed.body);
}

/// Twenty parallel captures of one hold under one key: one capture at the
/// provider; every answer is the capture's 201 or a 409 while it runs.
async fn parallel_captures_with_one_key_capture_once(backend: Backend) {
    const CALLS: usize = 20;
    let Some((app, id, gateway_id)) = slow_hold(backend).await else {
        return;
    };
    let key = new_key();
    let answers = race(&app, CALLS, |_| ("capture", id.clone(), key.clone())).await;
    let created = answers.iter().filter(|a| a.status == 201).count();
    for answer in &answers {
        assert!(
            answer.status == 201
                || (answer.status == 409 && code(answer) == Some("request_in_progress")),
            "{}: {}",
            answer.status,
            answer.body
        );
    }
    assert!(created >= 1);
    assert_eq!(sandbox_captures(&app, &gateway_id).await.len(), 1);
    assert_eq!(captures_with(&app, "capture", "succeeded").await, 1);
    let after = act(&app, "capture", "ops_bob", &id, &key, &json!({})).await;
    assert_eq!(after.status, 201, "{}", after.body);
}

/// Twenty parallel captures of one hold, each under its own key: one
/// capture at the provider and one 201; the others are 409 `hold_in_use`
/// while it is pending (not stored: no record) or a stored 400
/// `charge_already_captured` once it succeeded.
async fn parallel_captures_with_many_keys_capture_once(backend: Backend) {
    const CALLS: usize = 20;
    let Some((app, id, gateway_id)) = slow_hold(backend).await else {
        return;
    };
    let answers = race(&app, CALLS, |_| ("capture", id.clone(), new_key())).await;
    let (mut created, mut busy, mut refused) = (0, 0, 0);
    for answer in &answers {
        match (answer.status, code(answer)) {
            (201, _) => created += 1,
            (409, Some("hold_in_use")) => busy += 1,
            (400, Some("charge_already_captured")) => refused += 1,
            _ => panic!("{}: {}", answer.status, answer.body),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(created + busy + refused, CALLS);
    assert_eq!(sandbox_captures(&app, &gateway_id).await.len(), 1);
    assert_eq!(captures_with(&app, "capture", "succeeded").await, 1);
    let records = app
        .db
        .count(
            "SELECT COUNT(*) FROM idempotent_requests WHERE route = ?",
            "SELECT COUNT(*) FROM idempotent_requests WHERE route = $1",
            &["POST /api/charges/{id}/capture"],
        )
        .await;
    assert_eq!(records, (created + refused) as i64, "a 409 stores nothing");
}

/// Captures against cancels: twenty concurrent requests of both kinds,
/// each with its own key, ten rounds. In each, exactly one request wins
/// and exactly one kind reaches the provider (one capture, or one release,
/// never both), and the database agrees with the sandbox.
async fn captures_race_cancels_and_one_kind_wins(backend: Backend) {
    const CALLS: usize = 20;
    const ROUNDS: usize = 10;
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let app = Arc::new(app);
    for round in 0..ROUNDS {
        let hold = authorize(&app, "cus_alice", 1000).await;
        let id = hold["id"].as_str().unwrap().to_owned();
        let gateway_id = hold["gateway_charge_id"].as_str().unwrap().to_owned();
        let answers = race(&app, CALLS, |i| {
            let action = if (i + round) % 2 == 0 {
                "capture"
            } else {
                "cancel"
            };
            (action, id.clone(), new_key())
        })
        .await;
        let winners: Vec<_> = answers.iter().filter(|a| a.status == 201).collect();
        assert_eq!(winners.len(), 1, "round {round}");
        for answer in answers.iter().filter(|a| a.status != 201) {
            assert!(
                matches!(
                    (answer.status, code(answer)),
                    (409, Some("hold_in_use"))
                        | (400, Some("charge_already_captured" | "charge_canceled"))
                ),
                "{}: {}",
                answer.status,
                answer.body
            );
        }
        let captures = sandbox_captures(&app, &gateway_id).await.len();
        let releases = sandbox_releases(&app, &gateway_id).await;
        assert_eq!(captures + releases, 1, "round {round}: one kind, once");
        let read = app.get_as("cus_alice", &format!("/api/charges/{id}")).await;
        let expected = if captures == 1 {
            "succeeded"
        } else {
            "canceled"
        };
        assert_eq!(read.body["status"], expected, "round {round}");
        assert_eq!(winners[0].body["status"], expected);
    }
}

/// After a partial capture, twenty parallel refunds of 100 ask for four
/// times what was captured: five are made, and the provider refunds the
/// captured 500 and no more.
async fn refunds_never_exceed_the_captured_part(backend: Backend) {
    const REFUNDS: usize = 20;
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let app = Arc::new(app);
    let hold = authorize(&app, "cus_alice", 1000).await;
    let id = hold["id"].as_str().unwrap().to_owned();
    let captured = act(
        &app,
        "capture",
        "ops_bob",
        &id,
        &new_key(),
        &json!({"amount_cents": 500}),
    )
    .await;
    assert_eq!(captured.status, 201, "{}", captured.body);
    let made = parallel_refunds(&app, &id, REFUNDS, 100, |_| "ops_bob".to_owned()).await;
    assert_eq!(made, 5);
    assert_eq!(app.sandbox_refunded().await, 500);
    let read = app.get_as("cus_alice", &format!("/api/charges/{id}")).await;
    assert_eq!(read.body["amount_refunded"], 500);
}

/// A hold within the capture margin of lapsing, or lapsed and marked
/// `expired` by the jobs runner (by the database's clock), is refused
/// `hold_expired` and stored, without a capture call to the provider. A
/// cancel of a hold not lapsed yet still releases it. Without the
/// provider's `capture_before`, the hold lapses `HOLD_EXPIRY` after its
/// authorization.
async fn lapsing_holds_are_refused_without_a_provider_call(backend: Backend) {
    let options = AppOptions {
        hold_capture_margin: Some(std::time::Duration::from_secs(60)),
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    app.configure_sandbox(json!({"hold_expiry_seconds": 30}))
        .await;
    let lapsing = authorize(&app, "cus_alice", 1000).await;
    let id = lapsing["id"].as_str().unwrap();
    refused(&app, "capture", id, "hold_expired").await;
    let calls = app.sandbox_requests().await;
    assert!(!calls.iter().any(|c| c.ends_with("/capture")), "{calls:?}");
    // Within the margin a cancel still releases the hold.
    let canceled = act(&app, "cancel", "ops_bob", id, &new_key(), &json!({})).await;
    assert_eq!(canceled.status, 201, "{}", canceled.body);

    // Lapsed: the jobs runner marks it, and a capture is refused.
    app.configure_sandbox(json!({"hold_expiry_seconds": 1}))
        .await;
    let lapsed = authorize(&app, "cus_alice", 1000).await;
    let lapsed_id = lapsed["id"].as_str().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(app.service.store().expire_holds(100).await.unwrap(), 1);
    let read = app
        .get_as("cus_alice", &format!("/api/charges/{lapsed_id}"))
        .await;
    assert_eq!(read.body["status"], "expired");
    assert_eq!(read.body["amount_released"], 1000);
    for action in ["capture", "cancel"] {
        refused(&app, action, lapsed_id, "hold_expired").await;
    }
    let calls = app.sandbox_requests().await;
    assert!(!calls.iter().any(|c| c.ends_with("/capture")), "{calls:?}");

    // No capture_before from the provider: HOLD_EXPIRY (7 days) after
    // the authorization.
    app.configure_sandbox(json!({"send_capture_before": false}))
        .await;
    let fallback = authorize(&app, "cus_alice", 1000).await;
    let created =
        chrono::DateTime::parse_from_rfc3339(fallback["created_at"].as_str().unwrap()).unwrap();
    let lapses =
        chrono::DateTime::parse_from_rfc3339(fallback["capture_before"].as_str().unwrap()).unwrap();
    assert_eq!(lapses - created, chrono::Duration::days(7));
}

/// An app whose provider takes 300 ms a call, with a hold of 1000 made
/// before it slowed: the app, the hold's id and the provider's.
async fn slow_hold(backend: Backend) -> Option<(Arc<TestApp>, String, String)> {
    let app = Arc::new(spawn_app(backend, AppOptions::default()).await?);
    let hold = authorize(&app, "cus_alice", 1000).await;
    let id = |field: &str| hold[field].as_str().unwrap().to_owned();
    app.configure_sandbox(json!({"latency_ms": 300})).await;
    Some((app.clone(), id("id"), id("gateway_charge_id")))
}

/// A capture the provider refuses because the hold lapsed there (its
/// `capture_before` unknown here, so `HOLD_EXPIRY` said it had days left):
/// a stored 400 `hold_expired`, the capture failed, the hold `expired`.
async fn a_capture_the_provider_finds_lapsed_expires_the_hold(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let sandbox = json!({"hold_expiry_seconds": 1, "send_capture_before": false});
    app.configure_sandbox(sandbox).await;
    let hold = authorize(&app, "cus_alice", 1000).await;
    let id = hold["id"].as_str().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    refused(&app, "capture", id, "hold_expired").await;
    let read = app.get_as("cus_alice", &format!("/api/charges/{id}")).await;
    assert_eq!(read.body["status"], "expired");
    assert_eq!(captures_with(&app, "capture", "failed").await, 1);
    let calls = app.sandbox_requests().await;
    assert_eq!(calls.iter().filter(|c| c.ends_with("/capture")).count(), 1);
}

/// A hold made without a key (`IDEMPOTENCY_KEY_MODE=optional`, a
/// rollout) lapses `HOLD_EXPIRY` after its authorization like any other
/// and is captured like one.
async fn a_keyless_hold_in_rollout_mode_is_captured(backend: Backend) {
    let options = AppOptions {
        key_mode: payments_api::config::KeyMode::Optional,
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    app.configure_sandbox(json!({"send_capture_before": false}))
        .await;
    let body =
        json!({"amount_cents": 800, "currency": "GBP", "card_token": "tok_visa", "capture": false});
    let hold = Answer::of(app.post_charge("cus_alice", None, &body.to_string()).await).await;
    assert_eq!(hold.status, 201, "{}", hold.body);
    assert_eq!(hold.body["status"], "requires_capture");
    assert!(hold.body["capture_before"].is_string(), "{}", hold.body);
    let id = hold.body["id"].as_str().unwrap();
    let captured = act(&app, "capture", "ops_bob", id, &new_key(), &json!({})).await;
    assert_eq!(captured.status, 201, "{}", captured.body);
    assert_eq!(captured.body["amount_captured"], 800);
}

/// `action` of the hold `id` under a new key: a 400 `code`, stored (the
/// same key gets it again, byte for byte).
async fn refused(app: &TestApp, action: &str, id: &str, code_: &str) {
    let key = new_key();
    let answer = act(app, action, "ops_bob", id, &key, &json!({})).await;
    let what = format!("{action}: {}", answer.body);
    assert_eq!((answer.status, code(&answer)), (400, Some(code_)), "{what}");
    let replay = act(app, action, "ops_bob", id, &key, &json!({})).await;
    assert_eq!((replay.status, &replay.body), (400, &answer.body), "{what}");
}

/// The value of one series (`name{labels}`) in `/metrics`, 0 if absent.
async fn sample(app: &TestApp, series: &str) -> f64 {
    let text = app.metrics_text().await;
    let line = text.lines().find(|l| l.starts_with(&format!("{series} ")));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Fires `calls` capture or cancel requests at once (`what(i)`: the
/// action, the charge and the key), by one back-office subject; their
/// answers.
async fn race(
    app: &Arc<TestApp>,
    calls: usize,
    what: impl Fn(usize) -> (&'static str, String, String),
) -> Vec<Answer> {
    at_once(calls, |i| {
        let app = app.clone();
        let (action, id, key) = what(i);
        async move { act(&app, action, "ops_bob", &id, &key, &json!({})).await }
    })
    .await
}

backend_tests!(
    authorize_capture_in_part_and_refund_the_captured_part,
    a_cancel_releases_the_hold,
    parallel_captures_with_one_key_capture_once,
    refunds_never_exceed_the_captured_part,
    lapsing_holds_are_refused_without_a_provider_call,
    a_capture_the_provider_finds_lapsed_expires_the_hold,
    a_keyless_hold_in_rollout_mode_is_captured,
);

backend_tests!(all;
    parallel_captures_with_many_keys_capture_once,
    captures_race_cancels_and_one_kind_wins,
);
