//! `GET /api/events` and `GET /api/events/{id}` (issue 28): the back
//! office's (`events:read`), newest first, paged and filtered as Stripe's
//! lists are; every bad query is a 400 naming its parameter.

use payments_tests::{Answer, Backend, TestApp, backend_tests, new_key, spawn_app};
use serde_json::json;

async fn get(app: &TestApp, token: &str, path: &str) -> Answer {
    app.get_with(token, path).await
}

async fn events_are_the_back_offices_paged_and_filtered(backend: Backend) {
    let Some(app) = spawn_app(backend, Default::default()).await else {
        return;
    };
    let mut charges = Vec::new();
    for card in ["tok_visa", "tok_visa", "tok_chargeDeclined"] {
        let body = json!({"amount_cents": 1100, "currency": "GBP", "card_token": card});
        let answer = Answer::of(
            app.post_charge("cus_ev", Some(&new_key()), &body.to_string())
                .await,
        )
        .await;
        charges.push(
            answer.body["id"]
                .as_str()
                .or(answer.body["error"]["charge_id"].as_str())
                .unwrap()
                .to_owned(),
        );
    }
    let office = app.back_office_token("ops_ev", "events:read");

    // A customer, or a back office without the scope: 403, nothing read.
    for token in [
        app.token("cus_ev"),
        app.back_office_token("ops_ev", "refunds:write"),
    ] {
        for path in [
            "/api/events",
            "/api/events/evt_00000000000000000000000000000000",
        ] {
            let refused = get(&app, &token, path).await;
            assert_eq!(refused.status, 403, "{path}: {}", refused.body);
            assert_eq!(refused.body["error"]["code"], "insufficient_scope");
        }
    }

    let all = get(&app, &office, "/api/events").await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert_eq!(all.body["object"], "list");
    let data = all.body["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    // Newest first.
    let created: Vec<i64> = data
        .iter()
        .map(|e| e["created"].as_i64().unwrap())
        .collect();
    assert!(created.windows(2).all(|w| w[0] >= w[1]), "{created:?}");
    let failed = data.iter().find(|e| e["type"] == "charge.failed").unwrap();
    assert_eq!(failed["data"]["object"]["id"], charges[2].as_str());
    for event in data {
        assert_eq!(event["object"], "event");
        assert!(event["created"].as_i64().unwrap() > 1_700_000_000);
        assert!(event["api_version"].is_string());
    }
    // One by id, as listed; and as the charge reads now.
    let id = data[1]["id"].as_str().unwrap();
    let one = get(&app, &office, &format!("/api/events/{id}")).await;
    assert_eq!((one.status, &one.body), (200, &data[1]));
    let charge = app
        .get_as("cus_ev", &format!("/api/charges/{}", charges[1]))
        .await;
    assert_eq!(one.body["data"]["object"], charge.body);

    let page = get(&app, &office, "/api/events?limit=2").await;
    assert_eq!(page.body["has_more"], true);
    let last = page.body["data"][1]["id"].as_str().unwrap();
    let rest = get(
        &app,
        &office,
        &format!("/api/events?limit=2&starting_after={last}"),
    )
    .await;
    assert_eq!(rest.body["has_more"], false);
    assert_eq!(rest.body["data"].as_array().unwrap().len(), 1);
    let succeeded = get(&app, &office, "/api/events?type=charge.succeeded").await;
    assert_eq!(succeeded.body["data"].as_array().unwrap().len(), 2);
    let future = get(&app, &office, "/api/events?created[gte]=4102444800").await;
    assert_eq!(future.body["data"].as_array().unwrap().len(), 0);

    // Not found, and bad queries.
    for path in [
        "/api/events/evt_00000000000000000000000000000000",
        "/api/events/nope",
    ] {
        let missing = get(&app, &office, path).await;
        assert_eq!(missing.status, 404, "{path}: {}", missing.body);
    }
    for (query, param) in [
        ("type=charge.nope", "type"),
        ("limit=0", "limit"),
        ("created[gte]=yesterday", "created[gte]"),
        (
            "starting_after=evt_00000000000000000000000000000000",
            "starting_after",
        ),
        ("status=succeeded", "status"),
        ("type=charge.failed&type=charge.succeeded", "type"),
    ] {
        let bad = get(&app, &office, &format!("/api/events?{query}")).await;
        assert_eq!(bad.status, 400, "{query}: {}", bad.body);
        assert_eq!(bad.body["error"]["param"], param, "{query}");
    }
}

backend_tests!(events_are_the_back_offices_paged_and_filtered);
