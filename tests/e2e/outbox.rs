//! The outbox, killed: `payments-api` SIGKILLed while charges finish under
//! load. Afterwards every charge in a final state has exactly its event,
//! and no event exists for a change that did not commit (a charge still
//! pending has none): the event is written in the transaction of its change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use payments_api::config::DEV_JWT_SECRET;
use payments_domain::charge::ChargeStatus;
use payments_domain::events::EventType;
use payments_domain::store::Store;
use payments_tests::{Backend, Process, TestDb, backend_tests};
use serde_json::{Value, json};

/// Clients sending charges at once.
const CLIENTS: usize = 24;
/// Bound on each client's requests, whatever happens to the kill.
const PER_CLIENT: usize = 200;

/// Every charge's id and shown status.
async fn charges(store: &Arc<dyn Store>) -> BTreeMap<String, ChargeStatus> {
    let all = payments_tests::all_charges(store).await;
    all.into_iter().map(|c| (c.id, c.status)).collect()
}

/// Every event's types, by object; each event shows its object as the
/// change left it.
async fn events(store: &Arc<dyn Store>) -> BTreeMap<String, BTreeSet<String>> {
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in payments_tests::all_events(store).await {
        let shown: Value = serde_json::from_str(&e.data).unwrap();
        let status = shown["status"].as_str().unwrap_or_default();
        assert_eq!(
            format!("charge.{status}"),
            e.event_type,
            "an event shows its object as the change left it"
        );
        found.entry(e.object_id).or_default().insert(e.event_type);
    }
    found
}

async fn a_kill_mid_finish_leaves_no_change_without_its_event_nor_an_event_without_it(
    backend: Backend,
) {
    let Some(db) = TestDb::new(backend, 4).await else {
        return;
    };
    let sandbox = Process::start(
        "payments-sandbox",
        &["--listen", "127.0.0.1:0", "--latency-ms", "5"],
        &[],
    )
    .await;
    let env = super::api_env(&db, &sandbox, &[("RUST_LOG", "warn")]);
    let mut api = Process::start("payments-api", &[], &env).await;
    let token =
        payments_api::auth::mint_hs256(DEV_JWT_SECRET, "cus_outbox", Duration::from_secs(600))
            .expect("a token");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let (client, url, token) = (client.clone(), api.url.clone(), token.clone());
        let (answered, stop) = (answered.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            for n in 0..PER_CLIENT {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // Paid, declined and held: every kind of finish.
                let (card, capture) = match (i + n) % 4 {
                    0 => ("tok_chargeDeclined", true),
                    1 => ("tok_visa", false),
                    _ => ("tok_visa", true),
                };
                let body = json!({"amount_cents": 900, "currency": "GBP", "card_token": card, "capture": capture});
                let sent = client
                    .post(format!("{url}/api/charges"))
                    .bearer_auth(&token)
                    .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
                    .json(&body)
                    .send()
                    .await;
                if sent.is_ok_and(|r| r.status() == 201 || r.status() == 402) {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for _ in 0..1000 {
        if answered.load(Ordering::Relaxed) >= 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    api.kill().await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }

    let store = db.store();
    let charges = charges(&store).await;
    let events = events(&store).await;
    let mut pending = 0;
    for (id, status) in &charges {
        let expected: BTreeSet<String> = match status {
            ChargeStatus::Succeeded => [EventType::ChargeSucceeded],
            ChargeStatus::Failed => [EventType::ChargeFailed],
            ChargeStatus::RequiresCapture => [EventType::ChargeRequiresCapture],
            ChargeStatus::Pending => {
                pending += 1;
                assert_eq!(events.get(id), None, "a pending charge {id} has no event");
                continue;
            }
            other => panic!("charge {id} is {other:?}"),
        }
        .map(|t| t.as_str().to_owned())
        .into();
        assert_eq!(events.get(id), Some(&expected), "charge {id} ({status:?})");
    }
    for object in events.keys() {
        assert!(
            charges.contains_key(object),
            "an event for {object}, which is no charge"
        );
    }
    let finals = charges.len() - pending;
    assert!(finals >= 300, "{finals} final charges");
    eprintln!(
        "{backend:?}: killed with {} charges ({pending} pending, in flight), {} events",
        charges.len(),
        events.len()
    );
}

backend_tests!(a_kill_mid_finish_leaves_no_change_without_its_event_nor_an_event_without_it);

/// The README's webhook session: `payments-receiver` listening, `make run`
/// (the in-process sandbox, `--with-jobs`) pointed at it by
/// WEBHOOK_ENDPOINTS; a charge's event arrives, its signature verified by
/// the receiver; a receiver that refuses a wrong secret answers 400.
#[tokio::test]
async fn the_readme_receiver_gets_a_charges_event() {
    let run = super::MakeRun::new();
    let secret = "whsec_dev_only_0123456789abcdef";
    let receiver = Process::start(
        "payments-receiver",
        &["--listen", "127.0.0.1:0", "--secret", secret],
        &[],
    )
    .await;
    let hooks = json!([{"url": receiver.url, "secret": secret}]).to_string();
    let api = run
        .start(&[
            ("WEBHOOK_ENDPOINTS", hooks.as_str()),
            ("DELIVER_EVERY", "200ms"),
        ])
        .await;
    let token = super::mint("cus_hooks").await;
    let charged = super::post(
        &api,
        &token,
        "hooked",
        &payments_tests::charge_body(2500, "tok_visa"),
    )
    .await;
    assert_eq!(charged.status(), 201);
    let charged: Value = charged.json().await.unwrap();
    let id = charged["id"].as_str().unwrap();
    let line = format!("charge.succeeded {id} succeeded -> 200, signature verified");
    assert!(
        receiver.wait_for_log(&[&line]).await,
        "{}\n{}",
        receiver.log(),
        api.log()
    );

    // A receiver with another secret refuses the next delivery.
    let wrong = Process::start(
        "payments-receiver",
        &[
            "--listen",
            "127.0.0.1:0",
            "--secret",
            "whsec_someone_else_0123456789",
        ],
        &[],
    )
    .await;
    let client = reqwest::Client::new();
    let event = client
        .get(format!("{}/api/events?limit=1", api.url))
        .bearer_auth(super::mint_back_office("ops_hooks").await)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let body = event["data"][0].to_string();
    let signature =
        payments_client::webhook::sign(&[secret], chrono::Utc::now().timestamp(), body.as_bytes());
    let refused = client
        .post(&wrong.url)
        .header("Payments-Signature", signature)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    drop(api);
}
