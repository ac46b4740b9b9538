//! `make run` stopped and started again: the API's in-process sandbox keeps
//! its ledger beside the SQLite database (`SANDBOX_LEDGER`'s default), so
//! after a restart a refund of a charge made before it succeeds, and a
//! charge whose answer was lost is re-driven under its provider key and
//! replayed, not made again.

use payments_tests::{Process, charge_body};
use serde_json::{Value, json};

use crate::{MakeRun, mint, mint_back_office, post};

/// The in-process sandbox's URL, from the API's start-up warning.
fn sandbox_url(api: &Process) -> String {
    let log = api.log();
    let url = log
        .split_whitespace()
        .find_map(|field| field.strip_prefix("sandbox=http://"))
        .unwrap_or_else(|| panic!("no sandbox URL in the log:\n{log}"));
    format!("http://{url}")
}

async fn sandbox_charges(api: &Process) -> Vec<Value> {
    let charges: Value = reqwest::get(format!("{}/_sandbox/charges", sandbox_url(api)))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    charges["data"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_restarted_make_run_still_knows_the_sandboxs_charges() {
    let run = MakeRun::new();
    let ledger = run.dir.join("payments.sandbox-ledger.jsonl");
    let token = mint("cus_restart").await;

    let mut api = run.start(&[]).await;
    let shown = ledger.display().to_string();
    assert!(api.log().contains(&shown), "{}", api.log());
    let charged = post(&api, &token, "kept", &charge_body(2500, "tok_visa")).await;
    assert_eq!(charged.status(), 201);
    let charged: Value = charged.json().await.unwrap();
    // A second charge whose answer is lost on the way back: the provider
    // made it, the API has it pending.
    let dropped = reqwest::Client::new()
        .post(format!("{}/_sandbox/config", sandbox_url(&api)))
        .json(&json!({"drop_after_charge": true}))
        .send()
        .await
        .unwrap();
    assert!(dropped.status().is_success());
    let lost = post(&api, &token, "lost", &charge_body(700, "tok_visa")).await;
    assert_eq!(lost.status(), 503);
    let before = sandbox_charges(&api).await;
    assert_eq!(before.len(), 2);
    assert!(
        api.terminate(std::time::Duration::from_secs(10))
            .await
            .success()
    );
    assert!(ledger.exists(), "{shown}");

    // The same data directory; the sandbox's config starts afresh.
    let api = run.start(&[]).await;
    let charge_id = charged["id"].as_str().unwrap();
    let refunded = reqwest::Client::new()
        .post(format!("{}/api/charges/{charge_id}/refunds", api.url))
        .bearer_auth(mint_back_office("ops_restart").await)
        .header("idempotency-key", "refund")
        .json(&json!({"amount_cents": 1000}))
        .send()
        .await
        .unwrap();
    let status = refunded.status();
    let refunded: Value = refunded.json().await.unwrap();
    assert_eq!(
        (status.as_u16(), &refunded["status"]),
        (201, &json!("succeeded")),
        "{refunded}"
    );
    // The retry re-drives the lost charge under the same provider key (or
    // finds the in-process reaper doing so: 409 until it is done): the
    // sandbox replays the charge it made before the restart.
    let mut retried = post(&api, &token, "lost", &charge_body(700, "tok_visa")).await;
    for _ in 0..100 {
        if retried.status() != 409 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        retried = post(&api, &token, "lost", &charge_body(700, "tok_visa")).await;
    }
    let status = retried.status();
    let retried: Value = retried.json().await.unwrap();
    assert_eq!(status, 201, "{retried}");
    let after = sandbox_charges(&api).await;
    // The first charge shows the refund made after the restart.
    let mut expected = before.clone();
    expected[0]["amount_refunded"] = json!(1000);
    assert_eq!(after, expected, "no charge made again, none forgotten");
    assert_eq!(retried["gateway_charge_id"], before[1]["id"]);
    api.stop().await.unwrap();
}

/// GET `path` at the API with `token`, as JSON.
async fn api_get(api: &Process, token: &str, path: &str) -> Value {
    let answer = reqwest::Client::new()
        .get(format!("{}{path}", api.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{path}");
    answer.json().await.unwrap()
}

/// Polls `path` (at most 10 s) until `done` holds of it; the last read.
async fn api_get_until(
    api: &Process,
    token: &str,
    path: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let read = api_get(api, token, path).await;
        if done(&read) || tokio::time::Instant::now() > deadline {
            return read;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The README's step 9, as `make run` runs it (no `GATEWAY_URL`, no
/// webhook secret set): a refund made in the in-process sandbox's
/// dashboard reaches the API through the sandbox's signed webhooks to the
/// API's own `POST /webhooks/provider`, after the sandbox's config was
/// replaced (the webhook URL is kept); then a dispute shows on the charge
/// and in the back office's list, refunds are refused while it stands, and
/// both went out as events.
#[tokio::test]
async fn make_runs_sandbox_sends_its_webhooks_to_the_api() {
    let run = MakeRun::new();
    let (token, staff) = (mint("cus_step9").await, mint_back_office("ops_step9").await);
    let api = run.start(&[]).await;
    let charged = post(&api, &token, "step9", &charge_body(2500, "tok_visa")).await;
    assert_eq!(charged.status(), 201);
    let charged: Value = charged.json().await.unwrap();
    let (id, provider_id) = (
        charged["id"].as_str().unwrap(),
        charged["gateway_charge_id"].as_str().unwrap(),
    );
    let sandbox = sandbox_url(&api);
    let client = reqwest::Client::new();
    let set = |config: Value| {
        client
            .post(format!("{sandbox}/_sandbox/config"))
            .json(&config)
            .send()
    };
    assert!(
        set(json!({"latency_ms": 1}))
            .await
            .unwrap()
            .status()
            .is_success()
    );
    assert!(set(json!({})).await.unwrap().status().is_success());

    let dashboard = client
        .post(format!("{sandbox}/_sandbox/charges/{provider_id}/refunds"))
        .json(&json!({"amount": 1000}))
        .send()
        .await
        .unwrap();
    assert!(dashboard.status().is_success());
    let dashboard: Value = dashboard.json().await.unwrap();
    let refunds = api_get_until(&api, &token, &format!("/api/charges/{id}/refunds"), |r| {
        r["data"].as_array().is_some_and(|d| !d.is_empty())
    })
    .await;
    let refund = &refunds["data"][0];
    assert_eq!(refund["amount_cents"], 1000, "{refunds}\n{}", api.log());
    assert_eq!(refund["status"], "succeeded");
    assert_eq!(refund["gateway_refund_id"], dashboard["id"]);
    assert_eq!(
        refund["requested_by"],
        json!({"subject": "provider", "role": "provider"})
    );
    let charge = api_get(&api, &token, &format!("/api/charges/{id}")).await;
    assert_eq!(charge["amount_refunded"], 1000, "{charge}");

    let disputed = client
        .post(format!("{sandbox}/_sandbox/charges/{provider_id}/disputes"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(disputed.status().is_success());
    let disputed: Value = disputed.json().await.unwrap();
    let charge = api_get_until(&api, &token, &format!("/api/charges/{id}"), |c| {
        !c["dispute"].is_null()
    })
    .await;
    assert_eq!(charge["dispute"]["status"], "needs_response", "{charge}");
    assert_eq!(charge["dispute"]["gateway_dispute_id"], disputed["id"]);
    let open = api_get(&api, &staff, "/api/disputes").await;
    assert_eq!(open["data"].as_array().map(Vec::len), Some(1), "{open}");
    assert_eq!(open["data"][0]["charge_id"], id);
    let refused = client
        .post(format!("{}/api/charges/{id}/refunds", api.url))
        .bearer_auth(&staff)
        .header("idempotency-key", "while-disputed")
        .json(&json!({"amount_cents": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error"]["code"], "charge_disputed", "{refused}");

    let events = api_get(&api, &staff, "/api/events?limit=100").await;
    let types: Vec<&str> = events["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    for wanted in [
        "charge.succeeded",
        "refund.succeeded",
        "charge.dispute.created",
    ] {
        assert_eq!(
            types.iter().filter(|t| **t == wanted).count(),
            1,
            "{wanted} in {types:?}"
        );
    }
    api.stop().await.unwrap();
}
