//! Provider webhooks in (issue 29), against the real sandbox sending them
//! signed to the real server: a refund made in the provider's dashboard, a
//! refund that fails after it succeeded, disputes through to won and lost,
//! a late success for an operation left unknown; every bad delivery
//! refused before anything is read or changed.

use std::time::Duration;

use payments_client::webhook::sign;
use payments_tests::{
    Answer, AppOptions, Backend, TEST_WEBHOOK_SECRET, TestApp, backend_tests, charge_body, new_key,
    spawn_app,
};
use serde_json::{Value, json};

/// How long the tests wait for the sandbox's webhooks to be applied.
const WITHIN: Duration = Duration::from_secs(30);

fn with_webhooks() -> AppOptions {
    AppOptions {
        provider_webhooks: true,
        ..AppOptions::default()
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// `POST /webhooks/provider` with `body` and, when given, `signature`.
async fn deliver(app: &TestApp, body: &[u8], signature: Option<&str>) -> Answer {
    let mut request = app
        .http
        .post(format!("{}/webhooks/provider", app.base_url))
        .header("content-type", "application/json")
        .body(body.to_vec());
    if let Some(signature) = signature {
        request = request.header("stripe-signature", signature);
    }
    Answer::of(request.send().await.expect("request")).await
}

/// `body` signed now with the app's secret.
fn signed(body: &[u8]) -> String {
    sign(&[TEST_WEBHOOK_SECRET], now(), body)
}

async fn provider_events(app: &TestApp) -> i64 {
    app.db
        .count(
            "SELECT COUNT(*) FROM provider_events",
            "SELECT COUNT(*) FROM provider_events",
            &[],
        )
        .await
}

/// Polls `read` until `done` says so, at most [`WITHIN`]: the last value.
async fn eventually<T>(mut read: impl AsyncFnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let value = read().await;
        if done(&value) || tokio::time::Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn office(app: &TestApp) -> String {
    app.back_office_token(
        "ops_hooks",
        "refunds:write charges:read_all events:read disputes:read",
    )
}

async fn charge_read(app: &TestApp, id: &str) -> Value {
    app.get_with(&office(app), &format!("/api/charges/{id}"))
        .await
        .body
}

/// Something happens at the provider (a POST of `body` to the sandbox's
/// `path`, which must answer 200), then the charge `id` is read until
/// `done` holds (its webhooks applied). The sandbox's answer and the read.
async fn at_provider_then(
    app: &TestApp,
    (path, body): (&str, Value),
    id: &str,
    done: impl Fn(&Value) -> bool,
) -> (Value, Value) {
    let happened = app.sandbox_post(path, &body).await;
    assert_eq!(happened.status, 200, "{path}: {}", happened.body);
    let read = eventually(async || charge_read(app, id).await, &done).await;
    if !done(&read) {
        panic!(
            "{path} {body}: the charge never showed it: {read}\nthe sandbox's webhooks: {:#}",
            json!(app.sandbox_webhooks().await)
        );
    }
    (happened.body, read)
}

/// Moves the sandbox's dispute `dispute` to `status`; the charge `id` read
/// once it shows it.
async fn dispute_moves(app: &TestApp, dispute: &str, status: &str, id: &str) -> Value {
    let path = format!("/_sandbox/disputes/{dispute}");
    let moved = (path.as_str(), json!({"status": status}));
    at_provider_then(app, moved, id, |c| c["dispute"]["status"] == status)
        .await
        .1
}

/// The data of `object_id`'s one event of type `event_type`.
async fn event_data(app: &TestApp, object_id: &str, event_type: &str) -> Value {
    let events = payments_tests::all_events(&app.db.store()).await;
    let mut data = events
        .into_iter()
        .filter(|e| e.object_id == object_id && e.event_type == event_type)
        .map(|e| serde_json::from_str::<Value>(&e.data).unwrap());
    let one = data.next().expect("the event");
    assert!(data.next().is_none(), "one {event_type} of {object_id}");
    one
}

async fn event_types(app: &TestApp, object_id: &str) -> Vec<String> {
    let events = payments_tests::all_events(&app.db.store()).await;
    let mut types: Vec<String> = events
        .into_iter()
        .filter(|e| e.object_id == object_id)
        .map(|e| e.event_type)
        .collect();
    types.sort();
    types
}

/// A bad delivery: what it is, its signature, its body, the status and
/// code it gets.
type BadCase = (&'static str, Option<String>, Vec<u8>, u16, &'static str);

/// Unsigned, tampered, stale, signed with another secret, twice signed,
/// too large, not JSON, not an event: 400 or 413, and nothing recorded.
/// An event of a type not applied, or about a charge that is none of ours,
/// is acknowledged (200), recorded, and a duplicate of it changes nothing.
async fn bad_deliveries_change_nothing(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_hooks", &charge_body(2000, "tok_visa"))
        .await;
    let provider_id = charge["gateway_charge_id"].as_str().unwrap();
    let event = json!({
        "id": "evt_bad_1", "object": "event", "type": "charge.refunded",
        "data": {"object": {"object": "charge", "id": provider_id}}
    })
    .to_string();
    let body = event.as_bytes();
    let cases: Vec<BadCase> = vec![
        ("unsigned", None, body.to_vec(), 400, "invalid_signature"),
        (
            "another secret",
            Some(sign(&["whsec_another_0123456789abcdefgh"], now(), body)),
            body.to_vec(),
            400,
            "invalid_signature",
        ),
        (
            "ten minutes old",
            Some(sign(&[TEST_WEBHOOK_SECRET], now() - 600, body)),
            body.to_vec(),
            400,
            "invalid_signature",
        ),
        (
            "tampered",
            Some(signed(body)),
            event.replace("evt_bad_1", "evt_bad_2").into_bytes(),
            400,
            "invalid_signature",
        ),
        (
            "malformed header",
            Some("t=abc,v1=zz".to_owned()),
            body.to_vec(),
            400,
            "invalid_signature",
        ),
        (
            "not JSON",
            Some(signed(b"{not json")),
            b"{not json".to_vec(),
            400,
            "invalid_request",
        ),
        (
            "not an event",
            Some(signed(b"{\"id\":\"evt_x\"}")),
            b"{\"id\":\"evt_x\"}".to_vec(),
            400,
            "invalid_request",
        ),
    ];
    for (case, signature, body, status, code) in cases {
        let answer = deliver(&app, &body, signature.as_deref()).await;
        assert_eq!(answer.status, status, "{case}: {}", answer.body);
        assert_eq!(answer.body["error"]["code"], code, "{case}");
    }
    // Two signature headers.
    let answer = app
        .http
        .post(format!("{}/webhooks/provider", app.base_url))
        .header("stripe-signature", signed(body))
        .header("stripe-signature", signed(body))
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    // A mebibyte, validly signed: refused unread.
    let huge = format!(
        r#"{{"id":"evt_huge","type":"charge.refunded","pad":"{}"}}"#,
        "x".repeat(1 << 20)
    );
    // The server answers from Content-Length and closes without reading
    // the body, so a client still writing it may see its pipe broken
    // before the answer: sent again until the answer is read.
    let mut answer = None;
    for _ in 0..20 {
        let sent = app
            .http
            .post(format!("{}/webhooks/provider", app.base_url))
            .header("stripe-signature", signed(huge.as_bytes()))
            .body(huge.clone())
            .send()
            .await;
        if let Ok(response) = sent {
            answer = Some(Answer::of(response).await);
            break;
        }
    }
    let answer = answer.expect("the 413 was read once in 20 tries");
    assert_eq!(
        (answer.status, &answer.body["error"]["code"]),
        (413, &json!("payload_too_large"))
    );
    assert_eq!(provider_events(&app).await, 0, "nothing recorded");
    assert_eq!(app.db.refunds_with_status("").await, 0, "nothing changed");

    // Acknowledged and recorded; the same again is a duplicate.
    let other = json!({"id": "evt_customer", "type": "customer.created",
        "data": {"object": {"object": "customer", "id": "cus_x"}}})
    .to_string();
    for outcome in ["ignored", "duplicate"] {
        let answer = deliver(&app, other.as_bytes(), Some(&signed(other.as_bytes()))).await;
        assert_eq!(
            (answer.status, &answer.body["outcome"]),
            (200, &json!(outcome))
        );
    }
    // A charge made at the provider by someone else: none of ours.
    let foreign = app
        .http
        .post(format!("{}/v1/charges", app.sandbox.url()))
        .bearer_auth("sk_test_sandbox")
        .form(&[
            ("amount", "700"),
            ("currency", "gbp"),
            ("source", "tok_visa"),
        ])
        .send()
        .await
        .unwrap();
    let foreign: Value = foreign.json().await.unwrap();
    let foreign = json!({"id": "evt_foreign", "type": "charge.succeeded",
        "data": {"object": {"object": "charge", "id": foreign["id"]}}})
    .to_string();
    let answer = deliver(&app, foreign.as_bytes(), Some(&signed(foreign.as_bytes()))).await;
    assert_eq!(
        (answer.status, &answer.body["outcome"]),
        (200, &json!("ignored")),
        "{}",
        answer.body
    );
    assert_eq!(provider_events(&app).await, 2);
    assert!(
        app.metrics_text()
            .await
            .contains("payments_provider_events_total{outcome=\"rejected\"}")
    );
}

/// A refund made in the provider's dashboard arrives as a refund of the
/// charge (actor `provider`), counts against what is left, goes out as an
/// event; our own refund's webhooks are matched to it, never doubled; the
/// dashboard refund failing days later gives its amount back.
async fn a_dashboard_refund_arrives_and_fails_later(backend: Backend) {
    let Some(app) = spawn_app(backend, with_webhooks()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_hooks", &charge_body(5000, "tok_visa"))
        .await;
    let id = charge["id"].as_str().unwrap();
    let provider_id = charge["gateway_charge_id"].as_str().unwrap();
    let path = format!("/_sandbox/charges/{provider_id}/refunds");
    let (made, _) = at_provider_then(&app, (&path, json!({"amount": 1500})), id, |c| {
        c["amount_refunded"] == 1500
    })
    .await;
    let provider_refund = made["id"].as_str().unwrap().to_owned();
    let refunds = app
        .get_with(&office(&app), &format!("/api/charges/{id}/refunds"))
        .await;
    let listed = refunds.body["data"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{}", refunds.body);
    assert_eq!(listed[0]["requested_by"]["role"], "provider");
    assert_eq!(listed[0]["gateway_refund_id"], provider_refund.as_str());
    assert_eq!(listed[0]["status"], "succeeded");
    let refund_id = listed[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(event_types(&app, &refund_id).await, ["refund.succeeded"]);
    let shown = app
        .get_with(&office(&app), &format!("/api/refunds/{refund_id}"))
        .await;
    assert_eq!(
        event_data(&app, &refund_id, "refund.succeeded").await,
        shown.body,
        "the event's data is the refund as it was made, dated by the database"
    );

    // What is left is what the dashboard left; our own refund of it is
    // matched by its metadata when its webhooks come, never created twice.
    app.assert_refund_does_not_fit(id, 4000).await;
    let ours = app
        .post_refund("ops_1", id, &new_key(), &json!({"amount_cents": 3500}))
        .await;
    assert_eq!(ours.status, 201, "{}", ours.body);
    assert!(
        app.webhooks_delivered(WITHIN).await,
        "every webhook delivered"
    );
    let read = charge_read(&app, id).await;
    assert_eq!(read["amount_refunded"], 5000);
    assert_eq!(app.sandbox_refunded().await, 5000);
    assert_eq!(app.db.refunds_with_status("").await, 2);

    // The dashboard refund fails days later: its amount comes back.
    let path = format!("/_sandbox/refunds/{provider_refund}");
    let failed = json!({"status": "failed", "failure_reason": "expired_or_canceled_card"});
    at_provider_then(&app, (&path, failed), id, |c| c["amount_refunded"] == 3500).await;
    let refund = app
        .get_with(&office(&app), &format!("/api/refunds/{refund_id}"))
        .await;
    assert_eq!(refund.body["status"], "failed");
    assert_eq!(refund.body["failure_code"], "expired_or_canceled_card");
    assert_eq!(
        event_types(&app, &refund_id).await,
        ["refund.failed", "refund.succeeded"]
    );
    assert!(app.webhooks_delivered(WITHIN).await);
    assert_eq!(app.sandbox_refunded().await, 3500);
}

/// Disputes: an inquiry, escalated, lost; another won. Each reaches the
/// charge's read, the back office's list and the outgoing events; refunds
/// are refused while the dispute says the charge is not refundable.
async fn disputes_reach_the_reads_the_list_and_the_events(backend: Backend) {
    let Some(app) = spawn_app(backend, with_webhooks()).await else {
        return;
    };
    let office = office(&app);
    let charge = app
        .charge_json("cus_hooks", &charge_body(3000, "tok_visa"))
        .await;
    let id = charge["id"].as_str().unwrap();
    let provider_id = charge["gateway_charge_id"].as_str().unwrap();
    let path = format!("/_sandbox/charges/{provider_id}/disputes");
    let inquiry = (path.as_str(), json!({"inquiry": true}));
    let (opened, read) = at_provider_then(&app, inquiry, id, |c| !c["dispute"].is_null()).await;
    let dispute = opened["id"].as_str().unwrap().to_owned();
    assert_eq!(
        read["dispute"]["status"], "warning_needs_response",
        "{read}"
    );
    assert_eq!(read["dispute"]["gateway_dispute_id"], dispute.as_str());
    assert_eq!(read["dispute"]["is_charge_refundable"], true);
    let local_dispute = read["dispute"]["id"].as_str().unwrap();
    assert_eq!(
        event_data(&app, local_dispute, "charge.dispute.created").await,
        read["dispute"],
        "the event's data is the dispute as it was made, dated by the database"
    );
    // The back office lists it; a customer may not.
    let listed = app.get_with(&office, "/api/disputes").await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.body["data"][0]["charge_id"], id);
    let denied = app.get_as("cus_hooks", "/api/disputes").await;
    assert_eq!(denied.status, 403);
    let bad = app.get_with(&office, "/api/disputes?status=closed").await;
    assert_eq!(
        (bad.status, &bad.body["error"]["param"]),
        (400, &json!("status"))
    );

    // Escalated: refunds refused while it stands.
    let read = dispute_moves(&app, &dispute, "needs_response", id).await;
    assert_eq!(read["dispute"]["is_charge_refundable"], false, "{read}");
    let refused = app
        .post_refund("ops_1", id, &new_key(), &json!({"amount_cents": 100}))
        .await;
    assert_eq!(
        (refused.status, &refused.body["error"]["code"]),
        (400, &json!("charge_disputed"))
    );
    assert!(
        app.sandbox_refunds().await.is_empty(),
        "the provider was never asked"
    );

    // Lost: closed, no longer listed as open.
    dispute_moves(&app, &dispute, "lost", id).await;
    let open = app.get_with(&office, "/api/disputes").await;
    assert_eq!(open.body["data"], json!([]));
    let all = app.get_with(&office, "/api/disputes?status=all").await;
    assert_eq!(all.body["data"].as_array().unwrap().len(), 1);
    let local_dispute = all.body["data"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        event_types(&app, &local_dispute).await,
        [
            "charge.dispute.closed",
            "charge.dispute.created",
            "charge.dispute.funds_withdrawn",
            "charge.dispute.updated"
        ]
    );

    // Another charge's dispute is won: refunds are allowed again.
    let charge = app
        .charge_json("cus_hooks", &charge_body(3000, "tok_visa"))
        .await;
    let id = charge["id"].as_str().unwrap();
    let provider_id = charge["gateway_charge_id"].as_str().unwrap();
    let opened = app
        .sandbox_post(
            &format!("/_sandbox/charges/{provider_id}/disputes"),
            &json!({}),
        )
        .await;
    let dispute = opened.body["id"].as_str().unwrap().to_owned();
    dispute_moves(&app, &dispute, "won", id).await;
    let refund = app
        .post_refund("ops_1", id, &new_key(), &json!({"amount_cents": 100}))
        .await;
    assert_eq!(refund.status, 201, "{}", refund.body);
}

/// A charge whose answer the provider dropped, abandoned as unknown: the
/// provider's `charge.succeeded`, which came while it was being made
/// (recorded waiting), settles it when applied again, with the same
/// rewrite of its stored answer reconciliation makes; the client's retry
/// gets the 201.
async fn a_late_success_settles_an_unknown_charge(backend: Backend) {
    let options = AppOptions {
        replay_cache: false,
        ..with_webhooks()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    app.configure_sandbox_webhooks(json!({"drop_after_charge": true}))
        .await;
    let (key, body) = (new_key(), charge_body(2500, "tok_visa"));
    let first = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(first.status(), 503);
    assert!(app.webhooks_delivered(WITHIN).await);
    assert_eq!(
        app.db
            .count(
                "SELECT COUNT(*) FROM provider_events WHERE state = 'waiting'",
                "SELECT COUNT(*) FROM provider_events WHERE state = 'waiting'",
                &[]
            )
            .await,
        1,
        "the charge was being made: the event waits"
    );
    app.configure_sandbox_webhooks(json!({})).await;
    // Abandoned: past the provider's key retention, its retry gives up.
    app.db
        .age(Some(&key), Duration::from_secs(23 * 3600 + 1800))
        .await;
    let abandoned = app.post_charge("cus_1", Some(&key), &body).await;
    assert_eq!(abandoned.status(), 500);
    let report = app.service.apply_waiting(10).await.unwrap();
    assert_eq!((report.tried, report.done), (1, 1), "{report:?}");
    let retry = Answer::of(app.post_charge("cus_1", Some(&key), &body).await).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert_eq!(retry.body["status"], "succeeded");
    assert_eq!(app.sandbox_charges().await.len(), 1, "charged once");
    let id = retry.body["id"].as_str().unwrap();
    assert!(
        event_types(&app, id)
            .await
            .contains(&"charge.succeeded".to_owned())
    );
}

backend_tests!(
    all;
    bad_deliveries_change_nothing,
    a_dashboard_refund_arrives_and_fails_later,
    disputes_reach_the_reads_the_list_and_the_events,
    a_late_success_settles_an_unknown_charge,
);

/// Charges made for the duplicate/shuffle run: each with a dashboard
/// refund (three provider events), every fifth disputed, every fourth
/// refunded by us too: a little over 1,000 provider events.
const STORM_CHARGES: usize = 270;

/// Over 1,000 provider events, each delivered twice at the same moment,
/// in shuffled order, then all of them delivered twice again: every effect
/// applied once, and the charges' refunded amounts are the sandbox's.
async fn a_thousand_events_twice_shuffled_apply_once(backend: Backend) {
    let Some(app) = spawn_app(backend, with_webhooks()).await else {
        return;
    };
    app.configure_sandbox_webhooks(json!({"webhook_duplicate": true, "webhook_shuffle_ms": 1500}))
        .await;
    let app = std::sync::Arc::new(app);
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(8));
    let work = (0..STORM_CHARGES).map(|i| {
        let (app, gate) = (app.clone(), gate.clone());
        tokio::spawn(async move {
            let _turn = gate.acquire().await.unwrap();
            let charge = app
                .charge_json("cus_storm", &charge_body(1000, "tok_visa"))
                .await;
            let id = charge["id"].as_str().unwrap().to_owned();
            let provider_id = charge["gateway_charge_id"].as_str().unwrap().to_owned();
            let path = format!("/_sandbox/charges/{provider_id}/refunds");
            let made = app.sandbox_post(&path, &json!({"amount": 300})).await;
            assert_eq!(made.status, 200, "{}", made.body);
            if i % 4 == 0 {
                let body = json!({"amount_cents": 200});
                let ours = app.post_refund("ops_1", &id, &new_key(), &body).await;
                assert_eq!(ours.status, 201, "{}", ours.body);
            }
            if i % 5 == 0 {
                let path = format!("/_sandbox/charges/{provider_id}/disputes");
                let opened = app.sandbox_post(&path, &json!({"inquiry": true})).await;
                assert_eq!(opened.status, 200, "{}", opened.body);
            }
        })
    });
    for task in work.collect::<Vec<_>>() {
        task.await.unwrap();
    }
    assert!(app.webhooks_delivered(Duration::from_secs(120)).await);
    let hooks = app.sandbox_webhooks().await;
    assert!(hooks.len() >= 1000, "{} provider events", hooks.len());
    // Every event again, twice at once.
    let again = app
        .sandbox_post("/_sandbox/webhooks/redeliver", &json!({}))
        .await;
    assert_eq!(again.status, 200, "{}", again.body);
    let attempts = |hooks: &Vec<Value>| -> usize {
        hooks
            .iter()
            .map(|h| h["attempts"].as_array().map_or(0, Vec::len))
            .min()
            .unwrap_or(0)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while attempts(&app.sandbox_webhooks().await) < 4 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hooks = app.sandbox_webhooks().await;
    assert!(
        attempts(&hooks) >= 4,
        "every event delivered at least four times"
    );
    let failed: Vec<&Value> = hooks
        .iter()
        .flat_map(|h| h["attempts"].as_array().into_iter().flatten())
        .filter(|a| a["status"] != 200)
        .collect();
    assert!(failed.is_empty(), "every delivery answered 200: {failed:?}");
    let deliveries: usize = hooks
        .iter()
        .map(|h| h["attempts"].as_array().map_or(0, Vec::len))
        .sum();
    eprintln!(
        "{backend:?}: {} provider events, {deliveries} deliveries, {} recorded",
        hooks.len(),
        provider_events(&app).await
    );

    // Each provider event recorded once, applied; nothing waits.
    let distinct: std::collections::BTreeSet<&str> =
        hooks.iter().filter_map(|h| h["id"].as_str()).collect();
    assert_eq!(provider_events(&app).await, distinct.len() as i64);
    let left = app
        .db
        .count(
            "SELECT COUNT(*) FROM provider_events WHERE state <> 'applied'",
            "SELECT COUNT(*) FROM provider_events WHERE state <> 'applied'",
            &[],
        )
        .await;
    assert_eq!(left, 0, "every event applied");
    // Every effect once: the refunds, their amounts, the disputes, the
    // events out.
    let ours = STORM_CHARGES.div_ceil(4);
    let refunds = app.sandbox_refunds().await;
    assert_eq!(refunds.len(), STORM_CHARGES + ours);
    assert_eq!(app.db.refunds_with_status("").await, refunds.len() as i64);
    let refunded = app
        .db
        .count(
            "SELECT CAST(COALESCE(SUM(amount_refunded), 0) AS SIGNED) FROM charges",
            "SELECT COALESCE(SUM(amount_refunded), 0)::BIGINT FROM charges",
            &[],
        )
        .await;
    assert_eq!(refunded, app.sandbox_refunded().await);
    assert_eq!(refunded, (STORM_CHARGES * 300 + ours * 200) as i64);
    let disputes = app
        .db
        .count(
            "SELECT COUNT(*) FROM disputes",
            "SELECT COUNT(*) FROM disputes",
            &[],
        )
        .await;
    assert_eq!(disputes, STORM_CHARGES.div_ceil(5) as i64);
    let events = payments_tests::all_events(&app.db.store()).await;
    let of = |t: &str| events.iter().filter(|e| e.event_type == t).count();
    assert_eq!(of("refund.succeeded"), refunds.len());
    assert_eq!(of("charge.dispute.created"), STORM_CHARGES.div_ceil(5));
}

backend_tests!(all; a_thousand_events_twice_shuffled_apply_once);
