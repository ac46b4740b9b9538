//! Holds over real HTTP on loopback, as in Stripe's legacy Charges API: a
//! charge made with `capture=false`, captured later (whole or in part, the
//! rest released) through `POST /v1/charges/{id}/capture`, released by a
//! refund, or lapsed at its `capture_before`. Each test starts its own
//! [`SandboxHandle`](payments_sandbox::SandboxHandle) on a random port.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use payments_sandbox::SandboxConfig;
use reqwest::StatusCode;
use serde_json::{Value, json};

mod common;

use common::{Answer, Error, Sandbox, TestResult, answer};

/// A 1000 gbp charge's form, a hold unless `capture` is `true`.
fn charge_form<'a>(capture: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut form = vec![
        ("amount", "1000"),
        ("currency", "gbp"),
        ("source", "tok_visa"),
        ("capture", capture),
    ];
    form.extend_from_slice(extra);
    form
}

impl Sandbox {
    fn post_request(
        &self,
        path: &str,
        form: &[(&str, &str)],
        key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let request = self
            .client
            .post(self.url(path))
            .bearer_auth("sk_test_sandbox")
            .form(form);
        match key {
            Some(key) => request.header("Idempotency-Key", key),
            None => request,
        }
    }

    async fn post(
        &self,
        path: &str,
        form: &[(&str, &str)],
        key: Option<&str>,
    ) -> Result<Answer, reqwest::Error> {
        answer(self.post_request(path, form, key).send().await?).await
    }

    async fn charge(&self, form: &[(&str, &str)]) -> Result<Answer, reqwest::Error> {
        self.post("/v1/charges", form, None).await
    }

    /// A 1000 gbp hold on a card that is declined; the failed charge's id.
    async fn declined_hold(&self) -> Result<String, Error> {
        let declined = self
            .charge(&[
                ("amount", "1000"),
                ("currency", "gbp"),
                ("source", "tok_chargeDeclined"),
                ("capture", "false"),
            ])
            .await?;
        assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
        Ok(declined.json["error"]["charge"]
            .as_str()
            .ok_or("no charge")?
            .to_owned())
    }

    /// A 1000 gbp hold, with `extra` parameters; the charge.
    async fn hold(&self, extra: &[(&str, &str)]) -> Result<Value, Error> {
        let held = self.charge(&charge_form("false", extra)).await?;
        assert_eq!(held.status, StatusCode::OK, "{}", held.json);
        assert_eq!(held.json["captured"], false, "{}", held.json);
        Ok(held.json)
    }

    async fn capture(
        &self,
        charge: &str,
        form: &[(&str, &str)],
        key: Option<&str>,
    ) -> Result<Answer, reqwest::Error> {
        self.post(&format!("/v1/charges/{charge}/capture"), form, key)
            .await
    }

    async fn refund(
        &self,
        form: &[(&str, &str)],
        key: Option<&str>,
    ) -> Result<Answer, reqwest::Error> {
        self.post("/v1/refunds", form, key).await
    }

    /// `GET` a `/v1` path with an API key.
    async fn get_v1(&self, path: &str) -> Result<Answer, reqwest::Error> {
        answer(
            self.client
                .get(self.url(path))
                .bearer_auth("sk_test_sandbox")
                .send()
                .await?,
        )
        .await
    }

    /// `GET /v1/charges/{id}`: the charge as it stands.
    async fn retrieve(&self, charge: &str) -> Result<Value, Error> {
        let got = self.get_v1(&format!("/v1/charges/{charge}")).await?;
        assert_eq!(got.status, StatusCode::OK, "{}", got.json);
        Ok(got.json)
    }

    /// [`money`] of the charge as `GET /v1/charges/{id}` reads it.
    async fn money_of(&self, charge: &str) -> Result<(Value, Value, Value, Value), Error> {
        Ok(money(&self.retrieve(charge).await?))
    }

    /// A `/_sandbox` list's `data`.
    async fn sandbox_list(&self, path: &str) -> Result<Vec<Value>, reqwest::Error> {
        let list: Value = self
            .client
            .get(self.url(path))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(list["data"].as_array().cloned().unwrap_or_default())
    }

    async fn captures(&self) -> Result<Vec<Value>, reqwest::Error> {
        self.sandbox_list("/_sandbox/captures").await
    }

    /// `captured`, `amount_captured`, `amount_refunded` of the
    /// `GET /_sandbox/charges` line of `charge`.
    async fn line_money(&self, charge: &str) -> Result<(Value, Value, Value), Error> {
        let lines = self.sandbox_list("/_sandbox/charges").await?;
        let line = lines
            .into_iter()
            .find(|line| line["id"] == charge)
            .ok_or_else(|| format!("no line for {charge}"))?;
        Ok((
            line["captured"].clone(),
            line["amount_captured"].clone(),
            line["amount_refunded"].clone(),
        ))
    }

    async fn stats(&self) -> Result<Value, reqwest::Error> {
        self.client
            .get(self.url("/_sandbox/stats"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    }

    async fn set_config(&self, config: Value) -> Result<(), Error> {
        let set = self
            .client
            .post(self.url("/_sandbox/config"))
            .json(&config)
            .send()
            .await?;
        assert_eq!(set.status(), StatusCode::OK, "{config}");
        Ok(())
    }
}

fn id_of(charge: &Value) -> Result<String, String> {
    charge["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no id in {charge}"))
}

/// `captured`, `amount_captured`, `amount_refunded`, `refunded`.
fn money(charge: &Value) -> (Value, Value, Value, Value) {
    (
        charge["captured"].clone(),
        charge["amount_captured"].clone(),
        charge["amount_refunded"].clone(),
        charge["refunded"].clone(),
    )
}

fn state(
    captured: bool,
    amount_captured: u64,
    amount_refunded: u64,
    refunded: bool,
) -> (Value, Value, Value, Value) {
    (
        json!(captured),
        json!(amount_captured),
        json!(amount_refunded),
        json!(refunded),
    )
}

/// Waits until the sandbox's clock is past `capture_before` (Unix seconds).
async fn wait_past(capture_before: u64) {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_millis())
        .unwrap_or_default();
    let due_ms = u128::from(capture_before) * 1000 + 50;
    if let Some(left) = due_ms.checked_sub(now_ms) {
        tokio::time::sleep(Duration::from_millis(
            u64::try_from(left).unwrap_or(u64::MAX),
        ))
        .await;
    }
}

#[tokio::test]
async fn capture_false_makes_a_hold_that_says_until_when() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let hold = sandbox.hold(&[("metadata[order]", "7")]).await?;
    assert_eq!(hold["status"], "succeeded");
    assert_eq!(hold["paid"], true);
    assert_eq!(money(&hold), state(false, 0, 0, false));
    assert_eq!(hold["payment_method_details"]["type"], "card");
    let created = hold["created"].as_u64().ok_or("no created")?;
    assert_eq!(
        hold["payment_method_details"]["card"]["capture_before"],
        json!(created + 604_800)
    );
    let id = id_of(&hold)?;
    assert_eq!(sandbox.retrieve(&id).await?, hold);
    assert_eq!(
        sandbox.line_money(&id).await?,
        (json!(false), json!(0), json!(0))
    );

    // capture=true is the default, said or not.
    for capture in ["true", ""] {
        let charged = sandbox.charge(&charge_form(capture, &[])).await?;
        assert_eq!(charged.status, StatusCode::OK, "{}", charged.json);
        assert_eq!(money(&charged.json), state(true, 1000, 0, false));
        assert_eq!(
            charged.json["payment_method_details"],
            json!({"type": "card", "card": {}})
        );
    }

    // A declined hold holds nothing.
    let declined_id = sandbox.declined_hold().await?;
    let declined = sandbox.retrieve(&declined_id).await?;
    assert_eq!(money(&declined), state(false, 0, 0, false));
    assert_eq!(declined["payment_method_details"]["card"], json!({}));

    // Anything but true or false is refused, and charges nothing.
    let before = sandbox.sandbox_list("/_sandbox/charges").await?.len();
    for bad in ["maybe", "1", "FALSE"] {
        let refused = sandbox.charge(&charge_form(bad, &[])).await?;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(refused.json["error"]["type"], "invalid_request_error");
        assert_eq!(refused.json["error"]["param"], "capture");
    }
    assert_eq!(
        sandbox.sandbox_list("/_sandbox/charges").await?.len(),
        before
    );

    // The hold's length is the config's when it is made.
    sandbox
        .set_config(json!({"hold_expiry_seconds": 60}))
        .await?;
    let short = sandbox.hold(&[]).await?;
    let created = short["created"].as_u64().ok_or("no created")?;
    assert_eq!(
        short["payment_method_details"]["card"]["capture_before"],
        json!(created + 60)
    );
    assert_eq!(
        sandbox.retrieve(&id).await?["payment_method_details"],
        hold["payment_method_details"]
    );
    Ok(())
}

#[tokio::test]
async fn a_full_capture_captures_the_whole_hold() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let hold = sandbox.hold(&[]).await?;
    let id = id_of(&hold)?;
    let captured = sandbox.capture(&id, &[], Some("capture-1")).await?;
    assert_eq!(captured.status, StatusCode::OK, "{}", captured.json);
    assert!(!captured.replayed);
    assert_eq!(captured.json["id"], hold["id"]);
    assert_eq!(captured.json["object"], "charge");
    assert_eq!(money(&captured.json), state(true, 1000, 0, false));
    assert_eq!(
        captured.json["payment_method_details"],
        hold["payment_method_details"]
    );
    assert_eq!(sandbox.retrieve(&id).await?, captured.json);

    let captures = sandbox.captures().await?;
    assert_eq!(captures.len(), 1);
    assert_eq!(captures[0]["charge"], hold["id"]);
    assert_eq!(captures[0]["amount"], 1000);
    assert_eq!(captures[0]["idempotency_key"], "capture-1");
    assert!(
        captures[0]["created"]
            .as_u64()
            .is_some_and(|created| created >= hold["created"].as_u64().unwrap_or(u64::MAX))
    );
    assert_eq!(
        sandbox.line_money(&id).await?,
        (json!(true), json!(1000), json!(0))
    );
    let stats = sandbox.stats().await?;
    assert_eq!(
        (&stats["requests"], &stats["charges"], &stats["captures"]),
        (&json!(2), &json!(1), &json!(1))
    );
    Ok(())
}

#[tokio::test]
async fn a_partial_capture_releases_the_rest_and_refunds_take_only_what_was_captured() -> TestResult
{
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let id = id_of(&sandbox.hold(&[]).await?)?;
    let captured = sandbox
        .capture(&id, &[("amount", "600")], Some("partial"))
        .await?;
    assert_eq!(captured.status, StatusCode::OK, "{}", captured.json);
    assert_eq!(money(&captured.json), state(true, 600, 400, false));
    // The release is no refund.
    let refunds = sandbox.get_v1(&format!("/v1/refunds?charge={id}")).await?;
    assert_eq!(refunds.json["data"], json!([]));
    assert!(sandbox.sandbox_list("/_sandbox/refunds").await?.is_empty());

    let too_much = sandbox
        .refund(&[("charge", &id), ("amount", "601")], None)
        .await?;
    assert_eq!(too_much.status, StatusCode::BAD_REQUEST);
    assert_eq!(too_much.code(), "amount_too_large");
    assert_eq!(too_much.json["error"]["param"], "amount");
    let some = sandbox
        .refund(&[("charge", &id), ("amount", "250")], None)
        .await?;
    assert_eq!(
        (some.status, &some.json["amount"]),
        (StatusCode::OK, &json!(250))
    );
    // No amount: what is left of what was captured.
    let rest = sandbox.refund(&[("charge", &id)], None).await?;
    assert_eq!(
        (rest.status, &rest.json["amount"]),
        (StatusCode::OK, &json!(350))
    );
    assert_eq!(sandbox.money_of(&id).await?, state(true, 600, 1000, true));
    let again = sandbox.refund(&[("charge", &id)], None).await?;
    assert_eq!(again.code(), "charge_already_refunded");
    Ok(())
}

#[tokio::test]
async fn a_second_capture_is_refused_and_the_same_key_replays_the_first() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let id = id_of(&sandbox.hold(&[]).await?)?;
    let other = id_of(&sandbox.hold(&[]).await?)?;
    let form = [("amount", "600")];
    let first = sandbox.capture(&id, &form, Some("key-a")).await?;
    assert_eq!(first.status, StatusCode::OK, "{}", first.json);

    let second = sandbox.capture(&id, &[], Some("key-b")).await?;
    assert_eq!(second.status, StatusCode::BAD_REQUEST);
    assert_eq!(second.json["error"]["type"], "invalid_request_error");
    assert_eq!(second.code(), "charge_already_captured");
    // A refusal is a final answer, stored under its key.
    let second_again = sandbox.capture(&id, &[], Some("key-b")).await?;
    assert!(second_again.replayed);
    assert_eq!(second_again.bytes, second.bytes);

    let replay = sandbox.capture(&id, &form, Some("key-a")).await?;
    assert_eq!(
        (replay.status, replay.replayed, &replay.bytes),
        (StatusCode::OK, true, &first.bytes)
    );
    // The key with other parameters, or on another charge's capture.
    for (charge, form) in [(&id, &[("amount", "700")][..]), (&other, &form[..])] {
        let mismatch = sandbox.capture(charge, form, Some("key-a")).await?;
        assert_eq!(mismatch.status, StatusCode::BAD_REQUEST);
        assert_eq!(mismatch.json["error"]["type"], "idempotency_error");
    }
    let captures = sandbox.captures().await?;
    assert_eq!(captures.len(), 1);
    assert_eq!(captures[0]["idempotency_key"], "key-a");
    assert_eq!(sandbox.money_of(&other).await?, state(false, 0, 0, false));
    Ok(())
}

#[tokio::test]
async fn of_twenty_concurrent_captures_exactly_one_is_made() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        // They all wait, then race for the hold.
        latency_ms: 100,
        ..SandboxConfig::default()
    })
    .await?;
    let id = id_of(&sandbox.hold(&[]).await?)?;
    let keys: Vec<String> = (0..20).map(|i| format!("capture-{i}")).collect();
    let path = format!("/v1/charges/{id}/capture");
    let requests: Vec<_> = keys
        .iter()
        .map(|key| sandbox.post_request(&path, &[], Some(key)).send())
        .map(tokio::spawn)
        .collect();
    let mut made = 0;
    let mut refused = 0;
    for request in requests {
        let answered = answer(request.await??).await?;
        match answered.status {
            StatusCode::OK => made += 1,
            StatusCode::BAD_REQUEST if answered.code() == "charge_already_captured" => {
                refused += 1;
            }
            status => return Err(format!("{status}: {}", answered.json).into()),
        }
    }
    assert_eq!((made, refused), (1, 19));
    assert_eq!(sandbox.captures().await?.len(), 1);
    assert_eq!(sandbox.money_of(&id).await?, state(true, 1000, 0, false));
    let stats = sandbox.stats().await?;
    assert_eq!(
        (&stats["requests"], &stats["captures"]),
        (&json!(21), &json!(1))
    );
    Ok(())
}

#[tokio::test]
async fn a_refund_releases_a_hold_whole_and_it_is_then_never_captured() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let id = id_of(&sandbox.hold(&[]).await?)?;
    let partial = sandbox
        .refund(&[("charge", &id), ("amount", "500")], Some("part"))
        .await?;
    assert_eq!(partial.status, StatusCode::BAD_REQUEST);
    assert_eq!(partial.json["error"]["type"], "invalid_request_error");
    assert_eq!(partial.json["error"]["param"], "amount");
    assert!(
        partial.json["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("whole")),
        "{}",
        partial.json
    );
    assert_eq!(sandbox.money_of(&id).await?, state(false, 0, 0, false));

    // Released at once, whatever the refunds' configured status.
    sandbox
        .set_config(json!({"refund_status": "pending"}))
        .await?;
    let released = sandbox
        .refund(
            &[
                ("charge", &id),
                ("amount", "1000"),
                ("metadata[payments_refund_id]", "rf_1"),
            ],
            Some("release"),
        )
        .await?;
    assert_eq!(released.status, StatusCode::OK, "{}", released.json);
    assert_eq!(released.json["object"], "refund");
    assert_eq!(released.json["status"], "succeeded");
    assert_eq!(released.json["amount"], 1000);
    assert_eq!(released.json["charge"], json!(id));
    assert_eq!(
        released.json["metadata"],
        json!({"payments_refund_id": "rf_1"})
    );
    let listed = sandbox.get_v1(&format!("/v1/refunds?charge={id}")).await?;
    assert_eq!(listed.json["data"], json!([released.json]));
    assert_eq!(sandbox.money_of(&id).await?, state(false, 0, 1000, true));

    let capture = sandbox.capture(&id, &[], Some("too-late")).await?;
    assert_eq!(capture.status, StatusCode::BAD_REQUEST);
    assert_eq!(capture.code(), "charge_already_refunded");
    let again = sandbox.refund(&[("charge", &id)], None).await?;
    assert_eq!(again.code(), "charge_already_refunded");
    assert!(sandbox.captures().await?.is_empty());
    assert_eq!(sandbox.sandbox_list("/_sandbox/refunds").await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn captures_are_refused_with_stripes_codes_and_change_nothing() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let unknown = sandbox.capture("ch_nope", &[], Some("unknown")).await?;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json["error"]["type"], "invalid_request_error");
    assert_eq!(unknown.code(), "resource_missing");
    assert_eq!(unknown.json["error"]["param"], "id");
    let replayed = sandbox.capture("ch_nope", &[], Some("unknown")).await?;
    assert_eq!((replayed.replayed, &replayed.bytes), (true, &unknown.bytes));

    let declined_id = sandbox.declined_hold().await?;
    let failed = sandbox.capture(&declined_id, &[], None).await?;
    assert_eq!(failed.status, StatusCode::BAD_REQUEST);
    assert_eq!(failed.code(), "charge_not_capturable");
    assert_eq!(
        failed.json["error"]["message"],
        "This charge failed and cannot be captured"
    );

    let charged = sandbox.charge(&charge_form("true", &[])).await?;
    let captured_at_once = sandbox.capture(&id_of(&charged.json)?, &[], None).await?;
    assert_eq!(captured_at_once.code(), "charge_already_captured");

    let id = id_of(&sandbox.hold(&[]).await?)?;
    for (form, code, param) in [
        (&[("amount", "1001")][..], "amount_too_large", "amount"),
        (
            &[("amount", "0")][..],
            "parameter_invalid_integer",
            "amount",
        ),
        (
            &[("amount", "ten")][..],
            "parameter_invalid_integer",
            "amount",
        ),
        (&[("currency", "gbp")][..], "parameter_unknown", "currency"),
        (
            &[("metadata[a]", "b")][..],
            "parameter_unknown",
            "metadata[a]",
        ),
    ] {
        let refused = sandbox.capture(&id, form, None).await?;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{form:?}");
        assert_eq!(refused.json["error"]["type"], "invalid_request_error");
        assert_eq!(
            (refused.code(), &refused.json["error"]["param"]),
            (&json!(code), &json!(param))
        );
    }
    let unauthenticated = sandbox
        .client
        .post(sandbox.url(&format!("/v1/charges/{id}/capture")))
        .send()
        .await?;
    assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);
    let get = sandbox.get_v1(&format!("/v1/charges/{id}/capture")).await?;
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
    // A path that does not decode gets Stripe's envelope too.
    for bad in [
        sandbox.post("/v1/charges/%FF/capture", &[], None).await?,
        sandbox.get_v1("/v1/charges/%FF").await?,
    ] {
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            bad.json["error"]["type"], "invalid_request_error",
            "{bad:?}"
        );
        assert_eq!(bad.json["error"]["param"], "id");
    }

    // None of that touched the hold.
    assert!(sandbox.captures().await?.is_empty());
    assert_eq!(sandbox.money_of(&id).await?, state(false, 0, 0, false));
    let captured = sandbox.capture(&id, &[("amount", "1000")], None).await?;
    assert_eq!(money(&captured.json), state(true, 1000, 0, false));
    Ok(())
}

#[tokio::test]
async fn a_hold_past_its_capture_before_is_released() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        hold_expiry_seconds: 1,
        ..SandboxConfig::default()
    })
    .await?;
    let hold = sandbox.hold(&[("metadata[order]", "lapsed")]).await?;
    let id = id_of(&hold)?;
    let created = hold["created"].as_u64().ok_or("no created")?;
    let capture_before = hold["payment_method_details"]["card"]["capture_before"]
        .as_u64()
        .ok_or("no capture_before")?;
    assert_eq!(capture_before, created + 1);
    wait_past(capture_before).await;

    let capture = sandbox.capture(&id, &[], Some("late")).await?;
    assert_eq!(capture.status, StatusCode::BAD_REQUEST);
    assert_eq!(capture.json["error"]["type"], "invalid_request_error");
    assert_eq!(capture.code(), "charge_expired_for_capture");

    // Every read shows it released.
    let released = state(false, 0, 1000, true);
    let retrieved = sandbox.retrieve(&id).await?;
    assert_eq!(money(&retrieved), released);
    assert_eq!(retrieved["status"], "succeeded");
    let listed = sandbox.get_v1("/v1/charges").await?;
    assert_eq!(listed.json["data"], json!([retrieved]));
    let query = "metadata['order']:'lapsed'";
    let found = sandbox
        .get_v1(&format!(
            "/v1/charges/search?{}",
            serde_urlencoded::to_string([("query", query)])?
        ))
        .await?;
    assert_eq!(found.json["data"], json!([retrieved]));
    assert_eq!(
        sandbox.line_money(&id).await?,
        (json!(false), json!(0), json!(1000))
    );

    let refund = sandbox.refund(&[("charge", &id)], None).await?;
    assert_eq!(refund.status, StatusCode::BAD_REQUEST);
    assert_eq!(refund.code(), "charge_already_refunded");
    assert!(sandbox.captures().await?.is_empty());
    assert!(sandbox.sandbox_list("/_sandbox/refunds").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn send_capture_before_false_leaves_it_out_and_the_hold_still_lapses() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        send_capture_before: false,
        ..SandboxConfig::default()
    })
    .await?;
    let hold = sandbox.hold(&[]).await?;
    assert_eq!(
        hold["payment_method_details"],
        json!({"type": "card", "card": {}})
    );
    let id = id_of(&hold)?;
    assert_eq!(
        sandbox.retrieve(&id).await?["payment_method_details"],
        json!({"type": "card", "card": {}})
    );
    let captured = sandbox.capture(&id, &[], None).await?;
    assert_eq!(captured.status, StatusCode::OK, "{}", captured.json);
    assert_eq!(captured.json["payment_method_details"]["card"], json!({}));

    // Unsaid, the deadline is still kept: a hold of 0 s lapses at once.
    sandbox
        .set_config(json!({"send_capture_before": false, "hold_expiry_seconds": 0}))
        .await?;
    let lapsed = id_of(&sandbox.hold(&[]).await?)?;
    let capture = sandbox.capture(&lapsed, &[], None).await?;
    assert_eq!(capture.code(), "charge_expired_for_capture");
    assert_eq!(
        sandbox.money_of(&lapsed).await?,
        state(false, 0, 1000, true)
    );
    Ok(())
}

#[tokio::test]
async fn a_dropped_capture_is_made_and_its_retry_replays_it() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let id = id_of(&sandbox.hold(&[]).await?)?;
    sandbox
        .set_config(json!({"drop_after_charge": true}))
        .await?;
    let form = [("amount", "700")];
    let error = match sandbox.capture(&id, &form, Some("dropped")).await {
        Ok(answered) => return Err(format!("got an answer: {answered:?}").into()),
        Err(error) => error,
    };
    assert!(!error.is_timeout(), "{error}");
    assert!(error.status().is_none());

    // Made, though its answer was lost.
    let captures = sandbox.captures().await?;
    assert_eq!(captures.len(), 1);
    assert_eq!(
        (&captures[0]["amount"], &captures[0]["idempotency_key"]),
        (&json!(700), &json!("dropped"))
    );
    assert_eq!(sandbox.money_of(&id).await?, state(true, 700, 300, false));

    // The fault is still on: a replay captures nothing, so it is answered.
    let retry = sandbox.capture(&id, &form, Some("dropped")).await?;
    assert_eq!((retry.status, retry.replayed), (StatusCode::OK, true));
    assert_eq!(money(&retry.json), state(true, 700, 300, false));
    // So is a refused capture, which records nothing.
    let refused = sandbox.capture(&id, &[], Some("another")).await?;
    assert_eq!(refused.code(), "charge_already_captured");
    assert_eq!(sandbox.captures().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn errors_rate_limits_and_hangs_apply_to_captures_and_capture_nothing() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let id = id_of(&sandbox.hold(&[]).await?)?;

    // error_rate: a 500, saved under the key and replayed.
    sandbox.set_config(json!({"error_rate": 1.0})).await?;
    let failed = sandbox.capture(&id, &[], Some("error")).await?;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.json["error"]["type"], "api_error");
    sandbox.set_config(json!({})).await?;
    let replayed = sandbox.capture(&id, &[], Some("error")).await?;
    assert_eq!(
        (replayed.status, replayed.replayed),
        (StatusCode::INTERNAL_SERVER_ERROR, true)
    );

    // rate_limit_rate: a 429, nothing saved: the key is processed later.
    sandbox.set_config(json!({"rate_limit_rate": 1.0})).await?;
    let limited = sandbox.capture(&id, &[], Some("limited")).await?;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.code(), "rate_limit");

    // hang: no answer, nothing captured, the key released.
    sandbox.set_config(json!({"hang": true})).await?;
    let hung = sandbox
        .post_request(&format!("/v1/charges/{id}/capture"), &[], Some("hung"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(hung.is_err_and(|error| error.is_timeout()));
    assert!(sandbox.captures().await?.is_empty());
    assert_eq!(sandbox.money_of(&id).await?, state(false, 0, 0, false));

    sandbox.set_config(json!({})).await?;
    let after_hang = sandbox.capture(&id, &[], Some("hung")).await?;
    assert_eq!(
        (after_hang.status, after_hang.replayed),
        (StatusCode::OK, false)
    );
    let after_limit = sandbox.capture(&id, &[], Some("limited")).await?;
    assert_eq!(after_limit.code(), "charge_already_captured");
    assert!(!after_limit.replayed);
    assert_eq!(sandbox.captures().await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_reset_forgets_captures() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let id = id_of(&sandbox.hold(&[]).await?)?;
    let captured = sandbox.capture(&id, &[], Some("before-reset")).await?;
    assert_eq!(captured.status, StatusCode::OK);
    let reset = sandbox.reset().await?;
    assert_eq!(reset.status(), StatusCode::OK);
    assert!(sandbox.captures().await?.is_empty());
    assert_eq!(sandbox.stats().await?["captures"], 0);
    let gone = sandbox.capture(&id, &[], Some("before-reset")).await?;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert!(!gone.replayed);
    Ok(())
}
