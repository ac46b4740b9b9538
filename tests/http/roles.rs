//! Who may move money (issue 26): customers charge and read their own; the
//! back office (a token of the back office's audience) refunds any
//! customer's charge and, with `charges:read_all`, reads and lists any
//! customer's. A missing scope is 403 `insufficient_scope` before anything
//! is read or stored.

use std::sync::Arc;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use payments_tests::{
    AppOptions, Backend, TEST_SECRET, TestApp, backend_tests, charge_body, new_key,
    parallel_refunds, spawn_app,
};
use serde_json::{Value, json};

/// An HS256 token of the test apps' secret with these claims, `exp` added.
fn signed(mut claims: Value) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    claims["exp"] = exp.into();
    let key = EncodingKey::from_secret(TEST_SECRET.as_bytes()).unwrap();
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap()
}

/// The refunds-route records in the database.
async fn refund_records(app: &TestApp) -> i64 {
    app.db
        .count(
            "SELECT COUNT(*) FROM idempotent_requests WHERE route = ?",
            "SELECT COUNT(*) FROM idempotent_requests WHERE route = $1",
            &["POST /api/charges/{id}/refunds"],
        )
        .await
}

/// 403 `insufficient_scope` naming `scope`, in the body and in the
/// RFC 6750 challenge.
fn assert_insufficient(answer: &payments_tests::Answer, scope: &str) {
    assert_eq!(
        (answer.status, answer.body["error"]["code"].as_str()),
        (403, Some("insufficient_scope")),
        "{}",
        answer.body
    );
    let challenge = answer
        .headers
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok());
    let expected = format!(r#"Bearer error="insufficient_scope", scope="{scope}""#);
    assert_eq!(challenge, Some(expected.as_str()));
}

/// A customer's token cannot refund, even its own charge and even when it
/// names `refunds:write` (a public client can ask for any scope): 403, no
/// refund at the provider, no record, nothing reserved. The same key then
/// works from the back office, for any customer's charge, and says who
/// asked. Another back-office subject's retry with that key is a 422.
async fn customers_cannot_refund_and_the_back_office_can(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_alice", &charge_body(5000, "tok_visa"))
        .await;
    let id = charge["id"].as_str().unwrap();
    let key = new_key();
    let body = json!({"amount_cents": 1500});
    let own = app
        .post_refund_with(&app.token("cus_alice"), id, &key, &body)
        .await;
    assert_insufficient(&own, "refunds:write");
    let claimed = signed(json!({"sub": "cus_alice", "scope": "refunds:write charges:read_all"}));
    let asked = app.post_refund_with(&claimed, id, &key, &body).await;
    assert_insufficient(&asked, "refunds:write");
    // Scopes come before the body: an invalid body is a 403 too.
    let invalid = app
        .post_refund_with(
            &app.token("cus_alice"),
            id,
            &key,
            &json!({"amount_cents": -1}),
        )
        .await;
    assert_insufficient(&invalid, "refunds:write");
    assert!(app.sandbox_refunds().await.is_empty());
    assert_eq!(refund_records(&app).await, 0);
    assert_eq!(app.db.refunds_with_status("").await, 0);
    let read = app.get_as("cus_alice", &format!("/api/charges/{id}")).await;
    assert_eq!(read.body["amount_refunded"], 0);

    let office = app.post_refund("ops_bob", id, &key, &body).await;
    assert_eq!(office.status, 201, "{}", office.body);
    assert_eq!(
        office.body["requested_by"],
        json!({"subject": "ops_bob", "role": "back_office"})
    );
    // The customer reads the refund of its charge, and who made it.
    let refund_id = office.body["id"].as_str().unwrap();
    let seen = app
        .get_as("cus_alice", &format!("/api/refunds/{refund_id}"))
        .await;
    assert_eq!((seen.status, &seen.body), (200, &office.body));
    let again = app.post_refund("ops_bob", id, &key, &body).await;
    assert_eq!((again.status, &again.body), (201, &office.body));
    let colleague = app.post_refund("ops_carol", id, &key, &body).await;
    assert_eq!(
        (colleague.status, colleague.body["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    assert_eq!(app.sandbox_refunds().await.len(), 1);
    assert_eq!(app.db.refunds_with_status("succeeded").await, 1);

    // A refund made before roles (no actor stored) reads as its customer's.
    app.db
        .execute(
            "UPDATE refunds SET requested_by = NULL, requested_by_role = NULL",
            "UPDATE refunds SET requested_by = NULL, requested_by_role = NULL",
            "UPDATE refunds SET requested_by = NULL, requested_by_role = NULL",
        )
        .await;
    let old = app
        .get_as("cus_alice", &format!("/api/refunds/{refund_id}"))
        .await;
    assert_eq!(
        old.body["requested_by"],
        json!({"subject": "cus_alice", "role": "customer"})
    );
}

/// Twenty back-office refunds of one charge at once, each with its own key,
/// ask for twice the charge: exactly half are made, the provider refunds
/// the charge's amount and no more, and the rest are refused
/// `refund_exceeds_charge`. A server that read what is left and then
/// refunded (check, then act) would refund more than was charged.
async fn parallel_back_office_refunds_never_exceed_the_charge(backend: Backend) {
    const REFUNDS: usize = 20;
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let app = Arc::new(app);
    let charge = app
        .charge_json("cus_alice", &charge_body(1000, "tok_visa"))
        .await;
    let id = charge["id"].as_str().unwrap().to_owned();
    let made = parallel_refunds(&app, &id, REFUNDS, 100, |i| format!("ops_{}", i % 3)).await;
    assert_eq!(made, 10);
    assert_eq!(app.sandbox_refunded().await, 1000);
    assert_eq!(app.db.refunds_with_status("succeeded").await, 10);
    let read = app.get_as("cus_alice", &format!("/api/charges/{id}")).await;
    assert_eq!(read.body["amount_refunded"], 1000);
}

/// `charges:read_all` reads any customer's charges and refunds and lists
/// them with `customer=` or across customers; a cursor of one customer's
/// list is refused in another's. Without it, another customer's charge is
/// 404 and `customer=` is 403, for a customer and for a back-office token
/// that only refunds.
async fn the_back_office_reads_across_customers(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let mut alice = Vec::new();
    for amount in [100, 200] {
        let charge = app
            .charge_json("cus_alice", &charge_body(amount, "tok_visa"))
            .await;
        alice.push(charge["id"].as_str().unwrap().to_owned());
    }
    let bob = app
        .charge_json("cus_bob", &charge_body(300, "tok_visa"))
        .await;
    let bob = bob["id"].as_str().unwrap().to_owned();
    let reader = app.back_office_token("ops_read", "charges:read_all");
    let ids = |body: &Value| -> Vec<String> {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_owned())
            .collect()
    };

    let read = app.get_with(&reader, &format!("/api/charges/{bob}")).await;
    assert_eq!(
        (read.status, read.body["customer_id"].as_str()),
        (200, Some("cus_bob"))
    );
    let hers = app
        .get_with(&reader, "/api/charges?customer=cus_alice")
        .await;
    assert_eq!(hers.status, 200, "{}", hers.body);
    assert_eq!(ids(&hers.body), [alice[1].clone(), alice[0].clone()]);
    let everyone = app.get_with(&reader, "/api/charges").await;
    assert_eq!(
        ids(&everyone.body),
        [bob.clone(), alice[1].clone(), alice[0].clone()]
    );
    let paged = app
        .get_with(
            &reader,
            &format!("/api/charges?limit=1&starting_after={bob}"),
        )
        .await;
    assert_eq!(ids(&paged.body), [alice[1].clone()]);
    assert_eq!(paged.body["has_more"], true);
    // Bob's charge is no cursor of Alice's list.
    let foreign = app
        .get_with(
            &reader,
            &format!("/api/charges?customer=cus_alice&starting_after={bob}"),
        )
        .await;
    assert_eq!(
        (foreign.status, foreign.body["error"]["param"].as_str()),
        (400, Some("starting_after"))
    );
    // Refunds by the back office, read by it and by their customer only.
    let refund = app
        .post_refund(
            "ops_refunds",
            &bob,
            &new_key(),
            &json!({"amount_cents": 50}),
        )
        .await;
    let refund_id = refund.body["id"].as_str().unwrap();
    for path in [
        format!("/api/refunds/{refund_id}"),
        format!("/api/charges/{bob}/refunds"),
    ] {
        assert_eq!(app.get_with(&reader, &path).await.status, 200, "{path}");
        assert_eq!(app.get_as("cus_bob", &path).await.status, 200, "{path}");
        assert_eq!(app.get_as("cus_alice", &path).await.status, 404, "{path}");
    }

    // Without charges:read_all.
    let customer = app.token("cus_alice");
    let refunder = app.back_office_token("ops_refunds", "refunds:write");
    let other = app
        .get_with(&customer, &format!("/api/charges/{bob}"))
        .await;
    assert_eq!(other.status, 404);
    let listed = app.get_with(&customer, "/api/charges").await;
    assert_eq!(ids(&listed.body), [alice[1].clone(), alice[0].clone()]);
    for token in [
        &customer,
        &signed(json!({"sub": "cus_alice", "scope": "charges:read_all"})),
    ] {
        // Before the query is read: a bad limit does not make it a 400.
        for query in ["customer=cus_alice", "customer=cus_alice&limit=0"] {
            let filtered = app.get_with(token, &format!("/api/charges?{query}")).await;
            assert_insufficient(&filtered, "charges:read_all");
        }
    }
    let blind = app
        .get_with(&refunder, &format!("/api/charges/{bob}"))
        .await;
    assert_insufficient(&blind, "charges:read");
    let bad = app.get_with(&reader, "/api/charges?customer=").await;
    assert_eq!(
        (bad.status, bad.body["error"]["param"].as_str()),
        (400, Some("customer"))
    );
}

/// Scopes from `scope` and from `scp` (an array or a string) are one set;
/// unknown ones are ignored. A token that names some of ours has those
/// only; one that names none has the default (charge and read its own).
async fn scope_and_scp_are_read_alike(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge = |token: String| {
        let app = &app;
        async move {
            let response = app
                .http
                .post(format!("{}/api/charges", app.base_url))
                .bearer_auth(token)
                .header("idempotency-key", new_key())
                .header("content-type", "application/json")
                .body(charge_body(100, "tok_visa"))
                .send()
                .await
                .unwrap();
            payments_tests::Answer::of(response).await
        }
    };
    for claims in [
        json!({"sub": "cus_s", "scope": "openid charges:write"}),
        json!({"sub": "cus_s", "scp": ["charges:write", "email"]}),
        json!({"sub": "cus_s", "scp": "profile charges:write"}),
        json!({"sub": "cus_s", "scope": "openid profile"}),
        json!({"sub": "cus_s"}),
    ] {
        let answer = charge(signed(claims.clone())).await;
        assert_eq!(answer.status, 201, "{claims}: {}", answer.body);
    }
    // Reads only: no charge, nothing stored.
    let records = app.db.records().await;
    for claims in [
        json!({"sub": "cus_s", "scope": "charges:read"}),
        json!({"sub": "cus_s", "scp": ["charges:read"]}),
    ] {
        let answer = charge(signed(claims.clone())).await;
        assert_insufficient(&answer, "charges:write");
        let list = app.get_with(&signed(claims), "/api/charges").await;
        assert_eq!(list.body["data"].as_array().map(Vec::len), Some(5));
    }
    assert_eq!(app.db.records().await, records);
    assert_eq!(app.sandbox_charges().await.len(), 5);
    // A bad token is still 401, whatever its scopes.
    let forged = {
        let key = EncodingKey::from_secret(b"another-secret-another-secret-xx").unwrap();
        let claims = json!({"sub": "ops", "aud": "payments-backoffice",
            "scope": "refunds:write", "exp": 4_000_000_000_u64});
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap()
    };
    assert_eq!(app.get_with(&forged, "/api/charges").await.status, 401);
}

/// `REFUNDS_BY_CUSTOMER=true` keeps the behaviour from before roles: a
/// customer refunds its own charges (and only its own), and the refund
/// says so. By default the same request is a 403 (above).
async fn refunds_by_customer_lets_customers_refund_their_own(backend: Backend) {
    let options = AppOptions {
        refunds_by_customer: true,
        ..AppOptions::default()
    };
    let Some(app) = spawn_app(backend, options).await else {
        return;
    };
    let charge = app
        .charge_json("cus_alice", &charge_body(5000, "tok_visa"))
        .await;
    let id = charge["id"].as_str().unwrap();
    let body = json!({"amount_cents": 500});
    let own = app
        .post_refund_with(&app.token("cus_alice"), id, &new_key(), &body)
        .await;
    assert_eq!(own.status, 201, "{}", own.body);
    assert_eq!(
        own.body["requested_by"],
        json!({"subject": "cus_alice", "role": "customer"})
    );
    let theirs = app
        .post_refund_with(&app.token("cus_mallory"), id, &new_key(), &body)
        .await;
    assert_eq!(theirs.status, 404, "{}", theirs.body);
    let office = app.post_refund("ops_bob", id, &new_key(), &body).await;
    assert_eq!(office.status, 201, "{}", office.body);
    // A customer and a back-office subject of one name never share a
    // record: the same key and body in the other role is a 422, not the
    // customer's refund replayed.
    let key = new_key();
    let as_customer = app
        .post_refund_with(&app.token("ops_bob"), id, &key, &body)
        .await;
    assert_eq!(
        as_customer.status, 404,
        "not ops_bob's charge as a customer"
    );
    let theirs = app
        .post_refund_with(&app.token("cus_alice"), id, &key, &body)
        .await;
    assert_eq!(theirs.status, 201, "{}", theirs.body);
    let office_alice = app.post_refund("cus_alice", id, &key, &body).await;
    assert_eq!(
        (
            office_alice.status,
            office_alice.body["error"]["code"].as_str()
        ),
        (422, Some("idempotency_key_reused")),
        "{}",
        office_alice.body
    );
    assert_eq!(app.sandbox_refunds().await.len(), 3);
}

backend_tests!(
    customers_cannot_refund_and_the_back_office_can,
    parallel_back_office_refunds_never_exceed_the_charge,
    the_back_office_reads_across_customers,
    scope_and_scp_are_read_alike,
    refunds_by_customer_lets_customers_refund_their_own,
);
