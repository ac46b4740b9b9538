//! The ledger file over real HTTP on loopback: a sandbox stopped and started
//! again on the same file (in process, and the binary killed with SIGKILL)
//! still knows its charges, refunds, holds, captures and the answers stored
//! under its idempotency keys; a damaged file refuses to start, naming
//! itself; a file written before holds still reads. Each test has a
//! directory of its own.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use payments_sandbox::{LedgerFile, SandboxConfig, SandboxHandle};
use reqwest::StatusCode;
use serde_json::{Value, json};

mod common;

use common::{Answer, Error, Sandbox, TestResult, answer};

const VISA: &[(&str, &str)] = &[
    ("amount", "4900"),
    ("currency", "gbp"),
    ("source", "tok_visa"),
    ("metadata[order_id]", "42"),
];

/// A fresh directory under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_nanos())
            .unwrap_or_default();
        let name = format!(
            "payments-sandbox-ledger-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Sandbox {
    /// A sandbox on `ledger`.
    async fn on_ledger(ledger: &Path) -> Result<Self, Error> {
        let file = LedgerFile::open(ledger)?;
        let handle = SandboxHandle::start_with_ledger(SandboxConfig::default(), Some(file)).await?;
        Ok(Self::serving(handle)?)
    }

    async fn post(
        &self,
        path: &str,
        form: &[(&str, &str)],
        key: &str,
    ) -> Result<Answer, reqwest::Error> {
        let response = self
            .client
            .post(self.url(path))
            .bearer_auth("sk_test_sandbox")
            .header("Idempotency-Key", key)
            .form(form)
            .send()
            .await?;
        answer(response).await
    }

    async fn get_json(&self, path: &str) -> Result<Value, reqwest::Error> {
        self.client
            .get(self.url(path))
            .bearer_auth("sk_test_sandbox")
            .send()
            .await?
            .json()
            .await
    }
}

fn id(answer: &Answer) -> Result<String, String> {
    answer.json["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no id in {}", answer.json))
}

/// The ids of `GET /v1/charges`, newest first.
async fn listed_charges(sandbox: &Sandbox) -> Result<Vec<Value>, reqwest::Error> {
    let list = sandbox.get_json("/v1/charges?limit=100").await?;
    Ok(list["data"]
        .as_array()
        .map(|data| data.iter().map(|charge| charge["id"].clone()).collect())
        .unwrap_or_default())
}

#[tokio::test]
async fn a_restarted_sandbox_remembers_charges_refunds_and_keys() -> TestResult {
    let dir = TempDir::new()?;
    let path = dir.join("ledger.jsonl");

    // First life: a charge, a declined charge, a refund, and a pending
    // refund that later fails (giving its amount back).
    let first = Sandbox::on_ledger(&path).await?;
    let charged = first.post("/v1/charges", VISA, "charge-1").await?;
    assert_eq!(charged.status, StatusCode::OK);
    let charge = id(&charged)?;
    let declined_form = [
        ("amount", "700"),
        ("currency", "gbp"),
        ("source", "tok_chargeDeclined"),
    ];
    let declined = first
        .post("/v1/charges", &declined_form, "charge-2")
        .await?;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    let refund_form = [("charge", charge.as_str()), ("amount", "1000")];
    let refunded = first.post("/v1/refunds", &refund_form, "refund-1").await?;
    assert_eq!(refunded.status, StatusCode::OK, "{}", refunded.json);
    first
        .post_json("/_sandbox/config", &json!({"refund_status": "pending"}))
        .await?;
    let pending_form = [("charge", charge.as_str()), ("amount", "500")];
    let pending = first.post("/v1/refunds", &pending_form, "refund-2").await?;
    assert_eq!(pending.json["status"], "pending");
    let settled = first
        .post_json(
            &format!("/_sandbox/refunds/{}", id(&pending)?),
            &json!({"status": "failed"}),
        )
        .await?;
    assert_eq!(settled.status, StatusCode::OK, "{}", settled.json);
    let listed = listed_charges(&first).await?;
    assert_eq!(listed.len(), 2);
    first.handle.stop().await;

    // Second life: the same file.
    let second = Sandbox::on_ledger(&path).await?;
    // (b) The provider retry replays the first answer, byte for byte, and
    // charges nothing; the same for the decline and the refund.
    let retried = second.post("/v1/charges", VISA, "charge-1").await?;
    assert_eq!(
        (retried.status, retried.replayed, &retried.bytes),
        (StatusCode::OK, true, &charged.bytes)
    );
    let retried = second
        .post("/v1/charges", &declined_form, "charge-2")
        .await?;
    assert_eq!(
        (retried.status, retried.replayed, &retried.bytes),
        (StatusCode::PAYMENT_REQUIRED, true, &declined.bytes)
    );
    let retried = second.post("/v1/refunds", &refund_form, "refund-1").await?;
    assert_eq!((retried.replayed, &retried.bytes), (true, &refunded.bytes));
    // The key still knows its parameters.
    let other = [
        ("amount", "4901"),
        ("currency", "gbp"),
        ("source", "tok_visa"),
    ];
    let reused = second.post("/v1/charges", &other, "charge-1").await?;
    assert_eq!(reused.status, StatusCode::BAD_REQUEST);
    assert_eq!(reused.json["error"]["type"], "idempotency_error");
    // (c) The charges are listed as before, with what was refunded.
    assert_eq!(listed_charges(&second).await?, listed);
    let stats = second.get_json("/_sandbox/stats").await?;
    assert_eq!(
        (&stats["charges"], &stats["refunds"]),
        (&json!(2), &json!(2))
    );
    let now = second.get_json(&format!("/v1/charges/{charge}")).await?;
    assert_eq!(now["amount_refunded"], 1000, "{now}");
    let keys: Vec<Value> = second.get_json("/_sandbox/charges").await?["data"]
        .as_array()
        .map(|data| data.iter().map(|c| c["idempotency_key"].clone()).collect())
        .unwrap_or_default();
    assert_eq!(keys, [json!("charge-1"), json!("charge-2")]);
    // (a) A refund of the earlier charge succeeds: what is left of it.
    let rest = second
        .post("/v1/refunds", &[("charge", charge.as_str())], "refund-3")
        .await?;
    assert_eq!(rest.status, StatusCode::OK, "{}", rest.json);
    assert_eq!(rest.json["amount"], 3900);
    second.handle.stop().await;

    // Third life: the compacted file, with the settled refund as it is now.
    let third = Sandbox::on_ledger(&path).await?;
    let charged = third.get_json(&format!("/v1/charges/{charge}")).await?;
    assert_eq!(
        (&charged["amount_refunded"], &charged["refunded"]),
        (&json!(4900), &json!(true))
    );
    let refunds = third
        .get_json(&format!("/v1/refunds?charge={charge}"))
        .await?;
    let statuses: Vec<&Value> = refunds["data"]
        .as_array()
        .map(|data| data.iter().map(|refund| &refund["status"]).collect())
        .unwrap_or_default();
    assert_eq!(
        statuses,
        [&json!("succeeded"), &json!("failed"), &json!("succeeded")]
    );
    let again = third
        .post("/v1/refunds", &[("charge", charge.as_str())], "refund-4")
        .await?;
    assert_eq!(again.json["error"]["code"], "charge_already_refunded");
    third.handle.stop().await;
    Ok(())
}

const HOLD: &[(&str, &str)] = &[
    ("amount", "1000"),
    ("currency", "gbp"),
    ("source", "tok_visa"),
    ("capture", "false"),
];

/// `captured`, `amount_captured`, `amount_refunded`, `refunded` of the
/// charge `id` as `GET /v1/charges/{id}` reads it.
async fn money(sandbox: &Sandbox, id: &str) -> Result<Value, reqwest::Error> {
    let charge = sandbox.get_json(&format!("/v1/charges/{id}")).await?;
    Ok(json!([
        charge["captured"],
        charge["amount_captured"],
        charge["amount_refunded"],
        charge["refunded"]
    ]))
}

#[tokio::test]
async fn a_restarted_sandbox_remembers_captures_releases_and_lapses() -> TestResult {
    let dir = TempDir::new()?;
    let path = dir.join("ledger.jsonl");

    // First life: a hold partly captured, one released, one still held, and
    // one that lapses while the sandbox is down (its deadline unsaid).
    let first = Sandbox::on_ledger(&path).await?;
    let partly = id(&first.post("/v1/charges", HOLD, "hold-1").await?)?;
    let released = id(&first.post("/v1/charges", HOLD, "hold-2").await?)?;
    let held = id(&first.post("/v1/charges", HOLD, "hold-3").await?)?;
    first
        .post_json(
            "/_sandbox/config",
            &json!({"hold_expiry_seconds": 1, "send_capture_before": false}),
        )
        .await?;
    let lapsing = first.post("/v1/charges", HOLD, "hold-4").await?;
    assert_eq!(lapsing.json["payment_method_details"]["card"], json!({}));
    let lapsing_created = lapsing.json["created"].as_u64().ok_or("no created")?;
    let lapsing = id(&lapsing)?;
    let capture_path = format!("/v1/charges/{partly}/capture");
    let captured = first
        .post(&capture_path, &[("amount", "600")], "capture-1")
        .await?;
    assert_eq!(captured.status, StatusCode::OK, "{}", captured.json);
    let release_form = [
        ("charge", released.as_str()),
        ("metadata[payments_refund_id]", "rf_1"),
    ];
    let release = first
        .post("/v1/refunds", &release_form, "release-1")
        .await?;
    assert_eq!(release.status, StatusCode::OK, "{}", release.json);
    first.handle.stop().await;
    let written = std::fs::read_to_string(&path)?;
    assert!(written.contains(r#"{"capture":{"charge":""#), "{written}");

    // Second life, once the fourth hold's deadline passed.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let due = Duration::from_secs(lapsing_created + 1) + Duration::from_millis(50);
    tokio::time::sleep(due.saturating_sub(now)).await;
    let second = Sandbox::on_ledger(&path).await?;
    let replayed = second
        .post(&capture_path, &[("amount", "600")], "capture-1")
        .await?;
    assert_eq!(
        (replayed.status, replayed.replayed, &replayed.bytes),
        (StatusCode::OK, true, &captured.bytes)
    );
    let again = second.post(&capture_path, &[], "capture-2").await?;
    assert_eq!(again.json["error"]["code"], "charge_already_captured");
    let released_capture = second
        .post(&format!("/v1/charges/{released}/capture"), &[], "capture-3")
        .await?;
    assert_eq!(
        released_capture.json["error"]["code"],
        "charge_already_refunded"
    );
    let lapsed_capture = second
        .post(&format!("/v1/charges/{lapsing}/capture"), &[], "capture-4")
        .await?;
    assert_eq!(
        lapsed_capture.json["error"]["code"],
        "charge_expired_for_capture"
    );
    let now_captured = second
        .post(&format!("/v1/charges/{held}/capture"), &[], "capture-5")
        .await?;
    assert_eq!(now_captured.status, StatusCode::OK, "{}", now_captured.json);
    assert_eq!(
        money(&second, &partly).await?,
        json!([true, 600, 400, false])
    );
    assert_eq!(
        money(&second, &released).await?,
        json!([false, 0, 1000, true])
    );
    assert_eq!(
        money(&second, &lapsing).await?,
        json!([false, 0, 1000, true])
    );
    let refunds = second
        .get_json(&format!("/v1/refunds?charge={released}"))
        .await?;
    assert_eq!(
        refunds["data"][0]["metadata"],
        json!({"payments_refund_id": "rf_1"})
    );
    // What is left to refund of the partial capture is what was captured.
    let rest = second
        .post("/v1/refunds", &[("charge", partly.as_str())], "refund-1")
        .await?;
    assert_eq!(rest.json["amount"], 600, "{}", rest.json);
    let stats = second.get_json("/_sandbox/stats").await?;
    assert_eq!(
        (&stats["charges"], &stats["refunds"], &stats["captures"]),
        (&json!(4), &json!(2), &json!(2))
    );
    second.handle.stop().await;

    // Third life: the compacted file, as it stands.
    let third = Sandbox::on_ledger(&path).await?;
    assert_eq!(
        money(&third, &partly).await?,
        json!([true, 600, 1000, true])
    );
    assert_eq!(money(&third, &held).await?, json!([true, 1000, 0, false]));
    assert_eq!(
        money(&third, &lapsing).await?,
        json!([false, 0, 1000, true])
    );
    let lapsed = third.get_json(&format!("/v1/charges/{lapsing}")).await?;
    assert_eq!(lapsed["payment_method_details"]["card"], json!({}));
    let captures = third.get_json("/_sandbox/captures").await?;
    let lines: Vec<(Value, Value, Value)> = captures["data"]
        .as_array()
        .map(|data| {
            data.iter()
                .map(|c| {
                    (
                        c["charge"].clone(),
                        c["amount"].clone(),
                        c["idempotency_key"].clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        lines,
        [
            (json!(partly), json!(600), json!("capture-1")),
            (json!(held), json!(1000), json!("capture-5")),
        ]
    );
    third.handle.stop().await;
    let compacted = std::fs::read_to_string(&path)?;
    assert!(compacted.starts_with("{\"payments_sandbox_ledger\":{\"version\":3}}\n"));
    Ok(())
}

/// A refund that failed after it succeeded, a dashboard refund and
/// disputes (opened, escalated, closed) are in the ledger file: a sandbox
/// restarted on it, twice (reading the lines as appended, then as
/// compacted), still knows them, and still refuses a refund of the charge
/// taken back.
#[tokio::test]
async fn failed_refunds_and_disputes_survive_a_restart() -> TestResult {
    let dir = TempDir::new()?;
    let path = dir.join("ledger.jsonl");
    let first = Sandbox::on_ledger(&path).await?;
    let charge = id(&first.post("/v1/charges", VISA, "charge-1").await?)?;
    let refund_form = [("charge", charge.as_str()), ("amount", "1000")];
    let refund = id(&first.post("/v1/refunds", &refund_form, "refund-1").await?)?;
    let failed = first
        .post_json(
            &format!("/_sandbox/refunds/{refund}"),
            &json!({"status": "failed", "failure_reason": "expired_or_canceled_card"}),
        )
        .await?;
    assert_eq!(failed.status, StatusCode::OK, "{}", failed.json);
    let dashboard = first
        .post_json(
            &format!("/_sandbox/charges/{charge}/refunds"),
            &json!({"amount": 500}),
        )
        .await?;
    assert_eq!(dashboard.status, StatusCode::OK, "{}", dashboard.json);
    let inquiry = first
        .post_json(
            &format!("/_sandbox/charges/{charge}/disputes"),
            &json!({"inquiry": true}),
        )
        .await?;
    let inquiry = id(&inquiry)?;
    let escalated = first
        .post_json(
            &format!("/_sandbox/disputes/{inquiry}"),
            &json!({"status": "needs_response"}),
        )
        .await?;
    assert_eq!(escalated.status, StatusCode::OK, "{}", escalated.json);
    let other = id(&first.post("/v1/charges", VISA, "charge-2").await?)?;
    let chargeback = first
        .post_json(&format!("/_sandbox/charges/{other}/disputes"), &json!({}))
        .await?;
    let chargeback = id(&chargeback)?;
    let won = first
        .post_json(
            &format!("/_sandbox/disputes/{chargeback}"),
            &json!({"status": "won"}),
        )
        .await?;
    assert_eq!(won.status, StatusCode::OK, "{}", won.json);
    let charge_path = format!("/v1/charges/{charge}");
    let before = first.get_json(&charge_path).await?;
    assert_eq!(
        (
            &before["amount_refunded"],
            &before["refunded"],
            &before["disputed"]
        ),
        (&json!(500), &json!(false), &json!(true))
    );
    let disputes = first.get_json("/_sandbox/disputes").await?;
    let refunds = first
        .get_json(&format!("/v1/refunds?charge={charge}"))
        .await?;
    first.handle.stop().await;

    for life in ["appended", "compacted"] {
        let again = Sandbox::on_ledger(&path).await?;
        assert_eq!(again.get_json(&charge_path).await?, before, "{life}");
        assert_eq!(
            again.get_json("/_sandbox/disputes").await?,
            disputes,
            "{life}"
        );
        let listed = again
            .get_json(&format!("/v1/refunds?charge={charge}"))
            .await?;
        assert_eq!(listed, refunds, "{life}");
        let read = again.get_json(&format!("/v1/refunds/{refund}")).await?;
        assert_eq!(
            (&read["status"], &read["failure_reason"]),
            (&json!("failed"), &json!("expired_or_canceled_card")),
            "{life}"
        );
        let refused = again
            .post(
                "/v1/refunds",
                &[("charge", charge.as_str())],
                &format!("refund-{life}"),
            )
            .await?;
        assert_eq!(refused.code(), "charge_disputed", "{life}");
        let stats = again.get_json("/_sandbox/stats").await?;
        assert_eq!(stats["disputes"], 2, "{life}");
        let closed = again
            .post_json(
                &format!("/_sandbox/disputes/{chargeback}"),
                &json!({"status": "lost"}),
            )
            .await?;
        assert_eq!(closed.status, StatusCode::BAD_REQUEST, "{life}");
        again.handle.stop().await;
    }
    let compacted = std::fs::read_to_string(&path)?;
    assert_eq!(compacted.matches("{\"dispute\":").count(), 2);
    assert!(!compacted.contains("dispute_update"));
    Ok(())
}

/// A ledger file as a sandbox wrote it before holds: version 1, charges
/// without `amount_captured` or `payment_method_details`.
#[tokio::test]
async fn a_ledger_file_from_before_holds_still_reads() -> TestResult {
    let dir = TempDir::new()?;
    let path = dir.join("ledger.jsonl");
    let charge = json!({"charge": {"charge": {"id": "ch_old", "amount": 4900,
        "amount_refunded": 0, "currency": "gbp", "status": "succeeded", "paid": true,
        "captured": true, "refunded": false, "livemode": false, "source": "tok_visa",
        "description": null, "metadata": {"order_id": "42"}, "created": 1_700_000_000,
        "failure_code": null, "failure_message": null},
        "created_ms": 1_700_000_000_000_u64, "idempotency_key": "old-key"}});
    let refund = json!({"refund": {"refund": {"id": "re_old", "amount": 900,
        "charge": "ch_old", "currency": "gbp", "status": "succeeded", "failure_reason": null,
        "reason": null, "metadata": {}, "created": 1_700_000_001},
        "idempotency_key": null}});
    std::fs::write(
        &path,
        format!("{{\"payments_sandbox_ledger\":{{\"version\":1}}}}\n{charge}\n{refund}\n"),
    )?;
    let sandbox = Sandbox::on_ledger(&path).await?;
    let old = sandbox.get_json("/v1/charges/ch_old").await?;
    assert_eq!(
        json!([
            old["captured"],
            old["amount_captured"],
            old["amount_refunded"]
        ]),
        json!([true, 4900, 900])
    );
    assert_eq!(
        old["payment_method_details"],
        json!({"type": "card", "card": {}})
    );
    let capture = sandbox
        .post("/v1/charges/ch_old/capture", &[], "capture")
        .await?;
    assert_eq!(capture.json["error"]["code"], "charge_already_captured");
    let rest = sandbox
        .post("/v1/refunds", &[("charge", "ch_old")], "refund")
        .await?;
    assert_eq!(rest.json["amount"], 4000, "{}", rest.json);
    sandbox.handle.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_reset_empties_the_ledger_file() -> TestResult {
    let dir = TempDir::new()?;
    let path = dir.join("ledger.jsonl");
    let first = Sandbox::on_ledger(&path).await?;
    assert_eq!(
        first.post("/v1/charges", VISA, "k").await?.status,
        StatusCode::OK
    );
    let reset = first.post_json("/_sandbox/reset", &json!({})).await?;
    assert_eq!(reset.status, StatusCode::OK);
    first.handle.stop().await;
    let second = Sandbox::on_ledger(&path).await?;
    assert!(listed_charges(&second).await?.is_empty());
    let charged = second.post("/v1/charges", VISA, "k").await?;
    assert_eq!((charged.status, charged.replayed), (StatusCode::OK, false));
    second.handle.stop().await;
    Ok(())
}

#[test]
fn a_damaged_ledger_file_refuses_to_load_naming_it() -> TestResult {
    let dir = TempDir::new()?;
    let header = "{\"payments_sandbox_ledger\":{\"version\":1}}\n";
    for (name, contents, needle) in [
        (
            "garbage",
            format!("{header}not json\n"),
            "line 2 is not a ledger line",
        ),
        (
            "header-cut",
            "{\"payments_sandbox_ledger\":{\"vers".to_owned(),
            "it holds no complete line",
        ),
        (
            "other",
            "{\"hello\":\"world\"}\n".to_owned(),
            "line 1 is not a ledger line",
        ),
        (
            "orphan-refund",
            format!(
                "{header}{}\n",
                json!({"refund": {"refund": {"id": "re_1", "amount": 1, "charge": "ch_1",
                    "currency": "gbp", "status": "succeeded", "failure_reason": null,
                    "reason": null, "metadata": {}, "created": 1},
                    "idempotency_key": null}})
            ),
            "line 2: refund re_1 is of charge ch_1, which no earlier line made",
        ),
        (
            "newer",
            "{\"payments_sandbox_ledger\":{\"version\":9}}\n".to_owned(),
            "format version 9",
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, &contents)?;
        let error = match LedgerFile::open(&path) {
            Ok(file) => return Err(format!("{name} was read: {file:?}").into()),
            Err(error) => error,
        };
        let message = error.to_string();
        assert_eq!(error.path(), path);
        assert!(
            message.contains(&path.display().to_string())
                && message.contains(needle)
                && message.contains("delete it to start with an empty ledger"),
            "{name}: {message}"
        );
        // Refused, not rewritten: the file is left for a person to look at.
        assert_eq!(std::fs::read_to_string(&path)?, contents);
    }
    Ok(())
}

#[tokio::test]
async fn a_line_cut_short_by_a_crash_is_dropped_and_the_rest_kept() -> TestResult {
    let dir = TempDir::new()?;
    let path = dir.join("ledger.jsonl");
    let first = Sandbox::on_ledger(&path).await?;
    let charged = first.post("/v1/charges", VISA, "k").await?;
    first.handle.stop().await;
    // What a process killed halfway through an append leaves.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)?
        .write_all(b"{\"charge\":{\"id\":\"ch_")?;
    let second = Sandbox::on_ledger(&path).await?;
    let retried = second.post("/v1/charges", VISA, "k").await?;
    assert_eq!((retried.replayed, &retried.bytes), (true, &charged.bytes));
    assert_eq!(listed_charges(&second).await?.len(), 1);
    second.handle.stop().await;
    let compacted = std::fs::read_to_string(&path)?;
    assert!(compacted.ends_with('\n') && !compacted.contains("\"ch_\""));
    Ok(())
}

#[test]
fn a_ledger_file_serves_one_sandbox_at_a_time() -> TestResult {
    let dir = TempDir::new()?;
    let path = dir.join("nested").join("ledger.jsonl");
    let first = LedgerFile::open(&path)?;
    let second = LedgerFile::open(&path).map(|file| format!("{file:?}"));
    assert!(
        second
            .as_ref()
            .is_err_and(|error| error.to_string().contains("another sandbox is using it")),
        "{second:?}"
    );
    drop(first);
    assert!(LedgerFile::open(&path).is_ok());
    Ok(())
}

/// A `payments-sandbox` process, killed with SIGKILL when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `payments-sandbox` with `SANDBOX_LEDGER` on a free port; its URL.
fn start_binary(ledger: &Path) -> Result<(Killed, String), Error> {
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_payments-sandbox"))
            .args(["--listen", "127.0.0.1:0"])
            .env("SANDBOX_LEDGER", ledger)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let mut line = String::new();
    if let Some(stdout) = child.0.stdout.take() {
        BufReader::new(stdout).read_line(&mut line)?;
    }
    let url = line
        .trim_end()
        .strip_prefix("payments-sandbox listening on ")
        .ok_or_else(|| format!("unexpected first line {line:?}"))?
        .to_owned();
    Ok((child, url))
}

/// The binary, killed with SIGKILL right after it answered: every answer
/// it sent was in the file already.
#[tokio::test]
async fn the_binary_keeps_its_ledger_through_a_kill() -> TestResult {
    let dir = TempDir::new()?;
    let path = dir.join("ledger.jsonl");
    let client = reqwest::Client::builder().no_proxy().build()?;
    let charge = |url: &str| {
        client
            .post(format!("{url}/v1/charges"))
            .bearer_auth("sk_test_sandbox")
            .header("Idempotency-Key", "killed")
            .form(VISA)
            .send()
    };
    let binary = |path: PathBuf| tokio::task::spawn_blocking(move || start_binary(&path));

    let (process, url) = binary(path.clone()).await??;
    let first = answer(charge(&url).await?).await?;
    drop(process);
    assert_eq!(first.status, StatusCode::OK);

    let (process, url) = binary(path).await??;
    let retried = answer(charge(&url).await?).await?;
    let charges: Value = client
        .get(format!("{url}/_sandbox/charges"))
        .send()
        .await?
        .json()
        .await?;
    drop(process);
    assert_eq!((retried.replayed, &retried.bytes), (true, &first.bytes));
    assert_eq!(charges["data"].as_array().map(Vec::len), Some(1));
    Ok(())
}
