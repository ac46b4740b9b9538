//! A run's result: per-stream throughput, latency and statuses, the
//! operations and their final answers, the charges counted at the provider
//! and in the database, and the verdict; as a table for people and JSON for
//! machines.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::Serialize;

use super::stream::{Count, StreamReport};

/// Exit status: `correct` is true.
pub const EXIT_CORRECT: u8 = 0;
/// Exit status: the run broke the contract (charges != operations, a double
/// charge, a 5xx or other status the scenario does not allow, ...).
pub const EXIT_INCORRECT: u8 = 1;
/// Exit status: bad usage (a non-loopback URL included), or the run could
/// not start (server, sandbox or database unreachable, token refused).
pub const EXIT_ERROR: u8 = 2;

/// Why the load phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoppedBy {
    /// All the planned work ran (`--requests`, the keys, the in-flight charges).
    Completed,
    /// The `--duration` cap came first.
    Duration,
}

/// The logical charges of the run (a key each), setup ones included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Operations {
    pub started: u64,
    /// Final answer 201: these, and only these, must be charged.
    pub charged: u64,
    /// A final answer other than 201 (nothing should be charged for them).
    pub not_charged: u64,
    /// No final answer: out of time, or cancelled at the end of the run.
    pub unfinished: u64,
    /// Operations whose answers named two charges, or two 201s without
    /// `Idempotent-Replay: true`.
    pub charged_twice: u64,
}

/// What was really charged during the run, against [`Operations::charged`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Charges {
    /// `Operations::charged`: the operations with a final 201.
    pub answered: u64,
    /// Successful charges the sandbox made during the run (`None`: no
    /// `--sandbox-url`, not counted).
    pub provider: Option<u64>,
    /// Successful charges at the sandbox that no 201 of this run named.
    pub provider_unmatched: Option<u64>,
    /// Provider idempotency keys charged more than once.
    pub provider_keys_charged_twice: Option<u64>,
    /// `succeeded` rows tagged with this run (`None`: no `--database-url`).
    pub database: Option<u64>,
    /// `succeeded` rows tagged with this run that no 201 named.
    pub database_unmatched: Option<u64>,
    /// This run's rows in other statuses (`pending`, `unknown`, `failed`).
    pub database_other: BTreeMap<String, u64>,
    /// The sandbox was reset before the run (`--reset-sandbox`), so every
    /// charge it lists is this run's; otherwise charges listed before the
    /// run are left out.
    pub sandbox_reset: bool,
}

/// The whole run. `correct` is true only if the provider's count, the
/// database's count and the operations with a final 201 are equal, nothing
/// was charged twice, every operation got a final answer and no stream got a
/// status its scenario does not allow.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The `metadata.load_run` value on every charge of the run.
    pub run_id: String,
    pub scenario: &'static str,
    pub base_url: String,
    /// The scenario's settings, as given.
    pub settings: serde_json::Value,
    pub elapsed_secs: f64,
    pub stopped_by: StoppedBy,
    pub streams: Vec<StreamReport>,
    pub operations: Operations,
    pub charges: Charges,
    pub correct: bool,
    /// The first violations, in words.
    pub violations: Vec<String>,
    /// All of them, counted.
    pub violations_total: u64,
}

impl Report {
    pub fn stream(&self, name: &str) -> Option<&StreamReport> {
        self.streams.iter().find(|s| s.name == name)
    }

    pub fn exit_code(&self) -> u8 {
        if self.correct {
            EXIT_CORRECT
        } else {
            EXIT_INCORRECT
        }
    }

    /// Adds the accounting verdicts to the scenario's own violations and
    /// sets `correct`.
    pub(crate) fn judge(mut self) -> Self {
        let mut found = Vec::new();
        for stream in &self.streams {
            for (status, n) in &stream.disallowed {
                found.push(format!(
                    "{}: {n} answer(s) with status {status}, which this scenario does not allow \
                     (allowed: {:?})",
                    stream.name, stream.allowed
                ));
            }
        }
        let ops = self.operations;
        if ops.unfinished > 0 {
            found.push(format!(
                "{} operation(s) got no final answer before the run stopped: their charges \
                 cannot be reconciled (raise --duration?)",
                ops.unfinished
            ));
        }
        if ops.charged_twice > 0 {
            found.push(format!(
                "{} operation(s) were answered with two charges",
                ops.charged_twice
            ));
        }
        let c = &self.charges;
        let mut mismatch = |what: &str, counted: Option<u64>, unmatched: Option<u64>| {
            if let Some(counted) = counted
                && counted != c.answered
            {
                found.push(format!(
                    "{what} counted {counted} charge(s) for {} operation(s) with a final 201",
                    c.answered
                ));
            }
            if let Some(unmatched) = unmatched.filter(|n| *n > 0) {
                found.push(format!(
                    "{what} holds {unmatched} charge(s) that no answer named"
                ));
            }
        };
        mismatch("the provider (sandbox)", c.provider, c.provider_unmatched);
        mismatch("the database", c.database, c.database_unmatched);
        if let Some(keys) = c.provider_keys_charged_twice.filter(|n| *n > 0) {
            found.push(format!(
                "the provider charged {keys} provider key(s) more than once"
            ));
        }
        self.violations_total += found.len() as u64;
        // Accounting verdicts first: they are the headline.
        found.append(&mut self.violations);
        self.violations = found;
        self.correct = self.violations_total == 0;
        self
    }

    /// The report as pretty JSON: `{run_id, scenario, base_url, settings,
    /// elapsed_secs, stopped_by, streams: [{name, requests, answered,
    /// elapsed_secs, throughput_rps, latency_us: {p50, p95, p99, max, mean} |
    /// null, statuses: {"201": n}, replays, transport_errors: {kind: n},
    /// allowed, disallowed}], operations: {started, charged, not_charged,
    /// unfinished, charged_twice}, charges: {answered, provider,
    /// provider_unmatched, provider_keys_charged_twice, database,
    /// database_unmatched, database_other, sandbox_reset}, correct,
    /// violations, violations_total}`.
    pub fn to_json(&self) -> String {
        // Numbers, strings and maps always serialise; the fallback keeps
        // this infallible without an unwrap.
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!(r#"{{"correct":false,"error":"{e}"}}"#))
    }

    /// A table: one line per stream, then operations, charges, the verdict.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let stopped = match self.stopped_by {
            StoppedBy::Completed => "completed",
            StoppedBy::Duration => "duration cap",
        };
        let _ = writeln!(
            out,
            "payments-load {} run {} against {}: {:.2} s, stopped: {stopped}",
            self.scenario, self.run_id, self.base_url, self.elapsed_secs
        );
        let _ = writeln!(
            out,
            "{:<13} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}  {:<24} transport",
            "stream", "requests", "req/s", "p50", "p95", "p99", "max", "statuses"
        );
        for s in &self.streams {
            let (p50, p95, p99, max) = match &s.latency_us {
                Some(l) => (micros(l.p50), micros(l.p95), micros(l.p99), micros(l.max)),
                None => Default::default(),
            };
            let text = |c: Count| {
                let mark = if c.forbidden { "!" } else { "" };
                format!("{}{mark}:{}", c.label, c.n)
            };
            let statuses: Vec<String> = s.answer_counts().into_iter().map(text).collect();
            let transport: Vec<String> = s.unanswered_counts().into_iter().map(text).collect();
            let _ = writeln!(
                out,
                "{:<13} {:>8} {:>9.1} {p50:>9} {p95:>9} {p99:>9} {max:>9}  {:<24} {}",
                s.name,
                s.requests,
                s.throughput_rps,
                or_dash(statuses.join(" ")),
                or_dash(transport.join(" ")),
            );
        }
        let ops = &self.operations;
        let _ = writeln!(
            out,
            "operations    {} started, {} charged (final 201), {} not charged, {} unfinished, \
             {} charged twice",
            ops.started, ops.charged, ops.not_charged, ops.unfinished, ops.charged_twice
        );
        let c = &self.charges;
        let counted =
            |n: Option<u64>, why: &str| n.map_or_else(|| format!("- ({why})"), |n| n.to_string());
        let mut charges = format!(
            "charges       provider {}, database {}, final 201s {}",
            counted(c.provider, "no --sandbox-url"),
            counted(c.database, "no --database-url"),
            c.answered
        );
        if !c.database_other.is_empty() {
            let other: Vec<String> = c
                .database_other
                .iter()
                .map(|(status, n)| format!("{status}:{n}"))
                .collect();
            let _ = write!(charges, " (database, other statuses: {})", other.join(" "));
        }
        let _ = writeln!(out, "{charges}");
        if self.correct {
            out.push_str("CORRECT\n");
        } else {
            let _ = writeln!(out, "INCORRECT: {} violation(s)", self.violations_total);
            for violation in &self.violations {
                let _ = writeln!(out, "  - {violation}");
            }
            let hidden = self
                .violations_total
                .saturating_sub(self.violations.len() as u64);
            if hidden > 0 {
                let _ = writeln!(out, "  - ... and {hidden} more");
            }
        }
        out
    }
}

impl Report {
    /// The report as markdown, as `docs/benchmarks.md` shows each load run:
    /// a table of its streams, then its operations, charges and verdict.
    pub fn markdown(&self) -> impl fmt::Display + '_ {
        Markdown(self)
    }

    /// Microseconds as milliseconds for people: `0.42 ms`, `12.3 ms`, `18.02 s`.
    pub fn ms(us: u64) -> String {
        match us as f64 / 1000.0 {
            ms if ms < 10.0 => format!("{ms:.2} ms"),
            ms if ms < 1000.0 => format!("{ms:.1} ms"),
            ms => format!("{:.2} s", ms / 1000.0),
        }
    }

    /// A rate with thousands separators: `12,345`.
    pub fn rate(x: f64) -> String {
        let digits = (x.round() as u64).to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    }
}

/// [`Report::markdown`].
struct Markdown<'a>(&'a Report);

impl fmt::Display for Markdown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self.0;
        f.write_str(
            "| stream | requests | req/s | p50 | p95 | p99 | max | statuses | no answer |\n",
        )?;
        f.write_str("|---|---|---|---|---|---|---|---|---|\n")?;
        let list = |counts: Vec<Count>| {
            let marked = |c: Count| {
                format!(
                    "{}: {}{}",
                    c.label,
                    c.n,
                    if c.forbidden { " (!)" } else { "" }
                )
            };
            or_dash(
                counts
                    .into_iter()
                    .map(marked)
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        };
        for s in &report.streams {
            let latency = s
                .latency_us
                .map(|l| [l.p50, l.p95, l.p99, l.max].map(Report::ms));
            let [p50, p95, p99, max] = latency.unwrap_or_default();
            let (answered, unanswered) = (list(s.answer_counts()), list(s.unanswered_counts()));
            let rate = Report::rate(s.throughput_rps);
            let (name, requests) = (&s.name, s.requests);
            writeln!(
                f,
                "| {name} | {requests} | {rate} | {p50} | {p95} | {p99} | {max} | {answered} | {unanswered} |"
            )?;
        }
        let (o, c) = (&report.operations, &report.charges);
        let count = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        let other = c
            .database_other
            .iter()
            .map(|(status, n)| format!("{status}: {n}"));
        let other = other.collect::<Vec<_>>().join(", ");
        let other = if other.is_empty() {
            other
        } else {
            format!(" (other statuses in the database: {other})")
        };
        let stopped = match report.stopped_by {
            StoppedBy::Completed => "completed",
            StoppedBy::Duration => "stopped by its duration cap",
        };
        let verdict = if report.correct {
            "Correct."
        } else {
            "INCORRECT."
        };
        writeln!(
            f,
            "\nOperations: {} started, {} charged, {} not charged, {} unfinished, {} charged twice. \
             Charges: provider {}, database {}, final 201s {}{other}. {:.1} s, {stopped}. **{verdict}**\n",
            o.started,
            o.charged,
            o.not_charged,
            o.unfinished,
            o.charged_twice,
            count(c.provider),
            count(c.database),
            c.answered,
            report.elapsed_secs,
        )?;
        if !report.correct {
            for violation in &report.violations {
                writeln!(f, "- {}", violation.replace('|', "\\|").replace('\n', " "))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

fn or_dash(s: String) -> String {
    if s.is_empty() { "-".to_owned() } else { s }
}

/// Microseconds for people: `850µs`, `12.34ms`, `1.234s`.
fn micros(us: u64) -> String {
    if us < 1_000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        format!("{:.2}ms", us as f64 / 1e3)
    } else {
        format!("{:.3}s", us as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::stream::Latency;

    fn report() -> Report {
        Report {
            run_id: "load-1".into(),
            scenario: "new",
            base_url: "http://127.0.0.1:1".into(),
            settings: serde_json::json!({"requests": 3}),
            elapsed_secs: 1.0,
            stopped_by: StoppedBy::Completed,
            streams: vec![StreamReport {
                name: "charge".into(),
                requests: 3,
                answered: 3,
                elapsed_secs: 1.0,
                throughput_rps: 3.0,
                latency_us: Some(Latency {
                    p50: 850,
                    p95: 12_340,
                    p99: 1_234_000,
                    max: 1_234_000,
                    mean: 5,
                }),
                statuses: BTreeMap::from([(201, 3)]),
                replays: 0,
                transport_errors: BTreeMap::new(),
                allowed: vec![201, 409],
                disallowed: BTreeMap::new(),
            }],
            operations: Operations {
                started: 3,
                charged: 3,
                ..Operations::default()
            },
            charges: Charges {
                answered: 3,
                provider: Some(3),
                provider_unmatched: Some(0),
                provider_keys_charged_twice: Some(0),
                database: Some(3),
                database_unmatched: Some(0),
                ..Charges::default()
            },
            correct: false,
            violations: vec![],
            violations_total: 0,
        }
    }

    #[test]
    fn equal_counts_are_correct() {
        let r = report().judge();
        assert!(r.correct, "{:?}", r.violations);
        assert_eq!(r.exit_code(), EXIT_CORRECT);
        let text = r.to_text();
        assert!(text.contains("850µs") && text.contains("12.34ms") && text.contains("1.234s"));
        assert!(text.ends_with("CORRECT\n"), "{text}");
    }

    #[test]
    fn every_mismatch_is_a_violation() {
        let mut r = report();
        r.charges.provider = Some(4);
        r.charges.database = None;
        r.streams[0].disallowed = BTreeMap::from([(503, 1)]);
        r.operations.unfinished = 1;
        let r = r.judge();
        assert!(!r.correct);
        assert_eq!(r.exit_code(), EXIT_INCORRECT);
        assert_eq!(r.violations_total, 3, "{:?}", r.violations);
        let text = r.to_text();
        assert!(text.contains("INCORRECT: 3 violation(s)"), "{text}");
        assert!(text.contains("counted 4 charge(s) for 3"), "{text}");
    }

    #[test]
    fn markdown_is_a_table_then_the_verdict() {
        let text = report().judge().markdown().to_string();
        let row = "| charge | 3 | 3 | 0.85 ms | 12.3 ms | 1.23 s | 1.23 s | 201: 3 | - |";
        assert!(text.contains(row), "{text}");
        assert!(
            text.contains("final 201s 3. 1.0 s, completed. **Correct.**"),
            "{text}"
        );
        assert_eq!(Report::rate(12_345.4), "12,345");
        assert_eq!(Report::ms(18_020_000), "18.02 s");
    }

    #[test]
    fn json_has_the_numbers() -> Result<(), serde_json::Error> {
        let json: serde_json::Value = serde_json::from_str(&report().judge().to_json())?;
        assert_eq!(json["correct"], true);
        assert_eq!(json["streams"][0]["latency_us"]["p99"], 1_234_000);
        assert_eq!(json["streams"][0]["statuses"]["201"], 3);
        assert_eq!(json["charges"]["provider"], 3);
        assert_eq!(json["stopped_by"], "completed");
        Ok(())
    }
}
