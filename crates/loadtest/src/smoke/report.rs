//! The smoke's result: one named verdict per check, as text for people and
//! JSON for machines.

use std::fmt;

use serde::Serialize;

/// Every check the smoke knows, in the order it runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// Two concurrent requests with one key make one charge.
    ConcurrentSameKey,
    /// A sequential retry of a completed key replays it byte for byte.
    SequentialReplay,
    /// The same key with another amount is refused with 422.
    KeyReuseOtherBody,
    /// A request without a key is refused with 400 (unless in rollout).
    MissingKey,
    /// Two concurrent refunds with one key make one refund, which the
    /// charge then counts.
    RefundOnce,
    /// `GET /api/charges?idempotency_key=` finds the charge a key made.
    ListFindsCharge,
    /// A hold authorized, then two concurrent captures of half of it with
    /// one key capture it once, the rest released.
    AuthorizeCapture,
    /// The database holds exactly one `charges` row per key (needs
    /// `--database-url`).
    OneRowPerKey,
}

impl Check {
    /// Every check, in the order the smoke runs them.
    pub const ALL: [Check; 8] = [
        Self::ConcurrentSameKey,
        Self::SequentialReplay,
        Self::KeyReuseOtherBody,
        Self::MissingKey,
        Self::RefundOnce,
        Self::ListFindsCharge,
        Self::AuthorizeCapture,
        Self::OneRowPerKey,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::ConcurrentSameKey => "concurrent_same_key",
            Self::SequentialReplay => "sequential_replay",
            Self::KeyReuseOtherBody => "key_reuse_other_body",
            Self::MissingKey => "missing_key",
            Self::RefundOnce => "refund_once",
            Self::ListFindsCharge => "list_finds_charge",
            Self::AuthorizeCapture => "authorize_capture",
            Self::OneRowPerKey => "one_row_per_key",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    pub name: Check,
    pub passed: bool,
    /// What was seen, short enough for one line.
    pub detail: String,
    /// Something to act on even though the check passed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl CheckResult {
    pub(crate) fn pass(name: Check, detail: impl Into<String>) -> Self {
        Self {
            name,
            passed: true,
            detail: detail.into(),
            note: None,
        }
    }

    pub(crate) fn fail(name: Check, detail: impl Into<String>) -> Self {
        Self {
            name,
            passed: false,
            detail: detail.into(),
            note: None,
        }
    }

    pub(crate) fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

/// A check that did not run, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub name: Check,
    pub reason: String,
}

/// The whole run. `passed` is true only if every check that ran passed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The `metadata.smoke_run` value on every charge this run made.
    pub run_id: String,
    pub base_url: String,
    pub passed: bool,
    pub checks: Vec<CheckResult>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
}

/// Exit status: every check passed.
pub const EXIT_PASSED: u8 = 0;
/// Exit status: at least one check failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit status: bad usage, or the server or database could not be reached.
pub const EXIT_ERROR: u8 = 2;

impl Report {
    pub(crate) fn new(
        run_id: String,
        base_url: String,
        checks: Vec<CheckResult>,
        skipped: Vec<Skipped>,
    ) -> Self {
        Self {
            run_id,
            base_url,
            passed: !checks.is_empty() && checks.iter().all(|c| c.passed),
            checks,
            skipped,
        }
    }

    pub fn check(&self, name: Check) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.name == name)
    }

    pub fn failed(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(|c| !c.passed)
    }

    pub fn exit_code(&self) -> u8 {
        if self.passed {
            EXIT_PASSED
        } else {
            EXIT_FAILED
        }
    }

    /// `{"run_id","base_url","passed","checks":[{"name","passed","detail","note"?}],"skipped"?}`.
    pub fn to_json(&self) -> String {
        // Strings and booleans always serialise; the fallback keeps this
        // infallible without an unwrap.
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!(r#"{{"passed":false,"error":"{e}"}}"#))
    }

    /// One line per check (`PASS`/`FAIL`/`SKIP`, name, detail), then a summary.
    pub fn to_text(&self) -> String {
        let width = self
            .checks
            .iter()
            .map(|c| c.name.name().len())
            .chain(self.skipped.iter().map(|s| s.name.name().len()))
            .max()
            .unwrap_or(0);
        let mut out = format!(
            "payments-smoke run {} against {}\n",
            self.run_id, self.base_url
        );
        for check in &self.checks {
            let verdict = if check.passed { "PASS" } else { "FAIL" };
            out.push_str(&format!(
                "{verdict}  {:width$}  {}\n",
                check.name.name(),
                check.detail
            ));
            if let Some(note) = &check.note {
                out.push_str(&format!("      {:width$}  note: {note}\n", ""));
            }
        }
        for skipped in &self.skipped {
            out.push_str(&format!(
                "SKIP  {:width$}  {}\n",
                skipped.name.name(),
                skipped.reason
            ));
        }
        let failed: Vec<&str> = self.failed().map(|c| c.name.name()).collect();
        if self.passed {
            out.push_str(&format!(
                "PASSED: all {} checks passed\n",
                self.checks.len()
            ));
        } else {
            out.push_str(&format!(
                "FAILED: {} of {} checks failed ({})\n",
                failed.len(),
                self.checks.len(),
                failed.join(", ")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report::new(
            "smoke-1".into(),
            "http://x".into(),
            vec![
                CheckResult::pass(Check::ConcurrentSameKey, "201 + 409"),
                CheckResult::fail(Check::SequentialReplay, "charged twice"),
                CheckResult::pass(Check::MissingKey, "201").with_note("optional mode"),
            ],
            vec![Skipped {
                name: Check::OneRowPerKey,
                reason: "no --database-url".into(),
            }],
        )
    }

    #[test]
    fn any_failure_fails_the_run() {
        let r = report();
        assert!(!r.passed);
        assert_eq!(r.exit_code(), EXIT_FAILED);
        let text = r.to_text();
        assert!(
            text.contains("PASS  concurrent_same_key  201 + 409"),
            "{text}"
        );
        assert!(
            text.contains("FAIL  sequential_replay    charged twice"),
            "{text}"
        );
        assert!(text.contains("note: optional mode"), "{text}");
        assert!(text.contains("SKIP  one_row_per_key"), "{text}");
        assert!(text.ends_with("FAILED: 1 of 3 checks failed (sequential_replay)\n"));
    }

    #[test]
    fn json_names_every_check() -> Result<(), serde_json::Error> {
        let json: serde_json::Value = serde_json::from_str(&report().to_json())?;
        assert_eq!(json["passed"], false);
        assert_eq!(json["checks"][1]["name"], "sequential_replay");
        assert_eq!(json["checks"][1]["passed"], false);
        assert_eq!(json["checks"][2]["note"], "optional mode");
        assert!(json["checks"][0].get("note").is_none());
        assert_eq!(json["skipped"][0]["name"], "one_row_per_key");
        Ok(())
    }

    #[test]
    fn no_checks_is_no_pass() {
        assert!(!Report::new("r".into(), "u".into(), vec![], vec![]).passed);
    }
}
