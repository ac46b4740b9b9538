//! Every bad input: a 4xx envelope with a stable code, nothing stored, and
//! the same key then works with a valid request.

//!
//! What the HTTP layer and the domain refuse never reaches the store on any
//! backend, so those tests call the router in process (`Router::oneshot`)
//! over SQLite, once; the tests whose answers come from the database run
//! over HTTP on every backend.

use axum::body::Body;
use axum::http::Request;
use payments_tests::{
    Answer, AppOptions, Backend, TestApp, backend_tests, charge_body, new_key, spawn_app,
};
use serde_json::Value;

fn assert_envelope(answer: Answer, status: u16, code: &str) -> Value {
    assert_eq!(
        answer.status, status,
        "expected {status} {code}: {:?}",
        answer.body
    );
    assert_eq!(answer.headers["content-type"], "application/json");
    let body = answer.body;
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    body
}

/// `POST /api/charges` with these headers and body, through the router.
async fn post_raw(app: &TestApp, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
    let mut request = Request::post("/api/charges");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    app.oneshot(request.body(Body::from(body)).unwrap()).await
}

/// The app the router-only tests call: SQLite is always available.
async fn sqlite_app() -> TestApp {
    spawn_app(Backend::Sqlite, AppOptions::default())
        .await
        .expect("SQLite needs no server")
}

/// Invalid bodies, each with the `param` it names.
#[tokio::test]
async fn invalid_bodies_are_refused_and_not_stored() {
    let app = sqlite_app().await;
    let key = new_key();
    let token = format!("Bearer {}", app.token("cus_1"));
    let headers = [
        ("content-type", "application/json"),
        ("authorization", token.as_str()),
        ("idempotency-key", key.as_str()),
    ];
    let cases: &[(&str, Option<&str>)] = &[
        ("not json", None),
        ("[1,2]", None),
        (
            r#"{"amount_cents":4900,"currency":"GBP"}"#,
            Some("card_token"),
        ),
        (
            r#"{"amount_cents":0,"currency":"GBP","card_token":"tok_visa"}"#,
            Some("amount_cents"),
        ),
        (
            r#"{"amount_cents":-1,"currency":"GBP","card_token":"tok_visa"}"#,
            Some("amount_cents"),
        ),
        (
            r#"{"amount_cents":49.5,"currency":"GBP","card_token":"tok_visa"}"#,
            Some("amount_cents"),
        ),
        (
            r#"{"amount_cents":100000000000,"currency":"GBP","card_token":"tok_visa"}"#,
            Some("amount_cents"),
        ),
        (
            r#"{"amount_cents":4900,"currency":"QQQ","card_token":"tok_visa"}"#,
            Some("currency"),
        ),
        (
            r#"{"amount_cents":4900,"currency":"GBP","card_token":"tok_visa","surprise":1}"#,
            Some("surprise"),
        ),
        (
            r#"{"amount_cents":4900,"currency":"GBP","card_token":"tok_visa","metadata":{"k":7}}"#,
            Some("metadata[k]"),
        ),
        (
            r#"{"amount_cents":4900,"currency":"GBP","card_token":"tok_visa","description":5}"#,
            Some("description"),
        ),
    ];
    for (body, param) in cases {
        let answer = post_raw(&app, &headers, body.as_bytes().to_vec()).await;
        let envelope = assert_envelope(answer, 400, "invalid_request");
        match param {
            Some(p) => assert_eq!(envelope["error"]["param"], *p, "{body}"),
            None => assert!(envelope["error"].get("param").is_none(), "{body}"),
        }
    }
    assert_eq!(app.db.records().await, 0, "nothing stored");
    assert_eq!(app.db.charges().await, 0);
    // The same key with a valid body now succeeds, once.
    let valid = post_raw(&app, &headers, charge_body(4900, "tok_visa").into_bytes()).await;
    assert_eq!(valid.status, 201);
    assert_eq!(app.sandbox_charges().await.len(), 1);
}

/// Header, auth, size and content-type errors.
#[tokio::test]
async fn bad_requests_get_the_envelope() {
    let app = sqlite_app().await;
    let token = format!("Bearer {}", app.token("cus_1"));
    let key = new_key();
    let json = ("content-type", "application/json");
    let valid = charge_body(4900, "tok_visa").into_bytes();

    let no_auth = post_raw(&app, &[json, ("idempotency-key", &key)], valid.clone()).await;
    assert_envelope(no_auth, 401, "unauthorized");
    let bad_auth = post_raw(
        &app,
        &[
            json,
            ("idempotency-key", &key),
            ("authorization", "Bearer nope"),
        ],
        valid.clone(),
    )
    .await;
    assert_envelope(bad_auth, 401, "unauthorized");
    let other_secret = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &serde_json::json!({"sub": "cus_1", "exp": 4_000_000_000u64}),
        &jsonwebtoken::EncodingKey::from_secret(b"another-secret-another-secret-xx").unwrap(),
    )
    .unwrap();
    let forged = format!("Bearer {other_secret}");
    assert_envelope(
        post_raw(
            &app,
            &[json, ("idempotency-key", &key), ("authorization", &forged)],
            valid.clone(),
        )
        .await,
        401,
        "unauthorized",
    );

    let auth = ("authorization", token.as_str());
    assert_envelope(
        post_raw(&app, &[json, auth], valid.clone()).await,
        400,
        "idempotency_key_missing",
    );
    let long = "k".repeat(256);
    for bad_key in ["", "has space", long.as_str(), "\"unterminated"] {
        let r = post_raw(
            &app,
            &[json, auth, ("idempotency-key", bad_key)],
            valid.clone(),
        )
        .await;
        assert_envelope(r, 400, "idempotency_key_invalid");
    }
    let two_keys = [
        json,
        auth,
        ("idempotency-key", key.as_str()),
        ("idempotency-key", key.as_str()),
    ];
    let two = post_raw(&app, &two_keys, valid.clone()).await;
    assert_envelope(two, 400, "idempotency_key_invalid");

    let text = ("content-type", "text/plain");
    assert_envelope(
        post_raw(
            &app,
            &[text, auth, ("idempotency-key", &key)],
            valid.clone(),
        )
        .await,
        415,
        "unsupported_media_type",
    );
    assert_envelope(
        post_raw(&app, &[auth, ("idempotency-key", &key)], valid.clone()).await,
        415,
        "unsupported_media_type",
    );
    let huge = format!(
        r#"{{"amount_cents":1,"currency":"GBP","card_token":"tok_visa","description":"{}"}}"#,
        "x".repeat(17 * 1024)
    );
    assert_envelope(
        post_raw(
            &app,
            &[json, auth, ("idempotency-key", &key)],
            huge.into_bytes(),
        )
        .await,
        413,
        "payload_too_large",
    );

    assert_eq!(app.db.records().await, 0, "nothing stored");
    // A quoted key is the same key as the bare one.
    let quoted = format!("\"{key}\"");
    let ok = post_raw(
        &app,
        &[json, auth, ("idempotency-key", &quoted)],
        valid.clone(),
    )
    .await;
    assert_eq!(ok.status, 201);
    let replay = post_raw(&app, &[json, auth, ("idempotency-key", &key)], valid).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.headers["idempotent-replay"], "true");
    assert_eq!(app.sandbox_charges().await.len(), 1);
}

/// Reads, health, unknown routes and methods.
async fn other_routes(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let get = |path: &str| app.http.get(format!("{}{path}", app.base_url));
    assert_eq!(get("/healthz").send().await.unwrap().status(), 200);
    let ready: Value = get("/readyz").send().await.unwrap().json().await.unwrap();
    assert_eq!(ready["status"], "ready");
    assert_envelope(
        Answer::of(get("/nope").send().await.unwrap()).await,
        404,
        "not_found",
    );
    let missing = get("/api/charges/ch_missing")
        .bearer_auth(app.token("cus_1"))
        .send()
        .await
        .unwrap();
    assert_envelope(Answer::of(missing).await, 404, "not_found");
    let unauthorized = get("/api/charges/ch_x").send().await.unwrap();
    assert_envelope(Answer::of(unauthorized).await, 401, "unauthorized");
    let delete = app
        .http
        .delete(format!("{}/api/charges", app.base_url))
        .send()
        .await
        .unwrap();
    assert_envelope(Answer::of(delete).await, 405, "method_not_allowed");
    let rid = get("/healthz")
        .header("x-request-id", "req-123")
        .send()
        .await
        .unwrap();
    assert_eq!(rid.headers()["x-request-id"], "req-123");
    assert!(
        get("/healthz")
            .send()
            .await
            .unwrap()
            .headers()
            .contains_key("x-request-id")
    );
}

backend_tests!(other_routes);

/// `IDEMPOTENCY_KEY_MODE=optional`: keyless requests are served, without
/// protection (each one is a charge), while keyed ones stay exactly-once.
async fn optional_key_mode_serves_keyless_requests_unprotected(backend: Backend) {
    let options = AppOptions {
        key_mode: payments_api::config::KeyMode::Optional,
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    let body = charge_body(250, "tok_visa");
    for _ in 0..2 {
        assert_eq!(app.post_charge("cus_1", None, &body).await.status(), 201);
    }
    assert_eq!(
        app.sandbox_charges().await.len(),
        2,
        "keyless retries charge again"
    );
    assert_eq!(app.db.records().await, 0);
    let invalid = app
        .post_charge("cus_1", None, &charge_body(0, "tok_visa"))
        .await;
    assert_envelope(Answer::of(invalid).await, 400, "invalid_request");
    let declined = app
        .post_charge("cus_1", None, &charge_body(250, "tok_chargeDeclined"))
        .await;
    assert_eq!(declined.status(), 402);
    assert_eq!(app.db.charges_with_status("failed").await, 1);
    let key = new_key();
    for _ in 0..2 {
        assert_eq!(
            app.post_charge("cus_1", Some(&key), &body).await.status(),
            201
        );
    }
    assert_eq!(
        app.sandbox_charges().await.len(),
        3,
        "keyed requests stay exactly-once"
    );
    assert_eq!(app.db.charges_with_status("succeeded").await, 3);
}

backend_tests!(optional_key_mode_serves_keyless_requests_unprotected);

/// Ids and query values no backend can store or compare, table-driven over
/// every path id and every query parameter: a NUL (PostgreSQL's text
/// refuses it: it answered 500), ids of a shape no object has, `created`
/// bounds outside what every backend can store (PostgreSQL answered 500
/// "timestamp out of range"). A path id that cannot exist is a 404; a query
/// value is a 400 naming its parameter. Metadata keys a client may have
/// stored, odd as they are, are still looked up (200).
async fn unstorable_ids_and_values_are_refused(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let with_metadata =
        r#"{"amount_cents":4900,"currency":"GBP","card_token":"tok_visa","metadata":{"k":"v"}}"#;
    let charge = app.charge_json("cus_1", with_metadata).await;
    let id = charge["id"].as_str().unwrap().to_owned();
    let refunds = format!("/api/charges/{id}/refunds");
    let long = format!("ch_{}", "a".repeat(62));
    let not_found = [
        "/api/charges/%00".to_owned(),
        "/api/charges/ch_%00".to_owned(),
        "/api/charges/ch_1%20".to_owned(),
        format!("/api/charges/{long}"),
        format!("/api/charges/{}", id.replacen("ch_", "re_", 1)),
        "/api/refunds/%00".to_owned(),
        "/api/refunds/re_%00".to_owned(),
        format!("/api/refunds/{id}"),
        "/api/charges/%00/refunds".to_owned(),
        "/api/charges/ch_%00/refunds?limit=1".to_owned(),
    ];
    // Every case is run, and every answer that is not as expected listed.
    let mut wrong = Vec::new();
    let mut expect =
        |what: String, answer: Answer, status: u16, code: &str, param: Option<&str>| {
            let error = &answer.body["error"];
            let param_ok = param.is_none_or(|p| error["param"] == p);
            if answer.status != status || (status >= 400 && error["code"] != code) || !param_ok {
                wrong.push(format!("{what}: {} {}", answer.status, answer.body));
            }
        };
    for path in &not_found {
        let answer = app.get_as("cus_1", path).await;
        expect(format!("GET {path}"), answer, 404, "not_found", None);
    }
    for charge_id in ["%00", "ch_%00", "re_1"] {
        let body = serde_json::json!({"amount_cents": 100});
        let answer = app.post_refund("cus_1", charge_id, &new_key(), &body).await;
        let what = format!("POST /api/charges/{charge_id}/refunds");
        expect(what, answer, 404, "not_found", None);
    }
    let bad_queries = [
        ("/api/charges?idempotency_key=%00", "idempotency_key"),
        ("/api/charges?idempotency_key=a%00b", "idempotency_key"),
        ("/api/charges?idempotency_key=a%20b", "idempotency_key"),
        ("/api/charges?starting_after=%00", "starting_after"),
        ("/api/charges?starting_after=ch_%00", "starting_after"),
        ("/api/charges?ending_before=%00", "ending_before"),
        ("/api/charges?status=%00", "status"),
        ("/api/charges?limit=%00", "limit"),
        ("/api/charges?created[gte]=%00", "created[gte]"),
        ("/api/charges?created[gte]=-99999999999", "created[gte]"),
        ("/api/charges?created[lt]=-99999999999", "created[lt]"),
        (
            "/api/charges?created[gte]=-9223372036854775808",
            "created[gte]",
        ),
        ("/api/charges?created[gte]=-8000000000000", "created[gte]"),
        ("/api/charges?created[lt]=8000000000000", "created[lt]"),
        ("/api/charges?created[lt]=99999999999999", "created[lt]"),
        ("/api/charges?created[lt]=-1", "created[lt]"),
        ("/api/charges?metadata[%00]=x", "metadata[\u{0}]"),
        ("/api/charges?metadata[k%00]=x", "metadata[k\u{0}]"),
        ("/api/charges?metadata[k]=%00", "metadata[k]"),
        ("/api/charges?metadata[k]=a%00", "metadata[k]"),
        ("/api/charges?%00=x", "\u{0}"),
    ];
    let refund_queries = [
        ("starting_after=%00", "starting_after"),
        ("ending_before=%00", "ending_before"),
        ("limit=%00", "limit"),
        ("status=%00", "status"),
    ];
    let refund_queries = refund_queries.map(|(q, p)| (format!("{refunds}?{q}"), p));
    let queries = bad_queries
        .iter()
        .map(|(q, p)| ((*q).to_owned(), *p))
        .chain(refund_queries);
    for (path, param) in queries {
        let answer = app.get_as("cus_1", &path).await;
        expect(
            format!("GET {path}"),
            answer,
            400,
            "invalid_request",
            Some(param),
        );
    }
    let found = [
        "/api/charges?created[gte]=0".to_owned(),
        "/api/charges?created[lt]=253402300799".to_owned(),
        "/api/charges?metadata[%01]=x".to_owned(),
        "/api/charges?metadata[a.b]=x".to_owned(),
        "/api/charges?metadata[*]=x".to_owned(),
        "/api/charges?metadata[$]=x".to_owned(),
        "/api/charges?metadata[a%20b]=x".to_owned(),
        "/api/charges?metadata['%3B]=x".to_owned(),
        "/api/charges?metadata[%E2%98%95]=%01".to_owned(),
        format!("{refunds}?limit=1"),
    ];
    for path in &found {
        let answer = app.get_as("cus_1", path).await;
        expect(format!("GET {path}"), answer, 200, "", None);
    }
    assert!(wrong.is_empty(), "not as expected:\n{}", wrong.join("\n"));
    assert_eq!(app.db.charges().await, 1, "nothing stored");
}

backend_tests!(unstorable_ids_and_values_are_refused);

/// A currency that is no ISO 4217 code (in either case) is a 400 on
/// `currency` whose message names the form; nothing is stored, and the
/// same key then charges with a good one.
async fn a_bad_currency_is_told_the_form(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let key = new_key();
    let bodies = [
        r#""ZZZ""#,
        r#""zzz""#,
        r#""gb""#,
        r#""GBPX""#,
        r#""g8p""#,
        "826",
    ];
    for currency in bodies {
        let body =
            format!(r#"{{"amount_cents":4900,"currency":{currency},"card_token":"tok_visa"}}"#);
        let answer = Answer::of(app.post_charge("cus_1", Some(&key), &body).await).await;
        let envelope = assert_envelope(answer, 400, "invalid_request");
        assert_eq!(envelope["error"]["param"], "currency", "{currency}");
        let message = envelope["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("three-letter ISO 4217 code such as GBP or gbp"),
            "{currency}: {message}"
        );
    }
    assert_eq!(app.db.records().await, 0, "nothing stored");
    let body = r#"{"amount_cents":4900,"currency":"eur","card_token":"tok_visa"}"#;
    let answer = Answer::of(app.post_charge("cus_1", Some(&key), body).await).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    assert_eq!(answer.body["currency"], "EUR");
    assert_eq!(app.sandbox_charges().await.len(), 1);
}

backend_tests!(a_bad_currency_is_told_the_form);
