//! What ops watch: the metrics a fresh `payments-api` exports before any
//! charge, `--version`, and logs that are all JSON with `LOG_FORMAT=json`.

use std::time::Duration;

use payments_api::config::DEV_JWT_SECRET;
use payments_api::telemetry::{COUNTERS, HISTOGRAMS};
use payments_app::telemetry::{METRICS, Series};
use payments_tests::{Process, run_binary};
use serde_json::Value;

/// A database file in a fresh directory, and the directory.
fn sqlite_file() -> (String, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("payments-e2e-{}", uuid::Uuid::new_v4().simple()));
    (format!("sqlite://{}/payments.db", dir.display()), dir)
}

/// The API with the in-process sandbox, on a free port.
fn api_env(url: &str) -> Vec<(&str, &str)> {
    vec![
        ("DATABASE_URL", url),
        ("LISTEN_ADDR", "127.0.0.1:0"),
        ("SANDBOX_LISTEN_ADDR", "127.0.0.1:0"),
        ("JWT_HS256_SECRET", DEV_JWT_SECRET),
    ]
}

/// `git rev-parse --short HEAD`, when this is a git checkout.
fn head_commit() -> Option<String> {
    let output = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let commit = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !commit.trim().is_empty()).then(|| commit.trim().to_owned())
}

/// Whether `text` has a `# HELP` line for `name` and a sample of `series`.
fn exported(text: &str, name: &str, series: &str) -> bool {
    let help = text
        .lines()
        .any(|l| l.starts_with(&format!("# HELP {name} ")));
    let sample = text
        .lines()
        .any(|l| l.starts_with(&format!("{series} ")) || l.starts_with(&format!("{series}{{")));
    help && sample
}

async fn scrape(api: &Process) -> String {
    let response = reqwest::get(format!("{}/metrics", api.url)).await.unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

/// A freshly started API, before any charge, exports every counter and
/// histogram with its `# HELP` text and a sample (0), and its build info.
/// The HTTP metrics' label sets (route, status) are only known at a
/// request: they show from the second scrape on (the first is one).
#[tokio::test]
async fn a_fresh_api_exports_every_metric_at_zero() {
    let (url, dir) = sqlite_file();
    let api = Process::start("payments-api", &[], &api_env(&url)).await;
    let first = scrape(&api).await;
    let second = scrape(&api).await;
    let on_first_event = |name: &str| {
        METRICS
            .iter()
            .any(|m| m.name == name && m.series == Series::OnFirstEvent)
    };
    let histogram = |h: &str| format!("{h}_count");
    for (name, series) in COUNTERS
        .iter()
        .map(|c| (*c, c.to_string()))
        .chain(HISTOGRAMS.iter().map(|h| (*h, histogram(h))))
    {
        let text = if on_first_event(name) {
            &second
        } else {
            &first
        };
        assert!(exported(text, name, &series), "{name} is missing:\n{text}");
        if !on_first_event(name) {
            let zero = text
                .lines()
                .filter(|l| l.starts_with(series.as_str()) && !l.starts_with('#'))
                .all(|l| l.ends_with(" 0"));
            assert!(zero, "{name} is not 0 before any charge:\n{text}");
        }
    }
    let commit = head_commit().unwrap_or_else(|| "unknown".to_owned());
    let build = format!(
        "payments_build_info{{version=\"{}\",commit=\"{commit}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(first.lines().any(|l| l == build), "no {build}:\n{first}");
    drop(api);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--version` carries the version and the commit it was built from.
#[tokio::test]
async fn version_carries_the_git_commit() {
    for name in ["payments-api", "payments-jobs"] {
        let (ok, stdout, stderr) = run_binary(name, &["--version"], &[]).await;
        assert!(ok, "{stderr}");
        let line = stdout.trim();
        assert!(line.starts_with(&format!("{name} 0.")), "{line}");
        if let Some(commit) = head_commit() {
            assert!(
                line.ends_with(&format!("({commit})")),
                "{line}: not {commit}"
            );
        }
    }
}

/// Every non-empty line of `output` is a JSON object; the lines.
fn json_lines(what: &str, output: &str) -> Vec<Value> {
    output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let parsed: Result<Value, _> = serde_json::from_str(l);
            match parsed {
                Ok(v) if v.is_object() => v,
                _ => panic!("{what}: a line that is not JSON: {l:?}\nin:\n{output}"),
            }
        })
        .collect()
}

/// The error line: level ERROR, its message containing `needle`.
fn has_error(lines: &[Value], needle: &str) -> bool {
    lines.iter().any(|l| {
        l["level"] == "ERROR"
            && l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(needle))
    })
}

/// Reads what a child wrote on stdout until it closed it.
fn drain(stdout: tokio::process::ChildStdout) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        let mut stdout = stdout;
        let _ = stdout.read_to_string(&mut text).await;
        text
    })
}

/// With `LOG_FORMAT=json`, `payments-api` writes only JSON lines on stdout
/// and stderr: through a start, a request and a SIGTERM, and on an error
/// exit, whose line carries the error.
#[tokio::test]
async fn api_json_logs_are_all_json() {
    let (url, dir) = sqlite_file();
    let mut env = api_env(&url);
    env.push(("LOG_FORMAT", "json"));
    let (mut api, stdout) = Process::spawn("payments-api", &[], &env);
    let stdout = drain(stdout);
    assert!(
        api.wait_for_log(&["\"message\":\"serving\""]).await,
        "did not start:\n{}",
        api.log()
    );
    let serving = json_lines("payments-api stderr", &api.log())
        .into_iter()
        .find(|l| l["fields"]["message"] == "serving")
        .expect("the serving line");
    let addr = serving["fields"]["addr"].as_str().expect("addr").to_owned();
    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    let status = api.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "{status}\n{}", api.log());
    let stdout = stdout.await.unwrap();
    json_lines("payments-api stdout", &stdout);
    let stderr = api.log();
    let lines = json_lines("payments-api stderr", &stderr);
    assert!(
        lines.iter().any(|l| l["fields"]["message"] == "stopped"),
        "{stderr}"
    );

    // A refused setting: the error exit's one line is JSON too.
    env.push(("SQLITE_WRITE_BATCH", "0"));
    let (ok, stdout, stderr) = run_binary("payments-api", &[], &env).await;
    assert!(!ok, "SQLITE_WRITE_BATCH=0 must be refused");
    json_lines("payments-api stdout", &stdout);
    let lines = json_lines("payments-api stderr", &stderr);
    assert!(has_error(&lines, "SQLITE_WRITE_BATCH"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// With `LOG_FORMAT=json`, `payments-jobs` writes only JSON lines: `run`
/// serving /metrics until SIGTERM, and an error exit carrying its error.
#[tokio::test]
async fn jobs_json_logs_are_all_json() {
    let (url, dir) = sqlite_file();
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("GATEWAY_URL", "http://127.0.0.1:9"),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("METRICS_ADDR", "127.0.0.1:0"),
        ("LOG_FORMAT", "json"),
    ];
    let (mut jobs, stdout) = Process::spawn("payments-jobs", &["run"], &env);
    let stdout = drain(stdout);
    assert!(
        jobs.wait_for_log(&["serving /metrics", "prune pass"]).await,
        "no pass ran:\n{}",
        jobs.log()
    );
    let status = jobs.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "{status}\n{}", jobs.log());
    json_lines("payments-jobs stdout", &stdout.await.unwrap());
    json_lines("payments-jobs stderr", &jobs.log());

    // The reaper without a provider is refused.
    let env = [("DATABASE_URL", url.as_str()), ("LOG_FORMAT", "json")];
    let (ok, stdout, stderr) = run_binary("payments-jobs", &["reap", "--once"], &env).await;
    assert!(!ok, "reap without GATEWAY_URL must be refused");
    json_lines("payments-jobs stdout", &stdout);
    let lines = json_lines("payments-jobs stderr", &stderr);
    assert!(has_error(&lines, "GATEWAY_URL is not set"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The `ABANDONED` line, as the real `payments-jobs` writes it with
/// `LOG_FORMAT=json`, carries what docs/operations.md's runbook needs to
/// reconcile by hand: which operation and customer, the provider key to
/// search the provider by, and the amount and currency to match its object.
#[tokio::test]
async fn the_abandoned_line_carries_what_reconciling_needs() {
    let Some(db) = payments_tests::TestDb::new(payments_tests::Backend::Sqlite, 1).await else {
        panic!("SQLite is always available");
    };
    let key = payments_tests::new_key();
    let body: Value = serde_json::from_str(&payments_tests::charge_body(4321, "tok_visa")).unwrap();
    let (_, charge_id) = db
        .stuck_request(&key, "cus_runbook", &body, Duration::from_secs(3600))
        .await;
    let env = [
        ("DATABASE_URL", db.url.as_str()),
        // Nothing listens on the discard port: the outcome stays unknown.
        ("GATEWAY_URL", "http://127.0.0.1:9"),
        ("GATEWAY_SECRET_KEY", "sk_test_sandbox"),
        ("ABANDON_AFTER", "1m"),
        ("LOG_FORMAT", "json"),
    ];
    let (ok, stdout, stderr) = run_binary("payments-jobs", &["reap", "--once"], &env).await;
    assert!(ok, "{stderr}");
    let mut lines = json_lines("payments-jobs stdout", &stdout);
    lines.extend(json_lines("payments-jobs stderr", &stderr));
    let abandoned = lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("ABANDONED: provider outcome unknown"))
        })
        .unwrap_or_else(|| panic!("no ABANDONED line in:\n{stdout}\n{stderr}"));
    let fields = &abandoned["fields"];
    assert_eq!(abandoned["level"], "ERROR");
    assert_eq!(fields["operation"], charge_id.as_str(), "{fields}");
    assert_eq!(fields["kind"], "charge", "{fields}");
    assert_eq!(fields["customer_id"], "cus_runbook", "{fields}");
    assert_eq!(fields["amount_cents"], 4321, "{fields}");
    assert_eq!(fields["currency"], "GBP", "{fields}");
    let provider_key = fields["provider_key"].as_str().unwrap_or_default();
    assert!(provider_key.starts_with("payments-charge-"), "{fields}");
    assert!(
        fields["record_id"].is_number() || fields["record_id"].is_string(),
        "{fields}"
    );
    assert!(
        fields["reason"]
            .as_str()
            .is_some_and(|r| r.contains("--abandon-after")),
        "{fields}"
    );
    let pass = lines
        .iter()
        .find(|l| l["fields"]["message"] == "reap pass")
        .unwrap_or_else(|| panic!("no reap pass line in:\n{stdout}\n{stderr}"));
    assert_eq!(pass["fields"]["abandoned"], 1, "{pass}");
}

/// Logs by cause, not by status: a provider outage answered 503
/// `gateway_unavailable` with `Retry-After` is expected, so its lines are
/// at most WARN and carry the code; only a database outage and unexpected
/// failures are errors. (tower-http's own line, `response failed ...
/// classification=Status code: 503` at ERROR, flooded alerting on a
/// provider blip.)
#[tokio::test]
async fn a_provider_outage_is_not_logged_as_an_error() {
    let Some(db) = payments_tests::TestDb::new(payments_tests::Backend::Sqlite, 1).await else {
        panic!("SQLite is always available");
    };
    let sandbox = Process::start("payments-sandbox", &["--listen", "127.0.0.1:0"], &[]).await;
    let env = crate::api_env(&db, &sandbox, &[("LOG_FORMAT", "json")]);
    let (mut running, stdout) = Process::spawn("payments-api", &[], &env);
    let stdout = drain(stdout);
    assert!(
        running.wait_for_log(&["\"message\":\"serving\""]).await,
        "did not start:\n{}",
        running.log()
    );
    let serving = json_lines("payments-api stderr", &running.log())
        .into_iter()
        .find(|l| l["fields"]["message"] == "serving")
        .expect("the serving line");
    let addr = serving["fields"]["addr"].as_str().expect("addr").to_owned();
    let api = Process::detached(format!("http://{addr}"));
    // The provider answers 500 to every call: each charge's outcome is
    // unknown, answered 503 with Retry-After.
    let config = reqwest::Client::new()
        .post(format!("{}/_sandbox/config", sandbox.url))
        .json(&serde_json::json!({"error_rate": 1.0}))
        .send()
        .await
        .unwrap();
    assert!(config.status().is_success());
    let token = crate::mint("cus_blip").await;
    for _ in 0..3 {
        let key = payments_tests::new_key();
        let answer = api
            .post_charge(&token, &key, &payments_tests::charge_body(700, "tok_visa"))
            .await
            .unwrap();
        assert_eq!(answer.status(), 503);
        assert!(answer.headers().contains_key("retry-after"));
    }
    let status = running.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "{status}");
    let log = format!("{}{}", stdout.await.unwrap(), running.log());
    let lines = json_lines("payments-api log", &log);
    let errors: Vec<&Value> = lines.iter().filter(|l| l["level"] == "ERROR").collect();
    assert!(
        errors.is_empty(),
        "a provider outage logged errors: {errors:#?}"
    );
    let answered: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "provider unavailable; answered 503 with Retry-After")
        .collect();
    assert_eq!(answered.len(), 3, "{log}");
    for line in answered {
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["fields"]["code"], "gateway_unavailable");
    }
    // Each request's own line carries its status and its error's code.
    let finished: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["fields"]["status"] == 503 && l["span"]["error_code"] == "gateway_unavailable"
        })
        .collect();
    assert_eq!(finished.len(), 3, "{log}");
}
