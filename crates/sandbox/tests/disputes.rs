//! What happens at the provider without the payments API asking, over real
//! HTTP on loopback: refunds made in the dashboard, refunds that fail days
//! after they succeeded, and disputes (an inquiry, a chargeback) through
//! their lifecycle, read through Stripe's `/v1/disputes`.

use payments_sandbox::SandboxConfig;
use reqwest::StatusCode;
use serde_json::{Value, json};

mod common;

use common::{Answer, Error, Sandbox, TestResult, answer};

impl Sandbox {
    /// A captured charge of `amount` gbp; its id.
    async fn paid(&self, amount: &str) -> Result<String, Error> {
        let form = [
            ("amount", amount),
            ("currency", "gbp"),
            ("source", "tok_visa"),
            ("metadata[order_id]", "42"),
        ];
        let made = self.form("/v1/charges", &form, None).await?;
        assert_eq!(made.status, StatusCode::OK, "{}", made.json);
        id(&made.json)
    }

    /// A hold (not captured) of `amount` gbp; its id.
    async fn hold(&self, amount: &str) -> Result<String, Error> {
        let form = [
            ("amount", amount),
            ("currency", "gbp"),
            ("source", "tok_visa"),
            ("capture", "false"),
        ];
        let made = self.form("/v1/charges", &form, None).await?;
        assert_eq!(made.status, StatusCode::OK, "{}", made.json);
        id(&made.json)
    }

    async fn charge_now(&self, id: &str) -> Result<Value, Error> {
        let read = self.get(&format!("/v1/charges/{id}")).await?;
        assert_eq!(read.status, StatusCode::OK, "{}", read.json);
        Ok(read.json)
    }

    async fn open_dispute(&self, charge: &str, body: Value) -> Result<Answer, reqwest::Error> {
        self.post_json(&format!("/_sandbox/charges/{charge}/disputes"), &body)
            .await
    }

    /// Moves the dispute; the answer must be 200.
    async fn move_dispute(&self, dispute: &str, body: Value) -> Result<Value, Error> {
        let moved = self
            .post_json(&format!("/_sandbox/disputes/{dispute}"), &body)
            .await?;
        assert_eq!(moved.status, StatusCode::OK, "{body}: {}", moved.json);
        Ok(moved.json)
    }
}

fn id(object: &Value) -> Result<String, Error> {
    Ok(object["id"]
        .as_str()
        .ok_or_else(|| format!("no id in {object}"))?
        .to_owned())
}

/// A dashboard refund takes the ledger's path: it counts against the
/// charge and is listed with the others, but carries no metadata and no
/// idempotency key, so the payments API cannot tell it for its own.
#[tokio::test]
async fn a_dashboard_refund_has_no_metadata_and_counts_against_the_charge() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge = sandbox.paid("1000").await?;
    let made = sandbox
        .post_json(
            &format!("/_sandbox/charges/{charge}/refunds"),
            &json!({"amount": 400, "reason": "duplicate"}),
        )
        .await?;
    assert_eq!(made.status, StatusCode::OK, "{}", made.json);
    let refund = &made.json;
    assert_eq!(
        (
            &refund["object"],
            &refund["amount"],
            &refund["charge"],
            &refund["status"],
            &refund["reason"],
            &refund["metadata"],
            &refund["currency"]
        ),
        (
            &json!("refund"),
            &json!(400),
            &json!(charge),
            &json!("succeeded"),
            &json!("duplicate"),
            &json!({}),
            &json!("gbp")
        )
    );
    assert!(
        refund["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("re_"))
    );
    assert_eq!(sandbox.charge_now(&charge).await?["amount_refunded"], 400);
    let listed = sandbox.get(&format!("/v1/refunds?charge={charge}")).await?;
    assert_eq!(listed.json["data"][0]["id"], refund["id"]);
    let records = sandbox.get("/_sandbox/refunds").await?;
    assert_eq!(records.json["data"][0]["idempotency_key"], Value::Null);

    // No body: all that is left; then nothing is left.
    let rest = sandbox
        .client
        .post(sandbox.url(&format!("/_sandbox/charges/{charge}/refunds")))
        .send()
        .await?;
    let rest = answer(rest).await?;
    assert_eq!(rest.json["amount"], 600, "{}", rest.json);
    let charged = sandbox.charge_now(&charge).await?;
    assert_eq!(
        (&charged["amount_refunded"], &charged["refunded"]),
        (&json!(1000), &json!(true))
    );
    let again = sandbox
        .post_json(&format!("/_sandbox/charges/{charge}/refunds"), &json!({}))
        .await?;
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    assert_eq!(again.code(), "charge_already_refunded");

    // A pending one, by its status; and the config's status by default.
    let other = sandbox.paid("500").await?;
    let pending = sandbox
        .post_json(
            &format!("/_sandbox/charges/{other}/refunds"),
            &json!({"amount": 100, "status": "pending"}),
        )
        .await?;
    assert_eq!(pending.json["status"], "pending");
    let set = sandbox
        .post_json("/_sandbox/config", &json!({"refund_status": "pending"}))
        .await?;
    assert_eq!(set.status, StatusCode::OK);
    let by_config = sandbox
        .post_json(
            &format!("/_sandbox/charges/{other}/refunds"),
            &json!({"amount": 100}),
        )
        .await?;
    assert_eq!(by_config.json["status"], "pending");
    assert_eq!(sandbox.charge_now(&other).await?["amount_refunded"], 200);

    // Refused as any refund is, in the sandbox's envelope.
    let too_large = sandbox
        .post_json(
            &format!("/_sandbox/charges/{other}/refunds"),
            &json!({"amount": 301}),
        )
        .await?;
    assert_eq!(too_large.status, StatusCode::BAD_REQUEST);
    assert_eq!(too_large.code(), "amount_too_large");
    let missing = sandbox
        .post_json("/_sandbox/charges/ch_nope/refunds", &json!({}))
        .await?;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.code(), "resource_missing");
    let declined = sandbox
        .form(
            "/v1/charges",
            &[
                ("amount", "100"),
                ("currency", "gbp"),
                ("source", "tok_chargeDeclined"),
            ],
            None,
        )
        .await?;
    let declined = declined.json["error"]["charge"]
        .as_str()
        .ok_or("no charge")?
        .to_owned();
    let failed = sandbox
        .post_json(&format!("/_sandbox/charges/{declined}/refunds"), &json!({}))
        .await?;
    assert_eq!(failed.code(), "charge_not_refundable");
    for bad in [
        json!({"amount": 0}),
        json!({"amount": -1}),
        json!({"reason": "because"}),
        json!({"status": "done"}),
        json!({"metadata": {"a": "b"}}),
    ] {
        let refused = sandbox
            .post_json(&format!("/_sandbox/charges/{other}/refunds"), &bad)
            .await?;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(refused.json["error"]["type"], "invalid_request_error");
    }
    assert_eq!(sandbox.charge_now(&other).await?["amount_refunded"], 200);
    Ok(())
}

/// A refund that succeeded can fail later (the card closed): the charge
/// gets its amount back, `refunded` false again; it cannot change again,
/// and a hold's release cannot fail at all.
#[tokio::test]
async fn a_succeeded_refund_that_fails_later_gives_its_amount_back() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge = sandbox.paid("1000").await?;
    let refund = sandbox
        .form("/v1/refunds", &[("charge", &charge)], Some("refund-1"))
        .await?;
    assert_eq!(refund.json["status"], "succeeded");
    let refund = id(&refund.json)?;
    assert_eq!(sandbox.charge_now(&charge).await?["refunded"], true);
    let failed = sandbox
        .post_json(
            &format!("/_sandbox/refunds/{refund}"),
            &json!({"status": "failed", "failure_reason": "expired_or_canceled_card"}),
        )
        .await?;
    assert_eq!(failed.status, StatusCode::OK, "{}", failed.json);
    assert_eq!(
        (&failed.json["status"], &failed.json["failure_reason"]),
        (&json!("failed"), &json!("expired_or_canceled_card"))
    );
    let now = sandbox.charge_now(&charge).await?;
    assert_eq!(
        (&now["amount_refunded"], &now["refunded"]),
        (&json!(0), &json!(false))
    );
    let read = sandbox.get(&format!("/v1/refunds/{refund}")).await?;
    assert_eq!(read.json["status"], "failed");
    for body in [json!({"status": "succeeded"}), json!({"status": "failed"})] {
        let again = sandbox
            .post_json(&format!("/_sandbox/refunds/{refund}"), &body)
            .await?;
        assert_eq!(again.status, StatusCode::BAD_REQUEST, "{body}");
    }
    // A succeeded refund cannot be canceled, only fail.
    let second = sandbox
        .form(
            "/v1/refunds",
            &[("charge", charge.as_str()), ("amount", "100")],
            None,
        )
        .await?;
    let second = id(&second.json)?;
    let canceled = sandbox
        .post_json(
            &format!("/_sandbox/refunds/{second}"),
            &json!({"status": "canceled"}),
        )
        .await?;
    assert_eq!(canceled.status, StatusCode::BAD_REQUEST);
    // The refund's key still replays its first answer.
    let replay = sandbox
        .form("/v1/refunds", &[("charge", &charge)], Some("refund-1"))
        .await?;
    assert!(replay.replayed);
    assert_eq!(replay.json["status"], "succeeded");

    let hold = sandbox.hold("500").await?;
    let release = sandbox
        .form("/v1/refunds", &[("charge", &hold)], None)
        .await?;
    let release = id(&release.json)?;
    let refused = sandbox
        .post_json(
            &format!("/_sandbox/refunds/{release}"),
            &json!({"status": "failed"}),
        )
        .await?;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.json);
    assert_eq!(sandbox.charge_now(&hold).await?["refunded"], true);
    Ok(())
}

/// An inquiry leaves the charge refundable; escalated to a chargeback it
/// does not (`charge_disputed`, saved under the key like Stripe's 400s),
/// and is lost; a chargeback reviewed and won lets refunds through again.
/// Both read back through `/v1/disputes`, and the charge says `disputed`.
#[tokio::test]
async fn disputes_go_through_their_lifecycle() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let asked = sandbox.paid("1000").await?;
    assert_eq!(sandbox.charge_now(&asked).await?["disputed"], false);
    let opened = sandbox
        .open_dispute(
            &asked,
            json!({"inquiry": true, "reason": "product_not_received"}),
        )
        .await?;
    assert_eq!(opened.status, StatusCode::OK, "{}", opened.json);
    let inquiry = opened.json;
    let inquiry_id = id(&inquiry)?;
    assert!(inquiry_id.starts_with("dp_") && inquiry_id.len() == 27);
    assert_eq!(
        (
            &inquiry["object"],
            &inquiry["amount"],
            &inquiry["currency"],
            &inquiry["charge"],
            &inquiry["status"],
            &inquiry["reason"],
            &inquiry["is_charge_refundable"],
            &inquiry["livemode"],
            &inquiry["metadata"],
            &inquiry["balance_transactions"],
        ),
        (
            &json!("dispute"),
            &json!(1000),
            &json!("gbp"),
            &json!(asked),
            &json!("warning_needs_response"),
            &json!("product_not_received"),
            &json!(true),
            &json!(false),
            &json!({}),
            &json!([]),
        )
    );
    assert_eq!(
        inquiry["evidence_details"],
        json!({"due_by": null, "has_evidence": false, "past_due": false, "submission_count": 0})
    );
    assert_eq!(sandbox.charge_now(&asked).await?["disputed"], true);
    let refund = sandbox
        .form(
            "/v1/refunds",
            &[("charge", asked.as_str()), ("amount", "100")],
            None,
        )
        .await?;
    assert_eq!(
        refund.status,
        StatusCode::OK,
        "an inquiry leaves it refundable"
    );

    let escalated = sandbox
        .move_dispute(&inquiry_id, json!({"status": "needs_response"}))
        .await?;
    assert_eq!(escalated["is_charge_refundable"], false);
    let due_by = escalated["evidence_details"]["due_by"]
        .as_u64()
        .ok_or("no due_by")?;
    let created = escalated["created"].as_u64().ok_or("no created")?;
    assert!(due_by >= created + 7 * 24 * 3600, "{escalated}");
    let form = [("charge", asked.as_str()), ("amount", "100")];
    let refused = sandbox
        .form("/v1/refunds", &form, Some("k-disputed"))
        .await?;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        refused.json,
        json!({"error": {"type": "invalid_request_error", "code": "charge_disputed",
            "message": format!("Charge {asked} has been charged back; the refund cannot be made.")}})
    );
    let dashboard = sandbox
        .post_json(&format!("/_sandbox/charges/{asked}/refunds"), &json!({}))
        .await?;
    assert_eq!(dashboard.code(), "charge_disputed");
    assert_eq!(sandbox.charge_now(&asked).await?["amount_refunded"], 100);

    let lost = sandbox
        .move_dispute(&inquiry_id, json!({"status": "lost"}))
        .await?;
    assert_eq!(lost["status"], "lost");
    // Saved under its key: the retry replays the 400, though the charge is
    // refundable again.
    let replayed = sandbox
        .form("/v1/refunds", &form, Some("k-disputed"))
        .await?;
    assert!(replayed.replayed);
    assert_eq!(replayed.bytes, refused.bytes);
    let after = sandbox.form("/v1/refunds", &form, Some("k-after")).await?;
    assert_eq!(after.status, StatusCode::OK, "{}", after.json);
    let closed = sandbox
        .post_json(
            &format!("/_sandbox/disputes/{inquiry_id}"),
            &json!({"status": "won"}),
        )
        .await?;
    assert_eq!(closed.status, StatusCode::BAD_REQUEST);
    assert_eq!(closed.json["error"]["param"], "status");

    // A chargeback: not refundable from the start, reviewed, then won.
    let charged_back = sandbox.paid("700").await?;
    let opened = sandbox.open_dispute(&charged_back, json!({})).await?;
    let chargeback = opened.json;
    let chargeback_id = id(&chargeback)?;
    assert_eq!(
        (
            &chargeback["status"],
            &chargeback["reason"],
            &chargeback["amount"],
            &chargeback["is_charge_refundable"]
        ),
        (
            &json!("needs_response"),
            &json!("fraudulent"),
            &json!(700),
            &json!(false)
        )
    );
    assert!(chargeback["evidence_details"]["due_by"].is_u64());
    let refused = sandbox
        .form("/v1/refunds", &[("charge", &charged_back)], None)
        .await?;
    assert_eq!(refused.code(), "charge_disputed");
    let reviewed = sandbox
        .move_dispute(&chargeback_id, json!({"status": "under_review"}))
        .await?;
    assert_eq!(reviewed["evidence_details"]["has_evidence"], true);
    assert_eq!(reviewed["evidence_details"]["submission_count"], 1);
    let won = sandbox
        .move_dispute(&chargeback_id, json!({"status": "won"}))
        .await?;
    assert_eq!(won["status"], "won");
    let refunded = sandbox
        .form("/v1/refunds", &[("charge", &charged_back)], None)
        .await?;
    assert_eq!(refunded.status, StatusCode::OK, "{}", refunded.json);
    assert_eq!(sandbox.charge_now(&charged_back).await?["disputed"], true);

    // Stripe's reads: one, a charge's, all newest first, page by page.
    let read = sandbox
        .get(&format!("/v1/disputes/{chargeback_id}"))
        .await?;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.json, won);
    let list = sandbox.get("/v1/disputes").await?;
    assert_eq!(
        (
            &list.json["object"],
            &list.json["url"],
            &list.json["has_more"]
        ),
        (&json!("list"), &json!("/v1/disputes"), &json!(false))
    );
    let ids: Vec<&Value> = list.json["data"]
        .as_array()
        .map(|data| data.iter().map(|d| &d["id"]).collect())
        .unwrap_or_default();
    assert_eq!(ids, [&json!(chargeback_id), &json!(inquiry_id)]);
    let first_page = sandbox.get("/v1/disputes?limit=1").await?;
    assert_eq!(first_page.json["has_more"], true);
    assert_eq!(first_page.json["data"][0]["id"], json!(chargeback_id));
    let next = sandbox
        .get(&format!(
            "/v1/disputes?limit=1&starting_after={chargeback_id}"
        ))
        .await?;
    assert_eq!(next.json["has_more"], false);
    assert_eq!(next.json["data"][0]["id"], json!(inquiry_id));
    let of_charge = sandbox.get(&format!("/v1/disputes?charge={asked}")).await?;
    assert_eq!(of_charge.json["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(of_charge.json["data"][0]["status"], "lost");
    let all = sandbox.get("/_sandbox/disputes").await?;
    let statuses: Vec<&Value> = all.json["data"]
        .as_array()
        .map(|data| data.iter().map(|d| &d["status"]).collect())
        .unwrap_or_default();
    assert_eq!(statuses, [&json!("lost"), &json!("won")], "oldest first");
    assert_eq!(sandbox.get("/_sandbox/stats").await?.json["disputes"], 2);
    Ok(())
}

/// What a bank or a reader cannot do: dispute a charge that took nothing,
/// twice, or for more than it took; move a dispute backwards or once
/// closed; read one that does not exist or without a key.
#[tokio::test]
async fn disputes_are_validated() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig {
        secret_key: Some("sk_test_sandbox".to_owned()),
        ..SandboxConfig::default()
    })
    .await?;
    let charge = sandbox.paid("1000").await?;
    let hold = sandbox.hold("500").await?;
    let not_captured = sandbox.open_dispute(&hold, json!({})).await?;
    assert_eq!(not_captured.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_captured.code(), "charge_not_disputable");
    let missing = sandbox.open_dispute("ch_nope", json!({})).await?;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.code(), "resource_missing");
    for bad in [
        json!({"amount": 1001}),
        json!({"amount": 0}),
        json!({"reason": "bored"}),
        json!({"inquiry": "yes"}),
        json!({"status": "lost"}),
    ] {
        let refused = sandbox.open_dispute(&charge, bad.clone()).await?;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let opened = sandbox
        .open_dispute(&charge, json!({"amount": 300, "inquiry": true}))
        .await?;
    assert_eq!(opened.status, StatusCode::OK, "{}", opened.json);
    let dispute = id(&opened.json)?;
    let twice = sandbox.open_dispute(&charge, json!({})).await?;
    assert_eq!(twice.code(), "charge_already_disputed");

    let path = format!("/_sandbox/disputes/{dispute}");
    for bad in [
        json!({"status": "won"}),
        json!({"status": "lost"}),
        json!({"status": "warning_needs_response"}),
        json!({"status": "closed"}),
        json!({}),
        json!({"status": "under_review", "note": 1}),
    ] {
        let refused = sandbox.post_json(&path, &bad).await?;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(refused.json["error"]["param"], "status", "{bad}");
    }
    let reviewed = sandbox
        .move_dispute(&dispute, json!({"status": "warning_under_review"}))
        .await?;
    assert_eq!(reviewed["is_charge_refundable"], true);
    let escalated = sandbox
        .move_dispute(&dispute, json!({"status": "needs_response"}))
        .await?;
    assert_eq!(escalated["is_charge_refundable"], false);
    let back = sandbox
        .post_json(&path, &json!({"status": "warning_closed"}))
        .await?;
    assert_eq!(back.status, StatusCode::BAD_REQUEST, "no way back");
    // The bank may let the charge be refunded after all.
    let refundable = sandbox
        .move_dispute(
            &dispute,
            json!({"status": "needs_response", "is_charge_refundable": true}),
        )
        .await?;
    assert_eq!(refundable["is_charge_refundable"], true);
    let refund = sandbox
        .form(
            "/v1/refunds",
            &[("charge", charge.as_str()), ("amount", "100")],
            None,
        )
        .await?;
    assert_eq!(refund.status, StatusCode::OK, "{}", refund.json);
    sandbox
        .move_dispute(&dispute, json!({"status": "prevented"}))
        .await?;
    let closed = sandbox
        .post_json(&path, &json!({"status": "under_review"}))
        .await?;
    assert_eq!(closed.status, StatusCode::BAD_REQUEST);
    let unknown = sandbox
        .post_json("/_sandbox/disputes/dp_nope", &json!({"status": "won"}))
        .await?;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);

    let read = sandbox.get("/v1/disputes/dp_nope").await?;
    assert_eq!(read.status, StatusCode::NOT_FOUND);
    assert_eq!(read.code(), "resource_missing");
    let unknown_charge = sandbox.get("/v1/disputes?charge=ch_nope").await?;
    assert_eq!(unknown_charge.status, StatusCode::BAD_REQUEST);
    assert_eq!(unknown_charge.code(), "resource_missing");
    let bad_cursor = sandbox.get("/v1/disputes?starting_after=dp_nope").await?;
    assert_eq!(bad_cursor.status, StatusCode::BAD_REQUEST);
    let bad_limit = sandbox.get("/v1/disputes?limit=101").await?;
    assert_eq!(bad_limit.status, StatusCode::BAD_REQUEST);
    for path in ["/v1/disputes", &format!("/v1/disputes/{dispute}")] {
        let anonymous = sandbox.client.get(sandbox.url(path)).send().await?;
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED, "{path}");
        let wrong = sandbox
            .client
            .get(sandbox.url(path))
            .bearer_auth("sk_test_other")
            .send()
            .await?;
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    Ok(())
}

/// A reset forgets disputes.
#[tokio::test]
async fn a_reset_forgets_disputes() -> TestResult {
    let sandbox = Sandbox::start(SandboxConfig::default()).await?;
    let charge = sandbox.paid("1000").await?;
    let opened = sandbox.open_dispute(&charge, json!({})).await?;
    let dispute = id(&opened.json)?;
    assert_eq!(sandbox.reset().await?.status(), StatusCode::OK);
    let gone = sandbox.get(&format!("/v1/disputes/{dispute}")).await?;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let all = sandbox.get("/_sandbox/disputes").await?;
    assert_eq!(all.json["data"], json!([]));
    Ok(())
}
