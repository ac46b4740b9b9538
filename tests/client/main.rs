//! The client's retry loop over loopback: against scripted stand-in servers
//! (axum on 127.0.0.1:0) that record every attempt, and against the real
//! API in front of the real sandbox.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use payments_client::{Answer, ApiError, ChargeRequest, Client, ClientError, IdempotencyKey};
use payments_tests::{AppOptions, Backend, TestApp, spawn_app};

// ---------------------------------------------------------------------------
// A scripted stand-in: answers by the attempt number of each key and records
// what every attempt sent.

/// One canned answer.
#[derive(Debug, Clone)]
struct Canned {
    status: u16,
    retry_after: Option<u64>,
    body: String,
}

fn canned(status: u16, retry_after: Option<u64>, body: &str) -> Canned {
    Canned {
        status,
        retry_after,
        body: body.to_owned(),
    }
}

fn error_body(code: &str) -> String {
    format!(r#"{{"error":{{"code":"{code}","message":"scripted"}}}}"#)
}

fn charge_body(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","customer_id":"cus_standin","amount_cents":100,"currency":"GBP","status":"succeeded","description":null,"metadata":{{}},"gateway_charge_id":"gw_{id}","created_at":"2024-05-01T12:00:00.000Z"}}"#
    )
}

/// What one attempt sent.
#[derive(Debug, Clone)]
struct Seen {
    key: Option<String>,
    body: Bytes,
    at: Instant,
}

type Script = Arc<dyn Fn(usize) -> Canned + Send + Sync>;

#[derive(Clone)]
struct StandIn {
    script: Script,
    seen: Arc<Mutex<Vec<Seen>>>,
    per_key: Arc<Mutex<HashMap<Option<String>, usize>>>,
}

impl StandIn {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn scripted(State(stand_in): State<StandIn>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned());
    let attempt = {
        let mut per_key = stand_in.per_key.lock().unwrap();
        let n = per_key.entry(key.clone()).or_default();
        *n += 1;
        *n - 1
    };
    stand_in.seen.lock().unwrap().push(Seen {
        key,
        body,
        at: Instant::now(),
    });
    let answer = (stand_in.script)(attempt);
    let mut response = (
        StatusCode::from_u16(answer.status).unwrap(),
        [(header::CONTENT_TYPE, "application/json")],
        answer.body,
    )
        .into_response();
    if let Some(seconds) = answer.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, seconds.into());
    }
    response
}

/// Starts a stand-in that answers the n-th attempt of each key (0-based)
/// with `script(n)`.
async fn stand_in(script: impl Fn(usize) -> Canned + Send + Sync + 'static) -> (String, StandIn) {
    let state = StandIn {
        script: Arc::new(script),
        seen: Arc::default(),
        per_key: Arc::default(),
    };
    let app = Router::new()
        .route("/api/charges", post(scripted))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, state)
}

/// A client that backs off briefly, so scripted retries run fast.
fn fast_client(url: &str) -> Client {
    Client::builder(url, "token")
        .attempt_timeout(Duration::from_secs(5))
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .build()
        .unwrap()
}

/// A client that gives up after three attempts, backing off briefly.
fn three_attempt_client(url: &str) -> Client {
    Client::builder(url, "token")
        .max_attempts(3)
        .backoff(Duration::from_millis(10), Duration::from_millis(20))
        .build()
        .unwrap()
}

/// `err` leaves the charge's outcome open, and its message says what to do.
fn assert_outcome_unknown(err: &ClientError, advice: &str) {
    assert!(err.outcome_unknown(), "{err:?}");
    assert!(err.to_string().contains(advice), "{err}");
}

fn visa() -> ChargeRequest {
    ChargeRequest::new(100, "GBP", "tok_visa")
}

#[tokio::test]
async fn one_key_per_operation_reused_by_every_attempt() {
    // 503 twice, then 201: three attempts per operation.
    let (url, server) = stand_in(|attempt| match attempt {
        0 | 1 => canned(503, Some(0), &error_body("gateway_unavailable")),
        _ => canned(201, None, &charge_body("ch_standin")),
    })
    .await;
    let client = fast_client(&url);

    let first = client.charge(&visa()).await.unwrap();
    let second = client.charge(&visa()).await.unwrap();

    assert_eq!((first.attempts, second.attempts), (3, 3));
    assert!(matches!(first.answer, Answer::Done(ref c) if c.id == "ch_standin"));
    let seen = server.seen();
    assert_eq!(seen.len(), 6, "3 attempts per operation");
    let keys: Vec<&str> = seen.iter().map(|s| s.key.as_deref().unwrap()).collect();
    assert!(
        keys[0..3].iter().all(|k| *k == first.key.as_str()),
        "every attempt of the first operation sends its one key: {keys:?}"
    );
    assert!(
        keys[3..6].iter().all(|k| *k == second.key.as_str()),
        "every attempt of the second operation sends its one key: {keys:?}"
    );
    assert_ne!(keys[0], keys[3], "a new operation gets a new key");
    assert!(
        seen.iter().all(|s| s.body == seen[0].body),
        "every attempt sends the same bytes"
    );
    // The key is a UUID v4.
    assert_eq!(uuid::Uuid::parse_str(keys[0]).unwrap().get_version_num(), 4);
}

#[tokio::test]
async fn charge_with_key_sends_the_callers_key() {
    let (url, server) = stand_in(|attempt| match attempt {
        0 => canned(502, None, "<html>bad gateway</html>"),
        _ => canned(201, None, &charge_body("ch_1")),
    })
    .await;
    let key = IdempotencyKey::parse("order-42-payment-1").unwrap();
    let outcome = fast_client(&url)
        .charge_with_key(&key, &visa())
        .await
        .unwrap();
    assert_eq!(outcome.key, key);
    assert_eq!(outcome.attempts, 2);
    let keys: Vec<_> = server.seen().into_iter().map(|s| s.key).collect();
    assert_eq!(keys, vec![Some(key.to_string()), Some(key.to_string())]);
}

#[tokio::test]
async fn retry_after_of_a_409_is_honoured() {
    let (url, server) = stand_in(|attempt| match attempt {
        0 => canned(409, Some(1), &error_body("request_in_progress")),
        _ => canned(201, None, &charge_body("ch_1")),
    })
    .await;
    let outcome = fast_client(&url).charge(&visa()).await.unwrap();
    assert_eq!(outcome.attempts, 2);
    let seen = server.seen();
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_secs(1),
        "waited {waited:?}, Retry-After said 1 s"
    );
}

#[tokio::test]
async fn request_abandoned_is_final_and_keeps_the_key() {
    let (url, server) = stand_in(|_| canned(500, None, &error_body("request_abandoned"))).await;
    let err = fast_client(&url).charge(&visa()).await.unwrap_err();
    let ClientError::Abandoned { key, attempts, .. } = &err else {
        panic!("expected Abandoned, got {err:?}");
    };
    assert_eq!(*attempts, 1);
    assert_eq!(server.seen().len(), 1, "never retried");
    assert_eq!(server.seen()[0].key.as_deref(), Some(key.as_str()));
    assert_outcome_unknown(&err, "do not charge again with a new key");
}

#[tokio::test]
async fn other_server_errors_are_retried() {
    let (url, _server) = stand_in(|attempt| match attempt {
        0 => canned(500, None, &error_body("internal_error")),
        1 => canned(504, None, "upstream timed out"),
        _ => canned(201, None, &charge_body("ch_1")),
    })
    .await;
    let outcome = fast_client(&url).charge(&visa()).await.unwrap();
    assert_eq!(outcome.attempts, 3);
}

#[tokio::test]
async fn gives_up_after_max_attempts_and_returns_the_key() {
    let (url, server) =
        stand_in(|_| canned(503, Some(0), &error_body("gateway_unavailable"))).await;
    let err = three_attempt_client(&url)
        .charge(&visa())
        .await
        .unwrap_err();
    let ClientError::GaveUp {
        key,
        attempts,
        last,
        ..
    } = &err
    else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert_eq!(*attempts, 3);
    assert!(last.contains("503 gateway_unavailable"), "{last}");
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s.key.as_deref() == Some(key.as_str())));
    assert_outcome_unknown(&err, "retry later with the same idempotency key");
}

#[tokio::test]
async fn the_deadline_stops_a_wait_that_would_pass_it() {
    let (url, server) =
        stand_in(|_| canned(409, Some(30), &error_body("request_in_progress"))).await;
    let client = Client::builder(&url, "token")
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = client.charge(&visa()).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(err, ClientError::GaveUp { attempts: 1, .. }),
        "{err:?}"
    );
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn connection_errors_are_retried_then_reported() {
    // A port nobody listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let err = three_attempt_client(&url)
        .charge(&visa())
        .await
        .unwrap_err();
    let ClientError::GaveUp { attempts, last, .. } = &err else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert_eq!(*attempts, 3);
    assert!(last.contains("could not connect"), "{last}");
}

// ---------------------------------------------------------------------------
// The real API in front of the real sandbox.

/// `err` is a final refusal with `status` after one attempt, the outcome
/// known: its error and the key it kept.
fn final_rejection(err: &ClientError, status: u16) -> (&ApiError, &Option<IdempotencyKey>) {
    let ClientError::Rejected {
        status: got,
        error,
        attempts,
        key,
    } = err
    else {
        panic!("expected Rejected, got {err:?}");
    };
    assert_eq!((*got, *attempts), (status, 1), "{err:?}");
    assert!(!err.outcome_unknown());
    (error, key)
}

async fn app(options: AppOptions) -> TestApp {
    spawn_app(Backend::Sqlite, options)
        .await
        .expect("SQLite is always available")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_provider_is_charged_once_through_timeouts_and_retries() {
    let app = app(AppOptions::slow_provider(1200)).await;
    // The incident in miniature: the client gives up on each attempt long
    // before the provider answers.
    let client = Client::builder(&app.base_url, app.token("cus_alice"))
        .attempt_timeout(Duration::from_millis(500))
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .build()
        .unwrap();

    let outcome = client.charge(&visa()).await.unwrap();

    assert!(outcome.attempts > 1, "took {} attempt(s)", outcome.attempts);
    assert!(
        outcome.replayed,
        "the answer that arrived is the first attempt's stored one"
    );
    let charge = outcome.charge().expect("charged");
    assert_eq!(charge.customer_id, "cus_alice");
    assert_eq!(app.sandbox_charges().await.len(), 1, "charged once");
    assert_eq!(app.db.charges().await, 1);
    assert_eq!(
        client.get_charge(&charge.id).await.unwrap().as_ref(),
        Some(charge)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decline_is_final_with_its_decline_code() {
    let app = app(AppOptions::default()).await;
    let client = Client::new(&app.base_url, app.token("cus_bob")).unwrap();
    let outcome = client
        .charge(&ChargeRequest::new(
            100,
            "GBP",
            "tok_chargeDeclinedInsufficientFunds",
        ))
        .await
        .unwrap();
    assert_eq!(outcome.attempts, 1);
    assert!(!outcome.replayed);
    let Answer::Declined(decline) = &outcome.answer else {
        panic!("expected a decline, got {outcome:?}");
    };
    assert_eq!(decline.code, "card_declined");
    assert_eq!(decline.decline_code.as_deref(), Some("insufficient_funds"));

    // The same key replays the decline; it cannot become a charge.
    let again = client
        .charge_with_key(
            &outcome.key,
            &ChargeRequest::new(100, "GBP", "tok_chargeDeclinedInsufficientFunds"),
        )
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.answer, outcome.answer);
    assert!(app.sandbox_charges().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_validation_error_is_final_with_its_param() {
    let app = app(AppOptions::default()).await;
    let client = Client::new(&app.base_url, app.token("cus_carol")).unwrap();
    let err = client
        .charge(&ChargeRequest::new(100, "ZZZ", "tok_visa"))
        .await
        .unwrap_err();
    let (error, key) = final_rejection(&err, 400);
    assert_eq!(error.code, "invalid_request");
    assert_eq!(error.param.as_deref(), Some("currency"));

    // Validation failures are not stored: the fixed request may reuse the key.
    let fixed = client
        .charge_with_key(key.as_ref().unwrap(), &visa())
        .await
        .unwrap();
    assert!(fixed.charge().is_some());
    assert!(!fixed.replayed);
    assert_eq!(app.db.charges().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_token_is_rejected_and_an_unknown_charge_is_none() {
    let app = app(AppOptions::default()).await;
    let err = Client::new(&app.base_url, "not-a-jwt")
        .unwrap()
        .charge(&visa())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Rejected { status: 401, .. }),
        "{err:?}"
    );

    let client = Client::new(format!("{}/", app.base_url), app.token("cus_dan")).unwrap();
    assert_eq!(client.get_charge("ch_does_not_exist").await.unwrap(), None);
    // Another customer's charge is not found either.
    let theirs = Client::new(&app.base_url, app.token("cus_erin"))
        .unwrap()
        .charge(&visa())
        .await
        .unwrap();
    let id = &theirs.charge().unwrap().id;
    assert_eq!(client.get_charge(id).await.unwrap(), None);
}

#[tokio::test]
async fn retry_after_of_a_429_is_honoured() {
    let (url, server) = stand_in(|attempt| match attempt {
        0 => canned(429, Some(1), &error_body("rate_limited")),
        _ => canned(201, None, &charge_body("ch_1")),
    })
    .await;
    let outcome = fast_client(&url).charge(&visa()).await.unwrap();
    assert_eq!(outcome.attempts, 2);
    let seen = server.seen();
    assert_eq!(seen[0].key, seen[1].key, "the same key after a 429");
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_secs(1),
        "waited {waited:?}, Retry-After said 1 s"
    );
}

/// Over the customer's rate, the real server answers 429 with
/// `Retry-After`; the client waits as told and its retry, with the same
/// key, is admitted: one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limited_charge_is_retried_after_the_wait_and_made_once() {
    let app = app(AppOptions {
        // Burst 1, one a second.
        rate_limit: Some((60, 1)),
        ..AppOptions::default()
    })
    .await;
    let client = Client::new(&app.base_url, app.token("cus_fast")).unwrap();
    let first = client.charge(&visa()).await.unwrap();
    assert_eq!(first.attempts, 1);
    let second = client.charge(&visa()).await.unwrap();
    assert!(second.charge().is_some(), "{second:?}");
    assert!(second.attempts >= 2, "the first attempt was over the rate");
    assert_ne!(first.key, second.key);
    assert_eq!(app.sandbox_charges().await.len(), 2);
    assert_eq!(app.db.charges().await, 2);
}

/// The provider refusing the request itself (an unknown card token) is
/// final: one attempt, 400 `provider_rejected_request` with the provider's
/// code, and the key is kept (its answer is stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_the_provider_rejects_is_final() {
    let app = app(AppOptions::default()).await;
    let client = Client::new(&app.base_url, app.token("cus_gil")).unwrap();
    let err = client
        .charge(&ChargeRequest::new(100, "GBP", "tok_doesNotExist"))
        .await
        .unwrap_err();
    let (error, _) = final_rejection(&err, 400);
    assert_eq!(error.code, "provider_rejected_request");
    assert_eq!(error.provider_code.as_deref(), Some("resource_missing"));
    assert!(app.sandbox_charges().await.is_empty());
}

/// One client per role (issue 26): the app's client cannot refund (403
/// `insufficient_scope`, final at once: one attempt, nothing refunded); the
/// back office's, made from it with `with_token`, refunds the customer's
/// charge and lists that customer's charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_per_role_refunds_from_the_back_office_only() {
    use payments_client::model::{ChargeQuery, RefundRequest};
    let app = app(AppOptions::default()).await;
    let customer = Client::new(&app.base_url, app.token("cus_fay")).unwrap();
    let charged = customer.charge(&visa()).await.unwrap();
    let charge = charged.charge().unwrap().clone();
    let half = RefundRequest {
        amount_cents: Some(charge.amount_cents / 2),
        ..RefundRequest::default()
    };
    let key = IdempotencyKey::generate();
    let err = customer
        .refund_with_key(&key, &charge.id, &half)
        .await
        .unwrap_err();
    let (error, _) = final_rejection(&err, 403);
    assert_eq!(error.code, "insufficient_scope");
    assert!(app.sandbox_refunds().await.is_empty());

    let office =
        customer.with_token(app.back_office_token("ops_fay", "refunds:write charges:read_all"));
    let refunded = office
        .refund_with_key(&key, &charge.id, &half)
        .await
        .unwrap();
    let refund = refunded.done().unwrap();
    assert_eq!(
        (
            refund.requested_by.subject.as_str(),
            refund.requested_by.role.as_str()
        ),
        ("ops_fay", "back_office")
    );
    let listed = office
        .list_charges(&ChargeQuery {
            customer: Some("cus_fay".to_owned()),
            ..ChargeQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.data.len(), 1);
    assert_eq!(listed.data[0].amount_refunded, charge.amount_cents / 2);
    // The customer reads the refund the back office made.
    assert_eq!(
        customer.get_refund(&refund.id).await.unwrap().as_ref(),
        Some(refund)
    );
    assert_eq!(app.sandbox_refunds().await.len(), 1);
}

/// Holds through the client (issue 27): `authorize` makes a hold; a
/// capture through a slow provider is made once however many attempts
/// the retry loop takes (each times out first, the stored answer arrives
/// as a replay); the hold then refuses a cancel with a final
/// `charge_already_captured`. `cancel` releases another hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn authorize_capture_and_cancel_each_once_through_the_retry_loop() {
    use payments_client::model::{CaptureRequest, ChargeStatus};
    let app = app(AppOptions::default()).await;
    let customer = Client::new(&app.base_url, app.token("cus_gil")).unwrap();
    let held = customer.authorize(&visa()).await.unwrap();
    let hold = held.charge().unwrap().clone();
    assert_eq!(hold.status, ChargeStatus::RequiresCapture);
    assert!(!hold.captured && hold.capture_before.is_some());

    app.configure_sandbox(serde_json::json!({"latency_ms": 1200}))
        .await;
    let office = Client::builder(
        &app.base_url,
        app.back_office_token("ops_gil", "charges:capture"),
    )
    .attempt_timeout(Duration::from_millis(500))
    .backoff(Duration::from_millis(100), Duration::from_secs(1))
    .build()
    .unwrap();
    let part = CaptureRequest {
        amount_cents: Some(hold.amount_cents - 10),
    };
    let captured = office.capture(&hold.id, &part).await.unwrap();
    assert!(
        captured.attempts > 1,
        "took {} attempt(s)",
        captured.attempts
    );
    let charge = captured.charge().unwrap();
    assert_eq!(
        (
            charge.status,
            charge.amount_captured,
            charge.amount_released
        ),
        (ChargeStatus::Succeeded, hold.amount_cents - 10, 10)
    );
    let captures = app.sandbox_get("/_sandbox/captures").await;
    assert_eq!(captures["data"].as_array().map(Vec::len), Some(1));
    app.configure_sandbox(serde_json::json!({})).await;

    let err = office.cancel(&hold.id).await.unwrap_err();
    let (error, _) = final_rejection(&err, 400);
    assert_eq!(error.code, "charge_already_captured");

    let other = customer.authorize(&visa()).await.unwrap();
    let other = other.charge().unwrap();
    let canceled = office.cancel(&other.id).await.unwrap();
    assert_eq!(canceled.charge().unwrap().status, ChargeStatus::Canceled);
    // Customers never capture: final at once.
    let err = customer
        .capture(&other.id, &CaptureRequest::default())
        .await
        .unwrap_err();
    assert_eq!(final_rejection(&err, 403).0.code, "insufficient_scope");
}
