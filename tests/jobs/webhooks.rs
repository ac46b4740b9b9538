//! Events and webhooks (issue 28): a receiver on loopback gets exactly the
//! events of the changes made, each at least once and signed; with the
//! receiver failing half the time and `payments-jobs` SIGKILLed five times
//! mid-delivery, every event still arrives, duplicates only under the same
//! id, and no attempt is ever made for a change that was rolled back.
//! Signatures are checked by this file's own HMAC, not the client's helper.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use payments_domain::store::Store;
use payments_domain::webhook::WebhookSender;
use payments_gateway::webhook::HttpWebhookSender;
use payments_jobs::deliverer::{Deliverer, DelivererSettings};
use payments_tests::{
    Answer, Backend, Process, TestApp, backend_tests, new_key, run_binary, spawn_app,
};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::aged;

const SECRET: &str = "whsec_test_0123456789abcdefghij";

/// One POST the receiver got.
#[derive(Debug, Clone)]
struct Got {
    signature: String,
    body: Bytes,
    /// Whether it answered 2xx.
    accepted: bool,
}

/// A webhook receiver on loopback that answers 500 to `fail_percent` of
/// the attempts (at random) and 200 to the rest, keeping every attempt.
#[derive(Debug, Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Got>>>,
    fail_percent: Arc<AtomicU32>,
    attempts: Arc<AtomicU64>,
}

impl Receiver {
    async fn start(fail_percent: u32) -> (String, Self) {
        let receiver = Self::default();
        receiver.fail_percent.store(fail_percent, Ordering::Relaxed);
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, receiver)
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// The ids of the events it accepted, with how many times each.
    fn accepted(&self) -> BTreeMap<String, usize> {
        let mut ids = BTreeMap::new();
        for got in self.got().iter().filter(|g| g.accepted) {
            *ids.entry(event_of(got)["id"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
        ids
    }
}

async fn hook(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    r.attempts.fetch_add(1, Ordering::Relaxed);
    let roll = u32::from(uuid::Uuid::new_v4().as_bytes()[0]) * 100 / 256;
    let accepted = roll >= r.fail_percent.load(Ordering::Relaxed);
    let signature = headers
        .get("payments-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    r.got.lock().unwrap().push(Got {
        signature,
        body,
        accepted,
    });
    if accepted {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

fn event_of(got: &Got) -> Value {
    serde_json::from_slice(&got.body).expect("an event body is JSON")
}

/// This test's own check of a `Payments-Signature`: HMAC-SHA256 of
/// `"{t}.{body}"` under `secret`, hex, equal to one `v1`, `t` within 5
/// minutes of now.
fn independently_verified(secret: &str, header: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut v1 = Vec::new();
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = Some(value),
            Some(("v1", value)) => v1.push(value),
            _ => {}
        }
    }
    let Some(t) = t else { return false };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    let expected = hex::encode(mac.finalize().into_bytes());
    let now = chrono::Utc::now().timestamp();
    let fresh = t.parse::<i64>().is_ok_and(|t| (now - t).abs() <= 300);
    fresh && v1.contains(&expected.as_str())
}

fn endpoints(url: &str) -> String {
    json!([{"url": url, "secret": SECRET}]).to_string()
}

/// A deliverer in this process, as `payments-jobs deliver` builds it,
/// retrying at once (no backoff to wait for).
fn deliverer(store: Arc<dyn Store>, url: &str) -> Deliverer {
    let sender: Arc<dyn WebhookSender> =
        Arc::new(HttpWebhookSender::new(Duration::from_secs(5), false).unwrap());
    let settings = DelivererSettings {
        endpoints: payments_app::webhooks::parse_endpoints(&endpoints(url)).unwrap(),
        lease: Duration::from_secs(30),
        retry_for: Duration::from_secs(3 * 86_400),
        backoff: Duration::from_millis(1),
        backoff_max: Duration::from_millis(1),
        batch: 100,
        concurrency: 8,
    };
    Deliverer::new(store, sender, settings)
}

/// Every event in the database, by id, as the API shows it.
async fn stored_events(store: &Arc<dyn Store>) -> BTreeMap<String, Value> {
    let all = payments_tests::all_events(store).await;
    let json = |e: &payments_domain::events::Event| serde_json::from_str(&e.to_json()).unwrap();
    all.iter().map(|e| (e.id.clone(), json(e))).collect()
}

async fn charge(app: &TestApp, card: &str, capture: bool) -> Answer {
    let body =
        json!({"amount_cents": 1500, "currency": "GBP", "card_token": card, "capture": capture});
    let response = app
        .post_charge("cus_hooks", Some(&new_key()), &body.to_string())
        .await;
    Answer::of(response).await
}

async fn back_office(app: &TestApp, path: &str, body: Value) -> Answer {
    let token = app.back_office_token("ops_hooks", "refunds:write charges:capture");
    let response = app
        .http
        .post(format!("{}{path}", app.base_url))
        .bearer_auth(token)
        .header("idempotency-key", new_key())
        .json(&body)
        .send()
        .await
        .unwrap();
    Answer::of(response).await
}

/// Charges (one succeeded, one declined), a refund, a hold captured: the
/// receiver gets exactly their events, signed, as `GET /api/events` shows
/// them; the client's helper refuses a tampered body, an old timestamp
/// and a wrong secret.
async fn every_change_arrives_signed_and_once_delivered_is_not_sent_again(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let (url, receiver) = Receiver::start(0).await;
    let paid = charge(&app, "tok_visa", true).await;
    assert_eq!(paid.status, 201, "{}", paid.body);
    let declined = charge(&app, "tok_chargeDeclined", true).await;
    assert_eq!(declined.status, 402, "{}", declined.body);
    let id = paid.body["id"].as_str().unwrap();
    let refund = back_office(
        &app,
        &format!("/api/charges/{id}/refunds"),
        json!({"amount_cents": 500}),
    )
    .await;
    assert_eq!(refund.status, 201, "{}", refund.body);
    let hold = charge(&app, "tok_visa", false).await;
    assert_eq!(hold.status, 201, "{}", hold.body);
    let hold_id = hold.body["id"].as_str().unwrap();
    let captured = back_office(&app, &format!("/api/charges/{hold_id}/capture"), json!({})).await;
    assert_eq!(captured.status, 201, "{}", captured.body);

    // What the API lists: one event per change, of the right types.
    let token = app.back_office_token("ops_hooks", "events:read");
    let listed = app.get_with(&token, "/api/events?limit=100").await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let mut types: Vec<&str> = listed.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    types.sort();
    assert_eq!(
        types,
        [
            "charge.captured",
            "charge.failed",
            "charge.requires_capture",
            "charge.succeeded",
            "refund.succeeded"
        ]
    );

    let store = app.db.store();
    let report = deliverer(store.clone(), &url).try_run_once().await.unwrap();
    assert_eq!((report.dispatched, report.delivered), (5, 5), "{report:?}");
    let stored = stored_events(&store).await;
    let got = receiver.got();
    assert_eq!(got.len(), 5);
    for delivery in &got {
        let event = event_of(delivery);
        let id = event["id"].as_str().unwrap();
        assert_eq!(stored.get(id), Some(&event), "delivered as stored");
        assert!(
            independently_verified(SECRET, &delivery.signature, &delivery.body),
            "{}",
            delivery.signature
        );
        // The helper refuses what the independent check refuses.
        use payments_client::webhook::{DEFAULT_TOLERANCE, verify, verify_at};
        assert!(
            verify(
                SECRET,
                &delivery.signature,
                &delivery.body,
                DEFAULT_TOLERANCE
            )
            .is_ok()
        );
        let mut tampered = delivery.body.to_vec();
        tampered.extend_from_slice(b" ");
        assert!(verify(SECRET, &delivery.signature, &tampered, DEFAULT_TOLERANCE).is_err());
        assert!(!independently_verified(
            SECRET,
            &delivery.signature,
            &tampered
        ));
        let wrong = "whsec_someone_else_0123456789abcdef";
        assert!(
            verify(
                wrong,
                &delivery.signature,
                &delivery.body,
                DEFAULT_TOLERANCE
            )
            .is_err()
        );
        let later = chrono::Utc::now().timestamp() + 600;
        let old = verify_at(
            SECRET,
            &delivery.signature,
            &delivery.body,
            DEFAULT_TOLERANCE,
            later,
        );
        assert!(old.is_err(), "a signature 10 minutes old is refused");
    }
    // Delivered is done: the next pass sends nothing.
    let again = deliverer(store.clone(), &url).try_run_once().await.unwrap();
    assert_eq!(again.total(), 0, "{again:?}");
    assert_eq!(receiver.got().len(), 5);
}

/// Makes the database refuse to settle charges of 4242 (a trigger that
/// fails the statement): their finish, and the event written with it, are
/// rolled back together.
async fn refuse_to_settle_4242(app: &TestApp) {
    let sqlite = "CREATE TRIGGER refuse_4242 BEFORE UPDATE OF status ON charges \
        WHEN NEW.amount_cents = 4242 AND NEW.status <> 'pending' \
        BEGIN SELECT RAISE(ABORT, 'rolled back by the test'); END";
    let pg_function = "CREATE FUNCTION refuse_4242() RETURNS trigger AS $$ BEGIN \
        IF NEW.amount_cents = 4242 AND NEW.status <> 'pending' THEN \
        RAISE EXCEPTION 'rolled back by the test'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql";
    let pg = "CREATE TRIGGER refuse_4242 BEFORE UPDATE ON charges FOR EACH ROW \
        EXECUTE FUNCTION refuse_4242()";
    let mysql = "CREATE TRIGGER refuse_4242 BEFORE UPDATE ON charges FOR EACH ROW BEGIN \
        IF NEW.amount_cents = 4242 AND NEW.status <> 'pending' THEN \
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'rolled back by the test'; END IF; END";
    app.db
        .execute_raw("SELECT 1", pg_function, "SELECT 1")
        .await;
    app.db.execute_raw(sqlite, pg, mysql).await;
}

/// The full fault run: `events` charges (their events), plus charges
/// whose change the database rolls back; the receiver fails half its
/// attempts; `payments-jobs deliver` is SIGKILLed five times while it
/// delivers. Every event arrives (duplicates only under the same id), and
/// no attempt names an event that is not in the database.
async fn deliveries_survive_a_failing_receiver_and_five_kills(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let events = if backend == Backend::Postgres {
        1000
    } else {
        100
    };
    refuse_to_settle_4242(&app).await;
    let (url, receiver) = Receiver::start(50).await;
    let mut made = Vec::new();
    let mut charges = futures_like_pool(&app, events, 16).await;
    made.append(&mut charges);
    // Changes rolled back: no event, so nothing for any runner to send.
    for _ in 0..5 {
        let body = json!({"amount_cents": 4242, "currency": "GBP", "card_token": "tok_visa"});
        let answer = Answer::of(
            app.post_charge("cus_hooks", Some(&new_key()), &body.to_string())
                .await,
        )
        .await;
        assert_ne!(answer.status, 201, "{}", answer.body);
    }
    let store = app.db.store();
    let stored = stored_events(&store).await;
    assert_eq!(stored.len(), events, "one event per charge made");

    let env = [
        ("DATABASE_URL", app.db.url.as_str()),
        ("WEBHOOK_ENDPOINTS", &endpoints(&url)),
        ("DELIVER_EVERY", "100ms"),
        ("DELIVER_BATCH", "20"),
        ("DELIVER_CONCURRENCY", "4"),
        ("WEBHOOK_TIMEOUT", "1s"),
        ("WEBHOOK_LEASE", "6s"),
        ("WEBHOOK_BACKOFF", "20ms"),
        ("WEBHOOK_BACKOFF_MAX", "200ms"),
        ("RUST_LOG", "error"),
    ];
    let start = || {
        let (process, _stdout) = Process::spawn("payments-jobs", &["deliver"], &env);
        process
    };
    let mut jobs = start();
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let accepted = receiver.accepted().len();
        if accepted >= stored.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{accepted} of {} events delivered by the deadline:\n{}",
            stored.len(),
            jobs.log()
        );
        // Killed while it delivers: after some progress since the start or
        // the last kill.
        if kills < 5 && accepted >= (kills + 1) * stored.len() / 8 {
            jobs.kill().await;
            kills += 1;
            jobs = start();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(kills, 5, "killed five times while delivering");
    jobs.kill().await;

    let attempts = receiver.got();
    let failed = attempts.iter().filter(|g| !g.accepted).count();
    assert!(failed > 0, "the receiver failed some attempts");
    let accepted = receiver.accepted();
    let ids: BTreeSet<&String> = accepted.keys().collect();
    let expected: BTreeSet<&String> = stored.keys().collect();
    assert_eq!(ids, expected, "every event arrived, and only those");
    let mut by_id: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for got in &attempts {
        let event = event_of(got);
        let id = event["id"].as_str().unwrap();
        assert!(
            stored.contains_key(id),
            "an attempt for an event that does not exist: {id}"
        );
        assert!(independently_verified(SECRET, &got.signature, &got.body));
        // A duplicate is the same event: the same id, the same bytes.
        let first = by_id
            .entry(id.to_owned())
            .or_insert_with(|| got.body.to_vec());
        assert_eq!(first, &got.body.to_vec(), "one body per event id");
    }
    let duplicates: usize = accepted.values().map(|n| n - 1).sum();
    eprintln!(
        "{backend:?}: {} events, {} attempts ({failed} answered 500), {duplicates} accepted twice, \
         {kills} kills",
        stored.len(),
        attempts.len()
    );
}

/// `n` succeeded charges, `concurrency` at a time: their ids.
async fn futures_like_pool(app: &TestApp, n: usize, concurrency: usize) -> Vec<String> {
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (next, http, url) = (next.clone(), app.http.clone(), app.base_url.clone());
        let token = app.token("cus_hooks");
        workers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < n as u64 {
                let body =
                    json!({"amount_cents": 1200, "currency": "GBP", "card_token": "tok_visa"});
                let response = http
                    .post(format!("{url}/api/charges"))
                    .bearer_auth(&token)
                    .header("idempotency-key", new_key())
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let answer = Answer::of(response).await;
                assert_eq!(answer.status, 201, "{}", answer.body);
                ids.push(answer.body["id"].as_str().unwrap().to_owned());
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for worker in workers {
        ids.extend(worker.await.unwrap());
    }
    ids
}

/// `payments-jobs` as ops run it: a failed attempt waits out its backoff;
/// past WEBHOOK_RETRY_FOR the delivery is given up and listed by
/// `payments-jobs webhooks`; `--resend-failed` and `--resend EVENT_ID` send
/// it again; an endpoint on a private address is refused at start.
async fn backoff_give_up_and_resend_through_payments_jobs(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let (url, receiver) = Receiver::start(100).await;
    let paid = charge(&app, "tok_visa", true).await;
    assert_eq!(paid.status, 201, "{}", paid.body);
    let hooks = endpoints(&url);
    let env = [
        ("DATABASE_URL", app.db.url.as_str()),
        ("WEBHOOK_ENDPOINTS", hooks.as_str()),
        ("WEBHOOK_BACKOFF", "1h"),
        ("WEBHOOK_BACKOFF_MAX", "1h"),
        ("WEBHOOK_RETRY_FOR", "2h"),
    ];
    let jobs = |args: &'static [&'static str]| async move {
        let (ok, stdout, stderr) = run_binary("payments-jobs", args, &env).await;
        assert!(ok, "payments-jobs {args:?}:\n{stderr}");
        stdout
    };
    let attempts = || receiver.attempts.load(Ordering::Relaxed);
    jobs(&["deliver", "--once"]).await;
    assert_eq!(attempts(), 1, "attempted once, answered 500");
    jobs(&["deliver", "--once"]).await;
    assert_eq!(attempts(), 1, "not again within its backoff");
    // Three hours later: due again, and older than WEBHOOK_RETRY_FOR.
    app.db.age_outbox(Duration::from_secs(3 * 3600)).await;
    jobs(&["deliver", "--once"]).await;
    assert_eq!(attempts(), 2);
    let listed = jobs(&["webhooks"]).await;
    let event = event_of(&receiver.got()[0]);
    let id = event["id"].as_str().unwrap();
    assert!(
        listed.contains(id) && listed.contains("last_status=500") && listed.contains("attempts=2"),
        "{listed}"
    );
    jobs(&["deliver", "--once"]).await;
    assert_eq!(attempts(), 2, "given up: not attempted again");

    // The receiver is back: every failed delivery sent again.
    receiver.fail_percent.store(0, Ordering::Relaxed);
    let resent = jobs(&["webhooks", "--resend-failed"]).await;
    assert!(resent.contains("1 failed deliveries"), "{resent}");
    jobs(&["deliver", "--once"]).await;
    assert_eq!(receiver.accepted().get(id), Some(&1));
    assert!(jobs(&["webhooks"]).await.contains("no failed deliveries"));
    // One event sent again on request, delivered or not: the same event.
    let (ok, stdout, stderr) =
        run_binary("payments-jobs", &["webhooks", "--resend", id], &env).await;
    assert!(ok && stdout.contains("1 deliveries"), "{stdout}{stderr}");
    jobs(&["deliver", "--once"]).await;
    assert_eq!(receiver.accepted().get(id), Some(&2));
    let (ok, _, stderr) = run_binary(
        "payments-jobs",
        &[
            "webhooks",
            "--resend",
            "evt_00000000000000000000000000000000",
        ],
        &env,
    )
    .await;
    assert!(!ok && stderr.contains("no event"), "{stderr}");

    // Aimed at the internal network: refused before anything runs.
    for internal in [
        "http://10.0.0.7/hook",
        "http://169.254.169.254/latest",
        "http://shop.example/hook",
    ] {
        let hooks = endpoints(internal);
        let env = [
            ("DATABASE_URL", app.db.url.as_str()),
            ("WEBHOOK_ENDPOINTS", hooks.as_str()),
        ];
        let (ok, _, stderr) = run_binary("payments-jobs", &["deliver", "--once"], &env).await;
        assert!(
            !ok && stderr.contains("WEBHOOK_ENDPOINTS"),
            "{internal}: {stderr}"
        );
    }
}

backend_tests!(all;
    every_change_arrives_signed_and_once_delivered_is_not_sent_again,
    deliveries_survive_a_failing_receiver_and_five_kills,
);

backend_tests!(backoff_give_up_and_resend_through_payments_jobs);
