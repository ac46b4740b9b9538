//! Reconciliation settles unknown outcomes from the provider's records and
//! replaces the abandoned answers, so the client's retry gets the real one.

use crate::{aged, reconcile, reconciler};
use std::sync::Arc;
use std::time::Duration;

use payments_domain::provider::{Expected, Gateway, Lookup, ProviderOutcome};
use payments_gateway::HttpGateway;
use payments_jobs::reconciler::ReconcileReport;
use payments_sandbox::{SandboxConfig, SandboxHandle};
use payments_tests::{Backend, TestApp, backend_tests, charge_body, new_key, spawn_app};

use serde_json::json;

/// Abandons the charge `key` made, as the key-retention guard does: its
/// first call ended unknown (the sandbox as configured), then the record is
/// aged past the re-drive limit and retried, which abandons it without a
/// provider call (500 `request_abandoned`, charge `unknown`).
async fn abandoned_charge(app: &TestApp, key: &str, sandbox: serde_json::Value) {
    app.configure_sandbox(sandbox).await;
    let first = app
        .post_charge("cus_1", Some(key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(first.status(), 503);
    app.configure_sandbox(json!({})).await;
    crate::abandon_by_age(app, key, &charge_body(4900, "tok_visa")).await;
    assert_eq!(app.db.records_for_key(key, "abandoned", Some(500)).await, 1);
}

/// The provider did charge (the answer was lost): reconciled to
/// `succeeded` with the provider's id, and the client's retry with its
/// original key replays a 201; a second pass finds nothing to do.
async fn a_charge_the_provider_made_is_reconciled_to_succeeded(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let key = new_key();
    abandoned_charge(&app, &key, json!({"drop_after_charge": true})).await;
    let report = reconcile(&app, Duration::ZERO).await;
    assert_eq!(
        report,
        ReconcileReport {
            succeeded: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(app.db.charges_with_status("succeeded").await, 1);
    let retry = app
        .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replay"], "true");
    let charge: serde_json::Value = retry.json().await.unwrap();
    assert_eq!(charge["status"], "succeeded");
    let provider = app.sandbox_charges().await;
    assert_eq!(provider.len(), 1, "charged once");
    assert_eq!(charge["gateway_charge_id"], provider[0]["id"]);
    let again = reconcile(&app, Duration::ZERO).await;
    assert_eq!(again, ReconcileReport::default());
}

/// The provider never charged (it failed before charging): once the search
/// lag has passed, nothing was charged: the charge is `failed`
/// (`charge_not_made`) and the retry gets 502 `charge_not_made`, saying a
/// new key may be used. Within the lag nothing is concluded.
async fn a_charge_the_provider_never_made_is_not_made_only_past_the_lag(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let key = new_key();
    abandoned_charge(&app, &key, json!({"error_rate": 1.0})).await;
    // The last provider call was made (aged) 23.5 h ago; a lag longer than
    // that has not passed.
    let lagging = reconcile(&app, Duration::from_secs(24 * 3600)).await;
    assert_eq!(
        lagging,
        ReconcileReport {
            lagging: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(app.db.charges_with_status("unknown").await, 1);
    let report = reconcile(&app, Duration::from_secs(300)).await;
    assert_eq!(
        report,
        ReconcileReport {
            not_made: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(app.db.charges_with_status("failed").await, 1);
    let retry = app
        .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(retry.status(), 502);
    let error: serde_json::Value = retry.json().await.unwrap();
    assert_eq!(error["error"]["code"], "charge_not_made");
    assert_eq!(app.sandbox_charges().await.len(), 0);
}

/// The provider declined the charge (the answer was lost): reconciled to
/// `failed`, and the retry gets the stored 402 `card_declined`. A dry run
/// before it decides the same and changes nothing.
async fn a_charge_the_provider_declined_is_reconciled_to_failed(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let key = new_key();
    let declined = charge_body(4900, "tok_chargeDeclined");
    app.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let first = app.post_charge("cus_1", Some(&key), &declined).await;
    assert_eq!(first.status(), 503);
    app.configure_sandbox(json!({})).await;
    app.db
        .age(Some(&key), Duration::from_secs(23 * 3600 + 1800))
        .await;
    assert_eq!(
        app.post_charge("cus_1", Some(&key), &declined)
            .await
            .status(),
        500
    );
    let dry = reconciler(&app, Duration::ZERO).dry_run().await.unwrap();
    assert_eq!(
        dry,
        ReconcileReport {
            failed: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(
        app.db.charges_with_status("unknown").await,
        1,
        "a dry run changes nothing"
    );
    assert_eq!(
        app.db.records_for_key(&key, "abandoned", Some(500)).await,
        1
    );
    let report = reconcile(&app, Duration::ZERO).await;
    assert_eq!(
        report,
        ReconcileReport {
            failed: 1,
            ..ReconcileReport::default()
        }
    );
    let retry = app.post_charge("cus_1", Some(&key), &declined).await;
    assert_eq!(retry.status(), 402);
    let error: serde_json::Value = retry.json().await.unwrap();
    assert_eq!(error["error"]["code"], "card_declined");
    assert_eq!(app.db.charges_with_status("failed").await, 1);
}

/// Found by search only after its lag: a charge the provider made but
/// whose search index lags is left alone, never concluded "not made".
async fn a_lagging_search_is_never_taken_for_not_made(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let key = new_key();
    abandoned_charge(&app, &key, json!({"drop_after_charge": true})).await;
    app.configure_sandbox(json!({"search_lag_ms": 3_600_000}))
        .await;
    let report = reconcile(&app, Duration::from_secs(24 * 3600)).await;
    assert_eq!(
        report,
        ReconcileReport {
            lagging: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(app.db.charges_with_status("unknown").await, 1);
}

/// A charge whose provider calls carried no id (made before they did)
/// cannot be found by it: it is listed for a person, never settled.
async fn calls_without_an_id_need_a_person(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let key = new_key();
    abandoned_charge(&app, &key, json!({"error_rate": 1.0})).await;
    app.db
        .execute(
            "UPDATE charges SET provider_called_at = NULL",
            "UPDATE charges SET provider_called_at = NULL",
            "UPDATE charges SET provider_called_at = NULL",
        )
        .await;
    let report = reconcile(&app, Duration::ZERO).await;
    assert_eq!(
        report,
        ReconcileReport {
            needs_person: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(app.db.charges_with_status("unknown").await, 1);
}

/// Two reconcilers at once settle each of several charges exactly once.
async fn two_reconcilers_settle_each_charge_once(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    for _ in 0..4 {
        abandoned_charge(&app, &new_key(), json!({"drop_after_charge": true})).await;
    }
    let app = Arc::new(app);
    let (a, b) = (
        reconciler(&app, Duration::ZERO),
        reconciler(&app, Duration::ZERO),
    );
    let (a, b) = tokio::join!(a.try_run_once(), b.try_run_once());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.succeeded + b.succeeded, 4, "{a:?} {b:?}");
    // A pass that read a charge the other settled first counts it as
    // already settled; one that started after the other's writes does not
    // see it at all (a busy machine can order the passes so).
    assert!(
        a.already_settled + b.already_settled <= 4,
        "nothing is settled twice: {a:?} {b:?}"
    );
    for report in [&a, &b] {
        let ReconcileReport {
            failed,
            not_made,
            lagging,
            needs_person,
            lookup_failed,
            ..
        } = *report;
        assert_eq!(
            (failed, not_made, lagging, needs_person, lookup_failed),
            (0, 0, 0, 0, 0)
        );
    }
    assert_eq!(app.db.charges_with_status("succeeded").await, 4);
}

/// A refund abandoned with its outcome unknown: the provider did refund, so
/// it is reconciled to `succeeded`, counted in the charge's
/// `amount_refunded`, and the retry replays a 201.
async fn a_refund_the_provider_made_is_reconciled(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_1", &charge_body(1000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().unwrap();
    app.configure_sandbox(json!({"drop_after_charge": true}))
        .await;
    let key = new_key();
    let body = json!({"amount_cents": 400});
    assert_eq!(
        app.post_refund("cus_1", charge_id, &key, &body)
            .await
            .status,
        503
    );
    app.configure_sandbox(json!({})).await;
    app.db
        .age(Some(&key), Duration::from_secs(23 * 3600 + 1800))
        .await;
    assert_eq!(
        app.post_refund("cus_1", charge_id, &key, &body)
            .await
            .status,
        500
    );
    assert_eq!(app.db.refunds_with_status("unknown").await, 1);
    let report = reconcile(&app, Duration::ZERO).await;
    assert_eq!(
        report,
        ReconcileReport {
            succeeded: 1,
            ..ReconcileReport::default()
        }
    );
    let retry = app.post_refund("cus_1", charge_id, &key, &body).await;
    assert_eq!(
        (retry.status, retry.body["status"].as_str()),
        (201, Some("succeeded"))
    );
    let charge = app
        .get_as("cus_1", &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(charge.body["amount_refunded"], 400);
    assert_eq!(app.sandbox_refunds().await.len(), 1);
}

/// Abandons the refund of `body` under `key`: its first call ended unknown
/// (the sandbox as configured: `drop_after_charge` makes the refund and
/// loses the answer), then the record is aged past the re-drive limit and
/// retried, which abandons it (500 `request_abandoned`, refund `unknown`).
async fn abandoned_refund(
    app: &TestApp,
    charge_id: &str,
    key: &str,
    body: &serde_json::Value,
    sandbox: serde_json::Value,
) {
    app.configure_sandbox(sandbox).await;
    let first = app.post_refund("cus_1", charge_id, key, body).await;
    assert_eq!(first.status, 503, "{}", first.body);
    app.configure_sandbox(json!({})).await;
    app.db
        .age(Some(key), Duration::from_secs(23 * 3600 + 1800))
        .await;
    let abandoned = app.post_refund("cus_1", charge_id, key, body).await;
    assert_eq!(abandoned.status, 500, "{}", abandoned.body);
    assert_eq!(app.db.refunds_with_status("unknown").await, 1);
}

/// What the provider refunded of `gateway_charge_id`, in minor units.
async fn provider_refunded(app: &TestApp, gateway_charge_id: &str) -> i64 {
    app.sandbox_refunds()
        .await
        .iter()
        .filter(|refund| refund["charge"] == gateway_charge_id)
        .filter_map(|refund| refund["amount"].as_i64())
        .sum()
}

/// Issue 23, section 1, first point: an unknown refund with 100 newer refunds on its charge is
/// on the second page of the provider's list. Reconciliation reads every
/// page: it is found and settled `succeeded`, never `refund_not_made`; the
/// client, following the answers it gets (a new key only when told nothing
/// was refunded), never has the provider refund twice.
async fn an_unknown_refund_behind_a_full_page_of_newer_refunds_is_found(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_1", &charge_body(20_000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().unwrap();
    let gateway_charge_id = charge["gateway_charge_id"].as_str().unwrap();
    let key = new_key();
    let body = json!({"amount_cents": 5_000});
    abandoned_refund(
        &app,
        charge_id,
        &key,
        &body,
        json!({"drop_after_charge": true}),
    )
    .await;
    for _ in 0..100 {
        let newer = app
            .post_refund("cus_1", charge_id, &new_key(), &json!({"amount_cents": 1}))
            .await;
        assert_eq!(newer.status, 201, "{}", newer.body);
    }
    let report = reconcile(&app, Duration::ZERO).await;

    // The client retries with its key; only an answer that says nothing
    // was refunded lets it use a new one.
    let retry = app.post_refund("cus_1", charge_id, &key, &body).await;
    if retry.body["error"]["code"] == "refund_not_made" {
        let again = app.post_refund("cus_1", charge_id, &new_key(), &body).await;
        assert_eq!(again.status, 201, "{}", again.body);
    }
    let refunded = provider_refunded(&app, gateway_charge_id).await;
    assert_eq!(
        refunded, 5_100,
        "the provider refunded {refunded} for 5,100 asked: money moved twice \
         (reconciled: {report:?}, retry: {} {})",
        retry.status, retry.body
    );
    assert_eq!(
        report,
        ReconcileReport {
            succeeded: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(
        (retry.status, retry.body["status"].as_str()),
        (201, Some("succeeded"))
    );
    let charge = app
        .get_as("cus_1", &format!("/api/charges/{charge_id}"))
        .await;
    assert_eq!(charge.body["amount_refunded"], refunded);
}

/// Issue 23, section 1, first point: a charge's refund list is read to its end, and only a
/// complete read says "not found". Past the bound on pages the lookup is
/// unknown, never "not found". Against the real sandbox, with pages of 2.
#[tokio::test]
async fn refund_lookups_page_to_the_end_and_a_bound_is_never_not_found() {
    let sandbox = SandboxHandle::start(SandboxConfig::default())
        .await
        .expect("start sandbox");
    let http = reqwest::Client::new();
    let post = |path: &'static str, form: Vec<(&'static str, String)>| {
        let request = http
            .post(format!("{}{path}", sandbox.url()))
            .bearer_auth("sk_test_sandbox")
            .form(&form);
        async move {
            let answer: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
            answer
        }
    };
    let charge = post(
        "/v1/charges",
        vec![
            ("amount", "1000".into()),
            ("currency", "gbp".into()),
            ("source", "tok_visa".into()),
        ],
    )
    .await;
    let charge_id = charge["id"].as_str().unwrap().to_owned();
    // Ours is the oldest of five: on the third page of two.
    for i in 0..5 {
        let mut form = vec![("charge", charge_id.clone()), ("amount", "100".into())];
        if i == 0 {
            form.push(("metadata[payments_refund_id]", "re_ours".into()));
        }
        post("/v1/refunds", form).await;
    }
    let expected = Expected {
        amount_cents: 100,
        currency: "GBP".to_owned(),
        hold: false,
    };
    let gateway = |pages| {
        HttpGateway::new(&sandbox.url(), "sk_test_sandbox", Duration::from_secs(5))
            .unwrap()
            .with_refund_paging(2, pages)
    };
    let found = gateway(3)
        .find_refund(&charge_id, "re_ours", &expected)
        .await;
    assert!(
        matches!(found, Lookup::Found(ProviderOutcome::Succeeded { .. })),
        "{found:?}"
    );
    assert_eq!(
        gateway(3)
            .find_refund(&charge_id, "re_absent", &expected)
            .await,
        Lookup::NotFound
    );
    for absent_or_ours in ["re_ours", "re_absent"] {
        let bounded = gateway(2)
            .find_refund(&charge_id, absent_or_ours, &expected)
            .await;
        assert!(
            matches!(bounded, Lookup::Unknown { .. }),
            "{absent_or_ours}: {bounded:?}"
        );
    }
}

/// Issue 23, section 3, second point: Stripe documents a refund's `metadata` and `status` as
/// nullable. A refund made at the provider without metadata (from its
/// dashboard), listed with both null, does not break the lookup of ours.
async fn nulls_in_a_refund_list_do_not_break_the_lookup(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_1", &charge_body(1000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().unwrap();
    let gateway_charge_id = charge["gateway_charge_id"].as_str().unwrap();
    let key = new_key();
    let body = json!({"amount_cents": 400});
    abandoned_refund(
        &app,
        charge_id,
        &key,
        &body,
        json!({"drop_after_charge": true}),
    )
    .await;
    let dashboard = app
        .http
        .post(format!("{}/v1/refunds", app.sandbox.url()))
        .bearer_auth("sk_test_sandbox")
        .form(&[("charge", gateway_charge_id), ("amount", "100")])
        .send()
        .await
        .unwrap();
    assert_eq!(dashboard.status(), 200);
    app.configure_sandbox(json!({"nulls_in_refund_lists": true}))
        .await;
    let report = reconcile(&app, Duration::ZERO).await;
    assert_eq!(
        report,
        ReconcileReport {
            succeeded: 1,
            ..ReconcileReport::default()
        }
    );
    let retry = app.post_refund("cus_1", charge_id, &key, &body).await;
    assert_eq!(
        (retry.status, retry.body["status"].as_str()),
        (201, Some("succeeded"))
    );
}

/// Issue 23, section 3, first point: the provider made a charge, but
/// for another amount and currency than ours. Found by reconciliation, it
/// is never taken for ours: the charge stays `unknown` (the lookup fails,
/// loudly), its client still gets `request_abandoned`, on every pass.
async fn a_charge_found_with_another_amount_is_left_for_a_person(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let key = new_key();
    abandoned_charge(
        &app,
        &key,
        json!({"drop_after_charge": true, "answer_amount_override": 100,
               "answer_currency_override": "usd"}),
    )
    .await;
    for _ in 0..2 {
        let report = reconcile(&app, Duration::ZERO).await;
        assert_eq!(
            report,
            ReconcileReport {
                lookup_failed: 1,
                ..ReconcileReport::default()
            }
        );
    }
    assert_eq!(app.db.charges_with_status("unknown").await, 1);
    let retry = app
        .post_charge("cus_1", Some(&key), &charge_body(4900, "tok_visa"))
        .await;
    assert_eq!(retry.status(), 500);
}

/// The same for a refund the provider made for another amount: it stays
/// `unknown`, its reservation held.
async fn a_refund_found_with_another_amount_is_left_for_a_person(backend: Backend) {
    let Some(app) = spawn_app(backend, aged()).await else {
        return;
    };
    let charge = app
        .charge_json("cus_1", &charge_body(1000, "tok_visa"))
        .await;
    let charge_id = charge["id"].as_str().unwrap();
    let key = new_key();
    abandoned_refund(
        &app,
        charge_id,
        &key,
        &json!({"amount_cents": 400}),
        json!({"drop_after_charge": true, "answer_amount_override": 300}),
    )
    .await;
    let report = reconcile(&app, Duration::ZERO).await;
    assert_eq!(
        report,
        ReconcileReport {
            lookup_failed: 1,
            ..ReconcileReport::default()
        }
    );
    assert_eq!(app.db.refunds_with_status("unknown").await, 1);
    // Its 400 stays reserved: 700 does not fit in what is left.
    app.assert_refund_does_not_fit(charge_id, 700).await;
}

backend_tests!(
    serializable;
    a_charge_the_provider_made_is_reconciled_to_succeeded,
    a_charge_the_provider_declined_is_reconciled_to_failed,
    a_charge_the_provider_never_made_is_not_made_only_past_the_lag,
    a_lagging_search_is_never_taken_for_not_made,
    calls_without_an_id_need_a_person,
    two_reconcilers_settle_each_charge_once,
    a_refund_the_provider_made_is_reconciled,
    an_unknown_refund_behind_a_full_page_of_newer_refunds_is_found,
    nulls_in_a_refund_list_do_not_break_the_lookup,
    a_charge_found_with_another_amount_is_left_for_a_person,
    a_refund_found_with_another_amount_is_left_for_a_person,
);
