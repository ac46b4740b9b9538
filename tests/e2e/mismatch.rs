//! Issue 23, section 3, first point: a provider answer that does not show
//! what the charge asked for is never a success. The real binaries: the
//! answer, the database, the log line and the metric a person is alerted by.

use payments_tests::{Backend, Process, TestDb, backend_tests, charge_body, new_key};
use serde_json::{Value, json};

use super::{api_env, mint, post, sandbox_json};

/// `payments_provider_mismatch_total{call="charges"}` on the API.
async fn mismatches(api: &Process) -> f64 {
    crate::metric_sum(
        api,
        "payments_provider_mismatch_total{",
        r#"call="charges""#,
    )
    .await
}

/// The provider answers 200 `succeeded` for 1 USD to a 49 GBP charge. The
/// client never gets a 201: the charge is abandoned at once as unknown
/// (`500 request_abandoned`, replayed to a retry without calling the
/// provider again: it would answer the same), the metric rises and the
/// log says so, for a person.
async fn a_charge_answered_with_another_amount_is_never_a_success(backend: Backend) {
    let Some(db) = TestDb::new(backend, 1).await else {
        return;
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let api = Process::start("payments-api", &[], &api_env(&db, &sandbox, &[])).await;
    let configured = reqwest::Client::new()
        .post(format!("{}/_sandbox/config", sandbox.url))
        .json(&json!({"answer_amount_override": 100, "answer_currency_override": "usd"}))
        .send()
        .await
        .unwrap();
    assert_eq!(configured.status(), 200);
    let before = mismatches(&api).await;
    let token = mint("cus_mismatch").await;
    let key = new_key();
    let body = charge_body(4900, "tok_visa");

    let first = post(&api, &token, &key, &body).await;
    let status = first.status().as_u16();
    let answer: Value = first.json().await.unwrap();
    assert_ne!(status, 201, "a 1 USD charge reported as ours: {answer}");
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (500, Some("request_abandoned")),
        "{answer}"
    );
    assert_eq!(db.charges_with_status("unknown").await, 1);
    assert_eq!(db.charges_with_status("succeeded").await, 0);
    assert_eq!(mismatches(&api).await, before + 1.0);
    assert!(
        api.wait_for_log(&["PROVIDER MISMATCH", "ABANDONED"]).await,
        "the mismatch is logged:\n{}",
        api.log()
    );
    let mismatch_line = api
        .log()
        .lines()
        .find(|l| l.contains("PROVIDER MISMATCH"))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(
        mismatch_line.contains("ERROR") && mismatch_line.contains("amount 100 (asked 4900)"),
        "{mismatch_line}"
    );

    let retry = post(&api, &token, &key, &body).await;
    assert_eq!(retry.status(), 500);
    assert_eq!(retry.headers()["idempotent-replay"], "true");
    let charges: Value = sandbox_json(&sandbox, "/_sandbox/charges").await;
    assert_eq!(
        charges["data"].as_array().map(Vec::len),
        Some(1),
        "the provider was called once"
    );
}

backend_tests!(a_charge_answered_with_another_amount_is_never_a_success);
