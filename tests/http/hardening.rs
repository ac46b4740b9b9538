//! What a security review asked for: no database text in answers, bounded
//! metric labels, cut-off slow clients, NUL refused alike everywhere, one
//! fingerprint for `null` and absent, and 503 for a lost database.

use std::sync::Arc;
use std::time::Duration;

use payments_api::server::HttpTimeouts;
use payments_domain::idempotency::RequestFingerprint;
use payments_tests::{
    Answer, AppOptions, Backend, TestApp, backend_tests, charge_body, network_backend_tests,
    new_key, spawn_app,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn app(backend: Backend) -> Option<Arc<TestApp>> {
    spawn_app(backend, AppOptions::default())
        .await
        .map(Arc::new)
}

/// `/readyz` answers 503 with a generic message when the database is not
/// ready; what the database said goes to the log only.
async fn readyz_hides_database_errors(backend: Backend) {
    let Some(app) = app(backend).await else {
        return;
    };
    let ready = app
        .http
        .get(format!("{}/readyz", app.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    app.db
        .execute(
            "DROP TABLE _sqlx_migrations",
            "DROP TABLE _sqlx_migrations",
            "DROP TABLE _sqlx_migrations",
        )
        .await;
    let r = app
        .http
        .get(format!("{}/readyz", app.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body = r.text().await.unwrap();
    let envelope: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(envelope["error"]["code"], "not_ready");
    assert_eq!(envelope["error"]["message"], "not ready");
    assert!(!body.contains("_sqlx_migrations"), "{body}");
}

/// A client can send any method token; the metrics label only the known
/// ones and call the rest `other`, so `/metrics` does not grow with them.
async fn invented_methods_are_labelled_other(backend: Backend) {
    let Some(app) = app(backend).await else {
        return;
    };
    for i in 0..200 {
        let method = reqwest::Method::from_bytes(format!("INVENTED{i}").as_bytes()).unwrap();
        let r = app
            .http
            .request(method, format!("{}/api/charges", app.base_url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405);
    }
    let metrics = app.metrics_text().await;
    assert!(
        !metrics.contains("INVENTED"),
        "invented methods became labels"
    );
    assert!(
        metrics.lines().any(
            |l| l.starts_with("payments_http_requests_total") && l.contains("method=\"other\"")
        ),
        "{metrics}"
    );
}

/// A NUL character in the description or the metadata is a 400 naming the
/// field, on every backend, and nothing is stored or charged.
async fn nul_characters_are_refused_alike(backend: Backend) {
    let Some(app) = app(backend).await else {
        return;
    };
    let cases = [
        (json!({"description": "tea\u{0}"}), "description"),
        (json!({"metadata": {"order": "4\u{0}2"}}), "metadata[order]"),
        (json!({"metadata": {"or\u{0}der": "42"}}), "metadata"),
    ];
    for (extra, param) in cases {
        let mut body = json!({"amount_cents": 100, "currency": "GBP", "card_token": "tok_visa"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = app
            .post_charge("cus_1", Some(&new_key()), &body.to_string())
            .await;
        assert_eq!(r.status(), 400, "{body}");
        let error: Value = r.json().await.unwrap();
        assert_eq!(error["error"]["code"], "invalid_request");
        assert_eq!(error["error"]["param"], param);
    }
    assert_eq!(app.db.records().await, 0);
    assert_eq!(app.db.charges().await, 0);
    assert_eq!(app.sandbox_stats().await["requests"], 0);
}

/// `"description": null` and no description are the same request: retries
/// mixing the two, eight at once, get one charge and no 422. A record
/// written before the change (first-version fingerprint of a body with
/// explicit nulls) still replays that body's retry.
async fn null_and_absent_fields_are_one_request(backend: Backend) {
    let Some(app) = app(backend).await else {
        return;
    };
    let key = new_key();
    let absent = charge_body(4900, "tok_visa");
    let null = r#"{"amount_cents":4900,"currency":"GBP","card_token":"tok_visa","description":null,"metadata":null}"#;
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (app, key, barrier) = (app.clone(), key.clone(), barrier.clone());
            let body = if i % 2 == 0 {
                absent.clone()
            } else {
                null.to_owned()
            };
            tokio::spawn(async move {
                barrier.wait().await;
                app.post_charge("cus_1", Some(&key), &body)
                    .await
                    .status()
                    .as_u16()
            })
        })
        .collect();
    for t in tasks {
        let status = t.await.unwrap();
        assert!(status == 201 || status == 409, "got {status}");
    }
    for body in [absent.as_str(), null] {
        let r = app.post_charge("cus_1", Some(&key), body).await;
        assert_eq!(r.status(), 201);
        assert_eq!(r.headers()["idempotent-replay"], "true");
    }
    assert_eq!(app.sandbox_charges().await.len(), 1);

    // As the server before the change stored it.
    let old_key = new_key();
    let r = app.post_charge("cus_2", Some(&old_key), null).await;
    assert_eq!(r.status(), 201);
    let v1 = RequestFingerprint::of_v1(&serde_json::from_str::<Value>(null).unwrap()).to_hex();
    let set = format!(
        "UPDATE idempotent_requests SET request_hash = '{v1}' WHERE idempotency_key = '{old_key}'"
    );
    assert_eq!(app.db.execute(&set, &set, &set).await, 1);
    let retry = app.post_charge("cus_2", Some(&old_key), null).await;
    assert_eq!(retry.status(), 201, "a retry across the upgrade replays");
    assert_eq!(retry.headers()["idempotent-replay"], "true");
    assert_eq!(app.sandbox_charges().await.len(), 2);
}

/// A connection the database dropped (a restart, a failover) answers 503
/// with `Retry-After`, never a 500 carrying the driver's message; the
/// retry with the same key charges once.
async fn a_lost_database_connection_answers_503(backend: Backend) {
    let Some(app) = app(backend).await else {
        return;
    };
    let warm = app
        .post_charge("cus_1", Some(&new_key()), &charge_body(100, "tok_visa"))
        .await;
    assert_eq!(warm.status(), 201);
    assert!(app.db.drop_connections().await >= 1);
    let key = new_key();
    let r = app
        .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "2");
    let body = r.text().await.unwrap();
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "service_unavailable");
    for driver_text in [
        "sqlx",
        "connection",
        "terminat",
        "Lost",
        "broken pipe",
        "database",
    ] {
        assert!(!body.contains(driver_text), "{body}");
    }
    // The pool replaces dead connections; the same key then charges once.
    let mut status = 503;
    for _ in 0..10 {
        let r = app
            .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
            .await;
        status = r.status().as_u16();
        if status == 201 {
            break;
        }
        assert!(status == 503 || status == 409, "got {status}");
    }
    assert_eq!(status, 201);
    assert_eq!(
        app.sandbox_charges().await.len(),
        2,
        "the warm-up and this one"
    );
}

fn quick_timeouts() -> AppOptions {
    AppOptions {
        http: HttpTimeouts {
            http_header_read_timeout: Duration::from_secs(1),
            http_body_read_timeout: Duration::from_secs(1),
            http_idle_timeout: Duration::from_secs(1),
        },
        ..AppOptions::default()
    }
}

/// Reads until the server closes the connection (within `within`);
/// returns what it sent.
async fn read_until_closed(stream: &mut tokio::net::TcpStream, within: Duration) -> String {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server kept the connection open");
    String::from_utf8_lossy(&seen).into_owned()
}

/// A client that sends half a header, one that trickles its body, and an
/// idle keep-alive connection are each cut off by the server's timeouts
/// (1 s here; 10 s, 30 s and 60 s by default). The trickled charge is
/// answered 408 and nothing is stored.
async fn slow_clients_are_cut_off(backend: Backend) {
    let Some(app) = spawn_app(backend, quick_timeouts()).await else {
        return;
    };
    let addr = app.base_url.trim_start_matches("http://").to_owned();

    let mut half = tokio::net::TcpStream::connect(&addr).await.unwrap();
    half.write_all(b"POST /api/charges HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    read_until_closed(&mut half, Duration::from_secs(5)).await;

    let body = charge_body(4900, "tok_visa");
    let head = format!(
        "POST /api/charges HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        app.token("cus_1"),
        new_key(),
        body.len()
    );
    let mut trickle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    trickle.write_all(head.as_bytes()).await.unwrap();
    // A few bytes of the body, slowly, then nothing: the body never ends.
    // (Writing on after the server closed would reset the connection and
    // could discard its answer before this test reads it.)
    for byte in body.bytes().take(4) {
        trickle.write_all(&[byte]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let answer = read_until_closed(&mut trickle, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert_eq!(app.db.records().await, 0);
    assert_eq!(app.db.charges().await, 0);

    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut idle, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A token whose subject has whitespace at an end or a control character
/// is refused 401 with a message that says so, on every route, before any
/// query: `cus_victim ` never lists `cus_victim`'s charges (MariaDB's
/// PAD SPACE collation compared the two equal), by key or otherwise.
async fn padded_customer_ids_are_refused_at_authentication(backend: Backend) {
    let Some(app) = app(backend).await else {
        return;
    };
    let key = new_key();
    let body = json!({"amount_cents": 4900, "currency": "GBP", "card_token": "tok_visa",
        "description": "the victim's order", "metadata": {"order": "42"}});
    let victim = app
        .post_charge("cus_victim", Some(&key), &body.to_string())
        .await;
    assert_eq!(victim.status(), 201);
    let charge_id = victim.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for sub in [
        "cus_victim ",
        " cus_victim",
        "cus_victim\t",
        "cus_victim\u{a0}",
        "cus_\u{1}victim",
    ] {
        let token = app.token(sub);
        let gets = [
            "/api/charges".to_owned(),
            format!("/api/charges?idempotency_key={key}"),
            "/api/charges?metadata[order]=42".to_owned(),
            format!("/api/charges/{charge_id}"),
            format!("/api/charges/{charge_id}/refunds"),
        ];
        for path in gets {
            let r = app
                .http
                .get(format!("{}{path}", app.base_url))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            let www = r.headers().get("www-authenticate").cloned();
            let answer = Answer::of(r).await;
            assert_eq!(answer.status, 401, "{sub:?} {path}: {}", answer.body);
            assert_eq!(answer.body["error"]["code"], "unauthorized");
            let message = answer.body["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("customer id") && message.contains("whitespace"),
                "{message}"
            );
            assert!(
                !message.contains("victim"),
                "the subject is not echoed: {message}"
            );
            assert_eq!(
                www.as_ref().and_then(|v| v.to_str().ok()),
                Some(r#"Bearer error="invalid_token""#)
            );
        }
        let post = app
            .http
            .post(format!("{}/api/charges", app.base_url))
            .bearer_auth(&token)
            .header("idempotency-key", new_key())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(post.status(), 401, "{sub:?}");
    }
    assert_eq!(app.db.charges().await, 1, "nothing else stored");
    assert_eq!(app.sandbox_charges().await.len(), 1);
}

/// SQLite rolling a transaction back itself (as on a full disk or an I/O
/// error; here a trigger's `RAISE(ROLLBACK)` on every write, claims and
/// readiness probe alike) leaves the driver's `ROLLBACK` failing and its
/// one writer connection still counting a transaction. The connection is
/// replaced: once the fault is gone, other customers' writes succeed
/// without a restart, and the failed charge's retry with its key charges
/// once. `/readyz` answers 503 while no write can commit, and 200 again
/// after.
async fn sqlite_recovers_from_a_transaction_it_rolled_back(write_batch: u32) {
    let options = AppOptions {
        sqlite_write_batch: write_batch,
        ..AppOptions::default()
    };
    let app = spawn_app(Backend::Sqlite, options)
        .await
        .expect("SQLite needs no server");
    let ready = || async {
        let r = app.http.get(format!("{}/readyz", app.base_url)).send();
        r.await.unwrap().status().as_u16()
    };
    let charge = |customer: &'static str, key: String| {
        let app = &app;
        async move {
            let r = app
                .post_charge(customer, Some(&key), &charge_body(4900, "tok_visa"))
                .await;
            r.status().as_u16()
        }
    };
    assert_eq!(charge("cus_before", new_key()).await, 201);
    assert_eq!(ready().await, 200);

    let fault = [
        "CREATE TRIGGER fault_claims BEFORE INSERT ON idempotent_requests \
         BEGIN SELECT RAISE(ROLLBACK, 'simulated: database or disk is full'); END",
        "CREATE TRIGGER fault_probe BEFORE UPDATE ON _sqlx_migrations \
         BEGIN SELECT RAISE(ROLLBACK, 'simulated: database or disk is full'); END",
    ];
    for sql in fault {
        app.db.execute(sql, "", "").await;
    }
    let failed_key = new_key();
    let failed = charge("cus_a", failed_key.clone()).await;
    assert!(failed >= 500, "a write SQLite rolled back fails: {failed}");
    let ready_while_failing = ready().await;

    for sql in ["DROP TRIGGER fault_claims", "DROP TRIGGER fault_probe"] {
        app.db.execute(sql, "", "").await;
    }
    let other = charge("cus_b", new_key()).await;
    let ready_after = ready().await;
    assert_eq!(
        (ready_while_failing, other, ready_after),
        (503, 201, 200),
        "(/readyz while every write fails, another customer's charge once the fault is gone, \
         /readyz then)"
    );
    assert_eq!(charge("cus_a", failed_key).await, 201, "the retry charges");
    assert_eq!(app.sandbox_charges().await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_recovers_from_a_transaction_it_rolled_back_in_a_batch() {
    sqlite_recovers_from_a_transaction_it_rolled_back(payments_store::DEFAULT_WRITE_BATCH).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_recovers_from_a_transaction_it_rolled_back_unbatched() {
    sqlite_recovers_from_a_transaction_it_rolled_back(1).await;
}

backend_tests!(padded_customer_ids_are_refused_at_authentication);
backend_tests!(
    serializable;
    readyz_hides_database_errors,
    nul_characters_are_refused_alike,
    null_and_absent_fields_are_one_request,
);
backend_tests!(
    invented_methods_are_labelled_other,
    slow_clients_are_cut_off
);
network_backend_tests!(a_lost_database_connection_answers_503);
