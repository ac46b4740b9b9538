//! What ops watch: the metrics a fresh `payments-api` exports before any
//! charge, and `--version`.

use payments_api::config::DEV_JWT_SECRET;
use payments_api::telemetry::{COUNTERS, HISTOGRAMS};
use payments_app::telemetry::{METRICS, Series};
use payments_tests::{Process, run_binary};

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
