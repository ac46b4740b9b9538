//! The sandbox's webhooks over real HTTP on loopback: a receiver started
//! in the test records what the sandbox sends, proves every event is
//! Stripe's event object signed with the configured secret, and watches
//! the delivery faults (duplicates, shuffling, delays, losses, retries,
//! redelivery) do what they say.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use payments_client::webhook::{self, DEFAULT_TOLERANCE, VerifyError};
use payments_sandbox::SandboxConfig;
use reqwest::StatusCode;
use serde_json::{Value, json};

mod common;

use common::{Delivery, Error, Receiver, Sandbox, TestResult};

const SECRET: &str = "whsec_sandbox_webhook_tests_secret";

fn charge_form(source: &str, capture: &str) -> Vec<(&'static str, String)> {
    vec![
        ("amount", "1000".to_owned()),
        ("currency", "gbp".to_owned()),
        ("source", source.to_owned()),
        ("capture", capture.to_owned()),
    ]
}

impl Sandbox {
    /// A sandbox sending its webhooks to `receiver`, signed with [`SECRET`].
    async fn hooked(receiver: &Receiver) -> Result<Self, Error> {
        Sandbox::start(SandboxConfig {
            webhook_url: Some(receiver.url.clone()),
            webhook_secret: SECRET.to_owned(),
            ..SandboxConfig::default()
        })
        .await
    }

    /// Replaces the config with webhooks to `receiver` plus `extra`.
    async fn hook_config(&self, receiver: &Receiver, extra: Value) -> TestResult {
        let mut config = json!({"webhook_url": receiver.url, "webhook_secret": SECRET});
        if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
            config.extend(extra.clone());
        }
        let set = self.post_json("/_sandbox/config", &config).await?;
        assert_eq!(set.status, StatusCode::OK, "{}", set.json);
        Ok(())
    }

    /// A charge (or a hold, `capture` "false") of 1000 gbp; its id.
    async fn charge(&self, capture: &str, key: Option<&str>) -> Result<String, Error> {
        let made = self
            .form("/v1/charges", &charge_form("tok_visa", capture), key)
            .await?;
        assert_eq!(made.status, StatusCode::OK, "{}", made.json);
        id(&made.json)
    }

    /// `GET /_sandbox/webhooks`'s records.
    async fn records(&self) -> Result<Vec<Value>, Error> {
        let list = self.get("/_sandbox/webhooks").await?;
        assert_eq!(list.status, StatusCode::OK);
        Ok(list.json["data"].as_array().cloned().unwrap_or_default())
    }

    /// Waits (at most 15 s) until the records satisfy `done`.
    async fn records_until(&self, done: impl Fn(&[Value]) -> bool) -> Result<Vec<Value>, Error> {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let records = self.records().await?;
            if done(&records) || std::time::Instant::now() > deadline {
                return Ok(records);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn id(object: &Value) -> Result<String, Error> {
    Ok(object["id"]
        .as_str()
        .ok_or_else(|| format!("no id in {object}"))?
        .to_owned())
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_secs() as i64)
        .unwrap_or_default()
}

/// `delivery`'s signature checked with `secret`, as a receiver checks it.
fn verify(delivery: &Delivery, secret: &str) -> Result<i64, VerifyError> {
    let header = delivery.signature.as_deref().unwrap_or_default();
    webhook::verify_at(secret, header, &delivery.body, DEFAULT_TOLERANCE, now())
}

/// Checks what every delivery must be: signed with [`SECRET`] (and not
/// with another), JSON, Stripe's event object about `data.object`.
fn assert_stripe_event(delivery: &Delivery) {
    let event = &delivery.json;
    assert!(verify(delivery, SECRET).is_ok(), "{event}");
    assert_eq!(
        verify(delivery, "whsec_some_other_endpoints_secret"),
        Err(VerifyError::Mismatch)
    );
    let header = delivery.signature.as_deref().unwrap_or_default();
    assert!(
        header.starts_with("t=") && header.contains(",v1="),
        "{header}"
    );
    assert_eq!(delivery.content_type.as_deref(), Some("application/json"));
    assert!(
        delivery
            .user_agent
            .as_deref()
            .is_some_and(|agent| agent.starts_with("Stripe/1.0")),
        "{:?}",
        delivery.user_agent
    );
    let id = delivery.id();
    assert!(id.starts_with("evt_") && id.len() == 28, "{id}");
    assert!(id[4..].chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
    assert_eq!(event["object"], "event");
    assert_eq!(event["api_version"], "2024-06-20");
    assert_eq!(event["livemode"], false);
    assert_eq!(event["pending_webhooks"], 1);
    assert_eq!(event["request"]["id"], Value::Null);
    assert!(event["created"].as_u64().is_some_and(|created| created > 0));
    assert!(event["data"]["object"]["id"].is_string(), "{event}");
    let keys: BTreeSet<&str> = event
        .as_object()
        .map(|event| event.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        keys,
        BTreeSet::from([
            "api_version",
            "created",
            "data",
            "id",
            "livemode",
            "object",
            "pending_webhooks",
            "request",
            "type"
        ])
    );
}

/// The (type, object id) of each delivery, in the order received.
fn kinds(deliveries: &[Delivery]) -> Vec<(String, String)> {
    deliveries
        .iter()
        .map(|delivery| {
            (
                delivery.kind().to_owned(),
                delivery.json["data"]["object"]["id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

fn sorted(mut pairs: Vec<(String, String)>) -> Vec<(String, String)> {
    pairs.sort();
    pairs
}

fn pair(kind: &str, id: &str) -> (String, String) {
    (kind.to_owned(), id.to_owned())
}

/// The delivery of `kind` about `id`.
fn find<'a>(deliveries: &'a [Delivery], kind: &str, id: &str) -> Result<&'a Delivery, Error> {
    deliveries
        .iter()
        .find(|d| d.kind() == kind && d.json["data"]["object"]["id"] == id)
        .ok_or_else(|| format!("no {kind} of {id} in {:?}", kinds(deliveries)).into())
}

/// Charges (captured, declined, a hold), a capture, refunds (one of them a
/// hold's release) and a hold lapsing each make their events, signed; an
/// idempotent replay makes none; every event is kept with its attempt and
/// readable as sent.
#[tokio::test]
async fn charges_captures_refunds_and_lapses_make_signed_events() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::hooked(&receiver).await?;

    let paid = sandbox.charge("true", Some("charge-1")).await?;
    let replayed = sandbox
        .form(
            "/v1/charges",
            &charge_form("tok_visa", "true"),
            Some("charge-1"),
        )
        .await?;
    assert!(replayed.replayed);
    let declined = sandbox
        .form(
            "/v1/charges",
            &charge_form("tok_chargeDeclined", "true"),
            None,
        )
        .await?;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    let declined = declined.json["error"]["charge"]
        .as_str()
        .ok_or("no declined charge")?
        .to_owned();
    let held = sandbox.charge("false", None).await?;
    let captured = sandbox
        .form(
            &format!("/v1/charges/{held}/capture"),
            &[("amount", "600".to_owned())],
            Some("capture-1"),
        )
        .await?;
    assert_eq!(captured.status, StatusCode::OK, "{}", captured.json);
    let refund = sandbox
        .form(
            "/v1/refunds",
            &[("charge", paid.clone()), ("amount", "300".to_owned())],
            Some("refund-1"),
        )
        .await?;
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.json);
    let refund = id(&refund.json)?;
    let released = sandbox.charge("false", None).await?;
    let release = sandbox
        .form("/v1/refunds", &[("charge", released.clone())], None)
        .await?;
    let release = id(&release.json)?;
    sandbox
        .hook_config(&receiver, json!({"hold_expiry_seconds": 1}))
        .await?;
    let lapsing = sandbox.charge("false", None).await?;

    let deliveries = receiver
        .wait_until(|deliveries| deliveries.iter().any(|d| d.kind() == "charge.expired"))
        .await;
    let expected = vec![
        pair("charge.succeeded", &paid),
        pair("charge.failed", &declined),
        pair("charge.succeeded", &held),
        pair("charge.captured", &held),
        pair("charge.refunded", &paid),
        pair("refund.created", &refund),
        pair("charge.succeeded", &released),
        pair("charge.refunded", &released),
        pair("refund.created", &release),
        pair("charge.succeeded", &lapsing),
        pair("charge.expired", &lapsing),
    ];
    assert_eq!(sorted(kinds(&deliveries)), sorted(expected.clone()));
    for delivery in &deliveries {
        assert_stripe_event(delivery);
    }

    // What each event says: the object right after the change.
    let made = find(&deliveries, "charge.succeeded", &paid)?;
    assert_eq!(made.json["request"]["idempotency_key"], "charge-1");
    let object = &made.json["data"]["object"];
    assert_eq!(
        (&object["object"], &object["captured"], &object["disputed"]),
        (&json!("charge"), &json!(true), &json!(false))
    );
    let failed = &find(&deliveries, "charge.failed", &declined)?.json;
    assert_eq!(failed["data"]["object"]["status"], "failed");
    assert_eq!(failed["request"]["idempotency_key"], Value::Null);
    let hold = &find(&deliveries, "charge.succeeded", &held)?.json["data"]["object"];
    assert_eq!(
        (&hold["captured"], &hold["paid"]),
        (&json!(false), &json!(true))
    );
    let capture = &find(&deliveries, "charge.captured", &held)?.json;
    assert_eq!(capture["data"]["object"]["amount_captured"], 600);
    assert_eq!(capture["request"]["idempotency_key"], "capture-1");
    let refunded = &find(&deliveries, "charge.refunded", &paid)?.json["data"]["object"];
    assert_eq!(refunded["amount_refunded"], 300);
    assert_eq!(refunded["refunded"], false);
    assert!(
        refunded.get("refunds").is_none(),
        "no refunds list: {refunded}"
    );
    let created = &find(&deliveries, "refund.created", &refund)?.json;
    assert_eq!(created["data"]["object"]["object"], "refund");
    assert_eq!(created["data"]["object"]["charge"], json!(paid));
    assert_eq!(created["request"]["idempotency_key"], "refund-1");
    let released_charge = &find(&deliveries, "charge.refunded", &released)?.json["data"]["object"];
    assert_eq!(
        (&released_charge["refunded"], &released_charge["captured"]),
        (&json!(true), &json!(false))
    );
    let expired = &find(&deliveries, "charge.expired", &lapsing)?.json["data"]["object"];
    assert_eq!(
        (
            &expired["refunded"],
            &expired["captured"],
            &expired["amount_refunded"]
        ),
        (&json!(true), &json!(false), &json!(1000))
    );

    // Each event once: two more ticks of the lapse watcher announce nothing.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(receiver.deliveries().len(), expected.len());

    // The records: oldest first, each delivered at its first attempt, and
    // each event readable as sent.
    let records = sandbox.records().await?;
    assert_eq!(records.len(), expected.len());
    assert_eq!(
        (&records[0]["type"], &records[0]["object_id"]),
        (&json!("charge.succeeded"), &json!(paid))
    );
    for record in &records {
        assert_eq!(record["delivered"], true, "{record}");
        assert_eq!(record["attempts"], json!([{"status": 200}]), "{record}");
        let event_id = record["id"].as_str().ok_or("no event id")?;
        let sent = sandbox.get(&format!("/_sandbox/events/{event_id}")).await?;
        assert_eq!(sent.status, StatusCode::OK);
        let delivery = deliveries
            .iter()
            .find(|delivery| delivery.id() == event_id)
            .ok_or("a record never delivered")?;
        assert_eq!(sent.bytes, delivery.body);
        assert_eq!(record["type"], json!(delivery.kind()));
        assert_eq!(record["created"], delivery.json["created"]);
    }
    let missing = sandbox.get("/_sandbox/events/evt_nope").await?;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.code(), "resource_missing");
    Ok(())
}

/// A pending refund settled, a succeeded refund failing days later and a
/// refund made in the dashboard each make their events.
#[tokio::test]
async fn refunds_changing_later_and_dashboard_refunds_make_events() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::hooked(&receiver).await?;
    let charge = sandbox.charge("true", None).await?;
    sandbox
        .hook_config(&receiver, json!({"refund_status": "pending"}))
        .await?;
    let pending = sandbox
        .form(
            "/v1/refunds",
            &[("charge", charge.clone()), ("amount", "100".to_owned())],
            None,
        )
        .await?;
    let pending = id(&pending.json)?;
    let settled = sandbox
        .post_json(
            &format!("/_sandbox/refunds/{pending}"),
            &json!({"status": "succeeded"}),
        )
        .await?;
    assert_eq!(settled.status, StatusCode::OK, "{}", settled.json);
    sandbox.hook_config(&receiver, json!({})).await?;
    let dashboard = sandbox
        .post_json(
            &format!("/_sandbox/charges/{charge}/refunds"),
            &json!({"amount": 200, "reason": "requested_by_customer"}),
        )
        .await?;
    assert_eq!(dashboard.status, StatusCode::OK, "{}", dashboard.json);
    let dashboard = id(&dashboard.json)?;
    let failed = sandbox
        .post_json(
            &format!("/_sandbox/refunds/{dashboard}"),
            &json!({"status": "failed", "failure_reason": "expired_or_canceled_card"}),
        )
        .await?;
    assert_eq!(failed.status, StatusCode::OK, "{}", failed.json);

    let deliveries = receiver.wait_for(10).await;
    let expected = vec![
        pair("charge.succeeded", &charge),
        pair("charge.refunded", &charge),
        pair("refund.created", &pending),
        pair("charge.refund.updated", &pending),
        pair("refund.updated", &pending),
        pair("charge.refunded", &charge),
        pair("refund.created", &dashboard),
        pair("charge.refund.updated", &dashboard),
        pair("refund.updated", &dashboard),
        pair("refund.failed", &dashboard),
    ];
    assert_eq!(sorted(kinds(&deliveries)), sorted(expected));
    for delivery in &deliveries {
        assert_stripe_event(delivery);
    }
    let created = &find(&deliveries, "refund.created", &pending)?.json["data"]["object"];
    assert_eq!(created["status"], "pending");
    let updated = &find(&deliveries, "refund.updated", &pending)?.json["data"]["object"];
    assert_eq!(updated["status"], "succeeded");
    let made = &find(&deliveries, "refund.created", &dashboard)?.json;
    assert_eq!(made["data"]["object"]["metadata"], json!({}));
    assert_eq!(made["request"]["idempotency_key"], Value::Null);
    let failure = &find(&deliveries, "refund.failed", &dashboard)?.json["data"]["object"];
    assert_eq!(
        (&failure["status"], &failure["failure_reason"]),
        (&json!("failed"), &json!("expired_or_canceled_card"))
    );
    // The two charge.refunded: 100 (pending, counted), then 300.
    let mut refunded: Vec<u64> = deliveries
        .iter()
        .filter(|d| d.kind() == "charge.refunded")
        .filter_map(|d| d.json["data"]["object"]["amount_refunded"].as_u64())
        .collect();
    refunded.sort_unstable();
    assert_eq!(refunded, [100, 300]);
    Ok(())
}

/// An inquiry escalated and lost, and a chargeback reviewed and won, make
/// Stripe's dispute events in order.
#[tokio::test]
async fn disputes_make_their_events() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::hooked(&receiver).await?;
    let asked = sandbox.charge("true", None).await?;
    let charged_back = sandbox.charge("true", None).await?;
    receiver.wait_for(2).await;

    let move_to = |dispute: String, status: &'static str| {
        let sandbox = &sandbox;
        async move {
            let moved = sandbox
                .post_json(
                    &format!("/_sandbox/disputes/{dispute}"),
                    &json!({"status": status}),
                )
                .await?;
            assert_eq!(moved.status, StatusCode::OK, "{}", moved.json);
            Ok::<Value, Error>(moved.json)
        }
    };
    let inquiry = sandbox
        .post_json(
            &format!("/_sandbox/charges/{asked}/disputes"),
            &json!({"inquiry": true, "reason": "product_not_received"}),
        )
        .await?;
    let inquiry = id(&inquiry.json)?;
    // Each step's events are in before the next, so their order shows.
    let steps: [(&str, usize); 2] = [("needs_response", 2), ("lost", 1)];
    assert_eq!(receiver.wait_for(3).await.len(), 3);
    let mut seen = 3;
    for (status, events) in steps {
        move_to(inquiry.clone(), status).await?;
        seen += events;
        assert_eq!(receiver.wait_for(seen).await.len(), seen);
    }
    let chargeback = sandbox
        .post_json(
            &format!("/_sandbox/charges/{charged_back}/disputes"),
            &json!({}),
        )
        .await?;
    let chargeback = id(&chargeback.json)?;
    seen += 2;
    receiver.wait_for(seen).await;
    for (status, events) in [("under_review", 1), ("won", 2)] {
        move_to(chargeback.clone(), status).await?;
        seen += events;
        assert_eq!(receiver.wait_for(seen).await.len(), seen);
    }

    let deliveries = receiver.deliveries();
    let disputes: Vec<(String, String)> = kinds(&deliveries[2..]);
    assert_eq!(
        sorted(disputes[..1].to_vec()),
        [pair("charge.dispute.created", &inquiry)]
    );
    assert_eq!(
        sorted(disputes[1..3].to_vec()),
        sorted(vec![
            pair("charge.dispute.updated", &inquiry),
            pair("charge.dispute.funds_withdrawn", &inquiry)
        ])
    );
    assert_eq!(disputes[3], pair("charge.dispute.closed", &inquiry));
    assert_eq!(
        sorted(disputes[4..6].to_vec()),
        sorted(vec![
            pair("charge.dispute.created", &chargeback),
            pair("charge.dispute.funds_withdrawn", &chargeback)
        ])
    );
    assert_eq!(disputes[6], pair("charge.dispute.updated", &chargeback));
    assert_eq!(
        sorted(disputes[7..9].to_vec()),
        sorted(vec![
            pair("charge.dispute.closed", &chargeback),
            pair("charge.dispute.funds_reinstated", &chargeback)
        ])
    );
    for delivery in &deliveries {
        assert_stripe_event(delivery);
    }
    let opened = &find(&deliveries, "charge.dispute.created", &inquiry)?.json["data"]["object"];
    assert_eq!(
        (
            &opened["object"],
            &opened["status"],
            &opened["is_charge_refundable"],
            &opened["charge"]
        ),
        (
            &json!("dispute"),
            &json!("warning_needs_response"),
            &json!(true),
            &json!(asked)
        )
    );
    let closed = &find(&deliveries, "charge.dispute.closed", &chargeback)?.json["data"]["object"];
    assert_eq!(closed["status"], "won");
    Ok(())
}

/// With `webhook_duplicate`, every attempt is sent twice at once: each
/// event arrives twice, and both sends are recorded.
#[tokio::test]
async fn duplicates_deliver_every_event_twice() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::hooked(&receiver).await?;
    sandbox
        .hook_config(&receiver, json!({"webhook_duplicate": true}))
        .await?;
    for _ in 0..3 {
        sandbox.charge("true", None).await?;
    }
    let deliveries = receiver.wait_for(6).await;
    assert_eq!(deliveries.len(), 6);
    let records = sandbox.records().await?;
    assert_eq!(records.len(), 3);
    for record in &records {
        let event = record["id"].as_str().ok_or("no id")?;
        let copies: Vec<&Delivery> = deliveries.iter().filter(|d| d.id() == event).collect();
        assert_eq!(copies.len(), 2, "{event}");
        assert_eq!(copies[0].body, copies[1].body);
        for copy in copies {
            assert_stripe_event(copy);
        }
        let records = sandbox
            .records_until(|records| {
                records
                    .iter()
                    .all(|record| record["attempts"].as_array().is_some_and(|a| a.len() == 2))
            })
            .await?;
        let record = records
            .iter()
            .find(|r| r["id"] == event)
            .ok_or("no record")?;
        assert_eq!(
            record["attempts"],
            json!([{"status": 200}, {"status": 200, "duplicate": true}])
        );
        assert_eq!(record["delivered"], true);
    }
    Ok(())
}

/// `webhook_delay_ms` holds every event back; `webhook_shuffle_ms` delays
/// each by a random part of it: every event still arrives, once.
#[tokio::test]
async fn delayed_and_shuffled_events_all_arrive() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::hooked(&receiver).await?;
    sandbox
        .hook_config(
            &receiver,
            json!({"webhook_delay_ms": 1000, "webhook_shuffle_ms": 400}),
        )
        .await?;
    let mut charges = BTreeSet::from([sandbox.charge("true", None).await?]);
    // The answer came back long before its event, held back 1 s at least.
    assert!(receiver.deliveries().is_empty());
    for _ in 1..12 {
        charges.insert(sandbox.charge("true", None).await?);
    }
    let deliveries = receiver.wait_for(12).await;
    let delivered: BTreeSet<String> = kinds(&deliveries)
        .into_iter()
        .map(|(_, object)| object)
        .collect();
    assert_eq!(delivered, charges);
    let events: BTreeSet<&str> = deliveries.iter().map(Delivery::id).collect();
    let recorded: BTreeSet<String> = sandbox
        .records()
        .await?
        .iter()
        .filter_map(|record| record["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        events,
        recorded.iter().map(String::as_str).collect::<BTreeSet<_>>()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.deliveries().len(), 12, "each once");
    Ok(())
}

/// An attempt lost in the network (`webhook_drop_rate` 1.0) is not sent;
/// `webhook_redeliver_ms` later it is attempted again, and once the
/// network lets it through (drop rate 0) the event arrives.
#[tokio::test]
async fn a_lost_attempt_is_redelivered() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::hooked(&receiver).await?;
    sandbox
        .hook_config(
            &receiver,
            json!({"webhook_drop_rate": 1.0, "webhook_redeliver_ms": 300}),
        )
        .await?;
    let charge = sandbox.charge("true", None).await?;
    let records = sandbox
        .records_until(|records| {
            records
                .first()
                .is_some_and(|record| record["attempts"][0] == json!({"dropped": true}))
        })
        .await?;
    assert_eq!(records[0]["attempts"][0], json!({"dropped": true}));
    assert_eq!(records[0]["delivered"], false);
    assert!(
        receiver.deliveries().is_empty(),
        "a lost attempt is not sent"
    );
    sandbox
        .hook_config(&receiver, json!({"webhook_redeliver_ms": 300}))
        .await?;
    let deliveries = receiver.wait_for(1).await;
    assert_eq!(
        kinds(&deliveries),
        [pair("charge.succeeded", &charge)],
        "redelivered"
    );
    assert_stripe_event(&deliveries[0]);
    let records = sandbox
        .records_until(|records| records[0]["delivered"] == true)
        .await?;
    let attempts = records[0]["attempts"].as_array().ok_or("no attempts")?;
    assert_eq!(attempts.first(), Some(&json!({"dropped": true})));
    assert_eq!(attempts.last(), Some(&json!({"status": 200})));
    assert!(
        attempts[..attempts.len() - 1]
            .iter()
            .all(|attempt| *attempt == json!({"dropped": true}))
    );
    Ok(())
}

/// An endpoint answering 500 twice, then 200, gets three attempts; one
/// that never answers 2xx gets `webhook_max_attempts` and no more; one
/// that cannot be reached has the error recorded.
#[tokio::test]
async fn failed_attempts_are_retried_up_to_the_maximum() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::hooked(&receiver).await?;
    receiver.answer_with(&[500, 500]);
    sandbox.charge("true", None).await?;
    let deliveries = receiver.wait_for(3).await;
    assert_eq!(deliveries.len(), 3);
    assert!(deliveries.iter().all(|d| d.body == deliveries[0].body));
    for delivery in &deliveries {
        assert_stripe_event(delivery);
    }
    let records = sandbox
        .records_until(|records| records[0]["delivered"] == true)
        .await?;
    assert_eq!(
        records[0]["attempts"],
        json!([{"status": 500}, {"status": 500}, {"status": 200}])
    );

    sandbox
        .hook_config(&receiver, json!({"webhook_max_attempts": 2}))
        .await?;
    receiver.answer_with(&[503, 503, 503]);
    sandbox.charge("true", None).await?;
    receiver.wait_for(5).await;
    // Past the 200 ms backoff: no third attempt.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.deliveries().len(), 5);
    let records = sandbox.records().await?;
    assert_eq!(
        (&records[1]["attempts"], &records[1]["delivered"]),
        (&json!([{"status": 503}, {"status": 503}]), &json!(false))
    );

    // Nothing listens on a port just released.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let unreachable = format!("http://{}/webhooks", closed.local_addr()?);
    drop(closed);
    let set = sandbox
        .post_json(
            "/_sandbox/config",
            &json!({"webhook_url": unreachable, "webhook_max_attempts": 1}),
        )
        .await?;
    assert_eq!(set.status, StatusCode::OK);
    sandbox.charge("true", None).await?;
    let records = sandbox
        .records_until(|records| {
            records
                .get(2)
                .is_some_and(|record| record["attempts"][0]["error"].is_string())
        })
        .await?;
    assert_eq!(records[2]["delivered"], false, "{}", records[2]);
    assert_eq!(records[2]["attempts"].as_array().map(Vec::len), Some(1));
    Ok(())
}

/// `POST /_sandbox/webhooks/redeliver` sends every event again (or the one
/// named), delivered or not, signed anew; an unknown event is a 404, and
/// with no `webhook_url` there is nowhere to send (400).
#[tokio::test]
async fn redeliver_sends_events_again() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::hooked(&receiver).await?;
    let first = sandbox.charge("true", None).await?;
    let second = sandbox.charge("true", None).await?;
    let deliveries = receiver.wait_for(2).await;
    let event_of = |charge: &str| {
        deliveries
            .iter()
            .find(|d| d.json["data"]["object"]["id"] == charge)
            .map(|d| d.id().to_owned())
            .ok_or("no event")
    };
    let (first_event, second_event) = (event_of(&first)?, event_of(&second)?);

    let all = sandbox
        .post_json("/_sandbox/webhooks/redeliver", &json!({}))
        .await?;
    assert_eq!(all.status, StatusCode::OK, "{}", all.json);
    assert_eq!(all.json["data"], json!([first_event, second_event]));
    let deliveries = receiver.wait_for(4).await;
    assert_eq!(deliveries.len(), 4);
    for event in [&first_event, &second_event] {
        let copies: Vec<&Delivery> = deliveries.iter().filter(|d| d.id() == event).collect();
        assert_eq!(copies.len(), 2, "{event}");
        assert_eq!(copies[0].body, copies[1].body);
        for copy in copies {
            assert_stripe_event(copy);
        }
    }
    // A named one alone.
    let one = sandbox
        .post_json(
            "/_sandbox/webhooks/redeliver",
            &json!({"event_id": first_event}),
        )
        .await?;
    assert_eq!(one.json["data"], json!([first_event]));
    let deliveries = receiver.wait_for(5).await;
    assert_eq!(deliveries.len(), 5);
    assert_eq!(deliveries[4].id(), first_event);
    let records = sandbox
        .records_until(|records| records[0]["attempts"].as_array().map(Vec::len) == Some(3))
        .await?;
    assert_eq!(
        records[0]["attempts"],
        json!([{"status": 200}, {"status": 200}, {"status": 200}])
    );

    let unknown = sandbox
        .post_json(
            "/_sandbox/webhooks/redeliver",
            &json!({"event_id": "evt_nope"}),
        )
        .await?;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let bad = sandbox
        .post_json("/_sandbox/webhooks/redeliver", &json!({"event": "x"}))
        .await?;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let off = sandbox
        .post_json("/_sandbox/config", &json!({"webhook_url": null}))
        .await?;
    assert_eq!(off.status, StatusCode::OK);
    let nowhere = sandbox
        .client
        .post(sandbox.url("/_sandbox/webhooks/redeliver"))
        .send()
        .await?;
    assert_eq!(nowhere.status(), StatusCode::BAD_REQUEST);
    Ok(())
}

/// Where webhooks go is wiring, not a fault: a config replacement that
/// leaves `webhook_url` and `webhook_secret` out keeps them (so restoring
/// normal with `{}` does not cut off the API's in-process sandbox), and
/// `"webhook_url": null` turns events off.
#[tokio::test]
async fn a_config_replacement_keeps_where_webhooks_go() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::hooked(&receiver).await?;
    let faults = sandbox
        .post_json("/_sandbox/config", &json!({"latency_ms": 1}))
        .await?;
    assert_eq!(faults.status, StatusCode::OK, "{}", faults.json);
    assert_eq!(faults.json["latency_ms"], 1);
    assert_eq!(faults.json["webhook_url"], receiver.url.as_str());
    assert_eq!(faults.json["webhook_secret"], SECRET);
    let normal = sandbox.post_json("/_sandbox/config", &json!({})).await?;
    assert_eq!(normal.json["latency_ms"], 0);
    assert_eq!(normal.json["webhook_url"], receiver.url.as_str());
    sandbox.charge("true", None).await?;
    let deliveries = receiver.wait_for(1).await;
    assert_eq!(deliveries.len(), 1);
    assert_stripe_event(&deliveries[0]);

    let off = sandbox
        .post_json("/_sandbox/config", &json!({"webhook_url": null}))
        .await?;
    assert_eq!(off.json["webhook_url"], Value::Null);
    assert_eq!(off.json["webhook_secret"], SECRET, "kept for a later URL");
    sandbox.charge("true", None).await?;
    assert_eq!(sandbox.records().await?.len(), 1, "no event made while off");
    Ok(())
}

/// Without a `webhook_url` no event is made or kept; a reset forgets the
/// events made.
#[tokio::test]
async fn no_url_no_events_and_a_reset_forgets_them() -> TestResult {
    let receiver = Receiver::start().await?;
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    sandbox.charge("true", None).await?;
    assert!(sandbox.records().await?.is_empty());
    sandbox.hook_config(&receiver, json!({})).await?;
    sandbox.charge("true", None).await?;
    let deliveries = receiver.wait_for(1).await;
    assert_eq!(sandbox.records().await?.len(), 1);
    let reset = sandbox.reset().await?;
    assert_eq!(reset.status(), StatusCode::OK);
    assert!(sandbox.records().await?.is_empty());
    let gone = sandbox
        .get(&format!("/_sandbox/events/{}", deliveries[0].id()))
        .await?;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    Ok(())
}

/// The webhook settings are validated, naming the field: a URL that is
/// not http(s), a secret shorter than 24 characters, a drop rate that is
/// not a probability, no attempt at all.
#[tokio::test]
async fn webhook_settings_are_validated() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    for (bad, field) in [
        (json!({"webhook_url": "not a url"}), "webhook_url"),
        (
            json!({"webhook_url": "ftp://127.0.0.1/hooks"}),
            "webhook_url",
        ),
        (json!({"webhook_secret": "whsec_short"}), "webhook_secret"),
        (json!({"webhook_drop_rate": 1.5}), "webhook_drop_rate"),
        (json!({"webhook_drop_rate": -1}), "webhook_drop_rate"),
        (json!({"webhook_max_attempts": 0}), "webhook_max_attempts"),
    ] {
        let refused = sandbox.post_json("/_sandbox/config", &bad).await?;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(refused.json["error"]["param"], field, "{bad}");
    }
    let unknown = sandbox
        .post_json("/_sandbox/config", &json!({"webhook_urls": "x"}))
        .await?;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    let good = json!({"webhook_url": "https://example.com/stripe", "webhook_secret":
        "whsec_0123456789abcdefghijklmn", "webhook_drop_rate": 1.0, "webhook_duplicate": true,
        "webhook_shuffle_ms": 10, "webhook_delay_ms": 10, "webhook_redeliver_ms": 10,
        "webhook_max_attempts": 3});
    let set = sandbox.post_json("/_sandbox/config", &good).await?;
    assert_eq!(set.status, StatusCode::OK, "{}", set.json);
    let read = sandbox.get("/_sandbox/config").await?;
    for (field, value) in good.as_object().ok_or("not an object")? {
        assert_eq!(&read.json[field], value, "{field}");
    }
    let started = payments_sandbox::SandboxHandle::start(SandboxConfig {
        webhook_url: Some("mailto:ops@example.com".to_owned()),
        ..SandboxConfig::default()
    })
    .await;
    assert!(started.is_err_and(|error| error.kind() == std::io::ErrorKind::InvalidInput));
    Ok(())
}
