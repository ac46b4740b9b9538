//! The rest of the money lifecycle: finding charges (`GET /api/charges`)
//! and refunds (`POST /api/charges/{id}/refunds` and their reads).

use payments_tests::{AppOptions, Backend, backend_tests, charge_body, new_key, spawn_app};
use serde_json::{Value, json};

fn ids(list: &Value) -> Vec<String> {
    let data = list["data"].as_array().expect("a list's data");
    data.iter()
        .map(|c| c["id"].as_str().expect("an id").to_owned())
        .collect()
}

/// A customer's charges, newest first, in keyset pages that move forward
/// and back, filtered by status, creation time, one metadata key and the
/// key that made them; never another customer's.
async fn charges_are_listed_paged_and_filtered(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let mut made = Vec::new();
    for i in 0..5 {
        let body = format!(
            r#"{{"amount_cents":{},"currency":"GBP","card_token":"tok_visa","metadata":{{"order_id":"o-{i}"}}}}"#,
            100 + i
        );
        made.push(app.charge_json("cus_list", &body).await);
    }
    let key = new_key();
    let declined = app
        .post_charge(
            "cus_list",
            Some(&key),
            &charge_body(700, "tok_chargeDeclined"),
        )
        .await;
    assert_eq!(declined.status(), 402);
    let theirs = app
        .charge_json("cus_other", &charge_body(900, "tok_visa"))
        .await;
    let id = |c: &Value| c["id"].as_str().expect("an id").to_owned();
    let mine: Vec<String> = made.iter().map(id).collect();

    let all = app.get_as("cus_list", "/api/charges").await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert_eq!(all.body["object"], "list");
    assert_eq!(all.body["url"], "/api/charges");
    assert_eq!(all.body["has_more"], false);
    let all_ids = ids(&all.body);
    assert_eq!(
        all_ids.len(),
        6,
        "five succeeded and one declined, none of cus_other's"
    );
    let newest_first: Vec<String> = mine.iter().rev().cloned().collect();
    assert_eq!(all_ids[1..], newest_first[..], "newest first");

    // Forward in pages of two, then back.
    let first = app.get_as("cus_list", "/api/charges?limit=2").await;
    assert_eq!(
        (ids(&first.body), first.body["has_more"].clone()),
        (all_ids[..2].to_vec(), json!(true))
    );
    let after = format!("/api/charges?limit=2&starting_after={}", all_ids[1]);
    let second = app.get_as("cus_list", &after).await;
    assert_eq!(ids(&second.body), all_ids[2..4].to_vec());
    let last = format!("/api/charges?limit=2&starting_after={}", all_ids[3]);
    let last = app.get_as("cus_list", &last).await;
    assert_eq!(
        (ids(&last.body), last.body["has_more"].clone()),
        (all_ids[4..].to_vec(), json!(false))
    );
    let before = format!("/api/charges?limit=2&ending_before={}", all_ids[2]);
    let back = app.get_as("cus_list", &before).await;
    assert_eq!(
        (ids(&back.body), back.body["has_more"].clone()),
        (all_ids[..2].to_vec(), json!(false))
    );

    // Filters.
    let failed = app.get_as("cus_list", "/api/charges?status=failed").await;
    assert_eq!(ids(&failed.body), vec![all_ids[0].clone()]);
    let order = app
        .get_as("cus_list", "/api/charges?metadata[order_id]=o-3")
        .await;
    assert_eq!(ids(&order.body), vec![mine[3].clone()]);
    let by_key = app
        .get_as("cus_list", &format!("/api/charges?idempotency_key={key}"))
        .await;
    assert_eq!(ids(&by_key.body), vec![all_ids[0].clone()]);
    let not_theirs = app
        .get_as("cus_other", &format!("/api/charges?idempotency_key={key}"))
        .await;
    assert_eq!(
        ids(&not_theirs.body),
        Vec::<String>::new(),
        "keys are the owner's"
    );
    let future = app
        .get_as("cus_list", "/api/charges?created[gte]=4102444800")
        .await;
    assert_eq!(ids(&future.body), Vec::<String>::new());
    let past = app
        .get_as("cus_list", "/api/charges?created[lt]=4102444800&limit=100")
        .await;
    assert_eq!(ids(&past.body), all_ids);
    let other = app.get_as("cus_other", "/api/charges").await;
    assert_eq!(ids(&other.body), vec![id(&theirs)]);

    // Bad parameters name themselves; another customer's charge is no cursor.
    for (query, param) in [
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
        ("status=paid", "status"),
        ("created[gte]=yesterday", "created[gte]"),
        ("colour=red", "colour"),
        (
            &*format!("starting_after={}", id(&theirs)),
            "starting_after",
        ),
        ("ending_before=ch_missing", "ending_before"),
    ] {
        let answer = app
            .get_as("cus_list", &format!("/api/charges?{query}"))
            .await;
        assert_eq!(answer.status, 400, "{query}: {}", answer.body);
        assert_eq!(answer.body["error"]["code"], "invalid_request", "{query}");
        assert_eq!(answer.body["error"]["param"], param, "{query}");
    }
}

backend_tests!(charges_are_listed_paged_and_filtered);

fn refund_body(amount: i64) -> Value {
    json!({"amount_cents": amount, "reason": "requested_by_customer"})
}

/// One refund, end to end: 201 with the refund and its `Location`, replayed
/// byte for byte, read back by id and in its charge's list, and counted in
/// the charge's `amount_refunded`; the same key with another body, or sent
/// to refund another charge, is a 422; another customer's charge is a 404
/// and a declined one a 400, neither stored.
async fn a_refund_is_made_once_and_read_back(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_r", &charge_body(1000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().expect("id");
    let other = app
        .charge_json("cus_r", &charge_body(500, "tok_visa"))
        .await;
    let key = new_key();
    let first = app
        .post_refund("ops_r", charge_id, &key, &refund_body(300))
        .await;
    assert_eq!(first.status, 201, "{}", first.body);
    let refund = &first.body;
    assert_eq!(refund["object"], "refund");
    assert_eq!(
        (refund["amount_cents"].as_i64(), refund["status"].as_str()),
        (Some(300), Some("succeeded"))
    );
    let refund_id = refund["id"].as_str().expect("id");
    assert_eq!(
        refund["requested_by"],
        json!({"subject": "ops_r", "role": "back_office"})
    );
    let location = first.headers.get("location").and_then(|v| v.to_str().ok());
    assert_eq!(location, Some(&*format!("/api/refunds/{refund_id}")));
    let again = app
        .post_refund("ops_r", charge_id, &key, &refund_body(300))
        .await;
    assert_eq!((again.status, &again.body), (201, refund));
    assert_eq!(
        again.headers.get("idempotent-replay").map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    let changed = app
        .post_refund("ops_r", charge_id, &key, &refund_body(301))
        .await;
    assert_eq!(
        (changed.status, changed.body["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    let other_id = other["id"].as_str().expect("id");
    let elsewhere = app
        .post_refund("ops_r", other_id, &key, &refund_body(300))
        .await;
    assert_eq!(
        elsewhere.status, 422,
        "the same key on another charge: {}",
        elsewhere.body
    );
    assert_eq!(
        app.sandbox_refunds().await.len(),
        1,
        "one refund at the provider"
    );
    assert_eq!(app.db.refunds_with_status("succeeded").await, 1);

    let read = app
        .get_as("cus_r", &format!("/api/refunds/{refund_id}"))
        .await;
    assert_eq!((read.status, &read.body), (200, refund));
    let list = app
        .get_as("cus_r", &format!("/api/charges/{charge_id}/refunds"))
        .await;
    assert_eq!(
        (list.status, ids(&list.body)),
        (200, vec![refund_id.to_owned()])
    );
    let charge = app
        .get_as("cus_r", &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(charge.body["amount_refunded"], 300);
    for path in [
        format!("/api/refunds/{refund_id}"),
        format!("/api/charges/{charge_id}/refunds"),
    ] {
        assert_eq!(
            app.get_as("cus_x", &path).await.status,
            404,
            "{path} is the owner's"
        );
    }

    // No such charge: 404; not succeeded: 400. Neither is stored: the
    // same key then works.
    let key = new_key();
    let missing = format!("ch_{}", "0".repeat(32));
    let theirs = app
        .post_refund("ops_r", &missing, &key, &refund_body(1))
        .await;
    assert_eq!(
        (theirs.status, theirs.body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let declined = app
        .post_charge(
            "cus_r",
            Some(&new_key()),
            &charge_body(700, "tok_chargeDeclined"),
        )
        .await;
    let declined: Value = declined.json().await.expect("json");
    let declined_id = declined["error"]["charge_id"]
        .as_str()
        .expect("the declined charge");
    let refused = app
        .post_refund("ops_r", declined_id, &key, &refund_body(1))
        .await;
    assert_eq!(
        (refused.status, refused.body["error"]["code"].as_str()),
        (400, Some("charge_not_refundable"))
    );
    let fine = app
        .post_refund("ops_r", charge_id, &key, &refund_body(1))
        .await;
    assert_eq!(
        fine.status, 201,
        "nothing was stored for the key: {}",
        fine.body
    );
    // Without a key: refused, whatever the key mode.
    let keyless = app
        .http
        .post(format!("{}/api/charges/{charge_id}/refunds", app.base_url))
        .bearer_auth(app.back_office_token("ops_r", "refunds:write"))
        .json(&refund_body(1))
        .send()
        .await
        .expect("request");
    assert_eq!(keyless.status(), 400);

    // The charge's two refunds, newest first, a page at a time; a cursor
    // that is not a refund of this charge is refused, naming itself.
    let refunds = format!("/api/charges/{charge_id}/refunds");
    let first = app.get_as("cus_r", &format!("{refunds}?limit=1")).await;
    assert_eq!(first.body["has_more"], true, "{}", first.body);
    let newest = ids(&first.body);
    assert_eq!(newest.len(), 1);
    assert_ne!(newest[0], refund_id, "the second refund is the newest");
    let after = format!("{refunds}?limit=1&starting_after={}", newest[0]);
    let second = app.get_as("cus_r", &after).await;
    assert_eq!(
        (ids(&second.body), &second.body["has_more"]),
        (vec![refund_id.to_owned()], &json!(false))
    );
    let foreign = app
        .get_as("cus_r", &format!("{refunds}?starting_after={charge_id}"))
        .await;
    assert_eq!(
        (foreign.status, foreign.body["error"]["param"].as_str()),
        (400, Some("starting_after"))
    );
    let unknown = app
        .get_as("cus_r", &format!("{refunds}?status=succeeded"))
        .await;
    assert_eq!(
        (unknown.status, unknown.body["error"]["param"].as_str()),
        (400, Some("status"))
    );
}

/// Twenty refunds of 30% of one charge at once, with distinct keys:
/// exactly three are made (at the provider and in the database), the
/// other seventeen get the stored `refund_exceeds_charge` naming the 10%
/// left; the charge shows 90% refunded.
async fn parallel_refunds_never_exceed_the_charge(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::slow_provider(100)).await else {
        return;
    };
    let app = std::sync::Arc::new(app);
    let charge = app
        .charge_json("cus_r", &charge_body(1000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().expect("id").to_owned();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (app, barrier, charge_id) = (app.clone(), barrier.clone(), charge_id.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let key = new_key();
                let answer = app
                    .post_refund("cus_r", &charge_id, &key, &refund_body(300))
                    .await;
                (answer, key)
            })
        })
        .collect();
    let (mut made, mut refused) = (0, 0);
    for task in tasks {
        let (answer, key) = task.await.expect("task");
        match answer.status {
            201 => made += 1,
            400 => {
                assert_eq!(answer.body["error"]["code"], "refund_exceeds_charge");
                assert_eq!(answer.body["error"]["refundable_amount_cents"], 100);
                refused += 1;
                let again = app
                    .post_refund("cus_r", &charge_id, &key, &refund_body(300))
                    .await;
                assert_eq!(
                    (again.status, &again.body),
                    (400, &answer.body),
                    "stored and replayed"
                );
            }
            other => panic!("unexpected {other}: {}", answer.body),
        }
    }
    assert_eq!((made, refused), (3, 17));
    assert_eq!(
        app.sandbox_refunds().await.len(),
        3,
        "three refunds at the provider"
    );
    assert_eq!(
        app.db.refunds_with_status("").await,
        3,
        "three refunds rows"
    );
    let charge = app
        .get_as("cus_r", &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(charge.body["amount_refunded"], 900);
    // What is left, by default: the last 100.
    let rest = app
        .post_refund("cus_r", &charge_id, &new_key(), &json!({}))
        .await;
    assert_eq!(
        (rest.status, rest.body["amount_cents"].as_i64()),
        (201, Some(100))
    );
    let none = app
        .post_refund("cus_r", &charge_id, &new_key(), &json!({}))
        .await;
    assert_eq!(
        (
            none.status,
            none.body["error"]["refundable_amount_cents"].as_i64()
        ),
        (400, Some(0))
    );
}

/// Twenty requests with one key at once: one refund at the provider, and
/// every answer a 201 or a 409 `request_in_progress`.
async fn parallel_requests_with_one_key_refund_once(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::slow_provider(300)).await else {
        return;
    };
    let app = std::sync::Arc::new(app);
    let charge = app
        .charge_json("cus_r", &charge_body(1000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().expect("id").to_owned();
    let key = new_key();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (app, barrier) = (app.clone(), barrier.clone());
            let (charge_id, key) = (charge_id.clone(), key.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                app.post_refund("cus_r", &charge_id, &key, &refund_body(250))
                    .await
            })
        })
        .collect();
    let mut conflicts = 0;
    for task in tasks {
        let answer = task.await.expect("task");
        match answer.status {
            201 => {}
            409 => conflicts += 1,
            other => panic!("unexpected {other}: {}", answer.body),
        }
    }
    assert!(
        conflicts >= 1,
        "with a 300 ms provider, duplicates see the lease"
    );
    assert_eq!(
        app.sandbox_refunds().await.len(),
        1,
        "one refund at the provider"
    );
    assert_eq!(app.db.refunds_with_status("").await, 1);
    let charge = app
        .get_as("cus_r", &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(charge.body["amount_refunded"], 250);
}

/// The same key on `POST /api/charges` and on a refund route: two
/// independent operations (the route is part of the unique index).
async fn one_key_on_a_charge_and_a_refund_is_two_operations(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let key = new_key();
    let charged = app
        .post_charge("cus_r", Some(&key), &charge_body(1000, "tok_visa"))
        .await;
    assert_eq!(charged.status(), 201);
    let charge: Value = charged.json().await.expect("json");
    let charge_id = charge["id"].as_str().expect("id");
    let refund = app
        .post_refund("cus_r", charge_id, &key, &refund_body(400))
        .await;
    assert_eq!(
        refund.status, 201,
        "a new operation under the same key: {}",
        refund.body
    );
    assert_eq!(app.sandbox_charges().await.len(), 1);
    assert_eq!(app.sandbox_refunds().await.len(), 1);
}

/// The provider refunds, then the connection drops before its answer: 503,
/// the reservation held; the retry with the same key re-drives the same
/// provider call (the provider replays it) and ends 201 with one refund.
/// And a refund abandoned mid-call is finished by the reaper.
async fn a_lost_refund_answer_is_recovered(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_r", &charge_body(1000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().expect("id");
    app.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let key = new_key();
    let lost = app
        .post_refund("cus_r", charge_id, &key, &refund_body(600))
        .await;
    assert_eq!(
        (lost.status, lost.body["error"]["code"].as_str()),
        (503, Some("gateway_unavailable"))
    );
    assert_eq!(
        app.sandbox_refunds().await.len(),
        1,
        "the provider did refund"
    );
    let over = app
        .post_refund("cus_r", charge_id, &new_key(), &refund_body(600))
        .await;
    assert_eq!(
        over.status, 400,
        "the unknown refund keeps its reservation: {}",
        over.body
    );
    app.configure_sandbox(json!({"drop_after_charge": false}))
        .await;
    let retry = app
        .post_refund("cus_r", charge_id, &key, &refund_body(600))
        .await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert_eq!(
        app.sandbox_refunds().await.len(),
        1,
        "re-driven, not refunded again"
    );

    // Lost again, and nobody retries: the reaper finishes it.
    app.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let key = new_key();
    let lost = app
        .post_refund("cus_r", charge_id, &key, &refund_body(100))
        .await;
    assert_eq!(lost.status, 503);
    app.configure_sandbox(json!({"drop_after_charge": false}))
        .await;
    let report = crate::reap_once(&app).await;
    assert_eq!(report.reaped, 1, "{report:?}");
    assert_eq!(app.sandbox_refunds().await.len(), 2);
    let replay = app
        .post_refund("cus_r", charge_id, &key, &refund_body(100))
        .await;
    assert_eq!(
        (replay.status, replay.body["status"].as_str()),
        (201, Some("succeeded"))
    );
    let charge = app
        .get_as("cus_r", &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(charge.body["amount_refunded"], 700);
}

/// The provider refuses a refund our reservation allowed (the charge was
/// refunded at the provider directly): 402 `refund_failed` with the
/// provider's code, stored and replayed, the refund `failed`, and its
/// amount given back to the charge.
async fn a_refund_the_provider_refuses_gives_its_amount_back(backend: Backend) {
    let Some(app) = spawn_app(backend, AppOptions::default()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_r", &charge_body(1000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().expect("id");
    let at_provider = app
        .http
        .post(format!("{}/v1/refunds", app.sandbox.url()))
        .bearer_auth("sk_test_direct")
        .form(&[(
            "charge",
            charge["gateway_charge_id"].as_str().expect("provider id"),
        )])
        .send()
        .await
        .expect("a refund at the provider");
    assert_eq!(at_provider.status(), 200);
    let key = new_key();
    let refused = app
        .post_refund("cus_r", charge_id, &key, &refund_body(300))
        .await;
    assert_eq!(refused.status, 402, "{}", refused.body);
    assert_eq!(refused.body["error"]["code"], "refund_failed");
    assert_eq!(
        refused.body["error"]["decline_code"],
        "charge_already_refunded"
    );
    let again = app
        .post_refund("cus_r", charge_id, &key, &refund_body(300))
        .await;
    assert_eq!(
        (again.status, &again.body),
        (402, &refused.body),
        "stored and replayed"
    );
    assert_eq!(app.db.refunds_with_status("failed").await, 1);
    // Its 300 came back: the whole 1000 fits again (and the provider, which
    // has refunded it all, refuses again).
    let all = app
        .post_refund("cus_r", charge_id, &new_key(), &refund_body(1000))
        .await;
    assert_eq!(
        all.status, 402,
        "the reservation was given back: {}",
        all.body
    );
    let charge = app
        .get_as("cus_r", &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(charge.body["amount_refunded"], 0);
}

backend_tests!(
    serializable;
    a_refund_is_made_once_and_read_back,
    a_refund_the_provider_refuses_gives_its_amount_back,
    parallel_refunds_never_exceed_the_charge,
    parallel_requests_with_one_key_refund_once,
    one_key_on_a_charge_and_a_refund_is_two_operations,
    a_lost_refund_answer_is_recovered,
);
