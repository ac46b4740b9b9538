//! Black-box tests of the sandbox over real HTTP on loopback: each test
//! starts its own [`SandboxHandle`] on a random port.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use payments_sandbox::{SandboxConfig, SandboxHandle};
use reqwest::StatusCode;
use serde_json::{Value, json};

mod common;

use common::{Error, Sandbox, TestResult};

const VISA: &[(&str, &str)] = &[
    ("amount", "4900"),
    ("currency", "GBP"),
    ("source", "tok_visa"),
    ("description", "Tea & cake"),
    ("metadata[order_id]", "42"),
];

/// A form body as name/value pairs.
type Form<'a> = &'a [(&'a str, &'a str)];

fn charge_form(source: &str) -> Vec<(&str, &str)> {
    vec![("amount", "1000"), ("currency", "gbp"), ("source", source)]
}

impl Sandbox {
    fn charge_request(
        &self,
        client: &reqwest::Client,
        form: &[(&str, &str)],
        key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let request = client
            .post(self.url("/v1/charges"))
            .bearer_auth("sk_test_sandbox")
            .form(form);
        match key {
            Some(key) => request.header("Idempotency-Key", key),
            None => request,
        }
    }

    async fn post_charge(
        &self,
        form: &[(&str, &str)],
        key: Option<&str>,
    ) -> reqwest::Result<reqwest::Response> {
        self.charge_request(&self.client, form, key).send().await
    }

    fn refund_request(
        &self,
        client: &reqwest::Client,
        form: &[(&str, &str)],
        key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let request = client
            .post(self.url("/v1/refunds"))
            .bearer_auth("sk_test_sandbox")
            .form(form);
        match key {
            Some(key) => request.header("Idempotency-Key", key),
            None => request,
        }
    }

    async fn post_refund(
        &self,
        form: &[(&str, &str)],
        key: Option<&str>,
    ) -> reqwest::Result<reqwest::Response> {
        self.refund_request(&self.client, form, key).send().await
    }

    /// A successful 1000 gbp charge (minor units); its id.
    async fn paid_charge(&self, metadata: &[(&str, &str)]) -> Result<String, Error> {
        let mut form = charge_form("tok_visa");
        form.extend_from_slice(metadata);
        let (status, charge) = body_json(self.post_charge(&form, None).await?).await?;
        assert_eq!(status, StatusCode::OK, "{charge}");
        Ok(charge["id"].as_str().ok_or("no charge id")?.to_owned())
    }

    /// `GET` a `/v1` path with the query pairs and an API key.
    async fn get_v1(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<(StatusCode, Value), Error> {
        let response = self
            .client
            .get(self.query_url(path, query)?)
            .bearer_auth("sk_test_sandbox")
            .send()
            .await?;
        Ok(body_json(response).await?)
    }

    /// `path?query`, form-encoded (reqwest's `query` is an optional feature).
    fn query_url(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<String, serde_urlencoded::ser::Error> {
        Ok(format!(
            "{}?{}",
            self.url(path),
            serde_urlencoded::to_string(query)?
        ))
    }

    /// `GET /v1/charges/search` for `metadata['KEY']:'VALUE'`: the ids found.
    async fn search_metadata(&self, key: &str, value: &str) -> Result<Vec<String>, Error> {
        let query = format!("metadata['{key}']:'{value}'");
        let (status, body) = self
            .get_v1("/v1/charges/search", &[("query", &query)])
            .await?;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["object"], "search_result");
        assert_eq!(body["url"], "/v1/charges/search");
        assert_eq!(body["has_more"], false);
        assert_eq!(body["next_page"], Value::Null);
        let data = body["data"].as_array().ok_or("no data")?;
        Ok(data
            .iter()
            .filter_map(|charge| charge["id"].as_str().map(str::to_owned))
            .collect())
    }

    async fn get_json(&self, path: &str) -> reqwest::Result<Value> {
        self.client
            .get(self.url(path))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    }

    async fn charges(&self) -> reqwest::Result<Vec<Value>> {
        let list = self.get_json("/_sandbox/charges").await?;
        Ok(list["data"].as_array().cloned().unwrap_or_default())
    }

    async fn refunds(&self) -> reqwest::Result<Vec<Value>> {
        let list = self.get_json("/_sandbox/refunds").await?;
        Ok(list["data"].as_array().cloned().unwrap_or_default())
    }

    async fn stats(&self) -> reqwest::Result<Value> {
        self.get_json("/_sandbox/stats").await
    }

    async fn set_config(&self, config: Value) -> reqwest::Result<reqwest::Response> {
        self.client
            .post(self.url("/_sandbox/config"))
            .json(&config)
            .send()
            .await
    }

    /// Waits (bounded) until the sandbox has recorded `count` charges.
    async fn wait_for_charges(&self, count: usize) -> Result<Vec<Value>, Error> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let charges = self.charges().await?;
            if charges.len() >= count || Instant::now() > deadline {
                return Ok(charges);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn body_json(response: reqwest::Response) -> reqwest::Result<(StatusCode, Value)> {
    let status = response.status();
    Ok((status, response.json().await?))
}

fn is_replay(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|value| value == "true")
}

#[tokio::test]
async fn successful_charge_returns_a_charge_object_and_is_recorded() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let response = sandbox.post_charge(VISA, None).await?;
    assert!(!is_replay(&response));
    let (status, charge) = body_json(response).await?;
    assert_eq!(status, StatusCode::OK);
    let id = charge["id"].as_str().ok_or("no id")?;
    assert!(id.starts_with("ch_") && id.len() == 27, "{id}");
    assert!(id[3..].chars().all(|c| c.is_ascii_alphanumeric()));
    assert_eq!(charge["object"], "charge");
    assert_eq!(charge["amount"], 4900);
    assert_eq!(charge["currency"], "gbp");
    assert_eq!(charge["status"], "succeeded");
    assert_eq!(charge["paid"], true);
    assert_eq!(charge["source"], "tok_visa");
    assert_eq!(charge["description"], "Tea & cake");
    assert_eq!(charge["metadata"], json!({"order_id": "42"}));
    assert_eq!(charge["failure_code"], Value::Null);
    assert_eq!(charge["amount_refunded"], 0);
    assert_eq!(charge["refunded"], false);
    assert_eq!(charge["captured"], true);
    assert_eq!(charge["amount_captured"], 4900);
    assert_eq!(
        charge["payment_method_details"],
        json!({"type": "card", "card": {}})
    );
    assert!(
        charge["created"]
            .as_u64()
            .is_some_and(|created| created > 1_600_000_000)
    );

    let charges = sandbox.charges().await?;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["id"], id);
    assert_eq!(charges[0]["status"], "succeeded");
    assert_eq!(charges[0]["amount"], 4900);
    assert_eq!(charges[0]["currency"], "gbp");
    assert_eq!(charges[0]["idempotency_key"], Value::Null);
    assert_eq!(charges[0]["captured"], true);
    assert_eq!(charges[0]["amount_captured"], 4900);
    assert_eq!(charges[0]["amount_refunded"], 0);
    Ok(())
}

#[tokio::test]
async fn every_approving_test_token_succeeds() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    for token in ["tok_visa", "tok_mastercard", "tok_amex"] {
        let (status, charge) =
            body_json(sandbox.post_charge(&charge_form(token), None).await?).await?;
        assert_eq!(status, StatusCode::OK, "{token}");
        assert_eq!(charge["status"], "succeeded");
    }
    assert_eq!(sandbox.charges().await?.len(), 3);
    Ok(())
}

#[tokio::test]
async fn declines_answer_402_and_record_a_failed_charge() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let cases = [
        ("tok_chargeDeclined", "card_declined", "generic_decline"),
        (
            "tok_chargeDeclinedInsufficientFunds",
            "card_declined",
            "insufficient_funds",
        ),
        (
            "tok_chargeDeclinedExpiredCard",
            "expired_card",
            "expired_card",
        ),
        (
            "tok_chargeDeclinedFraudulent",
            "card_declined",
            "fraudulent",
        ),
    ];
    let mut ids = Vec::new();
    for (token, code, decline_code) in cases {
        let (status, body) =
            body_json(sandbox.post_charge(&charge_form(token), None).await?).await?;
        assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{token}");
        let error = &body["error"];
        assert_eq!(error["type"], "card_error");
        assert_eq!(error["code"], code, "{token}");
        assert_eq!(error["decline_code"], decline_code, "{token}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        let charge_id = error["charge"].as_str().ok_or("no charge id")?;
        assert!(charge_id.starts_with("ch_"));
        ids.push(charge_id.to_owned());
    }
    let charges = sandbox.charges().await?;
    let recorded: Vec<&str> = charges.iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(recorded, ids);
    assert!(charges.iter().all(|c| c["status"] == "failed"));
    Ok(())
}

#[tokio::test]
async fn unknown_token_is_resource_missing_and_charges_nothing() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let (status, body) = body_json(
        sandbox
            .post_charge(&charge_form("tok_nonsense"), None)
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "resource_missing");
    assert_eq!(body["error"]["param"], "source");
    assert!(sandbox.charges().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn missing_or_empty_api_key_is_401() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let url = sandbox.url("/v1/charges");
    let form = charge_form("tok_visa");
    let without = sandbox.client.post(&url).form(&form).send().await?;
    let empty = sandbox
        .client
        .post(&url)
        .header("Authorization", "Bearer ")
        .form(&form)
        .send()
        .await?;
    let basic = sandbox
        .client
        .post(&url)
        .header("Authorization", "Basic c2s6")
        .form(&form)
        .send()
        .await?;
    for response in [without, empty, basic] {
        let (status, body) = body_json(response).await?;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    assert!(sandbox.charges().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn invalid_parameters_are_400_with_code_and_param() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let cases: [(Form, &str, &str); 5] = [
        (
            &[("currency", "gbp"), ("source", "tok_visa")],
            "parameter_missing",
            "amount",
        ),
        (
            &[
                ("amount", "12.5"),
                ("currency", "gbp"),
                ("source", "tok_visa"),
            ],
            "parameter_invalid_integer",
            "amount",
        ),
        (
            &[("amount", "0"), ("currency", "gbp"), ("source", "tok_visa")],
            "parameter_invalid_integer",
            "amount",
        ),
        (
            &[("amount", "100"), ("source", "tok_visa")],
            "parameter_missing",
            "currency",
        ),
        (
            &[("amount", "100"), ("currency", "gbp")],
            "parameter_missing",
            "source",
        ),
    ];
    for (form, code, param) in cases {
        let (status, body) = body_json(sandbox.post_charge(form, None).await?).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{form:?}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], code, "{form:?}");
        assert_eq!(body["error"]["param"], param, "{form:?}");
    }
    assert!(sandbox.charges().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn same_key_replays_byte_for_byte_without_charging_again() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let first = sandbox.post_charge(VISA, Some("order-1")).await?;
    assert!(!is_replay(&first));
    let first_status = first.status();
    let first_body = first.bytes().await?;

    // Same parameters in another order are the same request.
    let mut reordered = VISA.to_vec();
    reordered.reverse();
    let second = sandbox.post_charge(&reordered, Some("order-1")).await?;
    assert!(is_replay(&second));
    assert_eq!(second.status(), first_status);
    assert_eq!(second.bytes().await?, first_body);

    let charges = sandbox.charges().await?;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["idempotency_key"], "order-1");
    Ok(())
}

/// Past its key retention the provider forgets a key: the same request is
/// processed anew and charges again. This is the double charge the API must
/// never cause by re-driving an old record.
#[tokio::test]
async fn a_key_past_its_retention_is_forgotten_and_charges_again() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        key_retention_secs: 1,
        ..SandboxConfig::default()
    })
    .await?;
    let first = sandbox.post_charge(VISA, Some("order-old")).await?;
    assert_eq!(first.status(), StatusCode::OK);
    let replay = sandbox.post_charge(VISA, Some("order-old")).await?;
    assert!(is_replay(&replay), "within the retention the key replays");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let again = sandbox.post_charge(VISA, Some("order-old")).await?;
    assert_eq!(again.status(), StatusCode::OK);
    assert!(!is_replay(&again), "past the retention the key is new");
    assert_eq!(sandbox.charges().await?.len(), 2, "a second, real charge");
    let (status, body) = body_json(
        sandbox
            .set_config(json!({"key_retention_secs": 60}))
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["key_retention_secs"], 60);
    Ok(())
}

#[tokio::test]
async fn declines_and_validation_errors_are_replayed_too() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let declined = charge_form("tok_chargeDeclined");
    let invalid = [
        ("amount", "abc"),
        ("currency", "gbp"),
        ("source", "tok_visa"),
    ];
    for (form, key, status) in [
        (&declined[..], "declined", StatusCode::PAYMENT_REQUIRED),
        (&invalid[..], "invalid", StatusCode::BAD_REQUEST),
    ] {
        let first = sandbox.post_charge(form, Some(key)).await?;
        assert_eq!(first.status(), status);
        let first_body = first.bytes().await?;
        let again = sandbox.post_charge(form, Some(key)).await?;
        assert_eq!(again.status(), status);
        assert!(is_replay(&again));
        assert_eq!(again.bytes().await?, first_body);
    }
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn same_key_with_other_parameters_is_an_idempotency_error() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let first = sandbox
        .post_charge(&charge_form("tok_visa"), Some("k1"))
        .await?;
    assert_eq!(first.status(), StatusCode::OK);
    let other = [
        ("amount", "2000"),
        ("currency", "gbp"),
        ("source", "tok_visa"),
    ];
    let (status, body) = body_json(sandbox.post_charge(&other, Some("k1")).await?).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["type"], "idempotency_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("same parameters"))
    );
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn concurrent_requests_with_one_key_charge_once() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        latency_ms: 300,
        ..SandboxConfig::default()
    })
    .await?;
    let form = charge_form("tok_visa");
    let requests = (0..10).map(|_| {
        sandbox
            .charge_request(&sandbox.client, &form, Some("same-key"))
            .send()
    });
    let responses = futures_join_all(requests).await;

    let mut succeeded_ids = Vec::new();
    let mut conflicts = 0;
    for response in responses {
        let response = response?;
        let replayed = is_replay(&response);
        let (status, body) = body_json(response).await?;
        match status {
            StatusCode::OK => succeeded_ids.push((body["id"].clone(), replayed)),
            StatusCode::CONFLICT => {
                assert_eq!(body["error"]["type"], "idempotency_error");
                conflicts += 1;
            }
            other => return Err(format!("unexpected status {other}: {body}").into()),
        }
    }
    assert_eq!(succeeded_ids.len() + conflicts, 10);
    assert_eq!(
        succeeded_ids
            .iter()
            .filter(|(_, replayed)| !replayed)
            .count(),
        1
    );
    assert!(
        succeeded_ids
            .iter()
            .all(|(id, _)| *id == succeeded_ids[0].0)
    );
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

/// Issue 23, item 3.4: like Stripe, the sandbox saves the injected 500 under
/// the key (its processing began) and replays it, marked as a replay, to
/// every retry with that key, even once the fault is off: a retry never
/// recovers. A new key is processed normally.
#[tokio::test]
async fn injected_errors_charge_nothing_and_are_replayed_under_the_key() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        error_rate: 1.0,
        ..SandboxConfig::default()
    })
    .await?;
    let form = charge_form("tok_visa");
    let first = sandbox.post_charge(&form, Some("flaky")).await?;
    assert!(!is_replay(&first), "the first 500 is fresh");
    let (status, body) = body_json(first).await?;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["error"]["type"], "api_error");
    assert!(sandbox.charges().await?.is_empty());

    let healed = sandbox.set_config(json!({"error_rate": 0.0})).await?;
    assert_eq!(healed.status(), StatusCode::OK);
    for _ in 0..2 {
        let retry = sandbox.post_charge(&form, Some("flaky")).await?;
        assert!(is_replay(&retry), "a saved 500 is replayed");
        let (status, replayed) = body_json(retry).await?;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{replayed}");
        assert_eq!(replayed, body, "byte for byte the saved answer");
    }
    assert!(
        sandbox.charges().await?.is_empty(),
        "a replay charges nothing"
    );
    let (status, _) = body_json(sandbox.post_charge(&form, Some("fresh")).await?).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

/// The fault a retry recovers from: a 429 from the rate limiter, answered
/// before the idempotency layer, saves nothing; the retry with the same key
/// is processed and charges once.
#[tokio::test]
async fn rate_limited_requests_charge_nothing_and_leave_the_key_free() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    sandbox
        .set_config(json!({"rate_limit_rate": 1.0}))
        .await?
        .error_for_status()?;
    let form = charge_form("tok_visa");
    for _ in 0..3 {
        let answer = sandbox.post_charge(&form, Some("busy")).await?;
        assert!(!is_replay(&answer));
        let (status, body) = body_json(answer).await?;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(body["error"]["code"], "rate_limit");
    }
    assert!(sandbox.charges().await?.is_empty());
    sandbox.set_config(json!({})).await?.error_for_status()?;
    let retry = sandbox.post_charge(&form, Some("busy")).await?;
    assert_eq!(retry.status(), StatusCode::OK);
    assert!(!is_replay(&retry), "a 429 is not saved");
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

/// Issue 23, item 3.6: with a secret key configured, another key is
/// answered 401 as Stripe answers an invalid key (type
/// `invalid_request_error`, the key redacted) and the restricted key 403;
/// nothing is charged or saved, so the same idempotency key works once the
/// right key is sent. Lookups are refused the same way.
#[tokio::test]
async fn only_the_configured_secret_key_is_accepted() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    sandbox
        .set_config(json!({"secret_key": "sk_test_right", "restricted_key": "rk_test_readonly"}))
        .await?
        .error_for_status()?;
    let form = charge_form("tok_visa");
    let post = |key: &'static str| {
        sandbox
            .client
            .post(sandbox.url("/v1/charges"))
            .bearer_auth(key)
            .header("Idempotency-Key", "same")
            .form(&form)
            .send()
    };
    let (status, body) = body_json(post("sk_test_sandbox_wrong_1234").await?).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Invalid API Key provided: sk_test_"),
        "{message}"
    );
    assert!(
        message.ends_with("1234") && !message.contains("wrong"),
        "{message}"
    );
    let (status, body) = body_json(post("rk_test_readonly").await?).await?;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let lookup = sandbox
        .client
        .get(sandbox.url("/v1/refunds"))
        .bearer_auth("sk_test_other")
        .send()
        .await?;
    assert_eq!(lookup.status(), StatusCode::UNAUTHORIZED);
    assert!(sandbox.charges().await?.is_empty());

    let right = post("sk_test_right").await?;
    assert_eq!(right.status(), StatusCode::OK);
    assert!(!is_replay(&right), "a refused key saved nothing");
    let again = post("sk_test_right").await?;
    assert!(is_replay(&again));
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

/// Issue 23, item 3.7: every `/v1` request is recorded with the
/// `Stripe-Version` it carried (null when none), posts and lookups alike,
/// refused ones too, for tests to assert what a client sends.
#[tokio::test]
async fn requests_are_recorded_with_their_stripe_version() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let pinned = sandbox
        .charge_request(&sandbox.client, &charge_form("tok_visa"), Some("v"))
        .header("Stripe-Version", "2026-09-30.endive")
        .send()
        .await?;
    assert_eq!(pinned.status(), StatusCode::OK);
    let lookup = sandbox
        .client
        .get(sandbox.url("/v1/refunds"))
        .bearer_auth("sk_test_sandbox")
        .header("Stripe-Version", "2024-06-20")
        .send()
        .await?;
    assert_eq!(lookup.status(), StatusCode::OK);
    sandbox.post_charge(&charge_form("tok_visa"), None).await?;
    let seen = sandbox.get_json("/_sandbox/requests").await?;
    assert_eq!(
        seen["data"],
        json!([
            {"method": "POST", "path": "/v1/charges", "stripe_version": "2026-09-30.endive"},
            {"method": "GET", "path": "/v1/refunds", "stripe_version": "2024-06-20"},
            {"method": "POST", "path": "/v1/charges", "stripe_version": null},
        ])
    );
    sandbox.reset().await?.error_for_status()?;
    let seen = sandbox.get_json("/_sandbox/requests").await?;
    assert_eq!(seen["data"], json!([]));
    Ok(())
}

#[tokio::test]
async fn drop_after_charge_charges_and_closes_without_answering() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        drop_after_charge: true,
        ..SandboxConfig::default()
    })
    .await?;
    let form = charge_form("tok_visa");
    let error = match sandbox.post_charge(&form, Some("dropped")).await {
        Ok(response) => return Err(format!("got a response: {}", response.status()).into()),
        Err(error) => error,
    };
    assert!(!error.is_timeout(), "{error}");
    assert!(error.status().is_none());

    let charges = sandbox.charges().await?;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["idempotency_key"], "dropped");

    // The fault is still on: a replay charges nothing, so it is answered.
    let retry = sandbox.post_charge(&form, Some("dropped")).await?;
    assert!(is_replay(&retry));
    let (status, charge) = body_json(retry).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(charge["id"], charges[0]["id"]);
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn drop_after_charge_writes_not_a_single_byte() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        drop_after_charge: true,
        ..SandboxConfig::default()
    })
    .await?;
    let addr = sandbox.handle.addr();
    let received = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
        let body = "amount=1000&currency=gbp&source=tok_visa";
        let request = format!(
            "POST /v1/charges HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer sk_test\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.write_all(request.as_bytes())?;
        let mut received = Vec::new();
        match stream.read_to_end(&mut received) {
            Ok(_) => Ok(received),
            // A reset is a close too; what matters is what arrived before it.
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => Ok(received),
            Err(error) => Err(error),
        }
    })
    .await??;
    assert!(
        received.is_empty(),
        "received {:?}",
        String::from_utf8_lossy(&received)
    );
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_slow_charge_completes_after_the_client_gave_up() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        latency_ms: 700,
        ..SandboxConfig::default()
    })
    .await?;
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(100))
        .build()?;
    let form = charge_form("tok_visa");
    let error = match sandbox
        .charge_request(&impatient, &form, Some("slow"))
        .send()
        .await
    {
        Ok(response) => return Err(format!("got a response: {}", response.status()).into()),
        Err(error) => error,
    };
    assert!(error.is_timeout(), "{error}");

    let charges = sandbox.wait_for_charges(1).await?;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["idempotency_key"], "slow");
    // The result was stored: the client's retry replays it.
    let retry = sandbox.post_charge(&form, Some("slow")).await?;
    assert_eq!(retry.status(), StatusCode::OK);
    assert!(is_replay(&retry));
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn hang_never_answers_never_charges_and_releases_the_key() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        hang: true,
        ..SandboxConfig::default()
    })
    .await?;
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(200))
        .build()?;
    let form = charge_form("tok_visa");
    let result = sandbox
        .charge_request(&impatient, &form, Some("hung"))
        .send()
        .await;
    assert!(result.is_err_and(|error| error.is_timeout()));
    assert!(sandbox.charges().await?.is_empty());
    // The hanging handler never returns: only its cancellation, when the
    // client hung up, can take it out of the in-flight count.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sandbox.stats().await?["in_flight"] != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = sandbox.stats().await?;
    assert_eq!(stats["in_flight"], 0);
    assert_eq!(stats["max_in_flight"], 1);

    sandbox.set_config(json!({})).await?.error_for_status()?;
    let retry = sandbox.post_charge(&form, Some("hung")).await?;
    assert_eq!(retry.status(), StatusCode::OK);
    assert!(!is_replay(&retry));
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn refund_returns_a_refund_object_and_its_replay() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge_id = sandbox.paid_charge(&[("metadata[order_id]", "7")]).await?;
    let form = [
        ("charge", charge_id.as_str()),
        ("amount", "400"),
        ("reason", "requested_by_customer"),
        ("metadata[ticket]", "T-1"),
    ];
    let first = sandbox.post_refund(&form, Some("refund-1")).await?;
    assert!(!is_replay(&first));
    let first_status = first.status();
    let first_body = first.bytes().await?;
    assert_eq!(first_status, StatusCode::OK);
    let refund: Value = serde_json::from_slice(&first_body)?;
    let id = refund["id"].as_str().ok_or("no id")?;
    assert!(id.starts_with("re_") && id.len() == 27, "{id}");
    assert!(id[3..].chars().all(|c| c.is_ascii_alphanumeric()));
    assert_eq!(refund["object"], "refund");
    assert_eq!(refund["amount"], 400);
    assert_eq!(refund["charge"], charge_id.as_str());
    assert_eq!(refund["currency"], "gbp");
    assert_eq!(refund["status"], "succeeded");
    assert_eq!(refund["reason"], "requested_by_customer");
    assert_eq!(refund["metadata"], json!({"ticket": "T-1"}));
    assert!(
        refund["created"]
            .as_u64()
            .is_some_and(|created| created > 1_600_000_000)
    );

    // Same parameters in another order: the stored answer, byte for byte.
    let mut reordered = form.to_vec();
    reordered.reverse();
    let replay = sandbox.post_refund(&reordered, Some("refund-1")).await?;
    assert!(is_replay(&replay));
    assert_eq!(replay.status(), first_status);
    assert_eq!(replay.bytes().await?, first_body);

    let refunds = sandbox.refunds().await?;
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0]["id"], id);
    assert_eq!(refunds[0]["charge"], charge_id.as_str());
    assert_eq!(refunds[0]["amount"], 400);
    assert_eq!(refunds[0]["idempotency_key"], "refund-1");
    assert_eq!(sandbox.stats().await?["refunds"], 1);

    // The charge carries what was refunded.
    let (_, found) = sandbox
        .get_v1(
            "/v1/charges/search",
            &[("query", "metadata['order_id']:'7'")],
        )
        .await?;
    assert_eq!(found["data"][0]["id"], charge_id.as_str());
    assert_eq!(found["data"][0]["amount_refunded"], 400);
    assert_eq!(found["data"][0]["refunded"], false);
    Ok(())
}

#[tokio::test]
async fn partial_refunds_up_to_the_amount_then_refusals() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge_id = sandbox.paid_charge(&[("metadata[order_id]", "8")]).await?;
    let charge = charge_id.as_str();
    for amount in ["300", "300"] {
        let (status, refund) = body_json(
            sandbox
                .post_refund(&[("charge", charge), ("amount", amount)], None)
                .await?,
        )
        .await?;
        assert_eq!(status, StatusCode::OK, "{refund}");
        assert_eq!(refund["amount"], 300);
        assert_eq!(refund["reason"], Value::Null);
        assert_eq!(refund["metadata"], json!({}));
    }

    // 400 is left: 500 is too much, and nothing is refunded.
    let (status, body) = body_json(
        sandbox
            .post_refund(&[("charge", charge), ("amount", "500")], None)
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body,
        json!({"error": {
            "type": "invalid_request_error",
            "code": "amount_too_large",
            "param": "amount",
            "message": "Refund amount (500) is greater than unrefunded amount on charge (400)",
        }})
    );

    // No amount: the rest.
    let (status, refund) =
        body_json(sandbox.post_refund(&[("charge", charge)], None).await?).await?;
    assert_eq!(status, StatusCode::OK, "{refund}");
    assert_eq!(refund["amount"], 400);

    for form in [
        &[("charge", charge)][..],
        &[("charge", charge), ("amount", "1")],
    ] {
        let (status, body) = body_json(sandbox.post_refund(form, None).await?).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{form:?}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "charge_already_refunded", "{form:?}");
    }

    let refunds = sandbox.refunds().await?;
    let amounts: Vec<&Value> = refunds.iter().map(|refund| &refund["amount"]).collect();
    assert_eq!(amounts, [300, 300, 400]);
    let (_, found) = sandbox
        .get_v1(
            "/v1/charges/search",
            &[("query", "metadata['order_id']:'8'")],
        )
        .await?;
    assert_eq!(found["data"][0]["amount_refunded"], 1000);
    assert_eq!(found["data"][0]["refunded"], true);
    Ok(())
}

#[tokio::test]
async fn concurrent_refunds_never_exceed_the_charge() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge_id = sandbox.paid_charge(&[]).await?;
    // Latency holds all twenty in flight, so they reach the ledger together.
    sandbox
        .set_config(json!({"latency_ms": 200}))
        .await?
        .error_for_status()?;
    let form = [("charge", charge_id.as_str()), ("amount", "300")];
    let keys: Vec<String> = (0..20).map(|i| format!("refund-{i}")).collect();
    let requests = keys.iter().map(|key| {
        sandbox
            .refund_request(&sandbox.client, &form, Some(key))
            .send()
    });
    let mut succeeded = 0;
    let mut too_large = 0;
    for response in futures_join_all(requests).await {
        let (status, body) = body_json(response?).await?;
        match status {
            StatusCode::OK => succeeded += 1,
            StatusCode::BAD_REQUEST if body["error"]["code"] == "amount_too_large" => {
                too_large += 1;
            }
            other => return Err(format!("unexpected status {other}: {body}").into()),
        }
    }
    assert_eq!((succeeded, too_large), (3, 17));
    let refunds = sandbox.refunds().await?;
    assert_eq!(refunds.len(), 3);
    assert!(refunds.iter().all(|refund| refund["amount"] == 300));
    assert_eq!(sandbox.stats().await?["refunds"], 3);
    Ok(())
}

#[tokio::test]
async fn refund_key_reused_with_other_parameters_is_an_idempotency_error() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge_id = sandbox.paid_charge(&[]).await?;
    let charge = charge_id.as_str();
    let first = sandbox
        .post_refund(&[("charge", charge), ("amount", "100")], Some("r-key"))
        .await?;
    assert_eq!(first.status(), StatusCode::OK);
    let (status, body) = body_json(
        sandbox
            .post_refund(&[("charge", charge), ("amount", "200")], Some("r-key"))
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["type"], "idempotency_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("same parameters"))
    );

    // A key is the account's, across endpoints: one first used for a charge
    // cannot make a refund.
    sandbox
        .post_charge(&charge_form("tok_visa"), Some("charge-key"))
        .await?
        .error_for_status()?;
    let (status, body) = body_json(
        sandbox
            .post_refund(&[("charge", charge)], Some("charge-key"))
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["type"], "idempotency_error");
    assert_eq!(sandbox.refunds().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn invalid_refunds_are_400_and_refund_nothing() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let paid = sandbox.paid_charge(&[]).await?;
    let (status, declined) = body_json(
        sandbox
            .post_charge(&charge_form("tok_chargeDeclined"), None)
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    let failed = declined["error"]["charge"].as_str().ok_or("no charge id")?;
    let cases: [(Form, &str, &str); 7] = [
        (&[("amount", "100")], "parameter_missing", "charge"),
        (
            &[("charge", "ch_doesnotexist")],
            "resource_missing",
            "charge",
        ),
        (&[("charge", failed)], "charge_not_refundable", "charge"),
        (
            &[("charge", &paid), ("amount", "0")],
            "parameter_invalid_integer",
            "amount",
        ),
        (
            &[("charge", &paid), ("amount", "1.5")],
            "parameter_invalid_integer",
            "amount",
        ),
        (
            &[("charge", &paid), ("reason", "changed_my_mind")],
            "parameter_invalid_string",
            "reason",
        ),
        (
            &[("charge", &paid), ("payment_intent", "pi_1")],
            "parameter_unknown",
            "payment_intent",
        ),
    ];
    for (form, code, param) in cases {
        let (status, body) = body_json(sandbox.post_refund(form, None).await?).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{form:?}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], code, "{form:?}");
        assert_eq!(body["error"]["param"], param, "{form:?}");
    }

    let unauthenticated = sandbox
        .client
        .post(sandbox.url("/v1/refunds"))
        .form(&[("charge", paid.as_str())])
        .send()
        .await?;
    assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);
    assert!(sandbox.refunds().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn injected_errors_refund_nothing_and_are_replayed_under_the_key() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge_id = sandbox.paid_charge(&[]).await?;
    sandbox
        .set_config(json!({"error_rate": 1.0}))
        .await?
        .error_for_status()?;
    let form = [("charge", charge_id.as_str())];
    let (status, body) = body_json(sandbox.post_refund(&form, Some("flaky")).await?).await?;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["error"]["type"], "api_error");
    assert!(sandbox.refunds().await?.is_empty());

    sandbox.set_config(json!({})).await?.error_for_status()?;
    let retry = sandbox.post_refund(&form, Some("flaky")).await?;
    assert_eq!(retry.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(is_replay(&retry), "a saved 500 is replayed");
    assert!(sandbox.refunds().await?.is_empty());
    let fresh = sandbox.post_refund(&form, Some("fresh")).await?;
    assert_eq!(fresh.status(), StatusCode::OK);
    assert_eq!(sandbox.refunds().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn drop_after_charge_refunds_and_the_retry_gets_the_replay() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge_id = sandbox.paid_charge(&[]).await?;
    sandbox
        .set_config(json!({"drop_after_charge": true}))
        .await?
        .error_for_status()?;
    let form = [("charge", charge_id.as_str()), ("amount", "250")];
    let error = match sandbox.post_refund(&form, Some("dropped-refund")).await {
        Ok(response) => return Err(format!("got a response: {}", response.status()).into()),
        Err(error) => error,
    };
    assert!(!error.is_timeout(), "{error}");
    assert!(error.status().is_none());

    let refunds = sandbox.refunds().await?;
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0]["idempotency_key"], "dropped-refund");
    assert_eq!(refunds[0]["amount"], 250);

    // The fault is still on: a replay refunds nothing, so it is answered.
    let retry = sandbox.post_refund(&form, Some("dropped-refund")).await?;
    assert!(is_replay(&retry));
    let (status, refund) = body_json(retry).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(refund["id"], refunds[0]["id"]);
    assert_eq!(sandbox.refunds().await?.len(), 1);

    // A refused refund records nothing, so it is answered too.
    let (status, body) = body_json(
        sandbox
            .post_refund(&[("charge", &charge_id), ("amount", "5000")], None)
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "amount_too_large");
    Ok(())
}

#[tokio::test]
async fn refunds_are_listed_newest_first_by_charge() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let first = sandbox.paid_charge(&[]).await?;
    let second = sandbox.paid_charge(&[]).await?;
    let mut made = Vec::new();
    for (charge, amount) in [(&first, "100"), (&second, "200"), (&first, "300")] {
        let (status, refund) = body_json(
            sandbox
                .post_refund(&[("charge", charge), ("amount", amount)], None)
                .await?,
        )
        .await?;
        assert_eq!(status, StatusCode::OK, "{refund}");
        made.push(refund);
    }

    let (status, list) = sandbox.get_v1("/v1/refunds", &[("charge", &first)]).await?;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(
        list,
        json!({"object": "list", "data": [made[2], made[0]], "has_more": false, "url": "/v1/refunds"})
    );

    let (_, all) = sandbox.get_v1("/v1/refunds", &[]).await?;
    assert_eq!(all["data"], json!([made[2], made[1], made[0]]));
    assert_eq!(all["has_more"], false);
    let (_, page) = sandbox.get_v1("/v1/refunds", &[("limit", "2")]).await?;
    assert_eq!(page["data"], json!([made[2], made[1]]));
    assert_eq!(page["has_more"], true);

    let (_, none) = sandbox
        .get_v1(
            "/v1/refunds",
            &[("charge", &sandbox.paid_charge(&[]).await?)],
        )
        .await?;
    assert_eq!(none["data"], json!([]));

    for (query, code, param) in [
        (
            &[("charge", "ch_doesnotexist")][..],
            "resource_missing",
            "charge",
        ),
        (&[("limit", "101")], "parameter_invalid_integer", "limit"),
        (
            &[("starting_after", "re_1")],
            "resource_missing",
            "starting_after",
        ),
        (
            &[("ending_before", "re_1")],
            "parameter_unknown",
            "ending_before",
        ),
    ] {
        let (status, body) = sandbox.get_v1("/v1/refunds", query).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query:?}");
        assert_eq!(body["error"]["code"], code, "{query:?}");
        assert_eq!(body["error"]["param"], param, "{query:?}");
    }
    let unauthenticated = sandbox
        .client
        .get(sandbox.url("/v1/refunds"))
        .send()
        .await?;
    assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);
    Ok(())
}

/// A charge's refunds page as Stripe's list does: newest first, at most 100
/// a page, `has_more` while older ones are left, the next page from
/// `starting_after` (the last id of the page before); a cursor that is not
/// in the list is `resource_missing`. Walked to the end, the pages hold
/// every refund of the charge once.
#[tokio::test]
async fn refund_lists_page_with_starting_after_as_stripe_does() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge = sandbox.paid_charge(&[]).await?;
    let other = sandbox.paid_charge(&[]).await?;
    for (charge, count) in [(&charge, 250), (&other, 3)] {
        for _ in 0..count {
            let response = sandbox
                .post_refund(&[("charge", charge), ("amount", "1")], None)
                .await?;
            assert_eq!(response.status(), StatusCode::OK);
        }
    }
    let newest_first: Vec<Value> = sandbox
        .refunds()
        .await?
        .into_iter()
        .rev()
        .filter(|refund| refund["charge"] == charge.as_str())
        .map(|refund| refund["id"].clone())
        .collect();
    assert_eq!(newest_first.len(), 250);

    let mut seen = Vec::new();
    let mut shapes = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("charge", charge.as_str()), ("limit", "100")];
        if let Some(cursor) = &cursor {
            query.push(("starting_after", cursor));
        }
        let (status, page) = sandbox.get_v1("/v1/refunds", &query).await?;
        assert_eq!(status, StatusCode::OK, "{page}");
        let data = page["data"].as_array().ok_or("no data")?;
        shapes.push((data.len(), page["has_more"].clone()));
        seen.extend(data.iter().map(|refund| refund["id"].clone()));
        if page["has_more"] != true {
            break;
        }
        cursor = data
            .last()
            .and_then(|refund| refund["id"].as_str())
            .map(str::to_owned);
    }
    assert_eq!(
        shapes,
        [(100, json!(true)), (100, json!(true)), (50, json!(false))]
    );
    assert_eq!(seen, newest_first);

    // A refund of another charge is not in this charge's list.
    let foreign = sandbox
        .refunds()
        .await?
        .into_iter()
        .rev()
        .find(|refund| refund["charge"] == other.as_str())
        .and_then(|refund| refund["id"].as_str().map(str::to_owned))
        .ok_or("no refund of the other charge")?;
    let (status, body) = sandbox
        .get_v1(
            "/v1/refunds",
            &[("charge", &charge), ("starting_after", &foreign)],
        )
        .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "resource_missing");
    assert_eq!(body["error"]["param"], "starting_after");
    // The oldest refund's page is empty, and says so.
    let oldest = newest_first.last().and_then(Value::as_str).ok_or("none")?;
    let (status, last) = sandbox
        .get_v1(
            "/v1/refunds",
            &[("charge", &charge), ("starting_after", oldest)],
        )
        .await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (last["data"].clone(), last["has_more"].clone()),
        (json!([]), json!(false))
    );
    Ok(())
}

/// `answer_amount_override` and `answer_currency_override` make a provider
/// whose answers do not match the request: the charge or refund is made,
/// recorded, answered and listed with the override. A currency that is not
/// three letters is refused, naming the field.
#[tokio::test]
async fn answer_overrides_make_another_amount_and_currency() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let (status, config) = body_json(
        sandbox
            .set_config(json!({"answer_amount_override": 100, "answer_currency_override": "USD"}))
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{config}");
    let (status, charge) = body_json(
        sandbox
            .post_charge(&charge_form("tok_visa"), Some("k-1"))
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{charge}");
    assert_eq!(
        (charge["amount"].clone(), charge["currency"].clone()),
        (json!(100), json!("usd"))
    );
    let recorded = sandbox.charges().await?;
    assert_eq!(
        (
            recorded[0]["amount"].clone(),
            recorded[0]["currency"].clone()
        ),
        (json!(100), json!("usd"))
    );
    let charge_id = charge["id"].as_str().ok_or("no id")?;

    sandbox
        .set_config(json!({"answer_amount_override": 30, "answer_currency_override": "eur"}))
        .await?
        .error_for_status()?;
    let (status, refund) = body_json(
        sandbox
            .post_refund(&[("charge", charge_id), ("amount", "50")], None)
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{refund}");
    assert_eq!(
        (refund["amount"].clone(), refund["currency"].clone()),
        (json!(30), json!("eur"))
    );
    let (_, list) = sandbox
        .get_v1("/v1/refunds", &[("charge", charge_id)])
        .await?;
    assert_eq!(list["data"][0]["amount"], 30);

    let (status, body) = body_json(
        sandbox
            .set_config(json!({"answer_currency_override": "dollars"}))
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "answer_currency_override");
    Ok(())
}

/// `nulls_in_refund_lists`: a refund made without metadata is listed with
/// `metadata` and `status` null, as Stripe's refund object allows; one with
/// metadata, and every POST answer, are unchanged.
#[tokio::test]
async fn refund_lists_can_show_stripes_nullable_fields_as_null() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge = sandbox.paid_charge(&[]).await?;
    let mut made = Vec::new();
    for form in [
        &[
            ("charge", charge.as_str()),
            ("amount", "100"),
            ("metadata[ticket]", "T-1"),
        ][..],
        &[("charge", charge.as_str()), ("amount", "200")],
    ] {
        let (status, refund) = body_json(sandbox.post_refund(form, None).await?).await?;
        assert_eq!(status, StatusCode::OK, "{refund}");
        made.push(refund);
    }
    sandbox
        .set_config(json!({"nulls_in_refund_lists": true}))
        .await?
        .error_for_status()?;
    let (status, list) = sandbox
        .get_v1("/v1/refunds", &[("charge", &charge)])
        .await?;
    assert_eq!(status, StatusCode::OK);
    let mut bare = made[1].clone();
    bare["metadata"] = Value::Null;
    bare["status"] = Value::Null;
    assert_eq!(list["data"], json!([bare, made[0]]));
    let (_, third) = body_json(
        sandbox
            .post_refund(&[("charge", charge.as_str()), ("amount", "300")], None)
            .await?,
    )
    .await?;
    assert_eq!(
        (third["metadata"].clone(), third["status"].clone()),
        (json!({}), json!("succeeded"))
    );
    Ok(())
}

impl Sandbox {
    /// `POST /_sandbox/refunds/{id}` with a JSON body: the status and body.
    async fn settle_refund(&self, id: &str, body: &str) -> Result<(StatusCode, Value), Error> {
        let response = self
            .client
            .post(self.url(&format!("/_sandbox/refunds/{id}")))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await?;
        Ok(body_json(response).await?)
    }

    /// The charge's `amount_refunded`, as the charge search shows it.
    async fn amount_refunded(&self, order: &str) -> Result<Value, Error> {
        let query = format!("metadata['order_id']:'{order}'");
        let (_, found) = self
            .get_v1("/v1/charges/search", &[("query", &query)])
            .await?;
        Ok(found["data"][0]["amount_refunded"].clone())
    }
}

/// A refund made `pending` (the run-time `refund_status`) is answered
/// pending, counts against its charge, reads back pending, and turns
/// `succeeded` when settled through `/_sandbox/refunds/{id}`; its key still
/// replays the first, pending answer byte for byte, as at Stripe.
#[tokio::test]
async fn a_pending_refund_settles_later_and_its_key_replays_the_first_answer() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    assert!(
        sandbox
            .set_config(json!({"refund_status": "pending"}))
            .await?
            .status()
            .is_success()
    );
    let charge_id = sandbox.paid_charge(&[("metadata[order_id]", "p1")]).await?;
    let form = [("charge", charge_id.as_str()), ("amount", "400")];
    let first = sandbox.post_refund(&form, Some("pending-1")).await?;
    assert_eq!(first.status(), StatusCode::OK);
    let first_body = first.bytes().await?;
    let refund: Value = serde_json::from_slice(&first_body)?;
    assert_eq!(refund["status"], "pending");
    assert_eq!(refund["failure_reason"], Value::Null);
    let id = refund["id"].as_str().ok_or("no id")?.to_owned();
    let path = format!("/v1/refunds/{id}");
    let (status, read) = sandbox.get_v1(&path, &[]).await?;
    assert_eq!(
        (status, &read["status"]),
        (StatusCode::OK, &json!("pending"))
    );
    // A pending refund counts against the charge, as at Stripe.
    assert_eq!(sandbox.amount_refunded("p1").await?, 400);
    let (status, too_large) = body_json(
        sandbox
            .post_refund(&[("charge", charge_id.as_str()), ("amount", "700")], None)
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(too_large["error"]["code"], "amount_too_large");

    let (status, settled) = sandbox
        .settle_refund(&id, r#"{"status":"succeeded"}"#)
        .await?;
    assert_eq!(
        (status, &settled["status"]),
        (StatusCode::OK, &json!("succeeded"))
    );
    let (_, read) = sandbox.get_v1(&path, &[]).await?;
    assert_eq!(read["status"], "succeeded");
    assert_eq!(sandbox.amount_refunded("p1").await?, 400);
    let refunds = sandbox.refunds().await?;
    assert_eq!(refunds[0]["status"], "succeeded");
    // Final: it cannot be settled again.
    let (status, again) = sandbox
        .settle_refund(&id, r#"{"status":"canceled"}"#)
        .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{again}");
    assert_eq!(again["error"]["param"], "status");

    let replay = sandbox.post_refund(&form, Some("pending-1")).await?;
    assert!(is_replay(&replay));
    assert_eq!(replay.bytes().await?, first_body);
    assert_eq!(sandbox.stats().await?["refunds"], 1);
    Ok(())
}

/// A `requires_action` refund canceled, and a pending one failed, give
/// their amounts back to the charge; a refund made `canceled` or `failed`
/// refunds nothing at all.
#[tokio::test]
async fn canceled_and_failed_refunds_give_the_amount_back() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        refund_status: payments_sandbox::RefundStatus::RequiresAction,
        ..SandboxConfig::default()
    })
    .await?;
    let charge_id = sandbox.paid_charge(&[("metadata[order_id]", "c1")]).await?;
    let refund = |amount: &'static str| {
        let form = [("charge", charge_id.clone()), ("amount", amount.to_owned())];
        let sandbox = &sandbox;
        async move {
            let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
            body_json(sandbox.post_refund(&form, None).await?).await
        }
    };
    let (status, waiting) = refund("600").await?;
    assert_eq!(
        (status, &waiting["status"]),
        (StatusCode::OK, &json!("requires_action"))
    );
    assert_eq!(sandbox.amount_refunded("c1").await?, 600);
    let id = waiting["id"].as_str().ok_or("no id")?;
    let (status, canceled) = sandbox
        .settle_refund(id, r#"{"status":"canceled"}"#)
        .await?;
    assert_eq!(
        (status, &canceled["status"]),
        (StatusCode::OK, &json!("canceled"))
    );
    assert_eq!(canceled["failure_reason"], Value::Null);
    assert_eq!(sandbox.amount_refunded("c1").await?, 0);

    assert!(
        sandbox
            .set_config(json!({"refund_status": "pending"}))
            .await?
            .status()
            .is_success()
    );
    let (_, pending) = refund("1000").await?;
    let id = pending["id"].as_str().ok_or("no id")?;
    let (status, failed) = sandbox
        .settle_refund(
            id,
            r#"{"status":"failed","failure_reason":"expired_or_canceled_card"}"#,
        )
        .await?;
    assert_eq!(
        (status, &failed["status"]),
        (StatusCode::OK, &json!("failed"))
    );
    assert_eq!(failed["failure_reason"], "expired_or_canceled_card");
    assert_eq!(sandbox.amount_refunded("c1").await?, 0);

    for (made, reason) in [("canceled", Value::Null), ("failed", json!("unknown"))] {
        assert!(
            sandbox
                .set_config(json!({"refund_status": made}))
                .await?
                .status()
                .is_success()
        );
        let (status, refund) = refund("1000").await?;
        assert_eq!((status, &refund["status"]), (StatusCode::OK, &json!(made)));
        assert_eq!(refund["failure_reason"], reason);
        assert_eq!(
            sandbox.amount_refunded("c1").await?,
            0,
            "{made} refunds nothing"
        );
    }
    assert_eq!(sandbox.refunds().await?.len(), 4);
    Ok(())
}

/// Settling is validated: an unknown refund is a 404, a status that is not
/// final or not a status, a body that is not JSON, and a failure reason
/// for anything but a failure are 400s; an unknown id reads back 404
/// `resource_missing`, and a bad `refund_status` is refused.
#[tokio::test]
async fn refund_settlements_and_reads_are_validated() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let (status, missing) = sandbox
        .settle_refund("re_nope", r#"{"status":"succeeded"}"#)
        .await?;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    assert_eq!(missing["error"]["code"], "resource_missing");
    let (status, missing) = sandbox.get_v1("/v1/refunds/re_nope", &[]).await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing["error"]["code"], "resource_missing");
    assert!(
        sandbox
            .set_config(json!({"refund_status": "pending"}))
            .await?
            .status()
            .is_success()
    );
    let charge_id = sandbox.paid_charge(&[]).await?;
    let (_, pending) = body_json(
        sandbox
            .post_refund(&[("charge", charge_id.as_str())], None)
            .await?,
    )
    .await?;
    let id = pending["id"].as_str().ok_or("no id")?;
    for body in [
        r#"{"status":"pending"}"#,
        r#"{"status":"requires_action"}"#,
        r#"{"status":"done"}"#,
        r#"{"status":"succeeded","failure_reason":"declined"}"#,
        r#"{"status":"succeeded","extra":1}"#,
        "not json",
    ] {
        let (status, refused) = sandbox.settle_refund(id, body).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {refused}");
        assert_eq!(refused["error"]["type"], "invalid_request_error", "{body}");
    }
    let (_, read) = sandbox.get_v1(&format!("/v1/refunds/{id}"), &[]).await?;
    assert_eq!(
        read["status"], "pending",
        "a refused settlement changes nothing"
    );
    let unauthenticated = sandbox
        .client
        .get(sandbox.url(&format!("/v1/refunds/{id}")))
        .send()
        .await?;
    assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);
    let refused = sandbox
        .set_config(json!({"refund_status": "later"}))
        .await?;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    Ok(())
}

/// `GET /v1/charges` lists charges newest first within `created` bounds,
/// page by page (`starting_after`, `has_more`), and shows a charge at once
/// even while Search lags far behind (a large `search_lag_ms`).
#[tokio::test]
async fn charges_are_listed_newest_first_within_created_bounds_page_by_page() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    sandbox
        .set_config(json!({"search_lag_ms": 3_600_000}))
        .await?;
    let mut made = Vec::new();
    for i in 0..5 {
        let i = i.to_string();
        made.push(
            sandbox
                .paid_charge(&[("metadata[payments_charge_id]", i.as_str())])
                .await?,
        );
    }
    made.reverse();
    assert!(
        sandbox
            .search_metadata("payments_charge_id", "0")
            .await?
            .is_empty(),
        "Search misses it"
    );
    let ids = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .map(|data| {
                data.iter()
                    .filter_map(|c| c["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (status, all) = sandbox.get_v1("/v1/charges", &[]).await?;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(
        (all["object"].as_str(), all["url"].as_str()),
        (Some("list"), Some("/v1/charges"))
    );
    assert_eq!(ids(&all), made);
    assert_eq!(all["has_more"], false);
    assert_eq!(all["data"][4]["metadata"]["payments_charge_id"], "0");

    // Page by page, two at a time, each after the last id of the one before.
    let (from, to) = (
        all["data"][4]["created"]
            .as_u64()
            .ok_or("created")?
            .to_string(),
        all["data"][0]["created"]
            .as_u64()
            .ok_or("created")?
            .to_string(),
    );
    let window = [
        ("created[gte]", from.as_str()),
        ("created[lte]", to.as_str()),
    ];
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut query = window.to_vec();
        query.push(("limit", "2"));
        if let Some(after) = &after {
            query.push(("starting_after", after.as_str()));
        }
        let (status, page) = sandbox.get_v1("/v1/charges", &query).await?;
        assert_eq!(status, StatusCode::OK, "{page}");
        let page_ids = ids(&page);
        assert!(page_ids.len() <= 2, "{page}");
        seen.extend(page_ids.iter().cloned());
        if page["has_more"] == false {
            break;
        }
        after = page_ids.last().cloned();
        assert!(seen.len() < 10, "paging never ends: {seen:?}");
    }
    assert_eq!(seen, made, "every charge once, newest first");

    // Outside the bounds: nothing.
    let later = (to.parse::<u64>()? + 1).to_string();
    let earlier = (from.parse::<u64>()? - 1).to_string();
    for bounds in [
        [("created[gte]", later.as_str()), ("limit", "100")],
        [("created[lte]", earlier.as_str()), ("limit", "100")],
        [("created[gt]", to.as_str()), ("limit", "100")],
        [("created[lt]", from.as_str()), ("limit", "100")],
    ] {
        let (status, page) = sandbox.get_v1("/v1/charges", &bounds).await?;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(ids(&page), Vec::<String>::new(), "{bounds:?}");
        assert_eq!(page["has_more"], false);
    }

    for (query, code, param) in [
        (
            &[("starting_after", "ch_doesnotexist")][..],
            "resource_missing",
            "starting_after",
        ),
        (
            &[("created[gte]", "soon")],
            "parameter_invalid_integer",
            "created[gte]",
        ),
        (&[("limit", "0")], "parameter_invalid_integer", "limit"),
        (
            &[("ending_before", "ch_1")],
            "parameter_unknown",
            "ending_before",
        ),
    ] {
        let (status, body) = sandbox.get_v1("/v1/charges", query).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query:?}: {body}");
        assert_eq!(body["error"]["code"], code, "{query:?}");
        assert_eq!(body["error"]["param"], param, "{query:?}");
    }
    let unauthenticated = sandbox
        .client
        .get(sandbox.url("/v1/charges"))
        .send()
        .await?;
    assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);
    Ok(())
}

/// The index lags like Stripe's: a charge searched for at once is not found,
/// and is found once the lag has passed.
#[tokio::test]
async fn search_finds_a_charge_by_metadata_only_after_the_lag() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let (status, config) =
        body_json(sandbox.set_config(json!({"search_lag_ms": 1000})).await?).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(config["search_lag_ms"], 1000);
    let other = sandbox
        .paid_charge(&[("metadata[payments_charge_id]", "ch_other")])
        .await?;
    let wanted = sandbox
        .paid_charge(&[
            ("metadata[payments_charge_id]", "ch_wanted"),
            ("metadata[order_id]", "9"),
        ])
        .await?;

    assert!(
        sandbox
            .search_metadata("payments_charge_id", "ch_wanted")
            .await?
            .is_empty(),
        "visible before the lag"
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        let found = sandbox
            .search_metadata("payments_charge_id", "ch_wanted")
            .await?;
        if !found.is_empty() || Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(found, std::slice::from_ref(&wanted));
    assert_eq!(
        sandbox
            .search_metadata("payments_charge_id", "ch_other")
            .await?,
        [other]
    );
    assert!(
        sandbox
            .search_metadata("payments_charge_id", "ch_none")
            .await?
            .is_empty()
    );

    // Double quotes work too, and the answer is the whole charge.
    let (status, body) = sandbox
        .get_v1(
            "/v1/charges/search",
            &[("query", r#"metadata["payments_charge_id"]:"ch_wanted""#)],
        )
        .await?;
    assert_eq!(status, StatusCode::OK);
    let charge = &body["data"][0];
    assert_eq!(charge["id"], wanted.as_str());
    assert_eq!(charge["object"], "charge");
    assert_eq!(charge["amount"], 1000);
    assert_eq!(
        charge["metadata"],
        json!({"order_id": "9", "payments_charge_id": "ch_wanted"})
    );
    Ok(())
}

#[tokio::test]
async fn unsupported_search_queries_are_400() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    for query in [
        "status:'succeeded'",
        "metadata['k']:'v' AND amount>100",
        "metadata[k]:v",
    ] {
        let (status, body) = sandbox
            .get_v1("/v1/charges/search", &[("query", query)])
            .await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "query");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("metadata['KEY']:'VALUE'")),
            "{body}"
        );
    }
    let (status, body) = sandbox.get_v1("/v1/charges/search", &[]).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "parameter_missing");
    let unauthenticated = sandbox
        .client
        .get(sandbox.query_url("/v1/charges/search", &[("query", "metadata['k']:'v'")])?)
        .send()
        .await?;
    assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);
    Ok(())
}

#[tokio::test]
async fn stats_count_concurrent_requests() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        latency_ms: 500,
        ..SandboxConfig::default()
    })
    .await?;
    let form = charge_form("tok_visa");
    let keys: Vec<String> = (0..20).map(|i| format!("key-{i}")).collect();
    let requests = keys.iter().map(|key| {
        sandbox
            .charge_request(&sandbox.client, &form, Some(key))
            .send()
    });
    for response in futures_join_all(requests).await {
        assert_eq!(response?.status(), StatusCode::OK);
    }
    let stats = sandbox.stats().await?;
    assert_eq!(stats["requests"], 20);
    assert_eq!(stats["max_in_flight"], 20);
    assert_eq!(stats["in_flight"], 0);
    assert_eq!(stats["charges"], 20);
    Ok(())
}

#[tokio::test]
async fn config_is_read_replaced_and_validated() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        latency_ms: 5,
        ..SandboxConfig::default()
    })
    .await?;
    let current = sandbox.get_json("/_sandbox/config").await?;
    assert_eq!(
        current,
        json!({"latency_ms": 5, "error_rate": 0.0, "rate_limit_rate": 0.0, "hang": false,
               "drop_after_charge": false, "key_retention_secs": 86400, "search_lag_ms": 0,
               "refund_status": "succeeded", "answer_amount_override": null,
               "answer_currency_override": null, "nulls_in_refund_lists": false,
               "secret_key": null, "restricted_key": null, "hold_expiry_seconds": 604800,
               "send_capture_before": true, "webhook_url": null,
               "webhook_secret": payments_sandbox::DEFAULT_WEBHOOK_SECRET,
               "webhook_duplicate": false, "webhook_shuffle_ms": 0, "webhook_delay_ms": 0,
               "webhook_drop_rate": 0.0, "webhook_redeliver_ms": 500,
               "webhook_max_attempts": 8})
    );

    for bad in [
        json!({"error_rate": 2.0}),
        json!({"error_rate": -0.5}),
        json!({"rate_limit_rate": 1.5}),
        json!({"secret_key": " "}),
        json!({"latncy_ms": 1}),
        json!({"hold_expiry_seconds": -1}),
        json!({"hold_expiry_seconds": "soon"}),
        json!({"hold_expiry_seconds": 4_000_000_000_u64}),
        json!({"send_capture_before": "no"}),
    ] {
        let (status, body) = body_json(sandbox.set_config(bad.clone()).await?).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    let not_json = sandbox
        .client
        .post(sandbox.url("/_sandbox/config"))
        .body("latency=5")
        .send()
        .await?;
    assert_eq!(not_json.status(), StatusCode::BAD_REQUEST);

    // A partial config replaces the whole config; missing fields are defaults.
    let (status, body) = body_json(sandbox.set_config(json!({"error_rate": 0.25})).await?).await?;
    assert_eq!(status, StatusCode::OK);
    let expected = json!({"latency_ms": 0, "error_rate": 0.25, "rate_limit_rate": 0.0,
               "hang": false, "drop_after_charge": false, "key_retention_secs": 86400,
               "search_lag_ms": 0, "refund_status": "succeeded", "answer_amount_override": null,
               "answer_currency_override": null, "nulls_in_refund_lists": false,
               "secret_key": null, "restricted_key": null, "hold_expiry_seconds": 604800,
               "send_capture_before": true, "webhook_url": null,
               "webhook_secret": payments_sandbox::DEFAULT_WEBHOOK_SECRET,
               "webhook_duplicate": false, "webhook_shuffle_ms": 0, "webhook_delay_ms": 0,
               "webhook_drop_rate": 0.0, "webhook_redeliver_ms": 500,
               "webhook_max_attempts": 8});
    assert_eq!(body, expected);
    assert_eq!(sandbox.get_json("/_sandbox/config").await?, expected);
    Ok(())
}

#[tokio::test]
async fn invalid_config_is_refused_at_start() {
    let started = SandboxHandle::start(SandboxConfig {
        error_rate: 2.0,
        ..SandboxConfig::default()
    })
    .await;
    assert!(started.is_err_and(|error| error.kind() == std::io::ErrorKind::InvalidInput));
}

#[tokio::test]
async fn reset_forgets_charges_refunds_keys_and_counters_but_not_the_config() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let form = charge_form("tok_visa");
    let (_, charge) = body_json(sandbox.post_charge(&form, Some("before-reset")).await?).await?;
    let charge_id = charge["id"].as_str().ok_or("no charge id")?;
    let refund = sandbox
        .post_refund(&[("charge", charge_id)], Some("refund-before-reset"))
        .await?;
    assert_eq!(refund.status(), StatusCode::OK);
    assert_eq!(sandbox.stats().await?["refunds"], 1);
    sandbox
        .set_config(json!({"latency_ms": 1}))
        .await?
        .error_for_status()?;

    let reset = sandbox.reset().await?;
    assert_eq!(reset.status(), StatusCode::OK);
    assert!(sandbox.charges().await?.is_empty());
    assert!(sandbox.refunds().await?.is_empty());
    let stats = sandbox.stats().await?;
    assert_eq!(
        stats,
        json!({"requests": 0, "in_flight": 0, "max_in_flight": 0, "charges": 0, "refunds": 0,
               "captures": 0, "disputes": 0})
    );
    assert_eq!(sandbox.get_json("/_sandbox/config").await?["latency_ms"], 1);

    let again = sandbox.post_charge(&form, Some("before-reset")).await?;
    assert_eq!(again.status(), StatusCode::OK);
    assert!(!is_replay(&again));
    assert_eq!(sandbox.charges().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn health_and_unknown_routes() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    assert_eq!(sandbox.get_json("/healthz").await?, json!({"status": "ok"}));

    let (status, body) = body_json(
        sandbox
            .client
            .get(sandbox.url("/v1/customers"))
            .send()
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let (status, body) = body_json(
        sandbox
            .client
            .delete(sandbox.url("/v1/charges"))
            .send()
            .await?,
    )
    .await?;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    Ok(())
}

#[tokio::test]
async fn dropping_the_handle_stops_the_server() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let addr = sandbox.handle.addr();
    drop(sandbox);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        if Instant::now() > deadline {
            return Err("still accepting connections".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test]
async fn binary_prints_its_address_serves_and_stops_on_sigterm() -> TestResult {
    let mut child = Command::new(env!("CARGO_BIN_EXE_payments-sandbox"))
        .args(["--listen", "127.0.0.1:0", "--latency-ms", "1"])
        .args(["--webhook-url", "http://127.0.0.1:9/webhooks"])
        .env("SANDBOX_SEARCH_LAG_MS", "250")
        .env("SANDBOX_WEBHOOK_SECRET", "whsec_from_the_environment_0123")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let line = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        Ok(line)
    })
    .await??;
    let url = line
        .trim_end()
        .strip_prefix("payments-sandbox listening on ")
        .ok_or_else(|| format!("unexpected first line {line:?}"))?
        .to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let client = reqwest::Client::builder().no_proxy().build()?;
    let config: Value = client
        .get(format!("{url}/_sandbox/config"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(config["latency_ms"], 1);
    assert_eq!(config["search_lag_ms"], 250);
    assert_eq!(config["webhook_url"], "http://127.0.0.1:9/webhooks");
    assert_eq!(config["webhook_secret"], "whsec_from_the_environment_0123");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            child.kill()?;
            return Err("the sandbox did not stop on SIGTERM".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
    Ok(())
}

#[tokio::test]
async fn binary_refuses_an_invalid_error_rate() -> TestResult {
    let output = Command::new(env!("CARGO_BIN_EXE_payments-sandbox"))
        .args(["--listen", "127.0.0.1:0", "--error-rate", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()?;
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    Ok(())
}

#[tokio::test]
async fn binary_refuses_a_bad_webhook_url_or_a_short_secret() -> TestResult {
    for args in [
        ["--webhook-url", "ftp://127.0.0.1/webhooks"],
        ["--webhook-secret", "whsec_short"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_payments-sandbox"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "off")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()?;
        assert!(!output.status.success(), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&args[0][2..].replace('-', "_")), "{stderr}");
    }
    Ok(())
}

/// Runs the futures concurrently on this task and collects their outputs in
/// order (a small stand-in for `futures::future::join_all`).
async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        match handle.await {
            Ok(output) => outputs.push(output),
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
    outputs
}
